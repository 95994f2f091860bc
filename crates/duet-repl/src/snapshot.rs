//! Raft snapshots of a member: every database's published state at one
//! applied log position, each written as a checkpoint image
//! (`duetdb::replication::write_image`, the hot backup's writer), packed
//! into one file that openraft sends to a new or lagging member in chunks.
//! The member installs it with `Engine::restore_database`, so the log below
//! the snapshot can be purged (docs/design.md §19, "Raft snapshots").
//!
//! Files in `repl.raft/`:
//! - `snapshot`: the current snapshot, replaced atomically (built here or
//!   received), never by an older one;
//! - `snapshot.incoming`: a snapshot being received;
//! - `snapshot.build`, `snapshot.tmp`, `snapshot.restore`: work files of a
//!   build or an install, removed when it ends (and at start).
//!
//! Format (little-endian): `"DUETRSN\x03" | meta_len u32 | bincode(meta) |
//! retries | ndb u32 | per database: name | nfile u32 | per file: name |
//! len u64 | bytes` then `crc32c(all preceding bytes) u32`; a name is `len
//! u32 | UTF-8`; `retries` is the retryable-write table as of the snapshot
//! (`retries::encode`: `n u32 | per entry: len u32 | bincode(Retry)`, the
//! tags with their commands' outcomes, oldest tag first). Version 2
//! (`"DUETRSN\x02"`) carries bare tags (`n u32 | per tag: len u32 |
//! bytes`; installed as tags without outcomes); version 1 (`"DUETRSN\x01"`,
//! written before the table was carried) has no `retries` and still
//! installs (the member keeps its own table). The
//! checksum is verified before an install touches a database.
//!
//! Invariants:
//! - a snapshot's databases are exactly their published states after the
//!   entry `meta.last_log_id` was applied: they are taken (O(1) each, no
//!   lock) between two applies, when every applied group is published and
//!   none other is; its retry table is taken at the same point (the tags of
//!   the entries applied up to there);
//! - the `snapshot` file is replaced only by a snapshot of a later log id
//!   (builds and installs serialise on [`Snapshots::lock`]).

use std::fs::File;
use std::io::{BufReader, BufWriter, Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

use duetdb::Engine;
use openraft::{BasicNode, SnapshotMeta};

use crate::log_store::fsync_dir;
use crate::types::NodeId;

pub type Meta = SnapshotMeta<NodeId, BasicNode>;

pub const SNAPSHOT_FILE: &str = "snapshot";
pub const INCOMING_FILE: &str = "snapshot.incoming";
const BUILD_DIR: &str = "snapshot.build";
const TMP_FILE: &str = "snapshot.tmp";
const RESTORE_DIR: &str = "snapshot.restore";
const MAGIC: &[u8; 8] = b"DUETRSN\x03";
/// Snapshots whose retry table holds bare tags (no outcomes).
const MAGIC_V2: &[u8; 8] = b"DUETRSN\x02";
/// Snapshots written before they carried the retry table.
const MAGIC_V1: &[u8; 8] = b"DUETRSN\x01";
/// Longest name (database or file) a snapshot may hold.
const MAX_NAME: usize = 1024;

/// Builds and installs of one member (see the module invariants).
#[derive(Default)]
pub struct Snapshots {
    pub lock: parking_lot::Mutex<()>,
}

/// What a snapshot is made of, taken between two applies.
pub struct Capture {
    pub meta: Meta,
    pub dbs: Vec<(String, duetdb::Snapshot)>,
    /// The retryable-write table (`retries.rs`), oldest tag first.
    pub retries: Vec<crate::retries::Retry>,
}

/// What an install put in place: the snapshot's metadata and its retry
/// table (`None`: a version-1 snapshot, which has none).
pub struct Installed {
    pub meta: Meta,
    pub retries: Option<Vec<crate::retries::Retry>>,
}

fn other(e: impl std::fmt::Display) -> std::io::Error {
    std::io::Error::other(e.to_string())
}

/// Remove the work files an interrupted build or install left.
pub fn clear_work(dir: &Path) {
    for d in [BUILD_DIR, RESTORE_DIR] {
        let _ = std::fs::remove_dir_all(dir.join(d));
    }
    for f in [TMP_FILE, INCOMING_FILE] {
        let _ = std::fs::remove_file(dir.join(f));
    }
}

/// A writer that checksums what passes through it.
struct Crc<W> {
    inner: W,
    crc: u32,
}

impl<W: Write> Write for Crc<W> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let n = self.inner.write(buf)?;
        self.crc = crc32c::crc32c_append(self.crc, &buf[..n]);
        Ok(n)
    }
    fn flush(&mut self) -> std::io::Result<()> {
        self.inner.flush()
    }
}

fn put_name(w: &mut impl Write, s: &str) -> std::io::Result<()> {
    w.write_all(&(s.len() as u32).to_le_bytes())?;
    w.write_all(s.as_bytes())
}

fn get_u32(r: &mut impl Read) -> std::io::Result<u32> {
    let mut b = [0u8; 4];
    r.read_exact(&mut b)?;
    Ok(u32::from_le_bytes(b))
}

fn get_u64(r: &mut impl Read) -> std::io::Result<u64> {
    let mut b = [0u8; 8];
    r.read_exact(&mut b)?;
    Ok(u64::from_le_bytes(b))
}

fn get_name(r: &mut impl Read) -> std::io::Result<String> {
    let len = get_u32(r)? as usize;
    if len > MAX_NAME {
        return Err(other(format!("a name of {len} bytes in a snapshot")));
    }
    let mut b = vec![0u8; len];
    r.read_exact(&mut b)?;
    String::from_utf8(b).map_err(other)
}

/// A file name a snapshot may create: one plain component.
fn plain(name: &str) -> bool {
    !name.is_empty()
        && name != "."
        && name != ".."
        && !name.contains('/')
        && !name.contains('\\')
        && !name.contains('\0')
}

/// The header's metadata of snapshot file `path`.
pub fn read_meta(path: &Path) -> std::io::Result<Meta> {
    let mut r = BufReader::new(File::open(path)?);
    Ok(read_header(&mut r)?.0)
}

/// Which retry table a snapshot file carries.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Table {
    None,
    Tags,
    Outcomes,
}

/// The metadata, and which retry table the file carries.
fn read_header(r: &mut impl Read) -> std::io::Result<(Meta, Table)> {
    let mut magic = [0u8; 8];
    r.read_exact(&mut magic)?;
    let with_retries = match &magic {
        m if m == MAGIC => Table::Outcomes,
        m if m == MAGIC_V2 => Table::Tags,
        m if m == MAGIC_V1 => Table::None,
        _ => return Err(other("not a duet replica-set snapshot")),
    };
    let len = get_u32(r)? as usize;
    if len > 1 << 20 {
        return Err(other(format!("snapshot metadata of {len} bytes")));
    }
    let mut b = vec![0u8; len];
    r.read_exact(&mut b)?;
    Ok((bincode::deserialize(&b).map_err(other)?, with_retries))
}

/// The metadata of the member's current snapshot (`None`: none yet).
pub fn current_position(dir: &Path) -> std::io::Result<Option<Meta>> {
    Ok(open_current(dir)?.map(|(m, _)| m))
}

/// The member's current snapshot: its metadata and the file, open at its
/// start (one open, so a replacement meanwhile cannot mix two snapshots).
pub fn open_current(dir: &Path) -> std::io::Result<Option<(Meta, File)>> {
    let mut f = match File::open(dir.join(SNAPSHOT_FILE)) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e),
    };
    let (meta, _) = read_header(&mut BufReader::new(&mut f))?;
    f.seek(SeekFrom::Start(0))?;
    Ok(Some((meta, f)))
}

/// Write `cap` as the member's `snapshot` file (blocking), unless a
/// snapshot of the same or a later log id is already there; the snapshot
/// the file then holds (open at its start).
pub fn build(dir: &Path, lock: &Snapshots, cap: Capture) -> std::io::Result<(Meta, File)> {
    let work = dir.join(BUILD_DIR);
    let _ = std::fs::remove_dir_all(&work);
    std::fs::create_dir_all(&work)?;
    for (name, snap) in &cap.dbs {
        duetdb::replication::write_image(name, snap, &work.join(name)).map_err(other)?;
    }
    let tmp = dir.join(TMP_FILE);
    let mut w = Crc {
        inner: BufWriter::new(File::create(&tmp)?),
        crc: 0,
    };
    w.write_all(MAGIC)?;
    let meta = bincode::serialize(&cap.meta).map_err(other)?;
    w.write_all(&(meta.len() as u32).to_le_bytes())?;
    w.write_all(&meta)?;
    crate::retries::encode(&mut w, &cap.retries)?;
    w.write_all(&(cap.dbs.len() as u32).to_le_bytes())?;
    for (name, _) in &cap.dbs {
        put_name(&mut w, name)?;
        let mut files: Vec<(String, PathBuf)> = std::fs::read_dir(work.join(name))?
            .flatten()
            .filter(|e| e.path().is_file())
            .map(|e| (e.file_name().to_string_lossy().into_owned(), e.path()))
            .collect();
        files.sort();
        w.write_all(&(files.len() as u32).to_le_bytes())?;
        for (fname, path) in files {
            let mut f = File::open(&path)?;
            let len = f.metadata()?.len();
            put_name(&mut w, &fname)?;
            w.write_all(&len.to_le_bytes())?;
            let copied = std::io::copy(&mut (&mut f).take(len), &mut w)?;
            if copied != len {
                return Err(other(format!("{} shrank while copied", path.display())));
            }
        }
    }
    let crc = w.crc;
    let mut inner = w.inner.into_inner().map_err(|e| other(e.error()))?;
    inner.write_all(&crc.to_le_bytes())?;
    inner.sync_all()?;
    drop(inner);
    let _ = std::fs::remove_dir_all(&work);
    let _g = lock.lock.lock();
    if let Some((have, f)) = open_current(dir)? {
        if have.last_log_id >= cap.meta.last_log_id {
            let _ = std::fs::remove_file(&tmp);
            return Ok((have, f));
        }
    }
    std::fs::rename(&tmp, dir.join(SNAPSHOT_FILE))?;
    fsync_dir(dir)?;
    let f = File::open(dir.join(SNAPSHOT_FILE))?;
    Ok((cap.meta, f))
}

/// Check snapshot file `path` end to end (its checksum).
fn verify(path: &Path) -> std::io::Result<()> {
    let mut f = File::open(path)?;
    let len = f.metadata()?.len();
    if len < 12 {
        return Err(other("a snapshot file too short to hold a snapshot"));
    }
    let mut crc = 0u32;
    let mut left = len - 4;
    let mut buf = vec![0u8; 1 << 20];
    while left > 0 {
        let n = (left.min(buf.len() as u64)) as usize;
        f.read_exact(&mut buf[..n])?;
        crc = crc32c::crc32c_append(crc, &buf[..n]);
        left -= n as u64;
    }
    if get_u32(&mut f)? != crc {
        return Err(other("the snapshot file does not check (crc32c)"));
    }
    Ok(())
}

/// Replace every database of `engine` with those of the member's
/// `snapshot` file (blocking): each is unpacked to a directory and
/// restored in place of the database of its name; databases it does not
/// hold are dropped. Its metadata and retry table (the caller installs the
/// table).
pub fn install(engine: &Engine, dir: &Path) -> std::io::Result<Installed> {
    let path = dir.join(SNAPSHOT_FILE);
    verify(&path)?;
    let mut r = BufReader::new(File::open(&path)?);
    let (meta, with_retries) = read_header(&mut r)?;
    let retries = match with_retries {
        Table::Outcomes => Some(crate::retries::decode(&mut r)?),
        Table::Tags => Some(crate::retries::decode_tags(&mut r)?),
        Table::None => None,
    };
    let staging = dir.join(RESTORE_DIR);
    let _ = std::fs::remove_dir_all(&staging);
    std::fs::create_dir_all(&staging)?;
    let ndb = get_u32(&mut r)?;
    let mut names = Vec::new();
    for _ in 0..ndb {
        let name = get_name(&mut r)?;
        duetdb::validate_db_name(&name).map_err(other)?;
        let to = staging.join(&name);
        std::fs::create_dir_all(&to)?;
        for _ in 0..get_u32(&mut r)? {
            let fname = get_name(&mut r)?;
            if !plain(&fname) {
                return Err(other(format!("a snapshot file named '{fname}'")));
            }
            let len = get_u64(&mut r)?;
            let mut f = File::create(to.join(&fname))?;
            let copied = std::io::copy(&mut (&mut r).take(len), &mut f)?;
            if copied != len {
                return Err(other("the snapshot file ends early"));
            }
            f.sync_all()?;
        }
        fsync_dir(&to)?;
        names.push(name);
    }
    for name in &names {
        engine
            .restore_database(name, &staging.join(name))
            .map_err(other)?;
    }
    for db in engine.all_databases() {
        let name = db.name().to_string();
        drop(db);
        if !names.contains(&name) {
            engine.try_drop_database(&name).map_err(other)?;
        }
    }
    let _ = std::fs::remove_dir_all(&staging);
    Ok(Installed { meta, retries })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_plain_file_names_are_unpacked() {
        assert!(plain("MANIFEST") && plain("ckpt-00000000000000000001.ckpt"));
        for bad in ["", ".", "..", "../x", "a/b", "a\\b"] {
            assert!(!plain(bad), "{bad}");
        }
    }
}
