//! The state of a whole database at one commit: the collections by name.
//!
//! A `DbState` is a value like [`CollectionState`]: cloning is O(1), the writer
//! mutates only its private working copy, and a published `DbState` never
//! changes again, so holding one is holding a consistent snapshot.

use std::collections::BTreeMap;
use std::sync::Arc;

use crate::store::collection::CollectionState;
use crate::store::vls::VlsOptions;

/// The state of a whole database at one commit.
#[derive(Debug, Clone, Default)]
pub struct DbState {
    /// The database name (collections' namespaces are `db.collection`).
    pub db: Arc<str>,
    /// Commit sequence number of the last command applied.
    pub csn: u64,
    /// Cluster time of the last group applied (0: none known). Change
    /// streams and `atClusterTime` name states by it (`durability::changes`).
    pub ts: u64,
    pub collections: Arc<BTreeMap<String, CollectionState>>,
    /// Options new collections' VLS bookkeeping is created with.
    pub vls_options: VlsOptions,
    /// Delta indexing (`store::delta`, `write::delta`): the writer's
    /// working collections record secondary-index changes in delta layers.
    pub delta: DeltaOptions,
}

/// Delta indexing's settings for one database.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DeltaOptions {
    /// Writes go to delta layers (eligible indexes only).
    pub on: bool,
    /// The writer cuts an index's active layer for the merger once it holds
    /// this many entries (and no merge of that index is under way): larger
    /// batches amortise more path copies, smaller ones keep reads' merge of
    /// the layers short.
    pub merge_at: usize,
    /// Back-pressure: an active layer this large while the previous cut is
    /// still being merged makes the writer fold that cut itself, so no
    /// index ever holds more than about `2 × max_active` unmerged entries.
    pub max_active: usize,
}

impl Default for DeltaOptions {
    fn default() -> Self {
        DeltaOptions {
            on: false,
            merge_at: 1024,
            max_active: 64 * 1024,
        }
    }
}

impl DbState {
    pub fn collection(&self, name: &str) -> Option<&CollectionState> {
        self.collections.get(name)
    }

    /// The working version of `name` (copied on first write in a group),
    /// writing its indexes as this state's delta setting says.
    pub fn collection_mut(&mut self, name: &str) -> Option<&mut CollectionState> {
        let delta = self.delta.on;
        let c = Arc::make_mut(&mut self.collections).get_mut(name)?;
        c.delta_indexing = delta;
        Some(c)
    }

    /// This state with collection `name`'s indexes in their stale view
    /// (merged roots only, `store::delta`); O(1) plus one collection map
    /// copy when it has layers, else a plain clone.
    pub fn stale_for(&self, name: &str) -> DbState {
        let mut s = self.clone();
        if let Some(c) = self.collection(name).filter(|c| c.has_index_deltas()) {
            let stale = c.stale();
            Arc::make_mut(&mut s.collections).insert(name.to_string(), stale);
        }
        s
    }

    /// Does any index of any collection have delta layers?
    pub fn has_index_deltas(&self) -> bool {
        self.collections
            .values()
            .any(CollectionState::has_index_deltas)
    }

    /// This state with every index's delta layers folded in (the same
    /// fresh views; what checkpoints write). O(1) when there are none.
    pub fn with_deltas_folded(&self) -> DbState {
        let mut s = self.clone();
        if self.has_index_deltas() {
            let colls = Arc::make_mut(&mut s.collections);
            for c in colls.values_mut() {
                if c.has_index_deltas() {
                    *c = c.with_deltas_folded();
                }
            }
        }
        s
    }
}
