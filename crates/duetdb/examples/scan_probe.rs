//! A fixed collection-scan workload for instruction-count profiling
//! (`valgrind --tool=callgrind`), which is repeatable on a noisy machine where
//! wall-clock timing is not: loads `DUET_DOCS` (default 200,000) documents of
//! the engine bench's shape and runs the bench's 2-field predicate count
//! `DUET_SCANS` times (default 3) under `vls`.
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

fn main() -> duetdb::Result<()> {
    let n = env("DUET_DOCS", 200_000) as i64;
    let scans = env("DUET_SCANS", 3);
    let db = Database::in_memory();
    let c = db.collection("bench");
    for start in (0..n).step_by(10_000) {
        let docs: Vec<Document> = (start..(start + 10_000).min(n)).map(make_doc).collect();
        c.insert_many(docs, true)?;
    }
    let mut total = 0;
    let t = Instant::now();
    for _ in 0..scans {
        total += c.count_with(
            doc! {"region": "east", "b": {"$lt": 500_000}},
            Strategy::Vls,
        )?;
    }
    let el = t.elapsed();
    println!(
        "{scans} scans of {n} docs: {total} matches, {:.1} M docs/s",
        (scans as f64 * n as f64) / el.as_secs_f64() / 1e6
    );
    Ok(())
}
