//! One version of a collection: its record heap, `_id` index and secondary indexes.
//!
//! A `CollectionState` is a value: cloning it is O(1) (every part is a persistent
//! structure behind `Arc`s), and mutating a clone copies only the nodes still
//! shared with other versions. Only the writer mutates, and only its private
//! working version; readers hold published versions, which never change.
//!
//! Invariants (checked by [`CollectionState::check_invariants`] in tests):
//! - every record in the heap has exactly one `_id` index entry and its keys in
//!   every secondary index, and no index holds an entry for a missing record;
//! - `_id` values are unique (by MongoDB equality: `1` and `1.0` collide);
//! - `data_bytes` is the sum of the stored documents' sizes;
//! - each mutation either applies completely or returns an error having changed
//!   nothing (all checks run before the first write).

use std::ops::Bound;
use std::sync::Arc;

use bson::{Document, RawBson};

use crate::doc::{self, DocRef};
use crate::error::{DuplicateKey, Error, Result};
use crate::store::btree::BTree;
use crate::store::heap::{Heap, RecordId};
use crate::store::index::{IndexKey, IndexSpec, IndexState, ValueKey};
use crate::store::vls::{CollectionVls, VlsOptions};

/// Name of the primary index, as MongoDB.
pub const ID_INDEX_NAME: &str = "_id_";
/// Most secondary indexes per collection (MongoDB allows 64 including `_id`).
pub const MAX_INDEXES: usize = 63;

/// A collection at one commit.
#[derive(Debug, Clone)]
pub struct CollectionState {
    /// `db.collection`, for error messages.
    pub ns: Arc<str>,
    pub heap: Heap<DocRef>,
    pub id_index: BTree<ValueKey, RecordId>,
    pub indexes: Vec<IndexState>,
    pub next_rid: RecordId,
    pub data_bytes: u64,
    /// VLS bookkeeping (status masks, remset): beside the heap, shared by every
    /// version of this collection, updated by the writer before each change.
    pub vls: Arc<CollectionVls>,
}

impl CollectionState {
    pub fn new(ns: &str, vls: VlsOptions) -> CollectionState {
        CollectionState {
            ns: Arc::from(ns),
            heap: Heap::new(),
            id_index: BTree::new(),
            indexes: Vec::new(),
            next_rid: 0,
            data_bytes: 0,
            vls: Arc::new(CollectionVls::new(vls)),
        }
    }

    pub fn len(&self) -> usize {
        self.heap.len()
    }

    pub fn is_empty(&self) -> bool {
        self.heap.is_empty()
    }

    pub fn get(&self, rid: RecordId) -> Option<&DocRef> {
        self.heap.get(rid)
    }

    /// The record holding `_id == id`.
    pub fn rid_of_id(&self, id: &RawBson) -> Option<RecordId> {
        self.id_index.get(&ValueKey(id.clone())).copied()
    }

    pub fn index(&self, name: &str) -> Option<&IndexState> {
        self.indexes.iter().find(|i| i.spec.name == name)
    }

    fn dup_id_error(&self, id: &RawBson) -> Error {
        let id_bson = bson::Bson::try_from(id.clone()).unwrap_or(bson::Bson::Null);
        let mut key_value = Document::new();
        key_value.insert("_id", id_bson.clone());
        let mut key_pattern = Document::new();
        key_pattern.insert("_id", 1);
        Error::DuplicateKey(Box::new(DuplicateKey {
            ns: self.ns.to_string(),
            index: ID_INDEX_NAME.to_string(),
            key_pattern,
            key: format!("{{ _id: {} }}", crate::error::render(&id_bson)),
            key_value,
        }))
    }

    fn dup_key_error(&self, index: &IndexState, key: &IndexKey) -> Error {
        let key_value = key.to_document(&index.spec);
        let rendered = key_value
            .iter()
            .map(|(k, v)| format!("{k}: {}", crate::error::render(v)))
            .collect::<Vec<_>>()
            .join(", ");
        Error::DuplicateKey(Box::new(DuplicateKey {
            ns: self.ns.to_string(),
            index: index.spec.name.clone(),
            key_pattern: index.spec.key_pattern(),
            key: format!("{{ {rendered} }}"),
            key_value,
        }))
    }

    /// Keys of `doc` for every secondary index, with unique constraints checked
    /// against records other than `except`.
    fn keys_checked(
        &self,
        doc: &bson::RawDocument,
        except: Option<RecordId>,
    ) -> Result<Vec<(Vec<IndexKey>, bool)>> {
        let mut all = Vec::with_capacity(self.indexes.len());
        for index in &self.indexes {
            let (keys, multikey) = index.spec.keys_for(doc)?;
            if index.spec.unique {
                for k in &keys {
                    if index.holder_of(k, except).is_some() {
                        return Err(self.dup_key_error(index, k));
                    }
                }
            }
            all.push((keys, multikey));
        }
        Ok(all)
    }

    /// Store a new document (already prepared by [`doc::prepare_insert`]).
    pub fn insert(&mut self, raw: DocRef, id: RawBson) -> Result<RecordId> {
        if self.rid_of_id(&id).is_some() {
            return Err(self.dup_id_error(&id));
        }
        let keys = self.keys_checked(&raw, None)?;
        let rid = self.next_rid;
        self.next_rid += 1;
        for (index, (keys, multikey)) in self.indexes.iter_mut().zip(keys) {
            index.multikey |= multikey;
            for k in keys {
                index.tree.insert((k, rid), ());
            }
        }
        self.data_bytes += raw.as_bytes().len() as u64;
        self.id_index.insert(ValueKey(id), rid);
        self.vls.on_insert(rid);
        self.heap.insert(rid, raw);
        Ok(rid)
    }

    /// Replace the document of `rid` by `new` (whose `_id` must equal the old one).
    pub fn replace(&mut self, rid: RecordId, new: DocRef) -> Result<()> {
        self.replace_where(rid, new, |_| true)
    }

    /// [`CollectionState::replace`] that maintains only the indexes `affected`
    /// says the change may touch (an update that modifies no indexed path skips
    /// computing keys altogether).
    ///
    /// Requires: `affected(spec)` is true for every index whose keys differ
    /// between the old and the new version (checked in debug builds).
    pub fn replace_where(
        &mut self,
        rid: RecordId,
        new: DocRef,
        affected: impl Fn(&IndexSpec) -> bool,
    ) -> Result<()> {
        let old = self
            .heap
            .get(rid)
            .cloned()
            .ok_or_else(|| Error::Internal(format!("replace of missing record {rid}")))?;
        debug_assert!(
            matches!((doc::id_of(&old), doc::id_of(&new)), (Some(a), Some(b)) if crate::doc::value::equal(a, b)),
            "replace must keep _id"
        );
        // All checks first (nothing is written until every index accepted the keys).
        let mut new_keys: Vec<Option<(Vec<IndexKey>, bool)>> =
            Vec::with_capacity(self.indexes.len());
        for index in &self.indexes {
            if !affected(&index.spec) {
                debug_assert!(
                    index.spec.keys_for(&old).ok().map(|k| k.0)
                        == index.spec.keys_for(&new).ok().map(|k| k.0),
                    "index {} changed although the update was said not to affect it",
                    index.spec.name
                );
                new_keys.push(None);
                continue;
            }
            let (keys, multikey) = index.spec.keys_for(&new)?;
            if index.spec.unique {
                for k in &keys {
                    if index.holder_of(k, Some(rid)).is_some() {
                        return Err(self.dup_key_error(index, k));
                    }
                }
            }
            new_keys.push(Some((keys, multikey)));
        }
        for (index, computed) in self.indexes.iter_mut().zip(new_keys) {
            let Some((new_keys, multikey)) = computed else {
                continue;
            };
            let (old_keys, _) = index.spec.keys_for(&old)?;
            if old_keys == new_keys {
                continue;
            }
            index.multikey |= multikey;
            for k in old_keys {
                index.tree.remove(&(k, rid));
            }
            for k in new_keys {
                index.tree.insert((k, rid), ());
            }
        }
        self.vls.on_supersede(rid, &old);
        self.data_bytes =
            self.data_bytes - old.as_bytes().len() as u64 + new.as_bytes().len() as u64;
        self.heap.insert(rid, new);
        Ok(())
    }

    /// Remove the document of `rid`; returns it.
    pub fn delete(&mut self, rid: RecordId) -> Result<DocRef> {
        let current = self
            .heap
            .get(rid)
            .ok_or_else(|| Error::Internal(format!("delete of missing record {rid}")))?;
        self.vls.on_supersede(rid, current);
        let old = self
            .heap
            .remove(rid)
            .ok_or_else(|| Error::Internal(format!("delete of missing record {rid}")))?;
        for index in &mut self.indexes {
            let (keys, _) = index.spec.keys_for(&old)?;
            for k in keys {
                index.tree.remove(&(k, rid));
            }
        }
        if let Some(id) = doc::id_of(&old) {
            self.id_index.remove(&ValueKey(id.into()));
        }
        self.data_bytes -= old.as_bytes().len() as u64;
        Ok(old)
    }

    /// Build a new index over the existing documents. Errors (duplicate keys,
    /// parallel arrays) leave the collection unchanged.
    pub fn create_index(&mut self, spec: IndexSpec) -> Result<bool> {
        if spec.fields.len() == 1 && spec.fields[0].0 == "_id" && spec.fields[0].1 {
            return Ok(false); // the primary index always exists
        }
        if spec.name == ID_INDEX_NAME {
            return Err(Error::IndexConflict(
                "the name _id_ is reserved for the _id index".into(),
            ));
        }
        if let Some(existing) = self.indexes.iter().find(|i| i.spec.name == spec.name) {
            if *existing.spec == spec {
                return Ok(false);
            }
            return Err(Error::IndexConflict(format!(
                "an index named {} already exists with a different key pattern or options",
                spec.name
            )));
        }
        if let Some(existing) = self.indexes.iter().find(|i| i.spec.fields == spec.fields) {
            return Err(Error::IndexConflict(format!(
                "an equivalent index already exists with the name {}",
                existing.spec.name
            )));
        }
        if self.indexes.len() >= MAX_INDEXES {
            return Err(Error::CannotCreateIndex(format!(
                "a collection may have at most {} indexes",
                MAX_INDEXES + 1
            )));
        }
        let mut index = IndexState::new(spec);
        for (rid, doc) in self.heap.iter() {
            let (keys, multikey) = index.spec.keys_for(doc)?;
            index.multikey |= multikey;
            for k in keys {
                if index.spec.unique && index.holder_of(&k, Some(rid)).is_some() {
                    return Err(self.dup_key_error(&index, &k));
                }
                index.tree.insert((k, rid), ());
            }
        }
        self.indexes.push(index);
        Ok(true)
    }

    pub fn drop_index(&mut self, name: &str) -> Result<()> {
        if name == ID_INDEX_NAME {
            return Err(Error::bad_value("cannot drop _id index"));
        }
        let pos = self
            .indexes
            .iter()
            .position(|i| i.spec.name == name)
            .ok_or_else(|| Error::IndexNotFound(name.to_string()))?;
        self.indexes.remove(pos);
        Ok(())
    }

    /// Verify every invariant in the module doc; O(n log n). For tests and checks.
    pub fn check_invariants(&self) -> Result<(), String> {
        let mut bytes = 0u64;
        for (rid, d) in self.heap.iter() {
            bytes += d.as_bytes().len() as u64;
            let id = doc::id_of(d).ok_or(format!("record {rid} has no _id"))?;
            if self.id_index.get(&ValueKey(id.into())) != Some(&rid) {
                return Err(format!("record {rid}: _id index does not point at it"));
            }
            for index in &self.indexes {
                let (keys, _) = index.spec.keys_for(d).map_err(|e| e.to_string())?;
                for k in keys {
                    if index.tree.get(&(k, rid)).is_none() {
                        return Err(format!(
                            "record {rid} missing from index {}",
                            index.spec.name
                        ));
                    }
                }
            }
        }
        if bytes != self.data_bytes {
            return Err(format!(
                "data_bytes {} but documents sum to {bytes}",
                self.data_bytes
            ));
        }
        if self.id_index.len() != self.heap.len() {
            return Err(format!(
                "_id index has {} entries for {} records",
                self.id_index.len(),
                self.heap.len()
            ));
        }
        for index in &self.indexes {
            let mut expected = 0;
            for (_, d) in self.heap.iter() {
                expected += index.spec.keys_for(d).map_err(|e| e.to_string())?.0.len();
            }
            if index.tree.len() != expected {
                return Err(format!(
                    "index {} has {} entries, expected {expected}",
                    index.spec.name,
                    index.tree.len()
                ));
            }
            for ((_, rid), _) in index.tree.range(Bound::Unbounded, Bound::Unbounded) {
                if self.heap.get(*rid).is_none() {
                    return Err(format!(
                        "index {} points at missing record {rid}",
                        index.spec.name
                    ));
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bson::{doc, rawdoc};

    fn coll() -> CollectionState {
        let mut c = CollectionState::new("t.c", VlsOptions::default());
        let spec = IndexSpec::new(&doc! {"a": 1}, None, false).expect("spec");
        c.create_index(spec).expect("index");
        c.insert(
            Arc::new(rawdoc! {"_id": 1, "a": 1, "b": 1}),
            RawBson::Int32(1),
        )
        .expect("insert");
        c
    }

    #[test]
    fn replace_where_skips_unaffected_indexes_and_stays_consistent() {
        let mut c = coll();
        c.replace_where(0, Arc::new(rawdoc! {"_id": 1, "a": 1, "b": 2}), |_| false)
            .expect("replace");
        c.check_invariants().expect("invariants");
        c.replace_where(0, Arc::new(rawdoc! {"_id": 1, "a": 5, "b": 2}), |_| true)
            .expect("replace");
        c.check_invariants().expect("invariants");
    }

    /// The debug check that guards `replace_where`'s contract can fail.
    #[test]
    #[cfg(debug_assertions)]
    #[should_panic(expected = "was said not to affect it")]
    fn replace_where_with_a_wrong_claim_is_caught_in_debug_builds() {
        let mut c = coll();
        let _ = c.replace_where(0, Arc::new(rawdoc! {"_id": 1, "a": 2, "b": 1}), |_| false);
    }
}
