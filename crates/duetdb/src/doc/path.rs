//! Dotted field paths (`"a.b.0.c"`) and the values they reach in a document.
//!
//! MongoDB's traversal rule, shared by filters, index keys and sort keys: a path
//! component applied to an array reaches into every element that is a document
//! (implicit traversal); a numeric component applied to an array also selects that
//! element. The values reached at the end of the path are returned as they are;
//! whether a final array also stands for its elements is the caller's decision
//! (filters: yes; index keys: yes, one key per element; sort: min/max element).

use bson::raw::{RawArray, RawDocument};
use bson::{Bson, Document, RawBsonRef};

use crate::error::{render_shell, Error};

/// Upper bound on path components; deeper paths cannot reach anything because
/// documents nest at most [`crate::doc::MAX_DEPTH`] levels.
pub const MAX_PATH_COMPONENTS: usize = 200;

/// Every value `path` reaches in `doc`, in document order.
pub fn values<'a>(doc: &'a RawDocument, path: &str) -> Vec<RawBsonRef<'a>> {
    let mut out = Vec::new();
    let parts: Vec<&str> = path.split('.').collect();
    walk_doc(doc, &parts, &mut out, &mut false);
    out
}

/// Like [`values`], also telling whether an array was traversed on the way
/// (not counting a final array value).
pub fn values_with_multikey<'a>(doc: &'a RawDocument, path: &str) -> (Vec<RawBsonRef<'a>>, bool) {
    let mut out = Vec::new();
    let mut through_array = false;
    let parts: Vec<&str> = path.split('.').collect();
    walk_doc(doc, &parts, &mut out, &mut through_array);
    (out, through_array)
}

#[cfg(test)]
/// The single value at `path` following only documents (no array traversal except
/// numeric components). `None` when absent. Used where MongoDB needs one value
/// (e.g. `_id`, shard-key-like lookups).
pub fn get_plain<'a>(doc: &'a RawDocument, path: &str) -> Option<RawBsonRef<'a>> {
    let mut cur = RawBsonRef::Document(doc);
    for part in path.split('.') {
        cur = match cur {
            RawBsonRef::Document(d) => crate::doc::rawfield::field(d, part)?,
            RawBsonRef::Array(a) => {
                let idx: usize = part.parse().ok()?;
                a.get(idx).ok().flatten()?
            }
            _ => return None,
        };
    }
    Some(cur)
}

fn walk_doc<'a>(
    doc: &'a RawDocument,
    parts: &[&str],
    out: &mut Vec<RawBsonRef<'a>>,
    arr: &mut bool,
) {
    let Some((first, rest)) = parts.split_first() else {
        return;
    };
    if let Some(v) = crate::doc::rawfield::field(doc, first) {
        walk_value(v, rest, out, arr);
    }
}

fn walk_value<'a>(v: RawBsonRef<'a>, rest: &[&str], out: &mut Vec<RawBsonRef<'a>>, arr: &mut bool) {
    if rest.is_empty() {
        out.push(v);
        return;
    }
    match v {
        RawBsonRef::Document(d) => walk_doc(d, rest, out, arr),
        RawBsonRef::Array(a) => walk_array(a, rest, out, arr),
        _ => {}
    }
}

fn walk_array<'a>(a: &'a RawArray, rest: &[&str], out: &mut Vec<RawBsonRef<'a>>, arr: &mut bool) {
    *arr = true;
    let (first, tail) = (rest[0], &rest[1..]);
    // A numeric component selects the element at that position…
    if let Some(idx) = numeric_component(first) {
        if let Ok(Some(elem)) = a.get(idx) {
            walk_value(elem, tail, out, arr);
        }
    }
    // …and, as in MongoDB, is also tried as a field name inside element documents.
    for elem in a.into_iter().flatten() {
        if let RawBsonRef::Document(d) = elem {
            walk_doc(d, rest, out, arr);
        }
    }
}

/// `Some(n)` when the component is a canonical array index ("0", "17"; not "01").
pub fn numeric_component(part: &str) -> Option<usize> {
    if part.is_empty() || part.len() > 9 || !part.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    if part.len() > 1 && part.starts_with('0') {
        return None;
    }
    part.parse().ok()
}

/// Validate a field path given by a user: non-empty components, no `$` prefix
/// unless `allow_dollar`, bounded length.
pub fn validate(path: &str) -> Result<(), String> {
    if path.is_empty() {
        return Err("field path cannot be empty".into());
    }
    let mut n = 0;
    for part in path.split('.') {
        n += 1;
        if part.is_empty() {
            return Err(format!("field path '{path}' has an empty component"));
        }
    }
    if n > MAX_PATH_COMPONENTS {
        return Err(format!(
            "field path '{path}' has more than {MAX_PATH_COMPONENTS} components"
        ));
    }
    Ok(())
}

/// Most null elements one [`set_creating`] may add to an array (MongoDB's limit),
/// so a single `{$set: {"a.99999999": 1}}` cannot allocate without bound.
pub const MAX_ARRAY_PADDING: usize = 1_500_000;

/// Set `path` (already split into components) in `doc` to `value`, creating what
/// is missing on the way: absent fields become empty documents, and an array
/// reached by a numeric component is padded with nulls up to that index. This is
/// the update operators' setter (`$set`, `$inc`, … and `$rename`'s destination).
///
/// Unlike the traversal of [`values`], it never reaches into every element of an
/// array: a component applied to an array must be a canonical index, otherwise
/// the path is not viable. On a missing field a numeric component names a
/// document field (`{}` + `a.0` → `{a: {"0": …}}`), as in MongoDB.
///
/// Errors: [`Error::PathNotViable`] (code 28) when a component would have to be
/// created inside a scalar or by name inside an array; a bad value (code 2) when
/// padding would exceed [`MAX_ARRAY_PADDING`]; [`Error::Internal`] for an empty
/// path. On error `doc` may hold intermediate documents already created, so
/// callers work on a copy (update applies to a clone and discards it on error).
pub fn set_creating(doc: &mut Document, path: &[String], value: Bson) -> Result<(), Error> {
    let Some((first, rest)) = path.split_first() else {
        return Err(Error::Internal("empty update path".into()));
    };
    if rest.is_empty() {
        doc.insert(first.clone(), value);
        return Ok(());
    }
    let child = doc
        .entry(first.clone())
        .or_insert_with(|| Bson::Document(Document::new()));
    set_in(child, path, 1, value)
}

/// [`set_creating`] below the top level: `cur` is the value `path[..i]` names.
fn set_in(cur: &mut Bson, path: &[String], i: usize, value: Bson) -> Result<(), Error> {
    let Some(part) = path.get(i) else {
        return Err(Error::Internal("update path ended early".into()));
    };
    let last = i + 1 == path.len();
    match cur {
        Bson::Document(d) => {
            if last {
                d.insert(part.clone(), value);
                Ok(())
            } else {
                let child = d
                    .entry(part.clone())
                    .or_insert_with(|| Bson::Document(Document::new()));
                set_in(child, path, i + 1, value)
            }
        }
        Bson::Array(a) => {
            let Some(idx) = numeric_component(part) else {
                return Err(not_viable(path, i, cur));
            };
            if idx >= a.len() {
                if idx - a.len() > MAX_ARRAY_PADDING {
                    return Err(Error::bad_value(format!(
                        "can't backfill more than {MAX_ARRAY_PADDING} elements ('{}')",
                        path.join(".")
                    )));
                }
                a.resize(idx, Bson::Null);
                if last {
                    a.push(value);
                    return Ok(());
                }
                a.push(Bson::Document(Document::new()));
            } else if last {
                a[idx] = value;
                return Ok(());
            }
            match a.get_mut(idx) {
                Some(child) => set_in(child, path, i + 1, value),
                None => Err(Error::Internal("array index vanished".into())),
            }
        }
        _ => Err(not_viable(path, i, cur)),
    }
}

/// The error for a component `path[at]` that cannot be created inside `parent`
/// (the value `path[at - 1]` names): MongoDB's PathNotViable, code 28. Public so
/// that callers refusing the same situation before setting report it alike.
pub fn not_viable(path: &[String], at: usize, parent: &Bson) -> Error {
    let name = path.get(at).map(String::as_str).unwrap_or("");
    let parent_name = at
        .checked_sub(1)
        .and_then(|i| path.get(i))
        .map(String::as_str);
    Error::PathNotViable(format!(
        "Cannot create field '{name}' in element {{{}: {}}}",
        parent_name.unwrap_or(""),
        render_shell(parent)
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use bson::{rawdoc, Bson};

    fn vals(doc: &bson::RawDocumentBuf, path: &str) -> Vec<Bson> {
        values(doc, path)
            .into_iter()
            .map(|v| Bson::try_from(v).expect("bson"))
            .collect()
    }

    #[test]
    fn plain_and_nested() {
        let d = rawdoc! {"a": {"b": 1}, "c": 2};
        assert_eq!(vals(&d, "a.b"), vec![Bson::Int32(1)]);
        assert_eq!(vals(&d, "c"), vec![Bson::Int32(2)]);
        assert!(vals(&d, "a.x").is_empty());
        assert!(vals(&d, "c.x").is_empty());
    }

    #[test]
    fn arrays_of_documents_are_traversed() {
        let d = rawdoc! {"a": [{"b": 1}, {"b": [2, 3]}, 7, {"c": 1}]};
        assert_eq!(
            vals(&d, "a.b"),
            vec![Bson::Int32(1), Bson::Array(vec![2.into(), 3.into()])]
        );
        let (_, multi) = values_with_multikey(&d, "a.b");
        assert!(multi);
        let (_, multi) = values_with_multikey(&d, "a");
        assert!(!multi, "a final array is not traversal");
    }

    #[test]
    fn numeric_components_index_arrays() {
        let d = rawdoc! {"a": [{"b": 1}, {"b": 2}], "m": [[1, 2], [3]]};
        assert_eq!(vals(&d, "a.1.b"), vec![Bson::Int32(2)]);
        assert_eq!(vals(&d, "m.1"), vec![Bson::Array(vec![3.into()])]);
        assert_eq!(get_plain(&d, "a.0.b"), Some(RawBsonRef::Int32(1)));
        assert_eq!(numeric_component("01"), None);
        assert_eq!(numeric_component("10"), Some(10));
    }

    #[test]
    fn validate_paths() {
        assert!(validate("a.b").is_ok());
        assert!(validate("").is_err());
        assert!(validate("a..b").is_err());
        assert!(validate(".a").is_err());
    }

    fn parts(p: &str) -> Vec<String> {
        p.split('.').map(str::to_string).collect()
    }

    #[test]
    fn set_creating_creates_and_pads() {
        let mut d = bson::doc! {"a": [1], "s": 5};
        set_creating(&mut d, &parts("n.m"), Bson::Int32(1)).expect("set");
        set_creating(&mut d, &parts("a.2.b"), Bson::Int32(2)).expect("set");
        set_creating(&mut d, &parts("z.0"), Bson::Int32(3)).expect("set");
        assert_eq!(
            d,
            bson::doc! {"a": [1, null, {"b": 2}], "s": 5, "n": {"m": 1}, "z": {"0": 3}}
        );
        let err = set_creating(&mut d, &parts("s.x"), Bson::Null).expect_err("scalar");
        assert_eq!(err.code(), 28);
        let err = set_creating(&mut d, &parts("a.x"), Bson::Null).expect_err("by name");
        assert_eq!(err.code(), 28);
        let err = set_creating(&mut d, &parts("a.9999999"), Bson::Null).expect_err("padding");
        assert_eq!(err.code(), 2);
        assert!(set_creating(&mut d, &[], Bson::Null).is_err());
    }
}
