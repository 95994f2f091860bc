//! A tiny `duet bench space --targets duet,wire --uri self` run: both targets
//! side by side in one invocation, the same figure and series names under
//! each label, and the chart drawing both. Nothing here asserts performance.

mod common;
use common::{result, temp_dir};

#[test]
fn space_runs_embedded_and_over_the_wire() {
    let dir = temp_dir("wire-space");
    let out = dir.to_str().expect("utf-8 temp dir");
    let args = [
        "space",
        "--targets",
        "duet,wire",
        "--uri",
        "self",
        "--records",
        "3000",
        "--seconds",
        "0.3",
        "--queries",
        "2",
        "--dist",
        "uniform",
        "--work-ns-per-doc",
        "100",
        "--sample-ms",
        "20",
        "--retained-every-ms",
        "40",
        "--out",
        out,
        "--quiet",
    ];
    let r = result(&args);
    for target in ["duetdb-embedded", "duetdb-wire"] {
        for system in ["olcp", "vls", "cow", "steam"] {
            let c = [("system", system), ("dist", "uniform"), ("queries", "2")];
            let f = |m: &str| {
                r.find(target, &c, m)
                    .unwrap_or_else(|| panic!("missing {m} of {target} for {c:?}"))
                    .median
            };
            assert!(f("update_ops_per_s") > 0.0, "{target} {system}");
            assert!(f("queries_done") >= 2.0, "{target} {system}");
            assert!(f("query_docs_per_s") > 0.0, "{target} {system}");
            assert!(f("old_versions_peak") >= 0.0);
            if system == "steam" {
                // Steam's bound: one old version per document per snapshot.
                assert!(f("old_versions_peak") <= 2.0 * 3000.0);
            }
            assert!(
                r.series.iter().any(|s| s.target == target
                    && s.case.get("system").map(String::as_str) == Some(system)),
                "no series of {target} {system}"
            );
        }
        assert!(r
            .find(
                target,
                &[("system", "si-model"), ("queries", "2")],
                "old_versions_peak"
            )
            .is_some());
    }
    // Every update over the wire made a new version too.
    assert!(
        !r.notes.iter().any(|n| n.contains("changed nothing")),
        "{:?}",
        r.notes
    );
    let chart = dir.join("space").join("space-old-versions-uniform-q2.png");
    assert!(std::fs::metadata(&chart).map_or(0, |m| m.len()) > 1000);
    let _ = std::fs::remove_dir_all(&dir);
}
