//! One replica-set member: its Raft node, Raft RPC listener and the hook
//! that makes the engine's writers commit through the set; and what the
//! server asks of it (role, status, write-concern waits, step-down,
//! dropDatabase).
//!
//! `--members` is the seed list: member N is its N-th address (from 0), and
//! member 0 initializes the Raft group with that list when its Raft log is
//! empty (MongoDB's `rs.initiate()`); the others wait to hear from the
//! leader. Were every member to initialize, one started after the first
//! election would campaign at the leader's own term and depose it a few
//! seconds into the set's life (seen as NotWritablePrimary in the middle of
//! a write stream). From then on the set's configuration is the Raft
//! membership in force (in the Raft log and snapshots, the same on every
//! member): `replSetReconfig` changes it ([`Member::reconfig`]), and a
//! member's own `--members` only names its own address. Voters are the
//! members that may be primary; learners are hidden, non-voting analytics
//! members. The configuration's version is the log index of its membership
//! entry plus one (so it grows with every change, and every member agrees).
//!
//! A member removed from the set is told so by the primary (the Raft leader
//! stops replicating to it at once, so it would never learn it from the
//! log): it records the configuration version that removed it
//! (`repl.raft/removed`), stops standing for election and reports REMOVED
//! until a later configuration lists it again.
//!
//! The Raft leader is the primary, but it accepts writes only once it has
//! applied its own term's first entry (MongoDB's drain mode): before that,
//! entries committed under the previous leader may still be unapplied here,
//! and a group made on the older state would only be skipped.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use duetdb::{Engine, Error};
use openraft::error::{ClientWriteError, RaftError};
use openraft::{BasicNode, ChangeMembers, RaftMetrics, ServerState, SnapshotPolicy};

use crate::log_store::{claim_identity, write_atomic, LogStore, RAFT_DIR};
use crate::network::{raft_address, serve, Network, Transport};
use crate::pending::Pending;
use crate::replicator::{not_primary, write_error, Replicator};
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
/// An idle primary writes a no-op when nothing was written for this long
/// (`--repl-noop-interval-secs`; MongoDB's `periodicNoopIntervalSecs`, 10).
pub const DEFAULT_NOOP_INTERVAL: Duration = Duration::from_secs(10);
/// Most entries kept in the log below the last snapshot (a member that far
/// behind still catches up from the log; further behind, from a snapshot).
/// How long an `fsync` lock waits for a batch of applies already running.
const PAUSE_WAIT: Duration = Duration::from_secs(30);

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
/// How long `replSetReconfig` waits for a member it adds as a voter to
/// catch up (from the log or a Raft snapshot) before making it a voter,
/// when the command has no `maxTimeMS`. Past it the member stays a learner
/// (262 ExceededTimeLimit) and the reconfig can be run again.
pub const DEFAULT_RECONFIG_CATCH_UP: Duration = Duration::from_secs(120);

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
    /// The primary writes a no-op entry when it has applied no write for
    /// this long, so secondaries' `lastWrite` advance while idle (zero:
    /// never; [`DEFAULT_NOOP_INTERVAL`] in the server).
    pub noop_interval: Duration,
}

/// A member's role as MongoDB names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    Primary,
    Secondary,
    /// Campaigning in an election, or without a primary to follow.
    Startup,
    Shutdown,
    /// Not in the set's configuration: removed from it (or a configuration
    /// without it is all this member knows).
    Removed,
}

impl Role {
    /// `replSetGetStatus` `state` / `stateStr`.
    pub fn code_and_name(self) -> (i32, &'static str) {
        match self {
            Role::Primary => (1, "PRIMARY"),
            Role::Secondary => (2, "SECONDARY"),
            Role::Startup => (0, "STARTUP"),
            Role::Shutdown => (8, "DOWN"),
            Role::Removed => (10, "REMOVED"),
        }
    }
}

/// One member of the set's configuration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigMember {
    /// The member's Raft node id (`_id` in `replSetGetConfig`).
    pub id: NodeId,
    /// Its MongoDB wire address (`host:port`; Raft listens on port + 1000).
    pub host: String,
    /// A voter, which may be primary; otherwise a Raft learner: hidden,
    /// priority 0, no vote (an analytics member).
    pub voter: bool,
}

/// What `hello` and `replSetGetStatus` report.
#[derive(Debug, Clone)]
pub struct Status {
    pub set_name: String,
    pub me: NodeId,
    /// The configuration in force: its version (0: none yet) and members,
    /// by id.
    pub version: u64,
    pub members: Vec<ConfigMember>,
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
    /// Idle no-op entries this process applied.
    pub noops_applied: u64,
}

impl Status {
    pub fn address(&self, id: NodeId) -> Option<&str> {
        self.member(id).map(|m| m.host.as_str())
    }

    pub fn member(&self, id: NodeId) -> Option<&ConfigMember> {
        self.members.iter().find(|m| m.id == id)
    }

    /// Whether this member is in the configuration (neither removed nor
    /// waiting to be added).
    pub fn in_config(&self) -> bool {
        !matches!(self.role, Role::Removed) && self.member(self.me).is_some()
    }

    /// Whether this member is a learner (hidden, never primary).
    pub fn hidden(&self) -> bool {
        self.member(self.me).is_some_and(|m| !m.voter)
    }

    pub fn voters(&self) -> usize {
        self.members.iter().filter(|m| m.voter).count()
    }
}

/// The configuration version and members of a Raft membership.
fn config_of(m: &RaftMetrics<NodeId, BasicNode>) -> (u64, Vec<ConfigMember>) {
    let mc = &m.membership_config;
    let voters: BTreeSet<NodeId> = mc.voter_ids().collect();
    let members = mc
        .nodes()
        .map(|(id, n)| ConfigMember {
            id: *id,
            host: n.addr.clone(),
            voter: voters.contains(id),
        })
        .collect();
    (mc.log_id().map_or(0, |l| l.index + 1), members)
}

/// What a reconfig does to the membership (see [`plan`]).
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Plan {
    /// Members to add as learners first (new voters among them).
    pub add: Vec<ConfigMember>,
    /// A voter being added, which must catch up before it votes.
    pub new_voter: Option<NodeId>,
    /// The new voter set, when it changes; with whether a voter leaving it
    /// stays as a learner.
    pub voters: Option<(BTreeSet<NodeId>, bool)>,
    /// Learners to remove.
    pub remove_learners: BTreeSet<NodeId>,
    /// Members leaving the set (told so afterwards), by address.
    pub leaving: Vec<String>,
}

fn incompatible(msg: impl Into<String>) -> Error {
    Error::Coded {
        code: 103,
        name: "NewReplicaSetConfigurationIncompatible",
        msg: msg.into(),
    }
}

fn invalid(msg: impl Into<String>) -> Error {
    Error::Coded {
        code: 93,
        name: "InvalidReplicaSetConfig",
        msg: msg.into(),
    }
}

/// The steps from configuration `current` to `want` on primary `me`, or why
/// the change is refused: ids and hosts unique (93 InvalidReplicaSetConfig);
/// a member keeps its host, the primary stays a voter, and at most one
/// voter is added or removed (MongoDB's safe reconfig; 103
/// NewReplicaSetConfigurationIncompatible).
pub fn plan(current: &[ConfigMember], want: &[ConfigMember], me: NodeId) -> Result<Plan, Error> {
    for (i, w) in want.iter().enumerate() {
        crate::network::raft_address(&w.host).map_err(invalid)?;
        if want[..i].iter().any(|o| o.id == w.id) {
            return Err(invalid(format!("member _id {} appears twice", w.id)));
        }
        if want[..i].iter().any(|o| o.host == w.host) {
            return Err(invalid(format!("host {} appears twice", w.host)));
        }
        if let Some(c) = current.iter().find(|c| c.id == w.id) {
            if c.host != w.host {
                return Err(incompatible(format!(
                    "member {} is {}, not {}: changing a member's host is not supported                      (remove the member, then add the new host with a new _id)",
                    w.id, c.host, w.host
                )));
            }
        } else if let Some(c) = current.iter().find(|c| c.host == w.host) {
            return Err(incompatible(format!(
                "{} is member {} of the set, not {}",
                w.host, c.id, w.id
            )));
        }
    }
    if !want.iter().any(|w| w.id == me && w.voter) {
        return Err(incompatible(format!(
            "this primary (member {me}) must stay a voting member: step it down              (replSetStepDown) and reconfigure on the new primary"
        )));
    }
    let voters = |c: &[ConfigMember]| -> BTreeSet<NodeId> {
        c.iter().filter(|m| m.voter).map(|m| m.id).collect()
    };
    let (old_voters, new_voters) = (voters(current), voters(want));
    let added: Vec<NodeId> = new_voters.difference(&old_voters).copied().collect();
    let removed: Vec<NodeId> = old_voters.difference(&new_voters).copied().collect();
    if added.len() + removed.len() > 1 {
        return Err(incompatible(
            "Non force replica set reconfig can only add or remove at most 1 voting member",
        ));
    }
    let mut p = Plan {
        add: want
            .iter()
            .filter(|w| !current.iter().any(|c| c.id == w.id))
            .cloned()
            .collect(),
        new_voter: added.first().copied(),
        ..Plan::default()
    };
    if added.len() + removed.len() == 1 {
        let retain = removed
            .first()
            .is_some_and(|r| want.iter().any(|w| w.id == *r));
        p.voters = Some((new_voters, retain));
    }
    for c in current {
        if want.iter().any(|w| w.id == c.id) {
            continue;
        }
        if !c.voter {
            p.remove_learners.insert(c.id);
        }
        p.leaving.push(c.host.clone());
    }
    Ok(p)
}

/// How a test harness starts a member instead of production's defaults
/// ([`Member::start_with`]).
#[derive(Clone, Default)]
pub struct Harness {
    /// How Raft RPCs travel (TCP by default; `Transport::Sim` binds no port).
    pub transport: Transport,
    /// This member's election timeout range in ms, instead of
    /// [`ELECTION_TIMEOUT_MS`] (openraft draws each timeout from it with a
    /// thread-local RNG: a range of width 1 makes it one fixed value).
    pub election_timeout_ms: Option<(u64, u64)>,
    /// Called with `true` before and `false` after the member's own
    /// blocking work that waits on the runtime's timers (an idle no-op's
    /// proposal and commit wait, on a blocking thread): a simulation whose
    /// paused clock does not advance while a blocking task runs paces it
    /// meanwhile, as it does around its clients' operations.
    pub blocking: Option<Arc<dyn Fn(bool) + Send + Sync>>,
}

/// A running member (see the module documentation).
pub struct Member {
    pub(crate) raft: Raft,
    pub(crate) shared: Arc<Shared>,
    pub(crate) runtime: tokio::runtime::Handle,
    opts: Options,
    /// Set by `replSetStepDown` until another member leads.
    stepping_down: AtomicBool,
    /// The Raft RPC listener's task and the removal watcher (aborted at
    /// shutdown, freeing the port).
    listener: parking_lot::Mutex<Vec<tokio::task::JoinHandle<()>>>,
    /// Held by the one `replSetReconfig` under way.
    reconfiguring: parking_lot::Mutex<()>,
}

impl Member {
    /// Start member `opts.member_id` on `engine` (whose databases it then
    /// replicates): check the data directory belongs to it, open its Raft
    /// log, listen for Raft RPCs, join the group. Requires: a tokio
    /// multi-thread runtime is current.
    pub async fn start(opts: Options, engine: &Arc<Engine>) -> Result<Arc<Member>, String> {
        Member::start_with(opts, engine, Harness::default()).await
    }

    /// [`Member::start`] with a test harness's transport and timeouts.
    /// Requires: a tokio runtime is current (multi-thread for the TCP
    /// transport; the simulation drives a current-thread one).
    pub async fn start_with(
        opts: Options,
        engine: &Arc<Engine>,
        harness: Harness,
    ) -> Result<Arc<Member>, String> {
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
        let mut identity = claim_identity(&dir, &opts.set_name, me)?;
        identity.address = my_addr.clone();
        let identity = Arc::new(identity);
        let log = LogStore::open(&dir)?;
        let shared = Arc::new(Shared {
            engine: Arc::downgrade(engine),
            me,
            incarnation: rand::random(),
            pending: Pending::default(),
            own_times: Default::default(),
            history: Default::default(),
            next_token: AtomicU64::new(0),
            retries: crate::retries::Retries::open(&dir)?,
            applied_index: AtomicU64::new(0),
            last_write_ts: AtomicU64::new(0),
            last_write_wall_ms: AtomicU64::new(0),
            snapshots: Default::default(),
            snapshots_built: AtomicU64::new(0),
            snapshots_installed: AtomicU64::new(0),
            noops_applied: AtomicU64::new(0),
            removed: AtomicU64::new(read_removed(&dir)),
            dir: dir.clone(),
            identity: identity.clone(),
            transport: harness.transport.clone(),
            apply_paused: tokio::sync::watch::Sender::new(false),
            apply_busy: tokio::sync::watch::Sender::new(false),
        });
        let sm = StateMachine::open(dir, shared.clone())?;
        let config = openraft::Config {
            cluster_name: opts.set_name.clone(),
            heartbeat_interval: HEARTBEAT_MS,
            election_timeout_min: harness.election_timeout_ms.unwrap_or(ELECTION_TIMEOUT_MS).0,
            election_timeout_max: harness.election_timeout_ms.unwrap_or(ELECTION_TIMEOUT_MS).1,
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
        let listener = match &harness.transport {
            Transport::Tcp => Some(
                tokio::net::TcpListener::bind(&raft_addr)
                    .await
                    .map_err(|e| format!("cannot listen for Raft on {raft_addr}: {e}"))?,
            ),
            Transport::Sim(_) => None,
        };
        let network = Network {
            identity: identity.clone(),
            transport: harness.transport.clone(),
        };
        let raft = Raft::new(me, Arc::new(config), network, log, sm)
            .await
            .map_err(|e| format!("cannot start Raft: {e}"))?;
        if shared.removed.load(Ordering::Acquire) != 0 {
            raft.runtime_config().elect(false);
        }
        let mut tasks = vec![tokio::spawn(watch_readmission(
            raft.clone(),
            shared.clone(),
        ))];
        match (listener, &harness.transport) {
            (Some(l), _) => tasks.push(tokio::spawn(serve(l, raft.clone(), shared.clone()))),
            (None, Transport::Sim(net)) => net.attach(&my_addr, raft.clone(), shared.clone()),
            (None, Transport::Tcp) => {}
        }
        let initialized = raft
            .is_initialized()
            .await
            .map_err(|e| format!("Raft: {e}"))?;
        if !initialized && me == 0 {
            if identity.set_id().is_none() {
                identity
                    .adopt(rand::random())
                    .map_err(|e| format!("cannot record the replica set's id: {e}"))?;
            }
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
            listener: parking_lot::Mutex::new(tasks),
            reconfiguring: parking_lot::Mutex::new(()),
        });
        if !member.opts.noop_interval.is_zero() {
            let task = tokio::spawn(idle_noops(
                Arc::downgrade(&member),
                member.opts.noop_interval,
                harness.blocking.clone(),
            ));
            member.listener.lock().push(task);
        }
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

    /// The set's id (MongoDB's `settings.replicaSetId`), once known here.
    pub fn set_id(&self) -> Option<[u8; 12]> {
        self.shared.identity.set_id()
    }

    pub fn member_id(&self) -> NodeId {
        self.opts.member_id
    }

    pub fn status(&self) -> Status {
        let m = self.raft.metrics().borrow().clone();
        let me = self.opts.member_id;
        let (version, members) = config_of(&m);
        let removed_at = self.shared.removed.load(Ordering::Acquire);
        let removed = (removed_at != 0 && version < removed_at)
            || (!members.is_empty() && !members.iter().any(|c| c.id == me));
        let applied = m
            .last_applied
            .map_or((0, 0), |l| (l.leader_id.term, l.index));
        let drained = applied.0 == m.current_term;
        let role = match m.state {
            ServerState::Shutdown => Role::Shutdown,
            _ if removed => Role::Removed,
            ServerState::Leader => Role::Primary,
            ServerState::Follower | ServerState::Learner if m.current_leader.is_some() => {
                Role::Secondary
            }
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
            version,
            members,
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
            noops_applied: self.shared.noops_applied.load(Ordering::Relaxed),
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

    /// Pause (`true`) or resume applying committed entries: the server's
    /// `fsync` lock, under which MongoDB's secondaries stop applying their
    /// oplog too. A paused member keeps receiving the log and answering
    /// `hello`; its applied position and `lastWrite` stay where they were.
    ///
    /// A pause returns once no batch is being applied (a batch that started
    /// before it finishes first, at most `PAUSE_WAIT`; past that it warns
    /// and returns). Requires: called from a thread outside the runtime.
    pub fn pause_applies(&self, paused: bool) {
        self.shared.apply_paused.send_replace(paused);
        if !paused {
            return;
        }
        let mut busy = self.shared.apply_busy.subscribe();
        let idle = self.runtime.block_on(async move {
            tokio::time::timeout(PAUSE_WAIT, busy.wait_for(|b| !*b))
                .await
                .is_ok()
        });
        if !idle {
            tracing::warn!("fsync lock: a batch of applies still running after {PAUSE_WAIT:?}");
        }
    }

    /// What the commands of client operation `origin` did, in the order the
    /// set applied them (`duetdb::WriteOutcome`, encoded; an empty one:
    /// nothing recorded), or `None` when the set did not apply it here.
    pub fn retry_outcomes(&self, origin: &[u8]) -> Option<Vec<Vec<u8>>> {
        self.shared.retries.outcomes(origin)
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

    /// The state of database `db` just after its group of cluster time
    /// `ts`, if this member still holds it (`history.rs`): read concern
    /// `snapshot` at an `atClusterTime` this member did not issue.
    pub fn state_at(&self, db: &str, ts: u64) -> Option<duetdb::Snapshot> {
        self.shared.history.state_at(db, ts)
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

    /// Wait (blocking) until `w` members, this one included, have applied
    /// the log up to `index` — MongoDB's `w: N`, which counts members that
    /// applied the write, not members whose Raft log holds it — at most
    /// `timeout` (`None`: no limit). The others are asked in parallel over the Raft port
    /// (`RpcRequest::Applied`); each answers once it has applied it. This
    /// member counts once its own applied index reaches `index`. Requires:
    /// called from a thread outside the runtime.
    pub fn wait_for_applied(&self, index: u64, w: usize, timeout: Option<Duration>) -> bool {
        let status = self.status();
        let others: Vec<String> = status
            .members
            .iter()
            .filter(|m| m.id != status.me)
            .map(|m| m.host.clone())
            .collect();
        let in_set = status.members.iter().any(|m| m.id == status.me);
        let (identity, transport) = (self.shared.identity.clone(), self.shared.transport.clone());
        let shared = self.shared.clone();
        // Without a time limit, ask again every round until enough answer.
        let round = timeout.unwrap_or(Duration::from_secs(10));
        let deadline = timeout.map(|t| std::time::Instant::now() + t);
        self.runtime.block_on(async move {
            loop {
                let wait = match deadline {
                    Some(d) => d.saturating_duration_since(std::time::Instant::now()),
                    None => round,
                };
                let mut asks = tokio::task::JoinSet::new();
                for host in &others {
                    let (identity, transport, host) =
                        (identity.clone(), transport.clone(), host.clone());
                    asks.spawn(async move {
                        crate::network::ask_applied(&identity, &transport, &host, index, wait).await
                    });
                }
                if in_set {
                    let shared = shared.clone();
                    let ms = wait.as_millis().min(u128::from(u64::MAX)) as u64;
                    asks.spawn(
                        async move { crate::network::applied_here(&shared, index, ms).await },
                    );
                }
                let mut n = 0;
                let mut pending = asks.len();
                while let Some(done) = asks.join_next().await {
                    pending -= 1;
                    n += usize::from(matches!(done, Ok(true)));
                    if n >= w {
                        return true;
                    }
                    if n + pending < w {
                        break;
                    }
                }
                if deadline.is_some_and(|d| std::time::Instant::now() >= d) {
                    return false;
                }
                // Some member could not answer (unreachable, restarting):
                // ask again until the limit.
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        })
    }

    /// The other members' digests of collection `coll` of named snapshot
    /// `name` of `db` (`digest.rs`), asked in parallel over the Raft port:
    /// each member of the configuration in force but this one, by wire
    /// address, with its digest or why it has none (unreachable, not there
    /// yet after `wait`, no such snapshot, no answer within `limit`). A
    /// member answers once it has applied the log as far as this one has
    /// (waiting at most `wait`). Returns as soon as `enough` digests equal
    /// to `mine` arrived (the rest are then "not waited for"), every member
    /// answered, or `limit` passed. Blocking.
    pub fn member_digests(
        &self,
        (db, name, coll): (&str, &str, &str),
        mine: &crate::digest::Digest,
        enough: usize,
        wait: Duration,
        limit: Duration,
    ) -> Vec<(String, Result<crate::digest::Digest, String>)> {
        let status = self.status();
        let applied = self.applied_index();
        let others: Vec<String> = status
            .members
            .iter()
            .filter(|m| m.id != status.me)
            .map(|m| m.host.clone())
            .collect();
        let (identity, transport) = (self.shared.identity.clone(), self.shared.transport.clone());
        let (db, name, coll) = (db.to_string(), name.to_string(), coll.to_string());
        let mine = mine.clone();
        self.runtime.block_on(async move {
            let mut asks = tokio::task::JoinSet::new();
            for (i, host) in others.iter().enumerate() {
                let (identity, transport, host) =
                    (identity.clone(), transport.clone(), host.clone());
                let (db, name, coll) = (db.clone(), name.clone(), coll.clone());
                asks.spawn(async move {
                    let r = crate::network::ask_digest(
                        &identity,
                        &transport,
                        &host,
                        (&db, &name, &coll),
                        applied,
                        wait,
                    )
                    .await;
                    (i, r)
                });
            }
            let mut out: Vec<(String, Result<crate::digest::Digest, String>)> = others
                .iter()
                .map(|h| (h.clone(), Err(format!("no answer within {limit:?}"))))
                .collect();
            let mut agree = 0;
            let collect = async {
                while let Some(done) = asks.join_next().await {
                    if let Ok((i, r)) = done {
                        agree += usize::from(r.as_ref().is_ok_and(|d| *d == mine));
                        if let Some(slot) = out.get_mut(i) {
                            slot.1 = r;
                        }
                    }
                    if agree >= enough {
                        for slot in out.iter_mut().filter(|s| s.1.is_err()) {
                            slot.1 = Err("not waited for".into());
                        }
                        return;
                    }
                }
            };
            let _ = tokio::time::timeout(limit, collect).await;
            // Dropping the set cancels the asks still running.
            drop(asks);
            out
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
    ///
    /// The drop's cluster time is taken here, on the primary, under the
    /// clock's order (as a writer group's is) and carried in the entry, so
    /// every member drops at that time and a secondary that applied the drop
    /// has reached it (a read with `afterClusterTime` = this reply's
    /// `operationTime` is served there without waiting for a later write).
    pub fn drop_database(&self, db: &str) -> Result<bool, Error> {
        let answer = self.propose_timed("dropDatabase", |ts, wall_ms, origin| {
            Request::DropDatabaseAt {
                db: db.to_string(),
                ts,
                wall_ms,
                origin,
            }
        });
        Ok(matches!(answer?, Response::Dropped { existed: true }))
    }

    /// Write an idle primary's no-op entry (`Request::Noop`), at a cluster
    /// time taken as `dropDatabase` takes its. Blocking.
    pub fn write_noop(&self) -> Result<(), Error> {
        self.propose_timed("a no-op", |ts, wall_ms, origin| Request::Noop {
            ts,
            wall_ms,
            origin,
        })
        .map(|_| ())
    }

    /// Propose the entry `make` builds from a cluster time taken here, on
    /// the primary, under the clock's order (so the log stays in time
    /// order), and wait for this member's answer to it. The time stays in
    /// flight until the apply (or, if the entry never applies here, this
    /// call) finishes it. Blocking.
    fn propose_timed(
        &self,
        what: &str,
        make: impl FnOnce(u64, i64, crate::types::Origin) -> Request,
    ) -> Result<Response, Error> {
        if !self.is_writable_primary() {
            return Err(not_primary(format!(
                "not primary: {what} goes to the primary"
            )));
        }
        let engine = self
            .shared
            .engine
            .upgrade()
            .ok_or_else(|| not_primary("the server is shutting down"))?;
        let token = self.shared.next_token.fetch_add(1, Ordering::Relaxed) + 1;
        let (ts, queued) = engine.ordered_time(|ts, wall_ms| {
            self.shared.own_times.lock().insert(token);
            let req = make(
                ts,
                wall_ms,
                crate::types::Origin {
                    member: self.shared.me,
                    incarnation: self.shared.incarnation,
                    token,
                },
            );
            (ts, self.runtime.block_on(self.raft.client_write_ff(req)))
        });
        let timeout = self.opts.commit_timeout;
        let answer = match queued {
            Err(fatal) => Err(write_error(RaftError::Fatal(fatal))),
            Ok(rx) => match self
                .runtime
                .block_on(async move { tokio::time::timeout(timeout, rx).await })
            {
                Ok(Ok(Ok(resp))) => Ok(resp.data),
                Ok(Ok(Err(e))) => Err(write_error(RaftError::APIError(e))),
                Ok(Err(_)) => Err(Error::Coded {
                    code: 91,
                    name: "ShutdownInProgress",
                    msg: format!("the replica-set member stopped before {what} committed"),
                }),
                Err(_) => Err(Error::Coded {
                    code: 64,
                    name: "WriteConcernFailed",
                    msg: format!("{what} was not committed within {timeout:?} (it may still be)"),
                }),
            },
        };
        if answer.is_err() {
            // Not applied here (yet): if the entry still commits, its apply
            // adopts the time again — after this finished it, since both
            // hold `own_times` (`Shared::take_time`).
            let mut own = self.shared.own_times.lock();
            if own.remove(&token) {
                engine.abandon_time(ts);
            }
        }
        answer
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
    /// position, created at this primary's wall-clock time (the same
    /// `created` and TTL expiry everywhere); its csn. Blocking.
    pub fn create_snapshot(
        &self,
        db: &str,
        name: &str,
        opts: duetdb::SnapshotOptions,
    ) -> Result<u64, Error> {
        let created_ms = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis().min(u128::from(u64::MAX)) as u64);
        let req = Request::CreateSnapshotAt {
            db: db.to_string(),
            name: name.to_string(),
            collections: opts.collections,
            ttl_secs: opts.ttl.map(|t| t.as_secs().max(1)),
            durable: opts.durable,
            created_ms,
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
            let voters: BTreeSet<NodeId> = m.membership_config.voter_ids().collect();
            m.replication.as_ref().and_then(|r| {
                r.iter()
                    .filter(|(id, _)| **id != me && voters.contains(id))
                    .max_by_key(|(_, l)| l.map_or(0, |l| l.index))
                    .and_then(|(id, _)| m.membership_config.nodes().find(|(n, _)| *n == id))
                    .map(|(_, n)| n.addr.clone())
            })
        };
        let mut rx = self.raft.metrics();
        let moved = self.runtime.block_on(async move {
            if let Some(addr) = heir {
                if !crate::network::ask_to_step_up(
                    &self.shared.identity,
                    &self.shared.transport,
                    &addr,
                ).await {
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

    /// `replSetReconfig`: make the set's configuration `want`, whose version
    /// must be above the current one (103). New members are added as Raft
    /// learners (they catch up from the log or a Raft snapshot); a new voter
    /// then waits up to `catch_up` to hold the log before the joint-consensus
    /// change that makes it vote (262 ExceededTimeLimit past it: it stays a
    /// learner); removed members are told so. Primary only (10107); one at a
    /// time (109 ConfigurationInProgress). Blocking.
    pub fn reconfig(
        &self,
        version: u64,
        want: &[ConfigMember],
        catch_up: Duration,
    ) -> Result<(), Error> {
        let Some(_one) = self.reconfiguring.try_lock() else {
            return Err(Error::Coded {
                code: 109,
                name: "ConfigurationInProgress",
                msg: "another replSetReconfig is under way".into(),
            });
        };
        let s = self.status();
        if !s.writable {
            return Err(not_primary("replSetReconfig runs on the primary"));
        }
        if version <= s.version {
            return Err(incompatible(format!(
                "New config is rejected as it is not newer than the current config: its \
                 version {version} is not above {}",
                s.version
            )));
        }
        let plan = plan(&s.members, want, s.me)?;
        let timeout = self.opts.commit_timeout;
        let raft = &self.raft;
        let step = |what: &str,
                    r: Result<
            Result<_, RaftError<NodeId, ClientWriteError<NodeId, BasicNode>>>,
            _,
        >| match r {
            Ok(Ok(_)) => Ok(()),
            Ok(Err(RaftError::APIError(ClientWriteError::ChangeMembershipError(e)))) => {
                Err(Error::Coded {
                    code: 109,
                    name: "ConfigurationInProgress",
                    msg: format!("{what}: {e}"),
                })
            }
            Ok(Err(e)) => Err(write_error(e)),
            Err(_) => Err(Error::Coded {
                code: 64,
                name: "WriteConcernFailed",
                msg: format!("{what} was not committed within {timeout:?} (it may still be)"),
            }),
        };
        for a in &plan.add {
            let r = self.runtime.block_on(tokio::time::timeout(
                timeout,
                raft.add_learner(a.id, BasicNode::new(&a.host), false),
            ));
            step(&format!("adding member {} ({})", a.id, a.host), r)?;
            tracing::info!(member = a.id, host = %a.host, "replica set: member added as a learner");
        }
        if let Some(id) = plan.new_voter {
            if !self.wait_caught_up(id, catch_up) {
                return Err(Error::Coded {
                    code: 262,
                    name: "ExceededTimeLimit",
                    msg: format!(
                        "member {id} did not catch up within {catch_up:?}: it stays a \
                         non-voting member; run the reconfig again once it has"
                    ),
                });
            }
        }
        if let Some((voters, retain)) = plan.voters.clone() {
            let r = self.runtime.block_on(tokio::time::timeout(
                timeout * 2,
                raft.change_membership(ChangeMembers::ReplaceAllVoters(voters), retain),
            ));
            step("changing the voting members", r)?;
        }
        if !plan.remove_learners.is_empty() {
            let r = self.runtime.block_on(tokio::time::timeout(
                timeout,
                raft.change_membership(
                    ChangeMembers::RemoveNodes(plan.remove_learners.clone()),
                    false,
                ),
            ));
            step("removing non-voting members", r)?;
        }
        let version = self.status().version;
        for host in &plan.leaving {
            let told = self.runtime.block_on(crate::network::tell_removed(
                &self.shared.identity,
                &self.shared.transport,
                host,
                version,
            ));
            tracing::info!(%host, told, "replica set: member removed");
        }
        Ok(())
    }

    /// Wait until learner `id` holds this leader's log as of now (what it
    /// needs before it can vote without slowing commits), at most `limit`.
    fn wait_caught_up(&self, id: NodeId, limit: Duration) -> bool {
        let target = self.last_log_index();
        let mut rx = self.raft.metrics();
        self.runtime.block_on(async move {
            tokio::time::timeout(limit, async move {
                loop {
                    let got = rx
                        .borrow_and_update()
                        .replication
                        .as_ref()
                        .and_then(|r| r.get(&id).copied().flatten())
                        .map_or(0, |l| l.index);
                    if got >= target {
                        return true;
                    }
                    if rx.changed().await.is_err() {
                        return false;
                    }
                }
            })
            .await
            .unwrap_or(false)
        })
    }

    /// Stop the Raft node (server shutdown).
    pub async fn shutdown(&self) {
        self.shared
            .pending
            .fail_all(|| not_primary("the member is shutting down"));
        let _ = tokio::time::timeout(Duration::from_secs(5), self.raft.shutdown()).await;
        for task in self.listener.lock().drain(..) {
            task.abort();
        }
        if let Transport::Sim(net) = &self.shared.transport {
            net.detach(&self.shared.identity.address, &self.shared);
        }
        // The engine keeps this member as its replicator: its writes now
        // fail (not primary) rather than bypass the set.
    }
}

/// MongoDB's periodic no-op writer: while this member is the writable
/// primary and has applied no write (group, drop or no-op) for `every`, it
/// writes a no-op entry, so secondaries' `lastWrite` (and `optime`) advance
/// with the primary's clock although nothing is written. Ends with the
/// member (aborted at shutdown).
async fn idle_noops(
    member: std::sync::Weak<Member>,
    every: Duration,
    blocking: Option<Arc<dyn Fn(bool) + Send + Sync>>,
) {
    // Checked twice per interval: a no-op follows `every` to `1.5 every`
    // of idleness.
    let mut tick = tokio::time::interval((every / 2).max(Duration::from_millis(1)));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let Some(m) = member.upgrade() else {
            return;
        };
        let now_ms = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64);
        let last_ms = m.shared.last_write_wall_ms.load(Ordering::Relaxed);
        if now_ms.saturating_sub(last_ms) < every.as_millis() as u64 || !m.is_writable_primary() {
            continue;
        }
        if let Some(f) = &blocking {
            f(true);
        }
        let written = tokio::task::spawn_blocking(move || m.write_noop()).await;
        if let Some(f) = &blocking {
            f(false);
        }
        match written {
            Ok(Ok(())) => {}
            Ok(Err(e)) => tracing::debug!(error = %e, "idle no-op not written"),
            Err(e) => tracing::debug!(error = %e, "idle no-op task failed"),
        }
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

/// The configuration version recorded as having removed this member (0:
/// none).
fn read_removed(dir: &Path) -> u64 {
    std::fs::read_to_string(dir.join("removed"))
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(0)
}

/// The primary told this member that configuration `version` removed it:
/// remember it (durably, so a restart does not campaign again) and stop
/// standing for election.
pub(crate) fn mark_removed(raft: &Raft, shared: &Shared, version: u64) {
    let version = version.max(1);
    if let Err(e) = write_atomic(&shared.dir, "removed", format!("{version}\n").as_bytes()) {
        tracing::warn!(error = %e, "cannot record this member's removal");
    }
    shared.removed.store(version, Ordering::Release);
    raft.runtime_config().elect(false);
    tracing::warn!(version, "this member was removed from the replica set");
}

/// Once a configuration at or past the one that removed this member lists
/// it again (it was added back), it is a member again: forget the removal.
async fn watch_readmission(raft: Raft, shared: Arc<Shared>) {
    let mut rx = raft.metrics();
    loop {
        let at = shared.removed.load(Ordering::Acquire);
        if at != 0 {
            let (version, members) = config_of(&rx.borrow_and_update());
            if version >= at && members.iter().any(|c| c.id == shared.me) {
                let _ = std::fs::remove_file(shared.dir.join("removed"));
                shared.removed.store(0, Ordering::Release);
                raft.runtime_config().elect(true);
                tracing::info!(version, "this member is in the replica set again");
            }
        }
        if rx.changed().await.is_err() {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn m(id: NodeId, voter: bool) -> ConfigMember {
        ConfigMember {
            id,
            host: format!("127.0.0.1:{}", 20000 + id),
            voter,
        }
    }

    fn code(r: Result<Plan, Error>) -> i32 {
        match r {
            Err(Error::Coded { code, .. }) => code,
            other => panic!("not refused with a code: {other:?}"),
        }
    }

    #[test]
    fn a_plan_adds_or_removes_one_voter_at_a_time() {
        let three = [m(0, true), m(1, true), m(2, true)];
        let p = plan(&three, &[m(0, true), m(1, true), m(2, true), m(3, true)], 0).expect("add");
        assert_eq!(p.add, vec![m(3, true)]);
        assert_eq!(p.new_voter, Some(3));
        assert_eq!(p.voters, Some(([0, 1, 2, 3].into(), false)));
        let p = plan(&three, &[m(0, true), m(2, true)], 0).expect("remove");
        assert_eq!(p.voters, Some(([0, 2].into(), false)));
        assert_eq!(p.leaving, vec![m(1, true).host]);
        // A voter made a learner stays (retain), and is not leaving.
        let p = plan(&three, &[m(0, true), m(1, true), m(2, false)], 0).expect("demote");
        assert_eq!(p.voters, Some(([0, 1].into(), true)));
        assert!(p.leaving.is_empty() && p.add.is_empty());
        // A learner added or removed changes no voter.
        let four = [m(0, true), m(1, true), m(2, true), m(3, false)];
        let p = plan(&three, &four, 0).expect("learner");
        assert_eq!((p.add.len(), p.new_voter, p.voters), (1, None, None));
        let p = plan(&four, &three, 0).expect("learner removed");
        assert_eq!(p.remove_learners, [3].into());
        assert_eq!(p.voters, None);
        assert_eq!(plan(&three, &three, 0).expect("same"), Plan::default());
    }

    #[test]
    fn a_plan_refuses_what_mongodb_refuses() {
        let three = [m(0, true), m(1, true), m(2, true)];
        // Two voters at once.
        assert_eq!(code(plan(&three, &[m(0, true)], 0)), 103);
        let five = [m(0, true), m(1, true), m(2, true), m(3, true), m(4, true)];
        assert_eq!(code(plan(&three, &five, 0)), 103);
        // The primary leaving, or no longer a voter.
        assert_eq!(code(plan(&three, &[m(1, true), m(2, true)], 0)), 103);
        assert_eq!(
            code(plan(&three, &[m(0, false), m(1, true), m(2, true)], 0)),
            103
        );
        // A member's host changed, or a host under another id.
        let mut moved = three.to_vec();
        moved[1].host = "127.0.0.1:30001".into();
        assert_eq!(code(plan(&three, &moved, 0)), 103);
        let mut reused = three.to_vec();
        reused.push(ConfigMember {
            id: 7,
            ..m(2, false)
        });
        assert_eq!(code(plan(&three, &reused, 0)), 93);
        let renumbered = [
            m(0, true),
            m(1, true),
            ConfigMember {
                id: 7,
                ..m(2, true)
            },
        ];
        assert_eq!(code(plan(&three, &renumbered, 0)), 103);
        // Duplicate ids; an address that is not host:port.
        let mut twice = three.to_vec();
        twice.push(ConfigMember {
            host: "127.0.0.1:30009".into(),
            ..m(2, true)
        });
        assert_eq!(code(plan(&three, &twice, 0)), 93);
        let bad = [
            m(0, true),
            m(1, true),
            m(2, true),
            ConfigMember {
                host: "nohost".into(),
                ..m(3, false)
            },
        ];
        assert_eq!(code(plan(&three, &bad, 0)), 93);
    }
}
