//! Read commands: find, getMore, killCursors, count, distinct, aggregate,
//! explain.
//!
//! Every read runs on one engine snapshot (O(1) to take), so a command never
//! sees half of a concurrent write; a cursor keeps that snapshot for all its
//! batches. With `readConcern: {level: "snapshot"}` the snapshot comes from
//! the registry (see `snapshots.rs`) and its `atClusterTime` is returned.
//!
//! `aggregate` is honest sugar over find: the engine has no pipeline yet, so
//! only pipelines of the shape `$match* → $sort? → $skip? → $limit? →
//! $project? → ($count | counting $group)?` are executed (a counting
//! `$group` has a constant `_id` and only `{$sum: <number>}` fields: what
//! drivers send for `count_documents`); every other stage or order is refused
//! with CommandNotSupported (115), unknown stage names with 40324.

use bson::{doc, Bson, Document, Timestamp};
use duetdb::query::Projection;
use duetdb::{FindOptions, Snapshot};

use super::Ctx;
use crate::args;
use crate::cursor::{Cursor, DEFAULT_FIRST_BATCH};
use crate::error::{CmdResult, CommandError};
use crate::state::OpCounters;

/// A parsed find (from `find`, an `aggregate` pipeline, or `explain`).
#[derive(Default)]
struct FindPlan {
    filter: Document,
    options: FindOptions,
    projection: Option<Document>,
    /// A terminal counting stage, for aggregate.
    terminal: Option<Terminal>,
}

impl FindPlan {
    fn from_find(cmd: &Document) -> CmdResult<FindPlan> {
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
            terminal: None,
        })
    }

    fn parsed_projection(&self) -> CmdResult<Option<Projection>> {
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
fn first_batch_size(cmd: &Document) -> CmdResult<usize> {
    Ok(args::opt_count(cmd, "batchSize")?
        .map(|n| n.min(usize::MAX as u64) as usize)
        .unwrap_or(DEFAULT_FIRST_BATCH))
}

/// Build a cursor reply from the first batch; registers the cursor when more remains.
fn cursor_reply(
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
    if let Some(strategy) = super::duet_strategy(cmd)? {
        let n = ctx
            .database()?
            .collection(coll)
            .count_with(query, strategy)?;
        let mut n = n.saturating_sub(skip);
        if limit > 0 {
            n = n.min(limit);
        }
        return Ok(doc! {"n": n.min(i64::MAX as u64) as i64, "ok": 1.0});
    }
    let (snap, _) = ctx.read_snapshot(cmd)?;
    let n = match cmd.get("hint").filter(|h| !matches!(h, Bson::Null)) {
        Some(h) => snap
            .collection(coll)
            .find(query)
            .hint(h.clone())
            .raw()?
            .len() as u64,
        None => snap.collection(coll).count(query)?,
    };
    let mut n = n.saturating_sub(skip);
    if limit > 0 {
        n = n.min(limit);
    }
    Ok(doc! {"n": n.min(i64::MAX as u64) as i64, "ok": 1.0})
}

pub fn distinct(ctx: &Ctx<'_>, cmd: &Document) -> CmdResult {
    let coll = args::collection_name(cmd, "distinct")?;
    let key = args::req_str(cmd, "key")?;
    duetdb::path::validate(key).map_err(CommandError::bad_value)?;
    let query = args::opt_doc(cmd, "query")?.cloned().unwrap_or_default();
    let (snap, at) = ctx.read_snapshot(cmd)?;
    let docs = snap.collection(coll).find(query).raw()?;
    let mut vals: Vec<bson::RawBsonRef<'_>> = Vec::new();
    for d in &docs {
        for v in duetdb::path::values(d, key) {
            match v {
                bson::RawBsonRef::Array(a) => vals.extend(a.into_iter().flatten()),
                other => vals.push(other),
            }
        }
    }
    vals.sort_by(|a, b| duetdb::value::compare(*a, *b));
    vals.dedup_by(|a, b| duetdb::value::equal(*a, *b));
    let values = vals
        .into_iter()
        .map(|v| {
            Bson::try_from(bson::RawBson::from(v))
                .map_err(|e| CommandError::new(22, "InvalidBSON", e.to_string()))
        })
        .collect::<CmdResult<Vec<Bson>>>()?;
    let mut reply = doc! {"values": values};
    if let Some(ts) = at {
        reply.insert("atClusterTime", ts);
    }
    reply.insert("ok", 1.0);
    Ok(reply)
}

/// A last stage that only counts its input.
enum Terminal {
    /// `{$count: "field"}`.
    Count(String),
    /// `{$group: {_id: <constant>, f: {$sum: <number>}, ...}}` (what drivers
    /// send for `count_documents`).
    GroupSum { id: Bson, sums: Vec<(String, Bson)> },
}

impl Terminal {
    /// The output for `n` input documents (none when `n` is 0, as MongoDB).
    fn output(&self, n: u64) -> Vec<Document> {
        if n == 0 {
            return vec![];
        }
        let int = |k: i64| -> Bson {
            let v = k.saturating_mul(n.min(i64::MAX as u64) as i64);
            match i32::try_from(v) {
                Ok(x) => Bson::Int32(x),
                Err(_) => Bson::Int64(v),
            }
        };
        match self {
            Terminal::Count(f) => vec![doc! {f.as_str(): int(1)}],
            Terminal::GroupSum { id, sums } => {
                let mut d = doc! {"_id": id.clone()};
                for (f, k) in sums {
                    let v = match k {
                        Bson::Int32(k) => int(i64::from(*k)),
                        Bson::Int64(k) => int(*k),
                        Bson::Double(k) => Bson::Double(k * n as f64),
                        _ => Bson::Null,
                    };
                    d.insert(f.clone(), v);
                }
                vec![d]
            }
        }
    }
}

/// Parse a `$group` that only sums constants under a constant `_id`.
fn group_sum(spec: &Document) -> CmdResult<Terminal> {
    let unsupported = || {
        CommandError::not_supported(
            "$group is supported only with a constant _id and {$sum: <number>} fields (a count); general grouping is not built yet",
        )
    };
    let id = spec.get("_id").cloned().ok_or_else(|| {
        CommandError::new(
            15955,
            "Location15955",
            "a group specification must include an _id",
        )
    })?;
    let constant = match &id {
        Bson::String(s) => !s.starts_with('$'),
        Bson::Document(_) | Bson::Array(_) => false,
        _ => true,
    };
    if !constant {
        return Err(unsupported());
    }
    let mut sums = Vec::new();
    for (f, v) in spec.iter().filter(|(f, _)| f.as_str() != "_id") {
        match v {
            Bson::Document(acc) if acc.len() == 1 => match acc.get("$sum") {
                Some(k @ (Bson::Int32(_) | Bson::Int64(_) | Bson::Double(_))) => {
                    sums.push((f.clone(), k.clone()))
                }
                _ => return Err(unsupported()),
            },
            _ => return Err(unsupported()),
        }
    }
    Ok(Terminal::GroupSum { id, sums })
}

/// Stages MongoDB has that we do not execute yet (refused with 115, not 40324).
const KNOWN_UNSUPPORTED: &[&str] = &[
    "$unwind",
    "$lookup",
    "$addFields",
    "$set",
    "$unset",
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

/// Translate a pipeline into a find: stages in the order
/// `$match* $sort? $skip? $limit? $project? $count?`.
fn pipeline_plan(pipeline: &[Bson]) -> CmdResult<FindPlan> {
    let order = [
        "$match", "$sort", "$skip", "$limit", "$project", "$count", "$group",
    ];
    let mut plan = FindPlan::default();
    let mut matches = Vec::new();
    let mut last: Option<usize> = None;
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
        let Some((name, arg)) = stage.iter().next() else {
            continue;
        };
        let Some(pos) = order.iter().position(|o| o == name) else {
            if KNOWN_UNSUPPORTED.contains(&name.as_str()) {
                return Err(CommandError::not_supported(format!(
                    "aggregation stage {name} is not supported by duetdb yet (supported: $match, $sort, $skip, $limit, $project, $count, counting $group)"
                )));
            }
            return Err(CommandError::new(
                40324,
                "Location40324",
                format!("Unrecognized pipeline stage name: '{name}'"),
            ));
        };
        let in_order = match last {
            None => true,
            Some(l) => (pos > l && l < 5) || (pos == 0 && l == 0),
        };
        if !in_order {
            return Err(CommandError::not_supported(format!(
                "this pipeline shape is not supported by duetdb yet: stages must appear in the order {} (each at most once, $match first)",
                order.join(", ")
            )));
        }
        last = Some(pos);
        let want_num = |v: &Bson| -> CmdResult<u64> {
            let n = args::as_i64(name, v)?;
            u64::try_from(n)
                .map_err(|_| CommandError::bad_value(format!("{name} must be non-negative")))
        };
        match (pos, arg) {
            (0, Bson::Document(d)) => matches.push(Bson::Document(d.clone())),
            (1, Bson::Document(d)) => plan.options.sort = Some(d.clone()),
            (2, v) => plan.options.skip = want_num(v)?,
            (3, v) => {
                let n = want_num(v)?;
                if n == 0 {
                    return Err(CommandError::bad_value("the limit must be positive"));
                }
                plan.options.limit = n;
            }
            (4, Bson::Document(d)) => plan.projection = Some(d.clone()),
            (5, Bson::String(s)) if !s.is_empty() && !s.starts_with('$') && !s.contains('.') => {
                plan.terminal = Some(Terminal::Count(s.clone()))
            }
            (6, Bson::Document(d)) => plan.terminal = Some(group_sum(d)?),
            (_, _) => {
                return Err(CommandError::type_mismatch(format!(
                    "the argument of {name} has the wrong type"
                )))
            }
        }
    }
    plan.filter = match matches.len() {
        0 => Document::new(),
        1 => match matches.pop() {
            Some(Bson::Document(d)) => d,
            _ => Document::new(),
        },
        _ => doc! {"$and": matches},
    };
    Ok(plan)
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
    let pipeline = args::opt_array(cmd, "pipeline")?
        .ok_or_else(|| CommandError::bad_value("aggregate requires 'pipeline'"))?;
    let plan = pipeline_plan(pipeline)?;
    let (snap, at) = ctx.read_snapshot(cmd)?;
    if args::flag(cmd, "explain")? {
        let mut e = plan.find(&snap, coll).explain()?;
        e.insert("ok", 1.0);
        return Ok(e);
    }
    let cursor_opts = args::opt_doc(cmd, "cursor")?.ok_or_else(|| {
        CommandError::new(
            9,
            "FailedToParse",
            "The 'cursor' option is required, except for aggregate with the explain argument",
        )
    })?;
    let first = first_batch_size(cursor_opts)?;
    let projection = plan.parsed_projection()?;
    let docs = plan.find(&snap, coll).raw()?;
    let cursor = match &plan.terminal {
        Some(t) => Cursor::from_owned(ctx.ns(coll), ctx.conn.id, t.output(docs.len() as u64)),
        None => Cursor::from_docs(ctx.ns(coll), ctx.conn.id, Some(snap), docs, projection),
    };
    cursor_reply(ctx, cursor, first, false, at)
}

pub fn explain(ctx: &Ctx<'_>, cmd: &Document) -> CmdResult {
    let inner = args::opt_doc(cmd, "explain")?
        .ok_or_else(|| CommandError::bad_value("explain requires a command document"))?;
    let name = super::command_name(inner).unwrap_or_default();
    let coll = args::collection_name(inner, name)?;
    let plan = match name {
        "find" => FindPlan::from_find(inner)?,
        "count" | "distinct" => FindPlan {
            filter: args::opt_doc(inner, "query")?.cloned().unwrap_or_default(),
            ..Default::default()
        },
        "aggregate" => pipeline_plan(
            args::opt_array(inner, "pipeline")?
                .ok_or_else(|| CommandError::bad_value("aggregate requires 'pipeline'"))?,
        )?,
        other => {
            return Err(CommandError::not_supported(format!(
                "explain of '{other}' is not supported by duetdb (find, count, distinct, aggregate)"
            )))
        }
    };
    let (snap, _) = ctx.read_snapshot(inner)?;
    let mut e = plan.find(&snap, coll).explain()?;
    e.insert("command", inner.clone());
    e.insert(
        "serverInfo",
        doc! {"host": "localhost", "version": super::admin::COMPAT_VERSION},
    );
    e.insert("ok", 1.0);
    Ok(e)
}
