//! Recovery: rebuild the committed state of a data directory — the newest
//! valid checkpoint the manifest names, then the WAL records after it — or
//! refuse with an error naming the file that is missing or damaged.
//!
//! Decisions, in order:
//! 1. the manifest names the current and previous checkpoint; the current one
//!    is loaded, and if it is missing or corrupt the previous one (the WAL is
//!    kept back to it for exactly this); if neither loads, a clear error names
//!    both files. After such a fallback the log must still reach the current
//!    checkpoint's csn, or recovery refuses (naming it) instead of returning
//!    an older state;
//! 2. which segments make up the log: a v3 manifest names them. A named
//!    segment that is missing is an error naming it. A segment on disk the
//!    manifest does not name is left over from a crash inside a protocol
//!    step: if it holds no record (a roll whose manifest install never
//!    happened) or only records older than every named segment (a cleanup
//!    that un-named it but had not deleted it yet) it is removed (logged);
//!    if it holds records the log may need, recovery refuses, naming it.
//!    Without a v3 manifest (v1/v2, or none) every segment on disk counts;
//! 3. WAL records after the checkpoint's csn are replayed in order; each must
//!    start at the csn after the previous one, and each named segment must
//!    end exactly where the next named one starts — otherwise an error names
//!    the segment that ends early (truncated or damaged), never a silently
//!    shorter history;
//! 4. a record that fails its checksum or structure ends replay *only if
//!    nothing says it was durable*: no valid record follows it (in this
//!    segment or a later one), no later segment is named, and the manifest's
//!    `synced_lsn` (raised at checkpoints, rotations and every clean close)
//!    lies before it. Then it is treated as a write torn by a crash: cut off
//!    and reported with its file, offset and first csn. A torn write and
//!    damage to the last record written since the manifest was last
//!    installed look the same on disk; the warning says so, and that if the
//!    group was acknowledged it is lost. Otherwise recovery fails with an
//!    error naming the file and offset;
//! 5. the recovered log must reach every csn something durable vouches for:
//!    the manifest's `synced_lsn`, the current checkpoint after a fallback,
//!    and — when `MANIFEST` itself is missing — every checkpoint file on disk
//!    (a missing manifest with pinned images, or a log that does not start at
//!    csn 1, is refused outright: only the manifest can say what is current).
//!
//! `accept_damaged_tail` (an operator's explicit choice) turns the refusals
//! of 3–5 into warnings: the log is cut at the first damage or missing
//! segment, and the prefix before it is recovered.
//!
//! Invariant: recovery either returns the state after some commit prefix
//! that contains every synced record, or an error; it never returns a state
//! with part of a group, and never panics on file contents. Debug builds
//! assert the prefix property on the replay itself (each group starts right
//! after the previous one, csns strictly increase, the recovered csn is the
//! end of the last whole group or the checkpoint's csn); file contents reach
//! those assertions only after they were validated. What recovery replayed is
//! synced before it returns (the last segment is fsynced), so a later open
//! may rely on it.

mod replay;
mod segments;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::durability::checkpoint;
use crate::durability::io::Vfs;
use crate::durability::manifest::{Manifest, MANIFEST, MANIFEST_TMP};
use crate::error::StorageError;
use crate::store::DbState;
use replay::Replay;
pub use segments::segments;
use segments::{plan_segments, refuse_without_manifest};

/// A damaged or incomplete record at the end of the log that recovery cut off.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Truncation {
    pub segment: PathBuf,
    /// Where the cut record started.
    pub offset: u64,
    /// Bytes dropped.
    pub bytes: u64,
    /// The first csn the cut record would have held.
    pub first_csn: u64,
}

/// What recovery found and did (logged, and kept on the database).
#[derive(Debug, Clone, Default)]
pub struct RecoveryReport {
    /// The checkpoint loaded, with its csn.
    pub checkpoint: Option<(u64, PathBuf)>,
    /// The current checkpoint failed to load and the previous one was used.
    pub fell_back: Option<String>,
    pub records_replayed: u64,
    pub effects_replayed: u64,
    /// A torn or damaged last record cut off.
    pub truncated: Option<Truncation>,
    /// Segment files removed because no manifest named them (crash leftovers).
    pub removed: Vec<PathBuf>,
    /// csn of the recovered state.
    pub csn: u64,
    pub elapsed: Duration,
    /// Where `elapsed` went.
    pub phases: RecoveryPhases,
    /// The manifest as found (the default when there was none).
    pub manifest: Manifest,
    /// The checkpoint files (csns, ascending) the loaded checkpoint needs:
    /// its own, and a chained one's older files.
    pub checkpoint_files: Vec<u64>,
}

/// Recovery's phases: loading the checkpoint used (its own split) and
/// replaying the WAL after it. Failed candidates (a fallback) are not in it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RecoveryPhases {
    pub checkpoint: checkpoint::LoadTimes,
    pub replay: Duration,
}

impl std::fmt::Display for RecoveryPhases {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let c = &self.checkpoint;
        write!(
            f,
            "read {:.1?}, frames {:.1?}, decode {:.1?}, build {:.1?}, replay {:.1?}",
            c.read, c.frames, c.decode, c.build, self.replay
        )
    }
}

impl std::fmt::Display for RecoveryReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.checkpoint {
            Some((csn, p)) => write!(f, "checkpoint csn {csn} ({})", p.display())?,
            None => write!(f, "no checkpoint")?,
        }
        write!(
            f,
            " + {} WAL records ({} effects) → csn {} in {:.1?} ({})",
            self.records_replayed, self.effects_replayed, self.csn, self.elapsed, self.phases
        )?;
        if let Some(why) = &self.fell_back {
            write!(f, "; fell back to the previous checkpoint: {why}")?;
        }
        if let Some(t) = &self.truncated {
            write!(
                f,
                "; damaged or torn last record cut: {} bytes at {} byte {} (commits from {} on)",
                t.bytes,
                t.segment.display(),
                t.offset,
                t.first_csn
            )?;
        }
        for p in &self.removed {
            write!(f, "; removed unnamed segment {}", p.display())?;
        }
        Ok(())
    }
}

/// The outcome of [`recover`]: the state and what the next manifest must say.
#[derive(Debug)]
pub struct Recovered {
    pub state: DbState,
    pub report: RecoveryReport,
    /// First csns of the segments that make up the recovered log, ascending.
    pub segments: Vec<u64>,
    /// The last of them, `(first csn, length)`, when the log can continue at
    /// its end: replay read it (and cut any torn tail), its records end
    /// exactly at the recovered csn (or it holds none and starts right
    /// after), and it is synced.
    pub tail: Option<(u64, u64)>,
}

/// A csn the recovered log must reach, with the file to name if it does not.
#[derive(Debug, Clone)]
pub(super) struct Requirement {
    csn: u64,
    path: PathBuf,
    why: String,
}

impl Requirement {
    pub(super) fn error(&self, ends_at: u64, at: &Path) -> StorageError {
        StorageError::corrupt(
            &self.path,
            0,
            format!(
                "the log ends at commit {ends_at} (in {}), but {} (commits through {}): \
                 acknowledged writes would be lost",
                at.display(),
                self.why,
                self.csn
            ),
        )
    }
}

/// Recover the state of database `db` kept in `dir`.
pub fn recover(
    vfs: &dyn Vfs,
    dir: &Path,
    db: &str,
    accept_damaged_tail: bool,
) -> Result<Recovered, StorageError> {
    let t0 = Instant::now();
    let mut report = RecoveryReport::default();
    let found = Manifest::load(vfs, dir)?;
    let manifest = found.clone().unwrap_or_default();
    report.manifest = manifest.clone();
    let on_disk = segments(vfs, dir)?;
    let names = vfs
        .list(dir)
        .map_err(|e| StorageError::io("list", dir, &e))?;
    if found.is_none() {
        refuse_without_manifest(dir, &names, &on_disk)?;
    }
    // 1. The base state.
    let mut state = load_base(vfs, dir, db, &manifest, &mut report)?;
    // 2. The segments of the log.
    let segs = plan_segments(
        vfs,
        dir,
        &manifest,
        on_disk,
        accept_damaged_tail,
        &mut report,
    )?;
    // What the log must reach.
    let mut required = Vec::new();
    if manifest.synced_lsn > 0 {
        let at = segs.last().map_or(dir.join(MANIFEST), |s| s.1.clone());
        required.push(Requirement {
            csn: manifest.synced_lsn,
            path: at,
            why: "MANIFEST records them as synced".into(),
        });
    }
    if manifest.segments.is_some() {
        if let [.., (_, prev), (last, next)] = segs.as_slice() {
            required.push(Requirement {
                csn: last - 1,
                path: prev.clone(),
                why: format!("the next segment {} starts after them", file_name(next)),
            });
        }
    }
    if let Some(why) = &report.fell_back {
        required.push(Requirement {
            csn: manifest.current,
            path: dir.join(checkpoint::checkpoint_name(manifest.current)),
            why: format!("the current checkpoint holds them and could not be used ({why})"),
        });
    }
    if found.is_none() {
        if let Some(csn) = names
            .iter()
            .filter_map(|n| checkpoint::parse_checkpoint_name(n))
            .max()
        {
            required.push(Requirement {
                csn,
                path: dir.join(MANIFEST),
                why: format!(
                    "MANIFEST is missing and {} holds them",
                    checkpoint::checkpoint_name(csn)
                ),
            });
        }
    }
    let required = required.into_iter().max_by_key(|r| r.csn);
    // 3–4. Replay the WAL tail.
    let mut replay = Replay::new(
        vfs,
        segs,
        manifest.segments.is_some(),
        accept_damaged_tail,
        required.clone(),
        state.csn,
        report.fell_back.clone(),
    );
    let t_replay = Instant::now();
    let replayed = replay.run(&mut state, &mut report);
    report.phases.replay = t_replay.elapsed();
    let replayed = match (replayed, found.is_none()) {
        (Err(e), true) => Err(StorageError::Missing {
            path: dir.join(MANIFEST),
            what: format!("the log alone cannot be recovered without it: {e}"),
        }),
        (r, _) => r,
    };
    replayed?;
    replay.assert_prefix(&state);
    // 5. The log must reach what durable files vouch for.
    if let Some(req) = &required {
        if state.csn < req.csn {
            let at = replay.end_segment().unwrap_or_else(|| dir.join(MANIFEST));
            let err = if found.is_none() {
                StorageError::Missing {
                    path: dir.join(MANIFEST),
                    what: format!(
                        "the log ends at commit {} (in {}), but {} (commits through {})",
                        state.csn,
                        at.display(),
                        req.why,
                        req.csn
                    ),
                }
            } else {
                req.error(state.csn, &at)
            };
            if !accept_damaged_tail {
                return Err(err);
            }
            tracing::warn!(error = %err, "recovering the shorter log as asked (accept_damaged_tail)");
        }
    }
    // What was replayed must be durable before anything builds on it (a
    // `batch` writer's records may still sit unsynced in the page cache).
    let tail = match replay.segments().last() {
        Some((first, path)) => {
            let f = vfs
                .open_append(path)
                .map_err(|e| StorageError::io("open", path, &e))?;
            f.sync().map_err(|e| StorageError::io("fsync", path, &e))?;
            replay
                .end_of(*first)
                .filter(|(_, last)| match last {
                    Some(lsn) => *lsn == state.csn,
                    None => *first == state.csn + 1,
                })
                .map(|(len, _)| (*first, len))
        }
        None => None,
    };
    let tmp = dir.join(MANIFEST_TMP);
    if vfs.exists(&tmp) {
        let _ = vfs.remove(&tmp);
    }
    report.csn = state.csn;
    report.elapsed = t0.elapsed();
    tracing::info!(dir = %dir.display(), "recovered: {report}");
    Ok(Recovered {
        state,
        report,
        segments: replay.segments().iter().map(|s| s.0).collect(),
        tail,
    })
}

pub(super) fn file_name(p: &Path) -> String {
    p.file_name().map_or_else(
        || p.display().to_string(),
        |n| n.to_string_lossy().into_owned(),
    )
}

/// The base state: the current checkpoint the manifest names, else the
/// previous one (noted in `report.fell_back`), else — when the manifest
/// names no previous checkpoint — the empty state.
fn load_base(
    vfs: &dyn Vfs,
    dir: &Path,
    db: &str,
    manifest: &Manifest,
    report: &mut RecoveryReport,
) -> Result<DbState, StorageError> {
    let mut failures: Vec<String> = Vec::new();
    for csn in [manifest.current, manifest.previous] {
        if csn == 0 {
            continue;
        }
        let path = dir.join(checkpoint::checkpoint_name(csn));
        let loaded = if vfs.exists(&path) {
            checkpoint::load_with_files(vfs, &path, db).map(|(state, times, files)| {
                report.phases.checkpoint = times;
                report.checkpoint_files = files;
                state
            })
        } else {
            Err(StorageError::Missing {
                path: path.clone(),
                what: "named by MANIFEST".into(),
            })
        };
        match loaded {
            Ok(s) if s.csn == csn => {
                report.checkpoint = Some((csn, path));
                if !failures.is_empty() {
                    report.fell_back = Some(failures.join("; "));
                } else if manifest.previous != 0 {
                    let prev = dir.join(checkpoint::checkpoint_name(manifest.previous));
                    if !vfs.exists(&prev) {
                        tracing::warn!(checkpoint = %prev.display(), "the previous checkpoint MANIFEST names is missing: the current one has no fallback until the next checkpoint");
                    }
                }
                return Ok(s);
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
    if manifest.current != 0 && manifest.previous != 0 {
        return Err(StorageError::Corrupt {
            path: dir.join(checkpoint::checkpoint_name(manifest.current)),
            offset: 0,
            what: format!("no usable checkpoint: {}", failures.join("; ")),
        });
    }
    if !failures.is_empty() {
        report.fell_back = Some(failures.join("; "));
    }
    Ok(DbState {
        db: std::sync::Arc::from(db),
        ..Default::default()
    })
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use bson::rawdoc;

    use super::*;
    use crate::durability::effect::Effect;
    use crate::durability::io::SimFs;
    use crate::durability::manifest::ManifestStore;
    use crate::durability::wal::{SyncMode, Wal, WalOptions};

    fn put(id: i32) -> Effect {
        Effect::Put {
            coll: "c".into(),
            doc: Arc::new(rawdoc! {"_id": id}),
        }
    }

    /// Groups of several commits (csns 1..=3, then 4..=5) replay whole: the
    /// recovered csn is the end of the last group, never inside one.
    #[test]
    fn multi_commit_groups_recover_to_their_end() {
        let vfs = Arc::new(SimFs::new());
        let dir = Path::new("/db");
        vfs.create_dir_all(dir).expect("dir");
        let opts = WalOptions {
            segment_bytes: 1 << 20,
            skip_fsync: true,
            skip_dir_fsync: true,
        };
        let store = Arc::new(ManifestStore::new(
            vfs.clone(),
            dir,
            true,
            Manifest::default(),
        ));
        let wal = Wal::start(vfs.clone(), dir, 1, opts, store.clone()).expect("wal");
        store
            .update(|m| m.segments = Some(vec![1]))
            .expect("name the segment");
        wal.append(
            1,
            3,
            Default::default(),
            &[put(1), put(2), put(3)],
            SyncMode::Now,
        )
        .expect("group 1..=3");
        wal.append(4, 5, Default::default(), &[put(4), put(5)], SyncMode::Now)
            .expect("group 4..=5");
        drop(wal);
        let r = recover(&*vfs, dir, "db", false).expect("recover");
        assert_eq!((r.state.csn, r.report.records_replayed), (5, 2));
        assert_eq!(r.state.collection("c").map(|c| c.len()), Some(5));
        assert_eq!(r.segments, vec![1]);
    }
}
