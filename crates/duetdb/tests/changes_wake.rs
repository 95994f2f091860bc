//! Change streams under concurrency (the lock-free tail and the coalesced
//! wake-ups, `durability/changes/{tail,wake}.rs`), checked against a model:
//! writers of two databases commit concurrently (so their groups finish out
//! of time order) while readers follow the cluster in random batch sizes,
//! waiting for publishes as the server's `getMore` does. Every reader must
//! see exactly the committed sequence — per writer, its writes in order,
//! no loss, no duplicate; globally, positions strictly increasing and the
//! same sequence for every reader — and no wake-up may be lost: a reader
//! that waits with a long deadline while writes go on is always woken
//! before it (its wait never times out), and one that waits with a short
//! deadline always returns what was readable before its final read.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bson::doc;
use duetdb::{ChangeKind, ChangePosition, ChangeScope, Engine};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// What a reader saw: `(position, db, writer's sequence number, batch)`.
type Seen = Vec<(ChangePosition, String, i64)>;

struct ReaderReport {
    seen: Seen,
    long_waits: u64,
    long_wait_timeouts: u64,
}

/// Inserts each writer makes (some as pairs in one group: one time, two
/// events).
const PER_WRITER: i64 = 600;
/// A long wait's deadline: a lost wake-up would sleep through it.
const LONG: Duration = Duration::from_secs(30);

fn writer(engine: &Engine, db: &str, seed: u64) {
    let coll = engine.database(db).expect("db").collection("c");
    let mut rng = StdRng::seed_from_u64(seed);
    let mut i = 0;
    while i < PER_WRITER {
        if rng.gen_bool(0.2) && i + 1 < PER_WRITER {
            coll.insert_many(vec![doc! {"_id": i}, doc! {"_id": i + 1}], true)
                .expect("insert pair");
            i += 2;
        } else {
            coll.insert_one(doc! {"_id": i}).expect("insert");
            i += 1;
        }
        if rng.gen_bool(0.05) {
            std::thread::sleep(Duration::from_micros(rng.gen_range(0..300)));
        }
    }
}

fn reader(
    engine: &Engine,
    start: ChangePosition,
    long: bool,
    seed: u64,
    readable_before: &AtomicU64,
) -> ReaderReport {
    let mut rng = StdRng::seed_from_u64(seed);
    let mut r = ReaderReport {
        seen: Vec::new(),
        long_waits: 0,
        long_wait_timeouts: 0,
    };
    let mut pos = start;
    let total = (2 * PER_WRITER) as usize;
    while r.seen.len() < total {
        let seen = engine.change_seq();
        let floor = readable_before.load(Ordering::SeqCst);
        let max = rng.gen_range(1..64);
        let b = engine
            .read_changes(&ChangeScope::Cluster, pos, max)
            .expect("read");
        assert!(b.position >= pos, "the position went back");
        if b.events.len() < max {
            // Not full: it read everything readable when it started.
            assert!(
                b.position >= ChangePosition::after_time(floor),
                "a read that started after time {floor} was readable stopped at {:?}",
                b.position
            );
        }
        pos = b.position;
        for e in &b.events {
            let ChangeKind::Insert { doc, .. } = &e.kind else {
                panic!("unexpected event {:?}", e.kind);
            };
            let id = doc
                .get_i64("_id")
                .or_else(|_| doc.get_i32("_id").map(i64::from));
            r.seen.push((e.pos, e.db.to_string(), id.expect("_id")));
        }
        if !b.events.is_empty() {
            continue;
        }
        if long {
            r.long_waits += 1;
            if !engine.wait_for_changes(seen, LONG) {
                r.long_wait_timeouts += 1;
            }
        } else {
            let t = Duration::from_micros(rng.gen_range(0..3000));
            engine.wait_for_changes(seen, t);
        }
    }
    r
}

fn check(reports: &[ReaderReport]) {
    let first = &reports[0].seen;
    for (n, r) in reports.iter().enumerate() {
        assert_eq!(r.seen.len(), (2 * PER_WRITER) as usize, "reader {n}");
        assert!(
            r.seen.windows(2).all(|w| w[0].0 < w[1].0),
            "reader {n}: positions not strictly increasing"
        );
        for db in ["a", "b"] {
            let ids: Vec<i64> = r
                .seen
                .iter()
                .filter(|(_, d, _)| d == db)
                .map(|(_, _, i)| *i)
                .collect();
            let want: Vec<i64> = (0..PER_WRITER).collect();
            assert_eq!(ids, want, "reader {n}, database {db}");
        }
        assert_eq!(&r.seen, first, "reader {n} saw another sequence");
        assert_eq!(
            r.long_wait_timeouts, 0,
            "reader {n}: {} of {} long waits timed out while writes went on (a lost wake-up)",
            r.long_wait_timeouts, r.long_waits
        );
    }
}

fn run(readers: usize, seed: u64) {
    let engine = Arc::new(Engine::in_memory());
    // Both databases exist before the streams start (creation is an event).
    for db in ["a", "b"] {
        engine
            .database(db)
            .expect("db")
            .create_collection("c")
            .expect("create");
    }
    let start = engine.open_change_stream();
    let readable_before = Arc::new(AtomicU64::new(start.ts));
    let done = Arc::new(AtomicBool::new(false));
    let mut handles = Vec::new();
    for n in 0..readers {
        let (engine, readable_before) = (engine.clone(), readable_before.clone());
        handles.push(std::thread::spawn(move || {
            reader(
                &engine,
                start,
                n % 2 == 0,
                seed ^ (n as u64 + 1),
                &readable_before,
            )
        }));
    }
    // What is readable, as the writers see it after their commits: a read
    // that starts later must reach it.
    let watcher = {
        let (engine, readable_before, done) =
            (engine.clone(), readable_before.clone(), done.clone());
        std::thread::spawn(move || {
            while !done.load(Ordering::SeqCst) {
                readable_before.fetch_max(engine.stable_cluster_time(), Ordering::SeqCst);
                std::thread::yield_now();
            }
        })
    };
    let writers: Vec<_> = ["a", "b"]
        .into_iter()
        .enumerate()
        .map(|(k, db)| {
            let engine = engine.clone();
            std::thread::spawn(move || writer(&engine, db, seed.wrapping_mul(31) ^ k as u64))
        })
        .collect();
    for w in writers {
        w.join().expect("writer");
    }
    let reports: Vec<ReaderReport> = handles
        .into_iter()
        .map(|h| h.join().expect("reader"))
        .collect();
    done.store(true, Ordering::SeqCst);
    watcher.join().expect("watcher");
    check(&reports);
    // And the sequence is the one a single late reader gets.
    let mut late = Vec::new();
    let mut pos = start;
    loop {
        let b = engine
            .read_changes(&ChangeScope::Cluster, pos, 1000)
            .expect("late read");
        if b.events.is_empty() {
            break;
        }
        pos = b.position;
        late.extend(b.events.iter().map(|e| e.pos));
    }
    let first: Vec<ChangePosition> = reports[0].seen.iter().map(|s| s.0).collect();
    assert_eq!(late, first);
}

#[test]
fn readers_see_exactly_the_committed_sequence_with_one_reader() {
    run(1, 1);
}

#[test]
fn readers_see_exactly_the_committed_sequence_with_many_readers() {
    for seed in 2..5 {
        run(16, seed);
    }
}

#[test]
fn a_waiting_reader_is_woken_by_the_next_publish_after_idling() {
    // After an idle period (no round in flight), the first publish must
    // wake a reader waiting with a long deadline: its wait returns true.
    let engine = Arc::new(Engine::in_memory());
    let coll = engine.database("d").expect("db").collection("c");
    coll.insert_one(doc! {"_id": 0}).expect("insert");
    let start = engine.open_change_stream();
    for round in 1..=20 {
        let seen = engine.change_seq();
        let b = engine
            .read_changes(&ChangeScope::Cluster, start, 1000)
            .expect("read");
        assert_eq!(b.events.len(), round - 1);
        let e = engine.clone();
        let waiter = std::thread::spawn(move || e.wait_for_changes(seen, LONG));
        std::thread::sleep(Duration::from_millis(2));
        coll.insert_one(doc! {"_id": round as i64}).expect("insert");
        assert!(waiter.join().expect("waiter"), "round {round}: woken");
    }
}
