//! The SIGKILL campaign: a child process writes multi-document batches through
//! the engine (`fsync` durability) and reports each operation before (`B`) and
//! after (`A`) it returns; the parent kills it at a random moment, reopens the
//! directory, and checks the recovered state against a model.
//!
//! Checked after every kill:
//! - every acknowledged operation is there (a recovered state equals the model
//!   with all acknowledged operations, or with those plus the one in flight);
//! - no batch is half-applied: a batch's documents are all present or all
//!   absent, and all carry the generation of the same update;
//! - every index equals a rebuild from the documents
//!   (`CollectionState::check_invariants`).
//!
//! The child runs with tiny WAL segments and a low checkpoint trigger, and
//! checkpoints explicitly now and then, so kills land during appends, fsyncs,
//! segment rotation, checkpoint writing and the manifest switch.
//! Used by the test suite (`tests/durability_kill.rs`) and `duet check crash`.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::path::Path;
use std::process::Child;
use std::time::{Duration, Instant};

use bson::{doc, Bson};

use crate::api::{Database, IndexOptions};
use crate::durability::io::Rng;
use crate::durability::{Durability, DurabilityOptions};

const COLL: &str = "kill";

/// Options of the child's database: small files so everything rotates often.
pub fn child_options() -> DurabilityOptions {
    DurabilityOptions {
        mode: Durability::Fsync,
        segment_bytes: 16 << 10,
        checkpoint_wal_bytes: 96 << 10,
        checkpoint_interval: None,
        background_checkpoints: true,
        ..Default::default()
    }
}

/// One operation of the child.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Op {
    Insert { batch: String, docs: u64, gen: i64 },
    Update { batch: String, gen: i64 },
    Delete { batch: String },
    Checkpoint,
}

impl Op {
    fn render(&self) -> String {
        match self {
            Op::Insert { batch, docs, gen } => format!("I {batch} {docs} {gen}"),
            Op::Update { batch, gen } => format!("U {batch} {gen}"),
            Op::Delete { batch } => format!("D {batch}"),
            Op::Checkpoint => "C".into(),
        }
    }

    fn parse(s: &str) -> Option<Op> {
        let p: Vec<&str> = s.split_whitespace().collect();
        match p.as_slice() {
            ["I", b, n, g] => Some(Op::Insert {
                batch: b.to_string(),
                docs: n.parse().ok()?,
                gen: g.parse().ok()?,
            }),
            ["U", b, g] => Some(Op::Update {
                batch: b.to_string(),
                gen: g.parse().ok()?,
            }),
            ["D", b] => Some(Op::Delete {
                batch: b.to_string(),
            }),
            ["C"] => Some(Op::Checkpoint),
            _ => None,
        }
    }
}

/// The model: batch → (documents, generation).
pub type Model = BTreeMap<String, (u64, i64)>;

fn apply(model: &mut Model, op: &Op) {
    match op {
        Op::Insert { batch, docs, gen } => {
            model.insert(batch.clone(), (*docs, *gen));
        }
        Op::Update { batch, gen } => {
            if let Some(e) = model.get_mut(batch) {
                e.1 = *gen;
            }
        }
        Op::Delete { batch } => {
            model.remove(batch);
        }
        Op::Checkpoint => {}
    }
}

/// The child: open `dir`, then write until killed. Prints `READY`, then for
/// each operation `B <op>` before and `A` after it returned successfully.
pub fn child(dir: &Path, run: u64, seed: u64, out: &mut dyn Write) -> crate::error::Result<()> {
    let db = Database::open_with(dir, child_options())?;
    let c = db.collection(COLL);
    c.create_index(doc! {"batch": 1, "i": 1}, IndexOptions::default())?;
    let mut live: Vec<String> = c
        .distinct("batch", doc! {})?
        .into_iter()
        .filter_map(|b| b.as_str().map(String::from))
        .collect();
    let say = |out: &mut dyn Write, s: &str| {
        // The parent reads our stdout; if it is gone there is nobody to report to.
        let _ = writeln!(out, "{s}").and_then(|()| out.flush());
    };
    say(out, "READY");
    let mut rng = Rng::new(seed);
    for seq in 0u64.. {
        let gen = (run * 1_000_000 + seq) as i64;
        let roll = rng.below(100);
        // Keep the data bounded (about 40–80 batches) so a long campaign
        // keeps its kill rate: fewer inserts and more deletes as it grows.
        let insert_pct = match live.len() {
            0..=39 => 60,
            40..=79 => 40,
            _ => 10,
        };
        let update_pct = insert_pct + (100 - insert_pct) / 2;
        let op = if live.len() < 4 || roll < insert_pct {
            Op::Insert {
                batch: format!("r{run}s{seq}"),
                docs: 1 + rng.below(12),
                gen,
            }
        } else if roll < update_pct {
            Op::Update {
                batch: live[rng.below(live.len() as u64) as usize].clone(),
                gen,
            }
        } else if roll < 97 {
            let i = rng.below(live.len() as u64) as usize;
            Op::Delete {
                batch: live.swap_remove(i),
            }
        } else {
            Op::Checkpoint
        };
        say(out, &format!("B {}", op.render()));
        match &op {
            Op::Insert { batch, docs, gen } => {
                let pad = "x".repeat(rng.below(300) as usize);
                let docs: Vec<_> = (0..*docs)
                    .map(|i| {
                        doc! {"_id": format!("{batch}-{i}"), "batch": batch.clone(), "i": i as i64, "gen": *gen, "pad": pad.clone()}
                    })
                    .collect();
                c.insert_many(docs, true)?;
                live.push(batch.clone());
            }
            Op::Update { batch, gen } => {
                c.update_many(doc! {"batch": batch.clone()}, doc! {"$set": {"gen": *gen}})?;
            }
            Op::Delete { batch } => {
                c.delete_many(doc! {"batch": batch.clone()})?;
            }
            Op::Checkpoint => {
                db.checkpoint()?;
            }
        }
        say(out, "A");
    }
    Ok(())
}

/// The acknowledged operations of one child's output and the one in flight.
pub fn parse_log(text: &str) -> (Vec<Op>, Option<Op>) {
    let mut acked = Vec::new();
    let mut pending: Option<Op> = None;
    for line in text.lines() {
        if let Some(op) = line.strip_prefix("B ").and_then(Op::parse) {
            pending = Some(op);
        } else if line == "A" {
            if let Some(op) = pending.take() {
                acked.push(op);
            }
        }
    }
    (acked, pending)
}

/// Read the recovered state of `dir` as a model, checking batch atomicity and
/// index invariants.
pub fn read_state(dir: &Path) -> Result<(Model, Duration), String> {
    let opts = DurabilityOptions {
        background_checkpoints: false,
        ..child_options()
    };
    let t = Instant::now();
    let db = Database::open_with(dir, opts).map_err(|e| format!("reopen failed: {e}"))?;
    let took = t.elapsed();
    let c = db.collection(COLL);
    c.check_invariants()
        .map_err(|e| format!("index invariants broken after recovery: {e}"))?;
    let mut model = Model::new();
    let docs = c.find(doc! {}).run().map_err(|e| e.to_string())?;
    for d in docs {
        let batch = d.get_str("batch").map_err(|e| e.to_string())?.to_string();
        let gen = match d.get("gen") {
            Some(Bson::Int64(g)) => *g,
            other => return Err(format!("document without gen: {other:?}")),
        };
        let e = model.entry(batch.clone()).or_insert((0, gen));
        if e.1 != gen {
            return Err(format!(
                "batch {batch} is half-updated: generations {} and {gen}",
                e.1
            ));
        }
        e.0 += 1;
    }
    Ok((model, took))
}

/// Check the recovered state against `model` plus one child's log; on
/// success `model` becomes the recovered state.
pub fn verify(dir: &Path, model: &mut Model, log: &str) -> Result<Duration, String> {
    let (acked, inflight) = parse_log(log);
    let mut expected = model.clone();
    for op in &acked {
        apply(&mut expected, op);
    }
    let (actual, took) = read_state(dir)?;
    if actual == expected {
        *model = actual;
        return Ok(took);
    }
    if let Some(op) = &inflight {
        let mut with = expected.clone();
        apply(&mut with, op);
        if actual == with {
            *model = actual;
            return Ok(took);
        }
    }
    let missing: Vec<_> = expected
        .iter()
        .filter(|(k, v)| actual.get(*k) != Some(v))
        .take(5)
        .collect();
    let extra: Vec<_> = actual
        .iter()
        .filter(|(k, v)| expected.get(*k) != Some(v))
        .take(5)
        .collect();
    Err(format!(
        "recovered state is not a committed prefix containing every acknowledged write \
         ({} acked ops, in flight {inflight:?}); expected-but-different {missing:?}; unexpected {extra:?}",
        acked.len()
    ))
}

/// Figures of a campaign.
#[derive(Debug, Clone, Default)]
pub struct CampaignReport {
    pub kills: u64,
    pub acked_ops: u64,
    pub max_recovery: Duration,
    pub total_recovery: Duration,
}

/// Run kill cycles until `kills` kills or `deadline`, whichever first.
/// `spawn(run, seed)` starts a child writing to `dir` with stdout piped.
pub fn campaign(
    dir: &Path,
    kills: u64,
    deadline: Instant,
    seed: u64,
    max_delay: Duration,
    spawn: &mut dyn FnMut(u64, u64) -> std::io::Result<Child>,
) -> Result<CampaignReport, String> {
    let mut rng = Rng::new(seed);
    let mut model = Model::new();
    let mut report = CampaignReport::default();
    let mut run = 1u64;
    while report.kills < kills && Instant::now() < deadline {
        let mut child = spawn(run, rng.next_u64()).map_err(|e| format!("spawn: {e}"))?;
        let mut stdout = BufReader::new(child.stdout.take().ok_or("child stdout not piped")?);
        let mut text = String::new();
        let mut line = String::new();
        loop {
            line.clear();
            let n = stdout.read_line(&mut line).map_err(|e| e.to_string())?;
            if n == 0 {
                let _ = child.wait();
                let mut err = String::new();
                if let Some(mut e) = child.stderr.take() {
                    let _ = e.read_to_string(&mut err);
                }
                return Err(format!("child {run} exited before READY: {text}{err}"));
            }
            text.push_str(&line);
            // The test harness may print its own text before ours on that line.
            if line.trim_end().ends_with("READY") {
                break;
            }
        }
        let delay = rng.below(max_delay.as_micros().max(1) as u64);
        std::thread::sleep(Duration::from_micros(delay));
        child.kill().map_err(|e| format!("kill: {e}"))?; // SIGKILL on unix
        let _ = child.wait();
        stdout
            .read_to_string(&mut text)
            .map_err(|e| e.to_string())?;
        report.kills += 1;
        report.acked_ops += parse_log(&text).0.len() as u64;
        let took = verify(dir, &mut model, &text).map_err(|e| format!("after kill {run}: {e}"))?;
        report.max_recovery = report.max_recovery.max(took);
        report.total_recovery += took;
        run += 1;
    }
    Ok(report)
}
