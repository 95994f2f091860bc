//! Conditions on one array element: `$pull`'s argument and the `$elemMatch`
//! projection share this form ([`ElemCond`]).
//!
//! Invariants:
//! - a plain value matches by [`crate::doc::value::equal_bson`] (numbers by value);
//! - comparison operators follow query semantics: they hold only within one
//!   type bracket, and an array element matches when it or one of its elements
//!   does;
//! - any other operator is evaluated by the filter engine ([`Filter`]) on the
//!   element wrapped as `{v: element}`, so `$pull` and `find` agree;
//! - under a collation ([`ElemCond::with_collation`]) strings compare by it:
//!   plain values and comparison operands are held as collation keys and
//!   each element is keyed before it is compared (as filters do), filters
//!   take it through [`Filter::with_collation`].

use std::cmp::Ordering;
use std::sync::Arc;

use bson::{Bson, Document, RawDocumentBuf};

use crate::doc::collation::Collator;
use crate::doc::value;
use crate::error::{Error, Result};
use crate::query::filter::Filter;

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
    /// `Equal` or `Ops` under a collation: their operands are keys, and each
    /// element is keyed before the inner condition sees it.
    Collated(Box<ElemCond>, Arc<Collator>),
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

    /// This (freshly parsed) condition comparing strings under `c`, as
    /// MongoDB's `$pull` and `$elemMatch` projection use the command's
    /// collation; `None` keeps it binary.
    pub(crate) fn with_collation(self, c: Option<Arc<Collator>>) -> ElemCond {
        let Some(c) = c else {
            return self;
        };
        match self {
            ElemCond::Equal(v) => ElemCond::Collated(Box::new(ElemCond::Equal(c.key_bson(&v))), c),
            ElemCond::Ops(ops) => ElemCond::Collated(
                Box::new(ElemCond::Ops(
                    ops.into_iter()
                        .map(|(op, v)| (op, c.key_bson(&v)))
                        .collect(),
                )),
                c,
            ),
            ElemCond::Wrapped(f) => ElemCond::Wrapped(f.with_collation(Some(c))),
            ElemCond::Query(f) => ElemCond::Query(f.with_collation(Some(c))),
            collated @ ElemCond::Collated(..) => collated,
        }
    }

    pub(crate) fn matches(&self, elem: &Bson) -> bool {
        match self {
            ElemCond::Collated(inner, c) => inner.matches(&c.key_bson(elem)),
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
pub(super) fn exact_equal(a: &Bson, b: &Bson) -> bool {
    value::equal_bson(a, b)
}

/// One comparison operator against one element (`$ne`/`$nin` negate `$eq`/`$in`).
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

/// `x` against `arg` for a range/equality operator, within one type bracket.
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
