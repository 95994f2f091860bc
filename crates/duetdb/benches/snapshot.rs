//! `cow` snapshot costs (AnKer §3.2.1 lazy materialization, Table 1 in small):
//! - creation time vs the number of collections (1, 25, 50) and vs data size:
//!   it should not grow with either (one `Arc` of the published root);
//! - a named snapshot (registry insert + drop) and a restricted one (O(k));
//! - the write side: a write with no snapshot held vs one whose nodes a fresh
//!   snapshot shares, and one group writing 64 documents on one page vs on 64
//!   pages (the cost of the first write to a shared node);
//! - the O(size) retained-cost walk `list_snapshots` does.
//!
//! Before criterion runs, a summary of creation time per collection count is
//! printed next to a physical copy of the same documents, measured side by
//! side in one run. The `fork()` comparison lives in `duet bench snapshot`.
//!
//! `cargo bench -p duetdb --bench snapshot`; `DUET_BENCH_SNAP_DOCS` sets the
//! documents per collection (default 2,000).

use std::hint::black_box;
use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, BatchSize, BenchmarkId, Criterion};
use duetdb::bson::{doc, Document};
use duetdb::{Database, IndexOptions};

fn docs_per_coll() -> i64 {
    std::env::var("DUET_BENCH_SNAP_DOCS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(2_000)
}

/// ~240 bytes of BSON, as the engine bench.
fn make_doc(i: i64) -> Document {
    doc! {
        "_id": i,
        "a": i % 1000,
        "f1": format!("{:0>40}", i),
        "f2": format!("{:x>60}", i * 7),
        "f3": format!("{:y>60}", i * 13),
    }
}

fn loaded(collections: usize, docs: i64) -> Database {
    let db = Database::in_memory();
    for k in 0..collections {
        let c = db.collection(&format!("c{k:02}"));
        let mut i = 0;
        while i < docs {
            let end = (i + 10_000).min(docs);
            c.insert_many((i..end).map(make_doc), true).expect("load");
            i = end;
        }
        c.create_index(doc! {"a": 1}, IndexOptions::default())
            .expect("index");
    }
    db
}

/// Mean time of `f` over `n` calls.
fn mean(n: u32, mut f: impl FnMut()) -> Duration {
    let t = Instant::now();
    for _ in 0..n {
        f();
    }
    t.elapsed() / n
}

fn summary() {
    let docs = docs_per_coll();
    eprintln!("snapshot creation, {docs} docs of ~240 B per collection (one run, side by side):");
    eprintln!("collections | snapshot() | named create+drop | physical copy of the documents");
    for n in [1usize, 25, 50] {
        let db = loaded(n, docs);
        let snap = mean(100_000, || {
            black_box(db.snapshot());
        });
        let mut i = 0u64;
        let named = mean(20_000, || {
            let name = format!("s{i}");
            i += 1;
            db.create_snapshot(&name, None, None).expect("create");
            db.drop_snapshot(&name).expect("drop");
        });
        let s = db.snapshot();
        let copy = mean(3, || {
            let mut bytes: Vec<Vec<u8>> = Vec::new();
            for name in s.list_collection_names() {
                for d in s.collection(&name).find(doc! {}).raw().expect("scan") {
                    bytes.push(d.as_bytes().to_vec());
                }
            }
            black_box(bytes);
        });
        eprintln!(
            "{n:>11} | {:>10.0?} | {:>16.0?} | {:>10.2?} ({:.0}x snapshot())",
            snap,
            named,
            copy,
            copy.as_secs_f64() / snap.as_secs_f64().max(1e-12)
        );
    }
}

fn creation(cr: &mut Criterion) {
    summary();
    let docs = docs_per_coll();
    let mut g = cr.benchmark_group("create/collections");
    for n in [1usize, 25, 50] {
        let db = loaded(n, docs);
        g.bench_with_input(BenchmarkId::new("snapshot", n), &db, |b, db| {
            b.iter(|| black_box(db.snapshot()))
        });
        let mut i = 0u64;
        g.bench_with_input(BenchmarkId::new("named_create_drop", n), &db, |b, db| {
            b.iter(|| {
                let name = format!("s{i}");
                i += 1;
                db.create_snapshot(&name, None, None).expect("create");
                db.drop_snapshot(&name).expect("drop");
            })
        });
        g.bench_with_input(BenchmarkId::new("named_one_collection", n), &db, |b, db| {
            b.iter(|| {
                let name = format!("r{i}");
                i += 1;
                db.create_snapshot(&name, Some(vec!["c00".into()]), None)
                    .expect("create");
                db.drop_snapshot(&name).expect("drop");
            })
        });
    }
    g.finish();

    let mut g = cr.benchmark_group("create/docs");
    for docs in [1_000i64, 10_000, 100_000] {
        let db = loaded(1, docs);
        g.bench_with_input(BenchmarkId::new("snapshot", docs), &db, |b, db| {
            b.iter(|| black_box(db.snapshot()))
        });
    }
    g.finish();
}

fn writes(cr: &mut Criterion) {
    let db = loaded(1, 4096);
    let c = db.collection("c00");
    let mut g = cr.benchmark_group("write");
    let mut v = 0i64;
    g.bench_function("update_one/no_snapshot", |b| {
        b.iter(|| {
            v += 1;
            c.update_one(doc! {"_id": v % 4096}, doc! {"$set": {"a": v % 1000}})
                .expect("update")
        })
    });
    g.bench_function("update_one/fresh_snapshot_held", |b| {
        b.iter_batched(
            || db.snapshot(),
            |s| {
                v += 1;
                c.update_one(doc! {"_id": v % 4096}, doc! {"$set": {"a": v % 1000}})
                    .expect("update");
                s
            },
            BatchSize::SmallInput,
        )
    });
    let same: Vec<i64> = (0..64).collect();
    let spread: Vec<i64> = (0..64).map(|i| i * 64).collect();
    g.bench_function("update_many_64/one_page", |b| {
        b.iter(|| {
            v += 1;
            c.update_many(doc! {"_id": {"$in": same.clone()}}, doc! {"$set": {"x": v}})
                .expect("update")
        })
    });
    g.bench_function("update_many_64/64_pages", |b| {
        b.iter(|| {
            v += 1;
            c.update_many(
                doc! {"_id": {"$in": spread.clone()}},
                doc! {"$set": {"x": v}},
            )
            .expect("update")
        })
    });
    g.finish();

    // Accounting: one held snapshot after 1% of 100k documents changed.
    let db = loaded(1, 100_000);
    let c = db.collection("c00");
    db.create_snapshot("held", None, None).expect("create");
    c.update_many(doc! {"_id": {"$lt": 1000}}, doc! {"$set": {"x": 1}})
        .expect("rewrite");
    let info = db.list_snapshots();
    eprintln!("retained after 1% rewritten: {:?}", info[0].retained);
    cr.bench_function("list_snapshots/100k_docs_1pct_rewritten", |b| {
        b.iter(|| black_box(db.list_snapshots()))
    });
}

fn config() -> Criterion {
    Criterion::default()
        .sample_size(20)
        .warm_up_time(Duration::from_millis(300))
        .measurement_time(Duration::from_secs(1))
}

criterion_group! {
    name = benches;
    config = config();
    targets = creation, writes
}
criterion_main!(benches);
