//! The scan side of VLS (the MongoDB-VLS paper): registration at a commit
//! boundary, the table pass claiming records through their status bits, then
//! the remset pass. The bookkeeping itself (masks, remset) lives beside the
//! heap in `store::vls`, where the writer updates it before each change.
//!
//! A VLS scan registers through the writer (so it starts at a commit boundary),
//! gets a slot and, for index scans, the index *as of its start* (a persistent
//! tree clone: walking it replaces the paper's postponed pointer removal and
//! index status masks; only index nodes are held, never documents). It then
//! reads records from the latest published state, claiming each through its
//! status bit; records superseded after its start come from the remset. The
//! index scan's *record set* filters spurious remset entries. The end of the
//! table pass is again a boundary step; then the remset pass; then the slot is
//! released (after a background reset of the slot's bits when the scan did not
//! visit every record).
//!
//! Invariants (asserted in debug builds):
//! - a scan reads each record of its start state at most once from the table
//!   and, only if it did not, once from the remset (the claim CAS decides);
//!   a scan that visited every record read exactly as many records as its
//!   start state held ([`ReadLog`]);
//! - a slot is attached to at most one scan, and is released only after the
//!   writer stopped keeping versions for it (`finish_table` is a boundary step;
//!   the slot lifecycle itself is asserted in `store::vls`);
//! - a cancelled scan (its `CancelToken`, checked while waiting for a slot and
//!   once per page of the table pass) stops like one whose `visit` broke: an
//!   incomplete table pass, its remset entries released, its bits reset in
//!   the background; only then does it return `Error::Interrupted`.

use std::collections::HashSet;
use std::ops::{Bound, ControlFlow};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::doc::DocRef;
use crate::error::{CancelToken, Error, Result};
use crate::query::planner::{Access, Plan};
use crate::query::Filter;
use crate::snapshot::scan::{Capture, IndexAtStart, IndexRef, ScanOutcome, PAGE};
use crate::snapshot::Strategy;
use crate::store::collection::CollectionState;
use crate::store::heap::RecordId;
use crate::store::index::{IndexKey, ValueKey};
use crate::store::vls::{CollectionVls, OlcpSink, StatusView};
use crate::store::DbState;
use crate::write::writer::Writer;

/// How long a scan waits for a VLS slot before re-checking the queue.
const SLOT_POLL: Duration = Duration::from_millis(50);

/// A scan that holds a slot.
pub(crate) struct Registered<'a> {
    /// Collections captured at the start (copy-on-write roots), by name.
    pub captured: Vec<(String, CollectionState)>,
    pub guard: VlsGuard<'a>,
    pub slot: usize,
    pub start_csn: u64,
    pub start_next_rid: RecordId,
    /// Records in the collection at the start.
    pub start_len: usize,
    pub index: Option<IndexAtStart>,
}

/// What the writer answered a registration.
enum Registration {
    Registered {
        slot: usize,
        csn: u64,
        next_rid: RecordId,
        len: usize,
        index: Option<IndexAtStart>,
        captured: Vec<(String, CollectionState)>,
    },
    /// No free slot yet: wait and retry.
    NoSlot,
    /// The collection is gone (dropped, renamed, index dropped).
    Gone,
}

/// Register a VLS (or, with `sink`, OLCP) scan: a FIFO ticket, then a step at
/// a commit boundary; waits while all slots are taken.
pub(crate) fn register_scan<'a>(
    writer: &'a Writer,
    coll: &str,
    vls: &Arc<CollectionVls>,
    index_ref: Option<IndexRef>,
    sink: Option<Arc<OlcpSink>>,
    capture: Vec<String>,
    cancel: &CancelToken,
) -> Result<Registered<'a>> {
    let ticket = vls.take_ticket();
    let waited_from = Instant::now();
    loop {
        let (name, v, ix, sk, cap) = (
            coll.to_string(),
            vls.clone(),
            index_ref.clone(),
            sink.clone(),
            capture.clone(),
        );
        let reply = writer.at_boundary(move |state, _| {
            Ok(register(
                state,
                &name,
                &v,
                ticket,
                ix.as_ref(),
                sk.as_ref(),
                &cap,
            ))
        });
        match reply {
            Ok(Registration::Registered {
                slot,
                csn,
                next_rid,
                len,
                index,
                captured,
            }) => {
                vls.record_wait(waited_from.elapsed());
                let guard = VlsGuard {
                    writer,
                    vls: vls.clone(),
                    slot,
                    table_done: false,
                    table_ended: false,
                    released: false,
                };
                return Ok(Registered {
                    captured,
                    guard,
                    slot,
                    start_csn: csn,
                    start_next_rid: next_rid,
                    start_len: len,
                    index,
                });
            }
            Ok(Registration::NoSlot) => {
                if let Err(e) = cancel.check() {
                    vls.abandon_ticket(ticket);
                    return Err(e);
                }
                vls.wait_turn(ticket, SLOT_POLL)
            }
            Ok(Registration::Gone) => {
                vls.abandon_ticket(ticket);
                return Err(Error::QueryPlanKilled(format!(
                    "collection {coll} was dropped or renamed"
                )));
            }
            Err(e) => {
                vls.abandon_ticket(ticket);
                return Err(e);
            }
        }
    }
}

/// A registered VLS scan; releases its slot even on error or panic.
pub(crate) struct VlsGuard<'a> {
    writer: &'a Writer,
    vls: Arc<CollectionVls>,
    slot: usize,
    /// The end of the table pass was asked of the writer…
    table_done: bool,
    /// …and the writer did it (it refuses only once it writes nothing more).
    table_ended: bool,
    released: bool,
}

impl VlsGuard<'_> {
    pub(crate) fn finish_table(&mut self, complete: bool) -> Result<()> {
        debug_assert!(!self.table_done, "finish_table asked twice");
        self.table_done = true;
        let (vls, slot) = (self.vls.clone(), self.slot);
        self.writer.at_boundary(move |_, _| {
            vls.finish_table(slot, complete);
            Ok(())
        })?;
        self.table_ended = true;
        Ok(())
    }

    /// Give back every remset entry this scan still holds, then the slot.
    pub(crate) fn release(&mut self, reset: bool) {
        // finish_table before release: until the writer ended the table pass
        // it may still add remset entries for this slot, which a reused slot
        // would then read as its own.
        debug_assert!(self.table_done, "VLS slot released before finish_table");
        debug_assert!(
            !self.table_ended || !self.vls.is_active(self.slot),
            "VLS slot still active after finish_table"
        );
        debug_assert!(!self.released, "VLS slot released twice");
        let (remset, slot) = (&self.vls.remset, self.slot);
        remset.for_each_pending(slot, |id, entry| remset.release(slot, id, entry));
        self.vls.release(self.slot, reset);
        self.released = true;
    }
}

impl Drop for VlsGuard<'_> {
    fn drop(&mut self) {
        if self.released {
            return;
        }
        if !self.table_done {
            // The writer must stop keeping versions for this slot before it is reused.
            if self.finish_table(false).is_err() {
                // The writer is gone (poisoned or closed): nothing will write again.
                tracing::warn!(
                    slot = self.slot,
                    "could not end a VLS scan through the writer"
                );
            }
        }
        self.release(true);
    }
}

/// The index a plan walks, to capture at registration (`None`: a full scan).
pub(crate) fn index_ref(access: &Access) -> Option<IndexRef> {
    match access {
        Access::CollScan { .. } => None,
        Access::IdPoints { .. } | Access::IdRange { .. } => Some(IndexRef::Id),
        Access::IndexScan { index, .. } => Some(IndexRef::Secondary(index.clone())),
    }
}

/// A VLS scan (or, with `sink`, an OLCP scan): register, table pass, end of
/// the table pass at a boundary, remset pass, release.
#[allow(clippy::too_many_arguments)]
pub(crate) fn vls_scan<F>(
    writer: &Writer,
    coll: &str,
    vls: Arc<CollectionVls>,
    filter: &Filter,
    plan: Plan,
    sink: Option<Arc<OlcpSink>>,
    cancel: &CancelToken,
    capture: Option<Capture<'_>>,
    visit: &mut F,
) -> Result<ScanOutcome>
where
    F: FnMut(&DocRef) -> ControlFlow<()>,
{
    let index_ref = index_ref(&plan.access);
    let Registered {
        mut guard,
        slot,
        start_csn,
        start_next_rid,
        start_len,
        index,
        captured,
    } = register_scan(
        writer,
        coll,
        &vls,
        index_ref,
        sink.clone(),
        capture.map(|c| c.names.to_vec()).unwrap_or_default(),
        cancel,
    )?;
    // The other collections as of the registration boundary: the same
    // commit as this scan's start, pinned before its first visit.
    if let Some(cap) = capture {
        cap.pin_from_captured(start_csn, &captured, cancel);
    }
    let mut pass = ScanPass {
        writer,
        coll,
        vls: &vls,
        slot,
        filter,
        sink: sink.as_deref(),
        visit,
        stopped: false,
        cancel,
        cancelled: None,
        propagated: 0,
        read: ReadLog::new(start_next_rid),
    };
    let record_set = match index {
        None => {
            pass.full_table(start_next_rid);
            None
        }
        Some(index) => {
            let rids = index_rids(&index, &plan);
            // explain's keysExamined: the pass reads every entry of its intervals.
            filter.count_keys(rids.len() as u64);
            Some(pass.index_table(&rids, start_next_rid))
        }
    };
    let complete = !pass.stopped && record_set.is_none();
    guard.finish_table(complete)?;
    // After the end of the table pass the writer hands over nothing more.
    pass.drain();
    let from_remset = pass.remset_pass(record_set.as_ref());
    guard.release(!complete);
    if let Some(e) = pass.cancelled.take() {
        return Err(e);
    }
    if vls.is_dropped() {
        return Err(Error::QueryPlanKilled(format!(
            "collection {coll} was dropped or renamed during the scan"
        )));
    }
    if complete {
        pass.read.check_complete(start_len);
    }
    let (strategy, inflight_peak) = match &sink {
        Some(s) => (Strategy::Olcp, s.inflight_peak()),
        None => (Strategy::Vls, 0),
    };
    Ok(ScanOutcome {
        strategy,
        reason: "",
        start_csn,
        plan,
        from_remset,
        propagated: pass.propagated,
        inflight_peak,
    })
}

/// Which records of its start state a scan read, from the table, the remset
/// or its sink. Debug builds only (the checks are O(records) in memory):
/// each record at most once, only records of the start state (ids below the
/// start's next id), and — for a scan that visited every record — exactly as
/// many as the start state held. In release builds it records nothing.
pub(crate) struct ReadLog {
    #[cfg(debug_assertions)]
    start_next_rid: RecordId,
    #[cfg(debug_assertions)]
    seen: HashSet<RecordId>,
}

impl ReadLog {
    pub(crate) fn new(start_next_rid: RecordId) -> ReadLog {
        #[cfg(not(debug_assertions))]
        let _ = start_next_rid;
        ReadLog {
            #[cfg(debug_assertions)]
            start_next_rid,
            #[cfg(debug_assertions)]
            seen: HashSet::new(),
        }
    }

    /// The scan read `rid` (its start version) from `source`.
    pub(crate) fn read(&mut self, rid: RecordId, source: &str) {
        #[cfg(debug_assertions)]
        {
            assert!(
                rid < self.start_next_rid,
                "record {rid} from the {source} was inserted after the scan started"
            );
            assert!(
                self.seen.insert(rid),
                "record {rid} read twice (the second time from the {source})"
            );
        }
        #[cfg(not(debug_assertions))]
        let _ = (rid, source);
    }

    /// Merge what another thread of the same scan read.
    pub(crate) fn merge(&mut self, other: ReadLog) {
        #[cfg(debug_assertions)]
        for rid in other.seen {
            self.read(rid, "table (another thread)");
        }
        #[cfg(not(debug_assertions))]
        let _ = other;
    }

    /// A scan that visited every record read each record of its start state:
    /// together with "at most once" this is "exactly once".
    pub(crate) fn check_complete(&self, start_len: usize) {
        #[cfg(debug_assertions)]
        assert_eq!(
            self.seen.len(),
            start_len,
            "a complete scan read {} records of a start state holding {start_len}",
            self.seen.len()
        );
        #[cfg(not(debug_assertions))]
        let _ = start_len;
    }
}

/// The state of one VLS scan between registration and release.
struct ScanPass<'s, F> {
    writer: &'s Writer,
    coll: &'s str,
    vls: &'s Arc<CollectionVls>,
    slot: usize,
    filter: &'s Filter,
    sink: Option<&'s OlcpSink>,
    visit: &'s mut F,
    /// `visit` asked to stop, or the scan was cancelled.
    stopped: bool,
    cancel: &'s CancelToken,
    /// Why the scan was cancelled (returned once it has cleaned up).
    cancelled: Option<Error>,
    /// Versions taken from the sink (OLCP).
    propagated: u64,
    read: ReadLog,
}

impl<F> ScanPass<'_, F>
where
    F: FnMut(&DocRef) -> ControlFlow<()>,
{
    fn emit(&mut self, d: &DocRef) {
        if !self.stopped && self.filter.matches(d) && (self.visit)(d).is_break() {
            self.stopped = true;
        }
    }

    /// Check the cancellation token (once per page); a cancelled scan stops
    /// as if `visit` had broken. False once stopped.
    fn go_on(&mut self) -> bool {
        if let Err(e) = self.cancel.check() {
            self.cancelled.get_or_insert(e);
            self.stopped = true;
        }
        !self.stopped
    }

    /// Versions the writer handed over (OLCP): processed as they arrive, so
    /// holding them costs only the writes made since the last drain.
    fn drain(&mut self) {
        let Some(sink) = self.sink else {
            return;
        };
        for (rid, d) in sink.drain() {
            self.read.read(rid, "sink");
            self.propagated += 1;
            self.emit(&d);
        }
    }

    /// The latest published version of the scanned collection, with a fresh
    /// status view; `None` once the collection was dropped or renamed.
    fn latest(&self) -> Option<(Arc<DbState>, StatusView)> {
        let state = self.writer.published();
        let view = self.vls.status_view();
        let c = state.collection(self.coll)?;
        if !Arc::ptr_eq(&c.vls, self.vls) {
            return None;
        }
        Some((state, view))
    }

    /// Claim `rid` (version `d`) and visit it if the claim wins.
    fn claim_and_emit(&mut self, view: &StatusView, rid: RecordId, d: &DocRef) {
        if self.vls.claim(view, self.slot, rid) {
            self.read.read(rid, "table");
            self.emit(d);
        }
    }

    /// Full table pass in record order over the live heap, one page per
    /// published state; ids at or above the start's next id were inserted
    /// after the start and are skipped.
    fn full_table(&mut self, start_next_rid: RecordId) {
        let mut next: RecordId = 0;
        while next < start_next_rid && self.go_on() {
            self.drain();
            let Some((state, view)) = self.latest() else {
                return;
            };
            let Some(c) = state.collection(self.coll) else {
                return;
            };
            // The page's records first, then claim and visit them with the
            // documents a few records ahead already being loaded (see
            // `doc::prefetch`): the same records in the same order, from the
            // same state, as claiming while iterating.
            let mut page: Vec<(RecordId, &DocRef)> = Vec::with_capacity(PAGE);
            let mut last_page = false;
            for (rid, d) in c.heap.iter_from(next) {
                if rid >= start_next_rid {
                    last_page = true;
                    break;
                }
                page.push((rid, d));
                if page.len() == PAGE {
                    break;
                }
            }
            last_page |= page.len() < PAGE;
            for (rid, d) in crate::doc::prefetching(page.iter().copied()) {
                next = rid + 1;
                self.claim_and_emit(&view, rid, d);
                if self.stopped {
                    return;
                }
            }
            if last_page {
                return;
            }
        }
    }

    /// Index table pass over the record ids of the index as of the start, in
    /// index order; returns the record set (filters the remset pass).
    fn index_table(&mut self, rids: &[RecordId], start_next_rid: RecordId) -> RecordSet {
        let mut set = RecordSet::for_scan(rids.len(), start_next_rid);
        let mut i = 0;
        while i < rids.len() && self.go_on() {
            self.drain();
            let Some((state, view)) = self.latest() else {
                break;
            };
            let Some(c) = state.collection(self.coll) else {
                break;
            };
            let end = (i + PAGE).min(rids.len());
            for &rid in &rids[i..end] {
                if !set.insert(rid) {
                    continue; // multikey: already handled
                }
                if let Some(d) = c.heap.get(rid) {
                    self.claim_and_emit(&view, rid, d);
                    if self.stopped {
                        break;
                    }
                }
            }
            i = end;
        }
        set
    }

    /// Remset pass: the start versions of records superseded before this
    /// scan read them. Every entry the slot still needs is released.
    fn remset_pass(&mut self, record_set: Option<&RecordSet>) -> u64 {
        let mut from_remset = 0;
        let (vls, slot) = (self.vls, self.slot);
        vls.remset.for_each_pending(slot, |id, entry| {
            self.read.read(entry.rid, "remset");
            let wanted = record_set.is_none_or(|s| s.contains(entry.rid));
            if wanted && !self.stopped {
                from_remset += 1;
                self.emit(&entry.doc);
            }
            vls.remset.release(slot, id, entry);
        });
        from_remset
    }
}

/// The record set of an index scan: the record ids its start-time index
/// reached (the remset pass reads only entries of these records). Dense — a
/// bitmap over the ids below the start's next id, one bit per record, no
/// hashing — when that bitmap is at most 8x the bytes of the reached ids (a
/// range over a sizeable share of the collection); a hash set otherwise
/// (point lookups, small ranges of a big collection). Both answer alike.
pub(crate) enum RecordSet {
    Dense(Vec<u64>),
    Sparse(HashSet<RecordId>),
}

impl RecordSet {
    /// An empty set for a scan that reaches `reached` ids (with repeats, for
    /// multikey indexes) among `0..start_next_rid`.
    pub(crate) fn for_scan(reached: usize, start_next_rid: RecordId) -> RecordSet {
        let bitmap_bytes = start_next_rid.div_ceil(64).saturating_mul(8);
        let ids_bytes = (reached as u64).saturating_mul(8);
        match usize::try_from(start_next_rid.div_ceil(64)) {
            Ok(words) if bitmap_bytes <= ids_bytes.saturating_mul(8) => {
                RecordSet::Dense(vec![0; words])
            }
            _ => RecordSet::Sparse(HashSet::with_capacity(reached)),
        }
    }

    /// Add `rid`; false when it was there already (a multikey index reaches
    /// a record once per key).
    pub(crate) fn insert(&mut self, rid: RecordId) -> bool {
        match self {
            RecordSet::Dense(words) => {
                let Ok(w) = usize::try_from(rid / 64) else {
                    return false;
                };
                if w >= words.len() {
                    // Not from the start-time index; kept exact all the same.
                    words.resize(w + 1, 0);
                }
                let bit = 1u64 << (rid % 64);
                let fresh = words[w] & bit == 0;
                words[w] |= bit;
                fresh
            }
            RecordSet::Sparse(set) => set.insert(rid),
        }
    }

    pub(crate) fn contains(&self, rid: RecordId) -> bool {
        match self {
            RecordSet::Dense(words) => usize::try_from(rid / 64)
                .ok()
                .and_then(|w| words.get(w))
                .is_some_and(|word| word & (1u64 << (rid % 64)) != 0),
            RecordSet::Sparse(set) => set.contains(&rid),
        }
    }
}

type Interval = (Bound<(IndexKey, RecordId)>, Bound<(IndexKey, RecordId)>);

/// The record ids the plan reaches in the index as of the scan's start, in index order.
pub(crate) fn index_rids(index: &IndexAtStart, plan: &Plan) -> Vec<RecordId> {
    let mut out = Vec::new();
    match (index, &plan.access) {
        (IndexAtStart::Id(tree), Access::IdPoints { ids }) => {
            for id in ids {
                if let Some(rid) = tree.get(&ValueKey::from(id)) {
                    out.push(*rid);
                }
            }
        }
        (
            IndexAtStart::Id(tree),
            Access::IdRange {
                lower,
                upper,
                reverse,
            },
        ) => {
            let range = tree.range(lower.as_ref(), upper.as_ref());
            if *reverse {
                out.extend(range.rev().map(|(_, rid)| *rid));
            } else {
                out.extend(range.map(|(_, rid)| *rid));
            }
        }
        (
            IndexAtStart::Secondary(ix),
            Access::IndexScan {
                intervals, reverse, ..
            },
        ) => {
            let order: Box<dyn Iterator<Item = &Interval>> = if *reverse {
                Box::new(intervals.iter().rev())
            } else {
                Box::new(intervals.iter())
            };
            for (lo, hi) in order {
                let range = ix.range(lo.as_ref(), hi.as_ref());
                if *reverse {
                    out.extend(range.rev().map(|((_, rid), _)| *rid));
                } else {
                    out.extend(range.map(|((_, rid), _)| *rid));
                }
            }
        }
        _ => debug_assert!(false, "index captured does not fit the plan"),
    }
    out
}

/// Writer side of registration. Requires: inside a writer boundary step.
fn register(
    state: &DbState,
    coll: &str,
    vls: &Arc<CollectionVls>,
    ticket: u64,
    index: Option<&IndexRef>,
    sink: Option<&Arc<OlcpSink>>,
    capture: &[String],
) -> Registration {
    let Some(c) = state.collection(coll) else {
        return Registration::Gone;
    };
    if !Arc::ptr_eq(&c.vls, vls) || vls.is_dropped() {
        return Registration::Gone;
    }
    let captured = match index {
        None => None,
        Some(IndexRef::Id) => {
            c.id_usage.record();
            Some(IndexAtStart::Id(c.id_index.clone()))
        }
        Some(IndexRef::Secondary(name)) => match c.index(name) {
            Some(ix) => {
                ix.usage.record();
                Some(IndexAtStart::Secondary(Box::new(ix.clone())))
            }
            // Dropped since planning: the scan cannot be answered as planned.
            None => return Registration::Gone,
        },
    };
    match vls.try_register(ticket) {
        Some(slot) => {
            if let Some(sink) = sink {
                vls.attach_sink(slot, sink.clone());
            }
            // Point ranges read these collections as of this commit (cow roots).
            let taken = capture
                .iter()
                .map(|n| {
                    let c = state
                        .collection(n)
                        .cloned()
                        .unwrap_or_else(|| CollectionState::new(n, state.vls_options));
                    (n.clone(), c)
                })
                .collect();
            Registration::Registered {
                slot,
                csn: state.csn,
                next_rid: c.next_rid,
                len: c.len(),
                index: captured,
                captured: taken,
            }
        }
        None => Registration::NoSlot,
    }
}

#[cfg(test)]
mod tests {
    use super::RecordSet;
    use rand::{Rng, SeedableRng};

    /// The dense and the sparse record set answer alike, repeats included
    /// (multikey), and ids beyond the start's next id stay exact.
    #[test]
    fn dense_and_sparse_record_sets_agree() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(7);
        for round in 0..50 {
            let next: u64 = rng.gen_range(1..5000);
            let reached: Vec<u64> = (0..rng.gen_range(0..600))
                .map(|_| rng.gen_range(0..next + 70))
                .collect();
            let mut dense = RecordSet::Dense(vec![0; next.div_ceil(64) as usize]);
            let mut sparse = RecordSet::Sparse(Default::default());
            for &rid in &reached {
                assert_eq!(
                    dense.insert(rid),
                    sparse.insert(rid),
                    "round {round}, rid {rid}"
                );
            }
            for rid in 0..next + 200 {
                assert_eq!(
                    dense.contains(rid),
                    sparse.contains(rid),
                    "round {round}, rid {rid}"
                );
            }
        }
    }

    /// Dense for a range over a sizeable share of the collection, sparse for
    /// a few ids of a big one.
    #[test]
    fn the_record_set_is_dense_only_when_the_bitmap_is_small() {
        assert!(matches!(
            RecordSet::for_scan(30_000, 300_000),
            RecordSet::Dense(_)
        ));
        assert!(matches!(
            RecordSet::for_scan(600, 300_000),
            RecordSet::Dense(_)
        ));
        assert!(matches!(
            RecordSet::for_scan(10, 300_000),
            RecordSet::Sparse(_)
        ));
        assert!(matches!(RecordSet::for_scan(0, 0), RecordSet::Dense(_)));
    }
}
