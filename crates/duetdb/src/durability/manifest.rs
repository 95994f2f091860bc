//! The manifest: which checkpoints are installed. It is the single switch that
//! makes a new checkpoint current, replaced atomically (write `MANIFEST.tmp`,
//! fsync, rename over `MANIFEST`, fsync the directory).
//!
//! Layout: `DUETMAN\x01`, format version u32, current checkpoint csn u64,
//! previous checkpoint csn u64 (0 = none), crc32c of the preceding 28 bytes.
//!
//! Invariants:
//! - the checkpoints it names exist and are complete (they were synced and
//!   renamed into place before the manifest naming them was written);
//! - the WAL holds every record after `previous` (or after csn 0 when there is
//!   no previous checkpoint), so a corrupt current checkpoint can fall back.

use std::path::Path;

use super::error::StorageError;
use super::io::Vfs;

pub const MANIFEST: &str = "MANIFEST";
pub const MANIFEST_TMP: &str = "MANIFEST.tmp";
const MAGIC: &[u8; 8] = b"DUETMAN\x01";
pub const FORMAT_VERSION: u32 = 1;
const LEN: usize = 8 + 4 + 8 + 8 + 4;

/// The installed checkpoints (csn 0 = none).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Manifest {
    pub current: u64,
    pub previous: u64,
}

impl Manifest {
    pub fn encode(&self) -> Vec<u8> {
        let mut b = Vec::with_capacity(LEN);
        b.extend_from_slice(MAGIC);
        b.extend_from_slice(&FORMAT_VERSION.to_le_bytes());
        b.extend_from_slice(&self.current.to_le_bytes());
        b.extend_from_slice(&self.previous.to_le_bytes());
        let crc = crc32c::crc32c(&b);
        b.extend_from_slice(&crc.to_le_bytes());
        b
    }

    pub fn decode(path: &Path, b: &[u8]) -> Result<Manifest, StorageError> {
        let bad = |what: &str| Err(StorageError::corrupt(path, 0, what));
        if b.len() != LEN {
            return bad("wrong length");
        }
        if &b[..8] != MAGIC {
            return bad("not a duetdb manifest (bad magic)");
        }
        let u32_at = |i: usize| u32::from_le_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]]);
        let u64_at = |i: usize| {
            let mut a = [0u8; 8];
            a.copy_from_slice(&b[i..i + 8]);
            u64::from_le_bytes(a)
        };
        if crc32c::crc32c(&b[..LEN - 4]) != u32_at(LEN - 4) {
            return bad("checksum mismatch");
        }
        let version = u32_at(8);
        if version != FORMAT_VERSION {
            return Err(StorageError::corrupt(
                path,
                8,
                format!("format version {version}, this build reads {FORMAT_VERSION}"),
            ));
        }
        let m = Manifest {
            current: u64_at(12),
            previous: u64_at(20),
        };
        if m.previous >= m.current && m.previous != 0 {
            return bad("previous checkpoint is not older than the current one");
        }
        Ok(m)
    }

    /// Read the manifest of `dir`; the default (no checkpoint) when absent.
    pub fn load(vfs: &dyn Vfs, dir: &Path) -> Result<Manifest, StorageError> {
        let path = dir.join(MANIFEST);
        if !vfs.exists(&path) {
            return Ok(Manifest::default());
        }
        let b = vfs
            .read(&path)
            .map_err(|e| StorageError::io("read", &path, &e))?;
        Manifest::decode(&path, &b)
    }

    /// Atomically replace the manifest of `dir` by `self`.
    pub fn install(
        &self,
        vfs: &dyn Vfs,
        dir: &Path,
        skip_dir_fsync: bool,
    ) -> Result<(), StorageError> {
        let tmp = dir.join(MANIFEST_TMP);
        let path = dir.join(MANIFEST);
        if vfs.exists(&tmp) {
            vfs.remove(&tmp)
                .map_err(|e| StorageError::io("remove", &tmp, &e))?;
        }
        let f = vfs
            .create(&tmp)
            .map_err(|e| StorageError::io("create", &tmp, &e))?;
        let written = f
            .append(&self.encode())
            .and_then(|()| f.sync())
            .map_err(|e| StorageError::io("write", &tmp, &e));
        if let Err(e) = written {
            let _ = vfs.remove(&tmp);
            return Err(e);
        }
        vfs.rename(&tmp, &path)
            .map_err(|e| StorageError::io("rename", &tmp, &e))?;
        if !skip_dir_fsync {
            vfs.sync_dir(dir)
                .map_err(|e| StorageError::io("fsync directory", dir, &e))?;
        }
        Ok(())
    }
}
