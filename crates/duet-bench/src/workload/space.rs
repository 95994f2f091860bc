//! `space`: old versions kept over time under a 100 %-update stream while 1 or
//! 3 long full-collection queries run — KVell+'s Fig. 4 / Table 1 and the VLS
//! paper's Fig. 11, side by side in one run on the embedded engine.
//!
//! Systems compared (each a cell per key distribution × concurrent queries):
//! - `olcp`: `Database::olcp_query`; old versions = versions handed to running
//!   queries and not yet mapped (`vls_stats().olcp_inflight`); bytes are that
//!   count × the document size (the sink holds shared pointers to documents).
//! - `vls`: full scans under `Strategy::Vls`; old versions = remset entries,
//!   bytes = the remset's own byte figure.
//! - `cow-steam`: each query holds `db.snapshot()` and reads it. duetdb's
//!   copy-on-write frees a superseded version as soon as no held root reaches
//!   it, so each snapshot keeps at most one old version per document — the
//!   Steam property (one version per active snapshot, not per update). Measured
//!   with `Snapshot::retained(&latest)` (an O(size) walk, so sampled only every
//!   `retained_every_ms`); with several queries the per-snapshot figures are
//!   summed, which counts a version shared by two snapshots twice (upper bound).
//! - `si-model`: conventional snapshot isolation with version chains and a
//!   garbage-collection horizon keeps every version superseded since the oldest
//!   running query started. It is not a second engine: it is counted from the
//!   update stream of the `cow-steam` cell (updates committed since the oldest
//!   running query began × document size), which is what such a system keeps
//!   at best (lazy GC only adds to it).
//!
//! Queries are slowed by `work_ns_per_doc` of busy work per document so that
//! they last several seconds, as in the paper. Each cell writes its old-version
//! samples as a series (`BenchResult::series`) for the chart.

use std::ops::ControlFlow;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use anyhow::{anyhow, Result};
use bson::{doc, Document};
use duetdb::{Database, OlcpOptions, Snapshot, Strategy};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use crate::gen::ScrambledZipfian;
use crate::progress::note;
use crate::result::{case, Collector, Series};
use crate::stats::{median, Latencies};
use crate::target::{htap_doc, htap_payload, VPerm};

pub const SPACE_TABLE: &str = "space";
const TARGET: &str = "duetdb-embedded";

/// Update key distribution.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum KeyDist {
    Uniform,
    Zipfian,
}

impl KeyDist {
    pub fn name(self) -> &'static str {
        match self {
            KeyDist::Uniform => "uniform",
            KeyDist::Zipfian => "zipfian",
        }
    }
}

/// A system under comparison (`si-model` comes with `cow-steam`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum System {
    Olcp,
    Vls,
    /// Held snapshots (Steam-like), plus the counted `si-model`.
    CowSteam,
}

impl System {
    pub fn name(self) -> &'static str {
        match self {
            System::Olcp => "olcp",
            System::Vls => "vls",
            System::CowSteam => "cow-steam",
        }
    }
}

#[derive(Debug, Clone, serde::Serialize)]
pub struct Params {
    pub records: u64,
    pub seconds: f64,
    pub update_threads: usize,
    /// Attempted updates per second over all update threads; 0 = as fast as possible.
    pub update_rate: u64,
    pub dists: Vec<KeyDist>,
    pub queries: Vec<usize>,
    pub systems: Vec<System>,
    pub work_ns_per_doc: u64,
    pub sample_ms: u64,
    pub retained_every_ms: u64,
    pub seed: u64,
    pub repeat: usize,
}

/// The query threads' view, shared with the sampler.
struct Shared {
    /// Updates committed so far (the SI model's clock).
    updates: AtomicU64,
    /// Updates that changed nothing (must stay 0: each makes no version).
    noops: AtomicU64,
    /// Per query thread: `updates` when its running query started, or u64::MAX.
    query_since: Vec<AtomicU64>,
    /// Per query thread: the snapshot its running `cow` query holds.
    held: Vec<Mutex<Option<Snapshot>>>,
}

/// One sample: (seconds since the cell started, old versions, old MiB).
pub(crate) type Sample = (f64, f64, f64);

/// What one cell measured (embedded or over the wire).
pub(crate) struct CellOut {
    pub(crate) update_ops: u64,
    pub(crate) update_lat: Latencies,
    pub(crate) wall_s: f64,
    pub(crate) query_s: Vec<f64>,
    pub(crate) query_docs: u64,
    /// (system label, samples).
    pub(crate) samples: Vec<(String, Vec<Sample>)>,
    pub(crate) rss_mb_peak: f64,
    /// Embedded: the engine's running olcp propagation total at the cell's end.
    pub(crate) propagated: u64,
    pub(crate) update_noops: u64,
}

/// Busy work standing in for a real per-document computation.
fn work(d: &bson::RawDocumentBuf, ns: u64) -> u64 {
    let mut h = d.as_bytes().len() as u64;
    if ns > 0 {
        let t0 = Instant::now();
        while t0.elapsed().as_nanos() < ns as u128 {
            h = h.wrapping_mul(31).wrapping_add(7);
        }
    }
    h
}

/// Load `records` HTAP documents (~240 bytes each); returns the document size.
pub fn load(db: &Database, records: u64) -> Result<u64> {
    db.drop_collection(SPACE_TABLE)?;
    let coll = db.collection(SPACE_TABLE);
    let perm = VPerm::new(records);
    let mut batch = Vec::with_capacity(10_000);
    for i in 0..records {
        batch.push(htap_doc(i, &perm));
        if batch.len() == 10_000 {
            coll.insert_many(std::mem::take(&mut batch), true)?;
        }
    }
    if !batch.is_empty() {
        coll.insert_many(batch, true)?;
    }
    let bytes = duetdb::raw::to_raw_document(&htap_doc(records / 2, &perm))
        .map_or(240, |b| b.as_bytes().len() as u64);
    Ok(bytes)
}

/// One full-collection query; returns the documents it visited.
fn run_query(db: &Database, system: System, ns: u64, shared: &Shared, t: usize) -> Result<u64> {
    match system {
        System::Olcp => {
            let (acc, _) = db.olcp_query(
                SPACE_TABLE,
                &[],
                &[],
                || (0u64, 0u64),
                |s, d, _| {
                    s.0 += 1;
                    s.1 = s.1.wrapping_add(work(d, ns));
                    Ok(())
                },
                |a, b| (a.0 + b.0, a.1.wrapping_add(b.1)),
                OlcpOptions { threads: 1 },
            )?;
            std::hint::black_box(acc.1);
            Ok(acc.0)
        }
        System::Vls => {
            let (mut n, mut h) = (0u64, 0u64);
            db.collection(SPACE_TABLE)
                .scan_with(Document::new(), Strategy::Vls, |d| {
                    n += 1;
                    h = h.wrapping_add(work(d, ns));
                    ControlFlow::Continue(())
                })?;
            std::hint::black_box(h);
            Ok(n)
        }
        System::CowSteam => {
            let snap = db.snapshot();
            let slot = shared
                .held
                .get(t)
                .ok_or_else(|| anyhow!("no slot for query thread {t}"))?;
            *slot.lock().map_err(|_| anyhow!("held poisoned"))? = Some(snap.clone());
            let docs = snap.collection(SPACE_TABLE).find(doc! {}).raw();
            let (mut n, mut h) = (0u64, 0u64);
            let r = docs.map(|docs| {
                for d in &docs {
                    n += 1;
                    h = h.wrapping_add(work(d, ns));
                }
            });
            *slot.lock().map_err(|_| anyhow!("held poisoned"))? = None;
            r?;
            std::hint::black_box(h);
            Ok(n)
        }
    }
}

#[allow(clippy::too_many_arguments)]
fn run_cell(
    db: &Database,
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
        held: (0..k).map(|_| Mutex::new(None)).collect(),
    };
    let queries_running = AtomicU64::new(k as u64);
    let done = AtomicBool::new(false);
    let watch_done = AtomicBool::new(false);
    let coll = db.collection(SPACE_TABLE);
    db.reset_vls_peaks();
    let started = Instant::now();
    let deadline = started + Duration::from_secs_f64(p.seconds);
    let threads = p.update_threads.max(1);
    let interval =
        (p.update_rate > 0).then(|| Duration::from_secs_f64(threads as f64 / p.update_rate as f64));
    let mib = |b: f64| b / (1024.0 * 1024.0);
    std::thread::scope(|s| -> Result<CellOut> {
        let updaters: Vec<_> = (0..threads)
            .map(|t| {
                let (shared, queries_running, coll) = (&shared, &queries_running, &coll);
                s.spawn(move || -> Result<(u64, Latencies)> {
                    let mut rng = StdRng::seed_from_u64(seed ^ (t as u64) << 8);
                    let mut zipf = ScrambledZipfian::new(0, p.records.max(1) - 1);
                    let mut lat = Latencies::new();
                    let mut n = 0u64;
                    let mut next_at = Instant::now();
                    // Updates run until the deadline and every query has ended.
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
                        // Unique per update of the whole run: a `$set` to the value a
                        // document already has is a no-op (no new version), and cells
                        // replaying an earlier cell's stream would otherwise keep fewer
                        // versions.
                        let payload = htap_payload(
                            cell_no << 40 | (n * threads as u64 + t as u64) & ((1 << 40) - 1),
                        );
                        let t0 = Instant::now();
                        let r = coll
                            .update_one(doc! {"_id": id as i64}, doc! {"$set": {"f2": payload}})?;
                        lat.record(t0.elapsed());
                        anyhow::ensure!(r.matched == 1, "document {id} missing");
                        if r.modified == 0 {
                            shared.noops.fetch_add(1, Ordering::Relaxed);
                        }
                        n += 1;
                        shared.updates.fetch_add(1, Ordering::AcqRel);
                    }
                    Ok((n, lat))
                })
            })
            .collect();
        let queriers: Vec<_> = (0..k)
            .map(|t| {
                let (shared, queries_running) = (&shared, &queries_running);
                s.spawn(move || -> Result<(Vec<f64>, u64)> {
                    let mut durations = Vec::new();
                    let mut docs = 0;
                    let r = (|| -> Result<()> {
                        while durations.is_empty() || Instant::now() < deadline {
                            shared.query_since[t]
                                .store(shared.updates.load(Ordering::Acquire), Ordering::Release);
                            let t0 = Instant::now();
                            docs += run_query(db, system, p.work_ns_per_doc, shared, t)?;
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
            let mut main: Vec<Sample> = Vec::new();
            let mut si: Vec<Sample> = Vec::new();
            let mut rss_peak = 0f64;
            let mut last_walk: Option<Instant> = None;
            while !done.load(Ordering::Acquire) {
                std::thread::sleep(Duration::from_millis(p.sample_ms.max(10)));
                let t = started.elapsed().as_secs_f64();
                rss_peak = rss_peak.max(crate::machine::rss_mb());
                match system {
                    System::Olcp => {
                        let n = db.vls_stats().olcp_inflight as f64;
                        main.push((t, n, mib(n * doc_bytes as f64)));
                    }
                    System::Vls => {
                        let r = db.vls_stats().remset;
                        main.push((t, r.entries as f64, mib(r.bytes as f64)));
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
                        let due = last_walk.is_none_or(|w| {
                            w.elapsed() >= Duration::from_millis(p.retained_every_ms)
                        });
                        if due {
                            last_walk = Some(Instant::now());
                            let held: Vec<Snapshot> = shared
                                .held
                                .iter()
                                .filter_map(|m| m.lock().ok().and_then(|g| g.clone()))
                                .collect();
                            let latest = db.snapshot();
                            let (mut docs, mut bytes) = (0u64, 0u64);
                            for h in &held {
                                let c = h.retained(&latest);
                                docs += c.docs;
                                bytes += c.bytes;
                            }
                            main.push((t, docs as f64, mib(bytes as f64)));
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
        let label = format!("space {} {} Q={k}", system.name(), dist.name());
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
        let mut out = sampler.join().map_err(|_| anyhow!("sampler panicked"))??;
        if let Some(e) = first_err {
            return Err(e);
        }
        out.update_ops = update_ops;
        out.update_lat = update_lat;
        out.wall_s = wall_s;
        out.query_s = query_s;
        out.query_docs = query_docs;
        out.propagated = db.vls_stats().olcp_propagated;
        out.update_noops = shared.noops.load(Ordering::Relaxed);
        Ok(out)
    })
}

/// What the threads of one cell measured, once joined.
pub(crate) struct Joined {
    pub query_s: Vec<f64>,
    pub query_docs: u64,
    pub update_ops: u64,
    pub update_lat: Latencies,
}

type QueryOut = Result<(Vec<f64>, u64)>;
type UpdateOut = Result<(u64, Latencies)>;

/// Join a cell's query and update threads (embedded and wire cells alike):
/// their figures, and the first error any of them returned. A panicked
/// thread is an error at once.
pub(crate) fn join_cell_threads<'s>(
    queriers: Vec<std::thread::ScopedJoinHandle<'s, QueryOut>>,
    updaters: Vec<std::thread::ScopedJoinHandle<'s, UpdateOut>>,
) -> Result<(Joined, Option<anyhow::Error>)> {
    let mut first_err = None;
    let mut out = Joined {
        query_s: Vec::new(),
        query_docs: 0,
        update_ops: 0,
        update_lat: Latencies::new(),
    };
    for h in queriers {
        match h.join().map_err(|_| anyhow!("query thread panicked"))? {
            Ok((d, n)) => {
                out.query_s.extend(d);
                out.query_docs += n;
            }
            Err(e) => first_err = first_err.or(Some(e)),
        }
    }
    for h in updaters {
        match h.join().map_err(|_| anyhow!("update thread panicked"))? {
            Ok((n, l)) => {
                out.update_ops += n;
                out.update_lat.merge(&l);
            }
            Err(e) => first_err = first_err.or(Some(e)),
        }
    }
    Ok((out, first_err))
}

/// Run every cell (distribution × queries × system), `p.repeat` times.
pub fn run(
    p: &Params,
    quiet: bool,
    col: &mut Collector,
    series: &mut Vec<Series>,
    notes: &mut Vec<String>,
) -> Result<()> {
    let db = Database::in_memory();
    note(quiet, &format!("[space] loading {} documents", p.records));
    let t0 = Instant::now();
    let doc_bytes = load(&db, p.records)?;
    col.add(
        TARGET,
        &case(&[("phase", "load")]),
        "load_docs_per_s",
        p.records as f64 / t0.elapsed().as_secs_f64().max(1e-9),
    );
    notes.push(format!(
        "documents of {doc_bytes} bytes; queries do {} ns of busy work per document; \
         olcp and si-model bytes = old versions × document size; cow-steam sums the \
         retained cost of each held snapshot (sampled every {} ms; shared versions count \
         once per snapshot); si-model is counted, not run (see the module doc of workload/space.rs)",
        p.work_ns_per_doc, p.retained_every_ms
    ));
    let mut cell_no = 0u64;
    for rep in 0..p.repeat.max(1) {
        for &dist in &p.dists {
            for &k in &p.queries {
                for &system in &p.systems {
                    let before = db.vls_stats().olcp_propagated;
                    // The same keys for every system of a (rep, dist, k); payloads
                    // are unique per cell.
                    let seed = p.seed ^ (rep as u64) << 40 ^ (k as u64) << 24;
                    cell_no += 1;
                    let cell = run_cell(&db, p, system, dist, k, doc_bytes, seed, cell_no, quiet)?;
                    // Let background resets finish and the remset drain.
                    duetdb::testing::wait_for(
                        || {
                            let v = db.vls_stats();
                            v.scans_active == 0 && v.remset.entries == 0
                        },
                        Duration::from_secs(10),
                    );
                    let propagated = cell.propagated.saturating_sub(before);
                    record_cell(
                        TARGET, rep, system, dist, k, &cell, propagated, quiet, col, series, notes,
                    );
                }
            }
        }
    }
    Ok(())
}

/// Record one cell's figures and series under `target` (shared by the
/// embedded run and the wire run, so both produce the same names).
/// `propagated` is the olcp propagations of this cell alone.
#[allow(clippy::too_many_arguments)]
pub(crate) fn record_cell(
    target: &str,
    rep: usize,
    system: System,
    dist: KeyDist,
    k: usize,
    cell: &CellOut,
    propagated: u64,
    quiet: bool,
    col: &mut Collector,
    series: &mut Vec<Series>,
    notes: &mut Vec<String>,
) {
    if cell.update_noops > 0 {
        notes.push(format!(
            "{target} {} {} Q={k}: {} updates changed nothing (no version made)",
            system.name(),
            dist.name(),
            cell.update_noops
        ));
    }
    let ks = k.to_string();
    let upd_s = cell.update_ops as f64 / cell.wall_s.max(1e-9);
    let q_total_s: f64 = cell.query_s.iter().sum();
    for (label, pts) in &cell.samples {
        let c = case(&[("system", label), ("dist", dist.name()), ("queries", &ks)]);
        let peak_n = pts.iter().map(|x| x.1).fold(0.0, f64::max);
        let peak_mb = pts.iter().map(|x| x.2).fold(0.0, f64::max);
        col.add(target, &c, "old_versions_peak", peak_n);
        col.add(target, &c, "old_mb_peak", peak_mb);
        col.add(
            target,
            &c,
            "old_versions_mean",
            pts.iter().map(|x| x.1).sum::<f64>() / pts.len().max(1) as f64,
        );
        if label == "si-model" {
            continue;
        }
        col.add(
            target,
            &c,
            "query_docs_per_s",
            cell.query_docs as f64 / q_total_s.max(1e-9),
        );
        col.add(target, &c, "queries_done", cell.query_s.len() as f64);
        col.add(target, &c, "query_s_median", median(&cell.query_s));
        col.add(target, &c, "update_ops_per_s", upd_s);
        col.add(
            target,
            &c,
            "update_latency_us_p99",
            cell.update_lat.quantile_us(0.99),
        );
        col.add(
            target,
            &c,
            "update_latency_us_max",
            cell.update_lat.max_us(),
        );
        col.add(target, &c, "rss_mb_peak", cell.rss_mb_peak);
        if system == System::Olcp {
            col.add(target, &c, "olcp_propagated", propagated as f64);
        }
        if rep == 0 {
            series.push(Series {
                target: target.into(),
                case: c.clone(),
                metric: "old_versions".into(),
                points: pts.iter().map(|x| [x.0, x.1]).collect(),
            });
        }
    }
    if system == System::CowSteam && rep == 0 {
        if let Some((_, pts)) = cell.samples.iter().find(|(l, _)| l == "si-model") {
            series.push(Series {
                target: target.into(),
                case: case(&[
                    ("system", "si-model"),
                    ("dist", dist.name()),
                    ("queries", &ks),
                ]),
                metric: "old_versions".into(),
                points: pts.iter().map(|x| [x.0, x.1]).collect(),
            });
        }
    }
    let peak = cell
        .samples
        .first()
        .map_or(0.0, |(_, p)| p.iter().map(|x| x.1).fold(0.0, f64::max));
    note(
        quiet,
        &format!(
            "[space] {target} {} {} Q={k}: peak old versions {peak:.0}, {:.0} upd/s, p99 {:.0} µs, max {:.0} µs, {} queries, {:.0} docs/s",
            system.name(),
            dist.name(),
            upd_s,
            cell.update_lat.quantile_us(0.99),
            cell.update_lat.max_us(),
            cell.query_s.len(),
            cell.query_docs as f64 / q_total_s.max(1e-9)
        ),
    );
}
