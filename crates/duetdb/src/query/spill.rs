//! Spill files of external sorts: sorted runs of raw documents written to a
//! private temporary directory and read back once, in order.
//!
//! Owns: the spill directory's creation (mode 0700) and startup cleanup
//! ([`clear_dir`]), run files (mode 0600, [`RunWriter`] / [`RunReader`]), and
//! the process-wide spill figures ([`spill_stats`]).
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
//! - reading a run never panics on its bytes: a damaged length is an error.
//!
//! File I/O here goes straight to `std::fs`, not through the durability
//! layer's `Vfs`: spill files carry no durable state, so crash images of them
//! have nothing to prove, and the query layer sits below durability.

use std::fs::{File, OpenOptions};
use std::io::{BufReader, BufWriter, Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use bson::raw::{RawDocument, RawDocumentBuf};

use crate::doc::DocRef;
use crate::error::{Error, Result, StorageError};

/// Bytes buffered per run while writing it.
const WRITE_BUFFER: usize = 256 * 1024;
/// Bytes buffered per run while merging (one such buffer per open run).
const READ_BUFFER: usize = 64 * 1024;
/// Name prefix of run files (what [`clear_dir`] removes).
const RUN_PREFIX: &str = "run-";

static RUNS_WRITTEN: AtomicU64 = AtomicU64::new(0);
static BYTES_WRITTEN: AtomicU64 = AtomicU64::new(0);
static NEXT_RUN: AtomicU64 = AtomicU64::new(0);

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
pub fn create_dir(dir: &Path) -> Result<()> {
    let mut b = std::fs::DirBuilder::new();
    b.recursive(true);
    #[cfg(unix)]
    std::os::unix::fs::DirBuilderExt::mode(&mut b, 0o700);
    b.create(dir)
        .map_err(|e| io_error("create spill directory", dir, &e))?;
    // An existing directory keeps its mode under `create`: set it.
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))
            .map_err(|e| io_error("chmod spill directory", dir, &e))?;
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
        create_dir(dir)?;
        let n = NEXT_RUN.fetch_add(1, Ordering::Relaxed);
        let path = dir.join(format!("{RUN_PREFIX}{}-{n}", std::process::id()));
        let mut o = OpenOptions::new();
        o.read(true).write(true).create_new(true);
        #[cfg(unix)]
        std::os::unix::fs::OpenOptionsExt::mode(&mut o, 0o600);
        let file = o
            .open(&path)
            .map_err(|e| io_error("create spill file", &path, &e))?;
        #[cfg(unix)]
        std::fs::remove_file(&path).map_err(|e| io_error("unlink spill file", &path, &e))?;
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
