//! Errors of the durability layer. Every variant names the file involved, so
//! an operator can act on the message alone; none is ever a panic.
//!
//! Each maps to a MongoDB error code ([`StorageError::code`]), never to
//! InternalError: what MongoDB itself reports where it has a counterpart
//! (14031 OutOfDiskSpace for a full disk, 264 TooManyFilesOpen as its
//! WiredTiger layer maps EMFILE, 20 IllegalOperation as `mongod` reports an
//! unwritable data directory, 98 DBPathInUse for a held lock, 8 UnknownError
//! for other OS errors as its WiredTiger layer does), and a documented
//! choice otherwise (301 DataCorruptionDetected, 42 LogWriteFailed,
//! 257 TransactionTooLarge). docs/design.md §10 lists them.

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
        /// The OS error number, when the error came from the OS.
        errno: Option<i32>,
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
            errno: e.raw_os_error(),
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

    /// Whether this is a full disk (or an exhausted quota).
    pub fn is_no_space(&self) -> bool {
        self.code() == NO_SPACE.0
    }

    /// MongoDB's code and code name for this error (see the module doc).
    pub fn code_and_name(&self) -> (i32, &'static str) {
        match self {
            StorageError::Io { kind, errno, .. } => io_code(*kind, *errno),
            StorageError::Corrupt { .. } | StorageError::Missing { .. } => {
                (301, "DataCorruptionDetected")
            }
            StorageError::Locked { .. } => (98, "DBPathInUse"),
            StorageError::WritesStopped { .. } => (42, "LogWriteFailed"),
            StorageError::SnapshotUnreadable { cause, .. } => cause.code_and_name(),
            StorageError::RecordTooLarge { .. } => (257, "TransactionTooLarge"),
        }
    }

    pub fn code(&self) -> i32 {
        self.code_and_name().0
    }

    pub fn code_name(&self) -> &'static str {
        self.code_and_name().1
    }
}

const NO_SPACE: (i32, &str) = (14031, "OutOfDiskSpace");
const NOT_PERMITTED: (i32, &str) = (20, "IllegalOperation");
const TOO_MANY_FILES: (i32, &str) = (264, "TooManyFilesOpen");
const OTHER_IO: (i32, &str) = (8, "UnknownError");

/// The code of an OS error: by its number where there is one, else by kind.
fn io_code(kind: io::ErrorKind, errno: Option<i32>) -> (i32, &'static str) {
    #[cfg(unix)]
    if let Some(n) = errno {
        return match n {
            libc::ENOSPC | libc::EDQUOT => NO_SPACE,
            libc::EACCES | libc::EPERM | libc::EROFS => NOT_PERMITTED,
            libc::EMFILE | libc::ENFILE => TOO_MANY_FILES,
            _ => OTHER_IO,
        };
    }
    #[cfg(not(unix))]
    let _ = errno;
    match kind {
        io::ErrorKind::StorageFull | io::ErrorKind::QuotaExceeded => NO_SPACE,
        io::ErrorKind::PermissionDenied | io::ErrorKind::ReadOnlyFilesystem => NOT_PERMITTED,
        _ => OTHER_IO,
    }
}

impl From<StorageError> for crate::error::Error {
    fn from(e: StorageError) -> crate::error::Error {
        crate::error::Error::Storage(Box::new(e))
    }
}
