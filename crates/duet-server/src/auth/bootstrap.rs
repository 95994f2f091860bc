//! The first user of a deployment no loopback client can reach: `duet serve
//! --auth --initial-root-user NAME` (or `DUET_INITIAL_ROOT_USER`) creates
//! NAME with role `root` in `admin` at start, before the port opens, when no
//! user exists — the container's counterpart of the localhost exception
//! (MongoDB's image does the same with `MONGO_INITDB_ROOT_USERNAME`).
//!
//! Invariants: it never changes an existing user or creates one beside
//! existing users (a restart with the same environment is a no-op, and a
//! changed password in the environment does not silently reset the real
//! one); the password comes from a file or the environment, never from a
//! flag (a flag shows in the process list and in `getCmdLineOpts`); it needs
//! `--auth` (a user nobody must use would be a false sense of security) and
//! a standalone or single-member server (on a replica set the first user is
//! written on the primary like any other write).

use std::path::PathBuf;

use super::roles;
use super::scram::Mechanism;
use super::users;
use crate::state::ServerState;

/// Environment variable naming the initial user.
pub const ENV_USER: &str = "DUET_INITIAL_ROOT_USER";
/// Environment variable holding the initial user's password.
pub const ENV_PASSWORD: &str = "DUET_INITIAL_ROOT_PASSWORD";
/// Environment variable naming a file with the password.
pub const ENV_PASSWORD_FILE: &str = "DUET_INITIAL_ROOT_PASSWORD_FILE";

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// The `(user, password)` to create at start, from the flags or the
/// environment, validated; `None` when neither asks for one.
pub fn initial_root_of(
    auth: bool,
    user_flag: Option<String>,
    password_file_flag: Option<PathBuf>,
    replicated: bool,
) -> Result<Option<(String, String)>, BoxError> {
    let env = |k: &str| std::env::var(k).ok().filter(|v| !v.is_empty());
    let Some(user) = user_flag.or_else(|| env(ENV_USER)) else {
        if password_file_flag.is_some() || env(ENV_PASSWORD).is_some() {
            return Err(format!(
                "an initial root password is given but no user: set --initial-root-user or {ENV_USER}"
            )
            .into());
        }
        return Ok(None);
    };
    if !auth {
        return Err(format!(
            "--initial-root-user / {ENV_USER} needs --auth (without it every client is root anyway)"
        )
        .into());
    }
    if replicated {
        return Err(format!(
            "--initial-root-user / {ENV_USER} is for a standalone server; on a replica set create \
             the first user on the primary from localhost"
        )
        .into());
    }
    let password = match password_file_flag.or_else(|| env(ENV_PASSWORD_FILE).map(PathBuf::from)) {
        Some(path) => {
            let text = std::fs::read_to_string(&path).map_err(|e| {
                format!(
                    "cannot read the initial root password file {}: {e}",
                    path.display()
                )
            })?;
            text.lines().next().unwrap_or("").to_string()
        }
        None => env(ENV_PASSWORD).ok_or_else(|| {
            format!(
                "--initial-root-user {user}: give its password in --initial-root-password-file, \
                 {ENV_PASSWORD_FILE} or {ENV_PASSWORD}"
            )
        })?,
    };
    if user.is_empty() || password.is_empty() {
        return Err("the initial root user and password must not be empty".into());
    }
    Ok(Some((user, password)))
}

/// Creates `user` with role `root` in `admin` unless a user exists. Runs
/// before the server accepts connections, under the user-store lock all
/// `createUser` calls take.
pub fn create_initial_root(
    state: &ServerState,
    user: &str,
    password: &str,
) -> Result<(), BoxError> {
    let failed = |e: crate::error::CommandError| -> BoxError {
        format!(
            "cannot create the initial root user {user}: {} ({})",
            e.message, e.code_name
        )
        .into()
    };
    let _serial = state.users_lock.lock();
    if users::any_user(state).map_err(failed)? {
        tracing::info!(
            user,
            "users exist: the initial root user is not created (it is only for a fresh data directory)"
        );
        return Ok(());
    }
    debug_assert!(roles::role("root").is_some());
    let creds = users::make_credentials(user, password, &Mechanism::ALL).map_err(failed)?;
    let roles = vec![bson::doc! {"role": "root", "db": users::USERS_DB}];
    users::insert(state, users::USERS_DB, user, roles, creds).map_err(failed)?;
    tracing::info!(user, db = users::USERS_DB, "initial root user created");
    Ok(())
}
