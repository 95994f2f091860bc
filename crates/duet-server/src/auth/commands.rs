//! The user-management commands (`createUser`, `updateUser`, `dropUser`,
//! `dropAllUsersFromDatabase`, `usersInfo`, `grantRolesToUser`,
//! `revokeRolesFromUser`) and `connectionStatus` / `logout`.
//!
//! Users belong to the database the command was sent to (`$db`), which is
//! the user's authSource. Passwords are turned into SCRAM credentials here
//! and dropped; `usersInfo` never shows credentials.

use bson::{doc, Bson, Document};

use super::scram::Mechanism;
use super::users;
use crate::args;
use crate::commands::Ctx;
use crate::error::{CmdResult, CommandError};

fn name_arg<'a>(cmd: &'a Document, field: &str) -> CmdResult<&'a str> {
    let name = args::req_str(cmd, field)?;
    if name.is_empty() {
        return Err(CommandError::bad_value("the user name must not be empty"));
    }
    Ok(name)
}

fn password(cmd: &Document) -> CmdResult<Option<&str>> {
    if cmd.get("digestPassword").is_some() && !args::flag(cmd, "digestPassword")? {
        return Err(CommandError::bad_value(
            "digestPassword: false is not supported (the server digests the password)",
        ));
    }
    let pwd = args::opt_str(cmd, "pwd")?;
    if pwd.is_some_and(str::is_empty) {
        return Err(CommandError::bad_value("pwd must not be empty"));
    }
    Ok(pwd)
}

fn mechanisms(cmd: &Document) -> CmdResult<Vec<Mechanism>> {
    let Some(list) = args::opt_array(cmd, "mechanisms")? else {
        return Ok(Mechanism::ALL.to_vec());
    };
    let mut out = Vec::new();
    for m in list {
        let parsed = match m {
            Bson::String(s) => Mechanism::parse(s),
            _ => None,
        };
        match parsed {
            Some(m) if !out.contains(&m) => out.push(m),
            Some(_) => {}
            None => {
                return Err(CommandError::bad_value(format!(
                    "unknown mechanism {m} (supported: SCRAM-SHA-1, SCRAM-SHA-256)"
                )))
            }
        }
    }
    if out.is_empty() {
        return Err(CommandError::bad_value("mechanisms must not be empty"));
    }
    Ok(out)
}

fn roles_arg(ctx: &Ctx<'_>, cmd: &Document, required: bool) -> CmdResult<Option<Vec<Document>>> {
    match args::opt_array(cmd, "roles")? {
        Some(r) => Ok(Some(users::parse_roles(ctx.db, r)?)),
        None if required => Err(CommandError::bad_value("missing roles")),
        None => Ok(None),
    }
}

pub fn create_user(ctx: &Ctx<'_>, cmd: &Document) -> CmdResult {
    let user = name_arg(cmd, "createUser")?;
    let Some(pwd) = password(cmd)? else {
        return Err(CommandError::bad_value(
            "pwd is required (users without a password are not supported)",
        ));
    };
    let roles = roles_arg(ctx, cmd, true)?.unwrap_or_default();
    let creds = users::make_credentials(user, pwd, &mechanisms(cmd)?)?;
    let _serial = ctx.state.users_lock.lock();
    if ctx.state.config.auth && !ctx.conn.auth.is_authenticated() && users::any_user(ctx.state)? {
        // The localhost exception was used by another connection meanwhile.
        return Err(CommandError::new(
            13,
            "Unauthorized",
            "command createUser requires authentication",
        ));
    }
    users::insert(ctx.state, ctx.db, user, roles, creds)?;
    tracing::info!(user, db = ctx.db, peer = %ctx.conn.peer, "user created");
    Ok(doc! {"ok": 1.0})
}

pub fn update_user(ctx: &Ctx<'_>, cmd: &Document) -> CmdResult {
    let user = name_arg(cmd, "updateUser")?;
    let mut set = Document::new();
    if let Some(pwd) = password(cmd)? {
        set.insert(
            "credentials",
            users::make_credentials(user, pwd, &mechanisms(cmd)?)?,
        );
    } else if cmd.contains_key("mechanisms") {
        return Err(CommandError::bad_value(
            "mechanisms can only be changed together with pwd",
        ));
    }
    if let Some(roles) = roles_arg(ctx, cmd, false)? {
        set.insert("roles", roles);
    }
    if set.is_empty() {
        return Err(CommandError::bad_value(
            "updateUser: nothing to update (give pwd and/or roles)",
        ));
    }
    users::update(ctx.state, ctx.db, user, set)?;
    Ok(doc! {"ok": 1.0})
}

pub fn drop_user(ctx: &Ctx<'_>, cmd: &Document) -> CmdResult {
    let user = name_arg(cmd, "dropUser")?;
    users::remove(ctx.state, ctx.db, user)?;
    Ok(doc! {"ok": 1.0})
}

pub fn drop_all_users(ctx: &Ctx<'_>) -> CmdResult {
    let n = users::remove_all(ctx.state, ctx.db)?;
    Ok(doc! {"n": n as i64, "ok": 1.0})
}

fn current_roles(ctx: &Ctx<'_>, user: &str) -> CmdResult<Vec<Document>> {
    let Some(u) = users::find(ctx.state, ctx.db, user)? else {
        return Err(CommandError::new(
            11,
            "UserNotFound",
            format!("User {user}@{} not found", ctx.db),
        ));
    };
    Ok(u.get_array("roles")
        .map(|a| a.iter().filter_map(|r| r.as_document().cloned()).collect())
        .unwrap_or_default())
}

/// `grantRolesToUser` (`grant`) or `revokeRolesFromUser`.
pub fn change_roles(ctx: &Ctx<'_>, cmd: &Document, grant: bool) -> CmdResult {
    let field = if grant {
        "grantRolesToUser"
    } else {
        "revokeRolesFromUser"
    };
    let user = name_arg(cmd, field)?;
    let Some(change) = roles_arg(ctx, cmd, true)? else {
        return Err(CommandError::bad_value("missing roles"));
    };
    let mut roles = current_roles(ctx, user)?;
    if grant {
        for r in change {
            if !roles.contains(&r) {
                roles.push(r);
            }
        }
    } else {
        roles.retain(|r| !change.contains(r));
    }
    users::update(ctx.state, ctx.db, user, doc! {"roles": roles})?;
    Ok(doc! {"ok": 1.0})
}

fn describe(u: &Document, show_privileges: bool) -> Document {
    let mut d = doc! {
        "_id": u.get("_id").cloned().unwrap_or(Bson::Null),
        "user": u.get("user").cloned().unwrap_or(Bson::Null),
        "db": u.get("db").cloned().unwrap_or(Bson::Null),
        "roles": u.get("roles").cloned().unwrap_or(Bson::Array(Vec::new())),
    };
    d.insert("mechanisms", users::mechanisms(u));
    if show_privileges {
        let roles = u.get_array("roles").cloned().unwrap_or_default();
        let mut inherited: Vec<Bson> = Vec::new();
        for r in &roles {
            let Bson::Document(r) = r else { continue };
            let (Ok(name), Ok(db)) = (r.get_str("role"), r.get_str("db")) else {
                continue;
            };
            let mut names = vec![name];
            // Roles a role includes, transitively (each listed once).
            let mut i = 0;
            while i < names.len() {
                if let Some(role) = super::roles::role(names[i]) {
                    for inc in role.includes {
                        if !names.contains(inc) {
                            names.push(inc);
                        }
                    }
                }
                i += 1;
            }
            for n in names {
                let entry = Bson::Document(doc! {"role": n, "db": db});
                if !inherited.contains(&entry) {
                    inherited.push(entry);
                }
            }
        }
        d.insert("inheritedRoles", inherited);
        d.insert(
            "inheritedPrivileges",
            super::roles::Privileges::of_roles(&roles).to_bson(),
        );
    }
    d
}

/// `usersInfo`: `1` (every user of the database), a name, `{user, db}`, an
/// array of those, or `{forAllDBs: true}`; `showPrivileges: true` adds
/// `inheritedRoles` and `inheritedPrivileges`.
pub fn users_info(ctx: &Ctx<'_>, cmd: &Document) -> CmdResult {
    let show = args::flag(cmd, "showPrivileges")?;
    let spec = cmd.get("usersInfo").cloned().unwrap_or(Bson::Null);
    let mut wanted: Vec<(String, String)> = Vec::new();
    let found: Vec<Document> = match &spec {
        Bson::Int32(1) | Bson::Int64(1) | Bson::Double(1.0) => {
            users::list(ctx.state, Some(ctx.db))?
        }
        Bson::Document(d) if args::flag(d, "forAllDBs")? => users::list(ctx.state, None)?,
        Bson::Array(items) => {
            for i in items {
                wanted.push(user_ref(ctx, i)?);
            }
            find_all(ctx, &wanted)?
        }
        other => {
            wanted.push(user_ref(ctx, other)?);
            find_all(ctx, &wanted)?
        }
    };
    let users: Vec<Document> = found.iter().map(|u| describe(u, show)).collect();
    Ok(doc! {"users": users, "ok": 1.0})
}

fn find_all(ctx: &Ctx<'_>, wanted: &[(String, String)]) -> CmdResult<Vec<Document>> {
    let mut out = Vec::new();
    for (user, db) in wanted {
        if let Some(u) = users::find(ctx.state, db, user)? {
            out.push(u);
        }
    }
    Ok(out)
}

fn user_ref(ctx: &Ctx<'_>, v: &Bson) -> CmdResult<(String, String)> {
    match v {
        Bson::String(s) => Ok((s.clone(), ctx.db.to_string())),
        Bson::Document(d) => Ok((
            args::req_str(d, "user")?.to_string(),
            args::req_str(d, "db")?.to_string(),
        )),
        other => Err(CommandError::bad_value(format!(
            "usersInfo: expected 1, a user name, {{user, db}} or an array of them, not {other}"
        ))),
    }
}

/// `connectionStatus`: the authenticated user and its roles; with
/// `showPrivileges: true` also its privileges (`[{resource, actions}]`).
pub fn connection_status(ctx: &Ctx<'_>, cmd: &Document) -> CmdResult {
    let show = args::flag(cmd, "showPrivileges")?;
    let who = super::current_user(ctx.state, ctx.conn)?;
    let mut info = match &who {
        Some(w) => doc! {
            "authenticatedUsers": [{"user": &w.user, "db": &w.db}],
            "authenticatedUserRoles": w.roles.clone(),
        },
        None => doc! {"authenticatedUsers": [], "authenticatedUserRoles": []},
    };
    if show {
        let privileges = who.map(|w| w.privileges.to_bson()).unwrap_or_default();
        info.insert("authenticatedUserPrivileges", privileges);
    }
    Ok(doc! {"authInfo": info, "ok": 1.0})
}

pub fn logout(ctx: &Ctx<'_>) -> CmdResult {
    ctx.conn.auth.logout();
    Ok(doc! {"ok": 1.0})
}
