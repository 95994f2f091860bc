//! Path walking over raw documents: MongoDB's implicit array traversal, the
//! same rule as `crate::doc::path`, written as callbacks so that a scan does
//! not build a Vec per document, and extended with "missing" items (`None`)
//! that null equality and `$exists` need. `f` returns true to stop (a match was
//! found); every walker returns whether it stopped.
//!
//! Invariants:
//! - A reached array also stands for each of its elements when `expand` is set,
//!   except an element picked by a final numeric component (`a.0`), which is
//!   taken whole; nested arrays are not traversed further, as in MongoDB.
//! - "Missing" is yielded where a field is absent: a missing field, a scalar in
//!   the middle of the path, an array element document lacking the field. Not
//!   for an array index out of range, nor inside the element documents searched
//!   for a numeric component (see `walk_doc`'s `yield_missing`).
//! - Malformed elements count as absent, so walking never fails or panics; the
//!   recursion is at most one level per path component.
//! - The position handed with each item (`walk_doc_at`) is its index in the
//!   outermost array iterated implicitly (an element expanded, or an element
//!   document searched), never one picked by a numeric component.

use bson::raw::{RawArray, RawDocument};
use bson::RawBsonRef;

use super::tree::Part;

/// Walk `parts` from `doc`. `yield_missing` is false when `doc` is an array
/// element reached while looking for a numeric component: `{a: [{x: 1}]}` has
/// no "missing" `a.0`, it has the element `{x: 1}`.
pub(super) fn walk_doc<'a, F>(
    doc: &'a RawDocument,
    parts: &[Part],
    expand: bool,
    yield_missing: bool,
    f: &mut F,
) -> bool
where
    F: FnMut(Option<RawBsonRef<'a>>) -> bool,
{
    walk_doc_at(doc, parts, expand, yield_missing, None, &mut |v, _| f(v))
}

/// [`walk_doc`] that also hands `f` the position of each item in the
/// outermost array the walk iterated (implicitly, not by a numeric
/// component), `None` when it iterated none: MongoDB's `arrayOffset`, which
/// the positional `$` of an update stands for. `at` is the position the walk
/// already took (when `doc` is itself an array element).
pub(super) fn walk_doc_at<'a, F>(
    doc: &'a RawDocument,
    parts: &[Part],
    expand: bool,
    yield_missing: bool,
    at: Option<usize>,
    f: &mut F,
) -> bool
where
    F: FnMut(Option<RawBsonRef<'a>>, Option<usize>) -> bool,
{
    let Some((first, rest)) = parts.split_first() else {
        return false;
    };
    // Byte-compared lookup (see `rawfield`); a malformed element is absent:
    // `matches` must not fail.
    match crate::doc::rawfield::field(doc, &first.name) {
        Some(v) => walk_value(v, rest, expand, at, f),
        None => yield_missing && f(None, at),
    }
}

fn walk_value<'a, F>(
    v: RawBsonRef<'a>,
    rest: &[Part],
    expand: bool,
    at: Option<usize>,
    f: &mut F,
) -> bool
where
    F: FnMut(Option<RawBsonRef<'a>>, Option<usize>) -> bool,
{
    if rest.is_empty() {
        if expand {
            if let RawBsonRef::Array(a) = v {
                if a.into_iter()
                    .enumerate()
                    .filter_map(|(k, e)| e.ok().map(|e| (k, e)))
                    .any(|(k, e)| f(Some(e), at.or(Some(k))))
                {
                    return true;
                }
            }
        }
        return f(Some(v), at);
    }
    match v {
        RawBsonRef::Document(d) => walk_doc_at(d, rest, expand, true, at, f),
        RawBsonRef::Array(a) => walk_array(a, rest, expand, at, f),
        // A scalar in the middle of the path: the rest of the path is missing.
        _ => f(None, at),
    }
}

fn walk_array<'a, F>(
    a: &'a RawArray,
    rest: &[Part],
    expand: bool,
    at: Option<usize>,
    f: &mut F,
) -> bool
where
    F: FnMut(Option<RawBsonRef<'a>>, Option<usize>) -> bool,
{
    let Some((first, tail)) = rest.split_first() else {
        return false;
    };
    // A numeric component selects that element (positionally: when it ends the
    // path, an array element is taken whole, not expanded, as in MongoDB)…
    if let Some(i) = first.index {
        if let Ok(Some(elem)) = a.get(i) {
            let stop = if tail.is_empty() {
                f(Some(elem), at)
            } else {
                walk_value(elem, tail, expand, at, f)
            };
            if stop {
                return true;
            }
        }
    }
    // …and is also a field name inside element documents; other elements
    // (scalars, nested arrays) are not traversed, as in MongoDB.
    for (k, elem) in a.into_iter().enumerate() {
        let Ok(elem) = elem else { continue };
        if let RawBsonRef::Document(d) = elem {
            if walk_doc_at(d, rest, expand, first.index.is_none(), at.or(Some(k)), f) {
                return true;
            }
        }
    }
    false
}
