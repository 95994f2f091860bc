//! Change streams, engine side (`Engine::read_changes`): every committed
//! change as an event in cluster-time order, from the tail and after a
//! restart from the WAL, resumable from any event without loss or duplicate.

use bson::{doc, Bson};
use duetdb::{ChangeKind, ChangePosition, ChangeScope, Engine, IndexOptions, TxnOptions};

fn kinds(engine: &Engine, scope: &ChangeScope, after: ChangePosition) -> Vec<String> {
    let b = engine.read_changes(scope, after, 10_000).expect("read");
    b.events
        .iter()
        .map(|e| {
            let what = match &e.kind {
                ChangeKind::Insert { coll, .. } => format!("insert {coll}"),
                ChangeKind::Update { coll, desc, .. } => {
                    let d = duetdb::raw::to_document(desc).expect("desc");
                    format!(
                        "update {coll} {}",
                        d.get_document("updatedFields").expect("u")
                    )
                }
                ChangeKind::Replace { coll, .. } => format!("replace {coll}"),
                ChangeKind::Delete { coll, id } => format!("delete {coll} {id}"),
                ChangeKind::Create { coll } => format!("create {coll}"),
                ChangeKind::Drop { coll } => format!("drop {coll}"),
                ChangeKind::Rename { from, to } => format!("rename {from} {to}"),
                ChangeKind::CreateIndex { coll, .. } => format!("createIndex {coll}"),
                ChangeKind::DropIndex { coll, name } => format!("dropIndex {coll} {name}"),
                ChangeKind::DropDatabase => "dropDatabase".to_string(),
                other => format!("{other:?}"),
            };
            format!("{}:{what}", e.db)
        })
        .collect()
}

fn workload(engine: &Engine) {
    let db = engine.database("d").expect("db");
    let c = db.collection("c");
    c.insert_one(doc! {"_id": 1, "a": 1, "s": {"x": 1}})
        .expect("insert");
    c.update_one(doc! {"_id": 1}, doc! {"$set": {"a": 2, "s.y": 2}})
        .expect("update");
    c.replace_one(doc! {"_id": 1}, doc! {"b": 1})
        .expect("replace");
    c.create_index(doc! {"b": 1}, IndexOptions::default())
        .expect("index");
    c.drop_index("b_1").expect("drop index");
    c.delete_one(doc! {"_id": 1}).expect("delete");
    engine
        .database("e")
        .expect("db e")
        .collection("x")
        .insert_one(doc! {"_id": "e"})
        .expect("insert e");
    db.rename_collection("c", "c2", false).expect("rename");
    db.drop_collection("c2").expect("drop");
}

const EXPECTED: &[&str] = &[
    "d:insert c",
    "d:update c { \"a\": 2, \"s.y\": 2 }",
    "d:replace c",
    "d:createIndex c",
    "d:dropIndex c b_1",
    "d:delete c 1",
    "e:insert x",
    "d:rename c c2",
    "d:drop c2",
];

#[test]
fn every_change_in_commit_order_in_memory() {
    let engine = Engine::in_memory();
    engine.open_change_stream();
    workload(&engine);
    assert_eq!(
        kinds(&engine, &ChangeScope::Cluster, ChangePosition::default()),
        EXPECTED
    );
    let db_only = kinds(
        &engine,
        &ChangeScope::Database("e".into()),
        ChangePosition::default(),
    );
    assert_eq!(db_only, ["e:insert x"]);
    let coll = kinds(
        &engine,
        &ChangeScope::Collection {
            db: "d".into(),
            coll: "c".into(),
        },
        ChangePosition::default(),
    );
    assert_eq!(coll.len(), 7, "{coll:?}");
}

#[test]
fn resuming_from_every_event_gives_the_rest_exactly() {
    let engine = Engine::in_memory();
    engine.open_change_stream();
    workload(&engine);
    let all = engine
        .read_changes(&ChangeScope::Cluster, ChangePosition::default(), 10_000)
        .expect("read");
    for (i, e) in all.events.iter().enumerate() {
        let rest = kinds(&engine, &ChangeScope::Cluster, e.pos);
        assert_eq!(rest, EXPECTED[i + 1..], "after event {i}");
    }
    // Batches of one walk the same sequence.
    let mut pos = ChangePosition::default();
    let mut seen = 0;
    loop {
        let b = engine
            .read_changes(&ChangeScope::Cluster, pos, 1)
            .expect("read");
        if b.events.is_empty() {
            break;
        }
        seen += b.events.len();
        pos = b.position;
    }
    assert_eq!(seen, EXPECTED.len());
}

#[test]
fn history_survives_a_restart_from_the_wal() {
    let dir = tempfile::tempdir().expect("tmp");
    let (before, first_pos) = {
        let engine = Engine::open(dir.path()).expect("open");
        workload(&engine);
        let b = engine
            .read_changes(&ChangeScope::Cluster, ChangePosition::default(), 10_000)
            .expect("read");
        (
            kinds(&engine, &ChangeScope::Cluster, ChangePosition::default()),
            b.events[2].pos,
        )
    };
    assert_eq!(before, EXPECTED);
    let engine = Engine::open(dir.path()).expect("reopen");
    assert_eq!(
        kinds(&engine, &ChangeScope::Cluster, ChangePosition::default()),
        EXPECTED,
        "read back from the WAL"
    );
    assert_eq!(
        kinds(&engine, &ChangeScope::Cluster, first_pos),
        EXPECTED[3..],
        "resume after a restart"
    );
    // New changes get later times than every recovered one.
    engine
        .database("d")
        .expect("d")
        .collection("n")
        .insert_one(doc! {"_id": 9})
        .expect("insert");
    let after = kinds(&engine, &ChangeScope::Cluster, first_pos);
    assert_eq!(after.last().map(String::as_str), Some("d:insert n"));
    assert_eq!(after.len(), EXPECTED.len() - 3 + 1);
}

#[test]
fn transactions_share_one_time_and_carry_their_origin() {
    let engine = Engine::in_memory();
    engine.open_change_stream();
    let db = engine.database("d").expect("db");
    db.collection("c")
        .insert_one(doc! {"_id": 1, "v": 1})
        .expect("seed");
    let mut tx = db.begin(TxnOptions::default());
    tx.insert_one("c", doc! {"_id": 2}).expect("insert");
    tx.update_one("c", doc! {"_id": 1}, doc! {"$inc": {"v": 1}})
        .expect("update");
    tx.set_origin(bson::rawdoc! {"txnNumber": 7_i64});
    tx.commit().expect("commit");
    let b = engine
        .read_changes(&ChangeScope::Cluster, ChangePosition::default(), 100)
        .expect("read");
    let txn: Vec<_> = b.events.iter().filter(|e| e.txn.is_some()).collect();
    assert_eq!(txn.len(), 2);
    assert_eq!(txn[0].pos.ts, txn[1].pos.ts);
    assert!(txn[0].pos.index < txn[1].pos.index);
    assert_eq!(
        txn[0].txn.as_ref().map(|o| o.get_i64("txnNumber").ok()),
        Some(Some(7))
    );
    assert!(b.events[0].txn.is_none());
}

#[test]
fn drop_database_is_an_event() {
    let engine = Engine::in_memory();
    engine.open_change_stream();
    engine
        .database("z")
        .expect("z")
        .collection("c")
        .insert_one(doc! {"_id": Bson::Int32(1)})
        .expect("insert");
    assert!(engine.drop_database("z"));
    assert_eq!(
        kinds(&engine, &ChangeScope::Cluster, ChangePosition::default()),
        ["z:insert c", "z:drop c", "z:dropDatabase"]
    );
}

fn drop_scenario(engine: &Engine) -> (ChangePosition, ChangePosition) {
    let z = engine.database("z").expect("z");
    z.collection("a").insert_one(doc! {"_id": 1}).expect("a");
    let early = engine.stable_cluster_time();
    z.collection("b").insert_one(doc! {"_id": 2}).expect("b");
    let b = engine
        .read_changes(&ChangeScope::Cluster, ChangePosition::after_time(early), 10)
        .expect("read");
    let token = b.events.last().expect("the insert into b").pos;
    assert!(engine.drop_database("z"));
    engine
        .database("other")
        .expect("other")
        .collection("o")
        .insert_one(doc! {"_id": 3})
        .expect("o");
    (ChangePosition::after_time(early.saturating_sub(3)), token)
}

/// A dropDatabase survives a restart: its database's WAL is gone, but the
/// drop log keeps the `drop` and `dropDatabase` events, in order; a resume
/// point older than the dropped database's last event is 286 (its events
/// are gone with its log), never a silent skip.
#[test]
fn drop_database_events_survive_a_restart() {
    let dir = tempfile::tempdir().expect("tmp");
    let (early, token) = {
        let engine = Engine::open(dir.path()).expect("open");
        engine.open_change_stream();
        drop_scenario(&engine)
    };
    let engine = Engine::open(dir.path()).expect("reopen");
    let expected = ["z:drop a", "z:drop b", "z:dropDatabase", "other:insert o"];
    assert_eq!(kinds(&engine, &ChangeScope::Cluster, token), expected);
    assert_eq!(
        kinds(&engine, &ChangeScope::Database("z".into()), token),
        expected[..3]
    );
    let coll = ChangeScope::Collection {
        db: "z".into(),
        coll: "b".into(),
    };
    assert_eq!(kinds(&engine, &coll, token), ["z:drop b"]);
    let e = engine
        .read_changes(&ChangeScope::Cluster, early, 10)
        .expect_err("the dropped database's inserts are gone");
    assert_eq!(e.code(), 286, "{e}");
    // Streams of other databases do not care.
    assert!(
        kinds(&engine, &ChangeScope::Database("other".into()), early)
            .contains(&"other:insert o".to_string())
    );
    // New times are above the drop's; a recreated database is new.
    engine
        .database("z")
        .expect("z again")
        .collection("n")
        .insert_one(doc! {"_id": 4})
        .expect("n");
    let all = kinds(&engine, &ChangeScope::Cluster, token);
    assert_eq!(all.last().map(String::as_str), Some("z:insert n"));
    drop(engine);
    let engine = Engine::open(dir.path()).expect("reopen with z recreated");
    let z = engine
        .get("z")
        .expect("name")
        .expect("the recreated z is kept");
    assert_eq!(z.collection("n").count(doc! {}).expect("count"), 1);
    assert_eq!(kinds(&engine, &ChangeScope::Cluster, token).len(), 5);
}

/// Without leaving the process, a position older than the tail (read from
/// the logs) also gets the drop events, and 286 for the lost inserts.
#[test]
fn drop_database_events_from_the_log_path_in_one_process() {
    let dir = tempfile::tempdir().expect("tmp");
    let engine = Engine::open(dir.path()).expect("open");
    // No stream open: the tail keeps nothing, every read goes to the logs.
    let (early, token) = {
        let z = engine.database("z").expect("z");
        z.collection("a").insert_one(doc! {"_id": 1}).expect("a");
        let early = ChangePosition::after_time(engine.stable_cluster_time().saturating_sub(3));
        z.collection("b").insert_one(doc! {"_id": 2}).expect("b");
        let token = ChangePosition {
            ts: engine.stable_cluster_time(),
            index: 0,
        };
        assert!(engine.drop_database("z"));
        (early, token)
    };
    engine.open_change_stream();
    assert_eq!(
        kinds(&engine, &ChangeScope::Cluster, token),
        ["z:drop a", "z:drop b", "z:dropDatabase"]
    );
    let e = engine
        .read_changes(&ChangeScope::Database("z".into()), early, 10)
        .expect_err("lost");
    assert_eq!(e.code(), 286, "{e}");
}

fn small_segments(retention_bytes: u64) -> duetdb::DurabilityOptions {
    duetdb::DurabilityOptions {
        segment_bytes: 4096,
        background_checkpoints: false,
        change_retention_bytes: retention_bytes,
        ..Default::default()
    }
}

fn fill(engine: &Engine, from: i32, n: i32) {
    let c = engine.database("d").expect("d").collection("c");
    for i in from..from + n {
        c.insert_one(doc! {"_id": i, "pad": "x".repeat(200)})
            .expect("insert");
    }
}

/// Checkpoints keep the segments they no longer need as change history
/// (retention), across restarts; past the retention the history is lost
/// and reading from before it fails with 286, never skips.
#[test]
fn retention_keeps_history_past_checkpoints_and_reports_loss() {
    let dir = tempfile::tempdir().expect("tmp");
    {
        let engine = Engine::open_with(dir.path(), small_segments(1 << 30)).expect("open");
        for round in 0..3 {
            fill(&engine, round * 50, 50);
            engine.database("d").expect("d").checkpoint().expect("ckpt");
        }
    }
    {
        let engine = Engine::open_with(dir.path(), small_segments(1 << 30)).expect("reopen");
        let all = kinds(&engine, &ChangeScope::Cluster, ChangePosition::default());
        assert_eq!(all.len(), 150, "every insert is still in the retained log");
    }
    // Now keep no history: the next checkpoints drop every unneeded segment.
    let engine = Engine::open_with(dir.path(), small_segments(0)).expect("reopen");
    fill(&engine, 1000, 50);
    engine.database("d").expect("d").checkpoint().expect("ckpt");
    fill(&engine, 2000, 50);
    engine.database("d").expect("d").checkpoint().expect("ckpt");
    drop(engine);
    let engine = Engine::open_with(dir.path(), small_segments(0)).expect("reopen");
    let e = engine
        .read_changes(&ChangeScope::Cluster, ChangePosition::default(), 10)
        .expect_err("history lost");
    assert_eq!(e.code(), 286, "{e}");
    assert!(engine
        .check_change_history(
            &ChangeScope::Cluster,
            ChangePosition::after_time(engine.cluster_time())
        )
        .is_ok());
}

/// A transaction's events come in statement order (each `_id` at its first
/// write), not in the order the commit applied them (deletes, replacements,
/// inserts); and its WAL record, in that order, still replays when an insert
/// takes a unique key that a later-listed delete frees.
#[test]
fn transaction_events_in_statement_order_and_replayable() {
    let dir = tempfile::tempdir().expect("tmp");
    let expected = [
        "d:insert c",
        "d:update c { \"v\": 2 }",
        "d:delete c 2",
        "d:insert b",
        "d:delete b \"old\"",
    ];
    let tail_kinds = {
        let engine = Engine::open(dir.path()).expect("open");
        let db = engine.database("d").expect("db");
        let c = db.collection("c");
        c.insert_many(vec![doc! {"_id": 1, "v": 1}, doc! {"_id": 2}], true)
            .expect("seed");
        let b = db.collection("b");
        b.create_index(
            doc! {"k": 1},
            IndexOptions {
                unique: true,
                ..Default::default()
            },
        )
        .expect("unique");
        b.insert_one(doc! {"_id": "old", "k": 1}).expect("old");
        let start = engine.stable_cluster_time();
        let mut tx = db.begin(TxnOptions::default());
        tx.insert_one("c", doc! {"_id": 3}).expect("insert");
        tx.update_one("c", doc! {"_id": 1}, doc! {"$set": {"v": 2}})
            .expect("update");
        tx.delete_one("c", doc! {"_id": 2}).expect("delete");
        // Takes key 1 from "old", deleted by a later statement.
        tx.insert_one("b", doc! {"_id": "new", "k": 1})
            .expect("insert b");
        tx.delete_one("b", doc! {"_id": "old"}).expect("delete b");
        tx.commit().expect("commit");
        kinds(
            &engine,
            &ChangeScope::Cluster,
            ChangePosition::after_time(start),
        )
    };
    assert_eq!(tail_kinds, expected);
    let engine = Engine::open(dir.path()).expect("reopen replays the transaction");
    let b = engine.database("d").expect("db").collection("b");
    assert_eq!(b.count(doc! {}).expect("count"), 1);
    let from_wal = kinds(&engine, &ChangeScope::Cluster, ChangePosition::default());
    assert_eq!(from_wal[from_wal.len() - 5..], expected);
}

#[test]
fn without_a_stream_nothing_is_kept_and_older_history_is_lost_not_skipped() {
    let engine = Engine::in_memory();
    let c = engine.database("app").expect("db").collection("c");
    c.insert_one(doc! {"_id": 1}).expect("insert");
    let (records, bytes) = engine.change_tail_stats();
    assert_eq!(
        (records, bytes),
        (0, 0),
        "no stream yet: the tail keeps nothing"
    );
    let start = engine.open_change_stream();
    c.insert_one(doc! {"_id": 2}).expect("insert");
    let got = kinds(&engine, &ChangeScope::Cluster, start);
    assert_eq!(
        got.len(),
        1,
        "only the write after the stream opened: {got:?}"
    );
    let err = engine
        .read_changes(&ChangeScope::Cluster, ChangePosition::default(), 10)
        .expect_err("history before the first stream of a WAL-less database");
    assert!(err.to_string().contains("Resume of change stream"), "{err}");
}

fn pre_images(engine: &Engine, after: ChangePosition) -> Vec<(String, Option<bson::Document>)> {
    let b = engine
        .read_changes(&ChangeScope::Cluster, after, 10_000)
        .expect("read");
    b.events
        .iter()
        .map(|e| {
            let what = match &e.kind {
                ChangeKind::Insert { coll, .. } => format!("insert {coll}"),
                ChangeKind::Update { coll, .. } => format!("update {coll}"),
                ChangeKind::Replace { coll, .. } => format!("replace {coll}"),
                ChangeKind::Delete { coll, .. } => format!("delete {coll}"),
                ChangeKind::Create { coll } => format!("create {coll}"),
                ChangeKind::Modify { coll, options } => format!("modify {coll} {options}"),
                other => format!("{other:?}"),
            };
            let before = e
                .before
                .as_ref()
                .map(|d| duetdb::raw::to_document(d).expect("pre-image"));
            (what, before)
        })
        .collect()
}

fn pre_image_workload(engine: &Engine) {
    let db = engine.database("d").expect("db");
    db.create_collection_with(
        "p",
        duetdb::CollectionOptions {
            pre_and_post_images: true,
            ..Default::default()
        },
    )
    .expect("create with pre-images");
    let p = db.collection("p");
    let plain = db.collection("q");
    for c in [&p, &plain] {
        c.insert_one(doc! {"_id": 1, "v": 1}).expect("insert");
        c.update_one(doc! {"_id": 1}, doc! {"$set": {"v": 2}})
            .expect("update");
        c.replace_one(doc! {"_id": 1}, doc! {"w": 3})
            .expect("replace");
        c.delete_one(doc! {"_id": 1}).expect("delete");
    }
    // Transactions record pre-images too.
    p.insert_one(doc! {"_id": 2, "v": 1}).expect("insert");
    p.insert_one(doc! {"_id": 3, "v": 1}).expect("insert");
    let mut tx = db.begin(TxnOptions::default());
    tx.update_one("p", doc! {"_id": 2}, doc! {"$inc": {"v": 1}})
        .expect("txn update");
    tx.delete_one("p", doc! {"_id": 3}).expect("txn delete");
    tx.commit().expect("commit");
    // Turned off: later changes have none.
    assert!(p.set_pre_and_post_images(false).expect("off"));
    p.delete_one(doc! {"_id": 2}).expect("delete");
}

fn expected_pre_images() -> Vec<(String, Option<bson::Document>)> {
    let s = |x: &str| x.to_string();
    vec![
        (s("create p"), None),
        (s("insert p"), None),
        (s("update p"), Some(doc! {"_id": 1, "v": 1})),
        (s("replace p"), Some(doc! {"_id": 1, "v": 2})),
        (s("delete p"), Some(doc! {"_id": 1, "w": 3})),
        (s("insert q"), None),
        (s("update q"), None),
        (s("replace q"), None),
        (s("delete q"), None),
        (s("insert p"), None),
        (s("insert p"), None),
        (s("update p"), Some(doc! {"_id": 2, "v": 1})),
        (s("delete p"), Some(doc! {"_id": 3, "v": 1})),
        (s("modify p {}"), None),
        (s("delete p"), None),
    ]
}

/// Collections with `changeStreamPreAndPostImages` record the version each
/// update, replace and delete changed; the option and the pre-images come
/// back after a restart (from the WAL, and the option from a checkpoint).
#[test]
fn pre_images_are_recorded_for_enabled_collections_and_survive_a_restart() {
    let dir = tempfile::tempdir().expect("tmp");
    {
        let engine = Engine::open(dir.path()).expect("open");
        engine.open_change_stream();
        pre_image_workload(&engine);
        assert_eq!(
            pre_images(&engine, ChangePosition::default()),
            expected_pre_images(),
            "from the tail"
        );
    }
    let engine = Engine::open(dir.path()).expect("reopen");
    assert_eq!(
        pre_images(&engine, ChangePosition::default()),
        expected_pre_images(),
        "from the WAL"
    );
    // The option survives a restart and a checkpoint (format version 3).
    let db = engine.database("d").expect("db");
    let p = db.collection("p");
    assert!(!p.options().expect("options").pre_and_post_images);
    assert!(!p.set_pre_and_post_images(true).expect("on again"));
    db.checkpoint().expect("checkpoint");
    drop((p, db, engine));
    let engine = Engine::open(dir.path()).expect("reopen after checkpoint");
    let start = engine.open_change_stream();
    let p = engine.database("d").expect("db").collection("p");
    assert!(p.options().expect("options").pre_and_post_images);
    p.insert_one(doc! {"_id": 9, "v": 9}).expect("insert");
    p.delete_one(doc! {"_id": 9}).expect("delete");
    let got = pre_images(&engine, start);
    assert_eq!(
        got.last(),
        Some(&("delete p".to_string(), Some(doc! {"_id": 9, "v": 9})))
    );
}

#[test]
fn create_with_options_is_one_create_event_and_existing_names_conflict() {
    let engine = Engine::in_memory();
    let start = engine.open_change_stream();
    let db = engine.database("d").expect("db");
    let on = duetdb::CollectionOptions {
        pre_and_post_images: true,
        ..Default::default()
    };
    db.create_collection_with("p", on.clone()).expect("create");
    let e = db
        .create_collection_with("p", on)
        .expect_err("exists already");
    assert!(matches!(e, duetdb::Error::NamespaceExists(_)), "{e}");
    assert_eq!(pre_images(&engine, start), [("create p".to_string(), None)]);
    assert!(db.collection("nope").set_pre_and_post_images(true).is_err());
}

fn copy_dir(from: &std::path::Path, to: &std::path::Path) {
    std::fs::create_dir_all(to).expect("mkdir");
    for e in std::fs::read_dir(from).expect("list") {
        let e = e.expect("entry");
        if e.file_name() != "LOCK" {
            std::fs::copy(e.path(), to.join(e.file_name())).expect("copy");
        }
    }
}

/// The drop is logged before the directory is touched, so a crash that
/// kept the directory (its deletion not durable yet) or left a tombstone
/// is finished at the next open: the database stays dropped.
#[test]
fn an_interrupted_drop_is_finished_at_open() {
    let dir = tempfile::tempdir().expect("tmp");
    let saved = tempfile::tempdir().expect("tmp");
    {
        let engine = Engine::open(dir.path()).expect("open");
        let z = engine.database("z").expect("z");
        z.collection("a").insert_one(doc! {"_id": 1}).expect("a");
        drop(z);
        copy_dir(&dir.path().join("z"), saved.path());
        assert!(engine.drop_database("z"));
    }
    // As if the crash lost the deletion, and left a tombstone of another.
    copy_dir(saved.path(), &dir.path().join("z"));
    copy_dir(saved.path(), &dir.path().join("y.dropped-1-0"));
    let engine = Engine::open(dir.path()).expect("reopen");
    assert!(
        engine.get("z").expect("name").is_none(),
        "the drop was finished"
    );
    assert!(!dir.path().join("z").exists());
    assert!(!dir.path().join("y.dropped-1-0").exists());
    // The insert went with the database's log: reading from before it is 286.
    let e = engine
        .read_changes(&ChangeScope::Cluster, ChangePosition::default(), 10)
        .expect_err("lost");
    assert_eq!(e.code(), 286, "{e}");
}
