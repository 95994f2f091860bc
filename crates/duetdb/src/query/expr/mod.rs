//! Aggregation expressions (`"$a.b"`, `{$add: [...]}`, `{$cond: ...}`, ...):
//! parsed once from BSON into [`Expr`], then evaluated per document.
//!
//! Owns: the expression tree ([`Expr`], [`Op`]), its parser, the document an
//! expression reads ([`Root`], with aggregation's path rule through arrays),
//! and the aggregation notion of "missing" ([`Value`]). Evaluation lives in
//! `eval.rs`, which dispatches each operator to its family: `arithmetic.rs`,
//! `compare.rs`, `logic.rs`, `string.rs`, `array.rs`, `date.rs`. Used by the
//! pipeline (`query::aggregate`) for `$addFields`, `$group` keys and
//! accumulator arguments, and by `query::projection` for computed `$project`
//! fields.
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
//!   BadValue (2) with MongoDB's wording; parsing depth is bounded
//!   ([`MAX_EXPR_DEPTH`]), and the arity of every operator is checked at parse
//!   time (and re-checked without panicking at evaluation).

mod arithmetic;
mod array;
mod compare;
mod date;
mod eval;
mod logic;
mod string;
#[cfg(test)]
mod tests;

use bson::raw::{RawArray, RawDocument};
use bson::{Bson, Document, RawBsonRef};

use crate::error::{Error, Result};

pub use arithmetic::{num_of, Num};
pub use compare::{compare, compare_values};
pub use logic::truthy_bson;

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
            date::check_options(op, d)?;
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
