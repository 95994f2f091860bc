//! The `$lookup` snapshot checker (`check::lookup`): pipelines that join two
//! collections changed together by transactions read both at one csn under
//! every consistent strategy; the checker catches a join that reads the
//! other collection separately (a client-side join, MongoDB without a
//! transaction).

use std::time::Duration;

use duetdb::check::lookup::{run, LookupCheckConfig, LookupMode};
use duetdb::Strategy;

fn cfg(strategy: Strategy, mode: LookupMode) -> LookupCheckConfig {
    LookupCheckConfig {
        strategy,
        mode,
        docs: 200,
        rounds: 2,
        scans_per_round: 4,
        max_duration: Duration::from_secs(10),
        ..LookupCheckConfig::default()
    }
}

#[test]
fn lookup_pipelines_read_one_snapshot() {
    for s in [Strategy::Cow, Strategy::Vls, Strategy::Olcp, Strategy::Auto] {
        let r = run(&cfg(s, LookupMode::Pipeline), |_| {});
        assert!(r.scans_checked >= 10, "{s:?}: {r:?}");
        assert!(r.writes > 0, "{s:?}: {r:?}");
        assert_eq!(r.violations, 0, "{s:?}: {:?}", r.examples);
    }
}

#[test]
fn the_checker_catches_joins_across_commits() {
    // Retried a few rounds: a violation needs a commit between the outer
    // read and a mirror read, which the writers make all but certain.
    let mut c = cfg(Strategy::Cow, LookupMode::SeparateReads);
    c.rounds = 8;
    c.stop_on_violation = true;
    let r = run(&c, |_| {});
    assert!(r.violations > 0, "separate reads went unnoticed: {r:?}");
}
