//! A tiny YCSB and HTAP run with the LMDB peer beside the embedded engine
//! (built only with `--features lmdb`): the peer must produce every figure the
//! workloads report, exact counts from its read-transaction snapshots, and its
//! space figures. Nothing here asserts performance.
#![cfg(feature = "lmdb")]

mod common;
use common::{metric, result, temp_dir};

#[test]
fn lmdb_runs_ycsb_and_htap_beside_duet() {
    let dir = temp_dir("lmdb-tiny");
    let out = dir.to_str().expect("utf-8 temp dir");

    let y = result(&[
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

    let h = result(&[
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
