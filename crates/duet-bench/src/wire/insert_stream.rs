//! A timed stream of single-document inserts, one client thread per lane:
//! what `group-commit` (journaled writes from many clients) and
//! `replication` (write concerns on a replica set) both measure.
//!
//! Every thread opens its collection handle and waits at a barrier, so the
//! window starts only once all are ready and ends when the stop flag is
//! seen; an insert in flight at the stop still completes and is counted.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Barrier;
use std::time::{Duration, Instant};

use anyhow::{anyhow, Result};
use hdrhistogram::Histogram;
use mongodb::bson::Document;
use mongodb::options::{CollectionOptions, WriteConcern};

use super::Lane;

/// What [`run`] measured.
pub struct InsertStream<T> {
    pub inserts: u64,
    pub window: Duration,
    /// Every insert's latency, all lanes together, microseconds.
    pub latency: Histogram<u64>,
    /// What `at_start` returned.
    pub at_start: T,
}

/// One thread per lane inserts `doc(lane, i)` (i = 0, 1, …) one at a time
/// into `coll` with write concern `wc`, for `seconds`. `at_start` runs once
/// every thread is ready, just before the window opens (a counter sample,
/// say).
pub fn run<T>(
    lanes: &[&Lane],
    coll: &str,
    wc: &WriteConcern,
    seconds: f64,
    doc: impl Fn(usize, u64) -> Document + Sync,
    at_start: impl FnOnce() -> Result<T>,
) -> Result<InsertStream<T>> {
    let stop = AtomicBool::new(false);
    let total = AtomicU64::new(0);
    let start = Barrier::new(lanes.len() + 1);
    let (at_start, window, hists) = std::thread::scope(|s| -> Result<_> {
        let handles: Vec<_> = lanes
            .iter()
            .enumerate()
            .map(|(n, lane)| {
                let (stop, total, start, doc) = (&stop, &total, &start, &doc);
                s.spawn(move || -> Result<Histogram<u64>> {
                    let coll = lane.database().collection_with_options::<Document>(
                        coll,
                        CollectionOptions::builder()
                            .write_concern(wc.clone())
                            .build(),
                    );
                    let mut h = Histogram::<u64>::new(3)?;
                    let mut i = 0u64;
                    start.wait();
                    while !stop.load(Ordering::Relaxed) {
                        let t0 = Instant::now();
                        lane.block_on(coll.insert_one(doc(n, i)))?;
                        h.record(t0.elapsed().as_micros() as u64)?;
                        i += 1;
                    }
                    total.fetch_add(i, Ordering::Relaxed);
                    Ok(h)
                })
            })
            .collect();
        // Sampled before the barrier: a failure here must not leave the
        // threads waiting, so they are released either way.
        let sampled = at_start();
        start.wait();
        let t0 = Instant::now();
        if sampled.is_ok() {
            std::thread::sleep(Duration::from_secs_f64(seconds));
        }
        stop.store(true, Ordering::Relaxed);
        let mut hists = Vec::new();
        for h in handles {
            hists.push(
                h.join()
                    .map_err(|_| anyhow!("an insert thread panicked"))??,
            );
        }
        Ok((sampled?, t0.elapsed(), hists))
    })?;
    let mut latency = Histogram::<u64>::new(3)?;
    for h in &hists {
        latency.add(h)?;
    }
    Ok(InsertStream {
        inserts: total.load(Ordering::Relaxed),
        window,
        latency,
        at_start,
    })
}
