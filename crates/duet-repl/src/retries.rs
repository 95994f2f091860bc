//! Which retryable writes and transaction commits the replica set applied,
//! and what they did: every member records the origin tags (`txnNumber` +
//! `lsid`, see `Database::with_origin` and `Transaction::tag`) of each group
//! entry it applies, each with its command's outcome
//! (`duetdb::WriteOutcome`: counts, upserted id, a findAndModify's
//! document), so a driver retrying a write — or a `commitTransaction` — on a
//! new primary after a failover, or on a restarted member, is answered as
//! the first execution was instead of running the write twice (or failing a
//! commit that happened). A command of several statements is several
//! writer commands with the same tag, in order: the tag keeps one outcome
//! per statement applied, each known by the log index of its entry and its
//! position there ([`Retry`]), so an entry applied again after a crash adds
//! nothing twice.
//!
//! Bounded: the newest [`MAX_RETRIES`] tags are kept (MongoDB keeps them as
//! long as the session lives), and the oldest are also forgotten while the
//! outcomes kept exceed [`MAX_OUTCOME_BYTES`] (findAndModify documents).
//!
//! **Durable, and carried by Raft snapshots.** The table is part of the
//! state machine: a member that restarts must know the tags of the entries
//! it applied before, and one that caught up from a Raft snapshot those of
//! the entries the snapshot holds (their log was purged, so it never
//! applies them). Hence:
//! - `repl.raft/retries2`, frames `len u32 | crc32c u32 | bincode(Retry)`
//!   (the Raft log's framing), appended **before** the entry's group is applied (the
//!   state machine has decided it applies: it continues its database's
//!   log), synced when the group carries tags. Write-ahead, because after a
//!   crash the member cannot tell a group its databases already hold from
//!   one every member skipped (both fail the `first == csn + 1` check when
//!   the log is replayed from a lagging `applied`): tags written after the
//!   apply would be lost in that window. A tag on file whose group a crash
//!   cut off before it was applied is harmless: the entry is committed and
//!   was decided "applies", so the replay applies it (and a primary takes
//!   writes only after draining the log). A torn last frame is cut at open.
//!   When the file holds twice as many frames as the table (and at least
//!   twice [`MAX_RETRIES`]) it is rewritten with the table's entries (tmp,
//!   sync, rename, directory sync). The file of builds before the outcomes,
//!   `retries` (bare tags), is read once at open, rewritten as `retries2`
//!   (tags without outcomes: their retries get a reply built from the
//!   command, as before) and deleted.
//! - a Raft snapshot carries the table as of its log position
//!   (`snapshot.rs`); installing one replaces the table and the file.
//!
//! Invariant: every entry in memory is on file (in the current file or a
//! rewritten one), and every entry on file belongs to a committed entry that
//! applies on this member.

use std::collections::{HashMap, VecDeque};
use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};

use parking_lot::Mutex;
use serde::{Deserialize, Serialize};

use crate::log_store::{frame, frames, write_atomic};

/// Most origin tags remembered.
pub const MAX_RETRIES: usize = 100_000;
/// Most bytes of outcomes remembered (each counted with [`ENTRY_OVERHEAD`]);
/// past it the oldest tags are forgotten, as past [`MAX_RETRIES`].
pub const MAX_OUTCOME_BYTES: usize = 64 << 20;
/// What one remembered outcome costs besides its bytes (bookkeeping).
const ENTRY_OVERHEAD: usize = 32;
/// Longest tag accepted from a file or a snapshot (a tag is 8 bytes of
/// `txnNumber` and a session id of a few dozen bytes).
pub const MAX_TAG: usize = 4096;
/// Longest outcome accepted from a file or a snapshot (a findAndModify's
/// document, at most 16 MiB, and a few counts).
pub const MAX_OUTCOME: usize = (16 << 20) + 4096;
/// Most entries a snapshot's table may hold.
const MAX_ENTRIES: usize = 64 * MAX_RETRIES;
/// The table's file in `repl.raft/`.
pub const RETRIES_FILE: &str = "retries2";
/// The file of builds that kept tags only (read once, then replaced).
pub const OLD_RETRIES_FILE: &str = "retries";

/// One command of a tagged client operation that a group entry applied.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Retry {
    pub tag: Vec<u8>,
    /// `duetdb::WriteOutcome::encode` (empty: nothing to tell, or a tag
    /// recorded before outcomes were).
    pub outcome: Vec<u8>,
    /// The log index of the entry, and the position among its tags.
    pub index: u64,
    pub pos: u32,
}

impl Retry {
    /// A tag of an older build (no outcome), at `pos` of the old table.
    fn bare(tag: Vec<u8>, pos: usize) -> Retry {
        Retry {
            tag,
            outcome: Vec::new(),
            index: 0,
            pos: pos as u32,
        }
    }

    fn cost(&self) -> usize {
        self.outcome.len() + self.tag.len() + ENTRY_OVERHEAD
    }
}

/// The tags, their entries, and their order of arrival (oldest first,
/// evicted first).
#[derive(Default)]
struct Table {
    map: HashMap<Vec<u8>, Vec<Retry>>,
    order: VecDeque<Vec<u8>>,
    bytes: usize,
    entries: usize,
}

impl Table {
    fn insert(&mut self, r: &Retry) {
        match self.map.get_mut(&r.tag) {
            Some(list) => {
                if list.iter().any(|o| o.index == r.index && o.pos == r.pos) {
                    return;
                }
                list.push(r.clone());
            }
            None => {
                self.map.insert(r.tag.clone(), vec![r.clone()]);
                self.order.push_back(r.tag.clone());
            }
        }
        self.bytes += r.cost();
        self.entries += 1;
        while self.order.len() > MAX_RETRIES
            || (self.bytes > MAX_OUTCOME_BYTES && self.order.len() > 1)
        {
            let Some(old) = self.order.pop_front() else {
                break;
            };
            if let Some(list) = self.map.remove(&old) {
                self.bytes -= list.iter().map(Retry::cost).sum::<usize>();
                self.entries -= list.len();
            }
        }
    }

    /// Every entry, oldest tag first, each tag's in the order applied.
    fn all(&self) -> Vec<Retry> {
        self.order
            .iter()
            .filter_map(|t| self.map.get(t))
            .flatten()
            .cloned()
            .collect()
    }
}

/// The file: `None` for a table kept in memory only (unit tests).
struct OnFile {
    dir: PathBuf,
    file: File,
    /// Frames in the file.
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

fn read_or_empty(path: &Path) -> Result<Vec<u8>, String> {
    match std::fs::read(path) {
        Ok(b) => Ok(b),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Vec::new()),
        Err(e) => Err(format!("{}: {e}", path.display())),
    }
}

impl Retries {
    /// The table kept in `dir` (`repl.raft`), created empty when new; a
    /// torn last frame is cut; an older build's file of bare tags is taken
    /// over.
    pub fn open(dir: &Path) -> Result<Retries, String> {
        let path = dir.join(RETRIES_FILE);
        let what = |e: std::io::Error| format!("{}: {e}", path.display());
        let old = dir.join(OLD_RETRIES_FILE);
        if !path.exists() && old.exists() {
            let buf = read_or_empty(&old)?;
            let (tags, _) = frames(&buf);
            let all: Vec<Retry> = tags
                .iter()
                .enumerate()
                .map(|(i, t)| Retry::bare(t.to_vec(), i))
                .collect();
            rewrite(dir, &all).map_err(what)?;
            std::fs::remove_file(&old).map_err(|e| format!("{}: {e}", old.display()))?;
        }
        let buf = read_or_empty(&path)?;
        let (entries, end) = frames(&buf);
        let mut table = Table::default();
        let mut good = 0usize;
        for f in &entries {
            match bincode::deserialize::<Retry>(f) {
                Ok(r) => {
                    table.insert(&r);
                    good += 1;
                }
                Err(e) => {
                    return Err(format!(
                        "{}: a retry entry does not decode: {e}",
                        path.display()
                    ))
                }
            }
        }
        let file = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)
            .map_err(what)?;
        if end < buf.len() {
            tracing::warn!(file = %path.display(), at = end, "cut a torn retryable-write entry");
            file.set_len(end as u64).map_err(what)?;
            file.sync_all().map_err(what)?;
        }
        Ok(Retries {
            table: Mutex::new(table),
            file: Mutex::new(Some(OnFile {
                dir: dir.to_path_buf(),
                file,
                frames: good,
            })),
        })
    }

    /// Write `entries` ahead of applying the group that carries them (see
    /// the module documentation): appended and synced before this returns.
    pub fn log(&self, entries: &[Retry]) -> std::io::Result<()> {
        if entries.is_empty() {
            return Ok(());
        }
        let mut g = self.file.lock();
        let Some(f) = g.as_mut() else {
            return Ok(());
        };
        let kept = self.table.lock().entries;
        if f.frames + entries.len() > 2 * kept.max(MAX_RETRIES) {
            // Rewrite with the entries kept (these ones included: they are
            // about to be applied), so the file stays bounded.
            let mut t = Table::default();
            for r in self.entries().iter().chain(entries) {
                t.insert(r);
            }
            *f = rewrite(&f.dir, &t.all())?;
            return Ok(());
        }
        let mut bytes = Vec::new();
        for r in entries {
            bytes.extend_from_slice(&frame(&bincode::serialize(r).map_err(other)?));
        }
        f.file.write_all(&bytes)?;
        f.file.sync_data()?;
        f.frames += entries.len();
        Ok(())
    }

    /// The group carrying `entries` was applied here: a retry of their tags
    /// is done, and answered from their outcomes.
    pub fn record(&self, entries: &[Retry]) {
        let mut t = self.table.lock();
        for r in entries {
            t.insert(r);
        }
    }

    /// How many entries (one per command applied) the table keeps.
    pub fn entries_count(&self) -> usize {
        self.table.lock().entries
    }

    pub fn contains(&self, tag: &[u8]) -> bool {
        self.table.lock().map.contains_key(tag)
    }

    /// The outcomes of tag `tag`'s commands, in the order they applied
    /// (`None`: the tag is not known).
    pub fn outcomes(&self, tag: &[u8]) -> Option<Vec<Vec<u8>>> {
        let t = self.table.lock();
        let list = t.map.get(tag)?;
        Some(list.iter().map(|r| r.outcome.clone()).collect())
    }

    /// The entries kept, oldest tag first (what a Raft snapshot carries).
    pub fn entries(&self) -> Vec<Retry> {
        self.table.lock().all()
    }

    /// Replace the table with `entries` (a Raft snapshot's, oldest tag
    /// first), on file first.
    pub fn replace(&self, entries: &[Retry]) -> std::io::Result<()> {
        let mut table = Table::default();
        for r in entries {
            table.insert(r);
        }
        let mut g = self.file.lock();
        if let Some(f) = g.as_mut() {
            *f = rewrite(&f.dir, &table.all())?;
        }
        *self.table.lock() = table;
        Ok(())
    }
}

/// Write `entries` as the whole file, atomically; the file reopened to
/// append.
fn rewrite(dir: &Path, entries: &[Retry]) -> std::io::Result<OnFile> {
    let mut bytes = Vec::new();
    for r in entries {
        bytes.extend_from_slice(&frame(&bincode::serialize(r).map_err(other)?));
    }
    write_atomic(dir, RETRIES_FILE, &bytes)?;
    let file = OpenOptions::new()
        .append(true)
        .open(dir.join(RETRIES_FILE))?;
    Ok(OnFile {
        dir: dir.to_path_buf(),
        file,
        frames: entries.len(),
    })
}

/// Encode `entries` for a snapshot (format 3): `n u32 | per entry: len u32
/// | bincode(Retry)`.
pub fn encode(w: &mut impl Write, entries: &[Retry]) -> std::io::Result<()> {
    w.write_all(&(entries.len() as u32).to_le_bytes())?;
    for r in entries {
        let b = bincode::serialize(r).map_err(other)?;
        w.write_all(&(b.len() as u32).to_le_bytes())?;
        w.write_all(&b)?;
    }
    Ok(())
}

fn read_u32(r: &mut impl std::io::Read) -> std::io::Result<usize> {
    let mut b = [0u8; 4];
    r.read_exact(&mut b)?;
    Ok(u32::from_le_bytes(b) as usize)
}

/// Decode what [`encode`] wrote, refusing sizes no member writes.
pub fn decode(r: &mut impl std::io::Read) -> std::io::Result<Vec<Retry>> {
    let n = read_u32(r)?;
    if n > MAX_ENTRIES {
        return Err(other(format!("{n} retryable-write entries in a snapshot")));
    }
    let mut out = Vec::with_capacity(n.min(MAX_RETRIES));
    for _ in 0..n {
        let len = read_u32(r)?;
        if len > MAX_TAG + MAX_OUTCOME + 64 {
            return Err(other(format!("a retryable-write entry of {len} bytes")));
        }
        let mut b = vec![0u8; len];
        r.read_exact(&mut b)?;
        out.push(bincode::deserialize(&b).map_err(other)?);
    }
    Ok(out)
}

/// Decode an older snapshot's table (format 2: `n u32 | per tag: len u32 |
/// bytes`): tags without outcomes.
pub fn decode_tags(r: &mut impl std::io::Read) -> std::io::Result<Vec<Retry>> {
    let n = read_u32(r)?;
    if n > MAX_RETRIES {
        return Err(other(format!("{n} retryable-write tags in a snapshot")));
    }
    let mut out = Vec::with_capacity(n);
    for i in 0..n {
        let len = read_u32(r)?;
        if len > MAX_TAG {
            return Err(other(format!("a retryable-write tag of {len} bytes")));
        }
        let mut t = vec![0u8; len];
        r.read_exact(&mut t)?;
        out.push(Retry::bare(t, i));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tag(i: u64) -> Vec<u8> {
        i.to_le_bytes().to_vec()
    }

    /// Entry `pos` of log entry `index` for tag `t`, with outcome `o`.
    fn at(t: u64, index: u64, pos: u32, o: &[u8]) -> Retry {
        Retry {
            tag: tag(t),
            outcome: o.to_vec(),
            index,
            pos,
        }
    }

    fn one(t: u64) -> Retry {
        at(t, t, 0, b"")
    }

    #[test]
    fn keeps_the_newest_tags() {
        let r = Retries::default();
        for i in 0..(MAX_RETRIES + 10) as u64 {
            r.record(&[one(i)]);
        }
        assert!(!r.contains(&tag(0)));
        assert!(r.contains(&tag(10)));
        assert!(r.contains(&tag((MAX_RETRIES + 9) as u64)));
    }

    #[test]
    fn outcomes_are_kept_per_statement_once_and_bounded_in_bytes() {
        let r = Retries::default();
        r.record(&[at(1, 5, 0, b"a")]);
        r.record(&[at(2, 6, 0, b"x"), at(1, 6, 1, b"b")]);
        // The same entry applied again (a replay after a crash).
        r.record(&[at(1, 6, 1, b"b")]);
        assert_eq!(
            r.outcomes(&tag(1)),
            Some(vec![b"a".to_vec(), b"b".to_vec()])
        );
        assert_eq!(r.outcomes(&tag(2)), Some(vec![b"x".to_vec()]));
        assert_eq!(r.outcomes(&tag(3)), None);
        // Large outcomes push the oldest tags out.
        let big = vec![7u8; MAX_OUTCOME_BYTES / 4];
        for t in 10..15 {
            r.record(&[at(t, t, 0, &big)]);
        }
        assert!(!r.contains(&tag(1)) && !r.contains(&tag(10)));
        assert!(r.contains(&tag(14)) && r.contains(&tag(12)));
    }

    #[test]
    fn entries_written_ahead_survive_a_reopen_and_a_torn_tail_is_cut() {
        let tmp = tempfile::tempdir().expect("tmp");
        let r = Retries::open(tmp.path()).expect("open");
        r.log(&[one(1), at(2, 2, 0, b"out")]).expect("log");
        r.record(&[one(1), at(2, 2, 0, b"out")]);
        // Written ahead, then a crash before the apply: known after the
        // restart (the replay applies its committed entry).
        r.log(&[one(3)]).expect("log");
        drop(r);
        let path = tmp.path().join(RETRIES_FILE);
        let mut bytes = std::fs::read(&path).expect("read");
        let good = bytes.len();
        let torn = frame(&bincode::serialize(&one(4)).expect("encode"));
        bytes.extend_from_slice(&torn[..6]);
        std::fs::write(&path, &bytes).expect("write");
        let r = Retries::open(tmp.path()).expect("reopen");
        for i in 1..=3 {
            assert!(r.contains(&tag(i)), "{i}");
        }
        assert_eq!(r.outcomes(&tag(2)), Some(vec![b"out".to_vec()]));
        assert!(!r.contains(&tag(4)));
        assert_eq!(std::fs::metadata(&path).expect("meta").len() as usize, good);
        r.log(&[one(5)]).expect("log after the cut");
        drop(r);
        let r = Retries::open(tmp.path()).expect("reopen");
        assert!(r.contains(&tag(5)) && r.contains(&tag(3)));
    }

    #[test]
    fn an_older_builds_file_of_bare_tags_is_taken_over() {
        let tmp = tempfile::tempdir().expect("tmp");
        let mut old = Vec::new();
        for i in [7u64, 8] {
            old.extend_from_slice(&frame(&tag(i)));
        }
        std::fs::write(tmp.path().join(OLD_RETRIES_FILE), &old).expect("write");
        let r = Retries::open(tmp.path()).expect("open");
        assert_eq!(r.outcomes(&tag(7)), Some(vec![Vec::new()]));
        assert!(r.contains(&tag(8)));
        assert!(!tmp.path().join(OLD_RETRIES_FILE).exists());
        drop(r);
        let r = Retries::open(tmp.path()).expect("reopen");
        assert!(r.contains(&tag(7)) && r.contains(&tag(8)));
    }

    #[test]
    fn the_file_stays_bounded_and_a_snapshot_replaces_the_table() {
        let tmp = tempfile::tempdir().expect("tmp");
        let r = Retries::open(tmp.path()).expect("open");
        for k in 0..(2 * MAX_RETRIES / 1000 + 3) as u64 {
            let b: Vec<Retry> = (0..1000u64).map(|i| one(k * 1000 + i)).collect();
            r.log(&b).expect("log");
            r.record(&b);
        }
        let frames_on_file = frames(&std::fs::read(tmp.path().join(RETRIES_FILE)).expect("read"))
            .0
            .len();
        assert!(frames_on_file <= 2 * MAX_RETRIES, "{frames_on_file}");
        let kept = r.entries();
        assert_eq!(kept.len(), MAX_RETRIES);
        drop(r);
        let r = Retries::open(tmp.path()).expect("reopen");
        assert_eq!(r.entries(), kept);

        let mut enc = Vec::new();
        encode(&mut enc, &[at(7, 1, 0, b"o"), one(8)]).expect("encode");
        let got = decode(&mut enc.as_slice()).expect("decode");
        r.replace(&got).expect("replace");
        assert!(r.contains(&tag(7)) && !r.contains(&kept[0].tag));
        drop(r);
        let r = Retries::open(tmp.path()).expect("reopen");
        assert_eq!(r.entries(), vec![at(7, 1, 0, b"o"), one(8)]);
        // An older snapshot's bare tags.
        let mut old = Vec::new();
        old.extend_from_slice(&1u32.to_le_bytes());
        old.extend_from_slice(&8u32.to_le_bytes());
        old.extend_from_slice(&tag(9));
        let got = decode_tags(&mut old.as_slice()).expect("decode");
        assert_eq!(got[0].tag, tag(9));
        assert!(got[0].outcome.is_empty());
    }
}
