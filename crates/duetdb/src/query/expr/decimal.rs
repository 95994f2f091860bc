//! Exact decimal128 arithmetic for expressions: IEEE 754-2008 decimal128
//! through libdecnumber (the `dec` crate), converted to and from BSON's
//! decimal128 through their exact string forms.
//!
//! Why strings: BSON stores decimal128 in the binary-integer encoding (BID)
//! and libdecnumber in the densely-packed one (DPD); both print and parse
//! every finite value, infinity and NaN exactly (34 digits, the same exponent
//! range), so the round trip loses nothing and needs no bit twiddling.
//!
//! Invariants: operations round once, half to even, at 34 digits (the
//! default decimal128 context), as MongoDB's `Decimal128` does; a double
//! becomes a decimal rounded to 15 significant digits, as MongoDB's
//! `coerceToDecimal` does (`0.1` → `0.100000000000000`); integers convert
//! exactly.

use dec::{Context, Decimal128 as D};

use crate::query::expr::Num;

pub(crate) type Dec = D;

/// The decimal128 context MongoDB computes in.
pub(crate) fn cx() -> Context<D> {
    Context::<D>::default()
}

pub(crate) fn from_bson(d: bson::Decimal128) -> D {
    cx().parse(d.to_string()).unwrap_or(D::NAN)
}

pub(crate) fn to_bson(d: D) -> bson::Decimal128 {
    let s = d.to_string();
    let s = match s.as_str() {
        "Infinity" | "Inf" => "Infinity".to_string(),
        "-Infinity" | "-Inf" => "-Infinity".to_string(),
        x if x.ends_with("NaN") => "NaN".to_string(),
        _ => s,
    };
    s.parse().unwrap_or_else(|_| {
        bson::Decimal128::from_bytes([0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0x40, 0x7c])
    })
}

pub(crate) fn from_f64(f: f64) -> D {
    if f.is_nan() {
        return D::NAN;
    }
    if f.is_infinite() {
        return cx()
            .parse(if f < 0.0 { "-Infinity" } else { "Infinity" })
            .unwrap_or(D::NAN);
    }
    if f == 0.0 {
        return if f.is_sign_negative() {
            cx().parse("-0").unwrap_or(D::ZERO)
        } else {
            D::ZERO
        };
    }
    cx().parse(format!("{f:.14e}")).unwrap_or(D::NAN)
}

pub(crate) fn from_num(n: Num) -> D {
    match n {
        Num::I32(i) => D::from(i),
        Num::I64(i) => D::from(i),
        Num::F64(f) => from_f64(f),
    }
}

/// The nearest double (through the shortest exact string).
pub(crate) fn to_f64(d: D) -> f64 {
    if d.is_nan() {
        return f64::NAN;
    }
    if d.is_infinite() {
        return if d.is_negative() {
            f64::NEG_INFINITY
        } else {
            f64::INFINITY
        };
    }
    d.to_string().parse().unwrap_or(f64::NAN)
}

/// The value as an i64 if it is integral and in range (after rounding with
/// `mode`).
pub(crate) fn to_i64_exact(d: D) -> Option<i64> {
    if !d.is_finite() || !d.is_integer() {
        return None;
    }
    let r = cx().reduce(d);
    let s = r.to_standard_notation_string();
    s.parse::<i64>().ok()
}

/// `d` rounded at `place` decimal places with `rounding`.
pub(crate) fn round_at(d: D, place: i64, rounding: dec::Rounding) -> D {
    if !d.is_finite() {
        return d;
    }
    let mut c = cx();
    c.set_rounding(rounding);
    let quantum = c.parse(format!("1E{}", -place)).unwrap_or(D::ZERO);
    let r = c.quantize(d, quantum);
    if r.is_nan() {
        d // the result would need more than 34 digits: unchanged, as MongoDB
    } else {
        r
    }
}

/// Apply a function of libdecnumber's arbitrary-precision type (`ln`,
/// `exp`, `pow`, `sqrt` exist only there) and round the result to decimal128.
pub(crate) fn via_big(
    d: D,
    f: impl FnOnce(&mut Context<dec::Decimal<12>>, &mut dec::Decimal<12>),
) -> D {
    let mut c = Context::<dec::Decimal<12>>::default();
    if c.set_precision(34).is_err() {
        return D::NAN;
    }
    let Ok(mut x) = c.parse(d.to_string()) else {
        return D::NAN;
    };
    f(&mut c, &mut x);
    x.to_decimal128()
}
