//! Typed access to command fields, with MongoDB's type errors (code 14,
//! TypeMismatch) for fields of the wrong type.
//!
//! Numbers are accepted as any numeric BSON type when their value is integral
//! and in range, as MongoDB does for `limit`, `batchSize` and the like.

use bson::{Bson, Document};

use crate::error::{CmdResult, CommandError};

fn wrong(field: &str, want: &str, got: &Bson) -> CommandError {
    CommandError::type_mismatch(format!(
        "BSON field '{field}' is the wrong type '{}', expected type '{want}'",
        duetdb::raw::type_name(got)
    ))
}

/// An optional string field.
pub fn opt_str<'a>(d: &'a Document, field: &str) -> CmdResult<Option<&'a str>> {
    match d.get(field) {
        None | Some(Bson::Null) => Ok(None),
        Some(Bson::String(s)) => Ok(Some(s)),
        Some(other) => Err(wrong(field, "string", other)),
    }
}

/// A required string field.
pub fn req_str<'a>(d: &'a Document, field: &str) -> CmdResult<&'a str> {
    opt_str(d, field)?.ok_or_else(|| {
        CommandError::new(
            40414,
            "Location40414",
            format!("BSON field '{field}' is missing but a required field"),
        )
    })
}

/// An optional document field.
pub fn opt_doc<'a>(d: &'a Document, field: &str) -> CmdResult<Option<&'a Document>> {
    match d.get(field) {
        None | Some(Bson::Null) => Ok(None),
        Some(Bson::Document(x)) => Ok(Some(x)),
        Some(other) => Err(wrong(field, "object", other)),
    }
}

/// An optional array field.
pub fn opt_array<'a>(d: &'a Document, field: &str) -> CmdResult<Option<&'a Vec<Bson>>> {
    match d.get(field) {
        None | Some(Bson::Null) => Ok(None),
        Some(Bson::Array(a)) => Ok(Some(a)),
        Some(other) => Err(wrong(field, "array", other)),
    }
}

/// An array of documents (e.g. `documents`, `updates`).
pub fn doc_array<'a>(d: &'a Document, field: &str) -> CmdResult<Vec<&'a Document>> {
    let arr = opt_array(d, field)?.ok_or_else(|| {
        CommandError::new(
            40414,
            "Location40414",
            format!("BSON field '{field}' is missing but a required field"),
        )
    })?;
    arr.iter()
        .map(|v| match v {
            Bson::Document(x) => Ok(x),
            other => Err(wrong(field, "object", other)),
        })
        .collect()
}

/// Truthiness of a flag field: bool, or a number (non-zero = true).
pub fn flag(d: &Document, field: &str) -> CmdResult<bool> {
    match d.get(field) {
        None | Some(Bson::Null) => Ok(false),
        Some(Bson::Boolean(b)) => Ok(*b),
        Some(Bson::Int32(i)) => Ok(*i != 0),
        Some(Bson::Int64(i)) => Ok(*i != 0),
        Some(Bson::Double(f)) => Ok(*f != 0.0),
        Some(other) => Err(wrong(field, "bool", other)),
    }
}

/// A number as i64 (integral doubles accepted).
pub fn as_i64(field: &str, v: &Bson) -> CmdResult<i64> {
    match v {
        Bson::Int32(i) => Ok(i64::from(*i)),
        Bson::Int64(i) => Ok(*i),
        Bson::Double(f) if f.fract() == 0.0 && f.abs() < 9.0e18 => Ok(*f as i64),
        Bson::Double(_) => Err(CommandError::bad_value(format!(
            "BSON field '{field}' must be an integral number"
        ))),
        other => Err(wrong(field, "long", other)),
    }
}

/// An optional integral field.
pub fn opt_i64(d: &Document, field: &str) -> CmdResult<Option<i64>> {
    match d.get(field) {
        None | Some(Bson::Null) => Ok(None),
        Some(v) => as_i64(field, v).map(Some),
    }
}

/// A number as MongoDB's IDL reads a `safeInt64` field
/// (`BSONElement::safeNumberLong`): a fraction truncated toward zero, a value
/// out of range clamped, NaN read as 0. `skip`, `limit` and `batchSize` are
/// such fields, so `batchSize: 2.7` means 2 as on MongoDB.
pub fn safe_number_long(v: &Bson) -> Option<i64> {
    match v {
        Bson::Int32(i) => Some(i64::from(*i)),
        Bson::Int64(i) => Some(*i),
        // `as` saturates and maps NaN to 0: exactly safeNumberLong.
        Bson::Double(f) => Some(*f as i64),
        Bson::Decimal128(d) => d.to_string().parse::<f64>().ok().map(|f| f as i64),
        _ => None,
    }
}

/// An optional `safeInt64` field ([`safe_number_long`]).
pub fn opt_safe_i64(d: &Document, field: &str) -> CmdResult<Option<i64>> {
    match d.get(field) {
        None | Some(Bson::Null) => Ok(None),
        Some(v) => match safe_number_long(v) {
            Some(n) => Ok(Some(n)),
            None => Err(wrong(field, "long", v)),
        },
    }
}

/// An optional non-negative `safeInt64` field (51024 below 0).
pub fn opt_count(d: &Document, field: &str) -> CmdResult<Option<u64>> {
    match opt_safe_i64(d, field)? {
        None => Ok(None),
        Some(n) if n < 0 => Err(CommandError::new(
            51024,
            "Location51024",
            format!("BSON field '{field}' value must be >= 0, actual value '{n}'"),
        )),
        Some(n) => Ok(Some(n as u64)),
    }
}

/// The collection named by the command's first field (a string).
pub fn collection_name<'a>(cmd: &'a Document, name: &str) -> CmdResult<&'a str> {
    match cmd.get(name) {
        Some(Bson::String(s)) if !s.is_empty() => Ok(s),
        // MongoDB's `CommandHelpers::parseNsCollectionRequired`: the
        // namespace `db.` is not valid.
        Some(Bson::String(_)) => Err(CommandError::new(
            73,
            "InvalidNamespace",
            format!(
                "Invalid namespace specified '{}.'",
                cmd.get_str("$db").unwrap_or_default()
            ),
        )),
        Some(other) => Err(CommandError::new(
            73,
            "InvalidNamespace",
            format!(
                "collection name has invalid type {}",
                duetdb::raw::type_name(other)
            ),
        )),
        None => Err(CommandError::bad_value("missing collection name")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bson::doc;

    #[test]
    fn typed_fields() {
        let d = doc! {"s": "x", "n": 3.0, "b": 1, "bad": "y", "neg": -1};
        assert_eq!(opt_str(&d, "s").expect("s"), Some("x"));
        assert_eq!(opt_i64(&d, "n").expect("n"), Some(3));
        assert!(flag(&d, "b").expect("b"));
        assert_eq!(opt_i64(&d, "bad").expect_err("bad").code, 14);
        assert!(opt_count(&d, "neg").is_err());
        assert_eq!(opt_count(&d, "missing").expect("none"), None);
    }

    #[test]
    fn safe_int64_fields_truncate_and_clamp_as_mongodb_does() {
        let d = doc! {
            "frac": 2.7, "small_neg": -0.5, "neg": -2.5, "huge": 1e30, "nan": f64::NAN,
            "dec": bson::Decimal128::from_bytes([0; 16]), "s": "3",
        };
        assert_eq!(opt_count(&d, "frac").expect("frac"), Some(2));
        // -0.5 truncates to 0, which the `>= 0` validator accepts.
        assert_eq!(opt_count(&d, "small_neg").expect("small_neg"), Some(0));
        assert_eq!(opt_count(&d, "neg").expect_err("neg").code, 51024);
        assert_eq!(opt_count(&d, "huge").expect("huge"), Some(i64::MAX as u64));
        assert_eq!(opt_count(&d, "nan").expect("nan"), Some(0));
        assert_eq!(opt_safe_i64(&d, "neg").expect("neg"), Some(-2));
        assert_eq!(opt_safe_i64(&d, "dec").expect("dec"), Some(0));
        assert_eq!(opt_safe_i64(&d, "s").expect_err("s").code, 14);
    }
}
