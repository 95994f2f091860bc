//! Snapshot costs, after AnKer's Table 1 and Fig. 4: the time to create a
//! snapshot of the loaded data with duetdb's `db.snapshot()` (publishing an
//! `Arc` root) vs `fork()` of this process (the HyPer way: the child exits at
//! once without touching memory; we time the parent's `fork` call and the wait
//! until the child is reaped) vs a physical deep copy of every document.
//! Then the copy-on-write costs: the latency of an update right after a
//! snapshot (its path is still shared and must be copied) vs with no snapshot,
//! and the memory a held snapshot keeps after k % of the data was rewritten
//! (process RSS from `/proc/self/statm`).
//!
//! Embedded only: fork and RSS measure this process.

use std::time::Instant;

use anyhow::{bail, Result};
use duetdb::bson::doc;
use duetdb::{Database, IndexOptions};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use crate::machine::rss_mb;
use crate::progress::note;
use crate::result::{case, Collector};
use crate::stats::{median, Latencies};
use crate::target::{htap_doc, htap_payload, VPerm, HTAP_TABLE};

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

/// Bytes of one loaded document (≈240).
fn doc_bytes() -> u64 {
    duetdb::raw::to_raw_document(&htap_doc(1, &VPerm::new(2)))
        .map_or(240, |b| b.as_bytes().len() as u64)
}

/// Fork this process; the child `_exit`s at once. Returns (fork call ms, until reaped ms).
fn fork_once() -> Result<(f64, f64)> {
    let t0 = Instant::now();
    // SAFETY: the child calls only `_exit`, which is async-signal-safe, so the
    // multi-threaded parent's state (locks held by other threads) is never
    // touched in the child.
    let pid = unsafe { libc::fork() };
    if pid == 0 {
        // SAFETY: see above; `_exit` skips atexit handlers and destructors.
        unsafe { libc::_exit(0) };
    }
    let fork_ms = t0.elapsed().as_secs_f64() * 1000.0;
    if pid < 0 {
        bail!("fork failed: {}", std::io::Error::last_os_error());
    }
    let mut status = 0;
    // SAFETY: waiting for our own child; `status` is a valid out-pointer.
    let r = unsafe { libc::waitpid(pid, &mut status, 0) };
    if r != pid {
        bail!("waitpid failed: {}", std::io::Error::last_os_error());
    }
    Ok((fork_ms, t0.elapsed().as_secs_f64() * 1000.0))
}

pub fn run(p: &Params, quiet: bool, col: &mut Collector, notes: &mut Vec<String>) -> Result<()> {
    let target = "duetdb-embedded";
    let per_doc = doc_bytes();
    let mut sizes = p.sizes_mb.clone();
    sizes.sort_unstable();
    let records_max = sizes.last().copied().unwrap_or(0) * 1024 * 1024 / per_doc;
    let perm = VPerm::new(records_max.max(2));
    for rep in 0..p.repeat.max(1) {
        let db = Database::in_memory();
        let coll = db.collection(HTAP_TABLE);
        coll.create_index(doc! {"v": 1}, IndexOptions::default())?;
        let mut loaded = 0u64;
        let mut rng = StdRng::seed_from_u64(p.seed ^ rep as u64);
        for &mb in &sizes {
            let records = mb * 1024 * 1024 / per_doc;
            note(
                quiet,
                &format!(
                    "[snapshot] loading to {mb} MiB ({records} documents, run {}/{})",
                    rep + 1,
                    p.repeat
                ),
            );
            while loaded < records {
                let end = (loaded + 10_000).min(records);
                coll.insert_many((loaded..end).map(|i| htap_doc(i, &perm)), true)?;
                loaded = end;
            }
            let size = mb.to_string();
            let c = |what: &str| case(&[("data_mb", &size), ("what", what)]);
            let stats = coll.stats()?;
            col.add(
                target,
                &c("loaded"),
                "data_mb",
                stats.data_bytes as f64 / 1048576.0,
            );
            col.add(target, &c("loaded"), "rss_mb", rss_mb());

            // Creation: O(1) snapshots, timed one by one.
            let mut create = Latencies::new();
            for _ in 0..1000 {
                let t0 = Instant::now();
                let s = db.snapshot();
                create.record(t0.elapsed());
                drop(s);
            }
            col.add(
                target,
                &c("create"),
                "duet_snapshot_us_median",
                create.quantile_us(0.5),
            );
            let mut forks = Vec::new();
            let mut reaped = Vec::new();
            for _ in 0..5 {
                let (f, r) = fork_once()?;
                forks.push(f);
                reaped.push(r);
            }
            col.add(target, &c("create"), "fork_ms_median", median(&forks));
            col.add(
                target,
                &c("create"),
                "fork_reaped_ms_median",
                median(&reaped),
            );
            let t0 = Instant::now();
            let snap = db.snapshot();
            let docs = snap.collection(HTAP_TABLE).find(doc! {}).raw()?;
            let mut copy: Vec<Vec<u8>> = Vec::with_capacity(docs.len());
            copy.extend(docs.iter().map(|d| d.as_bytes().to_vec()));
            let deep_ms = t0.elapsed().as_secs_f64() * 1000.0;
            let copied: u64 = copy.iter().map(|d| d.len() as u64).sum();
            drop((copy, docs, snap));
            col.add(target, &c("create"), "deep_copy_ms", deep_ms);
            if copied != stats.data_bytes {
                notes.push(format!(
                    "deep copy copied {copied} bytes of {}",
                    stats.data_bytes
                ));
            }
            let ratio = median(&forks) * 1000.0 / create.quantile_us(0.5).max(1e-3);
            col.add(target, &c("create"), "fork_over_duet_ratio", ratio);

            // First write to a shared path vs an unshared one.
            let mut with = Latencies::new();
            let mut without = Latencies::new();
            for i in 0..p.first_writes {
                let id = rng.gen_range(0..records) as i64;
                let payload = htap_payload(i as u64);
                let s = db.snapshot();
                let t0 = Instant::now();
                coll.update_one(doc! {"_id": id}, doc! {"$set": {"f2": &payload}})?;
                with.record(t0.elapsed());
                drop(s);
                let id = rng.gen_range(0..records) as i64;
                let t0 = Instant::now();
                coll.update_one(doc! {"_id": id}, doc! {"$set": {"f2": &payload}})?;
                without.record(t0.elapsed());
            }
            for (what, l) in [
                ("update_after_snapshot", &with),
                ("update_no_snapshot", &without),
            ] {
                col.add(target, &c(what), "latency_us_p50", l.quantile_us(0.5));
                col.add(target, &c(what), "latency_us_p99", l.quantile_us(0.99));
            }

            // Memory held by a snapshot while k % of the data is rewritten.
            for &pct in &p.rewrite_pct {
                let n = records * pct / 100;
                let what = format!("rewrite_{pct}pct");
                let rss0 = rss_mb();
                let snap = db.snapshot();
                rewrite(&coll, n, pct)?;
                let held = rss_mb() - rss0;
                drop(snap);
                let after_drop = rss_mb() - rss0;
                // Without a snapshot, measured from after the drop: what a
                // rewrite adds when old versions are freed at once.
                let rss1 = rss_mb();
                rewrite(&coll, n, pct + 1000)?;
                let no_snap = rss_mb() - rss1;
                col.add(target, &c(&what), "rss_mb_growth_snapshot_held", held);
                col.add(target, &c(&what), "rss_mb_growth_after_drop", after_drop);
                col.add(target, &c(&what), "rss_mb_growth_no_snapshot", no_snap);
                col.add(
                    target,
                    &c(&what),
                    "rewritten_mb",
                    n as f64 * per_doc as f64 / 1048576.0,
                );
            }
            note(
                quiet,
                &format!(
                "[snapshot] {mb} MiB: db.snapshot() {:.2} µs, fork {:.2} ms, deep copy {:.0} ms",
                create.quantile_us(0.5),
                median(&forks),
                deep_ms
            ),
            );
        }
    }
    notes.push("RSS growth is what the allocator kept: freed memory may stay resident (glibc malloc), so 'after drop' can stay high; compare 'held' with the rewritten bytes".into());
    Ok(())
}

/// Rewrite `f2` of the first `n` documents in commands of 1,000.
fn rewrite(coll: &duetdb::Collection, n: u64, salt: u64) -> Result<()> {
    let mut lo = 0u64;
    let payload = htap_payload(salt);
    while lo < n {
        let hi = (lo + 1000).min(n);
        coll.update_many(
            doc! {"_id": {"$gte": lo as i64, "$lt": hi as i64}},
            doc! {"$set": {"f2": &payload}},
        )?;
        lo = hi;
    }
    Ok(())
}
