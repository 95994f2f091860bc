//! A fixed collection-scan workload for instruction-count profiling
//! (`valgrind --tool=callgrind`), which is repeatable on a noisy machine where
//! wall-clock timing is not: loads `DUET_DOCS` (default 200,000) documents of
//! the engine bench's shape and runs the bench's 2-field predicate count
//! `DUET_SCANS` times (default 3) under `DUET_STRATEGY` (`vls` unless
//! `none`, `cow` or `olcp`), then (with `DUET_GETS`) that
//! many raw point reads by `_id`. Rates are given per wall-clock second and
//! per second of process CPU time (steadier on a shared machine).
//!
//! `cargo build --release -p duetdb --example scan_probe &&
//!  valgrind --tool=callgrind target/release/examples/scan_probe`

use std::time::Instant;

use duetdb::bson::{doc, Document};
use duetdb::{Database, Strategy};

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
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec for the call's duration.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_PROCESS_CPUTIME_ID, &mut ts) };
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
    let strategy = match std::env::var("DUET_STRATEGY").as_deref() {
        Ok("none") => Strategy::None,
        Ok("cow") => Strategy::Cow,
        Ok("olcp") => Strategy::Olcp,
        _ => Strategy::Vls,
    };
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
