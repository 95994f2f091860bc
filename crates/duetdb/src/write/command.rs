//! What each mutation does to a database state. Runs only inside the writer.
//!
//! Contract with the writer: a command either applies completely and returns
//! `Ok`, or returns `Err` having left the state exactly as it found it. Commands
//! whose work can fail midway (multi-document updates, a collection created
//! implicitly by a failing insert) keep an undo list and roll back themselves:
//! the writer does not clone the state per command, because a live clone would
//! force every node to be copied again on the next write.
//!
//! `insert_many` is the one exception MongoDB's protocol requires: each
//! document is its own atomic step and per-document errors are reported.
//! A [`Command::Batch`] is not an exception: it is a list of commands
//! (update and delete statements of one client command) that the writer
//! applies one after the other, each under this contract on its own
//! (`write/writer.rs`); this module never applies one as a whole.
//!
//! Every change a command keeps is also recorded as an [`Effect`] (a physical
//! change: put, delete, create/drop/rename, index spec) for the WAL; recovery
//! replays effects and never re-runs filters or updates. Recording is a no-op
//! unless the writer is logging the group; the writer drops the effects of a
//! command that fails.

use std::any::Any;
use std::ops::ControlFlow;
use std::sync::Arc;

use bson::raw::RawDocumentBuf;
use bson::{Bson, DateTime, Document, RawBson};

use crate::doc::{self, DocRef};
use crate::durability::effect::{Effect, Effects};
use crate::error::{Error, Result};
use crate::query::planner::{self, FindSpec, Hint};
use crate::query::update::upsert_seed;
use crate::query::validator::Validator;
use crate::query::{ApplyContext, Filter, SortSpec, UpdateSpec};
use crate::store::collection::CollectionState;
use crate::store::heap::RecordId;
use crate::store::index::IndexSpec;
use crate::store::vls::CollectionVls;
use crate::store::DbState;

/// Most documents one insert command may carry (MongoDB's maxWriteBatchSize).
pub const MAX_WRITE_BATCH: usize = 100_000;

/// Most statements one [`Command::Batch`] carries. A batch weighs its
/// statements in a writer group, whose weight is bounded by
/// `writer::MAX_GROUP` (equal to this): one publish never waits for more
/// statements than it waited for when each statement was a command.
pub const MAX_BATCH_STATEMENTS: usize = 1024;

/// A mutation, executed atomically by the writer.
#[derive(Debug)]
pub enum Command {
    CreateCollection {
        name: String,
    },
    DropCollection {
        name: String,
    },
    /// Rename `from` to `to`; `drop_target` replaces an existing `to`.
    RenameCollection {
        from: String,
        to: String,
        drop_target: bool,
    },
    Insert {
        coll: String,
        docs: Vec<(RawDocumentBuf, RawBson)>,
        ordered: bool,
        /// `bypassDocumentValidation`: the collection's validator is not run.
        bypass_validation: bool,
    },
    Update(UpdateCommand),
    Delete(DeleteCommand),
    FindAndModify(FindAndModifyCommand),
    CreateIndex {
        coll: String,
        spec: IndexSpec,
    },
    DropIndex {
        coll: String,
        name: String,
    },
    /// A step of a higher layer (a scan's registration, a transaction's
    /// commit) run by the writer at a commit boundary, with the working state
    /// and the group's effects log. Like every command it either succeeds
    /// completely or fails having changed nothing; its result comes back as
    /// [`Reply::Boundary`].
    AtBoundary(BoundaryStep),
    /// Statements of one client command applied in order by one writer
    /// command, each as a command of its own (see [`Batch`]).
    Batch(Batch),
}

/// One statement of a [`Batch`]: what a single update or delete command
/// would carry.
#[derive(Debug)]
// Both variants are hundreds of bytes (a parsed filter, an update); a batch
// holds at most MAX_BATCH_STATEMENTS of them and moves each once.
#[allow(clippy::large_enum_variant)]
pub enum Statement {
    Update(UpdateCommand),
    Delete(DeleteCommand),
}

impl From<Statement> for Command {
    fn from(s: Statement) -> Command {
        match s {
            Statement::Update(u) => Command::Update(u),
            Statement::Delete(d) => Command::Delete(d),
        }
    }
}

/// Update or delete statements of one client command (a driver's bulk
/// write, outside transactions), applied by the writer in order inside one
/// group. Each statement is a command of its own: it takes its own csn,
/// records its own effects and, when it fails, undoes only itself — the
/// statements are not atomic together, as MongoDB's are not. `ordered`
/// stops at the first failure (later statements are not applied);
/// unordered applies every statement. The reply is [`Reply::Batch`]: one
/// result per statement applied or failed, in order.
#[derive(Debug)]
pub struct Batch {
    /// At most [`MAX_BATCH_STATEMENTS`]. `Err`: a statement refused before
    /// it reached the writer (its arguments); it fails in its place and
    /// changes nothing.
    pub items: Vec<Result<Statement>>,
    pub ordered: bool,
}

#[derive(Debug)]
pub struct UpdateCommand {
    pub coll: String,
    pub filter: Filter,
    /// The filter as given (upserts seed the new document from its equalities).
    pub filter_doc: Document,
    pub update: UpdateSpec,
    pub multi: bool,
    pub upsert: bool,
    pub hint: Option<Hint>,
    /// `bypassDocumentValidation`.
    pub bypass_validation: bool,
}

/// Delete the first match of `filter` (every match with `multi`).
#[derive(Debug)]
pub struct DeleteCommand {
    pub coll: String,
    pub filter: Filter,
    pub multi: bool,
    pub hint: Option<Hint>,
}

#[derive(Debug)]
pub struct FindAndModifyCommand {
    pub coll: String,
    pub filter: Filter,
    pub filter_doc: Document,
    pub sort: Option<SortSpec>,
    /// `None` removes the document.
    pub update: Option<UpdateSpec>,
    pub upsert: bool,
    /// Return the new version instead of the old one.
    pub return_new: bool,
    pub hint: Option<Hint>,
    /// `bypassDocumentValidation`.
    pub bypass_validation: bool,
}

impl Command {
    /// The command's kind, for messages (cheap: never formats documents).
    #[cfg_attr(not(debug_assertions), allow(dead_code))]
    pub fn name(&self) -> &'static str {
        match self {
            Command::CreateCollection { .. } => "createCollection",
            Command::DropCollection { .. } => "dropCollection",
            Command::RenameCollection { .. } => "renameCollection",
            Command::Insert { .. } => "insert",
            Command::Update(_) => "update",
            Command::Delete(_) => "delete",
            Command::FindAndModify(_) => "findAndModify",
            Command::CreateIndex { .. } => "createIndex",
            Command::DropIndex { .. } => "dropIndex",
            Command::AtBoundary(_) => "boundary step",
            Command::Batch(_) => "batch",
        }
    }

    /// What the command weighs in a writer group: a batch its statements,
    /// any other command 1.
    pub fn weight(&self) -> usize {
        match self {
            Command::Batch(b) => b.items.len().max(1),
            _ => 1,
        }
    }
}

/// The work of a [`Command::AtBoundary`]: runs once, on the writer thread.
#[allow(clippy::type_complexity)]
pub struct BoundaryStep(
    pub Box<dyn FnOnce(&mut DbState, &mut Effects) -> Result<Box<dyn Any + Send>> + Send>,
);

impl std::fmt::Debug for BoundaryStep {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("BoundaryStep")
    }
}

/// What a [`BoundaryStep`] returned (downcast by [`crate::write::writer::Writer::at_boundary`]).
pub struct BoundaryResult(pub Box<dyn Any + Send>);

impl std::fmt::Debug for BoundaryResult {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("BoundaryResult")
    }
}

/// Outcome of an update.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct UpdateResult {
    pub matched: u64,
    pub modified: u64,
    pub upserted_id: Option<Bson>,
}

/// Outcome of an insert command.
#[derive(Debug, Clone, Default)]
pub struct InsertOutcome {
    /// `(position in the input, _id)` of each inserted document.
    pub inserted: Vec<(usize, Bson)>,
    /// `(position in the input, error)` of each failed document.
    pub errors: Vec<(usize, Error)>,
}

/// Outcome of a findAndModify.
#[derive(Debug, Clone, Default)]
pub struct FindAndModifyOutcome {
    pub doc: Option<DocRef>,
    pub update: UpdateResult,
    pub removed: bool,
}

/// What a command returns.
#[derive(Debug)]
pub enum Reply {
    Done,
    Existed(bool),
    Inserted(InsertOutcome),
    Updated(UpdateResult),
    Deleted(u64),
    FoundAndModified(FindAndModifyOutcome),
    /// The result of an [`Command::AtBoundary`] step.
    Boundary(BoundaryResult),
    /// The result of each statement of a [`Command::Batch`] that ran, in
    /// order (an ordered batch's end at its first failure).
    Batch(Vec<Result<Reply>>),
}

/// What a client write did, as a replica set remembers it with the write's
/// tag (`durability::replicate::Tagged`): a retry of the write on any member
/// is answered from it as the first execution was (counts, upserted ids, a
/// findAndModify's document — MongoDB keeps the latter's pre/post image for
/// exactly this, `config.image_collection`). Encoded as a small BSON
/// document; `Other` is every reply with nothing to tell (encoded empty).
#[derive(Debug, Clone, PartialEq)]
pub enum WriteOutcome {
    Inserted {
        n: u64,
    },
    Updated(UpdateResult),
    Deleted(u64),
    FoundAndModified {
        /// The document returned (before or after, as the command asked),
        /// not projected: the retry projects it with the command's `fields`.
        doc: Option<Document>,
        update: UpdateResult,
        removed: bool,
    },
    Other,
}

impl WriteOutcome {
    /// The outcome of a successful command's reply.
    pub fn of(reply: &Reply) -> WriteOutcome {
        match reply {
            Reply::Inserted(o) => WriteOutcome::Inserted {
                n: o.inserted.len() as u64,
            },
            Reply::Updated(r) => WriteOutcome::Updated(r.clone()),
            Reply::Deleted(n) => WriteOutcome::Deleted(*n),
            Reply::FoundAndModified(o) => WriteOutcome::FoundAndModified {
                doc: o.doc.as_ref().and_then(|d| doc::to_document(d).ok()),
                update: o.update.clone(),
                removed: o.removed,
            },
            _ => WriteOutcome::Other,
        }
    }

    /// The bytes a replica set stores (empty for `Other`).
    pub fn encode(&self) -> Vec<u8> {
        let counts = |u: &UpdateResult, d: &mut Document| {
            d.insert("m", u.matched as i64);
            d.insert("mo", u.modified as i64);
            if let Some(id) = &u.upserted_id {
                d.insert("up", id.clone());
            }
        };
        let d = match self {
            WriteOutcome::Other => return Vec::new(),
            WriteOutcome::Inserted { n } => bson::doc! {"k": "i", "n": *n as i64},
            WriteOutcome::Deleted(n) => bson::doc! {"k": "d", "n": *n as i64},
            WriteOutcome::Updated(u) => {
                let mut d = bson::doc! {"k": "u"};
                counts(u, &mut d);
                d
            }
            WriteOutcome::FoundAndModified {
                doc,
                update,
                removed,
            } => {
                let mut d = bson::doc! {"k": "f", "rm": *removed};
                counts(update, &mut d);
                if let Some(doc) = doc {
                    d.insert("doc", doc.clone());
                }
                d
            }
        };
        doc::to_raw_document(&d)
            .map(|r| r.into_bytes())
            .unwrap_or_default()
    }

    /// The statement ids of what `reply` applied, command item `i` being
    /// statement `stmts[i]` (`None`: statement `i`): an insert's inserted
    /// documents, else the command's one statement.
    pub fn statements_of(reply: &Reply, stmts: Option<&[u32]>) -> Vec<u32> {
        match reply {
            Reply::Inserted(o) => o
                .inserted
                .iter()
                .map(|(i, _)| statement_id(stmts, *i))
                .collect(),
            _ => vec![statement_id(stmts, 0)],
        }
    }

    /// What a replica set records of a successful command's `reply`, one
    /// outcome ([`WriteOutcome::encode_at`]) per command it counts as: a
    /// batch's statements that applied, each with its own statement id
    /// (item `i` is `stmts[i]`), exactly as when each was a command of its
    /// own; any other command one.
    pub fn recorded(reply: &Reply, stmts: Option<&[u32]>) -> Vec<Vec<u8>> {
        match reply {
            Reply::Batch(items) => items
                .iter()
                .enumerate()
                .filter_map(|(i, r)| {
                    let r = r.as_ref().ok()?;
                    Some(WriteOutcome::of(r).encode_at(&[statement_id(stmts, i)]))
                })
                .collect(),
            r => vec![WriteOutcome::of(r).encode_at(&WriteOutcome::statements_of(r, stmts))],
        }
    }

    /// [`WriteOutcome::encode`] with the statement ids it applied
    /// ([`WriteOutcome::statements`] reads them back): `s0`, the first,
    /// when they are consecutive (an insert's `n` of them, else one), else
    /// `s`, every id as 4 little-endian bytes. Empty for `Other`.
    pub fn encode_at(&self, stmts: &[u32]) -> Vec<u8> {
        let bytes = self.encode();
        if bytes.is_empty() {
            return bytes;
        }
        let Ok(mut d) = RawDocumentBuf::from_bytes(bytes)
            .map_err(|_| ())
            .and_then(|r| doc::to_document(&r).map_err(|_| ()))
        else {
            return Vec::new();
        };
        let consecutive = stmts.windows(2).all(|w| w[0].checked_add(1) == Some(w[1]));
        match stmts.first() {
            Some(&first) if consecutive => {
                d.insert("s0", i64::from(first));
            }
            _ => {
                let bytes: Vec<u8> = stmts.iter().flat_map(|s| s.to_le_bytes()).collect();
                d.insert(
                    "s",
                    bson::Binary {
                        subtype: bson::spec::BinarySubtype::Generic,
                        bytes,
                    },
                );
            }
        }
        doc::to_raw_document(&d)
            .map(|r| r.into_bytes())
            .unwrap_or_default()
    }

    /// The statement ids an outcome [`WriteOutcome::encode_at`] wrote
    /// applied, in order; `None` when it has none (written by a build
    /// before statement ids, or by [`WriteOutcome::encode`]).
    pub fn statements(bytes: &[u8]) -> Option<Vec<u32>> {
        if bytes.is_empty() {
            return None;
        }
        let raw = RawDocumentBuf::from_bytes(bytes.to_vec()).ok()?;
        let d = doc::to_document(&raw).ok()?;
        if let Ok(b) = d.get_binary_generic("s") {
            if b.len() % 4 != 0 {
                return None;
            }
            return Some(
                b.chunks_exact(4)
                    .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                    .collect(),
            );
        }
        let first = u32::try_from(d.get_i64("s0").ok()?).ok()?;
        let n = match d.get_str("k").ok()? {
            "i" => u32::try_from(d.get_i64("n").ok()?).ok()?,
            _ => 1,
        };
        (0..n).map(|k| first.checked_add(k)).collect()
    }

    /// What [`WriteOutcome::encode`] wrote; `None` for bytes it never
    /// writes (an empty outcome is `Other`).
    pub fn decode(bytes: &[u8]) -> Option<WriteOutcome> {
        if bytes.is_empty() {
            return Some(WriteOutcome::Other);
        }
        let raw = RawDocumentBuf::from_bytes(bytes.to_vec()).ok()?;
        let d = doc::to_document(&raw).ok()?;
        let count = |f: &str| d.get_i64(f).ok().and_then(|n| u64::try_from(n).ok());
        let update = || -> Option<UpdateResult> {
            Some(UpdateResult {
                matched: count("m")?,
                modified: count("mo")?,
                upserted_id: d.get("up").cloned(),
            })
        };
        Some(match d.get_str("k").ok()? {
            "i" => WriteOutcome::Inserted { n: count("n")? },
            "d" => WriteOutcome::Deleted(count("n")?),
            "u" => WriteOutcome::Updated(update()?),
            "f" => WriteOutcome::FoundAndModified {
                doc: d.get_document("doc").ok().cloned(),
                update: update()?,
                removed: d.get_bool("rm").ok()?,
            },
            _ => return None,
        })
    }
}

/// The statement id of command item `i`: `stmts[i]` (`None`: `i`).
fn statement_id(stmts: Option<&[u32]>, i: usize) -> u32 {
    let own = u32::try_from(i).unwrap_or(u32::MAX);
    stmts.map_or(own, |s| s.get(i).copied().unwrap_or(own))
}

/// Apply `cmd` to `state` (see the module contract).
pub fn apply_command(state: &mut DbState, fx: &mut Effects, cmd: Command) -> Result<Reply> {
    match cmd {
        Command::CreateCollection { name } => {
            if state.collection(&name).is_some() {
                return Err(Error::NamespaceExists(name));
            }
            ensure_collection(state, &name);
            fx.record(|| Effect::CreateCollection { name });
            Ok(Reply::Done)
        }
        Command::DropCollection { name } => {
            let removed = Arc::make_mut(&mut state.collections).remove(&name);
            if let Some(c) = &removed {
                c.vls.mark_dropped();
                fx.record(|| Effect::DropCollection { name });
            }
            Ok(Reply::Existed(removed.is_some()))
        }
        Command::RenameCollection {
            from,
            to,
            drop_target,
        } => {
            if state.collection(&from).is_none() {
                return Err(Error::NamespaceNotFound(from));
            }
            if from == to {
                return Err(Error::IllegalOperation(
                    "cannot rename a collection to itself".into(),
                ));
            }
            if state.collection(&to).is_some() && !drop_target {
                return Err(Error::NamespaceExists(to));
            }
            let ns = format!("{}.{to}", state.db);
            let options = state.vls_options;
            let map = Arc::make_mut(&mut state.collections);
            let mut c = map.remove(&from).ok_or_else(|| missing(&from))?;
            c.ns = Arc::from(ns.as_str());
            // Scans of the old name end with an error; the renamed collection gets
            // fresh VLS bookkeeping covering its existing records.
            c.vls.mark_dropped();
            c.vls = Arc::new(CollectionVls::with_records(options, c.next_rid));
            if let Some(replaced) = map.insert(to.clone(), c) {
                replaced.vls.mark_dropped();
            }
            fx.record(|| Effect::Rename { from, to });
            Ok(Reply::Done)
        }
        Command::Insert {
            coll,
            docs,
            ordered,
            bypass_validation,
        } => insert(state, fx, &coll, docs, ordered, bypass_validation),
        Command::Update(u) => update(state, fx, u),
        Command::Delete(d) => delete(state, fx, &d),
        Command::FindAndModify(f) => find_and_modify(state, fx, f),
        Command::CreateIndex { coll, spec } => {
            let created_coll = ensure_collection(state, &coll);
            let c = state.collection_mut(&coll).ok_or_else(|| missing(&coll))?;
            let logged = spec.clone();
            match c.create_index(spec) {
                Ok(created) => {
                    if created_coll {
                        fx.record(|| Effect::CreateCollection { name: coll.clone() });
                    }
                    if created {
                        fx.record(|| Effect::CreateIndex { coll, spec: logged });
                    }
                    Ok(Reply::Existed(!created))
                }
                Err(e) => {
                    undo_create(state, &coll, created_coll);
                    Err(e)
                }
            }
        }
        Command::DropIndex { coll, name } => {
            let c = state
                .collection_mut(&coll)
                .ok_or_else(|| Error::NamespaceNotFound(coll.clone()))?;
            c.drop_index(&name)?;
            fx.record(|| Effect::DropIndex { coll, name });
            Ok(Reply::Done)
        }
        Command::AtBoundary(step) => {
            (step.0)(state, fx).map(|r| Reply::Boundary(BoundaryResult(r)))
        }
        // Its statements are commands of their own, each with its csn and
        // its own undo: only the writer applies them (`writer::apply_batch`).
        Command::Batch(_) => Err(Error::Internal(
            "a batch is applied statement by statement by the writer".into(),
        )),
    }
}

fn missing(coll: &str) -> Error {
    Error::Internal(format!("collection {coll} vanished inside a command"))
}

/// The collection's validator unless bypassed or absent (compiled once per
/// command; the stored options were checked when set).
fn validator_of(c: &CollectionState, bypass: bool) -> Result<Option<Validator>> {
    if bypass || c.options.validator.is_none() {
        return Ok(None);
    }
    Validator::of(&c.options)
}

/// Run `v` (if any) on the version a write stores.
fn validate(
    v: &Option<Validator>,
    c: &CollectionState,
    old: Option<&DocRef>,
    new: &RawDocumentBuf,
) -> Result<()> {
    match v {
        Some(v) => v.check(&c.ns, old.map(|o| o.as_ref().as_ref()), new),
        None => Ok(()),
    }
}

/// Create `name` if absent; true when it was created.
fn ensure_collection(state: &mut DbState, name: &str) -> bool {
    if state.collection(name).is_some() {
        return false;
    }
    let ns = format!("{}.{name}", state.db);
    let c = CollectionState::new(&ns, state.vls_options);
    Arc::make_mut(&mut state.collections).insert(name.to_string(), c);
    true
}

fn undo_create(state: &mut DbState, name: &str, created: bool) {
    if created {
        Arc::make_mut(&mut state.collections).remove(name);
    }
}

fn insert(
    state: &mut DbState,
    fx: &mut Effects,
    coll: &str,
    docs: Vec<(RawDocumentBuf, RawBson)>,
    ordered: bool,
    bypass: bool,
) -> Result<Reply> {
    if docs.len() > MAX_WRITE_BATCH {
        return Err(Error::bad_value(format!(
            "write batch of {} documents exceeds the limit of {MAX_WRITE_BATCH}",
            docs.len()
        )));
    }
    let created = ensure_collection(state, coll);
    let c = state.collection_mut(coll).ok_or_else(|| missing(coll))?;
    let v = validator_of(c, bypass)?;
    let mut out = InsertOutcome::default();
    for (i, (raw, id)) in docs.into_iter().enumerate() {
        if let Err(e) = validate(&v, c, None, &raw) {
            out.errors.push((i, e));
            if ordered {
                break;
            }
            continue;
        }
        let id_bson = Bson::try_from(id.clone()).unwrap_or(Bson::Null);
        let d: DocRef = Arc::new(raw);
        match c.insert(d.clone(), id) {
            Ok(_) => {
                fx.insert(coll, &d);
                // Unlogged: replaying the insert trims the same way.
                c.trim_capped()?;
                out.inserted.push((i, id_bson))
            }
            Err(e) => {
                out.errors.push((i, e));
                if ordered {
                    break;
                }
            }
        }
    }
    if out.inserted.is_empty() {
        undo_create(state, coll, created);
        if out.errors.len() == 1 {
            // A lone failure is the command's error: the state is unchanged.
            let (_, e) = out
                .errors
                .pop()
                .ok_or_else(|| Error::Internal("no error".into()))?;
            return Err(e);
        }
    }
    Ok(Reply::Inserted(out))
}

/// The matching records, in plan (or sort) order, at most one unless `multi`.
fn matching(
    c: &CollectionState,
    filter: &Filter,
    sort: Option<&SortSpec>,
    multi: bool,
    hint: Option<&Hint>,
) -> Result<Vec<(RecordId, DocRef)>> {
    if sort.is_some() {
        let spec = FindSpec {
            filter: Some(filter.clone()),
            sort: sort.cloned(),
            skip: 0,
            limit: if multi { 0 } else { 1 },
            hint: hint.cloned(),
        };
        return Ok(planner::run_find(c, &spec)?.0);
    }
    let plan = planner::plan(c, filter, None, hint)?;
    let mut out = Vec::new();
    planner::execute(c, &plan, filter, |rid, doc| {
        out.push((rid, doc.clone()));
        if multi {
            ControlFlow::Continue(())
        } else {
            ControlFlow::Break(())
        }
    })?;
    Ok(out)
}

/// The new version of `old` (which `filter` matched) under `update`,
/// validated for storage; `None` when the update changes nothing. (Also used
/// by transactions.)
pub(crate) fn updated_version(
    old: &DocRef,
    update: &UpdateSpec,
    filter: &Filter,
    now: DateTime,
) -> Result<Option<RawDocumentBuf>> {
    if let Some(new_raw) = update.patch_raw(old) {
        // `_id` untouched, size and depth within limits (`raw.rs`).
        return Ok((new_raw.as_bytes() != old.as_bytes()).then_some(new_raw));
    }
    // A document repeating a name keeps every occurrence the update does not
    // address (`doc/repeated.rs`); a `Document` alone would keep one.
    let repeats = doc::repeated::has_repeated_names(old);
    let old_doc = if repeats {
        doc::repeated::to_document_marked(old)?
    } else {
        doc::to_document(old)?
    };
    // The array position the query matched, for a positional `$`.
    let position = if update.needs_position() {
        filter.match_position(old).flatten()
    } else {
        None
    };
    let new_doc = update.apply(
        &old_doc,
        &ApplyContext {
            is_upsert_insert: false,
            now,
            position,
        },
    )?;
    doc::check_depth(&new_doc)?;
    let new_raw = if repeats {
        doc::repeated::to_raw_unmarked(&new_doc)?
    } else {
        doc::to_raw_document(&new_doc)?
    };
    if new_raw.as_bytes() == old.as_bytes() {
        return Ok(None);
    }
    match (doc::id_of(old), doc::id_of(&new_raw)) {
        (Some(a), Some(b)) if crate::doc::value::equal(a, b) => Ok(Some(doc::exact(new_raw))),
        _ => Err(Error::ImmutableField(
            "Performing an update on the path '_id' would modify the immutable field '_id'".into(),
        )),
    }
}

/// Replace each `(rid, new)`; on the first failure, put back what was replaced.
fn replace_all(
    fx: &mut Effects,
    c: &mut CollectionState,
    coll: &str,
    changes: Vec<(RecordId, DocRef, DocRef)>,
    update: &UpdateSpec,
) -> Result<u64> {
    // Indexes the update may touch, decided once per command: the others keep
    // their keys, so no key is computed for them.
    let affected: Vec<String> = c
        .indexes
        .iter()
        .filter(|i| i.spec.may_be_affected(&|p| update.may_affect(p)))
        .map(|i| i.spec.name.clone())
        .collect();
    let mut done: Vec<(RecordId, DocRef)> = Vec::new();
    for (rid, old, new) in changes {
        // Recorded before the attempt; on failure the writer drops the
        // command's effects along with its changes.
        fx.replace(
            coll,
            &old,
            &new,
            !update.is_replacement(),
            c.options.pre_and_post_images,
        );
        if let Err(e) = c.replace_where(rid, new, |spec| affected.contains(&spec.name)) {
            for (rid, old) in done.into_iter().rev() {
                // Restoring a version that was consistent before cannot conflict.
                c.replace(rid, old)
                    .map_err(|u| Error::Internal(format!("undo of a failed update failed: {u}")))?;
            }
            return Err(e);
        }
        done.push((rid, old));
    }
    Ok(done.len() as u64)
}

fn upsert_doc(
    filter_doc: &Document,
    update: &UpdateSpec,
    now: DateTime,
) -> Result<(RawDocumentBuf, RawBson)> {
    let seed = upsert_seed(filter_doc)?;
    let new_doc = update.apply(
        &seed,
        &ApplyContext {
            is_upsert_insert: true,
            now,
            position: None,
        },
    )?;
    doc::prepare_insert(&new_doc)
}

fn update(state: &mut DbState, fx: &mut Effects, u: UpdateCommand) -> Result<Reply> {
    let now = DateTime::now();
    let Some(c) = state.collection(&u.coll) else {
        if !u.upsert {
            return Ok(Reply::Updated(UpdateResult::default()));
        }
        return upsert_into(state, fx, &u, now).map(Reply::Updated);
    };
    let found = matching(c, &u.filter, None, u.multi, u.hint.as_ref())?;
    if found.is_empty() && u.upsert {
        return upsert_into(state, fx, &u, now).map(Reply::Updated);
    }
    let v = validator_of(c, u.bypass_validation)?;
    let mut changes = Vec::new();
    for (rid, old) in &found {
        if let Some(new) = updated_version(old, &u.update, &u.filter, now)? {
            validate(&v, c, Some(old), &new)?;
            changes.push((*rid, old.clone(), Arc::new(new)));
        }
    }
    let c = state
        .collection_mut(&u.coll)
        .ok_or_else(|| missing(&u.coll))?;
    let modified = replace_all(fx, c, &u.coll, changes, &u.update)?;
    Ok(Reply::Updated(UpdateResult {
        matched: found.len() as u64,
        modified,
        upserted_id: None,
    }))
}

fn upsert_into(
    state: &mut DbState,
    fx: &mut Effects,
    u: &UpdateCommand,
    now: DateTime,
) -> Result<UpdateResult> {
    let coll = u.coll.as_str();
    let (raw, id) = upsert_doc(&u.filter_doc, &u.update, now)?;
    let created = ensure_collection(state, coll);
    let c = state.collection_mut(coll).ok_or_else(|| missing(coll))?;
    if let Err(e) = validate(&validator_of(c, u.bypass_validation)?, c, None, &raw) {
        undo_create(state, coll, created);
        return Err(e);
    }
    let id_bson = Bson::try_from(id.clone()).unwrap_or(Bson::Null);
    let d: DocRef = Arc::new(raw);
    if let Err(e) = c.insert(d.clone(), id) {
        undo_create(state, coll, created);
        return Err(e);
    }
    fx.insert(coll, &d);
    c.trim_capped()?;
    Ok(UpdateResult {
        matched: 0,
        modified: 0,
        upserted_id: Some(id_bson),
    })
}

fn delete(state: &mut DbState, fx: &mut Effects, d: &DeleteCommand) -> Result<Reply> {
    let coll = d.coll.as_str();
    let Some(c) = state.collection(coll) else {
        return Ok(Reply::Deleted(0));
    };
    let found = matching(c, &d.filter, None, d.multi, d.hint.as_ref())?;
    let c = state.collection_mut(coll).ok_or_else(|| missing(coll))?;
    for (rid, d) in &found {
        c.delete(*rid)?;
        fx.delete(coll, d, c.options.pre_and_post_images);
    }
    Ok(Reply::Deleted(found.len() as u64))
}

fn find_and_modify(
    state: &mut DbState,
    fx: &mut Effects,
    f: FindAndModifyCommand,
) -> Result<Reply> {
    let now = DateTime::now();
    let found = match state.collection(&f.coll) {
        Some(c) => matching(c, &f.filter, f.sort.as_ref(), false, f.hint.as_ref())?,
        None => Vec::new(),
    };
    let Some((rid, old)) = found.into_iter().next() else {
        return match (&f.update, f.upsert) {
            (Some(update), true) => {
                let (raw, id) = upsert_doc(&f.filter_doc, update, now)?;
                let stored: DocRef = Arc::new(raw);
                let created = ensure_collection(state, &f.coll);
                let c = state
                    .collection_mut(&f.coll)
                    .ok_or_else(|| missing(&f.coll))?;
                if let Err(e) = validate(&validator_of(c, f.bypass_validation)?, c, None, &stored) {
                    undo_create(state, &f.coll, created);
                    return Err(e);
                }
                let id_bson = Bson::try_from(id.clone()).unwrap_or(Bson::Null);
                if let Err(e) = c.insert(stored.clone(), id) {
                    undo_create(state, &f.coll, created);
                    return Err(e);
                }
                fx.insert(&f.coll, &stored);
                c.trim_capped()?;
                Ok(Reply::FoundAndModified(FindAndModifyOutcome {
                    doc: f.return_new.then_some(stored),
                    update: UpdateResult {
                        matched: 0,
                        modified: 0,
                        upserted_id: Some(id_bson),
                    },
                    removed: false,
                }))
            }
            _ => Ok(Reply::FoundAndModified(FindAndModifyOutcome::default())),
        };
    };
    let c = state
        .collection_mut(&f.coll)
        .ok_or_else(|| missing(&f.coll))?;
    match &f.update {
        None => {
            c.delete(rid)?;
            fx.delete(&f.coll, &old, c.options.pre_and_post_images);
            Ok(Reply::FoundAndModified(FindAndModifyOutcome {
                doc: Some(old),
                update: UpdateResult {
                    matched: 1,
                    ..Default::default()
                },
                removed: true,
            }))
        }
        Some(update) => {
            let new = updated_version(&old, update, &f.filter, now)?;
            let (modified, new_ref) = match new {
                Some(raw) => {
                    validate(&validator_of(c, f.bypass_validation)?, c, Some(&old), &raw)?;
                    let r: DocRef = Arc::new(raw);
                    c.replace(rid, r.clone())?;
                    fx.replace(
                        &f.coll,
                        &old,
                        &r,
                        !update.is_replacement(),
                        c.options.pre_and_post_images,
                    );
                    (1, r)
                }
                None => (0, old.clone()),
            };
            Ok(Reply::FoundAndModified(FindAndModifyOutcome {
                doc: Some(if f.return_new { new_ref } else { old }),
                update: UpdateResult {
                    matched: 1,
                    modified,
                    upserted_id: None,
                },
                removed: false,
            }))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn write_outcomes_survive_their_encoding() {
        let u = UpdateResult {
            matched: 0,
            modified: 0,
            upserted_id: Some(Bson::String("u1".into())),
        };
        let all = [
            WriteOutcome::Inserted { n: 3 },
            WriteOutcome::Deleted(2),
            WriteOutcome::Updated(u.clone()),
            WriteOutcome::FoundAndModified {
                doc: Some(bson::doc! {"_id": 1, "v": 12}),
                update: u,
                removed: false,
            },
            WriteOutcome::FoundAndModified {
                doc: None,
                update: UpdateResult::default(),
                removed: true,
            },
            WriteOutcome::Other,
        ];
        for o in all {
            assert_eq!(WriteOutcome::decode(&o.encode()), Some(o.clone()), "{o:?}");
        }
        assert_eq!(WriteOutcome::decode(b"junk"), None);
        let d = doc::to_raw_document(&bson::doc! {"k": "?"}).expect("raw");
        assert_eq!(WriteOutcome::decode(d.as_bytes()), None);
    }
}
