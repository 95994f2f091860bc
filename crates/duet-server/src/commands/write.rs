//! Write commands: insert, update, delete, findAndModify — on the live
//! database or inside the session's transaction: the same code runs on
//! either handle through the engine's CRUD surface ([`Crud`]).
//!
//! Every statement is atomic on its own (an update with `multi` changes all
//! its matches or none) and never together with another. Live, an insert's
//! documents are one engine command, and so are an update's or a delete's
//! statements, up to the engine's batch bound (`Crud::update_statements`:
//! applied in order inside one writer group, one publish and one WAL
//! record for the lot, each statement still its own commit); in a
//! transaction they are buffered until commit. `ordered` batches stop at
//! the first failing statement; unordered ones try every statement. A
//! statement is checked (`u`, `c`, `collation`, `limit`, …) before any
//! statement runs, so a malformed one is reported after the statements
//! before it applied, as if it had run in its turn. Per-statement failures are
//! reported in `writeErrors` (`index`, `code`, `codeName`, `errmsg`, and
//! `keyPattern`/`keyValue` for duplicate keys) with `ok: 1`, as drivers
//! expect; a malformed command as a whole gets `ok: 0`, and so does an error
//! that ends the transaction (a write conflict, an aborted or expired or
//! too large transaction), so that its labels reach the driver.

use std::sync::atomic::AtomicU64;
use std::sync::Arc;

use bson::{doc, Bson, Document};
use duetdb::lang::UpdateSpec;
use duetdb::{
    DeleteStatement, FindAndModifyOptions, ReturnDocument, StatementResults, UpdateOptions,
    UpdateResult, UpdateStatement,
};

use super::source::Target;
use super::Ctx;
use crate::args;
use crate::error::{CmdResult, CommandError};
use crate::state::OpCounters;

/// A write command's collection, its items (`field`: documents or
/// statements, 1 to 100 000 of them) and whether the batch is ordered
/// (MongoDB's default).
fn batch<'c>(
    cmd: &'c Document,
    name: &str,
    field: &str,
) -> CmdResult<(&'c str, Vec<&'c Document>, bool)> {
    let coll = args::collection_name(cmd, name)?;
    let items = args::doc_array(cmd, field)?;
    let n = items.len();
    if n == 0 || n > super::handshake::MAX_WRITE_BATCH_SIZE as usize {
        return Err(CommandError::new(
            16,
            "InvalidLength",
            format!("Write batch sizes must be between 1 and 100000. Got {n} operations."),
        ));
    }
    let ordered = match cmd.get("ordered") {
        None => true,
        Some(_) => args::flag(cmd, "ordered")?,
    };
    Ok((coll, items, ordered))
}

fn write_reply(n: i64, extra: Document, errors: Vec<Bson>) -> Document {
    let mut d = doc! {"n": n as i32};
    d.extend(extra);
    if !errors.is_empty() {
        d.insert("writeErrors", errors);
    }
    d.insert("ok", 1.0);
    d
}

/// What a batch's statements did: each applied one's result with its
/// position, and the `writeErrors`.
struct Ran<T> {
    done: Vec<(usize, T)>,
    errors: Vec<Bson>,
}

/// Check each statement with `parse` (given its position, the statement
/// and its query `q` with the command's `let` bound; a failure is the
/// statement's write error, and ends an ordered batch there), then run the
/// checked ones in order with `run`, which gets them in one call (their
/// writes carry their statement ids: `Ctx::items`). Counted in `counter`
/// per statement that ran or failed. An error that ends the transaction
/// fails the whole command.
fn run_statements<S, T>(
    ctx: &Ctx<'_>,
    stmts: &[&Document],
    (ordered, let_vars): (bool, Option<&Document>),
    counter: &AtomicU64,
    mut parse: impl FnMut(usize, &Document, Document) -> CmdResult<S>,
    run: impl FnOnce(Vec<S>) -> CmdResult<StatementResults<T>>,
) -> CmdResult<Ran<T>> {
    let (mut checked, mut positions, mut refused) = (Vec::new(), Vec::new(), Vec::new());
    for (i, stmt) in stmts.iter().enumerate() {
        let mut one = || -> CmdResult<S> {
            refuse_unsupported(stmt)?;
            let q = args::opt_doc(stmt, "q")?.cloned().unwrap_or_default();
            // The command's `let` variables, bound around the filter's `$expr`s.
            let q = duetdb::lang::Filter::bind_let(&q, let_vars)?;
            parse(i, stmt, q)
        };
        match one() {
            Ok(s) => {
                checked.push(s);
                positions.push(i);
            }
            Err(e) => {
                refused.push((i, e));
                if ordered {
                    break;
                }
            }
        }
    }
    let results = if checked.is_empty() {
        Vec::new()
    } else {
        let items: Arc<[usize]> = positions.as_slice().into();
        ctx.items.replace(Some(items));
        let ran = run(checked);
        ctx.items.replace(None);
        ran?
    };
    let (mut done, mut errors) = (Vec::new(), Vec::new());
    for (r, &i) in results.into_iter().zip(&positions) {
        match r {
            Ok(v) => done.push((i, v)),
            Err(e) if e.ends_transaction() => {
                OpCounters::bump(counter, (done.len() + errors.len() + 1) as u64);
                return Err(e.into());
            }
            Err(e) => errors.push((i, CommandError::from(e))),
        }
    }
    // Ordered, a refused statement comes after every statement that ran:
    // it is reached only when none of them failed.
    if !ordered || errors.is_empty() {
        errors.extend(refused);
        errors.sort_by_key(|(i, _)| *i);
    }
    OpCounters::bump(counter, (done.len() + errors.len()) as u64);
    let errors = errors
        .into_iter()
        .map(|(i, e)| Bson::Document(e.to_write_error(i)))
        .collect();
    Ok(Ran { done, errors })
}

pub fn insert(ctx: &Ctx<'_>, cmd: &Document, target: &mut Target<'_>) -> CmdResult {
    let (name, docs, ordered) = batch(cmd, "insert", "documents")?;
    OpCounters::bump(&ctx.state.ops.insert, docs.len() as u64);
    let coll = target.collection_with(ctx, name, args::flag(cmd, "bypassDocumentValidation")?)?;
    match coll.insert_many(docs.into_iter().cloned().collect(), ordered) {
        Ok(ids) => Ok(write_reply(ids.len() as i64, Document::new(), vec![])),
        Err(duetdb::Error::BulkWrite(f)) => {
            if let Some((_, e)) = f.errors.iter().find(|(_, e)| e.ends_transaction()) {
                return Err(e.clone().into());
            }
            let errors = f
                .errors
                .iter()
                .map(|(i, e)| Bson::Document(CommandError::from(e.clone()).to_write_error(*i)))
                .collect();
            Ok(write_reply(f.inserted as i64, Document::new(), errors))
        }
        Err(e) => Err(e.into()),
    }
}

/// MongoDB's IDL type error for a command field (14).
fn wrong_type(field: &str, want: &str, got: &Bson) -> CommandError {
    CommandError::type_mismatch(format!(
        "BSON field '{field}' is the wrong type '{}', expected type '{want}'",
        duetdb::raw::type_name(got)
    ))
}

/// The `arrayFilters` of a statement or a findAndModify (`field` is its IDL
/// path for messages): an array of documents, else 14 for the whole command.
pub(super) fn array_filters(holder: &Document, field: &str) -> CmdResult<Option<Vec<Document>>> {
    match holder.get("arrayFilters") {
        None | Some(Bson::Null) => Ok(None),
        Some(Bson::Array(items)) => items
            .iter()
            .enumerate()
            .map(|(i, v)| match v {
                Bson::Document(d) => Ok(d.clone()),
                other => Err(wrong_type(&format!("{field}.{i}"), "object", other)),
            })
            .collect::<CmdResult<Vec<_>>>()
            .map(Some),
        Some(other) => Err(wrong_type(field, "array", other)),
    }
}

/// Parse an update's `u` (operators, a replacement, or a pipeline) with its
/// array filters and the variables of the command's `let` and the
/// statement's `c` (pipelines only: 51198 otherwise, as MongoDB).
pub(super) fn update_spec(
    u: Option<&Bson>,
    filters: &[Document],
    let_vars: Option<&Document>,
    constants: Option<&Document>,
) -> CmdResult<UpdateSpec> {
    if constants.is_some() && !matches!(u, Some(Bson::Array(_))) {
        return Err(CommandError::new(
            51198,
            "Location51198",
            "Constant values may only be specified for pipeline updates",
        ));
    }
    match u {
        Some(Bson::Document(d)) => Ok(UpdateSpec::parse_with(d, filters)?),
        Some(Bson::Array(stages)) => {
            let vars = match (let_vars, constants) {
                (None, None) => None,
                (a, b) => {
                    let mut v = a.cloned().unwrap_or_default();
                    v.extend(b.cloned().unwrap_or_default());
                    Some(v)
                }
            };
            Ok(UpdateSpec::parse_pipeline(stages, vars.as_ref(), filters)?)
        }
        Some(_) => Err(CommandError::new(
            9,
            "FailedToParse",
            "Update argument must be either an object or an array",
        )),
        None => Err(CommandError::new(
            40414,
            "Location40414",
            "BSON field 'update.updates.u' is missing but a required field",
        )),
    }
}

/// Checks a statement's options: a malformed `collation` fails it with
/// MongoDB's error.
fn refuse_unsupported(stmt: &Document) -> CmdResult<()> {
    super::source::collation_of(stmt)?;
    Ok(())
}

pub fn update(ctx: &Ctx<'_>, cmd: &Document, target: &mut Target<'_>) -> CmdResult {
    let (name, stmts, ordered) = batch(cmd, "update", "updates")?;
    let bypass = args::flag(cmd, "bypassDocumentValidation")?;
    let let_vars = args::opt_doc(cmd, "let")?;
    // IDL type errors fail the whole command, before any statement runs.
    let mut filters = Vec::with_capacity(stmts.len());
    for stmt in &stmts {
        filters.push(array_filters(stmt, "update.updates.arrayFilters")?);
        args::opt_doc(stmt, "c")?;
    }
    let parse = |i: usize, stmt: &Document, q| -> CmdResult<UpdateStatement> {
        let af = filters
            .get(i)
            .and_then(Option::as_deref)
            .unwrap_or_default();
        let update = update_spec(stmt.get("u"), af, let_vars, args::opt_doc(stmt, "c")?)?;
        let options = UpdateOptions {
            upsert: args::flag(stmt, "upsert")?,
            hint: stmt.get("hint").cloned(),
        };
        Ok(UpdateStatement {
            filter: q,
            update,
            options,
            // Each statement runs under its own `collation` (else the
            // collection's default), live or in the transaction.
            collation: super::source::collation_of(stmt)?,
            multi: args::flag(stmt, "multi")?,
        })
    };
    let run = |checked| -> CmdResult<StatementResults<UpdateResult>> {
        let coll = target.collection_with(ctx, name, bypass)?;
        Ok(coll.update_statements(checked, ordered)?)
    };
    let counted = &ctx.state.ops.update;
    let Ran { done, errors } =
        run_statements(ctx, &stmts, (ordered, let_vars), counted, parse, run)?;
    let (mut n, mut modified, mut upserted) = (0i64, 0i64, Vec::new());
    for (i, r) in done {
        n += r.matched as i64;
        modified += r.modified as i64;
        if let Some(id) = r.upserted_id {
            n += 1;
            upserted.push(Bson::Document(doc! {"index": i as i32, "_id": id}));
        }
    }
    let mut extra = doc! {"nModified": modified as i32};
    if !upserted.is_empty() {
        extra.insert("upserted", upserted);
    }
    Ok(write_reply(n, extra, errors))
}

pub fn delete(ctx: &Ctx<'_>, cmd: &Document, target: &mut Target<'_>) -> CmdResult {
    let (name, stmts, ordered) = batch(cmd, "delete", "deletes")?;
    // `limit` is required (IDL), checked for every statement first.
    for stmt in &stmts {
        if stmt.get("limit").is_none() {
            return Err(CommandError::new(
                40414,
                "Location40414",
                "BSON field 'delete.deletes.limit' is missing but a required field",
            ));
        }
    }
    let parse = |_: usize, stmt: &Document, q| -> CmdResult<DeleteStatement> {
        let collation = super::source::collation_of(stmt)?;
        let multi = match args::opt_i64(stmt, "limit")?.unwrap_or(0) {
            0 => true,
            1 => false,
            other => {
                return Err(CommandError::new(
                    9,
                    "FailedToParse",
                    format!("The limit field in delete objects must be 0 or 1. Got {other}"),
                ))
            }
        };
        Ok(DeleteStatement {
            filter: q,
            multi,
            collation,
        })
    };
    let run = |checked| -> CmdResult<StatementResults<u64>> {
        let coll = target.collection(ctx, name)?;
        Ok(coll.delete_statements(checked, ordered)?)
    };
    let counted = &ctx.state.ops.delete;
    let let_vars = args::opt_doc(cmd, "let")?;
    let Ran { done, errors } =
        run_statements(ctx, &stmts, (ordered, let_vars), counted, parse, run)?;
    let n: u64 = done.iter().map(|(_, k)| k).sum();
    Ok(write_reply(n as i64, Document::new(), errors))
}

/// The arguments of a `findAndModify`, checked; counts the operation.
struct FindAndModifyArgs<'a> {
    pub coll: &'a str,
    pub query: Document,
    pub remove: bool,
    pub return_new: bool,
    pub upsert: bool,
    /// `None` for `remove: true`.
    pub spec: Option<UpdateSpec>,
}

fn find_and_modify_args<'a>(
    ctx: &Ctx<'_>,
    cmd: &'a Document,
    name_field: &str,
) -> CmdResult<FindAndModifyArgs<'a>> {
    let coll = args::collection_name(cmd, name_field)?;
    refuse_unsupported(cmd)?;
    let let_vars = args::opt_doc(cmd, "let")?;
    let query = args::opt_doc(cmd, "query")?.cloned().unwrap_or_default();
    let query = duetdb::lang::Filter::bind_let(&query, let_vars)?;
    let remove = args::flag(cmd, "remove")?;
    let return_new = args::flag(cmd, "new")?;
    let upsert = args::flag(cmd, "upsert")?;
    let filters = array_filters(cmd, "findAndModify.arrayFilters")?;
    let update = cmd.get("update").filter(|u| !matches!(u, Bson::Null));
    // MongoDB's checks, in its order and words.
    let fail = |m: &str| Err(CommandError::new(9, "FailedToParse", m.to_string()));
    if !remove && update.is_none() {
        return fail("Either an update or remove=true must be specified");
    }
    if remove {
        if update.is_some() {
            return fail("Cannot specify both an update and remove=true");
        }
        if upsert {
            return fail("Cannot specify both upsert=true and remove=true ");
        }
        if return_new {
            return fail(
                "Cannot specify both new=true and remove=true; 'remove' always returns the \
                 deleted document",
            );
        }
        if filters.is_some() {
            return fail("Cannot specify arrayFilters and remove=true");
        }
    }
    if matches!(update, Some(Bson::Array(_))) && filters.is_some() {
        return fail("Cannot specify arrayFilters and a pipeline update");
    }
    let spec = if remove {
        OpCounters::bump(&ctx.state.ops.delete, 1);
        None
    } else {
        OpCounters::bump(&ctx.state.ops.update, 1);
        let af = filters.as_deref().unwrap_or_default();
        Some(update_spec(update, af, let_vars, None)?)
    };
    Ok(FindAndModifyArgs {
        coll,
        query,
        remove,
        return_new,
        upsert,
        spec,
    })
}

pub fn find_and_modify(
    ctx: &Ctx<'_>,
    cmd: &Document,
    name_field: &str,
    target: &mut Target<'_>,
) -> CmdResult {
    let FindAndModifyArgs {
        coll: name,
        query,
        remove,
        return_new,
        upsert,
        spec,
    } = find_and_modify_args(ctx, cmd, name_field)?;
    let options = FindAndModifyOptions {
        sort: args::opt_doc(cmd, "sort")?.cloned(),
        projection: args::opt_doc(cmd, "fields")?.cloned(),
        upsert,
        return_document: if return_new {
            ReturnDocument::After
        } else {
            ReturnDocument::Before
        },
        hint: cmd.get("hint").cloned(),
        let_vars: args::opt_doc(cmd, "let")?.cloned(),
    };
    let bypass = args::flag(cmd, "bypassDocumentValidation")?;
    let collation = super::source::collation_of(cmd)?;
    let coll = target.collection_collated(ctx, name, bypass, collation)?;
    let (value, out) = coll.find_and_modify_with_spec(query, spec, options)?;
    Ok(find_and_modify_reply(
        remove,
        value,
        &out.update,
        out.removed,
    ))
}

/// A findAndModify's reply: what it returned (`value`, projected) and what
/// it did (also a retry's reply from the replica set's table, `repl.rs`).
pub(super) fn find_and_modify_reply(
    remove: bool,
    value: Option<Document>,
    update: &UpdateResult,
    removed: bool,
) -> Document {
    let last_error = if remove {
        doc! {"n": i32::from(removed)}
    } else {
        let mut d = doc! {
            "n": if update.matched > 0 || update.upserted_id.is_some() { 1 } else { 0 },
            "updatedExisting": update.matched > 0,
        };
        if let Some(id) = &update.upserted_id {
            d.insert("upserted", id.clone());
        }
        d
    };
    doc! {
        "lastErrorObject": last_error,
        "value": value.map(Bson::Document).unwrap_or(Bson::Null),
        "ok": 1.0,
    }
}
