//! `local.oplog.rs`: a read-only view of the change history as MongoDB's
//! oplog, for oplog tailers (Meteor), `mongodump --oplog` and
//! `mongorestore --oplogReplay` (with `applyOps`, below). `local.oplog.$main`
//! (the master/slave oplog name mongodump reads from a server that reports
//! no `hosts`, i.e. `--standalone`) is the same view.
//!
//! Entries come from the engine's change history (`Engine::read_changes`,
//! cluster scope), the same records change streams read. One committed
//! writer group is one entry with the group's cluster time as `ts`: its
//! only change as a plain entry (`op` i/u/d/c), or, when the group holds
//! several changes or is a transaction, one `c` entry
//! `{applyOps: [...]}` on `admin.$cmd` (with `lsid`/`txnNumber` for a
//! transaction) — a group commits atomically and an oplog `ts` is unique, as
//! MongoDB logs its batched writes. Entries carry `ts`, `t` (1), `h` (0),
//! `v` (2), `op`, `ns`, `o`, `o2`, `wall`; no `ui` (collections have no
//! UUID). Updates are MongoDB 5's `{$v: 2, diff: {...}}` built from the
//! recorded update description and the post-image; replacements log the
//! whole document. Changes of the `local` database are not in the oplog, as
//! in MongoDB.
//!
//! Reads: `find` (any filter, evaluated per entry; bounds on `ts` in the
//! filter seek), `$natural` (or `ts`) order ±1 by sort or hint, `skip`,
//! `limit`, projection, `tailable` + `awaitData` cursors whose `getMore`
//! waits up to its `maxTimeMS` (default 1 s) for new entries, woken by the
//! writers' publish (as change streams); `count`; `aggregate` (the first
//! `$match` seeks, the rest runs on the matching entries); any other sort
//! is a pipeline too. The view starts at the oldest retained change (the
//! change-retention flags, §13.4): a `find` from an older `ts` starts there,
//! as a scan of a capped collection; a tailable cursor whose position fell
//! out of the history fails with CappedPositionLost (136).
//!
//! Writes and DDL on the view are refused: InvalidNamespace (73) for
//! writes (as MongoDB's replica-set members), IllegalOperation (20) for
//! drop, rename, index changes; reads in a transaction are 263.
//!
//! Invariants:
//! - entries come in `ts` order (descending for `$natural: -1`), each group
//!   whole: a group is made an entry only once all its changes were read;
//! - a forward cursor never skips an entry: it reads up to the stable time
//!   only (as change streams), so a group still in flight is read later;
//! - what a non-tailable reverse scan, a sort or an aggregate materializes is
//!   bounded by [`MAX_MATERIALIZED_BYTES`] (ExceededMemoryLimit, 146).

use std::collections::VecDeque;
use std::sync::atomic::AtomicUsize;

use bson::{doc, Bson, Document, RawDocument, Timestamp};
use duetdb::lang::{Filter, Pipeline, Projection};
use duetdb::raw::{array_element_len, document_len};
use duetdb::{ChangeEvent, ChangeKind, ChangePosition, ChangeScope, Engine};

use super::changes::{packed, timestamp};
use super::Ctx;
use crate::args;
use crate::cursor::{owned_document_bytes, Cursor, CursorSource, MAX_BATCH_BYTES};
use crate::error::{CmdResult, CommandError};

/// The oplog's database.
pub const OPLOG_DB: &str = "local";
/// The names the view answers to in [`OPLOG_DB`].
pub const OPLOG_COLLECTIONS: &[&str] = &["oplog.rs", "oplog.$main"];
/// Most bytes of entries one reverse scan, sort or aggregate on the oplog
/// holds at once (ExceededMemoryLimit, 146, beyond).
pub const MAX_MATERIALIZED_BYTES: usize = 64 << 20;
/// MongoDB's limit of one oplog entry: a document plus 16 KiB.
const MAX_ENTRY_BYTES: usize = duetdb::raw::MAX_DOC_SIZE + 16 * 1024;
/// Changes read from the engine at a time.
const FETCH: usize = 1024;
/// The size `listCollections` reports for the capped oplog (MongoDB's
/// default maximum, 50 GB; the real bound is the change retention).
const REPORTED_SIZE: i64 = 50 << 30;

/// `getMore`s of tailable oplog cursors waiting at once (at most
/// [`super::changes::MAX_WAITING_GETMORES`], the change streams' limit, counted apart).
static WAITING: AtomicUsize = AtomicUsize::new(0);

/// Whether `db.coll` is the oplog view.
pub fn is_oplog(db: &str, coll: &str) -> bool {
    db == OPLOG_DB && OPLOG_COLLECTIONS.contains(&coll)
}

/// The reply of command `name` when it acts on the oplog view; `None` when
/// it does not (the ordinary handlers run).
pub fn route(ctx: &Ctx<'_>, name: &str, cmd: &Document, in_txn: bool) -> Option<CmdResult> {
    if name == "renameCollection" {
        let names_oplog = |f: &str| {
            cmd.get_str(f)
                .ok()
                .and_then(|ns| ns.split_once('.'))
                .is_some_and(|(d, c)| is_oplog(d, c))
        };
        return (names_oplog("renameCollection") || names_oplog("to"))
            .then(|| Err(illegal("cannot rename the oplog")));
    }
    if ctx.db != OPLOG_DB {
        return None;
    }
    let coll = match cmd.get(name) {
        Some(Bson::String(c)) if is_oplog(ctx.db, c) => c.as_str(),
        _ => return None,
    };
    if in_txn {
        return Some(Err(CommandError::new(
            263,
            "OperationNotSupportedInTransaction",
            "Cannot run command against the 'local' database in a transaction.",
        )));
    }
    Some(match name {
        "find" => find(ctx, cmd, coll),
        "count" => count(ctx, cmd),
        "aggregate" => aggregate(ctx, cmd, coll),
        "insert" | "update" | "delete" => refuse_write(cmd, name, coll),
        "findAndModify" | "findandmodify" => Err(cannot_write(coll)),
        "listIndexes" => Ok(doc! {
            "cursor": {"firstBatch": [], "id": 0_i64, "ns": format!("{OPLOG_DB}.{coll}")},
            "ok": 1.0,
        }),
        "create" => Err(CommandError::new(
            48,
            "NamespaceExists",
            format!("Collection {OPLOG_DB}.{coll} already exists."),
        )),
        "drop" => Err(illegal("can't drop live oplog while replicating")),
        "createIndexes" | "dropIndexes" | "deleteIndexes" | "collMod" => Err(illegal(format!(
            "{name} is not allowed on the oplog {OPLOG_DB}.{coll}"
        ))),
        "distinct" => Err(CommandError::not_supported(
            "distinct on the oplog view is not supported by duetdb (use aggregate)",
        )),
        _ => return None,
    })
}

fn illegal(m: impl Into<String>) -> CommandError {
    CommandError::new(20, "IllegalOperation", m)
}

fn cannot_write(coll: &str) -> CommandError {
    CommandError::new(
        73,
        "InvalidNamespace",
        format!("cannot write to '{OPLOG_DB}.{coll}'"),
    )
}

/// insert/update/delete: MongoDB reports the refusal as the first
/// statement's write error.
fn refuse_write(cmd: &Document, name: &str, coll: &str) -> CmdResult {
    let field = match name {
        "insert" => "documents",
        "update" => "updates",
        _ => "deletes",
    };
    if args::opt_array(cmd, field)?.is_none_or(|a| a.is_empty()) {
        return Err(cannot_write(coll));
    }
    let e = cannot_write(coll);
    Ok(doc! {
        "n": 0,
        "writeErrors": [{"index": 0, "code": e.code, "codeName": e.code_name, "errmsg": e.message}],
        "ok": 1.0,
    })
}

/// Lines `listCollections` on `local` adds for the view (when the filter
/// lets them through): `oplog.rs` as a capped collection.
pub fn list_collections_entry(name_only: bool) -> Document {
    if name_only {
        return doc! {"name": "oplog.rs", "type": "collection"};
    }
    doc! {
        "name": "oplog.rs",
        "type": "collection",
        "options": {"capped": true, "size": REPORTED_SIZE},
        "info": {"readOnly": true},
    }
}

// ---------------------------------------------------------------- entries

fn ns_of(db: &str, coll: &str) -> String {
    format!("{db}.{coll}")
}

fn id_doc(doc: &duetdb::raw::DocRef) -> Document {
    let id = duetdb::raw::id_of(doc)
        .map(|v| Bson::try_from(v).unwrap_or(Bson::Null))
        .unwrap_or(Bson::Null);
    doc! {"_id": id}
}

/// One change as an oplog operation `{op, ns, o, o2?}` (`None`: not logged).
fn op_of(e: &ChangeEvent) -> CmdResult<Option<Document>> {
    let db = &*e.db;
    let cmd_ns = format!("{db}.$cmd");
    Ok(Some(match &e.kind {
        ChangeKind::Insert { coll, doc } => doc! {
            "op": "i", "ns": ns_of(db, coll),
            "o": duetdb::raw::to_document(doc)?, "o2": id_doc(doc),
        },
        ChangeKind::Update { coll, doc, desc } => {
            let desc = duetdb::raw::to_document(desc)?;
            let o = match update_diff(doc, &desc) {
                Some(diff) => doc! {"$v": 2, "diff": diff},
                // Cannot happen for a description the engine computed from
                // this very post-image; the whole document is still exact.
                None => duetdb::raw::to_document(doc)?,
            };
            doc! {"op": "u", "ns": ns_of(db, coll), "o": o, "o2": id_doc(doc)}
        }
        ChangeKind::Replace { coll, doc } => doc! {
            "op": "u", "ns": ns_of(db, coll),
            "o": duetdb::raw::to_document(doc)?, "o2": id_doc(doc),
        },
        ChangeKind::Delete { coll, id } => {
            doc! {"op": "d", "ns": ns_of(db, coll), "o": {"_id": id.clone()}}
        }
        ChangeKind::Create { coll } => doc! {
            "op": "c", "ns": cmd_ns,
            "o": {"create": coll.clone(), "idIndex": {"v": 2, "key": {"_id": 1}, "name": "_id_"}},
        },
        ChangeKind::Drop { coll } => doc! {"op": "c", "ns": cmd_ns, "o": {"drop": coll.clone()}},
        ChangeKind::Rename { from, to } => doc! {
            "op": "c", "ns": cmd_ns,
            "o": {"renameCollection": ns_of(db, from), "to": ns_of(db, to), "stayTemp": false},
        },
        ChangeKind::CreateIndex { coll, spec } => {
            let mut o = doc! {"createIndexes": coll.clone()};
            for (k, v) in spec {
                if k == "unique" && v == &Bson::Boolean(false) {
                    continue;
                }
                o.insert(k.clone(), v.clone());
            }
            doc! {"op": "c", "ns": cmd_ns, "o": o}
        }
        ChangeKind::DropIndex { coll, name } => doc! {
            "op": "c", "ns": cmd_ns, "o": {"dropIndexes": coll.clone(), "index": name.clone()},
        },
        ChangeKind::DropDatabase => doc! {"op": "c", "ns": cmd_ns, "o": {"dropDatabase": 1}},
        // Kinds added later are not logged until they have a shape here.
        #[allow(unreachable_patterns)]
        _ => return Ok(None),
    }))
}

/// The oplog entry of one group (its changes, all of one time), or `None`
/// when none of them is logged.
fn entry_of(events: &[ChangeEvent]) -> CmdResult<Option<Document>> {
    let Some(first) = events.first() else {
        return Ok(None);
    };
    if &*first.db == OPLOG_DB {
        return Ok(None);
    }
    let mut ops = Vec::with_capacity(events.len());
    for e in events {
        if let Some(op) = op_of(e)? {
            ops.push(op);
        }
    }
    let origin = events.iter().find_map(|e| e.txn.as_ref());
    let mut entry = doc! {
        "ts": timestamp(first.pos.ts),
        "t": 1_i64,
        "h": 0_i64,
        "v": 2,
    };
    if ops.len() == 1 && origin.is_none() {
        let op = ops.pop().unwrap_or_default();
        for (k, v) in op {
            entry.insert(k, v);
        }
    } else if ops.is_empty() {
        return Ok(None);
    } else {
        entry.insert("op", "c");
        entry.insert("ns", "admin.$cmd");
        entry.insert(
            "o",
            doc! {"applyOps": ops.into_iter().map(Bson::Document).collect::<Vec<_>>()},
        );
        if let Some(origin) = origin {
            for (k, v) in duetdb::raw::to_document(origin)? {
                entry.insert(k, v);
            }
            entry.insert(
                "prevOpTime",
                doc! {"ts": Timestamp { time: 0, increment: 0 }, "t": -1_i64},
            );
        }
    }
    entry.insert("wall", bson::DateTime::from_millis(first.wall_ms));
    let len = document_len(&entry);
    if len > MAX_ENTRY_BYTES {
        return Err(CommandError::new(
            10334,
            "BSONObjectTooLarge",
            format!(
                "the oplog entry of the commit at {:?} would be {len} bytes, over the {MAX_ENTRY_BYTES} an oplog entry may have (duetdb logs one commit group as one entry)",
                timestamp(first.pos.ts)
            ),
        ));
    }
    Ok(Some(entry))
}

/// What an update description does at one path.
enum Leaf {
    Set(Bson),
    Unset,
    Truncate(i64),
}

/// MongoDB 5's `$v: 2` update diff from an update description
/// (`updatedFields` by dotted path, `removedFields`, `truncatedArrays`) and
/// the post-image, which tells arrays (`{a: true, u<i>, s<i>, l}`) from
/// subdocuments (`{u, d, s<field>}`) along each path. `None` when a path
/// does not lead through the post-image.
fn update_diff(post: &RawDocument, desc: &Document) -> Option<Document> {
    let mut diff = Document::new();
    let mut put = |path: &str, leaf: Leaf| -> Option<()> {
        let comps: Vec<&str> = path.split('.').collect();
        insert_leaf(
            &mut diff,
            Some(bson::RawBsonRef::Document(post)),
            &comps,
            leaf,
        )
    };
    if let Ok(arrays) = desc.get_array("truncatedArrays") {
        for t in arrays {
            let t = t.as_document()?;
            let size = match t.get("newSize")? {
                Bson::Int32(n) => i64::from(*n),
                Bson::Int64(n) => *n,
                _ => return None,
            };
            put(t.get_str("field").ok()?, Leaf::Truncate(size))?;
        }
    }
    if let Ok(fields) = desc.get_document("updatedFields") {
        for (path, v) in fields {
            put(path, Leaf::Set(v.clone()))?;
        }
    }
    if let Ok(removed) = desc.get_array("removedFields") {
        for p in removed {
            put(p.as_str()?, Leaf::Unset)?;
        }
    }
    Some(diff)
}

/// Put `leaf` at `comps` below the diff node `node` of the container `here`.
fn insert_leaf(
    node: &mut Document,
    here: Option<bson::RawBsonRef<'_>>,
    comps: &[&str],
    leaf: Leaf,
) -> Option<()> {
    let is_array = matches!(here, Some(bson::RawBsonRef::Array(_)));
    let child = |k: &str| -> Option<bson::RawBsonRef<'_>> {
        match here? {
            bson::RawBsonRef::Document(d) => d.get(k).ok()?,
            bson::RawBsonRef::Array(a) => a.get(k.parse::<usize>().ok()?).ok()?,
            _ => None,
        }
    };
    if let Leaf::Truncate(n) = leaf {
        if comps.is_empty() {
            node.insert("l", n);
            return Some(());
        }
    }
    let (first, rest) = comps.split_first()?;
    if rest.is_empty() && !matches!(leaf, Leaf::Truncate(_)) {
        let (section, key) = if is_array {
            (None, format!("u{first}"))
        } else {
            (
                Some(if matches!(leaf, Leaf::Unset) {
                    "d"
                } else {
                    "u"
                }),
                first.to_string(),
            )
        };
        let value = match leaf {
            Leaf::Set(v) => v,
            Leaf::Unset if is_array => Bson::Null,
            Leaf::Unset => Bson::Boolean(false),
            Leaf::Truncate(_) => return None,
        };
        match section {
            None => {
                node.insert(key, value);
            }
            Some(s) => {
                if !node.contains_key(s) {
                    node.insert(s, Document::new());
                }
                node.get_document_mut(s).ok()?.insert(key, value);
            }
        }
        return Some(());
    }
    let next = child(first)?;
    let key = format!("s{first}");
    if !node.contains_key(&key) {
        let sub = match next {
            bson::RawBsonRef::Array(_) => doc! {"a": true},
            bson::RawBsonRef::Document(_) => Document::new(),
            _ => return None,
        };
        node.insert(key.clone(), sub);
    }
    insert_leaf(node.get_document_mut(&key).ok()?, Some(next), rest, leaf)
}

// ---------------------------------------------------------------- scanning

/// Reads entries forward from a position: groups the engine's changes by
/// time and makes each whole group an entry.
struct Scanner {
    /// The engine position read up to.
    read: ChangePosition,
    /// Changes of the group being read (one time), not complete yet.
    pending: Vec<ChangeEvent>,
    /// Stop after this time (inclusive).
    end: Option<u64>,
    done: bool,
}

impl Scanner {
    fn new(after: ChangePosition, end: Option<u64>) -> Scanner {
        Scanner {
            read: after,
            pending: Vec::new(),
            end,
            done: false,
        }
    }

    fn pending_bytes(&self) -> usize {
        self.pending.len() * 256
    }

    fn flush(&mut self, out: &mut Vec<Document>) -> CmdResult<()> {
        if let Some(d) = entry_of(&self.pending)? {
            out.push(d);
        }
        self.pending.clear();
        Ok(())
    }

    /// Read one batch of changes; complete entries go to `out`. Returns
    /// false when nothing more can be read now (or the end was reached).
    fn step(&mut self, engine: &Engine, out: &mut Vec<Document>) -> CmdResult<bool> {
        if self.done {
            return Ok(false);
        }
        let b = engine.read_changes(&ChangeScope::Cluster, self.read, FETCH)?;
        let read_some = !b.events.is_empty();
        for e in b.events {
            if self.end.is_some_and(|end| e.pos.ts > end) {
                self.flush(out)?;
                self.done = true;
                return Ok(false);
            }
            if self.pending.first().is_some_and(|p| p.pos.ts != e.pos.ts) {
                self.flush(out)?;
            }
            self.read = e.pos;
            self.pending.push(e);
        }
        let moved = b.position > self.read;
        if moved {
            self.read = b.position;
        }
        // The batch read everything up to its position: a group at or
        // below it is whole.
        if self.read.index == u32::MAX
            && self
                .pending
                .first()
                .is_some_and(|p| p.pos.ts <= self.read.ts)
        {
            self.flush(out)?;
        }
        if self
            .end
            .is_some_and(|end| self.read.ts >= end && self.read.index == u32::MAX)
        {
            self.flush(out)?;
            self.done = true;
            return Ok(false);
        }
        // A batch of one big group's changes completes nothing yet, but is progress.
        Ok(read_some || moved || !out.is_empty())
    }
}

/// Map the engine's history-lost error for a cursor that was reading.
fn position_lost(e: CommandError) -> CommandError {
    if e.code == 286 {
        return CommandError::new(
            136,
            "CappedPositionLost",
            format!(
                "CollectionScan died due to position in capped collection being deleted: {}",
                e.message
            ),
        );
    }
    e
}

/// Bounds on `ts` a filter states at its top level (or in a top-level
/// `$and`): `(after, upto)` as cluster times, for seeking.
fn ts_bounds(filter: &Document) -> (Option<ChangePosition>, Option<u64>) {
    fn raise(lo: &mut Option<ChangePosition>, p: ChangePosition) {
        *lo = Some(lo.map_or(p, |l| l.max(p)));
    }
    fn lower(hi: &mut Option<u64>, t: u64) {
        *hi = Some(hi.map_or(t, |x| x.min(t)));
    }
    fn walk(f: &Document, lo: &mut Option<ChangePosition>, hi: &mut Option<u64>) {
        for (k, v) in f {
            match (k.as_str(), v) {
                ("ts", Bson::Timestamp(t)) => {
                    raise(lo, ChangePosition::at_time(packed(*t)));
                    lower(hi, packed(*t));
                }
                ("ts", Bson::Document(ops)) => {
                    for (op, v) in ops {
                        let Bson::Timestamp(t) = v else { continue };
                        let t = packed(*t);
                        match op.as_str() {
                            "$gt" => raise(lo, ChangePosition::after_time(t)),
                            "$gte" => raise(lo, ChangePosition::at_time(t)),
                            "$eq" => {
                                raise(lo, ChangePosition::at_time(t));
                                lower(hi, t);
                            }
                            "$lte" => lower(hi, t),
                            "$lt" => lower(hi, t.saturating_sub(1)),
                            _ => {}
                        }
                    }
                }
                ("$and", Bson::Array(parts)) => {
                    for p in parts {
                        if let Bson::Document(p) = p {
                            walk(p, lo, hi);
                        }
                    }
                }
                _ => {}
            }
        }
    }
    let (mut lo, mut hi) = (None, None);
    walk(filter, &mut lo, &mut hi);
    (lo, hi)
}

/// Where a scan of the oplog starts: after `lo` (the filter's bound), but
/// never before the oldest retained change (a capped collection's scan
/// starts at its oldest record).
fn start_of(engine: &Engine, lo: Option<ChangePosition>) -> CmdResult<ChangePosition> {
    let floor = ChangePosition::after_time(engine.change_history_floor(&ChangeScope::Cluster)?);
    Ok(lo.map_or(floor, |l| l.max(floor)))
}

fn matches(filter: &Filter, d: &Document) -> CmdResult<bool> {
    if filter.is_match_all() {
        return Ok(true);
    }
    let raw = duetdb::raw::to_raw_document(d)?;
    Ok(filter.matches(&raw))
}

fn too_much(what: &str) -> CommandError {
    CommandError::new(
        146,
        "ExceededMemoryLimit",
        format!(
            "{what} on the oplog view would hold more than {MAX_MATERIALIZED_BYTES} bytes of entries; \
             narrow it with a ts range or read it in $natural order with a cursor"
        ),
    )
}

/// Every entry matching `filter` with a time in the filter's bounds, in
/// order, at most [`MAX_MATERIALIZED_BYTES`].
fn materialize(ctx: &Ctx<'_>, filter_doc: &Document, what: &str) -> CmdResult<Vec<Document>> {
    let engine = &ctx.state.engine;
    let filter = Filter::parse(filter_doc)?;
    let (lo, hi) = ts_bounds(filter_doc);
    let end = hi.map_or(engine.stable_cluster_time(), |h| {
        h.min(engine.stable_cluster_time())
    });
    let mut scan = Scanner::new(start_of(engine, lo)?, Some(end));
    let mut out = Vec::new();
    let mut bytes = 0usize;
    loop {
        ctx.cancel.check()?;
        let mut got = Vec::new();
        let more = scan.step(engine, &mut got)?;
        for d in got {
            if matches(&filter, &d)? {
                bytes += owned_document_bytes(&d);
                if bytes > MAX_MATERIALIZED_BYTES {
                    return Err(too_much(what));
                }
                out.push(d);
            }
        }
        if !more {
            return Ok(out);
        }
    }
}

/// The newest entries matching `filter` (newest first), at most `want`:
/// read in time windows going back from the end, each twice as long.
fn newest(ctx: &Ctx<'_>, filter_doc: &Document, want: usize) -> CmdResult<Vec<Document>> {
    let engine = &ctx.state.engine;
    let filter = Filter::parse(filter_doc)?;
    let (lo, hi) = ts_bounds(filter_doc);
    let start = start_of(engine, lo)?;
    let mut upto = hi.map_or(engine.stable_cluster_time(), |h| {
        h.min(engine.stable_cluster_time())
    });
    // One second of cluster time, then doubling.
    let mut span: u64 = 1 << 32;
    let mut out = Vec::new();
    let mut bytes = 0usize;
    while upto > start.ts || (upto == start.ts && start.index != u32::MAX) {
        let from = ChangePosition::after_time(upto.saturating_sub(span)).max(start);
        let mut scan = Scanner::new(from, Some(upto));
        let mut window = Vec::new();
        loop {
            ctx.cancel.check()?;
            let mut got = Vec::new();
            let more = scan.step(engine, &mut got)?;
            for d in got {
                if matches(&filter, &d)? {
                    bytes += owned_document_bytes(&d);
                    if bytes > MAX_MATERIALIZED_BYTES {
                        return Err(too_much("a reverse scan"));
                    }
                    window.push(d);
                }
            }
            if !more {
                break;
            }
        }
        for d in window.into_iter().rev() {
            out.push(d);
            if out.len() >= want {
                return Ok(out);
            }
        }
        if from <= start {
            break;
        }
        upto = from.ts;
        span = span.saturating_mul(2);
    }
    Ok(out)
}

// ---------------------------------------------------------------- cursors

/// An oplog cursor: a forward scan (tailable or not) or a materialized
/// result (reverse order, other sorts).
pub struct OplogCursor {
    scan: Option<Scanner>,
    filter: Filter,
    projection: Option<Projection>,
    /// Entries ready to return (filtered, projected).
    ready: VecDeque<Document>,
    skip: u64,
    /// Entries still to return (`None`: no limit).
    left: Option<u64>,
    tailable: bool,
    await_data: bool,
    done: bool,
}

impl CursorSource for OplogCursor {
    fn next_doc(&mut self) -> CmdResult<Option<Document>> {
        Ok(None)
    }

    fn held_bytes(&self) -> usize {
        self.ready.iter().map(owned_document_bytes).sum::<usize>()
            + self.scan.as_ref().map_or(0, Scanner::pending_bytes)
    }

    fn as_oplog(&mut self) -> Option<&mut OplogCursor> {
        Some(self)
    }
}

impl OplogCursor {
    /// Read more entries into `ready`; false when nothing came.
    fn fill(&mut self, engine: &Engine) -> CmdResult<bool> {
        let Some(scan) = self.scan.as_mut() else {
            self.done = true;
            return Ok(false);
        };
        let mut got = Vec::new();
        let more = match scan.step(engine, &mut got) {
            Ok(m) => m,
            Err(e) => return Err(position_lost(e)),
        };
        let mut any = false;
        for d in got {
            if !matches(&self.filter, &d)? {
                continue;
            }
            if self.skip > 0 {
                self.skip -= 1;
                continue;
            }
            let d = match &self.projection {
                Some(p) => p.apply(&duetdb::raw::to_raw_document(&d)?)?,
                None => d,
            };
            self.ready.push_back(d);
            any = true;
        }
        if !more && !self.tailable && scan.done {
            self.done = true;
        }
        Ok(any || more)
    }

    fn exhausted(&self) -> bool {
        self.ready.is_empty() && (self.done || self.left == Some(0))
    }

    /// The next batch of at most `max` entries (16 MiB at most), without
    /// waiting; a non-tailable cursor reads ahead so that it knows exactly
    /// when it is exhausted.
    fn next_batch(&mut self, engine: &Engine, max: usize) -> CmdResult<Vec<Bson>> {
        let mut out = Vec::new();
        let mut bytes = 0usize;
        while out.len() < max && self.left != Some(0) {
            if let Some(d) = self.ready.pop_front() {
                let elem = array_element_len(out.len(), &Bson::Null) + document_len(&d);
                if !out.is_empty() && bytes + elem > MAX_BATCH_BYTES {
                    self.ready.push_front(d);
                    break;
                }
                bytes += elem;
                out.push(Bson::Document(d));
                if let Some(l) = self.left.as_mut() {
                    *l -= 1;
                }
                continue;
            }
            if self.done || !self.fill(engine)? {
                break;
            }
        }
        if !self.tailable {
            while self.ready.is_empty() && !self.done && self.left != Some(0) {
                if !self.fill(engine)? && !self.done {
                    // Nothing more is final yet: a later batch reads it.
                    break;
                }
            }
        }
        Ok(out)
    }
}

/// A `find` on the oplog view.
fn find(ctx: &Ctx<'_>, cmd: &Document, coll: &str) -> CmdResult {
    let engine = &ctx.state.engine;
    for unsupported in ["min", "max", "returnKey", "showRecordId"] {
        if cmd
            .get(unsupported)
            .is_some_and(|v| !matches!(v, Bson::Boolean(false) | Bson::Null))
        {
            return Err(CommandError::not_supported(format!(
                "find option '{unsupported}' is not supported by duetdb"
            )));
        }
    }
    let filter_doc = args::opt_doc(cmd, "filter")?.cloned().unwrap_or_default();
    let filter = Filter::parse(&filter_doc)?;
    let let_vars = args::opt_doc(cmd, "let")?;
    let projection = args::opt_doc(cmd, "projection")?
        .filter(|p| !p.is_empty())
        .map(|p| Projection::parse_find(p, Some(&filter_doc), let_vars))
        .transpose()?;
    let skip = args::opt_count(cmd, "skip")?.unwrap_or(0);
    let limit = args::opt_safe_i64(cmd, "limit")?.unwrap_or(0);
    if limit < 0 {
        return Err(CommandError::bad_value("limit must be non-negative"));
    }
    let single_batch = args::flag(cmd, "singleBatch")?;
    let tailable = args::flag(cmd, "tailable")?;
    let await_data = args::flag(cmd, "awaitData")?;
    if await_data && !tailable {
        return Err(CommandError::bad_value(
            "Cannot set 'awaitData' without also setting 'tailable'",
        ));
    }
    if tailable && single_batch {
        return Err(CommandError::bad_value(
            "Cannot set 'singleBatch' with 'tailable'",
        ));
    }
    let first = args::opt_count(cmd, "batchSize")?
        .map(|n| n.min(usize::MAX as u64) as usize)
        .unwrap_or(crate::cursor::DEFAULT_FIRST_BATCH);
    let order = order_of(cmd)?;
    if tailable && !matches!(order, Order::Natural(1)) {
        return Err(CommandError::bad_value(
            "cannot use tailable option with a sort other than {$natural: 1}",
        ));
    }
    // From now on the process keeps its change tail (as for a change stream).
    engine.open_change_stream();
    let left = (limit > 0).then_some(limit as u64);
    let mut cursor = OplogCursor {
        scan: None,
        filter,
        projection: None,
        ready: VecDeque::new(),
        skip: 0,
        left,
        tailable,
        await_data,
        done: false,
    };
    match order {
        Order::Natural(1) => {
            let (lo, hi) = ts_bounds(&filter_doc);
            let end = if tailable {
                hi
            } else {
                let stable = engine.stable_cluster_time();
                Some(hi.map_or(stable, |h| h.min(stable)))
            };
            cursor.scan = Some(Scanner::new(start_of(engine, lo)?, end));
            cursor.skip = skip;
            cursor.projection = projection;
        }
        Order::Natural(_) => {
            let want = left.map_or(usize::MAX, |l| {
                usize::try_from(l.saturating_add(skip)).unwrap_or(usize::MAX)
            });
            let docs = newest(ctx, &filter_doc, want)?;
            cursor.ready = project_all(docs, skip, projection.as_ref())?;
            cursor.done = true;
        }
        Order::Sort(sort) => {
            let docs = materialize(ctx, &filter_doc, "a sort")?;
            let docs = Pipeline::parse(&[doc! {"$sort": sort}])?.run_on(docs)?;
            cursor.ready = project_all(docs, skip, projection.as_ref())?;
            cursor.done = true;
        }
    }
    let batch = cursor.next_batch(engine, first)?;
    let ns = format!("{OPLOG_DB}.{coll}");
    let id = if single_batch || (!tailable && cursor.exhausted()) || cursor.left == Some(0) {
        0
    } else {
        let c = Cursor::new(ns.clone(), ctx.conn.id, None, Box::new(cursor));
        ctx.state.cursors.open(c, ctx.cursor_owner())?
    };
    Ok(doc! {"cursor": {"firstBatch": batch, "id": id, "ns": ns}, "ok": 1.0})
}

fn project_all(
    docs: Vec<Document>,
    skip: u64,
    projection: Option<&Projection>,
) -> CmdResult<VecDeque<Document>> {
    let skip = usize::try_from(skip).unwrap_or(usize::MAX);
    docs.into_iter()
        .skip(skip)
        .map(|d| match projection {
            Some(p) => Ok(p.apply(&duetdb::raw::to_raw_document(&d)?)?),
            None => Ok(d),
        })
        .collect()
}

/// How a find orders the oplog.
enum Order {
    /// `$natural` (or `ts`) order: 1 or -1.
    Natural(i32),
    /// Any other sort (materialized, bounded).
    Sort(Document),
}

fn direction(v: &Bson) -> CmdResult<i32> {
    let n = match v {
        Bson::Int32(n) => f64::from(*n),
        Bson::Int64(n) => *n as f64,
        Bson::Double(d) => *d,
        _ => return Err(CommandError::bad_value("$natural must be 1 or -1")),
    };
    Ok(if n < 0.0 { -1 } else { 1 })
}

fn order_of(cmd: &Document) -> CmdResult<Order> {
    if let Some(sort) = args::opt_doc(cmd, "sort")?.filter(|s| !s.is_empty()) {
        if sort.len() == 1 {
            if let Some((k, v)) = sort.iter().next() {
                if k == "$natural" || k == "ts" {
                    return Ok(Order::Natural(direction(v)?));
                }
            }
        }
        return Ok(Order::Sort(sort.clone()));
    }
    match cmd.get("hint") {
        None | Some(Bson::Null) => Ok(Order::Natural(1)),
        Some(Bson::Document(h)) if h.is_empty() => Ok(Order::Natural(1)),
        Some(Bson::Document(h)) if h.len() == 1 && h.contains_key("$natural") => Ok(
            Order::Natural(direction(h.get("$natural").unwrap_or(&Bson::Int32(1)))?),
        ),
        Some(_) => Err(CommandError::bad_value(
            "error processing query: planner returned error :: caused by :: hint provided does \
             not correspond to an existing index (the oplog has no indexes; hint {$natural: 1} \
             or {$natural: -1})",
        )),
    }
}

/// `count` on the oplog view: a forward scan counting matching entries.
fn count(ctx: &Ctx<'_>, cmd: &Document) -> CmdResult {
    let engine = &ctx.state.engine;
    let query = args::opt_doc(cmd, "query")?.cloned().unwrap_or_default();
    let filter = Filter::parse(&query)?;
    let skip = args::opt_count(cmd, "skip")?.unwrap_or(0);
    let limit = args::opt_safe_i64(cmd, "limit")?
        .unwrap_or(0)
        .unsigned_abs();
    let (lo, hi) = ts_bounds(&query);
    let stable = engine.stable_cluster_time();
    let mut scan = Scanner::new(
        start_of(engine, lo)?,
        Some(hi.map_or(stable, |h| h.min(stable))),
    );
    let mut n: u64 = 0;
    loop {
        ctx.cancel.check()?;
        let mut got = Vec::new();
        let more = scan.step(engine, &mut got)?;
        for d in &got {
            if matches(&filter, d)? {
                n += 1;
            }
        }
        if !more {
            break;
        }
    }
    let mut n = n.saturating_sub(skip);
    if limit > 0 {
        n = n.min(limit);
    }
    Ok(doc! {"n": n.min(i64::MAX as u64) as i64, "ok": 1.0})
}

/// `aggregate` on the oplog view: a leading `$match` selects (and seeks by
/// its `ts` bounds), the rest of the pipeline runs on the matching entries.
fn aggregate(ctx: &Ctx<'_>, cmd: &Document, coll: &str) -> CmdResult {
    let pipeline = args::opt_array(cmd, "pipeline")?
        .ok_or_else(|| CommandError::bad_value("aggregate requires 'pipeline'"))?;
    let cursor_opts = args::opt_doc(cmd, "cursor")?.ok_or_else(|| {
        CommandError::new(
            9,
            "FailedToParse",
            "The 'cursor' option is required, except for aggregate with the explain argument",
        )
    })?;
    if super::changes::is_change_stream(pipeline) {
        return Err(CommandError::new(
            73,
            "InvalidNamespace",
            "$changeStream may not be opened on the internal local.oplog.rs collection",
        ));
    }
    let mut stages = Vec::with_capacity(pipeline.len());
    for s in pipeline {
        match s {
            Bson::Document(d) => stages.push(d.clone()),
            _ => {
                return Err(CommandError::type_mismatch(
                    "each pipeline stage must be a document",
                ))
            }
        }
    }
    let first_match = stages
        .first()
        .and_then(|s| s.get_document("$match").ok())
        .cloned();
    let filter = match first_match {
        Some(m) => {
            stages.remove(0);
            m
        }
        None => Document::new(),
    };
    let rest = Pipeline::parse(&stages)?;
    let first = args::opt_count(cursor_opts, "batchSize")?
        .map(|n| n.min(usize::MAX as u64) as usize)
        .unwrap_or(crate::cursor::DEFAULT_FIRST_BATCH);
    ctx.state.engine.open_change_stream();
    let docs = materialize(ctx, &filter, "an aggregate")?;
    let docs = if rest.is_empty() {
        docs
    } else {
        rest.run_on(docs)?
    };
    let ns = format!("{OPLOG_DB}.{coll}");
    let mut cursor = Cursor::from_owned(ns.clone(), ctx.conn.id, docs);
    let batch = cursor.next_batch(first)?;
    let id = if cursor.is_exhausted() {
        0
    } else {
        ctx.state.cursors.open(cursor, ctx.cursor_owner())?
    };
    Ok(doc! {"cursor": {"firstBatch": batch, "id": id, "ns": ns}, "ok": 1.0})
}

/// A `getMore` on an oplog cursor: the next entries; a tailable awaitData
/// cursor waits up to the command's `maxTimeMS` (default 1 s) for some,
/// woken by the writers' publish. The cursor is marked exhausted when no
/// entry can follow.
pub fn get_more(
    ctx: &Ctx<'_>,
    cmd: &Document,
    cursor: &mut Cursor,
    size: usize,
) -> CmdResult<Vec<Bson>> {
    let oplog = cursor
        .source_mut()
        .as_oplog()
        .ok_or_else(|| CommandError::internal("not an oplog cursor"))?;
    let wait = super::changes::tailable_await(cmd, oplog.await_data)?;
    let engine = &ctx.state.engine;
    let batch = super::changes::await_batch(ctx, wait, &WAITING, || {
        let batch = oplog.next_batch(engine, size)?;
        Ok((batch, oplog.exhausted()))
    })?;
    if oplog.exhausted() && (!oplog.tailable || oplog.left == Some(0)) {
        cursor.mark_exhausted();
    }
    Ok(batch)
}

// ---------------------------------------------------------------- applyOps

/// `applyOps`: apply oplog operations (`mongorestore --oplogReplay` sends
/// one at a time). Each operation runs as the command it stands for, through
/// the ordinary dispatch (so `--auth` checks each one as that command):
/// `i` as an upsert of the document by `_id` and `u` as an upsert by `o2`
/// (MongoDB's `alwaysUpsert`, so replaying entries already in a dump is
/// harmless), `$v: 2` diffs as `$set`/`$unset` (and a `$push` with `$slice`
/// for a truncated array, applied first), replacements as replacements, `d`
/// as a delete of one, `c` as the command in `o` on the entry's database
/// (nested `applyOps` recursively), `n` ignored. Not atomic: operations
/// apply one after another and the first failure stops the command.
pub fn apply_ops(ctx: &Ctx<'_>, cmd: &Document) -> CmdResult {
    let ops = args::opt_array(cmd, "applyOps")?
        .ok_or_else(|| CommandError::type_mismatch("applyOps must be an array"))?;
    let mut results = Vec::with_capacity(ops.len());
    for op in ops {
        let Bson::Document(op) = op else {
            return Err(CommandError::type_mismatch(
                "each applyOps operation must be a document",
            ));
        };
        apply_one(ctx, op, 0)?;
        results.push(Bson::Boolean(true));
    }
    Ok(doc! {"applied": results.len() as i32, "results": results, "ok": 1.0})
}

/// Nested `applyOps` deeper than this are refused.
const MAX_APPLY_DEPTH: usize = 8;

fn apply_one(ctx: &Ctx<'_>, op: &Document, depth: usize) -> CmdResult<()> {
    let kind = args::req_str(op, "op")?;
    let ns = args::opt_str(op, "ns")?.unwrap_or_default();
    let (db, coll) = ns.split_once('.').unwrap_or((ns, ""));
    let o = || -> CmdResult<&Document> {
        args::opt_doc(op, "o")?
            .ok_or_else(|| CommandError::new(9, "FailedToParse", "applyOps operation has no 'o'"))
    };
    let run = |db: &str, cmd: Document| -> CmdResult<()> {
        let reply = super::execute_with(ctx.state, ctx.conn, db, &cmd, ctx.cancel);
        if !matches!(reply.get("ok"), Some(Bson::Double(x)) if *x == 1.0)
            && !matches!(reply.get("ok"), Some(Bson::Int32(1)))
        {
            return Err(error_of(&reply));
        }
        if let Ok(errs) = reply.get_array("writeErrors") {
            if let Some(Bson::Document(e)) = errs.first() {
                return Err(error_of(e));
            }
        }
        Ok(())
    };
    match kind {
        "n" => Ok(()),
        "i" => {
            let doc = o()?.clone();
            let id = doc
                .get("_id")
                .cloned()
                .ok_or_else(|| CommandError::bad_value("applyOps insert without _id"))?;
            run(
                db,
                doc! {"update": coll, "updates": [{"q": {"_id": id}, "u": doc, "upsert": true}]},
            )
        }
        "u" => {
            let q = args::opt_doc(op, "o2")?.cloned().ok_or_else(|| {
                CommandError::new(9, "FailedToParse", "applyOps update has no 'o2'")
            })?;
            let o = o()?;
            match o.get("$v") {
                Some(v) if args::as_i64("$v", v)? == 2 => {
                    let diff = args::opt_doc(o, "diff")?.ok_or_else(|| {
                        CommandError::new(9, "FailedToParse", "a $v: 2 update has no 'diff'")
                    })?;
                    let mut set = Document::new();
                    let mut unset = Document::new();
                    let mut truncate = Document::new();
                    diff_ops(diff, "", false, &mut set, &mut unset, &mut truncate)?;
                    if !truncate.is_empty() {
                        run(
                            db,
                            doc! {"update": coll, "updates": [{"q": q.clone(), "u": {"$push": truncate}}]},
                        )?;
                    }
                    let mut u = Document::new();
                    if !set.is_empty() {
                        u.insert("$set", set);
                    }
                    if !unset.is_empty() {
                        u.insert("$unset", unset);
                    }
                    if u.is_empty() {
                        return Ok(());
                    }
                    run(
                        db,
                        doc! {"update": coll, "updates": [{"q": q, "u": u, "upsert": true}]},
                    )
                }
                _ => {
                    // Update operators (`$set`, ... of older oplogs) or a
                    // whole replacement document.
                    let mut u = o.clone();
                    u.remove("$v");
                    run(
                        db,
                        doc! {"update": coll, "updates": [{"q": q, "u": u, "upsert": true}]},
                    )
                }
            }
        }
        "d" => run(
            db,
            doc! {"delete": coll, "deletes": [{"q": o()?.clone(), "limit": 1}]},
        ),
        "c" => {
            let o = o()?;
            let name = o.keys().next().map(String::as_str).unwrap_or_default();
            match name {
                "applyOps" => {
                    if depth >= MAX_APPLY_DEPTH {
                        return Err(CommandError::bad_value("applyOps nested too deeply"));
                    }
                    for inner in args::opt_array(o, "applyOps")?.into_iter().flatten() {
                        let Bson::Document(inner) = inner else {
                            return Err(CommandError::type_mismatch(
                                "each applyOps operation must be a document",
                            ));
                        };
                        apply_one(ctx, inner, depth + 1)?;
                    }
                    Ok(())
                }
                "create" | "drop" | "dropDatabase" | "renameCollection" | "dropIndexes"
                | "deleteIndexes" | "collMod" => {
                    let target = if name == "renameCollection" {
                        "admin"
                    } else {
                        db
                    };
                    let mut cmd = o.clone();
                    // The idIndex of a create is the default one.
                    cmd.remove("idIndex");
                    match run(target, cmd) {
                        // Replaying a drop of what is already gone is harmless.
                        Err(e) if e.code == 26 && name != "renameCollection" => Ok(()),
                        other => other,
                    }
                }
                "createIndexes" => {
                    let mut spec = o.clone();
                    let coll = spec
                        .remove("createIndexes")
                        .and_then(|c| c.as_str().map(str::to_string))
                        .unwrap_or_default();
                    run(db, doc! {"createIndexes": coll, "indexes": [spec]})
                }
                other => Err(CommandError::not_supported(format!(
                    "applyOps command '{other}' is not supported by duetdb"
                ))),
            }
        }
        other => Err(CommandError::bad_value(format!(
            "applyOps: unknown operation type '{other}'"
        ))),
    }
}

/// The error a reply (or a write error) carries.
fn error_of(reply: &Document) -> CommandError {
    let code = reply.get_i32("code").unwrap_or(8);
    let msg = reply
        .get_str("errmsg")
        .unwrap_or("applyOps operation failed");
    let name = match code {
        2 => "BadValue",
        13 => "Unauthorized",
        20 => "IllegalOperation",
        26 => "NamespaceNotFound",
        73 => "InvalidNamespace",
        11000 => "DuplicateKey",
        _ => "OperationFailed",
    };
    CommandError::new(code, name, format!("applyOps: {msg}"))
}

/// Turn a `$v: 2` diff into `$set`/`$unset` paths and array truncations
/// (`$push: {path: {$each: [], $slice: n}}`).
fn diff_ops(
    diff: &Document,
    prefix: &str,
    array: bool,
    set: &mut Document,
    unset: &mut Document,
    truncate: &mut Document,
) -> CmdResult<()> {
    let path = |k: &str| {
        if prefix.is_empty() {
            k.to_string()
        } else {
            format!("{prefix}.{k}")
        }
    };
    let bad =
        |k: &str| CommandError::new(9, "FailedToParse", format!("bad $v: 2 diff field '{k}'"));
    for (k, v) in diff {
        match k.as_str() {
            "a" if array => {}
            "l" if array => {
                truncate.insert(prefix, doc! {"$each": [], "$slice": v.clone()});
            }
            "u" | "i" if !array => {
                let Bson::Document(fields) = v else {
                    return Err(bad(k));
                };
                for (f, val) in fields {
                    set.insert(path(f), val.clone());
                }
            }
            "d" if !array => {
                let Bson::Document(fields) = v else {
                    return Err(bad(k));
                };
                for f in fields.keys() {
                    unset.insert(path(f), "");
                }
            }
            _ if array && k.starts_with('u') => {
                set.insert(path(&k[1..]), v.clone());
            }
            _ if k.starts_with('s') && k.len() > 1 => {
                let Bson::Document(sub) = v else {
                    return Err(bad(k));
                };
                let sub_array = matches!(sub.get("a"), Some(Bson::Boolean(true)));
                diff_ops(sub, &path(&k[1..]), sub_array, set, unset, truncate)?;
            }
            _ => return Err(bad(k)),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn raw(d: &Document) -> bson::RawDocumentBuf {
        bson::RawDocumentBuf::try_from(d).expect("raw")
    }

    #[test]
    fn update_diffs_follow_the_post_image_and_invert() {
        let post = doc! {"_id": 1, "a": {"b": 2, "c": [1, {"x": 5}, 3]}, "n": 7};
        let desc = doc! {
            "updatedFields": {"a.b": 2, "a.c.1.x": 5, "a.c.2": 3, "n": 7},
            "removedFields": ["gone", "a.old"],
            "truncatedArrays": [{"field": "a.c", "newSize": 3}],
        };
        let diff = update_diff(&raw(&post), &desc).expect("diff");
        assert_eq!(
            diff,
            doc! {
                "sa": {
                    "sc": {"a": true, "l": 3_i64, "s1": {"u": {"x": 5}}, "u2": 3},
                    "u": {"b": 2},
                    "d": {"old": false},
                },
                "u": {"n": 7},
                "d": {"gone": false},
            }
        );
        let (mut set, mut unset, mut trunc) = (Document::new(), Document::new(), Document::new());
        diff_ops(&diff, "", false, &mut set, &mut unset, &mut trunc).expect("ops");
        assert_eq!(set, doc! {"a.c.1.x": 5, "a.c.2": 3, "a.b": 2, "n": 7});
        assert_eq!(unset, doc! {"a.old": "", "gone": ""});
        assert_eq!(trunc, doc! {"a.c": {"$each": [], "$slice": 3_i64}});
    }

    #[test]
    fn a_path_outside_the_post_image_gives_no_diff() {
        let post = doc! {"_id": 1, "a": 1};
        let desc = doc! {"updatedFields": {"a.b.c": 1}, "removedFields": [], "truncatedArrays": []};
        assert!(update_diff(&raw(&post), &desc).is_none());
    }

    /// A tailable cursor whose position the history no longer holds fails
    /// with CappedPositionLost, never skips: here a database without a WAL,
    /// whose only history is the in-memory tail (64 MiB), pushed past the
    /// cursor by large inserts.
    #[test]
    fn a_tailable_cursor_whose_position_left_the_history_fails_136() {
        use crate::state::{Config, ConnInfo, ServerState};
        let state = ServerState::new(
            Engine::in_memory(),
            Config {
                data_dir: None,
                ..Config::default()
            },
        );
        let addr: std::net::SocketAddr = ([127, 0, 0, 1], 1).into();
        let conn = ConnInfo::new(1, addr, addr);
        let run = |db: &str, cmd: Document| super::super::execute(&state, &conn, db, &cmd);
        let r = run(
            "local",
            doc! {"find": "oplog.rs", "filter": {}, "tailable": true},
        );
        let id = r
            .get_document("cursor")
            .and_then(|c| c.get_i64("id"))
            .expect("cursor");
        assert_ne!(id, 0, "{r}");
        run("d", doc! {"insert": "c", "documents": [{"_id": 0}]});
        let get_more = || run("local", doc! {"getMore": id, "collection": "oplog.rs"});
        let r = get_more();
        let batch = r
            .get_document("cursor")
            .and_then(|c| c.get_array("nextBatch"))
            .expect("batch");
        assert_eq!(batch.len(), 1, "{r}");
        let big = "x".repeat(12 << 20);
        for i in 1..=7 {
            let r = run(
                "d",
                doc! {"insert": "c", "documents": [{"_id": i, "b": big.clone()}]},
            );
            assert_eq!(r.get_i32("n").ok(), Some(1), "{r}");
        }
        let r = get_more();
        assert_eq!(r.get_i32("code").ok(), Some(136), "{r}");
    }

    fn test_state() -> std::sync::Arc<crate::state::ServerState> {
        crate::state::ServerState::new(
            Engine::in_memory(),
            crate::state::Config {
                data_dir: None,
                ..crate::state::Config::default()
            },
        )
    }

    /// A group of more changes than one engine read returns is still one
    /// whole entry (the scan goes on reading until the group is complete).
    #[test]
    fn a_group_larger_than_one_read_is_one_entry() {
        let state = test_state();
        let addr: std::net::SocketAddr = ([127, 0, 0, 1], 1).into();
        let conn = crate::state::ConnInfo::new(1, addr, addr);
        let run = |db: &str, cmd: Document| super::super::execute(&state, &conn, db, &cmd);
        // Activate the history first (a database without a WAL keeps none before).
        run("local", doc! {"find": "oplog.rs"});
        let docs: Vec<Bson> = (0..(3 * FETCH as i32 + 7))
            .map(|i| Bson::Document(doc! {"_id": i}))
            .collect();
        let n = docs.len();
        let r = run("d", doc! {"insert": "c", "documents": docs});
        assert_eq!(r.get_i32("n").ok(), Some(n as i32), "{r}");
        for cmd in [
            doc! {"find": "oplog.rs", "filter": {"o.applyOps": {"$exists": true}}},
            doc! {"find": "oplog.rs", "sort": {"$natural": -1}, "limit": 1},
        ] {
            let r = run("local", cmd);
            let batch = r
                .get_document("cursor")
                .and_then(|c| c.get_array("firstBatch"))
                .expect("batch");
            assert_eq!(batch.len(), 1, "{r}");
            let ops = batch[0]
                .as_document()
                .and_then(|e| e.get_document("o").ok())
                .and_then(|o| o.get_array("applyOps").ok())
                .map(Vec::len);
            assert_eq!(ops, Some(n));
        }
        let r = run("local", doc! {"count": "oplog.rs", "query": {"op": "c"}});
        assert_eq!(r.get_i64("n").ok(), Some(1), "{r}");
    }

    #[test]
    fn ts_bounds_are_read_from_the_top_level_and_and() {
        let t = |s: u32, i: u32| Timestamp {
            time: s,
            increment: i,
        };
        let f = doc! {"$and": [{"ts": {"$gte": t(5, 2)}}, {"ts": {"$lte": t(9, 4)}}], "op": "i"};
        let (lo, hi) = ts_bounds(&f);
        assert_eq!(lo, Some(ChangePosition::at_time(packed(t(5, 2)))));
        assert_eq!(hi, Some(packed(t(9, 4))));
        let (lo, hi) = ts_bounds(&doc! {"ts": {"$gt": t(5, 2)}});
        assert_eq!(lo, Some(ChangePosition::after_time(packed(t(5, 2)))));
        assert_eq!(hi, None);
        assert_eq!(ts_bounds(&doc! {"$or": [{"ts": t(1, 1)}]}), (None, None));
    }
}
