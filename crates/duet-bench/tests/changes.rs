//! `duet bench changes` runs tiny (the writer alone and beside streams), its
//! streams deliver every update, and `report` renders the section.

mod common;
use common::{report, result, temp_dir};

#[test]
fn changes_runs_tiny_and_report_renders() {
    let dir = temp_dir("changes");
    let out = dir.to_str().expect("utf-8 temp dir");
    let r = result(&[
        "changes",
        "--records",
        "200",
        "--seconds",
        "0.2",
        "--streams",
        "0,1,4",
        "--repeat",
        "1",
        "--out",
        out,
        "--quiet",
    ]);
    assert_eq!(r.workload, "changes");
    let t = duet_bench::workload::changes::TARGET;
    for n in ["0", "1", "4"] {
        let rate = r.find(t, &[("streams", n)], "updates_per_s").expect("cell");
        assert!(rate.median > 0.0, "{n}");
    }
    for n in ["1", "4"] {
        let c = [("streams", n)];
        assert!(r.find(t, &c, "events_per_s").expect("events").median > 0.0);
        assert!(r.find(t, &c, "lag_us_p99").expect("p99").median > 0.0);
        assert_eq!(r.find(t, &c, "history_lost").expect("lost").median, 0.0);
    }
    let ratio = r
        .find(t, &[("streams", "4 vs 0")], "writer_ratio")
        .expect("ratio");
    assert!(ratio.median > 0.0);
    let text = report(&dir);
    assert!(text.contains("<!-- BEGIN bench:changes -->"), "{text}");
    assert!(text.contains("events_per_s"), "{text}");
    let _ = std::fs::remove_dir_all(&dir);
}
