//! Snapshot costs, after AnKer's Table 1 and Fig. 4, on every target that
//! has duetdb's snapshots (the embedded engine; a duetdb server over the
//! wire, with named snapshots). At each data size, loaded incrementally:
//! - the cost of making a snapshot, by the target's own means
//!   (`SnapshotSession::creation_figures`): in process `db.snapshot()` vs
//!   `fork()` vs a deep copy; over the wire `createSnapshot`/`dropSnapshot`
//!   round trips beside a `ping`;
//! - copy-on-write: the latency of an update right after a snapshot is made
//!   (its path is still shared and must be copied) vs with no snapshot held;
//! - what a snapshot held while k % of the data is rewritten keeps: the
//!   growth of this process's RSS where the engine runs in it (held, after
//!   the drop, and a rewrite with no snapshot for comparison), and the
//!   server's exact `retainedBytes/Docs` where it reports them.
//!
//! Every rewrite writes a payload no earlier write used: a `$set` to the
//! value a document already has makes no new version and would retain nothing.

use std::time::Instant;

use anyhow::Result;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use crate::progress::note;
use crate::result::{case, Sink};
use crate::stats::Latencies;
use crate::targets::{
    htap_batches, htap_doc_bytes, htap_payload, SnapshotSession, SnapshotTarget, VPerm,
};

#[derive(Debug, Clone, serde::Serialize)]
pub struct Params {
    /// Data sizes to measure at (MiB of document bytes), ascending.
    pub sizes_mb: Vec<u64>,
    /// Percentages of the data rewritten while a snapshot is held.
    pub rewrite_pct: Vec<u64>,
    /// Updates timed with and without a fresh snapshot.
    pub first_writes: usize,
    pub seed: u64,
    pub repeat: usize,
}

const MIB: f64 = 1024.0 * 1024.0;
/// Documents per `update_range` command of a rewrite.
const REWRITE_BATCH: u64 = 1000;

/// What one size of one run is: figures go to `case(data_mb, what)`.
struct Step<'a> {
    target: &'a str,
    mb: u64,
    records: u64,
    rep: usize,
}

impl Step<'_> {
    fn add(&self, out: &mut Sink, what: &str, metric: &str, value: f64) {
        let size = self.mb.to_string();
        let c = case(&[("data_mb", &size), ("what", what)]);
        out.col.add(self.target, &c, metric, value);
    }
}

/// Run every size `p.repeat` times on every target.
pub fn run(targets: &[&dyn SnapshotTarget], p: &Params, quiet: bool, out: &mut Sink) -> Result<()> {
    let mut sizes = p.sizes_mb.clone();
    sizes.sort_unstable();
    let per_doc = htap_doc_bytes(1, &VPerm::new(2));
    let records_max = sizes.last().copied().unwrap_or(0) * 1024 * 1024 / per_doc;
    let perm = VPerm::new(records_max.max(2));
    let mut memory_measured = false;
    for &target in targets {
        let name = target.name();
        // One client does everything, as one user would.
        let mut s = target.session()?;
        for rep in 0..p.repeat.max(1) {
            s.reset()?;
            let mut loaded = 0u64;
            let mut rng = StdRng::seed_from_u64(p.seed ^ rep as u64);
            for &mb in &sizes {
                let records = mb * 1024 * 1024 / per_doc;
                note(
                    quiet,
                    &format!(
                        "[snapshot] {name}: loading to {mb} MiB ({records} documents, run {}/{})",
                        rep + 1,
                        p.repeat
                    ),
                );
                htap_batches(loaded..records.max(loaded), &perm, |docs| s.insert(docs))?;
                loaded = loaded.max(records);
                let step = Step {
                    target: &name,
                    mb,
                    records,
                    rep,
                };
                measure_size(s.as_mut(), &step, p, per_doc, &mut rng, quiet, out)?;
            }
            memory_measured |= s.memory_mb().is_some();
        }
        s.finish()?;
    }
    if memory_measured {
        out.notes.push("RSS growth is what the allocator kept: freed memory may stay resident (glibc malloc), so 'after drop' can stay high; compare 'held' with the rewritten bytes".into());
    }
    Ok(())
}

/// Every figure at one size.
fn measure_size(
    s: &mut dyn SnapshotSession,
    step: &Step,
    p: &Params,
    per_doc: u64,
    rng: &mut StdRng,
    quiet: bool,
    out: &mut Sink,
) -> Result<()> {
    step.add(out, "loaded", "data_mb", s.data_bytes()? as f64 / MIB);
    if let Some(rss) = s.memory_mb() {
        step.add(out, "loaded", "rss_mb", rss);
    }
    let created = s.creation_figures(&mut out.notes)?;
    for (metric, v) in &created {
        step.add(out, "create", metric, *v);
    }
    first_writes(s, step, p, rng, out)?;
    for &pct in &p.rewrite_pct {
        held_over_rewrite(s, step, pct, per_doc, out)?;
    }
    let figures: Vec<String> = created
        .iter()
        .map(|(m, v)| format!("{m} {}", crate::report::num(*v)))
        .collect();
    note(
        quiet,
        &format!(
            "[snapshot] {} {} MiB: {}",
            step.target,
            step.mb,
            figures.join(", ")
        ),
    );
    Ok(())
}

/// An update right after a snapshot is made (its path still shared) vs one
/// with no snapshot held.
fn first_writes(
    s: &mut dyn SnapshotSession,
    step: &Step,
    p: &Params,
    rng: &mut StdRng,
    out: &mut Sink,
) -> Result<()> {
    let (mut with, mut without) = (Latencies::new(), Latencies::new());
    for i in 0..p.first_writes {
        let payload = htap_payload(i as u64);
        s.create_snapshot("bench-fw")?;
        let id = rng.gen_range(0..step.records.max(1));
        let t0 = Instant::now();
        s.update(id, &payload)?;
        with.record(t0.elapsed());
        s.drop_snapshot("bench-fw")?;
        let id = rng.gen_range(0..step.records.max(1));
        let t0 = Instant::now();
        s.update(id, &payload)?;
        without.record(t0.elapsed());
    }
    for (what, l) in [
        ("update_after_snapshot", &with),
        ("update_no_snapshot", &without),
    ] {
        step.add(out, what, "latency_us_p50", l.quantile_us(0.5));
        step.add(out, what, "latency_us_p99", l.quantile_us(0.99));
    }
    Ok(())
}

/// What a snapshot held while `pct` % of the documents are rewritten keeps.
fn held_over_rewrite(
    s: &mut dyn SnapshotSession,
    step: &Step,
    pct: u64,
    per_doc: u64,
    out: &mut Sink,
) -> Result<()> {
    let n = step.records * pct / 100;
    let what = format!("rewrite_{pct}pct");
    // Unique per (size, pct, run): see the module comment.
    let salt = step.mb * 1_000_000 + pct * 1000 + step.rep as u64;
    let rss0 = s.memory_mb();
    s.create_snapshot("bench-held")?;
    rewrite(s, n, &htap_payload(1_000_000_000 + salt))?;
    let rss_held = s.memory_mb();
    let retained = s.retained("bench-held")?;
    s.drop_snapshot("bench-held")?;
    if let (Some(rss0), Some(rss_held), Some(rss_dropped)) = (rss0, rss_held, s.memory_mb()) {
        // Without a snapshot, measured from after the drop: what a rewrite
        // adds when old versions are freed at once.
        rewrite(s, n, &htap_payload(2_000_000_000 + salt))?;
        let no_snap = s.memory_mb().map_or(0.0, |r| r - rss_dropped);
        step.add(out, &what, "rss_mb_growth_snapshot_held", rss_held - rss0);
        step.add(out, &what, "rss_mb_growth_after_drop", rss_dropped - rss0);
        step.add(out, &what, "rss_mb_growth_no_snapshot", no_snap);
    }
    if let Some((bytes, docs)) = retained {
        step.add(out, &what, "retained_mb", bytes / MIB);
        step.add(out, &what, "retained_docs", docs);
        if docs as u64 != n {
            out.notes.push(format!(
                "{} {} MiB, {pct} % rewritten: the held snapshot retains {docs} documents, {n} were rewritten",
                step.target, step.mb
            ));
        }
    }
    step.add(out, &what, "rewritten_mb", n as f64 * per_doc as f64 / MIB);
    Ok(())
}

/// Rewrite `f2` of the first `n` documents, [`REWRITE_BATCH`] per command.
fn rewrite(s: &mut dyn SnapshotSession, n: u64, payload: &str) -> Result<()> {
    let mut lo = 0u64;
    while lo < n {
        let hi = (lo + REWRITE_BATCH).min(n);
        s.update_range(lo, hi, payload)?;
        lo = hi;
    }
    Ok(())
}
