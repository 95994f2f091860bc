//! Delta indexing (DStore's delta buffers): the writer records a secondary
//! index's changes in small persistent layers beside the index's merged
//! B+tree instead of copying a path of the big tree per change; a merger
//! (`write::delta`) folds a frozen layer into the tree off the writer's
//! thread, in key order, and the writer installs the result.
//!
//! An index version is `tree` (the merged root) plus at most two layers:
//! `frozen` (cut from `active` and handed to the merger; immutable, shared by
//! `Arc` so the writer can tell whether a merge result still applies) and
//! `active` (where the writer's changes go). Each layer maps an entry
//! `(key, record id)` to its *net* effect relative to everything below it:
//! `true` — present although the layers below lack it; `false` — absent
//! although they hold it. A change that undoes an earlier one in the same
//! layer removes that layer entry instead (DStore's compaction of the buffer:
//! an update that moves a key and moves it back leaves nothing to merge).
//!
//! Invariants (of every index version with delta layers):
//! - `active` entries are net relative to `tree` + `frozen`, and `frozen`'s
//!   relative to `tree`: an `insert` marks an entry absent below, a `remove`
//!   one present below (the writer only inserts absent and removes present
//!   entries, `store::collection`'s contract);
//! - the fresh view (what every ordinary read and every unique check sees)
//!   is `tree` with `frozen`, then `active`, applied: the topmost layer that
//!   names an entry decides;
//! - `tree` alone (the stale view) is the fresh view of an earlier version:
//!   `frozen` is cut whole from `active` and `tree` changes only when a whole
//!   `frozen` is folded in, so `tree` always equals the fresh view as of the
//!   moment some earlier layer was cut;
//! - layers are persistent B+trees: cloning an index version is O(1), and a
//!   published version's layers never change.

use std::cmp::Ordering;
use std::ops::Bound;

use crate::store::btree::{BTree, Range};
use crate::store::heap::RecordId;
use crate::store::index::IndexKey;

/// Which view of its indexes a read uses (`$duet: {indexRead}`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub enum IndexRead {
    /// Merged trees and delta layers: exactly the read's state (the default).
    #[default]
    Fresh,
    /// Merged trees only: an earlier state of the indexes, cheaper to scan;
    /// the documents fetched are the read's own state (so filters still
    /// hold of every result, but entries newer than the last merge are
    /// missed).
    Stale,
}

impl IndexRead {
    pub fn name(self) -> &'static str {
        match self {
            IndexRead::Fresh => "fresh",
            IndexRead::Stale => "stale",
        }
    }
}

impl std::str::FromStr for IndexRead {
    type Err = String;

    fn from_str(s: &str) -> std::result::Result<Self, Self::Err> {
        match s {
            "fresh" => Ok(IndexRead::Fresh),
            "stale" => Ok(IndexRead::Stale),
            other => Err(format!(
                "unknown indexRead '{other}' (supported: fresh, stale)"
            )),
        }
    }
}

/// One index entry: its key and the record it points at.
pub type Entry = (IndexKey, RecordId);

/// One delta layer: net entry changes relative to the layers below it.
#[derive(Debug, Clone, Default)]
pub struct DeltaLayer {
    /// `true`: the entry is present (absent below); `false`: removed.
    map: BTree<Entry, bool>,
    /// How many of `map`'s entries are `true`.
    inserts: usize,
}

impl DeltaLayer {
    /// Entries this layer names (inserts and removes).
    pub fn len(&self) -> usize {
        self.map.len()
    }

    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }

    pub fn inserts(&self) -> usize {
        self.inserts
    }

    pub fn removes(&self) -> usize {
        self.map.len() - self.inserts
    }

    /// The entry becomes present. Requires: absent in the view this layer
    /// tops (so a `false` here is undone, anything else recorded).
    pub fn insert(&mut self, e: Entry) {
        match self.map.get(&e) {
            Some(false) => {
                self.map.remove(&e);
            }
            Some(true) => debug_assert!(false, "delta insert of a present entry"),
            None => {
                self.map.insert(e, true);
                self.inserts += 1;
            }
        }
    }

    /// The entry becomes absent. Requires: present in the view this layer tops.
    pub fn remove(&mut self, e: Entry) {
        match self.map.get(&e) {
            Some(true) => {
                self.map.remove(&e);
                self.inserts -= 1;
            }
            Some(false) => debug_assert!(false, "delta remove of an absent entry"),
            None => {
                self.map.insert(e, false);
            }
        }
    }

    /// Fold this layer into `tree` (the view it tops), in key order: a leaf
    /// is copied the first time one of its entries changes and edited in
    /// place after that (`Arc::make_mut`), so a merge of many entries copies
    /// each touched node once instead of one root-to-leaf path per entry.
    pub fn apply_to(&self, tree: &mut BTree<Entry, ()>) {
        for (e, present) in self.map.iter() {
            if *present {
                tree.insert(e.clone(), ());
            } else {
                tree.remove(e);
            }
        }
    }

    pub fn range<'a>(&'a self, lo: Bound<&Entry>, hi: Bound<&Entry>) -> Range<'a, Entry, bool> {
        self.map.range(lo, hi)
    }

    /// The layer's own B+tree (checkpoint accounting, tests).
    pub fn map(&self) -> &BTree<Entry, bool> {
        &self.map
    }
}

/// A double-ended iterator with one look-ahead slot per end. The two slots
/// never hold the same item: an end that finds the inner iterator empty
/// takes the other end's slot instead.
struct Peek<I: DoubleEndedIterator> {
    inner: I,
    front: Option<I::Item>,
    back: Option<I::Item>,
}

impl<I: DoubleEndedIterator> Peek<I> {
    fn new(inner: I) -> Self {
        Peek {
            inner,
            front: None,
            back: None,
        }
    }

    fn front(&mut self) -> Option<&I::Item> {
        if self.front.is_none() {
            self.front = self.inner.next().or_else(|| self.back.take());
        }
        self.front.as_ref()
    }

    fn back(&mut self) -> Option<&I::Item> {
        if self.back.is_none() {
            self.back = self.inner.next_back().or_else(|| self.front.take());
        }
        self.back.as_ref()
    }
}

type TreeIter<'a> = Peek<Range<'a, Entry, ()>>;
type LayerIter<'a> = Peek<Range<'a, Entry, bool>>;

/// The fresh view of a key range: the merged tree's entries and the layers'
/// merged in key order, the topmost layer deciding each entry.
pub struct Merged<'a> {
    tree: TreeIter<'a>,
    layers: Vec<LayerIter<'a>>,
}

/// Entries of an index's key range in its fresh view (see the module doc).
pub enum IndexRange<'a> {
    /// No delta layers: the tree's own range.
    Tree(Range<'a, Entry, ()>),
    Merged(Box<Merged<'a>>),
}

impl<'a> IndexRange<'a> {
    /// `layers` bottom first (frozen, then active).
    pub fn new(
        tree: &'a BTree<Entry, ()>,
        layers: &[&'a DeltaLayer],
        lo: Bound<&Entry>,
        hi: Bound<&Entry>,
    ) -> IndexRange<'a> {
        if layers.iter().all(|l| l.is_empty()) {
            return IndexRange::Tree(tree.range(lo, hi));
        }
        IndexRange::Merged(Box::new(Merged {
            tree: Peek::new(tree.range(lo, hi)),
            layers: layers
                .iter()
                .filter(|l| !l.is_empty())
                .map(|l| Peek::new(l.range(lo, hi)))
                .collect(),
        }))
    }
}

impl<'a> Merged<'a> {
    /// The next entry from the front (`back == false`) or the back.
    fn step(&mut self, back: bool) -> Option<(&'a Entry, &'a ())> {
        // `better(a, b)`: a comes before b in the walk's direction.
        let better = |a: &Entry, b: &Entry| {
            let o = a.cmp(b);
            if back {
                o == Ordering::Greater
            } else {
                o == Ordering::Less
            }
        };
        loop {
            let mut next: Option<&'a Entry> = if back {
                self.tree.back().map(|(e, _)| *e)
            } else {
                self.tree.front().map(|(e, _)| *e)
            };
            for l in &mut self.layers {
                let head = if back { l.back() } else { l.front() };
                if let Some((e, _)) = head {
                    if next.is_none_or(|n| better(e, n)) {
                        next = Some(*e);
                    }
                }
            }
            let e = next?;
            // Take `e` from every source that holds it; the topmost decides.
            let take_tree = |p: &mut TreeIter<'a>| {
                let head = if back { p.back() } else { p.front() };
                if head.is_some_and(|(h, _)| *h == e) {
                    if back {
                        p.back = None;
                    } else {
                        p.front = None;
                    }
                    true
                } else {
                    false
                }
            };
            let mut present = take_tree(&mut self.tree);
            for l in &mut self.layers {
                let head = if back { l.back() } else { l.front() };
                if let Some((h, op)) = head {
                    if *h == e {
                        present = **op;
                        if back {
                            l.back = None;
                        } else {
                            l.front = None;
                        }
                    }
                }
            }
            if present {
                return Some((e, &()));
            }
        }
    }
}

impl<'a> Iterator for IndexRange<'a> {
    type Item = (&'a Entry, &'a ());

    fn next(&mut self) -> Option<Self::Item> {
        match self {
            IndexRange::Tree(r) => r.next(),
            IndexRange::Merged(m) => m.step(false),
        }
    }
}

impl DoubleEndedIterator for IndexRange<'_> {
    fn next_back(&mut self) -> Option<Self::Item> {
        match self {
            IndexRange::Tree(r) => r.next_back(),
            IndexRange::Merged(m) => m.step(true),
        }
    }
}

/// Compare two entries' record ids only (tests).
#[cfg(test)]
fn rid(e: &Entry) -> RecordId {
    e.1
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::index::{IndexSpec, KeyPart};
    use bson::{doc, RawBson, RawBsonRef};
    use proptest::prelude::*;
    use std::collections::BTreeSet;

    fn entry(k: i32, r: u64) -> Entry {
        let spec = IndexSpec::new(&doc! {"a": 1}, None, false).expect("spec");
        (
            spec.bound_key(vec![KeyPart::Val(RawBson::Int32(k))], KeyPart::Low),
            r,
        )
    }

    proptest! {
        /// Random inserts and removes through an active layer, cut to a
        /// frozen one and folded at random: the merged view equals a plain
        /// set at every step, forwards, backwards and from both ends at
        /// once, and the tree alone equals the set as of the last cut.
        #[test]
        fn layers_equal_a_plain_set(
            ops in proptest::collection::vec((0i32..12, 0u64..4, 0u8..10), 1..120),
        ) {
            let mut tree: BTree<Entry, ()> = BTree::with_fanout(4);
            let mut frozen: Option<DeltaLayer> = None;
            let mut active = DeltaLayer::default();
            let mut model: BTreeSet<(i32, u64)> = BTreeSet::new();
            let mut at_cut: BTreeSet<(i32, u64)> = BTreeSet::new();
            let mut merged_model: BTreeSet<(i32, u64)> = BTreeSet::new();
            for (k, r, what) in ops {
                match what {
                    0 => {
                        // Cut (when nothing is frozen) or fold the frozen layer.
                        if let Some(f) = frozen.take() {
                            f.apply_to(&mut tree);
                            merged_model = at_cut.clone();
                        } else {
                            frozen = Some(std::mem::take(&mut active));
                            at_cut = model.clone();
                        }
                    }
                    _ => {
                        if model.contains(&(k, r)) {
                            model.remove(&(k, r));
                            active.remove(entry(k, r));
                        } else {
                            model.insert((k, r));
                            active.insert(entry(k, r));
                        }
                    }
                }
                let layers: Vec<&DeltaLayer> = frozen.iter().chain([&active]).collect();
                let want: Vec<(i32, u64)> = model.iter().copied().collect();
                let key = |e: &Entry| match e.0.value(0) {
                    Some(RawBsonRef::Int32(k)) => (k, rid(e)),
                    _ => unreachable!("test keys are ints"),
                };
                let fwd: Vec<_> = IndexRange::new(&tree, &layers, Bound::Unbounded, Bound::Unbounded)
                    .map(|(e, _)| key(e)).collect();
                prop_assert_eq!(&fwd, &want);
                let mut rev: Vec<_> = IndexRange::new(&tree, &layers, Bound::Unbounded, Bound::Unbounded)
                    .rev().map(|(e, _)| key(e)).collect();
                rev.reverse();
                prop_assert_eq!(&rev, &want);
                // Both ends at once meet without losing or repeating an entry.
                let mut it = IndexRange::new(&tree, &layers, Bound::Unbounded, Bound::Unbounded);
                let (mut front, mut back) = (Vec::new(), Vec::new());
                while let Some((e, _)) = it.next() {
                    front.push(key(e));
                    match it.next_back() { Some((e, _)) => back.push(key(e)), None => break }
                }
                back.reverse();
                front.extend(back);
                prop_assert_eq!(&front, &want);
                // A bounded range.
                let (lo, hi) = (entry(3, 0), entry(8, 0));
                let part: Vec<_> = IndexRange::new(&tree, &layers, Bound::Included(&lo), Bound::Excluded(&hi))
                    .map(|(e, _)| key(e)).collect();
                let want_part: Vec<_> = want.iter().copied().filter(|(k, _)| (3..8).contains(k)).collect();
                prop_assert_eq!(part, want_part);
                // The stale view: the state as of the last folded cut.
                let stale: Vec<_> = tree.iter().map(|(e, _)| key(e)).collect();
                prop_assert_eq!(stale, merged_model.iter().copied().collect::<Vec<_>>());
                let net = frozen.as_ref().map_or(0, |f| f.inserts() as i64 - f.removes() as i64)
                    + active.inserts() as i64 - active.removes() as i64;
                prop_assert_eq!(tree.len() as i64 + net, model.len() as i64);
            }
        }
    }
}
