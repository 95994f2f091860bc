//! `duet bench delta` (issue #19 item 1): DStore's delta indexing on vs off
//! under a DStore-style update mix, through the engine API in process (in
//! memory).
//!
//! A collection of `records` documents `{_id, a, b, c, n, pad}` with three
//! secondary indexes `{a: 1}`, `{b: 1}`, `{c: 1}`. One client thread updates
//! random documents for `seconds`, each update setting all three indexed
//! fields to new random values (every update moves one entry in every
//! index: the case delta indexing is for). Modes `off` and `on` alternate
//! for `repeat` rounds, each on a fresh database, so both see the same
//! machine load; figures are the median and the spread (min–max) over the
//! rounds.
//!
//! Per round: updates/s; the updater thread's CPU time per update
//! (`CLOCK_THREAD_CPUTIME_ID`) and the whole process's (`getrusage`, which
//! includes the merger thread) — on a loaded 2-core machine the wall-clock
//! rate alone says little; with delta indexing on, the merge lag (time from
//! a cut to its install: mean and max), merges run, entries merged and the
//! writer's own merges (back-pressure). Then, with the updater stopped and
//! the last layers left unmerged, range reads `{a: {$gte: x, $lt: x + w}}`
//! on one held snapshot in the fresh view (merged trees + delta layers) and
//! the stale one (merged trees only), reads/s each.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Result;
use bson::doc;
use duetdb::{Database, DbOptions, DeltaOptions, IndexOptions, IndexRead};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde::Serialize;

/// What to run.
#[derive(Debug, Clone)]
pub struct Params {
    pub records: u64,
    pub seconds: f64,
    pub repeat: usize,
    pub seed: u64,
    /// Seconds of range reads per view.
    pub read_seconds: f64,
    /// Width of a read's `a` range (values are uniform in 0..records).
    pub read_width: i64,
}

/// One round of one mode.
#[derive(Debug, Clone, Serialize)]
pub struct Round {
    pub mode: &'static str,
    pub round: usize,
    pub updates_per_sec: f64,
    /// Updater thread CPU per update (µs).
    pub thread_cpu_us: f64,
    /// Whole-process CPU per update (µs), merger included.
    pub process_cpu_us: f64,
    pub merges: u64,
    pub merged_entries: u64,
    pub writer_merges: u64,
    pub lag_ms_mean: f64,
    pub lag_ms_max: f64,
    /// Unmerged entries over the three indexes when the updater stopped.
    pub unmerged_at_end: u64,
    pub fresh_reads_per_sec: f64,
    pub stale_reads_per_sec: f64,
}

/// Median and spread of one figure over the rounds of a mode.
#[derive(Debug, Clone, Serialize)]
pub struct Summary {
    pub mode: &'static str,
    pub updates_per_sec: (f64, f64, f64),
    pub thread_cpu_us: (f64, f64, f64),
    pub process_cpu_us: (f64, f64, f64),
    pub lag_ms_mean: (f64, f64, f64),
    pub lag_ms_max: (f64, f64, f64),
    pub fresh_reads_per_sec: (f64, f64, f64),
    pub stale_reads_per_sec: (f64, f64, f64),
}

#[derive(Debug, Clone, Serialize)]
pub struct Report {
    pub records: u64,
    pub seconds: f64,
    pub rounds: Vec<Round>,
    pub summary: Vec<Summary>,
    /// Median updates/s with delta indexing on over off.
    pub update_ratio: f64,
}

fn spread(mut v: Vec<f64>) -> (f64, f64, f64) {
    v.sort_by(|a, b| a.total_cmp(b));
    if v.is_empty() {
        return (0.0, 0.0, 0.0);
    }
    (v[v.len() / 2], v[0], v[v.len() - 1])
}

fn one_round(p: &Params, on: bool, round: usize) -> Result<Round> {
    let delta = DeltaOptions {
        on,
        ..DeltaOptions::default()
    };
    let db = Database::with_options(
        "bench",
        None,
        DbOptions {
            delta,
            ..DbOptions::default()
        },
    );
    let c = db.collection("d");
    let n = p.records.max(1);
    let span = n as i64;
    let mut rng = StdRng::seed_from_u64(p.seed ^ round as u64);
    let mut start = 0u64;
    while start < n {
        let end = (start + 10_000).min(n);
        let docs: Vec<bson::Document> = (start..end)
            .map(|i| {
                doc! {"_id": i as i64, "a": rng.gen_range(0..span), "b": rng.gen_range(0..span),
                "c": rng.gen_range(0..span), "n": 0i64, "pad": "x".repeat(32)}
            })
            .collect();
        c.insert_many(docs, false)?;
        start = end;
    }
    for f in ["a", "b", "c"] {
        c.create_index(doc! {f: 1}, IndexOptions::default())?;
    }
    let stop = Arc::new(AtomicBool::new(false));
    let updater = {
        let c = c.clone();
        let stop = stop.clone();
        let seed = rng.gen::<u64>();
        std::thread::spawn(move || -> Result<(u64, Duration)> {
            let mut rng = StdRng::seed_from_u64(seed);
            let cpu0 = super::thread_cpu();
            let mut ops = 0u64;
            while !stop.load(Ordering::Relaxed) {
                let id = rng.gen_range(0..n) as i64;
                c.update_one(
                    doc! {"_id": id},
                    doc! {"$set": {"a": rng.gen_range(0..span), "b": rng.gen_range(0..span), "c": rng.gen_range(0..span)}, "$inc": {"n": 1i64}},
                )?;
                ops += 1;
            }
            Ok((ops, super::thread_cpu() - cpu0))
        })
    };
    let p0 = super::process_cpu();
    let t0 = Instant::now();
    std::thread::sleep(Duration::from_secs_f64(p.seconds));
    stop.store(true, Ordering::Relaxed);
    let (ops, cpu) = updater
        .join()
        .map_err(|_| anyhow::anyhow!("updater panicked"))??;
    let wall = t0.elapsed().as_secs_f64();
    let pcpu = super::process_cpu() - p0;
    let stats = db.delta_stats();
    let snap = db.snapshot();
    let unmerged_at_end: u64 = snap
        .state()
        .collection("d")
        .map(|c| c.indexes.iter().map(|i| i.delta_len() as u64).sum())
        .unwrap_or(0);
    let reads = |read: IndexRead, seed: u64| -> Result<f64> {
        let coll = snap.collection("d").with_index_read(read);
        let mut rng = StdRng::seed_from_u64(seed);
        let t = Instant::now();
        let mut k = 0u64;
        while t.elapsed().as_secs_f64() < p.read_seconds {
            let x = rng.gen_range(0..span);
            let found = coll
                .find(doc! {"a": {"$gte": x, "$lt": x + p.read_width}})
                .raw()?;
            std::hint::black_box(found);
            k += 1;
        }
        Ok(k as f64 / t.elapsed().as_secs_f64())
    };
    let fresh_reads_per_sec = reads(IndexRead::Fresh, p.seed)?;
    let stale_reads_per_sec = reads(IndexRead::Stale, p.seed)?;
    let ops_f = ops.max(1) as f64;
    Ok(Round {
        mode: if on { "on" } else { "off" },
        round,
        updates_per_sec: ops as f64 / wall,
        thread_cpu_us: cpu.as_secs_f64() * 1e6 / ops_f,
        process_cpu_us: pcpu.as_secs_f64() * 1e6 / ops_f,
        merges: stats.merged,
        merged_entries: stats.merged_entries,
        writer_merges: stats.writer_merges,
        lag_ms_mean: stats.lag_us_total as f64 / 1e3 / stats.installed.max(1) as f64,
        lag_ms_max: stats.lag_us_max as f64 / 1e3,
        unmerged_at_end,
        fresh_reads_per_sec,
        stale_reads_per_sec,
    })
}

/// Run `off` and `on` alternately `repeat` times; the report and a
/// Markdown section.
pub fn run(p: &Params) -> Result<(Report, String)> {
    let mut rounds = Vec::new();
    for r in 0..p.repeat.max(1) {
        for on in [false, true] {
            let round = one_round(p, on, r)?;
            eprintln!(
                "  round {r} delta {}: {:.0} updates/s, {:.1} µs CPU/update",
                round.mode, round.updates_per_sec, round.thread_cpu_us
            );
            rounds.push(round);
        }
    }
    let summary: Vec<Summary> = ["off", "on"]
        .iter()
        .map(|m| {
            let of = |f: fn(&Round) -> f64| {
                spread(rounds.iter().filter(|r| r.mode == *m).map(f).collect())
            };
            Summary {
                mode: m,
                updates_per_sec: of(|r| r.updates_per_sec),
                thread_cpu_us: of(|r| r.thread_cpu_us),
                process_cpu_us: of(|r| r.process_cpu_us),
                lag_ms_mean: of(|r| r.lag_ms_mean),
                lag_ms_max: of(|r| r.lag_ms_max),
                fresh_reads_per_sec: of(|r| r.fresh_reads_per_sec),
                stale_reads_per_sec: of(|r| r.stale_reads_per_sec),
            }
        })
        .collect();
    let update_ratio = summary[1].updates_per_sec.0 / summary[0].updates_per_sec.0.max(1e-9);
    let fmt =
        |(m, lo, hi): (f64, f64, f64), prec: usize| format!("{m:.prec$} ({lo:.prec$}–{hi:.prec$})");
    let mut md = format!(
        "DStore-style update mix: {} documents, 3 secondary indexes, every update moves all three keys; one updater, {}s per round, {} rounds per mode (off/on alternating); median (min–max).\n\n| delta indexing | updates/s | updater CPU µs/update | process CPU µs/update | merge lag mean (ms) | merge lag max (ms) | fresh range reads/s | stale range reads/s |\n|---|---:|---:|---:|---:|---:|---:|---:|\n",
        p.records, p.seconds, p.repeat
    );
    for s in &summary {
        md.push_str(&format!(
            "| {} | {} | {} | {} | {} | {} | {} | {} |\n",
            s.mode,
            fmt(s.updates_per_sec, 0),
            fmt(s.thread_cpu_us, 2),
            fmt(s.process_cpu_us, 2),
            fmt(s.lag_ms_mean, 2),
            fmt(s.lag_ms_max, 2),
            fmt(s.fresh_reads_per_sec, 0),
            fmt(s.stale_reads_per_sec, 0),
        ));
    }
    md.push_str(&format!(
        "\nUpdate throughput on/off: **{update_ratio:.2}×** (median over median).\n"
    ));
    Ok((
        Report {
            records: p.records,
            seconds: p.seconds,
            rounds,
            summary,
            update_ratio,
        },
        md,
    ))
}
