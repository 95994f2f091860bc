//! Named snapshots over the wire (Cassandra's snapshot API, extended):
//! `createSnapshot`, `listSnapshots`, `dropSnapshot`; reads name one with
//! `$duet: {snapshotName: "…"}` (see `source.rs`).
//!
//! A named snapshot is a pinned copy-on-write root of one database (see the
//! engine's `snapshot.rs`); these commands only translate arguments and errors.
//! On a replica set, create and drop are log entries applied by every member
//! (docs/design.md §19), so a snapshot is the same state on every member.

use std::time::{Duration, UNIX_EPOCH};

use bson::{doc, Bson, DateTime, Document};

use super::Ctx;
use crate::args;
use crate::error::{CmdResult, CommandError};

/// `{createSnapshot: <name>, collections?: [..], ttlSeconds?: n, durable?: bool}`.
/// `durable: true` pins the snapshot to its own checkpoint file so it survives
/// restarts (the reply then comes after the image is synced).
pub fn create(ctx: &Ctx<'_>, cmd: &Document) -> CmdResult {
    let name = args::req_str(cmd, "createSnapshot")?;
    let collections = match args::opt_array(cmd, "collections")? {
        None => None,
        Some(items) => Some(
            items
                .iter()
                .map(|b| match b {
                    Bson::String(s) => Ok(s.clone()),
                    other => Err(CommandError::type_mismatch(format!(
                        "collections must hold strings, not {:?}",
                        other.element_type()
                    ))),
                })
                .collect::<CmdResult<Vec<String>>>()?,
        ),
    };
    let ttl = match args::opt_i64(cmd, "ttlSeconds")? {
        None => None,
        Some(s) if s > 0 => Some(Duration::from_secs(s as u64)),
        Some(s) => {
            return Err(CommandError::bad_value(format!(
                "ttlSeconds must be positive, not {s}"
            )))
        }
    };
    let durable = args::flag(cmd, "durable")?;
    let opts = duetdb::SnapshotOptions {
        collections,
        ttl,
        durable,
    };
    let info = match ctx.state.repl.get() {
        // A replica set takes it on every member, at one log position.
        Some(m) => {
            m.create_snapshot(ctx.db, name, opts)?;
            ctx.database()?.snapshot_info(name)?
        }
        None => ctx.database()?.create_snapshot_with(name, opts)?,
    };
    Ok(doc! {
        "name": info.name,
        "csn": info.csn.min(i64::MAX as u64) as i64,
        "atClusterTime": crate::snapshots::csn_to_timestamp(info.csn),
        "durable": info.durable,
        "ok": 1.0,
    })
}

/// `{listSnapshots: 1}`: name, csn, created, age, ttl, collections, bytes
/// retained, durable.
pub fn list(ctx: &Ctx<'_>) -> CmdResult {
    let mut out = Vec::new();
    for info in ctx.database()?.list_snapshots() {
        let created = info
            .created
            .duration_since(UNIX_EPOCH)
            .map(|d| DateTime::from_millis(d.as_millis().min(i64::MAX as u128) as i64))
            .unwrap_or(DateTime::from_millis(0));
        let mut d = doc! {
            "name": info.name,
            "csn": info.csn.min(i64::MAX as u64) as i64,
            "created": created,
            "ageMillis": info.age.as_millis().min(i64::MAX as u128) as i64,
            "retainedBytes": info.retained.bytes.min(i64::MAX as u64) as i64,
            "retainedNodes": info.retained.nodes.min(i64::MAX as u64) as i64,
            "retainedDocs": info.retained.docs.min(i64::MAX as u64) as i64,
            "durable": info.durable,
        };
        if let Some(ttl) = info.ttl {
            d.insert("ttlSeconds", ttl.as_secs().min(i64::MAX as u64) as i64);
        }
        if let Some(c) = info.collections {
            d.insert("collections", c);
        }
        out.push(Bson::Document(d));
    }
    Ok(doc! {"snapshots": out, "ok": 1.0})
}

/// `{dropSnapshot: <name>}`.
pub fn drop(ctx: &Ctx<'_>, cmd: &Document) -> CmdResult {
    let name = args::req_str(cmd, "dropSnapshot")?;
    match ctx.state.repl.get() {
        Some(m) => m.drop_snapshot(ctx.db, name)?,
        None => ctx.database()?.drop_snapshot(name)?,
    }
    Ok(doc! {"ok": 1.0})
}
