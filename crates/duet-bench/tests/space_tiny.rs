//! A tiny `duet bench space` run (so the workload does not rot) and its chart
//! through `report`. Nothing here asserts performance.

mod common;
use common::{report, result, temp_dir};

use duet_bench::result::BenchResult;

#[test]
fn space_runs_tiny_and_charts() {
    let dir = temp_dir("space");
    let out = dir.to_str().expect("utf-8 temp dir");
    let r = result(&[
        "space",
        "--records",
        "3000",
        "--seconds",
        "0.3",
        "--queries",
        "1,2",
        "--dist",
        "uniform,zipfian",
        "--work-ns-per-doc",
        "50",
        "--sample-ms",
        "20",
        "--retained-every-ms",
        "40",
        "--out",
        out,
        "--quiet",
    ]);
    for system in ["olcp", "vls", "cow", "steam"] {
        for dist in ["uniform", "zipfian"] {
            let c = [("system", system), ("dist", dist), ("queries", "2")];
            let f = |m: &str| {
                r.find("duetdb-embedded", &c, m)
                    .unwrap_or_else(|| panic!("missing {m} for {c:?}"))
                    .median
            };
            assert!(f("update_ops_per_s") > 0.0);
            assert!(f("queries_done") >= 2.0);
            assert!(f("query_docs_per_s") > 0.0);
            assert!(f("update_latency_us_max") >= f("update_latency_us_p99"));
            if system == "steam" {
                // Steam's bound: one old version per document per snapshot.
                assert!(f("old_versions_peak") <= 2.0 * 3000.0);
                assert!(f("steam_sweep_ms_max") > 0.0);
            }
        }
    }
    assert!(r
        .find(
            "duetdb-embedded",
            &[("system", "si-model"), ("queries", "1")],
            "old_versions_peak"
        )
        .is_some());
    assert!(r.series.iter().any(|s| !s.points.is_empty()));
    // Every update made a new version (cells never replay an earlier payload).
    assert!(
        !r.notes.iter().any(|n| n.contains("changed nothing")),
        "{:?}",
        r.notes
    );
    let back = BenchResult::read(&dir.join("space.json")).expect("json reads back");
    assert_eq!(back.series.len(), r.series.len());
    let chart = dir.join("space").join("space-old-versions-uniform-q2.png");
    assert!(std::fs::metadata(&chart).map_or(0, |m| m.len()) > 1000);
    let text = report(&dir);
    assert!(text.contains("<!-- BEGIN bench:space -->"));
    assert!(text.contains("space-old-versions-zipfian-q1.png"));
    let _ = std::fs::remove_dir_all(&dir);
}
