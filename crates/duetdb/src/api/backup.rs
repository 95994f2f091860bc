//! Hot backup: [`Engine::backup_to`] writes every database of the engine,
//! each as one published state, into a new directory that is itself a data
//! directory (`duet serve --data-dir DIR` or `Engine::open(DIR)` starts from
//! it), while writers continue.
//!
//! How: the published root of every database is taken first (one atomic
//! load each, O(1), no lock, no writer round-trip: the same argument as a
//! named snapshot, §12), then each is written with the checkpoint writer
//! (`durability/checkpoint.rs`) as `DIR/<db>/ckpt-<csn>.ckpt`, with a
//! `MANIFEST` naming it as the current checkpoint and an empty log. The
//! held roots only keep old versions alive while they are written; writes
//! go on meanwhile and copy the paths they touch as always.
//!
//! [`write_image`] writes one database's directory this way; a replica-set
//! member builds its Raft snapshots with it (and its named snapshots'
//! images with `NamedCopy::write_image`) and installs them with
//! `Engine::restore_database_with` (docs/design.md §19).
//!
//! Invariants: each database's copy is exactly its state at the csn
//! reported in [`BackupInfo`] (every command acknowledged before the call,
//! none partially); databases have separate writers, so the copies are
//! taken one after another within microseconds, not at one cross-database
//! instant. `DIR` must not exist or be empty (Io error otherwise: a backup
//! never overwrites). Durable named snapshots and WAL history are not
//! copied. `DIR/BACKUP` lists `<db> <csn>` lines; it is written last, so a
//! directory without it is an interrupted backup.

use std::path::{Path, PathBuf};

use crate::api::Engine;
use crate::durability::checkpoint;
use crate::durability::io::{create_private_dir_all, RealFs, Vfs};
use crate::durability::manifest::Manifest;
use crate::error::{Result, StorageError};

/// The file in a backup directory listing what it holds.
pub const BACKUP_FILE: &str = "BACKUP";

/// One database of a backup.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BackedUp {
    pub name: String,
    pub csn: u64,
    pub bytes: u64,
    pub documents: u64,
}

/// What [`Engine::backup_to`] wrote.
#[derive(Debug, Clone)]
pub struct BackupInfo {
    pub dir: PathBuf,
    pub databases: Vec<BackedUp>,
}

impl Engine {
    /// Write a consistent copy of every database that holds a collection
    /// into `to` (see the module doc). `progress` is called after each
    /// database with (databases done, total).
    pub fn backup_to(
        &self,
        to: &Path,
        mut progress: impl FnMut(usize, usize),
    ) -> Result<BackupInfo> {
        let io = |op, e: &std::io::Error| StorageError::io(op, to, e);
        if to.exists()
            && std::fs::read_dir(to)
                .map_err(|e| io("read directory", &e))?
                .next()
                .is_some()
        {
            return Err(StorageError::io(
                "create backup in",
                to,
                &std::io::Error::new(
                    std::io::ErrorKind::AlreadyExists,
                    "the backup directory must be new or empty",
                ),
            )
            .into());
        }
        // Every root first, so the copies are as close in time as possible.
        let snaps: Vec<_> = self
            .list_databases()
            .into_iter()
            .map(|(name, db)| (name, db.snapshot()))
            .collect();
        create_private_dir_all(to).map_err(|e| io("create directory", &e))?;
        let mut out = Vec::with_capacity(snaps.len());
        for (i, (name, snap)) in snaps.iter().enumerate() {
            out.push(write_image(name, snap, &to.join(name))?);
            progress(i + 1, snaps.len());
        }
        let vfs = RealFs;
        let list: String = out
            .iter()
            .map(|b| format!("{} {}\n", b.name, b.csn))
            .collect();
        let path = to.join(BACKUP_FILE);
        let tmp = to.join(format!("{BACKUP_FILE}.tmp"));
        let f = vfs
            .create(&tmp)
            .map_err(|e| StorageError::io("create", &tmp, &e))?;
        f.append(list.as_bytes())
            .and_then(|()| f.sync())
            .map_err(|e| StorageError::io("write", &tmp, &e))?;
        drop(f);
        vfs.rename(&tmp, &path)
            .map_err(|e| StorageError::io("rename", &tmp, &e))?;
        vfs.sync_dir(to)
            .map_err(|e| StorageError::io("fsync directory", to, &e))?;
        Ok(BackupInfo {
            dir: to.to_path_buf(),
            databases: out,
        })
    }
}

/// Write the state `snap` holds as a database directory `dir` (created; a
/// checkpoint and a `MANIFEST` naming it, an empty log): what
/// `Engine::open` or [`Engine::restore_database`] opens as database `name`
/// at exactly that state. A backup writes one per database, a replica-set
/// member one per database of a Raft snapshot.
pub fn write_image(name: &str, snap: &crate::api::Snapshot, dir: &Path) -> Result<BackedUp> {
    let vfs = RealFs;
    create_private_dir_all(dir).map_err(|e| StorageError::io("create directory", dir, &e))?;
    let info = checkpoint::write(&vfs, dir, snap.state())?;
    let manifest = Manifest {
        current: info.csn,
        segments: Some(Vec::new()),
        ..Manifest::default()
    };
    manifest.install(&vfs, dir, false)?;
    Ok(BackedUp {
        name: name.to_string(),
        csn: info.csn,
        bytes: info.bytes,
        documents: info.documents,
    })
}
