//! The Raft state machine: the engine's databases. Committed entries are
//! applied in log order on every member.
//!
//! - A group entry made by this member's writer in this process
//!   ([`crate::pending`]) is handed back to that writer, which appends the
//!   same record to its WAL and publishes; the apply waits for it.
//! - Any other group entry is applied with `Database::apply_replicated`
//!   (the recovery replay of one record, logged verbatim) — if it continues
//!   its database's log (`first == csn + 1`); otherwise it is skipped. Every
//!   member applies the same entries to the same states, so every member
//!   skips the same ones: a group made by a primary on a state that another
//!   committed entry moved past (a deposed primary's, or one the writer gave
//!   up on) never applies anywhere.
//! - `dropDatabase` drops the database on every member, at the primary's
//!   cluster time carried in the entry (`DropDatabaseAt`; the older
//!   `DropDatabase` entries drop at each member's own time), which then
//!   counts as applied (`last_write_ts`) like a group's.
//! - An idle primary's no-op changes nothing but the applied time: its
//!   cluster time and wall-clock date become the last write's.
//!
//! After each group applied, the database's state is recorded by its
//! cluster time (`history.rs`) for snapshot reads at that time.
//!
//! While the server holds an `fsync` lock (`Shared::apply_paused`), applies
//! wait: as MongoDB's `fsyncLock` stops a secondary's oplog application, the
//! member falls behind (its `lastWrite` stays) until `fsyncUnlock`.
//!
//! The retry tags a group carries (`retries.rs`) are written ahead once the
//! group is known to apply here (it continues its database's log), and
//! recorded in memory once it is published; a Raft snapshot carries the
//! table, and installing one replaces it.
//!
//! Where the applied position is kept: `repl.raft/applied` (last applied
//! log id and membership), rewritten after each batch, synced after a
//! batch that dropped a database or changed membership. It may lag the
//! databases after a crash; re-applying a group is then a skip (its csns
//! are already there), so a restart converges to the same state.
//!
//! Raft snapshots (`snapshot.rs`): the builder takes every database's
//! published state and named snapshots when openraft asks for it (between
//! two applies, so the states are exactly those after the last applied
//! entry) and writes them on a task of its own; an installed snapshot
//! replaces the databases (with their named snapshots) and the applied
//! position. A `snapshot` file of a later position than
//! `applied` (a crash in the middle of an install) is installed again at
//! open, before openraft starts.

use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Weak};

use duetdb::Engine;
use openraft::storage::RaftStateMachine;
use openraft::{
    EntryPayload, ErrorSubject, ErrorVerb, RaftSnapshotBuilder, Snapshot, SnapshotMeta,
};
use serde::{Deserialize, Serialize};

use crate::log_store::write_atomic;
use crate::pending::{Outcome, Pending};
use crate::retries::Retry;
use crate::snapshot::{self, Capture, Meta, Snapshots, INCOMING_FILE, SNAPSHOT_FILE};
use crate::types::{
    record_range, Entry, LogId, NodeId, Request, Response, StorageError, StoredMembership, Tagged,
    TypeConfig,
};

/// What the state machine and the rest of the member share.
pub struct Shared {
    pub engine: Weak<Engine>,
    pub me: NodeId,
    /// Random per process start (see `types::Origin`).
    pub incarnation: u64,
    pub pending: Pending,
    /// Tokens of this process's `DropDatabaseAt` entries whose cluster time
    /// is still in flight in the engine's clock (taken by the primary before
    /// proposing): whoever removes a token — the apply, or the proposer
    /// giving up — finishes that time (`Member::drop_database`).
    pub own_times: parking_lot::Mutex<std::collections::HashSet<u64>>,
    /// Recent database states by cluster time (`history.rs`).
    pub history: crate::history::History,
    pub next_token: AtomicU64,
    /// Retryable writes applied (`retries.rs`).
    pub retries: crate::retries::Retries,
    /// Index of the last applied entry, and the cluster time (the highest of
    /// the groups applied: a group's time is the primary's, carried in its
    /// record) and wall-clock milliseconds of the last applied group
    /// (`hello.lastWrite`, `Member::wait_for_time`).
    pub applied_index: AtomicU64,
    pub last_write_ts: AtomicU64,
    pub last_write_wall_ms: AtomicU64,
    /// Raft snapshot builds and installs (`snapshot.rs`).
    pub snapshots: Snapshots,
    /// Snapshots built and installed by this process (`replSetGetStatus`).
    pub snapshots_built: AtomicU64,
    pub snapshots_installed: AtomicU64,
    /// Idle no-op entries applied by this process (`replSetGetStatus`).
    pub noops_applied: AtomicU64,
    /// The configuration version that removed this member from the set, as
    /// the primary told it (0: not removed; `member::mark_removed`).
    pub removed: AtomicU64,
    /// `<data dir>/repl.raft`.
    pub dir: PathBuf,
    /// The set and member this data directory belongs to.
    pub identity: Arc<crate::log_store::Identity>,
    /// How this member's Raft RPCs travel.
    pub transport: crate::network::Transport,
    /// `true` while applies are paused (`Member::pause_applies`: the
    /// server's `fsync` lock, as MongoDB's `fsyncLock` stops a secondary's
    /// oplog application): committed entries wait, unapplied, until it is
    /// `false` again.
    pub apply_paused: tokio::sync::watch::Sender<bool>,
    /// `true` while a batch of entries is being applied: a pause waits for
    /// it to be `false` so that, once the `fsync` lock is answered, this
    /// member's state and `lastWrite` no longer move (a batch that had
    /// started before the pause would otherwise finish after it).
    pub apply_busy: tokio::sync::watch::Sender<bool>,
}

/// Marks a batch of applies as running until dropped (also on an error
/// return), for `Member::pause_applies` to wait on.
struct Busy<'a>(&'a tokio::sync::watch::Sender<bool>);

impl Drop for Busy<'_> {
    fn drop(&mut self) {
        self.0.send_replace(false);
    }
}

impl Shared {
    /// Make `ts`, the time of an entry of `origin` about to be applied
    /// here, in flight in this member's clock: the primary's own entry's
    /// time is in flight already (its proposer's token still registered),
    /// any other is adopted. Under `own_times`' lock, which a proposer that
    /// gives up holds while it removes its token and finishes its time
    /// (`Member::propose_timed`): otherwise the apply could find the token
    /// gone and adopt the time while it was still in flight.
    pub fn take_time(&self, engine: &Engine, origin: &crate::types::Origin, ts: u64) {
        let mut own = self.own_times.lock();
        let mine = origin.member == self.me
            && origin.incarnation == self.incarnation
            && own.remove(&origin.token);
        if !mine {
            engine.adopt_time(ts);
        }
    }

    /// Raise the last write's time (`hello.lastWrite`, the applied time
    /// reads wait for) to the newest group time the engine's databases
    /// hold: at open (a restarted member has applied every group its
    /// databases hold, and reported time 0 and a 1970 `lastWriteDate` until
    /// the next write — drivers then took it for stale under
    /// `maxStalenessSeconds`, and `afterClusterTime` reads waited for a new
    /// write) and after installing a Raft snapshot. The wall-clock date is
    /// the time's seconds (a group's time is its primary's wall-clock
    /// seconds, or just above the previous time).
    pub fn adopt_engine_times(&self, engine: &Engine) {
        let ts = engine
            .all_databases()
            .iter()
            .map(|d| d.snapshot().cluster_time())
            .max()
            .unwrap_or(0);
        if ts > self.last_write_ts.load(Ordering::Acquire) {
            self.last_write_wall_ms
                .store((ts >> 32) * 1000, Ordering::Relaxed);
            self.last_write_ts.fetch_max(ts, Ordering::Release);
        }
    }
}

#[derive(Serialize, Deserialize, Default)]
struct Applied {
    last: Option<LogId>,
    membership: StoredMembership,
}

/// See the module documentation.
pub struct StateMachine {
    shared: Arc<Shared>,
    dir: PathBuf,
    applied: Applied,
}

fn sm_err(verb: ErrorVerb, e: impl std::fmt::Display) -> StorageError {
    StorageError::from_io_error(
        ErrorSubject::StateMachine,
        verb,
        std::io::Error::other(e.to_string()),
    )
}

impl StateMachine {
    /// The state machine kept in `dir` (`repl.raft`).
    pub fn open(dir: PathBuf, shared: Arc<Shared>) -> Result<StateMachine, String> {
        let path = dir.join("applied");
        let applied = match std::fs::read(&path) {
            Ok(b) => bincode::deserialize(&b).map_err(|e| format!("{}: {e}", path.display()))?,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Applied::default(),
            Err(e) => return Err(format!("cannot read {}: {e}", path.display())),
        };
        snapshot::clear_work(&dir);
        let mut sm = StateMachine {
            shared,
            dir,
            applied,
        };
        let snap = snapshot::current_position(&sm.dir)
            .map_err(|e| format!("{}: {e}", sm.dir.join(SNAPSHOT_FILE).display()))?;
        if let Some(meta) = snap.filter(|m| m.last_log_id > sm.applied.last) {
            tracing::warn!(snapshot = %meta.snapshot_id,
                "installing the Raft snapshot again (an install was interrupted)");
            let engine = sm.engine().map_err(|e| e.to_string())?;
            let got = snapshot::install(&engine, &sm.dir)
                .map_err(|e| format!("cannot install the Raft snapshot: {e}"))?;
            sm.installed(&got, &engine).map_err(|e| e.to_string())?;
        }
        if let Some(l) = sm.applied.last {
            sm.shared.applied_index.store(l.index, Ordering::Release);
        }
        if let Ok(engine) = sm.engine() {
            sm.shared.adopt_engine_times(&engine);
        }
        Ok(sm)
    }

    /// The databases now hold snapshot `got`: its retry table replaces this
    /// member's (before the applied position moves, so a crash in between
    /// installs the snapshot again at open), and it is the applied position.
    fn installed(
        &mut self,
        got: &snapshot::Installed,
        engine: &Engine,
    ) -> Result<(), StorageError> {
        if let Some(tags) = &got.retries {
            self.shared
                .retries
                .replace(tags)
                .map_err(|e| snap_err(ErrorVerb::Write, e))?;
        }
        let meta = &got.meta;
        self.applied.last = meta.last_log_id;
        self.applied.membership = meta.last_membership.clone();
        self.save(true)?;
        if let Some(l) = meta.last_log_id {
            self.shared.applied_index.store(l.index, Ordering::Release);
        }
        self.shared.adopt_engine_times(engine);
        self.shared
            .snapshots_installed
            .fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    fn save(&self, sync: bool) -> Result<(), StorageError> {
        let bytes = bincode::serialize(&self.applied).map_err(|e| sm_err(ErrorVerb::Write, e))?;
        let written = if sync {
            write_atomic(&self.dir, "applied", &bytes)
        } else {
            let tmp = self.dir.join("applied.tmp");
            std::fs::write(&tmp, &bytes)
                .and_then(|_| std::fs::rename(&tmp, self.dir.join("applied")))
        };
        written.map_err(|e| sm_err(ErrorVerb::Write, e))
    }

    fn engine(&self) -> Result<Arc<Engine>, StorageError> {
        self.shared
            .engine
            .upgrade()
            .ok_or_else(|| sm_err(ErrorVerb::Write, "the server is shutting down"))
    }

    /// A named snapshot of a `CreateSnapshot` entry: created at `created_ms`
    /// (the primary's clock, `CreateSnapshotAt`) or, for entries logged
    /// before that existed, now.
    async fn create_snapshot(
        &self,
        db: String,
        name: String,
        collections: Option<Vec<String>>,
        ttl_secs: Option<u64>,
        durable: bool,
        created_ms: Option<u64>,
    ) -> Result<Result<u64, (i32, String)>, StorageError> {
        let engine = self.engine()?;
        tokio::task::spawn_blocking(move || {
            let opts = duetdb::SnapshotOptions {
                collections,
                ttl: ttl_secs.map(std::time::Duration::from_secs),
                durable,
            };
            let database = engine.database(&db);
            let info = match created_ms {
                Some(ms) => database.and_then(|d| {
                    let created = std::time::UNIX_EPOCH + std::time::Duration::from_millis(ms);
                    d.create_snapshot_at(&name, opts, created)
                }),
                None => database.and_then(|d| d.create_snapshot_with(&name, opts)),
            };
            info.map(|i| i.csn).map_err(|e| (e.code(), e.to_string()))
        })
        .await
        .map_err(|e| sm_err(ErrorVerb::Write, e))
    }

    /// A group entry at log index `index` (see the module documentation).
    async fn apply_group_entry(
        &mut self,
        index: u64,
        db: String,
        origin: crate::types::Origin,
        payload: Vec<u8>,
        retries: Vec<Tagged>,
    ) -> Result<(Response, bool), StorageError> {
        let retries: Vec<Retry> = retries
            .into_iter()
            .enumerate()
            .map(|(pos, t)| Retry {
                tag: t.tag,
                outcome: t.outcome,
                index,
                pos: pos as u32,
            })
            .collect();
        let Some((first, _)) = record_range(&payload) else {
            return Err(sm_err(
                ErrorVerb::Read,
                "a group entry without a record header",
            ));
        };
        let stamp = (payload.len() >= 36).then(|| {
            let ts = u64::from_le_bytes(payload[20..28].try_into().unwrap_or_default());
            let wall = u64::from_le_bytes(payload[28..36].try_into().unwrap_or_default());
            (ts, wall)
        });
        let mine = origin.member == self.shared.me && origin.incarnation == self.shared.incarnation;
        let pending = mine
            .then(|| self.shared.pending.take(origin.token))
            .flatten();
        let response = match pending {
            Some(tx) => self.hand_back(&db, first, tx, &retries).await?,
            None => {
                let engine = self.engine()?;
                let shared = self.shared.clone();
                let db = db.clone();
                let tags = retries.clone();
                tokio::task::spawn_blocking(move || {
                    apply_group(&engine, &shared, &db, first, payload, &tags)
                })
                .await
                .map_err(|e| sm_err(ErrorVerb::Write, e))??
            }
        };
        if response == Response::Applied {
            self.shared.retries.record(&retries);
            // The state just after this group, for snapshot reads at
            // its time (only if no other group of the database was
            // published since: every one passes through here).
            if let (Some((ts, _)), Ok(engine)) = (stamp, self.engine()) {
                if let Some(snap) = engine
                    .get(&db)
                    .ok()
                    .flatten()
                    .map(|d| d.snapshot())
                    .filter(|s| s.cluster_time() == ts)
                {
                    self.shared.history.record(&db, snap);
                }
            }
        }
        // After the group is published here (or skipped): a read
        // waiting for this time (`Member::wait_for_time`) may go.
        if let Some((ts, wall)) = stamp {
            self.shared
                .last_write_wall_ms
                .store(wall, Ordering::Relaxed);
            self.shared.last_write_ts.fetch_max(ts, Ordering::Release);
        }
        Ok((response, false))
    }

    async fn apply_request(
        &mut self,
        index: u64,
        req: Request,
    ) -> Result<(Response, bool), StorageError> {
        match req {
            Request::Group {
                db,
                origin,
                payload,
                retries,
            } => {
                // An older log's group: bare tags, no outcomes.
                let retries = retries.into_iter().map(Tagged::bare).collect();
                self.apply_group_entry(index, db, origin, payload, retries)
                    .await
            }
            Request::GroupReplies {
                db,
                origin,
                payload,
                retries,
            } => {
                self.apply_group_entry(index, db, origin, payload, retries)
                    .await
            }
            Request::CreateSnapshot {
                db,
                name,
                collections,
                ttl_secs,
                durable,
            } => {
                let r = self
                    .create_snapshot(db, name, collections, ttl_secs, durable, None)
                    .await?;
                Ok((Response::Snapshot(r), false))
            }
            Request::DropSnapshot { db, name } => {
                let engine = self.engine()?;
                let r = tokio::task::spawn_blocking(move || match engine.get(&db) {
                    Ok(Some(d)) => d
                        .drop_snapshot(&name)
                        .map(|_| 0)
                        .map_err(|e| (e.code(), e.to_string())),
                    Ok(None) => Err((246, format!("no snapshot named '{name}' in database {db}"))),
                    Err(e) => Err((e.code(), e.to_string())),
                })
                .await
                .map_err(|e| sm_err(ErrorVerb::Write, e))?;
                Ok((Response::Snapshot(r), false))
            }
            Request::CreateSnapshotAt {
                db,
                name,
                collections,
                ttl_secs,
                durable,
                created_ms,
            } => {
                let r = self
                    .create_snapshot(db, name, collections, ttl_secs, durable, Some(created_ms))
                    .await?;
                Ok((Response::Snapshot(r), false))
            }
            Request::DropDatabaseAt {
                db,
                ts,
                wall_ms,
                origin,
            } => {
                let engine = self.engine()?;
                let shared = self.shared.clone();
                let existed = tokio::task::spawn_blocking(move || {
                    shared.take_time(&engine, &origin, ts);
                    shared.pending.supersede(&db, None);
                    let existed = engine
                        .try_drop_database_at(&db, ts, wall_ms)
                        .unwrap_or_else(|e| {
                            tracing::warn!(db = %db, error = %e, "database not dropped");
                            false
                        });
                    shared.pending.unblock(&db);
                    existed
                })
                .await
                .map_err(|e| sm_err(ErrorVerb::Write, e))?;
                // The drop's time is applied here: a read waiting for it
                // (`Member::wait_for_time`) may go.
                self.shared
                    .last_write_wall_ms
                    .store(wall_ms.max(0) as u64, Ordering::Relaxed);
                self.shared.last_write_ts.fetch_max(ts, Ordering::Release);
                Ok((Response::Dropped { existed }, true))
            }
            Request::Noop {
                ts,
                wall_ms,
                origin,
            } => {
                let engine = self.engine()?;
                // As a drop of no database: the time passes through this
                // member's clock (in flight on the primary that took it,
                // adopted elsewhere) and is finished at once.
                self.shared.take_time(&engine, &origin, ts);
                engine.abandon_time(ts);
                self.shared
                    .last_write_wall_ms
                    .store(wall_ms.max(0) as u64, Ordering::Relaxed);
                self.shared.last_write_ts.fetch_max(ts, Ordering::Release);
                self.shared.noops_applied.fetch_add(1, Ordering::Relaxed);
                Ok((Response::Applied, false))
            }
            Request::DropDatabase { db } => {
                let engine = self.engine()?;
                let shared = self.shared.clone();
                let existed = tokio::task::spawn_blocking(move || {
                    shared.pending.supersede(&db, None);
                    let existed = engine.drop_database(&db);
                    shared.pending.unblock(&db);
                    existed
                })
                .await
                .map_err(|e| sm_err(ErrorVerb::Write, e))?;
                Ok((Response::Dropped { existed }, true))
            }
        }
    }

    /// This member's own group: let its waiting writer log and publish it
    /// (its retry tags written ahead, `retries.rs`).
    async fn hand_back(
        &self,
        db: &str,
        first: u64,
        tx: std::sync::mpsc::SyncSender<Outcome>,
        tags: &[Retry],
    ) -> Result<Response, StorageError> {
        let engine = self.engine()?;
        // The writer is blocked waiting, so the published csn is stable.
        let csn = engine.get(db).ok().flatten().map_or(0, |d| d.csn());
        if first != csn + 1 {
            let _ = tx.try_send(Outcome::Failed(crate::pending::superseded(db)));
            return Ok(Response::Skipped);
        }
        self.shared
            .retries
            .log(tags)
            .map_err(|e| sm_err(ErrorVerb::Write, e))?;
        let (ack_tx, ack_rx) = tokio::sync::oneshot::channel();
        if tx.try_send(Outcome::Committed(ack_tx)).is_err() {
            return Err(sm_err(
                ErrorVerb::Write,
                "the writer stopped waiting for its commit",
            ));
        }
        match ack_rx.await {
            Ok(Ok(())) => Ok(Response::Applied),
            Ok(Err(why)) => Err(sm_err(ErrorVerb::Write, why)),
            Err(_) => Err(sm_err(
                ErrorVerb::Write,
                "the writer never finished its commit",
            )),
        }
    }
}

/// Apply another origin's group entry (blocking: it may create the
/// database and waits for its writer), its retry tags written ahead
/// (`retries.rs`).
fn apply_group(
    engine: &Engine,
    shared: &Shared,
    db: &str,
    first: u64,
    payload: Vec<u8>,
    tags: &[Retry],
) -> Result<Response, StorageError> {
    let handle = match engine.get(db) {
        Ok(Some(d)) => d,
        Ok(None) if first == 1 => engine
            .database(db)
            .map_err(|e| sm_err(ErrorVerb::Write, e))?,
        Ok(None) => return Ok(Response::Skipped),
        Err(e) => return Err(sm_err(ErrorVerb::Write, e)),
    };
    if first != handle.csn() + 1 {
        return Ok(Response::Skipped);
    }
    shared
        .retries
        .log(tags)
        .map_err(|e| sm_err(ErrorVerb::Write, e))?;
    shared.pending.supersede(db, Some(first));
    let applied = handle.apply_replicated(Arc::from(payload));
    shared.pending.unblock(db);
    match applied {
        Ok(true) => Ok(Response::Applied),
        Ok(false) => Ok(Response::Skipped),
        Err(e) => Err(sm_err(ErrorVerb::Write, e)),
    }
}

impl RaftStateMachine<TypeConfig> for StateMachine {
    type SnapshotBuilder = Builder;

    async fn applied_state(&mut self) -> Result<(Option<LogId>, StoredMembership), StorageError> {
        Ok((self.applied.last, self.applied.membership.clone()))
    }

    async fn apply<I>(&mut self, entries: I) -> Result<Vec<Response>, StorageError>
    where
        I: IntoIterator<Item = Entry> + Send,
        I::IntoIter: Send,
    {
        // Paused (an `fsync` lock): apply nothing until it is lifted. Busy
        // is raised before the pause is read and the pause before busy is
        // read (`Member::pause_applies`), so either this batch sees the
        // pause or the pause waits for this batch.
        let shared = self.shared.clone();
        let mut paused = shared.apply_paused.subscribe();
        let _busy = loop {
            shared.apply_busy.send_replace(true);
            let busy = Busy(&shared.apply_busy);
            if !*paused.borrow_and_update() {
                break busy;
            }
            drop(busy);
            tracing::info!("applies paused by an fsync lock");
            let _ = paused.wait_for(|p| !*p).await;
            tracing::info!("applies resumed");
        };
        let mut out = Vec::new();
        let mut sync = false;
        for e in entries {
            let r = match e.payload {
                EntryPayload::Blank => Response::Applied,
                EntryPayload::Membership(m) => {
                    self.applied.membership = StoredMembership::new(Some(e.log_id), m);
                    sync = true;
                    Response::Applied
                }
                EntryPayload::Normal(req) => {
                    let (r, must_sync) = self.apply_request(e.log_id.index, req).await?;
                    sync |= must_sync;
                    r
                }
            };
            self.applied.last = Some(e.log_id);
            self.shared
                .applied_index
                .store(e.log_id.index, Ordering::Release);
            out.push(r);
        }
        self.save(sync)?;
        Ok(out)
    }

    async fn get_snapshot_builder(&mut self) -> Self::SnapshotBuilder {
        // Called between two applies: the published states are those after
        // the last applied entry (see the module documentation).
        let capture = self.shared.engine.upgrade().map(|engine| {
            let last = self.applied.last;
            Capture {
                meta: Meta {
                    last_log_id: last,
                    last_membership: self.applied.membership.clone(),
                    snapshot_id: format!(
                        "{}-{}-{:08x}",
                        last.map_or(0, |l| l.leader_id.term),
                        last.map_or(0, |l| l.index),
                        rand::random::<u32>()
                    ),
                },
                dbs: snapshot::capture_databases(&engine),
                retries: self.shared.retries.entries(),
            }
        });
        Builder {
            dir: self.dir.clone(),
            shared: self.shared.clone(),
            capture,
        }
    }

    async fn begin_receiving_snapshot(&mut self) -> Result<Box<tokio::fs::File>, StorageError> {
        let f = tokio::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(self.dir.join(INCOMING_FILE))
            .await
            .map_err(|e| snap_err(ErrorVerb::Write, e))?;
        Ok(Box::new(f))
    }

    async fn install_snapshot(
        &mut self,
        meta: &SnapshotMeta<NodeId, openraft::BasicNode>,
        mut data: Box<tokio::fs::File>,
    ) -> Result<(), StorageError> {
        use tokio::io::AsyncWriteExt;
        data.flush()
            .await
            .map_err(|e| snap_err(ErrorVerb::Write, e))?;
        data.sync_all()
            .await
            .map_err(|e| snap_err(ErrorVerb::Write, e))?;
        drop(data);
        let engine = self.engine()?;
        let dir = self.dir.clone();
        let shared = self.shared.clone();
        let want = meta.last_log_id;
        let started = std::time::Instant::now();
        let got = tokio::task::spawn_blocking(move || -> std::io::Result<snapshot::Installed> {
            let _g = shared.snapshots.lock.lock();
            let got = snapshot::read_meta(&dir.join(INCOMING_FILE))?;
            if got.last_log_id != want {
                return Err(std::io::Error::other(format!(
                    "the snapshot received is at {:?}, its metadata says {want:?}",
                    got.last_log_id
                )));
            }
            std::fs::rename(dir.join(INCOMING_FILE), dir.join(SNAPSHOT_FILE))?;
            crate::log_store::fsync_dir(&dir)?;
            snapshot::install(&engine, &dir)
        })
        .await
        .map_err(|e| snap_err(ErrorVerb::Write, e))?
        .map_err(|e| snap_err(ErrorVerb::Write, e))?;
        let engine = self.engine()?;
        self.installed(&got, &engine)?;
        tracing::info!(snapshot = %got.meta.snapshot_id, secs = started.elapsed().as_secs_f64(),
            "installed a Raft snapshot");
        Ok(())
    }

    async fn get_current_snapshot(&mut self) -> Result<Option<Snapshot<TypeConfig>>, StorageError> {
        match snapshot::open_current(&self.dir) {
            Ok(Some((meta, f))) => Ok(Some(Snapshot {
                meta,
                snapshot: Box::new(tokio::fs::File::from_std(f)),
            })),
            Ok(None) => Ok(None),
            Err(e) => Err(snap_err(ErrorVerb::Read, e)),
        }
    }
}

fn snap_err(verb: ErrorVerb, e: impl std::fmt::Display) -> StorageError {
    StorageError::from_io_error(
        ErrorSubject::Snapshot(None),
        verb,
        std::io::Error::other(e.to_string()),
    )
}

/// Writes the snapshot captured by `get_snapshot_builder` (on a task of
/// its own: applies go on meanwhile).
pub struct Builder {
    dir: PathBuf,
    shared: Arc<Shared>,
    capture: Option<Capture>,
}

impl RaftSnapshotBuilder<TypeConfig> for Builder {
    async fn build_snapshot(&mut self) -> Result<Snapshot<TypeConfig>, StorageError> {
        let Some(capture) = self.capture.take() else {
            return Err(snap_err(ErrorVerb::Read, "the server is shutting down"));
        };
        let dir = self.dir.clone();
        let shared = self.shared.clone();
        let started = std::time::Instant::now();
        let (meta, f) =
            tokio::task::spawn_blocking(move || snapshot::build(&dir, &shared.snapshots, capture))
                .await
                .map_err(|e| snap_err(ErrorVerb::Write, e))?
                .map_err(|e| snap_err(ErrorVerb::Write, e))?;
        self.shared.snapshots_built.fetch_add(1, Ordering::Relaxed);
        tracing::info!(snapshot = %meta.snapshot_id, secs = started.elapsed().as_secs_f64(),
            "built a Raft snapshot");
        Ok(Snapshot {
            meta,
            snapshot: Box::new(tokio::fs::File::from_std(f)),
        })
    }
}
