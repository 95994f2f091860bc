//! The encoded size of owned BSON values, computed without serializing them.
//!
//! Owns: [`value_len`] (the bytes a value takes after its type byte and key),
//! [`document_len`] (a whole document's encoded length), the running
//! [`SizeBudget`] and [`check_document`], used wherever a document or value
//! is *built* and must stay within [`MAX_DOC_SIZE`] — aggregation expressions
//! and stage outputs, and the server's reply batches — so the limit is
//! checked as values grow instead of after a huge value exists.
//!
//! Invariants: the figures equal what `bson` writes (checked against real
//! serialization in the tests) except for `DbPointer`, whose parts are
//! private in `bson` and which is counted as its largest plausible form
//! (never stored by drivers since MongoDB 1.x); iterative, so depth costs no
//! stack.

use bson::{Binary, Bson, Document};

use crate::doc::MAX_DOC_SIZE;
use crate::error::{Error, Result};

/// Bytes of a `DbPointer` value: `bson` hides its parts; namespaces are at
/// most 255 + 64 bytes, plus the length, NUL and the 12-byte id.
const DB_POINTER_LEN: usize = 4 + 320 + 1 + 12;

/// Decimal digits of an array index (its key in BSON).
fn index_key_len(i: usize) -> usize {
    let mut n = 1;
    let mut v = i;
    while v >= 10 {
        v /= 10;
        n += 1;
    }
    n
}

fn binary_len(b: &Binary) -> usize {
    // The old binary subtype (2) repeats the length inside the payload.
    let old = if u8::from(b.subtype) == 2 { 4 } else { 0 };
    4 + 1 + old + b.bytes.len()
}

/// Encoded length of `v` after its type byte and key (for a document or an
/// array, its whole encoding, length prefix and terminating NUL included).
pub fn value_len(v: &Bson) -> usize {
    let mut total = 0usize;
    let mut stack = vec![v];
    while let Some(v) = stack.pop() {
        total += match v {
            Bson::Double(_) | Bson::Int64(_) | Bson::DateTime(_) | Bson::Timestamp(_) => 8,
            Bson::Int32(_) => 4,
            Bson::Boolean(_) => 1,
            Bson::Null | Bson::Undefined | Bson::MinKey | Bson::MaxKey => 0,
            Bson::ObjectId(_) => 12,
            Bson::Decimal128(_) => 16,
            Bson::String(s) | Bson::Symbol(s) | Bson::JavaScriptCode(s) => 4 + s.len() + 1,
            Bson::Binary(b) => binary_len(b),
            Bson::RegularExpression(r) => r.pattern.len() + 1 + r.options.len() + 1,
            Bson::DbPointer(_) => DB_POINTER_LEN,
            Bson::JavaScriptCodeWithScope(c) => {
                let mut n = 4 + 4 + c.code.len() + 1 + 5;
                for (k, x) in &c.scope {
                    n += 1 + k.len() + 1;
                    stack.push(x);
                }
                n
            }
            Bson::Document(d) => {
                let mut n = 5;
                for (k, x) in d {
                    n += 1 + k.len() + 1;
                    stack.push(x);
                }
                n
            }
            Bson::Array(a) => {
                let mut n = 5;
                for (i, x) in a.iter().enumerate() {
                    n += 1 + index_key_len(i) + 1;
                    stack.push(x);
                }
                n
            }
        };
    }
    total
}

/// Encoded length of a whole document.
pub fn document_len(d: &Document) -> usize {
    let mut n = 5;
    for (k, v) in d {
        n += element_len(k, v);
    }
    n
}

/// Encoded length of one element `key: v` inside a document.
pub fn element_len(key: &str, v: &Bson) -> usize {
    1 + key.len() + 1 + value_len(v)
}

/// Encoded length of element `i` of an array holding `v`.
pub fn array_element_len(i: usize, v: &Bson) -> usize {
    1 + index_key_len(i) + 1 + value_len(v)
}

/// The running size of a document, array or string being built, which fails
/// as soon as it passes the limit — so a value that would be too large is
/// never completed (nor are the ones containing it).
#[derive(Debug, Clone)]
pub struct SizeBudget {
    what: &'static str,
    used: usize,
    limit: usize,
}

impl SizeBudget {
    /// An empty document, array or string (5 bytes: its length prefix and
    /// final NUL), within [`MAX_DOC_SIZE`]; `what` names it in the error.
    pub fn new(what: &'static str) -> SizeBudget {
        SizeBudget {
            what,
            used: 5,
            limit: MAX_DOC_SIZE,
        }
    }

    /// Count `bytes` more; an error once the total passes the limit.
    pub fn add(&mut self, bytes: usize) -> Result<()> {
        self.used = self.used.saturating_add(bytes);
        if self.used > self.limit {
            return Err(Error::ValueTooLarge {
                what: self.what.to_string(),
                size: self.used,
                limit: self.limit,
            });
        }
        Ok(())
    }

    /// Count element `key: v` of a document.
    pub fn add_element(&mut self, key: &str, v: &Bson) -> Result<()> {
        self.add(element_len(key, v))
    }
}

/// A built document's final check: within [`MAX_DOC_SIZE`], or
/// BSONObjectTooLarge naming `what` produced it.
pub fn check_document(what: &'static str, d: &Document) -> Result<()> {
    let size = document_len(d);
    if size > MAX_DOC_SIZE {
        return Err(Error::ValueTooLarge {
            what: what.to_string(),
            size,
            limit: MAX_DOC_SIZE,
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use bson::oid::ObjectId;
    use bson::spec::BinarySubtype;
    use bson::{doc, Regex, Timestamp};

    fn encoded(d: &Document) -> usize {
        let mut out = Vec::new();
        d.to_writer(&mut out).expect("serialize");
        out.len()
    }

    #[test]
    fn matches_real_serialization() {
        let arr: Vec<Bson> = (0..123).map(Bson::Int32).collect();
        let d = doc! {
            "_id": ObjectId::new(),
            "s": "héllo",
            "n": 1, "l": 2i64, "f": 1.5, "b": true, "z": Bson::Null, "u": Bson::Undefined,
            "t": Timestamp { time: 1, increment: 2 },
            "dt": bson::DateTime::now(),
            "bin": Binary { subtype: BinarySubtype::Generic, bytes: vec![1, 2, 3] },
            "old": Binary { subtype: BinarySubtype::BinaryOld, bytes: vec![1, 2, 3] },
            "re": Regex { pattern: "a.*".try_into().expect("cstr"), options: "i".try_into().expect("cstr") },
            "code": Bson::JavaScriptCode("x()".into()),
            "cws": Bson::JavaScriptCodeWithScope(bson::JavaScriptCodeWithScope {
                code: "f()".into(), scope: doc! {"a": 1, "b": {"c": "d"}},
            }),
            "arr": arr,
            "nested": {"a": [{"b": [1, [2, [3]]]}], "mk": Bson::MaxKey, "mn": Bson::MinKey},
            "sym": Bson::Symbol("s".into()),
            "dec": Bson::Decimal128(bson::Decimal128::from_bytes([0; 16])),
        };
        assert_eq!(document_len(&d), encoded(&d));
        assert_eq!(document_len(&doc! {}), encoded(&doc! {}));
        let big = "x".repeat(1 << 20);
        assert_eq!(
            document_len(&doc! {"big": &big}),
            encoded(&doc! {"big": big})
        );
    }

    #[test]
    fn budgets_stop_at_the_limit() {
        let mut b = SizeBudget::new("x");
        b.add(MAX_DOC_SIZE - 5).expect("exactly at the limit");
        let e = b.add(1).expect_err("one past");
        assert_eq!(e.code(), 10334);
        assert!(e.to_string().contains("x would exceed"), "{e}");
        assert!(check_document("d", &doc! {"a": 1}).is_ok());
        let big = "x".repeat(MAX_DOC_SIZE);
        assert_eq!(
            check_document("d", &doc! {"a": big})
                .expect_err("big")
                .code(),
            10334
        );
    }

    #[test]
    fn index_keys_count_their_digits() {
        assert_eq!(index_key_len(0), 1);
        assert_eq!(index_key_len(9), 1);
        assert_eq!(index_key_len(10), 2);
        assert_eq!(index_key_len(123_456), 6);
    }
}
