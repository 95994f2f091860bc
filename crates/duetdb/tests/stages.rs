//! The stages that read or write other collections, end to end on a
//! database: `$lookup`/`$unionWith`/`$graphLookup` under every strategy
//! (equal to the reference evaluation over a snapshot), one snapshot per
//! pipeline while a writer changes both collections, OLCP kept for
//! commutative scan parts, `$out`/`$merge` published as one writer command,
//! transactions, held snapshots and `{aggregate: 1}` with `$documents`.

use std::sync::atomic::{AtomicBool, Ordering};

use bson::{doc, Bson, Document};
use duetdb::{Database, ReadLimits, Strategy};

const STRATEGIES: [Strategy; 5] = [
    Strategy::Auto,
    Strategy::Cow,
    Strategy::Vls,
    Strategy::Olcp,
    Strategy::None,
];

fn shop() -> Database {
    let db = Database::in_memory();
    let customers = db.collection("customers");
    customers
        .insert_many(
            (0..50).map(|i| doc! {"_id": i, "name": format!("c{i}"), "tier": i % 3}),
            true,
        )
        .expect("customers");
    let orders = db.collection("orders");
    orders
        .insert_many(
            (0..400).map(|i| {
                doc! {"_id": i, "cust": i % 60, "amount": (i * 7) % 100, "day": i % 30}
            }),
            true,
        )
        .expect("orders");
    orders
        .create_index(doc! {"cust": 1}, Default::default())
        .expect("index");
    db
}

/// A report: orders joined with their customer, grouped by tier.
fn report() -> Vec<Document> {
    vec![
        doc! {"$match": {"amount": {"$gte": 10}}},
        doc! {"$lookup": {"from": "customers", "localField": "cust", "foreignField": "_id", "as": "c"}},
        doc! {"$unwind": "$c"},
        doc! {"$group": {"_id": "$c.tier", "revenue": {"$sum": "$amount"}, "orders": {"$sum": 1}}},
        doc! {"$sort": {"_id": 1}},
    ]
}

#[test]
fn lookup_report_is_the_same_under_every_strategy() {
    let db = shop();
    let want = db
        .snapshot()
        .collection("orders")
        .aggregate(report())
        .expect("reference");
    assert_eq!(want.len(), 3);
    for s in STRATEGIES {
        let (got, explain) = db
            .collection("orders")
            .aggregate_with(report(), s)
            .expect("aggregate");
        assert_eq!(got, want, "{s:?}");
        // The other collection was read at the outer scan's csn.
        assert_eq!(explain.foreign_csn, Some(explain.start_csn), "{s:?}");
    }
    // The scan part (a $match, a $lookup, an $unwind, a mergeable $group) is
    // commutative: auto runs it as multi-threaded OLCP.
    let (_, explain) = db
        .collection("orders")
        .aggregate_with(report(), Strategy::Auto)
        .expect("auto");
    assert!(explain.olcp_eligible);
    assert_eq!(explain.strategy, Strategy::Olcp);
    assert_eq!(
        explain.commutative_stages,
        vec!["$lookup", "$unwind", "$group"]
    );
}

#[test]
fn facet_and_union_after_a_commutative_part_keep_olcp() {
    let db = shop();
    let pipeline = vec![
        doc! {"$lookup": {"from": "customers", "localField": "cust", "foreignField": "_id", "as": "c"}},
        doc! {"$group": {"_id": "$day", "n": {"$sum": 1}, "known": {"$sum": {"$size": "$c"}}}},
        doc! {"$unionWith": {"coll": "customers", "pipeline": [{"$project": {"_id": {"$add": [1000, "$_id"]}, "n": {"$literal": 0}}}]}},
        doc! {"$facet": {
            "days": [{"$match": {"_id": {"$lt": 1000}}}, {"$sort": {"_id": 1}}],
            "total": [{"$group": {"_id": null, "n": {"$sum": "$n"}, "known": {"$sum": "$known"}}}],
            "rows": [{"$count": "rows"}],
        }},
    ];
    let want = db
        .snapshot()
        .collection("orders")
        .aggregate(pipeline.clone())
        .expect("reference");
    let f = &want[0];
    assert_eq!(f.get_array("days").expect("days").len(), 30);
    assert_eq!(
        f.get_array("total").expect("total")[0]
            .as_document()
            .expect("doc")
            .get_i32("n")
            .expect("n"),
        400
    );
    // Orders of customers 50..59 (6 each) find no customer.
    assert_eq!(
        f.get_array("total").expect("total")[0]
            .as_document()
            .expect("doc")
            .get_i32("known")
            .expect("known"),
        400 - 10 * 6
    );
    assert_eq!(
        f.get_array("rows").expect("rows"),
        &vec![Bson::Document(doc! {"rows": 80})]
    );
    for s in STRATEGIES {
        let (got, explain) = db
            .collection("orders")
            .aggregate_with(pipeline.clone(), s)
            .expect("aggregate");
        assert_eq!(got, want, "{s:?}");
        assert_eq!(explain.foreign_csn, Some(explain.start_csn));
    }
    let (_, explain) = db
        .collection("orders")
        .aggregate_with(pipeline, Strategy::Auto)
        .expect("auto");
    assert_eq!(explain.strategy, Strategy::Olcp);
    assert_eq!(explain.rest_stages, vec!["$unionWith", "$facet"]);
}

#[test]
fn a_limit_in_a_facet_makes_the_pipeline_ordered() {
    let db = shop();
    let (_, explain) = db
        .collection("orders")
        .aggregate_with(
            vec![doc! {"$facet": {"first": [{"$limit": 3}]}}],
            Strategy::Auto,
        )
        .expect("auto");
    assert!(!explain.olcp_eligible);
    assert_ne!(explain.strategy, Strategy::Olcp);
}

/// Accounts `a` and their mirror `m` are updated together by transactions:
/// at every commit `a.v == m.v` for every `_id`. A `$lookup` of `m` from
/// `a` must see pairs that agree, under every consistent strategy, while
/// the transactions run (the other collection at the outer scan's csn).
#[test]
fn lookup_reads_one_snapshot_while_both_collections_change() {
    let db = Database::in_memory();
    let (a, m) = (db.collection("a"), db.collection("m"));
    let n = 400;
    a.insert_many((0..n).map(|i| doc! {"_id": i, "v": 0}), true)
        .expect("a");
    m.insert_many((0..n).map(|i| doc! {"_id": i, "v": 0}), true)
        .expect("m");
    let stop = AtomicBool::new(false);
    let pipeline = vec![
        doc! {"$lookup": {"from": "m", "localField": "_id", "foreignField": "_id", "as": "mirror"}},
        doc! {"$project": {"v": 1, "mv": {"$first": "$mirror.v"}}},
        doc! {"$match": {"$expr": {"$ne": ["$v", "$mv"]}}},
    ];
    std::thread::scope(|s| {
        let writer = s.spawn(|| {
            let mut i = 0i32;
            while !stop.load(Ordering::Relaxed) || i < 300 {
                let id = (i * 37) % n;
                db.transaction(|tx| {
                    tx.update_one("a", doc! {"_id": id}, doc! {"$inc": {"v": 1}})?;
                    tx.update_one("m", doc! {"_id": id}, doc! {"$inc": {"v": 1}})?;
                    Ok(())
                })
                .expect("transfer");
                i += 1;
            }
            i
        });
        for round in 0..12 {
            for s in [Strategy::Cow, Strategy::Vls, Strategy::Olcp] {
                let (bad, explain) = a.aggregate_with(pipeline.clone(), s).expect("lookup");
                assert!(
                    bad.is_empty(),
                    "round {round} {s:?}: pairs read at different commits: {bad:?}"
                );
                assert_eq!(explain.foreign_csn, Some(explain.start_csn));
            }
        }
        stop.store(true, Ordering::Relaxed);
        assert!(writer.join().expect("writer") >= 300);
    });
}

#[test]
fn out_replaces_the_target_in_one_command() {
    let db = shop();
    let target = db.collection("summary");
    target
        .insert_many(
            (0..100).map(|i| doc! {"_id": format!("old{i}"), "gen": "old"}),
            true,
        )
        .expect("old contents");
    target
        .create_index(doc! {"gen": 1}, Default::default())
        .expect("index");
    let stop = AtomicBool::new(false);
    std::thread::scope(|s| {
        let reader = s.spawn(|| {
            let mut seen = 0;
            while !stop.load(Ordering::Relaxed) {
                let snap = db.snapshot();
                let c = snap.collection("summary");
                let old = c.count(doc! {"gen": "old"}).expect("count");
                let new = c.count(doc! {"gen": "new"}).expect("count");
                assert!(
                    (old == 100 && new == 0) || (old == 0 && new == 60),
                    "a reader saw half of $out: {old} old, {new} new"
                );
                seen += 1;
            }
            seen
        });
        let (out, _) = db
            .collection("orders")
            .aggregate_with(
                vec![
                    doc! {"$group": {"_id": "$cust", "n": {"$sum": 1}}},
                    doc! {"$set": {"gen": "new"}},
                    doc! {"$out": "summary"},
                ],
                Strategy::Auto,
            )
            .expect("$out");
        assert!(out.is_empty());
        stop.store(true, Ordering::Relaxed);
        assert!(reader.join().expect("reader") > 0);
    });
    assert_eq!(target.count(doc! {}).expect("count"), 60);
    // The target's indexes stay.
    let names: Vec<String> = target
        .list_indexes()
        .expect("indexes")
        .iter()
        .map(|d| d.get_str("name").expect("name").to_string())
        .collect();
    assert!(names.contains(&"gen_1".to_string()), "{names:?}");
    // Duplicate `_id`s in the output change nothing (11000).
    let e = db
        .collection("orders")
        .aggregate(vec![
            doc! {"$project": {"_id": {"$mod": ["$_id", 2]}}},
            doc! {"$out": "summary"},
        ])
        .expect_err("duplicate _id");
    assert_eq!(e.code(), 11000);
    assert_eq!(target.count(doc! {}).expect("count"), 60);
    // An empty output creates an empty target.
    db.collection("orders")
        .aggregate(vec![doc! {"$match": {"_id": -1}}, doc! {"$out": "empty"}])
        .expect("empty $out");
    assert!(db.list_collection_names().contains(&"empty".to_string()));
    assert_eq!(
        db.collection("orders")
            .aggregate(vec![doc! {"$out": {"db": "other", "coll": "x"}}])
            .expect_err("other db")
            .code(),
        115
    );
    // Given the other database, the output lands there, in one command.
    let other = Database::named("other", None);
    db.collection("orders")
        .aggregate_into(
            vec![
                doc! {"$match": {"_id": {"$lt": 5}}},
                doc! {"$out": {"db": "other", "coll": "x"}},
            ],
            Strategy::Cow,
            &ReadLimits::default(),
            None,
            Some(&other),
        )
        .expect("$out into other");
    assert_eq!(other.collection("x").count(doc! {}).expect("count"), 5);
    assert!(!db.list_collection_names().contains(&"x".to_string()));
}

#[test]
fn merge_modes_on_a_live_target() {
    let db = Database::in_memory();
    let src = db.collection("src");
    src.insert_many(
        vec![
            doc! {"_id": 1, "k": "a", "v": 10},
            doc! {"_id": 2, "k": "b", "v": 20},
            doc! {"_id": 3, "k": "c", "v": 30},
        ],
        true,
    )
    .expect("src");
    let t = db.collection("t");
    t.insert_many(
        vec![
            doc! {"_id": 1, "k": "a", "v": 1, "keep": true},
            doc! {"_id": 9, "k": "z"},
        ],
        true,
    )
    .expect("t");
    let run = |stage: Document| src.aggregate(vec![stage]);
    run(doc! {"$merge": {"into": "t"}}).expect("merge");
    assert_eq!(
        t.find_one(doc! {"_id": 1}).expect("find"),
        Some(doc! {"_id": 1, "k": "a", "v": 10, "keep": true})
    );
    assert_eq!(t.count(doc! {}).expect("count"), 4);
    run(doc! {"$merge": {"into": "t", "whenMatched": "replace"}}).expect("replace");
    assert_eq!(
        t.find_one(doc! {"_id": 1}).expect("find"),
        Some(doc! {"_id": 1, "k": "a", "v": 10})
    );
    run(doc! {"$merge": {"into": "t", "whenMatched": [{"$set": {"v": {"$add": ["$v", "$$new.v"]}}}]}})
        .expect("pipeline");
    assert_eq!(
        t.find_one(doc! {"_id": 2}).expect("find"),
        Some(doc! {"_id": 2, "k": "b", "v": 40})
    );
    // `fail` changes nothing, whatever else the output holds.
    let before = t.find(doc! {}).run().expect("all");
    let e = run(doc! {"$merge": {"into": "t", "whenMatched": "fail"}}).expect_err("fail");
    assert_eq!(e.code(), 11000);
    assert_eq!(t.find(doc! {}).run().expect("all"), before);
    // `on` other than `_id` needs a unique index on it.
    assert_eq!(
        run(doc! {"$merge": {"into": "t", "on": "k"}})
            .expect_err("no index")
            .code(),
        51183
    );
    t.create_index(
        doc! {"k": 1},
        duetdb::IndexOptions {
            unique: true,
            ..Default::default()
        },
    )
    .expect("unique");
    src.insert_one(doc! {"_id": 4, "k": "z", "v": 99})
        .expect("z");
    // Source `_id` 4 matches target `_id` 9 by `k`: its `_id` may not change.
    assert_eq!(
        src.aggregate(vec![
            doc! {"$match": {"k": "z"}},
            doc! {"$merge": {"into": "t", "on": "k"}}
        ])
        .expect_err("_id changes")
        .code(),
        66
    );
    src.aggregate(vec![
        doc! {"$match": {"k": "z"}},
        doc! {"$project": {"_id": 0}},
        doc! {"$merge": {"into": "t", "on": "k", "whenNotMatched": "fail"}},
    ])
    .expect("matched by k");
    assert_eq!(
        t.find_one(doc! {"_id": 9}).expect("find"),
        Some(doc! {"_id": 9, "k": "z", "v": 99})
    );
    // A new target is created; outputs without `_id` get one.
    src.aggregate(vec![
        doc! {"$project": {"_id": 0, "k": 1}},
        doc! {"$merge": {"into": "fresh", "whenNotMatched": "insert"}},
    ])
    .expect("fresh");
    assert_eq!(db.collection("fresh").count(doc! {}).expect("count"), 4);
    assert_eq!(
        src.aggregate(vec![
            doc! {"$merge": {"into": "nomatch", "whenNotMatched": "fail"}}
        ])
        .expect_err("no match")
        .code(),
        13113
    );
}

#[test]
fn transactions_lookup_their_own_writes_and_refuse_out() {
    let db = shop();
    let mut tx = db.begin(Default::default());
    tx.insert_one("customers", doc! {"_id": 55, "name": "new", "tier": 9})
        .expect("insert");
    let out = tx
        .collection("orders")
        .aggregate_let(
            vec![
                doc! {"$match": {"cust": 55}},
                doc! {"$lookup": {"from": "customers", "localField": "cust", "foreignField": "_id", "as": "c"}},
                doc! {"$match": {"c.tier": 9}},
                doc! {"$count": "n"},
            ],
            None,
        )
        .expect("lookup in a transaction");
    // Customer 55 has orders 55, 115, ... 355: six of them.
    assert_eq!(out, vec![doc! {"n": 6}]);
    let e = tx
        .collection("orders")
        .aggregate_let(vec![doc! {"$out": "x"}], None)
        .expect_err("no $out in a transaction");
    assert_eq!(e.code(), 263);
}

#[test]
fn held_snapshots_and_database_aggregates() {
    let db = shop();
    let snap = db.snapshot();
    db.collection("customers")
        .update_many(doc! {}, doc! {"$set": {"tier": 7}})
        .expect("later update");
    let tiers = snap
        .collection("orders")
        .aggregate(vec![
            doc! {"$lookup": {"from": "customers", "localField": "cust", "foreignField": "_id", "as": "c"}},
            doc! {"$unwind": "$c"},
            doc! {"$group": {"_id": "$c.tier"}},
            doc! {"$sort": {"_id": 1}},
        ])
        .expect("snapshot");
    // The snapshot's customers, not the later ones.
    assert_eq!(tiers.len(), 3);
    assert_eq!(
        snap.collection("orders")
            .aggregate(vec![doc! {"$out": "x"}])
            .expect_err("a snapshot cannot write")
            .code(),
        20
    );
    let out = db
        .aggregate(
            vec![
                doc! {"$documents": [{"cust": 1}, {"cust": 2}]},
                doc! {"$lookup": {"from": "customers", "localField": "cust", "foreignField": "_id", "as": "c"}},
                doc! {"$project": {"_id": 0, "cust": 1, "tier": {"$first": "$c.tier"}, "x": "$$x"}},
            ],
            &ReadLimits::default(),
            Some(&doc! {"x": "let"}),
        )
        .expect("documents");
    assert_eq!(
        out,
        vec![
            doc! {"cust": 1, "tier": 7, "x": "let"},
            doc! {"cust": 2, "tier": 7, "x": "let"}
        ]
    );
    assert_eq!(
        db.aggregate(vec![doc! {"$match": {}}], &ReadLimits::default(), None)
            .expect_err("needs a collection")
            .code(),
        73
    );
    // `$documents` then `$out`, from a collection or the database: written.
    db.collection("orders")
        .aggregate(vec![
            doc! {"$documents": [{"_id": 1}, {"_id": 2}]},
            doc! {"$out": "from_documents"},
        ])
        .expect("$documents + $out");
    db.aggregate(
        vec![
            doc! {"$documents": [{"_id": 3}]},
            doc! {"$merge": {"into": "from_documents"}},
        ],
        &ReadLimits::default(),
        None,
    )
    .expect("$documents + $merge");
    assert_eq!(
        db.collection("from_documents")
            .count(doc! {})
            .expect("count"),
        3
    );
}

#[test]
fn command_let_reaches_every_stage() {
    let db = shop();
    let vars = doc! {"min": 90, "label": "big"};
    let (out, _) = db
        .collection("orders")
        .aggregate_let(
            vec![
                doc! {"$match": {"$expr": {"$gte": ["$amount", "$$min"]}}},
                doc! {"$lookup": {"from": "customers", "let": {"c": "$cust"}, "pipeline": [
                    {"$match": {"$expr": {"$and": [{"$eq": ["$_id", "$$c"]}, {"$gte": [100, "$$min"]}]}}}
                ], "as": "cust"}},
                doc! {"$group": {"_id": "$$label", "n": {"$sum": 1}, "found": {"$sum": {"$size": "$cust"}}}},
            ],
            Strategy::Auto,
            &ReadLimits::default(),
            Some(&vars),
        )
        .expect("let");
    let want = db
        .collection("orders")
        .count(doc! {"amount": {"$gte": 90}})
        .expect("count");
    assert_eq!(out.len(), 1);
    assert_eq!(out[0].get_str("_id").expect("label"), "big");
    assert_eq!(out[0].get_i32("n").expect("n") as u64, want);
}
