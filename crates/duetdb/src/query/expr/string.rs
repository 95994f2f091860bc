//! String operators: `$concat`, `$toLower`, `$toUpper`, `$substrBytes`
//! (`$substr` is its alias), `$substrCP`, `$strLenBytes`, `$strLenCP`,
//! `$split`, `$indexOfBytes`, `$indexOfCP`, `$strcasecmp`, and the named
//! `$trim $ltrim $rtrim $replaceOne $replaceAll`.
//!
//! Invariants: case mapping is ASCII-only, as in MongoDB; `$substrBytes`
//! counts bytes and refuses a range that would split a UTF-8 character (never
//! slices inside one, so it cannot panic); `$concat` of a null or missing
//! argument is null, and a `$concat` result past 16 MiB is refused (10334)
//! before it is built.

use bson::Bson;

use crate::doc::size::SizeBudget;
use crate::error::{Error, Result};
use crate::query::expr::array::int32_of;
use crate::query::expr::eval::{arg, null, Args, Env};
use crate::query::expr::{is_nullish, num_of, type_name, Expr, Named, Num, Op, Value};

/// `$concat`: its arguments evaluated one at a time and appended, so a result
/// past the size limit is refused before it is built (and before the
/// remaining arguments are evaluated); the first null or missing argument
/// makes the result null.
pub(super) fn concat(args: &[Expr], cx: &Env<'_>) -> Result<Value> {
    let mut out = String::new();
    let mut size = SizeBudget::new("$concat");
    for a in args {
        match a.eval_in(cx)? {
            None | Some(Bson::Null) | Some(Bson::Undefined) => return null(),
            Some(Bson::String(s)) => {
                size.add(s.len())?;
                out.push_str(&s);
            }
            other => {
                return Err(loc!(
                    16702,
                    "$concat only supports strings, not {}",
                    type_name(&other)
                ))
            }
        }
    }
    Ok(Some(Bson::String(out)))
}

/// Apply a string operator to its evaluated arguments.
pub(super) fn apply(op: Op, vals: &[Value]) -> Result<Value> {
    match op {
        Op::ToLower | Op::ToUpper => {
            let s = coerce_string(op, arg(op, vals, 0)?)?;
            // MongoDB's case mapping is ASCII-only.
            Ok(Some(Bson::String(if op == Op::ToLower {
                s.to_ascii_lowercase()
            } else {
                s.to_ascii_uppercase()
            })))
        }
        Op::SubstrBytes => substr_bytes(arg(op, vals, 0)?, arg(op, vals, 1)?, arg(op, vals, 2)?),
        Op::SubstrCP => substr_cp(arg(op, vals, 0)?, arg(op, vals, 1)?, arg(op, vals, 2)?),
        Op::StrLenBytes | Op::StrLenCP => {
            let v = arg(op, vals, 0)?;
            let Some(Bson::String(s)) = v else {
                return Err(if op == Op::StrLenBytes {
                    loc!(
                        34473,
                        "$strLenBytes requires a string argument, found: {}",
                        type_name(v)
                    )
                } else {
                    loc!(
                        34471,
                        "$strLenCP requires a string argument, found: {}",
                        type_name(v)
                    )
                });
            };
            let n = if op == Op::StrLenBytes {
                s.len()
            } else {
                s.chars().count()
            };
            Ok(Some(Bson::Int32(i32::try_from(n).unwrap_or(i32::MAX))))
        }
        Op::Split => split(arg(op, vals, 0)?, arg(op, vals, 1)?),
        Op::IndexOfBytes | Op::IndexOfCP => index_of(op, vals),
        Op::Strcasecmp => {
            let a = coerce_string(op, arg(op, vals, 0)?)?.to_ascii_uppercase();
            let b = coerce_string(op, arg(op, vals, 1)?)?.to_ascii_uppercase();
            Ok(Some(Bson::Int32(match a.as_bytes().cmp(b.as_bytes()) {
                std::cmp::Ordering::Less => -1,
                std::cmp::Ordering::Equal => 0,
                std::cmp::Ordering::Greater => 1,
            })))
        }
        other => Err(Error::Internal(format!(
            "{} is not a string operator",
            other.name()
        ))),
    }
}

fn coerce_string(op: Op, v: &Value) -> Result<String> {
    match v {
        None | Some(Bson::Null) | Some(Bson::Undefined) => Ok(String::new()),
        Some(Bson::String(s)) | Some(Bson::Symbol(s)) => Ok(s.clone()),
        Some(Bson::Int32(i)) => Ok(i.to_string()),
        Some(Bson::Int64(i)) => Ok(i.to_string()),
        Some(Bson::Double(f)) => Ok(f.to_string()),
        Some(Bson::Decimal128(d)) => Ok(d.to_string()),
        Some(Bson::DateTime(d)) => Ok(crate::query::expr::convert::iso_date(d.timestamp_millis())),
        other => Err(Error::type_mismatch(format!(
            "{}: can't convert from BSON type {} to String",
            op.name(),
            type_name(other)
        ))),
    }
}

fn substr_bytes(s: &Value, start: &Value, len: &Value) -> Result<Value> {
    let s = coerce_string(Op::SubstrBytes, s)?;
    let int = |v: &Value, what: &str| -> Result<i64> {
        match v.as_ref().and_then(num_of) {
            Some(Num::I32(i)) => Ok(i64::from(i)),
            Some(Num::I64(i)) => Ok(i),
            Some(Num::F64(f)) if f.is_finite() => Ok(f.trunc() as i64),
            _ => Err(Error::type_mismatch(format!(
                "$substrBytes: {what} must be a numeric type (is BSON type {})",
                type_name(v)
            ))),
        }
    };
    let start = int(start, "starting index")?;
    let len = int(len, "length")?;
    let Ok(start) = usize::try_from(start) else {
        return Err(Error::bad_value(
            "$substrBytes: starting index must be non-negative",
        ));
    };
    if start >= s.len() {
        return Ok(Some(Bson::String(String::new())));
    }
    let end = match usize::try_from(len) {
        Ok(l) => start.saturating_add(l).min(s.len()),
        Err(_) => s.len(), // negative length: to the end
    };
    if !s.is_char_boundary(start) {
        return Err(Error::bad_value(
            "$substrBytes: Invalid range, starting index is a UTF-8 continuation byte.",
        ));
    }
    if !s.is_char_boundary(end) {
        return Err(Error::bad_value(
            "$substrBytes: Invalid range, ending index is in the middle of a UTF-8 character.",
        ));
    }
    Ok(Some(Bson::String(s[start..end].to_string())))
}

fn substr_cp(s: &Value, start: &Value, len: &Value) -> Result<Value> {
    let s = coerce_string(Op::SubstrCP, s)?;
    let int = |v: &Value, what: &str, num_code: bool| -> Result<i64> {
        let Some(b) = v.as_ref().filter(|b| crate::query::expr::array::is_num(b)) else {
            return Err(if num_code {
                loc!(
                    34450,
                    "$substrCP: {what} must be a numeric type (is BSON type {})",
                    type_name(v)
                )
            } else {
                loc!(
                    34452,
                    "$substrCP: {what} must be a numeric type (is BSON type {})",
                    type_name(v)
                )
            });
        };
        int32_of(b).ok_or_else(|| {
            if num_code {
                loc!(
                    34451,
                    "$substrCP: {what} cannot be represented as a 32-bit integral value"
                )
            } else {
                loc!(
                    34453,
                    "$substrCP: {what} cannot be represented as a 32-bit integral value"
                )
            }
        })
    };
    let start = int(start, "starting index", true)?;
    let len = int(len, "length", false)?;
    if len < 0 {
        return Err(loc!(
            34454,
            "$substrCP: length must be a nonnegative integer."
        ));
    }
    if start < 0 {
        return Err(loc!(
            34455,
            "$substrCP: the starting index must be nonnegative integer."
        ));
    }
    let out: String = s
        .chars()
        .skip(usize::try_from(start).unwrap_or(usize::MAX))
        .take(usize::try_from(len).unwrap_or(0))
        .collect();
    Ok(Some(Bson::String(out)))
}

fn split(s: &Value, delim: &Value) -> Result<Value> {
    if is_nullish(s) {
        return null();
    }
    let Some(Bson::String(s)) = s else {
        return Err(loc!(
            40085,
            "$split requires an expression that evaluates to a string as a first argument, found: {}",
            type_name(s)
        ));
    };
    let Some(Bson::String(d)) = delim else {
        return Err(loc!(
            40086,
            "$split requires an expression that evaluates to a string as a second argument, found: {}",
            type_name(delim)
        ));
    };
    if d.is_empty() {
        return Err(loc!(40087, "$split requires a non-empty separator"));
    }
    Ok(Some(Bson::Array(
        s.split(d.as_str())
            .map(|p| Bson::String(p.to_string()))
            .collect(),
    )))
}

fn index_of(op: Op, vals: &[Value]) -> Result<Value> {
    let s = arg(op, vals, 0)?;
    if is_nullish(s) {
        return null();
    }
    let Some(Bson::String(s)) = s else {
        return Err(loc!(
            40091,
            "{} requires a string as the first argument, found: {}",
            op.name(),
            type_name(s)
        ));
    };
    let sub = arg(op, vals, 1)?;
    let Some(Bson::String(sub)) = sub else {
        return Err(loc!(
            40092,
            "{} requires a string as the second argument, found: {}",
            op.name(),
            type_name(sub)
        ));
    };
    let cp = op == Op::IndexOfCP;
    let units: usize = if cp { s.chars().count() } else { s.len() };
    let bound = |i: usize, dflt: usize| -> Result<usize> {
        let Some(v) = vals.get(i) else {
            return Ok(dflt);
        };
        let Some(n) = v.as_ref().and_then(int32_of) else {
            return Err(loc!(
                40096,
                "{} requires an integral {}, found a value of type: {}",
                op.name(),
                if i == 2 {
                    "starting index"
                } else {
                    "ending index"
                },
                type_name(v)
            ));
        };
        usize::try_from(n).map_err(|_| {
            loc!(
                40097,
                "{} requires a nonnegative {}, found: {n}",
                op.name(),
                if i == 2 { "start index" } else { "end index" }
            )
        })
    };
    let start = bound(2, 0)?;
    let end = bound(3, units)?.min(units);
    if start > end || start > units {
        return Ok(Some(Bson::Int32(-1)));
    }
    let found = if cp {
        let chars: Vec<char> = s.chars().collect();
        let needle: Vec<char> = sub.chars().collect();
        (start..=end.saturating_sub(needle.len())).find(|&i| {
            i + needle.len() <= end && chars.get(i..i + needle.len()) == Some(&needle[..])
        })
    } else {
        let hay = s.as_bytes();
        let needle = sub.as_bytes();
        (start..=end.saturating_sub(needle.len()))
            .find(|&i| i + needle.len() <= end && hay.get(i..i + needle.len()) == Some(needle))
    };
    Ok(Some(Bson::Int32(
        found.map_or(-1, |i| i32::try_from(i).unwrap_or(i32::MAX)),
    )))
}

/// MongoDB's default `$trim` characters: the ASCII whitespace and NUL, and
/// the Unicode spaces it lists.
fn default_trim(c: char) -> bool {
    matches!(
        c,
        '\0' | ' ' | '\t' | '\n' | '\u{0B}' | '\u{0C}' | '\r' | '\u{A0}' | '\u{1680}' | '\u{2000}'
            ..='\u{200A}'
    )
}

/// Evaluate a named-argument string operator.
pub(super) fn named(a: &Args<'_, '_>) -> Result<Value> {
    match a.n {
        Named::Trim | Named::LTrim | Named::RTrim => trim(a),
        _ => replace(a),
    }
}

fn trim(a: &Args<'_, '_>) -> Result<Value> {
    let input = a.get("input")?;
    if is_nullish(&input) {
        return null();
    }
    let Some(Bson::String(s)) = input else {
        return Err(loc!(
            50699,
            "{} requires its input to be a string, got {} (of type {}) instead.",
            a.name(),
            crate::error::render(input.as_ref().unwrap_or(&Bson::Null)),
            type_name(&input)
        ));
    };
    let chars: Option<Vec<char>> = if a.given("chars") {
        let c = a.get("chars")?;
        if is_nullish(&c) {
            return null();
        }
        match c {
            Some(Bson::String(c)) => Some(c.chars().collect()),
            other => {
                return Err(loc!(
                    50700,
                    "{} requires 'chars' to be a string, got {} (of type {}) instead.",
                    a.name(),
                    crate::error::render(other.as_ref().unwrap_or(&Bson::Null)),
                    type_name(&other)
                ))
            }
        }
    } else {
        None
    };
    let strip = |c: char| match &chars {
        Some(set) => set.contains(&c),
        None => default_trim(c),
    };
    let out = match a.n {
        Named::LTrim => s.trim_start_matches(strip),
        Named::RTrim => s.trim_end_matches(strip),
        _ => s.trim_matches(strip),
    };
    Ok(Some(Bson::String(out.to_string())))
}

fn replace(a: &Args<'_, '_>) -> Result<Value> {
    let input = a.get("input")?;
    let find = a.get("find")?;
    let repl = a.get("replacement")?;
    let want = |v: &Value, what: &str| -> Result<Option<String>> {
        match v {
            None | Some(Bson::Null) | Some(Bson::Undefined) => Ok(None),
            Some(Bson::String(s)) => Ok(Some(s.clone())),
            other => Err(match what {
                "input" => loc!(
                    51746,
                    "{} requires that 'input' be a string, found: {}",
                    a.name(),
                    crate::error::render(other.as_ref().unwrap_or(&Bson::Null))
                ),
                "find" => loc!(
                    51745,
                    "{} requires that 'find' be a string, found: {}",
                    a.name(),
                    crate::error::render(other.as_ref().unwrap_or(&Bson::Null))
                ),
                _ => loc!(
                    51744,
                    "{} requires that 'replacement' be a string, found: {}",
                    a.name(),
                    crate::error::render(other.as_ref().unwrap_or(&Bson::Null))
                ),
            }),
        }
    };
    let (i, f, r) = (
        want(&input, "input")?,
        want(&find, "find")?,
        want(&repl, "replacement")?,
    );
    let (Some(i), Some(f), Some(r)) = (i, f, r) else {
        return null();
    };
    let out = if a.n == Named::ReplaceOne {
        i.replacen(&f, &r, 1)
    } else if f.is_empty() {
        // MongoDB inserts the replacement between every character.
        let mut out = String::with_capacity(i.len() + r.len() * (i.len() + 1));
        out.push_str(&r);
        for c in i.chars() {
            out.push(c);
            out.push_str(&r);
        }
        out
    } else {
        i.replace(&f, &r)
    };
    crate::doc::size::SizeBudget::new(a.name()).add(out.len())?;
    Ok(Some(Bson::String(out)))
}
