//! `duet bench snapshot --targets wire`: named-snapshot costs over the wire,
//! at the same data sizes as the embedded run (AnKer's Table 1 as a client
//! sees it):
//! - `createSnapshot` and `dropSnapshot` round trips vs data size, beside a
//!   `ping` round trip (the floor any command pays on this connection);
//! - an update right after `createSnapshot` (its path still shared, so it is
//!   copied) vs with no snapshot held;
//! - what a held named snapshot retains after k % of the data was rewritten,
//!   as the server reports it (`listSnapshots.retainedBytes/Docs`, an exact
//!   walk of what only the snapshot still references).
//!
//! Needs duetdb: the named-snapshot commands are duetdb's own.

use std::time::Instant;

use anyhow::{bail, Context, Result};
use mongodb::bson::{doc, Bson, Document};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use super::{Lane, WireSpec, WireTarget};
use crate::progress::note;
use crate::result::{case, Collector};
use crate::stats::Latencies;
use crate::target::{htap_doc, htap_payload, VPerm};
use crate::workload::snapshot::Params;

/// The collection the snapshot workload loads over the wire.
pub const SNAPSHOT_TABLE: &str = "snapshot";

/// Round trips timed per command kind at each size.
const ROUND_TRIPS: usize = 200;

/// Bytes of one loaded document (≈240), as the embedded run counts them.
fn doc_bytes() -> u64 {
    duetdb::raw::to_raw_document(&htap_doc(1, &VPerm::new(2)))
        .map_or(240, |b| b.as_bytes().len() as u64)
}

fn time(t: &Lane, lat: &mut Latencies, cmd: Document) -> Result<Document> {
    let t0 = Instant::now();
    let r = t.command(cmd)?;
    lat.record(t0.elapsed());
    Ok(r)
}

/// `listSnapshots` figures of snapshot `name`: (retainedBytes, retainedDocs).
fn retained(t: &Lane, name: &str) -> Result<(f64, f64)> {
    let r = t.command(doc! {"listSnapshots": 1})?;
    let list = r.get_array("snapshots").context("listSnapshots reply")?;
    for s in list {
        if let Bson::Document(s) = s {
            if s.get_str("name").ok() == Some(name) {
                let n = |k: &str| s.get_i64(k).map_or(0.0, |v| v as f64);
                return Ok((n("retainedBytes"), n("retainedDocs")));
            }
        }
    }
    bail!("snapshot {name} missing from listSnapshots")
}

pub fn run(
    spec: &WireSpec,
    p: &Params,
    quiet: bool,
    col: &mut Collector,
    notes: &mut Vec<String>,
) -> Result<()> {
    let w = WireTarget::connect(spec)?;
    if !w.is_duet() {
        bail!(
            "snapshot over the wire needs duetdb's createSnapshot/dropSnapshot/listSnapshots; the server at the wire URI is MongoDB {} without a `duet` serverStatus section",
            w.facts().version
        );
    }
    notes.push(w.description());
    let name = w.label();
    // One connection does everything, as one client would.
    let t = w.lane()?;
    let target = name.as_str();
    let coll = t.database().collection::<Document>(SNAPSHOT_TABLE);
    let per_doc = doc_bytes();
    let mut sizes = p.sizes_mb.clone();
    sizes.sort_unstable();
    let records_max = sizes.last().copied().unwrap_or(0) * 1024 * 1024 / per_doc;
    let perm = VPerm::new(records_max.max(2));
    for rep in 0..p.repeat.max(1) {
        t.block_on(coll.drop())?;
        // Leftovers of an interrupted run would pin old versions.
        for s in t
            .command(doc! {"listSnapshots": 1})?
            .get_array("snapshots")
            .map(|a| a.to_vec())
            .unwrap_or_default()
        {
            if let Bson::Document(s) = s {
                if let Ok(n) = s.get_str("name") {
                    if n.starts_with("bench-") {
                        t.command(doc! {"dropSnapshot": n})?;
                    }
                }
            }
        }
        let mut loaded = 0u64;
        let mut rng = StdRng::seed_from_u64(p.seed ^ rep as u64);
        for &mb in &sizes {
            let records = mb * 1024 * 1024 / per_doc;
            note(
                quiet,
                &format!(
                    "[snapshot] {target}: loading to {mb} MiB ({records} documents, run {}/{})",
                    rep + 1,
                    p.repeat
                ),
            );
            while loaded < records {
                let end = (loaded + 10_000).min(records);
                let docs: Vec<Document> = (loaded..end).map(|i| htap_doc(i, &perm)).collect();
                t.block_on(coll.insert_many(docs))?;
                loaded = end;
            }
            let size = mb.to_string();
            let c = |what: &str| case(&[("data_mb", &size), ("what", what)]);
            let stats = t.command(doc! {"collStats": SNAPSHOT_TABLE})?;
            let data_bytes = stats.get_i64("size").map_or(0.0, |n| n as f64);
            col.add(target, &c("loaded"), "data_mb", data_bytes / 1048576.0);

            let (mut ping, mut create, mut drop) =
                (Latencies::new(), Latencies::new(), Latencies::new());
            for i in 0..ROUND_TRIPS {
                time(&t, &mut ping, doc! {"ping": 1})?;
                let n = format!("bench-rt-{i}");
                time(&t, &mut create, doc! {"createSnapshot": &n})?;
                time(&t, &mut drop, doc! {"dropSnapshot": &n})?;
            }
            for (metric, l) in [
                ("ping_us", &ping),
                ("create_snapshot_us", &create),
                ("drop_snapshot_us", &drop),
            ] {
                col.add(
                    target,
                    &c("create"),
                    &format!("{metric}_median"),
                    l.quantile_us(0.5),
                );
                col.add(
                    target,
                    &c("create"),
                    &format!("{metric}_p99"),
                    l.quantile_us(0.99),
                );
            }

            // First write to a shared path vs an unshared one.
            let (mut with, mut without) = (Latencies::new(), Latencies::new());
            for i in 0..p.first_writes {
                let payload = htap_payload(i as u64);
                t.command(doc! {"createSnapshot": "bench-fw"})?;
                let id = rng.gen_range(0..records.max(1)) as i64;
                let t0 = Instant::now();
                t.block_on(coll.update_one(doc! {"_id": id}, doc! {"$set": {"f2": &payload}}))?;
                with.record(t0.elapsed());
                t.command(doc! {"dropSnapshot": "bench-fw"})?;
                let id = rng.gen_range(0..records.max(1)) as i64;
                let t0 = Instant::now();
                t.block_on(coll.update_one(doc! {"_id": id}, doc! {"$set": {"f2": &payload}}))?;
                without.record(t0.elapsed());
            }
            for (what, l) in [
                ("update_after_snapshot", &with),
                ("update_no_snapshot", &without),
            ] {
                col.add(target, &c(what), "latency_us_p50", l.quantile_us(0.5));
                col.add(target, &c(what), "latency_us_p99", l.quantile_us(0.99));
            }

            // What a held named snapshot keeps while k % of the data is rewritten.
            for &pct in &p.rewrite_pct {
                let n = records * pct / 100;
                let what = format!("rewrite_{pct}pct");
                t.command(doc! {"createSnapshot": "bench-held"})?;
                // A payload no earlier write used: a `$set` to the current
                // value makes no new version and would retain nothing.
                let payload =
                    htap_payload(1_000_000_000 + mb * 1_000_000 + pct * 1000 + rep as u64);
                let mut lo = 0u64;
                while lo < n {
                    let hi = (lo + 1000).min(n);
                    t.block_on(coll.update_many(
                        doc! {"_id": {"$gte": lo as i64, "$lt": hi as i64}},
                        doc! {"$set": {"f2": &payload}},
                    ))?;
                    lo = hi;
                }
                let (bytes, docs) = retained(&t, "bench-held")?;
                t.command(doc! {"dropSnapshot": "bench-held"})?;
                col.add(target, &c(&what), "retained_mb", bytes / 1048576.0);
                col.add(target, &c(&what), "retained_docs", docs);
                col.add(
                    target,
                    &c(&what),
                    "rewritten_mb",
                    n as f64 * per_doc as f64 / 1048576.0,
                );
                if docs as u64 != n {
                    notes.push(format!(
                        "{target} {mb} MiB, {pct} % rewritten: the held snapshot retains {docs} documents, {n} were rewritten"
                    ));
                }
            }
            note(
                quiet,
                &format!(
                    "[snapshot] {target} {mb} MiB: createSnapshot {:.0} µs, dropSnapshot {:.0} µs, ping {:.0} µs (medians)",
                    create.quantile_us(0.5),
                    drop.quantile_us(0.5),
                    ping.quantile_us(0.5)
                ),
            );
        }
    }
    t.block_on(coll.drop())?;
    Ok(())
}
