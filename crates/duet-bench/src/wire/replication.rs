//! `duet bench replication`: a 3-member replica set of `duet serve`
//! processes on loopback (temporary data directories), measured in one
//! invocation over the wire (issue #21's benchmark):
//!
//! 1. inserts/s of N client threads with `w: 1` and with `w: "majority"`
//!    on the primary, and their ratio (3 members on one machine share its
//!    CPU, so only the ratio means anything);
//! 2. `find` by `_id` with R reader threads spread over 1, 2 and 3 members
//!    (direct connections, `readPreference=secondaryPreferred`);
//! 3. failover: SIGKILL of the primary while a writer streams inserts; the
//!    time from the kill to the first insert acknowledged by another member
//!    (the writer probes the survivors every few ms); the killed member is
//!    restarted and caught up before the next repeat;
//! 4. catch-up: `--catchup-docs` documents (~200 bytes) are loaded, a Raft
//!    snapshot covering them is awaited, then a fresh member is started and
//!    added with `replSetReconfig` while inserts continue at a modest rate;
//!    the time until its applied Raft index reaches the primary's, split at
//!    the moment it reports the snapshot installed (transfer + install vs
//!    log catch-up).
//!
//! Invariants: every member is a child process killed and reaped when the
//! run ends, however it ends (`ServeProcess`'s drop); the data directories
//! are removed afterwards; every client thread has its own connection
//! (a [`Lane`]) opened before its clock starts.

use std::future::IntoFuture;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Barrier, Mutex};
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};
use mongodb::bson::{doc, Bson, Document};
use mongodb::options::{Acknowledgment, ClientOptions, WriteConcern};
use rand::{Rng, SeedableRng};

use super::spawn::ServeProcess;
use super::{insert_stream, Lane, WIRE_DB};

/// The replica set's name.
const SET: &str = "bench";
/// The collection written and read.
const COLL: &str = "repl";
/// Documents per `insert_many` of the catch-up load.
const LOAD_BATCH: u64 = 1000;
/// How long one write of the failover stream may take before the stream
/// tries the next member.
const PROBE_TIMEOUT: Duration = Duration::from_secs(2);
/// How long a member may take to answer, be elected, or catch up.
const WAIT: Duration = Duration::from_secs(300);

/// What the run is asked to do.
#[derive(Debug, Clone)]
pub struct Params {
    /// The `duet` binary started as each member.
    pub duet: PathBuf,
    /// Where the data directories go.
    pub dir: PathBuf,
    pub threads: usize,
    pub readers: usize,
    pub seconds: f64,
    pub failovers: usize,
    pub catchup_docs: u64,
    /// Inserts per second while the new member catches up.
    pub catchup_rate: u64,
    /// `--repl-snapshot-entries` of every member.
    pub snapshot_entries: u64,
    pub seed: u64,
}

#[derive(Debug, Clone, serde::Serialize)]
pub struct WriteRow {
    pub w: String,
    pub threads: usize,
    pub inserts: u64,
    pub seconds: f64,
    pub inserts_per_sec: f64,
    pub p50_us: u64,
    pub p99_us: u64,
}

#[derive(Debug, Clone, serde::Serialize)]
pub struct ReadRow {
    pub members: usize,
    pub readers: usize,
    pub reads: u64,
    pub found: u64,
    pub seconds: f64,
    pub reads_per_sec: f64,
    /// Reads/s served by each member read from (primary first).
    pub per_member: Vec<f64>,
}

#[derive(Debug, Clone, serde::Serialize)]
pub struct FailoverRow {
    pub repeat: usize,
    pub killed_member: usize,
    pub new_primary: usize,
    /// SIGKILL of the primary → the first acknowledged insert on another member.
    pub seconds_to_first_write: f64,
}

#[derive(Debug, Clone, serde::Serialize)]
pub struct CatchupRow {
    pub docs: u64,
    pub load_seconds: f64,
    /// Inserts per second kept up while the member catches up.
    pub write_rate: u64,
    /// The primary's Raft snapshot index when the member was added.
    pub primary_snapshot_index: i64,
    /// `replSetReconfig` sent → the member's applied index reaches the primary's.
    pub total_seconds: f64,
    /// `replSetReconfig` sent → the member reports a snapshot installed
    /// (transfer + install); `None` when it caught up from the log alone.
    pub snapshot_seconds: Option<f64>,
    /// The rest: log entries applied after the snapshot (or all of them).
    pub log_seconds: f64,
    /// `replSetReconfig` sent → its reply (the member is then a voter).
    pub reconfig_seconds: f64,
    pub primary_docs: u64,
    pub new_member_docs: u64,
}

#[derive(Debug, Clone, serde::Serialize)]
pub struct Report {
    pub members: usize,
    pub writes: Vec<WriteRow>,
    /// `w: "majority"` inserts/s over `w: 1` inserts/s.
    pub majority_over_w1: f64,
    pub reads: Vec<ReadRow>,
    pub failovers: Vec<FailoverRow>,
    pub catchup: CatchupRow,
    pub loadavg_before: String,
    pub loadavg_after: String,
    pub cpus: usize,
}

/// The members, their ports and the client options of each.
struct Cluster {
    procs: Vec<ServeProcess>,
    ports: Vec<u16>,
    primary: usize,
}

/// Wire ports whose Raft ports (+1000) are free too, below the kernel's
/// ephemeral range (as `crates/duet-repl/tests/cluster.rs` picks them).
fn free_ports(n: usize, seed: u64) -> Vec<u16> {
    let mut rng = rand::rngs::StdRng::seed_from_u64(
        seed ^ std::process::id() as u64
            ^ std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.subsec_nanos() as u64),
    );
    let mut out: Vec<u16> = Vec::new();
    while out.len() < n {
        let p: u16 = rng.gen_range(20_000..30_000);
        if out
            .iter()
            .any(|q| p.abs_diff(*q) == 0 || p.abs_diff(*q) == 1000)
        {
            continue;
        }
        let free = |port: u16| std::net::TcpListener::bind(("127.0.0.1", port)).is_ok();
        if free(p) && free(p + 1000) {
            out.push(p);
        }
    }
    out
}

fn hosts(ports: &[u16]) -> String {
    ports
        .iter()
        .map(|p| format!("127.0.0.1:{p}"))
        .collect::<Vec<_>>()
        .join(",")
}

/// Client options for a direct connection to one member that may read there.
fn options(port: u16, select: Duration) -> Result<ClientOptions> {
    let uri = format!(
        "mongodb://127.0.0.1:{port}/?directConnection=true&readPreference=secondaryPreferred&retryWrites=false&appName=duet-bench-repl&serverSelectionTimeoutMS={}&connectTimeoutMS=2000",
        select.as_millis()
    );
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    Ok(rt.block_on(ClientOptions::parse(&uri).into_future())?)
}

/// A connection to member `port`, retried until it answers (at most `WAIT`).
fn lane(port: u16) -> Result<Lane> {
    let opts = options(port, Duration::from_secs(2))?;
    let t = Instant::now();
    loop {
        match Lane::open(&opts) {
            Ok(l) => return Ok(l),
            Err(e) if t.elapsed() > WAIT => {
                return Err(e.context(format!("member on port {port} never answered")))
            }
            Err(_) => std::thread::sleep(Duration::from_millis(50)),
        }
    }
}

fn int(d: &Document, k: &str) -> Option<i64> {
    match d.get(k) {
        Some(Bson::Int64(v)) => Some(*v),
        Some(Bson::Int32(v)) => Some(*v as i64),
        Some(Bson::Double(v)) => Some(*v as i64),
        _ => None,
    }
}

/// A member's own applied Raft index and its snapshots installed, from its
/// `replSetGetStatus` (`None` while it has no configuration).
fn applied(lane: &Lane) -> Option<(i64, i64)> {
    let st = lane.admin_command(doc! {"replSetGetStatus": 1}).ok()?;
    let me = st.get_array("members").ok()?.iter().find_map(|m| match m {
        Bson::Document(m) if m.get_bool("self").ok() == Some(true) => Some(m.clone()),
        _ => None,
    })?;
    let index = int(me.get_document("duet").ok()?, "raftIndex")?;
    let installed = st
        .get_document("duet")
        .ok()
        .and_then(|d| int(d, "snapshotsInstalled"))
        .unwrap_or(0);
    Some((index, installed))
}

fn is_primary(lane: &Lane) -> bool {
    lane.admin_command(doc! {"hello": 1})
        .ok()
        .and_then(|h| h.get_bool("isWritablePrimary").ok())
        == Some(true)
}

fn wait_until(what: &str, mut ok: impl FnMut() -> bool) -> Result<()> {
    let t = Instant::now();
    while !ok() {
        if t.elapsed() > WAIT {
            bail!("timed out waiting for {what}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    Ok(())
}

impl Cluster {
    fn start(p: &Params, dir: &Path, ports: &[u16]) -> Result<Cluster> {
        let members = hosts(&ports[..3]);
        let mut procs = Vec::new();
        for (i, &port) in ports[..3].iter().enumerate() {
            procs.push(ServeProcess::start(
                &p.duet,
                &member_args(dir, i, port, &members, p.snapshot_entries),
                &dir.join(format!("m{i}.log")),
            )?);
        }
        let mut c = Cluster {
            procs,
            ports: ports[..3].to_vec(),
            primary: 0,
        };
        c.find_primary(None)?;
        Ok(c)
    }

    /// Wait for a writable primary (other than `not`).
    fn find_primary(&mut self, not: Option<usize>) -> Result<usize> {
        let lanes: Vec<Option<Lane>> = self
            .ports
            .iter()
            .enumerate()
            .map(|(i, &p)| if Some(i) == not { None } else { lane(p).ok() })
            .collect();
        let mut found = None;
        wait_until("a writable primary", || {
            found = lanes
                .iter()
                .position(|l| l.as_ref().is_some_and(is_primary));
            found.is_some()
        })?;
        let p = found.ok_or_else(|| anyhow!("no primary"))?;
        self.primary = p;
        Ok(p)
    }

    /// Wait until every member has applied what the primary has.
    fn settle(&self) -> Result<()> {
        let lanes = self
            .ports
            .iter()
            .map(|&p| lane(p))
            .collect::<Result<Vec<_>>>()?;
        let target = applied(&lanes[self.primary])
            .ok_or_else(|| anyhow!("the primary has no replSetGetStatus"))?
            .0;
        wait_until("every member to apply the primary's log", || {
            lanes
                .iter()
                .all(|l| applied(l).is_some_and(|(i, _)| i >= target))
        })
    }
}

fn member_args(dir: &Path, i: usize, port: u16, members: &str, snap: u64) -> Vec<String> {
    vec![
        "serve".into(),
        "--bind".into(),
        "127.0.0.1".into(),
        "--port".into(),
        port.to_string(),
        "--data-dir".into(),
        dir.join(format!("m{i}")).display().to_string(),
        "--log-level".into(),
        "warn".into(),
        "--replica-set".into(),
        SET.into(),
        "--members".into(),
        members.into(),
        "--member-id".into(),
        i.to_string(),
        "--repl-snapshot-entries".into(),
        snap.to_string(),
    ]
}

/// A ~200-byte document (BSON size) with `_id: id`.
fn document(id: i64) -> Document {
    doc! {"_id": id, "n": id, "v": format!("{id:0>170}")}
}

/// Phase 1: `threads` clients inserting one document at a time on the primary.
fn writes(
    c: &Cluster,
    threads: usize,
    seconds: f64,
    w: Acknowledgment,
    base: i64,
) -> Result<WriteRow> {
    let label = match &w {
        Acknowledgment::Majority => "majority".to_string(),
        Acknowledgment::Nodes(n) => n.to_string(),
        other => format!("{other:?}"),
    };
    let port = c.ports[c.primary];
    let lanes = (0..threads)
        .map(|_| lane(port))
        .collect::<Result<Vec<_>>>()?;
    let wc = WriteConcern::builder().w(w).build();
    let stream = insert_stream::run(
        &lanes.iter().collect::<Vec<_>>(),
        COLL,
        &wc,
        seconds,
        |t, i| document(base + (t as i64) * 1_000_000_000 + i as i64),
        || Ok(()),
    )?;
    let (all, window) = (stream.latency, stream.window);
    let inserts = stream.inserts;
    let secs = window.as_secs_f64();
    Ok(WriteRow {
        w: label,
        threads,
        inserts,
        seconds: secs,
        inserts_per_sec: inserts as f64 / secs,
        p50_us: all.value_at_quantile(0.5),
        p99_us: all.value_at_quantile(0.99),
    })
}

/// Phase 3, once: SIGKILL the primary during a write stream; restart it.
fn failover(c: &mut Cluster, repeat: usize, base: i64) -> Result<FailoverRow> {
    let n = c.ports.len();
    let old = c.primary;
    let lanes = (0..n)
        .map(|i| lane(c.ports[i]))
        .collect::<Result<Vec<_>>>()?;
    let killed = AtomicBool::new(false);
    let stop = AtomicBool::new(false);
    let first: Mutex<Option<(usize, Instant)>> = Mutex::new(None);
    let written = AtomicU64::new(0);
    let kill_at = std::thread::scope(|s| -> Result<Instant> {
        let writer = s.spawn(|| {
            let mut target = old;
            let mut i = 0i64;
            while !stop.load(Ordering::Relaxed) {
                let coll = lanes[target].collection(COLL);
                let dead = killed.load(Ordering::Acquire);
                // A write that hangs (a member neither answering nor gone)
                // counts as failed: the stream moves on to the next member.
                // (The timer is made inside the runtime: it needs one.)
                // Every attempt takes a new `_id`: a write in flight when the
                // primary died may have committed, and its retry under the
                // same `_id` would fail with a duplicate key forever.
                let op = coll.insert_one(document(base + i)).into_future();
                i += 1;
                match lanes[target]
                    .block_on(async { tokio::time::timeout(PROBE_TIMEOUT, op).await })
                {
                    Ok(Ok(_)) => {
                        written.fetch_add(1, Ordering::Relaxed);
                        if dead && target != old {
                            if let Ok(mut f) = first.lock() {
                                f.get_or_insert((target, Instant::now()));
                            }
                        }
                    }
                    Ok(Err(_)) | Err(_) => {
                        // Probe the next member that is still running.
                        target = (target + 1) % n;
                        if killed.load(Ordering::Acquire) && target == old {
                            target = (target + 1) % n;
                        }
                        std::thread::sleep(Duration::from_millis(5));
                    }
                }
            }
        });
        // Let the stream run, then kill the primary in the middle of it.
        let t = Instant::now();
        while written.load(Ordering::Relaxed) < 50
            && !writer.is_finished()
            && t.elapsed() < Duration::from_secs(30)
        {
            std::thread::sleep(Duration::from_millis(10));
        }
        let kill_at = Instant::now();
        killed.store(true, Ordering::Release);
        let killed_ok = c.procs[old].kill();
        let waited = wait_until("the first write after the kill", || {
            writer.is_finished() || first.lock().map(|f| f.is_some()).unwrap_or(true)
        });
        stop.store(true, Ordering::Relaxed);
        writer.join().map_err(|_| anyhow!("the writer panicked"))?;
        killed_ok?;
        waited?;
        Ok(kill_at)
    })?;
    let (new_primary, at) = first
        .lock()
        .map_err(|_| anyhow!("poisoned"))?
        .ok_or_else(|| anyhow!("no write after the kill"))?;
    let secs = at.duration_since(kill_at).as_secs_f64();
    drop(lanes);
    // Back to three members, all caught up, before the next repeat.
    c.procs[old].restart()?;
    c.find_primary(None)?;
    c.settle()?;
    Ok(FailoverRow {
        repeat,
        killed_member: old,
        new_primary,
        seconds_to_first_write: secs,
    })
}

/// Load `docs` documents through the primary with a few concurrent batches.
fn load(c: &Cluster, docs: u64) -> Result<f64> {
    let port = c.ports[c.primary];
    let threads = 4u64;
    let lanes = (0..threads)
        .map(|_| lane(port))
        .collect::<Result<Vec<_>>>()?;
    let t0 = Instant::now();
    std::thread::scope(|s| -> Result<()> {
        let handles: Vec<_> = lanes
            .iter()
            .enumerate()
            .map(|(t, lane)| {
                s.spawn(move || -> Result<()> {
                    let coll = lane.collection(COLL);
                    let mut b = t as u64;
                    while b * LOAD_BATCH < docs {
                        let lo = b * LOAD_BATCH;
                        let hi = (lo + LOAD_BATCH).min(docs);
                        let batch: Vec<Document> = (lo..hi).map(|i| document(i as i64)).collect();
                        lane.block_on(coll.insert_many(batch))?;
                        b += threads;
                    }
                    Ok(())
                })
            })
            .collect();
        for h in handles {
            h.join().map_err(|_| anyhow!("a loader panicked"))??;
        }
        Ok(())
    })?;
    Ok(t0.elapsed().as_secs_f64())
}

/// Phase 2, once: `readers` threads spread round-robin over the first `k`
/// members of `order`, `find` by a random loaded `_id`.
fn reads(
    c: &Cluster,
    order: &[usize],
    k: usize,
    readers: usize,
    docs: u64,
    seconds: f64,
    seed: u64,
) -> Result<ReadRow> {
    let lanes = (0..readers)
        .map(|r| lane(c.ports[order[r % k]]))
        .collect::<Result<Vec<_>>>()?;
    let stop = AtomicBool::new(false);
    let start = Barrier::new(readers + 1);
    let (window, counts) = std::thread::scope(|s| -> Result<_> {
        let handles: Vec<_> = lanes
            .iter()
            .enumerate()
            .map(|(r, lane)| {
                let (stop, start) = (&stop, &start);
                s.spawn(move || -> Result<(u64, u64)> {
                    let coll = lane.collection(COLL);
                    let mut rng = rand::rngs::StdRng::seed_from_u64(seed ^ r as u64);
                    let (mut n, mut found) = (0u64, 0u64);
                    start.wait();
                    while !stop.load(Ordering::Relaxed) {
                        let id = rng.gen_range(0..docs.max(1)) as i64;
                        if lane.block_on(coll.find_one(doc! {"_id": id}))?.is_some() {
                            found += 1;
                        }
                        n += 1;
                    }
                    Ok((n, found))
                })
            })
            .collect();
        start.wait();
        let t0 = Instant::now();
        std::thread::sleep(Duration::from_secs_f64(seconds));
        stop.store(true, Ordering::Relaxed);
        let mut counts = Vec::new();
        for h in handles {
            counts.push(h.join().map_err(|_| anyhow!("a reader panicked"))??);
        }
        Ok((t0.elapsed(), counts))
    })?;
    let secs = window.as_secs_f64();
    let mut per_member = vec![0u64; k];
    for (r, (n, _)) in counts.iter().enumerate() {
        per_member[r % k] += n;
    }
    let reads: u64 = counts.iter().map(|c| c.0).sum();
    Ok(ReadRow {
        members: k,
        readers,
        reads,
        found: counts.iter().map(|c| c.1).sum(),
        seconds: secs,
        reads_per_sec: reads as f64 / secs,
        per_member: per_member.iter().map(|n| *n as f64 / secs).collect(),
    })
}

/// `count` of the collection on one member (read there).
fn count_on(port: u16) -> Result<u64> {
    let l = lane(port)?;
    let r = l.command(doc! {"count": COLL})?;
    super::count_of(&r)
}

/// Phase 4: a fresh member added while inserts continue at `rate`/s.
fn catchup(
    c: &mut Cluster,
    p: &Params,
    dir: &Path,
    new_port: u16,
    load_seconds: f64,
) -> Result<CatchupRow> {
    let primary = lane(c.ports[c.primary])?;
    let stop = AtomicBool::new(false);
    let rate = p.catchup_rate.max(1);
    std::thread::scope(|s| -> Result<CatchupRow> {
        let writer_port = c.ports[c.primary];
        let stop = &stop;
        let writer = s.spawn(move || -> Result<u64> {
            let l = lane(writer_port)?;
            let coll = l.collection(COLL);
            let t0 = Instant::now();
            let mut i = 0u64;
            while !stop.load(Ordering::Relaxed) {
                l.block_on(coll.insert_one(document(3_000_000_000_000 + i as i64)))?;
                i += 1;
                let due = Duration::from_secs_f64(i as f64 / rate as f64);
                if let Some(d) = due.checked_sub(t0.elapsed()) {
                    std::thread::sleep(d);
                }
            }
            Ok(i)
        });
        let result = (|| -> Result<CatchupRow> {
            // A Raft snapshot covering the load, as a set that has run a
            // while has: the new member then starts from it, not from entry 1.
            let (loaded, _) = applied(&primary).ok_or_else(|| anyhow!("primary status"))?;
            let mut snap_index = 0;
            wait_until("a Raft snapshot covering the load", || {
                snap_index = primary
                    .admin_command(doc! {"replSetGetStatus": 1})
                    .ok()
                    .and_then(|st| {
                        st.get_document("duet")
                            .ok()
                            .and_then(|d| int(d, "raftSnapshotIndex"))
                    })
                    .unwrap_or(0);
                snap_index >= loaded
            })?;
            // The new member, started empty and answering before the clock starts.
            let mut ports = c.ports.clone();
            ports.push(new_port);
            c.procs.push(ServeProcess::start(
                &p.duet,
                &member_args(dir, 3, new_port, &hosts(&ports), p.snapshot_entries),
                &dir.join("m3.log"),
            )?);
            let fresh = lane(new_port)?;
            let mut conf = primary
                .admin_command(doc! {"replSetGetConfig": 1})?
                .get_document("config")
                .context("replSetGetConfig reply")?
                .clone();
            let version = int(&conf, "version").unwrap_or(1);
            conf.insert("version", version + 1);
            let mut members = conf.get_array("members").context("config members")?.clone();
            members.push(Bson::Document(
                doc! {"_id": 3, "host": format!("127.0.0.1:{new_port}")},
            ));
            conf.insert("members", members);
            let reconfig_port = c.ports[c.primary];
            let t0 = Instant::now();
            let reconfig = s.spawn(move || -> Result<f64> {
                let l = lane(reconfig_port)?;
                l.admin_command(
                    doc! {"replSetReconfig": conf, "maxTimeMS": WAIT.as_millis() as i64},
                )?;
                Ok(t0.elapsed().as_secs_f64())
            });
            let mut snapshot_seconds = None;
            let mut total = 0.0;
            wait_until(
                "the new member to reach the primary's applied index",
                || {
                    let Some((target, _)) = applied(&primary) else {
                        return false;
                    };
                    let Some((index, installed)) = applied(&fresh) else {
                        return false;
                    };
                    if installed > 0 && snapshot_seconds.is_none() {
                        snapshot_seconds = Some(t0.elapsed().as_secs_f64());
                    }
                    total = t0.elapsed().as_secs_f64();
                    index >= target
                },
            )?;
            let reconfig_seconds = reconfig
                .join()
                .map_err(|_| anyhow!("the reconfig thread panicked"))??;
            Ok(CatchupRow {
                docs: p.catchup_docs,
                load_seconds,
                write_rate: rate,
                primary_snapshot_index: snap_index,
                total_seconds: total,
                snapshot_seconds,
                log_seconds: total - snapshot_seconds.unwrap_or(0.0),
                reconfig_seconds,
                primary_docs: 0,
                new_member_docs: 0,
            })
        })();
        stop.store(true, Ordering::Relaxed);
        writer
            .join()
            .map_err(|_| anyhow!("the writer panicked"))??;
        result
    })
    .and_then(|mut row| {
        c.ports.push(new_port);
        c.settle()?;
        row.primary_docs = count_on(c.ports[c.primary])?;
        row.new_member_docs = count_on(new_port)?;
        Ok(row)
    })
}

fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_else(|_| "unknown".into())
}

/// Every phase on one cluster; the report and its Markdown.
pub fn run(p: &Params) -> Result<(Report, String)> {
    let dir = p
        .dir
        .join(format!("duet-bench-repl-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let result = run_in(p, &dir);
    if result.is_ok() {
        let _ = std::fs::remove_dir_all(&dir);
    } else {
        eprintln!("the members' logs are kept in {}", dir.display());
    }
    let report = result?;
    let md = markdown(&report, p);
    Ok((report, md))
}

fn run_in(p: &Params, dir: &Path) -> Result<Report> {
    let loadavg_before = loadavg();
    let ports = free_ports(4, p.seed);
    let mut c = Cluster::start(p, dir, &ports)?;
    eprintln!("replica set up, primary: member {}", c.primary);
    let threads = p.threads.max(1);
    let w1 = writes(
        &c,
        threads,
        p.seconds,
        Acknowledgment::Nodes(1),
        1_000_000_000_000,
    )?;
    eprintln!("w: 1        {:.0} inserts/s", w1.inserts_per_sec);
    let wm = writes(
        &c,
        threads,
        p.seconds,
        Acknowledgment::Majority,
        2_000_000_000_000,
    )?;
    eprintln!("w: majority {:.0} inserts/s", wm.inserts_per_sec);
    let ratio = wm.inserts_per_sec / w1.inserts_per_sec;
    let mut failovers = Vec::new();
    for r in 0..p.failovers {
        let row = failover(&mut c, r + 1, 4_000_000_000_000 + r as i64 * 1_000_000_000)?;
        eprintln!(
            "failover {}: member {} killed, member {} took the first write after {:.2} s",
            row.repeat, row.killed_member, row.new_primary, row.seconds_to_first_write
        );
        failovers.push(row);
    }
    let docs = p.catchup_docs.max(1);
    let load_seconds = load(&c, docs)?;
    eprintln!("{docs} documents loaded in {load_seconds:.1} s");
    c.settle()?;
    let mut order = vec![c.primary];
    order.extend((0..3).filter(|i| *i != c.primary));
    let mut read_rows = Vec::new();
    for k in 1..=3 {
        let row = reads(&c, &order, k, p.readers.max(1), docs, p.seconds, p.seed)?;
        eprintln!("reads on {k} member(s): {:.0}/s", row.reads_per_sec);
        read_rows.push(row);
    }
    let catchup = catchup(&mut c, p, dir, ports[3], load_seconds)?;
    eprintln!(
        "new member caught up in {:.1} s (snapshot {:?} s)",
        catchup.total_seconds, catchup.snapshot_seconds
    );
    Ok(Report {
        members: 3,
        writes: vec![w1, wm],
        majority_over_w1: ratio,
        reads: read_rows,
        failovers,
        catchup,
        loadavg_before,
        loadavg_after: loadavg(),
        cpus: std::thread::available_parallelism().map_or(1, |n| n.get()),
    })
}

fn markdown(r: &Report, p: &Params) -> String {
    let mut md = format!(
        "3 `duet serve` members (replica set `{SET}`) on loopback, one machine ({} CPUs shared by the members and the clients; load average {} before, {} after), `--repl-snapshot-entries {}`; client: the mongodb Rust driver, one direct connection per thread; database `{WIRE_DB}`.\n\n",
        r.cpus, r.loadavg_before, r.loadavg_after, p.snapshot_entries
    );
    md.push_str(
        "| write concern | threads | inserts/s | p50 µs | p99 µs |\n|---|---:|---:|---:|---:|\n",
    );
    for w in &r.writes {
        md.push_str(&format!(
            "| w: {} | {} | {:.0} | {} | {} |\n",
            w.w, w.threads, w.inserts_per_sec, w.p50_us, w.p99_us
        ));
    }
    md.push_str(&format!(
        "\n`w: \"majority\"` / `w: 1` throughput ratio: **{:.2}**\n\n",
        r.majority_over_w1
    ));
    md.push_str("| members read | readers | reads/s | per member (primary first) | found |\n|---:|---:|---:|---|---:|\n");
    for x in &r.reads {
        let per: Vec<String> = x.per_member.iter().map(|v| format!("{v:.0}")).collect();
        md.push_str(&format!(
            "| {} | {} | {:.0} | {} | {:.1} % |\n",
            x.members,
            x.readers,
            x.reads_per_sec,
            per.join(" / "),
            100.0 * x.found as f64 / x.reads.max(1) as f64
        ));
    }
    md.push_str("\n| failover | killed member | new primary | kill → first write (s) |\n|---:|---:|---:|---:|\n");
    for f in &r.failovers {
        md.push_str(&format!(
            "| {} | {} | {} | {:.2} |\n",
            f.repeat, f.killed_member, f.new_primary, f.seconds_to_first_write
        ));
    }
    let cu = &r.catchup;
    md.push_str(&format!(
        "\n| catch-up | docs | load (s) | writes/s meanwhile | snapshot index | snapshot transfer + install (s) | log catch-up (s) | total (s) | reconfig reply (s) | docs primary / new |\n|---|---:|---:|---:|---:|---:|---:|---:|---:|---|\n| new member | {} | {:.1} | {} | {} | {} | {:.2} | {:.2} | {:.2} | {} / {} |\n",
        cu.docs,
        cu.load_seconds,
        cu.write_rate,
        cu.primary_snapshot_index,
        cu.snapshot_seconds.map_or("—".into(), |s| format!("{s:.2}")),
        cu.log_seconds,
        cu.total_seconds,
        cu.reconfig_seconds,
        cu.primary_docs,
        cu.new_member_docs,
    ));
    md
}
