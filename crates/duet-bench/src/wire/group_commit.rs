//! `duet bench group-commit`: N clients × `insert_one` with `j: true` over
//! the wire, against a durable server, for each N asked: throughput, latency
//! and how many WAL fsyncs each acknowledged write cost (from
//! `serverStatus.duet.databases[].wal.fsyncs` and `.writer.groups`, read
//! before and after each run). One fsync serving many connections' writes
//! shows as fsyncs per write well below 1.
//!
//! Invariants: every client thread has its own connection (a lane, opened
//! before the clock starts); each run starts on an empty collection; the
//! counters are deltas over the measured window only (the load of the
//! previous run is not counted); the run is bounded by `seconds`.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Barrier;
use std::time::{Duration, Instant};

use anyhow::{anyhow, Context, Result};
use hdrhistogram::Histogram;
use mongodb::bson::{doc, Bson, Document};
use mongodb::options::{CollectionOptions, WriteConcern};

use super::{WireSpec, WireTarget, WIRE_DB};

/// The collection the clients insert into.
const COLL: &str = "group_commit";

/// One measured run.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Row {
    pub clients: usize,
    pub inserts: u64,
    pub seconds: f64,
    pub inserts_per_sec: f64,
    pub fsyncs: u64,
    pub fsyncs_per_write: f64,
    pub groups: u64,
    pub p50_us: u64,
    pub p99_us: u64,
}

/// WAL fsyncs and writer groups of [`WIRE_DB`] so far.
fn counters(t: &WireTarget) -> Result<(u64, u64)> {
    let lane = t.lane()?;
    let status = lane.admin_command(doc! {"serverStatus": 1})?;
    let dbs = status
        .get_document("duet")
        .and_then(|d| d.get_array("databases"))
        .map_err(|_| anyhow!("serverStatus has no duet.databases: not a duetdb server"))?;
    let db = dbs
        .iter()
        .find_map(|d| match d {
            Bson::Document(d) if d.get_str("name").ok() == Some(WIRE_DB) => Some(d),
            _ => None,
        })
        .ok_or_else(|| anyhow!("serverStatus does not list {WIRE_DB}"))?;
    let n = |d: &Document, k: &str| match d.get(k) {
        Some(Bson::Int64(v)) => *v as u64,
        Some(Bson::Int32(v)) => *v as u64,
        _ => 0,
    };
    let fsyncs = db
        .get_document("wal")
        .map(|w| n(w, "fsyncs"))
        .map_err(|_| anyhow!("{WIRE_DB} has no WAL: the server is not durable"))?;
    let groups = db
        .get_document("writer")
        .map(|w| n(w, "groups"))
        .unwrap_or(0);
    Ok((fsyncs, groups))
}

/// Run `clients` threads inserting with `j: true` for `seconds`.
fn one(t: &WireTarget, clients: usize, seconds: f64) -> Result<Row> {
    t.command(doc! {"drop": COLL}).ok();
    t.command(doc! {"create": COLL})?;
    let lanes = (0..clients)
        .map(|_| t.lane())
        .collect::<Result<Vec<_>>>()
        .context("opening one connection per client")?;
    let stop = AtomicBool::new(false);
    let total = AtomicU64::new(0);
    let start = Barrier::new(clients + 1);
    let wc = WriteConcern::builder().journal(true).build();
    let (before, window, hists) = std::thread::scope(|s| -> Result<_> {
        let handles: Vec<_> = lanes
            .iter()
            .enumerate()
            .map(|(id, lane)| {
                let (stop, total, start, wc) = (&stop, &total, &start, wc.clone());
                s.spawn(move || -> Result<Histogram<u64>> {
                    let coll = lane.database().collection_with_options::<Document>(
                        COLL,
                        CollectionOptions::builder().write_concern(wc).build(),
                    );
                    let mut h = Histogram::<u64>::new(3)?;
                    let mut i = 0u64;
                    start.wait();
                    while !stop.load(Ordering::Relaxed) {
                        let t0 = Instant::now();
                        lane.block_on(coll.insert_one(doc! {"c": id as i64, "i": i as i64}))?;
                        h.record(t0.elapsed().as_micros() as u64)?;
                        i += 1;
                    }
                    total.fetch_add(i, Ordering::Relaxed);
                    Ok(h)
                })
            })
            .collect();
        let before = counters(t)?;
        start.wait();
        let t0 = Instant::now();
        std::thread::sleep(Duration::from_secs_f64(seconds));
        stop.store(true, Ordering::Relaxed);
        let mut hists = Vec::new();
        for h in handles {
            hists.push(
                h.join()
                    .map_err(|_| anyhow!("a client thread panicked"))??,
            );
        }
        Ok((before, t0.elapsed(), hists))
    })?;
    drop(lanes);
    let after = counters(t)?;
    let mut all = Histogram::<u64>::new(3)?;
    for h in &hists {
        all.add(h)?;
    }
    let inserts = total.load(Ordering::Relaxed);
    let fsyncs = after.0.saturating_sub(before.0);
    let secs = window.as_secs_f64();
    Ok(Row {
        clients,
        inserts,
        seconds: secs,
        inserts_per_sec: inserts as f64 / secs,
        fsyncs,
        fsyncs_per_write: fsyncs as f64 / inserts.max(1) as f64,
        groups: after.1.saturating_sub(before.1),
        p50_us: all.value_at_quantile(0.5),
        p99_us: all.value_at_quantile(0.99),
    })
}

/// Every run, one per client count, on one server; a Markdown table.
pub fn run(uri: &str, clients: &[usize], seconds: f64) -> Result<(Vec<Row>, String)> {
    let spec = WireSpec::parse(uri);
    let t = WireTarget::connect(&spec)?;
    let mut rows = Vec::new();
    for &n in clients {
        rows.push(one(&t, n.max(1), seconds)?);
    }
    let mut md = format!(
        "Server: {}\n\n| clients | inserts/s | p50 µs | p99 µs | fsyncs | fsyncs per write | writes per group |\n|---:|---:|---:|---:|---:|---:|---:|\n",
        t.description()
    );
    for r in &rows {
        md.push_str(&format!(
            "| {} | {:.0} | {} | {} | {} | {:.3} | {:.1} |\n",
            r.clients,
            r.inserts_per_sec,
            r.p50_us,
            r.p99_us,
            r.fsyncs,
            r.fsyncs_per_write,
            r.inserts as f64 / r.groups.max(1) as f64,
        ));
    }
    Ok((rows, md))
}
