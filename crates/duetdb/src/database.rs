//! The embedded API: databases, collection handles, CRUD, indexes, snapshots.
//!
//! Writes go through the database's single [`Writer`]; reads load the published
//! state (an O(1) consistent snapshot) and never block the writer. Every input
//! is parsed and validated before the writer sees it, so bad input costs the
//! writer nothing and changes nothing.

use std::ops::ControlFlow;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use bson::{Bson, Document};

use crate::collection::{CollectionState, ID_INDEX_NAME};
use crate::command::{
    Command, FindAndModifyCommand, FindAndModifyOutcome, InsertOutcome, Reply, UpdateCommand,
    UpdateResult,
};
use crate::doc::{self, DocRef};
use crate::durability::{
    Background, CheckpointInfo, Durability, DurabilityOptions, Durable, RecoveryReport,
};
use crate::error::{Error, Result};
use crate::index::IndexSpec;
use crate::planner::{self, FindSpec, Hint, Plan};
use crate::query::{Filter, Projection, SortSpec, UpdateSpec};
use crate::scan::vls::{VlsOptions, VlsStats};
use crate::scan::{self, ScanOutcome, Strategy};
use crate::writer::{DbState, Writer};
use crate::BulkWriteFailure;

/// Longest collection name accepted (bytes).
pub const MAX_COLLECTION_NAME: usize = 255;

/// A database: one writer, any number of collections.
#[derive(Clone)]
pub struct Database {
    inner: Arc<DbInner>,
    /// Durability of writes through this handle (`None`: the database's default).
    durability: Option<Durability>,
}

struct DbInner {
    writer: Writer,
    path: Option<PathBuf>,
    /// Named snapshots and the analytics read mode (`crate::snapshot`).
    snapshots: crate::snapshot::Registry,
    /// The snapshot strategy of reads that do not choose one.
    default_strategy: parking_lot::RwLock<Strategy>,
    durable: Option<Arc<Durable>>,
    background: parking_lot::Mutex<Option<Background>>,
}

impl Drop for DbInner {
    fn drop(&mut self) {
        // Stop the flusher and checkpointer first, then sync what `batch`
        // writes left unsynced; the directory lock goes with `durable`.
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
        let initial = DbState {
            vls_options: options.vls,
            ..DbState::default()
        };
        Database {
            inner: Arc::new(DbInner {
                writer: Writer::new(name, initial),
                path,
                default_strategy: parking_lot::RwLock::new(options.default_strategy),
                snapshots: Default::default(),
                durable: None,
                background: parking_lot::Mutex::new(None),
            }),
            durability: None,
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

    /// Start a new window for the remset peak figures of [`Database::vls_stats`].
    pub fn reset_vls_peaks(&self) {
        for c in self.inner.writer.published().collections.values() {
            c.vls.remset.reset_peaks();
        }
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
        }
        total
    }

    /// Writer figures: queue length now, groups and commands so far, csn.
    pub fn writer_stats(&self) -> crate::writer::WriterStats {
        self.inner.writer.stats()
    }

    /// Write-ahead log figures; `None` for a database without a log.
    pub fn wal_stats(&self) -> Option<crate::durability::wal::WalStats> {
        self.inner.writer.wal().map(|w| w.stats())
    }

    /// Open (or create) the durable database kept in directory `path`:
    /// recover it, lock the directory, and log every write (`fsync` mode).
    pub fn open(path: impl AsRef<Path>) -> Result<Database> {
        Database::open_with(path, DurabilityOptions::default())
    }

    /// [`Database::open`] with options (durability mode, WAL and checkpoint
    /// sizes, the file system).
    pub fn open_with(path: impl AsRef<Path>, options: DurabilityOptions) -> Result<Database> {
        Database::open_named("default", path.as_ref(), options)
    }

    /// Open the durable database `name` kept in `path`.
    pub fn open_named(name: &str, path: &Path, options: DurabilityOptions) -> Result<Database> {
        let mode = options.mode;
        let (durable, state) = Durable::open(path, name, options)?;
        let durable = Arc::new(durable);
        let writer = Writer::with_wal(name, state, durable.wal().cloned(), mode);
        let inner = Arc::new(DbInner {
            writer,
            path: Some(path.to_path_buf()),
            snapshots: Default::default(),
            default_strategy: parking_lot::RwLock::new(Strategy::default()),
            durable: Some(durable.clone()),
            background: parking_lot::Mutex::new(None),
        });
        let weak = Arc::downgrade(&inner);
        let bg = Background::start(&durable, move || {
            weak.upgrade().map(|i| i.writer.published())
        });
        *inner.background.lock() = Some(bg);
        let db = Database {
            inner,
            durability: None,
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
        }
    }

    /// The database's writer (for engine modules that add commands or read state).
    #[allow(dead_code)] // used by engine modules as they land (named snapshots, VLS)
    pub(crate) fn writer(&self) -> &Writer {
        &self.inner.writer
    }

    /// The durable side, for databases opened from a directory.
    pub(crate) fn durable(&self) -> Option<&Arc<Durable>> {
        self.inner.durable.as_ref()
    }

    /// The named-snapshot registry (methods in `crate::snapshot`).
    pub(crate) fn snapshot_registry(&self) -> &crate::snapshot::Registry {
        &self.inner.snapshots
    }

    pub(crate) fn submit(&self, cmd: Command) -> Result<Reply> {
        self.inner.writer.submit_with(cmd, self.durability)
    }

    /// Create an empty collection; error if it exists.
    pub fn create_collection(&self, name: &str) -> Result<()> {
        validate_collection_name(name)?;
        self.submit(Command::CreateCollection {
            name: name.to_string(),
        })
        .map(|_| ())
    }

    /// Drop a collection; `Ok(false)` when it did not exist.
    pub fn drop_collection(&self, name: &str) -> Result<bool> {
        match self.submit(Command::DropCollection {
            name: name.to_string(),
        })? {
            Reply::Existed(b) => Ok(b),
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
        })
        .map(|_| ())
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
        Snapshot {
            state: self.inner.writer.published(),
        }
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

fn empty_outcome(csn: u64) -> ScanOutcome {
    ScanOutcome {
        strategy: Strategy::Cow,
        start_csn: csn,
        plan: Plan {
            access: planner::Access::CollScan { reverse: false },
            provides_sort: true,
        },
        from_remset: 0,
        propagated: 0,
        inflight_peak: 0,
    }
}

fn unexpected(r: Reply) -> Error {
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

/// A frozen, consistent view of a whole database: everything committed up to
/// `csn()` and nothing after, for as long as it is held.
#[derive(Clone, Debug)]
pub struct Snapshot {
    state: Arc<DbState>,
}

impl Snapshot {
    /// A snapshot over a state the caller took from the published root (or a
    /// restriction of one to some collections).
    pub(crate) fn from_state(state: Arc<DbState>) -> Snapshot {
        Snapshot { state }
    }

    pub fn csn(&self) -> u64 {
        self.state.csn
    }

    /// Read-only handle on a collection as of this snapshot.
    pub fn collection(&self, name: &str) -> SnapshotCollection {
        SnapshotCollection {
            state: self.state.clone(),
            name: name.to_string(),
        }
    }

    pub fn list_collection_names(&self) -> Vec<String> {
        self.state.collections.keys().cloned().collect()
    }

    /// The underlying state (for the query layers built on snapshots).
    pub fn state(&self) -> &Arc<DbState> {
        &self.state
    }
}

/// Where a read takes its state from.
#[derive(Clone)]
enum Source {
    Latest(Database),
    Fixed(Arc<DbState>),
}

impl Source {
    fn state(&self) -> Arc<DbState> {
        match self {
            Source::Latest(db) => db.inner.writer.published(),
            Source::Fixed(s) => s.clone(),
        }
    }
}

/// Options of a find.
#[derive(Debug, Clone, Default)]
pub struct FindOptions {
    pub sort: Option<Document>,
    pub projection: Option<Document>,
    pub skip: u64,
    /// 0 = no limit.
    pub limit: u64,
    pub hint: Option<Bson>,
}

/// A find being built; [`Find::run`] executes it.
pub struct Find {
    source: Source,
    coll: String,
    filter: Document,
    options: FindOptions,
    strategy: Option<Strategy>,
}

/// A find's result with how it was produced.
#[derive(Debug, Clone)]
pub struct FindOutcome {
    pub docs: Vec<DocRef>,
    pub scan: ScanOutcome,
}

impl Find {
    pub fn sort(mut self, sort: Document) -> Find {
        self.options.sort = Some(sort);
        self
    }
    pub fn projection(mut self, projection: Document) -> Find {
        self.options.projection = Some(projection);
        self
    }
    pub fn skip(mut self, n: u64) -> Find {
        self.options.skip = n;
        self
    }
    /// 0 = no limit.
    pub fn limit(mut self, n: u64) -> Find {
        self.options.limit = n;
        self
    }
    /// Force an index (by name or key pattern) or `{$natural: 1}`.
    pub fn hint(mut self, hint: impl Into<Bson>) -> Find {
        self.options.hint = Some(hint.into());
        self
    }
    pub fn options(mut self, options: FindOptions) -> Find {
        self.options = options;
        self
    }
    /// Read under this snapshot strategy instead of the database default.
    /// (Reads from a held [`Snapshot`] are always `cow`.)
    pub fn snapshot(mut self, strategy: Strategy) -> Find {
        self.strategy = Some(strategy);
        self
    }

    /// Execute and report how: the matching stored documents (sorted, skipped,
    /// limited; unprojected), the strategy, the snapshot's csn and the plan.
    pub fn run_detailed(self) -> Result<FindOutcome> {
        let (spec, _) = self.spec()?;
        self.execute(&spec)
    }

    fn execute(&self, spec: &FindSpec) -> Result<FindOutcome> {
        let db = match &self.source {
            Source::Fixed(state) => {
                let Some(c) = state.collection(&self.coll) else {
                    return Ok(FindOutcome {
                        docs: Vec::new(),
                        scan: empty_outcome(state.csn),
                    });
                };
                let (found, plan) = planner::run_find(c, spec)?;
                let scan = ScanOutcome {
                    strategy: Strategy::Cow,
                    start_csn: state.csn,
                    plan,
                    from_remset: 0,
                    propagated: 0,
                    inflight_peak: 0,
                };
                return Ok(FindOutcome {
                    docs: found.into_iter().map(|(_, d)| d).collect(),
                    scan,
                });
            }
            Source::Latest(db) => db,
        };
        let mut strategy = self.strategy.unwrap_or_else(|| db.default_strategy());
        let filter = spec.filter.as_ref().unwrap_or_else(|| planner::match_all());
        let sort = spec.sort.as_ref().filter(|s| !s.keys.is_empty());
        let wanted = if spec.limit > 0 {
            spec.skip.saturating_add(spec.limit)
        } else {
            u64::MAX
        };
        if strategy == Strategy::Auto && sort.is_some() && spec.limit > 0 {
            // A top-k read whose plan yields sort order touches about k
            // records under `cow` (O(1) to take) and stops there; `vls` would
            // have to read the whole range and sort it (YCSB's workload E).
            let state = db.writer().published();
            if let Some(c) = state.collection(&self.coll) {
                if planner::plan(c, filter, sort, spec.hint.as_ref())?.provides_sort {
                    strategy = Strategy::Cow;
                }
            }
        }
        // Set by the planning closure: the scan yields documents in sort order
        // (a `cow` walk of a plan that provides the sort), so it may stop at `wanted`.
        let in_order = std::cell::Cell::new(false);
        let mut docs: Vec<DocRef> = Vec::new();
        let outcome = scan::scan(
            db,
            &self.coll,
            filter,
            |c| {
                let p = planner::plan(c, filter, sort, spec.hint.as_ref())?;
                in_order.set(strategy == Strategy::Cow && p.provides_sort);
                Ok(p)
            },
            strategy,
            |d| {
                docs.push(d.clone());
                // Without a sort, or in sort order, the first `wanted` matches
                // are the answer; stop early.
                if (sort.is_none() || in_order.get()) && docs.len() as u64 >= wanted {
                    ControlFlow::Break(())
                } else {
                    ControlFlow::Continue(())
                }
            },
        )?;
        if let Some(sort) = sort {
            if !(outcome.strategy == Strategy::Cow && outcome.plan.provides_sort) {
                let mut keyed: Vec<_> = docs.into_iter().map(|d| (sort.sort_key(&d), d)).collect();
                // Stable: ties keep scan order.
                keyed.sort_by(|(a, _), (b, _)| sort.compare_keys(a, b));
                docs = keyed.into_iter().map(|(_, d)| d).collect();
            }
        }
        let skip = usize::try_from(spec.skip)
            .unwrap_or(usize::MAX)
            .min(docs.len());
        docs.drain(..skip);
        if spec.limit > 0 {
            docs.truncate(usize::try_from(spec.limit).unwrap_or(usize::MAX));
        }
        Ok(FindOutcome {
            docs,
            scan: outcome,
        })
    }

    fn spec(&self) -> Result<(FindSpec, Option<Projection>)> {
        let spec = FindSpec {
            filter: Some(Filter::parse(&self.filter)?),
            sort: self
                .options
                .sort
                .as_ref()
                .map(SortSpec::parse)
                .transpose()?,
            skip: self.options.skip,
            limit: self.options.limit,
            hint: self
                .options
                .hint
                .as_ref()
                .map(Hint::from_bson)
                .transpose()?,
        };
        let projection = self
            .options
            .projection
            .as_ref()
            .filter(|p| !p.is_empty())
            .map(Projection::parse)
            .transpose()?;
        Ok((spec, projection))
    }

    /// The matching stored documents (shared, unprojected).
    pub fn raw(self) -> Result<Vec<DocRef>> {
        let (spec, _) = self.spec()?;
        let state = self.source.state();
        let Some(c) = state.collection(&self.coll) else {
            return Ok(Vec::new());
        };
        Ok(planner::run_find(c, &spec)?
            .0
            .into_iter()
            .map(|(_, d)| d)
            .collect())
    }

    /// Execute: the matching documents, sorted, skipped, limited and projected.
    pub fn run(self) -> Result<Vec<Document>> {
        let (spec, projection) = self.spec()?;
        let found = self.execute(&spec)?.docs;
        found
            .iter()
            .map(|d| match &projection {
                Some(p) => p.apply(d),
                None => doc::to_document(d),
            })
            .collect()
    }

    /// The plan the query would use (MongoDB-style `queryPlanner` document).
    pub fn explain(self) -> Result<Document> {
        let (spec, _) = self.spec()?;
        let state = self.source.state();
        let plan: Plan = match state.collection(&self.coll) {
            Some(c) => planner::plan(
                c,
                spec.filter
                    .as_ref()
                    .ok_or_else(|| Error::Internal("no filter".into()))?,
                spec.sort.as_ref().filter(|s| !s.keys.is_empty()),
                spec.hint.as_ref(),
            )?,
            None => {
                return Ok(
                    bson::doc! {"queryPlanner": {"namespace": self.coll.clone(), "winningPlan": {"stage": "EOF"}}},
                )
            }
        };
        Ok(bson::doc! {
            "queryPlanner": {
                "namespace": self.coll.clone(),
                "parsedQuery": self.filter.clone(),
                "winningPlan": plan.explain(),
                "summary": plan.summary(),
            },
            "csn": state.csn as i64,
        })
    }
}

/// Read operations shared by live and snapshot collection handles.
fn count_in(state: &DbState, coll: &str, filter: &Document) -> Result<u64> {
    let filter = Filter::parse(filter)?;
    match state.collection(coll) {
        Some(c) => planner::count(c, &filter, None),
        None => Ok(0),
    }
}

fn stats_of(c: &CollectionState) -> CollStats {
    let count = c.len() as u64;
    let mut indexes = vec![(ID_INDEX_NAME.to_string(), c.id_index.len() as u64)];
    indexes.extend(
        c.indexes
            .iter()
            .map(|i| (i.spec.name.clone(), i.tree.len() as u64)),
    );
    CollStats {
        count,
        data_bytes: c.data_bytes,
        avg_obj_size: c.data_bytes.checked_div(count).unwrap_or(0),
        indexes,
        heap_nodes: c.heap.stats().nodes as u64,
    }
}

/// A collection as of a snapshot (read-only).
#[derive(Clone, Debug)]
pub struct SnapshotCollection {
    state: Arc<DbState>,
    name: String,
}

impl SnapshotCollection {
    pub fn find(&self, filter: Document) -> Find {
        Find {
            source: Source::Fixed(self.state.clone()),
            coll: self.name.clone(),
            filter,
            options: Default::default(),
            strategy: None,
        }
    }
    pub fn find_one(&self, filter: Document) -> Result<Option<Document>> {
        Ok(self.find(filter).limit(1).run()?.pop())
    }
    pub fn count(&self, filter: Document) -> Result<u64> {
        count_in(&self.state, &self.name, &filter)
    }
    pub fn stats(&self) -> Option<CollStats> {
        self.state.collection(&self.name).map(stats_of)
    }
}

/// Options of an update.
#[derive(Debug, Clone, Default)]
pub struct UpdateOptions {
    pub upsert: bool,
    pub hint: Option<Bson>,
}

/// Which version a find-and-modify returns.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum ReturnDocument {
    #[default]
    Before,
    After,
}

/// Options of the find-one-and-* operations.
#[derive(Debug, Clone, Default)]
pub struct FindAndModifyOptions {
    pub sort: Option<Document>,
    pub projection: Option<Document>,
    pub upsert: bool,
    pub return_document: ReturnDocument,
    pub hint: Option<Bson>,
}

/// Options of index creation.
#[derive(Debug, Clone, Default)]
pub struct IndexOptions {
    pub name: Option<String>,
    pub unique: bool,
}

/// Handle on a live collection.
#[derive(Clone, Debug)]
pub struct Collection {
    db: Database,
    name: String,
}

impl Collection {
    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn database(&self) -> &Database {
        &self.db
    }

    fn state(&self) -> Arc<DbState> {
        self.db.inner.writer.published()
    }

    /// Insert one document; returns its `_id` (generated when absent).
    pub fn insert_one(&self, doc: Document) -> Result<Bson> {
        validate_collection_name(&self.name)?;
        let prepared = doc::prepare_insert(&doc)?;
        match self.db.submit(Command::Insert {
            coll: self.name.clone(),
            docs: vec![prepared],
            ordered: true,
        })? {
            Reply::Inserted(out) => match (
                out.inserted.into_iter().next(),
                out.errors.into_iter().next(),
            ) {
                (Some((_, id)), _) => Ok(id),
                (None, Some((_, e))) => Err(e),
                (None, None) => Err(Error::Internal("insert reported nothing".into())),
            },
            other => Err(unexpected(other)),
        }
    }

    /// Insert many documents. `ordered` stops at the first error (MongoDB's
    /// default); unordered tries every document. Any error returns
    /// [`Error::BulkWrite`] listing each failed position; the rest are stored.
    pub fn insert_many(
        &self,
        docs: impl IntoIterator<Item = Document>,
        ordered: bool,
    ) -> Result<Vec<Bson>> {
        validate_collection_name(&self.name)?;
        let mut prepared = Vec::new();
        let mut errors: Vec<(usize, Error)> = Vec::new();
        let mut positions = Vec::new();
        for (i, d) in docs.into_iter().enumerate() {
            match doc::prepare_insert(&d) {
                Ok(p) => {
                    prepared.push(p);
                    positions.push(i);
                }
                Err(e) => {
                    errors.push((i, e));
                    if ordered {
                        break;
                    }
                }
            }
        }
        let mut ids = Vec::new();
        if !prepared.is_empty() {
            let out = match self.db.submit(Command::Insert {
                coll: self.name.clone(),
                docs: prepared,
                ordered,
            }) {
                Ok(Reply::Inserted(out)) => out,
                Ok(other) => return Err(unexpected(other)),
                Err(e) => InsertOutcome {
                    inserted: vec![],
                    errors: vec![(0, e)],
                },
            };
            ids = out.inserted.iter().map(|(_, id)| id.clone()).collect();
            errors.extend(
                out.errors
                    .into_iter()
                    .map(|(i, e)| (positions.get(i).copied().unwrap_or(i), e)),
            );
        }
        errors.sort_by_key(|(i, _)| *i);
        if ordered {
            // Stop reporting at the first failure, as an ordered batch stops there.
            errors.truncate(1);
        }
        if errors.is_empty() {
            Ok(ids)
        } else {
            Err(Error::BulkWrite(Box::new(BulkWriteFailure {
                inserted: ids.len(),
                errors,
            })))
        }
    }

    pub fn find(&self, filter: Document) -> Find {
        Find {
            source: Source::Latest(self.db.clone()),
            coll: self.name.clone(),
            filter,
            options: Default::default(),
            strategy: None,
        }
    }

    pub fn find_one(&self, filter: Document) -> Result<Option<Document>> {
        Ok(self.find(filter).limit(1).run()?.pop())
    }

    /// The stored document with `_id == id` at the latest commit: the point-read
    /// fast path (no filter parsing, no copy of the bytes).
    pub fn get(&self, id: &Bson) -> Result<Option<DocRef>> {
        let id = crate::value::to_raw(id).ok_or_else(|| Error::InvalidId("invalid _id".into()))?;
        let state = self.state();
        Ok(state
            .collection(&self.name)
            .and_then(|c| c.rid_of_id(&id).and_then(|rid| c.get(rid)).cloned()))
    }

    /// Stream every document matching `filter` under `strategy` to `visit`
    /// (which may stop the scan early); no materialization, no order promise
    /// beyond the strategy's. Returns how the scan ran (strategy, snapshot csn).
    pub fn scan_with(
        &self,
        filter: Document,
        strategy: Strategy,
        mut visit: impl FnMut(&DocRef) -> ControlFlow<()>,
    ) -> Result<ScanOutcome> {
        let parsed = Filter::parse(&filter)?;
        scan::scan(
            &self.db,
            &self.name,
            &parsed,
            |c| planner::plan(c, &parsed, None, None),
            strategy,
            |d| visit(d),
        )
    }

    /// Count matching documents under the database's default strategy.
    pub fn count(&self, filter: Document) -> Result<u64> {
        self.count_with(filter, self.db.default_strategy())
    }

    /// Count matching documents under `strategy`. Counting everything reads the
    /// collection size of one published root (O(1), consistent).
    pub fn count_with(&self, filter: Document, strategy: Strategy) -> Result<u64> {
        let parsed = Filter::parse(&filter)?;
        if parsed.is_match_all() {
            return count_in(&self.state(), &self.name, &filter);
        }
        let mut n = 0u64;
        scan::scan(
            &self.db,
            &self.name,
            &parsed,
            |c| planner::plan(c, &parsed, None, None),
            strategy,
            |_| {
                n += 1;
                ControlFlow::Continue(())
            },
        )?;
        Ok(n)
    }

    /// Distinct values of `path` among matching documents (arrays contribute
    /// their elements), in BSON order.
    pub fn distinct(&self, path: &str, filter: Document) -> Result<Vec<Bson>> {
        crate::path::validate(path).map_err(Error::BadValue)?;
        let docs = self.find(filter).raw()?;
        let mut vals: Vec<bson::RawBson> = Vec::new();
        for d in &docs {
            for v in crate::path::values(d, path) {
                match v {
                    bson::RawBsonRef::Array(a) => {
                        vals.extend(a.into_iter().flatten().map(Into::into))
                    }
                    other => vals.push(other.into()),
                }
            }
        }
        vals.sort_by(|a, b| crate::value::compare(a.as_raw_bson_ref(), b.as_raw_bson_ref()));
        vals.dedup_by(|a, b| crate::value::equal(a.as_raw_bson_ref(), b.as_raw_bson_ref()));
        vals.into_iter()
            .map(|v| Bson::try_from(v).map_err(|e| Error::InvalidBson(e.to_string())))
            .collect()
    }

    fn update_cmd(
        &self,
        filter: Document,
        update: UpdateSpec,
        multi: bool,
        options: UpdateOptions,
    ) -> Result<UpdateResult> {
        validate_collection_name(&self.name)?;
        let cmd = UpdateCommand {
            coll: self.name.clone(),
            filter: Filter::parse(&filter)?,
            filter_doc: filter,
            update,
            multi,
            upsert: options.upsert,
            hint: options.hint.as_ref().map(Hint::from_bson).transpose()?,
        };
        match self.db.submit(Command::Update(cmd))? {
            Reply::Updated(r) => Ok(r),
            other => Err(unexpected(other)),
        }
    }

    /// Parse an update that must use operators (`update_one`/`update_many`).
    pub(crate) fn operators(update: &Document) -> Result<UpdateSpec> {
        let spec = UpdateSpec::parse(update)?;
        if spec.is_replacement() {
            return Err(Error::bad_value(
                "update document requires atomic operators",
            ));
        }
        Ok(spec)
    }

    /// Parse a replacement document (`replace_one`).
    pub(crate) fn replacement(doc: &Document) -> Result<UpdateSpec> {
        let spec = UpdateSpec::parse(doc)?;
        if !spec.is_replacement() {
            return Err(Error::bad_value(
                "replacement document must not contain atomic operators",
            ));
        }
        Ok(spec)
    }

    pub fn update_one(&self, filter: Document, update: Document) -> Result<UpdateResult> {
        self.update_one_with(filter, update, UpdateOptions::default())
    }

    pub fn update_one_with(
        &self,
        filter: Document,
        update: Document,
        options: UpdateOptions,
    ) -> Result<UpdateResult> {
        self.update_cmd(filter, Self::operators(&update)?, false, options)
    }

    pub fn update_many(&self, filter: Document, update: Document) -> Result<UpdateResult> {
        self.update_many_with(filter, update, UpdateOptions::default())
    }

    pub fn update_many_with(
        &self,
        filter: Document,
        update: Document,
        options: UpdateOptions,
    ) -> Result<UpdateResult> {
        self.update_cmd(filter, Self::operators(&update)?, true, options)
    }

    pub fn replace_one(&self, filter: Document, replacement: Document) -> Result<UpdateResult> {
        self.replace_one_with(filter, replacement, UpdateOptions::default())
    }

    pub fn replace_one_with(
        &self,
        filter: Document,
        replacement: Document,
        options: UpdateOptions,
    ) -> Result<UpdateResult> {
        self.update_cmd(filter, Self::replacement(&replacement)?, false, options)
    }

    /// Update (or replace) with an already-parsed spec: the server's `update` command.
    pub fn update_with_spec(
        &self,
        filter: Document,
        update: UpdateSpec,
        multi: bool,
        options: UpdateOptions,
    ) -> Result<UpdateResult> {
        if multi && update.is_replacement() {
            return Err(Error::bad_value(
                "multi update is not supported for replacement-style update",
            ));
        }
        self.update_cmd(filter, update, multi, options)
    }

    fn delete(&self, filter: Document, multi: bool) -> Result<u64> {
        let filter = Filter::parse(&filter)?;
        match self.db.submit(Command::Delete {
            coll: self.name.clone(),
            filter,
            multi,
            hint: None,
        })? {
            Reply::Deleted(n) => Ok(n),
            other => Err(unexpected(other)),
        }
    }

    pub fn delete_one(&self, filter: Document) -> Result<u64> {
        self.delete(filter, false)
    }

    pub fn delete_many(&self, filter: Document) -> Result<u64> {
        self.delete(filter, true)
    }

    fn find_and_modify(
        &self,
        filter: Document,
        update: Option<UpdateSpec>,
        options: FindAndModifyOptions,
    ) -> Result<(Option<Document>, FindAndModifyOutcome)> {
        validate_collection_name(&self.name)?;
        let projection = options
            .projection
            .as_ref()
            .filter(|p| !p.is_empty())
            .map(Projection::parse)
            .transpose()?;
        let cmd = FindAndModifyCommand {
            coll: self.name.clone(),
            filter: Filter::parse(&filter)?,
            filter_doc: filter,
            sort: options.sort.as_ref().map(SortSpec::parse).transpose()?,
            update,
            upsert: options.upsert,
            return_new: options.return_document == ReturnDocument::After,
            hint: options.hint.as_ref().map(Hint::from_bson).transpose()?,
        };
        let out = match self.db.submit(Command::FindAndModify(cmd))? {
            Reply::FoundAndModified(out) => out,
            other => return Err(unexpected(other)),
        };
        let doc = match &out.doc {
            Some(d) => Some(match &projection {
                Some(p) => p.apply(d)?,
                None => doc::to_document(d)?,
            }),
            None => None,
        };
        Ok((doc, out))
    }

    pub fn find_one_and_update(
        &self,
        filter: Document,
        update: Document,
        options: FindAndModifyOptions,
    ) -> Result<Option<Document>> {
        Ok(self
            .find_and_modify(filter, Some(Self::operators(&update)?), options)?
            .0)
    }

    pub fn find_one_and_replace(
        &self,
        filter: Document,
        replacement: Document,
        options: FindAndModifyOptions,
    ) -> Result<Option<Document>> {
        Ok(self
            .find_and_modify(filter, Some(Self::replacement(&replacement)?), options)?
            .0)
    }

    pub fn find_one_and_delete(
        &self,
        filter: Document,
        options: FindAndModifyOptions,
    ) -> Result<Option<Document>> {
        Ok(self.find_and_modify(filter, None, options)?.0)
    }

    /// The general findAndModify (the server's command): document plus outcome.
    pub fn find_and_modify_with_spec(
        &self,
        filter: Document,
        update: Option<UpdateSpec>,
        options: FindAndModifyOptions,
    ) -> Result<(Option<Document>, FindAndModifyOutcome)> {
        self.find_and_modify(filter, update, options)
    }

    /// Create an index (built over existing documents); returns its name.
    /// Creating an identical index again is a no-op.
    pub fn create_index(&self, keys: Document, options: IndexOptions) -> Result<String> {
        validate_collection_name(&self.name)?;
        let spec = IndexSpec::new(&keys, options.name.as_deref(), options.unique)?;
        let name = if spec.fields.len() == 1 && spec.fields[0] == ("_id".to_string(), true) {
            ID_INDEX_NAME.to_string()
        } else {
            spec.name.clone()
        };
        self.db.submit(Command::CreateIndex {
            coll: self.name.clone(),
            spec,
        })?;
        Ok(name)
    }

    pub fn drop_index(&self, name: &str) -> Result<()> {
        self.db
            .submit(Command::DropIndex {
                coll: self.name.clone(),
                name: name.to_string(),
            })
            .map(|_| ())
    }

    /// Index descriptions as MongoDB's `listIndexes` returns them.
    pub fn list_indexes(&self) -> Result<Vec<Document>> {
        let state = self.state();
        let c = state
            .collection(&self.name)
            .ok_or_else(|| Error::NamespaceNotFound(self.name.clone()))?;
        let mut out = vec![bson::doc! {"v": 2, "key": {"_id": 1}, "name": ID_INDEX_NAME}];
        for i in &c.indexes {
            let mut d =
                bson::doc! {"v": 2, "key": i.spec.key_pattern(), "name": i.spec.name.clone()};
            if i.spec.unique {
                d.insert("unique", true);
            }
            out.push(d);
        }
        Ok(out)
    }

    pub fn stats(&self) -> Result<CollStats> {
        let state = self.state();
        state
            .collection(&self.name)
            .map(stats_of)
            .ok_or_else(|| Error::NamespaceNotFound(self.name.clone()))
    }

    /// Check every structural invariant of the current version (tests, `duet check`).
    pub fn check_invariants(&self) -> Result<(), String> {
        match self.state().collection(&self.name) {
            Some(c) => c.check_invariants(),
            None => Ok(()),
        }
    }
}
