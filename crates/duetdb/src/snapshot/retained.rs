//! What a held snapshot costs: the heap and index nodes and the documents it
//! retains that the latest version no longer reaches.
//!
//! Shared nodes are immutable, so a node reachable from the latest version is
//! shared together with its whole subtree and the walk skips it; documents are
//! compared by allocation (`Arc` identity), never by bytes.

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;

use crate::store::index::{IndexKey, ValueKey};
use crate::store::DbState;

/// What one collection of a snapshot retains beyond the latest version.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CollectionCost {
    pub heap_nodes: u64,
    pub index_nodes: u64,
    /// Bytes of those nodes (node, `Arc` header, vectors, out-of-line key bytes).
    pub node_bytes: u64,
    /// Documents no longer reachable from the latest version.
    pub docs: u64,
    pub doc_bytes: u64,
}

impl CollectionCost {
    pub fn nodes(&self) -> u64 {
        self.heap_nodes + self.index_nodes
    }

    pub fn bytes(&self) -> u64 {
        self.node_bytes + self.doc_bytes
    }

    fn add(&mut self, o: &CollectionCost) {
        self.heap_nodes += o.heap_nodes;
        self.index_nodes += o.index_nodes;
        self.node_bytes += o.node_bytes;
        self.docs += o.docs;
        self.doc_bytes += o.doc_bytes;
    }
}

/// What a held snapshot keeps alive only because of it, compared with the
/// latest published version: its space amplification. Several snapshots that
/// share old nodes each count them, so costs of different snapshots do not add
/// up to the memory they hold together.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RetainedCost {
    /// Heap plus index nodes.
    pub nodes: u64,
    /// Node bytes plus document bytes.
    pub bytes: u64,
    pub docs: u64,
    pub heap_nodes: u64,
    pub index_nodes: u64,
    pub node_bytes: u64,
    pub doc_bytes: u64,
    pub snapshot_csn: u64,
    pub latest_csn: u64,
    /// Per collection of the snapshot (all present, zero when nothing retained).
    pub by_collection: BTreeMap<String, CollectionCost>,
}

/// Nodes, documents and bytes the state `snap` retains that `latest` does not
/// reach. O(nodes of both versions + documents in pages either one copied):
/// an explicit accounting call, never on a read or write path.
///
/// A node reachable from `latest` is shared together with its whole subtree
/// (shared nodes are immutable), so the walk skips shared subtrees; a
/// document counts as retained when no page of `latest` points at the same
/// allocation (`Arc` identity, never a byte comparison).
pub fn retained_between(snap: &Arc<DbState>, latest: &Arc<DbState>) -> RetainedCost {
    let mut cost = RetainedCost {
        snapshot_csn: snap.csn,
        latest_csn: latest.csn,
        ..RetainedCost::default()
    };
    let zero = |cost: &mut RetainedCost| {
        for name in snap.collections.keys() {
            cost.by_collection
                .insert(name.clone(), CollectionCost::default());
        }
    };
    if Arc::ptr_eq(snap, latest) || Arc::ptr_eq(&snap.collections, &latest.collections) {
        zero(&mut cost);
        return cost;
    }
    // Heap pages of the snapshot: documents in latest pages the snapshot also
    // holds are shared by construction and need no pointer set.
    let mut snap_pages = HashSet::new();
    for c in snap.collections.values() {
        c.heap.node_addrs_into(&mut snap_pages);
    }
    let mut latest_nodes = HashSet::new();
    let mut latest_docs = HashSet::new();
    for c in latest.collections.values() {
        c.heap.node_addrs_into(&mut latest_nodes);
        c.id_index.node_addrs_into(&mut latest_nodes);
        for i in &c.indexes {
            i.tree.node_addrs_into(&mut latest_nodes);
            // Delta indexing's layers are nodes of the version too.
            for l in i.frozen.iter().map(|f| &**f).chain([&i.active]) {
                l.map().node_addrs_into(&mut latest_nodes);
            }
        }
        c.heap.walk_unknown(&snap_pages, &mut |d| {
            latest_docs.insert(Arc::as_ptr(d) as usize);
        });
    }
    drop(snap_pages);
    let mut total = CollectionCost::default();
    for (name, c) in snap.collections.iter() {
        let mut cc = CollectionCost::default();
        let (docs, doc_bytes) = (&mut cc.docs, &mut cc.doc_bytes);
        let (heap_nodes, heap_bytes) = c.heap.walk_unknown(&latest_nodes, &mut |d| {
            if !latest_docs.contains(&(Arc::as_ptr(d) as usize)) {
                *docs += 1;
                *doc_bytes += d.as_bytes().len() as u64;
            }
        });
        cc.heap_nodes = heap_nodes as u64;
        cc.node_bytes = heap_bytes as u64;
        let (n, b) = c
            .id_index
            .walk_unknown(&latest_nodes, &ValueKey::out_of_line_bytes);
        cc.index_nodes += n as u64;
        cc.node_bytes += b as u64;
        for i in &c.indexes {
            let (n, b) = i
                .tree
                .walk_unknown(&latest_nodes, &|k: &(IndexKey, _)| k.0.out_of_line_bytes());
            cc.index_nodes += n as u64;
            cc.node_bytes += b as u64;
            for l in i.frozen.iter().map(|f| &**f).chain([&i.active]) {
                let (n, b) = l
                    .map()
                    .walk_unknown(&latest_nodes, &|k: &(IndexKey, _)| k.0.out_of_line_bytes());
                cc.index_nodes += n as u64;
                cc.node_bytes += b as u64;
            }
        }
        total.add(&cc);
        cost.by_collection.insert(name.clone(), cc);
    }
    cost.heap_nodes = total.heap_nodes;
    cost.index_nodes = total.index_nodes;
    cost.node_bytes = total.node_bytes;
    cost.docs = total.docs;
    cost.doc_bytes = total.doc_bytes;
    cost.nodes = cost.heap_nodes + cost.index_nodes;
    cost.bytes = cost.node_bytes + cost.doc_bytes;
    cost
}
