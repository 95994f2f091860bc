//! Arithmetic operators: `$add $subtract $multiply $divide $mod $abs $floor
//! $ceil $round`, date ± milliseconds, and the number type they share ([`Num`]).
//!
//! Invariants (MongoDB's type rules): int32 ∘ int32 stays int32 unless it
//! overflows (then int64); int64 overflow goes to double; any double makes a
//! double; `$divide` always gives a double; a null or missing argument gives
//! null. decimal128 is refused with a clear error (`decimal_gap`), never
//! approximated through a double. Date arithmetic that leaves the i64
//! millisecond range is an error, not a wrap.

use std::cmp::Ordering;

use bson::Bson;

use crate::doc::value;
use crate::error::{Error, Result};
use crate::query::expr::eval::{arg, null};
use crate::query::expr::{is_nullish, type_name, Op, Value};

/// A non-decimal number.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Num {
    I32(i32),
    I64(i64),
    F64(f64),
}

impl Num {
    pub(super) fn lift(self) -> value::Num {
        match self {
            Num::I32(i) => value::Num::Int(i64::from(i)),
            Num::I64(i) => value::Num::Int(i),
            Num::F64(f) => value::Num::Float(f),
        }
    }

    pub fn to_f64(self) -> f64 {
        match self {
            Num::I32(i) => f64::from(i),
            Num::I64(i) => i as f64,
            Num::F64(f) => f,
        }
    }

    pub(super) fn to_i64(self) -> Option<i64> {
        match self {
            Num::I32(i) => Some(i64::from(i)),
            Num::I64(i) => Some(i),
            Num::F64(_) => None,
        }
    }

    pub fn to_bson(self) -> Bson {
        match self {
            Num::I32(i) => Bson::Int32(i),
            Num::I64(i) => Bson::Int64(i),
            Num::F64(f) => Bson::Double(f),
        }
    }
}

/// The number in `b`, if it is an int32, int64 or double.
pub fn num_of(b: &Bson) -> Option<Num> {
    match b {
        Bson::Int32(i) => Some(Num::I32(*i)),
        Bson::Int64(i) => Some(Num::I64(*i)),
        Bson::Double(f) => Some(Num::F64(*f)),
        _ => None,
    }
}

/// int32 result when it fits, else int64.
fn int_or_long(x: i64) -> Num {
    match i32::try_from(x) {
        Ok(i) => Num::I32(i),
        Err(_) => Num::I64(x),
    }
}

/// `a + b` with MongoDB's widening.
fn add_nums(a: Num, b: Num) -> Num {
    match (a, b) {
        (Num::I32(x), Num::I32(y)) => int_or_long(i64::from(x) + i64::from(y)),
        (Num::F64(_), _) | (_, Num::F64(_)) => Num::F64(a.to_f64() + b.to_f64()),
        _ => {
            let (x, y) = (a.to_i64().unwrap_or(0), b.to_i64().unwrap_or(0));
            match x.checked_add(y) {
                Some(s) => Num::I64(s),
                None => Num::F64(x as f64 + y as f64),
            }
        }
    }
}

fn sub_nums(a: Num, b: Num) -> Num {
    match (a, b) {
        (Num::I32(x), Num::I32(y)) => int_or_long(i64::from(x) - i64::from(y)),
        (Num::F64(_), _) | (_, Num::F64(_)) => Num::F64(a.to_f64() - b.to_f64()),
        _ => {
            let (x, y) = (a.to_i64().unwrap_or(0), b.to_i64().unwrap_or(0));
            match x.checked_sub(y) {
                Some(s) => Num::I64(s),
                None => Num::F64(x as f64 - y as f64),
            }
        }
    }
}

fn mul_nums(a: Num, b: Num) -> Num {
    match (a, b) {
        (Num::I32(x), Num::I32(y)) => int_or_long(i64::from(x) * i64::from(y)),
        (Num::F64(_), _) | (_, Num::F64(_)) => Num::F64(a.to_f64() * b.to_f64()),
        _ => {
            let (x, y) = (a.to_i64().unwrap_or(0), b.to_i64().unwrap_or(0));
            match x.checked_mul(y) {
                Some(s) => Num::I64(s),
                None => Num::F64(x as f64 * y as f64),
            }
        }
    }
}

fn decimal_gap(op: Op) -> Error {
    Error::bad_value(format!(
        "{}: decimal128 arithmetic is not supported by duetdb",
        op.name()
    ))
}

/// The numeric argument of `op`, or the error MongoDB gives.
fn want_num(op: Op, v: &Bson, what: &str) -> Result<Num> {
    match num_of(v) {
        Some(n) => Ok(n),
        None if matches!(v, Bson::Decimal128(_)) => Err(decimal_gap(op)),
        None => Err(Error::type_mismatch(format!(
            "{} only supports numeric types{what}, not {}",
            op.name(),
            type_name(&Some(v.clone()))
        ))),
    }
}

/// Apply an arithmetic operator to its evaluated arguments.
pub(super) fn apply(op: Op, vals: &[Value]) -> Result<Value> {
    match op {
        Op::Add => add(vals),
        Op::Subtract => subtract(arg(op, vals, 0)?, arg(op, vals, 1)?),
        Op::Multiply => multiply(vals),
        Op::Divide => {
            let Some((x, y)) = nonzero_operands(op, vals, "can't $divide by zero")? else {
                return null();
            };
            Ok(Some(Bson::Double(x.to_f64() / y.to_f64())))
        }
        Op::Mod => {
            let Some((x, y)) = nonzero_operands(op, vals, "can't $mod by zero")? else {
                return null();
            };
            let r = match (x, y) {
                (Num::I32(p), Num::I32(q)) => Num::I32(p.checked_rem(q).unwrap_or(0)),
                (Num::F64(_), _) | (_, Num::F64(_)) => Num::F64(x.to_f64() % y.to_f64()),
                _ => {
                    let (p, q) = (x.to_i64().unwrap_or(0), y.to_i64().unwrap_or(1));
                    Num::I64(p.checked_rem(q).unwrap_or(0))
                }
            };
            Ok(Some(r.to_bson()))
        }
        Op::Abs | Op::Floor | Op::Ceil => unary(op, arg(op, vals, 0)?),
        Op::Round => round_op(vals),
        other => Err(Error::Internal(format!(
            "{} is not an arithmetic operator",
            other.name()
        ))),
    }
}

/// The two numeric operands of `$divide` / `$mod` (`None`: one is null or
/// missing, the answer is null); a zero divisor is `zero_msg`.
fn nonzero_operands(op: Op, vals: &[Value], zero_msg: &str) -> Result<Option<(Num, Num)>> {
    let (a, b) = (arg(op, vals, 0)?, arg(op, vals, 1)?);
    if is_nullish(a) || is_nullish(b) {
        return Ok(None);
    }
    let (Some(a), Some(b)) = (a, b) else {
        return Ok(None);
    };
    let (x, y) = (want_num(op, a, "")?, want_num(op, b, "")?);
    if y.to_f64() == 0.0 {
        return Err(Error::bad_value(zero_msg));
    }
    Ok(Some((x, y)))
}

fn multiply(vals: &[Value]) -> Result<Value> {
    if vals.iter().any(is_nullish) {
        return null();
    }
    let mut acc = Num::I32(1);
    for v in vals.iter().flatten() {
        acc = mul_nums(acc, want_num(Op::Multiply, v, "")?);
    }
    Ok(Some(acc.to_bson()))
}

/// `$abs`, `$floor`, `$ceil`.
fn unary(op: Op, a: &Value) -> Result<Value> {
    let Some(v) = a.as_ref().filter(|_| !is_nullish(a)) else {
        return null();
    };
    let r = match (op, want_num(op, v, "")?) {
        (Op::Abs, Num::I32(i)) => int_or_long(i64::from(i).abs()),
        (Op::Abs, Num::I64(i)) => Num::I64(
            i.checked_abs()
                .ok_or_else(|| Error::bad_value("can't take $abs of long long min"))?,
        ),
        (Op::Abs, Num::F64(f)) => Num::F64(f.abs()),
        (Op::Floor, Num::F64(f)) => Num::F64(f.floor()),
        (Op::Ceil, Num::F64(f)) => Num::F64(f.ceil()),
        (_, n) => n,
    };
    Ok(Some(r.to_bson()))
}

/// `$round: [number, place?]`.
fn round_op(vals: &[Value]) -> Result<Value> {
    let a = arg(Op::Round, vals, 0)?;
    let place = match vals.get(1) {
        None => 0,
        Some(p) if is_nullish(p) => return null(),
        Some(Some(p)) => match num_of(p) {
            Some(Num::I32(i)) => i64::from(i),
            Some(Num::I64(i)) => i,
            Some(Num::F64(f)) if f.fract() == 0.0 && f.abs() < 1e9 => f as i64,
            _ => {
                return Err(Error::bad_value(
                    "$round requires \"place\" argument to be an integral value",
                ))
            }
        },
        Some(None) => return null(),
    };
    if !(-20..=100).contains(&place) {
        return Err(Error::bad_value(format!(
            "$round requires \"place\" to be between -20 and 100, but is {place}"
        )));
    }
    let Some(v) = a.as_ref().filter(|_| !is_nullish(a)) else {
        return null();
    };
    Ok(Some(round(want_num(Op::Round, v, "")?, place).to_bson()))
}

/// `$add`: numbers, and at most one date (the sum is then a date).
fn add(vals: &[Value]) -> Result<Value> {
    let mut acc = Num::I32(0);
    let mut date: Option<i64> = None;
    for v in vals {
        if is_nullish(v) {
            return Ok(Some(Bson::Null));
        }
    }
    for v in vals.iter().flatten() {
        match v {
            Bson::DateTime(d) => {
                if date.is_some() {
                    return Err(Error::bad_value(
                        "only one date allowed in an $add expression",
                    ));
                }
                date = Some(d.timestamp_millis());
            }
            Bson::Decimal128(_) => return Err(decimal_gap(Op::Add)),
            other => match num_of(other) {
                Some(n) => acc = add_nums(acc, n),
                None => {
                    return Err(Error::type_mismatch(format!(
                        "$add only supports numeric or date types, not {}",
                        type_name(&Some(other.clone()))
                    )))
                }
            },
        }
    }
    Ok(Some(match date {
        Some(ms) => Bson::DateTime(bson::DateTime::from_millis(add_millis(ms, acc)?)),
        None => acc.to_bson(),
    }))
}

fn add_millis(ms: i64, n: Num) -> Result<i64> {
    let delta = match n {
        Num::F64(f) => {
            let r = f.round();
            if !r.is_finite() || r.abs() >= 9.2e18 {
                return Err(Error::bad_value("date overflow in $add"));
            }
            r as i64
        }
        other => other.to_i64().unwrap_or(0),
    };
    ms.checked_add(delta)
        .ok_or_else(|| Error::bad_value("date overflow in $add"))
}

fn subtract(a: &Value, b: &Value) -> Result<Value> {
    if is_nullish(a) || is_nullish(b) {
        return Ok(Some(Bson::Null));
    }
    let (Some(x), Some(y)) = (a, b) else {
        return Ok(Some(Bson::Null));
    };
    match (x, y) {
        (Bson::DateTime(p), Bson::DateTime(q)) => Ok(Some(Bson::Int64(
            p.timestamp_millis().saturating_sub(q.timestamp_millis()),
        ))),
        (Bson::DateTime(p), other) if num_of(other).is_some() => {
            let n = num_of(other).unwrap_or(Num::I32(0));
            let neg = sub_nums(Num::I32(0), n);
            Ok(Some(Bson::DateTime(bson::DateTime::from_millis(
                add_millis(p.timestamp_millis(), neg)?,
            ))))
        }
        (Bson::Decimal128(_), _) | (_, Bson::Decimal128(_)) => Err(decimal_gap(Op::Subtract)),
        _ => match (num_of(x), num_of(y)) {
            (Some(p), Some(q)) => Ok(Some(sub_nums(p, q).to_bson())),
            _ => Err(Error::type_mismatch(format!(
                "can't $subtract {} from {}",
                type_name(b),
                type_name(a)
            ))),
        },
    }
}

/// `$round` to `place` decimal places, half to even (MongoDB's rule).
fn round(n: Num, place: i64) -> Num {
    match n {
        Num::F64(f) => {
            if !f.is_finite() || place > 15 {
                return Num::F64(f);
            }
            let scale = 10f64.powi(place as i32);
            let r = (f * scale).round_ties_even() / scale;
            Num::F64(if r.is_finite() { r } else { f })
        }
        Num::I32(_) | Num::I64(_) if place >= 0 => n,
        Num::I32(x) => round_int(i64::from(x), place)
            .map(int_or_long)
            .unwrap_or(Num::I32(x)),
        Num::I64(x) => round_int(x, place).map(Num::I64).unwrap_or(Num::I64(x)),
    }
}

fn round_int(x: i64, place: i64) -> Option<i64> {
    let q = 10i128.checked_pow(u32::try_from(-place).ok()?)?;
    let x = i128::from(x);
    let down = x.div_euclid(q) * q;
    let rem = x - down;
    let r = match (rem * 2).cmp(&q) {
        Ordering::Less => down,
        Ordering::Greater => down + q,
        Ordering::Equal if (down / q) % 2 == 0 => down,
        Ordering::Equal => down + q,
    };
    i64::try_from(r).ok()
}
