//! Spill files of external sorts: sorted runs of raw documents written to a
//! private temporary directory and read back once, in order.
//!
//! Owns: the spill directory's creation (mode 0700), the removal of the
//! per-process temporary one after use, startup cleanup
//! ([`clear_dir`]), run files (mode 0600, [`RunWriter`] / [`RunReader`]),
//! [`Spool`] (documents appended once and read back by position, in memory
//! up to a byte limit, then in one run file), and the process-wide spill
//! figures ([`spill_stats`]).
//!
//! A run file is a sequence of `tie u64 LE | BSON document` records (the
//! document starts with its own little-endian `i32` length; the tie is the
//! sorter's tie-breaker, kept so a merge orders equal keys as memory would);
//! nothing else — it lives for one query only, is never synced, and no format
//! version is kept.
//!
//! Invariants:
//! - the directory is created 0700 and every file 0600 (`create_new`), whatever
//!   the umask: spilled documents are as private as the data files;
//! - on unix a run file is unlinked as soon as it is created: it exists only
//!   as long as its descriptor, so a query that ends, fails, is cancelled or
//!   panics — or a process that crashes — leaves no file behind. Elsewhere the
//!   file is removed when its writer or reader is dropped. [`clear_dir`]
//!   removes leftovers (`run-*`) when a database opens, for the window
//!   between create and unlink;
//! - reading a run never panics on its bytes: a damaged length is an error;
//! - a [`Spool`] holds at most its limit of document bytes in memory; past it
//!   every document it holds is in its file (none in memory), and what it
//!   keeps per document is one `u64` offset (plus one read chunk of at least
//!   [`READ_BUFFER`] bytes). A spool file is one "run" of [`spill_stats`].
//!
//! File I/O here goes straight to `std::fs`, not through the durability
//! layer's `Vfs`: spill files carry no durable state, so crash images of them
//! have nothing to prove, and the query layer sits below durability.

use std::fs::{File, OpenOptions};
use std::io::{BufReader, BufWriter, Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;

use bson::raw::{RawDocument, RawDocumentBuf};

use crate::doc::DocRef;
use crate::error::{Error, Result, StorageError};
use crate::query::limits::default_temp_spill_dir;

/// Bytes buffered per run while writing it.
const WRITE_BUFFER: usize = 256 * 1024;
/// Bytes buffered per run while merging (one such buffer per open run).
const READ_BUFFER: usize = 64 * 1024;
/// Name prefix of run files (what [`clear_dir`] removes).
const RUN_PREFIX: &str = "run-";

static RUNS_WRITTEN: AtomicU64 = AtomicU64::new(0);
static BYTES_WRITTEN: AtomicU64 = AtomicU64::new(0);
static NEXT_RUN: AtomicU64 = AtomicU64::new(0);
/// Spills of this process between creating their directory and unlinking
/// their new file (see [`create_file`]).
static CREATING: AtomicUsize = AtomicUsize::new(0);

/// Spill figures since the process started (serverStatus, tests).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SpillStats {
    /// Sorted runs written to disk.
    pub runs: u64,
    /// Document bytes written to them.
    pub bytes: u64,
}

/// What external sorts spilled so far in this process.
pub fn spill_stats() -> SpillStats {
    SpillStats {
        runs: RUNS_WRITTEN.load(Ordering::Relaxed),
        bytes: BYTES_WRITTEN.load(Ordering::Relaxed),
    }
}

fn io_error(op: &'static str, path: &Path, e: &std::io::Error) -> Error {
    Error::from(StorageError::io(op, path, e))
}

/// Create `dir` (and missing parents) and make it 0700.
fn create_dir(dir: &Path) -> std::io::Result<()> {
    let mut b = std::fs::DirBuilder::new();
    b.recursive(true);
    #[cfg(unix)]
    std::os::unix::fs::DirBuilderExt::mode(&mut b, 0o700);
    b.create(dir)?;
    // An existing directory keeps its mode under `create`: set it.
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))?;
    }
    Ok(())
}

/// Remove run files left in `dir` by a process that crashed; a missing
/// directory is fine. Returns how many were removed.
pub fn clear_dir(dir: &Path) -> Result<usize> {
    let entries = match std::fs::read_dir(dir) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(0),
        Err(e) => return Err(io_error("list spill directory", dir, &e)),
    };
    let mut removed = 0;
    for entry in entries.flatten() {
        let name = entry.file_name();
        if name.to_string_lossy().starts_with(RUN_PREFIX) {
            let path = entry.path();
            std::fs::remove_file(&path).map_err(|e| io_error("remove spill file", &path, &e))?;
            removed += 1;
        }
    }
    Ok(removed)
}

/// A new private file in `dir` (created 0700 when missing), opened for
/// reading and writing; on unix already unlinked.
///
/// On unix the process's own temporary directory
/// ([`default_temp_spill_dir`], used by in-memory databases) is removed again
/// once the file is unlinked, so a process that spilled leaves nothing under
/// the OS temporary directory. It is removed only by the last of the spills
/// creating a file at that moment ([`CREATING`]); one that starts just as it
/// is removed finds its directory gone and retries.
fn create_file(dir: &Path) -> Result<(File, PathBuf)> {
    CREATING.fetch_add(1, Ordering::AcqRel);
    let made = create_file_in(dir);
    let last = CREATING.fetch_sub(1, Ordering::AcqRel) == 1;
    if cfg!(unix) && last && made.is_ok() && dir == default_temp_spill_dir() {
        // Fails harmlessly if another spill has just created it again.
        let _ = std::fs::remove_dir(dir);
    }
    made
}

fn create_file_in(dir: &Path) -> Result<(File, PathBuf)> {
    let n = NEXT_RUN.fetch_add(1, Ordering::Relaxed);
    let path = dir.join(format!("{RUN_PREFIX}{}-{n}", std::process::id()));
    let mut o = OpenOptions::new();
    o.read(true).write(true).create_new(true);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut o, 0o600);
    let mut attempts = 0;
    let file = loop {
        attempts += 1;
        let retry = |e: &std::io::Error| e.kind() == std::io::ErrorKind::NotFound && attempts < 64;
        if let Err(e) = create_dir(dir) {
            if retry(&e) {
                continue;
            }
            return Err(io_error("create spill directory", dir, &e));
        }
        match o.open(&path) {
            Ok(f) => break f,
            Err(e) if retry(&e) => continue,
            Err(e) => return Err(io_error("create spill file", &path, &e)),
        }
    };
    #[cfg(unix)]
    std::fs::remove_file(&path).map_err(|e| io_error("unlink spill file", &path, &e))?;
    Ok((file, path))
}

/// A run being written: documents in the order they are pushed.
pub struct RunWriter {
    out: BufWriter<File>,
    path: PathBuf,
    docs: u64,
    bytes: u64,
}

impl RunWriter {
    /// A new run file in `dir` (created 0700 when missing).
    pub fn create(dir: &Path) -> Result<RunWriter> {
        let (file, path) = create_file(dir)?;
        Ok(RunWriter {
            out: BufWriter::with_capacity(WRITE_BUFFER, file),
            path,
            docs: 0,
            bytes: 0,
        })
    }

    /// Append `doc` with its tie-breaker.
    pub fn push(&mut self, tie: u64, doc: &RawDocument) -> Result<()> {
        let bytes = doc.as_bytes();
        self.out
            .write_all(&tie.to_le_bytes())
            .and_then(|()| self.out.write_all(bytes))
            .map_err(|e| io_error("write spill file", &self.path, &e))?;
        self.docs += 1;
        self.bytes += bytes.len() as u64;
        Ok(())
    }

    /// The finished run, positioned at its first document.
    pub fn finish(self) -> Result<RunReader> {
        let RunWriter {
            out,
            path,
            docs,
            bytes,
        } = self;
        let mut file = out
            .into_inner()
            .map_err(|e| io_error("write spill file", &path, e.error()))?;
        file.seek(SeekFrom::Start(0))
            .map_err(|e| io_error("rewind spill file", &path, &e))?;
        RUNS_WRITTEN.fetch_add(1, Ordering::Relaxed);
        BYTES_WRITTEN.fetch_add(bytes, Ordering::Relaxed);
        Ok(RunReader {
            input: BufReader::with_capacity(READ_BUFFER, file),
            path,
            left: docs,
            offset: 0,
        })
    }

    /// The file's mode bits (tests).
    #[cfg(all(test, unix))]
    pub(crate) fn mode(&self) -> u32 {
        use std::os::unix::fs::PermissionsExt;
        self.out
            .get_ref()
            .metadata()
            .map(|m| m.permissions().mode() & 0o777)
            .unwrap_or(0)
    }
}

#[cfg(not(unix))]
impl Drop for RunWriter {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

/// A finished run, read once from its first document to its last.
pub struct RunReader {
    input: BufReader<File>,
    path: PathBuf,
    /// Documents not read yet.
    left: u64,
    offset: u64,
}

impl RunReader {
    /// The next document with its tie-breaker, `None` at the end of the run.
    pub fn next_doc(&mut self) -> Result<Option<(u64, DocRef)>> {
        if self.left == 0 {
            return Ok(None);
        }
        let mut tie = [0u8; 8];
        let mut len = [0u8; 4];
        self.input
            .read_exact(&mut tie)
            .and_then(|()| self.input.read_exact(&mut len))
            .map_err(|e| io_error("read spill file", &self.path, &e))?;
        let n = i32::from_le_bytes(len);
        let size = usize::try_from(n).ok().filter(|n| *n >= 5).ok_or_else(|| {
            Error::from(StorageError::corrupt(
                &self.path,
                self.offset,
                format!("spilled document length {n}"),
            ))
        })?;
        let mut bytes = vec![0u8; size];
        bytes[..4].copy_from_slice(&len);
        self.input
            .read_exact(&mut bytes[4..])
            .map_err(|e| io_error("read spill file", &self.path, &e))?;
        let doc = RawDocumentBuf::from_bytes(bytes).map_err(|e| {
            Error::from(StorageError::corrupt(
                &self.path,
                self.offset,
                format!("spilled document: {e}"),
            ))
        })?;
        self.left -= 1;
        self.offset += 8 + size as u64;
        Ok(Some((u64::from_le_bytes(tie), Arc::new(doc))))
    }
}

#[cfg(not(unix))]
impl Drop for RunReader {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

/// Documents appended once, then read by position (a `$setWindowFields`
/// partition): in memory while they fit under the limit; past it (only
/// with disk use allowed, else 292) all of them move to one spill file and
/// are read back from it, one chunk of the file cached at a time, so reads
/// near the last one (a sliding window) mostly come from memory.
pub struct Spool {
    limit: usize,
    allow_disk_use: bool,
    dir: PathBuf,
    /// What runs out of memory without disk use (the 292's message).
    what: &'static str,
    mem: Vec<DocRef>,
    mem_bytes: usize,
    file: Option<SpoolFile>,
}

/// The file of a spilled [`Spool`].
struct SpoolFile {
    path: PathBuf,
    /// Writing until the first read, then the file itself.
    out: std::cell::RefCell<SpoolIo>,
    /// Where each document starts; the last entry is the end of the file.
    offsets: Vec<u64>,
}

enum SpoolIo {
    Writing(BufWriter<File>),
    Reading {
        file: File,
        /// A copy of the file's bytes from `chunk_at`.
        chunk: Vec<u8>,
        chunk_at: u64,
    },
    /// A write failed while switching to reading.
    Broken,
}

impl std::fmt::Debug for Spool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Spool")
            .field("len", &self.len())
            .field("mem_bytes", &self.mem_bytes)
            .field("spilled", &self.spilled())
            .finish()
    }
}

impl Spool {
    /// An empty spool holding up to `limit` bytes in memory; past it, it
    /// spills to `dir` when `allow_disk_use`, else pushes fail with 292
    /// naming `what`.
    pub fn new(limit: usize, allow_disk_use: bool, dir: PathBuf, what: &'static str) -> Spool {
        Spool {
            limit,
            allow_disk_use,
            dir,
            what,
            mem: Vec::new(),
            mem_bytes: 0,
            file: None,
        }
    }

    /// Documents pushed.
    pub fn len(&self) -> usize {
        match &self.file {
            Some(f) => f.offsets.len() - 1,
            None => self.mem.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Are its documents on disk?
    pub fn spilled(&self) -> bool {
        self.file.is_some()
    }

    /// Append `doc`.
    pub fn push(&mut self, doc: DocRef) -> Result<()> {
        if self.file.is_none() {
            let bytes = doc.as_bytes().len();
            if self.mem_bytes + bytes <= self.limit {
                self.mem_bytes += bytes;
                self.mem.push(doc);
                return Ok(());
            }
            if !self.allow_disk_use {
                return Err(Error::ExceededMemoryLimit(format!(
                    "{} exceeded the memory limit of {} bytes, but did not opt in to external sorting. Pass allowDiskUse:true to opt in.",
                    self.what, self.limit
                )));
            }
            let (file, path) = create_file(&self.dir)?;
            RUNS_WRITTEN.fetch_add(1, Ordering::Relaxed);
            self.file = Some(SpoolFile {
                path,
                out: std::cell::RefCell::new(SpoolIo::Writing(BufWriter::with_capacity(
                    WRITE_BUFFER,
                    file,
                ))),
                offsets: vec![0],
            });
            for d in std::mem::take(&mut self.mem) {
                self.append(&d)?;
            }
            self.mem_bytes = 0;
        }
        self.append(&doc)
    }

    fn append(&mut self, doc: &RawDocument) -> Result<()> {
        let Some(f) = &mut self.file else {
            return Err(Error::Internal("spool: append without a file".into()));
        };
        let bytes = doc.as_bytes();
        match f.out.get_mut() {
            SpoolIo::Writing(out) => out
                .write_all(bytes)
                .map_err(|e| io_error("write spill file", &f.path, &e))?,
            _ => return Err(Error::Internal("spool: a push after the first read".into())),
        }
        let end = f.offsets.last().copied().unwrap_or(0) + bytes.len() as u64;
        f.offsets.push(end);
        BYTES_WRITTEN.fetch_add(bytes.len() as u64, Ordering::Relaxed);
        Ok(())
    }

    /// The document at `i` (pushed `i`-th); no push may follow a read.
    pub fn get(&self, i: usize) -> Result<DocRef> {
        let Some(f) = &self.file else {
            return self
                .mem
                .get(i)
                .cloned()
                .ok_or_else(|| Error::Internal(format!("spool: no document {i}")));
        };
        let (Some(&start), Some(&end)) = (f.offsets.get(i), f.offsets.get(i + 1)) else {
            return Err(Error::Internal(format!("spool: no document {i}")));
        };
        let mut io = f.out.borrow_mut();
        if let SpoolIo::Writing(_) = &*io {
            let SpoolIo::Writing(out) = std::mem::replace(&mut *io, SpoolIo::Broken) else {
                return Err(Error::Internal("spool: state".into()));
            };
            let file = out
                .into_inner()
                .map_err(|e| io_error("write spill file", &f.path, e.error()))?;
            *io = SpoolIo::Reading {
                file,
                chunk: Vec::new(),
                chunk_at: 0,
            };
        }
        let SpoolIo::Reading {
            file,
            chunk,
            chunk_at,
        } = &mut *io
        else {
            return Err(Error::Internal("spool: a write failed before".into()));
        };
        let len = (end - start) as usize;
        if start < *chunk_at || end > *chunk_at + chunk.len() as u64 {
            let file_end = f.offsets.last().copied().unwrap_or(0);
            let want = ((file_end - start) as usize).min(len.max(READ_BUFFER));
            chunk.resize(want, 0);
            file.seek(SeekFrom::Start(start))
                .and_then(|_| file.read_exact(chunk))
                .map_err(|e| io_error("read spill file", &f.path, &e))?;
            *chunk_at = start;
        }
        let at = (start - *chunk_at) as usize;
        let doc = RawDocumentBuf::from_bytes(chunk[at..at + len].to_vec()).map_err(|e| {
            Error::from(StorageError::corrupt(
                &f.path,
                start,
                format!("spooled document: {e}"),
            ))
        })?;
        Ok(Arc::new(doc))
    }
}

#[cfg(not(unix))]
impl Drop for SpoolFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bson::doc;

    fn tmp(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!(
            "duet-spill-test-{name}-{}-{}",
            std::process::id(),
            NEXT_RUN.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = std::fs::remove_dir_all(&d);
        d
    }

    #[test]
    fn a_run_reads_back_what_was_written_and_leaves_no_file() {
        let dir = tmp("roundtrip");
        let mut w = RunWriter::create(&dir).expect("test setup");
        let docs: Vec<RawDocumentBuf> = (0..1000i32)
            .map(|i| {
                RawDocumentBuf::try_from(&doc! {"i": i, "s": "x".repeat((i % 50) as usize)})
                    .expect("test setup")
            })
            .collect();
        for (i, d) in docs.iter().enumerate() {
            w.push(i as u64 * 3, d).expect("test setup");
        }
        let mut r = w.finish().expect("test setup");
        for (i, d) in docs.iter().enumerate() {
            let (tie, got) = r.next_doc().expect("test setup").expect("test setup");
            assert_eq!((tie, got.as_bytes()), (i as u64 * 3, d.as_bytes()));
        }
        assert!(r.next_doc().expect("test setup").is_none());
        drop(r);
        let left: Vec<_> = std::fs::read_dir(&dir).expect("test setup").collect();
        assert!(left.is_empty(), "run files left behind: {left:?}");
        std::fs::remove_dir_all(&dir).expect("test setup");
    }

    #[cfg(unix)]
    #[test]
    fn spills_to_the_process_temp_dir_leave_no_directory_behind() {
        let dir = default_temp_spill_dir();
        let doc = RawDocumentBuf::try_from(&doc! {"i": 1}).expect("test setup");
        // Several threads at once: each may remove the directory while
        // another is between creating it and opening its file.
        std::thread::scope(|s| {
            for _ in 0..4 {
                s.spawn(|| {
                    for _ in 0..50 {
                        let mut w = RunWriter::create(&dir).expect("spill");
                        w.push(7, &doc).expect("spill");
                        let mut r = w.finish().expect("spill");
                        let (tie, got) = r.next_doc().expect("read").expect("one document");
                        assert_eq!((tie, got.as_bytes()), (7, doc.as_bytes()));
                    }
                });
            }
        });
        // Another test of this process may be spilling there right now: its
        // directory lives only from its `create_dir` to its unlink.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        while dir.exists() && std::time::Instant::now() < deadline {
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        assert!(!dir.exists(), "{} left behind", dir.display());
    }

    #[cfg(unix)]
    #[test]
    fn directory_is_0700_and_files_0600_whatever_the_existing_mode() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tmp("modes");
        std::fs::create_dir_all(&dir).expect("test setup");
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o777)).expect("test setup");
        let w = RunWriter::create(&dir).expect("test setup");
        let mode = std::fs::metadata(&dir)
            .expect("test setup")
            .permissions()
            .mode()
            & 0o777;
        assert_eq!(mode, 0o700);
        assert_eq!(w.mode(), 0o600);
        drop(w);
        std::fs::remove_dir_all(&dir).expect("test setup");
    }

    #[test]
    fn a_spool_reads_by_position_from_memory_or_disk() {
        let dir = tmp("spool");
        let docs: Vec<DocRef> = (0..2000i32)
            .map(|i| {
                Arc::new(
                    RawDocumentBuf::try_from(&doc! {"i": i, "s": "y".repeat((i % 97) as usize)})
                        .expect("test setup"),
                )
            })
            .collect();
        let total: usize = docs.iter().map(|d| d.as_bytes().len()).sum();
        for (limit, spills) in [(total, false), (4096, true)] {
            let before = spill_stats().runs;
            let mut s = Spool::new(limit, true, dir.clone(), "test");
            for d in &docs {
                s.push(d.clone()).expect("push");
            }
            assert_eq!(s.spilled(), spills);
            assert_eq!(s.len(), docs.len());
            // Other tests of this process spill at the same time: the
            // process-wide figure can only show that this spool's run counted.
            if spills {
                assert!(spill_stats().runs > before);
            }
            // Forward, backward and jumping reads.
            let order = (0..docs.len())
                .chain((0..docs.len()).rev())
                .chain((0..docs.len()).map(|i| (i * 7919) % docs.len()));
            for i in order {
                assert_eq!(s.get(i).expect("get").as_bytes(), docs[i].as_bytes());
            }
            assert!(s.get(docs.len()).is_err());
        }
        // Without disk use: 292 past the limit.
        let mut s = Spool::new(100, false, dir.clone(), "test");
        let e = docs
            .iter()
            .try_for_each(|d| s.push(d.clone()))
            .expect_err("over the limit");
        assert_eq!(e.code(), 292);
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn clear_dir_removes_leftover_runs_only() {
        let dir = tmp("clear");
        create_dir(&dir).expect("test setup");
        std::fs::write(dir.join("run-1-2"), b"junk").expect("test setup");
        std::fs::write(dir.join("keep.txt"), b"other").expect("test setup");
        assert_eq!(clear_dir(&dir).expect("test setup"), 1);
        assert!(dir.join("keep.txt").exists());
        assert_eq!(clear_dir(&dir.join("missing")).expect("test setup"), 0);
        std::fs::remove_dir_all(&dir).expect("test setup");
    }

    #[test]
    fn a_damaged_run_is_an_error_not_a_panic() {
        let dir = tmp("damaged");
        let mut w = RunWriter::create(&dir).expect("test setup");
        w.push(
            7,
            &RawDocumentBuf::try_from(&doc! {"a": 1}).expect("test setup"),
        )
        .expect("test setup");
        let mut r = w.finish().expect("test setup");
        // Lie about the count: the reader finds the end of the file.
        r.left = 2;
        assert!(r.next_doc().expect("test setup").is_some());
        assert!(r.next_doc().is_err());
        std::fs::remove_dir_all(&dir).expect("test setup");
    }
}
