//! Stored documents whose fields repeat a name, through the update path.
//!
//! BSON allows a name twice in one document and duetdb stores such a
//! document as sent (`prepare_insert`), as MongoDB does. The general update
//! path works on a `bson::Document`, which keeps one value per name: decoding
//! `{x: 1, x: 2}` into it would leave `{x: 2}` and the update would store
//! that, silently dropping a field. MongoDB's update system addresses the
//! *first* field of a name and keeps the others where they are.
//!
//! So a document with repeated names is decoded with every occurrence after
//! the first renamed to a mark, `"\0" <n> "\0" <name>`, and encoded back with
//! the mark turned into the name again. BSON keys cannot contain NUL, so no
//! path a client sends can address a mark: an update sees, and changes,
//! only the first occurrence of each name, and every other occurrence comes
//! back unchanged, in its place.
//!
//! Invariant: for a document without repeated names, [`to_document_marked`]
//! equals `doc::to_document` and [`to_raw_unmarked`] equals
//! `doc::to_raw_document` (the marks only exist where names repeat), and
//! `to_raw_unmarked(to_document_marked(d)) == d` byte for byte.

use std::collections::HashSet;

use bson::raw::{RawArray, RawDocument, RawDocumentBuf};
use bson::{Array, Bson, Document, RawBsonRef};

use super::MAX_DEPTH;
use crate::error::{Error, Result};

/// Whether any document in `raw` (nested ones included) repeats a name.
pub fn has_repeated_names(raw: &RawDocument) -> bool {
    fn doc(d: &RawDocument, depth: usize) -> bool {
        let mut seen = HashSet::new();
        for e in d.iter() {
            let Ok((k, v)) = e else { return false };
            if !seen.insert(k) || value(v, depth) {
                return true;
            }
        }
        false
    }
    fn value(v: RawBsonRef<'_>, depth: usize) -> bool {
        if depth > MAX_DEPTH {
            return false;
        }
        match v {
            RawBsonRef::Document(d) => doc(d, depth + 1),
            RawBsonRef::Array(a) => a.into_iter().any(|v| v.is_ok_and(|v| value(v, depth + 1))),
            _ => false,
        }
    }
    doc(raw, 0)
}

/// `raw` as a `Document`, each repeated name after its first occurrence
/// renamed to its mark (see the module doc).
pub fn to_document_marked(raw: &RawDocument) -> Result<Document> {
    fn doc(d: &RawDocument) -> Result<Document> {
        let mut out = Document::new();
        let mut n = 0usize;
        for e in d.iter() {
            let (k, v) = e.map_err(bad)?;
            let (k, v) = (k.as_str(), value(v)?);
            if out.contains_key(k) {
                n += 1;
                out.insert(format!("\0{n}\0{k}"), v);
            } else {
                out.insert(k, v);
            }
        }
        Ok(out)
    }
    fn array(a: &RawArray) -> Result<Array> {
        a.into_iter().map(|v| value(v.map_err(bad)?)).collect()
    }
    fn value(v: RawBsonRef<'_>) -> Result<Bson> {
        Ok(match v {
            RawBsonRef::Document(d) => Bson::Document(doc(d)?),
            RawBsonRef::Array(a) => Bson::Array(array(a)?),
            other => Bson::try_from(other).map_err(bad)?,
        })
    }
    doc(raw)
}

/// The name a key stands for: a mark's name, or the key itself.
fn unmark(key: &str) -> &str {
    let Some(rest) = key.strip_prefix('\0') else {
        return key;
    };
    match rest.split_once('\0') {
        Some((n, name)) if !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()) => name,
        _ => key,
    }
}

/// Encode `doc` as [`crate::doc::to_raw_document`] does, every mark turned
/// back into its name.
pub fn to_raw_unmarked(doc: &Document) -> Result<RawDocumentBuf> {
    fn document(d: &Document) -> Result<RawDocumentBuf> {
        let mut out = RawDocumentBuf::new();
        for (k, v) in d {
            let k = bson::raw::CString::try_from(unmark(k)).map_err(bad)?;
            out.append(k, value(v)?);
        }
        Ok(out)
    }
    fn value(v: &Bson) -> Result<bson::RawBson> {
        Ok(match v {
            Bson::Document(d) => bson::RawBson::Document(document(d)?),
            Bson::Array(a) => {
                let mut out = bson::RawArrayBuf::new();
                for v in a {
                    out.push(value(v)?);
                }
                bson::RawBson::Array(out)
            }
            other => bson::RawBson::try_from(other.clone()).map_err(bad)?,
        })
    }
    super::within_size_limit(document(doc)?)
}

fn bad(e: impl std::fmt::Display) -> Error {
    Error::InvalidBson(e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use bson::doc;

    /// `{_id: 1, x: 1, x: {y: 2, y: 3}, z: [{a: 1, a: 2}]}` as raw bytes.
    fn repeated() -> RawDocumentBuf {
        let mut inner = RawDocumentBuf::new();
        inner.append(bson::raw::cstr!("y"), 2);
        inner.append(bson::raw::cstr!("y"), 3);
        let mut in_array = RawDocumentBuf::new();
        in_array.append(bson::raw::cstr!("a"), 1);
        in_array.append(bson::raw::cstr!("a"), 2);
        let mut arr = bson::RawArrayBuf::new();
        arr.push(in_array);
        let mut d = RawDocumentBuf::new();
        d.append(bson::raw::cstr!("_id"), 1);
        d.append(bson::raw::cstr!("x"), 1);
        d.append(bson::raw::cstr!("x"), inner);
        d.append(bson::raw::cstr!("z"), arr);
        d
    }

    #[test]
    fn marks_round_trip_byte_for_byte() {
        let raw = repeated();
        assert!(has_repeated_names(&raw));
        let marked = to_document_marked(&raw).expect("decodes");
        // The first occurrence keeps its name and value.
        assert_eq!(marked.get("x"), Some(&Bson::Int32(1)));
        assert_eq!(marked.len(), 4);
        let back = to_raw_unmarked(&marked).expect("encodes");
        assert_eq!(back.as_bytes(), raw.as_bytes());
    }

    #[test]
    fn without_repeats_it_is_the_plain_decode() {
        let d = doc! {"_id": 1, "a": {"b": [1, {"c": 2}]}, "s": "x"};
        let raw = crate::doc::to_raw_document(&d).expect("encodes");
        assert!(!has_repeated_names(&raw));
        let marked = to_document_marked(&raw).expect("decodes");
        assert_eq!(marked, d);
        assert_eq!(
            to_raw_unmarked(&marked).expect("encodes").as_bytes(),
            raw.as_bytes()
        );
    }

    #[test]
    fn only_well_formed_marks_are_names() {
        assert_eq!(unmark("\u{0}3\u{0}x"), "x");
        assert_eq!(unmark("\u{0}\u{0}x"), "\u{0}\u{0}x");
        assert_eq!(unmark("\u{0}a\u{0}x"), "\u{0}a\u{0}x");
        // A key with NUL that is no mark is refused, as by the plain encoder.
        let d = doc! {"\u{0}bad": 1};
        assert!(to_raw_unmarked(&d).is_err());
    }
}
