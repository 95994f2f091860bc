//! Index kinds and options (issue #18): TTL, partial and sparse (unique
//! among the indexed documents only), hashed, wildcard; MongoDB's conflict
//! codes; the planner using an index only when it holds every match; specs
//! and entries surviving the WAL, checkpoints and recovery; a model of TTL
//! passes on random dates and a clock.

use duetdb::bson::{doc, Bson, DateTime, Document};
use duetdb::{Collection, Database, IndexTarget, TextFindOptions, TtlMonitor};
use proptest::prelude::*;

/// The index the planner picks for `filter` (`None`: no index).
fn index_used(c: &Collection, filter: Document) -> Option<String> {
    let e = c.find(filter).explain().expect("explain");
    let text = format!("{e:?}");
    let at = text.find("indexName")?;
    let rest = &text[at..];
    let start = rest.find("String(\"")? + 8;
    let end = rest[start..].find('"')?;
    Some(rest[start..start + end].to_string())
}

fn ids(c: &Collection, filter: Document) -> Vec<i32> {
    let mut v: Vec<i32> = c
        .find(filter)
        .run()
        .expect("find")
        .iter()
        .map(|d| d.get_i32("_id").expect("_id"))
        .collect();
    v.sort();
    v
}

fn scanned(c: &Collection, filter: Document) -> Vec<i32> {
    let mut v: Vec<i32> = c
        .find(filter)
        .hint(doc! {"$natural": 1})
        .run()
        .expect("scan")
        .iter()
        .map(|d| d.get_i32("_id").expect("_id"))
        .collect();
    v.sort();
    v
}

fn secs_ago(now: DateTime, s: i64) -> DateTime {
    DateTime::from_millis(now.timestamp_millis() - s * 1000)
}

#[test]
fn ttl_pass_deletes_expired_documents_only() {
    let db = Database::in_memory();
    let c = db.collection("sessions");
    let now = DateTime::now();
    c.insert_many(
        vec![
            doc! {"_id": 1, "at": secs_ago(now, 120)},
            doc! {"_id": 2, "at": secs_ago(now, 10)},
            // The earliest date of an array counts.
            doc! {"_id": 3, "at": [secs_ago(now, 5), secs_ago(now, 500)]},
            doc! {"_id": 4, "at": [secs_ago(now, 5)]},
            // Not a date, missing: never expire.
            doc! {"_id": 5, "at": 0},
            doc! {"_id": 6, "at": "2000-01-01"},
            doc! {"_id": 7},
        ],
        true,
    )
    .expect("insert");
    c.create_index_spec(&doc! {"key": {"at": 1}, "name": "at_1", "expireAfterSeconds": 60})
        .expect("ttl index");
    let pass = db.ttl_pass(now).expect("pass");
    assert_eq!(pass.deleted_documents, 2);
    assert_eq!(ids(&c, doc! {}), vec![2, 4, 5, 6, 7]);
    // collMod lowers the threshold: 2 and 4 expire now.
    let (old, new) = c
        .set_expire_after_seconds(IndexTarget::Keys(doc! {"at": 1}), &Bson::Int32(1))
        .expect("collMod");
    assert_eq!((old, new), (Some(60), 1));
    assert_eq!(
        c.list_indexes().expect("list")[1]
            .get_i32("expireAfterSeconds")
            .ok(),
        Some(1)
    );
    assert_eq!(db.ttl_pass(now).expect("pass").deleted_documents, 2);
    assert_eq!(ids(&c, doc! {}), vec![5, 6, 7]);
    c.check_invariants().expect("invariants");
    // collMod refusals: a compound index, a negative value.
    c.create_index_spec(&doc! {"key": {"x": 1, "y": 1}})
        .expect("compound");
    let e = c
        .set_expire_after_seconds(IndexTarget::Name("x_1_y_1".into()), &Bson::Int32(5))
        .expect_err("compound TTL");
    assert_eq!(e.code(), 67);
    let e = c
        .set_expire_after_seconds(IndexTarget::Name("at_1".into()), &Bson::Int32(-5))
        .expect_err("negative");
    assert_eq!(e.code(), 67);
    let e = c
        .set_expire_after_seconds(IndexTarget::Name("nope".into()), &Bson::Int32(5))
        .expect_err("missing");
    assert_eq!(e.code(), 27);
}

#[test]
fn ttl_respects_partial_filters_and_many_batches() {
    let db = Database::in_memory();
    let c = db.collection("t");
    let now = DateTime::now();
    let docs: Vec<Document> = (0..2500)
        .map(|i| doc! {"_id": i, "at": secs_ago(now, 1000), "keep": i % 2 == 0})
        .collect();
    c.insert_many(docs, true).expect("insert");
    c.create_index_spec(&doc! {
        "key": {"at": 1}, "expireAfterSeconds": 10,
        "partialFilterExpression": {"keep": false},
    })
    .expect("ttl");
    let monitor = {
        let db = db.clone();
        TtlMonitor::new(std::time::Duration::from_secs(3600), false, move || {
            vec![db.clone()]
        })
    };
    let pass = monitor.run_pass_at(now);
    assert_eq!(pass.deleted_documents, 1250);
    assert_eq!(c.count(doc! {}).expect("count"), 1250);
    assert_eq!(c.count(doc! {"keep": false}).expect("count"), 0);
    let counters = monitor.counters();
    assert_eq!((counters.passes, counters.deleted_documents), (1, 1250));
    assert_eq!(monitor.run_pass_at(now).deleted_documents, 0);
    assert_eq!(monitor.counters().passes, 2);
}

#[test]
fn ttl_monitor_thread_runs_passes_on_its_own() {
    let db = Database::in_memory();
    let c = db.collection("t");
    c.insert_one(doc! {"_id": 1, "at": DateTime::from_millis(0)})
        .expect("insert");
    c.create_index_spec(&doc! {"key": {"at": 1}, "expireAfterSeconds": 0})
        .expect("ttl");
    let source = db.clone();
    let monitor = TtlMonitor::new(std::time::Duration::from_millis(20), true, move || {
        vec![source.clone()]
    });
    assert!(monitor.has_thread());
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while c.count(doc! {}).expect("count") > 0 {
        assert!(
            std::time::Instant::now() < deadline,
            "the monitor never ran"
        );
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    assert!(monitor.counters().passes >= 1);
    drop(monitor); // stops and joins its thread
}

#[test]
fn sparse_and_partial_unique_indexes_hold_only_their_documents() {
    let db = Database::in_memory();
    let c = db.collection("u");
    c.create_index_spec(&doc! {"key": {"email": 1}, "unique": true, "sparse": true})
        .expect("sparse unique");
    c.insert_one(doc! {"_id": 1}).expect("missing email");
    c.insert_one(doc! {"_id": 2})
        .expect("missing again: not indexed");
    c.insert_one(doc! {"_id": 3, "email": "a"}).expect("a");
    let e = c
        .insert_one(doc! {"_id": 4, "email": "a"})
        .expect_err("dup");
    assert_eq!(e.code(), 11000);
    c.insert_one(doc! {"_id": 5, "email": null})
        .expect("explicit null is indexed");
    assert_eq!(
        c.insert_one(doc! {"_id": 6, "email": null})
            .expect_err("dup null")
            .code(),
        11000
    );
    // A sparse index is not used where missing documents could match.
    assert_eq!(
        index_used(&c, doc! {"email": "a"}).as_deref(),
        Some("email_1")
    );
    assert_eq!(index_used(&c, doc! {"email": null}), None);
    assert_eq!(ids(&c, doc! {"email": null}), vec![1, 2, 5]);
    let sorted = c.find(doc! {}).sort(doc! {"email": 1}).run().expect("sort");
    assert_eq!(
        sorted.len(),
        4,
        "a sort over all documents must not use the sparse index"
    );

    let p = db.collection("p");
    p.create_index_spec(&doc! {
        "key": {"user": 1}, "unique": true,
        "partialFilterExpression": {"active": true},
    })
    .expect("partial unique");
    p.insert_one(doc! {"_id": 1, "user": "x", "active": true})
        .expect("1");
    p.insert_one(doc! {"_id": 2, "user": "x", "active": false})
        .expect("not indexed");
    assert_eq!(
        p.insert_one(doc! {"_id": 3, "user": "x", "active": true})
            .expect_err("dup")
            .code(),
        11000
    );
    // Turning a document's membership on through an update is checked too.
    let e = p
        .update_one(doc! {"_id": 2}, doc! {"$set": {"active": true}})
        .expect_err("update into the index");
    assert_eq!(e.code(), 11000);
    p.check_invariants().expect("invariants");
    assert_eq!(
        index_used(&p, doc! {"user": "x", "active": true}).as_deref(),
        Some("user_1")
    );
    assert_eq!(index_used(&p, doc! {"user": "x"}), None);
    assert_eq!(ids(&p, doc! {"user": "x"}), vec![1, 2]);
    // Hinting a partial index the query does not imply is refused (code 2).
    let e = p
        .find(doc! {"user": "x"})
        .hint(doc! {"user": 1})
        .run()
        .expect_err("hint");
    assert_eq!(e.code(), 2);
}

#[test]
fn hashed_indexes_answer_equality_only() {
    let db = Database::in_memory();
    let c = db.collection("h");
    for i in 0..50 {
        c.insert_one(doc! {"_id": i, "k": i % 7, "s": format!("v{}", i % 5)})
            .expect("insert");
    }
    c.insert_one(doc! {"_id": 100, "k": 3.0}).expect("double");
    c.insert_one(doc! {"_id": 101}).expect("missing");
    c.create_index_spec(&doc! {"key": {"k": "hashed"}})
        .expect("hashed");
    assert_eq!(index_used(&c, doc! {"k": 3}).as_deref(), Some("k_hashed"));
    assert_eq!(
        index_used(&c, doc! {"k": {"$in": [1, 2]}}).as_deref(),
        Some("k_hashed")
    );
    assert_eq!(index_used(&c, doc! {"k": {"$gt": 3}}), None);
    for f in [
        doc! {"k": 3},
        doc! {"k": 3.0},
        doc! {"k": {"$in": [1, 2, null]}},
        doc! {"k": null},
        doc! {"k": {"$gt": 3}},
    ] {
        assert_eq!(ids(&c, f.clone()), scanned(&c, f.clone()), "{f}");
    }
    let e = c
        .insert_one(doc! {"_id": 200, "k": [1, 2]})
        .expect_err("array");
    assert_eq!(e.code(), 16766);
    // Compound with one hashed field; listIndexes reports "hashed".
    c.create_index_spec(&doc! {"key": {"s": 1, "k": "hashed"}})
        .expect("compound");
    assert_eq!(
        index_used(&c, doc! {"s": "v1", "k": 1}).as_deref(),
        Some("s_1_k_hashed")
    );
    assert_eq!(
        ids(&c, doc! {"s": "v1", "k": 1}),
        scanned(&c, doc! {"s": "v1", "k": 1})
    );
    let listed = c.list_indexes().expect("list");
    assert_eq!(
        listed[2].get_document("key").expect("key"),
        &doc! {"s": 1, "k": "hashed"}
    );
    c.check_invariants().expect("invariants");
}

#[test]
fn wildcard_indexes_answer_one_path() {
    let db = Database::in_memory();
    let c = db.collection("w");
    let mut n = 0;
    for a in 0..6 {
        for shape in 0..4 {
            n += 1;
            let d = match shape {
                0 => doc! {"_id": n, "a": a, "b": {"c": a * 2}},
                1 => doc! {"_id": n, "a": [a, a + 10], "b": [{"c": a}, {"c": "x"}]},
                2 => doc! {"_id": n, "b": {"c": {"d": a}}, "e": null},
                _ => doc! {"_id": n, "a": {"z": a}, "b": []},
            };
            c.insert_one(d).expect("insert");
        }
    }
    c.create_index_spec(&doc! {"key": {"$**": 1}})
        .expect("wildcard");
    for (f, uses) in [
        (doc! {"a": 3}, true),
        (doc! {"a": {"$gt": 4}}, true),
        (doc! {"a": {"$gte": 2, "$lt": 4}}, true),
        (doc! {"b.c": {"$in": [2, "x"]}}, true),
        (doc! {"b.c.d": 5}, true),
        (doc! {"a": null}, false),
        (doc! {"a": {"z": 1}}, false),
        (doc! {"a.0": 3}, false),
        (doc! {"_id": {"$gt": 5}}, false),
    ] {
        assert_eq!(ids(&c, f.clone()), scanned(&c, f.clone()), "{f}");
        assert_eq!(
            index_used(&c, f.clone()).as_deref() == Some("$**_1"),
            uses,
            "{f}"
        );
    }
    let p = db.collection("wp");
    p.create_index_spec(&doc! {"key": {"$**": 1}, "wildcardProjection": {"a": 1}})
        .expect("projected");
    p.insert_one(doc! {"_id": 1, "a": 1, "b": 1})
        .expect("insert");
    assert!(index_used(&p, doc! {"a": 1}).is_some());
    assert_eq!(index_used(&p, doc! {"b": 1}), None);
    assert_eq!(ids(&p, doc! {"b": 1}), vec![1]);
    c.check_invariants().expect("invariants");
    p.check_invariants().expect("invariants");
}

#[test]
fn conflicts_have_mongodbs_codes_and_identical_specs_are_no_ops() {
    let db = Database::in_memory();
    let c = db.collection("c");
    let ttl =
        doc! {"key": {"at": 1}, "name": "at_1", "expireAfterSeconds": 3600, "background": true};
    c.create_index_spec(&ttl).expect("first");
    // Mongoose's Model.init() sends the same spec again: accepted.
    c.create_index_spec(&ttl).expect("again");
    let code = |d: Document| c.create_index_spec(&d).expect_err("conflict").code();
    assert_eq!(
        code(doc! {"key": {"at": 1}, "name": "at_1", "expireAfterSeconds": 60}),
        85
    );
    assert_eq!(
        code(doc! {"key": {"at": 1}, "name": "other", "expireAfterSeconds": 3600}),
        85
    );
    assert_eq!(code(doc! {"key": {"at": -1}, "name": "at_1"}), 86);
    // The same keys with another partial filter are another index.
    c.create_index_spec(&doc! {"key": {"at": 1}, "name": "p", "partialFilterExpression": {"x": 1}})
        .expect("other partial filter");
    let listed = c.list_indexes().expect("list");
    assert_eq!(
        listed[1],
        doc! {"v": 2, "key": {"at": 1}, "name": "at_1", "expireAfterSeconds": 3600}
    );
    assert_eq!(
        listed[2],
        doc! {"v": 2, "key": {"at": 1}, "name": "p", "partialFilterExpression": {"x": 1}}
    );
}

/// The index specs of the recovery test: every kind on `x` (the text index
/// compound, with a prefix and a suffix), and on `y`, a collection with a
/// default collation (so its `_id` index is collated), a plain text index,
/// a collated ordered index and a compound 2dsphere index collated on its
/// other field.
fn recovery_specs() -> [(&'static str, Vec<Document>); 2] {
    [
        (
            "x",
            vec![
                doc! {"key": {"at": 1}, "expireAfterSeconds": 30},
                doc! {"key": {"e": 1}, "unique": true, "sparse": true},
                doc! {"key": {"u": 1}, "unique": true, "partialFilterExpression": {"on": true}},
                doc! {"key": {"k": "hashed"}},
                doc! {"key": {"$**": 1}, "wildcardProjection": {"k": 1, "n.x": 1}},
                doc! {"key": {"k": 1, "n.y": "text", "w": "text", "u": -1}, "weights": {"w": 3}},
                doc! {"key": {"loc": "2dsphere"}},
                doc! {"key": {"name": 1, "k": -1}, "collation": {"locale": "de", "strength": 1}},
            ],
        ),
        (
            "y",
            vec![
                doc! {"key": {"w": "text"}, "collation": {"locale": "simple"}},
                doc! {"key": {"name": 1}, "unique": false},
                doc! {"key": {"k": 1, "loc": "2dsphere", "name": 1}},
            ],
        ),
    ]
}

/// The options `y` is created with: a case-insensitive default collation.
fn collated_options() -> duetdb::CollectionOptions {
    duetdb::CollectionOptions {
        collation: duetdb::Collator::from_document(&doc! {"locale": "en", "strength": 2})
            .expect("collation"),
        ..Default::default()
    }
}

const NAMES: [&str; 6] = ["Ärger", "arger", "Apfel", "APFEL", "zebra", "Zoë"];
const PHRASES: [&str; 5] = [
    "coffee shops",
    "Tea houses",
    "baking cakes",
    "café au lait",
    "the",
];

/// Round `r` of the recovery test's writes on one collection: round 0
/// inserts 800 documents (enough heap pages and index leaves for a later
/// round to leave most of them unchanged); later rounds move them (points, words, names,
/// dates, partial and sparse members) among the first 60, delete some of
/// them and insert new ones (so a chained checkpoint reuses the rest).
fn recovery_round(c: &Collection, r: i32) {
    let point = |i: i32| doc! {"type": "Point", "coordinates": [f64::from(i % 37) * 0.5 - 9.0, f64::from(i % 23) * 0.7 - 8.0]};
    let one = |i: i32| {
        let mut d = doc! {
            "_id": i, "k": i % 9, "n": {"x": i, "y": PHRASES[(i % 5) as usize]},
            "w": PHRASES[((i + r) % 5) as usize], "on": i % 3 == 0, "u": i,
            "name": NAMES[(i % 6) as usize], "at": DateTime::from_millis(i64::from(i) * 1000),
        };
        if i % 4 == 0 {
            d.insert("e", i);
        }
        if i % 5 != 0 {
            d.insert("loc", point(i));
        }
        d
    };
    if r == 0 {
        c.insert_many((0..800).map(one), true).expect("insert");
        return;
    }
    c.update_many(
        doc! {"k": r % 9, "_id": {"$lt": 60}},
        doc! {"$set": {"on": true, "loc": point(r * 11), "name": NAMES[(r % 6) as usize]}},
    )
    .expect("update");
    c.update_many(
        doc! {"k": (r + 4) % 9, "_id": {"$lt": 60}},
        doc! {"$set": {"n.y": PHRASES[(r % 5) as usize], "at": [DateTime::from_millis(5), DateTime::from_millis(9)]}, "$unset": {"e": 1, "loc": 1}},
    )
    .expect("update");
    c.delete_many(doc! {"k": (r + 2) % 9, "_id": {"$lt": 60}})
        .expect("delete");
    c.insert_many((1000 * r..1000 * r + 10).map(one), true)
        .expect("insert");
}

/// What the recovery test compares: the listed specs, the entries and bytes
/// of each index, and queries answered through the text, 2dsphere and
/// collated indexes.
type Listing = (Vec<Document>, Vec<(String, u64)>, Vec<Vec<Bson>>);

fn listing(c: &Collection) -> Listing {
    let ids = |docs: Vec<Document>| -> Vec<Bson> {
        let mut v: Vec<Bson> = docs.iter().filter_map(|d| d.get("_id").cloned()).collect();
        v.sort_by_key(|b| b.to_string());
        v
    };
    let text = if c.name() == "x" {
        doc! {"k": 3, "$text": {"$search": "coffee cafe"}}
    } else {
        doc! {"$text": {"$search": "tea -cakes"}}
    };
    let answers = vec![
        ids(c.text_find(&text, TextFindOptions::default()).expect("text")),
        ids(c
            .find(doc! {"loc": {"$geoWithin": {"$centerSphere": [[0.0, 0.0], 0.08]}}, "k": {"$gte": 0}})
            .run()
            .expect("geo")),
        ids(c
            .clone()
            .with_collation(Some(doc! {"locale": if c.name() == "x" { "de" } else { "en" }, "strength": if c.name() == "x" { 1 } else { 2 }}))
            .find(doc! {"name": {"$in": ["arger", "apfel"]}})
            .run()
            .expect("collated")),
    ];
    (
        c.list_indexes().expect("list"),
        c.stats().expect("stats").indexes,
        answers,
    )
}

/// `db`'s collections equal a fresh in-memory build from their documents
/// (same options, the same specs created after the documents), and each
/// index holds exactly its documents' keys.
fn assert_equal_to_a_fresh_build(db: &Database, when: &str) {
    let fresh = Database::in_memory();
    fresh
        .create_collection_with("y", collated_options())
        .expect("create y");
    for (name, specs) in recovery_specs() {
        let c = db.collection(name);
        c.check_invariants()
            .unwrap_or_else(|e| panic!("{when}: {name}: {e}"));
        let f = fresh.collection(name);
        let docs = c.find(doc! {}).run().expect("documents");
        assert!(docs.len() > 100, "{when}: {name}: {} documents", docs.len());
        f.insert_many(docs, true).expect("copy");
        for s in &specs {
            f.create_index_spec(s).expect("fresh index");
        }
        let (mut got, mut want) = (listing(&c), listing(&f));
        // The TTL index's collMod is not part of a fresh build.
        for l in [&mut got.0, &mut want.0] {
            for spec in l.iter_mut() {
                spec.remove("expireAfterSeconds");
            }
        }
        assert_eq!(got, want, "{when}: {name}");
        assert!(
            got.2.iter().all(|a| !a.is_empty()),
            "{when}: {name}: {:?}",
            got.2
        );
    }
}

fn expire_after(c: &Collection) -> Option<i32> {
    let list = c.list_indexes().expect("list");
    list.iter()
        .find(|s| s.get_str("name").ok() == Some("at_1"))
        .and_then(|s| s.get_i32("expireAfterSeconds").ok())
}

/// Indexes of every kind (TTL, sparse and partial unique, hashed, wildcard,
/// compound and plain text, 2dsphere and compound 2dsphere, collated, and a
/// collated `_id`) come back from the WAL, from a whole checkpoint and from
/// a chained (incremental) checkpoint plus a WAL tail with their options and
/// the same entries as a fresh build.
#[test]
fn every_index_kind_recovers_equal_to_a_fresh_build() {
    let dir = tempfile::tempdir().expect("tmp");
    {
        let db = Database::open(dir.path()).expect("open");
        db.create_collection_with("y", collated_options())
            .expect("create y");
        for (name, specs) in recovery_specs() {
            let c = db.collection(name);
            for s in &specs {
                c.create_index_spec(s).expect("index");
            }
            recovery_round(&c, 0);
            recovery_round(&c, 1);
        }
        let x = db.collection("x");
        x.set_expire_after_seconds(IndexTarget::Name("at_1".into()), &Bson::Int32(30))
            .expect("same value: no change");
        assert_equal_to_a_fresh_build(&db, "before recovery");
    }
    // Recovered from the WAL alone; then a whole checkpoint, more writes, a
    // chained checkpoint, and a WAL tail.
    {
        let db = Database::open(dir.path()).expect("reopen");
        let r = db.recovery_report().expect("durable");
        assert!(r.checkpoint.is_none() && r.records_replayed > 0, "{r}");
        assert_equal_to_a_fresh_build(&db, "from the WAL");
        let x = db.collection("x");
        x.set_expire_after_seconds(IndexTarget::Name("at_1".into()), &Bson::Int32(45))
            .expect("collMod");
        db.checkpoint().expect("checkpoint").expect("written");
        for name in ["x", "y"] {
            recovery_round(&db.collection(name), 2);
        }
        db.checkpoint()
            .expect("chained checkpoint")
            .expect("written");
        for name in ["x", "y"] {
            recovery_round(&db.collection(name), 3);
        }
    }
    {
        let db = Database::open(dir.path()).expect("reopen");
        let r = db.recovery_report().expect("durable");
        assert!(
            r.checkpoint.is_some() && r.checkpoint_files.len() >= 2 && r.records_replayed > 0,
            "a chained checkpoint and a WAL tail: {r} {:?}",
            r.checkpoint_files
        );
        assert_equal_to_a_fresh_build(&db, "from a chained checkpoint and the WAL");
        assert_eq!(expire_after(&db.collection("x")), Some(45));
        db.checkpoint().expect("checkpoint").expect("written");
    }
    // Recovered from a whole checkpoint, nothing to replay.
    let db = Database::open(dir.path()).expect("reopen");
    let r = db.recovery_report().expect("durable");
    assert!(
        r.checkpoint.is_some() && r.checkpoint_files.len() == 1,
        "{r} {:?}",
        r.checkpoint_files
    );
    assert_equal_to_a_fresh_build(&db, "from a whole checkpoint");
    assert_eq!(expire_after(&db.collection("x")), Some(45));
}

fn text_ids(c: &Collection, search: &str) -> Vec<i32> {
    let mut v: Vec<i32> = c
        .text_find(
            &doc! {"$text": {"$search": search}},
            TextFindOptions::default(),
        )
        .expect("text find")
        .iter()
        .map(|d| d.get_i32("_id").expect("_id"))
        .collect();
    v.sort();
    v
}

#[test]
fn text_search_stems_scores_and_sorts() {
    let db = Database::in_memory();
    let c = db.collection("articles");
    c.insert_many(
        vec![
            doc! {"_id": 1, "title": "Coffee", "body": "the best coffee shops in town"},
            doc! {"_id": 2, "title": "Tea", "body": "tea houses and a coffee corner"},
            doc! {"_id": 3, "title": "Cakes", "body": "baking cakes"},
            doc! {"_id": 4, "title": "Café", "body": "un café au lait", "language": "french"},
            doc! {"_id": 5, "body": 42},
        ],
        true,
    )
    .expect("insert");
    c.create_index_spec(&doc! {"key": {"title": "text", "body": "text"}, "weights": {"title": 10}})
        .expect("text index");
    assert_eq!(text_ids(&c, "coffee"), vec![1, 2]);
    assert_eq!(text_ids(&c, "shop"), vec![1], "stemmed");
    assert_eq!(text_ids(&c, "coffee -tea"), vec![1]);
    assert_eq!(text_ids(&c, "\"coffee corner\""), vec![2]);
    assert_eq!(text_ids(&c, "the"), Vec::<i32>::new(), "stop words");
    assert_eq!(text_ids(&c, "bake"), vec![3]);
    // A French document is stemmed in French; diacritics fold.
    let french = c
        .text_find(
            &doc! {"$text": {"$search": "cafe", "$language": "fr"}},
            TextFindOptions::default(),
        )
        .expect("french");
    assert_eq!(french.len(), 1);
    assert_eq!(french[0].get_i32("_id").ok(), Some(4));
    // Scores: the title's weight puts 1 first.
    let sorted = c
        .text_find(
            &doc! {"$text": {"$search": "coffee"}},
            TextFindOptions {
                projection: Some(doc! {"title": 1, "score": {"$meta": "textScore"}}),
                sort: Some(doc! {"score": {"$meta": "textScore"}}),
                ..Default::default()
            },
        )
        .expect("sorted");
    assert_eq!(sorted[0].get_i32("_id").ok(), Some(1));
    let (s1, s2) = (
        sorted[0].get_f64("score").expect("score"),
        sorted[1].get_f64("score").expect("score"),
    );
    assert!(s1 > s2 && s2 > 0.0, "{sorted:?}");
    assert!(sorted[0].get("body").is_none(), "projection applied");
    assert_eq!(
        c.text_count(&doc! {"$text": {"$search": "coffee"}, "title": "Tea"})
            .expect("count"),
        1
    );
    // One text index per collection; a $text query needs one.
    let e = c
        .create_index_spec(&doc! {"key": {"other": "text"}})
        .expect_err("second");
    assert_eq!(e.code(), 85);
    let e = db.collection("none").text_find(
        &doc! {"$text": {"$search": "x"}},
        TextFindOptions::default(),
    );
    assert!(e.is_ok(), "a missing collection has no matches");
    let plain = db.collection("plain");
    plain.insert_one(doc! {"a": "x"}).expect("insert");
    let e = plain
        .text_find(
            &doc! {"$text": {"$search": "x"}},
            TextFindOptions::default(),
        )
        .expect_err("no text index");
    assert_eq!(e.code(), 27);
    // A document in an unknown language is refused while the index exists.
    let e = c
        .insert_one(doc! {"title": "x", "language": "klingon"})
        .expect_err("language");
    assert_eq!(e.code(), 17262);
    // Updates move documents in and out of the index.
    c.update_one(doc! {"_id": 3}, doc! {"$set": {"body": "coffee cake"}})
        .expect("update");
    assert_eq!(text_ids(&c, "coffee"), vec![1, 2, 3]);
    c.delete_one(doc! {"_id": 1}).expect("delete");
    assert_eq!(text_ids(&c, "coffee"), vec![2, 3]);
    c.check_invariants().expect("invariants");
    assert_eq!(
        c.list_indexes().expect("list")[1],
        doc! {"v": 2, "key": {"_fts": "text", "_ftsx": 1}, "name": "title_text_body_text",
        "weights": {"body": 1, "title": 10}, "default_language": "english",
        "language_override": "language", "textIndexVersion": 3}
    );
}

const WORDS: &[&str] = &["apple", "Banana", "cherry", "date", "elder", "fig"];

fn text_doc() -> impl Strategy<Value = Option<String>> {
    prop_oneof![
        1 => Just(None),
        6 => prop::collection::vec(prop::sample::select(WORDS), 0..6).prop_map(|w| Some(w.join(" "))),
    ]
}

#[derive(Debug, Clone)]
enum Item {
    Word(&'static str),
    Not(&'static str),
    Phrase(&'static str, &'static str),
}

fn item() -> impl Strategy<Value = Item> {
    let w = || prop::sample::select(WORDS);
    prop_oneof![
        3 => w().prop_map(Item::Word),
        1 => w().prop_map(Item::Not),
        1 => (w(), w()).prop_map(|(a, b)| Item::Phrase(a, b)),
    ]
}

/// The reference: with language "none" a term is a lower-cased token.
fn reference(text: &Option<String>, items: &[Item]) -> bool {
    let Some(t) = text else { return false };
    let lower = t.to_lowercase();
    let toks: Vec<&str> = lower.split(' ').filter(|s| !s.is_empty()).collect();
    let has = |w: &str| toks.contains(&w.to_lowercase().as_str());
    let mut positive = false;
    for i in items {
        match i {
            Item::Word(w) => positive |= has(w),
            Item::Not(w) => {
                if has(w) {
                    return false;
                }
            }
            Item::Phrase(a, b) => {
                positive |= has(a) || has(b);
                if !lower.contains(&format!("{} {}", a.to_lowercase(), b.to_lowercase())) {
                    return false;
                }
            }
        }
    }
    positive
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]
    /// `$text` through the text index equals a plain reference evaluation,
    /// after inserts, updates and deletes.
    #[test]
    fn text_search_matches_a_reference(
        docs in prop::collection::vec(text_doc(), 1..40),
        updates in prop::collection::vec((0usize..40, text_doc()), 0..10),
        queries in prop::collection::vec(prop::collection::vec(item(), 1..4), 1..6),
    ) {
        let db = Database::in_memory();
        let c = db.collection("t");
        c.create_index_spec(&doc! {"key": {"t": "text"}, "default_language": "none"}).expect("index");
        let mut model: Vec<Option<String>> = Vec::new();
        for (i, d) in docs.iter().enumerate() {
            let mut doc = doc! {"_id": i as i32};
            if let Some(t) = d {
                doc.insert("t", t.clone());
            }
            c.insert_one(doc).expect("insert");
            model.push(d.clone());
        }
        for (i, t) in updates {
            if i >= model.len() { continue; }
            match &t {
                Some(t) => c.update_one(doc! {"_id": i as i32}, doc! {"$set": {"t": t.clone()}}).expect("set"),
                None => c.update_one(doc! {"_id": i as i32}, doc! {"$unset": {"t": 1}}).expect("unset"),
            };
            model[i] = t;
        }
        c.check_invariants().map_err(TestCaseError::fail)?;
        for items in queries {
            let search: Vec<String> = items.iter().map(|i| match i {
                Item::Word(w) => w.to_string(),
                Item::Not(w) => format!("-{w}"),
                Item::Phrase(a, b) => format!("\"{a} {b}\""),
            }).collect();
            let search = search.join(" ");
            let want: Vec<i32> = model.iter().enumerate()
                .filter(|(_, t)| reference(t, &items))
                .map(|(i, _)| i as i32)
                .collect();
            prop_assert_eq!(text_ids(&c, &search), want, "search {:?}", search);
        }
    }
}

/// Compound text indexes (MongoDB's rules): prefix keys need equalities
/// in the query (else 291), prefix and suffix fields may not hold arrays
/// (171), entries follow updates of the prefix field, listIndexes shows the
/// `_fts`/`_ftsx` form, and the index comes back after a reopen.
#[test]
fn compound_text_indexes_read_one_prefix() {
    let dir = tempfile::tempdir().expect("tmp");
    let find = |c: &Collection, f: Document| -> Vec<i32> {
        let mut v: Vec<i32> = c
            .text_find(&f, TextFindOptions::default())
            .expect("text find")
            .iter()
            .map(|d| d.get_i32("_id").expect("_id"))
            .collect();
        v.sort();
        v
    };
    {
        let db = Database::open(dir.path()).expect("open");
        let c = db.collection("posts");
        c.insert_many(
            vec![
                doc! {"_id": 1, "dept": "a", "body": "coffee beans", "year": 2020},
                doc! {"_id": 2, "dept": "b", "body": "coffee cups", "year": 2021},
                doc! {"_id": 3, "dept": "a", "body": "tea leaves", "year": 2022},
                doc! {"_id": 4, "body": "coffee without a dept"},
            ],
            true,
        )
        .expect("insert");
        c.create_index_spec(&doc! {"key": {"dept": 1, "body": "text", "year": -1}})
            .expect("compound text index");
        assert_eq!(
            find(&c, doc! {"$text": {"$search": "coffee"}, "dept": "a"}),
            vec![1]
        );
        assert_eq!(
            find(
                &c,
                doc! {"$text": {"$search": "coffee -cups"}, "dept": {"$eq": "b"}}
            ),
            Vec::<i32>::new()
        );
        assert_eq!(
            find(&c, doc! {"$text": {"$search": "coffee"}, "dept": null}),
            vec![4]
        );
        assert_eq!(
            find(
                &c,
                doc! {"$text": {"$search": "coffee"}, "$and": [{"dept": "b"}], "year": {"$gt": 2000}}
            ),
            vec![2]
        );
        for f in [
            doc! {"$text": {"$search": "coffee"}},
            doc! {"$text": {"$search": "coffee"}, "dept": {"$in": ["a", "b"]}},
            doc! {"$text": {"$search": "coffee"}, "dept": {"$gt": "a"}},
        ] {
            let e = c
                .text_find(&f, TextFindOptions::default())
                .expect_err("no prefix equality");
            assert_eq!(e.code(), 291, "{f}");
        }
        let e = c
            .text_count(&doc! {"$text": {"$search": "coffee"}})
            .expect_err("count");
        assert_eq!(e.code(), 291);
        // Arrays on the other keys are refused, text fields may be arrays.
        for d in [
            doc! {"_id": 9, "dept": ["a"], "body": "x"},
            doc! {"_id": 9, "dept": "a", "body": "x", "year": [1, 2]},
            doc! {"_id": 9, "dept": [], "year": 1},
        ] {
            assert_eq!(c.insert_one(d).expect_err("array").code(), 171);
        }
        c.insert_one(doc! {"_id": 5, "dept": "a", "body": ["coffee", "milk"]})
            .expect("text array");
        // Moving a document to another prefix moves its entries.
        c.update_one(doc! {"_id": 2}, doc! {"$set": {"dept": "a"}})
            .expect("move");
        assert_eq!(
            find(&c, doc! {"$text": {"$search": "coffee"}, "dept": "a"}),
            vec![1, 2, 5]
        );
        assert_eq!(
            find(&c, doc! {"$text": {"$search": "coffee"}, "dept": "b"}),
            Vec::<i32>::new()
        );
        let scored = c
            .text_find(
                &doc! {"$text": {"$search": "coffee"}, "dept": "a"},
                TextFindOptions {
                    projection: Some(doc! {"s": {"$meta": "textScore"}}),
                    sort: Some(doc! {"s": {"$meta": "textScore"}}),
                    ..Default::default()
                },
            )
            .expect("scored");
        assert_eq!(scored.len(), 3);
        assert!(scored[0].get_f64("s").expect("s") >= scored[2].get_f64("s").expect("s"));
        c.check_invariants().expect("invariants");
        assert_eq!(
            c.list_indexes().expect("list")[1],
            doc! {"v": 2, "key": {"dept": 1, "_fts": "text", "_ftsx": 1, "year": -1},
            "name": "dept_1_body_text_year_-1", "weights": {"body": 1},
            "default_language": "english", "language_override": "language",
            "textIndexVersion": 3}
        );
    }
    // Recovered from the WAL, then from a checkpoint.
    for round in 0..2 {
        let db = Database::open(dir.path()).expect("reopen");
        let c = db.collection("posts");
        c.check_invariants().expect("invariants");
        assert_eq!(
            find(&c, doc! {"$text": {"$search": "coffee"}, "dept": "a"}),
            vec![1, 2, 5],
            "round {round}"
        );
        if round == 0 {
            db.checkpoint().expect("checkpoint");
        }
    }
}

/// A compound text index under concurrent updates: a writer moves documents
/// between the prefix values `dept: "a"`/`"b"` (sometimes alone, sometimes
/// with a new text, sometimes only the text) while a reader runs `$text`
/// with `dept: "a"` on held snapshots and compares each answer with a
/// collection scan of the same snapshot: a stale or missing entry (a move
/// the index did not follow) shows as a difference.
#[test]
fn compound_text_index_follows_prefix_moves_under_concurrent_updates() {
    use rand::{Rng, SeedableRng};
    use std::sync::atomic::{AtomicBool, Ordering};

    const DOCS: i32 = 24;
    const WORDS: [&str; 4] = ["coffee", "tea", "milk", "beans"];
    // In memory: the index is the same, and a failing reader does not wait
    // for 1,500 synced updates before its panic is reported.
    let db = Database::in_memory();
    let c = db.collection("posts");
    let body = |rng: &mut rand::rngs::StdRng| -> String {
        (0..3)
            .map(|_| WORDS[rng.gen_range(0..WORDS.len())])
            .collect::<Vec<_>>()
            .join(" ")
    };
    let mut rng = rand::rngs::StdRng::seed_from_u64(18);
    c.insert_many(
        (0..DOCS)
            .map(|i| doc! {"_id": i, "dept": if i % 2 == 0 { "a" } else { "b" }, "body": body(&mut rng)})
            .collect::<Vec<_>>(),
        true,
    )
    .expect("insert");
    c.create_index_spec(&doc! {"key": {"dept": 1, "body": "text"}})
        .expect("compound text index");
    let done = AtomicBool::new(false);
    let (checks, nonempty) = std::thread::scope(|s| {
        let writer = s.spawn(|| {
            // Set even when the writer panics (an update the broken index
            // refuses), so the reader stops and the panic is reported.
            struct Done<'a>(&'a AtomicBool);
            impl Drop for Done<'_> {
                fn drop(&mut self) {
                    self.0.store(true, Ordering::Release);
                }
            }
            let _done = Done(&done);
            let c = db.collection("posts");
            let mut rng = rand::rngs::StdRng::seed_from_u64(7);
            for _ in 0..1500 {
                let id = rng.gen_range(0..DOCS);
                let dept = if rng.gen_bool(0.5) { "a" } else { "b" };
                let update = match rng.gen_range(0..3) {
                    0 => doc! {"$set": {"dept": dept}},
                    1 => doc! {"$set": {"body": body(&mut rng)}},
                    _ => doc! {"$set": {"dept": dept, "body": body(&mut rng)}},
                };
                c.update_one(doc! {"_id": id}, update).expect("update");
            }
        });
        let mut checks = 0u32;
        let mut nonempty = 0u32;
        // At least a few reads even if the writer finishes first.
        while !done.load(Ordering::Acquire) || checks < 20 {
            let snap = db.snapshot();
            let sc = snap.collection("posts");
            for term in ["coffee", "milk"] {
                let filter = doc! {"$text": {"$search": term}, "dept": "a"};
                let mut got: Vec<i32> = sc
                    .text_find(&filter, TextFindOptions::default())
                    .expect("text find")
                    .iter()
                    .map(|d| {
                        assert_eq!(d.get_str("dept").ok(), Some("a"), "{d}");
                        d.get_i32("_id").expect("_id")
                    })
                    .collect();
                got.sort();
                let mut want: Vec<i32> = sc
                    .find(doc! {"dept": "a"})
                    .hint(doc! {"$natural": 1})
                    .run()
                    .expect("scan")
                    .iter()
                    .filter(|d| {
                        d.get_str("body")
                            .is_ok_and(|b| b.split(' ').any(|w| w == term))
                    })
                    .map(|d| d.get_i32("_id").expect("_id"))
                    .collect();
                want.sort();
                assert_eq!(got, want, "csn {} term {term}", snap.csn());
                assert_eq!(
                    sc.text_count(&filter).expect("count"),
                    want.len() as u64,
                    "csn {}",
                    snap.csn()
                );
                checks += 1;
                nonempty += u32::from(!want.is_empty());
            }
        }
        writer.join().expect("writer");
        (checks, nonempty)
    });
    assert!(checks >= 20 && nonempty > 0, "{checks} {nonempty}");
    c.check_invariants().expect("invariants");
}

// ------------------------------------------------------------ the TTL model

/// The model's start of time (ms); the clock and every date are whole
/// seconds from it, and the clock moves slowly through the dates' range, so
/// dates fall exactly on a cutoff often (expired is strictly before it).
const T0: i64 = 1_700_000_000_000;

fn date(secs: i64) -> Bson {
    Bson::DateTime(DateTime::from_millis(T0 + secs * 1000))
}

/// A value of a TTL-indexed field: dates, arrays of dates (with other
/// values, empty, nested), and values that never expire.
fn ttl_value() -> impl Strategy<Value = Bson> {
    let d = || (10i64..30).prop_map(date);
    prop_oneof![
        4 => d(),
        3 => proptest::collection::vec(prop_oneof![3 => d(), 1 => Just(Bson::Int32(3))], 0..4).prop_map(Bson::Array),
        1 => d().prop_map(|x| Bson::Array(vec![Bson::Array(vec![x])])),
        1 => (10i64..30).prop_map(|s| Bson::Int64(T0 + s * 1000)),
        1 => Just(Bson::String("2023-11-14".into())),
        1 => Just(Bson::Null),
    ]
}

/// The model's verdict: the earliest date directly in `v` (itself or an
/// element of it) lies before `cutoff_secs`; anything else never expires.
fn expired(v: Option<&Bson>, cutoff_secs: i64) -> bool {
    let before =
        |b: &Bson| matches!(b, Bson::DateTime(t) if t.timestamp_millis() < T0 + cutoff_secs * 1000);
    match v {
        Some(Bson::Array(items)) => items.iter().any(before),
        Some(b) => before(b),
        None => false,
    }
}

#[derive(Debug, Clone)]
enum TtlOp {
    /// A document with these `at` and `to` fields (`None`: missing) and `keep`.
    Insert(Option<Bson>, Option<Bson>, bool),
    /// Set (`Some`) or unset the n-th document's `at`.
    SetAt(usize, Option<Bson>),
    /// Advance the clock by whole seconds.
    Tick(i64),
    /// `collMod` the `at` index's expireAfterSeconds.
    Expire(i64),
    Pass,
}

fn ttl_op() -> impl Strategy<Value = TtlOp> {
    let v = || proptest::option::of(ttl_value());
    prop_oneof![
        4 => (v(), v(), any::<bool>()).prop_map(|(a, t, k)| TtlOp::Insert(a, t, k)),
        2 => (0usize..16, v()).prop_map(|(i, a)| TtlOp::SetAt(i, a)),
        2 => (0i64..4).prop_map(TtlOp::Tick),
        1 => (0i64..8).prop_map(TtlOp::Expire),
        3 => Just(TtlOp::Pass),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    /// Random documents (dates, arrays of dates, nested arrays, other
    /// values, missing fields), updates, `collMod`s and a clock against two
    /// TTL indexes, one of them partial: each pass deletes exactly the
    /// documents the model says expired at its `now` (and reports them),
    /// and the indexes stay equal to a rebuild.
    #[test]
    fn a_ttl_pass_deletes_exactly_the_models_expired_set(ops in proptest::collection::vec(ttl_op(), 1..40)) {
        let db = Database::in_memory();
        let c = db.collection("s");
        c.create_index_spec(&doc! {"key": {"at": 1}, "name": "at_1", "expireAfterSeconds": 5})
            .expect("ttl");
        c.create_index_spec(&doc! {
            "key": {"to": 1}, "name": "to_1", "expireAfterSeconds": 0,
            "partialFilterExpression": {"keep": false},
        })
        .expect("partial ttl");
        let mut docs: std::collections::BTreeMap<i32, Document> = Default::default();
        let (mut now, mut at_secs, mut next) = (20i64, 5i64, 0i32);
        for op in &ops {
            match op {
                TtlOp::Insert(at, to, keep) => {
                    next += 1;
                    let mut d = doc! {"_id": next, "keep": *keep};
                    if let Some(v) = at {
                        d.insert("at", v.clone());
                    }
                    if let Some(v) = to {
                        d.insert("to", v.clone());
                    }
                    c.insert_one(d.clone()).expect("insert");
                    docs.insert(next, d);
                }
                TtlOp::SetAt(n, at) => {
                    let Some(id) = docs.keys().nth(n % docs.len().max(1)).copied() else {
                        continue;
                    };
                    let update = match at {
                        Some(v) => doc! {"$set": {"at": v.clone()}},
                        None => doc! {"$unset": {"at": 1}},
                    };
                    c.update_one(doc! {"_id": id}, update).expect("update");
                    let d = docs.get_mut(&id).expect("present");
                    match at {
                        Some(v) => {
                            d.insert("at", v.clone());
                        }
                        None => {
                            d.remove("at");
                        }
                    }
                }
                TtlOp::Tick(s) => now += s,
                TtlOp::Expire(s) => {
                    c.set_expire_after_seconds(IndexTarget::Name("at_1".into()), &Bson::Int64(*s))
                        .expect("collMod");
                    at_secs = *s;
                }
                TtlOp::Pass => {
                    let gone: Vec<i32> = docs
                        .iter()
                        .filter(|(_, d)| {
                            expired(d.get("at"), now - at_secs)
                                || (d.get_bool("keep").ok() == Some(false) && expired(d.get("to"), now))
                        })
                        .map(|(id, _)| *id)
                        .collect();
                    let pass = db.ttl_pass(DateTime::from_millis(T0 + now * 1000)).expect("pass");
                    prop_assert_eq!(pass.indexes, 2);
                    prop_assert_eq!(pass.deleted_documents, gone.len() as u64, "at {} after {:?}", now, ops);
                    for id in gone {
                        docs.remove(&id);
                    }
                    let left = ids(&c, doc! {});
                    let want: Vec<i32> = docs.keys().copied().collect();
                    prop_assert_eq!(left, want, "at {}", now);
                }
            }
        }
        c.check_invariants().map_err(TestCaseError::fail)?;
    }
}
