//! Which retryable writes and transaction commits the replica set applied:
//! every member records the origin tags (`txnNumber` + `lsid`, see
//! `Database::with_origin` and `Transaction::tag`) of each group entry it
//! applies, so a driver retrying a write — or a `commitTransaction` — on a
//! new primary after a failover is answered "done" instead of running the
//! write twice (or failing a commit that happened).
//!
//! Bounded: the newest [`MAX_RETRIES`] tags are kept (MongoDB keeps them as
//! long as the session lives).
//!
//! **Durable, and carried by Raft snapshots.** The table is part of the
//! state machine: a member that restarts must know the tags of the entries
//! it applied before, and one that caught up from a Raft snapshot those of
//! the entries the snapshot holds (their log was purged, so it never
//! applies them). Hence:
//! - `repl.raft/retries`, frames `len u32 | crc32c u32 | tag` (the Raft
//!   log's framing), appended **before** the entry's group is applied (the
//!   state machine has decided it applies: it continues its database's
//!   log), synced when the group carries tags. Write-ahead, because after a
//!   crash the member cannot tell a group its databases already hold from
//!   one every member skipped (both fail the `first == csn + 1` check when
//!   the log is replayed from a lagging `applied`): tags written after the
//!   apply would be lost in that window. A tag on file whose group a crash
//!   cut off before it was applied is harmless: the entry is committed and
//!   was decided "applies", so the replay applies it (and a primary takes
//!   writes only after draining the log). A torn last frame is cut at open.
//!   When the file holds twice [`MAX_RETRIES`] frames it is rewritten with
//!   the table's tags (tmp, sync, rename, directory sync).
//! - a Raft snapshot carries the table as of its log position
//!   (`snapshot.rs`); installing one replaces the table and the file.
//!
//! Invariant: every tag in memory is on file (in the current file or a
//! rewritten one), and every tag on file belongs to a committed entry that
//! applies on this member.

use std::collections::{HashSet, VecDeque};
use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};

use parking_lot::Mutex;

use crate::log_store::{frame, frames, write_atomic};

/// Most origin tags remembered.
pub const MAX_RETRIES: usize = 100_000;
/// Longest tag accepted from a file or a snapshot (a tag is 8 bytes of
/// `txnNumber` and a session id of a few dozen bytes).
pub const MAX_TAG: usize = 4096;
/// The table's file in `repl.raft/`.
pub const RETRIES_FILE: &str = "retries";

/// The tags and their order of arrival (oldest first, evicted first).
#[derive(Default)]
struct Table {
    set: HashSet<Vec<u8>>,
    order: VecDeque<Vec<u8>>,
}

impl Table {
    fn insert(&mut self, tag: &[u8]) {
        if self.set.insert(tag.to_vec()) {
            self.order.push_back(tag.to_vec());
            while self.order.len() > MAX_RETRIES {
                if let Some(old) = self.order.pop_front() {
                    self.set.remove(&old);
                }
            }
        }
    }
}

/// The file: `None` for a table kept in memory only (unit tests).
struct OnFile {
    dir: PathBuf,
    file: File,
    /// Frames in the file (the table holds at most [`MAX_RETRIES`]).
    frames: usize,
}

#[derive(Default)]
pub struct Retries {
    table: Mutex<Table>,
    file: Mutex<Option<OnFile>>,
}

fn other(e: impl std::fmt::Display) -> std::io::Error {
    std::io::Error::other(e.to_string())
}

impl Retries {
    /// The table kept in `dir` (`repl.raft`), created empty when new; a
    /// torn last frame is cut.
    pub fn open(dir: &Path) -> Result<Retries, String> {
        let path = dir.join(RETRIES_FILE);
        let what = |e: std::io::Error| format!("{}: {e}", path.display());
        let buf = match std::fs::read(&path) {
            Ok(b) => b,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Vec::new(),
            Err(e) => return Err(what(e)),
        };
        let (tags, end) = frames(&buf);
        let mut table = Table::default();
        for t in &tags {
            table.insert(t);
        }
        let file = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)
            .map_err(what)?;
        if end < buf.len() {
            tracing::warn!(file = %path.display(), at = end, "cut a torn retryable-write tag");
            file.set_len(end as u64).map_err(what)?;
            file.sync_all().map_err(what)?;
        }
        Ok(Retries {
            table: Mutex::new(table),
            file: Mutex::new(Some(OnFile {
                dir: dir.to_path_buf(),
                file,
                frames: tags.len(),
            })),
        })
    }

    /// Write `tags` ahead of applying the group that carries them (see the
    /// module documentation): appended and synced before this returns.
    pub fn log(&self, tags: &[Vec<u8>]) -> std::io::Result<()> {
        if tags.is_empty() {
            return Ok(());
        }
        let mut g = self.file.lock();
        let Some(f) = g.as_mut() else {
            return Ok(());
        };
        if f.frames + tags.len() > 2 * MAX_RETRIES {
            // Rewrite with the tags kept (these ones included: they are
            // about to be applied), so the file stays bounded.
            let mut all: Vec<Vec<u8>> = self.tags();
            all.extend(tags.iter().cloned());
            let start = all.len().saturating_sub(MAX_RETRIES);
            *f = rewrite(&f.dir, &all[start..])?;
            return Ok(());
        }
        let mut bytes = Vec::new();
        for t in tags {
            bytes.extend_from_slice(&frame(t));
        }
        f.file.write_all(&bytes)?;
        f.file.sync_data()?;
        f.frames += tags.len();
        Ok(())
    }

    /// The group carrying `tags` was applied here: a retry of them is done.
    pub fn record(&self, tags: &[Vec<u8>]) {
        let mut t = self.table.lock();
        for tag in tags {
            t.insert(tag);
        }
    }

    pub fn contains(&self, tag: &[u8]) -> bool {
        self.table.lock().set.contains(tag)
    }

    /// The tags kept, oldest first (what a Raft snapshot carries).
    pub fn tags(&self) -> Vec<Vec<u8>> {
        self.table.lock().order.iter().cloned().collect()
    }

    /// Replace the table with `tags` (a Raft snapshot's, oldest first), on
    /// file first.
    pub fn replace(&self, tags: &[Vec<u8>]) -> std::io::Result<()> {
        let start = tags.len().saturating_sub(MAX_RETRIES);
        let tags = &tags[start..];
        let mut g = self.file.lock();
        if let Some(f) = g.as_mut() {
            *f = rewrite(&f.dir, tags)?;
        }
        let mut table = Table::default();
        for t in tags {
            table.insert(t);
        }
        *self.table.lock() = table;
        Ok(())
    }
}

/// Write `tags` as the whole file, atomically; the file reopened to append.
fn rewrite(dir: &Path, tags: &[Vec<u8>]) -> std::io::Result<OnFile> {
    let mut bytes = Vec::new();
    for t in tags {
        bytes.extend_from_slice(&frame(t));
    }
    write_atomic(dir, RETRIES_FILE, &bytes)?;
    let file = OpenOptions::new()
        .append(true)
        .open(dir.join(RETRIES_FILE))?;
    Ok(OnFile {
        dir: dir.to_path_buf(),
        file,
        frames: tags.len(),
    })
}

/// Encode `tags` for a snapshot: `n u32 | per tag: len u32 | bytes`.
pub fn encode(w: &mut impl Write, tags: &[Vec<u8>]) -> std::io::Result<()> {
    w.write_all(&(tags.len() as u32).to_le_bytes())?;
    for t in tags {
        w.write_all(&(t.len() as u32).to_le_bytes())?;
        w.write_all(t)?;
    }
    Ok(())
}

/// Decode what [`encode`] wrote, refusing sizes no member writes.
pub fn decode(r: &mut impl std::io::Read) -> std::io::Result<Vec<Vec<u8>>> {
    let mut b = [0u8; 4];
    r.read_exact(&mut b)?;
    let n = u32::from_le_bytes(b) as usize;
    if n > MAX_RETRIES {
        return Err(other(format!("{n} retryable-write tags in a snapshot")));
    }
    let mut out = Vec::with_capacity(n);
    for _ in 0..n {
        r.read_exact(&mut b)?;
        let len = u32::from_le_bytes(b) as usize;
        if len > MAX_TAG {
            return Err(other(format!("a retryable-write tag of {len} bytes")));
        }
        let mut t = vec![0u8; len];
        r.read_exact(&mut t)?;
        out.push(t);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tag(i: u64) -> Vec<u8> {
        i.to_le_bytes().to_vec()
    }

    #[test]
    fn keeps_the_newest_tags() {
        let r = Retries::default();
        for i in 0..(MAX_RETRIES + 10) as u64 {
            r.record(&[tag(i)]);
        }
        assert!(!r.contains(&tag(0)));
        assert!(r.contains(&tag(10)));
        assert!(r.contains(&tag((MAX_RETRIES + 9) as u64)));
    }

    #[test]
    fn tags_written_ahead_survive_a_reopen_and_a_torn_tail_is_cut() {
        let tmp = tempfile::tempdir().expect("tmp");
        let r = Retries::open(tmp.path()).expect("open");
        r.log(&[tag(1), tag(2)]).expect("log");
        r.record(&[tag(1), tag(2)]);
        // Written ahead, then a crash before the apply: known after the
        // restart (the replay applies its committed entry).
        r.log(&[tag(3)]).expect("log");
        drop(r);
        let path = tmp.path().join(RETRIES_FILE);
        let mut bytes = std::fs::read(&path).expect("read");
        let good = bytes.len();
        bytes.extend_from_slice(&frame(&tag(4))[..6]);
        std::fs::write(&path, &bytes).expect("write");
        let r = Retries::open(tmp.path()).expect("reopen");
        for i in 1..=3 {
            assert!(r.contains(&tag(i)), "{i}");
        }
        assert!(!r.contains(&tag(4)));
        assert_eq!(std::fs::metadata(&path).expect("meta").len() as usize, good);
        r.log(&[tag(5)]).expect("log after the cut");
        drop(r);
        let r = Retries::open(tmp.path()).expect("reopen");
        assert!(r.contains(&tag(5)) && r.contains(&tag(3)));
    }

    #[test]
    fn the_file_stays_bounded_and_a_snapshot_replaces_the_table() {
        let tmp = tempfile::tempdir().expect("tmp");
        let r = Retries::open(tmp.path()).expect("open");
        let batch: Vec<Vec<u8>> = (0..1000u64).map(tag).collect();
        for k in 0..(2 * MAX_RETRIES / 1000 + 3) as u64 {
            let b: Vec<Vec<u8>> = batch.iter().map(|t| [t.clone(), tag(k)].concat()).collect();
            r.log(&b).expect("log");
            r.record(&b);
        }
        let frames_on_file = std::fs::metadata(tmp.path().join(RETRIES_FILE))
            .expect("meta")
            .len() as usize
            / (8 + 16);
        assert!(frames_on_file <= 2 * MAX_RETRIES, "{frames_on_file}");
        let kept = r.tags();
        drop(r);
        let r = Retries::open(tmp.path()).expect("reopen");
        assert_eq!(r.tags(), kept);

        let mut enc = Vec::new();
        encode(&mut enc, &[tag(7), tag(8)]).expect("encode");
        let got = decode(&mut enc.as_slice()).expect("decode");
        r.replace(&got).expect("replace");
        assert!(r.contains(&tag(7)) && !r.contains(&kept[0]));
        drop(r);
        let r = Retries::open(tmp.path()).expect("reopen");
        assert_eq!(r.tags(), vec![tag(7), tag(8)]);
    }
}
