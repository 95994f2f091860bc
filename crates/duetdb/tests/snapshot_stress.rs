//! Concurrency stress: while writer threads keep changing data, readers holding
//! `db.snapshot()` must see exactly the state at its csn, however long they hold it.
//!
//! Invariants checked on every snapshot:
//! 1. its answer never changes while it is held (repeatable), by scan and by index;
//! 2. a two-document update is visible entirely or not at all (the sum of the
//!    `pairs` counters is even);
//! 3. a transfer done as debit-then-credit commands balances with its ledger
//!    (`out`/`in` fields written in the same command as the balance change);
//! 4. csn of successive snapshots never decreases.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use duetdb::bson::doc;
use duetdb::{Database, IndexOptions};

const ACCOUNTS: i32 = 64;
const TOTAL: i64 = 64 * 1000;

fn sum(snap: &duetdb::Snapshot) -> i64 {
    snap.collection("acct")
        .find(doc! {})
        .run()
        .expect("scan")
        .iter()
        .map(|d| d.get_i64("bal").expect("bal"))
        .sum()
}

#[test]
fn snapshots_stay_consistent_under_concurrent_writes() {
    let db = Database::in_memory();
    let c = db.collection("acct");
    c.create_index(doc! {"bal": 1}, IndexOptions::default())
        .expect("index");
    for i in 0..ACCOUNTS {
        c.insert_one(doc! {"_id": i, "bal": 1000i64}).expect("seed");
    }
    let stop = Arc::new(AtomicBool::new(false));
    let mut writers = Vec::new();
    for w in 0..2 {
        let db = db.clone();
        let stop = stop.clone();
        writers.push(thread::spawn(move || {
            let c = db.collection("acct");
            let mut x: u64 = 0x9E37_79B9 ^ w;
            let mut n = 0u64;
            while !stop.load(Ordering::Relaxed) {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                let from = (x % ACCOUNTS as u64) as i32;
                let to = ((x >> 16) % ACCOUNTS as u64) as i32;
                let amt = (x >> 32) as i64 % 50;
                // One command touching two documents: both increments must
                // become visible at one csn, so the sum of `pairs` is always even.
                if from != to {
                    let r = c
                        .update_many(
                            doc! {"_id": {"$in": [from, to]}},
                            doc! {"$inc": {"pairs": 1}},
                        )
                        .expect("pair update");
                    assert_eq!(r.matched, 2);
                    // A transfer as two commands: a snapshot may fall between them,
                    // which the `out`/`in` ledger accounts for.
                    c.update_one(doc! {"_id": from}, doc! {"$inc": {"bal": -amt, "out": amt}})
                        .expect("debit");
                    c.update_one(doc! {"_id": to}, doc! {"$inc": {"bal": amt, "in": amt}})
                        .expect("credit");
                }
                n += 1;
            }
            n
        }));
    }
    let deadline = Instant::now() + Duration::from_millis(1500);
    let mut last_csn = 0;
    let mut checks = 0;
    while Instant::now() < deadline {
        let snap = db.snapshot();
        assert!(snap.csn() >= last_csn, "csn went backwards");
        last_csn = snap.csn();
        let first = snap.collection("acct").find(doc! {}).run().expect("scan");
        // Money in flight: debits whose credit is not yet committed at this csn.
        let debited: i64 = first.iter().map(|d| d.get_i64("out").unwrap_or(0)).sum();
        let credited: i64 = first.iter().map(|d| d.get_i64("in").unwrap_or(0)).sum();
        let balances: i64 = first.iter().map(|d| d.get_i64("bal").expect("bal")).sum();
        assert_eq!(
            balances + (debited - credited),
            TOTAL,
            "balances inconsistent with the transfer log"
        );
        let pairs: i32 = first.iter().map(|d| d.get_i32("pairs").unwrap_or(0)).sum();
        assert_eq!(pairs % 2, 0, "half of a two-document update is visible");
        thread::sleep(Duration::from_millis(2));
        // Repeatable: the same snapshot answers the same, through the index too.
        let again = snap.collection("acct").find(doc! {}).run().expect("rescan");
        assert_eq!(first, again, "a held snapshot changed");
        let by_index = snap
            .collection("acct")
            .find(doc! {"bal": {"$gte": i64::MIN}})
            .run()
            .expect("ixscan");
        assert_eq!(by_index.len(), first.len());
        assert_eq!(sum(&snap), balances);
        checks += 1;
    }
    stop.store(true, Ordering::Relaxed);
    let writes: u64 = writers.into_iter().map(|w| w.join().expect("writer")).sum();
    assert!(
        checks > 10 && writes > 10,
        "too little concurrency exercised: {checks} checks, {writes} writes"
    );
    c.check_invariants().expect("invariants");
}
