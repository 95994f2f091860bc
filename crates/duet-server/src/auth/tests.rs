//! Tests of authorization: the command table against the dispatcher and
//! `listCommands`, the docs' role and command tables against `roles.rs` and
//! `table.rs`, and every built-in role × every command through the real
//! dispatch path (allowed, or 13 Unauthorized).

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::sync::Arc;

use bson::{doc, Bson, Document};

use super::roles::{self, Action, Actions, Privileges, Resource, Scope, ROLES};
use super::table::{self, Request, TABLE};
use super::{users, Principal};
use crate::commands::{self, ALIASES, COMMANDS};
use crate::state::{Config, ConnInfo, ServerState};

const DESIGN: &str = include_str!("../../../../docs/design.md");

fn state(auth: bool) -> Arc<ServerState> {
    ServerState::new(
        duetdb::Engine::in_memory(),
        Config {
            auth,
            data_dir: None,
            ..Config::default()
        },
    )
}

fn addr(s: &str) -> SocketAddr {
    s.parse().expect("address")
}

fn conn(id: u64) -> ConnInfo {
    ConnInfo::new(id, addr("127.0.0.1:40000"), addr("127.0.0.1:27017"))
}

fn code(reply: &Document) -> Option<i32> {
    reply.get_i32("code").ok()
}

fn errmsg(reply: &Document) -> &str {
    reply.get_str("errmsg").unwrap_or_default()
}

/// Create `user@db` with `roles` directly in the store (no credentials: the
/// tests log in with `login_for_test`, and skip PBKDF2).
fn add_user(s: &ServerState, db: &str, user: &str, roles: &[(&str, &str)]) {
    let roles = roles
        .iter()
        .map(|(r, d)| doc! {"role": *r, "db": *d})
        .collect();
    users::insert(s, db, user, roles, doc! {}).expect("insert user");
}

fn as_user(id: u64, user: &str, db: &str) -> ConnInfo {
    let c = conn(id);
    c.auth.login_for_test(user, db);
    c
}

#[test]
fn every_command_has_one_table_entry_and_list_commands_agrees() {
    let listed: BTreeSet<&str> = COMMANDS.iter().map(|(n, _)| *n).collect();
    assert_eq!(listed.len(), COMMANDS.len(), "COMMANDS has duplicates");
    let tabled: BTreeSet<&str> = TABLE.iter().map(|(n, _)| *n).collect();
    assert_eq!(tabled.len(), TABLE.len(), "TABLE has duplicates");
    let missing: Vec<_> = listed.difference(&tabled).collect();
    assert!(
        missing.is_empty(),
        "commands without a table entry: {missing:?}"
    );
    let extra: Vec<_> = tabled.difference(&listed).collect();
    assert!(extra.is_empty(), "table entries for no command: {extra:?}");
    for (alias, name) in ALIASES {
        assert!(listed.contains(name), "alias {alias} of unknown {name}");
        assert!(!listed.contains(alias), "alias {alias} is also a command");
        assert_eq!(commands::canonical_name(alias), Some(*name));
    }
    let list = commands::admin::list_commands();
    let cmds = list.get_document("commands").expect("commands");
    let reported: BTreeSet<String> = cmds.keys().cloned().collect();
    let requires = |n: &str| {
        cmds.get_document(n)
            .and_then(|c| c.get_bool("requiresAuth"))
            .ok()
    };
    assert_eq!(requires("hello"), Some(false));
    assert_eq!(requires("find"), Some(true));
    let listed_owned: BTreeSet<String> = listed.iter().map(|s| s.to_string()).collect();
    assert_eq!(reported, listed_owned);
}

#[test]
fn every_listed_name_reaches_a_handler_and_no_other_does() {
    let s = state(false);
    let c = conn(1);
    let names = COMMANDS
        .iter()
        .map(|(n, _)| *n)
        .chain(ALIASES.iter().map(|(a, _)| *a));
    for name in names {
        let mut cmd = Document::new();
        cmd.insert(name, 1);
        let reply = commands::execute(&s, &c, "t", &cmd);
        assert_ne!(code(&reply), Some(59), "{name}: {reply}");
    }
    for db_auth in [false, true] {
        let s = state(db_auth);
        let reply = commands::execute(&s, &c, "t", &doc! {"noSuchCommand": 1});
        assert_eq!(code(&reply), Some(59), "{reply}");
    }
}

#[test]
fn a_command_missing_from_the_table_is_refused_under_auth() {
    let s = state(true);
    add_user(&s, "admin", "root", &[("root", "admin")]);
    let c = as_user(1, "root", "admin");
    let cmd = doc! {"frobnicate": 1};
    let err = super::check(&s, &c, "t", "frobnicate", "frobnicate", &cmd).expect_err("refused");
    assert_eq!(err.code, 13);
    // Without --auth the gate lets everything through.
    let s = state(false);
    assert!(super::check(&s, &c, "t", "frobnicate", "frobnicate", &cmd).is_ok());
}

#[test]
fn actions_fit_the_bitset_and_have_unique_names() {
    assert!(Action::ALL.len() < 64);
    let names: BTreeSet<&str> = Action::ALL.iter().map(|a| a.name()).collect();
    assert_eq!(names.len(), Action::ALL.len());
    let sorted: Vec<&str> = Action::ALL.iter().map(|a| a.name()).collect();
    let mut by_name = sorted.clone();
    by_name.sort_by_key(|n| n.to_lowercase());
    assert_eq!(sorted, by_name, "Action::ALL is in name order");
    for (i, a) in Action::ALL.iter().enumerate() {
        assert_eq!(*a as usize, i, "{a:?}");
        assert_eq!(Action::from_name(a.name()), Some(*a));
    }
}

#[test]
fn roles_include_only_known_roles_and_root_has_everything() {
    for r in ROLES {
        for inc in r.includes {
            let inc = roles::role(inc).expect("included role exists");
            assert!(r.admin_only || !inc.admin_only, "{}", r.name);
        }
    }
    // root (on admin) has every privilege of every role, on any database.
    let root = roles::role("root").expect("root");
    for r in ROLES {
        for scope in Scope::ALL {
            let covering = if scope == Scope::Db {
                Scope::AnyDb
            } else {
                scope
            };
            let (mine, roots) = (
                roles::role_actions(r, scope),
                roles::role_actions(root, covering),
            );
            assert_eq!(mine.union(roots), roots, "{} on {}", r.name, scope.name());
        }
    }
}

#[test]
fn the_users_collection_is_out_of_reach_of_database_scopes() {
    let users_ns = Resource::collection("admin", "duet.users");
    let writers: Vec<&str> = ROLES
        .iter()
        .filter(|r| {
            let mut p = Privileges::default();
            p.add_role(r.name, "admin");
            p.allows(&users_ns, Action::Insert)
        })
        .map(|r| r.name)
        .collect();
    assert_eq!(writers, ["restore", "root"]);
    let readers: Vec<&str> = ROLES
        .iter()
        .filter(|r| {
            let mut p = Privileges::default();
            p.add_role(r.name, "admin");
            p.allows(&users_ns, Action::Find)
        })
        .map(|r| r.name)
        .collect();
    assert_eq!(
        readers,
        ["userAdminAnyDatabase", "backup", "restore", "root"]
    );
    // An ordinary collection of admin is readWrite@admin's.
    let mut p = Privileges::default();
    p.add_role("readWrite", "admin");
    assert!(p.allows(&Resource::collection("admin", "other"), Action::Insert));
    assert!(!p.allows(&users_ns, Action::Find));
    // ... and a collection named duet.users elsewhere is ordinary.
    assert!(!roles::is_system("app", "duet.users"));
}

#[test]
fn a_role_grants_on_its_database_only_and_admin_roles_only_from_admin() {
    let mut p = Privileges::default();
    p.add_role("readWrite", "app");
    assert!(p.allows(&Resource::collection("app", "c"), Action::Insert));
    assert!(!p.allows(&Resource::collection("other", "c"), Action::Find));
    assert!(!p.allows(&Resource::Cluster, Action::ListDatabases));
    assert!(p.sees_database("app") && !p.sees_database("other"));
    let mut p = Privileges::default();
    p.add_role("root", "app");
    p.add_role("readAnyDatabase", "app");
    assert!(!p.allows(&Resource::collection("app", "c"), Action::Find));
    assert!(p.to_bson().is_empty());
    let mut p = Privileges::default();
    p.add_role("readAnyDatabase", "admin");
    assert!(p.allows(&Resource::collection("any", "c"), Action::Find));
    assert!(p.allows(&Resource::Cluster, Action::ListDatabases));
    assert!(!p.allows(&Resource::collection("any", "c"), Action::Insert));
}

// ---- the docs' tables -------------------------------------------------

/// The markdown table whose header line is `header`: its rows' cells.
fn docs_table(header: &str) -> Vec<Vec<String>> {
    let mut lines = DESIGN.lines().skip_while(|l| l.trim() != header);
    assert!(
        lines.next().is_some(),
        "docs/design.md has no table `{header}`"
    );
    lines
        .skip(1) // |---|---|
        .take_while(|l| l.starts_with('|'))
        .map(|l| {
            l.trim()
                .trim_matches('|')
                .split('|')
                .map(|c| c.trim().to_string())
                .collect()
        })
        .collect()
}

type RoleRow = (String, String, BTreeSet<String>);

fn role_rows() -> Vec<RoleRow> {
    let mut rows = Vec::new();
    for r in ROLES {
        if !r.includes.is_empty() {
            let inc = r.includes.iter().map(|s| s.to_string()).collect();
            rows.push((r.name.to_string(), "roles".to_string(), inc));
        }
        for (scope, actions) in r.grants {
            let names = Actions::of(actions)
                .list()
                .into_iter()
                .map(|a| a.name().to_string())
                .collect();
            rows.push((r.name.to_string(), scope.name().to_string(), names));
        }
    }
    rows
}

/// The role table as docs/design.md should show it.
fn render_role_table() -> String {
    let mut out = String::from("| role | resource | actions |\n|---|---|---|\n");
    for r in ROLES {
        if !r.includes.is_empty() {
            out += &format!("| {} | roles | {} |\n", r.name, r.includes.join(", "));
        }
        for (scope, actions) in r.grants {
            let names: Vec<&str> = Actions::of(actions)
                .list()
                .into_iter()
                .map(Action::name)
                .collect();
            out += &format!("| {} | {} | {} |\n", r.name, scope.name(), names.join(", "));
        }
    }
    out
}

#[test]
fn docs_role_table_matches_roles_rs() {
    let parsed: Vec<RoleRow> = docs_table("| role | resource | actions |")
        .into_iter()
        .map(|cells| {
            assert_eq!(cells.len(), 3, "{cells:?}");
            let actions = cells[2]
                .split(',')
                .map(|a| a.trim().to_string())
                .filter(|a| !a.is_empty())
                .collect();
            (cells[0].clone(), cells[1].clone(), actions)
        })
        .collect();
    assert_eq!(
        parsed,
        role_rows(),
        "docs/design.md §16's role table differs from auth/roles.rs; it should read:\n{}",
        render_role_table()
    );
}

/// The command table as docs/design.md should show it: commands with the
/// same needs on one row, in table order.
fn render_command_table() -> String {
    let mut groups: Vec<(String, Vec<&str>)> = Vec::new();
    for (name, rule) in TABLE {
        let text = table::describe(*rule);
        match groups.iter_mut().find(|(t, _)| *t == text) {
            Some((_, names)) => names.push(name),
            None => groups.push((text, vec![name])),
        }
    }
    let mut out = String::from("| commands | needs |\n|---|---|\n");
    for (text, names) in groups {
        out += &format!("| {} | {} |\n", names.join(", "), text);
    }
    out
}

#[test]
fn docs_command_table_matches_table_rs() {
    let mut parsed = BTreeMap::new();
    for cells in docs_table("| commands | needs |") {
        assert_eq!(cells.len(), 2, "{cells:?}");
        for name in cells[0].split(',') {
            parsed.insert(name.trim().to_string(), cells[1].clone());
        }
    }
    let expected: BTreeMap<String, String> = TABLE
        .iter()
        .map(|(n, r)| (n.to_string(), table::describe(*r)))
        .collect();
    assert_eq!(
        parsed,
        expected,
        "docs/design.md §16's command table differs from auth/table.rs; it should read:\n{}",
        render_command_table()
    );
}

// ---- every role × every command ---------------------------------------

/// One command document per table entry (several for the computed rules),
/// on database `app` unless it names another; none destroys the users.
fn samples(me: usize) -> Vec<(&'static str, Document)> {
    let user = format!("made{me}");
    vec![
        ("app", doc! {"hello": 1}),
        ("app", doc! {"isMaster": 1}),
        ("app", doc! {"ismaster": 1}),
        ("admin", doc! {"ping": 1}),
        ("admin", doc! {"buildInfo": 1}),
        (
            "admin",
            doc! {"connectionStatus": 1, "showPrivileges": true},
        ),
        (
            "admin",
            doc! {"saslContinue": 1, "conversationId": 1, "payload": ""},
        ),
        ("admin", doc! {"authenticate": 1}),
        ("admin", doc! {"whatsmyuri": 1}),
        ("admin", doc! {"listCommands": 1}),
        ("app", doc! {"getMore": 12345i64, "collection": "c"}),
        ("app", doc! {"killCursors": "c", "cursors": [12345i64]}),
        ("admin", doc! {"endSessions": []}),
        ("admin", doc! {"commitTransaction": 1}),
        ("admin", doc! {"abortTransaction": 1}),
        ("app", doc! {"find": "c"}),
        ("app", doc! {"count": "c"}),
        ("app", doc! {"distinct": "c", "key": "x"}),
        ("app", doc! {"aggregate": "c", "pipeline": [], "cursor": {}}),
        (
            "app",
            doc! {"aggregate": "c", "pipeline": [{"$out": "o"}], "cursor": {}},
        ),
        (
            "app",
            doc! {"aggregate": "c", "pipeline": [{"$changeStream": {}}], "cursor": {}},
        ),
        ("app", doc! {"explain": {"find": "c"}}),
        (
            "app",
            doc! {"explain": {"update": "c", "updates": [{"q": {}, "u": {"$set": {"y": 1}}}]}},
        ),
        ("app", doc! {"insert": "c", "documents": [{"x": 1}]}),
        (
            "app",
            doc! {"update": "c", "updates": [{"q": {}, "u": {"$set": {"y": 1}}}]},
        ),
        (
            "app",
            doc! {"update": "c", "updates": [{"q": {"z": 1}, "u": {"$set": {"y": 1}}, "upsert": true}]},
        ),
        (
            "app",
            doc! {"delete": "c", "deletes": [{"q": {"x": 999}, "limit": 0}]},
        ),
        (
            "app",
            doc! {"findAndModify": "c", "query": {"x": 1}, "update": {"$set": {"w": 1}}},
        ),
        (
            "app",
            doc! {"findandmodify": "c", "query": {"x": 999}, "remove": true},
        ),
        ("app", doc! {"create": format!("n{me}")}),
        (
            "app",
            doc! {"createIndexes": "c", "indexes": [{"key": {"x": 1}, "name": "x_1"}]},
        ),
        ("app", doc! {"listIndexes": "c"}),
        ("app", doc! {"dropIndexes": "c", "index": "nope"}),
        ("app", doc! {"deleteIndexes": "c", "index": "nope"}),
        ("app", doc! {"collStats": "c"}),
        ("app", doc! {"listCollections": 1}),
        ("app", doc! {"dbStats": 1}),
        ("admin", doc! {"renameCollection": "app.r1", "to": "app.r2"}),
        ("app", doc! {"createSnapshot": format!("s{me}")}),
        ("app", doc! {"listSnapshots": 1}),
        ("app", doc! {"dropSnapshot": "nope"}),
        (
            "app",
            doc! {"createUser": user, "pwd": "p", "roles": ["read"], "mechanisms": ["SCRAM-SHA-1"]},
        ),
        ("app", doc! {"updateUser": "nobody", "roles": ["read"]}),
        ("app", doc! {"dropUser": "nobody"}),
        ("app", doc! {"usersInfo": 1}),
        ("admin", doc! {"usersInfo": {"forAllDBs": true}}),
        (
            "app",
            doc! {"grantRolesToUser": "nobody", "roles": ["read"]},
        ),
        (
            "app",
            doc! {"revokeRolesFromUser": "nobody", "roles": ["read"]},
        ),
        ("admin", doc! {"serverStatus": 1}),
        ("admin", doc! {"hostInfo": 1}),
        ("admin", doc! {"getParameter": "*"}),
        ("admin", doc! {"getCmdLineOpts": 1}),
        ("admin", doc! {"getLog": "global"}),
        ("admin", doc! {"listDatabases": 1}),
        (
            "admin",
            doc! {"listDatabases": 1, "authorizedDatabases": false},
        ),
        ("admin", doc! {"currentOp": 1}),
        ("admin", doc! {"currentOp": 1, "$ownOps": true}),
        ("admin", doc! {"killOp": 1, "op": 987654}),
        ("admin", doc! {"killSessions": []}),
        ("admin", doc! {"killAllSessions": []}),
        ("admin", doc! {"find": "duet.users"}),
        (
            "admin",
            doc! {"insert": "duet.users", "documents": [{"_id": format!("x.forged{me}")}]},
        ),
        ("app", doc! {"drop": "gone"}),
        ("scratch", doc! {"dropDatabase": 1}),
        ("app", doc! {"dropAllUsersFromDatabase": 1}),
    ]
}

/// The roles users get in the matrix: every built-in role (db roles on
/// `app`), plus db roles on `admin`.
fn grants() -> Vec<(&'static str, &'static str)> {
    let mut out: Vec<(&str, &str)> = ROLES
        .iter()
        .map(|r| (r.name, if r.admin_only { "admin" } else { "app" }))
        .collect();
    out.extend([
        ("readWrite", "admin"),
        ("dbOwner", "admin"),
        ("read", "other"),
    ]);
    out
}

/// Decisions that must hold whatever the tables say (the role table's
/// intent, written out): (role, role db, command, db, allowed).
const MUST: &[(&str, &str, &str, &str, bool)] = &[
    ("read", "app", "find", "app", true),
    ("read", "app", "insert", "app", false),
    ("read", "app", "drop", "app", false),
    ("read", "other", "find", "app", false),
    ("readWrite", "app", "insert", "app", true),
    ("readWrite", "app", "drop", "app", true),
    ("readWrite", "app", "createUser", "app", false),
    ("readWrite", "app", "serverStatus", "admin", false),
    ("readWrite", "app", "dropDatabase", "scratch", false),
    ("readWrite", "admin", "find", "admin", false),
    ("readWrite", "admin", "insert", "admin", false),
    ("dbOwner", "admin", "find", "admin", false),
    ("dbAdmin", "app", "find", "app", false),
    ("dbAdmin", "app", "drop", "app", true),
    ("userAdmin", "app", "createUser", "app", true),
    ("userAdmin", "app", "find", "app", false),
    ("dbOwner", "app", "insert", "app", true),
    ("dbOwner", "app", "createUser", "app", true),
    ("readAnyDatabase", "admin", "find", "app", true),
    ("readAnyDatabase", "admin", "insert", "app", false),
    ("readAnyDatabase", "admin", "find", "admin", false),
    ("readWriteAnyDatabase", "admin", "insert", "app", true),
    ("readWriteAnyDatabase", "admin", "insert", "admin", false),
    ("userAdminAnyDatabase", "admin", "find", "admin", true),
    ("userAdminAnyDatabase", "admin", "insert", "admin", false),
    ("clusterMonitor", "admin", "serverStatus", "admin", true),
    ("clusterMonitor", "admin", "find", "app", false),
    ("clusterMonitor", "admin", "killOp", "admin", false),
    ("hostManager", "admin", "killOp", "admin", true),
    ("clusterAdmin", "admin", "dropDatabase", "scratch", true),
    ("backup", "admin", "find", "app", true),
    ("backup", "admin", "insert", "app", false),
    ("restore", "admin", "insert", "admin", true),
    ("restore", "admin", "find", "app", false),
    ("root", "admin", "insert", "admin", true),
    ("root", "admin", "serverStatus", "admin", true),
];

#[test]
fn every_role_times_every_command() {
    let s = state(true);
    let grants = grants();
    for (i, (role, rdb)) in grants.iter().enumerate() {
        add_user(&s, "admin", &format!("u{i}"), &[(role, rdb)]);
    }
    // The data the commands act on.
    add_user(&s, "admin", "setup", &[("root", "admin")]);
    let setup = as_user(1000, "setup", "admin");
    for (db, cmd) in [
        ("app", doc! {"insert": "c", "documents": [{"x": 1}]}),
        ("app", doc! {"insert": "r1", "documents": [{"x": 1}]}),
        ("scratch", doc! {"insert": "c", "documents": [{"x": 1}]}),
    ] {
        let reply = commands::execute(&s, &setup, db, &cmd);
        assert_eq!(code(&reply), None, "{reply}");
    }
    let mut decided = BTreeSet::new();
    for (i, (role, rdb)) in grants.iter().enumerate() {
        let user = format!("u{i}");
        let c = as_user(i as u64 + 1, &user, "admin");
        let who = Principal::new(
            user.clone(),
            "admin".into(),
            vec![Bson::Document(doc! {"role": *role, "db": *rdb})],
        );
        for (db, cmd) in samples(i) {
            let name = commands::command_name(&cmd).expect("name");
            let canonical = commands::canonical_name(name).expect("listed");
            let rule = table::rule(canonical).expect("tabled");
            let reqs = table::requirements(
                rule,
                &Request {
                    name,
                    db,
                    cmd: &cmd,
                },
            )
            .expect("reqs");
            let expected = super::authorized(&who, &reqs);
            if name == "dropDatabase" && expected {
                // Recreate it for the next role.
                let reply = commands::execute(
                    &s,
                    &setup,
                    "scratch",
                    &doc! {"insert": "c", "documents": [{"x": 1}]},
                );
                assert_eq!(code(&reply), None, "{reply}");
            }
            let reply = commands::execute(&s, &c, db, &cmd);
            let refused =
                code(&reply) == Some(13) && errmsg(&reply).starts_with("not authorized on");
            assert_eq!(
                !refused, expected,
                "{role}@{rdb} running {cmd} on {db}: {reply}"
            );
            if refused {
                assert_eq!(
                    errmsg(&reply).split(" to execute").next(),
                    Some(format!("not authorized on {db}").as_str()),
                    "{reply}"
                );
            }
            for (r, d, n, on, allowed) in MUST {
                if r == role && d == rdb && *n == name && *on == db {
                    assert_eq!(expected, *allowed, "{role}@{rdb} {name} on {db}");
                    decided.insert((*r, *d, *n, *on));
                }
            }
        }
    }
    assert_eq!(decided.len(), MUST.len(), "a MUST row matched no sample");
    // Commands before authentication: open ones run, others need it.
    let anon = conn(5000);
    for (db, cmd) in samples(9999) {
        let name = commands::command_name(&cmd).expect("name");
        let rule = table::rule(commands::canonical_name(name).expect("listed")).expect("tabled");
        let reply = commands::execute(&s, &anon, db, &cmd);
        let needs_auth = errmsg(&reply) == format!("command {name} requires authentication");
        assert_eq!(
            needs_auth,
            !matches!(rule, table::Rule::Open),
            "{cmd}: {reply}"
        );
    }
}

#[test]
fn users_see_themselves_and_list_only_their_databases() {
    let s = state(true);
    add_user(&s, "admin", "setup", &[("root", "admin")]);
    add_user(&s, "app", "ann", &[("readWrite", "app")]);
    add_user(&s, "app", "bob", &[("read", "app")]);
    let setup = as_user(1, "setup", "admin");
    for db in ["app", "other"] {
        commands::execute(&s, &setup, db, &doc! {"insert": "c", "documents": [{}]});
    }
    let ann = as_user(2, "ann", "app");
    let me = commands::execute(&s, &ann, "app", &doc! {"usersInfo": "ann"});
    assert_eq!(code(&me), None, "{me}");
    let bob = commands::execute(&s, &ann, "app", &doc! {"usersInfo": "bob"});
    assert_eq!(code(&bob), Some(13), "{bob}");
    let mine = commands::execute(
        &s,
        &ann,
        "app",
        &doc! {"usersInfo": {"user": "ann", "db": "app"}, "showPrivileges": true},
    );
    let u = &mine.get_array("users").expect("users")[0];
    let u = u.as_document().expect("user");
    assert_eq!(
        u.get_array("inheritedPrivileges")
            .expect("privileges")
            .len(),
        1,
        "{u}"
    );
    // listDatabases: only app for ann (no listDatabases action) ...
    let names = |reply: &Document| -> Vec<String> {
        reply
            .get_array("databases")
            .expect("databases")
            .iter()
            .filter_map(|d| d.as_document()?.get_str("name").ok().map(String::from))
            .collect()
    };
    let r = commands::execute(
        &s,
        &ann,
        "admin",
        &doc! {"listDatabases": 1, "nameOnly": true},
    );
    assert_eq!(names(&r), ["app"], "{r}");
    let r = commands::execute(
        &s,
        &ann,
        "admin",
        &doc! {"listDatabases": 1, "authorizedDatabases": false},
    );
    assert_eq!(code(&r), Some(13), "{r}");
    // ... every database for root, unless it asks for its authorized ones.
    let r = commands::execute(&s, &setup, "admin", &doc! {"listDatabases": 1});
    assert_eq!(names(&r), ["admin", "app", "local", "other"], "{r}");
    let r = commands::execute(
        &s,
        &setup,
        "admin",
        &doc! {"listDatabases": 1, "authorizedDatabases": true},
    );
    assert_eq!(names(&r), ["admin", "app", "local", "other"], "{r}");
    // connectionStatus with showPrivileges.
    let st = commands::execute(
        &s,
        &ann,
        "admin",
        &doc! {"connectionStatus": 1, "showPrivileges": true},
    );
    let privs = st
        .get_document("authInfo")
        .and_then(|a| a.get_array("authenticatedUserPrivileges"))
        .expect("privileges");
    let expected = doc! {"db": "app", "collection": ""};
    assert_eq!(
        privs[0]
            .as_document()
            .and_then(|p| p.get_document("resource").ok()),
        Some(&expected),
        "{st}"
    );
}

#[test]
fn dropping_the_users_logs_everyone_out() {
    for (db, cmd) in [
        ("admin", doc! {"drop": "duet.users"}),
        ("admin", doc! {"dropDatabase": 1}),
        (
            "admin",
            doc! {"renameCollection": "admin.duet.users", "to": "admin.old"},
        ),
    ] {
        let s = state(true);
        add_user(&s, "admin", "root", &[("root", "admin")]);
        add_user(
            &s,
            "admin",
            "dba",
            &[("dbAdmin", "admin"), ("readWrite", "admin")],
        );
        let dba = as_user(1, "dba", "admin");
        let reply = commands::execute(&s, &dba, db, &cmd);
        assert_eq!(code(&reply), Some(13), "dbAdmin@admin: {cmd}: {reply}");
        let root = as_user(2, "root", "admin");
        let reply = commands::execute(&s, &root, db, &cmd);
        assert_eq!(code(&reply), None, "root: {cmd}: {reply}");
        let reply = commands::execute(&s, &dba, "app", &doc! {"find": "c"});
        assert_eq!(
            errmsg(&reply),
            "command find requires authentication",
            "{reply}"
        );
        assert!(!dba.auth.is_authenticated());
        // No user is left: the localhost exception applies again.
        let anon = conn(3);
        let reply = commands::execute(
            &s,
            &anon,
            "admin",
            &doc! {"createUser": "again", "pwd": "p", "roles": ["root"], "mechanisms": ["SCRAM-SHA-1"]},
        );
        assert_eq!(code(&reply), None, "{reply}");
    }
}

#[test]
fn role_changes_apply_at_the_next_command() {
    let s = state(true);
    add_user(&s, "admin", "root", &[("root", "admin")]);
    add_user(&s, "app", "ann", &[("read", "app")]);
    let root = as_user(1, "root", "admin");
    let ann = as_user(2, "ann", "app");
    let insert = doc! {"insert": "c", "documents": [{}]};
    assert_eq!(code(&commands::execute(&s, &ann, "app", &insert)), Some(13));
    let r = commands::execute(
        &s,
        &root,
        "app",
        &doc! {"grantRolesToUser": "ann", "roles": ["readWrite"]},
    );
    assert_eq!(code(&r), None, "{r}");
    assert_eq!(code(&commands::execute(&s, &ann, "app", &insert)), None);
    let r = commands::execute(
        &s,
        &root,
        "app",
        &doc! {"revokeRolesFromUser": "ann", "roles": ["readWrite", "read"]},
    );
    assert_eq!(code(&r), None, "{r}");
    let find = doc! {"find": "c"};
    assert_eq!(code(&commands::execute(&s, &ann, "app", &find)), Some(13));
    // root writing the users collection directly counts too (ann's cached
    // user is read again: admin's csn moved).
    let set_roles = doc! {"update": "duet.users", "updates": [
        {"q": {"_id": "app.ann"}, "u": {"$set": {"roles": [{"role": "read", "db": "app"}]}}}
    ]};
    let r = commands::execute(&s, &root, "admin", &set_roles);
    assert_eq!(r.get_i32("nModified").ok(), Some(1), "{r}");
    assert_eq!(code(&commands::execute(&s, &ann, "app", &find)), None);
}

#[test]
fn a_connection_authenticates_as_one_user() {
    let s = state(true);
    add_user(&s, "app", "ann", &[("read", "app")]);
    let c = as_user(1, "ann", "app");
    let start = |db: &str, user: &str| {
        let payload = bson::Binary {
            subtype: bson::spec::BinarySubtype::Generic,
            bytes: format!("n,,n={user},r=abcdefghijklmnopqrstuvwx").into_bytes(),
        };
        let cmd = doc! {"saslStart": 1, "mechanism": "SCRAM-SHA-256", "payload": payload};
        commands::execute(&s, &c, db, &cmd)
    };
    let other_db = start("admin", "ann");
    assert_eq!(code(&other_db), Some(5626701), "{other_db}");
    assert!(errmsg(&other_db).ends_with("Previously authenticated as: ann@app"));
    let other_user = start("app", "bob");
    assert_eq!(code(&other_user), Some(5626702), "{other_user}");
    // The same user again is allowed (ann has no credentials here: 18).
    assert_eq!(code(&start("app", "ann")), Some(18));
    // After logout, anyone.
    commands::execute(&s, &c, "admin", &doc! {"logout": 1});
    assert_eq!(code(&start("app", "bob")), Some(18));
}

#[test]
fn the_unauthorized_message_shows_the_command_name_and_value() {
    let e = super::not_authorized("app", "find", &doc! {"find": "c", "filter": {}});
    assert_eq!(e.code, 13);
    assert_eq!(e.code_name, "Unauthorized");
    assert_eq!(
        e.message,
        "not authorized on app to execute command { find: \"c\", ... }"
    );
    let long = "é".repeat(500);
    let e = super::not_authorized("app", "find", &doc! {"find": long});
    assert!(e.message.chars().count() < 300, "{}", e.message);
}

#[test]
fn requirements_of_computed_rules() {
    let req = |name: &str, db: &str, cmd: Document| {
        let rule = table::rule(commands::canonical_name(name).expect("listed")).expect("tabled");
        table::requirements(
            rule,
            &Request {
                name,
                db,
                cmd: &cmd,
            },
        )
        .expect("reqs")
    };
    use table::Req::Priv;
    let c = |coll: &str| Resource::collection("app", coll);
    assert_eq!(
        req(
            "findAndModify",
            "app",
            doc! {"findAndModify": "c", "remove": true}
        ),
        [Priv(c("c"), Action::Find), Priv(c("c"), Action::Remove)]
    );
    assert_eq!(
        req(
            "update",
            "app",
            doc! {"update": "c", "updates": [{"q": {}, "u": {}, "upsert": "yes"}]}
        ),
        [Priv(c("c"), Action::Update), Priv(c("c"), Action::Insert)]
    );
    assert_eq!(
        req(
            "aggregate",
            "app",
            doc! {"aggregate": "c", "pipeline": [{"$lookup": {"from": "d", "pipeline": [{"$unionWith": "e"}]}}, {"$merge": {"into": {"db": "x", "coll": "y"}}}]}
        ),
        [
            Priv(c("c"), Action::Find),
            Priv(c("d"), Action::Find),
            Priv(c("e"), Action::Find),
            Priv(Resource::collection("x", "y"), Action::Insert),
            Priv(Resource::collection("x", "y"), Action::Remove),
            Priv(Resource::collection("x", "y"), Action::Update),
        ]
    );
    assert_eq!(
        req(
            "aggregate",
            "admin",
            doc! {"aggregate": 1, "pipeline": [{"$changeStream": {"allChangesForCluster": true}}]}
        ),
        [
            Priv(Resource::database("admin"), Action::Find),
            Priv(Resource::AnyDatabase, Action::ChangeStream),
            Priv(Resource::AnyDatabase, Action::Find),
        ]
    );
    // The alias reads its own field: the resource is what the handler drops.
    assert_eq!(
        req(
            "deleteIndexes",
            "app",
            doc! {"deleteIndexes": "c", "dropIndexes": "other"}
        ),
        [Priv(c("c"), Action::DropIndex)]
    );
    assert_eq!(
        req(
            "explain",
            "app",
            doc! {"explain": {"findandmodify": "c", "query": {}, "update": {}}}
        ),
        [Priv(c("c"), Action::Find), Priv(c("c"), Action::Update)]
    );
}
