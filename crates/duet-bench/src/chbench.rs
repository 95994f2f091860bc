//! A CH-benCHmark-style data set (TPC-C's schema with TPC-H's analytic fields
//! on `order_line`): a deterministic generator with a scale factor and a loader
//! into duetdb collections with the indexes the TPC-H queries (`tpch.rs`) need.
//!
//! Owns the schema below; nothing else in the crate writes these collections.
//!
//! | collection   | `_id`                         | fields used by queries |
//! |---|---|---|
//! | `warehouse`  | w                             | – |
//! | `district`   | w·10 + d                      | – |
//! | `customer`   | (w·10 + d)·C + c              | – |
//! | `item`       | i (the TPC-H part)            | `i_brand`, `i_container`, `i_price_cents` |
//! | `orders`     | o_key (global, in time order) | `o_entry_day` (indexed), `o_orderpriority` |
//! | `order_line` | o_key·16 + ol_number          | `ol_o_key` (indexed), `ol_i_id`, `ol_quantity`, `ol_extendedprice_cents`, `ol_discount_pct`, `ol_tax_pct`, `ol_returnflag`, `ol_linestatus`, `ol_shipdate_day`, `ol_commitdate_day`, `ol_receiptdate_day` |
//!
//! Dates are whole days since 1992-01-01 (`*_day`); money is integer cents
//! (`*_cents`) and rates integer percent (`*_pct`), so every query result can
//! be compared exactly. `ol_note` and `o_comment` are never read by a query:
//! updates of them are answer-neutral.
//!
//! Scale: `sf = 1` is one warehouse with TPC-C's cardinalities (10 districts,
//! 3,000 customers and 3,000 orders per district, 5–15 lines per order,
//! 100,000 items); `sf = n` is n warehouses; a fractional `sf` shrinks the
//! per-district counts and the item table (for tests).

use anyhow::{ensure, Result};
use bson::{doc, Document};
use duetdb::{Database, IndexOptions};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

pub const WAREHOUSE: &str = "warehouse";
pub const DISTRICT: &str = "district";
pub const CUSTOMER: &str = "customer";
pub const ITEM: &str = "item";
pub const ORDERS: &str = "orders";
pub const ORDER_LINE: &str = "order_line";

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

/// Generate the whole data set, handing each collection's documents to `sink`
/// in batches of at most `batch` (deterministic for a given seed and scale).
pub fn generate(
    scale: &Scale,
    seed: u64,
    batch: usize,
    mut sink: impl FnMut(&str, Vec<Document>) -> Result<()>,
) -> Result<()> {
    let mut rng = StdRng::seed_from_u64(seed);
    let batch = batch.max(1);
    let mut buf: Vec<Document> = Vec::with_capacity(batch);
    type Sink<'a> = dyn FnMut(&str, Vec<Document>) -> Result<()> + 'a;
    let flush = |sink: &mut Sink, name: &str, buf: &mut Vec<Document>, force: bool| -> Result<()> {
        if !buf.is_empty() && (force || buf.len() >= batch) {
            sink(name, std::mem::take(buf))?;
        }
        Ok(())
    };

    // item: prices are looked up again by the order lines below.
    let mut prices = Vec::with_capacity(scale.items as usize);
    for i in 0..scale.items {
        let d = item_doc(i, &mut rng);
        prices.push(d.get_i64("i_price_cents").unwrap_or(100));
        buf.push(d);
        flush(&mut sink, ITEM, &mut buf, false)?;
    }
    flush(&mut sink, ITEM, &mut buf, true)?;

    for w in 0..scale.warehouses {
        buf.push(doc! {"_id": w as i64, "w_name": format!("wh-{w}"), "w_ytd_cents": 30_000_000i64});
    }
    flush(&mut sink, WAREHOUSE, &mut buf, true)?;
    for dk in 0..scale.districts() {
        buf.push(
            doc! {"_id": dk as i64, "d_w_id": (dk / scale.districts_per_warehouse) as i64,
            "d_next_o_id": scale.orders_per_district as i64 + 1},
        );
    }
    flush(&mut sink, DISTRICT, &mut buf, true)?;
    for dk in 0..scale.districts() {
        for c in 0..scale.customers_per_district {
            buf.push(doc! {
                "_id": (dk * scale.customers_per_district + c) as i64,
                "c_d_key": dk as i64,
                "c_balance_cents": -1000i64,
                "c_data": format!("{:c>40}", rng.gen::<u32>()),
            });
            flush(&mut sink, CUSTOMER, &mut buf, false)?;
        }
    }
    flush(&mut sink, CUSTOMER, &mut buf, true)?;

    // orders in entry-day order: o_key grows with time (as TPC-C order ids do
    // per district), spread over 1992-01-01..1998-08-02.
    let orders = scale.orders();
    let mut lines: Vec<Document> = Vec::with_capacity(batch);
    for o in 0..orders {
        let entry_day = (o as i64 * LAST_ENTRY_DAY) / orders.max(1) as i64;
        let dk = o % scale.districts();
        let ol_cnt = rng.gen_range(5..=15i64);
        buf.push(doc! {
            "_id": o as i64,
            "o_d_key": dk as i64,
            "o_c_key": (dk * scale.customers_per_district + rng.gen_range(0..scale.customers_per_district)) as i64,
            "o_entry_day": entry_day,
            "o_orderpriority": PRIORITIES[rng.gen_range(0..PRIORITIES.len())],
            "o_ol_cnt": ol_cnt,
            "o_comment": format!("{:o>20}", rng.gen::<u32>()),
        });
        flush(&mut sink, ORDERS, &mut buf, false)?;
        for n in 1..=ol_cnt {
            let i_id = rng.gen_range(0..scale.items);
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
            lines.push(doc! {
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
            });
            if lines.len() >= batch {
                sink(ORDER_LINE, std::mem::take(&mut lines))?;
            }
        }
    }
    flush(&mut sink, ORDERS, &mut buf, true)?;
    if !lines.is_empty() {
        sink(ORDER_LINE, lines)?;
    }
    Ok(())
}

/// What was loaded.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct Loaded {
    pub items: u64,
    pub orders: u64,
    pub order_lines: u64,
    pub customers: u64,
}

/// Drop and reload every collection of the data set into `db`, then build the
/// indexes the queries use: `orders.o_entry_day` (Q4's scan range) and
/// `order_line.ol_o_key` (Q4's point lookups by order).
pub fn load(db: &Database, scale: &Scale, seed: u64) -> Result<Loaded> {
    for name in [WAREHOUSE, DISTRICT, CUSTOMER, ITEM, ORDERS, ORDER_LINE] {
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
            _ => {}
        }
        db.collection(name).insert_many(docs, true)?;
        Ok(())
    })?;
    db.collection(ORDERS)
        .create_index(doc! {"o_entry_day": 1}, IndexOptions::default())?;
    db.collection(ORDER_LINE)
        .create_index(doc! {"ol_o_key": 1}, IndexOptions::default())?;
    Ok(loaded)
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
