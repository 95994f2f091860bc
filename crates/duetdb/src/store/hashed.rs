//! MongoDB's hash of a BSON value (`BSONElementHasher::hash64`), the key of
//! hashed indexes (`{field: "hashed"}`).
//!
//! The hash is the first 8 bytes (little-endian) of the MD5 of: the seed
//! (int32 0), then for the value its canonical type (int32), and either its
//! value bytes — numbers squashed to an int64 first (truncated toward zero,
//! NaN as 0, saturated at the int64 range) — or, for documents and arrays,
//! each element hashed the same way with its field name (NUL-terminated)
//! after the type, then the end-of-object marker (its type, 0, alone).
//!
//! Invariants:
//! - values MongoDB's equality calls equal hash equally (`1`, `1.0`, `1i64`;
//!   a string and a symbol), so an equality lookup through the hash finds every
//!   match; distinct values may collide (`1` and `1.5`), so a fetched document
//!   is always re-checked against the query;
//! - the results equal MongoDB's test vectors (`hasher_test.cpp`), checked below.

use bson::raw::{RawArray, RawDocument};
use bson::RawBsonRef;
use md5::{Digest, Md5};

/// The seed MongoDB uses for hashed indexes.
const SEED: i32 = 0;

/// MongoDB's canonical type numbers (`canonicalizeBSONType`), hashed before
/// each value: types that compare as one (all numbers; string and symbol)
/// share a number.
fn canonical_type(v: RawBsonRef<'_>) -> i32 {
    match v {
        RawBsonRef::MinKey => -1,
        RawBsonRef::Undefined => 0,
        RawBsonRef::Null => 5,
        RawBsonRef::Double(_)
        | RawBsonRef::Int32(_)
        | RawBsonRef::Int64(_)
        | RawBsonRef::Decimal128(_) => 10,
        RawBsonRef::String(_) | RawBsonRef::Symbol(_) => 15,
        RawBsonRef::Document(_) => 20,
        RawBsonRef::Array(_) => 25,
        RawBsonRef::Binary(_) => 30,
        RawBsonRef::ObjectId(_) => 35,
        RawBsonRef::Boolean(_) => 40,
        RawBsonRef::DateTime(_) => 45,
        RawBsonRef::Timestamp(_) => 47,
        RawBsonRef::RegularExpression(_) => 50,
        RawBsonRef::DbPointer(_) => 55,
        RawBsonRef::JavaScriptCode(_) => 60,
        RawBsonRef::JavaScriptCodeWithScope(_) => 65,
        RawBsonRef::MaxKey => 127,
    }
}

/// A double as MongoDB's `safeNumberLongForHash`: NaN is 0, values beyond
/// the int64 range saturate, others truncate toward zero.
fn double_to_i64(d: f64) -> i64 {
    if d.is_nan() {
        0
    } else if d >= 9_223_372_036_854_775_808.0 {
        i64::MAX
    } else if d < -9_223_372_036_854_775_808.0 {
        i64::MIN
    } else {
        d as i64
    }
}

fn put_string(h: &mut Md5, s: &str) {
    let len = i32::try_from(s.len() + 1).unwrap_or(i32::MAX);
    h.update(len.to_le_bytes());
    h.update(s.as_bytes());
    h.update([0]);
}

fn hash_value(h: &mut Md5, v: RawBsonRef<'_>, name: Option<&str>) {
    h.update(canonical_type(v).to_le_bytes());
    if let Some(name) = name {
        h.update(name.as_bytes());
        h.update([0]);
    }
    match v {
        RawBsonRef::Double(d) => h.update(double_to_i64(d).to_le_bytes()),
        RawBsonRef::Int32(i) => h.update(i64::from(i).to_le_bytes()),
        RawBsonRef::Int64(i) => h.update(i.to_le_bytes()),
        RawBsonRef::Decimal128(d) => {
            let x = crate::doc::value::decimal_to_f64(d);
            h.update(double_to_i64(x).to_le_bytes());
        }
        RawBsonRef::String(s) | RawBsonRef::Symbol(s) | RawBsonRef::JavaScriptCode(s) => {
            put_string(h, s)
        }
        RawBsonRef::Document(d) => hash_document(h, d),
        RawBsonRef::Array(a) => hash_array(h, a),
        RawBsonRef::Binary(b) => {
            let len = i32::try_from(b.bytes.len()).unwrap_or(i32::MAX);
            h.update(len.to_le_bytes());
            h.update([u8::from(b.subtype)]);
            h.update(b.bytes);
        }
        RawBsonRef::ObjectId(o) => h.update(o.bytes()),
        RawBsonRef::Boolean(b) => h.update([u8::from(b)]),
        RawBsonRef::DateTime(t) => h.update(t.timestamp_millis().to_le_bytes()),
        RawBsonRef::Timestamp(t) => {
            h.update(t.increment.to_le_bytes());
            h.update(t.time.to_le_bytes());
        }
        RawBsonRef::RegularExpression(r) => {
            h.update(r.pattern.as_str().as_bytes());
            h.update([0]);
            h.update(r.options.as_str().as_bytes());
            h.update([0]);
        }
        RawBsonRef::DbPointer(p) => {
            // Its value bytes are the namespace string, then the ObjectId;
            // the raw API exposes neither, so take them from an encoding.
            let mut d = bson::RawDocumentBuf::new();
            d.append(bson::cstr!("p"), RawBsonRef::DbPointer(p));
            let bytes = d.as_bytes();
            // document: len(4) type(1) "p\0"(2) value.. NUL(1)
            if bytes.len() > 8 {
                h.update(&bytes[7..bytes.len() - 1]);
            }
        }
        RawBsonRef::JavaScriptCodeWithScope(c) => {
            // The code's characters and NUL (no length), then the scope.
            h.update(c.code.as_bytes());
            h.update([0]);
            hash_document(h, c.scope);
        }
        RawBsonRef::Null | RawBsonRef::Undefined | RawBsonRef::MinKey | RawBsonRef::MaxKey => {}
    }
}

/// The end-of-object marker: its canonical type (0) alone.
fn hash_eoo(h: &mut Md5) {
    h.update(0i32.to_le_bytes());
}

fn hash_document(h: &mut Md5, d: &RawDocument) {
    for (name, v) in d.into_iter().flatten() {
        hash_value(h, v, Some(name.as_str()));
    }
    hash_eoo(h);
}

fn hash_array(h: &mut Md5, a: &RawArray) {
    for (i, v) in a.into_iter().flatten().enumerate() {
        hash_value(h, v, Some(&i.to_string()));
    }
    hash_eoo(h);
}

/// MongoDB's 64-bit hash of `v` (what a hashed index stores and
/// `convertShardKeyToHashed` returns).
pub fn hash64(v: RawBsonRef<'_>) -> i64 {
    let mut h = Md5::new();
    h.update(SEED.to_le_bytes());
    hash_value(&mut h, v, None);
    let digest = h.finalize();
    let mut first = [0u8; 8];
    first.copy_from_slice(&digest[..8]);
    i64::from_le_bytes(first)
}

#[cfg(test)]
mod tests {
    use super::*;
    use bson::oid::ObjectId;
    use bson::spec::BinarySubtype;
    use bson::{rawdoc, RawBson};

    fn h(v: RawBson) -> i64 {
        hash64(v.as_raw_bson_ref())
    }

    /// MongoDB's own test vectors (`src/mongo/db/hasher_test.cpp`).
    #[test]
    fn matches_mongodb_test_vectors() {
        for v in [
            RawBson::Int32(42),
            RawBson::Double(42.123),
            RawBson::Int64(42),
        ] {
            assert_eq!(h(v), -944302157085130861);
        }
        for v in [
            RawBson::Int32(0),
            RawBson::Double(0.456),
            RawBson::Int64(0),
            RawBson::Double(f64::NAN),
        ] {
            assert_eq!(h(v), 4854801880128277513);
        }
        assert_eq!(h(RawBson::Double(1.987)), 5902408780260971510);
        assert_eq!(h(RawBson::Int32(-1)), 1140205862565771219);
        assert_eq!(h(RawBson::Double(-1.789)), 1140205862565771219);
        assert_eq!(h(RawBson::Int32(i32::MIN)), 6165898260261354870);
        assert_eq!(h(RawBson::Double(f64::from(i32::MAX))), 1143184177162245883);
        assert_eq!(h(RawBson::Double(f64::MAX)), 921523596458303250);
        assert_eq!(h(RawBson::Int64(i64::MAX)), 921523596458303250);
        assert_eq!(h(RawBson::Double(-f64::MAX)), 4532067210535695462);
        assert_eq!(h(RawBson::Int64(i64::MIN)), 4532067210535695462);
        assert_eq!(h(RawBson::MinKey), 7961148599568647290);
        assert_eq!(h(RawBson::MaxKey), 5504842513779440750);
        assert_eq!(h(RawBson::Undefined), 40158834000849533);
        assert_eq!(h(RawBson::Null), 2338878944348059895);
        assert_eq!(h(RawBson::String("abc".into())), 8478485326885698097);
        assert_eq!(h(RawBson::Symbol("abc".into())), 8478485326885698097);
        assert_eq!(h(RawBson::String(String::new())), 2049396243249673340);
        assert_eq!(
            h(RawBson::Document(rawdoc! {"a": "abc", "b": 123i64})),
            4771603801758380216
        );
        assert_eq!(h(RawBson::Document(rawdoc! {})), 7980500913326740417);
        let mut arr = bson::RawArrayBuf::new();
        for s in ["bar", "baz", "qux"] {
            arr.push(s);
        }
        assert_eq!(h(RawBson::Array(arr)), -2938911267422831539);
        assert_eq!(
            h(RawBson::Array(bson::RawArrayBuf::new())),
            8849948234993459283
        );
        let bin = |subtype, bytes: &[u8]| {
            RawBson::Binary(bson::Binary {
                subtype,
                bytes: bytes.to_vec(),
            })
        };
        let bytes = [0u8, 1, 2, 3, 4, 6];
        assert_eq!(h(bin(BinarySubtype::Generic, &bytes)), 7252465090394235301);
        assert_eq!(
            h(bin(BinarySubtype::UserDefined(0x80), &bytes)),
            5736670452907618262
        );
        let uuid: Vec<u8> = (0u8..16).collect();
        assert_eq!(h(bin(BinarySubtype::Uuid, &uuid)), 6084661258071355978);
        let oid = |s: &str| RawBson::ObjectId(ObjectId::parse_str(s).expect("oid"));
        assert_eq!(h(oid("010203040506070809101112")), -5588663249627035708);
        assert_eq!(h(oid("000000000000000000000000")), -4293118519463489418);
        assert_eq!(h(RawBson::Boolean(true)), 6405873908747105701);
        assert_eq!(h(RawBson::Boolean(false)), 6289544573401934092);
        let date = |ms| RawBson::DateTime(bson::DateTime::from_millis(ms));
        assert_eq!(h(date(0x5566778811223344)), 4476222765095560467);
        assert_eq!(h(date(0)), -1178696894582842035);
        let re = |p: &str, o: &str| {
            RawBson::RegularExpression(bson::Regex {
                pattern: p.try_into().expect("pattern"),
                options: o.try_into().expect("options"),
            })
        };
        assert_eq!(h(re("mongodb", "")), -7275792090268217043);
        assert_eq!(h(re(".*", "i")), 7095855029187981886);
        assert_eq!(
            h(RawBson::JavaScriptCode("func f() { return 1; }".into())),
            6861638109178014270
        );
        assert_eq!(
            h(RawBson::JavaScriptCodeWithScope(
                bson::RawJavaScriptCodeWithScope {
                    code: "func f() { return 1; }".into(),
                    scope: rawdoc! {"c": true},
                }
            )),
            501342939894575968
        );
    }

    #[test]
    fn equal_values_hash_equally() {
        assert_eq!(h(RawBson::Int32(7)), h(RawBson::Double(7.0)));
        assert_eq!(
            h(RawBson::Document(rawdoc! {"x": 3, "y": [3.0]})),
            h(RawBson::Document(rawdoc! {"x": 3.0, "y": [3i64]}))
        );
        assert_eq!(h(RawBson::Double(-0.0)), h(RawBson::Int32(0)));
    }
}
