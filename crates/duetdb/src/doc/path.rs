//! Dotted field paths (`"a.b.0.c"`) and the values they reach in a document.
//!
//! MongoDB's traversal rule, shared by filters, index keys and sort keys: a path
//! component applied to an array reaches into every element that is a document
//! (implicit traversal); a numeric component applied to an array also selects that
//! element. The values reached at the end of the path are returned as they are;
//! whether a final array also stands for its elements is the caller's decision
//! (filters: yes; index keys: yes, one key per element; sort: min/max element).

use bson::raw::{RawArray, RawDocument};
use bson::RawBsonRef;

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
}
