//! The manifest: which checkpoints are installed, which named snapshots are
//! pinned to disk, and which WAL segments the log consists of. It is the
//! single switch that makes a new checkpoint current, a durable snapshot
//! exist, or a WAL segment part of the log, replaced atomically (write
//! `MANIFEST.tmp`, fsync, rename over `MANIFEST`, fsync the directory).
//!
//! Layout, version 4 (written by this build):
//! `DUETMAN\x01`, version u32 = 4, current checkpoint csn u64, previous
//! checkpoint csn u64 (0 = none), pin count u32, pins, synced lsn u64,
//! segment count u32, that many segment first csns (u64, ascending), history
//! segment count u32, that many first csns (u64, ascending, all below the
//! first segment: older segments kept only for change streams), crc32c of
//! everything before it (u32). Version 3 (still read): without the history. A pin is: name str, csn u64, file str,
//! created (unix ms) u64, ttl ms u64 (0 = none), collection count u32
//! (`u32::MAX` = every collection) and that many collection names
//! (str = len u32 + UTF-8).
//!
//! Version 2 (still read): version 3 without the synced lsn and the segment
//! list. Version 1 (still read): the same header without pins — exactly 32
//! bytes: magic, version 1, current, previous, crc32c of the preceding 28
//! bytes. A v1/v2 manifest (or none at all) says nothing about segments:
//! recovery then takes the segments on disk as they are, and the first open
//! installs a v3 manifest naming them (the upgrade).
//!
//! Invariants:
//! - the checkpoints it names exist and are complete (they were synced and
//!   renamed into place before the manifest naming them was written), and
//!   so do the older checkpoint files a chained one points into (files are
//!   deleted only when neither named checkpoint needs them);
//! - the WAL holds every record after `previous` (or after csn 0 when there is
//!   no previous checkpoint), so a corrupt current checkpoint can fall back;
//! - every segment that holds a record recovery may need is named, and every
//!   named segment exists: a segment is created (header synced, directory
//!   synced) and named *before* any record is appended to it, and it is
//!   un-named (a manifest without it installed) *before* it is deleted. So a
//!   named segment that is missing is damage, and so is a named segment
//!   other than the last that ends before the next one starts;
//! - `synced_lsn`: every commit up to it was synced to the log when this
//!   manifest was written (raised at checkpoints, rotations and clean close),
//!   so a log that ends before it has lost synced records;
//! - a pinned snapshot's file was synced and renamed into place before the
//!   manifest naming it was written; pins are full images, so they need no
//!   WAL and the checkpoint/WAL cleanup never touches them (their files are
//!   `snap-*.ckpt`, never `ckpt-*`); pin names are unique.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use parking_lot::Mutex;

use super::effect::{put_str, Reader};
use super::io::Vfs;
use crate::error::StorageError;

pub const MANIFEST: &str = "MANIFEST";
pub const MANIFEST_TMP: &str = "MANIFEST.tmp";
const MAGIC: &[u8; 8] = b"DUETMAN\x01";
pub const FORMAT_VERSION: u32 = 4;
/// Length of a version-1 manifest.
const LEN_V1: usize = 8 + 4 + 8 + 8 + 4;
/// Most bytes a manifest may have (1,024 pins of long names and many
/// collections fit easily); a larger file is damage, not a manifest.
const MAX_LEN: usize = 64 << 20;
const ALL_COLLECTIONS: u32 = u32::MAX;

/// A durable named snapshot recorded in the manifest.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pin {
    pub name: String,
    pub csn: u64,
    /// File name (in the data directory) of its checkpoint image.
    pub file: String,
    /// Creation time, unix milliseconds.
    pub created_ms: u64,
    /// Time to live in milliseconds; 0 = none.
    pub ttl_ms: u64,
    /// `None` = every collection at `csn`.
    pub collections: Option<Vec<String>>,
}

/// The installed checkpoints (csn 0 = none), pinned snapshots and WAL segments.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Manifest {
    pub current: u64,
    pub previous: u64,
    pub pins: Vec<Pin>,
    /// First csns of the WAL segments the log consists of, ascending.
    /// `None`: read from a manifest older than v3 (or none), which does not
    /// say; recovery then takes the segments on disk as they are.
    pub segments: Option<Vec<u64>>,
    /// Every commit up to this csn was synced to the log when this manifest
    /// was installed (0 when unknown).
    pub synced_lsn: u64,
    /// First csns of older WAL segments kept only as change history
    /// (retention), ascending, all before `segments`. Recovery never needs
    /// them and does not mind if they are gone (v4; empty before).
    pub history: Vec<u64>,
}

impl Manifest {
    pub fn encode(&self) -> Vec<u8> {
        let segments = self.segments.as_deref().unwrap_or_default();
        let mut b = Vec::with_capacity(LEN_V1 + 16 + self.pins.len() * 96 + segments.len() * 8);
        b.extend_from_slice(MAGIC);
        b.extend_from_slice(&FORMAT_VERSION.to_le_bytes());
        b.extend_from_slice(&self.current.to_le_bytes());
        b.extend_from_slice(&self.previous.to_le_bytes());
        b.extend_from_slice(&(self.pins.len() as u32).to_le_bytes());
        for p in &self.pins {
            put_str(&mut b, &p.name);
            b.extend_from_slice(&p.csn.to_le_bytes());
            put_str(&mut b, &p.file);
            b.extend_from_slice(&p.created_ms.to_le_bytes());
            b.extend_from_slice(&p.ttl_ms.to_le_bytes());
            match &p.collections {
                None => b.extend_from_slice(&ALL_COLLECTIONS.to_le_bytes()),
                Some(cs) => {
                    b.extend_from_slice(&(cs.len() as u32).to_le_bytes());
                    for c in cs {
                        put_str(&mut b, c);
                    }
                }
            }
        }
        b.extend_from_slice(&self.synced_lsn.to_le_bytes());
        b.extend_from_slice(&(segments.len() as u32).to_le_bytes());
        for first in segments {
            b.extend_from_slice(&first.to_le_bytes());
        }
        b.extend_from_slice(&(self.history.len() as u32).to_le_bytes());
        for first in &self.history {
            b.extend_from_slice(&first.to_le_bytes());
        }
        let crc = crc32c::crc32c(&b);
        b.extend_from_slice(&crc.to_le_bytes());
        b
    }

    pub fn decode(path: &Path, b: &[u8]) -> Result<Manifest, StorageError> {
        let bad = |what: &str| Err(StorageError::corrupt(path, 0, what));
        if b.len() < LEN_V1 || b.len() > MAX_LEN {
            return bad("wrong length");
        }
        if &b[..8] != MAGIC {
            return bad("not a duetdb manifest (bad magic)");
        }
        let n = b.len();
        let mut crc = [0u8; 4];
        crc.copy_from_slice(&b[n - 4..]);
        if crc32c::crc32c(&b[..n - 4]) != u32::from_le_bytes(crc) {
            return bad("checksum mismatch");
        }
        let body = &b[..n - 4];
        let dec = |e: super::effect::DecodeError| StorageError::corrupt(path, 0, e.0);
        let mut r = Reader::new(&body[8..]);
        let version = r.u32().map_err(dec)?;
        if !(1..=FORMAT_VERSION).contains(&version) {
            return Err(StorageError::corrupt(
                path,
                8,
                format!("format version {version}, this build reads 1 to {FORMAT_VERSION}"),
            ));
        }
        if version == 1 && n != LEN_V1 {
            return bad("wrong length for format version 1");
        }
        let mut m = Manifest {
            current: r.u64().map_err(dec)?,
            previous: r.u64().map_err(dec)?,
            ..Manifest::default()
        };
        if version >= 2 {
            let count = r.u32().map_err(dec)?;
            for _ in 0..count {
                let name = r.str().map_err(dec)?;
                let csn = r.u64().map_err(dec)?;
                let file = r.str().map_err(dec)?;
                let created_ms = r.u64().map_err(dec)?;
                let ttl_ms = r.u64().map_err(dec)?;
                let nc = r.u32().map_err(dec)?;
                let collections = if nc == ALL_COLLECTIONS {
                    None
                } else {
                    let mut cs = Vec::new();
                    for _ in 0..nc {
                        cs.push(r.str().map_err(dec)?);
                    }
                    Some(cs)
                };
                if !is_pin_file(&file) || m.pins.iter().any(|p| p.name == name) {
                    return bad("a pinned snapshot entry is invalid (bad file name or duplicate)");
                }
                m.pins.push(Pin {
                    name,
                    csn,
                    file,
                    created_ms,
                    ttl_ms,
                    collections,
                });
            }
        }
        if version >= 3 {
            m.synced_lsn = r.u64().map_err(dec)?;
            let count = r.u32().map_err(dec)?;
            let mut segments: Vec<u64> = Vec::new();
            for _ in 0..count {
                let first = r.u64().map_err(dec)?;
                if first == 0 || segments.last().is_some_and(|l| *l >= first) {
                    return bad("the WAL segment list is not ascending");
                }
                segments.push(first);
            }
            m.segments = Some(segments);
        }
        if version >= 4 {
            let count = r.u32().map_err(dec)?;
            for _ in 0..count {
                let first = r.u64().map_err(dec)?;
                if first == 0 || m.history.last().is_some_and(|l| *l >= first) {
                    return bad("the WAL history segment list is not ascending");
                }
                m.history.push(first);
            }
            let oldest_named = m.segments.as_ref().and_then(|s| s.first());
            if m.history
                .last()
                .zip(oldest_named)
                .is_some_and(|(h, s)| h >= s)
            {
                return bad("a WAL history segment is not older than the log's segments");
            }
        }
        if !r.done() {
            return bad("bytes after the last entry");
        }
        if m.previous >= m.current && m.previous != 0 {
            return bad("previous checkpoint is not older than the current one");
        }
        Ok(m)
    }

    /// Read the manifest of `dir`; `None` when there is none.
    pub fn load(vfs: &dyn Vfs, dir: &Path) -> Result<Option<Manifest>, StorageError> {
        let path = dir.join(MANIFEST);
        if !vfs.exists(&path) {
            return Ok(None);
        }
        let b = vfs
            .read(&path)
            .map_err(|e| StorageError::io("read", &path, &e))?;
        Manifest::decode(&path, &b).map(Some)
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
                .map_err(|e| StorageError::io(FSYNC_DIR, dir, &e))?;
        }
        Ok(())
    }
}

const FSYNC_DIR: &str = "fsync directory";

/// Whether a failed [`Manifest::install`] may still have left the new
/// manifest on disk: the rename happened and only the directory fsync
/// failed, so either manifest may be the one a crash keeps.
pub fn maybe_installed(e: &StorageError) -> bool {
    matches!(e, StorageError::Io { op, .. } if *op == FSYNC_DIR)
}

/// The installed manifest of one open database and the one way to change it.
/// Every change (checkpoint, segment rotation, pin, unpin, open, close) goes
/// through [`ManifestStore::update`], which holds the lock across the
/// install, so concurrent changes never lose each other's edits.
///
/// Lock order: a WAL rotation holds the log's `active` lock and then takes
/// this one; nothing holds this lock and then waits for the log.
pub struct ManifestStore {
    vfs: Arc<dyn Vfs>,
    dir: PathBuf,
    skip_dir_fsync: bool,
    installed: Mutex<Manifest>,
}

impl ManifestStore {
    /// A store whose installed manifest is `m` (as loaded; the default when
    /// the directory has none).
    pub fn new(vfs: Arc<dyn Vfs>, dir: &Path, skip_dir_fsync: bool, m: Manifest) -> ManifestStore {
        ManifestStore {
            vfs,
            dir: dir.to_path_buf(),
            skip_dir_fsync,
            installed: Mutex::new(m),
        }
    }

    /// A copy of the installed manifest.
    pub fn get(&self) -> Manifest {
        self.installed.lock().clone()
    }

    /// Apply `change` to a copy of the installed manifest and install the
    /// result (nothing is written when `change` leaves it as it was). On
    /// error the installed manifest is unchanged in memory; the disk may hold
    /// the new one only when [`maybe_installed`] says so.
    pub fn update<R>(&self, change: impl FnOnce(&mut Manifest) -> R) -> Result<R, StorageError> {
        let mut m = self.installed.lock();
        let mut next = m.clone();
        let out = change(&mut next);
        if next != *m {
            debug_assert!(next.segments.is_some(), "a v3 manifest names its segments");
            next.install(&*self.vfs, &self.dir, self.skip_dir_fsync)?;
            *m = next;
        }
        Ok(out)
    }
}

/// File name of a pinned snapshot's image: `snap-<name>-<csn, 20 digits>-<id>.ckpt`,
/// where `id` (16 hex digits) tells apart two pins of one name at one csn
/// (dropped and created again).
pub fn pin_file_name(name: &str, csn: u64, id: u64) -> String {
    format!("snap-{name}-{csn:020}-{id:016x}.ckpt")
}

/// Whether `file` is a pinned-snapshot file name (no path separators).
pub fn is_pin_file(file: &str) -> bool {
    file.starts_with("snap-")
        && file.ends_with(".ckpt")
        && !file.contains('/')
        && !file.contains('\\')
        && file != ".."
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Manifest {
        Manifest {
            current: 9,
            previous: 4,
            pins: vec![
                Pin {
                    name: "a".into(),
                    csn: 7,
                    file: pin_file_name("a", 7, 1),
                    created_ms: 123,
                    ttl_ms: 0,
                    collections: None,
                },
                Pin {
                    name: "b.c".into(),
                    csn: 8,
                    file: pin_file_name("b.c", 8, 2),
                    created_ms: 5,
                    ttl_ms: 60_000,
                    collections: Some(vec!["x".into(), "y".into()]),
                },
            ],
            segments: Some(vec![3, 6, 10]),
            synced_lsn: 11,
            history: vec![1, 2],
        }
    }

    #[test]
    fn v4_round_trips_and_every_flip_is_detected() {
        let p = Path::new("MANIFEST");
        let m = sample();
        let b = m.encode();
        assert_eq!(Manifest::decode(p, &b).expect("v4"), m);
        for i in 0..b.len() {
            let mut c = b.clone();
            c[i] ^= 0x40;
            assert!(Manifest::decode(p, &c).is_err(), "flip at {i}");
        }
    }

    /// Older formats still decode, and say nothing about segments.
    #[test]
    fn v1_and_v2_still_decode_without_a_segment_list() {
        let p = Path::new("MANIFEST");
        // A version-2 manifest, as the previous build wrote it: v3 without
        // the synced lsn and the segment list.
        let m = sample();
        let v4 = m.encode();
        // A version-3 manifest: v4 without the history list.
        let hist = 4 + 8 * m.history.len();
        let mut v3 = v4[..v4.len() - 4 - hist].to_vec();
        v3[8..12].copy_from_slice(&3u32.to_le_bytes());
        let crc = crc32c::crc32c(&v3);
        v3.extend_from_slice(&crc.to_le_bytes());
        let old = Manifest::decode(p, &v3).expect("v3");
        assert_eq!(old.segments, m.segments);
        assert!(old.history.is_empty());
        let tail = 8 + 4 + 4 + 8 * m.segments.as_ref().map_or(0, Vec::len) + hist;
        let mut v2 = v4[..v4.len() - tail].to_vec();
        v2[8..12].copy_from_slice(&2u32.to_le_bytes());
        let crc = crc32c::crc32c(&v2);
        v2.extend_from_slice(&crc.to_le_bytes());
        let old = Manifest::decode(p, &v2).expect("v2");
        assert_eq!(
            (old.current, old.previous, old.pins.clone()),
            (9, 4, m.pins)
        );
        assert_eq!((old.segments, old.synced_lsn), (None, 0));
        // A version-1 manifest.
        let mut v1 = Vec::new();
        v1.extend_from_slice(MAGIC);
        v1.extend_from_slice(&1u32.to_le_bytes());
        v1.extend_from_slice(&9u64.to_le_bytes());
        v1.extend_from_slice(&4u64.to_le_bytes());
        let crc = crc32c::crc32c(&v1);
        v1.extend_from_slice(&crc.to_le_bytes());
        let old = Manifest::decode(p, &v1).expect("v1");
        assert_eq!((old.current, old.previous, old.pins.len()), (9, 4, 0));
        assert_eq!(old.segments, None);
    }

    #[test]
    fn a_segment_list_out_of_order_is_refused() {
        let p = Path::new("MANIFEST");
        for segs in [vec![5, 5], vec![6, 2], vec![0]] {
            let m = Manifest {
                segments: Some(segs.clone()),
                ..Manifest::default()
            };
            assert!(Manifest::decode(p, &m.encode()).is_err(), "{segs:?}");
        }
    }
}
