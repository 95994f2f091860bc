//! The expression language and the new accumulators on a collection, under
//! every snapshot strategy: `$expr` in find/count/update/delete (an `$expr`
//! error fails the read with MongoDB's code whatever the strategy), the
//! accumulators `$stdDevPop $stdDevSamp $top $bottom $topN $bottomN $maxN
//! $minN $median $percentile` (commutative: they may run as OLCP) and
//! `$firstN $lastN $mergeObjects` (order-dependent: the planner falls back to
//! one ordered scan), checked against the in-memory reference evaluation.

use bson::{doc, Bson, Document};
use duetdb::lang::{canonical_cmp, Pipeline};
use duetdb::{Database, Strategy};

const STRATEGIES: [Strategy; 5] = [
    Strategy::Vls,
    Strategy::Cow,
    Strategy::None,
    Strategy::Olcp,
    Strategy::Auto,
];

fn docs() -> Vec<Document> {
    (0..50)
        .map(|i: i32| {
            let g = ["a", "b", "c"][(i % 3) as usize];
            let mut d = doc! {
                "_id": i,
                "g": g,
                "v": i % 7,
                "w": f64::from(i) / 4.0,
                "budget": 10,
                "spent": i % 20,
                "meta": {format!("k{}", i % 4): i},
            };
            if i % 9 == 0 {
                d.remove("v");
            }
            d
        })
        .collect()
}

fn loaded() -> (Database, duetdb::Collection) {
    let db = Database::in_memory();
    let c = db.collection("t");
    c.insert_many(docs(), true).expect("insert");
    (db, c)
}

fn normalize(mut docs: Vec<Document>) -> Vec<Document> {
    docs.sort_by(|a, b| canonical_cmp(&Bson::Document(a.clone()), &Bson::Document(b.clone())));
    docs
}

#[test]
fn expr_in_find_count_update_delete_under_every_strategy() {
    let (_db, c) = loaded();
    let filter = doc! {"$expr": {"$gt": ["$spent", "$budget"]}};
    let want: Vec<i32> = (0..50).filter(|i| i % 20 > 10).collect();
    for s in STRATEGIES {
        let got: Vec<i32> = c
            .find(filter.clone())
            .snapshot(s)
            .run()
            .expect("find")
            .iter()
            .map(|d| d.get_i32("_id").expect("id"))
            .collect();
        assert_eq!(got, want, "under {s}");
        // A type error in one document fails the whole read, as in MongoDB.
        let bad = doc! {"$expr": {"$gt": [{"$add": ["$g", 1]}, 0]}};
        let e = c.find(bad).snapshot(s).run().expect_err("type error");
        assert_eq!(e.code(), 14, "under {s}");
    }
    assert_eq!(c.count(filter.clone()).expect("count"), want.len() as u64);
    let r = c
        .update_many(filter.clone(), doc! {"$set": {"over": true}})
        .expect("update");
    assert_eq!(r.matched as usize, want.len());
    assert_eq!(
        c.delete_many(doc! {"$expr": {"$eq": ["$over", true]}})
            .expect("delete"),
        want.len() as u64
    );
    assert_eq!(c.count(doc! {}).expect("count"), 50 - want.len() as u64);
}

#[test]
fn bits_and_json_schema_on_a_collection() {
    let (_db, c) = loaded();
    for s in STRATEGIES {
        let n = c
            .find(doc! {"v": {"$bitsAllSet": [0, 1]}})
            .snapshot(s)
            .run()
            .expect("bits")
            .len();
        let want = docs()
            .iter()
            .filter(|d| d.get_i32("v").is_ok_and(|v| v & 3 == 3))
            .count();
        assert_eq!(n, want, "under {s}");
        let n = c
            .find(doc! {"$jsonSchema": {"required": ["v"], "properties": {"v": {"bsonType": "int", "minimum": 5}}}})
            .snapshot(s)
            .run()
            .expect("schema")
            .len();
        let want = docs()
            .iter()
            .filter(|d| d.get_i32("v").is_ok_and(|v| v >= 5))
            .count();
        assert_eq!(n, want, "under {s}");
    }
}

#[test]
fn new_accumulators_equal_the_reference_under_every_strategy() {
    let (_db, c) = loaded();
    let all = c.find(doc! {}).run().expect("all");
    let commutative = vec![
        doc! {"$match": {"$expr": {"$gte": ["$w", 1]}}},
        doc! {"$group": {
            "_id": "$g",
            "top": {"$top": {"sortBy": {"v": -1, "_id": 1}, "output": ["$_id", "$v"]}},
            "bottom2": {"$bottomN": {"n": 2, "sortBy": {"w": 1}, "output": "$_id"}},
            "top3": {"$topN": {"n": 3, "sortBy": {"spent": -1}, "output": "$spent"}},
            "max2": {"$maxN": {"n": 2, "input": "$v"}},
            "min3": {"$minN": {"n": 3, "input": "$w"}},
            "med": {"$median": {"input": "$v", "method": "approximate"}},
            "pct": {"$percentile": {"input": "$w", "p": [0.25, 0.9], "method": "approximate"}},
            "sd": {"$stdDevPop": "$spent"},
            "sds": {"$stdDevSamp": "$spent"},
        }},
    ];
    let ordered = vec![
        doc! {"$sort": {"_id": 1}},
        doc! {"$group": {
            "_id": "$g",
            "first2": {"$firstN": {"n": 2, "input": "$v"}},
            "last2": {"$lastN": {"n": 2, "input": "$_id"}},
            "merged": {"$mergeObjects": "$meta"},
        }},
    ];
    let split = Pipeline::parse(&commutative).expect("parse").split();
    assert!(split.olcp_eligible(), "these accumulators merge");
    let split = Pipeline::parse(&ordered).expect("parse").split();
    assert!(
        !split.olcp_eligible(),
        "$firstN/$lastN/$mergeObjects depend on order"
    );
    for p in [commutative, ordered] {
        let want = normalize(
            Pipeline::parse(&p)
                .expect("parse")
                .run_on(all.clone())
                .expect("reference"),
        );
        assert_eq!(want.len(), 3);
        for s in STRATEGIES {
            let (got, _) = c.aggregate_with(p.clone(), s).expect("aggregate");
            let got = normalize(got);
            // Standard deviations may differ in the last bits with the merge
            // order; everything else is exact.
            for (g, w) in got.iter().zip(&want) {
                for (k, v) in w {
                    match (v, g.get(k)) {
                        (Bson::Double(x), Some(Bson::Double(y))) => {
                            assert!((x - y).abs() < 1e-9, "{k} under {s}: {x} vs {y}")
                        }
                        (x, y) => assert_eq!(Some(x), y, "{k} under {s}"),
                    }
                }
            }
        }
    }
    // A failing `$expr` in the scan filter fails the aggregation under
    // every strategy, OLCP's parallel scan included.
    let failing = vec![
        doc! {"$match": {"$expr": {"$gt": [{"$add": ["$g", 1]}, 0]}}},
        doc! {"$group": {"_id": "$g", "n": {"$sum": 1}}},
    ];
    for s in STRATEGIES {
        let e = c
            .aggregate_with(failing.clone(), s)
            .expect_err("type error");
        assert_eq!(e.code(), 14, "under {s}");
    }
    let b = normalize(
        c.aggregate(vec![
            doc! {"$sort": {"_id": 1}},
            doc! {"$group": {"_id": null, "last2": {"$lastN": {"n": 2, "input": "$_id"}}, "m": {"$mergeObjects": "$meta"}}},
        ])
        .expect("ordered"),
    );
    assert_eq!(
        b[0].get_array("last2").expect("last2"),
        &vec![Bson::Int32(48), Bson::Int32(49)]
    );
    assert_eq!(
        b[0].get_document("m").expect("m"),
        &doc! {"k0": 48, "k1": 49, "k2": 46, "k3": 47}
    );
}

/// `$$CLUSTER_TIME` is the time of the state a read reads (its last commit
/// group's cluster time), not the wall clock: a held snapshot's reads see
/// its time even after later commits, live reads the latest commit's, under
/// every strategy; in a pipeline and in a `$expr` filter.
#[test]
fn cluster_time_is_the_reads_snapshot_time() {
    let (db, c) = loaded();
    let ts = |t: u64| {
        Bson::Timestamp(bson::Timestamp {
            time: (t >> 32) as u32,
            increment: t as u32,
        })
    };
    let snap = db.snapshot();
    let t0 = snap.cluster_time();
    assert!(t0 > 0, "a committed state has a cluster time");
    c.insert_one(doc! {"_id": 1000}).expect("insert");
    let t1 = db.snapshot().cluster_time();
    assert!(t1 > t0);
    let pipeline = vec![
        doc! {"$limit": 1},
        doc! {"$project": {"_id": 0, "t": "$$CLUSTER_TIME"}},
    ];
    let held = snap.collection("t");
    let out = held.aggregate(pipeline.clone()).expect("held aggregate");
    assert_eq!(out, vec![doc! {"t": ts(t0)}]);
    let at_t0 = doc! {"$expr": {"$eq": ["$$CLUSTER_TIME", ts(t0)]}};
    assert_eq!(held.find(at_t0.clone()).run().expect("find").len(), 50);
    assert_eq!(held.count(at_t0).expect("count"), 50);
    // (A read under some strategies commits a group of its own, so the
    // latest time is taken again before each.)
    for s in STRATEGIES {
        let latest = db.snapshot().cluster_time();
        assert!(latest >= t1);
        let (out, _) = c.aggregate_with(pipeline.clone(), s).expect("aggregate");
        assert_eq!(out, vec![doc! {"t": ts(latest)}], "{s:?}");
    }
    let latest = db.snapshot().cluster_time();
    let at_latest = doc! {"$expr": {"$eq": ["$$CLUSTER_TIME", ts(latest)]}};
    assert_eq!(c.count(at_latest).expect("count"), 51);
}
