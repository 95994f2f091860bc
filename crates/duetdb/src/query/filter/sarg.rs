//! Sargs: the predicates of a filter that an ordered index can answer, for the
//! planner. Read from the top-level conjunction of the predicate tree only.
//!
//! Invariant: a sarg is a necessary condition. Every document the filter
//! matches satisfies every returned sarg (a superset of the matches, never a
//! subset), because only conditions that all matches share are used: leaves of
//! the top-level (nested) `And`s, never anything under `Or`, `Nor` or `Not`;
//! and of those only equality, `$in` and comparisons whose operands are neither
//! arrays nor regexes (the other operators and operands do not map to plain
//! intervals of index keys).

use std::cmp::Ordering;
use std::ops::Bound;

use bson::RawBson;

use std::sync::Arc;

use super::tree::{CmpKind, Leaf, Node, Op};
use crate::doc::value;
use crate::query::geo::GeoQuery;

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

/// The sargs of a parsed filter (see `Filter::sargs`).
pub(super) fn sargs(root: &Node) -> Vec<(String, Sarg)> {
    let mut leaves = Vec::new();
    collect_conjuncts(root, &mut leaves);
    let mut out: Vec<(String, Sarg)> = Vec::new();
    for leaf in leaves {
        let Some(path) = &leaf.path else { continue };
        match &leaf.op {
            Op::Eq(v) if indexable(v) => out.push((path.dotted.to_string(), Sarg::Eq(v.clone()))),
            Op::In(set) if set.regexes.is_empty() && set.values.iter().all(indexable) => {
                out.push((path.dotted.to_string(), Sarg::In(set.values.clone())));
            }
            Op::Cmp(kind, v) if indexable(v) => merge_range(&mut out, &path.dotted, *kind, v),
            _ => {}
        }
    }
    out
}

/// The geo operators of the top-level conjunction, per path: every match
/// satisfies each (the planner's 2dsphere candidates).
pub(super) fn geo_sargs(root: &Node) -> Vec<(String, Arc<GeoQuery>)> {
    let mut leaves = Vec::new();
    collect_conjuncts(root, &mut leaves);
    leaves
        .into_iter()
        .filter_map(|leaf| match (&leaf.path, &leaf.op) {
            (Some(path), Op::Geo(g)) => Some((path.dotted.to_string(), g.clone())),
            _ => None,
        })
        .collect()
}

/// How many `$near`/`$nearSphere` the whole tree holds.
pub(super) fn count_near(node: &Node) -> usize {
    match node {
        Node::And(c) | Node::Or(c) | Node::Nor(c) => c.iter().map(count_near).sum(),
        Node::Not(n) => count_near(n),
        Node::Leaf(Leaf { op: Op::Geo(g), .. }) => usize::from(g.as_near().is_some()),
        Node::Leaf(Leaf {
            op: Op::ElemMatchObject(n) | Op::ElemMatchValue(n),
            ..
        }) => count_near(n),
        Node::Leaf(_) | Node::Expr(_) | Node::Schema(_) => 0,
    }
}

/// The leaves of the top-level conjunction (nested `And`s flattened).
fn collect_conjuncts<'a>(node: &'a Node, out: &mut Vec<&'a Leaf>) {
    match node {
        Node::And(children) => children.iter().for_each(|c| collect_conjuncts(c, out)),
        Node::Leaf(leaf) => out.push(leaf),
        Node::Or(_) | Node::Nor(_) | Node::Not(_) | Node::Expr(_) | Node::Schema(_) => {}
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
