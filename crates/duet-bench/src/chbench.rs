//! A CH-benCHmark-style data set (TPC-C's schema with TPC-H's analytic fields
//! on `order_line`): a deterministic generator with a scale factor, a loader
//! into duetdb collections with the indexes the TPC-H queries (`tpch.rs`) and
//! the TPC-C transactions need, TPC-C's five transactions (NewOrder,
//! Payment, OrderStatus, Delivery, StockLevel) as engine transactions, and a
//! checker of TPC-C's consistency conditions.
//!
//! Owns the schema below; nothing else in the crate writes these collections
//! (the transactions here are the only writers after `load`).
//!
//! | collection   | `_id`                         | fields used by queries / transactions |
//! |---|---|---|
//! | `warehouse`  | w                             | `w_ytd_cents`, `w_tax_pct` |
//! | `district`   | dk = w·10 + d                 | `d_w_id`, `d_next_o_id`, `d_ytd_cents`, `d_tax_pct` |
//! | `customer`   | dk·C + c                      | `c_d_key`, `c_last` (index `c_d_key, c_last`), `c_balance_cents`, `c_ytd_payment_cents`, `c_payment_cnt`, `c_discount_pct` |
//! | `item`       | i (the TPC-H part)            | `i_brand`, `i_container`, `i_price_cents` |
//! | `stock`      | w·I + i                       | `s_quantity`, `s_ytd`, `s_order_cnt`, `s_remote_cnt` |
//! | `orders`     | o_key = (o_id − 1)·D + dk     | `o_id`, `o_d_key`, `o_c_key` (indexed), `o_entry_day` (indexed), `o_orderpriority`, `o_ol_cnt`; set by Delivery: `o_carrier_id`, `o_delivered_cents` |
//! | `new_order`  | o_key                         | `no_d_key`, `no_o_id` (index `no_d_key, no_o_id`: Delivery's oldest) |
//! | `order_line` | o_key·16 + ol_number          | `ol_o_key` (indexed), `ol_i_id`, `ol_quantity`, `ol_extendedprice_cents`, `ol_discount_pct`, `ol_tax_pct`, `ol_returnflag`, `ol_linestatus`, `ol_shipdate_day`, `ol_commitdate_day`, `ol_receiptdate_day`; set by Delivery: `ol_delivery_day` |
//! | `history`    | generated                     | `h_c_key`, `h_d_key`, `h_w_id`, `h_amount_cents` |
//!
//! (D = districts in total, C = customers per district, I = items.)
//! `o_id` is TPC-C's per-district order number (1, 2, …) and `o_key` its
//! global form, so loaded orders are in entry-day order and NewOrder keeps
//! extending the same numbering.
//!
//! Dates are whole days since 1992-01-01 (`*_day`); money is integer cents
//! (`*_cents`) and rates integer percent (`*_pct`), so every query result can
//! be compared exactly. `ol_note` and `o_comment` are never read by a query:
//! updates of them are answer-neutral.
//!
//! Consistency conditions (TPC-C §3.3.2, those our transactions touch;
//! checked by [`check_consistency`], kept by every committed transaction):
//! 1. `w_ytd_cents` = Σ `d_ytd_cents` of the warehouse's districts;
//! 2. per district, `d_next_o_id` − 1 = max `o_id` = max `no_o_id` (while
//!    it has `new_order` rows);
//! 3. per district, max `no_o_id` − min `no_o_id` + 1 = number of `new_order` rows;
//! 4. per district, Σ `o_ol_cnt` = number of its order lines, and every line's
//!    `ol_number` lies in 1..=`o_ol_cnt` of an existing order;
//! 5. per customer `c_balance_cents` + `c_ytd_payment_cents` = Σ
//!    `o_delivered_cents` of their orders Delivery delivered (the loaded
//!    balances are 0, and only Delivery adds to one: TPC-C's 3.3.2.10 for
//!    this data set), and Σ `h_amount_cents` = Σ `w_ytd_cents` − W · 30,000,000;
//! 6. an order Delivery delivered has no `new_order` row, and every one of
//!    its lines has `ol_delivery_day` (TPC-C's 3.3.2.7 and 3.3.2.9 for the
//!    orders of the run).
//!
//! What TPC-C changes does not reach the TPC-H queries' inputs except through
//! NewOrder's new orders and lines: `item` is never written, and new orders
//! are entered on day `LAST_ENTRY_DAY + 1`, after Q4's date range, so Q4's
//! answer is fixed while Q1's and Q17's grow.
//!
//! Scale: `sf = 1` is one warehouse with TPC-C's cardinalities (10 districts,
//! 3,000 customers and 3,000 orders per district, 5–15 lines per order,
//! 100,000 items and stock rows); `sf = n` is n warehouses; a fractional `sf`
//! shrinks the per-district counts and the item table (for tests). The last
//! 30 % of each district's orders are undelivered (`new_order`), as TPC-C's
//! 900 of 3,000. `history` starts empty (TPC-C loads one row per customer).
//! Fields and collections added for the transactions come from a second
//! random stream, so every value the original generator drew is unchanged for
//! a seed (and with it every TPC-H answer on a freshly loaded data set).

use std::collections::HashMap;

use anyhow::{ensure, Result};
use bson::{doc, Bson, Document};
use duetdb::raw::DocRef;
use duetdb::FindOptions;
use duetdb::{Database, IndexOptions, Snapshot, Transaction};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

pub const WAREHOUSE: &str = "warehouse";
pub const DISTRICT: &str = "district";
pub const CUSTOMER: &str = "customer";
pub const ITEM: &str = "item";
pub const ORDERS: &str = "orders";
pub const ORDER_LINE: &str = "order_line";
pub const STOCK: &str = "stock";
pub const NEW_ORDER: &str = "new_order";
pub const HISTORY: &str = "history";

/// Every collection of the data set.
pub const COLLECTIONS: [&str; 9] = [
    WAREHOUSE, DISTRICT, CUSTOMER, ITEM, STOCK, ORDERS, NEW_ORDER, ORDER_LINE, HISTORY,
];
/// TPC-C's initial `W_YTD` (300,000.00) and `D_YTD` (30,000.00), in cents.
pub const W_YTD_START_CENTS: i64 = 30_000_000;
pub const D_YTD_START_CENTS: i64 = 3_000_000;
/// The entry day of orders placed by NewOrder (the day after the loaded ones).
pub const NEW_ORDER_DAY: i64 = LAST_ENTRY_DAY + 1;

/// Last order entry day: 1998-08-02 (TPC-H's ENDDATE − 151 days).
pub const LAST_ENTRY_DAY: i64 = 2405;
/// TPC-H's CURRENTDATE, 1995-06-17: decides returnflag and linestatus.
pub const CURRENT_DAY: i64 = 1263;
/// Lines per order key (`_id` of a line = o_key · 16 + ol_number).
pub const LINES_PER_KEY: i64 = 16;

pub const PRIORITIES: [&str; 5] = ["1-URGENT", "2-HIGH", "3-MEDIUM", "4-NOT SPECIFIED", "5-LOW"];
const CONTAINER_SIZES: [&str; 5] = ["SM", "LG", "MED", "JUMBO", "WRAP"];
const CONTAINER_TYPES: [&str; 8] = ["CASE", "BOX", "BAG", "JAR", "PKG", "PACK", "CAN", "DRUM"];

/// Cardinalities derived from a scale factor.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct Scale {
    pub warehouses: u64,
    pub districts_per_warehouse: u64,
    pub customers_per_district: u64,
    pub orders_per_district: u64,
    pub items: u64,
}

impl Scale {
    /// `sf ≥ 1`: ⌊sf⌋ warehouses of TPC-C size; `0 < sf < 1`: one warehouse
    /// whose per-district counts and item table are multiplied by `sf`.
    pub fn new(sf: f64) -> Result<Scale> {
        ensure!(
            sf.is_finite() && sf > 0.0,
            "scale factor must be > 0, got {sf}"
        );
        let shrink = sf.min(1.0);
        let n = |full: f64, min: u64| ((full * shrink).round() as u64).max(min);
        Ok(Scale {
            warehouses: (sf.floor() as u64).max(1),
            districts_per_warehouse: 10,
            customers_per_district: n(3000.0, 3),
            orders_per_district: n(3000.0, 3),
            items: n(100_000.0, 50),
        })
    }

    pub fn districts(&self) -> u64 {
        self.warehouses * self.districts_per_warehouse
    }
    pub fn orders(&self) -> u64 {
        self.districts() * self.orders_per_district
    }
    /// Orders per district loaded as undelivered (`new_order` rows): the last 30 %.
    pub fn undelivered_per_district(&self) -> u64 {
        ((self.orders_per_district as f64 * 0.3).round() as u64).max(1)
    }
    /// The district key of district `d` (0-based) of warehouse `w`.
    pub fn district_key(&self, w: u64, d: u64) -> u64 {
        w * self.districts_per_warehouse + d
    }
    /// The global order key of per-district order number `o_id` (1-based).
    pub fn order_key(&self, dk: u64, o_id: u64) -> u64 {
        (o_id.max(1) - 1) * self.districts() + dk
    }
}

/// TPC-C's customer last name of number `n` (0..=999): three syllables.
pub fn last_name(n: u64) -> String {
    const SYL: [&str; 10] = [
        "BAR", "OUGHT", "ABLE", "PRI", "PRES", "ESE", "ANTI", "CALLY", "ATION", "EING",
    ];
    let n = n % 1000;
    format!(
        "{}{}{}",
        SYL[(n / 100) as usize],
        SYL[(n / 10 % 10) as usize],
        SYL[(n % 10) as usize]
    )
}

/// TPC-C's non-uniform random NURand(A, x, y) with the run constant `c`.
pub fn nurand(rng: &mut impl Rng, a: u64, x: u64, y: u64, c: u64) -> u64 {
    let span = y.saturating_sub(x) + 1;
    ((rng.gen_range(0..=a) | rng.gen_range(x..=y)) + c) % span + x
}

/// NURand's A for a range of `n` values, scaled from TPC-C's (`full_a` for
/// `full_n` values) to the largest 2^k − 1 keeping the same skew.
pub fn nurand_a(n: u64, full_a: u64, full_n: u64) -> u64 {
    let target = (n.saturating_mul(full_a + 1) / full_n.max(1)).max(1);
    // The largest power of two ≤ target, minus one.
    (1u64 << (63 - target.leading_zeros())) - 1
}

/// Names in use per district: customers 0..min(C, 1000) carry `last_name(c)`,
/// later ones a NURand-chosen name among those, so every name in this range exists.
pub fn last_names_in_use(scale: &Scale) -> u64 {
    scale.customers_per_district.min(1000)
}

/// A document field as an integer (Int32 or Int64).
pub fn int(d: &bson::RawDocument, key: &str) -> duetdb::Result<i64> {
    match d.get(key) {
        Ok(Some(bson::RawBsonRef::Int64(v))) => Ok(v),
        Ok(Some(bson::RawBsonRef::Int32(v))) => Ok(v as i64),
        _ => Err(duetdb::Error::BadValue(format!(
            "field '{key}' is missing or not an integer"
        ))),
    }
}

/// A document field as a string.
pub fn text<'a>(d: &'a bson::RawDocument, key: &str) -> duetdb::Result<&'a str> {
    match d.get(key) {
        Ok(Some(bson::RawBsonRef::String(s))) => Ok(s),
        _ => Err(duetdb::Error::BadValue(format!(
            "field '{key}' is missing or not a string"
        ))),
    }
}

/// The item (part) with id `i`: brand `Brand#MN`, container e.g. `MED BOX`.
pub fn item_doc(i: u64, rng: &mut StdRng) -> Document {
    let brand = format!("Brand#{}{}", rng.gen_range(1..=5), rng.gen_range(1..=5));
    let container = format!(
        "{} {}",
        CONTAINER_SIZES[rng.gen_range(0..CONTAINER_SIZES.len())],
        CONTAINER_TYPES[rng.gen_range(0..CONTAINER_TYPES.len())]
    );
    doc! {
        "_id": i as i64,
        "i_im_id": rng.gen_range(1..=10_000i64),
        "i_name": format!("item-{i:06}"),
        "i_price_cents": rng.gen_range(100..=10_000i64),
        "i_brand": brand,
        "i_container": container,
        "i_data": format!("{:x>24}", rng.gen::<u32>()),
    }
}

/// Where generated documents go: `(collection, batch)`.
type Sink<'a> = dyn FnMut(&str, Vec<Document>) -> Result<()> + 'a;

/// One collection's documents gathered into batches of at most `batch`.
struct Batches {
    name: &'static str,
    buf: Vec<Document>,
    batch: usize,
}

impl Batches {
    fn new(name: &'static str, batch: usize) -> Batches {
        Batches {
            name,
            buf: Vec::with_capacity(batch),
            batch,
        }
    }

    fn push(&mut self, sink: &mut Sink, d: Document) -> Result<()> {
        self.buf.push(d);
        if self.buf.len() >= self.batch {
            sink(self.name, std::mem::take(&mut self.buf))?;
        }
        Ok(())
    }

    fn finish(self, sink: &mut Sink) -> Result<()> {
        if !self.buf.is_empty() {
            sink(self.name, self.buf)?;
        }
        Ok(())
    }
}

/// The two random streams of a generation; each part draws from them in a
/// fixed order, so the data set is a function of (seed, scale).
struct Streams {
    rng: StdRng,
    /// The second stream: values of the fields and collections the
    /// transactions added.
    aux: StdRng,
}

/// Generate the whole data set, handing each collection's documents to `sink`
/// in batches of at most `batch` (deterministic for a given seed and scale).
pub fn generate(
    scale: &Scale,
    seed: u64,
    batch: usize,
    mut sink: impl FnMut(&str, Vec<Document>) -> Result<()>,
) -> Result<()> {
    let mut st = Streams {
        rng: StdRng::seed_from_u64(seed),
        aux: StdRng::seed_from_u64(seed ^ 0x7dc_c0de),
    };
    let batch = batch.max(1);
    let prices = generate_items(scale, &mut st, batch, &mut sink)?;
    generate_districts(scale, &mut st, batch, &mut sink)?;
    generate_customers_and_stock(scale, &mut st, batch, &mut sink)?;
    generate_orders(scale, &prices, &mut st, batch, &mut sink)
}

/// `item`; returns the prices, which the order lines look up again.
fn generate_items(
    scale: &Scale,
    st: &mut Streams,
    batch: usize,
    sink: &mut Sink,
) -> Result<Vec<i64>> {
    let mut items = Batches::new(ITEM, batch);
    let mut prices = Vec::with_capacity(scale.items as usize);
    for i in 0..scale.items {
        let d = item_doc(i, &mut st.rng);
        prices.push(d.get_i64("i_price_cents").unwrap_or(100));
        items.push(sink, d)?;
    }
    items.finish(sink)?;
    Ok(prices)
}

/// `warehouse` and `district`.
fn generate_districts(
    scale: &Scale,
    st: &mut Streams,
    batch: usize,
    sink: &mut Sink,
) -> Result<()> {
    let mut warehouses = Batches::new(WAREHOUSE, batch);
    for w in 0..scale.warehouses {
        let d = doc! {
            "_id": w as i64,
            "w_name": format!("wh-{w}"),
            "w_ytd_cents": W_YTD_START_CENTS,
            "w_tax_pct": st.aux.gen_range(0..=20i64),
        };
        warehouses.push(sink, d)?;
    }
    warehouses.finish(sink)?;
    // Condition 1 at load: 10 districts of D_YTD_START_CENTS make W_YTD_START_CENTS.
    debug_assert_eq!(
        scale.districts_per_warehouse as i64 * D_YTD_START_CENTS,
        W_YTD_START_CENTS
    );
    let mut districts = Batches::new(DISTRICT, batch);
    for dk in 0..scale.districts() {
        let d = doc! {
            "_id": dk as i64,
            "d_w_id": (dk / scale.districts_per_warehouse) as i64,
            "d_next_o_id": scale.orders_per_district as i64 + 1,
            "d_ytd_cents": D_YTD_START_CENTS,
            "d_tax_pct": st.aux.gen_range(0..=20i64),
        };
        districts.push(sink, d)?;
    }
    districts.finish(sink)
}

/// `customer` and `stock`.
fn generate_customers_and_stock(
    scale: &Scale,
    st: &mut Streams,
    batch: usize,
    sink: &mut Sink,
) -> Result<()> {
    let names = last_names_in_use(scale);
    let name_a = nurand_a(names, 255, 1000);
    let mut customers = Batches::new(CUSTOMER, batch);
    for dk in 0..scale.districts() {
        for c in 0..scale.customers_per_district {
            let last = if c < names {
                c
            } else {
                nurand(&mut st.aux, name_a, 0, names - 1, 0)
            };
            let d = doc! {
                "_id": (dk * scale.customers_per_district + c) as i64,
                "c_d_key": dk as i64,
                "c_last": last_name(last),
                "c_balance_cents": -1000i64,
                "c_ytd_payment_cents": 1000i64,
                "c_payment_cnt": 1i64,
                "c_discount_pct": st.aux.gen_range(0..=50i64),
                "c_data": format!("{:c>40}", st.rng.gen::<u32>()),
            };
            customers.push(sink, d)?;
        }
    }
    customers.finish(sink)?;
    let mut stock = Batches::new(STOCK, batch);
    for w in 0..scale.warehouses {
        for i in 0..scale.items {
            let d = doc! {
                "_id": (w * scale.items + i) as i64,
                "s_w_id": w as i64,
                "s_i_id": i as i64,
                "s_quantity": st.aux.gen_range(10..=100i64),
                "s_ytd": 0i64,
                "s_order_cnt": 0i64,
                "s_remote_cnt": 0i64,
            };
            stock.push(sink, d)?;
        }
    }
    stock.finish(sink)
}

/// `orders`, `order_line` and `new_order`, in entry-day order: o_key grows
/// with time (as TPC-C order ids do per district), spread over
/// 1992-01-01..1998-08-02.
fn generate_orders(
    scale: &Scale,
    prices: &[i64],
    st: &mut Streams,
    batch: usize,
    sink: &mut Sink,
) -> Result<()> {
    let orders = scale.orders();
    let mut order_docs = Batches::new(ORDERS, batch);
    let mut lines = Batches::new(ORDER_LINE, batch);
    let mut new_orders = Batches::new(NEW_ORDER, batch);
    let first_undelivered = scale.orders_per_district - scale.undelivered_per_district() + 1;
    let rng = &mut st.rng;
    for o in 0..orders {
        let entry_day = (o as i64 * LAST_ENTRY_DAY) / orders.max(1) as i64;
        let dk = o % scale.districts();
        let o_id = o / scale.districts() + 1;
        debug_assert_eq!(scale.order_key(dk, o_id), o);
        let ol_cnt = rng.gen_range(5..=15i64);
        if o_id >= first_undelivered {
            let d = doc! {"_id": o as i64, "no_d_key": dk as i64, "no_o_id": o_id as i64};
            new_orders.push(sink, d)?;
        }
        let d = doc! {
            "_id": o as i64,
            "o_id": o_id as i64,
            "o_d_key": dk as i64,
            "o_c_key": (dk * scale.customers_per_district + rng.gen_range(0..scale.customers_per_district)) as i64,
            "o_entry_day": entry_day,
            "o_orderpriority": PRIORITIES[rng.gen_range(0..PRIORITIES.len())],
            "o_ol_cnt": ol_cnt,
            "o_comment": format!("{:o>20}", rng.gen::<u32>()),
        };
        order_docs.push(sink, d)?;
        for n in 1..=ol_cnt {
            lines.push(sink, order_line(o, n, entry_day, prices, rng))?;
        }
    }
    order_docs.finish(sink)?;
    lines.finish(sink)?;
    new_orders.finish(sink)
}

/// Line `n` of order `o` (key `o * LINES_PER_KEY + n`).
fn order_line(o: u64, n: i64, entry_day: i64, prices: &[i64], rng: &mut StdRng) -> Document {
    let i_id = rng.gen_range(0..prices.len() as u64);
    let qty = rng.gen_range(1..=50i64);
    let ship = entry_day + rng.gen_range(1..=121i64);
    let commit = entry_day + rng.gen_range(30..=90i64);
    let receipt = ship + rng.gen_range(1..=30i64);
    let returnflag = if receipt <= CURRENT_DAY {
        if rng.gen_bool(0.5) {
            "R"
        } else {
            "A"
        }
    } else {
        "N"
    };
    let linestatus = if ship > CURRENT_DAY { "O" } else { "F" };
    let price = prices.get(i_id as usize).copied().unwrap_or(100);
    doc! {
        "_id": o as i64 * LINES_PER_KEY + n,
        "ol_o_key": o as i64,
        "ol_number": n,
        "ol_i_id": i_id as i64,
        "ol_quantity": qty,
        "ol_extendedprice_cents": qty * price,
        "ol_discount_pct": rng.gen_range(0..=10i64),
        "ol_tax_pct": rng.gen_range(0..=8i64),
        "ol_returnflag": returnflag,
        "ol_linestatus": linestatus,
        "ol_shipdate_day": ship,
        "ol_commitdate_day": commit,
        "ol_receiptdate_day": receipt,
        "ol_note": format!("{:n>24}", rng.gen::<u32>()),
    }
}

/// What was loaded.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct Loaded {
    pub items: u64,
    pub orders: u64,
    pub order_lines: u64,
    pub customers: u64,
    pub stock: u64,
    pub new_orders: u64,
}

/// Drop and reload every collection of the data set into `db`, then build the
/// indexes the queries use — `orders.o_entry_day` (Q4's scan range) and
/// `order_line.ol_o_key` (Q4's point lookups by order) — and those the
/// transactions use: `orders.o_c_key` (OrderStatus: a customer's last order)
/// and `customer.{c_d_key, c_last}` (Payment and OrderStatus by last name).
pub fn load(db: &Database, scale: &Scale, seed: u64) -> Result<Loaded> {
    for name in COLLECTIONS {
        db.drop_collection(name)?;
    }
    let mut loaded = Loaded::default();
    generate(scale, seed, 10_000, |name, docs| {
        let n = docs.len() as u64;
        match name {
            ITEM => loaded.items += n,
            ORDERS => loaded.orders += n,
            ORDER_LINE => loaded.order_lines += n,
            CUSTOMER => loaded.customers += n,
            STOCK => loaded.stock += n,
            NEW_ORDER => loaded.new_orders += n,
            _ => {}
        }
        db.collection(name).insert_many(docs, true)?;
        Ok(())
    })?;
    db.collection(ORDERS)
        .create_index(doc! {"o_entry_day": 1}, IndexOptions::default())?;
    db.collection(ORDER_LINE)
        .create_index(doc! {"ol_o_key": 1}, IndexOptions::default())?;
    db.collection(ORDERS)
        .create_index(doc! {"o_c_key": 1}, IndexOptions::default())?;
    db.collection(CUSTOMER)
        .create_index(doc! {"c_d_key": 1, "c_last": 1}, IndexOptions::default())?;
    db.collection(NEW_ORDER)
        .create_index(doc! {"no_d_key": 1, "no_o_id": 1}, IndexOptions::default())?;
    // history starts empty; create it so scans of it find a collection.
    db.create_collection(HISTORY)?;
    Ok(loaded)
}

/// The run constants of NURand (TPC-C §2.1.6: C is drawn once per run) and
/// its A values scaled to the data set.
#[derive(Debug, Clone, Copy)]
pub struct TpccRand {
    a_c_id: u64,
    c_c_id: u64,
    a_i_id: u64,
    c_i_id: u64,
    a_last: u64,
    c_last: u64,
}

impl TpccRand {
    pub fn new(scale: &Scale, rng: &mut impl Rng) -> TpccRand {
        let a_c_id = nurand_a(scale.customers_per_district, 1023, 3000);
        let a_i_id = nurand_a(scale.items, 8191, 100_000);
        let a_last = nurand_a(last_names_in_use(scale), 255, 1000);
        TpccRand {
            a_c_id,
            c_c_id: rng.gen_range(0..=a_c_id),
            a_i_id,
            c_i_id: rng.gen_range(0..=a_i_id),
            a_last,
            c_last: rng.gen_range(0..=a_last),
        }
    }
}

/// How a transaction names its customer (TPC-C: 60 % by last name, 40 % by id).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CustomerRef {
    Key(u64),
    /// The middle one (TPC-C: position ⌈n/2⌉) of the district's customers
    /// with this last name, in `_id` order (TPC-C sorts by `c_first`, which
    /// this schema does not have).
    LastName {
        dk: u64,
        name: String,
    },
}

fn pick_customer(scale: &Scale, dk: u64, k: &TpccRand, rng: &mut impl Rng) -> CustomerRef {
    if rng.gen_range(0..100) < 60 {
        let n = nurand(rng, k.a_last, 0, last_names_in_use(scale) - 1, k.c_last);
        CustomerRef::LastName {
            dk,
            name: last_name(n),
        }
    } else {
        let c = nurand(rng, k.a_c_id, 0, scale.customers_per_district - 1, k.c_c_id);
        CustomerRef::Key(dk * scale.customers_per_district + c)
    }
}

/// One line of a NewOrder.
#[derive(Debug, Clone)]
pub struct NewOrderLine {
    /// `scale.items` (an unused id) marks TPC-C's 1 % of rolled-back orders.
    pub i_id: u64,
    pub supply_w: u64,
    pub quantity: i64,
    pub discount_pct: i64,
    pub tax_pct: i64,
    pub ship_day: i64,
    pub commit_day: i64,
    pub receipt_day: i64,
}

/// NewOrder's input (TPC-C §2.4.1), drawn before the first attempt so that
/// retries repeat the same transaction.
#[derive(Debug, Clone)]
pub struct NewOrderInput {
    pub w: u64,
    pub dk: u64,
    pub c_key: u64,
    pub priority: &'static str,
    pub lines: Vec<NewOrderLine>,
}

impl NewOrderInput {
    pub fn random(scale: &Scale, k: &TpccRand, rng: &mut impl Rng) -> NewOrderInput {
        let w = rng.gen_range(0..scale.warehouses);
        let dk = scale.district_key(w, rng.gen_range(0..scale.districts_per_warehouse));
        let c = nurand(rng, k.a_c_id, 0, scale.customers_per_district - 1, k.c_c_id);
        let ol_cnt = rng.gen_range(5..=15usize);
        let rollback = rng.gen_range(0..100) == 0;
        let lines = (0..ol_cnt)
            .map(|n| {
                let i_id = if rollback && n + 1 == ol_cnt {
                    scale.items
                } else {
                    nurand(rng, k.a_i_id, 0, scale.items - 1, k.c_i_id)
                };
                // 1 % of lines come from a remote warehouse when there is one.
                let supply_w = if scale.warehouses > 1 && rng.gen_range(0..100) == 0 {
                    (w + rng.gen_range(1..scale.warehouses)) % scale.warehouses
                } else {
                    w
                };
                let ship_day = NEW_ORDER_DAY + rng.gen_range(1..=121i64);
                NewOrderLine {
                    i_id,
                    supply_w,
                    quantity: rng.gen_range(1..=10i64),
                    discount_pct: rng.gen_range(0..=10i64),
                    tax_pct: rng.gen_range(0..=8i64),
                    ship_day,
                    commit_day: NEW_ORDER_DAY + rng.gen_range(30..=90i64),
                    receipt_day: ship_day + rng.gen_range(1..=30i64),
                }
            })
            .collect();
        NewOrderInput {
            w,
            dk,
            c_key: dk * scale.customers_per_district + c,
            priority: PRIORITIES[rng.gen_range(0..PRIORITIES.len())],
            lines,
        }
    }
}

/// Payment's input (TPC-C §2.5.1).
#[derive(Debug, Clone)]
pub struct PaymentInput {
    pub w: u64,
    pub dk: u64,
    pub customer: CustomerRef,
    pub amount_cents: i64,
}

impl PaymentInput {
    pub fn random(scale: &Scale, k: &TpccRand, rng: &mut impl Rng) -> PaymentInput {
        let w = rng.gen_range(0..scale.warehouses);
        let d = rng.gen_range(0..scale.districts_per_warehouse);
        let dk = scale.district_key(w, d);
        // 85 % home; 15 % a customer of a random district of another warehouse.
        let c_dk = if scale.warehouses > 1 && rng.gen_range(0..100) < 15 {
            let cw = (w + rng.gen_range(1..scale.warehouses)) % scale.warehouses;
            scale.district_key(cw, rng.gen_range(0..scale.districts_per_warehouse))
        } else {
            dk
        };
        PaymentInput {
            w,
            dk,
            customer: pick_customer(scale, c_dk, k, rng),
            amount_cents: rng.gen_range(100..=500_000i64),
        }
    }
}

/// OrderStatus's input (TPC-C §2.6.1).
#[derive(Debug, Clone)]
pub struct OrderStatusInput {
    pub customer: CustomerRef,
}

impl OrderStatusInput {
    pub fn random(scale: &Scale, k: &TpccRand, rng: &mut impl Rng) -> OrderStatusInput {
        let dk = rng.gen_range(0..scale.districts());
        OrderStatusInput {
            customer: pick_customer(scale, dk, k, rng),
        }
    }
}

/// Delivery's input (TPC-C §2.7.1).
#[derive(Debug, Clone)]
pub struct DeliveryInput {
    pub w: u64,
    pub carrier: i64,
}

impl DeliveryInput {
    pub fn random(scale: &Scale, rng: &mut impl Rng) -> DeliveryInput {
        DeliveryInput {
            w: rng.gen_range(0..scale.warehouses),
            carrier: rng.gen_range(1..=10i64),
        }
    }
}

/// StockLevel's input (TPC-C §2.8.1): a district of a warehouse and a
/// threshold.
#[derive(Debug, Clone)]
pub struct StockLevelInput {
    pub w: u64,
    pub dk: u64,
    pub threshold: i64,
}

impl StockLevelInput {
    pub fn random(scale: &Scale, rng: &mut impl Rng) -> StockLevelInput {
        let w = rng.gen_range(0..scale.warehouses);
        StockLevelInput {
            w,
            dk: scale.district_key(w, rng.gen_range(0..scale.districts_per_warehouse)),
            threshold: rng.gen_range(10..=20i64),
        }
    }
}

/// How a transaction body ended: commit its writes, or roll back on purpose
/// (NewOrder's unused item; nothing is written).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TxnEnd {
    Commit,
    Rollback,
}

fn id(n: u64) -> Bson {
    Bson::Int64(n as i64)
}

fn must(d: Option<DocRef>, coll: &str, key: u64) -> duetdb::Result<DocRef> {
    d.ok_or_else(|| duetdb::Error::Internal(format!("{coll} {key} is missing (schema invariant)")))
}

/// Update exactly one document by `_id`; anything else breaks the schema.
fn update_by_id(
    tx: &mut Transaction,
    coll: &str,
    key: u64,
    update: Document,
) -> duetdb::Result<()> {
    let r = tx.update_one(coll, doc! {"_id": key as i64}, update)?;
    if r.matched != 1 {
        return Err(duetdb::Error::Internal(format!(
            "{coll} {key} is missing (schema invariant)"
        )));
    }
    Ok(())
}

fn resolve_customer(tx: &mut Transaction, c: &CustomerRef) -> duetdb::Result<u64> {
    match c {
        CustomerRef::Key(k) => Ok(*k),
        CustomerRef::LastName { dk, name } => {
            let found = tx.find_with(
                CUSTOMER,
                doc! {"c_d_key": *dk as i64, "c_last": name},
                FindOptions {
                    sort: Some(doc! {"_id": 1}),
                    projection: Some(doc! {"_id": 1}),
                    ..Default::default()
                },
            )?;
            let mid = found.len().saturating_sub(1) / 2;
            match found.get(mid).map(|d| d.get("_id")) {
                Some(Some(Bson::Int64(k))) => Ok(*k as u64),
                _ => Err(duetdb::Error::Internal(format!(
                    "no customer named {name} in district {dk} (schema invariant)"
                ))),
            }
        }
    }
}

/// TPC-C NewOrder: take the district's next order number, insert the order,
/// its `new_order` row and its lines, and update the stock of every item.
/// Rolls back (writing nothing) when an item does not exist.
pub fn new_order(
    tx: &mut Transaction,
    scale: &Scale,
    inp: &NewOrderInput,
) -> duetdb::Result<TxnEnd> {
    let wh = must(tx.get(WAREHOUSE, &id(inp.w))?, WAREHOUSE, inp.w)?;
    let _w_tax = int(&wh, "w_tax_pct")?;
    let district = must(tx.get(DISTRICT, &id(inp.dk))?, DISTRICT, inp.dk)?;
    let o_id = int(&district, "d_next_o_id")?;
    update_by_id(tx, DISTRICT, inp.dk, doc! {"$inc": {"d_next_o_id": 1i64}})?;
    let customer = must(tx.get(CUSTOMER, &id(inp.c_key))?, CUSTOMER, inp.c_key)?;
    let _discount = int(&customer, "c_discount_pct")?;
    let o_key = scale.order_key(inp.dk, o_id.max(1) as u64) as i64;
    let all_local = inp.lines.iter().all(|l| l.supply_w == inp.w);
    tx.insert_one(
        ORDERS,
        doc! {
            "_id": o_key,
            "o_id": o_id,
            "o_d_key": inp.dk as i64,
            "o_c_key": inp.c_key as i64,
            "o_entry_day": NEW_ORDER_DAY,
            "o_orderpriority": inp.priority,
            "o_ol_cnt": inp.lines.len() as i64,
            "o_all_local": all_local,
            "o_comment": "new",
        },
    )?;
    tx.insert_one(
        NEW_ORDER,
        doc! {"_id": o_key, "no_d_key": inp.dk as i64, "no_o_id": o_id},
    )?;
    for (n, l) in inp.lines.iter().enumerate() {
        let Some(item) = tx.get(ITEM, &id(l.i_id))? else {
            return Ok(TxnEnd::Rollback);
        };
        let price = int(&item, "i_price_cents")?;
        let s_key = l.supply_w * scale.items + l.i_id;
        let stock = must(tx.get(STOCK, &id(s_key))?, STOCK, s_key)?;
        let q = int(&stock, "s_quantity")?;
        let new_q = if q >= l.quantity + 10 {
            q - l.quantity
        } else {
            q - l.quantity + 91
        };
        update_by_id(
            tx,
            STOCK,
            s_key,
            doc! {"$set": {"s_quantity": new_q}, "$inc": {
                "s_ytd": l.quantity,
                "s_order_cnt": 1i64,
                "s_remote_cnt": i64::from(l.supply_w != inp.w),
            }},
        )?;
        let number = n as i64 + 1;
        tx.insert_one(
            ORDER_LINE,
            doc! {
                "_id": o_key * LINES_PER_KEY + number,
                "ol_o_key": o_key,
                "ol_number": number,
                "ol_i_id": l.i_id as i64,
                "ol_quantity": l.quantity,
                "ol_extendedprice_cents": l.quantity * price,
                "ol_discount_pct": l.discount_pct,
                "ol_tax_pct": l.tax_pct,
                "ol_returnflag": if l.receipt_day <= CURRENT_DAY { "A" } else { "N" },
                "ol_linestatus": if l.ship_day > CURRENT_DAY { "O" } else { "F" },
                "ol_shipdate_day": l.ship_day,
                "ol_commitdate_day": l.commit_day,
                "ol_receiptdate_day": l.receipt_day,
                "ol_note": "new",
            },
        )?;
    }
    Ok(TxnEnd::Commit)
}

/// TPC-C Payment: add the amount to the warehouse's and the district's
/// year-to-date, move it from the customer's balance to their payments, and
/// record it in `history`.
pub fn payment(tx: &mut Transaction, inp: &PaymentInput) -> duetdb::Result<TxnEnd> {
    let amount = inp.amount_cents;
    update_by_id(tx, WAREHOUSE, inp.w, doc! {"$inc": {"w_ytd_cents": amount}})?;
    update_by_id(tx, DISTRICT, inp.dk, doc! {"$inc": {"d_ytd_cents": amount}})?;
    let c = resolve_customer(tx, &inp.customer)?;
    let customer = must(tx.get(CUSTOMER, &id(c))?, CUSTOMER, c)?;
    let c_dk = int(&customer, "c_d_key")?;
    update_by_id(
        tx,
        CUSTOMER,
        c,
        doc! {"$inc": {
            "c_balance_cents": -amount,
            "c_ytd_payment_cents": amount,
            "c_payment_cnt": 1i64,
        }},
    )?;
    tx.insert_one(
        HISTORY,
        doc! {
            "h_c_key": c as i64,
            "h_d_key": c_dk,
            "h_w_id": inp.w as i64,
            "h_amount_cents": amount,
            "h_day": NEW_ORDER_DAY,
        },
    )?;
    Ok(TxnEnd::Commit)
}

/// TPC-C OrderStatus (read-only): the customer's balance, their most recent
/// order and its lines. Returns the number of lines read.
pub fn order_status(tx: &mut Transaction, inp: &OrderStatusInput) -> duetdb::Result<u64> {
    let c = resolve_customer(tx, &inp.customer)?;
    let customer = must(tx.get(CUSTOMER, &id(c))?, CUSTOMER, c)?;
    let _balance = int(&customer, "c_balance_cents")?;
    let last = tx.find_with(
        ORDERS,
        doc! {"o_c_key": c as i64},
        FindOptions {
            sort: Some(doc! {"_id": -1}),
            limit: 1,
            ..Default::default()
        },
    )?;
    let Some(order) = last.first() else {
        return Ok(0); // a customer without orders (possible at small scales)
    };
    let o_key = match order.get("_id") {
        Some(Bson::Int64(k)) => *k,
        _ => return Err(duetdb::Error::Internal("order without integer _id".into())),
    };
    let lines = tx.find(ORDER_LINE, doc! {"ol_o_key": o_key})?;
    Ok(lines.len() as u64)
}

/// TPC-C Delivery, all the districts of the warehouse in one transaction
/// (TPC-C allows one to ten): in each district the oldest undelivered order
/// loses its `new_order` row, gets the carrier, its lines the delivery day,
/// and its customer the order's amount on their balance. Returns the orders
/// delivered (a district with none left is skipped, as TPC-C says).
pub fn delivery(tx: &mut Transaction, scale: &Scale, inp: &DeliveryInput) -> duetdb::Result<u64> {
    let mut delivered = 0;
    for d in 0..scale.districts_per_warehouse {
        let dk = scale.district_key(inp.w, d);
        let oldest = tx.find_with(
            NEW_ORDER,
            doc! {"no_d_key": dk as i64},
            FindOptions {
                sort: Some(doc! {"no_o_id": 1}),
                limit: 1,
                ..Default::default()
            },
        )?;
        let Some(row) = oldest.first() else {
            continue;
        };
        let o_key = row
            .get_i64("_id")
            .map_err(|_| duetdb::Error::Internal("new_order without integer _id".into()))?;
        if tx.delete_one(NEW_ORDER, doc! {"_id": o_key})? != 1 {
            return Err(duetdb::Error::Internal(format!(
                "new_order {o_key} vanished (schema invariant)"
            )));
        }
        let order = must(tx.get(ORDERS, &Bson::Int64(o_key))?, ORDERS, o_key as u64)?;
        let c_key = int(&order, "o_c_key")?;
        let mut amount = 0i64;
        for line in tx.find(ORDER_LINE, doc! {"ol_o_key": o_key})? {
            let (Ok(cents), Ok(l_key)) =
                (line.get_i64("ol_extendedprice_cents"), line.get_i64("_id"))
            else {
                return Err(duetdb::Error::Internal(format!(
                    "a line of order {o_key} without integer _id or amount (schema invariant)"
                )));
            };
            amount += cents;
            update_by_id(
                tx,
                ORDER_LINE,
                l_key as u64,
                doc! {"$set": {"ol_delivery_day": NEW_ORDER_DAY}},
            )?;
        }
        update_by_id(
            tx,
            ORDERS,
            o_key as u64,
            doc! {"$set": {"o_carrier_id": inp.carrier, "o_delivered_cents": amount}},
        )?;
        update_by_id(
            tx,
            CUSTOMER,
            c_key as u64,
            doc! {"$inc": {"c_balance_cents": amount, "c_delivery_cnt": 1i64}},
        )?;
        delivered += 1;
    }
    Ok(delivered)
}

/// TPC-C StockLevel (read-only): how many distinct items of the district's
/// last 20 orders have a stock below the threshold in its warehouse.
pub fn stock_level(
    tx: &mut Transaction,
    scale: &Scale,
    inp: &StockLevelInput,
) -> duetdb::Result<u64> {
    let district = must(tx.get(DISTRICT, &id(inp.dk))?, DISTRICT, inp.dk)?;
    let next = int(&district, "d_next_o_id")?;
    let mut items = std::collections::BTreeSet::new();
    for o_id in (next - 20).max(1)..next {
        let o_key = scale.order_key(inp.dk, o_id as u64) as i64;
        for line in tx.find(ORDER_LINE, doc! {"ol_o_key": o_key})? {
            if let Ok(i) = line.get_i64("ol_i_id") {
                items.insert(i as u64);
            }
        }
    }
    let mut low = 0;
    for i in items {
        let s_key = inp.w * scale.items + i;
        let stock = must(tx.get(STOCK, &id(s_key))?, STOCK, s_key)?;
        low += u64::from(int(&stock, "s_quantity")? < inp.threshold);
    }
    Ok(low)
}

/// Every violation of the consistency conditions in the module doc, as read
/// from one snapshot (at most `MAX_REPORTED` are listed, then a count).
pub fn check_consistency(snap: &Snapshot, scale: &Scale) -> duetdb::Result<Vec<String>> {
    const MAX_REPORTED: usize = 20;
    let mut bad: Vec<String> = Vec::new();
    let mut flag = |msg: String| bad.push(msg);
    let all = |coll: &str| snap.collection(coll).find(Document::new()).raw();

    // 1. warehouse ytd = Σ district ytd; and 5b. history.
    let mut d_ytd: HashMap<i64, i64> = HashMap::new();
    let mut next_o_id: HashMap<i64, i64> = HashMap::new();
    for d in all(DISTRICT)? {
        *d_ytd.entry(int(&d, "d_w_id")?).or_default() += int(&d, "d_ytd_cents")?;
        next_o_id.insert(int(&d, "_id")?, int(&d, "d_next_o_id")?);
    }
    let mut w_ytd_total = 0i64;
    let warehouses = all(WAREHOUSE)?;
    for w in &warehouses {
        let (key, ytd) = (int(w, "_id")?, int(w, "w_ytd_cents")?);
        w_ytd_total += ytd;
        let sum = d_ytd.get(&key).copied().unwrap_or(0);
        if ytd != sum {
            flag(format!("warehouse {key}: w_ytd {ytd} != Σ d_ytd {sum}"));
        }
    }
    let mut h_total = 0i64;
    for h in all(HISTORY)? {
        h_total += int(&h, "h_amount_cents")?;
    }
    let paid = w_ytd_total - warehouses.len() as i64 * W_YTD_START_CENTS;
    if h_total != paid {
        flag(format!("Σ h_amount {h_total} != Σ w_ytd − start {paid}"));
    }
    // 2. and 4. orders per district, lines per order; 5a's deliveries.
    let mut max_o_id: HashMap<i64, i64> = HashMap::new();
    let mut order_lines: HashMap<i64, (i64, i64)> = HashMap::new(); // o_key → (o_ol_cnt, lines seen)
    let mut delivered_to: HashMap<i64, i64> = HashMap::new(); // c_key → Σ o_delivered_cents
    let mut delivered: std::collections::HashSet<i64> = std::collections::HashSet::new();
    for o in all(ORDERS)? {
        let (key, dk, o_id) = (int(&o, "_id")?, int(&o, "o_d_key")?, int(&o, "o_id")?);
        if let Ok(cents) = o.get_i64("o_delivered_cents") {
            *delivered_to.entry(int(&o, "o_c_key")?).or_default() += cents;
            delivered.insert(key);
        }
        if scale.order_key(dk as u64, o_id as u64) as i64 != key {
            flag(format!(
                "order {key}: _id is not the key of (district {dk}, o_id {o_id})"
            ));
        }
        let m = max_o_id.entry(dk).or_insert(0);
        *m = (*m).max(o_id);
        order_lines.insert(key, (int(&o, "o_ol_cnt")?, 0));
    }
    for l in all(ORDER_LINE)? {
        let (o, n) = (int(&l, "ol_o_key")?, int(&l, "ol_number")?);
        if delivered.contains(&o) && l.get_i64("ol_delivery_day").is_err() {
            flag(format!(
                "line {n} of delivered order {o} has no ol_delivery_day"
            ));
        }
        match order_lines.get_mut(&o) {
            Some((cnt, seen)) if (1..=*cnt).contains(&n) => *seen += 1,
            Some((cnt, _)) => flag(format!(
                "line of order {o}: ol_number {n} outside 1..={cnt}"
            )),
            None => flag(format!("line {} of missing order {o}", int(&l, "_id")?)),
        }
    }
    for (o, (cnt, seen)) in &order_lines {
        if cnt != seen {
            flag(format!("order {o}: o_ol_cnt {cnt} but {seen} lines"));
        }
    }
    // 2. and 3. new_order per district.
    let mut no: HashMap<i64, (i64, i64, i64)> = HashMap::new(); // dk → (min, max, count)
                                                                // 5a. customers: payments and deliveries.
    for c in all(CUSTOMER)? {
        let (key, b) = (int(&c, "_id")?, int(&c, "c_balance_cents")?);
        let p = int(&c, "c_ytd_payment_cents")?;
        let owed = delivered_to.get(&key).copied().unwrap_or(0);
        if b + p != owed {
            flag(format!(
                "customer {key}: balance {b} + ytd_payment {p} != delivered {owed}"
            ));
        }
    }
    for r in all(NEW_ORDER)? {
        let (dk, o_id) = (int(&r, "no_d_key")?, int(&r, "no_o_id")?);
        if delivered.contains(&int(&r, "_id")?) {
            flag(format!(
                "district {dk}: order {o_id} delivered but still in new_order"
            ));
        }
        let e = no.entry(dk).or_insert((i64::MAX, i64::MIN, 0));
        *e = (e.0.min(o_id), e.1.max(o_id), e.2 + 1);
    }
    for (dk, next) in &next_o_id {
        let max_o = max_o_id.get(dk).copied().unwrap_or(0);
        let (min_no, max_no, count_no) = no.get(dk).copied().unwrap_or((0, 0, 0));
        if next - 1 != max_o || (count_no > 0 && next - 1 != max_no) {
            flag(format!(
                "district {dk}: d_next_o_id − 1 = {} but max o_id {max_o}, max no_o_id {max_no}",
                next - 1
            ));
        }
        if count_no > 0 && max_no - min_no + 1 != count_no {
            flag(format!(
                "district {dk}: new_order ids {min_no}..={max_no} but {count_no} rows"
            ));
        }
    }
    if bad.len() > MAX_REPORTED {
        let more = bad.len() - MAX_REPORTED;
        bad.truncate(MAX_REPORTED);
        bad.push(format!("… and {more} more"));
    }
    Ok(bad)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generation_is_deterministic_and_scaled() {
        let scale = Scale::new(0.01).expect("scale");
        assert_eq!(scale.orders(), 300);
        let collect = |seed| {
            let mut all = Vec::new();
            generate(&scale, seed, 64, |name, docs| {
                all.extend(docs.into_iter().map(|d| (name.to_string(), d)));
                Ok(())
            })
            .expect("generate");
            all
        };
        let a = collect(7);
        assert_eq!(a, collect(7));
        assert_ne!(a, collect(8));
        let lines = a.iter().filter(|(n, _)| n == ORDER_LINE).count();
        assert!((300 * 5..=300 * 15).contains(&lines), "{lines}");
        assert!(Scale::new(0.0).is_err());
        assert_eq!(Scale::new(2.0).expect("sf 2").warehouses, 2);
    }
}
