//! The Raft log and vote of one member, on disk in `<data dir>/repl.raft/`
//! (a name with a dot, so the engine never takes it for a database).
//!
//! Files:
//! - `log`: append-only operations, each framed `len u32 | crc32c u32 |
//!   bincode(op)`, little-endian; an op appends entries, truncates the log
//!   from an index on (a new leader overwrote a conflicting suffix) or
//!   purges it up to a log id. Opening replays the ops into memory. A purge
//!   (openraft's, below a Raft snapshot) rewrites the file as its purge op
//!   and the entries left (`log.tmp`, synced, renamed), so the file stays
//!   about as large as the entries kept.
//! - `vote`: the last vote, replaced atomically (tmp, fsync, rename, fsync
//!   of the directory).
//! - `set`: the replica-set name, this member's id and, once known, the
//!   set id ([`Identity`]); a data directory made for another set or member
//!   is refused at start, and so is a member's outside any set
//!   ([`refuse_outside_set`]).
//!
//! Invariants:
//! - every op is synced (`fdatasync`, by the log's writer thread, several
//!   ops per sync) before openraft is told it is done,
//!   so an acknowledged append, and every vote, survives a crash — what
//!   Raft's safety needs of stable storage;
//! - a frame that does not check at the end of `log` is a write a crash
//!   tore: it is cut off (warned); it was never acknowledged;
//! - the in-memory entries are exactly those the ops on disk leave.
//!
//! Entries are kept in memory too: the log holds what the last Raft
//! snapshot does not (`snapshot.rs`) plus the few entries openraft keeps
//! below it (`max_in_snapshot_log_to_keep`).

use std::collections::BTreeMap;
use std::fmt::Debug;
use std::fs::{File, OpenOptions};
use std::io::{Read, Write};
use std::ops::RangeBounds;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use openraft::storage::{LogFlushed, LogState, RaftLogStorage};
use openraft::{ErrorSubject, ErrorVerb, RaftLogReader};
use parking_lot::Mutex;
use serde::{Deserialize, Serialize};

use crate::types::{Entry, LogId, StorageError, TypeConfig, Vote};

/// The folder of a member's Raft files inside the data directory.
pub const RAFT_DIR: &str = "repl.raft";

#[derive(Serialize, Deserialize)]
enum LogOp {
    Append(Vec<Entry>),
    /// Remove every entry with an index `>=` this.
    Truncate(u64),
    /// Remove every entry up to and including this log id.
    Purge(LogId),
}

struct Inner {
    dir: PathBuf,
    entries: BTreeMap<u64, Entry>,
    last_purged: Option<LogId>,
    vote: Option<Vote>,
}

/// Who waits for an op to be on disk.
enum Done {
    /// openraft's append callback.
    Flushed(LogFlushed<TypeConfig>),
    /// A caller blocked on the answer.
    Wait(std::sync::mpsc::SyncSender<std::io::Result<()>>),
}

/// An encoded op for the log's writer thread.
struct Job {
    framed: Vec<u8>,
    /// A purge: the whole log after it (replaces the file).
    rewrite: Option<Vec<u8>>,
    done: Done,
}

/// The member's Raft log storage; clones share it (one is the log reader).
///
/// Ops are applied to the in-memory log at once and written by one thread
/// of their own, in order, several per `fdatasync` (group commit): the Raft
/// task never waits on the disk, so heartbeats keep their pace while a sync
/// is slow. openraft is told an append is durable only after its sync.
#[derive(Clone)]
pub struct LogStore {
    inner: Arc<Mutex<Inner>>,
    writer: std::sync::mpsc::Sender<Job>,
}

/// The writer thread: write every queued op, sync once, report; after a
/// failed write or sync every later op fails too (the file's state is
/// unknown, as after PostgreSQL's fsyncgate).
fn run_writer(mut file: File, path: PathBuf, jobs: std::sync::mpsc::Receiver<Job>) {
    let mut failed: Option<String> = None;
    while let Ok(first) = jobs.recv() {
        let mut batch = vec![first];
        while let Ok(more) = jobs.try_recv() {
            batch.push(more);
        }
        if failed.is_none() {
            let written = batch
                .iter()
                .try_for_each(|j| match &j.rewrite {
                    None => file.write_all(&j.framed),
                    Some(image) => rewrite(&path, image).map(|f| file = f),
                })
                .and_then(|_| file.sync_data());
            if let Err(e) = written {
                tracing::error!(file = %path.display(), error = %e, "Raft log write failed; the member stops");
                failed = Some(e.to_string());
            }
        }
        for j in batch {
            let outcome = match &failed {
                None => Ok(()),
                Some(why) => Err(std::io::Error::other(why.clone())),
            };
            match j.done {
                Done::Flushed(cb) => cb.log_io_completed(outcome),
                Done::Wait(tx) => {
                    let _ = tx.send(outcome);
                }
            }
        }
    }
}

/// Replace the log file at `path` with `image` (every op it must hold),
/// durably; the new file, opened for appending.
fn rewrite(path: &Path, image: &[u8]) -> std::io::Result<File> {
    let dir = path.parent().unwrap_or(Path::new("."));
    let tmp = dir.join("log.tmp");
    let mut f = File::create(&tmp)?;
    f.write_all(image)?;
    f.sync_data()?;
    drop(f);
    std::fs::rename(&tmp, path)?;
    fsync_dir(dir)?;
    OpenOptions::new().append(true).open(path)
}

/// Make the names in directory `dir` durable.
pub fn fsync_dir(dir: &Path) -> std::io::Result<()> {
    File::open(dir)?.sync_all()
}

fn io_err(subject: ErrorSubject<u64>, verb: ErrorVerb, e: impl std::fmt::Display) -> StorageError {
    StorageError::from_io_error(subject, verb, std::io::Error::other(e.to_string()))
}

/// The replica set and member id data directory `data_dir` belongs to, if
/// it was ever a member's (its `repl.raft/set`).
pub fn member_of(data_dir: &Path) -> Option<(String, u64)> {
    let have = std::fs::read_to_string(data_dir.join(RAFT_DIR).join("set")).ok()?;
    let mut lines = have.lines();
    let set = lines.next()?.to_string();
    let member = lines.next()?.trim().parse().ok()?;
    Some((set, member))
}

/// Refuse to serve a replica-set member's data directory outside its set
/// (`--standalone`, or a one-member set without `--members`): its writes
/// would not be in the set's log, and the member could never rejoin.
pub fn refuse_outside_set(data_dir: &Path) -> Result<(), String> {
    match member_of(data_dir) {
        None => Ok(()),
        Some((set, member)) => Err(format!(
            "the data directory {} belongs to member {member} of replica set '{set}': start it \
             with --replica-set {set} --member-id {member} --members <the set's members>; to \
             take its data out of the set for good, delete {}",
            data_dir.display(),
            data_dir.join(RAFT_DIR).display()
        )),
    }
}

/// Which set and member a data directory belongs to (`repl.raft/set`):
/// the set's name, this member's id, and the set id (12 random bytes made
/// by member 0 when it initializes the set, MongoDB's
/// `settings.replicaSetId`), learned from the leader by every other member
/// (`network.rs`). Two sets of the same name thus still tell each other
/// apart.
#[derive(Debug)]
pub struct Identity {
    pub set: String,
    pub member: u64,
    /// This member's wire address (set by `Member::start`; sent with its
    /// Raft requests, so a member can answer a removed one: `network.rs`).
    pub address: String,
    set_id: parking_lot::Mutex<Option<[u8; 12]>>,
    dir: PathBuf,
}

impl Identity {
    pub fn set_id(&self) -> Option<[u8; 12]> {
        *self.set_id.lock()
    }

    /// Record `id` as the set's id (a new set's, or the leader's).
    pub fn adopt(&self, id: [u8; 12]) -> std::io::Result<()> {
        let mut have = self.set_id.lock();
        if *have == Some(id) {
            return Ok(());
        }
        write_atomic(
            &self.dir,
            "set",
            identity_file(&self.set, self.member, Some(id)).as_bytes(),
        )?;
        *have = Some(id);
        Ok(())
    }
}

fn identity_file(set: &str, member: u64, id: Option<[u8; 12]>) -> String {
    match id {
        Some(id) => format!("{set}\n{member}\n{}\n", hex(&id)),
        None => format!("{set}\n{member}\n"),
    }
}

pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn unhex(s: &str) -> Option<[u8; 12]> {
    let mut out = [0u8; 12];
    if s.len() != 24 {
        return None;
    }
    for (i, o) in out.iter_mut().enumerate() {
        *o = u8::from_str_radix(s.get(2 * i..2 * i + 2)?, 16).ok()?;
    }
    Some(out)
}

/// Check (or record, when new) that `dir` belongs to member `member` of set
/// `set`. A mismatch is refused with a message naming both.
pub fn claim_identity(dir: &Path, set: &str, member: u64) -> Result<Identity, String> {
    std::fs::create_dir_all(dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
    let path = dir.join("set");
    let identity = |set_id| Identity {
        set: set.to_string(),
        member,
        address: String::new(),
        set_id: parking_lot::Mutex::new(set_id),
        dir: dir.to_path_buf(),
    };
    match std::fs::read_to_string(&path) {
        Ok(have) => {
            let mut lines = have.lines();
            let (s, m) = (lines.next().unwrap_or(""), lines.next().unwrap_or(""));
            if s == set && m == member.to_string() {
                return Ok(identity(lines.next().and_then(unhex)));
            }
            Err(format!(
                "the data directory belongs to member {m} of replica set '{s}', not member \
                 {member} of '{set}' ({}): start it with its own --replica-set and --member-id, \
                 or use an empty data directory",
                path.display()
            ))
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            write_atomic(dir, "set", identity_file(set, member, None).as_bytes())
                .map_err(|e| format!("cannot write {}: {e}", path.display()))?;
            Ok(identity(None))
        }
        Err(e) => Err(format!("cannot read {}: {e}", path.display())),
    }
}

/// Replace `dir/name` with `bytes` atomically and durably.
pub fn write_atomic(dir: &Path, name: &str, bytes: &[u8]) -> std::io::Result<()> {
    let tmp = dir.join(format!("{name}.tmp"));
    let mut f = File::create(&tmp)?;
    f.write_all(bytes)?;
    f.sync_data()?;
    drop(f);
    std::fs::rename(&tmp, dir.join(name))?;
    fsync_dir(dir)
}

pub(crate) fn frame(payload: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(payload.len() + 8);
    out.extend_from_slice(&(payload.len() as u32).to_le_bytes());
    out.extend_from_slice(&crc32c::crc32c(payload).to_le_bytes());
    out.extend_from_slice(payload);
    out
}

/// The valid frames of `buf` and where they end.
pub(crate) fn frames(buf: &[u8]) -> (Vec<&[u8]>, usize) {
    let mut out = Vec::new();
    let mut pos = 0;
    while buf.len() - pos >= 8 {
        let len = u32::from_le_bytes([buf[pos], buf[pos + 1], buf[pos + 2], buf[pos + 3]]) as usize;
        let crc = u32::from_le_bytes([buf[pos + 4], buf[pos + 5], buf[pos + 6], buf[pos + 7]]);
        let Some(payload) = buf.get(pos + 8..pos + 8 + len) else {
            break;
        };
        if crc32c::crc32c(payload) != crc {
            break;
        }
        out.push(payload);
        pos += 8 + len;
    }
    (out, pos)
}

impl LogStore {
    /// Open (or create) the log in `dir`, replaying its ops.
    pub fn open(dir: &Path) -> Result<LogStore, String> {
        std::fs::create_dir_all(dir)
            .map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
        let path = dir.join("log");
        let mut file = OpenOptions::new()
            .create(true)
            .read(true)
            .append(true)
            .open(&path)
            .map_err(|e| format!("cannot open {}: {e}", path.display()))?;
        let mut buf = Vec::new();
        file.read_to_end(&mut buf)
            .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
        let (ops, end) = frames(&buf);
        let mut entries = BTreeMap::new();
        let mut last_purged = None;
        for (i, op) in ops.into_iter().enumerate() {
            let op: LogOp = bincode::deserialize(op)
                .map_err(|e| format!("{}: operation {i} does not decode: {e}", path.display()))?;
            apply_op(&mut entries, &mut last_purged, op);
        }
        if end < buf.len() {
            tracing::warn!(file = %path.display(), offset = end, bytes = buf.len() - end,
                "cutting a torn write off the end of the Raft log");
            file.set_len(end as u64)
                .and_then(|_| file.sync_data())
                .map_err(|e| format!("cannot cut {}: {e}", path.display()))?;
        }
        let vote = match std::fs::read(dir.join("vote")) {
            Ok(b) => Some(
                bincode::deserialize(&b)
                    .map_err(|e| format!("{}: {e}", dir.join("vote").display()))?,
            ),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
            Err(e) => return Err(format!("cannot read {}: {e}", dir.join("vote").display())),
        };
        let (writer, jobs) = std::sync::mpsc::channel();
        std::thread::Builder::new()
            .name("raft-log".into())
            .spawn(move || run_writer(file, path, jobs))
            .map_err(|e| format!("cannot start the Raft log writer: {e}"))?;
        Ok(LogStore {
            inner: Arc::new(Mutex::new(Inner {
                dir: dir.to_path_buf(),
                entries,
                last_purged,
                vote,
            })),
            writer,
        })
    }

    /// Index of the last entry (0 when empty).
    pub fn last_index(&self) -> u64 {
        self.inner
            .lock()
            .entries
            .keys()
            .next_back()
            .copied()
            .unwrap_or(0)
    }

    fn encode(op: &LogOp) -> Result<Vec<u8>, StorageError> {
        let bytes =
            bincode::serialize(op).map_err(|e| io_err(ErrorSubject::Logs, ErrorVerb::Write, e))?;
        Ok(frame(&bytes))
    }

    /// Apply `op` in memory and have it written; `done` hears when it is on
    /// disk. Requires: `inner` is locked by the caller (so ops reach the
    /// writer in the order they were applied).
    fn submit(&self, inner: &mut Inner, op: LogOp, done: Done) -> Result<(), StorageError> {
        let framed = Self::encode(&op)?;
        let purge = matches!(op, LogOp::Purge(_));
        apply_op(&mut inner.entries, &mut inner.last_purged, op);
        let rewrite = if purge {
            let left: Vec<Entry> = inner.entries.values().cloned().collect();
            let mut image = framed.clone();
            if !left.is_empty() {
                image.extend_from_slice(&Self::encode(&LogOp::Append(left))?);
            }
            Some(image)
        } else {
            None
        };
        let job = Job {
            framed,
            rewrite,
            done,
        };
        self.writer.send(job).map_err(|_| {
            io_err(
                ErrorSubject::Logs,
                ErrorVerb::Write,
                "the Raft log writer stopped",
            )
        })
    }

    /// [`LogStore::submit`] and wait until the op is on disk.
    fn write_sync(&self, op: LogOp) -> Result<(), StorageError> {
        let (tx, rx) = std::sync::mpsc::sync_channel(1);
        {
            let mut inner = self.inner.lock();
            self.submit(&mut inner, op, Done::Wait(tx))?;
        }
        rx.recv()
            .map_err(|_| {
                io_err(
                    ErrorSubject::Logs,
                    ErrorVerb::Write,
                    "the Raft log writer stopped",
                )
            })?
            .map_err(|e| io_err(ErrorSubject::Logs, ErrorVerb::Write, e))
    }
}

fn apply_op(entries: &mut BTreeMap<u64, Entry>, last_purged: &mut Option<LogId>, op: LogOp) {
    match op {
        LogOp::Append(list) => {
            for e in list {
                entries.insert(e.log_id.index, e);
            }
        }
        LogOp::Truncate(from) => {
            entries.split_off(&from);
        }
        LogOp::Purge(upto) => {
            let keep = entries.split_off(&(upto.index + 1));
            *entries = keep;
            *last_purged = Some(upto);
        }
    }
}

impl RaftLogReader<TypeConfig> for LogStore {
    async fn try_get_log_entries<RB: RangeBounds<u64> + Clone + Debug + Send>(
        &mut self,
        range: RB,
    ) -> Result<Vec<Entry>, StorageError> {
        let inner = self.inner.lock();
        Ok(inner.entries.range(range).map(|(_, e)| e.clone()).collect())
    }
}

impl RaftLogStorage<TypeConfig> for LogStore {
    type LogReader = LogStore;

    async fn get_log_state(&mut self) -> Result<LogState<TypeConfig>, StorageError> {
        let inner = self.inner.lock();
        let last = inner
            .entries
            .values()
            .next_back()
            .map(|e| e.log_id)
            .or(inner.last_purged);
        Ok(LogState {
            last_purged_log_id: inner.last_purged,
            last_log_id: last,
        })
    }

    async fn get_log_reader(&mut self) -> Self::LogReader {
        self.clone()
    }

    async fn save_vote(&mut self, vote: &Vote) -> Result<(), StorageError> {
        let mut inner = self.inner.lock();
        let bytes = bincode::serialize(vote)
            .map_err(|e| io_err(ErrorSubject::Vote, ErrorVerb::Write, e))?;
        write_atomic(&inner.dir, "vote", &bytes)
            .map_err(|e| io_err(ErrorSubject::Vote, ErrorVerb::Write, e))?;
        inner.vote = Some(*vote);
        Ok(())
    }

    async fn read_vote(&mut self) -> Result<Option<Vote>, StorageError> {
        Ok(self.inner.lock().vote)
    }

    async fn append<I>(
        &mut self,
        entries: I,
        callback: LogFlushed<TypeConfig>,
    ) -> Result<(), StorageError>
    where
        I: IntoIterator<Item = Entry> + Send,
        I::IntoIter: Send,
    {
        let list: Vec<Entry> = entries.into_iter().collect();
        let mut inner = self.inner.lock();
        self.submit(&mut inner, LogOp::Append(list), Done::Flushed(callback))
    }

    async fn truncate(&mut self, log_id: LogId) -> Result<(), StorageError> {
        self.write_sync(LogOp::Truncate(log_id.index))
    }

    async fn purge(&mut self, log_id: LogId) -> Result<(), StorageError> {
        self.write_sync(LogOp::Purge(log_id))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use openraft::{CommittedLeaderId, EntryPayload};

    fn entry(term: u64, index: u64) -> Entry {
        Entry {
            log_id: LogId::new(CommittedLeaderId::new(term, 0), index),
            payload: EntryPayload::Blank,
        }
    }

    fn write(store: &LogStore, op: LogOp) {
        store.write_sync(op).expect("write");
    }

    #[test]
    fn ops_survive_reopen_and_a_torn_tail_is_cut() {
        let dir = tempfile::tempdir().expect("tmp");
        let store = LogStore::open(dir.path()).expect("open");
        write(
            &store,
            LogOp::Append((1..=5).map(|i| entry(1, i)).collect()),
        );
        write(&store, LogOp::Truncate(4));
        write(&store, LogOp::Append(vec![entry(2, 4)]));
        write(
            &store,
            LogOp::Purge(LogId::new(CommittedLeaderId::new(1, 0), 1)),
        );
        drop(store);
        // A torn write at the end: half a frame.
        let mut f = OpenOptions::new()
            .append(true)
            .open(dir.path().join("log"))
            .expect("log");
        f.write_all(&[9, 0, 0, 0, 1, 2]).expect("tear");
        drop(f);
        let store = LogStore::open(dir.path()).expect("reopen");
        let inner = store.inner.lock();
        let got: Vec<(u64, u64)> = inner
            .entries
            .values()
            .map(|e| (e.log_id.leader_id.term, e.log_id.index))
            .collect();
        assert_eq!(got, vec![(1, 2), (1, 3), (2, 4)]);
        assert_eq!(inner.last_purged.map(|l| l.index), Some(1));
        let len = std::fs::metadata(dir.path().join("log"))
            .expect("len")
            .len();
        let (_, end) = frames(&std::fs::read(dir.path().join("log")).expect("read"));
        assert_eq!(len, end as u64, "the torn frame was cut");
    }

    #[test]
    fn a_purge_rewrites_the_file_to_the_entries_left() {
        let dir = tempfile::tempdir().expect("tmp");
        let store = LogStore::open(dir.path()).expect("open");
        write(
            &store,
            LogOp::Append((1..=100).map(|i| entry(1, i)).collect()),
        );
        let before = std::fs::metadata(dir.path().join("log"))
            .expect("len")
            .len();
        write(
            &store,
            LogOp::Purge(LogId::new(CommittedLeaderId::new(1, 0), 95)),
        );
        write(&store, LogOp::Append(vec![entry(1, 101)]));
        let after = std::fs::metadata(dir.path().join("log"))
            .expect("len")
            .len();
        assert!(
            after * 4 < before,
            "{after} bytes after the purge, {before} before"
        );
        drop(store);
        let store = LogStore::open(dir.path()).expect("reopen");
        let inner = store.inner.lock();
        let got: Vec<u64> = inner.entries.keys().copied().collect();
        assert_eq!(got, (96..=101).collect::<Vec<_>>());
        assert_eq!(inner.last_purged.map(|l| l.index), Some(95));
    }

    #[test]
    fn a_member_data_directory_is_refused_outside_its_set() {
        let data = tempfile::tempdir().expect("tempdir");
        assert_eq!(member_of(data.path()), None);
        refuse_outside_set(data.path()).expect("not a member's");
        claim_identity(&data.path().join(RAFT_DIR), "rs0", 2).expect("claim");
        assert_eq!(member_of(data.path()), Some(("rs0".into(), 2)));
        let e = refuse_outside_set(data.path()).expect_err("a member's");
        assert!(e.contains("member 2 of replica set 'rs0'"), "{e}");
        assert!(e.contains("--replica-set rs0 --member-id 2"), "{e}");
    }

    #[test]
    fn a_data_directory_of_another_set_or_member_is_refused() {
        let dir = tempfile::tempdir().expect("tmp");
        let id = claim_identity(dir.path(), "rs0", 1).expect("new");
        assert_eq!(id.set_id(), None);
        id.adopt([7; 12]).expect("adopt");
        let id = claim_identity(dir.path(), "rs0", 1).expect("same");
        assert_eq!(id.set_id(), Some([7; 12]), "the set id is kept");
        let e = claim_identity(dir.path(), "rs1", 1).expect_err("other set");
        assert!(e.contains("member 1 of replica set 'rs0'"), "{e}");
        let e = claim_identity(dir.path(), "rs0", 2).expect_err("other member");
        assert!(e.contains("not member 2 of 'rs0'"), "{e}");
    }
}
