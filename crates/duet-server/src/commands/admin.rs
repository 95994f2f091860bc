//! Server-level commands: buildInfo, hostInfo, getParameter/setParameter,
//! getCmdLineOpts, getLog, top, listCommands, serverStatus, listDatabases,
//! shutdown, fsync/fsyncUnlock, replSetGetStatus/replSetGetConfig
//! (`currentOp`/`killOp`: `currentop.rs`; statistics: `stats.rs`).
//!
//! `getParameter`/`setParameter` cover the knobs in [`PARAMETERS`], each
//! with whether it may change at runtime (`showDetails: true` reports
//! `{value, settableAtRuntime, settableAtStartup}` as MongoDB). `shutdown`
//! runs on `admin`, from a loopback client (without `--auth`) or for a user
//! with the shutdown action; the server then shuts down as on SIGTERM.
//! `fsync: 1` writes a checkpoint of every database; `lock: true` also makes
//! every write command wait (cancellable) until as many `fsyncUnlock`s. The
//! replica-set commands describe the one-member set `hello` announces;
//! with `--standalone` they answer 76 NoReplicationEnabled, as a standalone
//! mongod does.
//!
//! `serverStatus` reports what the engine exposes (per database: csn,
//! collections, objects, data bytes, VLS, writer and WAL figures; summed over
//! databases: `duet.reads`, live reads by the snapshot strategy that ran)
//! plus the server's own counters (connections, opcounters, cursors, held
//! snapshots). Nothing the engine does not measure is invented here.

use std::sync::atomic::Ordering;

use bson::{doc, Bson, DateTime, Document};

use super::{Ctx, COMMANDS};
use crate::args;
use crate::error::{CmdResult, CommandError};

/// The MongoDB version whose wire protocol we speak (wire version 21).
pub const COMPAT_VERSION: &str = "7.0.0";

/// `buildInfo`: the fields and field order of MongoDB 7.0's reply
/// (`VersionInfoInterface::appendBuildInfo`, then mongod's `storageEngines`),
/// with what is true of this build: no JavaScript engine (`none`, as a
/// MongoDB built without one says), TLS by rustls rather than OpenSSL,
/// the allocator the process installed. duetdb's own facts sit in one
/// `duet` sub-document, so no top-level field means anything MongoDB's
/// does not.
pub fn build_info() -> Document {
    let tls = "rustls 0.23 (ring)";
    doc! {
        "version": COMPAT_VERSION,
        "gitVersion": concat!("duetdb-", env!("CARGO_PKG_VERSION")),
        "modules": [],
        "allocator": crate::memory::allocator_name(),
        "javascriptEngine": "none",
        "sysInfo": "deprecated",
        "versionArray": [7, 0, 0, 0],
        "openssl": {"running": tls, "compiled": tls},
        "buildEnvironment": {
            "distmod": "",
            "distarch": std::env::consts::ARCH,
            "cc": "rustc",
            "ccflags": "",
            "cxx": "",
            "cxxflags": "",
            "linkflags": "",
            "target_arch": std::env::consts::ARCH,
            "target_os": std::env::consts::OS,
            "cppdefines": "",
        },
        "bits": 64,
        "debug": cfg!(debug_assertions),
        "maxBsonObjectSize": super::handshake::MAX_BSON_OBJECT_SIZE,
        "storageEngines": ["duetdb"],
        "duet": {"version": env!("CARGO_PKG_VERSION")},
        "ok": 1.0,
    }
}

fn read_trim(path: &str) -> Option<String> {
    std::fs::read_to_string(path)
        .ok()
        .map(|s| s.trim().to_string())
}

/// `MemTotal` of `/proc/meminfo`, in MiB.
fn mem_total_mb() -> Option<i64> {
    let info = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = info.lines().find(|l| l.starts_with("MemTotal:"))?;
    let kb: i64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb / 1024)
}

fn os_name() -> String {
    std::fs::read_to_string("/etc/os-release")
        .ok()
        .and_then(|t| {
            t.lines()
                .find_map(|l| l.strip_prefix("PRETTY_NAME="))
                .map(|v| v.trim_matches('"').to_string())
        })
        .unwrap_or_else(|| std::env::consts::OS.to_string())
}

pub fn host_info() -> Document {
    let cores = std::thread::available_parallelism()
        .map(|n| n.get() as i32)
        .unwrap_or(1);
    let hostname = read_trim("/proc/sys/kernel/hostname").unwrap_or_else(|| "localhost".into());
    let mem_mb = mem_total_mb().unwrap_or(0);
    let os_type = match std::env::consts::OS {
        "linux" => "Linux",
        "macos" => "Darwin",
        other => other,
    };
    doc! {
        "system": {
            "currentTime": DateTime::now(),
            "hostname": hostname,
            "cpuAddrSize": 64,
            "memSizeMB": mem_mb,
            "memLimitMB": mem_mb,
            "numCores": cores,
            "numPhysicalCores": cores,
            "numCpuSockets": 1,
            "cpuArch": std::env::consts::ARCH,
            "numaEnabled": false,
            "numNumaNodes": 1,
        },
        "os": {
            "type": os_type,
            "name": os_name(),
            "version": read_trim("/proc/sys/kernel/osrelease").unwrap_or_default(),
        },
        "extra": {
            "versionString": read_trim("/proc/version").unwrap_or_default(),
            "pageSize": 4096_i64,
            "maxOpenFiles": duetdb::storage::max_open_files() as i64,
        },
        "ok": 1.0,
    }
}

/// `getCmdLineOpts`: the process's arguments (`argv`) and under `parsed`
/// every `duet serve` flag with the value in force — from `--config`, the
/// command line or its default — by flag name, plus what MongoDB names
/// `net` (`bindIp`, `port`, `tls`: mode and file paths, never key material).
pub fn cmd_line_opts(config: &crate::state::Config) -> Document {
    let argv: Vec<Bson> = std::env::args().map(Bson::String).collect();
    let tls = match &config.tls {
        Some(t) => t.summary(),
        None => doc! {"mode": "disabled"},
    };
    let mut parsed = config.effective.clone();
    parsed.insert(
        "net",
        doc! {"bindIp": config.bind.clone(), "port": i32::from(config.port), "tls": tls},
    );
    doc! {"argv": argv, "parsed": parsed, "ok": 1.0}
}

/// A whole number from a parameter value.
fn whole(v: &Bson, name: &str) -> CmdResult<i64> {
    match v {
        Bson::Int32(i) => Ok(i64::from(*i)),
        Bson::Int64(i) => Ok(*i),
        Bson::Double(f) if f.fract() == 0.0 && f.abs() < 9e15 => Ok(*f as i64),
        other => Err(CommandError::type_mismatch(format!(
            "{name} must be a whole number, not {:?}",
            other.element_type()
        ))),
    }
}

fn boolean(v: &Bson, name: &str) -> CmdResult<bool> {
    match v {
        Bson::Boolean(b) => Ok(*b),
        Bson::Int32(i) => Ok(*i != 0),
        Bson::Int64(i) => Ok(*i != 0),
        Bson::Double(f) => Ok(*f != 0.0),
        other => Err(CommandError::type_mismatch(format!(
            "{name} must be a boolean, not {:?}",
            other.element_type()
        ))),
    }
}

fn positive(v: &Bson, name: &str) -> CmdResult<u64> {
    let n = whole(v, name)?;
    u64::try_from(n)
        .ok()
        .filter(|n| *n > 0)
        .ok_or_else(|| CommandError::bad_value(format!("{name} must be positive, not {n}")))
}

type Getter = fn(&Ctx<'_>) -> Bson;
type Setter = fn(&Ctx<'_>, &Bson) -> CmdResult<()>;

/// One server parameter: its value, and how `setParameter` changes it
/// (`None`: only at startup, through its flag, or never).
pub struct Parameter {
    pub name: &'static str,
    get: Getter,
    set: Option<Setter>,
    /// A `duet serve` flag sets it.
    pub settable_at_startup: bool,
}

fn sat_i64(n: u64) -> i64 {
    n.min(i64::MAX as u64) as i64
}

/// The parameters `getParameter` reports and `setParameter` changes.
pub const PARAMETERS: &[Parameter] = &[
    Parameter {
        name: "allowDiskUseByDefault",
        get: |c| Bson::Boolean(c.state.params.allow_disk_use_by_default()),
        set: Some(|c, v| {
            let b = boolean(v, "allowDiskUseByDefault")?;
            c.state.params.set_allow_disk_use_by_default(b);
            Ok(())
        }),
        settable_at_startup: true,
    },
    Parameter {
        name: "internalQueryMaxBlockingSortMemoryUsageBytes",
        get: |c| Bson::Int64(sat_i64(c.state.params.query_memory_limit_bytes() as u64)),
        set: Some(|c, v| {
            let n = positive(v, "internalQueryMaxBlockingSortMemoryUsageBytes")?;
            c.state
                .params
                .set_query_memory_limit_bytes(usize::try_from(n).unwrap_or(usize::MAX));
            Ok(())
        }),
        settable_at_startup: true,
    },
    Parameter {
        // The same limit: duet has one memory budget for sorts and $group.
        name: "internalDocumentSourceGroupMaxMemoryBytes",
        get: |c| Bson::Int64(sat_i64(c.state.params.query_memory_limit_bytes() as u64)),
        set: Some(|c, v| {
            let n = positive(v, "internalDocumentSourceGroupMaxMemoryBytes")?;
            c.state
                .params
                .set_query_memory_limit_bytes(usize::try_from(n).unwrap_or(usize::MAX));
            Ok(())
        }),
        settable_at_startup: true,
    },
    Parameter {
        name: "slowOpThresholdMs",
        get: |c| Bson::Int64(sat_i64(c.state.params.slow_ms())),
        set: Some(|c, v| {
            let n = whole(v, "slowOpThresholdMs")?;
            let n = u64::try_from(n).map_err(|_| {
                CommandError::bad_value(format!("slowOpThresholdMs must be >= 0, not {n}"))
            })?;
            c.state.params.set_slow_ms(n);
            Ok(())
        }),
        settable_at_startup: true,
    },
    Parameter {
        name: "logLevel",
        get: |_| {
            let level = crate::logs::level().unwrap_or_default();
            Bson::Int32(if level.contains("trace") {
                2
            } else if level.contains("debug") {
                1
            } else {
                0
            })
        },
        set: Some(|_, v| {
            let n = whole(v, "logLevel")?;
            if !(0..=5).contains(&n) {
                return Err(CommandError::bad_value(format!(
                    "logLevel must be in 0..=5, not {n}"
                )));
            }
            crate::logs::set_level(crate::logs::directive_for(n))
                .map_err(CommandError::bad_value)?;
            Ok(())
        }),
        settable_at_startup: true,
    },
    Parameter {
        name: "ttlMonitorEnabled",
        get: |c| Bson::Boolean(c.state.ttl.enabled()),
        set: Some(|c, v| {
            c.state.ttl.set_enabled(boolean(v, "ttlMonitorEnabled")?);
            Ok(())
        }),
        settable_at_startup: false,
    },
    Parameter {
        name: "ttlMonitorSleepSecs",
        get: |c| Bson::Int32(c.state.ttl.sleep().as_secs().min(i32::MAX as u64) as i32),
        set: Some(|c, v| {
            let n = positive(v, "ttlMonitorSleepSecs")?;
            c.state.ttl.set_sleep(std::time::Duration::from_secs(n));
            Ok(())
        }),
        settable_at_startup: true,
    },
    Parameter {
        name: "featureCompatibilityVersion",
        get: |_| Bson::Document(doc! {"version": "7.0"}),
        set: None,
        settable_at_startup: false,
    },
    Parameter {
        name: "authenticationMechanisms",
        get: |_| Bson::Array(vec!["SCRAM-SHA-1".into(), "SCRAM-SHA-256".into()]),
        set: None,
        settable_at_startup: false,
    },
    Parameter {
        name: "maxBsonObjectSize",
        get: |_| Bson::Int32(super::handshake::MAX_BSON_OBJECT_SIZE),
        set: None,
        settable_at_startup: false,
    },
    Parameter {
        name: "maxMessageSizeBytes",
        get: |_| Bson::Int32(super::handshake::MAX_MESSAGE_SIZE_BYTES),
        set: None,
        settable_at_startup: false,
    },
    Parameter {
        name: "maxWriteBatchSize",
        get: |_| Bson::Int32(super::handshake::MAX_WRITE_BATCH_SIZE),
        set: None,
        settable_at_startup: false,
    },
    Parameter {
        name: "cursorTimeoutMillis",
        get: |c| {
            Bson::Int64(
                c.state
                    .config
                    .cursor_idle_timeout
                    .as_millis()
                    .min(i64::MAX as u128) as i64,
            )
        },
        set: None,
        settable_at_startup: true,
    },
    Parameter {
        name: "transactionLifetimeLimitSeconds",
        get: |c| Bson::Int64(sat_i64(c.state.config.transaction_lifetime.as_secs())),
        set: None,
        settable_at_startup: true,
    },
    Parameter {
        name: "logicalSessionTimeoutMinutes",
        get: |_| Bson::Int32(super::handshake::LOGICAL_SESSION_TIMEOUT_MINUTES),
        set: None,
        settable_at_startup: false,
    },
];

fn parameter(name: &str) -> Option<&'static Parameter> {
    PARAMETERS.iter().find(|p| p.name == name)
}

fn shown(ctx: &Ctx<'_>, p: &Parameter, details: bool) -> Bson {
    let value = (p.get)(ctx);
    if !details {
        return value;
    }
    Bson::Document(doc! {
        "value": value,
        "settableAtRuntime": p.set.is_some(),
        "settableAtStartup": p.settable_at_startup,
    })
}

/// Fields every command may carry that are not parameter names.
fn generic_field(k: &str) -> bool {
    k.starts_with('$')
        || matches!(
            k,
            "lsid" | "comment" | "apiVersion" | "apiStrict" | "apiDeprecationErrors" | "maxTimeMS"
        )
}

/// `{getParameter: 1 | "*" | {showDetails?, allParameters?}, <name>: 1, ...}`.
pub fn get_parameter(ctx: &Ctx<'_>, cmd: &Document) -> CmdResult {
    let (all, details) = match cmd.get("getParameter") {
        Some(Bson::String(s)) if s == "*" => (true, false),
        Some(Bson::Document(d)) => (
            args::flag(d, "allParameters")?,
            args::flag(d, "showDetails")?,
        ),
        _ => (false, false),
    };
    let mut out = Document::new();
    if all {
        for p in PARAMETERS {
            out.insert(p.name, shown(ctx, p, details));
        }
    } else {
        for (k, _) in cmd.iter().skip(1) {
            if generic_field(k) {
                continue;
            }
            let p = parameter(k).ok_or_else(|| {
                CommandError::new(72, "InvalidOptions", format!("no option found to get: {k}"))
            })?;
            out.insert(k.clone(), shown(ctx, p, details));
        }
        if out.is_empty() {
            return Err(CommandError::new(
                72,
                "InvalidOptions",
                "no option found to get",
            ));
        }
    }
    out.insert("ok", 1.0);
    Ok(out)
}

/// `{setParameter: 1, <name>: <value>}`: answers the previous value as `was`.
pub fn set_parameter(ctx: &Ctx<'_>, cmd: &Document) -> CmdResult {
    if ctx.db != "admin" {
        return Err(CommandError::new(
            13,
            "Unauthorized",
            "setParameter may only be run against the admin database.",
        ));
    }
    let mut was = None;
    let mut n = 0;
    for (k, v) in cmd.iter().skip(1) {
        if generic_field(k) {
            continue;
        }
        let p = parameter(k).ok_or_else(|| {
            CommandError::new(
                72,
                "InvalidOptions",
                format!(
                    "attempted to set unrecognized parameter [{k}], use help:true to see options"
                ),
            )
        })?;
        let set = p.set.ok_or_else(|| {
            CommandError::new(
                72,
                "InvalidOptions",
                format!("not allowed to change [{k}] at runtime"),
            )
        })?;
        let before = (p.get)(ctx);
        set(ctx, v)?;
        tracing::info!(parameter = %k, was = %before, now = %(p.get)(ctx), "setParameter");
        was = Some(before);
        n += 1;
    }
    if n == 0 {
        return Err(CommandError::new(
            72,
            "InvalidOptions",
            "no option found to set, use help:true to see options",
        ));
    }
    let mut out = Document::new();
    if let (1, Some(w)) = (n, was) {
        out.insert("was", w);
    }
    out.insert("ok", 1.0);
    Ok(out)
}

/// `listCommands`: every command with its help and, as MongoDB's,
/// `requiresAuth` (from the authorization table).
pub fn list_commands() -> Document {
    let mut cmds = Document::new();
    for (name, help) in COMMANDS {
        let requires_auth = !matches!(
            crate::auth::table::rule(name),
            Some(crate::auth::table::Rule::Open)
        );
        cmds.insert(
            *name,
            doc! {"help": *help, "requiresAuth": requires_auth, "adminOnly": false},
        );
    }
    doc! {"commands": cmds, "ok": 1.0}
}

fn counter(c: &std::sync::atomic::AtomicU64) -> i64 {
    counter_of(c.load(Ordering::Relaxed))
}

/// A counter as BSON's signed 64-bit integer (saturating).
fn counter_of(n: u64) -> i64 {
    n.min(i64::MAX as u64) as i64
}

pub fn server_status(ctx: &Ctx<'_>) -> Document {
    let s = ctx.state;
    let uptime = s.started.elapsed();
    let current = counter(&s.connections_current);
    let sessions = s.sessions.stats();
    let ttl = s.ttl.counters();
    let mut dbs = Vec::new();
    let mut reads = duetdb::ReadStats::default();
    for (name, db) in s.engine.list_databases() {
        let r = db.read_stats();
        reads.none += r.none;
        reads.vls += r.vls;
        reads.cow += r.cow;
        reads.olcp += r.olcp;
        let st = db.stats();
        let v = db.vls_stats();
        let w = db.writer_stats();
        let i = |n: u64| n.min(i64::MAX as u64) as i64;
        let wal = match db.wal_stats() {
            Some(l) => Bson::Document(doc! {
                "records": i(l.records),
                "bytes": i(l.bytes),
                "fsyncs": i(l.fsyncs),
                "segmentsCreated": i(l.segments_created),
                "bytesSinceCheckpoint": i(l.bytes_since_checkpoint),
                "lastLsn": i(l.last_lsn),
                "stopped": l.stopped,
            }),
            None => Bson::Null,
        };
        dbs.push(Bson::Document(doc! {
            "name": name,
            "csn": i(st.csn),
            "collections": i(st.collections),
            "objects": i(st.objects),
            "dataBytes": i(st.data_bytes),
            "indexes": i(st.indexes),
            "vls": {
                "scansActive": i(v.scans_active),
                "scansQueued": i(v.scans_queued),
                "scansStarted": i(v.scans_started),
                "queueWaitMicrosTotal": i(v.queue_wait_us_total),
                "backgroundResets": i(v.background_resets),
                "remsetEntries": i(v.remset.entries),
                "remsetBytes": i(v.remset.bytes),
                "remsetEntriesPeak": i(v.remset.entries_peak),
                "remsetBytesPeak": i(v.remset.bytes_peak),
                "remsetSharedVersions": i(v.remset.shared_inserts),
                "remsetReclaimed": i(v.remset.reclaimed),
                "remsetVersionsKept": i(v.remset.insert_calls),
                "remsetNeedingTotal": i(v.remset.needing_total),
                "olcpPropagated": i(v.olcp_propagated),
                "olcpInflight": i(v.olcp_inflight),
            },
            "writer": {
                "queueLength": i(w.queue_len),
                "groups": i(w.groups),
                "commands": i(w.commands),
                "largestGroup": i(w.largest_group),
            },
            "wal": wal,
        }));
    }
    doc! {
        "host": "localhost",
        "version": COMPAT_VERSION,
        "process": "duet",
        "pid": std::process::id() as i64,
        "uptime": uptime.as_secs_f64(),
        "uptimeMillis": uptime.as_millis().min(i64::MAX as u128) as i64,
        "localTime": DateTime::now(),
        "connections": {
            "current": current as i32,
            "available": (s.config.max_connections as i64 - current).max(0) as i32,
            "totalCreated": counter(&s.connections_total),
            "refused": counter(&s.connections_refused),
        },
        "opcounters": {
            "insert": counter(&s.ops.insert),
            "query": counter(&s.ops.query),
            "update": counter(&s.ops.update),
            "delete": counter(&s.ops.delete),
            "getmore": counter(&s.ops.getmore),
            "command": counter(&s.ops.command),
        },
        // MongoDB's TTL monitor counters.
        "metrics": {
            "ttl": {
                "deletedDocuments": counter_of(ttl.deleted_documents),
                "passes": counter_of(ttl.passes),
                "subPasses": counter_of(ttl.passes),
            },
        },
        "transactions": {
            "currentOpen": sessions.open_transactions as i64,
            "sessionsWithState": sessions.sessions as i64,
            "lifetimeLimitSeconds": s.config.transaction_lifetime.as_secs_f64(),
        },
        "duet": {
            "version": env!("CARGO_PKG_VERSION"),
            "databases": dbs,
            // Live reads (`$duet.snapshot`, engine defaults) by the strategy
            // that ran: the evidence that a requested strategy is honoured.
            // Reads of held snapshots (the default, readConcern snapshot,
            // named snapshots) are `cow` by construction and not counted.
            "reads": {
                "none": counter_of(reads.none),
                "vls": counter_of(reads.vls),
                "cow": counter_of(reads.cow),
                "olcp": counter_of(reads.olcp),
            },
            "cursorsOpen": s.cursors.len() as i64,
            "cursorsHeldBytes": s.cursors.held_bytes() as i64,
            "incompleteMessageBytes": s.incomplete.used() as i64,
            "snapshotsHeld": s.snapshots.len() as i64,
            // `--max-memory-gb` (null: no limit) and the writes it refused.
            "memory": {
                "residentBytes": s.memory.resident().min(i64::MAX as u64) as i64,
                "limitBytes": s.memory.limit().map(|l| l.min(i64::MAX as u64) as i64),
                "writesRefused": counter_of(s.memory.refused()),
            },
            // Commands in flight and cancellations (`currentOp`, `killOp`,
            // `maxTimeMS`, closed connections, shutdown).
            "operations": s.operations.status(),
            // Sorted runs spilled to disk since start (reads over the
            // memory limit with disk use allowed).
            "spill": {
                "runs": counter_of(duetdb::spill_stats().runs),
                "bytes": counter_of(duetdb::spill_stats().bytes),
            },
        },
        "ok": 1.0,
    }
}

/// `listDatabases` (`nameOnly`, `filter`, `authorizedDatabases`): under
/// `--auth` a user sees every database only with the listDatabases action
/// (see `auth::database_filter`).
pub fn list_databases(ctx: &Ctx<'_>, cmd: &Document) -> CmdResult {
    let name_only = args::flag(cmd, "nameOnly")?;
    let visible = crate::auth::database_filter(ctx, cmd)?;
    let filter = args::opt_doc(cmd, "filter")?
        .map(duetdb::lang::Filter::parse)
        .transpose()?;
    let mut out = Vec::new();
    let mut total: i64 = 0;
    let mut dbs: Vec<(String, Option<duetdb::Database>)> = ctx
        .state
        .engine
        .list_databases()
        .into_iter()
        .map(|(n, d)| (n, Some(d)))
        .collect();
    // `local` holds the oplog view (commands/oplog.rs), as on MongoDB.
    let local = super::oplog::OPLOG_DB;
    if !dbs.iter().any(|(n, _)| n == local) {
        let at = dbs.partition_point(|(n, _)| n.as_str() < local);
        dbs.insert(at, (local.to_string(), None));
    }
    for (name, db) in dbs {
        if visible.as_ref().is_some_and(|p| !p.sees_database(&name)) {
            continue;
        }
        let (size, empty) = match &db {
            Some(db) => {
                let st = db.stats();
                (st.data_bytes.min(i64::MAX as u64) as i64, st.objects == 0)
            }
            None => (0, false),
        };
        let entry = if name_only {
            doc! {"name": name}
        } else {
            doc! {"name": name, "sizeOnDisk": size, "empty": empty}
        };
        if let Some(f) = &filter {
            let raw = duetdb::raw::to_raw_document(&entry)?;
            if !f.matches(&raw) {
                continue;
            }
        }
        total = total.saturating_add(size);
        out.push(Bson::Document(entry));
    }
    let mut reply = doc! {"databases": out};
    if !name_only {
        reply.insert("totalSize", total);
        reply.insert("totalSizeMb", total / (1024 * 1024));
    }
    reply.insert("ok", 1.0);
    Ok(reply)
}

fn on_admin(ctx: &Ctx<'_>, name: &str) -> CmdResult<()> {
    if ctx.db != "admin" {
        return Err(CommandError::new(
            13,
            "Unauthorized",
            format!("{name} may only be run against the admin database."),
        ));
    }
    Ok(())
}

/// `{getLog: "global" | "startupWarnings" | "*"}`: the recent log lines
/// (MongoDB's structured JSON lines; at most `logs::RING_LINES`).
pub fn get_log(ctx: &Ctx<'_>, cmd: &Document) -> CmdResult {
    on_admin(ctx, "getLog")?;
    let which = match cmd.get("getLog") {
        Some(Bson::String(s)) => s.as_str(),
        _ => {
            return Err(CommandError::type_mismatch(
                "Argument to getLog must be of type String",
            ))
        }
    };
    let ring = crate::logs::ring();
    let lines = match which {
        "*" => return Ok(doc! {"names": ["global", "startupWarnings"], "ok": 1.0}),
        "global" => ring.lines(),
        "startupWarnings" => ring.startup_warnings(),
        other => {
            return Err(CommandError::new(
                72,
                "InvalidOptions",
                format!("No log named '{other}'"),
            ))
        }
    };
    let total = if which == "global" {
        ring.total()
    } else {
        lines.len() as u64
    };
    Ok(doc! {
        "totalLinesWritten": total.min(i64::MAX as u64) as i64,
        "log": lines,
        "ok": 1.0,
    })
}

/// `{top: 1}`: time (µs) and count per namespace and kind of operation.
pub fn top(ctx: &Ctx<'_>) -> CmdResult {
    on_admin(ctx, "top")?;
    Ok(doc! {"totals": ctx.state.top.totals(), "ok": 1.0})
}

/// `{shutdown: 1, force?, timeoutSecs?, comment?}` on `admin`.
pub fn shutdown(ctx: &Ctx<'_>, cmd: &Document) -> CmdResult {
    on_admin(ctx, "shutdown")?;
    args::flag(cmd, "force")?;
    if !ctx.state.config.auth && !ctx.conn.peer.ip().is_loopback() {
        return Err(CommandError::new(
            13,
            "Unauthorized",
            "shutdown must run from localhost when running db without auth",
        ));
    }
    tracing::info!(conn = ctx.conn.id, peer = %ctx.conn.peer, "shutdown command received");
    ctx.state.shutdown_requested.notify_one();
    Ok(doc! {"ok": 1.0})
}

/// `{fsync: 1, lock?: bool}` on `admin`: checkpoint every database now; with
/// `lock: true` write commands then wait until `fsyncUnlock`, and a
/// secondary applies no more of the set's log until then.
pub fn fsync(ctx: &Ctx<'_>, cmd: &Document) -> CmdResult {
    on_admin(ctx, "fsync")?;
    let lock = args::flag(cmd, "lock")?;
    if args::flag(cmd, "async")? {
        return Err(CommandError::not_supported(
            "fsync with async: true is not supported",
        ));
    }
    // Lock first, so no write starts between the checkpoint and the lock.
    let count = lock.then(|| ctx.state.fsync.lock());
    // A secondary also stops applying the set's log, as MongoDB's stop their
    // oplog application, before the checkpoint, so the files hold the state
    // the lock keeps (a primary's writes wait for the lock already; its own
    // entries, a no-op's or a `dropDatabase`'s, still apply).
    let paused = lock
        .then(|| ctx.state.repl.get().filter(|m| !m.is_writable_primary()))
        .flatten();
    if let Some(m) = paused {
        m.pause_applies(true);
    }
    let mut files = 0i32;
    for (name, db) in ctx.state.engine.list_databases() {
        match db.checkpoint() {
            Ok(_) => files += 1,
            Err(e) => {
                if lock && ctx.state.fsync.unlock() == Some(0) {
                    if let Some(m) = paused {
                        m.pause_applies(false);
                    }
                }
                tracing::error!(db = %name, error = %e, "fsync: checkpoint failed");
                return Err(e.into());
            }
        }
    }
    let mut out = doc! {"numFiles": files};
    if let Some(n) = count {
        tracing::info!(
            lock_count = n,
            "fsync lock taken: writes wait for fsyncUnlock"
        );
        out.insert(
            "info",
            "now locked against writes, use db.fsyncUnlock() to unlock",
        );
        out.insert("lockCount", i64::from(n));
        out.insert("seeAlso", "http://dochub.mongodb.org/core/fsynccommand");
    }
    out.insert("ok", 1.0);
    Ok(out)
}

/// `{fsyncUnlock: 1}` on `admin`.
pub fn fsync_unlock(ctx: &Ctx<'_>) -> CmdResult {
    on_admin(ctx, "fsyncUnlock")?;
    match ctx.state.fsync.unlock() {
        None => Err(CommandError::new(
            125,
            "CommandFailed",
            "fsyncUnlock called when not locked",
        )),
        Some(n) => {
            if n == 0 {
                if let Some(m) = ctx.state.repl.get() {
                    m.pause_applies(false);
                }
            }
            tracing::info!(lock_count = n, "fsyncUnlock");
            Ok(doc! {"info": "fsyncUnlock completed", "lockCount": i64::from(n), "ok": 1.0})
        }
    }
}

/// The replica-set name, or 76 NoReplicationEnabled under `--standalone`.
fn replica_set<'a>(ctx: &'a Ctx<'_>) -> CmdResult<&'a str> {
    on_admin(ctx, "replSetGetStatus")?;
    ctx.state.config.replica_set.as_deref().ok_or_else(|| {
        CommandError::new(
            76,
            "NoReplicationEnabled",
            "not running with --replSet (duet serve --standalone)",
        )
    })
}

/// `{replSetGetStatus: 1}`: the one-member set `hello` describes.
pub fn repl_set_get_status(ctx: &Ctx<'_>) -> CmdResult {
    let set = replica_set(ctx)?.to_string();
    let me = super::handshake::member_address(ctx);
    let now = DateTime::now();
    let ts = super::changes::timestamp(ctx.state.engine.cluster_time());
    let optime = doc! {"ts": ts, "t": 1_i64};
    let uptime = ctx.state.started.elapsed();
    let started = DateTime::from_system_time(std::time::SystemTime::now() - uptime);
    Ok(doc! {
        "set": set,
        "date": now,
        "myState": 1,
        "term": 1_i64,
        "heartbeatIntervalMillis": 2000_i64,
        "majorityVoteCount": 1,
        "writeMajorityCount": 1,
        "votingMembersCount": 1,
        "writableVotingMembersCount": 1,
        "optimes": {
            "lastCommittedOpTime": optime.clone(),
            "lastCommittedWallTime": now,
            "readConcernMajorityOpTime": optime.clone(),
            "appliedOpTime": optime.clone(),
            "durableOpTime": optime.clone(),
            "lastAppliedWallTime": now,
            "lastDurableWallTime": now,
        },
        "members": [{
            "_id": 0,
            "name": me,
            "health": 1.0,
            "state": 1,
            "stateStr": "PRIMARY",
            "uptime": uptime.as_secs().min(i32::MAX as u64) as i32,
            "optime": optime.clone(),
            "optimeDate": now,
            "optimeDurable": optime,
            "optimeDurableDate": now,
            "syncSourceHost": "",
            "syncSourceId": -1,
            "infoMessage": "",
            "electionTime": crate::snapshots::csn_to_timestamp(0),
            "electionDate": started,
            "configVersion": 1,
            "configTerm": 1,
            "self": true,
            "lastHeartbeatMessage": "",
        }],
        "ok": 1.0,
    })
}

/// `{replSetGetConfig: 1}`: the one-member set's configuration.
pub fn repl_set_get_config(ctx: &Ctx<'_>) -> CmdResult {
    let set = replica_set(ctx)?.to_string();
    let me = super::handshake::member_address(ctx);
    Ok(doc! {
        "config": {
            "_id": set,
            "version": 1,
            "term": 1,
            "members": [{
                "_id": 0,
                "host": me,
                "arbiterOnly": false,
                "buildIndexes": true,
                "hidden": false,
                "priority": 1.0,
                "tags": {},
                "secondaryDelaySecs": 0_i64,
                "votes": 1,
            }],
            "protocolVersion": 1_i64,
            "writeConcernMajorityJournalDefault": true,
            "settings": {
                "chainingAllowed": true,
                "heartbeatIntervalMillis": 2000,
                "heartbeatTimeoutSecs": 10,
                "electionTimeoutMillis": 10000,
                "catchUpTimeoutMillis": -1,
                "getLastErrorModes": {},
                "getLastErrorDefaults": {"w": 1, "wtimeout": 0},
            },
        },
        "ok": 1.0,
    })
}

/// `{duetRunTtlPass: 1}` on `admin`: run one TTL monitor pass now and wait
/// for it (a test hook: only with `--enable-test-knobs`, else 20
/// IllegalOperation). Counts in `serverStatus.metrics.ttl` like a
/// background pass.
pub fn run_ttl_pass(ctx: &Ctx<'_>) -> CmdResult {
    if !ctx.state.config.enable_test_knobs {
        return Err(CommandError::new(
            20,
            "IllegalOperation",
            "duetRunTtlPass is a test hook: start the server with --enable-test-knobs",
        ));
    }
    if ctx.db != "admin" {
        return Err(CommandError::new(
            13,
            "Unauthorized",
            "duetRunTtlPass may only be run against the admin database",
        ));
    }
    let pass = ctx.state.ttl.run_pass();
    Ok(doc! {
        "deletedDocuments": counter_of(pass.deleted_documents),
        "indexes": counter_of(pass.indexes),
        "ok": 1.0,
    })
}
