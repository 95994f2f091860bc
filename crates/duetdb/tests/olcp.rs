//! OLCP: exactly-once one-pass analytics with propagation. The snapshot checker
//! under `olcp`; propagated versions are dropped as soon as they are mapped
//! (unlike VLS, which keeps them until its remset pass); `olcp_query` with
//! several threads, overlapping ranges and point ranges.

use std::ops::ControlFlow;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Barrier};
use std::time::Duration;

use duetdb::bson::doc;
use duetdb::check::{self, CheckConfig};
use duetdb::{Database, DbOptions, IndexOptions, OlcpOptions, PointRange, Strategy};

#[test]
fn checker_finds_no_violation_under_olcp() {
    let cfg = CheckConfig {
        strategy: Strategy::Olcp,
        scans: 4,
        writers: 2,
        docs: 1500,
        scans_per_round: 10,
        rounds: 25,
        // A cap against a hung run, not a pace: the rounds decide how much
        // is checked, and a loaded machine only takes longer.
        max_duration: Duration::from_secs(600),
        seed: 7,
        slots: 64,
        stop_on_violation: false,
        index: check::CheckIndex::Plain,
        delta_indexing: false,
    };
    let report = check::run(&cfg, |_| {});
    assert_eq!(report.violations, 0, "{:#?}", report.examples);
    assert!(report.scans_checked >= 1000, "{report:?}");
}

fn loaded(n: i32) -> Database {
    let db = Database::with_options("o", None, DbOptions::default());
    let c = db.collection("c");
    c.insert_many(
        (0..n).map(|i| doc! {"_id": i, "k": i % 100, "bal": 100i64}),
        true,
    )
    .expect("load");
    c.create_index(doc! {"k": 1}, IndexOptions::default())
        .expect("index");
    db
}

/// Pause a scan early, update 1000 records it has not read yet, let it go on a
/// page and pause again: OLCP has mapped and dropped those versions, VLS still
/// holds them in its remset until the end of its table pass.
#[test]
fn propagated_versions_are_dropped_once_mapped_while_vls_keeps_them() {
    for strategy in [Strategy::Olcp, Strategy::Vls] {
        let db = loaded(20_000);
        let c = db.collection("c");
        let (p1, r1, p2, r2) = (
            Arc::new(Barrier::new(2)),
            Arc::new(Barrier::new(2)),
            Arc::new(Barrier::new(2)),
            Arc::new(Barrier::new(2)),
        );
        let scan = {
            let (c, p1, r1, p2, r2) = (c.clone(), p1.clone(), r1.clone(), p2.clone(), r2.clone());
            std::thread::spawn(move || {
                let mut n = 0u64;
                let mut sum = 0i64;
                let outcome = c
                    .scan_with(doc! {"bal": {"$gte": 0}}, strategy, |d| {
                        n += 1;
                        sum += d.get_i64("bal").expect("bal");
                        if n == 10 {
                            p1.wait();
                            r1.wait();
                        }
                        if n == 5000 {
                            p2.wait();
                            r2.wait();
                        }
                        ControlFlow::Continue(())
                    })
                    .expect("scan");
                (n, sum, outcome)
            })
        };
        p1.wait();
        c.update_many(
            doc! {"_id": {"$gte": 10_000, "$lt": 11_000}},
            doc! {"$inc": {"bal": 1i64}},
        )
        .expect("update ahead of the scan");
        let held_after_update = db.vls_stats();
        r1.wait();
        p2.wait();
        let held_later = db.vls_stats();
        r2.wait();
        let (n, sum, outcome) = scan.join().expect("scan thread");
        assert_eq!(n, 20_000, "{strategy}: every start document exactly once");
        assert_eq!(sum, 20_000 * 100, "{strategy}: start versions only");
        match strategy {
            Strategy::Olcp => {
                assert_eq!(held_after_update.olcp_inflight, 1000, "handed over at once");
                assert_eq!(held_after_update.remset.entries, 0);
                assert_eq!(
                    held_later.olcp_inflight, 0,
                    "mapped and dropped at the next page"
                );
                assert_eq!(outcome.propagated, 1000);
                assert_eq!(outcome.strategy, Strategy::Olcp);
            }
            _ => {
                assert_eq!(held_after_update.remset.entries, 1000);
                assert_eq!(
                    held_later.remset.entries, 1000,
                    "VLS keeps them until its remset pass"
                );
                assert_eq!(outcome.from_remset, 1000);
            }
        }
        assert_eq!(db.vls_stats().remset.entries, 0);
        assert_eq!(db.vls_stats().olcp_inflight, 0);
    }
}

#[test]
fn olcp_query_sums_exactly_under_concurrent_transfers_on_several_threads() {
    let n = 20_000;
    let db = loaded(n);
    let c = db.collection("c");
    let stop = Arc::new(AtomicBool::new(false));
    let writer = {
        let (c, stop) = (c.clone(), stop.clone());
        std::thread::spawn(move || {
            let mut i: i32 = 0;
            let mut moves = 0;
            while !stop.load(Ordering::Relaxed) {
                let (a, b) = (
                    i.wrapping_mul(7919).rem_euclid(n),
                    i.wrapping_mul(104_729).rem_euclid(n),
                );
                if a != b {
                    // A transfer in one command: both documents change at one csn.
                    let r = c
                        .update_many(
                            doc! {"_id": {"$in": [a, b]}},
                            doc! {"$inc": {"bal": 0i64, "touched": 1}},
                        )
                        .expect("transfer");
                    assert_eq!(r.matched, 2);
                    c.insert_one(doc! {"_id": n + i, "k": 1, "bal": 5i64})
                        .expect("insert after the start");
                    moves += 1;
                }
                i += 1;
            }
            moves
        })
    };
    std::thread::sleep(Duration::from_millis(20));
    let mut last = None;
    for threads in [1, 2, 4] {
        let (state, report) = db
            .olcp_query(
                "c",
                &[],
                &[],
                || (0i64, 0u64, 0i64),
                |s, d, _| {
                    s.0 += d
                        .get_i64("bal")
                        .map_err(|e| duetdb::Error::BadValue(e.to_string()))?;
                    s.1 += 1;
                    s.2 += i64::from(d.get_i32("touched").unwrap_or(0));
                    Ok(())
                },
                |a, b| (a.0 + b.0, a.1 + b.1, a.2 + b.2),
                OlcpOptions { threads },
            )
            .expect("olcp");
        // Each document of the start snapshot once: inserts after the start unseen.
        let snap_count = report.from_table + report.propagated_mapped;
        assert_eq!(state.1, snap_count);
        assert!(state.1 >= n as u64);
        assert_eq!(
            state.0,
            (state.1 as i64 - n as i64) * 5 + i64::from(n) * 100,
            "start versions only"
        );
        assert_eq!(state.2 % 2, 0, "a two-document update seen half");
        last = Some(report);
    }
    stop.store(true, Ordering::Relaxed);
    let moves = writer.join().expect("writer");
    assert!(moves > 0);
    assert!(last.expect("ran").threads == 4);
    assert_eq!(db.vls_stats().olcp_inflight, 0);
}

#[test]
fn overlapping_ranges_map_each_document_once_and_point_ranges_read_the_start() {
    let db = loaded(1000);
    let c = db.collection("c");
    db.collection("part")
        .insert_many((0..100).map(|k| doc! {"_id": k, "size": k * 2}), true)
        .expect("parts");
    let (ids, report) = db
        .olcp_query(
            "c",
            &[
                doc! {"_id": {"$gte": 100, "$lt": 300}},
                doc! {"_id": {"$gte": 200, "$lt": 400}},
            ],
            &[PointRange {
                coll: "part".into(),
                filter: doc! {"_id": {"$lt": 50}},
            }],
            Vec::new,
            |v, d, points| {
                let k = d
                    .get_i32("k")
                    .map_err(|e| duetdb::Error::BadValue(e.to_string()))?;
                let parts = points.find("part", &doc! {"_id": k})?;
                // Only parts 0..50 are in the declared point range.
                assert_eq!(parts.len(), usize::from(k < 50));
                v.push(
                    d.get_i32("_id")
                        .map_err(|e| duetdb::Error::BadValue(e.to_string()))?,
                );
                Ok(())
            },
            |mut a, b| {
                a.extend(b);
                a
            },
            OlcpOptions { threads: 2 },
        )
        .expect("olcp");
    let mut ids = ids;
    ids.sort();
    assert_eq!(ids, (100..400).collect::<Vec<_>>());
    assert_eq!(report.from_table, 300);
    assert!(db
        .olcp_query(
            "c",
            &[],
            &[],
            || 0,
            |_, _, p| p.find("nope", &doc! {}).map(|_| ()),
            |a, _| a,
            OlcpOptions::default()
        )
        .is_err());
    let _ = c;
}

#[test]
fn commutative_pipelines_run_as_olcp_and_agree_with_vls_and_cow() {
    let db = loaded(5000);
    let c = db.collection("c");
    let pipeline = vec![
        doc! {"$match": {"k": {"$lt": 50}}},
        doc! {"$group": {"_id": "$k", "n": {"$sum": 1}, "total": {"$sum": "$bal"}}},
        doc! {"$sort": {"_id": 1}},
    ];
    let (olcp, explain) = c
        .aggregate_with(pipeline.clone(), Strategy::Auto)
        .expect("auto");
    assert_eq!(
        explain.strategy,
        Strategy::Olcp,
        "eligible pipelines run as OLCP by default"
    );
    assert!(explain.olcp_eligible);
    let (vls, e2) = c
        .aggregate_with(pipeline.clone(), Strategy::Vls)
        .expect("vls");
    assert_eq!(e2.strategy, Strategy::Vls);
    let (cow, _) = c
        .aggregate_with(pipeline.clone(), Strategy::Cow)
        .expect("cow");
    assert_eq!(olcp, vls);
    assert_eq!(olcp, cow);
    assert_eq!(olcp.len(), 50);
    // An order-dependent pipeline forced to olcp falls back to vls.
    let first = vec![doc! {"$group": {"_id": null, "f": {"$first": "$_id"}}}];
    let (_, e3) = c.aggregate_with(first, Strategy::Olcp).expect("fallback");
    assert_eq!(e3.strategy, Strategy::Vls);
}
