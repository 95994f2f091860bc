//! TPC-CH: T threads of TPC-C transactions (NewOrder, Payment, OrderStatus,
//! Delivery, StockLevel — AnKer's OLTP side, KVell+'s TPC-CH, the full TPC-C
//! mix) beside K analytic threads that loop
//! over TPC-H Q1, Q4 and Q17 under a snapshot strategy, on the
//! CH-benCHmark-style data set (`chbench.rs`, queries in `tpch.rs`).
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
//!   conditions (`chbench::check_consistency`) must hold — a violation is an
//!   error, not a figure;
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
enum Kind {
    NewOrder,
    Payment,
    OrderStatus,
    Delivery,
    StockLevel,
}

const KINDS: [(Kind, &str); 5] = [
    (Kind::NewOrder, "new_order"),
    (Kind::Payment, "payment"),
    (Kind::OrderStatus, "order_status"),
    (Kind::Delivery, "delivery"),
    (Kind::StockLevel, "stock_level"),
];

fn choose(mix: &[u32; 5], rng: &mut impl Rng) -> Kind {
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

#[derive(Default)]
struct ClientOut {
    by_kind: [TxnStats; 5],
}

struct CellOut {
    by_kind: [TxnStats; 5],
    wall_s: f64,
    /// Latencies in ms per query, in `Query::ALL` order.
    query_ms: Vec<(&'static str, Vec<f64>)>,
    q4_wrong: u64,
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
    let mut by_kind: [TxnStats; 5] = Default::default();
    for out in &run.writers {
        for (a, b) in by_kind.iter_mut().zip(&out.by_kind) {
            a.merge(b);
        }
    }
    let mut query_ms: Vec<(&'static str, Vec<f64>)> =
        Query::ALL.iter().map(|q| (q.name(), Vec::new())).collect();
    let mut q4_wrong = 0;
    for (done, wrong) in run.readers {
        for (q, ms) in done {
            if let Some((_, v)) = query_ms.iter_mut().find(|(n, _)| *n == q.name()) {
                v.push(ms);
            }
        }
        q4_wrong += wrong;
    }
    Ok(CellOut {
        by_kind,
        wall_s: run.wall_s,
        query_ms,
        q4_wrong,
    })
}

/// One TPC-C client: the mix until the deadline.
fn transactions(
    ctx: &Ctx,
    p: &Params,
    iso: IsolationArg,
    seed: u64,
    clock: &CellClock,
) -> Result<ClientOut> {
    let mut rng = StdRng::seed_from_u64(seed);
    let mut out = ClientOut::default();
    let opts = iso.options();
    while clock.writing() {
        let kind = choose(&p.mix, &mut rng);
        let t0 = Instant::now();
        let slot = KINDS.iter().position(|(k, _)| *k == kind).unwrap_or(0);
        let st = &mut out.by_kind[slot];
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

/// The 95th percentile of a small list (nearest rank).
fn p95(v: &[f64]) -> f64 {
    if v.is_empty() {
        return 0.0;
    }
    let mut v = v.to_vec();
    v.sort_by(f64::total_cmp);
    v[((v.len() as f64 * 0.95).ceil() as usize).clamp(1, v.len()) - 1]
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
pub fn run(p: &Params, quiet: bool, col: &mut Collector, notes: &mut Vec<String>) -> Result<()> {
    if p.mix.iter().all(|w| *w == 0) {
        bail!("tpcch: --mix needs a positive weight");
    }
    let scale = Scale::new(p.scale)?;
    let target = "duetdb-embedded";
    for rep in 0..p.repeat.max(1) {
        let db = Database::in_memory();
        note(
            quiet,
            &format!(
                "[tpcch] loading scale {} ({} warehouses, {} orders) (run {}/{})",
                p.scale,
                scale.warehouses,
                scale.orders(),
                rep + 1,
                p.repeat
            ),
        );
        let t0 = Instant::now();
        let loaded = chbench::load(&db, &scale, p.seed)?;
        col.add(
            target,
            &case(&[("phase", "load")]),
            "load_s",
            t0.elapsed().as_secs_f64(),
        );
        let q17 = tpch::q17_params_for(&db)?;
        let q4_at_load = tpch::run_query(&db, Query::Q4, duetdb::Strategy::Cow, &q17, 1)?;
        let mut rng = StdRng::seed_from_u64(p.seed ^ (rep as u64) << 32);
        let ctx = Ctx {
            db: &db,
            scale,
            rand: TpccRand::new(&scale, &mut rng),
            q17,
            q4_at_load,
        };
        if rep == 0 {
            notes.push(format!(
                "data set: {} warehouse(s), {} items, {} customers, {} orders, {} order lines, {} new_order rows; Q17 on {} / {}",
                scale.warehouses, loaded.items, loaded.customers, loaded.orders,
                loaded.order_lines, loaded.new_orders, ctx.q17.brand, ctx.q17.container
            ));
        }
        for (cell_no, (iso, k, strategy)) in
            (1u64..).zip(txn_cells(&p.isolations, &p.analytics, &p.strategies))
        {
            let seed = p.seed ^ (rep as u64) << 40 ^ cell_no << 16;
            let s = strategy.unwrap_or(Strategy::Cow);
            let cell = run_cell(&ctx, p, iso, s, k, seed, quiet)?;
            record_cell(col, target, iso, strategy, k, &cell);
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
    }
    notes.push(format!(
        "{target}: in-memory database in this process. Mix NewOrder : Payment : OrderStatus : Delivery : StockLevel = {} : {} : {} : {} : {} (TPC-C's weights: 45 : 43 : 4 : 4 : 4; Delivery serves all districts of a warehouse in one transaction); conflicts are retried with the same input (jittered exponential backoff, at most {} attempts); 1 % of NewOrders roll back on an unused item (TPC-C), counted as rollbacks.",
        p.mix[0], p.mix[1], p.mix[2], p.mix[3], p.mix[4], p.max_attempts
    ));
    notes.push(format!(
        "checked after every run with transactions stopped: TPC-C consistency conditions 1–4, payments = history, balances = payments and deliveries, delivered orders out of new_order with their lines dated{}",
        if p.verify {
            "; Q1, Q4 and Q17 under none, vls, olcp and cow equal the reference evaluation"
        } else {
            ""
        }
    ));
    Ok(())
}

fn record_cell(
    col: &mut Collector,
    target: &str,
    iso: IsolationArg,
    strategy: Option<Strategy>,
    k: usize,
    cell: &CellOut,
) {
    let sname = strategy.map_or("-", Strategy::name);
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
        col.add(target, &c, "query_ms_p95", p95(ms));
        col.add(target, &c, "query_ms_max", spread(ms).2);
    }
}
