//! TPC-H Q1, Q4 and Q17 over the CH-benCHmark-style data set (`chbench.rs`),
//! written through `Database::olcp_query` (map + reduce, several threads), and
//! a straightforward reference evaluation of each over plain documents (a
//! static copy: `db.snapshot()` materialized, or a model rebuilt from a log).
//!
//! Owns the query definitions and their exact result types: money is integer
//! cents and rates integer percent, so results compare with `==` (averages
//! are derived from the exact sums on demand).
//!
//! [`run_query`] runs any of the three under any snapshot strategy: `olcp` is
//! the `*_olcp` version; `cow` reads every collection the query needs from one
//! `db.snapshot()` (one consistent state); `vls` and `none` stream each
//! collection with `scan_with` under that strategy — one scan per collection,
//! each with its own start, so across collections they are consistent only
//! where the other collection is not being written (true of the TPC-C mix:
//! `item` is never written and Q4's orders and lines are older than any
//! NewOrder; see `chbench.rs`). All versions compute the same result on a
//! quiesced database (tested against the `reference_*` evaluations).
//!
//! The same three queries as ordinary aggregation pipelines (`$lookup`
//! joins, run as OLCP by the engine) are in `tpch_pipeline.rs`; the tests
//! check them against the versions here and the `reference_*` functions.

use std::collections::{BTreeMap, HashMap};
use std::ops::ControlFlow;

use bson::{doc, Document};
use duetdb::{Database, OlcpOptions, OlcpReport, PointRange, Strategy};

use crate::chbench::{int, text, ITEM, ORDERS, ORDER_LINE};

/// Q1's parameter: ship date ≤ 1998-12-01 − 90 days.
pub const Q1_CUTOFF_DAY: i64 = 2436;
/// Q4's parameter: order date in [1993-07-01, 1993-10-01).
pub const Q4_FROM_DAY: i64 = 547;
pub const Q4_TO_DAY: i64 = 639;

/// One group of Q1 (pricing summary), exact.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Q1Group {
    pub sum_qty: i64,
    pub sum_base_price_cents: i64,
    /// Σ price · (100 − discount): cents × 100.
    pub sum_disc_price_centicents: i128,
    /// Σ price · (100 − discount) · (100 + tax): cents × 10⁴.
    pub sum_charge_cents_e4: i128,
    pub sum_discount_pct: i64,
    pub count_order: u64,
}

impl Q1Group {
    fn add(&mut self, qty: i64, price: i64, disc: i64, tax: i64) {
        self.sum_qty += qty;
        self.sum_base_price_cents += price;
        let dp = price as i128 * (100 - disc) as i128;
        self.sum_disc_price_centicents += dp;
        self.sum_charge_cents_e4 += dp * (100 + tax) as i128;
        self.sum_discount_pct += disc;
        self.count_order += 1;
    }
    fn merge(&mut self, o: &Q1Group) {
        self.sum_qty += o.sum_qty;
        self.sum_base_price_cents += o.sum_base_price_cents;
        self.sum_disc_price_centicents += o.sum_disc_price_centicents;
        self.sum_charge_cents_e4 += o.sum_charge_cents_e4;
        self.sum_discount_pct += o.sum_discount_pct;
        self.count_order += o.count_order;
    }
    pub fn avg_qty(&self) -> f64 {
        self.sum_qty as f64 / self.count_order.max(1) as f64
    }
    pub fn avg_price_cents(&self) -> f64 {
        self.sum_base_price_cents as f64 / self.count_order.max(1) as f64
    }
    pub fn avg_disc_pct(&self) -> f64 {
        self.sum_discount_pct as f64 / self.count_order.max(1) as f64
    }
}

/// Q1: (returnflag, linestatus) → group.
pub type Q1 = BTreeMap<(String, String), Q1Group>;
/// Q4: orderpriority → order count.
pub type Q4 = BTreeMap<String, u64>;

/// Q17's parameters.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Q17Params {
    pub brand: String,
    pub container: String,
}

impl Default for Q17Params {
    fn default() -> Self {
        Q17Params {
            brand: "Brand#23".into(),
            container: "MED BOX".into(),
        }
    }
}

/// Q17 (small-quantity-order revenue), exact.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Q17 {
    /// Σ extended price of the lines with quantity < 0.2 · avg quantity of their part.
    pub sum_price_cents: i64,
    /// Qualifying parts that have at least one line.
    pub parts: u64,
    pub lines: u64,
}

impl Q17 {
    /// TPC-H's `avg_yearly` = Σ price / 7.0, in currency units.
    pub fn avg_yearly(&self) -> f64 {
        self.sum_price_cents as f64 / 7.0 / 100.0
    }
}

fn opts(threads: usize) -> OlcpOptions {
    OlcpOptions {
        threads: threads.max(1),
    }
}

fn q1_filter() -> Document {
    doc! {"ol_shipdate_day": {"$lte": Q1_CUTOFF_DAY}}
}

/// Q1's per-line work (the same for every strategy). One pass over the raw
/// document: a `get` per field would walk it from the start six times.
fn q1_map(s: &mut Q1, d: &bson::RawDocument) -> duetdb::Result<()> {
    const FIELDS: [&str; 6] = [
        "ol_returnflag",
        "ol_linestatus",
        "ol_quantity",
        "ol_extendedprice_cents",
        "ol_discount_pct",
        "ol_tax_pct",
    ];
    let mut flag = None;
    let mut status = None;
    let mut nums = [None; 4];
    let mut found = 0;
    for el in d.iter() {
        let (key, value) = el.map_err(|e| duetdb::Error::BadValue(e.to_string()))?;
        let Some(i) = FIELDS.iter().position(|f| *f == key.as_str()) else {
            continue;
        };
        match (i, value) {
            (0, bson::RawBsonRef::String(v)) => flag = Some(v),
            (1, bson::RawBsonRef::String(v)) => status = Some(v),
            (2..=5, bson::RawBsonRef::Int64(v)) => nums[i - 2] = Some(v),
            (2..=5, bson::RawBsonRef::Int32(v)) => nums[i - 2] = Some(i64::from(v)),
            _ => {}
        }
        found += 1;
        if found == FIELDS.len() {
            break;
        }
    }
    let (Some(flag), Some(status), [Some(qty), Some(price), Some(disc), Some(tax)]) =
        (flag, status, nums)
    else {
        // Name the first field that is missing or mistyped.
        text(d, "ol_returnflag")?;
        text(d, "ol_linestatus")?;
        for f in &FIELDS[2..] {
            int(d, f)?;
        }
        return Err(duetdb::Error::BadValue(
            "order line with a duplicated field".into(),
        ));
    };
    // A handful of groups: find without allocating a key per line.
    let group = match s.iter_mut().find(|((f, l), _)| f == flag && l == status) {
        Some((_, g)) => g,
        None => s.entry((flag.to_string(), status.to_string())).or_default(),
    };
    group.add(qty, price, disc, tax);
    Ok(())
}

/// Q1 through OLCP: one scan range on the ship date over `order_line`.
pub fn q1_olcp(db: &Database, threads: usize) -> duetdb::Result<(Q1, OlcpReport)> {
    db.olcp_query(
        ORDER_LINE,
        &[q1_filter()],
        &[],
        Q1::new,
        |s: &mut Q1, d, _| q1_map(s, d),
        |mut a, b| {
            for (k, g) in b {
                a.entry(k).or_default().merge(&g);
            }
            a
        },
        opts(threads),
    )
}

fn q4_filter() -> Document {
    doc! {"o_entry_day": {"$gte": Q4_FROM_DAY, "$lt": Q4_TO_DAY}}
}

/// Q4 through OLCP: orders in the date range are the scan range (an index
/// range on `o_entry_day`); their lines are read by order key from a point
/// range over `order_line`, as of the query's start.
pub fn q4_olcp(db: &Database, threads: usize) -> duetdb::Result<(Q4, OlcpReport)> {
    db.olcp_query(
        ORDERS,
        &[q4_filter()],
        &[PointRange {
            coll: ORDER_LINE.into(),
            filter: Document::new(),
        }],
        Q4::new,
        |s: &mut Q4, d, points| {
            let key = int(d, "_id")?;
            let mut late = false;
            for l in points.find(ORDER_LINE, &doc! {"ol_o_key": key})? {
                if int(&l, "ol_commitdate_day")? < int(&l, "ol_receiptdate_day")? {
                    late = true;
                    break;
                }
            }
            if late {
                *s.entry(text(d, "o_orderpriority")?.to_string())
                    .or_default() += 1;
            }
            Ok(())
        },
        |mut a, b| {
            for (k, n) in b {
                *a.entry(k).or_default() += n;
            }
            a
        },
        opts(threads),
    )
}

/// Per-part accumulation of Q17: Σ quantity, line count, and the lines.
#[derive(Debug, Default)]
struct PartAcc {
    sum_qty: i64,
    count: i64,
    lines: Vec<(i64, i64)>,
}

#[derive(Default)]
struct Q17State {
    /// Item id → is it of the queried brand and container (memo of point reads).
    selected: HashMap<i64, bool>,
    parts: HashMap<i64, PartAcc>,
}

fn q17_add(
    parts: &mut HashMap<i64, PartAcc>,
    part: i64,
    d: &bson::RawDocument,
) -> duetdb::Result<()> {
    let qty = int(d, "ol_quantity")?;
    let acc = parts.entry(part).or_default();
    acc.sum_qty += qty;
    acc.count += 1;
    acc.lines.push((qty, int(d, "ol_extendedprice_cents")?));
    Ok(())
}

fn q17_finish(parts: &HashMap<i64, PartAcc>) -> Q17 {
    let mut out = Q17::default();
    for acc in parts.values() {
        out.parts += 1;
        for &(qty, price) in &acc.lines {
            // qty < 0.2 · (sum / count)  ⇔  5 · qty · count < sum
            if 5 * qty * acc.count < acc.sum_qty {
                out.sum_price_cents += price;
                out.lines += 1;
            }
        }
    }
    out
}

/// Q17 through OLCP: one pass over `order_line` (scan range: all of it); each
/// line's part is looked up in a point range over `item` restricted to the
/// brand and container, so lines of other parts find nothing. The per-part
/// average and the filter are computed in the reduce step (the subquery).
pub fn q17_olcp(db: &Database, p: &Q17Params, threads: usize) -> duetdb::Result<(Q17, OlcpReport)> {
    let (state, report) = db.olcp_query(
        ORDER_LINE,
        &[],
        &[PointRange {
            coll: ITEM.into(),
            filter: doc! {"i_brand": &p.brand, "i_container": &p.container},
        }],
        Q17State::default,
        |s: &mut Q17State, d, points| {
            let part = int(d, "ol_i_id")?;
            let selected = match s.selected.get(&part) {
                Some(b) => *b,
                None => {
                    let b = !points.find(ITEM, &doc! {"_id": part})?.is_empty();
                    s.selected.insert(part, b);
                    b
                }
            };
            if selected {
                q17_add(&mut s.parts, part, d)?;
            }
            Ok(())
        },
        |mut a, b| {
            for (part, acc) in b.parts {
                let e = a.parts.entry(part).or_default();
                e.sum_qty += acc.sum_qty;
                e.count += acc.count;
                e.lines.extend(acc.lines);
            }
            a
        },
        opts(threads),
    )?;
    Ok((q17_finish(&state.parts), report))
}

/// One of the three queries.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub enum Query {
    Q1,
    Q4,
    Q17,
}

impl Query {
    pub const ALL: [Query; 3] = [Query::Q1, Query::Q4, Query::Q17];
    pub fn name(self) -> &'static str {
        match self {
            Query::Q1 => "Q1",
            Query::Q4 => "Q4",
            Query::Q17 => "Q17",
        }
    }
}

/// A query's answer, whichever query it was.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Answer {
    Q1(Q1),
    Q4(Q4),
    Q17(Q17),
}

/// Where a non-OLCP query reads its collections from.
enum Source<'a> {
    /// One snapshot for every collection (`cow`).
    Snapshot(duetdb::Snapshot),
    /// The live database, one `scan_with` per collection (`vls`, `none`).
    Live(&'a Database, Strategy),
}

impl Source<'_> {
    /// Call `visit` on every document of `coll` matching `filter`; the first
    /// error (from the scan or from `visit`) ends the scan and is returned.
    fn each(
        &self,
        coll: &str,
        filter: Document,
        mut visit: impl FnMut(&bson::RawDocument) -> duetdb::Result<()>,
    ) -> duetdb::Result<()> {
        match self {
            Source::Snapshot(snap) => {
                for d in snap.collection(coll).find(filter).raw()? {
                    visit(&d)?;
                }
                Ok(())
            }
            Source::Live(db, strategy) => {
                let mut failed = None;
                db.collection(coll)
                    .scan_with(filter, *strategy, |d| match visit(d) {
                        Ok(()) => ControlFlow::Continue(()),
                        Err(e) => {
                            failed = Some(e);
                            ControlFlow::Break(())
                        }
                    })?;
                failed.map_or(Ok(()), Err)
            }
        }
    }
}

fn scanned_q1(src: &Source) -> duetdb::Result<Q1> {
    let mut out = Q1::new();
    src.each(ORDER_LINE, q1_filter(), |d| q1_map(&mut out, d))?;
    Ok(out)
}

/// Q4 as two scans: the orders of the date range, then the lines of their
/// key range (order keys grow with the entry day, so a range covers them).
fn scanned_q4(src: &Source) -> duetdb::Result<Q4> {
    let mut orders: HashMap<i64, String> = HashMap::new();
    src.each(ORDERS, q4_filter(), |d| {
        orders.insert(int(d, "_id")?, text(d, "o_orderpriority")?.to_string());
        Ok(())
    })?;
    let (Some(lo), Some(hi)) = (orders.keys().min(), orders.keys().max()) else {
        return Ok(Q4::new());
    };
    let mut late: std::collections::HashSet<i64> = std::collections::HashSet::new();
    src.each(
        ORDER_LINE,
        doc! {"ol_o_key": {"$gte": *lo, "$lte": *hi}},
        |l| {
            if int(l, "ol_commitdate_day")? < int(l, "ol_receiptdate_day")? {
                late.insert(int(l, "ol_o_key")?);
            }
            Ok(())
        },
    )?;
    let mut out = Q4::new();
    for (key, priority) in orders {
        if late.contains(&key) {
            *out.entry(priority).or_default() += 1;
        }
    }
    Ok(out)
}

fn scanned_q17(src: &Source, p: &Q17Params) -> duetdb::Result<Q17> {
    let mut selected: std::collections::HashSet<i64> = std::collections::HashSet::new();
    src.each(
        ITEM,
        doc! {"i_brand": &p.brand, "i_container": &p.container},
        |d| {
            selected.insert(int(d, "_id")?);
            Ok(())
        },
    )?;
    let mut parts: HashMap<i64, PartAcc> = HashMap::new();
    src.each(ORDER_LINE, Document::new(), |d| {
        let part = int(d, "ol_i_id")?;
        if selected.contains(&part) {
            q17_add(&mut parts, part, d)?;
        }
        Ok(())
    })?;
    Ok(q17_finish(&parts))
}

/// Run `query` under `strategy` (`auto` is `cow` here); `threads` is the
/// number of map threads of the OLCP versions (the others scan on one thread).
pub fn run_query(
    db: &Database,
    query: Query,
    strategy: Strategy,
    q17: &Q17Params,
    threads: usize,
) -> duetdb::Result<Answer> {
    let src = match strategy {
        Strategy::Olcp => {
            return Ok(match query {
                Query::Q1 => Answer::Q1(q1_olcp(db, threads)?.0),
                Query::Q4 => Answer::Q4(q4_olcp(db, threads)?.0),
                Query::Q17 => Answer::Q17(q17_olcp(db, q17, threads)?.0),
            })
        }
        Strategy::Cow | Strategy::Auto => Source::Snapshot(db.snapshot()),
        Strategy::Vls | Strategy::None => Source::Live(db, strategy),
    };
    Ok(match query {
        Query::Q1 => Answer::Q1(scanned_q1(&src)?),
        Query::Q4 => Answer::Q4(scanned_q4(&src)?),
        Query::Q17 => Answer::Q17(scanned_q17(&src, q17)?),
    })
}

/// The reference answer of `query` over a static copy (see [`static_copy`]).
pub fn reference(
    query: Query,
    items: &[Document],
    orders: &[Document],
    lines: &[Document],
    q17: &Q17Params,
) -> Answer {
    match query {
        Query::Q1 => Answer::Q1(reference_q1(lines)),
        Query::Q4 => Answer::Q4(reference_q4(orders, lines)),
        Query::Q17 => Answer::Q17(reference_q17(items, lines, q17)),
    }
}

/// Q17's parameters chosen so that the query selects something: the brand
/// and container of the part of the lowest-keyed order line (the default
/// Brand#23 / MED BOX selects nothing at small scales).
pub fn q17_params_for(db: &Database) -> duetdb::Result<Q17Params> {
    let first = db
        .collection(ORDER_LINE)
        .find(Document::new())
        .sort(doc! {"_id": 1})
        .limit(1)
        .raw()?;
    let Some(line) = first.first() else {
        return Ok(Q17Params::default());
    };
    let part = int(line, "ol_i_id")?;
    let Some(item) = db.collection(ITEM).get(&bson::Bson::Int64(part))? else {
        return Ok(Q17Params::default());
    };
    Ok(Q17Params {
        brand: text(&item, "i_brand")?.to_string(),
        container: text(&item, "i_container")?.to_string(),
    })
}

fn i(d: &Document, k: &str) -> i64 {
    match d.get(k) {
        Some(bson::Bson::Int64(v)) => *v,
        Some(bson::Bson::Int32(v)) => *v as i64,
        _ => i64::MIN,
    }
}

fn s<'a>(d: &'a Document, k: &str) -> &'a str {
    d.get_str(k).unwrap_or("")
}

/// Q1 the obvious way: filter, group, sum.
pub fn reference_q1(lines: &[Document]) -> Q1 {
    let mut out = Q1::new();
    for l in lines {
        if i(l, "ol_shipdate_day") <= Q1_CUTOFF_DAY {
            out.entry((
                s(l, "ol_returnflag").to_string(),
                s(l, "ol_linestatus").to_string(),
            ))
            .or_default()
            .add(
                i(l, "ol_quantity"),
                i(l, "ol_extendedprice_cents"),
                i(l, "ol_discount_pct"),
                i(l, "ol_tax_pct"),
            );
        }
    }
    out
}

/// Q4 the obvious way: the set of orders with a late line, then the orders.
pub fn reference_q4(orders: &[Document], lines: &[Document]) -> Q4 {
    let late: std::collections::HashSet<i64> = lines
        .iter()
        .filter(|l| i(l, "ol_commitdate_day") < i(l, "ol_receiptdate_day"))
        .map(|l| i(l, "ol_o_key"))
        .collect();
    let mut out = Q4::new();
    for o in orders {
        let day = i(o, "o_entry_day");
        if (Q4_FROM_DAY..Q4_TO_DAY).contains(&day) && late.contains(&i(o, "_id")) {
            *out.entry(s(o, "o_orderpriority").to_string()).or_default() += 1;
        }
    }
    out
}

/// Q17 the obvious way: the parts, their average quantity, the small lines.
pub fn reference_q17(items: &[Document], lines: &[Document], p: &Q17Params) -> Q17 {
    let parts: std::collections::HashSet<i64> = items
        .iter()
        .filter(|it| s(it, "i_brand") == p.brand && s(it, "i_container") == p.container)
        .map(|it| i(it, "_id"))
        .collect();
    let mut acc: HashMap<i64, PartAcc> = HashMap::new();
    for l in lines {
        let part = i(l, "ol_i_id");
        if parts.contains(&part) {
            let a = acc.entry(part).or_default();
            a.sum_qty += i(l, "ol_quantity");
            a.count += 1;
        }
    }
    let mut out = Q17 {
        parts: acc.len() as u64,
        ..Q17::default()
    };
    for l in lines {
        if let Some(a) = acc.get(&i(l, "ol_i_id")) {
            // qty < 0.2 · avg, in integers (0.2 has no exact binary form).
            let qty = i(l, "ol_quantity");
            if 5 * qty * a.count < a.sum_qty {
                out.sum_price_cents += i(l, "ol_extendedprice_cents");
                out.lines += 1;
            }
        }
    }
    out
}

/// The static copy the reference evaluations read: (items, orders, lines)
/// materialized from one snapshot.
pub fn static_copy(
    snap: &duetdb::Snapshot,
) -> duetdb::Result<(Vec<Document>, Vec<Document>, Vec<Document>)> {
    Ok((
        snap.collection(ITEM).find(Document::new()).run()?,
        snap.collection(ORDERS).find(Document::new()).run()?,
        snap.collection(ORDER_LINE).find(Document::new()).run()?,
    ))
}
