//! Persistent record heap: a copy-on-write radix tree mapping `RecordId -> T`
//! (`T` is meant to be pointer-sized, e.g. `Arc<Document>`). Cloning is O(1) and
//! yields an immutable snapshot; writes copy only the nodes still shared with
//! another version (`Arc::make_mut`), so a batch copies each shared node once.
//!
//! Each node has 64 slots and a `present` bitmap, so iteration jumps straight to
//! occupied slots. A tree of height `h` covers ids `< 64^h`; leaves are level 1.
//!
//! Invariants (checked by [`Heap::check_invariants`]):
//! - `present` bit `i` is set exactly when slot `i` is `Some`;
//! - no node is empty: a subtree emptied by removals is pruned (its slot set to
//!   `None`), and an empty heap has no root;
//! - the height is the least that covers the largest present id: a root inner
//!   node has a child other than child 0;
//! - a node shared between versions is never modified in place.

use std::collections::HashSet;
use std::fmt;
use std::iter::FusedIterator;
use std::sync::Arc;

/// Stable identity of a record slot in one collection's heap.
pub type RecordId = u64;

/// Shape figures of one heap.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct HeapStats {
    /// Inner nodes plus leaf pages.
    pub nodes: usize,
    /// Levels from root to leaf page; 0 for an empty heap.
    pub depth: usize,
    pub leaves: usize,
    pub records: usize,
}

const BITS: u32 = 6;
const SLOTS: usize = 1 << BITS;
/// Levels needed for any `u64` id: ceil(64 / 6).
const MAX_HEIGHT: u32 = 64_u32.div_ceil(BITS);

// For pointer-sized `T` (the intended use) both variants are 520 bytes; boxing
// either would add a pointer chase per node on the scan path.
#[allow(clippy::large_enum_variant)]
#[derive(Clone)]
enum Node<T> {
    Leaf(Page<T>),
    Inner(Inner<T>),
}

#[derive(Clone)]
struct Page<T> {
    present: u64,
    slots: [Option<T>; SLOTS],
}

#[derive(Clone)]
struct Inner<T> {
    present: u64,
    children: [Option<Arc<Node<T>>>; SLOTS],
}

impl<T> Node<T> {
    fn empty(level: u32) -> Self {
        if level == 1 {
            Node::Leaf(Page {
                present: 0,
                slots: std::array::from_fn(|_| None),
            })
        } else {
            Node::Inner(Inner {
                present: 0,
                children: std::array::from_fn(|_| None),
            })
        }
    }
}

fn shift(level: u32) -> u32 {
    BITS * (level - 1)
}

/// Slot of `id` in the node at `level`.
fn digit(id: RecordId, level: u32) -> usize {
    ((id >> shift(level)) as usize) & (SLOTS - 1)
}

/// Least height whose tree covers `id`.
fn height_for(id: RecordId) -> u32 {
    let mut height = 1;
    while height < MAX_HEIGHT && id >> (BITS * height) != 0 {
        height += 1;
    }
    height
}

/// Persistent map `RecordId -> T`: `clone` is O(1), writes copy shared pages only.
pub struct Heap<T> {
    root: Option<Arc<Node<T>>>,
    /// 0 exactly when `root` is `None`.
    height: u32,
    len: usize,
}

impl<T> Clone for Heap<T> {
    fn clone(&self) -> Self {
        Heap {
            root: self.root.clone(),
            height: self.height,
            len: self.len,
        }
    }
}

impl<T: Clone> Default for Heap<T> {
    fn default() -> Self {
        Self::new()
    }
}

impl<T: Clone + fmt::Debug> fmt::Debug for Heap<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_map().entries(self.iter()).finish()
    }
}

impl<T: Clone> Heap<T> {
    pub fn new() -> Self {
        Heap {
            root: None,
            height: 0,
            len: 0,
        }
    }

    pub fn len(&self) -> usize {
        self.len
    }

    /// True when both are the same version (one root node, or both empty): no
    /// record changed between them. O(1). Sound because each heap keeps its own
    /// root alive, so a changed heap can never reuse the old root's address.
    pub fn same_root(&self, other: &Self) -> bool {
        match (&self.root, &other.root) {
            (Some(a), Some(b)) => Arc::ptr_eq(a, b),
            (None, None) => true,
            _ => false,
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn get(&self, id: RecordId) -> Option<&T> {
        if height_for(id) > self.height {
            return None;
        }
        let mut node = self.root.as_deref()?;
        let mut level = self.height;
        loop {
            match node {
                Node::Inner(inner) => {
                    node = inner.children[digit(id, level)].as_deref()?;
                    level -= 1;
                }
                Node::Leaf(page) => return page.slots[digit(id, 1)].as_ref(),
            }
        }
    }

    pub fn insert(&mut self, id: RecordId, value: T) -> Option<T> {
        let need = height_for(id);
        match self.root.take() {
            None => self.height = need,
            Some(mut root) => {
                // Grow upward: the old tree becomes child 0 of each new root.
                while self.height < need {
                    let mut parent = Node::empty(self.height + 1);
                    if let Node::Inner(inner) = &mut parent {
                        inner.present = 1;
                        inner.children[0] = Some(root);
                    }
                    root = Arc::new(parent);
                    self.height += 1;
                }
                self.root = Some(root);
            }
        }
        let height = self.height;
        let root = self
            .root
            .get_or_insert_with(|| Arc::new(Node::empty(height)));
        let old = insert_rec(root, height, id, value);
        if old.is_none() {
            self.len += 1;
        }
        old
    }

    pub fn remove(&mut self, id: RecordId) -> Option<T> {
        // Look first so that removing a missing id copies no shared path.
        self.get(id)?;
        let root = self
            .root
            .as_mut()
            .expect("the id was found, so a root exists");
        let (old, emptied) = remove_rec(root, self.height, id);
        debug_assert!(old.is_some(), "the id was found before removal");
        if old.is_some() {
            self.len -= 1;
        }
        if emptied {
            self.root = None;
            self.height = 0;
        }
        // Shrink while only child 0 is left, keeping the height minimal so
        // lookups and the height check in `get` stay tight.
        while self.height > 1 {
            let only_child = match self.root.as_deref() {
                Some(Node::Inner(inner)) if inner.present == 1 => inner.children[0].clone(),
                _ => break,
            };
            self.root = only_child;
            self.height -= 1;
        }
        old
    }

    /// Records in ascending id order starting at `start`. Starting costs one
    /// root-to-leaf descent; empty subtrees are skipped via the bitmaps.
    pub fn iter_from(&self, start: RecordId) -> Iter<'_, T> {
        let mut iter = Iter {
            stack: Vec::new(),
            slots: &[],
            mask: 0,
            base: 0,
        };
        let Some(mut node) = self.root.as_deref() else {
            return iter;
        };
        if height_for(start) > self.height {
            return iter;
        }
        iter.stack.reserve(self.height as usize);
        let mut level = self.height;
        let mut base = 0;
        loop {
            let d = digit(start, level);
            match node {
                Node::Leaf(page) => {
                    iter.slots = &page.slots;
                    iter.mask = page.present & (!0u64 << d);
                    iter.base = base;
                    return iter;
                }
                Node::Inner(inner) => {
                    // Children after `d` are visited whole once the one holding
                    // `start` (if any) is done. Two shifts: `<< 64` would overflow.
                    iter.stack.push(Frame {
                        node: inner,
                        mask: inner.present & ((!0u64 << d) << 1),
                        base,
                        level,
                    });
                    match inner.children[d].as_deref() {
                        Some(child) => {
                            base |= (d as u64) << shift(level);
                            node = child;
                            level -= 1;
                        }
                        None => return iter,
                    }
                }
            }
        }
    }

    pub fn iter(&self) -> Iter<'_, T> {
        self.iter_from(0)
    }

    pub fn stats(&self) -> HeapStats {
        let mut stats = HeapStats {
            depth: self.height as usize,
            ..HeapStats::default()
        };
        if let Some(root) = self.root.as_deref() {
            visit_nodes(root, &mut |node| {
                stats.nodes += 1;
                if let Node::Leaf(page) = node {
                    stats.leaves += 1;
                    stats.records += page.present.count_ones() as usize;
                }
            });
        }
        stats
    }

    /// Every record that differs between `self` (an older version) and
    /// `newer`, in ascending id order: `f(id, old, new)` with `None` for a
    /// side that lacks it; values for which `same` holds are not reported.
    /// Subtrees both versions share (one allocation) are skipped, so after
    /// `k` writes between them the cost is O(k * depth * 64), not O(len):
    /// what an index build catching up with the writes since its snapshot
    /// needs. Versions that share nothing (unrelated heaps) are still
    /// compared correctly, at the cost of a full walk.
    pub fn diff<'a>(
        &'a self,
        newer: &'a Self,
        same: &impl Fn(&T, &T) -> bool,
        f: &mut impl FnMut(RecordId, Option<&'a T>, Option<&'a T>),
    ) {
        let level = self.height.max(newer.height);
        if level == 0 {
            return;
        }
        diff_rec(
            Side::of(self.root.as_ref(), self.height),
            Side::of(newer.root.as_ref(), newer.height),
            level,
            0,
            same,
            f,
        );
    }

    /// Nodes of `self` that are physically the same allocation as a node of
    /// `other`: after `k` writes on a clone, all but O(k * depth) are shared.
    pub fn shared_nodes_with(&self, other: &Self) -> usize {
        let mut theirs = HashSet::new();
        if let Some(root) = other.root.as_deref() {
            visit_nodes(root, &mut |node| {
                theirs.insert(node as *const Node<T>);
            });
        }
        let mut shared = 0;
        if let Some(root) = self.root.as_deref() {
            visit_nodes(root, &mut |node| {
                if theirs.contains(&(node as *const Node<T>)) {
                    shared += 1;
                }
            });
        }
        shared
    }

    /// Panics if a structural invariant (see the module doc) is broken. O(n):
    /// for tests and debug checks only.
    #[doc(hidden)]
    pub fn check_invariants(&self) {
        let Some(root) = self.root.as_deref() else {
            assert_eq!(self.height, 0, "an empty heap has height 0");
            assert_eq!(self.len, 0, "a heap without root must be empty");
            return;
        };
        assert!((1..=MAX_HEIGHT).contains(&self.height));
        if let Node::Inner(inner) = root {
            assert!(
                inner.present & !1 != 0,
                "height above what the largest id needs"
            );
        }
        assert_eq!(
            check_node(root, self.height),
            self.len,
            "len disagrees with the slots"
        );
    }
}

fn insert_rec<T: Clone>(node: &mut Arc<Node<T>>, level: u32, id: RecordId, value: T) -> Option<T> {
    let d = digit(id, level);
    match Arc::make_mut(node) {
        Node::Leaf(page) => {
            page.present |= 1 << d;
            page.slots[d].replace(value)
        }
        Node::Inner(inner) => {
            inner.present |= 1 << d;
            let child = inner.children[d].get_or_insert_with(|| Arc::new(Node::empty(level - 1)));
            insert_rec(child, level - 1, id, value)
        }
    }
}

/// Requires: `id` is present under `node` (else the path was copied for nothing).
/// Returns the removed value and whether `node` is now empty (to be pruned).
fn remove_rec<T: Clone>(node: &mut Arc<Node<T>>, level: u32, id: RecordId) -> (Option<T>, bool) {
    let d = digit(id, level);
    match Arc::make_mut(node) {
        Node::Leaf(page) => {
            page.present &= !(1 << d);
            (page.slots[d].take(), page.present == 0)
        }
        Node::Inner(inner) => {
            let Some(child) = inner.children[d].as_mut() else {
                return (None, inner.present == 0);
            };
            let (old, emptied) = remove_rec(child, level - 1, id);
            if emptied {
                inner.children[d] = None;
                inner.present &= !(1 << d);
            }
            (old, inner.present == 0)
        }
    }
}

/// One heap's view of a subtree in [`Heap::diff`]: a real node at its own
/// level, or (for the shorter heap) its whole root seen from a higher
/// level, where it is child 0 of virtual nodes as growth would place it.
struct Side<'a, T> {
    node: Option<&'a Arc<Node<T>>>,
    /// The level `node` lives at (at most the level being compared).
    height: u32,
}

impl<T> Clone for Side<'_, T> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<T> Copy for Side<'_, T> {}

impl<'a, T> Side<'a, T> {
    fn of(node: Option<&'a Arc<Node<T>>>, height: u32) -> Self {
        Side { node, height }
    }

    /// Slots occupied at `level`.
    fn present(&self, level: u32) -> u64 {
        match self.node {
            None => 0,
            Some(_) if self.height < level => 1,
            Some(n) => match &**n {
                Node::Inner(inner) => inner.present,
                Node::Leaf(page) => page.present,
            },
        }
    }

    /// Child `i` seen from `level` (> 1).
    fn child(&self, level: u32, i: usize) -> Side<'a, T> {
        let none = Side::of(None, level - 1);
        match self.node {
            None => none,
            Some(_) if self.height < level => {
                if i == 0 {
                    *self
                } else {
                    none
                }
            }
            Some(n) => match &**n {
                Node::Inner(inner) => Side::of(inner.children[i].as_ref(), level - 1),
                Node::Leaf(_) => none,
            },
        }
    }
}

fn diff_rec<'a, T>(
    a: Side<'a, T>,
    b: Side<'a, T>,
    level: u32,
    base: RecordId,
    same: &impl Fn(&T, &T) -> bool,
    f: &mut impl FnMut(RecordId, Option<&'a T>, Option<&'a T>),
) {
    if let (Some(x), Some(y)) = (a.node, b.node) {
        if a.height == b.height && Arc::ptr_eq(x, y) {
            return;
        }
    }
    let mut mask = a.present(level) | b.present(level);
    if level == 1 {
        let slots = |s: &Side<'a, T>| match s.node.map(|n| &**n) {
            Some(Node::Leaf(page)) => Some(&page.slots),
            _ => None,
        };
        let (sa, sb) = (slots(&a), slots(&b));
        while mask != 0 {
            let i = mask.trailing_zeros() as usize;
            mask &= mask - 1;
            let old = sa.and_then(|s| s[i].as_ref());
            let new = sb.and_then(|s| s[i].as_ref());
            let unchanged = match (old, new) {
                (Some(x), Some(y)) => same(x, y),
                _ => false,
            };
            if !unchanged {
                f(base | i as RecordId, old, new);
            }
        }
        return;
    }
    while mask != 0 {
        let i = mask.trailing_zeros() as usize;
        mask &= mask - 1;
        diff_rec(
            a.child(level, i),
            b.child(level, i),
            level - 1,
            base | ((i as RecordId) << shift(level)),
            same,
            f,
        );
    }
}

fn visit_nodes<T>(node: &Node<T>, f: &mut impl FnMut(&Node<T>)) {
    f(node);
    if let Node::Inner(inner) = node {
        for child in inner.children.iter().flatten() {
            visit_nodes(child, f);
        }
    }
}

/// Checks the subtree at `level`; returns its record count.
fn check_node<T>(node: &Node<T>, level: u32) -> usize {
    match node {
        Node::Leaf(page) => {
            assert_eq!(level, 1, "a leaf page above level 1");
            for (i, slot) in page.slots.iter().enumerate() {
                assert_eq!(
                    page.present >> i & 1 == 1,
                    slot.is_some(),
                    "bitmap disagrees"
                );
            }
            assert!(page.present != 0, "an empty page was not pruned");
            page.present.count_ones() as usize
        }
        Node::Inner(inner) => {
            assert!(level > 1, "an inner node at leaf level");
            assert!(inner.present != 0, "an empty inner node was not pruned");
            let mut records = 0;
            for (i, child) in inner.children.iter().enumerate() {
                assert_eq!(
                    inner.present >> i & 1 == 1,
                    child.is_some(),
                    "bitmap disagrees"
                );
                if let Some(child) = child {
                    records += check_node(child, level - 1);
                }
            }
            records
        }
    }
}

/// The values of one leaf page in id order, with their offsets in the page
/// (see [`Heap::for_each_page`]).
pub struct PageSlots<'a, T> {
    slots: &'a [Option<T>],
    mask: u64,
}

impl<'a, T> PageSlots<'a, T> {
    /// Bit `i` is set when the page holds id `base + i`.
    pub fn present(&self) -> u64 {
        self.mask
    }
}

impl<'a, T> Iterator for PageSlots<'a, T> {
    type Item = (u32, &'a T);

    fn next(&mut self) -> Option<Self::Item> {
        while self.mask != 0 {
            let i = self.mask.trailing_zeros();
            self.mask &= self.mask - 1;
            if let Some(v) = self.slots.get(i as usize).and_then(Option::as_ref) {
                return Some((i, v));
            }
        }
        None
    }
}

/// One inner node on the iterator's path, with the children still to visit.
struct Frame<'a, T> {
    node: &'a Inner<T>,
    mask: u64,
    base: RecordId,
    level: u32,
}

/// Ascending iterator over a [`Heap`]; holds an explicit path, no recursion.
pub struct Iter<'a, T> {
    stack: Vec<Frame<'a, T>>,
    /// Current leaf page (empty before the first and after the last).
    slots: &'a [Option<T>],
    /// Slots of the current page still to yield.
    mask: u64,
    base: RecordId,
}

impl<'a, T> Iterator for Iter<'a, T> {
    type Item = (RecordId, &'a T);

    #[inline]
    fn next(&mut self) -> Option<Self::Item> {
        loop {
            if self.mask != 0 {
                let i = self.mask.trailing_zeros() as usize;
                self.mask &= self.mask - 1;
                if let Some(value) = self.slots.get(i).and_then(Option::as_ref) {
                    return Some((self.base | i as u64, value));
                }
                debug_assert!(false, "present bit {i} set on an empty slot");
                continue;
            }
            let top = self.stack.last_mut()?;
            if top.mask == 0 {
                self.stack.pop();
                continue;
            }
            let i = top.mask.trailing_zeros() as usize;
            top.mask &= top.mask - 1;
            let node: &'a Inner<T> = top.node;
            let level = top.level;
            let base = top.base | ((i as u64) << shift(level));
            match node.children[i].as_deref() {
                Some(Node::Leaf(page)) => {
                    self.slots = &page.slots;
                    self.mask = page.present;
                    self.base = base;
                }
                Some(Node::Inner(inner)) => self.stack.push(Frame {
                    node: inner,
                    mask: inner.present,
                    base,
                    level: level - 1,
                }),
                None => debug_assert!(false, "present bit {i} set on an empty child"),
            }
        }
    }
}

impl<T> FusedIterator for Iter<'_, T> {}

/// Cross-version accounting for the snapshot registry (`crate::snapshot`): node
/// identities, the nodes one version holds that another does not, and weak
/// probes that show when nodes are freed. All O(nodes); never on a hot path.
impl<T: Clone> Heap<T> {
    /// Adds the address of every node of this version to `out`. Addresses are
    /// identities only, valid while the version is held.
    pub fn node_addrs_into(&self, out: &mut HashSet<usize>) {
        if let Some(root) = self.root.as_deref() {
            visit_nodes(root, &mut |node| {
                out.insert(node as *const Node<T> as usize);
            });
        }
    }

    /// Walks the nodes of this version whose address is not in `known` and
    /// calls `value` for every slot of such leaf pages. A known node's subtree
    /// is skipped whole: nodes are immutable once shared, so everything below a
    /// node another version reaches is reached by it too. Returns the unknown
    /// nodes and their bytes (node allocation plus the `Arc` header).
    pub fn walk_unknown(
        &self,
        known: &HashSet<usize>,
        value: &mut impl FnMut(&T),
    ) -> (usize, usize) {
        fn walk<T>(
            node: &Node<T>,
            known: &HashSet<usize>,
            value: &mut impl FnMut(&T),
            count: &mut usize,
        ) {
            if known.contains(&(node as *const Node<T> as usize)) {
                return;
            }
            *count += 1;
            match node {
                Node::Leaf(page) => page.slots.iter().flatten().for_each(&mut *value),
                Node::Inner(inner) => {
                    for child in inner.children.iter().flatten() {
                        walk(child, known, value, count);
                    }
                }
            }
        }
        let mut count = 0;
        if let Some(root) = self.root.as_deref() {
            walk(root, known, value, &mut count);
        }
        let per_node = std::mem::size_of::<Node<T>>() + 2 * std::mem::size_of::<usize>();
        (count, count * per_node)
    }

    /// Calls `f` for every leaf page in id order with its address (an
    /// identity, valid while this version is held), its first id and its
    /// values in id order. A page at the same address in two held versions
    /// is the same page with the same values (pages are immutable once
    /// shared): incremental checkpoints reuse what they wrote for it.
    pub fn for_each_page(&self, f: &mut impl FnMut(usize, RecordId, PageSlots<'_, T>)) {
        fn walk<T>(
            node: &Node<T>,
            level: u32,
            base: RecordId,
            f: &mut impl FnMut(usize, RecordId, PageSlots<'_, T>),
        ) {
            match node {
                Node::Leaf(page) => f(
                    node as *const Node<T> as usize,
                    base,
                    PageSlots {
                        slots: &page.slots,
                        mask: page.present,
                    },
                ),
                Node::Inner(inner) => {
                    let mut mask = inner.present;
                    while mask != 0 {
                        let i = mask.trailing_zeros() as usize;
                        mask &= mask - 1;
                        if let Some(child) = inner.children[i].as_deref() {
                            walk(child, level - 1, base | ((i as u64) << shift(level)), f);
                        }
                    }
                }
            }
        }
        if let Some(root) = self.root.as_deref() {
            walk(root, self.height, 0, f);
        }
    }

    /// A weak reference to every node: a probe is dead once no version holds
    /// that node any more (leak tests: released snapshots free their pages).
    pub fn node_probes(&self) -> Vec<std::sync::Weak<dyn std::any::Any>>
    where
        T: 'static,
    {
        fn walk<T: 'static>(
            node: &Arc<Node<T>>,
            out: &mut Vec<std::sync::Weak<dyn std::any::Any>>,
        ) {
            let any: Arc<dyn std::any::Any> = node.clone();
            out.push(Arc::downgrade(&any));
            if let Node::Inner(inner) = &**node {
                for child in inner.children.iter().flatten() {
                    walk(child, out);
                }
            }
        }
        let mut out = Vec::new();
        if let Some(root) = &self.root {
            walk(root, &mut out);
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use rand::rngs::StdRng;
    use rand::{Rng, SeedableRng};
    use std::collections::BTreeMap;
    use std::sync::Weak;

    impl<T> Heap<T> {
        fn weak_nodes(&self) -> Vec<Weak<Node<T>>> {
            fn walk<T>(node: &Arc<Node<T>>, out: &mut Vec<Weak<Node<T>>>) {
                out.push(Arc::downgrade(node));
                if let Node::Inner(inner) = &**node {
                    for child in inner.children.iter().flatten() {
                        walk(child, out);
                    }
                }
            }
            let mut out = Vec::new();
            if let Some(root) = &self.root {
                walk(root, &mut out);
            }
            out
        }
    }

    fn assert_same(heap: &Heap<u32>, model: &BTreeMap<u64, u32>) {
        assert_eq!(heap.len(), model.len());
        assert!(heap.iter().eq(model.iter().map(|(k, v)| (*k, v))));
    }

    #[derive(Debug, Clone)]
    enum Op {
        Insert(u64, u32),
        Remove(u64),
        IterFrom(u64),
        Snapshot,
    }

    fn id() -> impl Strategy<Value = u64> {
        prop_oneof![
            4 => 0u64..300,
            2 => 0u64..20_000,
            1 => any::<u64>(),
            1 => (0u32..64).prop_map(|b| 1u64 << b),
        ]
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            6 => (id(), any::<u32>()).prop_map(|(k, v)| Op::Insert(k, v)),
            4 => id().prop_map(Op::Remove),
            2 => id().prop_map(Op::IterFrom),
            1 => Just(Op::Snapshot),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]

        #[test]
        fn heap_matches_model(ops in prop::collection::vec(op(), 1..300)) {
            let mut heap = Heap::new();
            let mut model = BTreeMap::new();
            let mut snapshots = Vec::new();
            for op in ops {
                match op {
                    Op::Insert(id, v) => prop_assert_eq!(heap.insert(id, v), model.insert(id, v)),
                    Op::Remove(id) => prop_assert_eq!(heap.remove(id), model.remove(&id)),
                    Op::IterFrom(start) => {
                        let got: Vec<_> = heap.iter_from(start).collect();
                        let want: Vec<_> = model.range(start..).map(|(k, v)| (*k, v)).collect();
                        prop_assert_eq!(got, want);
                    }
                    Op::Snapshot => snapshots.push((heap.clone(), model.clone())),
                }
                heap.check_invariants();
                prop_assert_eq!(heap.len(), model.len());
            }
            for (id, v) in &model {
                prop_assert_eq!(heap.get(*id), Some(v));
            }
            assert_same(&heap, &model);
            for (snapshot, frozen) in &snapshots {
                snapshot.check_invariants();
                assert_same(snapshot, frozen);
            }
        }
    }

    #[test]
    fn heap_persistence_under_random_writes() {
        let mut rng = StdRng::seed_from_u64(11);
        let mut heap = Heap::new();
        let mut model = BTreeMap::new();
        let mut held = Vec::new();
        let mut next_id = 0u64;
        for step in 0..20_000u32 {
            // Mostly appends of fresh ids, as the store allocates them.
            if rng.gen_bool(0.5) || model.is_empty() {
                heap.insert(next_id, step);
                model.insert(next_id, step);
                next_id += 1;
            } else {
                let id = rng.gen_range(0..next_id);
                if rng.gen_bool(0.5) {
                    assert_eq!(heap.remove(id), model.remove(&id));
                } else if model.contains_key(&id) {
                    heap.insert(id, step);
                    model.insert(id, step);
                }
            }
            if rng.gen_ratio(1, 1000) {
                held.push((heap.clone(), model.clone()));
            }
        }
        heap.check_invariants();
        assert_same(&heap, &model);
        for (snapshot, frozen) in &held {
            snapshot.check_invariants();
            assert_same(snapshot, frozen);
        }
    }

    #[test]
    fn heap_writes_on_clone_copy_only_their_paths() {
        let mut base = Heap::new();
        for id in 0..100_000u64 {
            base.insert(id, id as u32);
        }
        let stats = base.stats();
        assert_eq!(stats.depth, 3);
        assert_eq!(stats.records, 100_000);

        let mut work = base.clone();
        assert_eq!(work.shared_nodes_with(&base), stats.nodes);
        work.insert(5, 0);
        assert_eq!(stats.nodes - work.shared_nodes_with(&base), stats.depth);
        work.remove(6);
        assert_eq!(stats.nodes - work.shared_nodes_with(&base), stats.depth);
        assert_eq!(work.remove(100_001), None);
        assert_eq!(stats.nodes - work.shared_nodes_with(&base), stats.depth);

        let mut rng = StdRng::seed_from_u64(3);
        let mut work = base.clone();
        let k = 40;
        for _ in 0..k {
            let id = rng.gen_range(0..100_000u64);
            if rng.gen_bool(0.5) {
                work.insert(id, 0);
            } else {
                work.remove(id);
            }
        }
        let new = work.stats().nodes - work.shared_nodes_with(&base);
        assert!(new <= k * stats.depth, "{new} new nodes after {k} writes");
        assert!(base
            .iter()
            .map(|(id, v)| (id, *v))
            .eq((0..100_000u64).map(|id| (id, id as u32))));
        base.check_invariants();
    }

    #[test]
    fn heap_prunes_empty_subtrees() {
        let mut heap = Heap::new();
        for id in 0..10_000u64 {
            heap.insert(id, id as u32);
        }
        let full = heap.stats();
        let snapshot = heap.clone();
        for id in 0..5_000u64 {
            heap.remove(id);
        }
        heap.check_invariants();
        let mut upper_half = Heap::new();
        for id in 5_000..10_000u64 {
            upper_half.insert(id, id as u32);
        }
        assert_eq!(heap.stats(), upper_half.stats());
        assert!(heap.stats().nodes < full.nodes);

        // Removing the top ids lowers the height again.
        let mut small = Heap::new();
        small.insert(3, 0);
        small.insert(1 << 40, 1);
        assert_eq!(small.stats().depth, height_for(1 << 40) as usize);
        small.remove(1 << 40);
        small.check_invariants();
        assert_eq!(
            small.stats(),
            HeapStats {
                nodes: 1,
                depth: 1,
                leaves: 1,
                records: 1
            }
        );

        for id in 5_000..10_000u64 {
            heap.remove(id);
        }
        assert!(heap.is_empty());
        assert_eq!(heap.stats(), HeapStats::default());
        assert_eq!(heap.iter().next(), None);
        assert_eq!(snapshot.len(), 10_000);
        snapshot.check_invariants();
    }

    #[test]
    fn heap_dropping_all_versions_frees_every_node() {
        let mut heap = Heap::new();
        let mut versions = Vec::new();
        for id in 0..5_000u64 {
            heap.insert(id * 3, id);
            if id % 101 == 0 {
                heap.remove(id);
                versions.push(heap.clone());
            }
        }
        let mut weak = heap.weak_nodes();
        for version in &versions {
            weak.extend(version.weak_nodes());
        }
        drop(versions);
        drop(heap);
        assert!(
            weak.iter().all(|w| w.upgrade().is_none()),
            "a node outlived all versions"
        );
    }

    #[test]
    fn heap_iter_from_edges() {
        let mut heap = Heap::new();
        for id in [0u64, 63, 64, 4095, 4096, u64::MAX] {
            heap.insert(id, id);
        }
        let from = |s: u64| heap.iter_from(s).map(|(id, _)| id).collect::<Vec<_>>();
        assert_eq!(from(0), vec![0, 63, 64, 4095, 4096, u64::MAX]);
        assert_eq!(from(1), vec![63, 64, 4095, 4096, u64::MAX]);
        assert_eq!(from(65), vec![4095, 4096, u64::MAX]);
        assert_eq!(from(4097), vec![u64::MAX]);
        assert_eq!(from(u64::MAX), vec![u64::MAX]);
        assert_eq!(heap.get(u64::MAX), Some(&u64::MAX));
        let small: Heap<u64> = Heap::new();
        assert_eq!(small.iter_from(u64::MAX).next(), None);
    }

    /// `diff` reports exactly the records that differ (by a naive
    /// comparison) between random versions, across growth and shrinkage of
    /// the height and with shared and unshared subtrees.
    #[test]
    fn heap_diff_matches_a_naive_comparison() {
        use proptest::prelude::*;
        use std::collections::BTreeMap;
        let ops = proptest::collection::vec(
            (
                0u8..3,
                prop_oneof![0u64..200, 0u64..300_000, Just(u64::MAX)],
                0u64..4,
            ),
            0..300,
        );
        proptest!(|(before in ops.clone(), after in ops)| {
            let mut heap = Heap::new();
            let apply = |heap: &mut Heap<u64>, ops: &[(u8, u64, u64)]| {
                for &(op, id, v) in ops {
                    if op == 0 { heap.remove(id); } else { heap.insert(id, v); }
                }
            };
            apply(&mut heap, &before);
            let old = heap.clone();
            apply(&mut heap, &after);
            let as_map = |h: &Heap<u64>| h.iter().map(|(k, v)| (k, *v)).collect::<BTreeMap<_, _>>();
            let (a, b) = (as_map(&old), as_map(&heap));
            let mut expected = Vec::new();
            for id in a.keys().chain(b.keys()).collect::<std::collections::BTreeSet<_>>() {
                let (x, y) = (a.get(id).copied(), b.get(id).copied());
                if x != y {
                    expected.push((*id, x, y));
                }
            }
            let mut got = Vec::new();
            old.diff(&heap, &|x, y| x == y, &mut |id, x, y| got.push((id, x.copied(), y.copied())));
            prop_assert_eq!(&got, &expected);
            // And the other way round (a newer heap against an older one).
            let mut back = Vec::new();
            heap.diff(&old, &|x, y| x == y, &mut |id, x, y| back.push((id, y.copied(), x.copied())));
            prop_assert_eq!(back, expected);
        });
    }
}
