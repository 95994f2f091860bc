//! Parsing: a BSON filter document into the typed predicate tree, once per
//! query. Owns the meaning of every operator's argument and every error a
//! malformed filter gets: `Error::BadValue` for malformed arguments and for
//! operators MongoDB has but this engine does not implement,
//! `Error::UnknownOperator` (also code 2) for names no MongoDB knows, and
//! `Error::TypeMismatch` for a `$type` that is neither a number nor a string.
//!
//! Invariants:
//! - A malformed filter is an error, never read as some other filter;
//!   `$comment` is the one operator that is dropped. `$expr` keeps its spec
//!   here and is compiled after the whole filter parsed (`Filter::parse_with_let`),
//!   in the command's variable scope.
//! - Nesting deeper than `MAX_FILTER_DEPTH` is an error, which bounds the
//!   recursion of parsing here and of evaluation later.
//! - Whether an operand document is a literal or a set of operators is decided
//!   by its first key, as in MongoDB (`is_operator_doc`).
//! - Each operator of `{a: {$gt: 1, $lt: 5}}` becomes its own leaf, so each is
//!   its own existential over the reached values.

use bson::spec::ElementType;
use bson::{Bson, Document, RawBson};

use super::tree::{type_bit, CmpKind, FieldPath, InSet, Leaf, Node, Op, RegexOp, NUMBER_MASK};
use super::MAX_FILTER_DEPTH;
use crate::doc::value;
use crate::error::{render, Error};
use crate::query::pattern;

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
        "$where" | "$text" | "$sampleRate" | "$atomic" | "$isolated"
    )
}

/// Field-level operators MongoDB has that this engine does not implement.
fn unsupported_field_level(op: &str) -> bool {
    matches!(op, "$jsonSchema" | "$text" | "$where" | "$expr")
}

/// Operators that take no path; an `$elemMatch` whose first key is one of these
/// is the query form (`{$elemMatch: {$or: [...]}}`).
fn is_pathless(op: &str) -> bool {
    matches!(
        op,
        "$and"
            | "$or"
            | "$nor"
            | "$comment"
            | "$alwaysTrue"
            | "$alwaysFalse"
            | "$expr"
            | "$jsonSchema"
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

pub(super) fn parse_query(spec: &Document, depth: usize) -> PResult<Node> {
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
        "$expr" => Node::Expr(Box::new(super::expr::ExprNode::new(value))),
        "$jsonSchema" => match value {
            Bson::Document(d) => Node::Schema(Box::new(super::schema::Schema::parse(d, depth)?)),
            _ => return Err(bad("$jsonSchema must be an object")),
        },
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
        // MongoDB's words (expression_parser.cpp), code 2.
        bad(format!(
            "unknown top level operator: {op}. If you have a field name that starts with a \
             '$' symbol, consider using $getField or $setField."
        ))
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
        coll: None,
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
    let near = ["$near", "$nearSphere"]
        .into_iter()
        .find(|k| ops.contains_key(*k));
    for (key, arg) in ops {
        let node = match key.as_str() {
            // `$near` reads its `$minDistance`/`$maxDistance` siblings.
            "$near" | "$nearSphere" => {
                let q = crate::query::geo::GeoQuery::near(key, ops).map_err(Box::new)?;
                leaf(path, Op::Geo(std::sync::Arc::new(q)))
            }
            "$minDistance" | "$maxDistance" if near.is_some() => continue,
            "$minDistance" | "$maxDistance" => {
                return Err(bad(format!("{key} must be used with $near or $nearSphere")))
            }
            "$geoWithin" | "$within" => leaf(
                path,
                Op::Geo(std::sync::Arc::new(
                    crate::query::geo::GeoQuery::within(arg).map_err(Box::new)?,
                )),
            ),
            "$geoIntersects" => leaf(
                path,
                Op::Geo(std::sync::Arc::new(
                    crate::query::geo::GeoQuery::intersects(arg).map_err(Box::new)?,
                )),
            ),
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
        "$bitsAllSet" | "$bitsAnySet" | "$bitsAllClear" | "$bitsAnyClear" => leaf(
            path,
            Op::Bits(Box::new(super::bits::BitsOp::parse(key, arg)?)),
        ),
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

impl RegexOp {
    fn new(pattern: &str, options: &str) -> PResult<RegexOp> {
        let mut sorted: Vec<char> = Vec::with_capacity(options.len());
        for c in options.chars() {
            if !matches!(c, 'i' | 'm' | 's' | 'x' | 'u') {
                // pcre_util::flagsToOptions with no operator name: the
                // message starts with a space.
                return Err(Box::new(Error::Coded {
                    code: 51108,
                    name: "Location51108",
                    msg: format!(" invalid flag in regex options: {c}"),
                }));
            }
            if !sorted.contains(&c) {
                sorted.push(c);
            }
        }
        sorted.sort_unstable();
        // As MongoDB's RegexMatchExpression: the flags are read first (an
        // invalid one wins), then a null byte is refused, then a pattern
        // that does not compile.
        if pattern.contains('\0') {
            return Err(bad(
                "Regular expression cannot contain an embedded null byte",
            ));
        }
        let re = pattern::compile(pattern, options).map_err(|e| {
            let why = match e {
                pattern::CompileError::Syntax(e) => {
                    crate::query::pcre_words::compile_error(pattern, options, &e)
                }
                pattern::CompileError::Flag(c) => format!("invalid flag in regex options: {c}"),
            };
            Box::new(Error::Coded {
                code: 51091,
                name: "Location51091",
                msg: format!("Regular expression is invalid: {why}"),
            })
        })?;
        Ok(RegexOp {
            re,
            pattern: pattern.to_string(),
            options: sorted.into_iter().collect(),
        })
    }

    fn from_bson(r: &bson::Regex) -> PResult<RegexOp> {
        RegexOp::new(r.pattern.as_str(), r.options.as_str())
    }
}

/// `$regex` with optional `$options`, from the operator document holding them.
fn parse_regex(ops: &Document) -> PResult<RegexOp> {
    let options = match ops.get("$options") {
        None => None,
        Some(Bson::String(s)) => Some(s.as_str()),
        Some(_) => return Err(bad("$options has to be a string")),
    };
    match ops.get("$regex") {
        Some(Bson::String(pattern)) => RegexOp::new(pattern, options.unwrap_or("")),
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
        let node = parse_query(d, depth + 1)?;
        if has_expr(&node) {
            return Err(bad("$expr can only be applied to the top-level document"));
        }
        Ok(Op::ElemMatchObject(Box::new(node)))
    }
}

/// Whether a node holds an `$expr` (refused under `$elemMatch`, as MongoDB does).
#[inline(never)]
fn has_expr(node: &Node) -> bool {
    match node {
        Node::Expr(_) => true,
        Node::And(c) | Node::Or(c) | Node::Nor(c) => c.iter().any(has_expr),
        Node::Not(n) => has_expr(n),
        Node::Leaf(_) | Node::Schema(_) => false,
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
