//! HTAP: an update stream beside K concurrent analytic queries — the VLS
//! paper's set-up (§ evaluation: ~240-byte records, zipfian update keys, one
//! thread per analytic, full-scan counts and index range scans over 5/10/25 %
//! of the table, K = 0, 1, 8 …). Per target and snapshot strategy it reports
//! update throughput, p50/p95/p99 update latency, scan duration, and space
//! (resident memory, or the peer's own size figures) at start and at peak.
//!
//! Scans start either staggered (each thread starts its next scan when its
//! last one ends, so concurrent scans drift apart) or aligned (every round
//! of K scans starts together, the VLS paper's fully overlapping scans, where
//! one shared remset entry serves all K scans).
//!
//! Beside wall-clock figures it reports CPU time from the threads' own clocks
//! (`CLOCK_THREAD_CPUTIME_ID`): `scan_cpu_ms_median` per scan and
//! `update_cpu_us_per_op` for the update threads (which also run the writer's
//! work for their commands as group leaders). On a shared machine a thread's
//! wall time is mostly its share of the cores; its CPU time is the work it
//! did, so strategy overheads show up there even when the wall figures are
//! scheduling noise.
//!
//! Every scan's count is checked: a full count must see exactly `records`
//! documents and a range count exactly the range width (updates never change
//! `v`), so a target that loses or double-counts documents under updates shows
//! up in the notes.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Condvar, Mutex};
use std::time::{Duration, Instant};

use anyhow::{anyhow, Result};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use crate::gen::ScrambledZipfian;
use crate::progress::note;
use crate::result::{case, Collector};
use crate::stats::{median, Latencies};
use crate::targets::{htap_payload, HtapTarget, Strategy};
use crate::workload::{timed_cell, CellClock, Pacer};

/// The analytic query of a cell.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum ScanKind {
    /// Count over the whole table with a predicate on an unindexed field.
    Full,
    /// Index range over 5 % of the table.
    Idx5,
    /// Index range over 10 % of the table.
    Idx10,
    /// Index range over 25 % of the table.
    Idx25,
}

impl ScanKind {
    pub fn name(self) -> &'static str {
        match self {
            ScanKind::Full => "full",
            ScanKind::Idx5 => "idx5",
            ScanKind::Idx10 => "idx10",
            ScanKind::Idx25 => "idx25",
        }
    }
    fn percent(self) -> u64 {
        match self {
            ScanKind::Full => 100,
            ScanKind::Idx5 => 5,
            ScanKind::Idx10 => 10,
            ScanKind::Idx25 => 25,
        }
    }
}

/// How the K analytic threads start their scans.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum ScanStart {
    /// Each thread starts its next scan when its previous one ends.
    #[default]
    Staggered,
    /// Rounds: all K scans of a round start together (fully overlapping).
    Aligned,
}

/// A reusable barrier for aligned scan rounds that threads may leave: a
/// thread that stops scanning no longer holds the others back.
struct Rounds {
    state: Mutex<(u64, usize, usize)>, // (round, waiting, active)
    cv: Condvar,
}

impl Rounds {
    fn new(active: usize) -> Rounds {
        Rounds {
            state: Mutex::new((0, 0, active)),
            cv: Condvar::new(),
        }
    }

    /// Wait until every active thread arrived, then all start together.
    fn arrive(&self) -> Result<()> {
        let mut st = self
            .state
            .lock()
            .map_err(|_| anyhow!("scan rounds poisoned"))?;
        st.1 += 1;
        if st.1 >= st.2 {
            st.0 += 1;
            st.1 = 0;
            self.cv.notify_all();
            return Ok(());
        }
        let round = st.0;
        while st.0 == round {
            st = self
                .cv
                .wait(st)
                .map_err(|_| anyhow!("scan rounds poisoned"))?;
        }
        Ok(())
    }

    /// This thread scans no more.
    fn leave(&self) -> Result<()> {
        let mut st = self
            .state
            .lock()
            .map_err(|_| anyhow!("scan rounds poisoned"))?;
        st.2 = st.2.saturating_sub(1);
        if st.1 > 0 && st.1 >= st.2 {
            st.0 += 1;
            st.1 = 0;
            self.cv.notify_all();
        }
        Ok(())
    }
}

#[derive(Debug, Clone, serde::Serialize)]
pub struct Params {
    pub records: u64,
    /// Update client threads.
    pub threads: usize,
    pub seconds: f64,
    #[serde(serialize_with = "crate::targets::serialize_strategies")]
    pub strategies: Vec<Strategy>,
    pub analytics: Vec<usize>,
    pub scans: Vec<ScanKind>,
    /// Attempted updates per second over all update threads; 0 = as fast as possible.
    pub update_rate: u64,
    pub seed: u64,
    pub repeat: usize,
    pub scan_start: ScanStart,
}

/// What one update thread did: updates, their latencies, its CPU time.
struct UpdateOut {
    ops: u64,
    lat: Latencies,
    cpu: Duration,
}

/// What one analytic thread did: scan durations (wall and CPU, ms) and counts
/// that were not the known answer.
struct ScanOut {
    wall_ms: Vec<f64>,
    cpu_ms: Vec<f64>,
    /// Each scan's start and end, ms since the cell's start.
    start_ms: Vec<f64>,
    end_ms: Vec<f64>,
    wrong: u64,
}

struct CellOut {
    update_ops: u64,
    update_lat: Latencies,
    update_cpu: Duration,
    wall_s: f64,
    scan_ms: Vec<f64>,
    scan_cpu_ms: Vec<f64>,
    /// Aligned rounds: per round, the slowest scan's duration minus the
    /// fastest's (their starts are the same instant, so this is how far
    /// apart they finish).
    round_spread_ms: Vec<f64>,
    /// Aligned rounds: per round, (last end − first end) / the round's
    /// median scan duration, and last start − first start (ms).
    round_ends: Vec<(f64, f64)>,
    /// Scans running, averaged over the update window (`p.seconds`): how
    /// many scans an update could find running.
    scans_active_mean: f64,
    wrong_counts: u64,
    space_start: Vec<(String, f64)>,
    space_peak: Vec<(String, f64)>,
    /// The target's whole-cell figures ([`HtapTarget::cell_counters`]).
    counters: Vec<(String, f64)>,
}

fn run_cell(
    target: &dyn HtapTarget,
    p: &Params,
    strategy: Strategy,
    k: usize,
    scan: ScanKind,
    seed: u64,
    quiet: bool,
) -> Result<CellOut> {
    target.begin_cell();
    let space_start = target.space()?;
    let space_peak = Mutex::new(space_start.clone());
    let done = AtomicBool::new(false);
    let threads = p.threads.max(1);
    let label = format!(
        "{} {} K={k} {}",
        target.name(),
        strategy.name(),
        scan.name()
    );
    let rounds = (p.scan_start == ScanStart::Aligned).then(|| Rounds::new(k));
    let run = std::thread::scope(|s| {
        let sampler = s.spawn(|| sample_space(target, &space_peak, &done));
        let run = timed_cell(
            (&label, p.seconds, quiet, "upd"),
            (threads, |t, clock: &CellClock| {
                update_stream(target, p, seed ^ (t as u64) << 8, threads, clock)
            }),
            (k, |t, clock: &CellClock| {
                let out = scan_loop(
                    target,
                    p,
                    (strategy, scan, rounds.as_ref()),
                    seed ^ 0x5ca9 ^ (t as u64) << 8,
                    clock,
                );
                if let Some(r) = &rounds {
                    r.leave()?;
                }
                out
            }),
        );
        done.store(true, Ordering::Release);
        let sampled = sampler.join().map_err(|_| anyhow!("sampler panicked"));
        let run = run?;
        sampled??;
        Ok::<_, anyhow::Error>(run)
    })?;
    let mut update_lat = Latencies::new();
    for w in &run.writers {
        update_lat.merge(&w.lat);
    }
    let mut space_peak = space_peak
        .into_inner()
        .map_err(|_| anyhow!("space sampler poisoned"))?;
    space_peak.extend(target.cell_figures());
    Ok(CellOut {
        update_ops: run.writers.iter().map(|w| w.ops).sum(),
        update_lat,
        update_cpu: run.writers.iter().map(|w| w.cpu).sum(),
        wall_s: run.wall_s,
        scan_ms: run
            .readers
            .iter()
            .flat_map(|r| r.wall_ms.iter().copied())
            .collect(),
        scan_cpu_ms: run
            .readers
            .iter()
            .flat_map(|r| r.cpu_ms.iter().copied())
            .collect(),
        round_spread_ms: if rounds.is_some() {
            round_spreads(
                &run.readers
                    .iter()
                    .map(|r| &r.wall_ms[..])
                    .collect::<Vec<_>>(),
            )
        } else {
            Vec::new()
        },
        round_ends: if rounds.is_some() {
            round_ends(&run.readers)
        } else {
            Vec::new()
        },
        scans_active_mean: scans_active_mean(&run.readers, p.seconds * 1000.0),
        wrong_counts: run.readers.iter().map(|r| r.wrong).sum(),
        space_start,
        space_peak,
        counters: target.cell_counters(),
    })
}

/// For rounds every scan took part in (round `r` is each scan's `r`-th
/// duration), the longest duration minus the shortest.
fn round_spreads(durations: &[&[f64]]) -> Vec<f64> {
    let rounds = durations.iter().map(|d| d.len()).min().unwrap_or(0);
    (0..rounds)
        .map(|r| {
            let (lo, hi) = durations
                .iter()
                .map(|d| d[r])
                .fold((f64::MAX, f64::MIN), |(lo, hi), x| (lo.min(x), hi.max(x)));
            hi - lo
        })
        .collect()
}

/// For rounds every scan took part in: how far apart the scans finished, as
/// a fraction of the round's median scan duration, and how far apart they
/// started (ms; the barrier wakes the threads one by one).
fn round_ends(scans: &[ScanOut]) -> Vec<(f64, f64)> {
    let rounds = scans.iter().map(|s| s.end_ms.len()).min().unwrap_or(0);
    let spread = |xs: &mut dyn Iterator<Item = f64>| {
        let (lo, hi) = xs.fold((f64::MAX, f64::MIN), |(lo, hi), x| (lo.min(x), hi.max(x)));
        hi - lo
    };
    (0..rounds)
        .map(|r| {
            let durations: Vec<f64> = scans.iter().map(|s| s.wall_ms[r]).collect();
            let ends = spread(&mut scans.iter().map(|s| s.end_ms[r]));
            let starts = spread(&mut scans.iter().map(|s| s.start_ms[r]));
            (ends / median(&durations).max(1e-9), starts)
        })
        .collect()
}

/// The time-weighted mean number of scans running in `[0, window_ms]`.
fn scans_active_mean(scans: &[ScanOut], window_ms: f64) -> f64 {
    let busy: f64 = scans
        .iter()
        .flat_map(|s| s.start_ms.iter().zip(&s.end_ms))
        .map(|(a, b)| (b.min(window_ms) - a.min(window_ms)).max(0.0))
        .sum();
    busy / window_ms.max(1e-9)
}

/// One update thread: zipfian keys until the deadline, paced to its share
/// of `update_rate`.
fn update_stream(
    target: &dyn HtapTarget,
    p: &Params,
    seed: u64,
    threads: usize,
    clock: &CellClock,
) -> Result<UpdateOut> {
    let mut sess = target.session()?;
    let cpu0 = super::thread_cpu();
    let mut rng = StdRng::seed_from_u64(seed);
    let mut keys = ScrambledZipfian::new(0, p.records.max(1) - 1);
    let mut pacer = Pacer::new(p.update_rate, threads);
    let mut lat = Latencies::new();
    let mut n = 0u64;
    while clock.writing_after(n) {
        pacer.wait();
        let id = keys.next(&mut rng);
        let payload = htap_payload(rng.gen::<u32>() as u64);
        let t0 = Instant::now();
        sess.update(id, &payload)?;
        lat.record(t0.elapsed());
        n += 1;
        clock.count();
    }
    Ok(UpdateOut {
        ops: n,
        lat,
        cpu: super::thread_cpu().saturating_sub(cpu0),
    })
}

/// One analytic thread: `scan` under `strategy` while the updates run.
fn scan_loop(
    target: &dyn HtapTarget,
    p: &Params,
    (strategy, scan, rounds): (Strategy, ScanKind, Option<&Rounds>),
    seed: u64,
    clock: &CellClock,
) -> Result<ScanOut> {
    let mut sess = target.session()?;
    let mut rng = StdRng::seed_from_u64(seed);
    let mut durations = Vec::new();
    let mut cpu_ms = Vec::new();
    let (mut start_ms, mut end_ms) = (Vec::new(), Vec::new());
    let since = |t: Instant| t.saturating_duration_since(clock.started).as_secs_f64() * 1000.0;
    let mut wrong = 0;
    while clock.reading(durations.len()) {
        if let Some(r) = rounds {
            r.arrive()?;
        }
        let t0 = Instant::now();
        let cpu0 = super::thread_cpu();
        let (got, want) = match scan {
            ScanKind::Full => (sess.full_scan_count(strategy)?, p.records),
            _ => {
                let width = p.records * scan.percent() / 100;
                let lo = rng.gen_range(0..=p.records - width);
                (sess.range_count(lo, lo + width, strategy)?, width)
            }
        };
        let t1 = Instant::now();
        durations.push(t1.duration_since(t0).as_secs_f64() * 1000.0);
        start_ms.push(since(t0));
        end_ms.push(since(t1));
        cpu_ms.push(super::thread_cpu().saturating_sub(cpu0).as_secs_f64() * 1000.0);
        if got != want {
            wrong += 1;
        }
    }
    Ok(ScanOut {
        wall_ms: durations,
        cpu_ms,
        start_ms,
        end_ms,
        wrong,
    })
}

/// Sample the target's space figures every 250 ms into `peak` until `done`.
fn sample_space(
    target: &dyn HtapTarget,
    peak: &Mutex<Vec<(String, f64)>>,
    done: &AtomicBool,
) -> Result<()> {
    while !done.load(Ordering::Acquire) {
        std::thread::sleep(Duration::from_millis(250));
        let now = target.space()?;
        let mut peak = peak.lock().map_err(|_| anyhow!("space sampler poisoned"))?;
        for (name, v) in now {
            match peak.iter_mut().find(|(n, _)| *n == name) {
                Some((_, pv)) => *pv = pv.max(v),
                None => peak.push((name, v)),
            }
        }
    }
    Ok(())
}

/// Run every cell (strategy × K × scan kind) on every target, `p.repeat` times.
pub fn run(
    targets: &[&dyn HtapTarget],
    p: &Params,
    quiet: bool,
    col: &mut Collector,
    notes: &mut Vec<String>,
) -> Result<()> {
    for rep in 0..p.repeat.max(1) {
        for &target in targets {
            let name = target.name();
            note(
                quiet,
                &format!(
                    "[htap] {name}: loading {} documents (run {}/{})",
                    p.records,
                    rep + 1,
                    p.repeat
                ),
            );
            let t0 = Instant::now();
            target.load(p.records)?;
            let load_s = t0.elapsed().as_secs_f64();
            col.add(
                &name,
                &case(&[("phase", "load")]),
                "load_docs_per_s",
                p.records as f64 / load_s.max(1e-9),
            );
            let mut cell_no: u64 = 0;
            let mut strategies = plan_strategies(target, &p.strategies);
            if rep == 0 {
                for (_, label) in &strategies {
                    notes.push(format!("{name}: strategy {label}"));
                }
            }
            // Cell-major, and the strategies' order rotated every run: the
            // heap ages as the updaters run (each update moves a document to
            // fresh memory, so a later scan has less locality), so a
            // strategy whose cells always came after another's measured the
            // age, not the strategy (session 15: the same vls/none pair gave
            // 1.40x in one order and 1.02x in the other).
            if !strategies.is_empty() {
                let n = strategies.len();
                strategies.rotate_left(rep % n);
            }
            for &k in &p.analytics {
                let kinds: Vec<ScanKind> = if k == 0 {
                    vec![ScanKind::Full]
                } else {
                    p.scans.clone()
                };
                for scan in kinds {
                    for &(strategy, _) in &strategies {
                        let sname = strategy_case(target, strategy);
                        // Every cell gets its own update stream: replaying an earlier
                        // cell's payloads would turn updates into no-ops (a `$set` to
                        // the current value creates no version) and flatter later cells.
                        cell_no += 1;
                        let seed = p.seed ^ (rep as u64) << 40 ^ (k as u64) << 24 ^ cell_no << 8;
                        let cell = run_cell(target, p, strategy, k, scan, seed, quiet)?;
                        let ks = k.to_string();
                        let scan_name = if k == 0 { "-" } else { scan.name() };
                        let c = case(&[
                            ("strategy", &sname),
                            ("analytics", &ks),
                            ("scan", scan_name),
                        ]);
                        col.add(
                            &name,
                            &c,
                            "update_ops_per_s",
                            cell.update_ops as f64 / cell.wall_s.max(1e-9),
                        );
                        col.add(
                            &name,
                            &c,
                            "update_latency_us_p50",
                            cell.update_lat.quantile_us(0.50),
                        );
                        col.add(
                            &name,
                            &c,
                            "update_latency_us_p95",
                            cell.update_lat.quantile_us(0.95),
                        );
                        col.add(
                            &name,
                            &c,
                            "update_latency_us_p99",
                            cell.update_lat.quantile_us(0.99),
                        );
                        if cell.update_ops > 0 && cell.update_cpu > Duration::ZERO {
                            col.add(
                                &name,
                                &c,
                                "update_cpu_us_per_op",
                                cell.update_cpu.as_secs_f64() * 1e6 / cell.update_ops as f64,
                            );
                        }
                        if k > 0 {
                            col.add(&name, &c, "scans_completed", cell.scan_ms.len() as f64);
                            col.add(&name, &c, "scan_ms_median", median(&cell.scan_ms));
                            col.add(&name, &c, "scan_cpu_ms_median", median(&cell.scan_cpu_ms));
                            if !cell.round_spread_ms.is_empty() {
                                col.add(
                                    &name,
                                    &c,
                                    "round_finish_spread_ms_median",
                                    median(&cell.round_spread_ms),
                                );
                            }
                            col.add(&name, &c, "scans_active_mean", cell.scans_active_mean);
                            if !cell.round_ends.is_empty() {
                                let (ends, starts): (Vec<f64>, Vec<f64>) =
                                    cell.round_ends.iter().copied().unzip();
                                col.add(&name, &c, "scan_end_spread_frac", median(&ends));
                                col.add(&name, &c, "scan_start_spread_ms_median", median(&starts));
                            }
                        }
                        for (n, v) in &cell.space_start {
                            col.add(&name, &c, &format!("{n}_start"), *v);
                        }
                        for (n, v) in &cell.space_peak {
                            col.add(&name, &c, &format!("{n}_peak"), *v);
                        }
                        for (n, v) in &cell.counters {
                            col.add(&name, &c, n, *v);
                        }
                        if cell.wrong_counts > 0 {
                            notes.push(format!(
                                "{name} {sname} K={k} {scan_name}: {} scans returned a wrong count (not a consistent snapshot)",
                                cell.wrong_counts
                            ));
                        }
                        note(quiet, &format!(
                            "[htap] {name} {sname} K={k} {scan_name}: {:.0} upd/s, p99 {:.0} µs, scan median {:.1} ms",
                            cell.update_ops as f64 / cell.wall_s.max(1e-9),
                            cell.update_lat.quantile_us(0.99),
                            median(&cell.scan_ms)
                        ));
                    }
                }
            }
        }
    }
    Ok(())
}

/// The requested strategies this target serves, with how it serves them.
fn plan_strategies(target: &dyn HtapTarget, requested: &[Strategy]) -> Vec<(Strategy, String)> {
    if let Some(label) = target.native_strategy() {
        return vec![(Strategy::Cow, label)];
    }
    requested
        .iter()
        .filter_map(|s| target.strategy_label(*s).ok().map(|l| (*s, l)))
        .collect()
}

fn strategy_case(target: &dyn HtapTarget, s: Strategy) -> String {
    if target.native_strategy().is_some() {
        "native".into()
    } else {
        s.name().into()
    }
}

#[cfg(test)]
mod tests {
    use super::Rounds;

    /// Every active thread is released in every round, together; a thread
    /// that leaves early never holds the others back.
    #[test]
    fn round_spreads_take_rounds_every_scan_finished() {
        let a = [10.0, 30.0, 5.0];
        let b = [14.0, 20.0];
        assert_eq!(super::round_spreads(&[&a[..], &b[..]]), vec![4.0, 10.0]);
        assert!(super::round_spreads(&[]).is_empty());
    }

    /// End spread over the round's median duration; start spread in ms.
    #[test]
    fn round_ends_compare_end_instants_of_rounds_every_scan_finished() {
        let scan = |start: &[f64], end: &[f64]| super::ScanOut {
            wall_ms: start.iter().zip(end).map(|(s, e)| e - s).collect(),
            cpu_ms: Vec::new(),
            start_ms: start.to_vec(),
            end_ms: end.to_vec(),
            wrong: 0,
        };
        let a = scan(&[0.0, 100.0, 200.0], &[100.0, 200.0, 300.0]);
        let b = scan(&[1.0, 121.0], &[121.0, 181.0]);
        let c = scan(&[0.0, 120.0], &[110.0, 220.0]);
        // Round 0: ends 100, 121, 110 (spread 21), durations 100, 120,
        // 110 (median 110), starts 0, 1, 0. Round 1: ends 200, 181, 220
        // (39), durations 100, 60, 100 (100), starts 100, 121, 120 (21).
        let scans = [a, b, c];
        let got = super::round_ends(&scans);
        assert_eq!(got.len(), 2);
        assert!((got[0].0 - 21.0 / 110.0).abs() < 1e-12 && got[0].1 == 1.0);
        assert!((got[1].0 - 0.39).abs() < 1e-12 && got[1].1 == 21.0);
        // Busy ms within the first 150 ms: a 100 + 50, b 120 + 29, c 110 + 30.
        let got = super::scans_active_mean(&scans, 150.0);
        assert!((got - 439.0 / 150.0).abs() < 1e-12, "{got}");
    }

    #[test]
    fn aligned_rounds_release_every_active_thread_together() {
        let threads = 4;
        let rounds = Rounds::new(threads);
        let seen: Vec<Vec<u64>> = std::thread::scope(|s| {
            let hs: Vec<_> = (0..threads)
                .map(|t| {
                    let rounds = &rounds;
                    s.spawn(move || {
                        // Thread t scans 20 + 10·t rounds, then leaves.
                        let mut got = Vec::new();
                        for _ in 0..20 + 10 * t {
                            rounds.arrive().expect("arrive");
                            got.push(rounds.state.lock().expect("lock").0);
                        }
                        rounds.leave().expect("leave");
                        got
                    })
                })
                .collect();
            hs.into_iter().map(|h| h.join().expect("join")).collect()
        });
        for (t, got) in seen.iter().enumerate() {
            let want: Vec<u64> = (1..=(20 + 10 * t) as u64).collect();
            assert_eq!(
                got, &want,
                "thread {t} was released in every round, in order"
            );
        }
    }
}
