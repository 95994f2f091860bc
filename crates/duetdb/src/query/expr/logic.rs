//! Boolean and conditional operators: `$and`, `$or`, `$not`, `$cond`,
//! `$ifNull`, `$switch`, and aggregation truthiness.
//!
//! Invariants: `$and`, `$or`, `$cond`, `$ifNull` and `$switch` evaluate their arguments
//! lazily, left to right, and stop as soon as the answer is known (so an
//! argument that would fail is never evaluated when MongoDB would not evaluate
//! it either). `$not` is eager and dispatched from `eval.rs`.

use bson::Bson;

use crate::doc::value;
use crate::error::{Error, Result};
use crate::query::expr::eval::Env;
use crate::query::expr::{is_nullish, Expr, Op, Value};

/// Aggregation truthiness: false, null, undefined, missing and numeric zero are
/// false; everything else (also `""` and `[]`) is true.
pub fn truthy(v: &Value) -> bool {
    v.as_ref().is_some_and(truthy_bson)
}

/// [`truthy`] of a present value (also what a projection's `1`/`0`/`true`
/// means: the same rule decides inclusion).
pub fn truthy_bson(v: &Bson) -> bool {
    match v {
        Bson::Null | Bson::Undefined | Bson::Boolean(false) => false,
        Bson::Int32(0) | Bson::Int64(0) => false,
        Bson::Double(f) => *f != 0.0,
        Bson::Decimal128(d) => value::decimal_to_f64(*d) != 0.0,
        _ => true,
    }
}

/// Evaluate a short-circuiting operator on its unevaluated arguments.
pub(super) fn eval_lazy(op: Op, args: &[Expr], cx: &Env<'_>) -> Result<Value> {
    match op {
        Op::And => {
            for a in args {
                if !truthy(&a.eval_in(cx)?) {
                    return Ok(Some(Bson::Boolean(false)));
                }
            }
            Ok(Some(Bson::Boolean(true)))
        }
        Op::Or => {
            for a in args {
                if truthy(&a.eval_in(cx)?) {
                    return Ok(Some(Bson::Boolean(true)));
                }
            }
            Ok(Some(Bson::Boolean(false)))
        }
        Op::Cond => {
            let [c, t, e] = args else {
                return Err(Error::Internal("$cond arity".into()));
            };
            if truthy(&c.eval_in(cx)?) {
                t.eval_in(cx)
            } else {
                e.eval_in(cx)
            }
        }
        Op::IfNull => {
            let Some((last, init)) = args.split_last() else {
                return Err(Error::Internal("$ifNull arity".into()));
            };
            for a in init {
                let v = a.eval_in(cx)?;
                if !is_nullish(&v) {
                    return Ok(v);
                }
            }
            last.eval_in(cx)
        }
        other => Err(Error::Internal(format!(
            "{} is not a short-circuiting operator",
            other.name()
        ))),
    }
}

/// `$switch`: the first branch whose case is true; else the default; else
/// error 40066.
pub(super) fn eval_switch(
    branches: &[(Expr, Expr)],
    default: Option<&Expr>,
    cx: &Env<'_>,
) -> Result<Value> {
    for (case, then) in branches {
        if truthy(&case.eval_in(cx)?) {
            return then.eval_in(cx);
        }
    }
    match default {
        Some(d) => d.eval_in(cx),
        None => Err(loc!(
            40066,
            "$switch could not find a matching branch for an input, and no default was specified."
        )),
    }
}
