//! Collations through the engine API (issue #18 item 6): a collection's
//! default collation and collated indexes surviving recovery from the WAL
//! and from a checkpoint; a case-insensitive unique index; the planner
//! using a collated index only under the same collation; and collated finds
//! answering the same under every snapshot strategy, with and without the
//! index, while writes go on.

use std::path::PathBuf;
use std::sync::Arc;

use duetdb::bson::{doc, Bson, Document};
use duetdb::storage::SimFs;
use duetdb::{
    Collator, CollectionOptions, Crud, Database, Durability, DurabilityOptions, Strategy,
};

fn ci() -> Document {
    doc! {"locale": "en", "strength": 2}
}

fn names(docs: Vec<Document>) -> Vec<String> {
    let mut v: Vec<String> = docs
        .into_iter()
        .filter_map(|d| d.get_str("n").ok().map(str::to_string))
        .collect();
    v.sort();
    v
}

fn index_of(db: &Database, coll: &str, name: &str) -> Document {
    db.collection(coll)
        .list_indexes()
        .expect("indexes")
        .into_iter()
        .find(|d| d.get_str("name").ok() == Some(name))
        .expect("index")
}

#[test]
fn default_collation_and_collated_indexes_survive_recovery() {
    let fs = SimFs::new();
    let opts = DurabilityOptions {
        mode: Durability::Fsync,
        checkpoint_wal_bytes: u64::MAX,
        checkpoint_interval: None,
        background_checkpoints: false,
        vfs: Arc::new(fs.clone()),
        ..Default::default()
    };
    let dir = PathBuf::from("/db");
    let options = CollectionOptions {
        collation: Collator::from_document(&ci()).expect("collation"),
        ..Default::default()
    };
    {
        let db = Database::open_with(&dir, opts.clone()).expect("open");
        db.create_collection_with("p", options.clone())
            .expect("create");
        let c = db.collection("p");
        // Takes the collection's collation: unique regardless of case.
        c.create_index_spec(&doc! {"key": {"email": 1}, "name": "email_1", "unique": true})
            .expect("index");
        // Explicitly simple on a collated collection.
        c.create_index_spec(
            &doc! {"key": {"email": 1}, "name": "email_simple", "collation": {"locale": "simple"}},
        )
        .expect("simple index");
        c.insert_one(doc! {"email": "Ann@x.org", "n": "ann"})
            .expect("insert");
    }
    for round in 0..2 {
        let db = Database::open_with(&dir, opts.clone()).expect("reopen");
        let c = db.collection("p");
        assert_eq!(c.options().expect("options"), options);
        let idx = index_of(&db, "p", "email_1");
        assert_eq!(
            idx.get_document("collation")
                .expect("collation")
                .get_i32("strength")
                .ok(),
            Some(2)
        );
        assert!(index_of(&db, "p", "email_simple")
            .get("collation")
            .is_none());
        let e = c
            .insert_one(doc! {"email": "ANN@X.ORG", "n": "dup"})
            .expect_err("duplicate under strength 2");
        assert_eq!(e.code(), 11000);
        assert_eq!(
            c.count(doc! {"email": "ann@X.org"}).expect("count"),
            1,
            "the default collation applies"
        );
        c.check_invariants().expect("consistent");
        if round == 0 {
            db.checkpoint().expect("checkpoint");
        }
    }
}

fn access(plan: &Document) -> String {
    format!("{plan}")
}

#[test]
fn planner_uses_a_collated_index_only_under_its_collation() {
    let db = Database::in_memory();
    let c = db.collection("t");
    c.create_index_spec(&doc! {"key": {"k": 1}, "name": "k_ci", "collation": ci()})
        .expect("index");
    for (i, k) in ["a", "A", "b", "B", "c"].iter().enumerate() {
        c.insert_one(doc! {"_id": i as i32, "k": *k, "n": format!("{k}{i}")})
            .expect("insert");
    }
    c.insert_one(doc! {"_id": 9, "k": 7, "n": "seven"})
        .expect("insert");
    // Same collation: the index answers string equality.
    let ci_coll = db.collection("t").with_collation(Some(ci()));
    let plan = ci_coll.find(doc! {"k": "a"}).explain().expect("explain");
    assert!(access(&plan).contains("k_ci"), "{plan}");
    assert_eq!(
        names(ci_coll.find(doc! {"k": "a"}).run().expect("find")),
        ["A1", "a0"]
    );
    // Simple: not for strings (a collection scan), yes for a number.
    let plan = c.find(doc! {"k": "a"}).explain().expect("explain");
    assert!(!access(&plan).contains("k_ci"), "{plan}");
    assert_eq!(names(c.find(doc! {"k": "a"}).run().expect("find")), ["a0"]);
    let plan = c.find(doc! {"k": 7}).explain().expect("explain");
    assert!(access(&plan).contains("k_ci"), "{plan}");
    assert_eq!(names(c.find(doc! {"k": 7}).run().expect("find")), ["seven"]);
    // Another collation: not for strings either.
    let fr = db
        .collection("t")
        .with_collation(Some(doc! {"locale": "fr", "strength": 2}));
    let plan = fr.find(doc! {"k": "b"}).explain().expect("explain");
    assert!(!access(&plan).contains("k_ci"), "{plan}");
    assert_eq!(
        names(fr.find(doc! {"k": "b"}).run().expect("find")),
        ["B3", "b2"]
    );
    // A sort under the index's collation is the index order.
    let sorted: Vec<Bson> = ci_coll
        .find(doc! {"k": {"$gte": "a", "$lte": "c"}})
        .sort(doc! {"k": 1})
        .run()
        .expect("sorted")
        .into_iter()
        .map(|d| d.get("k").cloned().unwrap_or(Bson::Null))
        .collect();
    let lower: Vec<String> = sorted
        .iter()
        .map(|v| v.as_str().unwrap_or("").to_lowercase())
        .collect();
    assert_eq!(lower, ["a", "a", "b", "b", "c"]);
}

/// A collated read answers the same under every strategy, through the
/// collated index and without it, and equals a plain reference (case-folded
/// comparison), while the collection changes between reads.
#[test]
fn collated_reads_agree_under_every_strategy() {
    let db = Database::in_memory();
    let with_index = db.collection("i");
    with_index
        .create_index_spec(&doc! {"key": {"k": 1}, "name": "k_ci", "collation": ci()})
        .expect("index");
    let words = [
        "apple", "Apple", "APPLE", "pear", "Pear", "fig", "Fig", "kiwi",
    ];
    let mut model: Vec<(i32, String)> = Vec::new();
    for round in 0..20i32 {
        let id = round;
        let k = words[(round as usize * 7) % words.len()].to_string();
        for coll in ["i", "s"] {
            db.collection(coll)
                .insert_one(doc! {"_id": id, "k": &k, "n": format!("{id}")})
                .expect("insert");
        }
        model.push((id, k));
        if round % 3 == 2 {
            let victim = model.remove(0).0;
            for coll in ["i", "s"] {
                db.collection(coll)
                    .delete_one(doc! {"_id": victim})
                    .expect("delete");
            }
        }
        for probe in ["APPLE", "pear", "FIG", "kiwi"] {
            let mut want: Vec<String> = model
                .iter()
                .filter(|(_, k)| k.to_lowercase() == probe.to_lowercase())
                .map(|(id, _)| id.to_string())
                .collect();
            want.sort();
            for coll in ["i", "s"] {
                for strategy in [Strategy::Cow, Strategy::Vls, Strategy::Olcp, Strategy::None] {
                    let got = db
                        .collection(coll)
                        .with_collation(Some(ci()))
                        .find(doc! {"k": probe})
                        .snapshot(strategy)
                        .run()
                        .expect("find");
                    assert_eq!(names(got), want, "{coll} {strategy:?} {probe}");
                }
            }
        }
    }
    db.collection("i").check_invariants().expect("consistent");
}

fn arr(d: &Document, k: &str) -> Vec<Bson> {
    d.get_array(k).expect("array").clone()
}

fn strs(v: &[&str]) -> Vec<Bson> {
    v.iter().map(|s| Bson::String(s.to_string())).collect()
}

/// MongoDB's update operators take the operation's collation (its update
/// nodes get the expression context's collator): `$addToSet`, `$pull`,
/// `$pullAll`, `$min`/`$max`, `$push`'s `$sort` and `arrayFilters`; so does a
/// pipeline update's expressions. Without one, they compare binary.
#[test]
fn update_operators_compare_under_the_collation() {
    let db = Database::in_memory();
    let plain = db.collection("u");
    let c = db.collection("u").with_collation(Some(ci()));
    let fresh = || {
        plain.delete_many(doc! {}).expect("clear");
        plain
            .insert_one(doc! {"_id": 1, "tags": ["Red", "blue"], "m": "b",
            "s": ["b", "C", "a"], "g": [{"k": "X", "v": 1}, {"k": "y", "v": 2}]})
            .expect("insert");
    };
    let get = || plain.find_one(doc! {"_id": 1}).expect("find").expect("doc");

    fresh();
    c.update_one(
        doc! {"_id": 1},
        doc! {"$addToSet": {"tags": {"$each": ["RED", "green", "GREEN"]}}},
    )
    .expect("addToSet");
    assert_eq!(arr(&get(), "tags"), strs(&["Red", "blue", "green"]));
    fresh();
    plain
        .update_one(doc! {"_id": 1}, doc! {"$addToSet": {"tags": "RED"}})
        .expect("binary addToSet");
    assert_eq!(arr(&get(), "tags"), strs(&["Red", "blue", "RED"]));

    fresh();
    c.update_one(doc! {"_id": 1}, doc! {"$pull": {"tags": "red"}})
        .expect("pull");
    assert_eq!(arr(&get(), "tags"), strs(&["blue"]));
    fresh();
    c.update_one(doc! {"_id": 1}, doc! {"$pull": {"tags": {"$in": ["BLUE"]}}})
        .expect("pull $in");
    assert_eq!(arr(&get(), "tags"), strs(&["Red"]));
    fresh();
    c.update_one(doc! {"_id": 1}, doc! {"$pull": {"g": {"k": "x"}}})
        .expect("pull query");
    assert_eq!(arr(&get(), "g").len(), 1);
    fresh();
    plain
        .update_one(doc! {"_id": 1}, doc! {"$pull": {"tags": "red"}})
        .expect("binary pull");
    assert_eq!(arr(&get(), "tags").len(), 2);

    fresh();
    c.update_one(
        doc! {"_id": 1},
        doc! {"$pullAll": {"tags": ["RED", "BLUE"]}},
    )
    .expect("pullAll");
    assert_eq!(arr(&get(), "tags"), Vec::<Bson>::new());

    // $min/$max: "B" equals "b" under strength 2 but is below it in
    // binary; "C" is above "b" under the collation but below it in binary.
    fresh();
    let r = c
        .update_one(doc! {"_id": 1}, doc! {"$min": {"m": "B"}})
        .expect("min");
    assert_eq!((r.modified, get().get_str("m").ok()), (0, Some("b")));
    fresh();
    plain
        .update_one(doc! {"_id": 1}, doc! {"$min": {"m": "B"}})
        .expect("binary min");
    assert_eq!(get().get_str("m").ok(), Some("B"));
    fresh();
    c.update_one(doc! {"_id": 1}, doc! {"$max": {"m": "C"}})
        .expect("max");
    assert_eq!(get().get_str("m").ok(), Some("C"));
    fresh();
    plain
        .update_one(doc! {"_id": 1}, doc! {"$max": {"m": "C"}})
        .expect("binary max");
    assert_eq!(get().get_str("m").ok(), Some("b"));

    // $push $sort: collated order puts "a" < "b" < "C".
    fresh();
    c.update_one(
        doc! {"_id": 1},
        doc! {"$push": {"s": {"$each": [], "$sort": 1}}},
    )
    .expect("push sort");
    assert_eq!(arr(&get(), "s"), strs(&["a", "b", "C"]));
    fresh();
    plain
        .update_one(
            doc! {"_id": 1},
            doc! {"$push": {"s": {"$each": [], "$sort": 1}}},
        )
        .expect("binary push sort");
    assert_eq!(arr(&get(), "s"), strs(&["C", "a", "b"]));
    fresh();
    c.update_one(
        doc! {"_id": 1},
        doc! {"$push": {"g": {"$each": [], "$sort": {"k": -1}}}},
    )
    .expect("push sort pattern");
    let ks: Vec<Bson> = arr(&get(), "g")
        .iter()
        .map(|e| e.as_document().expect("doc").get("k").expect("k").clone())
        .collect();
    assert_eq!(ks, strs(&["y", "X"]));

    // arrayFilters.
    fresh();
    let spec =
        duetdb::lang::UpdateSpec::parse_with(&doc! {"$set": {"g.$[e].v": 9}}, &[doc! {"e.k": "x"}])
            .expect("spec");
    c.update_with_spec(doc! {"_id": 1}, spec, false, Default::default())
        .expect("arrayFilters");
    assert_eq!(
        arr(&get(), "g")[0]
            .as_document()
            .expect("doc")
            .get_i32("v")
            .ok(),
        Some(9)
    );

    // A pipeline update's expressions.
    fresh();
    let spec = duetdb::lang::UpdateSpec::parse_pipeline(
        &[Bson::Document(
            doc! {"$set": {"eq": {"$eq": ["$m", "B"]}, "in": {"$in": ["RED", "$tags"]}}},
        )],
        None,
        &[],
    )
    .expect("pipeline");
    c.update_with_spec(doc! {"_id": 1}, spec.clone(), false, Default::default())
        .expect("pipeline update");
    let d = get();
    assert_eq!(
        (d.get_bool("eq").ok(), d.get_bool("in").ok()),
        (Some(true), Some(true))
    );
    fresh();
    plain
        .update_with_spec(doc! {"_id": 1}, spec, false, Default::default())
        .expect("binary pipeline update");
    let d = get();
    assert_eq!(
        (d.get_bool("eq").ok(), d.get_bool("in").ok()),
        (Some(false), Some(false))
    );

    // findAndModify.
    fresh();
    let out = c
        .find_one_and_update(
            doc! {"tags": "RED"},
            doc! {"$addToSet": {"tags": "BLUE"}},
            duetdb::FindAndModifyOptions {
                return_document: duetdb::ReturnDocument::After,
                ..Default::default()
            },
        )
        .expect("findAndModify")
        .expect("found");
    assert_eq!(arr(&out, "tags"), strs(&["Red", "blue"]));
}

/// A collection's default collation applies to its updates' operators too.
#[test]
fn update_operators_use_the_collection_default() {
    let db = Database::in_memory();
    db.create_collection_with(
        "d",
        CollectionOptions {
            collation: Collator::from_document(&ci()).expect("collation"),
            ..Default::default()
        },
    )
    .expect("create");
    let c = db.collection("d");
    c.insert_one(doc! {"_id": 1, "tags": ["a"]})
        .expect("insert");
    c.update_one(doc! {"_id": 1}, doc! {"$addToSet": {"tags": "A"}})
        .expect("addToSet");
    let d = c.find_one(doc! {"_id": 1}).expect("find").expect("doc");
    assert_eq!(arr(&d, "tags"), strs(&["a"]));
    // An explicit simple collation overrides it.
    db.collection("d")
        .with_collation(Some(doc! {"locale": "simple"}))
        .update_one(doc! {"_id": 1}, doc! {"$addToSet": {"tags": "A"}})
        .expect("simple addToSet");
    let d = c.find_one(doc! {"_id": 1}).expect("find").expect("doc");
    assert_eq!(arr(&d, "tags"), strs(&["a", "A"]));
}

/// A find's `$elemMatch` projection compares under the find's collation.
#[test]
fn elem_match_projection_uses_the_collation() {
    let db = Database::in_memory();
    let c = db.collection("p");
    c.insert_one(doc! {"_id": 1, "xs": ["Apple", "pear"]})
        .expect("insert");
    let project = |coll: Option<Document>| {
        db.collection("p")
            .with_collation(coll)
            .find(doc! {})
            .projection(doc! {"xs": {"$elemMatch": {"$eq": "apple"}}})
            .run()
            .expect("find")
    };
    assert_eq!(
        project(Some(ci()))[0].get_array("xs").ok(),
        Some(&strs(&["Apple"]))
    );
    assert!(project(None)[0].get("xs").is_none());
}

/// `$group` keys and its `$addToSet` accumulator under the command's
/// collation: `"a"` and `"A"` are one group and one element under strength
/// 2, in memory and when the group spills to disk.
#[test]
fn group_keys_and_add_to_set_follow_the_collation() {
    let db = Database::in_memory();
    let c = db.collection("g");
    let mut docs = Vec::new();
    for i in 0..4000 {
        let k = if (i / 1000) % 2 == 0 { "key" } else { "KEY" };
        let v = if (i / 2000) % 2 == 0 { "x" } else { "X" };
        docs.push(doc! {"_id": i, "k": format!("{k}{}", i % 1000), "v": v});
    }
    c.insert_many(docs, true).expect("insert");
    let pipeline = vec![
        // Set elements that are documents holding strings, too.
        doc! {"$group": {"_id": "$k", "vs": {"$addToSet": {"c": "$v"}}, "n": {"$sum": 1}}},
        doc! {"$sort": {"_id": 1}},
    ];
    let spill_dir = tempfile::tempdir().expect("tempdir");
    for limits in [
        duetdb::ReadLimits::default(),
        duetdb::ReadLimits {
            memory_limit_bytes: 32 * 1024,
            allow_disk_use: true,
            spill_dir: Some(spill_dir.path().to_path_buf()),
            ..duetdb::ReadLimits::default()
        },
    ] {
        let (out, explain) = db
            .collection("g")
            .with_collation(Some(ci()))
            .aggregate_limited(pipeline.clone(), Strategy::Vls, &limits)
            .expect("aggregate");
        assert_eq!(out.len(), 1000, "{limits:?}");
        let small = limits.memory_limit_bytes < duetdb::DEFAULT_MEMORY_LIMIT;
        assert_eq!(explain.spills.group > 0, small, "{explain:?}");
        for d in &out {
            assert_eq!(d.get_i32("n").ok(), Some(4), "{d}");
            assert_eq!(d.get_array("vs").map(Vec::len).ok(), Some(1), "{d}");
        }
        let (binary, _) = db
            .collection("g")
            .aggregate_limited(pipeline.clone(), Strategy::Vls, &limits)
            .expect("aggregate");
        assert_eq!(binary.len(), 2000);
    }
    // $sortByCount groups under the collation too.
    let out = db
        .collection("g")
        .with_collation(Some(ci()))
        .aggregate(vec![doc! {"$sortByCount": "$v"}])
        .expect("sortByCount");
    assert_eq!(out.len(), 1);
}

/// A database-level `{aggregate: 1}` (`$documents`) takes the command's
/// collation.
#[test]
fn database_aggregate_takes_the_collation() {
    let db = Database::in_memory();
    let pipeline = vec![
        doc! {"$documents": [{"k": "a"}, {"k": "A"}, {"k": "b"}]},
        doc! {"$group": {"_id": "$k", "eq": {"$max": {"$eq": ["$k", "B"]}}}},
        doc! {"$sort": {"_id": 1}},
    ];
    let out = db
        .aggregate_collated(
            pipeline.clone(),
            &duetdb::ReadLimits::default(),
            None,
            None,
            Some(&ci()),
        )
        .expect("aggregate");
    assert_eq!(out.len(), 2);
    assert_eq!(out[1].get_bool("eq").ok(), Some(true));
    let out = db
        .aggregate(pipeline, &duetdb::ReadLimits::default(), None)
        .expect("aggregate");
    assert_eq!(out.len(), 3);
    assert!(out.iter().all(|d| d.get_bool("eq").ok() == Some(false)));
}

/// Inside a transaction, reads, updates and deletes take the `collation`
/// option, else the collection's default, as live operations do.
#[test]
fn transactions_use_collations() {
    let db = Database::in_memory();
    db.create_collection_with(
        "d",
        CollectionOptions {
            collation: Collator::from_document(&ci()).expect("collation"),
            ..Default::default()
        },
    )
    .expect("create");
    db.collection("d")
        .insert_many(
            vec![
                doc! {"_id": 1, "n": "Ann", "t": ["x"]},
                doc! {"_id": 2, "n": "ann"},
            ],
            true,
        )
        .expect("insert");
    db.collection("s")
        .insert_many(
            vec![doc! {"_id": 1, "n": "Bob"}, doc! {"_id": 2, "n": "bob"}],
            true,
        )
        .expect("insert");
    let mut txn = db.begin(duetdb::TxnOptions::default());
    {
        // The collection's default.
        let d = txn.collection("d");
        assert_eq!(d.count(doc! {"n": "ANN"}).expect("count"), 2);
        assert_eq!(d.distinct("n", doc! {}).expect("distinct").len(), 1);
        d.update_one(doc! {"_id": 1}, doc! {"$addToSet": {"t": "X"}})
            .expect("update");
        let got = d.find_one(doc! {"_id": 1}).expect("find").expect("doc");
        assert_eq!(arr(&got, "t"), strs(&["x"]));
        let g = d
            .aggregate(vec![doc! {"$group": {"_id": "$n"}}])
            .expect("aggregate");
        assert_eq!(g.len(), 1);
    }
    {
        // The option, on a simple collection.
        let s = txn.collection("s").with_collation(Some(ci()));
        assert_eq!(s.count(doc! {"n": "BOB"}).expect("count"), 2);
        let r = s
            .update_many(doc! {"n": "BOB"}, doc! {"$set": {"seen": true}})
            .expect("update");
        assert_eq!(r.matched, 2);
        let sorted = s
            .find_with(
                doc! {},
                duetdb::FindOptions {
                    sort: Some(doc! {"n": 1, "_id": -1}),
                    ..Default::default()
                },
            )
            .expect("find");
        assert_eq!(sorted[0].get_i32("_id").ok(), Some(2));
        assert_eq!(s.delete_many(doc! {"n": "BOB"}).expect("delete"), 2);
    }
    assert_eq!(
        txn.collection("s").count(doc! {"n": "BOB"}).expect("count"),
        0
    );
    txn.commit().expect("commit");
    assert_eq!(db.collection("s").count(doc! {}).expect("count"), 0);
}

/// Issue #18: the `_id` index of a collection created with a collation
/// takes it (as MongoDB's): `_id`s equal under it conflict, a string `_id`
/// bound uses it, `listIndexes` shows it once as `_id_` with the collation,
/// and all of it survives recovery from the WAL and from a checkpoint.
#[test]
fn the_id_index_takes_the_default_collation_and_survives_recovery() {
    let fs = SimFs::new();
    let opts = DurabilityOptions {
        mode: Durability::Fsync,
        checkpoint_wal_bytes: u64::MAX,
        checkpoint_interval: None,
        background_checkpoints: false,
        vfs: Arc::new(fs.clone()),
        ..Default::default()
    };
    let dir = PathBuf::from("/db");
    let options = CollectionOptions {
        collation: Collator::from_document(&ci()).expect("collation"),
        ..Default::default()
    };
    {
        let db = Database::open_with(&dir, opts.clone()).expect("open");
        db.create_collection_with("p", options.clone())
            .expect("create");
        let c = db.collection("p");
        c.insert_one(doc! {"_id": "ann", "n": "a"}).expect("insert");
        let e = c.insert_one(doc! {"_id": "ANN"}).expect_err("dup");
        assert_eq!(e.code(), 11000);
        assert!(e.to_string().contains("_id_"), "{e}");
        // A simple collection: two documents.
        let plain = db.collection("plain");
        plain.insert_one(doc! {"_id": "ann"}).expect("insert");
        plain.insert_one(doc! {"_id": "ANN"}).expect("simple _id");
    }
    for round in 0..2 {
        let db = Database::open_with(&dir, opts.clone()).expect("reopen");
        let c = db.collection("p");
        let list = c.list_indexes().expect("indexes");
        assert_eq!(list.len(), 1, "{list:?}");
        assert_eq!(list[0].get_str("name").ok(), Some("_id_"));
        assert_eq!(
            list[0]
                .get_document("collation")
                .expect("collation")
                .get_i32("strength")
                .ok(),
            Some(2)
        );
        let e = c.insert_one(doc! {"_id": "Ann"}).expect_err("dup");
        assert_eq!(e.code(), 11000, "round {round}");
        let plan = c.find(doc! {"_id": "ANN"}).explain().expect("explain");
        assert!(access(&plan).contains("_id_"), "{plan}");
        assert!(!access(&plan).contains("COLLSCAN"), "{plan}");
        assert_eq!(
            names(c.find(doc! {"_id": "ANN"}).run().expect("find")),
            ["a"]
        );
        assert_eq!(c.stats().expect("stats").indexes.len(), 1);
        c.check_invariants().expect("consistent");
        assert!(db.collection("plain").list_indexes().expect("list")[0]
            .get("collation")
            .is_none());
        if round == 0 {
            db.checkpoint().expect("checkpoint");
        }
    }
}
