//! Collection options through the engine API (issue #18 items 7 and 8):
//! validation of live writes and of writes inside transactions (a refused
//! write leaves the transaction's other writes in place), bypass, capped
//! trimming, and both surviving recovery from the WAL and from a checkpoint.

use std::path::PathBuf;
use std::sync::Arc;

use duetdb::bson::{doc, Bson, Document};
use duetdb::storage::SimFs;
use duetdb::{CollectionOptions, Crud, Database, Durability, DurabilityOptions, Error};

fn validated() -> CollectionOptions {
    CollectionOptions {
        validator: Some(Arc::new(doc! {"a": {"$gte": 0}})),
        ..Default::default()
    }
}

fn capped(max: u64) -> CollectionOptions {
    CollectionOptions {
        capped: true,
        capped_size: Some(4096),
        capped_max: Some(max),
        ..Default::default()
    }
}

fn ids(db: &Database, coll: &str) -> Vec<Bson> {
    db.snapshot()
        .collection(coll)
        .find(doc! {})
        .run()
        .expect("find")
        .into_iter()
        .map(|d: Document| d.get("_id").cloned().unwrap_or(Bson::Null))
        .collect()
}

#[test]
fn live_writes_are_validated_and_bypass_skips() {
    let db = Database::in_memory();
    db.create_collection_with("c", validated()).expect("create");
    let c = db.collection("c");
    c.insert_one(doc! {"_id": 1, "a": 1}).expect("valid");
    let e = c.insert_one(doc! {"_id": 2, "a": -1}).expect_err("invalid");
    assert_eq!(e.code(), 121);
    db.collection("c")
        .bypass_document_validation(true)
        .insert_one(doc! {"_id": 3, "a": -1})
        .expect("bypassed");
    // Stored with the defaults MongoDB lists beside a validator.
    assert_eq!(
        c.options().expect("options").to_document(),
        doc! {"validator": {"a": {"$gte": 0}}, "validationLevel": "strict", "validationAction": "error"}
    );
    // A validator that does not compile is refused; nothing changes.
    let bad = c.set_options(|o| o.validator = Some(Arc::new(doc! {"a": {"$bogus": 1}})));
    assert!(bad.is_err());
    assert_eq!(c.options().expect("options"), validated().with_defaults());
}

#[test]
fn transaction_writes_are_validated_and_the_others_stay() {
    let db = Database::in_memory();
    db.create_collection_with("c", validated()).expect("create");
    db.collection("c")
        .insert_one(doc! {"_id": 1, "a": 1})
        .expect("valid");
    let mut txn = db.begin(Default::default());
    txn.insert_one("c", doc! {"_id": 2, "a": 2}).expect("valid");
    let e = txn
        .insert_one("c", doc! {"_id": 3, "a": -3})
        .expect_err("invalid");
    assert_eq!(e.code(), 121);
    let e = txn
        .update_one("c", doc! {"_id": 1}, doc! {"$set": {"a": -1}})
        .expect_err("invalid");
    assert_eq!(e.code(), 121);
    txn.collection("c")
        .bypass_document_validation(true)
        .insert_one(doc! {"_id": 4, "a": -4})
        .expect("bypassed");
    txn.commit().expect("commit");
    assert_eq!(
        ids(&db, "c"),
        [Bson::Int32(1), Bson::Int32(2), Bson::Int32(4)]
    );
}

#[test]
fn capped_collections_trim_and_refuse_transactions() {
    let db = Database::in_memory();
    db.create_collection_with("c", capped(2)).expect("create");
    let c = db.collection("c");
    for i in 0..5 {
        c.insert_one(doc! {"_id": i}).expect("insert");
    }
    assert_eq!(ids(&db, "c"), [Bson::Int32(3), Bson::Int32(4)]);
    let mut txn = db.begin(Default::default());
    let e = txn.insert_one("c", doc! {"_id": 9}).expect_err("refused");
    assert_eq!(e.code(), 263);
    assert!(matches!(
        db.create_collection_with(
            "d",
            CollectionOptions {
                capped: true,
                ..Default::default()
            }
        ),
        Err(Error::Coded { code: 72, .. })
    ));
}

#[test]
fn options_and_trims_survive_recovery() {
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
    {
        let db = Database::open_with(&dir, opts.clone()).expect("open");
        db.create_collection_with("v", validated()).expect("create");
        db.create_collection_with("k", capped(2)).expect("create");
        for i in 0..4 {
            db.collection("k")
                .insert_one(doc! {"_id": i})
                .expect("insert");
        }
    }
    for round in 0..2 {
        let db = Database::open_with(&dir, opts.clone()).expect("reopen");
        assert_eq!(
            db.collection("v").options().expect("v"),
            validated().with_defaults()
        );
        assert_eq!(db.collection("k").options().expect("k"), capped(2));
        assert_eq!(ids(&db, "k"), [Bson::Int32(2), Bson::Int32(3)]);
        let e = db
            .collection("v")
            .insert_one(doc! {"a": -1})
            .expect_err("invalid");
        assert_eq!(e.code(), 121);
        db.collection("k").check_invariants().expect("consistent");
        if round == 0 {
            // The second round recovers from this checkpoint.
            db.checkpoint().expect("checkpoint");
        }
    }
}

/// `convertToCapped` and `cloneCollectionAsCapped` are logged as plain
/// effects that rebuild the same capped collections on replay.
#[test]
fn converted_collections_survive_recovery() {
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
    let (before, cloned) = {
        let db = Database::open_with(&dir, opts.clone()).expect("open");
        let c = db.collection("c");
        for i in 0..60 {
            c.insert_one(doc! {"_id": i, "pad": "y".repeat(200)})
                .expect("insert");
        }
        c.clone_as_capped("copy", 5000).expect("clone");
        c.convert_to_capped(4096).expect("convert");
        c.insert_one(doc! {"_id": 60, "pad": "y".repeat(200)})
            .expect("insert after");
        (ids(&db, "c"), ids(&db, "copy"))
    };
    assert!(before.len() < 60 && before.last() == Some(&Bson::Int32(60)));
    let db = Database::open_with(&dir, opts).expect("reopen");
    assert_eq!(ids(&db, "c"), before);
    assert_eq!(ids(&db, "copy"), cloned);
    assert!(db.collection("c").options().expect("c").capped);
    assert_eq!(
        db.collection("copy").options().expect("copy").capped_size,
        Some(5120)
    );
    db.collection("c").check_invariants().expect("consistent");
}
