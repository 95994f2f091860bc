//! The stages of `lookup.rs`, `facet.rs`, `bucket.rs`, `window.rs`,
//! `fill.rs`, `output.rs` and `$sample`/`$replaceRoot`/`$documents`, on
//! MongoDB's documented examples and edge cases, with the other collections
//! given by a small in-memory [`Foreign`] (the snapshot behaviour is tested
//! end to end in `tests/stages.rs`).

use std::collections::HashMap;
use std::ops::ControlFlow;
use std::sync::Arc;

use bson::{doc, Bson, DateTime, Document};

use super::*;
use crate::doc::DocRef;
use crate::query::limits::ReadLimits;

/// Collections as plain vectors, filtered by [`Filter::matches`].
struct Colls(HashMap<String, Vec<Document>>);

impl Foreign for Colls {
    fn scan(
        &self,
        coll: &str,
        filter: &Filter,
        visit: &mut dyn FnMut(&DocRef) -> Result<ControlFlow<()>>,
    ) -> Result<()> {
        for d in self.0.get(coll).into_iter().flatten() {
            let raw: DocRef = Arc::new(crate::doc::to_raw_document(d)?);
            if filter.matches(&raw) && visit(&raw)?.is_break() {
                break;
            }
        }
        filter.check()
    }
}

fn colls(list: &[(&str, Vec<Document>)]) -> Colls {
    Colls(
        list.iter()
            .map(|(n, d)| (n.to_string(), d.clone()))
            .collect(),
    )
}

fn run_in(c: &Colls, p: Vec<Document>, docs: Vec<Document>) -> Result<Vec<Document>> {
    let rt = Runtime::new(c, ReadLimits::default(), std::env::temp_dir());
    Pipeline::parse(&p)?.run_on_with(docs, &rt)
}

fn ok_in(c: &Colls, p: Vec<Document>, docs: Vec<Document>) -> Vec<Document> {
    run_in(c, p, docs).expect("pipeline runs")
}

fn ok(p: Vec<Document>, docs: Vec<Document>) -> Vec<Document> {
    Pipeline::parse(&p)
        .expect("parses")
        .run_on(docs)
        .expect("runs")
}

fn code(p: Vec<Document>, docs: Vec<Document>) -> i32 {
    Pipeline::parse(&p)
        .and_then(|p| p.run_on(docs))
        .expect_err("fails")
        .code()
}

fn parse_code(p: Vec<Document>) -> i32 {
    Pipeline::parse(&p).expect_err("refused").code()
}

fn ids(docs: &[Document], field: &str) -> Vec<Bson> {
    docs.iter()
        .map(|d| d.get(field).cloned().unwrap_or(Bson::Null))
        .collect()
}

fn date(s: &str) -> DateTime {
    DateTime::parse_rfc3339_str(s).expect("date")
}

// ---------------------------------------------------------------- $lookup

fn orders_inventory() -> (Vec<Document>, Colls) {
    let orders = vec![
        doc! {"_id": 1, "item": "almonds", "price": 12, "quantity": 2},
        doc! {"_id": 2, "item": "pecans", "price": 20, "quantity": 1},
        doc! {"_id": 3},
    ];
    let inventory = vec![
        doc! {"_id": 1, "sku": "almonds", "description": "product 1", "instock": 120},
        doc! {"_id": 2, "sku": "bread", "description": "product 2", "instock": 80},
        doc! {"_id": 3, "sku": "cashews", "description": "product 3", "instock": 60},
        doc! {"_id": 4, "sku": "pecans", "description": "product 4", "instock": 70},
        doc! {"_id": 5, "sku": null, "description": "Incomplete"},
        doc! {"_id": 6},
    ];
    (orders, colls(&[("inventory", inventory)]))
}

#[test]
fn lookup_equality_form_as_documented() {
    let (orders, c) = orders_inventory();
    let out = ok_in(
        &c,
        vec![doc! {"$lookup": {
            "from": "inventory", "localField": "item", "foreignField": "sku", "as": "inventory_docs"
        }}],
        orders,
    );
    let matched: Vec<Vec<Bson>> = out
        .iter()
        .map(|d| {
            d.get_array("inventory_docs")
                .expect("array")
                .iter()
                .map(|x| {
                    x.as_document()
                        .expect("doc")
                        .get("_id")
                        .cloned()
                        .expect("id")
                })
                .collect()
        })
        .collect();
    // A missing localField matches null and missing foreign fields.
    assert_eq!(
        matched,
        vec![
            vec![Bson::Int32(1)],
            vec![Bson::Int32(4)],
            vec![Bson::Int32(5), Bson::Int32(6)]
        ]
    );
}

#[test]
fn lookup_array_local_field_matches_each_element() {
    let classes = vec![
        doc! {"_id": 1, "title": "Reading is ...", "enrollmentlist": ["giraffe2", "pandabear", "artie"]},
        doc! {"_id": 2, "title": "But Writing ...", "enrollmentlist": ["giraffe1", "artie"]},
    ];
    let members = vec![
        doc! {"_id": 1, "name": "artie", "status": "A"},
        doc! {"_id": 2, "name": "giraffe", "status": "D"},
        doc! {"_id": 3, "name": "giraffe1", "status": "A"},
        doc! {"_id": 4, "name": "panda", "status": "A"},
        doc! {"_id": 5, "name": "pandabear", "status": "A"},
        doc! {"_id": 6, "name": "giraffe2", "status": "D"},
    ];
    let c = colls(&[("members", members)]);
    let out = ok_in(
        &c,
        vec![doc! {"$lookup": {
            "from": "members", "localField": "enrollmentlist", "foreignField": "name", "as": "enrollee_info"
        }}],
        classes,
    );
    let n: Vec<usize> = out
        .iter()
        .map(|d| d.get_array("enrollee_info").expect("array").len())
        .collect();
    assert_eq!(n, vec![3, 2]);
}

fn orders_warehouses() -> (Vec<Document>, Colls) {
    let orders = vec![
        doc! {"_id": 1, "item": "almonds", "price": 12, "ordered": 2},
        doc! {"_id": 2, "item": "pecans", "price": 20, "ordered": 1},
        doc! {"_id": 3, "item": "cookies", "price": 10, "ordered": 60},
    ];
    let warehouses = vec![
        doc! {"_id": 1, "stock_item": "almonds", "warehouse": "A", "instock": 120},
        doc! {"_id": 2, "stock_item": "pecans", "warehouse": "A", "instock": 80},
        doc! {"_id": 3, "stock_item": "almonds", "warehouse": "B", "instock": 60},
        doc! {"_id": 4, "stock_item": "cookies", "warehouse": "B", "instock": 40},
        doc! {"_id": 5, "stock_item": "cookies", "warehouse": "A", "instock": 80},
    ];
    (orders, colls(&[("warehouses", warehouses)]))
}

#[test]
fn lookup_let_pipeline_form_as_documented() {
    let (orders, c) = orders_warehouses();
    let out = ok_in(
        &c,
        vec![doc! {"$lookup": {
            "from": "warehouses",
            "let": {"order_item": "$item", "order_qty": "$ordered"},
            "pipeline": [
                {"$match": {"$expr": {"$and": [
                    {"$eq": ["$stock_item", "$$order_item"]},
                    {"$gte": ["$instock", "$$order_qty"]}
                ]}}},
                {"$project": {"stock_item": 0, "_id": 0}}
            ],
            "as": "stockdata"
        }}],
        orders,
    );
    assert_eq!(
        out[0].get_array("stockdata").expect("array"),
        &vec![
            Bson::Document(doc! {"warehouse": "A", "instock": 120}),
            Bson::Document(doc! {"warehouse": "B", "instock": 60}),
        ]
    );
    assert_eq!(
        out[2].get_array("stockdata").expect("array"),
        &vec![Bson::Document(doc! {"warehouse": "A", "instock": 80})]
    );
}

#[test]
fn lookup_prefilter_keeps_expr_semantics() {
    // `$expr` equality does not traverse arrays; the index prefilter
    // `{stock_item: v}` would: the answer must stay the `$expr` one.
    let c = colls(&[(
        "w",
        vec![
            doc! {"_id": 1, "stock_item": ["almonds"]},
            doc! {"_id": 2, "stock_item": "almonds"},
            doc! {"_id": 3, "stock_item": null},
            doc! {"_id": 4},
        ],
    )]);
    let out = ok_in(
        &c,
        vec![doc! {"$lookup": {
            "from": "w", "let": {"it": "$item"},
            "pipeline": [{"$match": {"$expr": {"$eq": ["$stock_item", "$$it"]}}}],
            "as": "m"
        }}],
        vec![
            doc! {"_id": "a", "item": "almonds"},
            doc! {"_id": "n", "item": null},
            doc! {"_id": "m"},
        ],
    );
    let ids_of = |d: &Document| -> Vec<Bson> {
        d.get_array("m")
            .expect("array")
            .iter()
            .map(|x| {
                x.as_document()
                    .expect("doc")
                    .get("_id")
                    .cloned()
                    .expect("id")
            })
            .collect()
    };
    assert_eq!(ids_of(&out[0]), vec![Bson::Int32(2)]);
    assert_eq!(ids_of(&out[1]), vec![Bson::Int32(3)]);
    // `$$it` missing equals a missing field only.
    assert_eq!(ids_of(&out[2]), vec![Bson::Int32(4)]);
}

#[test]
fn lookup_uncorrelated_and_combined_forms() {
    let absences = vec![
        doc! {"_id": 1, "student": "Ann Aardvark", "sickdays": [date("2018-05-01T00:00:00Z"), date("2018-08-23T00:00:00Z")]},
        doc! {"_id": 2, "student": "Zoe Zebra", "sickdays": [date("2018-02-01T00:00:00Z")]},
    ];
    let holidays = vec![
        doc! {"_id": 1, "year": 2018, "name": "New Years", "date": date("2018-01-01T00:00:00Z")},
        doc! {"_id": 2, "year": 2018, "name": "Pi Day", "date": date("2018-03-14T00:00:00Z")},
        doc! {"_id": 3, "year": 2017, "name": "New Years", "date": date("2017-01-01T00:00:00Z")},
    ];
    let c = colls(&[("holidays", holidays)]);
    let out = ok_in(
        &c,
        vec![doc! {"$lookup": {
            "from": "holidays",
            "pipeline": [
                {"$match": {"year": 2018}},
                {"$project": {"_id": 0, "date": {"name": "$name", "date": "$date"}}},
                {"$replaceRoot": {"newRoot": "$date"}}
            ],
            "as": "holidays"
        }}],
        absences,
    );
    for d in &out {
        let h = d.get_array("holidays").expect("array");
        assert_eq!(h.len(), 2);
        assert_eq!(
            h[1].as_document()
                .expect("doc")
                .get_str("name")
                .expect("name"),
            "Pi Day"
        );
    }

    // MongoDB 5.0+: localField/foreignField with let + pipeline.
    let restaurants = vec![
        doc! {"_id": 1, "name": "American Steak House", "food": ["filet", "sirloin"], "beverages": ["beer", "wine"]},
        doc! {"_id": 2, "name": "Honest John Pizza", "food": ["cheese pizza", "pepperoni pizza"], "beverages": ["soda"]},
    ];
    let orders = vec![
        doc! {"_id": 1, "item": "filet", "restaurant_name": "American Steak House"},
        doc! {"_id": 2, "item": "cheese pizza", "restaurant_name": "Honest John Pizza", "drink": "lemonade"},
        doc! {"_id": 3, "item": "cheese pizza", "restaurant_name": "Honest John Pizza", "drink": "soda"},
    ];
    let c = colls(&[("restaurants", restaurants)]);
    let out = ok_in(
        &c,
        vec![doc! {"$lookup": {
            "from": "restaurants",
            "localField": "restaurant_name",
            "foreignField": "name",
            "let": {"orders_drink": "$drink"},
            "pipeline": [{"$match": {"$expr": {"$in": ["$$orders_drink", "$beverages"]}}}],
            "as": "matches"
        }}],
        orders,
    );
    let n: Vec<usize> = out
        .iter()
        .map(|d| d.get_array("matches").expect("array").len())
        .collect();
    assert_eq!(n, vec![0, 0, 1]);
}

#[test]
fn lookup_errors_are_mongodbs() {
    let spec = |s: Document| parse_code(vec![doc! {"$lookup": s}]);
    assert_eq!(
        spec(doc! {"from": "x", "localField": "a", "foreignField": "b"}),
        9
    );
    assert_eq!(spec(doc! {"from": "x", "localField": "a", "as": "o"}), 9);
    assert_eq!(spec(doc! {"from": "x", "as": "o"}), 9);
    assert_eq!(
        spec(
            doc! {"from": "x", "localField": "a", "foreignField": "b", "let": {"v": 1}, "as": "o"}
        ),
        9
    );
    assert_eq!(spec(doc! {"from": 1, "pipeline": [], "as": "o"}), 9);
    assert_eq!(
        spec(doc! {"from": "x", "pipeline": [], "as": "o", "bogus": "y"}),
        9
    );
    assert_eq!(spec(doc! {"pipeline": [{"$match": {}}], "as": "o"}), 9);
    assert_eq!(
        spec(doc! {"from": "x", "pipeline": [{"$out": "y"}], "as": "o"}),
        51047
    );
    assert_eq!(
        spec(doc! {"from": "x", "pipeline": [{"$match": {"$expr": "$$nope"}}], "as": "o"}),
        17276
    );
    assert_eq!(parse_code(vec![doc! {"$lookup": 1}]), 9);
    // 21 nested sub-pipelines: 232, as MongoDB's limit of 20.
    let mut inner = doc! {"$match": {}};
    for _ in 0..21 {
        inner = doc! {"$lookup": {"from": "x", "pipeline": [inner], "as": "o"}};
    }
    assert_eq!(parse_code(vec![inner]), 232);
}

#[test]
fn lookup_matches_are_bounded_by_the_memory_limit() {
    let big = "x".repeat(1000);
    let c = colls(&[(
        "f",
        (0..100)
            .map(|i| doc! {"_id": i, "k": 1, "s": big.clone()})
            .collect(),
    )]);
    let limits = ReadLimits {
        memory_limit_bytes: 50_000,
        ..ReadLimits::default()
    };
    let rt = Runtime::new(&c, limits, std::env::temp_dir());
    let p = Pipeline::parse(&[doc! {"$lookup": {
        "from": "f", "localField": "k", "foreignField": "k", "as": "m"
    }}])
    .expect("parse");
    let e = p
        .run_on_with(vec![doc! {"_id": 1, "k": 1}], &rt)
        .expect_err("too large");
    assert_eq!(e.code(), 4568);
}

#[test]
fn foreign_names_cover_sub_pipelines() {
    let p = Pipeline::parse(&[
        doc! {"$lookup": {"from": "a", "pipeline": [
            {"$unionWith": {"coll": "b", "pipeline": [{"$lookup": {"from": "c", "localField": "x", "foreignField": "y", "as": "z"}}]}}
        ], "as": "o"}},
        doc! {"$facet": {"f": [{"$graphLookup": {"from": "d", "startWith": "$x", "connectFromField": "x", "connectToField": "y", "as": "g"}}]}},
    ])
    .expect("parse");
    assert_eq!(p.foreign_names(), vec!["a", "b", "c", "d"]);
}

// ---------------------------------------------------------------- $graphLookup

#[test]
fn graph_lookup_reporting_hierarchy() {
    let employees = vec![
        doc! {"_id": 1, "name": "Dev"},
        doc! {"_id": 2, "name": "Eliot", "reportsTo": "Dev"},
        doc! {"_id": 3, "name": "Ron", "reportsTo": "Eliot"},
        doc! {"_id": 4, "name": "Andrew", "reportsTo": "Eliot"},
        doc! {"_id": 5, "name": "Asya", "reportsTo": "Ron"},
        doc! {"_id": 6, "name": "Dan", "reportsTo": "Andrew"},
    ];
    let c = colls(&[("employees", employees.clone())]);
    let out = ok_in(
        &c,
        vec![doc! {"$graphLookup": {
            "from": "employees", "startWith": "$reportsTo", "connectFromField": "reportsTo",
            "connectToField": "name", "as": "reportingHierarchy", "depthField": "depth"
        }}],
        employees.clone(),
    );
    let asya = &out[4];
    let chain: Vec<(String, i64)> = asya
        .get_array("reportingHierarchy")
        .expect("array")
        .iter()
        .map(|x| {
            let d = x.as_document().expect("doc");
            (
                d.get_str("name").expect("name").to_string(),
                d.get_i64("depth").expect("depth"),
            )
        })
        .collect();
    assert_eq!(
        chain,
        vec![("Ron".into(), 0), ("Eliot".into(), 1), ("Dev".into(), 2)]
    );
    assert!(out[0]
        .get_array("reportingHierarchy")
        .expect("array")
        .is_empty());
    let limited = ok_in(
        &c,
        vec![doc! {"$graphLookup": {
            "from": "employees", "startWith": "$reportsTo", "connectFromField": "reportsTo",
            "connectToField": "name", "as": "h", "maxDepth": 1
        }}],
        employees,
    );
    assert_eq!(limited[4].get_array("h").expect("array").len(), 2);
    assert_eq!(
        parse_code(vec![doc! {"$graphLookup": {"from": "e", "as": "h"}}]),
        40105
    );
    assert_eq!(
        parse_code(vec![
            doc! {"$graphLookup": {"from": "e", "startWith": 1, "connectFromField": "a",
            "connectToField": "b", "as": "h", "maxDepth": -1}}
        ]),
        40101
    );
}

#[test]
fn graph_lookup_cycles_terminate() {
    let c = colls(&[(
        "g",
        vec![
            doc! {"_id": 1, "to": 2},
            doc! {"_id": 2, "to": 3},
            doc! {"_id": 3, "to": 1},
        ],
    )]);
    let out = ok_in(
        &c,
        vec![
            doc! {"$graphLookup": {"from": "g", "startWith": 1, "connectFromField": "to",
            "connectToField": "_id", "as": "r"}},
        ],
        vec![doc! {"_id": "start"}],
    );
    assert_eq!(out[0].get_array("r").expect("array").len(), 3);
}

// ---------------------------------------------------------------- $unionWith

#[test]
fn union_with_then_group() {
    let s2017 = vec![
        doc! {"store": "General Store", "item": "Chocolates", "quantity": 150},
        doc! {"store": "ZZ Supermarket", "item": "Chocolates", "quantity": 15},
    ];
    let s2018 = vec![doc! {"store": "General Store", "item": "Chocolates", "quantity": 100}];
    let s2019 = vec![doc! {"store": "ZZ Supermarket", "item": "Chocolates", "quantity": 5}];
    let c = colls(&[("s2018", s2018), ("s2019", s2019)]);
    let out = ok_in(
        &c,
        vec![
            doc! {"$unionWith": "s2018"},
            doc! {"$unionWith": {"coll": "s2019", "pipeline": [{"$set": {"late": true}}]}},
            doc! {"$group": {"_id": "$store", "total": {"$sum": "$quantity"}, "late": {"$max": "$late"}}},
            doc! {"$sort": {"_id": 1}},
        ],
        s2017,
    );
    assert_eq!(
        out,
        vec![
            doc! {"_id": "General Store", "total": 250, "late": null},
            doc! {"_id": "ZZ Supermarket", "total": 20, "late": true},
        ]
    );
    let docs_only = ok_in(
        &c,
        vec![doc! {"$unionWith": {"pipeline": [{"$documents": [{"x": 1}, {"x": 2}]}]}}],
        vec![doc! {"x": 0}],
    );
    assert_eq!(
        ids(&docs_only, "x"),
        vec![Bson::Int32(0), Bson::Int32(1), Bson::Int32(2)]
    );
    assert_eq!(parse_code(vec![doc! {"$unionWith": 3}]), 9);
    assert_eq!(
        parse_code(vec![doc! {"$unionWith": {"coll": "a", "x": 1}}]),
        40415
    );
    assert_eq!(parse_code(vec![doc! {"$unionWith": {"pipeline": []}}]), 9);
}

// ---------------------------------------------------------------- $facet

#[test]
fn facet_runs_each_sub_pipeline_on_every_input() {
    let docs: Vec<Document> = (0..10)
        .map(|i| doc! {"_id": i, "price": i * 10, "tags": if i % 2 == 0 { "even" } else { "odd" }})
        .collect();
    let out = ok(
        vec![doc! {"$facet": {
            "byTag": [{"$sortByCount": "$tags"}],
            "cheap": [{"$match": {"price": {"$lt": 30}}}, {"$count": "n"}],
            "top2": [{"$sort": {"price": -1}}, {"$limit": 2}, {"$project": {"_id": 1}}],
        }}],
        docs,
    );
    assert_eq!(out.len(), 1);
    let f = &out[0];
    assert_eq!(f.get_array("byTag").expect("array").len(), 2);
    assert_eq!(
        f.get_array("cheap").expect("array"),
        &vec![Bson::Document(doc! {"n": 3})]
    );
    assert_eq!(
        f.get_array("top2").expect("array"),
        &vec![
            Bson::Document(doc! {"_id": 9}),
            Bson::Document(doc! {"_id": 8})
        ]
    );
    assert_eq!(parse_code(vec![doc! {"$facet": {}}]), 40169);
    assert_eq!(parse_code(vec![doc! {"$facet": {"a": 1}}]), 40170);
    assert_eq!(parse_code(vec![doc! {"$facet": {"a": [1]}}]), 40171);
    assert_eq!(
        parse_code(vec![doc! {"$facet": {"a": [{"$facet": {"b": []}}]}}]),
        40600
    );
    assert_eq!(
        parse_code(vec![doc! {"$facet": {"a": [{"$out": "x"}]}}]),
        40600
    );
    assert_eq!(parse_code(vec![doc! {"$facet": {"$a": []}}]), 16410);
}

#[test]
fn facet_outputs_are_bounded() {
    let big = "y".repeat(10_000);
    let docs: Vec<Document> = (0..50).map(|i| doc! {"_id": i, "s": big.clone()}).collect();
    let c = colls(&[]);
    let limits = ReadLimits {
        memory_limit_bytes: 100_000,
        ..ReadLimits::default()
    };
    let rt = Runtime::new(&c, limits, std::env::temp_dir());
    let e = Pipeline::parse(&[doc! {"$facet": {"all": [], "again": []}}])
        .expect("parse")
        .run_on_with(docs, &rt)
        .expect_err("over");
    assert_eq!(e.code(), 4031700);
}

// ---------------------------------------------------------------- buckets

fn artists() -> Vec<Document> {
    vec![
        doc! {"_id": 1, "last_name": "Bernard", "first_name": "Emil", "year_born": 1868, "year_died": 1941, "nationality": "France"},
        doc! {"_id": 2, "last_name": "Rippl-Ronai", "first_name": "Joszef", "year_born": 1861, "year_died": 1927, "nationality": "Hungary"},
        doc! {"_id": 3, "last_name": "Ostroumova", "first_name": "Anna", "year_born": 1871, "year_died": 1955, "nationality": "Russia"},
        doc! {"_id": 4, "last_name": "Van Gogh", "first_name": "Vincent", "year_born": 1853, "year_died": 1890, "nationality": "Holland"},
        doc! {"_id": 5, "last_name": "Maurer", "first_name": "Alfred", "year_born": 1868, "year_died": 1932, "nationality": "USA"},
        doc! {"_id": 6, "last_name": "Munch", "first_name": "Edvard", "year_born": 1863, "year_died": 1944, "nationality": "Norway"},
        doc! {"_id": 7, "last_name": "Redon", "first_name": "Odilon", "year_born": 1840, "year_died": 1916, "nationality": "France"},
        doc! {"_id": 8, "last_name": "Diriks", "first_name": "Edvard", "year_born": 1855, "year_died": 1930, "nationality": "Norway"},
    ]
}

#[test]
fn bucket_as_documented() {
    let out = ok(
        vec![doc! {"$bucket": {
            "groupBy": "$year_born",
            "boundaries": [1840, 1850, 1860, 1870, 1880],
            "default": "Other",
            "output": {"count": {"$sum": 1}, "artists": {"$push": "$last_name"}}
        }}],
        artists(),
    );
    let counts: Vec<(Bson, i32)> = out
        .iter()
        .map(|d| {
            (
                d.get("_id").cloned().expect("id"),
                d.get_i32("count").expect("count"),
            )
        })
        .collect();
    assert_eq!(
        counts,
        vec![
            (Bson::Int32(1840), 1),
            (Bson::Int32(1850), 2),
            (Bson::Int32(1860), 4),
            (Bson::Int32(1870), 1),
        ]
    );
    // A value outside the boundaries without a default: the $switch error.
    assert_eq!(
        code(
            vec![doc! {"$bucket": {"groupBy": "$year_born", "boundaries": [1850, 1860]}}],
            artists()
        ),
        40066
    );
    let b = |spec: Document| parse_code(vec![doc! {"$bucket": spec}]);
    assert_eq!(b(doc! {"groupBy": "$a", "boundaries": [1]}), 40192);
    assert_eq!(b(doc! {"groupBy": "$a", "boundaries": [1, "a"]}), 40193);
    assert_eq!(b(doc! {"groupBy": "$a", "boundaries": [2, 1]}), 40194);
    assert_eq!(
        b(doc! {"groupBy": "$a", "boundaries": [1, 5], "default": 3}),
        40199
    );
    assert_eq!(b(doc! {"groupBy": "a", "boundaries": [1, 5]}), 40202);
    assert_eq!(b(doc! {"boundaries": [1, 5]}), 40198);
    assert_eq!(
        b(doc! {"groupBy": "$a", "boundaries": [1, 5], "x": 1}),
        40197
    );
}

#[test]
fn bucket_auto_and_sort_by_count() {
    let docs: Vec<Document> = (1..=10).map(|i| doc! {"_id": i, "price": i}).collect();
    let out = ok(
        vec![doc! {"$bucketAuto": {"groupBy": "$price", "buckets": 4}}],
        docs.clone(),
    );
    let shape: Vec<(Bson, Bson, i32)> = out
        .iter()
        .map(|d| {
            let id = d.get_document("_id").expect("id");
            (
                id.get("min").cloned().expect("min"),
                id.get("max").cloned().expect("max"),
                d.get_i32("count").expect("count"),
            )
        })
        .collect();
    // 10 documents in 4 buckets of round(2.5) = 3; the last takes the rest.
    assert_eq!(
        shape,
        vec![
            (Bson::Int32(1), Bson::Int32(4), 3),
            (Bson::Int32(4), Bson::Int32(7), 3),
            (Bson::Int32(7), Bson::Int32(10), 3),
            (Bson::Int32(10), Bson::Int32(10), 1),
        ]
    );
    // Equal values never straddle buckets.
    let same: Vec<Document> = (0..6).map(|i| doc! {"_id": i, "v": i / 3}).collect();
    let out = ok(
        vec![doc! {"$bucketAuto": {"groupBy": "$v", "buckets": 5}}],
        same,
    );
    assert_eq!(out.len(), 2);
    let g = ok(
        vec![doc! {"$bucketAuto": {"groupBy": "$price", "buckets": 2, "granularity": "POWERSOF2"}}],
        docs.clone(),
    );
    assert_eq!(
        g[0].get_document("_id").expect("id"),
        &doc! {"min": 0.5_f64, "max": 8}
    );
    assert_eq!(
        parse_code(vec![doc! {"$bucketAuto": {"groupBy": "$p", "buckets": 0}}]),
        40243
    );
    assert_eq!(
        parse_code(vec![doc! {"$bucketAuto": {"groupBy": "$p"}}]),
        40246
    );

    let tags = vec![
        doc! {"tags": ["a", "b"]},
        doc! {"tags": ["a"]},
        doc! {"tags": ["c", "a", "b"]},
    ];
    let out = ok(
        vec![doc! {"$unwind": "$tags"}, doc! {"$sortByCount": "$tags"}],
        tags,
    );
    assert_eq!(out[0], doc! {"_id": "a", "count": 3});
    assert_eq!(out[1], doc! {"_id": "b", "count": 2});
    assert_eq!(parse_code(vec![doc! {"$sortByCount": "tags"}]), 40148);
}

// ---------------------------------------------------------------- $sample, $replaceRoot, $documents

#[test]
fn sample_is_without_replacement() {
    let docs: Vec<Document> = (0..200).map(|i| doc! {"_id": i}).collect();
    let out = ok(vec![doc! {"$sample": {"size": 50}}], docs.clone());
    let mut seen: Vec<i32> = out.iter().map(|d| d.get_i32("_id").expect("id")).collect();
    seen.sort_unstable();
    seen.dedup();
    assert_eq!(seen.len(), 50);
    assert_eq!(ok(vec![doc! {"$sample": {"size": 500}}], docs).len(), 200);
    assert_eq!(parse_code(vec![doc! {"$sample": {"size": -1}}]), 28747);
    assert_eq!(parse_code(vec![doc! {"$sample": {}}]), 28749);
    assert_eq!(
        parse_code(vec![doc! {"$sample": {"size": 1, "x": 1}}]),
        28748
    );
    assert_eq!(parse_code(vec![doc! {"$sample": 3}]), 28745);
}

#[test]
fn sample_over_the_memory_limit_spills_through_the_sorter() {
    use crate::query::aggregate::test_support::streamed;
    // 40 documents of ~1 KiB, a 4 KiB limit: a sample of 10 cannot be held.
    let docs: Vec<Document> = (0..40)
        .map(|i| doc! {"_id": i, "pad": "x".repeat(1000)})
        .collect();
    let p = [doc! {"$sample": {"size": 10}}];
    let e = streamed(&p, &docs, 4096, false).expect_err("over the limit");
    assert_eq!(e.code(), 292);
    assert!(
        e.to_string()
            .starts_with("Sort exceeded memory limit of 4096 bytes"),
        "{e}"
    );
    let mut picked = [0u32; 40];
    for _ in 0..300 {
        let out = streamed(&p, &docs, 4096, true).expect("spilled");
        let mut ids: Vec<i32> = out.iter().map(|d| d.get_i32("_id").expect("id")).collect();
        assert_eq!(ids.len(), 10);
        assert!(out
            .iter()
            .all(|d| d.get_str("pad").is_ok_and(|s| s.len() == 1000)));
        ids.sort_unstable();
        ids.dedup();
        assert_eq!(ids.len(), 10, "without replacement");
        for i in ids {
            picked[i as usize] += 1;
        }
    }
    // Every document can be drawn, early and late ones alike (a document
    // missed in 300 draws of 10 of 40 has probability (3/4)^300 < 1e-37):
    // the spilled runs do not favour one part of the input.
    assert!(picked.iter().all(|&n| n > 0), "{picked:?}");
    // Each is drawn 75 times on average; none is drawn every time.
    assert!(picked.iter().all(|&n| n < 300), "{picked:?}");
    // A sample larger than the input is all of it, spilled or not.
    let all = streamed(&[doc! {"$sample": {"size": 100}}], &docs, 4096, true).expect("all");
    assert_eq!(all.len(), 40);
}

#[test]
fn replace_root_and_documents() {
    let people = vec![
        doc! {"_id": 1, "name": "Arlene", "age": 34, "pets": {"dogs": 2, "cats": 1}},
        doc! {"_id": 2, "name": "Sam", "age": 41, "pets": {"cats": 1, "fish": 3}},
    ];
    let out = ok(
        vec![
            doc! {"$replaceRoot": {"newRoot": {"$mergeObjects": [{"dogs": 0, "cats": 0, "birds": 0, "fish": 0}, "$pets"]}}},
        ],
        people.clone(),
    );
    assert_eq!(out[0], doc! {"dogs": 2, "cats": 1, "birds": 0, "fish": 0});
    let out = ok(vec![doc! {"$replaceWith": "$pets"}], people.clone());
    assert_eq!(out[1], doc! {"cats": 1, "fish": 3});
    assert_eq!(
        code(vec![doc! {"$replaceWith": "$name"}], people.clone()),
        40228
    );
    assert_eq!(
        code(vec![doc! {"$replaceRoot": {"newRoot": "$nope"}}], people),
        40228
    );
    assert_eq!(parse_code(vec![doc! {"$replaceRoot": {}}]), 40414);

    let out = ok(
        vec![
            doc! {"$documents": [{"x": 10}, {"x": 2}, {"x": 5}]},
            doc! {"$sort": {"x": 1}},
        ],
        Vec::new(),
    );
    assert_eq!(
        ids(&out, "x"),
        vec![Bson::Int32(2), Bson::Int32(5), Bson::Int32(10)]
    );
    assert_eq!(
        parse_code(vec![doc! {"$match": {}}, doc! {"$documents": []}]),
        40602
    );
    assert_eq!(code(vec![doc! {"$documents": 1}], Vec::new()), 5858203);
    assert_eq!(parse_code(vec![doc! {"$planCacheStats": {}}]), 115);
}

// ---------------------------------------------------------------- $setWindowFields

fn cake_sales() -> Vec<Document> {
    vec![
        doc! {"_id": 0, "type": "chocolate", "orderDate": date("2020-05-18T14:10:30Z"), "state": "CA", "price": 13, "quantity": 120},
        doc! {"_id": 1, "type": "chocolate", "orderDate": date("2021-03-20T11:30:05Z"), "state": "WA", "price": 14, "quantity": 140},
        doc! {"_id": 2, "type": "vanilla", "orderDate": date("2021-01-11T06:31:15Z"), "state": "CA", "price": 12, "quantity": 145},
        doc! {"_id": 3, "type": "vanilla", "orderDate": date("2020-02-08T13:13:23Z"), "state": "WA", "price": 13, "quantity": 104},
        doc! {"_id": 4, "type": "strawberry", "orderDate": date("2019-05-18T16:09:01Z"), "state": "CA", "price": 41, "quantity": 162},
        doc! {"_id": 5, "type": "strawberry", "orderDate": date("2019-01-08T06:12:03Z"), "state": "WA", "price": 43, "quantity": 134},
    ]
}

#[test]
fn window_cumulative_sum_as_documented() {
    let out = ok(
        vec![doc! {"$setWindowFields": {
            "partitionBy": "$state",
            "sortBy": {"orderDate": 1},
            "output": {"cumulativeQuantityForState": {"$sum": "$quantity", "window": {"documents": ["unbounded", "current"]}}}
        }}],
        cake_sales(),
    );
    assert_eq!(
        ids(&out, "_id"),
        [4, 0, 2, 5, 3, 1].map(Bson::Int32).to_vec()
    );
    assert_eq!(
        ids(&out, "cumulativeQuantityForState"),
        [162, 282, 427, 134, 238, 378].map(Bson::Int32).to_vec()
    );
    // A sliding window, an average over the whole partition, a range window.
    let out = ok(
        vec![doc! {"$setWindowFields": {
            "partitionBy": "$state",
            "sortBy": {"orderDate": 1},
            "output": {
                "moving": {"$sum": "$quantity", "window": {"documents": [-1, 0]}},
                "avg": {"$avg": "$quantity"},
                "lastYear": {"$sum": "$quantity", "window": {"range": [-1, 0], "unit": "year"}},
                "list": {"$push": "$_id", "window": {"documents": [0, 1]}},
            }
        }}],
        cake_sales(),
    );
    assert_eq!(
        ids(&out, "moving"),
        [162, 282, 265, 134, 238, 244].map(Bson::Int32).to_vec()
    );
    assert_eq!(out[0].get_f64("avg").expect("avg"), 427.0 / 3.0);
    // CA 2021-01-11 looks back to 2020-01-11: the 2020-05-18 order and itself.
    assert_eq!(out[2].get_i32("lastYear").expect("range"), 265);
    assert_eq!(
        out[2].get_array("list").expect("list"),
        &vec![Bson::Int32(2)]
    );
}

#[test]
fn window_rank_shift_and_document_number() {
    let out = ok(
        vec![doc! {"$setWindowFields": {
            "partitionBy": "$state",
            "sortBy": {"quantity": -1},
            "output": {
                "rank": {"$rank": {}},
                "dense": {"$denseRank": {}},
                "n": {"$documentNumber": {}},
                "prev": {"$shift": {"output": "$quantity", "by": -1, "default": "Not available"}},
            }
        }}],
        cake_sales(),
    );
    assert_eq!(
        ids(&out, "quantity"),
        [162, 145, 120, 140, 134, 104].map(Bson::Int32).to_vec()
    );
    assert_eq!(
        ids(&out, "rank"),
        [1, 2, 3, 1, 2, 3].map(Bson::Int64).to_vec()
    );
    assert_eq!(
        ids(&out, "prev"),
        vec![
            Bson::String("Not available".into()),
            Bson::Int32(162),
            Bson::Int32(145),
            Bson::String("Not available".into()),
            Bson::Int32(140),
            Bson::Int32(134),
        ]
    );
    // Ties share a rank; rank leaves gaps, denseRank does not.
    let tied = vec![
        doc! {"_id": 1, "s": 10},
        doc! {"_id": 2, "s": 20},
        doc! {"_id": 3, "s": 10},
        doc! {"_id": 4, "s": 30},
    ];
    let out = ok(
        vec![doc! {"$setWindowFields": {"sortBy": {"s": 1}, "output": {
            "r": {"$rank": {}}, "d": {"$denseRank": {}}, "n": {"$documentNumber": {}}
        }}}],
        tied,
    );
    assert_eq!(ids(&out, "r"), [1, 1, 3, 4].map(Bson::Int64).to_vec());
    assert_eq!(ids(&out, "d"), [1, 1, 2, 3].map(Bson::Int64).to_vec());
    assert_eq!(ids(&out, "n"), [1, 2, 3, 4].map(Bson::Int64).to_vec());
    let w = |spec: Document| parse_code(vec![doc! {"$setWindowFields": spec}]);
    assert_eq!(w(doc! {"output": {"r": {"$rank": {}}}}), 5371602);
    assert_eq!(
        w(doc! {"sortBy": {"a": 1}, "output": {"r": {"$nope": 1}}}),
        9
    );
    assert_eq!(
        w(doc! {"sortBy": {"a": 1}, "output": {"r": {"$sum": 1, "window": {"documents": [1, 0]}}}}),
        5339900
    );
    assert_eq!(
        w(doc! {"output": {"r": {"$sum": 1, "window": {"range": [0, 1]}}}}),
        5339902
    );
    assert_eq!(w(doc! {"sortBy": {"a": 1}}), 40414);
}

fn f64s(docs: &[Document], field: &str) -> Vec<f64> {
    docs.iter()
        .map(|d| d.get_f64(field).unwrap_or(f64::NAN))
        .collect()
}

fn close(got: &[f64], want: &[f64]) {
    assert_eq!(got.len(), want.len(), "{got:?} vs {want:?}");
    for (g, w) in got.iter().zip(want) {
        assert!(
            (g - w).abs() <= 1e-9 * w.abs().max(1.0),
            "{got:?} vs {want:?}"
        );
    }
}

#[test]
fn window_derivative_and_integral_as_documented() {
    // MongoDB's documented examples: truck speeds from odometer readings and
    // kilowatt-hours from power readings, 30 s apart.
    let t = [
        "2020-05-18T14:10:30Z",
        "2020-05-18T14:11:00Z",
        "2020-05-18T14:11:30Z",
        "2020-05-18T14:12:00Z",
    ];
    let mut fleet = Vec::new();
    for (id, miles) in [
        ("1", [1295.1, 1295.63, 1296.25, 1298.9]),
        ("2", [10234.1, 10234.33, 10234.73, 10235.13]),
    ] {
        for (ts, m) in t.iter().zip(miles) {
            fleet.push(doc! {"truckID": id, "timeStamp": date(ts), "miles": m});
        }
    }
    let out = ok(
        vec![doc! {"$setWindowFields": {
            "partitionBy": "$truckID", "sortBy": {"timeStamp": 1},
            "output": {"speed": {"$derivative": {"input": "$miles", "unit": "hour"},
                                 "window": {"range": [-30, 0], "unit": "second"}}}
        }}],
        fleet.clone(),
    );
    assert_eq!(
        out[0].get("speed"),
        Some(&Bson::Null),
        "one reading: no rate"
    );
    let mph = |a: f64, b: f64| (b - a) * 120.0;
    close(
        &f64s(&out[1..4], "speed"),
        &[
            mph(1295.1, 1295.63),
            mph(1295.63, 1296.25),
            mph(1296.25, 1298.9),
        ],
    );
    let mut power = Vec::new();
    for (id, kw) in [
        ("1", [2.95, 2.7, 2.6, 2.98]),
        ("2", [2.5, 2.25, 2.75, 2.82]),
    ] {
        for (ts, k) in t.iter().zip(kw) {
            power.push(doc! {"powerMeterID": id, "timeStamp": date(ts), "kilowatts": k});
        }
    }
    let out = ok(
        vec![doc! {"$setWindowFields": {
            "partitionBy": "$powerMeterID", "sortBy": {"timeStamp": 1},
            "output": {"kwh": {"$integral": {"input": "$kilowatts", "unit": "hour"},
                               "window": {"range": ["unbounded", "current"], "unit": "minute"}}}
        }}],
        power,
    );
    // 30 s trapezoids in hours: (k0 + k1) / 2 * 30 / 3600, accumulated.
    let trap = |a: f64, b: f64| (a + b) / 2.0 * 30.0 / 3600.0;
    let (a, b, c) = (trap(2.95, 2.7), trap(2.7, 2.6), trap(2.6, 2.98));
    close(&f64s(&out[..4], "kwh"), &[0.0, a, a + b, a + b + c]);
    assert!(
        (a - 0.0235416666666666).abs() < 1e-12,
        "MongoDB's documented first step"
    );
    // Without a unit the x axis is the number itself; a sliding integral.
    let pts = vec![
        doc! {"x": 0, "y": 0},
        doc! {"x": 2, "y": 2},
        doc! {"x": 3, "y": 0},
        doc! {"x": 5, "y": 4},
    ];
    let out = ok(
        vec![doc! {"$setWindowFields": {"sortBy": {"x": 1}, "output": {
            "area": {"$integral": {"input": "$y"}},
            "slide": {"$integral": {"input": "$y"}, "window": {"documents": [-1, 0]}},
            "d": {"$derivative": {"input": "$y"}, "window": {"documents": [-1, 1]}},
        }}}],
        pts,
    );
    close(&f64s(&out, "area"), &[7.0, 7.0, 7.0, 7.0]);
    close(&f64s(&out, "slide"), &[0.0, 2.0, 1.0, 4.0]);
    close(&f64s(&out, "d"), &[1.0, 0.0, 2.0 / 3.0, 2.0]);
    // MongoDB's errors.
    let w = |spec: Document| parse_code(vec![doc! {"$setWindowFields": spec}]);
    assert_eq!(
        w(doc! {"sortBy": {"x": 1}, "output": {"d": {"$derivative": {"input": "$y"}}}}),
        9
    );
    assert_eq!(w(doc! {"output": {"d": {"$integral": {"input": "$y"}}}}), 9);
    assert_eq!(
        w(doc! {"sortBy": {"x": 1, "y": 1}, "output": {"d": {"$integral": {"input": "$y"}}}}),
        9
    );
    assert_eq!(
        w(
            doc! {"sortBy": {"x": 1}, "output": {"d": {"$integral": {"input": "$y", "unit": "month"}}}}
        ),
        5490710
    );
    assert_eq!(
        w(doc! {"sortBy": {"x": 1}, "output": {"d": {"$integral": {"input": "$y", "bogus": 1}}}}),
        9
    );
    let run = |out: Document, docs: Vec<Document>| {
        code(
            vec![doc! {"$setWindowFields": {"sortBy": {"x": 1}, "output": out}}],
            docs,
        )
    };
    let dated = vec![
        doc! {"x": date("2020-01-01T00:00:00Z"), "y": 1},
        doc! {"x": date("2020-01-02T00:00:00Z"), "y": 2},
    ];
    assert_eq!(
        run(
            doc! {"d": {"$derivative": {"input": "$y"}, "window": {"documents": [-1, 0]}}},
            dated.clone()
        ),
        5624901
    );
    assert_eq!(
        run(doc! {"d": {"$integral": {"input": "$y"}}}, dated),
        5423902
    );
    let numeric = vec![doc! {"x": 1, "y": 1}, doc! {"x": 2, "y": 2}];
    assert_eq!(
        run(
            doc! {"d": {"$integral": {"input": "$y", "unit": "day"}}},
            numeric.clone()
        ),
        5423901
    );
    assert_eq!(
        run(
            doc! {"d": {"$derivative": {"input": "$y", "unit": "day"}, "window": {"documents": [-1, 0]}}},
            numeric
        ),
        5624900
    );
    let missing = vec![doc! {"x": 1, "y": 1}, doc! {"x": 2}];
    assert_eq!(
        run(
            doc! {"d": {"$derivative": {"input": "$y"}, "window": {"documents": [-1, 0]}}},
            missing.clone()
        ),
        5624903
    );
    assert_eq!(
        run(doc! {"d": {"$integral": {"input": "$y"}}}, missing),
        5423900
    );
}

#[test]
fn window_exp_moving_avg_as_documented() {
    let mut prices = Vec::new();
    for (stock, p) in [
        ("MDB", [13.0, 15.4, 12.0, 11.7]),
        ("MSFT", [82.0, 45.2, 22.0, 23.7]),
    ] {
        for (day, v) in p.iter().enumerate() {
            prices.push(doc! {"stock": stock, "day": day as i32, "price": v});
        }
    }
    let out = ok(
        vec![
            doc! {"$setWindowFields": {"partitionBy": "$stock", "sortBy": {"day": 1}, "output": {
                "n2": {"$expMovingAvg": {"input": "$price", "N": 2}},
                "a75": {"$expMovingAvg": {"input": "$price", "alpha": 0.75}},
            }}},
        ],
        prices,
    );
    let ema = |xs: &[f64], a: f64| {
        let mut r = xs[0];
        let mut v = vec![r];
        for x in &xs[1..] {
            r = x * a + r * (1.0 - a);
            v.push(r);
        }
        v
    };
    close(
        &f64s(&out[..4], "n2"),
        &ema(&[13.0, 15.4, 12.0, 11.7], 2.0 / 3.0),
    );
    close(
        &f64s(&out[4..], "a75"),
        &ema(&[82.0, 45.2, 22.0, 23.7], 0.75),
    );
    // Non-numeric inputs are skipped: the average so far is repeated.
    let out = ok(
        vec![
            doc! {"$setWindowFields": {"sortBy": {"d": 1}, "output": {"e": {"$expMovingAvg": {"input": "$v", "alpha": 0.5}}}}},
        ],
        vec![
            doc! {"d": 1, "v": "x"},
            doc! {"d": 2, "v": 4},
            doc! {"d": 3},
            doc! {"d": 4, "v": 8},
        ],
    );
    assert_eq!(out[0].get("e"), Some(&Bson::Null));
    close(&f64s(&out[1..], "e"), &[4.0, 4.0, 6.0]);
    let w = |spec: Document| parse_code(vec![doc! {"$setWindowFields": spec}]);
    let e = |arg: Document| w(doc! {"sortBy": {"d": 1}, "output": {"e": {"$expMovingAvg": arg}}});
    assert_eq!(e(doc! {"input": "$v"}), 9);
    assert_eq!(e(doc! {"input": "$v", "N": 2, "alpha": 0.5}), 9);
    assert_eq!(e(doc! {"input": "$v", "N": 0}), 9);
    assert_eq!(e(doc! {"input": "$v", "N": 2.5}), 9);
    assert_eq!(e(doc! {"input": "$v", "alpha": 1}), 9);
    assert_eq!(
        w(doc! {"output": {"e": {"$expMovingAvg": {"input": "$v", "N": 2}}}}),
        9
    );
    assert_eq!(
        w(
            doc! {"sortBy": {"d": 1}, "output": {"e": {"$expMovingAvg": {"input": "$v", "N": 2}, "window": {"documents": [-1, 0]}}}}
        ),
        9
    );
}

#[test]
fn window_covariance_matches_a_direct_computation() {
    let out = ok(
        vec![doc! {"$setWindowFields": {
            "partitionBy": "$state", "sortBy": {"orderDate": 1},
            "output": {
                "pop": {"$covariancePop": [{"$year": "$orderDate"}, "$quantity"], "window": {"documents": ["unbounded", "current"]}},
                "samp": {"$covarianceSamp": [{"$year": "$orderDate"}, "$quantity"], "window": {"documents": ["unbounded", "current"]}},
                "whole": {"$covariancePop": ["$price", "$quantity"]},
            }
        }}],
        cake_sales(),
    );
    let cov = |pts: &[(f64, f64)], sample: bool| {
        let n = pts.len() as f64;
        let (mx, my) = (
            pts.iter().map(|p| p.0).sum::<f64>() / n,
            pts.iter().map(|p| p.1).sum::<f64>() / n,
        );
        pts.iter().map(|p| (p.0 - mx) * (p.1 - my)).sum::<f64>() / if sample { n - 1.0 } else { n }
    };
    for part in [&out[..3], &out[3..]] {
        let pts: Vec<(f64, f64)> = part
            .iter()
            .map(|d| {
                let ms = d
                    .get_datetime("orderDate")
                    .expect("date")
                    .timestamp_millis();
                let y = chrono::DateTime::from_timestamp_millis(ms)
                    .expect("ms")
                    .format("%Y")
                    .to_string();
                (
                    y.parse::<f64>().expect("year"),
                    f64::from(d.get_i32("quantity").expect("q")),
                )
            })
            .collect();
        let pops: Vec<f64> = (1..=3).map(|k| cov(&pts[..k], false)).collect();
        close(&f64s(part, "pop"), &pops);
        assert_eq!(
            part[0].get("samp"),
            Some(&Bson::Null),
            "one pair: no sample covariance"
        );
        let samps: Vec<f64> = (2..=3).map(|k| cov(&pts[..k], true)).collect();
        close(&f64s(&part[1..], "samp"), &samps);
        let whole: Vec<(f64, f64)> = part
            .iter()
            .map(|d| {
                (
                    f64::from(d.get_i32("price").expect("p")),
                    f64::from(d.get_i32("quantity").expect("q")),
                )
            })
            .collect();
        close(&f64s(part, "whole"), &[cov(&whole, false); 3]);
    }
    // Pairs that are not two numbers are skipped; no pair at all is null.
    let out = ok(
        vec![doc! {"$setWindowFields": {"output": {"c": {"$covariancePop": ["$x", "$y"]}}}}],
        vec![doc! {"x": 1, "y": "a"}, doc! {"x": 2}],
    );
    assert_eq!(out[0].get("c"), Some(&Bson::Null));
}

// ---------------------------------------------------------------- $densify, $fill

#[test]
fn densify_numbers_and_dates() {
    let out = ok(
        vec![doc! {"$densify": {"field": "v", "range": {"step": 2, "bounds": "full"}}}],
        vec![doc! {"v": 1}, doc! {"v": 7}, doc! {"v": 3}],
    );
    assert_eq!(ids(&out, "v"), [1, 3, 5, 7].map(Bson::Int32).to_vec());
    let weather = vec![
        doc! {"timestamp": date("2021-05-18T00:00:00Z"), "temp": 12},
        doc! {"timestamp": date("2021-05-18T04:00:00Z"), "temp": 11},
        doc! {"timestamp": date("2021-05-18T08:00:00Z"), "temp": 10},
        doc! {"timestamp": date("2021-05-18T12:00:00Z"), "temp": 12},
    ];
    let out = ok(
        vec![doc! {"$densify": {"field": "timestamp", "range": {
            "step": 1, "unit": "hour",
            "bounds": [date("2021-05-18T00:00:00Z"), date("2021-05-18T08:00:00Z")]
        }}}],
        weather,
    );
    // 4 input documents and 6 generated hours (01–03, 05–07).
    assert_eq!(out.len(), 10);
    assert_eq!(out[1], doc! {"timestamp": date("2021-05-18T01:00:00Z")});
    assert_eq!(out[4].get_i32("temp").expect("temp"), 11);
    // Per partition.
    let out = ok(
        vec![
            doc! {"$densify": {"field": "v", "partitionByFields": ["p"], "range": {"step": 1, "bounds": "partition"}}},
        ],
        vec![
            doc! {"p": "a", "v": 1},
            doc! {"p": "a", "v": 3},
            doc! {"p": "b", "v": 10},
            doc! {"p": "b", "v": 12},
        ],
    );
    assert_eq!(out.len(), 6);
    assert_eq!(out[1], doc! {"p": "a", "v": 2});
    assert_eq!(
        parse_code(vec![
            doc! {"$densify": {"field": "v", "range": {"step": 0, "bounds": "full"}}}
        ]),
        5733401
    );
}

#[test]
fn fill_value_locf_and_linear() {
    let out = ok(
        vec![doc! {"$fill": {
            "sortBy": {"t": 1},
            "output": {"price": {"method": "linear"}, "qty": {"method": "locf"}, "note": {"value": "none"}}
        }}],
        vec![
            doc! {"t": 0, "price": 20, "qty": 5},
            doc! {"t": 1, "price": null, "qty": null},
            doc! {"t": 2, "qty": null, "note": "x"},
            doc! {"t": 3, "price": 26, "qty": 7},
        ],
    );
    assert_eq!(
        ids(&out, "price"),
        vec![
            Bson::Int32(20),
            Bson::Double(22.0),
            Bson::Double(24.0),
            Bson::Int32(26)
        ]
    );
    assert_eq!(ids(&out, "qty"), [5, 5, 5, 7].map(Bson::Int32).to_vec());
    assert_eq!(
        ids(&out, "note"),
        vec![
            Bson::String("none".into()),
            Bson::String("none".into()),
            Bson::String("x".into()),
            Bson::String("none".into())
        ]
    );
    assert_eq!(
        parse_code(vec![
            doc! {"$fill": {"output": {"a": {"method": "linear"}}}}
        ]),
        6050204
    );
}

// ---------------------------------------------------------------- positions, let, output specs

#[test]
fn stage_positions_and_command_let() {
    assert_eq!(
        parse_code(vec![doc! {"$out": "a"}, doc! {"$match": {}}]),
        40601
    );
    assert_eq!(
        parse_code(vec![doc! {"$merge": "a"}, doc! {"$match": {}}]),
        40601
    );
    assert_eq!(parse_code(vec![doc! {"$out": 1}]), 16990);
    assert_eq!(parse_code(vec![doc! {"$merge": 1}]), 51182);
    assert_eq!(parse_code(vec![doc! {"$merge": {"on": "a"}}]), 40414);
    assert_eq!(
        parse_code(vec![doc! {"$merge": {"into": "a", "whenMatched": "bogus"}}]),
        2
    );
    assert_eq!(
        parse_code(vec![
            doc! {"$merge": {"into": "a", "whenMatched": [{"$group": {"_id": 1}}]}}
        ]),
        72
    );
    assert_eq!(
        parse_code(vec![doc! {"$merge": {"into": "a", "let": {"x": 1}}}]),
        51199
    );
    // The command's `let` reaches every stage.
    let vars = doc! {"limit": 2, "tag": "even"};
    let p = Pipeline::parse_with_let(
        &[
            doc! {"$match": {"$expr": {"$eq": ["$tag", "$$tag"]}}},
            doc! {"$addFields": {"over": {"$gt": ["$v", "$$limit"]}}},
            doc! {"$group": {"_id": "$over", "n": {"$sum": 1}}},
            doc! {"$sort": {"_id": 1}},
        ],
        Some(&vars),
    )
    .expect("parse");
    let docs: Vec<Document> = (0..6)
        .map(|v| doc! {"v": v, "tag": if v % 2 == 0 { "even" } else { "odd" }})
        .collect();
    let out = p.run_on(docs).expect("run");
    assert_eq!(
        out,
        vec![doc! {"_id": false, "n": 2}, doc! {"_id": true, "n": 1}]
    );
    // The leading `$match` carries its variables into the scan filter.
    let split = Pipeline::parse_with_let(
        &[doc! {"$match": {"$expr": {"$eq": ["$tag", "$$tag"]}}}],
        Some(&vars),
    )
    .expect("parse")
    .split();
    let f = split.scan_filter.expect("filter");
    Filter::parse(&f).expect("self-contained");
}

#[test]
fn merge_versions() {
    let spec = |m: Document| match Output::parse_merge(
        &Bson::Document(m),
        &ParseCtx::new(None).expect("ctx"),
    )
    .expect("parse")
    {
        Output::Merge(s) => s,
        Output::Out { .. } => unreachable!("a $merge"),
    };
    let old = doc! {"_id": 1, "a": 1, "b": 1};
    let new = doc! {"_id": 1, "b": 2, "c": 3};
    let m =
        |s: &MergeSpec, old: Option<&Document>, new: Document| merged_version(s, "db.t", old, new);
    let s = spec(doc! {"into": "t"});
    assert_eq!(
        m(&s, Some(&old), new.clone()).expect("merge"),
        Some(doc! {"_id": 1, "a": 1, "b": 2, "c": 3})
    );
    let s = spec(doc! {"into": "t", "whenMatched": "replace"});
    assert_eq!(
        m(&s, Some(&old), new.clone()).expect("replace"),
        Some(new.clone())
    );
    let s = spec(doc! {"into": "t", "whenMatched": "keepExisting", "whenNotMatched": "discard"});
    assert_eq!(m(&s, Some(&old), new.clone()).expect("keep"), None);
    assert_eq!(m(&s, None, new.clone()).expect("discard"), None);
    let s = spec(doc! {"into": "t", "whenMatched": "fail", "whenNotMatched": "fail"});
    assert_eq!(
        m(&s, Some(&old), new.clone()).expect_err("fail").code(),
        11000
    );
    assert_eq!(m(&s, None, new.clone()).expect_err("fail").code(), 13113);
    let s = spec(doc! {"into": "t", "on": "a", "whenMatched": "replace"});
    assert_eq!(
        m(&s, Some(&old), doc! {"_id": 2, "a": 1})
            .expect_err("_id")
            .code(),
        66
    );
    assert_eq!(
        m(&s, Some(&old), doc! {"a": 1, "z": 1}).expect("keeps _id"),
        Some(doc! {"_id": 1, "a": 1, "z": 1})
    );
    let s = spec(doc! {"into": "t", "whenMatched": [{"$set": {"b": {"$add": ["$b", "$$new.b"]}}}]});
    assert_eq!(
        m(&s, Some(&old), new.clone()).expect("pipeline"),
        Some(doc! {"_id": 1, "a": 1, "b": 3})
    );
    let s =
        spec(doc! {"into": "t", "let": {"inc": "$c"}, "whenMatched": [{"$set": {"b": "$$inc"}}]});
    assert_eq!(
        m(&s, Some(&old), new).expect("let"),
        Some(doc! {"_id": 1, "a": 1, "b": 3})
    );
    assert_eq!(
        s.on_values(&doc! {"x": 1}).expect_err("no _id").code(),
        51132
    );
    assert_eq!(
        s.on_values(&doc! {"_id": [1]}).expect_err("array").code(),
        51132
    );
}

/// `$redact`: the manual's two examples (descend by tag intersection;
/// prune by level, arrays of subdocuments included), `$$ROOT` staying the
/// whole document while field paths follow the level, `$$KEEP`, 17053,
/// and `$$KEEP` unknown outside the stage (17276).
#[test]
fn redact_as_the_manual() {
    let forecast = doc! {
        "_id": 1, "title": "123 Department Report", "tags": ["G", "STLW"], "year": 2014,
        "subsections": [
            {"subtitle": "Section 1: Overview", "tags": ["SI", "G"], "content": "Section 1"},
            {"subtitle": "Section 2: Analysis", "tags": ["STLW"], "content": "Section 2"},
            {"subtitle": "Section 3: Budgeting", "tags": ["TK"],
             "content": {"text": "Section 3", "tags": ["HCS"]}},
        ],
    };
    let by_tags = doc! {"$redact": {"$cond": {
    "if": {"$gt": [{"$size": {"$setIntersection": ["$tags", ["STLW", "G"]]}}, 0]},
    "then": "$$DESCEND", "else": "$$PRUNE"}}};
    let out = ok(
        vec![doc! {"$match": {"year": 2014}}, by_tags],
        vec![forecast],
    );
    assert_eq!(
        out,
        vec![doc! {
            "_id": 1, "title": "123 Department Report", "tags": ["G", "STLW"], "year": 2014,
            "subsections": [
                {"subtitle": "Section 1: Overview", "tags": ["SI", "G"], "content": "Section 1"},
                {"subtitle": "Section 2: Analysis", "tags": ["STLW"], "content": "Section 2"},
            ],
        }]
    );
    let account = doc! {
        "_id": 1, "level": 1, "acct_id": "xyz123",
        "cc": {"level": 5, "type": "yy", "num": 0,
               "billing_addr": {"level": 5, "addr1": "123 ABC Street"},
               "shipping_addr": [{"level": 3, "addr1": "987 XYZ Ave"}, {"level": 3, "addr1": "PO Box 0123"}]},
        "other": [[{"level": 5}, {"level": 2, "x": 1}], 7],
        "status": "A",
    };
    let by_level = doc! {"$redact": {"$cond": {
    "if": {"$eq": ["$level", 5]}, "then": "$$PRUNE", "else": "$$DESCEND"}}};
    assert_eq!(
        ok(vec![by_level], vec![account.clone()]),
        vec![doc! {"_id": 1, "level": 1, "acct_id": "xyz123",
        "other": [[{"level": 2, "x": 1}], 7], "status": "A"}]
    );
    // `$$ROOT` is the whole document at every level: descend while the
    // top level's status is "A" prunes nothing.
    let by_root =
        doc! {"$redact": {"$cond": [{"$eq": ["$$ROOT.status", "A"]}, "$$DESCEND", "$$PRUNE"]}};
    assert_eq!(
        ok(vec![by_root], vec![account.clone()]),
        vec![account.clone()]
    );
    assert_eq!(
        ok(vec![doc! {"$redact": "$$KEEP"}], vec![account.clone()]),
        vec![account.clone()]
    );
    assert!(ok(vec![doc! {"$redact": "$$PRUNE"}], vec![account.clone()]).is_empty());
    assert_eq!(code(vec![doc! {"$redact": "$level"}], vec![account]), 17053);
    assert_eq!(parse_code(vec![doc! {"$project": {"a": "$$KEEP"}}]), 17276);
}
