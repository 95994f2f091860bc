//! A collection built at once from all its records (recovery loading a
//! checkpoint image): the heap, the `_id` index and every secondary index
//! are built side by side on scoped threads, each index bottom-up from its
//! sorted entries ([`BTree::from_sorted`]) instead of one insert per key.
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

/// The sorted entries of `spec` over `records` (record id = position) and
/// whether a key came from an array. A unique index's duplicate is
/// returned as the first key held twice.
///
/// Requires: nothing; a record whose keys cannot be formed is an error.
pub fn sorted_entries<'a>(
    spec: &IndexSpec,
    records: impl Iterator<Item = (RecordId, &'a DocRef)>,
    size_hint: usize,
) -> Result<(Vec<(IndexKey, RecordId)>, bool), SortedError> {
    let mut multikey = false;
    let mut entries: Vec<(IndexKey, RecordId)> = Vec::with_capacity(size_hint);
    for (rid, d) in records {
        let (keys, m) = spec.keys_for(d).map_err(SortedError::Key)?;
        multikey |= m;
        entries.extend(keys.into_iter().map(|k| (k, rid)));
    }
    entries.sort_unstable();
    if spec.unique {
        // A record's keys are distinct, so equal neighbours are two records.
        if let Some(w) = entries.windows(2).find(|w| w[0].0 == w[1].0) {
            return Err(SortedError::Duplicate(w[0].0.clone()));
        }
    }
    Ok((entries, multikey))
}

/// Why [`sorted_entries`] failed.
#[derive(Debug)]
pub enum SortedError {
    /// A record's keys could not be formed.
    Key(Error),
    /// A unique index would hold this key twice.
    Duplicate(IndexKey),
}

/// An index of `spec` over `records`, built from its sorted entries.
pub fn build_index<'a>(
    spec: Arc<IndexSpec>,
    records: impl Iterator<Item = (RecordId, &'a DocRef)>,
    size_hint: usize,
    usage: Arc<crate::store::index::IndexUsage>,
) -> Result<IndexState, SortedError> {
    let (entries, multikey) = sorted_entries(&spec, records, size_hint)?;
    let tree = BTree::from_sorted(entries.into_iter().map(|e| (e, ())).collect())
        .map_err(|_| SortedError::Key(not_sorted(&spec.name)))?;
    Ok(IndexState {
        spec,
        tree,
        multikey,
        usage,
    })
}

fn not_sorted(what: &str) -> Error {
    // Sorted and deduplicated just before: only a broken key order gets here.
    Error::Internal(format!("index {what}: sorted entries are not ascending"))
}

/// What one job built.
enum Built {
    Heap(Heap<DocRef>, u64),
    Id(BTree<ValueKey, RecordId>),
    Index(usize, IndexState),
}

/// The collection `ns` holding `docs` (record ids `0..n` in this order) with
/// the options and the secondary indexes of `specs` (in this order).
pub fn load_collection(
    ns: &str,
    options: CollectionOptions,
    docs: Vec<DocRef>,
    specs: Vec<IndexSpec>,
) -> Result<CollectionState> {
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
            1 => {
                let mut ids = Vec::with_capacity(n);
                for (rid, d) in records() {
                    let id: RawBson = doc::id_of(d)
                        .ok_or_else(|| Error::Internal(format!("record {rid} has no _id")))?
                        .into();
                    ids.push((ValueKey(id), rid));
                }
                ids.sort_unstable_by(|a, b| a.0.cmp(&b.0));
                if let Some(w) = ids.windows(2).find(|w| w[0].0 == w[1].0) {
                    return Err(proto.dup_id_error(&w[0].0 .0));
                }
                BTree::from_sorted(ids)
                    .map(Built::Id)
                    .map_err(|_| not_sorted("_id_"))
            }
            j => {
                let at = j - 2;
                let index = &proto.indexes[at];
                build_index(index.spec.clone(), records(), n, index.usage.clone())
                    .map(|built| Built::Index(at, built))
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
    for out in results {
        seen += 1;
        match out? {
            Built::Heap(heap, bytes) => {
                c.heap = heap;
                c.data_bytes = bytes;
            }
            Built::Id(tree) => c.id_index = tree,
            Built::Index(at, index) => c.indexes[at] = index,
        }
    }
    if seen != jobs {
        return Err(Error::Internal(format!(
            "a bulk load finished {seen} of {jobs} jobs"
        )));
    }
    c.next_rid = n as RecordId;
    Ok(c)
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
        let bulk = load_collection("t.c", Default::default(), docs.clone(), specs()).expect("bulk");
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
        let e = load_collection("t.c", Default::default(), twice, vec![]).expect_err("dup _id");
        assert_eq!(e.code(), 11000);
        let dup_u = vec![
            Arc::new(rawdoc! {"_id": 1, "u": 1}),
            Arc::new(rawdoc! {"_id": 2, "u": 1}),
        ];
        let e =
            load_collection("t.c", Default::default(), dup_u.clone(), specs()).expect_err("dup u");
        assert_eq!(e.code(), 11000);
        assert_eq!(
            e.code(),
            one_by_one(&dup_u, specs()).expect_err("slow").code()
        );
        let same_name = vec![
            IndexSpec::new(&doc! {"a": 1}, Some("x"), false).expect("spec"),
            IndexSpec::new(&doc! {"b": 1}, Some("x"), false).expect("spec"),
        ];
        let e = load_collection("t.c", Default::default(), docs(10), same_name.clone())
            .expect_err("conflict");
        assert_eq!(
            e.code(),
            one_by_one(&docs(10), same_name).expect_err("slow").code()
        );
        let no_id = vec![Arc::new(rawdoc! {"u": 1})];
        assert!(load_collection("t.c", Default::default(), no_id, vec![]).is_err());
    }
}
