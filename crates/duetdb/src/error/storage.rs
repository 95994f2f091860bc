//! Errors of the durability layer. Every variant names the file involved, so
//! an operator can act on the message alone; none is ever a panic.

use std::io;
use std::path::{Path, PathBuf};

/// A storage failure. Cloneable (the engine's [`crate::error::Error`] is), so the
/// underlying `io::Error` is kept as its kind and message.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum StorageError {
    /// An operating-system I/O error.
    #[error("{op} {}: {msg}", .path.display())]
    Io {
        op: &'static str,
        path: PathBuf,
        kind: io::ErrorKind,
        /// The OS error was ENOSPC (disk full).
        no_space: bool,
        msg: String,
    },
    /// A file whose content fails its checksum or structure.
    #[error("corrupt file {} at byte {offset}: {what}", .path.display())]
    Corrupt {
        path: PathBuf,
        offset: u64,
        what: String,
    },
    /// A file the data directory needs is missing.
    #[error("missing file {}: {what}", .path.display())]
    Missing { path: PathBuf, what: String },
    /// The WAL does not continue where the state it is replayed on ends.
    #[error("write-ahead log gap in {}: expected commit {expected}, found {found}", .dir.display())]
    Gap {
        dir: PathBuf,
        expected: u64,
        found: u64,
    },
    /// Another process (or another open in this process) holds the directory.
    #[error("data directory {} is locked: another process (or another open Database) is using it", .path.display())]
    Locked { path: PathBuf },
    /// Writes were stopped after a failure that must not be retried blindly.
    #[error("writes are stopped: {reason}; the database stays readable, reopen it to write again")]
    WritesStopped { reason: String },
    /// A durable named snapshot whose image cannot be read (damaged or
    /// missing); the database itself is unaffected.
    #[error("durable snapshot '{name}' is unreadable: {cause}")]
    SnapshotUnreadable {
        name: String,
        cause: Box<StorageError>,
    },
    /// A single commit group too large for one WAL record.
    #[error("a commit group of {bytes} bytes exceeds the WAL record limit of {limit} bytes")]
    RecordTooLarge { bytes: usize, limit: usize },
}

impl StorageError {
    pub fn io(op: &'static str, path: &Path, e: &io::Error) -> StorageError {
        StorageError::Io {
            op,
            path: path.to_path_buf(),
            kind: e.kind(),
            no_space: e.raw_os_error() == Some(28),
            msg: e.to_string(),
        }
    }

    pub fn corrupt(path: &Path, offset: u64, what: impl Into<String>) -> StorageError {
        StorageError::Corrupt {
            path: path.to_path_buf(),
            offset,
            what: what.into(),
        }
    }

    /// Whether this is a full disk.
    pub fn is_no_space(&self) -> bool {
        match self {
            StorageError::Io { no_space, .. } => *no_space,
            StorageError::SnapshotUnreadable { cause, .. } => cause.is_no_space(),
            _ => false,
        }
    }
}

impl From<StorageError> for crate::error::Error {
    fn from(e: StorageError) -> crate::error::Error {
        crate::error::Error::Storage(Box::new(e))
    }
}
