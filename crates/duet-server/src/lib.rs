//! duet-server: duetdb over the MongoDB wire protocol (`duet serve`).
//!
//! Modules, one concept each:
//! - `wire`: message framing and limits; `compression`: OP_COMPRESSED and
//!   its negotiation; `opmsg`: OP_MSG; `opquery`: legacy
//!   OP_QUERY/OP_REPLY handshake; `dupfields`: repeated field names kept
//!   apart while a command is decoded (filters, inserted documents);
//! - `connection`: one client; `server`: listener, connection limit, shutdown;
//!   `tls`: `--tls-mode`, certificates, the plain-or-TLS stream;
//! - `auth`: SCRAM authentication, users, the `--auth` gate, failed
//!   authentications rate-limited per source address;
//! - `commands/*`: the commands; `args`: typed field access; `error`: MongoDB
//!   error shapes;
//! - `cursor`: server-side cursors; `snapshots`: read concern `snapshot` and
//!   `atClusterTime`; `sessions`: the session table (transactions, retryable
//!   writes); `ops`: operations in flight (`currentOp`, `killOp`, cancellation);
//!   `state`: what connections share.
//!
//! Topology: by default `hello` describes the primary of a one-member replica
//! set (`--replica-set`, default `duet`), because drivers send retryable
//! writes only to replica-set members; `--standalone` describes a standalone
//! server instead. Both accept transactions. With `--members` the server is
//! one member of a real replica set (the `duet-repl` crate; `commands/repl.rs`).
//!
//! Wire compression: `compression` (OP_COMPRESSED with snappy, zstd, zlib).
//!
//! Not built: roles enforced per command, MONGODB-X509, transactions spanning several databases, `$clusterTime`
//! gossip (one node: causal consistency holds without it).

pub mod args;
pub mod auth;
pub mod commands;
pub mod compression;
pub mod config;
pub mod connection;
pub mod cursor;
pub mod dupfields;
pub mod error;
pub mod logs;
pub mod memory;
pub mod metrics;
pub mod opmsg;
pub mod opquery;
pub mod ops;
pub mod runtime;
pub mod server;
pub mod sessions;
pub mod snapshots;
pub mod state;
pub mod tls;
pub mod wire;

use std::path::PathBuf;
use std::time::Duration;

pub use server::Server;
pub use state::{Config, ServerState};

/// `duet serve` flags (each also a key of the `--config` file).
#[derive(Debug, Clone, clap::Args)]
pub struct ServeArgs {
    /// A TOML file of these flags as keys (`max-connections = 500`), or a
    /// YAML one (`.yaml`/`.yml`: `max-connections: 500`); flags on the
    /// command line override it. See ops/duet.example.toml.
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1")]
    pub bind: String,
    /// Port to listen on (0 = any free port; the chosen one is logged).
    #[arg(long, default_value_t = 27017)]
    pub port: u16,
    /// Data directory: one subdirectory per database (write-ahead log and
    /// checkpoints), recovered on start; locked (`LOCK`) while the server runs.
    #[arg(long, default_value = "./duet-data")]
    pub data_dir: PathBuf,
    /// Most descriptors kept open for data files (WAL segments) across all
    /// databases; the least recently used are closed and reopened on demand.
    /// 0: 256, or a quarter of the open-file limit when that is lower.
    #[arg(long, default_value_t = 0)]
    pub max_open_files: usize,
    /// Log level: error, warn, info, debug or trace (or a tracing filter
    /// such as `duet_server=debug,info`); `setParameter: {logLevel}` changes
    /// it at runtime.
    #[arg(long, default_value = "info")]
    pub log_level: String,
    /// Log lines as text or JSON (one object per line).
    #[arg(long, value_enum, default_value = "text")]
    pub log_format: logs::LogFormat,
    /// Operations lasting at least this many milliseconds are logged as
    /// "Slow query" with their plan and snapshot strategy (MongoDB's
    /// slowms); `setParameter: {slowOpThresholdMs}` changes it at runtime.
    #[arg(long, default_value_t = runtime::DEFAULT_SLOW_MS)]
    pub slow_ms: u64,
    /// `host:port` serving Prometheus metrics on `GET /metrics` (no
    /// authentication: keep it on loopback). Off when absent.
    #[arg(long)]
    pub metrics_addr: Option<String>,
    /// Most connections served at once; more are refused with an error.
    #[arg(long, default_value_t = 1000)]
    pub max_connections: usize,
    /// Connection slots beyond --max-connections kept for loopback peers (the
    /// administrator), taken only when the ordinary slots are full.
    #[arg(long, default_value_t = state::DEFAULT_ADMIN_CONNECTIONS)]
    pub admin_connections: usize,
    /// Seconds a started message may take to arrive completely.
    #[arg(long, default_value_t = 30.0)]
    pub message_timeout_secs: f64,
    /// Seconds a connection may stay idle (no message in flight) before it is
    /// closed; drivers reconnect transparently.
    #[arg(long, default_value_t = state::DEFAULT_IDLE_TIMEOUT.as_secs_f64())]
    pub idle_timeout_secs: f64,
    /// MiB held by incomplete messages across all connections (beyond each
    /// message's first 64 KiB); a message that would pass it closes its
    /// connection.
    #[arg(long, default_value_t = state::DEFAULT_MAX_INCOMPLETE_MESSAGE_BYTES as f64 / MIB)]
    pub max_incomplete_message_mb: f64,
    /// Seconds an idle cursor lives.
    #[arg(long, default_value_t = 600.0)]
    pub cursor_timeout_secs: f64,
    /// Open cursors one connection may have opened.
    #[arg(long, default_value_t = 1000)]
    pub max_cursors_per_connection: usize,
    /// Open cursors in the whole server; more are refused (146).
    #[arg(long, default_value_t = state::DEFAULT_MAX_CURSORS)]
    pub max_cursors: usize,
    /// MiB all open cursors may hold; a cursor that would pass it is refused (146).
    #[arg(long, default_value_t = state::DEFAULT_MAX_CURSOR_BYTES as f64 / MIB)]
    pub max_cursor_memory_mb: f64,
    /// GiB of resident memory past which commands that add data (inserts,
    /// updates, index and collection creation, `$out`/`$merge`, named
    /// snapshots) fail with 146 ExceededMemoryLimit; reads, deletes and
    /// drops keep working. Leave headroom below the machine's memory. Off
    /// by default.
    #[arg(long)]
    pub max_memory_gb: Option<f64>,
    /// Honour benchmark knobs (`$duet: {workNsPerDoc}` on count); without
    /// it they are refused. For the benchmark harness, never for production.
    #[arg(long)]
    pub enable_test_knobs: bool,
    /// Seconds a multi-document transaction may stay open before it is
    /// aborted (MongoDB's transactionLifetimeLimitSeconds).
    #[arg(long, default_value_t = 60.0)]
    pub transaction_lifetime_secs: f64,
    /// Replica-set name `hello` reports: the server describes itself as the
    /// primary of a one-member replica set, so drivers use transactions and
    /// retryable writes.
    #[arg(long, default_value = state::DEFAULT_REPLICA_SET)]
    pub replica_set: String,
    /// Describe the server as a standalone instead of a replica-set member
    /// (drivers then send no retryable writes).
    #[arg(long, conflicts_with = "replica_set")]
    pub standalone: bool,
    /// `host:port` that `hello` names as this member; clients follow it, so it
    /// must be reachable by them (default: the address each connection
    /// arrived on). Needed behind NAT or port mapping; or connect with
    /// `directConnection=true`.
    #[arg(long)]
    pub advertise: Option<String>,
    /// Bytes one blocking sort or `$group` of a read may hold (MongoDB's
    /// `internalQueryMaxBlockingSortMemoryUsageBytes`); over it a sort
    /// spills to `<data dir>/<db>/spill` or fails with 292, a `$group` fails with 292.
    #[arg(long, default_value_t = duetdb::DEFAULT_MEMORY_LIMIT)]
    pub query_memory_limit_bytes: usize,
    /// Whether reads that do not say `allowDiskUse` may spill sorts to disk
    /// (MongoDB 6.0+'s `allowDiskUseByDefault`).
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    pub allow_disk_use_by_default: bool,
    /// Require authentication (SCRAM-SHA-256 / SCRAM-SHA-1) for every command
    /// but the handshake ones. With no user yet, a loopback client may create
    /// the first one in `admin` (the localhost exception).
    #[arg(long)]
    pub auth: bool,
    /// Allow binding to a non-loopback address without --auth (anyone who can
    /// reach the port can then read, write and drop everything).
    #[arg(long)]
    pub allow_unauthenticated_remote: bool,
    /// With --auth: create this user (role `root` in `admin`) at start when
    /// no user exists yet, for deployments where no client can reach the
    /// localhost exception (a container). Ignored once any user exists.
    /// Also read from the environment variable DUET_INITIAL_ROOT_USER.
    #[arg(long, requires = "auth")]
    pub initial_root_user: Option<String>,
    /// File whose first line is the password of --initial-root-user (a
    /// container secret). Also DUET_INITIAL_ROOT_PASSWORD_FILE; the password
    /// itself may instead be in DUET_INITIAL_ROOT_PASSWORD (never a flag, so
    /// it does not show in the process list).
    #[arg(long, requires = "initial_root_user")]
    pub initial_root_password_file: Option<PathBuf>,
    // --- TLS and failed-authentication limits (issue #15 items 5, 6) ---
    /// TLS: disabled (plain TCP), allow / prefer (plain and TLS on the same
    /// port, told apart by the client's first byte), require (plain clients
    /// are closed).
    #[arg(long, value_enum, default_value = "disabled")]
    pub tls_mode: tls::TlsMode,
    /// PEM file with the server's certificate chain and its private key
    /// (mongod's certificateKeyFile).
    #[arg(long, conflicts_with_all = ["tls_cert_file", "tls_key_file"])]
    pub tls_cert_key_file: Option<PathBuf>,
    /// PEM file with the server's certificate chain (with --tls-key-file).
    #[arg(long, requires = "tls_key_file")]
    pub tls_cert_file: Option<PathBuf>,
    /// PEM file with the server's private key (with --tls-cert-file).
    #[arg(long, requires = "tls_cert_file")]
    pub tls_key_file: Option<PathBuf>,
    /// PEM file of CA certificates: TLS clients must present a certificate
    /// signed by one of them.
    #[arg(long)]
    pub tls_ca_file: Option<PathBuf>,
    /// With --tls-ca-file: accept TLS clients without a certificate too (a
    /// certificate presented must still verify).
    #[arg(long, requires = "tls_ca_file")]
    pub tls_allow_connections_without_certificates: bool,
    /// Seconds a new connection may take to send its first byte and complete
    /// its TLS handshake (TLS modes only).
    #[arg(long, default_value_t = tls::DEFAULT_HANDSHAKE_TIMEOUT.as_secs_f64())]
    pub tls_handshake_timeout_secs: f64,
    /// Failed authentications from one address within
    /// --auth-failure-window-secs after which the address is refused (code
    /// 18) for the window, doubled at each repeat up to an hour. 0: no limit.
    #[arg(long, default_value_t = auth::ratelimit::DEFAULT_FAILURE_LIMIT)]
    pub auth_failure_limit: u32,
    /// The window of --auth-failure-limit, and the first block's length.
    #[arg(long, default_value_t = auth::ratelimit::DEFAULT_WINDOW.as_secs_f64())]
    pub auth_failure_window_secs: f64,
    // --- change history (issue #16) ---
    /// Keep WAL segments no checkpoint needs for this many hours as change
    /// history (change streams resuming from older tokens; older: 286
    /// ChangeStreamHistoryLost).
    #[arg(long, default_value_t = 24.0)]
    pub change_retention_hours: f64,
    /// At most this many MiB of such segments per database (oldest dropped first).
    #[arg(long, default_value_t = (duetdb::DEFAULT_CHANGE_RETENTION_BYTES >> 20) as f64)]
    pub change_retention_mb: f64,
    /// Size of a WAL segment in MiB (a full segment is closed and a new one
    /// started; retention drops whole segments).
    #[arg(long, default_value_t = 64.0)]
    pub wal_segment_mb: f64,
    /// Checkpoint a database once this many MiB of WAL were written since
    /// its last checkpoint.
    #[arg(long, default_value_t = 256.0)]
    pub checkpoint_wal_mb: f64,
    // --- delta indexing (issue #19) ---
    /// Delta indexing (DStore): writes record secondary-index changes in
    /// per-index delta layers, merged into the indexes in bulk by a
    /// background thread per database (docs/design.md "Delta indexing").
    #[arg(long)]
    pub delta_indexing: bool,
    /// The index view of reads that do not choose one with `$duet:
    /// {indexRead}`: `fresh` (exact) or `stale` (merged indexes only).
    #[arg(long, default_value = "fresh")]
    pub index_read: String,
    // --- TTL monitor (issue #18) ---
    /// Seconds between passes of the TTL monitor, which deletes documents
    /// of TTL indexes (`expireAfterSeconds`) once expired (MongoDB's
    /// `ttlMonitorSleepSecs`).
    #[arg(long, default_value_t = duetdb::DEFAULT_TTL_SLEEP.as_secs_f64())]
    pub ttl_monitor_sleep_secs: f64,
    // --- replica sets (issue #21) ---
    /// Run as a member of the replica set --replica-set whose members'
    /// MongoDB addresses are listed here in member-id order (comma-separated
    /// host:port; each member also listens for Raft on its port + 1000, an
    /// address only members should reach). With --member-id. A seed list:
    /// member 0 starts the set with it; later the set's configuration is
    /// the one replSetReconfig makes, and a member's list only has to name
    /// its own address at its --member-id.
    #[arg(
        long,
        value_delimiter = ',',
        requires = "member_id",
        conflicts_with = "standalone"
    )]
    pub members: Vec<String>,
    /// This member's position in --members, from 0.
    #[arg(long, requires = "members")]
    pub member_id: Option<u64>,
    /// Seconds a write waits for the replica set to commit it; past it the
    /// write fails with WriteConcernFailed (64) and its outcome is unknown.
    #[arg(long, default_value_t = duet_repl::DEFAULT_COMMIT_TIMEOUT.as_secs_f64())]
    pub repl_commit_timeout_secs: f64,
    /// Take a Raft snapshot (every database's checkpoint image) every this
    /// many replicated entries and drop the Raft log below it, so a new or
    /// far-behind member catches up from the snapshot (0: never; the log
    /// then grows without bound).
    #[arg(long, default_value_t = duet_repl::DEFAULT_SNAPSHOT_ENTRIES)]
    pub repl_snapshot_entries: u64,
    /// Seconds without any write after which the primary writes a no-op
    /// entry, so secondaries' lastWrite keeps up with its clock while idle
    /// (MongoDB's periodicNoopIntervalSecs; 0: never).
    #[arg(long, default_value_t = duet_repl::DEFAULT_NOOP_INTERVAL.as_secs_f64())]
    pub repl_noop_interval_secs: f64,
    // --- wire compression (issue #20) ---
    /// Compressors offered to drivers for OP_COMPRESSED, in order of
    /// preference (comma-separated: snappy, zstd, zlib), or `disabled`
    /// (mongod's networkMessageCompressors).
    #[arg(long, default_value = compression::DEFAULT_COMPRESSORS)]
    pub network_message_compressors: String,
}

/// The replica-set member `args` ask for (`--members`), checked against
/// the port the server listens on.
fn repl_options(args: &ServeArgs) -> Result<Option<duet_repl::Options>, String> {
    let Some(id) = args.member_id else {
        duet_repl::log_store::refuse_outside_set(&args.data_dir)?;
        return Ok(None);
    };
    let me = args.members.get(id as usize).ok_or_else(|| {
        format!(
            "--member-id {id} is not a position in --members (0..{})",
            args.members.len()
        )
    })?;
    let port = me.rsplit_once(':').and_then(|(_, p)| p.parse::<u16>().ok());
    if port != Some(args.port) {
        return Err(format!(
            "--members names this member (--member-id {id}) {me}, but --port is {}",
            args.port
        ));
    }
    Ok(Some(duet_repl::Options {
        set_name: args.replica_set.clone(),
        member_id: id,
        members: args.members.clone(),
        data_dir: args.data_dir.clone(),
        commit_timeout: secs(args.repl_commit_timeout_secs, "repl-commit-timeout-secs")?,
        snapshot_entries: args.repl_snapshot_entries,
        noop_interval: secs(args.repl_noop_interval_secs, "repl-noop-interval-secs")?,
    }))
}

const MIB: f64 = 1024.0 * 1024.0;

fn secs(s: f64, what: &str) -> Result<Duration, String> {
    Duration::try_from_secs_f64(s).map_err(|e| format!("--{what}: {e}"))
}

fn mib(m: f64, what: &str) -> Result<usize, String> {
    if !(m.is_finite() && m >= 0.0 && m * MIB <= usize::MAX as f64) {
        return Err(format!("--{what}: {m} is not a size in MiB"));
    }
    Ok((m * MIB) as usize)
}

/// `g` GiB in bytes (a positive size).
fn gib(g: f64, what: &str) -> Result<u64, String> {
    if !(g.is_finite() && g > 0.0 && g * MIB * 1024.0 <= u64::MAX as f64) {
        return Err(format!("--{what}: {g} is not a positive size in GiB"));
    }
    Ok((g * MIB * 1024.0) as u64)
}

/// Run `duet serve` until SIGINT/SIGTERM. Returns after a graceful shutdown.
pub fn serve_cli(mut args: ServeArgs) -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    logs::init(&args.log_level, args.log_format)?;
    if !args.standalone && args.replica_set.trim().is_empty() {
        return Err("--replica-set must not be empty (use --standalone for no replica set)".into());
    }
    if !args.auth && !is_loopback(&args.bind) {
        if !args.allow_unauthenticated_remote {
            return Err(format!(
                "refusing to listen on non-loopback address {} without authentication: \
                 add --auth (and create the first user from localhost), or pass \
                 --allow-unauthenticated-remote to expose the server without authentication deliberately",
                args.bind
            )
            .into());
        }
        tracing::warn!(bind = %args.bind, "--allow-unauthenticated-remote: listening on a non-loopback address WITHOUT authentication; anyone who can reach the port can read, write and drop everything");
    }
    let repl = repl_options(&args)?;
    let initial_root = auth::bootstrap::initial_root_of(
        args.auth,
        args.initial_root_user.take(),
        args.initial_root_password_file.take(),
        repl.is_some(),
    )?;
    let auth = args.auth;
    let unauthenticated_remote = !auth && !is_loopback(&args.bind);
    let tls = tls::TlsConfig::load(
        args.tls_mode,
        tls::TlsFiles {
            cert_key_file: args.tls_cert_key_file,
            cert_file: args.tls_cert_file,
            key_file: args.tls_key_file,
            ca_file: args.tls_ca_file,
            allow_without_certificates: args.tls_allow_connections_without_certificates,
        },
    )?;
    let tls_mode = args.tls_mode;
    let config = Config {
        auth,
        bind: args.bind,
        port: args.port,
        data_dir: Some(args.data_dir),
        max_connections: args.max_connections,
        admin_connections: args.admin_connections,
        message_timeout: secs(args.message_timeout_secs, "message-timeout-secs")?,
        idle_timeout: secs(args.idle_timeout_secs, "idle-timeout-secs")?,
        max_incomplete_message_bytes: mib(
            args.max_incomplete_message_mb,
            "max-incomplete-message-mb",
        )?,
        cursor_idle_timeout: secs(args.cursor_timeout_secs, "cursor-timeout-secs")?,
        cursors_per_connection: args.max_cursors_per_connection,
        max_cursors: args.max_cursors,
        max_cursor_bytes: mib(args.max_cursor_memory_mb, "max-cursor-memory-mb")?,
        max_memory_bytes: args
            .max_memory_gb
            .map(|g| gib(g, "max-memory-gb"))
            .transpose()?,
        enable_test_knobs: args.enable_test_knobs,
        transaction_lifetime: secs(args.transaction_lifetime_secs, "transaction-lifetime-secs")?,
        replica_set: (!args.standalone).then_some(args.replica_set),
        advertise: args.advertise,
        query_memory_limit_bytes: args.query_memory_limit_bytes,
        allow_disk_use_by_default: args.allow_disk_use_by_default,
        tls,
        tls_handshake_timeout: secs(
            args.tls_handshake_timeout_secs,
            "tls-handshake-timeout-secs",
        )?,
        auth_failure_limit: args.auth_failure_limit,
        auth_failure_window: secs(args.auth_failure_window_secs, "auth-failure-window-secs")?,
        ttl_monitor_sleep: secs(args.ttl_monitor_sleep_secs, "ttl-monitor-sleep-secs")?,
        slow_ms: args.slow_ms,
        effective: config::effective_of_process(),
        compressors: compression::parse_list(&args.network_message_compressors)?,
        ..Config::default()
    };
    let metrics_addr = args.metrics_addr;
    duetdb::storage::set_max_open_files(args.max_open_files);
    let durability = duetdb::DurabilityOptions {
        change_retention: secs(
            args.change_retention_hours * 3600.0,
            "change-retention-hours",
        )?,
        change_retention_bytes: mib(args.change_retention_mb, "change-retention-mb")? as u64,
        // At least one page: a segment must hold its header and a record.
        segment_bytes: (mib(args.wal_segment_mb, "wal-segment-mb")? as u64).max(4096),
        checkpoint_wal_bytes: (mib(args.checkpoint_wal_mb, "checkpoint-wal-mb")? as u64).max(1),
        ..Default::default()
    };
    let index_read: duetdb::IndexRead = args
        .index_read
        .parse()
        .map_err(|e: String| format!("--index-read: {e}"))?;
    let engine = std::sync::Arc::new(match &config.data_dir {
        Some(dir) => duetdb::Engine::open_with(dir, durability)?,
        None => duetdb::Engine::in_memory(),
    });
    engine.set_delta_indexing(
        duetdb::DeltaOptions {
            on: args.delta_indexing,
            ..Default::default()
        },
        index_read,
    );
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        // A worker answers a `--max-memory-gb` release request when it goes
        // idle (memory.rs: the allocator frees per thread).
        .on_thread_park(memory::release_if_asked)
        .build()?;
    rt.block_on(async move {
        let state = ServerState::with_engine(engine.clone(), config);
        let member = match repl {
            Some(opts) => Some(duet_repl::Member::start(opts, &engine).await?),
            None => None,
        };
        if member.is_none() {
            // Outside a replica set the server keeps its own retry table,
            // durable with the data directory (a retried write after a
            // restart is answered, as MongoDB's `config.transactions`).
            let table = match &state.config.data_dir {
                Some(dir) => duet_repl::local::LocalRetries::open(dir, |db| {
                    engine.get(db).ok().flatten().map_or(0, |d| d.csn())
                })?,
                None => duet_repl::local::LocalRetries::in_memory(),
            };
            let table = std::sync::Arc::new(table);
            engine.set_replicator(Some(table.clone()));
            let _ = state.local_retries.set(table);
        }
        drop(engine);
        if let Some(user) = &initial_root {
            auth::bootstrap::create_initial_root(&state, &user.0, &user.1)?;
        }
        if let Some(m) = &member {
            let _ = state.repl.set(m.clone());
        }
        let (stop_metrics, metrics_stop) = tokio::sync::watch::channel(false);
        let metrics_bound = match &metrics_addr {
            Some(a) => {
                let listener = metrics::bind(a)
                    .await
                    .map_err(|e| format!("--metrics-addr {a}: {e}"))?;
                let bound = listener.local_addr()?;
                tokio::spawn(metrics::serve(
                    listener,
                    std::sync::Arc::downgrade(&state),
                    metrics_stop,
                ));
                Some(bound)
            }
            None => None,
        };
        let server = Server::bind(state).await?;
        let addr = server.local_addr()?;
        let tls = match tls_mode {
            tls::TlsMode::Disabled => "no TLS",
            tls::TlsMode::Allow | tls::TlsMode::Prefer => "TLS and plain TCP",
            tls::TlsMode::Require => "TLS required",
        };
        let auth = if auth {
            "authentication required"
        } else {
            "no auth: keep it on loopback"
        };
        let metrics = match metrics_bound {
            Some(m) => format!(", metrics on http://{m}/metrics"),
            None => String::new(),
        };
        // Printed once, on standard output: the test harness and scripts
        // wait for this line (the log goes to standard error).
        println!("duet serve listening on {addr} ({auth}, {tls}{metrics})");
        logs::mark_started();
        if unauthenticated_remote {
            tokio::spawn(async {
                let mut every = tokio::time::interval(Duration::from_secs(3600));
                every.tick().await;
                loop {
                    every.tick().await;
                    tracing::warn!("still listening on a non-loopback address WITHOUT authentication (--allow-unauthenticated-remote)");
                }
            });
        }
        server.run(shutdown_signal()).await?;
        let _ = stop_metrics.send(true);
        if let Some(m) = member {
            m.shutdown().await;
        }
        tracing::info!("duet serve stopped");
        Ok(())
    })
}

/// Whether `--bind` names a loopback address (`localhost`, 127.0.0.0/8, ::1).
fn is_loopback(bind: &str) -> bool {
    bind.eq_ignore_ascii_case("localhost")
        || bind
            .trim_start_matches('[')
            .trim_end_matches(']')
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
}

/// Completes on SIGINT or SIGTERM.
async fn shutdown_signal() {
    let ctrl_c = async {
        if tokio::signal::ctrl_c().await.is_err() {
            std::future::pending::<()>().await;
        }
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        _ = ctrl_c => tracing::info!("SIGINT received"),
        _ = term => tracing::info!("SIGTERM received"),
    }
}

#[cfg(test)]
mod tests {
    use super::is_loopback;

    #[test]
    fn loopback_binds() {
        for b in [
            "127.0.0.1",
            "127.1.2.3",
            "::1",
            "[::1]",
            "localhost",
            "LOCALHOST",
        ] {
            assert!(is_loopback(b), "{b}");
        }
        for b in [
            "0.0.0.0",
            "::",
            "10.0.0.1",
            "192.168.1.5",
            "example.com",
            "",
        ] {
            assert!(!is_loopback(b), "{b}");
        }
    }
}
