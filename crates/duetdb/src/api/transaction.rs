//! The transaction handle ([`Transaction`]: snapshot, private write buffer,
//! read records) and the retry loop ([`Database::transaction`]). The commit
//! protocol and its invariants are in `crate::txn`; `commit` hands the buffer
//! to the writer as one boundary step.

use std::cell::Cell;
use std::collections::BTreeMap;
use std::ops::ControlFlow;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bson::raw::RawDocumentBuf;
use bson::{Bson, DateTime, Document, RawBson};

use crate::api::{validate_collection_name, Collection, Database, FindOptions, UpdateOptions};
use crate::doc::{self, DocRef};
use crate::error::{DuplicateKey, Error, Result};
use crate::query::planner;
use crate::query::update::upsert_seed;
use crate::query::{ApplyContext, Filter, Projection, SortSpec, UpdateSpec};
use crate::store::collection::ID_INDEX_NAME;
use crate::store::heap::RecordId;
use crate::store::index::ValueKey;
use crate::store::DbState;
use crate::txn::{
    apply_commit, CommitInfo, CommitOutcome, Isolation, Pending, PointRead, PredicateRead,
    TxnCommit, TxnOptions, WriteSet, MAX_TXN_BYTES, MAX_TXN_DOCS,
};
use crate::write::command::{updated_version, UpdateResult};

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

    pub fn isolation(&self) -> Isolation {
        self.options.isolation
    }

    /// Buffered writes (documents inserted, replaced or deleted).
    pub fn write_count(&self) -> usize {
        self.writes.values().map(|w| w.len()).sum()
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
                doc::id_of(d).is_some_and(|id| b.contains_key(&ValueKey(id.into())))
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
        Ok(self.read_point(coll, &ValueKey(id)))
    }

    /// Matching documents (snapshot + own writes), unordered.
    pub fn find(&mut self, coll: &str, filter: Document) -> Result<Vec<Document>> {
        self.find_with(coll, filter, FindOptions::default())
    }

    /// Matching documents with sort, skip, limit and projection (`hint` is
    /// ignored: a transaction's read is planned on its snapshot). Under
    /// serializable the whole filter is validated at commit, not only the
    /// documents a limit kept: conservative, never unsound.
    pub fn find_with(
        &mut self,
        coll: &str,
        filter: Document,
        options: FindOptions,
    ) -> Result<Vec<Document>> {
        self.check_active()?;
        let parsed = Filter::parse(&filter)?;
        let sort = options
            .sort
            .as_ref()
            .map(SortSpec::parse)
            .transpose()?
            .filter(|s| !s.is_empty());
        let projection = options
            .projection
            .as_ref()
            .filter(|p| !p.is_empty())
            .map(Projection::parse)
            .transpose()?;
        let mut docs = self.matching(coll, &parsed)?;
        if let Some(sort) = &sort {
            let mut keyed: Vec<_> = docs.into_iter().map(|d| (sort.sort_key(&d), d)).collect();
            keyed.sort_by(|(a, _), (b, _)| sort.compare_keys(a, b));
            docs = keyed.into_iter().map(|(_, d)| d).collect();
        }
        let skip = usize::try_from(options.skip)
            .unwrap_or(usize::MAX)
            .min(docs.len());
        docs.drain(..skip);
        if options.limit > 0 {
            docs.truncate(usize::try_from(options.limit).unwrap_or(usize::MAX));
        }
        docs.iter()
            .map(|d| match &projection {
                Some(p) => p.apply(d),
                None => doc::to_document(d),
            })
            .collect()
    }

    pub fn find_one(&mut self, coll: &str, filter: Document) -> Result<Option<Document>> {
        let options = FindOptions {
            limit: 1,
            ..Default::default()
        };
        Ok(self.find_with(coll, filter, options)?.pop())
    }

    pub fn count(&mut self, coll: &str, filter: Document) -> Result<u64> {
        self.check_active()?;
        let parsed = Filter::parse(&filter)?;
        Ok(self.matching(coll, &parsed)?.len() as u64)
    }

    /// Buffer `new` as the final version of `id` (`None` deletes). Checks the
    /// write-set limits first, so a refused write changes nothing.
    fn buffer(&mut self, coll: &str, id: ValueKey, new: Option<DocRef>) -> Result<()> {
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
        let base = match existing {
            Some(p) => p.base.clone(),
            None => self.snapshot_version(coll, &id),
        };
        self.writes
            .entry(coll.to_string())
            .or_default()
            .insert(id, Pending { base, new });
        self.write_bytes = bytes;
        Ok(())
    }

    /// Insert one document (`_id` generated when absent); returns its `_id`.
    /// A `_id` this transaction already sees fails at once with DuplicateKey.
    pub fn insert_one(&mut self, coll: &str, document: Document) -> Result<Bson> {
        self.check_active()?;
        validate_collection_name(coll)?;
        let (raw, id) = doc::prepare_insert(&document)?;
        self.insert_prepared(coll, raw, id)
    }

    fn insert_prepared(&mut self, coll: &str, raw: RawDocumentBuf, id: RawBson) -> Result<Bson> {
        let key = ValueKey(id.clone());
        let id_bson = Bson::try_from(id).unwrap_or(Bson::Null);
        if self.read_point(coll, &key).is_some() {
            return Err(dup_id_error(&self.snapshot, coll, &id_bson));
        }
        self.buffer(coll, key, Some(Arc::new(raw)))?;
        Ok(id_bson)
    }

    pub fn update_one(
        &mut self,
        coll: &str,
        filter: Document,
        update: Document,
    ) -> Result<UpdateResult> {
        let spec = Collection::operators(&update)?;
        self.update_with(coll, filter, spec, false, UpdateOptions::default())
    }

    pub fn update_many(
        &mut self,
        coll: &str,
        filter: Document,
        update: Document,
    ) -> Result<UpdateResult> {
        let spec = Collection::operators(&update)?;
        self.update_with(coll, filter, spec, true, UpdateOptions::default())
    }

    pub fn replace_one(
        &mut self,
        coll: &str,
        filter: Document,
        replacement: Document,
    ) -> Result<UpdateResult> {
        let spec = Collection::replacement(&replacement)?;
        self.update_with(coll, filter, spec, false, UpdateOptions::default())
    }

    /// Update (or replace, or upsert) with a parsed spec: what the server's
    /// `update` command inside a session calls. All new versions are computed
    /// before any is buffered, so a failing update changes nothing.
    pub fn update_with(
        &mut self,
        coll: &str,
        filter: Document,
        update: UpdateSpec,
        multi: bool,
        options: UpdateOptions,
    ) -> Result<UpdateResult> {
        self.check_active()?;
        validate_collection_name(coll)?;
        if multi && update.is_replacement() {
            return Err(Error::bad_value(
                "multi update is not supported for replacement-style update",
            ));
        }
        let parsed = Filter::parse(&filter)?;
        let mut found = self.matching(coll, &parsed)?;
        if !multi {
            found.truncate(1);
        }
        let now = DateTime::now();
        if found.is_empty() {
            if !options.upsert {
                return Ok(UpdateResult::default());
            }
            let seed = upsert_seed(&filter)?;
            let new_doc = update.apply(
                &seed,
                &ApplyContext {
                    is_upsert_insert: true,
                    now,
                },
            )?;
            let (raw, id) = doc::prepare_insert(&new_doc)?;
            let id = self.insert_prepared(coll, raw, id)?;
            return Ok(UpdateResult {
                matched: 0,
                modified: 0,
                upserted_id: Some(id),
            });
        }
        let mut changes = Vec::new();
        for old in &found {
            if let Some(new) = updated_version(old, &update, now)? {
                let id = doc::id_of(old)
                    .ok_or_else(|| Error::Internal("stored document without _id".into()))?;
                changes.push((ValueKey(id.into()), Arc::new(new)));
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

    pub fn delete_one(&mut self, coll: &str, filter: Document) -> Result<u64> {
        self.delete(coll, filter, false)
    }

    pub fn delete_many(&mut self, coll: &str, filter: Document) -> Result<u64> {
        self.delete(coll, filter, true)
    }

    fn delete(&mut self, coll: &str, filter: Document, multi: bool) -> Result<u64> {
        self.check_active()?;
        let parsed = Filter::parse(&filter)?;
        let mut found = self.matching(coll, &parsed)?;
        if !multi {
            found.truncate(1);
        }
        for d in &found {
            let id = doc::id_of(d)
                .ok_or_else(|| Error::Internal("stored document without _id".into()))?;
            self.buffer(coll, ValueKey(id.into()), None)?;
        }
        Ok(found.len() as u64)
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
            planted_bug: self.options.planted_bug(),
        };
        self.kill("it has ended");
        let outcome = self
            .db
            .writer()
            .at_boundary(move |state, fx| apply_commit(state, fx, commit))?;
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
