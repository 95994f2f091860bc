//! A process-wide bound on the file descriptors [`RealFs`](super::io::RealFs)
//! keeps open for appendable files (WAL segments, and checkpoint, snapshot
//! and manifest files while they are written).
//!
//! Why: every open database has a WAL segment open for appends, so a server
//! with thousands of databases would hold thousands of descriptors and, under
//! the common 1,024 `RLIMIT_NOFILE`, fail to open more — or to restart. Like
//! LevelDB's table cache (`max_open_files`), files here are handles that
//! own a descriptor only while recently used: the least recently used one is
//! closed when more than [`max_open_files`] are open, and reopened by path on
//! its next operation. Reads (`Vfs::read`), directory syncs and locks open
//! and close their descriptors within the call and are not counted.
//!
//! Invariants:
//! - at most `max_open_files` descriptors are held by files no operation is
//!   using; a file whose operation is running (its slot lock is held) is
//!   never closed under it, so the total is at most the bound plus the number
//!   of threads inside a file operation at that moment;
//! - a file is closed only after the bytes appended to it were synced
//!   (`fdatasync`): Linux reports a writeback error to an `fsync` through a
//!   descriptor that was open when the error happened, not necessarily to
//!   one opened later. If that sync fails the error is kept and every later
//!   `sync` of the file returns it, so the WAL stops exactly as after a
//!   failed fsync of its own (fsyncgate);
//! - a file is reopened by its path, so it must not be renamed or removed
//!   while its handle is used: WAL segments are never renamed, and
//!   temporaries are renamed only after their last write and sync. A reopen
//!   that finds another file at the path (a dropped database's directory
//!   recreated) fails instead of writing into it: the file's identity
//!   (device, inode) is checked.

use std::collections::BTreeMap;
use std::fs::{File, OpenOptions};
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock, Weak};

use parking_lot::Mutex;

use super::io::VFile;

/// Default bound on cached descriptors, lowered to a quarter of the soft
/// `RLIMIT_NOFILE` when that is smaller (connections need descriptors too).
pub const DEFAULT_MAX_OPEN_FILES: usize = 256;
/// The bound never goes below this (a WAL rotation briefly needs two files).
pub const MIN_MAX_OPEN_FILES: usize = 4;

/// Set the bound on descriptors kept open for appendable files (process
/// wide; 0 restores the default). Takes effect at the next file operation.
pub fn set_max_open_files(n: usize) {
    CACHE.max_open.store(n, Ordering::Relaxed);
}

/// The bound in effect (see [`DEFAULT_MAX_OPEN_FILES`]).
pub fn max_open_files() -> usize {
    CACHE.bound()
}

/// Descriptors the cache holds open now.
pub fn open_files() -> usize {
    CACHE.lru.lock().open.len()
}

static CACHE: FdCache = FdCache::new();

/// The cache: an LRU of the files holding a descriptor, keyed by a use tick.
pub struct FdCache {
    /// 0 = the default.
    max_open: AtomicUsize,
    lru: Mutex<Lru>,
}

struct Lru {
    tick: u64,
    /// Use tick → the file holding a descriptor; oldest first.
    open: BTreeMap<u64, Weak<CachedFile>>,
}

impl FdCache {
    const fn new() -> FdCache {
        FdCache {
            max_open: AtomicUsize::new(0),
            lru: parking_lot::const_mutex(Lru {
                tick: 0,
                open: BTreeMap::new(),
            }),
        }
    }

    fn bound(&self) -> usize {
        match self.max_open.load(Ordering::Relaxed) {
            0 => default_bound(),
            n => n.max(MIN_MAX_OPEN_FILES),
        }
    }

    /// Record a use of `me` (whose slot lock the caller holds and which holds
    /// a descriptor) and close the least recently used others beyond the bound.
    fn touch(&self, me: &Weak<CachedFile>, slot: &mut Slot) {
        let bound = self.bound();
        let victims: Vec<(u64, Weak<CachedFile>)> = {
            let mut lru = self.lru.lock();
            if let Some(k) = slot.key.take() {
                lru.open.remove(&k);
            }
            lru.tick += 1;
            let k = lru.tick;
            lru.open.insert(k, me.clone());
            slot.key = Some(k);
            let excess = lru.open.len().saturating_sub(bound);
            let oldest: Vec<u64> = lru
                .open
                .keys()
                .copied()
                .filter(|key| *key != k)
                .take(excess)
                .collect();
            oldest
                .into_iter()
                .filter_map(|key| lru.open.remove(&key).map(|w| (key, w)))
                .collect()
        };
        for (key, weak) in victims {
            let Some(v) = weak.upgrade() else { continue };
            // A file in use is left alone: its operation re-registers it when
            // it ends (the bound is briefly exceeded by the files in use).
            let Some(mut s) = v.slot.try_lock() else {
                continue;
            };
            // Used again since it was picked: it is registered under a newer
            // key and is no longer the least recently used.
            if s.key == Some(key) {
                s.key = None;
                v.close(&mut s);
            }
        }
    }

    fn forget(&self, slot: &mut Slot) {
        if let Some(k) = slot.key.take() {
            self.lru.lock().open.remove(&k);
        }
    }
}

fn default_bound() -> usize {
    static BOUND: OnceLock<usize> = OnceLock::new();
    *BOUND.get_or_init(|| match soft_nofile_limit() {
        Some(limit) => (limit / 4).clamp(MIN_MAX_OPEN_FILES, DEFAULT_MAX_OPEN_FILES),
        None => DEFAULT_MAX_OPEN_FILES,
    })
}

#[cfg(unix)]
fn soft_nofile_limit() -> Option<usize> {
    let mut r = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes into the struct we pass and reads nothing else.
    let rc = unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut r) };
    if rc != 0 || r.rlim_cur == libc::RLIM_INFINITY {
        return None;
    }
    usize::try_from(r.rlim_cur).ok()
}

#[cfg(not(unix))]
fn soft_nofile_limit() -> Option<usize> {
    None
}

#[cfg(unix)]
fn identity(f: &File) -> Option<(u64, u64)> {
    use std::os::unix::fs::MetadataExt;
    f.metadata().ok().map(|m| (m.dev(), m.ino()))
}

#[cfg(not(unix))]
fn identity(_f: &File) -> Option<(u64, u64)> {
    None
}

struct Slot {
    file: Option<File>,
    /// This file's key in the LRU while it holds a descriptor.
    key: Option<u64>,
    /// Bytes were appended since the last successful sync.
    dirty: bool,
    /// A sync made before closing the descriptor failed: reported by every
    /// later `sync` (the bytes may never reach the disk).
    failed: Option<(io::ErrorKind, String)>,
}

/// An appendable file whose descriptor the cache may close and reopen.
pub struct CachedFile {
    path: PathBuf,
    /// (device, inode) of the file, where the platform has them.
    identity: Option<(u64, u64)>,
    me: Weak<CachedFile>,
    slot: Mutex<Slot>,
}

impl CachedFile {
    /// Wrap a file just opened for appending at `path`.
    pub fn new(path: &Path, file: File) -> Arc<CachedFile> {
        let identity = identity(&file);
        let f = Arc::new_cyclic(|me| CachedFile {
            path: path.to_path_buf(),
            identity,
            me: me.clone(),
            slot: Mutex::new(Slot {
                file: Some(file),
                key: None,
                dirty: false,
                failed: None,
            }),
        });
        {
            let mut s = f.slot.lock();
            CACHE.touch(&f.me, &mut s);
        }
        f
    }

    /// Run `op` on the descriptor, reopening it first when it was closed.
    fn with_file<R>(&self, op: impl FnOnce(&File, &mut bool) -> io::Result<R>) -> io::Result<R> {
        let mut s = self.slot.lock();
        if s.file.is_none() {
            let f = OpenOptions::new().append(true).open(&self.path)?;
            if identity(&f) != self.identity {
                return Err(io::Error::new(
                    io::ErrorKind::NotFound,
                    format!(
                        "{} was removed and another file now has its name",
                        self.path.display()
                    ),
                ));
            }
            s.file = Some(f);
        }
        let r = match &mut *s {
            Slot {
                file: Some(f),
                dirty,
                ..
            } => op(f, dirty),
            _ => Err(io::Error::other("file descriptor missing after reopening")),
        };
        CACHE.touch(&self.me, &mut s);
        r
    }

    /// Sync (when dirty) and close the descriptor. Requires: `s` is this
    /// file's slot, locked by the caller, and no longer in the LRU.
    fn close(&self, s: &mut Slot) {
        let Some(file) = s.file.take() else { return };
        if s.dirty {
            match file.sync_data() {
                Ok(()) => s.dirty = false,
                Err(e) => {
                    tracing::error!(path = %self.path.display(), error = %e, "fsync before closing an idle file failed; its next sync reports it");
                    s.failed.get_or_insert((e.kind(), e.to_string()));
                }
            }
        }
        drop(file);
    }
}

impl VFile for CachedFile {
    fn append(&self, buf: &[u8]) -> io::Result<()> {
        self.with_file(|mut f, dirty| {
            *dirty = true;
            f.write_all(buf)
        })
    }

    fn sync(&self) -> io::Result<()> {
        {
            let s = self.slot.lock();
            if let Some((kind, msg)) = &s.failed {
                return Err(io::Error::new(
                    *kind,
                    format!("an earlier fsync (before closing an idle descriptor) failed: {msg}"),
                ));
            }
            if s.file.is_none() && !s.dirty {
                // Closed after a successful sync, and nothing appended since.
                return Ok(());
            }
        }
        self.with_file(|f, dirty| {
            // fdatasync also persists a grown file size, which is all appends change.
            f.sync_data()?;
            *dirty = false;
            Ok(())
        })
    }

    fn set_len(&self, len: u64) -> io::Result<()> {
        self.with_file(|f, _| f.set_len(len))
    }
}

impl Drop for CachedFile {
    fn drop(&mut self) {
        CACHE.forget(self.slot.get_mut());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn closed_files_reopen_and_keep_their_bytes() {
        let dir = std::env::temp_dir().join(format!("duet-fdcache-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        // Files beyond the bound get their descriptors closed; every one still
        // appends and syncs, and ends with exactly what was appended.
        let n = DEFAULT_MAX_OPEN_FILES + 40;
        let files: Vec<Arc<CachedFile>> = (0..n)
            .map(|i| {
                let p = dir.join(format!("f{i}"));
                let f = OpenOptions::new()
                    .append(true)
                    .create(true)
                    .truncate(false)
                    .open(&p)
                    .expect("open");
                CachedFile::new(&p, f)
            })
            .collect();
        for round in 0..3u8 {
            for f in &files {
                f.append(&[round]).expect("append");
            }
        }
        files[0].sync().expect("sync");
        // Other tests of this binary may be inside a file operation (each
        // may hold one descriptor beyond the bound while it runs).
        assert!(open_files() <= max_open_files() + 16, "{}", open_files());
        for i in 0..n {
            let bytes = std::fs::read(dir.join(format!("f{i}"))).expect("read");
            assert_eq!(bytes, vec![0, 1, 2], "file {i}");
        }
        drop(files);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
