//! Server-level commands: buildInfo, hostInfo, getParameter, getCmdLineOpts,
//! connectionStatus, listCommands, serverStatus, listDatabases, currentOp,
//! killOp.
//!
//! `currentOp` lists the commands in flight (the registry in `ops.rs`) with
//! MongoDB's fields (`opid`, `secs_running`, `microsecs_running`, `ns`,
//! `command`, `client`, `connectionId`, `killPending`, ...), filtered by the
//! other fields of the command as a query on those documents (`$ownOps`:
//! this connection's only; `$all` is accepted: there are no idle or system
//! operations to add). `killOp: 1, op: <opid>` cancels one; as in MongoDB it
//! answers `{info: "attempting to kill op", ok: 1}` whether or not the op
//! still runs (the op notices at its next page check). Both run on `admin`
//! only (13 Unauthorized elsewhere).
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

pub fn build_info() -> Document {
    doc! {
        "version": COMPAT_VERSION,
        "versionArray": [7, 0, 0, 0],
        "gitVersion": "duetdb",
        "duetVersion": env!("CARGO_PKG_VERSION"),
        "bits": 64,
        "debug": cfg!(debug_assertions),
        "maxBsonObjectSize": super::handshake::MAX_BSON_OBJECT_SIZE,
        "storageEngines": ["duetdb"],
        "modules": [],
        "ok": 1.0,
    }
}

pub fn host_info() -> Document {
    let cores = std::thread::available_parallelism()
        .map(|n| n.get() as i32)
        .unwrap_or(1);
    doc! {
        "system": {
            "currentTime": DateTime::now(),
            "hostname": "localhost",
            "cpuAddrSize": 64,
            "numCores": cores,
            "cpuArch": std::env::consts::ARCH,
        },
        "os": {"type": std::env::consts::OS, "name": std::env::consts::OS},
        "extra": {},
        "ok": 1.0,
    }
}

/// `getCmdLineOpts`: the arguments, and under `parsed` what MongoDB names
/// `net.tls` (mode and file paths, never key material).
pub fn cmd_line_opts(config: &crate::state::Config) -> Document {
    let argv: Vec<Bson> = std::env::args().map(Bson::String).collect();
    let tls = match &config.tls {
        Some(t) => t.summary(),
        None => doc! {"mode": "disabled"},
    };
    doc! {"argv": argv, "parsed": {"net": {"bindIp": config.bind.clone(), "port": i32::from(config.port), "tls": tls}}, "ok": 1.0}
}

fn parameters(ctx: &Ctx<'_>) -> Document {
    let config = &ctx.state.config;
    doc! {
        "allowDiskUseByDefault": config.allow_disk_use_by_default,
        "internalQueryMaxBlockingSortMemoryUsageBytes": config.query_memory_limit_bytes.min(i64::MAX as usize) as i64,
        "internalDocumentSourceGroupMaxMemoryBytes": config.query_memory_limit_bytes.min(i64::MAX as usize) as i64,
        "featureCompatibilityVersion": {"version": "7.0"},
        "authenticationMechanisms": ["SCRAM-SHA-1", "SCRAM-SHA-256"],
        "maxBsonObjectSize": super::handshake::MAX_BSON_OBJECT_SIZE,
        "maxMessageSizeBytes": super::handshake::MAX_MESSAGE_SIZE_BYTES,
        "maxWriteBatchSize": super::handshake::MAX_WRITE_BATCH_SIZE,
        "cursorTimeoutMillis": 600_000i64,
        "logicalSessionTimeoutMinutes": super::handshake::LOGICAL_SESSION_TIMEOUT_MINUTES,
        "ttlMonitorEnabled": ctx.state.ttl.enabled(),
        "ttlMonitorSleepSecs": ctx.state.ttl.sleep().as_secs().min(i32::MAX as u64) as i32,
    }
}

/// `{getParameter: 1, name: 1, ...}` or `{getParameter: "*"}`.
pub fn get_parameter(ctx: &Ctx<'_>, cmd: &Document) -> CmdResult {
    let all = parameters(ctx);
    let mut out = Document::new();
    if matches!(cmd.get("getParameter"), Some(Bson::String(s)) if s == "*") {
        out = all;
    } else {
        for (k, _) in cmd.iter().skip(1) {
            if k.starts_with('$') || matches!(k.as_str(), "lsid" | "comment" | "apiVersion") {
                continue;
            }
            match all.get(k) {
                Some(v) => {
                    out.insert(k.clone(), v.clone());
                }
                None => {
                    return Err(CommandError::new(
                        72,
                        "InvalidOptions",
                        format!("no option found to get: {k}"),
                    ))
                }
            }
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

/// `currentOp` and `killOp` run on `admin` only, as in MongoDB.
fn admin_only(ctx: &Ctx<'_>, name: &str) -> CmdResult<()> {
    if ctx.db != "admin" {
        return Err(CommandError::new(
            13,
            "Unauthorized",
            format!("{name} may only be run against the admin database."),
        ));
    }
    Ok(())
}

/// `{currentOp: 1, $ownOps?, $all?, <filter on the inprog fields>}`.
pub fn current_op(ctx: &Ctx<'_>, cmd: &Document) -> CmdResult {
    admin_only(ctx, "currentOp")?;
    let own = args::flag(cmd, "$ownOps")?;
    let mut filter = Document::new();
    for (k, v) in cmd.iter().skip(1) {
        let generic = matches!(
            k.as_str(),
            "$ownOps"
                | "$all"
                | "$db"
                | "lsid"
                | "comment"
                | "$clusterTime"
                | "$readPreference"
                | "apiVersion"
                | "apiStrict"
                | "apiDeprecationErrors"
                | "maxTimeMS"
        );
        if !generic {
            filter.insert(k.clone(), v.clone());
        }
    }
    let filter = duetdb::lang::Filter::parse(&filter)?;
    let host = ctx.conn.local.to_string();
    let mut inprog = Vec::new();
    for op in ctx.state.operations.current(&host) {
        if own && op.get_i64("connectionId").ok() != Some(ctx.conn.id as i64) {
            continue;
        }
        if filter.matches(&duetdb::raw::to_raw_document(&op)?) {
            inprog.push(Bson::Document(op));
        }
    }
    Ok(doc! {"inprog": inprog, "ok": 1.0})
}

/// `{killOp: 1, op: <opid>}`.
pub fn kill_op(ctx: &Ctx<'_>, cmd: &Document) -> CmdResult {
    admin_only(ctx, "killOp")?;
    let opid = match cmd.get("op") {
        None => {
            return Err(CommandError::bad_value(
                "Did not provide \"op\" field (the operation id to kill)",
            ))
        }
        Some(Bson::Int32(n)) => i64::from(*n),
        Some(Bson::Int64(n)) => *n,
        Some(Bson::Double(d)) if d.fract() == 0.0 && d.abs() < 9.0e15 => *d as i64,
        Some(other) => {
            return Err(CommandError::type_mismatch(format!(
                "killOp 'op' must be a number, not {:?}",
                other.element_type()
            )))
        }
    };
    let found = u64::try_from(opid)
        .ok()
        .is_some_and(|id| ctx.state.operations.kill(id));
    tracing::info!(conn = ctx.conn.id, opid, found, "killOp");
    Ok(doc! {"info": "attempting to kill op", "ok": 1.0})
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
