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
}

impl DbState {
    pub fn collection(&self, name: &str) -> Option<&CollectionState> {
        self.collections.get(name)
    }

    /// The working version of `name` (copied on first write in a group).
    pub fn collection_mut(&mut self, name: &str) -> Option<&mut CollectionState> {
        Arc::make_mut(&mut self.collections).get_mut(name)
    }
}
