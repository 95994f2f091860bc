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
