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

use bson::raw::{RawArray, RawDocument};
use bson::spec::ElementType;
use bson::{Bson, Document, RawBson, RawBsonRef};
use regex::{Regex, RegexBuilder};

use crate::doc::value::{self, Num};
use crate::error::{render, Error, Result};

/// How deeply `$and`/`$or`/`$nor`/`$not`/`$elemMatch` may nest (MongoDB's limit).
pub const MAX_FILTER_DEPTH: usize = 100;

/// Upper bound on the compiled size of one regex, so that a hostile pattern
/// cannot take unbounded memory.
const REGEX_SIZE_LIMIT: usize = 4 << 20;

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
// The predicate tree
// ---------------------------------------------------------------------------

/// A node of the parsed filter. `And([])` is "always true", `Or([])` "always false".
#[derive(Debug, Clone)]
enum Node {
    And(Vec<Node>),
    Or(Vec<Node>),
    Nor(Vec<Node>),
    Not(Box<Node>),
    Leaf(Leaf),
}

/// One operator applied to a path (or, inside `$elemMatch`'s value form, to the
/// array element itself: `path == None`).
#[derive(Debug, Clone)]
struct Leaf {
    path: Option<FieldPath>,
    op: Op,
}

/// What a node is evaluated against.
#[derive(Clone, Copy)]
enum Ctx<'a> {
    /// A document whose paths the leaves walk.
    Doc(&'a RawDocument),
    /// One array element, for `$elemMatch: {$op: …}` (no array expansion, as in MongoDB).
    Elem(RawBsonRef<'a>),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum CmpKind {
    Lt,
    Lte,
    Gt,
    Gte,
}

#[derive(Debug, Clone)]
enum Op {
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
}

#[derive(Debug, Clone)]
struct InSet {
    /// Sorted by `value::compare` and deduplicated, for binary search.
    values: Vec<RawBson>,
    /// A `null` member also matches missing and `undefined`.
    has_null: bool,
    regexes: Vec<RegexOp>,
}

#[derive(Debug, Clone)]
struct RegexOp {
    re: Regex,
    pattern: String,
    /// Sorted, as BSON stores regex options; used to compare with stored regexes.
    options: String,
}

/// A dotted path split once at parse time.
#[derive(Debug, Clone)]
struct FieldPath {
    dotted: Box<str>,
    parts: Box<[Part]>,
}

#[derive(Debug, Clone)]
struct Part {
    name: Box<str>,
    /// `Some(i)` when the component can index an array (`path::numeric_component`).
    index: Option<usize>,
}

impl FieldPath {
    fn new(dotted: &str) -> FieldPath {
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
    fn is_always_true(&self) -> bool {
        matches!(self, Node::And(children) if children.iter().all(Node::is_always_true))
    }

    fn eval(&self, ctx: Ctx<'_>) -> bool {
        match self {
            Node::And(children) => children.iter().all(|c| c.eval(ctx)),
            Node::Or(children) => children.iter().any(|c| c.eval(ctx)),
            Node::Nor(children) => !children.iter().any(|c| c.eval(ctx)),
            Node::Not(child) => !child.eval(ctx),
            Node::Leaf(leaf) => leaf.eval(ctx),
        }
    }
}

impl Leaf {
    fn eval(&self, ctx: Ctx<'_>) -> bool {
        match (&self.path, ctx) {
            (Some(path), Ctx::Doc(doc)) => {
                let op = &self.op;
                walk_doc(doc, &path.parts, op.expands_arrays(), true, &mut |item| {
                    op.matches_item(item)
                })
            }
            (None, Ctx::Elem(v)) => self.op.matches_item(Some(v)),
            // The parser builds path-less leaves only under `ElemMatchValue` and
            // evaluates those only on elements; any other pairing cannot match.
            _ => false,
        }
    }
}

impl Op {
    /// Whether a reached array also stands for each of its elements.
    fn expands_arrays(&self) -> bool {
        !matches!(
            self,
            Op::Exists | Op::Size(_) | Op::ElemMatchObject(_) | Op::ElemMatchValue(_)
        )
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
    fn new(pattern: &str, options: &str) -> PResult<RegexOp> {
        let mut builder = RegexBuilder::new(pattern);
        builder.size_limit(REGEX_SIZE_LIMIT);
        let mut sorted: Vec<char> = Vec::with_capacity(options.len());
        for c in options.chars() {
            match c {
                'i' => builder.case_insensitive(true),
                'm' => builder.multi_line(true),
                's' => builder.dot_matches_new_line(true),
                'x' => builder.ignore_whitespace(true),
                // Unicode classes are the regex crate's default already.
                'u' => &mut builder,
                other => return Err(bad(format!("invalid flag in regex options: {other}"))),
            };
            if !sorted.contains(&c) {
                sorted.push(c);
            }
        }
        sorted.sort_unstable();
        let re = builder
            .build()
            .map_err(|e| bad(format!("Regular expression is invalid: {e}")))?;
        Ok(RegexOp {
            re,
            pattern: pattern.to_string(),
            options: sorted.into_iter().collect(),
        })
    }

    fn from_bson(r: &bson::Regex) -> PResult<RegexOp> {
        RegexOp::new(r.pattern.as_str(), r.options.as_str())
    }

    /// Strings and symbols are matched by pattern; a stored regex matches when it
    /// is the same regex (pattern and options), as in MongoDB.
    fn matches(&self, v: RawBsonRef<'_>) -> bool {
        match v {
            RawBsonRef::String(s) | RawBsonRef::Symbol(s) => self.re.is_match(s),
            RawBsonRef::RegularExpression(r) => {
                r.pattern.as_str() == self.pattern && r.options.as_str() == self.options
            }
            _ => false,
        }
    }
}

/// Bit of a BSON type in a `$type` mask: the type code for 1..=19, then MinKey
/// and MaxKey.
fn type_bit(t: ElementType) -> u32 {
    let code = t as u8;
    match code {
        1..=19 => 1 << code,
        0xFF => 1 << 20,
        0x7F => 1 << 21,
        _ => 0,
    }
}

const NUMBER_MASK: u32 = (1 << 1) | (1 << 16) | (1 << 18) | (1 << 19);

// ---------------------------------------------------------------------------
// Path walking over raw documents
// ---------------------------------------------------------------------------
//
// Same traversal as `crate::doc::path`, written as callbacks so that a scan does not
// build a Vec per document, and extended with "missing" items (`None`) that
// null equality and `$exists` need. `f` returns true to stop (a match was
// found); every walker returns whether it stopped.

/// Walk `parts` from `doc`. `yield_missing` is false when `doc` is an array
/// element reached while looking for a numeric component: `{a: [{x: 1}]}` has
/// no "missing" `a.0`, it has the element `{x: 1}`.
fn walk_doc<'a, F>(
    doc: &'a RawDocument,
    parts: &[Part],
    expand: bool,
    yield_missing: bool,
    f: &mut F,
) -> bool
where
    F: FnMut(Option<RawBsonRef<'a>>) -> bool,
{
    let Some((first, rest)) = parts.split_first() else {
        return false;
    };
    // Byte-compared lookup (see `rawfield`); a malformed element is absent:
    // `matches` must not fail.
    match crate::doc::rawfield::field(doc, &first.name) {
        Some(v) => walk_value(v, rest, expand, f),
        None => yield_missing && f(None),
    }
}

fn walk_value<'a, F>(v: RawBsonRef<'a>, rest: &[Part], expand: bool, f: &mut F) -> bool
where
    F: FnMut(Option<RawBsonRef<'a>>) -> bool,
{
    if rest.is_empty() {
        if expand {
            if let RawBsonRef::Array(a) = v {
                if a.into_iter().flatten().any(|e| f(Some(e))) {
                    return true;
                }
            }
        }
        return f(Some(v));
    }
    match v {
        RawBsonRef::Document(d) => walk_doc(d, rest, expand, true, f),
        RawBsonRef::Array(a) => walk_array(a, rest, expand, f),
        // A scalar in the middle of the path: the rest of the path is missing.
        _ => f(None),
    }
}

fn walk_array<'a, F>(a: &'a RawArray, rest: &[Part], expand: bool, f: &mut F) -> bool
where
    F: FnMut(Option<RawBsonRef<'a>>) -> bool,
{
    let Some((first, tail)) = rest.split_first() else {
        return false;
    };
    // A numeric component selects that element (positionally: when it ends the
    // path, an array element is taken whole, not expanded, as in MongoDB)…
    if let Some(i) = first.index {
        if let Ok(Some(elem)) = a.get(i) {
            let stop = if tail.is_empty() {
                f(Some(elem))
            } else {
                walk_value(elem, tail, expand, f)
            };
            if stop {
                return true;
            }
        }
    }
    // …and is also a field name inside element documents; other elements
    // (scalars, nested arrays) are not traversed, as in MongoDB.
    for elem in a.into_iter().flatten() {
        if let RawBsonRef::Document(d) = elem {
            if walk_doc(d, rest, expand, first.index.is_none(), f) {
                return true;
            }
        }
    }
    false
}

// ---------------------------------------------------------------------------
// Parsing
// ---------------------------------------------------------------------------

/// Parse results carry a boxed error: `Error` is large, and the parse functions
/// recurse once per nesting level, so a small `Result` keeps their stack frames
/// small (see the note above `parse_query`).
type PResult<T> = std::result::Result<T, Box<Error>>;

#[cold]
fn bad(msg: impl Into<String>) -> Box<Error> {
    Box::new(Error::bad_value(msg))
}

#[cold]
fn unknown(op: &str) -> Box<Error> {
    Box::new(Error::UnknownOperator(op.to_string()))
}

#[cold]
fn mismatch(msg: impl Into<String>) -> Box<Error> {
    Box::new(Error::type_mismatch(msg))
}

fn check_depth(depth: usize) -> PResult<()> {
    if depth > MAX_FILTER_DEPTH {
        return Err(bad(format!(
            "filter is nested too deeply: more than {MAX_FILTER_DEPTH} levels"
        )));
    }
    Ok(())
}

/// Top-level operators MongoDB has that this engine does not implement.
fn unsupported_top_level(op: &str) -> bool {
    matches!(
        op,
        "$where" | "$text" | "$expr" | "$jsonSchema" | "$sampleRate" | "$atomic" | "$isolated"
    )
}

/// Field-level operators MongoDB has that this engine does not implement.
fn unsupported_field_level(op: &str) -> bool {
    matches!(
        op,
        "$bitsAllSet"
            | "$bitsAllClear"
            | "$bitsAnySet"
            | "$bitsAnyClear"
            | "$geoWithin"
            | "$geoIntersects"
            | "$near"
            | "$nearSphere"
            | "$within"
            | "$jsonSchema"
            | "$text"
            | "$where"
            | "$expr"
    )
}

/// Operators that take no path; an `$elemMatch` whose first key is one of these
/// is the query form (`{$elemMatch: {$or: [...]}}`).
fn is_pathless(op: &str) -> bool {
    matches!(
        op,
        "$and" | "$or" | "$nor" | "$comment" | "$alwaysTrue" | "$alwaysFalse"
    ) || unsupported_top_level(op)
}

/// A document of operators (`{$gt: 1}`), as opposed to a literal document to
/// compare with. Decided by the first key, like MongoDB; a DBRef
/// (`{$ref: …, $id: …}`) is a literal.
fn is_operator_doc(d: &Document) -> bool {
    match d.keys().next() {
        Some(k) => k.starts_with('$') && k != "$ref",
        None => false,
    }
}

// The parse functions recurse once per nesting level, so the ones on the
// recursive chain keep small stack frames: the bulky, non-recursive work (most
// operators, error formatting) lives in separate functions that are not inlined.
// This keeps a filter nested MAX_FILTER_DEPTH deep parseable on a small thread
// stack even in debug builds.

fn parse_query(spec: &Document, depth: usize) -> PResult<Node> {
    check_depth(depth)?;
    let mut out = Vec::with_capacity(spec.len());
    for (key, value) in spec {
        if key.starts_with('$') {
            parse_top_operator(key, value, depth, &mut out)?;
        } else {
            parse_field(key, value, depth, &mut out)?;
        }
    }
    Ok(if out.len() == 1 {
        out.pop().unwrap_or(Node::And(Vec::new()))
    } else {
        Node::And(out)
    })
}

fn parse_top_operator(key: &str, value: &Bson, depth: usize, out: &mut Vec<Node>) -> PResult<()> {
    let node = match key {
        "$and" => Node::And(parse_clauses(key, value, depth)?),
        "$or" => Node::Or(parse_clauses(key, value, depth)?),
        "$nor" => Node::Nor(parse_clauses(key, value, depth)?),
        "$comment" => return Ok(()),
        "$alwaysTrue" => Node::And(Vec::new()),
        "$alwaysFalse" => Node::Or(Vec::new()),
        k => return Err(top_operator_error(k)),
    };
    out.push(node);
    Ok(())
}

#[inline(never)]
fn top_operator_error(op: &str) -> Box<Error> {
    if unsupported_top_level(op) {
        bad(format!("{op} is not supported"))
    } else {
        unknown(op)
    }
}

fn parse_clauses(op: &str, value: &Bson, depth: usize) -> PResult<Vec<Node>> {
    let items = match value {
        Bson::Array(items) if !items.is_empty() => items,
        Bson::Array(_) => return Err(clauses_error(op, "must be a nonempty array")),
        _ => return Err(clauses_error(op, "must be an array")),
    };
    let mut nodes = Vec::with_capacity(items.len());
    for item in items {
        match item {
            Bson::Document(d) => nodes.push(parse_query(d, depth + 1)?),
            _ => return Err(clauses_error(op, "argument's entries must be objects")),
        }
    }
    Ok(nodes)
}

#[inline(never)]
fn clauses_error(op: &str, what: &str) -> Box<Error> {
    bad(format!("{op} {what}"))
}

fn parse_field(key: &str, value: &Bson, depth: usize, out: &mut Vec<Node>) -> PResult<()> {
    let path = FieldPath::new(key);
    match value {
        Bson::Document(d) if is_operator_doc(d) => {
            parse_operators(Some(&path), d, depth, out)?;
        }
        other => out.push(leaf(Some(&path), literal_op(other)?)),
    }
    Ok(())
}

/// `{a: v}`: a pattern match when `v` is a regex (unlike `{a: {$eq: /re/}}`),
/// equality otherwise.
#[inline(never)]
fn literal_op(v: &Bson) -> PResult<Op> {
    match v {
        Bson::RegularExpression(r) => Ok(Op::Regex(Box::new(RegexOp::from_bson(r)?))),
        other => eq_op(other),
    }
}

fn leaf(path: Option<&FieldPath>, op: Op) -> Node {
    Node::Leaf(Leaf {
        path: path.cloned(),
        op,
    })
}

fn to_raw(v: &Bson) -> PResult<RawBson> {
    value::to_raw(v).ok_or_else(|| bad(format!("cannot encode {} as BSON", render(v))))
}

fn eq_op(v: &Bson) -> PResult<Op> {
    if matches!(v, Bson::Undefined) {
        return Err(bad("cannot compare to undefined"));
    }
    Ok(Op::Eq(to_raw(v)?))
}

/// Parse `{$op: arg, …}` applied to `path` (or, with `None`, to an `$elemMatch`
/// element), pushing one node per operator: each is its own existential over the
/// reached values, so `{a: {$gt: 1, $lt: 5}}` matches `{a: [0, 10]}` as in MongoDB.
fn parse_operators(
    path: Option<&FieldPath>,
    ops: &Document,
    depth: usize,
    out: &mut Vec<Node>,
) -> PResult<()> {
    let mut regex_done = false;
    for (key, arg) in ops {
        let node = match key.as_str() {
            // The recursive operators.
            "$not" => parse_not(path, arg, depth)?,
            "$elemMatch" => leaf(path, parse_elem_match(arg, depth)?),
            "$all" => parse_all(path, arg, depth)?,
            // `$regex` and `$options` make one operator.
            "$regex" | "$options" => {
                if regex_done {
                    continue;
                }
                regex_done = true;
                leaf(path, Op::Regex(Box::new(parse_regex(ops)?)))
            }
            k => parse_simple_operator(path, k, arg)?,
        };
        out.push(node);
    }
    Ok(())
}

/// Every field-level operator that does not nest filters.
#[inline(never)]
fn parse_simple_operator(path: Option<&FieldPath>, key: &str, arg: &Bson) -> PResult<Node> {
    Ok(match key {
        "$eq" => leaf(path, eq_op(arg)?),
        "$ne" => Node::Not(Box::new(leaf(path, eq_op(arg)?))),
        "$gt" => leaf(path, cmp_op(CmpKind::Gt, arg)?),
        "$gte" => leaf(path, cmp_op(CmpKind::Gte, arg)?),
        "$lt" => leaf(path, cmp_op(CmpKind::Lt, arg)?),
        "$lte" => leaf(path, cmp_op(CmpKind::Lte, arg)?),
        "$in" => leaf(path, Op::In(Box::new(parse_in(key, arg)?))),
        "$nin" => Node::Not(Box::new(leaf(path, Op::In(Box::new(parse_in(key, arg)?))))),
        "$exists" => {
            if truthy(arg) {
                leaf(path, Op::Exists)
            } else {
                Node::Not(Box::new(leaf(path, Op::Exists)))
            }
        }
        "$type" => leaf(path, Op::Type(parse_type(arg)?)),
        "$size" => leaf(path, Op::Size(parse_size(arg)?)),
        "$mod" => {
            let (divisor, remainder) = parse_mod(arg)?;
            leaf(path, Op::Mod { divisor, remainder })
        }
        k if unsupported_field_level(k) => return Err(bad(format!("{k} is not supported"))),
        k => return Err(unknown(k)),
    })
}

fn cmp_op(kind: CmpKind, arg: &Bson) -> PResult<Op> {
    if matches!(arg, Bson::Undefined) {
        return Err(bad("cannot compare to undefined"));
    }
    Ok(Op::Cmp(kind, to_raw(arg)?))
}

/// BSON truthiness, as `$exists` reads its argument.
fn truthy(v: &Bson) -> bool {
    match v {
        Bson::Boolean(b) => *b,
        Bson::Null | Bson::Undefined => false,
        Bson::Int32(i) => *i != 0,
        Bson::Int64(i) => *i != 0,
        Bson::Double(f) => *f != 0.0,
        Bson::Decimal128(d) => value::decimal_to_f64(*d) != 0.0,
        _ => true,
    }
}

fn parse_in(op: &str, arg: &Bson) -> PResult<InSet> {
    let Bson::Array(items) = arg else {
        return Err(bad(format!("{op} needs an array")));
    };
    let mut set = InSet {
        values: Vec::with_capacity(items.len()),
        has_null: false,
        regexes: Vec::new(),
    };
    for item in items {
        match item {
            Bson::RegularExpression(r) => set.regexes.push(RegexOp::from_bson(r)?),
            Bson::Document(d) if is_operator_doc(d) => {
                return Err(bad(format!("cannot nest $ under {op}")))
            }
            Bson::Undefined => {
                return Err(bad("InMatchExpression equalities cannot contain undefined"))
            }
            other => {
                set.has_null |= matches!(other, Bson::Null);
                set.values.push(to_raw(other)?);
            }
        }
    }
    set.values
        .sort_by(|a, b| value::compare(a.as_raw_bson_ref(), b.as_raw_bson_ref()));
    set.values
        .dedup_by(|a, b| value::equal(a.as_raw_bson_ref(), b.as_raw_bson_ref()));
    Ok(set)
}

fn parse_type(arg: &Bson) -> PResult<u32> {
    match arg {
        Bson::Array(items) => {
            if items.is_empty() {
                return Err(bad("$type must match at least one type"));
            }
            items
                .iter()
                .try_fold(0, |mask, t| Ok(mask | parse_one_type(t)?))
        }
        other => parse_one_type(other),
    }
}

fn parse_one_type(t: &Bson) -> PResult<u32> {
    use ElementType as T;
    let ty = match t {
        Bson::String(alias) => match alias.as_str() {
            "number" => return Ok(NUMBER_MASK),
            other => match crate::doc::types::from_alias(other) {
                Some(t) => t,
                None => return Err(bad(format!("Unknown type name alias: {other}"))),
            },
        },
        Bson::Int32(_) | Bson::Int64(_) | Bson::Double(_) | Bson::Decimal128(_) => {
            let code = whole_number(t)
                .ok_or_else(|| bad(format!("Invalid numerical type code: {}", render(t))))?;
            let ty = match code {
                -1 => Some(T::MinKey),
                127 => Some(T::MaxKey),
                1..=19 => u8::try_from(code).ok().and_then(T::from),
                _ => None,
            };
            ty.ok_or_else(|| bad(format!("Invalid numerical type code: {code}")))?
        }
        other => {
            return Err(mismatch(format!(
                "type must be represented as a number or a string, not {}",
                render(other)
            )))
        }
    };
    Ok(type_bit(ty))
}

/// The value of a number that is a whole number within i64, else `None`.
fn whole_number(v: &Bson) -> Option<i64> {
    let f = match v {
        Bson::Int32(i) => return Some(i64::from(*i)),
        Bson::Int64(i) => return Some(*i),
        Bson::Double(f) => *f,
        Bson::Decimal128(d) => value::decimal_to_f64(*d),
        _ => return None,
    };
    // The bounds keep the cast exact: every whole f64 in (-2^63, 2^63) is an i64.
    (f.is_finite() && f.trunc() == f && f.abs() < 9.2e18).then_some(f as i64)
}

fn parse_size(arg: &Bson) -> PResult<usize> {
    let n = match arg {
        Bson::Int32(_) | Bson::Int64(_) | Bson::Double(_) | Bson::Decimal128(_) => {
            whole_number(arg).ok_or_else(|| bad("$size must be a whole number"))?
        }
        _ => return Err(bad("$size needs a number")),
    };
    if n < 0 {
        return Err(bad("$size may not be negative"));
    }
    usize::try_from(n).map_err(|_| bad("$size is too large"))
}

fn parse_mod(arg: &Bson) -> PResult<(i64, i64)> {
    let Bson::Array(items) = arg else {
        return Err(bad("malformed mod, needs to be an array"));
    };
    let (divisor, remainder) = match items.as_slice() {
        [d, r] => (d, r),
        [] | [_] => return Err(bad("malformed mod, not enough elements")),
        _ => return Err(bad("malformed mod, too many elements")),
    };
    let divisor = mod_operand(divisor, "divisor")?;
    let remainder = mod_operand(remainder, "remainder")?;
    if divisor == 0 {
        return Err(bad("divisor cannot be 0"));
    }
    Ok((divisor, remainder))
}

/// A `$mod` argument as an i64 (doubles truncate toward zero, as in MongoDB).
fn mod_operand(v: &Bson, what: &str) -> PResult<i64> {
    let f = match v {
        Bson::Int32(i) => return Ok(i64::from(*i)),
        Bson::Int64(i) => return Ok(*i),
        Bson::Double(f) => *f,
        Bson::Decimal128(d) => value::decimal_to_f64(*d),
        _ => return Err(bad(format!("malformed mod, {what} not a number"))),
    };
    if !f.is_finite() || f.abs() >= 9.2e18 {
        return Err(bad(format!("malformed mod, {what} value is invalid: {f}")));
    }
    Ok(f.trunc() as i64)
}

/// `$regex` with optional `$options`, from the operator document holding them.
fn parse_regex(ops: &Document) -> PResult<RegexOp> {
    let options = match ops.get("$options") {
        None => None,
        Some(Bson::String(s)) => Some(s.as_str()),
        Some(_) => return Err(bad("$options has to be a string")),
    };
    match ops.get("$regex") {
        Some(Bson::String(pattern)) => {
            if pattern.contains('\0') {
                return Err(bad(
                    "Regular expression cannot contain an embedded null byte",
                ));
            }
            RegexOp::new(pattern, options.unwrap_or(""))
        }
        Some(Bson::RegularExpression(r)) => {
            let own = r.options.as_str();
            match options {
                Some(o) if !o.is_empty() && !own.is_empty() => {
                    Err(bad("options set in both $regex and $options"))
                }
                Some(o) if !o.is_empty() => RegexOp::new(r.pattern.as_str(), o),
                _ => RegexOp::new(r.pattern.as_str(), own),
            }
        }
        Some(_) => Err(bad("$regex has to be a string")),
        None => Err(bad("$options needs a $regex")),
    }
}

fn parse_not(path: Option<&FieldPath>, arg: &Bson, depth: usize) -> PResult<Node> {
    check_depth(depth + 1)?;
    let inner = match arg {
        Bson::Document(d) if !d.is_empty() => {
            let mut inner = Vec::with_capacity(d.len());
            parse_operators(path, d, depth + 1, &mut inner)?;
            if inner.len() == 1 {
                inner.pop().unwrap_or(Node::And(Vec::new()))
            } else {
                Node::And(inner)
            }
        }
        other => not_leaf(path, other)?,
    };
    Ok(Node::Not(Box::new(inner)))
}

/// `$not` with a regex, or the error for any other non-document argument.
#[inline(never)]
fn not_leaf(path: Option<&FieldPath>, arg: &Bson) -> PResult<Node> {
    match arg {
        Bson::RegularExpression(r) => Ok(leaf(path, Op::Regex(Box::new(RegexOp::from_bson(r)?)))),
        Bson::Document(_) => Err(bad("$not cannot be empty")),
        _ => Err(bad("$not needs a regex or a document")),
    }
}

fn parse_elem_match(arg: &Bson, depth: usize) -> PResult<Op> {
    check_depth(depth + 1)?;
    let Bson::Document(d) = arg else {
        return Err(bad("$elemMatch needs an Object"));
    };
    let value_form = d
        .keys()
        .next()
        .is_some_and(|k| k.starts_with('$') && k != "$ref" && !is_pathless(k));
    if value_form {
        let mut inner = Vec::with_capacity(d.len());
        parse_operators(None, d, depth + 1, &mut inner)?;
        Ok(Op::ElemMatchValue(Box::new(Node::And(inner))))
    } else {
        Ok(Op::ElemMatchObject(Box::new(parse_query(d, depth + 1)?)))
    }
}

fn parse_all(path: Option<&FieldPath>, arg: &Bson, depth: usize) -> PResult<Node> {
    let Bson::Array(items) = arg else {
        return Err(bad("$all needs an array"));
    };
    // `{$all: []}` matches nothing, as in MongoDB.
    if items.is_empty() {
        return Ok(Node::Or(Vec::new()));
    }
    let is_elem_match = |v: &Bson| matches!(v, Bson::Document(d) if d.keys().next().is_some_and(|k| k == "$elemMatch"));
    let mut nodes = Vec::with_capacity(items.len());
    if items.first().is_some_and(is_elem_match) {
        for item in items {
            match item {
                Bson::Document(d) if d.len() == 1 && is_elem_match(item) => {
                    let arg = d.get("$elemMatch").unwrap_or(&Bson::Null);
                    nodes.push(leaf(path, parse_elem_match(arg, depth)?));
                }
                _ => return Err(bad("$all/$elemMatch has to be consistent")),
            }
        }
    } else {
        for item in items {
            nodes.push(leaf(path, all_member_op(item)?));
        }
    }
    Ok(Node::And(nodes))
}

/// One member of a (non-`$elemMatch`) `$all`: a pattern for a regex, else equality.
#[inline(never)]
fn all_member_op(item: &Bson) -> PResult<Op> {
    match item {
        Bson::Document(d) if is_operator_doc(d) => Err(bad("no $ expressions in $all")),
        other => literal_op(other),
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

#[cfg(test)]
mod tests {
    use super::*;
    use bson::{doc, Bson, RawDocumentBuf};

    fn parse(f: Document) -> Filter {
        Filter::parse(&f).unwrap_or_else(|e| panic!("parse {f}: {e}"))
    }

    fn raw(d: &Document) -> RawDocumentBuf {
        RawDocumentBuf::try_from(d).expect("encodable document")
    }

    fn m(f: Document, d: Document) -> bool {
        parse(f).matches(&raw(&d))
    }

    /// Assert which of `docs` match `f`.
    fn check(f: Document, yes: &[Document], no: &[Document]) {
        let filter = parse(f.clone());
        for d in yes {
            assert!(filter.matches(&raw(d)), "{f} should match {d}");
        }
        for d in no {
            assert!(!filter.matches(&raw(d)), "{f} should not match {d}");
        }
    }

    fn err(f: Document) -> String {
        match Filter::parse(&f) {
            Ok(_) => panic!("{f} should not parse"),
            Err(e) => e.to_string(),
        }
    }

    fn re(pattern: &str, options: &str) -> Bson {
        Bson::RegularExpression(bson::Regex {
            pattern: pattern.to_string().try_into().expect("cstring"),
            options: options.to_string().try_into().expect("cstring"),
        })
    }

    #[test]
    fn empty_filter_matches_all() {
        assert!(parse(doc! {}).is_match_all());
        assert!(parse(doc! {"$comment": "hi"}).is_match_all());
        assert!(!parse(doc! {"a": 1}).is_match_all());
        assert!(m(doc! {}, doc! {"a": 1}));
        assert!(m(doc! {"$comment": "x"}, doc! {}));
    }

    #[test]
    fn implicit_and_explicit_eq() {
        check(
            doc! {"a": 1},
            &[
                doc! {"a": 1},
                doc! {"a": 1.0},
                doc! {"a": 1i64},
                doc! {"a": [3, 1]},
            ],
            &[
                doc! {"a": 2},
                doc! {},
                doc! {"a": "1"},
                doc! {"a": [[1]]},
                doc! {"b": 1},
            ],
        );
        check(
            doc! {"a": {"$eq": "x"}},
            &[doc! {"a": "x"}, doc! {"a": ["y", "x"]}],
            &[doc! {"a": "X"}, doc! {"a": null}],
        );
        // Literal document equality: field order and exact fields matter.
        check(
            doc! {"a": {"b": 1, "c": 2}},
            &[
                doc! {"a": {"b": 1, "c": 2}},
                doc! {"a": [{"b": 1.0, "c": 2}]},
            ],
            &[doc! {"a": {"c": 2, "b": 1}}, doc! {"a": {"b": 1}}],
        );
        // A document whose first key is not an operator is a literal even if
        // later keys start with '$'.
        check(
            doc! {"a": {"b": 1, "$c": 2}},
            &[doc! {"a": {"b": 1, "$c": 2}}],
            &[doc! {"a": {"b": 1}}],
        );
        // `{a: {}}` is equality with the empty document.
        check(
            doc! {"a": {}},
            &[doc! {"a": {}}],
            &[doc! {"a": {"b": 1}}, doc! {}],
        );
    }

    #[test]
    fn array_equality_whole_or_element() {
        check(
            doc! {"a": [1, 2]},
            &[doc! {"a": [1, 2]}, doc! {"a": [[1, 2], 3]}],
            &[
                doc! {"a": [2, 1]},
                doc! {"a": 1},
                doc! {"a": [1, 2, 3]},
                doc! {"a": [[[1, 2]]]},
            ],
        );
        check(
            doc! {"a": []},
            &[doc! {"a": []}, doc! {"a": [[]]}],
            &[doc! {"a": [1]}, doc! {}],
        );
    }

    #[test]
    fn dotted_paths_and_array_traversal() {
        check(
            doc! {"a.b": 1},
            &[
                doc! {"a": {"b": 1}},
                doc! {"a": [{"b": 2}, {"b": 1}]},
                doc! {"a": [{"b": [0, 1]}]},
                doc! {"a": {"b": [1]}},
            ],
            &[
                doc! {"a": [[{"b": 1}]]},
                doc! {"a": 1},
                doc! {"a": {"c": {"b": 1}}},
                doc! {"a": [1]},
            ],
        );
        check(
            doc! {"a.1": 5},
            &[
                doc! {"a": [4, 5]},
                doc! {"a": {"1": 5}},
                doc! {"a": [{"1": 5}]},
            ],
            &[doc! {"a": [5, 4]}, doc! {"a": [5]}, doc! {"a": [0, [5]]}],
        );
        // An element picked by position is taken whole: it is not expanded.
        check(
            doc! {"a.1": [5]},
            &[doc! {"a": [0, [5]]}],
            &[doc! {"a": [0, 5]}],
        );
        check(
            doc! {"a.0": {"$size": 2}},
            &[doc! {"a": [[1, 2]]}],
            &[doc! {"a": [[1]]}],
        );
        check(
            doc! {"a.0.b": 1},
            &[
                doc! {"a": [{"b": 1}]},
                doc! {"a": [{"b": 2}, {"0": {"b": 1}}]},
            ],
            &[doc! {"a": [{"b": 2}, {"b": 1}]}],
        );
        check(
            doc! {"a.b.c": 3},
            &[doc! {"a": [{"b": [{"c": 1}, {"c": 3}]}]}],
            &[doc! {"a": [{"b": [[{"c": 3}]]}]}],
        );
    }

    #[test]
    fn null_and_missing() {
        check(
            doc! {"a": null},
            &[
                doc! {},
                doc! {"a": null},
                doc! {"a": Bson::Undefined},
                doc! {"a": [1, null]},
                doc! {"b": 1},
            ],
            &[
                doc! {"a": 0},
                doc! {"a": []},
                doc! {"a": [1]},
                doc! {"a": false},
            ],
        );
        check(
            doc! {"a.b": null},
            &[
                doc! {},
                doc! {"a": 1},
                doc! {"a": {}},
                doc! {"a": [{"b": 1}, {"c": 1}]},
                doc! {"a": {"b": null}},
            ],
            &[
                doc! {"a": {"b": 1}},
                doc! {"a": [{"b": 1}]},
                doc! {"a": []},
                doc! {"a": [1, 2]},
            ],
        );
        // A numeric component that does not select anything does not yield "missing"
        // from element documents.
        check(
            doc! {"a.0": null},
            &[doc! {"a": [null]}, doc! {"a": 1}, doc! {}],
            &[doc! {"a": [{"x": 1}]}, doc! {"a": [1]}],
        );
        check(
            doc! {"a": {"$ne": null}},
            &[doc! {"a": 1}, doc! {"a": []}],
            &[doc! {}, doc! {"a": null}, doc! {"a": [1, null]}],
        );
        check(
            doc! {"a": {"$in": [null, 1]}},
            &[doc! {}, doc! {"a": 1}, doc! {"a": Bson::Undefined}],
            &[doc! {"a": 2}],
        );
        check(
            doc! {"a": {"$nin": [null]}},
            &[doc! {"a": 1}],
            &[doc! {}, doc! {"a": null}],
        );
        check(
            doc! {"a": {"$gte": null}},
            &[doc! {}, doc! {"a": null}],
            &[doc! {"a": 1}, doc! {"a": "x"}],
        );
        check(
            doc! {"a": {"$lte": null}},
            &[doc! {}, doc! {"a": Bson::Undefined}],
            &[doc! {"a": 1}],
        );
        check(
            doc! {"a": {"$gt": null}},
            &[],
            &[doc! {}, doc! {"a": null}, doc! {"a": 1}],
        );
        check(
            doc! {"a": {"$lt": null}},
            &[],
            &[doc! {}, doc! {"a": null}, doc! {"a": Bson::MinKey}],
        );
    }

    #[test]
    fn ne_and_nin_negate_over_all_values() {
        check(
            doc! {"a": {"$ne": 1}},
            &[doc! {}, doc! {"a": 2}, doc! {"a": [2, 3]}, doc! {"a": "1"}],
            &[doc! {"a": 1}, doc! {"a": [1, 2]}, doc! {"a": 1.0}],
        );
        check(
            doc! {"a": {"$nin": [1, "x"]}},
            &[doc! {}, doc! {"a": 2}, doc! {"a": [2, "y"]}],
            &[doc! {"a": "x"}, doc! {"a": [2, 1]}],
        );
        check(
            doc! {"a.b": {"$ne": 1}},
            &[doc! {"a": [{"b": 2}, {"c": 1}]}],
            &[doc! {"a": [{"b": 2}, {"b": 1}]}],
        );
    }

    #[test]
    fn comparisons_use_type_bracketing() {
        check(
            doc! {"a": {"$gt": 5}},
            &[
                doc! {"a": 6},
                doc! {"a": 5.5},
                doc! {"a": [1, 7]},
                doc! {"a": 6i64},
            ],
            &[
                doc! {"a": 5},
                doc! {"a": "z"},
                doc! {"a": {"b": 1}},
                doc! {"a": true},
                doc! {},
                doc! {"a": [1, 2]},
                doc! {"a": null},
            ],
        );
        check(
            doc! {"a": {"$gte": 5}},
            &[doc! {"a": 5}, doc! {"a": 5.0}],
            &[doc! {"a": 4.9}],
        );
        check(
            doc! {"a": {"$lt": "m"}},
            &[doc! {"a": "a"}, doc! {"a": ["z", "b"]}],
            &[doc! {"a": "m"}, doc! {"a": 1}, doc! {"a": null}, doc! {}],
        );
        check(
            doc! {"a": {"$lte": "m"}},
            &[doc! {"a": "m"}],
            &[doc! {"a": "n"}],
        );
        // Each operator is its own existential over array elements.
        check(
            doc! {"a": {"$gt": 1, "$lt": 5}},
            &[doc! {"a": 3}, doc! {"a": [0, 10]}],
            &[doc! {"a": 10}, doc! {"a": [0, "x"]}],
        );
        // Array operand compares with the whole array.
        check(
            doc! {"a": {"$gt": [1]}},
            &[doc! {"a": [2]}, doc! {"a": [1, 0]}],
            &[doc! {"a": [0]}],
        );
        // Dates and bools stay within their types.
        let d = bson::DateTime::from_millis(1000);
        check(
            doc! {"a": {"$lt": d}},
            &[doc! {"a": bson::DateTime::from_millis(5)}],
            &[doc! {"a": 5}, doc! {"a": true}],
        );
    }

    #[test]
    fn minkey_maxkey_operands_cross_types() {
        check(
            doc! {"a": {"$gt": Bson::MinKey}},
            &[doc! {"a": 1}, doc! {"a": "x"}, doc! {"a": null}],
            &[doc! {"a": Bson::MinKey}, doc! {}],
        );
        check(
            doc! {"a": {"$lte": Bson::MaxKey}},
            &[doc! {"a": 1}, doc! {"a": Bson::MaxKey}],
            &[doc! {}],
        );
        check(
            doc! {"a": {"$lt": Bson::MaxKey}},
            &[doc! {"a": {"x": 1}}],
            &[doc! {"a": Bson::MaxKey}],
        );
        check(
            doc! {"a": {"$gt": Bson::MaxKey}},
            &[],
            &[doc! {"a": 1}, doc! {"a": Bson::MaxKey}],
        );
    }

    #[test]
    fn nan_only_equals_nan() {
        check(
            doc! {"a": f64::NAN},
            &[doc! {"a": f64::NAN}],
            &[doc! {"a": 1}],
        );
        check(
            doc! {"a": {"$gte": f64::NAN}},
            &[doc! {"a": f64::NAN}],
            &[doc! {"a": 1}],
        );
        check(
            doc! {"a": {"$lt": 5}},
            &[doc! {"a": 4}],
            &[doc! {"a": f64::NAN}],
        );
        check(
            doc! {"a": {"$gt": f64::NAN}},
            &[],
            &[doc! {"a": f64::NAN}, doc! {"a": 1}],
        );
    }

    #[test]
    fn in_operator() {
        check(
            doc! {"a": {"$in": [1, "x", [2, 3], re("^ab", "")]}},
            &[
                doc! {"a": 1.0},
                doc! {"a": "x"},
                doc! {"a": [2, 3]},
                doc! {"a": [9, "abc"]},
                doc! {"a": [[2, 3]]},
                doc! {"a": re("^ab", "")},
            ],
            &[
                doc! {"a": 2},
                doc! {"a": "xab"},
                doc! {},
                doc! {"a": [2]},
                doc! {"a": re("^ab", "i")},
            ],
        );
        check(doc! {"a": {"$in": []}}, &[], &[doc! {"a": 1}, doc! {}]);
        check(doc! {"a": {"$nin": []}}, &[doc! {"a": 1}, doc! {}], &[]);
    }

    #[test]
    fn exists() {
        check(
            doc! {"a": {"$exists": true}},
            &[doc! {"a": null}, doc! {"a": []}, doc! {"a": 0}],
            &[doc! {}, doc! {"b": 1}],
        );
        check(
            doc! {"a": {"$exists": false}},
            &[doc! {}],
            &[doc! {"a": null}],
        );
        check(doc! {"a": {"$exists": 1}}, &[doc! {"a": 1}], &[doc! {}]);
        check(doc! {"a": {"$exists": 0}}, &[doc! {}], &[doc! {"a": 1}]);
        check(
            doc! {"a.b": {"$exists": true}},
            &[doc! {"a": [{"c": 1}, {"b": null}]}, doc! {"a": {"b": []}}],
            &[
                doc! {"a": [{"c": 1}]},
                doc! {"a": []},
                doc! {"a": [1]},
                doc! {"a": 1},
            ],
        );
        check(
            doc! {"a.b": {"$exists": false}},
            &[doc! {"a": [{"c": 1}]}, doc! {"a": [1]}],
            &[doc! {"a": [{"b": 1}]}],
        );
    }

    #[test]
    fn type_operator() {
        check(
            doc! {"a": {"$type": "string"}},
            &[doc! {"a": "x"}, doc! {"a": [1, "x"]}],
            &[doc! {"a": 1}, doc! {}],
        );
        check(
            doc! {"a": {"$type": 2}},
            &[doc! {"a": "x"}],
            &[doc! {"a": 1}],
        );
        check(
            doc! {"a": {"$type": 16.0}},
            &[doc! {"a": 1}],
            &[doc! {"a": 1i64}],
        );
        check(
            doc! {"a": {"$type": "number"}},
            &[
                doc! {"a": 1},
                doc! {"a": 1i64},
                doc! {"a": 1.5},
                doc! {"a": ["x", 2]},
            ],
            &[doc! {"a": "1"}, doc! {"a": null}],
        );
        check(
            doc! {"a": {"$type": "array"}},
            &[doc! {"a": []}, doc! {"a": [1]}],
            &[doc! {"a": 1}, doc! {"a": {"0": 1}}],
        );
        check(
            doc! {"a": {"$type": ["null", "bool"]}},
            &[doc! {"a": null}, doc! {"a": true}],
            &[doc! {}, doc! {"a": 0}],
        );
        check(
            doc! {"a": {"$type": "undefined"}},
            &[doc! {"a": Bson::Undefined}],
            &[doc! {"a": null}],
        );
        check(
            doc! {"a": {"$type": -1}},
            &[doc! {"a": Bson::MinKey}],
            &[doc! {"a": Bson::MaxKey}],
        );
        check(
            doc! {"a": {"$type": "maxKey"}},
            &[doc! {"a": Bson::MaxKey}],
            &[doc! {"a": Bson::MinKey}],
        );
        check(
            doc! {"a": {"$type": "object"}},
            &[doc! {"a": {}}, doc! {"a": [{}]}],
            &[doc! {"a": []}],
        );
    }

    #[test]
    fn logical_operators() {
        check(
            doc! {"$and": [{"a": 1}, {"b": 2}]},
            &[doc! {"a": 1, "b": 2}],
            &[doc! {"a": 1}, doc! {"b": 2}],
        );
        check(
            doc! {"$or": [{"a": 1}, {"b": 2}]},
            &[doc! {"a": 1}, doc! {"b": 2}, doc! {"a": 1, "b": 2}],
            &[doc! {"a": 2, "b": 1}, doc! {}],
        );
        check(
            doc! {"$nor": [{"a": 1}, {"b": 2}]},
            &[doc! {}, doc! {"a": 2}],
            &[doc! {"a": 1}, doc! {"b": 2}],
        );
        check(
            doc! {"a": 1, "$or": [{"b": 1}, {"c": {"$exists": true}}]},
            &[doc! {"a": 1, "b": 1}, doc! {"a": 1, "c": null}],
            &[doc! {"a": 1}, doc! {"b": 1, "c": 1}],
        );
        check(doc! {"$alwaysFalse": 1}, &[], &[doc! {}]);
        check(doc! {"$alwaysTrue": 1}, &[doc! {}], &[]);
    }

    #[test]
    fn not_operator() {
        check(
            doc! {"a": {"$not": {"$gt": 5}}},
            &[doc! {"a": 5}, doc! {}, doc! {"a": "z"}, doc! {"a": [1, 2]}],
            &[doc! {"a": 6}, doc! {"a": [1, 6]}],
        );
        // `$not` negates the conjunction, not each operator.
        check(
            doc! {"a": {"$not": {"$gt": 1, "$lt": 5}}},
            &[doc! {"a": 7}, doc! {"a": 0}],
            &[doc! {"a": 3}, doc! {"a": [0, 10]}],
        );
        check(
            doc! {"a": {"$not": re("^x", "")}},
            &[doc! {"a": "yx"}, doc! {}, doc! {"a": 1}],
            &[doc! {"a": "xy"}, doc! {"a": ["q", "xa"]}],
        );
        check(
            doc! {"a": {"$not": {"$regex": "^x", "$options": "i"}}},
            &[doc! {"a": "y"}],
            &[doc! {"a": "Xy"}],
        );
        check(
            doc! {"a": {"$not": {"$not": {"$eq": 1}}}},
            &[doc! {"a": [1, 2]}],
            &[doc! {"a": 2}],
        );
    }

    #[test]
    fn regex_and_options() {
        check(
            doc! {"a": re("^ab", "")},
            &[doc! {"a": "abc"}, doc! {"a": ["x", "abx"]}],
            &[doc! {"a": "ABc"}, doc! {"a": 1}, doc! {}],
        );
        check(
            doc! {"a": re("^ab", "i")},
            &[doc! {"a": "ABc"}],
            &[doc! {"a": "cab"}],
        );
        check(
            doc! {"a": {"$regex": "^ab", "$options": "i"}},
            &[doc! {"a": "AB"}],
            &[doc! {"a": "b"}],
        );
        check(
            doc! {"a": {"$regex": re("b$", "")}},
            &[doc! {"a": "ab"}],
            &[doc! {"a": "ba"}],
        );
        check(
            doc! {"a": {"$regex": re("b", ""), "$options": "i"}},
            &[doc! {"a": "B"}],
            &[doc! {"a": "c"}],
        );
        // m: ^ and $ at line boundaries.
        check(
            doc! {"a": {"$regex": "^b$", "$options": "m"}},
            &[doc! {"a": "a\nb\nc"}],
            &[doc! {"a": "ab"}],
        );
        check(
            doc! {"a": {"$regex": "^b$"}},
            &[doc! {"a": "b"}],
            &[doc! {"a": "a\nb\nc"}],
        );
        // s: dot matches newline.
        check(
            doc! {"a": {"$regex": "a.b", "$options": "s"}},
            &[doc! {"a": "a\nb"}],
            &[],
        );
        check(
            doc! {"a": {"$regex": "a.b"}},
            &[doc! {"a": "axb"}],
            &[doc! {"a": "a\nb"}],
        );
        // x: whitespace and comments in the pattern are ignored.
        check(
            doc! {"a": {"$regex": "a b # comment", "$options": "x"}},
            &[doc! {"a": "ab"}],
            &[doc! {"a": "a b"}],
        );
        // Symbols match like strings; a stored regex matches only the same regex.
        check(
            doc! {"a": re("x", "")},
            &[
                doc! {"a": Bson::Symbol("x".into())},
                doc! {"a": re("x", "")},
            ],
            &[doc! {"a": re("x", "i")}],
        );
        // `$eq` with a regex is literal equality, not a pattern match.
        check(
            doc! {"a": {"$eq": re("x", "")}},
            &[doc! {"a": re("x", "")}],
            &[doc! {"a": "x"}],
        );
    }

    #[test]
    fn size_operator() {
        check(
            doc! {"a": {"$size": 2}},
            &[doc! {"a": [1, [2, 3]]}],
            &[
                doc! {"a": [[1, 2]]},
                doc! {"a": [1]},
                doc! {"a": "ab"},
                doc! {},
            ],
        );
        check(
            doc! {"a": {"$size": 0}},
            &[doc! {"a": []}],
            &[doc! {"a": [1]}, doc! {}],
        );
        check(
            doc! {"a": {"$size": 1.0}},
            &[doc! {"a": [1]}],
            &[doc! {"a": []}],
        );
        check(
            doc! {"a.b": {"$size": 1}},
            &[doc! {"a": [{"b": [1]}, {"b": 1}]}],
            &[doc! {"a": [{"b": 1}]}],
        );
    }

    #[test]
    fn mod_operator() {
        check(
            doc! {"a": {"$mod": [4, 1]}},
            &[
                doc! {"a": 5},
                doc! {"a": 9i64},
                doc! {"a": 5.9},
                doc! {"a": [2, 13]},
            ],
            &[
                doc! {"a": 4},
                doc! {"a": "5"},
                doc! {},
                doc! {"a": f64::NAN},
                doc! {"a": f64::INFINITY},
            ],
        );
        check(
            doc! {"a": {"$mod": [3, -1]}},
            &[doc! {"a": -4}],
            &[doc! {"a": 2}],
        );
        check(doc! {"a": {"$mod": [-1, 0]}}, &[doc! {"a": i64::MIN}], &[]);
        check(
            doc! {"a": {"$mod": [2.5, 0.9]}},
            &[doc! {"a": 4}],
            &[doc! {"a": 5}],
        );
    }

    #[test]
    fn elem_match_value_form() {
        check(
            doc! {"a": {"$elemMatch": {"$gt": 1, "$lt": 5}}},
            &[doc! {"a": [0, 3]}],
            &[doc! {"a": [0, 10]}, doc! {"a": 3}, doc! {}],
        );
        // Elements are not expanded: a nested array is one element.
        check(
            doc! {"a": {"$elemMatch": {"$eq": 1}}},
            &[doc! {"a": [1]}],
            &[doc! {"a": [[1]]}],
        );
        check(
            doc! {"a": {"$elemMatch": {"$not": {"$gt": 5}}}},
            &[doc! {"a": [9, 2]}],
            &[doc! {"a": [9]}, doc! {"a": []}],
        );
        check(
            doc! {"a": {"$elemMatch": {"$regex": "^x"}}},
            &[doc! {"a": ["y", "xz"]}],
            &[doc! {"a": ["y"]}],
        );
    }

    #[test]
    fn elem_match_query_form() {
        check(
            doc! {"a": {"$elemMatch": {"b": 1, "c": {"$gt": 2}}}},
            &[
                doc! {"a": [{"b": 1, "c": 3}]},
                doc! {"a": [{"b": 0}, {"b": [1], "c": [5]}]},
            ],
            &[
                doc! {"a": [{"b": 1, "c": 1}, {"b": 2, "c": 3}]},
                doc! {"a": {"b": 1, "c": 3}},
                doc! {"a": [1, 2]},
            ],
        );
        check(
            doc! {"a": {"$elemMatch": {"$or": [{"b": 1}, {"c": 1}]}}},
            &[doc! {"a": [{"c": 1}]}],
            &[doc! {"a": [{"d": 1}]}],
        );
        check(
            doc! {"a": {"$elemMatch": {}}},
            &[doc! {"a": [1, {}]}],
            &[doc! {"a": [1, 2]}, doc! {"a": []}],
        );
        check(
            doc! {"a.b": {"$elemMatch": {"c": 1}}},
            &[doc! {"a": [{"b": [{"c": 1}]}]}],
            &[doc! {"a": [{"b": {"c": 1}}]}],
        );
    }

    #[test]
    fn nested_elem_match() {
        check(
            doc! {"a": {"$elemMatch": {"b": {"$elemMatch": {"c": {"$gte": 2}}}}}},
            &[doc! {"a": [{"b": [{"c": 1}, {"c": 2}]}]}],
            &[
                doc! {"a": [{"b": [{"c": 1}]}]},
                doc! {"a": [{"b": {"c": 3}}]},
            ],
        );
        check(
            doc! {"a": {"$elemMatch": {"$elemMatch": {"$gt": 5}}}},
            &[doc! {"a": [[1], [6]]}],
            &[doc! {"a": [6]}, doc! {"a": [[1]]}],
        );
    }

    #[test]
    fn all_operator() {
        check(
            doc! {"a": {"$all": [1, 2]}},
            &[doc! {"a": [2, 3, 1]}],
            &[doc! {"a": [1]}, doc! {"a": 1}, doc! {}],
        );
        check(
            doc! {"a": {"$all": [1]}},
            &[doc! {"a": 1}, doc! {"a": [1]}],
            &[doc! {"a": 2}],
        );
        check(
            doc! {"a": {"$all": [[1, 2]]}},
            &[doc! {"a": [1, 2]}, doc! {"a": [[1, 2], 3]}],
            &[doc! {"a": [1, 2, 3]}],
        );
        check(
            doc! {"a": {"$all": [re("^x", ""), "yy"]}},
            &[doc! {"a": ["xa", "yy"]}],
            &[doc! {"a": ["xa"]}],
        );
        check(
            doc! {"a": {"$all": []}},
            &[],
            &[doc! {"a": []}, doc! {"a": [1]}],
        );
        check(
            doc! {"a": {"$all": [{"$elemMatch": {"b": 1}}, {"$elemMatch": {"c": {"$gt": 1}}}]}},
            &[doc! {"a": [{"b": 1}, {"c": 2}]}],
            &[doc! {"a": [{"b": 1}, {"c": 1}]}],
        );
    }

    #[test]
    fn dbref_is_a_literal() {
        check(
            doc! {"a": {"$ref": "c", "$id": 1}},
            &[doc! {"a": {"$ref": "c", "$id": 1}}],
            &[doc! {"a": {"$ref": "c", "$id": 2}}],
        );
    }

    #[test]
    fn parse_errors() {
        assert_eq!(err(doc! {"a": {"$foo": 1}}), "unknown operator: $foo");
        assert_eq!(err(doc! {"$foo": 1}), "unknown operator: $foo");
        assert_eq!(err(doc! {"a": {"$gt": 1, "b": 2}}), "unknown operator: b");
        assert!(err(doc! {"$where": "1"}).contains("not supported"));
        assert!(err(doc! {"$text": {"$search": "x"}}).contains("not supported"));
        assert!(err(doc! {"$expr": {"$eq": [1, 1]}}).contains("not supported"));
        assert!(err(doc! {"a": {"$near": [0, 0]}}).contains("not supported"));
        for op in ["$and", "$or", "$nor"] {
            assert!(err(doc! {op: []}).contains("nonempty array"), "{op}");
            assert!(err(doc! {op: 1}).contains("must be an array"), "{op}");
            assert!(err(doc! {op: [1]}).contains("must be objects"), "{op}");
        }
        assert_eq!(err(doc! {"a": {"$in": 1}}), "$in needs an array");
        assert_eq!(err(doc! {"a": {"$nin": "x"}}), "$nin needs an array");
        assert_eq!(err(doc! {"a": {"$all": 1}}), "$all needs an array");
        assert!(err(doc! {"a": {"$in": [{"$gt": 1}]}}).contains("cannot nest $"));
        assert!(err(doc! {"a": {"$all": [{"$gt": 1}]}}).contains("no $ expressions"));
        assert!(err(doc! {"a": {"$all": [{"$elemMatch": {}}, 1]}}).contains("consistent"));
        assert_eq!(err(doc! {"a": {"$size": -1}}), "$size may not be negative");
        assert_eq!(
            err(doc! {"a": {"$size": 1.5}}),
            "$size must be a whole number"
        );
        assert_eq!(err(doc! {"a": {"$size": "1"}}), "$size needs a number");
        assert_eq!(err(doc! {"a": {"$mod": [0, 1]}}), "divisor cannot be 0");
        assert!(err(doc! {"a": {"$mod": [1]}}).contains("not enough elements"));
        assert!(err(doc! {"a": {"$mod": [1, 2, 3]}}).contains("too many elements"));
        assert!(err(doc! {"a": {"$mod": 4}}).contains("needs to be an array"));
        assert!(err(doc! {"a": {"$mod": ["x", 1]}}).contains("divisor not a number"));
        assert!(err(doc! {"a": {"$mod": [f64::NAN, 1]}}).contains("invalid"));
        assert!(err(doc! {"a": {"$regex": "("}}).contains("Regular expression is invalid"));
        assert!(err(doc! {"a": re("(", "")}).contains("Regular expression is invalid"));
        assert!(err(doc! {"a": {"$regex": "x", "$options": "q"}}).contains("invalid flag"));
        assert_eq!(err(doc! {"a": {"$regex": 5}}), "$regex has to be a string");
        assert_eq!(
            err(doc! {"a": {"$options": "i"}}),
            "$options needs a $regex"
        );
        assert!(err(doc! {"a": {"$regex": re("x", "i"), "$options": "m"}}).contains("both"));
        assert_eq!(
            err(doc! {"a": {"$type": "foo"}}),
            "Unknown type name alias: foo"
        );
        assert!(err(doc! {"a": {"$type": 99}}).contains("Invalid numerical type code"));
        assert!(err(doc! {"a": {"$type": 2.5}}).contains("Invalid numerical type code"));
        assert!(err(doc! {"a": {"$type": []}}).contains("at least one type"));
        assert!(err(doc! {"a": {"$type": true}}).contains("number or a string"));
        assert_eq!(
            err(doc! {"a": {"$not": 1}}),
            "$not needs a regex or a document"
        );
        assert_eq!(err(doc! {"a": {"$not": {}}}), "$not cannot be empty");
        assert_eq!(err(doc! {"a": {"$not": {"b": 1}}}), "unknown operator: b");
        assert_eq!(
            err(doc! {"a": {"$elemMatch": 1}}),
            "$elemMatch needs an Object"
        );
        assert!(err(doc! {"a": Bson::Undefined}).contains("undefined"));
        assert!(err(doc! {"a": {"$in": [Bson::Undefined]}}).contains("undefined"));
        // Errors inside nested clauses surface too.
        assert_eq!(
            err(doc! {"$or": [{"a": 1}, {"b": {"$bad": 1}}]}),
            "unknown operator: $bad"
        );
        assert_eq!(
            err(doc! {"a": {"$elemMatch": {"b": {"$bad": 1}}}}),
            "unknown operator: $bad"
        );
    }

    #[test]
    fn errors_are_bad_value() {
        let e = Filter::parse(&doc! {"a": {"$in": 1}}).expect_err("error");
        assert_eq!(e.code(), 2);
        let e = Filter::parse(&doc! {"a": {"$foo": 1}}).expect_err("error");
        assert!(matches!(e, Error::UnknownOperator(_)));
    }

    #[test]
    fn nesting_depth_is_bounded() {
        let mut f = doc! {"a": 1};
        for _ in 0..MAX_FILTER_DEPTH {
            f = doc! {"$and": [f]};
        }
        assert!(m(f.clone(), doc! {"a": 1}));
        let deeper = doc! {"$and": [f]};
        assert!(err(deeper).contains("nested too deeply"));

        let mut g = doc! {"$eq": 1};
        for _ in 0..=MAX_FILTER_DEPTH {
            g = doc! {"$not": g};
        }
        assert!(err(doc! {"a": g}).contains("nested too deeply"));

        let mut h = doc! {"b": 1};
        for _ in 0..=MAX_FILTER_DEPTH {
            h = doc! {"b": {"$elemMatch": h}};
        }
        assert!(err(h).contains("nested too deeply"));
    }

    #[test]
    fn malformed_raw_documents_do_not_panic() {
        // A document whose declared length is right but whose element is cut short.
        let bytes: Vec<u8> = vec![13, 0, 0, 0, 0x10, b'a', 0, 1, 0, 0xFF, 0xFF, 0xFF, 0];
        if let Ok(doc) = RawDocument::from_bytes(&bytes) {
            for f in [
                doc! {"a": 1},
                doc! {"a.b": null},
                doc! {"a": {"$exists": false}},
            ] {
                let _ = parse(f).matches(doc);
            }
        }
    }

    fn s(f: Document) -> Vec<(String, Sarg)> {
        parse(f).sargs()
    }

    fn rb(b: Bson) -> RawBson {
        value::to_raw(&b).expect("raw")
    }

    #[test]
    fn sargs_equality_and_in() {
        assert_eq!(
            s(doc! {"a": 1}),
            vec![("a".to_string(), Sarg::Eq(rb(1.into())))]
        );
        assert_eq!(
            s(doc! {"a.b": {"$eq": "x"}}),
            vec![("a.b".to_string(), Sarg::Eq(rb("x".into())))]
        );
        assert_eq!(
            s(doc! {"a": null}),
            vec![("a".to_string(), Sarg::Eq(RawBson::Null))]
        );
        assert_eq!(
            s(doc! {"a": {"b": 1}}),
            vec![("a".to_string(), Sarg::Eq(rb(doc! {"b": 1}.into())))]
        );
        assert_eq!(
            s(doc! {"a": {"$in": [3, 1, 1.0]}}),
            vec![("a".to_string(), Sarg::In(vec![rb(1.into()), rb(3.into())]))]
        );
        assert!(s(doc! {"a": [1, 2]}).is_empty());
        assert!(s(doc! {"a": re("x", "")}).is_empty());
        assert!(s(doc! {"a": {"$eq": re("x", "")}}).is_empty());
        assert!(s(doc! {"a": {"$in": [1, [2]]}}).is_empty());
        assert!(s(doc! {"a": {"$in": [1, re("x", "")]}}).is_empty());
    }

    #[test]
    fn sargs_ranges_merge() {
        assert_eq!(
            s(doc! {"a": {"$gt": 1, "$lte": 5}}),
            vec![(
                "a".to_string(),
                Sarg::Range {
                    lower: Bound::Excluded(rb(1.into())),
                    upper: Bound::Included(rb(5.into()))
                }
            )]
        );
        assert_eq!(
            s(
                doc! {"$and": [{"a": {"$gte": 2}}, {"a": {"$gt": 2}}, {"a": {"$gte": 1}}, {"a": {"$lt": 9}}, {"a": {"$lt": 7}}]}
            ),
            vec![(
                "a".to_string(),
                Sarg::Range {
                    lower: Bound::Excluded(rb(2.into())),
                    upper: Bound::Excluded(rb(7.into()))
                }
            )]
        );
        assert_eq!(
            s(doc! {"a": {"$lt": "m"}}),
            vec![(
                "a".to_string(),
                Sarg::Range {
                    lower: Bound::Unbounded,
                    upper: Bound::Excluded(rb("m".into()))
                }
            )]
        );
        assert!(s(doc! {"a": {"$gt": [1]}}).is_empty());
    }

    #[test]
    fn sargs_only_from_top_level_conjunction() {
        let got = s(
            doc! {"a": 1, "$and": [{"b": {"$in": [2]}}, {"$and": [{"c": {"$gte": 0}}]}], "d": {"$all": [4, 5]}},
        );
        let paths: Vec<&str> = got.iter().map(|(p, _)| p.as_str()).collect();
        assert_eq!(paths, vec!["a", "b", "c", "d", "d"]);
        for f in [
            doc! {"a": {"$ne": 1}},
            doc! {"a": {"$nin": [1]}},
            doc! {"a": {"$not": {"$gt": 1}}},
            doc! {"a": {"$exists": true}},
            doc! {"a": {"$regex": "x"}},
            doc! {"a": {"$elemMatch": {"b": 1}}},
            doc! {"a": {"$elemMatch": {"$eq": 1}}},
            doc! {"$or": [{"a": 1}]},
            doc! {"$nor": [{"a": 1}]},
            doc! {"a": {"$size": 1}},
            doc! {"a": {"$type": "string"}},
            doc! {"a": {"$mod": [2, 0]}},
        ] {
            assert!(s(f.clone()).is_empty(), "{f}");
        }
        // Mixed: only the indexable part is returned.
        assert_eq!(s(doc! {"a": {"$ne": 1, "$gt": 0}}).len(), 1);
    }

    #[test]
    fn sargs_are_supersets_of_matches() {
        // Every matching document satisfies every sarg (checked on a non-multikey
        // document set, where a merged range is exact).
        let docs = [
            doc! {"a": 1},
            doc! {"a": 3},
            doc! {"a": "x"},
            doc! {"a": null},
            doc! {},
            doc! {"a": 7.5},
        ];
        let filters = [
            doc! {"a": {"$gte": 1, "$lt": 7}},
            doc! {"a": {"$in": [1, "x", null]}},
            doc! {"a": 3},
            doc! {"$and": [{"a": {"$gt": 1}}, {"a": {"$lte": 8}}]},
        ];
        for f in filters {
            let filter = parse(f.clone());
            for d in &docs {
                if !filter.matches(&raw(d)) {
                    continue;
                }
                let v = d.get("a").cloned().unwrap_or(Bson::Null);
                let v = value::to_raw(&v).expect("raw");
                let v = v.as_raw_bson_ref();
                for (_, sarg) in filter.sargs() {
                    let ok = match &sarg {
                        Sarg::Eq(x) => value::equal(x.as_raw_bson_ref(), v),
                        Sarg::In(xs) => xs.iter().any(|x| value::equal(x.as_raw_bson_ref(), v)),
                        Sarg::Range { lower, upper } => {
                            let lo = match lower {
                                Bound::Included(x) => {
                                    value::compare(v, x.as_raw_bson_ref()) != Ordering::Less
                                }
                                Bound::Excluded(x) => {
                                    value::compare(v, x.as_raw_bson_ref()) == Ordering::Greater
                                }
                                Bound::Unbounded => true,
                            };
                            let hi = match upper {
                                Bound::Included(x) => {
                                    value::compare(v, x.as_raw_bson_ref()) != Ordering::Greater
                                }
                                Bound::Excluded(x) => {
                                    value::compare(v, x.as_raw_bson_ref()) == Ordering::Less
                                }
                                Bound::Unbounded => true,
                            };
                            lo && hi
                        }
                    };
                    assert!(ok, "{f} matches {d} but sarg {sarg:?} excludes it");
                }
            }
        }
    }

    // -----------------------------------------------------------------------
    // Reference evaluator and property test
    // -----------------------------------------------------------------------

    mod reference {
        //! A deliberately simple evaluator over `bson::Document`: builds the list
        //! of reached values with `None` for "missing", expands leaf arrays into
        //! a Vec, and applies each operator to the list.

        use super::super::value;
        use bson::{Bson, Document};
        use std::cmp::Ordering;

        #[derive(Debug, Clone)]
        pub enum RF {
            And(Vec<RF>),
            Or(Vec<RF>),
            Nor(Vec<RF>),
            Field(&'static str, ROp),
        }

        #[derive(Debug, Clone)]
        pub enum ROp {
            Eq(Bson, bool),
            Ne(Bson),
            Cmp(&'static str, Bson),
            In(Vec<Bson>),
            Nin(Vec<Bson>),
            Exists(bool),
            Type(i32),
            TypeNumber,
            Size(i32),
            Mod(i64, i64),
            Regex(&'static str),
            All(Vec<Bson>),
            ElemMatchValue(Box<ROp>),
            ElemMatchObj(&'static str, Box<ROp>),
            Not(Box<ROp>),
        }

        impl RF {
            pub fn to_doc(&self) -> Document {
                let list =
                    |v: &[RF]| Bson::Array(v.iter().map(|c| Bson::Document(c.to_doc())).collect());
                match self {
                    RF::And(v) => bson::doc! {"$and": list(v)},
                    RF::Or(v) => bson::doc! {"$or": list(v)},
                    RF::Nor(v) => bson::doc! {"$nor": list(v)},
                    RF::Field(p, op) => {
                        let mut d = Document::new();
                        d.insert(*p, op.to_bson());
                        d
                    }
                }
            }

            pub fn eval(&self, doc: &Document) -> bool {
                match self {
                    RF::And(v) => v.iter().all(|c| c.eval(doc)),
                    RF::Or(v) => v.iter().any(|c| c.eval(doc)),
                    RF::Nor(v) => !v.iter().any(|c| c.eval(doc)),
                    RF::Field(p, op) => op.eval(&reach(doc, p)),
                }
            }
        }

        impl ROp {
            pub fn to_bson(&self) -> Bson {
                use bson::doc;
                match self {
                    ROp::Eq(v, true) => v.clone(),
                    ROp::Eq(v, false) => doc! {"$eq": v.clone()}.into(),
                    ROp::Ne(v) => doc! {"$ne": v.clone()}.into(),
                    ROp::Cmp(op, v) => {
                        let mut d = Document::new();
                        d.insert(*op, v.clone());
                        d.into()
                    }
                    ROp::In(v) => doc! {"$in": v.clone()}.into(),
                    ROp::Nin(v) => doc! {"$nin": v.clone()}.into(),
                    ROp::Exists(b) => doc! {"$exists": *b}.into(),
                    ROp::Type(t) => doc! {"$type": *t}.into(),
                    ROp::TypeNumber => doc! {"$type": "number"}.into(),
                    ROp::Size(n) => doc! {"$size": *n}.into(),
                    ROp::Mod(d, r) => doc! {"$mod": [*d, *r]}.into(),
                    ROp::Regex(p) => doc! {"$regex": *p}.into(),
                    ROp::All(v) => doc! {"$all": v.clone()}.into(),
                    ROp::ElemMatchValue(op) => doc! {"$elemMatch": op.to_bson()}.into(),
                    ROp::ElemMatchObj(p, op) => {
                        let mut inner = Document::new();
                        inner.insert(*p, op.to_bson());
                        doc! {"$elemMatch": inner}.into()
                    }
                    ROp::Not(op) => doc! {"$not": op.to_bson()}.into(),
                }
            }

            /// The operator on the values a path reached.
            pub fn eval(&self, r: &Reached) -> bool {
                self.eval_cands(&r.values, &r.cands)
            }

            /// Inside `$elemMatch`'s value form: the element alone, never expanded.
            fn eval_single(&self, e: &Bson) -> bool {
                let one = [Some(e.clone())];
                self.eval_cands(&one, &one)
            }

            /// `reached` for the operators that look at reached values themselves,
            /// `cands` (arrays expanded) for the others.
            fn eval_cands(&self, reached: &[Option<Bson>], cands: &[Option<Bson>]) -> bool {
                let any = |f: &dyn Fn(&Option<Bson>) -> bool| cands.iter().any(f);
                match self {
                    ROp::Eq(v, _) => any(&|c| eq(c, v)),
                    ROp::Ne(v) => !any(&|c| eq(c, v)),
                    ROp::Cmp(op, v) => any(&|c| cmp(op, c, v)),
                    ROp::In(vs) => any(&|c| vs.iter().any(|v| eq(c, v))),
                    ROp::Nin(vs) => !any(&|c| vs.iter().any(|v| eq(c, v))),
                    ROp::Exists(b) => reached.iter().any(Option::is_some) == *b,
                    ROp::Type(t) => any(&|c| c.as_ref().is_some_and(|c| type_code(c) == *t)),
                    ROp::TypeNumber => any(&|c| {
                        c.as_ref()
                            .is_some_and(|c| [1, 16, 18, 19].contains(&type_code(c)))
                    }),
                    ROp::Size(n) => reached
                        .iter()
                        .any(|r| matches!(r, Some(Bson::Array(a)) if a.len() == *n as usize)),
                    ROp::Mod(d, r) => any(&|c| match c {
                        Some(Bson::Int32(i)) => i64::from(*i) % d == *r,
                        Some(Bson::Int64(i)) => i % d == *r,
                        Some(Bson::Double(f)) if f.is_finite() => (f.trunc() as i64) % d == *r,
                        _ => false,
                    }),
                    ROp::Regex(p) => {
                        let re = regex::Regex::new(p).expect("test regex");
                        any(&|c| matches!(c, Some(Bson::String(s)) if re.is_match(s)))
                    }
                    ROp::All(vs) => !vs.is_empty() && vs.iter().all(|v| any(&|c| eq(c, v))),
                    ROp::ElemMatchValue(op) => reached.iter().any(|r| match r {
                        Some(Bson::Array(a)) => a.iter().any(|e| op.eval_single(e)),
                        _ => false,
                    }),
                    ROp::ElemMatchObj(p, op) => reached.iter().any(|r| match r {
                        Some(Bson::Array(a)) => a.iter().any(|e| match e {
                            Bson::Document(d) => op.eval(&reach(d, p)),
                            _ => false,
                        }),
                        _ => false,
                    }),
                    ROp::Not(op) => !op.eval_cands(reached, cands),
                }
            }
        }

        /// Values reached by a dotted path (`None` where a field is missing), and
        /// the candidates operators compare with: reached arrays also stand for
        /// their elements (elements first), except an element picked positionally.
        #[derive(Default)]
        pub struct Reached {
            pub values: Vec<Option<Bson>>,
            pub cands: Vec<Option<Bson>>,
        }

        impl Reached {
            fn push(&mut self, v: Option<Bson>, expand: bool) {
                if let (true, Some(Bson::Array(a))) = (expand, &v) {
                    self.cands.extend(a.iter().cloned().map(Some));
                }
                self.cands.push(v.clone());
                self.values.push(v);
            }
        }

        pub fn reach(doc: &Document, path: &str) -> Reached {
            let parts: Vec<&str> = path.split('.').collect();
            let mut out = Reached::default();
            reach_doc(doc, &parts, true, &mut out);
            out
        }

        fn reach_doc(doc: &Document, parts: &[&str], yield_missing: bool, out: &mut Reached) {
            match doc.get(parts[0]) {
                Some(v) => reach_value(v, &parts[1..], out),
                None if yield_missing => out.push(None, false),
                None => {}
            }
        }

        fn reach_value(v: &Bson, rest: &[&str], out: &mut Reached) {
            if rest.is_empty() {
                out.push(Some(v.clone()), true);
                return;
            }
            match v {
                Bson::Document(d) => reach_doc(d, rest, true, out),
                Bson::Array(a) => {
                    let numeric = crate::doc::path::numeric_component(rest[0]);
                    if let Some(e) = numeric.and_then(|i| a.get(i)) {
                        if rest.len() == 1 {
                            out.push(Some(e.clone()), false);
                        } else {
                            reach_value(e, &rest[1..], out);
                        }
                    }
                    for e in a {
                        if let Bson::Document(d) = e {
                            reach_doc(d, rest, numeric.is_none(), out);
                        }
                    }
                }
                _ => out.push(None, false),
            }
        }

        fn rank(v: &Bson) -> u8 {
            let raw = value::to_raw(v).expect("raw");
            value::canonical_rank(raw.as_raw_bson_ref())
        }

        fn eq(c: &Option<Bson>, v: &Bson) -> bool {
            match (c, v) {
                (None, Bson::Null) => true,
                (None, _) => false,
                (Some(Bson::Undefined), Bson::Null) => true,
                (Some(c), v) => value::equal_bson(c, v),
            }
        }

        fn is_nan(v: &Bson) -> bool {
            matches!(v, Bson::Double(f) if f.is_nan())
        }

        fn cmp(op: &str, c: &Option<Bson>, v: &Bson) -> bool {
            let inclusive = op == "$gte" || op == "$lte";
            let Some(c) = c else {
                return inclusive && *v == Bson::Null;
            };
            let (rc, rv) = (rank(c), rank(v));
            if rc != rv {
                return (rc == 1 && rv == 2) && inclusive
                    || (*v == Bson::MinKey && op.starts_with("$gt"))
                    || (*v == Bson::MaxKey && op.starts_with("$lt"));
            }
            if is_nan(c) || is_nan(v) {
                return inclusive && is_nan(c) && is_nan(v);
            }
            let ord = value::compare_bson(c, v);
            match op {
                "$gt" => ord == Ordering::Greater,
                "$gte" => ord != Ordering::Less,
                "$lt" => ord == Ordering::Less,
                _ => ord != Ordering::Greater,
            }
        }

        fn type_code(v: &Bson) -> i32 {
            // MinKey's element type byte is 0xFF; `$type` calls it -1.
            match v {
                Bson::MinKey => -1,
                _ => i32::from(v.element_type() as u8),
            }
        }
    }

    mod props {
        use super::reference::{ROp, RF};
        use super::*;
        use proptest::prelude::*;

        fn scalar() -> impl Strategy<Value = Bson> {
            prop_oneof![
                (0i32..4).prop_map(Bson::Int32),
                (0i64..4).prop_map(Bson::Int64),
                prop_oneof![Just(0.5), Just(1.0), Just(2.5), Just(f64::NAN)].prop_map(Bson::Double),
                prop_oneof![Just("x"), Just("xy"), Just("y"), Just("")]
                    .prop_map(|s| Bson::String(s.into())),
                Just(Bson::Null),
                Just(Bson::Undefined),
                any::<bool>().prop_map(Bson::Boolean),
                Just(Bson::MinKey),
            ]
        }

        fn value() -> impl Strategy<Value = Bson> {
            scalar().prop_recursive(2, 12, 3, |inner| {
                prop_oneof![
                    proptest::collection::vec(inner.clone(), 0..3).prop_map(Bson::Array),
                    proptest::collection::vec(
                        (prop_oneof![Just("a"), Just("b"), Just("0")], inner),
                        0..3
                    )
                    .prop_map(|kv| {
                        let mut d = Document::new();
                        for (k, v) in kv {
                            d.insert(k, v);
                        }
                        Bson::Document(d)
                    }),
                ]
            })
        }

        fn document() -> impl Strategy<Value = Document> {
            proptest::collection::vec((prop_oneof![Just("a"), Just("b")], value()), 0..3).prop_map(
                |kv| {
                    let mut d = Document::new();
                    for (k, v) in kv {
                        d.insert(k, v);
                    }
                    d
                },
            )
        }

        /// Operands: like values, minus `undefined` (rejected by the parser) and
        /// documents with `$` keys (none are generated).
        fn operand() -> impl Strategy<Value = Bson> {
            value().prop_filter("no undefined operand", |v| !matches!(v, Bson::Undefined))
        }

        fn path() -> impl Strategy<Value = &'static str> {
            prop_oneof![
                Just("a"),
                Just("b"),
                Just("a.a"),
                Just("a.b"),
                Just("a.0"),
                Just("a.0.a"),
                Just("b.1")
            ]
        }

        fn op() -> impl Strategy<Value = ROp> {
            let leaf = prop_oneof![
                (operand(), any::<bool>()).prop_map(|(v, implicit)| ROp::Eq(v, implicit)),
                operand().prop_map(ROp::Ne),
                (
                    prop_oneof![Just("$gt"), Just("$gte"), Just("$lt"), Just("$lte")],
                    operand()
                )
                    .prop_map(|(o, v)| ROp::Cmp(o, v)),
                proptest::collection::vec(operand(), 0..3).prop_map(ROp::In),
                proptest::collection::vec(operand(), 0..3).prop_map(ROp::Nin),
                any::<bool>().prop_map(ROp::Exists),
                prop_oneof![
                    Just(1),
                    Just(2),
                    Just(3),
                    Just(4),
                    Just(6),
                    Just(8),
                    Just(10),
                    Just(16),
                    Just(18),
                    Just(-1)
                ]
                .prop_map(ROp::Type),
                Just(ROp::TypeNumber),
                (0i32..3).prop_map(ROp::Size),
                (1i64..4, 0i64..3).prop_map(|(d, r)| ROp::Mod(d, r)),
                prop_oneof![Just("^x"), Just("y$"), Just("x")].prop_map(ROp::Regex),
                proptest::collection::vec(operand(), 1..3).prop_map(ROp::All),
            ];
            leaf.prop_recursive(2, 6, 1, |inner| {
                prop_oneof![
                    inner.clone().prop_map(|o| ROp::ElemMatchValue(Box::new(o))),
                    (prop_oneof![Just("a"), Just("b")], inner.clone())
                        .prop_map(|(p, o)| ROp::ElemMatchObj(p, Box::new(o))),
                    inner.prop_map(|o| ROp::Not(Box::new(o))),
                ]
            })
        }

        fn is_valid_inside_elem_match_value(op: &ROp) -> bool {
            // Implicit equality is not an operator and cannot appear in the value form.
            !matches!(op, ROp::Eq(_, true))
        }

        fn is_valid(op: &ROp) -> bool {
            match op {
                ROp::ElemMatchValue(inner) => {
                    is_valid_inside_elem_match_value(inner) && is_valid(inner)
                }
                ROp::ElemMatchObj(_, inner) => is_valid(inner),
                // `$not` takes operators only, and implicit equality with a document
                // is a literal.
                ROp::Not(inner) => !matches!(**inner, ROp::Eq(_, true)) && is_valid(inner),
                // Implicit equality with a document whose first key is `$ref` would
                // be a DBRef; the generator never makes `$` keys, so all are fine.
                _ => true,
            }
        }

        fn filter() -> impl Strategy<Value = RF> {
            let field =
                (path(), op().prop_filter("valid", is_valid)).prop_map(|(p, o)| RF::Field(p, o));
            field.prop_recursive(2, 8, 3, |inner| {
                prop_oneof![
                    proptest::collection::vec(inner.clone(), 1..3).prop_map(RF::And),
                    proptest::collection::vec(inner.clone(), 1..3).prop_map(RF::Or),
                    proptest::collection::vec(inner, 1..3).prop_map(RF::Nor),
                ]
            })
        }

        proptest! {
            #![proptest_config(ProptestConfig { cases: 1000, ..ProptestConfig::default() })]

            #[test]
            fn matches_agrees_with_reference(f in filter(), docs in proptest::collection::vec(document(), 1..6)) {
                let spec = f.to_doc();
                let parsed = Filter::parse(&spec).map_err(|e| TestCaseError::fail(format!("{spec}: {e}")))?;
                for d in &docs {
                    let expected = f.eval(d);
                    let got = parsed.matches(&raw(d));
                    prop_assert_eq!(got, expected, "filter {} on {}", spec, d);
                }
            }
        }
    }
}
