//! Sessions over the wire: multi-document transactions (`startTransaction`,
//! `autocommit: false`, `commitTransaction`, `abortTransaction`), retryable
//! writes (`txnNumber` without `autocommit`), `endSessions` and
//! `killSessions` (which also kill the sessions' cursors). The per-session state lives in `sessions.rs`.
//!
//! Rules, following MongoDB's server behaviour that drivers rely on:
//! - a `txnNumber` below the session's newest is refused (TransactionTooOld,
//!   225); a newer one aborts the session's open transaction;
//! - `startTransaction: true` begins an engine transaction on the command's
//!   database (its snapshot is the latest published state); only that first
//!   command may carry a `readConcern` (level local, majority or snapshot —
//!   all mean "the transaction's snapshot" here);
//! - a transaction command that finds no open transaction under its number
//!   gets NoSuchTransaction (251) labelled `TransientTransactionError`, so
//!   `with_transaction` retries the whole transaction;
//! - a command that fails inside a transaction (an error or a write error)
//!   aborts it, as MongoDB does; commands a transaction cannot run get
//!   OperationNotSupportedInTransaction (263) and abort it too;
//! - the CRUD commands of a transaction are the ordinary ones (`read.rs`,
//!   `write.rs`) run on the transaction's view of a collection: they read
//!   its snapshot overlaid with its own writes, so results are materialized
//!   (a cursor holds documents, not a snapshot) and `hint` is ignored; `$duet`
//!   strategies and named snapshots, `explain` and database-level aggregates
//!   are refused (263); an error that ends the transaction (write conflict,
//!   112; aborted, 251; lifetime, 290; too large, 257) fails the command
//!   rather than becoming a `writeErrors` entry, so its labels reach the driver;
//! - `commitTransaction` of an already committed number answers ok again (a
//!   driver's commit retry); a write conflict at commit is labelled
//!   `TransientTransactionError`, an outcome we cannot vouch for (storage
//!   failure, shutdown, timeout) `UnknownTransactionCommitResult`;
//! - a retryable write runs once per (session, txnNumber): its reply is
//!   remembered, and a retry with the same number gets that reply back
//!   without running again.
//!
//! A transaction spans one database (the engine's transactions are per
//! database); a command of the transaction on another database gets 263.

use std::sync::Arc;
use std::time::Instant;

use bson::{doc, Bson, Document};
use duetdb::TxnOptions;
use parking_lot::Mutex;

use super::source::Target;
use super::Ctx;
use crate::error::{CmdResult, CommandError};
use crate::sessions::{Session, SessionArgs, SessionId, TxnState};

pub const TRANSIENT: &str = "TransientTransactionError";
pub const UNKNOWN_COMMIT: &str = "UnknownTransactionCommitResult";

/// Commands a transaction may run (others get 263).
pub const IN_TRANSACTION: &[&str] = &[
    "find",
    "getMore",
    "killCursors",
    "insert",
    "update",
    "delete",
    "findAndModify",
    "findandmodify",
    "count",
    "distinct",
    "aggregate",
];

pub fn not_in_transaction(what: &str) -> CommandError {
    CommandError::new(
        263,
        "OperationNotSupportedInTransaction",
        format!("Cannot run {what} in a multi-document transaction."),
    )
}

/// Commands a retryable write may be.
pub const RETRYABLE_WRITES: &[&str] = &[
    "insert",
    "update",
    "delete",
    "findAndModify",
    "findandmodify",
];

fn no_such_transaction(msg: String) -> CommandError {
    CommandError::new(251, "NoSuchTransaction", msg).with_label(TRANSIENT)
}

fn too_old(n: i64, newest: i64) -> CommandError {
    CommandError::new(
        225,
        "TransactionTooOld",
        format!("txnNumber {n} is older than this session's newest transaction number {newest}"),
    )
}

fn check_not_too_old(s: &Session, n: i64) -> CmdResult<()> {
    match s.txn_number {
        Some(newest) if n < newest => Err(too_old(n, newest)),
        _ => Ok(()),
    }
}

/// Labels of an error returned from inside a transaction: the ones after
/// which retrying the whole transaction may succeed.
fn label_transient(e: CommandError) -> CommandError {
    if matches!(e.code, 112 | 251 | 290) {
        e.with_label(TRANSIENT)
    } else {
        e
    }
}

fn session_of(ctx: &Ctx<'_>, args: &SessionArgs) -> CmdResult<(SessionId, i64)> {
    match (&args.lsid, args.txn_number) {
        (Some(id), Some(n)) => Ok((id.clone(), n)),
        _ => Err(CommandError::new(
            72,
            "InvalidOptions",
            format!(
                "this command requires lsid and txnNumber (database '{}')",
                ctx.db
            ),
        )),
    }
}

/// The session's entry (created when new); callers lock it for the whole
/// command (see `sessions.rs`).
fn session_entry(ctx: &Ctx<'_>, id: &[u8]) -> CmdResult<Arc<Mutex<Session>>> {
    ctx.state.sessions.get_or_create(id)
}

/// The readConcern of a transaction's first command: levels that all mean
/// "the transaction's snapshot"; `afterClusterTime` is accepted (one node
/// already sees all its own writes); `atClusterTime` cannot be honoured
/// (a transaction starts at the latest state) and is refused.
fn check_first_read_concern(cmd: &Document) -> CmdResult<()> {
    let Some(rc) = crate::args::opt_doc(cmd, "readConcern")? else {
        return Ok(());
    };
    let level = crate::args::opt_str(rc, "level")?.unwrap_or("local");
    if !matches!(level, "local" | "majority" | "snapshot") {
        return Err(CommandError::new(
            72,
            "InvalidOptions",
            format!("read concern level '{level}' is not allowed in a transaction (local, majority, snapshot)"),
        ));
    }
    if rc.contains_key("atClusterTime") {
        return Err(CommandError::new(
            72,
            "InvalidOptions",
            "readConcern atClusterTime is not supported in a transaction by duetdb: a transaction reads the latest state at its start",
        ));
    }
    Ok(())
}

/// A command of a multi-document transaction (`autocommit: false`).
pub fn in_transaction(ctx: &Ctx<'_>, name: &str, cmd: &Document, args: &SessionArgs) -> CmdResult {
    let (id, n) = session_of(ctx, args)?;
    let session = session_entry(ctx, &id)?;
    let mut s = session.lock();
    s.last_use = Instant::now();
    check_not_too_old(&s, n)?;
    if args.start_transaction {
        if s.txn_number == Some(n) {
            return Err(CommandError::new(
                50911,
                "Location50911",
                format!(
                    "Cannot start a transaction at txnNumber {n}: this session already used that number ({})",
                    s.state.name()
                ),
            ));
        }
        check_first_read_concern(cmd)?;
        s.abort_open("a newer transaction started on its session");
        s.txn_number = Some(n);
        s.state = TxnState::None;
        let db = ctx.database()?;
        let options = TxnOptions {
            lifetime: Some(ctx.state.config.transaction_lifetime),
            ..TxnOptions::default()
        };
        s.state = TxnState::InProgress {
            txn: Box::new(db.begin(options)),
            db: ctx.db.to_string(),
            started: Instant::now(),
        };
    } else {
        if cmd.contains_key("readConcern") {
            return Err(CommandError::new(
                72,
                "InvalidOptions",
                "Only the first command in a transaction may specify a readConcern",
            ));
        }
        if s.txn_number != Some(n) {
            return Err(no_such_transaction(format!(
                "Given transaction number {n} does not match any in-progress transactions on this session"
            )));
        }
        match &s.state {
            TxnState::InProgress { .. } => {}
            TxnState::Committed => return Err(transaction_committed(n)),
            TxnState::Aborted { reason } => {
                return Err(no_such_transaction(format!(
                    "Transaction {n} has been aborted: {reason}"
                )))
            }
            other => {
                return Err(no_such_transaction(format!(
                    "txnNumber {n} of this session is not a transaction ({})",
                    other.name()
                )))
            }
        }
    }
    let result = run_in_open(ctx, name, cmd, &mut s);
    let failed = match &result {
        Err(_) => true,
        Ok(reply) => reply.contains_key("writeErrors"),
    };
    let dead = matches!(&s.state, TxnState::InProgress { txn, .. } if !txn.is_active());
    if failed || dead {
        let why = match &result {
            Err(e) => format!("'{name}' failed in it: {}", e.message),
            Ok(_) => format!("'{name}' had write errors in it"),
        };
        s.abort_open(&why);
    }
    result.map_err(label_transient)
}

/// Run `name` in the session's open transaction.
fn run_in_open(ctx: &Ctx<'_>, name: &str, cmd: &Document, s: &mut Session) -> CmdResult {
    let TxnState::InProgress { txn, db, .. } = &mut s.state else {
        return Err(CommandError::internal("no open transaction to run in"));
    };
    if !IN_TRANSACTION.contains(&name) {
        return Err(not_in_transaction(&format!("'{name}'")));
    }
    if db != ctx.db {
        return Err(not_in_transaction(&format!(
            "'{name}' on database '{}' (this transaction is on '{db}'; a duetdb transaction spans one database)",
            ctx.db
        )));
    }
    if cmd.contains_key("$duet") {
        return Err(not_in_transaction(
            "a $duet snapshot strategy or named snapshot",
        ));
    }
    super::crud(ctx, name, cmd, &mut Target::Txn(txn))
        .unwrap_or_else(|| Err(not_in_transaction(&format!("'{name}'"))))
}

/// `commitTransaction` / `abortTransaction`.
pub fn finish(ctx: &Ctx<'_>, name: &str, args: &SessionArgs) -> CmdResult {
    let (id, n) = session_of(ctx, args)?;
    let commit_retry = name == "commitTransaction";
    let Some(session) = ctx.state.sessions.get(&id) else {
        if super::repl::committed_transaction(ctx, &id, n) {
            // A commit retried: ok; an abort: 256, as MongoDB answers both
            // from its replicated `config.transactions`.
            let reply = recognised_commit(ctx, &id, n)?;
            return if commit_retry {
                Ok(reply)
            } else {
                Err(transaction_committed(n))
            };
        }
        return Err(no_such_transaction(format!(
            "no transaction {n} on this session (the session has no server-side state: ended, expired, or never started one)"
        )));
    };
    let mut s = session.lock();
    s.last_use = Instant::now();
    check_not_too_old(&s, n)?;
    if s.txn_number != Some(n) && super::repl::committed_transaction(ctx, &id, n) {
        // Committed on another member (or before this one restarted): the
        // session learns it, then answers as for its own commit (an abort
        // of it is 256).
        committed_elsewhere(&mut s, n);
    }
    if s.txn_number != Some(n) {
        return Err(no_such_transaction(format!(
            "Given transaction number {n} does not match any in-progress transactions on this session"
        )));
    }
    if name == "commitTransaction" {
        commit(ctx, &mut s, &id, n)
    } else {
        abort(&mut s, n)
    }
}

/// A retried `commitTransaction` of a transaction the replica set committed
/// while this member's session table never saw it (it ran on a primary that
/// failed since, or before this member restarted): ok, as MongoDB answers
/// it. The session then knows the number as committed (so an
/// `abortTransaction` of it gets 256, a start with it 50911).
fn recognised_commit(ctx: &Ctx<'_>, id: &[u8], n: i64) -> CmdResult {
    let session = session_entry(ctx, id)?;
    let mut s = session.lock();
    s.last_use = Instant::now();
    check_not_too_old(&s, n)?;
    Ok(committed_elsewhere(&mut s, n))
}

fn committed_elsewhere(s: &mut Session, n: i64) -> Document {
    s.abort_open("a newer txnNumber arrived on its session");
    s.txn_number = Some(n);
    s.state = TxnState::Committed;
    tracing::info!(
        txn_number = n,
        "commitTransaction or abortTransaction of a transaction the set committed: the session knows it committed"
    );
    doc! {"ok": 1.0}
}

fn commit(ctx: &Ctx<'_>, s: &mut Session, id: &SessionId, n: i64) -> CmdResult {
    match std::mem::replace(&mut s.state, TxnState::None) {
        TxnState::InProgress { mut txn, db, .. } => {
            // Change events of the commit carry the session and number.
            let lsid = bson::Binary {
                subtype: bson::spec::BinarySubtype::Uuid,
                bytes: id.clone(),
            };
            if let Ok(origin) =
                bson::RawDocumentBuf::try_from(&doc! {"lsid": {"id": lsid}, "txnNumber": n})
            {
                txn.set_origin(origin);
            }
            // The replica set commits the transaction's tag with it, so a
            // retried commit is recognised on any member that applied it.
            if let Some(tag) = super::repl::transaction_tag(ctx.state, id, n) {
                txn.tag(tag);
            }
            // A transaction that began before its database existed creates it now.
            if txn.write_count() > 0 {
                if let Err(e) = ctx.commit_target(&mut txn, &db) {
                    s.state = TxnState::Aborted {
                        reason: format!("its commit failed: {}", e.message),
                    };
                    return Err(label_transient(e));
                }
            }
            commit_now(s, *txn)
        }
        TxnState::Committed => {
            s.state = TxnState::Committed;
            Ok(doc! {"ok": 1.0})
        }
        TxnState::Aborted { reason } => {
            let e = no_such_transaction(format!("Transaction {n} has been aborted: {reason}"));
            s.state = TxnState::Aborted { reason };
            Err(e)
        }
        other => {
            let e = no_such_transaction(format!(
                "txnNumber {n} of this session is not a transaction ({})",
                other.name()
            ));
            s.state = other;
            Err(e)
        }
    }
}

fn commit_now(s: &mut Session, txn: duetdb::Transaction) -> CmdResult {
    match txn.commit() {
        Ok(_) => {
            s.state = TxnState::Committed;
            Ok(doc! {"ok": 1.0})
        }
        Err(e) => {
            s.state = TxnState::Aborted {
                reason: format!("its commit failed: {e}"),
            };
            Err(commit_error(e))
        }
    }
}

/// The labels of a failed commit: retry the transaction after a conflict or
/// a lost transaction; the outcome is unknown after storage trouble or
/// shutdown; a constraint violation (duplicate key) is final.
fn commit_error(e: duetdb::Error) -> CommandError {
    let unknown = matches!(
        e,
        duetdb::Error::Storage(_) | duetdb::Error::Closed | duetdb::Error::Internal(_)
    );
    let out = label_transient(CommandError::from(e));
    if unknown {
        out.with_label(UNKNOWN_COMMIT)
    } else {
        out
    }
}

/// 256 TransactionCommitted: an `abortTransaction` (or any command but a
/// retried commit) of transaction `n`, committed; MongoDB's words.
fn transaction_committed(n: i64) -> CommandError {
    CommandError::new(
        256,
        "TransactionCommitted",
        format!("Transaction {n} has been committed."),
    )
}

fn abort(s: &mut Session, n: i64) -> CmdResult {
    match &s.state {
        TxnState::InProgress { .. } => {
            s.abort_open("abortTransaction");
            Ok(doc! {"ok": 1.0})
        }
        TxnState::Committed => Err(transaction_committed(n)),
        TxnState::Aborted { reason } => Err(no_such_transaction(format!(
            "Transaction {n} has been aborted: {reason}"
        ))),
        other => Err(no_such_transaction(format!(
            "txnNumber {n} of this session is not a transaction ({})",
            other.name()
        ))),
    }
}

/// A retryable write: run `run` once per (session, txnNumber); a retry gets
/// the remembered reply. A reply with `ok: 0` is not remembered (the write
/// as a whole did not happen), so a retry runs it again. A batch that
/// applied only some of its statements (its reply has `writeErrors`) runs
/// the others again on a retry, as MongoDB does (`retry.rs`): `run` is
/// given the command to run. A write this session does not know but the
/// replica set applied (before a failover or a restart) is answered from
/// the set's table (`repl::retried`).
pub fn retryable_write(
    ctx: &Ctx<'_>,
    name: &str,
    cmd: &Document,
    args: &SessionArgs,
    run: impl FnOnce(&Document) -> CmdResult,
) -> CmdResult {
    if !RETRYABLE_WRITES.contains(&name) {
        return Err(CommandError::new(
            50768,
            "Location50768",
            format!("txnNumber may only be provided for multi-document transactions and retryable write commands, not '{name}'"),
        ));
    }
    let (id, n) = session_of(ctx, args)?;
    let session = session_entry(ctx, &id)?;
    let mut s = session.lock();
    s.last_use = Instant::now();
    check_not_too_old(&s, n)?;
    let mut applied = None;
    if s.txn_number == Some(n) {
        match &s.state {
            TxnState::Written { reply } => match super::retry::from_reply(name, cmd, reply) {
                Some(rec) => applied = Some(rec),
                None => {
                    tracing::debug!(conn = ctx.conn.id, txn_number = n, "retried write answered from the session");
                    return Ok(reply.clone());
                }
            },
            TxnState::None => {}
            other => {
                return Err(CommandError::new(
                    20,
                    "IllegalOperation",
                    format!(
                        "txnNumber {n} of this session was used by a transaction ({}), not a retryable write",
                        other.name()
                    ),
                ))
            }
        }
    } else {
        s.abort_open("a newer txnNumber arrived on its session");
        s.txn_number = Some(n);
        s.state = TxnState::None;
    }
    let result = match applied {
        Some(rec) => super::retry::answer(ctx, name, cmd, rec, run),
        None => match super::repl::retried(ctx, name, cmd) {
            Some(super::repl::Retried::Reply(reply)) => Ok(reply),
            Some(super::repl::Retried::Partly(rec)) => {
                super::retry::answer(ctx, name, cmd, rec, run)
            }
            None => run(cmd),
        },
    };
    if let Ok(reply) = &result {
        s.state = TxnState::Written {
            reply: reply.clone(),
        };
    }
    result
}

/// The session ids of an `endSessions`/`killSessions` array.
fn session_ids(cmd: &Document, field: &str) -> CmdResult<Vec<SessionId>> {
    let list = crate::args::opt_array(cmd, field)?
        .map(Vec::as_slice)
        .unwrap_or(&[]);
    list.iter()
        .map(|v| match v {
            Bson::Document(l) => crate::sessions::session_id(l),
            other => Err(CommandError::type_mismatch(format!(
                "{field} entries must be session ids (objects), not {:?}",
                other.element_type()
            ))),
        })
        .collect()
}

/// `endSessions: [lsid...]`: forget the sessions, aborting open transactions.
pub fn end_sessions(ctx: &Ctx<'_>, cmd: &Document) -> CmdResult {
    let ids = session_ids(cmd, "endSessions")?;
    ctx.state.sessions.end(&ids);
    ctx.state.cursors.kill_sessions(&ids);
    Ok(doc! {"ok": 1.0})
}

/// `killSessions: [lsid...]` (an empty list: every session — there are no
/// users to tell apart) and `killAllSessions`.
pub fn kill_sessions(ctx: &Ctx<'_>, name: &str, cmd: &Document) -> CmdResult {
    let ids = if name == "killSessions" {
        session_ids(cmd, name)?
    } else {
        Vec::new()
    };
    if ids.is_empty() {
        ctx.state.sessions.end_all();
        ctx.state.cursors.kill_all_sessions();
    } else {
        ctx.state.sessions.end(&ids);
        ctx.state.cursors.kill_sessions(&ids);
    }
    Ok(doc! {"ok": 1.0})
}
