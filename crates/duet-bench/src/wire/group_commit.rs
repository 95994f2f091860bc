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

use anyhow::{anyhow, Context, Result};
use mongodb::bson::{doc, Bson, Document};
use mongodb::options::WriteConcern;

use super::{insert_stream, WireSpec, WireTarget, WIRE_DB};

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
    let wc = WriteConcern::builder().journal(true).build();
    let stream = insert_stream::run(
        &lanes.iter().map(|l| &**l).collect::<Vec<_>>(),
        COLL,
        &wc,
        seconds,
        |c, i| doc! {"c": c as i64, "i": i as i64},
        || counters(t),
    )?;
    drop(lanes);
    let after = counters(t)?;
    let (before, all) = (stream.at_start, stream.latency);
    let window = stream.window;
    let inserts = stream.inserts;
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
