//! A tiny YCSB and HTAP run with the LMDB peer beside the embedded engine
//! (built only with `--features lmdb`): the peer must produce every figure the
//! workloads report, exact counts from its read-transaction snapshots, and its
//! space figures. Nothing here asserts performance.
#![cfg(feature = "lmdb")]

use clap::Parser;
use duet_bench::result::BenchResult;
use duet_bench::BenchCommand;

#[derive(Parser)]
struct Cli {
    #[command(subcommand)]
    command: BenchCommand,
}

fn run(args: &[&str]) -> BenchResult {
    let cli = Cli::try_parse_from(std::iter::once("bench").chain(args.iter().copied()))
        .expect("arguments parse");
    duet_bench::run(cli.command)
        .expect("benchmark runs")
        .expect("a result")
}

fn metric(r: &BenchResult, target: &str, case: &[(&str, &str)], metric: &str) -> f64 {
    r.find(target, case, metric)
        .unwrap_or_else(|| panic!("missing {metric} of {target} for {case:?}"))
        .median
}

#[test]
fn lmdb_runs_ycsb_and_htap_beside_duet() {
    let dir = std::env::temp_dir().join(format!("duet-bench-lmdb-tiny-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("temp dir");
    let out = dir.to_str().expect("utf-8 temp dir");

    let y = run(&[
        "ycsb",
        "--targets",
        "duet,lmdb",
        "--records",
        "300",
        "--operations",
        "200",
        "--threads",
        "2",
        "--repeat",
        "1",
        "--field-length",
        "10",
        "--out",
        out,
        "--quiet",
    ]);
    for w in ["A", "B", "C", "D", "E", "F"] {
        for t in ["duetdb-embedded", "lmdb"] {
            assert!(
                metric(&y, t, &[("workload", w)], "ops_per_s") > 0.0,
                "{t} {w}"
            );
        }
    }
    assert!(metric(&y, "lmdb", &[("workload", "E")], "scan_latency_us_p99") > 0.0);
    assert!(
        y.notes.iter().any(|n| n.starts_with("lmdb:")),
        "{:?}",
        y.notes
    );

    let h = run(&[
        "htap",
        "--targets",
        "duet,lmdb",
        "--records",
        "2000",
        "--seconds",
        "0.2",
        "--repeat",
        "1",
        "--analytics",
        "0,2",
        "--scans",
        "full,idx5",
        "--strategy",
        "cow",
        "--out",
        out,
        "--quiet",
    ]);
    for scan in ["full", "idx5"] {
        let c = [("strategy", "native"), ("analytics", "2"), ("scan", scan)];
        assert!(metric(&h, "lmdb", &c, "update_ops_per_s") > 0.0, "{scan}");
        assert!(metric(&h, "lmdb", &c, "scans_completed") >= 2.0, "{scan}");
        assert!(metric(&h, "lmdb", &c, "scan_ms_median") > 0.0, "{scan}");
        let file = metric(&h, "lmdb", &c, "file_mb_peak");
        let in_use = metric(&h, "lmdb", &c, "in_use_mb_peak");
        assert!(in_use > 0.0 && file >= in_use, "{file} {in_use}");
    }
    // Every count was exact (consistent snapshots).
    assert!(
        !h.notes.iter().any(|n| n.contains("wrong count")),
        "{:?}",
        h.notes
    );
    assert!(
        h.notes.iter().any(|n| n.contains("lmdb: strategy native")),
        "{:?}",
        h.notes
    );
    let _ = std::fs::remove_dir_all(&dir);
}
