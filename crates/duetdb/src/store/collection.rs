//! One version of a collection: its record heap, `_id` index and secondary indexes.
//!
//! A `CollectionState` is a value: cloning it is O(1) (every part is a persistent
//! structure behind `Arc`s), and mutating a clone copies only the nodes still
//! shared with other versions. Only the writer mutates, and only its private
//! working version; readers hold published versions, which never change.
//!
//! Invariants (checked by [`CollectionState::check_invariants`] in tests, and
//! in debug builds by the writer after the groups that change a collection —
//! see `write::writer::CHECK_ALWAYS_MAX`):
//! - every record in the heap has exactly one `_id` index entry and its keys in
//!   every secondary index, and no index holds an entry for a missing record;
//! - `_id` values are unique (by MongoDB equality: `1` and `1.0` collide);
//! - `data_bytes` is the sum of the stored documents' sizes;
//! - each mutation either applies completely or returns an error having changed
//!   nothing (all checks run before the first write);
//! - these hold of each index's fresh view (merged tree plus delta layers,
//!   `store::delta`): with `delta_indexing`, writes change eligible indexes'
//!   active layers, never their trees, and unique checks read the fresh view.

use std::ops::Bound;
use std::sync::Arc;

use bson::{Document, RawBson};

use crate::doc::{self, DocRef};
use crate::error::{DuplicateKey, Error, Result};
use crate::store::btree::BTree;
use crate::store::heap::{Heap, RecordId};
use crate::store::index::{IndexKey, IndexKind, IndexSpec, IndexState, IndexUsage, ValueKey};
use crate::store::options::CollectionOptions;
use crate::store::vls::{CollectionVls, VlsOptions};

/// Name of the primary index, as MongoDB.
pub const ID_INDEX_NAME: &str = "_id_";
/// Most secondary indexes per collection (MongoDB allows 64 including `_id`).
pub const MAX_INDEXES: usize = 63;

/// A cheap summary of a collection version, O(indexes) to take: what a
/// failed command must leave as it found it (see [`CollectionState::fingerprint`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fingerprint {
    /// The VLS bookkeeping's address: the collection's identity across versions.
    pub vls: usize,
    pub len: usize,
    pub data_bytes: u64,
    pub next_rid: RecordId,
    pub id_entries: usize,
    /// Name and entry count of each secondary index, in order.
    pub indexes: Vec<(String, usize)>,
}

impl Fingerprint {
    /// `self` (taken before a failed command) and `after` describe the same
    /// contents. Record ids are never reused (a status mask belongs to one
    /// record forever), so an undone insert leaves its id consumed:
    /// `next_rid` may grow, everything else must be equal.
    pub fn unchanged_by_failure(&self, after: &Fingerprint) -> bool {
        after.next_rid >= self.next_rid
            && after.vls == self.vls
            && after.len == self.len
            && after.data_bytes == self.data_bytes
            && after.id_entries == self.id_entries
            && after.indexes == self.indexes
    }
}

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
    /// `create`/`collMod` options (checkpointed, logged by `SetOptions`).
    pub options: CollectionOptions,
    /// Reads that used the `_id` index (`IDHACK` or an `_id` range).
    pub id_usage: Arc<IndexUsage>,
    /// Delta indexing (`store::delta`): writes put the changes of eligible
    /// secondary indexes in their active delta layers instead of their
    /// trees. Set by the database state the writer works on
    /// (`DbState::collection_mut`); reads never look at it.
    pub delta_indexing: bool,
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
            options: CollectionOptions::default(),
            id_usage: IndexUsage::new(),
            delta_indexing: false,
        }
    }

    /// This version with every index in its stale view (the merged roots
    /// alone, `store::delta`): what an `indexRead: "stale"` read plans and
    /// scans on. The heap is this version's.
    pub fn stale(&self) -> CollectionState {
        let mut c = self.clone();
        for i in &mut c.indexes {
            if i.has_delta() {
                *i = i.stale();
            }
        }
        c
    }

    /// Does any index of this version have delta layers?
    pub fn has_index_deltas(&self) -> bool {
        self.indexes.iter().any(IndexState::has_delta)
    }

    /// This version with every index's layers folded into its tree (the
    /// same fresh view, no layers): what a checkpoint writes.
    pub fn with_deltas_folded(&self) -> CollectionState {
        let mut c = self.clone();
        for i in &mut c.indexes {
            i.fold();
        }
        c
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
        self.rid_of_key(&ValueKey::from(id))
    }

    /// The record holding the `_id` that `key` stands for.
    pub fn rid_of_key(&self, key: &ValueKey) -> Option<RecordId> {
        self.id_index.get(key).copied()
    }

    pub fn index(&self, name: &str) -> Option<&IndexState> {
        self.indexes.iter().find(|i| i.spec.name == name)
    }

    /// This version's [`Fingerprint`]; O(indexes), no walk over the records.
    pub fn fingerprint(&self) -> Fingerprint {
        Fingerprint {
            vls: Arc::as_ptr(&self.vls) as usize,
            len: self.len(),
            data_bytes: self.data_bytes,
            next_rid: self.next_rid,
            id_entries: self.id_index.len(),
            indexes: self
                .indexes
                .iter()
                .map(|i| (i.spec.name.clone(), i.len()))
                .collect(),
        }
    }

    /// True when `self` is certainly the same version as `other` (which must
    /// still be alive): the same heap root, the same index specs and sizes.
    /// O(indexes). May answer "changed" for equal contents, never "same" for
    /// a version a command wrote: a write copies the root of a heap whose
    /// root is shared with `other`, and index changes come with heap changes
    /// except creating or dropping an index, which changes the list.
    pub fn same_version(&self, other: &CollectionState) -> bool {
        self.heap.same_root(&other.heap)
            && Arc::ptr_eq(&self.vls, &other.vls)
            && self.next_rid == other.next_rid
            && self.data_bytes == other.data_bytes
            && self.id_index.len() == other.id_index.len()
            && self.indexes.len() == other.indexes.len()
            && self
                .indexes
                .iter()
                .zip(&other.indexes)
                .all(|(a, b)| Arc::ptr_eq(&a.spec, &b.spec) && a.len() == b.len())
    }

    pub(crate) fn dup_id_error(&self, id: &RawBson) -> Error {
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

    pub(crate) fn dup_key_error(&self, index: &IndexState, key: &IndexKey) -> Error {
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
        let delta = self.delta_indexing;
        for (index, (keys, multikey)) in self.indexes.iter_mut().zip(keys) {
            index.multikey |= multikey;
            for k in keys {
                index.insert_entry((k, rid), delta);
            }
        }
        self.data_bytes += raw.as_bytes().len() as u64;
        self.id_index.insert(ValueKey::from(id), rid);
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
        let delta = self.delta_indexing;
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
                index.remove_entry((k, rid), delta);
            }
            for k in new_keys {
                index.insert_entry((k, rid), delta);
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
        let delta = self.delta_indexing;
        for index in &mut self.indexes {
            let (keys, _) = index.spec.keys_for(&old)?;
            for k in keys {
                index.remove_entry((k, rid), delta);
            }
        }
        if let Some(id) = doc::id_of(&old) {
            self.id_index.remove(&ValueKey::from(id));
        }
        self.data_bytes -= old.as_bytes().len() as u64;
        Ok(old)
    }

    /// A capped collection past its `size` or `max` after an insert:
    /// remove the oldest documents (lowest record ids, insertion order)
    /// until it is within both again, never the newest one (MongoDB keeps a
    /// document larger than `size` alone). Returns the removed documents.
    /// Deterministic in the collection's state, so recovery and replication
    /// replaying an insert trim exactly as the writer did (the removals are
    /// not logged: MongoDB's oplog and change streams show none either).
    pub fn trim_capped(&mut self) -> Result<Vec<DocRef>> {
        let mut removed = Vec::new();
        while self.len() > 1
            && self
                .options
                .over_capped_limits(self.len() as u64, self.data_bytes)
        {
            let Some((rid, _)) = self.heap.iter().next() else {
                break;
            };
            removed.push(self.delete(rid)?);
        }
        Ok(removed)
    }

    /// Build a new index over the existing documents. Errors (duplicate keys,
    /// parallel arrays) leave the collection unchanged. Returns false when an
    /// identical index exists (or `spec` is the primary key pattern).
    /// (Large collections are built outside the writer instead:
    /// `store::index_build`; both check with [`CollectionState::check_new_index`].)
    pub fn create_index(&mut self, spec: IndexSpec) -> Result<bool> {
        if !self.check_new_index(&spec)? {
            return Ok(false);
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

    /// Is `c` this collection's default collation (same specification)?
    fn is_default_collation(&self, c: Option<&crate::doc::collation::Collator>) -> bool {
        match (c, self.options.collation.as_deref()) {
            (Some(a), Some(b)) => a.spec() == b.spec(),
            _ => false,
        }
    }

    /// The collated `_id` index ([`IndexSpec::is_collated_id`]), on a
    /// collection created with a non-simple default collation.
    pub fn collated_id_index(&self) -> Option<&IndexState> {
        self.indexes.iter().find(|i| i.spec.is_collated_id())
    }

    /// Whether `spec` may be added as a new index: `Ok(true)` when it may,
    /// `Ok(false)` when an identical index exists (or `spec` is the primary
    /// key pattern), an error on a conflict. Changes nothing.
    ///
    /// Conflicts, as MongoDB: the same name with other keys is 86
    /// IndexKeySpecsConflict; the same name and keys with other options, or
    /// the same keys (and partial filter) under another name, is 85
    /// IndexOptionsConflict.
    pub fn check_new_index(&self, spec: &IndexSpec) -> Result<bool> {
        if spec.is_id_pattern() && spec.partial.is_none() {
            return Ok(false); // the primary index always exists
        }
        // The name is the `_id` index's; a secondary index may carry it only
        // as the collated `_id` index of a collection whose default
        // collation it has (`IndexSpec::collated_id`, created with the
        // collection, replayed from the log).
        if spec.name == ID_INDEX_NAME
            && !(spec.is_collated_id() && self.is_default_collation(spec.collation.as_deref()))
        {
            return Err(Error::IndexConflict(
                "the name _id_ is reserved for the _id index".into(),
            ));
        }
        if let Some(existing) = self.indexes.iter().find(|i| i.spec.name == spec.name) {
            if *existing.spec == *spec {
                return Ok(false);
            }
            if existing.spec.same_keys_as(spec) {
                return Err(Error::IndexOptionsConflict(format!(
                    "An equivalent index already exists with the same name but different options. Requested index: {}, existing index: {}",
                    crate::error::render_shell_doc(&spec.to_document()),
                    crate::error::render_shell_doc(&existing.spec.to_document())
                )));
            }
            return Err(Error::IndexConflict(format!(
                "An existing index has the same name as the requested index. When index names are not specified, they are auto generated and can cause conflicts. Please refer to our documentation. Requested index: {}, existing index: {}",
                crate::error::render_shell_doc(&spec.to_document()),
                crate::error::render_shell_doc(&existing.spec.to_document())
            )));
        }
        if matches!(spec.kind, IndexKind::Text(_)) {
            if let Some(existing) = self
                .indexes
                .iter()
                .find(|i| matches!(i.spec.kind, IndexKind::Text(_)))
            {
                return Err(Error::IndexOptionsConflict(format!(
                    "An equivalent index already exists with a different name and options (one text index per collection). Requested index: {}, existing index: {}",
                    spec.to_document(),
                    existing.spec.to_document()
                )));
            }
        }
        if let Some(existing) = self.indexes.iter().find(|i| i.spec.same_keys_as(spec)) {
            return Err(Error::IndexOptionsConflict(format!(
                "Index already exists with a different name: {}",
                existing.spec.name
            )));
        }
        if self.indexes.len() >= MAX_INDEXES {
            return Err(Error::CannotCreateIndex(format!(
                "a collection may have at most {} indexes",
                MAX_INDEXES + 1
            )));
        }
        Ok(true)
    }

    /// Replace the spec of index `name` by `spec`, keeping its entries.
    ///
    /// Requires: `spec` forms the same keys for every document (only options
    /// that do not change entries differ, e.g. `expireAfterSeconds`); checked.
    pub fn replace_index_spec(&mut self, name: &str, spec: IndexSpec) -> Result<Arc<IndexSpec>> {
        let index = self
            .indexes
            .iter_mut()
            .find(|i| i.spec.name == name)
            .ok_or_else(|| Error::IndexNotFound(name.to_string()))?;
        let old = &index.spec;
        if old.name != spec.name
            || !old.same_keys_as(&spec)
            || old.unique != spec.unique
            || old.sparse != spec.sparse
        {
            return Err(Error::Internal(format!(
                "replace_index_spec of {name} would change its entries"
            )));
        }
        Ok(std::mem::replace(&mut index.spec, Arc::new(spec)))
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

    /// Verify every invariant in the module doc; O(n log n). For tests, and
    /// for the writer's debug check after each group (so it computes each
    /// record's keys once: key extraction dominates the cost).
    pub fn check_invariants(&self) -> Result<(), String> {
        let mut bytes = 0u64;
        // Per index: (record, its keys), in record order (the heap's order).
        let mut keys: Vec<Vec<(RecordId, Vec<IndexKey>)>> =
            vec![Vec::with_capacity(self.len()); self.indexes.len()];
        for (rid, d) in self.heap.iter() {
            bytes += d.as_bytes().len() as u64;
            let id = doc::id_of(d).ok_or(format!("record {rid} has no _id"))?;
            if self.id_index.get(&ValueKey::from(id)) != Some(&rid) {
                return Err(format!("record {rid}: _id index does not point at it"));
            }
            for (index, per_record) in self.indexes.iter().zip(&mut keys) {
                let (k, _) = index.spec.keys_for(d).map_err(|e| e.to_string())?;
                per_record.push((rid, k));
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
        for (index, per_record) in self.indexes.iter().zip(&keys) {
            check_index(index, per_record)?;
        }
        Ok(())
    }
}

/// An index holds exactly the keys of the records: as many entries as keys,
/// and every entry one of its record's keys. Since a record's keys are
/// deduplicated and entries are unique, the two sets are then equal (a
/// missing entry shows as a count mismatch). One ordered walk of the index.
fn check_index(index: &IndexState, per_record: &[(RecordId, Vec<IndexKey>)]) -> Result<(), String> {
    let name = &index.spec.name;
    let expected: usize = per_record.iter().map(|(_, k)| k.len()).sum();
    if index.len() != expected {
        return Err(format!(
            "index {name} has {} entries, expected {expected}",
            index.len()
        ));
    }
    // The fresh view (merged tree and delta layers); its count must be the
    // walk's too, or the layers' net counts are off.
    let mut walked = 0;
    for ((key, rid), _) in index.range(Bound::Unbounded, Bound::Unbounded) {
        walked += 1;
        let Ok(at) = per_record.binary_search_by_key(rid, |(r, _)| *r) else {
            return Err(format!("index {name} points at missing record {rid}"));
        };
        if !per_record[at].1.contains(key) {
            return Err(format!(
                "index {name}: an entry of record {rid} is not one of its keys"
            ));
        }
    }
    if walked != expected {
        return Err(format!(
            "index {name}: the fresh view holds {walked} entries, its count says {expected}"
        ));
    }
    Ok(())
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

    /// Planted index damage of each kind is reported (the check compares an
    /// index with the records' keys as sets: count, then membership).
    #[test]
    fn check_invariants_reports_damaged_indexes() {
        let key = |c: &CollectionState| {
            let ((k, rid), _) = c.indexes[0].tree.first().expect("an entry");
            (k.clone(), *rid)
        };
        let other_key = |c: &CollectionState| {
            let d = rawdoc! {"_id": 1, "a": 99};
            c.indexes[0].spec.keys_for(&d).expect("keys").0.remove(0)
        };
        let mut missing = coll();
        let entry = key(&missing);
        missing.indexes[0].tree.remove(&entry);
        let e = missing.check_invariants().expect_err("missing entry");
        assert!(e.contains("has 0 entries, expected 1"), "{e}");

        let mut wrong = coll();
        let entry = key(&wrong);
        wrong.indexes[0].tree.remove(&entry);
        let other = other_key(&wrong);
        wrong.indexes[0].tree.insert((other, entry.1), ());
        let e = wrong.check_invariants().expect_err("wrong key");
        assert!(
            e.contains("an entry of record 0 is not one of its keys"),
            "{e}"
        );

        let mut dangling = coll();
        let entry = key(&dangling);
        dangling.indexes[0].tree.remove(&entry);
        dangling.indexes[0].tree.insert((entry.0, 42), ());
        let e = dangling.check_invariants().expect_err("dangling entry");
        assert!(e.contains("points at missing record 42"), "{e}");

        let mut bytes = coll();
        bytes.data_bytes += 1;
        assert!(bytes.check_invariants().is_err());
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
