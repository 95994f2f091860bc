//! Array update operators: `$push` with its modifiers, `$addToSet`, `$pop`,
//! `$pull` and `$pullAll`.
//!
//! Invariants:
//! - each rule reads the current value and returns an [`Action`]; it never
//!   writes, so the caller decides (and a blocked path stays untouched);
//! - a missing field is created by `$push`/`$addToSet` and left alone by `$pop`,
//!   `$pull`, `$pullAll`; a non-array field is an error (code 2, `$pop` code 14);
//! - element equality (`$addToSet`, `$pullAll`) and order (`$push` `$sort`) go
//!   through [`crate::doc::value`], as filters and indexes do, strings under
//!   the update's collation (`super::compare`);
//! - an operator that changes nothing returns [`Action::Keep`] (no rewrite).

use bson::{Bson, Document, RawDocumentBuf};

use crate::doc::types::type_name;
use crate::error::{Error, Result};
use crate::query::sort::SortKey;

use super::{id_render, Action, ElemCond, PushArgs, PushSort};

/// `$push`: the current array (or a new one) with `args` applied.
pub(super) fn push(
    args: &PushArgs,
    cur: Option<&Bson>,
    field: &str,
    orig: &Document,
) -> Result<Action> {
    let mut arr = match cur {
        None => Vec::new(),
        Some(Bson::Array(a)) => a.clone(),
        Some(other) => {
            return Err(Error::bad_value(format!(
                "The field '{field}' must be an array but is of type {} in document {}",
                type_name(other),
                id_render(orig)
            )))
        }
    };
    push_into(&mut arr, args);
    Ok(Action::Set(Bson::Array(arr)))
}

/// `$addToSet`: append each value not already present (nor added before it).
pub(super) fn add_to_set(each: &[Bson], cur: Option<&Bson>, field: &str) -> Result<Action> {
    let mut arr = match cur {
        None => Vec::new(),
        Some(Bson::Array(a)) => a.clone(),
        Some(other) => {
            return Err(Error::bad_value(format!(
                "Cannot apply $addToSet to non-array field. Field named '{field}' has \
                 non-array type {}",
                type_name(other)
            )))
        }
    };
    let before = arr.len();
    for v in each {
        if !arr.iter().any(|x| super::equal(x, v)) {
            arr.push(v.clone());
        }
    }
    // A new field is created even when empty ($each: []); an existing one is
    // rewritten only when something was added.
    Ok(if cur.is_some() && arr.len() == before {
        Action::Keep
    } else {
        Action::Set(Bson::Array(arr))
    })
}

/// `$pop`: remove the first (`first`) or the last element.
pub(super) fn pop(first: bool, cur: Option<&Bson>, field: &str) -> Result<Action> {
    Ok(match cur {
        None => Action::Keep,
        Some(Bson::Array(a)) if a.is_empty() => Action::Keep,
        Some(Bson::Array(a)) => {
            let mut a = a.clone();
            if first {
                a.remove(0);
            } else {
                a.pop();
            }
            Action::Set(Bson::Array(a))
        }
        Some(other) => {
            return Err(Error::type_mismatch(format!(
                "Path '{field}' contains an element of non-array type '{}'",
                type_name(other)
            )))
        }
    })
}

/// `$pull`: remove the elements matching `cond`.
pub(super) fn pull(cond: &ElemCond, cur: Option<&Bson>) -> Result<Action> {
    remove_matching(cur, |x| cond.matches(x))
}

/// `$pullAll`: remove the elements equal to one of `vals`.
pub(super) fn pull_all(vals: &[Bson], cur: Option<&Bson>) -> Result<Action> {
    remove_matching(cur, |x| vals.iter().any(|v| super::equal(x, v)))
}

/// The current array without the elements `gone` accepts. `$pullAll` on a
/// non-array reports `$pull`'s message too: MongoDB treats it as a `$pull`
/// variant, and clients may match on the text.
fn remove_matching(cur: Option<&Bson>, gone: impl Fn(&Bson) -> bool) -> Result<Action> {
    Ok(match cur {
        None => Action::Keep,
        Some(Bson::Array(a)) => {
            let kept: Vec<Bson> = a.iter().filter(|x| !gone(x)).cloned().collect();
            if kept.len() == a.len() {
                Action::Keep
            } else {
                Action::Set(Bson::Array(kept))
            }
        }
        Some(_) => {
            return Err(Error::bad_value(
                "Cannot apply $pull to a non-array value".to_string(),
            ))
        }
    })
}

/// Insert `$each` at `$position` (negative: from the end; clamped), then `$sort`,
/// then `$slice` (negative: keep the last elements), in MongoDB's order.
fn push_into(arr: &mut Vec<Bson>, args: &PushArgs) {
    let len = arr.len() as i64;
    let at = match args.position {
        None => len,
        Some(p) if p >= 0 => p.min(len),
        Some(p) => (len + p).max(0),
    };
    // `at` is within 0..=len, so the conversion and the splice cannot fail.
    let at = usize::try_from(at).unwrap_or(arr.len()).min(arr.len());
    arr.splice(at..at, args.each.iter().cloned());
    match &args.sort {
        None => {}
        Some(PushSort::Whole(asc)) => arr.sort_by(|a, b| {
            let ord = super::compare(a, b);
            if *asc {
                ord
            } else {
                ord.reverse()
            }
        }),
        Some(PushSort::Pattern(spec)) => {
            // Elements that are not documents have every field missing.
            let empty = RawDocumentBuf::new();
            let mut keyed: Vec<(SortKey, Bson)> = arr
                .drain(..)
                .map(|e| {
                    let key = match &e {
                        Bson::Document(d) => match RawDocumentBuf::try_from(d) {
                            Ok(raw) => spec.sort_key(&raw),
                            Err(_) => spec.sort_key(&empty),
                        },
                        _ => spec.sort_key(&empty),
                    };
                    (key, e)
                })
                .collect();
            keyed.sort_by(|a, b| spec.compare_keys(&a.0, &b.0));
            arr.extend(keyed.into_iter().map(|(_, e)| e));
        }
    }
    if let Some(n) = args.slice {
        let len = arr.len();
        if n >= 0 {
            let keep = usize::try_from(n).unwrap_or(usize::MAX);
            arr.truncate(keep);
        } else {
            let keep = usize::try_from(n.unsigned_abs()).unwrap_or(usize::MAX);
            if keep < len {
                arr.drain(..len - keep);
            }
        }
    }
}
