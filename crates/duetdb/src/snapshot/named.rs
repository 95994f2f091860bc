//! Named snapshots: virtual (`cow`) snapshots held by name with TTL expiry
//! (Cassandra's create / read / delete API), optionally durable, and the
//! analytics read mode (AnKer's hybrid execution: analytic queries run on a
//! fresh snapshot). The API's `Database` methods delegate here.
//!
//! A snapshot is an `Arc<DbState>` loaded from the writer's published root. The
//! writer never modifies a node a published state references, so holding one
//! costs exactly the nodes and documents later groups replace, and nothing on
//! the write path (the writer copies each touched node once per group whether
//! or not a snapshot is held; a held snapshot only stops the old copy being
//! freed).
//!
//! Invariants:
//! - creating a snapshot never goes through the writer and never waits for it:
//!   it loads the published root (O(1)), or for a restricted snapshot builds a
//!   new map of the chosen collections (O(k) for k collections, no node copied);
//! - a named snapshot's `csn` is the csn of the root it holds; every command
//!   acknowledged before `create_snapshot` was called is in it (the writer
//!   publishes before it replies), no command is in it partially (roots are
//!   published between groups);
//! - names are unique among held snapshots; an entry is removed by
//!   `drop_snapshot` or by expiry, after which the name reports why it is gone
//!   (bounded tombstones) until it is created again;
//! - an expired snapshot is never returned: expiry is checked on every access
//!   by name, and all expired entries are swept on create, list and
//!   `expire_snapshots` (no background thread);
//! - the registry lock is never held while a snapshot's memory is freed or its
//!   cost walked, so a large release or a `list_snapshots` does not stall other
//!   registry users, and it is never taken by the writer;
//! - durable snapshots (`SnapshotOptions::durable`): the registry entry exists
//!   only after the image is synced and the manifest recording it installed
//!   (the name is reserved meanwhile, and no file I/O runs under the registry
//!   lock); dropping or expiring one removes it from the manifest before its
//!   file; after a reopen they are registered by name and loaded from disk on
//!   the first read (a damaged image is an error on that read, never a panic
//!   or other data);
//! - copies (a replica set's Raft snapshot, docs/design.md §19):
//!   `copies` takes every unexpired snapshot's description with a lease on
//!   its state, or the path of its pinned image when it was not read since
//!   open (no I/O: no file opened, nothing loaded, nothing swept); `install_image` registers a copy's
//!   image as an on-disk entry loaded on first read — pinned when durable,
//!   otherwise a file of its own in no manifest (`spilled`), removed with
//!   its entry and, after a restart, at open.

use std::collections::{BTreeMap, HashSet, VecDeque};
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicU8;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use parking_lot::{Mutex, RwLock};

use crate::durability::io::Vfs;
use crate::durability::{checkpoint, Durable, Pin};
use crate::error::{Error, Result};
use crate::snapshot::retained::{retained_between, RetainedCost};
use crate::store::DbState;
use crate::write::writer::Writer;

/// Most named snapshots held at once per database. Each one can pin up to a
/// whole database version, and listing walks each; a bound keeps a runaway
/// client from pinning unbounded memory by name.
pub const MAX_NAMED_SNAPSHOTS: usize = 1024;
/// Longest snapshot name (bytes). Names will become directory names of durable
/// snapshots, so they are short and path-safe.
pub const MAX_SNAPSHOT_NAME: usize = 128;
/// How many dropped/expired names remember why they are gone (for error
/// messages); older ones just report "no snapshot named".
const MAX_TOMBSTONES: usize = 256;

// ---------------------------------------------------------------------------
// Clock

/// Time source for TTL expiry, behind a trait so tests control time instead of
/// sleeping.
pub trait Clock: Send + Sync + fmt::Debug {
    fn now(&self) -> Instant;
}

/// The real monotonic clock.
#[derive(Debug, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> Instant {
        Instant::now()
    }
}

/// A clock that moves only when told to (tests of TTL expiry).
#[derive(Debug)]
pub struct ManualClock {
    start: Instant,
    offset: Mutex<Duration>,
}

impl ManualClock {
    pub fn new() -> ManualClock {
        ManualClock {
            start: Instant::now(),
            offset: Mutex::new(Duration::ZERO),
        }
    }

    pub fn advance(&self, by: Duration) {
        *self.offset.lock() += by;
    }
}

impl Default for ManualClock {
    fn default() -> Self {
        ManualClock::new()
    }
}

impl Clock for ManualClock {
    fn now(&self) -> Instant {
        self.start + *self.offset.lock()
    }
}

// ---------------------------------------------------------------------------
// Named snapshots

/// What `list_snapshots` reports about one named snapshot.
#[derive(Debug, Clone, PartialEq)]
pub struct SnapshotInfo {
    pub name: String,
    pub csn: u64,
    /// Wall-clock creation time (for display).
    pub created: SystemTime,
    /// Time held so far, by the registry's clock.
    pub age: Duration,
    pub ttl: Option<Duration>,
    /// `None` = every collection of the database at `csn`.
    pub collections: Option<Vec<String>>,
    /// Filled by `list_snapshots` / `snapshot_info` (an O(size) walk). Zero
    /// for a durable snapshot not read since the database was opened (it is
    /// on disk only).
    pub retained: RetainedCost,
    /// Pinned to disk: survives restarts.
    pub durable: bool,
}

/// Options of [`Database::create_snapshot_with`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SnapshotOptions {
    /// Only these collections (`None`: all).
    pub collections: Option<Vec<String>>,
    /// Dropped automatically after this long (measured by wall-clock age
    /// across restarts for durable snapshots).
    pub ttl: Option<Duration>,
    /// Write the snapshot's state to its own checkpoint file, recorded in the
    /// manifest, so it survives restarts (databases opened from a directory).
    pub durable: bool,
}

/// A named snapshot as a copy of its database describes it (a replica
/// set's Raft snapshot carries one per named snapshot, with its image).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NamedImage {
    pub name: String,
    /// The csn of the state it holds (its `atClusterTime` follows from it).
    pub csn: u64,
    /// Creation time, unix milliseconds (age and TTL count from it).
    pub created_ms: u64,
    /// Time to live in milliseconds; 0 = none.
    pub ttl_ms: u64,
    /// `None` = every collection at `csn`.
    pub collections: Option<Vec<String>>,
    /// Pinned to disk: survives restarts (on the copy's receiver too).
    pub durable: bool,
}

/// One named snapshot taken for a copy of its database
/// ([`NamedSnapshots::copies`]): its description, and a lease on its state
/// or the image file it is loaded from.
pub struct NamedCopy {
    pub image: NamedImage,
    source: Source,
}

enum Source {
    Mem(Arc<DbState>),
    /// The pinned image of a durable snapshot not loaded since open.
    File {
        vfs: Arc<dyn Vfs>,
        path: PathBuf,
    },
}

impl NamedCopy {
    /// Write the snapshot's checkpoint image (the format durable snapshots
    /// are pinned in, §13.4) to the new file `to`, streaming: a held state
    /// with the checkpoint writer (frames of ~1 MiB), a pinned image copied
    /// through a fixed buffer, so the memory used is bounded whatever the
    /// snapshot's size. Its length; `None` when the pinned image is gone —
    /// the snapshot was dropped (or expired, or its database dropped) since
    /// [`NamedSnapshots::copies`] took it, so whatever dropped it comes after
    /// the copy's position and drops it at the receiver too.
    pub fn write_image(&self, to: &Path) -> Result<Option<u64>> {
        let io = |op, e: &std::io::Error| Error::from(crate::error::StorageError::io(op, to, e));
        match &self.source {
            Source::Mem(state) => {
                let (Some(dir), Some(file)) =
                    (to.parent(), to.file_name().and_then(|f| f.to_str()))
                else {
                    return Err(Error::Internal(format!("no file name in {}", to.display())));
                };
                let info = checkpoint::write_as(&crate::durability::io::RealFs, dir, file, state)?;
                Ok(Some(info.bytes))
            }
            Source::File { vfs, path } => {
                let mut from = match vfs.open_read(path) {
                    Ok(r) => r,
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
                    Err(e) => return Err(crate::error::StorageError::io("open", path, &e).into()),
                };
                let mut out = std::io::BufWriter::new(
                    std::fs::File::create(to).map_err(|e| io("create", &e))?,
                );
                let n = std::io::copy(&mut from, &mut out).map_err(|e| io("copy to", &e))?;
                out.into_inner()
                    .map_err(|e| io("write", e.error()))?
                    .sync_all()
                    .map_err(|e| io("fsync", &e))?;
                Ok(Some(n))
            }
        }
    }
}

/// Per-database default for analytic reads (AnKer's hybrid execution).
///
/// Every single read call already loads one published root at its start and
/// runs wholly on it, so one `find` or `count` is snapshot-consistent in either
/// mode. The mode decides what an *analytic session* ([`Database::analytics`])
/// reads, i.e. a query made of several calls (count then page through results,
/// several passes, a self-join):
/// - `Fresh` (the default): the session takes a fresh virtual snapshot when it
///   starts and every call in it reads that snapshot, so all its passes agree
///   while writes continue on the latest state;
/// - `Latest`: every call of the session reads the latest root at its own
///   start (fresher, but two calls may see different states; MongoDB's default).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum AnalyticsSnapshot {
    #[default]
    Fresh,
    Latest,
}

/// Why a name is no longer held.
#[derive(Debug, Clone, Copy)]
enum Gone {
    Dropped { csn: u64 },
    Expired { csn: u64, ttl: Duration },
}

/// A durable snapshot registered at open: on disk until first read.
struct OnDisk {
    pin: Pin,
    /// The loaded image; a failed load is retried on the next read (the
    /// cause may be transient), and the lock makes concurrent first reads
    /// load once.
    loaded: Mutex<Option<Arc<DbState>>>,
}

#[derive(Clone)]
enum Held {
    Mem(Arc<DbState>),
    Disk(Arc<OnDisk>),
}

impl Held {
    /// The snapshot if it is in memory.
    fn in_memory(&self) -> Option<Arc<DbState>> {
        match self {
            Held::Mem(s) => Some(s.clone()),
            Held::Disk(d) => d.loaded.lock().clone(),
        }
    }
}

struct Entry {
    snapshot: Held,
    csn: u64,
    collections: Option<Vec<String>>,
    created: SystemTime,
    created_at: Instant,
    /// Age already reached when the entry was registered (durable snapshots
    /// reloaded at open; zero otherwise).
    age_offset: Duration,
    ttl: Option<Duration>,
    /// File of the pinned image, for durable snapshots.
    durable: Option<String>,
    /// File of the image of a snapshot that is not durable but lives on
    /// disk (installed from a copy, [`NamedSnapshots::install_image`]): in
    /// no manifest, removed with the entry.
    spilled: Option<String>,
}

impl Entry {
    fn age(&self, now: Instant) -> Duration {
        self.age_offset + now.saturating_duration_since(self.created_at)
    }

    fn expired(&self, now: Instant) -> bool {
        self.ttl.is_some_and(|ttl| self.age(now) >= ttl)
    }

    /// An entry for the image on disk `pin` describes (loaded on first
    /// read), registered at `now`; its age counts from `pin.created_ms`.
    fn on_disk(pin: Pin, durable: bool, now: Instant) -> Entry {
        let created = std::time::UNIX_EPOCH + Duration::from_millis(pin.created_ms);
        let file = pin.file.clone();
        Entry {
            csn: pin.csn,
            collections: pin.collections.clone(),
            created,
            created_at: now,
            age_offset: SystemTime::now()
                .duration_since(created)
                .unwrap_or_default(),
            ttl: (pin.ttl_ms > 0).then(|| Duration::from_millis(pin.ttl_ms)),
            durable: durable.then(|| file.clone()),
            spilled: (!durable).then_some(file),
            snapshot: Held::Disk(Arc::new(OnDisk {
                pin,
                loaded: Mutex::new(None),
            })),
        }
    }

    /// How a copy of the database describes this entry.
    fn image(&self, name: &str) -> NamedImage {
        NamedImage {
            name: name.to_string(),
            csn: self.csn,
            created_ms: self
                .created
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_millis() as u64),
            ttl_ms: self.ttl.map_or(0, |t| (t.as_millis() as u64).max(1)),
            collections: self.collections.clone(),
            durable: self.durable.is_some(),
        }
    }

    fn info(&self, name: &str, now: Instant) -> SnapshotInfo {
        SnapshotInfo {
            name: name.to_string(),
            csn: self.csn,
            created: self.created,
            age: self.age(now),
            ttl: self.ttl,
            collections: self.collections.clone(),
            retained: RetainedCost::default(),
            durable: self.durable.is_some(),
        }
    }
}

/// Entries removed from the registry, freed by the caller outside its lock.
type Swept = Vec<(String, Entry)>;

#[derive(Default)]
struct Named {
    held: BTreeMap<String, Entry>,
    gone: VecDeque<(String, Gone)>,
    /// Names reserved while a durable snapshot is written or dropped.
    busy: HashSet<String>,
}

impl Named {
    fn bury(&mut self, name: String, why: Gone) {
        self.gone.retain(|(n, _)| *n != name);
        if self.gone.len() == MAX_TOMBSTONES {
            self.gone.pop_front();
        }
        self.gone.push_back((name, why));
    }

    /// Removes expired entries; returns them so the caller frees them after
    /// releasing the lock.
    fn sweep(&mut self, now: Instant) -> Vec<(String, Entry)> {
        let names: Vec<String> = self
            .held
            .iter()
            .filter(|(_, e)| e.expired(now))
            .map(|(n, _)| n.clone())
            .collect();
        let mut out = Vec::with_capacity(names.len());
        for name in names {
            if let Some(e) = self.held.remove(&name) {
                let why = Gone::Expired {
                    csn: e.csn,
                    ttl: e.ttl.unwrap_or_default(),
                };
                self.bury(name.clone(), why);
                out.push((name, e));
            }
        }
        out
    }

    /// Why a new snapshot named `name` cannot be held now, if it cannot:
    /// the name is taken (or reserved), or the bound is reached.
    fn refusal(&self, name: &str) -> Option<Error> {
        if self.held.contains_key(name) || self.busy.contains(name) {
            Some(Error::SnapshotExists(name.to_string()))
        } else if self.held.len() + self.busy.len() >= MAX_NAMED_SNAPSHOTS {
            Some(Error::IllegalOperation(format!(
                "too many named snapshots (limit {MAX_NAMED_SNAPSHOTS}); drop some first"
            )))
        } else {
            None
        }
    }

    fn not_found(&self, name: &str) -> Error {
        let why = self.gone.iter().rev().find(|(n, _)| n == name);
        Error::SnapshotNotFound(match why {
            Some((_, Gone::Dropped { csn })) => {
                format!("snapshot '{name}' was dropped (it was taken at csn {csn})")
            }
            Some((_, Gone::Expired { csn, ttl })) => format!(
                "snapshot '{name}' expired (taken at csn {csn}, ttl {} ms)",
                ttl.as_millis()
            ),
            None => format!("no snapshot named '{name}'"),
        })
    }
}

/// The per-database registry: named snapshots, the clock that expires them,
/// and the analytics read mode. Lives in the database; dropping the database
/// drops every named snapshot it holds.
pub struct Registry {
    named: Mutex<Named>,
    pub(crate) clock: RwLock<Arc<dyn Clock>>,
    pub(crate) analytics: AtomicU8,
}

impl Default for Registry {
    fn default() -> Self {
        Registry {
            named: Mutex::new(Named::default()),
            clock: RwLock::new(Arc::new(SystemClock)),
            analytics: AtomicU8::new(0),
        }
    }
}

impl fmt::Debug for Registry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Registry")
            .field("named", &self.named.lock().held.len())
            .finish()
    }
}

impl Registry {
    fn now(&self) -> Instant {
        self.clock.read().now()
    }
}

/// Snapshot names: 1..=128 bytes of `[A-Za-z0-9_.-]`, not starting with `.`
/// (they will name directories of durable snapshots).
pub fn validate_snapshot_name(name: &str) -> Result<()> {
    let bad = |why: &str| {
        Err(Error::bad_value(format!(
            "invalid snapshot name '{name}': {why}"
        )))
    };
    if name.is_empty() {
        return bad("must not be empty");
    }
    if name.len() > MAX_SNAPSHOT_NAME {
        return bad("longer than 128 bytes");
    }
    if name.starts_with('.') {
        return bad("must not start with '.'");
    }
    if let Some(c) = name
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.')))
    {
        return bad(&format!(
            "character {c:?} is not allowed (use A-Z a-z 0-9 _ - .)"
        ));
    }
    Ok(())
}

/// The state of `published` restricted to `names` (deduplicated). O(k): the
/// kept collections are O(1) clones sharing every node.
fn restrict(published: &Arc<DbState>, names: &[String]) -> Result<(Arc<DbState>, Vec<String>)> {
    if names.is_empty() {
        return Err(Error::bad_value(
            "collections must not be empty (omit it to snapshot every collection)",
        ));
    }
    let mut kept = BTreeMap::new();
    for name in names {
        let c = published.collection(name).ok_or_else(|| {
            Error::NamespaceNotFound(format!(
                "{}.{name}: cannot snapshot a collection that does not exist at csn {}",
                published.db, published.csn
            ))
        })?;
        kept.insert(name.clone(), c.clone());
    }
    let names = kept.keys().cloned().collect();
    Ok((
        Arc::new(DbState {
            db: published.db.clone(),
            csn: published.csn,
            ts: published.ts,
            collections: Arc::new(kept),
            vls_options: published.vls_options,
            delta: published.delta,
        }),
        names,
    ))
}

/// The registry together with what its operations need from the layers below:
/// the writer (the published root) and the durable store (pins). The API's
/// `Database` builds one per call.
pub struct NamedSnapshots<'a> {
    pub reg: &'a Registry,
    pub writer: &'a Writer,
    pub durable: Option<&'a Arc<Durable>>,
    /// The database's name (messages, pinned images).
    pub db: &'a str,
}

impl NamedSnapshots<'_> {
    /// `create_snapshot` with options; `durable: true` also writes
    /// the snapshot's state to its own checkpoint file and records it in the
    /// manifest (O(size of the snapshot) of I/O, on the caller's thread; the
    /// writer keeps going). It then survives restarts and is readable by name
    /// after reopening. A failed write (a full disk, an I/O error) fails the
    /// call and registers nothing. In-memory databases: `IllegalOperation`.
    pub fn create_snapshot_with(&self, name: &str, opts: SnapshotOptions) -> Result<SnapshotInfo> {
        self.create_snapshot_created(name, opts, None)
    }

    /// `create_snapshot_with`, created at wall-clock time `created` (`None`:
    /// now). A replica set passes the primary's time, so a snapshot's
    /// `created`, age and TTL expiry count from the same instant on every
    /// member (an age already reached is kept as for a durable snapshot
    /// reloaded at open).
    pub fn create_snapshot_created(
        &self,
        name: &str,
        opts: SnapshotOptions,
        created: Option<SystemTime>,
    ) -> Result<SnapshotInfo> {
        validate_snapshot_name(name)?;
        let SnapshotOptions {
            collections,
            ttl,
            durable,
        } = opts;
        if ttl.is_some_and(|t| t.is_zero()) {
            return Err(Error::bad_value("snapshot ttl must be positive"));
        }
        let store = match (durable, self.durable) {
            (false, _) => None,
            (true, Some(d)) => Some(d.clone()),
            (true, None) => {
                return Err(Error::IllegalOperation(format!(
                    "cannot create durable snapshot '{name}': database '{}' lives in memory (open it from a data directory)",
                    self.db
                )))
            }
        };
        let reg = self.reg;
        let (mut named, now, expired) = self.lock_for_new(name)?;
        // Loaded under the registry lock so snapshots created one after another
        // have non-decreasing csns in creation order.
        let published = self.writer.published();
        let (state, collections) = match collections {
            None => (published, None),
            Some(names) => match restrict(&published, &names) {
                Ok((state, names)) => (state, Some(names)),
                Err(e) => {
                    drop(named);
                    self.release_expired(expired);
                    return Err(e);
                }
            },
        };
        let wall = SystemTime::now();
        let created = created.unwrap_or(wall);
        let age_offset = wall.duration_since(created).unwrap_or_default();
        let csn = state.csn;
        if let Some(store) = store {
            // Reserve the name, then write the image without the registry lock.
            named.busy.insert(name.to_string());
            drop(named);
            self.release_expired(expired);
            let created_ms = created
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_millis() as u64);
            let ttl_ms = ttl.map_or(0, |t| (t.as_millis() as u64).max(1));
            let pinned = store.pin(name, &state, collections.clone(), created_ms, ttl_ms);
            named = reg.named.lock();
            named.busy.remove(name);
            let file = pinned?.file;
            let entry = Entry {
                snapshot: Held::Mem(state),
                csn,
                collections,
                created,
                created_at: now,
                age_offset,
                ttl,
                durable: Some(file),
                spilled: None,
            };
            return Ok(self.register(named, name, entry, now, Vec::new()));
        }
        let entry = Entry {
            csn,
            snapshot: Held::Mem(state),
            collections,
            created,
            created_at: now,
            age_offset,
            ttl,
            durable: None,
            spilled: None,
        };
        Ok(self.register(named, name, entry, now, expired))
    }

    /// The registry locked for a new snapshot named `name`, the registry's
    /// now, and the expired entries swept (for the caller to release outside
    /// the lock); the refusal when it cannot be held (`Named::refusal`; the
    /// swept entries then released already).
    fn lock_for_new(
        &self,
        name: &str,
    ) -> Result<(parking_lot::MutexGuard<'_, Named>, Instant, Swept)> {
        let now = self.reg.now();
        let mut named = self.reg.named.lock();
        let expired = named.sweep(now);
        if let Some(e) = named.refusal(name) {
            drop(named);
            self.release_expired(expired);
            return Err(e);
        }
        Ok((named, now, expired))
    }

    fn register(
        &self,
        mut named: parking_lot::MutexGuard<'_, Named>,
        name: &str,
        entry: Entry,
        now: Instant,
        expired: Vec<(String, Entry)>,
    ) -> SnapshotInfo {
        let info = entry.info(name, now);
        named.gone.retain(|(n, _)| n != name);
        named.held.insert(name.to_string(), entry);
        drop(named);
        self.release_expired(expired);
        info
    }

    /// Register the durable snapshots the manifest records (at open). Their
    /// images stay on disk until first read; expired ones are dropped.
    pub fn register_durable_snapshots(&self) {
        let Some(store) = self.durable else { return };
        let reg = self.reg;
        let now = reg.now();
        let mut named = reg.named.lock();
        for pin in store.pins() {
            let name = pin.name.clone();
            named.held.insert(name, Entry::on_disk(pin, true, now));
        }
        let expired = named.sweep(now);
        drop(named);
        self.release_expired(expired);
    }

    /// Every named snapshot held now and not expired, each with what a
    /// copy of the database needs to carry it: its description and a lease
    /// on its state, or the image file it is loaded from (a durable snapshot
    /// not read since open). No I/O: nothing is opened, and expired entries
    /// are left out rather than swept (sweeping one that is durable rewrites
    /// the manifest), so a replica set's state machine may call it between
    /// two applies. O(snapshots held), under the registry lock only while
    /// their entries are cloned.
    pub fn copies(&self) -> Vec<NamedCopy> {
        let reg = self.reg;
        let now = reg.now();
        let named = reg.named.lock();
        named
            .held
            .iter()
            .filter(|(_, e)| !e.expired(now))
            .filter_map(|(name, e)| {
                let source = match &e.snapshot {
                    Held::Mem(s) => Source::Mem(s.clone()),
                    // A first read may be loading it (holding `loaded` for
                    // the whole load): take the file then, not the lock.
                    Held::Disk(d) => match d.loaded.try_lock().and_then(|l| l.clone()) {
                        Some(s) => Source::Mem(s),
                        None => {
                            let (vfs, path) = self.durable?.image_file(&d.pin.file);
                            Source::File { vfs, path }
                        }
                    },
                };
                Some(NamedCopy {
                    image: e.image(name),
                    source,
                })
            })
            .collect()
    }

    /// Hold the named snapshot `image` describes, whose checkpoint image is
    /// the file `from` (as [`NamedCopy::write_image`] writes one; moved into
    /// the database's directory, on the same file system): a durable one is
    /// pinned (recorded in the manifest, so it survives restarts), one that
    /// is not stays on disk only while held (removed when dropped or
    /// expired, and at the next open). Either is loaded on its first read,
    /// so installing costs no memory; its creation time, age and TTL count
    /// from `image.created_ms`. How a replica-set member installs the named
    /// snapshots a Raft snapshot carries (docs/design.md §19).
    pub fn install_image(&self, image: &NamedImage, from: &Path) -> Result<SnapshotInfo> {
        validate_snapshot_name(&image.name)?;
        let name = image.name.as_str();
        let Some(store) = self.durable else {
            return Err(Error::IllegalOperation(format!(
                "cannot install snapshot '{name}': database '{}' lives in memory",
                self.db
            )));
        };
        let reg = self.reg;
        let (mut named, now, expired) = self.lock_for_new(name)?;
        named.busy.insert(name.to_string());
        drop(named);
        self.release_expired(expired);
        let pin = Pin {
            name: name.to_string(),
            csn: image.csn,
            file: store.image_name(name, image.csn),
            created_ms: image.created_ms,
            ttl_ms: image.ttl_ms,
            collections: image.collections.clone(),
        };
        let adopted = store.adopt_image(from, pin, image.durable);
        let mut named = reg.named.lock();
        named.busy.remove(name);
        let entry = Entry::on_disk(adopted?, image.durable, now);
        Ok(self.register(named, name, entry, now, Vec::new()))
    }

    /// Free swept entries outside the registry lock; expired durable ones are
    /// also removed from the manifest and disk (a failure is logged: the
    /// entry then comes back at the next open, already expired, and is
    /// dropped again).
    fn release_expired(&self, expired: Vec<(String, Entry)>) {
        for (name, e) in expired {
            if let (Some(file), Some(store)) = (&e.durable, self.durable) {
                if let Err(err) = store.unpin(&name, file) {
                    tracing::warn!(snapshot = %name, error = %err, "could not drop an expired durable snapshot");
                }
            }
            self.remove_spilled(&e);
            drop(e);
        }
    }

    /// Remove the image of an entry that is not durable but on disk.
    fn remove_spilled(&self, e: &Entry) {
        if let (Some(file), Some(store)) = (&e.spilled, self.durable) {
            store.remove_image(file);
        }
    }

    /// Resolve a held entry to a readable snapshot (loading a durable one's
    /// image on first read, without the registry lock).
    fn resolve(&self, held: Held) -> Result<Arc<DbState>> {
        match held {
            Held::Mem(s) => Ok(s),
            Held::Disk(d) => {
                let mut loaded = d.loaded.lock();
                if let Some(s) = &*loaded {
                    return Ok(s.clone());
                }
                let store = self.durable.ok_or_else(|| {
                    Error::IllegalOperation("a durable snapshot without a data directory".into())
                })?;
                let mut state = store.load_pin(&d.pin, self.db)?;
                state.vls_options = self.writer.published().vls_options;
                let s = Arc::new(state);
                *loaded = Some(s.clone());
                Ok(s)
            }
        }
    }

    /// The named snapshot, to run any read on. The returned handle is a lease:
    /// it stays readable even if the name is dropped or expires meanwhile (its
    /// memory is freed when the last lease ends), but the name no longer
    /// resolves. A durable snapshot reopened from disk is loaded on its first
    /// read; a damaged image gives a storage error naming the snapshot and file.
    pub fn named_snapshot(&self, name: &str) -> Result<Arc<DbState>> {
        let reg = self.reg;
        let now = reg.now();
        let mut named = reg.named.lock();
        let expired = match named.held.get(name) {
            Some(e) if !e.expired(now) => {
                let held = e.snapshot.clone();
                drop(named);
                return self.resolve(held);
            }
            Some(_) => named.sweep(now),
            None => Vec::new(),
        };
        let err = named.not_found(name);
        drop(named);
        self.release_expired(expired);
        Err(err)
    }

    /// Forget a named snapshot; its memory is freed once no lease holds it. A
    /// durable one is removed from the manifest (atomically), then its file
    /// deleted; if the manifest cannot be rewritten the call fails and the
    /// snapshot stays.
    pub fn drop_snapshot(&self, name: &str) -> Result<()> {
        let reg = self.reg;
        let now = reg.now();
        let mut named = reg.named.lock();
        let expired = named.sweep(now);
        if named.busy.contains(name) {
            drop(named);
            self.release_expired(expired);
            return Err(Error::IllegalOperation(format!(
                "snapshot '{name}' is being created or dropped; try again"
            )));
        }
        let Some(entry) = named.held.remove(name) else {
            let err = named.not_found(name);
            drop(named);
            self.release_expired(expired);
            return Err(err);
        };
        if let (Some(file), Some(store)) = (entry.durable.clone(), self.durable) {
            named.busy.insert(name.to_string());
            drop(named);
            let unpinned = store.unpin(name, &file);
            named = reg.named.lock();
            named.busy.remove(name);
            if let Err(e) = unpinned {
                named.held.insert(name.to_string(), entry);
                drop(named);
                self.release_expired(expired);
                return Err(e.into());
            }
        }
        named.bury(name.to_string(), Gone::Dropped { csn: entry.csn });
        drop(named);
        self.remove_spilled(&entry);
        // Freed here, on the caller's thread, outside the lock.
        drop(entry);
        self.release_expired(expired);
        Ok(())
    }

    /// Every held named snapshot, by name, with what it retains. Expired ones
    /// are swept first. O(size of the versions involved): the retained cost is
    /// walked per snapshot, outside the registry lock.
    pub fn list_snapshots(&self) -> Vec<SnapshotInfo> {
        let reg = self.reg;
        let now = reg.now();
        let mut named = reg.named.lock();
        let expired = named.sweep(now);
        let held: Vec<(SnapshotInfo, Held)> = named
            .held
            .iter()
            .map(|(n, e)| (e.info(n, now), e.snapshot.clone()))
            .collect();
        drop(named);
        self.release_expired(expired);
        let latest = self.writer.published();
        held.into_iter()
            .map(|(mut info, held)| {
                if let Some(snap) = held.in_memory() {
                    info.retained = retained_between(&snap, &latest);
                }
                info
            })
            .collect()
    }

    /// One named snapshot's description, with its retained cost.
    pub fn snapshot_info(&self, name: &str) -> Result<SnapshotInfo> {
        let reg = self.reg;
        let now = reg.now();
        let (mut info, held) = {
            let mut named = reg.named.lock();
            match named.held.get(name) {
                Some(e) if !e.expired(now) => (e.info(name, now), e.snapshot.clone()),
                _ => {
                    let expired = named.sweep(now);
                    let err = named.not_found(name);
                    drop(named);
                    self.release_expired(expired);
                    return Err(err);
                }
            }
        };
        if let Some(snap) = held.in_memory() {
            info.retained = retained_between(&snap, &self.writer.published());
        }
        Ok(info)
    }

    /// Drop every expired named snapshot now; returns how many. (Expiry is
    /// otherwise lazy: on access by name, create and list.)
    pub fn expire_snapshots(&self) -> usize {
        let reg = self.reg;
        let now = reg.now();
        let expired = reg.named.lock().sweep(now);
        let n = expired.len();
        self.release_expired(expired);
        n
    }

    /// Replace the clock that TTLs are measured with (tests use [`ManualClock`]).
    pub fn set_snapshot_clock(&self, clock: Arc<dyn Clock>) {
        *self.reg.clock.write() = clock;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_validated() {
        for ok in ["a", "daily-2024.01.01", "A_b-9", &"x".repeat(128)] {
            assert!(validate_snapshot_name(ok).is_ok(), "{ok}");
        }
        for bad in ["", ".hidden", "a/b", "a b", "é", &"x".repeat(129), "a\0"] {
            let e = validate_snapshot_name(bad).expect_err(bad);
            assert_eq!(e.code(), 2);
            assert!(e.to_string().contains("invalid snapshot name"), "{e}");
        }
    }

    #[test]
    fn tombstones_are_bounded_and_say_why() {
        let mut n = Named::default();
        for i in 0..(MAX_TOMBSTONES + 10) {
            n.bury(format!("s{i}"), Gone::Dropped { csn: i as u64 });
        }
        assert_eq!(n.gone.len(), MAX_TOMBSTONES);
        assert!(n.not_found("s0").to_string().contains("no snapshot named"));
        let last = format!("s{}", MAX_TOMBSTONES + 9);
        assert!(n.not_found(&last).to_string().contains("was dropped"));
        n.bury(
            "t".into(),
            Gone::Expired {
                csn: 3,
                ttl: Duration::from_secs(1),
            },
        );
        let e = n.not_found("t");
        assert_eq!(e.code(), 246);
        assert!(e.to_string().contains("expired"), "{e}");
    }
}
