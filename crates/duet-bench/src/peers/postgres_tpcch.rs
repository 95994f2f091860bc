//! TPC-CH on the PostgreSQL peer (AnKer's comparison with a single-engine
//! snapshot-isolation system): the data set `chbench.rs` generates, loaded
//! with COPY into tables of the same names and fields (schema `tpcch`;
//! `_id` becomes `id`), the five TPC-C transactions as SQL transactions under
//! REPEATABLE READ (PostgreSQL's snapshot isolation; `--isolation
//! serializable` is SERIALIZABLE), TPC-H Q1, Q4 and Q17 as SQL in read-only
//! REPEATABLE READ transactions on their own connections, and TPC-C's
//! consistency conditions as SQL.
//!
//! Invariants kept equal to the duet side (`workload/tpcch.rs`, `chbench.rs`)
//! so the figures compare like with like:
//! - the same generated rows (same seed), the same secondary indexes;
//! - each transaction does what its `chbench` twin does and draws the same
//!   inputs (`NewOrderInput::random` …); a serialization failure or deadlock
//!   (SQLSTATE 40001 / 40P01) is retried with the same input and counted as
//!   a conflict, exactly where duet counts a write conflict;
//! - each query returns the same exact `tpch::Answer` type, so answers are
//!   compared with `==`: against the reference evaluation of the generated
//!   rows (with `verify`), against duet's answer at load when both ran, and
//!   Q4 during the run against its answer at load (`q4_wrong`);
//! - after a run the consistency conditions of `chbench::check_consistency`
//!   are checked by [`check_consistency`] with the same messages.
//!
//! Every statement is prepared once per connection (as a JDBC client would);
//! sessions set `synchronous_commit = off` (the duet target is in memory) and
//! analytic sessions `max_parallel_workers_per_gather = query_threads − 1`,
//! the parallelism duet's OLCP queries get.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::time::Instant;

use anyhow::{anyhow, bail, ensure, Context, Result};
use bson::{Bson, Document};
use postgres::error::SqlState;
use postgres::{Client, IsolationLevel, NoTls, Statement};
use rand::rngs::StdRng;
use rand::SeedableRng;

use crate::chbench::{
    self, CustomerRef, DeliveryInput, NewOrderInput, OrderStatusInput, PaymentInput, Scale,
    StockLevelInput, TpccRand, TxnEnd, CURRENT_DAY, LINES_PER_KEY, NEW_ORDER_DAY,
    W_YTD_START_CENTS,
};
use crate::stats::Latencies;
use crate::tpch::{self, Answer, Q17Params, Q1Group, Query, Q1, Q17, Q4};
use crate::workload::tpcch::{choose, CellOut, Kind, Params, KINDS};
use crate::workload::ycsbt::{backoff, Attempts, IsolationArg};
use crate::workload::{timed_cell, CellClock};

/// The target's name in results.
pub const TARGET: &str = "postgres";

/// The schema every table lives in (dropped and recreated by [`load`]).
const SCHEMA: &str = "tpcch";

/// Each collection's table: its columns besides `id`, named as the
/// document fields. Columns no loaded document has are set by the
/// transactions (`o_carrier_id`, …) and load as NULL.
const TABLES: [(&str, &[(&str, &str)]); 9] = [
    (
        chbench::WAREHOUSE,
        &[
            ("w_name", "text"),
            ("w_ytd_cents", "bigint"),
            ("w_tax_pct", "bigint"),
        ],
    ),
    (
        chbench::DISTRICT,
        &[
            ("d_w_id", "bigint"),
            ("d_next_o_id", "bigint"),
            ("d_ytd_cents", "bigint"),
            ("d_tax_pct", "bigint"),
        ],
    ),
    (
        chbench::CUSTOMER,
        &[
            ("c_d_key", "bigint"),
            ("c_last", "text"),
            ("c_balance_cents", "bigint"),
            ("c_ytd_payment_cents", "bigint"),
            ("c_payment_cnt", "bigint"),
            ("c_discount_pct", "bigint"),
            ("c_data", "text"),
            ("c_delivery_cnt", "bigint"),
        ],
    ),
    (
        chbench::ITEM,
        &[
            ("i_im_id", "bigint"),
            ("i_name", "text"),
            ("i_price_cents", "bigint"),
            ("i_brand", "text"),
            ("i_container", "text"),
            ("i_data", "text"),
        ],
    ),
    (
        chbench::STOCK,
        &[
            ("s_w_id", "bigint"),
            ("s_i_id", "bigint"),
            ("s_quantity", "bigint"),
            ("s_ytd", "bigint"),
            ("s_order_cnt", "bigint"),
            ("s_remote_cnt", "bigint"),
        ],
    ),
    (
        chbench::ORDERS,
        &[
            ("o_id", "bigint"),
            ("o_d_key", "bigint"),
            ("o_c_key", "bigint"),
            ("o_entry_day", "bigint"),
            ("o_orderpriority", "text"),
            ("o_ol_cnt", "bigint"),
            ("o_all_local", "boolean"),
            ("o_comment", "text"),
            ("o_carrier_id", "bigint"),
            ("o_delivered_cents", "bigint"),
        ],
    ),
    (
        chbench::NEW_ORDER,
        &[("no_d_key", "bigint"), ("no_o_id", "bigint")],
    ),
    (
        chbench::ORDER_LINE,
        &[
            ("ol_o_key", "bigint"),
            ("ol_number", "bigint"),
            ("ol_i_id", "bigint"),
            ("ol_quantity", "bigint"),
            ("ol_extendedprice_cents", "bigint"),
            ("ol_discount_pct", "bigint"),
            ("ol_tax_pct", "bigint"),
            ("ol_returnflag", "text"),
            ("ol_linestatus", "text"),
            ("ol_shipdate_day", "bigint"),
            ("ol_commitdate_day", "bigint"),
            ("ol_receiptdate_day", "bigint"),
            ("ol_note", "text"),
            ("ol_delivery_day", "bigint"),
        ],
    ),
    (
        chbench::HISTORY,
        &[
            ("h_c_key", "bigint"),
            ("h_d_key", "bigint"),
            ("h_w_id", "bigint"),
            ("h_amount_cents", "bigint"),
            ("h_day", "bigint"),
        ],
    ),
];

/// The secondary indexes `chbench::load` builds, on the same fields.
const INDEXES: [&str; 5] = [
    "CREATE INDEX ON orders (o_entry_day)",
    "CREATE INDEX ON order_line (ol_o_key)",
    "CREATE INDEX ON orders (o_c_key)",
    "CREATE INDEX ON customer (c_d_key, c_last)",
    "CREATE INDEX ON new_order (no_d_key, no_o_id)",
];

/// A connection to the server: `conn` is a libpq-style string (`--pg`).
pub fn connect(conn: &str) -> Result<Client> {
    let mut c = Client::connect(conn, NoTls).with_context(|| {
        format!("connecting to PostgreSQL ({conn}); start it with scripts/peers/postgres.sh start")
    })?;
    c.batch_execute(&format!(
        "SET synchronous_commit = off; SET search_path = {SCHEMA}"
    ))?;
    Ok(c)
}

/// One value of a document in COPY's text format.
fn copy_value(out: &mut String, v: Option<&Bson>) -> Result<()> {
    match v {
        None | Some(Bson::Null) => out.push_str("\\N"),
        Some(Bson::Int64(n)) => write!(out, "{n}")?,
        Some(Bson::Int32(n)) => write!(out, "{n}")?,
        Some(Bson::Boolean(b)) => out.push(if *b { 't' } else { 'f' }),
        Some(Bson::String(s)) => {
            for ch in s.chars() {
                match ch {
                    '\\' => out.push_str("\\\\"),
                    '\t' => out.push_str("\\t"),
                    '\n' => out.push_str("\\n"),
                    '\r' => out.push_str("\\r"),
                    c => out.push(c),
                }
            }
        }
        Some(other) => bail!("no SQL column type for {other:?}"),
    }
    Ok(())
}

/// What [`load`] read back: the answers at load and the data set's counts.
pub struct LoadedPg {
    pub q17: Q17Params,
    pub at_load: Vec<(Query, Answer)>,
    /// (items, orders, lines) as generated, kept only when verifying.
    pub copy: Option<(Vec<Document>, Vec<Document>, Vec<Document>)>,
}

/// Drop and recreate the schema, COPY the generated data set into it, build
/// the indexes, analyze, and run the three queries once (their answers at
/// load). With `keep_copy`, the generated items, orders and lines are kept
/// for the reference evaluation.
pub fn load(c: &mut Client, scale: &Scale, seed: u64, keep_copy: bool) -> Result<LoadedPg> {
    let mut ddl = format!("DROP SCHEMA IF EXISTS {SCHEMA} CASCADE; CREATE SCHEMA {SCHEMA};");
    for (table, cols) in TABLES {
        let id = if table == chbench::HISTORY {
            "id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY"
        } else {
            "id bigint PRIMARY KEY"
        };
        let cols: Vec<String> = cols.iter().map(|(n, t)| format!("{n} {t}")).collect();
        write!(
            ddl,
            "CREATE TABLE {SCHEMA}.{table} ({id}, {});",
            cols.join(", ")
        )?;
    }
    c.batch_execute(&ddl)?;
    let mut copy: (Vec<Document>, Vec<Document>, Vec<Document>) = Default::default();
    chbench::generate(scale, seed, 10_000, |name, docs| {
        let Some((_, cols)) = TABLES.iter().find(|(t, _)| *t == name) else {
            bail!("no table for collection {name}");
        };
        let mut text = String::new();
        for d in &docs {
            // A field with no column would be lost silently: refuse it.
            if let Some(k) = d
                .keys()
                .find(|k| *k != "_id" && !cols.iter().any(|(n, _)| n == k))
            {
                bail!("{name}: generated field {k} has no column");
            }
            copy_value(&mut text, d.get("_id"))?;
            for (col, _) in cols.iter() {
                text.push('\t');
                copy_value(&mut text, d.get(*col))?;
            }
            text.push('\n');
        }
        let names: Vec<&str> = cols.iter().map(|(n, _)| *n).collect();
        let mut w = c.copy_in(&format!(
            "COPY {name} (id, {}) FROM STDIN",
            names.join(", ")
        ))?;
        std::io::Write::write_all(&mut w, text.as_bytes())?;
        w.finish()?;
        if keep_copy {
            match name {
                chbench::ITEM => copy.0.extend(docs),
                chbench::ORDERS => copy.1.extend(docs),
                chbench::ORDER_LINE => copy.2.extend(docs),
                _ => {}
            }
        }
        Ok(())
    })?;
    for ix in INDEXES {
        c.batch_execute(ix)?;
    }
    // VACUUM may not run inside the implicit transaction of a multi-statement batch.
    c.batch_execute("VACUUM ANALYZE")?;
    // As `tpch::q17_params_for`: the part of the lowest-keyed order line.
    let q17 = match c.query_opt(
        "SELECT i_brand, i_container FROM item \
         WHERE id = (SELECT ol_i_id FROM order_line ORDER BY id LIMIT 1)",
        &[],
    )? {
        Some(row) => Q17Params {
            brand: row.get(0),
            container: row.get(1),
        },
        None => Q17Params::default(),
    };
    let mut qs = Queries::prepare(c)?;
    let mut at_load = Vec::new();
    for q in Query::ALL {
        at_load.push((q, qs.run(c, q, &q17)?));
    }
    Ok(LoadedPg {
        q17,
        at_load,
        copy: keep_copy.then_some(copy),
    })
}

/// The analytic queries, prepared on one connection.
struct Queries {
    q1: Statement,
    q4: Statement,
    q17: Statement,
}

/// A numeric sum read as text (PostgreSQL's `sum(bigint)` is `numeric`).
fn exact(row: &postgres::Row, i: usize) -> Result<i128> {
    let s: String = row.try_get(i)?;
    s.parse::<i128>()
        .map_err(|_| anyhow!("sum {s:?} is not an integer"))
}

impl Queries {
    fn prepare(c: &mut Client) -> Result<Queries> {
        Ok(Queries {
            q1: c.prepare(
                "SELECT ol_returnflag, ol_linestatus, sum(ol_quantity)::text, \
                 sum(ol_extendedprice_cents)::text, \
                 sum(ol_extendedprice_cents::numeric * (100 - ol_discount_pct))::text, \
                 sum(ol_extendedprice_cents::numeric * (100 - ol_discount_pct) * (100 + ol_tax_pct))::text, \
                 sum(ol_discount_pct)::text, count(*) \
                 FROM order_line WHERE ol_shipdate_day <= $1 \
                 GROUP BY ol_returnflag, ol_linestatus",
            )?,
            q4: c.prepare(
                "SELECT o_orderpriority, count(*) FROM orders o \
                 WHERE o_entry_day >= $1 AND o_entry_day < $2 AND EXISTS \
                 (SELECT 1 FROM order_line l WHERE l.ol_o_key = o.id \
                  AND l.ol_commitdate_day < l.ol_receiptdate_day) \
                 GROUP BY o_orderpriority",
            )?,
            // The correlated subquery of TPC-H's Q17 as a grouped CTE; the
            // filter `qty < 0.2 · avg` in integers, as `tpch::reference_q17`.
            q17: c.prepare(
                "WITH parts AS (SELECT ol_i_id, sum(ol_quantity) AS sq, count(*) AS n \
                   FROM order_line JOIN item ON item.id = order_line.ol_i_id \
                   WHERE i_brand = $1 AND i_container = $2 GROUP BY ol_i_id) \
                 SELECT (SELECT count(*) FROM parts), \
                   coalesce(sum(l.ol_extendedprice_cents), 0)::text, count(l.id) \
                 FROM order_line l JOIN parts p ON l.ol_i_id = p.ol_i_id \
                 WHERE 5 * l.ol_quantity * p.n < p.sq",
            )?,
        })
    }

    /// Run `q` in a read-only REPEATABLE READ transaction (one snapshot).
    fn run(&mut self, c: &mut Client, q: Query, p17: &Q17Params) -> Result<Answer> {
        let mut tx = c
            .build_transaction()
            .isolation_level(IsolationLevel::RepeatableRead)
            .read_only(true)
            .start()?;
        let answer = match q {
            Query::Q1 => {
                let mut out = Q1::new();
                for row in tx.query(&self.q1, &[&tpch::Q1_CUTOFF_DAY])? {
                    let count: i64 = row.try_get(7)?;
                    out.insert(
                        (row.try_get(0)?, row.try_get(1)?),
                        Q1Group {
                            sum_qty: exact(&row, 2)? as i64,
                            sum_base_price_cents: exact(&row, 3)? as i64,
                            sum_disc_price_centicents: exact(&row, 4)?,
                            sum_charge_cents_e4: exact(&row, 5)?,
                            sum_discount_pct: exact(&row, 6)? as i64,
                            count_order: count as u64,
                        },
                    );
                }
                Answer::Q1(out)
            }
            Query::Q4 => {
                let mut out = Q4::new();
                for row in tx.query(&self.q4, &[&tpch::Q4_FROM_DAY, &tpch::Q4_TO_DAY])? {
                    let n: i64 = row.try_get(1)?;
                    out.insert(row.try_get(0)?, n as u64);
                }
                Answer::Q4(out)
            }
            Query::Q17 => {
                let row = tx.query_one(&self.q17, &[&p17.brand, &p17.container])?;
                let (parts, lines): (i64, i64) = (row.try_get(0)?, row.try_get(2)?);
                Answer::Q17(Q17 {
                    sum_price_cents: exact(&row, 1)? as i64,
                    parts: parts as u64,
                    lines: lines as u64,
                })
            }
        };
        tx.commit()?;
        Ok(answer)
    }
}

/// The TPC-C statements, prepared on one connection.
struct Stmts {
    w_tax: Statement,
    d_take_next: Statement,
    c_discount: Statement,
    ins_order: Statement,
    ins_new_order: Statement,
    item_price: Statement,
    upd_stock: Statement,
    ins_line: Statement,
    w_ytd: Statement,
    d_ytd: Statement,
    c_by_name: Statement,
    c_pay: Statement,
    ins_history: Statement,
    c_balance: Statement,
    last_order: Statement,
    lines_of: Statement,
    oldest_new: Statement,
    del_new: Statement,
    order_customer: Statement,
    deliver_lines: Statement,
    deliver_order: Statement,
    deliver_customer: Statement,
    d_next: Statement,
    stock_low: Statement,
}

impl Stmts {
    fn prepare(c: &mut Client) -> Result<Stmts> {
        let mut p = |sql: &str| c.prepare(sql);
        Ok(Stmts {
            w_tax: p("SELECT w_tax_pct FROM warehouse WHERE id = $1")?,
            d_take_next: p(
                "UPDATE district SET d_next_o_id = d_next_o_id + 1 WHERE id = $1 \
                 RETURNING d_next_o_id - 1, d_tax_pct",
            )?,
            c_discount: p("SELECT c_discount_pct FROM customer WHERE id = $1")?,
            ins_order: p(
                "INSERT INTO orders (id, o_id, o_d_key, o_c_key, o_entry_day, o_orderpriority, \
                 o_ol_cnt, o_all_local, o_comment) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, 'new')",
            )?,
            ins_new_order: p("INSERT INTO new_order (id, no_d_key, no_o_id) VALUES ($1, $2, $3)")?,
            item_price: p("SELECT i_price_cents FROM item WHERE id = $1")?,
            // NewOrder's read of s_quantity and its update, in one statement.
            upd_stock: p(
                "UPDATE stock SET s_quantity = CASE WHEN s_quantity >= $2::bigint + 10 \
                 THEN s_quantity - $2::bigint ELSE s_quantity - $2::bigint + 91 END, \
                 s_ytd = s_ytd + $2::bigint, s_order_cnt = s_order_cnt + 1, \
                 s_remote_cnt = s_remote_cnt + $3::bigint WHERE id = $1",
            )?,
            ins_line: p(
                "INSERT INTO order_line (id, ol_o_key, ol_number, ol_i_id, ol_quantity, \
                 ol_extendedprice_cents, ol_discount_pct, ol_tax_pct, ol_returnflag, ol_linestatus, \
                 ol_shipdate_day, ol_commitdate_day, ol_receiptdate_day, ol_note) \
                 VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, 'new')",
            )?,
            w_ytd: p("UPDATE warehouse SET w_ytd_cents = w_ytd_cents + $2 WHERE id = $1")?,
            d_ytd: p("UPDATE district SET d_ytd_cents = d_ytd_cents + $2 WHERE id = $1")?,
            c_by_name: p("SELECT id FROM customer WHERE c_d_key = $1 AND c_last = $2 ORDER BY id")?,
            c_pay: p(
                "UPDATE customer SET c_balance_cents = c_balance_cents - $2, \
                 c_ytd_payment_cents = c_ytd_payment_cents + $2, \
                 c_payment_cnt = c_payment_cnt + 1 WHERE id = $1 RETURNING c_d_key",
            )?,
            ins_history: p(
                "INSERT INTO history (h_c_key, h_d_key, h_w_id, h_amount_cents, h_day) \
                 VALUES ($1, $2, $3, $4, $5)",
            )?,
            c_balance: p("SELECT c_balance_cents FROM customer WHERE id = $1")?,
            last_order: p("SELECT id FROM orders WHERE o_c_key = $1 ORDER BY id DESC LIMIT 1")?,
            lines_of: p(
                "SELECT ol_i_id, ol_quantity, ol_extendedprice_cents FROM order_line \
                 WHERE ol_o_key = $1",
            )?,
            oldest_new: p(
                "SELECT id FROM new_order WHERE no_d_key = $1 ORDER BY no_o_id LIMIT 1",
            )?,
            del_new: p("DELETE FROM new_order WHERE id = $1")?,
            order_customer: p("SELECT o_c_key FROM orders WHERE id = $1")?,
            deliver_lines: p(
                "UPDATE order_line SET ol_delivery_day = $2 WHERE ol_o_key = $1 \
                 RETURNING ol_extendedprice_cents",
            )?,
            deliver_order: p(
                "UPDATE orders SET o_carrier_id = $2, o_delivered_cents = $3 WHERE id = $1",
            )?,
            deliver_customer: p(
                "UPDATE customer SET c_balance_cents = c_balance_cents + $2, \
                 c_delivery_cnt = coalesce(c_delivery_cnt, 0) + 1 WHERE id = $1",
            )?,
            d_next: p("SELECT d_next_o_id FROM district WHERE id = $1")?,
            stock_low: p(
                "SELECT count(DISTINCT ol.ol_i_id) FROM order_line ol \
                 JOIN stock s ON s.id = $2::bigint + ol.ol_i_id \
                 WHERE ol.ol_o_key = ANY($1) AND s.s_quantity < $3",
            )?,
        })
    }
}

type Tx<'a> = postgres::Transaction<'a>;

/// A statement that must touch exactly one row (a schema invariant).
fn one(tx: &mut Tx, st: &Statement, args: &[&(dyn postgres::types::ToSql + Sync)]) -> Result<()> {
    let n = tx.execute(st, args)?;
    ensure!(n == 1, "{n} rows where one was expected (schema invariant)");
    Ok(())
}

fn new_order(tx: &mut Tx, s: &Stmts, scale: &Scale, inp: &NewOrderInput) -> Result<TxnEnd> {
    let (w, dk, c_key) = (inp.w as i64, inp.dk as i64, inp.c_key as i64);
    let _w_tax: i64 = tx.query_one(&s.w_tax, &[&w])?.try_get(0)?;
    let o_id: i64 = tx.query_one(&s.d_take_next, &[&dk])?.try_get(0)?;
    let _discount: i64 = tx.query_one(&s.c_discount, &[&c_key])?.try_get(0)?;
    let o_key = scale.order_key(inp.dk, o_id.max(1) as u64) as i64;
    let all_local = inp.lines.iter().all(|l| l.supply_w == inp.w);
    let ol_cnt = inp.lines.len() as i64;
    one(
        tx,
        &s.ins_order,
        &[
            &o_key,
            &o_id,
            &dk,
            &c_key,
            &NEW_ORDER_DAY,
            &inp.priority,
            &ol_cnt,
            &all_local,
        ],
    )?;
    one(tx, &s.ins_new_order, &[&o_key, &dk, &o_id])?;
    for (n, l) in inp.lines.iter().enumerate() {
        let Some(item) = tx.query_opt(&s.item_price, &[&(l.i_id as i64)])? else {
            return Ok(TxnEnd::Rollback);
        };
        let price: i64 = item.try_get(0)?;
        let s_key = (l.supply_w * scale.items + l.i_id) as i64;
        let remote = i64::from(l.supply_w != inp.w);
        one(tx, &s.upd_stock, &[&s_key, &l.quantity, &remote])?;
        let number = n as i64 + 1;
        let flag = if l.receipt_day <= CURRENT_DAY {
            "A"
        } else {
            "N"
        };
        let status = if l.ship_day > CURRENT_DAY { "O" } else { "F" };
        one(
            tx,
            &s.ins_line,
            &[
                &(o_key * LINES_PER_KEY + number),
                &o_key,
                &number,
                &(l.i_id as i64),
                &l.quantity,
                &(l.quantity * price),
                &l.discount_pct,
                &l.tax_pct,
                &flag,
                &status,
                &l.ship_day,
                &l.commit_day,
                &l.receipt_day,
            ],
        )?;
    }
    Ok(TxnEnd::Commit)
}

fn resolve_customer(tx: &mut Tx, s: &Stmts, c: &CustomerRef) -> Result<i64> {
    match c {
        CustomerRef::Key(k) => Ok(*k as i64),
        CustomerRef::LastName { dk, name } => {
            let found = tx.query(&s.c_by_name, &[&(*dk as i64), name])?;
            let mid = found.len().saturating_sub(1) / 2;
            match found.get(mid) {
                Some(row) => Ok(row.try_get(0)?),
                None => bail!("no customer named {name} in district {dk} (schema invariant)"),
            }
        }
    }
}

fn payment(tx: &mut Tx, s: &Stmts, inp: &PaymentInput) -> Result<()> {
    let amount = inp.amount_cents;
    one(tx, &s.w_ytd, &[&(inp.w as i64), &amount])?;
    one(tx, &s.d_ytd, &[&(inp.dk as i64), &amount])?;
    let c = resolve_customer(tx, s, &inp.customer)?;
    let c_dk: i64 = tx.query_one(&s.c_pay, &[&c, &amount])?.try_get(0)?;
    one(
        tx,
        &s.ins_history,
        &[&c, &c_dk, &(inp.w as i64), &amount, &NEW_ORDER_DAY],
    )
}

fn order_status(tx: &mut Tx, s: &Stmts, inp: &OrderStatusInput) -> Result<u64> {
    let c = resolve_customer(tx, s, &inp.customer)?;
    let _balance: i64 = tx.query_one(&s.c_balance, &[&c])?.try_get(0)?;
    let Some(order) = tx.query_opt(&s.last_order, &[&c])? else {
        return Ok(0);
    };
    let o_key: i64 = order.try_get(0)?;
    Ok(tx.query(&s.lines_of, &[&o_key])?.len() as u64)
}

fn delivery(tx: &mut Tx, s: &Stmts, scale: &Scale, inp: &DeliveryInput) -> Result<u64> {
    let mut delivered = 0;
    for d in 0..scale.districts_per_warehouse {
        let dk = scale.district_key(inp.w, d) as i64;
        let Some(row) = tx.query_opt(&s.oldest_new, &[&dk])? else {
            continue;
        };
        let o_key: i64 = row.try_get(0)?;
        one(tx, &s.del_new, &[&o_key])?;
        let c_key: i64 = tx.query_one(&s.order_customer, &[&o_key])?.try_get(0)?;
        let mut amount = 0i64;
        for line in tx.query(&s.deliver_lines, &[&o_key, &NEW_ORDER_DAY])? {
            amount += line.try_get::<_, i64>(0)?;
        }
        one(tx, &s.deliver_order, &[&o_key, &inp.carrier, &amount])?;
        one(tx, &s.deliver_customer, &[&c_key, &amount])?;
        delivered += 1;
    }
    Ok(delivered)
}

fn stock_level(tx: &mut Tx, s: &Stmts, scale: &Scale, inp: &StockLevelInput) -> Result<u64> {
    let next: i64 = tx.query_one(&s.d_next, &[&(inp.dk as i64)])?.try_get(0)?;
    let keys: Vec<i64> = ((next - 20).max(1)..next)
        .map(|o_id| scale.order_key(inp.dk, o_id as u64) as i64)
        .collect();
    let base = (inp.w * scale.items) as i64;
    let low: i64 = tx
        .query_one(&s.stock_low, &[&keys, &base, &inp.threshold])?
        .try_get(0)?;
    Ok(low as u64)
}

/// A failure PostgreSQL asks the client to retry: serialization failure
/// (a concurrent update under REPEATABLE READ, or SSI) or deadlock.
fn retryable(e: &anyhow::Error) -> bool {
    e.downcast_ref::<postgres::Error>()
        .and_then(|e| e.code())
        .is_some_and(|c| {
            *c == SqlState::T_R_SERIALIZATION_FAILURE || *c == SqlState::T_R_DEADLOCK_DETECTED
        })
}

fn level(iso: IsolationArg) -> IsolationLevel {
    match iso {
        IsolationArg::Si => IsolationLevel::RepeatableRead,
        IsolationArg::Serializable => IsolationLevel::Serializable,
    }
}

/// Run `body` as one SQL transaction and commit it, retrying retryable
/// failures with the same input up to `max_attempts` times (as
/// `ycsbt::attempt_loop` does for duet). `body` returning `Ok(false)` rolls
/// back on purpose.
fn attempt_loop(
    c: &mut Client,
    iso: IsolationArg,
    max_attempts: u32,
    rng: &mut StdRng,
    commit_lat: &mut Latencies,
    body: &mut dyn FnMut(&mut Tx) -> Result<bool>,
) -> Result<Attempts> {
    let mut a = Attempts::default();
    for attempt in 0..max_attempts.max(1) {
        let mut once = || -> Result<bool> {
            let mut tx = c.build_transaction().isolation_level(level(iso)).start()?;
            if !body(&mut tx)? {
                tx.rollback()?;
                return Ok(false);
            }
            let t0 = Instant::now();
            tx.commit()?;
            commit_lat.record(t0.elapsed());
            Ok(true)
        };
        match once() {
            Ok(true) => {
                a.committed = true;
                return Ok(a);
            }
            Ok(false) => {
                a.rolled_back = true;
                return Ok(a);
            }
            Err(e) if retryable(&e) => {
                a.conflicts += 1;
                backoff(attempt, rng);
            }
            Err(e) => return Err(e),
        }
    }
    Ok(a)
}

/// One TPC-C client on its own connection: the mix until the deadline.
fn transactions(
    conn: &str,
    scale: &Scale,
    rand: &TpccRand,
    p: &Params,
    iso: IsolationArg,
    seed: u64,
    clock: &CellClock,
) -> Result<[crate::workload::ycsbt::TxnStats; 5]> {
    let mut c = connect(conn)?;
    let s = Stmts::prepare(&mut c)?;
    let mut rng = StdRng::seed_from_u64(seed);
    let mut out: [crate::workload::ycsbt::TxnStats; 5] = Default::default();
    while clock.writing() {
        let kind = choose(&p.mix, &mut rng);
        let t0 = Instant::now();
        let slot = KINDS.iter().position(|(k, _)| *k == kind).unwrap_or(0);
        let st = &mut out[slot];
        let mut attempt = |rng: &mut StdRng, body: &mut dyn FnMut(&mut Tx) -> Result<bool>| {
            attempt_loop(&mut c, iso, p.max_attempts, rng, &mut st.commit_lat, body)
        };
        let a = match kind {
            Kind::NewOrder => {
                let inp = NewOrderInput::random(scale, rand, &mut rng);
                attempt(&mut rng, &mut |tx| {
                    Ok(new_order(tx, &s, scale, &inp)? == TxnEnd::Commit)
                })?
            }
            Kind::Payment => {
                let inp = PaymentInput::random(scale, rand, &mut rng);
                attempt(&mut rng, &mut |tx| payment(tx, &s, &inp).map(|_| true))?
            }
            Kind::OrderStatus => {
                let inp = OrderStatusInput::random(scale, rand, &mut rng);
                attempt(&mut rng, &mut |tx| order_status(tx, &s, &inp).map(|_| true))?
            }
            Kind::Delivery => {
                let inp = DeliveryInput::random(scale, &mut rng);
                attempt(&mut rng, &mut |tx| {
                    delivery(tx, &s, scale, &inp).map(|_| true)
                })?
            }
            Kind::StockLevel => {
                let inp = StockLevelInput::random(scale, &mut rng);
                attempt(&mut rng, &mut |tx| {
                    stock_level(tx, &s, scale, &inp).map(|_| true)
                })?
            }
        };
        st.record(a, t0);
        clock.count();
    }
    Ok(out)
}

/// What one PostgreSQL cell shares with its threads.
pub struct Ctx<'a> {
    pub conn: &'a str,
    pub scale: Scale,
    pub rand: TpccRand,
    pub q17: Q17Params,
    pub q4_at_load: Answer,
}

/// One cell: `p.threads` transaction clients and `k` analytic clients
/// looping Q1, Q4, Q17, each on its own connection.
pub(crate) fn run_cell(
    ctx: &Ctx,
    p: &Params,
    iso: IsolationArg,
    k: usize,
    seed: u64,
    quiet: bool,
) -> Result<CellOut> {
    let label = format!("tpcch {TARGET} {} K={k}", iso.name());
    let run = timed_cell(
        (&label, p.seconds, quiet, "txn"),
        (p.threads.max(1), |t, clock: &CellClock| {
            transactions(
                ctx.conn,
                &ctx.scale,
                &ctx.rand,
                p,
                iso,
                seed ^ (t as u64) << 8,
                clock,
            )
        }),
        (k, |t, clock: &CellClock| {
            let mut c = connect(ctx.conn)?;
            c.batch_execute(&format!(
                "SET max_parallel_workers_per_gather = {}",
                p.query_threads.max(1) - 1
            ))?;
            let mut qs = Queries::prepare(&mut c)?;
            let mut done: Vec<(Query, f64)> = Vec::new();
            let mut wrong = 0;
            let mut i = t;
            while clock.reading(done.len()) {
                let q = Query::ALL[i % Query::ALL.len()];
                i += 1;
                let t0 = Instant::now();
                let answer = qs.run(&mut c, q, &ctx.q17)?;
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

/// TPC-C's consistency conditions of `chbench::check_consistency`, in SQL,
/// read in one REPEATABLE READ snapshot; the same messages.
pub fn check_consistency(c: &mut Client, scale: &Scale) -> Result<Vec<String>> {
    const MAX_REPORTED: i64 = 20;
    let mut bad: Vec<String> = Vec::new();
    let mut tx = c
        .build_transaction()
        .isolation_level(IsolationLevel::RepeatableRead)
        .read_only(true)
        .start()?;
    // 1. warehouse ytd = Σ district ytd.
    for r in tx.query(
        "SELECT w.id, w.w_ytd_cents, coalesce(sum(d.d_ytd_cents), 0)::bigint \
         FROM warehouse w LEFT JOIN district d ON d.d_w_id = w.id \
         GROUP BY w.id, w.w_ytd_cents HAVING w.w_ytd_cents <> coalesce(sum(d.d_ytd_cents), 0) \
         ORDER BY w.id LIMIT $1",
        &[&MAX_REPORTED],
    )? {
        let (key, ytd, sum): (i64, i64, i64) = (r.try_get(0)?, r.try_get(1)?, r.try_get(2)?);
        bad.push(format!("warehouse {key}: w_ytd {ytd} != Σ d_ytd {sum}"));
    }
    // 5b. history = payments.
    let r = tx.query_one(
        "SELECT (SELECT coalesce(sum(h_amount_cents), 0) FROM history)::text, \
         (SELECT coalesce(sum(w_ytd_cents), 0) - count(*) * $1::bigint FROM warehouse)::text",
        &[&W_YTD_START_CENTS],
    )?;
    let (h_total, paid) = (exact(&r, 0)?, exact(&r, 1)?);
    if h_total != paid {
        bad.push(format!("Σ h_amount {h_total} != Σ w_ytd − start {paid}"));
    }
    // Order keys.
    for r in tx.query(
        "SELECT id, o_d_key, o_id FROM orders WHERE id <> (o_id - 1) * $1 + o_d_key \
         ORDER BY id LIMIT $2",
        &[&(scale.districts() as i64), &MAX_REPORTED],
    )? {
        let (key, dk, o_id): (i64, i64, i64) = (r.try_get(0)?, r.try_get(1)?, r.try_get(2)?);
        bad.push(format!(
            "order {key}: _id is not the key of (district {dk}, o_id {o_id})"
        ));
    }
    // 6b. delivered orders' lines are dated.
    for r in tx.query(
        "SELECT l.ol_o_key, l.ol_number FROM order_line l JOIN orders o ON o.id = l.ol_o_key \
         WHERE o.o_delivered_cents IS NOT NULL AND l.ol_delivery_day IS NULL \
         ORDER BY l.id LIMIT $1",
        &[&MAX_REPORTED],
    )? {
        let (o, n): (i64, i64) = (r.try_get(0)?, r.try_get(1)?);
        bad.push(format!(
            "line {n} of delivered order {o} has no ol_delivery_day"
        ));
    }
    // 4. every line belongs to an existing order, within its line count …
    for r in tx.query(
        "SELECT l.id, l.ol_o_key, l.ol_number, o.o_ol_cnt FROM order_line l \
         LEFT JOIN orders o ON o.id = l.ol_o_key \
         WHERE o.id IS NULL OR l.ol_number < 1 OR l.ol_number > o.o_ol_cnt \
         ORDER BY l.id LIMIT $1",
        &[&MAX_REPORTED],
    )? {
        let (id, o, n): (i64, i64, i64) = (r.try_get(0)?, r.try_get(1)?, r.try_get(2)?);
        match r.try_get::<_, Option<i64>>(3)? {
            Some(cnt) => bad.push(format!(
                "line of order {o}: ol_number {n} outside 1..={cnt}"
            )),
            None => bad.push(format!("line {id} of missing order {o}")),
        }
    }
    // … and every order has its line count of lines.
    for r in tx.query(
        "SELECT o.id, o.o_ol_cnt, count(l.id) FROM orders o \
         LEFT JOIN order_line l ON l.ol_o_key = o.id AND l.ol_number BETWEEN 1 AND o.o_ol_cnt \
         GROUP BY o.id, o.o_ol_cnt HAVING count(l.id) <> o.o_ol_cnt ORDER BY o.id LIMIT $1",
        &[&MAX_REPORTED],
    )? {
        let (o, cnt, seen): (i64, i64, i64) = (r.try_get(0)?, r.try_get(1)?, r.try_get(2)?);
        bad.push(format!("order {o}: o_ol_cnt {cnt} but {seen} lines"));
    }
    // 5a. balances = payments and deliveries.
    for r in tx.query(
        "SELECT c.id, c.c_balance_cents, c.c_ytd_payment_cents, coalesce(d.s, 0)::text \
         FROM customer c LEFT JOIN (SELECT o_c_key, sum(o_delivered_cents) AS s FROM orders \
           WHERE o_delivered_cents IS NOT NULL GROUP BY o_c_key) d ON d.o_c_key = c.id \
         WHERE c.c_balance_cents + c.c_ytd_payment_cents <> coalesce(d.s, 0) \
         ORDER BY c.id LIMIT $1",
        &[&MAX_REPORTED],
    )? {
        let (key, b, p): (i64, i64, i64) = (r.try_get(0)?, r.try_get(1)?, r.try_get(2)?);
        let owed = exact(&r, 3)?;
        bad.push(format!(
            "customer {key}: balance {b} + ytd_payment {p} != delivered {owed}"
        ));
    }
    // 6a. delivered orders left new_order.
    for r in tx.query(
        "SELECT n.no_d_key, n.no_o_id FROM new_order n JOIN orders o ON o.id = n.id \
         WHERE o.o_delivered_cents IS NOT NULL ORDER BY n.id LIMIT $1",
        &[&MAX_REPORTED],
    )? {
        let (dk, o_id): (i64, i64) = (r.try_get(0)?, r.try_get(1)?);
        bad.push(format!(
            "district {dk}: order {o_id} delivered but still in new_order"
        ));
    }
    // 2. and 3. per district.
    for r in tx.query(
        "SELECT d.id, d.d_next_o_id, coalesce(o.mx, 0), coalesce(n.mn, 0), coalesce(n.mx, 0), \
           coalesce(n.cnt, 0) FROM district d \
         LEFT JOIN (SELECT o_d_key, max(o_id) AS mx FROM orders GROUP BY o_d_key) o \
           ON o.o_d_key = d.id \
         LEFT JOIN (SELECT no_d_key, min(no_o_id) AS mn, max(no_o_id) AS mx, count(*) AS cnt \
           FROM new_order GROUP BY no_d_key) n ON n.no_d_key = d.id ORDER BY d.id",
        &[],
    )? {
        let dk: i64 = r.try_get(0)?;
        let next: i64 = r.try_get(1)?;
        let max_o: i64 = r.try_get(2)?;
        let (min_no, max_no, count_no): (i64, i64, i64) =
            (r.try_get(3)?, r.try_get(4)?, r.try_get(5)?);
        if next - 1 != max_o || (count_no > 0 && next - 1 != max_no) {
            bad.push(format!(
                "district {dk}: d_next_o_id − 1 = {} but max o_id {max_o}, max no_o_id {max_no}",
                next - 1
            ));
        }
        if count_no > 0 && max_no - min_no + 1 != count_no {
            bad.push(format!(
                "district {dk}: new_order ids {min_no}..={max_no} but {count_no} rows"
            ));
        }
    }
    tx.commit()?;
    Ok(bad)
}

/// The answers of a loaded PostgreSQL data set against the reference
/// evaluation of the generated rows (`verify`), and against duet's answers
/// at load when the duet target loaded the same seed in this run.
pub fn check_at_load(loaded: &LoadedPg, duet_at_load: Option<&[(Query, Answer)]>) -> Result<()> {
    let by_query: HashMap<&str, &Answer> =
        loaded.at_load.iter().map(|(q, a)| (q.name(), a)).collect();
    if let Some((items, orders, lines)) = &loaded.copy {
        for q in Query::ALL {
            let want = tpch::reference(q, items, orders, lines, &loaded.q17);
            let got = by_query.get(q.name()).copied();
            ensure!(
                got == Some(&want),
                "{TARGET}: {} at load differs from the reference:\n got {got:?}\nwant {want:?}",
                q.name()
            );
        }
    }
    for (q, want) in duet_at_load.unwrap_or_default() {
        let got = by_query.get(q.name()).copied();
        ensure!(
            got == Some(want),
            "{TARGET}: {} at load differs from duet's on the same data:\n got {got:?}\nduet {want:?}",
            q.name()
        );
    }
    Ok(())
}
