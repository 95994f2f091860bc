//! Transactions: read-your-writes, abort, conflicts, unique constraints at
//! commit, limits, and the write-skew test that tells the two levels apart.

// Tests fail loudly on any unexpected error; unwrap is the point here.
#![allow(clippy::unwrap_used)]

use std::time::Duration;

use duetdb::bson::{doc, Bson, Document};
use duetdb::testing::PlantedBug;
use duetdb::{Database, Error, IndexOptions, Isolation, TxnOptions};
use proptest::prelude::*;

fn accounts(n: i32, balance: i32) -> Database {
    let db = Database::in_memory();
    let c = db.collection("acct");
    for i in 0..n {
        c.insert_one(doc! {"_id": i, "balance": balance, "on_call": true})
            .unwrap();
    }
    db
}

fn opts(isolation: Isolation) -> TxnOptions {
    TxnOptions {
        isolation,
        ..Default::default()
    }
}

#[test]
fn read_your_writes_and_atomic_visibility() {
    let db = accounts(3, 100);
    let mut tx = db.begin(TxnOptions::default());
    tx.update_one("acct", doc! {"_id": 0}, doc! {"$inc": {"balance": -10}})
        .unwrap();
    tx.update_one("acct", doc! {"_id": 1}, doc! {"$inc": {"balance": 10}})
        .unwrap();
    tx.insert_one("acct", doc! {"_id": 9, "balance": 1})
        .unwrap();
    tx.delete_one("acct", doc! {"_id": 2}).unwrap();
    // The transaction sees its own writes.
    let b0 = tx.get("acct", &Bson::Int32(0)).unwrap().unwrap();
    assert_eq!(b0.get_i32("balance").unwrap(), 90);
    assert_eq!(tx.count("acct", doc! {}).unwrap(), 3);
    assert_eq!(
        tx.count("acct", doc! {"balance": {"$gte": 100}}).unwrap(),
        1
    );
    assert!(tx.find_one("acct", doc! {"_id": 2}).unwrap().is_none());
    let sorted = tx
        .find_with(
            "acct",
            doc! {},
            duetdb::FindOptions {
                sort: Some(doc! {"balance": -1}),
                ..Default::default()
            },
        )
        .unwrap();
    let ids: Vec<i32> = sorted.iter().map(|d| d.get_i32("_id").unwrap()).collect();
    assert_eq!(ids, vec![1, 0, 9]);
    // Nobody else does.
    let c = db.collection("acct");
    assert_eq!(c.count(doc! {}).unwrap(), 3);
    assert!(c.find_one(doc! {"_id": 9}).unwrap().is_none());
    let before = db.csn();
    let info = tx.commit().unwrap();
    assert_eq!(info.csn, before + 1, "one commit, one csn");
    assert_eq!(info.outcome.inserted, 1);
    assert_eq!(info.outcome.updated, 2);
    assert_eq!(info.outcome.deleted, 1);
    assert_eq!(c.count(doc! {}).unwrap(), 3);
    assert_eq!(
        c.find_one(doc! {"_id": 1})
            .unwrap()
            .unwrap()
            .get_i32("balance")
            .ok(),
        Some(110)
    );
    c.check_invariants().unwrap();
}

#[test]
fn abort_and_drop_change_nothing() {
    let db = accounts(2, 5);
    let csn = db.csn();
    let mut tx = db.begin(TxnOptions::default());
    tx.delete_many("acct", doc! {}).unwrap();
    tx.insert_one("other", doc! {"x": 1}).unwrap();
    tx.abort();
    {
        let mut tx = db.begin(TxnOptions::default());
        tx.update_many("acct", doc! {}, doc! {"$set": {"balance": 0}})
            .unwrap();
    }
    assert_eq!(db.csn(), csn);
    assert_eq!(db.collection("acct").count(doc! {}).unwrap(), 2);
    assert!(!db.list_collection_names().contains(&"other".to_string()));
}

#[test]
fn first_committer_wins() {
    let db = accounts(2, 0);
    let mut t1 = db.begin(TxnOptions::default());
    let mut t2 = db.begin(TxnOptions::default());
    t1.update_one("acct", doc! {"_id": 0}, doc! {"$inc": {"balance": 1}})
        .unwrap();
    t2.update_one("acct", doc! {"_id": 0}, doc! {"$inc": {"balance": 1}})
        .unwrap();
    t2.update_one("acct", doc! {"_id": 1}, doc! {"$inc": {"balance": 1}})
        .unwrap();
    t1.commit().unwrap();
    let csn = db.csn();
    let e = t2.commit().unwrap_err();
    assert_eq!(e.code(), 112, "{e}");
    assert_eq!(e.error_labels(), ["TransientTransactionError"]);
    assert_eq!(db.csn(), csn, "a failed commit consumes no csn");
    let c = db.collection("acct");
    assert_eq!(
        c.find_one(doc! {"_id": 0})
            .unwrap()
            .unwrap()
            .get_i32("balance")
            .ok(),
        Some(1)
    );
    assert_eq!(
        c.find_one(doc! {"_id": 1})
            .unwrap()
            .unwrap()
            .get_i32("balance")
            .ok(),
        Some(0)
    );
}

#[test]
fn a_plain_write_conflicts_with_a_transaction_too() {
    let db = accounts(1, 0);
    let mut t = db.begin(TxnOptions::default());
    t.update_one("acct", doc! {"_id": 0}, doc! {"$set": {"x": 1}})
        .unwrap();
    // A no-op rewrite still creates a new version: conflict (conservative).
    db.collection("acct")
        .update_one(doc! {"_id": 0}, doc! {"$set": {"y": 1}})
        .unwrap();
    assert_eq!(t.commit().unwrap_err().code(), 112);
}

#[test]
fn concurrent_inserts_of_one_id_conflict() {
    let db = Database::in_memory();
    let mut t1 = db.begin(TxnOptions::default());
    let mut t2 = db.begin(TxnOptions::default());
    t1.insert_one("c", doc! {"_id": "k"}).unwrap();
    t2.insert_one("c", doc! {"_id": "k"}).unwrap();
    t1.commit().unwrap();
    assert_eq!(t2.commit().unwrap_err().code(), 112);
    // Inside one transaction a visible _id is a duplicate at once.
    let mut t3 = db.begin(TxnOptions::default());
    assert_eq!(
        t3.insert_one("c", doc! {"_id": "k"}).unwrap_err().code(),
        11000
    );
    // Deleting then re-inserting is fine.
    t3.delete_one("c", doc! {"_id": "k"}).unwrap();
    t3.insert_one("c", doc! {"_id": "k", "v": 2}).unwrap();
    t3.commit().unwrap();
    assert_eq!(
        db.collection("c").find_one(doc! {}).unwrap().unwrap(),
        doc! {"_id": "k", "v": 2}
    );
}

#[test]
fn unique_index_enforced_at_commit_changes_nothing() {
    let db = Database::in_memory();
    let c = db.collection("u");
    c.create_index(
        doc! {"email": 1},
        IndexOptions {
            unique: true,
            ..Default::default()
        },
    )
    .unwrap();
    c.insert_one(doc! {"_id": 1, "email": "a"}).unwrap();
    c.insert_one(doc! {"_id": 2, "email": "b"}).unwrap();
    // A delete frees a key that an insert of the same transaction takes.
    db.transaction(|tx| {
        tx.delete_one("u", doc! {"_id": 2})?;
        tx.insert_one("u", doc! {"_id": 3, "email": "b"})?;
        Ok(())
    })
    .unwrap();
    // Concurrent: both take "z" on different documents; the second fails.
    let mut t1 = db.begin(TxnOptions::default());
    let mut t2 = db.begin(TxnOptions::default());
    t1.insert_one("u", doc! {"_id": 10, "email": "z"}).unwrap();
    t2.update_one("u", doc! {"_id": 1}, doc! {"$set": {"email": "q"}})
        .unwrap();
    t2.delete_one("u", doc! {"_id": 3}).unwrap();
    t2.insert_one("u", doc! {"_id": 11, "email": "z"}).unwrap();
    t1.commit().unwrap();
    let before: Vec<Document> = c.find(doc! {}).run().unwrap();
    let e = t2.commit().unwrap_err();
    assert_eq!(e.code(), 11000, "{e}");
    assert_eq!(c.find(doc! {}).run().unwrap(), before, "nothing changed");
    c.check_invariants().unwrap();
}

#[test]
fn write_skew_is_told_apart() {
    // Two doctors on call; each checks that at least two are on call, then
    // goes off call. Deterministic interleaving: both read, then both commit.
    for (isolation, both_commit) in [
        (Isolation::Snapshot, true),
        (Isolation::Serializable, false),
    ] {
        let db = accounts(2, 0);
        let mut t1 = db.begin(opts(isolation));
        let mut t2 = db.begin(opts(isolation));
        for (t, me) in [(&mut t1, 0), (&mut t2, 1)] {
            assert_eq!(t.count("acct", doc! {"on_call": true}).unwrap(), 2);
            t.update_one("acct", doc! {"_id": me}, doc! {"$set": {"on_call": false}})
                .unwrap();
        }
        t1.commit().unwrap();
        let second = t2.commit();
        let on_call = db.collection("acct").count(doc! {"on_call": true}).unwrap();
        if both_commit {
            second.unwrap();
            assert_eq!(on_call, 0, "snapshot isolation admits write skew");
        } else {
            assert_eq!(second.unwrap_err().code(), 112);
            assert_eq!(on_call, 1, "serializable forbids write skew");
        }
    }
}

#[test]
fn serializable_phantom_and_point_reads() {
    // Phantom: a concurrent insert into a range the transaction read.
    let db = accounts(2, 0);
    let mut t = db.begin(TxnOptions::serializable());
    assert_eq!(t.count("acct", doc! {"balance": {"$gte": 0}}).unwrap(), 2);
    t.insert_one("log", doc! {"n": 2}).unwrap();
    db.collection("acct")
        .insert_one(doc! {"_id": 7, "balance": 3})
        .unwrap();
    assert_eq!(t.commit().unwrap_err().code(), 112);
    // A write outside the range does not conflict.
    let mut t = db.begin(TxnOptions::serializable());
    assert_eq!(t.count("acct", doc! {"balance": {"$gte": 1}}).unwrap(), 1);
    t.insert_one("log", doc! {"n": 1}).unwrap();
    db.collection("acct")
        .insert_one(doc! {"_id": 8, "balance": 0})
        .unwrap();
    t.commit().unwrap();
    // Point read of a document another commit changed.
    let mut t = db.begin(TxnOptions::serializable());
    t.get("acct", &Bson::Int32(0)).unwrap();
    t.insert_one("log", doc! {"n": 0}).unwrap();
    db.collection("acct")
        .update_one(doc! {"_id": 0}, doc! {"$set": {"balance": 5}})
        .unwrap();
    assert_eq!(t.commit().unwrap_err().code(), 112);
    // The same under snapshot isolation commits.
    let mut t = db.begin(TxnOptions::default());
    t.get("acct", &Bson::Int32(0)).unwrap();
    t.insert_one("log", doc! {"n": 0}).unwrap();
    db.collection("acct")
        .update_one(doc! {"_id": 0}, doc! {"$set": {"balance": 6}})
        .unwrap();
    t.commit().unwrap();
}

#[test]
fn serializable_text_reads_are_validated_at_commit() {
    // A `$text` read keeps no record of its matches: under serializable it
    // reads the whole collection, and a commit since the snapshot that
    // changed that collection fails the transaction.
    let db = Database::in_memory();
    let notes = db.collection("notes");
    notes
        .create_index_spec(&doc! {"key": {"body": "text"}})
        .unwrap();
    notes
        .insert_one(doc! {"_id": 1, "body": "coffee shop"})
        .unwrap();
    let search = doc! {"$text": {"$search": "coffee"}};
    let begin = |isolation: TxnOptions| {
        let mut t = db.begin(isolation);
        assert!(t.collection("notes").text_count(&search).unwrap() >= 1);
        t.insert_one("log", doc! {"seen": 1}).unwrap();
        t
    };
    let t = begin(TxnOptions::serializable());
    notes
        .insert_one(doc! {"_id": 2, "body": "coffee bar"})
        .unwrap();
    assert_eq!(t.commit().unwrap_err().code(), 112);
    // A change to another collection does not conflict.
    let t = begin(TxnOptions::serializable());
    db.collection("other").insert_one(doc! {"x": 1}).unwrap();
    t.commit().unwrap();
    // Snapshot isolation does not validate reads.
    let t = begin(TxnOptions::default());
    notes
        .insert_one(doc! {"_id": 3, "body": "coffee beans"})
        .unwrap();
    t.commit().unwrap();
}

#[test]
fn read_only_transactions_commit_without_the_writer() {
    let db = accounts(2, 1);
    let mut t = db.begin(TxnOptions::serializable());
    assert_eq!(t.count("acct", doc! {}).unwrap(), 2);
    db.collection("acct").insert_one(doc! {"_id": 5}).unwrap();
    let snap = t.snapshot_csn();
    let info = t.commit().unwrap();
    assert_eq!(info.csn, snap, "serializes at its snapshot");
}

#[test]
fn lifetime_and_size_limits() {
    let db = accounts(1, 0);
    let mut t = db.begin(TxnOptions {
        lifetime: Some(Duration::from_millis(20)),
        ..Default::default()
    });
    t.update_one("acct", doc! {"_id": 0}, doc! {"$set": {"x": 1}})
        .unwrap();
    std::thread::sleep(Duration::from_millis(40));
    let e = t.count("acct", doc! {}).unwrap_err();
    assert_eq!(e.code(), 290, "{e}");
    assert!(!t.is_active());
    assert_eq!(t.count("acct", doc! {}).unwrap_err().code(), 251);
    assert_eq!(t.commit().unwrap_err().code(), 251);
    // Unlimited lifetime.
    let mut t = db.begin(TxnOptions {
        lifetime: None,
        ..Default::default()
    });
    std::thread::sleep(Duration::from_millis(5));
    t.update_one("acct", doc! {"_id": 0}, doc! {"$set": {"x": 2}})
        .unwrap();
    t.commit().unwrap();
    // Write-set size: 4 documents of ~15 MiB go, the fifth does not.
    let big = "x".repeat(15 << 20);
    let mut t = db.begin(TxnOptions::default());
    for i in 0..4 {
        t.insert_one("big", doc! {"_id": i, "s": &big}).unwrap();
    }
    let e = t.insert_one("big", doc! {"_id": 4, "s": &big}).unwrap_err();
    assert_eq!(e.code(), 257, "{e}");
    assert_eq!(t.write_count(), 4, "a refused write changes nothing");
}

#[test]
fn transaction_retries_conflicts() {
    let db = accounts(1, 0);
    let c = db.collection("acct");
    let mut attempts = 0;
    db.transaction(|tx| {
        attempts += 1;
        tx.update_one("acct", doc! {"_id": 0}, doc! {"$inc": {"balance": 1}})?;
        if attempts < 3 {
            // Someone else commits in between: this attempt must conflict.
            c.update_one(doc! {"_id": 0}, doc! {"$inc": {"balance": 100}})
                .unwrap();
        }
        Ok(())
    })
    .unwrap();
    assert_eq!(attempts, 3);
    assert_eq!(
        c.find_one(doc! {})
            .unwrap()
            .unwrap()
            .get_i32("balance")
            .ok(),
        Some(201)
    );
    // Bounded: a body that always conflicts gives up with the conflict.
    let e = db
        .transaction_with(
            TxnOptions {
                max_attempts: 3,
                ..Default::default()
            },
            |tx| {
                tx.update_one("acct", doc! {"_id": 0}, doc! {"$inc": {"balance": 1}})?;
                c.update_one(doc! {"_id": 0}, doc! {"$inc": {"balance": 1}})
                    .unwrap();
                Ok(())
            },
        )
        .unwrap_err();
    assert!(matches!(e, Error::WriteConflict(_)));
}

#[test]
fn planted_bug_loses_updates() {
    let db = accounts(1, 0);
    let bug = TxnOptions {
        planted_bug: PlantedBug::SkipValidation,
        ..Default::default()
    };
    let mut t1 = db.begin(bug);
    let mut t2 = db.begin(bug);
    for t in [&mut t1, &mut t2] {
        t.update_one("acct", doc! {"_id": 0}, doc! {"$inc": {"balance": 1}})
            .unwrap();
    }
    t1.commit().unwrap();
    t2.commit().unwrap();
    let b = db.collection("acct").find_one(doc! {}).unwrap().unwrap();
    assert_eq!(
        b.get_i32("balance").ok(),
        Some(1),
        "the switch really skips validation"
    );
}

#[derive(Debug, Clone)]
enum Op {
    Insert(i32, i32),
    Set(i32, i32),
    Delete(i32),
    Read(i32),
    Count(i32),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        (0..8i32, 0..5i32).prop_map(|(k, v)| Op::Insert(k, v)),
        (0..8i32, 0..5i32).prop_map(|(k, v)| Op::Set(k, v)),
        (0..8i32).prop_map(Op::Delete),
        (0..8i32).prop_map(Op::Read),
        (0..5i32).prop_map(Op::Count),
    ]
}

type Model = std::collections::BTreeMap<i32, i32>;

fn model_of(db: &Database) -> Model {
    db.collection("m")
        .find(doc! {})
        .run()
        .unwrap()
        .iter()
        .map(|d| (d.get_i32("_id").unwrap(), d.get_i32("v").unwrap()))
        .collect()
}

/// Run `ops` in `tx`, checking every read against `model` (the transaction's
/// expected view), which it updates as the writes go.
fn run_ops(tx: &mut duetdb::Transaction, ops: &[Op], model: &mut Model) {
    for o in ops {
        match *o {
            Op::Insert(k, v) => {
                let r = tx.insert_one("m", doc! {"_id": k, "v": v});
                if let std::collections::btree_map::Entry::Vacant(e) = model.entry(k) {
                    r.unwrap();
                    e.insert(v);
                } else {
                    assert_eq!(r.unwrap_err().code(), 11000);
                }
            }
            Op::Set(k, v) => {
                let r = tx
                    .update_one("m", doc! {"_id": k}, doc! {"$set": {"v": v}})
                    .unwrap();
                assert_eq!(r.matched, u64::from(model.contains_key(&k)));
                if let Some(x) = model.get_mut(&k) {
                    *x = v;
                }
            }
            Op::Delete(k) => {
                let n = tx.delete_one("m", doc! {"_id": k}).unwrap();
                assert_eq!(n, u64::from(model.remove(&k).is_some()));
            }
            Op::Read(k) => {
                let got = tx.get("m", &Bson::Int32(k)).unwrap();
                assert_eq!(got.map(|d| d.get_i32("v").unwrap()), model.get(&k).copied());
            }
            Op::Count(v) => {
                let n = tx.count("m", doc! {"v": {"$gte": v}}).unwrap();
                assert_eq!(n, model.values().filter(|x| **x >= v).count() as u64);
            }
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// Read-your-writes against a model; abort changes nothing; commit
    /// installs exactly the model.
    #[test]
    fn prop_read_your_writes_abort_commit(
        init in proptest::collection::btree_map(0..8i32, 0..5i32, 0..6),
        ops in proptest::collection::vec(op(), 0..25),
        serializable in any::<bool>(),
        commit in any::<bool>(),
    ) {
        let db = Database::in_memory();
        for (k, v) in &init {
            db.collection("m").insert_one(doc! {"_id": *k, "v": *v}).unwrap();
        }
        let iso = if serializable { Isolation::Serializable } else { Isolation::Snapshot };
        let mut tx = db.begin(opts(iso));
        let mut model = init.clone();
        run_ops(&mut tx, &ops, &mut model);
        if commit {
            tx.commit().unwrap();
            prop_assert_eq!(model_of(&db), model);
        } else {
            tx.abort();
            prop_assert_eq!(model_of(&db), init);
        }
        db.collection("m").check_invariants().unwrap();
    }

    /// Two transactions from one snapshot: the second commit conflicts
    /// exactly when it wrote a key the first one wrote (snapshot isolation),
    /// and a conflicting commit changes nothing.
    #[test]
    fn prop_conflicts_are_exactly_write_overlaps(
        init in proptest::collection::btree_map(0..8i32, 0..5i32, 0..6),
        a in proptest::collection::vec(op(), 0..10),
        b in proptest::collection::vec(op(), 0..10),
    ) {
        let db = Database::in_memory();
        for (k, v) in &init {
            db.collection("m").insert_one(doc! {"_id": *k, "v": *v}).unwrap();
        }
        let mut ta = db.begin(TxnOptions::default());
        let mut tb = db.begin(TxnOptions::default());
        let (mut ma, mut mb) = (init.clone(), init.clone());
        run_ops(&mut ta, &a, &mut ma);
        run_ops(&mut tb, &b, &mut mb);
        let written = |ops: &[Op]| -> std::collections::BTreeSet<i32> {
            (0..8).filter(|k| touched(ops, *k, &init)).collect()
        };
        let wa = written(&a);
        let wb = written(&b);
        ta.commit().unwrap();
        let after_a = model_of(&db);
        let r = tb.commit();
        if wa.is_disjoint(&wb) {
            r.unwrap();
            let mut expect = after_a.clone();
            for k in &wb { match mb.get(k) { Some(v) => { expect.insert(*k, *v); } None => { expect.remove(k); } } }
            prop_assert_eq!(model_of(&db), expect);
        } else {
            prop_assert_eq!(r.unwrap_err().code(), 112);
            prop_assert_eq!(model_of(&db), after_a);
        }
        db.collection("m").check_invariants().unwrap();
    }
}

/// Whether `ops` buffer a write of `k` even though its final value equals the
/// snapshot's: any effective insert/delete, or a set that changed the value at
/// the time (the buffer keeps the final version, a new allocation).
fn touched(ops: &[Op], k: i32, init: &Model) -> bool {
    let mut cur = init.get(&k).copied();
    let mut wrote = false;
    for o in ops {
        match *o {
            Op::Insert(x, v) if x == k && cur.is_none() => {
                cur = Some(v);
                wrote = true;
            }
            Op::Set(x, v) if x == k => {
                if let Some(c) = cur {
                    if c != v {
                        wrote = true;
                    }
                    cur = Some(v);
                }
            }
            Op::Delete(x) if x == k && cur.is_some() => {
                cur = None;
                wrote = true;
            }
            _ => {}
        }
    }
    // Inserted then deleted again: nothing is written at commit.
    wrote && !(init.get(&k).is_none() && cur.is_none())
}

#[test]
fn handles_can_move_between_threads() {
    // The server keeps a session's transaction across requests on any thread.
    fn send<T: Send + 'static>() {}
    send::<duetdb::Transaction>();
}
