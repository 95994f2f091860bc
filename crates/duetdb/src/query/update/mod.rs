//! Update documents: MongoDB's update operators and replacement updates.
//!
//! Owns: parsing an update (`{$set: …}` or a replacement document), applying it to
//! one document, the seed document of an upsert, and the set of paths an update
//! may touch (so the engine can skip index maintenance).
//!
//! Invariants:
//! - `apply` never mutates its input; it returns the new version or an error, so a
//!   failed update leaves nothing half-applied.
//! - Parsing rejects conflicting paths (one path equal to or a prefix of another,
//!   across all operators, `$rename` sources included) with code 40, so the
//!   operators of one update commute and may be applied one after another.
//! - Operators are applied in path order (numeric components numerically, others
//!   bytewise), as MongoDB 5.0+ does; existing fields keep their position and new
//!   fields are appended in that order.
//! - `_id` never changes once the input has one (code 66) and stays the first field.
//! - Values are compared only through [`crate::doc::value`] (`$min`, `$max`,
//!   `$addToSet`, `$pull`), so updates agree with filters and indexes.
//! - Results nest at most [`MAX_DEPTH`] levels; paths have at most
//!   [`path::MAX_PATH_COMPONENTS`] components. No input makes this module panic.

use std::cmp::Ordering;

use bson::{Bson, DateTime, Document, RawDocumentBuf, Timestamp};

use crate::doc::path::{self, numeric_component};
use crate::doc::value;
use crate::error::{render, Error, Result};
use crate::query::filter::Filter;
use crate::query::sort::SortSpec;

use crate::doc::types::type_name;
use crate::doc::MAX_DEPTH;

/// Inputs of one update application besides the document.
#[derive(Debug, Clone, Copy)]
pub struct ApplyContext {
    /// True when the update produces a new document through upsert (enables `$setOnInsert`).
    pub is_upsert_insert: bool,
    /// The time `$currentDate` writes.
    pub now: DateTime,
}

/// A parsed update: operators (`{$set: …}`) or a replacement document.
#[derive(Debug, Clone)]
pub struct UpdateSpec {
    kind: Kind,
}

#[derive(Debug, Clone)]
enum Kind {
    Replacement(Document),
    /// Sorted by target path (see [`cmp_paths`]).
    Operators(Vec<FieldOp>),
}

/// One operator applied to one path.
#[derive(Debug, Clone)]
struct FieldOp {
    path: Vec<String>,
    op: Op,
}

#[derive(Debug, Clone)]
enum Op {
    Set(Bson),
    SetOnInsert(Bson),
    Unset,
    Inc(Bson),
    Mul(Bson),
    Min(Bson),
    Max(Bson),
    /// `path` of the [`FieldOp`] is the destination.
    Rename {
        from: Vec<String>,
        to: Vec<String>,
    },
    Push(PushArgs),
    AddToSet(Vec<Bson>),
    /// `true`: remove the first element (`-1`); `false`: the last (`1`).
    Pop(bool),
    Pull(ElemCond),
    PullAll(Vec<Bson>),
    /// `true` for a timestamp, `false` for a date.
    CurrentDate(bool),
}

#[derive(Debug, Clone)]
struct PushArgs {
    each: Vec<Bson>,
    position: Option<i64>,
    slice: Option<i64>,
    sort: Option<PushSort>,
}

#[derive(Debug, Clone)]
enum PushSort {
    /// Whole elements, ascending when true.
    Whole(bool),
    /// Elements are documents sorted by a pattern.
    Pattern(SortSpec),
}

/// What an operator does at its path, decided from the current value there.
enum Action {
    Keep,
    Set(Bson),
    Remove,
}

impl UpdateSpec {
    /// Parse an update document: all keys `$`-prefixed (operators) or none (replacement).
    pub fn parse(spec: &Document) -> Result<UpdateSpec> {
        let dollar = spec.keys().filter(|k| k.starts_with('$')).count();
        if dollar == 0 {
            if too_deep_doc(spec, 1) {
                return Err(Error::NestingTooDeep { limit: MAX_DEPTH });
            }
            return Ok(UpdateSpec {
                kind: Kind::Replacement(spec.clone()),
            });
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
        Ok(UpdateSpec {
            kind: Kind::Operators(ops),
        })
    }

    /// A replacement document (no operators)?
    pub fn is_replacement(&self) -> bool {
        matches!(self.kind, Kind::Replacement(_))
    }

    /// The new version of `doc`.
    pub fn apply(&self, doc: &Document, ctx: &ApplyContext) -> Result<Document> {
        let mut out = match &self.kind {
            Kind::Replacement(repl) => apply_replacement(repl, doc)?,
            Kind::Operators(ops) => {
                let mut out = doc.clone();
                for op in ops {
                    apply_op(op, &mut out, doc, ctx)?;
                }
                check_id_unchanged(doc, &out)?;
                out
            }
        };
        id_first(&mut out);
        if too_deep_doc(&out, 1) {
            return Err(Error::NestingTooDeep { limit: MAX_DEPTH });
        }
        Ok(out)
    }

    /// The top-level-rooted paths this update may change. Paths are cut before their
    /// first numeric component (`a.0.b` → `a`) because such a change is seen by
    /// index paths like `a.b`. A replacement returns `[""]`: the root, which is a
    /// prefix of every path. Use [`UpdateSpec::may_affect`] to test an index path.
    pub fn modified_paths(&self) -> Vec<String> {
        let Kind::Operators(ops) = &self.kind else {
            return vec![String::new()];
        };
        let mut out: Vec<String> = Vec::new();
        let mut add = |p: &[String]| {
            let s = cut_at_numeric(p).join(".");
            if !out.contains(&s) {
                out.push(s);
            }
        };
        for op in ops {
            add(&op.path);
            if let Op::Rename { from, .. } = &op.op {
                add(from);
            }
        }
        out
    }

    /// Can this update change the values reached by `index_path` (a dotted path)?
    /// Conservative: true whenever a modified path and `index_path` overlap.
    pub fn may_affect(&self, index_path: &str) -> bool {
        let ip: Vec<String> = index_path.split('.').map(str::to_string).collect();
        let ip = cut_at_numeric(&ip);
        self.modified_paths().iter().any(|m| {
            if m.is_empty() {
                return true;
            }
            let mp: Vec<&str> = m.split('.').collect();
            mp.iter().zip(ip.iter()).all(|(a, b)| *a == b.as_str())
        })
    }
}

/// The document an upsert starts from: the equality fields of `filter` (top level
/// and inside a top-level `$and`), dotted paths expanded, `_id` first.
pub fn upsert_seed(filter: &Document) -> Result<Document> {
    let mut eqs: Vec<(Vec<String>, Bson)> = Vec::new();
    collect_equalities(filter, &mut eqs, 1)?;
    let mut paths: Vec<&Vec<String>> = eqs.iter().map(|(p, _)| p).collect();
    paths.sort();
    for w in paths.windows(2) {
        let (a, b) = (w[0], w[1]);
        if a == b {
            return Err(Error::bad_value(format!(
                "cannot infer query fields to set, path '{}' is matched twice",
                a.join(".")
            )));
        }
        if b.starts_with(a) {
            return Err(Error::bad_value(format!(
                "cannot infer query fields to set, both paths '{}' and '{}' are matched",
                b.join("."),
                a.join(".")
            )));
        }
    }
    eqs.sort_by(|a, b| cmp_paths(&a.0, &b.0));
    let mut out = Document::new();
    for (p, v) in eqs {
        path::set_creating(&mut out, &p, v)?;
    }
    id_first(&mut out);
    if too_deep_doc(&out, 1) {
        return Err(Error::NestingTooDeep { limit: MAX_DEPTH });
    }
    Ok(out)
}

fn collect_equalities(
    filter: &Document,
    out: &mut Vec<(Vec<String>, Bson)>,
    depth: usize,
) -> Result<()> {
    if depth > MAX_DEPTH {
        return Err(Error::NestingTooDeep { limit: MAX_DEPTH });
    }
    for (k, v) in filter {
        if k == "$and" {
            if let Bson::Array(items) = v {
                for item in items {
                    if let Bson::Document(d) = item {
                        collect_equalities(d, out, depth + 1)?;
                    }
                }
            }
            continue;
        }
        // $or, $nor, $expr, …: no single value is implied.
        if k.starts_with('$') {
            continue;
        }
        let value = match v {
            Bson::Document(d) if d.keys().next().is_some_and(|f| f.starts_with('$')) => {
                if let Some(x) = d.get("$eq") {
                    Some(x.clone())
                } else {
                    // A one-value $in is an equality, as MongoDB rewrites it.
                    match d.get("$in") {
                        Some(Bson::Array(a)) if a.len() == 1 => match &a[0] {
                            Bson::RegularExpression(_) => None,
                            x => Some(x.clone()),
                        },
                        _ => None,
                    }
                }
            }
            // A regex is a pattern match, not an equality.
            Bson::RegularExpression(_) => None,
            other => Some(other.clone()),
        };
        if let Some(value) = value {
            let p = parse_path(k)?;
            out.push((p, value));
        }
    }
    Ok(())
}

// ---------------------------------------------------------------- parsing

fn parse_path(field: &str) -> Result<Vec<String>> {
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

fn parse_op(name: &str, field: &str, v: &Bson) -> Result<Op> {
    Ok(match name {
        "$set" => Op::Set(v.clone()),
        "$setOnInsert" => Op::SetOnInsert(v.clone()),
        "$unset" => Op::Unset,
        "$inc" | "$mul" => {
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
            if name == "$inc" {
                Op::Inc(v.clone())
            } else {
                Op::Mul(v.clone())
            }
        }
        "$min" => Op::Min(v.clone()),
        "$max" => Op::Max(v.clone()),
        "$rename" => {
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
            return Ok(Op::Rename { from, to: dest });
        }
        "$push" => Op::Push(parse_push(field, v)?),
        "$addToSet" => {
            let each = match v {
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
            };
            Op::AddToSet(each)
        }
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
        "$currentDate" => match v {
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
        },
        other => return Err(Error::bad_value(format!("Unknown modifier: {other}"))),
    })
}

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
fn cmp_paths(a: &[String], b: &[String]) -> Ordering {
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

fn cut_at_numeric(p: &[String]) -> &[String] {
    let end = p
        .iter()
        .enumerate()
        .skip(1)
        .find(|(_, c)| numeric_component(c).is_some())
        .map(|(i, _)| i)
        .unwrap_or(p.len());
    &p[..end]
}

// ---------------------------------------------------------------- applying

fn apply_replacement(repl: &Document, old: &Document) -> Result<Document> {
    let mut out = Document::new();
    match (old.get("_id"), repl.get("_id")) {
        (Some(old_id), Some(new_id)) if old_id != new_id => {
            return Err(Error::ImmutableField(format!(
                "After applying the update, the (immutable) field '_id' was found to have \
                 been altered to _id: {}",
                render(new_id)
            )));
        }
        (Some(old_id), None) => {
            // A replacement without _id keeps the old one.
            out.insert("_id", old_id.clone());
        }
        _ => {}
    }
    for (k, v) in repl {
        out.insert(k.clone(), v.clone());
    }
    Ok(out)
}

fn check_id_unchanged(old: &Document, new: &Document) -> Result<()> {
    if let Some(old_id) = old.get("_id") {
        if new.get("_id") != Some(old_id) {
            return Err(Error::ImmutableField(
                "Performing an update on the path '_id' would modify the immutable field '_id'"
                    .into(),
            ));
        }
    }
    Ok(())
}

fn id_first(doc: &mut Document) {
    if doc.keys().next().is_some_and(|k| k != "_id") {
        if let Some(id) = doc.remove("_id") {
            let mut out = Document::new();
            out.insert("_id", id);
            for (k, v) in std::mem::take(doc) {
                out.insert(k, v);
            }
            *doc = out;
        }
    }
}

fn apply_op(fop: &FieldOp, doc: &mut Document, orig: &Document, ctx: &ApplyContext) -> Result<()> {
    let path = &fop.path;
    let field = path.join(".");
    match &fop.op {
        Op::Rename { from, .. } => apply_rename(doc, from, path, orig),
        Op::SetOnInsert(_) if !ctx.is_upsert_insert => Ok(()),
        op => apply_at(doc, path, |cur| compute(op, cur, &field, orig, ctx)),
    }
}

/// Decide the action of a (non-rename) operator from the current value.
fn compute(
    op: &Op,
    cur: Option<&Bson>,
    field: &str,
    orig: &Document,
    ctx: &ApplyContext,
) -> Result<Action> {
    Ok(match op {
        Op::Set(v) | Op::SetOnInsert(v) => Action::Set(v.clone()),
        Op::Unset => match cur {
            Some(_) => Action::Remove,
            None => Action::Keep,
        },
        Op::Inc(arg) | Op::Mul(arg) => {
            let is_inc = matches!(op, Op::Inc(_));
            let name = if is_inc { "$inc" } else { "$mul" };
            match cur {
                None if is_inc => Action::Set(arg.clone()),
                None => Action::Set(match arg {
                    Bson::Int32(_) => Bson::Int32(0),
                    Bson::Int64(_) => Bson::Int64(0),
                    _ => Bson::Double(0.0),
                }),
                Some(c) if !is_num(c) => {
                    return Err(Error::type_mismatch(format!(
                        "Cannot apply {name} to a value of non-numeric type. {} has the field \
                         '{field}' of non-numeric type {}",
                        id_render(orig),
                        type_name(c)
                    )))
                }
                Some(c) => match arithmetic(c, arg, is_inc)? {
                    Some(v) => Action::Set(v),
                    None => {
                        return Err(Error::bad_value(format!(
                            "Failed to apply {name} operations to current value ({}: {}) for \
                             document {}: the result overflows a 64-bit integer",
                            type_name(c),
                            render(c),
                            id_render(orig)
                        )))
                    }
                },
            }
        }
        Op::Min(arg) | Op::Max(arg) => {
            let want = if matches!(op, Op::Min(_)) {
                Ordering::Less
            } else {
                Ordering::Greater
            };
            match cur {
                None => Action::Set(arg.clone()),
                Some(c) if value::compare_bson(arg, c) == want => Action::Set(arg.clone()),
                Some(_) => Action::Keep,
            }
        }
        Op::CurrentDate(ts) => Action::Set(if *ts {
            let millis = ctx.now.timestamp_millis();
            let secs = u32::try_from(millis.div_euclid(1000)).unwrap_or(0);
            Bson::Timestamp(Timestamp {
                time: secs,
                increment: 1,
            })
        } else {
            Bson::DateTime(ctx.now)
        }),
        Op::Push(args) => {
            let mut arr = match cur {
                None => Vec::new(),
                Some(Bson::Array(a)) => a.clone(),
                Some(other) => {
                    return Err(Error::bad_value(format!(
                        "The field '{field}' must be an array but is of type {} in document {}",
                        type_name(other),
                        id_render(orig)
                    )))
                }
            };
            push_into(&mut arr, args);
            Action::Set(Bson::Array(arr))
        }
        Op::AddToSet(each) => {
            let mut arr = match cur {
                None => Vec::new(),
                Some(Bson::Array(a)) => a.clone(),
                Some(other) => {
                    return Err(Error::bad_value(format!(
                        "Cannot apply $addToSet to non-array field. Field named '{field}' has \
                         non-array type {}",
                        type_name(other)
                    )))
                }
            };
            let before = arr.len();
            for v in each {
                if !arr.iter().any(|x| value::equal_bson(x, v)) {
                    arr.push(v.clone());
                }
            }
            if cur.is_some() && arr.len() == before {
                Action::Keep
            } else {
                Action::Set(Bson::Array(arr))
            }
        }
        Op::Pop(first) => match cur {
            None => Action::Keep,
            Some(Bson::Array(a)) if a.is_empty() => Action::Keep,
            Some(Bson::Array(a)) => {
                let mut a = a.clone();
                if *first {
                    a.remove(0);
                } else {
                    a.pop();
                }
                Action::Set(Bson::Array(a))
            }
            Some(other) => {
                return Err(Error::type_mismatch(format!(
                    "Path '{field}' contains an element of non-array type '{}'",
                    type_name(other)
                )))
            }
        },
        Op::Pull(_) | Op::PullAll(_) => match cur {
            None => Action::Keep,
            Some(Bson::Array(a)) => {
                let kept: Vec<Bson> = match op {
                    Op::Pull(cond) => a.iter().filter(|x| !cond.matches(x)).cloned().collect(),
                    Op::PullAll(vals) => a
                        .iter()
                        .filter(|x| !vals.iter().any(|v| exact_equal(x, v)))
                        .cloned()
                        .collect(),
                    _ => a.clone(),
                };
                if kept.len() == a.len() {
                    Action::Keep
                } else {
                    Action::Set(Bson::Array(kept))
                }
            }
            Some(_) => {
                return Err(Error::bad_value(
                    "Cannot apply $pull to a non-array value".to_string(),
                ))
            }
        },
        Op::Rename { .. } => Action::Keep,
    })
}

fn push_into(arr: &mut Vec<Bson>, args: &PushArgs) {
    let len = arr.len() as i64;
    let at = match args.position {
        None => len,
        Some(p) if p >= 0 => p.min(len),
        Some(p) => (len + p).max(0),
    };
    // `at` is within 0..=len, so the conversion and the splice cannot fail.
    let at = usize::try_from(at).unwrap_or(arr.len()).min(arr.len());
    arr.splice(at..at, args.each.iter().cloned());
    match &args.sort {
        None => {}
        Some(PushSort::Whole(asc)) => arr.sort_by(|a, b| {
            let ord = value::compare_bson(a, b);
            if *asc {
                ord
            } else {
                ord.reverse()
            }
        }),
        Some(PushSort::Pattern(spec)) => {
            // Elements that are not documents have every field missing.
            let empty = RawDocumentBuf::new();
            let mut keyed: Vec<(crate::query::sort::SortKey, Bson)> = arr
                .drain(..)
                .map(|e| {
                    let key = match &e {
                        Bson::Document(d) => match RawDocumentBuf::try_from(d) {
                            Ok(raw) => spec.sort_key(&raw),
                            Err(_) => spec.sort_key(&empty),
                        },
                        _ => spec.sort_key(&empty),
                    };
                    (key, e)
                })
                .collect();
            keyed.sort_by(|a, b| spec.compare_keys(&a.0, &b.0));
            arr.extend(keyed.into_iter().map(|(_, e)| e));
        }
    }
    if let Some(n) = args.slice {
        let len = arr.len();
        if n >= 0 {
            let keep = usize::try_from(n).unwrap_or(usize::MAX);
            arr.truncate(keep);
        } else {
            let keep = usize::try_from(n.unsigned_abs()).unwrap_or(usize::MAX);
            if keep < len {
                arr.drain(..len - keep);
            }
        }
    }
}

fn apply_rename(doc: &mut Document, from: &[String], to: &[String], orig: &Document) -> Result<()> {
    // Neither side may go through an array (MongoDB refuses rather than guess).
    let value = match lookup(doc, from) {
        Lookup::Found(v) => v.clone(),
        Lookup::Missing | Lookup::Blocked { .. } => return Ok(()),
    };
    if through_array(doc, from) {
        return Err(Error::bad_value(format!(
            "The source field cannot be an array element, '{}' in doc with {}",
            from.join("."),
            id_render(orig)
        )));
    }
    if through_array(doc, to) {
        return Err(Error::bad_value(format!(
            "The destination field cannot be an array element, '{}' in doc with {}",
            to.join("."),
            id_render(orig)
        )));
    }
    path::set_creating(doc, to, value)?;
    remove_path(doc, from);
    Ok(())
}

/// Does any existing proper prefix of `path` hold an array?
fn through_array(doc: &Document, path: &[String]) -> bool {
    let mut cur: Option<&Bson> = None;
    for (i, part) in path.iter().enumerate() {
        let next = match cur {
            None => doc.get(part),
            Some(Bson::Document(d)) => d.get(part),
            Some(_) => None,
        };
        let Some(next) = next else {
            return false;
        };
        if i + 1 < path.len() && matches!(next, Bson::Array(_)) {
            return true;
        }
        cur = Some(next);
    }
    false
}

enum Lookup<'a> {
    Found(&'a Bson),
    Missing,
    /// `path[at]` cannot be created inside `parent` (a scalar, or an array with a
    /// non-numeric component); `path[at - 1]` names `parent`.
    Blocked {
        at: usize,
        parent: &'a Bson,
    },
}

fn lookup<'a>(doc: &'a Document, path: &[String]) -> Lookup<'a> {
    let Some((first, rest)) = path.split_first() else {
        return Lookup::Missing;
    };
    let Some(mut cur) = doc.get(first) else {
        return Lookup::Missing;
    };
    for (i, part) in rest.iter().enumerate() {
        let next = match cur {
            Bson::Document(d) => d.get(part),
            Bson::Array(a) => match numeric_component(part) {
                Some(idx) => a.get(idx),
                None => {
                    return Lookup::Blocked {
                        at: i + 1,
                        parent: cur,
                    }
                }
            },
            _ => {
                return Lookup::Blocked {
                    at: i + 1,
                    parent: cur,
                }
            }
        };
        match next {
            Some(v) => cur = v,
            None => return Lookup::Missing,
        }
    }
    Lookup::Found(cur)
}

fn apply_at(
    doc: &mut Document,
    path: &[String],
    f: impl FnOnce(Option<&Bson>) -> Result<Action>,
) -> Result<()> {
    let action = match lookup(doc, path) {
        Lookup::Found(v) => f(Some(v))?,
        Lookup::Missing => f(None)?,
        Lookup::Blocked { at, parent } => match f(None)? {
            // Only operators that would create the field fail on a blocked path.
            Action::Set(_) => return Err(path::not_viable(path, at, parent)),
            _ => Action::Keep,
        },
    };
    match action {
        Action::Keep => Ok(()),
        Action::Set(v) => path::set_creating(doc, path, v),
        Action::Remove => {
            remove_path(doc, path);
            Ok(())
        }
    }
}

/// Remove `path`: a document field is deleted, an array element becomes null
/// (MongoDB keeps array positions stable). Missing paths are left alone.
fn remove_path(doc: &mut Document, path: &[String]) {
    let Some((last, parents)) = path.split_last() else {
        return;
    };
    if parents.is_empty() {
        doc.remove(last);
        return;
    }
    let mut cur = doc.get_mut(&parents[0]);
    for part in &parents[1..] {
        cur = match cur {
            Some(Bson::Document(d)) => d.get_mut(part),
            Some(Bson::Array(a)) => numeric_component(part).and_then(|i| a.get_mut(i)),
            _ => None,
        };
    }
    match cur {
        Some(Bson::Document(d)) => {
            d.remove(last);
        }
        Some(Bson::Array(a)) => {
            if let Some(slot) = numeric_component(last).and_then(|i| a.get_mut(i)) {
                *slot = Bson::Null;
            }
        }
        _ => {}
    }
}

// ---------------------------------------------------------------- arithmetic

fn is_num(v: &Bson) -> bool {
    matches!(
        v,
        Bson::Int32(_) | Bson::Int64(_) | Bson::Double(_) | Bson::Decimal128(_)
    )
}

fn decimal_unsupported(name: &str) -> Error {
    Error::bad_value(format!("{name} on Decimal128 values is not supported"))
}

/// `cur + arg` or `cur * arg` with MongoDB's promotion: int32 overflowing becomes
/// int64; a double operand makes a double; int64 overflow is `Ok(None)` (an error
/// for the caller, as in MongoDB).
fn arithmetic(cur: &Bson, arg: &Bson, add: bool) -> Result<Option<Bson>> {
    use Bson::{Double, Int32, Int64};
    let name = if add { "$inc" } else { "$mul" };
    let f = |x: f64, y: f64| if add { x + y } else { x * y };
    Ok(match (cur, arg) {
        (Bson::Decimal128(_), _) | (_, Bson::Decimal128(_)) => {
            return Err(decimal_unsupported(name))
        }
        (Int32(x), Int32(y)) => {
            let r = if add {
                x.checked_add(*y)
            } else {
                x.checked_mul(*y)
            };
            Some(match r {
                Some(v) => Int32(v),
                // Two int32s always fit in an int64, sum or product.
                None => Int64(if add {
                    i64::from(*x) + i64::from(*y)
                } else {
                    i64::from(*x) * i64::from(*y)
                }),
            })
        }
        (Int32(_) | Int64(_), Int32(_) | Int64(_)) => {
            let (x, y) = (as_i64(cur), as_i64(arg));
            let r = if add {
                x.checked_add(y)
            } else {
                x.checked_mul(y)
            };
            r.map(Int64)
        }
        (Double(x), Double(y)) => Some(Double(f(*x, *y))),
        (Double(x), other) => Some(Double(f(*x, as_i64(other) as f64))),
        (other, Double(y)) => Some(Double(f(as_i64(other) as f64, *y))),
        _ => return Err(Error::type_mismatch(format!("{name} requires numbers"))),
    })
}

fn as_i64(v: &Bson) -> i64 {
    match v {
        Bson::Int32(i) => i64::from(*i),
        Bson::Int64(i) => *i,
        _ => 0,
    }
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

// ---------------------------------------------------------------- element conditions

/// A condition on one array element: `$pull`'s argument and `$elemMatch` projection.
#[derive(Debug, Clone)]
pub(crate) enum ElemCond {
    /// A plain value: the element must equal it exactly (numbers by value).
    Equal(Bson),
    /// Comparison operators on the element itself (`{$gte: 5, $ne: 7}`).
    Ops(Vec<(CmpOp, Bson)>),
    /// Other operators on the element itself, evaluated by the filter engine on
    /// the element wrapped as `{v: element}` against `{v: condition}`.
    Wrapped(Filter),
    /// A query on document elements (`{score: {$gt: 8}}`).
    Query(Filter),
}

#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum CmpOp {
    Eq,
    Ne,
    Gt,
    Gte,
    Lt,
    Lte,
    In,
    Nin,
}

/// Operators that, first in a condition, make it a query on document elements.
const TOP_LEVEL_OPS: &[&str] = &[
    "$and",
    "$or",
    "$nor",
    "$expr",
    "$where",
    "$text",
    "$comment",
    "$jsonSchema",
];

impl ElemCond {
    pub(crate) fn parse(v: &Bson) -> Result<ElemCond> {
        let Bson::Document(d) = v else {
            return Ok(ElemCond::Equal(v.clone()));
        };
        let is_expression = d
            .keys()
            .next()
            .is_some_and(|k| k.starts_with('$') && !TOP_LEVEL_OPS.contains(&k.as_str()));
        if !is_expression {
            return Ok(ElemCond::Query(Filter::parse(d)?));
        }
        let mut ops = Vec::with_capacity(d.len());
        for (k, arg) in d {
            let op = match k.as_str() {
                "$eq" => CmpOp::Eq,
                "$ne" => CmpOp::Ne,
                "$gt" => CmpOp::Gt,
                "$gte" => CmpOp::Gte,
                "$lt" => CmpOp::Lt,
                "$lte" => CmpOp::Lte,
                "$in" | "$nin" => {
                    if !matches!(arg, Bson::Array(_)) {
                        return Err(Error::bad_value(format!("{k} needs an array")));
                    }
                    if k == "$in" {
                        CmpOp::In
                    } else {
                        CmpOp::Nin
                    }
                }
                _ => {
                    let mut wrapped = Document::new();
                    wrapped.insert("v", Bson::Document(d.clone()));
                    return Ok(ElemCond::Wrapped(Filter::parse(&wrapped)?));
                }
            };
            ops.push((op, arg.clone()));
        }
        Ok(ElemCond::Ops(ops))
    }

    pub(crate) fn matches(&self, elem: &Bson) -> bool {
        match self {
            ElemCond::Equal(v) => exact_equal(elem, v),
            ElemCond::Ops(ops) => ops.iter().all(|(op, arg)| op_matches(*op, arg, elem)),
            ElemCond::Wrapped(f) => {
                let mut d = Document::new();
                d.insert("v", elem.clone());
                RawDocumentBuf::try_from(&d).is_ok_and(|raw| f.matches(&raw))
            }
            ElemCond::Query(f) => match elem {
                Bson::Document(d) => RawDocumentBuf::try_from(d).is_ok_and(|raw| f.matches(&raw)),
                _ => false,
            },
        }
    }
}

/// Value equality as `$pull` uses it: numbers by value, everything else exactly.
fn exact_equal(a: &Bson, b: &Bson) -> bool {
    value::equal_bson(a, b)
}

fn op_matches(op: CmpOp, arg: &Bson, elem: &Bson) -> bool {
    match op {
        CmpOp::Ne => !op_matches(CmpOp::Eq, arg, elem),
        CmpOp::Nin => !op_matches(CmpOp::In, arg, elem),
        CmpOp::In => match arg {
            Bson::Array(vals) => vals.iter().any(|v| op_matches(CmpOp::Eq, v, elem)),
            _ => false,
        },
        _ => {
            // Query semantics: an array matches when it, or one of its elements, does.
            scalar_matches(op, arg, elem)
                || matches!(elem, Bson::Array(items) if items.iter().any(|x| scalar_matches(op, arg, x)))
        }
    }
}

fn scalar_matches(op: CmpOp, arg: &Bson, x: &Bson) -> bool {
    let (Some(ra), Some(rx)) = (value::to_raw(arg), value::to_raw(x)) else {
        return false;
    };
    let (ra, rx) = (ra.as_raw_bson_ref(), rx.as_raw_bson_ref());
    // Comparisons only hold within one type bracket, as in MongoDB queries.
    if value::canonical_rank(ra) != value::canonical_rank(rx) {
        return false;
    }
    let ord = value::compare(rx, ra);
    match op {
        CmpOp::Eq => ord == Ordering::Equal,
        CmpOp::Gt => ord == Ordering::Greater,
        CmpOp::Gte => ord != Ordering::Less,
        CmpOp::Lt => ord == Ordering::Less,
        CmpOp::Lte => ord != Ordering::Greater,
        _ => false,
    }
}

// ---------------------------------------------------------------- helpers

fn id_render(doc: &Document) -> String {
    match doc.get("_id") {
        Some(id) => format!("{{_id: {}}}", render(id)),
        None => "{}".to_string(),
    }
}

/// Does the document nest deeper than [`MAX_DEPTH`] (it sits at `level`)?
/// Stops descending as soon as the limit is passed.
pub(crate) fn too_deep_doc(d: &Document, level: usize) -> bool {
    if level > MAX_DEPTH {
        return true;
    }
    d.values().any(|v| too_deep(v, level + 1))
}

fn too_deep(v: &Bson, level: usize) -> bool {
    match v {
        Bson::Document(d) => too_deep_doc(d, level),
        Bson::Array(a) => level > MAX_DEPTH || a.iter().any(|x| too_deep(x, level + 1)),
        _ => false,
    }
}

#[cfg(test)]
mod tests;
