//! Operations in flight: every command gets an op id and a cancellation token
//! for as long as it runs, so `currentOp` can list it and `killOp`, a closed
//! connection, its `maxTimeMS` and shutdown can cancel it.
//!
//! Owns: [`OpRegistry`] (op id → connection, command, start, token) and
//! [`OpGuard`], which removes an operation when its command's blocking thread
//! finishes — not when the client stops waiting — so `currentOp` shows work
//! for exactly as long as it runs.
//!
//! Each operation also has an [`OpReport`]: what its read runs on (set by
//! `source::read_source` through `Ctx::note_read`: the strategy, the held
//! snapshot or live collection, and the command), so `currentOp` and the
//! slow-operation log can show the plan summary, the snapshot strategy and
//! the old versions the read holds.
//!
//! Invariants:
//! - op ids are unique for the life of the server (a counter from 1);
//! - an operation is listed from before its command starts until after its
//!   engine call has returned (the guard lives on the blocking thread);
//! - cancelling only sets the token: reads stop at their next page check,
//!   writes already submitted to the writer may still commit (as MongoDB);
//! - a closed connection cancels its operations except those of
//!   [`SURVIVE_DISCONNECT`] (`createIndexes`: MongoDB does not mark it
//!   killable on client disconnect, so an index build goes on to the end);
//!   they stay listed, and `killOp`, `maxTimeMS` and shutdown still cancel
//!   them.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Instant, SystemTime};

use bson::{doc, Bson, DateTime, Document};
use duetdb::{CancelReason, CancelToken};
use parking_lot::Mutex;

use crate::state::ConnInfo;

/// The command document as `currentOp` shows it: at most this many bytes of
/// it (longer ones are summarized), so listing is cheap.
const MAX_SHOWN_COMMAND_BYTES: usize = 4 * 1024;

/// What a running read reads, as `currentOp` and the slow-operation log
/// show it.
#[derive(Clone)]
pub struct ReadNote {
    /// The database and collection read.
    pub db: String,
    pub coll: String,
    /// The whole read command (for its plan summary, worked out on demand
    /// by explaining it: planning only, no execution).
    pub command: Arc<Document>,
    /// `cow` (a held snapshot), `none`/`vls`/`olcp`/`auto` (live, as
    /// requested), or `transaction`.
    pub strategy: &'static str,
    /// The held snapshot a `cow` read runs on (kept alive by the read
    /// anyway; `currentOp` measures what it retains).
    pub snapshot: Option<duetdb::Snapshot>,
}

/// Filled in by the command while it runs; read by `currentOp` and by the
/// slow-operation log when it ends.
pub struct OpReport {
    /// The command as received, shared (not copied) with the listing and a
    /// read's note: registering must cost next to nothing, as most commands
    /// run in microseconds.
    command: Arc<Document>,
    read: Mutex<Option<ReadNote>>,
    /// The index build a `createIndexes` runs outside the writer.
    index_build: Mutex<Option<Arc<duetdb::IndexBuildProgress>>>,
}

impl OpReport {
    pub fn new(command: Arc<Document>) -> OpReport {
        OpReport {
            command,
            read: Mutex::new(None),
            index_build: Mutex::new(None),
        }
    }

    /// `cmd` as an `Arc`: the registered command itself when `cmd` is it
    /// (no copy), else a copy (an explain's inner command, say).
    pub fn command_arc(&self, cmd: &Document) -> Arc<Document> {
        if std::ptr::eq(cmd, &*self.command) {
            self.command.clone()
        } else {
            Arc::new(cmd.clone())
        }
    }

    pub fn note_index_build(&self, progress: Arc<duetdb::IndexBuildProgress>) {
        *self.index_build.lock() = Some(progress);
    }

    pub fn index_build(&self) -> Option<Arc<duetdb::IndexBuildProgress>> {
        self.index_build.lock().clone()
    }

    pub fn note_read(&self, note: ReadNote) {
        *self.read.lock() = Some(note);
    }

    pub fn read(&self) -> Option<ReadNote> {
        self.read.lock().clone()
    }
}

struct Op {
    conn: u64,
    /// Cancelled when its connection closes (false: [`SURVIVE_DISCONNECT`]).
    kill_on_disconnect: bool,
    client: std::net::SocketAddr,
    ns: String,
    started: Instant,
    started_at: SystemTime,
    token: CancelToken,
    report: Arc<OpReport>,
}

/// Commands that go on when their client disconnects (MongoDB's commands
/// not marked `killOnClientDisconnect` among those that last): an index
/// build is not lost because the shell or driver that asked for it went
/// away.
pub const SURVIVE_DISCONNECT: &[&str] = &["createIndexes"];

/// The namespace a command acts on: `db.coll` when its first field names
/// a collection, else `db.$cmd`.
pub fn namespace(db: &str, cmd: &Document) -> String {
    match cmd.iter().next() {
        Some((_, Bson::String(c))) => format!("{db}.{c}"),
        _ => format!("{db}.$cmd"),
    }
}

/// Operations in flight, by op id.
#[derive(Default)]
pub struct OpRegistry {
    next: AtomicU64,
    ops: Mutex<HashMap<u64, Op>>,
    killed: AtomicU64,
    finished_after_cancel: AtomicU64,
}

/// Keeps one operation listed; dropping it removes the operation.
pub struct OpGuard {
    registry: Arc<OpRegistry>,
    opid: u64,
    report: Arc<OpReport>,
}

impl OpGuard {
    pub fn opid(&self) -> u64 {
        self.opid
    }

    pub fn report(&self) -> &Arc<OpReport> {
        &self.report
    }
}

impl Drop for OpGuard {
    fn drop(&mut self) {
        if let Some(op) = self.registry.ops.lock().remove(&self.opid) {
            if op.token.is_cancelled() {
                self.registry
                    .finished_after_cancel
                    .fetch_add(1, Ordering::Relaxed);
            }
        }
    }
}

/// Does `v` fit in `budget` (approximate bytes)? Walks at most `budget`
/// elements, so a 48 MB insert costs no more to check than a small one.
fn fits(v: &Bson, budget: &mut isize) -> bool {
    *budget -= 16;
    match v {
        Bson::String(s) => *budget -= s.len() as isize,
        Bson::Binary(b) => *budget -= b.bytes.len() as isize,
        Bson::Document(d) => {
            for (k, v) in d {
                *budget -= k.len() as isize;
                if *budget < 0 || !fits(v, budget) {
                    return false;
                }
            }
        }
        Bson::Array(a) => {
            for v in a {
                if *budget < 0 || !fits(v, budget) {
                    return false;
                }
            }
        }
        _ => {}
    }
    *budget >= 0
}

/// The command as `currentOp` shows it: fields in order while they fit in
/// [`MAX_SHOWN_COMMAND_BYTES`], then `$truncated: true`.
fn shown(cmd: &Document) -> Document {
    let mut out = Document::new();
    let mut budget = MAX_SHOWN_COMMAND_BYTES as isize;
    for (k, v) in cmd {
        if !fits(v, &mut budget) {
            out.insert("$truncated", true);
            break;
        }
        out.insert(k.clone(), v.clone());
    }
    out
}

impl OpRegistry {
    /// List a command run by `conn` on `db` under `token` until the guard drops.
    pub fn register(
        self: &Arc<Self>,
        conn: &ConnInfo,
        db: &str,
        cmd: Arc<Document>,
        token: CancelToken,
    ) -> OpGuard {
        let opid = self.next.fetch_add(1, Ordering::Relaxed) + 1;
        let ns = namespace(db, &cmd);
        let kill_on_disconnect = !cmd
            .keys()
            .next()
            .is_some_and(|name| SURVIVE_DISCONNECT.contains(&name.as_str()));
        let report = Arc::new(OpReport::new(cmd));
        let op = Op {
            report: report.clone(),
            conn: conn.id,
            kill_on_disconnect,
            client: conn.peer,
            ns,
            started: Instant::now(),
            started_at: SystemTime::now(),
            token,
        };
        self.ops.lock().insert(opid, op);
        OpGuard {
            registry: self.clone(),
            opid,
            report,
        }
    }

    /// Cancel operation `opid` (`killOp`); false when no such operation runs.
    pub fn kill(&self, opid: u64) -> bool {
        let ops = self.ops.lock();
        match ops.get(&opid) {
            Some(op) => {
                if op.token.cancel(CancelReason::Killed) {
                    self.killed.fetch_add(1, Ordering::Relaxed);
                }
                true
            }
            None => false,
        }
    }

    /// Cancel every operation of connection `conn` (it closed), except
    /// those that survive a disconnect ([`SURVIVE_DISCONNECT`]).
    pub fn kill_connection(&self, conn: u64, reason: CancelReason) -> usize {
        let ops = self.ops.lock();
        let mut n = 0;
        for op in ops
            .values()
            .filter(|o| o.conn == conn && o.kill_on_disconnect)
        {
            if op.token.cancel(reason) {
                self.killed.fetch_add(1, Ordering::Relaxed);
                n += 1;
            }
        }
        n
    }

    /// Cancel every operation (shutdown).
    pub fn kill_all(&self, reason: CancelReason) -> usize {
        let ops = self.ops.lock();
        let mut n = 0;
        for op in ops.values() {
            if op.token.cancel(reason) {
                self.killed.fetch_add(1, Ordering::Relaxed);
                n += 1;
            }
        }
        n
    }

    /// Operations in flight now.
    pub fn len(&self) -> usize {
        self.ops.lock().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// `currentOp`'s `inprog` entries, MongoDB's field names, op id order,
    /// each with its report (what its read runs on).
    pub fn current(&self, host: &str) -> Vec<(Document, Option<ReadNote>)> {
        let ops = self.ops.lock();
        let mut ids: Vec<&u64> = ops.keys().collect();
        ids.sort();
        ids.into_iter()
            .filter_map(|id| ops.get(id).map(|op| (*id, op)))
            .map(|(opid, op)| {
                let micros = op.started.elapsed().as_micros().min(i64::MAX as u128) as i64;
                let cancelled = op.token.is_cancelled();
                let mut entry = doc! {
                    "type": "op",
                    "host": host,
                    "desc": format!("conn{}", op.conn),
                    "connectionId": op.conn as i64,
                    "client": op.client.to_string(),
                    "active": true,
                    "currentOpTime": DateTime::from_system_time(SystemTime::now()),
                    "opid": opid as i64,
                    "secs_running": micros / 1_000_000,
                    "microsecs_running": micros,
                    "op": "command",
                    "ns": op.ns.clone(),
                    "command": shown(&op.report.command),
                    "startedAt": DateTime::from_system_time(op.started_at),
                    "killPending": cancelled,
                    "numYields": 0,
                    "waitingForLock": false,
                    "locks": {},
                };
                if let Some(progress) = op.report.index_build() {
                    crate::commands::currentop::index_build_fields(&progress, &mut entry);
                }
                (entry, op.report.read())
            })
            .collect()
    }

    /// `serverStatus.duet.operations`.
    pub fn status(&self) -> Document {
        doc! {
            "inFlight": self.len() as i64,
            "killed": self.killed.load(Ordering::Relaxed) as i64,
            "finishedAfterCancel": self.finished_after_cancel.load(Ordering::Relaxed) as i64,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A closed connection cancels its operations but `createIndexes`,
    /// which `killOp` and shutdown still cancel.
    #[test]
    fn a_disconnect_spares_index_builds_only() {
        let reg = Arc::new(OpRegistry::default());
        let addr: std::net::SocketAddr = "127.0.0.1:1".parse().expect("addr");
        let conn = ConnInfo::new(7, addr, addr);
        let find = CancelToken::new();
        let build = CancelToken::new();
        let _f = reg.register(&conn, "d", Arc::new(doc! {"find": "c"}), find.clone());
        let b = reg.register(
            &conn,
            "d",
            Arc::new(doc! {"createIndexes": "c", "indexes": []}),
            build.clone(),
        );
        assert_eq!(reg.kill_connection(7, CancelReason::ClientDisconnected), 1);
        assert_eq!(find.reason(), Some(CancelReason::ClientDisconnected));
        assert_eq!(build.reason(), None);
        assert!(reg.kill(b.opid()));
        assert_eq!(build.reason(), Some(CancelReason::Killed));
    }
}
