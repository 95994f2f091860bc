//! Where a collection's memory goes (issue #20 item 7): a counting global
//! allocator around mimalloc (the allocator `duet` runs on) measures the
//! bytes the allocator hands out — its size classes included — and the
//! number of live allocations, step by step, beside the process's RSS:
//!
//! 1. the documents alone, built the way the insert path builds them
//!    (`Arc<RawDocumentBuf>` appended element by element);
//! 2. the same documents inserted into a collection (heap, `_id` index, VLS
//!    words), with the step-1 documents dropped first;
//! 3. each secondary index created on it (an int, a short string, an int).
//!
//! `cargo run --release -p duetdb --example memory_breakdown -- [docs]`
//! (default 1,000,000 documents of 209 BSON bytes, the shape of the
//! BENCHMARKS.md "Memory" loader).

use std::alloc::{GlobalAlloc, Layout};
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;

use duetdb::bson::oid::ObjectId;
use duetdb::bson::raw::RawDocumentBuf;
use duetdb::bson::{doc, Document};
use duetdb::{Database, IndexOptions};

/// mimalloc, counting what it hands out (usable sizes) and how many blocks.
struct Counting;

static BYTES: AtomicI64 = AtomicI64::new(0);
static BLOCKS: AtomicI64 = AtomicI64::new(0);
static MI: mimalloc::MiMalloc = mimalloc::MiMalloc;

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: forwarded as received; the block is ours until dealloc.
        unsafe {
            let p = MI.alloc(layout);
            if !p.is_null() {
                BYTES.fetch_add(MI.usable_size(p) as i64, Ordering::Relaxed);
                BLOCKS.fetch_add(1, Ordering::Relaxed);
            }
            p
        }
    }

    unsafe fn dealloc(&self, p: *mut u8, layout: Layout) {
        // SAFETY: `p` came from `alloc` above with this layout.
        unsafe {
            BYTES.fetch_sub(MI.usable_size(p) as i64, Ordering::Relaxed);
            BLOCKS.fetch_sub(1, Ordering::Relaxed);
            MI.dealloc(p, layout)
        }
    }

    unsafe fn realloc(&self, p: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: as for alloc/dealloc; the old block stays valid on failure.
        unsafe {
            let old = MI.usable_size(p) as i64;
            let q = MI.realloc(p, layout, new_size);
            if !q.is_null() {
                BYTES.fetch_add(MI.usable_size(q) as i64 - old, Ordering::Relaxed);
            }
            q
        }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

fn rss() -> i64 {
    std::fs::read_to_string("/proc/self/statm")
        .ok()
        .and_then(|s| s.split_whitespace().nth(1)?.parse::<i64>().ok())
        .map_or(0, |pages| pages * 4096)
}

#[derive(Clone, Copy)]
struct Reading {
    bytes: i64,
    blocks: i64,
    rss: i64,
}

fn read() -> Reading {
    Reading {
        bytes: BYTES.load(Ordering::Relaxed),
        blocks: BLOCKS.load(Ordering::Relaxed),
        rss: rss(),
    }
}

fn document(i: u64) -> Document {
    doc! {
        "_id": ObjectId::new(),
        "k": i as i64,
        "s": "x".repeat(150),
        "a": (i * 7919 % 1_000_003) as i64,
        "b": format!("v{}", i % 100_000),
    }
}

fn row(what: &str, n: u64, from: Reading, to: Reading) {
    let per = |v: i64| v as f64 / n as f64;
    println!(
        "| {what} | {:.1} | {:.2} | {:.1} |",
        per(to.bytes - from.bytes),
        per(to.blocks - from.blocks),
        per(to.rss - from.rss),
    );
}

fn main() {
    let n: u64 = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(1_000_000);
    let bson_bytes = RawDocumentBuf::try_from(&document(0)).map_or(0, |r| r.as_bytes().len());
    println!("{n} documents of {bson_bytes} BSON bytes; per document:\n");
    println!("| step | allocator bytes | blocks | RSS bytes |");
    println!("|---|---:|---:|---:|");

    // 1. The documents as the insert path builds them.
    let start = read();
    let docs: Vec<Arc<RawDocumentBuf>> = (0..n)
        .map(|i| {
            let d = document(i);
            let mut raw = RawDocumentBuf::new();
            for (k, v) in &d {
                let key = duetdb::bson::raw::CString::try_from(k.as_str()).expect("plain key");
                raw.append(
                    key,
                    duetdb::bson::RawBson::try_from(v.clone()).expect("plain"),
                );
            }
            Arc::new(raw)
        })
        .collect();
    let built = read();
    // The `Vec` of pointers is not part of a stored document.
    let vec_bytes = (docs.capacity() * std::mem::size_of::<usize>()) as i64;
    let built = Reading {
        bytes: built.bytes - vec_bytes,
        blocks: built.blocks - 1,
        ..built
    };
    row(
        "document: `Arc<RawDocumentBuf>` appended (buffer + Arc block)",
        n,
        start,
        built,
    );
    let exact: Vec<Arc<RawDocumentBuf>> = docs
        .iter()
        .map(|d| {
            let bytes = d.as_bytes().to_vec();
            Arc::new(RawDocumentBuf::from_bytes(bytes).expect("valid"))
        })
        .collect();
    let exact_done = read();
    row(
        "document with an exact-size buffer (for comparison)",
        n,
        built,
        Reading {
            bytes: exact_done.bytes - vec_bytes,
            blocks: exact_done.blocks - 1,
            ..exact_done
        },
    );
    drop(exact);
    drop(docs);

    // 2. Through the engine: heap, `_id` index, VLS words.
    let db = Database::in_memory();
    let c = db.collection("c");
    let before = read();
    let batch = 10_000u64;
    let mut i = 0;
    while i < n {
        let end = (i + batch).min(n);
        c.insert_many((i..end).map(document), true).expect("insert");
        i = end;
    }
    let loaded = read();
    row(
        "collection with its `_id` index (engine insert_many)",
        n,
        before,
        loaded,
    );
    let mut last = loaded;
    for (field, what) in [
        ("a", "int"),
        ("b", "short string"),
        ("k", "int, ascending with _id order"),
    ] {
        c.create_index(doc! { field: 1 }, IndexOptions::default())
            .expect("index");
        let now = read();
        row(
            &format!("secondary index on `{field}` ({what})"),
            n,
            last,
            now,
        );
        last = now;
    }
    let stats = c.stats().expect("stats");
    println!(
        "\ndocuments {} data bytes {} ({:.1} per document), heap nodes {}",
        stats.count,
        stats.data_bytes,
        stats.data_bytes as f64 / n as f64,
        stats.heap_nodes
    );
    println!(
        "size_of: IndexKey (a secondary index's key, one field inline) {} B, Arc<RawDocumentBuf> block {} B",
        std::mem::size_of::<duetdb::structures::IndexKey>(),
        2 * std::mem::size_of::<usize>() + std::mem::size_of::<RawDocumentBuf>(),
    );
    println!(
        "total: allocator {:.1} B/doc, RSS {:.1} B/doc over the empty process",
        (last.bytes - start.bytes) as f64 / n as f64,
        (last.rss - start.rss) as f64 / n as f64
    );
}
