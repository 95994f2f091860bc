//! The documents every target stores, so all of them load the same data:
//! YCSB's `usertable` (string key, `field0..fieldN` strings) and the HTAP
//! table (integer `_id`, ~240-byte documents with an indexed, uniformly
//! distributed `v` used for range scans of a given selectivity), which the
//! `snapshot` and `space` workloads load too. Also the table names and the
//! batching every loader shares.

use std::ops::Range;

use anyhow::{bail, Result};
use bson::{doc, Document};

pub const YCSB_TABLE: &str = "usertable";
pub const HTAP_TABLE: &str = "htap";
/// The collection the `snapshot` workload loads.
pub const SNAPSHOT_TABLE: &str = "snapshot";
/// The collection the `space` workload loads.
pub const SPACE_TABLE: &str = "space";
/// Documents per insert command (or write transaction) while loading.
pub const LOAD_BATCH: u64 = 10_000;

/// One YCSB field value.
pub type Field = (String, String);

/// A YCSB record as a document: `_id` = the key, one string field per field.
pub fn ycsb_doc(key: &str, fields: &[Field]) -> Document {
    let mut d = doc! {"_id": key};
    for (k, v) in fields {
        d.insert(k.clone(), v.clone());
    }
    d
}

/// `v` of each document: a permutation of `0..records` (affine map modulo a
/// prime ≥ records, cycle-walked back into range), so a range of width w
/// selects exactly w documents spread over the whole table.
#[derive(Debug, Clone, Copy)]
pub struct VPerm {
    records: u64,
    prime: u64,
}

impl VPerm {
    pub fn new(records: u64) -> VPerm {
        let is_prime = |m: u64| {
            m >= 2
                && (2..)
                    .take_while(|d| d * d <= m)
                    .all(|d| !m.is_multiple_of(d))
        };
        let prime = (records.max(2)..).find(|&m| is_prime(m)).unwrap_or(records);
        VPerm { records, prime }
    }

    /// Requires: `i < records`.
    pub fn v(&self, i: u64) -> u64 {
        debug_assert!(i < self.records);
        let mut x = i;
        loop {
            x = ((x as u128 * 2_654_435_761u128 + 7) % self.prime as u128) as u64;
            if x < self.records {
                return x;
            }
        }
    }
}

/// The HTAP document: about 240 bytes of BSON (the VLS paper's record size).
pub fn htap_doc(i: u64, perm: &VPerm) -> Document {
    let id = i as i64;
    let region = ["north", "south", "east", "west"][(i % 4) as usize];
    doc! {
        "_id": id,
        "v": perm.v(i) as i64,
        "b": id % 1000,
        "region": region,
        "f1": format!("{:0>40}", i),
        "f2": format!("{:x>60}", i.wrapping_mul(7)),
        "f3": format!("{:y>60}", i.wrapping_mul(13)),
    }
}

/// A payload for `f2` of the same length as the loaded one.
pub fn htap_payload(n: u64) -> String {
    format!("{:z>60}", n)
}

/// Hand the HTAP documents `ids` to `insert` in batches of [`LOAD_BATCH`],
/// in `_id` order (every loader of every target goes through here).
pub fn htap_batches(
    ids: Range<u64>,
    perm: &VPerm,
    mut insert: impl FnMut(Vec<Document>) -> Result<()>,
) -> Result<()> {
    let mut lo = ids.start;
    while lo < ids.end {
        let hi = (lo + LOAD_BATCH).min(ids.end);
        insert((lo..hi).map(|i| htap_doc(i, perm)).collect())?;
        lo = hi;
    }
    Ok(())
}

/// Bytes of HTAP document `i` as stored (≈240; 240 if it cannot be encoded).
pub fn htap_doc_bytes(i: u64, perm: &VPerm) -> u64 {
    duetdb::raw::to_raw_document(&htap_doc(i, perm)).map_or(240, |b| b.as_bytes().len() as u64)
}

/// The HTAP document as JSON text (for SQL peers): the same fields and sizes.
pub fn htap_json(i: u64, perm: &VPerm) -> String {
    let region = ["north", "south", "east", "west"][(i % 4) as usize];
    serde_json::json!({
        "_id": i,
        "v": perm.v(i),
        "b": i % 1000,
        "region": region,
        "f1": format!("{:0>40}", i),
        "f2": format!("{:x>60}", i.wrapping_mul(7)),
        "f3": format!("{:y>60}", i.wrapping_mul(13)),
    })
    .to_string()
}

/// A SQL identifier we generated ourselves (`field7`); refuses anything else.
pub fn checked_ident(name: &str) -> Result<&str> {
    if !name.is_empty() && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
        Ok(name)
    } else {
        bail!("not a plain identifier: {name:?}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn v_is_a_permutation_and_docs_are_about_240_bytes() {
        let n = 1000;
        let perm = VPerm::new(n);
        let mut seen = vec![false; n as usize];
        for i in 0..n {
            let v = perm.v(i) as usize;
            assert!(!seen[v]);
            seen[v] = true;
        }
        let bytes = duetdb::raw::to_raw_document(&htap_doc(123_456, &VPerm::new(1_000_000)))
            .map_or(0, |b| b.as_bytes().len());
        assert!((220..=260).contains(&bytes), "{bytes}");
    }
}
