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
//! with part of a group, and never panics on file contents. Debug builds
//! assert the prefix property on the replay itself (each group starts right
//! after the previous one, csns strictly increase, the recovered csn is the
//! end of the last whole group or the checkpoint's csn); file contents reach
//! those assertions only after they were validated.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::durability::checkpoint;
use crate::durability::effect;
use crate::durability::io::Vfs;
use crate::durability::manifest::{Manifest, MANIFEST_TMP};
use crate::durability::wal::{
    self, decode_record, read_frame, valid_record_after, Record, SEGMENT_MAGIC,
};
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
    let mut state = load_base(vfs, dir, db, &manifest, &mut report)?;
    // 2. The WAL tail.
    let mut replay = Replay {
        vfs,
        dir,
        segs: segments(vfs, dir)?,
        accept_damaged_tail,
        expected: state.csn + 1,
        base_csn: state.csn,
        last_group_end: None,
    };
    replay.run(&mut state, &mut report)?;
    replay.assert_prefix(&state);
    let tmp = dir.join(MANIFEST_TMP);
    if vfs.exists(&tmp) {
        let _ = vfs.remove(&tmp);
    }
    report.csn = state.csn;
    report.elapsed = t0.elapsed();
    tracing::info!(dir = %dir.display(), "recovered: {report}");
    Ok((state, report))
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
            checkpoint::load(vfs, &path, db)
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

/// Replay of the WAL tail over the base state.
struct Replay<'a> {
    vfs: &'a dyn Vfs,
    dir: &'a Path,
    /// The segments, sorted by first csn.
    segs: Vec<(u64, PathBuf)>,
    accept_damaged_tail: bool,
    /// The csn the next replayed record must start at (the state's csn + 1).
    expected: u64,
    /// The base state's csn, and the last csn of the last group replayed.
    base_csn: u64,
    last_group_end: Option<u64>,
}

impl Replay<'_> {
    fn gap(&self, found: u64) -> StorageError {
        StorageError::Gap {
            dir: self.dir.to_path_buf(),
            expected: self.expected,
            found,
        }
    }

    /// Replay every segment from the one holding the expected csn on, until
    /// the log ends or a torn tail is cut off.
    fn run(
        &mut self,
        state: &mut DbState,
        report: &mut RecoveryReport,
    ) -> Result<(), StorageError> {
        let start = self
            .segs
            .iter()
            .rposition(|(first, _)| *first <= self.expected)
            .unwrap_or(0);
        if let Some((first, _)) = self.segs.get(start) {
            if *first > self.expected {
                return Err(self.gap(*first));
            }
        }
        for i in start..self.segs.len() {
            let first = self.segs[i].0;
            if i > start && first != self.expected {
                return Err(self.gap(first));
            }
            if !self.segment(i, state, report)? {
                break;
            }
        }
        Ok(())
    }

    /// Replay segment `i`; false when replay ends in it (a torn tail, or a
    /// segment whose creation the crash interrupted, was cut off).
    fn segment(
        &mut self,
        i: usize,
        state: &mut DbState,
        report: &mut RecoveryReport,
    ) -> Result<bool, StorageError> {
        let path = self.segs[i].1.clone();
        let buf = self
            .vfs
            .read(&path)
            .map_err(|e| StorageError::io("read", &path, &e))?;
        let headed =
            buf.len() >= SEGMENT_MAGIC.len() && &buf[..SEGMENT_MAGIC.len()] == SEGMENT_MAGIC;
        if !headed {
            // The header is synced before any record is written, so a bad
            // header over valid records is real damage; a bad header over
            // nothing valid is a segment whose creation the crash interrupted.
            let last_segment = i + 1 == self.segs.len();
            if last_segment && !valid_record_after(&buf, 0, self.expected) {
                tracing::warn!(segment = %path.display(), "removing a WAL segment torn at creation (it holds no record)");
                self.vfs
                    .remove(&path)
                    .map_err(|e| StorageError::io("remove", &path, &e))?;
                return Ok(false);
            }
            return Err(StorageError::corrupt(
                &path,
                0,
                "not a WAL segment (bad header)",
            ));
        }
        let mut pos = SEGMENT_MAGIC.len();
        loop {
            let bad = match read_frame(&buf, pos) {
                Ok(None) => return Ok(true),
                Ok(Some((payload, next))) => match decode_record(payload) {
                    Ok(rec) => {
                        self.record(rec, &path, pos, state, report)?;
                        pos = next;
                        continue;
                    }
                    Err(e) => e.0,
                },
                Err(why) => why,
            };
            self.cut_tail(i, &buf, pos, &bad, report)?;
            return Ok(false);
        }
    }

    /// Apply record `rec` (at `pos` of `path`) if it lies after the state:
    /// all its effects, then its csn — one whole group.
    fn record(
        &mut self,
        rec: Record,
        path: &Path,
        pos: usize,
        state: &mut DbState,
        report: &mut RecoveryReport,
    ) -> Result<(), StorageError> {
        if rec.lsn < self.expected {
            return Ok(()); // already in the base state
        }
        if rec.first != self.expected {
            return Err(self.gap(rec.first));
        }
        // Prefix property: this group starts right after the state, and csns
        // strictly increase (decode_record refuses a record with first > lsn).
        debug_assert_eq!(self.expected, state.csn + 1, "replay lost its place");
        debug_assert!(rec.lsn > state.csn, "csns must strictly increase");
        report.effects_replayed += rec.effects.len() as u64;
        for e in rec.effects {
            effect::apply(state, e).map_err(|why| {
                StorageError::corrupt(path, pos as u64, format!("record does not apply: {why}"))
            })?;
        }
        state.csn = rec.lsn;
        self.expected = rec.lsn + 1;
        self.last_group_end = Some(rec.lsn);
        report.records_replayed += 1;
        Ok(())
    }

    /// Damage at `pos` of segment `i` (bytes `buf`): a torn tail is cut off
    /// (with every later segment); damage with valid records after it is an
    /// error unless the caller accepts losing them.
    fn cut_tail(
        &self,
        i: usize,
        buf: &[u8],
        pos: usize,
        bad: &str,
        report: &mut RecoveryReport,
    ) -> Result<(), StorageError> {
        let path = &self.segs[i].1;
        let later = &self.segs[i + 1..];
        let later_valid = valid_record_after(buf, pos + 1, self.expected)
            || later.iter().any(|(_, p)| segment_has_record(self.vfs, p));
        if later_valid && !self.accept_damaged_tail {
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
        self.vfs
            .truncate(path, pos as u64)
            .map_err(|e| StorageError::io("truncate", path, &e))?;
        for (_, p) in later {
            self.vfs
                .remove(p)
                .map_err(|e| StorageError::io("remove", p, &e))?;
        }
        report.truncated = Some((path.clone(), pos as u64, lost));
        Ok(())
    }

    /// The recovered state is the base plus whole groups: its csn is the end
    /// of the last group replayed, or the base's when none was.
    fn assert_prefix(&self, state: &DbState) {
        debug_assert_eq!(
            state.csn,
            self.last_group_end.unwrap_or(self.base_csn),
            "recovered csn is not the end of a whole group"
        );
        debug_assert_eq!(self.expected, state.csn + 1);
    }
}

/// Whether segment `p` holds at least one valid record (unreadable: assume so,
/// which turns a questionable truncation into an error instead of a loss).
fn segment_has_record(vfs: &dyn Vfs, p: &Path) -> bool {
    match vfs.read(p) {
        Ok(b) => b.len() > SEGMENT_MAGIC.len() && valid_record_after(&b, SEGMENT_MAGIC.len(), 1),
        Err(_) => true,
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use bson::rawdoc;

    use super::*;
    use crate::durability::effect::Effect;
    use crate::durability::io::SimFs;
    use crate::durability::wal::{SyncMode, Wal};

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
        let wal = Wal::start(vfs.clone(), dir, 1, 1 << 20, true, true).expect("wal");
        wal.append(1, 3, &[put(1), put(2), put(3)], SyncMode::Now)
            .expect("group 1..=3");
        wal.append(4, 5, &[put(4), put(5)], SyncMode::Now)
            .expect("group 4..=5");
        drop(wal);
        let (state, report) = recover(&*vfs, dir, "db", false).expect("recover");
        assert_eq!((state.csn, report.records_replayed), (5, 2));
        assert_eq!(state.collection("c").map(|c| c.len()), Some(5));
    }
}
