//! What every bench test shares: run a `duet bench …` command line as the
//! binary would, a fresh temporary directory, and a figure's median. Each test
//! binary uses its own subset of these.
#![allow(dead_code)]

use clap::Parser;
use duet_bench::result::BenchResult;
use duet_bench::BenchCommand;

#[derive(Parser)]
struct Cli {
    #[command(subcommand)]
    command: BenchCommand,
}

/// Parse the words after `duet bench`.
pub fn parse(args: &[&str]) -> BenchCommand {
    Cli::try_parse_from(std::iter::once("bench").chain(args.iter().copied()))
        .expect("arguments parse")
        .command
}

/// Run a command: the result of a workload, `None` for `report`.
pub fn run(args: &[&str]) -> Option<BenchResult> {
    duet_bench::run(parse(args)).expect("benchmark runs")
}

/// Run a workload command.
pub fn result(args: &[&str]) -> BenchResult {
    run(args).expect("a result")
}

/// `<temp>/duet-bench-<name>-<pid>`, empty.
pub fn temp_dir(name: &str) -> std::path::PathBuf {
    let d = std::env::temp_dir().join(format!("duet-bench-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).expect("temp dir");
    d
}

/// The median of (target, case ⊇ `case`, metric); panics when missing.
pub fn metric(r: &BenchResult, target: &str, case: &[(&str, &str)], metric: &str) -> f64 {
    r.find(target, case, metric)
        .unwrap_or_else(|| panic!("missing {metric} of {target} for {case:?}"))
        .median
}

/// Regenerate a report from the results in `dir` into `dir/BENCHMARKS.md`
/// and `dir/charts`; returns the Markdown.
pub fn report(dir: &std::path::Path) -> String {
    let md = dir.join("BENCHMARKS.md");
    let charts = dir.join("charts");
    assert!(run(&[
        "report",
        "--results",
        dir.to_str().expect("utf-8"),
        "--out",
        md.to_str().expect("utf-8"),
        "--charts",
        charts.to_str().expect("utf-8"),
    ])
    .is_none());
    std::fs::read_to_string(&md).expect("report written")
}
