//! Every read runs under the strategy it asked for: find (`raw`, `run`,
//! `run_detailed`), count, distinct and aggregate, each under none, vls, cow
//! and olcp. Three independent witnesses must agree: the outcome the call
//! reports, `Database::read_stats` (counted after the strategy was chosen),
//! and the VLS slot registrations (`vls_stats().scans_started`), which only
//! `vls` and `olcp` scans make. A read that silently ran another strategy
//! (as `Find::raw` once did, always `cow`) fails here.

use duetdb::bson::{doc, Document};
use duetdb::{Database, IndexOptions, ReadStats, Strategy};

const EXPLICIT: [Strategy; 4] = [Strategy::None, Strategy::Vls, Strategy::Cow, Strategy::Olcp];

fn seeded() -> Database {
    let db = Database::in_memory();
    let c = db.collection("c");
    c.insert_many(
        (0..200i64).map(|i| doc! {"_id": i, "k": i % 7, "v": i}),
        true,
    )
    .expect("seed");
    c.create_index(doc! {"k": 1}, IndexOptions::default())
        .expect("index");
    db
}

fn count_of(s: ReadStats, strategy: Strategy) -> u64 {
    match strategy {
        Strategy::None => s.none,
        Strategy::Vls => s.vls,
        Strategy::Cow => s.cow,
        Strategy::Olcp => s.olcp,
        Strategy::Auto => unreachable!("auto is never a strategy that ran"),
    }
}

/// Run `read`, then check that exactly one read ran, under `expected`, and
/// that a VLS slot was registered exactly when the strategy needs one.
fn assert_ran(db: &Database, expected: Strategy, what: &str, read: impl FnOnce() -> Strategy) {
    let before = db.read_stats();
    let slots_before = db.vls_stats().scans_started;
    let reported = read();
    let after = db.read_stats();
    let slots = db.vls_stats().scans_started - slots_before;
    assert_eq!(reported, expected, "{what}: reported strategy");
    let moved: Vec<Strategy> = EXPLICIT
        .into_iter()
        .filter(|s| count_of(after, *s) != count_of(before, *s))
        .collect();
    assert_eq!(
        moved,
        vec![expected],
        "{what}: read_stats moved for {moved:?}"
    );
    assert_eq!(
        count_of(after, expected) - count_of(before, expected),
        1,
        "{what}"
    );
    let needs_slot = matches!(expected, Strategy::Vls | Strategy::Olcp);
    assert_eq!(slots > 0, needs_slot, "{what}: {slots} VLS registrations");
}

#[test]
fn find_count_distinct_and_aggregate_run_the_requested_strategy() {
    let db = seeded();
    let c = db.collection("c");
    let filter = || doc! {"v": {"$gte": 10}};
    for s in EXPLICIT {
        assert_ran(&db, s, &format!("find.raw {s}"), || {
            let docs = c.find(filter()).snapshot(s).raw().expect("raw");
            assert_eq!(docs.len(), 190);
            s // `raw` reports nothing itself: read_stats and slots decide
        });
        assert_ran(&db, s, &format!("find.run_detailed {s}"), || {
            let out = c.find(filter()).snapshot(s).run_detailed().expect("find");
            assert_eq!(out.docs.len(), 190);
            out.scan.strategy
        });
        assert_ran(&db, s, &format!("count {s}"), || {
            let (n, out) = c.count_detailed(filter(), s).expect("count");
            assert_eq!(n, 190);
            out.strategy
        });
        // Counting everything is answered from a root under cow only.
        assert_ran(&db, s, &format!("count all {s}"), || {
            let (n, out) = c.count_detailed(Document::new(), s).expect("count");
            assert_eq!(n, 200);
            out.strategy
        });
        assert_ran(&db, s, &format!("distinct {s}"), || {
            let (vals, out) = c.distinct_with("k", filter(), s).expect("distinct");
            assert_eq!(vals.len(), 7);
            out.strategy
        });
        let group = vec![
            doc! {"$match": {"v": {"$gte": 10}}},
            doc! {"$group": {"_id": null, "n": {"$sum": 1}}},
        ];
        assert_ran(&db, s, &format!("aggregate {s}"), || {
            let (docs, explain) = c.aggregate_with(group.clone(), s).expect("aggregate");
            assert_eq!(docs[0].get_i32("n").expect("n"), 190);
            explain.strategy
        });
    }
}

#[test]
fn olcp_on_an_order_dependent_pipeline_runs_vls_and_says_why() {
    let db = seeded();
    let c = db.collection("c");
    let ordered = vec![doc! {"$sort": {"v": -1}}, doc! {"$limit": 3}];
    assert_ran(&db, Strategy::Vls, "aggregate sort+limit olcp", || {
        let (docs, explain) = c
            .aggregate_with(ordered.clone(), Strategy::Olcp)
            .expect("aggregate");
        assert_eq!(docs.len(), 3);
        assert!(
            explain.reason.contains("arrival order"),
            "{}",
            explain.reason
        );
        explain.strategy
    });
}

#[test]
fn auto_picks_by_read_and_plan_and_explain_says_so() {
    let db = seeded();
    let c = db.collection("c");
    let auto = Strategy::Auto;
    assert_ran(&db, Strategy::Cow, "point lookup", || {
        c.find(doc! {"_id": 5})
            .snapshot(auto)
            .run_detailed()
            .expect("find")
            .scan
            .strategy
    });
    assert_ran(&db, Strategy::Vls, "range scan", || {
        c.find(doc! {"v": {"$gt": 3}})
            .snapshot(auto)
            .run_detailed()
            .expect("find")
            .scan
            .strategy
    });
    assert_ran(&db, Strategy::Cow, "top-k in index order", || {
        c.find(doc! {"k": {"$gte": 0}})
            .sort(doc! {"k": 1})
            .limit(3)
            .snapshot(auto)
            .run_detailed()
            .expect("find")
            .scan
            .strategy
    });
    assert_ran(&db, Strategy::Olcp, "commutative aggregate", || {
        c.aggregate_with(vec![doc! {"$group": {"_id": "$k", "n": {"$sum": 1}}}], auto)
            .expect("aggregate")
            .1
            .strategy
    });
    let e = c.find(doc! {"_id": 5}).explain().expect("explain");
    assert_eq!(e.get_str("strategy").expect("strategy"), "cow");
    assert!(e
        .get_str("strategyReason")
        .expect("reason")
        .contains("point"));
    let e = c
        .find(doc! {"v": 1})
        .snapshot(Strategy::None)
        .explain()
        .expect("explain");
    assert_eq!(e.get_str("strategy").expect("strategy"), "none");
    assert_eq!(e.get_str("strategyReason").expect("reason"), "requested");
}
