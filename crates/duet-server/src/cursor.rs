//! Server-side cursors: the rest of a query's result, handed out in batches by
//! `getMore`, until exhausted, killed, idle past the timeout, or their owner
//! goes away.
//!
//! A [`Cursor`] takes its documents from a [`CursorSource`]: the plug-in point
//! for where results come from. Two sources exist: [`StoredDocs`] (a find's
//! matching stored documents, shared `Arc`s, projected per batch) and
//! [`OwnedDocs`] (documents a command computed, e.g. an aggregate's result),
//! and change streams (`commands::changes::ChangeStream`, tailable: they
//! build their own batches and wait for new events in `getMore`), as do
//! oplog cursors (`commands::oplog`) and tailable cursors on capped
//! collections (`commands::tailable`). A
//! streaming source (a snapshot root and a position, reading as batches are
//! asked for) plugs in the same way: implement the trait, build the cursor
//! with [`Cursor::new`], and report what it holds in `held_bytes`.
//!
//! Invariants:
//! - ids are random positive 63-bit values (never 0, which means "no cursor"),
//!   unique among open cursors, so an id cannot be guessed from another;
//! - a cursor belongs to its owner: the logical session (`lsid`) of the
//!   command that opened it, or — without one — the connection, and under
//!   `--auth` the user that opened it. Only the owner may `getMore` or kill
//!   it; another user gets Unauthorized (13), other sessions MongoDB's
//!   50736 / 50737 / 50738, other connections Unauthorized (13), and an ownership
//!   check comes before anything that would reveal the cursor's namespace;
//!   `killCursors` of a cursor the caller does not own reports it in
//!   `cursorsNotFound`, as for an id that does not exist;
//! - a session-less cursor dies with its connection; a session's cursors
//!   live on (drivers pool connections) until exhausted, killed, the session
//!   ends (`endSessions`/`killSessions`) or the idle timeout;
//! - limits, checked when a cursor is opened: at most
//!   [`CursorLimits::per_connection`] open cursors opened by one connection,
//!   [`CursorLimits::max_cursors`] per server, and
//!   [`CursorLimits::max_bytes`] of memory held by all cursors (each
//!   source's `held_bytes`, after [`CursorSource::park`]); beyond them,
//!   ExceededMemoryLimit (146) naming the limit;
//! - a cursor in use by a `getMore` stays registered but is leased out, so
//!   two concurrent `getMore`s on one id cannot both read it (the second gets
//!   CursorNotFound) and a kill meanwhile takes effect when the lease ends;
//! - exhaustion is exact: after every batch the cursor reads one document
//!   ahead (unless the source is known to be empty), so a reply carries id 0
//!   exactly when nothing remains; an error met reading ahead is returned by
//!   the next `getMore`;
//! - a batch holds at most [`MAX_BATCH_BYTES`] of documents counted in real
//!   encoded bytes as it is built (at least one document, and a document
//!   past 16 MiB is refused with BSONObjectTooLarge), so every reply stays
//!   below the 48 MB message limit.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use bson::{Bson, Document, RawDocumentBuf};
use duetdb::lang::Projection;
use duetdb::raw::{array_element_len, document_len, DocRef, MAX_DOC_SIZE};
use duetdb::Snapshot;
use parking_lot::Mutex;
use rand::Rng;

use crate::error::{CmdResult, CommandError};
use crate::sessions::SessionId;

/// Most document bytes in one batch (MongoDB's 16 MiB batches).
pub const MAX_BATCH_BYTES: usize = 16 * 1024 * 1024;
/// Documents in a first batch when the client sets no `batchSize` (MongoDB's 101).
pub const DEFAULT_FIRST_BATCH: usize = 101;

/// Bytes a cursor reply adds around its batch: `{cursor: {nextBatch, id, ns,
/// atClusterTime}, ok}` with a namespace of at most 63 + 1 + 255 bytes.
const REPLY_OVERHEAD_BYTES: usize = 1024;
// A batch (at most MAX_BATCH_BYTES, or one document of at most 16 MiB) and
// its reply always fit in one message.
const _: () = assert!(MAX_BATCH_BYTES + REPLY_OVERHEAD_BYTES < crate::wire::MAX_MESSAGE_BYTES);
const _: () = assert!(MAX_DOC_SIZE + 16 + REPLY_OVERHEAD_BYTES < crate::wire::MAX_MESSAGE_BYTES);

/// Where a cursor's documents come from.
///
/// Requires: `next_doc` returns each document once, in result order, then
/// `None` for ever; an error ends the cursor (it is dropped). `held_bytes` is
/// the memory the source keeps alive that would be freed with it — not data
/// shared with the engine's stored versions — and is what the server's
/// cursor memory limit counts.
pub trait CursorSource: Send {
    /// The next document, ready to send (projection applied), or `None` once
    /// exhausted.
    fn next_doc(&mut self) -> CmdResult<Option<Document>>;
    /// Memory held now (see the trait's contract).
    fn held_bytes(&self) -> usize;
    /// `true` when no document remains, known without reading ahead (a
    /// source that cannot tell answers `false`, and the cursor reads ahead).
    fn known_empty(&self) -> bool {
        false
    }
    /// Called when the cursor is parked between batches: a source may
    /// compact what it holds (default: nothing to do).
    fn park(&mut self) -> CmdResult<()> {
        Ok(())
    }
    /// Run the next batch under this token (each `getMore` is its own
    /// command, with its own `maxTimeMS` and op id); default: nothing to cancel.
    fn set_cancel(&mut self, _token: duetdb::CancelToken) {}
    /// A change stream (tailable: never exhausted by running dry, batches
    /// built by `commands::changes`); default: not one.
    fn as_change_stream(&mut self) -> Option<&mut crate::commands::changes::ChangeStream> {
        None
    }
    /// An oplog view cursor (tailable or not: batches built by
    /// `commands::oplog`); default: not one.
    fn as_oplog(&mut self) -> Option<&mut crate::commands::oplog::OplogCursor> {
        None
    }
    /// A tailable cursor on a capped collection (batches built by
    /// `commands::tailable`); default: not one.
    fn as_tailable(&mut self) -> Option<&mut crate::commands::tailable::TailCursor> {
        None
    }
}

/// A find's result as the engine streams it (`duetdb::FindStream`): a lazy
/// walk over the held collection version (the default read, or `cow` when
/// the plan gives the order), a sorter's output merged from spilled runs on
/// demand, or a materialized result. It holds what the stream holds — a
/// position, not a result list, when it walks — so the cursor needs no
/// snapshot of its own; projection is applied per document.
pub struct FindSource {
    stream: duetdb::FindStream,
    projection: Option<Projection>,
}

impl FindSource {
    pub fn new(stream: duetdb::FindStream, projection: Option<Projection>) -> FindSource {
        FindSource { stream, projection }
    }
}

impl CursorSource for FindSource {
    fn next_doc(&mut self) -> CmdResult<Option<Document>> {
        match self.stream.next() {
            None => Ok(None),
            Some(Err(e)) => Err(e.into()),
            Some(Ok(raw)) => Ok(Some(match &self.projection {
                Some(p) => p.apply(&raw)?,
                None => duetdb::raw::to_document(&raw)?,
            })),
        }
    }

    fn held_bytes(&self) -> usize {
        self.stream.held_bytes()
    }

    fn set_cancel(&mut self, token: duetdb::CancelToken) {
        self.stream.set_cancel(token);
    }
}

/// A `$text` find's result as the engine streams it (`duetdb::TextStream`):
/// the matches pulled from the held collection version as batches are asked
/// for (projection and scores applied by the stream), or a sort's output.
pub struct TextSource {
    stream: duetdb::TextStream,
}

impl TextSource {
    pub fn new(stream: duetdb::TextStream) -> TextSource {
        TextSource { stream }
    }
}

impl CursorSource for TextSource {
    fn next_doc(&mut self) -> CmdResult<Option<Document>> {
        Ok(self.stream.next().transpose()?)
    }

    fn held_bytes(&self) -> usize {
        self.stream.held_bytes()
    }

    fn set_cancel(&mut self, token: duetdb::CancelToken) {
        self.stream.set_cancel(token);
    }
}

/// A find's matching stored documents (shared with the snapshot it read),
/// projected as they are handed out.
pub struct StoredDocs {
    docs: std::vec::IntoIter<DocRef>,
    /// The vector's buffer stays allocated until the source is dropped.
    buffer_bytes: usize,
    projection: Option<Projection>,
}

impl StoredDocs {
    pub fn new(docs: Vec<DocRef>, projection: Option<Projection>) -> StoredDocs {
        StoredDocs {
            buffer_bytes: docs.capacity() * std::mem::size_of::<DocRef>(),
            docs: docs.into_iter(),
            projection,
        }
    }
}

impl CursorSource for StoredDocs {
    fn next_doc(&mut self) -> CmdResult<Option<Document>> {
        let Some(raw) = self.docs.next() else {
            return Ok(None);
        };
        Ok(Some(match &self.projection {
            Some(p) => p.apply(&raw)?,
            None => duetdb::raw::to_document(&raw)?,
        }))
    }

    /// The pointer buffer only: the documents are the engine's stored
    /// versions, shared with the snapshot the cursor holds.
    fn held_bytes(&self) -> usize {
        self.buffer_bytes
    }

    fn known_empty(&self) -> bool {
        self.docs.len() == 0
    }
}

/// Documents a command computed (an aggregate's result). Parked, they are
/// kept serialized: an owned `Document` takes up to 25× its encoded size in
/// memory (measured: 1.2 KB for a 47-byte four-field document; 1.4× for
/// string-heavy ones), raw BSON 1× (`tests/cursor_memory.rs`).
pub struct OwnedDocs {
    state: Owned,
}

enum Owned {
    Docs(std::vec::IntoIter<Document>),
    Raw {
        docs: std::vec::IntoIter<RawDocumentBuf>,
        bytes: usize,
    },
}

impl OwnedDocs {
    pub fn new(docs: Vec<Document>) -> OwnedDocs {
        OwnedDocs {
            state: Owned::Docs(docs.into_iter()),
        }
    }
}

impl CursorSource for OwnedDocs {
    fn next_doc(&mut self) -> CmdResult<Option<Document>> {
        match &mut self.state {
            Owned::Docs(docs) => Ok(docs.next()),
            Owned::Raw { docs, bytes } => {
                let Some(raw) = docs.next() else {
                    return Ok(None);
                };
                *bytes = bytes.saturating_sub(raw_held(&raw));
                Ok(Some(duetdb::raw::to_document(&raw)?))
            }
        }
    }

    fn held_bytes(&self) -> usize {
        match &self.state {
            Owned::Docs(docs) => docs.as_slice().iter().map(owned_document_bytes).sum(),
            Owned::Raw { bytes, .. } => *bytes,
        }
    }

    fn known_empty(&self) -> bool {
        match &self.state {
            Owned::Docs(docs) => docs.len() == 0,
            Owned::Raw { docs, .. } => docs.len() == 0,
        }
    }

    fn park(&mut self) -> CmdResult<()> {
        let Owned::Docs(docs) = &mut self.state else {
            return Ok(());
        };
        let mut raw = Vec::with_capacity(docs.len());
        let mut bytes = 0;
        for d in docs.by_ref() {
            let r = to_raw_exact(&d)?;
            bytes += raw_held(&r);
            raw.push(r);
        }
        self.state = Owned::Raw {
            docs: raw.into_iter(),
            bytes,
        };
        Ok(())
    }
}

/// Serialize into a buffer of exactly the encoded size.
fn to_raw_exact(d: &Document) -> CmdResult<RawDocumentBuf> {
    let mut bytes = Vec::with_capacity(document_len(d));
    d.to_writer(&mut bytes)
        .map_err(|e| CommandError::internal(format!("cursor document: {e}")))?;
    RawDocumentBuf::from_bytes(bytes)
        .map_err(|e| CommandError::internal(format!("cursor document: {e}")))
}

fn raw_held(r: &RawDocumentBuf) -> usize {
    std::mem::size_of::<RawDocumentBuf>() + r.as_bytes().len()
}

/// Estimated heap bytes of an owned `Document`, calibrated against a counting
/// allocator (bson 3: `Bson` is 112 bytes, an index-map entry with its hash
/// slot ~176, a document's fixed part with its tables ~256); within ±25% of
/// measured for small, wide, nested and string-heavy documents.
pub fn owned_document_bytes(d: &Document) -> usize {
    fn doc_bytes<'a>(d: &'a Document, stack: &mut Vec<&'a Bson>) -> usize {
        let mut n = 256;
        for (k, v) in d {
            n += 176 + k.len();
            stack.push(v);
        }
        n
    }
    let mut stack: Vec<&Bson> = Vec::new();
    let mut total = doc_bytes(d, &mut stack);
    while let Some(v) = stack.pop() {
        total += match v {
            Bson::Document(d) => doc_bytes(d, &mut stack),
            Bson::Array(a) => {
                stack.extend(a.iter());
                32 + 112 * a.len()
            }
            Bson::String(s) | Bson::Symbol(s) | Bson::JavaScriptCode(s) => s.len(),
            Bson::Binary(b) => b.bytes.len(),
            Bson::RegularExpression(r) => r.pattern.len() + r.options.len(),
            Bson::JavaScriptCodeWithScope(c) => {
                stack.extend(c.scope.values());
                c.code.len() + 256 + 176 * c.scope.len()
            }
            _ => 0,
        };
    }
    total
}

/// The remainder of one query.
pub struct Cursor {
    pub ns: String,
    /// The connection that opened it (for the per-connection limit).
    pub conn: u64,
    /// Keeps the state the documents came from alive and identifies it.
    pub snapshot: Option<Snapshot>,
    source: Box<dyn CursorSource>,
    /// The next document (read ahead to know exhaustion exactly) and its
    /// encoded length.
    ahead: Option<(Document, usize)>,
    /// An error met while reading ahead: the next batch returns it.
    ahead_error: Option<CommandError>,
    /// The source returned `None`.
    done: bool,
    last_used: Instant,
}

impl Cursor {
    /// A cursor over any source.
    pub fn new(
        ns: String,
        conn: u64,
        snapshot: Option<Snapshot>,
        source: Box<dyn CursorSource>,
    ) -> Cursor {
        Cursor {
            ns,
            conn,
            snapshot,
            source,
            ahead: None,
            ahead_error: None,
            done: false,
            last_used: Instant::now(),
        }
    }

    /// A find's matching stored documents.
    pub fn from_docs(
        ns: String,
        conn: u64,
        snapshot: Option<Snapshot>,
        docs: Vec<DocRef>,
        projection: Option<Projection>,
    ) -> Cursor {
        Cursor::new(
            ns,
            conn,
            snapshot,
            Box::new(StoredDocs::new(docs, projection)),
        )
    }

    /// Documents the command computed.
    pub fn from_owned(ns: String, conn: u64, docs: Vec<Document>) -> Cursor {
        Cursor::new(ns, conn, None, Box::new(OwnedDocs::new(docs)))
    }

    /// The source, for sources that build their own batches (change streams).
    pub fn source_mut(&mut self) -> &mut dyn CursorSource {
        &mut *self.source
    }

    /// Close the cursor after this batch (a change stream that was invalidated).
    pub fn mark_exhausted(&mut self) {
        self.ahead = None;
        self.ahead_error = None;
        self.done = true;
    }

    /// The token the next batch runs under (its `getMore`'s).
    pub fn set_cancel(&mut self, token: duetdb::CancelToken) {
        self.source.set_cancel(token);
    }

    pub fn is_exhausted(&self) -> bool {
        self.ahead.is_none() && self.ahead_error.is_none() && self.done
    }

    /// Memory the cursor holds (its source's figure plus the document read ahead).
    pub fn held_bytes(&self) -> usize {
        self.source.held_bytes()
            + self
                .ahead
                .as_ref()
                .map_or(0, |(d, _)| owned_document_bytes(d))
    }

    fn pull(&mut self) -> CmdResult<Option<(Document, usize)>> {
        if self.done {
            return Ok(None);
        }
        match self.source.next_doc()? {
            Some(d) => {
                let len = document_len(&d);
                Ok(Some((d, len)))
            }
            None => {
                self.done = true;
                Ok(None)
            }
        }
    }

    /// The next batch of at most `max` documents (`usize::MAX` = as many as
    /// fit in [`MAX_BATCH_BYTES`]; 0 = an empty batch).
    pub fn next_batch(&mut self, max: usize) -> CmdResult<Vec<Bson>> {
        self.last_used = Instant::now();
        if let Some(e) = self.ahead_error.take() {
            self.done = true;
            return Err(e);
        }
        let mut out = Vec::new();
        let mut bytes = 0usize;
        while out.len() < max {
            let next = match self.ahead.take() {
                Some(x) => Some(x),
                None => self.pull()?,
            };
            let Some((doc, len)) = next else { break };
            if len > MAX_DOC_SIZE {
                return Err(CommandError::from(duetdb::Error::ValueTooLarge {
                    what: format!("a result document of {}", self.ns),
                    size: len,
                    limit: MAX_DOC_SIZE,
                }));
            }
            let elem = array_element_len(out.len(), &Bson::Null) + len;
            if !out.is_empty() && bytes + elem > MAX_BATCH_BYTES {
                self.ahead = Some((doc, len));
                break;
            }
            bytes += elem;
            out.push(Bson::Document(doc));
        }
        if self.ahead.is_none() && !self.done {
            if self.source.known_empty() {
                self.done = true;
            } else {
                match self.pull() {
                    Ok(next) => self.ahead = next,
                    Err(e) => self.ahead_error = Some(e),
                }
            }
        }
        Ok(out)
    }

    fn park(&mut self) -> CmdResult<()> {
        self.source.park()
    }
}

/// What holds a cursor: a session or a connection.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Holder {
    /// The logical session (`lsid.id`) of the command that opened it.
    Session(SessionId),
    /// The connection that opened it (no `lsid`).
    Connection(u64),
}

/// Who a cursor belongs to: its holder and, under `--auth`, the user that
/// opened it (`"<db>.<user>"`); another user may not use it, as in MongoDB.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Owner {
    pub holder: Holder,
    pub user: Option<String>,
}

impl Owner {
    /// The owner a command opens cursors for: its session, else its
    /// connection (no user: see `Ctx::cursor_owner`).
    pub fn of(lsid: Option<&SessionId>, conn: u64) -> Owner {
        match lsid {
            Some(id) => Owner::session(id.clone()),
            None => Owner::connection(conn),
        }
    }

    pub fn session(id: SessionId) -> Owner {
        Owner {
            holder: Holder::Session(id),
            user: None,
        }
    }

    pub fn connection(conn: u64) -> Owner {
        Owner {
            holder: Holder::Connection(conn),
            user: None,
        }
    }

    pub fn with_user(self, user: Option<String>) -> Owner {
        Owner { user, ..self }
    }
}

/// A session id as MongoDB prints it (a UUID), for messages.
fn show_session(id: &[u8]) -> String {
    if id.len() == 16 {
        let h: Vec<String> = id.iter().map(|b| format!("{b:02x}")).collect();
        format!(
            "{}-{}-{}-{}-{}",
            h[..4].concat(),
            h[4..6].concat(),
            h[6..8].concat(),
            h[8..10].concat(),
            h[10..].concat()
        )
    } else {
        id.iter().map(|b| format!("{b:02x}")).collect()
    }
}

/// May `who` use (getMore, kill) a cursor owned by `owner`? Another user's
/// cursor is Unauthorized (checked first, as MongoDB); then the error is
/// MongoDB's for the session cases, and a session-less cursor of another
/// connection is Unauthorized.
fn check_owner(id: i64, owner: &Owner, who: &Owner) -> CmdResult<()> {
    if owner.user != who.user {
        return Err(CommandError::new(
            13,
            "Unauthorized",
            format!("cursor id {id} was not created by the authenticated user"),
        ));
    }
    match (&owner.holder, &who.holder) {
        (Holder::Session(s), Holder::Session(t)) if s == t => Ok(()),
        (Holder::Session(s), Holder::Session(t)) => Err(CommandError::new(
            50738,
            "Location50738",
            format!(
                "Cannot run getMore on cursor {id}, which was created in session {}, in session {}",
                show_session(s),
                show_session(t)
            ),
        )),
        (Holder::Session(s), Holder::Connection(_)) => Err(CommandError::new(
            50737,
            "Location50737",
            format!(
                "Cannot run getMore on cursor {id}, which was created in session {}, without an lsid",
                show_session(s)
            ),
        )),
        (Holder::Connection(_), Holder::Session(t)) => Err(CommandError::new(
            50736,
            "Location50736",
            format!(
                "Cannot run getMore on cursor {id}, which was not created in a session, in session {}",
                show_session(t)
            ),
        )),
        (Holder::Connection(c), Holder::Connection(d)) if c == d => Ok(()),
        (Holder::Connection(_), Holder::Connection(_)) => Err(CommandError::new(
            13,
            "Unauthorized",
            format!(
                "cursor {id} belongs to another connection (a cursor opened without a session is its connection's)"
            ),
        )),
    }
}

/// The limits on open cursors.
#[derive(Debug, Clone, Copy)]
pub struct CursorLimits {
    /// Open cursors opened by one connection.
    pub per_connection: usize,
    /// Open cursors in the whole server.
    pub max_cursors: usize,
    /// Bytes held by all open cursors.
    pub max_bytes: usize,
}

/// What `kill` found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Killed {
    Killed,
    /// No such cursor, or not the caller's.
    NotFound,
}

struct Slot {
    owner: Owner,
    conn: u64,
    ns: String,
    /// `None` while a `getMore` holds it.
    cursor: Option<Cursor>,
    /// Bytes counted against the memory limit.
    charged: usize,
    /// Killed while leased: dropped when the lease ends.
    killed: bool,
    last_used: Instant,
}

struct Inner {
    cursors: HashMap<i64, Slot>,
    per_conn: HashMap<u64, usize>,
    held_total: usize,
}

/// All open cursors of a server.
pub struct CursorRegistry {
    inner: Mutex<Inner>,
    pub limits: CursorLimits,
    pub idle_timeout: Duration,
}

/// A cursor taken out by a `getMore`: give it back with [`Lease::finish`];
/// dropped otherwise (an error ended it), the cursor is closed.
pub struct Lease<'a> {
    reg: &'a CursorRegistry,
    id: i64,
    cursor: Option<Cursor>,
}

impl Lease<'_> {
    pub fn cursor(&mut self) -> CmdResult<&mut Cursor> {
        self.cursor
            .as_mut()
            .ok_or_else(|| CommandError::internal("cursor lease already finished"))
    }

    /// Return the cursor to the registry; returns the id to report (0 when it
    /// is exhausted or was killed meanwhile, and is closed).
    pub fn finish(mut self) -> i64 {
        match self.cursor.take() {
            Some(c) => self.reg.check_in(self.id, c),
            None => 0,
        }
    }
}

impl Drop for Lease<'_> {
    fn drop(&mut self) {
        if self.cursor.take().is_some() {
            self.reg.remove(self.id);
        }
    }
}

impl CursorRegistry {
    pub fn new(limits: CursorLimits, idle_timeout: Duration) -> CursorRegistry {
        CursorRegistry {
            inner: Mutex::new(Inner {
                cursors: HashMap::new(),
                per_conn: HashMap::new(),
                held_total: 0,
            }),
            limits,
            idle_timeout,
        }
    }

    fn limit_error(msg: String) -> CommandError {
        CommandError::new(146, "ExceededMemoryLimit", msg)
    }

    /// Register a cursor that still has documents, for `owner`; returns its id.
    pub fn open(&self, mut cursor: Cursor, owner: Owner) -> CmdResult<i64> {
        cursor.park()?;
        let held = cursor.held_bytes();
        let mut g = self.inner.lock();
        let by_conn = g.per_conn.get(&cursor.conn).copied().unwrap_or(0);
        if by_conn >= self.limits.per_connection {
            return Err(Self::limit_error(format!(
                "too many open cursors on this connection (limit {}); exhaust or kill some",
                self.limits.per_connection
            )));
        }
        if g.cursors.len() >= self.limits.max_cursors {
            return Err(Self::limit_error(format!(
                "too many open cursors on this server (limit {}, --max-cursors); exhaust or kill some",
                self.limits.max_cursors
            )));
        }
        if g.held_total.saturating_add(held) > self.limits.max_bytes {
            return Err(Self::limit_error(format!(
                "open cursors would hold {} bytes, above the server's limit of {} bytes \
                 (--max-cursor-memory-mb); exhaust or kill cursors, or ask for the whole result in the first batch",
                g.held_total.saturating_add(held),
                self.limits.max_bytes
            )));
        }
        let mut rng = rand::thread_rng();
        let id = loop {
            let id = rng.gen_range(1..=i64::MAX);
            if !g.cursors.contains_key(&id) {
                break id;
            }
        };
        *g.per_conn.entry(cursor.conn).or_insert(0) += 1;
        g.held_total += held;
        g.cursors.insert(
            id,
            Slot {
                owner,
                conn: cursor.conn,
                ns: cursor.ns.clone(),
                last_used: Instant::now(),
                cursor: Some(cursor),
                charged: held,
                killed: false,
            },
        );
        Ok(id)
    }

    /// Lease cursor `id` to a `getMore` by `who` on namespace `ns`.
    pub fn lease(&self, id: i64, who: &Owner, ns: &str) -> CmdResult<Lease<'_>> {
        let mut g = self.inner.lock();
        let slot = g
            .cursors
            .get_mut(&id)
            .filter(|s| !s.killed)
            .ok_or_else(|| CommandError::cursor_not_found(id))?;
        // Ownership first: only the owner may learn the cursor's namespace.
        check_owner(id, &slot.owner, who)?;
        if slot.ns != ns {
            return Err(CommandError::new(
                13,
                "Unauthorized",
                format!(
                    "Requested getMore on namespace '{ns}', but cursor {id} belongs to a different namespace {}",
                    slot.ns
                ),
            ));
        }
        let cursor = slot
            .cursor
            .take()
            .ok_or_else(|| CommandError::cursor_not_found(id))?;
        Ok(Lease {
            reg: self,
            id,
            cursor: Some(cursor),
        })
    }

    /// End a lease: keep the cursor when more remains and it was not killed.
    fn check_in(&self, id: i64, mut cursor: Cursor) -> i64 {
        if cursor.is_exhausted() || cursor.park().is_err() {
            self.remove(id);
            return 0;
        }
        let held = cursor.held_bytes();
        let mut g = self.inner.lock();
        let killed = match g.cursors.get(&id) {
            None => return 0,
            Some(slot) => slot.killed,
        };
        if killed {
            Self::remove_locked(&mut g, id);
            drop(g);
            return 0;
        }
        let g = &mut *g;
        let Some(slot) = g.cursors.get_mut(&id) else {
            return 0;
        };
        g.held_total = g.held_total - slot.charged + held;
        slot.charged = held;
        slot.last_used = Instant::now();
        slot.cursor = Some(cursor);
        id
    }

    fn remove(&self, id: i64) {
        let mut g = self.inner.lock();
        Self::remove_locked(&mut g, id);
    }

    /// Remove a slot and uncharge it; the cursor (if parked) is returned so
    /// the caller drops it outside the lock.
    fn remove_locked(g: &mut Inner, id: i64) -> Option<Cursor> {
        let slot = g.cursors.remove(&id)?;
        g.held_total -= slot.charged;
        if let Some(n) = g.per_conn.get_mut(&slot.conn) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                g.per_conn.remove(&slot.conn);
            }
        }
        slot.cursor
    }

    /// Whether cursor `id` was killed while leased (a waiting `getMore`
    /// stops waiting), or is gone.
    pub fn is_killed(&self, id: i64) -> bool {
        self.inner.lock().cursors.get(&id).is_none_or(|s| s.killed)
    }

    /// Kill cursor `id` if `who` owns it (and it is on `ns`).
    pub fn kill(&self, id: i64, who: &Owner, ns: &str) -> Killed {
        let dropped;
        {
            let mut g = self.inner.lock();
            let Some(slot) = g.cursors.get_mut(&id) else {
                return Killed::NotFound;
            };
            if slot.killed || slot.ns != ns || check_owner(id, &slot.owner, who).is_err() {
                return Killed::NotFound;
            }
            if slot.cursor.is_none() {
                // Leased: the getMore in flight answers, then it is dropped.
                slot.killed = true;
                return Killed::Killed;
            }
            dropped = Self::remove_locked(&mut g, id);
        }
        drop(dropped);
        Killed::Killed
    }

    /// Kill every cursor whose owner matches; returns how many.
    fn kill_where(&self, pred: impl Fn(&Owner) -> bool) -> usize {
        let mut dropped = Vec::new();
        {
            let mut g = self.inner.lock();
            let ids: Vec<i64> = g
                .cursors
                .iter()
                .filter(|(_, s)| !s.killed && pred(&s.owner))
                .map(|(id, _)| *id)
                .collect();
            for id in &ids {
                let leased = g.cursors.get(id).is_some_and(|s| s.cursor.is_none());
                if leased {
                    if let Some(s) = g.cursors.get_mut(id) {
                        s.killed = true;
                    }
                } else {
                    dropped.extend(Self::remove_locked(&mut g, *id));
                }
            }
            ids.len()
        }
        // Cursors (and the snapshots they hold) are released outside the lock.
    }

    /// The connection closed: kill its session-less cursors.
    pub fn kill_connection(&self, conn: u64) -> usize {
        self.kill_where(|o| o.holder == Holder::Connection(conn))
    }

    /// Sessions ended: kill their cursors.
    pub fn kill_sessions(&self, ids: &[SessionId]) -> usize {
        self.kill_where(|o| matches!(&o.holder, Holder::Session(s) if ids.contains(s)))
    }

    /// Every session ended (`killAllSessions`, `killSessions: []`).
    pub fn kill_all_sessions(&self) -> usize {
        self.kill_where(|o| matches!(o.holder, Holder::Session(_)))
    }

    pub fn len(&self) -> usize {
        self.inner.lock().cursors.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Bytes held by open cursors (what the memory limit counts).
    pub fn held_bytes(&self) -> usize {
        self.inner.lock().held_total
    }

    /// Drop cursors idle longer than the timeout; returns how many.
    pub fn reap_idle(&self) -> usize {
        let now = Instant::now();
        let mut dropped = Vec::new();
        let mut g = self.inner.lock();
        let idle: Vec<i64> = g
            .cursors
            .iter()
            .filter(|(_, s)| {
                s.cursor.is_some() && now.duration_since(s.last_used) > self.idle_timeout
            })
            .map(|(id, _)| *id)
            .collect();
        for id in &idle {
            dropped.extend(Self::remove_locked(&mut g, *id));
        }
        drop(g);
        idle.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bson::doc;

    fn limits(per_connection: usize) -> CursorLimits {
        CursorLimits {
            per_connection,
            max_cursors: 100,
            max_bytes: usize::MAX,
        }
    }

    fn owned(n: i32) -> Cursor {
        Cursor::from_owned("t.c".into(), 1, (0..n).map(|i| doc! {"i": i}).collect())
    }

    #[test]
    fn batches_limits_and_idle_reaping() {
        let reg = CursorRegistry::new(limits(2), Duration::from_millis(0));
        let me = Owner::connection(1);
        let mut c = owned(5);
        assert_eq!(c.next_batch(2).expect("batch").len(), 2);
        let id = reg.open(c, me.clone()).expect("open");
        assert!(id > 0);
        reg.open(owned(1), me.clone()).expect("second");
        assert_eq!(reg.open(owned(1), me.clone()).expect_err("third").code, 146);
        let mut lease = reg.lease(id, &me, "t.c").expect("lease");
        assert_eq!(
            lease
                .cursor()
                .expect("c")
                .next_batch(usize::MAX)
                .expect("rest")
                .len(),
            3
        );
        assert_eq!(lease.finish(), 0, "exhausted: closed");
        assert!(reg.lease(id, &me, "t.c").is_err());
        std::thread::sleep(Duration::from_millis(2));
        assert_eq!(reg.reap_idle(), 1);
        assert!(reg.is_empty());
        assert_eq!(reg.held_bytes(), 0);
    }

    #[test]
    fn exhaustion_is_exact_and_batches_fit() {
        // Exactly as many documents as the batch: id 0 at once.
        let mut c = owned(3);
        assert_eq!(c.next_batch(3).expect("batch").len(), 3);
        assert!(c.is_exhausted());
        let mut c = owned(0);
        assert!(c.next_batch(0).expect("empty").is_empty());
        assert!(c.is_exhausted());
        // Large documents: a batch stops before 16 MiB of real bytes.
        let big = "x".repeat(5 << 20);
        let mut c = Cursor::from_owned(
            "t.c".into(),
            1,
            (0..5).map(|i| doc! {"i": i, "s": &big}).collect(),
        );
        let b = c.next_batch(usize::MAX).expect("batch");
        assert_eq!(b.len(), 3);
        assert!(!c.is_exhausted());
        assert_eq!(c.next_batch(usize::MAX).expect("rest").len(), 2);
        assert!(c.is_exhausted());
        // A document above 16 MiB is refused, not sent.
        let huge = "x".repeat(MAX_DOC_SIZE);
        let mut c = Cursor::from_owned("t.c".into(), 1, vec![doc! {"s": huge}]);
        assert_eq!(c.next_batch(1).expect_err("too large").code, 10334);
    }

    #[test]
    fn owners_and_ids() {
        let reg = CursorRegistry::new(limits(100), Duration::from_secs(60));
        let a = Owner::session(vec![1; 16]);
        let b = Owner::session(vec![2; 16]);
        let c1 = Owner::connection(1);
        let c2 = Owner::connection(2);
        let open = |o: &Owner| {
            let mut c = owned(3);
            c.next_batch(1).expect("first");
            reg.open(c, o.clone()).expect("open")
        };
        let sa = open(&a);
        let s1 = open(&c1);
        let code = |id: i64, who: &Owner| match reg.lease(id, who, "t.c") {
            // Given back untouched: still open.
            Ok(lease) => {
                assert_eq!(lease.finish(), id);
                None
            }
            Err(e) => Some(e.code),
        };
        assert_eq!(code(sa, &b), Some(50738));
        assert_eq!(code(sa, &c1), Some(50737));
        assert_eq!(code(s1, &a), Some(50736));
        assert_eq!(code(s1, &c2), Some(13));
        assert_eq!(code(s1, &c1), None);
        assert_eq!(code(sa, &a), None);
        // Not the owner: reported as not found, and the cursor lives on.
        assert_eq!(reg.kill(sa, &b, "t.c"), Killed::NotFound);
        assert_eq!(reg.kill(sa, &a, "x.y"), Killed::NotFound);
        assert_eq!(reg.len(), 2);
        // A closed connection takes its session-less cursors, not sessions'.
        assert_eq!(reg.kill_connection(1), 1);
        assert_eq!(reg.len(), 1);
        assert_eq!(reg.kill_sessions(&[vec![1; 16]]), 1);
        assert!(reg.is_empty());
        // Ids: random, positive, distinct.
        let ids: std::collections::HashSet<i64> = (0..50).map(|_| open(&c1)).collect();
        assert_eq!(ids.len(), 50);
        assert!(ids.iter().all(|i| *i > 0));
        let max = ids.iter().max().copied().unwrap_or(0);
        assert!(max > 1 << 40, "ids are not sequential: {max}");
    }

    #[test]
    fn another_users_cursor_is_unauthorized() {
        let reg = CursorRegistry::new(limits(100), Duration::from_secs(60));
        let ann = Owner::session(vec![1; 16]).with_user(Some("app.ann".into()));
        let mut c = owned(3);
        c.next_batch(1).expect("first");
        let id = reg.open(c, ann.clone()).expect("open");
        // Same session id, another user (or none): refused before the
        // session check, and killCursors treats it as unknown.
        for who in [
            Owner::session(vec![1; 16]).with_user(Some("app.bob".into())),
            Owner::session(vec![1; 16]),
        ] {
            let err = reg
                .lease(id, &who, "t.c")
                .err()
                .map(|e| (e.code, e.message));
            assert_eq!(
                err,
                Some((
                    13,
                    format!("cursor id {id} was not created by the authenticated user")
                ))
            );
            assert_eq!(reg.kill(id, &who, "t.c"), Killed::NotFound);
        }
        let lease = reg.lease(id, &ann, "t.c").expect("the owner");
        assert_eq!(lease.finish(), id);
    }

    #[test]
    fn a_kill_during_a_lease_closes_it_after() {
        let reg = CursorRegistry::new(limits(100), Duration::from_secs(60));
        let me = Owner::connection(7);
        let mut c = owned(10);
        c.next_batch(1).expect("first");
        let id = reg.open(c, me.clone()).expect("open");
        let mut lease = reg.lease(id, &me, "t.c").expect("lease");
        assert!(reg.lease(id, &me, "t.c").is_err(), "in use");
        assert_eq!(reg.kill(id, &me, "t.c"), Killed::Killed);
        lease.cursor().expect("c").next_batch(1).expect("batch");
        assert_eq!(lease.finish(), 0);
        assert!(reg.is_empty());
        assert_eq!(reg.held_bytes(), 0);
    }

    #[test]
    fn memory_and_count_limits() {
        let reg = CursorRegistry::new(
            CursorLimits {
                per_connection: 100,
                max_cursors: 3,
                max_bytes: 10_000,
            },
            Duration::from_secs(60),
        );
        let me = Owner::connection(1);
        // Parked owned documents are held serialized: ~24 + 14 bytes each.
        let mut c = owned(1000);
        c.next_batch(1).expect("first");
        let e = reg.open(c, me.clone()).expect_err("over the memory limit");
        assert_eq!(e.code, 146);
        assert!(
            e.message.contains("--max-cursor-memory-mb"),
            "{}",
            e.message
        );
        assert_eq!(reg.held_bytes(), 0);
        for _ in 0..3 {
            let mut c = owned(10);
            c.next_batch(1).expect("first");
            reg.open(c, me.clone()).expect("fits");
        }
        assert!(reg.held_bytes() > 0);
        let mut c = owned(10);
        c.next_batch(1).expect("first");
        let e = reg.open(c, me).expect_err("over the count limit");
        assert!(e.message.contains("--max-cursors"), "{}", e.message);
    }
}
