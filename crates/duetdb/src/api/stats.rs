//! Storage figures and validation of one collection, for the server's
//! `collStats`, `$collStats`, `$indexStats`, `dbStats` and `validate`:
//! read-only walks of the latest published version.
//!
//! Contracts:
//! - [`Collection::storage_stats`] is O(heap nodes + index nodes): it walks
//!   every node once to sum its bytes (there is no size kept per node), never
//!   the documents themselves (their bytes are the collection's `data_bytes`);
//! - [`Collection::validate`] is O(documents × indexes): it runs every
//!   structural check the engine knows (`CollectionState::check_invariants`:
//!   the `_id` index and each secondary index hold exactly the records' keys
//!   and `data_bytes` is the sum of the documents; the heap's and each
//!   B+tree's own invariants) on one version and reports what fails instead
//!   of stopping at the first failure of each kind.

use std::collections::HashSet;

use crate::api::*;
use crate::error::{Error, Result};
use crate::store::collection::ID_INDEX_NAME;

/// One index's size: entries and the bytes of its nodes (node, `Arc`
/// header, vectors, out-of-line key bytes).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct IndexSize {
    pub name: String,
    pub entries: u64,
    pub bytes: u64,
}

/// Sizes of one collection at one csn.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StorageStats {
    pub csn: u64,
    pub count: u64,
    /// Bytes of the stored documents (BSON).
    pub data_bytes: u64,
    /// Nodes of the record heap and their bytes (without the documents).
    pub heap_nodes: u64,
    pub heap_bytes: u64,
    /// `_id` first, then the secondary indexes in creation order.
    pub indexes: Vec<IndexSize>,
    /// Old versions kept for the VLS scans in flight on this collection.
    pub remset_entries: u64,
    pub remset_bytes: u64,
    /// VLS scans running now.
    pub scans_active: u64,
}

/// What [`Collection::validate`] found.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Validation {
    pub csn: u64,
    pub records: u64,
    /// Entries per index, `_id` first.
    pub keys_per_index: Vec<(String, u64)>,
    /// Broken invariants; empty when the collection is valid.
    pub errors: Vec<String>,
}

/// Run a structural check that asserts (the B+tree's and heap's own
/// checks panic on a broken invariant) and turn a failure into a message.
fn asserted(what: &str, check: impl FnOnce()) -> Option<String> {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(check))
        .err()
        .map(|p| {
            let msg = p
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_else(|| "invariant violated".into());
            format!("{what}: {msg}")
        })
}

/// [`Collection::storage_stats`] of collection `name` in `state` (the
/// latest version, or a held snapshot's: `SnapshotCollection::storage_stats`).
pub(crate) fn storage_stats_in(state: &crate::store::DbState, name: &str) -> Result<StorageStats> {
    let c = state
        .collection(name)
        .ok_or_else(|| Error::NamespaceNotFound(name.to_string()))?;
    let none = HashSet::new();
    let (heap_nodes, heap_bytes) = c.heap.walk_unknown(&none, &mut |_| {});
    let (_, id_bytes) = c
        .id_index
        .walk_unknown(&none, &crate::store::index::ValueKey::out_of_line_bytes);
    let mut indexes = vec![IndexSize {
        name: ID_INDEX_NAME.to_string(),
        entries: c.id_index.len() as u64,
        bytes: id_bytes as u64,
    }];
    for i in &c.indexes {
        let (_, bytes) = i.tree.walk_unknown(&none, &|k: &(
            crate::store::index::IndexKey,
            crate::store::heap::RecordId,
        )| { k.0.out_of_line_bytes() });
        if i.spec.is_collated_id() {
            // Part of the `_id` index (listed once, as `_id_`).
            indexes[0].bytes += bytes as u64;
            continue;
        }
        indexes.push(IndexSize {
            name: i.spec.name.clone(),
            entries: i.len() as u64,
            bytes: bytes as u64,
        });
    }
    let vls = c.vls.stats();
    Ok(StorageStats {
        csn: state.csn,
        count: c.len() as u64,
        data_bytes: c.data_bytes,
        heap_nodes: heap_nodes as u64,
        heap_bytes: heap_bytes as u64,
        indexes,
        remset_entries: vls.remset.entries,
        remset_bytes: vls.remset.bytes,
        scans_active: vls.scans_active,
    })
}

impl Collection {
    /// Sizes of the collection at the latest commit (see the module doc for
    /// the cost); NamespaceNotFound when it does not exist.
    pub fn storage_stats(&self) -> Result<StorageStats> {
        storage_stats_in(&self.database().writer().published(), self.name())
    }

    /// The VLS figures of this collection alone (scans, remset: the old
    /// versions kept for scans in flight); `None` when it does not exist. O(1).
    pub fn vls_stats(&self) -> Option<crate::store::vls::VlsStats> {
        let state = self.database().writer().published();
        state.collection(self.name()).map(|c| c.vls.stats())
    }

    /// Each index's use since it was built or loaded (`$indexStats`'
    /// `accesses`): `(name, ops, since)`, `_id` first, then the secondary
    /// indexes in creation order; empty when the collection does not exist.
    /// O(indexes).
    pub fn index_usage(&self) -> Vec<(String, u64, std::time::SystemTime)> {
        let state = self.database().writer().published();
        let Some(c) = state.collection(self.name()) else {
            return Vec::new();
        };
        // The collated `_id` index's reads count as the `_id` index's.
        let collated = c.collated_id_index().map_or(0, |i| i.usage.ops());
        std::iter::once((
            ID_INDEX_NAME.to_string(),
            c.id_usage.ops() + collated,
            c.id_usage.since(),
        ))
        .chain(
            c.indexes
                .iter()
                .filter(|i| !i.spec.is_collated_id())
                .map(|i| (i.spec.name.clone(), i.usage.ops(), i.usage.since())),
        )
        .collect()
    }

    /// Walk the latest version of the collection and check every invariant
    /// the engine knows (see the module doc); NamespaceNotFound when it does
    /// not exist. Damage is reported in [`Validation::errors`], never as an
    /// error of the call.
    pub fn validate(&self) -> Result<Validation> {
        let state = self.database().writer().published();
        let c = state
            .collection(self.name())
            .ok_or_else(|| Error::NamespaceNotFound(self.name().to_string()))?;
        let mut errors = Vec::new();
        errors.extend(asserted("record heap", || c.heap.check_invariants()));
        errors.extend(asserted("index _id_ (B+tree)", || {
            c.id_index.check_invariants()
        }));
        for i in &c.indexes {
            let what = format!("index {} (B+tree)", i.spec.name);
            errors.extend(asserted(&what, || i.tree.check_invariants()));
        }
        // The record/index cross-checks walk the trees: only on sound trees.
        if errors.is_empty() {
            match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| c.check_invariants())) {
                Ok(Ok(())) => {}
                Ok(Err(e)) => errors.push(e),
                Err(_) => errors.push("collection invariants: check failed".into()),
            }
        }
        // The collated `_id` index holds one key a record, as the `_id`
        // index (checked by `check_invariants`); listed once.
        let mut keys_per_index = vec![(ID_INDEX_NAME.to_string(), c.id_index.len() as u64)];
        keys_per_index.extend(
            c.indexes
                .iter()
                .filter(|i| !i.spec.is_collated_id())
                .map(|i| (i.spec.name.clone(), i.len() as u64)),
        );
        Ok(Validation {
            csn: state.csn,
            records: c.heap.len() as u64,
            keys_per_index,
            errors,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bson::doc;

    #[test]
    fn storage_stats_count_every_index_and_node() {
        let db = Database::in_memory();
        let c = db.collection("c");
        c.create_index(doc! {"a": 1}, IndexOptions::default())
            .expect("index");
        for i in 0..500 {
            c.insert_one(doc! {"_id": i, "a": format!("value {i}")})
                .expect("insert");
        }
        let s = c.storage_stats().expect("stats");
        assert_eq!(s.count, 500);
        assert_eq!(s.data_bytes, c.stats().expect("stats").data_bytes);
        assert_eq!(s.indexes.len(), 2);
        assert_eq!(s.indexes[0].name, "_id_");
        assert!(s.indexes.iter().all(|i| i.entries == 500 && i.bytes > 0));
        assert!(s.heap_nodes > 1 && s.heap_bytes > 0);
        assert!(db.collection("missing").storage_stats().is_err());
    }

    #[test]
    fn validate_finds_a_sound_collection_valid() {
        let db = Database::in_memory();
        let c = db.collection("c");
        c.create_index(doc! {"a": 1}, IndexOptions::default())
            .expect("index");
        c.insert_many((0..300).map(|i| doc! {"_id": i, "a": i % 7}), true)
            .expect("insert");
        let v = c.validate().expect("validate");
        assert!(v.errors.is_empty(), "{:?}", v.errors);
        assert_eq!(v.records, 300);
        assert_eq!(
            v.keys_per_index,
            vec![("_id_".to_string(), 300), ("a_1".to_string(), 300)]
        );
    }
}
