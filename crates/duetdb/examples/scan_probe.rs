//! A fixed collection-scan workload for instruction-count profiling
//! (`valgrind --tool=callgrind`), which is repeatable on a noisy machine where
//! wall-clock timing is not: loads `DUET_DOCS` (default 200,000) documents of
//! the engine bench's shape and runs the bench's 2-field predicate count
//! `DUET_SCANS` times (default 3) under `DUET_STRATEGY` (`vls` unless
//! `none`, `cow` or `olcp`), then (with `DUET_GETS`) that
//! many raw point reads by `_id`. Rates are given per wall-clock second and
//! per second of process CPU time (steadier on a shared machine). Linked with
//! mimalloc, as the server is.
//!
//! `cargo build --release -p duetdb --example scan_probe &&
//!  valgrind --tool=callgrind target/release/examples/scan_probe`
//!
//! With `DUET_UPDATER=1` it is instead an A/B of strategies beside a
//! full-speed updater in one process (see [`ab_under_updater`]), e.g.
//! `DUET_DOCS=300000 DUET_SCANS=30 DUET_UPDATER=1 DUET_STRATEGY=none,vls,cow`
//! (add `DUET_SCANNERS=8` for eight concurrent scans): the same heap, the same
//! age, strategies alternating scan by scan — the comparison `duet bench
//! htap` makes across cells, without the 1.5x swings between processes.

use std::time::Instant;

use duetdb::bson::{doc, Document};
use duetdb::{Database, Strategy};

// The server's allocator (`duet` links mimalloc): glibc malloc moves costs
// between threads differently (its fastbin consolidation runs in whichever
// thread next asks for a large block), which skews per-thread figures.
#[global_allocator]
static ALLOC: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn make_doc(i: i64) -> Document {
    let region = ["north", "south", "east", "west"][(i % 4) as usize];
    doc! {
        "_id": i,
        "a": i % 1000,
        "b": (i * 2_654_435_761) % 1_000_003,
        "region": region,
        "f1": format!("{:0>40}", i),
        "f2": format!("{:x>60}", i * 7),
        "f3": format!("{:y>60}", i * 13),
    }
}

fn env(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// CPU time this process has used: on a machine shared with other builders
/// it moves far less than wall-clock time does.
fn cpu_seconds() -> f64 {
    clock_seconds(libc::CLOCK_PROCESS_CPUTIME_ID)
}

fn clock_seconds(clock: libc::clockid_t) -> f64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec for the call's duration.
    let rc = unsafe { libc::clock_gettime(clock, &mut ts) };
    if rc != 0 {
        return f64::NAN;
    }
    ts.tv_sec as f64 + ts.tv_nsec as f64 / 1e9
}

fn main() -> duetdb::Result<()> {
    let n = env("DUET_DOCS", 200_000) as i64;
    let scans = env("DUET_SCANS", 3);
    let db = Database::in_memory();
    let c = db.collection("bench");
    for start in (0..n).step_by(10_000) {
        let docs: Vec<Document> = (start..(start + 10_000).min(n)).map(make_doc).collect();
        c.insert_many(docs, true)?;
    }
    let strategies: Vec<Strategy> = std::env::var("DUET_STRATEGY")
        .unwrap_or_default()
        .split(',')
        .map(|s| match s {
            "none" => Strategy::None,
            "cow" => Strategy::Cow,
            "olcp" => Strategy::Olcp,
            _ => Strategy::Vls,
        })
        .collect();
    if env("DUET_UPDATER", 0) > 0 {
        return ab_under_updater(&db, n, scans, &strategies);
    }
    let strategy = strategies[0];
    let mut total = 0;
    let (t, cpu) = (Instant::now(), cpu_seconds());
    for _ in 0..scans {
        total += c.count_with(doc! {"region": "east", "b": {"$lt": 500_000}}, strategy)?;
    }
    let (el, cpu) = (t.elapsed(), cpu_seconds() - cpu);
    let docs = scans as f64 * n as f64;
    println!(
        "{scans} scans of {n} docs: {total} matches, {:.2} M docs/s wall, {:.2} M docs/s CPU",
        docs / el.as_secs_f64() / 1e6,
        docs / cpu / 1e6
    );
    // Raw point reads by `_id` in the engine bench's order (stride 7919).
    let gets = env("DUET_GETS", 0) as i64;
    if gets > 0 && n > 0 {
        let (mut k, mut found) = (0i64, 0u64);
        let (t, cpu) = (Instant::now(), cpu_seconds());
        for _ in 0..gets {
            k = (k + 7919) % n;
            found += u64::from(c.get(&duetdb::bson::Bson::Int64(k))?.is_some());
        }
        let (el, cpu) = (t.elapsed(), cpu_seconds() - cpu);
        println!(
            "{gets} point gets: {found} found, {:.0} k/s wall, {:.0} k/s CPU",
            gets as f64 / el.as_secs_f64() / 1e3,
            gets as f64 / cpu / 1e3
        );
    }
    Ok(())
}

/// `DUET_UPDATER=1`: one thread updates random documents at full speed while
/// this thread runs `DUET_SCANS` rounds, each round one scan per strategy of
/// `DUET_STRATEGY` (a comma list) in an order rotated every round, so every
/// strategy meets the same heap age on average; `DUET_SCANNERS=k` adds k - 1
/// threads scanning back to back under the strategy this thread is on (a
/// helper's scan that straddles a switch counts for the strategy it started
/// under). Per strategy: median wall and thread-CPU time per scan, the
/// updater's rate during its scans, and the updates that took over 1 ms.
fn ab_under_updater(
    db: &Database,
    n: i64,
    rounds: u64,
    strategies: &[Strategy],
) -> duetdb::Result<()> {
    use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
    let stop = AtomicBool::new(false);
    let updates = AtomicU64::new(0);
    let current = AtomicUsize::new(0);
    let slow_n: Vec<AtomicU64> = strategies.iter().map(|_| AtomicU64::new(0)).collect();
    let slow_us: Vec<AtomicU64> = strategies.iter().map(|_| AtomicU64::new(0)).collect();
    // The updater's own CPU time and updates, per strategy (attributed when
    // the strategy changes: one clock read per switch, not per update).
    let upd_cpu_us: Vec<AtomicU64> = strategies.iter().map(|_| AtomicU64::new(0)).collect();
    let upd_n: Vec<AtomicU64> = strategies.iter().map(|_| AtomicU64::new(0)).collect();
    let filter = || doc! {"region": "east", "b": {"$lt": 500_000}};
    let c = db.collection("bench");
    let mut rows: Vec<Vec<(f64, f64, f64)>> = vec![Vec::new(); strategies.len()];
    // `DUET_ROTATE=0`: the same order every round (to see what one
    // strategy's scan leaves behind for the next).
    let rotate = env("DUET_ROTATE", 1) > 0;
    let helpers = env("DUET_SCANNERS", 1).saturating_sub(1);
    std::thread::scope(|s| -> duetdb::Result<()> {
        // Named, so that a profile tells its samples from the scanner's.
        let updater = std::thread::Builder::new().name("updater".into());
        let spawned = updater.spawn_scoped(s, || {
            let c = db.collection("bench");
            let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
            let (mut phase, mut phase_cpu, mut phase_n) = (
                current.load(Ordering::Relaxed),
                clock_seconds(libc::CLOCK_THREAD_CPUTIME_ID),
                0u64,
            );
            while !stop.load(Ordering::Relaxed) {
                let now_phase = current.load(Ordering::Relaxed);
                if now_phase != phase {
                    let cpu = clock_seconds(libc::CLOCK_THREAD_CPUTIME_ID);
                    upd_cpu_us[phase]
                        .fetch_add(((cpu - phase_cpu) * 1e6) as u64, Ordering::Relaxed);
                    upd_n[phase].fetch_add(phase_n, Ordering::Relaxed);
                    (phase, phase_cpu, phase_n) = (now_phase, cpu, 0);
                }
                phase_n += 1;
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                let id = (x % n as u64) as i64;
                let b = (x >> 20) as i64 % 1_000_003;
                let (i, t) = (current.load(Ordering::Relaxed), Instant::now());
                if c.update_one(doc! {"_id": id}, doc! {"$set": {"b": b}})
                    .is_ok()
                {
                    updates.fetch_add(1, Ordering::Relaxed);
                }
                let us = t.elapsed().as_micros() as u64;
                if us > 1000 {
                    slow_n[i].fetch_add(1, Ordering::Relaxed);
                    slow_us[i].fetch_add(us, Ordering::Relaxed);
                }
            }
        });
        spawned.expect("spawn the updater thread");
        for h in 0..helpers {
            let scanner = std::thread::Builder::new().name(format!("scanner{h}"));
            let spawned = scanner.spawn_scoped(s, || {
                let c = db.collection("bench");
                while !stop.load(Ordering::Relaxed) {
                    let strategy = strategies[current.load(Ordering::Relaxed)];
                    if c.count_with(filter(), strategy).is_err() {
                        return;
                    }
                }
            });
            spawned.expect("spawn a scanner thread");
        }
        let result = (|| {
            for round in 0..rounds as usize {
                for j in 0..strategies.len() {
                    let i = if rotate {
                        (j + round) % strategies.len()
                    } else {
                        j
                    };
                    current.store(i, Ordering::Relaxed);
                    let (t, cpu) = (Instant::now(), clock_seconds(libc::CLOCK_THREAD_CPUTIME_ID));
                    let u0 = updates.load(Ordering::Relaxed);
                    c.count_with(filter(), strategies[i])?;
                    let wall = t.elapsed().as_secs_f64();
                    let cpu = clock_seconds(libc::CLOCK_THREAD_CPUTIME_ID) - cpu;
                    let ups = (updates.load(Ordering::Relaxed) - u0) as f64 / wall;
                    rows[i].push((wall * 1e3, cpu * 1e3, ups));
                }
            }
            Ok(())
        })();
        stop.store(true, Ordering::Relaxed);
        result
    })?;
    let median = |mut v: Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    for (i, (s, r)) in strategies.iter().zip(rows).enumerate() {
        println!(
            "{:>5}: scan wall {:7.2} ms, scan CPU {:7.2} ms, updates {:8.0}/s (medians of {}); \
             {} updates over 1 ms, {:.1} ms in them; updater CPU {:.2} us/update",
            s.name(),
            median(r.iter().map(|x| x.0).collect()),
            median(r.iter().map(|x| x.1).collect()),
            median(r.iter().map(|x| x.2).collect()),
            r.len(),
            slow_n[i].load(Ordering::Relaxed),
            slow_us[i].load(Ordering::Relaxed) as f64 / 1e3,
            upd_cpu_us[i].load(Ordering::Relaxed) as f64
                / upd_n[i].load(Ordering::Relaxed).max(1) as f64,
        );
    }
    Ok(())
}
