//! VLS scans: the snapshot checker against a model (zero violations for `vls`
//! and `cow`, anomalies caught for `none`), shared remset with immediate
//! reclamation, the slot queue, background resets, and drops during scans.

use std::ops::ControlFlow;
use std::sync::{Arc, Barrier};
use std::time::Duration;

use duetdb::bson::doc;
use duetdb::check::{self, CheckConfig};
use duetdb::RemsetMode;
use duetdb::VlsOptions;
use duetdb::{Database, DbOptions, IndexOptions, Strategy};

fn config(strategy: Strategy) -> CheckConfig {
    CheckConfig {
        strategy,
        scans: 4,
        writers: 2,
        docs: 1500,
        scans_per_round: 10,
        rounds: 30,
        // A cap against a hung run, not a pace: the rounds decide how much
        // is checked, and a loaded machine only takes longer.
        max_duration: Duration::from_secs(600),
        seed: 42,
        slots: 64,
        stop_on_violation: false,
        index: check::CheckIndex::Plain,
        delta_indexing: false,
    }
}

#[test]
fn checker_finds_no_violation_under_vls() {
    let report = check::run(&config(Strategy::Vls), |_| {});
    assert_eq!(report.violations, 0, "{:#?}", report.examples);
    assert!(
        report.scans_checked >= 1000,
        "only {} scans checked",
        report.scans_checked
    );
    assert!(
        report.scans_overlapping_writes > report.scans_checked / 2,
        "{report:?}"
    );
    assert!(
        report.docs_from_remset > 0,
        "no scan ever needed the remset: {report:?}"
    );
}

#[test]
fn checker_finds_no_violation_under_cow() {
    let report = check::run(
        &CheckConfig {
            rounds: 10,
            ..config(Strategy::Cow)
        },
        |_| {},
    );
    assert_eq!(report.violations, 0, "{:#?}", report.examples);
}

#[test]
fn checker_catches_the_anomalies_of_none() {
    let cfg = CheckConfig {
        rounds: 40,
        stop_on_violation: true,
        ..config(Strategy::None)
    };
    let report = check::run(&cfg, |_| {});
    assert!(
        report.violations > 0,
        "the checker missed none's anomalies: {report:?}"
    );
}

/// The 2dsphere configuration can fail too: under `none` its scans
/// (`$geoWithin` boxes through the index among them) see anomalies.
#[test]
fn checker_catches_none_with_a_geo_index() {
    let cfg = CheckConfig {
        rounds: 40,
        stop_on_violation: true,
        index: check::CheckIndex::Geo,
        ..config(Strategy::None)
    };
    let report = check::run(&cfg, |_| {});
    assert!(
        report.violations > 0,
        "the checker missed none's anomalies: {report:?}"
    );
}

#[test]
fn checker_with_128_slots_and_more_scans_than_slots() {
    let cfg = CheckConfig {
        slots: 128,
        scans: 6,
        rounds: 6,
        ..config(Strategy::Vls)
    };
    let report = check::run(&cfg, |_| {});
    assert_eq!(report.violations, 0, "{:#?}", report.examples);
}

fn db_with(n: i32, remset: RemsetMode) -> Database {
    let db = Database::with_options(
        "t",
        None,
        DbOptions {
            vls: VlsOptions {
                remset,
                ..VlsOptions::default()
            },
            default_strategy: Strategy::Vls,
            ..DbOptions::default()
        },
    );
    let c = db.collection("c");
    c.insert_many((0..n).map(|i| doc! {"_id": i, "k": i, "v": 0}), true)
        .expect("load");
    c.create_index(doc! {"k": 1}, IndexOptions::default())
        .expect("index");
    db
}

/// Two scans pause at the same point; an update of every unread record is kept
/// once in the shared remset, shared by both, and reclaimed when both have read it.
#[test]
fn shared_remset_keeps_one_version_for_several_scans_and_reclaims_immediately() {
    let db = db_with(200, RemsetMode::Shared);
    let c = db.collection("c");
    let at_half = Arc::new(Barrier::new(3));
    let resume = Arc::new(Barrier::new(3));
    let mut scans = Vec::new();
    for _ in 0..2 {
        let (c, at_half, resume) = (c.clone(), at_half.clone(), resume.clone());
        scans.push(std::thread::spawn(move || {
            let mut seen = Vec::new();
            c.scan_with(doc! {"v": {"$gte": 0}}, Strategy::Vls, |d| {
                seen.push((d.get_i32("_id").expect("id"), d.get_i32("v").expect("v")));
                if seen.len() == 100 {
                    at_half.wait();
                    resume.wait();
                }
                ControlFlow::Continue(())
            })
            .expect("scan");
            seen
        }));
    }
    at_half.wait();
    // Both scans have read records 0..100 (record order = insertion order here).
    let r = c
        .update_many(doc! {}, doc! {"$inc": {"v": 1}})
        .expect("update all");
    assert_eq!(r.modified, 200);
    let stats = db.vls_stats();
    assert_eq!(
        stats.remset.entries, 100,
        "one entry per unread record, not per scan"
    );
    assert_eq!(stats.remset.shared_inserts, 100);
    resume.wait();
    for s in scans {
        let mut seen = s.join().expect("scan thread");
        seen.sort();
        assert_eq!(
            seen,
            (0..200).map(|i| (i, 0)).collect::<Vec<_>>(),
            "start versions, each once"
        );
    }
    let stats = db.vls_stats();
    assert_eq!(
        stats.remset.entries, 0,
        "reclaimed as soon as both scans read them"
    );
    assert_eq!(stats.remset.reclaimed, 100);
    assert_eq!(stats.remset.entries_peak, 100);
}

#[test]
fn per_scan_remsets_keep_one_copy_per_scan() {
    let db = db_with(200, RemsetMode::PerScan);
    let c = db.collection("c");
    let at_half = Arc::new(Barrier::new(3));
    let resume = Arc::new(Barrier::new(3));
    let mut scans = Vec::new();
    for _ in 0..2 {
        let (c, at_half, resume) = (c.clone(), at_half.clone(), resume.clone());
        scans.push(std::thread::spawn(move || {
            let mut n = 0;
            c.scan_with(doc! {"v": {"$gte": 0}}, Strategy::Vls, |_| {
                n += 1;
                if n == 100 {
                    at_half.wait();
                    resume.wait();
                }
                ControlFlow::Continue(())
            })
            .expect("scan");
            n
        }));
    }
    at_half.wait();
    c.update_many(doc! {}, doc! {"$inc": {"v": 1}})
        .expect("update all");
    assert_eq!(
        db.vls_stats().remset.entries_peak,
        200,
        "two scans, one entry each"
    );
    resume.wait();
    for s in scans {
        assert_eq!(s.join().expect("scan"), 200);
    }
    assert_eq!(db.vls_stats().remset.entries, 0);
}

#[test]
fn index_scan_reads_its_start_range_even_when_keys_move() {
    let db = db_with(1000, RemsetMode::Shared);
    let c = db.collection("c");
    let at_start = Arc::new(Barrier::new(2));
    let resume = Arc::new(Barrier::new(2));
    let scan = {
        let (c, at_start, resume) = (c.clone(), at_start.clone(), resume.clone());
        std::thread::spawn(move || {
            let mut seen = Vec::new();
            let outcome = c
                .scan_with(doc! {"k": {"$gte": 100, "$lt": 200}}, Strategy::Vls, |d| {
                    seen.push(d.get_i32("_id").expect("id"));
                    if seen.len() == 1 {
                        at_start.wait();
                        resume.wait();
                    }
                    ControlFlow::Continue(())
                })
                .expect("scan");
            (seen, outcome)
        })
    };
    at_start.wait();
    // Move keys out of the range, into it, delete some, insert in range.
    c.update_many(
        doc! {"k": {"$gte": 150, "$lt": 200}},
        doc! {"$set": {"k": 5000}},
    )
    .expect("move out");
    c.update_many(
        doc! {"k": {"$gte": 300, "$lt": 310}},
        doc! {"$set": {"k": 120}},
    )
    .expect("move in");
    c.delete_many(doc! {"k": {"$gte": 110, "$lt": 120}})
        .expect("delete");
    c.insert_one(doc! {"_id": 5000, "k": 130, "v": 0})
        .expect("insert");
    resume.wait();
    let (mut seen, outcome) = scan.join().expect("scan thread");
    seen.sort();
    assert_eq!(seen, (100..200).collect::<Vec<_>>());
    assert_eq!(outcome.strategy, Strategy::Vls);
    assert!(
        outcome.from_remset >= 60,
        "moved and deleted records come from the remset: {outcome:?}"
    );
    // The index scan did not visit every record: its slot is reset in the background.
    assert!(duetdb::testing::wait_for(
        || db.vls_stats().scans_active == 0,
        Duration::from_secs(5)
    ));
    assert_eq!(
        db.vls_stats().remset.entries,
        0,
        "spurious entries were released too"
    );
    assert!(db.vls_stats().background_resets >= 1);
    // A later full scan with the same slot sees the current state exactly.
    let now = c
        .find(doc! {"k": {"$gte": 100, "$lt": 200}})
        .snapshot(Strategy::Vls)
        .run()
        .expect("find");
    let ids: Vec<i32> = now.iter().map(|d| d.get_i32("_id").expect("id")).collect();
    assert_eq!(ids.len(), 100 - 50 - 10 + 10 + 1);
}

#[test]
fn more_scans_than_slots_wait_in_fifo_order() {
    let db = db_with(300, RemsetMode::Shared);
    let c = db.collection("c");
    let n = 80; // more than 64 slots
    let gate = Arc::new(Barrier::new(65));
    let mut threads = Vec::new();
    for i in 0..n {
        let (c, g) = (c.clone(), gate.clone());
        threads.push(std::thread::spawn(move || {
            let mut first = true;
            c.scan_with(doc! {"v": 0}, Strategy::Vls, |_| {
                if first && i < 64 {
                    first = false;
                    g.wait(); // the first 64 hold their slots until all have one
                }
                ControlFlow::Continue(())
            })
            .expect("scan")
        }));
        if i == 63 {
            gate.wait();
        }
    }
    for t in threads {
        let outcome = t.join().expect("scan thread");
        assert_eq!(outcome.strategy, Strategy::Vls);
    }
    let stats = db.vls_stats();
    assert_eq!(stats.scans_started, n as u64);
    assert!(duetdb::testing::wait_for(
        || db.vls_stats().scans_active == 0,
        Duration::from_secs(5)
    ));
}

#[test]
fn dropping_the_collection_during_a_scan_fails_it_cleanly() {
    let db = db_with(500, RemsetMode::Shared);
    let c = db.collection("c");
    let at = Arc::new(Barrier::new(2));
    let resume = Arc::new(Barrier::new(2));
    let scan = {
        let (c, at, resume) = (c.clone(), at.clone(), resume.clone());
        std::thread::spawn(move || {
            let mut n = 0;
            c.scan_with(doc! {"v": 0}, Strategy::Vls, |_| {
                n += 1;
                if n == 10 {
                    at.wait();
                    resume.wait();
                }
                ControlFlow::Continue(())
            })
        })
    };
    at.wait();
    assert!(db.drop_collection("c").expect("drop"));
    resume.wait();
    let err = scan
        .join()
        .expect("thread")
        .expect_err("scan of a dropped collection");
    assert_eq!(err.code(), 175);
}

#[test]
fn early_stop_releases_everything() {
    let db = db_with(500, RemsetMode::Shared);
    let c = db.collection("c");
    let first = c
        .find(doc! {"v": 0})
        .limit(5)
        .snapshot(Strategy::Vls)
        .run()
        .expect("find");
    assert_eq!(first.len(), 5);
    assert!(duetdb::testing::wait_for(
        || db.vls_stats().scans_active == 0,
        Duration::from_secs(5)
    ));
    // The slot is reusable and consistent afterwards.
    assert_eq!(
        c.count_with(doc! {"v": 0}, Strategy::Vls).expect("count"),
        500
    );
}

/// Every index kind is a secondary structure of the same copy-on-write
/// state: scans through partial, sparse, hashed, wildcard and 2dsphere indexes see
/// exactly their start state under `vls` and `cow` too.
#[test]
fn checker_finds_no_violation_with_every_index_kind() {
    for index in check::CheckIndex::ALL {
        for strategy in [Strategy::Vls, Strategy::Cow] {
            let cfg = CheckConfig {
                rounds: 4,
                index,
                ..config(strategy)
            };
            let report = check::run(&cfg, |_| {});
            assert_eq!(
                report.violations, 0,
                "{index:?} under {strategy}: {:#?}",
                report.examples
            );
            assert!(report.scans_checked > 0, "{index:?}: {report:?}");
        }
    }
}
