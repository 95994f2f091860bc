//! Array operators: `$size`, `$in`, `$arrayElemAt`.
//!
//! Invariants: `$in` compares with the shared value order (so `1` is in
//! `[1.0]`); `$arrayElemAt` takes negative indexes from the end and answers
//! missing, not an error, for an index out of range.

use std::cmp::Ordering;

use bson::Bson;

use crate::error::{Error, Result};
use crate::query::expr::eval::{arg, null};
use crate::query::expr::{compare_values, is_nullish, num_of, type_name, Num, Op, Value};

/// Apply an array operator to its evaluated arguments.
pub(super) fn apply(op: Op, vals: &[Value]) -> Result<Value> {
    match op {
        Op::In => {
            let (needle, hay) = (arg(op, vals, 0)?, arg(op, vals, 1)?);
            let Some(Bson::Array(items)) = hay else {
                return Err(Error::bad_value(format!(
                    "$in requires an array as a second argument, found: {}",
                    type_name(hay)
                )));
            };
            Ok(Some(Bson::Boolean(items.iter().any(|i| {
                compare_values(needle, &Some(i.clone())) == Ordering::Equal
            }))))
        }
        Op::Size => match arg(op, vals, 0)? {
            Some(Bson::Array(a)) => Ok(Some(Bson::Int32(
                i32::try_from(a.len()).unwrap_or(i32::MAX),
            ))),
            other => Err(Error::type_mismatch(format!(
                "The argument to $size must be an array. Type of the argument was: {}",
                type_name(other)
            ))),
        },
        Op::ArrayElemAt => array_elem_at(arg(op, vals, 0)?, arg(op, vals, 1)?),
        other => Err(Error::Internal(format!(
            "{} is not an array operator",
            other.name()
        ))),
    }
}

fn array_elem_at(a: &Value, i: &Value) -> Result<Value> {
    if is_nullish(a) || is_nullish(i) {
        return null();
    }
    let Some(Bson::Array(items)) = a else {
        return Err(Error::bad_value(format!(
            "$arrayElemAt's first argument must be an array, but is {}",
            type_name(a)
        )));
    };
    let idx = match i.as_ref().and_then(num_of) {
        Some(Num::I32(x)) => i64::from(x),
        Some(Num::I64(x)) if i32::try_from(x).is_ok() => x,
        Some(Num::F64(f)) if f.fract() == 0.0 && f.abs() <= f64::from(i32::MAX) => f as i64,
        Some(_) => {
            return Err(Error::bad_value(format!(
                "$arrayElemAt's second argument must be representable as a 32-bit integer: {}",
                crate::error::render(i.as_ref().unwrap_or(&Bson::Null))
            )))
        }
        None => {
            return Err(Error::bad_value(format!(
                "$arrayElemAt's second argument must be a numeric value, but is {}",
                type_name(i)
            )))
        }
    };
    let len = items.len() as i64;
    let pos = if idx < 0 { len + idx } else { idx };
    Ok(usize::try_from(pos)
        .ok()
        .and_then(|p| items.get(p))
        .cloned())
}
