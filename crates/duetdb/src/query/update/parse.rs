//! Parsing an update document into its typed form ([`Kind`]): operator names,
//! argument shapes, paths, and the error each malformed input gets.
//!
//! Invariants:
//! - every error in the update itself is found here, before anything is applied;
//!   a parsed update can then fail only on what it finds in the document
//!   (types, overflow, blocked paths, `_id`, depth);
//! - no two target paths conflict (one equal to or a prefix of another, `$rename`
//!   sources included; code 40), so the operators commute;
//! - operators come out sorted by path ([`cmp_paths`]), the order they apply in;
//! - error codes follow MongoDB: 2 (BadValue) for shapes, 14 (TypeMismatch) for
//!   non-numeric `$inc`/`$mul` arguments and a non-array `$addToSet` `$each`.

use std::cmp::Ordering;

use bson::{Bson, Document};

use crate::doc::path::{self, numeric_component};
use crate::doc::types::type_name;
use crate::doc::MAX_DEPTH;
use crate::error::{render, Error, Result};
use crate::query::sort::SortSpec;

use super::apply::too_deep_doc;
use super::arithmetic::{decimal_unsupported, is_num};
use super::{ElemCond, FieldOp, Kind, Op, PushArgs, PushSort};

/// An update document: all keys `$`-prefixed (operators) or none (replacement).
pub(super) fn kind(spec: &Document) -> Result<Kind> {
    let dollar = spec.keys().filter(|k| k.starts_with('$')).count();
    if dollar == 0 {
        crate::doc::check_single_id(spec)?;
        if too_deep_doc(spec, 1) {
            return Err(Error::NestingTooDeep { limit: MAX_DEPTH });
        }
        return Ok(Kind::Replacement(spec.clone()));
    }
    if dollar != spec.len() {
        let plain = spec.keys().find(|k| !k.starts_with('$')).cloned();
        return Err(Error::bad_value(format!(
            "Unknown modifier: {}. Expected a valid update modifier or pipeline-style \
             update specified as an array (operators and plain fields cannot be mixed)",
            plain.unwrap_or_default()
        )));
    }
    let mut ops = Vec::new();
    for (name, arg) in spec {
        let Bson::Document(fields) = arg else {
            return Err(Error::bad_value(format!(
                "Modifiers operate on fields but we found type {} instead. For example: \
                 {{$mod: {{<field>: ...}}}} not {{{name}: {}}}",
                type_name(arg),
                render(arg)
            )));
        };
        for (field, v) in fields {
            let op = parse_op(name, field, v)?;
            let path = match &op {
                Op::Rename { to, .. } => to.clone(),
                _ => parse_path(field)?,
            };
            ops.push(FieldOp { path, op });
        }
    }
    check_conflicts(&ops)?;
    ops.sort_by(|a, b| cmp_paths(&a.path, &b.path));
    Ok(Kind::Operators(ops))
}

/// Split and check an update path: no empty components, no positional (`$`,
/// `$[…]`) or other `$`-prefixed components, bounded length (code 2).
pub(super) fn parse_path(field: &str) -> Result<Vec<String>> {
    if field.is_empty() {
        return Err(Error::bad_value("An empty update path is not valid."));
    }
    path::validate(field).map_err(|e| {
        Error::bad_value(format!(
            "The update path '{field}' contains an empty field name or is too long: {e}"
        ))
    })?;
    let parts: Vec<String> = field.split('.').map(str::to_string).collect();
    for p in &parts {
        if p == "$" || p.starts_with("$[") {
            return Err(Error::bad_value(format!(
                "positional update operators ('{p}' in '{field}') are not supported"
            )));
        }
        if p.starts_with('$') {
            return Err(Error::bad_value(format!(
                "The dollar ($) prefixed field '{p}' in '{field}' is not valid for storage."
            )));
        }
    }
    Ok(parts)
}

/// One operator's argument for one field (`name: {field: v}`).
fn parse_op(name: &str, field: &str, v: &Bson) -> Result<Op> {
    Ok(match name {
        "$set" => Op::Set(v.clone()),
        "$setOnInsert" => Op::SetOnInsert(v.clone()),
        "$unset" => Op::Unset,
        "$inc" | "$mul" => parse_inc_mul(name, field, v)?,
        "$min" => Op::Min(v.clone()),
        "$max" => Op::Max(v.clone()),
        "$rename" => parse_rename(field, v)?,
        "$push" => Op::Push(parse_push(field, v)?),
        "$addToSet" => Op::AddToSet(parse_add_to_set(v)?),
        "$pop" => match as_integral(v) {
            Some(1) => Op::Pop(false),
            Some(-1) => Op::Pop(true),
            _ => {
                return Err(Error::bad_value(format!(
                    "$pop expects 1 or -1, found: {}",
                    render(v)
                )))
            }
        },
        "$pull" => Op::Pull(ElemCond::parse(v)?),
        "$pullAll" => match v {
            Bson::Array(a) => Op::PullAll(a.clone()),
            other => {
                return Err(Error::bad_value(format!(
                    "$pullAll requires an array argument but was given a {}",
                    type_name(other)
                )))
            }
        },
        "$currentDate" => parse_current_date(v)?,
        other => return Err(Error::bad_value(format!("Unknown modifier: {other}"))),
    })
}

/// `$inc` / `$mul`: a number (code 14 otherwise); Decimal128 is refused because
/// the engine has no decimal arithmetic.
fn parse_inc_mul(name: &str, field: &str, v: &Bson) -> Result<Op> {
    if !is_num(v) {
        let verb = if name == "$inc" {
            "increment"
        } else {
            "multiply"
        };
        return Err(Error::type_mismatch(format!(
            "Cannot {verb} with non-numeric argument: {{{field}: {}}}",
            render(v)
        )));
    }
    if matches!(v, Bson::Decimal128(_)) {
        return Err(decimal_unsupported(name));
    }
    Ok(if name == "$inc" {
        Op::Inc(v.clone())
    } else {
        Op::Mul(v.clone())
    })
}

/// `$rename: {from: "to"}`: two distinct paths, neither a prefix of the other.
fn parse_rename(field: &str, v: &Bson) -> Result<Op> {
    let Bson::String(to) = v else {
        return Err(Error::bad_value(format!(
            "The 'to' field for $rename must be a string: {field}: {}",
            render(v)
        )));
    };
    // The FieldOp path is the destination; the key is the source.
    let from = parse_path(field)?;
    let dest = parse_path(to)?;
    if from == dest {
        return Err(Error::bad_value(format!(
            "The source and target field for $rename must differ: {field}: \"{to}\""
        )));
    }
    if from.starts_with(&dest) || dest.starts_with(&from) {
        return Err(Error::bad_value(format!(
            "The source and target field for $rename must not be on the same path: \
             {field}: \"{to}\""
        )));
    }
    Ok(Op::Rename { from, to: dest })
}

/// `$addToSet`'s values: one value, or the elements of `{$each: [...]}` (no other
/// modifier is allowed beside it).
fn parse_add_to_set(v: &Bson) -> Result<Vec<Bson>> {
    Ok(match v {
        Bson::Document(d) if d.contains_key("$each") => {
            if d.len() != 1 {
                return Err(Error::bad_value(format!(
                    "Found unexpected fields after $each in $addToSet: {}",
                    render(v)
                )));
            }
            match d.get("$each") {
                Some(Bson::Array(a)) => a.clone(),
                other => {
                    return Err(Error::type_mismatch(format!(
                        "The argument to $each in $addToSet must be an array but it \
                         was of type {}",
                        other.map(type_name).unwrap_or("missing")
                    )))
                }
            }
        }
        other => vec![other.clone()],
    })
}

/// `$currentDate`: `true` (a date) or `{$type: "date" | "timestamp"}`.
fn parse_current_date(v: &Bson) -> Result<Op> {
    Ok(match v {
        Bson::Boolean(_) => Op::CurrentDate(false),
        Bson::Document(d) if d.len() == 1 => match d.get("$type") {
            Some(Bson::String(t)) if t == "date" => Op::CurrentDate(false),
            Some(Bson::String(t)) if t == "timestamp" => Op::CurrentDate(true),
            _ => {
                return Err(Error::bad_value(
                    "The '$type' string field is required to be 'date' or 'timestamp': \
                     {$currentDate: {field : {$type: 'date'}}}",
                ))
            }
        },
        other => {
            return Err(Error::bad_value(format!(
                "{} is not valid type for $currentDate. Please use a boolean ('true') or \
                 a $type expression ({{$type: 'timestamp/date'}}).",
                type_name(other)
            )))
        }
    })
}

/// `$push`'s argument: a value, or `{$each: [...]}` with optional `$position`,
/// `$slice` and `$sort` modifiers (a document without `$each` is pushed as it is).
fn parse_push(field: &str, v: &Bson) -> Result<PushArgs> {
    let Bson::Document(d) = v else {
        return Ok(PushArgs {
            each: vec![v.clone()],
            position: None,
            slice: None,
            sort: None,
        });
    };
    if !d.contains_key("$each") {
        // A plain document is pushed as it is.
        return Ok(PushArgs {
            each: vec![v.clone()],
            position: None,
            slice: None,
            sort: None,
        });
    }
    let mut args = PushArgs {
        each: Vec::new(),
        position: None,
        slice: None,
        sort: None,
    };
    for (k, m) in d {
        match k.as_str() {
            "$each" => match m {
                Bson::Array(a) => args.each = a.clone(),
                other => {
                    return Err(Error::bad_value(format!(
                        "The argument to $each in $push must be an array but it was of type: {}",
                        type_name(other)
                    )))
                }
            },
            "$slice" => {
                args.slice = Some(as_integral(m).ok_or_else(|| {
                    Error::bad_value(format!(
                        "The value for $slice must be an integer value but was given type: {}",
                        type_name(m)
                    ))
                })?)
            }
            "$position" => {
                args.position = Some(as_integral(m).ok_or_else(|| {
                    Error::bad_value(format!(
                        "The value for $position must be an integer value, not of type: {}",
                        type_name(m)
                    ))
                })?)
            }
            "$sort" => {
                args.sort = Some(match m {
                    Bson::Document(pattern) => {
                        if pattern.is_empty() {
                            return Err(Error::bad_value(
                                "The $sort pattern is empty when it should be a set of fields.",
                            ));
                        }
                        PushSort::Pattern(SortSpec::parse(pattern)?)
                    }
                    other => match as_integral(other) {
                        Some(1) => PushSort::Whole(true),
                        Some(-1) => PushSort::Whole(false),
                        _ => {
                            return Err(Error::bad_value(format!(
                                "The $sort is invalid: use 1/-1 to sort the whole element, or \
                                 {{field:1/-1}} to sort embedded fields (in $push to '{field}')"
                            )))
                        }
                    },
                });
            }
            other => {
                return Err(Error::bad_value(format!(
                    "Unrecognized clause in $push: {other}"
                )))
            }
        }
    }
    Ok(args)
}

/// Reject two paths where one equals or is a prefix of the other (code 40).
fn check_conflicts(ops: &[FieldOp]) -> Result<()> {
    let mut all: Vec<&Vec<String>> = Vec::with_capacity(ops.len());
    for op in ops {
        all.push(&op.path);
        if let Op::Rename { from, .. } = &op.op {
            all.push(from);
        }
    }
    // In component-wise lexicographic order a path is directly followed by one of
    // its extensions if it has any, so checking neighbours finds every conflict.
    all.sort();
    for w in all.windows(2) {
        if w[1].starts_with(w[0]) {
            return Err(Error::ConflictingUpdateOperators(format!(
                "Updating the path '{}' would create a conflict at '{}'",
                w[1].join("."),
                w[0].join(".")
            )));
        }
    }
    Ok(())
}

/// MongoDB 5.0+ order of application: numeric names numerically, others bytewise.
pub(super) fn cmp_paths(a: &[String], b: &[String]) -> Ordering {
    for (x, y) in a.iter().zip(b.iter()) {
        let ord = match (numeric_component(x), numeric_component(y)) {
            (Some(i), Some(j)) => i.cmp(&j),
            _ => x.as_bytes().cmp(y.as_bytes()),
        };
        if ord != Ordering::Equal {
            return ord;
        }
    }
    a.len().cmp(&b.len())
}

/// An integral number as i64 (int32, int64, or a double with no fraction).
fn as_integral(v: &Bson) -> Option<i64> {
    match v {
        Bson::Int32(i) => Some(i64::from(*i)),
        Bson::Int64(i) => Some(*i),
        Bson::Double(f) if f.fract() == 0.0 && f.abs() < 9.0e18 => Some(*f as i64),
        _ => None,
    }
}
