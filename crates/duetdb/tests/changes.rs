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
        ["z:insert c", "z:dropDatabase"]
    );
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
