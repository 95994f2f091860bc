//! TPC-H Q1, Q4 and Q17 written as ordinary aggregation pipelines, beside
//! the hand-written `olcp_query` versions of `tpch.rs`: Q4 and Q17 join with
//! `$lookup` (into `order_line` by its `ol_o_key` index, into `item` by
//! `_id`), Q17's subquery is a second `$group` over each part's lines.
//!
//! Each pipeline's scan part is commutative (a `$match`, `$lookup`s, a
//! `$match` on the join, a mergeable `$group`), so under `auto` the engine
//! runs it as multi-threaded OLCP; the other collection is read at the
//! scan's own csn under every strategy (one snapshot per pipeline). The
//! answers convert to the exact types of `tpch.rs`, so they compare with
//! `==` against the OLCP versions and the reference evaluations
//! (`tests/tpch.rs`).

use bson::{doc, Bson, Document};
use duetdb::{AggregateExplain, Database, Strategy};

use crate::chbench::{ITEM, ORDERS, ORDER_LINE};
use crate::tpch::{
    Answer, Q17Params, Q1Group, Query, Q1, Q17, Q1_CUTOFF_DAY, Q4, Q4_FROM_DAY, Q4_TO_DAY,
};

/// Q1: pricing summary per (return flag, line status).
pub fn q1_pipeline() -> Vec<Document> {
    let disc_price =
        doc! {"$multiply": ["$ol_extendedprice_cents", {"$subtract": [100, "$ol_discount_pct"]}]};
    vec![
        doc! {"$match": {"ol_shipdate_day": {"$lte": Q1_CUTOFF_DAY}}},
        doc! {"$group": {
            "_id": {"f": "$ol_returnflag", "s": "$ol_linestatus"},
            "sum_qty": {"$sum": "$ol_quantity"},
            "sum_base": {"$sum": "$ol_extendedprice_cents"},
            "sum_disc": {"$sum": disc_price.clone()},
            "sum_charge": {"$sum": {"$multiply": [disc_price, {"$add": [100, "$ol_tax_pct"]}]}},
            "sum_discount": {"$sum": "$ol_discount_pct"},
            "count": {"$sum": 1},
        }},
        doc! {"$sort": {"_id": 1}},
    ]
}

/// Q4: orders of the quarter with at least one late line, per priority.
pub fn q4_pipeline() -> Vec<Document> {
    vec![
        doc! {"$match": {"o_entry_day": {"$gte": Q4_FROM_DAY, "$lt": Q4_TO_DAY}}},
        doc! {"$lookup": {
            "from": ORDER_LINE,
            "localField": "_id",
            "foreignField": "ol_o_key",
            "pipeline": [
                {"$match": {"$expr": {"$lt": ["$ol_commitdate_day", "$ol_receiptdate_day"]}}},
                {"$limit": 1},
                {"$project": {"_id": 1}},
            ],
            "as": "late",
        }},
        doc! {"$match": {"late.0": {"$exists": true}}},
        doc! {"$group": {"_id": "$o_orderpriority", "n": {"$sum": 1}}},
    ]
}

/// Q17: revenue of the small lines (quantity below a fifth of their part's
/// average) of the parts of one brand and container.
pub fn q17_pipeline(p: &Q17Params) -> Vec<Document> {
    vec![
        doc! {"$lookup": {
            "from": ITEM,
            "localField": "ol_i_id",
            "foreignField": "_id",
            "pipeline": [
                {"$match": {"i_brand": &p.brand, "i_container": &p.container}},
                {"$project": {"_id": 1}},
            ],
            "as": "part",
        }},
        doc! {"$match": {"part.0": {"$exists": true}}},
        doc! {"$group": {
            "_id": "$ol_i_id",
            "sum_qty": {"$sum": "$ol_quantity"},
            "count": {"$sum": 1},
            "lines": {"$push": {"q": "$ol_quantity", "p": "$ol_extendedprice_cents"}},
        }},
        // qty < 0.2 · (sum / count)  ⇔  5 · qty · count < sum (exact integers).
        doc! {"$project": {"small": {"$filter": {
            "input": "$lines",
            "cond": {"$lt": [{"$multiply": [5, "$$this.q", "$count"]}, "$sum_qty"]},
        }}}},
        doc! {"$group": {
            "_id": null,
            "parts": {"$sum": 1},
            "lines": {"$sum": {"$size": "$small"}},
            "sum_price": {"$sum": {"$sum": "$small.p"}},
        }},
    ]
}

fn int(d: &Document, k: &str) -> duetdb::Result<i128> {
    match d.get(k) {
        Some(Bson::Int32(v)) => Ok(i128::from(*v)),
        Some(Bson::Int64(v)) => Ok(i128::from(*v)),
        other => Err(duetdb::Error::Internal(format!(
            "TPC-H pipeline: field {k} is {other:?}, not an integer"
        ))),
    }
}

fn narrow(v: i128, k: &str) -> duetdb::Result<i64> {
    i64::try_from(v)
        .map_err(|_| duetdb::Error::Internal(format!("TPC-H pipeline: {k} out of range")))
}

fn to_q1(docs: &[Document]) -> duetdb::Result<Q1> {
    let mut out = Q1::new();
    for d in docs {
        let id = d
            .get_document("_id")
            .map_err(|e| duetdb::Error::Internal(e.to_string()))?;
        let key = (
            id.get_str("f").unwrap_or_default().to_string(),
            id.get_str("s").unwrap_or_default().to_string(),
        );
        out.insert(
            key,
            Q1Group {
                sum_qty: narrow(int(d, "sum_qty")?, "sum_qty")?,
                sum_base_price_cents: narrow(int(d, "sum_base")?, "sum_base")?,
                sum_disc_price_centicents: int(d, "sum_disc")?,
                sum_charge_cents_e4: int(d, "sum_charge")?,
                sum_discount_pct: narrow(int(d, "sum_discount")?, "sum_discount")?,
                count_order: narrow(int(d, "count")?, "count")? as u64,
            },
        );
    }
    Ok(out)
}

fn to_q4(docs: &[Document]) -> duetdb::Result<Q4> {
    let mut out = Q4::new();
    for d in docs {
        let priority = d.get_str("_id").unwrap_or_default().to_string();
        out.insert(priority, narrow(int(d, "n")?, "n")? as u64);
    }
    Ok(out)
}

fn to_q17(docs: &[Document]) -> duetdb::Result<Q17> {
    let Some(d) = docs.first() else {
        return Ok(Q17::default());
    };
    Ok(Q17 {
        sum_price_cents: narrow(int(d, "sum_price")?, "sum_price")?,
        parts: narrow(int(d, "parts")?, "parts")? as u64,
        lines: narrow(int(d, "lines")?, "lines")? as u64,
    })
}

/// Run `query` as a pipeline under `strategy`; the answer and how it ran.
pub fn run_pipeline(
    db: &Database,
    query: Query,
    strategy: Strategy,
    q17: &Q17Params,
) -> duetdb::Result<(Answer, AggregateExplain)> {
    let (coll, pipeline) = match query {
        Query::Q1 => (ORDER_LINE, q1_pipeline()),
        Query::Q4 => (ORDERS, q4_pipeline()),
        Query::Q17 => (ORDER_LINE, q17_pipeline(q17)),
    };
    let (docs, explain) = db.collection(coll).aggregate_with(pipeline, strategy)?;
    let answer = match query {
        Query::Q1 => Answer::Q1(to_q1(&docs)?),
        Query::Q4 => Answer::Q4(to_q4(&docs)?),
        Query::Q17 => Answer::Q17(to_q17(&docs)?),
    };
    Ok((answer, explain))
}
