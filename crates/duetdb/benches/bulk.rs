//! A bulk update of 1000 statements (a driver's `bulk_write` of 1000
//! `UpdateOne`s by `_id`, `$set` of one field), two ways: one engine command
//! per statement (what the server ran before #19's batches, and what a
//! client sending 1000 `update_one`s still gets) and one batch
//! (`Crud::update_statements`: one writer group, one publish, one WAL
//! record). In memory, and on a logged database whose writes wait for the
//! WAL sync (`Durability::Fsync`, the default): there the per-statement way
//! pays 1000 syncs.
//!
//! `cargo bench -p duetdb --bench bulk` (throughput in statements/s);
//! `DUET_BENCH_DOCS` sets the collection size (default 100 000 documents of
//! ~240 bytes). A tiny run that only checks it works: `-- --test`.

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use duetdb::bson::{doc, Document};
use duetdb::lang::UpdateSpec;
use duetdb::{Collection, Crud, Database, UpdateOptions, UpdateStatement};

#[global_allocator]
static ALLOC: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Statements per bulk update.
const STATEMENTS: i64 = 1000;

fn n_docs() -> i64 {
    std::env::var("DUET_BENCH_DOCS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(100_000)
}

/// ~240 bytes of BSON per document (as `benches/engine.rs`).
fn make_doc(i: i64) -> Document {
    doc! {
        "_id": i,
        "a": i % 1000,
        "b": (i * 2_654_435_761) % 1_000_003,
        "f1": format!("{:0>40}", i),
        "f2": format!("{:x>60}", i * 7),
        "f3": format!("{:y>60}", i * 13),
    }
}

fn load(db: &Database) -> Collection {
    let c = db.collection("bench");
    let n = n_docs();
    let mut start = 0;
    while start < n {
        let end = (start + 10_000).min(n);
        c.insert_many((start..end).map(make_doc), true)
            .expect("load");
        start = end;
    }
    c
}

/// The next 1000 `_id`s to update, spread over the collection.
fn next_ids(k: &mut i64, n: i64) -> Vec<i64> {
    (0..STATEMENTS)
        .map(|_| {
            *k = (*k + 7919) % n;
            *k
        })
        .collect()
}

fn one_by_one(c: &Collection, ids: &[i64]) {
    for &id in ids {
        c.update_one(doc! {"_id": id}, doc! {"$set": {"b": id}})
            .expect("update");
    }
}

fn batched(c: &Collection, ids: &[i64]) {
    let stmts = ids
        .iter()
        .map(|&id| UpdateStatement {
            filter: doc! {"_id": id},
            update: UpdateSpec::parse(&doc! {"$set": {"b": id}}).expect("update"),
            multi: false,
            options: UpdateOptions::default(),
            collation: None,
        })
        .collect();
    let results = c.update_statements(stmts, true).expect("batch");
    assert!(results.iter().all(Result::is_ok), "a statement failed");
}

fn benches(cr: &mut Criterion) {
    let n = n_docs();
    eprintln!("documents: {n}; {STATEMENTS} statements per bulk update");
    let memory = Database::in_memory();
    let dir = tempfile::tempdir().expect("tempdir");
    // Every write waits for its WAL sync (the default durability).
    let logged = Database::open(dir.path()).expect("open");
    for (name, db, samples) in [("memory", &memory, 50), ("fsync", &logged, 10)] {
        let c = load(db);
        let mut g = cr.benchmark_group(format!("bulk_update_1000/{name}"));
        g.throughput(Throughput::Elements(STATEMENTS as u64));
        g.sample_size(samples);
        let mut k = 0i64;
        g.bench_function("one_command_per_statement", |b| {
            b.iter(|| one_by_one(&c, &next_ids(&mut k, n)))
        });
        g.bench_function("one_batch", |b| {
            b.iter(|| batched(&c, &next_ids(&mut k, n)))
        });
        g.finish();
    }
}

criterion_group!(bulk, benches);
criterion_main!(bulk);
