//! The CRUD commands run inside a multi-document transaction: the same
//! command shapes and replies as `read.rs`/`write.rs`, executed on the
//! engine [`Transaction`] (its snapshot overlaid with its own writes) instead
//! of the live collections. Nothing here reaches stored data: writes are
//! buffered until `commitTransaction`.
//!
//! Differences from the autocommit commands, all because the transaction
//! reads one snapshot: results are materialized (a cursor holds documents,
//! not a snapshot), `hint` is ignored, and `$duet` strategies, named
//! snapshots and `explain` are refused (OperationNotSupportedInTransaction,
//! 263). The transaction's own lifetime/aborted errors (251, 290) and write
//! conflicts (112) are returned as command errors, not `writeErrors`, so
//! their labels reach the driver.

use bson::{doc, Bson, Document, RawDocumentBuf};
use duetdb::lang::Pipeline;
use duetdb::{Crud, FindOptions, Transaction, UpdateOptions};

use super::read::{self, FindPlan};
use super::write;
use super::Ctx;
use crate::args;
use crate::cursor::Cursor;
use crate::error::{CmdResult, CommandError};
use crate::state::OpCounters;

/// Commands a transaction may run (others get 263).
pub const ALLOWED: &[&str] = &[
    "find",
    "getMore",
    "killCursors",
    "insert",
    "update",
    "delete",
    "findAndModify",
    "findandmodify",
    "count",
    "distinct",
    "aggregate",
];

/// An error that ends the transaction rather than one statement.
fn is_transaction_error(e: &duetdb::Error) -> bool {
    matches!(
        e,
        duetdb::Error::WriteConflict(_)
            | duetdb::Error::NoSuchTransaction(_)
            | duetdb::Error::TransactionExceededLifetimeLimitSeconds(_)
            | duetdb::Error::TransactionTooLarge(_)
    )
}

pub fn not_in_transaction(what: &str) -> CommandError {
    CommandError::new(
        263,
        "OperationNotSupportedInTransaction",
        format!("Cannot run {what} in a multi-document transaction."),
    )
}

fn refuse_duet_options(cmd: &Document) -> CmdResult<()> {
    if cmd.contains_key("$duet") {
        return Err(not_in_transaction(
            "a $duet snapshot strategy or named snapshot",
        ));
    }
    Ok(())
}

/// Run `name` (one of [`ALLOWED`]) inside `txn`.
pub fn run(ctx: &Ctx<'_>, name: &str, cmd: &Document, txn: &mut Transaction) -> CmdResult {
    refuse_duet_options(cmd)?;
    match name {
        "find" => find(ctx, cmd, txn),
        "getMore" => read::get_more(ctx, cmd),
        "killCursors" => read::kill_cursors(ctx, cmd),
        "insert" => insert(ctx, cmd, txn),
        "update" => update(ctx, cmd, txn),
        "delete" => delete(ctx, cmd, txn),
        "findAndModify" | "findandmodify" => find_and_modify(ctx, cmd, name, txn),
        "count" => count(cmd, txn),
        "distinct" => distinct(cmd, txn),
        "aggregate" => aggregate(ctx, cmd, txn),
        other => Err(not_in_transaction(&format!("'{other}'"))),
    }
}

fn find(ctx: &Ctx<'_>, cmd: &Document, txn: &mut Transaction) -> CmdResult {
    let coll = args::collection_name(cmd, "find")?;
    OpCounters::bump(&ctx.state.ops.query, 1);
    let plan = FindPlan::from_find(cmd)?;
    plan.parsed_projection()?; // reject a bad projection with the usual error
    let mut options = plan.options;
    options.projection = plan.projection.filter(|p| !p.is_empty());
    let docs = txn.find_with(coll, plan.filter, options)?;
    let first = read::first_batch_size(cmd)?;
    let single_batch = args::flag(cmd, "singleBatch")?;
    let cursor = Cursor::from_owned(ctx.ns(coll), ctx.conn.id, docs);
    read::cursor_reply(ctx, cursor, first, single_batch, None)
}

fn count(cmd: &Document, txn: &mut Transaction) -> CmdResult {
    let coll = args::collection_name(cmd, "count")?;
    let query = args::opt_doc(cmd, "query")?.cloned().unwrap_or_default();
    let skip = args::opt_count(cmd, "skip")?.unwrap_or(0);
    let limit = args::opt_i64(cmd, "limit")?.unwrap_or(0).unsigned_abs();
    let mut n = txn.count(coll, query)?.saturating_sub(skip);
    if limit > 0 {
        n = n.min(limit);
    }
    Ok(doc! {"n": n.min(i64::MAX as u64) as i64, "ok": 1.0})
}

fn to_raw(docs: &[Document]) -> CmdResult<Vec<RawDocumentBuf>> {
    docs.iter()
        .map(|d| {
            RawDocumentBuf::try_from(d)
                .map_err(|e| CommandError::new(22, "InvalidBSON", e.to_string()))
        })
        .collect()
}

fn distinct(cmd: &Document, txn: &mut Transaction) -> CmdResult {
    let coll = args::collection_name(cmd, "distinct")?;
    let key = args::req_str(cmd, "key")?;
    duetdb::raw::validate_path(key).map_err(CommandError::bad_value)?;
    let query = args::opt_doc(cmd, "query")?.cloned().unwrap_or_default();
    let raw = to_raw(&txn.find(coll, query)?)?;
    let values = read::distinct_values(raw.iter().map(|d| d.as_ref()), key)?;
    Ok(doc! {"values": values, "ok": 1.0})
}

fn aggregate(ctx: &Ctx<'_>, cmd: &Document, txn: &mut Transaction) -> CmdResult {
    let coll = match cmd.get("aggregate") {
        Some(Bson::String(s)) => s.as_str(),
        _ => return Err(not_in_transaction("a database-level aggregate")),
    };
    if args::flag(cmd, "explain")? {
        return Err(not_in_transaction("'explain'"));
    }
    let stages = read::pipeline_of(cmd)?;
    let cursor_opts = args::opt_doc(cmd, "cursor")?.ok_or_else(|| {
        CommandError::new(
            9,
            "FailedToParse",
            "The 'cursor' option is required, except for aggregate with the explain argument",
        )
    })?;
    let first = read::first_batch_size(cursor_opts)?;
    // The leading $match stages select what the transaction reads; the whole
    // pipeline (those stages again included, harmlessly) then runs on it.
    let scan_filter = Pipeline::parse(&stages)?
        .split()
        .scan_filter
        .unwrap_or_default();
    let input = txn.find(coll, scan_filter)?;
    let docs = Pipeline::parse(&stages)?.run_on(input)?;
    let cursor = Cursor::from_owned(ctx.ns(coll), ctx.conn.id, docs);
    read::cursor_reply(ctx, cursor, first, false, None)
}

/// Runs one statement; `Ok(Err(e))` is a per-statement write error, `Err`
/// an error that ends the transaction (it fails the whole command).
fn statement<T>(f: impl FnOnce() -> Result<T, StmtError>) -> CmdResult<Result<T, CommandError>> {
    match f() {
        Ok(v) => Ok(Ok(v)),
        Err(StmtError::Engine(e)) if is_transaction_error(&e) => Err(e.into()),
        Err(StmtError::Engine(e)) => Ok(Err(e.into())),
        Err(StmtError::Command(e)) => Ok(Err(e)),
    }
}

enum StmtError {
    Engine(duetdb::Error),
    Command(CommandError),
}

impl From<duetdb::Error> for StmtError {
    fn from(e: duetdb::Error) -> StmtError {
        StmtError::Engine(e)
    }
}

impl From<CommandError> for StmtError {
    fn from(e: CommandError) -> StmtError {
        StmtError::Command(e)
    }
}

fn insert(ctx: &Ctx<'_>, cmd: &Document, txn: &mut Transaction) -> CmdResult {
    let coll = args::collection_name(cmd, "insert")?;
    let docs = args::doc_array(cmd, "documents")?;
    write::check_batch_len(docs.len())?;
    let ordered = write::ordered(cmd)?;
    OpCounters::bump(&ctx.state.ops.insert, docs.len() as u64);
    let (mut n, mut errors) = (0i64, Vec::new());
    for (i, d) in docs.into_iter().enumerate() {
        match statement(|| Ok(txn.insert_one(coll, d.clone())?))? {
            Ok(_) => n += 1,
            Err(e) => {
                errors.push(Bson::Document(e.to_write_error(i)));
                if ordered {
                    break;
                }
            }
        }
    }
    Ok(write::write_reply(n, Document::new(), errors))
}

fn update(ctx: &Ctx<'_>, cmd: &Document, txn: &mut Transaction) -> CmdResult {
    let coll = args::collection_name(cmd, "update")?;
    let stmts = args::doc_array(cmd, "updates")?;
    write::check_batch_len(stmts.len())?;
    let ordered = write::ordered(cmd)?;
    let (mut n, mut modified) = (0i64, 0i64);
    let (mut upserted, mut errors) = (Vec::new(), Vec::new());
    for (i, stmt) in stmts.iter().enumerate() {
        OpCounters::bump(&ctx.state.ops.update, 1);
        let one = || -> Result<duetdb::UpdateResult, StmtError> {
            write::refuse_unsupported(stmt, "updates")?;
            let q = args::opt_doc(stmt, "q")?.cloned().unwrap_or_default();
            let spec = write::update_spec(stmt.get("u"))?;
            let options = UpdateOptions {
                upsert: args::flag(stmt, "upsert")?,
                hint: None,
            };
            Ok(txn.collection(coll).update_with_spec(
                q,
                spec,
                args::flag(stmt, "multi")?,
                options,
            )?)
        };
        match statement(one)? {
            Ok(r) => {
                n += r.matched as i64;
                modified += r.modified as i64;
                if let Some(id) = r.upserted_id {
                    n += 1;
                    upserted.push(Bson::Document(doc! {"index": i as i32, "_id": id}));
                }
            }
            Err(e) => {
                errors.push(Bson::Document(e.to_write_error(i)));
                if ordered {
                    break;
                }
            }
        }
    }
    let mut extra = doc! {"nModified": modified as i32};
    if !upserted.is_empty() {
        extra.insert("upserted", upserted);
    }
    Ok(write::write_reply(n, extra, errors))
}

fn delete(ctx: &Ctx<'_>, cmd: &Document, txn: &mut Transaction) -> CmdResult {
    let coll = args::collection_name(cmd, "delete")?;
    let stmts = args::doc_array(cmd, "deletes")?;
    write::check_batch_len(stmts.len())?;
    let ordered = write::ordered(cmd)?;
    let (mut n, mut errors) = (0i64, Vec::new());
    for (i, stmt) in stmts.iter().enumerate() {
        OpCounters::bump(&ctx.state.ops.delete, 1);
        let one = || -> Result<u64, StmtError> {
            write::refuse_unsupported(stmt, "deletes")?;
            let q = args::opt_doc(stmt, "q")?.cloned().unwrap_or_default();
            match args::opt_i64(stmt, "limit")?.unwrap_or(0) {
                0 => Ok(txn.delete_many(coll, q)?),
                1 => Ok(txn.delete_one(coll, q)?),
                other => Err(CommandError::new(
                    9,
                    "FailedToParse",
                    format!("The limit field in delete objects must be 0 or 1. Got {other}"),
                )
                .into()),
            }
        };
        match statement(one)? {
            Ok(k) => n += k as i64,
            Err(e) => {
                errors.push(Bson::Document(e.to_write_error(i)));
                if ordered {
                    break;
                }
            }
        }
    }
    Ok(write::write_reply(n, Document::new(), errors))
}

/// `findAndModify` as find-one (with the sort) then an update or delete of
/// that `_id`, all inside the transaction, so it is as atomic as the rest.
fn find_and_modify(
    ctx: &Ctx<'_>,
    cmd: &Document,
    name_field: &str,
    txn: &mut Transaction,
) -> CmdResult {
    let write::FindAndModifyArgs {
        coll,
        query,
        remove: _,
        return_new,
        upsert,
        spec,
    } = write::find_and_modify_args(ctx, cmd, name_field)?;
    let projection = args::opt_doc(cmd, "fields")?
        .filter(|p| !p.is_empty())
        .map(duetdb::lang::Projection::parse)
        .transpose()?;
    let project = |d: Document| -> CmdResult<Bson> {
        match &projection {
            None => Ok(Bson::Document(d)),
            Some(p) => {
                let raw = RawDocumentBuf::try_from(&d)
                    .map_err(|e| CommandError::new(22, "InvalidBSON", e.to_string()))?;
                Ok(Bson::Document(p.apply(&raw)?))
            }
        }
    };
    let first = FindOptions {
        sort: args::opt_doc(cmd, "sort")?
            .cloned()
            .filter(|s| !s.is_empty()),
        limit: 1,
        ..Default::default()
    };
    let found = txn.find_with(coll, query.clone(), first)?.pop();
    let (value, last_error) = match (found, spec) {
        (Some(old), None) => {
            let by_id = doc! {"_id": old.get("_id").cloned().unwrap_or(Bson::Null)};
            txn.delete_one(coll, by_id)?;
            (project(old)?, doc! {"n": 1})
        }
        (Some(old), Some(spec)) => {
            let id = old.get("_id").cloned().unwrap_or(Bson::Null);
            let by_id = doc! {"_id": id.clone()};
            txn.collection(coll).update_with_spec(
                by_id.clone(),
                spec,
                false,
                UpdateOptions::default(),
            )?;
            let value = if return_new {
                match txn.find_one(coll, by_id)? {
                    Some(d) => project(d)?,
                    None => Bson::Null,
                }
            } else {
                project(old)?
            };
            (value, doc! {"n": 1, "updatedExisting": true})
        }
        (None, Some(spec)) if upsert => {
            let options = UpdateOptions {
                upsert: true,
                hint: None,
            };
            let r = txn
                .collection(coll)
                .update_with_spec(query, spec, false, options)?;
            let id = r.upserted_id.unwrap_or(Bson::Null);
            let value = if return_new {
                match txn.find_one(coll, doc! {"_id": id.clone()})? {
                    Some(d) => project(d)?,
                    None => Bson::Null,
                }
            } else {
                Bson::Null
            };
            (
                value,
                doc! {"n": 1, "updatedExisting": false, "upserted": id},
            )
        }
        (None, Some(_)) => (Bson::Null, doc! {"n": 0, "updatedExisting": false}),
        (None, None) => (Bson::Null, doc! {"n": 0}),
    };
    Ok(doc! {"lastErrorObject": last_error, "value": value, "ok": 1.0})
}
