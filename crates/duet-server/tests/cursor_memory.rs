//! What a cursor says it holds (`held_bytes`, which the server's cursor
//! memory limit counts) against what the allocator actually handed out, for
//! owned documents of several shapes and for parked (serialized) results.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};

use bson::{doc, Document};
use duet_server::cursor::{owned_document_bytes, Cursor, CursorLimits, CursorRegistry, Owner};

/// Counts live heap bytes (requested sizes).
struct Counting;

static LIVE: AtomicUsize = AtomicUsize::new(0);

// SAFETY: forwards to the system allocator unchanged; only counts sizes.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        LIVE.fetch_add(l.size(), Ordering::Relaxed);
        // SAFETY: same layout contract as our caller's.
        unsafe { System.alloc(l) }
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        LIVE.fetch_sub(l.size(), Ordering::Relaxed);
        // SAFETY: `p` was allocated by `System.alloc` with layout `l`.
        unsafe { System.dealloc(p, l) }
    }
    unsafe fn realloc(&self, p: *mut u8, l: Layout, new: usize) -> *mut u8 {
        LIVE.fetch_add(new, Ordering::Relaxed);
        LIVE.fetch_sub(l.size(), Ordering::Relaxed);
        // SAFETY: as for `dealloc` and `alloc`.
        unsafe { System.realloc(p, l, new) }
    }
}

#[global_allocator]
static A: Counting = Counting;

type Shape = (&'static str, Box<dyn Fn(i32) -> Document>);

fn shapes() -> Vec<Shape> {
    vec![
        (
            "small",
            Box::new(|i| doc! {"_id": i, "a": i, "s": "hello world", "k": i % 7}),
        ),
        (
            "wide",
            Box::new(|i| {
                let mut d = doc! {"_id": i};
                for j in 0..50 {
                    d.insert(format!("field{j}"), j * i);
                }
                d
            }),
        ),
        (
            "strings",
            Box::new(|i| doc! {"_id": i, "s": "x".repeat(1000), "t": "y".repeat(200)}),
        ),
        (
            "nested",
            Box::new(|i| {
                doc! {"_id": i, "a": {"b": {"c": [1, 2, 3, {"d": "e"}]}}, "arr": (0..20).collect::<Vec<i32>>()}
            }),
        ),
    ]
}

// One test function: the counter is process-wide, so nothing else may
// allocate concurrently.
#[test]
fn held_bytes_track_the_allocator() {
    for (name, make) in shapes() {
        let before = LIVE.load(Ordering::SeqCst);
        let docs: Vec<Document> = (0..5000).map(&make).collect();
        let measured = LIVE.load(Ordering::SeqCst) - before;
        let estimated: usize = docs.iter().map(owned_document_bytes).sum();
        let ratio = estimated as f64 / measured as f64;
        assert!(
            (0.75..=1.25).contains(&ratio),
            "{name}: estimated {estimated}, allocated {measured} ({ratio:.2})"
        );

        // Parked in the registry, the remainder is held serialized: smaller
        // (much, for small fields), and the figure charged is what dropping
        // it frees.
        let reg = CursorRegistry::new(
            CursorLimits {
                per_connection: 10,
                max_cursors: 10,
                max_bytes: usize::MAX,
            },
            std::time::Duration::from_secs(60),
        );
        let mut c = Cursor::from_owned("t.c".into(), 1, docs);
        c.next_batch(1).expect("first batch");
        reg.open(c, Owner::connection(1)).expect("open");
        let held = reg.held_bytes();
        assert!(held < measured, "{name}: parked {held} vs {measured} owned");
        let before = LIVE.load(Ordering::SeqCst);
        drop(reg);
        let freed = before - LIVE.load(Ordering::SeqCst);
        let ratio = held as f64 / freed as f64;
        assert!(
            (0.75..=1.25).contains(&ratio),
            "{name}: parked cursor says {held}, freed {freed} ({ratio:.2})"
        );
    }
}
