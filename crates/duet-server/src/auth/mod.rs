//! Authentication and authorization: who a connection is, the SASL commands
//! that establish it (`saslStart`, `saslContinue`, `speculativeAuthenticate`
//! inside `hello`), the user-management commands, and the gate `--auth` puts
//! in front of every command.
//!
//! - `scram`: the SCRAM mechanisms (RFC 5802 / 7677) and stored credentials;
//! - `users`: the durable user store in the `admin` database;
//! - `commands`: user management, `connectionStatus`, `logout`;
//! - `ratelimit`: failed authentications limited per source address, and
//!   the `duet::auth` log line of every outcome.
//! - `roles`: the built-in roles as privileges;
//! - `table`: what each command needs.
//!
//! Invariants: with `--auth` a command runs only if [`check`] let it: the
//! command has an entry in `table` (else refused: fail closed), and either
//! the entry needs nothing (handshake, login), or the connection is
//! authenticated as a user that still exists whose roles grant every
//! privilege the entry asks for — except that a loopback peer may create
//! the first user in `admin` while no user exists (MongoDB's localhost
//! exception). A connection keeps its user and privileges only while
//! `admin` is unchanged (its csn, and an epoch moved by drops of `admin`),
//! so a dropped user, a dropped `admin` database or users collection, or a
//! change of roles takes effect at the connection's next command. Every failed
//! authentication answers code 18 AuthenticationFailed with the same
//! message, whether the user, the mechanism's credentials or the proof was
//! wrong. A connection authenticates as one user at most (MongoDB 6+:
//! another user needs `logout` first).

pub mod bootstrap;
pub mod commands;
pub mod ratelimit;
pub mod roles;
pub mod scram;
pub mod table;
#[cfg(test)]
mod tests;
pub mod users;

use std::sync::Arc;

use base64::Engine as _;
use bson::{doc, spec::BinarySubtype, Binary, Bson, Document};

use crate::commands::Ctx;
use crate::error::{CmdResult, CommandError};
use crate::state::{ConnInfo, ServerState};
use roles::{Action, Privileges, Resource};
use scram::{Conversation, Mechanism, ScramError};
use table::{Req, Request, Rule};

/// A connection's authentication state, shared by the copies of its
/// [`ConnInfo`].
#[derive(Debug, Default)]
pub struct ConnAuth {
    inner: parking_lot::Mutex<AuthInner>,
}

#[derive(Debug, Default)]
struct AuthInner {
    /// `(user, db)` once authenticated.
    user: Option<(String, String)>,
    /// `user` as last read from the store, and the state of the users then.
    cached: Option<(UsersVersion, Arc<Principal>)>,
    conversation: Option<Pending>,
    next_conversation: i32,
}

#[derive(Debug)]
struct Pending {
    id: i32,
    db: String,
    /// `saslStart` asked for `options.skipEmptyExchange`.
    skip_empty: bool,
    /// `None`: proof checked, waiting for the client's empty final message.
    conv: Option<Conversation>,
}

impl ConnAuth {
    pub fn new() -> Arc<ConnAuth> {
        Arc::new(ConnAuth::default())
    }

    pub fn is_authenticated(&self) -> bool {
        self.inner.lock().user.is_some()
    }

    /// Forget the authenticated user and any conversation in progress.
    pub fn logout(&self) {
        let mut inner = self.inner.lock();
        inner.user = None;
        inner.cached = None;
        inner.conversation = None;
    }

    /// `(user, db)` of the authenticated user.
    pub fn user(&self) -> Option<(String, String)> {
        self.inner.lock().user.clone()
    }

    /// Authenticated as `user@db` without a conversation (unit tests).
    #[cfg(test)]
    pub(crate) fn login_for_test(&self, user: &str, db: &str) {
        self.inner.lock().user = Some((user.to_string(), db.to_string()));
    }
}

fn auth_failed() -> CommandError {
    CommandError::new(18, "AuthenticationFailed", "Authentication failed.")
}

fn scram_error(e: ScramError) -> CommandError {
    match e {
        ScramError::Failed => auth_failed(),
        ScramError::Malformed(_) => CommandError::new(17, "ProtocolError", e.to_string()),
        ScramError::Unsupported(_) => CommandError::bad_value(e.to_string()),
    }
}

/// An authenticated user that still exists, with its stored roles and the
/// privileges they grant.
#[derive(Debug, Clone)]
pub struct Principal {
    pub user: String,
    pub db: String,
    /// `[{role, db}]` as stored.
    pub roles: Vec<Bson>,
    pub privileges: Privileges,
}

impl Principal {
    pub fn new(user: String, db: String, roles: Vec<Bson>) -> Principal {
        let privileges = Privileges::of_roles(&roles);
        Principal {
            user,
            db,
            roles,
            privileges,
        }
    }

    fn is(&self, user: &str, db: &str) -> bool {
        self.user == user && self.db == db
    }
}

/// The state of the stored users: every write to `admin` moves its csn, and
/// a drop of `admin` moves `admin_epoch` (a recreated `admin` starts its csn
/// again). Equal versions mean equal users.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct UsersVersion {
    epoch: u64,
    csn: Option<u64>,
}

fn users_version(state: &ServerState) -> CmdResult<UsersVersion> {
    Ok(UsersVersion {
        epoch: state.admin_epoch.load(std::sync::atomic::Ordering::Acquire),
        csn: state.engine.get(users::USERS_DB)?.map(|db| db.csn()),
    })
}

/// Call around a drop of the `admin` database (before and after): users
/// cached by connections are read again.
pub fn admin_dropping(state: &ServerState) {
    state
        .admin_epoch
        .fetch_add(1, std::sync::atomic::Ordering::AcqRel);
}

/// The connection's user as the store has it now: `None` when it has not
/// authenticated, or its user no longer exists — then it is logged out, as
/// MongoDB does (a dropped user, or a dropped `admin` database or users
/// collection). The user is read again whenever `admin` changed since it
/// was last read (its csn, or a drop), so role changes apply at the next
/// command; otherwise the cached copy answers without a lookup.
pub fn current_user(state: &ServerState, conn: &ConnInfo) -> CmdResult<Option<Arc<Principal>>> {
    let Some((user, db)) = conn.auth.user() else {
        return Ok(None);
    };
    // The version is read before the user: a write in between only makes
    // the cached copy look older than it is.
    let version = users_version(state)?;
    {
        let inner = conn.auth.inner.lock();
        if let Some((v, p)) = &inner.cached {
            if *v == version && p.is(&user, &db) {
                return Ok(Some(Arc::clone(p)));
            }
        }
    }
    match users::find(state, &db, &user)? {
        Some(u) => {
            let roles = u.get_array("roles").cloned().unwrap_or_default();
            let p = Arc::new(Principal::new(user, db, roles));
            let mut inner = conn.auth.inner.lock();
            if inner.user.as_ref().is_some_and(|(u, d)| p.is(u, d)) {
                inner.cached = Some((version, Arc::clone(&p)));
            }
            Ok(Some(p))
        }
        None => {
            tracing::info!(user = %user, db = %db, peer = %conn.peer, "user no longer exists: connection logged out");
            conn.auth.logout();
            Ok(None)
        }
    }
}

/// Whether `who` may do everything `reqs` asks.
pub fn authorized(who: &Principal, reqs: &[Req]) -> bool {
    let p = &who.privileges;
    reqs.iter().all(|r| match r {
        Req::Priv(resource, action) => p.allows(resource, *action),
        Req::ViewUser(user, db) => {
            who.is(user, db) || p.allows(&Resource::database(db), Action::ViewUser)
        }
    })
}

/// MongoDB's Unauthorized for an authenticated user lacking a privilege:
/// "not authorized on <db> to execute command { <name>: <value>, ... }"
/// (the first field only: the rest may be large, and is the client's own).
pub fn not_authorized(db: &str, name: &str, cmd: &Document) -> CommandError {
    let mut value = cmd.get(name).map(ToString::to_string).unwrap_or_default();
    const SHOWN: usize = 200;
    if value.len() > SHOWN {
        let cut = (0..=SHOWN)
            .rev()
            .find(|i| value.is_char_boundary(*i))
            .unwrap_or(0);
        value.truncate(cut);
        value.push('…');
    }
    CommandError::new(
        13,
        "Unauthorized",
        format!("not authorized on {db} to execute command {{ {name}: {value}, ... }}"),
    )
}

fn requires_authentication(name: &str) -> CommandError {
    CommandError::new(
        13,
        "Unauthorized",
        format!("command {name} requires authentication"),
    )
}

/// The gate in front of every command (`name` as sent, `canonical` its
/// entry in `commands::COMMANDS`). Without `--auth` it lets everything
/// through. With it: a command the table does not know is refused (fail
/// closed); open commands run; others need an authenticated user (code 13
/// "requires authentication", except the localhost exception) whose roles
/// grant what the table asks (code 13 "not authorized on ...").
pub fn check(
    state: &ServerState,
    conn: &ConnInfo,
    db: &str,
    name: &str,
    canonical: &str,
    cmd: &Document,
) -> CmdResult<()> {
    if !state.config.auth {
        return Ok(());
    }
    let Some(rule) = table::rule(canonical) else {
        tracing::warn!(
            command = name,
            "command missing from the authorization table: refused"
        );
        return Err(not_authorized(db, name, cmd));
    };
    if matches!(rule, Rule::Open) {
        return Ok(());
    }
    let Some(who) = current_user(state, conn)? else {
        if canonical == "createUser"
            && db == users::USERS_DB
            && conn.peer.ip().is_loopback()
            && !users::any_user(state)?
        {
            return Ok(());
        }
        return Err(requires_authentication(name));
    };
    let reqs = table::requirements(rule, &Request { name, db, cmd })?;
    if authorized(&who, &reqs) {
        Ok(())
    } else {
        tracing::debug!(user = %who.user, db = %who.db, command = name, "not authorized");
        Err(not_authorized(db, name, cmd))
    }
}

/// `listDatabases`: the databases the caller may see, `None` for all. Under
/// `--auth`, a user without listDatabases on the cluster, or one asking
/// `authorizedDatabases: true`, sees only the databases it has privileges on
/// (MongoDB 4.0.5+); `check` already refused `authorizedDatabases: false`
/// without listDatabases.
pub fn database_filter(ctx: &Ctx<'_>, cmd: &Document) -> CmdResult<Option<Privileges>> {
    if !ctx.state.config.auth {
        return Ok(None);
    }
    let Some(who) = current_user(ctx.state, ctx.conn)? else {
        return Ok(None);
    };
    let p = who.privileges.clone();
    let all = match table::authorized_databases(cmd)? {
        Some(true) => false,
        _ => p.allows(&Resource::Cluster, Action::ListDatabases),
    };
    Ok((!all).then_some(p))
}

/// `saslStart`, refused when the connection is already authenticated as
/// another user (MongoDB 6+: one user per connection; `logout` first).
/// MongoDB checks at the end of the conversation; checking the user the
/// client names at its start refuses the same logins and reveals less.
/// The codes and messages are MongoDB's (5626701 when the databases differ,
/// 5626702 for another user of the same database). `speculative`: the
/// start inside `hello` (see [`start_conversation`]).
pub fn sasl_start_once(
    state: &ServerState,
    conn: &ConnInfo,
    db: &str,
    cmd: &Document,
    speculative: bool,
) -> CmdResult {
    if let Some((user, udb)) = conn.auth.user() {
        let first = payload(cmd)
            .ok()
            .and_then(|p| scram::parse_client_first(&p).ok());
        if let Some(first) = first {
            if udb != db {
                return Err(CommandError::new(
                    5626701,
                    "Location5626701",
                    format!("Each client connection may only be authenticated once. Previously authenticated as: {user}@{udb}"),
                ));
            }
            if first.user != user {
                return Err(CommandError::new(
                    5626702,
                    "Location5626702",
                    format!("Client has attempted to authenticate on multiple databases.Already authenticated as: {user}@{udb}"),
                ));
            }
        }
    }
    start_conversation(state, conn, db, cmd, speculative)
}

fn payload(cmd: &Document) -> CmdResult<Vec<u8>> {
    match cmd.get("payload") {
        Some(Bson::Binary(b)) => Ok(b.bytes.clone()),
        Some(Bson::String(s)) => base64::engine::general_purpose::STANDARD
            .decode(s)
            .map_err(|_| CommandError::bad_value("payload is not base64")),
        Some(other) => Err(CommandError::type_mismatch(format!(
            "payload must be binary data, not {:?}",
            other.element_type()
        ))),
        None => Err(CommandError::bad_value("missing payload")),
    }
}

fn bin(s: &str) -> Bson {
    Bson::Binary(Binary {
        subtype: BinarySubtype::Generic,
        bytes: s.as_bytes().to_vec(),
    })
}

/// `saslStart`, or (`speculative`) the one inside `hello`: a speculative
/// start that fails is neither logged as a failure nor counted, because the
/// driver then sends a real `saslStart` for the same login.
fn start_conversation(
    state: &ServerState,
    conn: &ConnInfo,
    db: &str,
    cmd: &Document,
    speculative: bool,
) -> CmdResult {
    let mech_name = crate::args::req_str(cmd, "mechanism")?;
    let Some(mechanism) = Mechanism::parse(mech_name) else {
        return Err(CommandError::new(
            334,
            "MechanismUnavailable",
            format!("Received authentication for mechanism {mech_name} which is not enabled (supported: SCRAM-SHA-1, SCRAM-SHA-256)"),
        ));
    };
    let first = scram::parse_client_first(&payload(cmd)?).map_err(scram_error)?;
    let user = first.user.clone();
    ratelimit::refuse_if_blocked(state, conn, &user, db, mechanism.name())?;
    let Some(creds) = users::credentials(state, db, &user, mechanism)? else {
        let reason = match users::find(state, db, &user) {
            Ok(None) => ratelimit::Reason::UnknownUser,
            _ => ratelimit::Reason::NoCredentialsForMechanism,
        };
        if !speculative {
            ratelimit::failed(state, conn, &user, db, mechanism.name(), reason);
        }
        return Err(auth_failed());
    };
    let (conv, server_first) = scram::Conversation::start(first, creds, &scram::server_nonce());
    let mut inner = conn.auth.inner.lock();
    inner.next_conversation = inner.next_conversation.wrapping_add(1).max(1);
    let id = inner.next_conversation;
    inner.conversation = Some(Pending {
        id,
        db: db.to_string(),
        skip_empty: skip_empty_exchange(cmd),
        conv: Some(conv),
    });
    Ok(doc! {"conversationId": id, "done": false, "payload": bin(&server_first), "ok": 1.0})
}

/// `saslContinue`: the client's proof, then (without `skipEmptyExchange`)
/// an empty closing message.
pub fn sasl_continue(state: &ServerState, conn: &ConnInfo, cmd: &Document) -> CmdResult {
    let id = match cmd.get("conversationId") {
        Some(v) => crate::args::as_i64("conversationId", v)?,
        None => return Err(CommandError::bad_value("missing conversationId")),
    };
    let data = payload(cmd)?;
    let mut inner = conn.auth.inner.lock();
    let Some(pending) = inner.conversation.take() else {
        return Err(CommandError::new(
            17,
            "ProtocolError",
            "no SASL conversation in progress",
        ));
    };
    if i64::from(pending.id) != id {
        return Err(CommandError::new(
            17,
            "ProtocolError",
            "conversationId does not match the conversation in progress",
        ));
    }
    let Some(conv) = pending.conv else {
        // The closing exchange: authentication already succeeded.
        return Ok(
            doc! {"conversationId": pending.id, "done": true, "payload": bin(""), "ok": 1.0},
        );
    };
    // A source blocked since its conversation started gets no proof checked.
    ratelimit::refuse_if_blocked(state, conn, &conv.user, &pending.db, conv.mechanism.name())?;
    match conv.finish(&data) {
        Ok(server_final) => {
            ratelimit::succeeded(state, conn, &conv.user, &pending.db, conv.mechanism.name());
            inner.user = Some((conv.user.clone(), pending.db.clone()));
            // Drivers ask to skip the empty closing exchange; older ones
            // send it, and we answer it.
            let done = pending.skip_empty;
            if !done {
                inner.conversation = Some(Pending {
                    id: pending.id,
                    db: pending.db,
                    skip_empty: false,
                    conv: None,
                });
            }
            Ok(
                doc! {"conversationId": id as i32, "done": done, "payload": bin(&server_final), "ok": 1.0},
            )
        }
        Err(e) => {
            if matches!(e, ScramError::Failed) {
                let reason = ratelimit::Reason::WrongProof;
                ratelimit::failed(
                    state,
                    conn,
                    &conv.user,
                    &pending.db,
                    conv.mechanism.name(),
                    reason,
                );
            }
            Err(scram_error(e))
        }
    }
}

fn skip_empty_exchange(cmd: &Document) -> bool {
    cmd.get_document("options")
        .ok()
        .and_then(|o| o.get_bool("skipEmptyExchange").ok())
        .unwrap_or(false)
}

/// `hello`'s `speculativeAuthenticate` (a `saslStart` on `db`) and
/// `saslSupportedMechs` (`"<db>.<user>"`): fields to add to the reply.
pub fn hello_fields(ctx: &Ctx<'_>, cmd: &Document, reply: &mut Document) {
    if let Ok(spec) = cmd.get_document("speculativeAuthenticate") {
        let db = spec.get_str("db").unwrap_or("admin");
        if spec.contains_key("saslStart") {
            if let Ok(mut r) = sasl_start_once(ctx.state, ctx.conn, db, spec, true) {
                r.remove("ok");
                reply.insert("speculativeAuthenticate", r);
            }
        }
    }
    if let Ok(name) = cmd.get_str("saslSupportedMechs") {
        if let Some((db, user)) = name.split_once('.') {
            if let Ok(Some(u)) = users::find(ctx.state, db, user) {
                reply.insert("saslSupportedMechs", users::mechanisms(&u));
            }
        }
    }
}
