//! The typed predicate tree a filter document parses into: logical nodes
//! (`And`/`Or`/`Nor`/`Not`) over leaves that apply one operator to one dotted
//! path. `parse` builds it, `eval` runs it, `sarg` reads its top conjunction.
//!
//! Invariants (established by `parse`, relied on by `eval` and `sarg`):
//! - Constants are empty lists: `And([])` is "always true" (`{}`, `$alwaysTrue`,
//!   a `$comment`-only clause) and `Or([])` "always false" (`$alwaysFalse`,
//!   `{$all: []}`); `Node::is_always_true` also sees through nested `And`s.
//! - Negations are explicit `Not` nodes (`$ne` is `Not(Eq)`, `$nin` is
//!   `Not(In)`, `$exists: false` is `Not(Exists)`), so that each negates the
//!   whole existential over the reached values, never one value.
//! - A leaf has no path only below `Op::ElemMatchValue`, whose leaves apply to
//!   one array element.
//! - An `InSet` is sorted by `value::compare` and deduplicated (binary search
//!   relies on it), and a regex's options are sorted as BSON stores them.
//! - Paths are split once, at parse time, not per document.

use crate::query::pattern::Pattern;
use bson::spec::ElementType;
use bson::RawBson;

/// A node of the parsed filter. `And([])` is "always true", `Or([])` "always false".
#[derive(Debug, Clone)]
pub(super) enum Node {
    And(Vec<Node>),
    Or(Vec<Node>),
    Nor(Vec<Node>),
    Not(Box<Node>),
    Leaf(Leaf),
    /// `$expr`: an aggregation expression on the whole document.
    Expr(Box<super::expr::ExprNode>),
    /// `$jsonSchema`: the whole document validated against a schema.
    Schema(Box<super::schema::Schema>),
}

/// One operator applied to a path (or, inside `$elemMatch`'s value form, to the
/// array element itself: `path == None`).
#[derive(Debug, Clone)]
pub(super) struct Leaf {
    pub(super) path: Option<FieldPath>,
    pub(super) op: Op,
    /// The filter's collation, on leaves whose operands it rewrote
    /// (`Eq`/`Cmp`/`In` values hold collation keys; a reached value is keyed
    /// before it is compared: see `Filter::with_collation`).
    pub(super) coll: Option<std::sync::Arc<crate::doc::collation::Collator>>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum CmpKind {
    Lt,
    Lte,
    Gt,
    Gte,
}

#[derive(Debug, Clone)]
pub(super) enum Op {
    /// Literal equality (a regex operand is compared as a value, as `$eq` does).
    Eq(RawBson),
    /// `$lt`/`$lte`/`$gt`/`$gte` with type bracketing.
    Cmp(CmpKind, RawBson),
    In(Box<InSet>),
    Regex(Box<RegexOp>),
    /// `$exists: true` (`false` is `Not(Exists)`).
    Exists,
    /// `$type`: a bit per BSON type (see [`type_bit`]).
    Type(u32),
    Size(usize),
    Mod {
        divisor: i64,
        remainder: i64,
    },
    /// `$elemMatch: {field: …}`: some element is a document matching the node.
    ElemMatchObject(Box<Node>),
    /// `$elemMatch: {$op: …}`: some element satisfies the node's path-less leaves.
    ElemMatchValue(Box<Node>),
    /// `$bitsAllSet` / `$bitsAnySet` / `$bitsAllClear` / `$bitsAnyClear`.
    Bits(Box<super::bits::BitsOp>),
    /// `$geoWithin`, `$geoIntersects`, `$near`, `$nearSphere` (`query::geo`):
    /// applied to each reached value whole (a legacy pair is one location).
    Geo(std::sync::Arc<crate::query::geo::GeoQuery>),
}

#[derive(Debug, Clone)]
pub(super) struct InSet {
    /// Sorted by `value::compare` and deduplicated, for binary search.
    pub(super) values: Vec<RawBson>,
    /// A `null` member also matches missing and `undefined`.
    pub(super) has_null: bool,
    pub(super) regexes: Vec<RegexOp>,
}

#[derive(Debug, Clone)]
pub(super) struct RegexOp {
    /// Matched against strings; a backtracking match that passes its step
    /// limit counts as no match, as PCRE2's match limit does in MongoDB.
    pub(super) re: Pattern,
    pub(super) pattern: String,
    /// Sorted, as BSON stores regex options; used to compare with stored regexes.
    pub(super) options: String,
}

/// A dotted path split once at parse time.
#[derive(Debug, Clone)]
pub(super) struct FieldPath {
    pub(super) dotted: Box<str>,
    pub(super) parts: Box<[Part]>,
}

#[derive(Debug, Clone)]
pub(super) struct Part {
    pub(super) name: Box<str>,
    /// `Some(i)` when the component can index an array (`path::numeric_component`).
    pub(super) index: Option<usize>,
}

impl FieldPath {
    pub(super) fn new(dotted: &str) -> FieldPath {
        let parts = dotted
            .split('.')
            .map(|p| Part {
                name: p.into(),
                index: crate::doc::path::numeric_component(p),
            })
            .collect();
        FieldPath {
            dotted: dotted.into(),
            parts,
        }
    }
}

impl Node {
    pub(super) fn is_always_true(&self) -> bool {
        matches!(self, Node::And(children) if children.iter().all(Node::is_always_true))
    }
}

/// Bit of a BSON type in a `$type` mask: the type code for 1..=19, then MinKey
/// and MaxKey.
pub(super) fn type_bit(t: ElementType) -> u32 {
    let code = t as u8;
    match code {
        1..=19 => 1 << code,
        0xFF => 1 << 20,
        0x7F => 1 << 21,
        _ => 0,
    }
}

pub(super) const NUMBER_MASK: u32 = (1 << 1) | (1 << 16) | (1 << 18) | (1 << 19);
