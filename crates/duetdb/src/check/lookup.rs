//! The snapshot checker for pipelines that read two collections: does a
//! `$lookup` see the other collection at the same csn as the outer scan,
//! while writers keep changing both?
//!
//! Per round: a fresh database with collections `a` and `m` ("mirror"),
//! `docs` documents `{_id, v}` each. Writer threads run transactions that
//! change both together — `$inc` of `v` on the same `_id` in `a` and `m`,
//! inserts of a new pair, deletes of a pair — and log `(commit csn, op)`.
//! Scanner threads run `a.aggregate([$match on an _id range, $lookup m by
//! _id, $project v, the mirror's v and how many matched])` under the
//! strategy and record the pipeline's start csn, the csn it read `m` at and
//! every row. Afterwards the log is replayed in csn order into a model (one
//! map: both collections hold the same pairs at every commit) and each
//! result must equal the model at its start csn: every `_id` of the range
//! once, with its start `v`, its mirror found exactly once with the same
//! `v`, and `m` read at the start csn.
//!
//! A checker that cannot fail proves nothing: [`LookupMode::SeparateReads`]
//! joins the way a client (or MongoDB without a transaction) would — the
//! outer scan, then each mirror read from the latest state — and must report
//! violations (tests assert it), as must the `none` strategy.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use bson::{doc, Bson, Document};

use crate::api::{Database, DbOptions};
use crate::check::CheckReport;
use crate::error::Error;
use crate::snapshot::Strategy;

/// How the scanners join.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum LookupMode {
    /// A `$lookup` stage: the engine pins `m` at the scan's snapshot.
    #[default]
    Pipeline,
    /// Planted: the outer rows from a pipeline, then each mirror read
    /// separately from the latest state (what one snapshot per pipeline
    /// prevents).
    SeparateReads,
}

/// What to run.
#[derive(Debug, Clone)]
pub struct LookupCheckConfig {
    pub strategy: Strategy,
    pub scans: usize,
    pub writers: usize,
    pub docs: i64,
    pub scans_per_round: usize,
    pub rounds: u64,
    pub max_duration: Duration,
    pub seed: u64,
    pub mode: LookupMode,
    /// Stop at the first round with violations.
    pub stop_on_violation: bool,
}

impl Default for LookupCheckConfig {
    fn default() -> Self {
        LookupCheckConfig {
            strategy: Strategy::Auto,
            scans: 2,
            writers: 2,
            docs: 500,
            scans_per_round: 6,
            rounds: 4,
            max_duration: Duration::from_secs(10),
            seed: 1,
            mode: LookupMode::Pipeline,
            stop_on_violation: false,
        }
    }
}

#[derive(Debug, Clone, Copy)]
enum Op {
    Inc(i64),
    Insert(i64),
    Delete(i64),
}

struct Record {
    lo: i64,
    hi: i64,
    start_csn: u64,
    foreign_csn: Option<u64>,
    /// `(_id, v, mirror v, mirrors found)`.
    rows: Vec<(i64, i64, i64, i64)>,
    error: Option<String>,
}

/// Run the checker; `progress` is called after each round.
pub fn run(cfg: &LookupCheckConfig, mut progress: impl FnMut(&CheckReport)) -> CheckReport {
    let mut report = CheckReport::default();
    let started = Instant::now();
    while report.rounds < cfg.rounds && started.elapsed() < cfg.max_duration {
        round(cfg, report.rounds, &mut report);
        report.rounds += 1;
        progress(&report);
        if cfg.stop_on_violation && report.violations > 0 {
            break;
        }
    }
    report
}

fn round(cfg: &LookupCheckConfig, round_no: u64, report: &mut CheckReport) {
    let db = Database::with_options(
        "lookupcheck",
        None,
        DbOptions {
            default_strategy: cfg.strategy,
            ..DbOptions::default()
        },
    );
    for c in ["a", "m"] {
        let load = db
            .collection(c)
            .insert_many((0..cfg.docs).map(|i| doc! {"_id": i, "v": 0i64}), true);
        if let Err(e) = load {
            report.violations += 1;
            report
                .examples
                .push(format!("round {round_no}: load failed: {e}"));
            return;
        }
    }
    let load_csn = db.csn();
    let stop = AtomicBool::new(false);
    let next_id = AtomicI64::new(cfg.docs);
    let log: Mutex<Vec<(u64, Op)>> = Mutex::new(Vec::new());
    let records: Mutex<Vec<Record>> = Mutex::new(Vec::new());
    std::thread::scope(|s| {
        let writers: Vec<_> = (0..cfg.writers)
            .map(|w| {
                let (db, stop, next_id, log) = (&db, &stop, &next_id, &log);
                let seed = cfg.seed ^ (round_no << 24) ^ (w as u64 + 1).wrapping_mul(0x9E37);
                s.spawn(move || writer(db, stop, next_id, log, seed, cfg.docs))
            })
            .collect();
        let scanners: Vec<_> = (0..cfg.scans)
            .map(|k| {
                let (db, records) = (&db, &records);
                let seed = cfg.seed ^ (round_no << 32) ^ ((k as u64 + 1) << 8);
                s.spawn(move || scanner(cfg, db, records, seed))
            })
            .collect();
        for h in scanners {
            let _ = h.join();
        }
        stop.store(true, Ordering::Relaxed);
        for h in writers {
            report.writes += h.join().unwrap_or(0);
        }
    });
    let mut log = log.into_inner().unwrap_or_else(|e| e.into_inner());
    log.sort_by_key(|(csn, _)| *csn);
    let mut records = records.into_inner().unwrap_or_else(|e| e.into_inner());
    records.sort_by_key(|r| r.start_csn);
    verify(cfg, round_no, load_csn, &log, &records, report);
}

/// A small deterministic generator.
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n.max(1)
    }
}

/// Transactions that change `a` and `m` together; each commit's csn logged.
fn writer(
    db: &Database,
    stop: &AtomicBool,
    next_id: &AtomicI64,
    log: &Mutex<Vec<(u64, Op)>>,
    seed: u64,
    docs: i64,
) -> u64 {
    let mut rng = Rng(seed | 1);
    let mut mine = Vec::new();
    while !stop.load(Ordering::Relaxed) {
        let id = rng.below(docs as u64 + 64) as i64;
        let op = match rng.below(10) {
            0 => Op::Insert(next_id.fetch_add(1, Ordering::Relaxed)),
            1 => Op::Delete(id),
            _ => Op::Inc(id),
        };
        let mut tx = db.begin(Default::default());
        let applied = (|| -> Result<bool, Error> {
            let changed = match op {
                Op::Inc(id) => {
                    let r = tx.update_one("a", doc! {"_id": id}, doc! {"$inc": {"v": 1i64}})?;
                    tx.update_one("m", doc! {"_id": id}, doc! {"$inc": {"v": 1i64}})?;
                    r.matched > 0
                }
                Op::Insert(id) => {
                    tx.insert_one("a", doc! {"_id": id, "v": 0i64})?;
                    tx.insert_one("m", doc! {"_id": id, "v": 0i64})?;
                    true
                }
                Op::Delete(id) => {
                    let n = tx.delete_one("a", doc! {"_id": id})?;
                    tx.delete_one("m", doc! {"_id": id})?;
                    n > 0
                }
            };
            Ok(changed)
        })();
        match applied {
            Ok(true) => {
                if let Ok(info) = tx.commit() {
                    mine.push((info.csn, op));
                }
            }
            _ => tx.abort(),
        }
    }
    let n = mine.len() as u64;
    if let Ok(mut l) = log.lock() {
        l.extend(mine);
    }
    n
}

fn scanner(cfg: &LookupCheckConfig, db: &Database, records: &Mutex<Vec<Record>>, seed: u64) {
    let mut rng = Rng(seed | 1);
    for _ in 0..cfg.scans_per_round {
        let lo = rng.below(cfg.docs as u64) as i64;
        let hi = lo + 1 + rng.below(cfg.docs as u64) as i64;
        let rec = scan_once(cfg, db, lo, hi);
        if let Ok(mut r) = records.lock() {
            r.push(rec);
        }
    }
}

fn int(d: &Document, k: &str) -> i64 {
    match d.get(k) {
        Some(Bson::Int64(v)) => *v,
        Some(Bson::Int32(v)) => i64::from(*v),
        _ => -1,
    }
}

fn scan_once(cfg: &LookupCheckConfig, db: &Database, lo: i64, hi: i64) -> Record {
    let a = db.collection("a");
    let range = doc! {"$match": {"_id": {"$gte": lo, "$lt": hi}}};
    let mut rec = Record {
        lo,
        hi,
        start_csn: u64::MAX,
        foreign_csn: None,
        rows: Vec::new(),
        error: None,
    };
    let result = match cfg.mode {
        LookupMode::Pipeline => a.aggregate_with(
            vec![
                range,
                doc! {"$lookup": {"from": "m", "localField": "_id", "foreignField": "_id", "as": "mirror"}},
                // Slow the scan down a little so that commits land mid-scan.
                doc! {"$addFields": {"spin": {"$reduce": {"input": {"$range": [0, 20]}, "initialValue": 0, "in": {"$add": ["$$value", "$$this"]}}}}},
                doc! {"$project": {"v": 1, "mv": {"$first": "$mirror.v"}, "found": {"$size": "$mirror"}}},
            ],
            cfg.strategy,
        ),
        LookupMode::SeparateReads => a
            .aggregate_with(vec![range, doc! {"$project": {"v": 1}}], cfg.strategy)
            .and_then(|(rows, explain)| {
                let m = db.collection("m");
                let mut out = Vec::with_capacity(rows.len());
                for mut r in rows {
                    std::thread::yield_now();
                    let mirror = m.find_one(doc! {"_id": r.get("_id").cloned().unwrap_or(Bson::Null)})?;
                    r.insert("found", i64::from(mirror.is_some()));
                    r.insert("mv", mirror.map_or(Bson::Null, |d| d.get("v").cloned().unwrap_or(Bson::Null)));
                    out.push(r);
                }
                let mut explain = explain;
                explain.foreign_csn = Some(explain.start_csn);
                Ok((out, explain))
            }),
    };
    match result {
        Ok((rows, explain)) => {
            rec.start_csn = explain.start_csn;
            rec.foreign_csn = explain.foreign_csn;
            rec.rows = rows
                .iter()
                .map(|d| (int(d, "_id"), int(d, "v"), int(d, "mv"), int(d, "found")))
                .collect();
        }
        Err(e) => rec.error = Some(e.to_string()),
    }
    rec
}

fn apply(model: &mut BTreeMap<i64, i64>, op: Op) {
    match op {
        Op::Inc(id) => {
            if let Some(v) = model.get_mut(&id) {
                *v += 1;
            }
        }
        Op::Insert(id) => {
            model.insert(id, 0);
        }
        Op::Delete(id) => {
            model.remove(&id);
        }
    }
}

fn verify(
    cfg: &LookupCheckConfig,
    round_no: u64,
    load_csn: u64,
    log: &[(u64, Op)],
    records: &[Record],
    report: &mut CheckReport,
) {
    let mut model: BTreeMap<i64, i64> = (0..cfg.docs).map(|i| (i, 0)).collect();
    let mut applied = 0;
    for rec in records {
        report.scans_checked += 1;
        let mut problems: Vec<String> = Vec::new();
        if let Some(e) = &rec.error {
            problems.push(format!("failed: {e}"));
        } else if rec.start_csn < load_csn {
            problems.push(format!("started at csn {} before the load", rec.start_csn));
        } else {
            while applied < log.len() && log[applied].0 <= rec.start_csn {
                apply(&mut model, log[applied].1);
                applied += 1;
            }
            if rec.foreign_csn != Some(rec.start_csn) {
                problems.push(format!(
                    "m read at csn {:?}, the scan started at {}",
                    rec.foreign_csn, rec.start_csn
                ));
            }
            let mut got: BTreeMap<i64, usize> = BTreeMap::new();
            for &(id, v, mv, found) in &rec.rows {
                *got.entry(id).or_default() += 1;
                match model.get(&id) {
                    None => problems.push(format!("_id {id} absent at the start")),
                    Some(&want) => {
                        if v != want {
                            problems.push(format!("_id {id}: v {v}, start version {want}"));
                        }
                        if found != 1 || mv != want {
                            problems.push(format!(
                                "_id {id}: mirror found {found} times with v {mv}, start version {want}"
                            ));
                        }
                    }
                }
            }
            for (id, n) in &got {
                if *n > 1 {
                    problems.push(format!("_id {id} returned {n} times"));
                }
            }
            for id in model.range(rec.lo..rec.hi).map(|(id, _)| *id) {
                if !got.contains_key(&id) {
                    problems.push(format!("_id {id} missing"));
                }
            }
        }
        if !problems.is_empty() {
            report.violations += 1;
            if report.examples.len() < 8 {
                let n = problems.len();
                problems.truncate(3);
                report.examples.push(format!(
                    "round {round_no}: _id in [{}, {}) at csn {} ({} strategy, {:?}): {n} differences, e.g. {}",
                    rec.lo,
                    rec.hi,
                    rec.start_csn,
                    cfg.strategy,
                    cfg.mode,
                    problems.join("; ")
                ));
            }
        }
    }
}
