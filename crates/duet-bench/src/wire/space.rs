//! `duet bench space --targets wire`: the embedded `space` cells (distribution
//! × concurrent queries × system) against a duetdb server, every operation a
//! driver call on a [`Lane`] of its own thread:
//! - load: `insertMany` of the same documents (`htap_doc`);
//! - updates: `update` commands (`$set` of a payload unique in the run);
//! - queries: `olcp` / `vls` = `count` with `$duet: {snapshot, workNsPerDoc}`;
//!   `cow-steam` = `createSnapshot` → `count` with `$duet: {snapshotName,
//!   workNsPerDoc}` → `dropSnapshot` (the named snapshot is what the query holds);
//! - old versions from `serverStatus.duet.databases[WIRE_DB].vls` every
//!   `sample_ms` (`olcpInflight` for olcp, `remsetEntries`/`remsetBytes` for
//!   vls) and, for cow-steam, the sum of `listSnapshots`'
//!   `retainedDocs`/`retainedBytes` of the query snapshots every
//!   `retained_every_ms`; `si-model` is counted from the update stream, as in
//!   the embedded run.
//!
//! Figures and series carry the same names as the embedded run
//! (`workload::space::record_cell`), under the wire target's label.
//!
//! Needs duetdb: `$duet.workNsPerDoc` and the named-snapshot commands are its own.
//! Invariant: every snapshot a query creates is dropped before its thread
//! ends, whatever the count did (otherwise it would pin versions for the
//! cells that follow); leftovers of an interrupted run are dropped at load.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};
use mongodb::bson::{doc, Bson, Document};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use super::{count_of, Lane, WireSpec, WireTarget};
use crate::gen::ScrambledZipfian;
use crate::progress::note;
use crate::result::{case, Collector, Series};
use crate::stats::Latencies;
use crate::target::{htap_doc, htap_payload, VPerm};
use crate::workload::space::{
    join_cell_threads, record_cell, CellOut, Joined, KeyDist, Params, Sample, System, SPACE_TABLE,
};

/// Documents per `insertMany` while loading (as the embedded run).
const LOAD_BATCH: usize = 10_000;

/// Named snapshots of the cow-steam queries start with this.
const SNAP_PREFIX: &str = "bench-space-";

const MIB: f64 = 1024.0 * 1024.0;

/// The query threads' view, shared with the sampler.
struct Shared {
    /// Updates acknowledged so far (the SI model's clock).
    updates: AtomicU64,
    /// Updates that changed nothing (must stay 0: each makes no version).
    noops: AtomicU64,
    /// Per query thread: `updates` when its running query started, or u64::MAX.
    query_since: Vec<AtomicU64>,
}

/// `serverStatus.duet.databases[WIRE_DB].vls` field `k` (0 when absent).
fn vls_field(v: &Document, k: &str) -> f64 {
    match v.get(k) {
        Some(Bson::Int64(n)) => *n as f64,
        Some(Bson::Int32(n)) => f64::from(*n),
        Some(Bson::Double(n)) => *n,
        _ => 0.0,
    }
}

fn vls_now(w: &WireTarget) -> Result<Document> {
    w.vls_status()?
        .ok_or_else(|| anyhow!("serverStatus reports no vls section for the bench database"))
}

/// (docs, bytes) retained by the query snapshots, from `listSnapshots`.
fn retained(lane: &Lane) -> Result<(f64, f64)> {
    let r = lane.command(doc! {"listSnapshots": 1})?;
    let list = r.get_array("snapshots").context("listSnapshots reply")?;
    let (mut docs, mut bytes) = (0.0, 0.0);
    for s in list {
        if let Bson::Document(s) = s {
            if s.get_str("name").is_ok_and(|n| n.starts_with(SNAP_PREFIX)) {
                docs += vls_field(s, "retainedDocs");
                bytes += vls_field(s, "retainedBytes");
            }
        }
    }
    Ok((docs, bytes))
}

/// Drop every query snapshot (leftovers of an interrupted run).
fn drop_query_snapshots(lane: &Lane) -> Result<()> {
    let r = lane.command(doc! {"listSnapshots": 1})?;
    for s in r
        .get_array("snapshots")
        .map(|a| a.to_vec())
        .unwrap_or_default()
    {
        if let Bson::Document(s) = s {
            if let Ok(n) = s.get_str("name") {
                if n.starts_with(SNAP_PREFIX) {
                    lane.command(doc! {"dropSnapshot": n})?;
                }
            }
        }
    }
    Ok(())
}

/// Load `records` documents over the wire; returns the document size.
fn load(w: &WireTarget, records: u64) -> Result<u64> {
    let lane = w.lane()?;
    drop_query_snapshots(&lane)?;
    let coll = lane.collection(SPACE_TABLE);
    lane.block_on(coll.drop())?;
    let perm = VPerm::new(records);
    let mut batch = Vec::with_capacity(LOAD_BATCH);
    for i in 0..records {
        batch.push(htap_doc(i, &perm));
        if batch.len() == LOAD_BATCH {
            lane.block_on(coll.insert_many(std::mem::take(&mut batch)))?;
        }
    }
    if !batch.is_empty() {
        lane.block_on(coll.insert_many(batch))?;
    }
    Ok(duetdb::raw::to_raw_document(&htap_doc(records / 2, &perm))
        .map_or(240, |b| b.as_bytes().len() as u64))
}

/// One full-collection query over the wire; returns the documents it counted.
fn run_query(lane: &Lane, system: System, ns: u64, t: usize) -> Result<u64> {
    let count = |duet: Document| -> Result<u64> {
        count_of(&lane.command(doc! {"count": SPACE_TABLE, "query": {}, "$duet": duet})?)
    };
    let ns = ns.min(i64::MAX as u64) as i64;
    match system {
        System::Olcp | System::Vls => count(doc! {"snapshot": system.name(), "workNsPerDoc": ns}),
        System::CowSteam => {
            let name = format!("{SNAP_PREFIX}{t}");
            lane.command(doc! {"createSnapshot": &name})?;
            let n = count(doc! {"snapshotName": &name, "workNsPerDoc": ns});
            let dropped = lane.command(doc! {"dropSnapshot": &name});
            let n = n?;
            dropped?;
            Ok(n)
        }
    }
}

#[allow(clippy::too_many_arguments)]
fn run_cell(
    w: &WireTarget,
    p: &Params,
    system: System,
    dist: KeyDist,
    k: usize,
    doc_bytes: u64,
    seed: u64,
    cell_no: u64,
    quiet: bool,
) -> Result<CellOut> {
    let shared = Shared {
        updates: AtomicU64::new(0),
        noops: AtomicU64::new(0),
        query_since: (0..k).map(|_| AtomicU64::new(u64::MAX)).collect(),
    };
    let queries_running = AtomicU64::new(k as u64);
    let done = AtomicBool::new(false);
    let watch_done = AtomicBool::new(false);
    let threads = p.update_threads.max(1);
    // Every lane of the cell is connected before the clock starts.
    let mut lanes = (0..threads + k + 1)
        .map(|_| w.lane())
        .collect::<Result<Vec<_>>>()?;
    let sampler_lane = lanes.pop().ok_or_else(|| anyhow!("no sampler lane"))?;
    let query_lanes: Vec<_> = lanes.drain(threads..).collect();
    let update_lanes = lanes;
    if let Some(db) = w
        .spawned()
        .and_then(|s| s.engine())
        .and_then(|e| e.database(super::WIRE_DB).ok())
    {
        db.reset_vls_peaks();
    }
    let started = Instant::now();
    let deadline = started + Duration::from_secs_f64(p.seconds);
    let interval =
        (p.update_rate > 0).then(|| Duration::from_secs_f64(threads as f64 / p.update_rate as f64));
    let mib = |b: f64| b / MIB;
    std::thread::scope(|s| -> Result<CellOut> {
        let updaters: Vec<_> = update_lanes
            .into_iter()
            .enumerate()
            .map(|(t, lane)| {
                let (shared, queries_running) = (&shared, &queries_running);
                s.spawn(move || -> Result<(u64, Latencies)> {
                    let coll = lane.collection(SPACE_TABLE);
                    let mut rng = StdRng::seed_from_u64(seed ^ (t as u64) << 8);
                    let mut zipf = ScrambledZipfian::new(0, p.records.max(1) - 1);
                    let mut lat = Latencies::new();
                    let mut n = 0u64;
                    let mut next_at = Instant::now();
                    while Instant::now() < deadline || queries_running.load(Ordering::Acquire) > 0 {
                        if let Some(iv) = interval {
                            let now = Instant::now();
                            if next_at > now {
                                std::thread::sleep(next_at - now);
                            }
                            next_at += iv;
                        }
                        let id = match dist {
                            KeyDist::Uniform => rng.gen_range(0..p.records.max(1)),
                            KeyDist::Zipfian => zipf.next(&mut rng),
                        };
                        // Unique per update of the run (see the embedded run).
                        let payload = htap_payload(
                            cell_no << 40 | (n * threads as u64 + t as u64) & ((1 << 40) - 1),
                        );
                        let t0 = Instant::now();
                        let r =
                            lane.block_on(coll.update_one(
                                doc! {"_id": id as i64},
                                doc! {"$set": {"f2": payload}},
                            ))?;
                        lat.record(t0.elapsed());
                        anyhow::ensure!(r.matched_count == 1, "document {id} missing");
                        if r.modified_count == 0 {
                            shared.noops.fetch_add(1, Ordering::Relaxed);
                        }
                        n += 1;
                        shared.updates.fetch_add(1, Ordering::AcqRel);
                    }
                    Ok((n, lat))
                })
            })
            .collect();
        let queriers: Vec<_> = query_lanes
            .into_iter()
            .enumerate()
            .map(|(t, lane)| {
                let (shared, queries_running) = (&shared, &queries_running);
                s.spawn(move || -> Result<(Vec<f64>, u64)> {
                    let mut durations = Vec::new();
                    let mut docs = 0;
                    let r = (|| -> Result<()> {
                        while durations.is_empty() || Instant::now() < deadline {
                            shared.query_since[t]
                                .store(shared.updates.load(Ordering::Acquire), Ordering::Release);
                            let t0 = Instant::now();
                            docs += run_query(&lane, system, p.work_ns_per_doc, t)?;
                            durations.push(t0.elapsed().as_secs_f64());
                            shared.query_since[t].store(u64::MAX, Ordering::Release);
                        }
                        Ok(())
                    })();
                    queries_running.fetch_sub(1, Ordering::AcqRel);
                    r.map(|_| (durations, docs))
                })
            })
            .collect();
        let sampler = s.spawn(|| -> Result<CellOut> {
            let lane = sampler_lane;
            let mut main: Vec<Sample> = Vec::new();
            let mut si: Vec<Sample> = Vec::new();
            let mut rss_peak = 0f64;
            let mut last_walk: Option<Instant> = None;
            while !done.load(Ordering::Acquire) {
                std::thread::sleep(Duration::from_millis(p.sample_ms.max(10)));
                let t = started.elapsed().as_secs_f64();
                if w.spawned().is_some() {
                    rss_peak = rss_peak.max(crate::machine::rss_mb());
                }
                match system {
                    System::Olcp => {
                        let n = vls_field(&vls_now(w)?, "olcpInflight");
                        main.push((t, n, mib(n * doc_bytes as f64)));
                    }
                    System::Vls => {
                        let v = vls_now(w)?;
                        main.push((
                            t,
                            vls_field(&v, "remsetEntries"),
                            mib(vls_field(&v, "remsetBytes")),
                        ));
                    }
                    System::CowSteam => {
                        let now = shared.updates.load(Ordering::Acquire);
                        let oldest = shared
                            .query_since
                            .iter()
                            .map(|a| a.load(Ordering::Acquire))
                            .min()
                            .unwrap_or(u64::MAX);
                        let n = if oldest == u64::MAX {
                            0.0
                        } else {
                            now.saturating_sub(oldest) as f64
                        };
                        si.push((t, n, mib(n * doc_bytes as f64)));
                        let due = last_walk.is_none_or(|l| {
                            l.elapsed() >= Duration::from_millis(p.retained_every_ms)
                        });
                        if due {
                            last_walk = Some(Instant::now());
                            let (docs, bytes) = retained(&lane)?;
                            main.push((t, docs, mib(bytes)));
                        }
                    }
                }
            }
            let mut samples = vec![(system.name().to_string(), main)];
            if system == System::CowSteam {
                samples.push(("si-model".to_string(), si));
            }
            Ok(CellOut {
                update_ops: 0,
                update_lat: Latencies::new(),
                wall_s: 0.0,
                query_s: Vec::new(),
                query_docs: 0,
                samples,
                rss_mb_peak: rss_peak,
                propagated: 0,
                update_noops: 0,
            })
        });
        let label = format!(
            "space {} {} {} Q={k}",
            w.label(),
            system.name(),
            dist.name()
        );
        let ops_view = &shared.updates;
        let (watch_done, queries_running) = (&watch_done, &queries_running);
        s.spawn(move || {
            while !(Instant::now() >= deadline && queries_running.load(Ordering::Acquire) == 0) {
                std::thread::sleep(Duration::from_millis(50));
            }
            watch_done.store(true, Ordering::Release);
        });
        crate::progress::watch(&label, p.seconds, None, ops_view, watch_done, quiet, "upd");
        let (joined, first_err) = join_cell_threads(queriers, updaters)?;
        let Joined {
            query_s,
            query_docs,
            update_ops,
            update_lat,
        } = joined;
        let wall_s = started.elapsed().as_secs_f64();
        done.store(true, Ordering::Release);
        let out = sampler.join().map_err(|_| anyhow!("sampler panicked"))?;
        if let Some(e) = first_err {
            return Err(e);
        }
        let mut out = out?;
        out.update_ops = update_ops;
        out.update_lat = update_lat;
        out.wall_s = wall_s;
        out.query_s = query_s;
        out.query_docs = query_docs;
        out.update_noops = shared.noops.load(Ordering::Relaxed);
        Ok(out)
    })
}

/// Run every cell over the wire, `p.repeat` times.
pub fn run(
    spec: &WireSpec,
    p: &Params,
    quiet: bool,
    col: &mut Collector,
    series: &mut Vec<Series>,
    notes: &mut Vec<String>,
) -> Result<()> {
    let w = WireTarget::connect(spec)?;
    if !w.is_duet() {
        bail!(
            "space over the wire needs duetdb ($duet.workNsPerDoc, named snapshots, serverStatus.duet); the server at the wire URI is MongoDB {} without a `duet` serverStatus section",
            w.facts().version
        );
    }
    notes.push(w.description());
    let target = w.label();
    note(
        quiet,
        &format!("[space] {target}: loading {} documents", p.records),
    );
    let t0 = Instant::now();
    let doc_bytes = load(&w, p.records)?;
    col.add(
        &target,
        &case(&[("phase", "load")]),
        "load_docs_per_s",
        p.records as f64 / t0.elapsed().as_secs_f64().max(1e-9),
    );
    notes.push(format!(
        "{target}: every operation over the wire; queries are `count` commands with `$duet.workNsPerDoc` = {} (the server busy-waits per document); \
         olcp reads serverStatus olcpInflight, vls remsetEntries/remsetBytes (every {} ms); cow-steam holds a named snapshot per query \
         (createSnapshot → count with snapshotName → dropSnapshot) and sums listSnapshots' retainedDocs/retainedBytes every {} ms; \
         si-model is counted from the acknowledged updates",
        p.work_ns_per_doc, p.sample_ms, p.retained_every_ms
    ));
    let mut cell_no = 0u64;
    for rep in 0..p.repeat.max(1) {
        for &dist in &p.dists {
            for &k in &p.queries {
                for &system in &p.systems {
                    let before = vls_field(&vls_now(&w)?, "olcpPropagated") as u64;
                    let seed = p.seed ^ (rep as u64) << 40 ^ (k as u64) << 24;
                    cell_no += 1;
                    let cell = run_cell(&w, p, system, dist, k, doc_bytes, seed, cell_no, quiet)?;
                    // Let background resets finish and the remset drain.
                    let drain = Instant::now() + Duration::from_secs(10);
                    let after = loop {
                        let v = vls_now(&w)?;
                        let idle = vls_field(&v, "scansActive") == 0.0
                            && vls_field(&v, "remsetEntries") == 0.0;
                        if idle || Instant::now() >= drain {
                            break v;
                        }
                        std::thread::sleep(Duration::from_millis(20));
                    };
                    let propagated =
                        (vls_field(&after, "olcpPropagated") as u64).saturating_sub(before);
                    record_cell(
                        &target, rep, system, dist, k, &cell, propagated, quiet, col, series, notes,
                    );
                }
            }
        }
    }
    let lane = w.lane()?;
    drop_query_snapshots(&lane)?;
    lane.block_on(lane.collection(SPACE_TABLE).drop())?;
    Ok(())
}
