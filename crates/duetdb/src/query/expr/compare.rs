//! Comparison operators: `$eq $ne $gt $gte $lt $lte $cmp`, and `$max`/`$min`
//! (as expressions, not accumulators).
//!
//! Invariants: every comparison goes through [`crate::doc::value`]'s order, so
//! these operators agree with filters, indexes, `$sort` and `$group` keys;
//! missing compares as `undefined` (below null); strings compare under the
//! command's collation when one is in scope on this thread
//! ([`under_collation`], set by the executors of a collated command: a
//! filter's `$expr`, an aggregation), else bytewise.

use std::cell::RefCell;
use std::cmp::Ordering;
use std::sync::Arc;

use bson::Bson;

use crate::doc::collation::Collator;
use crate::doc::value;
use crate::error::Result;
use crate::query::expr::eval::arg;
use crate::query::expr::{num_of, Op, Value};

/// Compare two values in MongoDB's order, missing as undefined.
pub fn compare_values(a: &Value, b: &Value) -> Ordering {
    let a = a.as_ref().unwrap_or(&Bson::Undefined);
    let b = b.as_ref().unwrap_or(&Bson::Undefined);
    compare(a, b)
}

thread_local! {
    /// The collation of the command whose expressions this thread is
    /// evaluating (`None`: simple, binary). Set only by [`under_collation`],
    /// which restores the previous one when it returns or unwinds.
    static COLLATION: RefCell<Option<Arc<Collator>>> = const { RefCell::new(None) };
}

/// Run `f` with every expression comparison on this thread (`$eq`, `$lt`,
/// `$cmp`, `$in`, set operators, `$sortArray`, `$max`/`$min`, so also
/// `$bucket`'s boundaries and `$switch`es built on them) comparing strings
/// under `c`, as MongoDB's expressions use the command's collation. `None`
/// leaves the current one in place.
pub fn under_collation<R>(c: Option<&Arc<Collator>>, f: impl FnOnce() -> R) -> R {
    struct Restore(Option<Arc<Collator>>);
    impl Drop for Restore {
        fn drop(&mut self) {
            let old = self.0.take();
            COLLATION.with(|s| *s.borrow_mut() = old);
        }
    }
    let Some(c) = c else {
        return f();
    };
    let _restore = Restore(COLLATION.with(|s| s.borrow_mut().replace(c.clone())));
    f()
}

/// The collation in scope on this thread ([`under_collation`]), if any: for
/// the other value comparisons of a collated command (update operators).
pub(crate) fn collation_in_scope() -> Option<Arc<Collator>> {
    COLLATION.with(|s| s.borrow().clone())
}

/// [`value::compare`] on owned values without cloning the common scalar
/// cases; strings under the collation in scope ([`under_collation`]).
pub fn compare(a: &Bson, b: &Bson) -> Ordering {
    match (num_of(a), num_of(b)) {
        (Some(x), Some(y)) => value::compare_numbers(x.lift(), y.lift()),
        _ => {
            if let Some(o) = collated(a, b) {
                return o;
            }
            match (a, b) {
                (Bson::String(x), Bson::String(y)) => x.as_bytes().cmp(y.as_bytes()),
                _ => value::compare_bson(a, b),
            }
        }
    }
}

/// `a` against `b` under the collation in scope, when there is one and
/// either may hold a string.
fn collated(a: &Bson, b: &Bson) -> Option<Ordering> {
    let may_hold = |v: &Bson| {
        matches!(
            v,
            Bson::String(_) | Bson::Symbol(_) | Bson::Document(_) | Bson::Array(_)
        )
    };
    if !may_hold(a) && !may_hold(b) {
        return None;
    }
    COLLATION.with(|s| {
        let g = s.borrow();
        let c = g.as_ref()?;
        Some(match (a, b) {
            (Bson::String(x) | Bson::Symbol(x), Bson::String(y) | Bson::Symbol(y)) => {
                c.compare_str(x, y)
            }
            _ => value::compare_bson(&c.key_bson(a), &c.key_bson(b)),
        })
    })
}

/// Apply a comparison operator to its evaluated arguments.
pub(super) fn apply(op: Op, vals: Vec<Value>) -> Result<Value> {
    match op {
        Op::Max | Op::Min => Ok(Some(extreme(op, vals))),
        Op::Cmp => Ok(Some(Bson::Int32(
            match compare_values(arg(op, &vals, 0)?, arg(op, &vals, 1)?) {
                Ordering::Less => -1,
                Ordering::Equal => 0,
                Ordering::Greater => 1,
            },
        ))),
        _ => {
            let c = compare_values(arg(op, &vals, 0)?, arg(op, &vals, 1)?);
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
    }
}

/// `$max` / `$min`: null and missing are skipped; none left gives null. One
/// argument that is an array stands for its elements.
fn extreme(op: Op, vals: Vec<Value>) -> Bson {
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
    best.unwrap_or(Bson::Null)
}

#[cfg(test)]
mod tests {
    use super::*;
    use bson::doc;

    fn ci() -> Arc<Collator> {
        Collator::from_document(&doc! {"locale": "en", "strength": 2})
            .expect("valid")
            .expect("not simple")
    }

    fn eq(a: &str, b: &str) -> bool {
        compare(&Bson::String(a.into()), &Bson::String(b.into())) == Ordering::Equal
    }

    #[test]
    fn a_collation_is_in_scope_only_inside_under_collation() {
        assert!(!eq("a", "A"));
        let c = ci();
        under_collation(Some(&c), || {
            assert!(eq("a", "A"));
            // Strings inside documents and arrays too.
            let x = Bson::Document(doc! {"k": ["A"]});
            let y = Bson::Document(doc! {"k": ["a"]});
            assert_eq!(compare(&x, &y), Ordering::Equal);
            // `None` keeps the one in scope.
            under_collation(None, || assert!(eq("a", "A")));
        });
        assert!(!eq("a", "A"));
    }

    #[test]
    fn an_unwinding_evaluation_restores_the_previous_collation() {
        let c = ci();
        let r = std::panic::catch_unwind(|| under_collation(Some(&c), || panic!("boom")));
        assert!(r.is_err());
        assert!(!eq("a", "A"));
    }
}
