//! Replay of the WAL over the base state (recovery steps 3–6 of the module
//! doc): records in order with no gap, named segments end to end, and the
//! decision at damage — cut as a torn write only when nothing vouches for the
//! record, else an error naming the file and offset.

use std::path::{Path, PathBuf};

use super::{file_name, RecoveryReport, Requirement, Truncation};
use crate::durability::effect;
use crate::durability::io::Vfs;
use crate::durability::wal::{
    decode_record, read_frame, valid_record_after, Record, SEGMENT_MAGIC,
};
use crate::error::StorageError;
use crate::store::DbState;

/// Replay of the WAL tail over the base state.
pub(super) struct Replay<'a> {
    vfs: &'a dyn Vfs,
    /// The segments of the log, sorted by first csn.
    segs: Vec<(u64, PathBuf)>,
    /// The manifest names the segments (v3): each exists and ends where the
    /// next begins, and a bad header is damage, not an interrupted creation.
    tracked: bool,
    accept_damaged_tail: bool,
    /// The csn the log must reach, if anything vouches for one.
    required: Option<Requirement>,
    /// The csn the next replayed record must start at (the state's csn + 1).
    expected: u64,
    /// The base state's csn, and the last csn of the last group replayed.
    base_csn: u64,
    last_group_end: Option<u64>,
    /// Why recovery fell back to the previous checkpoint, for error messages.
    fell_back: Option<String>,
    /// Each segment read: (first csn, bytes after any cut, lsn of its last
    /// whole record).
    lens: Vec<(u64, u64, Option<u64>)>,
}

impl<'a> Replay<'a> {
    /// A replay of `segs` onto a base state at `base_csn`.
    pub(super) fn new(
        vfs: &'a dyn Vfs,
        segs: Vec<(u64, PathBuf)>,
        tracked: bool,
        accept_damaged_tail: bool,
        required: Option<Requirement>,
        base_csn: u64,
        fell_back: Option<String>,
    ) -> Replay<'a> {
        Replay {
            vfs,
            segs,
            tracked,
            accept_damaged_tail,
            required,
            expected: base_csn + 1,
            base_csn,
            last_group_end: None,
            fell_back,
            lens: Vec::new(),
        }
    }

    /// The segments of the log after replay (cut or removed ones gone).
    pub(super) fn segments(&self) -> &[(u64, PathBuf)] {
        &self.segs
    }

    /// The bytes segment `first` holds after replay and the lsn of its last
    /// record, if replay read it.
    pub(super) fn end_of(&self, first: u64) -> Option<(u64, Option<u64>)> {
        self.lens
            .iter()
            .rev()
            .find(|l| l.0 == first)
            .map(|l| (l.1, l.2))
    }

    /// The segment replay ended in (the last one), if any.
    pub(super) fn end_segment(&self) -> Option<PathBuf> {
        self.segs.last().map(|s| s.1.clone())
    }

    fn context(&self) -> String {
        match &self.fell_back {
            Some(why) => format!(" (recovery fell back to the previous checkpoint: {why})"),
            None => String::new(),
        }
    }

    /// Replay every segment from the one holding the expected csn on, until
    /// the log ends or a torn tail is cut off.
    pub(super) fn run(
        &mut self,
        state: &mut DbState,
        report: &mut RecoveryReport,
    ) -> Result<(), StorageError> {
        let start = self
            .segs
            .iter()
            .rposition(|(first, _)| *first <= self.expected)
            .unwrap_or(0);
        if let Some((first, path)) = self.segs.get(start) {
            if *first > self.expected {
                return Err(StorageError::corrupt(
                    path,
                    0,
                    format!(
                        "the log starts at commit {first} in this segment, but the state it \
                         continues ends at commit {}: the segment with the commits between \
                         is missing{}",
                        self.expected - 1,
                        self.context()
                    ),
                ));
            }
        }
        let mut i = start;
        while i < self.segs.len() {
            let first = self.segs[i].0;
            if i > start && first != self.expected {
                let (prev, this) = (&self.segs[i - 1].1, &self.segs[i].1);
                return Err(if first > self.expected {
                    StorageError::corrupt(
                        prev,
                        0,
                        format!(
                            "this WAL segment ends at commit {}, but the next segment {} starts \
                             at commit {first}: it is truncated or damaged, or a segment between \
                             them is missing",
                            self.expected - 1,
                            file_name(this)
                        ),
                    )
                } else {
                    StorageError::corrupt(
                        this,
                        0,
                        format!(
                            "this WAL segment starts at commit {first}, inside the previous \
                             segment {} (which ends at commit {})",
                            file_name(prev),
                            self.expected - 1
                        ),
                    )
                });
            }
            if !self.segment(i, state, report)? {
                break;
            }
            i += 1;
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
            return self.bad_header(i, &buf, report);
        }
        let mut pos = SEGMENT_MAGIC.len();
        let mut last = None;
        loop {
            let bad = match read_frame(&buf, pos) {
                Ok(None) => {
                    self.lens.push((self.segs[i].0, buf.len() as u64, last));
                    return Ok(true);
                }
                Ok(Some((payload, next))) => match decode_record(payload) {
                    Ok(rec) => {
                        last = Some(rec.lsn);
                        self.record(rec, &path, pos, state, report)?;
                        pos = next;
                        continue;
                    }
                    Err(e) => e.0,
                },
                Err(why) => why,
            };
            self.cut_tail(i, &buf, pos, &bad, report)?;
            self.lens.push((self.segs[i].0, pos as u64, last));
            return Ok(false);
        }
    }

    /// Segment `i` does not start with the segment magic.
    fn bad_header(
        &mut self,
        i: usize,
        buf: &[u8],
        report: &mut RecoveryReport,
    ) -> Result<bool, StorageError> {
        let path = self.segs[i].1.clone();
        let last_segment = i + 1 == self.segs.len();
        if !self.tracked {
            // Before v3 a segment was used without being named: a bad header
            // over nothing valid, in the last segment, is a creation the
            // crash interrupted. Over valid records it is damage.
            if last_segment && !valid_record_after(buf, 0, self.expected) {
                tracing::warn!(segment = %path.display(), "removing a WAL segment torn at creation (it holds no record)");
                self.vfs
                    .remove(&path)
                    .map_err(|e| StorageError::io("remove", &path, &e))?;
                self.segs.truncate(i);
                report.removed.push(path);
                return Ok(false);
            }
            return Err(StorageError::corrupt(
                &path,
                0,
                "not a WAL segment (bad header)",
            ));
        }
        let err = StorageError::corrupt(
            &path,
            0,
            "not a WAL segment (bad header), yet MANIFEST names it (a segment is named only after its header was synced): the file is damaged",
        );
        if !self.accept_damaged_tail {
            return Err(err);
        }
        tracing::warn!(error = %err, "ending the log before the damaged segment as asked (accept_damaged_tail)");
        for (_, p) in self.segs.drain(i..) {
            self.vfs
                .remove(&p)
                .map_err(|e| StorageError::io("remove", &p, &e))?;
            report.removed.push(p);
        }
        Ok(false)
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
            return Err(StorageError::corrupt(
                path,
                pos as u64,
                format!(
                    "the record here holds commits {}..={}, but the log must continue at commit {}{}",
                    rec.first,
                    rec.lsn,
                    self.expected,
                    self.context()
                ),
            ));
        }
        // Prefix property: this group starts right after the state, and csns
        // strictly increase (decode_record refuses a record with first > lsn).
        debug_assert_eq!(self.expected, state.csn + 1, "replay lost its place");
        debug_assert!(rec.lsn > state.csn, "csns must strictly increase");
        report.effects_replayed += rec.effects.len() as u64;
        effect::apply_all(state, rec.effects).map_err(|why| {
            StorageError::corrupt(path, pos as u64, format!("record does not apply: {why}"))
        })?;
        state.csn = rec.lsn;
        state.ts = state.ts.max(rec.ts);
        self.expected = rec.lsn + 1;
        self.last_group_end = Some(rec.lsn);
        report.records_replayed += 1;
        Ok(())
    }

    /// Damage at `pos` of segment `i` (bytes `buf`). When nothing vouches for
    /// the record there it is cut off as a torn write (with every later
    /// segment); otherwise it is an error unless the caller accepts the loss.
    fn cut_tail(
        &mut self,
        i: usize,
        buf: &[u8],
        pos: usize,
        bad: &str,
        report: &mut RecoveryReport,
    ) -> Result<(), StorageError> {
        let path = self.segs[i].1.clone();
        let later = &self.segs[i + 1..];
        let later_valid = valid_record_after(buf, pos + 1, self.expected)
            || later.iter().any(|(_, p)| segment_has_record(self.vfs, p));
        let vouched = self
            .required
            .as_ref()
            .filter(|r| r.csn >= self.expected)
            .map(|r| format!("{} (commits through {})", r.why, r.csn));
        let refusal = if later_valid {
            Some("valid records follow: the log is damaged in the middle".to_string())
        } else {
            vouched.map(|v| format!("this is damage, not a torn write: {v}"))
        };
        if let Some(why) = refusal {
            let err = StorageError::corrupt(
                &path,
                pos as u64,
                format!(
                    "damaged WAL record ({bad}) holding commits from {} on; {why}",
                    self.expected
                ),
            );
            if !self.accept_damaged_tail {
                return Err(err);
            }
            tracing::warn!(error = %err, "cutting the log at the damage as asked (accept_damaged_tail)");
        }
        let lost = (buf.len() - pos) as u64;
        tracing::warn!(
            segment = %path.display(), offset = pos, first_csn = self.expected,
            lost_bytes = lost, reason = %bad,
            "the WAL ends in a damaged or incomplete record: discarding it. A write torn by a \
             crash and damage to the file look the same here; if this group was acknowledged \
             as durable, it is lost"
        );
        self.vfs
            .truncate(&path, pos as u64)
            .map_err(|e| StorageError::io("truncate", &path, &e))?;
        for (_, p) in self.segs.drain(i + 1..) {
            self.vfs
                .remove(&p)
                .map_err(|e| StorageError::io("remove", &p, &e))?;
            report.removed.push(p);
        }
        report.truncated = Some(Truncation {
            segment: path,
            offset: pos as u64,
            bytes: lost,
            first_csn: self.expected,
        });
        Ok(())
    }

    /// The recovered state is the base plus whole groups: its csn is the end
    /// of the last group replayed, or the base's when none was.
    pub(super) fn assert_prefix(&self, state: &DbState) {
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
