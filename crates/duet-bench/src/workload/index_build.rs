//! `duet bench index-build` (issue #18 item 9): building an index on a large
//! collection inside the writer (foreground, the old path, forced) vs
//! outside it (background: snapshot scan, catch-up, short publish), while
//! one updater thread updates random documents at full speed, through the
//! engine API in process (in memory).
//!
//! Per mode, in one run: the updater runs alone for `warmup` seconds (its
//! throughput then is the baseline), the build starts, and the updates
//! acknowledged while it runs give the writer's throughput during the build;
//! `ratio` = during / baseline (1.0: the build costs the writer nothing; a
//! foreground build is near 0: every write waits for it). Also the build's
//! wall time and the longest update latency during it. Each update sets the
//! indexed field too, so the background build has writes to catch up with.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Result;
use bson::doc;
use duetdb::{Database, IndexBuildMode, IndexBuildOptions};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde::Serialize;

/// One mode's figures.
#[derive(Debug, Clone, Serialize)]
pub struct Row {
    pub mode: &'static str,
    pub records: u64,
    pub build_secs: f64,
    /// Updates/s of the updater alone just before the build.
    pub baseline_ups: f64,
    /// Updates/s acknowledged while the build ran.
    pub during_ups: f64,
    pub ratio: f64,
    /// Longest single update that overlapped the build (ms).
    pub max_update_ms: f64,
}

/// Run both modes on one loaded collection; returns the rows and a
/// Markdown table.
pub fn run(records: u64, warmup: f64, seed: u64) -> Result<(Vec<Row>, String)> {
    let db = Database::in_memory();
    let c = db.collection("ib");
    let mut rng = StdRng::seed_from_u64(seed);
    let n = records.max(1);
    let mut start = 0u64;
    while start < n {
        let end = (start + 10_000).min(n);
        let docs: Vec<bson::Document> = (start..end)
            .map(|i| doc! {"_id": i as i64, "a": rng.gen_range(0..1_000_000i64), "n": 0i64, "pad": "x".repeat(32)})
            .collect();
        c.insert_many(docs, false)?;
        start = end;
    }
    let mut rows = Vec::new();
    for (mode, build_mode) in [
        ("foreground", IndexBuildMode::Foreground),
        ("background", IndexBuildMode::Background),
    ] {
        let stop = Arc::new(AtomicBool::new(false));
        let updater = {
            let c = c.clone();
            let stop = stop.clone();
            let seed = rng.gen::<u64>();
            std::thread::spawn(move || -> Result<Vec<(Instant, Duration)>> {
                let mut rng = StdRng::seed_from_u64(seed);
                let mut acks = Vec::new();
                while !stop.load(Ordering::Relaxed) {
                    let id = rng.gen_range(0..n) as i64;
                    let t = Instant::now();
                    c.update_one(
                        doc! {"_id": id},
                        doc! {"$set": {"a": rng.gen_range(0..1_000_000i64)}, "$inc": {"n": 1i64}},
                    )?;
                    acks.push((Instant::now(), t.elapsed()));
                }
                Ok(acks)
            })
        };
        let warm_start = Instant::now();
        std::thread::sleep(Duration::from_secs_f64(warmup));
        let build_start = Instant::now();
        let options = IndexBuildOptions {
            mode: build_mode,
            ..Default::default()
        };
        let built = c.create_index_spec_with(&doc! {"key": {"a": 1}}, &options);
        let build_end = Instant::now();
        stop.store(true, Ordering::Relaxed);
        let acks = updater
            .join()
            .map_err(|_| anyhow::anyhow!("updater panicked"))??;
        built?;
        c.drop_index("a_1")?;
        let before = acks
            .iter()
            .filter(|(t, _)| *t >= warm_start && *t < build_start)
            .count();
        let during: Vec<&(Instant, Duration)> = acks
            .iter()
            .filter(|(t, _)| *t >= build_start && *t <= build_end)
            .collect();
        let build_secs = (build_end - build_start).as_secs_f64();
        let baseline_ups = before as f64 / (build_start - warm_start).as_secs_f64();
        let during_ups = during.len() as f64 / build_secs.max(1e-9);
        // Updates whose call overlapped the build (a blocked one is
        // acknowledged only after the build returns).
        let max_update_ms = acks
            .iter()
            .filter(|(t, d)| *t > build_start && *t - *d < build_end)
            .map(|(_, d)| d.as_secs_f64() * 1e3)
            .fold(0.0, f64::max);
        rows.push(Row {
            mode,
            records: n,
            build_secs,
            baseline_ups,
            during_ups,
            ratio: during_ups / baseline_ups.max(1e-9),
            max_update_ms,
        });
    }
    let mut md = String::from(
        "| mode | records | build (s) | updates/s before | updates/s during | ratio | max update (ms) |\n|---|---:|---:|---:|---:|---:|---:|\n",
    );
    for r in &rows {
        md.push_str(&format!(
            "| {} | {} | {:.2} | {:.0} | {:.0} | {:.3} | {:.1} |\n",
            r.mode, r.records, r.build_secs, r.baseline_ups, r.during_ups, r.ratio, r.max_update_ms
        ));
    }
    Ok((rows, md))
}
