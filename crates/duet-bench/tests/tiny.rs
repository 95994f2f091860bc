//! A tiny run of every workload (and of `report`) so no benchmark rots: the
//! outputs must be produced and sane. Nothing here asserts performance.

mod common;
use common::{metric, report, run, temp_dir};

use duet_bench::result::BenchResult;

#[test]
fn every_workload_runs_tiny_and_report_renders() {
    let dir = temp_dir("tiny");
    let out = dir.to_str().expect("utf-8 temp dir");

    let y = run(&[
        "ycsb",
        "--records",
        "300",
        "--operations",
        "200",
        "--threads",
        "2",
        "--repeat",
        "2",
        "--field-length",
        "10",
        "--out",
        out,
        "--quiet",
    ])
    .expect("ycsb result");
    assert_eq!(y.figures.iter().filter(|f| f.runs.len() != 2).count(), 0);
    for w in ["A", "B", "C", "D", "E", "F"] {
        assert!(
            metric(&y, "duetdb-embedded", &[("workload", w)], "ops_per_s") > 0.0,
            "{w}"
        );
    }
    assert!(
        metric(
            &y,
            "duetdb-embedded",
            &[("workload", "E")],
            "scan_latency_us_p99"
        ) > 0.0
    );
    assert!(
        metric(
            &y,
            "duetdb-embedded",
            &[("workload", "F")],
            "rmw_latency_us_p50"
        ) > 0.0
    );

    let h = run(&[
        "htap",
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
        "none,cow,vls",
        "--out",
        out,
        "--quiet",
    ])
    .expect("htap result");
    for st in ["none", "cow", "vls"] {
        let c = [("strategy", st), ("analytics", "2"), ("scan", "full")];
        assert!(metric(&h, "duetdb-embedded", &c, "update_ops_per_s") > 0.0);
        assert!(metric(&h, "duetdb-embedded", &c, "scans_completed") >= 2.0);
        assert!(metric(&h, "duetdb-embedded", &c, "scan_ms_median") > 0.0);
    }
    // Every count was exact (consistent snapshots).
    assert!(
        !h.notes.iter().any(|n| n.contains("wrong count")),
        "{:?}",
        h.notes
    );

    let s = run(&[
        "snapshot",
        "--sizes-mb",
        "1,2",
        "--rewrite-pct",
        "10",
        "--first-writes",
        "20",
        "--out",
        out,
        "--quiet",
    ])
    .expect("snapshot result");
    let create = [("data_mb", "2"), ("what", "create")];
    assert!(metric(&s, "duetdb-embedded", &create, "fork_ms_median") > 0.0);
    assert!(metric(&s, "duetdb-embedded", &create, "duet_snapshot_us_median") > 0.0);
    assert!(metric(&s, "duetdb-embedded", &create, "deep_copy_ms") > 0.0);
    let loaded = metric(
        &s,
        "duetdb-embedded",
        &[("data_mb", "2"), ("what", "loaded")],
        "data_mb",
    );
    assert!((1.5..2.5).contains(&loaded), "{loaded}");

    for f in [
        "ycsb.json",
        "ycsb.md",
        "htap.json",
        "htap.md",
        "snapshot.json",
        "snapshot.md",
    ] {
        assert!(dir.join(f).exists(), "{f}");
    }
    let back = BenchResult::read(&dir.join("htap.json")).expect("json reads back");
    assert_eq!(back.figures.len(), h.figures.len());
    assert!(back.machine.cores >= 1);

    let text = report(&dir);
    assert!(text.contains("Engine micro-benchmarks (criterion)"));
    for section in ["ycsb", "htap", "snapshot"] {
        assert!(
            text.contains(&format!("<!-- BEGIN bench:{section} -->")),
            "{section}"
        );
    }
    for png in [
        "ycsb/ycsb-throughput.png",
        "htap/htap-update-throughput.png",
        "htap/htap-update-p95.png",
        "htap/htap-scan-kinds.png",
        "snapshot/snapshot-creation.png",
    ] {
        let len = std::fs::metadata(dir.join("charts").join(png)).map_or(0, |m| m.len());
        assert!(len > 1000, "{png}: {len} bytes");
    }
    // Regenerating replaces the sections instead of appending them again.
    let again = report(&dir);
    assert_eq!(again.matches("<!-- BEGIN bench:htap -->").count(), 1);
    let _ = std::fs::remove_dir_all(&dir);
}
