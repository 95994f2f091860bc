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
use duetdb::{Collator, CollectionOptions, Database, Durability, DurabilityOptions, Strategy};

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
