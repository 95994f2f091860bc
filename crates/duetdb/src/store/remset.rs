//! The shared remembered set (remset) of one collection: the stable versions of
//! records changed or deleted while VLS scans that still needed them were running.
//!
//! Each entry holds one superseded version (a pointer to the immutable document:
//! the bytes are moved out of the heap slot, never copied) and a *remset status
//! mask*: bit `i` is 0 while the scan in slot `i` still has to read the entry.
//!
//! Invariants:
//! - an entry is inserted only by the writer, with the mask computed from the
//!   record's status mask under the VLS protocol (see `vls.rs`); there is at most
//!   one entry per (record, scan) pair with the scan's bit 0;
//! - only the scan in slot `i` clears bit `i` of an entry (0 → 1), exactly once;
//! - with immediate reclamation, the scan that sets the last 0 bit to 1 removes
//!   the entry at once: no entry whose mask is all ones outlives that moment;
//! - in the comparison mode "one remset per scan" the writer inserts one entry
//!   per needing scan (as if each scan kept its own copy); in "reclaim at scan
//!   end" mode fully-read entries are removed only when a scan ends.

use std::collections::BTreeMap;
#[cfg(debug_assertions)]
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use parking_lot::Mutex;

use crate::doc::DocRef;
use crate::store::heap::RecordId;
use crate::store::vls::{Mask, WORDS_MAX};

/// How the remset is kept (the last two exist only for the benchmarks' comparisons).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum RemsetMode {
    /// One shared remset, immediate reclamation (the VLS paper's design).
    #[default]
    Shared,
    /// One entry per needing scan ("individual remsets").
    PerScan,
    /// Shared, but fully-read entries are removed only when a scan ends.
    ReclaimAtScanEnd,
}

/// One remembered version.
#[derive(Debug)]
pub struct Entry {
    pub rid: RecordId,
    pub doc: DocRef,
    mask: [AtomicU64; WORDS_MAX],
}

impl Entry {
    /// Is bit `slot` still 0 (the scan in `slot` still needs this version)?
    pub fn needed_by(&self, slot: usize) -> bool {
        self.mask[slot / 64].load(Ordering::Acquire) & (1 << (slot % 64)) == 0
    }
}

/// Figures of one remset (also summed per database for metrics).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RemsetStats {
    pub entries: u64,
    pub bytes: u64,
    pub entries_peak: u64,
    pub bytes_peak: u64,
    /// Entries that were needed by more than one scan when inserted.
    pub shared_inserts: u64,
    /// Entries inserted (in `PerScan` mode one per needing scan, so more
    /// than the versions kept).
    pub inserts: u64,
    pub reclaimed: u64,
    /// Versions kept: calls of [`Remset::insert`], the same in every mode.
    pub insert_calls: u64,
    /// The sum over the versions kept of the number of scans that needed
    /// each when it was inserted (the same in every mode); divided by
    /// `insert_calls`, the mean number of scans a version serves.
    pub needing_total: u64,
}

#[derive(Default)]
struct Inner {
    next_id: u64,
    /// By id, i.e. in insertion order: a scan's remset pass walks it in
    /// batches from where the last batch stopped (no collect-and-sort of the
    /// whole set, and the writer's inserts wait for one batch at most).
    entries: BTreeMap<u64, Arc<Entry>>,
    stats: RemsetStats,
    /// Debug builds: the live entries of each record, to check that no two of
    /// them are needed by the same scan.
    #[cfg(debug_assertions)]
    by_rid: HashMap<RecordId, Vec<u64>>,
}

impl Inner {
    /// At most one entry per (record, scan) with the scan's bit 0: the writer's
    /// CAS marked the record "changed" for every scan it kept a version for, so
    /// a later supersede keeps nothing more for them. A second entry would make
    /// a scan read two versions of one record.
    #[cfg(debug_assertions)]
    fn check_unique(&self, rid: RecordId, mask: Mask, words: usize) {
        for id in self.by_rid.get(&rid).into_iter().flatten() {
            if let Some(e) = self.entries.get(id) {
                let old = Mask::from_atomic(&e.mask);
                for w in 0..words {
                    let both = !old.0[w] & !mask.0[w];
                    assert!(
                        both == 0,
                        "two remset entries of record {rid} needed by slot {}",
                        w * 64 + both.trailing_zeros() as usize
                    );
                }
            }
        }
    }
}

/// The remset of one collection.
pub struct Remset {
    words: usize,
    mode: RemsetMode,
    inner: Mutex<Inner>,
}

impl Remset {
    pub fn new(words: usize, mode: RemsetMode) -> Remset {
        debug_assert!((1..=WORDS_MAX).contains(&words));
        Remset {
            words,
            mode,
            inner: Mutex::new(Inner::default()),
        }
    }

    pub fn mode(&self) -> RemsetMode {
        self.mode
    }

    /// Remember `doc` (the version of `rid` being replaced) for the scans whose bit
    /// is 0 in `mask`. Requires: called by the writer; `mask` has a 0 bit.
    pub fn insert(&self, rid: RecordId, doc: &DocRef, mask: Mask) {
        let needing = mask.zeros(self.words);
        debug_assert!(needing > 0, "remset insert without a needing scan");
        let bytes = doc.as_bytes().len() as u64;
        let mut inner = self.inner.lock();
        #[cfg(debug_assertions)]
        inner.check_unique(rid, mask, self.words);
        inner.stats.insert_calls += 1;
        inner.stats.needing_total += needing as u64;
        let add = |inner: &mut Inner, m: Mask| {
            let id = inner.next_id;
            inner.next_id += 1;
            #[cfg(debug_assertions)]
            inner.by_rid.entry(rid).or_default().push(id);
            let entry = Entry {
                rid,
                doc: doc.clone(),
                mask: m.to_atomic(),
            };
            inner.entries.insert(id, Arc::new(entry));
            inner.stats.entries += 1;
            inner.stats.bytes += bytes;
            inner.stats.inserts += 1;
        };
        match self.mode {
            RemsetMode::PerScan => {
                for slot in mask.zero_slots(self.words) {
                    add(&mut inner, Mask::all_ones_except(slot));
                }
            }
            _ => {
                if needing > 1 {
                    inner.stats.shared_inserts += 1;
                }
                add(&mut inner, mask);
            }
        }
        let s = &mut inner.stats;
        s.entries_peak = s.entries_peak.max(s.entries);
        s.bytes_peak = s.bytes_peak.max(s.bytes);
    }

    /// The entries the scan in `slot` still has to visit, in insertion order.
    pub fn pending_for(&self, slot: usize) -> Vec<(u64, Arc<Entry>)> {
        let mut all = Vec::new();
        let mut from = Some(0);
        while let Some(f) = from {
            from = self.pending_batch(slot, f, usize::MAX, &mut all);
        }
        all
    }

    /// Append to `out` the entries the scan in `slot` still has to visit
    /// among the next `max` entries with ids from `from` on (insertion
    /// order), and return the id to continue from (`None`: none left). The
    /// lock is held for this batch only.
    pub fn pending_batch(
        &self,
        slot: usize,
        from: u64,
        max: usize,
        out: &mut Vec<(u64, Arc<Entry>)>,
    ) -> Option<u64> {
        let inner = self.inner.lock();
        for (examined, (id, e)) in inner.entries.range(from..).enumerate() {
            if examined == max {
                return Some(*id);
            }
            if e.needed_by(slot) {
                out.push((*id, e.clone()));
            }
        }
        None
    }

    /// Call `f` on every entry the scan in `slot` still has to visit, in
    /// insertion order, a batch at a time and outside the lock (`f` may
    /// release the entry).
    pub fn for_each_pending(&self, slot: usize, mut f: impl FnMut(u64, &Arc<Entry>)) {
        const BATCH: usize = 256;
        let mut batch = Vec::with_capacity(BATCH);
        let mut from = Some(0);
        while let Some(start) = from {
            batch.clear();
            from = self.pending_batch(slot, start, BATCH, &mut batch);
            for (id, entry) in &batch {
                f(*id, entry);
            }
        }
    }

    /// The scan in `slot` is done with entry `id`: set its bit, and reclaim the
    /// entry when no scan needs it any more (immediately, in `Shared` mode).
    pub fn release(&self, slot: usize, id: u64, entry: &Entry) {
        let bit = 1u64 << (slot % 64);
        let prev = entry.mask[slot / 64].fetch_or(bit, Ordering::AcqRel);
        debug_assert!(prev & bit == 0, "a scan released an entry twice");
        if self.mode == RemsetMode::ReclaimAtScanEnd {
            return;
        }
        if Mask::from_atomic(&entry.mask).is_all_ones(self.words) {
            self.remove(id);
        }
    }

    fn remove(&self, id: u64) {
        let mut inner = self.inner.lock();
        if let Some(e) = inner.entries.remove(&id) {
            #[cfg(debug_assertions)]
            if let Some(ids) = inner.by_rid.get_mut(&e.rid) {
                ids.retain(|i| *i != id);
                if ids.is_empty() {
                    inner.by_rid.remove(&e.rid);
                }
            }
            inner.stats.entries -= 1;
            inner.stats.bytes -= e.doc.as_bytes().len() as u64;
            inner.stats.reclaimed += 1;
        }
    }

    /// Remove every entry no scan needs (the end-of-scan sweep of the
    /// `ReclaimAtScanEnd` mode; a no-op otherwise since such entries are gone).
    pub fn sweep(&self) {
        let ids: Vec<u64> = {
            let inner = self.inner.lock();
            inner
                .entries
                .iter()
                .filter(|(_, e)| Mask::from_atomic(&e.mask).is_all_ones(self.words))
                .map(|(id, _)| *id)
                .collect()
        };
        for id in ids {
            self.remove(id);
        }
    }

    pub fn stats(&self) -> RemsetStats {
        self.inner.lock().stats
    }

    /// Start a new measurement window: peaks drop to the current values.
    pub fn reset_peaks(&self) {
        let mut inner = self.inner.lock();
        inner.stats.entries_peak = inner.stats.entries;
        inner.stats.bytes_peak = inner.stats.bytes;
    }

    /// Forget everything (the collection was dropped: no scan can read it any more).
    pub fn clear(&self) {
        let mut inner = self.inner.lock();
        let n = inner.entries.len() as u64;
        inner.entries.clear();
        #[cfg(debug_assertions)]
        inner.by_rid.clear();
        inner.stats.reclaimed += n;
        inner.stats.entries = 0;
        inner.stats.bytes = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bson::rawdoc;

    /// A planted protocol violation (the writer keeping a second version of a
    /// record for a scan that still needs the first) is caught.
    #[test]
    #[cfg(debug_assertions)]
    #[should_panic(expected = "two remset entries of record 7 needed by slot 3")]
    fn a_second_entry_for_the_same_record_and_scan_is_caught() {
        let r = Remset::new(1, RemsetMode::Shared);
        let doc: DocRef = Arc::new(rawdoc! {"_id": 7});
        r.insert(7, &doc, Mask::all_ones_except(3));
        r.insert(7, &doc, Mask::all_ones_except(3));
    }

    #[test]
    fn entries_of_one_record_for_different_scans_are_fine() {
        let r = Remset::new(1, RemsetMode::Shared);
        let doc: DocRef = Arc::new(rawdoc! {"_id": 7});
        r.insert(7, &doc, Mask::all_ones_except(3));
        for (id, e) in r.pending_for(3) {
            r.release(3, id, &e);
        }
        r.insert(7, &doc, Mask::all_ones_except(3));
        r.insert(7, &doc, Mask::all_ones_except(4));
        assert_eq!(r.stats().entries, 2);
    }

    /// Versions kept and the scans needing them count the same in both
    /// modes; only the entries differ (one per needing scan in `PerScan`).
    #[test]
    fn needing_counts_are_per_version_in_every_mode() {
        let doc: DocRef = Arc::new(rawdoc! {"_id": 1});
        for mode in [RemsetMode::Shared, RemsetMode::PerScan] {
            let r = Remset::new(1, mode);
            let mut three = Mask::all_ones_except(1);
            three.0[0] &= !0b1100;
            r.insert(1, &doc, three);
            r.insert(2, &doc, Mask::all_ones_except(5));
            let s = r.stats();
            assert_eq!((s.insert_calls, s.needing_total), (2, 4), "{mode:?}");
            let entries = if mode == RemsetMode::PerScan { 4 } else { 2 };
            assert_eq!((s.inserts, s.entries), (entries, entries), "{mode:?}");
        }
    }

    /// The batched walk of a scan's remset pass sees exactly the entries its
    /// slot needs, in insertion order, across batch boundaries, while it
    /// releases (and so removes) each entry it visits.
    #[test]
    fn the_pending_walk_visits_each_needed_entry_once_in_order() {
        let r = Remset::new(1, RemsetMode::Shared);
        let doc: DocRef = Arc::new(rawdoc! {"_id": 1});
        // 700 entries (beyond two batches): slot 3 needs the even ones,
        // slot 4 every one.
        for rid in 0..700u64 {
            let mut mask = Mask::all_ones_except(4);
            if rid % 2 == 0 {
                mask.0[0] &= !(1 << 3);
            }
            r.insert(rid, &doc, mask);
        }
        let mut seen = Vec::new();
        r.for_each_pending(3, |id, e| {
            seen.push(e.rid);
            r.release(3, id, e);
        });
        assert_eq!(seen, (0..700).step_by(2).collect::<Vec<_>>());
        assert!(r.pending_for(3).is_empty());
        // Slot 4 still needs all 700; releasing them empties the remset.
        let mut n = 0;
        r.for_each_pending(4, |id, e| {
            n += 1;
            r.release(4, id, e);
        });
        assert_eq!(n, 700);
        assert_eq!(r.stats().entries, 0);
        // A batch bounds the entries examined, not only those returned.
        r.insert(0, &doc, Mask::all_ones_except(5));
        r.insert(1, &doc, Mask::all_ones_except(6));
        let mut out = Vec::new();
        let next = r.pending_batch(6, 0, 1, &mut out);
        assert!(out.is_empty(), "the first entry is slot 5's");
        let next = next.expect("one entry left to examine");
        assert_eq!(r.pending_batch(6, next, 1, &mut out), None);
        assert_eq!(out.len(), 1);
    }
}
