//! Top-level field lookup in a raw BSON document by comparing key bytes.
//!
//! `RawDocument::get` validates every key it passes as UTF-8 and builds a
//! `&str` for the comparison; in a collection scan that was the largest single
//! cost (≈ 30 % of the instructions of a 2-field predicate count). Here keys
//! are compared as bytes (a `&str` needle can only equal valid UTF-8) and
//! values of other fields are skipped by their encoded size without decoding.
//!
//! Invariant: for every well-formed document, [`field`] returns exactly what
//! `doc.get(key).ok().flatten()` returns (property-tested below). The common
//! scalar types and embedded documents are decoded here; arrays and the rare
//! types (binary, regex, code, symbol, db pointer, undefined) fall back to
//! `RawDocument::get`, so their decoding stays bson's. On a malformed document
//! the result is `None` or bson's answer — never a panic: every read is
//! bounds-checked.

use bson::raw::RawDocument;
use bson::{Decimal128, RawBsonRef, Timestamp};

fn le_i32(b: &[u8], at: usize) -> Option<i32> {
    Some(i32::from_le_bytes(
        b.get(at..at.checked_add(4)?)?.try_into().ok()?,
    ))
}

fn le_8(b: &[u8], at: usize) -> Option<[u8; 8]> {
    b.get(at..at.checked_add(8)?)?.try_into().ok()
}

/// Bytes the value of type `t` starting at `at` occupies; `None` if it does
/// not fit before `end` or the type is unknown.
fn value_size(t: u8, b: &[u8], at: usize, end: usize) -> Option<usize> {
    let size = match t {
        0x01 | 0x09 | 0x11 | 0x12 => 8, // double, datetime, timestamp, int64
        0x02 | 0x0D | 0x0E => 4 + usize::try_from(le_i32(b, at)?).ok()?, // string, code, symbol
        0x03 | 0x04 | 0x0F => usize::try_from(le_i32(b, at)?).ok()?, // document, array, code w/ scope
        0x05 => 5 + usize::try_from(le_i32(b, at)?).ok()?,           // binary: len, subtype, bytes
        0x06 | 0x0A | 0x7F | 0xFF => 0, // undefined, null, maxkey, minkey
        0x07 => 12,                     // ObjectId
        0x08 => 1,                      // bool
        0x0B => {
            // regex: two cstrings
            let p = b.get(at..end)?.iter().position(|&c| c == 0)?;
            let o = b.get(at + p + 1..end)?.iter().position(|&c| c == 0)?;
            p + 1 + o + 1
        }
        0x0C => 4 + usize::try_from(le_i32(b, at)?).ok()? + 12, // db pointer
        0x10 => 4,                                              // int32
        0x13 => 16,                                             // decimal128
        _ => return None,
    };
    (at.checked_add(size)? <= end).then_some(size)
}

/// The value of top-level field `key` in `doc` (see the module invariant).
pub fn field<'a>(doc: &'a RawDocument, key: &str) -> Option<RawBsonRef<'a>> {
    let b = doc.as_bytes();
    let needle = key.as_bytes();
    // A RawDocument is at least 5 bytes (length + terminator), checked by bson.
    let end = b.len().checked_sub(1)?;
    let mut at = 4;
    while at < end {
        let t = b[at];
        let key_start = at + 1;
        let key_len = b.get(key_start..end)?.iter().position(|&c| c == 0)?;
        let val = key_start + key_len + 1;
        let size = value_size(t, b, val, end)?;
        // Keys are short: a byte loop beats a call to `memcmp` (which showed
        // as 8 % of a scan's profile).
        if key_len == needle.len()
            && b[key_start..key_start + key_len]
                .iter()
                .zip(needle)
                .all(|(x, y)| x == y)
        {
            return decode(t, b, val, size).or_else(|| doc.get(key).ok().flatten());
        }
        at = val + size;
    }
    None
}

/// The common types; `None` sends the caller to bson's decoder.
fn decode(t: u8, b: &[u8], at: usize, size: usize) -> Option<RawBsonRef<'_>> {
    Some(match t {
        0x01 => RawBsonRef::Double(f64::from_le_bytes(le_8(b, at)?)),
        0x02 => {
            // len includes the terminating NUL, which must be there.
            let s = b.get(at + 4..at + size)?;
            let (last, text) = s.split_last()?;
            if *last != 0 {
                return None;
            }
            RawBsonRef::String(std::str::from_utf8(text).ok()?)
        }
        0x03 => RawBsonRef::Document(RawDocument::from_bytes(b.get(at..at + size)?).ok()?),
        0x07 => RawBsonRef::ObjectId(bson::oid::ObjectId::from_bytes(
            b.get(at..at + 12)?.try_into().ok()?,
        )),
        0x08 => match b.get(at)? {
            0 => RawBsonRef::Boolean(false),
            1 => RawBsonRef::Boolean(true),
            _ => return None,
        },
        0x09 => RawBsonRef::DateTime(bson::DateTime::from_millis(i64::from_le_bytes(le_8(
            b, at,
        )?))),
        0x0A => RawBsonRef::Null,
        0x10 => RawBsonRef::Int32(le_i32(b, at)?),
        // Stored as increment then seconds, both little-endian u32.
        0x11 => RawBsonRef::Timestamp(Timestamp {
            increment: u32::from_le_bytes(b.get(at..at + 4)?.try_into().ok()?),
            time: u32::from_le_bytes(b.get(at + 4..at + 8)?.try_into().ok()?),
        }),
        0x12 => RawBsonRef::Int64(i64::from_le_bytes(le_8(b, at)?)),
        0x13 => {
            RawBsonRef::Decimal128(Decimal128::from_bytes(b.get(at..at + 16)?.try_into().ok()?))
        }
        0x7F => RawBsonRef::MaxKey,
        0xFF => RawBsonRef::MinKey,
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use bson::{doc, Bson, Document, RawDocumentBuf};
    use proptest::prelude::*;

    fn same(d: &RawDocument, key: &str) {
        let ours = field(d, key).map(|v| Bson::try_from(v).ok());
        let theirs = d.get(key).ok().flatten().map(|v| Bson::try_from(v).ok());
        assert_eq!(ours, theirs, "key {key:?}");
    }

    fn every_type() -> Document {
        doc! {
            "d": 1.5, "s": "héllo", "doc": {"x": 1}, "arr": [1, "two", {"t": 3}],
            "bin": bson::Binary { subtype: bson::spec::BinarySubtype::Generic, bytes: vec![1, 2, 3] },
            "undef": Bson::Undefined,
            "oid": bson::oid::ObjectId::from_bytes([7; 12]), "t": true, "f": false,
            "dt": bson::DateTime::from_millis(-5), "n": Bson::Null,
            "re": bson::Regex { pattern: "a.*b".to_string().try_into().expect("cstring"), options: "i".to_string().try_into().expect("cstring") },
            "js": Bson::JavaScriptCode("x()".into()),
            "sym": Bson::Symbol("sy".into()),
            "i": 42i32, "ts": Timestamp { time: 3, increment: 9 }, "l": -7i64,
            "dec": Decimal128::from_bytes([3; 16]),
            "max": Bson::MaxKey, "min": Bson::MinKey,
            "": "empty key", "a.b": "dotted key",
        }
    }

    #[test]
    fn every_type_equals_bson() {
        let raw = RawDocumentBuf::try_from(&every_type()).expect("encode");
        for key in every_type().keys() {
            same(&raw, key);
        }
        for key in ["missing", "D", "s\0", "doc.x", "ar"] {
            same(&raw, key);
        }
    }

    fn scalar() -> impl Strategy<Value = Bson> {
        prop_oneof![
            any::<i32>().prop_map(Bson::Int32),
            any::<i64>().prop_map(Bson::Int64),
            any::<f64>().prop_map(Bson::Double),
            "[a-zé]{0,6}".prop_map(Bson::String),
            any::<bool>().prop_map(Bson::Boolean),
            Just(Bson::Null),
        ]
    }

    fn value() -> impl Strategy<Value = Bson> {
        scalar().prop_recursive(2, 12, 4, |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..4).prop_map(Bson::Array),
                prop::collection::vec(("[a-c]{1,2}", inner), 0..4)
                    .prop_map(|kv| Bson::Document(kv.into_iter().collect())),
            ]
        })
    }

    proptest! {
        #[test]
        fn equals_bson_get(
            kv in prop::collection::vec(("[a-d]{0,2}", value()), 0..8),
            key in "[a-d]{0,2}",
        ) {
            let d: Document = kv.into_iter().collect();
            let raw = RawDocumentBuf::try_from(&d).expect("encode");
            same(&raw, &key);
        }

        /// Damaged bytes: never a panic; when bson finds the value, we agree.
        #[test]
        fn damaged_documents_never_panic(
            kv in prop::collection::vec(("[a-d]{1,2}", value()), 1..6),
            key in "[a-d]{1,2}",
            at in any::<prop::sample::Index>(),
            byte in any::<u8>(),
        ) {
            let d: Document = kv.into_iter().collect();
            let mut bytes = RawDocumentBuf::try_from(&d).expect("encode").into_bytes();
            let i = at.index(bytes.len());
            bytes[i] = byte;
            if let Ok(raw) = RawDocument::from_bytes(&bytes) {
                let ours = field(raw, &key);
                if let (Some(o), Ok(Some(t))) = (ours, raw.get(&key)) {
                    let o = Bson::try_from(o).ok();
                    let t = Bson::try_from(t).ok();
                    prop_assert_eq!(o, t);
                }
            }
        }
    }
}
