//! A tiny `duet bench space` run (so the workload does not rot) and its chart
//! through `report`. Nothing here asserts performance.

use clap::Parser;
use duet_bench::result::BenchResult;
use duet_bench::BenchCommand;

#[derive(Parser)]
struct Cli {
    #[command(subcommand)]
    command: BenchCommand,
}

fn run(args: &[&str]) -> Option<BenchResult> {
    let cli = Cli::try_parse_from(std::iter::once("bench").chain(args.iter().copied()))
        .expect("arguments parse");
    duet_bench::run(cli.command).expect("benchmark runs")
}

#[test]
fn space_runs_tiny_and_charts() {
    let dir = std::env::temp_dir().join(format!("duet-bench-space-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("temp dir");
    let out = dir.to_str().expect("utf-8 temp dir");
    let r = run(&[
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
    ])
    .expect("space result");
    for system in ["olcp", "vls", "cow-steam"] {
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
    let md = dir.join("BENCHMARKS.md");
    let charts = dir.join("charts");
    assert!(run(&[
        "report",
        "--results",
        out,
        "--out",
        md.to_str().expect("utf-8"),
        "--charts",
        charts.to_str().expect("utf-8"),
    ])
    .is_none());
    let text = std::fs::read_to_string(&md).expect("report");
    assert!(text.contains("<!-- BEGIN bench:space -->"));
    assert!(text.contains("space-old-versions-zipfian-q1.png"));
    let _ = std::fs::remove_dir_all(&dir);
}
