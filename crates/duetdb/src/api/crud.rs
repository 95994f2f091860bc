//! One CRUD surface for every collection handle. [`Crud`] is implemented by a
//! live [`Collection`](crate::api::Collection) (each write one atomic writer
//! command, reads under the database's default strategy) and by a
//! transaction's [`TxnCollection`](crate::api::TxnCollection) (its snapshot
//! overlaid with its own buffered writes). A handle implements the
//! primitives, where the two really differ; everything else — checking
//! arguments, per-document insert errors, projections, the convenience
//! forms — is written once here as provided methods, so both handles behave
//! alike by construction and a server can run one command on either.
//!
//! Invariants:
//! - every argument is parsed and checked before a primitive runs, so a
//!   refused call changes nothing (a bad projection fails a findAndModify
//!   before it writes; a bad document fails only its own position); only an
//!   error evaluating a findAndModify's projection comes after its write,
//!   as MongoDB's plan evaluates it after the update;
//! - insert errors carry their input position and come back in input
//!   order; an ordered insert stops at, and reports only, the first failure;
//! - primitives never see a `multi` replacement or an invalid collection
//!   name on a write ([`CheckedUpdate`], [`CheckedModify`]);
//! - a batch of update or delete statements ([`Crud::update_statements`],
//!   [`Crud::delete_statements`]) gives, statement by statement, what the
//!   same statements run one by one give (`tests/batch.rs` checks it
//!   against that reference); only how many writer commands carry them
//!   differs between the handles;
//! - the trait is sealed: the primitives may change with the engine.

use std::sync::Arc;

use bson::raw::RawDocumentBuf;
use bson::{Bson, Document, RawBson};

use crate::api::{validate_collection_name, FindOptions};
use crate::doc::collation::Collator;
use crate::doc::{self, DocRef};
use crate::error::{BulkWriteFailure, Error, Result};
use crate::query::{Projection, SortSpec, UpdateSpec};
pub use crate::write::command::{FindAndModifyOutcome, InsertOutcome, UpdateResult};

/// Options of an update.
#[derive(Debug, Clone, Default)]
pub struct UpdateOptions {
    pub upsert: bool,
    /// An index to use (live collections; a transaction plans on its snapshot).
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
    /// An index to use (live collections; a transaction plans on its snapshot).
    pub hint: Option<Bson>,
    /// The command's `let` variables, for the projection's expressions (the
    /// filter and update carry their own).
    pub let_vars: Option<Document>,
}

/// A document ready to store: its bytes and its `_id`.
pub type PreparedDoc = (RawDocumentBuf, RawBson);

/// An update whose arguments are checked (a valid collection name, `multi`
/// only with operators): only [`Crud::update_with_spec`] and
/// [`Crud::update_statements`] make one, so a primitive never sees an
/// unchecked update.
#[derive(Debug)]
pub struct CheckedUpdate {
    pub(crate) filter: Document,
    pub(crate) spec: UpdateSpec,
    pub(crate) multi: bool,
    pub(crate) options: UpdateOptions,
    /// The statement's own `collation` (`None`: the handle's).
    pub(crate) collation: Option<Document>,
}

/// A delete statement whose collection name is checked (only
/// [`Crud::delete_statements`] makes one).
#[derive(Debug)]
pub struct CheckedDelete {
    pub(crate) filter: Document,
    pub(crate) multi: bool,
    /// The statement's own `collation` (`None`: the handle's).
    pub(crate) collation: Option<Document>,
}

/// One statement of an update command (MongoDB's `updates[i]`): what
/// [`Crud::update_with_spec`] takes, and the statement's own `collation`.
#[derive(Debug, Clone)]
pub struct UpdateStatement {
    pub filter: Document,
    pub update: UpdateSpec,
    pub multi: bool,
    pub options: UpdateOptions,
    /// `None`: the handle's collation, else the collection's default.
    pub collation: Option<Document>,
}

/// One statement of a delete command (MongoDB's `deletes[i]`).
#[derive(Debug, Clone)]
pub struct DeleteStatement {
    pub filter: Document,
    /// `limit: 0` (every match) rather than `limit: 1`.
    pub multi: bool,
    /// `None`: the handle's collation, else the collection's default.
    pub collation: Option<Document>,
}

/// What each statement of a batch did, in order: one entry per statement
/// that ran (an ordered batch ends at its first failure).
pub type StatementResults<T> = Vec<Result<T>>;

/// A findAndModify whose arguments are checked (a valid collection name, a
/// valid projection): only [`Crud::find_and_modify_with_spec`] makes one.
#[derive(Debug)]
pub struct CheckedModify {
    pub(crate) filter: Document,
    /// `None`: delete the document found.
    pub(crate) update: Option<UpdateSpec>,
    pub(crate) options: FindAndModifyOptions,
}

mod sealed {
    /// Only the engine's handles implement [`super::Crud`].
    pub trait Sealed {}
    impl Sealed for crate::api::Collection {}
    impl Sealed for crate::api::TxnCollection<'_> {}
}

/// The CRUD operations of a collection handle, live or in a transaction.
/// Call the provided methods; the required ones are the primitives each
/// handle implements, reached only through them.
pub trait Crud: sealed::Sealed {
    /// The collection's name.
    fn name(&self) -> &str;

    /// Primitive: store prepared documents, positions counted in `docs`;
    /// `ordered` stops at the first failure. `stmts[i]` is document `i`'s
    /// position in the caller's batch (its statement: a retryable write
    /// records which statements it applied, `Database::with_statements`).
    fn insert_prepared(
        &self,
        docs: Vec<PreparedDoc>,
        stmts: &[usize],
        ordered: bool,
    ) -> Result<InsertOutcome>;

    /// Primitive: update the first (or, with `multi`, every) match of the
    /// filter, or upsert; a failing update changes nothing.
    fn update_checked(&self, update: CheckedUpdate) -> Result<UpdateResult>;

    /// Delete the first (or, with `multi`, every) match of `filter`; returns
    /// how many were deleted.
    fn delete(&self, filter: Document, multi: bool) -> Result<u64>;

    /// Primitive: apply update statements in order, each exactly as
    /// [`Crud::update_checked`] would apply it alone (an `Err` statement
    /// fails in its place, changing nothing); `ordered` stops after the
    /// first failure. Statement `i` is item `i` of the handle's client
    /// operation (`Database::with_statements`).
    fn update_batch(
        &self,
        stmts: Vec<Result<CheckedUpdate>>,
        ordered: bool,
    ) -> Result<StatementResults<UpdateResult>>;

    /// Primitive: [`Crud::update_batch`] for delete statements.
    fn delete_batch(
        &self,
        stmts: Vec<Result<CheckedDelete>>,
        ordered: bool,
    ) -> Result<StatementResults<u64>>;

    /// Primitive: update or delete the first match of the filter in
    /// `options.sort` order, or upsert; the outcome holds the version
    /// `options.return_document` asks for, unprojected.
    fn modify_first(&self, modify: CheckedModify) -> Result<FindAndModifyOutcome>;

    /// Primitive: the collation this handle's operations compare strings
    /// under (`None`: simple).
    fn op_collator(&self) -> Result<Option<Arc<Collator>>>;

    /// The matching stored documents, sorted, skipped and limited (shared,
    /// unprojected; `options.projection` is checked, not applied).
    fn find_raw(&self, filter: Document, options: FindOptions) -> Result<Vec<DocRef>>;

    /// How many documents match `filter`.
    fn count(&self, filter: Document) -> Result<u64>;

    /// Distinct values of `path` among matching documents (arrays contribute
    /// their elements), in BSON order.
    fn distinct(&self, path: &str, filter: Document) -> Result<Vec<Bson>>;

    /// Run an aggregation pipeline.
    fn aggregate(&self, pipeline: Vec<Document>) -> Result<Vec<Document>>;

    /// Insert documents (`_id` generated when absent). `ordered` stops at the
    /// first error (MongoDB's default); unordered tries every document. Any
    /// error returns [`Error::BulkWrite`] listing each failed position; the
    /// other documents are stored.
    fn insert_many(&self, docs: Vec<Document>, ordered: bool) -> Result<Vec<Bson>> {
        validate_collection_name(self.name())?;
        let mut prepared = Vec::with_capacity(docs.len());
        let mut positions = Vec::with_capacity(docs.len());
        let mut errors: Vec<(usize, Error)> = Vec::new();
        for (i, d) in docs.iter().enumerate() {
            match doc::prepare_insert(d) {
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
        let out = self.insert_prepared(prepared, &positions, ordered)?;
        let ids: Vec<Bson> = out.inserted.into_iter().map(|(_, id)| id).collect();
        errors.extend(
            out.errors
                .into_iter()
                .map(|(i, e)| (positions.get(i).copied().unwrap_or(i), e)),
        );
        errors.sort_by_key(|(i, _)| *i);
        if ordered {
            // An ordered batch stops at its first failure: report only that one.
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

    /// Insert one document; returns its `_id` (generated when absent).
    fn insert_one(&self, doc: Document) -> Result<Bson> {
        match self.insert_many(vec![doc], true) {
            Ok(mut ids) => ids
                .pop()
                .ok_or_else(|| Error::Internal("insert reported nothing".into())),
            // One document: its own error, not a batch report.
            Err(Error::BulkWrite(f)) => Err(f
                .errors
                .into_iter()
                .next()
                .map(|(_, e)| e)
                .unwrap_or_else(|| Error::Internal("insert reported no error".into()))),
            Err(e) => Err(e),
        }
    }

    /// Update (or replace) with an already-parsed spec: one statement of a
    /// server's `update` command.
    fn update_with_spec(
        &self,
        filter: Document,
        update: UpdateSpec,
        multi: bool,
        options: UpdateOptions,
    ) -> Result<UpdateResult> {
        self.update_checked(check_update(
            self.name(),
            UpdateStatement {
                filter,
                update,
                multi,
                options,
                collation: None,
            },
        )?)
    }

    /// The statements of a server's `update` command (a driver's bulk
    /// write), in order: each is its own atomic update, exactly as
    /// [`Crud::update_with_spec`] under its own collation — a failing one
    /// changes nothing and never undoes an earlier one (the statements are
    /// not atomic together, as MongoDB's are not). `ordered` stops after
    /// the first failure (later statements are not applied); unordered
    /// applies every statement. One result per statement that ran, in
    /// order. A live collection applies them in as few writer commands as
    /// the writer's bounds allow (`write::command::MAX_BATCH_STATEMENTS` statements
    /// each); a transaction's view one by one.
    fn update_statements(
        &self,
        stmts: Vec<UpdateStatement>,
        ordered: bool,
    ) -> Result<StatementResults<UpdateResult>> {
        let checked = stmts
            .into_iter()
            .map(|s| check_update(self.name(), s))
            .collect();
        self.update_batch(checked, ordered)
    }

    /// [`Crud::update_statements`] for the statements of a `delete`
    /// command: each deletes its first match (every match with `multi`).
    fn delete_statements(
        &self,
        stmts: Vec<DeleteStatement>,
        ordered: bool,
    ) -> Result<StatementResults<u64>> {
        let named = validate_collection_name(self.name());
        let checked = stmts
            .into_iter()
            .map(|s| {
                named.clone().map(|()| CheckedDelete {
                    filter: s.filter,
                    multi: s.multi,
                    collation: s.collation,
                })
            })
            .collect();
        self.delete_batch(checked, ordered)
    }

    fn update_one(&self, filter: Document, update: Document) -> Result<UpdateResult> {
        self.update_one_with(filter, update, UpdateOptions::default())
    }

    fn update_one_with(
        &self,
        filter: Document,
        update: Document,
        options: UpdateOptions,
    ) -> Result<UpdateResult> {
        self.update_with_spec(filter, operators(&update)?, false, options)
    }

    fn update_many(&self, filter: Document, update: Document) -> Result<UpdateResult> {
        self.update_many_with(filter, update, UpdateOptions::default())
    }

    fn update_many_with(
        &self,
        filter: Document,
        update: Document,
        options: UpdateOptions,
    ) -> Result<UpdateResult> {
        self.update_with_spec(filter, operators(&update)?, true, options)
    }

    fn replace_one(&self, filter: Document, replacement: Document) -> Result<UpdateResult> {
        self.replace_one_with(filter, replacement, UpdateOptions::default())
    }

    fn replace_one_with(
        &self,
        filter: Document,
        replacement: Document,
        options: UpdateOptions,
    ) -> Result<UpdateResult> {
        self.update_with_spec(filter, replacement_spec(&replacement)?, false, options)
    }

    fn delete_one(&self, filter: Document) -> Result<u64> {
        self.delete(filter, false)
    }

    fn delete_many(&self, filter: Document) -> Result<u64> {
        self.delete(filter, true)
    }

    /// The general findAndModify (a server's command): the returned
    /// document, projected, and the outcome.
    fn find_and_modify_with_spec(
        &self,
        filter: Document,
        update: Option<UpdateSpec>,
        options: FindAndModifyOptions,
    ) -> Result<(Option<Document>, FindAndModifyOutcome)> {
        validate_collection_name(self.name())?;
        let projection = parse_projection(self, &filter, &options.projection, &options.let_vars)?;
        // MongoDB's rule: the new version need not match the query any more.
        if projection.as_ref().is_some_and(Projection::has_positional)
            && options.return_document == ReturnDocument::After
        {
            return Err(Error::bad_value(
                "cannot use a positional projection and return the new document",
            ));
        }
        let out = self.modify_first(CheckedModify {
            filter,
            update,
            options,
        })?;
        // The projection runs in MongoDB's plan, after the write: its
        // errors carry the executor's context and leave the write done.
        let doc = out
            .doc
            .as_ref()
            .map(|d| project(d, projection.as_ref()))
            .transpose()
            .map_err(|e| Error::Coded {
                code: e.code(),
                name: e.code_name(),
                msg: format!("Plan executor error during findAndModify :: caused by :: {e}"),
            })?;
        Ok((doc, out))
    }

    fn find_one_and_update(
        &self,
        filter: Document,
        update: Document,
        options: FindAndModifyOptions,
    ) -> Result<Option<Document>> {
        let spec = operators(&update)?;
        Ok(self
            .find_and_modify_with_spec(filter, Some(spec), options)?
            .0)
    }

    fn find_one_and_replace(
        &self,
        filter: Document,
        replacement: Document,
        options: FindAndModifyOptions,
    ) -> Result<Option<Document>> {
        let spec = replacement_spec(&replacement)?;
        Ok(self
            .find_and_modify_with_spec(filter, Some(spec), options)?
            .0)
    }

    fn find_one_and_delete(
        &self,
        filter: Document,
        options: FindAndModifyOptions,
    ) -> Result<Option<Document>> {
        Ok(self.find_and_modify_with_spec(filter, None, options)?.0)
    }

    /// Matching documents with sort, skip, limit and projection.
    fn find_with(&self, filter: Document, options: FindOptions) -> Result<Vec<Document>> {
        let projection = parse_projection(self, &filter, &options.projection, &options.let_vars)?;
        self.find_raw(filter, options)?
            .iter()
            .map(|d| project(d, projection.as_ref()))
            .collect()
    }

    fn find_one(&self, filter: Document) -> Result<Option<Document>> {
        let options = FindOptions {
            limit: 1,
            ..Default::default()
        };
        Ok(self.find_with(filter, options)?.pop())
    }
}

/// `stmt` checked for collection `name`: a valid name, and `multi` only
/// with update operators (9, MongoDB's message).
fn check_update(name: &str, stmt: UpdateStatement) -> Result<CheckedUpdate> {
    validate_collection_name(name)?;
    if stmt.multi && stmt.update.is_replacement() {
        return Err(Error::Coded {
            code: 9,
            name: "FailedToParse",
            msg: "multi update is not supported for replacement-style update".into(),
        });
    }
    Ok(CheckedUpdate {
        filter: stmt.filter,
        spec: stmt.update,
        multi: stmt.multi,
        options: stmt.options,
        collation: stmt.collation,
    })
}

/// A batch's statements run one at a time by `run` (a transaction's
/// view): a refused statement fails in its place; stops after the first
/// failure when `ordered`, and after an error that ends the transaction
/// (later statements could only fail).
pub(crate) fn one_by_one<S, T>(
    stmts: Vec<Result<S>>,
    ordered: bool,
    mut run: impl FnMut(S) -> Result<T>,
) -> StatementResults<T> {
    let mut out = Vec::with_capacity(stmts.len());
    for stmt in stmts {
        let r = stmt.and_then(&mut run);
        let stop = match &r {
            Ok(_) => false,
            Err(e) => ordered || e.ends_transaction(),
        };
        out.push(r);
        if stop {
            break;
        }
    }
    out
}

/// An update that must use operators (`update_one`, `update_many`).
fn operators(update: &Document) -> Result<UpdateSpec> {
    let spec = UpdateSpec::parse(update)?;
    if spec.is_replacement() {
        return Err(Error::bad_value(
            "update document requires atomic operators",
        ));
    }
    Ok(spec)
}

/// A replacement document (`replace_one`, `find_one_and_replace`).
fn replacement_spec(doc: &Document) -> Result<UpdateSpec> {
    let spec = UpdateSpec::parse(doc)?;
    if !spec.is_replacement() {
        return Err(Error::bad_value(
            "replacement document must not contain atomic operators",
        ));
    }
    Ok(spec)
}

/// The find projection of an operation of `c` (an empty one is none):
/// `query` is what a positional `a.$` matches, `let_vars` the command's
/// variables; its comparisons take the operation's collation.
fn parse_projection<C: Crud + ?Sized>(
    c: &C,
    query: &Document,
    projection: &Option<Document>,
    let_vars: &Option<Document>,
) -> Result<Option<Projection>> {
    let Some(p) = projection.as_ref().filter(|p| !p.is_empty()) else {
        return Ok(None);
    };
    let p = Projection::parse_find(p, Some(query), let_vars.as_ref())?;
    Ok(Some(p.with_collation(c.op_collator()?)))
}

fn project(doc: &DocRef, projection: Option<&Projection>) -> Result<Document> {
    match projection {
        Some(p) => p.apply(doc),
        None => doc::to_document(doc),
    }
}

/// One page of materialized matches: stably sorted (keys computed once per
/// document, ties keep input order), then `skip`, then at most `limit`
/// (0 = no limit).
pub(crate) fn page(
    docs: Vec<DocRef>,
    sort: Option<&SortSpec>,
    skip: u64,
    limit: u64,
) -> Vec<DocRef> {
    let ordered = match sort {
        None => docs,
        Some(sort) => {
            let mut keyed: Vec<_> = docs.into_iter().map(|d| (sort.sort_key(&d), d)).collect();
            keyed.sort_by(|a, b| sort.compare_keys(&a.0, &b.0));
            keyed.into_iter().map(|(_, d)| d).collect()
        }
    };
    let take = match limit {
        0 => usize::MAX,
        n => usize::try_from(n).unwrap_or(usize::MAX),
    };
    ordered
        .into_iter()
        .skip(usize::try_from(skip).unwrap_or(usize::MAX))
        .take(take)
        .collect()
}

#[cfg(test)]
mod tests {
    //! The same calls through `dyn Crud` on a live collection and on a
    //! transaction's view of one give the same answers: one surface.

    use bson::{doc, Document};

    use super::*;
    use crate::api::Database;
    use crate::txn::TxnOptions;

    fn seed() -> Vec<Document> {
        (0..10)
            .map(|i| doc! {"_id": i, "g": i % 3, "v": i})
            .collect()
    }

    /// Every CRUD call once, each answer recorded.
    fn exercise(c: &dyn Crud) -> Vec<String> {
        let mut out = Vec::new();
        let mut note = |what: &str, v: String| out.push(format!("{what}: {v}"));
        note("insert", format!("{:?}", c.insert_many(seed(), true)));
        let dup = c.insert_many(
            vec![doc! {"_id": 100}, doc! {"_id": 1}, doc! {"_id": 101}],
            false,
        );
        match dup {
            Err(Error::BulkWrite(f)) => note(
                "unordered dup",
                format!(
                    "{} {:?}",
                    f.inserted,
                    f.errors
                        .iter()
                        .map(|(i, e)| (*i, e.code()))
                        .collect::<Vec<_>>()
                ),
            ),
            other => note("unordered dup", format!("unexpected {other:?}")),
        }
        let ordered = c.insert_many(
            vec![doc! {"_id": 200}, doc! {"_id": 2}, doc! {"_id": 201}],
            true,
        );
        note(
            "ordered dup",
            format!("{:?}", ordered.map_err(|e| e.code())),
        );
        note(
            "insert one dup",
            format!("{:?}", c.insert_one(doc! {"_id": 3}).map_err(|e| e.code())),
        );
        note(
            "update",
            format!(
                "{:?}",
                c.update_many(doc! {"g": 0}, doc! {"$inc": {"v": 100}})
            ),
        );
        note(
            "replace",
            format!("{:?}", c.replace_one(doc! {"_id": 4}, doc! {"x": 1})),
        );
        let multi_replace = c.update_with_spec(
            doc! {},
            UpdateSpec::parse(&doc! {"x": 2}).unwrap_or_else(|e| panic!("{e}")),
            true,
            UpdateOptions::default(),
        );
        note(
            "multi replace",
            format!("{:?}", multi_replace.map_err(|e| e.code())),
        );
        let up = UpdateOptions {
            upsert: true,
            hint: None,
        };
        note(
            "upsert",
            format!(
                "{:?}",
                c.update_one_with(doc! {"_id": 50}, doc! {"$set": {"v": 5}}, up)
            ),
        );
        let after = FindAndModifyOptions {
            sort: Some(doc! {"v": -1}),
            projection: Some(doc! {"v": 1}),
            return_document: ReturnDocument::After,
            ..Default::default()
        };
        note(
            "fam update",
            format!(
                "{:?}",
                c.find_one_and_update(doc! {"g": 1}, doc! {"$inc": {"v": 1}}, after)
            ),
        );
        note(
            "fam delete",
            format!(
                "{:?}",
                c.find_one_and_delete(doc! {"_id": 5}, Default::default())
            ),
        );
        let upsert_new = FindAndModifyOptions {
            upsert: true,
            return_document: ReturnDocument::After,
            ..Default::default()
        };
        note(
            "fam upsert",
            format!(
                "{:?}",
                c.find_and_modify_with_spec(
                    doc! {"_id": 60},
                    Some(
                        UpdateSpec::parse(&doc! {"$set": {"v": 6}})
                            .unwrap_or_else(|e| panic!("{e}"))
                    ),
                    upsert_new
                )
                .map(|(d, o)| (d, o.update))
            ),
        );
        note("delete", format!("{:?}", c.delete_many(doc! {"g": 2})));
        let page = FindOptions {
            sort: Some(doc! {"v": 1, "_id": 1}),
            skip: 1,
            limit: 3,
            projection: Some(doc! {"_id": 1}),
            hint: None,
            collation: None,
            let_vars: None,
        };
        note("find", format!("{:?}", c.find_with(doc! {}, page)));
        note("find one", format!("{:?}", c.find_one(doc! {"_id": 50})));
        note("count", format!("{:?}", c.count(doc! {"v": {"$gte": 5}})));
        note("distinct", format!("{:?}", c.distinct("g", doc! {})));
        let pipeline = vec![
            doc! {"$match": {"v": {"$gte": 0}}},
            doc! {"$group": {"_id": "$g", "n": {"$sum": 1}}},
            doc! {"$sort": {"_id": 1}},
        ];
        note("aggregate", format!("{:?}", c.aggregate(pipeline)));
        out
    }

    #[test]
    fn live_and_transaction_handles_answer_alike() {
        let live_db = Database::in_memory();
        let live = exercise(&live_db.collection("c"));
        let txn_db = Database::in_memory();
        let mut tx = txn_db.begin(TxnOptions::default());
        let in_txn = exercise(&tx.collection("c"));
        for (l, t) in live.iter().zip(&in_txn) {
            assert_eq!(l, t);
        }
        assert_eq!(live.len(), in_txn.len());
        // Nothing reached the stored data before commit; then all of it did.
        assert_eq!(txn_db.collection("c").count(doc! {}).unwrap_or(u64::MAX), 0);
        tx.commit().unwrap_or_else(|e| panic!("{e}"));
        let all = |db: &Database| {
            db.collection("c")
                .find(doc! {})
                .sort(doc! {"_id": 1})
                .run()
                .unwrap_or_default()
        };
        assert_eq!(all(&live_db), all(&txn_db));
    }
}
