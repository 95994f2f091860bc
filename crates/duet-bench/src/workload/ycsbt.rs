//! YCSB-T as KVell+ defines it (§5.2, after TicToc): every transaction
//! read-modify-writes `txn_size` (16) records chosen by the request
//! distribution (KVell+: uniform), through the engine's transactions
//! (`Database::begin`), under snapshot isolation or serializable; alone and
//! beside K analytic threads that loop a full-collection aggregate under a
//! snapshot strategy (the VLS/KVell+ set-up of `htap.rs`).
//!
//! Records are ~1 KB (KVell+'s average item size): an integer `_id`, a
//! counter `n` and `field0..field9` of 100 characters. One read-modify-write
//! reads the record, then sets `n` to the read value + 1 and rewrites one
//! field. Conflicting commits (WriteConflict, first committer wins) are
//! retried with the same keys after a jittered exponential backoff.
//!
//! Checks built in (why the counter exists):
//! - every committed transaction adds exactly `txn_size` to Σ `n` (repeated
//!   keys included: reads see the transaction's own writes), so after a run
//!   Σ `n` = `txn_size` × commits — a lost update would break it;
//! - an analytic scan that sees a consistent state sees whole transactions,
//!   so its Σ `n` is a multiple of `txn_size`; scans that are not ("torn":
//!   they saw part of a transaction) are counted. `none` may tear, `vls`,
//!   `olcp` and `cow` must not.

use std::ops::ControlFlow;
use std::time::{Duration, Instant};

use anyhow::{bail, Result};
use bson::{doc, Bson, Document};
use duetdb::{Database, Isolation, TxnOptions};
use rand::distributions::Alphanumeric;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use crate::gen::{Distribution, KeyChooser, KeySequence};
use crate::progress::note;
use crate::result::{case, Collector};
use crate::stats::{median, Latencies};
use crate::targets::Strategy;
use crate::workload::{timed_cell, CellClock};

/// The collection YCSB-T runs on.
pub const TABLE: &str = "ycsbt";
/// Fields of `FIELD_LENGTH` characters per record (KVell+'s ~1 KB items).
const FIELD_COUNT: usize = 10;
const FIELD_LENGTH: usize = 100;
/// Backoff after a conflict: 100 µs doubling per attempt, capped at 10 ms.
const BACKOFF_BASE_US: u64 = 100;
const BACKOFF_CAP_US: u64 = 10_000;

/// Isolation level of a transactional workload (`--isolation`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum IsolationArg {
    /// Snapshot isolation (first committer wins).
    Si,
    /// Serializable (snapshot isolation + read validation at commit).
    Serializable,
}

impl IsolationArg {
    pub fn name(self) -> &'static str {
        match self {
            IsolationArg::Si => "si",
            IsolationArg::Serializable => "serializable",
        }
    }
    pub fn options(self) -> TxnOptions {
        TxnOptions {
            isolation: match self {
                IsolationArg::Si => Isolation::Snapshot,
                IsolationArg::Serializable => Isolation::Serializable,
            },
            ..Default::default()
        }
    }
}

#[derive(Debug, Clone, serde::Serialize)]
pub struct Params {
    pub records: u64,
    /// Transaction client threads.
    pub threads: usize,
    pub seconds: f64,
    #[serde(serialize_with = "crate::targets::serialize_strategies")]
    pub strategies: Vec<Strategy>,
    /// Numbers of concurrent analytic threads (K).
    pub analytics: Vec<usize>,
    pub isolations: Vec<IsolationArg>,
    pub distribution: Distribution,
    /// Read-modify-writes per transaction.
    pub txn_size: usize,
    /// Attempts per transaction before it is given up (counted, not an error).
    pub max_attempts: u32,
    pub seed: u64,
    pub repeat: usize,
}

/// What one attempt loop did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Attempts {
    pub committed: bool,
    /// The body chose to roll back (nothing written; not a conflict).
    pub rolled_back: bool,
    /// Attempts that ended in a write conflict.
    pub conflicts: u32,
}

/// Per-thread transaction statistics.
#[derive(Default, Clone)]
pub struct TxnStats {
    pub commits: u64,
    pub conflicts: u64,
    /// Transactions given up after `max_attempts` conflicts.
    pub gave_up: u64,
    /// Transactions the body rolled back on purpose (TPC-C's 1 % of NewOrders).
    pub rollbacks: u64,
    /// Committed transactions that needed at least one retry.
    pub retried: u64,
    pub max_retries: u64,
    /// The `commit()` call of successful attempts.
    pub commit_lat: Latencies,
    /// First `begin` to successful commit, retries and backoff included.
    pub txn_lat: Latencies,
}

impl TxnStats {
    pub fn merge(&mut self, o: &TxnStats) {
        self.commits += o.commits;
        self.conflicts += o.conflicts;
        self.gave_up += o.gave_up;
        self.rollbacks += o.rollbacks;
        self.retried += o.retried;
        self.max_retries = self.max_retries.max(o.max_retries);
        self.commit_lat.merge(&o.commit_lat);
        self.txn_lat.merge(&o.txn_lat);
    }

    /// Account for one finished attempt loop that started at `started`.
    pub fn record(&mut self, a: Attempts, started: Instant) {
        self.conflicts += u64::from(a.conflicts);
        if a.committed {
            self.commits += 1;
            self.txn_lat.record(started.elapsed());
            if a.conflicts > 0 {
                self.retried += 1;
            }
            self.max_retries = self.max_retries.max(u64::from(a.conflicts));
        } else if a.rolled_back {
            self.rollbacks += 1;
        } else {
            self.gave_up += 1;
        }
    }
}

/// Sleep a uniformly jittered 0..=min(cap, base · 2^attempt) µs.
pub fn backoff(attempt: u32, rng: &mut impl Rng) {
    let cap = (BACKOFF_BASE_US << attempt.min(10)).min(BACKOFF_CAP_US);
    std::thread::sleep(Duration::from_micros(rng.gen_range(0..=cap)));
}

/// Run `body` in a transaction and commit it, retrying on write conflicts up
/// to `max_attempts` times. `body` returning `Ok(false)` rolls back on
/// purpose (nothing written). Errors other than conflicts are returned. The
/// commit call's latency of the successful attempt goes into `commit_lat`.
pub fn attempt_loop(
    db: &Database,
    options: TxnOptions,
    max_attempts: u32,
    rng: &mut impl Rng,
    commit_lat: &mut Latencies,
    mut body: impl FnMut(&mut duetdb::Transaction) -> duetdb::Result<bool>,
) -> duetdb::Result<Attempts> {
    let mut a = Attempts::default();
    for attempt in 0..max_attempts.max(1) {
        let mut tx = db.begin(options);
        let outcome = match body(&mut tx) {
            Ok(true) => {
                let t0 = Instant::now();
                let r = tx.commit();
                if r.is_ok() {
                    commit_lat.record(t0.elapsed());
                }
                r.map(|_| true)
            }
            Ok(false) => {
                tx.abort();
                a.rolled_back = true;
                return Ok(a);
            }
            Err(e) => Err(e),
        };
        match outcome {
            Ok(_) => {
                a.committed = true;
                return Ok(a);
            }
            Err(e) if e.is_transient_transaction_error() => {
                a.conflicts += 1;
                backoff(attempt, rng);
            }
            Err(e) => return Err(e),
        }
    }
    Ok(a)
}

fn record_doc(i: u64, rng: &mut impl Rng) -> Document {
    let mut d = doc! {"_id": i as i64, "n": 0i64};
    for f in 0..FIELD_COUNT {
        d.insert(format!("field{f}"), value(rng));
    }
    d
}

fn value(rng: &mut impl Rng) -> String {
    rng.sample_iter(&Alphanumeric)
        .take(FIELD_LENGTH)
        .map(char::from)
        .collect()
}

/// Drop and load `records` documents with `n = 0`.
pub fn load(db: &Database, records: u64, seed: u64) -> Result<()> {
    db.drop_collection(TABLE)?;
    let coll = db.collection(TABLE);
    let mut rng = StdRng::seed_from_u64(seed ^ 0x10ad);
    let mut i = 0;
    while i < records {
        let end = (i + 1000).min(records);
        coll.insert_many((i..end).map(|k| record_doc(k, &mut rng)), true)?;
        i = end;
    }
    Ok(())
}

/// Σ `n` over the table under `strategy` (the analytic query).
pub fn sum_n(db: &Database, strategy: Strategy) -> Result<i64> {
    let field = |d: &bson::RawDocument| match d.get("n") {
        Ok(Some(bson::RawBsonRef::Int64(v))) => Ok(v),
        Ok(Some(bson::RawBsonRef::Int32(v))) => Ok(i64::from(v)),
        _ => Err(duetdb::Error::BadValue("record without integer n".into())),
    };
    match strategy {
        Strategy::Olcp => {
            let (sum, _) = db.olcp_query(
                TABLE,
                &[],
                &[],
                || 0i64,
                |s, d, _| {
                    *s += field(d)?;
                    Ok(())
                },
                |a, b| a + b,
                duetdb::OlcpOptions { threads: 1 },
            )?;
            Ok(sum)
        }
        other => {
            let mut sum = 0i64;
            let mut failed = None;
            db.collection(TABLE)
                .scan_with(Document::new(), other, |d| match field(d) {
                    Ok(v) => {
                        sum += v;
                        ControlFlow::Continue(())
                    }
                    Err(e) => {
                        failed = Some(e);
                        ControlFlow::Break(())
                    }
                })?;
            match failed {
                Some(e) => Err(e.into()),
                None => Ok(sum),
            }
        }
    }
}

/// One YCSB-T transaction body: read-modify-write of every key in `keys`
/// (`fields[i]`: the field rewritten at `keys[i]` and its new value).
pub fn read_modify_write(
    tx: &mut duetdb::Transaction,
    keys: &[u64],
    fields: &[(usize, String)],
) -> duetdb::Result<bool> {
    for (k, (f, v)) in keys.iter().zip(fields) {
        let id = Bson::Int64(*k as i64);
        let Some(d) = tx.get(TABLE, &id)? else {
            return Err(duetdb::Error::Internal(format!(
                "record {k} missing (loaded 0..records)"
            )));
        };
        let n = match d.get("n") {
            Ok(Some(bson::RawBsonRef::Int64(v))) => v,
            _ => return Err(duetdb::Error::Internal(format!("record {k} without n"))),
        };
        tx.update_one(
            TABLE,
            doc! {"_id": *k as i64},
            doc! {"$set": {"n": n + 1, format!("field{f}"): v}},
        )?;
    }
    Ok(true)
}

struct CellOut {
    stats: TxnStats,
    wall_s: f64,
    scan_ms: Vec<f64>,
    torn: u64,
}

fn run_cell(
    db: &Database,
    p: &Params,
    iso: IsolationArg,
    strategy: Strategy,
    k: usize,
    seed: u64,
    quiet: bool,
) -> Result<CellOut> {
    let seq = KeySequence::new(p.records);
    let label = format!("ycsb-t {} {} K={k}", iso.name(), strategy.name());
    let run = timed_cell(
        (&label, p.seconds, quiet, "txn"),
        (p.threads.max(1), |t, clock: &CellClock| {
            let mut rng = StdRng::seed_from_u64(seed ^ (t as u64) << 8);
            let mut chooser = KeyChooser::new(p.distribution, p.records, 0);
            let mut st = TxnStats::default();
            let opts = iso.options();
            let mut n = 0u64;
            while !n.is_multiple_of(4) || clock.writing() {
                let keys: Vec<u64> = (0..p.txn_size)
                    .map(|_| chooser.next(&seq, &mut rng))
                    .collect();
                let fields: Vec<(usize, String)> = (0..p.txn_size)
                    .map(|_| (rng.gen_range(0..FIELD_COUNT), value(&mut rng)))
                    .collect();
                let t0 = Instant::now();
                let a = attempt_loop(
                    db,
                    opts,
                    p.max_attempts,
                    &mut rng,
                    &mut st.commit_lat,
                    |tx| read_modify_write(tx, &keys, &fields),
                )?;
                st.record(a, t0);
                n += 1;
                clock.count();
            }
            Ok(st)
        }),
        (k, |_, clock: &CellClock| {
            let mut durations = Vec::new();
            let mut torn = 0;
            while clock.reading(durations.len()) {
                let t0 = Instant::now();
                let sum = sum_n(db, strategy)?;
                durations.push(t0.elapsed().as_secs_f64() * 1000.0);
                if sum % p.txn_size.max(1) as i64 != 0 {
                    torn += 1;
                }
            }
            Ok((durations, torn))
        }),
    )?;
    let mut stats = TxnStats::default();
    for st in &run.writers {
        stats.merge(st);
    }
    Ok(CellOut {
        stats,
        wall_s: run.wall_s,
        scan_ms: run
            .readers
            .iter()
            .flat_map(|(d, _)| d.iter().copied())
            .collect(),
        torn: run.readers.iter().map(|(_, t)| t).sum(),
    })
}

/// The cells of a transactional workload (ycsb-t, tpcch), in run order: per
/// isolation level and K, one cell per strategy, and a single cell with no
/// strategy (recorded as `-`) where no analytic thread runs.
pub fn txn_cells(
    isolations: &[IsolationArg],
    analytics: &[usize],
    strategies: &[Strategy],
) -> Vec<(IsolationArg, usize, Option<Strategy>)> {
    let mut out = Vec::new();
    for &iso in isolations {
        for &k in analytics {
            if k == 0 {
                out.push((iso, k, None));
            } else {
                out.extend(strategies.iter().map(|&s| (iso, k, Some(s))));
            }
        }
    }
    out
}

/// Record the transaction figures of one cell.
pub fn add_txn_figures(
    col: &mut Collector,
    target: &str,
    c: &std::collections::BTreeMap<String, String>,
    prefix: &str,
    st: &TxnStats,
    wall_s: f64,
) {
    let wall = wall_s.max(1e-9);
    col.add(
        target,
        c,
        &format!("{prefix}commits_per_s"),
        st.commits as f64 / wall,
    );
    col.add(
        target,
        c,
        &format!("{prefix}conflicts_per_s"),
        st.conflicts as f64 / wall,
    );
    col.add(
        target,
        c,
        &format!("{prefix}retries_per_commit"),
        st.conflicts as f64 / st.commits.max(1) as f64,
    );
    col.add(
        target,
        c,
        &format!("{prefix}retries_max"),
        st.max_retries as f64,
    );
    col.add(target, c, &format!("{prefix}gave_up"), st.gave_up as f64);
    for (q, name) in [(0.50, "p50"), (0.95, "p95"), (0.99, "p99")] {
        col.add(
            target,
            c,
            &format!("{prefix}commit_latency_us_{name}"),
            st.commit_lat.quantile_us(q),
        );
    }
    for (q, name) in [(0.50, "p50"), (0.99, "p99")] {
        col.add(
            target,
            c,
            &format!("{prefix}txn_latency_us_{name}"),
            st.txn_lat.quantile_us(q),
        );
    }
}

/// Run every cell (isolation × K × strategy) `p.repeat` times, embedded.
/// K = 0 runs once per isolation (strategy `-`).
pub fn run(p: &Params, quiet: bool, col: &mut Collector, notes: &mut Vec<String>) -> Result<()> {
    if p.txn_size == 0 || p.records == 0 {
        bail!("ycsb-t needs --records > 0 and --txn-size > 0");
    }
    let target = "duetdb-embedded";
    for rep in 0..p.repeat.max(1) {
        let db = Database::in_memory();
        note(
            quiet,
            &format!(
                "[ycsb-t] loading {} records (run {}/{})",
                p.records,
                rep + 1,
                p.repeat
            ),
        );
        let t0 = Instant::now();
        load(&db, p.records, p.seed)?;
        col.add(
            target,
            &case(&[("phase", "load")]),
            "load_docs_per_s",
            p.records as f64 / t0.elapsed().as_secs_f64().max(1e-9),
        );
        let mut commits_total = 0u64;
        for (cell_no, (iso, k, strategy)) in
            (1u64..).zip(txn_cells(&p.isolations, &p.analytics, &p.strategies))
        {
            let seed = p.seed ^ (rep as u64) << 40 ^ cell_no << 16;
            let s = strategy.unwrap_or(Strategy::Cow);
            let cell = run_cell(&db, p, iso, s, k, seed, quiet)?;
            commits_total += cell.stats.commits;
            let sname = strategy.map_or("-", Strategy::name);
            let ks = k.to_string();
            let c = case(&[
                ("isolation", iso.name()),
                ("strategy", sname),
                ("analytics", &ks),
            ]);
            add_txn_figures(col, target, &c, "", &cell.stats, cell.wall_s);
            if k > 0 {
                col.add(target, &c, "scans_completed", cell.scan_ms.len() as f64);
                col.add(target, &c, "scan_ms_median", median(&cell.scan_ms));
                col.add(target, &c, "torn_scans", cell.torn as f64);
                if cell.torn > 0 && s != Strategy::None {
                    notes.push(format!(
                        "{target} {} {sname} K={k}: {} scans saw part of a transaction (not a consistent snapshot)",
                        iso.name(),
                        cell.torn
                    ));
                }
            }
            note(
                quiet,
                &format!(
                    "[ycsb-t] {} {sname} K={k}: {:.0} txn/s, {:.0} conflicts/s, commit p99 {:.0} µs, scan median {:.1} ms",
                    iso.name(),
                    cell.stats.commits as f64 / cell.wall_s.max(1e-9),
                    cell.stats.conflicts as f64 / cell.wall_s.max(1e-9),
                    cell.stats.commit_lat.quantile_us(0.99),
                    median(&cell.scan_ms)
                ),
            );
        }
        // No lost update: each commit added exactly txn_size to Σ n.
        let sum = sum_n(&db, Strategy::Cow)?;
        let want = commits_total as i64 * p.txn_size as i64;
        if sum != want {
            bail!("ycsb-t lost updates: Σ n = {sum} after {commits_total} commits of {} read-modify-writes (expected {want})", p.txn_size);
        }
        if rep == 0 {
            notes.push(format!(
                "checked after each run: Σ n = txn_size × committed transactions ({want} after run 1), so no update was lost"
            ));
        }
    }
    notes.push(format!(
        "{target}: in-memory database in this process; transactions are duetdb's (Database::begin, commit through the single writer); conflicts are retried with the same keys after a jittered exponential backoff (100 µs doubling, cap 10 ms), at most {} attempts",
        p.max_attempts
    ));
    Ok(())
}
