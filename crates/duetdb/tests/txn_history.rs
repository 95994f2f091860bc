//! A transaction history checker: concurrent random transactions (transfers,
//! read-modify-write increments, audits, predicate reads) at both isolation
//! levels, then checks over the recorded history:
//! - no fractured reads: every audit inside a transaction sees the constant
//!   total, and reading everything twice gives the same versions;
//! - no dirty reads: every version a transaction saw was written by a
//!   committed transaction (each write carries its transaction's tag);
//! - no lost updates: each account's final counter equals the committed
//!   increments of it, and its final balance the committed transfer deltas;
//! - serializable keeps an invariant that write skew breaks (at least one
//!   doctor on call) under concurrency.
//!
//! The same checker run against a planted bug (validation skipped) must fail,
//! which shows that it can see the anomalies it claims to rule out.

// Tests fail loudly on any unexpected error; unwrap is the point here.
#![allow(clippy::unwrap_used)]

use std::collections::{BTreeMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use duetdb::bson::{doc, Bson, Document};
use duetdb::testing::PlantedBug;
use duetdb::{Database, Isolation, TxnOptions};
use rand::{Rng, SeedableRng};

const ACCOUNTS: i32 = 8;
const INITIAL: i64 = 100;

#[derive(Default)]
struct Log {
    committed: HashSet<u64>,
    /// Tags seen by committed transactions.
    seen: Vec<(u64, u64)>,
    /// Per account: committed increments and committed balance deltas.
    increments: BTreeMap<i32, i64>,
    deltas: BTreeMap<i32, i64>,
    violations: Vec<String>,
    aborted: u64,
}

fn acct(d: &Document) -> (i64, i64, u64) {
    (
        d.get_i64("balance").unwrap_or(i64::MIN),
        d.get_i64("n").unwrap_or(i64::MIN),
        d.get_i64("tag").unwrap_or(-1) as u64,
    )
}

fn run_bank(
    isolation: Isolation,
    bug: PlantedBug,
    threads: usize,
    per_thread: usize,
    seed: u64,
) -> Log {
    let db = Database::in_memory();
    let c = db.collection("acct");
    for i in 0..ACCOUNTS {
        c.insert_one(doc! {"_id": i, "balance": INITIAL, "n": 0i64, "tag": 0i64})
            .unwrap();
    }
    let next_tag = Arc::new(AtomicU64::new(1));
    let log = Arc::new(Mutex::new(Log::default()));
    let opts = TxnOptions {
        isolation,
        planted_bug: bug,
        ..Default::default()
    };
    std::thread::scope(|s| {
        for t in 0..threads {
            let (db, next_tag, log) = (db.clone(), next_tag.clone(), log.clone());
            s.spawn(move || {
                let mut rng = rand::rngs::StdRng::seed_from_u64(seed * 1000 + t as u64);
                for _ in 0..per_thread {
                    let tag = next_tag.fetch_add(1, Ordering::Relaxed);
                    let mut tx = db.begin(opts);
                    let mut seen = Vec::new();
                    let mut violations = Vec::new();
                    let mut incs = Vec::new();
                    let mut deltas = Vec::new();
                    let pause = Duration::from_micros(rng.gen_range(0..150));
                    let kind = rng.gen_range(0..4);
                    let result: duetdb::Result<()> = (|| {
                        match kind {
                            0 => {
                                // Transfer.
                                let a = rng.gen_range(0..ACCOUNTS);
                                let b = (a + rng.gen_range(1..ACCOUNTS)) % ACCOUNTS;
                                let amt = rng.gen_range(1..20i64);
                                let da = tx.find_one("acct", doc! {"_id": a})?.unwrap_or_default();
                                let db_ = tx.find_one("acct", doc! {"_id": b})?.unwrap_or_default();
                                seen.push(acct(&da).2);
                                seen.push(acct(&db_).2);
                                std::thread::sleep(pause);
                                let tag = tag as i64;
                                tx.update_one(
                                    "acct",
                                    doc! {"_id": a},
                                    doc! {"$set": {"balance": acct(&da).0 - amt, "tag": tag}},
                                )?;
                                tx.update_one(
                                    "acct",
                                    doc! {"_id": b},
                                    doc! {"$set": {"balance": acct(&db_).0 + amt, "tag": tag}},
                                )?;
                                deltas.push((a, -amt));
                                deltas.push((b, amt));
                            }
                            1 => {
                                // Read-modify-write increment.
                                let a = rng.gen_range(0..ACCOUNTS);
                                let d = tx
                                    .get("acct", &Bson::Int32(a))?
                                    .map(|d| duetdb::raw::to_document(&d).unwrap_or_default())
                                    .unwrap_or_default();
                                seen.push(acct(&d).2);
                                std::thread::sleep(pause);
                                tx.update_one(
                                    "acct",
                                    doc! {"_id": a},
                                    doc! {"$set": {"n": acct(&d).1 + 1, "tag": tag as i64}},
                                )?;
                                incs.push(a);
                            }
                            2 => {
                                // Audit: the total is constant; reading twice is repeatable.
                                let all = tx.find("acct", doc! {})?;
                                std::thread::sleep(pause);
                                let again = tx.find("acct", doc! {})?;
                                let total: i64 = all.iter().map(|d| acct(d).0).sum();
                                if total != INITIAL * ACCOUNTS as i64 {
                                    violations.push(format!("fractured read: total {total}"));
                                }
                                if all != again {
                                    violations.push("non-repeatable read".into());
                                }
                                seen.extend(all.iter().map(|d| acct(d).2));
                            }
                            _ => {
                                // Predicate reads agree with each other.
                                let lo = rng.gen_range(80..120i64);
                                let n = tx.count("acct", doc! {"balance": {"$gte": lo}})?;
                                let rich = tx.find("acct", doc! {"balance": {"$gte": lo}})?;
                                let poor = tx.find("acct", doc! {"balance": {"$lt": lo}})?;
                                if n != rich.len() as u64
                                    || rich.len() + poor.len() != ACCOUNTS as usize
                                {
                                    violations.push(format!(
                                        "predicate reads disagree: {n} {} {}",
                                        rich.len(),
                                        poor.len()
                                    ));
                                }
                                seen.extend(rich.iter().chain(&poor).map(|d| acct(d).2));
                            }
                        }
                        Ok(())
                    })();
                    let committed = result.and_then(|()| tx.commit().map(|_| ()));
                    let mut l = log.lock().unwrap();
                    match committed {
                        Ok(()) => {
                            l.committed.insert(tag);
                            l.seen.extend(seen.into_iter().map(|s| (tag, s)));
                            l.violations.extend(violations);
                            for a in incs {
                                *l.increments.entry(a).or_default() += 1;
                            }
                            for (a, d) in deltas {
                                *l.deltas.entry(a).or_default() += d;
                            }
                        }
                        Err(e) => {
                            assert_eq!(e.code(), 112, "only conflicts may fail: {e}");
                            l.aborted += 1;
                        }
                    }
                }
            });
        }
    });
    let mut log = Arc::try_unwrap(log).ok().unwrap().into_inner().unwrap();
    // Dirty reads: every tag seen was written by a committed transaction.
    let dirty: Vec<_> = log
        .seen
        .iter()
        .filter(|(_, s)| *s != 0 && !log.committed.contains(s))
        .collect();
    if !dirty.is_empty() {
        log.violations
            .push(format!("{} dirty reads, e.g. {:?}", dirty.len(), dirty[0]));
    }
    // Lost updates.
    for d in c.find(doc! {}).run().unwrap() {
        let id = d.get_i32("_id").unwrap();
        let (balance, n, _) = acct(&d);
        let want_n = log.increments.get(&id).copied().unwrap_or(0);
        let want_b = INITIAL + log.deltas.get(&id).copied().unwrap_or(0);
        if n != want_n {
            log.violations.push(format!(
                "lost update: account {id} n={n}, {want_n} committed increments"
            ));
        }
        if balance != want_b {
            log.violations.push(format!(
                "lost update: account {id} balance={balance}, committed deltas give {want_b}"
            ));
        }
    }
    c.check_invariants().unwrap();
    log
}

fn txns() -> usize {
    std::env::var("DUET_TXN_SOAK")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(200)
}

#[test]
fn snapshot_histories_are_clean() {
    for seed in 0..2 {
        let log = run_bank(Isolation::Snapshot, PlantedBug::None, 4, txns(), seed);
        assert!(log.violations.is_empty(), "{:?}", log.violations);
        assert!(log.aborted > 0, "the workload must contend");
        eprintln!(
            "snapshot seed {seed}: {} committed, {} aborted",
            log.committed.len(),
            log.aborted
        );
    }
}

#[test]
fn serializable_histories_are_clean() {
    for seed in 0..2 {
        let log = run_bank(Isolation::Serializable, PlantedBug::None, 4, txns(), seed);
        assert!(log.violations.is_empty(), "{:?}", log.violations);
        eprintln!(
            "serializable seed {seed}: {} committed, {} aborted",
            log.committed.len(),
            log.aborted
        );
    }
}

#[test]
fn checker_catches_the_planted_bug_every_run() {
    for seed in 0..3 {
        let log = run_bank(
            Isolation::Snapshot,
            PlantedBug::SkipValidation,
            4,
            100,
            seed,
        );
        assert!(
            log.violations.iter().any(|v| v.starts_with("lost update")),
            "seed {seed}: the checker missed lost updates: {:?}",
            log.violations
        );
        assert_eq!(log.aborted, 0);
    }
}

/// Doctors on call, concurrently: each transaction goes off call only if at
/// least two are on call; others put a random doctor back on call. Under
/// serializable at least one doctor is on call in every state a transaction
/// sees; snapshot isolation is allowed to (and usually does) break it.
fn doctors(isolation: Isolation, bug: PlantedBug, seed: u64) -> (u64, u64) {
    let db = Database::in_memory();
    for i in 0..3 {
        db.collection("doc")
            .insert_one(doc! {"_id": i, "on": true})
            .unwrap();
    }
    let broken = AtomicU64::new(0);
    let aborted = AtomicU64::new(0);
    let opts = TxnOptions {
        isolation,
        planted_bug: bug,
        ..Default::default()
    };
    std::thread::scope(|s| {
        for t in 0..4u64 {
            let (db, broken, aborted) = (db.clone(), &broken, &aborted);
            s.spawn(move || {
                let mut rng = rand::rngs::StdRng::seed_from_u64(seed * 100 + t);
                for _ in 0..150 {
                    let me = rng.gen_range(0..3);
                    let mut tx = db.begin(opts);
                    let on = tx.count("doc", doc! {"on": true}).unwrap();
                    if on == 0 {
                        broken.fetch_add(1, Ordering::Relaxed);
                    }
                    if on >= 2 {
                        tx.update_one("doc", doc! {"_id": me}, doc! {"$set": {"on": false}})
                            .unwrap();
                    } else {
                        tx.update_one("doc", doc! {"_id": me}, doc! {"$set": {"on": true}})
                            .unwrap();
                    }
                    std::thread::sleep(Duration::from_micros(rng.gen_range(0..100)));
                    if tx.commit().is_err() {
                        aborted.fetch_add(1, Ordering::Relaxed);
                    }
                }
            });
        }
    });
    let on = db.collection("doc").count(doc! {"on": true}).unwrap();
    (
        broken.into_inner() + u64::from(on == 0),
        aborted.into_inner(),
    )
}

#[test]
fn serializable_prevents_write_skew_under_concurrency() {
    for seed in 0..2 {
        let (broken, aborted) = doctors(Isolation::Serializable, PlantedBug::None, seed);
        assert_eq!(broken, 0, "seed {seed}: nobody on call under serializable");
        eprintln!("doctors serializable: {aborted} aborted");
    }
    // The same workload without read validation breaks the invariant.
    let mut seen = 0;
    for seed in 0..3 {
        seen += doctors(
            Isolation::Serializable,
            PlantedBug::SkipReadValidation,
            seed,
        )
        .0;
    }
    assert!(seen > 0, "write skew never showed without read validation");
}
