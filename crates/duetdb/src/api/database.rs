//! The embedded API: databases, collection handles, CRUD, indexes, snapshots.
//!
//! Writes go through the database's single [`Writer`]; reads load the published
//! state (an O(1) consistent snapshot) and never block the writer. Every input
//! is parsed and validated before the writer sees it, so bad input costs the
//! writer nothing and changes nothing.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::api::*;
use crate::durability::background::Registration;
use crate::durability::changes::ChangeHub;
use crate::durability::effect::Effect;
use crate::durability::{
    CheckpointInfo, Durability, DurabilityOptions, Durable, Locking, RecoveryReport,
};
use crate::error::{Error, Result};
use crate::snapshot::{ReadCounts, ReadStats, Strategy};
use crate::store::collection::CollectionState;
use crate::store::index::IndexSpec;
use crate::store::options::CollectionOptions;
use crate::store::vls::{VlsOptions, VlsStats};
use crate::store::DbState;
use crate::write::command::{Command, Reply};
use crate::write::writer::Writer;

/// Longest collection name accepted (bytes).
pub const MAX_COLLECTION_NAME: usize = 255;

/// A database: one writer, any number of collections.
#[derive(Clone)]
pub struct Database {
    inner: Arc<DbInner>,
    /// Durability of writes through this handle (`None`: the database's default).
    durability: Option<Durability>,
    /// Opaque tag of the client operation writes through this handle belong
    /// to (a retryable write's session and number), replicated with them.
    origin: Option<Arc<[u8]>>,
    /// The statement ids of the client operation's items that writes
    /// through this handle carry ([`Database::with_statements`]).
    stmts: Option<Arc<[u32]>>,
}

struct DbInner {
    writer: Writer,
    path: Option<PathBuf>,
    /// Named snapshots and the analytics read mode (`crate::snapshot`).
    snapshots: crate::snapshot::named::Registry,
    /// The snapshot strategy of reads that do not choose one.
    default_strategy: parking_lot::RwLock<Strategy>,
    /// The index view of reads that do not choose one (`store::delta`).
    default_index_read: parking_lot::RwLock<crate::store::delta::IndexRead>,
    /// Live reads by the strategy they ran under.
    reads: ReadCounts,
    durable: Option<Arc<Durable>>,
    /// Its place in the shared flusher and checkpointer.
    background: parking_lot::Mutex<Option<Registration>>,
    /// Index builds in progress outside the writer (`api::index_build`).
    index_builds: crate::api::index_build::Builds,
}

impl Drop for DbInner {
    fn drop(&mut self) {
        // Leave the flusher and checkpointer first (waiting for their work in
        // flight on this database), then sync what `batch` writes left
        // unsynced; the directory lock goes with `durable`.
        drop(self.background.lock().take());
        if let Some(d) = &self.durable {
            d.close();
        }
    }
}

/// Options of a database.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DbOptions {
    /// VLS scan slots (64 or 128) and remset mode.
    pub vls: VlsOptions,
    /// Strategy of reads that do not choose one (`auto`: `cow` for `_id` lookups, `vls` otherwise).
    pub default_strategy: Strategy,
    /// Delta indexing (`store::delta`, `write::delta`); off by default.
    pub delta: crate::store::DeltaOptions,
    /// Index view of reads that do not choose one (fresh by default).
    pub index_read: crate::store::delta::IndexRead,
}

impl std::fmt::Debug for Database {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Database")
            .field("name", &self.name())
            .field("path", &self.inner.path)
            .finish()
    }
}

impl Database {
    /// A database that lives in memory only.
    pub fn in_memory() -> Database {
        Database::named("default", None)
    }

    /// A named in-memory database (used by the multi-database [`crate::Engine`]).
    pub fn named(name: &str, path: Option<PathBuf>) -> Database {
        Database::with_options(name, path, DbOptions::default())
    }

    /// A named in-memory database with explicit options.
    pub fn with_options(name: &str, path: Option<PathBuf>, options: DbOptions) -> Database {
        Database::in_hub(name, path, options, Arc::new(ChangeHub::default()))
    }

    /// An in-memory database whose groups go to `hub` (an Engine's).
    pub(crate) fn in_hub(
        name: &str,
        path: Option<PathBuf>,
        options: DbOptions,
        hub: Arc<ChangeHub>,
    ) -> Database {
        let initial = DbState {
            vls_options: options.vls,
            ..DbState::default()
        };
        let writer = Writer::with_hub(name, initial, hub);
        writer.set_delta(options.delta);
        Database {
            inner: Arc::new(DbInner {
                writer,
                path,
                default_strategy: parking_lot::RwLock::new(options.default_strategy),
                default_index_read: parking_lot::RwLock::new(options.index_read),
                reads: ReadCounts::default(),
                snapshots: Default::default(),
                durable: None,
                background: parking_lot::Mutex::new(None),
                index_builds: Default::default(),
            }),
            durability: None,
            origin: None,
            stmts: None,
        }
    }

    /// The strategy of reads that do not choose one.
    pub fn default_strategy(&self) -> Strategy {
        *self.inner.default_strategy.read()
    }

    /// Change the store-wide default strategy (e.g. `none` for the baseline).
    pub fn set_default_strategy(&self, strategy: Strategy) {
        *self.inner.default_strategy.write() = strategy;
    }

    /// The index view of reads that do not choose one.
    pub fn default_index_read(&self) -> crate::store::delta::IndexRead {
        *self.inner.default_index_read.read()
    }

    /// Change the database's default index view (`fresh` or `stale`).
    pub fn set_default_index_read(&self, read: crate::store::delta::IndexRead) {
        *self.inner.default_index_read.write() = read;
    }

    /// Delta indexing's settings from the next write group on. Switching it
    /// off folds every index's layers into its tree at the next group.
    pub fn set_delta_indexing(&self, options: crate::store::DeltaOptions) {
        self.inner.writer.set_delta(options);
    }

    pub fn delta_indexing(&self) -> crate::store::DeltaOptions {
        self.inner.writer.delta()
    }

    /// Delta indexing figures: cuts, merges, entries merged, merge lag.
    pub fn delta_stats(&self) -> crate::write::delta::DeltaStats {
        self.inner.writer.delta_stats()
    }

    /// Are delta merges queued, running or not yet installed?
    pub fn delta_busy(&self) -> bool {
        self.inner.writer.delta_busy()
    }

    /// Start a new window for the remset peak figures of [`Database::vls_stats`].
    pub fn reset_vls_peaks(&self) {
        for c in self.inner.writer.published().collections.values() {
            c.vls.remset.reset_peaks();
        }
    }

    /// How many live reads ran under each strategy.
    pub fn read_stats(&self) -> ReadStats {
        self.inner.reads.stats()
    }

    /// Count a live read that ran under `strategy`.
    pub(crate) fn note_read(&self, strategy: Strategy) {
        self.inner.reads.record(strategy);
    }

    /// VLS figures summed over all collections: scans active/queued, remset
    /// entries and bytes (current and peak), shared and reclaimed versions.
    pub fn vls_stats(&self) -> VlsStats {
        let state = self.inner.writer.published();
        let mut total = VlsStats::default();
        for c in state.collections.values() {
            let s = c.vls.stats();
            total.scans_active += s.scans_active;
            total.scans_queued += s.scans_queued;
            total.scans_started += s.scans_started;
            total.queue_wait_us_total += s.queue_wait_us_total;
            total.background_resets += s.background_resets;
            total.reset_words_written += s.reset_words_written;
            total.olcp_propagated += s.olcp_propagated;
            total.olcp_inflight += s.olcp_inflight;
            let (t, r) = (&mut total.remset, s.remset);
            t.entries += r.entries;
            t.bytes += r.bytes;
            t.entries_peak += r.entries_peak;
            t.bytes_peak += r.bytes_peak;
            t.shared_inserts += r.shared_inserts;
            t.inserts += r.inserts;
            t.reclaimed += r.reclaimed;
            t.insert_calls += r.insert_calls;
            t.needing_total += r.needing_total;
        }
        total
    }

    /// Writer figures: queue length now, groups and commands so far, csn.
    pub fn writer_stats(&self) -> crate::write::writer::WriterStats {
        self.inner.writer.stats()
    }

    /// Write-ahead log figures; `None` for a database without a log.
    pub fn wal_stats(&self) -> Option<crate::durability::wal::WalStats> {
        self.inner.writer.wal().map(|w| w.stats())
    }

    /// Checkpoints installed since open (count, durations, last size);
    /// `None` for a database without a directory.
    pub fn checkpoint_stats(&self) -> Option<crate::durability::CheckpointStats> {
        self.inner.durable.as_ref().map(|d| d.checkpoint_stats())
    }

    /// Open (or create) the durable database kept in directory `path`:
    /// recover it, lock the directory, and log every write (`fsync` mode).
    ///
    /// The directory is locked (`<path>/LOCK`); when `path` is a database of
    /// a data directory (its parent has a `LOCK`), the data directory is
    /// locked too, so this fails while a server (an [`crate::Engine`]) has it
    /// open and keeps one from opening it meanwhile. A data directory's
    /// databases are meant to be opened through [`crate::Engine`].
    pub fn open(path: impl AsRef<Path>) -> Result<Database> {
        Database::open_with(path, DurabilityOptions::default())
    }

    /// [`Database::open`] with options (durability mode, WAL and checkpoint
    /// sizes, the file system).
    pub fn open_with(path: impl AsRef<Path>, options: DurabilityOptions) -> Result<Database> {
        Database::open_named("default", path.as_ref(), options)
    }

    /// Open the durable database `name` kept in `path` (locked on its own).
    pub fn open_named(name: &str, path: &Path, options: DurabilityOptions) -> Result<Database> {
        let hub = Arc::new(ChangeHub::default());
        let db = Database::open_locked(name, path, options, &Locking::Own, hub.clone())?;
        hub.start_after_recovery();
        Ok(db)
    }

    /// Open the durable database `name` kept in `path`, locked as `locking` says.
    pub(crate) fn open_locked(
        name: &str,
        path: &Path,
        options: DurabilityOptions,
        locking: &Locking,
        hub: Arc<ChangeHub>,
    ) -> Result<Database> {
        let mode = options.mode;
        let (durable, state) = Durable::open(path, name, options, locking)?;
        // Spill files a crashed process left (the directory lock is ours now).
        let spill = path.join(crate::api::find::SPILL_DIR);
        if let Err(e) = crate::query::spill::clear_dir(&spill) {
            tracing::warn!(dir = %spill.display(), error = %e, "could not clear the spill directory");
        }
        let durable = Arc::new(durable);
        let writer = Writer::with_wal(name, state, durable.wal().cloned(), mode, hub);
        let inner = Arc::new(DbInner {
            writer,
            path: Some(path.to_path_buf()),
            snapshots: Default::default(),
            default_strategy: parking_lot::RwLock::new(Strategy::default()),
            default_index_read: parking_lot::RwLock::new(crate::store::delta::IndexRead::default()),
            reads: ReadCounts::default(),
            durable: Some(durable.clone()),
            background: parking_lot::Mutex::new(None),
            index_builds: Default::default(),
        });
        let weak = Arc::downgrade(&inner);
        let bg = Registration::register(&durable, move || {
            weak.upgrade().map(|i| i.writer.published())
        });
        *inner.background.lock() = Some(bg);
        let db = Database {
            inner,
            durability: None,
            origin: None,
            stmts: None,
        };
        // Durable named snapshots come back by name (loaded on first read).
        db.register_durable_snapshots();
        Ok(db)
    }

    /// A handle on the same database whose writes use `durability` (MongoDB's
    /// per-write `j`): `Fsync` waits for the WAL sync, `Batch` and `None` do
    /// not (on a logged database they are still logged, in order).
    pub fn with_durability(&self, durability: Durability) -> Database {
        Database {
            inner: self.inner.clone(),
            durability: Some(durability),
            origin: self.origin.clone(),
            stmts: self.stmts.clone(),
        }
    }

    /// A handle on the same database whose writes carry `origin`, an opaque
    /// tag of the client operation they belong to: a replica set commits
    /// the tags of a group's successful writes with its record
    /// (`durability::replicate::GroupRecord::origins`), so every member
    /// knows which retryable writes were applied.
    pub fn with_origin(&self, origin: Arc<[u8]>) -> Database {
        Database {
            inner: self.inner.clone(),
            durability: self.durability,
            origin: Some(origin),
            stmts: self.stmts.clone(),
        }
    }

    /// A handle whose tagged writes say which statements of their client
    /// operation they are: `stmts[i]` is the statement id of item `i` of
    /// the next command (an insert's document `i`; an update's, delete's or
    /// findAndModify's one statement is item 0). Without it item `i` is
    /// statement `i`. The ids are recorded with the outcome
    /// (`WriteOutcome::encode_at`), so a retry knows which statements of a
    /// batch were applied and runs only the others, as MongoDB does with
    /// its `stmtId`s.
    pub fn with_statements(&self, stmts: Arc<[u32]>) -> Database {
        Database {
            inner: self.inner.clone(),
            durability: self.durability,
            origin: self.origin.clone(),
            stmts: Some(stmts),
        }
    }

    /// Write a checkpoint of the latest state now and install it (WAL
    /// segments it makes unnecessary are deleted). `Ok(None)` when the
    /// database is in memory or nothing changed since the last checkpoint.
    pub fn checkpoint(&self) -> Result<Option<CheckpointInfo>> {
        match &self.inner.durable {
            Some(d) => Ok(d.checkpoint(&self.inner.writer.published())?),
            None => Ok(None),
        }
    }

    /// What recovery did when the database was opened (durable databases).
    pub fn recovery_report(&self) -> Option<&RecoveryReport> {
        self.inner.durable.as_ref().map(|d| d.report())
    }

    pub fn name(&self) -> &str {
        self.inner.writer.db_name()
    }

    /// The data directory, for databases opened by path.
    pub fn path(&self) -> Option<&Path> {
        self.inner.path.as_deref()
    }

    /// Handle on collection `name` (created implicitly by its first write).
    pub fn collection(&self, name: &str) -> Collection {
        Collection {
            db: self.clone(),
            name: name.to_string(),
            bypass_validation: false,
            collation: None,
        }
    }

    /// The database's writer (for engine modules that add commands or read state).
    #[allow(dead_code)] // used by engine modules as they land (named snapshots, VLS)
    pub(crate) fn writer(&self) -> &Writer {
        &self.inner.writer
    }

    /// Whether `other` is a handle on this same database.
    pub fn same_as(&self, other: &Database) -> bool {
        Arc::ptr_eq(&self.inner, &other.inner)
    }

    /// Handles on this database alive now (this one included).
    pub(crate) fn handle_count(&self) -> usize {
        Arc::strong_count(&self.inner)
    }

    /// No collection and no named snapshot.
    pub(crate) fn is_empty(&self) -> bool {
        self.inner.writer.published().collections.is_empty() && self.list_snapshots().is_empty()
    }

    /// Leave the background flusher and checkpointer now (a dropped
    /// database: handles still held elsewhere must not checkpoint into a
    /// directory that is being deleted or reused).
    pub(crate) fn stop_background(&self) {
        drop(self.inner.background.lock().take());
    }

    /// The durable side, for databases opened from a directory.
    pub(crate) fn durable(&self) -> Option<&Arc<Durable>> {
        self.inner.durable.as_ref()
    }

    /// The named-snapshot registry (methods in `crate::snapshot`).
    pub(crate) fn snapshot_registry(&self) -> &crate::snapshot::named::Registry {
        &self.inner.snapshots
    }

    /// See [`crate::Engine::set_replicator`].
    pub(crate) fn set_replicator(
        &self,
        replicator: Option<Arc<dyn crate::durability::replicate::Replicate>>,
    ) {
        self.inner.writer.set_replicator(replicator);
    }

    /// Apply one WAL record payload that the replica set committed (a
    /// member that is not the primary follows the set this way): replayed
    /// as recovery replays it, logged verbatim, published. `Ok(false)` when
    /// it does not continue this database's log and was skipped (every
    /// member skips it alike). An error stops the database's writer: this
    /// member no longer holds the set's state.
    pub fn apply_replicated(&self, payload: Arc<[u8]>) -> Result<bool> {
        self.inner.writer.apply_replicated(payload)
    }

    pub(crate) fn index_builds(&self) -> &crate::api::index_build::Builds {
        &self.inner.index_builds
    }

    pub(crate) fn submit(&self, cmd: Command) -> Result<Reply> {
        self.submit_statements(cmd, &[0])
    }

    /// [`Database::submit`] of a command whose item `i` is item `items[i]`
    /// of this handle's statements (an insert whose documents that failed
    /// to prepare were left out).
    pub(crate) fn submit_statements(&self, cmd: Command, items: &[usize]) -> Result<Reply> {
        let stmts = self.origin.as_ref().map(|_| -> Arc<[u32]> {
            items
                .iter()
                .map(|&i| {
                    let own = u32::try_from(i).unwrap_or(u32::MAX);
                    self.stmts
                        .as_ref()
                        .map_or(own, |s| s.get(i).copied().unwrap_or(own))
                })
                .collect()
        });
        self.inner
            .writer
            .submit_at(cmd, self.durability, self.origin.clone(), stmts)
    }

    /// Create an empty collection; error if it exists.
    pub fn create_collection(&self, name: &str) -> Result<()> {
        validate_collection_name(name)?;
        self.submit(Command::CreateCollection {
            name: name.to_string(),
        })
        .map(|_| ())
    }

    /// Create an empty collection with `options` (`create`'s options, logged
    /// with it as one change); NamespaceExists when it exists.
    pub fn create_collection_with(&self, name: &str, options: CollectionOptions) -> Result<()> {
        let options = options.with_defaults();
        if options.is_default() {
            return self.create_collection(name);
        }
        validate_collection_name(name)?;
        crate::query::validator::check(&options)?;
        let name = name.to_string();
        self.writer().at_boundary(move |state, fx| {
            if state.collection(&name).is_some() {
                return Err(Error::NamespaceExists(name));
            }
            let mut c = CollectionState::new(&format!("{}.{name}", state.db), state.vls_options);
            c.options = options.clone();
            // A non-simple default collation: the `_id` index takes it (as
            // MongoDB's), kept as the collated `_id` index beside the simple
            // one (`IndexSpec::collated_id`), logged with the creation.
            let id_index = options.collation.clone().map(IndexSpec::collated_id);
            if let Some(spec) = &id_index {
                c.create_index(spec.clone())?;
            }
            Arc::make_mut(&mut state.collections).insert(name.clone(), c);
            fx.record(|| Effect::CreateCollection { name: name.clone() });
            fx.record(|| Effect::SetOptions {
                coll: name.clone(),
                options,
            });
            if let Some(spec) = id_index {
                fx.record(|| Effect::CreateIndex { coll: name, spec });
            }
            Ok(())
        })
    }

    /// Drop a collection; `Ok(false)` when it did not exist.
    pub fn drop_collection(&self, name: &str) -> Result<bool> {
        match self.submit(Command::DropCollection {
            name: name.to_string(),
        })? {
            Reply::Existed(b) => {
                // Its builds would find it gone at their next step anyway.
                self.index_builds()
                    .abort(name, None, "collection dropped during the build");
                Ok(b)
            }
            other => Err(unexpected(other)),
        }
    }

    /// Rename a collection (atomically, at one csn). With `drop_target`, an
    /// existing collection named `to` is replaced.
    pub fn rename_collection(&self, from: &str, to: &str, drop_target: bool) -> Result<()> {
        validate_collection_name(to)?;
        self.submit(Command::RenameCollection {
            from: from.to_string(),
            to: to.to_string(),
            drop_target,
        })?;
        let builds = self.index_builds();
        builds.abort(from, None, "collection renamed during the build");
        builds.abort(to, None, "collection replaced during the build");
        Ok(())
    }

    /// Names of the collections, sorted.
    pub fn list_collection_names(&self) -> Vec<String> {
        self.inner
            .writer
            .published()
            .collections
            .keys()
            .cloned()
            .collect()
    }

    /// An O(1) consistent snapshot of the whole database at the latest commit.
    pub fn snapshot(&self) -> Snapshot {
        Snapshot::from_state(self.inner.writer.published())
    }

    /// The latest commit sequence number.
    pub fn csn(&self) -> u64 {
        self.inner.writer.published().csn
    }

    /// Totals over all collections.
    pub fn stats(&self) -> DbStats {
        let state = self.inner.writer.published();
        let mut s = DbStats {
            csn: state.csn,
            ..Default::default()
        };
        for c in state.collections.values() {
            s.collections += 1;
            s.objects += c.len() as u64;
            s.data_bytes += c.data_bytes;
            s.indexes += 1 + c.indexes.len() as u64;
        }
        s
    }
}

pub(crate) fn unexpected(r: Reply) -> Error {
    Error::Internal(format!("unexpected writer reply {r:?}"))
}

/// MongoDB's collection-name rules.
pub fn validate_collection_name(name: &str) -> Result<()> {
    let bad = |why: &str| {
        Err(Error::InvalidNamespace(format!(
            "invalid collection name '{name}': {why}"
        )))
    };
    if name.is_empty() {
        return bad("must not be empty");
    }
    if name.len() > MAX_COLLECTION_NAME {
        return bad("too long");
    }
    if name.contains('$') {
        return bad("must not contain '$'");
    }
    if name.contains('\0') {
        return bad("must not contain NUL");
    }
    if name.starts_with('.') || name.ends_with('.') {
        return bad("must not start or end with '.'");
    }
    if name.starts_with("system.") {
        return bad("the 'system.' prefix is reserved");
    }
    Ok(())
}

/// Database totals.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct DbStats {
    pub csn: u64,
    pub collections: u64,
    pub objects: u64,
    pub data_bytes: u64,
    pub indexes: u64,
}

/// Collection figures (`collStats`).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct CollStats {
    pub count: u64,
    pub data_bytes: u64,
    pub avg_obj_size: u64,
    pub indexes: Vec<(String, u64)>,
    pub heap_nodes: u64,
}
