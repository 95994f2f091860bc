//! The manifest names the WAL's segments (format v3), so a segment that is
//! missing, truncated or left over is detected instead of recovering an older
//! state quietly (issue 14, item 1): the issue's own scenario on real files,
//! then each rule of the segment protocol on the simulated disk.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use duetdb::bson::doc;
use duetdb::storage::{wal, CrashKind, Fault, FaultKind, OpKind, Rng, SimFs, SimState, Vfs};
use duetdb::{Database, Durability, DurabilityOptions};

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

fn insert(db: &Database, from: i64, n: i64) {
    let c = db.collection("c");
    for i in from..from + n {
        c.insert_one(doc! {"_id": i, "pad": "x".repeat(40)})
            .expect("acknowledged insert");
    }
}

fn count(db: &Database) -> u64 {
    db.collection("c").count(doc! {}).expect("count")
}

fn open(state: SimState) -> Result<Database, String> {
    let fs = SimFs::from_state(state);
    Database::open_with(dir(), sim_opts(&fs)).map_err(|e| e.to_string())
}

/// WAL segment names of a disk, sorted.
fn segments(state: &SimState) -> Vec<String> {
    let mut s: Vec<String> = state
        .files_in(&dir())
        .into_iter()
        .filter(|n| n.starts_with("wal-"))
        .collect();
    s.sort();
    s
}

fn remove(state: SimState, name: &str) -> SimState {
    let fs = SimFs::from_state(state);
    fs.remove(&dir().join(name)).expect("remove");
    fs.state()
}

fn truncate(state: SimState, name: &str, len: u64) -> SimState {
    let fs = SimFs::from_state(state);
    fs.truncate(&dir().join(name), len).expect("truncate");
    fs.state()
}

fn read(state: &SimState, name: &str) -> Vec<u8> {
    SimFs::from_state(state.clone())
        .read(&dir().join(name))
        .expect("read")
}

/// Offsets where the records of a segment start.
fn record_starts(buf: &[u8]) -> Vec<usize> {
    let mut starts = Vec::new();
    let mut pos = wal::SEGMENT_MAGIC.len();
    while let Ok(Some((_, next))) = wal::read_frame(buf, pos) {
        starts.push(pos);
        pos = next;
    }
    starts
}

/// A database with several segments, closed cleanly or not.
fn build(closed: bool) -> SimState {
    let fs = SimFs::new();
    let db = Database::open_with(dir(), sim_opts(&fs)).expect("open");
    insert(&db, 0, 60);
    if closed {
        drop(db);
        fs.state()
    } else {
        let s = fs.state();
        drop(db);
        s
    }
}

/// The scenario: 100 acknowledged (`j: true`) inserts, stop, delete
/// the newest `wal-*.log`, start again. It used to open with 0 documents and
/// log nothing; now it refuses, naming the file.
#[test]
fn deleting_the_newest_segment_is_refused_naming_it() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let path = tmp.path().join("db");
    {
        let db = Database::open(&path).expect("open");
        insert(&db, 0, 100);
    }
    let mut wals: Vec<PathBuf> = std::fs::read_dir(&path)
        .expect("list")
        .map(|e| e.expect("entry").path())
        .filter(|p| {
            p.file_name()
                .is_some_and(|n| n.to_string_lossy().starts_with("wal-"))
        })
        .collect();
    wals.sort();
    let newest = wals.pop().expect("a segment");
    std::fs::remove_file(&newest).expect("delete the newest segment");
    let name = newest
        .file_name()
        .expect("name")
        .to_string_lossy()
        .into_owned();
    match Database::open(&path) {
        Ok(db) => panic!("opened with {} of 100 acknowledged documents", count(&db)),
        Err(e) => {
            let msg = e.to_string();
            assert!(msg.contains(&name) && msg.contains("missing"), "{msg}");
        }
    }
}

/// Every named segment is required, newest or not, after a clean close or a
/// crash (the manifest named each before anything was written to it).
#[test]
fn a_missing_named_segment_is_refused_whether_closed_or_crashed() {
    for closed in [true, false] {
        let state = build(closed);
        let segs = segments(&state);
        assert!(segs.len() >= 3, "{segs:?}");
        for name in &segs {
            let msg = open(remove(state.clone(), name))
                .map(|db| format!("opened with {} documents", count(&db)))
                .unwrap_err_or_msg();
            assert!(
                msg.contains(name.as_str()) && msg.contains("missing"),
                "closed={closed}, {name} deleted: {msg}"
            );
        }
    }
}

trait ErrOrMsg {
    fn unwrap_err_or_msg(self) -> String;
}

impl ErrOrMsg for Result<String, String> {
    /// The error; an `Ok` (a database that opened) fails the test.
    fn unwrap_err_or_msg(self) -> String {
        match self {
            Ok(opened) => panic!("damage went unnoticed: {opened}"),
            Err(e) => e,
        }
    }
}

/// A segment other than the last that ends early — cut at a record
/// boundary, so every remaining record is valid — is damage in the middle.
#[test]
fn a_segment_ending_before_the_next_one_starts_is_refused_naming_it() {
    let state = build(false);
    let segs = segments(&state);
    let victim = &segs[segs.len() - 2];
    let starts = record_starts(&read(&state, victim));
    let cut = *starts.last().expect("records") as u64;
    let msg = open(truncate(state, victim, cut))
        .map(|db| format!("opened with {} documents", count(&db)))
        .unwrap_err_or_msg();
    assert!(
        msg.contains(victim.as_str()) && msg.contains("ends at commit"),
        "{msg}"
    );
}

/// After a clean close the manifest records the synced end of the log, so
/// the last segment cut at a record boundary is refused too.
#[test]
fn the_last_segment_cut_short_after_a_clean_close_is_refused() {
    let state = build(true);
    let last = segments(&state).pop().expect("segment");
    let starts = record_starts(&read(&state, &last));
    let cut = *starts.last().expect("records") as u64;
    let msg = open(truncate(state, &last, cut))
        .map(|db| format!("opened with {} documents", count(&db)))
        .unwrap_err_or_msg();
    assert!(msg.contains(&last) && msg.contains("synced"), "{msg}");
}

/// A segment the manifest does not name: with no record it is a roll the
/// crash interrupted (removed); with records it is refused, naming it.
#[test]
fn unnamed_segments_are_removed_when_empty_and_refused_when_they_hold_records() {
    let state = build(true);
    let fs = SimFs::from_state(state.clone());
    let stray = wal::segment_name(10_000);
    let f = fs.create(&dir().join(&stray)).expect("create");
    f.append(wal::SEGMENT_MAGIC).expect("header");
    let db = open(fs.state()).expect("an empty unnamed segment is a crash leftover");
    assert_eq!(count(&db), 60);
    assert!(db
        .recovery_report()
        .expect("report")
        .removed
        .iter()
        .any(|p| p.ends_with(&stray)));
    drop(db);

    // A copy of a segment with records under a newer, unnamed name.
    let fs = SimFs::from_state(state.clone());
    let last = segments(&state).pop().expect("segment");
    let f = fs.create(&dir().join(&stray)).expect("create");
    f.append(&read(&state, &last)).expect("copy");
    let msg = open(fs.state())
        .map(|db| format!("opened with {} documents", count(&db)))
        .unwrap_err_or_msg();
    assert!(
        msg.contains(&stray) && msg.contains("does not name"),
        "{msg}"
    );
}

/// `MANIFEST` deleted while checkpoints exist: only it could say which state
/// is current, so recovery refuses, naming it. A log that starts at commit 1
/// and reaches every checkpoint file (a database of an older build, or a
/// crash before its first manifest) still opens. No change history is kept
/// here, so the second checkpoint deletes the log's start (with history the
/// log would still start at commit 1 and stand in: the case below).
#[test]
fn a_missing_manifest_is_refused_when_the_log_cannot_stand_in_for_it() {
    let fs = SimFs::new();
    let opts = DurabilityOptions {
        change_retention_bytes: 0,
        ..sim_opts(&fs)
    };
    let db = Database::open_with(dir(), opts).expect("open");
    insert(&db, 0, 20);
    db.checkpoint().expect("first checkpoint");
    let one_checkpoint = fs.state();
    insert(&db, 20, 20);
    db.checkpoint().expect("second checkpoint");
    insert(&db, 40, 5);
    drop(db);
    let msg = open(remove(fs.state(), "MANIFEST"))
        .map(|db| format!("opened with {} documents", count(&db)))
        .unwrap_err_or_msg();
    assert!(msg.contains("MANIFEST") && msg.contains("missing"), "{msg}");

    let db = open(remove(one_checkpoint, "MANIFEST")).expect("the log covers the checkpoint");
    assert_eq!(count(&db), 20);
}

/// With change history (the default), segments a checkpoint no longer needs
/// stay: a lost `MANIFEST` is then recovered from the whole log, every
/// acknowledged document included.
#[test]
fn with_change_history_the_whole_log_stands_in_for_a_lost_manifest() {
    let fs = SimFs::new();
    let db = Database::open_with(dir(), sim_opts(&fs)).expect("open");
    insert(&db, 0, 20);
    db.checkpoint().expect("first checkpoint");
    insert(&db, 20, 20);
    db.checkpoint().expect("second checkpoint");
    insert(&db, 40, 5);
    drop(db);
    let db = open(remove(fs.state(), "MANIFEST")).expect("the log starts at commit 1");
    assert_eq!(count(&db), 45);
}

/// A fallback to the previous checkpoint is accepted only when the log
/// reaches the current one. In `batch` mode a checkpoint can hold commits
/// whose log records a crash took: then a damaged current checkpoint is an
/// error naming it, not the older state.
#[test]
fn a_fallback_the_log_does_not_cover_is_refused_naming_the_checkpoint() {
    let fs = SimFs::new();
    let opts = DurabilityOptions {
        mode: Durability::Batch,
        flush_interval: std::time::Duration::from_secs(3600),
        ..sim_opts(&fs)
    };
    let db = Database::open_with(dir(), opts).expect("open");
    insert(&db, 0, 10);
    let info = db.checkpoint().expect("checkpoint").expect("new");
    let crashed = fs
        .state()
        .crash_image(CrashKind::DropUnsynced, &mut Rng::new(1));
    drop(db);
    // Intact, the checkpoint holds what the log lost.
    assert_eq!(count(&open(crashed.clone()).expect("opens")), 10);
    let name = info
        .path
        .file_name()
        .expect("name")
        .to_string_lossy()
        .into_owned();
    let mut damaged = crashed;
    assert!(damaged.poke(&dir().join(&name), 20, 0xFF));
    let msg = open(damaged)
        .map(|db| format!("opened with {} documents", count(&db)))
        .unwrap_err_or_msg();
    assert!(msg.contains(&name), "{msg}");
}

/// Segment roll, step by step: a failed manifest install fails the group and
/// removes the new segment, and the next write rolls again; a failure after
/// the rename (only the directory fsync) stops writes, since the manifest on
/// disk may or may not name the segment. Every acknowledged write survives.
#[test]
fn a_failed_segment_roll_fails_the_group_and_loses_nothing() {
    for (only, stops) in [(OpKind::Rename, false), (OpKind::SyncDir, true)] {
        let fs = SimFs::new();
        let db = Database::open_with(dir(), sim_opts(&fs)).expect("open");
        let c = db.collection("c");
        let mut acked = 0i64;
        let segs = segments(&fs.state()).len();
        // Fill the first segment up to just before a roll.
        while segments(&fs.state()).len() == segs {
            insert(&db, acked, 1);
            acked += 1;
        }
        // The next roll fails at its `only` operation: the manifest install
        // renames (and syncs the directory) after creating the segment.
        fs.set_fault(Some(Fault {
            at: if only == OpKind::SyncDir { 2 } else { 1 },
            persistent: false,
            kind: FaultKind::Io,
            only: Some(only),
        }));
        let mut failed = false;
        for i in 0..200 {
            match c.insert_one(doc! {"_id": acked, "pad": "x".repeat(40)}) {
                Ok(_) => acked += 1,
                Err(e) => {
                    failed = true;
                    let later = c.insert_one(doc! {"_id": acked, "pad": "x"});
                    assert_eq!(
                        later.is_err(),
                        stops,
                        "{only:?} at {i}: {e}; then {later:?}"
                    );
                    if later.is_ok() {
                        acked += 1;
                    }
                    break;
                }
            }
        }
        assert!(failed, "{only:?}: the fault never hit a roll");
        fs.set_fault(None);
        let expect = acked as u64;
        assert_eq!(count(&db), expect);
        drop(c);
        drop(db);
        for img in [
            fs.state(),
            fs.state()
                .crash_image(CrashKind::DropUnsynced, &mut Rng::new(3)),
        ] {
            let db = open(img).unwrap_or_else(|e| panic!("{only:?}: reopen failed: {e}"));
            assert_eq!(count(&db), expect, "{only:?}");
        }
    }
}

/// The first open by this build upgrades an older manifest (the v1 fixture)
/// to v3, naming the segments it found.
#[test]
fn an_old_manifest_is_upgraded_at_open() {
    let fixture = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/durability-v1");
    let tmp = tempfile::tempdir().expect("tempdir");
    for e in std::fs::read_dir(&fixture).expect("fixture") {
        let e = e.expect("entry");
        std::fs::copy(e.path(), tmp.path().join(e.file_name())).expect("copy");
    }
    let version = |p: &Path| {
        let b = std::fs::read(p.join("MANIFEST")).expect("manifest");
        u32::from_le_bytes([b[8], b[9], b[10], b[11]])
    };
    assert_eq!(version(tmp.path()), 1);
    let n = {
        let db = Database::open(tmp.path()).expect("open the v1 fixture");
        db.collection("fixture").count(doc! {}).expect("count")
    };
    assert_eq!(version(tmp.path()), 4);
    // And the upgraded directory reopens, segments named.
    let db = Database::open(tmp.path()).expect("reopen");
    assert_eq!(db.collection("fixture").count(doc! {}).expect("count"), n);
}
