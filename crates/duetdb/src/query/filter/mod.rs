//! Query filters: MongoDB's query language parsed once into a compact predicate
//! tree and evaluated directly on raw documents.
//!
//! Owns the meaning of every query operator (`$eq` … `$mod`, `$and`/`$or`/`$nor`,
//! `$not`, `$elemMatch`, `$all`, regexes) and the extraction of index-answerable
//! predicates ([`Filter::sargs`]) that the planner uses.
//!
//! Invariants:
//! - Every comparison goes through [`crate::doc::value`] (`compare`, `equal`,
//!   `canonical_rank`), so a filter agrees with index order and with sort.
//! - A condition on a path is existential over the values the path reaches
//!   (MongoDB's implicit array traversal, the rule of [`crate::doc::path`]): it matches
//!   when any reached value matches, and a reached array also stands for each of
//!   its elements — except for `$size`, `$elemMatch` and `$exists`, which look at
//!   the reached values themselves, and an array element picked by a final
//!   numeric component (`a.0`), which is taken whole. Negations (`$ne`, `$nin`,
//!   `$not`, `$nor`, `$exists: false`) negate the whole existential.
//! - A path that reaches nothing where a field is absent (a missing field, a
//!   scalar in the middle of the path, an array element document lacking the
//!   field) yields "missing", which only null equality (`$eq`/`$in`/`$lte`/`$gte`
//!   with `null`) matches.
//! - Parsing rejects every malformed filter with an error; `matches` never panics
//!   whatever the document's shape (malformed elements count as absent) and
//!   walks paths with callbacks instead of building per-document Vecs.
//! - Filter nesting is bounded by [`MAX_FILTER_DEPTH`], so evaluation recursion is
//!   bounded too (path walking recurses at most once per path component).
//! - [`Filter::sargs`] returns only conditions that every matching document
//!   satisfies (a superset of the matches, never a subset; see [`Sarg`]).

use std::cmp::Ordering;
use std::ops::Bound;

use bson::raw::RawDocument;
use bson::{Document, RawBson};

use crate::doc::value;
use crate::error::Result;

mod eval;
mod parse;
#[cfg(test)]
mod tests;
mod tree;
mod walk;

use eval::Ctx;
use parse::parse_query;
use tree::{CmpKind, Leaf, Node, Op};

/// How deeply `$and`/`$or`/`$nor`/`$not`/`$elemMatch` may nest (MongoDB's limit).
pub const MAX_FILTER_DEPTH: usize = 100;

/// A parsed MongoDB filter document.
#[derive(Debug, Clone)]
pub struct Filter {
    root: Node,
}

/// A predicate on one path that an ordered index can answer (a superset is fine:
/// the executor re-checks every fetched document against the whole filter).
///
/// Notes for index scans:
/// - `Eq(Null)`, an `In` holding `Null`, and a `Range` bound at `Null` inclusive
///   also match documents where the path is missing or holds `undefined`; a
///   scan must include the keys those documents get.
/// - A `Range` with both bounds may merge conditions from separate clauses
///   (`{a: {$gt: 1, $lt: 5}}`). On a multikey path each clause may be satisfied by
///   a different array element (`{a: [0, 10]}` matches), so a scan over a
///   multikey index must use only one of the two bounds.
#[derive(Debug, Clone, PartialEq)]
pub enum Sarg {
    /// `{p: v}` / `{p: {$eq: v}}` with `v` neither an array nor a regex.
    Eq(RawBson),
    /// `{p: {$in: [...]}}` whose values are neither arrays nor regexes.
    In(Vec<RawBson>),
    /// `$gt`/`$gte`/`$lt`/`$lte` on one path, merged (values neither arrays nor regexes).
    Range {
        lower: std::ops::Bound<RawBson>,
        upper: std::ops::Bound<RawBson>,
    },
}

impl Filter {
    /// Parse a filter document; unknown operators and malformed arguments are errors.
    pub fn parse(spec: &Document) -> Result<Filter> {
        Ok(Filter {
            root: parse_query(spec, 0).map_err(|e| *e)?,
        })
    }

    /// True when the filter matches every document (`{}`).
    pub fn is_match_all(&self) -> bool {
        self.root.is_always_true()
    }

    /// Does `doc` match?
    pub fn matches(&self, doc: &RawDocument) -> bool {
        self.root.eval(Ctx::Doc(doc))
    }

    /// Index-answerable predicates of the top-level conjunction, per path.
    ///
    /// Only conditions every matching document satisfies are returned: top-level
    /// fields and members of (nested) top-level `$and`s. Nothing comes from
    /// negations, `$exists`, regexes, `$elemMatch` or `$or`/`$nor`.
    pub fn sargs(&self) -> Vec<(String, Sarg)> {
        let mut leaves = Vec::new();
        collect_conjuncts(&self.root, &mut leaves);
        let mut out: Vec<(String, Sarg)> = Vec::new();
        for leaf in leaves {
            let Some(path) = &leaf.path else { continue };
            match &leaf.op {
                Op::Eq(v) if indexable(v) => {
                    out.push((path.dotted.to_string(), Sarg::Eq(v.clone())))
                }
                Op::In(set) if set.regexes.is_empty() && set.values.iter().all(indexable) => {
                    out.push((path.dotted.to_string(), Sarg::In(set.values.clone())));
                }
                Op::Cmp(kind, v) if indexable(v) => merge_range(&mut out, &path.dotted, *kind, v),
                _ => {}
            }
        }
        out
    }
}

// ---------------------------------------------------------------------------
// Sargs
// ---------------------------------------------------------------------------

/// The leaves of the top-level conjunction (nested `And`s flattened).
fn collect_conjuncts<'a>(node: &'a Node, out: &mut Vec<&'a Leaf>) {
    match node {
        Node::And(children) => children.iter().for_each(|c| collect_conjuncts(c, out)),
        Node::Leaf(leaf) => out.push(leaf),
        Node::Or(_) | Node::Nor(_) | Node::Not(_) => {}
    }
}

fn indexable(v: &RawBson) -> bool {
    !matches!(v, RawBson::Array(_) | RawBson::RegularExpression(_))
}

/// Tighten (or create) the range sarg of `path` with one comparison.
fn merge_range(out: &mut Vec<(String, Sarg)>, path: &str, kind: CmpKind, v: &RawBson) {
    let slot = out
        .iter_mut()
        .find(|(p, s)| p == path && matches!(s, Sarg::Range { .. }));
    let (lower, upper) = match slot {
        Some((_, Sarg::Range { lower, upper })) => (lower, upper),
        _ => {
            out.push((
                path.to_string(),
                Sarg::Range {
                    lower: Bound::Unbounded,
                    upper: Bound::Unbounded,
                },
            ));
            match out.last_mut() {
                Some((_, Sarg::Range { lower, upper })) => (lower, upper),
                _ => return,
            }
        }
    };
    match kind {
        CmpKind::Gt => tighten(lower, Bound::Excluded(v.clone()), Ordering::Greater),
        CmpKind::Gte => tighten(lower, Bound::Included(v.clone()), Ordering::Greater),
        CmpKind::Lt => tighten(upper, Bound::Excluded(v.clone()), Ordering::Less),
        CmpKind::Lte => tighten(upper, Bound::Included(v.clone()), Ordering::Less),
    }
}

/// Replace `cur` with `new` when `new` is tighter: its value is further in the
/// `tighter` direction, or equal and exclusive.
fn tighten(cur: &mut Bound<RawBson>, new: Bound<RawBson>, tighter: Ordering) {
    let replace = match (&*cur, &new) {
        (Bound::Unbounded, _) => true,
        (Bound::Included(c) | Bound::Excluded(c), Bound::Included(n) | Bound::Excluded(n)) => {
            match value::compare(n.as_raw_bson_ref(), c.as_raw_bson_ref()) {
                Ordering::Equal => matches!(new, Bound::Excluded(_)),
                ord => ord == tighter,
            }
        }
        (_, Bound::Unbounded) => false,
    };
    if replace {
        *cur = new;
    }
}
