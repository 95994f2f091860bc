//! Persistent (copy-on-write, "shadowing") B+tree: the ordered map behind every
//! index. Cloning a tree is O(1) and yields an immutable snapshot; the writer
//! mutates its private clone and copies a node only while another version still
//! holds it (DStore §4.1, with `Arc` counts in place of per-node counters).
//!
//! Leaves and inner nodes are separate types, each in an allocation of its own
//! size, so a leaf of values smaller than a child pointer (secondary indexes:
//! `()`) is not padded to an inner node's size. Siblings share a depth, so an
//! inner node's children are all leaves or all inner nodes: one tag in the
//! parent says which, and a descent still loads one node per level.
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

use std::any::Any;
use std::collections::HashSet;
use std::fmt;
use std::iter::FusedIterator;
use std::ops::Bound;
use std::sync::{Arc, Weak};

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
    children: Children<K, V>,
}

/// A leaf or an inner node, in whatever form it is held: the root ([`Root`]),
/// a borrowed node ([`NodeRef`]), or all the children of one inner node
/// ([`Children`]: one tag for the lot, since siblings share a depth).
#[derive(Clone, Copy)]
enum Kind<L, I> {
    Leaf(L),
    Inner(I),
}

type Root<K, V> = Kind<Arc<Leaf<K, V>>, Arc<Inner<K, V>>>;
type Children<K, V> = Kind<Slots<Arc<Leaf<K, V>>>, Slots<Arc<Inner<K, V>>>>;
type NodeRef<'a, K, V> = Kind<&'a Leaf<K, V>, &'a Inner<K, V>>;

/// `$body` with `$n` bound to what either variant of the [`Kind`] `$kind`
/// holds: code that reads the same for leaves and inner nodes, compiled once
/// per node type (through [`Node`] where it needs one).
macro_rules! kind {
    ($kind:expr, $n:pat => $body:expr) => {
        match $kind {
            Kind::Leaf($n) => $body,
            Kind::Inner($n) => $body,
        }
    };
}

impl<K, V> Root<K, V> {
    fn node(&self) -> NodeRef<'_, K, V> {
        match self {
            Kind::Leaf(leaf) => Kind::Leaf(leaf),
            Kind::Inner(inner) => Kind::Inner(inner),
        }
    }
}

impl<K, V> Children<K, V> {
    fn len(&self) -> usize {
        kind!(self, nodes => nodes.len())
    }

    /// Child `i`, as a new root (when the root collapses onto it).
    fn root(&self, i: usize) -> Root<K, V> {
        match self {
            Kind::Leaf(leaves) => Kind::Leaf(Arc::clone(&leaves[i])),
            Kind::Inner(inners) => Kind::Inner(Arc::clone(&inners[i])),
        }
    }

    /// The children from `at` on, moved out.
    fn split_off(&mut self, at: usize) -> Self {
        match self {
            Kind::Leaf(leaves) => Kind::Leaf(split_off(leaves, at)),
            Kind::Inner(inners) => Kind::Inner(split_off(inners, at)),
        }
    }

    /// Moves one child from the end of `left` to the front of `right`
    /// (`from_left`), or from the front of `right` to the end of `left`.
    fn shift(left: &mut Self, right: &mut Self, from_left: bool) {
        match (left, right) {
            (Kind::Leaf(l), Kind::Leaf(r)) => shift(l, r, from_left),
            (Kind::Inner(l), Kind::Inner(r)) => shift(l, r, from_left),
            _ => unreachable!("siblings share a depth, so both hold leaves or both inner nodes"),
        }
    }

    fn append(&mut self, other: Self) {
        match (self, other) {
            (Kind::Leaf(l), Kind::Leaf(mut r)) => l.append(&mut r),
            (Kind::Inner(l), Kind::Inner(mut r)) => l.append(&mut r),
            _ => unreachable!("siblings share a depth, so both hold leaves or both inner nodes"),
        }
    }
}

impl<'a, K, V> NodeRef<'a, K, V> {
    /// The node's address: an identity, valid while a version holding it is.
    fn addr(self) -> usize {
        kind!(self, node => node as *const _ as usize)
    }

    /// The node's children, left to right (none for a leaf).
    fn children(self) -> impl Iterator<Item = NodeRef<'a, K, V>> {
        let (leaves, inners) = match self {
            Kind::Leaf(_) => (&[][..], &[][..]),
            Kind::Inner(Inner {
                children: Kind::Leaf(leaves),
                ..
            }) => (&leaves[..], &[][..]),
            Kind::Inner(Inner {
                children: Kind::Inner(inners),
                ..
            }) => (&[][..], &inners[..]),
        };
        let leaves = leaves.iter().map(|leaf| Kind::Leaf(&**leaf));
        leaves.chain(inners.iter().map(|inner| Kind::Inner(&**inner)))
    }
}

impl<K: Ord, V> Leaf<K, V> {
    fn get(&self, key: &K) -> Option<&V> {
        prefetch_all(&self.keys);
        prefetch_all(&self.vals);
        self.keys.binary_search(key).ok().map(|i| &self.vals[i])
    }
}

impl<K, V> Inner<K, V> {
    fn child(&self, i: usize) -> NodeRef<'_, K, V> {
        match &self.children {
            Kind::Leaf(leaves) => Kind::Leaf(&leaves[i]),
            Kind::Inner(inners) => Kind::Inner(&inners[i]),
        }
    }
}

/// Separator and new right sibling of a node that overflowed and split.
type Split<K, N> = Option<(K, N)>;

/// The writes on one node, leaf or inner: the code above a node (its
/// parent's, or the tree's for the root) is written once, generic over this.
trait Node<K, V>: Clone {
    /// Entries of a leaf or children of an inner node: what fill limits count.
    fn fill(&self) -> usize;

    /// Returns the old value if `key` was present, and the split if the node
    /// overflowed.
    fn insert(&mut self, key: K, value: V, fanout: usize) -> (Option<V>, Split<K, Self>);

    /// Requires: `key` is present under the node (else the path was copied
    /// for nothing). Leaves the node possibly underfull; its parent rebalances.
    fn remove(&mut self, key: &K, min: usize) -> Option<V>;

    /// Moves one item across the boundary between siblings `left` and
    /// `right`, `separator` being the parent's key between them.
    fn borrow(left: &mut Self, right: &mut Self, separator: &mut K, from_left: bool);

    /// Moves all of `right` (the sibling after `separator`) into `left`; both
    /// together fit in one node.
    fn merge(left: &mut Self, right: Self, separator: K);

    /// `nodes` as the children of an inner node.
    fn tagged(nodes: Slots<Arc<Self>>) -> Children<K, V>;
}

impl<K: Ord + Clone, V: Clone> Node<K, V> for Leaf<K, V> {
    fn fill(&self) -> usize {
        self.keys.len()
    }

    fn insert(&mut self, key: K, value: V, fanout: usize) -> (Option<V>, Split<K, Self>) {
        match self.keys.binary_search(&key) {
            Ok(i) => (Some(std::mem::replace(&mut self.vals[i], value)), None),
            Err(i) => {
                self.keys.insert(i, key);
                self.vals.insert(i, value);
                if self.keys.len() <= fanout {
                    return (None, None);
                }
                let mid = self.keys.len() / 2;
                let right = Leaf {
                    keys: split_off(&mut self.keys, mid),
                    vals: split_off(&mut self.vals, mid),
                };
                (None, Some((right.keys[0].clone(), right)))
            }
        }
    }

    fn remove(&mut self, key: &K, _min: usize) -> Option<V> {
        let i = self.keys.binary_search(key).ok()?;
        self.keys.remove(i);
        Some(self.vals.remove(i))
    }

    fn borrow(left: &mut Self, right: &mut Self, separator: &mut K, from_left: bool) {
        shift(&mut left.keys, &mut right.keys, from_left);
        shift(&mut left.vals, &mut right.vals, from_left);
        *separator = right.keys[0].clone();
    }

    fn merge(left: &mut Self, mut right: Self, _separator: K) {
        left.keys.append(&mut right.keys);
        left.vals.append(&mut right.vals);
    }

    fn tagged(nodes: Slots<Arc<Self>>) -> Children<K, V> {
        Kind::Leaf(nodes)
    }
}

impl<K: Ord + Clone, V: Clone> Node<K, V> for Inner<K, V> {
    fn fill(&self) -> usize {
        self.children.len()
    }

    fn insert(&mut self, key: K, value: V, fanout: usize) -> (Option<V>, Split<K, Self>) {
        let i = child_index(&self.keys, &key);
        let old = kind!(&mut self.children, children => {
            insert_child(&mut self.keys, children, i, key, value, fanout)
        });
        if self.children.len() <= fanout {
            return (old, None);
        }
        let mid = self.children.len() / 2;
        let right = Inner {
            children: self.children.split_off(mid),
            keys: split_off(&mut self.keys, mid),
        };
        // The left half kept `mid` keys for `mid` children: its last key
        // moves up as the separator.
        let separator = self
            .keys
            .pop()
            .expect("the left half of a split inner node keeps mid >= 2 keys");
        (old, Some((separator, right)))
    }

    fn remove(&mut self, key: &K, min: usize) -> Option<V> {
        let i = child_index(&self.keys, key);
        kind!(&mut self.children, children => {
            remove_child(&mut self.keys, children, i, key, min)
        })
    }

    fn borrow(left: &mut Self, right: &mut Self, separator: &mut K, from_left: bool) {
        // Rotate through the parent: the old separator comes down, the moved
        // child's bounding key goes up.
        if from_left {
            let k = left
                .keys
                .pop()
                .expect("a lending sibling is above min fill");
            right.keys.insert(0, std::mem::replace(separator, k));
        } else {
            let k = right.keys.remove(0);
            left.keys.push(std::mem::replace(separator, k));
        }
        Children::shift(&mut left.children, &mut right.children, from_left);
    }

    fn merge(left: &mut Self, mut right: Self, separator: K) {
        left.keys.push(separator);
        left.keys.append(&mut right.keys);
        left.children.append(right.children);
    }

    fn tagged(nodes: Slots<Arc<Self>>) -> Children<K, V> {
        Kind::Inner(nodes)
    }
}

/// Inserts under `children[i]` of an inner node with separators `keys`,
/// taking in the new sibling if that child split. Returns the old value.
fn insert_child<K: Ord + Clone, V: Clone, N: Node<K, V>>(
    keys: &mut Slots<K>,
    children: &mut Slots<Arc<N>>,
    i: usize,
    key: K,
    value: V,
    fanout: usize,
) -> Option<V> {
    let (old, split) = Arc::make_mut(&mut children[i]).insert(key, value, fanout);
    if let Some((separator, right)) = split {
        keys.insert(i, separator);
        children.insert(i + 1, Arc::new(right));
    }
    old
}

/// Removes `key` from under `children[i]` (see [`Node::remove`]), then
/// restores that child's fill if it fell one below `min`: by taking one item
/// from a sibling that can spare it, else by merging with that sibling.
fn remove_child<K: Ord + Clone, V: Clone, N: Node<K, V>>(
    keys: &mut Slots<K>,
    children: &mut Slots<Arc<N>>,
    i: usize,
    key: &K,
    min: usize,
) -> Option<V> {
    let old = Arc::make_mut(&mut children[i]).remove(key, min)?;
    if children[i].fill() >= min {
        return Some(old);
    }
    debug_assert!(children.len() >= 2, "an inner node has >= 2 children");
    let sibling = if i > 0 { i - 1 } else { i + 1 };
    let left = i.min(sibling);
    if children[sibling].fill() > min {
        let (head, tail) = children.split_at_mut(left + 1);
        N::borrow(
            Arc::make_mut(&mut head[left]),
            Arc::make_mut(&mut tail[0]),
            &mut keys[left],
            sibling < i,
        );
    } else {
        let right = children.remove(left + 1);
        let separator = keys.remove(left);
        // A right node still shared with another version is cloned, never
        // moved from.
        N::merge(
            Arc::make_mut(&mut children[left]),
            Arc::unwrap_or_clone(right),
            separator,
        );
    }
    Some(old)
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

/// Moves one entry from the end of `left` to the front of `right`
/// (`from_left`), or from the front of `right` to the end of `left`.
fn shift<T>(left: &mut Slots<T>, right: &mut Slots<T>, from_left: bool) {
    if from_left {
        let item = left.pop().expect("a lending sibling is above min fill");
        right.insert(0, item);
    } else {
        left.push(right.remove(0));
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

/// The level of inner nodes over `level` (each node with the least key under
/// it: the separator its parent puts before it), for a bottom-up build.
fn build_level<K: Ord + Clone, V: Clone, N: Node<K, V>>(
    level: Vec<(K, Arc<N>)>,
    fanout: usize,
) -> Vec<(K, Arc<Inner<K, V>>)> {
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
        let children = N::tagged(children);
        above.push((first, Arc::new(Inner { keys, children })));
    }
    above
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
    root: Option<Root<K, V>>,
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
            (Some(a), Some(b)) => a.node().addr() == b.node().addr(),
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
        // Each leaf with its least key (the separator its parent puts before it).
        let mut leaves = Vec::with_capacity(tree.len.div_ceil(fanout));
        let mut rest = entries.into_iter();
        for size in even_groups(tree.len, fanout) {
            let (keys, vals): (Slots<K>, Slots<V>) = rest.by_ref().take(size).unzip();
            if let Some(first) = keys.first().cloned() {
                leaves.push((first, Arc::new(Leaf { keys, vals })));
            }
        }
        tree.root = if leaves.len() <= 1 {
            leaves.pop().map(|(_, leaf)| Kind::Leaf(leaf))
        } else {
            let mut level = build_level(leaves, fanout);
            while level.len() > 1 {
                level = build_level(level, fanout);
            }
            level.pop().map(|(_, inner)| Kind::Inner(inner))
        };
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
        let mut inner = match self.root.as_ref()? {
            Kind::Leaf(leaf) => return leaf.get(key),
            Kind::Inner(inner) => &**inner,
        };
        loop {
            // On a tree larger than the cache every level is a chain of misses
            // (node, then the key lines the binary search probes one after
            // another, then the child pointer): requesting the node's keys and
            // children at once overlaps them.
            prefetch_all(&inner.keys);
            kind!(&inner.children, children => prefetch_all(children));
            let i = child_index(&inner.keys, key);
            match &inner.children {
                Kind::Leaf(leaves) => return leaves[i].get(key),
                Kind::Inner(inners) => inner = &inners[i],
            }
        }
    }

    pub fn contains_key(&self, key: &K) -> bool {
        self.get(key).is_some()
    }

    pub fn insert(&mut self, key: K, value: V) -> Option<V> {
        let fanout = self.fanout;
        let Some(root) = self.root.as_mut() else {
            self.root = Some(Kind::Leaf(Arc::new(Leaf {
                keys: smallvec::smallvec![key],
                vals: smallvec::smallvec![value],
            })));
            self.len = 1;
            return None;
        };
        let (old, grown) = kind!(root, node => {
            let (old, split) = Arc::make_mut(node).insert(key, value, fanout);
            (old, split.map(|(separator, right)| grow(node, separator, right)))
        });
        if let Some(new_root) = grown {
            self.root = Some(Kind::Inner(Arc::new(new_root)));
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
        let old = kind!(root, node => Arc::make_mut(node).remove(key, min));
        debug_assert!(old.is_some(), "the key was found before removal");
        let collapse_to = match &self.root {
            Some(Kind::Leaf(leaf)) if leaf.keys.is_empty() => Some(None),
            Some(Kind::Inner(inner)) if inner.children.len() == 1 => {
                Some(Some(inner.children.root(0)))
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
        let ends = self.root.as_ref().and_then(|root| {
            let front = Cursor::seek_lower(root.node(), lower)?;
            let back = Cursor::seek_upper(root.node(), upper)?;
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
        let Some(root) = &self.root else {
            return stats;
        };
        let mut depth = 1;
        let mut node = root.node();
        while let Kind::Inner(inner) = node {
            depth += 1;
            node = inner.child(0);
        }
        stats.depth = depth;
        visit_nodes(root.node(), &mut |node| {
            stats.nodes += 1;
            if let Kind::Leaf(leaf) = node {
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
        if let Some(root) = &other.root {
            visit_nodes(root.node(), &mut |node| {
                theirs.insert(node.addr());
            });
        }
        let mut shared = 0;
        if let Some(root) = &self.root {
            visit_nodes(root.node(), &mut |node| {
                if theirs.contains(&node.addr()) {
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
        let Some(root) = &self.root else {
            assert_eq!(self.len, 0, "a tree without root must be empty");
            return;
        };
        let limits = FillLimits {
            min: min_fill(self.fanout),
            max: self.fanout,
        };
        let (entries, _depth) = check_node(root.node(), None, None, true, limits);
        assert_eq!(
            entries, self.len,
            "len disagrees with the entries in leaves"
        );
    }
}

/// The new root over a root that split into `left` and `right`.
fn grow<K: Ord + Clone, V: Clone, N: Node<K, V>>(
    left: &Arc<N>,
    separator: K,
    right: N,
) -> Inner<K, V> {
    Inner {
        keys: smallvec::smallvec![separator],
        children: N::tagged(smallvec::smallvec![Arc::clone(left), Arc::new(right)]),
    }
}

fn visit_nodes<'a, K, V>(node: NodeRef<'a, K, V>, f: &mut impl FnMut(NodeRef<'a, K, V>)) {
    f(node);
    for child in node.children() {
        visit_nodes(child, f);
    }
}

#[derive(Clone, Copy)]
struct FillLimits {
    min: usize,
    max: usize,
}

/// Checks the subtree whose keys must lie in `[lower, upper)`; returns its
/// entry count and depth.
fn check_node<K: Ord + Clone, V: Clone>(
    node: NodeRef<'_, K, V>,
    lower: Option<&K>,
    upper: Option<&K>,
    is_root: bool,
    limits: FillLimits,
) -> (usize, usize) {
    let (keys, fill) = kind!(node, node => (&node.keys, node.fill()));
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
        (true, Kind::Leaf(_)) => 1,
        (true, Kind::Inner(_)) => 2,
        (false, _) => limits.min,
    };
    assert!(
        (min..=limits.max).contains(&fill),
        "fill {fill} outside {min}..={}",
        limits.max
    );
    match node {
        Kind::Leaf(leaf) => {
            assert_eq!(leaf.keys.len(), leaf.vals.len(), "a key without value");
            (leaf.keys.len(), 1)
        }
        Kind::Inner(inner) => {
            assert_eq!(inner.keys.len() + 1, inner.children.len());
            let mut entries = 0;
            let mut depth = None;
            for (i, child) in node.children().enumerate() {
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
    fn descend(&mut self, mut node: NodeRef<'a, K, V>, last: bool) {
        loop {
            match node {
                Kind::Inner(inner) => {
                    let i = if last { inner.children.len() - 1 } else { 0 };
                    self.path.push((inner, i));
                    node = inner.child(i);
                }
                Kind::Leaf(leaf) => {
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
                let child = inner.child(top.1);
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
                let child = inner.child(top.1);
                self.descend(child, true);
                return true;
            }
            self.path.pop();
        }
    }

    /// Cursor at the first entry inside `lower`, if any.
    fn seek_lower(root: NodeRef<'a, K, V>, lower: Bound<&K>) -> Option<Self> {
        let mut path = Vec::new();
        let mut node = root;
        loop {
            match node {
                Kind::Inner(inner) => {
                    let i = match lower {
                        Bound::Unbounded => 0,
                        Bound::Included(k) | Bound::Excluded(k) => child_index(&inner.keys, k),
                    };
                    path.push((inner, i));
                    node = inner.child(i);
                }
                Kind::Leaf(leaf) => {
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
    fn seek_upper(root: NodeRef<'a, K, V>, upper: Bound<&K>) -> Option<Self> {
        let mut path = Vec::new();
        let mut node = root;
        loop {
            match node {
                Kind::Inner(inner) => {
                    let i = match upper {
                        Bound::Unbounded => inner.children.len() - 1,
                        Bound::Included(k) => child_index(&inner.keys, k),
                        Bound::Excluded(k) => inner.keys.partition_point(|s| s < k),
                    };
                    path.push((inner, i));
                    node = inner.child(i);
                }
                Kind::Leaf(leaf) => {
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
        if let Some(root) = &self.root {
            visit_nodes(root.node(), &mut |node| {
                out.insert(node.addr());
            });
        }
    }

    /// Walks the nodes of this version whose address is not in `known`,
    /// skipping a known node's subtree whole (shared nodes are immutable, so a
    /// version that reaches a node reaches all below it). Returns the unknown
    /// nodes and their bytes: the node (entries inline, sized to its type:
    /// leaf or inner), its `Arc` header, any buffer a node larger than
    /// [`INLINE`] spilled to, plus `key_bytes` of each key for what keys own
    /// out of line.
    pub fn walk_unknown(
        &self,
        known: &HashSet<usize>,
        key_bytes: &impl Fn(&K) -> usize,
    ) -> (usize, usize) {
        fn walk<K, V>(
            node: NodeRef<'_, K, V>,
            known: &HashSet<usize>,
            key_bytes: &impl Fn(&K) -> usize,
            acc: &mut (usize, usize),
        ) {
            if known.contains(&node.addr()) {
                return;
            }
            let (keys, out_of_line) = match node {
                Kind::Leaf(leaf) => (&leaf.keys, spilled_bytes(&leaf.vals)),
                Kind::Inner(inner) => (
                    &inner.keys,
                    kind!(&inner.children, children => spilled_bytes(children)),
                ),
            };
            acc.0 += 1;
            acc.1 += kind!(node, node => std::mem::size_of_val(node))
                + 2 * std::mem::size_of::<usize>()
                + spilled_bytes(keys)
                + keys.iter().map(key_bytes).sum::<usize>()
                + out_of_line;
            for child in node.children() {
                walk(child, known, key_bytes, acc);
            }
        }
        let mut acc = (0, 0);
        if let Some(root) = &self.root {
            walk(root.node(), known, key_bytes, &mut acc);
        }
        acc
    }

    /// Calls `f` for every leaf in key order with its address (an identity,
    /// valid while this version is held), its keys and their values. A leaf at the same
    /// address in two held versions is the same leaf with the same entries
    /// (nodes are immutable once shared): incremental checkpoints reuse what
    /// they wrote for it.
    pub fn for_each_leaf(&self, f: &mut impl FnMut(usize, &[K], &[V])) {
        if let Some(root) = &self.root {
            visit_nodes(root.node(), &mut |node| {
                if let Kind::Leaf(leaf) = node {
                    f(node.addr(), &leaf.keys, &leaf.vals);
                }
            });
        }
    }

    /// A weak reference to every node: a probe is dead once no version holds
    /// that node any more (leak tests: released snapshots free their nodes).
    pub fn node_probes(&self) -> Vec<Weak<dyn Any>>
    where
        K: 'static,
        V: 'static,
    {
        fn probe<N: Any>(node: &Arc<N>) -> Weak<dyn Any> {
            let any: Arc<dyn Any> = node.clone();
            Arc::downgrade(&any)
        }
        fn walk<K: 'static, V: 'static>(inner: &Arc<Inner<K, V>>, out: &mut Vec<Weak<dyn Any>>) {
            out.push(probe(inner));
            match &inner.children {
                Kind::Leaf(leaves) => out.extend(leaves.iter().map(probe)),
                Kind::Inner(inners) => inners.iter().for_each(|child| walk(child, out)),
            }
        }
        let mut out = Vec::new();
        match &self.root {
            Some(Kind::Leaf(leaf)) => out.push(probe(leaf)),
            Some(Kind::Inner(inner)) => walk(inner, &mut out),
            None => {}
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
            weak.extend(version.node_probes());
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
