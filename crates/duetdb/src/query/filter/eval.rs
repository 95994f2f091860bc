//! Evaluation of the predicate tree on raw documents: what each operator means
//! for one candidate value, and how nodes and leaves combine those answers.
//!
//! Invariants:
//! - Every comparison goes through `crate::doc::value` (`compare`, `equal`,
//!   `canonical_rank`), so a filter agrees with index order and with sort.
//! - A leaf on a path is an existential over the values `walk` reaches (arrays
//!   expanded unless the operator looks at arrays themselves: `$size`,
//!   `$elemMatch`, `$exists`); `Not` above it negates the whole existential.
//! - "Missing" (`None`) is a candidate too: of the value operators only null
//!   equality (`$eq`/`$in`/`$lte`/`$gte` with `null`) accepts it, and `$exists`
//!   holds when some candidate is not missing.
//! - Nothing here panics whatever the document's shape (malformed elements
//!   count as absent) or builds per-document Vecs (paths are walked with
//!   callbacks); recursion is bounded by the parse-time nesting limit.

use std::cmp::Ordering;

use bson::raw::RawDocument;
use bson::RawBsonRef;

use super::tree::{type_bit, CmpKind, InSet, Leaf, Node, Op, RegexOp};
use super::walk::{walk_doc, walk_doc_at};
use crate::doc::collation::has_strings;
use crate::doc::value::{self, Num};

/// What a node is evaluated against.
#[derive(Clone, Copy)]
pub(super) enum Ctx<'a> {
    /// A document whose paths the leaves walk.
    Doc(&'a RawDocument),
    /// One array element, for `$elemMatch: {$op: …}` (no array expansion, as in MongoDB).
    Elem(RawBsonRef<'a>),
}

impl Node {
    pub(super) fn eval(&self, ctx: Ctx<'_>) -> bool {
        match self {
            Node::And(children) => children.iter().all(|c| c.eval(ctx)),
            Node::Or(children) => children.iter().any(|c| c.eval(ctx)),
            Node::Nor(children) => !children.iter().any(|c| c.eval(ctx)),
            Node::Not(child) => !child.eval(ctx),
            Node::Leaf(leaf) => leaf.eval(ctx),
            Node::Expr(e) => match ctx {
                Ctx::Doc(d) => e.matches(d),
                Ctx::Elem(_) => false,
            },
            Node::Schema(s) => match ctx {
                Ctx::Doc(d) => crate::doc::to_document(d)
                    .is_ok_and(|doc| s.matches(&bson::Bson::Document(doc))),
                Ctx::Elem(_) => false,
            },
        }
    }
}

impl Node {
    /// [`Node::eval`] on a document that also records, in `pos`, the array
    /// position a leaf matched through (MongoDB's `MatchDetails`
    /// `elemMatchKey`): conjunctions pass it down and the last leaf that
    /// matched through an array sets it; `$or`, `$nor`, negations, `$expr`
    /// and `$jsonSchema` record nothing, as MongoDB's do.
    pub(super) fn eval_pos(&self, doc: &RawDocument, pos: &mut Option<usize>) -> bool {
        match self {
            Node::And(children) => children.iter().all(|c| c.eval_pos(doc, pos)),
            Node::Leaf(leaf) => leaf.eval_pos(doc, pos),
            other => other.eval(Ctx::Doc(doc)),
        }
    }
}

impl Leaf {
    fn eval_pos(&self, doc: &RawDocument, pos: &mut Option<usize>) -> bool {
        let Some(path) = &self.path else {
            return false;
        };
        let op = &self.op;
        let mut found = None;
        let hit = walk_doc_at(
            doc,
            &path.parts,
            op.expands_arrays(),
            true,
            None,
            &mut |item, at| {
                if let Some(k) = op.elem_match_position(item) {
                    found = at.or(Some(k));
                    return true;
                }
                if !matches!(op, Op::ElemMatchObject(_) | Op::ElemMatchValue(_))
                    && self.matches_item(item)
                {
                    found = at;
                    return true;
                }
                false
            },
        );
        if hit && found.is_some() {
            *pos = found;
        }
        hit
    }

    fn eval(&self, ctx: Ctx<'_>) -> bool {
        match (&self.path, ctx) {
            (Some(path), Ctx::Doc(doc)) => {
                let op = &self.op;
                walk_doc(doc, &path.parts, op.expands_arrays(), true, &mut |item| {
                    self.matches_item(item)
                })
            }
            (None, Ctx::Elem(v)) => self.matches_item(Some(v)),
            // The parser builds path-less leaves only under `ElemMatchValue` and
            // evaluates those only on elements; any other pairing cannot match.
            _ => false,
        }
    }
}

impl Leaf {
    /// [`Op::matches_item`], comparing under the leaf's collation: a reached
    /// value holding strings is compared through its collation key (the
    /// operands already are keys); regexes still see the strings themselves.
    fn matches_item(&self, item: Option<RawBsonRef<'_>>) -> bool {
        let Some(c) = &self.coll else {
            return self.op.matches_item(item);
        };
        match (item, &self.op) {
            (Some(v), Op::Eq(_) | Op::Cmp(..) | Op::In(_)) if has_strings(v) => {
                let key = c.key_raw(v);
                if let Op::In(set) = &self.op {
                    let k = key.as_raw_bson_ref();
                    return set
                        .values
                        .binary_search_by(|probe| value::compare(probe.as_raw_bson_ref(), k))
                        .is_ok()
                        || set.regexes.iter().any(|re| re.matches(v));
                }
                self.op.matches_item(Some(key.as_raw_bson_ref()))
            }
            _ => self.op.matches_item(item),
        }
    }
}

impl Op {
    /// Whether a reached array also stands for each of its elements.
    fn expands_arrays(&self) -> bool {
        !matches!(
            self,
            Op::Exists | Op::Size(_) | Op::ElemMatchObject(_) | Op::ElemMatchValue(_) | Op::Geo(_)
        )
    }

    /// For `$elemMatch`: the position of the first element of the array
    /// `item` that matches, `None` otherwise (and for every other operator).
    fn elem_match_position(&self, item: Option<RawBsonRef<'_>>) -> Option<usize> {
        let Some(RawBsonRef::Array(a)) = item else {
            return None;
        };
        let mut elems = a
            .into_iter()
            .enumerate()
            .filter_map(|(k, e)| e.ok().map(|e| (k, e)));
        match self {
            Op::ElemMatchObject(node) => elems
                .find(|(_, e)| matches!(e, RawBsonRef::Document(d) if node.eval(Ctx::Doc(d))))
                .map(|(k, _)| k),
            Op::ElemMatchValue(node) => elems
                .find(|(_, e)| node.eval(Ctx::Elem(*e)))
                .map(|(k, _)| k),
            _ => None,
        }
    }

    /// Does one candidate (`None` = missing) satisfy the operator?
    fn matches_item(&self, item: Option<RawBsonRef<'_>>) -> bool {
        match self {
            Op::Eq(operand) => eq_matches(operand.as_raw_bson_ref(), item),
            Op::Cmp(kind, operand) => cmp_matches(*kind, operand.as_raw_bson_ref(), item),
            Op::In(set) => set.matches(item),
            Op::Regex(re) => item.is_some_and(|v| re.matches(v)),
            Op::Exists => item.is_some(),
            Op::Type(mask) => item.is_some_and(|v| mask & type_bit(v.element_type()) != 0),
            Op::Size(n) => match item {
                // `take` keeps a huge array from being counted past the answer.
                Some(RawBsonRef::Array(a)) => a.into_iter().take(n.saturating_add(1)).count() == *n,
                _ => false,
            },
            Op::Mod { divisor, remainder } => {
                item.is_some_and(|v| mod_matches(v, *divisor, *remainder))
            }
            Op::Bits(b) => item.is_some_and(|v| b.matches(v)),
            Op::Geo(g) => item.is_some_and(|v| g.matches_value(v)),
            Op::ElemMatchObject(node) => match item {
                Some(RawBsonRef::Array(a)) => a.into_iter().flatten().any(|e| match e {
                    RawBsonRef::Document(d) => node.eval(Ctx::Doc(d)),
                    _ => false,
                }),
                _ => false,
            },
            Op::ElemMatchValue(node) => match item {
                Some(RawBsonRef::Array(a)) => {
                    a.into_iter().flatten().any(|e| node.eval(Ctx::Elem(e)))
                }
                _ => false,
            },
        }
    }
}

fn eq_matches(operand: RawBsonRef<'_>, item: Option<RawBsonRef<'_>>) -> bool {
    match item {
        // Null equality matches missing fields and `undefined`, as in MongoDB.
        None => matches!(operand, RawBsonRef::Null),
        Some(RawBsonRef::Undefined) if matches!(operand, RawBsonRef::Null) => true,
        Some(v) => value::equal(v, operand),
    }
}

fn cmp_matches(kind: CmpKind, operand: RawBsonRef<'_>, item: Option<RawBsonRef<'_>>) -> bool {
    let inclusive = matches!(kind, CmpKind::Lte | CmpKind::Gte);
    let Some(v) = item else {
        return inclusive && matches!(operand, RawBsonRef::Null);
    };
    let (rv, ro) = (value::canonical_rank(v), value::canonical_rank(operand));
    if rv != ro {
        // Type bracketing: values of another type never satisfy a comparison,
        // except null/undefined (treated alike) and MinKey/MaxKey operands, which
        // compare against every type.
        if matches!((rv, ro), (1, 2) | (2, 1)) {
            return inclusive;
        }
        return match operand {
            RawBsonRef::MinKey => matches!(kind, CmpKind::Gt | CmpKind::Gte),
            RawBsonRef::MaxKey => matches!(kind, CmpKind::Lt | CmpKind::Lte),
            _ => false,
        };
    }
    if value::is_number(v) {
        // NaN equals NaN but is neither less nor greater than any number in a
        // query, although it sorts first.
        let (nv, no) = (is_nan(v), is_nan(operand));
        if nv || no {
            return inclusive && nv && no;
        }
    }
    let ord = value::compare(v, operand);
    match kind {
        CmpKind::Lt => ord == Ordering::Less,
        CmpKind::Lte => ord != Ordering::Greater,
        CmpKind::Gt => ord == Ordering::Greater,
        CmpKind::Gte => ord != Ordering::Less,
    }
}

fn is_nan(v: RawBsonRef<'_>) -> bool {
    matches!(Num::of(v), Num::Float(f) if f.is_nan())
}

fn mod_matches(v: RawBsonRef<'_>, divisor: i64, remainder: i64) -> bool {
    if !value::is_number(v) {
        return false;
    }
    let n = match Num::of(v) {
        Num::Int(i) => i,
        // NaN and infinities have no remainder; other doubles truncate toward
        // zero (saturating at the i64 range) as MongoDB does.
        Num::Float(f) if f.is_finite() => f.trunc() as i64,
        Num::Float(_) => return false,
    };
    // i64::MIN % -1 overflows; mathematically the remainder is 0.
    n.checked_rem(divisor).unwrap_or(0) == remainder
}

impl InSet {
    fn matches(&self, item: Option<RawBsonRef<'_>>) -> bool {
        let Some(v) = item else {
            return self.has_null;
        };
        if self.has_null && matches!(v, RawBsonRef::Undefined) {
            return true;
        }
        self.values
            .binary_search_by(|probe| value::compare(probe.as_raw_bson_ref(), v))
            .is_ok()
            || self.regexes.iter().any(|re| re.matches(v))
    }
}

impl RegexOp {
    /// Strings and symbols are matched by pattern; a stored regex matches when it
    /// is the same regex (pattern and options), as in MongoDB.
    fn matches(&self, v: RawBsonRef<'_>) -> bool {
        match v {
            RawBsonRef::String(s) | RawBsonRef::Symbol(s) => self.re.is_match(s).unwrap_or(false),
            RawBsonRef::RegularExpression(r) => {
                r.pattern.as_str() == self.pattern && r.options.as_str() == self.options
            }
            _ => false,
        }
    }
}
