//! Arithmetic operators: `$add $subtract $multiply $divide $mod $abs $floor
//! $ceil $round $trunc $pow $exp $ln $log $log10 $sqrt`, the trigonometric
//! ones, `$sum $avg $stdDevPop $stdDevSamp` as expressions, `$rand`, date ±
//! milliseconds, and the number type they share ([`Num`]).
//!
//! Invariants (MongoDB's type rules): int32 ∘ int32 stays int32 unless it
//! overflows (then int64); int64 overflow goes to double; any double makes a
//! double; `$divide` always gives a double; any decimal128 operand makes the
//! whole operation exact decimal128 (`decimal.rs`), never a double; a null or
//! missing argument gives null. Date arithmetic that leaves the i64
//! millisecond range is an error, not a wrap.

use std::cmp::Ordering;

use bson::Bson;

use crate::doc::value;
use crate::error::{Error, Result};
use crate::query::expr::decimal::{self, Dec};
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

/// A number of any of the four numeric types.
#[derive(Debug, Clone, Copy)]
pub(super) enum AnyNum {
    N(Num),
    D(Dec),
}

impl AnyNum {
    pub(super) fn of(v: &Bson) -> Option<AnyNum> {
        match v {
            Bson::Decimal128(d) => Some(AnyNum::D(decimal::from_bson(*d))),
            other => num_of(other).map(AnyNum::N),
        }
    }

    pub(super) fn dec(self) -> Dec {
        match self {
            AnyNum::N(n) => decimal::from_num(n),
            AnyNum::D(d) => d,
        }
    }

    pub(super) fn f64(self) -> f64 {
        match self {
            AnyNum::N(n) => n.to_f64(),
            AnyNum::D(d) => decimal::to_f64(d),
        }
    }

    fn is_zero(self) -> bool {
        match self {
            AnyNum::N(n) => n.to_f64() == 0.0,
            AnyNum::D(d) => d.is_zero(),
        }
    }

    fn is_dec(self) -> bool {
        matches!(self, AnyNum::D(_))
    }
}

fn dec_bson(d: Dec) -> Bson {
    Bson::Decimal128(decimal::to_bson(d))
}

/// Apply an arithmetic operator to its evaluated arguments.
pub(super) fn apply(op: Op, vals: &[Value]) -> Result<Value> {
    match op {
        Op::Add => add(vals),
        Op::Subtract => subtract(arg(op, vals, 0)?, arg(op, vals, 1)?),
        Op::Multiply => multiply(vals),
        Op::Divide => {
            let Some((x, y)) = operands(op, vals, "$divide")? else {
                return null();
            };
            if y.is_zero() {
                return Err(Error::bad_value("can't $divide by zero"));
            }
            if x.is_dec() || y.is_dec() {
                return Ok(Some(dec_bson(decimal::cx().div(x.dec(), y.dec()))));
            }
            Ok(Some(Bson::Double(x.f64() / y.f64())))
        }
        Op::Mod => {
            let Some((x, y)) = operands(op, vals, "$mod")? else {
                return null();
            };
            if y.is_zero() {
                return Err(loc!(16610, "can't $mod by zero"));
            }
            let r = match (x, y) {
                (AnyNum::D(_), _) | (_, AnyNum::D(_)) => {
                    return Ok(Some(dec_bson(decimal::cx().rem(x.dec(), y.dec()))))
                }
                (AnyNum::N(Num::I32(p)), AnyNum::N(Num::I32(q))) => {
                    Num::I32(p.checked_rem(q).unwrap_or(0))
                }
                (AnyNum::N(Num::F64(_)), _) | (_, AnyNum::N(Num::F64(_))) => {
                    Num::F64(x.f64() % y.f64())
                }
                (AnyNum::N(p), AnyNum::N(q)) => {
                    let (p, q) = (p.to_i64().unwrap_or(0), q.to_i64().unwrap_or(1));
                    Num::I64(p.checked_rem(q).unwrap_or(0))
                }
            };
            Ok(Some(r.to_bson()))
        }
        Op::Abs | Op::Floor | Op::Ceil => unary(op, arg(op, vals, 0)?),
        Op::Round | Op::Trunc => round_op(op, vals),
        Op::Pow => pow(arg(op, vals, 0)?, arg(op, vals, 1)?),
        Op::Exp | Op::Ln | Op::Log10 | Op::Sqrt => transcendental(op, arg(op, vals, 0)?),
        Op::Log => log(arg(op, vals, 0)?, arg(op, vals, 1)?),
        Op::Atan2 => atan2(arg(op, vals, 0)?, arg(op, vals, 1)?),
        Op::Sin
        | Op::Cos
        | Op::Tan
        | Op::Asin
        | Op::Acos
        | Op::Atan
        | Op::Sinh
        | Op::Cosh
        | Op::Tanh
        | Op::Asinh
        | Op::Acosh
        | Op::Atanh
        | Op::DegreesToRadians
        | Op::RadiansToDegrees => trig(op, arg(op, vals, 0)?),
        Op::Sum | Op::Avg | Op::StdDevPop | Op::StdDevSamp => stats(op, vals),
        Op::Rand => Ok(Some(Bson::Double(rand::random::<f64>()))),
        other => Err(Error::Internal(format!(
            "{} is not an arithmetic operator",
            other.name()
        ))),
    }
}

/// The two numeric operands of `$divide` / `$mod` (`None`: one is null or
/// missing, the answer is null).
fn operands(op: Op, vals: &[Value], name: &str) -> Result<Option<(AnyNum, AnyNum)>> {
    let (a, b) = (arg(op, vals, 0)?, arg(op, vals, 1)?);
    let (Some(a), Some(b)) = (a, b) else {
        return Ok(None);
    };
    match (AnyNum::of(a), AnyNum::of(b)) {
        (Some(x), Some(y)) => Ok(Some((x, y))),
        _ if is_nullish(&Some(a.clone())) || is_nullish(&Some(b.clone())) => Ok(None),
        _ => {
            let msg = format!(
                "{name} only supports numeric types, not {} and {}",
                crate::doc::types::type_name(a),
                crate::doc::types::type_name(b)
            );
            Err(if op == Op::Mod {
                loc!(16611, "{msg}")
            } else {
                Error::type_mismatch(msg)
            })
        }
    }
}

fn multiply(vals: &[Value]) -> Result<Value> {
    if vals.iter().any(is_nullish) {
        return null();
    }
    let nums = vals
        .iter()
        .flatten()
        .map(|v| {
            AnyNum::of(v).ok_or_else(|| {
                Error::type_mismatch(format!(
                    "$multiply only supports numeric types, not {}",
                    crate::doc::types::type_name(v)
                ))
            })
        })
        .collect::<Result<Vec<_>>>()?;
    if nums.iter().any(|n| n.is_dec()) {
        let mut c = decimal::cx();
        let acc = nums.iter().fold(Dec::ONE, |acc, n| c.mul(acc, n.dec()));
        return Ok(Some(dec_bson(acc)));
    }
    let mut acc = Num::I32(1);
    for n in nums {
        if let AnyNum::N(n) = n {
            acc = mul_nums(acc, n);
        }
    }
    Ok(Some(acc.to_bson()))
}

/// `$abs`, `$floor`, `$ceil`.
fn unary(op: Op, a: &Value) -> Result<Value> {
    let Some(v) = a.as_ref().filter(|_| !is_nullish(a)) else {
        return null();
    };
    let n = match AnyNum::of(v) {
        Some(AnyNum::D(d)) => {
            let r = match op {
                Op::Abs => decimal::cx().abs(d),
                Op::Floor => decimal::round_at(d, 0, dec::Rounding::Floor),
                _ => decimal::round_at(d, 0, dec::Rounding::Ceiling),
            };
            return Ok(Some(dec_bson(r)));
        }
        Some(AnyNum::N(n)) => n,
        None => {
            return Err(loc!(
                28765,
                "{} only supports numeric types, not {}",
                op.name(),
                type_name(a)
            ))
        }
    };
    let r = match (op, n) {
        (Op::Abs, Num::I32(i)) => int_or_long(i64::from(i).abs()),
        (Op::Abs, Num::I64(i)) => Num::I64(
            i.checked_abs()
                .ok_or_else(|| loc!(28680, "can't take $abs of long long min"))?,
        ),
        (Op::Abs, Num::F64(f)) => Num::F64(f.abs()),
        (Op::Floor, Num::F64(f)) => Num::F64(f.floor()),
        (Op::Ceil, Num::F64(f)) => Num::F64(f.ceil()),
        (_, n) => n,
    };
    Ok(Some(r.to_bson()))
}

/// `$round` / `$trunc`: `[number, place?]`.
fn round_op(op: Op, vals: &[Value]) -> Result<Value> {
    let a = arg(op, vals, 0)?;
    let place = match vals.get(1) {
        None => 0,
        Some(p) if is_nullish(p) => return null(),
        Some(Some(p)) => match num_of(p) {
            Some(Num::I32(i)) => i64::from(i),
            Some(Num::I64(i)) => i,
            Some(Num::F64(f)) if f.fract() == 0.0 && f.abs() < 1e9 => f as i64,
            _ => {
                return Err(loc!(
                    51081,
                    "{} requires \"place\" argument to be an integral value",
                    op.name()
                ))
            }
        },
        Some(None) => return null(),
    };
    if !(-20..=100).contains(&place) {
        return Err(loc!(
            51083,
            "{} requires \"place\" to be between -20 and 100, but is {place}",
            op.name()
        ));
    }
    let Some(v) = a.as_ref().filter(|_| !is_nullish(a)) else {
        return null();
    };
    match AnyNum::of(v) {
        Some(AnyNum::D(d)) => {
            let mode = if op == Op::Round {
                dec::Rounding::HalfEven
            } else {
                dec::Rounding::Down
            };
            Ok(Some(dec_bson(decimal::round_at(d, place, mode))))
        }
        Some(AnyNum::N(n)) => Ok(Some(round(n, place, op == Op::Trunc).to_bson())),
        None => Err(loc!(
            51080,
            "{} only supports numeric types, not {}",
            op.name(),
            type_name(a)
        )),
    }
}

/// `$add`: numbers, and at most one date (the sum is then a date).
fn add(vals: &[Value]) -> Result<Value> {
    if vals.iter().any(is_nullish) {
        return null();
    }
    let mut nums = Vec::with_capacity(vals.len());
    let mut date: Option<i64> = None;
    for v in vals.iter().flatten() {
        match v {
            Bson::DateTime(d) => {
                if date.is_some() {
                    return Err(loc!(16612, "only one date allowed in an $add expression"));
                }
                date = Some(d.timestamp_millis());
            }
            other => match AnyNum::of(other) {
                Some(n) => nums.push(n),
                None => {
                    return Err(Error::type_mismatch(format!(
                        "$add only supports numeric or date types, not {}",
                        crate::doc::types::type_name(other)
                    )))
                }
            },
        }
    }
    if nums.iter().any(|n| n.is_dec()) {
        let mut c = decimal::cx();
        let sum = nums.iter().fold(Dec::ZERO, |acc, n| c.add(acc, n.dec()));
        return Ok(Some(match date {
            Some(ms) => {
                let delta = decimal::round_at(sum, 0, dec::Rounding::HalfEven);
                let delta = decimal::to_i64_exact(delta)
                    .ok_or_else(|| Error::bad_value("date overflow in $add"))?;
                Bson::DateTime(bson::DateTime::from_millis(
                    ms.checked_add(delta)
                        .ok_or_else(|| Error::bad_value("date overflow in $add"))?,
                ))
            }
            None => dec_bson(sum),
        }));
    }
    let mut acc = Num::I32(0);
    for n in nums {
        if let AnyNum::N(n) = n {
            acc = add_nums(acc, n);
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
        return null();
    }
    let (Some(x), Some(y)) = (a, b) else {
        return null();
    };
    match (x, y) {
        (Bson::DateTime(p), Bson::DateTime(q)) => Ok(Some(Bson::Int64(
            p.timestamp_millis().saturating_sub(q.timestamp_millis()),
        ))),
        (Bson::DateTime(p), other) if AnyNum::of(other).is_some() => {
            let delta = match AnyNum::of(other) {
                Some(AnyNum::D(d)) => {
                    let r = decimal::round_at(d, 0, dec::Rounding::HalfEven);
                    Num::I64(
                        decimal::to_i64_exact(r)
                            .ok_or_else(|| Error::bad_value("date overflow in $subtract"))?,
                    )
                }
                Some(AnyNum::N(n)) => n,
                None => Num::I32(0),
            };
            let neg = sub_nums(Num::I32(0), delta);
            Ok(Some(Bson::DateTime(bson::DateTime::from_millis(
                add_millis(p.timestamp_millis(), neg)?,
            ))))
        }
        _ => match (AnyNum::of(x), AnyNum::of(y)) {
            (Some(AnyNum::N(p)), Some(AnyNum::N(q))) => Ok(Some(sub_nums(p, q).to_bson())),
            (Some(p), Some(q)) => Ok(Some(dec_bson(decimal::cx().sub(p.dec(), q.dec())))),
            _ => Err(Error::type_mismatch(format!(
                "can't $subtract {} from {}",
                type_name(b),
                type_name(a)
            ))),
        },
    }
}

/// `$round` (half to even, MongoDB's rule) or `$trunc` to `place` decimal
/// places.
fn round(n: Num, place: i64, trunc: bool) -> Num {
    match n {
        Num::F64(f) => {
            if !f.is_finite() || place > 15 {
                return Num::F64(f);
            }
            let scale = 10f64.powi(place as i32);
            let scaled = f * scale;
            let r = if trunc {
                scaled.trunc()
            } else {
                scaled.round_ties_even()
            } / scale;
            Num::F64(if r.is_finite() { r } else { f })
        }
        Num::I32(_) | Num::I64(_) if place >= 0 => n,
        Num::I32(x) => round_int(i64::from(x), place, trunc)
            .map(int_or_long)
            .unwrap_or(Num::I32(x)),
        Num::I64(x) => round_int(x, place, trunc)
            .map(Num::I64)
            .unwrap_or(Num::I64(x)),
    }
}

fn round_int(x: i64, place: i64, trunc: bool) -> Option<i64> {
    let q = 10i128.checked_pow(u32::try_from(-place).ok()?)?;
    let x = i128::from(x);
    if trunc {
        return i64::try_from(x / q * q).ok();
    }
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

/// `$pow`: integral for integral operands with a non-negative exponent
/// while the result fits; a double otherwise; decimal for any decimal.
fn pow(a: &Value, b: &Value) -> Result<Value> {
    if is_nullish(a) || is_nullish(b) {
        return null();
    }
    let (Some(x), Some(y)) = (a, b) else {
        return null();
    };
    let base = AnyNum::of(x)
        .ok_or_else(|| loc!(28762, "$pow's base must be numeric, not {}", type_name(a)))?;
    let exp = AnyNum::of(y).ok_or_else(|| {
        loc!(
            28763,
            "$pow's exponent must be numeric, not {}",
            type_name(b)
        )
    })?;
    if base.is_zero() && exp.f64() < 0.0 {
        return Err(loc!(
            28764,
            "$pow cannot take a base of 0 and a negative exponent"
        ));
    }
    if base.is_dec() || exp.is_dec() {
        let e = exp.dec();
        let r = decimal::via_big(base.dec(), |c, x| {
            let mut y = c
                .parse(e.to_string())
                .unwrap_or_else(|_| c.parse("NaN").unwrap_or_default());
            c.pow(x, &y);
            let _ = &mut y;
        });
        return Ok(Some(dec_bson(r)));
    }
    let (AnyNum::N(bn), AnyNum::N(en)) = (base, exp) else {
        return null();
    };
    if let (Some(bi), Some(ei)) = (bn.to_i64(), en.to_i64()) {
        if ei >= 0 {
            let r = u32::try_from(ei).ok().and_then(|e| bi.checked_pow(e));
            if let Some(r) = r {
                let both_int = matches!((bn, en), (Num::I32(_), Num::I32(_)));
                return Ok(Some(if both_int {
                    int_or_long(r).to_bson()
                } else {
                    Bson::Int64(r)
                }));
            }
        } else if bi == 1 || bi == -1 {
            let r = if bi == -1 && ei % 2 != 0 { -1 } else { 1 };
            return Ok(Some(if matches!(bn, Num::I32(_)) {
                Bson::Int32(r as i32)
            } else {
                Bson::Int64(r)
            }));
        }
    }
    Ok(Some(Bson::Double(bn.to_f64().powf(en.to_f64()))))
}

/// The one argument of `$exp`/`$ln`/`$log10`/`$sqrt` and the trigonometric
/// operators: `None` for null or missing, else the value and its number
/// (28765 when not numeric).
fn numeric_arg(op: Op, a: &Value) -> Result<Option<(&Bson, AnyNum)>> {
    let Some(v) = a.as_ref().filter(|_| !is_nullish(a)) else {
        return Ok(None);
    };
    AnyNum::of(v).map(|n| Some((v, n))).ok_or_else(|| {
        loc!(
            28765,
            "{} only supports numeric types, not {}",
            op.name(),
            type_name(a)
        )
    })
}

/// `$exp`, `$ln`, `$log10`, `$sqrt`: a double, or a decimal for a decimal.
fn transcendental(op: Op, a: &Value) -> Result<Value> {
    let Some((v, n)) = numeric_arg(op, a)? else {
        return null();
    };
    let f = n.f64();
    let positive = match n {
        AnyNum::D(d) => !d.is_negative() && !d.is_zero() || d.is_nan(),
        _ => f > 0.0 || f.is_nan(),
    };
    match op {
        Op::Ln if !positive => {
            return Err(loc!(
                28766,
                "$ln's argument must be a positive number, but is {}",
                crate::error::render(v)
            ))
        }
        Op::Log10 if !positive => {
            return Err(loc!(
                28761,
                "$log10's argument must be a positive number, but is {}",
                crate::error::render(v)
            ))
        }
        Op::Sqrt if f < 0.0 => {
            return Err(loc!(
                28714,
                "$sqrt's argument must be greater than or equal to 0"
            ))
        }
        _ => {}
    }
    if let AnyNum::D(d) = n {
        let r = decimal::via_big(d, |c, x| match op {
            Op::Exp => c.exp(x),
            Op::Ln => c.ln(x),
            Op::Log10 => c.log10(x),
            _ => c.sqrt(x),
        });
        return Ok(Some(dec_bson(r)));
    }
    Ok(Some(Bson::Double(match op {
        Op::Exp => f.exp(),
        Op::Ln => f.ln(),
        Op::Log10 => f.log10(),
        _ => f.sqrt(),
    })))
}

/// `$log: [number, base]`.
fn log(a: &Value, b: &Value) -> Result<Value> {
    if is_nullish(a) || is_nullish(b) {
        return null();
    }
    let (Some(x), Some(y)) = (a, b) else {
        return null();
    };
    let n = AnyNum::of(x).ok_or_else(|| {
        loc!(
            28756,
            "$log's argument must be numeric, not {}",
            type_name(a)
        )
    })?;
    let base = AnyNum::of(y)
        .ok_or_else(|| loc!(28757, "$log's base must be numeric, not {}", type_name(b)))?;
    if n.f64() <= 0.0 {
        return Err(loc!(
            28758,
            "$log's argument must be a positive number, but is {}",
            crate::error::render(x)
        ));
    }
    if base.f64() <= 0.0 || base.f64() == 1.0 {
        return Err(loc!(
            28759,
            "$log's base must be a positive number not equal to 1, but is {}",
            crate::error::render(y)
        ));
    }
    if n.is_dec() || base.is_dec() {
        let ln_n = decimal::via_big(n.dec(), |c, x| c.ln(x));
        let ln_b = decimal::via_big(base.dec(), |c, x| c.ln(x));
        return Ok(Some(dec_bson(decimal::cx().div(ln_n, ln_b))));
    }
    Ok(Some(Bson::Double(n.f64().ln() / base.f64().ln())))
}

fn atan2(a: &Value, b: &Value) -> Result<Value> {
    if is_nullish(a) || is_nullish(b) {
        return null();
    }
    let (Some(x), Some(y)) = (a, b) else {
        return null();
    };
    let (Some(p), Some(q)) = (AnyNum::of(x), AnyNum::of(y)) else {
        return Err(loc!(
            51044,
            "$atan2 only supports numeric types, not {} and {}",
            type_name(a),
            type_name(b)
        ));
    };
    let r = p.f64().atan2(q.f64());
    Ok(Some(if p.is_dec() || q.is_dec() {
        dec_bson(decimal::from_f64(r))
    } else {
        Bson::Double(r)
    }))
}

/// The trigonometric operators (computed in double precision; a decimal
/// argument gives a decimal of that double, as MongoDB's does for these).
fn trig(op: Op, a: &Value) -> Result<Value> {
    let Some((v, n)) = numeric_arg(op, a)? else {
        return null();
    };
    let f = n.f64();
    let domain = |lo: f64, hi: f64| -> Result<()> {
        if f.is_nan() || (lo..=hi).contains(&f) {
            Ok(())
        } else {
            Err(loc!(
                50989,
                "cannot apply {} to {}, value must be in [{lo},{hi}]",
                op.name(),
                crate::error::render(v)
            ))
        }
    };
    let r = match op {
        Op::Sin | Op::Cos | Op::Tan if f.is_infinite() => {
            return Err(loc!(
                50989,
                "cannot apply {} to {}, value must be in (-inf,inf)",
                op.name(),
                crate::error::render(v)
            ))
        }
        Op::Sin => f.sin(),
        Op::Cos => f.cos(),
        Op::Tan => f.tan(),
        Op::Asin => {
            domain(-1.0, 1.0)?;
            f.asin()
        }
        Op::Acos => {
            domain(-1.0, 1.0)?;
            f.acos()
        }
        Op::Atan => f.atan(),
        Op::Sinh => f.sinh(),
        Op::Cosh => f.cosh(),
        Op::Tanh => f.tanh(),
        Op::Asinh => f.asinh(),
        Op::Acosh => {
            domain(1.0, f64::INFINITY)?;
            f.acosh()
        }
        Op::Atanh => {
            domain(-1.0, 1.0)?;
            f.atanh()
        }
        Op::DegreesToRadians => f.to_radians(),
        _ => f.to_degrees(),
    };
    Ok(Some(if n.is_dec() {
        dec_bson(decimal::from_f64(r))
    } else {
        Bson::Double(r)
    }))
}

/// `$sum`, `$avg`, `$stdDevPop`, `$stdDevSamp` as expressions: over the
/// elements of one array argument, or over several arguments; values that
/// are not numbers are ignored.
fn stats(op: Op, vals: &[Value]) -> Result<Value> {
    let nums: Vec<AnyNum> = match vals {
        [Some(Bson::Array(a))] => a.iter().filter_map(AnyNum::of).collect(),
        _ => vals.iter().flatten().filter_map(AnyNum::of).collect(),
    };
    Ok(Some(match op {
        Op::Sum => sum_of(&nums),
        Op::Avg if nums.is_empty() => Bson::Null,
        Op::Avg => {
            if nums.iter().any(|n| n.is_dec()) {
                let Bson::Decimal128(total) = sum_of(&nums) else {
                    return null();
                };
                let count = Dec::from(i64::try_from(nums.len()).unwrap_or(i64::MAX));
                dec_bson(decimal::cx().div(decimal::from_bson(total), count))
            } else {
                Bson::Double(nums.iter().map(|n| n.f64()).sum::<f64>() / nums.len() as f64)
            }
        }
        _ => {
            let samp = op == Op::StdDevSamp;
            match std_dev(nums.iter().map(|n| n.f64()), samp) {
                Some(s) => Bson::Double(s),
                None => Bson::Null,
            }
        }
    }))
}

/// The exact sum MongoDB's `$sum` gives: integers summed exactly, int32 while
/// it fits, then int64, then double; any double makes a double, any decimal
/// a decimal.
pub(super) fn sum_of(nums: &[AnyNum]) -> Bson {
    if nums.iter().any(|n| n.is_dec()) {
        let mut c = decimal::cx();
        return dec_bson(nums.iter().fold(Dec::ZERO, |acc, n| c.add(acc, n.dec())));
    }
    let mut acc = Num::I32(0);
    for n in nums {
        if let AnyNum::N(n) = n {
            acc = add_nums(acc, *n);
        }
    }
    acc.to_bson()
}

/// Population or sample standard deviation (Welford's one pass); `None`
/// for no values (or one, for the sample).
pub(super) fn std_dev(xs: impl Iterator<Item = f64>, samp: bool) -> Option<f64> {
    let (mut n, mut mean, mut m2) = (0u64, 0.0f64, 0.0f64);
    for x in xs {
        n += 1;
        let d = x - mean;
        mean += d / n as f64;
        m2 += d * (x - mean);
    }
    let denom = if samp { n.checked_sub(1)? } else { n };
    if denom == 0 {
        return None;
    }
    Some((m2 / denom as f64).sqrt())
}

/// `$bitAnd $bitOr $bitXor $bitNot` (int and long only; int32 when every
/// operand is an int32; a null or missing operand gives null).
pub(super) fn bitwise(op: Op, vals: &[Value]) -> Result<Value> {
    if vals.iter().any(is_nullish) {
        return null();
    }
    let mut all_int = true;
    let mut ints = Vec::with_capacity(vals.len());
    for v in vals.iter().flatten() {
        match v {
            Bson::Int32(i) => ints.push(i64::from(*i)),
            Bson::Int64(i) => {
                all_int = false;
                ints.push(*i);
            }
            other => {
                return Err(Error::type_mismatch(format!(
                    "{} only supports int and long operands, not {}",
                    op.name(),
                    crate::doc::types::type_name(other)
                )))
            }
        }
    }
    let r = match op {
        Op::BitAnd => ints.iter().fold(-1i64, |a, b| a & b),
        Op::BitOr => ints.iter().fold(0i64, |a, b| a | b),
        Op::BitXor => ints.iter().fold(0i64, |a, b| a ^ b),
        _ => !ints.first().copied().unwrap_or(0),
    };
    Ok(Some(if all_int {
        Bson::Int32(r as i32)
    } else {
        Bson::Int64(r)
    }))
}
