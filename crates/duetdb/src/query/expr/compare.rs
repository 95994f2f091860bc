//! Comparison operators: `$eq $ne $gt $gte $lt $lte $cmp`, and `$max`/`$min`
//! (as expressions, not accumulators).
//!
//! Invariants: every comparison goes through [`crate::doc::value`]'s order, so
//! these operators agree with filters, indexes, `$sort` and `$group` keys;
//! missing compares as `undefined` (below null).

use std::cmp::Ordering;

use bson::Bson;

use crate::doc::value;
use crate::error::Result;
use crate::query::expr::eval::arg;
use crate::query::expr::{num_of, Op, Value};

/// Compare two values in MongoDB's order, missing as undefined.
pub fn compare_values(a: &Value, b: &Value) -> Ordering {
    let a = a.as_ref().unwrap_or(&Bson::Undefined);
    let b = b.as_ref().unwrap_or(&Bson::Undefined);
    compare(a, b)
}

/// [`value::compare`] on owned values without cloning the common scalar cases.
pub fn compare(a: &Bson, b: &Bson) -> Ordering {
    match (num_of(a), num_of(b)) {
        (Some(x), Some(y)) => value::compare_numbers(x.lift(), y.lift()),
        _ => match (a, b) {
            (Bson::String(x), Bson::String(y)) => x.as_bytes().cmp(y.as_bytes()),
            _ => value::compare_bson(a, b),
        },
    }
}

/// Apply a comparison operator to its evaluated arguments.
pub(super) fn apply(op: Op, vals: Vec<Value>) -> Result<Value> {
    match op {
        Op::Max | Op::Min => Ok(Some(extreme(op, vals))),
        Op::Cmp => Ok(Some(Bson::Int32(
            match compare_values(arg(op, &vals, 0)?, arg(op, &vals, 1)?) {
                Ordering::Less => -1,
                Ordering::Equal => 0,
                Ordering::Greater => 1,
            },
        ))),
        _ => {
            let c = compare_values(arg(op, &vals, 0)?, arg(op, &vals, 1)?);
            let b = match op {
                Op::Eq => c == Ordering::Equal,
                Op::Ne => c != Ordering::Equal,
                Op::Gt => c == Ordering::Greater,
                Op::Gte => c != Ordering::Less,
                Op::Lt => c == Ordering::Less,
                _ => c != Ordering::Greater,
            };
            Ok(Some(Bson::Boolean(b)))
        }
    }
}

/// `$max` / `$min`: null and missing are skipped; none left gives null. One
/// argument that is an array stands for its elements.
fn extreme(op: Op, vals: Vec<Value>) -> Bson {
    let items: Vec<Bson> = match vals.as_slice() {
        [Some(Bson::Array(a))] => a.clone(),
        _ => vals.into_iter().flatten().collect(),
    };
    let mut best: Option<Bson> = None;
    for v in items {
        if matches!(v, Bson::Null | Bson::Undefined) {
            continue;
        }
        best = match best {
            None => Some(v),
            Some(b) => {
                let c = compare(&v, &b);
                let take = if op == Op::Max {
                    c == Ordering::Greater
                } else {
                    c == Ordering::Less
                };
                Some(if take { v } else { b })
            }
        };
    }
    best.unwrap_or(Bson::Null)
}
