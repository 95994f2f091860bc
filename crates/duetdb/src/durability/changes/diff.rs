//! The update description of a change event: what an update changed, in
//! MongoDB's `updateDescription` shape, computed from the old and new
//! versions of the document (the writer has both; no operator is re-run).
//!
//! Rules (MongoDB's delta reporting, as far as a diff of two versions can
//! tell it): a field added or changed at the top level or inside a
//! subdocument present in both versions is reported by its dotted path
//! (`a.b`) in `updatedFields`; a field gone is in `removedFields`; an array
//! present in both is diffed per element (`arr.3`), and one that shrank is
//! also in `truncatedArrays` as `{field, newSize}`; any other change (a type
//! change, a subdocument replaced by a scalar) reports the whole new value.
//! Reordered fields with equal values are not a change. A diff cannot tell
//! `$set: {a: {b: 1, c: 2}}` (MongoDB reports `a` whole) from `$set:
//! {"a.c": 2}`: both are reported as `a.c` here.

use bson::raw::{RawArray, RawBsonRef, RawDocument, RawDocumentBuf};
use bson::{Bson, Document};

/// Longest dotted path reported before the whole value is reported instead
/// (bounds the work on hostile nesting; documents nest ≤ 100 levels anyway).
const MAX_DIFF_DEPTH: usize = 100;

#[derive(Default)]
struct Diff {
    updated: Document,
    removed: Vec<Bson>,
    truncated: Vec<Bson>,
}

/// `{updatedFields, removedFields, truncatedArrays}` for the change `old` → `new`.
pub fn update_description(old: &RawDocument, new: &RawDocument) -> RawDocumentBuf {
    let mut d = Diff::default();
    diff_docs(&mut d, "", old, new, 0);
    let out = bson::doc! {
        "updatedFields": d.updated,
        "removedFields": d.removed,
        "truncatedArrays": d.truncated,
    };
    RawDocumentBuf::try_from(&out).unwrap_or_else(|_| RawDocumentBuf::new())
}

fn path(prefix: &str, key: &str) -> String {
    if prefix.is_empty() {
        key.to_string()
    } else {
        format!("{prefix}.{key}")
    }
}

fn value(v: RawBsonRef<'_>) -> Bson {
    Bson::try_from(v).unwrap_or(Bson::Null)
}

/// Equal values, bit for bit (so `0.0` → `-0.0` and `1` → `1.0` are changes,
/// as the stored bytes changed).
fn same(a: RawBsonRef<'_>, b: RawBsonRef<'_>) -> bool {
    match (a, b) {
        (RawBsonRef::Double(x), RawBsonRef::Double(y)) => x.to_bits() == y.to_bits(),
        (RawBsonRef::Document(x), RawBsonRef::Document(y)) => x.as_bytes() == y.as_bytes(),
        (RawBsonRef::Array(x), RawBsonRef::Array(y)) => x.as_bytes() == y.as_bytes(),
        _ => a == b,
    }
}

fn diff_docs(d: &mut Diff, prefix: &str, old: &RawDocument, new: &RawDocument, depth: usize) {
    for (k, v) in new.iter().flatten() {
        let p = path(prefix, k.as_str());
        match old.get(k).ok().flatten() {
            None => {
                d.updated.insert(p, value(v));
            }
            Some(o) if same(o, v) => {}
            Some(o) => diff_values(d, &p, o, v, depth),
        }
    }
    for (k, _) in old.iter().flatten() {
        if new.get(k).ok().flatten().is_none() {
            d.removed.push(Bson::String(path(prefix, k.as_str())));
        }
    }
}

fn diff_values(d: &mut Diff, p: &str, old: RawBsonRef<'_>, new: RawBsonRef<'_>, depth: usize) {
    match (old, new) {
        (RawBsonRef::Document(o), RawBsonRef::Document(n)) if depth < MAX_DIFF_DEPTH => {
            diff_docs(d, p, o, n, depth + 1)
        }
        (RawBsonRef::Array(o), RawBsonRef::Array(n)) if depth < MAX_DIFF_DEPTH => {
            diff_arrays(d, p, o, n, depth + 1)
        }
        _ => {
            d.updated.insert(p.to_string(), value(new));
        }
    }
}

fn diff_arrays(d: &mut Diff, p: &str, old: &RawArray, new: &RawArray, depth: usize) {
    let olds: Vec<RawBsonRef<'_>> = old.into_iter().flatten().collect();
    let news: Vec<RawBsonRef<'_>> = new.into_iter().flatten().collect();
    if news.len() < olds.len() {
        d.truncated.push(Bson::Document(
            bson::doc! {"field": p, "newSize": news.len() as i32},
        ));
    }
    for (i, n) in news.iter().enumerate() {
        let ep = format!("{p}.{i}");
        match olds.get(i) {
            Some(o) if same(*o, *n) => {}
            Some(o) => diff_values(d, &ep, *o, *n, depth),
            None => {
                d.updated.insert(ep, value(*n));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bson::rawdoc;

    fn desc(old: RawDocumentBuf, new: RawDocumentBuf) -> Document {
        crate::doc::to_document(&update_description(&old, &new)).expect("doc")
    }

    #[test]
    fn top_level_nested_removed_and_arrays() {
        let d = desc(
            rawdoc! {"_id": 1, "a": 1, "b": {"c": 1, "d": 2}, "gone": true, "arr": [1, 2, 3], "same": "x"},
            rawdoc! {"_id": 1, "a": 2, "b": {"c": 1, "d": 3, "e": 4}, "arr": [1, 9], "same": "x", "new": null},
        );
        assert_eq!(
            d,
            bson::doc! {
                "updatedFields": {"a": 2, "b.d": 3, "b.e": 4, "arr.1": 9, "new": null},
                "removedFields": ["gone"],
                "truncatedArrays": [{"field": "arr", "newSize": 2}],
            }
        );
    }

    #[test]
    fn type_change_reports_the_whole_value_and_reorder_is_no_change() {
        let d = desc(
            rawdoc! {"_id": 1, "a": {"x": 1}, "b": 1, "c": 2},
            rawdoc! {"_id": 1, "c": 2, "b": 1, "a": [1]},
        );
        assert_eq!(
            d,
            bson::doc! {"updatedFields": {"a": [1]}, "removedFields": [], "truncatedArrays": []}
        );
        let appended = desc(rawdoc! {"a": [1]}, rawdoc! {"a": [1, {"k": 2}]});
        assert_eq!(
            appended.get_document("updatedFields").expect("u"),
            &bson::doc! {"a.1": {"k": 2}}
        );
    }
}
