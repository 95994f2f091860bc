//! A set of named databases (what a server hosts): a data directory holding
//! one subdirectory per database; create on first write, look up without
//! creating, list, drop.
//!
//! Each database has its own single writer; databases share nothing but the
//! background flusher and checkpointer (`durability::background`) and the
//! descriptor cache (`durability::fdcache`), so writes to different
//! databases proceed in parallel and neither threads nor open files grow
//! with the number of databases.
//!
//! Invariants:
//! - one process at a time: the Engine holds `<data dir>/LOCK` (flock) for
//!   its lifetime, and every database it opens keeps that lock alive, so the
//!   directory stays locked while any of its databases is open; databases
//!   opened through the Engine have no lock of their own;
//! - only [`Engine::database`] creates a database (directory, WAL); the
//!   lookup [`Engine::get`] never does, so reads of a database that does not
//!   exist leave no trace;
//! - a database is created, deleted and recreated only under the write lock
//!   of the name map, so a directory is never deleted while a database of
//!   the same name is being created in it;
//! - no two databases' names differ only in case (DatabaseDifferCase, as
//!   MongoDB: their directories would collide on case-insensitive disks);
//! - a drop is recorded in the drop log (durably, with a data directory)
//!   before the directory is touched, and the directory is renamed to a
//!   tombstone (`<name>.dropped-<n>`, not a database name) before it is
//!   deleted: after a crash a database's directory is whole or gone, and an
//!   open finishes a drop the log records (tombstones removed, a directory
//!   whose state is not newer than the recorded drop deleted).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use parking_lot::RwLock;

use crate::api::Database;
use crate::durability::changes::clock::Stamp;
use crate::durability::changes::dropped::{DropEntry, DropLog};
use crate::durability::changes::ChangeHub;
use crate::durability::io::{create_private_dir_all, DirLock};
use crate::durability::replicate::Replicate;
use crate::durability::{lock_dir, DurabilityOptions, Locking, LOCK_FILE};
use crate::error::{Error, Result};

/// Longest database name accepted (MongoDB: 64 bytes).
pub const MAX_DB_NAME: usize = 63;

/// All databases of one server or embedding process.
pub struct Engine {
    dir: Option<PathBuf>,
    options: DurabilityOptions,
    dbs: RwLock<BTreeMap<String, Database>>,
    /// `<dir>/LOCK`, shared with every database opened from `dir`.
    lock: Option<Arc<dyn DirLock>>,
    /// The cluster clock and change tail every database's writer shares.
    hub: Arc<ChangeHub>,
    /// The replica set every database's groups are committed by
    /// ([`Engine::set_replicator`]).
    replicator: RwLock<Option<Arc<dyn Replicate>>>,
    /// The `dropDatabase` events (a dropped database's WAL is gone).
    drops: DropLog,
    /// Delta indexing and the default index view of every database, open
    /// and created later ([`Engine::set_delta_indexing`]).
    delta: RwLock<(crate::store::DeltaOptions, crate::store::delta::IndexRead)>,
}

/// Databases closed per thread at most when an Engine is dropped.
const CLOSE_PER_THREAD: usize = 64;
/// Threads that close databases at most: a close is a few fsyncs, so the
/// threads mostly wait on the disk, not the CPU.
const CLOSE_THREADS: usize = 8;

impl Drop for Engine {
    /// Closes the databases this handle still holds: each syncs its log and
    /// installs its manifest (a few fsyncs), so thousands of them closed one
    /// by one made a server's shutdown take seconds; they share nothing on
    /// close, so they close side by side. The directory lock (a field) goes
    /// after them.
    fn drop(&mut self) {
        let dbs: Vec<Database> = std::mem::take(&mut *self.dbs.write())
            .into_values()
            .collect();
        if dbs.len() <= CLOSE_PER_THREAD {
            return;
        }
        let threads = dbs.len().div_ceil(CLOSE_PER_THREAD).min(CLOSE_THREADS);
        let per = dbs.len().div_ceil(threads);
        let mut dbs = dbs;
        std::thread::scope(|s| {
            while !dbs.is_empty() {
                let part = dbs.split_off(dbs.len().saturating_sub(per));
                // No thread to be had: close them here, one by one.
                let _ = std::thread::Builder::new()
                    .name("duet-close".into())
                    .spawn_scoped(s, move || drop(part));
            }
        });
    }
}

impl std::fmt::Debug for Engine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Engine")
            .field("dir", &self.dir)
            .field("databases", &self.dbs.read().len())
            .finish()
    }
}

impl Engine {
    pub fn in_memory() -> Engine {
        Engine {
            dir: None,
            options: DurabilityOptions::default(),
            dbs: RwLock::new(BTreeMap::new()),
            lock: None,
            hub: Arc::new(ChangeHub::default()),
            replicator: RwLock::new(None),
            drops: DropLog::in_memory(crate::durability::DEFAULT_CHANGE_RETENTION),
            delta: Default::default(),
        }
    }

    /// An engine whose databases live under the data directory `dir`
    /// (created 0700 when missing), one durable database per subdirectory;
    /// existing ones are opened (recovered) now. Fails with `Locked` naming
    /// `dir` when another process (or another Engine) holds it.
    pub fn open(dir: impl AsRef<Path>) -> Result<Engine> {
        Engine::open_with(dir, DurabilityOptions::default())
    }

    /// [`Engine::open`] with the durability options every database uses.
    pub fn open_with(dir: impl AsRef<Path>, options: DurabilityOptions) -> Result<Engine> {
        let dir = dir.as_ref();
        create_private_dir_all(dir).map_err(|e| {
            Error::Internal(format!(
                "cannot create data directory {}: {e}",
                dir.display()
            ))
        })?;
        let lock = lock_dir(&*options.vfs, dir)?;
        refuse_single_database_layout(dir)?;
        remove_tombstones(dir);
        let drops = DropLog::open(options.vfs.clone(), dir, options.change_retention)?;
        let mut dbs = BTreeMap::new();
        let entries = std::fs::read_dir(dir).map_err(|e| {
            Error::Internal(format!("cannot list data directory {}: {e}", dir.display()))
        })?;
        let held = Locking::Held(lock.clone());
        let hub = Arc::new(ChangeHub::default());
        for entry in entries.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            if entry.path().is_dir() && validate_db_name(&name).is_ok() {
                let db = Database::open_locked(
                    &name,
                    &entry.path(),
                    options.clone(),
                    &held,
                    hub.clone(),
                )?;
                dbs.insert(name, db);
            }
        }
        for e in drops.entries() {
            hub.clock.observe(e.ts);
            // A drop the crash interrupted after logging it: finish it.
            let dropped_incarnation = dbs
                .get(&*e.db)
                .is_some_and(|db: &Database| db.writer().published().ts <= e.last_ts);
            if dropped_incarnation {
                if let Some(db) = dbs.remove(&*e.db) {
                    tracing::info!(db = %e.db, "finishing a drop interrupted by a crash");
                    delete_database(db);
                }
            }
        }
        // Every recovered time is observed: the tail starts above them all.
        hub.start_after_recovery();
        Ok(Engine {
            dir: Some(dir.to_path_buf()),
            options,
            dbs: RwLock::new(dbs),
            lock: Some(lock),
            hub,
            replicator: RwLock::new(None),
            drops,
            delta: Default::default(),
        })
    }

    pub fn dir(&self) -> Option<&Path> {
        self.dir.as_deref()
    }

    /// The database `name`, created empty when new (a durable one gets its
    /// directory and WAL now). A new name that differs only in case from an
    /// existing database fails with DatabaseDifferCase (13297).
    pub fn database(&self, name: &str) -> Result<Database> {
        self.database_created(name).map(|(db, _)| db)
    }

    /// [`Engine::database`], also saying whether this call created it.
    pub fn database_created(&self, name: &str) -> Result<(Database, bool)> {
        validate_db_name(name)?;
        if let Some(db) = self.dbs.read().get(name) {
            return Ok((db.clone(), false));
        }
        let mut dbs = self.dbs.write();
        if let Some(db) = dbs.get(name) {
            return Ok((db.clone(), false));
        }
        if let Some(existing) = dbs.keys().find(|k| k.eq_ignore_ascii_case(name)) {
            return Err(Error::DatabaseDifferCase(
                existing.clone(),
                name.to_string(),
            ));
        }
        let db = match (&self.dir, &self.lock) {
            (Some(d), Some(lock)) => Database::open_locked(
                name,
                &d.join(name),
                self.options.clone(),
                &Locking::Held(lock.clone()),
                self.hub.clone(),
            )?,
            _ => Database::in_hub(name, None, Default::default(), self.hub.clone()),
        };
        db.set_replicator(self.replicator.read().clone());
        let (delta, index_read) = *self.delta.read();
        db.set_delta_indexing(delta);
        db.set_default_index_read(index_read);
        dbs.insert(name.to_string(), db.clone());
        Ok((db, true))
    }

    /// Delta indexing (`store::delta`) for every database, open now and
    /// created later, and their reads' default index view (`fresh` or
    /// `stale`). `duet serve --delta-indexing`, `--index-read`.
    pub fn set_delta_indexing(
        &self,
        delta: crate::store::DeltaOptions,
        index_read: crate::store::delta::IndexRead,
    ) {
        let dbs = self.dbs.read();
        *self.delta.write() = (delta, index_read);
        for db in dbs.values() {
            db.set_delta_indexing(delta);
            db.set_default_index_read(index_read);
        }
    }

    /// Make every database (those open now and those created later) commit
    /// its writer groups through `replicator` before logging and publishing
    /// them (`durability::replicate`); `None` stops it. Set it before the
    /// first write: a replica-set member's databases are written only
    /// through the set.
    pub fn set_replicator(&self, replicator: Option<Arc<dyn Replicate>>) {
        let dbs = self.dbs.read();
        *self.replicator.write() = replicator.clone();
        for db in dbs.values() {
            db.set_replicator(replicator.clone());
        }
    }

    /// The database `name` if it exists; never creates anything.
    pub fn get(&self, name: &str) -> Result<Option<Database>> {
        validate_db_name(name)?;
        Ok(self.dbs.read().get(name).cloned())
    }

    /// Every open database, empty ones included.
    pub fn all_databases(&self) -> Vec<Database> {
        self.dbs.read().values().cloned().collect()
    }

    /// Names of databases that hold at least one collection.
    pub fn list_databases(&self) -> Vec<(String, Database)> {
        self.dbs
            .read()
            .iter()
            .filter(|(_, db)| !db.list_collection_names().is_empty())
            .map(|(n, db)| (n.clone(), db.clone()))
            .collect()
    }

    /// Drop a whole database; `false` when it did not exist, or when the
    /// drop could not be recorded (logged; see [`Engine::try_drop_database`]).
    pub fn drop_database(&self, name: &str) -> bool {
        self.try_drop_database(name).unwrap_or_else(|e| {
            tracing::warn!(db = name, error = %e, "database not dropped");
            false
        })
    }

    /// Drop a whole database; `Ok(false)` when it did not exist. The drop is
    /// recorded in the drop log first (synced; change streams read its
    /// `drop`/`dropDatabase` events from there after a restart) — if that
    /// fails, nothing is dropped. Its directory is deleted now; handles
    /// cloned out earlier fail their next write to disk (the files are
    /// gone) and no longer checkpoint in the background.
    pub fn try_drop_database(&self, name: &str) -> Result<bool> {
        let mut dbs = self.dbs.write();
        self.drop_locked(&mut dbs, name, None)
    }

    /// [`Engine::try_drop_database`] at a cluster time already taken: a
    /// replica set's `dropDatabase` carries the primary's time in its log
    /// entry, so every member drops at the same time. Requires: `ts` is in
    /// flight in this engine's clock (taken by [`Engine::ordered_time`] or
    /// registered by [`Engine::adopt_time`]); it is finished here, whether
    /// the database existed or not, and whatever the outcome.
    pub fn try_drop_database_at(&self, name: &str, ts: u64, wall_ms: i64) -> Result<bool> {
        let mut dbs = self.dbs.write();
        self.drop_locked(&mut dbs, name, Some(Stamp { ts, wall_ms }))
    }

    /// Take a cluster time for an operation a replica set logs outside any
    /// database's writer (`dropDatabase`) and run `propose(ts, wall_ms)`
    /// while holding the clock's order (`ClusterClock::order`), as a
    /// replicated writer group does: whatever `propose` queues in the
    /// replicated log is then in time order with every group. The time stays
    /// in flight until [`Engine::try_drop_database_at`] or
    /// [`Engine::abandon_time`] finishes it.
    pub fn ordered_time<R>(&self, propose: impl FnOnce(u64, i64) -> R) -> R {
        let _order = self.hub.clock.order();
        let stamp = self.hub.clock.tick();
        propose(stamp.ts, stamp.wall_ms)
    }

    /// Register `ts`, a time another member's clock took (a replicated
    /// operation about to be applied here), as in flight; later times of
    /// this engine are above it.
    pub fn adopt_time(&self, ts: u64) {
        self.hub.clock.adopt(ts);
    }

    /// Finish an in-flight time whose operation will not happen here.
    pub fn abandon_time(&self, ts: u64) {
        self.hub.abandon(ts);
    }

    /// [`Engine::try_drop_database`] under the name map's write lock, at
    /// `at` (in flight) or at a time taken now.
    fn drop_locked(
        &self,
        dbs: &mut BTreeMap<String, Database>,
        name: &str,
        at: Option<Stamp>,
    ) -> Result<bool> {
        let Some(db) = dbs.get(name).cloned() else {
            if let Some(at) = at {
                self.hub.abandon(at.ts);
            }
            return Ok(false);
        };
        let state = db.writer().published();
        let last_index = last_event_index(&db, state.ts);
        // Under the name map's lock, so a database created again under the
        // name gets later times than its drop (a replicated drop's time was
        // taken under the clock's order: later groups tick above it).
        let stamp = match at {
            Some(at) => at,
            None => self.hub.clock.tick(),
        };
        let entry = DropEntry {
            db: Arc::from(name),
            ts: stamp.ts,
            wall_ms: stamp.wall_ms,
            last_ts: state.ts,
            last_index,
            colls: state.collections.keys().cloned().collect(),
        };
        if let Err(e) = self.drops.record(entry.clone()) {
            self.hub.abandon(stamp.ts);
            return Err(e.into());
        }
        dbs.remove(name);
        db.index_builds()
            .abort_all("database dropped during the build");
        self.delete(db);
        self.hub.publish(entry.record());
        Ok(true)
    }

    /// Replace database `name` with the database directory `image` (as
    /// [`crate::api::backup::write_image`] writes one; moved into place,
    /// not copied; it must be on the data directory's file system): an
    /// existing database of that name is dropped first (as
    /// [`Engine::try_drop_database`]), then the image is renamed to its
    /// directory and opened. How a replica-set member installs a Raft
    /// snapshot (docs/design.md §19).
    pub fn restore_database(&self, name: &str, image: &Path) -> Result<Database> {
        self.restore_database_with(name, image, &[])
    }

    /// [`Engine::restore_database`], the restored database then holding the
    /// named snapshots `named` (each a description and its checkpoint image,
    /// moved into the database's directory: durable ones pinned, all loaded
    /// on first read; [`Database::install_named_image`]). They are installed
    /// before the database is visible to other callers. On an error the
    /// database stays restored with the snapshots installed so far.
    pub fn restore_database_with(
        &self,
        name: &str,
        image: &Path,
        named: &[(crate::snapshot::named::NamedImage, std::path::PathBuf)],
    ) -> Result<Database> {
        validate_db_name(name)?;
        let (Some(dir), Some(lock)) = (&self.dir, &self.lock) else {
            return Err(Error::Internal(
                "restoring a database needs a data directory".into(),
            ));
        };
        let mut dbs = self.dbs.write();
        self.drop_locked(&mut dbs, name, None)?;
        if let Some(existing) = dbs.keys().find(|k| k.eq_ignore_ascii_case(name)) {
            return Err(Error::DatabaseDifferCase(
                existing.clone(),
                name.to_string(),
            ));
        }
        let path = dir.join(name);
        std::fs::rename(image, &path)
            .and_then(|()| self.options.vfs.sync_dir(dir))
            .map_err(|e| {
                Error::Internal(format!(
                    "cannot move {} to {}: {e}",
                    image.display(),
                    path.display()
                ))
            })?;
        let db = Database::open_locked(
            name,
            &path,
            self.options.clone(),
            &Locking::Held(lock.clone()),
            self.hub.clone(),
        )?;
        db.set_replicator(self.replicator.read().clone());
        let (delta, index_read) = *self.delta.read();
        db.set_delta_indexing(delta);
        db.set_default_index_read(index_read);
        dbs.insert(name.to_string(), db.clone());
        for (snapshot, file) in named {
            db.install_named_image(snapshot, file)?;
        }
        Ok(db)
    }

    /// The drop log (`dropDatabase` events within the change retention).
    pub(crate) fn drops(&self) -> &DropLog {
        &self.drops
    }

    /// The cluster clock and change tail of this engine's databases.
    pub(crate) fn hub(&self) -> &Arc<ChangeHub> {
        &self.hub
    }

    /// Forget `name` again if it never committed anything, holds no named
    /// snapshot and nobody else holds it — what a command that created a
    /// database and then failed leaves (a database exists once something was
    /// written to it). Returns whether it was removed.
    pub fn discard_if_unused(&self, name: &str) -> bool {
        let mut dbs = self.dbs.write();
        let unused = dbs
            .get(name)
            .is_some_and(|db| db.handle_count() == 1 && db.csn() == 0 && db.is_empty());
        if !unused {
            return false;
        }
        match dbs.remove(name) {
            Some(db) => {
                self.delete(db);
                true
            }
            None => false,
        }
    }

    /// Close `db` and delete its directory. Requires: the name map's write
    /// lock is held (so no database of that name is being created meanwhile).
    fn delete(&self, db: Database) {
        delete_database(db);
    }
}

/// The index of the last event of the group of time `ts` in `db`'s log
/// (`u32::MAX` when unknown: no log, or the record cannot be read), so the
/// drop log knows which resume points the deleted log leaves complete.
fn last_event_index(db: &Database, ts: u64) -> u32 {
    let Some(d) = db.durable().filter(|d| d.wal().is_some()) else {
        return u32::MAX;
    };
    let name: Arc<str> = Arc::from(db.name());
    match d.read_changes(&name, ts.saturating_sub(1), ts, 1) {
        Ok((recs, _)) => recs
            .iter()
            .find(|r| r.ts == ts)
            .and_then(|r| {
                r.effects.iter().rposition(|e| {
                    !matches!(
                        e,
                        crate::durability::effect::Effect::TxnBegin { .. }
                            | crate::durability::effect::Effect::TxnEnd
                    )
                })
            })
            .map_or(u32::MAX, |i| i as u32),
        Err(_) => u32::MAX,
    }
}

/// Suffix of a dropped database's directory while it is being deleted (a
/// `.` makes it no database name, so an open never takes it for one).
const TOMBSTONE: &str = ".dropped-";

/// Close `db`, rename its directory to a tombstone and delete that: the
/// directory of a name is thus whole or gone after a crash.
fn delete_database(db: Database) {
    let path = db.path().map(Path::to_path_buf);
    db.stop_background();
    drop(db);
    let Some(p) = path else {
        return;
    };
    static SEQ: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = SEQ.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default()
        .as_nanos();
    let mut tomb = p.clone().into_os_string();
    tomb.push(format!("{TOMBSTONE}{nanos:x}-{n}"));
    let target = match std::fs::rename(&p, &tomb) {
        Ok(()) => PathBuf::from(tomb),
        Err(e) => {
            tracing::warn!(path = %p.display(), error = %e, "could not rename dropped database; deleting in place");
            p
        }
    };
    if let Err(e) = std::fs::remove_dir_all(&target) {
        tracing::warn!(path = %target.display(), error = %e, "could not delete dropped database");
    }
}

/// Delete the tombstones of drops a crash interrupted while deleting.
fn remove_tombstones(dir: &Path) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        if name.contains(TOMBSTONE) && e.path().is_dir() {
            tracing::info!(path = %e.path().display(), "removing the rest of a dropped database");
            if let Err(err) = std::fs::remove_dir_all(e.path()) {
                tracing::warn!(path = %e.path().display(), error = %err, "could not delete dropped database");
            }
        }
    }
}

/// A data directory whose root holds a database's own files is the layout
/// of a single database (what `duet import --data-dir` made before data
/// directories held databases): refuse it rather than hide its data.
fn refuse_single_database_layout(dir: &Path) -> Result<()> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Ok(());
    };
    for e in entries.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        let database_file = name == crate::durability::manifest::MANIFEST
            || crate::durability::wal::parse_segment_name(&name).is_some()
            || crate::durability::checkpoint::parse_checkpoint_name(&name).is_some();
        if database_file && name != LOCK_FILE {
            return Err(Error::IllegalOperation(format!(
                "{} holds the files of a single database ({name}) at its root, not databases in \
                 subdirectories: move them into a subdirectory named after the database \
                 (e.g. {}/test) to serve them",
                dir.display(),
                dir.display()
            )));
        }
    }
    Ok(())
}

/// MongoDB's database-name rules.
pub fn validate_db_name(name: &str) -> Result<()> {
    if name.is_empty() || name.len() > MAX_DB_NAME {
        return Err(Error::InvalidNamespace(format!(
            "invalid database name '{name}': length must be 1..={MAX_DB_NAME}"
        )));
    }
    if let Some(c) = name.chars().find(|c| "/\\. \"$*<>:|?\0".contains(*c)) {
        return Err(Error::InvalidNamespace(format!(
            "invalid database name '{name}': contains '{c}'"
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use bson::doc;
    use parking_lot::Mutex;

    use super::Engine;
    use crate::durability::replicate::{Commit, GroupRecord, Replicate};
    use crate::durability::wal::decode_record;
    use crate::error::Error;

    /// A replica set that "queues" each group by noting its time, after a
    /// pause that lets the other database's writer run, then commits it.
    struct Recorder {
        queued: Mutex<Vec<u64>>,
    }

    impl Replicate for Recorder {
        fn replicate(&self, rec: GroupRecord<'_>) -> Result<Commit, Error> {
            let ts = decode_record(rec.payload)
                .map_err(|e| Error::Internal(e.0))?
                .ts;
            std::thread::yield_now();
            std::thread::sleep(std::time::Duration::from_micros(50));
            self.queued.lock().push(ts);
            (rec.proposed)();
            Ok(Commit::new(|_| {}))
        }
    }

    #[test]
    fn groups_of_every_database_are_proposed_in_time_order() {
        let dir = tempfile::tempdir().expect("tempdir");
        let engine = Engine::open(dir.path()).expect("open");
        let recorder = Arc::new(Recorder {
            queued: Mutex::new(Vec::new()),
        });
        engine.set_replicator(Some(recorder.clone()));
        std::thread::scope(|s| {
            for name in ["a", "b", "c"] {
                let db = engine.database(name).expect("database");
                s.spawn(move || {
                    let coll = db.collection("c");
                    for i in 0..200 {
                        coll.insert_one(doc! {"i": i}).expect("insert");
                    }
                });
            }
        });
        let queued = recorder.queued.lock().clone();
        assert!(queued.len() >= 3, "{} groups", queued.len());
        let out_of_order: Vec<_> = queued.windows(2).filter(|w| w[0] >= w[1]).collect();
        assert!(
            out_of_order.is_empty(),
            "log order is not time order in {} of {} places, first: {:?}",
            out_of_order.len(),
            queued.len(),
            out_of_order[0]
        );
    }

    /// Keeps the outcomes of every group's tagged writes.
    #[derive(Default)]
    struct Tags(Mutex<Vec<Vec<u8>>>);

    impl Replicate for Tags {
        fn replicate(&self, rec: GroupRecord<'_>) -> Result<Commit, Error> {
            let mut g = self.0.lock();
            g.extend(rec.origins.iter().map(|t| t.outcome.clone()));
            (rec.proposed)();
            Ok(Commit::new(|_| {}))
        }
    }

    #[test]
    fn tagged_writes_record_the_statements_they_applied() {
        use crate::write::command::WriteOutcome as W;
        let dir = tempfile::tempdir().expect("tempdir");
        let engine = Engine::open(dir.path()).expect("open");
        let tags = Arc::new(Tags::default());
        engine.set_replicator(Some(tags.clone()));
        let db = engine.database("d").expect("database");
        db.collection("c")
            .insert_one(doc! {"_id": 2})
            .expect("seed");
        let tag: Arc<[u8]> = Arc::from(&b"tag"[..]);
        // An unordered batch of statements 5..=9 (a retry running the
        // statements its first run did not apply): 6 fails to prepare (an
        // array `_id`: it is left out before the writer), 7 is a duplicate
        // key.
        let retried = db
            .with_origin(tag.clone())
            .with_statements(Arc::from([5, 6, 7, 8, 9]));
        let docs = vec![
            doc! {"_id": 1},
            doc! {"_id": [1, 2]},
            doc! {"_id": 2},
            doc! {"_id": 3},
            doc! {"_id": 4},
        ];
        assert!(retried.collection("c").insert_many(docs, false).is_err());
        // An update is one statement: the handle's first.
        let one = db.with_origin(tag).with_statements(Arc::from([3]));
        one.collection("c")
            .update_one(doc! {"_id": 1}, doc! {"$set": {"v": 1}})
            .expect("update");
        let got = tags.0.lock().clone();
        let seed = got.len() - 2;
        assert_eq!(W::statements(&got[seed]), Some(vec![5, 8, 9]));
        assert_eq!(W::decode(&got[seed]), Some(W::Inserted { n: 3 }));
        assert_eq!(W::statements(&got[seed + 1]), Some(vec![3]));
        // Consecutive ids are kept as their first.
        let enc = W::Inserted { n: 3 }.encode_at(&[4, 5, 6]);
        assert_eq!(W::statements(&enc), Some(vec![4, 5, 6]));
        assert_eq!(W::statements(&W::Inserted { n: 3 }.encode()), None);
    }
}
