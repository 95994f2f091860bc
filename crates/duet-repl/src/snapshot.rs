//! Raft snapshots of a member: every database's published state at one
//! applied log position, each written as a checkpoint image
//! (`duetdb::replication::write_image`, the hot backup's writer), with every
//! named snapshot the database holds (its image at its csn and its
//! description), packed into one file that openraft sends to a new or
//! lagging member in chunks. The member installs it with
//! `Engine::restore_database_with`, so the log below the snapshot can be
//! purged (docs/design.md §19, "Raft snapshots").
//!
//! Files in `repl.raft/`:
//! - `snapshot`: the current snapshot, replaced atomically (built here or
//!   received), never by an older one;
//! - `snapshot.incoming`: a snapshot being received;
//! - `snapshot.build`, `snapshot.tmp`, `snapshot.restore`: work files of a
//!   build or an install, removed when it ends (and at start).
//!
//! Format (little-endian), version 4: `"DUETRSN\x04" | meta_len u32 |
//! bincode(meta) | retries | ndb u32 | per database: name | nfile u32 | per
//! file: name | len u64 | bytes | nnamed u32 | per named snapshot: info_len
//! u32 | bincode(NamedInfo) | len u64 | image` then `crc32c(all preceding
//! bytes) u32`; a name is `len u32 | UTF-8`; `retries` is the
//! retryable-write table as of the snapshot (`retries::encode`: `n u32 |
//! per entry: len u32 | bincode(Retry)`, the tags with their commands'
//! outcomes, oldest tag first); a named snapshot's `image` is its
//! checkpoint image (§13.4, the format durable snapshots are pinned in) and
//! [`NamedInfo`] its name, csn, creation time, TTL, collections and
//! durability. Version 3 (`"DUETRSN\x03"`) has no named snapshots (`nnamed`
//! and what follows it absent; installed without any); version 2
//! (`"DUETRSN\x02"`) also carries bare tags (`n u32 | per tag: len u32 |
//! bytes`; installed as tags without outcomes); version 1
//! (`"DUETRSN\x01"`, written before the table was carried) has no
//! `retries` either (the member keeps its own table). Fixture:
//! `tests/fixtures/raft-snapshot-v3`. The checksum is verified before an
//! install touches a database.
//!
//! Memory: a build and an install stream: each image is written by the
//! checkpoint writer (frames of ~1 MiB) or copied from its pinned file, and
//! moved between files through fixed buffers; nothing holds a whole image.
//! Disk: a build's work files are one database's images at a time (removed
//! once packed). An installed named snapshot stays on disk until first read
//! (durable ones pinned in the database's manifest), so installing one costs
//! no memory; once read it is a full copy of its state (the sender's shares
//! its unchanged parts with the database's current state).
//!
//! Invariants:
//! - a snapshot's databases are exactly their published states after the
//!   entry `meta.last_log_id` was applied: they are taken (O(1) each, no
//!   lock) between two applies, when every applied group is published and
//!   none other is; its retry table and its named snapshots are taken at the
//!   same point (the tags of the entries applied up to there; every named
//!   snapshot held and not expired then, as a lease on its state or its
//!   pinned file). A
//!   pinned file that is gone by the time it is copied belonged to a
//!   snapshot that a later entry dropped (`dropSnapshot`, `dropDatabase`) or
//!   that expired: it is left out, and the receiver, which applies that
//!   entry after the snapshot, ends without it too;
//! - the `snapshot` file is replaced only by a snapshot of a later log id
//!   (builds and installs serialise on [`Snapshots::lock`]).

use std::fs::File;
use std::io::{BufReader, BufWriter, Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

use duetdb::replication::{NamedCopy, NamedImage};
use duetdb::Engine;
use openraft::{BasicNode, SnapshotMeta};
use serde::{Deserialize, Serialize};

use crate::log_store::fsync_dir;
use crate::types::NodeId;

pub type Meta = SnapshotMeta<NodeId, BasicNode>;

pub const SNAPSHOT_FILE: &str = "snapshot";
pub const INCOMING_FILE: &str = "snapshot.incoming";
const BUILD_DIR: &str = "snapshot.build";
const TMP_FILE: &str = "snapshot.tmp";
const RESTORE_DIR: &str = "snapshot.restore";
/// The format written (see the module doc); `"DUETRSN\x01"` to `\x03`
/// are read too.
const MAGIC: &[u8; 8] = b"DUETRSN\x04";
const MAGIC_PREFIX: &[u8; 7] = b"DUETRSN";
const VERSION: u8 = 4;
/// Longest name (database or file) a snapshot may hold.
const MAX_NAME: usize = 1024;
/// Longest description of a named snapshot (a name of at most 128 bytes
/// and its collections' names).
const MAX_NAMED_INFO: usize = 1 << 20;

/// Builds and installs of one member (see the module invariants).
#[derive(Default)]
pub struct Snapshots {
    pub lock: parking_lot::Mutex<()>,
}

/// What a snapshot is made of, taken between two applies.
pub struct Capture {
    pub meta: Meta,
    pub dbs: Vec<CapturedDb>,
    /// The retryable-write table (`retries.rs`), oldest tag first.
    pub retries: Vec<crate::retries::Retry>,
}

/// One database of a [`Capture`].
pub struct CapturedDb {
    pub name: String,
    pub state: duetdb::Snapshot,
    /// Its named snapshots (`Database::named_copies`).
    pub named: Vec<NamedCopy>,
}

/// Every database of `engine` that holds a commit, each with its published
/// state and named snapshots (`Database::named_copies`, no I/O). Requires:
/// called between two applies (see the module invariants).
pub fn capture_databases(engine: &Engine) -> Vec<CapturedDb> {
    engine
        .all_databases()
        .into_iter()
        .map(|d| CapturedDb {
            name: d.name().to_string(),
            state: d.snapshot(),
            named: d.named_copies(),
        })
        .filter(|d| d.state.csn() > 0)
        .collect()
}

/// A named snapshot's description in a snapshot file (version 4 on).
#[derive(Serialize, Deserialize, Debug, PartialEq, Eq)]
struct NamedInfo {
    name: String,
    csn: u64,
    /// Creation time, unix milliseconds (the primary's clock).
    created_ms: u64,
    /// Time to live in milliseconds; 0 = none.
    ttl_ms: u64,
    collections: Option<Vec<String>>,
    durable: bool,
}

impl From<&NamedImage> for NamedInfo {
    fn from(i: &NamedImage) -> NamedInfo {
        NamedInfo {
            name: i.name.clone(),
            csn: i.csn,
            created_ms: i.created_ms,
            ttl_ms: i.ttl_ms,
            collections: i.collections.clone(),
            durable: i.durable,
        }
    }
}

impl From<NamedInfo> for NamedImage {
    fn from(i: NamedInfo) -> NamedImage {
        NamedImage {
            name: i.name,
            csn: i.csn,
            created_ms: i.created_ms,
            ttl_ms: i.ttl_ms,
            collections: i.collections,
            durable: i.durable,
        }
    }
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

/// The metadata, and the format version (1 to [`VERSION`]).
fn read_header(r: &mut impl Read) -> std::io::Result<(Meta, u8)> {
    let mut magic = [0u8; 8];
    r.read_exact(&mut magic)?;
    let version = magic[7];
    if &magic[..7] != MAGIC_PREFIX || !(1..=VERSION).contains(&version) {
        return Err(other("not a duet replica-set snapshot"));
    }
    let len = get_u32(r)? as usize;
    if len > 1 << 20 {
        return Err(other(format!("snapshot metadata of {len} bytes")));
    }
    let mut b = vec![0u8; len];
    r.read_exact(&mut b)?;
    Ok((bincode::deserialize(&b).map_err(other)?, version))
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
    for db in &cap.dbs {
        pack_database(&mut w, &work, db)?;
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

/// Append database `db` to a snapshot being written: its image's files,
/// then its named snapshots (each written to `work` first, then copied in
/// and removed).
fn pack_database(w: &mut impl Write, work: &Path, db: &CapturedDb) -> std::io::Result<()> {
    let image = work.join(&db.name);
    duetdb::replication::write_image(&db.name, &db.state, &image).map_err(other)?;
    put_name(w, &db.name)?;
    let mut files: Vec<(String, PathBuf)> = std::fs::read_dir(&image)?
        .flatten()
        .filter(|e| e.path().is_file())
        .map(|e| (e.file_name().to_string_lossy().into_owned(), e.path()))
        .collect();
    files.sort();
    w.write_all(&(files.len() as u32).to_le_bytes())?;
    for (fname, path) in files {
        put_name(w, &fname)?;
        put_file(w, &path)?;
    }
    std::fs::remove_dir_all(&image)?;
    // Written out first: one whose pinned image is gone is left out (see
    // the module invariants), and the count comes before them.
    let mut named = Vec::with_capacity(db.named.len());
    for (i, copy) in db.named.iter().enumerate() {
        let path = work.join(format!("{}.named.{i}", db.name));
        if copy.write_image(&path).map_err(other)?.is_some() {
            named.push((NamedInfo::from(&copy.image), path));
        }
    }
    w.write_all(&(named.len() as u32).to_le_bytes())?;
    for (info, path) in named {
        let info = bincode::serialize(&info).map_err(other)?;
        w.write_all(&(info.len() as u32).to_le_bytes())?;
        w.write_all(&info)?;
        put_file(w, &path)?;
        std::fs::remove_file(&path)?;
    }
    Ok(())
}

/// Append `len u64 | the bytes` of file `path`, streamed.
fn put_file(w: &mut impl Write, path: &Path) -> std::io::Result<()> {
    let mut f = File::open(path)?;
    let len = f.metadata()?.len();
    w.write_all(&len.to_le_bytes())?;
    let copied = std::io::copy(&mut (&mut f).take(len), w)?;
    if copied != len {
        return Err(other(format!("{} shrank while copied", path.display())));
    }
    Ok(())
}

/// Read `len u64 | bytes` into the new file `to`, synced.
fn get_file(r: &mut impl Read, to: &Path) -> std::io::Result<()> {
    let len = get_u64(r)?;
    let mut f = File::create(to)?;
    let copied = std::io::copy(&mut r.take(len), &mut f)?;
    if copied != len {
        return Err(other("the snapshot file ends early"));
    }
    f.sync_all()
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
/// restored in place of the database of its name, with its named snapshots;
/// databases it does not hold are dropped. Its metadata and retry table
/// (the caller installs the table).
pub fn install(engine: &Engine, dir: &Path) -> std::io::Result<Installed> {
    let path = dir.join(SNAPSHOT_FILE);
    verify(&path)?;
    let mut r = BufReader::new(File::open(&path)?);
    let (meta, version) = read_header(&mut r)?;
    let retries = match version {
        1 => None,
        2 => Some(crate::retries::decode_tags(&mut r)?),
        _ => Some(crate::retries::decode(&mut r)?),
    };
    let staging = dir.join(RESTORE_DIR);
    let _ = std::fs::remove_dir_all(&staging);
    std::fs::create_dir_all(&staging)?;
    let ndb = get_u32(&mut r)?;
    let mut dbs = Vec::new();
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
            get_file(&mut r, &to.join(&fname))?;
        }
        fsync_dir(&to)?;
        let named = if version >= 4 {
            get_named(&mut r, &staging, &name)?
        } else {
            Vec::new()
        };
        dbs.push((name, named));
    }
    for (name, named) in &dbs {
        engine
            .restore_database_with(name, &staging.join(name), named)
            .map_err(other)?;
    }
    for db in engine.all_databases() {
        let name = db.name().to_string();
        drop(db);
        if !dbs.iter().any(|(n, _)| *n == name) {
            engine.try_drop_database(&name).map_err(other)?;
        }
    }
    let _ = std::fs::remove_dir_all(&staging);
    Ok(Installed { meta, retries })
}

/// The named snapshots of database `db` in a version-4 snapshot: each
/// description, its image unpacked to `staging` (`<db>.named.<i>`: a
/// database name holds no dot, so it meets no database's directory).
fn get_named(
    r: &mut impl Read,
    staging: &Path,
    db: &str,
) -> std::io::Result<Vec<(NamedImage, PathBuf)>> {
    let n = get_u32(r)? as usize;
    if n > duetdb::MAX_NAMED_SNAPSHOTS {
        return Err(other(format!(
            "{n} named snapshots of database {db} in a snapshot (at most {} are held)",
            duetdb::MAX_NAMED_SNAPSHOTS
        )));
    }
    let mut out = Vec::with_capacity(n);
    for i in 0..n {
        let len = get_u32(r)? as usize;
        if len > MAX_NAMED_INFO {
            return Err(other(format!(
                "a named snapshot's description of {len} bytes"
            )));
        }
        let mut b = vec![0u8; len];
        r.read_exact(&mut b)?;
        let info: NamedInfo = bincode::deserialize(&b).map_err(other)?;
        let path = staging.join(format!("{db}.named.{i}"));
        get_file(r, &path)?;
        out.push((NamedImage::from(info), path));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use bson::doc;

    fn meta(index: u64) -> Meta {
        Meta {
            last_log_id: Some(openraft::LogId::new(
                openraft::CommittedLeaderId::new(2, 0),
                index,
            )),
            last_membership: Default::default(),
            snapshot_id: format!("2-{index}-test"),
        }
    }

    fn capture(engine: &Engine, index: u64) -> Capture {
        Capture {
            meta: meta(index),
            dbs: capture_databases(engine),
            retries: Vec::new(),
        }
    }

    fn ids(engine: &Engine, db: &str, snap: Option<&str>, coll: &str) -> Vec<i32> {
        let d = engine.get(db).expect("name").expect("db");
        let s = match snap {
            Some(n) => d.named_snapshot(n).expect("named"),
            None => d.snapshot(),
        };
        let mut v: Vec<i32> = s
            .collection(coll)
            .find(doc! {})
            .run()
            .expect("find")
            .iter()
            .filter_map(|d| d.get_i32("_id").ok())
            .collect();
        v.sort();
        v
    }

    #[test]
    fn a_snapshot_carries_the_named_snapshots_with_their_digests() {
        let tmp = tempfile::tempdir().expect("tmp");
        let a = Engine::open(tmp.path().join("a")).expect("a");
        let db = a.database("d").expect("d");
        let c = db.collection("c");
        for i in 0..10 {
            c.insert_one(doc! {"_id": i}).expect("insert");
        }
        db.create_snapshot("kept", None, Some(std::time::Duration::from_secs(600)))
            .expect("named");
        c.delete_many(doc! {"_id": {"$lt": 4}}).expect("delete");
        let durable = duetdb::SnapshotOptions {
            durable: true,
            ..Default::default()
        };
        db.create_snapshot_with("pinned", durable).expect("durable");
        c.insert_one(doc! {"_id": 99}).expect("insert");
        let raft = tmp.path().join("raft");
        std::fs::create_dir_all(&raft).expect("raft dir");
        build(&raft, &Snapshots::default(), capture(&a, 30)).expect("build");
        assert!(!raft.join(BUILD_DIR).exists(), "work files removed");

        let b = Engine::open(tmp.path().join("b")).expect("b");
        let got = install(&b, &raft).expect("install");
        assert_eq!(got.meta.last_log_id, meta(30).last_log_id);
        assert_eq!(ids(&b, "d", None, "c"), ids(&a, "d", None, "c"));
        let rdb = b.get("d").expect("name").expect("d");
        for name in ["kept", "pinned"] {
            assert_eq!(
                ids(&b, "d", Some(name), "c"),
                ids(&a, "d", Some(name), "c"),
                "{name}"
            );
            assert_eq!(
                crate::digest::of_named(&b, "d", name, "c"),
                crate::digest::of_named(&a, "d", name, "c"),
                "{name}"
            );
            let (x, y) = (
                rdb.snapshot_info(name).expect("b"),
                db.snapshot_info(name).expect("a"),
            );
            // Creation times travel in milliseconds (as in the log).
            let ms = |t: std::time::SystemTime| {
                t.duration_since(std::time::UNIX_EPOCH)
                    .map_or(0, |d| d.as_millis())
            };
            assert_eq!(
                (x.csn, ms(x.created), x.ttl, x.durable),
                (y.csn, ms(y.created), y.ttl, y.durable),
                "{name}"
            );
        }
        assert_eq!(ids(&b, "d", Some("kept"), "c").len(), 10);
        assert!(rdb.snapshot_info("pinned").expect("pinned").durable);
        assert!(!raft.join(RESTORE_DIR).exists(), "staging removed");
    }

    /// A snapshot written before named snapshots were carried (version 3,
    /// made by that build: database `d` with an index, five documents and a
    /// named snapshot it does not carry, database `e`, one retry tag with
    /// its outcome) still installs.
    #[test]
    fn a_version_3_snapshot_still_installs() {
        let tmp = tempfile::tempdir().expect("tmp");
        let raft = tmp.path().join("raft");
        std::fs::create_dir_all(&raft).expect("raft dir");
        let fixture = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/raft-snapshot-v3");
        std::fs::copy(&fixture, raft.join(SNAPSHOT_FILE)).expect("fixture");
        let engine = Engine::open(tmp.path().join("data")).expect("engine");
        engine
            .database("stale")
            .expect("stale")
            .collection("x")
            .insert_one(doc! {"_id": 1})
            .expect("insert");
        let got = install(&engine, &raft).expect("install");
        assert_eq!(got.meta.last_log_id.map(|l| l.index), Some(17));
        let retries = got.retries.expect("a table");
        assert_eq!(retries.len(), 1);
        assert_eq!(
            (retries[0].tag.as_slice(), retries[0].outcome.as_slice()),
            (&b"tag-one"[..], &b"o"[..])
        );
        assert_eq!(ids(&engine, "d", None, "c"), [0, 1, 2, 3, 4]);
        assert_eq!(ids(&engine, "e", None, "x"), [1]);
        assert!(engine.get("stale").expect("name").is_none());
        let d = engine.get("d").expect("name").expect("d");
        assert_eq!(d.collection("c").list_indexes().expect("indexes").len(), 2);
        assert!(d.list_snapshots().is_empty());
    }

    #[test]
    fn only_plain_file_names_are_unpacked() {
        assert!(plain("MANIFEST") && plain("ckpt-00000000000000000001.ckpt"));
        for bad in ["", ".", "..", "../x", "a/b", "a\\b"] {
            assert!(!plain(bad), "{bad}");
        }
    }
}
