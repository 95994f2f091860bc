//! TPC-CH: T threads of TPC-C transactions (NewOrder, Payment, OrderStatus,
//! Delivery, StockLevel — AnKer's OLTP side, KVell+'s TPC-CH, the full TPC-C
//! mix) beside K analytic threads that loop
//! over TPC-H Q1, Q4 and Q17 under a snapshot strategy, on the
//! CH-benCHmark-style data set (`chbench.rs`, queries in `tpch.rs`); with
//! `--targets duet,postgres` the same run also drives the PostgreSQL peer
//! (`peers/postgres_tpcch.rs`: the same data, transactions as SQL under
//! REPEATABLE READ, the queries in SQL), so tpmC and query latency stand
//! side by side.
//!
//! Per (isolation, strategy, K) cell it reports tpmC (committed NewOrders per
//! minute), per-type throughput, conflicts, retries and latency, and per-query
//! latency. Transactions are drawn with TPC-C's mix weights (45 : 43 : 4 : 4 :
//! 4 by default) and their inputs with TPC-C's NURand;
//! a transaction that conflicts is retried with the same input.
//!
//! Correctness built in:
//! - Q4's inputs are never written by the mix (see `chbench.rs`), so every Q4
//!   answer during a run, under any strategy, must equal the one at load;
//!   differing answers are counted (`q4_wrong`);
//! - after each run, with the transactions stopped, TPC-C's consistency
//!   conditions (`chbench::check_consistency`, on PostgreSQL their SQL
//!   twin) must hold — a violation is an error, not a figure;
//! - with `verify`, each query under each strategy must then equal its
//!   `reference_*` evaluation over a static copy (an error otherwise).

use std::time::Instant;

use anyhow::{bail, Result};
use duetdb::Database;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use crate::chbench::{
    self, DeliveryInput, NewOrderInput, OrderStatusInput, PaymentInput, Scale, StockLevelInput,
    TpccRand, TxnEnd,
};
use crate::progress::note;
use crate::result::{case, Collector};
use crate::stats::{median, spread};
use crate::targets::Strategy;
use crate::tpch::{self, Answer, Q17Params, Query};
use crate::workload::ycsbt::{add_txn_figures, attempt_loop, txn_cells, IsolationArg, TxnStats};
use crate::workload::{timed_cell, CellClock};

#[derive(Debug, Clone, serde::Serialize)]
pub struct Params {
    /// Targets side by side in each run: `duet` (embedded) and `postgres`
    /// (`peers::postgres_tpcch`), in this order.
    pub targets: Vec<&'static str>,
    /// PostgreSQL connection of the `postgres` target.
    #[serde(skip)]
    pub pg: String,
    /// CH-benCHmark scale factor (warehouses; < 1 shrinks one warehouse).
    pub scale: f64,
    /// Transaction threads (T).
    pub threads: usize,
    pub seconds: f64,
    #[serde(serialize_with = "crate::targets::serialize_strategies")]
    pub strategies: Vec<Strategy>,
    /// Numbers of concurrent analytic threads (K).
    pub analytics: Vec<usize>,
    pub isolations: Vec<IsolationArg>,
    /// Weights of NewOrder, Payment, OrderStatus, Delivery, StockLevel.
    pub mix: [u32; 5],
    /// Map threads of each OLCP query.
    pub query_threads: usize,
    pub max_attempts: u32,
    /// Check every query under every strategy against the reference after each run.
    pub verify: bool,
    pub seed: u64,
    pub repeat: usize,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    NewOrder,
    Payment,
    OrderStatus,
    Delivery,
    StockLevel,
}

pub(crate) const KINDS: [(Kind, &str); 5] = [
    (Kind::NewOrder, "new_order"),
    (Kind::Payment, "payment"),
    (Kind::OrderStatus, "order_status"),
    (Kind::Delivery, "delivery"),
    (Kind::StockLevel, "stock_level"),
];

pub(crate) fn choose(mix: &[u32; 5], rng: &mut impl Rng) -> Kind {
    let total: u32 = mix.iter().sum();
    let mut x = rng.gen_range(0..total.max(1));
    for (w, (k, _)) in mix.iter().zip(KINDS) {
        if x < *w {
            return k;
        }
        x -= w;
    }
    Kind::NewOrder
}

/// What one cell measured, whichever target ran it.
pub(crate) struct CellOut {
    by_kind: [TxnStats; 5],
    wall_s: f64,
    /// Latencies in ms per query, in `Query::ALL` order.
    query_ms: Vec<(&'static str, Vec<f64>)>,
    q4_wrong: u64,
}

impl CellOut {
    /// Merge the clients' statistics (per transaction type) and the
    /// analytic threads' (query, ms) lists and Q4 mismatch counts.
    pub(crate) fn gather<'a>(
        clients: impl Iterator<Item = &'a [TxnStats; 5]>,
        readers: Vec<(Vec<(Query, f64)>, u64)>,
        wall_s: f64,
    ) -> CellOut {
        let mut by_kind: [TxnStats; 5] = Default::default();
        for out in clients {
            for (a, b) in by_kind.iter_mut().zip(out) {
                a.merge(b);
            }
        }
        let mut query_ms: Vec<(&'static str, Vec<f64>)> =
            Query::ALL.iter().map(|q| (q.name(), Vec::new())).collect();
        let mut q4_wrong = 0;
        for (done, wrong) in readers {
            for (q, ms) in done {
                if let Some((_, v)) = query_ms.iter_mut().find(|(n, _)| *n == q.name()) {
                    v.push(ms);
                }
            }
            q4_wrong += wrong;
        }
        CellOut {
            by_kind,
            wall_s,
            query_ms,
            q4_wrong,
        }
    }
}

/// The data a run shares between its cells.
struct Ctx<'a> {
    db: &'a Database,
    scale: Scale,
    rand: TpccRand,
    q17: Q17Params,
    q4_at_load: Answer,
}

fn run_cell(
    ctx: &Ctx,
    p: &Params,
    iso: IsolationArg,
    strategy: Strategy,
    k: usize,
    seed: u64,
    quiet: bool,
) -> Result<CellOut> {
    let label = format!("tpcch {} {} K={k}", iso.name(), strategy.name());
    let run = timed_cell(
        (&label, p.seconds, quiet, "txn"),
        (p.threads.max(1), |t, clock: &CellClock| {
            transactions(ctx, p, iso, seed ^ (t as u64) << 8, clock)
        }),
        (k, |t, clock: &CellClock| {
            let mut done: Vec<(Query, f64)> = Vec::new();
            let mut wrong = 0;
            let mut i = t;
            while clock.reading(done.len()) {
                let q = Query::ALL[i % Query::ALL.len()];
                i += 1;
                let t0 = Instant::now();
                let answer = tpch::run_query(ctx.db, q, strategy, &ctx.q17, p.query_threads)?;
                done.push((q, t0.elapsed().as_secs_f64() * 1000.0));
                if q == Query::Q4 && answer != ctx.q4_at_load {
                    wrong += 1;
                }
            }
            Ok((done, wrong))
        }),
    )?;
    Ok(CellOut::gather(run.writers.iter(), run.readers, run.wall_s))
}

/// One TPC-C client: the mix until the deadline.
fn transactions(
    ctx: &Ctx,
    p: &Params,
    iso: IsolationArg,
    seed: u64,
    clock: &CellClock,
) -> Result<[TxnStats; 5]> {
    let mut rng = StdRng::seed_from_u64(seed);
    let mut out: [TxnStats; 5] = Default::default();
    let opts = iso.options();
    while clock.writing() {
        let kind = choose(&p.mix, &mut rng);
        let t0 = Instant::now();
        let slot = KINDS.iter().position(|(k, _)| *k == kind).unwrap_or(0);
        let st = &mut out[slot];
        let mut attempt =
            |rng: &mut StdRng,
             body: &mut dyn FnMut(&mut duetdb::Transaction) -> duetdb::Result<bool>| {
                attempt_loop(ctx.db, opts, p.max_attempts, rng, &mut st.commit_lat, body)
            };
        let a = match kind {
            Kind::NewOrder => {
                let inp = NewOrderInput::random(&ctx.scale, &ctx.rand, &mut rng);
                attempt(&mut rng, &mut |tx| {
                    Ok(chbench::new_order(tx, &ctx.scale, &inp)? == TxnEnd::Commit)
                })?
            }
            Kind::Payment => {
                let inp = PaymentInput::random(&ctx.scale, &ctx.rand, &mut rng);
                attempt(&mut rng, &mut |tx| {
                    Ok(chbench::payment(tx, &inp)? == TxnEnd::Commit)
                })?
            }
            Kind::OrderStatus => {
                let inp = OrderStatusInput::random(&ctx.scale, &ctx.rand, &mut rng);
                attempt(&mut rng, &mut |tx| {
                    chbench::order_status(tx, &inp).map(|_| true)
                })?
            }
            Kind::Delivery => {
                let inp = DeliveryInput::random(&ctx.scale, &mut rng);
                attempt(&mut rng, &mut |tx| {
                    chbench::delivery(tx, &ctx.scale, &inp).map(|_| true)
                })?
            }
            Kind::StockLevel => {
                let inp = StockLevelInput::random(&ctx.scale, &mut rng);
                attempt(&mut rng, &mut |tx| {
                    chbench::stock_level(tx, &ctx.scale, &inp).map(|_| true)
                })?
            }
        };
        st.record(a, t0);
        clock.count();
    }
    Ok(out)
}

/// The `q` quantile of a small list (nearest rank).
fn quantile(v: &[f64], q: f64) -> f64 {
    if v.is_empty() {
        return 0.0;
    }
    let mut v = v.to_vec();
    v.sort_by(f64::total_cmp);
    v[((v.len() as f64 * q).ceil() as usize).clamp(1, v.len()) - 1]
}

/// After a run, transactions stopped: TPC-C's consistency conditions, and
/// (with `verify`) every query under every strategy against its reference.
fn check_quiesced(ctx: &Ctx, p: &Params) -> Result<()> {
    let snap = ctx.db.snapshot();
    let violations = chbench::check_consistency(&snap, &ctx.scale)?;
    if !violations.is_empty() {
        bail!(
            "TPC-C consistency violated after the run:\n  {}",
            violations.join("\n  ")
        );
    }
    if p.verify {
        let (items, orders, lines) = tpch::static_copy(&snap)?;
        for q in Query::ALL {
            let want = tpch::reference(q, &items, &orders, &lines, &ctx.q17);
            for s in [Strategy::None, Strategy::Vls, Strategy::Olcp, Strategy::Cow] {
                let got = tpch::run_query(ctx.db, q, s, &ctx.q17, p.query_threads)?;
                if got != want {
                    bail!(
                        "{} under {} differs from the reference on a quiesced database:\n got {got:?}\nwant {want:?}",
                        q.name(),
                        s.name()
                    );
                }
            }
        }
    }
    Ok(())
}

/// Run every cell (isolation × K × strategy) `p.repeat` times on a freshly
/// loaded data set. K = 0 runs once per isolation (strategy `-`).
/// Run every cell (isolation × K × strategy) `p.repeat` times on a freshly
/// loaded data set, for each target in turn within a run (duet, then
/// PostgreSQL). K = 0 runs once per isolation (strategy `-`); PostgreSQL
/// runs one cell per K > 0 (strategy `native`: its REPEATABLE READ
/// snapshot). A PostgreSQL server that cannot be reached skips its target
/// with a note, not an error.
pub fn run(p: &Params, quiet: bool, col: &mut Collector, notes: &mut Vec<String>) -> Result<()> {
    if p.mix.iter().all(|w| *w == 0) {
        bail!("tpcch: --mix needs a positive weight");
    }
    let scale = Scale::new(p.scale)?;
    let with_pg = p.targets.contains(&"postgres");
    let mut pg_available = with_pg;
    for rep in 0..p.repeat.max(1) {
        let mut duet_at_load = None;
        if p.targets.contains(&"duet") {
            duet_at_load = Some(duet_rep(p, &scale, rep, with_pg, quiet, col, notes)?);
        }
        if pg_available {
            pg_available =
                postgres_rep(p, &scale, rep, duet_at_load.as_deref(), quiet, col, notes)?;
        }
    }
    notes.push(format!(
        "Mix NewOrder : Payment : OrderStatus : Delivery : StockLevel = {} : {} : {} : {} : {} (TPC-C's weights: 45 : 43 : 4 : 4 : 4; Delivery serves all districts of a warehouse in one transaction); conflicts are retried with the same input (jittered exponential backoff, at most {} attempts); `aborts` counts attempts aborted by a conflict (duet: write conflict; PostgreSQL: serialization failure or deadlock); 1 % of NewOrders roll back on an unused item (TPC-C), counted as rollbacks.",
        p.mix[0], p.mix[1], p.mix[2], p.mix[3], p.mix[4], p.max_attempts
    ));
    notes.push(format!(
        "checked after every run with transactions stopped, on every target: TPC-C consistency conditions 1–4, payments = history, balances = payments and deliveries, delivered orders out of new_order with their lines dated{}",
        if p.verify {
            "; duet: Q1, Q4 and Q17 under none, vls, olcp and cow equal the reference evaluation; postgres: its Q1, Q4 and Q17 at load equal the reference evaluation of the generated rows"
        } else {
            ""
        }
    ));
    Ok(())
}

/// One run of the duet target; returns its answers at load (Q4 only unless
/// PostgreSQL runs too and compares its own with them).
fn duet_rep(
    p: &Params,
    scale: &Scale,
    rep: usize,
    all_at_load: bool,
    quiet: bool,
    col: &mut Collector,
    notes: &mut Vec<String>,
) -> Result<Vec<(Query, Answer)>> {
    let target = "duetdb-embedded";
    let db = Database::in_memory();
    note(
        quiet,
        &format!(
            "[tpcch] {target}: loading scale {} ({} warehouses, {} orders) (run {}/{})",
            p.scale,
            scale.warehouses,
            scale.orders(),
            rep + 1,
            p.repeat
        ),
    );
    let t0 = Instant::now();
    let loaded = chbench::load(&db, scale, p.seed)?;
    col.add(
        target,
        &case(&[("phase", "load")]),
        "load_s",
        t0.elapsed().as_secs_f64(),
    );
    let q17 = tpch::q17_params_for(&db)?;
    let mut at_load = Vec::new();
    for q in Query::ALL {
        if q == Query::Q4 || all_at_load {
            at_load.push((q, tpch::run_query(&db, q, duetdb::Strategy::Cow, &q17, 1)?));
        }
    }
    let q4_at_load = at_load
        .iter()
        .find(|(q, _)| *q == Query::Q4)
        .map(|(_, a)| a.clone())
        .ok_or_else(|| anyhow::anyhow!("Q4 at load missing"))?;
    let mut rng = StdRng::seed_from_u64(p.seed ^ (rep as u64) << 32);
    let ctx = Ctx {
        db: &db,
        scale: *scale,
        rand: TpccRand::new(scale, &mut rng),
        q17,
        q4_at_load,
    };
    if rep == 0 {
        notes.push(format!(
            "data set: {} warehouse(s), {} items, {} customers, {} orders, {} order lines, {} new_order rows; Q17 on {} / {}",
            scale.warehouses, loaded.items, loaded.customers, loaded.orders,
            loaded.order_lines, loaded.new_orders, ctx.q17.brand, ctx.q17.container
        ));
        notes.push(format!("{target}: in-memory database in this process."));
    }
    for (cell_no, (iso, k, strategy)) in
        (1u64..).zip(txn_cells(&p.isolations, &p.analytics, &p.strategies))
    {
        let seed = cell_seed(p, rep, cell_no);
        let s = strategy.unwrap_or(Strategy::Cow);
        let cell = run_cell(&ctx, p, iso, s, k, seed, quiet)?;
        record_cell(
            col,
            target,
            iso,
            strategy.map_or("-", Strategy::name),
            k,
            &cell,
        );
        if cell.q4_wrong > 0 {
            notes.push(format!(
                "{target} {} {} K={k}: {} Q4 answers differed from the answer at load (Q4's inputs are never written)",
                iso.name(),
                s.name(),
                cell.q4_wrong
            ));
        }
    }
    check_quiesced(&ctx, p)?;
    Ok(at_load)
}

/// The seed of a cell: the same for both targets' cell of (isolation, K).
fn cell_seed(p: &Params, rep: usize, cell_no: u64) -> u64 {
    p.seed ^ (rep as u64) << 40 ^ cell_no << 16
}

/// One run of the PostgreSQL target: false (and a note) when the server
/// cannot be reached, so later runs do not try again.
#[cfg(feature = "postgres")]
fn postgres_rep(
    p: &Params,
    scale: &Scale,
    rep: usize,
    duet_at_load: Option<&[(Query, Answer)]>,
    quiet: bool,
    col: &mut Collector,
    notes: &mut Vec<String>,
) -> Result<bool> {
    use crate::peers::postgres_tpcch as pg;
    let target = pg::TARGET;
    let mut c = match pg::connect(&p.pg) {
        Ok(c) => c,
        Err(e) => {
            let msg = format!("{target}: skipped, PostgreSQL is not available: {e:#}");
            eprintln!("[tpcch] {msg}");
            notes.push(msg);
            return Ok(false);
        }
    };
    note(
        quiet,
        &format!(
            "[tpcch] {target}: loading scale {} with COPY (run {}/{})",
            p.scale,
            rep + 1,
            p.repeat
        ),
    );
    let t0 = Instant::now();
    let loaded = pg::load(&mut c, scale, p.seed, p.verify)?;
    col.add(
        target,
        &case(&[("phase", "load")]),
        "load_s",
        t0.elapsed().as_secs_f64(),
    );
    pg::check_at_load(&loaded, duet_at_load)?;
    let q4_at_load = loaded
        .at_load
        .iter()
        .find(|(q, _)| *q == Query::Q4)
        .map(|(_, a)| a.clone())
        .ok_or_else(|| anyhow::anyhow!("Q4 at load missing"))?;
    let mut rng = StdRng::seed_from_u64(p.seed ^ (rep as u64) << 32);
    let ctx = pg::Ctx {
        conn: &p.pg,
        scale: *scale,
        rand: TpccRand::new(scale, &mut rng),
        q17: loaded.q17.clone(),
        q4_at_load,
    };
    if rep == 0 {
        let version: String = c.query_one("SHOW server_version", &[])?.try_get(0)?;
        notes.push(format!(
            "{target}: PostgreSQL {version} on loopback (scripts/peers/postgres.sh: shared_buffers 256MB, autovacuum on), the same generated rows loaded with COPY into tables with the same secondary indexes; each TPC-C transaction one SQL transaction (prepared statements, one connection per client) at REPEATABLE READ for `si` and SERIALIZABLE for `serializable`, synchronous_commit off; Q1, Q4 and Q17 in SQL on their own connections in read-only REPEATABLE READ transactions (strategy `native`), max_parallel_workers_per_gather = query threads − 1; its Q1, Q4 and Q17 at load equal duet's{}.",
            if duet_at_load.is_some() { " (checked in this run)" } else { " (not checked: duet did not run)" }
        ));
    }
    let mut seen: Vec<(IsolationArg, usize)> = Vec::new();
    for (cell_no, (iso, k, _)) in
        (1u64..).zip(txn_cells(&p.isolations, &p.analytics, &p.strategies))
    {
        // One cell per (isolation, K): PostgreSQL has one way to read a snapshot.
        if seen.contains(&(iso, k)) {
            continue;
        }
        seen.push((iso, k));
        let cell = pg::run_cell(&ctx, p, iso, k, cell_seed(p, rep, cell_no), quiet)?;
        let sname = if k == 0 { "-" } else { "native" };
        record_cell(col, target, iso, sname, k, &cell);
        if cell.q4_wrong > 0 {
            notes.push(format!(
                "{target} {} K={k}: {} Q4 answers differed from the answer at load (Q4's inputs are never written)",
                iso.name(),
                cell.q4_wrong
            ));
        }
    }
    let violations = pg::check_consistency(&mut c, scale)?;
    if !violations.is_empty() {
        bail!(
            "TPC-C consistency violated on {target} after the run:\n  {}",
            violations.join("\n  ")
        );
    }
    Ok(true)
}

#[cfg(not(feature = "postgres"))]
fn postgres_rep(
    _: &Params,
    _: &Scale,
    _: usize,
    _: Option<&[(Query, Answer)]>,
    _: bool,
    _: &mut Collector,
    notes: &mut Vec<String>,
) -> Result<bool> {
    let msg = "postgres: skipped, this build has no PostgreSQL client (cargo feature `postgres`)";
    eprintln!("[tpcch] {msg}");
    notes.push(msg.into());
    Ok(false)
}

fn record_cell(
    col: &mut Collector,
    target: &str,
    iso: IsolationArg,
    sname: &str,
    k: usize,
    cell: &CellOut,
) {
    let ks = k.to_string();
    let wall = cell.wall_s.max(1e-9);
    let base = [
        ("isolation", iso.name()),
        ("strategy", sname),
        ("analytics", ks.as_str()),
    ];
    let mut total = TxnStats::default();
    for st in &cell.by_kind {
        total.merge(st);
    }
    let c = case(&base);
    col.add(
        target,
        &c,
        "tpmC",
        cell.by_kind[0].commits as f64 * 60.0 / wall,
    );
    col.add(target, &c, "txn_per_s", total.commits as f64 / wall);
    col.add(target, &c, "conflicts_per_s", total.conflicts as f64 / wall);
    col.add(target, &c, "aborts", total.conflicts as f64);
    col.add(target, &c, "q4_wrong", cell.q4_wrong as f64);
    for (st, (_, name)) in cell.by_kind.iter().zip(KINDS) {
        let mut pairs = base.to_vec();
        pairs.push(("txn", name));
        let c = case(&pairs);
        add_txn_figures(col, target, &c, "", st, cell.wall_s);
        col.add(target, &c, "rollbacks", st.rollbacks as f64);
    }
    for (q, ms) in cell.query_ms.iter().filter(|(_, ms)| !ms.is_empty()) {
        let mut pairs = base.to_vec();
        pairs.push(("query", q));
        let c = case(&pairs);
        col.add(target, &c, "queries_completed", ms.len() as f64);
        col.add(target, &c, "query_ms_median", median(ms));
        col.add(target, &c, "query_ms_p95", quantile(ms, 0.95));
        col.add(target, &c, "query_ms_p99", quantile(ms, 0.99));
        col.add(target, &c, "query_ms_max", spread(ms).2);
    }
}
