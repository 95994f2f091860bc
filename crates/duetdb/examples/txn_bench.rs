//! Transaction benchmark: YCSB-T (KVell+: 16 updates on uniform keys per
//! transaction) and a transfer workload (read two accounts, move an amount),
//! under `snapshot` and `serializable`, alone and beside a concurrent analytic
//! scan loop (`count_with` over the whole collection) under `vls`, `olcp`,
//! `cow`. Reports commits/s, abort rate (failed commits / attempts) and p50 /
//! p99 latency of the commit call and of the whole transaction.
//!
//! `cargo run --release -p duetdb --example txn_bench -- [seconds] [clients] [records]`

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use duetdb::bson::doc;
use duetdb::{Database, Isolation, Strategy, TxnOptions};
use rand::{Rng, SeedableRng};

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[derive(Clone, Copy, PartialEq)]
enum Workload {
    YcsbT,
    Transfer,
}

fn pct(v: &mut [u64], p: f64) -> u64 {
    if v.is_empty() {
        return 0;
    }
    v.sort_unstable();
    v[((v.len() as f64 * p) as usize).min(v.len() - 1)]
}

fn run(
    db: &Database,
    workload: Workload,
    isolation: Isolation,
    scan: Option<Strategy>,
    secs: u64,
    clients: u64,
    records: i64,
) {
    let stop = AtomicBool::new(false);
    let scans = AtomicU64::new(0);
    let commits = AtomicU64::new(0);
    let aborts = AtomicU64::new(0);
    let mut commit_lat = Vec::new();
    let mut txn_lat = Vec::new();
    let coll = if workload == Workload::YcsbT {
        "ycsb"
    } else {
        "bank"
    };
    std::thread::scope(|s| {
        if let Some(strategy) = scan {
            let (db, stop, scans) = (db.clone(), &stop, &scans);
            s.spawn(move || {
                let c = db.collection(coll);
                while !stop.load(Ordering::Relaxed) {
                    c.count_with(doc! {"f": {"$gte": 0}}, strategy)
                        .expect("scan");
                    scans.fetch_add(1, Ordering::Relaxed);
                }
            });
        }
        let handles: Vec<_> = (0..clients)
            .map(|t| {
                let (db, stop, commits, aborts) = (db.clone(), &stop, &commits, &aborts);
                s.spawn(move || {
                    let mut rng = rand::rngs::StdRng::seed_from_u64(t);
                    let opts = TxnOptions {
                        isolation,
                        ..Default::default()
                    };
                    let (mut cl, mut tl) = (Vec::new(), Vec::new());
                    while !stop.load(Ordering::Relaxed) {
                        let keys: Vec<i64> = match workload {
                            Workload::YcsbT => (0..16).map(|_| rng.gen_range(0..records)).collect(),
                            Workload::Transfer => {
                                let a = rng.gen_range(0..records);
                                vec![a, (a + rng.gen_range(1..records)) % records]
                            }
                        };
                        let v: i64 = rng.gen_range(0..1000);
                        let started = Instant::now();
                        loop {
                            let mut tx = db.begin(opts);
                            match workload {
                                Workload::YcsbT => {
                                    for k in &keys {
                                        tx.update_one(
                                            coll,
                                            doc! {"_id": *k},
                                            doc! {"$set": {"f": v}},
                                        )
                                        .expect("update");
                                    }
                                }
                                Workload::Transfer => {
                                    let a = tx.find_one(coll, doc! {"_id": keys[0]}).expect("read");
                                    let b = tx.find_one(coll, doc! {"_id": keys[1]}).expect("read");
                                    let ba = a.and_then(|d| d.get_i64("f").ok()).unwrap_or(0);
                                    let bb = b.and_then(|d| d.get_i64("f").ok()).unwrap_or(0);
                                    tx.update_one(
                                        coll,
                                        doc! {"_id": keys[0]},
                                        doc! {"$set": {"f": ba - 1}},
                                    )
                                    .expect("update");
                                    tx.update_one(
                                        coll,
                                        doc! {"_id": keys[1]},
                                        doc! {"$set": {"f": bb + 1}},
                                    )
                                    .expect("update");
                                }
                            }
                            let c0 = Instant::now();
                            let r = tx.commit();
                            cl.push(c0.elapsed().as_nanos() as u64);
                            match r {
                                Ok(_) => {
                                    commits.fetch_add(1, Ordering::Relaxed);
                                    break;
                                }
                                Err(e) if e.code() == 112 => {
                                    aborts.fetch_add(1, Ordering::Relaxed);
                                }
                                Err(e) => panic!("{e}"),
                            }
                        }
                        tl.push(started.elapsed().as_nanos() as u64);
                    }
                    (cl, tl)
                })
            })
            .collect();
        std::thread::sleep(Duration::from_secs(secs));
        stop.store(true, Ordering::Relaxed);
        for h in handles {
            let (cl, tl) = h.join().expect("client");
            commit_lat.extend(cl);
            txn_lat.extend(tl);
        }
    });
    let c = commits.load(Ordering::Relaxed);
    let a = aborts.load(Ordering::Relaxed);
    println!(
        "| {} | {} | {} | {:.0} | {:.2}% | {:.1} | {:.1} | {:.1} | {:.1} | {:.1} |",
        if workload == Workload::YcsbT {
            "YCSB-T"
        } else {
            "transfer"
        },
        if isolation == Isolation::Snapshot {
            "snapshot"
        } else {
            "serializable"
        },
        scan.map_or("-", |s| s.name()),
        c as f64 / secs as f64,
        100.0 * a as f64 / (a + c).max(1) as f64,
        pct(&mut commit_lat, 0.5) as f64 / 1e3,
        pct(&mut commit_lat, 0.99) as f64 / 1e3,
        pct(&mut txn_lat, 0.5) as f64 / 1e3,
        pct(&mut txn_lat, 0.99) as f64 / 1e3,
        scans.load(Ordering::Relaxed) as f64 / secs as f64,
    );
}

fn main() {
    let args: Vec<u64> = std::env::args()
        .skip(1)
        .filter_map(|a| a.parse().ok())
        .collect();
    let secs = args.first().copied().unwrap_or(3);
    let clients = args.get(1).copied().unwrap_or(2);
    let records = args.get(2).copied().unwrap_or(100_000) as i64;
    let db = Database::in_memory();
    for (coll, n) in [("ycsb", records), ("bank", records)] {
        let c = db.collection(coll);
        c.insert_many(
            (0..n).map(|i| doc! {"_id": i, "f": 500i64, "pad": "x".repeat(100)}),
            true,
        )
        .expect("load");
    }
    println!("{records} records per collection, {clients} clients, {secs} s per cell");
    println!("| workload | isolation | scan | commits/s | abort rate | commit p50 µs | commit p99 µs | txn p50 µs | txn p99 µs | scans/s |");
    println!("|---|---|---|---|---|---|---|---|---|---|");
    for workload in [Workload::YcsbT, Workload::Transfer] {
        for isolation in [Isolation::Snapshot, Isolation::Serializable] {
            for scan in [
                None,
                Some(Strategy::Vls),
                Some(Strategy::Olcp),
                Some(Strategy::Cow),
            ] {
                run(&db, workload, isolation, scan, secs, clients, records);
            }
        }
    }
}
