//! Recovery: rebuild the committed state of a data directory — the newest
//! valid checkpoint the manifest names, then the WAL records after it.
//!
//! Decisions, in order:
//! 1. the manifest names the current and previous checkpoint; the current one
//!    is loaded, and if it is missing or corrupt the previous one (the WAL is
//!    kept back to it for exactly this); if neither loads, a clear error names
//!    both files;
//! 2. WAL records after the checkpoint's csn are replayed in order; each must
//!    start at the csn after the previous one (a gap is an error, never a
//!    silently shorter history);
//! 3. a record that fails its checksum or structure ends replay *only if
//!    nothing valid follows it* (a torn tail: the crash interrupted the last
//!    append). The segment is cut there and the loss logged. If a valid
//!    record follows — in the same segment or a later one — the damage is in
//!    the middle of the log and recovery fails with a corruption error: data
//!    acknowledged after the damage would otherwise silently vanish.
//!
//! Invariant: recovery either returns the state after some commit prefix
//! that contains every synced record, or an error; it never returns a state
//! with part of a group, and never panics on file contents.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use super::checkpoint;
use super::effect;
use super::io::Vfs;
use super::manifest::{Manifest, MANIFEST_TMP};
use super::wal::{self, decode_record, read_frame, valid_record_after, SEGMENT_MAGIC};
use crate::error::StorageError;
use crate::store::DbState;

/// What recovery found and did (logged, and kept on the database).
#[derive(Debug, Clone, Default)]
pub struct RecoveryReport {
    /// The checkpoint loaded, with its csn.
    pub checkpoint: Option<(u64, PathBuf)>,
    /// The current checkpoint failed to load and the previous one was used.
    pub fell_back: Option<String>,
    pub records_replayed: u64,
    pub effects_replayed: u64,
    /// A torn tail cut off: (segment, offset, bytes dropped).
    pub truncated: Option<(PathBuf, u64, u64)>,
    /// csn of the recovered state.
    pub csn: u64,
    pub elapsed: Duration,
    pub manifest: Manifest,
}

impl std::fmt::Display for RecoveryReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.checkpoint {
            Some((csn, p)) => write!(f, "checkpoint csn {csn} ({})", p.display())?,
            None => write!(f, "no checkpoint")?,
        }
        write!(
            f,
            " + {} WAL records ({} effects) → csn {} in {:.1?}",
            self.records_replayed, self.effects_replayed, self.csn, self.elapsed
        )?;
        if let Some(why) = &self.fell_back {
            write!(f, "; fell back to the previous checkpoint: {why}")?;
        }
        if let Some((p, off, n)) = &self.truncated {
            write!(
                f,
                "; torn tail cut: {n} bytes at {} byte {off}",
                p.display()
            )?;
        }
        Ok(())
    }
}

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

/// Recover the state of database `db` kept in `dir`.
pub fn recover(
    vfs: &dyn Vfs,
    dir: &Path,
    db: &str,
    accept_damaged_tail: bool,
) -> Result<(DbState, RecoveryReport), StorageError> {
    let t0 = Instant::now();
    let mut report = RecoveryReport::default();
    let manifest = Manifest::load(vfs, dir)?;
    report.manifest = manifest.clone();

    // 1. The base state.
    let mut state = DbState {
        db: std::sync::Arc::from(db),
        ..Default::default()
    };
    let mut failures: Vec<String> = Vec::new();
    for csn in [manifest.current, manifest.previous] {
        if csn == 0 {
            continue;
        }
        let path = dir.join(checkpoint::checkpoint_name(csn));
        let loaded = if vfs.exists(&path) {
            checkpoint::load(vfs, &path, db)
        } else {
            Err(StorageError::Missing {
                path: path.clone(),
                what: "named by MANIFEST".into(),
            })
        };
        match loaded {
            Ok(s) if s.csn == csn => {
                state = s;
                report.checkpoint = Some((csn, path));
                break;
            }
            Ok(s) => failures.push(format!(
                "{} holds csn {} instead of {csn}",
                path.display(),
                s.csn
            )),
            Err(e) => {
                tracing::warn!(error = %e, "checkpoint unusable");
                failures.push(e.to_string());
            }
        }
    }
    // With no previous checkpoint the WAL is kept back to csn 0 (manifest
    // invariant), so the empty state is the fallback base.
    if report.checkpoint.is_none() && manifest.current != 0 && manifest.previous != 0 {
        return Err(StorageError::Corrupt {
            path: dir.join(checkpoint::checkpoint_name(manifest.current)),
            offset: 0,
            what: format!("no usable checkpoint: {}", failures.join("; ")),
        });
    }
    if !failures.is_empty() {
        report.fell_back = Some(failures.join("; "));
    }

    // 2. The WAL tail.
    let segs = segments(vfs, dir)?;
    let mut expected = state.csn + 1;
    let start = segs
        .iter()
        .rposition(|(first, _)| *first <= expected)
        .unwrap_or(0);
    if let Some((first, _)) = segs.get(start) {
        if *first > expected {
            return Err(StorageError::Gap {
                dir: dir.to_path_buf(),
                expected,
                found: *first,
            });
        }
    }
    let mut i = start;
    while i < segs.len() {
        let (first, path) = &segs[i];
        let last_segment = i + 1 == segs.len();
        if i > start && *first != expected {
            return Err(StorageError::Gap {
                dir: dir.to_path_buf(),
                expected,
                found: *first,
            });
        }
        let buf = vfs
            .read(path)
            .map_err(|e| StorageError::io("read", path, &e))?;
        let headed =
            buf.len() >= SEGMENT_MAGIC.len() && &buf[..SEGMENT_MAGIC.len()] == SEGMENT_MAGIC;
        if !headed {
            // The header is synced before any record is written, so a bad
            // header over valid records is real damage; a bad header over
            // nothing valid is a segment whose creation the crash interrupted.
            if last_segment && !valid_record_after(&buf, 0, expected) {
                tracing::warn!(segment = %path.display(), "removing a WAL segment torn at creation (it holds no record)");
                vfs.remove(path)
                    .map_err(|e| StorageError::io("remove", path, &e))?;
                break;
            }
            return Err(StorageError::corrupt(
                path,
                0,
                "not a WAL segment (bad header)",
            ));
        }
        let mut pos = SEGMENT_MAGIC.len();
        loop {
            let bad = match read_frame(&buf, pos) {
                Ok(None) => break,
                Ok(Some((payload, next))) => match decode_record(payload) {
                    Ok(rec) => {
                        if rec.lsn >= expected {
                            if rec.first != expected {
                                return Err(StorageError::Gap {
                                    dir: dir.to_path_buf(),
                                    expected,
                                    found: rec.first,
                                });
                            }
                            report.effects_replayed += rec.effects.len() as u64;
                            for e in rec.effects {
                                effect::apply(&mut state, e).map_err(|why| {
                                    StorageError::corrupt(
                                        path,
                                        pos as u64,
                                        format!("record does not apply: {why}"),
                                    )
                                })?;
                            }
                            state.csn = rec.lsn;
                            expected = rec.lsn + 1;
                            report.records_replayed += 1;
                        }
                        pos = next;
                        continue;
                    }
                    Err(e) => e.0,
                },
                Err(why) => why,
            };
            // Damage at `pos`: a torn tail, or corruption in the middle?
            let later_valid = valid_record_after(&buf, pos + 1, expected)
                || segs[i + 1..]
                    .iter()
                    .any(|(_, p)| segment_has_record(vfs, p));
            if later_valid && !accept_damaged_tail {
                return Err(StorageError::corrupt(
                    path,
                    pos as u64,
                    format!("{bad}, and valid records follow: the log is damaged in the middle"),
                ));
            }
            if later_valid {
                tracing::warn!(segment = %path.display(), offset = pos, "damage with valid records after it: cutting the log there as asked (accept_damaged_tail)");
            }
            let lost = (buf.len() - pos) as u64;
            tracing::warn!(
                segment = %path.display(), offset = pos, lost_bytes = lost, reason = %bad,
                "WAL ends in a torn record: cutting it off (it was never acknowledged as durable)"
            );
            vfs.truncate(path, pos as u64)
                .map_err(|e| StorageError::io("truncate", path, &e))?;
            for (_, p) in &segs[i + 1..] {
                vfs.remove(p)
                    .map_err(|e| StorageError::io("remove", p, &e))?;
            }
            report.truncated = Some((path.clone(), pos as u64, lost));
            i = segs.len();
            break;
        }
        i += 1;
    }
    let tmp = dir.join(MANIFEST_TMP);
    if vfs.exists(&tmp) {
        let _ = vfs.remove(&tmp);
    }
    report.csn = state.csn;
    report.elapsed = t0.elapsed();
    tracing::info!(dir = %dir.display(), "recovered: {report}");
    Ok((state, report))
}

/// Whether segment `p` holds at least one valid record (unreadable: assume so,
/// which turns a questionable truncation into an error instead of a loss).
fn segment_has_record(vfs: &dyn Vfs, p: &Path) -> bool {
    match vfs.read(p) {
        Ok(b) => b.len() > SEGMENT_MAGIC.len() && valid_record_after(&b, SEGMENT_MAGIC.len(), 1),
        Err(_) => true,
    }
}
