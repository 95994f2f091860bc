//! PLACEHOLDER: replaced by the persistent radix-tree record heap.

use std::collections::BTreeMap;
use std::sync::Arc;

/// Stable identity of a record slot in one collection's heap.
pub type RecordId = u64;

/// Shape figures of one heap.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct HeapStats {
    pub nodes: usize,
    pub depth: usize,
}

/// Persistent map `RecordId -> T`: `clone` is O(1), writes copy shared pages only.
#[derive(Debug, Clone)]
pub struct Heap<T> {
    map: Arc<BTreeMap<RecordId, T>>,
}

impl<T: Clone> Default for Heap<T> {
    fn default() -> Self {
        Self::new()
    }
}

impl<T: Clone> Heap<T> {
    pub fn new() -> Self {
        Heap {
            map: Arc::new(BTreeMap::new()),
        }
    }
    pub fn len(&self) -> usize {
        self.map.len()
    }
    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }
    pub fn get(&self, id: RecordId) -> Option<&T> {
        self.map.get(&id)
    }
    pub fn insert(&mut self, id: RecordId, value: T) -> Option<T> {
        Arc::make_mut(&mut self.map).insert(id, value)
    }
    pub fn remove(&mut self, id: RecordId) -> Option<T> {
        Arc::make_mut(&mut self.map).remove(&id)
    }
    /// Records in ascending id order starting at `start`.
    pub fn iter_from(&self, start: RecordId) -> impl Iterator<Item = (RecordId, &T)> + '_ {
        self.map.range(start..).map(|(k, v)| (*k, v))
    }
    pub fn iter(&self) -> impl Iterator<Item = (RecordId, &T)> + '_ {
        self.iter_from(0)
    }
    pub fn stats(&self) -> HeapStats {
        HeapStats { nodes: 1, depth: 1 }
    }
}
