//! Engine micro-benchmarks on 1 M documents of ~240 bytes (the VLS paper's size),
//! in memory, one client thread: insert, point read by `_id`, `$set` update,
//! full-scan count with a predicate, index range scan.
//!
//! `cargo bench -p duetdb --bench engine`; set `DUET_BENCH_DOCS` for a smaller set.

use std::hint::black_box;

use criterion::{criterion_group, criterion_main, BatchSize, Criterion, Throughput};
use duetdb::bson::{doc, Document};
use duetdb::{Database, IndexOptions};

#[global_allocator]
static ALLOC: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn n_docs() -> i64 {
    std::env::var("DUET_BENCH_DOCS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(1_000_000)
}

/// ~240 bytes of BSON per document.
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

fn loaded() -> Database {
    let db = Database::in_memory();
    let c = db.collection("bench");
    let n = n_docs();
    let mut batch = Vec::with_capacity(10_000);
    for i in 0..n {
        batch.push(make_doc(i));
        if batch.len() == 10_000 {
            c.insert_many(std::mem::take(&mut batch), true)
                .expect("load");
        }
    }
    c.insert_many(batch, true).expect("load");
    c.create_index(doc! {"a": 1}, IndexOptions::default())
        .expect("index");
    db
}

fn benches(cr: &mut Criterion) {
    let n = n_docs();
    let size = duetdb::raw::prepare_insert(&make_doc(n / 2))
        .expect("doc")
        .0
        .as_bytes()
        .len();
    eprintln!("documents: {n}, ~{size} bytes each");
    let db = loaded();
    let c = db.collection("bench");

    let mut g = cr.benchmark_group("engine");
    g.throughput(Throughput::Elements(1));
    let mut next = n;
    g.bench_function("insert_one", |b| {
        let fresh = Database::in_memory().collection("ins");
        b.iter(|| {
            next += 1;
            fresh.insert_one(make_doc(next)).expect("insert");
        })
    });
    let mut k: i64 = 0;
    g.bench_function("point_read_by_id", |b| {
        b.iter(|| {
            k = (k + 7919) % n;
            black_box(c.find_one(doc! {"_id": k}).expect("read"));
        })
    });
    g.bench_function("point_get_raw", |b| {
        b.iter(|| {
            k = (k + 7919) % n;
            black_box(c.get(&duetdb::bson::Bson::Int64(k)).expect("get"));
        })
    });
    g.bench_function("update_set", |b| {
        b.iter(|| {
            k = (k + 7919) % n;
            c.update_one(doc! {"_id": k}, doc! {"$set": {"b": k}})
                .expect("update");
        })
    });
    g.bench_function("insert_many_1000", |b| {
        b.iter_batched(
            || {
                let start = next;
                next += 1000;
                (start..start + 1000).map(make_doc).collect::<Vec<_>>()
            },
            |docs| c.insert_many(docs, true).expect("insert_many"),
            BatchSize::SmallInput,
        )
    });
    g.finish();

    let mut g = cr.benchmark_group("scan");
    g.sample_size(10);
    let total = c.count(doc! {}).expect("count");
    g.throughput(Throughput::Elements(total));
    g.bench_function("count_with_predicate_collscan", |b| {
        b.iter(|| {
            black_box(
                c.count(doc! {"region": "east", "b": {"$lt": 500_000}})
                    .expect("count"),
            )
        })
    });
    let in_range = c
        .count(doc! {"a": {"$gte": 100, "$lt": 110}})
        .expect("count");
    g.throughput(Throughput::Elements(in_range));
    g.bench_function("index_range_scan_1pct", |b| {
        b.iter(|| {
            black_box(
                c.find(doc! {"a": {"$gte": 100, "$lt": 110}})
                    .raw()
                    .expect("find")
                    .len(),
            )
        })
    });
    g.finish();
}

criterion_group!(engine, benches);
criterion_main!(engine);
