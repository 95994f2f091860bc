//! The user store: one document per user in the `admin` database's
//! [`USERS_COLLECTION`], durable like any collection (WAL, checkpoints).
//!
//! A user document is MongoDB's `admin.system.users` shape:
//! `{_id: "<db>.<user>", user, db, roles: [{role, db}], credentials:
//! {"SCRAM-SHA-1": {...}, "SCRAM-SHA-256": {...}}}`. Invariants: only
//! salted, iterated credentials are stored (never a password); `_id` is
//! unique, so a user exists at most once per database; role names are
//! validated against the built-in roles (`roles.rs`), admin-only ones on
//! `admin` only. Writes here are the user commands'; ordinary CRUD reaches
//! this collection only with privileges on it (`roles::Scope::Users`).

use bson::{doc, Bson, Document};
use duetdb::Collection;

use super::scram::{Credentials, Mechanism};
use crate::error::{CmdResult, CommandError};
use crate::state::ServerState;

/// The collection in `admin` holding users (`system.` names are reserved by
/// the engine).
pub const USERS_COLLECTION: &str = "duet.users";
/// The database holding [`USERS_COLLECTION`].
pub const USERS_DB: &str = "admin";

pub fn user_id(db: &str, user: &str) -> String {
    format!("{db}.{user}")
}

fn read_coll(state: &ServerState) -> CmdResult<Option<Collection>> {
    Ok(state
        .engine
        .get(USERS_DB)?
        .filter(|db| {
            db.list_collection_names()
                .iter()
                .any(|c| c == USERS_COLLECTION)
        })
        .map(|db| db.collection(USERS_COLLECTION)))
}

fn write_coll(state: &ServerState) -> CmdResult<Collection> {
    let (db, _) = state.engine.database_created(USERS_DB)?;
    Ok(db.collection(USERS_COLLECTION))
}

/// Whether any user exists (the localhost exception applies when none does).
pub fn any_user(state: &ServerState) -> CmdResult<bool> {
    match read_coll(state)? {
        Some(c) => Ok(c.count(doc! {})? > 0),
        None => Ok(false),
    }
}

/// The user document, if the user exists.
pub fn find(state: &ServerState, db: &str, user: &str) -> CmdResult<Option<Document>> {
    match read_coll(state)? {
        Some(c) => Ok(c.find_one(doc! {"_id": user_id(db, user)})?),
        None => Ok(None),
    }
}

/// The user's stored credentials for `mechanism`, if any.
pub fn credentials(
    state: &ServerState,
    db: &str,
    user: &str,
    mechanism: Mechanism,
) -> CmdResult<Option<Credentials>> {
    Ok(find(state, db, user)?.and_then(|u| {
        u.get_document("credentials")
            .ok()
            .and_then(|c| c.get_document(mechanism.name()).ok())
            .and_then(|d| Credentials::from_document(mechanism, d))
    }))
}

/// The mechanisms `user` has credentials for.
pub fn mechanisms(user: &Document) -> Vec<&'static str> {
    let creds = user.get_document("credentials").ok();
    Mechanism::ALL
        .into_iter()
        .filter(|m| creds.is_some_and(|c| c.contains_key(m.name())))
        .map(Mechanism::name)
        .collect()
}

/// Parse and validate a `roles` array: strings name roles of `db`,
/// documents are `{role, db}`.
pub fn parse_roles(db: &str, roles: &[Bson]) -> CmdResult<Vec<Document>> {
    let mut out: Vec<Document> = Vec::new();
    for r in roles {
        let (role, rdb) = match r {
            Bson::String(s) => (s.as_str(), db),
            Bson::Document(d) => (
                crate::args::req_str(d, "role")?,
                crate::args::req_str(d, "db")?,
            ),
            other => {
                return Err(CommandError::type_mismatch(format!(
                    "a role must be a string or {{role, db}}, not {:?}",
                    other.element_type()
                )))
            }
        };
        let known = super::roles::role(role).is_some_and(|r| !r.admin_only || rdb == USERS_DB);
        if !known {
            return Err(CommandError::new(
                31,
                "RoleNotFound",
                format!("Could not find role: {role}@{rdb}"),
            ));
        }
        let d = doc! {"role": role, "db": rdb};
        if !out.contains(&d) {
            out.push(d);
        }
    }
    Ok(out)
}

/// Credentials for every mechanism in `mechanisms` (default: both).
pub fn make_credentials(
    user: &str,
    password: &str,
    mechanisms: &[Mechanism],
) -> CmdResult<Document> {
    let mut creds = Document::new();
    for m in mechanisms {
        let c = Credentials::new(*m, user, password)
            .map_err(|e| CommandError::bad_value(e.to_string()))?;
        creds.insert(m.name(), c.to_document());
    }
    Ok(creds)
}

/// Insert a new user; 51003 when it exists.
pub fn insert(
    state: &ServerState,
    db: &str,
    user: &str,
    roles: Vec<Document>,
    creds: Document,
) -> CmdResult<()> {
    if find(state, db, user)?.is_some() {
        return Err(CommandError::new(
            51003,
            "Location51003",
            format!("User \"{user}@{db}\" already exists"),
        ));
    }
    write_coll(state)?.insert_one(doc! {
        "_id": user_id(db, user),
        "user": user,
        "db": db,
        "roles": roles,
        "credentials": creds,
    })?;
    Ok(())
}

fn not_found(db: &str, user: &str) -> CommandError {
    CommandError::new(11, "UserNotFound", format!("User {user}@{db} not found"))
}

/// Apply `$set` to an existing user; UserNotFound (11) when it does not exist.
pub fn update(state: &ServerState, db: &str, user: &str, set: Document) -> CmdResult<()> {
    let Some(c) = read_coll(state)? else {
        return Err(not_found(db, user));
    };
    let r = c.update_one(doc! {"_id": user_id(db, user)}, doc! {"$set": set})?;
    if r.matched == 0 {
        return Err(not_found(db, user));
    }
    Ok(())
}

/// Remove one user; UserNotFound (11) when it does not exist.
pub fn remove(state: &ServerState, db: &str, user: &str) -> CmdResult<()> {
    let n = match read_coll(state)? {
        Some(c) => c.delete_one(doc! {"_id": user_id(db, user)})?,
        None => 0,
    };
    if n == 0 {
        return Err(not_found(db, user));
    }
    Ok(())
}

/// Remove every user of `db`; how many.
pub fn remove_all(state: &ServerState, db: &str) -> CmdResult<u64> {
    let n = match read_coll(state)? {
        Some(c) => c.delete_many(doc! {"db": db})?,
        None => 0,
    };
    Ok(n)
}

/// Users of `db` (or of every database), sorted by `_id`.
pub fn list(state: &ServerState, db: Option<&str>) -> CmdResult<Vec<Document>> {
    let Some(c) = read_coll(state)? else {
        return Ok(Vec::new());
    };
    let filter = match db {
        Some(db) => doc! {"db": db},
        None => doc! {},
    };
    Ok(c.find(filter).sort(doc! {"_id": 1}).run()?)
}
