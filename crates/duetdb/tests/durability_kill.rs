//! Real SIGKILL tests: this test binary re-runs itself as the child (the
//! `kill_child` test, active only when `DUET_KILL_CHILD_DIR` is set), which
//! writes multi-document batches through the engine and reports
//! acknowledgements on stdout; the parent kills it at random moments and
//! checks every recovery (see `duetdb::check::killtest`).

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use duetdb::check::killtest;

const CHILD_DIR: &str = "DUET_KILL_CHILD_DIR";

#[test]
fn kill_child() {
    let Some(dir) = std::env::var_os(CHILD_DIR) else {
        return; // an ordinary test run: nothing to do
    };
    let num = |k: &str| {
        std::env::var(k)
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(0)
    };
    let mut out = std::io::stdout();
    let r = killtest::child(
        Path::new(&dir),
        num("DUET_KILL_RUN"),
        num("DUET_KILL_SEED"),
        &mut out,
    );
    eprintln!("child stopped: {r:?}");
    std::process::exit(2);
}

#[test]
fn durability_sigkill_campaign() {
    if std::env::var_os(CHILD_DIR).is_some() {
        return;
    }
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path().join("db");
    let exe = std::env::current_exe().expect("test binary");
    let mut spawn = |run: u64, seed: u64| {
        Command::new(&exe)
            .args(["kill_child", "--exact", "--nocapture", "--test-threads=1"])
            .env(CHILD_DIR, &dir)
            .env("DUET_KILL_RUN", run.to_string())
            .env("DUET_KILL_SEED", seed.to_string())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
    };
    let kills = 200;
    let t = Instant::now();
    let report = killtest::campaign(
        &dir,
        kills,
        t + Duration::from_secs(90),
        0x5EED,
        Duration::from_millis(40),
        &mut spawn,
    )
    .unwrap_or_else(|e| panic!("kill campaign found a problem: {e}"));
    eprintln!(
        "{} SIGKILLs, {} acknowledged ops verified, recovery max {:.1?}, in {:.1?}",
        report.kills,
        report.acked_ops,
        report.max_recovery,
        t.elapsed()
    );
    assert!(
        report.kills >= 100,
        "only {} kills in the time budget",
        report.kills
    );
    assert!(
        report.acked_ops > report.kills,
        "children acknowledged almost nothing"
    );
}
