//! The server-side session table: per logical session (`lsid.id`), the
//! newest transaction number seen and what happened under it — an open
//! multi-document transaction (holding the engine [`Transaction`]), a
//! committed or aborted one, or a retryable write with its remembered reply.
//!
//! Invariants:
//! - only sessions that sent a `txnNumber` have an entry (plain reads with an
//!   `lsid` need no server state); at most `max_sessions` entries exist, a new
//!   one beyond that is refused with TooManyLogicalSessions (261);
//! - a command that uses a session's transaction state holds that session's
//!   mutex for its whole execution (on a blocking thread), so commands of one
//!   session run one at a time — a driver's retry waits for the attempt it
//!   retries and then sees its outcome; the table's own lock is only held for
//!   lookups, never while a command runs;
//! - `txn_number` never decreases; an open transaction belongs to the current
//!   `txn_number`, and a newer number aborts it;
//! - the reaper aborts transactions older than the lifetime limit and drops
//!   sessions idle past the idle timeout (aborting their transactions); it
//!   skips sessions busy with a command (the engine also checks the lifetime
//!   at every operation). Dropping a [`Transaction`] is its abort: nothing was
//!   written before commit.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bson::{Bson, Document};
use duetdb::Transaction;
use parking_lot::Mutex;

use crate::error::{CmdResult, CommandError};

/// Sessions with server-side state at most (each is small unless it holds an
/// open transaction or a remembered write reply).
pub const DEFAULT_MAX_SESSIONS: usize = 100_000;

/// A session id: the bytes of `lsid.id` (a UUID, BSON binary subtype 4).
pub type SessionId = Vec<u8>;

/// Most bytes of a session id we accept (UUIDs are 16).
const MAX_SESSION_ID_BYTES: usize = 64;

/// What happened under a session's current `txn_number`.
#[derive(Debug)]
pub enum TxnState {
    /// Nothing yet (or a retryable write that failed as a whole: it may rerun).
    None,
    /// An open multi-document transaction on database `db`.
    InProgress {
        txn: Box<Transaction>,
        db: String,
        started: Instant,
    },
    /// Committed; a retried `commitTransaction` answers ok again.
    Committed,
    /// Aborted (by the client, an error, the reaper, or a newer number).
    Aborted { reason: String },
    /// A retryable write that ran; a retry gets this reply, not a second run.
    Written { reply: Document },
}

impl TxnState {
    pub fn name(&self) -> &'static str {
        match self {
            TxnState::None => "none",
            TxnState::InProgress { .. } => "in progress",
            TxnState::Committed => "committed",
            TxnState::Aborted { .. } => "aborted",
            TxnState::Written { .. } => "retryable write",
        }
    }
}

/// One logical session's server-side state.
#[derive(Debug)]
pub struct Session {
    /// The newest `txnNumber` seen (`None`: none yet).
    pub txn_number: Option<i64>,
    pub state: TxnState,
    pub last_use: Instant,
}

impl Session {
    fn new() -> Session {
        Session {
            txn_number: None,
            state: TxnState::None,
            last_use: Instant::now(),
        }
    }

    /// Abort the open transaction, if any (dropping it frees its buffer).
    pub fn abort_open(&mut self, reason: &str) -> bool {
        if matches!(self.state, TxnState::InProgress { .. }) {
            self.state = TxnState::Aborted {
                reason: reason.to_string(),
            };
            return true;
        }
        false
    }
}

/// Counters of the session table (`serverStatus.transactions`).
#[derive(Debug, Default, Clone, Copy)]
pub struct SessionStats {
    pub sessions: usize,
    pub open_transactions: usize,
}

/// All sessions of a server.
pub struct SessionTable {
    sessions: Mutex<HashMap<SessionId, Arc<Mutex<Session>>>>,
    max_sessions: usize,
    /// Transactions older than this are aborted (MongoDB's
    /// `transactionLifetimeLimitSeconds`).
    pub txn_lifetime: Duration,
    /// Sessions unused for this long are dropped (`logicalSessionTimeoutMinutes`).
    pub idle_timeout: Duration,
}

impl SessionTable {
    pub fn new(
        max_sessions: usize,
        txn_lifetime: Duration,
        idle_timeout: Duration,
    ) -> SessionTable {
        SessionTable {
            sessions: Mutex::new(HashMap::new()),
            max_sessions: max_sessions.max(1),
            txn_lifetime,
            idle_timeout,
        }
    }

    /// The session `id`, created when absent (refused past `max_sessions`).
    pub fn get_or_create(&self, id: &[u8]) -> CmdResult<Arc<Mutex<Session>>> {
        let mut g = self.sessions.lock();
        if let Some(s) = g.get(id) {
            return Ok(s.clone());
        }
        if g.len() >= self.max_sessions {
            return Err(CommandError::new(
                261,
                "TooManyLogicalSessions",
                format!(
                    "the server already holds state for {} sessions (the limit); end some sessions",
                    self.max_sessions
                ),
            ));
        }
        let s = Arc::new(Mutex::new(Session::new()));
        g.insert(id.to_vec(), s.clone());
        Ok(s)
    }

    /// The session `id` when it has state.
    pub fn get(&self, id: &[u8]) -> Option<Arc<Mutex<Session>>> {
        self.sessions.lock().get(id).cloned()
    }

    /// Mark a session used now (a command that carries its `lsid`); never
    /// waits for a busy session (a busy one is being used anyway).
    pub fn touch(&self, id: &[u8]) {
        if let Some(s) = self.get(id) {
            if let Some(mut s) = s.try_lock() {
                s.last_use = Instant::now();
            }
        }
    }

    /// End sessions: forget them and abort their open transactions (waiting
    /// for a command in progress on one to finish). Returns how many existed.
    pub fn end(&self, ids: &[SessionId]) -> usize {
        let removed: Vec<Arc<Mutex<Session>>> = {
            let mut g = self.sessions.lock();
            ids.iter().filter_map(|id| g.remove(id)).collect()
        };
        for s in &removed {
            s.lock().abort_open("its session was ended");
        }
        removed.len()
    }

    /// End every session (`killAllSessions`, `killSessions: []`).
    pub fn end_all(&self) -> usize {
        let ids: Vec<SessionId> = self.sessions.lock().keys().cloned().collect();
        self.end(&ids)
    }

    pub fn stats(&self) -> SessionStats {
        let all: Vec<Arc<Mutex<Session>>> = self.sessions.lock().values().cloned().collect();
        let open = all
            .iter()
            .filter(|s| {
                s.try_lock()
                    .is_none_or(|s| matches!(s.state, TxnState::InProgress { .. }))
            })
            .count();
        SessionStats {
            sessions: all.len(),
            open_transactions: open,
        }
    }

    /// Abort transactions past their lifetime and drop idle sessions; returns
    /// (transactions aborted, sessions dropped). Busy sessions are skipped.
    pub fn reap(&self, now: Instant) -> (usize, usize) {
        let all: Vec<(SessionId, Arc<Mutex<Session>>)> = self
            .sessions
            .lock()
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        let (mut aborted, mut idle) = (0, Vec::new());
        for (id, s) in all {
            let Some(mut g) = s.try_lock() else { continue };
            if let TxnState::InProgress { started, .. } = &g.state {
                if now.saturating_duration_since(*started) > self.txn_lifetime {
                    let why = format!(
                        "it exceeded the transaction lifetime limit of {:?} (--transaction-lifetime-secs)",
                        self.txn_lifetime
                    );
                    g.abort_open(&why);
                    aborted += 1;
                }
            }
            if now.saturating_duration_since(g.last_use) > self.idle_timeout {
                idle.push(id);
            }
        }
        let dropped = if idle.is_empty() { 0 } else { self.end(&idle) };
        (aborted, dropped)
    }
}

/// The session fields of a command (`lsid`, `txnNumber`, `autocommit`,
/// `startTransaction`), type-checked.
#[derive(Debug, Default)]
pub struct SessionArgs {
    pub lsid: Option<SessionId>,
    pub txn_number: Option<i64>,
    /// `Some(false)` marks a command of a multi-document transaction.
    pub autocommit: Option<bool>,
    pub start_transaction: bool,
}

impl SessionArgs {
    pub fn parse(cmd: &Document) -> CmdResult<SessionArgs> {
        let lsid = match cmd.get("lsid") {
            None | Some(Bson::Null) => None,
            Some(Bson::Document(l)) => Some(session_id(l)?),
            Some(other) => {
                return Err(CommandError::type_mismatch(format!(
                    "BSON field 'lsid' is the wrong type '{}', expected type 'object'",
                    duetdb::raw::type_name(other)
                )))
            }
        };
        let txn_number = match cmd.get("txnNumber") {
            None | Some(Bson::Null) => None,
            Some(Bson::Int64(n)) => Some(*n),
            Some(Bson::Int32(n)) => Some(i64::from(*n)),
            Some(other) => {
                return Err(CommandError::type_mismatch(format!(
                    "BSON field 'txnNumber' is the wrong type '{}', expected type 'long'",
                    duetdb::raw::type_name(other)
                )))
            }
        };
        if txn_number.is_some_and(|n| n < 0) {
            return Err(CommandError::bad_value("txnNumber must be non-negative"));
        }
        let autocommit = match cmd.get("autocommit") {
            None | Some(Bson::Null) => None,
            Some(Bson::Boolean(false)) => Some(false),
            Some(Bson::Boolean(true)) => {
                return Err(CommandError::new(
                    72,
                    "InvalidOptions",
                    "autocommit: true is not allowed; omit it for a retryable write or send false for a transaction",
                ))
            }
            Some(other) => {
                return Err(CommandError::type_mismatch(format!(
                    "BSON field 'autocommit' is the wrong type '{}', expected type 'bool'",
                    duetdb::raw::type_name(other)
                )))
            }
        };
        let start_transaction = match cmd.get("startTransaction") {
            None | Some(Bson::Null) => false,
            Some(Bson::Boolean(true)) => true,
            Some(Bson::Boolean(false)) => {
                return Err(CommandError::new(
                    72,
                    "InvalidOptions",
                    "startTransaction may only be true",
                ))
            }
            Some(other) => {
                return Err(CommandError::type_mismatch(format!(
                    "BSON field 'startTransaction' is the wrong type '{}', expected type 'bool'",
                    duetdb::raw::type_name(other)
                )))
            }
        };
        if start_transaction && autocommit != Some(false) {
            return Err(CommandError::new(
                72,
                "InvalidOptions",
                "startTransaction requires autocommit: false",
            ));
        }
        if autocommit.is_some() && (lsid.is_none() || txn_number.is_none()) {
            return Err(CommandError::new(
                72,
                "InvalidOptions",
                "a transaction command requires lsid and txnNumber",
            ));
        }
        if txn_number.is_some() && lsid.is_none() {
            return Err(CommandError::new(
                72,
                "InvalidOptions",
                "txnNumber requires a session id (lsid)",
            ));
        }
        Ok(SessionArgs {
            lsid,
            txn_number,
            autocommit,
            start_transaction,
        })
    }

    /// True for a command of a multi-document transaction.
    pub fn in_transaction(&self) -> bool {
        self.autocommit == Some(false)
    }
}

/// The session id of an `lsid` document (`{id: <binary>}`).
pub fn session_id(lsid: &Document) -> CmdResult<SessionId> {
    match lsid.get("id") {
        Some(Bson::Binary(b)) if !b.bytes.is_empty() && b.bytes.len() <= MAX_SESSION_ID_BYTES => {
            Ok(b.bytes.clone())
        }
        Some(Bson::Binary(_)) => Err(CommandError::bad_value(
            "lsid.id must be a UUID (16 bytes of binary)",
        )),
        Some(other) => Err(CommandError::type_mismatch(format!(
            "BSON field 'lsid.id' is the wrong type '{}', expected type 'binData'",
            duetdb::raw::type_name(other)
        ))),
        None => Err(CommandError::new(
            40414,
            "Location40414",
            "BSON field 'lsid.id' is missing but a required field",
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bson::{doc, spec::BinarySubtype, Binary};

    fn lsid(b: u8) -> Document {
        doc! {"id": Binary {subtype: BinarySubtype::Uuid, bytes: vec![b; 16]}}
    }

    #[test]
    fn parse_session_fields() {
        let a = SessionArgs::parse(&doc! {"find": "c", "lsid": lsid(1), "txnNumber": 3i64,
        "autocommit": false, "startTransaction": true})
        .expect("parse");
        assert!(a.in_transaction() && a.start_transaction);
        assert_eq!(a.txn_number, Some(3));
        let e = SessionArgs::parse(&doc! {"find": "c", "autocommit": false}).expect_err("no lsid");
        assert_eq!(e.code, 72);
        let e = SessionArgs::parse(&doc! {"find": "c", "lsid": lsid(1), "txnNumber": 1i64,
        "startTransaction": true})
        .expect_err("no autocommit");
        assert_eq!(e.code, 72);
        let e = SessionArgs::parse(&doc! {"find": "c", "lsid": {"id": "x"}}).expect_err("type");
        assert_eq!(e.code, 14);
    }

    #[test]
    fn limit_end_and_reap() {
        let t = SessionTable::new(2, Duration::from_millis(0), Duration::from_secs(3600));
        t.get_or_create(&[1]).expect("one");
        t.get_or_create(&[2]).expect("two");
        t.get_or_create(&[1]).expect("existing");
        assert_eq!(t.get_or_create(&[3]).expect_err("limit").code, 261);
        assert_eq!(t.end(&[vec![1], vec![9]]), 1);
        t.get_or_create(&[3]).expect("room again");

        let db = duetdb::Database::in_memory();
        let s = t.get_or_create(&[2]).expect("two");
        s.lock().state = TxnState::InProgress {
            txn: Box::new(db.begin(duetdb::TxnOptions::default())),
            db: "d".into(),
            started: Instant::now(),
        };
        assert_eq!(t.stats().open_transactions, 1);
        std::thread::sleep(Duration::from_millis(2));
        assert_eq!(t.reap(Instant::now()), (1, 0));
        assert!(matches!(s.lock().state, TxnState::Aborted { .. }));

        let idle = SessionTable::new(10, Duration::from_secs(60), Duration::from_millis(0));
        idle.get_or_create(&[7]).expect("seven");
        std::thread::sleep(Duration::from_millis(2));
        assert_eq!(idle.reap(Instant::now()), (0, 1));
        assert_eq!(idle.stats().sessions, 0);
    }
}
