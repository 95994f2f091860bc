//! `duet check hostile`: a bounded soak of hostile clients against a real
//! `duet serve` process, with a reference collection that must come through
//! intact.
//!
//! The run: start the server (this binary, `serve`, on a fresh data
//! directory, loopback, small limits), load a reference collection and a
//! big collection, then for `--seconds` let `--threads` attackers pick random
//! attacks (`attacks.rs`) while one writer keeps inserting acknowledged
//! (`j: true`) documents and a sampler watches the server's RSS, threads and
//! open files. At the end the server must: still answer a new connection,
//! hold every reference and acknowledged document unchanged, have created no
//! database for a read, have stayed under the RSS ceiling, stop cleanly on
//! SIGTERM and, restarted, hold the same data.
//!
//! Invariant: every violation is reported and fails the run; refusals are
//! counted, not judged (most attacks should be refused).

mod attacks;
mod client;

use std::collections::BTreeMap;
use std::io::Write;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use duetdb::bson::{doc, Bson, Document};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use attacks::{Outcome, ATTACKS, BIG_COLL, BIG_DB};
use client::{Conn, Reply};

const REF_DB: &str = "hostile_ref";
const REF_DOCS: i64 = 2_000;
const BIG_DOCS: i64 = 50_000;

/// Server flags of the soak: small limits so the attacks reach them quickly.
pub const SERVER_LIMITS: &[&str] = &[
    "--max-connections",
    "96",
    "--max-cursors",
    "2000",
    "--max-cursor-memory-mb",
    "64",
    "--idle-timeout-secs",
    "3",
    "--max-incomplete-message-mb",
    "32",
    "--query-memory-limit-bytes",
    "4000000",
];

/// `duet check hostile` options.
pub struct Options {
    pub seconds: u64,
    pub threads: usize,
    pub rss_ceiling_mb: u64,
    pub seed: u64,
    pub dir: Option<PathBuf>,
    /// Extra `duet serve` flags, after [`SERVER_LIMITS`].
    pub server_args: Vec<String>,
}

/// What the attack threads share.
pub struct Shared {
    addr: SocketAddr,
    /// Cursor ids other connections opened (bounded).
    cursors: Mutex<Vec<i64>>,
}

impl Shared {
    fn remember_cursor(&self, id: i64) {
        let mut c = self.cursors.lock().unwrap_or_else(|p| p.into_inner());
        if c.len() >= 4096 {
            c.swap_remove(0);
        }
        c.push(id);
    }

    fn some_cursor(&self, rng: &mut StdRng) -> Option<i64> {
        let c = self.cursors.lock().unwrap_or_else(|p| p.into_inner());
        (!c.is_empty()).then(|| c[rng.gen_range(0..c.len())])
    }
}

/// Per-attack tallies.
#[derive(Default)]
struct Tally {
    ok: u64,
    refused: BTreeMap<i32, u64>,
    closed: u64,
}

pub fn run(opts: Options, out: &mut impl Write) -> Result<()> {
    let dir = match &opts.dir {
        Some(d) => d.clone(),
        None => {
            std::env::temp_dir().join(format!("duet-hostile-{}-{}", std::process::id(), opts.seed))
        }
    };
    if dir.exists() {
        bail!("{} exists: give a fresh directory", dir.display());
    }
    std::fs::create_dir_all(&dir).with_context(|| format!("create {}", dir.display()))?;
    let data = dir.join("data");
    let mut server = Server::start(&dir, &data, &opts.server_args)?;
    writeln!(
        out,
        "hostile soak: server pid {} on {}, data in {}",
        server.pid(),
        server.addr,
        data.display()
    )?;
    load(server.addr)?;
    let baseline = Sample::of(server.pid());
    writeln!(
        out,
        "loaded {REF_DOCS} reference and {BIG_DOCS} big documents; server at {baseline}"
    )?;

    let shared = Arc::new(Shared {
        addr: server.addr,
        cursors: Mutex::new(Vec::new()),
    });
    let stop = Arc::new(AtomicBool::new(false));
    let sampler = spawn_sampler(server.pid(), stop.clone());
    let acked = Arc::new(AtomicU64::new(0));
    let writer = spawn_writer(server.addr, stop.clone(), acked.clone());
    let tallies = run_attackers(&opts, &shared)?;
    stop.store(true, Ordering::SeqCst);
    let peak = sampler
        .join()
        .map_err(|_| anyhow::anyhow!("sampler panicked"))?;
    let writer_error = writer
        .join()
        .map_err(|_| anyhow::anyhow!("writer panicked"))?;

    let mut violations = Vec::new();
    for (name, t) in &tallies {
        let refused: Vec<String> =
            t.1.refused
                .iter()
                .map(|(c, n)| format!("{c}×{n}"))
                .collect();
        writeln!(
            out,
            "  {name:<16} ok {:>6}  closed {:>6}  refused [{}]",
            t.1.ok,
            t.1.closed,
            refused.join(" ")
        )?;
        violations.extend(t.0.iter().cloned());
    }
    if let Some(e) = writer_error {
        violations.push(format!("the reference writer failed: {e}"));
    }
    let n_acked = acked.load(Ordering::SeqCst);
    // Connections of the attack are gone; the server must still answer.
    std::thread::sleep(Duration::from_millis(500));
    let after = Sample::of(server.pid());
    writeln!(
        out,
        "after the attack: {after}; peak during it: {peak}; {n_acked} acknowledged writes"
    )?;
    if peak.rss_mb > opts.rss_ceiling_mb {
        violations.push(format!(
            "RSS peaked at {} MB, above the {} MB ceiling",
            peak.rss_mb, opts.rss_ceiling_mb
        ));
    }
    verify(server.addr, n_acked, &data, &mut violations).context("verify before restart")?;

    server.stop()?;
    let mut server =
        Server::start(&dir, &data, &opts.server_args).context("restart after the soak")?;
    verify(server.addr, n_acked, &data, &mut violations).context("verify after restart")?;
    server.stop()?;

    if violations.is_empty() {
        writeln!(
            out,
            "PASS: no violation; reference intact before and after restart"
        )?;
        if opts.dir.is_none() {
            let _ = std::fs::remove_dir_all(&dir);
        }
        Ok(())
    } else {
        let mut grouped: BTreeMap<&str, usize> = BTreeMap::new();
        for v in &violations {
            *grouped.entry(v.as_str()).or_insert(0) += 1;
        }
        for (v, n) in grouped {
            writeln!(out, "VIOLATION (×{n}): {v}")?;
        }
        bail!(
            "{} violation(s); server log in {}",
            violations.len(),
            dir.join("server.log").display()
        )
    }
}

type Tallies = Vec<(&'static str, (Vec<String>, Tally))>;

fn run_attackers(opts: &Options, shared: &Arc<Shared>) -> Result<Tallies> {
    let deadline = Instant::now() + Duration::from_secs(opts.seconds);
    let mut handles = Vec::new();
    for t in 0..opts.threads {
        let shared = shared.clone();
        let seed = opts.seed.wrapping_mul(1_000_003).wrapping_add(t as u64);
        handles.push(std::thread::spawn(move || {
            let mut rng = StdRng::seed_from_u64(seed);
            let mut mine: Vec<(Vec<String>, Tally)> =
                ATTACKS.iter().map(|_| Default::default()).collect();
            while Instant::now() < deadline {
                let k = rng.gen_range(0..ATTACKS.len());
                let (name, attack) = ATTACKS[k];
                let (violations, tally) = &mut mine[k];
                match attack(&shared, &mut rng) {
                    Outcome::Ok => tally.ok += 1,
                    Outcome::Refused(c) => *tally.refused.entry(c).or_insert(0) += 1,
                    Outcome::Closed => tally.closed += 1,
                    Outcome::Violation(v) => violations.push(format!("{name}: {v}")),
                }
            }
            mine
        }));
    }
    let mut total: Tallies = ATTACKS
        .iter()
        .map(|(n, _)| (*n, Default::default()))
        .collect();
    for h in handles {
        let mine = h
            .join()
            .map_err(|_| anyhow::anyhow!("an attacker panicked"))?;
        for (k, (v, t)) in mine.into_iter().enumerate() {
            let (tv, tt) = &mut total[k].1;
            tv.extend(v);
            tt.ok += t.ok;
            tt.closed += t.closed;
            for (c, n) in t.refused {
                *tt.refused.entry(c).or_insert(0) += n;
            }
        }
    }
    Ok(total)
}

/// Load the reference and big collections, every write acknowledged with `j: true`.
fn load(addr: SocketAddr) -> Result<()> {
    let mut c = Conn::connect(addr, Duration::from_secs(30))?;
    for chunk in (0..REF_DOCS).collect::<Vec<_>>().chunks(500) {
        let docs: Vec<Document> = chunk.iter().map(|&i| reference_doc(i)).collect();
        expect_ok(
            c.run(
                REF_DB,
                doc! {"insert": "items", "documents": docs, "writeConcern": {"j": true}},
            )?,
            "load reference",
        )?;
    }
    let mut rng = StdRng::seed_from_u64(7);
    for start in (0..BIG_DOCS).step_by(1000) {
        let docs: Vec<Document> = (start..(start + 1000).min(BIG_DOCS))
            .map(|i| doc! {"_id": i, "r": rng.gen::<i64>(), "g": i % 97, "pad": "p".repeat(200)})
            .collect();
        expect_ok(
            c.run(BIG_DB, doc! {"insert": BIG_COLL, "documents": docs})?,
            "load big",
        )?;
    }
    Ok(())
}

fn reference_doc(i: i64) -> Document {
    doc! {"_id": i, "v": i.wrapping_mul(2_654_435_761), "s": format!("reference-{i}")}
}

fn expect_ok(r: Reply, what: &str) -> Result<Document> {
    match r {
        Reply::Ok(d) => Ok(d),
        Reply::Err(code, msg) => bail!("{what}: error {code}: {msg}"),
    }
}

/// Keep inserting acknowledged documents into `hostile_ref.log` until told to stop.
fn spawn_writer(
    addr: SocketAddr,
    stop: Arc<AtomicBool>,
    acked: Arc<AtomicU64>,
) -> std::thread::JoinHandle<Option<String>> {
    std::thread::spawn(move || {
        let mut c = match Conn::connect(addr, Duration::from_secs(30)) {
            Ok(c) => c,
            Err(e) => return Some(format!("{e:#}")),
        };
        while !stop.load(Ordering::SeqCst) {
            let n = acked.load(Ordering::SeqCst);
            let cmd = doc! {"insert": "log", "documents": [{"_id": n as i64}], "writeConcern": {"j": true}};
            match c.run(REF_DB, cmd) {
                Ok(Reply::Ok(r)) if r.get_i32("n").ok() == Some(1) => {
                    acked.store(n + 1, Ordering::SeqCst);
                }
                Ok(Reply::Ok(r)) => return Some(format!("insert {n} not written: {r}")),
                Ok(Reply::Err(code, msg)) => {
                    return Some(format!("insert {n}: error {code}: {msg}"))
                }
                Err(e) => return Some(format!("insert {n}: {e:#}")),
            }
        }
        None
    })
}

/// The checks of the end of the run (and after the restart).
fn verify(addr: SocketAddr, acked: u64, data: &Path, violations: &mut Vec<String>) -> Result<()> {
    let mut c = Conn::connect(addr, Duration::from_secs(30))
        .context("the server no longer accepts a connection")?;
    expect_ok(c.run("admin", doc! {"ping": 1})?, "ping")?;
    let items = read_all(&mut c, REF_DB, "items")?;
    let want: Vec<Document> = (0..REF_DOCS).map(reference_doc).collect();
    if items != want {
        violations.push(format!(
            "reference collection changed: {} documents, expected {REF_DOCS} unchanged",
            items.len()
        ));
    }
    let log = read_all(&mut c, REF_DB, "log")?;
    let ids: Vec<i64> = log.iter().filter_map(|d| d.get_i64("_id").ok()).collect();
    if ids.len() as u64 != acked || ids.iter().enumerate().any(|(i, id)| *id != i as i64) {
        violations.push(format!(
            "{acked} acknowledged log writes, {} found",
            ids.len()
        ));
    }
    let dbs = expect_ok(
        c.run("admin", doc! {"listDatabases": 1, "nameOnly": true})?,
        "listDatabases",
    )?;
    let ghosts_listed = dbs
        .get_array("databases")
        .map(|a| a.iter().filter(|d| matches!(d, Bson::Document(d) if d.get_str("name").is_ok_and(|n| n.starts_with("ghost_")))).count())
        .unwrap_or(0);
    let ghosts_on_disk = std::fs::read_dir(data)
        .map(|rd| {
            rd.flatten()
                .filter(|e| e.file_name().to_string_lossy().starts_with("ghost_"))
                .count()
        })
        .unwrap_or(0);
    if ghosts_listed + ghosts_on_disk > 0 {
        violations.push(format!(
            "reads created databases: {ghosts_listed} listed, {ghosts_on_disk} directories"
        ));
    }
    Ok(())
}

/// Every document of a collection in `_id` order.
fn read_all(c: &mut Conn, db: &str, coll: &str) -> Result<Vec<Document>> {
    let first = expect_ok(
        c.run(
            db,
            doc! {"find": coll, "sort": {"_id": 1}, "batchSize": 1000},
        )?,
        "find",
    )?;
    let mut cursor = first
        .get_document("cursor")
        .context("find reply without cursor")?
        .clone();
    let mut docs = Vec::new();
    let mut key = "firstBatch";
    loop {
        for d in cursor.get_array(key).context("cursor without batch")? {
            if let Bson::Document(d) = d {
                docs.push(d.clone());
            }
        }
        let id = cursor.get_i64("id").unwrap_or(0);
        if id == 0 {
            return Ok(docs);
        }
        let more = expect_ok(
            c.run(
                db,
                doc! {"getMore": id, "collection": coll, "batchSize": 1000},
            )?,
            "getMore",
        )?;
        cursor = more
            .get_document("cursor")
            .context("getMore reply without cursor")?
            .clone();
        key = "nextBatch";
    }
}

/// A server process of this binary.
struct Server {
    child: Child,
    addr: SocketAddr,
}

impl Server {
    fn start(dir: &Path, data: &Path, extra: &[String]) -> Result<Server> {
        let port = std::net::TcpListener::bind("127.0.0.1:0")?
            .local_addr()?
            .port();
        let addr: SocketAddr = format!("127.0.0.1:{port}").parse()?;
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(dir.join("server.log"))?;
        let exe = std::env::current_exe().context("cannot find the duet binary")?;
        let child = std::process::Command::new(exe)
            .args([
                "serve",
                "--bind",
                "127.0.0.1",
                "--port",
                &port.to_string(),
                "--log-level",
                "warn",
                "--data-dir",
            ])
            .arg(data)
            .args(SERVER_LIMITS)
            .args(extra)
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .context("spawn duet serve")?;
        let mut s = Server { child, addr };
        let deadline = Instant::now() + Duration::from_secs(60);
        while Instant::now() < deadline {
            if let Some(status) = s.child.try_wait()? {
                bail!(
                    "duet serve exited at start ({status}); see {}",
                    dir.join("server.log").display()
                );
            }
            if let Ok(mut c) = Conn::connect(addr, Duration::from_secs(2)) {
                if matches!(c.run("admin", doc! {"ping": 1}), Ok(Reply::Ok(_))) {
                    return Ok(s);
                }
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        let _ = s.child.kill();
        bail!("duet serve did not answer within 60 s")
    }

    fn pid(&self) -> u32 {
        self.child.id()
    }

    /// SIGTERM and wait for a clean exit.
    fn stop(&mut self) -> Result<()> {
        let status = std::process::Command::new("kill")
            .args(["-TERM", &self.pid().to_string()])
            .status()
            .context("run kill")?;
        if !status.success() {
            bail!("kill -TERM {} failed", self.pid());
        }
        let deadline = Instant::now() + Duration::from_secs(60);
        while Instant::now() < deadline {
            if let Some(status) = self.child.try_wait()? {
                if status.success() {
                    return Ok(());
                }
                bail!("duet serve exited with {status} on SIGTERM");
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = self.child.kill();
        bail!("duet serve did not stop within 60 s of SIGTERM")
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        if matches!(self.child.try_wait(), Ok(None)) {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// What the server process holds (from `/proc`).
#[derive(Debug, Clone, Copy, Default)]
struct Sample {
    rss_mb: u64,
    threads: u64,
    fds: u64,
}

impl Sample {
    fn of(pid: u32) -> Sample {
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
        let field = |name: &str| {
            status
                .lines()
                .find_map(|l| l.strip_prefix(name))
                .and_then(|v| v.split_whitespace().next())
                .and_then(|v| v.parse::<u64>().ok())
                .unwrap_or(0)
        };
        let fds = std::fs::read_dir(format!("/proc/{pid}/fd"))
            .map(|d| d.count() as u64)
            .unwrap_or(0);
        Sample {
            rss_mb: field("VmRSS:") / 1024,
            threads: field("Threads:"),
            fds,
        }
    }

    fn max(self, o: Sample) -> Sample {
        Sample {
            rss_mb: self.rss_mb.max(o.rss_mb),
            threads: self.threads.max(o.threads),
            fds: self.fds.max(o.fds),
        }
    }
}

impl std::fmt::Display for Sample {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "RSS {} MB, {} threads, {} open files",
            self.rss_mb, self.threads, self.fds
        )
    }
}

fn spawn_sampler(pid: u32, stop: Arc<AtomicBool>) -> std::thread::JoinHandle<Sample> {
    std::thread::spawn(move || {
        let mut peak = Sample::default();
        while !stop.load(Ordering::SeqCst) {
            peak = peak.max(Sample::of(pid));
            std::thread::sleep(Duration::from_millis(100));
        }
        peak
    })
}
