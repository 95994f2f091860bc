//! The common update patched into the stored bytes: `$set`, `$inc`,
//! `$unset` (and an update's ignored `$setOnInsert`) on top-level fields.
//!
//! The general path decodes the stored document into a `Document`, applies
//! the operators, checks its depth twice and encodes it again: for a `$set`
//! of one field of a 20-field document that was most of an update's work
//! on the writer (issue #19 item 2). Here the new version is built by
//! copying the old elements' bytes and writing only the changed ones.
//!
//! Invariant: when [`patch`] returns a document, it is byte for byte what
//! the general path ([`super::UpdateSpec::apply`] then encoding) produces
//! (property-tested in `tests.rs`): fields keep their position, a `$set`
//! or `$inc` of a missing field appends it in the operators' (path) order,
//! `$inc` follows MongoDB's numeric promotion through the same
//! `arithmetic` function; a repeated name's first element is the field
//! (`doc/repeated.rs`). Anything else — other operators, dotted or
//! dynamic paths, `_id`, an `$inc` on a non-number or one that overflows,
//! a value nested near the depth limit, a result over the size limit, a
//! malformed stored document — answers `None`, and the caller takes the
//! general path, which also produces the error, if there is one.

use bson::raw::RawDocument;
use bson::{Bson, Document, RawDocumentBuf};

use super::{arithmetic, FieldOp, Kind, Op, UpdateSpec};
use crate::doc::{MAX_DEPTH, MAX_DOC_SIZE};

/// A value nested this deep (levels below it) or more goes the general
/// way, which decides the depth limit's borderline cases.
const SHALLOW: usize = MAX_DEPTH / 2;

/// The new version of stored document `old` under `spec` for an update of
/// an existing document (not an upsert's insert), or `None` when the
/// general path must decide (see the module invariant).
pub(super) fn patch(spec: &UpdateSpec, old: &RawDocument) -> Option<RawDocumentBuf> {
    let Kind::Operators(ops) = &spec.kind else {
        return None;
    };
    if spec.dynamic || !ops.iter().all(eligible) {
        return None;
    }
    let mut done = vec![false; ops.len()];
    let bytes = old.as_bytes();
    let mut out = Vec::with_capacity(bytes.len() + 16);
    out.extend_from_slice(&[0; 4]);
    let mut at = 4;
    for element in old.iter_elements() {
        let element = element.ok()?;
        let key = element.key().as_str();
        // type byte, key, its NUL, the value
        let len = 1 + key.len() + 1 + element.size();
        let whole = bytes.get(at..at + len)?;
        at += len;
        // A repeated name: only its first occurrence is the field the
        // update addresses (`doc/repeated.rs`); the others stay as they are.
        let Some(i) = ops
            .iter()
            .position(|o| o.path[0] == key)
            .filter(|&i| !done[i])
        else {
            out.extend_from_slice(whole);
            continue;
        };
        done[i] = true;
        match &ops[i].op {
            Op::Set(v) => encode(&mut out, key, v)?,
            Op::Inc(arg) => {
                let cur = Bson::try_from(element.value().ok()?).ok()?;
                if !arithmetic::is_num(&cur) {
                    return None;
                }
                encode(
                    &mut out,
                    key,
                    &arithmetic::arithmetic(&cur, arg, true).ok()??,
                )?;
            }
            Op::SetOnInsert(_) => out.extend_from_slice(whole),
            Op::Unset => {}
            _ => return None,
        }
    }
    if at + 1 != bytes.len() {
        return None;
    }
    for (op, _) in ops.iter().zip(&done).filter(|(_, d)| !**d) {
        match &op.op {
            Op::Set(v) | Op::Inc(v) => encode(&mut out, &op.path[0], v)?,
            _ => {}
        }
    }
    out.push(0);
    if out.len() > MAX_DOC_SIZE {
        return None;
    }
    let len = i32::try_from(out.len()).ok()?;
    out[..4].copy_from_slice(&len.to_le_bytes());
    RawDocumentBuf::from_bytes(out).ok()
}

/// Top-level, not `_id`, and an operator this path handles.
fn eligible(op: &FieldOp) -> bool {
    let [field] = op.path.as_slice() else {
        return false;
    };
    field != "_id"
        && match &op.op {
            Op::Set(v) | Op::Inc(v) | Op::SetOnInsert(v) => nesting(v) < SHALLOW,
            Op::Unset => true,
            _ => false,
        }
}

/// Levels of documents and arrays in `v` (0 for a scalar), counted up to
/// [`SHALLOW`].
fn nesting(v: &Bson) -> usize {
    let mut deepest = 0;
    let mut stack = vec![(v, 0usize)];
    while let Some((v, above)) = stack.pop() {
        let level = above + 1;
        match v {
            Bson::Document(doc) => stack.extend(doc.values().map(|c| (c, level))),
            Bson::Array(a) => stack.extend(a.iter().map(|c| (c, level))),
            _ => continue,
        }
        deepest = deepest.max(level);
        if deepest >= SHALLOW {
            break;
        }
    }
    deepest
}

/// Append the element `key: v` (type byte, key, value) to `out`.
fn encode(out: &mut Vec<u8>, key: &str, v: &Bson) -> Option<()> {
    let mut one = Document::new();
    one.insert(key, v.clone());
    let raw = RawDocumentBuf::try_from(&one).ok()?;
    let b = raw.as_bytes();
    out.extend_from_slice(b.get(4..b.len() - 1)?);
    Some(())
}
