//! What all connections of one server share: the engine, configuration,
//! counters for `serverStatus`, open cursors, held snapshots, the session
//! table (transactions and retryable writes) and the operations in flight.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use duetdb::Engine;

use crate::cursor::CursorRegistry;
use crate::ops::OpRegistry;
use crate::sessions::SessionTable;
use crate::snapshots::SnapshotRegistry;

/// The replica-set name `hello` reports unless `--standalone` is given.
pub const DEFAULT_REPLICA_SET: &str = "duet";

/// Server configuration (the `duet serve` flags).
#[derive(Debug, Clone)]
pub struct Config {
    pub bind: String,
    pub port: u16,
    /// `None` = in memory (tests); `Some` = the data directory.
    pub data_dir: Option<PathBuf>,
    /// Connections served at once; more are refused with a clear error.
    pub max_connections: usize,
    /// Once a message has started arriving, its remainder must arrive within this.
    pub message_timeout: Duration,
    /// Cursors idle longer than this are closed (MongoDB's default: 10 minutes).
    pub cursor_idle_timeout: Duration,
    /// Open cursors one connection may hold.
    pub cursors_per_connection: usize,
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
}

impl Default for Config {
    fn default() -> Config {
        Config {
            bind: "127.0.0.1".into(),
            port: 27017,
            data_dir: Some(PathBuf::from("./duet-data")),
            max_connections: 1000,
            message_timeout: Duration::from_secs(30),
            cursor_idle_timeout: Duration::from_secs(600),
            cursors_per_connection: 1000,
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
    pub engine: Engine,
    pub config: Config,
    pub started: Instant,
    pub cursors: CursorRegistry,
    pub snapshots: SnapshotRegistry,
    pub sessions: SessionTable,
    /// Commands in flight, with their cancellation tokens (`currentOp`, `killOp`).
    pub operations: Arc<OpRegistry>,
    pub ops: OpCounters,
    pub connections_current: AtomicU64,
    pub connections_total: AtomicU64,
    pub connections_refused: AtomicU64,
    pub local_addr: parking_lot::Mutex<Option<SocketAddr>>,
}

impl ServerState {
    pub fn new(engine: Engine, config: Config) -> Arc<ServerState> {
        Arc::new(ServerState {
            engine,
            cursors: CursorRegistry::new(config.cursors_per_connection, config.cursor_idle_timeout),
            snapshots: SnapshotRegistry::new(config.snapshot_capacity),
            sessions: SessionTable::new(
                config.max_sessions,
                config.transaction_lifetime,
                config.session_idle_timeout,
            ),
            config,
            operations: Arc::new(OpRegistry::default()),
            started: Instant::now(),
            ops: OpCounters::default(),
            connections_current: AtomicU64::new(0),
            connections_total: AtomicU64::new(0),
            connections_refused: AtomicU64::new(0),
            local_addr: parking_lot::Mutex::new(None),
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
}
