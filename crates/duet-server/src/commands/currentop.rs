//! `currentOp` (the command and the `$currentOp` stage) and `killOp`.
//!
//! `currentOp` lists the commands in flight (the registry in `ops.rs`) with
//! MongoDB's fields (`opid`, `secs_running`, `microsecs_running`, `ns`,
//! `command`, `client`, `connectionId`, `killPending`, ...), plus, for a
//! read, `planSummary` (worked out by explaining the read's command:
//! planning only) and a `duet` section: the snapshot `strategy`, and the
//! old versions the read holds — for a held snapshot (`cow`) the versions of
//! the collection it keeps alive that the latest version no longer reaches
//! (an explicit walk, only when the snapshot is not the latest), for `vls`
//! the collection's remset entries (shared by its scans in flight), for
//! `olcp` the versions held for OLCP queries. The other fields of the
//! command filter the list as a query (`$ownOps`: this connection's only;
//! `$all` is accepted: there are no idle or system operations to add).
//!
//! An index build outside the writer (`createIndexes` on a large
//! collection) adds MongoDB's `msg` and `progress: {done, total}`.
//!
//! `killOp: 1, op: <opid>` cancels one (an index build stops and leaves no
//! index); as in MongoDB it answers `{info:
//! "attempting to kill op", ok: 1}` whether or not the op still runs; the
//! op stops at its next check with 11601 Interrupted. Both run on `admin`
//! only (13 Unauthorized elsewhere).

use std::cell::Cell;

use bson::{doc, Bson, Document};

use super::Ctx;
use crate::args;
use crate::error::{CmdResult, CommandError};
use crate::ops::ReadNote;
use crate::state::{ConnInfo, ServerState};

/// `currentOp` and `killOp` run on `admin` only, as in MongoDB.
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

/// Fields of an explain's plan tree that name its access path, as
/// MongoDB's `planSummary` (`COLLSCAN`, `IXSCAN { a: 1 }`, `IDHACK`, ...).
fn summarize(plan: &Bson, out: &mut Vec<String>) {
    match plan {
        Bson::Document(d) => {
            if let Ok(stage) = d.get_str("stage") {
                let leaf = !d.contains_key("inputStage") && !d.contains_key("inputStages");
                if leaf {
                    let s = match (stage, d.get_document("keyPattern"), d.get_str("indexName")) {
                        ("IXSCAN", Ok(k), _) => format!("IXSCAN {}", key_pattern(k)),
                        ("IXSCAN", _, Ok(name)) => format!("IXSCAN {name}"),
                        (s, ..) => s.to_string(),
                    };
                    if !out.contains(&s) {
                        out.push(s);
                    }
                }
            }
            for (k, v) in d {
                if k != "rejectedPlans" {
                    summarize(v, out);
                }
            }
        }
        Bson::Array(a) => a.iter().for_each(|v| summarize(v, out)),
        _ => {}
    }
}

/// `{ a: 1, b: -1 }`, as MongoDB prints key patterns.
fn key_pattern(k: &Document) -> String {
    let fields: Vec<String> = k.iter().map(|(f, v)| format!("{f}: {v}")).collect();
    format!("{{ {} }}", fields.join(", "))
}

/// The plan summary of a read and the strategy its explain reports (the
/// one the engine's chooser picks for `auto`); `None` when it cannot be
/// explained (a transaction's read, a snapshot gone meanwhile).
pub fn plan_summary(
    state: &std::sync::Arc<ServerState>,
    conn: &ConnInfo,
    note: &ReadNote,
) -> Option<(String, Option<String>)> {
    if note.strategy == "transaction" {
        return None;
    }
    let mut inner = Document::new();
    for (k, v) in note.command.iter() {
        let drop = matches!(
            k.as_str(),
            "$db"
                | "lsid"
                | "$clusterTime"
                | "txnNumber"
                | "maxTimeMS"
                | "$readPreference"
                | "cursor"
                | "batchSize"
                | "singleBatch"
        );
        if !drop {
            inner.insert(k.clone(), v.clone());
        }
    }
    let token = duetdb::CancelToken::new();
    let ctx = Ctx {
        state,
        conn,
        db: &note.db,
        create: false,
        created: Cell::new(false),
        lsid: None,
        cancel: &token,
        report: None,
        origin: None,
        stmts: Default::default(),
        items: Default::default(),
        raw_cursor: None,
    };
    let explain =
        super::read::explain(&ctx, &doc! {"explain": inner, "verbosity": "queryPlanner"}).ok()?;
    let mut stages = Vec::new();
    summarize(&Bson::Document(explain.clone()), &mut stages);
    // The engine's explain names an index; MongoDB's summary shows its keys.
    let specs = state
        .engine
        .get(&note.db)
        .ok()
        .flatten()
        .and_then(|db| db.collection(&note.coll).list_indexes().ok())
        .unwrap_or_default();
    for s in &mut stages {
        let Some(name) = s.strip_prefix("IXSCAN ").filter(|n| !n.starts_with('{')) else {
            continue;
        };
        if let Some(key) = specs
            .iter()
            .find(|spec| spec.get_str("name").ok() == Some(name))
            .and_then(|spec| spec.get_document("key").ok())
        {
            *s = format!("IXSCAN {}", key_pattern(key));
        }
    }
    // A held snapshot is read as it is (`cow`), whatever a live read of the
    // same command would choose.
    let strategy = match note.strategy {
        "cow" => None,
        _ => explain.get_str("strategy").ok().map(str::to_string),
    };
    Some((stages.join(", "), strategy))
}

/// The `duet` section and `planSummary` of one running read.
fn read_fields(ctx: &Ctx<'_>, note: &ReadNote, entry: &mut Document) {
    let (summary, chosen) = plan_summary(ctx.state, ctx.conn, note).unwrap_or_default();
    if !summary.is_empty() {
        entry.insert("planSummary", summary);
    }
    let mut duet = doc! {"strategy": chosen.unwrap_or_else(|| note.strategy.to_string())};
    let db = ctx.state.engine.get(&note.db).ok().flatten();
    match (&note.snapshot, &db) {
        (Some(snap), Some(db)) => {
            let latest = db.csn();
            duet.insert("snapshotCsn", snap.csn().min(i64::MAX as u64) as i64);
            duet.insert(
                "commitsSince",
                latest.saturating_sub(snap.csn()).min(i64::MAX as u64) as i64,
            );
            let (versions, bytes) = if snap.csn() == latest {
                (0, 0)
            } else {
                let cost = db.retained_by(snap);
                cost.by_collection
                    .get(&note.coll)
                    .map(|c| (c.docs, c.bytes()))
                    .unwrap_or_default()
            };
            duet.insert("oldVersionsHeld", super::stats::num(versions));
            duet.insert("oldVersionBytesHeld", super::stats::num(bytes));
        }
        (None, Some(db)) => {
            let v = db.collection(&note.coll).vls_stats().unwrap_or_default();
            let held = match note.strategy {
                "vls" | "auto" => v.remset.entries,
                "olcp" => v.olcp_inflight,
                _ => 0,
            };
            duet.insert("oldVersionsHeld", super::stats::num(held));
        }
        _ => {}
    }
    entry.insert("duet", duet);
}

/// MongoDB's `msg` and `progress: {done, total}` of a `createIndexes`
/// whose build runs outside the writer (the phase: scanning the
/// collection, draining the writes received during the build, committing).
pub fn index_build_fields(progress: &duetdb::IndexBuildProgress, entry: &mut Document) {
    let (_, done, total) = progress.get();
    entry.insert("msg", progress.message());
    entry.insert(
        "progress",
        doc! {
            "done": done.min(i64::MAX as u64) as i64,
            "total": total.min(i64::MAX as u64) as i64,
        },
    );
}

/// The `inprog` entries this connection may see, filtered by `filter`.
fn inprog(ctx: &Ctx<'_>, own: bool, filter: &Document) -> CmdResult<Vec<Document>> {
    let filter = duetdb::lang::Filter::parse(filter)?;
    let host = ctx.conn.local.to_string();
    let mut out = Vec::new();
    for (mut entry, note) in ctx.state.operations.current(&host) {
        if own && entry.get_i64("connectionId").ok() != Some(ctx.conn.id as i64) {
            continue;
        }
        if let Some(note) = &note {
            read_fields(ctx, note, &mut entry);
        }
        if filter.matches(&duetdb::raw::to_raw_document(&entry)?) {
            out.push(entry);
        }
    }
    Ok(out)
}

/// `{currentOp: 1, $ownOps?, $all?, <filter on the inprog fields>}`.
pub fn current_op(ctx: &Ctx<'_>, cmd: &Document) -> CmdResult {
    admin_only(ctx, "currentOp")?;
    let own = args::flag(cmd, "$ownOps")?;
    let mut filter = Document::new();
    for (k, v) in cmd.iter().skip(1) {
        let generic = matches!(
            k.as_str(),
            "$ownOps"
                | "$all"
                | "$db"
                | "lsid"
                | "comment"
                | "$clusterTime"
                | "$readPreference"
                | "apiVersion"
                | "apiStrict"
                | "apiDeprecationErrors"
                | "maxTimeMS"
        );
        if !generic {
            filter.insert(k.clone(), v.clone());
        }
    }
    let ops: Vec<Bson> = inprog(ctx, own, &filter)?
        .into_iter()
        .map(Bson::Document)
        .collect();
    Ok(doc! {"inprog": ops, "ok": 1.0})
}

/// `{$currentOp: {allUsers?, idleConnections?, idleCursors?, idleSessions?,
/// localOps?, truncateOps?, backtrace?}}` on `admin` (`aggregate: 1`).
/// Without `--auth` every operation is the one anonymous user's, so
/// `allUsers: false` still lists them all (as MongoDB without auth);
/// with `--auth` `allUsers: false` lists this connection's.
pub fn stage(ctx: &Ctx<'_>, spec: &Document) -> CmdResult<Vec<Document>> {
    if ctx.db != "admin" {
        return Err(CommandError::new(
            73,
            "InvalidNamespace",
            "$currentOp must be run against the 'admin' database with {aggregate: 1}",
        ));
    }
    for (k, _) in spec {
        match k.as_str() {
            "allUsers" | "idleConnections" | "idleCursors" | "idleSessions" | "localOps"
            | "truncateOps" | "backtrace" | "targetAllNodes" => {
                args::flag(spec, k)?;
            }
            other => {
                return Err(CommandError::new(
                    40415,
                    "Location40415",
                    format!("BSON field '$currentOp.{other}' is an unknown field."),
                ))
            }
        }
    }
    let all = args::flag(spec, "allUsers")?;
    let own = ctx.state.config.auth && !all;
    inprog(ctx, own, &Document::new())
}

/// `{killOp: 1, op: <opid>}`.
pub fn kill_op(ctx: &Ctx<'_>, cmd: &Document) -> CmdResult {
    admin_only(ctx, "killOp")?;
    let opid = match cmd.get("op") {
        None => {
            return Err(CommandError::bad_value(
                "Did not provide \"op\" field (the operation id to kill)",
            ))
        }
        Some(Bson::Int32(n)) => i64::from(*n),
        Some(Bson::Int64(n)) => *n,
        Some(Bson::Double(d)) if d.fract() == 0.0 && d.abs() < 9.0e15 => *d as i64,
        Some(other) => {
            return Err(CommandError::type_mismatch(format!(
                "killOp 'op' must be a number, not {:?}",
                other.element_type()
            )))
        }
    };
    let found = u64::try_from(opid)
        .ok()
        .is_some_and(|id| ctx.state.operations.kill(id));
    tracing::info!(conn = ctx.conn.id, opid, found, "killOp");
    Ok(doc! {"info": "attempting to kill op", "ok": 1.0})
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plan_summaries_name_the_access_path() {
        let explain = doc! {"queryPlanner": {"winningPlan": {"stage": "FETCH", "inputStage": {
        "stage": "IXSCAN", "keyPattern": {"a": 1, "b": -1}, "indexName": "a_1_b_-1"}}}};
        let mut out = Vec::new();
        summarize(&Bson::Document(explain), &mut out);
        assert_eq!(out, vec!["IXSCAN { a: 1, b: -1 }".to_string()]);
        let mut out = Vec::new();
        summarize(
            &Bson::Document(doc! {"queryPlanner": {"winningPlan": {"stage": "COLLSCAN"}}}),
            &mut out,
        );
        assert_eq!(out, vec!["COLLSCAN".to_string()]);
    }
}
