//! `duetBackup` (admin): a hot backup of every database into a new
//! directory on the server's machine, while the server keeps serving
//! (`Engine::backup_to`: each database's published state written with the
//! checkpoint writer, no lock, no pause). `{duetBackup: 1, to: "<absolute
//! path>"}` replies with each database's csn, bytes and documents; the
//! directory is a data directory (`duet serve --data-dir <to>` starts from
//! it).
//!
//! Invariants: runs on `admin` only (13 elsewhere); `to` must be an
//! absolute path that does not exist or is empty (BadValue 2 for a relative
//! path; the engine's storage error, never an overwrite, otherwise). The
//! server writes as its own user wherever that user may write, so under
//! `--auth` it needs the `fsync` action on the cluster (clusterAdmin,
//! hostManager, root), as MongoDB's `fsync`-based backups do.

use std::path::Path;

use bson::{doc, Bson, Document};

use super::Ctx;
use crate::args;
use crate::error::{CmdResult, CommandError};

pub fn duet_backup(ctx: &Ctx<'_>, cmd: &Document) -> CmdResult {
    if ctx.db != "admin" {
        return Err(CommandError::new(
            13,
            "Unauthorized",
            "duetBackup may only be run against the admin database.",
        ));
    }
    let to = args::req_str(cmd, "to")?;
    let path = Path::new(to);
    if !path.is_absolute() {
        return Err(CommandError::bad_value(format!(
            "duetBackup 'to' must be an absolute path on the server, not '{to}'"
        )));
    }
    let started = std::time::Instant::now();
    let info = ctx.state.engine.backup_to(path, |_, _| {})?;
    let dbs: Vec<Bson> = info
        .databases
        .iter()
        .map(|b| {
            Bson::Document(doc! {
                "name": b.name.clone(),
                "csn": b.csn.min(i64::MAX as u64) as i64,
                "bytes": b.bytes.min(i64::MAX as u64) as i64,
                "documents": b.documents.min(i64::MAX as u64) as i64,
            })
        })
        .collect();
    tracing::info!(
        to,
        databases = dbs.len(),
        ms = started.elapsed().as_millis() as u64,
        "duetBackup"
    );
    Ok(doc! {"to": to, "databases": dbs, "ok": 1.0})
}
