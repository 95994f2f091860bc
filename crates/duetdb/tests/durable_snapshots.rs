//! Durable named snapshots (issue 6, item 4): a snapshot created with
//! `durable: true` is pinned to its own checkpoint file, survives restarts,
//! reads by name after reopening exactly as at its csn, is freed (file and
//! manifest entry) when dropped or expired, is never removed by the regular
//! checkpoint/WAL cleanup, and survives or vanishes whole across a crash
//! during its creation. A damaged image is a clear error on read.
//!
//! Most tests run on the simulated disk (`SimFs`), one on a real directory.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use duetdb::bson::doc;
use duetdb::storage::{CrashKind, Fault, FaultKind, OpKind, Rng, SimFs, SimState};
use duetdb::{Database, ManualClock, Snapshot, SnapshotOptions};
use duetdb::{Durability, DurabilityOptions};
use parking_lot::Mutex;

fn dir() -> PathBuf {
    PathBuf::from("/db")
}

fn sim_opts(fs: &SimFs) -> DurabilityOptions {
    DurabilityOptions {
        mode: Durability::Fsync,
        segment_bytes: 1024,
        checkpoint_wal_bytes: u64::MAX,
        checkpoint_interval: None,
        background_checkpoints: false,
        vfs: Arc::new(fs.clone()),
        ..Default::default()
    }
}

/// Everything a snapshot holds: per collection, its documents in natural order.
type Model = BTreeMap<String, Vec<String>>;

fn model(s: &Snapshot) -> Model {
    s.list_collection_names()
        .into_iter()
        .map(|c| {
            let docs = s
                .collection(&c)
                .find(doc! {})
                .run()
                .expect("scan")
                .into_iter()
                .map(|d| d.to_string())
                .collect();
            (c, docs)
        })
        .collect()
}

fn durable(collections: Option<Vec<String>>, ttl: Option<Duration>) -> SnapshotOptions {
    SnapshotOptions {
        collections,
        ttl,
        durable: true,
    }
}

fn snap_files(fs: &SimFs) -> Vec<String> {
    fs.state()
        .files_in(&dir())
        .into_iter()
        .filter(|n| n.starts_with("snap-"))
        .collect()
}

fn fill(db: &Database, from: i64, to: i64) {
    let a = db.collection("a");
    let b = db.collection("b");
    for i in from..to {
        a.insert_one(doc! {"_id": i, "v": i * 2, "s": "x".repeat(40)})
            .expect("insert a");
        b.insert_one(doc! {"_id": format!("k{i}"), "n": i})
            .expect("insert b");
    }
}

#[test]
fn durable_snap_reads_by_name_after_reopen_as_at_its_csn() {
    let fs = SimFs::new();
    let db = Database::open_with(dir(), sim_opts(&fs)).expect("open");
    fill(&db, 0, 60);
    db.collection("a")
        .create_index(doc! {"v": 1}, Default::default())
        .expect("index");
    let all = db
        .create_snapshot_with("all", durable(None, None))
        .expect("create");
    assert!(all.durable);
    let only_a = db
        .create_snapshot_with(
            "only-a",
            durable(Some(vec!["a".into()]), Some(Duration::from_secs(3600))),
        )
        .expect("create restricted");
    db.create_snapshot("volatile", None, None).expect("plain");
    let want_all = model(&db.named_snapshot("all").expect("all"));
    let want_a = model(&db.named_snapshot("only-a").expect("a"));
    assert_eq!(want_a.keys().collect::<Vec<_>>(), vec!["a"]);

    // Write a lot more, with regular checkpoints that delete WAL segments
    // and old checkpoints.
    for round in 0..4 {
        fill(&db, 100 + round * 50, 150 + round * 50);
        db.collection("a")
            .update_many(doc! {}, doc! {"$inc": {"v": 1}})
            .expect("update");
        db.collection("b")
            .delete_many(doc! {"n": {"$lt": 20 + round * 10}})
            .expect("delete");
        db.checkpoint().expect("checkpoint");
    }
    db.drop_collection("b").expect("drop b");
    db.checkpoint().expect("checkpoint");
    let files = snap_files(&fs);
    assert_eq!(
        files.len(),
        2,
        "pinned images survive the cleanup: {files:?}"
    );
    let ckpts = fs
        .state()
        .files_in(&dir())
        .into_iter()
        .filter(|n| n.starts_with("ckpt-"))
        .count();
    assert!(ckpts <= 2, "regular cleanup still runs");
    let latest = model(&db.snapshot());
    drop(db);

    let db = Database::open_with(dir(), sim_opts(&fs)).expect("reopen");
    assert_eq!(model(&db.snapshot()), latest);
    let list = db.list_snapshots();
    let names: Vec<_> = list.iter().map(|i| (i.name.as_str(), i.durable)).collect();
    assert_eq!(
        names,
        vec![("all", true), ("only-a", true)],
        "volatile is gone"
    );
    let info = db.snapshot_info("only-a").expect("info");
    assert_eq!(info.csn, only_a.csn);
    assert_eq!(info.ttl, Some(Duration::from_secs(3600)));
    assert_eq!(info.collections, Some(vec!["a".to_string()]));
    let s = db.named_snapshot("all").expect("read all");
    assert_eq!(s.csn(), all.csn);
    assert_eq!(model(&s), want_all);
    // The index came back too (rebuilt at load): a range on `v` uses it.
    let hits = s
        .collection("a")
        .find(doc! {"v": {"$gte": 100}})
        .run()
        .expect("range");
    assert_eq!(hits.len(), 10);
    assert_eq!(model(&db.named_snapshot("only-a").expect("a")), want_a);
    drop(db);
    // And again (loading did not change anything on disk).
    let db = Database::open_with(dir(), sim_opts(&fs)).expect("reopen 2");
    assert_eq!(model(&db.named_snapshot("all").expect("all")), want_all);
}

#[test]
fn durable_snap_drop_frees_the_file_across_reopens() {
    let fs = SimFs::new();
    let db = Database::open_with(dir(), sim_opts(&fs)).expect("open");
    fill(&db, 0, 10);
    db.create_snapshot_with("s1", durable(None, None))
        .expect("s1");
    fill(&db, 10, 20);
    db.create_snapshot_with("s2", durable(None, None))
        .expect("s2");
    assert_eq!(snap_files(&fs).len(), 2);
    db.drop_snapshot("s1").expect("drop");
    assert_eq!(snap_files(&fs).len(), 1);
    drop(db);
    let db = Database::open_with(dir(), sim_opts(&fs)).expect("reopen");
    let e = db.named_snapshot("s1").expect_err("dropped");
    assert_eq!(e.code(), 246);
    assert_eq!(db.named_snapshot("s2").expect("s2").csn(), 20 + 20);
    // Dropping one that was reloaded (never read) works too.
    db.drop_snapshot("s2").expect("drop s2");
    assert!(snap_files(&fs).is_empty());
    // The name can be reused, durably.
    db.create_snapshot_with("s2", durable(None, None))
        .expect("again");
    drop(db);
    let db = Database::open_with(dir(), sim_opts(&fs)).expect("reopen 2");
    assert_eq!(
        db.list_snapshots()
            .iter()
            .map(|i| i.name.clone())
            .collect::<Vec<_>>(),
        vec!["s2"]
    );
    assert_eq!(snap_files(&fs).len(), 1);
}

#[test]
fn durable_snap_ttl_expiry_drops_it_durably() {
    let fs = SimFs::new();
    let db = Database::open_with(dir(), sim_opts(&fs)).expect("open");
    let clock = Arc::new(ManualClock::new());
    db.set_snapshot_clock(clock.clone());
    fill(&db, 0, 5);
    db.create_snapshot_with("t", durable(None, Some(Duration::from_secs(60))))
        .expect("create");
    clock.advance(Duration::from_secs(61));
    assert_eq!(db.expire_snapshots(), 1);
    assert!(snap_files(&fs).is_empty(), "expired image deleted");
    drop(db);
    let db = Database::open_with(dir(), sim_opts(&fs)).expect("reopen");
    assert!(db.list_snapshots().is_empty());
}

#[test]
fn durable_snap_in_memory_database_is_a_clear_error() {
    let db = Database::in_memory();
    let e = db
        .create_snapshot_with("x", durable(None, None))
        .expect_err("in memory");
    assert_eq!(e.code(), 20);
    assert!(e.to_string().contains("lives in memory"), "{e}");
    assert!(db.list_snapshots().is_empty());
}

#[test]
fn durable_snap_damaged_image_is_a_clear_error_on_read() {
    let fs = SimFs::new();
    let db = Database::open_with(dir(), sim_opts(&fs)).expect("open");
    fill(&db, 0, 30);
    db.create_snapshot_with("good", durable(None, None))
        .expect("good");
    db.create_snapshot_with("bad", durable(Some(vec!["b".into()]), None))
        .expect("bad");
    let want = model(&db.named_snapshot("good").expect("good"));
    drop(db);
    let file = snap_files(&fs)
        .into_iter()
        .find(|n| n.starts_with("snap-bad-"))
        .expect("file");
    let path = dir().join(&file);
    let bytes = {
        use duetdb::storage::Vfs;
        fs.read(&path).expect("read image")
    };
    let len = bytes.len();
    // Damage: a flipped byte (every 7th, and the last), or a missing file.
    for off in (0..len).step_by(7).chain([len - 1]) {
        let mut st: SimState = fs.state();
        assert!(st.poke(&path, off, bytes[off] ^ 0x5a));
        check_damaged(SimFs::from_state(st), &file, &want);
    }
    let st = fs.state();
    let gone = SimFs::from_state(st);
    {
        use duetdb::storage::Vfs;
        gone.remove(&path).expect("remove");
    }
    check_damaged(gone, &file, &want);
}

fn check_damaged(fs: SimFs, file: &str, want: &Model) {
    let db = Database::open_with(dir(), sim_opts(&fs)).expect("a damaged pin does not stop open");
    match db.named_snapshot("bad") {
        Ok(s) => panic!("damaged image read as csn {}", s.csn()),
        Err(e) => {
            let m = e.to_string();
            assert!(m.contains("durable snapshot 'bad' is unreadable"), "{m}");
            assert!(m.contains(file), "{m}");
        }
    }
    assert_eq!(&model(&db.named_snapshot("good").expect("good")), want);
    // Still listed and droppable.
    assert!(db.list_snapshots().iter().any(|i| i.name == "bad"));
    db.drop_snapshot("bad").expect("drop a damaged one");
}

#[test]
fn durable_snap_full_disk_or_io_error_registers_nothing() {
    for kind in [FaultKind::NoSpace, FaultKind::Io] {
        let mut n = 1;
        loop {
            let fs = SimFs::new();
            let db = Database::open_with(dir(), sim_opts(&fs)).expect("open");
            fill(&db, 0, 40);
            fs.set_fault(Some(Fault {
                at: n,
                persistent: false,
                kind,
                only: None,
            }));
            let r = db.create_snapshot_with("s", durable(None, None));
            fs.set_fault(None);
            match r {
                Ok(_) => {
                    assert!(n > 3, "the fault loop reached past the create");
                    break;
                }
                Err(e) => {
                    if kind == FaultKind::NoSpace {
                        assert_eq!(e.code(), 14031, "{e}");
                    }
                    assert!(db.named_snapshot("s").is_err(), "nothing registered");
                    assert!(db.list_snapshots().is_empty());
                    // Writes and reads go on.
                    fill(&db, 40, 41);
                    // Retry works once the disk is fine again.
                    db.create_snapshot_with("s", durable(None, None))
                        .expect("retry");
                    drop(db);
                    let db = Database::open_with(dir(), sim_opts(&fs)).expect("reopen");
                    assert_eq!(db.list_snapshots().len(), 1);
                    assert_eq!(snap_files(&fs).len(), 1, "no leftover image");
                    db.named_snapshot("s").expect("readable");
                }
            }
            n += 1;
        }
    }
}

/// A crash at any operation of a durable create leaves, after recovery, the
/// database state unchanged and either no snapshot or a complete one.
#[test]
fn durable_snap_crash_during_create_leaves_none_or_a_complete_one() {
    const KINDS: [CrashKind; 5] = [
        CrashKind::DropUnsynced,
        CrashKind::RandomPrefix,
        CrashKind::ReorderedSubset,
        CrashKind::TornSector,
        CrashKind::CorruptSector,
    ];
    let fs = SimFs::new();
    let db = Database::open_with(dir(), sim_opts(&fs)).expect("open");
    fill(&db, 0, 80);
    let state = model(&db.snapshot());
    let images: Arc<Mutex<Vec<SimState>>> = Arc::default();
    {
        let images = images.clone();
        let mut rng = Rng::new(7);
        fs.set_hook(Some(Box::new(move |_k: OpKind, st: &SimState| {
            for kind in KINDS {
                for _ in 0..4 {
                    images.lock().push(st.crash_image(kind, &mut rng));
                }
            }
        })));
    }
    db.create_snapshot_with("s", durable(None, None))
        .expect("create");
    fs.set_hook(None);
    let after = fs
        .state()
        .crash_image(CrashKind::DropUnsynced, &mut Rng::new(1));
    drop(db);
    let images = std::mem::take(&mut *images.lock());
    assert!(images.len() > 40, "{} images", images.len());
    let (mut with, mut without) = (0, 0);
    for image in images.into_iter().chain([after.clone()]) {
        let fs = SimFs::from_state(image);
        let db = Database::open_with(dir(), sim_opts(&fs)).expect("recovers");
        assert_eq!(model(&db.snapshot()), state);
        match db.named_snapshot("s") {
            Ok(s) => {
                assert_eq!(model(&s), state, "a complete snapshot");
                with += 1;
            }
            Err(e) => {
                assert_eq!(e.code(), 246, "absent, not damaged: {e}");
                assert!(snap_files(&fs).is_empty(), "orphan image removed at open");
                without += 1;
            }
        }
    }
    assert!(
        with > 0 && without > 0,
        "both outcomes seen: {with} {without}"
    );
    // Once create returned, the snapshot survives a crash.
    let db = Database::open_with(dir(), sim_opts(&SimFs::from_state(after))).expect("after");
    db.named_snapshot("s")
        .expect("acknowledged snapshot survives");
}

#[test]
fn durable_snap_real_directory_round_trip() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let p: &Path = tmp.path();
    let db = Database::open(p).expect("open");
    fill(&db, 0, 20);
    db.create_snapshot_with("r", durable(None, None))
        .expect("create");
    let want = model(&db.named_snapshot("r").expect("r"));
    fill(&db, 20, 30);
    drop(db);
    let db = Database::open(p).expect("reopen");
    assert_eq!(model(&db.named_snapshot("r").expect("r")), want);
    db.drop_snapshot("r").expect("drop");
    let left: Vec<_> = std::fs::read_dir(p)
        .expect("ls")
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with("snap-"))
        .collect();
    assert!(left.is_empty(), "{left:?}");
}
