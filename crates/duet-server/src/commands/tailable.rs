//! Tailable cursors on capped collections (`find` with `tailable`, and
//! `awaitData`), as MongoDB's: the cursor stays open when it runs dry, and
//! each `getMore` returns the documents inserted since, in `$natural`
//! (insertion) order.
//!
//! Reads: the engine's tail (`Collection::read_tail`): every batch reads the
//! *latest published* state after the last record the cursor scanned — no
//! snapshot is held between batches, so a tail sees every insert published
//! before its `getMore` read, and documents updated after it scanned them
//! are not seen again. The collection is looked up again by each `getMore`
//! (a dropped database or collection ends the cursor: CursorNotFound, 43).
//! A cursor whose last scanned document was trimmed (or deleted) fails with
//! CappedPositionLost (136) and is closed.
//!
//! Opening: a missing or empty collection gives no cursor (id 0, as
//! MongoDB); a collection that is not capped is BadValue (2) "error
//! processing query: ns=… tailable cursor requested on non capped
//! collection"; a sort or hint other than `{$natural: 1}`, `singleBatch`,
//! a negative limit, a named snapshot or `readConcern: snapshot` are
//! BadValue (2); in a transaction 263 (`awaitData` without `tailable` is 9
//! FailedToParse, checked in `read.rs`). `skip`
//! and `limit` count matching documents over the cursor's life (the cursor
//! closes once `limit` are returned), as MongoDB.
//!
//! Waiting: a `getMore` of an `awaitData` cursor that finds nothing waits up
//! to its `maxTimeMS` (default 1 s, MongoDB's) for the writers' publish
//! (`Engine::wait_for_changes`, no polling), in 100 ms slices so that a
//! cancellation (`killOp`, a closed connection, shutdown) or a
//! `killCursors` of the cursor ends the wait within a slice; then it
//! returns an empty batch with the same cursor id. At most
//! [`super::changes::MAX_WAITING_GETMORES`] (256) such `getMore`s wait at
//! once, counted apart from change streams and the oplog view; beyond, the
//! empty batch returns at once. A `getMore` of a tailable cursor without
//! `awaitData` never waits (and `maxTimeMS` on it is BadValue, as MongoDB).
//!
//! Invariants:
//! - documents come in `$natural` order, each once: the engine's position
//!   moves only over records it scanned, and documents read but not yet
//!   returned wait in `ready`, bounded by one read (1024 documents or
//!   16 MiB), counted in the cursor's `held_bytes`.

use std::collections::VecDeque;
use std::sync::atomic::AtomicUsize;

use bson::{doc, Bson, Document};
use duetdb::lang::{Filter, Projection};
use duetdb::raw::{array_element_len, document_len, DocRef};
use duetdb::TailPosition;

use super::source::Target;
use super::Ctx;
use crate::args;
use crate::cursor::{Cursor, CursorSource, DEFAULT_FIRST_BATCH, MAX_BATCH_BYTES};
use crate::error::{CmdResult, CommandError};

/// Documents one engine read returns at most.
const FETCH: usize = 1024;

/// `getMore`s of tailable capped-collection cursors waiting at once (at
/// most [`super::changes::MAX_WAITING_GETMORES`]).
static WAITING: AtomicUsize = AtomicUsize::new(0);

/// A tailable cursor on a capped collection.
pub struct TailCursor {
    /// The collection's name in the cursor's database (looked up per batch).
    coll: String,
    pos: TailPosition,
    filter: Filter,
    projection: Option<Projection>,
    /// Matching documents read, not yet returned.
    ready: VecDeque<DocRef>,
    /// Matching documents still to skip.
    skip: u64,
    /// Documents still to return (`None`: no limit).
    left: Option<u64>,
    await_data: bool,
}

impl CursorSource for TailCursor {
    fn next_doc(&mut self) -> CmdResult<Option<Document>> {
        Ok(None)
    }

    fn held_bytes(&self) -> usize {
        // The documents may have been trimmed since: count them as ours.
        self.ready
            .iter()
            .map(|d| d.as_bytes().len() + std::mem::size_of::<DocRef>())
            .sum()
    }

    fn as_tailable(&mut self) -> Option<&mut TailCursor> {
        Some(self)
    }
}

impl TailCursor {
    /// The next batch of at most `max` documents (16 MiB at most), without
    /// waiting.
    fn next_batch(&mut self, ctx: &Ctx<'_>, max: usize) -> CmdResult<Vec<Bson>> {
        let mut out = Vec::new();
        let mut bytes = 0usize;
        while out.len() < max && self.left != Some(0) {
            let Some(raw) = self.ready.pop_front() else {
                // Each read moves the position; none left: dry for now.
                if self.read(ctx)? == 0 {
                    break;
                }
                continue;
            };
            if self.skip > 0 {
                self.skip -= 1;
                continue;
            }
            let d = match &self.projection {
                Some(p) => p.apply(&raw)?,
                None => duetdb::raw::to_document(&raw)?,
            };
            let elem = array_element_len(out.len(), &Bson::Null) + document_len(&d);
            if !out.is_empty() && bytes + elem > MAX_BATCH_BYTES {
                self.ready.push_front(raw);
                break;
            }
            bytes += elem;
            out.push(Bson::Document(d));
            if let Some(l) = self.left.as_mut() {
                *l -= 1;
            }
        }
        Ok(out)
    }

    /// Read the next matching documents into `ready`; how many came.
    fn read(&mut self, ctx: &Ctx<'_>) -> CmdResult<usize> {
        let coll = ctx.database()?.collection(&self.coll);
        let got = coll.read_tail(
            &mut self.pos,
            &self.filter,
            FETCH,
            MAX_BATCH_BYTES,
            ctx.cancel,
        )?;
        let n = got.len();
        self.ready.extend(got);
        Ok(n)
    }
}

/// Whether `v` is `{$natural: 1}` (any numeric 1).
fn is_natural_forward(v: &Bson) -> bool {
    let Bson::Document(d) = v else {
        return false;
    };
    d.len() == 1
        && d.get("$natural").is_some_and(|n| match n {
            Bson::Int32(i) => *i == 1,
            Bson::Int64(i) => *i == 1,
            Bson::Double(f) => *f == 1.0,
            _ => false,
        })
}

/// A `find` with `tailable: true` (the caller checked the flag).
pub fn find(ctx: &Ctx<'_>, cmd: &Document, coll: &str, target: &Target<'_>) -> CmdResult {
    if target.in_transaction() {
        return Err(CommandError::new(
            263,
            "OperationNotSupportedInTransaction",
            "tailable cursors are not supported in a transaction",
        ));
    }
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
    if args::flag(cmd, "singleBatch")? {
        return Err(CommandError::bad_value(
            "cannot use tailable option with the 'singleBatch' option",
        ));
    }
    let sort = args::opt_doc(cmd, "sort")?.filter(|s| !s.is_empty());
    if sort.is_some_and(|s| !is_natural_forward(&Bson::Document(s.clone()))) {
        return Err(CommandError::bad_value(
            "cannot use tailable option with a sort other than {$natural: 1}",
        ));
    }
    if cmd
        .get("hint")
        .is_some_and(|h| !matches!(h, Bson::Null) && !is_natural_forward(h))
    {
        return Err(CommandError::bad_value(
            "a tailable cursor scans in $natural order: its hint can only be {$natural: 1}",
        ));
    }
    if ctx.snapshot_name().is_some()
        || args::opt_doc(cmd, "$duet")?.is_some_and(|d| d.contains_key("snapshotName"))
        || matches!(super::read_concern(cmd)?, super::ReadConcern::Snapshot(_))
    {
        return Err(CommandError::bad_value(
            "a tailable cursor reads the latest state: it cannot read a snapshot \
             (readConcern 'snapshot' or a named snapshot)",
        ));
    }
    let limit = args::opt_safe_i64(cmd, "limit")?.unwrap_or(0);
    if limit < 0 {
        return Err(CommandError::bad_value("limit must be non-negative"));
    }
    let skip = args::opt_count(cmd, "skip")?.unwrap_or(0);
    let first = args::opt_count(cmd, "batchSize")?
        .map(|n| n.min(usize::MAX as u64) as usize)
        .unwrap_or(DEFAULT_FIRST_BATCH);
    let filter_doc = args::opt_doc(cmd, "filter")?.cloned().unwrap_or_default();
    if filter_doc.contains_key("$text") {
        return Err(CommandError::bad_value(
            "a tailable cursor cannot use $text (it scans in $natural order)",
        ));
    }
    let let_vars = args::opt_doc(cmd, "let")?;
    let filter_doc = Filter::bind_let(&filter_doc, let_vars)?;
    // The cursor's filter and projection compare under the command's
    // collation, else the collection's default, as a find's do.
    let collator = ctx
        .database()?
        .collection(coll)
        .with_collation(super::source::collation_of(cmd)?)
        .collator()?;
    let filter = Filter::parse(&filter_doc)?.with_collation(collator.clone());
    let projection = args::opt_doc(cmd, "projection")?
        .filter(|p| !p.is_empty())
        .map(|p| Projection::parse_find(p, Some(&filter_doc), let_vars))
        .transpose()?
        .map(|p| p.with_collation(collator));
    let await_data = args::flag(cmd, "awaitData")?;
    let ns = ctx.ns(coll);
    let Some(pos) = ctx.database()?.collection(coll).open_tail()? else {
        return Ok(doc! {"cursor": {"firstBatch": [], "id": 0_i64, "ns": ns}, "ok": 1.0});
    };
    let mut tail = TailCursor {
        coll: coll.to_string(),
        pos,
        filter,
        projection,
        ready: VecDeque::new(),
        skip,
        left: (limit > 0).then_some(limit as u64),
        await_data,
    };
    let batch = tail.next_batch(ctx, first)?;
    let id = if tail.left == Some(0) {
        0
    } else {
        let c = Cursor::new(ns.clone(), ctx.conn.id, None, Box::new(tail));
        ctx.state.cursors.open(c, ctx.cursor_owner())?
    };
    Ok(doc! {"cursor": {"firstBatch": batch, "id": id, "ns": ns}, "ok": 1.0})
}

/// A `getMore` on a tailable capped-collection cursor `id`: the documents
/// inserted since; an awaitData cursor waits up to the command's
/// `maxTimeMS` (default 1 s) for some (see the module doc).
pub fn get_more(
    ctx: &Ctx<'_>,
    cmd: &Document,
    id: i64,
    cursor: &mut Cursor,
    size: usize,
) -> CmdResult<Vec<Bson>> {
    let tail = cursor
        .source_mut()
        .as_tailable()
        .ok_or_else(|| CommandError::internal("not a tailable cursor"))?;
    let wait = super::changes::tailable_await(cmd, tail.await_data)?;
    let batch = super::changes::await_batch(ctx, wait, &WAITING, || {
        let batch = tail.next_batch(ctx, size)?;
        Ok((
            batch,
            tail.left == Some(0) || ctx.state.cursors.is_killed(id),
        ))
    })?;
    if tail.left == Some(0) {
        cursor.mark_exhausted();
    }
    Ok(batch)
}
