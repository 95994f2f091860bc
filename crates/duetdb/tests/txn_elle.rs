//! An independent check with an Elle-style checker (the `adya` crate, which
//! reads Elle's history format): concurrent list-append transactions are
//! recorded as a history (invoke / ok / fail per transaction, per process)
//! and checked for the anomalies each level forbids — G0, G1a/b/c, G-single
//! and lost update under `snapshot` (model `snapshot-isolation`), and
//! additionally G2 under `serializable` (model `strict-serializable`).
//!
//! Before trusting it, every run first checks that adya flags planted bugs:
//! validation skipped (lost updates, G-single under snapshot isolation) and
//! read validation skipped (G2 under serializable).

// Tests fail loudly on any unexpected error; unwrap is the point here.
#![allow(clippy::unwrap_used)]

use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use adya::{check, History, Opts, Valid, Workload};
use duetdb::bson::{doc, Bson};
use duetdb::testing::PlantedBug;
use duetdb::{Database, Isolation, TxnOptions};
use rand::{Rng, SeedableRng};

const KEYS: i64 = 5;

/// Run `threads × per_thread` random list-append transactions and return the
/// history as JSON lines.
fn record(
    isolation: Isolation,
    bug: PlantedBug,
    threads: u64,
    per_thread: usize,
    seed: u64,
) -> String {
    let db = Database::in_memory();
    for k in 0..KEYS {
        db.collection("la")
            .insert_one(doc! {"_id": k, "list": []})
            .unwrap();
    }
    let lines = Mutex::new(Vec::<String>::new());
    let next_value = AtomicI64::new(1);
    let opts = TxnOptions {
        isolation,
        planted_bug: bug,
        ..Default::default()
    };
    let push = |process: u64, kind: &str, mops: &serde_json::Value| {
        let mut l = lines.lock().unwrap();
        let index = l.len();
        l.push(
            serde_json::json!({"index": index, "type": kind, "process": process, "value": mops})
                .to_string(),
        );
    };
    std::thread::scope(|s| {
        for p in 0..threads {
            let (db, push, next_value) = (db.clone(), &push, &next_value);
            s.spawn(move || {
                let mut rng = rand::rngs::StdRng::seed_from_u64(seed * 1000 + p);
                for _ in 0..per_thread {
                    // 1-4 micro-ops: reads and appends over few keys.
                    let mut plan = Vec::new();
                    for _ in 0..rng.gen_range(1..=4) {
                        let k = rng.gen_range(0..KEYS);
                        if rng.gen_bool(0.5) {
                            plan.push((k, None));
                        } else {
                            plan.push((k, Some(next_value.fetch_add(1, Ordering::Relaxed))));
                        }
                    }
                    let invoke: Vec<serde_json::Value> = plan
                        .iter()
                        .map(|(k, v)| match v {
                            None => serde_json::json!(["r", k, null]),
                            Some(v) => serde_json::json!(["append", k, v]),
                        })
                        .collect();
                    push(p, "invoke", &serde_json::Value::Array(invoke.clone()));
                    let mut tx = db.begin(opts);
                    let mut done = Vec::new();
                    let mut ok = true;
                    for (i, (k, v)) in plan.iter().enumerate() {
                        match v {
                            None => {
                                let d = tx.get("la", &Bson::Int64(*k)).unwrap();
                                let list: Vec<i64> = d
                                    .and_then(|d| {
                                        d.get_array("list").ok().map(|a| {
                                            a.into_iter().filter_map(|x| x.ok()?.as_i64()).collect()
                                        })
                                    })
                                    .unwrap_or_default();
                                done.push(serde_json::json!(["r", k, list]));
                            }
                            Some(v) => {
                                if tx
                                    .update_one(
                                        "la",
                                        doc! {"_id": *k},
                                        doc! {"$push": {"list": *v}},
                                    )
                                    .is_err()
                                {
                                    ok = false;
                                }
                                done.push(invoke[i].clone());
                            }
                        }
                        if i == 0 {
                            // Widen the window between snapshot and commit.
                            std::thread::sleep(Duration::from_micros(rng.gen_range(0..100)));
                        }
                    }
                    let committed = ok && tx.commit().is_ok();
                    if committed {
                        push(p, "ok", &serde_json::Value::Array(done));
                    } else {
                        push(p, "fail", &serde_json::Value::Array(invoke));
                    }
                }
            });
        }
    });
    lines.into_inner().unwrap().join("\n")
}

fn verdict(history: &str, model: &str) -> (Valid, Vec<String>) {
    let h = History::from_json(history).expect("adya reads the history");
    let opts = Opts {
        models: vec![model.to_string()],
        timeout: Duration::from_secs(10),
        ..Opts::default()
    };
    let r = check(&h, Workload::ListAppend, &opts);
    (r.valid, r.anomaly_types)
}

fn per_thread() -> usize {
    std::env::var("DUET_TXN_SOAK")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(150)
}

#[test]
fn adya_flags_planted_bugs_every_run() {
    for seed in 0..3 {
        let h = record(
            Isolation::Snapshot,
            PlantedBug::SkipValidation,
            4,
            150,
            seed,
        );
        let (valid, anomalies) = verdict(&h, "snapshot-isolation");
        assert_eq!(
            valid,
            Valid::False,
            "seed {seed}: validation skipped but adya saw nothing"
        );
        eprintln!("planted skip-validation, seed {seed}: {anomalies:?}");
        let h = record(
            Isolation::Serializable,
            PlantedBug::SkipReadValidation,
            4,
            150,
            seed,
        );
        let (valid, anomalies) = verdict(&h, "serializable");
        assert_eq!(
            valid,
            Valid::False,
            "seed {seed}: read validation skipped but adya saw nothing"
        );
        assert!(
            anomalies.iter().any(|a| a.starts_with("G2")),
            "{anomalies:?}"
        );
        // ... while that history is still valid snapshot isolation.
        assert_eq!(verdict(&h, "snapshot-isolation").0, Valid::True);
        eprintln!("planted skip-read-validation, seed {seed}: {anomalies:?}");
    }
}

#[test]
fn adya_snapshot_histories_are_snapshot_isolation() {
    for seed in 10..12 {
        let h = record(Isolation::Snapshot, PlantedBug::None, 4, per_thread(), seed);
        let (valid, anomalies) = verdict(&h, "snapshot-isolation");
        assert_eq!(valid, Valid::True, "seed {seed}: {anomalies:?}");
        // Snapshot isolation admits write skew, so G2 may show; nothing worse.
        let (_, serial) = verdict(&h, "serializable");
        assert!(serial.iter().all(|a| a.starts_with("G2")), "{serial:?}");
    }
}

#[test]
fn adya_serializable_histories_are_strict_serializable() {
    for seed in 20..22 {
        let h = record(
            Isolation::Serializable,
            PlantedBug::None,
            4,
            per_thread(),
            seed,
        );
        let (valid, anomalies) = verdict(&h, "strict-serializable");
        assert_eq!(valid, Valid::True, "seed {seed}: {anomalies:?}");
    }
}
