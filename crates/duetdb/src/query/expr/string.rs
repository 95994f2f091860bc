//! String operators: `$concat`, `$toLower`, `$toUpper`, `$substrBytes`
//! (`$substr` is its alias).
//!
//! Invariants: case mapping is ASCII-only, as in MongoDB; `$substrBytes`
//! counts bytes and refuses a range that would split a UTF-8 character (never
//! slices inside one, so it cannot panic); `$concat` of a null or missing
//! argument is null, and a `$concat` result past 16 MiB is refused (10334)
//! before it is built.

use bson::Bson;

use crate::doc::size::SizeBudget;
use crate::error::{Error, Result};
use crate::query::expr::eval::{arg, null};
use crate::query::expr::{num_of, type_name, Expr, Num, Op, Root, Value};

/// `$concat`: its arguments evaluated one at a time and appended, so a result
/// past the size limit is refused before it is built (and before the
/// remaining arguments are evaluated); the first null or missing argument
/// makes the result null.
pub(super) fn concat(args: &[Expr], root: &Root<'_>) -> Result<Value> {
    let mut out = String::new();
    let mut size = SizeBudget::new("$concat");
    for a in args {
        match a.eval(root)? {
            None | Some(Bson::Null) | Some(Bson::Undefined) => return null(),
            Some(Bson::String(s)) => {
                size.add(s.len())?;
                out.push_str(&s);
            }
            other => {
                return Err(Error::type_mismatch(format!(
                    "$concat only supports strings, not {}",
                    type_name(&other)
                )))
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
