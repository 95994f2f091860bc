//! The aggregation pipeline: every stage and accumulator against a model
//! computed by hand in plain Rust, error cases with their codes, the
//! split/merge property (any order, any number of partial states, any merge
//! tree gives the in-order answer), execution on a collection, and snapshot
//! consistency of `aggregate_with(.., Vls)` under concurrent transfers.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use bson::{bson, doc, Bson, Document, RawDocumentBuf};
use duetdb::lang::canonical_cmp;
use duetdb::lang::{PartialState, Pipeline};
use duetdb::{Database, Strategy};
use proptest::prelude::*;
use proptest::strategy::Strategy as PropStrategy;

fn run(pipeline: Vec<Document>, docs: &[Document]) -> duetdb::Result<Vec<Document>> {
    Pipeline::parse(&pipeline)?.run_on(docs.to_vec())
}

fn ok(pipeline: Vec<Document>, docs: &[Document]) -> Vec<Document> {
    run(pipeline, docs).expect("pipeline runs")
}

fn code(pipeline: Vec<Document>, docs: &[Document]) -> i32 {
    run(pipeline, docs).expect_err("pipeline fails").code()
}

fn sales() -> Vec<Document> {
    (0..60)
        .map(|i: i32| {
            let store = ["north", "south", "east"][(i % 3) as usize];
            let mut d = doc! {
                "_id": i,
                "store": store,
                "qty": i % 7,
                "price": f64::from(i % 5) + 0.5,
                "tags": (0..(i % 4)).map(|t| Bson::String(format!("t{t}"))).collect::<Vec<_>>(),
                "day": bson::DateTime::from_millis(1_700_000_000_000 + i64::from(i) * 86_400_000),
            };
            if i % 10 == 0 {
                d.remove("qty");
            }
            if i % 11 == 0 {
                d.insert("qty", Bson::Null);
            }
            d
        })
        .collect()
}

#[test]
fn group_accumulators_match_a_model() {
    let docs = sales();
    let out = ok(
        vec![
            doc! {"$group": {
                "_id": "$store",
                "n": {"$count": {}},
                "qty": {"$sum": "$qty"},
                "avg": {"$avg": "$qty"},
                "lo": {"$min": "$qty"},
                "hi": {"$max": "$price"},
                "first": {"$first": "$_id"},
                "last": {"$last": "$_id"},
                "ids": {"$push": "$_id"},
                "prices": {"$addToSet": "$price"},
            }},
            doc! {"$sort": {"_id": 1}},
        ],
        &docs,
    );
    // The model: plain Rust over the same documents.
    let mut model: BTreeMap<String, Vec<&Document>> = BTreeMap::new();
    for d in &docs {
        model
            .entry(d.get_str("store").expect("store").to_string())
            .or_default()
            .push(d);
    }
    assert_eq!(out.len(), model.len());
    for (g, (store, members)) in out.iter().zip(&model) {
        assert_eq!(g.get_str("_id").expect("_id"), store);
        let qtys: Vec<i32> = members
            .iter()
            .filter_map(|d| d.get_i32("qty").ok())
            .collect();
        let prices: Vec<f64> = members
            .iter()
            .map(|d| d.get_f64("price").expect("price"))
            .collect();
        assert_eq!(g.get_i32("n").expect("n"), members.len() as i32);
        assert_eq!(g.get_i32("qty").expect("qty"), qtys.iter().sum::<i32>());
        let avg = f64::from(qtys.iter().sum::<i32>()) / qtys.len() as f64;
        assert!((g.get_f64("avg").expect("avg") - avg).abs() < 1e-12);
        assert_eq!(
            g.get_i32("lo").expect("lo"),
            *qtys.iter().min().expect("some")
        );
        assert_eq!(
            g.get_f64("hi").expect("hi"),
            prices.iter().cloned().fold(f64::MIN, f64::max)
        );
        assert_eq!(g.get("first"), members.first().and_then(|d| d.get("_id")));
        assert_eq!(g.get("last"), members.last().and_then(|d| d.get("_id")));
        let ids: Vec<Bson> = members
            .iter()
            .map(|d| d.get("_id").cloned().expect("id"))
            .collect();
        assert_eq!(g.get_array("ids").expect("ids"), &ids);
        let mut set: Vec<f64> = prices.clone();
        set.sort_by(|a, b| a.partial_cmp(b).expect("no NaN"));
        set.dedup();
        let got: Vec<f64> = g
            .get_array("prices")
            .expect("set")
            .iter()
            .map(|b| b.as_f64().expect("f64"))
            .collect();
        assert_eq!(got, set);
    }
}

#[test]
fn group_keys_documents_and_constants() {
    let docs = sales();
    let out = ok(
        vec![
            doc! {"$group": {"_id": {"s": "$store", "odd": {"$mod": ["$_id", 2]}}, "n": {"$sum": 1}}},
            doc! {"$sort": {"_id.s": 1, "_id.odd": 1}},
        ],
        &docs,
    );
    assert_eq!(out.len(), 6);
    assert_eq!(
        out[0].get_document("_id").expect("doc key"),
        &doc! {"s": "east", "odd": 0}
    );
    assert_eq!(
        out.iter().map(|d| d.get_i32("n").expect("n")).sum::<i32>(),
        60
    );
    // A constant _id makes one group; empty input makes none.
    let one = ok(
        vec![doc! {"$group": {"_id": null, "total": {"$sum": "$price"}}}],
        &docs,
    );
    let model: f64 = docs
        .iter()
        .map(|d| d.get_f64("price").expect("price"))
        .sum();
    assert_eq!(one, vec![doc! {"_id": Bson::Null, "total": model}]);
    assert!(ok(vec![doc! {"$group": {"_id": null, "n": {"$sum": 1}}}], &[]).is_empty());
    // Missing group key is null; $min/$max ignore null and missing; $avg of nothing is null.
    let out = ok(
        vec![doc! {"$group": {"_id": "$nope", "lo": {"$min": "$nope"}, "a": {"$avg": "$nope"}}}],
        &docs,
    );
    assert_eq!(
        out,
        vec![doc! {"_id": Bson::Null, "lo": Bson::Null, "a": Bson::Null}]
    );
}

#[test]
fn sum_result_types_follow_mongodb() {
    let ints = vec![doc! {"v": i32::MAX}, doc! {"v": 1}];
    let out = ok(
        vec![doc! {"$group": {"_id": null, "s": {"$sum": "$v"}}}],
        &ints,
    );
    assert_eq!(out[0].get("s"), Some(&Bson::Int64(i64::from(i32::MAX) + 1)));
    let longs = vec![doc! {"v": 1_i64}, doc! {"v": 2}];
    let out = ok(
        vec![doc! {"$group": {"_id": null, "s": {"$sum": "$v"}}}],
        &longs,
    );
    assert_eq!(out[0].get("s"), Some(&Bson::Int64(3)));
    let over = vec![doc! {"v": i64::MAX}, doc! {"v": 1_i64}];
    let out = ok(
        vec![doc! {"$group": {"_id": null, "s": {"$sum": "$v"}}}],
        &over,
    );
    assert!(matches!(out[0].get("s"), Some(Bson::Double(_))));
    let mixed = vec![doc! {"v": 1}, doc! {"v": 0.5}, doc! {"v": "x"}];
    let out = ok(
        vec![doc! {"$group": {"_id": null, "s": {"$sum": "$v"}}}],
        &mixed,
    );
    assert_eq!(out[0].get("s"), Some(&Bson::Double(1.5)));
}

#[test]
fn project_inclusion_exclusion_and_computed() {
    let docs = vec![doc! {"_id": 1, "a": 1, "b": {"c": 2, "d": 3}, "e": [{"c": 1, "x": 0}, 5]}];
    assert_eq!(
        ok(vec![doc! {"$project": {"a": 1, "b.c": 1}}], &docs),
        vec![doc! {"_id": 1, "a": 1, "b": {"c": 2}}]
    );
    assert_eq!(
        ok(vec![doc! {"$project": {"_id": 0, "e.c": 1}}], &docs),
        vec![doc! {"e": [{"c": 1}]}]
    );
    assert_eq!(
        ok(vec![doc! {"$project": {"b": 0, "e": 0}}], &docs),
        vec![doc! {"_id": 1, "a": 1}]
    );
    assert_eq!(
        ok(
            vec![
                doc! {"$project": {"a": 1, "sum": {"$add": ["$a", "$b.c"]}, "lit": {"$literal": 1}, "nested": {"x": "$b.d"}}}
            ],
            &docs
        ),
        vec![doc! {"_id": 1, "a": 1, "sum": 3, "lit": 1, "nested": {"x": 3}}]
    );
    assert_eq!(
        ok(vec![doc! {"$project": {"_id": 0}}], &docs)[0].get("_id"),
        None
    );
    // Mixing inclusion and exclusion, empty specs: errors.
    assert_eq!(
        code(vec![doc! {"$project": {"a": 1, "b": 0}}], &docs),
        31254
    );
    assert_eq!(code(vec![doc! {"$project": {}}], &docs), 51272);
    assert_eq!(
        code(vec![doc! {"$project": {"a": 1, "a.b": 1}}], &docs),
        31249
    );
}

#[test]
fn add_fields_set_and_unset() {
    let docs = vec![doc! {"_id": 1, "a": 1, "b": {"c": 2}, "arr": [{"x": 1}, {"x": 2}]}];
    assert_eq!(
        ok(
            vec![doc! {"$addFields": {"a": 10, "z": {"$multiply": ["$a", 3]}, "b.d": "$a"}}],
            &docs
        ),
        // `z` sees the input's `a` (1), not the new one.
        vec![doc! {"_id": 1, "a": 10, "b": {"c": 2, "d": 1}, "arr": [{"x": 1}, {"x": 2}], "z": 3}]
    );
    assert_eq!(
        ok(vec![doc! {"$set": {"arr.y": 0}}], &docs)[0]
            .get_array("arr")
            .expect("arr"),
        &vec![bson!({"x": 1, "y": 0}), bson!({"x": 2, "y": 0})]
    );
    assert_eq!(
        ok(vec![doc! {"$set": {"a": "$$REMOVE"}}], &docs),
        vec![doc! {"_id": 1, "b": {"c": 2}, "arr": [{"x": 1}, {"x": 2}]}]
    );
    assert_eq!(
        ok(vec![doc! {"$unset": ["a", "b.c"]}], &docs),
        vec![doc! {"_id": 1, "b": {}, "arr": [{"x": 1}, {"x": 2}]}]
    );
    assert_eq!(ok(vec![doc! {"$unset": "arr"}], &docs)[0].len(), 3);
    assert_eq!(code(vec![doc! {"$unset": 1}], &docs), 2);
    assert_eq!(code(vec![doc! {"$addFields": {"$x": 1}}], &docs), 2);
}

#[test]
fn unwind_forms() {
    let docs = vec![
        doc! {"_id": 1, "a": [1, 2]},
        doc! {"_id": 2, "a": []},
        doc! {"_id": 3, "a": Bson::Null},
        doc! {"_id": 4},
        doc! {"_id": 5, "a": 7},
    ];
    let plain = ok(vec![doc! {"$unwind": "$a"}], &docs);
    assert_eq!(
        plain,
        vec![
            doc! {"_id": 1, "a": 1},
            doc! {"_id": 1, "a": 2},
            doc! {"_id": 5, "a": 7}
        ]
    );
    let kept = ok(
        vec![
            doc! {"$unwind": {"path": "$a", "preserveNullAndEmptyArrays": true, "includeArrayIndex": "i"}},
        ],
        &docs,
    );
    assert_eq!(
        kept,
        vec![
            doc! {"_id": 1, "a": 1, "i": 0_i64},
            doc! {"_id": 1, "a": 2, "i": 1_i64},
            doc! {"_id": 2, "i": Bson::Null},
            doc! {"_id": 3, "a": Bson::Null, "i": Bson::Null},
            doc! {"_id": 4, "i": Bson::Null},
            doc! {"_id": 5, "a": 7, "i": Bson::Null},
        ]
    );
    assert_eq!(code(vec![doc! {"$unwind": "a"}], &docs), 28818);
    assert_eq!(
        code(vec![doc! {"$unwind": {"path": "$a", "bogus": 1}}], &docs),
        28811
    );
    // Unwind then group: the multiset of tags.
    let tags = ok(
        vec![
            doc! {"$unwind": "$tags"},
            doc! {"$group": {"_id": "$tags", "n": {"$sum": 1}}},
            doc! {"$sort": {"_id": 1}},
        ],
        &sales(),
    );
    let model: Vec<i32> = (0..3)
        .map(|t| (0..60).filter(|i| i % 4 > t).count() as i32)
        .collect();
    assert_eq!(
        tags.iter()
            .map(|d| d.get_i32("n").expect("n"))
            .collect::<Vec<_>>(),
        model
    );
}

#[test]
fn sort_skip_limit_count() {
    let docs = sales();
    let out = ok(
        vec![
            doc! {"$sort": {"price": -1, "_id": 1}},
            doc! {"$skip": 2},
            doc! {"$limit": 3},
            doc! {"$project": {"_id": 1}},
        ],
        &docs,
    );
    let mut model: Vec<(f64, i32)> = docs
        .iter()
        .map(|d| {
            (
                d.get_f64("price").expect("p"),
                d.get_i32("_id").expect("id"),
            )
        })
        .collect();
    model.sort_by(|a, b| b.0.partial_cmp(&a.0).expect("no NaN").then(a.1.cmp(&b.1)));
    let want: Vec<Document> = model[2..5]
        .iter()
        .map(|(_, id)| doc! {"_id": *id})
        .collect();
    assert_eq!(out, want);
    assert_eq!(ok(vec![doc! {"$count": "n"}], &docs), vec![doc! {"n": 60}]);
    assert!(ok(
        vec![doc! {"$match": {"_id": -1}}, doc! {"$count": "n"}],
        &docs
    )
    .is_empty());
    assert_eq!(code(vec![doc! {"$limit": 0}], &docs), 15958);
    assert_eq!(code(vec![doc! {"$skip": -1}], &docs), 5107200);
    assert_eq!(code(vec![doc! {"$count": "$n"}], &docs), 40158);
    assert_eq!(code(vec![doc! {"$count": ""}], &docs), 40157);
    assert_eq!(code(vec![doc! {"$count": 1}], &docs), 40156);
    assert_eq!(code(vec![doc! {"$count": "a.b"}], &docs), 40160);
    assert_eq!(code(vec![doc! {"$sort": {}}], &docs), 15976);
}

#[test]
fn dates_and_tpch_q1_shape() {
    let docs = sales();
    // Q1-style: filter by date, group by two flags, sums of computed prices, sort.
    let cutoff = bson::DateTime::from_millis(1_700_000_000_000 + 40 * 86_400_000);
    let out = ok(
        vec![
            doc! {"$match": {"day": {"$lte": cutoff}}},
            doc! {"$group": {
                "_id": {"store": "$store", "big": {"$gte": [{"$ifNull": ["$qty", 0]}, 3]}},
                "sum_qty": {"$sum": "$qty"},
                "sum_disc": {"$sum": {"$multiply": ["$price", {"$subtract": [1, 0.5]}]}},
                "avg_price": {"$avg": "$price"},
                "count_order": {"$sum": 1},
                "month": {"$max": {"$month": "$day"}},
            }},
            doc! {"$sort": {"_id.store": 1, "_id.big": 1}},
        ],
        &docs,
    );
    let kept: Vec<&Document> = docs
        .iter()
        .filter(|d| d.get_datetime("day").expect("day") <= &cutoff)
        .collect();
    assert_eq!(
        out.iter()
            .map(|d| d.get_i32("count_order").expect("n"))
            .sum::<i32>(),
        kept.len() as i32
    );
    let disc: f64 = kept
        .iter()
        .map(|d| d.get_f64("price").expect("p") * 0.5)
        .sum();
    let got: f64 = out
        .iter()
        .map(|d| d.get_f64("sum_disc").expect("disc"))
        .sum();
    assert!((disc - got).abs() < 1e-9);
    assert!(out
        .iter()
        .all(|d| matches!(d.get("month"), Some(Bson::Int32(11 | 12)))));
}

#[test]
fn error_codes() {
    let docs = sales();
    let unknown = run(vec![doc! {"$frobnicate": {}}], &docs).expect_err("unknown stage");
    assert!(unknown
        .to_string()
        .contains("Unrecognized pipeline stage name: '$frobnicate'"));
    assert_eq!(code(vec![doc! {"$match": {}, "$limit": 1}], &docs), 2);
    assert_eq!(
        code(vec![doc! {"$group": {"n": {"$sum": 1}}}], &docs),
        15955
    );
    assert_eq!(
        code(
            vec![doc! {"$group": {"_id": 1, "n": {"$median": 1}}}],
            &docs
        ),
        5787801
    );
    assert_eq!(
        code(
            vec![doc! {"$group": {"_id": 1, "n": {"$accumulator": {}}}}],
            &docs
        ),
        2
    );
    assert_eq!(
        code(vec![doc! {"$group": {"_id": 1, "a.b": {"$sum": 1}}}], &docs),
        40235
    );
    assert_eq!(
        code(vec![doc! {"$group": {"_id": 1, "n": 1}}], &docs),
        40234
    );
    assert_eq!(
        code(vec![doc! {"$group": {"_id": 1, "$n": {"$sum": 1}}}], &docs),
        40236
    );
    assert_eq!(
        code(
            vec![doc! {"$group": {"_id": 1, "n": {"$sum": 1, "$max": 1}}}],
            &docs
        ),
        40238
    );
    assert_eq!(code(vec![doc! {"$match": {"$bogus": 1}}], &docs), 2);
    // MongoDB's projection parser: an unknown operator where an expression
    // may stand is 31325; inside an expression, 168.
    assert_eq!(
        code(vec![doc! {"$project": {"x": {"$frob": 1}}}], &docs),
        31325
    );
    assert_eq!(
        code(
            vec![doc! {"$project": {"x": {"$add": [{"$frob": 1}]}}}],
            &docs
        ),
        168
    );
    // Runtime type errors carry MongoDB's wording and TypeMismatch.
    let e = run(
        vec![doc! {"$project": {"x": {"$add": ["$store", 1]}}}],
        &docs,
    )
    .expect_err("type");
    assert_eq!(e.code(), 14);
    assert!(e
        .to_string()
        .contains("$add only supports numeric or date types, not string"));
    assert_eq!(
        code(vec![doc! {"$project": {"x": {"$divide": [1, 0]}}}], &docs),
        2
    );
    // Pipeline length.
    let long: Vec<Document> = (0..1001).map(|_| doc! {"$match": {}}).collect();
    assert_eq!(code(long, &docs), 2);
    let fine: Vec<Document> = (0..1000).map(|_| doc! {"$skip": 0}).collect();
    assert_eq!(ok(fine, &docs).len(), 60);
}

#[test]
fn memory_limits() {
    // $group state beyond its limit: 292.
    let docs: Vec<Document> = (0..2000)
        .map(|i| doc! {"k": i, "s": "x".repeat(100)})
        .collect();
    let mut p =
        Pipeline::parse(&[doc! {"$group": {"_id": "$k", "s": {"$push": "$s"}}}]).expect("parse");
    p.set_group_memory_limit(64 * 1024);
    let e = p.run_on(docs.clone()).expect_err("over the limit");
    assert_eq!(e.code(), 292);
    // The same limit through the commutative part (feed and merge).
    let split = p.split();
    let part = split.commutative.expect("commutative");
    let mut st = part.new_state();
    let mut failed = None;
    for d in &docs {
        let raw = RawDocumentBuf::try_from(d).expect("raw");
        if let Err(e) = part.feed(&mut st, &raw) {
            failed = Some(e);
            break;
        }
    }
    assert_eq!(failed.expect("fails").code(), 292);
    // A $push array beyond 16 MiB: the document would be too large (10334).
    let big = "y".repeat(1 << 20);
    let docs: Vec<Document> = (0..17).map(|_| doc! {"s": big.clone()}).collect();
    let e = run(
        vec![doc! {"$group": {"_id": null, "all": {"$push": "$s"}}}],
        &docs,
    )
    .expect_err("too big");
    assert_eq!(e.code(), 10334);
}

// ------------------------------------------------------------ split / merge

/// Sort every array in a document (recursively) and compare documents as values:
/// the order of `$push`/`$addToSet` arrays and of ungrouped output is unspecified.
fn normalize(docs: Vec<Document>) -> Vec<Document> {
    fn norm(v: Bson) -> Bson {
        match v {
            Bson::Array(a) => {
                let mut a: Vec<Bson> = a.into_iter().map(norm).collect();
                a.sort_by(canonical_cmp);
                Bson::Array(a)
            }
            Bson::Document(d) => Bson::Document(d.into_iter().map(|(k, v)| (k, norm(v))).collect()),
            other => other,
        }
    }
    let mut out: Vec<Bson> = docs.into_iter().map(|d| norm(Bson::Document(d))).collect();
    out.sort_by(canonical_cmp);
    out.into_iter()
        .filter_map(|b| match b {
            Bson::Document(d) => Some(d),
            _ => None,
        })
        .collect()
}

fn arb_scalar() -> impl PropStrategy<Value = Option<Bson>> {
    prop_oneof![
        Just(None),
        Just(Some(Bson::Null)),
        (-5i32..5).prop_map(|i| Some(Bson::Int32(i))),
        (-5i64..5).prop_map(|i| Some(Bson::Int64(i))),
        // Quarters: exactly representable, so double sums do not depend on order.
        (-20i32..20).prop_map(|i| Some(Bson::Double(f64::from(i) / 4.0))),
        prop_oneof![Just(i32::MAX), Just(i32::MIN)].prop_map(|i| Some(Bson::Int32(i))),
        Just(Some(Bson::Int64(i64::MAX / 2))),
        "[a-c]{0,2}".prop_map(|s| Some(Bson::String(s))),
    ]
}

fn arb_doc() -> impl PropStrategy<Value = Document> {
    (
        arb_scalar(),
        arb_scalar(),
        prop::option::of(prop::collection::vec(-3i32..3, 0..4)),
        0i32..3,
    )
        .prop_map(|(k, v, arr, g)| {
            let mut d = doc! {"g": g};
            if let Some(k) = k {
                d.insert("k", k);
            }
            if let Some(v) = v {
                d.insert("v", v);
            }
            if let Some(arr) = arr {
                d.insert("arr", arr);
            }
            d
        })
}

fn arb_pipeline() -> impl PropStrategy<Value = Vec<Document>> {
    let per_doc = prop_oneof![
        Just(doc! {"$match": {"g": {"$ne": 2}}}),
        Just(doc! {"$match": {"v": {"$type": "number"}}}),
        Just(doc! {"$addFields": {"w": {"$cond": [
            {"$and": [{"$gt": ["$v", null]}, {"$lt": ["$v", ""]}]},
            {"$add": ["$v", 1]},
            {"$ifNull": ["$v", "none"]},
        ]}}}),
        Just(doc! {"$set": {"k2": {"$concat": ["x", {"$toLower": "$k"}]}}}),
        Just(
            doc! {"$project": {"g": 1, "k": 1, "v": 1, "arr": 1, "two": {"$multiply": ["$g", 2]}}}
        ),
        Just(doc! {"$unset": "arr"}),
        Just(doc! {"$unwind": "$arr"}),
        Just(
            doc! {"$unwind": {"path": "$arr", "preserveNullAndEmptyArrays": true, "includeArrayIndex": "i"}}
        ),
    ];
    let key = prop_oneof![
        Just(Bson::Null),
        Just(bson!("$g")),
        Just(bson!("$k")),
        Just(bson!({"g": "$g", "k": "$k"})),
        Just(bson!("$arr")),
    ];
    let acc = prop_oneof![
        Just(("sum", bson!({"$sum": "$v"}))),
        Just(("one", bson!({"$sum": 1}))),
        Just(("cnt", bson!({"$count": {}}))),
        Just(("avg", bson!({"$avg": "$v"}))),
        Just(("min", bson!({"$min": "$v"}))),
        Just(("max", bson!({"$max": "$k"}))),
        Just(("push", bson!({"$push": "$v"}))),
        Just(("set", bson!({"$addToSet": "$k"}))),
        Just(("sumg", bson!({"$sum": {"$multiply": ["$g", 3]}}))),
        Just(("maxn", bson!({"$maxN": {"n": 2, "input": "$v"}}))),
        Just(("minn", bson!({"$minN": {"n": 3, "input": "$k"}}))),
        Just((
            "topn",
            bson!({"$topN": {"n": 2, "sortBy": {"v": -1}, "output": "$k"}})
        )),
        Just((
            "bottom",
            bson!({"$bottom": {"sortBy": {"k": 1}, "output": ["$v", "$g"]}})
        )),
        Just((
            "median",
            bson!({"$median": {"input": "$v", "method": "approximate"}})
        )),
        Just((
            "pct",
            bson!({"$percentile": {"input": "$g", "p": [0.1, 0.5, 1.0], "method": "approximate"}})
        )),
    ];
    (
        prop::collection::vec(per_doc, 0..4),
        prop::option::of((key, prop::collection::vec(acc, 0..5))),
    )
        .prop_map(|(mut stages, group)| {
            if let Some((key, accs)) = group {
                let mut g = doc! {"_id": key};
                for (name, a) in accs {
                    g.insert(name, a);
                }
                stages.push(doc! {"$group": g});
            }
            stages
        })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 200, ..ProptestConfig::default() })]

    /// Any permutation, any number of partial states, any merge tree: the same
    /// finished result as the in-order evaluation of the whole pipeline.
    #[test]
    fn split_merge_equals_in_order(
        docs in prop::collection::vec(arb_doc(), 0..40),
        pipeline in arb_pipeline(),
        perm_seed in any::<u64>(),
        parts in 1usize..6,
    ) {
        let reference = Pipeline::parse(&pipeline).expect("parse").run_on(docs.clone());
        let split = Pipeline::parse(&pipeline).expect("parse").split();
        prop_assert!(split.scan_filter.is_none() || pipeline.first().is_some_and(|s| s.contains_key("$match")));
        prop_assert!(split.rest.is_empty(), "all generated stages are commutative: {:?}", split.rest.stage_names());
        let Some(part) = split.commutative else {
            // Only leading $match stages (or nothing): the scan filter is the whole pipeline.
            return Ok(());
        };
        let filter = split.scan_filter.as_ref().map(|f| duetdb::lang::Filter::parse(f).expect("filter"));
        // A deterministic pseudo-random permutation and assignment to states.
        let mut rng = perm_seed | 1;
        let mut next = move || { rng ^= rng << 13; rng ^= rng >> 7; rng ^= rng << 17; rng };
        let mut order: Vec<usize> = (0..docs.len()).collect();
        for i in (1..order.len()).rev() {
            let j = (next() % (i as u64 + 1)) as usize;
            order.swap(i, j);
        }
        let mut states: Vec<PartialState> = (0..parts).map(|_| part.new_state()).collect();
        let mut failed = None;
        for i in order {
            let raw = RawDocumentBuf::try_from(&docs[i]).expect("raw");
            if filter.as_ref().is_some_and(|f| !f.matches(&raw)) {
                continue;
            }
            let s = (next() % parts as u64) as usize;
            if let Err(e) = part.feed(&mut states[s], &raw) {
                failed = Some(e);
                break;
            }
        }
        let merged = match failed {
            Some(e) => Err(e),
            None => {
                // Merge random pairs until one state is left (a random tree).
                let mut res = Ok(());
                while states.len() > 1 && res.is_ok() {
                    let a = states.swap_remove((next() % states.len() as u64) as usize);
                    let b = states.swap_remove((next() % states.len() as u64) as usize);
                    match part.merge(b, a) {
                        Ok(m) => states.push(m),
                        Err(e) => res = Err(e),
                    }
                }
                res.and_then(|_| part.finish(states.pop().expect("one state")))
            }
        };
        match (reference, merged) {
            (Ok(r), Ok(m)) => prop_assert_eq!(normalize(r), normalize(m)),
            (Err(r), Err(m)) => prop_assert_eq!(r.code(), m.code()),
            (r, m) => prop_assert!(false, "reference {:?} vs merged {:?}", r, m),
        }
    }
}

#[test]
fn first_last_make_a_group_non_commutative() {
    let split = Pipeline::parse(&[
        doc! {"$match": {"a": 1}},
        doc! {"$project": {"a": 1}},
        doc! {"$group": {"_id": null, "f": {"$first": "$a"}}},
    ])
    .expect("parse")
    .split();
    assert_eq!(
        split.commutative.as_ref().expect("project").stage_names(),
        vec!["$project"]
    );
    assert_eq!(split.rest.stage_names(), vec!["$group"]);
    assert!(!split.olcp_eligible());
    let split = Pipeline::parse(&[doc! {"$match": {"a": 1}}, doc! {"$limit": 3}])
        .expect("parse")
        .split();
    assert!(split.commutative.is_none());
    assert!(
        !split.olcp_eligible(),
        "a limit over an unordered scan depends on order"
    );
    let split = Pipeline::parse(&[
        doc! {"$unwind": "$a"},
        doc! {"$sort": {"a": 1}},
        doc! {"$limit": 3},
    ])
    .expect("parse")
    .split();
    assert!(split.olcp_eligible(), "the sort restores an order");
}

// ------------------------------------------------------------ on a collection

fn loaded() -> (Database, duetdb::Collection) {
    let db = Database::in_memory();
    let c = db.collection("sales");
    c.insert_many(sales(), true).expect("insert");
    (db, c)
}

#[test]
fn collection_aggregate_equals_reference() {
    let (_db, c) = loaded();
    let all = c.find(doc! {}).run().expect("find");
    let pipelines = vec![
        vec![
            doc! {"$match": {"qty": {"$gte": 2}}},
            doc! {"$group": {"_id": "$store", "q": {"$sum": "$qty"}, "p": {"$avg": "$price"}}},
            doc! {"$sort": {"_id": 1}},
        ],
        vec![
            doc! {"$unwind": "$tags"},
            doc! {"$sort": {"_id": -1, "tags": 1}},
            doc! {"$limit": 7},
        ],
        vec![
            doc! {"$project": {"store": 1}},
            doc! {"$group": {"_id": "$store", "f": {"$first": "$_id"}}},
            doc! {"$sort": {"_id": 1}},
        ],
        vec![doc! {"$match": {"store": "east"}}, doc! {"$count": "n"}],
        vec![],
    ];
    for p in pipelines {
        let want = Pipeline::parse(&p)
            .expect("parse")
            .run_on(all.clone())
            .expect("reference");
        for strategy in [Strategy::Vls, Strategy::Cow, Strategy::None, Strategy::Auto] {
            let (got, explain) = c.aggregate_with(p.clone(), strategy).expect("aggregate");
            assert_eq!(
                normalize(got.clone()),
                normalize(want.clone()),
                "{p:?} under {strategy}"
            );
            assert_ne!(explain.strategy, Strategy::Auto);
        }
        assert_eq!(
            normalize(c.aggregate(p.clone()).expect("default")),
            normalize(want.clone())
        );
        let snap = c.database().snapshot();
        assert_eq!(
            normalize(
                snap.collection("sales")
                    .aggregate(p.clone())
                    .expect("snapshot")
            ),
            normalize(want)
        );
    }
    assert!(c
        .database()
        .collection("absent")
        .aggregate(vec![doc! {"$count": "n"}])
        .expect("empty")
        .is_empty());
}

#[test]
fn explain_reports_the_split_and_the_plan() {
    let (_db, c) = loaded();
    c.create_index(doc! {"store": 1}, Default::default())
        .expect("index");
    let p = vec![
        doc! {"$match": {"store": "north"}},
        doc! {"$group": {"_id": "$qty", "n": {"$sum": 1}}},
        doc! {"$sort": {"n": -1}},
    ];
    let e = c.explain_aggregate(p.clone()).expect("explain");
    assert_eq!(e.get_bool("olcpEligible").ok(), Some(true));
    assert_eq!(
        e.get_document("scanFilter").expect("filter"),
        &doc! {"store": "north"}
    );
    assert_eq!(
        e.get_array("commutativeStages").expect("c"),
        &vec![bson!("$group")]
    );
    assert_eq!(e.get_array("restStages").expect("r"), &vec![bson!("$sort")]);
    // `auto` runs an eligible pipeline as OLCP.
    assert_eq!(e.get_str("strategy").ok(), Some("olcp"));
    assert!(e.to_string().contains("IXSCAN"), "{e}");
    let (_, run) = c.aggregate_with(p, Strategy::Cow).expect("run");
    assert_eq!(run.strategy, Strategy::Cow);
    assert!(run.olcp_eligible);
    assert!(run.plan.to_string().contains("IXSCAN"));
    let e = c
        .explain_aggregate(vec![doc! {"$group": {"_id": null, "f": {"$last": "$qty"}}}])
        .expect("explain");
    assert_eq!(e.get_bool("olcpEligible").ok(), Some(false));
    // A leading $limit stops the scan early.
    let (docs, run) = c
        .aggregate_with(vec![doc! {"$limit": 5}], Strategy::Vls)
        .expect("limit");
    assert_eq!(docs.len(), 5);
    assert!(run.stopped_early);
}

/// Transfers preserve Σ sign·balance (every transfer adds the same amount to one
/// `sign: 1` and one `sign: -1` account in one atomic update). A snapshot-consistent
/// aggregation always sees the initial total, whatever the concurrent writers do.
#[test]
fn vls_aggregation_is_consistent_under_concurrent_transfers() {
    let db = Database::in_memory();
    let accounts = db.collection("accounts");
    let n = 200i32;
    accounts
        .insert_many(
            (0..n).map(|i| doc! {"_id": i, "sign": if i % 2 == 0 { 1 } else { -1 }, "balance": 1000, "branch": i % 5}),
            true,
        )
        .expect("insert");
    let pipeline = vec![
        doc! {"$match": {"balance": {"$exists": true}}},
        doc! {"$group": {"_id": null, "total": {"$sum": {"$multiply": ["$sign", "$balance"]}}, "n": {"$sum": 1}}},
    ];
    let expected = vec![doc! {"_id": Bson::Null, "total": 0, "n": n}];
    assert_eq!(
        accounts.aggregate(pipeline.clone()).expect("initial"),
        expected
    );
    let stop = Arc::new(AtomicBool::new(false));
    let writers: Vec<_> = (0..2u64)
        .map(|w| {
            let c = accounts.clone();
            let stop = stop.clone();
            std::thread::spawn(move || {
                let mut x = 0x9E37_79B9_7F4A_7C15u64 ^ w;
                let mut done = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    let a = ((x % (n as u64 / 2)) * 2) as i32;
                    let b = (((x >> 20) % (n as u64 / 2)) * 2 + 1) as i32;
                    let amount = (x >> 40) as i32 % 50 - 25;
                    c.update_many(
                        doc! {"_id": {"$in": [a, b]}},
                        doc! {"$inc": {"balance": amount}},
                    )
                    .expect("transfer");
                    done += 1;
                }
                done
            })
        })
        .collect();
    let mut rounds = 0;
    let start = std::time::Instant::now();
    while rounds < 30 || start.elapsed() < std::time::Duration::from_millis(300) {
        let strategy = if rounds % 3 == 2 {
            Strategy::Cow
        } else {
            Strategy::Vls
        };
        let (out, _) = accounts
            .aggregate_with(pipeline.clone(), strategy)
            .expect("aggregate");
        assert_eq!(out, expected, "round {rounds} under {strategy}");
        // Per-group sums of a snapshot add up too.
        let (by_branch, _) = accounts
            .aggregate_with(
                vec![
                    doc! {"$group": {"_id": "$branch", "t": {"$sum": {"$multiply": ["$sign", "$balance"]}}}},
                    doc! {"$group": {"_id": null, "t": {"$sum": "$t"}}},
                ],
                Strategy::Vls,
            )
            .expect("aggregate");
        assert_eq!(by_branch, vec![doc! {"_id": Bson::Null, "t": 0}]);
        rounds += 1;
        if rounds > 2000 {
            break;
        }
    }
    stop.store(true, Ordering::Relaxed);
    let transfers: u64 = writers.into_iter().map(|w| w.join().expect("writer")).sum();
    assert!(transfers > 0, "writers made progress");
}
