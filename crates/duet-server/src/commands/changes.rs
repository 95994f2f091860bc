//! Change streams: `aggregate` with a leading `$changeStream` stage on a
//! collection, a database (`{aggregate: 1}`) or the whole server
//! (`allChangesForCluster: true` on `admin`), and their `getMore`s.
//!
//! Events come from the engine (`Engine::read_changes`: the in-memory change
//! tail, or each database's WAL) and are shaped as MongoDB's: `_id` (the
//! resume token), `operationType`, `clusterTime`, `wallTime`, `ns`,
//! `documentKey`, `fullDocument`, `updateDescription`, `to`, `lsid`/
//! `txnNumber` for transactions, `operationDescription` for the expanded
//! events (`showExpandedEvents`: `create`, `createIndexes`, `dropIndexes`,
//! `modify`), `fullDocumentBeforeChange` (the pre-image the writer recorded
//! for collections with `changeStreamPreAndPostImages`).
//! A collection stream is invalidated by its collection's drop or rename
//! (and its database's drop), a database stream by the database's drop: the
//! `invalidate` event comes last and the cursor closes.
//!
//! Resume tokens: `{_data: <hex>}` whose bytes are `0x82` (KeyString's
//! Timestamp type, as MongoDB's tokens start), the 8-byte big-endian
//! cluster time, then duet's own fields `0x64 0x01` (tag, version), the
//! event's index within its commit group (u32 big-endian) and a kind byte
//! (0 event, 1 high-water mark, 2 invalidate). Debezium and the Spark
//! connector read the first nine bytes as MongoDB's.
//!
//! Waiting: a `getMore` waits up to its `maxTimeMS` (MongoDB's await time
//! for tailable cursors; default 1 s) for new events, woken by the writers'
//! publish. It waits on its blocking thread, in slices of at most 100 ms so
//! a cancellation (killOp, shutdown, a closed connection) ends it quickly; at
//! most [`MAX_WAITING_GETMORES`] wait at once (the rest return an empty
//! batch at once), so waiting streams never take every blocking thread.
//!
//! Invariants:
//! - every reply batch, empty ones included, carries `postBatchResumeToken`:
//!   resuming from it yields exactly the events after the batch (filtered
//!   events included in what was scanned);
//! - positions never move backwards, and a stream never skips an event it
//!   did not deliver or filter (the engine reads only up to its stable time).

use std::collections::VecDeque;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use bson::{doc, Bson, Document, Timestamp};
use duetdb::lang::Pipeline;
use duetdb::raw::{array_element_len, document_len};
use duetdb::{ChangeEvent, ChangeKind, ChangePosition, ChangeScope, Engine};

use super::Ctx;
use crate::args;
use crate::cursor::{owned_document_bytes, Cursor, CursorSource, MAX_BATCH_BYTES};
use crate::error::{CmdResult, CommandError};

/// Most `getMore`s of change streams waiting for events at once.
pub const MAX_WAITING_GETMORES: usize = 256;
/// A change stream `getMore` without `maxTimeMS` waits this long (MongoDB's default).
pub const DEFAULT_AWAIT: Duration = Duration::from_millis(1000);

/// How long a `getMore` on a tailable cursor (oplog view, capped
/// collection) may wait for new entries: its `maxTimeMS` (refused, as
/// MongoDB, on a cursor without awaitData), else [`DEFAULT_AWAIT`] with
/// awaitData and no wait without.
pub fn tailable_await(cmd: &Document, await_data: bool) -> CmdResult<Duration> {
    Ok(match crate::args::opt_i64(cmd, "maxTimeMS")? {
        Some(_) if !await_data => {
            return Err(CommandError::bad_value(
                "cannot set maxTimeMS on getMore command for a non-awaitData cursor",
            ))
        }
        Some(ms) if ms > 0 => Duration::from_millis(ms as u64),
        Some(_) => Duration::ZERO,
        None if await_data => DEFAULT_AWAIT,
        None => Duration::ZERO,
    })
}

/// The wait of a `getMore` (change stream, oplog view, capped collection):
/// `read`s a batch and, while it is empty and not final, waits for the
/// writers' next publish (`Engine::wait_for_changes`, no polling) and reads
/// again, until `wait` has passed or the command is cancelled. `read`
/// returns the batch and whether the wait should end even when it is empty
/// (the cursor can return nothing more, or was killed). The wait runs in
/// slices of at most [`WAIT_SLICE`] so that a cancellation or a kill ends
/// it within one, and only while holding one of the [`MAX_WAITING_GETMORES`]
/// slots counted by `waiting` (each kind of cursor counts apart); with none
/// free the empty batch returns at once.
pub(super) fn await_batch(
    ctx: &Ctx<'_>,
    wait: Duration,
    waiting: &'static AtomicUsize,
    mut read: impl FnMut() -> CmdResult<(Vec<Bson>, bool)>,
) -> CmdResult<Vec<Bson>> {
    let engine = &ctx.state.engine;
    let deadline = Instant::now() + wait;
    let mut slot = None;
    loop {
        // Taken before reading: a publish after it ends the wait below.
        let seen = engine.change_seq();
        let (batch, finished) = read()?;
        let now = Instant::now();
        if !batch.is_empty() || finished || now >= deadline || ctx.cancel.is_cancelled() {
            return Ok(batch);
        }
        if slot.is_none() {
            slot = WaitSlot::take_from(waiting);
            if slot.is_none() {
                return Ok(batch);
            }
        }
        engine.wait_for_changes(seen, (deadline - now).min(WAIT_SLICE));
    }
}

/// Longest one wait slice (how quickly a cancellation or a kill ends a wait).
const WAIT_SLICE: Duration = Duration::from_millis(100);
/// Events read from the engine at a time.
const FETCH: usize = 256;

static WAITING: AtomicUsize = AtomicUsize::new(0);

const TOKEN_TAG: u8 = 0x64;
const TOKEN_VERSION: u8 = 1;
const KIND_EVENT: u8 = 0;
const KIND_HIGH_WATER: u8 = 1;
const KIND_INVALIDATE: u8 = 2;

/// A resume token for `pos` (of `kind`).
pub fn token(pos: ChangePosition, kind: u8) -> Document {
    let mut b = Vec::with_capacity(16);
    b.push(0x82);
    b.extend_from_slice(&pos.ts.to_be_bytes());
    b.push(TOKEN_TAG);
    b.push(TOKEN_VERSION);
    b.extend_from_slice(&pos.index.to_be_bytes());
    b.push(kind);
    let hex: String = b.iter().map(|x| format!("{x:02X}")).collect();
    doc! {"_data": hex}
}

fn position_token(pos: ChangePosition) -> Document {
    let kind = if pos.index == u32::MAX {
        KIND_HIGH_WATER
    } else {
        KIND_EVENT
    };
    token(pos, kind)
}

fn invalid_token(why: &str) -> CommandError {
    CommandError::new(
        260,
        "InvalidResumeToken",
        format!("invalid resume token: {why}"),
    )
}

/// The position and kind a resume token names.
pub fn parse_token(t: &Bson) -> CmdResult<(ChangePosition, u8)> {
    let Bson::Document(d) = t else {
        return Err(invalid_token("it must be a document"));
    };
    let hex = match d.get("_data") {
        Some(Bson::String(s)) => s,
        _ => return Err(invalid_token("no _data string")),
    };
    if hex.len() % 2 != 0 || !hex.is_ascii() {
        return Err(invalid_token("_data is not hex"));
    }
    let bytes: Option<Vec<u8>> = (0..hex.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&hex[i..i + 2], 16).ok())
        .collect();
    let b = bytes.ok_or_else(|| invalid_token("_data is not hex"))?;
    if b.len() != 16 || b[0] != 0x82 || b[9] != TOKEN_TAG || b[10] != TOKEN_VERSION {
        return Err(invalid_token("not a token issued by duetdb"));
    }
    let mut ts = [0u8; 8];
    ts.copy_from_slice(&b[1..9]);
    let mut idx = [0u8; 4];
    idx.copy_from_slice(&b[11..15]);
    let kind = b[15];
    if kind > KIND_INVALIDATE {
        return Err(invalid_token("unknown token kind"));
    }
    Ok((
        ChangePosition {
            ts: u64::from_be_bytes(ts),
            index: u32::from_be_bytes(idx),
        },
        kind,
    ))
}

pub fn timestamp(ts: u64) -> Timestamp {
    Timestamp {
        time: (ts >> 32) as u32,
        increment: ts as u32,
    }
}

pub fn packed(ts: Timestamp) -> u64 {
    (u64::from(ts.time) << 32) | u64::from(ts.increment)
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum FullDocument {
    Default,
    /// `updateLookup`: the document's *current* version when the event is
    /// read (null once deleted), as MongoDB's.
    Lookup,
    /// `whenAvailable`, `required`: the version the update wrote (the
    /// post-image is in the log, so it is always available).
    PostImage,
}

/// `fullDocumentBeforeChange`. A pre-image is available for a change made
/// while its collection had `changeStreamPreAndPostImages` enabled: the
/// writer recorded the old version in the change's WAL effect (so it lasts
/// exactly as long as the event itself, restarts included).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum BeforeChange {
    Off,
    /// The pre-image, or null when there is none.
    WhenAvailable,
    /// The pre-image; an update, replace or delete event without one fails
    /// the stream with NoMatchingDocument (47), as MongoDB's.
    Required,
}

/// What a stream delivers, parsed from its `$changeStream` stage and the rest.
struct Spec {
    scope: ChangeScope,
    full_document: FullDocument,
    before_change: BeforeChange,
    expanded: bool,
    pipeline: Vec<Step>,
}

/// Where a `$replaceRoot`/`$replaceWith` puts its evaluated `newRoot` (an
/// `$addFields` computes it; the step then makes it the document).
const NEW_ROOT_FIELD: &str = "__duet_newRoot";

/// One part of the pipeline after `$changeStream`.
enum Step {
    /// Stages the engine's pipeline runs.
    Run(Pipeline),
    /// `$replaceRoot`/`$replaceWith`: `{$addFields: {NEW_ROOT_FIELD: expr}}`.
    ReplaceRoot(Pipeline),
}

/// Run the steps on one event; `None` when a `$match` dropped it.
fn run_steps(steps: &[Step], d: Document) -> CmdResult<Option<Document>> {
    let mut cur = d;
    for step in steps {
        match step {
            Step::Run(p) => match p.run_on(vec![cur])?.into_iter().next() {
                Some(next) => cur = next,
                None => return Ok(None),
            },
            Step::ReplaceRoot(p) => {
                let mut out = p.run_on(vec![cur])?.into_iter().next().unwrap_or_default();
                cur = match out.remove(NEW_ROOT_FIELD) {
                    Some(Bson::Document(root)) => root,
                    other => {
                        let (shown, ty) = match &other {
                            None => ("MISSING".to_string(), "missing"),
                            Some(v) => (v.to_string(), duetdb::raw::type_name(v)),
                        };
                        return Err(CommandError::new(
                            40228,
                            "Location40228",
                            format!(
                                "'newRoot' expression must evaluate to an object, but resulting \
                                 value was: {shown}. Type of resulting value: '{ty}'."
                            ),
                        ));
                    }
                };
            }
        }
    }
    Ok(Some(cur))
}

/// The `$addFields` that evaluates a `$replaceRoot`/`$replaceWith` stage's
/// new root.
fn replace_root_step(name: &str, arg: &Bson) -> CmdResult<Step> {
    let expr = if name == "$replaceWith" {
        arg.clone()
    } else {
        let Bson::Document(d) = arg else {
            return Err(CommandError::new(
                40229,
                "Location40229",
                format!(
                    "expected an object as specification for $replaceRoot stage, got {}",
                    duetdb::raw::type_name(arg)
                ),
            ));
        };
        for k in d.keys() {
            if k != "newRoot" {
                return Err(CommandError::new(
                    40415,
                    "Location40415",
                    format!("BSON field '$replaceRoot.{k}' is an unknown field."),
                ));
            }
        }
        d.get("newRoot").cloned().ok_or_else(|| {
            CommandError::new(
                40231,
                "Location40231",
                "no newRoot specified for the $replaceRoot stage",
            )
        })?
    };
    let mut fields = Document::new();
    fields.insert(NEW_ROOT_FIELD, expr);
    Ok(Step::ReplaceRoot(Pipeline::parse(&[
        doc! {"$addFields": fields},
    ])?))
}

/// Stages MongoDB allows after `$changeStream`.
const ALLOWED_AFTER: &[&str] = &[
    "$match",
    "$project",
    "$addFields",
    "$set",
    "$unset",
    "$replaceRoot",
    "$replaceWith",
    "$redact",
];
/// Those the engine runs (`$replaceRoot`/`$replaceWith` through `$addFields`).
const RUN_AFTER: &[&str] = &[
    "$match",
    "$project",
    "$addFields",
    "$set",
    "$unset",
    "$replaceRoot",
    "$replaceWith",
    "$redact",
];

/// A change stream cursor's state: the scope and options, how far the
/// history was scanned, and events read but not yet returned.
pub struct ChangeStream {
    spec: Spec,
    /// Everything up to here was read (delivered, buffered or filtered).
    scanned: ChangePosition,
    buffered: VecDeque<(Document, ChangePosition)>,
    /// The position of the last event returned.
    returned: Option<ChangePosition>,
    /// The event that invalidates the stream was read: its position and wall time.
    invalidating: Option<(ChangePosition, i64)>,
    /// The invalidate event was returned: the cursor closes.
    finished: bool,
}

impl CursorSource for ChangeStream {
    fn next_doc(&mut self) -> CmdResult<Option<Document>> {
        Ok(None)
    }

    fn held_bytes(&self) -> usize {
        self.buffered
            .iter()
            .map(|(d, _)| owned_document_bytes(d))
            .sum()
    }

    fn as_change_stream(&mut self) -> Option<&mut ChangeStream> {
        Some(self)
    }
}

fn stage_name(stage: &Bson) -> CmdResult<(&str, &Document)> {
    let Bson::Document(d) = stage else {
        return Err(CommandError::type_mismatch(
            "each pipeline stage must be a document",
        ));
    };
    if d.len() != 1 {
        return Err(CommandError::new(
            40323,
            "Location40323",
            "A pipeline stage specification object must contain exactly one field.",
        ));
    }
    let (k, v) = d
        .iter()
        .next()
        .ok_or_else(|| CommandError::internal("empty stage"))?;
    let Bson::Document(body) = v else {
        return Err(CommandError::type_mismatch(format!(
            "the {k} stage takes a document"
        )));
    };
    Ok((k.as_str(), body))
}

/// Whether `pipeline` opens a change stream (its first stage is `$changeStream`).
pub fn is_change_stream(pipeline: &[Bson]) -> bool {
    matches!(pipeline.first(), Some(Bson::Document(d)) if d.contains_key("$changeStream"))
}

fn unknown_field(field: &str) -> CommandError {
    CommandError::new(
        40415,
        "Location40415",
        format!("BSON field '$changeStream.{field}' is an unknown field."),
    )
}

/// Parse the stream's spec and its start position.
fn parse(
    ctx: &Ctx<'_>,
    coll: Option<&str>,
    pipeline: &[Bson],
) -> CmdResult<(Spec, ChangePosition)> {
    let engine = &ctx.state.engine;
    let (_, opts) = stage_name(&pipeline[0])?;
    let mut full_document = FullDocument::Default;
    let mut before_change = BeforeChange::Off;
    let mut expanded = false;
    let mut cluster = false;
    let mut start: Option<ChangePosition> = None;
    let mut starts = 0;
    for (k, v) in opts {
        match k.as_str() {
            "fullDocument" => {
                full_document = match v.as_str() {
                    Some("default") => FullDocument::Default,
                    Some("updateLookup") => FullDocument::Lookup,
                    Some("whenAvailable" | "required") => FullDocument::PostImage,
                    _ => {
                        return Err(CommandError::bad_value(format!(
                            "unrecognized value for fullDocument: {v}"
                        )))
                    }
                }
            }
            "fullDocumentBeforeChange" => {
                before_change = match v.as_str() {
                    Some("off") => BeforeChange::Off,
                    Some("whenAvailable") => BeforeChange::WhenAvailable,
                    Some("required") => BeforeChange::Required,
                    _ => {
                        return Err(CommandError::bad_value(format!(
                            "unrecognized value for fullDocumentBeforeChange: {v}"
                        )))
                    }
                }
            }
            "showExpandedEvents" => expanded = args::flag(opts, "showExpandedEvents")?,
            "allChangesForCluster" => cluster = args::flag(opts, "allChangesForCluster")?,
            "resumeAfter" => {
                starts += 1;
                let (pos, kind) = parse_token(v)?;
                if kind == KIND_INVALIDATE {
                    return Err(CommandError::new(
                        260,
                        "InvalidResumeToken",
                        "Attempting to resume a change stream using 'resumeAfter' is not allowed \
                         from an invalidate notification: use 'startAfter'",
                    ));
                }
                start = Some(pos);
            }
            "startAfter" => {
                starts += 1;
                start = Some(parse_token(v)?.0);
            }
            "startAtOperationTime" => {
                starts += 1;
                let Bson::Timestamp(ts) = v else {
                    return Err(CommandError::type_mismatch(
                        "startAtOperationTime must be a timestamp",
                    ));
                };
                start = Some(ChangePosition::at_time(packed(*ts)));
            }
            other => return Err(unknown_field(other)),
        }
    }
    if starts > 1 {
        return Err(CommandError::new(
            40674,
            "Location40674",
            "Only one type of resume option is allowed, but multiple were found.",
        ));
    }
    let scope = match (cluster, coll) {
        (true, None) if ctx.db == "admin" => ChangeScope::Cluster,
        (true, _) => {
            return Err(CommandError::bad_value(
                "A $changeStream with 'allChangesForCluster:true' may only be opened on the \
                 'admin' database, and with {aggregate: 1}",
            ))
        }
        (false, _) if matches!(ctx.db, "admin" | "local" | "config") => {
            return Err(CommandError::new(
                73,
                "InvalidNamespace",
                format!(
                    "$changeStream may not be opened on the internal {} database",
                    ctx.db
                ),
            ))
        }
        (false, None) => ChangeScope::Database(ctx.db.to_string()),
        (false, Some(c)) => ChangeScope::Collection {
            db: ctx.db.to_string(),
            coll: c.to_string(),
        },
    };
    let mut steps = Vec::new();
    let mut rest: Vec<Document> = Vec::new();
    for stage in &pipeline[1..] {
        // `$replaceWith` takes any expression, not only a document.
        let name = match stage {
            Bson::Document(d) if d.len() == 1 && d.contains_key("$replaceWith") => "$replaceWith",
            _ => stage_name(stage)?.0,
        };
        if name == "$changeStream" {
            return Err(CommandError::new(
                40602,
                "Location40602",
                "$changeStream is only valid as the first stage in a pipeline.",
            ));
        }
        if !ALLOWED_AFTER.contains(&name) {
            return Err(CommandError::new(
                20,
                "IllegalOperation",
                format!("{name} is not permitted in a $changeStream pipeline"),
            ));
        }
        if !RUN_AFTER.contains(&name) {
            return Err(CommandError::not_supported(format!(
                "{name} after $changeStream is not supported by duetdb yet (supported: {})",
                RUN_AFTER.join(", ")
            )));
        }
        let Bson::Document(d) = stage else {
            continue;
        };
        if let ("$replaceRoot" | "$replaceWith", Some(arg)) = (name, d.get(name)) {
            if !rest.is_empty() {
                steps.push(Step::Run(Pipeline::parse(&std::mem::take(&mut rest))?));
            }
            steps.push(replace_root_step(name, arg)?);
        } else {
            rest.push(d.clone());
        }
    }
    if !rest.is_empty() {
        steps.push(Step::Run(Pipeline::parse(&rest)?));
    }
    let pipeline = steps;
    // Without a start: from now, i.e. after every change already final.
    let now = engine.open_change_stream();
    let start = start.unwrap_or(now);
    engine.check_change_history(&scope, start)?;
    Ok((
        Spec {
            scope,
            full_document,
            before_change,
            expanded,
            pipeline,
        },
        start,
    ))
}

fn ns_doc(db: &str, coll: Option<&str>) -> Document {
    match coll {
        Some(c) => doc! {"db": db, "coll": c},
        None => doc! {"db": db},
    }
}

/// The event document, or `None` when this stream does not show the kind.
fn event_doc(engine: &Engine, spec: &Spec, e: &ChangeEvent) -> CmdResult<Option<Document>> {
    let mut d = doc! {
        "_id": token(e.pos, KIND_EVENT),
    };
    let db = &*e.db;
    let key = |doc: &duetdb::raw::DocRef| -> CmdResult<Document> {
        let id = duetdb::raw::id_of(doc)
            .map(|v| Bson::try_from(v).unwrap_or(Bson::Null))
            .unwrap_or(Bson::Null);
        Ok(doc! {"_id": id})
    };
    let full = |doc: &duetdb::raw::DocRef| -> CmdResult<Bson> {
        Ok(Bson::Document(duetdb::raw::to_document(doc)?))
    };
    let op = match &e.kind {
        ChangeKind::Insert { .. } => "insert",
        ChangeKind::Update { .. } => "update",
        ChangeKind::Replace { .. } => "replace",
        ChangeKind::Delete { .. } => "delete",
        ChangeKind::Drop { .. } => "drop",
        ChangeKind::Rename { .. } => "rename",
        ChangeKind::DropDatabase => "dropDatabase",
        ChangeKind::Create { .. } if spec.expanded => "create",
        ChangeKind::CreateIndex { .. } if spec.expanded => "createIndexes",
        ChangeKind::DropIndex { .. } if spec.expanded => "dropIndexes",
        ChangeKind::Modify { .. } if spec.expanded => "modify",
        _ => return Ok(None),
    };
    d.insert("operationType", op);
    d.insert("clusterTime", timestamp(e.pos.ts));
    d.insert("wallTime", bson::DateTime::from_millis(e.wall_ms));
    d.insert("ns", ns_doc(db, e.kind.coll()));
    match &e.kind {
        ChangeKind::Insert { doc, .. } | ChangeKind::Replace { doc, .. } => {
            d.insert("documentKey", key(doc)?);
            d.insert("fullDocument", full(doc)?);
        }
        ChangeKind::Update { doc, desc, .. } => {
            d.insert("documentKey", key(doc)?);
            d.insert("updateDescription", duetdb::raw::to_document(desc)?);
            match spec.full_document {
                FullDocument::Default => {}
                FullDocument::PostImage => {
                    d.insert("fullDocument", full(doc)?);
                }
                FullDocument::Lookup => {
                    let coll = e.kind.coll().unwrap_or_default();
                    let id = key(doc)?.get("_id").cloned().unwrap_or(Bson::Null);
                    let now = match engine.get(db)? {
                        Some(database) => database.collection(coll).get(&id)?,
                        None => None,
                    };
                    d.insert("fullDocument", now.as_ref().map_or(Ok(Bson::Null), full)?);
                }
            }
        }
        ChangeKind::Delete { id, .. } => {
            d.insert("documentKey", doc! {"_id": id.clone()});
        }
        ChangeKind::Rename { to, .. } => {
            d.insert("to", ns_doc(db, Some(to)));
        }
        ChangeKind::Create { .. } => {
            d.insert(
                "operationDescription",
                doc! {"idIndex": {"v": 2, "key": {"_id": 1}, "name": "_id_"}},
            );
        }
        ChangeKind::CreateIndex { spec, .. } => {
            d.insert("operationDescription", doc! {"indexes": [spec.clone()]});
        }
        ChangeKind::DropIndex { name, .. } => {
            d.insert(
                "operationDescription",
                doc! {"indexes": [{"name": name.clone()}]},
            );
        }
        ChangeKind::Modify { options, .. } => {
            // The collection's options after the change (MongoDB reports
            // the collMod's own fields; for the one option duetdb has,
            // the same document).
            d.insert("operationDescription", options.clone());
        }
        _ => {}
    }
    let changes_a_doc = matches!(
        e.kind,
        ChangeKind::Update { .. } | ChangeKind::Replace { .. } | ChangeKind::Delete { .. }
    );
    match (spec.before_change, &e.before) {
        (BeforeChange::Off, _) => {}
        _ if !changes_a_doc => {}
        (_, Some(pre)) => {
            d.insert("fullDocumentBeforeChange", full(pre)?);
        }
        (BeforeChange::WhenAvailable, None) => {
            d.insert("fullDocumentBeforeChange", Bson::Null);
        }
        (BeforeChange::Required, None) => {
            return Err(CommandError::new(
                47,
                "NoMatchingDocument",
                format!(
                    "Change stream was configured to require a pre-image for all update, \
                     delete and replace events, but the pre-image was not found for event: \
                     {{operationType: \"{op}\", ns: {{db: \"{db}\", coll: \"{}\"}}, \
                     documentKey: {}}} (pre-images are recorded only while the collection \
                     has changeStreamPreAndPostImages enabled)",
                    e.kind.coll().unwrap_or_default(),
                    d.get("documentKey")
                        .map(ToString::to_string)
                        .unwrap_or_default()
                ),
            ));
        }
    }
    if let Some(origin) = &e.txn {
        for (k, v) in duetdb::raw::to_document(origin)? {
            d.insert(k, v);
        }
    }
    Ok(Some(d))
}

/// Whether `e` ends a stream of `scope` (its invalidate follows).
fn invalidates(scope: &ChangeScope, e: &ChangeEvent) -> bool {
    match scope {
        ChangeScope::Cluster => false,
        ChangeScope::Database(_) => matches!(e.kind, ChangeKind::DropDatabase),
        ChangeScope::Collection { coll, .. } => match &e.kind {
            ChangeKind::Drop { coll: c } => c == coll,
            ChangeKind::Rename { from, .. } => from == coll,
            ChangeKind::DropDatabase => true,
            _ => false,
        },
    }
}

impl ChangeStream {
    fn invalidate_doc(pos: ChangePosition, wall_ms: i64) -> Document {
        doc! {
            "_id": token(pos, KIND_INVALIDATE),
            "operationType": "invalidate",
            "clusterTime": timestamp(pos.ts),
            "wallTime": bson::DateTime::from_millis(wall_ms),
        }
    }

    /// Read more events from the engine into the buffer; false when none came.
    fn fetch(&mut self, engine: &Engine, want: usize) -> CmdResult<bool> {
        let b = engine.read_changes(&self.spec.scope, self.scanned, want.clamp(1, FETCH))?;
        let mut any = false;
        for e in &b.events {
            let shown = match event_doc(engine, &self.spec, e)? {
                None => None,
                Some(d) if self.spec.pipeline.is_empty() => Some(d),
                Some(d) => {
                    let id = d.get("_id").cloned();
                    let out = run_steps(&self.spec.pipeline, d)?;
                    // MongoDB's rule: the token must come out unchanged, or
                    // the stream could not be resumed from this event.
                    if out.as_ref().is_some_and(|o| o.get("_id") != id.as_ref()) {
                        return Err(CommandError::new(
                            280,
                            "ChangeStreamFatalError",
                            "Encountered an event whose _id field, which contains the resume \
                             token, was modified by the pipeline. Modifying the _id field of an \
                             event makes it impossible to resume the stream from that point. Only \
                             transformations that retain the unmodified _id field are allowed.",
                        ));
                    }
                    out
                }
            };
            if let Some(d) = shown {
                self.buffered.push_back((d, e.pos));
                any = true;
            }
            self.scanned = e.pos;
            if invalidates(&self.spec.scope, e) {
                self.invalidating = Some((e.pos, e.wall_ms));
                return Ok(true);
            }
        }
        if b.position > self.scanned {
            self.scanned = b.position;
        }
        Ok(any || !b.events.is_empty())
    }

    /// The next batch of at most `max` events (16 MiB at most), without waiting.
    pub fn next_batch(&mut self, engine: &Engine, max: usize) -> CmdResult<Vec<Bson>> {
        let mut out = Vec::new();
        let mut bytes = 0usize;
        while out.len() < max && !self.finished {
            if let Some((d, pos)) = self.buffered.pop_front() {
                let elem = array_element_len(out.len(), &Bson::Null) + document_len(&d);
                if !out.is_empty() && bytes + elem > MAX_BATCH_BYTES {
                    self.buffered.push_front((d, pos));
                    break;
                }
                bytes += elem;
                out.push(Bson::Document(d));
                self.returned = Some(pos);
                continue;
            }
            if let Some((pos, wall)) = self.invalidating {
                out.push(Bson::Document(Self::invalidate_doc(pos, wall)));
                self.finished = true;
                break;
            }
            if !self.fetch(engine, max - out.len())? {
                break;
            }
        }
        Ok(out)
    }

    /// The token to resume after everything returned so far.
    pub fn post_batch_token(&self) -> Document {
        if self.finished {
            if let Some((pos, _)) = self.invalidating {
                return token(pos, KIND_INVALIDATE);
            }
        }
        match (self.buffered.is_empty(), self.returned) {
            (false, Some(pos)) => token(pos, KIND_EVENT),
            (false, None) => position_token(self.start_before_buffer()),
            (true, _) => match self.invalidating {
                // The invalidating event itself was returned (or filtered).
                Some((pos, _)) => token(pos, KIND_EVENT),
                None => position_token(self.scanned),
            },
        }
    }

    /// Where the buffer's first event is to be resumed from when nothing of
    /// it was returned: just before it.
    fn start_before_buffer(&self) -> ChangePosition {
        match self.buffered.front() {
            Some((_, p)) if p.index > 0 => ChangePosition {
                ts: p.ts,
                index: p.index - 1,
            },
            Some((_, p)) => ChangePosition::after_time(p.ts.saturating_sub(1)),
            None => self.scanned,
        }
    }

    pub fn is_finished(&self) -> bool {
        self.finished
    }
}

/// `aggregate` whose pipeline starts with `$changeStream`; `coll` is `None`
/// for `{aggregate: 1}`.
pub fn aggregate(
    ctx: &Ctx<'_>,
    cmd: &Document,
    coll: Option<&str>,
    pipeline: &[Bson],
) -> CmdResult {
    let cursor_opts = args::opt_doc(cmd, "cursor")?.ok_or_else(|| {
        CommandError::new(
            9,
            "FailedToParse",
            "The 'cursor' option is required, except for aggregate with the explain argument",
        )
    })?;
    let first = args::opt_count(cursor_opts, "batchSize")?
        .map(|n| n.min(usize::MAX as u64) as usize)
        .unwrap_or(crate::cursor::DEFAULT_FIRST_BATCH);
    let (spec, start) = parse(ctx, coll, pipeline)?;
    let mut stream = ChangeStream {
        spec,
        scanned: start,
        buffered: VecDeque::new(),
        returned: None,
        invalidating: None,
        finished: false,
    };
    let engine = &ctx.state.engine;
    let batch = if first == 0 {
        Vec::new()
    } else {
        stream.next_batch(engine, first)?
    };
    let pbrt = stream.post_batch_token();
    let ns = ctx.ns(coll.unwrap_or("$cmd.aggregate"));
    let id = if stream.is_finished() {
        0
    } else {
        let cursor = Cursor::new(ns.clone(), ctx.conn.id, None, Box::new(stream));
        ctx.state.cursors.open(cursor, ctx.cursor_owner())?
    };
    Ok(doc! {
        "cursor": {"firstBatch": batch, "postBatchResumeToken": pbrt, "id": id, "ns": ns},
        // Resuming at this time (drivers do, with `startAtOperationTime`,
        // when no token was seen) starts exactly where this stream started.
        "operationTime": timestamp(start.ts.saturating_add(1)),
        "ok": 1.0,
    })
}

/// Holds one of the [`MAX_WAITING_GETMORES`] wait slots counted by
/// `counter` (change streams and oplog cursors count apart).
struct WaitSlot(&'static AtomicUsize);

impl WaitSlot {
    fn take_from(counter: &'static AtomicUsize) -> Option<WaitSlot> {
        let mut n = counter.load(Ordering::Relaxed);
        loop {
            if n >= MAX_WAITING_GETMORES {
                return None;
            }
            match counter.compare_exchange_weak(n, n + 1, Ordering::AcqRel, Ordering::Relaxed) {
                Ok(_) => return Some(WaitSlot(counter)),
                Err(now) => n = now,
            }
        }
    }
}

impl Drop for WaitSlot {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

/// A `getMore` on a change stream cursor: the next events, waiting up to
/// the command's `maxTimeMS` (the await time) for some to arrive. Returns
/// the batch and whether the cursor is finished (invalidated).
pub fn get_more(
    ctx: &Ctx<'_>,
    cmd: &Document,
    cursor: &mut Cursor,
    size: usize,
) -> CmdResult<(Vec<Bson>, Document)> {
    let wait = match args::opt_i64(cmd, "maxTimeMS")? {
        Some(ms) if ms > 0 => Duration::from_millis(ms as u64),
        Some(_) => Duration::ZERO,
        None => DEFAULT_AWAIT,
    };
    let stream = cursor
        .source_mut()
        .as_change_stream()
        .ok_or_else(|| CommandError::internal("not a change stream cursor"))?;
    let engine = &ctx.state.engine;
    let batch = await_batch(ctx, wait, &WAITING, || {
        let batch = stream.next_batch(engine, size)?;
        Ok((batch, stream.is_finished()))
    })?;
    let token = stream.post_batch_token();
    if stream.is_finished() {
        cursor.mark_exhausted();
    }
    Ok((batch, token))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_round_trip_and_start_with_the_timestamp() {
        let pos = ChangePosition {
            ts: (1_700_000_000u64 << 32) | 6,
            index: 3,
        };
        let t = token(pos, KIND_EVENT);
        let hex = t.get_str("_data").expect("hex");
        assert!(hex.starts_with("82"));
        assert_eq!(&hex[2..18], format!("{:016X}", pos.ts));
        assert_eq!(
            parse_token(&Bson::Document(t)).expect("parse"),
            (pos, KIND_EVENT)
        );
        for bad in ["", "82", "zz", "8200000000000000006401000000000003"] {
            assert!(
                parse_token(&Bson::Document(doc! {"_data": bad})).is_err(),
                "{bad}"
            );
        }
    }
}
