//! Which WAL segments make up the log (recovery step 2 of the module doc):
//! the ones a v3 manifest names, each of which must exist; unnamed crash
//! leftovers are removed when they cannot hold a needed record and refused
//! otherwise. Without a v3 manifest, every segment on disk.

use std::path::{Path, PathBuf};

use super::file_name;
use super::RecoveryReport;
use crate::durability::io::Vfs;
use crate::durability::manifest::{Manifest, MANIFEST};
use crate::durability::wal::{self, valid_record_after};
use crate::error::StorageError;

/// The segments of `dir`, sorted by first csn.
pub fn segments(vfs: &dyn Vfs, dir: &Path) -> Result<Vec<(u64, PathBuf)>, StorageError> {
    let names = vfs
        .list(dir)
        .map_err(|e| StorageError::io("list", dir, &e))?;
    let mut segs: Vec<(u64, PathBuf)> = names
        .iter()
        .filter_map(|n| wal::parse_segment_name(n).map(|f| (f, dir.join(n))))
        .collect();
    segs.sort();
    Ok(segs)
}

/// With no `MANIFEST`, refuse what only a manifest could explain: pinned
/// images, or a log that does not start at csn 1 (its beginning is in a
/// checkpoint the manifest named). A missing manifest is otherwise the state
/// of a database written by a build before v3 that never checkpointed, or
/// one whose manifest install a crash interrupted; then the whole log is
/// replayed, and it must reach every checkpoint file on disk (see `recover`).
pub(super) fn refuse_without_manifest(
    dir: &Path,
    names: &[String],
    on_disk: &[(u64, PathBuf)],
) -> Result<(), StorageError> {
    let path = dir.join(MANIFEST);
    if let Some(pin) = names
        .iter()
        .find(|n| n.starts_with("snap-") && n.ends_with(".ckpt"))
    {
        return Err(StorageError::Missing {
            path,
            what: format!(
                "the directory holds the durable snapshot image {pin}, which only MANIFEST can name"
            ),
        });
    }
    if let Some((first, p)) = on_disk.first() {
        if *first > 1 {
            return Err(StorageError::Missing {
                path,
                what: format!(
                    "the log starts at commit {first} ({}): the commits before it are in a checkpoint only MANIFEST can name",
                    file_name(p)
                ),
            });
        }
    }
    Ok(())
}

/// The segments that make up the log, sorted by first csn. With a v3
/// manifest: the named ones (each must exist), after removing unnamed crash
/// leftovers; otherwise every segment on disk.
pub(super) fn plan_segments(
    vfs: &dyn Vfs,
    dir: &Path,
    manifest: &Manifest,
    on_disk: Vec<(u64, PathBuf)>,
    accept_damaged_tail: bool,
    report: &mut RecoveryReport,
) -> Result<Vec<(u64, PathBuf)>, StorageError> {
    let Some(named) = &manifest.segments else {
        return Ok(on_disk);
    };
    let mut segs = Vec::with_capacity(named.len());
    for (i, first) in named.iter().enumerate() {
        let path = dir.join(wal::segment_name(*first));
        if on_disk.iter().any(|(f, _)| f == first) {
            segs.push((*first, path));
            continue;
        }
        let err = StorageError::Missing {
            path: path.clone(),
            what: "a WAL segment MANIFEST names (it may hold acknowledged writes)".into(),
        };
        if !accept_damaged_tail {
            return Err(err);
        }
        tracing::warn!(error = %err, "ending the log before the missing segment as asked (accept_damaged_tail)");
        // Later named segments cannot continue a log with a hole: drop them.
        for later in &named[i + 1..] {
            let p = dir.join(wal::segment_name(*later));
            if vfs.exists(&p) {
                vfs.remove(&p)
                    .map_err(|e| StorageError::io("remove", &p, &e))?;
                report.removed.push(p);
            }
        }
        break;
    }
    let oldest_named = named.first().copied();
    for (first, path) in on_disk {
        // History segments (kept for change streams) are not part of the log.
        if named.contains(&first) || manifest.history.contains(&first) {
            continue;
        }
        let bytes = vfs
            .read(&path)
            .map_err(|e| StorageError::io("read", &path, &e))?;
        let holds_record = valid_record_after(&bytes, 0, 1);
        let obsolete = oldest_named.is_some_and(|o| first < o);
        if holds_record && !obsolete {
            return Err(StorageError::corrupt(
                &path,
                0,
                "this WAL segment holds records but MANIFEST does not name it \
                 (a segment is named before anything is written to it): move it away \
                 if it does not belong to this database",
            ));
        }
        tracing::info!(segment = %path.display(), holds_record, "removing a WAL segment no manifest names (left by a crash during a segment roll or a cleanup)");
        vfs.remove(&path)
            .map_err(|e| StorageError::io("remove", &path, &e))?;
        report.removed.push(path);
    }
    Ok(segs)
}
