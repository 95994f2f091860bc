//! The drop log: the `dropDatabase` events of an engine's data directory,
//! kept durably because a dropped database's WAL goes with its directory.
//!
//! File `<data dir>/DROPPED-DATABASES`, rewritten whole at each drop (write
//! `.tmp`, fsync, rename, fsync the directory):
//!
//! ```text
//! "DUETDRP\x01" version:u32=1 floor:u64 n:u32 entry[n] crc32c(all preceding):u32
//! entry := db:str ts:u64 wall_ms:i64 last_ts:u64 last_index:u32 ncoll:u32 coll:str[ncoll]
//! ```
//!
//! `ts` is the drop's cluster time; `(last_ts, last_index)` the position of
//! the database's last event before it (its WAL, with every event up to
//! there, is gone: a stream resuming from before it gets 286); the
//! collections those it held (each gets a `drop` event before the
//! `dropDatabase`, as MongoDB's). Entries older than the change retention, or
//! beyond [`MAX_DROP_ENTRIES`], are pruned at the next write; `floor` is the
//! newest pruned drop's time (0: none), below which the log may miss a drop.
//!
//! Invariants:
//! - an entry is durable before the database's directory is touched
//!   (`Engine::drop_database`), so after any crash either the drop never
//!   happened (no entry) or it is recorded — and an open that finds the
//!   directory of a recorded drop still there (its time `<= last_ts`)
//!   finishes the drop;
//! - entries are sorted by `ts`; a reader gets a copy, never a lock held
//!   across I/O.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;

use super::{ChangeRecord, RecordKind};
use crate::durability::effect::{put_str, DecodeError, Effect, Reader};
use crate::durability::io::Vfs;
use crate::error::StorageError;

pub const DROP_LOG: &str = "DROPPED-DATABASES";
const MAGIC: &[u8; 8] = b"DUETDRP\x01";
const VERSION: u32 = 1;
/// Most drops kept (a few hundred bytes each); older ones are pruned.
pub const MAX_DROP_ENTRIES: usize = 4096;

/// One dropped database.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DropEntry {
    pub db: Arc<str>,
    pub ts: u64,
    pub wall_ms: i64,
    /// The time of the database's last group before the drop (0: none)…
    pub last_ts: u64,
    /// …and the index of its last event in that group (`u32::MAX`: unknown).
    pub last_index: u32,
    /// Its collections at the drop.
    pub colls: Vec<String>,
}

impl DropEntry {
    /// The change record of the drop: a `DropCollection` effect per
    /// collection, then (as the record's kind) the `dropDatabase`.
    pub fn record(&self) -> ChangeRecord {
        let effects: Vec<Effect> = self
            .colls
            .iter()
            .map(|c| Effect::DropCollection { name: c.clone() })
            .collect();
        let bytes = 96 + self.colls.iter().map(|c| 64 + c.len()).sum::<usize>();
        ChangeRecord {
            db: self.db.clone(),
            ts: self.ts,
            wall_ms: self.wall_ms,
            kind: RecordKind::DropDatabase,
            effects,
            bytes,
        }
    }
}

#[derive(Debug, Default, Clone)]
struct Contents {
    floor: u64,
    entries: Vec<DropEntry>,
}

/// The drop log of one engine (in memory only for an engine without a
/// data directory).
pub struct DropLog {
    file: Option<(Arc<dyn Vfs>, PathBuf)>,
    retention: Duration,
    contents: Mutex<Contents>,
}

impl DropLog {
    pub fn in_memory(retention: Duration) -> DropLog {
        DropLog {
            file: None,
            retention,
            contents: Mutex::new(Contents::default()),
        }
    }

    /// Read `<dir>/DROPPED-DATABASES` (absent: no drop yet). A damaged file
    /// is an error naming it: a silently empty log would let a resumed
    /// stream miss drops.
    pub fn open(
        vfs: Arc<dyn Vfs>,
        dir: &Path,
        retention: Duration,
    ) -> Result<DropLog, StorageError> {
        let path = dir.join(DROP_LOG);
        let tmp = dir.join(format!("{DROP_LOG}.tmp"));
        if vfs.exists(&tmp) {
            // A rewrite the crash interrupted before its rename: the old
            // file (if any) is the log.
            vfs.remove(&tmp)
                .map_err(|e| StorageError::io("remove", &tmp, &e))?;
        }
        let contents = if vfs.exists(&path) {
            let bytes = vfs
                .read(&path)
                .map_err(|e| StorageError::io("read", &path, &e))?;
            decode(&bytes).map_err(|e| StorageError::corrupt(&path, e.1 as u64, e.0 .0))?
        } else {
            Contents::default()
        };
        Ok(DropLog {
            file: Some((vfs, path)),
            retention,
            contents: Mutex::new(contents),
        })
    }

    /// Every recorded drop, oldest first.
    pub fn entries(&self) -> Vec<DropEntry> {
        self.contents.lock().entries.clone()
    }

    /// Drops older than this may be missing from the log (0: none is).
    pub fn floor(&self) -> u64 {
        self.contents.lock().floor
    }

    /// Record a drop durably (pruning what passed the retention). On error
    /// nothing is recorded (the file on disk is the old one, or — only when
    /// the final directory fsync failed — possibly the new one).
    /// Requires: `e.ts` is above every recorded drop's time.
    pub fn record(&self, e: DropEntry) -> Result<(), StorageError> {
        let mut g = self.contents.lock();
        debug_assert!(g.entries.last().is_none_or(|l| l.ts < e.ts));
        let mut next = g.clone();
        next.entries.push(e);
        let now_ms = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default()
            .as_millis() as i64;
        let horizon =
            now_ms.saturating_sub(self.retention.as_millis().min(i64::MAX as u128) as i64);
        while let Some(first) = next.entries.first() {
            if next.entries.len() > MAX_DROP_ENTRIES || first.wall_ms < horizon {
                next.floor = next.floor.max(first.ts);
                next.entries.remove(0);
            } else {
                break;
            }
        }
        if let Some((vfs, path)) = &self.file {
            write(&**vfs, path, &encode(&next))?;
        }
        *g = next;
        Ok(())
    }
}

fn write(vfs: &dyn Vfs, path: &Path, bytes: &[u8]) -> Result<(), StorageError> {
    let tmp = path.with_file_name(format!("{DROP_LOG}.tmp"));
    if vfs.exists(&tmp) {
        vfs.remove(&tmp)
            .map_err(|e| StorageError::io("remove", &tmp, &e))?;
    }
    let result = (|| {
        let f = vfs
            .create(&tmp)
            .map_err(|e| StorageError::io("create", &tmp, &e))?;
        f.append(bytes)
            .map_err(|e| StorageError::io("write", &tmp, &e))?;
        f.sync().map_err(|e| StorageError::io("fsync", &tmp, &e))?;
        vfs.rename(&tmp, path)
            .map_err(|e| StorageError::io("rename", &tmp, &e))
    })();
    if let Err(e) = result {
        let _ = vfs.remove(&tmp);
        return Err(e);
    }
    let dir = path.parent().unwrap_or(Path::new("."));
    vfs.sync_dir(dir)
        .map_err(|e| StorageError::io("fsync directory", dir, &e))
}

fn encode(c: &Contents) -> Vec<u8> {
    let mut out = Vec::new();
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&VERSION.to_le_bytes());
    out.extend_from_slice(&c.floor.to_le_bytes());
    out.extend_from_slice(&(c.entries.len() as u32).to_le_bytes());
    for e in &c.entries {
        put_str(&mut out, &e.db);
        out.extend_from_slice(&e.ts.to_le_bytes());
        out.extend_from_slice(&e.wall_ms.to_le_bytes());
        out.extend_from_slice(&e.last_ts.to_le_bytes());
        out.extend_from_slice(&e.last_index.to_le_bytes());
        out.extend_from_slice(&(e.colls.len() as u32).to_le_bytes());
        for coll in &e.colls {
            put_str(&mut out, coll);
        }
    }
    let crc = crc32c::crc32c(&out);
    out.extend_from_slice(&crc.to_le_bytes());
    out
}

/// Decode a drop log; the error carries the offset of the damage.
fn decode(bytes: &[u8]) -> Result<Contents, (DecodeError, usize)> {
    let at = |pos: usize| move |e: DecodeError| (e, pos);
    let Some(body_len) = bytes.len().checked_sub(4) else {
        return Err((DecodeError("shorter than its checksum".into()), 0));
    };
    let (body, crc) = bytes.split_at(body_len);
    if crc32c::crc32c(body).to_le_bytes() != crc {
        return Err((DecodeError("checksum mismatch".into()), body_len));
    }
    let mut r = Reader::new(body);
    if r.bytes(MAGIC.len()).map_err(at(0))? != MAGIC {
        return Err((DecodeError("not a duetdb drop log (bad magic)".into()), 0));
    }
    let version = r.u32().map_err(at(8))?;
    if version != VERSION {
        return Err((
            DecodeError(format!("version {version}, this build reads {VERSION}")),
            8,
        ));
    }
    let floor = r.u64().map_err(at(r.pos))?;
    let n = r.u32().map_err(at(r.pos))?;
    let mut entries = Vec::new();
    for _ in 0..n {
        let pos = r.pos;
        let db: Arc<str> = Arc::from(r.str().map_err(at(pos))?);
        let ts = r.u64().map_err(at(pos))?;
        let wall_ms = r.u64().map_err(at(pos))? as i64;
        let last_ts = r.u64().map_err(at(pos))?;
        let last_index = r.u32().map_err(at(pos))?;
        let ncoll = r.u32().map_err(at(pos))?;
        let mut colls = Vec::new();
        for _ in 0..ncoll {
            colls.push(r.str().map_err(at(pos))?);
        }
        if entries.last().is_some_and(|l: &DropEntry| l.ts >= ts) {
            return Err((DecodeError("entries out of time order".into()), pos));
        }
        entries.push(DropEntry {
            db,
            ts,
            wall_ms,
            last_ts,
            last_index,
            colls,
        });
    }
    if !r.done() {
        return Err((DecodeError("bytes after the last entry".into()), r.pos));
    }
    Ok(Contents { floor, entries })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::durability::io::SimFs;

    fn entry(db: &str, ts: u64, wall_ms: i64) -> DropEntry {
        DropEntry {
            db: Arc::from(db),
            ts,
            wall_ms,
            last_ts: ts - 2,
            last_index: 0,
            colls: vec!["a".into(), "b".into()],
        }
    }

    fn now_ms() -> i64 {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default()
            .as_millis() as i64
    }

    #[test]
    fn records_survive_reopen_and_old_ones_are_pruned() {
        let fs: Arc<dyn Vfs> = Arc::new(SimFs::new());
        let dir = Path::new("/data");
        fs.create_dir_all(dir).expect("dir");
        let day = Duration::from_secs(24 * 3600);
        let log = DropLog::open(fs.clone(), dir, day).expect("open");
        log.record(entry("old", 10, now_ms() - 2 * 24 * 3600 * 1000))
            .expect("record");
        log.record(entry("x", 20, now_ms())).expect("record");
        log.record(entry("y", 30, now_ms())).expect("record");
        let again = DropLog::open(fs.clone(), dir, day).expect("reopen");
        let names: Vec<_> = again.entries().iter().map(|e| e.db.to_string()).collect();
        assert_eq!(names, ["x", "y"], "the day-old drop was pruned");
        assert_eq!(again.floor(), 10);
        assert_eq!(again.entries(), log.entries());
    }

    #[test]
    fn damage_is_an_error_naming_the_file() {
        let sim = SimFs::new();
        let fs: Arc<dyn Vfs> = Arc::new(sim.clone());
        let dir = Path::new("/data");
        fs.create_dir_all(dir).expect("dir");
        let log = DropLog::open(fs.clone(), dir, Duration::from_secs(3600)).expect("open");
        log.record(entry("x", 20, now_ms())).expect("record");
        let path = dir.join(DROP_LOG);
        let len = sim.state().file_len(&path).expect("file");
        for off in [0, 9, len / 2, len - 1] {
            // One of the two values changes the byte.
            let mut errors = 0;
            for byte in [0x00, 0xFF] {
                let mut state = sim.state();
                assert!(state.poke(&path, off, byte));
                let damaged: Arc<dyn Vfs> = Arc::new(SimFs::from_state(state));
                if let Err(err) = DropLog::open(damaged, dir, Duration::from_secs(3600)) {
                    assert!(err.to_string().contains(DROP_LOG), "{err}");
                    errors += 1;
                }
            }
            assert!(errors >= 1, "damage at {off} not found");
        }
    }
}
