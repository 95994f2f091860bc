//! Change history under crashes (simulated disk): checkpoints move WAL
//! segments to the history list and expire old ones while inserts run;
//! before every file operation the disk is cut into crash images of every
//! kind. Every image must recover the acknowledged inserts (a crash while
//! moving or expiring segments never loses one recovery needs), and every
//! resume from a recorded position either returns exactly the inserts after
//! it or fails with ChangeStreamHistoryLost (286) — a lost history-only
//! segment shortens the history, it never yields an I/O error, a gap or a
//! duplicate — while a recent position always resumes.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use duetdb::bson::doc;
use duetdb::storage::{CrashKind, OpKind, Rng, SimFs, SimState, Vfs};
use duetdb::{ChangeKind, ChangePosition, Database, Durability, DurabilityOptions};
use parking_lot::Mutex;

const KINDS: [CrashKind; 5] = [
    CrashKind::DropUnsynced,
    CrashKind::RandomPrefix,
    CrashKind::ReorderedSubset,
    CrashKind::TornSector,
    CrashKind::CorruptSector,
];

fn dir() -> PathBuf {
    PathBuf::from("/db")
}

fn opts(fs: &SimFs) -> DurabilityOptions {
    DurabilityOptions {
        mode: Durability::Fsync,
        segment_bytes: 2048,
        checkpoint_wal_bytes: u64::MAX,
        checkpoint_interval: None,
        background_checkpoints: false,
        // Three segments of history: checkpoints expire the older ones.
        change_retention_bytes: 3 * 2048,
        vfs: Arc::new(fs.clone()),
        ..Default::default()
    }
}

fn insert(db: &Database, i: i32) {
    db.collection("c")
        .insert_one(doc! {"_id": i, "pad": "x".repeat(150)})
        .expect("insert");
}

/// The inserted `_id`s a resume from `after` returns (all of them), or the
/// error code.
fn resume(db: &Database, after: ChangePosition) -> Result<Vec<i32>, i32> {
    let mut out = Vec::new();
    let mut pos = after;
    loop {
        let b = db.read_changes(pos, 64).map_err(|e| e.code())?;
        if b.events.is_empty() {
            return Ok(out);
        }
        for e in &b.events {
            if let ChangeKind::Insert { doc, .. } = &e.kind {
                out.push(doc.get_i32("_id").unwrap_or(-1));
            }
        }
        pos = b.position;
    }
}

/// Check one recovered image; `positions[i]` is insert `i`'s event.
fn check_image(
    image: SimState,
    template: &DurabilityOptions,
    acked: usize,
    positions: &[ChangePosition],
) -> Result<(), String> {
    let fs = SimFs::from_state(image);
    let opts = DurabilityOptions {
        vfs: Arc::new(fs),
        ..template.clone()
    };
    let db = Database::open_with(dir(), opts).map_err(|e| format!("recovery failed: {e}"))?;
    let n = db
        .collection("c")
        .count(doc! {})
        .map_err(|e| e.to_string())? as usize;
    if n != acked && n != acked + 1 {
        return Err(format!("{n} inserts recovered, {acked} acknowledged"));
    }
    let check = |from: usize, got: Result<Vec<i32>, i32>, must: bool| -> Result<(), String> {
        match got {
            Ok(ids) => {
                let want: Vec<i32> = (from as i32..n as i32).collect();
                if ids != want {
                    return Err(format!(
                        "resume before insert {from}: {ids:?}, not {from}..{n}"
                    ));
                }
                Ok(())
            }
            Err(286) if !must => Ok(()),
            Err(code) => Err(format!("resume before insert {from}: error {code}")),
        }
    };
    check(0, resume(&db, ChangePosition::default()), false)?;
    // Resuming after insert i must return i + 1 .. n, or 286; after one of
    // the last inserts (in the live log) it must work.
    let mut samples = vec![0, n / 3, n / 2];
    if n >= 2 {
        samples.push(n - 2);
    }
    for i in samples {
        if i + 1 < n && i < positions.len() {
            check(i + 1, resume(&db, positions[i]), i + 2 >= n)?;
        }
    }
    Ok(())
}

struct Shared {
    acked: usize,
    positions: Vec<ChangePosition>,
    violations: Vec<String>,
    images: usize,
}

#[test]
fn crashes_while_moving_and_expiring_history_lose_nothing_recovery_needs() {
    let fs = SimFs::new();
    let template = opts(&fs);
    let db = Database::open_with(dir(), template.clone()).expect("open");
    db.open_change_stream();
    let shared = Arc::new(Mutex::new(Shared {
        acked: 0,
        positions: Vec::new(),
        violations: Vec::new(),
        images: 0,
    }));
    {
        let shared = shared.clone();
        let template = template.clone();
        let mut rng = Rng::new(0x5EED);
        fs.set_hook(Some(Box::new(move |_kind: OpKind, state: &SimState| {
            let (acked, positions) = {
                let s = shared.lock();
                (s.acked, s.positions.clone())
            };
            for kind in KINDS {
                let image = state.crash_image(kind, &mut rng);
                let r = check_image(image, &template, acked, &positions);
                let mut s = shared.lock();
                s.images += 1;
                if let Err(e) = r {
                    s.violations
                        .push(format!("{kind:?} after {acked} inserts: {e}"));
                }
            }
        })));
    }
    let mut pos = ChangePosition::default();
    for i in 0..90 {
        insert(&db, i);
        let b = db.read_changes(pos, 8).expect("read");
        let e = b.events.last().expect("the insert's event");
        pos = e.pos;
        {
            let mut s = shared.lock();
            s.acked += 1;
            s.positions.push(e.pos);
        }
        if i % 9 == 8 {
            db.checkpoint().expect("checkpoint");
        }
    }
    fs.set_hook(None);
    let s = shared.lock();
    assert!(
        s.violations.is_empty(),
        "{} of {} images: {:?}",
        s.violations.len(),
        s.images,
        &s.violations[..s.violations.len().min(5)]
    );
    eprintln!("crash images checked: {}", s.images);
    assert!(s.images >= 1000, "only {} images", s.images);
    // The run did expire history (or the test proves little).
    drop(s);
    drop(db);
    let db = Database::open_with(dir(), template).expect("reopen");
    assert_eq!(resume(&db, ChangePosition::default()), Err(286));
}

/// A history segment deleted behind the manifest's back (what a crash that
/// kept an expiry's delete but not its manifest leaves) only shortens the
/// history: resuming from before it is 286, from after it works exactly.
#[test]
fn a_missing_history_segment_turns_older_resumes_into_286() {
    let fs = SimFs::new();
    let template = DurabilityOptions {
        change_retention_bytes: 1 << 30,
        ..opts(&fs)
    };
    let mut positions = Vec::new();
    {
        let db = Database::open_with(dir(), template.clone()).expect("open");
        db.open_change_stream();
        let mut pos = ChangePosition::default();
        for i in 0..60 {
            insert(&db, i);
            let b = db.read_changes(pos, 8).expect("read");
            pos = b.events.last().expect("event").pos;
            positions.push(pos);
            if i % 9 == 8 {
                db.checkpoint().expect("checkpoint");
            }
        }
    }
    let segments: Vec<String> = {
        let mut v: Vec<String> = fs
            .state()
            .files_in(&dir())
            .into_iter()
            .filter(|f| f.starts_with("wal-"))
            .collect();
        v.sort();
        v
    };
    assert!(segments.len() >= 6, "{segments:?}");
    let db = Database::open_with(dir(), template.clone()).expect("reopen");
    assert_eq!(
        resume(&db, ChangePosition::default()),
        Ok((0..60).collect())
    );
    drop(db);
    // Delete the second segment: history only (checkpoints went past it).
    let gone: &Path = Path::new(&segments[1]);
    Vfs::remove(&fs, &dir().join(gone)).expect("remove");
    let db = Database::open_with(dir(), template).expect("recovery does not need it");
    assert_eq!(db.collection("c").count(doc! {}).expect("count"), 60);
    assert_eq!(resume(&db, ChangePosition::default()), Err(286));
    assert_eq!(resume(&db, positions[0]), Err(286));
    // From the middle of the log on, exactly the rest.
    assert_eq!(resume(&db, positions[40]), Ok((41..60).collect()));
}
