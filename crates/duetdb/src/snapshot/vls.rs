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
//! - a slot is attached to at most one scan, and is released only after the
//!   writer stopped keeping versions for it (`finish_table` is a boundary step).

use std::collections::HashSet;
use std::ops::{Bound, ControlFlow};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::doc::DocRef;
use crate::error::{Error, Result};
use crate::query::planner::{Access, Plan};
use crate::query::Filter;
use crate::snapshot::scan::{IndexAtStart, IndexRef, ScanOutcome, PAGE};
use crate::snapshot::Strategy;
use crate::store::collection::CollectionState;
use crate::store::heap::RecordId;
use crate::store::index::{IndexKey, ValueKey};
use crate::store::vls::{CollectionVls, OlcpSink};
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
    pub index: Option<IndexAtStart>,
}

/// What the writer answered a registration.
enum Registration {
    Registered {
        slot: usize,
        csn: u64,
        next_rid: RecordId,
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
                index,
                captured,
            }) => {
                vls.record_wait(waited_from.elapsed());
                let guard = VlsGuard {
                    writer,
                    vls: vls.clone(),
                    slot,
                    table_done: false,
                    released: false,
                };
                return Ok(Registered {
                    captured,
                    guard,
                    slot,
                    start_csn: csn,
                    start_next_rid: next_rid,
                    index,
                });
            }
            Ok(Registration::NoSlot) => vls.wait_turn(ticket, SLOT_POLL),
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
    table_done: bool,
    released: bool,
}

impl VlsGuard<'_> {
    pub(crate) fn finish_table(&mut self, complete: bool) -> Result<()> {
        self.table_done = true;
        let (vls, slot) = (self.vls.clone(), self.slot);
        self.writer.at_boundary(move |_, _| {
            vls.finish_table(slot, complete);
            Ok(())
        })
    }

    /// Give back every remset entry this scan still holds, then the slot.
    pub(crate) fn release(&mut self, reset: bool) {
        for (id, entry) in self.vls.remset.pending_for(self.slot) {
            self.vls.remset.release(self.slot, id, &entry);
        }
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

pub(crate) fn vls_scan<F>(
    writer: &Writer,
    coll: &str,
    vls: Arc<CollectionVls>,
    filter: &Filter,
    plan: Plan,
    sink: Option<Arc<OlcpSink>>,
    visit: &mut F,
) -> Result<ScanOutcome>
where
    F: FnMut(&DocRef) -> ControlFlow<()>,
{
    let index_ref = match &plan.access {
        Access::CollScan { .. } => None,
        Access::IdPoints { .. } | Access::IdRange { .. } => Some(IndexRef::Id),
        Access::IndexScan { index, .. } => Some(IndexRef::Secondary(index.clone())),
    };
    let Registered {
        mut guard,
        slot,
        start_csn,
        start_next_rid,
        index,
        ..
    } = register_scan(writer, coll, &vls, index_ref, sink.clone(), Vec::new())?;

    let mut record_set: Option<HashSet<RecordId>> = None;
    let mut stopped = false;
    let emit = |d: &DocRef, visit: &mut F, stopped: &mut bool| {
        if !*stopped && filter.matches(d) && visit(d).is_break() {
            *stopped = true;
        }
    };

    // Versions the writer handed over (OLCP): processed as they arrive, so
    // holding them costs only the writes made since the last drain.
    let mut propagated = 0u64;
    let mut drain = |visit: &mut F, stopped: &mut bool| {
        if let Some(sink) = &sink {
            for (_, d) in sink.drain() {
                propagated += 1;
                emit(&d, visit, stopped);
            }
        }
    };

    // Table pass.
    match index {
        None => {
            // Full scan in record order over the live heap; ids at or above the
            // start's next id were inserted after the start and are skipped.
            let mut next: RecordId = 0;
            'pages: while next < start_next_rid && !stopped {
                drain(visit, &mut stopped);
                let state = writer.published();
                let view = vls.status_view();
                let Some(c) = state.collection(coll) else {
                    break;
                };
                if !Arc::ptr_eq(&c.vls, &vls) {
                    break;
                }
                let mut n = 0;
                for (rid, d) in c.heap.iter_from(next) {
                    if rid >= start_next_rid {
                        break 'pages;
                    }
                    next = rid + 1;
                    if vls.claim(&view, slot, rid) {
                        emit(d, visit, &mut stopped);
                        if stopped {
                            break 'pages;
                        }
                    }
                    n += 1;
                    if n == PAGE {
                        continue 'pages;
                    }
                }
                break;
            }
        }
        Some(index) => {
            let rids = index_rids(&index, &plan);
            let mut set = HashSet::with_capacity(rids.len());
            let mut i = 0;
            while i < rids.len() && !stopped {
                drain(visit, &mut stopped);
                let state = writer.published();
                let view = vls.status_view();
                let Some(c) = state.collection(coll) else {
                    break;
                };
                if !Arc::ptr_eq(&c.vls, &vls) {
                    break;
                }
                let end = (i + PAGE).min(rids.len());
                for &rid in &rids[i..end] {
                    if !set.insert(rid) {
                        continue; // multikey: already handled
                    }
                    if let Some(d) = c.heap.get(rid) {
                        if vls.claim(&view, slot, rid) {
                            emit(d, visit, &mut stopped);
                            if stopped {
                                break;
                            }
                        }
                    }
                }
                i = end;
            }
            record_set = Some(set);
        }
    }
    let complete = !stopped && record_set.is_none();
    guard.finish_table(complete)?;
    // After the end of the table pass the writer hands over nothing more.
    drain(visit, &mut stopped);

    // Remset pass: the start versions of records superseded before this scan read them.
    let mut from_remset = 0;
    for (id, entry) in vls.remset.pending_for(slot) {
        let wanted = record_set.as_ref().is_none_or(|s| s.contains(&entry.rid));
        if wanted && !stopped {
            from_remset += 1;
            emit(&entry.doc, visit, &mut stopped);
        }
        vls.remset.release(slot, id, &entry);
    }
    guard.release(!complete);
    if vls.is_dropped() {
        return Err(Error::QueryPlanKilled(format!(
            "collection {coll} was dropped or renamed during the scan"
        )));
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
        propagated,
        inflight_peak,
    })
}

type Interval = (Bound<(IndexKey, RecordId)>, Bound<(IndexKey, RecordId)>);

/// The record ids the plan reaches in the index as of the scan's start, in index order.
pub(crate) fn index_rids(index: &IndexAtStart, plan: &Plan) -> Vec<RecordId> {
    let mut out = Vec::new();
    match (index, &plan.access) {
        (IndexAtStart::Id(tree), Access::IdPoints { ids }) => {
            for id in ids {
                if let Some(rid) = tree.get(&ValueKey(id.clone())) {
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
            IndexAtStart::Secondary(tree),
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
                let range = tree.range(lo.as_ref(), hi.as_ref());
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
        Some(IndexRef::Id) => Some(IndexAtStart::Id(c.id_index.clone())),
        Some(IndexRef::Secondary(name)) => match c.index(name) {
            Some(ix) => Some(IndexAtStart::Secondary(ix.tree.clone())),
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
                index: captured,
                captured: taken,
            }
        }
        None => Registration::NoSlot,
    }
}
