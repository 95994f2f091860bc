//! Evaluation of a parsed [`Expr`] against one document.
//!
//! Owns: the walk over the expression tree and the dispatch of each operator to
//! its family module. Short-circuiting operators (`$and`, `$or`, `$cond`,
//! `$ifNull`) receive their unevaluated arguments, because evaluating every
//! argument first would raise errors MongoDB never raises (`{$cond: [false,
//! {$divide: [1, 0]}, 0]}` is `0`); so does `$concat`, which stops at its
//! first null argument (as MongoDB's does) and at the size limit; every other
//! operator receives its evaluated arguments.
//!
//! Invariants: arity was checked at parse time; [`arg`] re-checks it and answers
//! an internal error rather than panicking, so a parser bug cannot crash a query.
//! Values that grow (documents and arrays built from expressions, `$concat`)
//! are measured as they are built and refused with BSONObjectTooLarge (10334)
//! the moment they pass 16 MiB: a too-large value is never completed, so the
//! memory an expression holds stays within a few times the document limit.

use bson::{Bson, Document};

use crate::doc::size::{array_element_len, SizeBudget};
use crate::error::{Error, Result};
use crate::query::expr::{arithmetic, array, compare, date, logic, string};
use crate::query::expr::{Expr, Op, Root, Value};

impl Expr {
    /// Evaluate against `root`.
    pub fn eval(&self, root: &Root<'_>) -> Result<Value> {
        match self {
            Expr::Literal(b) => Ok(Some(b.clone())),
            Expr::Field(parts) | Expr::Root(parts) => root.get(parts),
            Expr::Remove => Ok(None),
            Expr::Doc(fields) => {
                let mut out = Document::new();
                let mut size = SizeBudget::new("an expression's document");
                for (k, e) in fields {
                    if let Some(v) = e.eval(root)? {
                        size.add_element(k, &v)?;
                        out.insert(k.clone(), v);
                    }
                }
                Ok(Some(Bson::Document(out)))
            }
            Expr::Array(items) => {
                let mut out = Vec::with_capacity(items.len());
                let mut size = SizeBudget::new("an expression's array");
                for e in items {
                    // Missing inside an array literal becomes null, as in MongoDB.
                    let v = e.eval(root)?.unwrap_or(Bson::Null);
                    size.add(array_element_len(out.len(), &v))?;
                    out.push(v);
                }
                Ok(Some(Bson::Array(out)))
            }
            Expr::Op(op, args) => eval_op(*op, args, root),
        }
    }
}

fn eval_op(op: Op, args: &[Expr], root: &Root<'_>) -> Result<Value> {
    match op {
        Op::And | Op::Or | Op::Cond | Op::IfNull => logic::eval_lazy(op, args, root),
        // One argument at a time, so a too-long result is refused before it exists.
        Op::Concat => string::concat(args, root),
        _ => {
            let vals = args
                .iter()
                .map(|a| a.eval(root))
                .collect::<Result<Vec<Value>>>()?;
            apply(op, vals)
        }
    }
}

/// Apply a non-short-circuiting operator to evaluated arguments, by family.
fn apply(op: Op, vals: Vec<Value>) -> Result<Value> {
    match op {
        Op::Add
        | Op::Subtract
        | Op::Multiply
        | Op::Divide
        | Op::Mod
        | Op::Abs
        | Op::Floor
        | Op::Ceil
        | Op::Round => arithmetic::apply(op, &vals),
        Op::Eq | Op::Ne | Op::Gt | Op::Gte | Op::Lt | Op::Lte | Op::Cmp | Op::Max | Op::Min => {
            compare::apply(op, vals)
        }
        Op::Not => Ok(Some(Bson::Boolean(!logic::truthy(arg(op, &vals, 0)?)))),
        Op::In | Op::Size | Op::ArrayElemAt => array::apply(op, &vals),
        Op::ToLower | Op::ToUpper | Op::SubstrBytes => string::apply(op, &vals),
        Op::Year | Op::Month | Op::DayOfMonth => date::apply(op, &vals),
        Op::And | Op::Or | Op::Cond | Op::IfNull | Op::Concat => Err(Error::Internal(format!(
            "{} is evaluated lazily",
            op.name()
        ))),
    }
}

/// Argument `i` of `op` (arity was checked at parse time; re-checked here
/// defensively without panicking).
pub(super) fn arg(op: Op, vals: &[Value], i: usize) -> Result<&Value> {
    vals.get(i)
        .ok_or_else(|| Error::Internal(format!("{}: missing argument {i}", op.name())))
}

/// The answer of most operators to a null or missing argument.
pub(super) fn null() -> Result<Value> {
    Ok(Some(Bson::Null))
}
