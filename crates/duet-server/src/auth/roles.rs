//! MongoDB's built-in roles as sets of privileges, and whether a user's
//! roles grant what a command needs (`table.rs` says what each command
//! needs).
//!
//! A privilege is an action on a resource. Roles grant actions on a
//! [`Scope`]: the database the role was granted on (`{role, db}`), every
//! database, the cluster, or the users collection `admin.duet.users`.
//! Only the actions some duet command checks are listed (MongoDB's roles
//! grant more, for commands duet does not have: collMod, compact, ...);
//! `createSnapshot`, `dropSnapshot` and `listSnapshots` are duet's own, for
//! named snapshots.
//!
//! Invariants, as MongoDB's:
//! - a role granted on database X grants on X only; roles that exist only in
//!   `admin` (`*AnyDatabase`, the cluster roles, `backup`, `restore`,
//!   `root`) grant nothing when bound to another database;
//! - database scopes (one database, every database) cover the database
//!   itself and its ordinary collections, never a system collection: the
//!   users collection `admin.duet.users` (MongoDB's `admin.system.users`) is
//!   reached only through [`Scope::Users`] grants (`userAdminAnyDatabase`
//!   reads it, `restore` — and so `root` — writes it), so `readWrite` on
//!   admin or `readWriteAnyDatabase` cannot read or forge credentials;
//! - [`ROLES`] is the one source of truth: `docs/design.md` §16's role table
//!   is compared with it by a test.

use bson::{doc, Bson, Document};

use super::users::{USERS_COLLECTION, USERS_DB};

/// A privilege action (MongoDB's names; the snapshot ones are duet's).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Action {
    BypassDocumentValidation,
    ChangePassword,
    ChangeStream,
    CollMod,
    CollStats,
    ConvertToCapped,
    CreateCollection,
    CreateIndex,
    CreateSnapshot,
    CreateUser,
    DbStats,
    DropCollection,
    DropDatabase,
    DropIndex,
    DropSnapshot,
    DropUser,
    Find,
    Fsync,
    GetCmdLineOpts,
    GetLog,
    GetParameter,
    GrantRole,
    HostInfo,
    Inprog,
    Insert,
    KillAnySession,
    KillCursors,
    Killop,
    ListCollections,
    ListDatabases,
    ListIndexes,
    ListSessions,
    ListSnapshots,
    Remove,
    RenameCollectionSameDb,
    ReplSetConfigure,
    ReplSetGetConfig,
    ReplSetGetStatus,
    ReplSetStateChange,
    RevokeRole,
    ServerStatus,
    SetParameter,
    Shutdown,
    Top,
    Unlock,
    Update,
    Validate,
    ViewUser,
}

impl Action {
    /// Every action, in name order.
    pub const ALL: &'static [Action] = &[
        Action::BypassDocumentValidation,
        Action::ChangePassword,
        Action::ChangeStream,
        Action::CollMod,
        Action::CollStats,
        Action::ConvertToCapped,
        Action::CreateCollection,
        Action::CreateIndex,
        Action::CreateSnapshot,
        Action::CreateUser,
        Action::DbStats,
        Action::DropCollection,
        Action::DropDatabase,
        Action::DropIndex,
        Action::DropSnapshot,
        Action::DropUser,
        Action::Find,
        Action::Fsync,
        Action::GetCmdLineOpts,
        Action::GetLog,
        Action::GetParameter,
        Action::GrantRole,
        Action::HostInfo,
        Action::Inprog,
        Action::Insert,
        Action::KillAnySession,
        Action::KillCursors,
        Action::Killop,
        Action::ListCollections,
        Action::ListDatabases,
        Action::ListIndexes,
        Action::ListSessions,
        Action::ListSnapshots,
        Action::Remove,
        Action::RenameCollectionSameDb,
        Action::ReplSetConfigure,
        Action::ReplSetGetConfig,
        Action::ReplSetGetStatus,
        Action::ReplSetStateChange,
        Action::RevokeRole,
        Action::ServerStatus,
        Action::SetParameter,
        Action::Shutdown,
        Action::Top,
        Action::Unlock,
        Action::Update,
        Action::Validate,
        Action::ViewUser,
    ];

    /// MongoDB's name of the action.
    pub fn name(self) -> &'static str {
        match self {
            Action::BypassDocumentValidation => "bypassDocumentValidation",
            Action::ChangePassword => "changePassword",
            Action::ChangeStream => "changeStream",
            Action::CollMod => "collMod",
            Action::CollStats => "collStats",
            Action::ConvertToCapped => "convertToCapped",
            Action::CreateCollection => "createCollection",
            Action::CreateIndex => "createIndex",
            Action::CreateSnapshot => "createSnapshot",
            Action::CreateUser => "createUser",
            Action::DbStats => "dbStats",
            Action::DropCollection => "dropCollection",
            Action::DropDatabase => "dropDatabase",
            Action::DropIndex => "dropIndex",
            Action::DropSnapshot => "dropSnapshot",
            Action::DropUser => "dropUser",
            Action::Find => "find",
            Action::Fsync => "fsync",
            Action::GetCmdLineOpts => "getCmdLineOpts",
            Action::GetLog => "getLog",
            Action::GetParameter => "getParameter",
            Action::GrantRole => "grantRole",
            Action::HostInfo => "hostInfo",
            Action::Inprog => "inprog",
            Action::Insert => "insert",
            Action::KillAnySession => "killAnySession",
            Action::KillCursors => "killCursors",
            Action::Killop => "killop",
            Action::ListCollections => "listCollections",
            Action::ListDatabases => "listDatabases",
            Action::ListIndexes => "listIndexes",
            Action::ListSessions => "listSessions",
            Action::ListSnapshots => "listSnapshots",
            Action::Remove => "remove",
            Action::RenameCollectionSameDb => "renameCollectionSameDB",
            Action::ReplSetConfigure => "replSetConfigure",
            Action::ReplSetGetConfig => "replSetGetConfig",
            Action::ReplSetGetStatus => "replSetGetStatus",
            Action::ReplSetStateChange => "replSetStateChange",
            Action::RevokeRole => "revokeRole",
            Action::ServerStatus => "serverStatus",
            Action::SetParameter => "setParameter",
            Action::Shutdown => "shutdown",
            Action::Top => "top",
            Action::Unlock => "unlock",
            Action::Validate => "validate",
            Action::Update => "update",
            Action::ViewUser => "viewUser",
        }
    }

    pub fn from_name(name: &str) -> Option<Action> {
        Action::ALL.iter().copied().find(|a| a.name() == name)
    }

    fn bit(self) -> u64 {
        // `ALL` has fewer than 64 actions (checked by a test).
        1u64 << (self as u32)
    }
}

/// A set of actions.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Actions(u64);

impl Actions {
    pub fn of(actions: &[Action]) -> Actions {
        Actions(actions.iter().fold(0, |m, a| m | a.bit()))
    }

    pub fn contains(self, a: Action) -> bool {
        self.0 & a.bit() != 0
    }

    pub fn union(self, other: Actions) -> Actions {
        Actions(self.0 | other.0)
    }

    pub fn is_empty(self) -> bool {
        self.0 == 0
    }

    /// The actions, in name order.
    pub fn list(self) -> Vec<Action> {
        Action::ALL
            .iter()
            .copied()
            .filter(|a| self.contains(*a))
            .collect()
    }
}

/// Where a role's actions apply.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scope {
    /// The database the role is granted on, and its ordinary collections.
    Db,
    /// Every database, and every ordinary collection.
    AnyDb,
    /// The server as a whole.
    Cluster,
    /// The users collection, `admin.duet.users`.
    Users,
}

impl Scope {
    pub const ALL: [Scope; 4] = [Scope::Db, Scope::AnyDb, Scope::Cluster, Scope::Users];

    /// The name the docs' role table uses.
    pub fn name(self) -> &'static str {
        match self {
            Scope::Db => "db",
            Scope::AnyDb => "any db",
            Scope::Cluster => "cluster",
            Scope::Users => "admin.duet.users",
        }
    }
}

/// A built-in role: the roles it includes and its own grants.
#[derive(Debug)]
pub struct Role {
    pub name: &'static str,
    /// Exists only in the `admin` database (MongoDB's `adminOnly`).
    pub admin_only: bool,
    /// Roles whose privileges this one has too (bound to the same database).
    pub includes: &'static [&'static str],
    pub grants: &'static [(Scope, &'static [Action])],
}

use Action::*;

const READ: &[Action] = &[
    ChangeStream,
    CollStats,
    DbStats,
    Find,
    KillCursors,
    ListCollections,
    ListIndexes,
    ListSnapshots,
];

const READ_WRITE: &[Action] = &[
    ChangeStream,
    CollStats,
    ConvertToCapped,
    CreateCollection,
    CreateIndex,
    CreateSnapshot,
    DbStats,
    DropCollection,
    DropIndex,
    DropSnapshot,
    Find,
    Insert,
    KillCursors,
    ListCollections,
    ListIndexes,
    ListSnapshots,
    Remove,
    RenameCollectionSameDb,
    Update,
];

/// dbAdmin reads no documents: it manages collections, indexes and the space
/// named snapshots retain (it may drop them, not create them).
const DB_ADMIN: &[Action] = &[
    BypassDocumentValidation,
    CollMod,
    CollStats,
    ConvertToCapped,
    CreateCollection,
    CreateIndex,
    DbStats,
    DropCollection,
    DropDatabase,
    DropIndex,
    DropSnapshot,
    ListCollections,
    ListIndexes,
    ListSnapshots,
    RenameCollectionSameDb,
    Validate,
];

const USER_ADMIN: &[Action] = &[
    ChangePassword,
    CreateUser,
    DropUser,
    GrantRole,
    RevokeRole,
    ViewUser,
];

/// The built-in roles (MongoDB's `builtin_roles.yml`, restricted to the
/// actions duet checks). `clusterManager` grants little here: duet has no
/// replication or sharding to manage.
pub const ROLES: &[Role] = &[
    Role {
        name: "read",
        admin_only: false,
        includes: &[],
        grants: &[(Scope::Db, READ)],
    },
    Role {
        name: "readWrite",
        admin_only: false,
        includes: &[],
        grants: &[(Scope::Db, READ_WRITE)],
    },
    Role {
        name: "dbAdmin",
        admin_only: false,
        includes: &[],
        grants: &[(Scope::Db, DB_ADMIN)],
    },
    Role {
        name: "userAdmin",
        admin_only: false,
        includes: &[],
        grants: &[(Scope::Db, USER_ADMIN)],
    },
    Role {
        name: "dbOwner",
        admin_only: false,
        includes: &["readWrite", "dbAdmin", "userAdmin"],
        grants: &[],
    },
    Role {
        name: "readAnyDatabase",
        admin_only: true,
        includes: &[],
        grants: &[(Scope::AnyDb, READ), (Scope::Cluster, &[ListDatabases])],
    },
    Role {
        name: "readWriteAnyDatabase",
        admin_only: true,
        includes: &["readAnyDatabase"],
        grants: &[(Scope::AnyDb, READ_WRITE)],
    },
    Role {
        name: "userAdminAnyDatabase",
        admin_only: true,
        includes: &[],
        grants: &[
            (Scope::AnyDb, USER_ADMIN),
            (Scope::Cluster, &[ListDatabases, ViewUser]),
            (
                Scope::Users,
                &[
                    ChangeStream,
                    CollStats,
                    CreateIndex,
                    DropIndex,
                    Find,
                    KillCursors,
                    ListIndexes,
                ],
            ),
        ],
    },
    Role {
        name: "dbAdminAnyDatabase",
        admin_only: true,
        includes: &[],
        grants: &[(Scope::AnyDb, DB_ADMIN), (Scope::Cluster, &[ListDatabases])],
    },
    Role {
        name: "clusterMonitor",
        admin_only: true,
        includes: &[],
        grants: &[
            (
                Scope::Cluster,
                &[
                    GetCmdLineOpts,
                    GetLog,
                    GetParameter,
                    HostInfo,
                    Inprog,
                    ListDatabases,
                    ListSessions,
                    ReplSetGetConfig,
                    ReplSetGetStatus,
                    ServerStatus,
                    Top,
                ],
            ),
            (Scope::AnyDb, &[CollStats, DbStats]),
        ],
    },
    Role {
        name: "hostManager",
        admin_only: true,
        includes: &[],
        grants: &[
            (
                Scope::Cluster,
                &[
                    Fsync,
                    KillAnySession,
                    Killop,
                    SetParameter,
                    Shutdown,
                    Unlock,
                ],
            ),
            (Scope::AnyDb, &[KillCursors]),
        ],
    },
    Role {
        name: "clusterManager",
        admin_only: true,
        includes: &[],
        grants: &[(
            Scope::Cluster,
            &[
                ListSessions,
                ReplSetConfigure,
                ReplSetGetConfig,
                ReplSetGetStatus,
                ReplSetStateChange,
            ],
        )],
    },
    Role {
        name: "clusterAdmin",
        admin_only: true,
        includes: &["clusterMonitor", "hostManager", "clusterManager"],
        grants: &[(Scope::AnyDb, &[DropDatabase])],
    },
    Role {
        name: "backup",
        admin_only: true,
        includes: &[],
        grants: &[
            (Scope::Cluster, &[GetParameter, ListDatabases, ServerStatus]),
            // A named snapshot is how a backup reads every collection at
            // one point in time.
            (
                Scope::AnyDb,
                &[
                    CollStats,
                    CreateSnapshot,
                    DropSnapshot,
                    Find,
                    ListCollections,
                    ListIndexes,
                    ListSnapshots,
                ],
            ),
            (Scope::Users, &[CollStats, Find, ListIndexes]),
        ],
    },
    Role {
        name: "restore",
        admin_only: true,
        includes: &[],
        grants: &[
            (Scope::Cluster, &[GetParameter]),
            (
                Scope::AnyDb,
                &[
                    BypassDocumentValidation,
                    ChangePassword,
                    CreateCollection,
                    CreateIndex,
                    CreateUser,
                    DropCollection,
                    DropUser,
                    GrantRole,
                    Insert,
                    ListCollections,
                    RevokeRole,
                    ViewUser,
                ],
            ),
            (
                Scope::Users,
                &[
                    CreateCollection,
                    CreateIndex,
                    DropCollection,
                    Find,
                    Insert,
                    Remove,
                    Update,
                ],
            ),
        ],
    },
    Role {
        name: "root",
        admin_only: true,
        includes: &[
            "readWriteAnyDatabase",
            "dbAdminAnyDatabase",
            "userAdminAnyDatabase",
            "clusterAdmin",
            "backup",
            "restore",
        ],
        grants: &[],
    },
];

/// The built-in role named `name`.
pub fn role(name: &str) -> Option<&'static Role> {
    ROLES.iter().find(|r| r.name == name)
}

/// The actions `role` grants on `scope`, its included roles' too.
pub fn role_actions(role: &Role, scope: Scope) -> Actions {
    let own = role
        .grants
        .iter()
        .filter(|(s, _)| *s == scope)
        .fold(Actions::default(), |acc, (_, a)| acc.union(Actions::of(a)));
    role.includes
        .iter()
        .filter_map(|n| self::role(n))
        .fold(own, |acc, r| acc.union(role_actions(r, scope)))
}

/// What a command needs an action on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Resource {
    Cluster,
    /// A database as a whole (listCollections, dbStats, createUser, ...).
    Database(String),
    /// One collection.
    Collection(String, String),
    /// Every database at once (a cluster-wide change stream).
    AnyDatabase,
}

impl Resource {
    pub fn collection(db: &str, coll: &str) -> Resource {
        Resource::Collection(db.to_string(), coll.to_string())
    }

    pub fn database(db: &str) -> Resource {
        Resource::Database(db.to_string())
    }

    pub fn describe(&self) -> String {
        match self {
            Resource::Cluster => "the cluster".into(),
            Resource::Database(d) => format!("database {d}"),
            Resource::Collection(d, c) => format!("{d}.{c}"),
            Resource::AnyDatabase => "every database".into(),
        }
    }
}

/// Whether `db.coll` is a system collection: MongoDB's `system.*`, and the
/// users collection. Database scopes never cover one.
pub fn is_system(db: &str, coll: &str) -> bool {
    coll.starts_with("system.") || (db == USERS_DB && coll == USERS_COLLECTION)
}

/// Where a user's grant applies, bound to a database.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Bound {
    Db(String),
    AnyDb,
    Cluster,
    Users,
}

impl Bound {
    fn covers(&self, r: &Resource) -> bool {
        match (self, r) {
            (Bound::Cluster, Resource::Cluster) => true,
            (Bound::Db(d), Resource::Database(e)) => d == e,
            (Bound::Db(d), Resource::Collection(e, c)) => d == e && !is_system(e, c),
            (Bound::AnyDb, Resource::Database(_) | Resource::AnyDatabase) => true,
            (Bound::AnyDb, Resource::Collection(e, c)) => !is_system(e, c),
            (Bound::Users, Resource::Collection(e, c)) => e == USERS_DB && c == USERS_COLLECTION,
            _ => false,
        }
    }

    fn to_document(&self) -> Document {
        match self {
            Bound::Db(d) => doc! {"db": d, "collection": ""},
            Bound::AnyDb => doc! {"db": "", "collection": ""},
            Bound::Cluster => doc! {"cluster": true},
            Bound::Users => doc! {"db": USERS_DB, "collection": USERS_COLLECTION},
        }
    }
}

/// A user's privileges: the union of its roles' grants, bound to the
/// databases the roles were granted on.
#[derive(Debug, Clone, Default)]
pub struct Privileges {
    grants: Vec<(Bound, Actions)>,
}

impl Privileges {
    /// The privileges of stored roles (`[{role, db}]`); unknown roles and
    /// admin-only roles bound elsewhere than `admin` grant nothing.
    pub fn of_roles(roles: &[Bson]) -> Privileges {
        let mut p = Privileges::default();
        for r in roles {
            let Bson::Document(r) = r else { continue };
            let (Ok(name), Ok(db)) = (r.get_str("role"), r.get_str("db")) else {
                continue;
            };
            p.add_role(name, db);
        }
        p
    }

    /// Add the grants of built-in role `name` granted on database `db`.
    pub fn add_role(&mut self, name: &str, db: &str) {
        let Some(role) = role(name) else { return };
        if role.admin_only && db != USERS_DB {
            return;
        }
        for scope in Scope::ALL {
            let actions = role_actions(role, scope);
            if actions.is_empty() {
                continue;
            }
            let bound = match scope {
                Scope::Db => Bound::Db(db.to_string()),
                Scope::AnyDb => Bound::AnyDb,
                Scope::Cluster => Bound::Cluster,
                Scope::Users => Bound::Users,
            };
            match self.grants.iter_mut().find(|(b, _)| *b == bound) {
                Some((_, a)) => *a = a.union(actions),
                None => self.grants.push((bound, actions)),
            }
        }
    }

    /// Whether `action` on `resource` is granted.
    pub fn allows(&self, resource: &Resource, action: Action) -> bool {
        self.grants
            .iter()
            .any(|(b, a)| a.contains(action) && b.covers(resource))
    }

    /// Whether the user has some privilege on database `db` or one of its
    /// collections (`listDatabases` without the listDatabases action shows
    /// those, as MongoDB's `authorizedDatabases`).
    pub fn sees_database(&self, db: &str) -> bool {
        self.grants.iter().any(|(b, _)| match b {
            Bound::Db(d) => d == db,
            Bound::AnyDb => true,
            Bound::Users => db == USERS_DB,
            Bound::Cluster => false,
        })
    }

    /// MongoDB's `[{resource, actions}]` (`connectionStatus` and `usersInfo`
    /// with `showPrivileges`).
    pub fn to_bson(&self) -> Vec<Bson> {
        self.grants
            .iter()
            .map(|(b, a)| {
                let actions: Vec<Bson> = a.list().into_iter().map(|x| x.name().into()).collect();
                Bson::Document(doc! {"resource": b.to_document(), "actions": actions})
            })
            .collect()
    }
}
