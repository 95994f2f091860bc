//! The transaction handle ([`Transaction`]: snapshot, private write buffer,
//! read records), its per-collection view ([`TxnCollection`], which
//! implements the CRUD surface [`Crud`] like a live collection does) and the
//! retry loop ([`Database::transaction`]). The commit protocol and its
//! invariants are in `crate::txn`; `commit` hands the buffer to the writer as
//! one boundary step.
//!
//! Invariants: a transaction reads its snapshot overlaid with its own
//! buffered writes (read-your-writes); nothing reaches stored data before
//! `commit`; every operation first checks that the transaction is still
//! active (not aborted, within its lifetime); a refused write (too large, a
//! duplicate `_id`, a failing update, a failed validation: 121, judged by
//! the snapshot's collection options) leaves the buffer as it was.
//! A [`TxnCollection`]'s reads, updates and deletes compare strings under
//! its `collation` option, else the collection's default as the snapshot
//! knows it, exactly as a live collection's do (MongoDB allows a collation
//! in a transaction).

use std::cell::{Cell, RefCell, RefMut};
use std::collections::BTreeMap;
use std::ops::ControlFlow;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bson::{Bson, DateTime, Document, RawBson};

use crate::api::crud::{
    self, CheckedDelete, CheckedModify, CheckedUpdate, Crud, PreparedDoc, StatementResults,
};
use crate::api::{Database, FindOptions, ReturnDocument};
use crate::doc::collation::Collator;
use crate::doc::{self, DocRef};
use crate::error::{DuplicateKey, Error, Result};
use crate::query::aggregate::{Foreign, Runtime};
use crate::query::distinct::Distinct;
use crate::query::planner;
use crate::query::update::upsert_seed;
use crate::query::validator::Validator;
use crate::query::{ApplyContext, Filter, Pipeline, SortSpec, UpdateSpec};
use crate::store::collection::ID_INDEX_NAME;
use crate::store::heap::RecordId;
use crate::store::index::ValueKey;
use crate::store::DbState;
use crate::txn::{
    apply_commit, CommitInfo, CommitOutcome, Isolation, Pending, PointRead, PredicateRead,
    TxnCommit, TxnOptions, WriteSet, MAX_TXN_BYTES, MAX_TXN_DOCS,
};
use crate::write::command::{updated_version, FindAndModifyOutcome, InsertOutcome, UpdateResult};

#[derive(Debug, Clone)]
enum TxnState {
    Active,
    Aborted(String),
}

/// An open transaction. Dropping it aborts it (the buffer is simply freed).
pub struct Transaction {
    db: Database,
    snapshot: Arc<DbState>,
    options: TxnOptions,
    started: Instant,
    state: TxnState,
    writes: WriteSet,
    write_bytes: usize,
    point_reads: Vec<PointRead>,
    predicate_reads: Vec<PredicateRead>,
    /// Collections a `$text` read (see `TxnCommit::collection_reads`).
    collection_reads: Vec<String>,
    /// Given to change events of the commit (see [`Transaction::set_origin`]).
    origin: Option<Arc<bson::RawDocumentBuf>>,
    /// The client operation's tag the commit carries (see [`Transaction::tag`]).
    tag: Option<Arc<[u8]>>,
}

impl std::fmt::Debug for Transaction {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Transaction")
            .field("snapshot_csn", &self.snapshot.csn)
            .field("options", &self.options)
            .field("state", &self.state)
            .field("writes", &self.write_count())
            .finish()
    }
}

impl Database {
    /// Start a transaction reading the latest published state (O(1)).
    pub fn begin(&self, options: TxnOptions) -> Transaction {
        Transaction {
            db: self.clone(),
            snapshot: self.writer().published(),
            options,
            started: Instant::now(),
            state: TxnState::Active,
            writes: BTreeMap::new(),
            write_bytes: 0,
            point_reads: Vec::new(),
            predicate_reads: Vec::new(),
            collection_reads: Vec::new(),
            origin: None,
            tag: None,
        }
    }

    /// Run `body` in a snapshot-isolation transaction and commit it, retrying
    /// the whole body on write conflicts (see [`Database::transaction_with`]).
    pub fn transaction<T>(&self, body: impl FnMut(&mut Transaction) -> Result<T>) -> Result<T> {
        self.transaction_with(TxnOptions::default(), body)
    }

    /// Run `body` in a transaction and commit it. A write conflict (from the
    /// body or the commit) retries the whole body on a fresh snapshot, up to
    /// `options.max_attempts` times, with exponential backoff and full jitter
    /// (100 µs doubling, capped at 10 ms) so that colliding transactions spread
    /// out instead of colliding again. Other errors abort and return at once.
    pub fn transaction_with<T>(
        &self,
        options: TxnOptions,
        mut body: impl FnMut(&mut Transaction) -> Result<T>,
    ) -> Result<T> {
        let attempts = options.max_attempts.max(1);
        let mut attempt = 0;
        loop {
            attempt += 1;
            let mut tx = self.begin(options);
            let result = match body(&mut tx) {
                Ok(v) => tx.commit().map(|_| v),
                Err(e) => Err(e),
            };
            match result {
                Err(e) if e.is_transient_transaction_error() && attempt < attempts => {
                    backoff(attempt);
                }
                other => return other,
            }
        }
    }
}

fn backoff(attempt: u32) {
    let cap_us = (100u64 << attempt.min(10)).min(10_000);
    std::thread::sleep(Duration::from_micros(jitter(cap_us)));
}

thread_local! {
    static RNG: Cell<u64> = const { Cell::new(0) };
}

/// A uniform-ish value in `0..=max` (xorshift, per thread; no dependency).
fn jitter(max: u64) -> u64 {
    RNG.with(|r| {
        let mut x = r.get();
        if x == 0 {
            let t = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_nanos() as u64)
                .unwrap_or(1);
            let addr = r as *const Cell<u64> as u64;
            x = (t ^ addr.rotate_left(32)) | 1;
        }
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        r.set(x);
        x % (max + 1)
    })
}

impl Transaction {
    /// The csn of the snapshot this transaction reads.
    pub fn snapshot_csn(&self) -> u64 {
        self.snapshot.csn
    }

    /// Parse a filter of this transaction's operations, `$$CLUSTER_TIME`
    /// bound to its snapshot's time, under `collator`.
    fn parse_filter(&self, filter: &Document, collator: Option<&Arc<Collator>>) -> Result<Filter> {
        let f = crate::query::expr::under_read_time(self.snapshot.ts, || Filter::parse(filter))?;
        Ok(f.with_collation(collator.cloned()))
    }

    /// The cluster time of this transaction's snapshot (`$$CLUSTER_TIME`).
    fn read_time(&self) -> u64 {
        self.snapshot.ts
    }

    pub fn isolation(&self) -> Isolation {
        self.options.isolation
    }

    /// Buffered writes (documents inserted, replaced or deleted).
    pub fn write_count(&self) -> usize {
        self.writes.values().map(|w| w.len()).sum()
    }

    /// Whether this transaction commits to `db`.
    pub fn is_on(&self, db: &Database) -> bool {
        self.db.same_as(db)
    }

    /// Move a transaction that began on an empty database nobody else saw (a
    /// server's stand-in for a database that did not exist yet) onto `db`,
    /// the database of that name, to commit there. Its snapshot is the empty
    /// state, an earlier state of every database, so commit validation
    /// against `db`'s latest state is exactly as for a transaction begun on
    /// `db` at its start. WriteConflict (112) when the snapshot is not empty
    /// (the transaction began on a database that was dropped since) or the
    /// names differ.
    pub fn rebind(&mut self, db: &Database) -> Result<()> {
        if self.db.same_as(db) {
            return Ok(());
        }
        if self.snapshot.csn != 0
            || !self.snapshot.collections.is_empty()
            || db.name() != self.db.name()
        {
            return Err(Error::WriteConflict(format!(
                "database '{}' was dropped or recreated during the transaction",
                db.name()
            )));
        }
        self.db = db.clone();
        Ok(())
    }

    /// Whether the handle is still usable.
    pub fn is_active(&self) -> bool {
        matches!(self.state, TxnState::Active)
    }

    /// Fails when the transaction is dead or outlived its lifetime (then it
    /// is aborted: its buffer is dropped and later calls get NoSuchTransaction).
    fn check_active(&mut self) -> Result<()> {
        if let TxnState::Aborted(why) = &self.state {
            return Err(Error::NoSuchTransaction(format!(
                "transaction has been aborted: {why}"
            )));
        }
        if let Some(limit) = self.options.lifetime {
            if self.started.elapsed() > limit {
                self.kill("it exceeded its lifetime limit");
                return Err(Error::TransactionExceededLifetimeLimitSeconds(
                    limit.as_secs(),
                ));
            }
        }
        Ok(())
    }

    fn kill(&mut self, why: &str) {
        self.state = TxnState::Aborted(why.to_string());
        self.writes.clear();
        self.point_reads.clear();
        self.predicate_reads.clear();
        self.collection_reads.clear();
        self.write_bytes = 0;
    }

    fn serializable(&self) -> bool {
        self.options.isolation == Isolation::Serializable
    }

    fn snapshot_version(&self, coll: &str, id: &ValueKey) -> Option<DocRef> {
        let c = self.snapshot.collection(coll)?;
        let rid = c.id_index.get(id)?;
        c.get(*rid).cloned()
    }

    /// The version this transaction sees: its own buffered one, else the
    /// snapshot's (recorded as a point read under serializable).
    fn read_point(&mut self, coll: &str, id: &ValueKey) -> Option<DocRef> {
        if let Some(p) = self.writes.get(coll).and_then(|w| w.get(id)) {
            return p.new.clone();
        }
        let seen = self.snapshot_version(coll, id);
        if self.serializable() {
            self.point_reads.push(PointRead {
                coll: coll.to_string(),
                id: id.clone(),
                seen: seen.clone(),
            });
        }
        seen
    }

    /// Every document matching `filter` as this transaction sees it: the
    /// snapshot's matches not overwritten by the buffer, then buffered
    /// versions that match. Recorded as a predicate read under serializable.
    fn matching(&mut self, coll: &str, filter: &Filter) -> Result<Vec<DocRef>> {
        let mut matched: Vec<(RecordId, DocRef)> = Vec::new();
        if let Some(c) = self.snapshot.collection(coll) {
            let plan = planner::plan(c, filter, None, None)?;
            planner::execute(c, &plan, filter, |rid, d| {
                matched.push((rid, d.clone()));
                ControlFlow::Continue(())
            })?;
        }
        let buffered = self.writes.get(coll);
        let mut out: Vec<DocRef> = Vec::with_capacity(matched.len());
        for (_, d) in &matched {
            let overwritten = buffered.is_some_and(|b| {
                doc::id_of(d).is_some_and(|id| b.contains_key(&ValueKey::from(id)))
            });
            if !overwritten {
                out.push(d.clone());
            }
        }
        if let Some(b) = buffered {
            out.extend(
                b.values()
                    .filter_map(|p| p.new.as_ref())
                    .filter(|n| filter.matches(n))
                    .cloned(),
            );
            // An `$expr` that failed on a buffered document fails the read.
            filter.check()?;
        }
        if self.serializable() {
            self.predicate_reads.push(PredicateRead {
                coll: coll.to_string(),
                filter: filter.clone(),
                matched,
            });
        }
        Ok(out)
    }

    /// The document with `_id == id` as this transaction sees it.
    pub fn get(&mut self, coll: &str, id: &Bson) -> Result<Option<DocRef>> {
        self.check_active()?;
        let id =
            crate::doc::value::to_raw(id).ok_or_else(|| Error::InvalidId("invalid _id".into()))?;
        Ok(self.read_point(coll, &ValueKey::from(id)))
    }

    /// This transaction's view of collection `coll`, with the whole CRUD
    /// surface ([`Crud`]).
    pub fn collection(&mut self, coll: &str) -> TxnCollection<'_> {
        TxnCollection {
            txn: RefCell::new(self),
            name: coll.to_string(),
            bypass_validation: false,
            collation: None,
        }
    }

    // The common operations by collection name (each is [`Crud`]'s on
    // [`Transaction::collection`]).

    /// Matching documents (snapshot + own writes), unordered.
    pub fn find(&mut self, coll: &str, filter: Document) -> Result<Vec<Document>> {
        self.collection(coll)
            .find_with(filter, FindOptions::default())
    }

    /// Matching documents with sort, skip, limit and projection (see
    /// [`TxnCollection`] for `hint` and serializable reads).
    pub fn find_with(
        &mut self,
        coll: &str,
        filter: Document,
        options: FindOptions,
    ) -> Result<Vec<Document>> {
        self.collection(coll).find_with(filter, options)
    }

    pub fn find_one(&mut self, coll: &str, filter: Document) -> Result<Option<Document>> {
        self.collection(coll).find_one(filter)
    }

    pub fn count(&mut self, coll: &str, filter: Document) -> Result<u64> {
        Crud::count(&self.collection(coll), filter)
    }

    /// Insert one document (`_id` generated when absent); returns its `_id`.
    /// A `_id` this transaction already sees fails at once with DuplicateKey.
    pub fn insert_one(&mut self, coll: &str, document: Document) -> Result<Bson> {
        self.collection(coll).insert_one(document)
    }

    pub fn update_one(
        &mut self,
        coll: &str,
        filter: Document,
        update: Document,
    ) -> Result<UpdateResult> {
        self.collection(coll).update_one(filter, update)
    }

    pub fn update_many(
        &mut self,
        coll: &str,
        filter: Document,
        update: Document,
    ) -> Result<UpdateResult> {
        self.collection(coll).update_many(filter, update)
    }

    pub fn replace_one(
        &mut self,
        coll: &str,
        filter: Document,
        replacement: Document,
    ) -> Result<UpdateResult> {
        self.collection(coll).replace_one(filter, replacement)
    }

    pub fn delete_one(&mut self, coll: &str, filter: Document) -> Result<u64> {
        self.collection(coll).delete_one(filter)
    }

    pub fn delete_many(&mut self, coll: &str, filter: Document) -> Result<u64> {
        self.collection(coll).delete_many(filter)
    }

    /// Buffer `new` as the final version of `id` (`None` deletes). Checks the
    /// write-set limits first, so a refused write changes nothing.
    fn buffer(&mut self, coll: &str, id: ValueKey, new: Option<DocRef>) -> Result<()> {
        if let Some(c) = self.snapshot.collection(coll) {
            // As MongoDB: capped collections trim in insertion order at
            // the writer, which a transaction's buffered writes cannot
            // honour.
            if c.options.capped {
                return Err(Error::Coded {
                    code: 263,
                    name: "OperationNotSupportedInTransaction",
                    msg: format!(
                        "Collection '{}' is a capped collection. Writes in transactions are not allowed on capped collections.",
                        c.ns
                    ),
                });
            }
        }
        let new_len = new.as_ref().map_or(0, |d| d.as_bytes().len());
        let existing = self.writes.get(coll).and_then(|w| w.get(&id));
        let old_len = existing
            .and_then(|p| p.new.as_ref())
            .map_or(0, |d| d.as_bytes().len());
        let count = self.write_count() + usize::from(existing.is_none());
        let bytes = self.write_bytes - old_len + new_len;
        if count > MAX_TXN_DOCS || bytes > MAX_TXN_BYTES {
            return Err(Error::TransactionTooLarge(format!(
                "transaction write set too large: {count} documents, {bytes} bytes \
                 (limits {MAX_TXN_DOCS} documents, {MAX_TXN_BYTES} bytes)"
            )));
        }
        // `seq`: the order of this `_id`'s first write in the transaction
        // (entries are never removed, so the count so far is unique).
        let (base, seq) = match existing {
            Some(p) => (p.base.clone(), p.seq),
            None => (self.snapshot_version(coll, &id), self.write_count()),
        };
        self.writes
            .entry(coll.to_string())
            .or_default()
            .insert(id, Pending { base, new, seq });
        self.write_bytes = bytes;
        Ok(())
    }

    /// Judge `new` (replacing `old`, `None` for an insert) by the validator
    /// of `coll` as this transaction's snapshot has it (the options a
    /// transaction sees are those of its snapshot, as its documents are):
    /// 121 DocumentValidationFailure refuses the write, before anything is
    /// buffered. `bypass`: `bypassDocumentValidation`.
    fn validate(
        &self,
        coll: &str,
        bypass: bool,
        old: Option<&DocRef>,
        new: &bson::RawDocument,
    ) -> Result<()> {
        let Some(c) = self.snapshot.collection(coll) else {
            return Ok(());
        };
        if bypass || c.options.validator.is_none() {
            return Ok(());
        }
        match Validator::of(&c.options)? {
            Some(v) => v.check(&c.ns, old.map(|o| o.as_ref().as_ref()), new),
            None => Ok(()),
        }
    }

    /// Buffer a new document whose `_id` is `id` (after validation); a
    /// `_id` this transaction already sees fails with DuplicateKey.
    fn insert_stored(
        &mut self,
        coll: &str,
        stored: DocRef,
        id: RawBson,
        bypass: bool,
    ) -> Result<Bson> {
        self.validate(coll, bypass, None, &stored)?;
        let key = ValueKey::from(&id);
        let id_bson = Bson::try_from(id).unwrap_or(Bson::Null);
        if self.read_point(coll, &key).is_some() {
            return Err(dup_id_error(&self.snapshot, coll, &id_bson));
        }
        self.buffer(coll, key, Some(stored))?;
        Ok(id_bson)
    }

    /// Buffer the document an upsert of `filter` with `update` creates;
    /// returns its `_id` and the buffered version.
    fn upsert(
        &mut self,
        coll: &str,
        filter: &Document,
        update: &UpdateSpec,
        bypass: bool,
    ) -> Result<(Bson, DocRef)> {
        let seed = upsert_seed(filter)?;
        let context = ApplyContext {
            is_upsert_insert: true,
            now: DateTime::now(),
            position: None,
        };
        let (raw, id) = doc::prepare_insert(&update.apply(&seed, &context)?)?;
        let stored = Arc::new(raw);
        let id = self.insert_stored(coll, stored.clone(), id, bypass)?;
        Ok((id, stored))
    }

    /// Matching documents with sort, skip and limit (unprojected).
    fn find_in(
        &mut self,
        coll: &str,
        filter: &Document,
        options: &FindOptions,
        collator: Option<&Arc<Collator>>,
    ) -> Result<Vec<DocRef>> {
        self.check_active()?;
        let parsed = self.parse_filter(filter, collator)?;
        let sort = options
            .sort
            .as_ref()
            .map(SortSpec::parse)
            .transpose()?
            .map(|s| s.with_collation(collator.cloned()))
            .filter(|s| !s.is_empty());
        let docs = self.matching(coll, &parsed)?;
        Ok(crud::page(docs, sort.as_ref(), options.skip, options.limit))
    }

    /// Update (or replace, or upsert) with a checked spec (already under
    /// `collator`, as the filter is made here). All new versions are computed
    /// before any is buffered, so a failing update changes nothing.
    fn update_in(
        &mut self,
        coll: &str,
        u: CheckedUpdate,
        bypass: bool,
        collator: Option<&Arc<Collator>>,
    ) -> Result<UpdateResult> {
        // The collation is resolved by the caller (`collator`).
        let CheckedUpdate {
            filter,
            spec: update,
            multi,
            options,
            collation: _,
        } = u;
        let (update, upsert) = (&update, options.upsert);
        self.check_active()?;
        let parsed = self.parse_filter(&filter, collator)?;
        let mut found = self.matching(coll, &parsed)?;
        if !multi {
            found.truncate(1);
        }
        if found.is_empty() {
            if !upsert {
                return Ok(UpdateResult::default());
            }
            let (id, _) = self.upsert(coll, &filter, update, bypass)?;
            return Ok(UpdateResult {
                matched: 0,
                modified: 0,
                upserted_id: Some(id),
            });
        }
        let now = DateTime::now();
        let mut changes = Vec::new();
        for old in &found {
            if let Some(new) = updated_version(old, update, &parsed, now)? {
                self.validate(coll, bypass, Some(old), &new)?;
                changes.push((id_key(old)?, Arc::new(new)));
            }
        }
        let modified = changes.len() as u64;
        for (id, new) in changes {
            self.buffer(coll, id, Some(new))?;
        }
        Ok(UpdateResult {
            matched: found.len() as u64,
            modified,
            upserted_id: None,
        })
    }

    fn delete_in(
        &mut self,
        coll: &str,
        filter: Document,
        multi: bool,
        collator: Option<&Arc<Collator>>,
    ) -> Result<u64> {
        self.check_active()?;
        let parsed = self.parse_filter(&filter, collator)?;
        let mut found = self.matching(coll, &parsed)?;
        if !multi {
            found.truncate(1);
        }
        for d in &found {
            self.buffer(coll, id_key(d)?, None)?;
        }
        Ok(found.len() as u64)
    }

    /// findAndModify as the first match (in `options.sort` order) updated or
    /// deleted in the buffer, or an upsert: as atomic as the rest of the
    /// transaction. `hint` is ignored (the read is planned on the snapshot).
    fn modify_first_in(
        &mut self,
        coll: &str,
        m: CheckedModify,
        bypass: bool,
        collator: Option<&Arc<Collator>>,
    ) -> Result<FindAndModifyOutcome> {
        let CheckedModify {
            filter,
            update,
            options,
        } = m;
        let first = FindOptions {
            sort: options.sort.clone(),
            limit: 1,
            ..Default::default()
        };
        let after = options.return_document == ReturnDocument::After;
        let Some(old) = self.find_in(coll, &filter, &first, collator)?.pop() else {
            let Some(update) = update.filter(|_| options.upsert) else {
                return Ok(FindAndModifyOutcome::default());
            };
            let (id, stored) = self.upsert(coll, &filter, &update, bypass)?;
            return Ok(FindAndModifyOutcome {
                doc: after.then_some(stored),
                update: UpdateResult {
                    upserted_id: Some(id),
                    ..Default::default()
                },
                removed: false,
            });
        };
        let key = id_key(&old)?;
        let Some(update) = update else {
            self.buffer(coll, key, None)?;
            return Ok(FindAndModifyOutcome {
                doc: Some(old),
                update: UpdateResult {
                    matched: 1,
                    ..Default::default()
                },
                removed: true,
            });
        };
        let parsed = self.parse_filter(&filter, collator)?;
        let new = updated_version(&old, &update, &parsed, DateTime::now())?.map(Arc::new);
        if let Some(n) = &new {
            self.validate(coll, bypass, Some(&old), n)?;
            self.buffer(coll, key, Some(n.clone()))?;
        }
        let modified = u64::from(new.is_some());
        Ok(FindAndModifyOutcome {
            doc: Some(match new {
                Some(n) if after => n,
                _ => old,
            }),
            update: UpdateResult {
                matched: 1,
                modified,
                upserted_id: None,
            },
            removed: false,
        })
    }

    /// Opaque metadata of the client (a server passes `{lsid, txnNumber}`)
    /// that the change events of this transaction's commit carry.
    pub fn set_origin(&mut self, origin: bson::RawDocumentBuf) {
        self.origin = Some(Arc::new(origin));
    }

    /// Tag the commit as client operation `tag`, as `Database::with_origin`
    /// tags a write: a replica set commits the tag with the record, so every
    /// member knows the commit happened (a `commitTransaction` retried on a
    /// new primary is recognised).
    pub fn tag(&mut self, tag: Arc<[u8]>) {
        self.tag = Some(tag);
    }

    /// Validate and apply every buffered write at one csn through the writer.
    /// On a conflict (WriteConflict, 112) or a constraint violation
    /// (DuplicateKey) nothing changed and the transaction is over.
    pub fn commit(mut self) -> Result<CommitInfo> {
        self.check_active()?;
        let snapshot_csn = self.snapshot.csn;
        // Entries inserted and deleted again within the transaction write nothing.
        for w in self.writes.values_mut() {
            w.retain(|_, p| p.base.is_some() || p.new.is_some());
        }
        self.writes.retain(|_, w| !w.is_empty());
        if self.writes.is_empty() {
            return Ok(CommitInfo {
                csn: snapshot_csn,
                snapshot_csn,
                outcome: CommitOutcome::default(),
            });
        }
        let commit = TxnCommit {
            snapshot: self.snapshot.clone(),
            isolation: self.options.isolation,
            writes: std::mem::take(&mut self.writes),
            point_reads: std::mem::take(&mut self.point_reads),
            predicate_reads: std::mem::take(&mut self.predicate_reads),
            collection_reads: std::mem::take(&mut self.collection_reads),
            planted_bug: self.options.planted_bug(),
            origin: self.origin.take(),
        };
        self.kill("it has ended");
        let outcome = self
            .db
            .writer()
            .at_boundary_tagged(self.tag.take(), move |state, fx| {
                apply_commit(state, fx, commit)
            })?;
        Ok(CommitInfo {
            csn: crate::write::writer::last_commit_csn(),
            snapshot_csn,
            outcome,
        })
    }

    /// Discard the buffer; nothing was ever written.
    pub fn abort(self) {}
}

fn dup_id_error(state: &DbState, coll: &str, id: &Bson) -> Error {
    let mut key_value = Document::new();
    key_value.insert("_id", id.clone());
    let mut key_pattern = Document::new();
    key_pattern.insert("_id", 1);
    Error::DuplicateKey(Box::new(DuplicateKey {
        ns: format!("{}.{coll}", state.db),
        index: ID_INDEX_NAME.to_string(),
        key_pattern,
        key: format!("{{ _id: {} }}", crate::error::render(id)),
        key_value,
    }))
}

/// The `_id` of a stored document as an index key.
fn id_key(d: &DocRef) -> Result<ValueKey> {
    let id = doc::id_of(d).ok_or_else(|| Error::Internal("stored document without _id".into()))?;
    Ok(ValueKey::from(id))
}

/// One collection as a transaction sees it (its snapshot overlaid with its
/// own buffered writes), with the CRUD surface of a live collection
/// ([`Crud`]): what `Transaction::collection` returns.
///
/// Differences from a live collection, all because the transaction reads one
/// snapshot: `hint` is ignored (the read is planned on the snapshot); under
/// serializable isolation a read records its whole filter for validation at
/// commit, not only the documents a limit kept (conservative, never unsound);
/// writes are buffered until commit, so a write error never changes stored
/// data.
pub struct TxnCollection<'t> {
    // The trait's methods take `&self`, as a live collection's do; each
    // primitive borrows the transaction for its own duration only and never
    // calls another, so the borrow cannot fail in practice.
    txn: RefCell<&'t mut Transaction>,
    name: String,
    /// `bypassDocumentValidation` for this view's writes.
    bypass_validation: bool,
    /// The `collation` option of this view's operations (`None`: the
    /// collection's default).
    collation: Option<Document>,
}

impl std::fmt::Debug for TxnCollection<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TxnCollection")
            .field("name", &self.name)
            .finish_non_exhaustive()
    }
}

impl<'t> TxnCollection<'t> {
    /// This view with `bypassDocumentValidation` set: its inserts and
    /// updates skip the collection's validator.
    pub fn bypass_document_validation(mut self, bypass: bool) -> TxnCollection<'t> {
        self.bypass_validation = bypass;
        self
    }

    /// This view with a `collation` option: its reads, updates and deletes
    /// compare strings under it (`{locale: "simple"}`: binary); `None` uses
    /// the collection's default collation.
    pub fn with_collation(mut self, collation: Option<Document>) -> TxnCollection<'t> {
        self.collation = collation;
        self
    }

    /// The collator of this view's operations: its `collation` option, else
    /// the collection's default in the transaction's snapshot (`None`:
    /// simple).
    pub fn collator(&self) -> Result<Option<Arc<Collator>>> {
        self.collator_for(None)
    }

    /// The collator of an operation with its own `collation` option
    /// (`over`), else [`TxnCollection::collator`].
    fn collator_for(&self, over: Option<&Document>) -> Result<Option<Arc<Collator>>> {
        match over.or(self.collation.as_ref()) {
            Some(d) => Collator::from_document(d),
            None => Ok(self
                .txn()?
                .snapshot
                .collection(&self.name)
                .and_then(|c| c.options.collation.clone())),
        }
    }

    /// A delete under its own collation (else the view's).
    fn delete_checked(&self, d: CheckedDelete) -> Result<u64> {
        let collator = self.collator_for(d.collation.as_ref())?;
        self.txn()?
            .delete_in(&self.name, d.filter, d.multi, collator.as_ref())
    }

    fn txn(&self) -> Result<RefMut<'_, &'t mut Transaction>> {
        self.txn
            .try_borrow_mut()
            .map_err(|_| Error::Internal("transaction collection used re-entrantly".into()))
    }

    /// The transaction's snapshot, for a `$text` read of this collection:
    /// the text index is not kept for the transaction's own writes, so a
    /// collection it has written is refused (263) rather than answered
    /// without them. Under `serializable` the read is recorded as a read of
    /// the whole collection: the commit fails if any commit since the
    /// snapshot changed it (coarse, as the text matches keep no record).
    fn text_state(&self) -> Result<Arc<DbState>> {
        let mut txn = self.txn()?;
        if txn.writes.get(&self.name).is_some_and(|w| !w.is_empty()) {
            return Err(Error::Coded {
                code: 263,
                name: "OperationNotSupportedInTransaction",
                msg: format!(
                    "$text cannot read collection '{}' after this transaction wrote to it",
                    self.name
                ),
            });
        }
        if txn.serializable() && !txn.collection_reads.contains(&self.name) {
            txn.collection_reads.push(self.name.clone());
        }
        Ok(txn.snapshot.clone())
    }

    /// [`Collection::text_find`] as this transaction sees the collection
    /// (its snapshot; see `text_state`).
    pub fn text_find(
        &self,
        filter: &Document,
        options: crate::api::TextFindOptions,
    ) -> Result<Vec<Document>> {
        let state = self.text_state()?;
        crate::api::text::find_in(&state, &self.name, filter, options)
    }

    /// [`Collection::text_find_stream`] as this transaction sees the
    /// collection (its snapshot; see `text_state`).
    pub fn text_find_stream(
        &self,
        filter: &Document,
        options: crate::api::TextFindOptions,
        limits: &crate::query::limits::ReadLimits,
    ) -> Result<crate::api::TextStream> {
        let state = self.text_state()?;
        crate::api::text::stream_in(&state, &self.name, filter, options, limits, None)
    }

    /// [`Collection::text_count`] as this transaction sees the collection.
    pub fn text_count(&self, filter: &Document) -> Result<u64> {
        let state = self.text_state()?;
        crate::api::text::count_in(&state, &self.name, filter)
    }

    /// [`Collection::text_aggregate`] as this transaction sees the
    /// collection; its `$lookup`s read the other collections as the
    /// transaction sees them. `$out`/`$merge` are refused (263).
    pub fn text_aggregate(
        &self,
        pipeline: &[Document],
        limits: &crate::query::limits::ReadLimits,
        let_vars: Option<&Document>,
    ) -> Result<Vec<Document>> {
        let collator = self.collator()?;
        let read_time = self.txn()?.read_time();
        crate::query::expr::under_read_time(read_time, || {
            crate::query::expr::under_collation(collator.as_ref(), || {
                let p =
                    crate::api::text::TextPipeline::parse(pipeline, let_vars, collator.clone())?;
                if let Some(out) = p.rest.output() {
                    return Err(Error::Coded {
                        code: 263,
                        name: "OperationNotSupportedInTransaction",
                        msg: format!("{} cannot be used in a transaction", out.stage_name()),
                    });
                }
                let state = self.text_state()?;
                let mut txn = self.txn()?;
                let foreign = TxnForeign {
                    txn: std::sync::Mutex::new(&mut **txn),
                };
                let rt = Runtime::new(&foreign, limits.clone(), limits.spill_dir_or(None));
                p.run(&state, &self.name, &rt)
            })
        })
    }
}

impl Crud for TxnCollection<'_> {
    fn name(&self) -> &str {
        &self.name
    }

    fn insert_prepared(
        &self,
        docs: Vec<PreparedDoc>,
        _stmts: &[usize],
        ordered: bool,
    ) -> Result<InsertOutcome> {
        let mut txn = self.txn()?;
        txn.check_active()?;
        let mut out = InsertOutcome::default();
        for (i, (raw, id)) in docs.into_iter().enumerate() {
            match txn.insert_stored(&self.name, Arc::new(raw), id, self.bypass_validation) {
                Ok(id) => out.inserted.push((i, id)),
                Err(e) => {
                    out.errors.push((i, e));
                    if ordered {
                        break;
                    }
                }
            }
        }
        Ok(out)
    }

    fn update_checked(&self, u: CheckedUpdate) -> Result<UpdateResult> {
        let collator = self.collator_for(u.collation.as_ref())?;
        let u = CheckedUpdate {
            spec: u.spec.with_collation(collator.clone()),
            ..u
        };
        self.txn()?
            .update_in(&self.name, u, self.bypass_validation, collator.as_ref())
    }

    fn delete(&self, filter: Document, multi: bool) -> Result<u64> {
        self.delete_checked(CheckedDelete {
            filter,
            multi,
            collation: None,
        })
    }

    /// The statements go into the transaction's buffer one by one.
    fn update_batch(
        &self,
        stmts: Vec<Result<CheckedUpdate>>,
        ordered: bool,
    ) -> Result<StatementResults<UpdateResult>> {
        Ok(crud::one_by_one(stmts, ordered, |u| self.update_checked(u)))
    }

    fn delete_batch(
        &self,
        stmts: Vec<Result<CheckedDelete>>,
        ordered: bool,
    ) -> Result<StatementResults<u64>> {
        Ok(crud::one_by_one(stmts, ordered, |d| self.delete_checked(d)))
    }

    fn modify_first(&self, mut m: CheckedModify) -> Result<FindAndModifyOutcome> {
        let collator = self.collator()?;
        m.update = m.update.map(|u| u.with_collation(collator.clone()));
        self.txn()?
            .modify_first_in(&self.name, m, self.bypass_validation, collator.as_ref())
    }

    fn op_collator(&self) -> Result<Option<Arc<Collator>>> {
        self.collator()
    }

    fn find_raw(&self, filter: Document, options: FindOptions) -> Result<Vec<DocRef>> {
        let collator = self.collator()?;
        self.txn()?
            .find_in(&self.name, &filter, &options, collator.as_ref())
    }

    fn count(&self, filter: Document) -> Result<u64> {
        let collator = self.collator()?;
        let mut txn = self.txn()?;
        let filter = txn.parse_filter(&filter, collator.as_ref())?;
        txn.check_active()?;
        Ok(txn.matching(&self.name, &filter)?.len() as u64)
    }

    fn distinct(&self, path: &str, filter: Document) -> Result<Vec<Bson>> {
        let mut d = Distinct::new(path)?.with_collation(self.collator()?);
        for doc in self.find_raw(filter, FindOptions::default())? {
            d.feed(&doc);
        }
        d.finish()
    }

    /// The pipeline's leading `$match` selects what the transaction reads;
    /// the whole pipeline (that `$match` again included, harmlessly) then
    /// runs on it.
    fn aggregate(&self, pipeline: Vec<Document>) -> Result<Vec<Document>> {
        self.aggregate_let(pipeline, None)
    }
}

impl TxnCollection<'_> {
    /// [`Crud::aggregate`] with the command's `let` variables. `$lookup`,
    /// `$graphLookup` and `$unionWith` read the other collections as this
    /// transaction sees them (its snapshot and its own writes; under
    /// `serializable` those reads are validated at commit like any other).
    /// `$out`/`$merge` are refused (263), as MongoDB refuses them.
    pub fn aggregate_let(
        &self,
        pipeline: Vec<Document>,
        let_vars: Option<&Document>,
    ) -> Result<Vec<Document>> {
        let collator = self.collator()?;
        // The pipeline's stages and expressions compare under the
        // collation, as a live aggregation's do.
        let read_time = self.txn()?.read_time();
        crate::query::expr::under_read_time(read_time, || {
            crate::query::expr::under_collation(collator.as_ref(), || {
                self.aggregate_collated(&pipeline, let_vars, collator.clone())
            })
        })
    }

    /// [`TxnCollection::aggregate_let`] with the collation in scope: parsed
    /// under it (`$match`, `$sort`, `$group`…) and run.
    fn aggregate_collated(
        &self,
        pipeline: &[Document],
        let_vars: Option<&Document>,
        collator: Option<Arc<Collator>>,
    ) -> Result<Vec<Document>> {
        let ctx = crate::query::aggregate::ParseCtx::new(let_vars)?.with_collation(collator);
        let p = Pipeline::parse_in(pipeline, &ctx)?;
        if let Some(out) = p.output() {
            return Err(Error::Coded {
                code: 263,
                name: "OperationNotSupportedInTransaction",
                msg: format!("{} cannot be used in a transaction", out.stage_name()),
            });
        }
        let input = if p.starts_with_documents() {
            Vec::new()
        } else {
            let scan = p.clone().split().scan_filter;
            self.find_raw(scan.unwrap_or_default(), FindOptions::default())?
                .iter()
                .map(|d| doc::to_document(d))
                .collect::<Result<Vec<_>>>()?
        };
        let mut txn = self.txn()?;
        let foreign = TxnForeign {
            txn: std::sync::Mutex::new(&mut **txn),
        };
        let rt = Runtime::new(
            &foreign,
            crate::query::limits::ReadLimits::default(),
            crate::query::limits::default_temp_spill_dir(),
        );
        p.run_on_with(input, &rt)
    }
}

/// A transaction's view of the other collections of a pipeline.
struct TxnForeign<'a> {
    txn: std::sync::Mutex<&'a mut Transaction>,
}

impl Foreign for TxnForeign<'_> {
    fn scan(
        &self,
        coll: &str,
        filter: &Filter,
        visit: &mut dyn FnMut(&DocRef) -> Result<ControlFlow<()>>,
    ) -> Result<()> {
        let docs = {
            let mut txn = self
                .txn
                .lock()
                .map_err(|_| Error::Internal("transaction lock poisoned".into()))?;
            txn.check_active()?;
            txn.matching(coll, filter)?
        };
        for d in &docs {
            if visit(d)?.is_break() {
                break;
            }
        }
        Ok(())
    }
}
