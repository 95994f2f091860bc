//! Durability: the write-ahead log, checkpoints from snapshots, recovery.
//!
//! A durable database keeps, in its directory: `LOCK` (flock against a second
//! opener, when opened on its own; the databases of a data directory share
//! the data directory's `LOCK`, see [`Locking`]), `MANIFEST` (which
//! checkpoints are installed, which WAL segments make up the log, how far it
//! was synced, which snapshots are pinned), `ckpt-*.ckpt` (images of
//! published states) and `wal-*.log` (one record per commit group since the
//! older installed checkpoint). See docs/design.md §13 for byte layouts and
//! the protocols. Every database of the process shares one flusher and one
//! checkpointer thread ([`background`]); open descriptors are bounded
//! ([`fdcache`]).
//!
//! Protocols and their invariants:
//! - **commit**: the writer appends the group's effects as one WAL record and,
//!   when any command of the group asked for `fsync`, syncs it — all before it
//!   publishes the group or replies to anyone (so a reader never sees data a
//!   crash can take back, in `fsync` mode). A failed append fails the whole
//!   group and publishes nothing; a failed fsync also stops all later writes.
//! - **segment roll** (when a segment is full, [`wal`]): create the
//!   segment, sync its header and the directory, install a manifest naming
//!   it, and only then append to it. A fresh database gets its manifest and
//!   first segment the same way at open, before its first record; a reopened
//!   one continues its last segment (recovery replayed it, cut any torn tail
//!   and synced it).
//! - **checkpoint**: take the published state (an O(1) `cow` snapshot; the
//!   writer keeps going), write what changed since the last checkpoint to a
//!   new file ([`chain`]: pages and leaves written then are pointed to, not
//!   written again), fsync, rename, install a new
//!   manifest (tmp + fsync + rename + dir fsync) that no longer names the WAL
//!   segments older than the *previous* checkpoint (which stays as fallback),
//!   then delete those segments and the checkpoint files neither the current
//!   nor the previous checkpoint needs. A segment is thus
//!   un-named before it is deleted, and named before it is written: a named
//!   segment that is missing is damage, never a protocol window.
//! - **clean close**: sync the log, then record its synced end in the
//!   manifest (`synced_lsn`), so damage to the last records is told apart
//!   from a write torn by a crash at the next open.
//! - **recovery**: see [`recovery`].
//! - **durable named snapshots** ([`Durable::pin`]): the snapshot's held
//!   state is written with the checkpoint writer to its own file
//!   `snap-<name>-<csn>-<id>.ckpt` (tmp, fsync, rename, directory fsync —
//!   a pin has no fallback, so its name must be durable before the manifest
//!   names it), then a manifest naming it is installed. Dropping installs a manifest without it, then
//!   deletes the file. Pinned images are full states, so they need no WAL;
//!   the checkpoint cleanup only ever deletes `ckpt-*` files and WAL segments,
//!   so it never removes a pinned image. At open, `snap-*` files the manifest
//!   does not name (a crash between writing and installing, or between
//!   uninstalling and deleting) are removed. Pins are loaded lazily, on the
//!   first read by name ([`Durable::load_pin`]). An image made elsewhere
//!   (a replica set's Raft snapshot) is taken over by a rename
//!   ([`Durable::adopt_image`]): then pinned the same way, or, for a
//!   snapshot that is not durable, left out of the manifest (so the next
//!   open removes it) and removed when the snapshot is dropped.

pub mod background;
pub mod chain;
pub mod changes;
pub mod checkpoint;
pub mod effect;
pub mod fdcache;
pub mod fuzzing;
pub mod io;
pub mod manifest;
pub mod recovery;
pub mod replicate;
pub mod wal;

use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;

pub use crate::error::StorageError;
pub use checkpoint::CheckpointInfo;
pub use io::{RealFs, Vfs};
pub use manifest::Pin;
pub use recovery::{RecoveryReport, Truncation};

use io::DirLock;
use manifest::{maybe_installed, Manifest, ManifestStore};
use recovery::Recovered;
use wal::{Wal, WalOptions};

use crate::store::DbState;

/// How durable an acknowledged write is (MongoDB's write concern `j`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Durability {
    /// No WAL: the database lives in memory, and only explicit checkpoints
    /// reach the disk. As a per-write choice on a logged database: like `Batch`.
    None,
    /// Logged at once, synced by a background flusher within the flush
    /// interval (100 ms, MongoDB's default journal interval); acknowledged
    /// before the sync, so a crash may lose the last interval.
    Batch,
    /// Acknowledged only after the WAL record is synced (group commit: one
    /// fsync serves every command of the writer group).
    #[default]
    Fsync,
}

impl std::str::FromStr for Durability {
    type Err = String;
    fn from_str(s: &str) -> Result<Durability, String> {
        match s {
            "none" => Ok(Durability::None),
            "batch" => Ok(Durability::Batch),
            "fsync" => Ok(Durability::Fsync),
            other => Err(format!(
                "unknown durability '{other}': none, batch or fsync"
            )),
        }
    }
}

/// How long WAL segments are kept as change history by default (24 h).
pub const DEFAULT_CHANGE_RETENTION: Duration = Duration::from_secs(24 * 3600);
/// How many bytes of WAL segments are kept as change history by default
/// (1 GiB; MongoDB sizes its oplog at 5% of the disk, capped at 50 GB).
pub const DEFAULT_CHANGE_RETENTION_BYTES: u64 = 1 << 30;

/// The checkpoint writer's default nice value. A checkpoint is background
/// work with slack (the WAL holds everything until it lands), so on a
/// machine whose cores the writers keep busy it should take the CPU they
/// leave, not a fair share of theirs: at nice 10 the scheduler weighs it
/// ~1/10 of a nice-0 thread when they compete, and gives it whole idle
/// cores. (Checkpoints back to back cost 0.48–0.67× of the writers'
/// throughput at nice 0 on two cores: BENCHMARKS.md, issue #20 item 5.)
pub const DEFAULT_CHECKPOINT_NICE: u8 = 10;

/// Run `work` on its own thread at nice value `nice` (lowering a thread's
/// priority cannot be undone without privileges, so not on the caller's);
/// `nice` 0 runs it on the caller's thread. Where the priority cannot be
/// set, the work runs at the thread's default one: only its share of CPU
/// differs, never its result.
fn at_nice<T: Send>(
    nice: u8,
    dir: &Path,
    work: impl FnOnce() -> Result<T, StorageError> + Send,
) -> Result<T, StorageError> {
    if nice == 0 {
        return work();
    }
    std::thread::scope(|s| {
        let thread = std::thread::Builder::new()
            .name("duet-checkpoint".into())
            .spawn_scoped(s, move || {
                lower_priority(nice);
                work()
            })
            .map_err(|e| StorageError::io("starting the checkpoint thread for", dir, &e))?;
        match thread.join() {
            Ok(r) => r,
            Err(panic) => std::panic::resume_unwind(panic),
        }
    })
}

/// Set the calling thread's nice value (Linux: a per-thread attribute).
fn lower_priority(nice: u8) {
    #[cfg(target_os = "linux")]
    {
        // SAFETY: gettid has no preconditions; setpriority only reads its
        // arguments, and a failure is reported through its return value.
        let done = unsafe {
            let tid = libc::syscall(libc::SYS_gettid) as libc::id_t;
            libc::setpriority(libc::PRIO_PROCESS, tid, i32::from(nice.min(19)))
        };
        if done != 0 {
            tracing::debug!(nice, "could not lower the checkpoint thread's priority");
        }
    }
    #[cfg(not(target_os = "linux"))]
    let _ = nice;
}

/// Options of a durable database.
#[derive(Clone)]
pub struct DurabilityOptions {
    /// Default durability of writes (and `None` = no WAL at all).
    pub mode: Durability,
    /// A WAL segment is closed and a new one started beyond this size.
    pub segment_bytes: u64,
    /// Checkpoint once this many WAL bytes were written since the last one.
    pub checkpoint_wal_bytes: u64,
    /// Checkpoint at least this often while there are new commits.
    pub checkpoint_interval: Option<Duration>,
    /// Run the background checkpointer (size and time triggers).
    pub background_checkpoints: bool,
    /// Sync interval of `batch` writes.
    pub flush_interval: Duration,
    /// The nice value (0–19) of the thread that writes a checkpoint: the
    /// scheduler then gives the writers and readers the CPU first, and the
    /// checkpoint the rest ([`DEFAULT_CHECKPOINT_NICE`]; 0: the same share).
    pub checkpoint_nice: u8,
    /// The file system (tests pass a [`SimFs`]).
    pub vfs: Arc<dyn Vfs>,
    /// Recovery cuts the log at the first damaged record even when valid
    /// records follow, instead of refusing to open. Off by default: with
    /// `fsync` writes, a valid record after damage may have been acknowledged.
    /// With `batch` writes a crash can leave a hole among unsynced records
    /// (writeback out of order); this switch recovers the prefix before it.
    pub accept_damaged_tail: bool,
    /// WAL segments no checkpoint needs any more are kept this long as
    /// change history (for change streams resuming from older positions)…
    pub change_retention: Duration,
    /// …and while they total at most this many bytes (counted as whole
    /// segments of `segment_bytes`); the oldest go first.
    pub change_retention_bytes: u64,
    /// Test-only planted bug: never fsync the WAL.
    #[cfg(feature = "testing")]
    pub skip_wal_fsync: bool,
    /// Test-only planted bug: skip directory fsyncs (after creating a WAL
    /// segment and after the manifest rename).
    #[cfg(feature = "testing")]
    pub skip_dir_fsync: bool,
}

impl DurabilityOptions {
    /// The planted `skip_wal_fsync` bug (always off without the `testing` feature).
    fn skip_wal_fsync(&self) -> bool {
        #[cfg(feature = "testing")]
        return self.skip_wal_fsync;
        #[cfg(not(feature = "testing"))]
        false
    }

    /// The planted `skip_dir_fsync` bug (always off without the `testing` feature).
    fn skip_dir_fsync(&self) -> bool {
        #[cfg(feature = "testing")]
        return self.skip_dir_fsync;
        #[cfg(not(feature = "testing"))]
        false
    }
}

impl Default for DurabilityOptions {
    fn default() -> Self {
        DurabilityOptions {
            mode: Durability::Fsync,
            segment_bytes: 64 << 20,
            checkpoint_wal_bytes: 256 << 20,
            checkpoint_interval: Some(Duration::from_secs(300)),
            background_checkpoints: true,
            flush_interval: Duration::from_millis(100),
            checkpoint_nice: DEFAULT_CHECKPOINT_NICE,
            vfs: Arc::new(RealFs),
            accept_damaged_tail: false,
            change_retention: DEFAULT_CHANGE_RETENTION,
            change_retention_bytes: DEFAULT_CHANGE_RETENTION_BYTES,
            #[cfg(feature = "testing")]
            skip_wal_fsync: false,
            #[cfg(feature = "testing")]
            skip_dir_fsync: false,
        }
    }
}

impl std::fmt::Debug for DurabilityOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DurabilityOptions")
            .field("mode", &self.mode)
            .field("segment_bytes", &self.segment_bytes)
            .field("checkpoint_wal_bytes", &self.checkpoint_wal_bytes)
            .field("checkpoint_interval", &self.checkpoint_interval)
            .field("checkpoint_nice", &self.checkpoint_nice)
            .finish()
    }
}

/// The durable side of one open database.
pub struct Durable {
    dir: PathBuf,
    opts: DurabilityOptions,
    wal: Option<Arc<Wal>>,
    /// The installed manifest; every change to it goes through the store.
    manifest: Arc<ManifestStore>,
    /// Held for a whole checkpoint, so two never interleave (the manifest's
    /// own lock is held only while installing, so rotations never wait for
    /// a checkpoint being written).
    checkpointing: Mutex<()>,
    report: RecoveryReport,
    /// First cluster time of each WAL segment read for change history
    /// (segments never change once full; the active one is not cached).
    first_times: Mutex<std::collections::HashMap<u64, Option<u64>>>,
    /// The locks that keep a second opener out, held as long as this is open.
    _locks: Vec<Arc<dyn DirLock>>,
    /// Checkpoints installed since open, and the last one's figures.
    checkpoint_stats: Mutex<CheckpointStats>,
    /// What the last checkpoint wrote, for the next one to write only what
    /// changed ([`chain`]); `None` after open or a failure: the next one is
    /// written whole. Only touched under `checkpointing`.
    chain: Mutex<Option<chain::Chain>>,
    /// The checkpoint files (csns) each installed checkpoint needs, by its
    /// csn; `None`: not known (kept with every older file until it is no
    /// longer installed).
    needs: Mutex<Vec<(u64, Option<Vec<u64>>)>>,
}

/// Checkpoints installed since the database was opened (metrics).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CheckpointStats {
    pub checkpoints: u64,
    pub micros_total: u64,
    pub last_micros: u64,
    pub last_bytes: u64,
    pub last_csn: u64,
}

pub const LOCK_FILE: &str = "LOCK";

/// How a database directory is kept from a second opener.
#[derive(Clone)]
pub enum Locking {
    /// A database opened on its own: lock `<dir>/LOCK`. When its parent is a
    /// data directory (it has a `LOCK`), lock that as well, so that no server
    /// opens the data directory meanwhile (its databases have no lock of
    /// their own) — and this open fails while one does.
    Own,
    /// A database of a data directory whose lock its `Engine` holds; the
    /// database keeps it alive, so the directory stays locked as long as any
    /// of its databases is open, even after the `Engine` is dropped.
    Held(Arc<dyn DirLock>),
}

impl Locking {
    fn acquire(&self, vfs: &dyn Vfs, dir: &Path) -> Result<Vec<Arc<dyn DirLock>>, StorageError> {
        match self {
            Locking::Held(lock) => Ok(vec![lock.clone()]),
            Locking::Own => {
                let mut locks = vec![lock_dir(vfs, dir)?];
                if let Some(parent) = dir.parent().filter(|p| vfs.exists(&p.join(LOCK_FILE))) {
                    locks.push(lock_dir(vfs, parent)?);
                }
                Ok(locks)
            }
        }
    }
}

/// Take `<dir>/LOCK` (created 0600 when missing); `Locked` naming `dir`
/// when another process or another open in this process holds it.
pub fn lock_dir(vfs: &dyn Vfs, dir: &Path) -> Result<Arc<dyn DirLock>, StorageError> {
    let path = dir.join(LOCK_FILE);
    match vfs.lock(&path) {
        Ok(l) => Ok(Arc::from(l)),
        Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => Err(StorageError::Locked {
            path: dir.to_path_buf(),
        }),
        Err(e) => Err(StorageError::io("lock", &path, &e)),
    }
}

impl Durable {
    /// Lock `dir` as `locking` says, recover its state, and start the WAL.
    /// Returns the state to publish first.
    pub fn open(
        dir: &Path,
        db: &str,
        opts: DurabilityOptions,
        locking: &Locking,
    ) -> Result<(Durable, DbState), StorageError> {
        let vfs = opts.vfs.clone();
        vfs.create_dir_all(dir)
            .map_err(|e| StorageError::io("create directory", dir, &e))?;
        let locks = locking.acquire(&*vfs, dir)?;
        let recovered = recovery::recover(&*vfs, dir, db, opts.accept_damaged_tail)?;
        let (wal, manifest) = start_log(dir, &opts, &recovered)?;
        let Recovered { state, report, .. } = recovered;
        remove_orphan_pins(&*vfs, dir, &manifest.get());
        let m = manifest.get();
        let needs = [m.current, m.previous]
            .into_iter()
            .filter(|&c| c != 0)
            .map(|c| {
                let known = report.checkpoint.as_ref().filter(|(csn, _)| *csn == c);
                (c, known.map(|_| report.checkpoint_files.clone()))
            })
            .collect();
        Ok((
            Durable {
                dir: dir.to_path_buf(),
                opts,
                wal,
                manifest,
                checkpointing: Mutex::new(()),
                report,
                first_times: Mutex::new(Default::default()),
                _locks: locks,
                checkpoint_stats: Mutex::new(CheckpointStats::default()),
                chain: Mutex::new(None),
                needs: Mutex::new(needs),
            },
            state,
        ))
    }

    pub fn wal(&self) -> Option<&Arc<Wal>> {
        self.wal.as_ref()
    }

    pub fn report(&self) -> &RecoveryReport {
        &self.report
    }

    /// Write a checkpoint of `state` and install it; then drop WAL segments
    /// and checkpoints that neither installed checkpoint needs (un-named in
    /// the installed manifest first, deleted after). Returns `None` when
    /// `state` is already the current checkpoint.
    pub fn checkpoint(&self, state: &DbState) -> Result<Option<CheckpointInfo>, StorageError> {
        let vfs = &*self.opts.vfs;
        let _one = self.checkpointing.lock();
        let current = self.manifest.get().current;
        if state.csn == current || state.csn == 0 {
            return Ok(None);
        }
        debug_assert!(state.csn > current, "checkpoints follow published states");
        let t0 = Instant::now();
        let mut chain = self.chain.lock();
        // Taken: a failure below leaves none, so the next one is written whole.
        let prev = chain.take();
        let written = at_nice(self.opts.checkpoint_nice, &self.dir, || {
            chain::write(vfs, &self.dir, state, prev.as_ref())
        })?;
        drop(prev);
        let info = written.info.clone();
        let synced = self.wal.as_ref().map_or(0, |w| w.synced_lsn());
        // Ages of the segments that may expire, read before taking the
        // manifest's lock (a segment's newest change is older than the next
        // segment's first).
        let ends = self.segment_ends();
        let installed = self.manifest.update(|m| {
            m.previous = m.current;
            m.current = state.csn;
            m.synced_lsn = m.synced_lsn.max(synced);
            let unneeded = drop_obsolete_segments(m);
            m.history.extend(unneeded);
            self.expire_history(m, &ends)
        });
        let obsolete = match installed {
            Ok(o) => o,
            Err(e) => {
                // The old manifest may or may not be the one on disk; both name
                // complete checkpoints and nothing has been deleted, so either is fine.
                tracing::warn!(error = %e, "checkpoint not installed");
                return Err(e);
            }
        };
        if let Some(w) = &self.wal {
            w.bytes_since_checkpoint.store(0, Ordering::Relaxed);
        }
        {
            let m = self.manifest.get();
            let mut needs = self.needs.lock();
            needs.retain(|(c, _)| *c == m.previous);
            needs.push((state.csn, Some(written.chain.files())));
        }
        let full = written.full;
        *chain = Some(written.chain);
        drop(chain);
        self.remove_obsolete(&obsolete, &self.manifest.get());
        {
            let us = t0.elapsed().as_micros().min(u128::from(u64::MAX)) as u64;
            let mut st = self.checkpoint_stats.lock();
            st.checkpoints += 1;
            st.micros_total = st.micros_total.saturating_add(us);
            st.last_micros = us;
            st.last_bytes = info.bytes;
            st.last_csn = info.csn;
        }
        tracing::info!(
            csn = info.csn, bytes = info.bytes, documents = info.documents, full,
            elapsed = ?t0.elapsed(), "checkpoint installed"
        );
        Ok(Some(info))
    }

    /// Checkpoints installed since open.
    pub fn checkpoint_stats(&self) -> CheckpointStats {
        *self.checkpoint_stats.lock()
    }

    /// Every WAL segment still on disk for change history, oldest first.
    fn log_segments(&self) -> Vec<u64> {
        let m = self.manifest.get();
        let mut all = m.history;
        all.extend(m.segments.unwrap_or_default());
        all
    }

    /// For each segment but the last: the time of the next segment's first
    /// record (every change in the segment is older), when known.
    fn segment_ends(&self) -> Vec<(u64, Option<u64>)> {
        let all = self.log_segments();
        let n = all.len();
        all.windows(2)
            .enumerate()
            .map(|(i, w)| {
                let next = self.segment_first_time(w[1], i + 2 == n).ok().flatten();
                (w[0], next)
            })
            .collect()
    }

    /// Drop history segments past the retention window or byte budget from
    /// `m` (oldest first); returns them (deleted once `m` is installed).
    fn expire_history(&self, m: &mut Manifest, ends: &[(u64, Option<u64>)]) -> Vec<u64> {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default()
            .as_secs();
        let horizon = now.saturating_sub(self.opts.change_retention.as_secs());
        let budget = (self.opts.change_retention_bytes / self.opts.segment_bytes.max(1)) as usize;
        let mut expired = Vec::new();
        while let Some(&oldest) = m.history.first() {
            let end = ends
                .iter()
                .find(|(f, _)| *f == oldest)
                .and_then(|(_, t)| *t);
            let too_old = end.is_some_and(|t| (t >> 32) < horizon);
            if m.history.len() > budget || too_old {
                expired.push(m.history.remove(0));
            } else {
                break;
            }
        }
        expired
    }

    /// The first cluster time in segment `first` (`None`: no version-2 record).
    fn segment_first_time(&self, first: u64, active: bool) -> Result<Option<u64>, StorageError> {
        if let Some(t) = self.first_times.lock().get(&first) {
            return Ok(*t);
        }
        let bytes = changes::history::read_segment(&*self.opts.vfs, &self.dir, first)?;
        let t = changes::history::first_time(&bytes);
        if !active || t.is_some() {
            self.first_times.lock().insert(first, t);
        }
        Ok(t)
    }

    /// Every record of this database with a cluster time above the returned
    /// one is still in the log (`Ok(0)`: the whole history). Conservative by
    /// at most one time step: the record before the oldest retained one had
    /// a time at most 2 below it (times are even and strictly increasing).
    ///
    /// A history segment that is gone (a crash kept the deletion of an
    /// expired segment but not the manifest that un-named it; recovery does
    /// not need it) shortens the history to the segments after it.
    pub fn history_floor(&self) -> Result<u64, StorageError> {
        let segments = self.log_segments();
        let start = self.first_present(&segments);
        let Some(&oldest) = segments.get(start) else {
            return Ok(0);
        };
        if oldest <= 1 {
            return Ok(0);
        }
        let active = start + 1 == segments.len();
        Ok(match self.segment_first_time(oldest, active)? {
            Some(t) => t.saturating_sub(2),
            // Version-1 records only (or none): nothing older had a time.
            None => 0,
        })
    }

    /// The index of the oldest segment of `segments` from which on every
    /// segment is on disk (the live ones always are: recovery checked).
    fn first_present(&self, segments: &[u64]) -> usize {
        let vfs = &*self.opts.vfs;
        segments
            .iter()
            .rposition(|f| !vfs.exists(&self.dir.join(wal::segment_name(*f))))
            .map_or(0, |i| i + 1)
    }

    /// The change records of this database (named `db`) with a time in
    /// `(after, upto]` read back from the log, oldest first, at most `max`;
    /// the flag says more remain `<= upto`.
    pub fn read_changes(
        &self,
        db: &Arc<str>,
        after: u64,
        upto: u64,
        max: usize,
    ) -> Result<(Vec<changes::ChangeRecord>, bool), StorageError> {
        let segments = self.log_segments();
        let n = segments.len();
        // Callers check `history_floor` first: nothing they ask for is in a
        // missing segment or before it.
        let present = self.first_present(&segments);
        let mut start = present;
        for i in (present..n).rev() {
            match self.segment_first_time(segments[i], i + 1 == n)? {
                Some(t) if t <= after => {
                    start = i;
                    break;
                }
                None if i + 1 < n => {
                    start = i + 1;
                    break;
                }
                _ => {}
            }
        }
        let mut out = Vec::new();
        for (i, first) in segments.iter().enumerate().skip(start) {
            if i + 1 == n {
                // `batch` records may still wait in memory: write them out.
                if let Some(w) = &self.wal {
                    w.flush()?;
                }
            }
            let bytes = changes::history::read_segment(&*self.opts.vfs, &self.dir, *first)?;
            let (recs, more) =
                changes::history::records_in(&bytes, db, after, upto, max - out.len());
            out.extend(recs);
            if more || out.len() >= max {
                return Ok((out, true));
            }
        }
        Ok((out, false))
    }

    /// The durable named snapshots the manifest records.
    pub fn pins(&self) -> Vec<Pin> {
        self.manifest.get().pins
    }

    /// Make a named snapshot durable: write `state` (the snapshot's held
    /// state, already restricted to its collections) as a checkpoint image to
    /// its own file, then install a manifest recording it. The writer is never
    /// paused (the image is written from the held `cow` state). On error
    /// nothing is recorded: the image is removed, and the manifest on disk is
    /// the old one — except when only the final directory fsync failed, where
    /// it may name the complete image (a crash then keeps the snapshot).
    ///
    /// The caller guarantees that `name` is not pinned already.
    pub fn pin(
        &self,
        name: &str,
        state: &DbState,
        collections: Option<Vec<String>>,
        created_ms: u64,
        ttl_ms: u64,
    ) -> Result<Pin, StorageError> {
        let vfs = &*self.opts.vfs;
        let file = self.image_name(name, state.csn);
        let t0 = Instant::now();
        let info = checkpoint::write_as(vfs, &self.dir, &file, state)?;
        let pin = Pin {
            name: name.to_string(),
            csn: state.csn,
            file,
            created_ms,
            ttl_ms,
            collections,
        };
        let pin = self.record_pin(pin)?;
        tracing::info!(
            snapshot = name, csn = info.csn, bytes = info.bytes, documents = info.documents,
            elapsed = ?t0.elapsed(), "durable snapshot pinned"
        );
        Ok(pin)
    }

    /// A new file name for the image of named snapshot `name` at `csn`
    /// (`snap-*`, unique).
    pub fn image_name(&self, name: &str, csn: u64) -> String {
        manifest::pin_file_name(name, csn, unique_id())
    }

    /// Install a manifest recording `pin`, whose image is complete under its
    /// final name in this directory: the directory is synced first (the
    /// image's name must be durable before a manifest naming it can be:
    /// unlike a regular checkpoint, a pin has no fallback — found by the
    /// reordered-subset crash images). On error the image is removed unless
    /// the manifest may name it ([`Durable::pin`]).
    fn record_pin(&self, pin: Pin) -> Result<Pin, StorageError> {
        let vfs = &*self.opts.vfs;
        let path = self.dir.join(&pin.file);
        if !self.opts.skip_dir_fsync() {
            if let Err(e) = vfs.sync_dir(&self.dir) {
                let _ = vfs.remove(&path);
                return Err(StorageError::io("fsync directory", &self.dir, &e));
            }
        }
        let installed = self.manifest.update(|m| {
            debug_assert!(m.pins.iter().all(|p| p.name != pin.name), "pinned twice");
            m.pins.retain(|p| p.name != pin.name);
            m.pins.push(pin.clone());
        });
        if let Err(e) = installed {
            tracing::warn!(snapshot = %pin.name, error = %e, "durable snapshot not installed");
            if !maybe_installed(&e) {
                let _ = vfs.remove(&path);
            }
            return Err(e);
        }
        Ok(pin)
    }

    /// Take the checkpoint image at `from` (a complete, synced file on this
    /// directory's file system: moved, not copied) as the image of the named
    /// snapshot `pin` describes, under `pin.file` (a name from
    /// [`Durable::image_name`]). `durable`: recorded in the manifest as
    /// [`Durable::pin`] records its image (on error nothing is recorded and
    /// the image is removed). Otherwise it is not recorded: it is read like a
    /// pin's image while its snapshot is held, removed with
    /// [`Durable::remove_image`] when it is not, and at the next open as an
    /// image no manifest names — a snapshot that is not durable does not
    /// survive a restart. How a replica-set member installs the named
    /// snapshots of a Raft snapshot.
    ///
    /// The caller guarantees that `pin.name` is not pinned already.
    pub fn adopt_image(&self, from: &Path, pin: Pin, durable: bool) -> Result<Pin, StorageError> {
        let to = self.dir.join(&pin.file);
        self.opts
            .vfs
            .rename(from, &to)
            .map_err(|e| StorageError::io("rename", from, &e))?;
        if durable {
            self.record_pin(pin)
        } else {
            Ok(pin)
        }
    }

    /// Remove the image file `file` of a named snapshot no manifest records
    /// ([`Durable::adopt_image`] with `durable: false`), best effort: one
    /// left behind is removed at the next open.
    pub fn remove_image(&self, file: &str) {
        let path = self.dir.join(file);
        match self.opts.vfs.remove(&path) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => {
                tracing::warn!(path = %path.display(), error = %e, "could not remove a dropped snapshot's image; it is removed at the next open")
            }
        }
    }

    /// The file system and path of the image file `file`, to copy it
    /// ([`crate::snapshot::named::NamedCopy`]).
    pub fn image_file(&self, file: &str) -> (Arc<dyn io::Vfs>, PathBuf) {
        (self.opts.vfs.clone(), self.dir.join(file))
    }

    /// Forget the durable snapshot `name` whose image is `file`: install a
    /// manifest without it, then delete the file (best effort: a file left
    /// behind is removed at the next open). `Ok(false)` when it is not pinned
    /// (any more).
    pub fn unpin(&self, name: &str, file: &str) -> Result<bool, StorageError> {
        let vfs = &*self.opts.vfs;
        let pinned = self.manifest.update(|m| {
            let before = m.pins.len();
            m.pins.retain(|p| !(p.name == name && p.file == file));
            m.pins.len() != before
        })?;
        if !pinned {
            return Ok(false);
        }
        let path = self.dir.join(file);
        if let Err(e) = vfs.remove(&path) {
            tracing::warn!(path = %path.display(), error = %e, "could not remove a dropped snapshot's image; it is removed at the next open");
        }
        Ok(true)
    }

    /// Load the image of a pinned snapshot. A missing, damaged or mismatched
    /// file is a `SnapshotUnreadable` error naming the snapshot and the file.
    pub fn load_pin(&self, pin: &Pin, db: &str) -> Result<DbState, StorageError> {
        let vfs = &*self.opts.vfs;
        let path = self.dir.join(&pin.file);
        let unreadable = |cause: StorageError| StorageError::SnapshotUnreadable {
            name: pin.name.clone(),
            cause: Box::new(cause),
        };
        if !vfs.exists(&path) {
            return Err(unreadable(StorageError::Missing {
                path,
                what: "the image of a durable snapshot named by MANIFEST".into(),
            }));
        }
        let state = checkpoint::load(vfs, &path, db).map_err(unreadable)?;
        if state.csn != pin.csn {
            return Err(unreadable(StorageError::corrupt(
                &path,
                0,
                format!("holds csn {} instead of {}", state.csn, pin.csn),
            )));
        }
        if let Some(cs) = &pin.collections {
            if state.collections.len() != cs.len()
                || cs.iter().any(|c| !state.collections.contains_key(c))
            {
                return Err(unreadable(StorageError::corrupt(
                    &path,
                    0,
                    "its collections differ from those MANIFEST records",
                )));
            }
        }
        Ok(state)
    }

    /// Delete the segments `obsolete` (no longer named by the installed
    /// manifest `m`) and checkpoints `m` does not name (best effort: a file
    /// left behind is removed at the next checkpoint or open).
    fn remove_obsolete(&self, obsolete: &[u64], m: &Manifest) {
        let vfs = &*self.opts.vfs;
        for first in obsolete {
            let path = self.dir.join(wal::segment_name(*first));
            if let Err(e) = vfs.remove(&path) {
                tracing::warn!(path = %path.display(), error = %e, "could not remove WAL segment");
            }
        }
        // The files the installed checkpoints need: a chained checkpoint
        // (format 5) needs older files too; one whose needs are unknown
        // keeps every file up to its own.
        let needs = self.needs.lock().clone();
        let needed = |csn: u64| {
            csn == m.current
                || csn == m.previous
                || needs.iter().any(|(c, files)| {
                    (*c == m.current || *c == m.previous)
                        && match files {
                            Some(f) => f.contains(&csn),
                            None => csn <= *c,
                        }
                })
        };
        if let Ok(names) = vfs.list(&self.dir) {
            for n in names {
                let stale = match checkpoint::parse_checkpoint_name(&n) {
                    Some(csn) => !needed(csn),
                    None => n.starts_with("ckpt-") && n.ends_with(".tmp"),
                };
                if stale {
                    let _ = vfs.remove(&self.dir.join(&n));
                }
            }
        }
    }

    /// Whether the size or time trigger says a checkpoint is due.
    fn checkpoint_due(&self, last: Instant, csn: u64) -> bool {
        if csn == self.manifest.get().current {
            return false;
        }
        let by_size = self.wal.as_ref().is_some_and(|w| {
            w.bytes_since_checkpoint.load(Ordering::Relaxed) >= self.opts.checkpoint_wal_bytes
        });
        let by_time = self
            .opts
            .checkpoint_interval
            .is_some_and(|i| last.elapsed() >= i);
        by_size || by_time
    }

    /// Sync the WAL at close (batch-mode writes since the last flush), then
    /// record in the manifest how far the log is synced: after a clean close
    /// any damage to the log's last records is detected at the next open, not
    /// mistaken for a write torn by a crash.
    pub fn close(&self) {
        if let Some(w) = &self.wal {
            if let Err(e) = w.flush() {
                tracing::error!(error = %e, "final WAL sync failed");
            }
            let synced = w.synced_lsn();
            if let Err(e) = self
                .manifest
                .update(|m| m.synced_lsn = m.synced_lsn.max(synced))
            {
                tracing::warn!(error = %e, "could not record the synced end of the log at close");
            }
        }
    }
}

/// Start the log after recovery and install the manifest that names its
/// segments (the v3 upgrade of an older manifest happens here too; nothing
/// is written when the manifest is already right). The log continues at the
/// end of the last segment, which recovery replayed, cut and synced; with no
/// segment a first one is rolled: created before, and written to only after,
/// the install that names it.
fn start_log(
    dir: &Path,
    opts: &DurabilityOptions,
    rec: &Recovered,
) -> Result<(Option<Arc<Wal>>, Arc<ManifestStore>), StorageError> {
    let vfs = opts.vfs.clone();
    let store = Arc::new(ManifestStore::new(
        vfs.clone(),
        dir,
        opts.skip_dir_fsync(),
        rec.report.manifest.clone(),
    ));
    let csn = rec.state.csn;
    let name = |m: &mut Manifest, segments: Vec<u64>| {
        m.segments = Some(segments);
        // Only lowers when the operator accepted a shorter log.
        m.synced_lsn = m.synced_lsn.min(csn);
    };
    let walopts = WalOptions {
        segment_bytes: opts.segment_bytes,
        skip_fsync: opts.skip_wal_fsync(),
        skip_dir_fsync: opts.skip_dir_fsync(),
    };
    if opts.mode == Durability::None {
        store.update(|m| name(m, rec.segments.clone()))?;
        return Ok((None, store));
    }
    if let Some(tail) = rec.tail {
        store.update(|m| name(m, rec.segments.clone()))?;
        let wal = Wal::resume(vfs, dir, csn + 1, tail, walopts, store.clone())?;
        return Ok((Some(Arc::new(wal)), store));
    }
    // No segment to continue (none yet, or the last one's records end
    // before a checkpoint taken without a log): roll one at `csn + 1`.
    let wal = Wal::start(vfs.clone(), dir, csn + 1, walopts, store.clone())?;
    let mut segments = rec.segments.clone();
    segments.push(csn + 1);
    if let Err(e) = store.update(|m| name(m, segments)) {
        if !maybe_installed(&e) {
            // Unnamed and empty: removing it loses nothing.
            let _ = vfs.remove(&dir.join(wal::segment_name(csn + 1)));
        }
        return Err(e);
    }
    Ok((Some(Arc::new(wal)), store))
}

/// Un-name the segments of `m` that neither installed checkpoint needs and
/// return them (their files are deleted after `m` is installed). Segment `i`
/// holds commits `first_i ..= first_{i+1} - 1`; recovery may fall back to
/// `previous` (with none, to the empty state, so nothing goes); the last
/// segment, the one being written, always stays.
fn drop_obsolete_segments(m: &mut Manifest) -> Vec<u64> {
    let base = m.previous;
    let Some(segments) = m.segments.as_mut() else {
        return Vec::new();
    };
    if base == 0 || segments.len() < 2 {
        return Vec::new();
    }
    let keep_from = segments
        .windows(2)
        .position(|w| w[1] > base + 1)
        .unwrap_or(segments.len() - 1);
    segments.drain(..keep_from).collect()
}

/// A process-unique id for pinned-snapshot file names (time-seeded, so ids
/// of different runs differ too).
fn unique_id() -> u64 {
    use std::sync::atomic::AtomicU64;
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    t.wrapping_add(NEXT.fetch_add(1, Ordering::Relaxed))
}

/// Remove `snap-*` files the manifest does not name, and their temporaries
/// (best effort; the directory lock is held).
fn remove_orphan_pins(vfs: &dyn Vfs, dir: &Path, m: &Manifest) {
    let Ok(names) = vfs.list(dir) else { return };
    for n in names {
        if !n.starts_with("snap-") {
            continue;
        }
        let orphan = n.ends_with(".tmp") || !m.pins.iter().any(|p| p.file == n);
        if orphan {
            let path = dir.join(&n);
            match vfs.remove(&path) {
                Ok(()) => {
                    tracing::info!(path = %path.display(), "removed an image no durable snapshot names")
                }
                Err(e) => {
                    tracing::warn!(path = %path.display(), error = %e, "could not remove an orphaned snapshot image")
                }
            }
        }
    }
}

/// Whether the OS reported the disk as full.
pub fn is_no_space(e: &crate::error::Error) -> bool {
    matches!(e, crate::error::Error::Storage(s) if s.is_no_space())
}

#[cfg(all(test, target_os = "linux"))]
mod tests {
    use super::*;

    fn this_thread() -> (i64, i32) {
        // SAFETY: gettid and getpriority only read their arguments.
        unsafe {
            let tid = libc::syscall(libc::SYS_gettid);
            (
                tid,
                libc::getpriority(libc::PRIO_PROCESS, tid as libc::id_t),
            )
        }
    }

    #[test]
    fn checkpoint_work_runs_at_a_lower_priority_and_returns_its_result() {
        let (caller, caller_nice) = this_thread();
        let dir = Path::new("/nonexistent");
        // Nice 0: on the caller's thread, untouched.
        let (tid, nice) = at_nice(0, dir, || Ok(this_thread())).expect("nice 0");
        assert_eq!((tid, nice), (caller, caller_nice));
        // Nice 10: another thread, at 10 (or at the process's nice, when that
        // is already lower in priority: raising it needs a privilege).
        let (tid, nice) = at_nice(10, dir, || Ok(this_thread())).expect("nice 10");
        assert_ne!(tid, caller);
        assert_eq!(nice, caller_nice.max(10));
        assert_eq!(
            this_thread().1,
            caller_nice,
            "the caller keeps its priority"
        );
        // The work's error comes back as it was.
        let e = at_nice(10, dir, || -> Result<(), StorageError> {
            Err(StorageError::corrupt(Path::new("x"), 7, "planted"))
        })
        .expect_err("the work's error");
        assert!(matches!(e, StorageError::Corrupt { offset: 7, .. }), "{e}");
    }
}
