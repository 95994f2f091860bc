//! `duet check durability`: the durability benchmark.
//!
//! Measured side by side in one run (this machine is shared and noisy):
//! 1. update throughput and latency (p50/p99/max) with `threads` writers on
//!    100k documents, for in-memory, `none`, `batch` and `fsync`;
//! 2. the same `batch` update load on `docs` documents without and with a
//!    checkpoint being written continuously (does latency stall?);
//! 3. the cost of one checkpoint (bytes written, time) after `k` updates
//!    since the previous one, for growing `k` (does it follow the write
//!    rate or the data size?);
//! 4. recovery time of `docs` documents with a secondary index: checkpoint +
//!    WAL tail, and WAL only.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Result;
use duetdb::bson::doc;
use duetdb::storage::Rng;
use duetdb::{Database, Durability, DurabilityOptions, IndexOptions};

const UPDATE_DOCS: u64 = 100_000;

struct Load {
    ops_per_s: f64,
    p50_us: u64,
    p99_us: u64,
    max_us: u64,
}

fn opts(mode: Durability) -> DurabilityOptions {
    DurabilityOptions {
        mode,
        // Measure checkpoints only where asked.
        background_checkpoints: false,
        ..Default::default()
    }
}

fn fill(db: &Database, n: u64) -> Result<()> {
    let c = db.collection("bench");
    let mut batch = Vec::with_capacity(10_000);
    for i in 0..n {
        batch.push(doc! {"_id": i as i64, "k": (i % 1000) as i64, "n": 0i64, "s": "abcdefghijklmnopqrstuvwxyz0123456789".repeat(5)});
        if batch.len() == 10_000 {
            c.insert_many(std::mem::take(&mut batch), true)?;
        }
    }
    if !batch.is_empty() {
        c.insert_many(batch, true)?;
    }
    Ok(())
}

/// `threads` writers updating random documents for `seconds`.
fn updates(db: &Database, docs: u64, threads: usize, seconds: u64) -> Load {
    let stop = Arc::new(AtomicBool::new(false));
    let total = Arc::new(AtomicU64::new(0));
    let t0 = Instant::now();
    let handles: Vec<_> = (0..threads)
        .map(|t| {
            let c = db.collection("bench");
            let stop = stop.clone();
            let total = total.clone();
            std::thread::spawn(move || {
                let mut rng = Rng::new(t as u64 + 1);
                let mut lat = Vec::new();
                while !stop.load(Ordering::Relaxed) {
                    let id = rng.below(docs) as i64;
                    let t = Instant::now();
                    if c.update_one(doc! {"_id": id}, doc! {"$inc": {"n": 1}})
                        .is_err()
                    {
                        break;
                    }
                    lat.push(t.elapsed().as_micros() as u64);
                    total.fetch_add(1, Ordering::Relaxed);
                }
                lat
            })
        })
        .collect();
    std::thread::sleep(Duration::from_secs(seconds));
    stop.store(true, Ordering::Relaxed);
    let mut lat: Vec<u64> = handles
        .into_iter()
        .flat_map(|h| h.join().unwrap_or_default())
        .collect();
    let secs = t0.elapsed().as_secs_f64();
    lat.sort_unstable();
    let pct = |p: f64| {
        lat.get(((lat.len() as f64 * p) as usize).min(lat.len().saturating_sub(1)))
            .copied()
            .unwrap_or(0)
    };
    Load {
        ops_per_s: total.load(Ordering::Relaxed) as f64 / secs,
        p50_us: pct(0.50),
        p99_us: pct(0.99),
        max_us: lat.last().copied().unwrap_or(0),
    }
}

fn row(out: &mut impl Write, name: &str, l: &Load, base: f64) -> Result<()> {
    writeln!(
        out,
        "| {name} | {:.0} | {:.2}× | {} | {} | {} |",
        l.ops_per_s,
        l.ops_per_s / base,
        l.p50_us,
        l.p99_us,
        l.max_us
    )?;
    Ok(())
}

fn fresh(base: &Path, name: &str) -> PathBuf {
    let p = base.join(name);
    let _ = std::fs::remove_dir_all(&p);
    p
}

pub fn run(
    docs: u64,
    seconds: u64,
    threads: usize,
    dir: Option<PathBuf>,
    out: &mut impl Write,
) -> Result<()> {
    let base = dir.unwrap_or_else(|| {
        std::env::temp_dir().join(format!("duet-dbench-{}", std::process::id()))
    });
    std::fs::create_dir_all(&base)?;
    writeln!(
        out,
        "## Update throughput, {threads} writer threads, {UPDATE_DOCS} documents, {seconds}s each\n"
    )?;
    writeln!(
        out,
        "| mode | updates/s | vs in-memory | p50 µs | p99 µs | max µs |"
    )?;
    writeln!(out, "|---|---|---|---|---|---|")?;
    let mem = Database::in_memory();
    fill(&mem, UPDATE_DOCS)?;
    let m = updates(&mem, UPDATE_DOCS, threads, seconds);
    row(out, "in-memory", &m, m.ops_per_s)?;
    drop(mem);
    for (name, mode) in [
        ("none", Durability::None),
        ("batch", Durability::Batch),
        ("fsync", Durability::Fsync),
    ] {
        let p = fresh(&base, name);
        let db = Database::open_with(&p, opts(mode))?;
        fill(&db, UPDATE_DOCS)?;
        let l = updates(&db, UPDATE_DOCS, threads, seconds);
        row(out, name, &l, m.ops_per_s)?;
        drop(db);
        let _ = std::fs::remove_dir_all(&p);
    }

    writeln!(out, "\n## {docs} documents (+ index on k), batch mode\n")?;
    let p = fresh(&base, "big");
    let db = Database::open_with(&p, opts(Durability::Batch))?;
    let t = Instant::now();
    fill(&db, docs)?;
    db.collection("bench")
        .create_index(doc! {"k": 1}, IndexOptions::default())?;
    writeln!(out, "load: {:.1?}", t.elapsed())?;
    let t = Instant::now();
    let info = db.checkpoint()?;
    writeln!(
        out,
        "checkpoint: {:.1?}, {} bytes",
        t.elapsed(),
        info.map_or(0, |i| i.bytes)
    )?;
    writeln!(
        out,
        "\n| updates since the last checkpoint | checkpoint bytes | checkpoint time |"
    )?;
    writeln!(out, "|---|---|---|")?;
    // Handles keep the database open: dropped before the recovery reopen.
    let c = db.collection("bench");
    let mut rng = Rng::new(99);
    for k in [0u64, 100, 1_000, 10_000, 100_000] {
        for _ in 0..k {
            let id = rng.below(docs) as i64;
            c.update_one(doc! {"_id": id}, doc! {"$inc": {"n": 1}})?;
        }
        // A state with no change is not checkpointed again: one write.
        if k == 0 {
            c.update_one(doc! {"_id": 0i64}, doc! {"$inc": {"n": 1}})?;
        }
        let t = Instant::now();
        let info = db.checkpoint()?;
        writeln!(
            out,
            "| {} | {} | {:.1?} |",
            k.max(1),
            info.map_or(0, |i| i.bytes),
            t.elapsed()
        )?;
    }
    drop(c);
    writeln!(
        out,
        "\n| load | updates/s | ratio | p50 µs | p99 µs | max µs |"
    )?;
    writeln!(out, "|---|---|---|---|---|---|")?;
    let quiet = updates(&db, docs, threads, seconds);
    row(out, "no checkpoint", &quiet, quiet.ops_per_s)?;
    drop(db);
    // The checkpoint writer at the same priority as the writers, then at
    // the default lower one, in one run; a second quiet row brackets the
    // machine's drift.
    let mut notes = Vec::new();
    for nice in [0, duetdb::DEFAULT_CHECKPOINT_NICE] {
        let db = Database::open_with(
            &p,
            DurabilityOptions {
                checkpoint_nice: nice,
                ..opts(Durability::Batch)
            },
        )?;
        let stop = Arc::new(AtomicBool::new(false));
        let ckpts = {
            let db = db.clone();
            let stop = stop.clone();
            std::thread::spawn(move || {
                let mut n = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    if db.checkpoint().is_ok() {
                        n += 1;
                    }
                }
                n
            })
        };
        let before = db.checkpoint_stats().unwrap_or_default();
        let busy = updates(&db, docs, threads, seconds);
        stop.store(true, Ordering::Relaxed);
        let n_ckpt = ckpts.join().unwrap_or(0);
        let after = db.checkpoint_stats().unwrap_or_default();
        let written = after.checkpoints.saturating_sub(before.checkpoints).max(1);
        row(
            out,
            &format!("checkpoints running, nice {nice} ({n_ckpt} written)"),
            &busy,
            quiet.ops_per_s,
        )?;
        notes.push(format!(
            "nice {nice}: {n_ckpt} checkpoints back to back, {:.1} ms each on average, last {} bytes",
            after.micros_total.saturating_sub(before.micros_total) as f64 / written as f64 / 1000.0,
            after.last_bytes
        ));
    }
    let db = Database::open_with(&p, opts(Durability::Batch))?;
    let again = updates(&db, docs, threads, seconds);
    row(out, "no checkpoint (again)", &again, quiet.ops_per_s)?;
    writeln!(out)?;
    for n in notes {
        writeln!(out, "{n}  ")?;
    }
    drop(db);

    writeln!(out, "\n## Recovery of {docs} documents\n")?;
    let t = Instant::now();
    let db = Database::open_with(&p, opts(Durability::Batch))?;
    let open_all = t.elapsed();
    let r = db.recovery_report().cloned().unwrap_or_default();
    writeln!(out, "checkpoint + WAL tail: {open_all:.2?} ({r})")?;
    drop(db);
    // WAL only: the same documents loaded into a database never checkpointed.
    let q = fresh(&base, "walonly");
    {
        let db = Database::open_with(&q, opts(Durability::Batch))?;
        fill(&db, docs)?;
        db.collection("bench")
            .create_index(doc! {"k": 1}, IndexOptions::default())?;
    }
    let t = Instant::now();
    let db = Database::open_with(&q, opts(Durability::Batch))?;
    let r = db.recovery_report().cloned().unwrap_or_default();
    writeln!(out, "WAL only: {:.2?} ({r})", t.elapsed())?;
    drop(db);
    let _ = std::fs::remove_dir_all(&base);
    Ok(())
}
