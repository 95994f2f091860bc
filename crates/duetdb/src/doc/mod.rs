//! Stored documents: validation on the way in, and their immutable shared form.
//!
//! Invariants of every stored document (checked here, relied on everywhere else):
//! - it is well-formed BSON, at most [`MAX_DOC_SIZE`] bytes, nested at most
//!   [`MAX_DEPTH`] levels;
//! - its first field is `_id`, of an allowed type (not an array, regex or
//!   undefined);
//! - it is never modified once stored: an update stores a new [`DocRef`] and the
//!   old one lives on only where a snapshot still references it (a pointer, never
//!   a copy of the bytes).

pub mod collation;
pub mod path;
pub mod rawfield;
pub mod repeated;
pub mod size;
pub mod types;
pub mod value;

use std::sync::Arc;

use bson::oid::ObjectId;
use bson::raw::{RawDocument, RawDocumentBuf};
use bson::{Bson, Document, RawBson, RawBsonRef};

use crate::error::{Error, Result};

/// Largest document accepted, as MongoDB: 16 MiB.
pub const MAX_DOC_SIZE: usize = 16 * 1024 * 1024;
/// Deepest nesting accepted (documents and arrays), as MongoDB.
pub const MAX_DEPTH: usize = 100;

/// A stored, immutable, reference-counted document.
pub type DocRef = Arc<RawDocumentBuf>;

/// Ask the CPU to start loading the cache line at `p` (a hint: no effect on
/// results, never a fault, whatever `p` points at). Scans call it a few
/// documents ahead: each stored document is two dependent allocations (the
/// `Arc` holding the buffer's pointer, then the bytes), and waiting for those
/// misses one document at a time was most of a scan's time.
#[inline(always)]
pub fn prefetch<T>(p: *const T) {
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
        // SAFETY: a prefetch reads nothing into the program and cannot
        // fault, whatever the address; SSE, its target feature, is part of
        // every x86_64 target.
        unsafe { _mm_prefetch::<_MM_HINT_T0>(p.cast::<i8>()) };
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = p;
}

/// Records ahead of the one being visited whose `Arc` (holding the bytes'
/// address) is prefetched by [`Prefetching`], and whose first bytes are: the
/// `Arc` must have arrived before its pointer to the bytes can be read
/// without a stall.
const AHEAD_ARC: usize = 16;
const AHEAD_BYTES: usize = 8;

/// An iterator over stored documents that asks the CPU for the documents a
/// few records ahead of the one it yields ([`prefetch`]): the same items in
/// the same order as the iterator it wraps, which it reads at most
/// [`AHEAD_ARC`] items ahead.
pub struct Prefetching<'a, K, I: Iterator<Item = (K, &'a DocRef)>> {
    inner: I,
    ahead: std::collections::VecDeque<(K, &'a DocRef)>,
}

/// Wrap `inner` in a [`Prefetching`] iterator.
pub fn prefetching<'a, K, I: Iterator<Item = (K, &'a DocRef)>>(inner: I) -> Prefetching<'a, K, I> {
    Prefetching {
        inner,
        ahead: std::collections::VecDeque::with_capacity(AHEAD_ARC + 1),
    }
}

impl<'a, K, I: Iterator<Item = (K, &'a DocRef)>> Iterator for Prefetching<'a, K, I> {
    type Item = (K, &'a DocRef);

    #[inline]
    fn next(&mut self) -> Option<Self::Item> {
        while self.ahead.len() <= AHEAD_ARC {
            let Some(item) = self.inner.next() else { break };
            prefetch(Arc::as_ptr(item.1));
            self.ahead.push_back(item);
        }
        if let Some((_, d)) = self.ahead.get(AHEAD_BYTES) {
            let bytes = d.as_bytes();
            prefetch(bytes.as_ptr());
            if bytes.len() > 64 {
                prefetch(bytes[64..].as_ptr());
            }
        }
        self.ahead.pop_front()
    }
}

/// The key a decoder adds to a document whose raw form had more than one
/// top-level `_id` (a `Document` keeps only the last, silently). BSON keys
/// cannot contain NUL, so no client can send it; a document carrying it is
/// refused wherever it would be stored ([`check_single_id`]).
pub const DUPLICATE_ID_MARK: &str = "\0duplicate _id";

/// Whether a raw document has more than one top-level `_id`.
pub fn has_duplicate_id(raw: &RawDocument) -> bool {
    raw.iter()
        .filter(|e| matches!(e, Ok((k, _)) if *k == "_id"))
        .nth(1)
        .is_some()
}

/// Refuse a document the decoder marked as having two `_id` fields
/// (MongoDB: BadValue, "can't have multiple _id fields in one document").
pub fn check_single_id(doc: &Document) -> Result<()> {
    if doc.contains_key(DUPLICATE_ID_MARK) {
        return Err(Error::bad_value(
            "can't have multiple _id fields in one document",
        ));
    }
    Ok(())
}

/// The key a decoder adds to a document to be inserted whose raw form
/// repeats a field name, holding the document's bytes (binary): BSON allows
/// repeated names and MongoDB stores such a document as sent, which a
/// `Document` (the last of two equal keys wins) cannot hold.
/// [`prepare_insert`] stores those bytes instead. NUL cannot appear in a
/// BSON key, so no client can send the mark itself.
pub const RAW_DOCUMENT_MARK: &str = "\0raw document";

/// Turn a user document into its stored form: `_id` first (generated when absent),
/// limits checked. Returns the raw document and its `_id`. A document
/// carrying [`RAW_DOCUMENT_MARK`] is stored from its raw bytes, every
/// element kept in order.
pub fn prepare_insert(doc: &Document) -> Result<(RawDocumentBuf, RawBson)> {
    check_single_id(doc)?;
    if let Some(Bson::Binary(b)) = doc.get(RAW_DOCUMENT_MARK) {
        return prepare_insert_raw(&b.bytes);
    }
    check_depth(doc)?;
    let id = match doc.get("_id") {
        Some(id) => {
            check_id(id)?;
            id.clone()
        }
        None => Bson::ObjectId(ObjectId::new()),
    };
    let mut out = Document::new();
    out.insert("_id", id.clone());
    for (k, v) in doc {
        if k != "_id" {
            out.insert(k.clone(), v.clone());
        }
    }
    let raw = exact(to_raw_document(&out)?);
    let raw_id =
        crate::doc::value::to_raw(&id).ok_or_else(|| Error::InvalidId("invalid _id".into()))?;
    Ok((raw, raw_id))
}

/// [`prepare_insert`] of a document kept as sent: its elements in order
/// (repeated names included) with `_id` moved first or generated; validated
/// as a stored document (size, depth, one `_id` of an allowed type).
fn prepare_insert_raw(bytes: &[u8]) -> Result<(RawDocumentBuf, RawBson)> {
    let raw = RawDocument::from_bytes(bytes).map_err(|e| Error::InvalidBson(e.to_string()))?;
    validate_raw(raw)?;
    if has_duplicate_id(raw) {
        return Err(Error::bad_value(
            "can't have multiple _id fields in one document",
        ));
    }
    let id = match raw
        .get("_id")
        .map_err(|e| Error::InvalidBson(e.to_string()))?
    {
        Some(v) => {
            let id = Bson::try_from(v).map_err(|e| Error::InvalidBson(e.to_string()))?;
            check_id(&id)?;
            id
        }
        None => Bson::ObjectId(ObjectId::new()),
    };
    let raw_id =
        crate::doc::value::to_raw(&id).ok_or_else(|| Error::InvalidId("invalid _id".into()))?;
    let mut out = RawDocumentBuf::new();
    out.append(bson::raw::cstr!("_id"), raw_id.clone());
    for e in raw.iter() {
        let (k, v) = e.map_err(|e| Error::InvalidBson(e.to_string()))?;
        if k != "_id" {
            out.append(k, v);
        }
    }
    let size = out.as_bytes().len();
    if size > MAX_DOC_SIZE {
        return Err(Error::DocumentTooLarge {
            size,
            limit: MAX_DOC_SIZE,
        });
    }
    Ok((exact(out), raw_id))
}

/// `raw` in a buffer of exactly its length, for a document that is kept:
/// encoding appends element by element, and the doubling `Vec` left a
/// 212-byte document in a 384-byte block (measured with
/// `examples/memory_breakdown.rs`: 432 vs 280 allocator bytes per stored
/// document with its `Arc`). The copy costs one small allocation per write.
pub fn exact(raw: RawDocumentBuf) -> RawDocumentBuf {
    // Length and trailing NUL are all `from_bytes` checks, and `raw` has both.
    RawDocumentBuf::from_bytes(raw.as_bytes().to_vec()).unwrap_or(raw)
}

/// Serialize a document, enforcing the size limit and rejecting keys BSON cannot hold.
pub fn to_raw_document(doc: &Document) -> Result<RawDocumentBuf> {
    let raw = RawDocumentBuf::try_from(doc).map_err(|e| Error::InvalidBson(e.to_string()))?;
    within_size_limit(raw)
}

/// `raw` if it fits the document size limit, else `DocumentTooLarge`.
pub(crate) fn within_size_limit(raw: RawDocumentBuf) -> Result<RawDocumentBuf> {
    let size = raw.as_bytes().len();
    if size > MAX_DOC_SIZE {
        return Err(Error::DocumentTooLarge {
            size,
            limit: MAX_DOC_SIZE,
        });
    }
    Ok(raw)
}

/// Parse a stored or received raw document into the owned form.
pub fn to_document(raw: &RawDocument) -> Result<Document> {
    Document::try_from(raw).map_err(|e| Error::InvalidBson(e.to_string()))
}

/// MongoDB forbids arrays, regexes and undefined as `_id` (53
/// InvalidIdField), and `$`-prefixed fields inside an `_id` document.
pub fn check_id(id: &Bson) -> Result<()> {
    match id {
        // MongoDB's `storage_validation::storageValidIdField`: 53.
        Bson::Array(_) | Bson::RegularExpression(_) | Bson::Undefined => Err(Error::Coded {
            code: 53,
            name: "InvalidIdField",
            msg: format!(
                "The '_id' value cannot be of type {}",
                crate::doc::types::type_name(id)
            ),
        }),
        Bson::Document(d) => {
            if let Some((k, _)) = d.iter().find(|(k, _)| k.starts_with('$')) {
                return Err(Error::InvalidId(format!(
                    "_id fields may not contain '$'-prefixed fields: {k} is not valid for storage"
                )));
            }
            Ok(())
        }
        _ => Ok(()),
    }
}

/// Reject documents nested deeper than [`MAX_DEPTH`]; iterative so hostile input
/// cannot overflow the stack here.
pub fn check_depth(doc: &Document) -> Result<()> {
    let mut stack: Vec<(&Bson, usize)> = doc.values().map(|v| (v, 1)).collect();
    while let Some((v, depth)) = stack.pop() {
        let children: Box<dyn Iterator<Item = &Bson>> = match v {
            Bson::Document(d) => Box::new(d.values()),
            Bson::Array(a) => Box::new(a.iter()),
            _ => continue,
        };
        if depth + 1 > MAX_DEPTH {
            return Err(Error::NestingTooDeep { limit: MAX_DEPTH });
        }
        stack.extend(children.map(|c| (c, depth + 1)));
    }
    Ok(())
}

/// Fully validate raw BSON received from outside: every element decodes, UTF-8
/// is valid, nesting within [`MAX_DEPTH`], size within [`MAX_DOC_SIZE`].
/// Iterative, so a hostile message cannot overflow the stack.
pub fn validate_raw(doc: &RawDocument) -> Result<()> {
    validate_raw_depth(doc, MAX_DEPTH)
}

/// [`validate_raw`] with another depth limit: `max_depth` levels below `doc`
/// (at most `max_depth` nested documents or arrays, as [`MAX_DEPTH`] counts
/// them). A server validates whole messages with a larger limit than stored
/// documents get (a command nests the documents it carries), and checks the
/// stored-document limit where documents are stored.
pub fn validate_raw_depth(doc: &RawDocument, max_depth: usize) -> Result<()> {
    let size = doc.as_bytes().len();
    if size > MAX_DOC_SIZE {
        return Err(Error::DocumentTooLarge {
            size,
            limit: MAX_DOC_SIZE,
        });
    }
    let mut stack: Vec<(RawBsonRef<'_>, usize)> = vec![(RawBsonRef::Document(doc), 0)];
    while let Some((v, depth)) = stack.pop() {
        if depth > max_depth {
            return Err(Error::NestingTooDeep { limit: max_depth });
        }
        match v {
            RawBsonRef::Document(d) => {
                for elem in d.iter() {
                    let (_, child) = elem.map_err(|e| Error::InvalidBson(e.to_string()))?;
                    stack.push((child, depth + 1));
                }
            }
            RawBsonRef::Array(a) => {
                for elem in a.into_iter() {
                    let child = elem.map_err(|e| Error::InvalidBson(e.to_string()))?;
                    stack.push((child, depth + 1));
                }
            }
            RawBsonRef::JavaScriptCodeWithScope(c) => {
                stack.push((RawBsonRef::Document(c.scope), depth + 1));
            }
            _ => {}
        }
    }
    Ok(())
}

/// The `_id` of a stored document (always present by the invariant above).
pub fn id_of(doc: &RawDocument) -> Option<RawBsonRef<'_>> {
    crate::doc::rawfield::field(doc, "_id")
}

#[cfg(test)]
mod tests {
    use super::*;
    use bson::doc;

    #[test]
    fn id_generated_and_moved_first() {
        let (raw, id) = prepare_insert(&doc! {"a": 1}).expect("insert");
        assert!(matches!(id, RawBson::ObjectId(_)));
        let first = raw.iter().next().expect("one field").expect("valid");
        assert_eq!(first.0.as_str(), "_id");
        let (raw, _) = prepare_insert(&doc! {"a": 1, "_id": 5}).expect("insert");
        let keys: Vec<String> = raw
            .iter()
            .map(|e| e.expect("ok").0.as_str().to_string())
            .collect();
        assert_eq!(keys, vec!["_id", "a"]);
    }

    #[test]
    fn forbidden_ids() {
        for (bad, code) in [
            (doc! {"_id": [1, 2]}, 53),
            (doc! {"_id": Bson::Undefined}, 53),
            (doc! {"_id": {"$x": 1}}, 2),
        ] {
            let err = prepare_insert(&bad).expect_err("must fail");
            assert_eq!(err.code(), code, "{err}");
        }
        let err = prepare_insert(&doc! {"_id": Bson::Undefined}).expect_err("must fail");
        assert_eq!(
            err.to_string(),
            "The '_id' value cannot be of type undefined"
        );
        assert!(prepare_insert(&doc! {"_id": {"a": 1}}).is_ok());
    }

    #[test]
    fn depth_limit() {
        let mut d = doc! {"x": 1};
        for _ in 0..MAX_DEPTH - 1 {
            d = doc! {"n": d};
        }
        assert!(prepare_insert(&d).is_ok(), "exactly at the limit");
        let too_deep = doc! {"n": d};
        assert!(matches!(
            prepare_insert(&too_deep),
            Err(Error::NestingTooDeep { .. })
        ));
        let raw = RawDocumentBuf::try_from(&too_deep).expect("encodes");
        assert!(matches!(
            validate_raw(&raw),
            Err(Error::NestingTooDeep { .. })
        ));
    }

    #[test]
    fn size_limit() {
        let big = "x".repeat(MAX_DOC_SIZE);
        let err = prepare_insert(&doc! {"s": big}).expect_err("too large");
        assert_eq!(err.code(), 10334);
    }

    #[test]
    fn garbage_bytes_are_rejected() {
        let mut bytes = RawDocumentBuf::try_from(&doc! {"a": "hello", "b": {"c": 1}})
            .expect("encodes")
            .into_bytes();
        // Corrupt the inner document's length prefix.
        let n = bytes.len();
        bytes[n - 10] = 0x7f;
        if let Ok(raw) = RawDocument::from_bytes(&bytes) {
            assert!(validate_raw(raw).is_err());
        }
    }
}
