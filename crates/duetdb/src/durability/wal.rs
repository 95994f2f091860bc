//! The write-ahead log: segment files of checksummed records, one record per
//! writer group (group commit), LSN = the group's last `csn`.
//!
//! Layout (see docs/design.md §13.3): a segment `wal-<first csn, 20 digits>.log`
//! starts with the 8-byte magic `DUETWAL\x01`, then frames
//! `[len u32][crc32c(payload) u32][payload]`, little-endian, where a record's
//! payload is `[lsn u64][first csn u64][effect count u32][effects…]`
//! (version 1) or, with bit 31 of the count set (version 2, written since
//! change streams), `[lsn][first][count | 1<<31][time u64][wall ms i64]
//! [effects…]`, the time being the group's cluster time
//! (`changes::clock`). Both versions are read.
//!
//! Invariants:
//! - records are appended in commit order, and a record's `first` is the
//!   previous record's `lsn + 1` (the log has no gaps);
//! - an append either leaves a whole record or, when it fails, is cut back off
//!   the file (`set_len`); if even that fails writes stop, because a later
//!   record after a partial one would read back as corruption in the middle;
//! - segment roll: the new segment is created, its header synced and its
//!   directory entry synced, then a manifest naming it is installed — all
//!   before any record is appended to it (at open the log continues the last
//!   segment recovery replayed, cut and synced, or rolls a first one); the old segment is synced whole
//!   before the new one is created. So every segment the manifest names
//!   exists, and every named segment but the last runs exactly up to the
//!   next one's first csn. If the install fails cleanly the new (empty,
//!   unnamed) segment is removed and the group fails; if only its directory
//!   fsync failed, the manifest on disk may or may not name the segment, and
//!   writes stop (as after a failed fsync);
//! - after any failed fsync the log accepts no more writes (PostgreSQL's
//!   fsyncgate: the kernel may have dropped the dirty pages, so a retried fsync
//!   that succeeds proves nothing);
//! - `synced_lsn` only grows, and only after an fsync that covered it;
//! - records of `batch` groups may wait in an in-memory buffer (as MongoDB's
//!   journal does for `j: false`) until the flusher, a group that needs a
//!   sync, a rotation, or the buffer limit writes them — always before any
//!   later record, so file order stays commit order. A buffer that cannot be
//!   written holds acknowledged records, so that failure stops writes too.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use parking_lot::Mutex;

use super::changes::Stamp;
use super::effect::{self, DecodeError, Effect, Reader};
use super::io::{VFile, Vfs};
use super::manifest::{maybe_installed, ManifestStore};
use crate::error::StorageError;

pub const SEGMENT_MAGIC: &[u8; 8] = b"DUETWAL\x01";
/// Frame header: length and checksum.
pub const FRAME_HEADER: usize = 8;
/// Largest record payload (bounds memory at recovery; a group above it fails).
pub const MAX_RECORD: usize = 1 << 30;
/// `batch` records are written out once this many bytes wait in memory.
pub const BUFFER_LIMIT: usize = 1 << 20;

pub fn segment_name(first: u64) -> String {
    format!("wal-{first:020}.log")
}

/// The first csn of a segment file name, if it is one.
pub fn parse_segment_name(name: &str) -> Option<u64> {
    name.strip_prefix("wal-")?
        .strip_suffix(".log")
        .filter(|d| d.len() == 20)?
        .parse()
        .ok()
}

/// Frame `payload` with its length and checksum.
pub fn frame(payload: &[u8], out: &mut Vec<u8>) {
    out.extend_from_slice(&(payload.len() as u32).to_le_bytes());
    out.extend_from_slice(&crc32c::crc32c(payload).to_le_bytes());
    out.extend_from_slice(payload);
}

/// The frame at `pos`: `Ok(Some((payload, next)))`, `Ok(None)` at the end of
/// `buf`, `Err(why)` when the bytes there are not a whole valid frame.
pub fn read_frame(buf: &[u8], pos: usize) -> Result<Option<(&[u8], usize)>, String> {
    match frame_unchecked(buf, pos)? {
        None => Ok(None),
        Some((payload, crc, next)) => {
            if crc32c::crc32c(payload) != crc {
                return Err("checksum mismatch".into());
            }
            Ok(Some((payload, next)))
        }
    }
}

/// A frame whose checksum is not verified yet: payload, stored crc32c, and
/// the offset after it.
pub type UncheckedFrame<'a> = (&'a [u8], u32, usize);

/// [`read_frame`] without verifying the checksum: `Ok(Some((payload,
/// stored crc, next)))`. For a reader that verifies the payload itself
/// before using it (the checkpoint loader, in parallel).
pub fn frame_unchecked(buf: &[u8], pos: usize) -> Result<Option<UncheckedFrame<'_>>, String> {
    if pos == buf.len() {
        return Ok(None);
    }
    if buf.len() - pos < FRAME_HEADER {
        return Err("partial frame header".into());
    }
    let len = u32::from_le_bytes([buf[pos], buf[pos + 1], buf[pos + 2], buf[pos + 3]]) as usize;
    let crc = u32::from_le_bytes([buf[pos + 4], buf[pos + 5], buf[pos + 6], buf[pos + 7]]);
    let start = pos + FRAME_HEADER;
    if len > MAX_RECORD || len > buf.len() - start {
        return Err(format!("frame length {len} runs past the end"));
    }
    Ok(Some((&buf[start..start + len], crc, start + len)))
}

/// One decoded record.
#[derive(Debug, Clone)]
pub struct Record {
    pub lsn: u64,
    pub first: u64,
    /// The group's cluster time (0 in a version-1 record).
    pub ts: u64,
    pub wall_ms: i64,
    pub effects: Vec<Effect>,
}

/// Bit of the effect count that marks a version-2 record.
const V2_FLAG: u32 = 1 << 31;

/// The cluster time of a version-2 record payload, read from its header
/// alone (`None` for version 1 or a short payload).
pub fn record_time(payload: &[u8]) -> Option<u64> {
    let n = u32::from_le_bytes(payload.get(16..20)?.try_into().ok()?);
    if n & V2_FLAG == 0 {
        return None;
    }
    Some(u64::from_le_bytes(payload.get(20..28)?.try_into().ok()?))
}

/// Decode a record payload (either version).
pub fn decode_record(payload: &[u8]) -> Result<Record, DecodeError> {
    let mut r = Reader::new(payload);
    let lsn = r.u64()?;
    let first = r.u64()?;
    if first == 0 || first > lsn {
        return Err(DecodeError(format!("bad csn range {first}..={lsn}")));
    }
    let n = r.u32()?;
    let (n, ts, wall_ms) = if n & V2_FLAG != 0 {
        let ts = r.u64()?;
        let wall = r.u64()? as i64;
        (n & !V2_FLAG, ts, wall)
    } else {
        (n, 0, 0)
    };
    let n = n as usize;
    let mut effects = Vec::with_capacity(n.min(1 << 16));
    for _ in 0..n {
        effects.push(effect::decode(&mut r)?);
    }
    if !r.done() {
        return Err(DecodeError("trailing bytes after the effects".into()));
    }
    Ok(Record {
        lsn,
        first,
        ts,
        wall_ms,
        effects,
    })
}

/// Whether a valid record with `lsn >= min_lsn` starts anywhere in
/// `buf[from..]` (at any byte offset). Used to tell a torn tail (nothing valid
/// follows the damage) from damage in the middle of the log. The lsn filter
/// makes the scan cheap: a checksum is computed only where the bytes already
/// look like a record header of a plausible commit.
pub fn valid_record_after(buf: &[u8], from: usize, min_lsn: u64) -> bool {
    let mut pos = from;
    while pos + FRAME_HEADER + 16 <= buf.len() {
        let at = pos + FRAME_HEADER;
        let mut l = [0u8; 8];
        l.copy_from_slice(&buf[at..at + 8]);
        let lsn = u64::from_le_bytes(l);
        if lsn >= min_lsn && lsn < min_lsn.saturating_add(1 << 32) {
            if let Ok(Some((payload, _))) = read_frame(buf, pos) {
                if decode_record(payload).is_ok() {
                    return true;
                }
            }
        }
        pos += 1;
    }
    false
}

/// The (version 2) payload of the record of group `first..=lsn` stamped
/// with its cluster time: what the WAL frames, and what a replica set
/// replicates (so every member logs the same bytes).
pub fn encode_record(
    first: u64,
    lsn: u64,
    stamp: Stamp,
    effects: &[Effect],
) -> Result<Vec<u8>, StorageError> {
    debug_assert!(first >= 1 && first <= lsn);
    debug_assert!(effects.len() < V2_FLAG as usize);
    let mut payload = Vec::with_capacity(64 + effects.len() * 64);
    payload.extend_from_slice(&lsn.to_le_bytes());
    payload.extend_from_slice(&first.to_le_bytes());
    payload.extend_from_slice(&(effects.len() as u32 | V2_FLAG).to_le_bytes());
    payload.extend_from_slice(&stamp.ts.to_le_bytes());
    payload.extend_from_slice(&(stamp.wall_ms as u64).to_le_bytes());
    for e in effects {
        effect::encode(e, &mut payload);
    }
    if payload.len() > MAX_RECORD {
        return Err(StorageError::RecordTooLarge {
            bytes: payload.len(),
            limit: MAX_RECORD,
        });
    }
    Ok(payload)
}

/// What the writer needs to know about how a commit must be made durable.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SyncMode {
    /// Sync before returning (acknowledge after the record is durable).
    Now,
    /// Leave it to the background flusher (≤ the flush interval).
    Later,
}

struct Active {
    file: Arc<dyn VFile>,
    path: PathBuf,
    /// Bytes in the segment (header included).
    len: u64,
    /// Bytes written since the last sync.
    dirty: bool,
    /// Whole `batch` records not yet written (they follow `len`).
    buffered: Vec<u8>,
}

/// How a log writes its segments.
#[derive(Debug, Clone, Copy)]
pub struct WalOptions {
    /// A segment is closed and a new one started beyond this size.
    pub segment_bytes: u64,
    /// Planted bug (tests): never fsync a segment.
    pub skip_fsync: bool,
    /// Planted bug (tests): never fsync the directory after creating a segment.
    pub skip_dir_fsync: bool,
}

/// The log of one database (present unless the database runs with durability `none`).
pub struct Wal {
    vfs: Arc<dyn Vfs>,
    dir: PathBuf,
    segment_bytes: u64,
    skip_fsync: bool,
    skip_dir_fsync: bool,
    /// Where a rotation names its new segment before writing to it.
    manifest: Arc<ManifestStore>,
    active: Mutex<Active>,
    /// Held for every fsync of a segment. Lock order: `active`, then this.
    /// The flusher syncs holding only this, so `batch` appends (which need
    /// only `active`) never wait for a disk flush; rotation takes it to wait
    /// for an in-flight flush of the old segment before starting the next.
    sync_lock: Mutex<()>,
    stopped: AtomicBool,
    stop_reason: Mutex<Option<String>>,
    /// Bytes appended since the last checkpoint (its trigger).
    pub bytes_since_checkpoint: AtomicU64,
    /// csn of the last record appended.
    last_lsn: AtomicU64,
    /// Every record up to this csn was covered by a successful fsync.
    synced_lsn: AtomicU64,
    /// Monotonic counters for `serverStatus` (relaxed: figures, not protocol).
    records: AtomicU64,
    bytes: AtomicU64,
    fsyncs: AtomicU64,
    /// Microseconds spent in WAL fsyncs, summed (metrics: mean latency).
    fsync_us: AtomicU64,
    segments_created: AtomicU64,
}

/// What the log has done since the database was opened (`Database::wal_stats`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct WalStats {
    pub records: u64,
    pub bytes: u64,
    pub fsyncs: u64,
    /// Microseconds spent in those fsyncs, summed.
    pub fsync_micros_total: u64,
    /// Segments started since open (including one rolled at open when there
    /// was no segment to continue).
    pub segments_created: u64,
    pub bytes_since_checkpoint: u64,
    pub last_lsn: u64,
    pub stopped: bool,
}

impl Wal {
    /// Start a log whose next record is `next_csn`, in a fresh segment
    /// (created, header and directory entry synced).
    /// Requires: no segment in `dir` holds a record at or after `next_csn`,
    /// and the caller installs a manifest naming the new segment before the
    /// first append (`Durable::open` does, in the install that also records
    /// what recovery found).
    pub fn start(
        vfs: Arc<dyn Vfs>,
        dir: &Path,
        next_csn: u64,
        opts: WalOptions,
        manifest: Arc<ManifestStore>,
    ) -> Result<Wal, StorageError> {
        let active = create_segment(&*vfs, dir, next_csn, opts.skip_fsync, opts.skip_dir_fsync)?;
        Ok(Wal::with_active(vfs, dir, next_csn, opts, manifest, active))
    }

    /// Continue a log whose next record is `next_csn` at the end of the
    /// existing segment that starts at `first` and holds `len` bytes.
    /// Requires: that segment is named by the installed manifest, its header
    /// is valid, its records end at `next_csn - 1`, and all `len` bytes are
    /// synced (recovery replayed it, cut any torn tail and synced it).
    pub fn resume(
        vfs: Arc<dyn Vfs>,
        dir: &Path,
        next_csn: u64,
        (first, len): (u64, u64),
        opts: WalOptions,
        manifest: Arc<ManifestStore>,
    ) -> Result<Wal, StorageError> {
        let path = dir.join(segment_name(first));
        debug_assert!(first <= next_csn && len >= SEGMENT_MAGIC.len() as u64);
        debug_assert!(manifest
            .get()
            .segments
            .is_some_and(|s| s.last() == Some(&first)));
        let file = vfs
            .open_append(&path)
            .map_err(|e| StorageError::io("open", &path, &e))?;
        let active = Active {
            file,
            path,
            len,
            dirty: false,
            buffered: Vec::new(),
        };
        let wal = Wal::with_active(vfs, dir, next_csn, opts, manifest, active);
        wal.segments_created.store(0, Ordering::Relaxed);
        Ok(wal)
    }

    fn with_active(
        vfs: Arc<dyn Vfs>,
        dir: &Path,
        next_csn: u64,
        opts: WalOptions,
        manifest: Arc<ManifestStore>,
        active: Active,
    ) -> Wal {
        Wal {
            vfs,
            dir: dir.to_path_buf(),
            segment_bytes: opts.segment_bytes.max(SEGMENT_MAGIC.len() as u64 + 1),
            skip_fsync: opts.skip_fsync,
            skip_dir_fsync: opts.skip_dir_fsync,
            manifest,
            active: Mutex::new(active),
            sync_lock: Mutex::new(()),
            stopped: AtomicBool::new(false),
            stop_reason: Mutex::new(None),
            bytes_since_checkpoint: AtomicU64::new(0),
            last_lsn: AtomicU64::new(next_csn.saturating_sub(1)),
            // Recovery synced what it replayed (see `recovery`).
            synced_lsn: AtomicU64::new(next_csn.saturating_sub(1)),
            records: AtomicU64::new(0),
            bytes: AtomicU64::new(0),
            fsyncs: AtomicU64::new(0),
            fsync_us: AtomicU64::new(0),
            segments_created: AtomicU64::new(1),
        }
    }

    /// Refuse writes once stopped (cheap: one atomic load on the happy path).
    pub fn check_writable(&self) -> Result<(), StorageError> {
        if self.stopped.load(Ordering::Acquire) {
            let reason = self
                .stop_reason
                .lock()
                .clone()
                .unwrap_or_else(|| "unknown".into());
            return Err(StorageError::WritesStopped { reason });
        }
        Ok(())
    }

    fn stop(&self, reason: String) {
        tracing::error!(dir = %self.dir.display(), %reason, "write-ahead log stopped accepting writes");
        self.stop_reason.lock().get_or_insert(reason);
        self.stopped.store(true, Ordering::Release);
    }

    /// Append the (version 2) record of a group `first..=lsn` stamped with
    /// its cluster time and, with `SyncMode::Now`, make it durable before
    /// returning. On error nothing of the record remains in the log (or
    /// writes are stopped). (The writer encodes first, so that a replica
    /// set can commit the same bytes: [`Wal::append_payload`].)
    #[cfg_attr(not(test), allow(dead_code))]
    pub fn append(
        &self,
        first: u64,
        lsn: u64,
        stamp: Stamp,
        effects: &[Effect],
        sync: SyncMode,
    ) -> Result<(), StorageError> {
        let payload = encode_record(first, lsn, stamp, effects)?;
        self.append_payload(first, lsn, &payload, sync)
    }

    /// Append an already encoded record payload (what [`encode_record`]
    /// made, here or on the replica-set member that committed it), exactly
    /// as [`Wal::append`] does. Requires: `payload` decodes to a record of
    /// commits `first..=lsn`.
    pub fn append_payload(
        &self,
        first: u64,
        lsn: u64,
        payload: &[u8],
        sync: SyncMode,
    ) -> Result<(), StorageError> {
        self.check_writable()?;
        debug_assert!(first >= 1 && first <= lsn);
        if payload.len() > MAX_RECORD {
            return Err(StorageError::RecordTooLarge {
                bytes: payload.len(),
                limit: MAX_RECORD,
            });
        }
        let mut rec = Vec::with_capacity(payload.len() + FRAME_HEADER);
        frame(payload, &mut rec);

        let mut a = self.active.lock();
        debug_assert_eq!(self.last_lsn.load(Ordering::Relaxed) + 1, first);
        // Counted when the record is accepted into the log (buffered or written);
        // a failed append below returns before the figures would matter.
        self.records.fetch_add(1, Ordering::Relaxed);
        self.bytes.fetch_add(rec.len() as u64, Ordering::Relaxed);
        let logical = a.len + a.buffered.len() as u64;
        if logical + rec.len() as u64 > self.segment_bytes && logical > SEGMENT_MAGIC.len() as u64 {
            self.rotate(&mut a, first)?;
        }
        if sync == SyncMode::Later {
            a.buffered.extend_from_slice(&rec);
            if a.buffered.len() >= BUFFER_LIMIT {
                self.drain(&mut a)?;
            }
            self.last_lsn.store(lsn, Ordering::Release);
            self.bytes_since_checkpoint
                .fetch_add(rec.len() as u64, Ordering::Relaxed);
            return Ok(());
        }
        self.drain(&mut a)?;
        if let Err(e) = a.file.append(&rec) {
            let err = StorageError::io("append to", &a.path, &e);
            // Cut a partial record off, or the next record would follow garbage.
            if let Err(e2) = a.file.set_len(a.len) {
                self.stop(format!(
                    "could not undo a failed append to {}: {e2}",
                    a.path.display()
                ));
            }
            return Err(err);
        }
        a.len += rec.len() as u64;
        a.dirty = true;
        self.last_lsn.store(lsn, Ordering::Release);
        self.bytes_since_checkpoint
            .fetch_add(rec.len() as u64, Ordering::Relaxed);
        self.sync_locked(&mut a)
    }

    /// Write the buffered `batch` records. They were acknowledged, so if they
    /// cannot be written the log no longer matches what readers saw: stop.
    fn drain(&self, a: &mut Active) -> Result<(), StorageError> {
        if a.buffered.is_empty() {
            return Ok(());
        }
        let bytes = std::mem::take(&mut a.buffered);
        if let Err(e) = a.file.append(&bytes) {
            let err = StorageError::io("append to", &a.path, &e);
            let _ = a.file.set_len(a.len);
            self.stop(format!(
                "writing buffered batch-mode records to {} failed: {e}",
                a.path.display()
            ));
            return Err(err);
        }
        a.len += bytes.len() as u64;
        a.dirty = true;
        Ok(())
    }

    fn sync_locked(&self, a: &mut Active) -> Result<(), StorageError> {
        let _sync = self.sync_lock.lock();
        if self.skip_fsync {
            a.dirty = false; // planted bug for the crash-test controls
            return Ok(());
        }
        let t0 = std::time::Instant::now();
        if let Err(e) = a.file.sync() {
            let err = StorageError::io("fsync", &a.path, &e);
            self.stop(format!("fsync of {} failed: {e}", a.path.display()));
            return Err(err);
        }
        self.note_fsync(t0);
        // Every record up to `last_lsn` is in the file (the buffer was drained).
        debug_assert!(a.buffered.is_empty());
        self.synced_lsn
            .fetch_max(self.last_lsn.load(Ordering::Acquire), Ordering::AcqRel);
        a.dirty = false;
        Ok(())
    }

    /// Sync whatever was appended and not yet synced (the `batch` flusher, and close).
    pub fn flush(&self) -> Result<(), StorageError> {
        if self.stopped.load(Ordering::Acquire) {
            return Ok(());
        }
        let (file, path, upto, _sync) = {
            let mut a = self.active.lock();
            self.drain(&mut a)?;
            if !a.dirty {
                return Ok(());
            }
            let sync = self.sync_lock.lock();
            a.dirty = false;
            // Drained: the file holds every record up to `last_lsn`.
            let upto = self.last_lsn.load(Ordering::Acquire);
            (a.file.clone(), a.path.clone(), upto, sync)
        };
        if self.skip_fsync {
            return Ok(());
        }
        let t0 = std::time::Instant::now();
        if let Err(e) = file.sync() {
            let err = StorageError::io("fsync", &path, &e);
            self.stop(format!("fsync of {} failed: {e}", path.display()));
            return Err(err);
        }
        self.note_fsync(t0);
        self.synced_lsn.fetch_max(upto, Ordering::AcqRel);
        Ok(())
    }

    /// Close the full segment (synced) and start a new one at `first`: create
    /// it, then name it in the manifest, then use it (the roll protocol of
    /// the module doc).
    fn rotate(&self, a: &mut Active, first: u64) -> Result<(), StorageError> {
        self.drain(a)?;
        if a.dirty {
            self.sync_locked(a)?;
        } else {
            // A flush of this segment may be in flight: records of the next
            // segment must not become durable before this one's.
            drop(self.sync_lock.lock());
        }
        let path = self.dir.join(segment_name(first));
        if self.vfs.exists(&path) {
            // Only the empty, unnamed segment of an earlier rotation whose
            // manifest install failed cleanly and whose removal failed too
            // (a maybe-installed one stopped writes).
            self.vfs
                .remove(&path)
                .map_err(|e| StorageError::io("remove", &path, &e))?;
        }
        let next = create_segment(
            &*self.vfs,
            &self.dir,
            first,
            self.skip_fsync,
            self.skip_dir_fsync,
        )?;
        let synced = self.synced_lsn();
        let named = self.manifest.update(|m| {
            let segments = m.segments.get_or_insert_with(Vec::new);
            debug_assert!(segments.last().is_none_or(|l| *l < first));
            segments.push(first);
            m.synced_lsn = m.synced_lsn.max(synced);
        });
        if let Err(e) = named {
            if maybe_installed(&e) {
                self.stop(format!(
                    "the manifest naming the new WAL segment {} may or may not be on disk: {e}",
                    next.path.display()
                ));
            } else if let Err(e2) = self.vfs.remove(&next.path) {
                // Unnamed and empty: harmless; recovery removes it.
                tracing::warn!(segment = %next.path.display(), error = %e2, "could not remove an unused WAL segment");
            }
            return Err(e);
        }
        *a = next;
        self.segments_created.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    fn note_fsync(&self, started: std::time::Instant) {
        self.fsyncs.fetch_add(1, Ordering::Relaxed);
        let us = started.elapsed().as_micros().min(u128::from(u64::MAX)) as u64;
        self.fsync_us.fetch_add(us, Ordering::Relaxed);
    }

    pub fn stats(&self) -> WalStats {
        WalStats {
            records: self.records.load(Ordering::Relaxed),
            bytes: self.bytes.load(Ordering::Relaxed),
            fsyncs: self.fsyncs.load(Ordering::Relaxed),
            fsync_micros_total: self.fsync_us.load(Ordering::Relaxed),
            segments_created: self.segments_created.load(Ordering::Relaxed),
            bytes_since_checkpoint: self.bytes_since_checkpoint.load(Ordering::Relaxed),
            last_lsn: self.last_lsn(),
            stopped: self.stopped.load(Ordering::Acquire),
        }
    }

    pub fn last_lsn(&self) -> u64 {
        self.last_lsn.load(Ordering::Acquire)
    }

    /// Every record up to this csn is durable (a successful fsync covered it).
    pub fn synced_lsn(&self) -> u64 {
        self.synced_lsn.load(Ordering::Acquire)
    }
}

/// Create, header, sync and publish (dir sync) a new segment starting at `first`.
fn create_segment(
    vfs: &dyn Vfs,
    dir: &Path,
    first: u64,
    skip_fsync: bool,
    skip_dir_fsync: bool,
) -> Result<Active, StorageError> {
    let path = dir.join(segment_name(first));
    let file = vfs
        .create(&path)
        .map_err(|e| StorageError::io("create", &path, &e))?;
    let undo = |vfs: &dyn Vfs| {
        let _ = vfs.remove(&path);
    };
    if let Err(e) = file.append(SEGMENT_MAGIC) {
        undo(vfs);
        return Err(StorageError::io("write header of", &path, &e));
    }
    if !skip_fsync {
        if let Err(e) = file.sync() {
            // Not yet holding any record: removing the file loses nothing.
            undo(vfs);
            return Err(StorageError::io("fsync", &path, &e));
        }
    }
    if !skip_dir_fsync {
        if let Err(e) = vfs.sync_dir(dir) {
            // Empty still: remove it so the next rotation can try again.
            undo(vfs);
            return Err(StorageError::io("fsync directory", dir, &e));
        }
    }
    Ok(Active {
        file,
        path,
        len: SEGMENT_MAGIC.len() as u64,
        dirty: false,
        buffered: Vec::new(),
    })
}
