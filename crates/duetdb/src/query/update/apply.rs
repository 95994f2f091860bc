//! Applying parsed operators to a document: the operator loop's steps, path
//! lookup, `$rename`, removal, and the checks that wrap every result.
//!
//! Owns: `_id` handling (kept, first, immutable), [`Lookup`] of a path, the
//! dispatch from an operator to the rule that decides its [`Action`] (the rules
//! of numbers and arrays live in `arithmetic` and `array`), and carrying the
//! action out through [`crate::doc::path::set_creating`] or [`remove_path`].
//!
//! Invariants:
//! - a path that cannot be created (through a scalar, or by name into an array)
//!   fails only for operators that would create something there (code 28);
//!   removing or keeping such a path is a no-op, as in MongoDB;
//! - `$rename` never goes through an array on either side (code 2), and a
//!   source path that cannot exist (through a scalar, or by name into an
//!   array) is code 28, as MongoDB's `findLongestPrefix` reports it;
//! - removing an array element leaves a null, so positions stay stable.

use bson::{Bson, Document, Timestamp};

use crate::doc::path::{self, numeric_component};
use crate::doc::MAX_DEPTH;
use crate::error::{render, Error, Result};

use super::{arithmetic, array, Action, ApplyContext, FieldOp, Op};

/// A replacement keeps the old `_id` (added first when the replacement has
/// none) and refuses a different one (code 66).
pub(super) fn apply_replacement(repl: &Document, old: &Document) -> Result<Document> {
    let mut out = Document::new();
    match (old.get("_id"), repl.get("_id")) {
        (Some(old_id), Some(new_id)) if old_id != new_id => {
            return Err(Error::ImmutableField(format!(
                "After applying the update, the (immutable) field '_id' was found to have \
                 been altered to _id: {}",
                render(new_id)
            )));
        }
        (Some(old_id), None) => {
            // A replacement without _id keeps the old one.
            out.insert("_id", old_id.clone());
        }
        _ => {}
    }
    for (k, v) in repl {
        out.insert(k.clone(), v.clone());
    }
    Ok(out)
}

/// An operator update may not change or remove an existing `_id` (code 66).
pub(super) fn check_id_unchanged(old: &Document, new: &Document) -> Result<()> {
    if let Some(old_id) = old.get("_id") {
        if new.get("_id") != Some(old_id) {
            return Err(Error::ImmutableField(
                "Performing an update on the path '_id' would modify the immutable field '_id'"
                    .into(),
            ));
        }
    }
    Ok(())
}

/// Move `_id` to the front: stored documents start with it (see [`crate::doc`]).
pub(super) fn id_first(doc: &mut Document) {
    if doc.keys().next().is_some_and(|k| k != "_id") {
        if let Some(id) = doc.remove("_id") {
            let mut out = Document::new();
            out.insert("_id", id);
            for (k, v) in std::mem::take(doc) {
                out.insert(k, v);
            }
            *doc = out;
        }
    }
}

/// Apply one operator at `path` (its own path, or one its dynamic path
/// resolved to) to `doc` (the update so far); `orig` is the input document,
/// named in error messages.
pub(super) fn apply_op(
    fop: &FieldOp,
    path: &[String],
    doc: &mut Document,
    orig: &Document,
    ctx: &ApplyContext,
) -> Result<()> {
    let field = path.join(".");
    match &fop.op {
        Op::Rename { from, .. } => apply_rename(doc, from, path, orig),
        Op::SetOnInsert(_) if !ctx.is_upsert_insert => Ok(()),
        op => apply_at(doc, path, |cur| compute(op, cur, &field, orig, ctx)),
    }
}

/// Decide the action of a (non-rename) operator from the current value.
fn compute(
    op: &Op,
    cur: Option<&Bson>,
    field: &str,
    orig: &Document,
    ctx: &ApplyContext,
) -> Result<Action> {
    Ok(match op {
        Op::Set(v) | Op::SetOnInsert(v) => Action::Set(v.clone()),
        Op::Unset => match cur {
            Some(_) => Action::Remove,
            None => Action::Keep,
        },
        Op::Inc(arg) => arithmetic::inc_or_mul(arg, true, cur, field, orig)?,
        Op::Mul(arg) => arithmetic::inc_or_mul(arg, false, cur, field, orig)?,
        Op::Min(arg) => arithmetic::min_or_max(arg, true, cur),
        Op::Max(arg) => arithmetic::min_or_max(arg, false, cur),
        Op::CurrentDate(ts) => Action::Set(current_date(*ts, ctx)),
        Op::Bit(ops) => arithmetic::bit(ops, cur, field, orig)?,
        Op::Push(args) => array::push(args, cur, field, orig)?,
        Op::AddToSet(each) => array::add_to_set(each, cur, field)?,
        Op::Pop(first) => array::pop(*first, cur, field)?,
        Op::Pull(cond) => array::pull(cond, cur)?,
        Op::PullAll(vals) => array::pull_all(vals, cur)?,
        Op::Rename { .. } => Action::Keep,
    })
}

/// `$currentDate`'s value: the date `ctx.now`, or a timestamp of its second
/// (increment 1; a time before 1970 or past 2106 becomes 0).
fn current_date(timestamp: bool, ctx: &ApplyContext) -> Bson {
    if timestamp {
        let millis = ctx.now.timestamp_millis();
        let secs = u32::try_from(millis.div_euclid(1000)).unwrap_or(0);
        Bson::Timestamp(Timestamp {
            time: secs,
            increment: 1,
        })
    } else {
        Bson::DateTime(ctx.now)
    }
}

/// Move the value at `from` to `to`; a missing source is a no-op, a source
/// path through a scalar (or by name into an array) is 28, and neither side
/// may go through an array (2), with MongoDB's messages (`RenameNode`).
fn apply_rename(doc: &mut Document, from: &[String], to: &[String], orig: &Document) -> Result<()> {
    let value = match lookup(doc, from) {
        Lookup::Found(v) => v.clone(),
        Lookup::Missing => return Ok(()),
        Lookup::Blocked { at, parent } => {
            let part = from.get(at - 1).map(String::as_str).unwrap_or("");
            return Err(Error::PathNotViable(format!(
                "cannot use the part ({part} of {}) to traverse the element ({{{part}: {}}})",
                from.join("."),
                crate::error::render_shell(parent)
            )));
        }
    };
    if let Some(array) = array_ancestor(doc, from, false) {
        return Err(Error::bad_value(format!(
            "The source field cannot be an array element, '{}' in doc with {} has an array \
             field called '{array}'",
            from.join("."),
            id_element(orig)
        )));
    }
    if let Some(array) = array_ancestor(doc, to, true) {
        return Err(Error::bad_value(format!(
            "The destination field cannot be an array element, '{}' in doc with {} has an \
             array field called '{array}'",
            to.join("."),
            id_element(orig)
        )));
    }
    path::set_creating(doc, to, value)?;
    remove_path(doc, from);
    Ok(())
}

/// `_id: <value>` as MongoDB prints the element, or `no id`.
fn id_element(doc: &Document) -> String {
    match doc.get("_id") {
        Some(id) => format!("_id: {}", crate::error::render_shell(id)),
        None => "no id".to_string(),
    }
}

/// The name of the deepest array among the existing proper ancestors of
/// `path` — and, with `to_create`, of the deepest existing element when the
/// path does not fully exist (the element a rename would create under).
fn array_ancestor(doc: &Document, path: &[String], to_create: bool) -> Option<String> {
    let mut found: Vec<(&String, &Bson)> = Vec::new();
    let mut cur: Option<&Bson> = None;
    for part in path {
        let next = match cur {
            None => doc.get(part),
            Some(Bson::Document(d)) => d.get(part),
            Some(Bson::Array(a)) => numeric_component(part).and_then(|i| a.get(i)),
            Some(_) => None,
        };
        let Some(next) = next else { break };
        found.push((part, next));
        cur = Some(next);
    }
    let ancestors = if found.len() == path.len() || !to_create {
        &found[..found.len().saturating_sub(1)]
    } else {
        &found[..]
    };
    ancestors
        .iter()
        .rev()
        .find(|(_, v)| matches!(v, Bson::Array(_)))
        .map(|(name, _)| (*name).clone())
}

enum Lookup<'a> {
    Found(&'a Bson),
    Missing,
    /// `path[at]` cannot be created inside `parent` (a scalar, or an array with a
    /// non-numeric component); `path[at - 1]` names `parent`.
    Blocked {
        at: usize,
        parent: &'a Bson,
    },
}

/// What `path` names in `doc`, following documents and numeric array indexes only.
fn lookup<'a>(doc: &'a Document, path: &[String]) -> Lookup<'a> {
    let Some((first, rest)) = path.split_first() else {
        return Lookup::Missing;
    };
    let Some(mut cur) = doc.get(first) else {
        return Lookup::Missing;
    };
    for (i, part) in rest.iter().enumerate() {
        let next = match cur {
            Bson::Document(d) => d.get(part),
            Bson::Array(a) => match numeric_component(part) {
                Some(idx) => a.get(idx),
                None => {
                    return Lookup::Blocked {
                        at: i + 1,
                        parent: cur,
                    }
                }
            },
            _ => {
                return Lookup::Blocked {
                    at: i + 1,
                    parent: cur,
                }
            }
        };
        match next {
            Some(v) => cur = v,
            None => return Lookup::Missing,
        }
    }
    Lookup::Found(cur)
}

/// Decide with `f` from the current value at `path`, then carry the action out.
fn apply_at(
    doc: &mut Document,
    path: &[String],
    f: impl FnOnce(Option<&Bson>) -> Result<Action>,
) -> Result<()> {
    let action = match lookup(doc, path) {
        Lookup::Found(v) => f(Some(v))?,
        Lookup::Missing => f(None)?,
        Lookup::Blocked { at, parent } => match f(None)? {
            // Only operators that would create the field fail on a blocked path.
            Action::Set(_) => return Err(path::not_viable(path, at, parent)),
            _ => Action::Keep,
        },
    };
    match action {
        Action::Keep => Ok(()),
        Action::Set(v) => path::set_creating(doc, path, v),
        Action::Remove => {
            remove_path(doc, path);
            Ok(())
        }
    }
}

/// Remove `path`: a document field is deleted, an array element becomes null
/// (MongoDB keeps array positions stable). Missing paths are left alone.
fn remove_path(doc: &mut Document, path: &[String]) {
    let Some((last, parents)) = path.split_last() else {
        return;
    };
    if parents.is_empty() {
        doc.remove(last);
        return;
    }
    let mut cur = doc.get_mut(&parents[0]);
    for part in &parents[1..] {
        cur = match cur {
            Some(Bson::Document(d)) => d.get_mut(part),
            Some(Bson::Array(a)) => numeric_component(part).and_then(|i| a.get_mut(i)),
            _ => None,
        };
    }
    match cur {
        Some(Bson::Document(d)) => {
            d.remove(last);
        }
        Some(Bson::Array(a)) => {
            if let Some(slot) = numeric_component(last).and_then(|i| a.get_mut(i)) {
                *slot = Bson::Null;
            }
        }
        _ => {}
    }
}

/// Does the document nest deeper than [`MAX_DEPTH`] (it sits at `level`)?
/// Stops descending as soon as the limit is passed.
pub(super) fn too_deep_doc(d: &Document, level: usize) -> bool {
    if level > MAX_DEPTH {
        return true;
    }
    d.values().any(|v| too_deep(v, level + 1))
}

fn too_deep(v: &Bson, level: usize) -> bool {
    match v {
        Bson::Document(d) => too_deep_doc(d, level),
        Bson::Array(a) => level > MAX_DEPTH || a.iter().any(|x| too_deep(x, level + 1)),
        _ => false,
    }
}
