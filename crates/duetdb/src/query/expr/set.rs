//! Set operators: `$setUnion $setIntersection $setDifference $setEquals
//! $setIsSubset $anyElementTrue $allElementsTrue`.
//!
//! Invariants: arrays are sets under the shared value order's equality (`1`
//! and `1.0` are one element; nested arrays are elements, not flattened);
//! duplicates are dropped from results, whose order is unspecified (as in
//! MongoDB) — here the order of first appearance; a null or missing operand
//! gives null where MongoDB's does (`$setUnion`, `$setIntersection`,
//! `$setDifference`) and an error where it does not.

use std::cmp::Ordering;

use bson::Bson;

use crate::error::{Error, Result};
use crate::query::expr::array::any_truthy;
use crate::query::expr::eval::{arg, null};
use crate::query::expr::logic::truthy;
use crate::query::expr::{compare, is_nullish, type_name, Op, Value};

fn contains(set: &[Bson], v: &Bson) -> bool {
    set.iter().any(|x| compare(x, v) == Ordering::Equal)
}

fn dedup(items: impl IntoIterator<Item = Bson>) -> Vec<Bson> {
    let mut out: Vec<Bson> = Vec::new();
    for i in items {
        if !contains(&out, &i) {
            out.push(i);
        }
    }
    out
}

/// Apply a set operator to its evaluated arguments.
pub(super) fn apply(op: Op, vals: &[Value]) -> Result<Value> {
    match op {
        Op::SetUnion | Op::SetIntersection => {
            let mut sets: Vec<&Vec<Bson>> = Vec::with_capacity(vals.len());
            for v in vals {
                if is_nullish(v) {
                    return null();
                }
                match v {
                    Some(Bson::Array(a)) => sets.push(a),
                    other => {
                        return Err(if op == Op::SetUnion {
                            loc!(
                                17043,
                                "All operands of $setUnion must be arrays. One argument is of type: {}",
                                type_name(other)
                            )
                        } else {
                            loc!(
                                17047,
                                "All operands of $setIntersection must be arrays. One argument is of type: {}",
                                type_name(other)
                            )
                        })
                    }
                }
            }
            if op == Op::SetUnion {
                return Ok(Some(Bson::Array(dedup(
                    sets.into_iter().flatten().cloned(),
                ))));
            }
            let Some((first, rest)) = sets.split_first() else {
                return Ok(Some(Bson::Array(Vec::new())));
            };
            Ok(Some(Bson::Array(dedup(
                first
                    .iter()
                    .filter(|x| rest.iter().all(|s| contains(s, x)))
                    .cloned(),
            ))))
        }
        Op::SetDifference => {
            let (a, b) = (arg(op, vals, 0)?, arg(op, vals, 1)?);
            if is_nullish(a) || is_nullish(b) {
                return null();
            }
            let Some(Bson::Array(a)) = a else {
                return Err(loc!(
                    17048,
                    "both operands of $setDifference must be arrays. First argument is of type: {}",
                    type_name(a)
                ));
            };
            let Some(Bson::Array(b)) = b else {
                return Err(loc!(
                    17049,
                    "both operands of $setDifference must be arrays. Second argument is of type: {}",
                    type_name(b)
                ));
            };
            Ok(Some(Bson::Array(dedup(
                a.iter().filter(|x| !contains(b, x)).cloned(),
            ))))
        }
        Op::SetEquals => {
            let mut sets = Vec::with_capacity(vals.len());
            for v in vals {
                match v {
                    Some(Bson::Array(a)) => sets.push(a),
                    other => {
                        return Err(loc!(
                        17044,
                        "All operands of $setEquals must be arrays. One argument is of type: {}",
                        type_name(other)
                    ))
                    }
                }
            }
            let Some((first, rest)) = sets.split_first() else {
                return Ok(Some(Bson::Boolean(true)));
            };
            let eq = rest.iter().all(|s| {
                s.iter().all(|x| contains(first, x)) && first.iter().all(|x| contains(s, x))
            });
            Ok(Some(Bson::Boolean(eq)))
        }
        Op::SetIsSubset => {
            let (a, b) = (arg(op, vals, 0)?, arg(op, vals, 1)?);
            let Some(Bson::Array(a)) = a else {
                return Err(loc!(
                    17046,
                    "both operands of $setIsSubset must be arrays. First argument is of type: {}",
                    type_name(a)
                ));
            };
            let Some(Bson::Array(b)) = b else {
                return Err(loc!(
                    17042,
                    "both operands of $setIsSubset must be arrays. Second argument is of type: {}",
                    type_name(b)
                ));
            };
            Ok(Some(Bson::Boolean(a.iter().all(|x| contains(b, x)))))
        }
        Op::AnyElementTrue | Op::AllElementsTrue => {
            let a = arg(op, vals, 0)?;
            let Some(Bson::Array(items)) = a else {
                return Err(loc!(
                    17041,
                    "{}'s argument must be an array, but is {}",
                    op.name(),
                    type_name(a)
                ));
            };
            Ok(Some(Bson::Boolean(if op == Op::AnyElementTrue {
                any_truthy(items)
            } else {
                items.iter().all(|b| truthy(&Some(b.clone())))
            })))
        }
        other => Err(Error::Internal(format!(
            "{} is not a set operator",
            other.name()
        ))),
    }
}
