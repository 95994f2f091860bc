//! The embedded API end to end: CRUD, errors with MongoDB codes, indexes and the
//! planner's choices, collections and databases.

use duetdb::bson::{doc, Bson};
use duetdb::{
    Database, Engine, Error, FindAndModifyOptions, IndexOptions, ReturnDocument, UpdateOptions,
};

fn people() -> duetdb::Collection {
    let db = Database::in_memory();
    let c = db.collection("people");
    c.insert_many(
        vec![
            doc! {"_id": 1, "name": "ada", "age": 36, "tags": ["math", "code"]},
            doc! {"_id": 2, "name": "bob", "age": 25},
            doc! {"_id": 3, "name": "cy", "age": 41, "tags": ["code"]},
        ],
        true,
    )
    .expect("seed");
    c
}

#[test]
fn insert_generates_id_and_rejects_duplicates() {
    let c = people();
    let id = c.insert_one(doc! {"name": "dee"}).expect("insert");
    assert!(matches!(id, Bson::ObjectId(_)));
    let err = c
        .insert_one(doc! {"_id": 1.0, "name": "dup"})
        .expect_err("1.0 collides with 1");
    assert_eq!(err.code(), 11000);
    assert!(err.to_string().contains("dup key"), "{err}");
    assert_eq!(c.count(doc! {}).expect("count"), 4);
}

#[test]
fn insert_many_ordered_and_unordered_report_positions() {
    let c = people();
    let err = c
        .insert_many(
            vec![doc! {"_id": 10}, doc! {"_id": 1}, doc! {"_id": 11}],
            true,
        )
        .expect_err("ordered stops at the duplicate");
    let Error::BulkWrite(f) = err else {
        panic!("expected BulkWrite")
    };
    assert_eq!(f.inserted, 1);
    assert_eq!(f.errors.len(), 1);
    assert_eq!(f.errors[0].0, 1);
    assert_eq!(
        c.count(doc! {"_id": 11}).expect("count"),
        0,
        "ordered batch stopped"
    );

    let err = c
        .insert_many(
            vec![
                doc! {"_id": 2},
                doc! {"_id": 20},
                doc! {"_id": [1]},
                doc! {"_id": 21},
            ],
            false,
        )
        .expect_err("unordered reports each failure");
    let Error::BulkWrite(f) = err else {
        panic!("expected BulkWrite")
    };
    assert_eq!(f.inserted, 2);
    assert_eq!(f.errors.iter().map(|e| e.0).collect::<Vec<_>>(), vec![0, 2]);
    assert_eq!(c.count(doc! {"_id": {"$in": [20, 21]}}).expect("count"), 2);
}

#[test]
fn update_type_error_leaves_document_unchanged() {
    let c = people();
    let err = c
        .update_many(doc! {}, doc! {"$inc": {"name": 1}})
        .expect_err("$inc on a string");
    assert_eq!(err.code(), 14);
    let ada = c.find_one(doc! {"_id": 1}).expect("find").expect("ada");
    assert_eq!(ada.get_str("name").expect("name"), "ada");
}

#[test]
fn update_many_is_atomic_on_unique_violation() {
    let c = people();
    for id in 1..=3 {
        c.update_one(doc! {"_id": id}, doc! {"$set": {"rank": id}})
            .expect("distinct ranks");
    }
    // Missing fields index as null, so a unique index needs every rank present.
    c.create_index(
        doc! {"rank": 1},
        IndexOptions {
            unique: true,
            ..Default::default()
        },
    )
    .expect("index");
    // Setting rank 5 on everyone collides on the second document: nothing changes.
    let before = c.find(doc! {}).run().expect("before");
    let err = c
        .update_many(doc! {}, doc! {"$set": {"rank": 5}})
        .expect_err("duplicate");
    assert_eq!(err.code(), 11000);
    assert_eq!(c.find(doc! {}).run().expect("after"), before);
    c.check_invariants().expect("invariants");
}

#[test]
fn upsert_seeds_from_filter() {
    let c = people();
    let r = c
        .update_one_with(
            doc! {"name": "eve"},
            doc! {"$set": {"age": 30}},
            UpdateOptions {
                upsert: true,
                ..Default::default()
            },
        )
        .expect("upsert");
    assert_eq!(r.matched, 0);
    assert!(r.upserted_id.is_some());
    let eve = c
        .find_one(doc! {"name": "eve"})
        .expect("find")
        .expect("eve");
    assert_eq!(eve.get_i32("age").expect("age"), 30);
}

#[test]
fn find_one_and_modify_variants() {
    let c = people();
    let opts = FindAndModifyOptions {
        sort: Some(doc! {"age": -1}),
        return_document: ReturnDocument::After,
        ..Default::default()
    };
    let oldest = c
        .find_one_and_update(doc! {}, doc! {"$inc": {"age": 1}}, opts)
        .expect("fam")
        .expect("a document");
    assert_eq!(oldest.get_i32("_id").expect("_id"), 3);
    assert_eq!(oldest.get_i32("age").expect("age"), 42);
    let gone = c
        .find_one_and_delete(doc! {"_id": 2}, Default::default())
        .expect("delete")
        .expect("bob");
    assert_eq!(gone.get_str("name").expect("name"), "bob");
    assert_eq!(c.count(doc! {}).expect("count"), 2);
    let replaced = c
        .find_one_and_replace(doc! {"_id": 1}, doc! {"name": "ada2"}, Default::default())
        .expect("replace")
        .expect("before image");
    assert_eq!(replaced.get_str("name").expect("name"), "ada");
    let now = c.find_one(doc! {"_id": 1}).expect("find").expect("ada2");
    assert_eq!(now, doc! {"_id": 1, "name": "ada2"});
}

#[test]
fn indexes_are_used_and_explained() {
    let c = people();
    c.create_index(doc! {"age": 1}, IndexOptions::default())
        .expect("index");
    let plan = c
        .find(doc! {"age": {"$gt": 30}})
        .explain()
        .expect("explain");
    let summary = plan
        .get_document("queryPlanner")
        .expect("qp")
        .get_str("summary")
        .expect("summary");
    assert_eq!(summary, "IXSCAN age_1");
    let plan = c.find(doc! {"name": "ada"}).explain().expect("explain");
    let summary = plan
        .get_document("queryPlanner")
        .expect("qp")
        .get_str("summary")
        .expect("summary");
    assert_eq!(summary, "COLLSCAN");
    let plan = c.find(doc! {"_id": 2}).explain().expect("explain");
    let summary = plan
        .get_document("queryPlanner")
        .expect("qp")
        .get_str("summary")
        .expect("summary");
    assert_eq!(summary, "IDHACK");
    let names: Vec<String> = c
        .list_indexes()
        .expect("list")
        .iter()
        .map(|d| d.get_str("name").expect("name").to_string())
        .collect();
    assert_eq!(names, vec!["_id_", "age_1"]);
    c.drop_index("age_1").expect("drop");
    assert_eq!(c.drop_index("age_1").expect_err("gone").code(), 27);
    assert_eq!(c.drop_index("_id_").expect_err("cannot").code(), 2);
}

#[test]
fn unique_index_build_over_duplicates_fails_cleanly() {
    let c = people();
    c.insert_one(doc! {"_id": 9, "name": "ada"})
        .expect("second ada");
    let err = c
        .create_index(
            doc! {"name": 1},
            IndexOptions {
                unique: true,
                ..Default::default()
            },
        )
        .expect_err("duplicates");
    assert_eq!(err.code(), 11000);
    assert_eq!(
        c.list_indexes().expect("list").len(),
        1,
        "no half-built index"
    );
}

#[test]
fn sort_skip_limit_projection() {
    let c = people();
    let docs = c
        .find(doc! {})
        .sort(doc! {"age": -1})
        .skip(1)
        .limit(1)
        .projection(doc! {"name": 1, "_id": 0})
        .run()
        .expect("find");
    assert_eq!(docs, vec![doc! {"name": "ada"}]);
}

#[test]
fn collections_and_databases() {
    let engine = Engine::in_memory();
    let db = engine.database("shop").expect("db");
    db.create_collection("orders").expect("create");
    assert_eq!(
        db.create_collection("orders").expect_err("exists").code(),
        48
    );
    assert_eq!(
        db.create_collection("bad$name")
            .expect_err("invalid")
            .code(),
        73
    );
    db.collection("items")
        .insert_one(doc! {"x": 1})
        .expect("implicit create");
    assert_eq!(db.list_collection_names(), vec!["items", "orders"]);
    let stats = db.collection("items").stats().expect("stats");
    assert_eq!(stats.count, 1);
    assert!(stats.data_bytes > 0);
    assert!(db.drop_collection("orders").expect("drop"));
    assert!(!db.drop_collection("orders").expect("drop again"));
    assert_eq!(engine.list_databases().len(), 1);
    assert!(engine.database("bad.name").is_err());
    assert!(engine.drop_database("shop"));
}

#[test]
fn distinct_values() {
    let c = people();
    let tags = c.distinct("tags", doc! {}).expect("distinct");
    assert_eq!(
        tags,
        vec![Bson::String("code".into()), Bson::String("math".into())]
    );
}

#[test]
fn bad_input_is_an_error_not_a_panic() {
    let c = people();
    assert!(c.find(doc! {"a": {"$nosuch": 1}}).run().is_err());
    assert!(c.update_one(doc! {}, doc! {"$nosuch": {"a": 1}}).is_err());
    assert!(
        c.update_one(doc! {}, doc! {"plain": 1}).is_err(),
        "update_one needs operators"
    );
    assert!(
        c.replace_one(doc! {}, doc! {"$set": {"a": 1}}).is_err(),
        "replace_one refuses operators"
    );
    assert!(c.find(doc! {}).sort(doc! {"a": 2}).run().is_err());
    assert!(c.find(doc! {}).hint("nope").run().is_err());
    assert!(c
        .create_index(doc! {"a": "2d"}, IndexOptions::default())
        .is_err());
    c.check_invariants().expect("untouched");
    assert_eq!(c.count(doc! {}).expect("count"), 3);
}

/// A top-k read in index order (YCSB's workload E: `_id >= k`, sorted by
/// `_id`, limited) runs under `auto` as a `cow` walk that stops at k, and
/// returns exactly what a full sort would.
#[test]
fn auto_top_k_in_index_order_stops_at_k() {
    let db = Database::in_memory();
    let c = db.collection("t");
    let docs: Vec<_> = (0..2000)
        .map(|i| doc! {"_id": format!("user{i:05}"), "v": i})
        .collect();
    c.insert_many(docs, true).expect("load");
    let out = c
        .find(doc! {"_id": {"$gte": "user01000"}})
        .sort(doc! {"_id": 1})
        .limit(10)
        .run_detailed()
        .expect("find");
    assert_eq!(out.scan.strategy, duetdb::Strategy::Cow);
    let ids: Vec<String> = out
        .docs
        .iter()
        .map(|d| {
            duetdb::raw::id_of(d)
                .and_then(|v| v.as_str())
                .unwrap_or("")
                .to_string()
        })
        .collect();
    let want: Vec<String> = (1000..1010).map(|i| format!("user{i:05}")).collect();
    assert_eq!(ids, want);
    // Descending, with skip: still in index order, still exact.
    let out = c
        .find(doc! {"_id": {"$lt": "user00100"}})
        .sort(doc! {"_id": -1})
        .skip(5)
        .limit(3)
        .run_detailed()
        .expect("find");
    let ids: Vec<String> = out
        .docs
        .iter()
        .map(|d| {
            duetdb::raw::id_of(d)
                .and_then(|v| v.as_str())
                .unwrap_or("")
                .to_string()
        })
        .collect();
    assert_eq!(ids, ["user00094", "user00093", "user00092"]);
    // A sort the plan cannot provide keeps `vls` and sorts everything.
    let out = c
        .find(doc! {"v": {"$gte": 0}})
        .sort(doc! {"v": -1})
        .limit(2)
        .run_detailed()
        .expect("find");
    assert_eq!(out.scan.strategy, duetdb::Strategy::Vls);
    assert_eq!(out.docs.len(), 2);
}
