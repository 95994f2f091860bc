//! OP_MSG (opcode 2013): decoding a request into one command document and
//! encoding a reply.
//!
//! Layout after the header: `flagBits: u32`, then sections until the end (or
//! until the 4-byte CRC-32C when `checksumPresent`): kind 0 = one BSON document
//! (the command body, exactly once), kind 1 = `size: i32` (counting itself),
//! an identifier cstring, and BSON documents filling the rest of the section.
//!
//! Invariants:
//! - every document is fully validated (element framing, UTF-8, depth,
//!   size) in the same walk that builds its `Document` ([`walk`]: one pass
//!   over the bytes; it checks the depth before it descends, so hostile
//!   bytes cannot drive it deeper than the limit); a document the walk
//!   refuses is decoded as before — `duetdb::raw::validate_raw_depth`
//!   (iterative), then the conversion — so its error is the one it always
//!   was;
//! - the duplicate-name rules (`mark_duplicate_ids`, `dupfields`) read a
//!   document's bytes again only when the walk saw a repeated name: they
//!   leave every other document as decoded;
//! - one depth limit, [`MAX_MESSAGE_DEPTH`], for the merged command whichever
//!   section a document came in: a kind-1 document is checked at the depth it
//!   will have in the command (two levels down), so a document is accepted or
//!   refused the same way in a body or a sequence (stored documents are held
//!   to 100 levels by the engine when stored);
//! - every offset is bounds-checked; a malformed message yields a
//!   [`MsgError`], never a panic;
//! - kind-1 sequences are merged into the command as arrays under their
//!   identifier; an identifier that also appears in the body is an error.

use bson::{Bson, Document, RawBsonRef, RawDocument};

use crate::wire::{cstring, le_i32, Header, HEADER_LEN, MAX_MESSAGE_DEPTH};

pub const FLAG_CHECKSUM_PRESENT: u32 = 1;
pub const FLAG_MORE_TO_COME: u32 = 1 << 1;
pub const FLAG_EXHAUST_ALLOWED: u32 = 1 << 16;
/// Bits 0..15 are "required": a receiver must refuse any it does not know.
const REQUIRED_MASK: u32 = 0xffff;
const KNOWN_REQUIRED: u32 = FLAG_CHECKSUM_PRESENT | FLAG_MORE_TO_COME;

/// A malformed message; `code` is the MongoDB code used in the error reply.
#[derive(Debug, Clone, PartialEq)]
pub struct MsgError {
    pub code: i32,
    pub code_name: &'static str,
    pub message: String,
}

impl MsgError {
    pub fn invalid_bson(message: impl Into<String>) -> MsgError {
        MsgError {
            code: 22,
            code_name: "InvalidBSON",
            message: message.into(),
        }
    }
    pub fn protocol(message: impl Into<String>) -> MsgError {
        MsgError {
            code: 2,
            code_name: "BadValue",
            message: message.into(),
        }
    }
    pub fn checksum(message: impl Into<String>) -> MsgError {
        MsgError {
            code: 40579,
            code_name: "ChecksumMismatch",
            message: message.into(),
        }
    }
}

impl From<duetdb::Error> for MsgError {
    fn from(e: duetdb::Error) -> MsgError {
        MsgError {
            code: e.code(),
            code_name: e.code_name(),
            message: e.to_string(),
        }
    }
}

/// A decoded OP_MSG request.
#[derive(Debug)]
pub struct Request {
    pub flags: u32,
    /// The command: the body with every kind-1 sequence merged in.
    pub command: Document,
}

impl Request {
    pub fn more_to_come(&self) -> bool {
        self.flags & FLAG_MORE_TO_COME != 0
    }
}

/// Read the first `flags` of an OP_MSG body without decoding the rest (so a
/// reply can be suppressed for a malformed `moreToCome` message).
pub fn peek_flags(body: &[u8]) -> u32 {
    le_i32(body, 0).map(|f| f as u32).unwrap_or(0)
}

/// How much deeper a kind-1 document sits in the merged command than on its
/// own: it becomes an element of an array under its identifier.
const SEQUENCE_NESTING: usize = 2;

/// The BSON document framed at `at` within `limit` (its length prefix and
/// terminator checked, nothing inside yet), and the offset after it.
fn framed_at(b: &[u8], at: usize, limit: usize) -> Result<(&RawDocument, usize), MsgError> {
    let len = le_i32(b, at).ok_or_else(|| MsgError::invalid_bson("truncated document length"))?;
    if len < 5 {
        return Err(MsgError::invalid_bson(format!(
            "document length {len} is too small"
        )));
    }
    let end = at
        .checked_add(len as usize)
        .filter(|&e| e <= limit)
        .ok_or_else(|| MsgError::invalid_bson("document runs past the end of its section"))?;
    let raw =
        RawDocument::from_bytes(&b[at..end]).map_err(|e| MsgError::invalid_bson(e.to_string()))?;
    Ok((raw, end))
}

/// One document of a request (the body, `ident: None`, or one document of
/// the kind-1 sequence `ident`), nested at most `max_depth` levels, decoded
/// with the duplicate-name rules applied.
///
/// The common case is one walk over its bytes ([`walk`]): framing, UTF-8,
/// depth and size are checked while the `Document` is built, and the walk
/// notices whether any document in it repeats a name. Only then do the
/// duplicate rules (`mark_duplicate_ids`, `dupfields`) read the raw bytes
/// again: both leave a document without a repeated name untouched. Anything
/// the walk does not take on itself (a malformed or too deep document, code
/// with scope) is decoded the way it always was — `validate_raw_depth`,
/// then the conversion — so errors and results are the same, message for
/// message.
fn decode_document(
    raw: &RawDocument,
    ident: Option<&str>,
    max_depth: usize,
) -> Result<Document, MsgError> {
    let mut doc = match walk(raw, max_depth) {
        Some((doc, false)) => return Ok(doc),
        Some((doc, true)) => doc,
        None => {
            duetdb::raw::validate_raw_depth(raw, max_depth)?;
            to_doc(raw)?
        }
    };
    mark_duplicate_ids(raw, ident, &mut doc);
    crate::dupfields::keep_duplicates(raw, ident, &mut doc)?;
    Ok(doc)
}

/// One pass over `raw`: its `Document` and whether some document in it
/// (at any level) repeats a name; `None` when the bytes are malformed,
/// nested deeper than `max_depth` (counted as `validate_raw_depth` counts:
/// an element of the top level is at depth 1), larger than a document may
/// be, or hold JavaScript code with scope (rare; left to the slow path).
/// Accepts exactly what `validate_raw_depth` followed by
/// `Document::try_from` accepts (minus code with scope), and builds the same
/// `Document`: the same element iterator, the same leaf conversion, the
/// same insertion (the last of two equal names wins, in the first's place).
/// Recursive, but never deeper than `max_depth`, checked before descending.
fn walk(raw: &RawDocument, max_depth: usize) -> Option<(Document, bool)> {
    if raw.as_bytes().len() > duetdb::raw::MAX_DOC_SIZE {
        return None;
    }
    let mut repeats = false;
    let doc = walk_doc(raw, 0, max_depth, &mut repeats)?;
    Some((doc, repeats))
}

fn walk_doc(raw: &RawDocument, depth: usize, max: usize, repeats: &mut bool) -> Option<Document> {
    let mut out = Document::new();
    for el in raw.iter() {
        let (k, v) = el.ok()?;
        let v = walk_value(v, depth + 1, max, repeats)?;
        if out.insert(k.as_str(), v).is_some() {
            *repeats = true;
        }
    }
    Some(out)
}

/// The value of an element at `depth`.
fn walk_value(v: RawBsonRef<'_>, depth: usize, max: usize, repeats: &mut bool) -> Option<Bson> {
    if depth > max {
        return None;
    }
    Some(match v {
        RawBsonRef::Document(d) => Bson::Document(walk_doc(d, depth, max, repeats)?),
        RawBsonRef::Array(a) => {
            let mut out = Vec::new();
            for el in a.into_iter() {
                out.push(walk_value(el.ok()?, depth + 1, max, repeats)?);
            }
            Bson::Array(out)
        }
        RawBsonRef::JavaScriptCodeWithScope(_) => return None,
        leaf => Bson::try_from(leaf).ok()?,
    })
}

fn to_doc(raw: &RawDocument) -> Result<Document, MsgError> {
    Document::try_from(raw).map_err(|e| MsgError::invalid_bson(e.to_string()))
}

/// A `Document` keeps only the last of two equal keys, so a document to be
/// stored whose raw form has two top-level `_id`s would lose one silently.
/// Such a document gets the engine's mark instead, and the write refuses it
/// (BadValue, per document, as MongoDB does). Documents to be stored: the
/// `documents` of an insert, the replacement `u` of update statements, and
/// findAndModify's `update`; `raw` is the command body or one document of a
/// kind-1 section named `ident`.
pub fn mark_duplicate_ids(raw: &RawDocument, ident: Option<&str>, doc: &mut Document) {
    use duetdb::raw::{has_duplicate_id, DUPLICATE_ID_MARK};
    let mark = |d: &mut Document| {
        d.insert(DUPLICATE_ID_MARK, true);
    };
    let statement_u = |stmt: &RawDocument, out: &mut Document| {
        if let (Ok(u), Ok(d)) = (stmt.get_document("u"), out.get_document_mut("u")) {
            if has_duplicate_id(u) {
                mark(d);
            }
        }
    };
    match ident {
        Some("documents") => {
            if has_duplicate_id(raw) {
                mark(doc);
            }
        }
        Some("updates") => statement_u(raw, doc),
        Some(_) => {}
        None => {
            if let Ok(docs) = raw.get_array("documents") {
                for (i, el) in docs.into_iter().enumerate() {
                    if let (Ok(bson::RawBsonRef::Document(d)), Ok(out)) =
                        (el, doc.get_array_mut("documents"))
                    {
                        if has_duplicate_id(d) {
                            if let Some(Bson::Document(o)) = out.get_mut(i) {
                                mark(o);
                            }
                        }
                    }
                }
            }
            if let Ok(stmts) = raw.get_array("updates") {
                for (i, el) in stmts.into_iter().enumerate() {
                    if let (Ok(bson::RawBsonRef::Document(stmt)), Ok(out)) =
                        (el, doc.get_array_mut("updates"))
                    {
                        if let Some(Bson::Document(o)) = out.get_mut(i) {
                            statement_u(stmt, o);
                        }
                    }
                }
            }
            if let (Ok(u), Ok(out)) = (raw.get_document("update"), doc.get_document_mut("update")) {
                if has_duplicate_id(u) {
                    mark(out);
                }
            }
        }
    }
}

/// An OP_MSG body's flags and where its sections end: an unknown required
/// flag bit is refused and, when the body carries one, its CRC-32C checksum
/// is verified and excluded.
fn payload_end(header: &Header, body: &[u8]) -> Result<(u32, usize), MsgError> {
    let flags =
        le_i32(body, 0).ok_or_else(|| MsgError::protocol("OP_MSG too short for its flags"))? as u32;
    let unknown = flags & REQUIRED_MASK & !KNOWN_REQUIRED;
    if unknown != 0 {
        return Err(MsgError::protocol(format!(
            "OP_MSG has unknown required flag bits {unknown:#x}"
        )));
    }
    let mut end = body.len();
    if flags & FLAG_CHECKSUM_PRESENT != 0 {
        if body.len() < 8 {
            return Err(MsgError::checksum("OP_MSG too short for its checksum"));
        }
        end -= 4;
        let sent = u32::from_le_bytes([body[end], body[end + 1], body[end + 2], body[end + 3]]);
        let mut hb = Vec::with_capacity(HEADER_LEN);
        header.write(&mut hb);
        let crc = crc32c::crc32c_append(crc32c::crc32c(&hb), &body[..end]);
        if crc != sent {
            return Err(MsgError::checksum(format!(
                "OP_MSG checksum mismatch: computed {crc:#010x}, message says {sent:#010x}"
            )));
        }
    }
    Ok((flags, end))
}

/// Decode an OP_MSG body (the bytes after the header).
pub fn decode(header: &Header, body: &[u8]) -> Result<Request, MsgError> {
    let (flags, end) = payload_end(header, body)?;
    let mut at = 4;
    let mut command: Option<Document> = None;
    let mut sequences: Vec<(String, Vec<Bson>)> = Vec::new();
    while at < end {
        let kind = body[at];
        at += 1;
        match kind {
            0 => {
                if command.is_some() {
                    return Err(MsgError::protocol("OP_MSG has more than one body section"));
                }
                let (raw, next) = framed_at(body, at, end)?;
                command = Some(decode_document(raw, None, MAX_MESSAGE_DEPTH)?);
                at = next;
            }
            1 => {
                let size = le_i32(body, at)
                    .ok_or_else(|| MsgError::protocol("truncated document sequence size"))?;
                let sec_end = at
                    .checked_add(usize::try_from(size).unwrap_or(0))
                    .filter(|&e| size >= 5 && e <= end)
                    .ok_or_else(|| {
                        MsgError::protocol(format!("document sequence size {size} is invalid"))
                    })?;
                let (ident, mut p) = cstring(&body[..sec_end], at + 4).ok_or_else(|| {
                    MsgError::protocol("document sequence identifier is not a valid cstring")
                })?;
                let mut docs = Vec::new();
                while p < sec_end {
                    let (raw, next) = framed_at(body, p, sec_end)?;
                    let doc =
                        decode_document(raw, Some(ident), MAX_MESSAGE_DEPTH - SEQUENCE_NESTING)?;
                    docs.push(Bson::Document(doc));
                    p = next;
                }
                sequences.push((ident.to_string(), docs));
                at = sec_end;
            }
            k => {
                return Err(MsgError::protocol(format!(
                    "OP_MSG has an unknown section kind {k}"
                )))
            }
        }
    }
    let mut command = command.ok_or_else(|| MsgError::protocol("OP_MSG has no body section"))?;
    for (ident, docs) in sequences {
        if command.contains_key(&ident) {
            return Err(MsgError::protocol(format!(
                "field '{ident}' appears both in the body and as a document sequence"
            )));
        }
        command.insert(ident, docs);
    }
    Ok(Request { flags, command })
}

/// Encode a reply body (flags 0, one kind-0 section) after the header.
pub fn encode_reply(doc: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(REPLY_PREFIX.len() + doc.len());
    out.extend_from_slice(&REPLY_PREFIX);
    out.extend_from_slice(doc);
    out
}

/// What precedes a reply's document in its body: flag bits 0 and a kind-0
/// (body) section marker.
pub const REPLY_PREFIX: [u8; 5] = [0; 5];

#[cfg(test)]
mod tests {
    use super::*;
    use bson::doc;

    fn header(len: usize) -> Header {
        Header {
            message_length: (HEADER_LEN + len) as i32,
            request_id: 1,
            response_to: 0,
            op_code: crate::wire::OP_MSG,
        }
    }

    fn bytes(d: &Document) -> Vec<u8> {
        let mut v = Vec::new();
        d.to_writer(&mut v).expect("serialize");
        v
    }

    #[test]
    fn merges_sequences_and_checks_crc() {
        let mut body = 0u32.to_le_bytes().to_vec();
        body.push(0);
        body.extend(bytes(&doc! {"insert": "c", "$db": "t"}));
        body.push(1);
        let d1 = bytes(&doc! {"a": 1});
        let d2 = bytes(&doc! {"a": 2});
        let size = 4 + "documents".len() + 1 + d1.len() + d2.len();
        body.extend((size as i32).to_le_bytes());
        body.extend(b"documents\0");
        body.extend(&d1);
        body.extend(&d2);
        let req = decode(&header(body.len()), &body).expect("decode");
        assert_eq!(
            req.command.get_array("documents").expect("docs").len(),
            2,
            "{:?}",
            req.command
        );

        // With a checksum.
        body[0] = FLAG_CHECKSUM_PRESENT as u8;
        let h = header(body.len() + 4);
        let mut hb = Vec::new();
        h.write(&mut hb);
        let crc = crc32c::crc32c_append(crc32c::crc32c(&hb), &body);
        let mut good = body.clone();
        good.extend(crc.to_le_bytes());
        assert!(decode(&h, &good).is_ok());
        let mut bad = body.clone();
        bad.extend((crc ^ 1).to_le_bytes());
        assert_eq!(decode(&h, &bad).expect_err("crc").code, 40579);
    }

    /// Fuzz-lite: random mutations of valid messages never panic the decoders
    /// (a deterministic xorshift stream, so failures reproduce).
    #[test]
    fn random_mutations_never_panic() {
        let mut seed: u64 = 0x9e37_79b9_7f4a_7c15;
        let mut next = move || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed
        };
        let mut base = 0u32.to_le_bytes().to_vec();
        base.push(0);
        base.extend(bytes(
            &doc! {"find": "c", "filter": {"a": {"$in": [1, "x", {"b": [2]}]}}, "$db": "t"},
        ));
        base.push(1);
        let d = bytes(&doc! {"q": {"x": 1}, "u": {"$set": {"y": 2}}});
        base.extend(((4 + 8 + d.len()) as i32).to_le_bytes());
        base.extend(b"updates\0");
        base.extend(&d);
        for _ in 0..20_000 {
            let mut m = base.clone();
            let edits = 1 + (next() % 4) as usize;
            for _ in 0..edits {
                let at = (next() as usize) % m.len();
                match next() % 3 {
                    0 => m[at] = next() as u8,
                    1 => m.truncate(at.max(1)),
                    _ => m.insert(at, next() as u8),
                }
            }
            let _ = decode(&header(m.len()), &m);
            let _ = crate::opquery::decode(&m);
        }
    }

    /// `{a: {a: ... {a: 1}}}` with `levels` documents.
    fn nested(levels: usize) -> Document {
        let mut d = doc! {"a": 1};
        for _ in 1..levels {
            d = doc! {"a": d};
        }
        d
    }

    fn as_body(d: &Document) -> Vec<u8> {
        let mut body = 0u32.to_le_bytes().to_vec();
        body.push(0);
        body.extend(bytes(
            &doc! {"insert": "c", "$db": "t", "documents": [d.clone()]},
        ));
        body
    }

    fn as_sequence(d: &Document) -> Vec<u8> {
        let mut body = 0u32.to_le_bytes().to_vec();
        body.push(0);
        body.extend(bytes(&doc! {"insert": "c", "$db": "t"}));
        body.push(1);
        let d = bytes(d);
        body.extend(((4 + "documents".len() + 1 + d.len()) as i32).to_le_bytes());
        body.extend(b"documents\0");
        body.extend(&d);
        body
    }

    /// One depth limit: a document is accepted or refused alike whether it
    /// comes in the body or in a document sequence.
    #[test]
    fn one_depth_limit_for_every_section() {
        let deepest = MAX_MESSAGE_DEPTH - SEQUENCE_NESTING;
        for levels in [100, 101, deepest - 1, deepest, deepest + 1, deepest + 2] {
            let d = nested(levels);
            let a = as_body(&d);
            let b = as_sequence(&d);
            let ra = decode(&header(a.len()), &a).map(|_| ()).map_err(|e| e.code);
            let rb = decode(&header(b.len()), &b).map(|_| ()).map_err(|e| e.code);
            assert_eq!(ra, rb, "{levels} levels");
            assert_eq!(ra.is_ok(), levels <= deepest, "{levels} levels");
            if let Err(code) = ra {
                assert_eq!(code, 15);
            }
        }
    }

    #[test]
    fn garbage_is_an_error_not_a_panic() {
        let cases: Vec<Vec<u8>> = vec![
            vec![],
            vec![0, 0],
            vec![0, 0, 0, 0],
            vec![0, 0, 0, 0, 7],
            vec![0, 0, 0, 0, 0, 255, 255, 255, 127],
            vec![0, 0, 0, 0, 0, 5, 0, 0, 0, 1],
            vec![0, 0, 0, 0, 1, 200, 0, 0, 0, b'x'],
            vec![4, 0, 0, 0, 0, 5, 0, 0, 0, 0],
        ];
        for c in cases {
            assert!(decode(&header(c.len()), &c).is_err(), "{c:?}");
        }
    }

    /// The decoder as it was before the one-pass walk (validate, convert,
    /// then the duplicate rules on every document): the new decoder must
    /// answer every message exactly as it did.
    fn reference_decode(header: &Header, body: &[u8]) -> Result<Request, MsgError> {
        fn document_at(
            b: &[u8],
            at: usize,
            limit: usize,
            max_depth: usize,
        ) -> Result<(&RawDocument, usize), MsgError> {
            let (raw, end) = framed_at(b, at, limit)?;
            duetdb::raw::validate_raw_depth(raw, max_depth)?;
            Ok((raw, end))
        }
        // The framing did not change: shared with the decoder under test.
        let (flags, end) = payload_end(header, body)?;
        let mut at = 4;
        let mut command: Option<Document> = None;
        let mut sequences: Vec<(String, Vec<Bson>)> = Vec::new();
        while at < end {
            let kind = body[at];
            at += 1;
            match kind {
                0 => {
                    if command.is_some() {
                        return Err(MsgError::protocol("OP_MSG has more than one body section"));
                    }
                    let (raw, next) = document_at(body, at, end, MAX_MESSAGE_DEPTH)?;
                    let mut doc = to_doc(raw)?;
                    mark_duplicate_ids(raw, None, &mut doc);
                    crate::dupfields::keep_duplicates(raw, None, &mut doc)?;
                    command = Some(doc);
                    at = next;
                }
                1 => {
                    let size = le_i32(body, at)
                        .ok_or_else(|| MsgError::protocol("truncated document sequence size"))?;
                    let sec_end = at
                        .checked_add(usize::try_from(size).unwrap_or(0))
                        .filter(|&e| size >= 5 && e <= end)
                        .ok_or_else(|| {
                            MsgError::protocol(format!("document sequence size {size} is invalid"))
                        })?;
                    let (ident, mut p) = cstring(&body[..sec_end], at + 4).ok_or_else(|| {
                        MsgError::protocol("document sequence identifier is not a valid cstring")
                    })?;
                    let mut docs = Vec::new();
                    while p < sec_end {
                        let (raw, next) =
                            document_at(body, p, sec_end, MAX_MESSAGE_DEPTH - SEQUENCE_NESTING)?;
                        let mut doc = to_doc(raw)?;
                        mark_duplicate_ids(raw, Some(ident), &mut doc);
                        crate::dupfields::keep_duplicates(raw, Some(ident), &mut doc)?;
                        docs.push(Bson::Document(doc));
                        p = next;
                    }
                    sequences.push((ident.to_string(), docs));
                    at = sec_end;
                }
                k => {
                    return Err(MsgError::protocol(format!(
                        "OP_MSG has an unknown section kind {k}"
                    )))
                }
            }
        }
        let mut command =
            command.ok_or_else(|| MsgError::protocol("OP_MSG has no body section"))?;
        for (ident, docs) in sequences {
            if command.contains_key(&ident) {
                return Err(MsgError::protocol(format!(
                    "field '{ident}' appears both in the body and as a document sequence"
                )));
            }
            command.insert(ident, docs);
        }
        Ok(Request { flags, command })
    }

    /// `decode` and [`reference_decode`] agree on `body`: the same error,
    /// or the same command, byte for byte (a `Document`'s `==` ignores
    /// order). Returns the outcome for further checks.
    fn agrees(body: &[u8]) -> Result<Document, MsgError> {
        let h = header(body.len());
        let new = decode(&h, body);
        let old = reference_decode(&h, body);
        match (&new, &old) {
            (Ok(a), Ok(b)) => {
                assert_eq!(a.flags, b.flags);
                // Debug keeps order and types, and prints the decoders'
                // marks (NUL-led names, which no serializer writes).
                assert_eq!(format!("{:?}", a.command), format!("{:?}", b.command));
            }
            (Err(a), Err(b)) => assert_eq!(a, b, "{body:?}"),
            _ => panic!("decoders disagree on {body:?}: {new:?} vs {old:?}"),
        }
        new.map(|r| r.command)
    }

    /// A body section holding `raw`, then `sequences` (identifier, documents).
    fn message(raw: &[u8], sequences: &[(&str, Vec<Vec<u8>>)]) -> Vec<u8> {
        let mut body = 0u32.to_le_bytes().to_vec();
        body.push(0);
        body.extend(raw);
        for (ident, docs) in sequences {
            body.push(1);
            let size = 4 + ident.len() + 1 + docs.iter().map(Vec::len).sum::<usize>();
            body.extend((size as i32).to_le_bytes());
            body.extend(ident.as_bytes());
            body.push(0);
            for d in docs {
                body.extend(d);
            }
        }
        body
    }

    fn raw_bytes(d: bson::RawDocumentBuf) -> Vec<u8> {
        d.into_bytes()
    }

    /// `{name: value, name: value2}` at the top of a raw document.
    fn twice(
        name: &str,
        a: impl Into<bson::RawBson>,
        b: impl Into<bson::RawBson>,
    ) -> bson::RawDocumentBuf {
        let mut d = bson::RawDocumentBuf::new();
        let k: &bson::raw::CStr = name.try_into().expect("cstr");
        d.append(k, a.into());
        d.append(k, b.into());
        d
    }

    #[test]
    fn truncated_messages_fail_as_before() {
        let head = bytes(&doc! {"update": "c", "$db": "t", "ordered": true});
        let full = message(
            &head,
            &[(
                "updates",
                vec![bytes(
                    &doc! {"q": {"_id": 1}, "u": {"$set": {"s": "text", "n": [1, {"x": 2.5}]}}},
                )],
            )],
        );
        assert!(agrees(&full).is_ok());
        for n in 0..full.len() {
            let cut = &full[..n];
            let r = agrees(cut);
            // Cut right after the body, the message is the body alone.
            assert_eq!(r.is_ok(), n == 5 + head.len(), "cut at {n}");
        }
        // A document whose own length says more than its section holds.
        let mut lying = full.clone();
        lying[5] = lying[5].wrapping_add(9);
        let e = agrees(&lying).expect_err("length past its section");
        assert_eq!(e.code, 22);
    }

    #[test]
    fn bad_section_kinds_fail_as_before() {
        let good = message(&bytes(&doc! {"ping": 1, "$db": "admin"}), &[]);
        for kind in [2u8, 3, 7, 128, 255] {
            let mut m = good.clone();
            m[4] = kind;
            let e = agrees(&m).expect_err("unknown kind");
            assert_eq!(e.code, 2);
            assert!(e.message.contains("unknown section kind"), "{}", e.message);
            // After a valid body.
            let mut m = good.clone();
            m.push(kind);
            m.extend(bytes(&doc! {"a": 1}));
            assert_eq!(agrees(&m).expect_err("unknown kind").code, 2);
        }
        // Two bodies, no body, a sequence named like a body field.
        let mut two = good.clone();
        two.extend(&good[4..]);
        assert!(agrees(&two)
            .expect_err("two bodies")
            .message
            .contains("more than one body"));
        let only_seq = {
            let mut m = message(
                &bytes(&doc! {"ping": 1, "$db": "admin"}),
                &[("documents", vec![bytes(&doc! {"a": 1})])],
            );
            let body_len = bytes(&doc! {"ping": 1, "$db": "admin"}).len();
            m.drain(4..5 + body_len);
            m
        };
        assert!(agrees(&only_seq)
            .expect_err("no body")
            .message
            .contains("no body section"));
        let clash = message(
            &bytes(&doc! {"insert": "c", "documents": [], "$db": "t"}),
            &[("documents", vec![bytes(&doc! {"a": 1})])],
        );
        assert!(agrees(&clash)
            .expect_err("clash")
            .message
            .contains("appears both"));
    }

    #[test]
    fn duplicate_fields_decode_as_before() {
        // A filter that repeats a name: rewritten into an $and.
        let mut find = bson::rawdoc! {"find": "c"};
        find.append(
            bson::raw::cstr!("filter"),
            twice("a", 1, bson::rawdoc! {"$gt": 1}),
        );
        find.append(bson::raw::cstr!("$db"), "t");
        let cmd = agrees(&message(&raw_bytes(find), &[])).expect("find");
        assert_eq!(
            cmd.get_document("filter").expect("filter"),
            &doc! {"$and": [{"a": 1}, {"a": {"$gt": 1}}]}
        );
        // Two `_id`s in an inserted document, in the body and in a sequence:
        // marked, as before (the insert refuses it).
        let dup_id = twice("_id", 1, 2);
        let mut docs = bson::RawArrayBuf::new();
        docs.push(dup_id.clone());
        let mut ins = bson::rawdoc! {"insert": "c"};
        ins.append(bson::raw::cstr!("documents"), docs);
        ins.append(bson::raw::cstr!("$db"), "t");
        let cmd = agrees(&message(&raw_bytes(ins), &[])).expect("insert");
        let d = cmd.get_array("documents").expect("docs")[0]
            .as_document()
            .expect("doc")
            .clone();
        assert!(d.contains_key(duetdb::raw::DUPLICATE_ID_MARK), "{d:?}");
        let cmd = agrees(&message(
            &bytes(&doc! {"insert": "c", "$db": "t"}),
            &[("documents", vec![raw_bytes(dup_id.clone())])],
        ))
        .expect("insert sequence");
        let d = cmd.get_array("documents").expect("docs")[0]
            .as_document()
            .expect("doc")
            .clone();
        assert!(d.contains_key(duetdb::raw::DUPLICATE_ID_MARK), "{d:?}");
        // A repeated name deep in an inserted document: its bytes are kept.
        let mut deep = bson::rawdoc! {"_id": 1};
        deep.append(bson::raw::cstr!("n"), twice("x", 1, 2));
        let cmd = agrees(&message(
            &bytes(&doc! {"insert": "c", "$db": "t"}),
            &[("documents", vec![raw_bytes(deep)])],
        ))
        .expect("insert deep");
        let d = cmd.get_array("documents").expect("docs")[0]
            .as_document()
            .expect("doc")
            .clone();
        assert!(d.contains_key(duetdb::raw::RAW_DOCUMENT_MARK), "{d:?}");
        // A repeated top-level field of the command: the strict check's error.
        let mut rep = twice("find", "c", "d");
        rep.append(bson::raw::cstr!("$db"), "t");
        let _ = agrees(&message(&raw_bytes(rep), &[]));
        // A $group _id object literal that repeats a name: 16406, as before.
        let mut group = bson::rawdoc! {};
        group.append(bson::raw::cstr!("_id"), twice("k", "$a", "$b"));
        let mut stage = bson::rawdoc! {};
        stage.append(bson::raw::cstr!("$group"), group);
        let mut pipeline = bson::RawArrayBuf::new();
        pipeline.push(stage);
        let mut agg = bson::rawdoc! {"aggregate": "c"};
        agg.append(bson::raw::cstr!("pipeline"), pipeline);
        agg.append(bson::raw::cstr!("cursor"), bson::rawdoc! {});
        agg.append(bson::raw::cstr!("$db"), "t");
        assert_eq!(
            agrees(&message(&raw_bytes(agg), &[]))
                .expect_err("16406")
                .code,
            16406
        );
        // A repeated name in an update statement's `q`, in a sequence.
        let mut stmt = bson::rawdoc! {};
        stmt.append(bson::raw::cstr!("q"), twice("a", 1, 2));
        stmt.append(bson::raw::cstr!("u"), bson::rawdoc! {"$set": {"b": 1}});
        let cmd = agrees(&message(
            &bytes(&doc! {"update": "c", "$db": "t"}),
            &[("updates", vec![raw_bytes(stmt)])],
        ))
        .expect("update");
        let s = cmd.get_array("updates").expect("updates")[0]
            .as_document()
            .expect("stmt")
            .clone();
        assert!(
            s.get_document("q").expect("q").contains_key("$and"),
            "{s:?}"
        );
    }

    #[test]
    fn too_deep_fails_as_before() {
        let deepest = MAX_MESSAGE_DEPTH - SEQUENCE_NESTING;
        for levels in [
            deepest - 1,
            deepest,
            deepest + 1,
            MAX_MESSAGE_DEPTH,
            MAX_MESSAGE_DEPTH + 1,
        ] {
            let d = nested(levels);
            for m in [as_body(&d), as_sequence(&d)] {
                if let Err(e) = agrees(&m) {
                    assert_eq!(e.code, 15, "{levels}");
                }
            }
            // Through arrays too.
            let mut a = Bson::Int32(1);
            for _ in 0..levels {
                a = Bson::Array(vec![a]);
            }
            let _ = agrees(&message(
                &bytes(&doc! {"find": "c", "filter": {"a": a}, "$db": "t"}),
                &[],
            ));
        }
        // The walk itself stops at the limit.
        let d = RawDocument::from_bytes(&bytes(&nested(4)))
            .map(|r| r.to_owned())
            .expect("raw");
        assert!(walk(&d, 4).is_some());
        assert!(walk(&d, 3).is_none());
    }

    #[test]
    fn malformed_contents_fail_as_before() {
        let valid = bytes(&doc! {"find": "c", "filter": {"s": "héllo"}, "$db": "t"});
        // Bad UTF-8 in a string value and in a key.
        let at = valid
            .windows(2)
            .position(|w| w == "é".as_bytes())
            .expect("é");
        let mut bad_value = valid.clone();
        bad_value[at] = 0xff;
        assert_eq!(
            agrees(&message(&bad_value, &[])).expect_err("utf-8").code,
            22
        );
        let key = valid.windows(6).position(|w| w == b"filter").expect("key");
        let mut bad_key = valid.clone();
        bad_key[key] = 0xc3;
        assert!(agrees(&message(&bad_key, &[])).is_err());
        // An unknown element type.
        let mut bad_type = valid.clone();
        bad_type[key - 1] = 0x42;
        assert_eq!(agrees(&message(&bad_type, &[])).expect_err("type").code, 22);
        // Code with scope is left to the old path, decoded the same.
        let code = bson::Bson::JavaScriptCodeWithScope(bson::JavaScriptCodeWithScope {
            code: "f()".into(),
            scope: doc! {"x": 1},
        });
        agrees(&message(
            &bytes(&doc! {"find": "c", "filter": {"$where": code}, "$db": "t"}),
            &[],
        ))
        .expect("code with scope");
    }

    /// Random mutations of valid messages: the two decoders always agree.
    #[test]
    fn random_mutations_decode_as_before() {
        let mut seed: u64 = 0x2545_f491_4f6c_dd1d;
        let mut next = move || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed
        };
        let mut dup_filter = bson::rawdoc! {"find": "c"};
        dup_filter.append(
            bson::raw::cstr!("filter"),
            twice("a", 1, bson::rawdoc! {"$gt": 1}),
        );
        let bases = [
            message(
                &bytes(
                    &doc! {"find": "c", "filter": {"a": {"$in": [1, "x", {"b": [2]}]}}, "$db": "t"},
                ),
                &[],
            ),
            message(
                &bytes(&doc! {"insert": "c", "$db": "t"}),
                &[(
                    "documents",
                    vec![
                        bytes(&doc! {"_id": 1, "a": [1, {"b": "c"}]}),
                        raw_bytes(twice("_id", 1, 2)),
                    ],
                )],
            ),
            message(&raw_bytes(dup_filter), &[]),
        ];
        for base in &bases {
            for _ in 0..5_000 {
                let mut m = base.clone();
                let edits = 1 + (next() % 3) as usize;
                for _ in 0..edits {
                    let at = (next() as usize) % m.len();
                    match next() % 3 {
                        0 => m[at] = next() as u8,
                        1 => m.truncate(at.max(1)),
                        _ => m.insert(at, next() as u8),
                    }
                }
                let _ = agrees(&m);
            }
        }
    }
}
