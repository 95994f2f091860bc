//! Authentication: who a connection is, the SASL commands that establish it
//! (`saslStart`, `saslContinue`, `speculativeAuthenticate` inside `hello`),
//! the user-management commands, and the gate `--auth` puts in front of
//! every other command.
//!
//! - `scram`: the SCRAM mechanisms (RFC 5802 / 7677) and stored credentials;
//! - `users`: the durable user store in the `admin` database;
//! - `commands`: user management, `connectionStatus`, `logout`;
//! - `ratelimit`: failed authentications limited per source address, and
//!   the `duet::auth` log line of every outcome.
//!
//! Invariants: with `--auth` a connection runs only [`UNAUTHENTICATED`]
//! commands until a SASL conversation succeeded, except that a loopback peer
//! may create the first user in `admin` while no user exists (MongoDB's
//! localhost exception). Every failed authentication answers code 18
//! AuthenticationFailed with the same message, whether the user, the
//! mechanism's credentials or the proof was wrong. Roles are stored and
//! reported but not enforced per command (a later piece of issue #15):
//! once authenticated, a connection may run every command.

pub mod commands;
pub mod ratelimit;
pub mod scram;
pub mod users;

use std::sync::atomic::Ordering;
use std::sync::Arc;

use base64::Engine as _;
use bson::{doc, spec::BinarySubtype, Binary, Bson, Document};

use crate::commands::Ctx;
use crate::error::{CmdResult, CommandError};
use crate::state::{ConnInfo, ServerState};
use scram::{Conversation, Mechanism, ScramError};

/// Commands a connection may run before it authenticated (MongoDB's
/// `requiresAuth() == false` set we implement).
pub const UNAUTHENTICATED: &[&str] = &[
    "hello",
    "isMaster",
    "ismaster",
    "ping",
    "buildInfo",
    "buildinfo",
    "saslStart",
    "saslContinue",
    "authenticate",
    "logout",
    "connectionStatus",
];

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
    /// `ServerState::users_dropped` when `user` was last known to exist.
    drops_seen: u64,
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
        inner.conversation = None;
    }

    /// `(user, db)` of the authenticated user.
    pub fn user(&self) -> Option<(String, String)> {
        self.inner.lock().user.clone()
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

/// The gate in front of every command: `Err` (code 13) when `--auth` is on,
/// the connection has not authenticated, and `name` needs authentication.
pub fn check(state: &ServerState, conn: &ConnInfo, db: &str, name: &str) -> CmdResult<()> {
    if !state.config.auth || UNAUTHENTICATED.contains(&name) || still_authenticated(state, conn)? {
        return Ok(());
    }
    if name == "createUser"
        && db == users::USERS_DB
        && conn.peer.ip().is_loopback()
        && !users::any_user(state)?
    {
        return Ok(());
    }
    Err(CommandError::new(
        13,
        "Unauthorized",
        format!("command {name} requires authentication"),
    ))
}

/// Whether the connection is authenticated as a user that still exists: a
/// connection whose user was dropped is logged out (as MongoDB does).
fn still_authenticated(state: &ServerState, conn: &ConnInfo) -> CmdResult<bool> {
    let drops = state.users_dropped.load(Ordering::Relaxed);
    let (user, db) = {
        let inner = conn.auth.inner.lock();
        match &inner.user {
            None => return Ok(false),
            Some(_) if inner.drops_seen == drops => return Ok(true),
            Some((u, d)) => (u.clone(), d.clone()),
        }
    };
    let exists = users::find(state, &db, &user)?.is_some();
    let mut inner = conn.auth.inner.lock();
    if exists {
        inner.drops_seen = drops;
    } else {
        tracing::info!(user = %user, db = %db, peer = %conn.peer, "user dropped: connection logged out");
        inner.user = None;
    }
    Ok(exists)
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

/// `saslStart` on database `db` (the user's authSource).
pub fn sasl_start(state: &ServerState, conn: &ConnInfo, db: &str, cmd: &Document) -> CmdResult {
    start_conversation(state, conn, db, cmd, false)
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
            inner.drops_seen = state.users_dropped.load(Ordering::Relaxed);
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
            if let Ok(mut r) = start_conversation(ctx.state, ctx.conn, db, spec, true) {
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
