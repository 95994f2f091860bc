//! Numeric update operators: `$inc`, `$mul`, and the comparisons of `$min`/`$max`.
//!
//! Invariants (MongoDB's rules):
//! - int32 results that overflow become int64; a double operand makes a double;
//!   an int64 overflow is an error (code 2), never a wrap or a silent double;
//! - `$inc` on a missing field sets the increment; `$mul` sets zero of the
//!   multiplier's type; a non-numeric current value is a type mismatch (code 14);
//! - a Decimal128 operand makes the operation exact decimal128 (rounded once
//!   at 34 digits, half to even); a double meeting a decimal becomes a decimal
//!   of 15 significant digits first, as MongoDB's `SafeNum` does;
//! - `$min`/`$max` compare across types with [`crate::doc::value::compare_bson`],
//!   the order filters and indexes use (strings under the update's
//!   collation).

use std::cmp::Ordering;

use bson::{Bson, Document};

use crate::doc::types::type_name;
use crate::error::{render, Error, Result};
use crate::query::expr::decimal;

use super::{id_render, Action, BitOp};

/// `$inc` (`add`) or `$mul` of `arg` on the current value `cur` of `field`.
pub(super) fn inc_or_mul(
    arg: &Bson,
    add: bool,
    cur: Option<&Bson>,
    field: &str,
    orig: &Document,
) -> Result<Action> {
    let name = if add { "$inc" } else { "$mul" };
    Ok(match cur {
        None if add => Action::Set(arg.clone()),
        None => Action::Set(match arg {
            Bson::Int32(_) => Bson::Int32(0),
            Bson::Int64(_) => Bson::Int64(0),
            Bson::Decimal128(_) => Bson::Decimal128(decimal::to_bson(decimal::Dec::ZERO)),
            _ => Bson::Double(0.0),
        }),
        Some(c) if !is_num(c) => {
            return Err(Error::type_mismatch(format!(
                "Cannot apply {name} to a value of non-numeric type. {} has the field \
                 '{field}' of non-numeric type {}",
                id_render(orig),
                type_name(c)
            )))
        }
        Some(c) => match arithmetic(c, arg, add)? {
            Some(v) => Action::Set(v),
            None => {
                return Err(Error::bad_value(format!(
                    "Failed to apply {name} operations to current value ({}: {}) for \
                     document {}: the result overflows a 64-bit integer",
                    type_name(c),
                    render(c),
                    id_render(orig)
                )))
            }
        },
    })
}

/// `$bit`: the operations applied in order to the current integer (int32 or
/// int64; a missing field starts from int32 0). An int32 meeting an int64
/// operand widens to int64, as MongoDB's `SafeNum` does; an unchanged value
/// (same type and bits) is a no-op.
pub(super) fn bit(
    ops: &[(BitOp, Bson)],
    cur: Option<&Bson>,
    field: &str,
    orig: &Document,
) -> Result<Action> {
    let start = match cur {
        None => Bson::Int32(0),
        Some(v @ (Bson::Int32(_) | Bson::Int64(_))) => v.clone(),
        Some(other) => {
            let id = orig
                .get("_id")
                .map(|id| format!("_id: {}", crate::error::render_shell(id)))
                .unwrap_or_default();
            let name = field.rsplit('.').next().unwrap_or(field);
            return Err(Error::bad_value(format!(
                "Cannot apply $bit to a value of non-integral type.{id} has the field {name} of \
                 non-integer type {}",
                type_name(other)
            )));
        }
    };
    let mut v = start;
    for (op, operand) in ops {
        let f = |a: i64, b: i64| match op {
            BitOp::And => a & b,
            BitOp::Or => a | b,
            BitOp::Xor => a ^ b,
        };
        v = match (&v, operand) {
            (Bson::Int32(a), Bson::Int32(b)) => {
                // Bitwise operations of two int32s stay within int32.
                Bson::Int32(f(i64::from(*a), i64::from(*b)) as i32)
            }
            (Bson::Int32(a), Bson::Int64(b)) => Bson::Int64(f(i64::from(*a), *b)),
            (Bson::Int64(a), Bson::Int32(b)) => Bson::Int64(f(*a, i64::from(*b))),
            (Bson::Int64(a), Bson::Int64(b)) => Bson::Int64(f(*a, *b)),
            _ => return Err(Error::Internal("$bit operand is not an integer".into())),
        };
    }
    Ok(match cur {
        Some(c) if *c == v => Action::Keep,
        _ => Action::Set(v),
    })
}

/// `$min` (`min`) or `$max` of `arg`: set it when the field is missing or `arg`
/// is below (above) the current value in BSON order.
pub(super) fn min_or_max(arg: &Bson, min: bool, cur: Option<&Bson>) -> Action {
    let want = if min {
        Ordering::Less
    } else {
        Ordering::Greater
    };
    match cur {
        None => Action::Set(arg.clone()),
        Some(c) if super::compare(arg, c) == want => Action::Set(arg.clone()),
        Some(_) => Action::Keep,
    }
}

/// A number of any BSON numeric type.
pub(super) fn is_num(v: &Bson) -> bool {
    matches!(
        v,
        Bson::Int32(_) | Bson::Int64(_) | Bson::Double(_) | Bson::Decimal128(_)
    )
}

/// A numeric operand as decimal128 (doubles rounded to 15 significant digits).
fn as_decimal(v: &Bson) -> decimal::Dec {
    match v {
        Bson::Decimal128(d) => decimal::from_bson(*d),
        Bson::Double(f) => decimal::from_f64(*f),
        other => decimal::Dec::from(as_i64(other)),
    }
}

/// `cur + arg` or `cur * arg` with MongoDB's promotion: int32 overflowing becomes
/// int64; a double operand makes a double; int64 overflow is `Ok(None)` (an error
/// for the caller, as in MongoDB).
pub(super) fn arithmetic(cur: &Bson, arg: &Bson, add: bool) -> Result<Option<Bson>> {
    use Bson::{Double, Int32, Int64};
    let name = if add { "$inc" } else { "$mul" };
    let f = |x: f64, y: f64| if add { x + y } else { x * y };
    Ok(match (cur, arg) {
        (Bson::Decimal128(_), _) | (_, Bson::Decimal128(_)) => {
            let (x, y) = (as_decimal(cur), as_decimal(arg));
            let mut cx = decimal::cx();
            Some(Bson::Decimal128(decimal::to_bson(if add {
                cx.add(x, y)
            } else {
                cx.mul(x, y)
            })))
        }
        (Int32(x), Int32(y)) => {
            let r = if add {
                x.checked_add(*y)
            } else {
                x.checked_mul(*y)
            };
            Some(match r {
                Some(v) => Int32(v),
                // Two int32s always fit in an int64, sum or product.
                None => Int64(if add {
                    i64::from(*x) + i64::from(*y)
                } else {
                    i64::from(*x) * i64::from(*y)
                }),
            })
        }
        (Int32(_) | Int64(_), Int32(_) | Int64(_)) => {
            let (x, y) = (as_i64(cur), as_i64(arg));
            let r = if add {
                x.checked_add(y)
            } else {
                x.checked_mul(y)
            };
            r.map(Int64)
        }
        (Double(x), Double(y)) => Some(Double(f(*x, *y))),
        (Double(x), other) => Some(Double(f(*x, as_i64(other) as f64))),
        (other, Double(y)) => Some(Double(f(as_i64(other) as f64, *y))),
        _ => return Err(Error::type_mismatch(format!("{name} requires numbers"))),
    })
}

/// An integer operand as i64 (only called on int32/int64; anything else is 0).
fn as_i64(v: &Bson) -> i64 {
    match v {
        Bson::Int32(i) => i64::from(*i),
        Bson::Int64(i) => *i,
        _ => 0,
    }
}
