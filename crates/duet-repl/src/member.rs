//! One replica-set member: its Raft node, Raft RPC listener and the hook
//! that makes the engine's writers commit through the set; and what the
//! server asks of it (role, status, write-concern waits, step-down,
//! dropDatabase).
//!
//! The set is static: `--members` lists every member's MongoDB address in
//! order, and member N is the N-th (from 0). Member 0 initializes the Raft
//! group with that list when its Raft log is empty (MongoDB's
//! `rs.initiate()`); the others wait to hear from the leader. Were every
//! member to initialize, one started after the first election would
//! campaign at the leader's own term and depose it a few seconds into the
//! set's life (seen as NotWritablePrimary in the middle of a write stream).
//!
//! The Raft leader is the primary, but it accepts writes only once it has
//! applied its own term's first entry (MongoDB's drain mode): before that,
//! entries committed under the previous leader may still be unapplied here,
//! and a group made on the older state would only be skipped.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use duetdb::{Engine, Error};
use openraft::{BasicNode, ServerState, SnapshotPolicy};

use crate::log_store::{claim_identity, LogStore, RAFT_DIR};
use crate::network::{raft_address, serve, Network};
use crate::pending::Pending;
use crate::replicator::{not_primary, Replicator};
use crate::state_machine::{Shared, StateMachine};
use crate::types::{NodeId, Raft, Request, Response};

/// Milliseconds between the primary's heartbeats.
pub const HEARTBEAT_MS: u64 = 250;
/// A follower that hears no primary for a random time in this range calls
/// an election (MongoDB's default `electionTimeoutMillis` is 10 s; shorter
/// here so failover takes seconds, long enough that a loaded machine's
/// late heartbeats do not depose a healthy primary).
pub const ELECTION_TIMEOUT_MS: (u64, u64) = (2500, 5000);
/// How long a writer waits for its group's commit (`--repl-commit-timeout-secs`).
pub const DEFAULT_COMMIT_TIMEOUT: Duration = Duration::from_secs(10);
/// Log entries applied between two Raft snapshots (`--repl-snapshot-entries`).
pub const DEFAULT_SNAPSHOT_ENTRIES: u64 = 10_000;
/// Most entries kept in the log below the last snapshot (a member that far
/// behind still catches up from the log; further behind, from a snapshot).
pub const MAX_LOGS_KEPT: u64 = 1_000;
/// Most entries in one AppendEntries RPC (openraft's default is 300). openraft
/// gives each RPC one heartbeat interval (250 ms); 300 large groups to a
/// member far behind on a loaded machine took longer every time, and the
/// member never caught up.
pub const MAX_PAYLOAD_ENTRIES: u64 = 32;
/// How long sending one snapshot chunk may take, the last one's install
/// on the receiver included (openraft's `install_snapshot_timeout`; the
/// install opens every database of the snapshot, index builds included).
pub const SNAPSHOT_INSTALL_TIMEOUT_MS: u64 = 300_000;

/// How to start a member.
#[derive(Debug, Clone)]
pub struct Options {
    pub set_name: String,
    /// This member's position in `members`.
    pub member_id: NodeId,
    /// Every member's MongoDB wire address (`host:port`), in member-id order.
    pub members: Vec<String>,
    pub data_dir: PathBuf,
    pub commit_timeout: Duration,
    /// Build a Raft snapshot every this many applied entries, and purge the
    /// log below it but for `min(this / 10, MAX_LOGS_KEPT)` entries
    /// (0: never; the log then grows without bound).
    pub snapshot_entries: u64,
}

/// A member's role as MongoDB names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    Primary,
    Secondary,
    /// Campaigning in an election, or without a primary to follow.
    Startup,
    Shutdown,
}

impl Role {
    /// `replSetGetStatus` `state` / `stateStr`.
    pub fn code_and_name(self) -> (i32, &'static str) {
        match self {
            Role::Primary => (1, "PRIMARY"),
            Role::Secondary => (2, "SECONDARY"),
            Role::Startup => (0, "STARTUP"),
            Role::Shutdown => (8, "DOWN"),
        }
    }
}

/// What `hello` and `replSetGetStatus` report.
#[derive(Debug, Clone)]
pub struct Status {
    pub set_name: String,
    pub me: NodeId,
    /// `(id, wire address)` of every member.
    pub members: Vec<(NodeId, String)>,
    pub role: Role,
    /// Writable: primary, drained, not stepping down.
    pub writable: bool,
    pub primary: Option<NodeId>,
    pub term: u64,
    /// Last applied entry `(term, index)`.
    pub applied: (u64, u64),
    pub last_log_index: u64,
    /// On the primary: each member's highest index known to be in its log.
    pub matched: BTreeMap<NodeId, u64>,
    /// Cluster time and wall-clock ms of the last applied write.
    pub last_write_ts: u64,
    pub last_write_wall_ms: u64,
    /// Index of the last entry in this member's Raft snapshot, and the
    /// last index purged from its log (0: none).
    pub snapshot_index: u64,
    pub purged_index: u64,
    /// Raft snapshots this process built, and installed (sent by the leader).
    pub snapshots_built: u64,
    pub snapshots_installed: u64,
}

impl Status {
    pub fn address(&self, id: NodeId) -> Option<&str> {
        self.members
            .iter()
            .find(|(i, _)| *i == id)
            .map(|(_, a)| a.as_str())
    }
}

/// A running member (see the module documentation).
pub struct Member {
    pub(crate) raft: Raft,
    pub(crate) shared: Arc<Shared>,
    pub(crate) runtime: tokio::runtime::Handle,
    opts: Options,
    /// Set by `replSetStepDown` until another member leads.
    stepping_down: AtomicBool,
    /// The Raft RPC listener's task (aborted at shutdown, freeing the port).
    listener: parking_lot::Mutex<Option<tokio::task::JoinHandle<()>>>,
}

impl Member {
    /// Start member `opts.member_id` on `engine` (whose databases it then
    /// replicates): check the data directory belongs to it, open its Raft
    /// log, listen for Raft RPCs, join the group. Requires: a tokio
    /// multi-thread runtime is current.
    pub async fn start(opts: Options, engine: &Arc<Engine>) -> Result<Arc<Member>, String> {
        if opts.set_name.trim().is_empty() {
            return Err("--replica-set must name the set".into());
        }
        let me = opts.member_id;
        let Some(my_addr) = opts.members.get(me as usize).cloned() else {
            return Err(format!(
                "--member-id {me} is not a position in --members (0..{})",
                opts.members.len()
            ));
        };
        for (i, a) in opts.members.iter().enumerate() {
            raft_address(a)?;
            if opts.members[..i].contains(a) {
                return Err(format!("--members lists {a} twice"));
            }
        }
        let dir = opts.data_dir.join(RAFT_DIR);
        claim_identity(&dir, &opts.set_name, me)?;
        let log = LogStore::open(&dir)?;
        let shared = Arc::new(Shared {
            engine: Arc::downgrade(engine),
            me,
            incarnation: rand::random(),
            pending: Pending::default(),
            retries: Default::default(),
            applied_index: AtomicU64::new(0),
            last_write_ts: AtomicU64::new(0),
            last_write_wall_ms: AtomicU64::new(0),
            snapshots: Default::default(),
            snapshots_built: AtomicU64::new(0),
            snapshots_installed: AtomicU64::new(0),
        });
        let sm = StateMachine::open(dir, shared.clone())?;
        let config = openraft::Config {
            cluster_name: opts.set_name.clone(),
            heartbeat_interval: HEARTBEAT_MS,
            election_timeout_min: ELECTION_TIMEOUT_MS.0,
            election_timeout_max: ELECTION_TIMEOUT_MS.1,
            snapshot_policy: match opts.snapshot_entries {
                0 => SnapshotPolicy::Never,
                n => SnapshotPolicy::LogsSinceLast(n),
            },
            max_in_snapshot_log_to_keep: match opts.snapshot_entries {
                0 => u64::MAX,
                n => (n / 10).min(MAX_LOGS_KEPT),
            },
            replication_lag_threshold: opts.snapshot_entries.saturating_mul(2).max(5000),
            install_snapshot_timeout: SNAPSHOT_INSTALL_TIMEOUT_MS,
            max_payload_entries: MAX_PAYLOAD_ENTRIES,
            ..Default::default()
        }
        .validate()
        .map_err(|e| format!("Raft configuration: {e}"))?;
        let raft_addr = raft_address(&my_addr)?;
        let listener = tokio::net::TcpListener::bind(&raft_addr)
            .await
            .map_err(|e| format!("cannot listen for Raft on {raft_addr}: {e}"))?;
        let raft = Raft::new(me, Arc::new(config), Network, log, sm)
            .await
            .map_err(|e| format!("cannot start Raft: {e}"))?;
        let listener = tokio::spawn(serve(listener, raft.clone()));
        let initialized = raft
            .is_initialized()
            .await
            .map_err(|e| format!("Raft: {e}"))?;
        if !initialized && me == 0 {
            let nodes: BTreeMap<NodeId, BasicNode> = opts
                .members
                .iter()
                .enumerate()
                .map(|(i, a)| (i as NodeId, BasicNode::new(a)))
                .collect();
            if let Err(e) = raft.initialize(nodes).await {
                tracing::info!(error = %e, "Raft group already initialized");
            }
        }
        let member = Arc::new(Member {
            raft,
            shared,
            runtime: tokio::runtime::Handle::current(),
            opts,
            stepping_down: AtomicBool::new(false),
            listener: parking_lot::Mutex::new(Some(listener)),
        });
        engine.set_replicator(Some(Arc::new(Replicator {
            member: member.clone(),
            commit_timeout: member.opts.commit_timeout,
        })));
        tracing::info!(set = %member.opts.set_name, member = me, raft = %raft_addr,
            "replica-set member started");
        Ok(member)
    }

    pub fn set_name(&self) -> &str {
        &self.opts.set_name
    }

    pub fn member_id(&self) -> NodeId {
        self.opts.member_id
    }

    /// Every member's wire address, by id.
    pub fn members(&self) -> &[String] {
        &self.opts.members
    }

    pub fn status(&self) -> Status {
        let m = self.raft.metrics().borrow().clone();
        let me = self.opts.member_id;
        let applied = m
            .last_applied
            .map_or((0, 0), |l| (l.leader_id.term, l.index));
        let drained = applied.0 == m.current_term;
        let role = match m.state {
            ServerState::Leader => Role::Primary,
            ServerState::Follower if m.current_leader.is_some() => Role::Secondary,
            ServerState::Shutdown => Role::Shutdown,
            _ => Role::Startup,
        };
        let writable =
            role == Role::Primary && drained && !self.stepping_down.load(Ordering::Acquire);
        let matched = m
            .replication
            .as_ref()
            .map(|r| {
                r.iter()
                    .map(|(id, l)| (*id, l.map_or(0, |l| l.index)))
                    .collect()
            })
            .unwrap_or_default();
        Status {
            set_name: self.opts.set_name.clone(),
            me,
            members: self
                .opts
                .members
                .iter()
                .enumerate()
                .map(|(i, a)| (i as NodeId, a.clone()))
                .collect(),
            role,
            writable,
            primary: m.current_leader,
            term: m.current_term,
            applied,
            last_log_index: m.last_log_index.unwrap_or(0),
            matched,
            last_write_ts: self.shared.last_write_ts.load(Ordering::Relaxed),
            last_write_wall_ms: self.shared.last_write_wall_ms.load(Ordering::Relaxed),
            snapshot_index: m.snapshot.map_or(0, |l| l.index),
            purged_index: m.purged.map_or(0, |l| l.index),
            snapshots_built: self.shared.snapshots_built.load(Ordering::Relaxed),
            snapshots_installed: self.shared.snapshots_installed.load(Ordering::Relaxed),
        }
    }

    pub fn is_writable_primary(&self) -> bool {
        self.status().writable
    }

    /// Whether the set applied a write of client operation `origin` (a
    /// retryable write's tag, `Database::with_origin`).
    pub fn applied_retryable(&self, origin: &[u8]) -> bool {
        self.shared.retries.contains(origin)
    }

    /// Index of the last entry applied here (a write acknowledged by this
    /// member is at or below it).
    pub fn applied_index(&self) -> u64 {
        self.shared.applied_index.load(Ordering::Acquire)
    }

    /// Index of the last entry in this member's Raft log. On the primary,
    /// every write it acknowledged is at or below it (a write is answered
    /// once appended, before this member applies it: `applied_index` may
    /// still be behind the client's own write).
    pub fn last_log_index(&self) -> u64 {
        self.raft.metrics().borrow().last_log_index.unwrap_or(0)
    }

    /// The highest cluster time of the groups this member applied (group
    /// times are the primary's, carried in the replicated records, so a time
    /// means the same write on every member).
    pub fn applied_time(&self) -> u64 {
        self.shared.last_write_ts.load(Ordering::Acquire)
    }

    /// Wait (blocking, polling) until this member applied a group of cluster
    /// time `ts` or later — read concern `afterClusterTime`/`atClusterTime`
    /// on any member — or `cancelled()` says stop (`maxTimeMS`, `killOp`,
    /// disconnect). Whether it got there.
    pub fn wait_for_time(&self, ts: u64, cancelled: impl Fn() -> bool) -> bool {
        loop {
            if self.applied_time() >= ts {
                return true;
            }
            if cancelled() {
                return false;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// Wait (blocking) until `w` members hold entry `index` in their Raft
    /// log, at most `timeout` (`None`: no limit). `Ok(false)` on time-out.
    /// Requires: called from a thread outside the runtime (a command's
    /// blocking thread).
    pub fn wait_for_members(&self, index: u64, w: usize, timeout: Option<Duration>) -> bool {
        let me = self.opts.member_id;
        let mut rx = self.raft.metrics();
        let wait = async move {
            loop {
                let enough = {
                    let m = rx.borrow_and_update();
                    let mut n = 0;
                    if let Some(r) = &m.replication {
                        for (id, l) in r {
                            let got = if *id == me {
                                m.last_log_index.unwrap_or(0)
                            } else {
                                l.map_or(0, |l| l.index)
                            };
                            n += usize::from(got >= index);
                        }
                        if !r.contains_key(&me) && m.last_log_index.unwrap_or(0) >= index {
                            n += 1;
                        }
                    }
                    n >= w
                };
                if enough {
                    return true;
                }
                if rx.changed().await.is_err() {
                    return false;
                }
            }
        };
        self.runtime.block_on(async move {
            match timeout {
                Some(t) => tokio::time::timeout(t, wait).await.unwrap_or(false),
                None => wait.await,
            }
        })
    }

    /// Check this member still leads a majority (read concern
    /// `linearizable`). Blocking.
    pub fn ensure_linearizable(&self) -> Result<(), Error> {
        self.runtime
            .block_on(self.raft.ensure_linearizable())
            .map(|_| ())
            .map_err(|e| not_primary(format!("not primary: {e}")))
    }

    /// Drop database `db` on every member (a Raft entry); whether it
    /// existed here. Blocking.
    pub fn drop_database(&self, db: &str) -> Result<bool, Error> {
        let req = Request::DropDatabase { db: db.to_string() };
        let r = self.propose(req, "dropDatabase")?;
        Ok(matches!(r, Response::Dropped { existed: true }))
    }

    /// Propose `req` and wait (blocking) for this member's answer to it.
    fn propose(&self, req: Request, what: &str) -> Result<Response, Error> {
        if !self.is_writable_primary() {
            return Err(not_primary(format!(
                "not primary: {what} goes to the primary"
            )));
        }
        let raft = self.raft.clone();
        let timeout = self.opts.commit_timeout;
        let r = self
            .runtime
            .block_on(async move { tokio::time::timeout(timeout, raft.client_write(req)).await });
        match r {
            Ok(Ok(resp)) => Ok(resp.data),
            Ok(Err(e)) => Err(not_primary(format!("{what} failed: {e}"))),
            Err(_) => Err(Error::Coded {
                code: 64,
                name: "WriteConcernFailed",
                msg: format!("{what} was not committed within {timeout:?} (it may still be)"),
            }),
        }
    }

    /// Take named snapshot `name` of `db` on every member at one log
    /// position; its csn. Blocking.
    pub fn create_snapshot(
        &self,
        db: &str,
        name: &str,
        opts: duetdb::SnapshotOptions,
    ) -> Result<u64, Error> {
        let req = Request::CreateSnapshot {
            db: db.to_string(),
            name: name.to_string(),
            collections: opts.collections,
            ttl_secs: opts.ttl.map(|t| t.as_secs().max(1)),
            durable: opts.durable,
        };
        snapshot_result(self.propose(req, "createSnapshot")?)
    }

    /// Drop named snapshot `name` of `db` on every member. Blocking.
    pub fn drop_snapshot(&self, db: &str, name: &str) -> Result<(), Error> {
        let req = Request::DropSnapshot {
            db: db.to_string(),
            name: name.to_string(),
        };
        snapshot_result(self.propose(req, "dropSnapshot")?).map(|_| ())
    }

    /// `replSetStepDown`: stop accepting writes, let the other members
    /// elect a primary (this one stops sending heartbeats and will not stand
    /// for election for `step_down`), and wait up to `wait` for it.
    /// Blocking.
    pub fn step_down(&self, step_down: Duration, wait: Duration) -> Result<(), Error> {
        if self.status().role != Role::Primary {
            return Err(not_primary("not primary so can't step down"));
        }
        self.stepping_down.store(true, Ordering::Release);
        self.raft.runtime_config().elect(false);
        self.raft.runtime_config().heartbeat(false);
        let me = self.opts.member_id;
        // The follower holding the most of the log (all of it, unless
        // writes are in flight) is the one a vote can elect.
        let heir = {
            let m = self.raft.metrics().borrow().clone();
            m.replication.as_ref().and_then(|r| {
                r.iter()
                    .filter(|(id, _)| **id != me)
                    .max_by_key(|(_, l)| l.map_or(0, |l| l.index))
                    .and_then(|(id, _)| self.opts.members.get(*id as usize).cloned())
            })
        };
        let mut rx = self.raft.metrics();
        let moved = self.runtime.block_on(async move {
            if let Some(addr) = heir {
                if !crate::network::ask_to_step_up(&addr).await {
                    tracing::info!(member = %addr, "the chosen member did not stand for election; waiting for an election timeout");
                }
            }
            tokio::time::timeout(wait, async move {
                loop {
                    if rx.borrow_and_update().current_leader != Some(me) {
                        return;
                    }
                    if rx.changed().await.is_err() {
                        return;
                    }
                }
            })
            .await
            .is_ok()
        });
        self.raft.runtime_config().heartbeat(true);
        self.stepping_down.store(false, Ordering::Release);
        let raft = self.raft.clone();
        self.runtime.spawn(async move {
            tokio::time::sleep(step_down).await;
            raft.runtime_config().elect(true);
        });
        if moved {
            Ok(())
        } else {
            Err(Error::Coded {
                code: 262,
                name: "ExceededTimeLimit",
                msg: format!("no other member became primary within {wait:?}"),
            })
        }
    }

    /// Stop the Raft node (server shutdown).
    pub async fn shutdown(&self) {
        self.shared
            .pending
            .fail_all(|| not_primary("the member is shutting down"));
        let _ = tokio::time::timeout(Duration::from_secs(5), self.raft.shutdown()).await;
        if let Some(l) = self.listener.lock().take() {
            l.abort();
        }
        // The engine keeps this member as its replicator: its writes now
        // fail (not primary) rather than bypass the set.
    }
}

/// The engine's answer to a named-snapshot entry, as an error with its
/// MongoDB code (the names of the codes these commands can fail with).
fn snapshot_result(r: Response) -> Result<u64, Error> {
    match r {
        Response::Snapshot(Ok(csn)) => Ok(csn),
        Response::Snapshot(Err((code, msg))) => Err(Error::Coded {
            code,
            name: match code {
                2 => "BadValue",
                8 => "UnknownError",
                20 => "IllegalOperation",
                26 => "NamespaceNotFound",
                48 => "NamespaceExists",
                73 => "InvalidNamespace",
                246 => "SnapshotUnavailable",
                14031 => "OutOfDiskSpace",
                _ => "UnknownError",
            },
            msg,
        }),
        other => Err(Error::Internal(format!(
            "unexpected answer to a snapshot entry: {other:?}"
        ))),
    }
}
