//! Command dispatch: from one command document (already validated and with its
//! document sequences merged) to one reply document.
//!
//! Runs on a blocking thread (the connection task calls it through
//! `spawn_blocking`), so engine calls never stall the async runtime.
//!
//! Before anything else a command's name must be one of [`COMMANDS`] (or an
//! alias, [`ALIASES`]), else 59; then `auth::check` decides, under `--auth`,
//! whether the connection's user may run it (the table in `auth/table.rs`).
//!
//! Session fields route a command first (see `txn.rs`): `autocommit: false`
//! runs it inside the session's transaction (the same CRUD commands as
//! outside, on the transaction's view of a collection: see `source.rs`),
//! `txnNumber` alone makes it a retryable write,
//! `commitTransaction`/`abortTransaction` end a transaction.
//! Other generic fields drivers add (`$clusterTime`, `$readPreference`,
//! `writeConcern`, `comment`, `apiVersion`, `apiStrict`,
//! `apiDeprecationErrors`) are accepted and ignored: a single node
//! acknowledges every write once it is visible. `maxTimeMS` is enforced by
//! the caller, through the command's cancellation token (`Ctx::cancel`),
//! which every read checks once per page of work. Things we cannot honor are refused, never silently ignored:
//! the reserved `$duet` field with unknown options, read concern `snapshot`
//! outside find/aggregate/distinct, `$duet.workNsPerDoc` outside `count`.
//!
//! Databases come into being by writes only ([`may_create`] is the one place
//! that decides): a command that writes creates its database; every other
//! command on a database that does not exist runs on an empty stand-in that
//! is never registered, so reads, deletes, drops and stats leave nothing
//! behind (no directory, file or thread). A transaction creates its database
//! when it commits writes (`txn.rs`), and a command that created a database
//! but committed nothing (a failed insert) forgets it again.

pub mod admin;
pub mod backup;
pub mod capped;
pub mod changes;
pub mod currentop;
pub mod ddl;
pub mod explain;
pub mod fields;
pub mod handshake;
pub mod named;
pub mod oplog;
pub mod read;
pub mod repl;
pub mod retry;
pub mod snapdb;
pub mod source;
pub mod stats;
pub mod tailable;
pub mod txn;
pub mod write;

use std::cell::Cell;
use std::sync::Arc;

use bson::{doc, Bson, Document, Timestamp};
use duetdb::{Database, Transaction};

use crate::auth;
use crate::error::{CmdResult, CommandError};
use crate::sessions::{SessionArgs, SessionId};
use crate::state::{ConnInfo, OpCounters, ServerState};
use source::Target;

/// Everything a command handler may use.
pub struct Ctx<'a> {
    pub state: &'a Arc<ServerState>,
    pub conn: &'a ConnInfo,
    /// The database the command was sent to (`$db`).
    pub db: &'a str,
    /// The command may create its database ([`may_create`]).
    pub create: bool,
    /// [`Ctx::database`] created the database.
    pub created: Cell<bool>,
    /// The command's logical session (`lsid.id`), if it has one: cursors it
    /// opens belong to it (else to the connection).
    pub lsid: Option<&'a SessionId>,
    /// Cancelled by `maxTimeMS`, `killOp`, the client closing its
    /// connection, or shutdown; reads check it once per page of work.
    pub cancel: &'a duetdb::CancelToken,
    /// Where the command reports what its read runs on (`currentOp`, the
    /// slow-operation log); `None` off the connection path.
    pub report: Option<&'a crate::ops::OpReport>,
    /// The tag of the retryable write this command is (its `lsid` and
    /// `txnNumber`) on a server that keeps a retry table (a replica-set
    /// member's, or its own outside a set): its writes carry it, so the
    /// table learns the write was applied (`repl.rs`).
    pub origin: Option<Arc<[u8]>>,
    /// The statement ids of the batch's items when they are not their
    /// positions (a retried batch runs the statements it did not apply
    /// under their original ids: `retry.rs`).
    pub stmts: std::cell::RefCell<Option<Arc<[u32]>>>,
    /// The positions in the command of the items of the write an update or
    /// delete batch is running (its statements, which carry their ids;
    /// `None`: an insert's items are its documents).
    pub items: std::cell::RefCell<Option<Arc<[usize]>>>,
    /// Where a find by one `_id` may leave its cursor as the stored
    /// document's bytes, for the connection to write into the reply as they
    /// are (`read::point_find`); `None` off the connection's inline path.
    pub raw_cursor: Option<&'a read::RawCursorSlot>,
}

impl Ctx<'_> {
    /// The command's database: created when the command may create it,
    /// else the existing one or an empty stand-in that is never registered.
    /// (`db@snapshot`, a named snapshot read as a database: its database,
    /// see `snapdb.rs`.)
    pub fn database(&self) -> CmdResult<Database> {
        self.database_named(snapdb::base(self.db))
    }

    /// The named snapshot the database name selects (`db@snapshot`).
    pub fn snapshot_name(&self) -> Option<&str> {
        snapdb::split(self.db).ok().flatten().map(|(_, s)| s)
    }

    /// The state metadata reads (listCollections, listIndexes, stats) see:
    /// the named snapshot of `db@snapshot`, else the latest published one.
    pub fn read_snapshot(&self) -> CmdResult<duetdb::Snapshot> {
        let db = self.database()?;
        Ok(match self.snapshot_name() {
            Some(name) => db.named_snapshot(name)?,
            None => db.snapshot(),
        })
    }

    /// [`Ctx::database`] for a database named in the command (renameCollection).
    pub fn database_named(&self, name: &str) -> CmdResult<Database> {
        let tagged = |db: Database| self.tagged(db);
        if self.create {
            let (db, created) = self.state.engine.database_created(name)?;
            if created && name == self.db {
                self.created.set(true);
            }
            return Ok(tagged(db));
        }
        Ok(tagged(
            self.state
                .engine
                .get(name)?
                .unwrap_or_else(|| Database::named(name, None)),
        ))
    }

    /// Database `name` opened for a write the command makes there (a
    /// cross-database `$out`), created if missing; whether this created it.
    pub fn database_created_named(&self, name: &str) -> CmdResult<(Database, bool)> {
        let (db, created) = self.state.engine.database_created(name)?;
        Ok((self.tagged(db), created))
    }

    /// `db` writing as this command's client operation (a retryable
    /// write's tag, replicated with its writes).
    fn tagged(&self, db: Database) -> Database {
        let Some(o) = &self.origin else {
            return db;
        };
        let db = db.with_origin(o.clone());
        let ids = self.stmts.borrow().clone();
        match self.items.borrow().as_deref() {
            Some(items) => db.with_statements(
                items
                    .iter()
                    .map(|&i| {
                        let own = u32::try_from(i).unwrap_or(u32::MAX);
                        ids.as_ref()
                            .map_or(own, |s| s.get(i).copied().unwrap_or(own))
                    })
                    .collect(),
            ),
            None => match ids {
                Some(ids) => db.with_statements(ids),
                None => db,
            },
        }
    }

    /// Make `txn`, a transaction on database `name` with writes to commit,
    /// commit to the registered database: one that began on a stand-in (its
    /// database did not exist) moves to the database, created now. It fails
    /// with WriteConflict (112) when the database was dropped or recreated
    /// meanwhile.
    pub fn commit_target(&self, txn: &mut Transaction, name: &str) -> CmdResult<()> {
        if let Some(db) = self.state.engine.get(name)? {
            if txn.is_on(&db) {
                return Ok(());
            }
        }
        let (db, created) = self.state.engine.database_created(name)?;
        let rebound = txn.rebind(&db);
        drop(db);
        if rebound.is_err() && created {
            self.state.engine.discard_if_unused(name);
        }
        Ok(rebound?)
    }

    /// Record what this command's read runs on (`source::read_source`).
    pub fn note_read(&self, coll: &str, cmd: &Document, source: &source::ReadSource<'_>) {
        let Some(report) = self.report else {
            return;
        };
        let (strategy, snapshot) = match source {
            source::ReadSource::Live { strategy, .. } => (strategy.name(), None),
            source::ReadSource::Held { snap, .. } => ("cow", Some(snap.clone())),
            source::ReadSource::Txn(_) => ("transaction", None),
        };
        report.note_read(crate::ops::ReadNote {
            db: self.db.to_string(),
            coll: coll.to_string(),
            command: report.command_arc(cmd),
            strategy,
            snapshot,
        });
    }

    pub fn ns(&self, coll: &str) -> String {
        format!("{}.{}", self.db, coll)
    }

    /// The owner of cursors this command opens or uses: its session (else
    /// its connection) and, under `--auth`, its user — only that user may
    /// use them, as in MongoDB.
    pub fn cursor_owner(&self) -> crate::cursor::Owner {
        let owner = crate::cursor::Owner::of(self.lsid, self.conn.id);
        if !self.state.config.auth {
            return owner;
        }
        owner.with_user(
            self.conn
                .auth
                .user()
                .map(|(user, db)| crate::auth::users::user_id(&db, &user)),
        )
    }
}

pub(crate) enum ReadConcern {
    Default,
    Snapshot(Option<Timestamp>),
}

pub(crate) fn read_concern(cmd: &Document) -> CmdResult<ReadConcern> {
    let Some(rc) = crate::args::opt_doc(cmd, "readConcern")? else {
        return Ok(ReadConcern::Default);
    };
    let level = crate::args::opt_str(rc, "level")?.unwrap_or("local");
    match level {
        "local" | "available" | "majority" | "linearizable" => Ok(ReadConcern::Default),
        "snapshot" => {
            let at = match rc.get("atClusterTime") {
                None | Some(Bson::Null) => None,
                Some(Bson::Timestamp(ts)) => Some(*ts),
                Some(other) => {
                    return Err(CommandError::type_mismatch(format!(
                        "readConcern.atClusterTime must be a timestamp, not {:?}",
                        other.element_type()
                    )))
                }
            };
            Ok(ReadConcern::Snapshot(at))
        }
        other => Err(CommandError::bad_value(format!(
            "invalid read concern level '{other}'"
        ))),
    }
}

/// The commands we answer, with one-line help: `listCommands` reports them,
/// dispatch refuses any other name (59 CommandNotFound) before a handler
/// could see it, and the authorization table (`auth/table.rs`) has an entry
/// for each (tests check all three agree).
pub const COMMANDS: &[(&str, &str)] = &[
    ("hello", "handshake: server description"),
    ("isMaster", "legacy handshake (alias ismaster)"),
    ("ping", "liveness check"),
    ("buildInfo", "server version"),
    ("hostInfo", "host description"),
    ("getParameter", "read server parameters"),
    (
        "setParameter",
        "change a server parameter at runtime (admin)",
    ),
    (
        "getCmdLineOpts",
        "the server's command line and effective configuration",
    ),
    ("getLog", "recent log lines (admin)"),
    ("top", "time and count per namespace (admin)"),
    (
        "shutdown",
        "shut the server down (admin; loopback or the shutdown action)",
    ),
    (
        "fsync",
        "checkpoint every database; lock: true makes writes wait (admin)",
    ),
    ("fsyncUnlock", "release an fsync lock (admin)"),
    (
        "duetBackup",
        "hot backup of every database into a new directory (admin)",
    ),
    ("whatsmyuri", "the client's address"),
    ("connectionStatus", "the authenticated user and its roles"),
    ("logout", "forget the connection's authentication"),
    (
        "saslStart",
        "begin SCRAM-SHA-256 / SCRAM-SHA-1 authentication",
    ),
    ("saslContinue", "continue a SASL conversation"),
    ("authenticate", "refused: only SCRAM via saslStart"),
    ("createUser", "create a user of this database"),
    ("updateUser", "change a user's password or roles"),
    ("dropUser", "remove a user"),
    (
        "dropAllUsersFromDatabase",
        "remove every user of this database",
    ),
    ("usersInfo", "describe users (never their credentials)"),
    ("grantRolesToUser", "add roles to a user"),
    ("revokeRolesFromUser", "remove roles from a user"),
    ("listCommands", "this list"),
    ("serverStatus", "counters and engine figures"),
    ("currentOp", "operations in flight (admin)"),
    ("killOp", "cancel an operation by opid (admin)"),
    ("listDatabases", "databases holding collections"),
    ("listCollections", "collections of a database"),
    ("create", "create a collection"),
    ("drop", "drop a collection"),
    ("dropDatabase", "drop a database"),
    ("renameCollection", "rename a collection within a database"),
    (
        "convertToCapped",
        "replace a collection by a capped copy of its newest documents",
    ),
    (
        "cloneCollectionAsCapped",
        "copy a collection's newest documents into a new capped collection",
    ),
    ("collStats", "collection statistics"),
    ("dbStats", "database statistics"),
    ("validate", "check a collection's records and indexes"),
    (
        "createSnapshot",
        "duet: pin a named snapshot of the database",
    ),
    (
        "listSnapshots",
        "duet: named snapshots with their csn, age and retained bytes",
    ),
    ("dropSnapshot", "duet: release a named snapshot"),
    ("insert", "insert documents"),
    ("find", "query documents"),
    ("getMore", "next batch of a cursor"),
    ("killCursors", "close cursors"),
    ("update", "update documents"),
    ("delete", "delete documents"),
    (
        "findAndModify",
        "update or delete one document and return it",
    ),
    ("count", "count matching documents"),
    ("distinct", "distinct values of a field"),
    (
        "aggregate",
        "pipelines of $match/$sort/$skip/$limit/$project/$count",
    ),
    ("createIndexes", "build indexes"),
    ("listIndexes", "indexes of a collection"),
    ("collMod", "change an index's expireAfterSeconds (TTL)"),
    (
        "duetRunTtlPass",
        "test hook (--enable-test-knobs): run one TTL monitor pass now",
    ),
    ("dropIndexes", "drop indexes"),
    (
        "explain",
        "plan and execution statistics of find/count/distinct/aggregate/update/delete/findAndModify",
    ),
    (
        "commitTransaction",
        "commit the session's multi-document transaction",
    ),
    (
        "abortTransaction",
        "abort the session's multi-document transaction",
    ),
    (
        "endSessions",
        "end sessions, aborting their open transactions",
    ),
    ("killSessions", "kill sessions ([]: all sessions)"),
    ("killAllSessions", "kill every session"),
    (
        "replSetGetStatus",
        "replica-set members and their state (rs.status())",
    ),
    (
        "replSetGetConfig",
        "the replica-set configuration (rs.conf())",
    ),
    (
        "replSetStepDown",
        "make the primary step down so another member is elected",
    ),
    (
        "replSetReconfig",
        "change the replica-set members (refused: the set is fixed by --members)",
    ),
    (
        "applyOps",
        "apply oplog entries (mongorestore --oplogReplay), one by one",
    ),
];

/// Other spellings MongoDB accepts for some commands: `(alias, command)`.
pub const ALIASES: &[(&str, &str)] = &[
    ("ismaster", "isMaster"),
    ("buildinfo", "buildInfo"),
    ("findandmodify", "findAndModify"),
    ("deleteIndexes", "dropIndexes"),
    ("dbstats", "dbStats"),
];

/// The [`COMMANDS`] entry command `name` (or an alias of it) dispatches to.
pub fn canonical_name(name: &str) -> Option<&'static str> {
    COMMANDS
        .iter()
        .map(|(n, _)| *n)
        .find(|n| *n == name)
        .or_else(|| ALIASES.iter().find(|(a, _)| *a == name).map(|(_, n)| *n))
}

/// Execute one command that nothing can cancel; always returns a reply
/// document (`ok: 1` or an error).
pub fn execute(state: &Arc<ServerState>, conn: &ConnInfo, db: &str, cmd: &Document) -> Document {
    execute_with(state, conn, db, cmd, &duetdb::CancelToken::never())
}

/// Execute one command under `cancel` (the connection's path: `maxTimeMS`,
/// `killOp`, a closed connection and shutdown cancel it); always returns a
/// reply document.
pub fn execute_with(
    state: &Arc<ServerState>,
    conn: &ConnInfo,
    db: &str,
    cmd: &Document,
    cancel: &duetdb::CancelToken,
) -> Document {
    execute_op(state, conn, db, cmd, cancel, None)
}

/// [`execute_with`], reporting what the command reads to `report` (its
/// entry in the operation registry).
pub fn execute_op(
    state: &Arc<ServerState>,
    conn: &ConnInfo,
    db: &str,
    cmd: &Document,
    cancel: &duetdb::CancelToken,
    report: Option<&crate::ops::OpReport>,
) -> Document {
    execute_raw(state, conn, db, cmd, cancel, report, None)
}

/// [`execute_op`], where a find by one `_id` may answer with its cursor in
/// `raw_cursor` (the stored document's bytes) and the rest of its reply
/// (`ok`, the cluster time) as the returned document: the connection writes
/// the two together (`connection.rs`), byte for byte the reply
/// [`execute_op`] would have built.
pub fn execute_raw(
    state: &Arc<ServerState>,
    conn: &ConnInfo,
    db: &str,
    cmd: &Document,
    cancel: &duetdb::CancelToken,
    report: Option<&crate::ops::OpReport>,
    raw_cursor: Option<&read::RawCursorSlot>,
) -> Document {
    OpCounters::bump(&state.ops.command, 1);
    // `$$CLUSTER_TIME`: the cluster clock as the command starts (what the
    // reply's operationTime carries unless a commit lands meanwhile); a read
    // of a held snapshot binds its snapshot's time instead, inside.
    let started_at = state.engine.cluster_time();
    let outcome = duetdb::lang::under_read_time(started_at, || {
        dispatch(state, conn, db, cmd, cancel, report, raw_cursor)
    });
    let mut reply = match outcome {
        Ok(reply) => reply,
        Err(e) => {
            tracing::debug!(conn = conn.id, code = e.code, error = %e.message, "command failed");
            e.to_reply()
        }
    };
    cluster_time(state, &mut reply);
    reply
}

/// `operationTime` (unless the command set its own) and `$clusterTime`, as
/// a replica set member answers: the engine's cluster clock, which drivers
/// send back as `startAtOperationTime` and in `$clusterTime` (accepted and
/// ignored; the signature is a zero key: there is nothing to verify).
fn cluster_time(state: &ServerState, reply: &mut Document) {
    let now = changes::timestamp(state.engine.cluster_time());
    if !reply.contains_key("operationTime") {
        reply.insert("operationTime", now);
    }
    reply.insert(
        "$clusterTime",
        doc! {
            "clusterTime": now,
            "signature": {
                "hash": bson::Binary { subtype: bson::spec::BinarySubtype::Generic, bytes: vec![0; 20] },
                "keyId": 0_i64,
            },
        },
    );
}

/// The command's name (its first field).
pub fn command_name(cmd: &Document) -> Option<&str> {
    cmd.keys().next().map(String::as_str)
}

/// The snapshot strategy a command asks for with `$duet: {snapshot: "none" |
/// "vls" | "cow" | "auto"}`; `None` when it does not (the server then reads a
/// held copy-on-write root, as `cow`).
pub fn duet_strategy(cmd: &Document) -> CmdResult<Option<duetdb::Strategy>> {
    let Some(opts) = crate::args::opt_doc(cmd, "$duet")? else {
        return Ok(None);
    };
    let mut strategy = None;
    for (k, v) in opts {
        match (k.as_str(), v) {
            ("snapshotName", Bson::String(_)) => {}
            ("snapshotName", other) => {
                return Err(CommandError::type_mismatch(format!(
                    "$duet.snapshotName must be a string, not {:?}",
                    other.element_type()
                )))
            }
            ("snapshot", Bson::String(s)) => {
                strategy = Some(
                    s.parse::<duetdb::Strategy>()
                        .map_err(|e| CommandError::bad_value(e.to_string()))?,
                )
            }
            ("snapshot", other) => {
                return Err(CommandError::type_mismatch(format!(
                    "$duet.snapshot must be a string, not {:?}",
                    other.element_type()
                )))
            }
            ("workNsPerDoc", v) => {
                work_ns(v)?;
            }
            ("indexRead", v) => {
                index_read_of(v)?;
            }
            ("consistency", Bson::String(s)) => {
                named::Consistency::parse(s)?;
            }
            ("consistency", other) => {
                return Err(CommandError::type_mismatch(format!(
                    "$duet.consistency must be a string, not {:?}",
                    other.element_type()
                )))
            }
            (other, _) => {
                return Err(CommandError::bad_value(format!(
                "unknown $duet option '{other}' (supported: snapshot, snapshotName, consistency, workNsPerDoc, indexRead)"
            )))
            }
        }
    }
    if strategy.is_some() && opts.contains_key("snapshotName") {
        return Err(CommandError::bad_value(
            "$duet.snapshot (a strategy on live data) and $duet.snapshotName cannot be combined",
        ));
    }
    Ok(strategy)
}

/// One `$duet.indexRead` value: `"fresh"` or `"stale"`.
fn index_read_of(v: &Bson) -> CmdResult<duetdb::IndexRead> {
    match v {
        Bson::String(s) => s
            .parse::<duetdb::IndexRead>()
            .map_err(|e| CommandError::bad_value(format!("$duet.indexRead: {e}"))),
        other => Err(CommandError::type_mismatch(format!(
            "$duet.indexRead must be a string, not {:?}",
            other.element_type()
        ))),
    }
}

/// `$duet: {indexRead: "fresh" | "stale"}` (delta indexing's index views,
/// docs/design.md "Delta indexing"); `None` when absent (the database's
/// default applies).
pub fn duet_index_read(cmd: &Document) -> CmdResult<Option<duetdb::IndexRead>> {
    let Some(opts) = crate::args::opt_doc(cmd, "$duet")? else {
        return Ok(None);
    };
    opts.get("indexRead").map(index_read_of).transpose()
}

/// Upper bound of `$duet.workNsPerDoc`: 1 ms per document already makes a
/// count of 10 000 documents last 10 s; more only ties up a server thread.
pub const MAX_WORK_NS_PER_DOC: u64 = 1_000_000;

/// One `$duet.workNsPerDoc` value: a whole number in 0..=[`MAX_WORK_NS_PER_DOC`].
fn work_ns(v: &Bson) -> CmdResult<u64> {
    let n = match v {
        Bson::Int32(n) => i64::from(*n),
        Bson::Int64(n) => *n,
        Bson::Double(d) if d.fract() == 0.0 && d.abs() <= 1e15 => *d as i64,
        Bson::Double(d) => {
            return Err(CommandError::bad_value(format!(
                "$duet.workNsPerDoc must be a whole number, not {d}"
            )))
        }
        other => {
            return Err(CommandError::type_mismatch(format!(
                "$duet.workNsPerDoc must be a number, not {:?}",
                other.element_type()
            )))
        }
    };
    u64::try_from(n)
        .ok()
        .filter(|n| *n <= MAX_WORK_NS_PER_DOC)
        .ok_or_else(|| {
            CommandError::bad_value(format!(
                "$duet.workNsPerDoc must be in 0..={MAX_WORK_NS_PER_DOC}, not {n}"
            ))
        })
}

/// `$duet: {workNsPerDoc: N}`, a benchmark knob honoured by `count` only: N ns
/// of busy work per document the count visits, so that one query lasts
/// seconds while updates stream (the `space` benchmark over the wire). `None`
/// when absent; 0 is the same as absent.
pub fn duet_work_ns(cmd: &Document) -> CmdResult<Option<u64>> {
    let Some(opts) = crate::args::opt_doc(cmd, "$duet")? else {
        return Ok(None);
    };
    opts.get("workNsPerDoc").map(work_ns).transpose()
}

fn dispatch(
    state: &Arc<ServerState>,
    conn: &ConnInfo,
    db: &str,
    cmd: &Document,
    cancel: &duetdb::CancelToken,
    report: Option<&crate::ops::OpReport>,
    raw_cursor: Option<&read::RawCursorSlot>,
) -> CmdResult {
    let name =
        command_name(cmd).ok_or_else(|| CommandError::bad_value("empty command document"))?;
    let Some(canonical) = canonical_name(name) else {
        return Err(CommandError::new(
            59,
            "CommandNotFound",
            format!("no such command: '{name}'"),
        ));
    };
    // As MongoDB's IDL parsers, before authorization: unknown fields and
    // fields of the wrong type are refused (`fields.rs`).
    fields::check(canonical, cmd)?;
    // `db@snapshot` reads a named snapshot: authorized as its database,
    // reads only (`snapdb.rs`).
    let held = snapdb::split(db)?;
    crate::auth::check(state, conn, snapdb::base(db), name, canonical, cmd)?;
    if let Some((_, snap)) = held {
        snapdb::admit(db, snap, canonical, cmd, &SessionArgs::parse(cmd)?)?;
    }
    duet_strategy(cmd)?;
    if name != "count" && duet_work_ns(cmd)?.is_some() {
        return Err(CommandError::bad_value(format!(
            "$duet.workNsPerDoc is honoured by count only, not by '{name}'"
        )));
    }
    let session = SessionArgs::parse(cmd)?;
    let ctx = Ctx {
        state,
        conn,
        db,
        // A transaction's database is created by its commit (`txn.rs`).
        create: !session.in_transaction() && may_create(name, cmd),
        created: Cell::new(false),
        lsid: session.lsid.as_ref(),
        cancel,
        report,
        origin: repl::origin(state, &session),
        stmts: Default::default(),
        items: Default::default(),
        raw_cursor,
    };
    // Users cached by connections are keyed by admin's csn, which a
    // recreated admin starts again: a drop of admin moves the epoch too.
    let drops_admin = canonical == "dropDatabase" && db == auth::users::USERS_DB;
    if drops_admin {
        auth::admin_dropping(state);
    }
    repl::admit(&ctx, canonical, cmd, &session)?;
    if crate::memory::adds_data(canonical, cmd) {
        state.memory.admit(canonical)?;
    }
    let result = session_dispatch(&ctx, name, cmd, &session);
    let result = repl::after(&ctx, canonical, cmd, &session, result);
    if drops_admin {
        auth::admin_dropping(state);
    }
    if ctx.created.get() {
        // Created for a command that then committed nothing: forget it.
        state.engine.discard_if_unused(db);
    }
    result
}

fn session_dispatch(ctx: &Ctx<'_>, name: &str, cmd: &Document, session: &SessionArgs) -> CmdResult {
    if let Some(reply) = oplog::route(ctx, name, cmd, session.in_transaction()) {
        return reply;
    }
    if matches!(name, "commitTransaction" | "abortTransaction") {
        return txn::finish(ctx, name, session);
    }
    if session.in_transaction() {
        return txn::in_transaction(ctx, name, cmd, session);
    }
    if session.txn_number.is_some() {
        return txn::retryable_write(ctx, name, cmd, session, |c| run(ctx, name, c));
    }
    if let Some(id) = &session.lsid {
        ctx.state.sessions.touch(id);
    }
    run(ctx, name, cmd)
}

/// Whether command `name` may create its database: only commands that write
/// something do (insert, create, createIndexes, createSnapshot, and update or
/// findAndModify with an upsert). Reads, deletes, drops, stats and updates
/// without upsert on a database that does not exist act on an empty one.
pub fn may_create(name: &str, cmd: &Document) -> bool {
    let truthy = |d: &Document, f: &str| crate::args::flag(d, f).unwrap_or(false);
    match name {
        "insert" | "create" | "createIndexes" | "createSnapshot" => true,
        "update" => cmd.get_array("updates").is_ok_and(|u| {
            u.iter()
                .any(|s| matches!(s, Bson::Document(d) if truthy(d, "upsert")))
        }),
        "findAndModify" | "findandmodify" => truthy(cmd, "upsert"),
        _ => false,
    }
}

/// Run a command outside any transaction.
fn run(ctx: &Ctx<'_>, name: &str, cmd: &Document) -> CmdResult {
    let conn = ctx.conn;
    if !matches!(
        name,
        "find" | "aggregate" | "distinct" | "explain" | "getMore"
    ) && matches!(read_concern(cmd)?, ReadConcern::Snapshot(_))
    {
        return Err(CommandError::new(
            72,
            "InvalidOptions",
            format!("read concern level 'snapshot' is not supported by '{name}' (only find, aggregate, distinct)"),
        ));
    }
    if let Some(reply) = crud(ctx, name, cmd, &mut Target::Live) {
        return reply;
    }
    match name {
        "hello" | "isMaster" | "ismaster" => handshake::hello(ctx, name, cmd),
        "ping" => Ok(doc! {"ok": 1.0}),
        "buildInfo" | "buildinfo" => Ok(admin::build_info()),
        "hostInfo" => Ok(admin::host_info()),
        "getParameter" => admin::get_parameter(ctx, cmd),
        "setParameter" => admin::set_parameter(ctx, cmd),
        "getCmdLineOpts" => Ok(admin::cmd_line_opts(&ctx.state.config)),
        "getLog" => admin::get_log(ctx, cmd),
        "top" => admin::top(ctx),
        "shutdown" => admin::shutdown(ctx, cmd),
        "fsync" => admin::fsync(ctx, cmd),
        "fsyncUnlock" => admin::fsync_unlock(ctx),
        "duetBackup" => backup::duet_backup(ctx, cmd),
        "validate" => stats::validate(ctx, cmd),
        "whatsmyuri" => Ok(doc! {"you": conn.peer.to_string(), "ok": 1.0}),
        "connectionStatus" => auth::commands::connection_status(ctx, cmd),
        "logout" => auth::commands::logout(ctx),
        "saslStart" => auth::sasl_start_once(ctx.state, ctx.conn, ctx.db, cmd, false),
        "saslContinue" => auth::sasl_continue(ctx.state, ctx.conn, cmd),
        "authenticate" => Err(CommandError::new(
            334,
            "MechanismUnavailable",
            "the authenticate command (MONGODB-CR, MONGODB-X509) is not supported: use SCRAM-SHA-256 or SCRAM-SHA-1",
        )),
        "createUser" => auth::commands::create_user(ctx, cmd),
        "updateUser" => auth::commands::update_user(ctx, cmd),
        "dropUser" => auth::commands::drop_user(ctx, cmd),
        "dropAllUsersFromDatabase" => auth::commands::drop_all_users(ctx),
        "usersInfo" => auth::commands::users_info(ctx, cmd),
        "grantRolesToUser" => auth::commands::change_roles(ctx, cmd, true),
        "revokeRolesFromUser" => auth::commands::change_roles(ctx, cmd, false),
        "listCommands" => Ok(admin::list_commands()),
        "serverStatus" => Ok(admin::server_status(ctx)),
        "currentOp" => currentop::current_op(ctx, cmd),
        "killOp" => currentop::kill_op(ctx, cmd),
        "listDatabases" => admin::list_databases(ctx, cmd),
        "endSessions" => txn::end_sessions(ctx, cmd),
        "killSessions" | "killAllSessions" => txn::kill_sessions(ctx, name, cmd),
        "listCollections" => ddl::list_collections(ctx, cmd),
        "create" => ddl::create(ctx, cmd),
        "drop" => ddl::drop(ctx, cmd),
        "dropDatabase" => ddl::drop_database(ctx),
        "renameCollection" => ddl::rename_collection(ctx, cmd),
        "convertToCapped" => capped::convert_to_capped(ctx, cmd),
        "cloneCollectionAsCapped" => capped::clone_collection_as_capped(ctx, cmd),
        "collStats" => stats::coll_stats(ctx, cmd),
        "dbStats" | "dbstats" => stats::db_stats(ctx, cmd),
        "createIndexes" => ddl::create_indexes(ctx, cmd),
        "listIndexes" => ddl::list_indexes(ctx, cmd),
        "collMod" => ddl::coll_mod(ctx, cmd),
        "duetRunTtlPass" => admin::run_ttl_pass(ctx),
        "dropIndexes" | "deleteIndexes" => ddl::drop_indexes(ctx, name, cmd),
        "createSnapshot" => named::create(ctx, cmd),
        "listSnapshots" => named::list(ctx),
        "dropSnapshot" => named::drop(ctx, cmd),
        "explain" => read::explain(ctx, cmd),
        "replSetGetStatus" => repl::get_status(ctx),
        "replSetGetConfig" => repl::get_config(ctx),
        "replSetStepDown" => repl::step_down(ctx, cmd),
        "replSetReconfig" => repl::reconfig(ctx, cmd),
        "applyOps" => oplog::apply_ops(ctx, cmd),
        other => Err(CommandError::new(
            59,
            "CommandNotFound",
            format!("no such command: '{other}'"),
        )),
    }
}

/// The CRUD commands, on the live database or in the session's transaction
/// (`target`): one implementation for both. `None` for other commands.
fn crud(ctx: &Ctx<'_>, name: &str, cmd: &Document, target: &mut Target<'_>) -> Option<CmdResult> {
    Some(match name {
        "insert" => write::insert(ctx, cmd, target),
        "update" => write::update(ctx, cmd, target),
        "delete" => write::delete(ctx, cmd, target),
        "findAndModify" | "findandmodify" => write::find_and_modify(ctx, cmd, name, target),
        "find" => read::find(ctx, cmd, target),
        "getMore" => read::get_more(ctx, cmd),
        "killCursors" => read::kill_cursors(ctx, cmd),
        "count" => read::count(ctx, cmd, target),
        "distinct" => read::distinct(ctx, cmd, target),
        "aggregate" => read::aggregate(ctx, cmd, target),
        _ => return None,
    })
}
