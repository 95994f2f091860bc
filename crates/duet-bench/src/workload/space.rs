//! `space`: old versions kept over time under a 100 %-update stream while 1 or
//! 3 long full-collection queries run — KVell+'s Fig. 4 / Table 1 and the VLS
//! paper's Fig. 11, side by side in one run, on every target that has
//! duetdb's old versions (the embedded engine; a duetdb server over the wire).
//!
//! Systems compared (each a cell per key distribution × concurrent queries):
//! - `olcp`: OLCP queries; old versions = versions handed to running queries
//!   and not yet mapped (`olcp_inflight`); bytes are that count × the
//!   document size (the sink holds shared pointers to documents).
//! - `vls`: full scans under `Strategy::Vls`; old versions = remset entries,
//!   bytes = the remset's own byte figure.
//! - `cow` (called `cow-steam` before `steam` existed; the old name is still
//!   accepted): each query holds a duetdb snapshot (a copy-on-write root) and
//!   reads it. The engine frees a superseded version as soon as no held root
//!   reaches it, so the documents retained are Steam's (at most one old
//!   version per document per held snapshot), but a held root also keeps the
//!   heap and index pages it shares no more with the latest version. Measured
//!   as what the held snapshots retain (an O(size) walk, so sampled only every
//!   `retained_every_ms`); with several queries the per-snapshot figures are
//!   summed, which counts a version two snapshots share twice (an upper bound).
//! - `steam`: KVell+'s Steam baseline, implemented in the bench
//!   (`workload::steam`): version chains beside the target's latest state,
//!   at most one version per document per active snapshot, deleted on the
//!   document's next update and swept when a query ends once no snapshot sees
//!   it; a version snapshots share counts once. Exact counters, sampled every
//!   `sample_ms`.
//! - `si-model`: conventional snapshot isolation with version chains and a
//!   garbage-collection horizon keeps every version superseded since the oldest
//!   running query started. It is not a second engine: it is counted from the
//!   update stream of the `steam` cell (of the `cow` cell when `steam` does not
//!   run): updates acknowledged since the oldest running query began ×
//!   document size, which is what such a system keeps at best (lazy GC only
//!   adds to it).
//!
//! Queries are slowed by `work_ns_per_doc` of busy work per document so that
//! they last several seconds, as in the paper. Each cell writes its old-version
//! samples as a series (`BenchResult::series`) for the chart. How a target
//! runs the queries and reads its old versions is its own (`SpaceTarget`);
//! every session of a cell is opened before the cell's clock starts.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{anyhow, Result};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use crate::gen::ScrambledZipfian;
use crate::progress::note;
use crate::result::{case, Series, Sink};
use crate::stats::{median, Latencies};
use crate::targets::{htap_payload, SpaceSession, SpaceTarget, VlsFigures};
use crate::workload::steam::Steam;
use crate::workload::{join_all, Pacer};

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

/// A system under comparison (`si-model` comes with `steam`, else with `cow`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum System {
    Olcp,
    Vls,
    /// duetdb's held copy-on-write snapshots (Steam's documents plus pages).
    #[value(alias = "cow-steam")]
    Cow,
    /// The bench's Steam (`workload::steam`).
    Steam,
}

impl System {
    pub fn name(self) -> &'static str {
        match self {
            System::Olcp => "olcp",
            System::Vls => "vls",
            System::Cow => "cow",
            System::Steam => "steam",
        }
    }

    /// Whether this system's cells also count the `si-model` (one system of a
    /// run does, so its rows are not recorded twice).
    fn counts_si_model(self, systems: &[System]) -> bool {
        let with = if systems.contains(&System::Steam) {
            System::Steam
        } else {
            System::Cow
        };
        self == with
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

/// What the threads of a cell share with each other and the sampler.
struct Shared {
    /// Updates acknowledged so far (the SI model's clock).
    updates: AtomicU64,
    /// Updates that changed nothing (must stay 0: each makes no version).
    noops: AtomicU64,
    /// Per query thread: `updates` when its running query started, or u64::MAX.
    query_since: Vec<AtomicU64>,
    /// Query threads still running (updates go on until the last has ended).
    queries_running: AtomicU64,
    /// The old versions of a `steam` cell.
    steam: Option<Steam>,
}

impl Shared {
    fn new(k: usize, steam: Option<Steam>) -> Shared {
        Shared {
            updates: AtomicU64::new(0),
            noops: AtomicU64::new(0),
            query_since: (0..k).map(|_| AtomicU64::new(u64::MAX)).collect(),
            queries_running: AtomicU64::new(k as u64),
            steam,
        }
    }

    /// Versions the SI model keeps now: updates since the oldest running
    /// query started.
    fn si_model_versions(&self) -> f64 {
        let now = self.updates.load(Ordering::Acquire);
        let oldest = self
            .query_since
            .iter()
            .map(|a| a.load(Ordering::Acquire))
            .min()
            .unwrap_or(u64::MAX);
        if oldest == u64::MAX {
            0.0
        } else {
            now.saturating_sub(oldest) as f64
        }
    }
}

/// One sample: (seconds since the cell started, old versions, old MiB).
type Sample = (f64, f64, f64);

/// A cell's samples per system label, and its peak RSS (0 when unknown).
type Sampled = (Vec<(String, Vec<Sample>)>, f64);

/// Which cell runs, and the clock it runs on.
struct Cell {
    system: System,
    dist: KeyDist,
    /// Concurrent queries.
    k: usize,
    doc_bytes: u64,
    /// The same keys for every system of a (rep, dist, k).
    seed: u64,
    /// Makes every payload of the run unique.
    cell_no: u64,
}

/// What one cell measured.
struct CellOut {
    update_ops: u64,
    update_lat: Latencies,
    wall_s: f64,
    query_s: Vec<f64>,
    query_docs: u64,
    /// (system label, samples).
    samples: Vec<(String, Vec<Sample>)>,
    rss_mb_peak: f64,
    update_noops: u64,
    /// `steam`: the longest sweep after a query (ms).
    steam_sweep_ms_max: Option<f64>,
}

const MIB: f64 = 1024.0 * 1024.0;
/// How long after a cell the engine may take to end its scans and drain the remset.
const DRAIN: Duration = Duration::from_secs(10);

/// Run every cell (distribution × queries × system) `p.repeat` times on
/// every target.
pub fn run(targets: &[&dyn SpaceTarget], p: &Params, quiet: bool, out: &mut Sink) -> Result<()> {
    for &target in targets {
        run_target(target, p, quiet, out)?;
    }
    Ok(())
}

fn run_target(target: &dyn SpaceTarget, p: &Params, quiet: bool, out: &mut Sink) -> Result<()> {
    let name = target.name();
    note(
        quiet,
        &format!("[space] {name}: loading {} documents", p.records),
    );
    let t0 = Instant::now();
    let doc_bytes = target.load(p.records)?;
    out.col.add(
        &name,
        &case(&[("phase", "load")]),
        "load_docs_per_s",
        p.records as f64 / t0.elapsed().as_secs_f64().max(1e-9),
    );
    out.notes.push(format!(
        "{name}: documents of {doc_bytes} bytes; olcp and si-model bytes = old versions × document size; \
         si-model is counted from the acknowledged updates, not run (see the module doc of workload/space.rs)"
    ));
    out.notes
        .push(target.space_notes(p.work_ns_per_doc, p.sample_ms, p.retained_every_ms));
    if p.systems.contains(&System::Steam) {
        out.notes.push(format!(
            "{name}: steam is the bench's own Steam (workload/steam.rs) over this target's latest state: \
             updates copy the replaced version out (a point read) when an active query snapshot sees it, \
             queries scan the latest state (strategy none) and read newer documents from the kept copies, \
             busy work ({} ns per document) runs in the bench process; old versions = kept copies, bytes = \
             their document bytes (exact, every {} ms); steam_sweep_ms_max = the longest cleaning after a query",
            p.work_ns_per_doc, p.sample_ms
        ));
    }
    // Reads the engine's figures between cells.
    let mut between = target.session()?;
    let mut cell_no = 0u64;
    for rep in 0..p.repeat.max(1) {
        for &dist in &p.dists {
            for &k in &p.queries {
                for &system in &p.systems {
                    let before = between.vls()?.olcp_propagated;
                    cell_no += 1;
                    let cell = Cell {
                        system,
                        dist,
                        k,
                        doc_bytes,
                        seed: p.seed ^ (rep as u64) << 40 ^ (k as u64) << 24,
                        cell_no,
                    };
                    let measured = run_cell(target, p, &cell, quiet)?;
                    let after = drain(between.as_mut())?;
                    let propagated = after.olcp_propagated.saturating_sub(before);
                    record_cell(&name, rep, &cell, &measured, propagated, quiet, out);
                }
            }
        }
    }
    drop(between);
    target.finish()
}

/// Let background resets finish and the remset drain (up to [`DRAIN`]);
/// the engine's figures then.
fn drain(s: &mut dyn SpaceSession) -> Result<VlsFigures> {
    let until = Instant::now() + DRAIN;
    loop {
        let v = s.vls()?;
        let idle = v.scans_active == 0.0 && v.remset_entries == 0.0;
        if idle || Instant::now() >= until {
            return Ok(v);
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn run_cell(target: &dyn SpaceTarget, p: &Params, cell: &Cell, quiet: bool) -> Result<CellOut> {
    let threads = p.update_threads.max(1);
    // Every session of the cell is open (connected) before the clock starts.
    let mut updaters = (0..threads + cell.k + 1)
        .map(|_| target.session())
        .collect::<Result<Vec<_>>>()?;
    let sampler = updaters
        .pop()
        .ok_or_else(|| anyhow!("no sampler session"))?;
    let queriers = updaters.split_off(threads);
    let steam = (cell.system == System::Steam).then(|| Steam::new(p.records.max(1)));
    let shared = Shared::new(cell.k, steam);
    let done = AtomicBool::new(false);
    target.begin_cell();
    let started = Instant::now();
    let deadline = started + Duration::from_secs_f64(p.seconds);
    std::thread::scope(|s| -> Result<CellOut> {
        let shared = &shared;
        let updaters: Vec<_> = updaters
            .into_iter()
            .enumerate()
            .map(|(t, sess)| s.spawn(move || update_loop(sess, t, p, cell, shared, deadline)))
            .collect();
        let queriers: Vec<_> = queriers
            .into_iter()
            .enumerate()
            .map(|(t, sess)| s.spawn(move || query_loop(sess, t, p, cell.system, shared, deadline)))
            .collect();
        let done = &done;
        let sampler = s.spawn(move || sample_loop(sampler, target, p, cell, shared, started, done));
        let label = format!(
            "space {} {} {} Q={}",
            target.name(),
            cell.system.name(),
            cell.dist.name(),
            cell.k
        );
        crate::progress::watch_while(&label, p.seconds, &shared.updates, quiet, "upd", || {
            Instant::now() < deadline || shared.queries_running.load(Ordering::Acquire) > 0
        });
        let (joined, first_err) = join_cell_threads(queriers, updaters)?;
        let wall_s = started.elapsed().as_secs_f64();
        done.store(true, Ordering::Release);
        let sampled = sampler.join().map_err(|_| anyhow!("sampler panicked"))?;
        if let Some(e) = first_err {
            return Err(e);
        }
        let (samples, rss_mb_peak) = sampled?;
        Ok(CellOut {
            update_ops: joined.update_ops,
            update_lat: joined.update_lat,
            wall_s,
            query_s: joined.query_s,
            query_docs: joined.query_docs,
            samples,
            rss_mb_peak,
            update_noops: shared.noops.load(Ordering::Relaxed),
            steam_sweep_ms_max: shared.steam.as_ref().map(Steam::sweep_ms_max),
        })
    })
}

/// One update thread: until the deadline and the last query has ended.
fn update_loop(
    mut sess: Box<dyn SpaceSession + '_>,
    t: usize,
    p: &Params,
    cell: &Cell,
    shared: &Shared,
    deadline: Instant,
) -> Result<(u64, Latencies)> {
    let threads = p.update_threads.max(1) as u64;
    let mut pacer = Pacer::new(p.update_rate, p.update_threads);
    let mut rng = StdRng::seed_from_u64(cell.seed ^ (t as u64) << 8);
    let mut zipf = ScrambledZipfian::new(0, p.records.max(1) - 1);
    let mut lat = Latencies::new();
    let mut n = 0u64;
    while Instant::now() < deadline || shared.queries_running.load(Ordering::Acquire) > 0 {
        pacer.wait();
        let id = match cell.dist {
            KeyDist::Uniform => rng.gen_range(0..p.records.max(1)),
            KeyDist::Zipfian => zipf.next(&mut rng),
        };
        // Unique per update of the whole run: a `$set` to the value a
        // document already has is a no-op (no new version), and cells
        // replaying an earlier cell's stream would otherwise keep fewer
        // versions.
        let payload = htap_payload(cell.cell_no << 40 | (n * threads + t as u64) & ((1 << 40) - 1));
        let t0 = Instant::now();
        let changed = match &shared.steam {
            Some(steam) => steam.update(sess.as_mut(), id, &payload)?.0,
            None => sess.update(id, &payload)?,
        };
        lat.record(t0.elapsed());
        if !changed {
            shared.noops.fetch_add(1, Ordering::Relaxed);
        }
        n += 1;
        shared.updates.fetch_add(1, Ordering::AcqRel);
    }
    Ok((n, lat))
}

/// One query thread: queries until the deadline (at least one).
fn query_loop(
    mut sess: Box<dyn SpaceSession + '_>,
    t: usize,
    p: &Params,
    system: System,
    shared: &Shared,
    deadline: Instant,
) -> Result<(Vec<f64>, u64)> {
    let ns = p.work_ns_per_doc;
    let mut durations = Vec::new();
    let mut docs = 0;
    let r = (|| -> Result<()> {
        while durations.is_empty() || Instant::now() < deadline {
            shared.query_since[t].store(shared.updates.load(Ordering::Acquire), Ordering::Release);
            let t0 = Instant::now();
            docs += match system {
                System::Olcp => sess.olcp_query(ns)?,
                System::Vls => sess.vls_query(ns)?,
                System::Cow => sess.held_query(ns, t)?,
                System::Steam => {
                    let steam = shared
                        .steam
                        .as_ref()
                        .ok_or_else(|| anyhow!("a steam cell without its version store"))?;
                    let mut h = 0u64;
                    let (n, _) = steam.query(sess.as_mut(), &mut |_, d| {
                        h = h.wrapping_add(busy_work(d, ns));
                    })?;
                    std::hint::black_box(h);
                    n
                }
            };
            durations.push(t0.elapsed().as_secs_f64());
            shared.query_since[t].store(u64::MAX, Ordering::Release);
        }
        Ok(())
    })();
    // Whatever happened, the update threads must not wait for this one.
    shared.queries_running.fetch_sub(1, Ordering::AcqRel);
    r.map(|_| (durations, docs))
}

/// The sampler: old versions every `sample_ms` until `done`; the samples per
/// system label and the peak RSS (0 when the target cannot tell).
fn sample_loop(
    mut sess: Box<dyn SpaceSession + '_>,
    target: &dyn SpaceTarget,
    p: &Params,
    cell: &Cell,
    shared: &Shared,
    started: Instant,
    done: &AtomicBool,
) -> Result<Sampled> {
    let mib = |n: f64| n / MIB;
    let per_doc = cell.doc_bytes as f64;
    let (mut main, mut si) = (Vec::new(), Vec::new());
    let counts_si = cell.system.counts_si_model(&p.systems);
    let mut rss_peak = 0f64;
    let mut last_walk: Option<Instant> = None;
    while !done.load(Ordering::Acquire) {
        std::thread::sleep(Duration::from_millis(p.sample_ms.max(10)));
        let t = started.elapsed().as_secs_f64();
        if let Some(rss) = target.rss_mb() {
            rss_peak = rss_peak.max(rss);
        }
        match cell.system {
            System::Olcp => {
                let n = sess.vls()?.olcp_inflight;
                main.push((t, n, mib(n * per_doc)));
            }
            System::Vls => {
                let v = sess.vls()?;
                main.push((t, v.remset_entries, mib(v.remset_bytes)));
            }
            System::Steam => {
                let steam = shared
                    .steam
                    .as_ref()
                    .ok_or_else(|| anyhow!("a steam cell without its version store"))?;
                main.push((t, steam.kept_versions(), mib(steam.kept_bytes())));
            }
            System::Cow => {
                let due = last_walk
                    .is_none_or(|w| w.elapsed() >= Duration::from_millis(p.retained_every_ms));
                if due {
                    last_walk = Some(Instant::now());
                    let (docs, bytes) = sess.retained_by_queries()?;
                    main.push((t, docs, mib(bytes)));
                }
            }
        }
        if counts_si {
            let n = shared.si_model_versions();
            si.push((t, n, mib(n * per_doc)));
        }
    }
    let mut samples = vec![(cell.system.name().to_string(), main)];
    if counts_si {
        samples.push(("si-model".to_string(), si));
    }
    Ok((samples, rss_peak))
}

/// What the threads of one cell measured, once joined.
struct Joined {
    query_s: Vec<f64>,
    query_docs: u64,
    update_ops: u64,
    update_lat: Latencies,
}

type QueryOut = Result<(Vec<f64>, u64)>;
type UpdateOut = Result<(u64, Latencies)>;

/// Join a cell's query and update threads: their figures, and the first
/// error any of them returned. A panicked thread is an error at once.
fn join_cell_threads<'s>(
    queriers: Vec<std::thread::ScopedJoinHandle<'s, QueryOut>>,
    updaters: Vec<std::thread::ScopedJoinHandle<'s, UpdateOut>>,
) -> Result<(Joined, Option<anyhow::Error>)> {
    let mut first_err = None;
    let queries = join_all(queriers, "query", &mut first_err)?;
    let updates = join_all(updaters, "update", &mut first_err)?;
    let mut update_lat = Latencies::new();
    for (_, l) in &updates {
        update_lat.merge(l);
    }
    let joined = Joined {
        query_s: queries
            .iter()
            .flat_map(|(d, _)| d.iter().copied())
            .collect(),
        query_docs: queries.iter().map(|(_, n)| n).sum(),
        update_ops: updates.iter().map(|(n, _)| n).sum(),
        update_lat,
    };
    Ok((joined, first_err))
}

/// Busy work standing in for a real per-document computation: about `ns`
/// of spinning over the document (its length seeds the result).
pub fn busy_work(doc: &[u8], ns: u64) -> u64 {
    let mut h = doc.len() as u64;
    if ns > 0 {
        let t0 = Instant::now();
        while t0.elapsed().as_nanos() < ns as u128 {
            h = h.wrapping_mul(31).wrapping_add(7);
        }
    }
    h
}

/// Record one cell's figures and series under `target` (the same names on
/// every target). `propagated` is the olcp propagations of this cell alone.
fn record_cell(
    target: &str,
    rep: usize,
    spec: &Cell,
    cell: &CellOut,
    propagated: u64,
    quiet: bool,
    out: &mut Sink,
) {
    let (system, dist, k) = (spec.system, spec.dist, spec.k);
    if cell.update_noops > 0 {
        out.notes.push(format!(
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
        out.col.add(target, &c, "old_versions_peak", peak_n);
        out.col.add(target, &c, "old_mb_peak", peak_mb);
        out.col.add(
            target,
            &c,
            "old_versions_mean",
            pts.iter().map(|x| x.1).sum::<f64>() / pts.len().max(1) as f64,
        );
        if label == "si-model" {
            continue;
        }
        out.col.add(
            target,
            &c,
            "query_docs_per_s",
            cell.query_docs as f64 / q_total_s.max(1e-9),
        );
        out.col
            .add(target, &c, "queries_done", cell.query_s.len() as f64);
        out.col
            .add(target, &c, "query_s_median", median(&cell.query_s));
        out.col.add(target, &c, "update_ops_per_s", upd_s);
        out.col.add(
            target,
            &c,
            "update_latency_us_p99",
            cell.update_lat.quantile_us(0.99),
        );
        out.col.add(
            target,
            &c,
            "update_latency_us_max",
            cell.update_lat.max_us(),
        );
        out.col.add(target, &c, "rss_mb_peak", cell.rss_mb_peak);
        if system == System::Olcp {
            out.col
                .add(target, &c, "olcp_propagated", propagated as f64);
        }
        if let Some(ms) = cell.steam_sweep_ms_max {
            out.col.add(target, &c, "steam_sweep_ms_max", ms);
        }
        if rep == 0 {
            out.series.push(Series {
                target: target.into(),
                case: c.clone(),
                metric: "old_versions".into(),
                points: pts.iter().map(|x| [x.0, x.1]).collect(),
            });
        }
    }
    if rep == 0 {
        if let Some((_, pts)) = cell.samples.iter().find(|(l, _)| l == "si-model") {
            out.series.push(Series {
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
