//! What drivers see of a replica set (`--members`, the `duet-repl` crate):
//! the topology in `hello`, the member's role enforced on every command,
//! write concerns, and `replSetGetStatus` / `replSetGetConfig` /
//! `replSetStepDown` / `replSetReconfig` (adding and removing members, and
//! hidden non-voting analytics members: Raft learners).
//!
//! Rules, as MongoDB's:
//! - on a member that is not the writable primary, writes fail with
//!   NotWritablePrimary (10107) before they run, and reads without
//!   `secondaryOk` (a `$readPreference` other than `primary`) fail with
//!   NotPrimaryNoSecondaryOk (13435); those errors (and the ones a write
//!   meets when the primary changes under it: 11602, 189, 91) are always
//!   top-level, with the `RetryableWriteError` label on a retryable write or
//!   a transaction's commit/abort, so drivers rediscover the primary and
//!   retry;
//! - write concern: every acknowledged write was committed by a majority of
//!   the set (the writer publishes only committed groups), so `w: 1` and
//!   `w: "majority"` are answered at once; `w: N` waits until N members
//!   applied the write, as MongoDB counts (`Member::wait_for_applied`: the
//!   others asked over the Raft port), up to `wtimeout`, else `writeConcernError`
//!   64 WriteConcernFailed with `errInfo.wtimeout`; N above the number of
//!   members is 100 UnsatisfiableWriteConcern; a tag name is 79
//!   UnknownReplWriteConcern;
//! - read concern: `local` and `majority` are the same here (members apply
//!   only committed entries); `linearizable` checks with a majority that
//!   this member still leads (ReadIndex) and is primary-only;
//!   `afterClusterTime`/`atClusterTime` wait until this member applied the
//!   group of that time, up to `maxTimeMS` (50 MaxTimeMSExpired);
//! - a member not in the set's configuration (removed, or waiting to be
//!   added) says so in `hello` and refuses reads too (13436
//!   NotPrimaryOrSecondary); a hidden member (a learner) is absent from
//!   `hosts` and says `hidden: true` in its own `hello`.
//!
//! Without `--members` the server is a one-member set (or a standalone with
//! `--standalone`); these commands then describe that one member (or fail
//! with 76 NoReplicationEnabled).

use std::time::Duration;

use bson::{doc, oid::ObjectId, Bson, DateTime, Document};
use duet_repl::{Member, Role, Status};

use super::Ctx;
use crate::error::{CmdResult, CommandError};
use crate::sessions::SessionArgs;

/// Commands that change data (refused on a member that is not primary,
/// and waiting for their write concern).
const WRITES: &[&str] = &[
    "insert",
    "update",
    "delete",
    "findAndModify",
    "create",
    "drop",
    "dropDatabase",
    "renameCollection",
    "convertToCapped",
    "cloneCollectionAsCapped",
    "createIndexes",
    "dropIndexes",
    "collMod",
    "createSnapshot",
    "dropSnapshot",
    "commitTransaction",
    "abortTransaction",
    "createUser",
    "updateUser",
    "dropUser",
    "dropAllUsersFromDatabase",
    "grantRolesToUser",
    "revokeRolesFromUser",
    "duetRunTtlPass",
];

/// Reads that need `secondaryOk` on a member that is not primary.
const READS: &[&str] = &[
    "find",
    "count",
    "distinct",
    "aggregate",
    "explain",
    "listCollections",
    "listIndexes",
    "collStats",
    "dbStats",
    "listSnapshots",
];

/// Codes drivers retry a retryable write on (the retryable-writes spec).
const RETRYABLE: &[i32] = &[
    6, 7, 89, 91, 189, 262, 9001, 10107, 11600, 11602, 13435, 13436,
];

/// Codes a write meets when this member stops being primary under it.
const NOT_PRIMARY: &[i32] = &[10107, 11602, 189, 91];

pub fn member<'a>(ctx: &'a Ctx<'_>) -> Option<&'a std::sync::Arc<Member>> {
    ctx.state.repl.get()
}

/// The configuration version of a one-member set (started without
/// `--members`: its configuration never changes).
pub const SET_VERSION: i32 = 1;

/// MongoDB's electionId: `0x7fffffff` then the term, so it grows with
/// every election (drivers use it to ignore a deposed primary).
fn election_id(term: u64) -> ObjectId {
    let mut b = [0u8; 12];
    b[..4].copy_from_slice(&[0x7f, 0xff, 0xff, 0xff]);
    b[4..].copy_from_slice(&term.to_be_bytes());
    ObjectId::from_bytes(b)
}

fn optime(s: &Status) -> Document {
    doc! {
        "ts": super::changes::timestamp(s.last_write_ts),
        "t": s.term as i64,
    }
}

fn write_date(s: &Status) -> DateTime {
    DateTime::from_millis(s.last_write_wall_ms.min(i64::MAX as u64) as i64)
}

/// The `hello` fields of a member of a multi-member set.
pub fn hello(m: &Member, is_hello: bool, d: &mut Document) {
    let s = m.status();
    if is_hello {
        d.insert("isWritablePrimary", s.writable);
    } else {
        d.insert("ismaster", s.writable);
    }
    d.insert("secondary", s.in_config() && s.role == Role::Secondary);
    if !s.in_config() {
        // MongoDB's answer from a member removed from the set or not yet
        // added: drivers leave it out of the topology.
        d.insert("info", "Does not have a valid replica set config");
        d.insert("isreplicaset", true);
        return;
    }
    // Hidden members are not in `hosts` (drivers never route to them).
    let hosts: Vec<String> = s
        .members
        .iter()
        .filter(|c| c.voter)
        .map(|c| c.host.clone())
        .collect();
    d.insert("setName", s.set_name.clone());
    d.insert("setVersion", s.version as i64);
    d.insert("hosts", hosts);
    if s.hidden() {
        d.insert("hidden", true);
    }
    if let Some(p) = s.primary.and_then(|p| s.address(p)) {
        d.insert("primary", p);
    }
    d.insert("me", s.address(s.me).unwrap_or_default());
    if s.role == Role::Primary {
        d.insert("electionId", election_id(s.term));
    }
    d.insert(
        "lastWrite",
        doc! {
            "opTime": optime(&s),
            "lastWriteDate": write_date(&s),
            "majorityOpTime": optime(&s),
            "majorityWriteDate": write_date(&s),
        },
    );
}

/// Whether command `name` writes (an aggregate does with `$out`/`$merge`).
fn writes(name: &str, cmd: &Document) -> bool {
    WRITES.contains(&name)
        || (name == "aggregate"
            && cmd.get_array("pipeline").is_ok_and(|p| {
                p.iter().any(|s| {
                    matches!(s, Bson::Document(d) if d.contains_key("$out") || d.contains_key("$merge"))
                })
            }))
}

/// Whether the command allows reading from a secondary (`$readPreference`
/// other than `primary`).
fn secondary_ok(cmd: &Document) -> bool {
    match cmd.get("$readPreference") {
        Some(Bson::Document(rp)) => rp.get_str("mode").is_ok_and(|m| m != "primary"),
        _ => false,
    }
}

/// The label a not-primary error carries for this command: drivers retry
/// retryable writes and transaction commits on `RetryableWriteError`, and a
/// whole transaction on `TransientTransactionError`.
fn label(name: &str, session: &SessionArgs) -> Option<&'static str> {
    if matches!(name, "commitTransaction" | "abortTransaction") {
        Some("RetryableWriteError")
    } else if session.in_transaction() {
        Some("TransientTransactionError")
    } else if session.txn_number.is_some() {
        Some("RetryableWriteError")
    } else {
        None
    }
}

fn labelled(e: CommandError, name: &str, session: &SessionArgs) -> CommandError {
    match label(name, session) {
        Some(l) if RETRYABLE.contains(&e.code) => e.with_label(l),
        _ => e,
    }
}

/// Before command `name` runs on a replica-set member: refuse what this
/// member may not do in its current role.
pub fn admit(ctx: &Ctx<'_>, name: &str, cmd: &Document, session: &SessionArgs) -> CmdResult<()> {
    let Some(m) = member(ctx) else {
        return Ok(());
    };
    let status = m.status();
    let writable = status.writable;
    let refused = if writable {
        None
    } else if writes(name, cmd) || session.in_transaction() {
        Some(CommandError::new(
            10107,
            "NotWritablePrimary",
            "not primary: writes go to the replica set's primary",
        ))
    } else if READS.contains(&name) && !status.in_config() {
        Some(CommandError::new(
            13436,
            "NotPrimaryOrSecondary",
            "this member is not in the replica set's configuration (removed, or not yet added): read from a member of the set",
        ))
    } else if READS.contains(&name) && !secondary_ok(cmd) {
        Some(CommandError::new(
            13435,
            "NotPrimaryNoSecondaryOk",
            "not primary and secondaryOk=false: read from the primary, or with a read preference that allows secondaries",
        ))
    } else {
        None
    };
    if let Some(e) = refused {
        return Err(labelled(e, name, session));
    }
    let linearizable = crate::args::opt_doc(cmd, "readConcern")?
        .and_then(|rc| rc.get_str("level").ok())
        == Some("linearizable");
    if linearizable {
        if !writable {
            return Err(CommandError::new(
                10107,
                "NotWritablePrimary",
                // MongoDB's words (read_concern_mongod.cpp).
                "cannot satisfy linearizable read concern on non-primary node",
            ));
        }
        m.ensure_linearizable()?;
    }
    if writable {
        // The primary published every write it acknowledged.
        return Ok(());
    }
    wait_for_cluster_time(ctx, m, cmd)
}

/// Read concern `afterClusterTime` (or `atClusterTime`) names a cluster
/// time: this member serves the read once it has applied the group of that
/// time (group times are the primary's, carried in every member's copy of
/// the record, so a time read on one member names the same write on all),
/// waiting for it under the command's cancellation (`maxTimeMS`: 50
/// MaxTimeMSExpired). `atClusterTime` `t` names the state just after the
/// group of time `t - 1` (`snapshots.rs`). A `dropDatabase`'s time is the
/// primary's too (carried in its entry), reached when the drop is applied.
fn wait_for_cluster_time(ctx: &Ctx<'_>, m: &Member, cmd: &Document) -> CmdResult<()> {
    let Some(rc) = crate::args::opt_doc(cmd, "readConcern")? else {
        return Ok(());
    };
    let want = match (rc.get("afterClusterTime"), rc.get("atClusterTime")) {
        (Some(Bson::Timestamp(t)), _) => super::changes::packed(*t),
        (_, Some(Bson::Timestamp(t))) => super::changes::packed(*t).saturating_sub(1),
        _ => return Ok(()),
    };
    if m.wait_for_time(want, || ctx.cancel.is_cancelled()) {
        return Ok(());
    }
    Err(match ctx.cancel.reason() {
        Some(r) => CommandError::new(r.code(), r.code_name(), r.message()),
        None => CommandError::max_time_expired(),
    })
}

/// Whether this server keeps a retry table: the replica set's, or outside
/// a set its own (`duet_repl::local`).
fn keeps_retries(state: &crate::state::ServerState) -> bool {
    state.repl.get().is_some() || state.local_retries.get().is_some()
}

/// The outcomes recorded with tag `tag` in this server's retry table.
fn table_outcomes(state: &crate::state::ServerState, tag: &[u8]) -> Option<Vec<Vec<u8>>> {
    match state.repl.get() {
        Some(m) => m.retry_outcomes(tag),
        None => state.local_retries.get()?.outcomes(tag),
    }
}

/// The origin tag of a retryable write on a server that keeps a retry
/// table (a replica-set member, or a server with its own table):
/// `txnNumber` (8 bytes, little-endian) then the `lsid` bytes.
pub fn origin(
    state: &std::sync::Arc<crate::state::ServerState>,
    session: &SessionArgs,
) -> Option<std::sync::Arc<[u8]>> {
    if !keeps_retries(state) {
        return None;
    }
    if session.in_transaction() {
        return None;
    }
    Some(tag(session.lsid.as_ref()?, session.txn_number?))
}

/// The tag of client operation `txnNumber` `n` of session `id`: `n` (8
/// bytes, little-endian) then the `lsid` bytes. A retryable write and a
/// transaction's commit are tagged alike (a session uses a number once).
pub fn tag(id: &[u8], n: i64) -> std::sync::Arc<[u8]> {
    let mut tag = n.to_le_bytes().to_vec();
    tag.extend_from_slice(id);
    tag.into()
}

/// The tag a transaction's commit carries on a replica-set member (`None`
/// outside a set): replicated with the commit, so a `commitTransaction`
/// retried on another primary, or after a restart, is recognised
/// ([`committed_transaction`]).
pub fn transaction_tag(
    state: &std::sync::Arc<crate::state::ServerState>,
    id: &[u8],
    n: i64,
) -> Option<std::sync::Arc<[u8]>> {
    keeps_retries(state).then(|| tag(id, n))
}

/// Whether the set applied the commit of transaction `n` of session `id`
/// (the session table here does not know it: the commit ran on a primary
/// that failed since, or before this member restarted). MongoDB answers a
/// retried `commitTransaction` of a committed transaction with ok on any
/// primary (the outcome is in its replicated `config.transactions`).
pub fn committed_transaction(ctx: &Ctx<'_>, id: &[u8], n: i64) -> bool {
    let t = tag(id, n);
    match member(ctx) {
        Some(m) => m.applied_retryable(&t),
        None => ctx
            .state
            .local_retries
            .get()
            .is_some_and(|r| r.contains(&t)),
    }
}

/// How a retryable write the set already applied is answered.
pub enum Retried {
    /// As done, from the outcomes recorded.
    Reply(Document),
    /// A batch whose statements not applied run again (`retry.rs`).
    Partly(super::retry::Recorded),
}

/// A retryable write the set already applied — made on a primary that
/// failed before the driver got the reply, or on this member before it
/// restarted — is answered from what the set recorded with the write's tag
/// instead of running again (the caller, `txn::retryable_write`, checked
/// that this member's session table does not know it: the primary that
/// ran it answers from there). The first execution's reply is built from
/// the outcomes (`duetdb::WriteOutcome` per statement: counts, upserted
/// ids, a findAndModify's document — MongoDB rebuilds it from its oplog
/// entries and `config.image_collection`); a batch's statements that are
/// not among them run again.
pub fn retried(ctx: &Ctx<'_>, name: &str, cmd: &Document) -> Option<Retried> {
    let origin = ctx.origin.as_ref()?;
    let outcomes = table_outcomes(ctx.state, origin)?;
    tracing::info!(
        conn = ctx.conn.id,
        command = name,
        "retried write was applied before a failover or a restart: answered from the set's table"
    );
    Some(match super::retry::from_outcomes(name, &outcomes) {
        Some(rec) => Retried::Partly(rec),
        None => Retried::Reply(retry_reply(name, cmd, &outcomes)),
    })
}

/// The reply of write command `name` (`cmd`) that the set applied with
/// these outcomes, for a findAndModify, or outcomes recorded without
/// statement ids (an older build's: a batch's are read by `retry.rs`), one
/// per statement applied, in order: statement `i`'s is taken as the
/// `i`-th. A tag recorded without outcomes
/// (by an older build) gets a reply built from the command: every
/// statement counted, no upserted ids, no findAndModify document.
pub(crate) fn retry_reply(name: &str, cmd: &Document, outcomes: &[Vec<u8>]) -> Document {
    use duetdb::WriteOutcome as W;
    let decoded: Option<Vec<W>> = outcomes
        .iter()
        .map(|o| W::decode(o).filter(|w| *w != W::Other))
        .collect();
    let from_command = || {
        let count = |field: &str| cmd.get_array(field).map_or(0, |a| a.len()) as i32;
        match name {
            "insert" => doc! {"n": count("documents"), "ok": 1.0},
            "update" => doc! {"n": count("updates"), "nModified": count("updates"), "ok": 1.0},
            "delete" => doc! {"n": count("deletes"), "ok": 1.0},
            _ => doc! {
                "lastErrorObject": {"n": 1, "updatedExisting": true},
                "value": Bson::Null,
                "ok": 1.0,
            },
        }
    };
    let Some(outs) = decoded.filter(|d| !d.is_empty()) else {
        return from_command();
    };
    let as_i32 = |n: u64| i32::try_from(n).unwrap_or(i32::MAX);
    match name {
        "insert" => {
            let n: u64 = outs
                .iter()
                .map(|o| match o {
                    W::Inserted { n } => *n,
                    _ => 0,
                })
                .sum();
            doc! {"n": as_i32(n), "ok": 1.0}
        }
        "delete" => {
            let n: u64 = outs
                .iter()
                .map(|o| match o {
                    W::Deleted(n) => *n,
                    _ => 0,
                })
                .sum();
            doc! {"n": as_i32(n), "ok": 1.0}
        }
        "update" => {
            let (mut n, mut modified, mut upserted) = (0u64, 0u64, Vec::new());
            for (i, o) in outs.iter().enumerate() {
                if let W::Updated(u) = o {
                    n += u.matched;
                    modified += u.modified;
                    if let Some(id) = &u.upserted_id {
                        n += 1;
                        upserted.push(Bson::Document(doc! {"index": i as i32, "_id": id.clone()}));
                    }
                }
            }
            let mut d = doc! {"n": as_i32(n), "nModified": as_i32(modified)};
            if !upserted.is_empty() {
                d.insert("upserted", upserted);
            }
            d.insert("ok", 1.0);
            d
        }
        _ => match outs.first() {
            Some(W::FoundAndModified {
                doc,
                update,
                removed,
            }) => {
                let remove = crate::args::flag(cmd, "remove").unwrap_or(*removed);
                // Projected as the first execution's was (the retry sends
                // the same `fields`).
                let value = doc.as_ref().and_then(|d| project(cmd, d));
                super::write::find_and_modify_reply(remove, value, update, *removed)
            }
            _ => from_command(),
        },
    }
}

/// `doc` projected with the command's `fields` (itself without any), with
/// its `query`, `let` and `collation` as the first execution had them.
fn project(cmd: &Document, doc: &Document) -> Option<Document> {
    let fields = match cmd.get("fields") {
        Some(Bson::Document(f)) if !f.is_empty() => f,
        _ => return Some(doc.clone()),
    };
    let let_vars = cmd.get_document("let").ok();
    let query = cmd.get_document("query").cloned().unwrap_or_default();
    let query = duetdb::lang::Filter::bind_let(&query, let_vars).ok()?;
    let collator = match cmd.get_document("collation") {
        Ok(c) => duetdb::Collator::from_document(c).ok()?,
        Err(_) => None,
    };
    let p = duetdb::lang::Projection::parse_find(fields, Some(&query), let_vars)
        .ok()?
        .with_collation(collator);
    let raw = duetdb::raw::to_raw_document(doc).ok()?;
    p.apply(&raw).ok()
}

/// A write concern's `w`.
enum W {
    Members(usize),
    Majority,
}

fn parse_w(cmd: &Document) -> CmdResult<Option<(W, Option<Duration>)>> {
    let Some(wc) = crate::args::opt_doc(cmd, "writeConcern")? else {
        return Ok(None);
    };
    let w = match wc.get("w") {
        None | Some(Bson::Null) => return Ok(None),
        Some(Bson::String(s)) if s == "majority" => W::Majority,
        Some(Bson::String(s)) => {
            return Err(CommandError::new(
                79,
                "UnknownReplWriteConcern",
                format!("unrecognized write concern mode: {s}"),
            ))
        }
        Some(v) => {
            let n = crate::args::as_i64("w", v)?;
            let n = usize::try_from(n).map_err(|_| {
                CommandError::new(
                    9,
                    "FailedToParse",
                    format!("w has to be a non-negative number, not {n}"),
                )
            })?;
            W::Members(n)
        }
    };
    let wtimeout = match crate::args::opt_i64(wc, "wtimeout")? {
        None | Some(0) => None,
        Some(ms) => Some(Duration::from_millis(ms.max(0) as u64)),
    };
    Ok(Some((w, wtimeout)))
}

/// After command `name` ran: not-primary write errors become top-level
/// errors; a successful write waits for its write concern.
pub fn after(
    ctx: &Ctx<'_>,
    name: &str,
    cmd: &Document,
    session: &SessionArgs,
    result: CmdResult,
) -> CmdResult {
    let Some(m) = member(ctx) else {
        return result;
    };
    let reply = match result {
        Err(e) => return Err(labelled(e, name, session)),
        Ok(r) => r,
    };
    if let Ok(errors) = reply.get_array("writeErrors") {
        let stepped = errors.iter().find_map(|e| match e {
            Bson::Document(d) => d
                .get_i32("code")
                .ok()
                .filter(|c| NOT_PRIMARY.contains(c))
                .map(|c| (c, d.get_str("errmsg").unwrap_or_default().to_string())),
            _ => None,
        });
        if let Some((code, msg)) = stepped {
            let code_name = match code {
                10107 => "NotWritablePrimary",
                11602 => "InterruptedDueToReplStateChange",
                189 => "PrimarySteppedDown",
                _ => "ShutdownInProgress",
            };
            return Err(labelled(
                CommandError::new(code, code_name, msg),
                name,
                session,
            ));
        }
    }
    if !writes(name, cmd) {
        return Ok(reply);
    }
    let Some((w, wtimeout)) = parse_w(cmd)? else {
        return Ok(reply);
    };
    let n = match w {
        // Every acknowledged write was committed by a majority.
        W::Majority => return Ok(reply),
        W::Members(n) => n,
    };
    let s = m.status();
    let members = s.members.len();
    if n > members {
        return Err(CommandError::new(
            100,
            "UnsatisfiableWriteConcern",
            format!("Not enough data-bearing nodes: w: {n} asks for more members than the set's {members}"),
        ));
    }
    // This member applied the write before answering.
    if n <= 1 {
        return Ok(reply);
    }
    let mut reply = reply;
    // MongoDB counts members that applied the write. Its entry is at or
    // before the log's end: wait until N members applied that far.
    if !m.wait_for_applied(m.last_log_index(), n, wtimeout) {
        reply.insert(
            "writeConcernError",
            doc! {
                "code": 64,
                "codeName": "WriteConcernFailed",
                "errmsg": "waiting for replication timed out",
                "errInfo": {"wtimeout": true, "writeConcern": {"w": n as i64, "wtimeout": wtimeout.map_or(0, |d| d.as_millis() as i64)}},
            },
        );
    }
    Ok(reply)
}

/// The status of this server as a set, when it runs no member: one
/// primary, itself.
fn one_member(ctx: &Ctx<'_>, set: &str) -> Status {
    let last = ctx.state.engine.cluster_time();
    Status {
        set_name: set.to_string(),
        me: 0,
        version: SET_VERSION as u64,
        members: vec![duet_repl::ConfigMember {
            id: 0,
            host: super::handshake::member_address(ctx),
            voter: true,
        }],
        role: Role::Primary,
        writable: true,
        primary: Some(0),
        term: 1,
        applied: (1, 0),
        last_log_index: 0,
        matched: Default::default(),
        last_write_ts: last,
        last_write_wall_ms: (last >> 32) * 1000,
        snapshot_index: 0,
        purged_index: 0,
        snapshots_built: 0,
        snapshots_installed: 0,
        noops_applied: 0,
    }
}

fn status_of(ctx: &Ctx<'_>) -> CmdResult<Status> {
    if let Some(m) = member(ctx) {
        return Ok(m.status());
    }
    match &ctx.state.config.replica_set {
        Some(set) => Ok(one_member(ctx, set)),
        None => Err(CommandError::new(
            76,
            "NoReplicationEnabled",
            "not running with --replSet (this server was started with --standalone)",
        )),
    }
}

fn admin_only(ctx: &Ctx<'_>, name: &str) -> CmdResult<()> {
    if ctx.db != "admin" {
        return Err(CommandError::new(
            13,
            "Unauthorized",
            format!("{name} may only be run against the admin database."),
        ));
    }
    Ok(())
}

/// `replSetGetStatus` (mongosh `rs.status()`): every member as this one
/// knows it. A member's optime is known for itself; the primary also knows
/// how far each member's Raft log reaches (`duet.raftIndex`).
pub fn get_status(ctx: &Ctx<'_>) -> CmdResult {
    if member(ctx).is_none() {
        // One member (or --standalone): the fuller mongod-shaped answer.
        return super::admin::repl_set_get_status(ctx);
    }
    admin_only(ctx, "replSetGetStatus")?;
    let s = status_of(ctx)?;
    let (state, state_str) = s.role.code_and_name();
    let members: Vec<Bson> = s
        .members
        .iter()
        .map(|c| {
            let (id, addr) = (&c.id, &c.host);
            let me = *id == s.me;
            let primary = s.primary == Some(*id);
            let role = if primary {
                Role::Primary
            } else if me {
                s.role
            } else if s.primary.is_some() {
                Role::Secondary
            } else {
                Role::Startup
            };
            let (st, st_str) = role.code_and_name();
            let mut d = doc! {
                "_id": *id as i32,
                "name": addr.clone(),
                "health": if me || primary || s.matched.contains_key(id) { 1.0 } else { 0.0 },
                "state": st,
                "stateStr": st_str,
                "self": me,
            };
            if me {
                d.insert("optime", optime(&s));
                d.insert("optimeDate", write_date(&s));
            }
            let index = if me {
                s.applied.1
            } else {
                s.matched.get(id).copied().unwrap_or(0)
            };
            d.insert("duet", doc! {"raftIndex": index as i64});
            Bson::Document(d)
        })
        .collect();
    Ok(doc! {
        "set": s.set_name.clone(),
        "date": DateTime::now(),
        "myState": state,
        "stateStr": state_str,
        "term": s.term as i64,
        "heartbeatIntervalMillis": duet_repl::member::HEARTBEAT_MS as i64,
        "optimes": {
            "lastCommittedOpTime": optime(&s),
            "appliedOpTime": optime(&s),
            "durableOpTime": optime(&s),
        },
        "members": members,
        // This member's Raft snapshot (every database's checkpoint image)
        // and log purge (docs/design.md §19).
        "duet": {
            "raftSnapshotIndex": s.snapshot_index as i64,
            "raftPurgedIndex": s.purged_index as i64,
            "snapshotsBuilt": s.snapshots_built as i64,
            "snapshotsInstalled": s.snapshots_installed as i64,
            "noopsApplied": s.noops_applied as i64,
        },
        "ok": 1.0,
    })
}

/// `replSetGetConfig` (mongosh `rs.conf()`).
pub fn get_config(ctx: &Ctx<'_>) -> CmdResult {
    if member(ctx).is_none() {
        return super::admin::repl_set_get_config(ctx);
    }
    admin_only(ctx, "replSetGetConfig")?;
    let s = status_of(ctx)?;
    let members: Vec<Bson> = s
        .members
        .iter()
        .map(|c| {
            Bson::Document(doc! {
                "_id": c.id as i32,
                "host": c.host.clone(),
                "arbiterOnly": false,
                "buildIndexes": true,
                "hidden": !c.voter,
                "priority": if c.voter { 1.0 } else { 0.0 },
                "tags": {},
                "secondaryDelaySecs": 0_i64,
                "votes": i32::from(c.voter),
            })
        })
        .collect();
    let mut settings = doc! {
        "heartbeatIntervalMillis": duet_repl::member::HEARTBEAT_MS as i64,
        "electionTimeoutMillis": duet_repl::member::ELECTION_TIMEOUT_MS.0 as i64,
        "chainingAllowed": false,
    };
    // Made by member 0 when it initialized the set; learned by the others
    // from the primary (two sets of one name stay apart: docs §19).
    if let Some(id) = member(ctx).and_then(|m| m.set_id()) {
        settings.insert("replicaSetId", ObjectId::from_bytes(id));
    }
    Ok(doc! {
        "config": {
            "_id": s.set_name.clone(),
            "version": s.version as i64,
            "term": s.term as i64,
            "protocolVersion": 1_i64,
            "writeConcernMajorityJournalDefault": true,
            "members": members,
            "settings": settings,
        },
        "ok": 1.0,
    })
}

/// `replSetStepDown: <stepDownSecs>` (60 by default), with
/// `secondaryCatchUpPeriodSecs` (10): how long to wait for another member to
/// become primary.
pub fn step_down(ctx: &Ctx<'_>, cmd: &Document) -> CmdResult {
    admin_only(ctx, "replSetStepDown")?;
    let secs = match cmd.get("replSetStepDown") {
        Some(Bson::Int32(n)) => i64::from(*n),
        Some(Bson::Int64(n)) => *n,
        Some(Bson::Double(d)) if d.fract() == 0.0 => *d as i64,
        Some(Bson::Boolean(true)) => 60,
        other => {
            return Err(CommandError::type_mismatch(format!(
                "replSetStepDown takes a number of seconds, not {:?}",
                other.map(|o| o.element_type())
            )))
        }
    };
    let catch_up = crate::args::opt_i64(cmd, "secondaryCatchUpPeriodSecs")?.unwrap_or(10);
    if secs <= 0 || catch_up < 0 || catch_up > secs {
        return Err(CommandError::bad_value(format!(
            "stepDownSecs ({secs}) must be positive and not below secondaryCatchUpPeriodSecs ({catch_up})"
        )));
    }
    let Some(m) = member(ctx) else {
        status_of(ctx)?;
        return Err(CommandError::new(
            10107,
            "NotWritablePrimary",
            "this one-member replica set has no other member to hand the primary role to",
        ));
    };
    m.step_down(
        Duration::from_secs(secs as u64),
        Duration::from_secs(catch_up.max(1) as u64),
    )?;
    Ok(doc! {"ok": 1.0})
}

/// `replSetReconfig: <config>` (mongosh `rs.add`/`rs.remove`/`rs.reconfig`):
/// the set's members become the config's `members` (`_id` = Raft node id,
/// `host`). A member is a voter (`votes: 1`, `priority` above 0, not
/// hidden) or a hidden analytics member (`{hidden: true, priority: 0,
/// votes: 0}`: a Raft learner). The config's `_id` must be the set's name
/// and its `version` above the current one (103); at most one voter added
/// or removed (103); `force` and the member options duet lacks (arbiters,
/// delayed members, `buildIndexes: false`, priority-0 or hidden voters,
/// visible non-voters) are refused (115). The wait for a new voter to
/// catch up is `maxTimeMS` (else `DEFAULT_RECONFIG_CATCH_UP`).
pub fn reconfig(ctx: &Ctx<'_>, cmd: &Document) -> CmdResult {
    admin_only(ctx, "replSetReconfig")?;
    let Some(m) = member(ctx) else {
        status_of(ctx)?;
        return Err(CommandError::new(
            115,
            "CommandNotSupported",
            "this one-member replica set was started without --members and cannot change its \
             members: start it with --replica-set, --members and --member-id 0",
        ));
    };
    if cmd
        .get("force")
        .is_some_and(|f| matches!(f, Bson::Boolean(true)))
    {
        return Err(CommandError::new(
            115,
            "CommandNotSupported",
            "force reconfig is not supported: the configuration changes through the primary's \
             Raft log",
        ));
    }
    let config = match cmd.get("replSetReconfig") {
        Some(Bson::Document(d)) => d,
        _ => {
            return Err(CommandError::type_mismatch(
                "replSetReconfig takes the new configuration document",
            ))
        }
    };
    let (version, want) = parse_config(config, m.set_name())?;
    let catch_up = match crate::args::opt_i64(cmd, "maxTimeMS")? {
        Some(ms) if ms > 0 => Duration::from_millis(ms as u64),
        _ => duet_repl::DEFAULT_RECONFIG_CATCH_UP,
    };
    m.reconfig(version, &want, catch_up)?;
    Ok(doc! {"ok": 1.0})
}

fn invalid_config(msg: impl Into<String>) -> CommandError {
    CommandError::new(93, "InvalidReplicaSetConfig", msg)
}

fn unsupported(msg: impl Into<String>) -> CommandError {
    CommandError::new(115, "CommandNotSupported", msg)
}

/// A number field of a config document (any numeric BSON type).
fn config_number(d: &Document, field: &str) -> CmdResult<Option<f64>> {
    match d.get(field) {
        None | Some(Bson::Null) => Ok(None),
        Some(Bson::Int32(n)) => Ok(Some(f64::from(*n))),
        Some(Bson::Int64(n)) => Ok(Some(*n as f64)),
        Some(Bson::Double(n)) => Ok(Some(*n)),
        Some(other) => Err(invalid_config(format!(
            "{field} must be a number, not {:?}",
            other.element_type()
        ))),
    }
}

/// The version and members of a `replSetReconfig` config document of set
/// `set`, checked as MongoDB checks them (93 InvalidReplicaSetConfig, 103
/// NewReplicaSetConfigurationIncompatible) and for what duet supports (115).
fn parse_config(config: &Document, set: &str) -> CmdResult<(u64, Vec<duet_repl::ConfigMember>)> {
    match config.get("_id") {
        Some(Bson::String(s)) if s == set => {}
        Some(Bson::String(s)) => {
            return Err(CommandError::new(
                103,
                "NewReplicaSetConfigurationIncompatible",
                format!("New and old configurations differ in replica set name; old was {set}, and new is {s}"),
            ))
        }
        _ => return Err(invalid_config("the config's _id must be the replica set's name")),
    }
    let version = match config_number(config, "version")? {
        Some(v) if v >= 1.0 && v.fract() == 0.0 && v < 9.0e15 => v as u64,
        _ => {
            return Err(invalid_config(
                "the config's version must be a positive integer",
            ))
        }
    };
    let Ok(list) = config.get_array("members") else {
        return Err(invalid_config("the config's members must be an array"));
    };
    let mut members = Vec::with_capacity(list.len());
    for entry in list {
        let Bson::Document(d) = entry else {
            return Err(invalid_config("each member must be a document"));
        };
        let id = match config_number(d, "_id")? {
            Some(n) if n >= 0.0 && n.fract() == 0.0 && n <= f64::from(i32::MAX) => n as u64,
            _ => {
                return Err(invalid_config(
                    "a member's _id must be a non-negative integer",
                ))
            }
        };
        let Ok(host) = d.get_str("host") else {
            return Err(invalid_config(format!("member {id} has no host")));
        };
        let votes = config_number(d, "votes")?.unwrap_or(1.0);
        let priority = config_number(d, "priority")?.unwrap_or(1.0);
        let hidden = d.get_bool("hidden").unwrap_or(false);
        if d.get_bool("arbiterOnly").unwrap_or(false) {
            return Err(unsupported(format!(
                "member {id}: arbiters are not supported"
            )));
        }
        if matches!(d.get_bool("buildIndexes"), Ok(false)) {
            return Err(unsupported(format!(
                "member {id}: buildIndexes: false is not supported"
            )));
        }
        for delay in ["secondaryDelaySecs", "slaveDelay"] {
            if config_number(d, delay)?.is_some_and(|s| s != 0.0) {
                return Err(unsupported(format!(
                    "member {id}: delayed members are not supported"
                )));
            }
        }
        if !(0.0..=1000.0).contains(&priority) {
            return Err(invalid_config(format!(
                "member {id}: priority must be between 0 and 1000"
            )));
        }
        let voter = match votes {
            1.0 => {
                if hidden && priority > 0.0 {
                    return Err(invalid_config(format!(
                        "member {id}: priority must be 0 when hidden=true"
                    )));
                }
                if hidden || priority == 0.0 {
                    return Err(unsupported(format!(
                        "member {id}: a voting member that can never be primary is not \
                         supported; analytics members are {{hidden: true, priority: 0, votes: 0}}"
                    )));
                }
                true
            }
            0.0 => {
                if priority != 0.0 {
                    return Err(invalid_config(format!(
                        "member {id}: priority must be 0 when non-voting (votes:0)"
                    )));
                }
                if !hidden {
                    return Err(unsupported(format!(
                        "member {id}: non-voting members are hidden analytics members here: \
                         {{hidden: true, priority: 0, votes: 0}}"
                    )));
                }
                false
            }
            _ => {
                return Err(invalid_config(format!("member {id}: votes must be 0 or 1")));
            }
        };
        members.push(duet_repl::ConfigMember {
            id,
            host: host.to_string(),
            voter,
        });
    }
    Ok((version, members))
}
