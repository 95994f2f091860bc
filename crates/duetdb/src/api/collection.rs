//! Live collection handles: CRUD, indexes, counts, distinct, scans. Writes
//! are parsed and validated here, then applied by the single writer.

use std::ops::ControlFlow;
use std::sync::Arc;

use bson::{Bson, Document};

use crate::api::database::unexpected;
use crate::api::find::Source;
use crate::api::snapshot::stats_of;
use crate::api::*;
use crate::doc::{self, DocRef};
use crate::error::BulkWriteFailure;
use crate::error::{Error, Result};
use crate::query::distinct::Distinct;
use crate::query::planner::{self, Hint};
use crate::query::{Filter, Projection, SortSpec, UpdateSpec};
use crate::snapshot::scan::{self, ScanOutcome};
use crate::snapshot::{Read, Strategy};
use crate::store::collection::ID_INDEX_NAME;
use crate::store::index::IndexSpec;
use crate::store::DbState;
use crate::write::command::{
    Command, FindAndModifyCommand, FindAndModifyOutcome, InsertOutcome, Reply, UpdateCommand,
    UpdateResult,
};

/// Options of an update.
#[derive(Debug, Clone, Default)]
pub struct UpdateOptions {
    pub upsert: bool,
    pub hint: Option<Bson>,
}

/// Which version a find-and-modify returns.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum ReturnDocument {
    #[default]
    Before,
    After,
}

/// Options of the find-one-and-* operations.
#[derive(Debug, Clone, Default)]
pub struct FindAndModifyOptions {
    pub sort: Option<Document>,
    pub projection: Option<Document>,
    pub upsert: bool,
    pub return_document: ReturnDocument,
    pub hint: Option<Bson>,
}

/// Options of index creation.
#[derive(Debug, Clone, Default)]
pub struct IndexOptions {
    pub name: Option<String>,
    pub unique: bool,
}

/// Handle on a live collection.
#[derive(Clone, Debug)]
pub struct Collection {
    pub(crate) db: Database,
    pub(crate) name: String,
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

    /// Insert one document; returns its `_id` (generated when absent).
    pub fn insert_one(&self, doc: Document) -> Result<Bson> {
        validate_collection_name(&self.name)?;
        let prepared = doc::prepare_insert(&doc)?;
        match self.db.submit(Command::Insert {
            coll: self.name.clone(),
            docs: vec![prepared],
            ordered: true,
        })? {
            Reply::Inserted(out) => match (
                out.inserted.into_iter().next(),
                out.errors.into_iter().next(),
            ) {
                (Some((_, id)), _) => Ok(id),
                (None, Some((_, e))) => Err(e),
                (None, None) => Err(Error::Internal("insert reported nothing".into())),
            },
            other => Err(unexpected(other)),
        }
    }

    /// Insert many documents. `ordered` stops at the first error (MongoDB's
    /// default); unordered tries every document. Any error returns
    /// [`Error::BulkWrite`] listing each failed position; the rest are stored.
    pub fn insert_many(
        &self,
        docs: impl IntoIterator<Item = Document>,
        ordered: bool,
    ) -> Result<Vec<Bson>> {
        validate_collection_name(&self.name)?;
        let mut prepared = Vec::new();
        let mut errors: Vec<(usize, Error)> = Vec::new();
        let mut positions = Vec::new();
        for (i, d) in docs.into_iter().enumerate() {
            match doc::prepare_insert(&d) {
                Ok(p) => {
                    prepared.push(p);
                    positions.push(i);
                }
                Err(e) => {
                    errors.push((i, e));
                    if ordered {
                        break;
                    }
                }
            }
        }
        let mut ids = Vec::new();
        if !prepared.is_empty() {
            let out = match self.db.submit(Command::Insert {
                coll: self.name.clone(),
                docs: prepared,
                ordered,
            }) {
                Ok(Reply::Inserted(out)) => out,
                Ok(other) => return Err(unexpected(other)),
                Err(e) => InsertOutcome {
                    inserted: vec![],
                    errors: vec![(0, e)],
                },
            };
            ids = out.inserted.iter().map(|(_, id)| id.clone()).collect();
            errors.extend(
                out.errors
                    .into_iter()
                    .map(|(i, e)| (positions.get(i).copied().unwrap_or(i), e)),
            );
        }
        errors.sort_by_key(|(i, _)| *i);
        if ordered {
            // Stop reporting at the first failure, as an ordered batch stops there.
            errors.truncate(1);
        }
        if errors.is_empty() {
            Ok(ids)
        } else {
            Err(Error::BulkWrite(Box::new(BulkWriteFailure {
                inserted: ids.len(),
                errors,
            })))
        }
    }

    pub fn find(&self, filter: Document) -> Find {
        Find {
            source: Source::Latest(self.db.clone()),
            coll: self.name.clone(),
            filter,
            options: Default::default(),
            strategy: None,
        }
    }

    pub fn find_one(&self, filter: Document) -> Result<Option<Document>> {
        Ok(self.find(filter).limit(1).run()?.pop())
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
        self.scan_read(filter, strategy, Read::Count { match_all: false }, visit)
    }

    /// [`Collection::scan_with`] for a given kind of read (the choice of
    /// strategy depends on it).
    pub(crate) fn scan_read(
        &self,
        filter: Document,
        strategy: Strategy,
        read: Read,
        mut visit: impl FnMut(&DocRef) -> ControlFlow<()>,
    ) -> Result<ScanOutcome> {
        let parsed = Filter::parse(&filter)?;
        let outcome = scan::scan(
            self.db.writer(),
            &self.name,
            &parsed,
            |c| planner::plan(c, &parsed, None, None),
            strategy,
            read,
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
        let parsed = Filter::parse(&filter)?;
        let (n, outcome) = scan::count(self.db.writer(), &self.name, &parsed, strategy)?;
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
        let mut d = Distinct::new(path)?;
        let outcome = self.scan_with(filter, strategy, |doc| {
            d.feed(doc);
            ControlFlow::Continue(())
        })?;
        Ok((d.finish()?, outcome))
    }

    fn update_cmd(
        &self,
        filter: Document,
        update: UpdateSpec,
        multi: bool,
        options: UpdateOptions,
    ) -> Result<UpdateResult> {
        validate_collection_name(&self.name)?;
        let cmd = UpdateCommand {
            coll: self.name.clone(),
            filter: Filter::parse(&filter)?,
            filter_doc: filter,
            update,
            multi,
            upsert: options.upsert,
            hint: options.hint.as_ref().map(Hint::from_bson).transpose()?,
        };
        match self.db.submit(Command::Update(cmd))? {
            Reply::Updated(r) => Ok(r),
            other => Err(unexpected(other)),
        }
    }

    /// Parse an update that must use operators (`update_one`/`update_many`).
    pub(crate) fn operators(update: &Document) -> Result<UpdateSpec> {
        let spec = UpdateSpec::parse(update)?;
        if spec.is_replacement() {
            return Err(Error::bad_value(
                "update document requires atomic operators",
            ));
        }
        Ok(spec)
    }

    /// Parse a replacement document (`replace_one`).
    pub(crate) fn replacement(doc: &Document) -> Result<UpdateSpec> {
        let spec = UpdateSpec::parse(doc)?;
        if !spec.is_replacement() {
            return Err(Error::bad_value(
                "replacement document must not contain atomic operators",
            ));
        }
        Ok(spec)
    }

    pub fn update_one(&self, filter: Document, update: Document) -> Result<UpdateResult> {
        self.update_one_with(filter, update, UpdateOptions::default())
    }

    pub fn update_one_with(
        &self,
        filter: Document,
        update: Document,
        options: UpdateOptions,
    ) -> Result<UpdateResult> {
        self.update_cmd(filter, Self::operators(&update)?, false, options)
    }

    pub fn update_many(&self, filter: Document, update: Document) -> Result<UpdateResult> {
        self.update_many_with(filter, update, UpdateOptions::default())
    }

    pub fn update_many_with(
        &self,
        filter: Document,
        update: Document,
        options: UpdateOptions,
    ) -> Result<UpdateResult> {
        self.update_cmd(filter, Self::operators(&update)?, true, options)
    }

    pub fn replace_one(&self, filter: Document, replacement: Document) -> Result<UpdateResult> {
        self.replace_one_with(filter, replacement, UpdateOptions::default())
    }

    pub fn replace_one_with(
        &self,
        filter: Document,
        replacement: Document,
        options: UpdateOptions,
    ) -> Result<UpdateResult> {
        self.update_cmd(filter, Self::replacement(&replacement)?, false, options)
    }

    /// Update (or replace) with an already-parsed spec: the server's `update` command.
    pub fn update_with_spec(
        &self,
        filter: Document,
        update: UpdateSpec,
        multi: bool,
        options: UpdateOptions,
    ) -> Result<UpdateResult> {
        if multi && update.is_replacement() {
            return Err(Error::bad_value(
                "multi update is not supported for replacement-style update",
            ));
        }
        self.update_cmd(filter, update, multi, options)
    }

    fn delete(&self, filter: Document, multi: bool) -> Result<u64> {
        let filter = Filter::parse(&filter)?;
        match self.db.submit(Command::Delete {
            coll: self.name.clone(),
            filter,
            multi,
            hint: None,
        })? {
            Reply::Deleted(n) => Ok(n),
            other => Err(unexpected(other)),
        }
    }

    pub fn delete_one(&self, filter: Document) -> Result<u64> {
        self.delete(filter, false)
    }

    pub fn delete_many(&self, filter: Document) -> Result<u64> {
        self.delete(filter, true)
    }

    fn find_and_modify(
        &self,
        filter: Document,
        update: Option<UpdateSpec>,
        options: FindAndModifyOptions,
    ) -> Result<(Option<Document>, FindAndModifyOutcome)> {
        validate_collection_name(&self.name)?;
        let projection = options
            .projection
            .as_ref()
            .filter(|p| !p.is_empty())
            .map(Projection::parse)
            .transpose()?;
        let cmd = FindAndModifyCommand {
            coll: self.name.clone(),
            filter: Filter::parse(&filter)?,
            filter_doc: filter,
            sort: options.sort.as_ref().map(SortSpec::parse).transpose()?,
            update,
            upsert: options.upsert,
            return_new: options.return_document == ReturnDocument::After,
            hint: options.hint.as_ref().map(Hint::from_bson).transpose()?,
        };
        let out = match self.db.submit(Command::FindAndModify(cmd))? {
            Reply::FoundAndModified(out) => out,
            other => return Err(unexpected(other)),
        };
        let doc = match &out.doc {
            Some(d) => Some(match &projection {
                Some(p) => p.apply(d)?,
                None => doc::to_document(d)?,
            }),
            None => None,
        };
        Ok((doc, out))
    }

    pub fn find_one_and_update(
        &self,
        filter: Document,
        update: Document,
        options: FindAndModifyOptions,
    ) -> Result<Option<Document>> {
        Ok(self
            .find_and_modify(filter, Some(Self::operators(&update)?), options)?
            .0)
    }

    pub fn find_one_and_replace(
        &self,
        filter: Document,
        replacement: Document,
        options: FindAndModifyOptions,
    ) -> Result<Option<Document>> {
        Ok(self
            .find_and_modify(filter, Some(Self::replacement(&replacement)?), options)?
            .0)
    }

    pub fn find_one_and_delete(
        &self,
        filter: Document,
        options: FindAndModifyOptions,
    ) -> Result<Option<Document>> {
        Ok(self.find_and_modify(filter, None, options)?.0)
    }

    /// The general findAndModify (the server's command): document plus outcome.
    pub fn find_and_modify_with_spec(
        &self,
        filter: Document,
        update: Option<UpdateSpec>,
        options: FindAndModifyOptions,
    ) -> Result<(Option<Document>, FindAndModifyOutcome)> {
        self.find_and_modify(filter, update, options)
    }

    /// Create an index (built over existing documents); returns its name.
    /// Creating an identical index again is a no-op.
    pub fn create_index(&self, keys: Document, options: IndexOptions) -> Result<String> {
        validate_collection_name(&self.name)?;
        let spec = IndexSpec::new(&keys, options.name.as_deref(), options.unique)?;
        let name = if spec.fields.len() == 1 && spec.fields[0] == ("_id".to_string(), true) {
            ID_INDEX_NAME.to_string()
        } else {
            spec.name.clone()
        };
        self.db.submit(Command::CreateIndex {
            coll: self.name.clone(),
            spec,
        })?;
        Ok(name)
    }

    pub fn drop_index(&self, name: &str) -> Result<()> {
        self.db
            .submit(Command::DropIndex {
                coll: self.name.clone(),
                name: name.to_string(),
            })
            .map(|_| ())
    }

    /// Index descriptions as MongoDB's `listIndexes` returns them.
    pub fn list_indexes(&self) -> Result<Vec<Document>> {
        let state = self.state();
        let c = state
            .collection(&self.name)
            .ok_or_else(|| Error::NamespaceNotFound(self.name.clone()))?;
        let mut out = vec![bson::doc! {"v": 2, "key": {"_id": 1}, "name": ID_INDEX_NAME}];
        for i in &c.indexes {
            let mut d =
                bson::doc! {"v": 2, "key": i.spec.key_pattern(), "name": i.spec.name.clone()};
            if i.spec.unique {
                d.insert("unique", true);
            }
            out.push(d);
        }
        Ok(out)
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
