//! Object operators: `$mergeObjects`, `$getField`, `$setField`,
//! `$unsetField`, `$bsonSize`, `$binarySize`, and the timestamp parts
//! `$tsSecond`, `$tsIncrement`.
//!
//! Invariants: field names given to `$getField`/`$setField`/`$unsetField` are
//! taken literally (dots and `$` are part of the name, never a path); a null
//! or missing input gives null (`$getField`: missing for a non-document), and
//! `$mergeObjects` skips null and missing arguments; merged and set documents
//! are checked against the size limit (10334).

use bson::{Bson, Document};

use crate::doc::size::check_document;
use crate::error::{Error, Result};
use crate::query::expr::eval::{null, Args};
use crate::query::expr::{is_nullish, type_name, Named, Op, Value};

/// Apply an object operator to its evaluated arguments.
pub(super) fn apply(op: Op, vals: Vec<Value>) -> Result<Value> {
    match op {
        Op::MergeObjects => {
            let mut out = Document::new();
            for v in vals {
                if is_nullish(&v) {
                    continue;
                }
                let Some(Bson::Document(d)) = v else {
                    return Err(loc!(
                        40400,
                        "$mergeObjects requires object inputs, but input {} is of type {}",
                        crate::error::render(v.as_ref().unwrap_or(&Bson::Null)),
                        type_name(&v)
                    ));
                };
                merge_into(&mut out, d);
            }
            check_document("$mergeObjects", &out)?;
            Ok(Some(Bson::Document(out)))
        }
        Op::BsonSize => match vals.into_iter().next().flatten() {
            None | Some(Bson::Null) | Some(Bson::Undefined) => null(),
            Some(Bson::Document(d)) => Ok(Some(Bson::Int32(
                i32::try_from(crate::doc::size::document_len(&d)).unwrap_or(i32::MAX),
            ))),
            other => Err(loc!(
                31393,
                "$bsonSize requires a document input, found: {}",
                type_name(&other)
            )),
        },
        Op::BinarySize => match vals.into_iter().next().flatten() {
            None | Some(Bson::Null) | Some(Bson::Undefined) => null(),
            Some(Bson::String(s)) => Ok(Some(Bson::Int32(
                i32::try_from(s.len()).unwrap_or(i32::MAX),
            ))),
            Some(Bson::Binary(b)) => Ok(Some(Bson::Int32(
                i32::try_from(b.bytes.len()).unwrap_or(i32::MAX),
            ))),
            other => Err(loc!(
                51276,
                "$binarySize requires a string or BinData argument, found: {}",
                type_name(&other)
            )),
        },
        Op::TsSecond | Op::TsIncrement => match vals.into_iter().next().flatten() {
            None | Some(Bson::Null) | Some(Bson::Undefined) => null(),
            Some(Bson::Timestamp(t)) => Ok(Some(Bson::Int64(i64::from(if op == Op::TsSecond {
                t.time
            } else {
                t.increment
            })))),
            other => Err(loc!(
                5687301,
                "Argument to {} must be a timestamp, but is {}",
                op.name(),
                type_name(&other)
            )),
        },
        other => Err(Error::Internal(format!(
            "{} is not an object operator",
            other.name()
        ))),
    }
}

/// Merge `d` into `out`: later values win, a field keeps its first position.
pub(crate) fn merge_into(out: &mut Document, d: Document) {
    for (k, v) in d {
        out.insert(k, v);
    }
}

/// Evaluate `$getField` / `$setField` / `$unsetField`.
pub(super) fn named(a: &Args<'_, '_>) -> Result<Value> {
    let field = a.get("field")?;
    let Some(Bson::String(field)) = field else {
        return Err(loc!(
            3041704,
            "{} requires 'field' to evaluate to type String, but got {}",
            a.name(),
            type_name(&field)
        ));
    };
    let input = a.get("input")?;
    if a.n == Named::GetField {
        return Ok(match input {
            Some(Bson::Document(d)) => d.get(&field).cloned(),
            v if is_nullish(&v) => Some(Bson::Null),
            _ => None,
        });
    }
    if is_nullish(&input) {
        return null();
    }
    let Some(Bson::Document(mut d)) = input else {
        return Err(loc!(
            4161105,
            "{} requires 'input' to evaluate to type Object",
            a.name()
        ));
    };
    let value = if a.n == Named::SetField {
        a.get("value")?
    } else {
        None
    };
    match value {
        Some(v) => {
            d.insert(field, v);
        }
        None => {
            d.remove(&field);
        }
    }
    check_document(a.name(), &d)?;
    Ok(Some(Bson::Document(d)))
}
