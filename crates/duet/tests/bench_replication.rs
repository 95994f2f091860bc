//! `duet bench replication` end to end, tiny: three `duet serve` members
//! (this binary), one primary kill, 1000 documents for the new member to
//! catch up. Checks that the report holds every figure (finite, positive
//! where a rate or a time) and that the new member ended with the primary's
//! documents. Nothing here asserts performance.

use std::process::Command;

#[test]
fn replication_bench_reports_every_figure() {
    let out = std::env::temp_dir().join(format!("duet-bench-repl-test-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&out);
    let run = Command::new(env!("CARGO_BIN_EXE_duet"))
        .args([
            "bench",
            "replication",
            "--seconds",
            "1",
            "--threads",
            "2",
            "--readers",
            "3",
            "--failovers",
            "1",
            "--catchup-docs",
            "1000",
            "--catchup-rate",
            "100",
            "--snapshot-entries",
            "50",
            "--out",
        ])
        .arg(&out)
        .output()
        .expect("run duet bench replication");
    let stdout = String::from_utf8_lossy(&run.stdout);
    let stderr = String::from_utf8_lossy(&run.stderr);
    assert!(run.status.success(), "{stdout}\n{stderr}");
    let text = std::fs::read_to_string(out.join("replication.json")).expect("replication.json");
    let r: serde_json::Value = serde_json::from_str(&text).expect("json");
    let num = |v: &serde_json::Value, k: &str| -> f64 {
        v[k].as_f64()
            .unwrap_or_else(|| panic!("{k} missing in {v}"))
    };

    let writes = r["writes"].as_array().expect("writes");
    assert_eq!(writes.len(), 2, "{r}");
    assert_eq!(writes[0]["w"], "1");
    assert_eq!(writes[1]["w"], "majority");
    for w in writes {
        assert!(num(w, "inserts_per_sec") > 0.0, "{w}");
    }
    let ratio = num(&r, "majority_over_w1");
    assert!(ratio.is_finite() && ratio > 0.0, "{ratio}");

    let reads = r["reads"].as_array().expect("reads");
    assert_eq!(reads.len(), 3, "{r}");
    for (k, x) in reads.iter().enumerate() {
        assert_eq!(num(x, "members") as usize, k + 1);
        assert!(num(x, "reads_per_sec") > 0.0, "{x}");
        // Every member read from served reads (3 readers over up to 3 members).
        let per = x["per_member"].as_array().expect("per_member");
        assert_eq!(per.len(), k + 1);
        assert!(
            per.iter().all(|v| v.as_f64().is_some_and(|v| v > 0.0)),
            "{x}"
        );
        // Every _id read was loaded and replicated before the reads.
        assert_eq!(num(x, "found"), num(x, "reads"), "{x}");
    }

    let failovers = r["failovers"].as_array().expect("failovers");
    assert_eq!(failovers.len(), 1, "{r}");
    let f = &failovers[0];
    assert!(num(f, "seconds_to_first_write") > 0.0, "{f}");
    assert_ne!(f["killed_member"], f["new_primary"], "{f}");

    let c = &r["catchup"];
    assert_eq!(num(c, "docs"), 1000.0);
    assert!(num(c, "total_seconds") > 0.0, "{c}");
    assert!(num(c, "reconfig_seconds") > 0.0, "{c}");
    assert!(num(c, "log_seconds") >= 0.0, "{c}");
    assert!(num(c, "primary_docs") >= 1000.0, "{c}");
    assert_eq!(num(c, "primary_docs"), num(c, "new_member_docs"), "{c}");

    let md = std::fs::read_to_string(out.join("replication.md")).expect("replication.md");
    for needle in [
        "| w: 1 |",
        "| w: majority |",
        "throughput ratio",
        "kill → first write",
        "| new member |",
    ] {
        assert!(md.contains(needle), "{needle} missing in\n{md}");
    }
    let _ = std::fs::remove_dir_all(&out);
}
