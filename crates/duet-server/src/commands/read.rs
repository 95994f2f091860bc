//! Read commands: find, getMore, killCursors, count, distinct, aggregate,
//! explain — live or inside a transaction.
//!
//! Every read takes its documents from one [`ReadSource`](super::source::ReadSource):
//! a held snapshot (by default the latest published root, O(1) to take, so a
//! command never sees half of a concurrent write; with `readConcern:
//! {level: "snapshot"}` one from the registry, whose `atClusterTime` is
//! returned), the live collection under the strategy `$duet: {snapshot: ...}`
//! names, or the session's transaction. A cursor over a held snapshot keeps
//! it for all its batches; other results are materialized.
//!
//! `count` alone honours the benchmark knob `$duet: {workNsPerDoc: N}`, and
//! only on a server started with `--enable-test-knobs` (IllegalOperation, 20,
//! otherwise): it then visits every matching document (on the strategy's
//! scan, or on the command's or named snapshot) and busy-waits N ns on each,
//! so a query lasts seconds while updates stream; the count it returns is
//! unchanged. The busy wait stops as soon as the command is cancelled (then
//! the scan stops at its next page).
//!
//! find, count, distinct and aggregate run under the command's limits
//! (`source::read_limits`: cancellation, the sort/`$group` memory limit,
//! `allowDiskUse` of find and aggregate).
//!
//! Cursors belong to the session (else the connection) that opened them;
//! `getMore` and `killCursors` check it (see `cursor.rs`).
//!
//! A `$text` filter (find, count, an aggregate's first `$match`) runs the
//! engine's text search (`Collection::text_find_stream`, `text_aggregate`)
//! on the command's read source (latest state, named snapshot,
//! `atClusterTime`, a transaction's snapshot) under the command's limits: a
//! find's cursor pulls the matches as batches are asked for (a sort is
//! bounded by the memory limit); `{$meta: "textScore"}` works in find
//! projections and sorts.
//!
//! `find` with `tailable` on a capped collection: `tailable.rs`.
//!
//! `aggregate` runs the engine's pipeline. Stage names are checked here
//! first: stages MongoDB has but duetdb does not run are refused with
//! CommandNotSupported (115), unknown names with 40324, malformed stage
//! documents with 40323, as MongoDB does. `explain` is `explain.rs`.

use bson::{doc, Bson, Document, Timestamp};
use duetdb::lang::Projection;
use duetdb::raw::DocRef;
use duetdb::FindOptions;

use super::snapdb;
use super::source::{read_limits, read_source, Target};
use super::Ctx;
use crate::args;
use crate::cursor::{Cursor, FindSource, Killed, TextSource, DEFAULT_FIRST_BATCH};
use crate::error::{CmdResult, CommandError};
use crate::state::OpCounters;

/// A parsed find (from `find`, an `aggregate` pipeline, or `explain`).
#[derive(Default)]
pub struct FindPlan {
    pub(crate) filter: Document,
    pub(crate) options: FindOptions,
    pub(crate) projection: Option<Document>,
}

impl FindPlan {
    pub(crate) fn from_find(cmd: &Document) -> CmdResult<FindPlan> {
        // Booleans of the find command are strict, as MongoDB's IDL parses them.
        for field in [
            "singleBatch",
            "showRecordId",
            "returnKey",
            "tailable",
            "awaitData",
        ] {
            strict_bool(cmd, "find", field)?;
        }
        if strict_bool(cmd, "find", "awaitData")? && !strict_bool(cmd, "find", "tailable")? {
            return Err(CommandError::new(
                9,
                "FailedToParse",
                "Cannot set 'awaitData' without also setting 'tailable'",
            ));
        }
        // `tailable` (`tailable.rs`) is routed before this parse.
        for unsupported in ["min", "max", "returnKey", "showRecordId", "tailable"] {
            if cmd
                .get(unsupported)
                .is_some_and(|v| !matches!(v, Bson::Boolean(false) | Bson::Null))
            {
                return Err(CommandError::not_supported(format!(
                    "find option '{unsupported}' is not supported by duetdb"
                )));
            }
        }
        let filter = args::opt_doc(cmd, "filter")?.cloned().unwrap_or_default();
        let mut sort = args::opt_doc(cmd, "sort")?
            .cloned()
            .filter(|s| !s.is_empty());
        let mut hint = cmd
            .get("hint")
            .cloned()
            .filter(|h| !matches!(h, Bson::Null));
        // `sort: {$natural: ±1}` is the collection scan in (reverse)
        // insertion order: the `$natural` hint, no sort.
        if let Some(natural) = sort
            .as_ref()
            .filter(|s| s.len() == 1)
            .and_then(|s| s.get("$natural"))
            .cloned()
        {
            sort = None;
            hint = Some(Bson::Document(doc! {"$natural": natural}));
        }
        Ok(FindPlan {
            // The command's `let` variables, bound around the filter's `$expr`s.
            filter: duetdb::lang::Filter::bind_let(&filter, args::opt_doc(cmd, "let")?)?,
            options: FindOptions {
                sort,
                projection: None,
                skip: args::opt_count(cmd, "skip")?.unwrap_or(0),
                limit: args::opt_count(cmd, "limit")?.unwrap_or(0),
                hint,
                collation: super::source::collation_of(cmd)?,
                let_vars: args::opt_doc(cmd, "let")?.cloned(),
            },
            projection: args::opt_doc(cmd, "projection")?.cloned(),
        })
    }

    /// The find's projection (an empty one is none), with the find's filter
    /// (a positional `a.$` matches it) and `let` variables.
    pub(crate) fn parsed_projection(&self) -> CmdResult<Option<Projection>> {
        Ok(self
            .projection
            .as_ref()
            .filter(|p| !p.is_empty())
            .map(|p| Projection::parse_find(p, Some(&self.filter), self.options.let_vars.as_ref()))
            .transpose()?)
    }
}

/// A boolean field of command `cmd_name` (absent: false); any other type —
/// numbers, null — is 14, as MongoDB's IDL answers.
fn strict_bool(cmd: &Document, cmd_name: &str, field: &str) -> CmdResult<bool> {
    match cmd.get(field) {
        None => Ok(false),
        Some(Bson::Boolean(b)) => Ok(*b),
        Some(other) => Err(CommandError::type_mismatch(format!(
            "BSON field '{cmd_name}.{field}' is the wrong type '{}', expected type 'bool'",
            duetdb::raw::type_name(other)
        ))),
    }
}

/// First-batch size: `batchSize` when given (0 allowed), else 101.
fn first_batch_size(cmd: &Document) -> CmdResult<usize> {
    Ok(args::opt_count(cmd, "batchSize")?
        .map(|n| n.min(usize::MAX as u64) as usize)
        .unwrap_or(DEFAULT_FIRST_BATCH))
}

/// When a cursor whose first batch is full but which has nothing more stays
/// open (MongoDB's `!exec->isEOF()`: a full batch is returned without
/// looking past its last document, so the cursor lives until a `getMore`
/// finds nothing), or closes at once.
#[derive(Clone, Copy, PartialEq, Eq)]
enum AtEnd {
    /// Open while the batch was full: a streamed find, an aggregate.
    KeepWhenFull,
    /// Closed as soon as exhausted: a find whose limit was reached or whose
    /// sort ran in memory (the stage knows it has returned everything).
    Close,
}

/// Build a cursor reply from the first batch; registers the cursor when more
/// may remain (see [`AtEnd`]).
fn cursor_reply(
    ctx: &Ctx<'_>,
    mut cursor: Cursor,
    (first, at_end): (usize, AtEnd),
    single_batch: bool,
    at: Option<Timestamp>,
) -> CmdResult {
    let ns = cursor.ns.clone();
    // Only a find's stream can fail here (aggregates hand over finished
    // documents): its errors are the executor's, as MongoDB words them.
    let batch = cursor
        .next_batch(first)
        .map_err(|e| e.caused_by("Executor error during find command"))?;
    let full = batch.len() == first && at_end == AtEnd::KeepWhenFull;
    let id = if single_batch || (cursor.is_exhausted() && !full) {
        0
    } else {
        let owner = ctx.cursor_owner();
        ctx.state.cursors.open(cursor, owner)?
    };
    let mut c = doc! {"firstBatch": batch, "id": id, "ns": ns};
    if let Some(ts) = at {
        c.insert("atClusterTime", ts);
    }
    Ok(doc! {"cursor": c, "ok": 1.0})
}

pub fn find(ctx: &Ctx<'_>, cmd: &Document, target: &mut Target<'_>) -> CmdResult {
    let coll = args::collection_name(cmd, "find")?;
    OpCounters::bump(&ctx.state.ops.query, 1);
    if strict_bool(cmd, "find", "tailable")? {
        return super::tailable::find(ctx, cmd, coll, target);
    }
    if let Some(reply) = point_find(ctx, cmd, coll, target)? {
        return Ok(reply);
    }
    let plan = FindPlan::from_find(cmd)?;
    let first = first_batch_size(cmd)?;
    let single_batch = strict_bool(cmd, "find", "singleBatch")?;
    if plan.filter.contains_key("$text") {
        return text_find(ctx, cmd, coll, target, plan, (first, single_batch));
    }
    let projection = plan.parsed_projection()?;
    let limits = read_limits(ctx, cmd)?;
    let source = read_source(ctx, cmd, coll, target)?;
    // The projection's expressions, `$elemMatch` and `a.$` compare under
    // the find's collation.
    let projection = match projection {
        Some(p) => Some(p.with_collation(source.collator()?)),
        None => None,
    };
    let stream = source.find_stream(&plan, &limits)?;
    let o = &plan.options;
    let sorted_in_memory =
        o.sort.is_some() && !duetdb::FindStream::scan(&stream).plan.provides_sort;
    let limit_reached = o.limit > 0 && o.limit <= first as u64;
    let at_end = if sorted_in_memory || limit_reached {
        AtEnd::Close
    } else {
        AtEnd::KeepWhenFull
    };
    // The stream holds the collection version it reads; keeping the whole
    // snapshot as well would pin every other collection.
    let cursor = Cursor::new(
        ctx.ns(coll),
        ctx.conn.id,
        None,
        Box::new(FindSource::new(stream, projection)),
    );
    cursor_reply(ctx, cursor, (first, at_end), single_batch, source.at())
}

/// The cursor of a find by one `_id` answered from the stored document's
/// bytes: `{firstBatch: [doc], id: 0, ns}` once written (`connection.rs`),
/// the document sent as stored, never decoded.
#[derive(Debug)]
pub struct RawCursor {
    pub ns: String,
    /// The document found (`None`: an empty batch).
    pub doc: Option<DocRef>,
}

/// Where [`point_find`] leaves its [`RawCursor`] (`Ctx::raw_cursor`).
pub type RawCursorSlot = std::cell::RefCell<Option<RawCursor>>;

/// A find that is one `_id` lookup in the latest published state, answered
/// without planning and without a `Document` for its result: the stored
/// document goes into `ctx.raw_cursor` and the reply returned is `{ok: 1}`,
/// the cursor to be written before it. The same answer the planned find
/// gives (its IDHACK plan reads the same `_id` index entry, and a batch of
/// at most one document that is not full closes the cursor: id 0), the
/// same reads noted (`currentOp`) and counted (`$indexStats`). `None` for
/// anything else — any field that could change the answer or fail
/// (projection, skip, a `batchSize` under 2, a read concern other than
/// `local`/`available`, a named snapshot, a collation, an `_id` that is not
/// an integer, string or ObjectId) — which the planned path then answers,
/// errors included.
fn point_find(
    ctx: &Ctx<'_>,
    cmd: &Document,
    coll: &str,
    target: &mut Target<'_>,
) -> CmdResult<Option<Document>> {
    let Some(slot) = ctx.raw_cursor else {
        return Ok(None);
    };
    if !matches!(target, Target::Live) || ctx.snapshot_name().is_some() {
        return Ok(None);
    }
    let Some(id) = plain_point(cmd) else {
        return Ok(None);
    };
    let source = read_source(ctx, cmd, coll, target)?;
    let super::source::ReadSource::Held {
        coll: held,
        at: None,
        ..
    } = &source
    else {
        return Ok(None);
    };
    // The planned read checks its token before its first document.
    ctx.cancel.check()?;
    let Some(doc) = held.point_read(id) else {
        return Ok(None);
    };
    *slot.borrow_mut() = Some(RawCursor {
        ns: ctx.ns(coll),
        doc,
    });
    Ok(Some(doc! {"ok": 1.0}))
}

/// The `_id` of a find [`point_find`] may answer: a filter `{_id: v}`, and
/// only fields that cannot change a one-document answer, with values that
/// cannot fail.
fn plain_point(cmd: &Document) -> Option<&Bson> {
    let filter = match cmd.get("filter") {
        Some(Bson::Document(f)) if f.len() == 1 => f,
        _ => return None,
    };
    let id = filter.get("_id")?;
    let whole = |v: &Bson, min: i64| match v {
        Bson::Int32(n) => i64::from(*n) >= min,
        Bson::Int64(n) => *n >= min,
        _ => false,
    };
    let plain = cmd.iter().all(|(k, v)| match k.as_str() {
        "find"
        | "filter"
        | "comment"
        | "maxTimeMS"
        | "lsid"
        | "$db"
        | "$clusterTime"
        | "$readPreference"
        | "apiVersion"
        | "apiStrict"
        | "apiDeprecationErrors" => true,
        "limit" => whole(v, 0),
        // A full first batch would leave the cursor open.
        "batchSize" => whole(v, 2),
        "singleBatch" => matches!(v, Bson::Boolean(_)),
        "readConcern" => match v {
            Bson::Document(rc) => rc.iter().all(|(k, v)| {
                k == "level" && matches!(v, Bson::String(l) if l == "local" || l == "available")
            }),
            _ => false,
        },
        _ => false,
    });
    plain.then_some(id)
}

/// A find with `$text` (text indexes, `{$meta: "textScore"}`): run by the
/// engine's text search on the command's source (the latest state, a named
/// snapshot, `atClusterTime`, the transaction's snapshot) under the read's
/// limits: the cursor pulls the matches from the held version as batches are
/// asked for, or reads a sort's output (bounded by the memory limit: spilled,
/// or 292 without disk use), as a find's.
fn text_find(
    ctx: &Ctx<'_>,
    cmd: &Document,
    coll: &str,
    target: &mut Target<'_>,
    plan: FindPlan,
    (first, single_batch): (usize, bool),
) -> CmdResult {
    if plan.options.hint.is_some() {
        // MongoDB: a $text query always uses the text index.
        return Err(CommandError::bad_value(
            "text and hint not allowed in same query",
        ));
    }
    let options = duetdb::TextFindOptions {
        projection: plan.projection.clone(),
        sort: plan.options.sort.clone(),
        skip: plan.options.skip,
        limit: plan.options.limit,
        let_vars: plan.options.let_vars.clone(),
    };
    let limits = read_limits(ctx, cmd)?;
    let source = read_source(ctx, cmd, coll, target)?;
    let stream = source.text_find(&plan.filter, options, &limits)?;
    let o = &plan.options;
    let at_end = if stream.ran_sort() || (o.limit > 0 && o.limit <= first as u64) {
        AtEnd::Close
    } else {
        AtEnd::KeepWhenFull
    };
    // The stream holds the collection version it reads.
    let cursor = Cursor::new(
        ctx.ns(coll),
        ctx.conn.id,
        None,
        Box::new(TextSource::new(stream)),
    );
    cursor_reply(ctx, cursor, (first, at_end), single_batch, source.at())
}

pub fn get_more(ctx: &Ctx<'_>, cmd: &Document) -> CmdResult {
    let id = match cmd.get("getMore") {
        Some(v @ (Bson::Int64(_) | Bson::Int32(_))) => args::as_i64("getMore", v)?,
        Some(other) => {
            return Err(CommandError::type_mismatch(format!(
                "getMore cursor id must be a long, not {:?}",
                other.element_type()
            )))
        }
        None => return Err(CommandError::bad_value("getMore requires a cursor id")),
    };
    let coll = args::req_str(cmd, "collection")?;
    OpCounters::bump(&ctx.state.ops.getmore, 1);
    let ns = ctx.ns(coll);
    let size = match args::opt_count(cmd, "batchSize")? {
        None | Some(0) => usize::MAX,
        Some(n) => n.min(usize::MAX as u64) as usize,
    };
    let who = ctx.cursor_owner();
    let mut lease = ctx.state.cursors.lease(id, &who, &ns)?;
    // An error drops the lease, which closes the cursor: it would recur.
    let cursor = lease.cursor()?;
    cursor.set_cancel(ctx.cancel.clone());
    if cursor.source_mut().as_change_stream().is_some() {
        let (batch, token) = super::changes::get_more(ctx, cmd, cursor, size)?;
        let out_id = lease.finish();
        return Ok(doc! {
            "cursor": {"nextBatch": batch, "postBatchResumeToken": token, "id": out_id, "ns": ns},
            "ok": 1.0,
        });
    }
    if cursor.source_mut().as_oplog().is_some() {
        let batch = super::oplog::get_more(ctx, cmd, cursor, size)?;
        let out_id = lease.finish();
        return Ok(doc! {"cursor": {"nextBatch": batch, "id": out_id, "ns": ns}, "ok": 1.0});
    }
    if cursor.source_mut().as_tailable().is_some() {
        let batch = super::tailable::get_more(ctx, cmd, id, cursor, size)?;
        let out_id = lease.finish();
        return Ok(doc! {"cursor": {"nextBatch": batch, "id": out_id, "ns": ns}, "ok": 1.0});
    }
    // MongoDB's rule: a getMore's maxTimeMS is the await time of a tailable
    // awaitData cursor (change streams, above); on any other it is refused.
    if cmd.contains_key("maxTimeMS") {
        return Err(CommandError::bad_value(
            "cannot set maxTimeMS on getMore command for a non-awaitData cursor",
        ));
    }
    let batch = cursor
        .next_batch(size)
        .map_err(|e| e.caused_by("Executor error during getMore"))?;
    let out_id = lease.finish();
    Ok(doc! {"cursor": {"nextBatch": batch, "id": out_id, "ns": ns}, "ok": 1.0})
}

/// `killCursors`: a cursor the caller does not own (another session or
/// connection, see `cursor.rs`) is reported in `cursorsNotFound`, exactly as
/// an id that does not exist, and lives on.
pub fn kill_cursors(ctx: &Ctx<'_>, cmd: &Document) -> CmdResult {
    let coll = args::collection_name(cmd, "killCursors")?;
    let ns = ctx.ns(coll);
    let ids = args::opt_array(cmd, "cursors")?
        .ok_or_else(|| CommandError::bad_value("killCursors requires 'cursors'"))?;
    let who = ctx.cursor_owner();
    let (mut killed, mut not_found) = (Vec::new(), Vec::new());
    for (i, v) in ids.iter().enumerate() {
        // Cursor ids are longs (an int32 is 14, as MongoDB's IDL answers).
        let Bson::Int64(id) = *v else {
            return Err(CommandError::type_mismatch(format!(
                "BSON field 'killCursors.cursors.{i}' is the wrong type '{}', expected type 'long'",
                duetdb::raw::type_name(v)
            )));
        };
        match ctx.state.cursors.kill(id, &who, &ns) {
            Killed::Killed => killed.push(Bson::Int64(id)),
            Killed::NotFound => not_found.push(Bson::Int64(id)),
        }
    }
    Ok(doc! {
        "cursorsKilled": killed,
        "cursorsNotFound": not_found,
        "cursorsAlive": [],
        "cursorsUnknown": [],
        "ok": 1.0,
    })
}

pub fn count(ctx: &Ctx<'_>, cmd: &Document, target: &mut Target<'_>) -> CmdResult {
    let coll = args::collection_name(cmd, "count")?;
    let query = args::opt_doc(cmd, "query")?.cloned().unwrap_or_default();
    let query = duetdb::lang::Filter::bind_let(&query, args::opt_doc(cmd, "let")?)?;
    let skip = args::opt_count(cmd, "skip")?.unwrap_or(0);
    // A negative limit means the same as its absolute value for count.
    let limit = args::opt_safe_i64(cmd, "limit")?
        .unwrap_or(0)
        .unsigned_abs();
    let work_ns = super::duet_work_ns(cmd)?;
    if work_ns.is_some() && !ctx.state.config.enable_test_knobs {
        return Err(CommandError::new(
            20,
            "IllegalOperation",
            "$duet.workNsPerDoc is a benchmark knob, disabled on this server \
             (start duet serve with --enable-test-knobs to allow it)",
        ));
    }
    let work_ns = work_ns.filter(|ns| *ns > 0);
    if query.contains_key("$text") {
        let mut n = read_source(ctx, cmd, coll, target)?.text_count(&query)?;
        n = n.saturating_sub(skip);
        if limit > 0 {
            n = n.min(limit);
        }
        return Ok(doc! {"n": n.min(i64::MAX as u64) as i64, "ok": 1.0});
    }
    let hint = cmd.get("hint").filter(|h| !matches!(h, Bson::Null));
    let limits = read_limits(ctx, cmd)?;
    let busy = |ns: u64| {
        let cancel = limits.cancel.clone();
        move |d: &DocRef| {
            std::hint::black_box(busy_work(d, ns, &cancel));
        }
    };
    let visit = work_ns.map(busy);
    let source = read_source(ctx, cmd, coll, target)?;
    let n = source.count(
        query,
        hint,
        visit.as_ref().map(|v| v as &dyn Fn(&DocRef)),
        &limits,
    )?;
    let mut n = n.saturating_sub(skip);
    if limit > 0 {
        n = n.min(limit);
    }
    Ok(doc! {"n": n.min(i64::MAX as u64) as i64, "ok": 1.0})
}

/// `$duet.workNsPerDoc`'s busy wait: `ns` nanoseconds spent on document `d`
/// (a stand-in for real per-document computation; the hash keeps the loop
/// from being optimised away). Returns at once when `cancel` is cancelled.
fn busy_work(d: &DocRef, ns: u64, cancel: &duetdb::CancelToken) -> u64 {
    let mut h = d.as_bytes().len() as u64;
    let t0 = std::time::Instant::now();
    let mut spins = 0u32;
    while t0.elapsed().as_nanos() < u128::from(ns) {
        h = h.wrapping_mul(31).wrapping_add(7);
        spins = spins.wrapping_add(1);
        if spins.is_multiple_of(64) && cancel.is_cancelled() {
            break;
        }
    }
    h
}

pub fn distinct(ctx: &Ctx<'_>, cmd: &Document, target: &mut Target<'_>) -> CmdResult {
    let coll = args::collection_name(cmd, "distinct")?;
    let key = args::req_str(cmd, "key")?;
    let query = args::opt_doc(cmd, "query")?.cloned().unwrap_or_default();
    let limits = read_limits(ctx, cmd)?;
    let source = read_source(ctx, cmd, coll, target)?;
    // A key and query that parse failed while running: the executor's
    // context, as MongoDB's distinct words it.
    let values = source.distinct(key, query.clone(), &limits).map_err(|e| {
        let parses =
            duetdb::lang::Distinct::new(key).is_ok() && duetdb::lang::Filter::parse(&query).is_ok();
        if parses {
            e.caused_by("Executor error during distinct command")
        } else {
            e
        }
    })?;
    let mut reply = doc! {"values": values};
    if let Some(ts) = source.at() {
        reply.insert("atClusterTime", ts);
    }
    reply.insert("ok", 1.0);
    Ok(reply)
}

/// Stages the engine runs.
const SUPPORTED_STAGES: &[&str] = &[
    "$match",
    "$project",
    "$addFields",
    "$set",
    "$unset",
    "$unwind",
    "$group",
    "$sort",
    "$limit",
    "$skip",
    "$count",
    "$lookup",
    "$graphLookup",
    "$unionWith",
    "$facet",
    "$replaceRoot",
    "$replaceWith",
    "$redact",
    "$sample",
    "$bucket",
    "$bucketAuto",
    "$sortByCount",
    "$setWindowFields",
    "$densify",
    "$fill",
    "$documents",
    "$geoNear",
    "$out",
    "$merge",
];

/// Stages MongoDB has that we do not execute yet (refused with 115, not 40324).
const KNOWN_UNSUPPORTED: &[&str] = &[
    "$collStats",
    "$indexStats",
    "$currentOp",
    "$listSessions",
    "$search",
];

/// The pipeline's stage documents, with MongoDB's codes for malformed stages,
/// unsupported and unknown stage names (the engine then parses the arguments).
fn pipeline_stages(pipeline: &[Bson]) -> CmdResult<Vec<Document>> {
    let mut out = Vec::with_capacity(pipeline.len());
    for stage in pipeline {
        let Bson::Document(stage) = stage else {
            return Err(CommandError::type_mismatch(
                "each pipeline stage must be a document",
            ));
        };
        if stage.len() != 1 {
            return Err(CommandError::new(
                40323,
                "Location40323",
                "A pipeline stage specification object must contain exactly one field.",
            ));
        }
        let name = stage.keys().next().map(String::as_str).unwrap_or_default();
        if name == "$planCacheStats" {
            return Err(CommandError::not_supported(
                "$planCacheStats is not supported by duetdb: it keeps no plan cache (every query is planned when it runs; use explain to see the plan)",
            ));
        }
        if !SUPPORTED_STAGES.contains(&name) {
            if KNOWN_UNSUPPORTED.contains(&name) {
                return Err(CommandError::not_supported(format!(
                    "aggregation stage {name} is not supported by duetdb yet (supported: {})",
                    SUPPORTED_STAGES.join(", ")
                )));
            }
            return Err(CommandError::new(
                40324,
                "Location40324",
                format!("Unrecognized pipeline stage name: '{name}'"),
            ));
        }
        out.push(stage.clone());
    }
    Ok(out)
}

pub(super) fn pipeline_of(cmd: &Document) -> CmdResult<Vec<Document>> {
    pipeline_stages(
        args::opt_array(cmd, "pipeline")?
            .ok_or_else(|| CommandError::bad_value("aggregate requires 'pipeline'"))?,
    )
}

pub fn aggregate(ctx: &Ctx<'_>, cmd: &Document, target: &mut Target<'_>) -> CmdResult {
    // $collStats, $indexStats, $currentOp: answered by the server (stats.rs).
    if let Some(reply) = super::stats::aggregate_stage(ctx, cmd, target.in_transaction())? {
        return Ok(reply);
    }
    if let Some(pipeline) = args::opt_array(cmd, "pipeline")? {
        if super::changes::is_change_stream(pipeline) {
            if target.in_transaction() {
                return Err(super::txn::not_in_transaction("$changeStream"));
            }
            let coll = match cmd.get("aggregate") {
                Some(Bson::String(s)) => {
                    Some(args::collection_name(cmd, "aggregate").map(|_| s.as_str())?)
                }
                _ => None,
            };
            return super::changes::aggregate(ctx, cmd, coll, pipeline);
        }
    }
    let let_vars = args::opt_doc(cmd, "let")?;
    let coll = match cmd.get("aggregate") {
        Some(Bson::String(s)) => s.as_str(),
        _ if target.in_transaction() => {
            return Err(super::txn::not_in_transaction("a database-level aggregate"))
        }
        _ => {
            let stages = pipeline_of(cmd)?;
            let documents = stages.first().is_some_and(|s| s.contains_key("$documents"));
            if !documents {
                return Err(CommandError::not_supported(
                    "database-level aggregation ({aggregate: 1}) is supported by duetdb only for pipelines that start with $documents",
                ));
            }
            let first =
                first_batch_size(args::opt_doc(cmd, "cursor")?.unwrap_or(&Document::new()))?;
            let limits = read_limits(ctx, cmd)?;
            let docs = with_output_database(ctx, &stages, |out| {
                ctx.database()?
                    .aggregate_collated(
                        stages.clone(),
                        &limits,
                        let_vars,
                        out,
                        super::source::collation_of(cmd)?.as_ref(),
                    )
                    .map_err(|e| executing_aggregate(e.into(), &stages, let_vars))
            })?;
            let cursor = Cursor::from_owned(ctx.ns("$cmd.aggregate"), ctx.conn.id, docs);
            return cursor_reply(ctx, cursor, (first, AtEnd::KeepWhenFull), false, None);
        }
    };
    let stages = pipeline_of(cmd)?;
    if args::flag(cmd, "explain")? {
        let source = read_source(ctx, cmd, coll, target)?;
        return super::explain::aggregate_explain_flag(ctx, cmd, coll, &source, stages);
    }
    let cursor_opts = args::opt_doc(cmd, "cursor")?.ok_or_else(|| {
        CommandError::new(
            9,
            "FailedToParse",
            "The 'cursor' option is required, except for aggregate with the explain argument",
        )
    })?;
    let first = first_batch_size(cursor_opts)?;
    // A `$text` first stage reads the text index, then runs the other
    // stages on its matches (`api::text`), on the same sources.
    let text_first = stages
        .first()
        .and_then(|s| s.get_document("$match").ok())
        .is_some_and(|m| m.contains_key("$text"));
    let limits = read_limits(ctx, cmd)?;
    // `$out`/`$merge` write: they read the latest state (one root, as the
    // default held snapshot would) and publish their output as one writer
    // command; a named snapshot or a read concern still goes to the held
    // source, which refuses to write.
    let writes = stages
        .last()
        .is_some_and(|s| s.contains_key("$out") || s.contains_key("$merge"));
    let held_on_purpose = args::opt_doc(cmd, "$duet")?
        .is_some_and(|d| d.contains_key("snapshotName"))
        || cmd.contains_key("readConcern")
            && !matches!(super::read_concern(cmd)?, super::ReadConcern::Default);
    if writes && !target.in_transaction() && !held_on_purpose {
        let strategy = super::duet_strategy(cmd)?.unwrap_or(duetdb::Strategy::Cow);
        with_output_database(ctx, &stages, |out| {
            let c = ctx.database()?.collection(coll);
            let written = if text_first {
                c.text_aggregate(&stages, &limits, let_vars, out).map(drop)
            } else {
                c.aggregate_into(stages.clone(), strategy, &limits, let_vars, out)
                    .map(drop)
            };
            written.map_err(|e| executing_aggregate(e.into(), &stages, let_vars))
        })?;
        let cursor = Cursor::from_owned(ctx.ns(coll), ctx.conn.id, Vec::new());
        return cursor_reply(ctx, cursor, (first, AtEnd::KeepWhenFull), false, None);
    }
    let source = read_source(ctx, cmd, coll, target)?;
    let run = if text_first {
        source.text_aggregate(&stages, &limits, let_vars)
    } else {
        source.aggregate(stages, &limits, let_vars)
    };
    // The stages moved into the run: a failure reads them again from the
    // command (the error path only).
    let docs = run.map_err(|e| match pipeline_of(cmd) {
        Ok(stages) => executing_aggregate(e, &stages, let_vars),
        Err(_) => e,
    })?;
    let cursor = Cursor::from_owned(ctx.ns(coll), ctx.conn.id, docs);
    cursor_reply(
        ctx,
        cursor,
        (first, AtEnd::KeepWhenFull),
        false,
        source.at(),
    )
}

/// An aggregate's error with MongoDB's executor context when its pipeline
/// parsed (the error came from running it), as MongoDB words those.
fn executing_aggregate(
    e: CommandError,
    stages: &[Document],
    let_vars: Option<&Document>,
) -> CommandError {
    if duetdb::pipeline_parses(stages, let_vars) {
        e.caused_by("PlanExecutor error during aggregation")
    } else {
        e
    }
}

/// Run `f` with the database a final `$out`/`$merge` of `stages` names
/// when it is not the command's own (MongoDB writes across databases):
/// opened, created if missing, and forgotten again if the run failed
/// before creating anything in it.
fn with_output_database<T>(
    ctx: &Ctx<'_>,
    stages: &[Document],
    f: impl FnOnce(Option<&duetdb::Database>) -> CmdResult<T>,
) -> CmdResult<T> {
    let Some(name) = duetdb::output_database(stages).filter(|d| d != snapdb::base(ctx.db)) else {
        return f(None);
    };
    if snapdb::split(&name)?.is_some() {
        return Err(CommandError::new(
            73,
            "InvalidNamespace",
            format!("cannot write into '{name}': a named snapshot is read-only"),
        ));
    }
    let (db, created) = ctx.database_created_named(&name)?;
    let r = f(Some(&db));
    drop(db);
    if created {
        ctx.state.engine.discard_if_unused(&name);
    }
    r
}

/// `explain` (never in a transaction): see `explain.rs`.
pub fn explain(ctx: &Ctx<'_>, cmd: &Document) -> CmdResult {
    super::explain::explain(ctx, cmd)
}
