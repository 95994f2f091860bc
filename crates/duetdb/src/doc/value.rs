//! BSON values as the engine compares them: MongoDB's cross-type sort order.
//!
//! Owns the one comparison every other module uses (filters, index keys, sort,
//! `$min`/`$max`, `$addToSet`), so that an answer found through an index is the
//! same answer a collection scan gives.
//!
//! Invariants:
//! - Types compare first by canonical rank (MinKey < Undefined < Null < numbers <
//!   strings/symbols < objects < arrays < binary < ObjectId < bool < date <
//!   timestamp < regex < DBPointer < code < code-with-scope < MaxKey), then by value.
//! - All numeric types share one rank and compare by mathematical value:
//!   `int32(1) == int64(1) == 1.0`; int64 against double is exact (no rounding
//!   through f64). NaN sorts below every other number and equals NaN, as in
//!   MongoDB. Decimal128 is compared through its nearest f64 (documented gap: two
//!   decimals that differ beyond f64 precision compare equal).
//! - `compare` is a total order: reflexive, antisymmetric, transitive.

use std::cmp::Ordering;

use bson::raw::{RawArray, RawDocument};
use bson::{Bson, Decimal128, RawBson, RawBsonRef};

/// The canonical rank of a value's type; values of different rank compare by rank.
pub fn canonical_rank(v: RawBsonRef<'_>) -> u8 {
    match v {
        RawBsonRef::MinKey => 0,
        RawBsonRef::Undefined => 1,
        RawBsonRef::Null => 2,
        RawBsonRef::Double(_)
        | RawBsonRef::Int32(_)
        | RawBsonRef::Int64(_)
        | RawBsonRef::Decimal128(_) => 3,
        RawBsonRef::String(_) | RawBsonRef::Symbol(_) => 4,
        RawBsonRef::Document(_) => 5,
        RawBsonRef::Array(_) => 6,
        RawBsonRef::Binary(_) => 7,
        RawBsonRef::ObjectId(_) => 8,
        RawBsonRef::Boolean(_) => 9,
        RawBsonRef::DateTime(_) => 10,
        RawBsonRef::Timestamp(_) => 11,
        RawBsonRef::RegularExpression(_) => 12,
        RawBsonRef::DbPointer(_) => 13,
        RawBsonRef::JavaScriptCode(_) => 14,
        RawBsonRef::JavaScriptCodeWithScope(_) => 15,
        RawBsonRef::MaxKey => 16,
    }
}

/// True for int32, int64, double and decimal128.
pub fn is_number(v: RawBsonRef<'_>) -> bool {
    canonical_rank(v) == 3
}

/// MongoDB's total order over BSON values.
pub fn compare(a: RawBsonRef<'_>, b: RawBsonRef<'_>) -> Ordering {
    let (ra, rb) = (canonical_rank(a), canonical_rank(b));
    if ra != rb {
        return ra.cmp(&rb);
    }
    use RawBsonRef as R;
    match (a, b) {
        (R::MinKey, R::MinKey)
        | (R::MaxKey, R::MaxKey)
        | (R::Null, R::Null)
        | (R::Undefined, R::Undefined) => Ordering::Equal,
        (R::String(x) | R::Symbol(x), R::String(y) | R::Symbol(y)) => {
            x.as_bytes().cmp(y.as_bytes())
        }
        (R::Document(x), R::Document(y)) => compare_documents(x, y),
        (R::Array(x), R::Array(y)) => compare_arrays(x, y),
        (R::Binary(x), R::Binary(y)) => x
            .bytes
            .len()
            .cmp(&y.bytes.len())
            .then_with(|| u8::from(x.subtype).cmp(&u8::from(y.subtype)))
            .then_with(|| x.bytes.cmp(y.bytes)),
        (R::ObjectId(x), R::ObjectId(y)) => x.bytes().cmp(&y.bytes()),
        (R::Boolean(x), R::Boolean(y)) => x.cmp(&y),
        (R::DateTime(x), R::DateTime(y)) => x.timestamp_millis().cmp(&y.timestamp_millis()),
        (R::Timestamp(x), R::Timestamp(y)) => (x.time, x.increment).cmp(&(y.time, y.increment)),
        (R::RegularExpression(x), R::RegularExpression(y)) => x
            .pattern
            .as_str()
            .cmp(y.pattern.as_str())
            .then_with(|| x.options.as_str().cmp(y.options.as_str())),
        (R::DbPointer(x), R::DbPointer(y)) => {
            // The fields of a DBPointer are private; compare its canonical raw bytes.
            format!("{x:?}").cmp(&format!("{y:?}"))
        }
        (R::JavaScriptCode(x), R::JavaScriptCode(y)) => x.cmp(y),
        (R::JavaScriptCodeWithScope(x), R::JavaScriptCodeWithScope(y)) => x
            .code
            .cmp(y.code)
            .then_with(|| compare_documents(x.scope, y.scope)),
        (x, y) => compare_numbers(Num::of(x), Num::of(y)),
    }
}

/// Equality as MongoDB's `$eq` sees it (numeric types are interchangeable).
pub fn equal(a: RawBsonRef<'_>, b: RawBsonRef<'_>) -> bool {
    compare(a, b) == Ordering::Equal
}

/// Element by element: canonical rank, then field name, then value; a prefix is smaller.
pub fn compare_documents(a: &RawDocument, b: &RawDocument) -> Ordering {
    let mut ia = a.iter();
    let mut ib = b.iter();
    loop {
        match (ia.next(), ib.next()) {
            (None, None) => return Ordering::Equal,
            (None, Some(_)) => return Ordering::Less,
            (Some(_), None) => return Ordering::Greater,
            (Some(x), Some(y)) => {
                let (Ok((kx, vx)), Ok((ky, vy))) = (x, y) else {
                    // Stored documents are validated on the way in; a malformed
                    // element can only come from a bug. Order it deterministically.
                    debug_assert!(false, "malformed BSON reached compare_documents");
                    return Ordering::Equal;
                };
                let ord = canonical_rank(vx)
                    .cmp(&canonical_rank(vy))
                    .then_with(|| kx.as_str().cmp(ky.as_str()))
                    .then_with(|| compare(vx, vy));
                if ord != Ordering::Equal {
                    return ord;
                }
            }
        }
    }
}

/// Arrays compare like documents keyed "0", "1", …: element by element.
pub fn compare_arrays(a: &RawArray, b: &RawArray) -> Ordering {
    let mut ia = a.into_iter();
    let mut ib = b.into_iter();
    loop {
        match (ia.next(), ib.next()) {
            (None, None) => return Ordering::Equal,
            (None, Some(_)) => return Ordering::Less,
            (Some(_), None) => return Ordering::Greater,
            (Some(Ok(x)), Some(Ok(y))) => {
                let ord = compare(x, y);
                if ord != Ordering::Equal {
                    return ord;
                }
            }
            _ => {
                debug_assert!(false, "malformed BSON reached compare_arrays");
                return Ordering::Equal;
            }
        }
    }
}

/// Compare two owned values (converts through raw BSON; for non-hot paths).
pub fn compare_bson(a: &Bson, b: &Bson) -> Ordering {
    match (to_raw(a), to_raw(b)) {
        (Some(x), Some(y)) => compare(x.as_raw_bson_ref(), y.as_raw_bson_ref()),
        // Only values with NUL bytes in keys fail to convert; they never pass validation.
        _ => Ordering::Equal,
    }
}

/// `compare_bson(a, b) == Equal`.
pub fn equal_bson(a: &Bson, b: &Bson) -> bool {
    compare_bson(a, b) == Ordering::Equal
}

/// Owned raw form of a value, or `None` if it cannot be encoded (NUL in a key).
pub fn to_raw(b: &Bson) -> Option<RawBson> {
    RawBson::try_from(b.clone()).ok()
}

/// A number lifted out of its BSON type for comparison.
#[derive(Clone, Copy, Debug)]
pub enum Num {
    Int(i64),
    Float(f64),
}

impl Num {
    /// Requires: `is_number(v)`; other types map to NaN.
    pub fn of(v: RawBsonRef<'_>) -> Num {
        match v {
            RawBsonRef::Int32(i) => Num::Int(i64::from(i)),
            RawBsonRef::Int64(i) => Num::Int(i),
            RawBsonRef::Double(f) => Num::Float(f),
            RawBsonRef::Decimal128(d) => Num::Float(decimal_to_f64(d)),
            _ => Num::Float(f64::NAN),
        }
    }
}

/// Nearest f64 of a Decimal128 (NaN for values that do not parse).
pub fn decimal_to_f64(d: Decimal128) -> f64 {
    d.to_string().parse::<f64>().unwrap_or(f64::NAN)
}

/// Exact comparison of an i64 and an f64; NaN is below every number and equals NaN.
pub fn compare_numbers(a: Num, b: Num) -> Ordering {
    match (a, b) {
        (Num::Int(x), Num::Int(y)) => x.cmp(&y),
        (Num::Float(x), Num::Float(y)) => compare_f64(x, y),
        (Num::Int(x), Num::Float(y)) => compare_int_float(x, y),
        (Num::Float(x), Num::Int(y)) => compare_int_float(y, x).reverse(),
    }
}

fn compare_f64(x: f64, y: f64) -> Ordering {
    match (x.is_nan(), y.is_nan()) {
        (true, true) => Ordering::Equal,
        (true, false) => Ordering::Less,
        (false, true) => Ordering::Greater,
        // -0.0 == 0.0 as in MongoDB; partial_cmp is total for non-NaN.
        (false, false) => x.partial_cmp(&y).unwrap_or(Ordering::Equal),
    }
}

fn compare_int_float(i: i64, f: f64) -> Ordering {
    if f.is_nan() {
        return Ordering::Greater;
    }
    // 2^63 is exactly representable; every i64 is below it.
    const TWO_63: f64 = 9_223_372_036_854_775_808.0;
    if f >= TWO_63 {
        return Ordering::Less;
    }
    if f < -TWO_63 {
        return Ordering::Greater;
    }
    let whole = f.trunc();
    // |whole| < 2^63 so the cast is exact.
    let whole_i = whole as i64;
    match i.cmp(&whole_i) {
        Ordering::Equal => {
            let frac = f - whole;
            if frac > 0.0 {
                Ordering::Less
            } else if frac < 0.0 {
                Ordering::Greater
            } else {
                Ordering::Equal
            }
        }
        other => other,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bson::{doc, oid::ObjectId, Binary, DateTime, Regex, Timestamp};

    fn cmp(a: Bson, b: Bson) -> Ordering {
        compare_bson(&a, &b)
    }

    #[test]
    fn numbers_compare_across_types() {
        assert_eq!(cmp(Bson::Int32(1), Bson::Int64(1)), Ordering::Equal);
        assert_eq!(cmp(Bson::Int32(1), Bson::Double(1.0)), Ordering::Equal);
        assert_eq!(cmp(Bson::Int64(2), Bson::Double(1.5)), Ordering::Greater);
        assert_eq!(cmp(Bson::Double(-0.0), Bson::Int32(0)), Ordering::Equal);
        let d: Decimal128 = "2.5".parse().expect("decimal");
        assert_eq!(cmp(Bson::Decimal128(d), Bson::Double(2.5)), Ordering::Equal);
        assert_eq!(cmp(Bson::Decimal128(d), Bson::Int32(3)), Ordering::Less);
    }

    #[test]
    fn int64_against_double_is_exact() {
        // 2^53 + 1 is not representable as f64; a lossy comparison would call it equal.
        let big = (1i64 << 53) + 1;
        assert_eq!(
            cmp(Bson::Int64(big), Bson::Double((1u64 << 53) as f64)),
            Ordering::Greater
        );
        assert_eq!(
            cmp(Bson::Int64(i64::MAX), Bson::Double(9.3e18)),
            Ordering::Less
        );
        assert_eq!(
            cmp(Bson::Int64(i64::MIN), Bson::Double(-9.3e18)),
            Ordering::Greater
        );
        assert_eq!(cmp(Bson::Int64(-3), Bson::Double(-2.5)), Ordering::Less);
        assert_eq!(cmp(Bson::Int64(-2), Bson::Double(-2.5)), Ordering::Greater);
    }

    #[test]
    fn nan_is_smallest_number_and_equals_itself() {
        assert_eq!(
            cmp(Bson::Double(f64::NAN), Bson::Double(f64::NAN)),
            Ordering::Equal
        );
        assert_eq!(
            cmp(Bson::Double(f64::NAN), Bson::Int64(i64::MIN)),
            Ordering::Less
        );
        assert_eq!(
            cmp(Bson::Double(f64::NEG_INFINITY), Bson::Double(f64::NAN)),
            Ordering::Greater
        );
        assert_eq!(cmp(Bson::Double(f64::NAN), Bson::Null), Ordering::Greater);
    }

    #[test]
    fn canonical_type_order() {
        let ordered = vec![
            Bson::MinKey,
            Bson::Undefined,
            Bson::Null,
            Bson::Int32(5),
            Bson::String("a".into()),
            Bson::Document(doc! {"a": 1}),
            Bson::Array(vec![Bson::Int32(1)]),
            Bson::Binary(Binary {
                subtype: bson::spec::BinarySubtype::Generic,
                bytes: vec![1],
            }),
            Bson::ObjectId(ObjectId::from_bytes([0; 12])),
            Bson::Boolean(false),
            Bson::DateTime(DateTime::from_millis(0)),
            Bson::Timestamp(Timestamp {
                time: 1,
                increment: 1,
            }),
            Bson::RegularExpression(Regex {
                pattern: "a".to_string().try_into().expect("cstring"),
                options: String::new().try_into().expect("cstring"),
            }),
            Bson::JavaScriptCode("x".into()),
            Bson::MaxKey,
        ];
        for (i, a) in ordered.iter().enumerate() {
            for (j, b) in ordered.iter().enumerate() {
                assert_eq!(cmp(a.clone(), b.clone()), i.cmp(&j), "{a:?} vs {b:?}");
            }
        }
    }

    #[test]
    fn strings_documents_arrays() {
        assert_eq!(cmp("a".into(), "b".into()), Ordering::Less);
        assert_eq!(cmp("ab".into(), "a".into()), Ordering::Greater);
        assert_eq!(
            cmp("B".into(), "a".into()),
            Ordering::Less,
            "binary, not case-folded"
        );
        assert_eq!(
            cmp(doc! {"a": 1}.into(), doc! {"a": 1, "b": 0}.into()),
            Ordering::Less
        );
        assert_eq!(
            cmp(doc! {"a": 2}.into(), doc! {"b": 1}.into()),
            Ordering::Less
        );
        assert_eq!(
            cmp(doc! {"a": "x"}.into(), doc! {"a": 5}.into()),
            Ordering::Greater
        );
        assert_eq!(
            cmp(doc! {"a": 1}.into(), doc! {"a": 1.0}.into()),
            Ordering::Equal
        );
        assert_eq!(
            cmp(
                Bson::Array(vec![1.into(), 2.into()]),
                Bson::Array(vec![1.into(), 3.into()])
            ),
            Ordering::Less
        );
        assert_eq!(
            cmp(Bson::Array(vec![1.into()]), Bson::Array(vec![])),
            Ordering::Greater
        );
    }

    #[test]
    fn binary_length_first_then_subtype() {
        let b = |st: u8, bytes: Vec<u8>| {
            Bson::Binary(Binary {
                subtype: st.into(),
                bytes,
            })
        };
        assert_eq!(cmp(b(0, vec![9]), b(0, vec![1, 1])), Ordering::Less);
        assert_eq!(cmp(b(5, vec![1]), b(0, vec![2])), Ordering::Greater);
        assert_eq!(cmp(b(0, vec![1]), b(0, vec![2])), Ordering::Less);
    }

    #[test]
    fn other_scalars() {
        assert_eq!(cmp(false.into(), true.into()), Ordering::Less);
        assert_eq!(
            cmp(
                Bson::DateTime(DateTime::from_millis(-5)),
                Bson::DateTime(DateTime::from_millis(3))
            ),
            Ordering::Less
        );
        assert_eq!(
            cmp(
                Bson::Timestamp(Timestamp {
                    time: 2,
                    increment: 0
                }),
                Bson::Timestamp(Timestamp {
                    time: 1,
                    increment: 9
                })
            ),
            Ordering::Greater
        );
    }
}
