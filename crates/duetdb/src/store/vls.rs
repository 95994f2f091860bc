//! Virtual Lightweight Snapshots (the VLS paper's Table I), per collection.
//!
//! Every record has an N-bit *status mask* (N = 64 scan slots by default, 128
//! selectable), kept beside the heap in an array of atomics indexed by
//! `RecordId` (record ids are never reused, so a slot's mask belongs to one
//! record forever). Per collection there is a *stable mask* (which bit value
//! means "stable" for each slot — flipped when a full scan completes, so bits
//! never need a reset pass after full scans), a *local active mask* (bit 0 =
//! slot in use by a scan of this collection), slot allocation with a FIFO queue,
//! and one shared [`Remset`].
//!
//! ## The protocol (why reading and flipping is race-free)
//!
//! Scan registration, end of the table pass and slot release of stable bits are
//! writer-serialized commands, so a scan starts exactly at a commit boundary.
//! The race that remains is between the writer superseding record `r` and scan
//! `i` reading `r`. Both decide through a compare-and-swap on the word of `r`'s
//! status mask that holds bit `i`:
//!
//! - the writer (update or delete of `r`): atomically swap
//!   `status → !(stable ^ local_active)` (`STATUS_MASK_UPD`: "changed" for
//!   every active slot, "stable" for every inactive one) and compute, from the
//!   value it replaced, `temp = (stable ^ old) | local_active` (Table I
//!   `REMSET_MASK_INS`); then, if `temp` has a 0 bit, insert the *current*
//!   version into the remset with mask `temp`, then replace the record. (The
//!   paper's CAS loop always installs the same target whatever it read, so it
//!   is exactly one swap.)
//! - scan `i`, having read version `v` of `r` from a published state taken after
//!   its start: set its bit `i` to "not stable" with one atomic RMW
//!   (`fetch_or`/`fetch_and` depending on the slot's stable value,
//!   `STATUS_MASK_SCAN_UPD`); if the bit it replaced was "stable", `v` is the
//!   stable version: use it; otherwise skip `r`. ("Read" and "changed" are the
//!   same value, so the RMW is idempotent and needs no compare-and-retry.)
//!
//! Whichever RMW comes first decides where scan `i` gets `r`: if the scan's
//! comes first, no update of `r` has been applied since the scan started (an
//! update would have marked the bit first), so `v` — from a state no older than
//! the start — is the start version, and the writer then sees bit `i` read and
//! copies nothing for `i`. If the writer's comes first, the scan skips `r` and
//! finds the start version in the remset. Either way scan `i` reads `r` exactly
//! once, in its start version. Inserts get `!(stable ^ local_active)`, so active
//! scans skip them.
//!
//! A full scan that visited every record flips its stable bit when its table
//! pass ends (every surviving record's bit was flipped by the scan or the
//! writer). A scan that did not visit every record (index scans, early stop)
//! does not flip; instead a background pass sets its bit back to "stable" in
//! every record before the slot can be reused (the paper's background reset),
//! without stalling the writer. The pass reads each word first and writes only
//! the words whose bit is not stable: nothing sets an inactive slot's bit to
//! "not stable", so a bit read as stable stays so, and an index scan over a
//! small range leaves most of the array untouched (clean cache lines, no
//! locked instruction per record).

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use arc_swap::ArcSwap;
use parking_lot::{Condvar, Mutex};

use crate::doc::DocRef;
use crate::store::heap::RecordId;
use crate::store::remset::{Remset, RemsetMode, RemsetStats};

/// Most mask words (128 slots).
pub const WORDS_MAX: usize = 2;
/// Default number of scan slots.
pub const DEFAULT_SLOTS: usize = 64;
/// Status masks are allocated in chunks of this many records.
const CHUNK: usize = 4096;

/// An N-bit mask (N ≤ 128) held as words; unused words are all ones.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Mask(pub [u64; WORDS_MAX]);

impl Mask {
    pub const ONES: Mask = Mask([u64::MAX; WORDS_MAX]);
    pub const ZEROS: Mask = Mask([0; WORDS_MAX]);

    pub fn all_ones_except(slot: usize) -> Mask {
        let mut m = Mask::ONES;
        m.0[slot / 64] &= !(1 << (slot % 64));
        m
    }

    pub fn bit(slot: usize) -> Mask {
        let mut m = Mask::ZEROS;
        m.0[slot / 64] = 1 << (slot % 64);
        m
    }

    pub fn is_all_ones(&self, words: usize) -> bool {
        self.0[..words].iter().all(|w| *w == u64::MAX)
    }

    /// Number of 0 bits among the first `words` words.
    pub fn zeros(&self, words: usize) -> u32 {
        self.0[..words].iter().map(|w| w.count_zeros()).sum()
    }

    pub fn zero_slots(&self, words: usize) -> Vec<usize> {
        let mut v = Vec::new();
        for (w, word) in self.0[..words].iter().enumerate() {
            for b in 0..64 {
                if word & (1 << b) == 0 {
                    v.push(w * 64 + b);
                }
            }
        }
        v
    }

    pub fn to_atomic(self) -> [AtomicU64; WORDS_MAX] {
        [AtomicU64::new(self.0[0]), AtomicU64::new(self.0[1])]
    }

    pub fn from_atomic(a: &[AtomicU64; WORDS_MAX]) -> Mask {
        Mask([a[0].load(Ordering::Acquire), a[1].load(Ordering::Acquire)])
    }
}

/// The status masks of a collection's records: append-only chunks of atomics.
struct StatusArray {
    words: usize,
    chunks: ArcSwap<Vec<Arc<[AtomicU64]>>>,
}

impl StatusArray {
    fn new(words: usize) -> StatusArray {
        StatusArray {
            words,
            chunks: ArcSwap::from_pointee(Vec::new()),
        }
    }

    /// Run `f` on the mask words of `rid` (`words` atomics), if allocated.
    /// One load of the chunk list and no reference count traffic: the writer
    /// calls this on every update while a scan is active.
    fn with_mask<R>(&self, rid: RecordId, f: impl FnOnce(&[AtomicU64]) -> R) -> Option<R> {
        let chunks = self.chunks.load();
        let idx = usize::try_from(rid).ok()?;
        let chunk = chunks.get(idx / CHUNK)?;
        let at = (idx % CHUNK) * self.words;
        Some(f(&chunk[at..at + self.words]))
    }

    /// The chunk list as of now, for a scan to use over many records.
    fn view(&self) -> StatusView {
        StatusView {
            words: self.words,
            chunks: self.chunks.load_full(),
        }
    }

    /// Make sure `rid` has a mask. Requires: writer (the only appender).
    fn ensure(&self, rid: RecordId, init: Mask) {
        let Ok(idx) = usize::try_from(rid) else {
            return;
        };
        let chunks = self.chunks.load_full();
        if idx / CHUNK < chunks.len() {
            return;
        }
        let mut grown: Vec<Arc<[AtomicU64]>> = (*chunks).clone();
        while grown.len() <= idx / CHUNK {
            let chunk: Arc<[AtomicU64]> = (0..CHUNK * self.words)
                .map(|i| AtomicU64::new(init.0[i % self.words]))
                .collect();
            grown.push(chunk);
        }
        self.chunks.store(Arc::new(grown));
    }
}

/// A scan's cached view of the status chunks (reloaded per page of records).
/// Records that existed when the scan started always have their chunk here.
pub struct StatusView {
    words: usize,
    chunks: Arc<Vec<Arc<[AtomicU64]>>>,
}

impl StatusView {
    fn word(&self, rid: RecordId, w: usize) -> Option<&AtomicU64> {
        let idx = usize::try_from(rid).ok()?;
        self.chunks
            .get(idx / CHUNK)
            .map(|c| &c[(idx % CHUNK) * self.words + w])
    }
}

/// Slot allocation state (the paper's global *active mask*, per collection here:
/// stable bits are per collection, so slots are too).
struct Slots {
    /// Bit 1 = free.
    free: Mask,
    /// Waiting scans in arrival order (tickets).
    queue: VecDeque<u64>,
    next_ticket: u64,
    /// Slots being reset in the background (not free yet).
    resetting: u32,
}

/// Scan-visible figures.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct VlsStats {
    pub scans_active: u64,
    pub scans_queued: u64,
    pub scans_started: u64,
    pub queue_wait_us_total: u64,
    pub background_resets: u64,
    /// Status words the background resets had to write (the rest were
    /// already stable and were only read).
    pub reset_words_written: u64,
    pub remset: RemsetStats,
    /// Versions handed to running OLCP queries, in total and held right now.
    pub olcp_propagated: u64,
    pub olcp_inflight: u64,
}

/// The VLS bookkeeping of one collection; shared by all versions of it.
pub struct CollectionVls {
    words: usize,
    slots_n: usize,
    status: StatusArray,
    /// Written only by the writer (inside commands); read by the writer and scans.
    stable: [AtomicU64; WORDS_MAX],
    local_active: [AtomicU64; WORDS_MAX],
    slots: Mutex<Slots>,
    slot_freed: Condvar,
    pub remset: Remset,
    /// Bit 1 = the slot belongs to an OLCP query (propagation, no remset).
    olcp: [AtomicU64; WORDS_MAX],
    sinks: parking_lot::RwLock<Vec<Option<Arc<OlcpSink>>>>,
    propagated: AtomicU64,
    dropped: AtomicBool,
    scans_started: AtomicU64,
    queue_wait_us: AtomicU64,
    resets: AtomicU64,
    reset_written: AtomicU64,
}

impl std::fmt::Debug for CollectionVls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CollectionVls")
            .field("slots", &self.slots_n)
            .finish()
    }
}

/// Options of the VLS bookkeeping.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct VlsOptions {
    /// 64 or 128.
    pub slots: usize,
    pub remset: RemsetMode,
}

impl Default for VlsOptions {
    fn default() -> Self {
        VlsOptions {
            slots: DEFAULT_SLOTS,
            remset: RemsetMode::Shared,
        }
    }
}

impl CollectionVls {
    pub fn new(options: VlsOptions) -> CollectionVls {
        let slots_n = if options.slots > 64 { 128 } else { 64 };
        let words = slots_n / 64;
        let mut free = Mask::ZEROS;
        for w in 0..words {
            free.0[w] = u64::MAX;
        }
        CollectionVls {
            words,
            slots_n,
            status: StatusArray::new(words),
            stable: Mask::ZEROS.to_atomic(),
            local_active: Mask::ONES.to_atomic(),
            slots: Mutex::new(Slots {
                free,
                queue: VecDeque::new(),
                next_ticket: 0,
                resetting: 0,
            }),
            slot_freed: Condvar::new(),
            remset: Remset::new(words, options.remset),
            olcp: Mask::ZEROS.to_atomic(),
            sinks: parking_lot::RwLock::new(Vec::new()),
            propagated: AtomicU64::new(0),
            dropped: AtomicBool::new(false),
            scans_started: AtomicU64::new(0),
            queue_wait_us: AtomicU64::new(0),
            resets: AtomicU64::new(0),
            reset_written: AtomicU64::new(0),
        }
    }

    /// Fresh bookkeeping for a collection that already has records `0..next_rid`
    /// (a renamed collection): every existing record starts "stable".
    pub fn with_records(options: VlsOptions, next_rid: RecordId) -> CollectionVls {
        let v = CollectionVls::new(options);
        if next_rid > 0 {
            v.status.ensure(next_rid - 1, Mask::ZEROS);
        }
        v
    }

    pub fn slots(&self) -> usize {
        self.slots_n
    }

    fn stable(&self) -> Mask {
        Mask::from_atomic(&self.stable)
    }

    fn local_active(&self) -> Mask {
        Mask::from_atomic(&self.local_active)
    }

    /// No scan is active on this collection: writes need no bookkeeping.
    fn idle(&self) -> bool {
        self.local_active().is_all_ones(self.words)
    }

    // ---- writer side (called only inside writer commands) ----

    /// A record was inserted at `rid`: active scans must skip it (`STATUS_MASK_UPD`).
    pub fn on_insert(&self, rid: RecordId) {
        let stable = self.stable();
        let active = self.local_active();
        self.status.ensure(rid, stable);
        self.status.with_mask(rid, |mask| {
            for (w, word) in mask.iter().enumerate() {
                word.store(!(stable.0[w] ^ active.0[w]), Ordering::Release);
            }
        });
    }

    /// Record `rid` is about to be replaced or deleted; `current` is its version
    /// now. Keeps it in the remset for every active scan that has not read it.
    pub fn on_supersede(&self, rid: RecordId, current: &DocRef) {
        if self.idle() {
            return;
        }
        let stable = self.stable();
        let active = self.local_active();
        let mut temp = Mask::ONES;
        self.status.with_mask(rid, |mask| {
            for (w, word) in mask.iter().enumerate() {
                // The paper's CAS loop installs this target whatever it read:
                // one swap does the same, with no retry when a scan's RMW on
                // another bit of the word lands in between.
                let old = word.swap(!(stable.0[w] ^ active.0[w]), Ordering::AcqRel);
                temp.0[w] = (stable.0[w] ^ old) | active.0[w];
            }
        });
        if temp.is_all_ones(self.words) {
            return;
        }
        // OLCP slots get the version handed over at once (propagation); the
        // remaining slots share one remset entry.
        let olcp = Mask::from_atomic(&self.olcp);
        let mut to_propagate = Mask::ZEROS;
        for w in 0..self.words {
            to_propagate.0[w] = !temp.0[w] & olcp.0[w];
        }
        if !to_propagate.is_all_zeros(self.words) {
            let sinks = self.sinks.read();
            for slot in to_propagate.ones(self.words) {
                let sink = sinks.get(slot).and_then(Option::as_ref);
                // OLCP exactly-once: an OLCP bit without a sink would drop the
                // start version the query still needs. Both change only in
                // writer steps (sink set before the bit, bit cleared first).
                debug_assert!(sink.is_some(), "OLCP slot {slot} has no sink");
                if let Some(sink) = sink {
                    sink.push(rid, current);
                    self.propagated.fetch_add(1, Ordering::Relaxed);
                }
            }
            for w in 0..self.words {
                temp.0[w] |= to_propagate.0[w];
            }
        }
        if !temp.is_all_ones(self.words) {
            self.remset.insert(rid, current, temp);
        }
    }

    /// Make `slot` an OLCP slot: superseded versions it still needs go to `sink`.
    /// Requires: writer command, right after the slot was registered.
    pub fn attach_sink(&self, slot: usize, sink: Arc<OlcpSink>) {
        let mut sinks = self.sinks.write();
        if sinks.len() <= slot {
            sinks.resize(slot + 1, None);
        }
        sinks[slot] = Some(sink);
        drop(sinks);
        self.olcp[slot / 64].fetch_or(1 << (slot % 64), Ordering::AcqRel);
    }

    fn detach_sink(&self, slot: usize) {
        self.olcp[slot / 64].fetch_and(!(1 << (slot % 64)), Ordering::AcqRel);
        if let Some(s) = self.sinks.write().get_mut(slot) {
            *s = None;
        }
    }

    /// Allocate a slot for a new scan if one is free. Requires: writer command.
    pub fn try_register(&self, ticket: u64) -> Option<usize> {
        let mut slots = self.slots.lock();
        if slots.queue.front() != Some(&ticket) {
            return None; // FIFO: earlier arrivals first
        }
        let slot = (0..self.slots_n).find(|s| slots.free.0[s / 64] & (1 << (s % 64)) != 0)?;
        slots.free.0[slot / 64] &= !(1 << (slot % 64));
        slots.queue.pop_front();
        drop(slots);
        let bit = 1u64 << (slot % 64);
        let prev = self.local_active[slot / 64].fetch_and(!bit, Ordering::AcqRel);
        // A slot is attached to at most one scan: a free slot is inactive (its
        // previous scan ended its table pass) and carries no OLCP sink.
        debug_assert!(
            prev & bit != 0,
            "VLS slot {slot} handed out while still active"
        );
        debug_assert!(
            self.sinks.read().get(slot).is_none_or(Option::is_none),
            "VLS slot {slot} handed out with an OLCP sink still attached"
        );
        self.scans_started.fetch_add(1, Ordering::Relaxed);
        // Wake the next in line: it may find another free slot.
        self.slot_freed.notify_all();
        Some(slot)
    }

    /// Join the FIFO queue of scans waiting for a slot.
    pub fn take_ticket(&self) -> u64 {
        let mut slots = self.slots.lock();
        let t = slots.next_ticket;
        slots.next_ticket += 1;
        slots.queue.push_back(t);
        t
    }

    /// Wait until `ticket` is at the front and a slot is free (or `timeout`).
    pub fn wait_turn(&self, ticket: u64, timeout: Duration) {
        let mut slots = self.slots.lock();
        let deadline = Instant::now() + timeout;
        loop {
            let front = slots.queue.front() == Some(&ticket);
            let any_free = !Mask(slots.free.0).is_all_zeros(self.words);
            if front && any_free {
                return;
            }
            if self.slot_freed.wait_until(&mut slots, deadline).timed_out() {
                return;
            }
        }
    }

    /// Leave the queue without a slot (the scan gave up).
    pub fn abandon_ticket(&self, ticket: u64) {
        let mut slots = self.slots.lock();
        slots.queue.retain(|t| *t != ticket);
        drop(slots);
        self.slot_freed.notify_all();
    }

    pub fn record_wait(&self, waited: Duration) {
        self.queue_wait_us.fetch_add(
            u64::try_from(waited.as_micros()).unwrap_or(u64::MAX),
            Ordering::Relaxed,
        );
    }

    /// End of the table pass of the scan in `slot`. Requires: writer command.
    /// A scan that visited every record flips its stable bit; otherwise its bit
    /// must be reset in the background before the slot is reused.
    pub fn finish_table(&self, slot: usize, complete: bool) {
        let bit = 1u64 << (slot % 64);
        // Slot lifecycle: free -> registered (active) -> table pass ended
        // (inactive, still taken) -> released (free). Ending the table pass
        // twice, or of a slot nobody holds, would flip another scan's stable bit.
        debug_assert!(
            self.slots.lock().free.0[slot / 64] & bit == 0,
            "finish_table on VLS slot {slot}, which is free"
        );
        if complete {
            self.stable[slot / 64].fetch_xor(bit, Ordering::AcqRel);
        }
        let prev = self.local_active[slot / 64].fetch_or(bit, Ordering::AcqRel);
        debug_assert!(
            prev & bit == 0,
            "finish_table on VLS slot {slot}, whose table pass already ended"
        );
        self.detach_sink(slot);
    }

    /// Is `slot` in its table pass (the writer keeps versions for it)?
    pub fn is_active(&self, slot: usize) -> bool {
        self.local_active[slot / 64].load(Ordering::Acquire) & (1 << (slot % 64)) == 0
    }

    /// Release `slot` after the scan's remset pass. `reset`: set the slot's bit
    /// back to stable in every record first (in the background).
    pub fn release(self: &Arc<Self>, slot: usize, reset: bool) {
        // Each remset entry is released once per slot, all of them before the
        // slot itself: a reused slot must not inherit its previous scan's entries.
        debug_assert!(
            self.remset.pending_for(slot).is_empty(),
            "VLS slot {slot} released with remset entries it never read"
        );
        if self.remset.mode() == RemsetMode::ReclaimAtScanEnd {
            self.remset.sweep();
        }
        if !reset {
            self.free_slot(slot);
            return;
        }
        self.slots.lock().resetting += 1;
        self.resets.fetch_add(1, Ordering::Relaxed);
        let me = self.clone();
        let spawned = std::thread::Builder::new()
            .name("duet-vls-reset".into())
            .spawn(move || me.reset_and_free(slot));
        if spawned.is_err() {
            // No thread to spare: do it inline (slower for this caller, still correct).
            self.reset_and_free(slot);
        }
    }

    fn reset_and_free(&self, slot: usize) {
        let written = self.reset_bit(slot);
        self.reset_written.fetch_add(written, Ordering::Relaxed);
        self.slots.lock().resetting -= 1;
        self.free_slot(slot);
    }

    /// Set bit `slot` to its stable value in every record. The slot is inactive,
    /// so the writer sets the same value on any record it touches meanwhile.
    ///
    /// Each word is read first and written only when its bit is not stable
    /// (a plain load per record instead of a locked RMW): while the slot is
    /// inactive nothing sets its bit to "not stable" (the writer writes
    /// "stable" for inactive slots, and no scan claims through it), so a bit
    /// read as stable stays stable. Returns how many words it wrote.
    fn reset_bit(&self, slot: usize) -> u64 {
        let w = slot / 64;
        let bit = 1u64 << (slot % 64);
        let stable_bit = self.stable[w].load(Ordering::Acquire) & bit;
        // Chunks appended after this load are initialised from the stable
        // mask of their time and get "stable" for inactive slots on insert.
        let chunks = self.status.chunks.load_full();
        let mut written = 0;
        for chunk in chunks.iter() {
            for word in chunk.iter().skip(w).step_by(self.words) {
                if word.load(Ordering::Acquire) & bit == stable_bit {
                    continue;
                }
                written += 1;
                if stable_bit != 0 {
                    word.fetch_or(bit, Ordering::AcqRel);
                } else {
                    word.fetch_and(!bit, Ordering::AcqRel);
                }
            }
        }
        written
    }

    fn free_slot(&self, slot: usize) {
        let mut slots = self.slots.lock();
        debug_assert!(
            slots.free.0[slot / 64] & (1 << (slot % 64)) == 0,
            "VLS slot {slot} released twice"
        );
        slots.free.0[slot / 64] |= 1 << (slot % 64);
        drop(slots);
        self.slot_freed.notify_all();
    }

    // ---- scan side ----

    /// A view of the status masks for [`CollectionVls::claim`].
    pub fn status_view(&self) -> StatusView {
        self.status.view()
    }

    /// Scan `slot` read version `v` of `rid` from a state no older than its start:
    /// true when `v` is its stable version (and the record is now marked read).
    /// `view` must have been taken after the scan started.
    pub fn claim(&self, view: &StatusView, slot: usize, rid: RecordId) -> bool {
        let w = slot / 64;
        let bit = 1u64 << (slot % 64);
        let Some(word) = view.word(rid, w) else {
            return false;
        };
        // Claims happen only in the table pass: after finish_table the writer
        // no longer marks the slot's bits, so a late claim could read a record
        // twice (once here, once from the remset).
        debug_assert!(
            self.is_active(slot),
            "claim by VLS slot {slot} after its table pass"
        );
        let stable_bit = self.stable[w].load(Ordering::Acquire) & bit;
        // Set the bit to "not stable" ("read" and "changed" are one value):
        // one RMW, idempotent, so no load-compare-retry loop. The bit it
        // replaced says who came first.
        let old = if stable_bit == 0 {
            word.fetch_or(bit, Ordering::AcqRel)
        } else {
            word.fetch_and(!bit, Ordering::AcqRel)
        };
        // Not stable: changed or inserted since the scan started, or already read.
        old & bit == stable_bit
    }

    /// The collection was dropped: running scans must fail, the remset is freed.
    pub fn mark_dropped(&self) {
        self.dropped.store(true, Ordering::Release);
        self.remset.clear();
    }

    pub fn is_dropped(&self) -> bool {
        self.dropped.load(Ordering::Acquire)
    }

    pub fn stats(&self) -> VlsStats {
        let slots = self.slots.lock();
        let free = slots.free.zeros(self.words) as u64;
        let used_or_resetting = free; // zeros in `free` = slots taken
        VlsStats {
            scans_active: used_or_resetting - u64::from(slots.resetting),
            scans_queued: slots.queue.len() as u64,
            scans_started: self.scans_started.load(Ordering::Relaxed),
            queue_wait_us_total: self.queue_wait_us.load(Ordering::Relaxed),
            background_resets: self.resets.load(Ordering::Relaxed),
            reset_words_written: self.reset_written.load(Ordering::Relaxed),
            remset: self.remset.stats(),
            olcp_propagated: self.propagated.load(Ordering::Relaxed),
            olcp_inflight: self
                .sinks
                .read()
                .iter()
                .flatten()
                .map(|s| s.inflight.load(Ordering::Relaxed))
                .sum(),
        }
    }
}

impl Mask {
    fn is_all_zeros(&self, words: usize) -> bool {
        self.0[..words].iter().all(|w| *w == 0)
    }

    fn ones(&self, words: usize) -> Vec<usize> {
        let mut v = Vec::new();
        for (w, word) in self.0[..words].iter().enumerate() {
            let mut x = *word;
            while x != 0 {
                let b = x.trailing_zeros() as usize;
                v.push(w * 64 + b);
                x &= x - 1;
            }
        }
        v
    }
}

/// Where the writer hands superseded versions to one running OLCP query
/// (KVell+'s propagation): the query drains it as it goes, so what is held here
/// is bounded by the writes made since its last drain, not by its duration.
#[derive(Debug, Default)]
pub struct OlcpSink {
    items: Mutex<Vec<(RecordId, DocRef)>>,
    inflight: AtomicU64,
    inflight_peak: AtomicU64,
    propagated: AtomicU64,
    /// Records handed over so far (debug builds: each at most once).
    #[cfg(debug_assertions)]
    handed: Mutex<std::collections::HashSet<RecordId>>,
}

impl OlcpSink {
    fn push(&self, rid: RecordId, doc: &DocRef) {
        // Counters change under the same lock as the items, so a drain never
        // subtracts an item whose push has not been counted yet.
        let mut items = self.items.lock();
        // OLCP exactly-once: the writer's CAS marked the record "changed" for
        // this query, so a later supersede of it hands nothing over again.
        #[cfg(debug_assertions)]
        assert!(
            self.handed.lock().insert(rid),
            "record {rid} handed to an OLCP query twice"
        );
        items.push((rid, doc.clone()));
        self.propagated.fetch_add(1, Ordering::Relaxed);
        let now = self.inflight.fetch_add(1, Ordering::AcqRel) + 1;
        self.inflight_peak.fetch_max(now, Ordering::AcqRel);
    }

    /// Take everything handed over so far.
    pub fn drain(&self) -> Vec<(RecordId, DocRef)> {
        let mut guard = self.items.lock();
        let items = std::mem::take(&mut *guard);
        let before = self
            .inflight
            .fetch_sub(items.len() as u64, Ordering::AcqRel);
        debug_assert!(
            before >= items.len() as u64,
            "OLCP inflight count underflow"
        );
        items
    }

    /// Versions handed over and not drained yet.
    pub fn inflight(&self) -> u64 {
        self.inflight.load(Ordering::Relaxed)
    }

    /// Versions handed over in total.
    pub fn propagated(&self) -> u64 {
        self.propagated.load(Ordering::Relaxed)
    }

    /// Most versions held at once (handed over, not yet drained).
    pub fn inflight_peak(&self) -> u64 {
        self.inflight_peak.load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bson::rawdoc;

    fn registered() -> (Arc<CollectionVls>, usize) {
        let vls = Arc::new(CollectionVls::new(VlsOptions::default()));
        vls.on_insert(0);
        let ticket = vls.take_ticket();
        let slot = vls.try_register(ticket).expect("a free slot");
        (vls, slot)
    }

    #[test]
    fn the_slot_lifecycle_in_order_passes_the_checks() {
        let (vls, slot) = registered();
        let doc: DocRef = Arc::new(rawdoc! {"_id": 1});
        vls.on_supersede(0, &doc);
        for (id, e) in vls.remset.pending_for(slot) {
            vls.remset.release(slot, id, &e);
        }
        vls.finish_table(slot, false);
        vls.release(slot, false);
        assert_eq!(vls.stats().scans_active, 0);
    }

    fn register(vls: &CollectionVls) -> usize {
        let ticket = vls.take_ticket();
        vls.wait_turn(ticket, Duration::from_secs(30));
        vls.try_register(ticket).expect("a free slot")
    }

    fn doc(id: i32) -> DocRef {
        Arc::new(rawdoc! {"_id": id})
    }

    /// Both decisions are single atomic RMWs on the record's word, so any run
    /// is one of two orders per (record, scan). In either order, and for
    /// either stable value of the slot (before and after a completed full
    /// scan flipped it), the scan gets the record exactly once: from the
    /// table when its RMW came first, from the remset otherwise; a scan that
    /// never reached the record gets it from the remset; a second update
    /// keeps nothing more.
    #[test]
    fn claim_and_supersede_decide_exactly_once_in_either_order() {
        for flipped in [false, true] {
            for scan_first in [false, true] {
                let vls = Arc::new(CollectionVls::new(VlsOptions::default()));
                for rid in 0..4 {
                    vls.on_insert(rid);
                }
                if flipped {
                    let slot = register(&vls);
                    let view = vls.status_view();
                    for rid in 0..4 {
                        assert!(vls.claim(&view, slot, rid));
                    }
                    vls.finish_table(slot, true);
                    vls.release(slot, false);
                }
                let (a, b) = (register(&vls), register(&vls));
                let stable_a = vls.stable().0[0] & (1 << a);
                assert_eq!(stable_a != 0, flipped && a == 0, "slot {a}'s stable value");
                let view = vls.status_view();
                let claimed_first = scan_first && vls.claim(&view, a, 1);
                vls.on_supersede(1, &doc(1));
                let claimed_late = !scan_first && vls.claim(&view, a, 1);
                let pending_a = vls.remset.pending_for(a);
                let from_remset_a = pending_a.iter().filter(|(_, e)| e.rid == 1).count();
                assert_eq!(
                    usize::from(claimed_first) + usize::from(claimed_late) + from_remset_a,
                    1,
                    "flipped {flipped}, scan first {scan_first}"
                );
                assert_eq!(claimed_first, scan_first);
                assert_eq!(vls.remset.pending_for(b).len(), 1, "b never read record 1");
                let inserts = vls.remset.stats().inserts;
                vls.on_supersede(1, &doc(1));
                assert_eq!(
                    vls.remset.stats().inserts,
                    inserts,
                    "a second update keeps nothing"
                );
                // Untouched records: claimed once, then skipped.
                assert!(vls.claim(&view, a, 2));
                assert!(!vls.claim(&view, a, 2));
                for slot in [a, b] {
                    for (id, e) in vls.remset.pending_for(slot) {
                        vls.remset.release(slot, id, &e);
                    }
                }
                assert_eq!(vls.remset.stats().entries, 0, "reclaimed at once");
            }
        }
    }

    /// Real threads: a writer superseding records races a scan claiming every
    /// record, both walking the ids upwards from one barrier so that they
    /// meet on the same words often; whatever interleaving they take, each
    /// record reaches the scan exactly once, from the table or from the
    /// remset. Rounds alternate the slot's stable value, and odd rounds
    /// supersede some records twice. (A planted writer that loads and then
    /// stores instead of one swap was caught at its first run.)
    #[test]
    fn a_racing_writer_and_scan_still_read_each_record_once() {
        const N: u64 = 20_000;
        for round in 0..4u64 {
            let vls = Arc::new(CollectionVls::new(VlsOptions::default()));
            for rid in 0..N {
                vls.on_insert(rid);
            }
            if round % 2 == 1 {
                let slot = register(&vls);
                let view = vls.status_view();
                for rid in 0..N {
                    assert!(vls.claim(&view, slot, rid));
                }
                vls.finish_table(slot, true);
                vls.release(slot, false);
            }
            let slot = register(&vls);
            let view = vls.status_view();
            let start = std::sync::Barrier::new(2);
            let claimed: Vec<RecordId> = std::thread::scope(|s| {
                let writer = s.spawn(|| {
                    start.wait();
                    for rid in 0..N {
                        vls.on_supersede(rid, &doc(rid as i32));
                        if round % 2 == 1 && rid % 3 == 0 {
                            vls.on_supersede(rid / 2, &doc(rid as i32));
                        }
                    }
                });
                start.wait();
                let got = (0..N).filter(|&rid| vls.claim(&view, slot, rid)).collect();
                writer.join().expect("writer thread");
                got
            });
            let mut seen = vec![0u8; N as usize];
            for rid in claimed {
                seen[rid as usize] += 1;
            }
            for (id, e) in vls.remset.pending_for(slot) {
                seen[e.rid as usize] += 1;
                vls.remset.release(slot, id, &e);
            }
            let wrong: Vec<usize> = (0..seen.len()).filter(|&r| seen[r] != 1).collect();
            assert!(
                wrong.is_empty(),
                "round {round}: records read not once: {wrong:?}"
            );
        }
    }

    /// The background reset reads every word but writes only those whose
    /// bit the scan or the writer changed (claimed, superseded, inserted
    /// while the slot was active), and afterwards the slot sees every
    /// record as stable again.
    #[test]
    fn a_background_reset_writes_only_the_words_that_changed() {
        let vls = Arc::new(CollectionVls::new(VlsOptions::default()));
        for rid in 0..10_000 {
            vls.on_insert(rid);
        }
        let slot = register(&vls);
        let view = vls.status_view();
        for rid in [3, 500, 9_999] {
            assert!(vls.claim(&view, slot, rid));
        }
        vls.on_supersede(42, &doc(42));
        vls.on_supersede(43, &doc(43));
        vls.on_insert(10_000);
        for (id, e) in vls.remset.pending_for(slot) {
            vls.remset.release(slot, id, &e);
        }
        vls.finish_table(slot, false);
        vls.release(slot, true);
        // The reset runs on its own thread; the slot is free once it is done.
        let deadline = Instant::now() + Duration::from_secs(30);
        while vls.slots.lock().free.0[0] & (1 << slot) == 0 && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(1));
        }
        let again = register(&vls);
        assert_eq!(again, slot, "the reset slot is free again");
        assert_eq!(vls.stats().reset_words_written, 6);
        let view = vls.status_view();
        for rid in 0..=10_000 {
            assert!(vls.claim(&view, again, rid), "record {rid} is stable again");
        }
    }

    /// The planted violations below show the debug checks can fire.
    #[test]
    #[cfg(debug_assertions)]
    #[should_panic(expected = "whose table pass already ended")]
    fn ending_a_table_pass_twice_is_caught() {
        let (vls, slot) = registered();
        vls.finish_table(slot, true);
        vls.finish_table(slot, true);
    }

    #[test]
    #[cfg(debug_assertions)]
    #[should_panic(expected = "after its table pass")]
    fn a_claim_after_the_table_pass_is_caught() {
        let (vls, slot) = registered();
        vls.finish_table(slot, true);
        let view = vls.status_view();
        vls.claim(&view, slot, 0);
    }

    #[test]
    #[cfg(debug_assertions)]
    #[should_panic(expected = "released with remset entries it never read")]
    fn releasing_a_slot_with_unread_remset_entries_is_caught() {
        let (vls, slot) = registered();
        vls.on_supersede(0, &(Arc::new(rawdoc! {"_id": 1}) as DocRef));
        vls.finish_table(slot, false);
        vls.release(slot, false);
    }
}
