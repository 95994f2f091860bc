//! A named snapshot as a read-only database: the database name
//! `<db>@<snapshot>` (e.g. `shop@nightly`) reads database `db` as the named
//! snapshot `snapshot` holds it, so tools that only take a database name
//! (mongodump, mongoexport, BI tools, the Spark connector) read one
//! consistent state with no client change, however long they run.
//!
//! The hook is small: [`dispatch`](super) calls [`admit`] for such a name
//! before anything runs, `Ctx::database` resolves the base database, and
//! the readers ask [`Ctx::read_snapshot`](super::Ctx::read_snapshot) (or
//! `source.rs`, which treats the name as `$duet: {snapshotName}`), so every
//! read command — `find`/`getMore`, `aggregate`, `count`, `distinct`,
//! `explain`, `listCollections`, `listIndexes`, `collStats`, `dbStats` —
//! runs on the snapshot's state. Namespaces keep the name as sent
//! (`shop@nightly.c`), so cursors and replies agree with what the client
//! asked for.
//!
//! Invariants: nothing writes through such a name. Any command not in
//! [`READS`] or [`NEUTRAL`] is refused with IllegalOperation (20, as
//! MongoDB refuses writes in read-only mode), and so are transactions,
//! read concern `snapshot`, `$duet` snapshot options (the name already
//! chooses the state) and `$out`/`$merge`. Authorization is checked
//! against the base database (`read` on `shop` reads `shop@nightly`).
//! `@` is therefore reserved in database names. An unknown snapshot fails
//! as `$duet.snapshotName` does (246 SnapshotUnavailable). `listDatabases`
//! does not list these names (`listSnapshots` does).

use bson::{Bson, Document};

use crate::error::{CmdResult, CommandError};
use crate::sessions::SessionArgs;

/// Read commands served from the snapshot.
pub const READS: &[&str] = &[
    "find",
    "getMore",
    "killCursors",
    "count",
    "distinct",
    "aggregate",
    "explain",
    "listCollections",
    "listIndexes",
    "collStats",
    "dbStats",
];

/// Commands that do not depend on their database (drivers and tools send
/// some of them to whatever database they were given).
pub const NEUTRAL: &[&str] = &[
    "hello",
    "isMaster",
    "ping",
    "buildInfo",
    "whatsmyuri",
    "listCommands",
    "connectionStatus",
    "endSessions",
];

/// `(database, snapshot)` when `db` names a snapshot; InvalidNamespace (73)
/// when either side of the `@` is empty or there are two.
pub fn split(db: &str) -> CmdResult<Option<(&str, &str)>> {
    let Some((base, snap)) = db.split_once('@') else {
        return Ok(None);
    };
    if base.is_empty() || snap.is_empty() || snap.contains('@') {
        return Err(CommandError::new(
            73,
            "InvalidNamespace",
            format!(
                "invalid database name '{db}': '@' is reserved for reading a named snapshot as '<database>@<snapshot>'"
            ),
        ));
    }
    Ok(Some((base, snap)))
}

/// The database a name resolves to: `shop` for `shop@nightly`.
pub fn base(db: &str) -> &str {
    db.split_once('@').map_or(db, |(b, _)| b)
}

fn read_only(db: &str, snap: &str, what: &str) -> CommandError {
    CommandError::new(
        20,
        "IllegalOperation",
        format!(
            "'{db}' is the named snapshot '{snap}' of database '{}', read-only: {what}",
            base(db)
        ),
    )
}

/// Whether command `canonical` may run on `db`, the name of snapshot `snap`.
pub fn admit(
    db: &str,
    snap: &str,
    canonical: &str,
    cmd: &Document,
    session: &SessionArgs,
) -> CmdResult<()> {
    if NEUTRAL.contains(&canonical) {
        return Ok(());
    }
    if !READS.contains(&canonical) {
        return Err(read_only(
            db,
            snap,
            &format!("'{canonical}' is not allowed (only reads)"),
        ));
    }
    if session.in_transaction() || session.txn_number.is_some() {
        return Err(read_only(db, snap, "transactions are not allowed"));
    }
    for c in [Some(cmd), crate::args::opt_doc(cmd, "explain")?]
        .into_iter()
        .flatten()
    {
        if c.contains_key("$duet") {
            return Err(CommandError::bad_value(format!(
                "$duet options cannot be used on '{db}': the database name already reads snapshot '{snap}'"
            )));
        }
        if matches!(super::read_concern(c)?, super::ReadConcern::Snapshot(_)) {
            return Err(CommandError::new(
                72,
                "InvalidOptions",
                format!("read concern 'snapshot' cannot be used on '{db}': the database name already reads snapshot '{snap}'"),
            ));
        }
        if let Ok(stages) = c.get_array("pipeline") {
            let writes = stages.iter().any(|s| {
                matches!(s, Bson::Document(d)
                    if d.keys().any(|k| k == "$out" || k == "$merge"))
            });
            if writes {
                return Err(read_only(db, snap, "$out and $merge are not allowed"));
            }
        }
    }
    Ok(())
}
