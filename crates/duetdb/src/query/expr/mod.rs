//! Aggregation expressions (`"$a.b"`, `{$add: [...]}`, `{$cond: ...}`, ...):
//! parsed once from BSON into [`Expr`], then evaluated per document.
//!
//! Owns: the expression tree ([`Expr`], [`Op`], [`Named`]), the document an
//! expression reads ([`Root`], with aggregation's path rule through arrays),
//! and the aggregation notion of "missing" ([`Value`]). Parsing and variable
//! scopes live in `parse.rs` (operator names and arities in `ops.rs`);
//! evaluation in `eval.rs`, which dispatches each operator to its family:
//! `arithmetic.rs` (with `decimal.rs`), `compare.rs`, `logic.rs`, `string.rs`,
//! `regex.rs`, `array.rs`, `set.rs`, `object.rs`, `convert.rs`, `date.rs`
//! (with `datefmt.rs`), `vars.rs` (`$let $map $filter $reduce`). Used by the
//! pipeline (`query::aggregate`) for `$addFields`, `$group` keys and
//! accumulator arguments, by `query::projection` for computed `$project`
//! fields, and by `query::filter` for `$expr`.
//!
//! Invariants:
//! - A value is `Option<Bson>`; `None` means *missing* (a field that does not
//!   exist, `$$REMOVE`). Missing compares equal to `undefined` and below
//!   `null`, like MongoDB's `Value` order, and most operators treat it as null.
//! - Every comparison goes through [`crate::doc::value::compare`], so `$eq`, `$in`,
//!   `$max`, `$sort` and `$group` keys agree with filters and indexes.
//! - Arithmetic follows MongoDB: int32 ∘ int32 stays int32 unless it overflows
//!   (then int64), int64 overflow goes to double, any double makes a double,
//!   `$divide` always gives a double; any decimal128 operand makes the
//!   operation exact IEEE 754-2008 decimal128 (libdecnumber through `dec`),
//!   never approximated through a double.
//! - Variables are resolved at parse time: every `$$name` names a variable in
//!   scope (else 17276, as MongoDB), so evaluation never meets an unbound one.
//!   `$$NOW` and `$$CLUSTER_TIME` are read once per parse (one command) and
//!   are the same for every document (`$$CLUSTER_TIME` is the read's
//!   snapshot time, [`under_read_time`]); the command's `let` constants are
//!   folded in as literals.
//! - Evaluation never panics on any input: wrong types give MongoDB's codes
//!   (TypeMismatch 14, BadValue 2, or its numbered locations such as 16554)
//!   with MongoDB's wording; parsing depth is bounded ([`MAX_EXPR_DEPTH`]),
//!   and the arity of every operator is checked at parse time (and re-checked
//!   without panicking at evaluation).

/// An error at one of MongoDB's numbered assertion locations (`Location16554`).
macro_rules! loc {
    ($code:literal, $($fmt:tt)*) => {
        $crate::error::Error::Coded {
            code: $code,
            name: concat!("Location", stringify!($code)),
            msg: format!($($fmt)*),
        }
    };
}
pub(crate) use loc;

mod arithmetic;
mod array;
mod compare;
pub(crate) use compare::collation_in_scope;
pub use compare::under_collation;
mod convert;
mod date;
mod datefmt;
pub(crate) mod decimal;
mod eval;
mod logic;
mod object;
mod ops;
mod parse;
mod regex;
mod set;
mod string;
#[cfg(test)]
mod tests;
#[cfg(test)]
mod tests_more;
#[cfg(test)]
mod tests_props;
mod vars;

use bson::raw::{RawArray, RawDocument};
use bson::{Bson, Document, RawBsonRef};

use crate::error::{Error, Result};

pub use arithmetic::{num_of, Num};
pub use array::SortBy;
pub(crate) use array::{discrete_percentile, n_arg, percentiles_arg};
pub use compare::{compare, compare_values};
pub use logic::truthy_bson;
pub use ops::{Named, Op};
pub use parse::{is_expression_name, parse_field_path, under_read_time, Scope};

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

pub(crate) fn path_bson(v: &Bson, rest: &[String]) -> Value {
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
    /// A variable bound by `$let`, `$map`, `$filter` or `$reduce` (its id in
    /// the parse scope), optionally followed by a path.
    Var(u32, Vec<String>),
    /// `{a: <expr>, b: <expr>}`: a document built from expressions.
    Doc(Vec<(String, Expr)>),
    /// `[<expr>, ...]`.
    Array(Vec<Expr>),
    /// An operator with positional arguments.
    Op(Op, Vec<Expr>),
    /// An operator with named arguments (`{$dateToString: {date, format}}`),
    /// in the order of [`Named::keys`]; `None` is an argument not given.
    Named(Named, Vec<Option<Expr>>),
    /// `$let`: variables (ids) bound to values, then the body.
    Let(Vec<(u32, Expr)>, Box<Expr>),
    /// `$map`: input, the element variable, the body.
    Map(Box<Expr>, u32, Box<Expr>),
    /// `$filter`: input, the element variable, the condition, the limit.
    Filter(Box<Expr>, u32, Box<Expr>, Option<Box<Expr>>),
    /// `$reduce`: input, initial value, `$$value` and `$$this` ids, the body.
    Reduce(Box<Expr>, Box<Expr>, u32, u32, Box<Expr>),
    /// `$switch`: `(case, then)` branches, the default.
    Switch(Vec<(Expr, Expr)>, Option<Box<Expr>>),
}

impl Expr {
    /// Parse an expression with no variables but the built-in ones.
    #[cfg_attr(not(test), allow(dead_code))]
    pub fn parse(v: &Bson) -> Result<Expr> {
        parse::parse_at(v, 0, &mut Scope::new())
    }

    /// Parse an expression in `scope` (the command's `let` constants, `$$NOW`).
    pub fn parse_in(v: &Bson, scope: &mut Scope) -> Result<Expr> {
        parse::parse_at(v, 0, scope)
    }
}
/// MongoDB's type name of a value (`"missing"` for missing).
pub fn type_name(v: &Value) -> &'static str {
    v.as_ref().map_or("missing", crate::doc::types::type_name)
}

/// Null, undefined or missing: what most operators answer null for.
pub fn is_nullish(v: &Value) -> bool {
    matches!(v, None | Some(Bson::Null) | Some(Bson::Undefined))
}
