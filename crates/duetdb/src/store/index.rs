//! Secondary indexes: specifications, key extraction and the key order.
//!
//! An index is a persistent [`BTree`] over `(IndexKey, RecordId)` entries (the
//! record id makes entries of equal keys distinct and orders them), plus its spec.
//!
//! Invariants:
//! - the tree holds exactly the keys [`IndexSpec::keys_for`] yields for every
//!   stored document, once each (duplicates within one document are collapsed);
//! - for a `unique` index no two different records share a key;
//! - keys compare part by part with [`crate::doc::value::compare`], a descending part
//!   reversed; the [`KeyPart::Low`]/[`KeyPart::High`] sentinels never reach the tree:
//!   they only build range bounds;
//! - `multikey` is set once any document produced more than one key or reached a
//!   value through an array, and never cleared (range bounds must then stay one-sided).

use std::cmp::Ordering;
use std::sync::Arc;

use bson::raw::RawDocument;
use bson::{Bson, Document, RawBson, RawBsonRef};

use crate::doc::value;
use crate::error::{Error, Result};
use crate::store::btree::BTree;
use crate::store::heap::RecordId;

/// Most fields in one compound index (MongoDB's limit).
pub const MAX_INDEX_FIELDS: usize = 32;
/// Most keys one document may produce for one index (bounds multikey fan-out).
pub const MAX_KEYS_PER_DOC: usize = 100_000;

/// One component of an index key.
#[derive(Debug, Clone)]
pub enum KeyPart {
    /// Sorts before every value, whatever the direction (range bounds only).
    Low,
    Val(RawBson),
    /// Sorts after every value, whatever the direction (range bounds only).
    High,
}

/// A whole index key; `desc` bit i reverses part i. The parts are shared
/// (`Arc`): copy-on-write B+tree nodes clone their keys on every path copy, so a
/// key clone must cost a reference-count increment, not an allocation.
#[derive(Debug, Clone)]
pub struct IndexKey {
    pub parts: Arc<[KeyPart]>,
    pub desc: u32,
}

impl IndexKey {
    fn cmp_parts(&self, other: &Self) -> Ordering {
        for (i, (a, b)) in self.parts.iter().zip(other.parts.iter()).enumerate() {
            let ord = match (a, b) {
                (KeyPart::Low, KeyPart::Low) | (KeyPart::High, KeyPart::High) => Ordering::Equal,
                (KeyPart::Low, _) | (_, KeyPart::High) => Ordering::Less,
                (_, KeyPart::Low) | (KeyPart::High, _) => Ordering::Greater,
                (KeyPart::Val(x), KeyPart::Val(y)) => {
                    let o = value::compare(x.as_raw_bson_ref(), y.as_raw_bson_ref());
                    if self.desc & (1 << i) != 0 {
                        o.reverse()
                    } else {
                        o
                    }
                }
            };
            if ord != Ordering::Equal {
                return ord;
            }
        }
        self.parts.len().cmp(&other.parts.len())
    }

    /// The key as a document `{field: value, …}` (for error messages and explain).
    pub fn to_document(&self, spec: &IndexSpec) -> Document {
        let mut d = Document::new();
        for ((path, _), part) in spec.fields.iter().zip(self.parts.iter()) {
            let v = match part {
                KeyPart::Low => Bson::MinKey,
                KeyPart::High => Bson::MaxKey,
                KeyPart::Val(v) => Bson::try_from(v.clone()).unwrap_or(Bson::Null),
            };
            d.insert(path.clone(), v);
        }
        d
    }
}

impl PartialEq for IndexKey {
    fn eq(&self, other: &Self) -> bool {
        self.cmp_parts(other) == Ordering::Equal
    }
}
impl Eq for IndexKey {}
impl PartialOrd for IndexKey {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for IndexKey {
    fn cmp(&self, other: &Self) -> Ordering {
        self.cmp_parts(other)
    }
}

/// A single BSON value ordered by MongoDB's order (the `_id` index key).
#[derive(Debug, Clone)]
pub struct ValueKey(pub RawBson);

impl PartialEq for ValueKey {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}
impl Eq for ValueKey {}
impl PartialOrd for ValueKey {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for ValueKey {
    fn cmp(&self, other: &Self) -> Ordering {
        // Fast paths for the common `_id` types (same results as `value::compare`,
        // without building raw references on every step of a tree descent).
        match (&self.0, &other.0) {
            (RawBson::Int64(a), RawBson::Int64(b)) => a.cmp(b),
            (RawBson::Int32(a), RawBson::Int32(b)) => a.cmp(b),
            (RawBson::ObjectId(a), RawBson::ObjectId(b)) => a.bytes().cmp(&b.bytes()),
            (RawBson::String(a), RawBson::String(b)) => a.as_bytes().cmp(b.as_bytes()),
            (a, b) => value::compare(a.as_raw_bson_ref(), b.as_raw_bson_ref()),
        }
    }
}

/// What an index is over.
#[derive(Debug, Clone, PartialEq)]
pub struct IndexSpec {
    pub name: String,
    /// `(path, ascending)` in key order.
    pub fields: Vec<(String, bool)>,
    pub unique: bool,
}

impl IndexSpec {
    /// Parse `keys` (`{a: 1, "b.c": -1}`) with an optional name and unique flag.
    pub fn new(keys: &Document, name: Option<&str>, unique: bool) -> Result<IndexSpec> {
        if keys.is_empty() {
            return Err(Error::CannotCreateIndex(
                "index key pattern must not be empty".into(),
            ));
        }
        if keys.len() > MAX_INDEX_FIELDS {
            return Err(Error::CannotCreateIndex(format!(
                "an index may have at most {MAX_INDEX_FIELDS} fields"
            )));
        }
        let mut fields = Vec::with_capacity(keys.len());
        for (path, dir) in keys {
            crate::doc::path::validate(path).map_err(Error::CannotCreateIndex)?;
            if path.split('.').any(|p| p.starts_with('$')) {
                return Err(Error::CannotCreateIndex(format!(
                    "index key path '{path}' must not contain '$'-prefixed components"
                )));
            }
            let asc = match dir {
                Bson::Int32(1) | Bson::Int64(1) => true,
                Bson::Int32(-1) | Bson::Int64(-1) => false,
                Bson::Double(d) if *d == 1.0 => true,
                Bson::Double(d) if *d == -1.0 => false,
                Bson::String(s) => {
                    return Err(Error::CannotCreateIndex(format!(
                        "index type '{s}' is not supported: only ascending (1) and descending (-1) keys"
                    )))
                }
                other => {
                    return Err(Error::CannotCreateIndex(format!(
                        "bad index key direction for '{path}': {other}; use 1 or -1"
                    )))
                }
            };
            if fields.iter().any(|(p, _): &(String, bool)| p == path) {
                return Err(Error::CannotCreateIndex(format!(
                    "duplicate index field '{path}'"
                )));
            }
            fields.push((path.clone(), asc));
        }
        let name = match name {
            Some("") => {
                return Err(Error::CannotCreateIndex(
                    "index name must not be empty".into(),
                ))
            }
            Some(n) => n.to_string(),
            None => default_name(&fields),
        };
        Ok(IndexSpec {
            name,
            fields,
            unique,
        })
    }

    /// The key pattern document (`{a: 1, b: -1}`).
    pub fn key_pattern(&self) -> Document {
        let mut d = Document::new();
        for (p, asc) in &self.fields {
            d.insert(p.clone(), if *asc { 1 } else { -1 });
        }
        d
    }

    fn desc_mask(&self) -> u32 {
        self.fields
            .iter()
            .enumerate()
            .filter(|(_, (_, asc))| !asc)
            .fold(0, |m, (i, _)| m | (1 << i))
    }

    /// A bound key: `parts` for the leading fields, then `fill` for the rest.
    pub fn bound_key(&self, parts: Vec<KeyPart>, fill: KeyPart) -> IndexKey {
        let mut parts = parts;
        while parts.len() < self.fields.len() {
            parts.push(fill.clone());
        }
        IndexKey {
            parts: parts.into(),
            desc: self.desc_mask(),
        }
    }

    /// The keys of `doc` for this index, deduplicated, and whether the document
    /// made the index multikey. Missing fields index as null, an empty array as
    /// undefined (MongoDB's rule). Arrays on more than one field of a compound
    /// index are refused ("cannot index parallel arrays").
    pub fn keys_for(&self, doc: &RawDocument) -> Result<(Vec<IndexKey>, bool)> {
        let mut per_field: Vec<Vec<RawBson>> = Vec::with_capacity(self.fields.len());
        let mut multikey = false;
        let mut array_fields = 0;
        for (path, _) in &self.fields {
            let (reached, through_array) = crate::doc::path::values_with_multikey(doc, path);
            let mut vals: Vec<RawBson> = Vec::new();
            let mut field_multi = through_array;
            if reached.is_empty() {
                vals.push(RawBson::Null);
            }
            for v in reached {
                match v {
                    RawBsonRef::Array(a) => {
                        field_multi = true;
                        let before = vals.len();
                        for elem in a.into_iter().flatten() {
                            vals.push(elem.into());
                        }
                        if vals.len() == before {
                            vals.push(RawBson::Undefined);
                        }
                    }
                    other => vals.push(other.into()),
                }
            }
            vals.sort_by(|a, b| value::compare(a.as_raw_bson_ref(), b.as_raw_bson_ref()));
            vals.dedup_by(|a, b| value::equal(a.as_raw_bson_ref(), b.as_raw_bson_ref()));
            if field_multi || vals.len() > 1 {
                multikey = true;
                if vals.len() > 1 {
                    array_fields += 1;
                }
            }
            per_field.push(vals);
        }
        if array_fields > 1 {
            let arrays: Vec<&str> = self
                .fields
                .iter()
                .zip(per_field.iter())
                .filter(|(_, v)| v.len() > 1)
                .map(|((p, _), _)| p.as_str())
                .collect();
            return Err(Error::CannotCreateIndex(format!(
                "cannot index parallel arrays [{}] in index {}",
                arrays.join("] ["),
                self.name
            )));
        }
        let total: usize = per_field.iter().map(Vec::len).product();
        if total > MAX_KEYS_PER_DOC {
            return Err(Error::CannotCreateIndex(format!(
                "document produces {total} keys for index {}, more than {MAX_KEYS_PER_DOC}",
                self.name
            )));
        }
        // At most one field has several values, so the product is a single loop.
        let desc = self.desc_mask();
        let mut keys = Vec::with_capacity(total);
        let multi_field = per_field.iter().position(|v| v.len() > 1);
        let n = multi_field.map_or(1, |i| per_field[i].len());
        for j in 0..n {
            let parts: Vec<KeyPart> = per_field
                .iter()
                .enumerate()
                .map(|(i, vals)| {
                    let v = if Some(i) == multi_field {
                        &vals[j]
                    } else {
                        &vals[0]
                    };
                    KeyPart::Val(v.clone())
                })
                .collect();
            keys.push(IndexKey {
                parts: parts.into(),
                desc,
            });
        }
        Ok((keys, multikey))
    }
}

fn default_name(fields: &[(String, bool)]) -> String {
    fields
        .iter()
        .map(|(p, asc)| format!("{p}_{}", if *asc { 1 } else { -1 }))
        .collect::<Vec<_>>()
        .join("_")
}

/// One secondary index of a collection version. Cloning is O(1).
#[derive(Debug, Clone)]
pub struct IndexState {
    pub spec: Arc<IndexSpec>,
    pub tree: BTree<(IndexKey, RecordId), ()>,
    pub multikey: bool,
}

impl IndexState {
    pub fn new(spec: IndexSpec) -> IndexState {
        IndexState {
            spec: Arc::new(spec),
            tree: BTree::new(),
            multikey: false,
        }
    }

    /// A record other than `except` that holds `key`, if any (unique checks).
    pub fn holder_of(&self, key: &IndexKey, except: Option<RecordId>) -> Option<RecordId> {
        use std::ops::Bound::Included;
        let lo = (key.clone(), RecordId::MIN);
        let hi = (key.clone(), RecordId::MAX);
        self.tree
            .range(Included(&lo), Included(&hi))
            .map(|((_, rid), _)| *rid)
            .find(|rid| Some(*rid) != except)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bson::{doc, rawdoc};

    fn spec(keys: Document) -> IndexSpec {
        IndexSpec::new(&keys, None, false).expect("spec")
    }

    fn key_values(keys: &[IndexKey]) -> Vec<Vec<Bson>> {
        keys.iter()
            .map(|k| {
                k.parts
                    .iter()
                    .map(|p| match p {
                        KeyPart::Val(v) => Bson::try_from(v.clone()).expect("bson"),
                        _ => Bson::Null,
                    })
                    .collect()
            })
            .collect()
    }

    #[test]
    fn names_and_errors() {
        assert_eq!(spec(doc! {"a": 1, "b.c": -1}).name, "a_1_b.c_-1");
        assert!(IndexSpec::new(&doc! {}, None, false).is_err());
        assert!(IndexSpec::new(&doc! {"a": "text"}, None, false).is_err());
        assert!(IndexSpec::new(&doc! {"a": 2}, None, false).is_err());
        assert!(IndexSpec::new(&doc! {"a..b": 1}, None, false).is_err());
    }

    #[test]
    fn missing_is_null_and_arrays_fan_out() {
        let s = spec(doc! {"a": 1});
        let (k, multi) = s.keys_for(&rawdoc! {"b": 1}).expect("keys");
        assert_eq!(key_values(&k), vec![vec![Bson::Null]]);
        assert!(!multi);
        let (k, multi) = s.keys_for(&rawdoc! {"a": [3, 1, 3]}).expect("keys");
        assert_eq!(
            key_values(&k),
            vec![vec![Bson::Int32(1)], vec![Bson::Int32(3)]]
        );
        assert!(multi);
        let (k, _) = s.keys_for(&rawdoc! {"a": []}).expect("keys");
        assert_eq!(key_values(&k), vec![vec![Bson::Undefined]]);
    }

    #[test]
    fn parallel_arrays_refused() {
        let s = spec(doc! {"a": 1, "b": 1});
        assert!(s.keys_for(&rawdoc! {"a": [1, 2], "b": [3, 4]}).is_err());
        let (k, _) = s
            .keys_for(&rawdoc! {"a": [1, 2], "b": 5})
            .expect("one array is fine");
        assert_eq!(k.len(), 2);
    }

    #[test]
    fn value_key_fast_paths_agree_with_the_bson_order() {
        let vals = vec![
            RawBson::Int32(-1),
            RawBson::Int32(5),
            RawBson::Int64(5),
            RawBson::Int64(i64::MIN),
            RawBson::Double(5.0),
            RawBson::Double(-0.5),
            RawBson::String("a".into()),
            RawBson::String("ab".into()),
            RawBson::String(String::new()),
            RawBson::ObjectId(bson::oid::ObjectId::from_bytes([1; 12])),
            RawBson::ObjectId(bson::oid::ObjectId::from_bytes([0; 12])),
            RawBson::Null,
        ];
        for a in &vals {
            for b in &vals {
                let fast = ValueKey(a.clone()).cmp(&ValueKey(b.clone()));
                let slow = value::compare(a.as_raw_bson_ref(), b.as_raw_bson_ref());
                assert_eq!(fast, slow, "{a:?} vs {b:?}");
            }
        }
    }

    #[test]
    fn descending_parts_reverse_order() {
        let s = spec(doc! {"a": 1, "b": -1});
        let k = |a: i32, b: i32| {
            s.keys_for(&rawdoc! {"a": a, "b": b})
                .expect("keys")
                .0
                .remove(0)
        };
        assert!(k(1, 5) < k(1, 4));
        assert!(k(1, 0) < k(2, 9));
        let low = s.bound_key(vec![KeyPart::Val(RawBson::Int32(1))], KeyPart::Low);
        let high = s.bound_key(vec![KeyPart::Val(RawBson::Int32(1))], KeyPart::High);
        assert!(low < k(1, 100) && k(1, -100) < high);
        assert!(high < k(2, 100));
    }
}
