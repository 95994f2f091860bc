//! Type operators: `$type`, `$isNumber`, `$convert` and its shorthands
//! `$toString $toInt $toLong $toDouble $toDecimal $toBool $toDate
//! $toObjectId`.
//!
//! Invariants (MongoDB 7.0's conversion table): a null or missing input gives
//! `onNull` (or null); a conversion MongoDB does not support, or a value that
//! does not convert (an unparsable string, an out-of-range number), gives
//! `onError` when given and otherwise ConversionFailure (241) with MongoDB's
//! message; `onError`/`onNull` are evaluated only when used. Strings parse
//! whole (`"12abc"` fails), base 10; doubles convert to integers by
//! truncation, refusing NaN, infinities and out-of-range values.

use bson::oid::ObjectId;
use bson::Bson;

use crate::error::{Error, Result};
use crate::query::expr::arithmetic::AnyNum;
use crate::query::expr::eval::{arg, null, Args};
use crate::query::expr::logic::truthy_bson;
use crate::query::expr::{decimal, is_nullish, num_of, type_name, Num, Op, Value};

/// A conversion target.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum To {
    Double,
    String,
    ObjectId,
    Bool,
    Date,
    Int,
    Long,
    Decimal,
}

impl To {
    fn name(self) -> &'static str {
        match self {
            To::Double => "double",
            To::String => "string",
            To::ObjectId => "objectId",
            To::Bool => "bool",
            To::Date => "date",
            To::Int => "int",
            To::Long => "long",
            To::Decimal => "decimal",
        }
    }
}

/// Why a conversion failed: unsupported (from, to) or a bad value (the
/// whole message: MongoDB puts [`CLAUSE`] at different places in each).
enum Fail {
    Unsupported,
    Value(String),
}

/// The ISO-8601 form MongoDB prints dates in (`2018-03-27T16:58:51.538Z`).
pub(crate) fn iso_date(ms: i64) -> String {
    crate::query::expr::datefmt::format_date(ms, "%Y-%m-%dT%H:%M:%S.%LZ", None)
        .unwrap_or_else(|_| ms.to_string())
}

/// Apply a type operator to its evaluated argument.
pub(super) fn apply(op: Op, vals: &[Value]) -> Result<Value> {
    let v = arg(op, vals, 0)?;
    let to = match op {
        Op::Type => return Ok(Some(Bson::String(type_name(v).to_string()))),
        Op::IsNumber => {
            return Ok(Some(Bson::Boolean(
                v.as_ref().is_some_and(crate::query::expr::array::is_num),
            )))
        }
        Op::ToHashedIndexKey => return hashed_index_key(v.as_ref()).map(Some),
        Op::ToString => To::String,
        Op::ToInt => To::Int,
        Op::ToLong => To::Long,
        Op::ToDouble => To::Double,
        Op::ToDecimal => To::Decimal,
        Op::ToBool => To::Bool,
        Op::ToDate => To::Date,
        Op::ToObjectId => To::ObjectId,
        other => {
            return Err(Error::Internal(format!(
                "{} is not a type operator",
                other.name()
            )))
        }
    };
    if is_nullish(v) {
        return null();
    }
    let Some(b) = v else {
        return null();
    };
    match convert_value(b, to) {
        Ok(out) => Ok(Some(out)),
        Err(f) => Err(failure(b, to, f)),
    }
}

/// `$toHashedIndexKey`: the hash a hashed index stores for the value, as a
/// long (missing hashes as null, as MongoDB's `ExpressionToHashedIndexKey`
/// does; no collation applies, as its manual says).
fn hashed_index_key(v: Option<&Bson>) -> Result<Bson> {
    let raw = match v {
        None => bson::RawBson::Null,
        Some(b) => bson::RawBson::try_from(b.clone())
            .map_err(|e| Error::Internal(format!("$toHashedIndexKey: {e}")))?,
    };
    Ok(Bson::Int64(crate::store::hashed::hash64(
        raw.as_raw_bson_ref(),
    )))
}

fn failure(b: &Bson, to: To, f: Fail) -> Error {
    Error::Coded {
        code: 241,
        name: "ConversionFailure",
        msg: match f {
            Fail::Unsupported => format!(
                "Unsupported conversion from {} to {} in $convert with no onError value",
                crate::doc::types::type_name(b),
                to.name()
            ),
            Fail::Value(m) => m,
        },
    }
}

/// `$convert: {input, to, onError, onNull}`.
pub(super) fn convert(a: &Args<'_, '_>) -> Result<Value> {
    let input = a.get("input")?;
    let to_v = a.get("to")?;
    let to = match &to_v {
        None | Some(Bson::Null) | Some(Bson::Undefined) => None,
        Some(Bson::String(s)) => Some(match s.as_str() {
            "double" => To::Double,
            "string" => To::String,
            "objectId" => To::ObjectId,
            "bool" => To::Bool,
            "date" => To::Date,
            "int" => To::Int,
            "long" => To::Long,
            "decimal" => To::Decimal,
            other if crate::doc::types::from_alias(other).is_some() => {
                return Err(Error::Coded {
                    code: 241,
                    name: "ConversionFailure",
                    msg: format!(
                    "Unsupported conversion from {} to {other} in $convert with no onError value",
                    type_name(&input)
                ),
                })
            }
            other => return Err(Error::bad_value(format!("Unknown type name: {other}"))),
        }),
        Some(b) => match num_of(b) {
            Some(n) => {
                let f = n.to_f64();
                let code = if f.fract() == 0.0 && f.abs() < 1e9 {
                    f as i64
                } else {
                    -1
                };
                Some(match code {
                    1 => To::Double,
                    2 => To::String,
                    7 => To::ObjectId,
                    8 => To::Bool,
                    9 => To::Date,
                    16 => To::Int,
                    18 => To::Long,
                    19 => To::Decimal,
                    _ => {
                        return Err(Error::bad_value(format!(
                            "In $convert, numeric value for 'to' does not correspond to a BSON type: {f}"
                        )))
                    }
                })
            }
            None => {
                return Err(Error::Coded {
                    code: 9,
                    name: "FailedToParse",
                    msg: format!(
                        "$convert's 'to' argument must be a string or number, but is {}",
                        crate::doc::types::type_name(b)
                    ),
                })
            }
        },
    };
    if is_nullish(&input) {
        return if a.given("onNull") {
            a.get("onNull")
        } else {
            null()
        };
    }
    let (Some(b), Some(to)) = (&input, to) else {
        return null();
    };
    match convert_value(b, to) {
        Ok(out) => Ok(Some(out)),
        Err(_) if a.given("onError") => a.get("onError"),
        Err(f) => Err(failure(b, to, f)),
    }
}

/// What every conversion failure message says.
const CLAUSE: &str = "in $convert with no onError value";

/// A value out of the target's range; `v` as MongoDB streams the input (a
/// double as C's `%g`, other numbers in full).
fn overflow(v: impl std::fmt::Display) -> Fail {
    Fail::Value(format!(
        "Conversion would overflow target type {CLAUSE}: {v}"
    ))
}

/// NaN or an infinity to an integer.
fn non_finite(nan: bool) -> Fail {
    let what = if nan { "NaN" } else { "infinity" };
    Fail::Value(format!(
        "Attempt to convert {what} value to integer type {CLAUSE}"
    ))
}

/// `f` as C's `printf("%g")` (6 significant digits, trailing zeros
/// dropped, exponent of at least two digits): how MongoDB's `str::stream`
/// prints a double.
pub(super) fn printf_g(f: f64) -> String {
    if f == 0.0 || !f.is_finite() {
        return double_string(f);
    }
    let sci = format!("{f:.5e}");
    let (mant, exp) = sci.split_once('e').unwrap_or((sci.as_str(), "0"));
    let exp: i32 = exp.parse().unwrap_or(0);
    let trim = |t: &str| -> String {
        if t.contains('.') {
            t.trim_end_matches('0').trim_end_matches('.').to_string()
        } else {
            t.to_string()
        }
    };
    if !(-4..6).contains(&exp) {
        let sign = if exp < 0 { '-' } else { '+' };
        format!("{}e{sign}{:02}", trim(mant), exp.abs())
    } else {
        let places = usize::try_from(5 - exp).unwrap_or(0);
        trim(&format!("{f:.places$}"))
    }
}

fn convert_value(b: &Bson, to: To) -> std::result::Result<Bson, Fail> {
    match to {
        To::Bool => match b {
            Bson::String(_)
            | Bson::ObjectId(_)
            | Bson::DateTime(_)
            | Bson::Document(_)
            | Bson::Array(_)
            | Bson::Binary(_)
            | Bson::RegularExpression(_)
            | Bson::Timestamp(_)
            | Bson::JavaScriptCode(_)
            | Bson::MinKey
            | Bson::MaxKey
            | Bson::Boolean(_)
            | Bson::Int32(_)
            | Bson::Int64(_)
            | Bson::Double(_)
            | Bson::Decimal128(_) => Ok(Bson::Boolean(truthy_bson(b))),
            _ => Err(Fail::Unsupported),
        },
        To::Double => match b {
            Bson::Boolean(x) => Ok(Bson::Double(if *x { 1.0 } else { 0.0 })),
            Bson::DateTime(d) => Ok(Bson::Double(d.timestamp_millis() as f64)),
            Bson::String(s) => parse_number(s, To::Double),
            Bson::Decimal128(d) => {
                let x = decimal::from_bson(*d);
                let f = decimal::to_f64(x);
                if f.is_infinite() && x.is_finite() {
                    return Err(overflow(d));
                }
                Ok(Bson::Double(f))
            }
            other => num_of(other)
                .map(|n| Bson::Double(n.to_f64()))
                .ok_or(Fail::Unsupported),
        },
        To::Int | To::Long => {
            let n: i64 = match b {
                Bson::Boolean(x) => i64::from(*x),
                Bson::Int32(i) => i64::from(*i),
                Bson::Int64(i) => *i,
                Bson::DateTime(d) if to == To::Long => d.timestamp_millis(),
                Bson::Double(f) => float_to_i64(*f)?,
                Bson::Decimal128(d) => {
                    let x = decimal::from_bson(*d);
                    if !x.is_finite() {
                        return Err(non_finite(x.is_nan()));
                    }
                    let t = decimal::round_at(x, 0, dec::Rounding::Down);
                    decimal::to_i64_exact(t).ok_or_else(|| overflow(d))?
                }
                Bson::String(s) => return parse_number(s, to),
                _ => return Err(Fail::Unsupported),
            };
            if to == To::Int {
                i32::try_from(n).map(Bson::Int32).map_err(|_| match b {
                    Bson::Double(f) => overflow(printf_g(*f)),
                    Bson::Decimal128(d) => overflow(d),
                    _ => overflow(n),
                })
            } else {
                Ok(Bson::Int64(n))
            }
        }
        To::Decimal => match b {
            Bson::Boolean(x) => Ok(dec_of(AnyNum::N(Num::I32(i32::from(*x))))),
            Bson::DateTime(d) => Ok(dec_of(AnyNum::N(Num::I64(d.timestamp_millis())))),
            Bson::String(s) => parse_number(s, To::Decimal),
            Bson::Decimal128(_) => Ok(b.clone()),
            other => AnyNum::of(other).map(dec_of).ok_or(Fail::Unsupported),
        },
        To::String => match b {
            Bson::String(s) => Ok(Bson::String(s.clone())),
            Bson::Boolean(x) => Ok(Bson::String(x.to_string())),
            Bson::Int32(i) => Ok(Bson::String(i.to_string())),
            Bson::Int64(i) => Ok(Bson::String(i.to_string())),
            Bson::Double(f) => Ok(Bson::String(double_string(*f))),
            Bson::Decimal128(d) => Ok(Bson::String(d.to_string())),
            Bson::ObjectId(o) => Ok(Bson::String(o.to_hex())),
            Bson::DateTime(d) => Ok(Bson::String(iso_date(d.timestamp_millis()))),
            _ => Err(Fail::Unsupported),
        },
        To::ObjectId => match b {
            Bson::ObjectId(_) => Ok(b.clone()),
            Bson::String(s) => {
                if s.len() != 24 {
                    return Err(Fail::Value(format!(
                        "Failed to parse objectId '{s}' {CLAUSE}: Invalid string length for parsing to OID, expected 24 but found {}",
                        s.len()
                    )));
                }
                // OID::parse's words: the first non-hex character, unquoted.
                ObjectId::parse_str(s).map(Bson::ObjectId).map_err(|_| {
                    let c = s.chars().find(|c| !c.is_ascii_hexdigit()).unwrap_or('?');
                    Fail::Value(format!(
                        "Failed to parse objectId '{s}' {CLAUSE}: Invalid character found in hex string: {c}"
                    ))
                })
            }
            _ => Err(Fail::Unsupported),
        },
        To::Date => match b {
            Bson::DateTime(_) => Ok(b.clone()),
            Bson::Int64(i) => Ok(Bson::DateTime(bson::DateTime::from_millis(*i))),
            Bson::Double(f) => {
                float_to_i64(*f).map(|ms| Bson::DateTime(bson::DateTime::from_millis(ms)))
            }
            Bson::Decimal128(d) => {
                let x = decimal::round_at(decimal::from_bson(*d), 0, dec::Rounding::Down);
                decimal::to_i64_exact(x)
                    .map(|ms| Bson::DateTime(bson::DateTime::from_millis(ms)))
                    .ok_or_else(|| overflow(d))
            }
            Bson::ObjectId(o) => Ok(Bson::DateTime(o.timestamp())),
            Bson::Timestamp(t) => Ok(Bson::DateTime(bson::DateTime::from_millis(
                i64::from(t.time) * 1000,
            ))),
            Bson::String(s) => crate::query::expr::date::parse_date_string(s, None, None)
                .map(|ms| Bson::DateTime(bson::DateTime::from_millis(ms)))
                .map_err(|e| Fail::Value(format!("Error parsing date string '{s}'; {e}"))),
            _ => Err(Fail::Unsupported),
        },
    }
}

fn dec_of(n: AnyNum) -> Bson {
    Bson::Decimal128(decimal::to_bson(n.dec()))
}

fn float_to_i64(f: f64) -> std::result::Result<i64, Fail> {
    if !f.is_finite() {
        return Err(non_finite(f.is_nan()));
    }
    let t = f.trunc();
    if !(-9.223_372_036_854_776e18..9.223_372_036_854_776e18).contains(&t) {
        return Err(overflow(printf_g(f)));
    }
    Ok(t as i64)
}

/// A string parsed whole as a base-10 number of the target type, refused
/// with MongoDB's `NumberParser` reasons: integers `No digits` (empty),
/// `Overflow`, else `Did not consume whole string.`; doubles `Empty
/// string`, `Leading whitespace`, `Did not consume any digits`, `Did not
/// consume whole string.`, `Out of range`; decimals `Empty string`, else
/// `Failed to parse string to decimal`. A `0x` prefix is refused first,
/// with its own message.
fn parse_number(s: &str, to: To) -> std::result::Result<Bson, Fail> {
    let bad = |why: &str| Fail::Value(format!("Failed to parse number '{s}' {CLAUSE}: {why}"));
    if s.starts_with("0x") {
        return Err(Fail::Value(format!(
            "Illegal hexadecimal input {CLAUSE}: {s}"
        )));
    }
    match to {
        To::Int | To::Long => {
            if s.is_empty() {
                return Err(bad("No digits"));
            }
            let digits = s.strip_prefix(['-', '+']).unwrap_or(s);
            if !digits.is_empty() && digits.bytes().all(|b| b.is_ascii_digit()) {
                let n: Option<i64> = s.parse().ok();
                return match (to, n) {
                    (To::Int, Some(n)) => i32::try_from(n)
                        .map(Bson::Int32)
                        .map_err(|_| bad("Overflow")),
                    (_, Some(n)) => Ok(Bson::Int64(n)),
                    (_, None) => Err(bad("Overflow")),
                };
            }
            Err(bad("Did not consume whole string."))
        }
        To::Double => {
            if s.is_empty() {
                return Err(bad("Empty string"));
            }
            if s.starts_with(|c: char| c.is_ascii_whitespace()) {
                return Err(bad("Leading whitespace"));
            }
            let lower = s.to_ascii_lowercase();
            let unsigned = lower.trim_start_matches(['-', '+']);
            if matches!(unsigned, "inf" | "infinity" | "nan") {
                return lower
                    .replace("infinity", "inf")
                    .parse::<f64>()
                    .map(Bson::Double)
                    .map_err(|_| bad("Did not consume whole string."));
            }
            let Ok(f) = s.parse::<f64>() else {
                // How far strtod got: digits (or an infinity/NaN word)
                // at the start mean it stopped early, else nothing.
                let b = unsigned.as_bytes();
                let digits = b.first().is_some_and(u8::is_ascii_digit)
                    || (b.first() == Some(&b'.') && b.get(1).is_some_and(u8::is_ascii_digit))
                    || unsigned.starts_with("inf")
                    || unsigned.starts_with("nan");
                return Err(bad(if digits {
                    "Did not consume whole string."
                } else {
                    "Did not consume any digits"
                }));
            };
            // strtod's ERANGE: too large, or too small for a normal double
            // (MongoDB 7 refuses subnormals too).
            let mantissa = unsigned.split(['e', 'E']).next().unwrap_or("");
            let lost = f == 0.0 && mantissa.bytes().any(|c| (b'1'..=b'9').contains(&c));
            if f.is_infinite() || lost || (f != 0.0 && f.abs() < f64::MIN_POSITIVE) {
                return Err(bad("Out of range"));
            }
            Ok(Bson::Double(f))
        }
        _ => {
            if s.is_empty() {
                return Err(bad("Empty string"));
            }
            let d: bson::Decimal128 = s
                .parse()
                .map_err(|_| bad("Failed to parse string to decimal"))?;
            Ok(Bson::Decimal128(d))
        }
    }
}

/// A double as MongoDB's `$toString` prints it (shortest round-trip digits;
/// integral values without a fraction; exponents as `1e+21`).
pub(crate) fn double_string(f: f64) -> String {
    if f.is_nan() {
        return "NaN".into();
    }
    if f.is_infinite() {
        return if f < 0.0 {
            "-Infinity".into()
        } else {
            "Infinity".into()
        };
    }
    if f == 0.0 {
        return if f.is_sign_negative() {
            "-0".into()
        } else {
            "0".into()
        };
    }
    let exp = f.abs().log10().floor();
    if !(-5.0..21.0).contains(&exp) {
        let s = format!("{f:e}");
        return match s.split_once('e') {
            Some((m, e)) if !e.starts_with('-') => format!("{m}e+{e}"),
            _ => s,
        };
    }
    f.to_string()
}
