//! `duet bench changes` (issue #16): change streams under an update stream
//! at full speed, through the engine API in process.
//!
//! Each cell runs `updaters` threads updating random documents of one
//! collection as fast as they can for `seconds`, beside N change streams
//! (`Engine::read_changes` on the collection, each its own thread, waiting
//! with `Engine::wait_for_changes` when caught up — the server's `getMore`
//! loop without the wire). Figures per cell: the updaters' throughput,
//! events delivered per second (all streams, and per stream), and the lag of
//! each delivered update from the moment its update call started (the
//! updater stamps that instant into the document: it bounds commit →
//! delivery from above by the update's own duration, a few µs), p50/p99.
//! N = 0 is the writer alone; in every run the ratio of the writer's
//! throughput with the most streams to that with none is recorded
//! (`writer_ratio`, target ≥ 0.95). With `--reader-pause-ms N` streams
//! sleep N ms whenever a read finds them caught up, instead of waiting for
//! the next publish.
//!
//! The engine is in memory: a stream's history is the 64 MiB change tail, so
//! a stream that falls further behind loses its position
//! (ChangeStreamHistoryLost, 286); it then restarts at the present and the
//! cell reports `history_lost` (a durable database would read the WAL).

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Result;
use bson::doc;
use duetdb::{ChangeKind, ChangeScope, Engine};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use crate::progress::note;
use crate::result::{case, Collector};
use crate::stats::Latencies;
use crate::workload::timed_cell;

/// The target name results carry.
pub const TARGET: &str = "duetdb-embedded";
const DB: &str = "bench_changes";
const COLL: &str = "c";
/// Events one `read_changes` call returns at most (the server's fetch size).
const FETCH: usize = 256;
/// Longest a caught-up stream sleeps before looking again (a publish wakes it).
const WAIT: Duration = Duration::from_millis(50);

#[derive(Debug, Clone, serde::Serialize)]
pub struct Params {
    /// Documents updated (uniformly at random).
    pub records: u64,
    /// Seconds per cell.
    pub seconds: f64,
    /// Updater threads.
    pub updaters: usize,
    /// Numbers of open streams, one cell each (0: the writer alone).
    pub streams: Vec<usize>,
    /// 0: a caught-up stream waits for the next publish (the server's
    /// `getMore`); N: it sleeps N ms after every read instead (a client that
    /// polls, reading in batches).
    pub reader_pause_ms: u64,
    pub seed: u64,
    pub repeat: usize,
}

/// What one stream saw.
struct StreamStats {
    events: u64,
    lag: Latencies,
    lost: u64,
}

/// Run every cell `p.repeat` times into `col`.
pub fn run(p: &Params, quiet: bool, col: &mut Collector, notes: &mut Vec<String>) -> Result<()> {
    let mut streams = p.streams.clone();
    streams.sort_unstable();
    streams.dedup();
    let most = streams.last().copied().unwrap_or(0);
    for rep in 0..p.repeat.max(1) {
        let engine = Engine::in_memory();
        load(&engine, p.records)?;
        let mut alone = None;
        let mut with_most = None;
        for &n in &streams {
            let rate = cell(&engine, p, n, rep, quiet, col, notes)?;
            if n == 0 {
                alone = Some(rate);
            }
            if n == most {
                with_most = Some(rate);
            }
        }
        if let (Some(a), Some(m)) = (alone, with_most) {
            if most > 0 && a > 0.0 {
                let c = case(&[("streams", &format!("{most} vs 0"))]);
                col.add(TARGET, &c, "writer_ratio", m / a);
            }
        }
    }
    Ok(())
}

/// `records` documents `{_id: i, v: 0, t: 0}`.
pub fn load(engine: &Engine, records: u64) -> Result<()> {
    let coll = engine.database(DB)?.collection(COLL);
    let mut i = 0u64;
    while i < records {
        let hi = (i + 1000).min(records);
        let docs: Vec<bson::Document> = (i..hi)
            .map(|k| doc! {"_id": k as i64, "v": 0_i64, "t": 0_i64})
            .collect();
        coll.insert_many(docs, true)?;
        i = hi;
    }
    Ok(())
}

/// One cell with `n` streams; returns the updaters' throughput (updates/s).
fn cell(
    engine: &Engine,
    p: &Params,
    n: usize,
    rep: usize,
    quiet: bool,
    col: &mut Collector,
    notes: &mut Vec<String>,
) -> Result<f64> {
    let epoch = Instant::now();
    // Every stream starts here: after everything already written.
    let start = engine.open_change_stream();
    let scope = ChangeScope::Collection {
        db: DB.to_string(),
        coll: COLL.to_string(),
    };
    let coll = Arc::new(engine.database(DB)?.collection(COLL));
    let label = format!("[changes] {n} streams (run {}/{})", rep + 1, p.repeat);
    let run = timed_cell(
        (&label, p.seconds, quiet, "updates"),
        (p.updaters.max(1), |t, clock| -> Result<u64> {
            let mut rng = StdRng::seed_from_u64(p.seed ^ ((rep as u64) << 32) ^ t as u64);
            let mut done = 0u64;
            while clock.writing() {
                let id = rng.gen_range(0..p.records.max(1)) as i64;
                let stamp = epoch.elapsed().as_nanos() as i64;
                coll.update_one(
                    doc! {"_id": id},
                    doc! {"$set": {"t": stamp}, "$inc": {"v": 1_i64}},
                )?;
                done += 1;
                clock.count();
            }
            Ok(done)
        }),
        (n, |_, clock| -> Result<StreamStats> {
            let mut s = StreamStats {
                events: 0,
                lag: Latencies::new(),
                lost: 0,
            };
            let mut pos = start;
            // Until the updaters stop (`reading(1)`: at least one pass made).
            while clock.reading(1) {
                let seen = engine.change_seq();
                let b = match engine.read_changes(&scope, pos, FETCH) {
                    Ok(b) => b,
                    Err(e) if e.code() == 286 => {
                        s.lost += 1;
                        pos = engine.open_change_stream();
                        continue;
                    }
                    Err(e) => return Err(e.into()),
                };
                pos = b.position;
                let caught_up = b.events.len() < FETCH;
                if p.reader_pause_ms > 0 && caught_up {
                    std::thread::sleep(Duration::from_millis(p.reader_pause_ms));
                } else if b.events.is_empty() {
                    engine.wait_for_changes(seen, WAIT);
                    continue;
                }
                let now = epoch.elapsed().as_nanos() as i64;
                for e in &b.events {
                    s.events += 1;
                    if let ChangeKind::Update { doc, .. } = &e.kind {
                        if let Ok(t) = doc.get_i64("t") {
                            s.lag
                                .record(Duration::from_nanos(now.saturating_sub(t).max(0) as u64));
                        }
                    }
                }
            }
            Ok(s)
        }),
    )?;
    let updates: u64 = run.writers.iter().sum();
    let rate = updates as f64 / run.wall_s.max(1e-9);
    let c = case(&[("streams", &n.to_string())]);
    col.add(TARGET, &c, "updates_per_s", rate);
    if n > 0 {
        let events: u64 = run.readers.iter().map(|s| s.events).sum();
        let mut lag = Latencies::new();
        for s in &run.readers {
            lag.merge(&s.lag);
        }
        let lost: u64 = run.readers.iter().map(|s| s.lost).sum();
        col.add(
            TARGET,
            &c,
            "events_per_s",
            events as f64 / run.wall_s.max(1e-9),
        );
        col.add(
            TARGET,
            &c,
            "events_per_s_per_stream",
            events as f64 / n as f64 / run.wall_s.max(1e-9),
        );
        col.add(TARGET, &c, "lag_us_p50", lag.quantile_us(0.5));
        col.add(TARGET, &c, "lag_us_p99", lag.quantile_us(0.99));
        col.add(TARGET, &c, "history_lost", lost as f64);
        if lost > 0 {
            notes.push(format!(
                "{n} streams, run {}: streams fell more than the 64 MiB change tail behind {lost} times (in memory: no WAL to read from) and restarted at the present",
                rep + 1
            ));
        }
        note(
            quiet,
            &format!(
                "[changes] {n} streams: {:.0} updates/s, {:.0} events/s delivered, lag p50 {:.0} µs p99 {:.0} µs",
                rate,
                events as f64 / run.wall_s.max(1e-9),
                lag.quantile_us(0.5),
                lag.quantile_us(0.99)
            ),
        );
    } else {
        note(quiet, &format!("[changes] no stream: {rate:.0} updates/s"));
    }
    Ok(rate)
}
