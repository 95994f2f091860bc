//! The one table mapping every command the server dispatches to the
//! privileges it needs ([`TABLE`]), and the requirements it yields for one
//! command document ([`requirements`]).
//!
//! Invariants:
//! - every name in `commands::COMMANDS` has exactly one entry and every entry
//!   names a command there (tests walk both lists); a command without an
//!   entry is refused under `--auth` (fail closed);
//! - a requirement names the namespace the handler will act on, read from
//!   the same fields the handler reads (`args::collection_name` of the
//!   command's own name, `$db`); where the requirement cannot tell what a
//!   malformed command would do, it asks for more, never less (an `upsert`
//!   that is not a boolean counts as an upsert);
//! - `docs/design.md` §16's command table is [`describe`] of this table
//!   (a test compares them).

use bson::{Bson, Document};

use super::roles::{Action, Resource};
use crate::args;
use crate::error::{CmdResult, CommandError};

/// One thing a command needs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Req {
    /// The action on the resource.
    Priv(Resource, Action),
    /// Describe user `(user, db)`: the user itself always may (as MongoDB),
    /// anyone else needs viewUser on `db`.
    ViewUser(String, String),
}

/// A command as the table sees it.
pub struct Request<'a> {
    /// The name as sent (an alias keeps its own field name).
    pub name: &'a str,
    pub db: &'a str,
    pub cmd: &'a Document,
}

impl Request<'_> {
    fn collection(&self) -> CmdResult<Resource> {
        Ok(Resource::collection(
            self.db,
            args::collection_name(self.cmd, self.name)?,
        ))
    }
}

type Compute = fn(&Request<'_>) -> CmdResult<Vec<Req>>;

/// What a command needs.
#[derive(Clone, Copy)]
pub enum Rule {
    /// Nothing, not even authentication (handshake and login).
    Open,
    /// An authenticated user; no privilege (its own cursors and sessions).
    Authenticated,
    /// The actions on the collection the command names.
    Collection(&'static [Action]),
    /// The actions on the command's database.
    Database(&'static [Action]),
    /// The actions on the cluster.
    Cluster(&'static [Action]),
    /// Worked out from the command document; the text describes it.
    Computed(Compute, &'static str),
}

use Action::*;

/// Every command `commands::COMMANDS` lists, by canonical name.
pub const TABLE: &[(&str, Rule)] = &[
    ("hello", Rule::Open),
    ("isMaster", Rule::Open),
    ("ping", Rule::Open),
    ("buildInfo", Rule::Open),
    ("saslStart", Rule::Open),
    ("saslContinue", Rule::Open),
    ("authenticate", Rule::Open),
    ("logout", Rule::Open),
    ("connectionStatus", Rule::Open),
    ("listCommands", Rule::Open),
    ("whatsmyuri", Rule::Authenticated),
    ("getMore", Rule::Authenticated),
    ("killCursors", Rule::Authenticated),
    ("endSessions", Rule::Authenticated),
    ("commitTransaction", Rule::Authenticated),
    ("abortTransaction", Rule::Authenticated),
    ("find", Rule::Collection(&[Find])),
    ("count", Rule::Collection(&[Find])),
    ("distinct", Rule::Collection(&[Find])),
    (
        "aggregate",
        Rule::Computed(
            aggregate,
            "find on the collection (or database for `aggregate: 1`); per stage: $changeStream changeStream, $out insert + remove and $merge insert + remove + update on the target, $lookup/$graphLookup/$unionWith find on theirs, $collStats/$indexStats collStats, $currentOp/$listSessions with allUsers inprog/listSessions on the cluster",
        ),
    ),
    (
        "explain",
        Rule::Computed(explain, "what the explained command needs"),
    ),
    (
        "insert",
        Rule::Computed(
            insert,
            "insert on the collection (bypassDocumentValidation too with `bypassDocumentValidation: true`)",
        ),
    ),
    (
        "update",
        Rule::Computed(
            update,
            "update on the collection, and insert when a statement upserts (bypassDocumentValidation too with `bypassDocumentValidation: true`)",
        ),
    ),
    ("delete", Rule::Collection(&[Remove])),
    (
        "findAndModify",
        Rule::Computed(
            find_and_modify,
            "find + update on the collection (remove instead of update with `remove: true`; insert too with `upsert: true`; bypassDocumentValidation too with `bypassDocumentValidation: true`)",
        ),
    ),
    ("create", Rule::Collection(&[CreateCollection])),
    ("drop", Rule::Collection(&[DropCollection])),
    ("createIndexes", Rule::Collection(&[CreateIndex])),
    ("listIndexes", Rule::Collection(&[ListIndexes])),
    ("dropIndexes", Rule::Collection(&[DropIndex])),
    ("collStats", Rule::Collection(&[CollStats])),
    ("validate", Rule::Collection(&[Validate])),
    ("collMod", Rule::Collection(&[CollMod])),
    ("duetRunTtlPass", Rule::Cluster(&[ServerStatus, Killop])),
    (
        "renameCollection",
        Rule::Computed(
            rename_collection,
            "renameCollectionSameDB on the database (+ dropCollection on the target with `dropTarget`); with a system collection on either side: find + dropCollection on the source, insert + createIndex on the target",
        ),
    ),
    ("convertToCapped", Rule::Collection(&[ConvertToCapped])),
    (
        "cloneCollectionAsCapped",
        Rule::Computed(
            clone_collection_as_capped,
            "find on the source; insert + createCollection on `toCollection`",
        ),
    ),
    ("listCollections", Rule::Database(&[ListCollections])),
    ("dbStats", Rule::Database(&[DbStats])),
    (
        "dropDatabase",
        Rule::Computed(
            drop_database,
            "dropDatabase on the database; for `admin` also dropCollection on admin.duet.users",
        ),
    ),
    ("createSnapshot", Rule::Database(&[CreateSnapshot])),
    ("listSnapshots", Rule::Database(&[ListSnapshots])),
    ("dropSnapshot", Rule::Database(&[DropSnapshot])),
    (
        "createUser",
        Rule::Computed(
            create_user,
            "createUser on the database + grantRole on each role's database",
        ),
    ),
    (
        "updateUser",
        Rule::Computed(
            update_user,
            "changePassword on the database for `pwd`; for `roles` grantRole on each role's database + revokeRole on the database",
        ),
    ),
    ("dropUser", Rule::Database(&[DropUser])),
    ("dropAllUsersFromDatabase", Rule::Database(&[DropUser])),
    (
        "usersInfo",
        Rule::Computed(
            users_info,
            "viewUser on the users' database (`forAllDBs`: on the cluster); nothing to see oneself",
        ),
    ),
    (
        "grantRolesToUser",
        Rule::Computed(grant_roles, "grantRole on each role's database"),
    ),
    (
        "revokeRolesFromUser",
        Rule::Computed(revoke_roles, "revokeRole on each role's database"),
    ),
    ("serverStatus", Rule::Cluster(&[ServerStatus])),
    ("hostInfo", Rule::Cluster(&[HostInfo])),
    ("getParameter", Rule::Cluster(&[GetParameter])),
    ("getCmdLineOpts", Rule::Cluster(&[GetCmdLineOpts])),
    ("getLog", Rule::Cluster(&[GetLog])),
    ("setParameter", Rule::Cluster(&[SetParameter])),
    ("top", Rule::Cluster(&[Top])),
    ("shutdown", Rule::Cluster(&[Shutdown])),
    ("fsync", Rule::Cluster(&[Fsync])),
    ("fsyncUnlock", Rule::Cluster(&[Unlock])),
    ("duetBackup", Rule::Cluster(&[Fsync])),
    ("replSetGetStatus", Rule::Cluster(&[ReplSetGetStatus])),
    ("replSetGetConfig", Rule::Cluster(&[ReplSetGetConfig])),
    (
        "listDatabases",
        Rule::Computed(
            list_databases,
            "authentication (listDatabases on the cluster shows every database, else those the user has privileges on; `authorizedDatabases: false` requires it)",
        ),
    ),
    (
        "currentOp",
        Rule::Computed(
            current_op,
            "inprog on the cluster (`$ownOps: true`: authentication only)",
        ),
    ),
    ("killOp", Rule::Cluster(&[Killop])),
    (
        "killSessions",
        Rule::Computed(
            kill_sessions,
            "authentication for named sessions; killAnySession on the cluster for `[]` (every session)",
        ),
    ),
    ("killAllSessions", Rule::Cluster(&[KillAnySession])),
    ("replSetStepDown", Rule::Cluster(&[ReplSetStateChange])),
    ("replSetReconfig", Rule::Cluster(&[ReplSetConfigure])),
    // Each operation runs through the ordinary dispatch as the command it
    // stands for (insert/update/delete/create/...), checked there.
    ("applyOps", Rule::Authenticated),
];

/// The table's rule for canonical command name `name`.
pub fn rule(name: &str) -> Option<Rule> {
    TABLE.iter().find(|(n, _)| *n == name).map(|(_, r)| *r)
}

fn join(actions: &[Action]) -> String {
    actions
        .iter()
        .map(|a| a.name())
        .collect::<Vec<_>>()
        .join(" + ")
}

/// A rule in words (the docs' command table).
pub fn describe(rule: Rule) -> String {
    match rule {
        Rule::Open => "nothing (also before authentication)".into(),
        Rule::Authenticated => "authentication only".into(),
        Rule::Collection(a) => format!("{} on the collection", join(a)),
        Rule::Database(a) => format!("{} on the database", join(a)),
        Rule::Cluster(a) => format!("{} on the cluster", join(a)),
        Rule::Computed(_, text) => text.into(),
    }
}

fn each(resource: Resource, actions: &[Action]) -> Vec<Req> {
    actions
        .iter()
        .map(|a| Req::Priv(resource.clone(), *a))
        .collect()
}

/// What command `r` needs under `rule`: `Ok(vec![])` for open and
/// authentication-only rules.
pub fn requirements(rule: Rule, r: &Request<'_>) -> CmdResult<Vec<Req>> {
    match rule {
        Rule::Open | Rule::Authenticated => Ok(Vec::new()),
        Rule::Collection(a) => Ok(each(r.collection()?, a)),
        Rule::Database(a) => Ok(each(Resource::database(r.db), a)),
        Rule::Cluster(a) => Ok(each(Resource::Cluster, a)),
        Rule::Computed(f, _) => f(r),
    }
}

/// A boolean option that, when present but not a boolean, counts as true:
/// the requirement then asks for more, and the handler refuses the command.
fn maybe(d: &Document, field: &str) -> bool {
    match d.get(field) {
        None => false,
        Some(_) => args::flag(d, field).unwrap_or(true),
    }
}

/// `{db, coll}` or a collection name of `db`, as `$out`, `$merge`, `$lookup`
/// and `$unionWith` name their other collection.
fn other_collection(db: &str, v: &Bson) -> Option<Resource> {
    match v {
        Bson::String(c) => Some(Resource::collection(db, c)),
        Bson::Document(d) => {
            let coll = d.get_str("coll").ok()?;
            let db = d.get_str("db").unwrap_or(db);
            Some(Resource::collection(db, coll))
        }
        _ => None,
    }
}

/// Stages that read no documents of the aggregated collection.
const NO_FIND_FIRST_STAGES: &[&str] = &[
    "$collStats",
    "$indexStats",
    "$currentOp",
    "$listSessions",
    "$documents",
];

fn aggregate(r: &Request<'_>) -> CmdResult<Vec<Req>> {
    let base = match r.cmd.get("aggregate") {
        Some(Bson::String(_)) => r.collection()?,
        _ => Resource::database(r.db),
    };
    let stages = match r.cmd.get("pipeline") {
        Some(Bson::Array(stages)) => stages.as_slice(),
        _ => &[],
    };
    let first = stages
        .first()
        .and_then(Bson::as_document)
        .and_then(|d| d.keys().next())
        .map(String::as_str);
    let mut out = Vec::new();
    if !first.is_some_and(|s| NO_FIND_FIRST_STAGES.contains(&s)) {
        out.push(Req::Priv(base.clone(), Find));
    }
    pipeline(r.db, &base, stages, 0, &mut out);
    Ok(out)
}

/// How deep `$facet`/`$lookup`/`$unionWith` sub-pipelines are followed: as
/// deep as the engine runs them (`MAX_SUB_PIPELINE_DEPTH`, MongoDB's 20;
/// deeper pipelines are refused with 232 before anything is read).
const MAX_PIPELINE_DEPTH: usize = 20;

fn pipeline(db: &str, base: &Resource, stages: &[Bson], depth: usize, out: &mut Vec<Req>) {
    for stage in stages {
        let Some(stage) = stage.as_document() else {
            continue;
        };
        for (name, spec) in stage {
            stage_reqs(db, base, name, spec, depth, out);
        }
    }
}

fn stage_reqs(
    db: &str,
    base: &Resource,
    name: &str,
    spec: &Bson,
    depth: usize,
    out: &mut Vec<Req>,
) {
    let sub = |spec: &Bson, out: &mut Vec<Req>| {
        if let Some(Bson::Array(p)) = spec.as_document().and_then(|d| d.get("pipeline")) {
            if depth < MAX_PIPELINE_DEPTH {
                pipeline(db, base, p, depth + 1, out);
            }
        }
    };
    let all_users = || spec.as_document().is_some_and(|d| maybe(d, "allUsers"));
    match name {
        "$changeStream" => {
            let cluster = spec
                .as_document()
                .is_some_and(|d| maybe(d, "allChangesForCluster"));
            let on = if cluster {
                Resource::AnyDatabase
            } else {
                base.clone()
            };
            out.push(Req::Priv(on.clone(), ChangeStream));
            out.push(Req::Priv(on, Find));
        }
        "$out" => {
            let target = other_collection(db, spec).unwrap_or_else(|| base.clone());
            out.extend(each(target, &[Insert, Remove]));
        }
        "$merge" => {
            let into = match spec {
                Bson::Document(d) => d.get("into").cloned().unwrap_or(Bson::Null),
                other => other.clone(),
            };
            let target = other_collection(db, &into).unwrap_or_else(|| base.clone());
            out.extend(each(target, &[Insert, Remove, Update]));
        }
        "$lookup" | "$graphLookup" | "$unionWith" => {
            let from = match spec {
                Bson::Document(d) => d
                    .get("from")
                    .or_else(|| d.get("coll"))
                    .and_then(|f| other_collection(db, f)),
                other => other_collection(db, other),
            };
            if let Some(from) = from {
                out.push(Req::Priv(from, Find));
            }
            sub(spec, out);
        }
        "$facet" => {
            if let Some(d) = spec.as_document() {
                for (_, p) in d {
                    if let (Bson::Array(p), true) = (p, depth < MAX_PIPELINE_DEPTH) {
                        pipeline(db, base, p, depth + 1, out);
                    }
                }
            }
        }
        "$collStats" | "$indexStats" => out.push(Req::Priv(base.clone(), CollStats)),
        "$currentOp" if all_users() => out.push(Req::Priv(Resource::Cluster, Inprog)),
        "$listSessions" if all_users() => out.push(Req::Priv(Resource::Cluster, ListSessions)),
        _ => {}
    }
}

fn explain(r: &Request<'_>) -> CmdResult<Vec<Req>> {
    let inner = args::opt_doc(r.cmd, "explain")?
        .ok_or_else(|| CommandError::bad_value("explain requires a command document"))?;
    let name = crate::commands::command_name(inner).unwrap_or_default();
    let unknown = || {
        CommandError::new(
            59,
            "CommandNotFound",
            format!("Explain failed due to unknown command: {name}"),
        )
    };
    let canonical = crate::commands::canonical_name(name).ok_or_else(unknown)?;
    if canonical == "explain" {
        return Err(CommandError::bad_value("explain of explain is not allowed"));
    }
    let rule = rule(canonical).ok_or_else(unknown)?;
    requirements(
        rule,
        &Request {
            name,
            db: r.db,
            cmd: inner,
        },
    )
}

/// `bypassDocumentValidation: true` needs its own action (MongoDB's: dbAdmin
/// and restore have it, readWrite does not).
fn bypass(r: &Request<'_>, coll: &Resource, out: &mut Vec<Req>) {
    if maybe(r.cmd, "bypassDocumentValidation") {
        out.push(Req::Priv(coll.clone(), BypassDocumentValidation));
    }
}

fn insert(r: &Request<'_>) -> CmdResult<Vec<Req>> {
    let coll = r.collection()?;
    let mut out = vec![Req::Priv(coll.clone(), Insert)];
    bypass(r, &coll, &mut out);
    Ok(out)
}

fn update(r: &Request<'_>) -> CmdResult<Vec<Req>> {
    let coll = r.collection()?;
    let upserts = match r.cmd.get("updates") {
        Some(Bson::Array(u)) => u.iter().any(|s| match s {
            Bson::Document(d) => maybe(d, "upsert"),
            _ => false,
        }),
        _ => false,
    };
    let mut out = vec![Req::Priv(coll.clone(), Update)];
    bypass(r, &coll, &mut out);
    if upserts {
        out.push(Req::Priv(coll, Insert));
    }
    Ok(out)
}

fn find_and_modify(r: &Request<'_>) -> CmdResult<Vec<Req>> {
    let coll = r.collection()?;
    let mut out = vec![Req::Priv(coll.clone(), Find)];
    bypass(r, &coll, &mut out);
    let remove = maybe(r.cmd, "remove");
    if remove {
        out.push(Req::Priv(coll.clone(), Remove));
    }
    if !remove || r.cmd.contains_key("update") {
        out.push(Req::Priv(coll.clone(), Update));
    }
    if maybe(r.cmd, "upsert") {
        out.push(Req::Priv(coll, Insert));
    }
    Ok(out)
}

fn split_ns(ns: &str) -> Option<(&str, &str)> {
    ns.split_once('.')
}

fn clone_collection_as_capped(r: &Request<'_>) -> CmdResult<Vec<Req>> {
    let source = r.collection()?;
    let target = Resource::collection(r.db, args::req_str(r.cmd, "toCollection")?);
    Ok(vec![
        Req::Priv(source, Find),
        Req::Priv(target.clone(), Insert),
        Req::Priv(target, CreateCollection),
    ])
}

fn rename_collection(r: &Request<'_>) -> CmdResult<Vec<Req>> {
    let from = args::req_str(r.cmd, "renameCollection")?;
    let to = args::req_str(r.cmd, "to")?;
    let (Some((from_db, from_coll)), Some((to_db, to_coll))) = (split_ns(from), split_ns(to))
    else {
        // The handler refuses it (73 InvalidNamespace); ask for the most.
        return Ok(vec![Req::Priv(Resource::AnyDatabase, DropDatabase)]);
    };
    let source = Resource::collection(from_db, from_coll);
    let target = Resource::collection(to_db, to_coll);
    let mut out = Vec::new();
    let ordinary = from_db == to_db
        && !super::roles::is_system(from_db, from_coll)
        && !super::roles::is_system(to_db, to_coll);
    if ordinary {
        out.push(Req::Priv(
            Resource::database(from_db),
            RenameCollectionSameDb,
        ));
    } else {
        out.extend(each(source, &[Find, DropCollection]));
        out.extend(each(target.clone(), &[Insert, CreateIndex]));
    }
    if maybe(r.cmd, "dropTarget") {
        out.push(Req::Priv(target, DropCollection));
    }
    Ok(out)
}

fn drop_database(r: &Request<'_>) -> CmdResult<Vec<Req>> {
    let mut out = vec![Req::Priv(Resource::database(r.db), DropDatabase)];
    if r.db == super::users::USERS_DB {
        // Dropping admin drops the users: as much as dropping their collection.
        out.push(Req::Priv(
            Resource::collection(super::users::USERS_DB, super::users::USERS_COLLECTION),
            DropCollection,
        ));
    }
    Ok(out)
}

/// The databases of the roles a `roles` array names (strings are roles of
/// `db`); malformed entries are the handler's to refuse.
fn role_dbs<'a>(db: &'a str, cmd: &'a Document) -> Vec<&'a str> {
    let Ok(roles) = cmd.get_array("roles") else {
        return Vec::new();
    };
    let mut out: Vec<&str> = Vec::new();
    for r in roles {
        let rdb = match r {
            Bson::String(_) => db,
            Bson::Document(d) => d.get_str("db").unwrap_or(db),
            _ => continue,
        };
        if !out.contains(&rdb) {
            out.push(rdb);
        }
    }
    out
}

fn on_role_dbs(r: &Request<'_>, action: Action) -> Vec<Req> {
    let dbs = role_dbs(r.db, r.cmd);
    if dbs.is_empty() {
        // No (valid) roles: the handler refuses it; ask for the action here.
        return vec![Req::Priv(Resource::database(r.db), action)];
    }
    dbs.into_iter()
        .map(|d| Req::Priv(Resource::database(d), action))
        .collect()
}

fn create_user(r: &Request<'_>) -> CmdResult<Vec<Req>> {
    let mut out = vec![Req::Priv(Resource::database(r.db), CreateUser)];
    if !role_dbs(r.db, r.cmd).is_empty() {
        out.extend(on_role_dbs(r, GrantRole));
    }
    Ok(out)
}

fn update_user(r: &Request<'_>) -> CmdResult<Vec<Req>> {
    let mut out = Vec::new();
    let here = Resource::database(r.db);
    // A change of roles is a revocation of the old ones: revokeRole on the
    // user's database suffices, since it could drop the user outright.
    if r.cmd.contains_key("roles") {
        out.extend(on_role_dbs(r, GrantRole));
        out.push(Req::Priv(here.clone(), RevokeRole));
    }
    if r.cmd.contains_key("pwd") || out.is_empty() {
        out.push(Req::Priv(here, ChangePassword));
    }
    Ok(out)
}

fn grant_roles(r: &Request<'_>) -> CmdResult<Vec<Req>> {
    Ok(on_role_dbs(r, GrantRole))
}

fn revoke_roles(r: &Request<'_>) -> CmdResult<Vec<Req>> {
    Ok(on_role_dbs(r, RevokeRole))
}

fn user_ref(db: &str, v: &Bson) -> Req {
    match v {
        Bson::String(u) => Req::ViewUser(u.clone(), db.to_string()),
        Bson::Document(d) => match (d.get_str("user"), d.get_str("db")) {
            (Ok(u), Ok(d)) => Req::ViewUser(u.to_string(), d.to_string()),
            _ => Req::Priv(Resource::database(db), ViewUser),
        },
        _ => Req::Priv(Resource::database(db), ViewUser),
    }
}

fn users_info(r: &Request<'_>) -> CmdResult<Vec<Req>> {
    Ok(match r.cmd.get("usersInfo") {
        Some(Bson::Document(d)) if maybe(d, "forAllDBs") => {
            vec![Req::Priv(Resource::Cluster, ViewUser)]
        }
        Some(Bson::Array(items)) if !items.is_empty() => {
            items.iter().map(|i| user_ref(r.db, i)).collect()
        }
        Some(v @ (Bson::String(_) | Bson::Document(_))) => vec![user_ref(r.db, v)],
        _ => vec![Req::Priv(Resource::database(r.db), ViewUser)],
    })
}

/// `listDatabases`' `authorizedDatabases`: `None` when absent (or null).
pub fn authorized_databases(cmd: &Document) -> CmdResult<Option<bool>> {
    match cmd.get("authorizedDatabases") {
        None | Some(Bson::Null) => Ok(None),
        Some(_) => args::flag(cmd, "authorizedDatabases").map(Some),
    }
}

fn list_databases(r: &Request<'_>) -> CmdResult<Vec<Req>> {
    // `authorizedDatabases: false` asks for every database.
    Ok(if authorized_databases(r.cmd)? == Some(false) {
        vec![Req::Priv(Resource::Cluster, ListDatabases)]
    } else {
        Vec::new()
    })
}

fn current_op(r: &Request<'_>) -> CmdResult<Vec<Req>> {
    Ok(if matches!(args::flag(r.cmd, "$ownOps"), Ok(true)) {
        Vec::new()
    } else {
        vec![Req::Priv(Resource::Cluster, Inprog)]
    })
}

fn kill_sessions(r: &Request<'_>) -> CmdResult<Vec<Req>> {
    Ok(match r.cmd.get("killSessions") {
        Some(Bson::Array(ids)) if !ids.is_empty() => Vec::new(),
        _ => vec![Req::Priv(Resource::Cluster, KillAnySession)],
    })
}
