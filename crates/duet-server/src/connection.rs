//! One client connection: read a message, execute it, write the reply, until
//! the peer closes, a frame is unreadable, or the server shuts down.
//!
//! Invariants:
//! - a malformed message whose frame is intact gets an error reply and the
//!   connection goes on (frame boundaries are still known); an unreadable frame
//!   (bad length, truncation, timeout) or an unknown opcode closes the
//!   connection, with the reason logged;
//! - commands run on blocking threads (`spawn_blocking`), except the few
//!   that never wait, scan or write (`ping`, the handshake, a `find` by one
//!   `_id` value: [`runs_inline`]), which run on the connection's task, and
//!   writes whose work is bounded (inserts, statements by one `_id` value,
//!   no `maxTimeMS`, standalone: [`is_point_write`]), which run in place on
//!   the connection's worker thread after it hands its other tasks away
//!   (`block_in_place`); a panic in any (a bug) becomes an InternalError
//!   reply, never a crashed server;
//! - a reply is serialized once, into the buffer that is sent (header room,
//!   opcode prefix, document), and written with one `write`; a find by one
//!   `_id` answered from stored bytes (`read::point_find`) has its document
//!   copied from the store straight into that buffer, never decoded;
//! - every command runs under a cancellation token, listed in the server's
//!   operation registry (`currentOp`) until its blocking thread returns. The
//!   token carries the `maxTimeMS` deadline (the engine's reads check it once
//!   per page and fail with MaxTimeMSExpired, 50); `killOp` cancels it
//!   (Interrupted, 11601), and so does the client closing its connection
//!   while the command runs (ClientDisconnect, 279: nobody reads that reply;
//!   except `createIndexes`, whose build goes on as MongoDB's does:
//!   `ops::SURVIVE_DISCONNECT`) and shutdown (InterruptedAtShutdown, 11600). Work never outlives its
//!   request: a cancelled read stops within a page; a write already
//!   submitted to the writer may still commit, as with MongoDB;
//! - past `maxTimeMS` the client gets 50 even if the command ignored its
//!   token (a write waiting for the writer): the token is cancelled and the
//!   reply waits at most [`CANCEL_GRACE`] for the command to end, so a reply
//!   normally comes after its work stopped;
//! - on shutdown the connection finishes the command in flight (cancelled),
//!   then closes;
//! - a connection with no message in flight for the idle timeout is closed;
//! - when the connection ends, its session-less cursors are killed (a
//!   session's cursors outlive it: drivers pool connections);
//! - no reply is larger than one message: a reply document that would not
//!   fit becomes BSONObjectTooLarge (10334);
//! - a write command waits while an `fsync` lock is held (cancellable like
//!   any command);
//! - every command is counted when it ends (`top`, the metrics) and one
//!   lasting `slowOpThresholdMs` (`--slow-ms`, 100) or more is logged as
//!   "Slow query" with its namespace, duration, plan summary and snapshot
//!   strategy;
//! - a client closing its connection (between messages, or with a reset) is
//!   logged at debug level, never as a warning;
//! - an `OP_COMPRESSED` request is unwrapped before anything else
//!   (`compression.rs`); one that cannot be (a compressor not offered, a
//!   size that does not match) closes the connection like an unreadable
//!   frame; its reply goes back compressed with the same compressor unless
//!   the command is one the specification keeps uncompressed.

use std::sync::Arc;
use std::time::{Duration, Instant};

use bson::{doc, Bson, Document};
use duetdb::{CancelReason, CancelToken};
use tokio::io::AsyncWriteExt;
use tokio::sync::watch;

use crate::commands;
use crate::commands::read::{RawCursor, RawCursorSlot};
use crate::error::CommandError;
use crate::state::{ConnInfo, ServerState};
use crate::tls::Stream;
use crate::wire::{self, Frame, FrameError, OP_COMPRESSED, OP_MSG, OP_QUERY, OP_REPLY};
use crate::{compression, opmsg, opquery};

/// Serve one connection (plain or TLS, after its handshake) to completion.
pub async fn serve(
    state: Arc<ServerState>,
    mut stream: Stream,
    conn: ConnInfo,
    mut shutdown: watch::Receiver<bool>,
) {
    let mut next_reply_id: i32 = 1;
    let timeouts = wire::Timeouts {
        idle: state.config.idle_timeout,
        message: state.config.message_timeout,
    };
    loop {
        if *shutdown.borrow() {
            break;
        }
        let frame = tokio::select! {
            r = wire::read_frame(&mut stream, timeouts, &state.incomplete) => r,
            _ = shutdown.changed() => break,
        };
        let frame = match frame {
            Ok(f) => f,
            Err(FrameError::Closed) => {
                tracing::debug!(conn = conn.id, "client closed the connection");
                break;
            }
            Err(e @ FrameError::Idle(_)) => {
                tracing::info!(conn = conn.id, peer = %conn.peer, reason = %e, "closing idle connection");
                break;
            }
            Err(FrameError::Io(e)) if client_went_away(&e) => {
                tracing::debug!(conn = conn.id, peer = %conn.peer, reason = %e, "client closed the connection");
                break;
            }
            Err(e) => {
                tracing::warn!(conn = conn.id, peer = %conn.peer, reason = %e, "closing connection");
                break;
            }
        };
        let (frame, compressor) = if frame.header.op_code == OP_COMPRESSED {
            match compression::decompress(&frame, &state.config.compressors) {
                Ok((inner, c)) => (inner, Some(c)),
                Err(e) => {
                    tracing::warn!(conn = conn.id, peer = %conn.peer, reason = %e,
                        "closing connection: unreadable OP_COMPRESSED message");
                    break;
                }
            }
        } else {
            (frame, None)
        };
        let op_code = frame.header.op_code;
        if op_code != OP_MSG && op_code != OP_QUERY {
            tracing::warn!(conn = conn.id, peer = %conn.peer, op_code,
                "closing connection: unsupported opcode (legacy opcodes other than OP_QUERY are not served)");
            break;
        }
        let handled = async {
            if op_code == OP_MSG {
                handle_msg(&state, &conn, &frame).await
            } else {
                handle_query(&state, &conn, &frame).await
            }
        };
        // A client that closes its connection while its command runs gets
        // the command cancelled (nobody will read the reply), except an
        // index build, which goes on (`ops::SURVIVE_DISCONNECT`).
        let reply = tokio::select! {
            r = handled => r,
            _ = stream.peer_closed() => {
                let n = state.operations.kill_connection(conn.id, CancelReason::ClientDisconnected);
                tracing::debug!(conn = conn.id, cancelled = n, "client closed the connection during a command");
                break;
            }
        };
        let Some(reply) = reply else {
            continue;
        };
        let (reply_id, response_to) = (next_reply_id, frame.header.request_id);
        next_reply_id = next_reply_id.wrapping_add(1);
        // A reply is compressed as its request was (the specification's
        // rule), except for the handshake and authentication commands.
        let bytes = compressor
            .filter(|_| reply.compressible)
            .and_then(|c| {
                compression::frame_compressed(
                    c,
                    reply_id,
                    response_to,
                    reply.op_code,
                    &reply.message[wire::HEADER_LEN..],
                )
            })
            .unwrap_or_else(|| reply.with_header(reply_id, response_to));
        drop(frame);
        // TLS buffers records: the flush sends them (a no-op on plain TCP).
        let written = async {
            stream.write_all(&bytes).await?;
            stream.flush().await
        };
        if let Err(e) = written.await {
            tracing::debug!(conn = conn.id, error = %e, "write failed; closing");
            break;
        }
    }
    // Session-less cursors belong to their connection: they end with it.
    let killed = state.cursors.kill_connection(conn.id);
    if killed > 0 {
        tracing::debug!(
            conn = conn.id,
            cursors = killed,
            "closed the connection's cursors"
        );
    }
}

/// Whether an I/O error only says the client went away (reset, broken
/// pipe): ordinary for clients that close without a goodbye.
fn client_went_away(e: &std::io::Error) -> bool {
    use std::io::ErrorKind::*;
    matches!(
        e.kind(),
        ConnectionReset | ConnectionAborted | BrokenPipe | UnexpectedEof
    )
}

/// Largest reply document: the reply must fit in one message with its
/// OP_MSG / OP_REPLY framing (at most 36 bytes).
const MAX_REPLY_DOC_BYTES: usize = wire::MAX_MESSAGE_BYTES - 64;

/// A command's reply: its document and, for a find by one `_id` answered
/// from stored bytes (`read::point_find`), its cursor, which goes first.
struct Answer {
    doc: Document,
    cursor: Option<RawCursor>,
}

impl Answer {
    fn of(doc: Document) -> Answer {
        Answer { doc, cursor: None }
    }
}

/// The reply message's bytes, built in one buffer so a reply is copied once
/// and sent with one `write`: room for the header (filled in when it is
/// sent, [`Reply::with_header`]), the opcode's `prefix`, then the reply
/// document. A reply that could not be sent in one message becomes a
/// BSONObjectTooLarge error (cursor batches are bounded as they are built,
/// see `cursor.rs`; this guards every other reply).
fn serialize(prefix: &[u8], answer: &Answer) -> Vec<u8> {
    let doc = &answer.doc;
    let start = wire::HEADER_LEN + prefix.len();
    // A raw cursor goes with a successful reply only (the command's `ok`,
    // then the cluster time); anything else is answered as it stands.
    let raw = answer
        .cursor
        .as_ref()
        .filter(|_| matches!(doc.get("ok"), Some(Bson::Double(v)) if *v == 1.0))
        .filter(|_| !doc.contains_key("cursor"));
    let size = duetdb::raw::document_len(doc) + raw.map_or(0, raw_cursor_len);
    let mut out = Vec::with_capacity(start + size);
    out.resize(wire::HEADER_LEN, 0);
    out.extend_from_slice(prefix);
    let err = if size > MAX_REPLY_DOC_BYTES {
        CommandError::new(
            10334,
            "BSONObjectTooLarge",
            format!(
                "the reply would be {size} bytes, above the {}-byte message limit",
                wire::MAX_MESSAGE_BYTES
            ),
        )
    } else {
        let written = match raw {
            None => doc.to_writer(&mut out).is_ok(),
            Some(c) => write_with_cursor(&mut out, c, doc),
        };
        if written {
            return out;
        }
        out.truncate(start);
        CommandError::internal("reply could not be serialized")
    };
    let _ = err.to_reply().to_writer(&mut out);
    out
}

/// The bytes of the element `cursor: {firstBatch: [doc], id: 0, ns}`.
fn raw_cursor_len(c: &RawCursor) -> usize {
    let batch = 4 + c.doc.as_ref().map_or(0, |d| 3 + d.as_bytes().len()) + 1;
    let cursor = 4 + (12 + batch) + (4 + 8) + (4 + 4 + c.ns.len() + 1) + 1;
    8 + cursor
}

/// Append the reply document `{cursor: {firstBatch: [doc], id: 0, ns},
/// ...rest}` to `out`: the stored document's bytes copied once, straight
/// into the buffer that is sent. The same bytes as serializing
/// `{cursor: {firstBatch: [<doc decoded>], id: 0_i64, ns}}` followed by
/// `rest`'s fields.
fn write_with_cursor(out: &mut Vec<u8>, c: &RawCursor, rest: &Document) -> bool {
    fn patch_len(out: &mut [u8], at: usize) {
        let len = (out.len() - at) as i32;
        out[at..at + 4].copy_from_slice(&len.to_le_bytes());
    }
    let reply = out.len();
    out.extend_from_slice(&[0; 4]);
    out.push(0x03);
    out.extend_from_slice(b"cursor\0");
    let cursor = out.len();
    out.extend_from_slice(&[0; 4]);
    out.push(0x04);
    out.extend_from_slice(b"firstBatch\0");
    let batch = out.len();
    out.extend_from_slice(&[0; 4]);
    if let Some(d) = &c.doc {
        out.push(0x03);
        out.extend_from_slice(b"0\0");
        out.extend_from_slice(d.as_bytes());
    }
    out.push(0);
    patch_len(out, batch);
    out.push(0x12);
    out.extend_from_slice(b"id\0");
    out.extend_from_slice(&0i64.to_le_bytes());
    out.push(0x02);
    out.extend_from_slice(b"ns\0");
    out.extend_from_slice(&((c.ns.len() + 1) as i32).to_le_bytes());
    out.extend_from_slice(c.ns.as_bytes());
    out.push(0);
    out.push(0);
    patch_len(out, cursor);
    // `rest`'s fields and terminator, without its own length.
    let fields = out.len();
    if rest.to_writer(&mut *out).is_err() {
        return false;
    }
    out.drain(fields..fields + 4);
    patch_len(out, reply);
    true
}

/// A reply message (its header not yet written), and whether it may be
/// compressed.
struct Reply {
    op_code: i32,
    /// [`wire::HEADER_LEN`] bytes of room for the header, then the body.
    message: Vec<u8>,
    /// False for the commands the compression specification keeps
    /// uncompressed (`compression::must_not_compress`).
    compressible: bool,
}

impl Reply {
    /// The message with its header written in place.
    fn with_header(mut self, request_id: i32, response_to: i32) -> Vec<u8> {
        let total = self.message.len().min(i32::MAX as usize) as i32;
        let header = wire::Header {
            message_length: total,
            request_id,
            response_to,
            op_code: self.op_code,
        };
        self.message[..wire::HEADER_LEN].copy_from_slice(&header.bytes());
        self.message
    }
}

/// Whether the reply to `cmd` may be compressed.
fn compressible(cmd: &Document) -> bool {
    commands::command_name(cmd).is_none_or(|n| !compression::must_not_compress(n))
}

async fn handle_msg(state: &Arc<ServerState>, conn: &ConnInfo, frame: &Frame) -> Option<Reply> {
    let more_to_come = opmsg::peek_flags(&frame.body) & opmsg::FLAG_MORE_TO_COME != 0;
    let mut may_compress = true;
    let reply = match opmsg::decode(&frame.header, &frame.body) {
        Ok(req) => match req.command.get("$db") {
            Some(Bson::String(db)) => {
                let db = db.clone();
                may_compress = compressible(&req.command);
                run_command(state, conn, db, req.command).await
            }
            _ => Answer::of(
                CommandError::new(
                    40571,
                    "Location40571",
                    "OP_MSG requests require a $db argument",
                )
                .to_reply(),
            ),
        },
        Err(e) => {
            tracing::debug!(conn = conn.id, error = %e.message, "malformed OP_MSG");
            Answer::of(CommandError::from(e).to_reply())
        }
    };
    if more_to_come {
        return None;
    }
    Some(Reply {
        op_code: OP_MSG,
        message: serialize(&opmsg::REPLY_PREFIX, &reply),
        compressible: may_compress,
    })
}

async fn handle_query(state: &Arc<ServerState>, conn: &ConnInfo, frame: &Frame) -> Option<Reply> {
    let mut may_compress = true;
    let (flags, reply) = match opquery::decode(&frame.body) {
        Ok(q) => {
            may_compress = compressible(&q.command);
            (0, run_command(state, conn, q.db, q.command).await)
        }
        Err(e) => {
            tracing::debug!(conn = conn.id, error = %e.message, "malformed OP_QUERY");
            (
                opquery::REPLY_QUERY_FAILURE,
                Answer::of(doc! {"$err": e.message.clone(), "code": e.code, "ok": 0.0}),
            )
        }
    };
    Some(Reply {
        op_code: OP_REPLY,
        message: serialize(&opquery::reply_prefix(flags), &reply),
        compressible: may_compress,
    })
}

/// Count a finished command (`top`, metrics) and log it when slow.
#[allow(clippy::too_many_arguments)]
fn finished(
    state: &Arc<ServerState>,
    conn: &ConnInfo,
    db: &str,
    cmd: &Document,
    name: &str,
    reply: &Document,
    started: Instant,
    report: &crate::ops::OpReport,
) {
    let elapsed = started.elapsed();
    let ok = matches!(reply.get("ok"), Some(Bson::Double(v)) if *v == 1.0)
        || matches!(reply.get("ok"), Some(Bson::Int32(1)));
    state.metrics.record(name, elapsed.as_secs_f64(), ok);
    let ns = crate::ops::namespace(db, cmd);
    let micros = elapsed.as_micros().min(u128::from(u64::MAX)) as u64;
    state.top.record(&ns, name, micros);
    let slow_ms = state.params.slow_ms();
    if elapsed < Duration::from_millis(slow_ms) {
        return;
    }
    let note = report.read();
    let (plan, strategy) = match &note {
        Some(n) => {
            let (plan, chosen) =
                commands::currentop::plan_summary(state, conn, n).unwrap_or_default();
            (plan, chosen.unwrap_or_else(|| n.strategy.to_string()))
        }
        None => (String::new(), String::new()),
    };
    let code = reply.get_i32("code").ok();
    tracing::info!(
        target: "duet::slow",
        conn = conn.id,
        ns = %ns,
        command = %name,
        duration_ms = elapsed.as_millis().min(u128::from(u64::MAX)) as u64,
        plan_summary = %plan,
        strategy = %strategy,
        ok,
        error_code = code,
        "Slow query"
    );
}

/// Whether a command runs on the connection's task instead of a blocking
/// thread: only commands that never wait, scan or write — the handshake and
/// `ping` (what drivers' monitors and pools send most) and a `find` by one
/// `_id` value ([`is_point_find`]) — never with a `speculativeAuthenticate`
/// (SCRAM's work), and never inside a transaction or retryable write (a
/// session's commands may wait for each other there).
fn runs_inline(name: &str, db: &str, cmd: &Document) -> bool {
    let never_waits = match name {
        "ping" | "hello" | "isMaster" | "ismaster" | "buildInfo" | "buildinfo" | "whatsmyuri" => {
            true
        }
        "find" => is_point_find(db, cmd),
        _ => false,
    };
    never_waits
        && !cmd.contains_key("speculativeAuthenticate")
        && !cmd.contains_key("txnNumber")
        && !cmd.contains_key("autocommit")
        && !cmd.contains_key("startTransaction")
}

/// A `find` whose work is one `_id` lookup in the latest published state,
/// whatever the collection's size: the filter is `{_id: v}` with `v` a plain
/// value (no operator document, array or regex, which may match many), and
/// every other field is one that cannot make it scan or wait — no `hint`
/// (it may name another index), `sort`, `min`/`max`, `tailable`, `$duet`
/// strategy or snapshot, nor a read concern other than `local`/`available`
/// (`majority`, `snapshot` and `afterClusterTime` may wait for the log).
/// The internal databases and `system.*` collections are views computed on
/// demand (the oplog, users, sessions): never inline.
fn is_point_find(db: &str, cmd: &Document) -> bool {
    let user_collection = user_collection(db, cmd.get("find"));
    let point = cmd.get("filter").is_some_and(is_id_point);
    let local = |rc: &Bson| match rc {
        Bson::Document(rc) => rc.iter().all(|(k, v)| {
            k == "level" && matches!(v, Bson::String(l) if l == "local" || l == "available")
        }),
        _ => false,
    };
    user_collection
        && point
        && cmd.iter().all(|(k, v)| match k.as_str() {
            "find"
            | "filter"
            | "projection"
            | "limit"
            | "batchSize"
            | "singleBatch"
            | "skip"
            | "comment"
            | "maxTimeMS"
            | "lsid"
            | "$db"
            | "$clusterTime"
            | "$readPreference"
            | "apiVersion"
            | "apiStrict"
            | "apiDeprecationErrors" => true,
            "readConcern" => local(v),
            _ => false,
        })
}

/// Whether `collection` (a command's first value) names a user collection
/// of a user database: the internal databases and `system.*` collections
/// are views computed on demand (the oplog, users, sessions).
fn user_collection(db: &str, collection: Option<&Bson>) -> bool {
    matches!(collection, Some(Bson::String(c)) if !c.starts_with("system."))
        && !matches!(db, "local" | "config" | "admin")
}

/// Whether a filter is `{_id: v}` with `v` a plain value (no operator
/// document, array or regex, which may match many): one `_id` lookup.
fn is_id_point(filter: &Bson) -> bool {
    match filter {
        Bson::Document(f) => {
            f.len() == 1
                && !matches!(
                    f.get("_id"),
                    None | Some(
                        Bson::Document(_)
                            | Bson::Array(_)
                            | Bson::RegularExpression(_)
                            | Bson::JavaScriptCode(_)
                            | Bson::JavaScriptCodeWithScope(_)
                    )
                )
        }
        _ => false,
    }
}

/// Where a command that does not go to the blocking pool runs.
enum Here {
    /// On the connection's task: it never waits ([`runs_inline`]).
    Task,
    /// On the connection's worker thread, which hands its other tasks to
    /// another thread first (`block_in_place`): a write whose work is
    /// bounded ([`is_point_write`]) but which waits for the writer group
    /// (and its sync). No hand-off to a blocking thread and back: the two
    /// wake-ups that hand-off costs are most of a small write's latency.
    InPlace,
}

/// A write whose work is bounded whatever the collection's size: an
/// `insert` (its documents are in the message), or an `update`, `delete` or
/// `findAndModify` whose every statement addresses one `_id` value
/// ([`is_id_point`]) with no `hint` (which may name another index to walk),
/// `collation` (which may keep the `_id` index from answering) or `sort`;
/// on a user collection, outside a transaction (a transaction's commands may
/// wait for each other). A retryable write (`txnNumber` alone) qualifies.
/// Such a command still waits for the writer and its sync, so it runs in
/// place ([`Here::InPlace`]), never on the task itself.
fn is_point_write(name: &str, db: &str, cmd: &Document) -> bool {
    if cmd.contains_key("startTransaction")
        || cmd.contains_key("autocommit")
        || !user_collection(db, cmd.get(name))
    {
        return false;
    }
    let plain = |stmt: &Document, filter: &str| {
        stmt.get(filter).is_some_and(is_id_point)
            && !stmt.contains_key("hint")
            && !stmt.contains_key("collation")
            && !stmt.contains_key("sort")
    };
    let every = |field: &str, filter: &str| match cmd.get(field) {
        Some(Bson::Array(stmts)) => stmts
            .iter()
            .all(|s| matches!(s, Bson::Document(s) if plain(s, filter))),
        _ => false,
    };
    match name {
        "insert" => true,
        "update" => every("updates", "q"),
        "delete" => every("deletes", "q"),
        "findAndModify" | "findandmodify" => plain(cmd, "query"),
        _ => false,
    }
}

/// Run a command, a write first waiting while the `fsync` lock is held
/// (until its token is cancelled).
fn guarded(
    state: &ServerState,
    name: &str,
    token: &CancelToken,
    run: impl FnOnce() -> Document,
) -> Document {
    if crate::runtime::is_write(name) && state.fsync.count() > 0 {
        match state.fsync.wait_unlocked(token) {
            Ok(()) => run(),
            Err(e) => e.to_reply(),
        }
    } else {
        run()
    }
}

/// How long a reply past `maxTimeMS` waits for its cancelled command to end.
pub const CANCEL_GRACE: Duration = Duration::from_secs(1);

/// Run a command off the async threads under its cancellation token (see
/// the module documentation).
async fn run_command(
    state: &Arc<ServerState>,
    conn: &ConnInfo,
    db: String,
    cmd: Document,
) -> Answer {
    let max_time = match crate::args::opt_i64(&cmd, "maxTimeMS") {
        Ok(None) | Ok(Some(0)) => None,
        Ok(Some(ms)) if ms > 0 => Some(Duration::from_millis(ms as u64)),
        Ok(Some(_)) => {
            return Answer::of(
                CommandError::bad_value("maxTimeMS must be non-negative").to_reply(),
            );
        }
        Err(e) => return Answer::of(e.to_reply()),
    };
    let name = commands::command_name(&cmd).unwrap_or("").to_string();
    // A getMore's maxTimeMS is a tailable awaitData cursor's await time
    // (MongoDB's rule), which the change stream's getMore honours itself;
    // on any other cursor the getMore refuses it (BadValue, read.rs).
    let max_time = max_time.filter(|_| name != "getMore");
    tracing::trace!(conn = conn.id, db = %db, command = %name, "command");
    let token = match max_time.and_then(|d| Instant::now().checked_add(d)) {
        Some(deadline) => CancelToken::with_deadline(deadline),
        None => CancelToken::new(),
    };
    // Shared with the operation listing, not copied.
    let cmd = Arc::new(cmd);
    let op = state
        .operations
        .register(conn, &db, cmd.clone(), token.clone());
    if state.config.inline_commands {
        let here = if runs_inline(&name, &db, &cmd) {
            Some(Here::Task)
        } else if max_time.is_none()
            && state.repl.get().is_none()
            && state.fsync.count() == 0
            && is_point_write(&name, &db, &cmd)
            && tokio::runtime::Handle::current().runtime_flavor()
                == tokio::runtime::RuntimeFlavor::MultiThread
        {
            Some(Here::InPlace)
        } else {
            None
        };
        if let Some(here) = here {
            let run = || {
                let started = Instant::now();
                let slot = RawCursorSlot::default();
                let reply = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                    guarded(state, &name, &token, || {
                        commands::execute_raw(
                            state,
                            conn,
                            &db,
                            &cmd,
                            &token,
                            Some(op.report()),
                            Some(&slot),
                        )
                    })
                }))
                .unwrap_or_else(|_| {
                    tracing::error!(conn = conn.id, command = %name, "command panicked (a bug)");
                    CommandError::internal(format!("command '{name}' failed internally")).to_reply()
                });
                finished(state, conn, &db, &cmd, &name, &reply, started, op.report());
                Answer {
                    doc: reply,
                    cursor: slot.into_inner(),
                }
            };
            return match here {
                Here::Task => run(),
                Here::InPlace => tokio::task::block_in_place(|| {
                    let answer = run();
                    crate::memory::release_if_asked();
                    answer
                }),
            };
        }
    }
    let mut task = {
        let state = state.clone();
        let conn = conn.clone();
        let token = token.clone();
        let name = name.clone();
        tokio::task::spawn_blocking(move || {
            // Listed until the engine call has returned.
            let op = op;
            let started = Instant::now();
            let slot = RawCursorSlot::default();
            let run = || {
                commands::execute_raw(
                    &state,
                    &conn,
                    &db,
                    &cmd,
                    &token,
                    Some(op.report()),
                    Some(&slot),
                )
            };
            let reply = guarded(&state, &name, &token, run);
            finished(
                &state,
                &conn,
                &db,
                &cmd,
                &name,
                &reply,
                started,
                op.report(),
            );
            // This thread may own pages another thread's drop just freed.
            crate::memory::release_if_asked();
            Answer {
                doc: reply,
                cursor: slot.into_inner(),
            }
        })
    };
    let joined = match max_time {
        None => (&mut task).await,
        Some(limit) => match tokio::time::timeout(limit, &mut task).await {
            Ok(j) => j,
            Err(_) => {
                tracing::debug!(conn = conn.id, command = %name, "maxTimeMS expired");
                token.cancel(CancelReason::MaxTimeExpired);
                if tokio::time::timeout(CANCEL_GRACE, &mut task).await.is_err() {
                    tracing::warn!(conn = conn.id, command = %name, grace = ?CANCEL_GRACE,
                        "command still running after its maxTimeMS cancellation (a write waiting for the writer?)");
                }
                let mut e = CommandError::max_time_expired();
                if name == "commitTransaction" {
                    // The commit goes on in the background: its outcome is unknown.
                    e = e.with_label(commands::txn::UNKNOWN_COMMIT);
                }
                return Answer::of(e.to_reply());
            }
        },
    };
    match joined {
        Ok(answer) => answer,
        Err(e) => {
            tracing::error!(conn = conn.id, command = %name, error = %e, "command panicked (a bug)");
            Answer::of(
                CommandError::internal(format!("command '{name}' failed internally")).to_reply(),
            )
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A find by one `_id` answered from stored bytes sends exactly the
    /// reply the planned find sends, and reads the way it reads (the
    /// `_id` index use counted); finds it may not answer are left alone.
    #[test]
    fn a_point_find_from_stored_bytes_is_the_planned_reply() {
        let state = ServerState::new(
            duetdb::Engine::in_memory(),
            crate::state::Config {
                data_dir: None,
                ..crate::state::Config::default()
            },
        );
        let addr: std::net::SocketAddr = ([127, 0, 0, 1], 1).into();
        let conn = ConnInfo::new(1, addr, addr);
        let run = |db: &str, cmd: &Document, raw: bool| {
            let slot = RawCursorSlot::default();
            let token = duetdb::CancelToken::new();
            let doc =
                commands::execute_raw(&state, &conn, db, cmd, &token, None, raw.then_some(&slot));
            let answer = Answer {
                doc,
                cursor: slot.into_inner(),
            };
            let used = answer.cursor.is_some();
            (serialize(&opmsg::REPLY_PREFIX, &answer), used)
        };
        let r = run(
            "t",
            &doc! {"insert": "c", "documents": [
                {"_id": 1, "a": "x", "n": {"deep": [1, 2.5, {"k": null}]}},
                {"_id": "s", "b": true},
                {"_id": 7.0, "c": 1},
                {"_id": bson::oid::ObjectId::from_bytes([1; 12])},
            ]},
            false,
        );
        assert!(!r.1);
        let id_ops = |state: &Arc<ServerState>| {
            let r = commands::execute(
                state,
                &conn,
                "t",
                &doc! {"aggregate": "c", "pipeline": [{"$indexStats": {}}], "cursor": {}},
            );
            let batch = r
                .get_document("cursor")
                .and_then(|c| c.get_array("firstBatch"))
                .cloned()
                .unwrap_or_default();
            batch
                .iter()
                .filter_map(Bson::as_document)
                .find(|s| s.get_str("name").ok() == Some("_id_"))
                .and_then(|s| s.get_document("accesses").ok())
                .and_then(|a| a.get_i64("ops").ok())
                .unwrap_or(-1)
        };
        let answered = [
            doc! {"find": "c", "filter": {"_id": 1}},
            doc! {"find": "c", "filter": {"_id": 1i64}, "limit": 1, "singleBatch": true},
            doc! {"find": "c", "filter": {"_id": "s"}, "batchSize": 2, "comment": "x"},
            doc! {"find": "c", "filter": {"_id": 7}},
            doc! {"find": "c", "filter": {"_id": bson::oid::ObjectId::from_bytes([1; 12])}},
            doc! {"find": "c", "filter": {"_id": 99}},
            doc! {"find": "nope", "filter": {"_id": 1}},
            doc! {"find": "c", "filter": {"_id": 1}, "readConcern": {"level": "local"}},
        ];
        for cmd in &answered {
            let before = id_ops(&state);
            assert!(before >= 0);
            let (planned, used) = run("t", cmd, false);
            assert!(!used);
            let after_planned = id_ops(&state);
            let (raw, used) = run("t", cmd, true);
            assert!(used, "{cmd}");
            assert_eq!(raw, planned, "{cmd}");
            assert_eq!(
                id_ops(&state) - after_planned,
                after_planned - before,
                "{cmd}"
            );
        }
        let planned_only = [
            doc! {"find": "c", "filter": {"_id": 1}, "projection": {"a": 1}},
            doc! {"find": "c", "filter": {"_id": 1}, "batchSize": 1},
            doc! {"find": "c", "filter": {"_id": 1}, "batchSize": 0},
            doc! {"find": "c", "filter": {"_id": 1}, "skip": 1},
            doc! {"find": "c", "filter": {"_id": 1}, "limit": -1},
            doc! {"find": "c", "filter": {"_id": 1}, "singleBatch": 1},
            doc! {"find": "c", "filter": {"_id": 1.0}},
            doc! {"find": "c", "filter": {"_id": 1, "a": "x"}},
            doc! {"find": "c", "filter": {"_id": {"$eq": 1}}},
            doc! {"find": "c", "filter": {"_id": 1}, "collation": {"locale": "en"}},
            doc! {"find": "c", "filter": {"_id": 1}, "readConcern": {"level": "majority"}},
        ];
        for cmd in &planned_only {
            assert!(!run("t", cmd, true).1, "{cmd}");
        }
        // A collection with a default collation is planned.
        run(
            "t",
            &doc! {"create": "ci", "collation": {"locale": "en", "strength": 2}},
            false,
        );
        run(
            "t",
            &doc! {"insert": "ci", "documents": [{"_id": "A"}]},
            false,
        );
        let cmd = doc! {"find": "ci", "filter": {"_id": "a"}};
        let (planned, _) = run("t", &cmd, false);
        let (raw, used) = run("t", &cmd, true);
        assert!(!used);
        assert_eq!(raw, planned);
    }

    #[test]
    fn only_commands_that_never_wait_run_inline() {
        assert!(runs_inline("ping", "admin", &doc! {"ping": 1}));
        assert!(runs_inline(
            "hello",
            "admin",
            &doc! {"hello": 1, "lsid": {"id": 1}}
        ));
        for name in ["find", "insert", "saslStart", "getMore", "aggregate"] {
            assert!(!runs_inline(name, "t", &doc! {name: 1}), "{name}");
        }
        assert!(!runs_inline(
            "ping",
            "admin",
            &doc! {"ping": 1, "txnNumber": 1i64}
        ));
        assert!(!runs_inline(
            "ping",
            "admin",
            &doc! {"ping": 1, "autocommit": false}
        ));
        assert!(!runs_inline(
            "hello",
            "admin",
            &doc! {"hello": 1, "speculativeAuthenticate": {"saslStart": 1}}
        ));
    }

    #[test]
    fn only_a_find_by_one_id_value_runs_inline() {
        let inline = |cmd: Document| runs_inline("find", "t", &cmd);
        assert!(inline(doc! {"find": "c", "filter": {"_id": 7}, "$db": "t"}));
        assert!(inline(doc! {
            "find": "c", "filter": {"_id": "k"}, "limit": 1, "singleBatch": true,
            "projection": {"a": 1}, "lsid": {"id": 1}, "readConcern": {"level": "local"},
        }));
        // Anything that may scan, sort, wait or read another state does not.
        for cmd in [
            doc! {"find": "c"},
            doc! {"find": "c", "filter": {}},
            doc! {"find": "c", "filter": {"_id": 7, "a": 1}},
            doc! {"find": "c", "filter": {"_id": {"$gt": 7}}},
            doc! {"find": "c", "filter": {"_id": {"$in": [1, 2]}}},
            doc! {"find": "c", "filter": {"_id": [1, 2]}},
            doc! {"find": "c", "filter": {"_id": bson::Regex { pattern: "^a".try_into().expect("cstr"), options: "".try_into().expect("cstr") }}},
            doc! {"find": "c", "filter": {"a": 7}},
            doc! {"find": "c", "filter": {"_id": 7}, "hint": {"a": 1}},
            doc! {"find": "c", "filter": {"_id": 7}, "sort": {"a": 1}},
            doc! {"find": "c", "filter": {"_id": 7}, "tailable": true},
            doc! {"find": "c", "filter": {"_id": 7}, "$duet": {"snapshot": "vls"}},
            doc! {"find": "c", "filter": {"_id": 7}, "readConcern": {"level": "majority"}},
            doc! {"find": "c", "filter": {"_id": 7}, "readConcern": {"level": "local", "afterClusterTime": bson::Timestamp { time: 1, increment: 1 }}},
            doc! {"find": "c", "filter": {"_id": 7}, "txnNumber": 1i64, "autocommit": false},
        ] {
            assert!(!inline(cmd.clone()), "{cmd}");
        }
        let point = doc! {"find": "oplog.rs", "filter": {"_id": 7}};
        assert!(!runs_inline("find", "local", &point));
        assert!(!runs_inline(
            "find",
            "admin",
            &doc! {"find": "system.users", "filter": {"_id": "a.b"}}
        ));
        assert!(!runs_inline(
            "find",
            "t",
            &doc! {"find": "system.js", "filter": {"_id": 7}}
        ));
    }

    #[test]
    fn only_writes_of_bounded_work_run_in_place() {
        let w = |name: &str, cmd: Document| is_point_write(name, "t", &cmd);
        assert!(w("insert", doc! {"insert": "c", "documents": [{"a": 1}]}));
        assert!(w(
            "insert",
            doc! {"insert": "c", "documents": [{"a": 1}], "txnNumber": 3i64, "lsid": {"id": 1}}
        ));
        assert!(w(
            "update",
            doc! {"update": "c", "updates": [{"q": {"_id": 1}, "u": {"$set": {"a": 2}}, "upsert": true}]}
        ));
        assert!(w(
            "delete",
            doc! {"delete": "c", "deletes": [{"q": {"_id": "k"}, "limit": 1}, {"q": {"_id": 2}, "limit": 0}]}
        ));
        assert!(w(
            "findAndModify",
            doc! {"findAndModify": "c", "query": {"_id": 1}, "update": {"$inc": {"n": 1}}}
        ));
        // Anything that may scan, walk another index or wait for another
        // command of its session does not.
        for (name, cmd) in [
            (
                "update",
                doc! {"update": "c", "updates": [{"q": {}, "u": {"a": 1}}]},
            ),
            (
                "update",
                doc! {"update": "c", "updates": [{"q": {"_id": 1}, "u": {"a": 1}}, {"q": {"a": 1}, "u": {"a": 1}}]},
            ),
            (
                "update",
                doc! {"update": "c", "updates": [{"q": {"_id": {"$gt": 1}}, "u": {"a": 1}}]},
            ),
            (
                "update",
                doc! {"update": "c", "updates": [{"q": {"_id": 1}, "u": {"a": 1}, "hint": {"a": 1}}]},
            ),
            (
                "update",
                doc! {"update": "c", "updates": [{"q": {"_id": "x"}, "u": {"a": 1}, "collation": {"locale": "fr"}}]},
            ),
            ("update", doc! {"update": "c", "updates": "bogus"}),
            ("update", doc! {"update": "c", "updates": [7]}),
            (
                "delete",
                doc! {"delete": "c", "deletes": [{"q": {"_id": 1, "a": 2}, "limit": 1}]},
            ),
            ("delete", doc! {"delete": "c"}),
            (
                "findAndModify",
                doc! {"findAndModify": "c", "query": {"_id": 1}, "sort": {"a": 1}, "remove": true},
            ),
            (
                "findAndModify",
                doc! {"findAndModify": "c", "query": {"a": 1}, "remove": true},
            ),
            (
                "insert",
                doc! {"insert": "c", "documents": [{}], "txnNumber": 1i64, "autocommit": false, "startTransaction": true},
            ),
            (
                "insert",
                doc! {"insert": "c", "documents": [{}], "txnNumber": 1i64, "autocommit": false},
            ),
            ("insert", doc! {"insert": "system.js", "documents": [{}]}),
            ("insert", doc! {"insert": 7, "documents": [{}]}),
            ("createIndexes", doc! {"createIndexes": "c", "indexes": []}),
            ("find", doc! {"find": "c", "filter": {"_id": 1}}),
        ] {
            assert!(!w(name, cmd.clone()), "{cmd}");
        }
        assert!(!is_point_write(
            "insert",
            "admin",
            &doc! {"insert": "c", "documents": [{}]}
        ));
        assert!(!is_point_write(
            "insert",
            "local",
            &doc! {"insert": "c", "documents": [{}]}
        ));
    }
}
