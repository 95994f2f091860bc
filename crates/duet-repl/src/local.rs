//! The retry table of a server outside a replica set (`--standalone`, or
//! the default one-member set without `--members`): which retryable writes
//! and transaction commits it applied, with their outcomes, kept across
//! restarts as MongoDB keeps `config.transactions` — so a retry of a write
//! acknowledged (or applied but not answered) before a crash or restart is
//! answered, not run again.
//!
//! It is the replica set's table (`retries.rs`: tags, outcomes with their
//! statement ids, the same bounds of [`crate::retries::MAX_RETRIES`] tags
//! and [`crate::retries::MAX_OUTCOME_BYTES`]) fed through the same seam:
//! installed as the engine's [`Replicate`] hook, it gets each writer group's
//! tags before the group is appended to the WAL, and a [`Commit::local`]
//! (a failed append fails the group only, as without a hook).
//!
//! **Durable: written ahead, filtered at open.** `retries.local` in the data
//! directory holds frames `len u32 | crc32c u32 | bincode(Entry)` (the Raft
//! log's framing): a group's entries are appended (written, not synced)
//! before the group is appended to its WAL, each with the group's database
//! and last csn. The operating system keeps a written file across a crash
//! of the process (SIGKILL, a panic), so no group a client saw acknowledged
//! lacks its tags on file then; a power loss can lose the tags of the last
//! groups whose WAL records it kept, and their retries run again (as before
//! this table existed). Syncing here cost a second fsync per group beside
//! the WAL's (sequential pymongo inserts 2.2× slower); riding the WAL's own
//! fsync needs the WAL record to carry the tags (not done).
//! A crash can leave entries of a group that never reached its WAL: at
//! open, an entry whose csn is past its database's recovered csn is
//! dropped (its write was lost with it: a retry runs it again). A group
//! whose append failed gets a cancel frame (the next group of that database
//! reuses its csns); when even that cannot be written, the file is
//! rewritten from the table before the next group is logged.
//! When the file holds twice the entries kept (at least twice
//! `MAX_RETRIES`), it is rewritten (tmp, sync, rename) with the table's
//! entries, marked applied, and the entries of groups still in flight.
//!
//! Invariant: every entry in memory is written to the file; every entry on file
//! belongs to a group that reached its WAL, or is dropped at open (csn past
//! the database's, or cancelled), or is of a database dropped and
//! recreated since whose csns reached it again (the retry of such a write
//! is answered as done: documented in docs/design.md).

use std::collections::{HashMap, HashSet};
use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use duetdb::replication::{Commit, GroupRecord, Replicate};
use parking_lot::Mutex;
use serde::{Deserialize, Serialize};

use crate::log_store::{frame, frames, write_atomic};
use crate::retries::{Retries, Retry, MAX_RETRIES};

/// The table's file in the data directory.
pub const LOCAL_RETRIES_FILE: &str = "retries.local";

/// One frame of the file.
#[derive(Debug, Clone, Serialize, Deserialize)]
enum Entry {
    /// A tagged command of group `retry.index` of database `db`, whose
    /// last csn is `lsn` (`db` empty: applied, kept by a rewrite).
    Tag { db: String, lsn: u64, retry: Retry },
    /// Group `index` did not reach its WAL.
    Cancel { index: u64 },
}

/// A group logged and not yet finished: its database, csn and entries.
type InFlight = HashMap<u64, (String, u64, Vec<Retry>)>;

struct OnFile {
    dir: PathBuf,
    /// `None` until the first tagged group: a data directory nothing was
    /// written to holds no file of it.
    file: Option<File>,
    frames: usize,
    in_flight: InFlight,
    /// A cancel frame could not be written: rewrite before the next append.
    stale: bool,
}

/// See the module documentation.
pub struct LocalRetries {
    table: Arc<Retries>,
    file: Arc<Mutex<Option<OnFile>>>,
    /// The next group's index (unique: keeps a tag's entries apart).
    next: AtomicU64,
    /// The file's path (for errors).
    path: PathBuf,
}

fn other(e: impl std::fmt::Display) -> std::io::Error {
    std::io::Error::other(e.to_string())
}

fn encode(e: &Entry) -> std::io::Result<Vec<u8>> {
    Ok(frame(&bincode::serialize(e).map_err(other)?))
}

impl LocalRetries {
    /// A table kept in memory only (a server without a data directory).
    pub fn in_memory() -> LocalRetries {
        LocalRetries {
            table: Arc::new(Retries::default()),
            file: Arc::new(Mutex::new(None)),
            next: AtomicU64::new(1),
            path: PathBuf::from(LOCAL_RETRIES_FILE),
        }
    }

    /// The table kept in `dir`, created empty when new: entries of groups
    /// that did not reach their database's WAL (`csn_of`: the database's
    /// recovered csn, 0 when it does not exist) or were cancelled are
    /// dropped, and a torn last frame is cut.
    pub fn open(dir: &Path, csn_of: impl Fn(&str) -> u64) -> Result<LocalRetries, String> {
        let path = dir.join(LOCAL_RETRIES_FILE);
        let what = |e: std::io::Error| format!("{}: {e}", path.display());
        let buf = match std::fs::read(&path) {
            Ok(b) => b,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Vec::new(),
            Err(e) => return Err(what(e)),
        };
        let (raw, end) = frames(&buf);
        let mut entries = Vec::with_capacity(raw.len());
        let mut cancelled = HashSet::new();
        for f in &raw {
            match bincode::deserialize::<Entry>(f) {
                Ok(Entry::Cancel { index }) => {
                    cancelled.insert(index);
                }
                Ok(e) => entries.push(e),
                Err(e) => {
                    return Err(format!(
                        "{}: a retryable-write entry does not decode: {e}",
                        path.display()
                    ))
                }
            }
        }
        let mut csns: HashMap<String, u64> = HashMap::new();
        let table = Retries::default();
        let mut next = 1;
        let (mut kept, mut dropped) = (0usize, 0usize);
        for e in entries {
            let Entry::Tag { db, lsn, retry } = e else {
                continue;
            };
            next = next.max(retry.index + 1);
            let applied = db.is_empty()
                || (!cancelled.contains(&retry.index)
                    && lsn <= *csns.entry(db.clone()).or_insert_with(|| csn_of(&db)));
            if applied {
                table.record(std::slice::from_ref(&retry));
                kept += 1;
            } else {
                dropped += 1;
            }
        }
        if dropped > 0 {
            tracing::info!(
                file = %path.display(),
                dropped,
                "retryable-write entries of groups that did not reach their WAL were dropped"
            );
        }
        let file = if path.exists() {
            let file = OpenOptions::new().append(true).open(&path).map_err(what)?;
            if end < buf.len() {
                tracing::warn!(file = %path.display(), at = end, "cut a torn retryable-write entry");
                file.set_len(end as u64).map_err(what)?;
                file.sync_all().map_err(what)?;
            }
            Some(file)
        } else {
            None
        };
        let mut on_file = OnFile {
            dir: dir.to_path_buf(),
            file,
            frames: raw.len(),
            in_flight: HashMap::new(),
            stale: false,
        };
        if dropped > 0 || !cancelled.is_empty() {
            // What was dropped must not come back once csns reach it again.
            rewrite(&mut on_file, &table).map_err(what)?;
        }
        tracing::debug!(kept, "retryable-write table opened");
        Ok(LocalRetries {
            table: Arc::new(table),
            file: Arc::new(Mutex::new(Some(on_file))),
            next: AtomicU64::new(next),
            path,
        })
    }

    /// The outcomes of tag `tag`'s commands, in the order they applied
    /// (`None`: not known).
    pub fn outcomes(&self, tag: &[u8]) -> Option<Vec<Vec<u8>>> {
        self.table.outcomes(tag)
    }

    pub fn contains(&self, tag: &[u8]) -> bool {
        self.table.contains(tag)
    }

    /// Append group `index`'s entries ahead of its WAL append (written, not
    /// synced: see the module documentation).
    fn log(&self, db: &str, lsn: u64, index: u64, entries: &[Retry]) -> std::io::Result<()> {
        let mut g = self.file.lock();
        let Some(f) = g.as_mut() else {
            return Ok(());
        };
        f.in_flight
            .insert(index, (db.to_string(), lsn, entries.to_vec()));
        let kept = self.table.entries_count();
        let logged = if f.stale
            || f.file.is_none()
            || f.frames + entries.len() > 2 * kept.max(MAX_RETRIES)
        {
            rewrite(f, &self.table)
        } else if let Some(file) = f.file.as_mut() {
            let mut bytes = Vec::new();
            for r in entries {
                bytes.extend_from_slice(&encode(&Entry::Tag {
                    db: db.to_string(),
                    lsn,
                    retry: r.clone(),
                })?);
            }
            file.write_all(&bytes).map(|_| f.frames += entries.len())
        } else {
            Ok(())
        };
        if logged.is_err() {
            f.in_flight.remove(&index);
            // A partial append may hold some of the entries: rewritten
            // before the next group.
            f.stale = true;
        }
        logged
    }
}

/// Write the table's entries (applied) and those of groups in flight as
/// the whole file, atomically; the file reopened to append.
fn rewrite(f: &mut OnFile, table: &Retries) -> std::io::Result<()> {
    let mut bytes = Vec::new();
    let mut n = 0;
    for retry in table.entries() {
        bytes.extend_from_slice(&encode(&Entry::Tag {
            db: String::new(),
            lsn: 0,
            retry,
        })?);
        n += 1;
    }
    for (db, lsn, entries) in f.in_flight.values() {
        for r in entries {
            bytes.extend_from_slice(&encode(&Entry::Tag {
                db: db.clone(),
                lsn: *lsn,
                retry: r.clone(),
            })?);
            n += 1;
        }
    }
    write_atomic(&f.dir, LOCAL_RETRIES_FILE, &bytes)?;
    f.file = Some(
        OpenOptions::new()
            .append(true)
            .open(f.dir.join(LOCAL_RETRIES_FILE))?,
    );
    f.frames = n;
    f.stale = false;
    Ok(())
}

impl Replicate for LocalRetries {
    fn replicate(&self, rec: GroupRecord<'_>) -> Result<Commit, duetdb::Error> {
        // Nothing here orders databases' groups: let the next one go.
        (rec.proposed)();
        if rec.origins.is_empty() {
            return Ok(Commit::local(|_| {}));
        }
        let index = self.next.fetch_add(1, Ordering::Relaxed);
        let entries: Vec<Retry> = rec
            .origins
            .iter()
            .enumerate()
            .map(|(pos, t)| Retry {
                tag: t.tag.to_vec(),
                outcome: t.outcome.clone(),
                index,
                pos: pos as u32,
            })
            .collect();
        self.log(rec.db, rec.lsn, index, &entries).map_err(|e| {
            duetdb::Error::Storage(Box::new(duetdb::StorageError::Io {
                op: "append",
                path: self.path.clone(),
                kind: e.kind(),
                errno: e.raw_os_error(),
                msg: e.to_string(),
            }))
        })?;
        let table = self.table.clone();
        let file = self.file.clone();
        Ok(Commit::local(move |outcome| {
            let mut g = file.lock();
            if let Some(f) = g.as_mut() {
                f.in_flight.remove(&index);
                if outcome.is_err() {
                    let cancel = encode(&Entry::Cancel { index }).and_then(|b| {
                        let file = f.file.as_mut().ok_or_else(|| other("no file"))?;
                        file.write_all(&b)?;
                        file.sync_data()
                    });
                    match cancel {
                        Ok(()) => f.frames += 1,
                        Err(e) => {
                            tracing::warn!(error = %e, "cannot cancel a failed group's retryable writes: the table is rewritten before the next");
                            f.stale = true;
                        }
                    }
                }
            }
            if outcome.is_ok() {
                table.record(&entries);
            }
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use duetdb::replication::Tagged;

    fn group(r: &LocalRetries, db: &str, lsn: u64, tags: &[&[u8]], ok: bool) {
        let origins: Vec<Tagged> = tags
            .iter()
            .map(|t| Tagged {
                tag: Arc::from(*t),
                outcome: b"o".to_vec(),
            })
            .collect();
        let c = r
            .replicate(GroupRecord {
                db,
                first: lsn,
                lsn,
                payload: &[],
                origins: &origins,
                proposed: &|| {},
            })
            .expect("logged");
        c.finish(if ok { Ok(()) } else { Err("no".into()) });
    }

    #[test]
    fn tags_survive_a_reopen_unless_their_group_missed_its_wal() {
        let tmp = tempfile::tempdir().expect("tmp");
        let r = LocalRetries::open(tmp.path(), |_| 0).expect("open");
        // Nothing tagged yet: no file in the data directory.
        group(&r, "a", 1, &[], true);
        assert!(!tmp.path().join(LOCAL_RETRIES_FILE).exists());
        group(&r, "a", 1, &[b"t1"], true);
        group(&r, "a", 2, &[b"t2", b"t3"], true);
        // A failed append: cancelled; the next group reuses the csn.
        group(&r, "a", 3, &[b"lost"], false);
        group(&r, "a", 3, &[b"t4"], true);
        group(&r, "b", 1, &[b"t5"], true);
        assert!(r.contains(b"t4") && !r.contains(b"lost"));
        // Logged, then a crash before the WAL append: b's csn stays 1.
        r.log(
            "b",
            2,
            99,
            &[Retry {
                tag: b"t6".to_vec(),
                outcome: Vec::new(),
                index: 99,
                pos: 0,
            }],
        )
        .expect("log");
        drop(r);
        let csn = |db: &str| if db == "a" { 3 } else { 1 };
        let r = LocalRetries::open(tmp.path(), csn).expect("reopen");
        for t in [&b"t1"[..], b"t2", b"t3", b"t4", b"t5"] {
            assert!(r.contains(t), "{t:?}");
        }
        assert_eq!(r.outcomes(b"t1"), Some(vec![b"o".to_vec()]));
        assert!(!r.contains(b"lost") && !r.contains(b"t6"));
        // Dropped for good: b's csns reaching 2 later do not bring t6 back.
        drop(r);
        let r = LocalRetries::open(tmp.path(), |_| 10).expect("reopen");
        assert!(!r.contains(b"t6") && r.contains(b"t5"));
        // New groups get indexes past the file's.
        group(&r, "b", 11, &[b"t1"], true);
        assert_eq!(r.outcomes(b"t1").map(|o| o.len()), Some(2));
    }
}
