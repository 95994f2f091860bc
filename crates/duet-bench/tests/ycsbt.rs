//! `duet bench ycsb-t` runs tiny with every strategy and both isolation
//! levels (the run itself fails on a lost update), consistent strategies never
//! see part of a transaction, `report` renders the section, and the lost-update
//! check does catch lost updates (a commit that skips validation).

mod common;
use common::{report, result, temp_dir};

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use duet_bench::workload::ycsbt::{self, TxnStats};
use duetdb::Strategy;
use duetdb::{Database, TxnOptions};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

#[test]
fn ycsb_t_runs_tiny_and_report_renders() {
    let dir = temp_dir("ycsbt");
    let out = dir.to_str().expect("utf-8 temp dir");
    let r = result(&[
        "ycsb-t",
        "--records",
        "400",
        "--seconds",
        "0.15",
        "--threads",
        "2",
        "--analytics",
        "0,1",
        "--strategy",
        "none,vls,olcp,cow",
        "--isolation",
        "si,serializable",
        "--repeat",
        "1",
        "--out",
        out,
        "--quiet",
    ]);
    assert_eq!(r.workload, "ycsb-t");
    let t = "duetdb-embedded";
    for iso in ["si", "serializable"] {
        let base = r
            .find(
                t,
                &[("isolation", iso), ("analytics", "0")],
                "commits_per_s",
            )
            .expect("K=0 cell");
        assert!(base.median > 0.0, "{iso}");
        for s in ["none", "vls", "olcp", "cow"] {
            let c = [("isolation", iso), ("strategy", s), ("analytics", "1")];
            assert!(r.find(t, &c, "commits_per_s").expect("cell").median > 0.0);
            assert!(r.find(t, &c, "scans_completed").expect("scans").median >= 1.0);
            assert!(r.find(t, &c, "commit_latency_us_p99").expect("p99").median > 0.0);
            if s != "none" {
                let torn = r.find(t, &c, "torn_scans").expect("torn").median;
                assert_eq!(
                    torn, 0.0,
                    "{iso} {s}: a consistent scan saw part of a transaction"
                );
            }
        }
    }
    let text = report(&dir);
    assert!(text.contains("<!-- BEGIN bench:ycsb-t -->"), "{text}");
    assert!(text.contains("commits_per_s") && text.contains("ycsbt-commits.png"));
    assert!(dir.join("charts/ycsb-t/ycsbt-commits.png").exists());
    let _ = std::fs::remove_dir_all(&dir);
}

/// Runs YCSB-T transactions on `records` records from 2 threads for about
/// `rounds` transactions each; returns (Σ n, commits).
fn hammer(db: &Database, options: TxnOptions, records: u64, rounds: u64) -> (i64, u64) {
    ycsbt::load(db, records, 1).expect("load");
    let commits = AtomicU64::new(0);
    let failed = AtomicBool::new(false);
    std::thread::scope(|s| {
        for t in 0..2u64 {
            let (commits, failed) = (&commits, &failed);
            s.spawn(move || {
                let mut rng = StdRng::seed_from_u64(t);
                let mut st = TxnStats::default();
                for _ in 0..rounds {
                    let keys: Vec<u64> = (0..16).map(|_| rng.gen_range(0..records)).collect();
                    let fields: Vec<(usize, String)> = (0..16).map(|_| (0, "x".into())).collect();
                    let t0 = std::time::Instant::now();
                    let mut lat = duet_bench::stats::Latencies::new();
                    match ycsbt::attempt_loop(db, options, 1000, &mut rng, &mut lat, |tx| {
                        ycsbt::read_modify_write(tx, &keys, &fields)
                    }) {
                        Ok(a) => st.record(a, t0),
                        Err(_) => failed.store(true, Ordering::Relaxed),
                    }
                }
                commits.fetch_add(st.commits, Ordering::Relaxed);
            });
        }
    });
    assert!(!failed.load(Ordering::Relaxed));
    let sum = ycsbt::sum_n(db, Strategy::Cow).expect("sum");
    (sum, commits.load(Ordering::Relaxed))
}

#[test]
fn the_lost_update_check_catches_lost_updates() {
    // The real engine: Σ n is exactly 16 per commit.
    let db = Database::in_memory();
    let (sum, commits) = hammer(&db, TxnOptions::default(), 20, 60);
    assert_eq!(sum, 16 * commits as i64);
    // A commit that validates nothing loses updates under this contention
    // (2 threads × 16 of 20 keys); the same check sees it.
    let broken = TxnOptions {
        planted_bug: duetdb::testing::PlantedBug::SkipValidation,
        ..TxnOptions::default()
    };
    let mut caught = false;
    for _ in 0..20 {
        let db = Database::in_memory();
        let (sum, commits) = hammer(&db, broken, 20, 60);
        assert!(sum <= 16 * commits as i64);
        if sum < 16 * commits as i64 {
            caught = true;
            break;
        }
    }
    assert!(
        caught,
        "no lost update observed with validation switched off"
    );
}
