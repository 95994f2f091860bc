//! Multi-document transactions on the single writer: snapshot isolation and
//! serializable.
//!
//! Owns the commit protocol ([`apply_commit`], run by the writer as one
//! boundary step) and what a transaction hands it ([`TxnCommit`]). The handle
//! (`Transaction`) and the retry loop are the API's (`api::transaction`).
//!
//! How it works (DStore §2–3, KVell+ §4.2, AnKer §3.1):
//! - `begin` takes the published root (`Database::snapshot`, O(1)). Every read
//!   runs on that root, overlaid with the transaction's own buffered writes
//!   (read-your-writes). Nothing is locked and nothing is written until commit.
//! - Writes are buffered as *final versions* per `(collection, _id)`, each with
//!   the version the snapshot had (`base`, `None` when absent).
//! - `commit` submits ONE writer command. The writer validates, then applies
//!   every buffered version through [`apply_writes`] — the one place that
//!   changes stored state, so effect recording (WAL) belongs there — all at one
//!   csn, or returns an error having changed nothing.
//!
//! Invariants:
//! - a committed transaction's writes become visible at one csn together, and
//!   a failed commit leaves the state exactly as it found it (undo list);
//! - `snapshot` (first committer wins): for every written `_id` the latest
//!   version at commit is the *same allocation* (`Arc::ptr_eq`) as the base the
//!   snapshot had, or absent in both. Every update stores a new `Arc`, and the
//!   transaction holds its snapshot (so the base stays allocated and its
//!   address cannot be reused): pointer identity is version identity;
//! - `serializable` additionally re-validates every read at commit: point
//!   reads by version identity, predicate reads (find/count/update filters) by
//!   re-running the filter on the latest state and comparing the matched
//!   `(record, version)` sets, the transaction's own written `_id`s excluded on
//!   both sides (those are validated as writes). A writing transaction that
//!   commits thus read exactly what it would have read at its commit point:
//!   committed serializable transactions are serializable in commit order
//!   (precision locking, checked after the fact instead of with locks).
//! - a read-only transaction needs no validation at any level: it read one
//!   committed prefix of the commit order, so it serializes at its snapshot.
//! - unique indexes and `_id` uniqueness are checked at commit against the
//!   latest state (DuplicateKey, nothing changed).
//!
//! Debug builds assert the outcome of every commit ([`apply_commit`]): after
//! a successful one each written `_id` holds exactly its committed version
//! (or is absent, for a delete); after a failed one each holds the version
//! it held before and the written collections are as they were.
//!
//! Limits: lifetime (default 60 s, `None` = unlimited; checked at every
//! operation and at commit: error 290, then the handle is dead: 251) and the
//! write set (at most [`MAX_TXN_DOCS`] documents and [`MAX_TXN_BYTES`] bytes of
//! new versions: error 257). An abandoned handle pins its snapshot until it is
//! dropped; the lifetime is enforced lazily, not by a reaper.

use std::collections::BTreeMap;
use std::ops::ControlFlow;
use std::sync::Arc;
use std::time::Duration;

use bson::raw::RawDocumentBuf;
use bson::{Bson, RawBson};

use crate::doc::{self, DocRef};
use crate::durability::effect::{Effect, Effects};
use crate::error::{Error, Result};
use crate::query::planner;
use crate::query::Filter;
use crate::store::collection::CollectionState;
use crate::store::heap::RecordId;
use crate::store::index::ValueKey;
use crate::store::DbState;
use crate::write::command::MAX_WRITE_BATCH;

/// Most documents one transaction may write (as MongoDB's write batch).
pub const MAX_TXN_DOCS: usize = MAX_WRITE_BATCH;
/// Most bytes of new document versions one transaction may buffer (4 × 16 MiB).
pub const MAX_TXN_BYTES: usize = 4 * doc::MAX_DOC_SIZE;
/// Default lifetime of a transaction (MongoDB's transactionLifetimeLimitSeconds).
pub const DEFAULT_LIFETIME: Duration = Duration::from_secs(60);
/// Default attempts of [`Database::transaction`] before a conflict is returned.
pub const DEFAULT_MAX_ATTEMPTS: u32 = 10;

/// Isolation level of a transaction.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Isolation {
    /// Snapshot isolation, first committer wins (MongoDB's `snapshot`).
    #[default]
    Snapshot,
    /// Snapshot isolation plus validation of reads at commit: no write skew.
    Serializable,
}

/// A deliberately broken commit, for proving that the checkers catch bugs.
#[doc(hidden)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum PlantedBug {
    #[default]
    None,
    /// Validate nothing at commit (lost updates become possible).
    SkipValidation,
    /// Validate writes only (serializable degrades to snapshot isolation).
    SkipReadValidation,
}

/// Options of a transaction.
#[derive(Debug, Clone, Copy)]
pub struct TxnOptions {
    pub isolation: Isolation,
    /// Lifetime limit from `begin`; `None` = unlimited.
    pub lifetime: Option<Duration>,
    /// Attempts of [`Database::transaction_with`] on write conflicts (≥ 1).
    pub max_attempts: u32,
    #[doc(hidden)]
    #[cfg(feature = "testing")]
    pub planted_bug: PlantedBug,
}

impl Default for TxnOptions {
    fn default() -> Self {
        TxnOptions {
            isolation: Isolation::Snapshot,
            lifetime: Some(DEFAULT_LIFETIME),
            max_attempts: DEFAULT_MAX_ATTEMPTS,
            #[cfg(feature = "testing")]
            planted_bug: PlantedBug::None,
        }
    }
}

impl TxnOptions {
    /// The planted bug (always none without the `testing` feature).
    pub(crate) fn planted_bug(&self) -> PlantedBug {
        #[cfg(feature = "testing")]
        return self.planted_bug;
        #[cfg(not(feature = "testing"))]
        PlantedBug::None
    }
}

impl TxnOptions {
    pub fn serializable() -> TxnOptions {
        TxnOptions {
            isolation: Isolation::Serializable,
            ..Default::default()
        }
    }
}

/// A buffered write: the final version of one `_id` and what the snapshot had.
#[derive(Debug, Clone)]
pub(crate) struct Pending {
    /// The version in the transaction's snapshot (`None`: absent there).
    pub(crate) base: Option<DocRef>,
    /// The version to commit (`None`: delete).
    pub(crate) new: Option<DocRef>,
    /// When this `_id` was first written in the transaction (0, 1, ...):
    /// change events report the commit's writes in this order.
    pub(crate) seq: usize,
}

pub(crate) type WriteSet = BTreeMap<String, BTreeMap<ValueKey, Pending>>;

#[derive(Debug, Clone)]
pub(crate) struct PointRead {
    pub(crate) coll: String,
    pub(crate) id: ValueKey,
    pub(crate) seen: Option<DocRef>,
}

#[derive(Debug, Clone)]
pub(crate) struct PredicateRead {
    pub(crate) coll: String,
    pub(crate) filter: Filter,
    /// Everything the filter matched in the snapshot (own writes not excluded
    /// yet: the write set may still grow).
    pub(crate) matched: Vec<(RecordId, DocRef)>,
}

/// What a transaction hands the writer at commit.
pub struct TxnCommit {
    pub(crate) snapshot: Arc<DbState>,
    pub(crate) isolation: Isolation,
    pub(crate) writes: WriteSet,
    pub(crate) point_reads: Vec<PointRead>,
    pub(crate) predicate_reads: Vec<PredicateRead>,
    /// Collections read as a whole (a `$text` read, which keeps no record of
    /// what it matched): under serializable, any commit since the snapshot
    /// that changed one of them fails this commit.
    pub(crate) collection_reads: Vec<String>,
    pub(crate) planted_bug: PlantedBug,
    /// Opaque metadata of the committing client for change events
    /// (the server's `{lsid, txnNumber}`).
    pub(crate) origin: Option<Arc<RawDocumentBuf>>,
}

impl std::fmt::Debug for TxnCommit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TxnCommit")
            .field("snapshot_csn", &self.snapshot.csn)
            .field("isolation", &self.isolation)
            .field(
                "writes",
                &self.writes.values().map(|w| w.len()).sum::<usize>(),
            )
            .field("point_reads", &self.point_reads.len())
            .field("predicate_reads", &self.predicate_reads.len())
            .field("collection_reads", &self.collection_reads)
            .finish()
    }
}

/// What a commit changed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CommitOutcome {
    pub inserted: u64,
    pub updated: u64,
    pub deleted: u64,
}

/// A successful commit.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CommitInfo {
    /// The csn the writes became visible at; for a read-only transaction, the
    /// csn of its snapshot (where it serializes).
    pub csn: u64,
    /// The csn of the snapshot the transaction read.
    pub snapshot_csn: u64,
    pub outcome: CommitOutcome,
}

fn same_version(a: Option<&DocRef>, b: Option<&DocRef>) -> bool {
    match (a, b) {
        (Some(a), Some(b)) => Arc::ptr_eq(a, b),
        (None, None) => true,
        _ => false,
    }
}

fn latest_version<'s>(state: &'s DbState, coll: &str, id: &ValueKey) -> Option<&'s DocRef> {
    let c = state.collection(coll)?;
    c.get(*c.id_index.get(id)?)
}

fn conflict(state: &DbState, coll: &str, id: &ValueKey, what: &str) -> Error {
    let id = Bson::try_from(id.to_raw()).unwrap_or(Bson::Null);
    Error::WriteConflict(format!(
        "{what} {}.{coll} _id {} was changed by a commit after the transaction's snapshot",
        state.db,
        crate::error::render(&id)
    ))
}

/// The writer's side of a commit (a boundary step): validate
/// against the latest state, then apply all writes, or change nothing.
pub fn apply_commit(
    state: &mut DbState,
    fx: &mut Effects,
    commit: TxnCommit,
) -> Result<CommitOutcome> {
    if commit.planted_bug != PlantedBug::SkipValidation {
        validate_writes(state, &commit.writes)?;
        if commit.isolation == Isolation::Serializable
            && commit.planted_bug != PlantedBug::SkipReadValidation
        {
            validate_reads(state, &commit)?;
        }
    }
    #[cfg(debug_assertions)]
    let before = WrittenBefore::capture(state, &commit.writes);
    let applied = apply_writes(state, fx, &commit.writes, commit.origin.as_ref());
    #[cfg(debug_assertions)]
    match &applied {
        Ok(_) => assert_committed(state, &commit.writes),
        Err(_) => before.assert_restored(state),
    }
    applied
}

/// A commit that returned `Ok` left every written `_id` holding the version
/// the transaction committed (the same allocation), or absent for a delete.
#[cfg(debug_assertions)]
fn assert_committed(state: &DbState, writes: &WriteSet) {
    for (coll, w) in writes {
        for (id, p) in w {
            assert!(
                same_version(latest_version(state, coll, id), p.new.as_ref()),
                "after a commit {coll} _id {:?} does not hold the committed version",
                id
            );
        }
    }
}

/// What the written `_id`s and their collections held before a commit, to
/// check that a failed commit put everything back. O(writes).
#[cfg(debug_assertions)]
struct WrittenBefore {
    colls: Vec<(String, Option<crate::store::collection::Fingerprint>)>,
    versions: Vec<(String, ValueKey, Option<DocRef>)>,
}

#[cfg(debug_assertions)]
impl WrittenBefore {
    fn capture(state: &DbState, writes: &WriteSet) -> WrittenBefore {
        let mut colls = Vec::new();
        let mut versions = Vec::new();
        for (coll, w) in writes {
            colls.push((
                coll.clone(),
                state.collection(coll).map(|c| c.fingerprint()),
            ));
            for id in w.keys() {
                let v = latest_version(state, coll, id).cloned();
                versions.push((coll.clone(), id.clone(), v));
            }
        }
        WrittenBefore { colls, versions }
    }

    /// A failed commit restored the state: the same versions (undoing a
    /// delete re-inserts the same allocation), the same collection summaries.
    fn assert_restored(&self, state: &DbState) {
        for (coll, id, v) in &self.versions {
            assert!(
                same_version(latest_version(state, coll, id), v.as_ref()),
                "a failed commit left {coll} _id {:?} changed",
                id
            );
        }
        for (coll, f) in &self.colls {
            let now = state.collection(coll).map(|c| c.fingerprint());
            let restored = match (f, &now) {
                (Some(a), Some(b)) => a.unchanged_by_failure(b),
                (None, None) => true,
                _ => false,
            };
            assert!(
                restored,
                "a failed commit changed collection {coll}: {f:?} -> {now:?}"
            );
        }
    }
}

/// First committer wins: every written `_id` must still hold the version the
/// snapshot had.
fn validate_writes(state: &DbState, writes: &WriteSet) -> Result<()> {
    for (coll, w) in writes {
        for (id, p) in w {
            if !same_version(latest_version(state, coll, id), p.base.as_ref()) {
                return Err(conflict(state, coll, id, "document"));
            }
        }
    }
    Ok(())
}

/// Serializable: every point read still sees the same version, every
/// collection read as a whole is unchanged, and every predicate still
/// matches the same `(record, version)` set, own writes aside.
fn validate_reads(state: &DbState, commit: &TxnCommit) -> Result<()> {
    for r in &commit.point_reads {
        if !same_version(latest_version(state, &r.coll, &r.id), r.seen.as_ref()) {
            return Err(conflict(state, &r.coll, &r.id, "read of"));
        }
    }
    for coll in &commit.collection_reads {
        let unchanged = match (commit.snapshot.collection(coll), state.collection(coll)) {
            (Some(a), Some(b)) => a.heap.same_root(&b.heap),
            (None, None) => true,
            _ => false,
        };
        if !unchanged {
            return Err(Error::WriteConflict(format!(
                "a $text query on {}.{} read by this serializable transaction: \
                 the collection changed after its snapshot",
                state.db, coll
            )));
        }
    }
    let no_writes = BTreeMap::new();
    for r in &commit.predicate_reads {
        let (then, now) = (
            commit.snapshot.collection(&r.coll),
            state.collection(&r.coll),
        );
        let unchanged = match (then, now) {
            (Some(a), Some(b)) => a.heap.same_root(&b.heap),
            (None, None) => true,
            _ => false,
        };
        if unchanged {
            continue; // no record of the collection changed since the snapshot
        }
        let own = commit.writes.get(&r.coll).unwrap_or(&no_writes);
        let is_own = |d: &DocRef| {
            !own.is_empty() && doc::id_of(d).is_some_and(|id| own.contains_key(&ValueKey::from(id)))
        };
        let mut before: Vec<(RecordId, usize)> = r
            .matched
            .iter()
            .filter(|(_, d)| !is_own(d))
            .map(|(rid, d)| (*rid, Arc::as_ptr(d) as usize))
            .collect();
        let mut after: Vec<(RecordId, usize)> = Vec::with_capacity(before.len());
        if let Some(c) = now {
            let plan = planner::plan(c, &r.filter, None, None)?;
            planner::execute(c, &plan, &r.filter, |rid, d| {
                if !is_own(d) {
                    after.push((rid, Arc::as_ptr(d) as usize));
                }
                ControlFlow::Continue(())
            })?;
        }
        before.sort_unstable();
        after.sort_unstable();
        if before != after {
            return Err(Error::WriteConflict(format!(
                "a query on {}.{} read by this serializable transaction matches \
                 different documents after commits made since its snapshot",
                state.db, r.coll
            )));
        }
    }
    Ok(())
}

/// How to put back one applied write.
enum Undo {
    CreatedCollection(String),
    Inserted(String, RecordId),
    Replaced(String, RecordId, DocRef),
    Deleted(String, DocRef, RawBson),
}

/// Apply every buffered write (validated) to `state` — the one place a
/// transaction changes stored state (effect recording for the WAL goes here).
/// Per collection: deletes first (so a key freed by a delete may be taken by
/// an insert or update of the same transaction), then replacements, then
/// inserts; the recorded effects are then put in statement order (each
/// `_id`'s first write, `Pending::seq`), which is what change streams report
/// and what replay may rely on too: the effects touch distinct `_id`s, and
/// replay checks no unique index. A failure (a unique-index violation) undoes what was applied, in
/// reverse, and returns the error: nothing changed. Undoing a delete
/// re-inserts the same document under a fresh record id (ids are never
/// reused), which readers cannot tell apart.
fn apply_writes(
    state: &mut DbState,
    fx: &mut Effects,
    writes: &WriteSet,
    origin: Option<&Arc<RawDocumentBuf>>,
) -> Result<CommitOutcome> {
    let mut undo: Vec<Undo> = Vec::new();
    let mut outcome = CommitOutcome::default();
    // Change streams see the commit's effects as one transaction, and
    // replay needs the block (its effects are in statement order: see
    // `effect::apply_all`); an engine transaction without origin gets an
    // empty one. The writer drops the markers with the rest if it fails.
    let marked = writes.values().any(|w| !w.is_empty());
    if marked {
        fx.record(|| Effect::TxnBegin {
            origin: origin
                .cloned()
                .unwrap_or_else(|| Arc::new(RawDocumentBuf::new())),
        });
    }
    let mark = fx.mark();
    let mut order: Vec<usize> = Vec::new();
    let result = apply_writes_inner(state, fx, writes, &mut undo, &mut outcome, &mut order);
    if result.is_ok() {
        fx.order_since(mark, &order);
        if marked {
            fx.record(|| Effect::TxnEnd);
        }
    }
    if let Err(e) = result {
        for u in undo.into_iter().rev() {
            let restored = match u {
                Undo::CreatedCollection(name) => {
                    Arc::make_mut(&mut state.collections).remove(&name);
                    Ok(())
                }
                Undo::Inserted(coll, rid) => with_coll(state, &coll, |c| c.delete(rid).map(|_| ())),
                Undo::Replaced(coll, rid, old) => with_coll(state, &coll, |c| c.replace(rid, old)),
                Undo::Deleted(coll, old, id) => {
                    with_coll(state, &coll, |c| c.insert(old, id).map(|_| ()))
                }
            };
            // Restoring versions that were consistent together cannot conflict.
            restored.map_err(|u| {
                Error::Internal(format!("undo of a failed transaction commit failed: {u}"))
            })?;
        }
        return Err(e);
    }
    Ok(outcome)
}

fn with_coll(
    state: &mut DbState,
    coll: &str,
    f: impl FnOnce(&mut CollectionState) -> Result<()>,
) -> Result<()> {
    let c = state
        .collection_mut(coll)
        .ok_or_else(|| Error::Internal(format!("collection {coll} vanished inside a commit")))?;
    f(c)
}

fn apply_writes_inner(
    state: &mut DbState,
    fx: &mut Effects,
    writes: &WriteSet,
    undo: &mut Vec<Undo>,
    outcome: &mut CommitOutcome,
    order: &mut Vec<usize>,
) -> Result<()> {
    for (coll, w) in writes {
        if state.collection(coll).is_none() {
            if w.values().all(|p| p.new.is_none()) {
                continue;
            }
            let ns = format!("{}.{coll}", state.db);
            let c = CollectionState::new(&ns, state.vls_options);
            Arc::make_mut(&mut state.collections).insert(coll.clone(), c);
            undo.push(Undo::CreatedCollection(coll.clone()));
        }
        let c = state.collection_mut(coll).ok_or_else(|| {
            Error::Internal(format!("collection {coll} vanished inside a commit"))
        })?;
        // Phase 1: deletes (cannot fail once validated).
        for (id, p) in w {
            if p.new.is_none() {
                if let Some(rid) = c.rid_of_key(id) {
                    let old = c.delete(rid)?;
                    let pre = c.options.pre_and_post_images.then(|| old.clone());
                    undo.push(Undo::Deleted(coll.clone(), old, id.to_raw()));
                    fx.record(|| Effect::Delete {
                        coll: coll.clone(),
                        id: id.to_raw(),
                        pre,
                    });
                    order.push(p.seq);
                    outcome.deleted += 1;
                }
            }
        }
        // Phase 2: replacements of records that exist.
        for (id, p) in w {
            if let (Some(new), Some(rid)) = (&p.new, c.rid_of_key(id)) {
                let old = c
                    .get(rid)
                    .cloned()
                    .ok_or_else(|| Error::Internal(format!("record {rid} vanished")))?;
                c.replace(rid, new.clone())?;
                // A transaction buffers final versions, not operators: its
                // replacements are reported as updates with the diff.
                fx.replace(coll, &old, new, true, c.options.pre_and_post_images);
                order.push(p.seq);
                undo.push(Undo::Replaced(coll.clone(), rid, old));
                outcome.updated += 1;
            }
        }
        // Phase 3: inserts (ids absent from the latest state).
        let mut inserts: Vec<(&ValueKey, &DocRef, usize)> = Vec::new();
        for (id, p) in w {
            if let Some(new) = &p.new {
                if c.rid_of_key(id).is_none() {
                    inserts.push((id, new, p.seq));
                }
            }
        }
        for (id, new, seq) in inserts {
            let rid = c.insert(new.clone(), id.to_raw())?;
            undo.push(Undo::Inserted(coll.clone(), rid));
            // Logged as physical changes in this command's WAL record (one
            // record per writer group: a transaction is never half-recovered;
            // a failed commit's effects are truncated by the writer).
            fx.insert(coll, new);
            order.push(seq);
            outcome.inserted += 1;
        }
    }
    Ok(())
}
