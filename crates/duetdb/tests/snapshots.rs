//! `cow` snapshots: named snapshot lifecycle and errors, TTL expiry, retained
//! cost, lazy materialization, DStore's shadowing properties (sharing, O(1)
//! clone, path copying, one copy per node per group), leak tests, analytic
//! sessions, and a stress test of held named snapshots against an op-log model.
//!
//! No assertion depends on timing: TTLs run on a manual clock, concurrency
//! tests check results against a model, not speed.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::collections::{BTreeMap, VecDeque};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::thread;
use std::time::Duration;

use duetdb::bson::{doc, Document};
use duetdb::structures::CollectionState;
use duetdb::{AnalyticsSnapshot, Database, IndexOptions, ManualClock, Snapshot};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

// ---------------------------------------------------------------------------
// Allocation counting (for "one copy per node per group"): counts allocations
// made by the current thread while enabled, so parallel tests do not interfere.

struct CountingAlloc;

thread_local! {
    static ALLOCS: Cell<Option<u64>> = const { Cell::new(None) };
}

// SAFETY: defers every call to the system allocator unchanged; the counter is
// a const-initialized thread-local `Cell` (no allocation, no reentrancy).
unsafe impl GlobalAlloc for CountingAlloc {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let _ = ALLOCS.try_with(|c| {
            if let Some(n) = c.get() {
                c.set(Some(n + 1));
            }
        });
        System.alloc(layout)
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        System.dealloc(ptr, layout)
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        System.realloc(ptr, layout, new_size)
    }
}

#[global_allocator]
static GLOBAL: CountingAlloc = CountingAlloc;

/// Allocations `f` makes on this thread.
fn count_allocs(f: impl FnOnce()) -> u64 {
    ALLOCS.with(|c| c.set(Some(0)));
    f();
    ALLOCS.with(|c| c.replace(None)).unwrap_or(0)
}

// ---------------------------------------------------------------------------
// Helpers

fn coll<'a>(s: &'a Snapshot, name: &str) -> &'a CollectionState {
    s.state().collection(name).expect("collection in snapshot")
}

/// Nodes of `a` (heap, `_id` index, secondary indexes) not shared with `b`.
fn unshared(a: &CollectionState, b: &CollectionState) -> (usize, usize, usize) {
    let heap = a.heap.stats().nodes - a.heap.shared_nodes_with(&b.heap);
    let id = a.id_index.stats().nodes - a.id_index.shared_nodes_with(&b.id_index);
    let sec = a
        .indexes
        .iter()
        .zip(&b.indexes)
        .map(|(x, y)| x.tree.stats().nodes - x.tree.shared_nodes_with(&y.tree))
        .sum();
    (heap, id, sec)
}

fn all_probes(c: &CollectionState) -> Vec<Weak<dyn std::any::Any>> {
    let mut p = c.heap.node_probes();
    p.extend(c.id_index.node_probes());
    for i in &c.indexes {
        p.extend(i.tree.node_probes());
    }
    p
}

fn alive(p: &[Weak<dyn std::any::Any>]) -> usize {
    p.iter().filter(|w| w.strong_count() > 0).count()
}

fn seeded(n: i64) -> Database {
    let db = Database::in_memory();
    let c = db.collection("c");
    c.insert_many(
        (0..n).map(|i| doc! {"_id": i, "a": i % 97, "x": 0, "pad": "p".repeat(40)}),
        true,
    )
    .expect("seed");
    c.create_index(doc! {"a": 1}, IndexOptions::default())
        .expect("index");
    db
}

// ---------------------------------------------------------------------------
// Named snapshot lifecycle and errors

#[test]
fn named_snapshot_lifecycle_and_errors() {
    let db = seeded(10);
    let c = db.collection("c");
    let info = db.create_snapshot("before", None, None).expect("create");
    assert_eq!(info.csn, db.csn());
    assert_eq!(info.name, "before");
    assert_eq!(info.collections, None);
    c.delete_many(doc! {"_id": {"$lt": 5}}).expect("delete");

    let s = db.named_snapshot("before").expect("read");
    assert_eq!(s.csn(), info.csn);
    assert_eq!(s.collection("c").count(doc! {}).expect("count"), 10);
    assert_eq!(c.count(doc! {}).expect("count"), 5);

    let dup = db.create_snapshot("before", None, None).expect_err("dup");
    assert_eq!(dup.code(), 48);
    assert_eq!(dup.code_name(), "NamespaceExists");
    assert!(
        dup.to_string().contains("snapshot already exists: before"),
        "{dup}"
    );

    let unknown = db.named_snapshot("nope").expect_err("unknown");
    assert_eq!(unknown.code(), 246);
    assert!(
        unknown.to_string().contains("no snapshot named 'nope'"),
        "{unknown}"
    );
    assert_eq!(db.drop_snapshot("nope").expect_err("unknown").code(), 246);

    let bad = db.create_snapshot("../etc", None, None).expect_err("bad");
    assert_eq!(bad.code(), 2);
    assert!(bad.to_string().contains("invalid snapshot name"), "{bad}");
    assert_eq!(
        db.create_snapshot("z", None, Some(Duration::ZERO))
            .expect_err("zero ttl")
            .code(),
        2
    );

    let listed = db.list_snapshots();
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0].csn, info.csn);
    assert_eq!(listed[0].retained.docs, 5, "the five deleted documents");

    db.drop_snapshot("before").expect("drop");
    let gone = db.named_snapshot("before").expect_err("dropped");
    assert_eq!(gone.code(), 246);
    assert!(gone.to_string().contains("was dropped"), "{gone}");
    assert!(db.drop_snapshot("before").is_err(), "dropped twice");
    assert!(db.list_snapshots().is_empty());
    // A lease taken before the drop keeps reading the old state.
    assert_eq!(s.collection("c").count(doc! {}).expect("count"), 10);

    // The name can be used again, for a new state.
    let again = db.create_snapshot("before", None, None).expect("recreate");
    assert!(again.csn > info.csn);
    assert_eq!(
        db.named_snapshot("before")
            .expect("read")
            .collection("c")
            .count(doc! {})
            .expect("count"),
        5
    );
}

#[test]
fn restricted_snapshot_pins_only_its_collections() {
    let db = seeded(100);
    db.collection("other")
        .insert_many((0..100).map(|i| doc! {"_id": i}), true)
        .expect("other");
    let err = db
        .create_snapshot("r", Some(vec!["c".into(), "missing".into()]), None)
        .expect_err("missing collection");
    assert_eq!(err.code(), 26);
    assert!(err.to_string().contains("does not exist"), "{err}");
    assert_eq!(
        db.create_snapshot("r", Some(vec![]), None)
            .expect_err("empty")
            .code(),
        2
    );

    let info = db
        .create_snapshot("r", Some(vec!["c".into(), "c".into()]), None)
        .expect("create");
    assert_eq!(info.collections, Some(vec!["c".to_string()]));
    let s = db.named_snapshot("r").expect("read");
    assert_eq!(s.list_collection_names(), vec!["c".to_string()]);
    assert_eq!(s.collection("other").count(doc! {}).expect("count"), 0);

    // Rewriting `other` entirely costs the restricted snapshot nothing, and its
    // old nodes are freed although the snapshot is held.
    let other_before = db.snapshot();
    let probes = all_probes(coll(&other_before, "other"));
    drop(other_before);
    db.collection("other")
        .delete_many(doc! {})
        .expect("delete other");
    assert_eq!(alive(&probes), 0, "a restricted snapshot pinned `other`");
    let cost = s.retained(&db.snapshot());
    assert_eq!(cost.nodes, 0);
    assert_eq!(cost.bytes, 0);
    assert_eq!(cost.by_collection.keys().collect::<Vec<_>>(), vec!["c"]);
}

#[test]
fn ttl_expiry_on_a_manual_clock() {
    let db = seeded(50);
    let clock = Arc::new(ManualClock::new());
    db.set_snapshot_clock(clock.clone());
    db.create_snapshot("short", None, Some(Duration::from_secs(10)))
        .expect("short");
    db.create_snapshot("long", None, Some(Duration::from_secs(100)))
        .expect("long");
    db.create_snapshot("forever", None, None).expect("forever");
    let state = Arc::downgrade(db.named_snapshot("short").expect("read").state());
    // Write, so the snapshots' root is no longer the published one.
    db.collection("c")
        .update_many(doc! {}, doc! {"$inc": {"x": 1}})
        .expect("update");

    clock.advance(Duration::from_secs(5));
    let info = db.snapshot_info("short").expect("info");
    assert_eq!(info.age, Duration::from_secs(5));
    assert_eq!(info.retained.docs, 50, "every document was replaced");

    clock.advance(Duration::from_secs(5));
    let err = db.named_snapshot("short").expect_err("expired");
    assert_eq!(err.code(), 246);
    assert!(err.to_string().contains("expired"), "{err}");
    // All three share one root, so the state lives on in the other two.
    assert!(state.upgrade().is_some());
    let names: Vec<String> = db.list_snapshots().into_iter().map(|i| i.name).collect();
    assert_eq!(names, vec!["forever".to_string(), "long".to_string()]);

    clock.advance(Duration::from_secs(90));
    assert_eq!(db.expire_snapshots(), 1);
    assert!(db.named_snapshot("long").is_err());
    db.drop_snapshot("forever").expect("drop");
    assert!(
        state.upgrade().is_none(),
        "expired snapshots were not freed"
    );
    clock.advance(Duration::from_secs(1_000_000));
    assert!(db.list_snapshots().is_empty());
}

#[test]
fn dropping_the_database_frees_named_snapshots() {
    let db = seeded(10);
    db.create_snapshot("s", None, None).expect("create");
    let state = Arc::downgrade(db.named_snapshot("s").expect("read").state());
    db.collection("c").delete_many(doc! {}).expect("delete");
    assert!(state.upgrade().is_some());
    drop(db);
    assert!(state.upgrade().is_none());
}

// ---------------------------------------------------------------------------
// Cost accounting

#[test]
fn retained_cost_counts_exactly_what_later_writes_replaced() {
    // 4096 records fill 64 heap pages under one root (ids are sequential).
    let db = seeded(4096);
    let c = db.collection("c");
    let s = db.snapshot();
    let zero = s.retained(&db.snapshot());
    assert_eq!((zero.nodes, zero.docs, zero.bytes), (0, 0, 0));
    assert_eq!(zero.snapshot_csn, zero.latest_csn);

    // Nothing indexed changes: only heap page 0 and the root are retained.
    let old: Vec<usize> = s
        .collection("c")
        .find(doc! {"_id": {"$lt": 10}})
        .raw()
        .expect("old")
        .iter()
        .map(|d| d.as_bytes().len())
        .collect();
    c.update_many(doc! {"_id": {"$lt": 10}}, doc! {"$set": {"x": 1}})
        .expect("update");
    let cost = s.retained(&db.snapshot());
    assert_eq!(cost.heap_nodes, 2, "leaf page + root");
    assert_eq!(cost.index_nodes, 0, "no index entry changed");
    assert_eq!(cost.docs, 10);
    assert_eq!(cost.doc_bytes, old.iter().sum::<usize>() as u64);
    assert!(cost.node_bytes >= 2 * 520);
    assert_eq!(cost.bytes, cost.node_bytes + cost.doc_bytes);
    assert_eq!(cost.latest_csn, cost.snapshot_csn + 1);

    // An indexed field changes: index paths are retained too.
    c.update_one(doc! {"_id": 2000}, doc! {"$set": {"a": 1000}})
        .expect("update a");
    let cost = s.retained(&db.snapshot());
    assert_eq!(cost.heap_nodes, 3);
    assert!(cost.index_nodes >= 1, "{cost:?}");
    assert_eq!(cost.docs, 11);

    // Everything deleted: the snapshot retains all it has.
    let all = coll(&s, "c");
    let nodes = all.heap.stats().nodes
        + all.id_index.stats().nodes
        + all
            .indexes
            .iter()
            .map(|i| i.tree.stats().nodes)
            .sum::<usize>();
    c.delete_many(doc! {}).expect("delete");
    let cost = s.retained(&db.snapshot());
    assert_eq!(cost.nodes as usize, nodes);
    assert_eq!(cost.docs, 4096);
    assert_eq!(cost.doc_bytes, all.data_bytes);

    // Dropped collection: same.
    db.drop_collection("c").expect("drop");
    assert_eq!(s.retained(&db.snapshot()).docs, 4096);
}

// ---------------------------------------------------------------------------
// Lazy materialization (AnKer §3.2.1)

#[test]
fn creation_is_one_pointer_and_untouched_collections_cost_nothing() {
    let db = Database::in_memory();
    for k in 0..50 {
        let c = db.collection(&format!("c{k:02}"));
        c.insert_many((0..200).map(|i| doc! {"_id": i, "a": i}), true)
            .expect("load");
        c.create_index(doc! {"a": 1}, IndexOptions::default())
            .expect("index");
    }
    let published = db.snapshot();
    let before = Arc::strong_count(published.state());
    db.create_snapshot("all", None, None).expect("create");
    let s = db.named_snapshot("all").expect("read");
    // The named snapshot *is* the published root: no state, map or node was
    // built for any of the 50 collections, just one reference taken.
    assert!(Arc::ptr_eq(s.state(), published.state()));
    assert_eq!(Arc::strong_count(published.state()), before + 2); // registry + `s`
    drop(published);

    for i in 0..200 {
        db.collection("c00")
            .update_one(doc! {"_id": i}, doc! {"$set": {"a": -i - 1}})
            .expect("write c00");
    }
    let latest = db.snapshot();
    let cost = s.retained(&latest);
    assert_eq!(cost.by_collection.len(), 50);
    for (name, cc) in &cost.by_collection {
        if name == "c00" {
            assert!(cc.docs == 200 && cc.nodes() > 0, "{cc:?}");
        } else {
            assert_eq!(cc.nodes(), 0, "{name}");
            assert_eq!(cc.bytes(), 0, "{name}");
            let (a, b) = (coll(&s, name), coll(&latest, name));
            assert_eq!(a.heap.shared_nodes_with(&b.heap), a.heap.stats().nodes);
            assert_eq!(
                a.indexes[0].tree.shared_nodes_with(&b.indexes[0].tree),
                a.indexes[0].tree.stats().nodes
            );
            assert_eq!(unshared(a, b), (0, 0, 0));
        }
    }
}

// ---------------------------------------------------------------------------
// DStore shadowing (§4.1–4.2), verified on the engine's own versions

#[test]
fn clone_is_o1_and_a_write_copies_one_path() {
    let db = seeded(4096);
    let c = db.collection("c");
    let s = db.snapshot();
    let latest = db.snapshot();
    assert_eq!(unshared(coll(&s, "c"), coll(&latest, "c")), (0, 0, 0));

    c.update_one(doc! {"_id": 100}, doc! {"$set": {"x": 7}})
        .expect("update");
    let latest = db.snapshot();
    let (old, new) = (coll(&s, "c"), coll(&latest, "c"));
    let depth = new.heap.stats().depth;
    assert_eq!(depth, 2);
    // Path copying: the new version owns exactly its root-to-leaf heap path;
    // no index entry changed, so the indexes are shared whole.
    assert_eq!(unshared(new, old), (depth, 0, 0));
    assert_eq!(unshared(old, new), (depth, 0, 0));

    c.update_one(doc! {"_id": 100}, doc! {"$set": {"a": 5000}})
        .expect("indexed");
    let latest2 = db.snapshot();
    let (_, _, sec) = unshared(coll(&latest2, "c"), new);
    let tree_depth = new.indexes[0].tree.stats().depth;
    assert!(
        sec >= 1 && sec <= 2 * tree_depth + 2,
        "remove + insert paths, maybe a split: {sec} (depth {tree_depth})"
    );
}

#[test]
fn one_copy_per_node_per_group() {
    // Within one command (one group), writing 64 documents of one heap page
    // copies that page once; 64 documents on 64 pages copy 64 pages. If a node
    // were copied per write, both would copy 64 leaves and 64 roots.
    let db = seeded(4096);
    let c = db.collection("c");
    let same: Vec<i64> = (0..64).collect();
    let spread: Vec<i64> = (0..64).map(|i| i * 64).collect();
    let mut diffs = Vec::new();
    for round in 1..=3 {
        let a = count_allocs(|| {
            c.update_many(
                doc! {"_id": {"$in": same.clone()}},
                doc! {"$set": {"x": 2 * round}},
            )
            .expect("same page");
        });
        let b = count_allocs(|| {
            c.update_many(
                doc! {"_id": {"$in": spread.clone()}},
                doc! {"$set": {"x": 2 * round + 1}},
            )
            .expect("spread");
        });
        diffs.push(b as i64 - a as i64);
    }
    // Same documents' work in both (64 modified each); only the pages differ.
    eprintln!("allocations spread - same page, per round: {diffs:?}");
    // The median: one round may carry one-time work in either of its two
    // measurements (seen once in the suite: [-12230, 63, 63], the first
    // round's same-page update allocating 12 k blocks more), which the
    // other rounds do not repeat.
    let mut sorted = diffs.clone();
    sorted.sort_unstable();
    let median = sorted[sorted.len() / 2];
    assert!(
        (63..=66).contains(&median),
        "expected ~63 extra leaf copies, got {diffs:?}"
    );
}

#[test]
fn insert_many_in_one_command_copies_the_tail_path_once() {
    let db = Database::in_memory();
    let c = db.collection("c");
    c.insert_many((0..1000).map(|i| doc! {"_id": i}), true)
        .expect("seed");
    let s0 = db.snapshot();
    c.insert_many((1000..4000).map(|i| doc! {"_id": i}), true)
        .expect("batch");
    let latest = db.snapshot();
    let (old, new) = (&coll(&s0, "c").heap, &coll(&latest, "c").heap);
    let shared = new.shared_nodes_with(old);
    let (n_old, n_new) = (old.stats().nodes, new.stats().nodes);
    assert_eq!((n_old, n_new), (17, 64), "16 then 63 pages, under a root");
    // New nodes = pages that did not exist + one copy of the partial last page
    // + one copy of the root: each touched node copied once for 3000 inserts.
    assert_eq!(n_new - shared, (n_new - n_old) + 2);
    assert_eq!(shared, 15);
}

#[test]
fn shared_documents_are_refcounted_and_released_snapshots_free_memory() {
    let db = seeded(4096);
    let c = db.collection("c");
    let doc5 = c.find(doc! {"_id": 5}).raw().expect("raw").remove(0);
    assert_eq!(Arc::strong_count(&doc5), 2, "one heap page + this handle");
    let s = db.snapshot();
    assert_eq!(Arc::strong_count(&doc5), 2, "a snapshot shares the page");
    c.update_one(doc! {"_id": 6}, doc! {"$set": {"x": 1}})
        .expect("neighbour");
    assert_eq!(
        Arc::strong_count(&doc5),
        3,
        "the page was copied: both versions point at the same bytes"
    );
    c.update_one(doc! {"_id": 5}, doc! {"$set": {"x": 1}})
        .expect("doc5");
    let weak5 = Arc::downgrade(&doc5);
    drop(doc5);
    assert!(weak5.upgrade().is_some(), "the snapshot still needs it");

    // Replace a quarter of the data, touching the index too.
    c.update_many(doc! {"_id": {"$lt": 1024}}, doc! {"$inc": {"a": 1}})
        .expect("rewrite");
    let latest = db.snapshot();
    let (old, new) = (coll(&s, "c"), coll(&latest, "c"));
    let probes = all_probes(old);
    let shared = old.heap.shared_nodes_with(&new.heap)
        + old.id_index.shared_nodes_with(&new.id_index)
        + old.indexes[0].tree.shared_nodes_with(&new.indexes[0].tree);
    assert_eq!(alive(&probes), probes.len());
    let retained = s.retained(&latest).nodes as usize;
    assert_eq!(retained, probes.len() - shared);
    let state = Arc::downgrade(s.state());

    drop(s);
    // Back to baseline: only nodes the latest version uses survive, and no
    // replaced document, no old state.
    assert_eq!(alive(&probes), shared);
    assert!(weak5.upgrade().is_none());
    assert!(state.upgrade().is_none());
    drop(latest);
    drop(c); // a collection handle holds the database
    drop(db);
    assert_eq!(
        alive(&probes),
        0,
        "nodes leaked after the database was dropped"
    );
}

// ---------------------------------------------------------------------------
// Analytic sessions (hybrid execution)

#[test]
fn analytic_sessions_pin_a_fresh_snapshot_by_default() {
    let db = seeded(100);
    let c = db.collection("c");
    assert_eq!(db.analytics_mode(), AnalyticsSnapshot::Fresh);

    let fresh = db.analytics();
    assert_eq!(fresh.csn(), Some(db.csn()));
    let n = fresh.collection("c").count(doc! {}).expect("count");
    c.insert_one(doc! {"_id": 1000, "a": 1}).expect("insert");
    assert_eq!(fresh.collection("c").count(doc! {}).expect("count"), n);
    assert_eq!(
        fresh
            .collection("c")
            .find(doc! {})
            .run()
            .expect("find")
            .len() as u64,
        n
    );
    assert!(fresh
        .collection("c")
        .find_one(doc! {"_id": 1000})
        .expect("point")
        .is_none());
    // A new session is fresh: it sees the insert.
    assert_eq!(
        db.analytics().collection("c").count(doc! {}).expect("n"),
        n + 1
    );

    db.set_analytics_mode(AnalyticsSnapshot::Latest);
    let latest = db.analytics();
    assert_eq!(latest.mode(), AnalyticsSnapshot::Latest);
    assert_eq!(latest.csn(), None);
    let m = latest.collection("c").count(doc! {}).expect("count");
    c.insert_one(doc! {"_id": 1001, "a": 1}).expect("insert");
    assert_eq!(latest.collection("c").count(doc! {}).expect("count"), m + 1);
    // An explicit mode overrides the default.
    assert_eq!(
        db.analytics_with(AnalyticsSnapshot::Fresh).mode(),
        AnalyticsSnapshot::Fresh
    );
}

#[test]
fn fresh_sessions_agree_across_calls_under_concurrent_writes() {
    let db = seeded(200);
    let stop = Arc::new(AtomicBool::new(false));
    let writer = {
        let db = db.clone();
        let stop = stop.clone();
        thread::spawn(move || {
            let c = db.collection("c");
            // Keeps the collection near 200 documents while it churns.
            let mut i = 0i64;
            while !stop.load(Ordering::Relaxed) {
                c.insert_one(doc! {"_id": 10_000 + i, "a": i % 97})
                    .expect("insert");
                let old = if i < 200 { i } else { 10_000 + i - 200 };
                assert_eq!(c.delete_one(doc! {"_id": old}).expect("delete"), 1);
                i += 1;
                if i % 64 == 0 {
                    thread::yield_now();
                }
            }
        })
    };
    let start = db.csn();
    let (mut sessions, mut overlapped) = (0, 0);
    // Until enough sessions ran and the writer made progress (not a timing
    // assertion: it ends whatever the speed).
    while sessions < 40 || db.csn() < start + 400 {
        sessions += 1;
        let s = db.analytics();
        let c = s.collection("c");
        let count = c.count(doc! {"a": {"$lt": 50}}).expect("count");
        let docs = c
            .find(doc! {"a": {"$lt": 50}})
            .sort(doc! {"_id": 1})
            .run()
            .expect("find");
        assert_eq!(count, docs.len() as u64, "count and find disagree");
        let page: Vec<Document> = (0..)
            .map(|p| {
                c.find(doc! {"a": {"$lt": 50}})
                    .sort(doc! {"_id": 1})
                    .skip(p * 25)
                    .limit(25)
                    .run()
                    .expect("page")
            })
            .take_while(|p| !p.is_empty())
            .flatten()
            .collect();
        assert_eq!(page, docs, "pages disagree with the full result");
        if db.csn() != s.csn().unwrap_or(0) {
            overlapped += 1;
        }
    }
    eprintln!("{sessions} sessions, {overlapped} overlapped with commits");
    stop.store(true, Ordering::Relaxed);
    writer.join().expect("writer");
}

// ---------------------------------------------------------------------------
// Stress: named snapshots held while a writer mutates, checked against an
// op-log model replayed up to each snapshot's csn.

#[derive(Debug, Clone)]
enum Op {
    Insert { id: i64, a: i64 },
    Set { id: i64, a: i64 },
    Delete { id: i64 },
    IncBelow { a: i64 },
    Log { seq: i64 },
}

#[derive(Default, Clone)]
struct Model {
    c: BTreeMap<i64, Document>,
    log: u64,
}

impl Model {
    fn apply(&mut self, op: &Op) {
        match *op {
            Op::Insert { id, a } => {
                self.c
                    .insert(id, doc! {"_id": id, "a": a, "b": format!("s{id}"), "n": 0});
            }
            Op::Set { id, a } => {
                if let Some(d) = self.c.get_mut(&id) {
                    d.insert("a", a);
                    let n = d.get_i32("n").unwrap_or(0);
                    d.insert("n", n + 1);
                }
            }
            Op::Delete { id } => {
                self.c.remove(&id);
            }
            Op::IncBelow { a } => {
                for d in self.c.values_mut() {
                    if d.get_i64("a").unwrap_or(i64::MAX) < a {
                        let n = d.get_i32("n").unwrap_or(0);
                        d.insert("n", n + 1);
                    }
                }
            }
            Op::Log { .. } => self.log += 1,
        }
    }

    fn at(log: &[(u64, Op)], csn: u64) -> Model {
        let mut m = Model::default();
        for (_, op) in log.iter().take_while(|(c, _)| *c <= csn) {
            m.apply(op);
        }
        m
    }
}

const IDS: i64 = 300;
const WRITES: usize = 3000;

fn writer(db: Database, log: Arc<Mutex<Vec<(u64, Op)>>>) {
    let c = db.collection("c");
    let l = db.collection("log");
    let mut rng = StdRng::seed_from_u64(0xC0_5EED);
    let mut csn = db.csn();
    let mut seq = 0;
    for _ in 0..WRITES {
        let id = rng.gen_range(0..IDS);
        let a = rng.gen_range(0..50i64);
        let op = match rng.gen_range(0..100) {
            0..=34 => Op::Insert { id, a },
            35..=64 => Op::Set { id, a },
            65..=79 => Op::Delete { id },
            80..=89 => Op::IncBelow { a },
            _ => {
                seq += 1;
                Op::Log { seq }
            }
        };
        let ok = match &op {
            Op::Insert { id, a } => c
                .insert_one(doc! {"_id": id, "a": a, "b": format!("s{id}"), "n": 0})
                .is_ok(),
            Op::Set { id, a } => {
                c.update_one(doc! {"_id": id}, doc! {"$set": {"a": a}, "$inc": {"n": 1}})
                    .expect("set");
                true
            }
            Op::Delete { id } => {
                c.delete_one(doc! {"_id": id}).expect("delete");
                true
            }
            Op::IncBelow { a } => {
                c.update_many(doc! {"a": {"$lt": a}}, doc! {"$inc": {"n": 1}})
                    .expect("inc");
                true
            }
            Op::Log { seq } => {
                l.insert_one(doc! {"_id": seq}).expect("log");
                true
            }
        };
        if ok {
            // The only writer: the published csn is this command's.
            let now = db.csn();
            assert_eq!(now, csn + 1, "one csn per successful command");
            csn = now;
            log.lock().expect("log").push((csn, op));
        }
    }
}

struct Held {
    name: String,
    csn: u64,
    restricted: bool,
    contents: Vec<Document>,
    model: Model,
}

fn check_held(db: &Database, h: &Held) {
    let s = db.named_snapshot(&h.name).expect("named snapshot");
    assert_eq!(s.csn(), h.csn);
    let c = s.collection("c");
    let all = c.find(doc! {}).sort(doc! {"_id": 1}).run().expect("scan");
    assert_eq!(all, h.contents, "{}: a held snapshot changed", h.name);

    // Pages sorted by a non-unique key, through skip/limit.
    let mut want: Vec<&Document> = h.model.c.values().collect();
    want.sort_by_key(|d| {
        (
            std::cmp::Reverse(d.get_i64("a").unwrap_or(0)),
            d.get_i64("_id").unwrap_or(0),
        )
    });
    let mut got = Vec::new();
    for p in 0.. {
        let page = c
            .find(doc! {})
            .sort(doc! {"a": -1, "_id": 1})
            .skip(p * 7)
            .limit(7)
            .run()
            .expect("page");
        if page.is_empty() {
            break;
        }
        got.extend(page);
    }
    assert_eq!(got.iter().collect::<Vec<_>>(), want, "{}: pages", h.name);

    // Point reads, including deleted and never-inserted ids.
    for id in (0..IDS).step_by(13) {
        let d = c.find_one(doc! {"_id": id}).expect("point");
        assert_eq!(d.as_ref(), h.model.c.get(&id), "{}: _id {id}", h.name);
    }
    // Index scan (forced) and count.
    let by_index = c
        .find(doc! {"a": {"$gte": 10, "$lt": 30}})
        .hint("a_1")
        .sort(doc! {"_id": 1})
        .run()
        .expect("ixscan");
    let want: Vec<&Document> = h
        .model
        .c
        .values()
        .filter(|d| (10..30).contains(&d.get_i64("a").unwrap_or(-1)))
        .collect();
    assert_eq!(
        by_index.iter().collect::<Vec<_>>(),
        want,
        "{}: ixscan",
        h.name
    );
    let n = c.count(doc! {"a": {"$lt": 25}}).expect("count");
    let want = h
        .model
        .c
        .values()
        .filter(|d| d.get_i64("a").unwrap_or(99) < 25)
        .count() as u64;
    assert_eq!(n, want, "{}: count", h.name);
    // Across collections, at the same csn.
    let logs = s.collection("log").count(doc! {}).expect("log");
    assert_eq!(
        logs,
        if h.restricted { 0 } else { h.model.log },
        "{}",
        h.name
    );
}

#[test]
fn held_named_snapshots_match_the_model_while_writes_continue() {
    let db = Database::in_memory();
    let c = db.collection("c");
    c.create_index(doc! {"a": 1}, IndexOptions::default())
        .expect("index");
    db.create_collection("log").expect("log");
    let log: Arc<Mutex<Vec<(u64, Op)>>> = Arc::default();
    let base_csn = db.csn();
    let done = Arc::new(AtomicBool::new(false));
    let w = {
        let (db, log, done) = (db.clone(), log.clone(), done.clone());
        thread::spawn(move || {
            writer(db, log);
            done.store(true, Ordering::Release);
        })
    };
    let readers: Vec<_> = (0..2)
        .map(|t| {
            let (db, log, done) = (db.clone(), log.clone(), done.clone());
            thread::spawn(move || {
                let mut held: VecDeque<Held> = VecDeque::new();
                let mut checks = 0u64;
                let mut i = 0;
                loop {
                    let finished = done.load(Ordering::Acquire);
                    let name = format!("r{t}-{i}");
                    let restricted = i % 3 == 2;
                    let cols = restricted.then(|| vec!["c".to_string()]);
                    let info = db
                        .create_snapshot(&name, cols, Some(Duration::from_secs(3600)))
                        .expect("create");
                    // Contents recorded right at creation, from the snapshot.
                    let s = db.named_snapshot(&name).expect("read");
                    let contents = s
                        .collection("c")
                        .find(doc! {})
                        .sort(doc! {"_id": 1})
                        .run()
                        .expect("scan");
                    // The op log reaches this csn once the writer has logged it.
                    let model = loop {
                        {
                            let log = log.lock().expect("log");
                            if info.csn == base_csn
                                || log.last().is_some_and(|(c, _)| *c >= info.csn)
                            {
                                break Model::at(&log, info.csn);
                            }
                        }
                        thread::yield_now();
                    };
                    let want: Vec<Document> = model.c.values().cloned().collect();
                    assert_eq!(contents, want, "{name}: state at csn {}", info.csn);
                    held.push_back(Held {
                        name,
                        csn: info.csn,
                        restricted,
                        contents,
                        model,
                    });
                    for h in &held {
                        check_held(&db, h);
                        checks += 1;
                    }
                    if held.len() > 4 {
                        let old = held.pop_front().expect("held");
                        db.drop_snapshot(&old.name).expect("drop");
                        let e = db.named_snapshot(&old.name).expect_err("dropped");
                        assert_eq!(e.code(), 246);
                    }
                    i += 1;
                    if finished {
                        break;
                    }
                }
                checks
            })
        })
        .collect();
    w.join().expect("writer");
    let checks: u64 = readers.into_iter().map(|r| r.join().expect("reader")).sum();
    assert!(checks > 0);
    // The final state equals the whole log replayed.
    let log = log.lock().expect("log");
    let model = Model::at(&log, u64::MAX);
    let now: Vec<Document> = c.find(doc! {}).sort(doc! {"_id": 1}).run().expect("scan");
    assert_eq!(now, model.c.values().cloned().collect::<Vec<_>>());
    assert_eq!(db.collection("log").count(doc! {}).expect("log"), model.log);
    c.check_invariants().expect("invariants");
    eprintln!(
        "stress: {} writes logged, {checks} snapshot checks, {} snapshots still held",
        log.len(),
        db.list_snapshots().len()
    );
}
