//! Read commands: find, getMore, killCursors, count, distinct, aggregate,
//! explain.
//!
//! Every read runs on one engine snapshot (O(1) to take), so a command never
//! sees half of a concurrent write; a cursor keeps that snapshot for all its
//! batches. With `readConcern: {level: "snapshot"}` the snapshot comes from
//! the registry (see `snapshots.rs`) and its `atClusterTime` is returned.
//!
//! `count` alone honours the benchmark knob `$duet: {workNsPerDoc: N}`: it
//! then visits every matching document (on the strategy's scan, or on the
//! command's or named snapshot) and busy-waits N ns on each, so a query lasts
//! seconds while updates stream; the count it returns is unchanged.
//!
//! `aggregate` runs the engine's pipeline (`duetdb::lang::aggregate`): on the
//! command's snapshot (`cow`) by default, or on the live collection under the
//! strategy `$duet: {snapshot: ...}` names. Its result is materialized, so the
//! cursor holds documents, not the snapshot. Stage names are checked here first:
//! stages MongoDB has but duetdb does not run are refused with
//! CommandNotSupported (115), unknown names with 40324, malformed stage
//! documents with 40323, as MongoDB does.

use bson::{doc, Bson, Document, Timestamp};
use duetdb::lang::Projection;
use duetdb::{FindOptions, Snapshot};

use super::Ctx;
use crate::args;
use crate::cursor::{Cursor, DEFAULT_FIRST_BATCH};
use crate::error::{CmdResult, CommandError};
use crate::state::OpCounters;

/// A parsed find (from `find`, an `aggregate` pipeline, or `explain`).
#[derive(Default)]
pub(crate) struct FindPlan {
    pub(crate) filter: Document,
    pub(crate) options: FindOptions,
    pub(crate) projection: Option<Document>,
}

impl FindPlan {
    pub(crate) fn from_find(cmd: &Document) -> CmdResult<FindPlan> {
        if let Some(c) = args::opt_doc(cmd, "collation")? {
            if c.get_str("locale").ok() != Some("simple") {
                return Err(CommandError::not_supported(
                    "collations are not supported by duetdb",
                ));
            }
        }
        for unsupported in [
            "min",
            "max",
            "returnKey",
            "showRecordId",
            "tailable",
            "awaitData",
        ] {
            if cmd
                .get(unsupported)
                .is_some_and(|v| !matches!(v, Bson::Boolean(false) | Bson::Null))
            {
                return Err(CommandError::not_supported(format!(
                    "find option '{unsupported}' is not supported by duetdb"
                )));
            }
        }
        Ok(FindPlan {
            filter: args::opt_doc(cmd, "filter")?.cloned().unwrap_or_default(),
            options: FindOptions {
                sort: args::opt_doc(cmd, "sort")?
                    .cloned()
                    .filter(|s| !s.is_empty()),
                projection: None,
                skip: args::opt_count(cmd, "skip")?.unwrap_or(0),
                limit: args::opt_count(cmd, "limit")?.unwrap_or(0),
                hint: cmd
                    .get("hint")
                    .cloned()
                    .filter(|h| !matches!(h, Bson::Null)),
            },
            projection: args::opt_doc(cmd, "projection")?.cloned(),
        })
    }

    pub(crate) fn parsed_projection(&self) -> CmdResult<Option<Projection>> {
        Ok(self
            .projection
            .as_ref()
            .filter(|p| !p.is_empty())
            .map(Projection::parse)
            .transpose()?)
    }

    fn find(&self, snap: &Snapshot, coll: &str) -> duetdb::Find {
        snap.collection(coll)
            .find(self.filter.clone())
            .options(self.options.clone())
    }
}

/// First-batch size: `batchSize` when given (0 allowed), else 101.
pub(crate) fn first_batch_size(cmd: &Document) -> CmdResult<usize> {
    Ok(args::opt_count(cmd, "batchSize")?
        .map(|n| n.min(usize::MAX as u64) as usize)
        .unwrap_or(DEFAULT_FIRST_BATCH))
}

/// Build a cursor reply from the first batch; registers the cursor when more remains.
pub(crate) fn cursor_reply(
    ctx: &Ctx<'_>,
    mut cursor: Cursor,
    first: usize,
    single_batch: bool,
    at: Option<Timestamp>,
) -> CmdResult {
    let ns = cursor.ns.clone();
    let batch = cursor.next_batch(first)?;
    let id = if single_batch || cursor.is_exhausted() {
        0
    } else {
        ctx.state.cursors.open(cursor)?
    };
    let mut c = doc! {"firstBatch": batch, "id": id, "ns": ns};
    if let Some(ts) = at {
        c.insert("atClusterTime", ts);
    }
    Ok(doc! {"cursor": c, "ok": 1.0})
}

pub fn find(ctx: &Ctx<'_>, cmd: &Document) -> CmdResult {
    let coll = args::collection_name(cmd, "find")?;
    OpCounters::bump(&ctx.state.ops.query, 1);
    let plan = FindPlan::from_find(cmd)?;
    let projection = plan.parsed_projection()?;
    let first = first_batch_size(cmd)?;
    let single_batch = args::flag(cmd, "singleBatch")?;
    if let Some(strategy) = super::duet_strategy(cmd)? {
        // An explicit strategy reads the live collection under it; the result is
        // materialized, so the cursor holds no snapshot.
        if cmd
            .get_document("readConcern")
            .is_ok_and(|rc| rc.contains_key("atClusterTime"))
        {
            return Err(CommandError::bad_value(
                "$duet.snapshot cannot be combined with readConcern.atClusterTime",
            ));
        }
        let db = ctx.database()?;
        let docs = db
            .collection(coll)
            .find(plan.filter.clone())
            .options(plan.options.clone())
            .snapshot(strategy)
            .raw()?;
        let cursor = Cursor::from_docs(ctx.ns(coll), ctx.conn.id, None, docs, projection);
        return cursor_reply(ctx, cursor, first, single_batch, None);
    }
    let (snap, at) = ctx.read_snapshot(cmd)?;
    let docs = plan.find(&snap, coll).raw()?;
    let cursor = Cursor::from_docs(ctx.ns(coll), ctx.conn.id, Some(snap), docs, projection);
    cursor_reply(ctx, cursor, first, single_batch, at)
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
    let mut cursor = ctx
        .state
        .cursors
        .take(id)
        .ok_or_else(|| CommandError::cursor_not_found(id))?;
    if cursor.ns != ns {
        let owner_ns = cursor.ns.clone();
        ctx.state.cursors.put_back(id, cursor);
        return Err(CommandError::new(
            13,
            "Unauthorized",
            format!(
                "Requested getMore on namespace '{ns}', but cursor {id} belongs to '{owner_ns}'"
            ),
        ));
    }
    let size = match args::opt_count(cmd, "batchSize")? {
        None | Some(0) => usize::MAX,
        Some(n) => n.min(usize::MAX as u64) as usize,
    };
    let batch = match cursor.next_batch(size) {
        Ok(b) => b,
        Err(e) => {
            // The cursor is dropped: a projection error will recur.
            return Err(e);
        }
    };
    let out_id = if cursor.is_exhausted() {
        0
    } else {
        ctx.state.cursors.put_back(id, cursor);
        id
    };
    Ok(doc! {"cursor": {"nextBatch": batch, "id": out_id, "ns": ns}, "ok": 1.0})
}

pub fn kill_cursors(ctx: &Ctx<'_>, cmd: &Document) -> CmdResult {
    let coll = args::collection_name(cmd, "killCursors")?;
    let ns = ctx.ns(coll);
    let ids = args::opt_array(cmd, "cursors")?
        .ok_or_else(|| CommandError::bad_value("killCursors requires 'cursors'"))?;
    let (mut killed, mut not_found) = (Vec::new(), Vec::new());
    for v in ids {
        let id = args::as_i64("cursors", v)?;
        let same_ns = ctx.state.cursors.ns_of(id).is_some_and(|n| n == ns);
        if same_ns && ctx.state.cursors.kill(id) {
            killed.push(Bson::Int64(id));
        } else {
            not_found.push(Bson::Int64(id));
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

pub fn count(ctx: &Ctx<'_>, cmd: &Document) -> CmdResult {
    let coll = args::collection_name(cmd, "count")?;
    let query = args::opt_doc(cmd, "query")?.cloned().unwrap_or_default();
    let skip = args::opt_count(cmd, "skip")?.unwrap_or(0);
    // A negative limit means the same as its absolute value for count.
    let limit = args::opt_i64(cmd, "limit")?.unwrap_or(0).unsigned_abs();
    let work_ns = super::duet_work_ns(cmd)?.filter(|ns| *ns > 0);
    if let Some(strategy) = super::duet_strategy(cmd)? {
        let c = ctx.database()?.collection(coll);
        let n = match work_ns {
            None => c.count_with(query, strategy)?,
            Some(ns) => {
                // Visit every match (no O(1) size shortcut); under `olcp` the
                // scan is handed superseded versions, so each document still
                // counts exactly once.
                let (mut n, mut h) = (0u64, 0u64);
                c.scan_with(query, strategy, |d| {
                    n += 1;
                    h = h.wrapping_add(busy_work(d, ns));
                    std::ops::ControlFlow::Continue(())
                })?;
                std::hint::black_box(h);
                n
            }
        };
        let mut n = n.saturating_sub(skip);
        if limit > 0 {
            n = n.min(limit);
        }
        return Ok(doc! {"n": n.min(i64::MAX as u64) as i64, "ok": 1.0});
    }
    let (snap, _) = ctx.read_snapshot(cmd)?;
    let hint = cmd.get("hint").filter(|h| !matches!(h, Bson::Null));
    let n = match (hint, work_ns) {
        (None, None) => snap.collection(coll).count(query)?,
        (hint, work_ns) => {
            let mut find = snap.collection(coll).find(query);
            if let Some(h) = hint {
                find = find.hint(h.clone());
            }
            let docs = find.raw()?;
            if let Some(ns) = work_ns {
                let h = docs
                    .iter()
                    .fold(0u64, |h, d| h.wrapping_add(busy_work(d, ns)));
                std::hint::black_box(h);
            }
            docs.len() as u64
        }
    };
    let mut n = n.saturating_sub(skip);
    if limit > 0 {
        n = n.min(limit);
    }
    Ok(doc! {"n": n.min(i64::MAX as u64) as i64, "ok": 1.0})
}

/// `$duet.workNsPerDoc`'s busy wait: `ns` nanoseconds spent on document `d`
/// (a stand-in for real per-document computation; the hash keeps the loop
/// from being optimised away).
fn busy_work(d: &bson::RawDocumentBuf, ns: u64) -> u64 {
    let mut h = d.as_bytes().len() as u64;
    let t0 = std::time::Instant::now();
    while t0.elapsed().as_nanos() < u128::from(ns) {
        h = h.wrapping_mul(31).wrapping_add(7);
    }
    h
}

pub fn distinct(ctx: &Ctx<'_>, cmd: &Document) -> CmdResult {
    let coll = args::collection_name(cmd, "distinct")?;
    let key = args::req_str(cmd, "key")?;
    duetdb::raw::validate_path(key).map_err(CommandError::bad_value)?;
    let query = args::opt_doc(cmd, "query")?.cloned().unwrap_or_default();
    let (snap, at) = ctx.read_snapshot(cmd)?;
    let docs = snap.collection(coll).find(query).raw()?;
    let values = distinct_values(docs.iter().map(|d| d.as_ref().as_ref()), key)?;
    let mut reply = doc! {"values": values};
    if let Some(ts) = at {
        reply.insert("atClusterTime", ts);
    }
    reply.insert("ok", 1.0);
    Ok(reply)
}

/// The distinct values of `key` in `docs` (array elements counted singly),
/// in MongoDB's value order.
pub(crate) fn distinct_values<'a>(
    docs: impl Iterator<Item = &'a bson::RawDocument>,
    key: &str,
) -> CmdResult<Vec<Bson>> {
    let mut vals: Vec<bson::RawBsonRef<'a>> = Vec::new();
    for d in docs {
        for v in duetdb::raw::path_values(d, key) {
            match v {
                bson::RawBsonRef::Array(a) => vals.extend(a.into_iter().flatten()),
                other => vals.push(other),
            }
        }
    }
    vals.sort_by(|a, b| duetdb::raw::compare(*a, *b));
    vals.dedup_by(|a, b| duetdb::raw::equal(*a, *b));
    vals.into_iter()
        .map(|v| {
            Bson::try_from(bson::RawBson::from(v))
                .map_err(|e| CommandError::new(22, "InvalidBSON", e.to_string()))
        })
        .collect()
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
];

/// Stages MongoDB has that we do not execute yet (refused with 115, not 40324).
const KNOWN_UNSUPPORTED: &[&str] = &[
    "$lookup",
    "$facet",
    "$bucket",
    "$bucketAuto",
    "$sortByCount",
    "$replaceRoot",
    "$replaceWith",
    "$sample",
    "$out",
    "$merge",
    "$geoNear",
    "$graphLookup",
    "$redact",
    "$collStats",
    "$indexStats",
    "$densify",
    "$fill",
    "$setWindowFields",
    "$unionWith",
    "$documents",
    "$currentOp",
    "$listSessions",
    "$changeStream",
    "$planCacheStats",
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

pub(crate) fn pipeline_of(cmd: &Document) -> CmdResult<Vec<Document>> {
    pipeline_stages(
        args::opt_array(cmd, "pipeline")?
            .ok_or_else(|| CommandError::bad_value("aggregate requires 'pipeline'"))?,
    )
}

/// The explain document of an aggregate command (the engine's split, plan and
/// strategy; `queryPlanner` as drivers expect).
fn explain_aggregate(ctx: &Ctx<'_>, cmd: &Document, coll: &str) -> CmdResult<Document> {
    let stages = pipeline_of(cmd)?;
    if let Some(strategy) = super::duet_strategy(cmd)? {
        let mut e = ctx.database()?.collection(coll).explain_aggregate(stages)?;
        if strategy != duetdb::Strategy::Auto {
            e.insert("strategy", strategy.name());
        }
        return Ok(e);
    }
    let (snap, _) = ctx.read_snapshot(cmd)?;
    Ok(snap.collection(coll).explain_aggregate(stages)?)
}

pub fn aggregate(ctx: &Ctx<'_>, cmd: &Document) -> CmdResult {
    let coll = match cmd.get("aggregate") {
        Some(Bson::String(s)) => s.as_str(),
        _ => {
            return Err(CommandError::not_supported(
                "database-level aggregation ({aggregate: 1}) is not supported by duetdb",
            ))
        }
    };
    if args::flag(cmd, "explain")? {
        let mut e = explain_aggregate(ctx, cmd, coll)?;
        e.insert("ok", 1.0);
        return Ok(e);
    }
    let stages = pipeline_of(cmd)?;
    let cursor_opts = args::opt_doc(cmd, "cursor")?.ok_or_else(|| {
        CommandError::new(
            9,
            "FailedToParse",
            "The 'cursor' option is required, except for aggregate with the explain argument",
        )
    })?;
    let first = first_batch_size(cursor_opts)?;
    if let Some(strategy) = super::duet_strategy(cmd)? {
        // An explicit strategy reads the live collection under it.
        if cmd
            .get_document("readConcern")
            .is_ok_and(|rc| rc.contains_key("atClusterTime"))
        {
            return Err(CommandError::bad_value(
                "$duet.snapshot cannot be combined with readConcern.atClusterTime",
            ));
        }
        let (docs, _) = ctx
            .database()?
            .collection(coll)
            .aggregate_with(stages, strategy)?;
        let cursor = Cursor::from_owned(ctx.ns(coll), ctx.conn.id, docs);
        return cursor_reply(ctx, cursor, first, false, None);
    }
    let (snap, at) = ctx.read_snapshot(cmd)?;
    let docs = snap.collection(coll).aggregate(stages)?;
    let cursor = Cursor::from_owned(ctx.ns(coll), ctx.conn.id, docs);
    cursor_reply(ctx, cursor, first, false, at)
}

pub fn explain(ctx: &Ctx<'_>, cmd: &Document) -> CmdResult {
    let inner = args::opt_doc(cmd, "explain")?
        .ok_or_else(|| CommandError::bad_value("explain requires a command document"))?;
    let name = super::command_name(inner).unwrap_or_default();
    let coll = args::collection_name(inner, name)?;
    let with_info = |mut e: Document| -> CmdResult {
        e.insert("command", inner.clone());
        e.insert(
            "serverInfo",
            doc! {"host": "localhost", "version": super::admin::COMPAT_VERSION},
        );
        e.insert("ok", 1.0);
        Ok(e)
    };
    if name == "aggregate" {
        return with_info(explain_aggregate(ctx, inner, coll)?);
    }
    let plan = match name {
        "find" => FindPlan::from_find(inner)?,
        "count" | "distinct" => FindPlan {
            filter: args::opt_doc(inner, "query")?.cloned().unwrap_or_default(),
            ..Default::default()
        },
        other => {
            return Err(CommandError::not_supported(format!(
                "explain of '{other}' is not supported by duetdb (find, count, distinct, aggregate)"
            )))
        }
    };
    let (snap, _) = ctx.read_snapshot(inner)?;
    with_info(plan.find(&snap, coll).explain()?)
}
