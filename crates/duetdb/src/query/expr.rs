//! Aggregation expressions (`"$a.b"`, `{$add: [...]}`, `{$cond: ...}`, ...):
//! parsed once from BSON into [`Expr`], then evaluated per document.
//!
//! Owns: expression parsing and evaluation, the aggregation notion of
//! "missing" (distinct from null), truthiness, and MongoDB's arithmetic type
//! rules. Used by `aggregate.rs` for `$project`, `$addFields`, `$group` keys
//! and accumulator arguments.
//!
//! Invariants:
//! - A value is `Option<Bson>`; `None` means *missing* (a field that does not
//!   exist, `$$REMOVE`). Missing compares equal to `undefined` and below
//!   `null`, like MongoDB's `Value` order, and most operators treat it as null.
//! - Every comparison goes through [`crate::doc::value::compare`], so `$eq`, `$in`,
//!   `$max`, `$sort` and `$group` keys agree with filters and indexes.
//! - Arithmetic follows MongoDB: int32 ∘ int32 stays int32 unless it overflows
//!   (then int64), int64 overflow goes to double, any double makes a double,
//!   `$divide` always gives a double. decimal128 arithmetic is not implemented
//!   and is refused with a clear error (documented gap), never approximated.
//! - Evaluation never panics on any input: wrong types give TypeMismatch (14) or
//!   BadValue (2) with MongoDB's wording; parsing depth is bounded.

use std::cmp::Ordering;

use bson::raw::{RawArray, RawDocument};
use bson::{Bson, Document, RawBsonRef};

use crate::doc::value;
use crate::error::{Error, Result};

/// An evaluated value; `None` is *missing*.
pub type Value = Option<Bson>;

/// How deeply expressions may nest (documents nest at most 100 levels anyway).
const MAX_EXPR_DEPTH: usize = 150;

/// The document an expression is evaluated against (`$$ROOT` / `$$CURRENT`).
/// Raw documents straight from the heap are read in place: a `$group` over a
/// scan converts only the fields its expressions touch.
#[derive(Clone, Copy, Debug)]
pub enum Root<'a> {
    Raw(&'a RawDocument),
    Doc(&'a Document),
}

impl Root<'_> {
    /// The value at a (non-empty) field path, with aggregation's array rule:
    /// a path component applied to an array maps over its elements.
    pub fn get(&self, parts: &[String]) -> Result<Value> {
        let Some((first, rest)) = parts.split_first() else {
            return self.whole().map(Some);
        };
        match self {
            Root::Doc(d) => Ok(d.get(first).and_then(|v| path_bson(v, rest))),
            Root::Raw(d) => match crate::doc::rawfield::field(d, first) {
                Some(v) => path_raw(v, rest),
                None => Ok(None),
            },
        }
    }

    /// The whole document as an owned value.
    pub fn whole(&self) -> Result<Bson> {
        match self {
            Root::Doc(d) => Ok(Bson::Document((*d).clone())),
            Root::Raw(d) => crate::doc::to_document(d).map(Bson::Document),
        }
    }
}

fn path_bson(v: &Bson, rest: &[String]) -> Value {
    let Some((first, tail)) = rest.split_first() else {
        return Some(v.clone());
    };
    match v {
        Bson::Document(d) => d.get(first).and_then(|x| path_bson(x, tail)),
        Bson::Array(a) => Some(Bson::Array(
            a.iter()
                .filter(|e| matches!(e, Bson::Document(_) | Bson::Array(_)))
                .filter_map(|e| path_bson(e, rest))
                .collect(),
        )),
        _ => None,
    }
}

fn path_raw(v: RawBsonRef<'_>, rest: &[String]) -> Result<Value> {
    let Some((first, tail)) = rest.split_first() else {
        return raw_to_bson(v).map(Some);
    };
    match v {
        RawBsonRef::Document(d) => match crate::doc::rawfield::field(d, first) {
            Some(x) => path_raw(x, tail),
            None => Ok(None),
        },
        RawBsonRef::Array(a) => path_raw_array(a, rest).map(|v| Some(Bson::Array(v))),
        _ => Ok(None),
    }
}

fn path_raw_array(a: &RawArray, rest: &[String]) -> Result<Vec<Bson>> {
    let mut out = Vec::new();
    for e in a {
        let e = e.map_err(|e| Error::InvalidBson(e.to_string()))?;
        if matches!(e, RawBsonRef::Document(_) | RawBsonRef::Array(_)) {
            if let Some(x) = path_raw(e, rest)? {
                out.push(x);
            }
        }
    }
    Ok(out)
}

/// Owned form of a raw value.
pub fn raw_to_bson(v: RawBsonRef<'_>) -> Result<Bson> {
    Bson::try_from(v).map_err(|e| Error::InvalidBson(e.to_string()))
}

/// A parsed expression.
#[derive(Debug, Clone)]
pub enum Expr {
    Literal(Bson),
    /// `"$a.b"` (the path components).
    Field(Vec<String>),
    /// `"$$ROOT"`, `"$$CURRENT"`, optionally followed by a path.
    Root(Vec<String>),
    /// `"$$REMOVE"`: evaluates to missing.
    Remove,
    /// `{a: <expr>, b: <expr>}`: a document built from expressions.
    Doc(Vec<(String, Expr)>),
    /// `[<expr>, ...]`.
    Array(Vec<Expr>),
    Op(Op, Vec<Expr>),
}

/// Expression operators.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    Add,
    Subtract,
    Multiply,
    Divide,
    Mod,
    Eq,
    Ne,
    Gt,
    Gte,
    Lt,
    Lte,
    Cmp,
    And,
    Or,
    Not,
    Cond,
    IfNull,
    In,
    Size,
    Concat,
    ToLower,
    ToUpper,
    SubstrBytes,
    Abs,
    Floor,
    Ceil,
    Round,
    Year,
    Month,
    DayOfMonth,
    ArrayElemAt,
    Max,
    Min,
}

impl Op {
    fn from_name(name: &str) -> Option<Op> {
        Some(match name {
            "$add" => Op::Add,
            "$subtract" => Op::Subtract,
            "$multiply" => Op::Multiply,
            "$divide" => Op::Divide,
            "$mod" => Op::Mod,
            "$eq" => Op::Eq,
            "$ne" => Op::Ne,
            "$gt" => Op::Gt,
            "$gte" => Op::Gte,
            "$lt" => Op::Lt,
            "$lte" => Op::Lte,
            "$cmp" => Op::Cmp,
            "$and" => Op::And,
            "$or" => Op::Or,
            "$not" => Op::Not,
            "$cond" => Op::Cond,
            "$ifNull" => Op::IfNull,
            "$in" => Op::In,
            "$size" => Op::Size,
            "$concat" => Op::Concat,
            "$toLower" => Op::ToLower,
            "$toUpper" => Op::ToUpper,
            "$substr" | "$substrBytes" => Op::SubstrBytes,
            "$abs" => Op::Abs,
            "$floor" => Op::Floor,
            "$ceil" => Op::Ceil,
            "$round" => Op::Round,
            "$year" => Op::Year,
            "$month" => Op::Month,
            "$dayOfMonth" => Op::DayOfMonth,
            "$arrayElemAt" => Op::ArrayElemAt,
            "$max" => Op::Max,
            "$min" => Op::Min,
            _ => return None,
        })
    }

    fn name(self) -> &'static str {
        match self {
            Op::Add => "$add",
            Op::Subtract => "$subtract",
            Op::Multiply => "$multiply",
            Op::Divide => "$divide",
            Op::Mod => "$mod",
            Op::Eq => "$eq",
            Op::Ne => "$ne",
            Op::Gt => "$gt",
            Op::Gte => "$gte",
            Op::Lt => "$lt",
            Op::Lte => "$lte",
            Op::Cmp => "$cmp",
            Op::And => "$and",
            Op::Or => "$or",
            Op::Not => "$not",
            Op::Cond => "$cond",
            Op::IfNull => "$ifNull",
            Op::In => "$in",
            Op::Size => "$size",
            Op::Concat => "$concat",
            Op::ToLower => "$toLower",
            Op::ToUpper => "$toUpper",
            Op::SubstrBytes => "$substrBytes",
            Op::Abs => "$abs",
            Op::Floor => "$floor",
            Op::Ceil => "$ceil",
            Op::Round => "$round",
            Op::Year => "$year",
            Op::Month => "$month",
            Op::DayOfMonth => "$dayOfMonth",
            Op::ArrayElemAt => "$arrayElemAt",
            Op::Max => "$max",
            Op::Min => "$min",
        }
    }

    /// `(min, max)` number of arguments.
    fn arity(self) -> (usize, usize) {
        match self {
            Op::Add | Op::Multiply | Op::And | Op::Or | Op::Concat | Op::Max | Op::Min => {
                (0, usize::MAX)
            }
            Op::IfNull => (2, usize::MAX),
            Op::Not
            | Op::Size
            | Op::ToLower
            | Op::ToUpper
            | Op::Abs
            | Op::Floor
            | Op::Ceil
            | Op::Year
            | Op::Month
            | Op::DayOfMonth => (1, 1),
            Op::Round => (1, 2),
            Op::Cond | Op::SubstrBytes => (3, 3),
            _ => (2, 2),
        }
    }
}

impl Expr {
    /// Parse an expression.
    pub fn parse(v: &Bson) -> Result<Expr> {
        parse_at(v, 0)
    }

    /// Evaluate against `root`.
    pub fn eval(&self, root: &Root<'_>) -> Result<Value> {
        match self {
            Expr::Literal(b) => Ok(Some(b.clone())),
            Expr::Field(parts) | Expr::Root(parts) => root.get(parts),
            Expr::Remove => Ok(None),
            Expr::Doc(fields) => {
                let mut out = Document::new();
                for (k, e) in fields {
                    if let Some(v) = e.eval(root)? {
                        out.insert(k.clone(), v);
                    }
                }
                Ok(Some(Bson::Document(out)))
            }
            Expr::Array(items) => {
                let mut out = Vec::with_capacity(items.len());
                for e in items {
                    // Missing inside an array literal becomes null, as in MongoDB.
                    out.push(e.eval(root)?.unwrap_or(Bson::Null));
                }
                Ok(Some(Bson::Array(out)))
            }
            Expr::Op(op, args) => eval_op(*op, args, root),
        }
    }
}

fn parse_at(v: &Bson, depth: usize) -> Result<Expr> {
    if depth > MAX_EXPR_DEPTH {
        return Err(Error::bad_value(format!(
            "expression nests deeper than {MAX_EXPR_DEPTH} levels"
        )));
    }
    match v {
        Bson::String(s) if s.starts_with("$$") => parse_variable(&s[2..]),
        Bson::String(s) if s.starts_with('$') => Ok(Expr::Field(parse_field_path(&s[1..])?)),
        Bson::Array(items) => Ok(Expr::Array(
            items
                .iter()
                .map(|i| parse_at(i, depth + 1))
                .collect::<Result<_>>()?,
        )),
        Bson::Document(d) => parse_object(d, depth),
        other => Ok(Expr::Literal(other.clone())),
    }
}

/// Components of a field path given without its `$` (`"a.b"`).
pub fn parse_field_path(p: &str) -> Result<Vec<String>> {
    if p.is_empty() {
        return Err(Error::bad_value("'$' by itself is not a valid FieldPath"));
    }
    crate::doc::path::validate(p)
        .map_err(|e| Error::bad_value(format!("invalid field path: {e}")))?;
    let parts: Vec<String> = p.split('.').map(str::to_string).collect();
    if let Some(bad) = parts.iter().find(|c| c.starts_with('$')) {
        return Err(Error::bad_value(format!(
            "FieldPath field names may not start with '$'. Consider using $getField or $setField. (field '{bad}' in '${p}')"
        )));
    }
    Ok(parts)
}

fn parse_variable(v: &str) -> Result<Expr> {
    let (name, rest) = match v.split_once('.') {
        Some((n, r)) => (n, Some(r)),
        None => (v, None),
    };
    let path = match rest {
        Some(r) => parse_field_path(r)?,
        None => Vec::new(),
    };
    match name {
        "ROOT" | "CURRENT" => Ok(Expr::Root(path)),
        "REMOVE" if path.is_empty() => Ok(Expr::Remove),
        "REMOVE" => Ok(Expr::Remove),
        "" => Err(Error::bad_value("empty variable name")),
        other => Err(Error::bad_value(format!(
            "Use of undefined variable: {other}"
        ))),
    }
}

fn parse_object(d: &Document, depth: usize) -> Result<Expr> {
    let first_dollar = d.keys().next().is_some_and(|k| k.starts_with('$'));
    if first_dollar {
        if d.len() != 1 {
            return Err(Error::bad_value(format!(
                "an expression specification must contain exactly one field, the name of the expression. Found {} fields in {}",
                d.len(),
                crate::error::render(&Bson::Document(d.clone()))
            )));
        }
        let Some((name, arg)) = d.iter().next() else {
            return Err(Error::Internal("empty operator document".into()));
        };
        return parse_operator(name, arg, depth);
    }
    let mut fields = Vec::with_capacity(d.len());
    for (k, v) in d {
        if k.starts_with('$') {
            return Err(Error::bad_value(format!(
                "field names in an expression object may not start with '$': '{k}'"
            )));
        }
        if k.contains('.') {
            return Err(Error::bad_value(format!(
                "field names in an expression object may not contain '.': '{k}'"
            )));
        }
        fields.push((k.clone(), parse_at(v, depth + 1)?));
    }
    Ok(Expr::Doc(fields))
}

fn parse_operator(name: &str, arg: &Bson, depth: usize) -> Result<Expr> {
    if name == "$literal" {
        return Ok(Expr::Literal(arg.clone()));
    }
    let Some(op) = Op::from_name(name) else {
        return Err(Error::bad_value(format!(
            "Unrecognized expression '{name}'"
        )));
    };
    let args: Vec<Expr> = match (op, arg) {
        (Op::Cond, Bson::Document(d)) if !d.keys().any(|k| k.starts_with('$')) => {
            for k in d.keys() {
                if !matches!(k.as_str(), "if" | "then" | "else") {
                    return Err(Error::bad_value(format!(
                        "Unrecognized parameter to $cond: {k}"
                    )));
                }
            }
            let part = |k: &str| -> Result<Expr> {
                match d.get(k) {
                    Some(v) => parse_at(v, depth + 1),
                    None => Err(Error::bad_value(format!(
                        "Missing '{k}' parameter to $cond"
                    ))),
                }
            };
            vec![part("if")?, part("then")?, part("else")?]
        }
        (Op::Year | Op::Month | Op::DayOfMonth, Bson::Document(d))
            if d.contains_key("date") && !d.keys().any(|k| k.starts_with('$')) =>
        {
            for (k, v) in d {
                match (k.as_str(), v) {
                    ("date", _) => {}
                    ("timezone", Bson::String(tz))
                        if matches!(
                            tz.as_str(),
                            "UTC" | "GMT" | "Z" | "+00:00" | "+0000" | "Etc/UTC"
                        ) => {}
                    ("timezone", _) => {
                        return Err(Error::bad_value(format!(
                            "{}: only the UTC timezone is supported by duetdb",
                            op.name()
                        )))
                    }
                    (other, _) => {
                        return Err(Error::bad_value(format!(
                            "unrecognized option to {}: \"{other}\"",
                            op.name()
                        )))
                    }
                }
            }
            vec![parse_at(d.get("date").unwrap_or(&Bson::Null), depth + 1)?]
        }
        (_, Bson::Array(items)) => items
            .iter()
            .map(|i| parse_at(i, depth + 1))
            .collect::<Result<_>>()?,
        (_, single) => vec![parse_at(single, depth + 1)?],
    };
    let (lo, hi) = op.arity();
    if args.len() < lo || args.len() > hi {
        let want = if lo == hi {
            format!("exactly {lo}")
        } else if hi == usize::MAX {
            format!("at least {lo}")
        } else {
            format!("{lo} to {hi}")
        };
        return Err(Error::bad_value(format!(
            "Expression {} takes {want} arguments. {} were passed in.",
            op.name(),
            args.len()
        )));
    }
    Ok(Expr::Op(op, args))
}

/// MongoDB's type name of a value (`"missing"` for missing).
pub fn type_name(v: &Value) -> &'static str {
    v.as_ref().map_or("missing", crate::doc::types::type_name)
}

/// Null, undefined or missing: what most operators answer null for.
pub fn is_nullish(v: &Value) -> bool {
    matches!(v, None | Some(Bson::Null) | Some(Bson::Undefined))
}

/// Aggregation truthiness: false, null, undefined, missing and numeric zero are
/// false; everything else (also `""` and `[]`) is true.
pub fn truthy(v: &Value) -> bool {
    match v {
        None | Some(Bson::Null) | Some(Bson::Undefined) | Some(Bson::Boolean(false)) => false,
        Some(Bson::Int32(0)) | Some(Bson::Int64(0)) => false,
        Some(Bson::Double(f)) => *f != 0.0,
        Some(Bson::Decimal128(d)) => value::decimal_to_f64(*d) != 0.0,
        _ => true,
    }
}

/// Compare two values in MongoDB's order, missing as undefined.
pub fn compare_values(a: &Value, b: &Value) -> Ordering {
    let a = a.as_ref().unwrap_or(&Bson::Undefined);
    let b = b.as_ref().unwrap_or(&Bson::Undefined);
    compare(a, b)
}

/// [`value::compare`] on owned values without cloning the common scalar cases.
pub fn compare(a: &Bson, b: &Bson) -> Ordering {
    match (num_of(a), num_of(b)) {
        (Some(x), Some(y)) => value::compare_numbers(x.lift(), y.lift()),
        _ => match (a, b) {
            (Bson::String(x), Bson::String(y)) => x.as_bytes().cmp(y.as_bytes()),
            _ => value::compare_bson(a, b),
        },
    }
}

/// A non-decimal number.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Num {
    I32(i32),
    I64(i64),
    F64(f64),
}

impl Num {
    fn lift(self) -> value::Num {
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

    fn to_i64(self) -> Option<i64> {
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
pub fn add_nums(a: Num, b: Num) -> Num {
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

fn decimal_gap(op: Op) -> Error {
    Error::bad_value(format!(
        "{}: decimal128 arithmetic is not supported by duetdb",
        op.name()
    ))
}

/// The numeric argument of `op`, or the error MongoDB gives.
fn want_num(op: Op, v: &Bson, what: &str) -> Result<Num> {
    match num_of(v) {
        Some(n) => Ok(n),
        None if matches!(v, Bson::Decimal128(_)) => Err(decimal_gap(op)),
        None => Err(Error::type_mismatch(format!(
            "{} only supports numeric types{what}, not {}",
            op.name(),
            type_name(&Some(v.clone()))
        ))),
    }
}

fn eval_args(args: &[Expr], root: &Root<'_>) -> Result<Vec<Value>> {
    args.iter().map(|a| a.eval(root)).collect()
}

fn eval_op(op: Op, args: &[Expr], root: &Root<'_>) -> Result<Value> {
    // Short-circuiting operators first: they must not evaluate every argument.
    match op {
        Op::And => {
            for a in args {
                if !truthy(&a.eval(root)?) {
                    return Ok(Some(Bson::Boolean(false)));
                }
            }
            return Ok(Some(Bson::Boolean(true)));
        }
        Op::Or => {
            for a in args {
                if truthy(&a.eval(root)?) {
                    return Ok(Some(Bson::Boolean(true)));
                }
            }
            return Ok(Some(Bson::Boolean(false)));
        }
        Op::Cond => {
            let [c, t, e] = args else {
                return Err(Error::Internal("$cond arity".into()));
            };
            return if truthy(&c.eval(root)?) {
                t.eval(root)
            } else {
                e.eval(root)
            };
        }
        Op::IfNull => {
            let Some((last, init)) = args.split_last() else {
                return Err(Error::Internal("$ifNull arity".into()));
            };
            for a in init {
                let v = a.eval(root)?;
                if !is_nullish(&v) {
                    return Ok(v);
                }
            }
            return last.eval(root);
        }
        _ => {}
    }
    let vals = eval_args(args, root)?;
    apply(op, vals)
}

/// Apply a non-short-circuiting operator to evaluated arguments (arity checked
/// at parse time; re-checked here defensively without panicking).
fn apply(op: Op, vals: Vec<Value>) -> Result<Value> {
    let arg = |i: usize| -> Result<&Value> {
        vals.get(i)
            .ok_or_else(|| Error::Internal(format!("{}: missing argument {i}", op.name())))
    };
    let null = Ok(Some(Bson::Null));
    match op {
        Op::Add => add(&vals),
        Op::Multiply => {
            let mut acc = Num::I32(1);
            for v in &vals {
                if is_nullish(v) {
                    return null;
                }
            }
            for v in vals.iter().flatten() {
                acc = mul_nums(acc, want_num(op, v, "")?);
            }
            Ok(Some(acc.to_bson()))
        }
        Op::Subtract => subtract(arg(0)?, arg(1)?),
        Op::Divide => {
            let (a, b) = (arg(0)?, arg(1)?);
            if is_nullish(a) || is_nullish(b) {
                return null;
            }
            let (x, y) = (
                want_num(op, a.as_ref().unwrap_or(&Bson::Null), "")?,
                want_num(op, b.as_ref().unwrap_or(&Bson::Null), "")?,
            );
            if y.to_f64() == 0.0 {
                return Err(Error::bad_value("can't $divide by zero"));
            }
            Ok(Some(Bson::Double(x.to_f64() / y.to_f64())))
        }
        Op::Mod => {
            let (a, b) = (arg(0)?, arg(1)?);
            if is_nullish(a) || is_nullish(b) {
                return null;
            }
            let (x, y) = (
                want_num(op, a.as_ref().unwrap_or(&Bson::Null), "")?,
                want_num(op, b.as_ref().unwrap_or(&Bson::Null), "")?,
            );
            if y.to_f64() == 0.0 {
                return Err(Error::bad_value("can't $mod by zero"));
            }
            let r = match (x, y) {
                (Num::I32(p), Num::I32(q)) => Num::I32(p.checked_rem(q).unwrap_or(0)),
                (Num::F64(_), _) | (_, Num::F64(_)) => Num::F64(x.to_f64() % y.to_f64()),
                _ => {
                    let (p, q) = (x.to_i64().unwrap_or(0), y.to_i64().unwrap_or(1));
                    Num::I64(p.checked_rem(q).unwrap_or(0))
                }
            };
            Ok(Some(r.to_bson()))
        }
        Op::Eq | Op::Ne | Op::Gt | Op::Gte | Op::Lt | Op::Lte => {
            let c = compare_values(arg(0)?, arg(1)?);
            let b = match op {
                Op::Eq => c == Ordering::Equal,
                Op::Ne => c != Ordering::Equal,
                Op::Gt => c == Ordering::Greater,
                Op::Gte => c != Ordering::Less,
                Op::Lt => c == Ordering::Less,
                _ => c != Ordering::Greater,
            };
            Ok(Some(Bson::Boolean(b)))
        }
        Op::Cmp => Ok(Some(Bson::Int32(match compare_values(arg(0)?, arg(1)?) {
            Ordering::Less => -1,
            Ordering::Equal => 0,
            Ordering::Greater => 1,
        }))),
        Op::Not => Ok(Some(Bson::Boolean(!truthy(arg(0)?)))),
        Op::In => {
            let (needle, hay) = (arg(0)?, arg(1)?);
            let Some(Bson::Array(items)) = hay else {
                return Err(Error::bad_value(format!(
                    "$in requires an array as a second argument, found: {}",
                    type_name(hay)
                )));
            };
            Ok(Some(Bson::Boolean(items.iter().any(|i| {
                compare_values(needle, &Some(i.clone())) == Ordering::Equal
            }))))
        }
        Op::Size => match arg(0)? {
            Some(Bson::Array(a)) => Ok(Some(Bson::Int32(
                i32::try_from(a.len()).unwrap_or(i32::MAX),
            ))),
            other => Err(Error::type_mismatch(format!(
                "The argument to $size must be an array. Type of the argument was: {}",
                type_name(other)
            ))),
        },
        Op::Concat => {
            let mut out = String::new();
            for v in &vals {
                match v {
                    None | Some(Bson::Null) | Some(Bson::Undefined) => return null,
                    Some(Bson::String(s)) => out.push_str(s),
                    other => {
                        return Err(Error::type_mismatch(format!(
                            "$concat only supports strings, not {}",
                            type_name(other)
                        )))
                    }
                }
            }
            Ok(Some(Bson::String(out)))
        }
        Op::ToLower | Op::ToUpper => {
            let s = coerce_string(op, arg(0)?)?;
            // MongoDB's case mapping is ASCII-only.
            Ok(Some(Bson::String(if op == Op::ToLower {
                s.to_ascii_lowercase()
            } else {
                s.to_ascii_uppercase()
            })))
        }
        Op::SubstrBytes => substr_bytes(arg(0)?, arg(1)?, arg(2)?),
        Op::Abs | Op::Floor | Op::Ceil => {
            let a = arg(0)?;
            let Some(v) = a.as_ref().filter(|_| !is_nullish(a)) else {
                return null;
            };
            let n = want_num(op, v, "")?;
            let r = match (op, n) {
                (Op::Abs, Num::I32(i)) => int_or_long(i64::from(i).abs()),
                (Op::Abs, Num::I64(i)) => Num::I64(
                    i.checked_abs()
                        .ok_or_else(|| Error::bad_value("can't take $abs of long long min"))?,
                ),
                (Op::Abs, Num::F64(f)) => Num::F64(f.abs()),
                (Op::Floor, Num::F64(f)) => Num::F64(f.floor()),
                (Op::Ceil, Num::F64(f)) => Num::F64(f.ceil()),
                (_, n) => n,
            };
            Ok(Some(r.to_bson()))
        }
        Op::Round => {
            let a = arg(0)?;
            let place = match vals.get(1) {
                None => 0,
                Some(p) if is_nullish(p) => return null,
                Some(Some(p)) => match num_of(p) {
                    Some(Num::I32(i)) => i64::from(i),
                    Some(Num::I64(i)) => i,
                    Some(Num::F64(f)) if f.fract() == 0.0 && f.abs() < 1e9 => f as i64,
                    _ => {
                        return Err(Error::bad_value(
                            "$round requires \"place\" argument to be an integral value",
                        ))
                    }
                },
                Some(None) => return null,
            };
            if !(-20..=100).contains(&place) {
                return Err(Error::bad_value(format!(
                    "$round requires \"place\" to be between -20 and 100, but is {place}"
                )));
            }
            let Some(v) = a.as_ref().filter(|_| !is_nullish(a)) else {
                return null;
            };
            Ok(Some(round(want_num(op, v, "")?, place).to_bson()))
        }
        Op::Year | Op::Month | Op::DayOfMonth => {
            let a = arg(0)?;
            let ms = match a {
                None | Some(Bson::Null) | Some(Bson::Undefined) => return null,
                Some(Bson::DateTime(d)) => d.timestamp_millis(),
                Some(Bson::Timestamp(t)) => i64::from(t.time) * 1000,
                Some(Bson::ObjectId(o)) => o.timestamp().timestamp_millis(),
                other => {
                    return Err(Error::type_mismatch(format!(
                        "can't convert from BSON type {} to Date",
                        type_name(other)
                    )))
                }
            };
            let (y, m, d) = civil_from_days(ms.div_euclid(86_400_000));
            let out = match op {
                Op::Year => y,
                Op::Month => i64::from(m),
                _ => i64::from(d),
            };
            Ok(Some(Bson::Int32(i32::try_from(out).unwrap_or(i32::MAX))))
        }
        Op::ArrayElemAt => {
            let (a, i) = (arg(0)?, arg(1)?);
            if is_nullish(a) || is_nullish(i) {
                return null;
            }
            let Some(Bson::Array(items)) = a else {
                return Err(Error::bad_value(format!(
                    "$arrayElemAt's first argument must be an array, but is {}",
                    type_name(a)
                )));
            };
            let idx = match i.as_ref().and_then(num_of) {
                Some(Num::I32(x)) => i64::from(x),
                Some(Num::I64(x)) if i32::try_from(x).is_ok() => x,
                Some(Num::F64(f)) if f.fract() == 0.0 && f.abs() <= f64::from(i32::MAX) => f as i64,
                Some(_) => {
                    return Err(Error::bad_value(format!(
                    "$arrayElemAt's second argument must be representable as a 32-bit integer: {}",
                    crate::error::render(i.as_ref().unwrap_or(&Bson::Null))
                )))
                }
                None => {
                    return Err(Error::bad_value(format!(
                        "$arrayElemAt's second argument must be a numeric value, but is {}",
                        type_name(i)
                    )))
                }
            };
            let len = items.len() as i64;
            let pos = if idx < 0 { len + idx } else { idx };
            Ok(usize::try_from(pos)
                .ok()
                .and_then(|p| items.get(p))
                .cloned())
        }
        Op::Max | Op::Min => {
            // One argument that is an array stands for its elements.
            let items: Vec<Bson> = match vals.as_slice() {
                [Some(Bson::Array(a))] => a.clone(),
                _ => vals.into_iter().flatten().collect(),
            };
            let mut best: Option<Bson> = None;
            for v in items {
                if matches!(v, Bson::Null | Bson::Undefined) {
                    continue;
                }
                best = match best {
                    None => Some(v),
                    Some(b) => {
                        let c = compare(&v, &b);
                        let take = if op == Op::Max {
                            c == Ordering::Greater
                        } else {
                            c == Ordering::Less
                        };
                        Some(if take { v } else { b })
                    }
                };
            }
            Ok(Some(best.unwrap_or(Bson::Null)))
        }
        Op::And | Op::Or | Op::Cond | Op::IfNull => Err(Error::Internal(format!(
            "{} is evaluated lazily",
            op.name()
        ))),
    }
}

fn add(vals: &[Value]) -> Result<Value> {
    let mut acc = Num::I32(0);
    let mut date: Option<i64> = None;
    for v in vals {
        if is_nullish(v) {
            return Ok(Some(Bson::Null));
        }
    }
    for v in vals.iter().flatten() {
        match v {
            Bson::DateTime(d) => {
                if date.is_some() {
                    return Err(Error::bad_value(
                        "only one date allowed in an $add expression",
                    ));
                }
                date = Some(d.timestamp_millis());
            }
            Bson::Decimal128(_) => return Err(decimal_gap(Op::Add)),
            other => match num_of(other) {
                Some(n) => acc = add_nums(acc, n),
                None => {
                    return Err(Error::type_mismatch(format!(
                        "$add only supports numeric or date types, not {}",
                        type_name(&Some(other.clone()))
                    )))
                }
            },
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
        return Ok(Some(Bson::Null));
    }
    let (Some(x), Some(y)) = (a, b) else {
        return Ok(Some(Bson::Null));
    };
    match (x, y) {
        (Bson::DateTime(p), Bson::DateTime(q)) => Ok(Some(Bson::Int64(
            p.timestamp_millis().saturating_sub(q.timestamp_millis()),
        ))),
        (Bson::DateTime(p), other) if num_of(other).is_some() => {
            let n = num_of(other).unwrap_or(Num::I32(0));
            let neg = sub_nums(Num::I32(0), n);
            Ok(Some(Bson::DateTime(bson::DateTime::from_millis(
                add_millis(p.timestamp_millis(), neg)?,
            ))))
        }
        (Bson::Decimal128(_), _) | (_, Bson::Decimal128(_)) => Err(decimal_gap(Op::Subtract)),
        _ => match (num_of(x), num_of(y)) {
            (Some(p), Some(q)) => Ok(Some(sub_nums(p, q).to_bson())),
            _ => Err(Error::type_mismatch(format!(
                "can't $subtract {} from {}",
                type_name(b),
                type_name(a)
            ))),
        },
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

/// `$round` to `place` decimal places, half to even (MongoDB's rule).
fn round(n: Num, place: i64) -> Num {
    match n {
        Num::F64(f) => {
            if !f.is_finite() || place > 15 {
                return Num::F64(f);
            }
            let scale = 10f64.powi(place as i32);
            let r = (f * scale).round_ties_even() / scale;
            Num::F64(if r.is_finite() { r } else { f })
        }
        Num::I32(_) | Num::I64(_) if place >= 0 => n,
        Num::I32(x) => round_int(i64::from(x), place)
            .map(int_or_long)
            .unwrap_or(Num::I32(x)),
        Num::I64(x) => round_int(x, place).map(Num::I64).unwrap_or(Num::I64(x)),
    }
}

fn round_int(x: i64, place: i64) -> Option<i64> {
    let q = 10i128.checked_pow(u32::try_from(-place).ok()?)?;
    let x = i128::from(x);
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

/// Days since 1970-01-01 → (year, month, day) in the proleptic Gregorian
/// calendar (Howard Hinnant's `civil_from_days`).
fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let y = yoe + era * 400;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (if m <= 2 { y + 1 } else { y }, m, d)
}

/// Approximate memory held by a value (for the `$group` / `$push` limits):
/// its BSON size plus per-node overhead, computed without serializing.
pub fn approx_size(v: &Bson) -> usize {
    let mut total = 0usize;
    let mut stack = vec![v];
    while let Some(v) = stack.pop() {
        total += 16;
        match v {
            Bson::String(s) | Bson::Symbol(s) | Bson::JavaScriptCode(s) => total += s.len(),
            Bson::Binary(b) => total += b.bytes.len(),
            Bson::Document(d) => {
                for (k, x) in d {
                    total += k.len() + 8;
                    stack.push(x);
                }
            }
            Bson::Array(a) => stack.extend(a.iter()),
            Bson::RegularExpression(r) => total += r.pattern.len() + r.options.len(),
            Bson::JavaScriptCodeWithScope(c) => {
                total += c.code.len();
                for (k, x) in &c.scope {
                    total += k.len() + 8;
                    stack.push(x);
                }
            }
            _ => {}
        }
    }
    total
}

#[cfg(test)]
mod tests {
    use super::*;
    use bson::{bson, doc};

    fn ev(spec: Bson, d: &Document) -> Result<Value> {
        Expr::parse(&spec)?.eval(&Root::Doc(d))
    }

    fn ok(spec: Bson, d: &Document) -> Bson {
        ev(spec, d)
            .expect("evaluates")
            .unwrap_or(Bson::String("MISSING".into()))
    }

    #[test]
    fn field_paths_and_arrays() {
        let d = doc! {"a": {"b": 1}, "xs": [{"v": 1}, {"w": 2}, 3, {"v": [4]}]};
        assert_eq!(ok(bson!("$a.b"), &d), bson!(1));
        assert_eq!(ok(bson!("$xs.v"), &d), bson!([1, [4]]));
        assert_eq!(ok(bson!("$nope"), &d), bson!("MISSING"));
        assert_eq!(ok(bson!("$$ROOT.a"), &d), bson!({"b": 1}));
        let raw = bson::RawDocumentBuf::try_from(&d).expect("raw");
        let e = Expr::parse(&bson!("$xs.v")).expect("parse");
        assert_eq!(
            e.eval(&Root::Raw(&raw)).expect("eval"),
            Some(bson!([1, [4]]))
        );
        assert!(Expr::parse(&bson!("$")).is_err());
        assert!(Expr::parse(&bson!("$$foo")).is_err());
        assert!(Expr::parse(&bson!("$a.$b")).is_err());
    }

    #[test]
    fn arithmetic_types() {
        let d = doc! {"i": i32::MAX, "l": i64::MAX, "f": 1.5, "n": Bson::Null};
        assert_eq!(ok(bson!({"$add": [1, 2]}), &d), bson!(3));
        assert_eq!(
            ok(bson!({"$add": ["$i", 1]}), &d),
            Bson::Int64(i64::from(i32::MAX) + 1)
        );
        assert!(matches!(
            ok(bson!({"$add": ["$l", 1]}), &d),
            Bson::Double(_)
        ));
        assert_eq!(ok(bson!({"$add": [1, "$f"]}), &d), bson!(2.5));
        assert_eq!(ok(bson!({"$add": [1, "$n"]}), &d), Bson::Null);
        assert_eq!(ok(bson!({"$add": [1, "$missing"]}), &d), Bson::Null);
        assert_eq!(
            ok(bson!({"$multiply": ["$i", 2]}), &d),
            Bson::Int64(i64::from(i32::MAX) * 2)
        );
        assert_eq!(ok(bson!({"$divide": [3, 2]}), &d), bson!(1.5));
        assert_eq!(ok(bson!({"$mod": [7, 3]}), &d), bson!(1));
        assert_eq!(ok(bson!({"$subtract": [7, 10]}), &d), bson!(-3));
        let e = ev(bson!({"$add": [1, "x"]}), &d).expect_err("type");
        assert_eq!(e.code(), 14);
        assert!(
            e.to_string()
                .contains("$add only supports numeric or date types"),
            "{e}"
        );
        assert_eq!(
            ev(bson!({"$divide": [1, 0]}), &d).expect_err("zero").code(),
            2
        );
        assert!(ev(bson!({"$subtract": [1]}), &d).is_err());
    }

    #[test]
    fn dates() {
        let t = bson::DateTime::from_millis(951_782_400_000 + 3_600_000); // 2000-02-29T01:00Z
        let d = doc! {"t": t};
        assert_eq!(ok(bson!({"$year": "$t"}), &d), bson!(2000));
        assert_eq!(ok(bson!({"$month": "$t"}), &d), bson!(2));
        assert_eq!(ok(bson!({"$dayOfMonth": {"date": "$t"}}), &d), bson!(29));
        assert_eq!(
            ok(bson!({"$subtract": ["$t", 3_600_000]}), &d),
            Bson::DateTime(bson::DateTime::from_millis(951_782_400_000))
        );
        assert_eq!(ok(bson!({"$subtract": ["$t", "$t"]}), &d), Bson::Int64(0));
        assert_eq!(ev(bson!({"$year": "x"}), &d).expect_err("type").code(), 14);
        let (y, m, dd) = civil_from_days(-1);
        assert_eq!((y, m, dd), (1969, 12, 31));
    }

    #[test]
    fn logic_and_comparison() {
        let d = doc! {"a": 5, "s": "x", "arr": [1, 2, 3]};
        assert_eq!(ok(bson!({"$gt": ["$a", 4]}), &d), bson!(true));
        assert_eq!(ok(bson!({"$eq": ["$a", 5.0]}), &d), bson!(true));
        assert_eq!(ok(bson!({"$eq": ["$missing", null]}), &d), bson!(false));
        assert_eq!(ok(bson!({"$lt": ["$missing", null]}), &d), bson!(true));
        assert_eq!(ok(bson!({"$cmp": ["$s", "y"]}), &d), bson!(-1));
        assert_eq!(ok(bson!({"$and": [1, "$s", []]}), &d), bson!(true));
        assert_eq!(ok(bson!({"$or": [0, null, "$missing"]}), &d), bson!(false));
        assert_eq!(ok(bson!({"$not": [0]}), &d), bson!(true));
        assert_eq!(
            ok(bson!({"$cond": [{"$gt": ["$a", 1]}, "big", "small"]}), &d),
            bson!("big")
        );
        assert_eq!(
            ok(bson!({"$cond": {"if": false, "then": 1, "else": 2}}), &d),
            bson!(2)
        );
        assert_eq!(
            ok(bson!({"$ifNull": ["$missing", null, "dflt"]}), &d),
            bson!("dflt")
        );
        assert_eq!(ok(bson!({"$in": [2, "$arr"]}), &d), bson!(true));
        assert_eq!(ok(bson!({"$size": "$arr"}), &d), bson!(3));
        assert_eq!(
            ev(bson!({"$size": "$a"}), &d)
                .expect_err("not array")
                .code(),
            14
        );
        assert_eq!(
            ev(bson!({"$in": [1, "$a"]}), &d)
                .expect_err("not array")
                .code(),
            2
        );
        assert_eq!(ok(bson!({"$max": "$arr"}), &d), bson!(3));
        assert_eq!(ok(bson!({"$min": [4, null, "$a", 9]}), &d), bson!(4));
        assert_eq!(ok(bson!({"$max": []}), &d), Bson::Null);
        assert_eq!(ok(bson!({"$arrayElemAt": ["$arr", -1]}), &d), bson!(3));
        assert_eq!(
            ok(bson!({"$arrayElemAt": ["$arr", 7]}), &d),
            bson!("MISSING")
        );
    }

    #[test]
    fn strings_and_rounding() {
        let d = doc! {"s": "Hello", "u": "héllo"};
        assert_eq!(
            ok(bson!({"$concat": ["$s", " ", "w"]}), &d),
            bson!("Hello w")
        );
        assert_eq!(ok(bson!({"$concat": ["$s", "$nope"]}), &d), Bson::Null);
        assert_eq!(ok(bson!({"$toUpper": "$s"}), &d), bson!("HELLO"));
        assert_eq!(ok(bson!({"$toLower": "$nope"}), &d), bson!(""));
        assert_eq!(ok(bson!({"$substr": ["$s", 1, 3]}), &d), bson!("ell"));
        assert_eq!(ok(bson!({"$substrBytes": ["$s", 2, -1]}), &d), bson!("llo"));
        assert!(ev(bson!({"$substrBytes": ["$u", 2, 1]}), &d).is_err());
        assert_eq!(ok(bson!({"$round": [2.5]}), &d), bson!(2.0));
        assert_eq!(ok(bson!({"$round": [3.5, 0]}), &d), bson!(4.0));
        assert_eq!(ok(bson!({"$round": [1.2345, 2]}), &d), bson!(1.23));
        assert_eq!(ok(bson!({"$round": [1250, -2]}), &d), bson!(1200));
        assert_eq!(ok(bson!({"$abs": -3}), &d), bson!(3));
        assert_eq!(
            ok(bson!({"$abs": i32::MIN}), &d),
            Bson::Int64(-i64::from(i32::MIN))
        );
        assert_eq!(ok(bson!({"$floor": 1.7}), &d), bson!(1.0));
        assert_eq!(ok(bson!({"$ceil": 1.2}), &d), bson!(2.0));
        assert_eq!(ok(bson!({"$literal": "$s"}), &d), bson!("$s"));
    }

    #[test]
    fn parse_errors() {
        for bad in [
            bson!({"$frob": 1}),
            bson!({"$add": 1, "$sub": 2}),
            bson!({"$cond": [1, 2]}),
            bson!({"$cond": {"if": 1, "then": 2}}),
            bson!({"a": {"$nope": 1}}),
            bson!({"$year": {"date": "$t", "timezone": "Europe/Paris"}}),
        ] {
            assert!(Expr::parse(&bad).is_err(), "{bad}");
        }
    }
}
