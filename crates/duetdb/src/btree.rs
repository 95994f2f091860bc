//! PLACEHOLDER: replaced by the persistent copy-on-write B+tree.

use std::collections::BTreeMap;
use std::ops::Bound;
use std::sync::Arc;

/// Default number of children per inner node (entries per leaf).
pub const DEFAULT_FANOUT: usize = 32;

/// Shape figures of one tree.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TreeStats {
    pub nodes: usize,
    pub depth: usize,
}

/// A persistent ordered map: `clone` is O(1); writes copy only the nodes still
/// shared with other clones.
#[derive(Debug, Clone)]
pub struct BTree<K, V> {
    map: Arc<BTreeMap<K, V>>,
}

impl<K: Ord + Clone, V: Clone> Default for BTree<K, V> {
    fn default() -> Self {
        Self::new()
    }
}

impl<K: Ord + Clone, V: Clone> BTree<K, V> {
    pub fn new() -> Self {
        BTree {
            map: Arc::new(BTreeMap::new()),
        }
    }
    pub fn with_fanout(_fanout: usize) -> Self {
        Self::new()
    }
    pub fn len(&self) -> usize {
        self.map.len()
    }
    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }
    pub fn get(&self, key: &K) -> Option<&V> {
        self.map.get(key)
    }
    pub fn insert(&mut self, key: K, value: V) -> Option<V> {
        Arc::make_mut(&mut self.map).insert(key, value)
    }
    pub fn remove(&mut self, key: &K) -> Option<V> {
        Arc::make_mut(&mut self.map).remove(key)
    }
    /// Entries with `lower <= key <= upper` (per the bounds), ascending; `.rev()` for descending.
    pub fn range<'a>(
        &'a self,
        lower: Bound<&K>,
        upper: Bound<&K>,
    ) -> impl DoubleEndedIterator<Item = (&'a K, &'a V)> + 'a {
        self.map.range::<K, _>((lower, upper))
    }
    pub fn iter(&self) -> impl DoubleEndedIterator<Item = (&K, &V)> + '_ {
        self.map.iter()
    }
    pub fn stats(&self) -> TreeStats {
        TreeStats { nodes: 1, depth: 1 }
    }
}
