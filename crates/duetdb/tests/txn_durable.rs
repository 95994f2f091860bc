//! A committed transaction is one WAL record: after a reopen all of its writes
//! are there; a commit that failed left nothing behind.

use duetdb::bson::doc;
use duetdb::{Database, IndexOptions};

#[test]
fn committed_transactions_survive_a_reopen_and_failed_ones_leave_nothing() {
    let dir = tempfile::tempdir().expect("temp dir");
    {
        let db = Database::open(dir.path()).expect("open");
        let acct = db.collection("acct");
        acct.insert_many((0..10).map(|i| doc! {"_id": i, "bal": 100, "tag": i}), true)
            .expect("seed");
        acct.create_index(
            doc! {"tag": 1},
            IndexOptions {
                unique: true,
                ..Default::default()
            },
        )
        .expect("index");
        db.transaction(|tx| {
            tx.update_one("acct", doc! {"_id": 1}, doc! {"$inc": {"bal": -30}})?;
            tx.update_one("acct", doc! {"_id": 2}, doc! {"$inc": {"bal": 30}})?;
            tx.insert_one("log", doc! {"_id": "t1", "amount": 30})?;
            Ok(())
        })
        .expect("commit");
        // Fails at commit on the unique index: nothing of it may be recovered.
        let mut tx = db.begin(Default::default());
        tx.update_one("acct", doc! {"_id": 3}, doc! {"$set": {"tag": "x"}})
            .expect("buffered");
        tx.update_one("acct", doc! {"_id": 4}, doc! {"$set": {"tag": "x"}})
            .expect("buffered");
        tx.insert_one("log", doc! {"_id": "t2"}).expect("buffered");
        assert_eq!(tx.commit().expect_err("duplicate tag").code(), 11000);
    }
    let db = Database::open(dir.path()).expect("reopen");
    let acct = db.collection("acct");
    let bal = |id: i32| {
        acct.find_one(doc! {"_id": id})
            .expect("find")
            .expect("doc")
            .get_i32("bal")
            .expect("bal")
    };
    assert_eq!((bal(1), bal(2)), (70, 130));
    assert_eq!(acct.count(doc! {"tag": "x"}).expect("count"), 0);
    let log = db.collection("log");
    assert_eq!(log.count(doc! {}).expect("count"), 1);
    assert!(log.find_one(doc! {"_id": "t1"}).expect("find").is_some());
    acct.check_invariants().expect("invariants");
}
