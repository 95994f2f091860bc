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
//! - `dropDatabase` drops the database on every member.
//!
//! Where the applied position is kept: `repl.raft/applied` (last applied
//! log id and membership), rewritten after each batch, synced after a
//! batch that dropped a database or changed membership. It may lag the
//! databases after a crash; re-applying a group is then a skip (its csns
//! are already there), so a restart converges to the same state.
//!
//! Raft snapshots are not built (the log is kept whole; see docs/design.md
//! "Replication"), so `build_snapshot` and `install_snapshot` refuse.

use std::io::Cursor;
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
use crate::types::{
    record_range, Entry, LogId, NodeId, Request, Response, StorageError, StoredMembership,
    TypeConfig,
};

/// What the state machine and the rest of the member share.
pub struct Shared {
    pub engine: Weak<Engine>,
    pub me: NodeId,
    /// Random per process start (see `types::Origin`).
    pub incarnation: u64,
    pub pending: Pending,
    /// Retryable writes applied (`retries.rs`).
    pub retries: crate::retries::Retries,
    /// Index of the last applied entry, and the cluster time and wall-clock
    /// milliseconds of the last applied group (`hello.lastWrite`).
    pub applied_index: AtomicU64,
    pub last_write_ts: AtomicU64,
    pub last_write_wall_ms: AtomicU64,
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
        if let Some(l) = applied.last {
            shared.applied_index.store(l.index, Ordering::Release);
        }
        Ok(StateMachine {
            shared,
            dir,
            applied,
        })
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

    async fn apply_request(&mut self, req: Request) -> Result<(Response, bool), StorageError> {
        match req {
            Request::Group {
                db,
                origin,
                payload,
                retries,
            } => {
                let Some((first, _)) = record_range(&payload) else {
                    return Err(sm_err(
                        ErrorVerb::Read,
                        "a group entry without a record header",
                    ));
                };
                if payload.len() >= 36 {
                    let ts = u64::from_le_bytes(payload[20..28].try_into().unwrap_or_default());
                    let wall = u64::from_le_bytes(payload[28..36].try_into().unwrap_or_default());
                    self.shared.last_write_ts.store(ts, Ordering::Relaxed);
                    self.shared
                        .last_write_wall_ms
                        .store(wall, Ordering::Relaxed);
                }
                let mine = origin.member == self.shared.me
                    && origin.incarnation == self.shared.incarnation;
                let pending = mine
                    .then(|| self.shared.pending.take(origin.token))
                    .flatten();
                let response = match pending {
                    Some(tx) => self.hand_back(&db, first, tx).await?,
                    None => {
                        let engine = self.engine()?;
                        let shared = self.shared.clone();
                        tokio::task::spawn_blocking(move || {
                            apply_group(&engine, &shared, &db, first, payload)
                        })
                        .await
                        .map_err(|e| sm_err(ErrorVerb::Write, e))??
                    }
                };
                if response == Response::Applied {
                    for tag in &retries {
                        self.shared.retries.record(tag);
                    }
                }
                Ok((response, false))
            }
            Request::CreateSnapshot {
                db,
                name,
                collections,
                ttl_secs,
                durable,
            } => {
                let engine = self.engine()?;
                let r = tokio::task::spawn_blocking(move || {
                    let opts = duetdb::SnapshotOptions {
                        collections,
                        ttl: ttl_secs.map(std::time::Duration::from_secs),
                        durable,
                    };
                    engine
                        .database(&db)
                        .and_then(|d| d.create_snapshot_with(&name, opts))
                        .map(|info| info.csn)
                        .map_err(|e| (e.code(), e.to_string()))
                })
                .await
                .map_err(|e| sm_err(ErrorVerb::Write, e))?;
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

    /// This member's own group: let its waiting writer log and publish it.
    async fn hand_back(
        &self,
        db: &str,
        first: u64,
        tx: std::sync::mpsc::SyncSender<Outcome>,
    ) -> Result<Response, StorageError> {
        let engine = self.engine()?;
        // The writer is blocked waiting, so the published csn is stable.
        let csn = engine.get(db).ok().flatten().map_or(0, |d| d.csn());
        if first != csn + 1 {
            let _ = tx.try_send(Outcome::Failed(crate::pending::superseded(db)));
            return Ok(Response::Skipped);
        }
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
/// database and waits for its writer).
fn apply_group(
    engine: &Engine,
    shared: &Shared,
    db: &str,
    first: u64,
    payload: Vec<u8>,
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
    type SnapshotBuilder = NoSnapshots;

    async fn applied_state(&mut self) -> Result<(Option<LogId>, StoredMembership), StorageError> {
        Ok((self.applied.last, self.applied.membership.clone()))
    }

    async fn apply<I>(&mut self, entries: I) -> Result<Vec<Response>, StorageError>
    where
        I: IntoIterator<Item = Entry> + Send,
        I::IntoIter: Send,
    {
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
                    let (r, must_sync) = self.apply_request(req).await?;
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
        NoSnapshots
    }

    async fn begin_receiving_snapshot(&mut self) -> Result<Box<Cursor<Vec<u8>>>, StorageError> {
        Ok(Box::new(Cursor::new(Vec::new())))
    }

    async fn install_snapshot(
        &mut self,
        _meta: &SnapshotMeta<NodeId, openraft::BasicNode>,
        _snapshot: Box<Cursor<Vec<u8>>>,
    ) -> Result<(), StorageError> {
        Err(sm_err(
            ErrorVerb::Write,
            "Raft snapshots are not supported yet: members catch up from the log",
        ))
    }

    async fn get_current_snapshot(&mut self) -> Result<Option<Snapshot<TypeConfig>>, StorageError> {
        Ok(None)
    }
}

/// Snapshots are never built: the snapshot policy is `Never` and the log is
/// never purged, so openraft never asks.
pub struct NoSnapshots;

impl RaftSnapshotBuilder<TypeConfig> for NoSnapshots {
    async fn build_snapshot(&mut self) -> Result<Snapshot<TypeConfig>, StorageError> {
        Err(sm_err(
            ErrorVerb::Read,
            "Raft snapshots are not supported yet: members catch up from the log",
        ))
    }
}
