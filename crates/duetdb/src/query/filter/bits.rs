//! The bitwise query operators `$bitsAllSet`, `$bitsAnySet`,
//! `$bitsAllClear`, `$bitsAnyClear`.
//!
//! Invariants (MongoDB's rules): the mask is a non-negative integral number,
//! an array of non-negative bit positions, or BinData (its bytes little-endian);
//! a numeric field value must be integral and within int64 (a double with a
//! fraction, NaN or out of range never matches) and is read as 64-bit two's
//! complement, so positions past 63 read the sign bit; a BinData value's bits
//! past its length read 0; every other type never matches.

use bson::{Bson, RawBsonRef};

use crate::doc::value::{self, Num};
use crate::error::{render, Error};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum BitsKind {
    AllSet,
    AnySet,
    AllClear,
    AnyClear,
}

/// A parsed bit test: the positions the mask names.
#[derive(Debug, Clone)]
pub(super) struct BitsOp {
    kind: BitsKind,
    positions: Vec<u32>,
}

/// Most bit positions one mask may name (MongoDB's masks are bounded by the
/// document size; this keeps a hostile array from costing per-document time).
const MAX_POSITIONS: usize = 1 << 16;

impl BitsOp {
    pub(super) fn parse(op: &str, arg: &Bson) -> Result<BitsOp, Box<Error>> {
        let kind = match op {
            "$bitsAllSet" => BitsKind::AllSet,
            "$bitsAnySet" => BitsKind::AnySet,
            "$bitsAllClear" => BitsKind::AllClear,
            _ => BitsKind::AnyClear,
        };
        let bad = |m: String| Box::new(Error::bad_value(m));
        let mut positions = Vec::new();
        match arg {
            Bson::Array(items) => {
                if items.len() > MAX_POSITIONS {
                    return Err(bad(format!(
                        "{op} takes at most {MAX_POSITIONS} bit positions"
                    )));
                }
                for i in items {
                    let n = whole(i).ok_or_else(|| {
                        bad(format!(
                            "bit positions must be an integer but got: {}",
                            render(i)
                        ))
                    })?;
                    if n < 0 {
                        return Err(bad(format!(
                            "bit positions must be >= 0 but got: {}",
                            render(i)
                        )));
                    }
                    positions.push(u32::try_from(n).unwrap_or(u32::MAX));
                }
            }
            Bson::Binary(b) => {
                for (byte_i, byte) in b.bytes.iter().enumerate() {
                    for bit in 0..8 {
                        if byte & (1 << bit) != 0 {
                            positions.push(u32::try_from(byte_i * 8 + bit).unwrap_or(u32::MAX));
                        }
                    }
                }
            }
            other
                if matches!(
                    other,
                    Bson::Int32(_) | Bson::Int64(_) | Bson::Double(_) | Bson::Decimal128(_)
                ) =>
            {
                let n = whole(other).ok_or_else(|| {
                    bad(format!(
                        "{op} takes an Array, a number, or a BinData but received: {op}: {}",
                        render(other)
                    ))
                })?;
                if n < 0 {
                    return Err(bad(format!(
                        "{op} requires a non-negative number, but got: {}",
                        render(other)
                    )));
                }
                for bit in 0..64 {
                    if n & (1 << bit) != 0 {
                        positions.push(bit);
                    }
                }
            }
            other => {
                return Err(bad(format!(
                    "{op} takes an Array, a number, or a BinData but received: {op}: {}",
                    render(other)
                )))
            }
        }
        Ok(BitsOp { kind, positions })
    }

    pub(super) fn matches(&self, v: RawBsonRef<'_>) -> bool {
        let bit: Box<dyn Fn(u32) -> bool> = match v {
            RawBsonRef::Binary(b) => {
                let bytes = b.bytes;
                Box::new(move |p: u32| {
                    let (i, o) = ((p / 8) as usize, p % 8);
                    bytes.get(i).is_some_and(|x| x & (1 << o) != 0)
                })
            }
            other if value::is_number(other) => {
                let n = match Num::of(other) {
                    Num::Int(i) => i,
                    Num::Float(f) if f.is_finite() && f.trunc() == f && f.abs() < 9.2e18 => {
                        f as i64
                    }
                    Num::Float(_) => return false,
                };
                Box::new(move |p: u32| n & (1i64 << p.min(63)) != 0)
            }
            _ => return false,
        };
        match self.kind {
            BitsKind::AllSet => self.positions.iter().all(|p| bit(*p)),
            BitsKind::AnySet => self.positions.iter().any(|p| bit(*p)),
            BitsKind::AllClear => self.positions.iter().all(|p| !bit(*p)),
            BitsKind::AnyClear => self.positions.iter().any(|p| !bit(*p)),
        }
    }
}

fn whole(v: &Bson) -> Option<i64> {
    let f = match v {
        Bson::Int32(i) => return Some(i64::from(*i)),
        Bson::Int64(i) => return Some(*i),
        Bson::Double(f) => *f,
        Bson::Decimal128(d) => value::decimal_to_f64(*d),
        _ => return None,
    };
    (f.is_finite() && f.trunc() == f && f.abs() < 9.2e18).then_some(f as i64)
}
