//! Persistent (copy-on-write, "shadowing") B+tree: the ordered map behind every
//! index. Cloning a tree is O(1) and yields an immutable snapshot; the writer
//! mutates its private clone and copies a node only while another version still
//! holds it (DStore §4.1, with `Arc` counts in place of per-node counters).
//!
//! Invariants (checked by [`BTree::check_invariants`]):
//! - all leaves are at the same depth; an empty tree has no root at all;
//! - leaf keys are strictly ascending; an inner node with children `c0..=cm`
//!   has separators `s1..=sm` such that every key in `c(i-1)` is `< s(i)` and
//!   every key in `c(i)` is `>= s(i)`;
//! - non-root nodes hold `ceil(f/2)..=f` entries (leaf) or children (inner) for
//!   fanout `f`; a root leaf holds `1..=f` entries, a root inner node `2..=f`
//!   children;
//! - a node reachable from more than one version (`Arc` strong count > 1) is
//!   never modified in place: writers go through `Arc::make_mut`, so a held clone
//!   never changes, and a batch of writes copies each shared node at most once.

use std::collections::HashSet;
use std::fmt;
use std::iter::FusedIterator;
use std::ops::Bound;
use std::sync::Arc;

use smallvec::SmallVec;

/// Default number of children per inner node (entries per leaf).
///
/// From `benches/btree.rs` (100k random u64 keys): fanouts 64-128 read 10-25%
/// faster (full scans up to 2x) than 32, but every write under a held snapshot
/// pins a copied root-to-leaf path of about `depth * fanout` entries; 32 keeps
/// that small (DESIGN §3) at a modest read cost. 8-16 are slower everywhere.
pub const DEFAULT_FANOUT: usize = 32;
/// Below 4 a split or merge could leave a node without a sibling to balance with.
pub const MIN_FANOUT: usize = 4;
/// Bound on node size: beyond this, copying a node per write costs far more than
/// the shallower tree saves.
pub const MAX_FANOUT: usize = 1024;

/// Shape figures of one tree.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TreeStats {
    /// Inner nodes plus leaves.
    pub nodes: usize,
    /// Levels from root to leaf; 0 for an empty tree.
    pub depth: usize,
    pub leaves: usize,
    pub entries: usize,
}

/// Entries a node holds inline, in its own allocation: a full node at the
/// default fanout plus the one an insert adds before the node splits. Larger
/// fanouts (benches) spill to a separate buffer, as a `Vec` would.
const INLINE: usize = DEFAULT_FANOUT + 1;

/// A node's keys, values or children. Inline so a descent costs one cache
/// miss per level (the node, with its keys beside it) instead of two (the
/// node, then its separate key buffer): on a tree larger than the cache that
/// was two thirds of a point read by `_id` (BENCHMARKS.md, session 17).
type Slots<T> = SmallVec<[T; INLINE]>;

// Both variants hold their entries inline, so a leaf whose values are smaller
// than a child pointer (secondary indexes: `()`) is padded to an inner node's
// size; boxing either variant would put back the dependent miss per level
// that inlining removed.
#[allow(clippy::large_enum_variant)]
#[derive(Clone)]
enum Node<K, V> {
    Leaf(Leaf<K, V>),
    Inner(Inner<K, V>),
}

/// Keys and values in separate arrays so a search touches only keys.
#[derive(Clone)]
struct Leaf<K, V> {
    keys: Slots<K>,
    vals: Slots<V>,
}

#[derive(Clone)]
struct Inner<K, V> {
    /// `keys.len() + 1 == children.len()`.
    keys: Slots<K>,
    children: Slots<Arc<Node<K, V>>>,
}

/// Bytes of the separate buffer `v` spilled to (0 while it is inline).
fn spilled_bytes<T>(v: &Slots<T>) -> usize {
    if v.spilled() {
        v.capacity() * std::mem::size_of::<T>()
    } else {
        0
    }
}

/// The entries of `v` from `at` on, moved out (`Vec::split_off`).
fn split_off<T>(v: &mut Slots<T>, at: usize) -> Slots<T> {
    v.drain(at..).collect()
}

impl<K, V> Node<K, V> {
    /// Entries of a leaf or children of an inner node: what fill limits count.
    fn fill(&self) -> usize {
        match self {
            Node::Leaf(leaf) => leaf.keys.len(),
            Node::Inner(inner) => inner.children.len(),
        }
    }
}

/// [`BTree::from_sorted`] was given keys out of order (or a duplicate).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NotAscending;

/// Sizes of the fewest groups of at most `max` that hold `n` items, spread
/// evenly (they differ by at most one). With two or more groups each holds
/// more than `(g-1)·max/g >= max/2` items, hence at least `ceil(max/2)`:
/// the fill a non-root node needs.
fn even_groups(n: usize, max: usize) -> impl Iterator<Item = usize> {
    let groups = n.div_ceil(max);
    let (q, r) = match groups {
        0 => (0, 0),
        g => (n / g, n % g),
    };
    (0..groups).map(move |i| q + usize::from(i < r))
}

/// Index of the child whose key interval holds `key`.
fn child_index<K: Ord>(separators: &[K], key: &K) -> usize {
    separators.partition_point(|s| s <= key)
}

/// Start loading every cache line of `items` (a hint: see `doc::prefetch`).
#[inline]
fn prefetch_all<T>(items: &[T]) {
    let p = items.as_ptr().cast::<u8>();
    for off in (0..std::mem::size_of_val(items)).step_by(64) {
        crate::doc::prefetch(p.wrapping_add(off));
    }
}

fn min_fill(fanout: usize) -> usize {
    // ceil(f/2): a split of f+1 gives two halves of at least this, and a merge
    // of an underfull node (min-1) with a minimal sibling (min) fits in f.
    fanout.div_ceil(2)
}

/// A persistent ordered map: `clone` is O(1); writes copy only the nodes still
/// shared with other clones.
pub struct BTree<K, V> {
    root: Option<Arc<Node<K, V>>>,
    len: usize,
    fanout: usize,
}

impl<K, V> Clone for BTree<K, V> {
    fn clone(&self) -> Self {
        BTree {
            root: self.root.clone(),
            len: self.len,
            fanout: self.fanout,
        }
    }
}

impl<K: Ord + Clone, V: Clone> Default for BTree<K, V> {
    fn default() -> Self {
        Self::new()
    }
}

impl<K: Ord + Clone + fmt::Debug, V: Clone + fmt::Debug> fmt::Debug for BTree<K, V> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_map().entries(self.iter()).finish()
    }
}

impl<K: Ord + Clone, V: Clone + PartialEq> PartialEq for BTree<K, V> {
    fn eq(&self, other: &Self) -> bool {
        let same_root = match (&self.root, &other.root) {
            (Some(a), Some(b)) => Arc::ptr_eq(a, b),
            (None, None) => true,
            _ => false,
        };
        same_root || (self.len == other.len && self.iter().eq(other.iter()))
    }
}

impl<K: Ord + Clone, V: Clone + Eq> Eq for BTree<K, V> {}

impl<K: Ord + Clone, V: Clone> FromIterator<(K, V)> for BTree<K, V> {
    fn from_iter<I: IntoIterator<Item = (K, V)>>(iter: I) -> Self {
        let mut tree = BTree::new();
        tree.extend(iter);
        tree
    }
}

impl<K: Ord + Clone, V: Clone> Extend<(K, V)> for BTree<K, V> {
    fn extend<I: IntoIterator<Item = (K, V)>>(&mut self, iter: I) {
        for (k, v) in iter {
            self.insert(k, v);
        }
    }
}

impl<K: Ord + Clone, V: Clone> BTree<K, V> {
    pub fn new() -> Self {
        Self::with_fanout(DEFAULT_FANOUT)
    }

    /// Requires: `MIN_FANOUT <= fanout <= MAX_FANOUT` (panics otherwise: a
    /// fanout is a constant of the caller, not outside data).
    pub fn with_fanout(fanout: usize) -> Self {
        assert!(
            (MIN_FANOUT..=MAX_FANOUT).contains(&fanout),
            "B+tree fanout {fanout} outside {MIN_FANOUT}..={MAX_FANOUT}"
        );
        BTree {
            root: None,
            len: 0,
            fanout,
        }
    }

    /// A tree of `entries` built bottom-up: leaves filled in order, then each
    /// level of inner nodes over the one below, so a bulk load costs one
    /// move per entry instead of a root-to-leaf descent and the splits of
    /// one insert per key. Nodes at each level hold as many entries (or
    /// children) as evenly spreading them over the fewest nodes gives, so
    /// every non-root node is filled to at least `ceil(f/2)`.
    ///
    /// Requires: keys strictly ascending; otherwise `Err(NotAscending)`
    /// and nothing is built (checked, O(n) comparisons).
    pub fn from_sorted(entries: Vec<(K, V)>) -> Result<Self, NotAscending> {
        Self::from_sorted_with_fanout(DEFAULT_FANOUT, entries)
    }

    /// [`BTree::from_sorted`] with a fanout (within `MIN_FANOUT..=MAX_FANOUT`,
    /// as [`BTree::with_fanout`]).
    pub fn from_sorted_with_fanout(
        fanout: usize,
        entries: Vec<(K, V)>,
    ) -> Result<Self, NotAscending> {
        Self::try_from_sorted_with_fanout(fanout, entries).map_err(|_| NotAscending)
    }

    /// [`BTree::from_sorted`], handing the entries back untouched when they
    /// are not strictly ascending (a caller that only hoped they were sorted
    /// sorts them then, without collecting them again).
    pub fn try_from_sorted(entries: Vec<(K, V)>) -> Result<Self, Vec<(K, V)>> {
        Self::try_from_sorted_with_fanout(DEFAULT_FANOUT, entries)
    }

    fn try_from_sorted_with_fanout(
        fanout: usize,
        entries: Vec<(K, V)>,
    ) -> Result<Self, Vec<(K, V)>> {
        let mut tree = Self::with_fanout(fanout);
        if entries.windows(2).any(|w| w[0].0 >= w[1].0) {
            return Err(entries);
        }
        tree.len = entries.len();
        // Each node of the level being built, with the least key under it
        // (the separator its parent puts before it).
        let mut level: Vec<(K, Arc<Node<K, V>>)> = Vec::with_capacity(tree.len.div_ceil(fanout));
        let mut rest = entries.into_iter();
        for size in even_groups(tree.len, fanout) {
            let (keys, vals): (Slots<K>, Slots<V>) = rest.by_ref().take(size).unzip();
            if let Some(first) = keys.first().cloned() {
                level.push((first, Arc::new(Node::Leaf(Leaf { keys, vals }))));
            }
        }
        while level.len() > 1 {
            let mut above = Vec::with_capacity(level.len().div_ceil(fanout));
            let n = level.len();
            let mut rest = level.into_iter();
            for size in even_groups(n, fanout) {
                let mut group = rest.by_ref().take(size);
                let Some((first, child)) = group.next() else {
                    break;
                };
                let mut keys = Slots::with_capacity(size - 1);
                let mut children = Slots::with_capacity(size);
                children.push(child);
                for (k, c) in group {
                    keys.push(k);
                    children.push(c);
                }
                above.push((first, Arc::new(Node::Inner(Inner { keys, children }))));
            }
            level = above;
        }
        tree.root = level.pop().map(|(_, root)| root);
        Ok(tree)
    }

    pub fn fanout(&self) -> usize {
        self.fanout
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn get(&self, key: &K) -> Option<&V> {
        let mut node = self.root.as_deref()?;
        loop {
            match node {
                Node::Inner(inner) => {
                    // On a tree larger than the cache every level is a chain of
                    // misses (node, then the key lines the binary search
                    // probes one after another, then the child pointer):
                    // requesting the node's keys and children at once overlaps
                    // them.
                    prefetch_all(&inner.keys);
                    prefetch_all(&inner.children);
                    node = &inner.children[child_index(&inner.keys, key)];
                }
                Node::Leaf(leaf) => {
                    prefetch_all(&leaf.keys);
                    prefetch_all(&leaf.vals);
                    return leaf.keys.binary_search(key).ok().map(|i| &leaf.vals[i]);
                }
            }
        }
    }

    pub fn contains_key(&self, key: &K) -> bool {
        self.get(key).is_some()
    }

    pub fn insert(&mut self, key: K, value: V) -> Option<V> {
        let fanout = self.fanout;
        let Some(root) = self.root.as_mut() else {
            self.root = Some(Arc::new(Node::Leaf(Leaf {
                keys: smallvec::smallvec![key],
                vals: smallvec::smallvec![value],
            })));
            self.len = 1;
            return None;
        };
        let (old, split) = insert_rec(root, key, value, fanout);
        if let Some((separator, right)) = split {
            let left = self
                .root
                .take()
                .expect("the root was just split, so it exists");
            self.root = Some(Arc::new(Node::Inner(Inner {
                keys: smallvec::smallvec![separator],
                children: smallvec::smallvec![left, right],
            })));
        }
        if old.is_none() {
            self.len += 1;
        }
        old
    }

    pub fn remove(&mut self, key: &K) -> Option<V> {
        // Look first so that removing a missing key copies no shared path.
        if !self.contains_key(key) {
            return None;
        }
        let min = min_fill(self.fanout);
        let root = self
            .root
            .as_mut()
            .expect("the key was found, so a root exists");
        let old = remove_rec(root, key, min);
        debug_assert!(old.is_some(), "the key was found before removal");
        let collapse_to = match self.root.as_deref() {
            Some(Node::Leaf(leaf)) if leaf.keys.is_empty() => Some(None),
            Some(Node::Inner(inner)) if inner.children.len() == 1 => {
                Some(Some(Arc::clone(&inner.children[0])))
            }
            _ => None,
        };
        if let Some(new_root) = collapse_to {
            self.root = new_root;
        }
        if old.is_some() {
            self.len -= 1;
        }
        old
    }

    /// Entries with `lower <= key <= upper` (per the bounds), ascending; `.rev()`
    /// for descending. Starting costs one root-to-leaf descent per end. Bounds
    /// that cross (lower above upper) give an empty range rather than a panic.
    pub fn range<'a>(&'a self, lower: Bound<&K>, upper: Bound<&K>) -> Range<'a, K, V> {
        let ends = self.root.as_deref().and_then(|root| {
            let front = Cursor::seek_lower(root, lower)?;
            let back = Cursor::seek_upper(root, upper)?;
            (front.key_value().0 <= back.key_value().0).then_some((front, back))
        });
        Range { ends }
    }

    pub fn iter(&self) -> Range<'_, K, V> {
        self.range(Bound::Unbounded, Bound::Unbounded)
    }

    pub fn first(&self) -> Option<(&K, &V)> {
        self.iter().next()
    }

    pub fn last(&self) -> Option<(&K, &V)> {
        self.iter().next_back()
    }

    pub fn stats(&self) -> TreeStats {
        let mut stats = TreeStats::default();
        let Some(root) = self.root.as_deref() else {
            return stats;
        };
        let mut depth = 1;
        let mut node = root;
        while let Node::Inner(inner) = node {
            depth += 1;
            node = &inner.children[0];
        }
        stats.depth = depth;
        visit_nodes(root, &mut |node| {
            stats.nodes += 1;
            if let Node::Leaf(leaf) = node {
                stats.leaves += 1;
                stats.entries += leaf.keys.len();
            }
        });
        stats
    }

    /// Nodes of `self` that are physically the same allocation as a node of
    /// `other`: after `k` writes on a clone, all but O(k * depth) are shared.
    pub fn shared_nodes_with(&self, other: &Self) -> usize {
        let mut theirs = HashSet::new();
        if let Some(root) = other.root.as_deref() {
            visit_nodes(root, &mut |node| {
                theirs.insert(node as *const Node<K, V>);
            });
        }
        let mut shared = 0;
        if let Some(root) = self.root.as_deref() {
            visit_nodes(root, &mut |node| {
                if theirs.contains(&(node as *const Node<K, V>)) {
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
        assert!((MIN_FANOUT..=MAX_FANOUT).contains(&self.fanout));
        let Some(root) = self.root.as_deref() else {
            assert_eq!(self.len, 0, "a tree without root must be empty");
            return;
        };
        let limits = FillLimits {
            min: min_fill(self.fanout),
            max: self.fanout,
        };
        let (entries, _depth) = check_node(root, None, None, true, limits);
        assert_eq!(
            entries, self.len,
            "len disagrees with the entries in leaves"
        );
    }
}

/// Separator and new right sibling of a node that overflowed and split.
type Split<K, V> = Option<(K, Arc<Node<K, V>>)>;

/// Returns the old value if `key` was present, and the split if `node` overflowed.
fn insert_rec<K: Ord + Clone, V: Clone>(
    node: &mut Arc<Node<K, V>>,
    key: K,
    value: V,
    fanout: usize,
) -> (Option<V>, Split<K, V>) {
    match Arc::make_mut(node) {
        Node::Leaf(leaf) => match leaf.keys.binary_search(&key) {
            Ok(i) => (Some(std::mem::replace(&mut leaf.vals[i], value)), None),
            Err(i) => {
                leaf.keys.insert(i, key);
                leaf.vals.insert(i, value);
                if leaf.keys.len() <= fanout {
                    return (None, None);
                }
                let mid = leaf.keys.len() / 2;
                let right = Leaf {
                    keys: split_off(&mut leaf.keys, mid),
                    vals: split_off(&mut leaf.vals, mid),
                };
                let separator = right.keys[0].clone();
                (None, Some((separator, Arc::new(Node::Leaf(right)))))
            }
        },
        Node::Inner(inner) => {
            let i = child_index(&inner.keys, &key);
            let (old, split) = insert_rec(&mut inner.children[i], key, value, fanout);
            let Some((separator, right)) = split else {
                return (old, None);
            };
            inner.keys.insert(i, separator);
            inner.children.insert(i + 1, right);
            if inner.children.len() <= fanout {
                return (old, None);
            }
            let mid = inner.children.len() / 2;
            let right = Inner {
                children: split_off(&mut inner.children, mid),
                keys: split_off(&mut inner.keys, mid),
            };
            // The left half kept `mid` keys for `mid` children: its last key
            // moves up as the separator.
            let separator = inner
                .keys
                .pop()
                .expect("the left half of a split inner node keeps mid >= 2 keys");
            (old, Some((separator, Arc::new(Node::Inner(right)))))
        }
    }
}

/// Requires: `key` is present under `node` (else the path was copied for nothing).
/// Leaves `node` possibly underfull; its parent rebalances.
fn remove_rec<K: Ord + Clone, V: Clone>(
    node: &mut Arc<Node<K, V>>,
    key: &K,
    min: usize,
) -> Option<V> {
    match Arc::make_mut(node) {
        Node::Leaf(leaf) => {
            let i = leaf.keys.binary_search(key).ok()?;
            leaf.keys.remove(i);
            Some(leaf.vals.remove(i))
        }
        Node::Inner(inner) => {
            let i = child_index(&inner.keys, key);
            let old = remove_rec(&mut inner.children[i], key, min)?;
            if inner.children[i].fill() < min {
                rebalance(inner, i, min);
            }
            Some(old)
        }
    }
}

/// Restores the fill of `parent.children[i]` (one below `min`) by taking one
/// item from a sibling that can spare it, else by merging with that sibling.
fn rebalance<K: Ord + Clone, V: Clone>(parent: &mut Inner<K, V>, i: usize, min: usize) {
    debug_assert!(
        parent.children.len() >= 2,
        "an inner node has >= 2 children"
    );
    let sibling = if i > 0 { i - 1 } else { i + 1 };
    let left = i.min(sibling);
    if parent.children[sibling].fill() > min {
        borrow(parent, left, sibling < i);
    } else {
        merge(parent, left);
    }
}

/// Moves one item across the boundary between children `left` and `left + 1`.
fn borrow<K: Ord + Clone, V: Clone>(parent: &mut Inner<K, V>, left: usize, from_left: bool) {
    let (head, tail) = parent.children.split_at_mut(left + 1);
    let separator = &mut parent.keys[left];
    match (Arc::make_mut(&mut head[left]), Arc::make_mut(&mut tail[0])) {
        (Node::Leaf(l), Node::Leaf(r)) => {
            if from_left {
                let k = l.keys.pop().expect("a lending sibling is above min fill");
                let v = l.vals.pop().expect("keys and vals have equal length");
                r.keys.insert(0, k);
                r.vals.insert(0, v);
            } else {
                l.keys.push(r.keys.remove(0));
                l.vals.push(r.vals.remove(0));
            }
            *separator = r.keys[0].clone();
        }
        (Node::Inner(l), Node::Inner(r)) => {
            // Rotate through the parent: the old separator comes down, the
            // moved child's bounding key goes up.
            if from_left {
                let k = l.keys.pop().expect("a lending sibling is above min fill");
                let c = l.children.pop().expect("children outnumber keys");
                r.keys.insert(0, std::mem::replace(separator, k));
                r.children.insert(0, c);
            } else {
                let k = r.keys.remove(0);
                l.keys.push(std::mem::replace(separator, k));
                l.children.push(r.children.remove(0));
            }
        }
        _ => unreachable!("siblings share a depth, so both are leaves or both inner"),
    }
}

/// Merges child `left + 1` into child `left`; both together fit in one node.
fn merge<K: Ord + Clone, V: Clone>(parent: &mut Inner<K, V>, left: usize) {
    let right = parent.children.remove(left + 1);
    let separator = parent.keys.remove(left);
    // A right node still shared with another version is cloned, never moved from.
    let right = Arc::unwrap_or_clone(right);
    match (Arc::make_mut(&mut parent.children[left]), right) {
        (Node::Leaf(l), Node::Leaf(mut r)) => {
            l.keys.append(&mut r.keys);
            l.vals.append(&mut r.vals);
        }
        (Node::Inner(l), Node::Inner(mut r)) => {
            l.keys.push(separator);
            l.keys.append(&mut r.keys);
            l.children.append(&mut r.children);
        }
        _ => unreachable!("siblings share a depth, so both are leaves or both inner"),
    }
}

fn visit_nodes<K, V>(node: &Node<K, V>, f: &mut impl FnMut(&Node<K, V>)) {
    f(node);
    if let Node::Inner(inner) = node {
        for child in &inner.children {
            visit_nodes(child, f);
        }
    }
}

#[derive(Clone, Copy)]
struct FillLimits {
    min: usize,
    max: usize,
}

/// Checks the subtree whose keys must lie in `[lower, upper)`; returns its
/// entry count and depth.
fn check_node<K: Ord, V>(
    node: &Node<K, V>,
    lower: Option<&K>,
    upper: Option<&K>,
    is_root: bool,
    limits: FillLimits,
) -> (usize, usize) {
    let keys = match node {
        Node::Leaf(leaf) => &leaf.keys,
        Node::Inner(inner) => &inner.keys,
    };
    assert!(
        keys.windows(2).all(|w| w[0] < w[1]),
        "keys not strictly ascending"
    );
    if let (Some(lo), Some(first)) = (lower, keys.first()) {
        assert!(lo <= first, "key below its subtree's lower separator");
    }
    if let (Some(hi), Some(last)) = (upper, keys.last()) {
        assert!(last < hi, "key not below its subtree's upper separator");
    }
    let min = match (is_root, node) {
        (true, Node::Leaf(_)) => 1,
        (true, Node::Inner(_)) => 2,
        (false, _) => limits.min,
    };
    let fill = node.fill();
    assert!(
        (min..=limits.max).contains(&fill),
        "fill {fill} outside {min}..={}",
        limits.max
    );
    match node {
        Node::Leaf(leaf) => {
            assert_eq!(leaf.keys.len(), leaf.vals.len(), "a key without value");
            (leaf.keys.len(), 1)
        }
        Node::Inner(inner) => {
            assert_eq!(inner.keys.len() + 1, inner.children.len());
            let mut entries = 0;
            let mut depth = None;
            for (i, child) in inner.children.iter().enumerate() {
                let lo = if i == 0 {
                    lower
                } else {
                    Some(&inner.keys[i - 1])
                };
                let hi = inner.keys.get(i).or(upper);
                let (n, d) = check_node(child, lo, hi, false, limits);
                entries += n;
                assert!(*depth.get_or_insert(d) == d, "leaves at different depths");
            }
            (entries, depth.unwrap_or(0) + 1)
        }
    }
}

/// One end of a range: the root-to-leaf path to a valid entry.
struct Cursor<'a, K, V> {
    /// Inner nodes above `leaf`, each with the index of the child taken.
    path: Vec<(&'a Inner<K, V>, usize)>,
    leaf: &'a Leaf<K, V>,
    idx: usize,
}

impl<'a, K: Ord, V> Cursor<'a, K, V> {
    fn key_value(&self) -> (&'a K, &'a V) {
        (&self.leaf.keys[self.idx], &self.leaf.vals[self.idx])
    }

    fn same_position(&self, other: &Self) -> bool {
        std::ptr::eq(self.leaf, other.leaf) && self.idx == other.idx
    }

    /// Descends from `node` to its first (`last == false`) or last leaf entry.
    fn descend(&mut self, mut node: &'a Node<K, V>, last: bool) {
        loop {
            match node {
                Node::Inner(inner) => {
                    let i = if last { inner.children.len() - 1 } else { 0 };
                    self.path.push((inner, i));
                    node = &inner.children[i];
                }
                Node::Leaf(leaf) => {
                    self.leaf = leaf;
                    self.idx = if last {
                        leaf.keys.len().saturating_sub(1)
                    } else {
                        0
                    };
                    return;
                }
            }
        }
    }

    /// Moves to the next entry; false (cursor then invalid) past the last one.
    fn step_forward(&mut self) -> bool {
        if self.idx + 1 < self.leaf.keys.len() {
            self.idx += 1;
            return true;
        }
        loop {
            let Some(top) = self.path.last_mut() else {
                return false;
            };
            let inner: &'a Inner<K, V> = top.0;
            if top.1 + 1 < inner.children.len() {
                top.1 += 1;
                let child: &'a Node<K, V> = &inner.children[top.1];
                self.descend(child, false);
                return true;
            }
            self.path.pop();
        }
    }

    /// Moves to the previous entry; false (cursor then invalid) before the first.
    fn step_backward(&mut self) -> bool {
        if self.idx > 0 {
            self.idx -= 1;
            return true;
        }
        loop {
            let Some(top) = self.path.last_mut() else {
                return false;
            };
            let inner: &'a Inner<K, V> = top.0;
            if top.1 > 0 {
                top.1 -= 1;
                let child: &'a Node<K, V> = &inner.children[top.1];
                self.descend(child, true);
                return true;
            }
            self.path.pop();
        }
    }

    /// Cursor at the first entry inside `lower`, if any.
    fn seek_lower(root: &'a Node<K, V>, lower: Bound<&K>) -> Option<Self> {
        let mut path = Vec::new();
        let mut node = root;
        loop {
            match node {
                Node::Inner(inner) => {
                    let i = match lower {
                        Bound::Unbounded => 0,
                        Bound::Included(k) | Bound::Excluded(k) => child_index(&inner.keys, k),
                    };
                    path.push((inner, i));
                    node = &inner.children[i];
                }
                Node::Leaf(leaf) => {
                    let idx = match lower {
                        Bound::Unbounded => 0,
                        Bound::Included(k) => leaf.keys.partition_point(|e| e < k),
                        Bound::Excluded(k) => leaf.keys.partition_point(|e| e <= k),
                    };
                    let len = leaf.keys.len();
                    let mut cursor = Cursor { path, leaf, idx };
                    if idx < len {
                        return Some(cursor);
                    }
                    // Everything in this leaf is below the bound: the answer is
                    // the first entry of the next leaf.
                    cursor.idx = len.saturating_sub(1);
                    return cursor.step_forward().then_some(cursor);
                }
            }
        }
    }

    /// Cursor at the last entry inside `upper`, if any.
    fn seek_upper(root: &'a Node<K, V>, upper: Bound<&K>) -> Option<Self> {
        let mut path = Vec::new();
        let mut node = root;
        loop {
            match node {
                Node::Inner(inner) => {
                    let i = match upper {
                        Bound::Unbounded => inner.children.len() - 1,
                        Bound::Included(k) => child_index(&inner.keys, k),
                        Bound::Excluded(k) => inner.keys.partition_point(|s| s < k),
                    };
                    path.push((inner, i));
                    node = &inner.children[i];
                }
                Node::Leaf(leaf) => {
                    let end = match upper {
                        Bound::Unbounded => leaf.keys.len(),
                        Bound::Included(k) => leaf.keys.partition_point(|e| e <= k),
                        Bound::Excluded(k) => leaf.keys.partition_point(|e| e < k),
                    };
                    let mut cursor = Cursor {
                        path,
                        leaf,
                        idx: end.saturating_sub(1),
                    };
                    if end > 0 {
                        return Some(cursor);
                    }
                    return cursor.step_backward().then_some(cursor);
                }
            }
        }
    }
}

/// Iterator over a key range of a [`BTree`], ascending from the front and
/// descending from the back.
pub struct Range<'a, K, V> {
    /// Front and back cursors, both on entries inside the range with
    /// front <= back; `None` once they have crossed.
    ends: Option<(Cursor<'a, K, V>, Cursor<'a, K, V>)>,
}

impl<'a, K: Ord, V> Iterator for Range<'a, K, V> {
    type Item = (&'a K, &'a V);

    fn next(&mut self) -> Option<Self::Item> {
        let (front, back) = self.ends.as_mut()?;
        let item = front.key_value();
        if front.same_position(back) || !front.step_forward() {
            self.ends = None;
        }
        Some(item)
    }
}

impl<K: Ord, V> DoubleEndedIterator for Range<'_, K, V> {
    fn next_back(&mut self) -> Option<Self::Item> {
        let (front, back) = self.ends.as_mut()?;
        let item = back.key_value();
        if back.same_position(front) || !back.step_backward() {
            self.ends = None;
        }
        Some(item)
    }
}

impl<K: Ord, V> FusedIterator for Range<'_, K, V> {}

/// Cross-version accounting for the snapshot registry (`crate::snapshot`): node
/// identities, the nodes one version holds that another does not, and weak
/// probes that show when nodes are freed. All O(nodes); never on a hot path.
impl<K: Ord + Clone, V: Clone> BTree<K, V> {
    /// Adds the address of every node of this version to `out`. Addresses are
    /// identities only, valid while the version is held.
    pub fn node_addrs_into(&self, out: &mut HashSet<usize>) {
        if let Some(root) = self.root.as_deref() {
            visit_nodes(root, &mut |node| {
                out.insert(node as *const Node<K, V> as usize);
            });
        }
    }

    /// Walks the nodes of this version whose address is not in `known`,
    /// skipping a known node's subtree whole (shared nodes are immutable, so a
    /// version that reaches a node reaches all below it). Returns the unknown
    /// nodes and their bytes: the node (entries inline), its `Arc` header, any
    /// buffer a node larger than [`INLINE`] spilled to,
    /// plus `key_bytes` of each key for what keys own out of line.
    pub fn walk_unknown(
        &self,
        known: &HashSet<usize>,
        key_bytes: &impl Fn(&K) -> usize,
    ) -> (usize, usize) {
        fn walk<K, V>(
            node: &Node<K, V>,
            known: &HashSet<usize>,
            key_bytes: &impl Fn(&K) -> usize,
            acc: &mut (usize, usize),
        ) {
            if known.contains(&(node as *const Node<K, V> as usize)) {
                return;
            }
            let (keys, out_of_line) = match node {
                Node::Leaf(leaf) => (&leaf.keys, spilled_bytes(&leaf.vals)),
                Node::Inner(inner) => (&inner.keys, spilled_bytes(&inner.children)),
            };
            acc.0 += 1;
            acc.1 += std::mem::size_of::<Node<K, V>>()
                + 2 * std::mem::size_of::<usize>()
                + spilled_bytes(keys)
                + keys.iter().map(key_bytes).sum::<usize>()
                + out_of_line;
            if let Node::Inner(inner) = node {
                for child in &inner.children {
                    walk(child, known, key_bytes, acc);
                }
            }
        }
        let mut acc = (0, 0);
        if let Some(root) = self.root.as_deref() {
            walk(root, known, key_bytes, &mut acc);
        }
        acc
    }

    /// Calls `f` for every leaf in key order with its address (an identity,
    /// valid while this version is held), its keys and their values. A leaf at the same
    /// address in two held versions is the same leaf with the same entries
    /// (nodes are immutable once shared): incremental checkpoints reuse what
    /// they wrote for it.
    pub fn for_each_leaf(&self, f: &mut impl FnMut(usize, &[K], &[V])) {
        if let Some(root) = self.root.as_deref() {
            visit_nodes(root, &mut |node| {
                if let Node::Leaf(leaf) = node {
                    f(node as *const Node<K, V> as usize, &leaf.keys, &leaf.vals);
                }
            });
        }
    }

    /// A weak reference to every node: a probe is dead once no version holds
    /// that node any more (leak tests: released snapshots free their nodes).
    pub fn node_probes(&self) -> Vec<std::sync::Weak<dyn std::any::Any>>
    where
        K: 'static,
        V: 'static,
    {
        fn walk<K: 'static, V: 'static>(
            node: &Arc<Node<K, V>>,
            out: &mut Vec<std::sync::Weak<dyn std::any::Any>>,
        ) {
            let any: Arc<dyn std::any::Any> = node.clone();
            out.push(Arc::downgrade(&any));
            if let Node::Inner(inner) = &**node {
                for child in &inner.children {
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

    impl<K, V> BTree<K, V> {
        fn weak_nodes(&self) -> Vec<Weak<Node<K, V>>> {
            fn walk<K, V>(node: &Arc<Node<K, V>>, out: &mut Vec<Weak<Node<K, V>>>) {
                out.push(Arc::downgrade(node));
                if let Node::Inner(inner) = &**node {
                    for child in &inner.children {
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

    fn assert_same(tree: &BTree<u32, u32>, model: &BTreeMap<u32, u32>) {
        assert_eq!(tree.len(), model.len());
        assert!(tree.iter().eq(model.iter()));
    }

    fn model_range<'a>(
        model: &'a BTreeMap<u32, u32>,
        lower: Bound<&u32>,
        upper: Bound<&u32>,
    ) -> Vec<(&'a u32, &'a u32)> {
        // std panics on crossed bounds; our tree answers with an empty range.
        let crossed = match (lower, upper) {
            (Bound::Included(a), Bound::Included(b)) => a > b,
            (Bound::Included(a) | Bound::Excluded(a), Bound::Excluded(b))
            | (Bound::Excluded(a), Bound::Included(b)) => a >= b,
            _ => false,
        };
        if crossed {
            Vec::new()
        } else {
            model.range((lower, upper)).collect()
        }
    }

    #[derive(Debug, Clone)]
    enum Op {
        Insert(u32, u32),
        Remove(u32),
        Range(Bound<u32>, Bound<u32>, bool),
        Snapshot,
    }

    fn bound() -> impl Strategy<Value = Bound<u32>> {
        prop_oneof![
            Just(Bound::Unbounded),
            (0u32..220).prop_map(Bound::Included),
            (0u32..220).prop_map(Bound::Excluded),
        ]
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            6 => (0u32..200, any::<u32>()).prop_map(|(k, v)| Op::Insert(k, v)),
            4 => (0u32..200).prop_map(Op::Remove),
            2 => (bound(), bound(), any::<bool>()).prop_map(|(l, u, r)| Op::Range(l, u, r)),
            1 => Just(Op::Snapshot),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(48))]

        #[test]
        fn btree_matches_model(
            fanout in prop_oneof![Just(4usize), Just(5), Just(8), Just(32)],
            ops in prop::collection::vec(op(), 1..400),
        ) {
            let mut tree = BTree::with_fanout(fanout);
            let mut model = BTreeMap::new();
            let mut snapshots = Vec::new();
            for op in ops {
                match op {
                    Op::Insert(k, v) => prop_assert_eq!(tree.insert(k, v), model.insert(k, v)),
                    Op::Remove(k) => prop_assert_eq!(tree.remove(&k), model.remove(&k)),
                    Op::Range(lo, hi, rev) => {
                        let want = model_range(&model, lo.as_ref(), hi.as_ref());
                        let got: Vec<_> = if rev {
                            let mut got: Vec<_> = tree.range(lo.as_ref(), hi.as_ref()).rev().collect();
                            got.reverse();
                            got
                        } else {
                            tree.range(lo.as_ref(), hi.as_ref()).collect()
                        };
                        prop_assert_eq!(got, want);
                    }
                    Op::Snapshot => snapshots.push((tree.clone(), model.clone())),
                }
                tree.check_invariants();
                prop_assert_eq!(tree.len(), model.len());
                prop_assert_eq!(tree.first(), model.first_key_value());
                prop_assert_eq!(tree.last(), model.last_key_value());
            }
            assert_same(&tree, &model);
            for (snapshot, frozen) in &snapshots {
                snapshot.check_invariants();
                assert_same(snapshot, frozen);
            }
        }

        /// Alternating front/back consumption meets in the middle exactly once.
        #[test]
        fn btree_range_both_ends(
            keys in prop::collection::btree_set(0u32..1000, 0..300),
            lo in bound(),
            hi in bound(),
            pattern in any::<u64>(),
        ) {
            let mut tree = BTree::with_fanout(4);
            for &k in &keys {
                tree.insert(k, k);
            }
            let model: BTreeMap<u32, u32> = keys.iter().map(|&k| (k, k)).collect();
            let want = model_range(&model, lo.as_ref(), hi.as_ref());
            let mut range = tree.range(lo.as_ref(), hi.as_ref());
            let (mut front, mut back) = (Vec::new(), Vec::new());
            for step in 0.. {
                let from_back = pattern >> (step % 64) & 1 == 1;
                match (from_back, if from_back { range.next_back() } else { range.next() }) {
                    (false, Some(item)) => front.push(item),
                    (true, Some(item)) => back.push(item),
                    (_, None) => break,
                }
            }
            prop_assert!(range.next().is_none() && range.next_back().is_none());
            back.reverse();
            front.extend(back);
            prop_assert_eq!(front, want);
        }
    }

    #[test]
    fn btree_persistence_under_random_writes() {
        let mut rng = StdRng::seed_from_u64(7);
        for fanout in [4, 7, 32] {
            let mut tree = BTree::with_fanout(fanout);
            let mut model = BTreeMap::new();
            let mut held = Vec::new();
            for step in 0..6000u32 {
                let k = rng.gen_range(0..2000u32);
                if rng.gen_bool(0.6) {
                    tree.insert(k, step);
                    model.insert(k, step);
                } else {
                    tree.remove(&k);
                    model.remove(&k);
                }
                if rng.gen_ratio(1, 300) {
                    held.push((tree.clone(), model.clone()));
                }
            }
            tree.check_invariants();
            assert_same(&tree, &model);
            for (snapshot, frozen) in &held {
                snapshot.check_invariants();
                assert_same(snapshot, frozen);
            }
        }
    }

    #[test]
    fn btree_writes_on_clone_copy_only_their_paths() {
        let mut base = BTree::new();
        for k in 0..100_000u32 {
            base.insert(k * 2, k);
        }
        let stats = base.stats();
        assert_eq!(stats.entries, 100_000);
        assert!(stats.depth >= 3, "want a tree deep enough to matter");

        // One write copies exactly the root-to-leaf path; a second write to the
        // same leaf copies nothing more (each shared node at most once).
        let mut work = base.clone();
        assert_eq!(work.shared_nodes_with(&base), stats.nodes);
        work.insert(1001, 0);
        assert_eq!(stats.nodes - work.shared_nodes_with(&base), stats.depth);
        work.insert(1003, 0);
        assert_eq!(stats.nodes - work.shared_nodes_with(&base), stats.depth);

        let mut rng = StdRng::seed_from_u64(1);
        let mut work = base.clone();
        let k = 50;
        for _ in 0..k {
            let key = rng.gen_range(0..200_000u32);
            if rng.gen_bool(0.5) {
                work.insert(key, 1);
            } else {
                work.remove(&key);
            }
        }
        work.check_invariants();
        let shared = work.shared_nodes_with(&base);
        let new = work.stats().nodes - shared;
        // A split or merge adds at most one sibling per level.
        assert!(
            new <= 2 * k * stats.depth,
            "{new} new nodes after {k} writes"
        );
        assert!(shared >= stats.nodes - k * stats.depth);
        // The base version is untouched.
        assert_eq!(base.len(), 100_000);
        assert!(base
            .iter()
            .map(|(k, v)| (*k, *v))
            .eq((0..100_000u32).map(|k| (k * 2, k))));
        base.check_invariants();
    }

    #[test]
    fn btree_missing_key_remove_copies_nothing() {
        let base: BTree<u32, u32> = (0..1000).map(|k| (k * 2, k)).collect();
        let mut work = base.clone();
        assert_eq!(work.remove(&3), None);
        assert_eq!(work.shared_nodes_with(&base), base.stats().nodes);
    }

    #[test]
    fn btree_dropping_all_versions_frees_every_node() {
        let mut tree = BTree::with_fanout(4);
        let mut versions = Vec::new();
        let mut weak = Vec::new();
        for k in 0..2000u32 {
            tree.insert(k.wrapping_mul(2_654_435_761) % 5000, k);
            if k % 97 == 0 {
                tree.remove(&(k / 2));
                versions.push(tree.clone());
            }
        }
        for version in versions.iter().chain([&tree]) {
            weak.extend(version.weak_nodes());
        }
        assert!(weak.iter().all(|w| w.upgrade().is_some()));
        drop(versions);
        drop(tree);
        assert!(
            weak.iter().all(|w| w.upgrade().is_none()),
            "a node outlived all versions"
        );
    }

    #[test]
    fn btree_remove_everything_collapses_to_empty() {
        let mut tree = BTree::with_fanout(4);
        for k in 0..500u32 {
            tree.insert(k, k);
        }
        for k in (0..500u32).rev() {
            assert_eq!(tree.remove(&k), Some(k));
            tree.check_invariants();
        }
        assert!(tree.is_empty());
        assert_eq!(tree.stats(), TreeStats::default());
        assert_eq!(tree.first(), None);
        assert_eq!(tree.iter().next_back(), None);
    }

    #[test]
    fn btree_range_edges() {
        let tree: BTree<u32, ()> = (10..20).map(|k| (k, ())).collect();
        let keys = |lo: Bound<&u32>, hi: Bound<&u32>| -> Vec<u32> {
            tree.range(lo, hi).map(|(k, _)| *k).collect()
        };
        assert_eq!(
            keys(Bound::Excluded(&19), Bound::Unbounded),
            Vec::<u32>::new()
        );
        assert_eq!(
            keys(Bound::Unbounded, Bound::Excluded(&10)),
            Vec::<u32>::new()
        );
        assert_eq!(
            keys(Bound::Included(&15), Bound::Excluded(&15)),
            Vec::<u32>::new()
        );
        assert_eq!(
            keys(Bound::Included(&18), Bound::Included(&12)),
            Vec::<u32>::new()
        );
        assert_eq!(keys(Bound::Included(&15), Bound::Included(&15)), vec![15]);
        assert_eq!(
            keys(Bound::Excluded(&0), Bound::Included(&11)),
            vec![10, 11]
        );
        let empty: BTree<u32, ()> = BTree::new();
        assert_eq!(empty.range(Bound::Unbounded, Bound::Unbounded).count(), 0);
    }

    /// A bulk-built tree holds exactly its entries, keeps every structural
    /// invariant at any size (all fanouts, sizes around level boundaries),
    /// and stays a working tree: writes on it match the model.
    #[test]
    fn btree_from_sorted_equals_inserts() {
        for fanout in [MIN_FANOUT, 5, 7, DEFAULT_FANOUT] {
            for n in [
                0u32, 1, 2, 3, 4, 5, 8, 9, 16, 17, 31, 33, 64, 65, 200, 1000, 4097,
            ] {
                let entries: Vec<(u32, u32)> = (0..n).map(|k| (k * 2, k)).collect();
                let mut tree =
                    BTree::from_sorted_with_fanout(fanout, entries.clone()).expect("ascending");
                tree.check_invariants();
                let mut model: BTreeMap<u32, u32> = entries.into_iter().collect();
                assert_same(&tree, &model);
                for k in (0..n * 2).step_by(3) {
                    if k % 2 == 0 {
                        tree.remove(&k);
                        model.remove(&k);
                    } else {
                        tree.insert(k, k);
                        model.insert(k, k);
                    }
                }
                tree.check_invariants();
                assert_same(&tree, &model);
            }
        }
        assert_eq!(
            BTree::from_sorted(vec![(1u32, ()), (1, ())]).err(),
            Some(NotAscending)
        );
        assert_eq!(
            BTree::from_sorted(vec![(2u32, ()), (1, ())]).err(),
            Some(NotAscending)
        );
        // Handed back as given, to be sorted by the caller.
        let back = BTree::try_from_sorted(vec![(2u32, 'b'), (1, 'a')]).err();
        assert_eq!(back, Some(vec![(2, 'b'), (1, 'a')]));
    }

    #[test]
    #[should_panic(expected = "fanout")]
    fn btree_rejects_tiny_fanout() {
        let _ = BTree::<u32, u32>::with_fanout(3);
    }
}
