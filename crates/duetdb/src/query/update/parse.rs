//! Parsing an update document into its typed form ([`Kind`]): operator names,
//! argument shapes, paths (with positional `$`, `$[]` and `$[<identifier>]`
//! components), and the error each malformed input gets.
//!
//! Invariants:
//! - every error in the update itself is found here, before anything is applied;
//!   a parsed update can then fail only on what it finds in the document
//!   (types, overflow, blocked paths, array updates on missing or non-array
//!   fields, two array updates meeting on one element, `_id`, depth);
//! - no two target paths conflict as MongoDB's update tree sees them (`$rename`
//!   sources included; code 40, with MongoDB's message naming the later path):
//!   static paths never overlap, so the static operators commute;
//! - every `$[<identifier>]` has an array filter and every array filter is
//!   used (2 and 9), checked in MongoDB's order;
//! - operators come out sorted by path ([`cmp_paths`]), the order they apply in;
//! - error codes follow MongoDB: 9 (FailedToParse) for an unknown operator or a
//!   non-document operator argument, 2 (BadValue) for shapes, 14
//!   (TypeMismatch) for non-numeric `$inc`/`$mul` arguments and a non-array
//!   `$addToSet` `$each`, 56 (EmptyFieldName) for empty path components.

use std::cmp::Ordering;

use bson::{Bson, Document};

use crate::doc::path::{self, numeric_component};
use crate::doc::types::type_name;
use crate::doc::MAX_DEPTH;
use crate::error::{render, render_shell, render_shell_doc, Error, Result};
use crate::query::sort::SortSpec;

use super::apply::too_deep_doc;
use super::arithmetic::is_num;
use super::conflict::Trie;
use super::positional::{array_filter_ident, ArrayFilters};
use super::{BitOp, ElemCond, FieldOp, Kind, Op, PushArgs, PushSort};

/// The update operators MongoDB 7.0 knows.
const OPERATORS: &[&str] = &[
    "$set",
    "$setOnInsert",
    "$unset",
    "$inc",
    "$mul",
    "$min",
    "$max",
    "$rename",
    "$push",
    "$addToSet",
    "$pop",
    "$pull",
    "$pullAll",
    "$currentDate",
    "$bit",
];

/// An update document. Its first key decides, as in MongoDB: `$`-prefixed
/// means operators (then every key must be a known operator, code 9),
/// anything else a replacement (whose top-level fields may not start with
/// `$`, code 52). `filters` are the statement's `arrayFilters`; each must be
/// used by some `$[<identifier>]` (code 9).
pub(super) fn kind(spec: &Document, filters: &ArrayFilters) -> Result<Kind> {
    let operators = spec.keys().next().is_some_and(|k| k.starts_with('$'));
    if !operators {
        if let Some(k) = spec.keys().find(|k| k.starts_with('$')) {
            return Err(Error::Coded {
                code: 52,
                name: "DollarPrefixedFieldName",
                msg: format!(
                    "The dollar ($) prefixed field '{k}' in '{k}' is not allowed in the context \
                     of an update's replacement document. Consider using an aggregation \
                     pipeline with $replaceWith."
                ),
            });
        }
        crate::doc::check_single_id(spec)?;
        if too_deep_doc(spec, 1) {
            return Err(Error::NestingTooDeep { limit: MAX_DEPTH });
        }
        return Ok(Kind::Replacement(spec.clone()));
    }
    let mut ops = Vec::new();
    let mut trie = Trie::default();
    let mut used = std::collections::BTreeSet::new();
    for (name, arg) in spec {
        if !OPERATORS.contains(&name.as_str()) {
            return Err(failed_to_parse(format!(
                "Unknown modifier: {name}. Expected a valid update modifier or pipeline-style \
                 update specified as an array"
            )));
        }
        let Bson::Document(fields) = arg else {
            return Err(failed_to_parse(format!(
                "Modifiers operate on fields but we found type {} instead. For example: \
                 {{$mod: {{<field>: ...}}}} not {{{name}: {}}}",
                type_name(arg),
                render_shell(arg)
            )));
        };
        for (field, v) in fields {
            let fop = if name == "$rename" {
                parse_rename(field, v, &mut trie, filters, &mut used)?
            } else {
                let path = parse_update_path(field)?;
                let op = parse_op(name, field, v)?;
                trie.insert(&path, filters, &mut used)?;
                FieldOp { path, op }
            };
            ops.push(fop);
        }
    }
    if let Some(id) = filters.names().find(|id| !used.contains(*id)) {
        return Err(failed_to_parse(format!(
            "The array filter for identifier '{id}' was not used in the update {}",
            render_shell_doc(spec)
        )));
    }
    ops.sort_by(|a, b| cmp_paths(&a.path, &b.path));
    Ok(Kind::Operators(ops))
}

pub(super) fn failed_to_parse(msg: impl Into<String>) -> Error {
    Error::Coded {
        code: 9,
        name: "FailedToParse",
        msg: msg.into(),
    }
}

/// Split and check an update path (MongoDB's `fieldchecker`): no empty
/// components (56 EmptyFieldName), at most one positional `$`, and neither
/// `$` nor `$[…]` first (2); other `$`-prefixed components are refused (2);
/// at most [`path::MAX_PATH_COMPONENTS`] components.
pub(super) fn parse_update_path(field: &str) -> Result<Vec<String>> {
    if field.is_empty() {
        return Err(empty_field("An empty update path is not valid."));
    }
    if field.split('.').any(str::is_empty) {
        return Err(empty_field(format!(
            "The update path '{field}' contains an empty field name, which is not allowed."
        )));
    }
    path::validate(field)
        .map_err(|e| Error::bad_value(format!("The update path '{field}' is too long: {e}")))?;
    let parts: Vec<String> = field.split('.').map(str::to_string).collect();
    let positional = parts.iter().filter(|p| *p == "$").count();
    if positional > 1 {
        return Err(Error::bad_value(format!(
            "Too many positional (i.e. '$') elements found in path '{field}'"
        )));
    }
    if parts.first().is_some_and(|p| p == "$") {
        return Err(Error::bad_value(format!(
            "Cannot have positional (i.e. '$') element in the first position in path '{field}'"
        )));
    }
    for p in &parts {
        if p.starts_with('$') && p != "$" && array_filter_ident(p).is_none() {
            return Err(Error::bad_value(format!(
                "The dollar ($) prefixed field '{p}' in '{field}' is not valid for storage."
            )));
        }
    }
    Ok(parts)
}

/// A path naming stored fields only (no positional components): an upsert
/// seed's filter paths.
pub(super) fn parse_path(field: &str) -> Result<Vec<String>> {
    let parts = parse_update_path(field)?;
    if parts.iter().any(|p| is_dynamic(p)) {
        return Err(Error::bad_value(format!(
            "cannot infer query fields to set, path '{field}' is positional"
        )));
    }
    Ok(parts)
}

/// `$` or `$[…]`: a component resolved per document.
pub(super) fn is_dynamic(part: &str) -> bool {
    part == "$" || array_filter_ident(part).is_some()
}

fn empty_field(msg: impl Into<String>) -> Error {
    Error::Coded {
        code: 56,
        name: "EmptyFieldName",
        msg: msg.into(),
    }
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
        "$push" => Op::Push(parse_push(field, v)?),
        "$addToSet" => Op::AddToSet(parse_add_to_set(v)?),
        "$pop" => match as_integral(v) {
            Some(1) => Op::Pop(false),
            Some(-1) => Op::Pop(true),
            _ => {
                // MongoDB's `PopNode::init`: FailedToParse.
                return Err(Error::Coded {
                    code: 9,
                    name: "FailedToParse",
                    msg: format!("$pop expects 1 or -1, found: {}", render(v)),
                });
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
        "$bit" => Op::Bit(parse_bit(v)?),
        other => return Err(failed_to_parse(format!("Unknown modifier: {other}"))),
    })
}

/// `$inc` / `$mul`: a number (code 14 otherwise).
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
    Ok(if name == "$inc" {
        Op::Inc(v.clone())
    } else {
        Op::Mul(v.clone())
    })
}

/// `$rename: {from: "to"}`, in MongoDB's order of checks: the source path
/// (entered in the conflict trie), a string destination, the destination
/// path, then two distinct static paths neither a prefix of the other.
fn parse_rename(
    field: &str,
    v: &Bson,
    trie: &mut Trie,
    filters: &ArrayFilters,
    used: &mut std::collections::BTreeSet<String>,
) -> Result<FieldOp> {
    let from = parse_update_path(field)?;
    trie.insert(&from, filters, used)?;
    let Bson::String(to) = v else {
        return Err(Error::bad_value(format!(
            "The 'to' field for $rename must be a string: {field}: {}",
            render_shell(v)
        )));
    };
    // The FieldOp path is the destination; the key is the source.
    let dest = parse_update_path(to)?;
    if to.contains('\0') {
        return Err(Error::bad_value(
            "The 'to' field for $rename cannot contain an embedded null byte",
        ));
    }
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
    if from.iter().any(|p| is_dynamic(p)) {
        return Err(Error::bad_value(format!(
            "The source field for $rename may not be dynamic: {field}"
        )));
    }
    if dest.iter().any(|p| is_dynamic(p)) {
        return Err(Error::bad_value(format!(
            "The destination field for $rename may not be dynamic: {to}"
        )));
    }
    trie.insert(&dest, filters, used)?;
    Ok(FieldOp {
        path: dest,
        op: Op::Rename { from },
    })
}

/// `$bit: {field: {and|or|xor: <int32|int64>, …}}` (MongoDB's `BitNode::init`).
fn parse_bit(v: &Bson) -> Result<Vec<(BitOp, Bson)>> {
    let Bson::Document(d) = v else {
        return Err(Error::bad_value(format!(
            "The $bit modifier is not compatible with a {}. You must pass in an embedded \
             document: {{$bit: {{field: {{and/or/xor: #}}}}",
            type_name(v)
        )));
    };
    let mut out = Vec::with_capacity(d.len());
    for (k, operand) in d {
        let op = match k.as_str() {
            "and" => BitOp::And,
            "or" => BitOp::Or,
            "xor" => BitOp::Xor,
            other => {
                return Err(Error::bad_value(format!(
                    "The $bit modifier only supports 'and', 'or', and 'xor', not '{other}' which \
                     is an unknown operator: {{{k}: {}}}",
                    render_shell(operand)
                )))
            }
        };
        if !matches!(operand, Bson::Int32(_) | Bson::Int64(_)) {
            return Err(Error::bad_value(format!(
                "The $bit modifier field must be an Integer(32/64 bit); a '{}' is not supported \
                 here: {{{k}: {}}}",
                type_name(operand),
                render_shell(operand)
            )));
        }
        out.push((op, operand.clone()));
    }
    if out.is_empty() {
        return Err(Error::bad_value(
            "You must pass in at least one bitwise operation. The format is: \
             {$bit: {field: {and/or/xor: #}}",
        ));
    }
    Ok(out)
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
