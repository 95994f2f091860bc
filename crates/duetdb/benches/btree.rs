//! Fanout sweep for the copy-on-write B+tree (insert, copy-on-write batches,
//! point lookups, short ranges, full scans) and the heap's scan rate.
//! `std::collections::BTreeMap` runs beside it as a reference in the same run.

use std::collections::BTreeMap;
use std::hint::black_box;
use std::ops::Bound;
use std::sync::Arc;
use std::time::Duration;

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use duetdb::structures::BTree;
use duetdb::structures::Heap;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

const ENTRIES: usize = 100_000;
const FANOUTS: [usize; 5] = [8, 16, 32, 64, 128];
const LOOKUPS: usize = 1_000;
const RANGES: usize = 100;
const RANGE_LEN: usize = 100;
const BATCH: usize = 100;

fn random_keys(n: usize, seed: u64) -> Vec<u64> {
    let mut rng = StdRng::seed_from_u64(seed);
    (0..n).map(|_| rng.gen()).collect()
}

fn build(fanout: usize, keys: &[u64]) -> BTree<u64, u64> {
    let mut tree = BTree::with_fanout(fanout);
    for &k in keys {
        tree.insert(k, k);
    }
    tree
}

fn btree(c: &mut Criterion) {
    let keys = random_keys(ENTRIES, 1);
    let probes = random_keys(LOOKUPS, 2);
    let mut hits = keys.clone();
    hits.truncate(LOOKUPS);
    let model: BTreeMap<u64, u64> = keys.iter().map(|&k| (k, k)).collect();

    let mut group = c.benchmark_group("btree_insert_100k");
    group.throughput(Throughput::Elements(ENTRIES as u64));
    for fanout in FANOUTS {
        group.bench_with_input(BenchmarkId::from_parameter(fanout), &fanout, |b, &f| {
            b.iter(|| build(f, black_box(&keys)))
        });
    }
    group.bench_function("std", |b| {
        b.iter(|| {
            black_box(&keys)
                .iter()
                .map(|&k| (k, k))
                .collect::<BTreeMap<_, _>>()
        })
    });
    group.finish();

    // Each iteration: clone a published version, apply a batch, publish.
    let mut group = c.benchmark_group("btree_cow_batch_100_on_100k");
    group.throughput(Throughput::Elements(BATCH as u64));
    for fanout in FANOUTS {
        let base = build(fanout, &keys);
        group.bench_with_input(BenchmarkId::from_parameter(fanout), &fanout, |b, _| {
            b.iter(|| {
                let mut work = base.clone();
                for &k in &probes[..BATCH] {
                    work.insert(k, k);
                }
                work
            })
        });
    }
    group.finish();

    let mut group = c.benchmark_group("btree_get_hit_100k");
    group.throughput(Throughput::Elements(LOOKUPS as u64));
    for fanout in FANOUTS {
        let tree = build(fanout, &keys);
        group.bench_with_input(BenchmarkId::from_parameter(fanout), &fanout, |b, _| {
            b.iter(|| hits.iter().filter_map(|k| tree.get(k)).sum::<u64>())
        });
    }
    group.bench_function("std", |b| {
        b.iter(|| hits.iter().filter_map(|k| model.get(k)).sum::<u64>())
    });
    group.finish();

    let mut group = c.benchmark_group("btree_range_100x100");
    group.throughput(Throughput::Elements((RANGES * RANGE_LEN) as u64));
    for fanout in FANOUTS {
        let tree = build(fanout, &keys);
        group.bench_with_input(BenchmarkId::from_parameter(fanout), &fanout, |b, _| {
            b.iter(|| {
                probes[..RANGES]
                    .iter()
                    .map(|k| {
                        tree.range(Bound::Included(k), Bound::Unbounded)
                            .take(RANGE_LEN)
                            .map(|(_, v)| *v)
                            .fold(0u64, u64::wrapping_add)
                    })
                    .fold(0u64, u64::wrapping_add)
            })
        });
    }
    group.bench_function("std", |b| {
        b.iter(|| {
            probes[..RANGES]
                .iter()
                .map(|k| {
                    model
                        .range(k..)
                        .take(RANGE_LEN)
                        .map(|(_, v)| *v)
                        .fold(0u64, u64::wrapping_add)
                })
                .fold(0u64, u64::wrapping_add)
        })
    });
    group.finish();

    let mut group = c.benchmark_group("btree_scan_100k");
    group.throughput(Throughput::Elements(ENTRIES as u64));
    for fanout in FANOUTS {
        let tree = build(fanout, &keys);
        group.bench_with_input(BenchmarkId::from_parameter(fanout), &fanout, |b, _| {
            b.iter(|| tree.iter().map(|(_, v)| *v).fold(0u64, u64::wrapping_add))
        });
    }
    group.finish();
}

fn heap(c: &mut Criterion) {
    const RECORDS: u64 = 1_000_000;
    let mut heap = Heap::new();
    for id in 0..RECORDS {
        heap.insert(id, Arc::new(id));
    }
    // A tenth of the records deleted at random: scans must skip holes.
    let mut holey = heap.clone();
    let mut rng = StdRng::seed_from_u64(5);
    for _ in 0..RECORDS / 10 {
        holey.remove(rng.gen_range(0..RECORDS));
    }
    let mut group = c.benchmark_group("heap_scan_1m_arc");
    group.throughput(Throughput::Elements(RECORDS));
    group.bench_function("dense", |b| {
        b.iter(|| heap.iter().map(|(_, v)| **v).fold(0u64, u64::wrapping_add))
    });
    group.bench_function("holes_10pct", |b| {
        b.iter(|| holey.iter().map(|(_, v)| **v).fold(0u64, u64::wrapping_add))
    });
    group.finish();

    let probes = random_keys(LOOKUPS, 3);
    let mut group = c.benchmark_group("heap_get_1m");
    group.throughput(Throughput::Elements(LOOKUPS as u64));
    group.bench_function("random", |b| {
        b.iter(|| {
            probes
                .iter()
                .filter_map(|k| heap.get(k % RECORDS))
                .map(|v| **v)
                .fold(0u64, u64::wrapping_add)
        })
    });
    group.finish();
}

fn config() -> Criterion {
    // Short runs: the machine is shared; compare ratios within one run.
    Criterion::default()
        .sample_size(10)
        .warm_up_time(Duration::from_millis(300))
        .measurement_time(Duration::from_secs(1))
}

criterion_group! { name = benches; config = config(); targets = btree, heap }
criterion_main!(benches);
