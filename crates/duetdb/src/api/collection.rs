//! Live collection handles: the CRUD surface ([`Crud`], whose primitives
//! here are one writer command each, parsed and validated before the writer
//! sees them), indexes, counts, distinct, scans, and how a read under a
//! requested strategy would run (explain).

use std::ops::ControlFlow;
use std::sync::Arc;

use bson::{Bson, Document};

use crate::api::crud::{
    CheckedDelete, CheckedModify, CheckedUpdate, Crud, PreparedDoc, StatementResults,
};
use crate::api::database::unexpected;
use crate::api::find::Source;
use crate::api::snapshot::stats_of;
use crate::api::*;
use crate::doc::collation::Collator;
use crate::doc::DocRef;
use crate::durability::effect::Effect;
use crate::error::{Error, Result};
use crate::query::aggregate::prepare;
use crate::query::distinct::Distinct;
use crate::query::limits::ReadLimits;
use crate::query::planner::{self, Hint};
use crate::query::{Filter, SortSpec};
use crate::snapshot::scan::{self, ScanOutcome};
use crate::snapshot::{choose, Choice, Read, Strategy};
use crate::store::collection::ID_INDEX_NAME;
use crate::store::options::CollectionOptions;
use crate::store::DbState;
use crate::write::command::{
    Batch, Command, DeleteCommand, FindAndModifyCommand, FindAndModifyOutcome, InsertOutcome,
    Reply, Statement, UpdateCommand, UpdateResult, MAX_BATCH_STATEMENTS,
};

/// Options of index creation (MongoDB's index options; see
/// [`Collection::create_index_spec`] for the document form).
#[derive(Debug, Clone, Default)]
pub struct IndexOptions {
    pub name: Option<String>,
    pub unique: bool,
    /// Documents lacking every indexed field are not indexed.
    pub sparse: bool,
    /// `partialFilterExpression`: only matching documents are indexed.
    pub partial_filter: Option<Document>,
    /// TTL: the monitor deletes documents whose date is older than this.
    pub expire_after_seconds: Option<i64>,
    /// `wildcardProjection` of a `$**` index.
    pub wildcard_projection: Option<Document>,
}

/// Which index a modification names: by name or by key pattern.
#[derive(Debug, Clone)]
pub enum IndexTarget {
    Name(String),
    Keys(Document),
}

/// Handle on a live collection.
#[derive(Clone, Debug)]
pub struct Collection {
    pub(crate) db: Database,
    pub(crate) name: String,
    /// Writes through this handle skip the validator
    /// (`bypassDocumentValidation`).
    pub(crate) bypass_validation: bool,
    /// The operations' `collation` option (`None`: the collection's default).
    pub(crate) collation: Option<Document>,
}

// The CRUD methods callers use most, inherent so that they need no trait in
// scope; each is [`Crud`]'s (the rest of the surface: `use duetdb::Crud`).
impl Collection {
    /// Insert one document; returns its `_id` (generated when absent).
    pub fn insert_one(&self, doc: Document) -> Result<Bson> {
        Crud::insert_one(self, doc)
    }

    /// Insert many documents; see [`Crud::insert_many`].
    pub fn insert_many(
        &self,
        docs: impl IntoIterator<Item = Document>,
        ordered: bool,
    ) -> Result<Vec<Bson>> {
        Crud::insert_many(self, docs.into_iter().collect(), ordered)
    }

    pub fn find_one(&self, filter: Document) -> Result<Option<Document>> {
        Crud::find_one(self, filter)
    }

    pub fn update_one(&self, filter: Document, update: Document) -> Result<UpdateResult> {
        Crud::update_one(self, filter, update)
    }

    pub fn update_one_with(
        &self,
        filter: Document,
        update: Document,
        options: UpdateOptions,
    ) -> Result<UpdateResult> {
        Crud::update_one_with(self, filter, update, options)
    }

    pub fn update_many(&self, filter: Document, update: Document) -> Result<UpdateResult> {
        Crud::update_many(self, filter, update)
    }

    pub fn replace_one(&self, filter: Document, replacement: Document) -> Result<UpdateResult> {
        Crud::replace_one(self, filter, replacement)
    }

    pub fn delete_one(&self, filter: Document) -> Result<u64> {
        Crud::delete_one(self, filter)
    }

    pub fn delete_many(&self, filter: Document) -> Result<u64> {
        Crud::delete_many(self, filter)
    }

    pub fn find_one_and_update(
        &self,
        filter: Document,
        update: Document,
        options: FindAndModifyOptions,
    ) -> Result<Option<Document>> {
        Crud::find_one_and_update(self, filter, update, options)
    }

    pub fn find_one_and_replace(
        &self,
        filter: Document,
        replacement: Document,
        options: FindAndModifyOptions,
    ) -> Result<Option<Document>> {
        Crud::find_one_and_replace(self, filter, replacement, options)
    }

    pub fn find_one_and_delete(
        &self,
        filter: Document,
        options: FindAndModifyOptions,
    ) -> Result<Option<Document>> {
        Crud::find_one_and_delete(self, filter, options)
    }
}

/// Each primitive is one command for the single writer, so each write is
/// atomic (a `multi` update changes all its matches or none); reads use the
/// database's default strategy.
impl Crud for Collection {
    fn name(&self) -> &str {
        &self.name
    }

    fn insert_prepared(
        &self,
        docs: Vec<PreparedDoc>,
        stmts: &[usize],
        ordered: bool,
    ) -> Result<InsertOutcome> {
        if docs.is_empty() {
            return Ok(InsertOutcome::default());
        }
        match self.db.submit_statements(
            Command::Insert {
                coll: self.name.clone(),
                docs,
                ordered,
                bypass_validation: self.bypass_validation,
            },
            stmts,
        ) {
            Ok(Reply::Inserted(out)) => Ok(out),
            Ok(other) => Err(unexpected(other)),
            // The batch as a whole failed (the writer stopped): nothing is
            // stored, reported at the batch's first document.
            Err(e) => Ok(InsertOutcome {
                inserted: vec![],
                errors: vec![(0, e)],
            }),
        }
    }

    fn update_checked(&self, u: CheckedUpdate) -> Result<UpdateResult> {
        let cmd = self.update_command(u)?;
        updated(self.db.submit(Command::Update(cmd))?)
    }

    fn delete(&self, filter: Document, multi: bool) -> Result<u64> {
        let filter = self.parse_filter(&filter)?;
        deleted(self.db.submit(Command::Delete(DeleteCommand {
            coll: self.name.clone(),
            filter,
            multi,
            hint: None,
        }))?)
    }

    fn update_batch(
        &self,
        stmts: Vec<Result<CheckedUpdate>>,
        ordered: bool,
    ) -> Result<StatementResults<UpdateResult>> {
        let items = stmts
            .into_iter()
            .map(|u| u.and_then(|u| self.update_command(u).map(Statement::Update)))
            .collect();
        Ok(self
            .run_batch(items, ordered)
            .into_iter()
            .map(|r| r.and_then(updated))
            .collect())
    }

    fn delete_batch(
        &self,
        stmts: Vec<Result<CheckedDelete>>,
        ordered: bool,
    ) -> Result<StatementResults<u64>> {
        let items = stmts
            .into_iter()
            .map(|d| {
                let d = d?;
                let collator = self.collator_for(d.collation.as_ref())?;
                Ok(Statement::Delete(DeleteCommand {
                    coll: self.name.clone(),
                    filter: Filter::parse(&d.filter)?.with_collation(collator),
                    multi: d.multi,
                    hint: None,
                }))
            })
            .collect();
        Ok(self
            .run_batch(items, ordered)
            .into_iter()
            .map(|r| r.and_then(deleted))
            .collect())
    }

    fn modify_first(&self, m: CheckedModify) -> Result<FindAndModifyOutcome> {
        let o = &m.options;
        let collator = self.collator()?;
        let cmd = FindAndModifyCommand {
            coll: self.name.clone(),
            filter: Filter::parse(&m.filter)?.with_collation(collator.clone()),
            sort: o
                .sort
                .as_ref()
                .map(SortSpec::parse)
                .transpose()?
                .map(|s| s.with_collation(collator.clone())),
            upsert: o.upsert,
            return_new: o.return_document == ReturnDocument::After,
            hint: o.hint.as_ref().map(Hint::from_bson).transpose()?,
            filter_doc: m.filter,
            update: m.update.map(|u| u.with_collation(collator)),
            bypass_validation: self.bypass_validation,
        };
        match self.db.submit(Command::FindAndModify(cmd))? {
            Reply::FoundAndModified(out) => Ok(out),
            other => Err(unexpected(other)),
        }
    }

    fn op_collator(&self) -> Result<Option<Arc<Collator>>> {
        self.collator()
    }

    fn find_raw(&self, filter: Document, options: FindOptions) -> Result<Vec<DocRef>> {
        self.find(filter).options(options).raw()
    }

    fn count(&self, filter: Document) -> Result<u64> {
        Collection::count(self, filter)
    }

    fn distinct(&self, path: &str, filter: Document) -> Result<Vec<Bson>> {
        Collection::distinct(self, path, filter)
    }

    fn aggregate(&self, pipeline: Vec<Document>) -> Result<Vec<Document>> {
        Collection::aggregate(self, pipeline)
    }
}

/// An update's reply.
fn updated(r: Reply) -> Result<UpdateResult> {
    match r {
        Reply::Updated(r) => Ok(r),
        other => Err(unexpected(other)),
    }
}

/// A delete's reply.
fn deleted(r: Reply) -> Result<u64> {
    match r {
        Reply::Deleted(n) => Ok(n),
        other => Err(unexpected(other)),
    }
}

impl Collection {
    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn database(&self) -> &Database {
        &self.db
    }

    fn state(&self) -> Arc<DbState> {
        self.db.writer().published()
    }

    pub fn find(&self, filter: Document) -> Find {
        let mut find = Find::new(Source::Latest(self.db.clone()), &self.name, filter);
        find.options.collation = self.collation.clone();
        find
    }

    /// The stored document with `_id == id` at the latest commit: the point-read
    /// fast path (no filter parsing, no copy of the bytes).
    pub fn get(&self, id: &Bson) -> Result<Option<DocRef>> {
        let id =
            crate::doc::value::to_raw(id).ok_or_else(|| Error::InvalidId("invalid _id".into()))?;
        let state = self.state();
        Ok(state
            .collection(&self.name)
            .and_then(|c| c.rid_of_id(&id).and_then(|rid| c.get(rid)).cloned()))
    }

    /// Stream every document matching `filter` under `strategy` to `visit`
    /// (which may stop the scan early); no materialization, no order promise
    /// beyond the strategy's. Returns how the scan ran (strategy, snapshot csn).
    pub fn scan_with(
        &self,
        filter: Document,
        strategy: Strategy,
        visit: impl FnMut(&DocRef) -> ControlFlow<()>,
    ) -> Result<ScanOutcome> {
        self.scan_limited(filter, strategy, &ReadLimits::default(), visit)
    }

    /// [`Collection::scan_with`] under `limits` (it stops with
    /// `Error::Interrupted` once `limits.cancel` is cancelled).
    pub fn scan_limited(
        &self,
        filter: Document,
        strategy: Strategy,
        limits: &ReadLimits,
        visit: impl FnMut(&DocRef) -> ControlFlow<()>,
    ) -> Result<ScanOutcome> {
        let read = Read::Count { match_all: false };
        self.scan_read(filter, strategy, read, limits, visit)
    }

    /// [`Collection::scan_with`] for a given kind of read (the choice of
    /// strategy depends on it).
    pub(crate) fn scan_read(
        &self,
        filter: Document,
        strategy: Strategy,
        read: Read,
        limits: &ReadLimits,
        mut visit: impl FnMut(&DocRef) -> ControlFlow<()>,
    ) -> Result<ScanOutcome> {
        let mut parsed = self.parse_filter(&filter)?;
        limits.counting(&mut parsed);
        let outcome = scan::scan(
            self.db.writer(),
            &self.name,
            &parsed,
            |c| planner::plan(c, &parsed, None, None),
            strategy,
            read,
            &limits.cancel,
            |d| visit(d),
        )?;
        self.db.note_read(outcome.strategy);
        Ok(outcome)
    }

    /// Count matching documents under the database's default strategy.
    pub fn count(&self, filter: Document) -> Result<u64> {
        self.count_with(filter, self.db.default_strategy())
    }

    /// Count matching documents under `strategy`. Counting everything under
    /// `cow` (or `auto`) reads the collection size of one published root
    /// (O(1), consistent).
    pub fn count_with(&self, filter: Document, strategy: Strategy) -> Result<u64> {
        Ok(self.count_detailed(filter, strategy)?.0)
    }

    /// [`Collection::count_with`] and how the count ran.
    pub fn count_detailed(
        &self,
        filter: Document,
        strategy: Strategy,
    ) -> Result<(u64, ScanOutcome)> {
        self.count_limited(filter, strategy, &ReadLimits::default())
    }

    /// [`Collection::count_detailed`] under `limits` (cancellable).
    pub fn count_limited(
        &self,
        filter: Document,
        strategy: Strategy,
        limits: &ReadLimits,
    ) -> Result<(u64, ScanOutcome)> {
        let mut parsed = self.parse_filter(&filter)?;
        // Counting everything examines nothing under `cow` (one root's size).
        if !parsed.is_match_all() {
            limits.counting(&mut parsed);
        }
        let (n, outcome) = scan::count(
            self.db.writer(),
            &self.name,
            &parsed,
            strategy,
            &limits.cancel,
        )?;
        self.db.note_read(outcome.strategy);
        Ok((n, outcome))
    }

    /// Distinct values of `path` among matching documents (arrays contribute
    /// their elements), in BSON order, under the database's default strategy.
    pub fn distinct(&self, path: &str, filter: Document) -> Result<Vec<Bson>> {
        Ok(self
            .distinct_with(path, filter, self.db.default_strategy())?
            .0)
    }

    /// Distinct values under `strategy`, and how the scan ran.
    pub fn distinct_with(
        &self,
        path: &str,
        filter: Document,
        strategy: Strategy,
    ) -> Result<(Vec<Bson>, ScanOutcome)> {
        self.distinct_limited(path, filter, strategy, &ReadLimits::default())
    }

    /// [`Collection::distinct_with`] under `limits` (cancellable).
    pub fn distinct_limited(
        &self,
        path: &str,
        filter: Document,
        strategy: Strategy,
        limits: &ReadLimits,
    ) -> Result<(Vec<Bson>, ScanOutcome)> {
        let mut d = Distinct::new(path)?.with_collation(self.collator()?);
        let outcome = self.scan_limited(filter, strategy, limits, |doc| {
            d.feed(doc);
            ControlFlow::Continue(())
        })?;
        Ok((d.finish()?, outcome))
    }

    /// How [`Collection::count_with`] would run: the plan of `filter` and the
    /// strategy [`choose`] picks for a count (explain's `strategy`,
    /// `strategyReason`), without running it.
    pub fn explain_count(&self, filter: Document, strategy: Strategy) -> Result<Document> {
        let read = Read::Count {
            match_all: Filter::parse(&filter)?.is_match_all(),
        };
        let choice = self.choice(&filter, read, strategy)?;
        let plan = self.find(filter).snapshot(strategy).explain()?;
        Ok(with_choice(plan, strategy, choice))
    }

    /// How [`Collection::distinct_with`] would run (see
    /// [`Collection::explain_count`]).
    pub fn explain_distinct(&self, filter: Document, strategy: Strategy) -> Result<Document> {
        let read = Read::Count { match_all: false };
        let choice = self.choice(&filter, read, strategy)?;
        let plan = self.find(filter).snapshot(strategy).explain()?;
        Ok(with_choice(plan, strategy, choice))
    }

    /// How [`Collection::aggregate_with`] would run `pipeline` under
    /// `strategy`: the split and plan of [`Collection::explain_aggregate`],
    /// with the strategy [`choose`] picks for this request (an `olcp`
    /// request on an order-dependent pipeline runs as `vls`, and says why).
    pub fn explain_aggregate_with(
        &self,
        pipeline: Vec<Document>,
        strategy: Strategy,
    ) -> Result<Document> {
        let p = prepare(&pipeline)?;
        // As `aggregate_with` classifies the read: arrival order cannot matter
        // when the scan part is commutative and nothing stops it early.
        let read = Read::Aggregate {
            commutative: p.eligible && p.stop_after.is_none(),
        };
        let choice = self.choice(&p.filter, read, strategy)?;
        Ok(with_choice(
            self.explain_aggregate(pipeline)?,
            strategy,
            choice,
        ))
    }

    /// The strategy a read of `filter` of kind `read` runs under when
    /// `requested`: [`choose`] with the plan on the latest state.
    fn choice(&self, filter: &Document, read: Read, requested: Strategy) -> Result<Choice> {
        let filter = self.parse_filter(filter)?;
        let state = self.state();
        let plan = match state.collection(&self.name) {
            Some(c) => Some(planner::plan(c, &filter, None, None)?),
            None => None,
        };
        Ok(choose(requested, read, plan.as_ref()))
    }

    /// Create an index (built over existing documents); returns its name.
    /// Creating an identical index again is a no-op.
    pub fn create_index(&self, keys: Document, options: IndexOptions) -> Result<String> {
        let mut spec = bson::doc! {"key": keys};
        if let Some(n) = options.name {
            spec.insert("name", n);
        }
        if options.unique {
            spec.insert("unique", true);
        }
        if options.sparse {
            spec.insert("sparse", true);
        }
        if let Some(p) = options.partial_filter {
            spec.insert("partialFilterExpression", p);
        }
        if let Some(s) = options.expire_after_seconds {
            spec.insert("expireAfterSeconds", s);
        }
        if let Some(p) = options.wildcard_projection {
            spec.insert("wildcardProjection", p);
        }
        self.create_index_spec(&spec)
    }

    /// Create an index from a MongoDB index specification document
    /// (`{key, name, unique, sparse, partialFilterExpression,
    /// expireAfterSeconds, wildcardProjection}`, as `createIndexes` takes);
    /// returns its name. An identical index again is a no-op; conflicts are
    /// 85 IndexOptionsConflict / 86 IndexKeySpecsConflict, as MongoDB.
    /// Large collections build outside the writer (`api::index_build`).
    pub fn create_index_spec(&self, spec: &Document) -> Result<String> {
        self.create_index_spec_with(spec, &crate::api::index_build::IndexBuildOptions::default())
    }

    /// Set the `expireAfterSeconds` of an index (`collMod`'s `index` option):
    /// a TTL index gets a new value, a single-field ascending/descending one
    /// becomes a TTL index (MongoDB 5.1+). Returns the old value (`None`: it
    /// was not a TTL index) and the new one. Logged as the index dropped and
    /// created again with its new spec; its entries are kept as they are.
    pub fn set_expire_after_seconds(
        &self,
        target: IndexTarget,
        expire_after_seconds: &Bson,
    ) -> Result<(Option<i64>, i64)> {
        let coll = self.name.clone();
        let value = expire_after_seconds.clone();
        self.db.writer().at_boundary(move |state, fx| {
            let c = state
                .collection_mut(&coll)
                .ok_or_else(|| Error::NamespaceNotFound(coll.clone()))?;
            let index = c
                .indexes
                .iter()
                .find(|i| match &target {
                    IndexTarget::Name(n) => &i.spec.name == n,
                    IndexTarget::Keys(k) => &i.spec.key_pattern() == k,
                })
                .ok_or_else(|| {
                    Error::IndexNotFound(match &target {
                        IndexTarget::Name(n) => n.clone(),
                        IndexTarget::Keys(k) => k.to_string(),
                    })
                })?;
            let mut spec = (*index.spec).clone();
            let secs = crate::query::index_spec::expire_after_seconds(&value, &spec)?;
            let old = spec.expire_after_seconds.replace(secs);
            let name = spec.name.clone();
            if old != Some(secs) {
                c.replace_index_spec(&name, spec.clone())?;
                fx.record(|| Effect::DropIndex {
                    coll: coll.clone(),
                    name: name.clone(),
                });
                fx.record(|| Effect::CreateIndex {
                    coll: coll.clone(),
                    spec,
                });
            }
            Ok((old, secs))
        })
    }

    /// The collection's `create`/`collMod` options (NamespaceNotFound when
    /// it does not exist).
    pub fn options(&self) -> Result<CollectionOptions> {
        self.state()
            .collection(&self.name)
            .map(|c| c.options.clone())
            .ok_or_else(|| Error::NamespaceNotFound(self.name.clone()))
    }

    /// Turn `changeStreamPreAndPostImages` on or off (`collMod`): from the
    /// next write on, updates, replacements and deletes record (or stop
    /// recording) the version they change, for change streams'
    /// `fullDocumentBeforeChange`. Returns the previous setting.
    pub fn set_pre_and_post_images(&self, enabled: bool) -> Result<bool> {
        self.set_options(move |o| o.pre_and_post_images = enabled)
            .map(|old| old.pre_and_post_images)
    }

    /// Change the collection's options (`collMod`): `edit` changes a copy,
    /// which is checked (a validator must compile: query operators,
    /// `$jsonSchema`, `$expr`; `$where`, `$near`, `$text` refused, 2) and
    /// completed with the defaults MongoDB stores beside a validator, then
    /// stored and logged as one `SetOptions` effect at a command boundary.
    /// NamespaceNotFound when the collection does not exist; a refused
    /// change changes nothing. Existing documents are not revalidated, as
    /// MongoDB. Returns the previous options.
    pub fn set_options(
        &self,
        edit: impl FnOnce(&mut CollectionOptions) + Send + 'static,
    ) -> Result<CollectionOptions> {
        let coll = self.name.clone();
        self.db.writer().at_boundary(move |state, fx| {
            let c = state
                .collection_mut(&coll)
                .ok_or_else(|| Error::NamespaceNotFound(coll.clone()))?;
            let old = c.options.clone();
            let mut new = old.clone();
            edit(&mut new);
            let new = new.with_defaults();
            crate::query::validator::check(&new)?;
            if new != old {
                c.options = new.clone();
                fx.record(|| Effect::SetOptions { coll, options: new });
            }
            Ok(old)
        })
    }

    /// This handle with a `collation` option: its reads, updates and
    /// deletes compare strings under it (`{locale: "simple"}`: binary);
    /// `None` uses the collection's default collation.
    pub fn with_collation(mut self, collation: Option<Document>) -> Collection {
        self.collation = collation;
        self
    }

    /// The collator of this handle's operations: its `collation` option,
    /// else the collection's default (`None`: simple).
    pub fn collator(&self) -> Result<Option<Arc<Collator>>> {
        self.collator_for(None)
    }

    /// The collator of an operation with its own `collation` option
    /// (`over`), else [`Collection::collator`].
    fn collator_for(&self, over: Option<&Document>) -> Result<Option<Arc<Collator>>> {
        match over.or(self.collation.as_ref()) {
            Some(d) => Collator::from_document(d),
            None => Ok(self
                .state()
                .collection(&self.name)
                .and_then(|c| c.options.collation.clone())),
        }
    }

    /// The writer command of a checked update, under its collation.
    fn update_command(&self, u: CheckedUpdate) -> Result<UpdateCommand> {
        let collator = self.collator_for(u.collation.as_ref())?;
        Ok(UpdateCommand {
            coll: self.name.clone(),
            filter: Filter::parse(&u.filter)?.with_collation(collator.clone()),
            filter_doc: u.filter,
            // The update's comparisons (`$addToSet`, `$pull`, `$min`, a
            // pipeline's expressions…) take the operation's collation too.
            update: u.spec.with_collation(collator),
            multi: u.multi,
            upsert: u.options.upsert,
            bypass_validation: self.bypass_validation,
            hint: u.options.hint.as_ref().map(Hint::from_bson).transpose()?,
        })
    }

    /// Run a batch's statements (item `i` is statement `i` of the handle's
    /// client operation) as writer batches of at most [`MAX_BATCH_STATEMENTS`]
    /// statements, each one writer command applied inside one group; an
    /// ordered batch stops after its first failure. A writer command that
    /// fails as a whole (a failed WAL append, a stopped writer) applied
    /// none of its statements: each of them reports the error (an ordered
    /// batch only its first), as each did when it was a command of its own.
    fn run_batch(&self, items: Vec<Result<Statement>>, ordered: bool) -> StatementResults<Reply> {
        let mut out: StatementResults<Reply> = Vec::with_capacity(items.len());
        let mut rest = items.into_iter().peekable();
        while rest.peek().is_some() {
            let first = out.len();
            let chunk: Vec<_> = rest.by_ref().take(MAX_BATCH_STATEMENTS).collect();
            let n = chunk.len();
            let positions: Vec<usize> = (first..first + n).collect();
            let cmd = Command::Batch(Batch {
                items: chunk,
                ordered,
            });
            let replied = match self.db.submit_statements(cmd, &positions) {
                Ok(Reply::Batch(results)) => Ok(results),
                Ok(other) => Err(unexpected(other)),
                Err(e) => Err(e),
            };
            match replied {
                Ok(results) => out.extend(results),
                Err(e) => {
                    let failed = if ordered { 1 } else { n };
                    out.extend(std::iter::repeat_n(e, failed).map(Err));
                }
            }
            if ordered && out.last().is_some_and(|r| r.is_err()) {
                break;
            }
            // Unordered, every statement has its result: positions stay aligned.
            debug_assert!(
                ordered || out.len() == first + n,
                "a statement without a result"
            );
        }
        out
    }

    /// Parse a filter of this handle's operations (under its collator).
    fn parse_filter(&self, filter: &Document) -> Result<Filter> {
        let read_time = self.state().ts;
        let f = crate::query::expr::under_read_time(read_time, || Filter::parse(filter))?;
        Ok(f.with_collation(self.collator()?))
    }

    /// This handle with `bypassDocumentValidation` set: its inserts and
    /// updates skip the collection's validator.
    pub fn bypass_document_validation(mut self, bypass: bool) -> Collection {
        self.bypass_validation = bypass;
        self
    }

    /// Drop index `name`; an index of that name still being built is
    /// aborted instead (its `createIndexes` fails with 276, as MongoDB).
    pub fn drop_index(&self, name: &str) -> Result<()> {
        let dropped = self.db.submit(Command::DropIndex {
            coll: self.name.clone(),
            name: name.to_string(),
        });
        match dropped {
            Err(Error::IndexNotFound(_))
                if self.abort_index_builds(Some(name), "index dropped during the build") > 0 =>
            {
                Ok(())
            }
            other => other.map(|_| ()),
        }
    }

    /// Index descriptions as MongoDB's `listIndexes` returns them.
    pub fn list_indexes(&self) -> Result<Vec<Document>> {
        list_indexes_in(&self.state(), &self.name)
    }

    pub fn stats(&self) -> Result<CollStats> {
        let state = self.state();
        state
            .collection(&self.name)
            .map(stats_of)
            .ok_or_else(|| Error::NamespaceNotFound(self.name.clone()))
    }

    /// Check every structural invariant of the current version (tests, `duet check`).
    pub fn check_invariants(&self) -> Result<(), String> {
        match self.state().collection(&self.name) {
            Some(c) => c.check_invariants(),
            None => Ok(()),
        }
    }
}

/// An explain document reporting `choice` for a `requested` strategy.
fn with_choice(mut explain: Document, requested: Strategy, choice: Choice) -> Document {
    explain.insert("strategy", choice.strategy.name());
    explain.insert("strategyReason", choice.reason);
    explain.insert("requestedStrategy", requested.name());
    explain
}

/// The index specifications of collection `name` in `state`, `_id` first
/// (live collections and held snapshots alike).
pub(crate) fn list_indexes_in(state: &crate::store::DbState, name: &str) -> Result<Vec<Document>> {
    let c = state
        .collection(name)
        .ok_or_else(|| Error::NamespaceNotFound(name.to_string()))?;
    // The `_id` index: with the collection's collation when it has one
    // (the collated `_id` index, listed once, as MongoDB's `_id_`).
    let mut id = bson::doc! {"v": 2, "key": {"_id": 1}, "name": ID_INDEX_NAME};
    if let Some(c) = c
        .collated_id_index()
        .and_then(|i| i.spec.collation.as_ref())
    {
        id.insert("collation", c.spec().to_document());
    }
    let mut out = vec![id];
    out.extend(
        c.indexes
            .iter()
            .filter(|i| !i.spec.is_collated_id())
            .map(|i| i.spec.to_document()),
    );
    Ok(out)
}
