//! A collection built at once from all its records (recovery loading a
//! checkpoint image): the heap, the `_id` index and every secondary index
//! are built side by side on scoped threads, each index bottom-up from its
//! sorted entries ([`BTree::from_sorted`]) instead of one insert per key.
//!
//! A secondary index's entries come in key order without a sort when the
//! image stored that order ([`EntryOrder`]: the record position of each
//! entry, in key order): the keys are still formed from the documents, and
//! the order is only trusted after a linear check (every entry placed once,
//! neighbours strictly ascending); an order that does not fit is ignored
//! and the entries are sorted as without one.
//!
//! The `_id` index is placed the same way by its own stored order (the
//! record positions in `_id` order): each record must be placed exactly
//! once and the ids strictly ascending, else the ids are sorted as without
//! an order (collected again in record order, so even a duplicate's error
//! names the same key as without one).
//!
//! Invariants:
//! - the result equals inserting the records one by one in order into an
//!   empty collection and then calling [`CollectionState::create_index`]
//!   with each spec in order: the same record ids (`0..n`), the same entries
//!   in every index, the same multikey flags, the same spec checks (and
//!   order of conflicts);
//! - a duplicate `_id`, a duplicate key of a unique index or a key that
//!   cannot be formed is an error and nothing is returned (no partial
//!   collection);
//! - a stored order never changes the result, only its cost: the entries
//!   placed by it are the documents' keys (or ids), and the tree is built
//!   from them only when they are strictly ascending (else they are
//!   sorted);
//! - at most [`workers`] threads run at once (one job per structure): the
//!   entries being sorted are the peak of memory, and more threads than
//!   cores would only hold more of them at the same time.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use bson::RawBson;

use crate::doc::{self, DocRef};
use crate::error::{Error, Result};
use crate::store::btree::BTree;
use crate::store::collection::CollectionState;
use crate::store::heap::{Heap, RecordId};
use crate::store::index::{IndexKey, IndexSpec, IndexState, ValueKey};
use crate::store::options::CollectionOptions;

/// How many threads a build uses for `jobs` independent structures: one per
/// job, at most one per core (and at least one).
pub fn workers(jobs: usize) -> usize {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    jobs.clamp(1, cores.max(1))
}

/// The order of one index's entries as a checkpoint image stores it: for
/// each entry in key order, the position of its record among the loaded
/// records (its record id at load). A record with several keys appears once
/// per key (its keys are ascending, so the k-th appearance is its k-th
/// least key).
pub type EntryOrder = Vec<u32>;

/// The orders a checkpoint image stored for one collection's indexes.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StoredOrders {
    /// The `_id` index's: the record positions in `_id` order (one entry a
    /// record). `None`: not stored (sorted at load).
    pub id: Option<EntryOrder>,
    /// Each secondary index's (`indexes[i]` for the i-th spec; missing or
    /// `None`: sorted at load).
    pub indexes: Vec<Option<EntryOrder>>,
}

/// How an index's entries were put in order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ordered {
    /// By the stored [`EntryOrder`] (checked, no sort).
    Stored,
    /// Sorted (no stored order, or one that did not fit).
    Sorted,
}

/// The entries of `spec` over `records` in record order (each record's
/// keys ascending), the index of each record's first entry (plus the end),
/// and whether a key came from an array.
type Collected = (Vec<Entry>, Vec<usize>, bool);

/// One entry of a secondary index.
type Entry = (IndexKey, RecordId);

fn collect_entries<'a>(
    spec: &IndexSpec,
    records: impl Iterator<Item = (RecordId, &'a DocRef)>,
    size_hint: usize,
) -> Result<Collected, SortedError> {
    let mut multikey = false;
    let mut entries: Vec<(IndexKey, RecordId)> = Vec::with_capacity(size_hint);
    let mut starts = Vec::with_capacity(size_hint + 1);
    for (rid, d) in records {
        let (mut keys, m) = spec.keys_for(d).map_err(SortedError::Key)?;
        multikey |= m;
        starts.push(entries.len());
        if keys.len() > 1 {
            keys.sort_unstable();
        }
        entries.extend(keys.into_iter().map(|k| (k, rid)));
    }
    starts.push(entries.len());
    Ok((entries, starts, multikey))
}

/// `entries` (the records' entries in record order, `starts` as
/// [`collect_entries`] gives them) rearranged by `order`, or `entries` back
/// when `order` does not place every entry exactly once. The result is not
/// checked for order here (the tree build checks it).
fn apply_order(
    entries: Vec<(IndexKey, RecordId)>,
    starts: &[usize],
    order: &[u32],
) -> std::result::Result<Vec<Entry>, Vec<Entry>> {
    let records = starts.len().saturating_sub(1);
    if order.len() != entries.len() {
        return Err(entries);
    }
    // The next unplaced entry of each record: distinct records own disjoint
    // ranges and each cursor only moves forward within its own, so if no
    // cursor runs past its range every entry is placed at most once — and,
    // as many places as entries, exactly once.
    let mut next: Vec<usize> = starts[..records].to_vec();
    let mut from = Vec::with_capacity(order.len());
    for &p in order {
        let p = p as usize;
        if p >= records || next[p] >= starts[p + 1] {
            return Err(entries);
        }
        from.push(next[p]);
        next[p] += 1;
    }
    let mut slots: Vec<Option<(IndexKey, RecordId)>> = entries.into_iter().map(Some).collect();
    let mut placed = Vec::with_capacity(from.len());
    for &i in &from {
        match slots[i].take() {
            Some(e) => placed.push(e),
            None => {
                // Unreachable (each entry is taken once, see above); even
                // so, hand back every entry, to be sorted.
                placed.extend(slots.into_iter().flatten());
                return Err(placed);
            }
        }
    }
    Ok(placed)
}

/// A unique index's duplicate: two neighbours with equal keys. A record's
/// keys are distinct, so equal neighbours are two records — whether or not
/// the entries are sorted (sorted, every duplicate has such a neighbour).
fn check_unique(spec: &IndexSpec, entries: &[(IndexKey, RecordId)]) -> Result<(), SortedError> {
    if spec.unique {
        if let Some(w) = entries.windows(2).find(|w| w[0].0 == w[1].0) {
            return Err(SortedError::Duplicate(w[0].0.clone()));
        }
    }
    Ok(())
}

/// Why [`build_index`] failed.
#[derive(Debug)]
pub enum SortedError {
    /// A record's keys could not be formed.
    Key(Error),
    /// A unique index would hold this key twice.
    Duplicate(IndexKey),
}

/// An index of `spec` over `records` (record id = position), built from
/// its entries in key order: placed by `order` when it fits (see
/// [`EntryOrder`]), else sorted; and which it was. A unique index's
/// duplicate is returned as the first key found held twice.
///
/// Requires: nothing; a record whose keys cannot be formed is an error.
pub fn build_index<'a>(
    spec: Arc<IndexSpec>,
    records: impl Iterator<Item = (RecordId, &'a DocRef)>,
    size_hint: usize,
    usage: Arc<crate::store::index::IndexUsage>,
    order: Option<&[u32]>,
) -> Result<(IndexState, Ordered), SortedError> {
    let (entries, starts, multikey) = collect_entries(&spec, records, size_hint)?;
    let in_order = match order {
        Some(order) => apply_order(entries, &starts, order),
        None => Err(entries),
    };
    drop(starts);
    let index = |tree| IndexState {
        spec: spec.clone(),
        tree,
        frozen: None,
        active: Default::default(),
        multikey,
        usage: usage.clone(),
    };
    if let Ok(entries) = in_order.as_ref() {
        // A duplicate is one whatever the order; reported before the tree.
        check_unique(&spec, entries)?;
    }
    let unsorted = match in_order {
        Ok(entries) => match BTree::try_from_sorted(entries.into_iter().map(|e| (e, ())).collect())
        {
            Ok(tree) => return Ok((index(tree), Ordered::Stored)),
            Err(back) => back.into_iter().map(|(e, ())| e).collect(),
        },
        Err(entries) => entries,
    };
    let mut entries: Vec<(IndexKey, RecordId)> = unsorted;
    entries.sort_unstable();
    check_unique(&spec, &entries)?;
    let tree = BTree::from_sorted(entries.into_iter().map(|e| (e, ())).collect())
        .map_err(|_| SortedError::Key(not_sorted(&spec.name)))?;
    Ok((index(tree), Ordered::Sorted))
}

fn not_sorted(what: &str) -> Error {
    // Sorted and deduplicated just before: only a broken key order gets here.
    Error::Internal(format!("index {what}: sorted entries are not ascending"))
}

/// The ids of `docs` placed by `order` (record id = position), or `None`
/// when `order` does not place every record exactly once or a record has
/// no `_id` (the caller then collects them in record order, which reports
/// that record as without an order). Not checked for order here (the tree
/// build checks it).
fn ids_in_order(docs: &[DocRef], order: &[u32]) -> Option<Vec<(ValueKey, RecordId)>> {
    if order.len() != docs.len() {
        return None;
    }
    // One bit a record (a tenth of a byte vector's cache footprint).
    let mut seen = vec![0u64; docs.len().div_ceil(64)];
    let mut ids = Vec::with_capacity(docs.len());
    for &p in order {
        let at = p as usize;
        let d = docs.get(at)?;
        let (word, bit) = (at / 64, 1u64 << (at % 64));
        if seen[word] & bit != 0 {
            return None;
        }
        seen[word] |= bit;
        ids.push((ValueKey::from(doc::id_of(d)?), RecordId::from(p)));
    }
    Some(ids)
}

/// The `_id` index of `docs` (record id = position): placed by `order`
/// when it fits, else sorted; and which it was. A record without `_id` is
/// an error, a duplicate id is `dup`'s error for the first key found held
/// twice (as without an order: the ids are then sorted from record order).
fn build_id_index(
    docs: &[DocRef],
    order: Option<&[u32]>,
    dup: impl Fn(&RawBson) -> Error,
) -> Result<(BTree<ValueKey, RecordId>, Ordered)> {
    if let Some(ids) = order.and_then(|o| ids_in_order(docs, o)) {
        // Strictly ascending also means no duplicate: equal ids would be
        // neighbours once sorted, and a strictly ascending run is sorted.
        if let Ok(tree) = BTree::try_from_sorted(ids) {
            return Ok((tree, Ordered::Stored));
        }
    }
    let mut ids = Vec::with_capacity(docs.len());
    for (rid, d) in docs.iter().enumerate() {
        let id: RawBson = doc::id_of(d)
            .ok_or_else(|| Error::Internal(format!("record {rid} has no _id")))?
            .into();
        ids.push((ValueKey::from(id), rid as RecordId));
    }
    ids.sort_unstable_by(|a, b| a.0.cmp(&b.0));
    if let Some(w) = ids.windows(2).find(|w| w[0].0 == w[1].0) {
        return Err(dup(&w[0].0.to_raw()));
    }
    let tree = BTree::from_sorted(ids).map_err(|_| not_sorted("_id_"))?;
    Ok((tree, Ordered::Sorted))
}

/// What one job built.
enum Built {
    Heap(Heap<DocRef>, u64),
    Id(BTree<ValueKey, RecordId>, Ordered),
    Index(usize, IndexState, Ordered),
}

/// How a load put its indexes' entries in order.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct OrderCounts {
    /// Secondary indexes built in their stored order (no sort).
    pub stored: u32,
    /// Secondary indexes whose entries were sorted.
    pub sorted: u32,
    /// `_id` indexes placed by their stored order (0 or 1 a collection).
    pub ids_stored: u32,
    /// `_id` indexes whose ids were sorted.
    pub ids_sorted: u32,
}

/// The collection `ns` holding `docs` (record ids `0..n` in this order) with
/// the options and the secondary indexes of `specs` (in this order), the
/// `_id` index and each secondary index in the order `orders` stored for it
/// when there is one and it fits (`orders.indexes[i]` for `specs[i]`;
/// missing or `None`: sorted).
pub fn load_collection(
    ns: &str,
    options: CollectionOptions,
    docs: Vec<DocRef>,
    specs: Vec<IndexSpec>,
    orders: StoredOrders,
) -> Result<(CollectionState, OrderCounts)> {
    let mut c = CollectionState::new(ns, Default::default());
    c.options = options;
    // The checks of `create_index` on the empty collection: conflicts among
    // the specs fail as they would have, and `c.indexes` gets its order.
    for spec in specs {
        c.create_index(spec)?;
    }
    let n = docs.len();
    let jobs = 2 + c.indexes.len();
    let next = AtomicUsize::new(0);
    let results: Mutex<Vec<Result<Built>>> = Mutex::new(Vec::with_capacity(jobs));
    let records = || docs.iter().enumerate().map(|(i, d)| (i as RecordId, d));
    let proto = &c;
    let run = |job: usize| -> Result<Built> {
        match job {
            0 => {
                let mut heap = Heap::new();
                let mut bytes = 0u64;
                for (rid, d) in records() {
                    bytes += d.as_bytes().len() as u64;
                    proto.vls.on_insert(rid);
                    heap.insert(rid, d.clone());
                }
                Ok(Built::Heap(heap, bytes))
            }
            1 => build_id_index(&docs, orders.id.as_deref(), |id| proto.dup_id_error(id))
                .map(|(tree, how)| Built::Id(tree, how)),
            j => {
                let at = j - 2;
                let index = &proto.indexes[at];
                let order = orders.indexes.get(at).and_then(|o| o.as_deref());
                build_index(index.spec.clone(), records(), n, index.usage.clone(), order)
                    .map(|(built, how)| Built::Index(at, built, how))
                    .map_err(|e| match e {
                        SortedError::Key(e) => e,
                        SortedError::Duplicate(k) => proto.dup_key_error(index, &k),
                    })
            }
        }
    };
    // The indexes first (the longest jobs), the heap and `_id` last.
    let order: Vec<usize> = (2..jobs).chain([0, 1]).collect();
    std::thread::scope(|s| {
        for _ in 0..workers(jobs) {
            s.spawn(|| loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                let Some(&job) = order.get(i) else {
                    break;
                };
                let out = run(job);
                let failed = out.is_err();
                if let Ok(mut r) = results.lock() {
                    r.push(out);
                }
                if failed {
                    // Every later job is wasted work: let the others stop.
                    next.store(jobs, Ordering::Relaxed);
                }
            });
        }
    });
    let results = results
        .into_inner()
        .map_err(|_| Error::Internal("a bulk load thread panicked".into()))?;
    let mut seen = 0;
    let mut counts = OrderCounts::default();
    for out in results {
        seen += 1;
        match out? {
            Built::Heap(heap, bytes) => {
                c.heap = heap;
                c.data_bytes = bytes;
            }
            Built::Id(tree, how) => {
                c.id_index = tree;
                match how {
                    Ordered::Stored => counts.ids_stored += 1,
                    Ordered::Sorted => counts.ids_sorted += 1,
                }
            }
            Built::Index(at, index, how) => {
                c.indexes[at] = index;
                match how {
                    Ordered::Stored => counts.stored += 1,
                    Ordered::Sorted => counts.sorted += 1,
                }
            }
        }
    }
    if seen != jobs {
        return Err(Error::Internal(format!(
            "a bulk load finished {seen} of {jobs} jobs"
        )));
    }
    c.next_rid = n as RecordId;
    Ok((c, counts))
}

#[cfg(test)]
mod tests {
    use super::*;
    use bson::{doc, rawdoc};

    fn docs(n: i32) -> Vec<DocRef> {
        (0..n)
            .map(|i| {
                let tags: Vec<i32> = (0..(i % 3)).map(|t| i % 5 + t).collect();
                let d = doc! {"_id": (n - i) * 7 % 1009, "a": i % 13, "s": format!("k{}", i % 101), "tags": tags, "u": i};
                Arc::new(bson::RawDocumentBuf::try_from(&d).expect("encode"))
            })
            .collect()
    }

    fn specs() -> Vec<IndexSpec> {
        vec![
            IndexSpec::new(&doc! {"a": 1, "s": -1}, None, false).expect("spec"),
            IndexSpec::new(&doc! {"tags": 1}, None, false).expect("spec"),
            IndexSpec::new(&doc! {"u": 1}, Some("u_unique"), true).expect("spec"),
        ]
    }

    /// One by one, as the checkpoint loader did before.
    fn one_by_one(docs: &[DocRef], specs: Vec<IndexSpec>) -> Result<CollectionState> {
        let mut c = CollectionState::new("t.c", Default::default());
        for d in docs {
            let id = doc::id_of(d).expect("_id").into();
            c.insert(d.clone(), id)?;
        }
        for spec in specs {
            c.create_index(spec)?;
        }
        Ok(c)
    }

    /// The bulk-built collection equals the one built insert by insert:
    /// records, `_id` index, every secondary index (entries and multikey),
    /// sizes; and it keeps every invariant.
    #[test]
    fn bulk_load_equals_inserts_then_index_builds() {
        let docs = docs(1009);
        let bulk = load_collection("t.c", Default::default(), docs.clone(), specs(), none())
            .expect("bulk")
            .0;
        let slow = one_by_one(&docs, specs()).expect("slow");
        bulk.check_invariants().expect("invariants");
        assert_eq!(bulk.len(), slow.len());
        assert_eq!(bulk.next_rid, slow.next_rid);
        assert_eq!(bulk.data_bytes, slow.data_bytes);
        assert_eq!(bulk.id_index, slow.id_index);
        assert!(bulk.heap.iter().eq(slow.heap.iter()));
        assert_eq!(bulk.indexes.len(), 3);
        for (b, s) in bulk.indexes.iter().zip(&slow.indexes) {
            assert_eq!(b.spec, s.spec);
            assert_eq!(b.multikey, s.multikey);
            assert_eq!(b.tree, s.tree);
            b.tree.check_invariants();
        }
        assert!(bulk.indexes[1].multikey);
    }

    /// Duplicates fail as the insert path does (11000), on `_id` (by
    /// MongoDB equality: 1 and 1.0) and on a unique index; conflicting
    /// specs fail as `create_index` does.
    #[test]
    fn duplicates_and_conflicts_fail_whole() {
        let twice = vec![
            Arc::new(rawdoc! {"_id": 1, "u": 1}),
            Arc::new(rawdoc! {"_id": 1.0, "u": 2}),
        ];
        let e =
            load_collection("t.c", Default::default(), twice, vec![], none()).expect_err("dup _id");
        assert_eq!(e.code(), 11000);
        let dup_u = vec![
            Arc::new(rawdoc! {"_id": 1, "u": 1}),
            Arc::new(rawdoc! {"_id": 2, "u": 1}),
        ];
        let e = load_collection("t.c", Default::default(), dup_u.clone(), specs(), none())
            .expect_err("dup u");
        assert_eq!(e.code(), 11000);
        assert_eq!(
            e.code(),
            one_by_one(&dup_u, specs()).expect_err("slow").code()
        );
        let same_name = vec![
            IndexSpec::new(&doc! {"a": 1}, Some("x"), false).expect("spec"),
            IndexSpec::new(&doc! {"b": 1}, Some("x"), false).expect("spec"),
        ];
        let e = load_collection(
            "t.c",
            Default::default(),
            docs(10),
            same_name.clone(),
            none(),
        )
        .expect_err("conflict");
        assert_eq!(
            e.code(),
            one_by_one(&docs(10), same_name).expect_err("slow").code()
        );
        let no_id = vec![Arc::new(rawdoc! {"u": 1})];
        assert!(load_collection("t.c", Default::default(), no_id, vec![], none()).is_err());
    }

    fn none() -> StoredOrders {
        StoredOrders::default()
    }

    /// The stored order of each secondary index of `c` (record id =
    /// position, as `one_by_one` numbers them), and of its `_id` index.
    fn orders_of(c: &CollectionState) -> StoredOrders {
        StoredOrders {
            id: Some(c.id_index.iter().map(|(_, rid)| *rid as u32).collect()),
            indexes: c
                .indexes
                .iter()
                .map(|i| Some(i.tree.iter().map(|((_, rid), ())| *rid as u32).collect()))
                .collect(),
        }
    }

    fn counts(stored: u32, sorted: u32, ids_stored: u32, ids_sorted: u32) -> OrderCounts {
        OrderCounts {
            stored,
            sorted,
            ids_stored,
            ids_sorted,
        }
    }

    /// With the stored orders every index is built without a sort and
    /// equals the one built insert by insert (multikey records included:
    /// `tags` has records with 0, 1 and 2 keys).
    #[test]
    fn stored_orders_build_without_sorting() {
        let docs = docs(1009);
        let slow = one_by_one(&docs, specs()).expect("slow");
        let (bulk, how) =
            load_collection("t.c", Default::default(), docs, specs(), orders_of(&slow))
                .expect("bulk");
        assert_eq!(how, counts(3, 0, 1, 0));
        bulk.check_invariants().expect("invariants");
        assert_eq!(bulk.id_index, slow.id_index);
        for (b, s) in bulk.indexes.iter().zip(&slow.indexes) {
            assert_eq!(b.multikey, s.multikey);
            assert_eq!(b.tree, s.tree);
            b.tree.check_invariants();
        }
    }

    /// An order that does not fit the documents is ignored, never trusted:
    /// out of key order, an entry placed twice (and one never), too short,
    /// a position past the records — each index is then sorted and the
    /// result is the same.
    #[test]
    fn an_order_that_does_not_fit_is_sorted_instead() {
        let docs = docs(1009);
        let slow = one_by_one(&docs, specs()).expect("slow");
        let good = orders_of(&slow);
        let mut bad = good.clone();
        // `a_1_s_-1`: two neighbours of different records swapped.
        let o = bad.indexes[0].as_mut().expect("order");
        let i = (0..o.len() - 1)
            .find(|&i| o[i] != o[i + 1])
            .expect("two records");
        o.swap(i, i + 1);
        // `tags_1`: a record placed once more, the last entry's dropped.
        let o = bad.indexes[1].as_mut().expect("order");
        let last = o.len() - 1;
        o[last] = o[0];
        // `u_unique`: one entry short.
        bad.indexes[2].as_mut().expect("order").pop();
        let (bulk, how) =
            load_collection("t.c", Default::default(), docs.clone(), specs(), bad).expect("bulk");
        assert_eq!(how, counts(0, 3, 1, 0));
        for (b, s) in bulk.indexes.iter().zip(&slow.indexes) {
            assert_eq!(b.tree, s.tree);
        }
        let mut past = good;
        if let Some(o) = past.indexes[2].as_mut() {
            o[0] = 5000;
        }
        let (bulk, how) =
            load_collection("t.c", Default::default(), docs, specs(), past).expect("bulk");
        assert_eq!(how, counts(2, 1, 1, 0));
        assert_eq!(bulk.indexes[2].tree, slow.indexes[2].tree);
    }

    /// A duplicate of a unique index fails with the stored order as without.
    #[test]
    fn a_duplicate_fails_with_a_stored_order() {
        let dup_u = vec![
            Arc::new(rawdoc! {"_id": 1, "u": 1}),
            Arc::new(rawdoc! {"_id": 2, "u": 1}),
        ];
        let orders = StoredOrders {
            id: Some(vec![0, 1]),
            indexes: vec![Some(vec![]), Some(vec![]), Some(vec![0, 1])],
        };
        let e =
            load_collection("t.c", Default::default(), dup_u, specs(), orders).expect_err("dup u");
        assert_eq!(e.code(), 11000);
    }

    /// An `_id` order that does not fit is ignored, never trusted: two
    /// neighbours swapped (out of `_id` order), a record placed twice (and
    /// one never), one short, a position past the records — the ids are
    /// then sorted and the `_id` index is the same. The secondary orders
    /// are used all the while (each order is judged on its own).
    #[test]
    fn an_id_order_that_does_not_fit_is_sorted_instead() {
        let docs = docs(1009);
        let slow = one_by_one(&docs, specs()).expect("slow");
        let good = orders_of(&slow);
        let id = good.id.clone().expect("order");
        let mut swapped = id.clone();
        swapped.swap(10, 11);
        let mut twice = id.clone();
        twice[0] = twice[1];
        let mut short = id.clone();
        short.pop();
        let mut past = id;
        past[5] = 1009;
        for (bad, why) in [
            (swapped, "swapped"),
            (twice, "twice"),
            (short, "short"),
            (past, "past"),
        ] {
            let orders = StoredOrders {
                id: Some(bad),
                ..good.clone()
            };
            let (bulk, how) =
                load_collection("t.c", Default::default(), docs.clone(), specs(), orders)
                    .expect("bulk");
            assert_eq!(how, counts(3, 0, 0, 1), "{why}");
            assert_eq!(bulk.id_index, slow.id_index, "{why}");
            bulk.check_invariants().expect("invariants");
        }
    }

    /// Duplicate ids fail with an `_id` order as without, naming the same
    /// key: by MongoDB equality 1 and 1.0 are one id, so an order holding
    /// them as neighbours is not strictly ascending and the ids are sorted
    /// from record order. A record without `_id` fails too.
    #[test]
    fn a_duplicate_id_fails_with_a_stored_order() {
        let twice = vec![
            Arc::new(rawdoc! {"_id": 2, "u": 1}),
            Arc::new(rawdoc! {"_id": 1.0, "u": 2}),
            Arc::new(rawdoc! {"_id": 1, "u": 3}),
        ];
        let without = load_collection("t.c", Default::default(), twice.clone(), vec![], none())
            .expect_err("dup _id");
        for order in [vec![1, 2, 0], vec![2, 1, 0]] {
            let orders = StoredOrders {
                id: Some(order),
                indexes: vec![],
            };
            let e = load_collection("t.c", Default::default(), twice.clone(), vec![], orders)
                .expect_err("dup _id");
            assert_eq!(e.code(), 11000);
            assert_eq!(e.to_string(), without.to_string());
        }
        let no_id = vec![Arc::new(rawdoc! {"_id": 1}), Arc::new(rawdoc! {"u": 1})];
        let orders = StoredOrders {
            id: Some(vec![0, 1]),
            indexes: vec![],
        };
        assert!(load_collection("t.c", Default::default(), no_id, vec![], orders).is_err());
    }
}
