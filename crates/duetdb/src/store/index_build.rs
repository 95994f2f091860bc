//! An index built outside the writer (MongoDB's hybrid index build, on our
//! copy-on-write versions): scanned from one published version of a
//! collection (immutable, so no lock is needed), brought up to date with later
//! versions by diffing their record heaps, and finally added to the writer's
//! working version by one short step that catches up the last few changes.
//!
//! The catch-up needs no side log kept by the writer: record ids are never
//! reused within a collection (see `Fingerprint`), and the heap is a
//! persistent tree, so the records changed between two versions are exactly
//! the slots whose values differ, found by walking only the subtrees the two
//! versions do not share ([`Heap::diff`]).
//!
//! Invariants:
//! - `index` holds exactly the keys of the records of `base` (the version it
//!   reflects), as [`CollectionState::create_index`] would have built them;
//! - a build only ever follows versions of one collection (the same VLS
//!   bookkeeping, i.e. not dropped and recreated): another identity is 276
//!   IndexBuildAborted;
//! - a unique build fails with 11000 at the first version it reflects that
//!   holds a duplicate (the snapshot, a catch-up, or the final step), and a
//!   failed build leaves nothing behind: it never touched the collection.

use std::sync::atomic::{AtomicU64, AtomicU8, Ordering};
use std::sync::Arc;

use crate::doc::DocRef;
use crate::error::{Error, Result};
use crate::store::btree::BTree;
use crate::store::collection::CollectionState;
use crate::store::heap::{Heap, RecordId};
use crate::store::index::{IndexKey, IndexSpec, IndexState};
use crate::store::vls::CollectionVls;

/// Records scanned (or changes applied) between two cancellation checks and
/// progress updates.
const CHECK_EVERY: u64 = 256;

/// What a build is doing, as `currentOp` shows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BuildPhase {
    Waiting = 0,
    /// Reading the snapshot (`done`/`total` records).
    Scanning = 1,
    /// Applying the writes committed since (`done`/`total` changed records).
    CatchingUp = 2,
    /// The final step inside the writer.
    Committing = 3,
}

/// Progress of one build, shared with whoever shows it (`currentOp`).
#[derive(Debug, Default)]
pub struct IndexBuildProgress {
    phase: AtomicU8,
    done: AtomicU64,
    total: AtomicU64,
}

impl IndexBuildProgress {
    pub fn new() -> Arc<IndexBuildProgress> {
        Arc::new(IndexBuildProgress::default())
    }

    fn set(&self, phase: BuildPhase, done: u64, total: u64) {
        self.phase.store(phase as u8, Ordering::Relaxed);
        self.total.store(total, Ordering::Relaxed);
        self.done.store(done, Ordering::Relaxed);
    }

    fn advance(&self, done: u64) {
        self.done.store(done, Ordering::Relaxed);
    }

    /// The phase and its `(done, total)`.
    pub fn get(&self) -> (BuildPhase, u64, u64) {
        let phase = match self.phase.load(Ordering::Relaxed) {
            1 => BuildPhase::Scanning,
            2 => BuildPhase::CatchingUp,
            3 => BuildPhase::Committing,
            _ => BuildPhase::Waiting,
        };
        (
            phase,
            self.done.load(Ordering::Relaxed),
            self.total.load(Ordering::Relaxed),
        )
    }

    /// MongoDB's `currentOp` message for the phase, e.g. `Index Build:
    /// scanning collection: 5000/10000 50%`.
    pub fn message(&self) -> String {
        let (phase, done, total) = self.get();
        let what = match phase {
            BuildPhase::Waiting => return "Index Build: waiting".to_string(),
            BuildPhase::Scanning => "Index Build: scanning collection",
            BuildPhase::CatchingUp => "Index Build: draining writes received during build",
            BuildPhase::Committing => return "Index Build: committing".to_string(),
        };
        let pct = (done * 100).checked_div(total).unwrap_or(100);
        format!("{what}: {done}/{total} {pct}%")
    }
}

/// An index being built outside the writer.
pub struct IndexBuild {
    index: IndexState,
    /// The records `index` reflects.
    base: Heap<DocRef>,
    /// The identity of the collection built on.
    vls: Arc<CollectionVls>,
    progress: Arc<IndexBuildProgress>,
}

impl std::fmt::Debug for IndexBuild {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IndexBuild")
            .field("index", &self.index.spec.name)
            .field("entries", &self.index.tree.len())
            .finish()
    }
}

impl IndexBuild {
    /// Build `spec` over the records of `from` (a published, immutable
    /// version). `check` is called every few hundred records and stops the
    /// build with its error (cancellation, an abort).
    pub fn scan(
        spec: IndexSpec,
        from: &CollectionState,
        progress: Arc<IndexBuildProgress>,
        check: &mut dyn FnMut() -> Result<()>,
    ) -> Result<IndexBuild> {
        let mut index = IndexState::new(spec);
        let total = from.len() as u64;
        progress.set(BuildPhase::Scanning, 0, total);
        // Keys are collected and sorted first: the tree is then built bottom-up,
        // and duplicates of a unique index are neighbours.
        let mut entries: Vec<(IndexKey, RecordId)> = Vec::with_capacity(from.len());
        for (n, (rid, doc)) in from.heap.iter().enumerate() {
            if (n as u64).is_multiple_of(CHECK_EVERY) {
                check()?;
                progress.advance(n as u64);
            }
            let (keys, multikey) = index.spec.keys_for(doc)?;
            index.multikey |= multikey;
            entries.extend(keys.into_iter().map(|k| (k, rid)));
        }
        progress.advance(total);
        check()?;
        entries.sort_unstable();
        if index.spec.unique {
            // A record's keys are distinct, so equal neighbours are two records.
            if let Some(w) = entries.windows(2).find(|w| w[0].0 == w[1].0) {
                return Err(from.dup_key_error(&index, &w[0].0));
            }
        }
        check()?;
        // Bottom-up from the sorted entries: one move per entry.
        index.tree = BTree::from_sorted(entries.into_iter().map(|e| (e, ())).collect())
            .map_err(|_| Error::Internal("index build: sorted entries are not ascending".into()))?;
        Ok(IndexBuild {
            index,
            base: from.heap.clone(),
            vls: from.vls.clone(),
            progress,
        })
    }

    /// Bring the index up to date with `to`, a later version of the same
    /// collection; returns how many records changed since the last version
    /// the index reflected. After an error the build is unusable (drop it).
    pub fn catch_up(
        &mut self,
        to: &CollectionState,
        check: &mut dyn FnMut() -> Result<()>,
    ) -> Result<usize> {
        if !Arc::ptr_eq(&self.vls, &to.vls) {
            return Err(Error::IndexBuildAborted(format!(
                "Index build aborted: {}: collection {} was dropped or replaced during the build",
                self.index.spec.name, to.ns
            )));
        }
        let mut changes: Vec<(RecordId, Option<DocRef>, Option<DocRef>)> = Vec::new();
        self.base
            .diff(&to.heap, &|a, b| Arc::ptr_eq(a, b), &mut |rid, old, new| {
                changes.push((rid, old.cloned(), new.cloned()))
            });
        let total = changes.len() as u64;
        self.progress.set(BuildPhase::CatchingUp, 0, total * 2);
        // Every old key first, then every new one: in between the index
        // holds the unchanged records only, so a new key that finds a holder
        // is a duplicate in `to` itself, not a transient of the replay order.
        for (n, (rid, old, _)) in changes.iter().enumerate() {
            if (n as u64).is_multiple_of(CHECK_EVERY) {
                check()?;
                self.progress.advance(n as u64);
            }
            if let Some(old) = old {
                for k in self.index.spec.keys_for(old)?.0 {
                    self.index.tree.remove(&(k, *rid));
                }
            }
        }
        for (n, (rid, _, new)) in changes.iter().enumerate() {
            if (n as u64).is_multiple_of(CHECK_EVERY) {
                check()?;
                self.progress.advance(total + n as u64);
            }
            if let Some(new) = new {
                let (keys, multikey) = self.index.spec.keys_for(new)?;
                self.index.multikey |= multikey;
                for k in keys {
                    if self.index.spec.unique && self.index.holder_of(&k, Some(*rid)).is_some() {
                        return Err(to.dup_key_error(&self.index, &k));
                    }
                    self.index.tree.insert((k, *rid), ());
                }
            }
        }
        self.progress.advance(total * 2);
        self.base = to.heap.clone();
        Ok(changes.len())
    }

    /// The final step, inside the writer: catch up with `into` (the
    /// working version) and add the index to it. `Ok(false)` (nothing
    /// changed) when an identical index appeared meanwhile; a conflicting
    /// one, a duplicate or another collection is an error that leaves
    /// `into` unchanged.
    pub fn finish(mut self, into: &mut CollectionState) -> Result<bool> {
        self.progress.set(BuildPhase::Committing, 0, 0);
        if !into.check_new_index(&self.index.spec)? {
            return Ok(false);
        }
        self.catch_up(into, &mut || Ok(()))?;
        into.indexes.push(self.index);
        Ok(true)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::vls::VlsOptions;
    use bson::{doc, rawdoc, RawBson};

    fn insert(c: &mut CollectionState, id: i32, a: i32) -> RecordId {
        c.insert(Arc::new(rawdoc! {"_id": id, "a": a}), RawBson::Int32(id))
            .expect("insert")
    }

    /// A build over a snapshot, caught up with inserts, updates and
    /// deletes made after it, equals the index built in place.
    #[test]
    fn built_then_caught_up_equals_a_fresh_build() {
        let mut c = CollectionState::new("t.c", VlsOptions::default());
        for i in 0..500 {
            insert(&mut c, i, i % 7);
        }
        let snapshot = c.clone();
        let spec = IndexSpec::new(&doc! {"a": 1}, None, false).expect("spec");
        let mut build = IndexBuild::scan(
            spec.clone(),
            &snapshot,
            IndexBuildProgress::new(),
            &mut || Ok(()),
        )
        .expect("scan");
        for i in 500..600 {
            insert(&mut c, i, i % 5);
        }
        for rid in (0..600).step_by(3) {
            let id = rid as i32;
            c.replace(rid, Arc::new(rawdoc! {"_id": id, "a": -id}))
                .expect("replace");
        }
        for rid in (0..600).step_by(11) {
            c.delete(rid).expect("delete");
        }
        let middle = c.clone();
        assert!(build.catch_up(&middle, &mut || Ok(())).expect("catch up") > 0);
        insert(&mut c, 1000, 1);
        c.delete(1).expect("delete");
        let mut fresh = c.clone();
        assert!(build.finish(&mut c).expect("finish"));
        fresh.create_index(spec).expect("fresh");
        assert_eq!(c.indexes[0].tree, fresh.indexes[0].tree);
        c.check_invariants().expect("invariants");
    }

    /// A duplicate written during a unique build fails it at the catch-up;
    /// an index of another collection with the same name is an abort.
    #[test]
    fn unique_duplicate_in_catch_up_fails_and_identity_is_checked() {
        let mut c = CollectionState::new("t.c", VlsOptions::default());
        for i in 0..50 {
            insert(&mut c, i, i);
        }
        let spec = IndexSpec::new(&doc! {"a": 1}, None, true).expect("spec");
        let build = IndexBuild::scan(spec.clone(), &c, IndexBuildProgress::new(), &mut || Ok(()))
            .expect("scan");
        insert(&mut c, 100, 3);
        let before = c.fingerprint();
        let e = build.finish(&mut c).expect_err("duplicate");
        assert_eq!(e.code(), 11000);
        assert!(before.unchanged_by_failure(&c.fingerprint()));

        let build = IndexBuild::scan(spec, &c, IndexBuildProgress::new(), &mut || Ok(()));
        assert_eq!(build.expect_err("dup in snapshot").code(), 11000);

        let spec = IndexSpec::new(&doc! {"a": 1}, None, false).expect("spec");
        let build =
            IndexBuild::scan(spec, &c, IndexBuildProgress::new(), &mut || Ok(())).expect("scan");
        let mut other = CollectionState::new("t.c", VlsOptions::default());
        assert_eq!(build.finish(&mut other).expect_err("other").code(), 276);
    }
}
