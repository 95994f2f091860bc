//! What all connections of one server share: the engine, configuration,
//! counters for `serverStatus`, open cursors, the budget of incomplete
//! messages, held snapshots, the session table (transactions and retryable
//! writes) and the operations in flight.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use duetdb::Engine;

use crate::cursor::{CursorLimits, CursorRegistry};
use crate::ops::OpRegistry;
use crate::sessions::SessionTable;
use crate::snapshots::SnapshotRegistry;
use crate::wire::MessageBudget;

/// The replica-set name `hello` reports unless `--standalone` is given.
pub const DEFAULT_REPLICA_SET: &str = "duet";
/// Connection slots kept for loopback peers beyond `max_connections`.
pub const DEFAULT_ADMIN_CONNECTIONS: usize = 10;
/// Idle connections are closed after this (MongoDB has no such timeout; we
/// close them so idle sockets cannot hold every slot; drivers reconnect
/// transparently). As long as `logicalSessionTimeoutMinutes`.
pub const DEFAULT_IDLE_TIMEOUT: Duration = Duration::from_secs(30 * 60);
/// Bytes of incomplete messages held across all connections.
pub const DEFAULT_MAX_INCOMPLETE_MESSAGE_BYTES: usize = 256 * 1024 * 1024;
/// Open cursors in the whole server.
pub const DEFAULT_MAX_CURSORS: usize = 10_000;
/// Bytes all open cursors may hold.
pub const DEFAULT_MAX_CURSOR_BYTES: usize = 1024 * 1024 * 1024;

/// Server configuration (the `duet serve` flags).
#[derive(Debug, Clone)]
pub struct Config {
    pub bind: String,
    pub port: u16,
    /// `None` = in memory (tests); `Some` = the data directory.
    pub data_dir: Option<PathBuf>,
    /// Connections served at once; more are refused with a clear error.
    pub max_connections: usize,
    /// Extra connection slots beyond `max_connections`, for loopback peers
    /// only: the administrator can still get in when remote or other clients
    /// hold every ordinary slot.
    pub admin_connections: usize,
    /// Once a message has started arriving, its remainder must arrive within this.
    pub message_timeout: Duration,
    /// A connection with no message in flight for this long is closed.
    pub idle_timeout: Duration,
    /// Bytes of messages still arriving, across all connections (beyond each
    /// message's first [`crate::wire::UNCHARGED_MESSAGE_BYTES`]); a message
    /// that would pass it closes its connection.
    pub max_incomplete_message_bytes: usize,
    /// Cursors idle longer than this are closed (MongoDB's default: 10 minutes).
    pub cursor_idle_timeout: Duration,
    /// Open cursors one connection may hold.
    pub cursors_per_connection: usize,
    /// Open cursors in the whole server.
    pub max_cursors: usize,
    /// Bytes all open cursors may hold together (see `cursor.rs`).
    pub max_cursor_bytes: usize,
    /// Resident bytes past which writes that add data are refused (146;
    /// `memory.rs`). `None`: no limit.
    pub max_memory_bytes: Option<u64>,
    /// Honour benchmark knobs (`$duet.workNsPerDoc`); refused otherwise.
    pub enable_test_knobs: bool,
    /// Snapshots kept for `atClusterTime`.
    pub snapshot_capacity: usize,
    /// How long shutdown waits for in-flight commands.
    pub shutdown_grace: Duration,
    /// `Some(name)`: `hello` describes the primary of a one-member replica set
    /// of that name (drivers then allow transactions and retryable writes);
    /// `None`: a standalone server.
    pub replica_set: Option<String>,
    /// `host:port` that `hello` names as this member (`hosts`, `me`,
    /// `primary`); `None`: the local address each connection arrived on.
    pub advertise: Option<String>,
    /// Open transactions older than this are aborted.
    pub transaction_lifetime: Duration,
    /// Sessions unused this long are forgotten (`logicalSessionTimeoutMinutes`).
    pub session_idle_timeout: Duration,
    /// Sessions with server-side state at most.
    pub max_sessions: usize,
    /// Bytes one blocking sort or `$group` of a read may hold
    /// (`internalQueryMaxBlockingSortMemoryUsageBytes`, 100 MiB).
    pub query_memory_limit_bytes: usize,
    /// Reads that do not say `allowDiskUse` may spill sorts to disk
    /// (MongoDB 6.0+'s `allowDiskUseByDefault`, true).
    pub allow_disk_use_by_default: bool,
    /// `--auth`: commands other than the handshake and authentication ones
    /// need an authenticated connection (see `auth`).
    pub auth: bool,
    /// `--tls-mode` and its certificate (`None`: disabled; see `tls`).
    pub tls: Option<std::sync::Arc<crate::tls::TlsConfig>>,
    /// A new connection's first byte and TLS handshake must arrive within this.
    pub tls_handshake_timeout: Duration,
    /// Failed authentications from one source address within
    /// `auth_failure_window` that block it (0: no limit; see `auth::ratelimit`).
    pub auth_failure_limit: u32,
    pub auth_failure_window: Duration,
    /// Seconds between TTL monitor passes (MongoDB's `ttlMonitorSleepSecs`).
    pub ttl_monitor_sleep: Duration,
    /// Operations at least this long are logged as slow (`--slow-ms`; at
    /// runtime `setParameter: {slowOpThresholdMs}`).
    pub slow_ms: u64,
    /// The effective configuration, every flag by its name (`getCmdLineOpts`'
    /// `parsed`); empty for servers built in tests.
    pub effective: bson::Document,
    /// Compressors offered to clients in `hello` and accepted in
    /// `OP_COMPRESSED` (`--network-message-compressors`; empty: none).
    pub compressors: Vec<crate::compression::Compressor>,
    /// Run the commands that never wait (`ping`, the handshake, a find by
    /// `_id`) on the connection's task, and writes of bounded work in place
    /// on its worker thread, instead of on a blocking thread
    /// (`connection.rs`); off only to measure the difference (`duet bench
    /// wire-latency`).
    pub inline_commands: bool,
}

impl Default for Config {
    fn default() -> Config {
        Config {
            bind: "127.0.0.1".into(),
            port: 27017,
            data_dir: Some(PathBuf::from("./duet-data")),
            max_connections: 1000,
            admin_connections: DEFAULT_ADMIN_CONNECTIONS,
            message_timeout: Duration::from_secs(30),
            idle_timeout: DEFAULT_IDLE_TIMEOUT,
            max_incomplete_message_bytes: DEFAULT_MAX_INCOMPLETE_MESSAGE_BYTES,
            cursor_idle_timeout: Duration::from_secs(600),
            cursors_per_connection: 1000,
            max_cursors: DEFAULT_MAX_CURSORS,
            max_cursor_bytes: DEFAULT_MAX_CURSOR_BYTES,
            max_memory_bytes: None,
            enable_test_knobs: false,
            snapshot_capacity: crate::snapshots::DEFAULT_CAPACITY,
            shutdown_grace: Duration::from_secs(10),
            replica_set: Some(DEFAULT_REPLICA_SET.to_string()),
            advertise: None,
            transaction_lifetime: duetdb::DEFAULT_LIFETIME,
            session_idle_timeout: Duration::from_secs(
                60 * crate::commands::handshake::LOGICAL_SESSION_TIMEOUT_MINUTES as u64,
            ),
            max_sessions: crate::sessions::DEFAULT_MAX_SESSIONS,
            query_memory_limit_bytes: duetdb::DEFAULT_MEMORY_LIMIT,
            allow_disk_use_by_default: true,
            auth: false,
            tls: None,
            tls_handshake_timeout: crate::tls::DEFAULT_HANDSHAKE_TIMEOUT,
            auth_failure_limit: crate::auth::ratelimit::DEFAULT_FAILURE_LIMIT,
            auth_failure_window: crate::auth::ratelimit::DEFAULT_WINDOW,
            ttl_monitor_sleep: duetdb::DEFAULT_TTL_SLEEP,
            slow_ms: crate::runtime::DEFAULT_SLOW_MS,
            effective: bson::Document::new(),
            compressors: crate::compression::parse_list(crate::compression::DEFAULT_COMPRESSORS)
                .unwrap_or_default(),
            inline_commands: true,
        }
    }
}

/// Operation counters (`serverStatus.opcounters`).
#[derive(Default)]
pub struct OpCounters {
    pub insert: AtomicU64,
    pub query: AtomicU64,
    pub update: AtomicU64,
    pub delete: AtomicU64,
    pub getmore: AtomicU64,
    pub command: AtomicU64,
}

impl OpCounters {
    pub fn bump(c: &AtomicU64, n: u64) {
        c.fetch_add(n, Ordering::Relaxed);
    }
}

/// Shared server state.
pub struct ServerState {
    /// Shared with the replica-set member (`repl`), which applies the
    /// set's committed writes to it.
    pub engine: Arc<Engine>,
    /// This server's replica-set member, when it runs one (`--members`);
    /// set once at start, before the first client.
    pub repl: std::sync::OnceLock<Arc<duet_repl::Member>>,
    /// Outside a replica set, the table of the retryable writes and commits
    /// this server applied (`duet_repl::local`, durable with a data
    /// directory); set once at start by `duet serve`, before the first
    /// client (in-process test servers run without it: sessions only).
    pub local_retries: std::sync::OnceLock<Arc<duet_repl::local::LocalRetries>>,
    pub config: Config,
    pub started: Instant,
    pub cursors: CursorRegistry,
    /// Bytes of messages still arriving, across connections.
    pub incomplete: MessageBudget,
    pub snapshots: SnapshotRegistry,
    pub sessions: SessionTable,
    /// Commands in flight, with their cancellation tokens (`currentOp`, `killOp`).
    pub operations: Arc<OpRegistry>,
    pub ops: OpCounters,
    pub connections_current: AtomicU64,
    pub connections_total: AtomicU64,
    pub connections_refused: AtomicU64,
    pub local_addr: parking_lot::Mutex<Option<SocketAddr>>,
    /// Held by `createUser` from its check to its insert, so two connections
    /// cannot both use the localhost exception.
    pub users_lock: parking_lot::Mutex<()>,
    /// Bumped around every drop of the `admin` database: with admin's csn
    /// it tells a connection whether the user it cached may have changed
    /// (`auth::current_user`).
    pub admin_epoch: AtomicU64,
    /// Failed authentications per source address (`auth::ratelimit`).
    pub auth_limiter: crate::auth::ratelimit::RateLimiter,
    /// Deletes expired documents of TTL indexes in every database (one
    /// thread; `serverStatus.metrics.ttl`).
    pub ttl: duetdb::TtlMonitor,
    /// Knobs `setParameter` changes at runtime.
    pub params: crate::runtime::RuntimeParams,
    /// `fsync: 1, lock: true`: writes wait until `fsyncUnlock`.
    pub fsync: crate::runtime::FsyncLock,
    /// `top`: time and count per namespace.
    pub top: crate::runtime::TopTable,
    /// Per-command counters and latency histograms (`--metrics-addr`).
    pub metrics: crate::metrics::CommandMetrics,
    /// Notified by the `shutdown` command; `Server::run` then shuts down.
    pub shutdown_requested: tokio::sync::Notify,
    /// `--max-memory-gb`.
    pub memory: crate::memory::MemoryGuard,
}

/// The TTL monitor of a server: its source lists the engine's databases
/// through a weak reference, so the monitor never keeps the server alive.
fn ttl_monitor(state: &std::sync::Weak<ServerState>, sleep: Duration) -> duetdb::TtlMonitor {
    let source = {
        let state = state.clone();
        move || match state.upgrade() {
            // Only a primary deletes (its deletes replicate); a secondary's
            // would fail, and it receives the primary's instead.
            Some(s) if s.repl.get().is_some_and(|m| !m.is_writable_primary()) => Vec::new(),
            Some(s) => s
                .engine
                .list_databases()
                .into_iter()
                .map(|(_, db)| db)
                .collect(),
            None => Vec::new(),
        }
    };
    duetdb::TtlMonitor::new(sleep, true, source)
}

impl ServerState {
    pub fn new(engine: Engine, config: Config) -> Arc<ServerState> {
        ServerState::with_engine(Arc::new(engine), config)
    }

    /// [`ServerState::new`] on an engine shared with a replica-set member.
    pub fn with_engine(engine: Arc<Engine>, config: Config) -> Arc<ServerState> {
        Arc::new_cyclic(|weak| ServerState {
            ttl: ttl_monitor(weak, config.ttl_monitor_sleep),
            engine,
            repl: std::sync::OnceLock::new(),
            local_retries: std::sync::OnceLock::new(),
            cursors: CursorRegistry::new(
                CursorLimits {
                    per_connection: config.cursors_per_connection,
                    max_cursors: config.max_cursors,
                    max_bytes: config.max_cursor_bytes,
                },
                config.cursor_idle_timeout,
            ),
            incomplete: MessageBudget::new(config.max_incomplete_message_bytes),
            memory: crate::memory::MemoryGuard::new(config.max_memory_bytes),
            snapshots: SnapshotRegistry::new(config.snapshot_capacity),
            sessions: SessionTable::new(
                config.max_sessions,
                config.transaction_lifetime,
                config.session_idle_timeout,
            ),
            auth_limiter: crate::auth::ratelimit::RateLimiter::new(
                crate::auth::ratelimit::Limits {
                    failures: config.auth_failure_limit,
                    window: config.auth_failure_window,
                    ..Default::default()
                },
            ),
            params: crate::runtime::RuntimeParams::new(
                config.allow_disk_use_by_default,
                config.query_memory_limit_bytes,
                config.slow_ms,
            ),
            fsync: Default::default(),
            top: Default::default(),
            metrics: Default::default(),
            shutdown_requested: tokio::sync::Notify::new(),
            config,
            operations: Arc::new(OpRegistry::default()),
            started: Instant::now(),
            ops: OpCounters::default(),
            connections_current: AtomicU64::new(0),
            connections_total: AtomicU64::new(0),
            connections_refused: AtomicU64::new(0),
            local_addr: parking_lot::Mutex::new(None),
            users_lock: parking_lot::Mutex::new(()),
            admin_epoch: AtomicU64::new(0),
        })
    }
}

/// What a command knows about the connection it arrived on.
#[derive(Debug, Clone)]
pub struct ConnInfo {
    pub id: u64,
    pub peer: SocketAddr,
    /// The server address this connection arrived on.
    pub local: SocketAddr,
    /// Who the connection authenticated as (shared by every copy).
    pub auth: Arc<crate::auth::ConnAuth>,
}

impl ConnInfo {
    pub fn new(id: u64, peer: SocketAddr, local: SocketAddr) -> ConnInfo {
        ConnInfo {
            id,
            peer,
            local,
            auth: crate::auth::ConnAuth::new(),
        }
    }
}
