//! `duet bench recovery` (issue #20 item 6): how long a data directory of N
//! documents with 3 secondary indexes takes to open, split into phases, and
//! how long until `duet serve` on it answers a `ping`.
//!
//! Per size, in one run: a fresh data directory is filled through the
//! engine API (documents of ~250 bytes with three indexed fields: an
//! integer, a string, a double), the 3 indexes are created, a checkpoint is
//! written, `tail` updates are committed after it (so recovery replays a
//! WAL tail too), and the engine is closed. Then the directory is opened
//! again in this process (`Engine::open_with`), timed as a whole and by the
//! phases the recovery report gives; closed; and finally (unless `serve` is
//! off) the `duet` binary running this bench is started as
//! `duet serve --data-dir <dir>` on a free loopback port, and the time from
//! spawning it to the first `ping` answered is measured; the child is then
//! killed.
//!
//! Invariants: every directory this bench writes is under `dir` and removed
//! after its size; the child server is always killed and reaped; recovery
//! must find every document (checked by count), or the run fails.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};
use bson::{doc, Document};
use duetdb::{DurabilityOptions, Engine, IndexOptions};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde::Serialize;

const DB: &str = "bench";
const COLL: &str = "recovery";
/// The longest a spawned server may take to answer its first `ping`.
const SERVE_TIMEOUT: Duration = Duration::from_secs(600);

/// One size's figures.
#[derive(Debug, Clone, Serialize, serde::Deserialize)]
pub struct Row {
    pub documents: u64,
    pub indexes: usize,
    pub data_mb: f64,
    pub checkpoint_mb: f64,
    pub fill_secs: f64,
    pub checkpoint_secs: f64,
    pub wal_records: u64,
    /// `Engine::open_with` on the directory, whole.
    pub open_secs: f64,
    /// The phases the recovery report gives (seconds).
    pub phases: Phases,
    /// From spawning `duet serve` to its first `ping` answered; `None`
    /// when not measured.
    pub serve_ready_secs: Option<f64>,
}

/// Recovery's phases, in seconds (see `RecoveryReport::phases`).
#[derive(Debug, Clone, Default, Serialize, serde::Deserialize)]
#[serde(default)]
pub struct Phases {
    /// The recovery report's `elapsed` (checkpoint load + WAL replay).
    pub total: f64,
    /// Reading the checkpoint file.
    pub read: f64,
    /// Walking its frames (headers, counts, small frames' checksums).
    pub frames: f64,
    /// Documents frames: checksums, validation, copies (parallel).
    pub decode: f64,
    /// Heap, `_id` and secondary indexes (side by side).
    pub build: f64,
    /// Replaying the WAL after the checkpoint.
    pub replay: f64,
    /// Secondary indexes built in the order the checkpoint stored (no sort).
    pub indexes_in_stored_order: u32,
    /// Secondary indexes whose entries were sorted.
    pub indexes_sorted: u32,
    /// `_id` indexes placed by the order the checkpoint stored (no sort).
    pub ids_in_stored_order: u32,
    /// `_id` indexes whose ids were sorted.
    pub ids_sorted: u32,
}

/// What to run.
#[derive(Debug, Clone)]
pub struct Params {
    pub sizes: Vec<u64>,
    /// Updates committed after the checkpoint (the WAL tail replayed).
    pub tail: u64,
    pub seed: u64,
    /// Where the data directories go (a fresh subdirectory per size).
    pub dir: PathBuf,
    /// Measure `duet serve` too (needs this process to be the `duet` binary).
    pub serve: bool,
    /// Keep each data directory (and reuse one a previous `keep` run left,
    /// skipping the build): to profile the open alone.
    pub keep: bool,
}

fn opts() -> DurabilityOptions {
    DurabilityOptions {
        // The bench writes its one checkpoint itself.
        background_checkpoints: false,
        ..Default::default()
    }
}

fn mb(bytes: u64) -> f64 {
    bytes as f64 / (1024.0 * 1024.0)
}

/// Fill `dir` with `n` documents, 3 indexes, a checkpoint and `tail` updates.
fn build(dir: &Path, n: u64, tail: u64, seed: u64, row: &mut Row) -> Result<()> {
    let engine = Engine::open_with(dir, opts())?;
    let db = engine.database(DB)?;
    let c = db.collection(COLL);
    let mut rng = StdRng::seed_from_u64(seed);
    let t = Instant::now();
    let mut start = 0u64;
    while start < n {
        let end = (start + 10_000).min(n);
        let docs: Vec<Document> = (start..end)
            .map(|i| {
                doc! {
                    "_id": i as i64,
                    "a": rng.gen_range(0..1_000_000i64),
                    "b": format!("user{:06}", rng.gen_range(0..100_000u32)),
                    "c": rng.gen::<f64>(),
                    "pad": "x".repeat(180),
                }
            })
            .collect();
        c.insert_many(docs, true)?;
        start = end;
    }
    for field in ["a", "b", "c"] {
        c.create_index(doc! {field: 1}, IndexOptions::default())?;
    }
    row.fill_secs = t.elapsed().as_secs_f64();
    let t = Instant::now();
    let info = db.checkpoint()?.ok_or_else(|| anyhow!("no checkpoint"))?;
    row.checkpoint_secs = t.elapsed().as_secs_f64();
    row.checkpoint_mb = mb(info.bytes);
    for _ in 0..tail {
        let id = rng.gen_range(0..n.max(1)) as i64;
        c.update_one(
            doc! {"_id": id},
            doc! {"$set": {"a": rng.gen_range(0..1_000_000i64)}},
        )?;
    }
    row.wal_records = tail;
    Ok(())
}

/// Open `dir`; the whole time and the phases.
fn open(dir: &Path, n: u64, row: &mut Row) -> Result<()> {
    let t = Instant::now();
    let engine = Engine::open_with(dir, opts())?;
    row.open_secs = t.elapsed().as_secs_f64();
    let db = engine.database(DB)?;
    let report = db
        .recovery_report()
        .cloned()
        .ok_or_else(|| anyhow!("no recovery report"))?;
    let c = &report.phases.checkpoint;
    row.phases = Phases {
        total: report.elapsed.as_secs_f64(),
        read: c.read.as_secs_f64(),
        frames: c.frames.as_secs_f64(),
        decode: c.decode.as_secs_f64(),
        build: c.build.as_secs_f64(),
        replay: report.phases.replay.as_secs_f64(),
        indexes_in_stored_order: c.indexes_in_stored_order,
        indexes_sorted: c.indexes_sorted,
        ids_in_stored_order: c.ids_in_stored_order,
        ids_sorted: c.ids_sorted,
    };
    let stats = db.collection(COLL).stats()?;
    if stats.count != n {
        bail!("recovered {} documents of {n}", stats.count);
    }
    row.data_mb = mb(stats.data_bytes);
    Ok(())
}

/// A free loopback port (bound, read, released: another process could take
/// it in between; the spawn then fails and says so).
fn free_port() -> Result<u16> {
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

/// An OP_MSG `ping` (kind-0 section only).
fn ping_frame() -> Result<Vec<u8>> {
    let mut body = Vec::new();
    doc! {"ping": 1, "$db": "admin"}.to_writer(&mut body)?;
    let len = 16 + 4 + 1 + body.len();
    let mut out = Vec::with_capacity(len);
    out.extend_from_slice(&(len as i32).to_le_bytes());
    out.extend_from_slice(&1i32.to_le_bytes());
    out.extend_from_slice(&0i32.to_le_bytes());
    out.extend_from_slice(&2013i32.to_le_bytes());
    out.extend_from_slice(&0u32.to_le_bytes());
    out.push(0);
    out.extend_from_slice(&body);
    Ok(out)
}

/// One `ping` round trip on a new connection; `Ok(false)` while the server
/// does not accept connections yet.
fn ping(addr: SocketAddr) -> Result<bool> {
    let Ok(mut s) = TcpStream::connect_timeout(&addr, Duration::from_millis(200)) else {
        return Ok(false);
    };
    s.set_read_timeout(Some(Duration::from_secs(30)))?;
    s.write_all(&ping_frame()?)?;
    let mut head = [0u8; 16];
    s.read_exact(&mut head)?;
    let len = i32::from_le_bytes([head[0], head[1], head[2], head[3]]);
    if !(21..=16_000_000).contains(&len) {
        bail!("ping reply length {len}");
    }
    let mut rest = vec![0u8; len as usize - 16];
    s.read_exact(&mut rest)?;
    let reply = Document::from_reader(&rest[5..])?;
    if reply.get_f64("ok").ok() != Some(1.0) && reply.get_i32("ok").ok() != Some(1) {
        bail!("ping answered {reply}");
    }
    Ok(true)
}

/// Kills and reaps the child server however the measurement ends.
struct Server(Child);

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Seconds from spawning `duet serve --data-dir dir` to its first `ping`.
fn serve_ready(dir: &Path) -> Result<f64> {
    let exe = std::env::current_exe().context("locating the duet binary")?;
    let port = free_port()?;
    let addr: SocketAddr = ([127, 0, 0, 1], port).into();
    let t = Instant::now();
    let mut server = Server(
        Command::new(&exe)
            .arg("serve")
            .arg("--data-dir")
            .arg(dir)
            .arg("--port")
            .arg(port.to_string())
            .arg("--log-level")
            .arg("warn")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .with_context(|| format!("spawning {} serve", exe.display()))?,
    );
    loop {
        if ping(addr)? {
            return Ok(t.elapsed().as_secs_f64());
        }
        if let Some(status) = server.0.try_wait()? {
            bail!("duet serve exited before answering: {status}");
        }
        if t.elapsed() > SERVE_TIMEOUT {
            bail!("duet serve did not answer within {SERVE_TIMEOUT:?}");
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Run every size; returns the rows and a Markdown table.
pub fn run(p: &Params) -> Result<(Vec<Row>, String)> {
    let mut rows = Vec::new();
    for &n in &p.sizes {
        let dir = p.dir.join(format!("recovery-{n}"));
        let built = p.dir.join(format!("recovery-{n}.built"));
        let reuse = p.keep && built.exists() && dir.exists();
        if !reuse {
            let _ = std::fs::remove_file(&built);
            let _ = std::fs::remove_dir_all(&dir);
        }
        let mut row = Row {
            documents: n,
            indexes: 3,
            data_mb: 0.0,
            checkpoint_mb: 0.0,
            fill_secs: 0.0,
            checkpoint_secs: 0.0,
            wal_records: 0,
            open_secs: 0.0,
            phases: Phases::default(),
            serve_ready_secs: None,
        };
        let result = (|| -> Result<()> {
            if reuse {
                row = serde_json::from_str(&std::fs::read_to_string(&built)?)?;
            } else {
                build(&dir, n, p.tail, p.seed, &mut row)?;
                if p.keep {
                    std::fs::write(&built, serde_json::to_string(&row)?)?;
                }
            }
            open(&dir, n, &mut row)?;
            if p.serve {
                row.serve_ready_secs = Some(serve_ready(&dir)?);
            }
            Ok(())
        })();
        if !p.keep {
            let _ = std::fs::remove_dir_all(&dir);
        }
        result?;
        eprintln!("{}", line(&row));
        rows.push(row);
    }
    let mut md = String::from(header());
    for r in &rows {
        md.push_str(&line(r));
        md.push('\n');
    }
    Ok((rows, md))
}

/// The recovery-vs-size chart (issue #20: "recovery of 10 M documents is
/// measured and charted"): seconds against millions of documents, one line
/// each for the whole open, its phases and the time until `duet serve`
/// answers a `ping` (when measured).
pub fn chart(rows: &[Row], path: &Path) -> Result<()> {
    let m = |r: &Row| r.documents as f64 / 1e6;
    let line = |name: &str, f: &dyn Fn(&Row) -> Option<f64>| {
        let points: Vec<(f64, f64)> = rows.iter().filter_map(|r| Some((m(r), f(r)?))).collect();
        (name.to_string(), points)
    };
    let mut series = vec![
        line("open (whole)", &|r| Some(r.open_secs)),
        line("build (heap + indexes)", &|r| Some(r.phases.build)),
        line("decode", &|r| Some(r.phases.decode)),
        line("read", &|r| Some(r.phases.read)),
        line("WAL replay", &|r| Some(r.phases.replay)),
        line("duet serve ready", &|r| r.serve_ready_secs),
    ];
    series.retain(|(_, p)| !p.is_empty());
    crate::plot::lines(
        path,
        "Recovery time vs size (3 secondary indexes)",
        "documents (millions)",
        "seconds",
        &series,
    )
}

fn header() -> &'static str {
    "| documents | data MB | checkpoint MB | WAL records | open (s) | recovery (s) | read | frames | decode | build | replay | indexes stored/sorted | serve ready (s) |\n|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n"
}

fn line(r: &Row) -> String {
    let ph = &r.phases;
    format!(
        "| {} | {:.0} | {:.0} | {} | {:.2} | {:.2} | {:.2} | {:.2} | {:.2} | {:.2} | {:.2} | {}/{} | {} |",
        r.documents,
        r.data_mb,
        r.checkpoint_mb,
        r.wal_records,
        r.open_secs,
        ph.total,
        ph.read,
        ph.frames,
        ph.decode,
        ph.build,
        ph.replay,
        ph.indexes_in_stored_order,
        ph.indexes_sorted,
        r.serve_ready_secs
            .map_or_else(|| "-".to_string(), |s| format!("{s:.2}")),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The benchmark as a tiny test (no bit-rot): a few documents, no
    /// server; recovery finds them all.
    #[test]
    fn tiny_recovery_bench_runs() {
        let dir = std::env::temp_dir().join(format!("duet-recovery-bench-{}", std::process::id()));
        let p = Params {
            sizes: vec![500],
            tail: 20,
            seed: 1,
            dir: dir.clone(),
            serve: false,
            keep: false,
        };
        let (rows, md) = run(&p).expect("bench");
        let _ = std::fs::remove_dir_all(&dir);
        assert_eq!(rows.len(), 1);
        assert_eq!(rows[0].wal_records, 20);
        assert!(rows[0].checkpoint_mb > 0.0);
        assert!(md.contains("| 500 |"));
        // The checkpoint stored the 3 indexes' entry orders: no sort at open.
        assert_eq!(rows[0].phases.indexes_in_stored_order, 3);
        assert_eq!(rows[0].phases.indexes_sorted, 0);
        // And the `_id` index's: its ids were placed, not sorted.
        assert_eq!(rows[0].phases.ids_in_stored_order, 1);
        assert_eq!(rows[0].phases.ids_sorted, 0);
        // The chart draws from the rows.
        let png = dir.with_extension("png");
        chart(&rows, &png).expect("chart");
        let size = std::fs::metadata(&png).map(|m| m.len()).unwrap_or(0);
        let _ = std::fs::remove_file(&png);
        assert!(size > 1000, "chart of {size} bytes");
    }
}
