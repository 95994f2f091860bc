//! Scans under a snapshot strategy: what a query reads while writers keep going.
//!
//! | strategy | reads | guarantee |
//! |---|---|---|
//! | `none` | the latest published state, reloaded page by page | none (cursor stability; MongoDB's default; the baseline) |
//! | `vls` | the live data, with per-record status bits and the shared remset ([`vls`]) | exactly the start state, keeping only the old versions it still needs |
//! | `cow` | one published root held for the whole scan | exactly the start state; holds every node/version replaced meanwhile |
//!
//! `auto` (the default) picks `cow` for `_id` point lookups (an O(1) root held
//! for microseconds) and `vls` for everything else.
//!
//! A VLS scan registers through the writer (so it starts at a commit boundary),
//! gets a slot and — for index scans — the index *as of its start* (a persistent
//! tree clone: walking it replaces the paper's postponed pointer removal and
//! index status masks; only index nodes are held, never documents). It then
//! reads records from the latest published state, claiming each through its
//! status bit; records superseded after its start come from the remset. The
//! index scan's *record set* filters spurious remset entries. The end of the
//! table pass is again a writer command; then the remset pass; then the slot is
//! released (after a background reset of the slot's bits when the scan did not
//! visit every record).

pub mod olcp;
pub mod remset;
pub mod vls;

use std::collections::HashSet;
use std::ops::{Bound, ControlFlow};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::btree::BTree;
use crate::command::{Command, Reply};
use crate::database::Database;
use crate::doc::DocRef;
use crate::error::{Error, Result};
use crate::heap::RecordId;
use crate::index::{IndexKey, ValueKey};
use crate::planner::{self, Access, Plan};
use crate::query::Filter;
use crate::writer::DbState;
use vls::{CollectionVls, OlcpSink};

/// Records read from one published state before reloading the latest one: small
/// enough that a VLS scan never pins old versions for long, large enough that the
/// reload (an atomic pointer load) costs nothing per record.
pub(crate) const PAGE: usize = 256;
/// How long a scan waits for a VLS slot before re-checking the queue.
const SLOT_POLL: Duration = Duration::from_millis(50);

/// How a read is kept consistent while writes continue.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Strategy {
    /// `cow` for `_id` point lookups, `vls` otherwise.
    #[default]
    Auto,
    /// No snapshot: each record read at its latest committed state.
    None,
    /// Virtual Lightweight Snapshot.
    Vls,
    /// Hold a copy-on-write root for the whole read.
    Cow,
    /// One pass over the live data in which versions superseded before the
    /// scan read them are handed to it at once (propagation, KVell+'s OLCP)
    /// instead of being kept: for commutative work that accepts any order.
    Olcp,
}

impl Strategy {
    pub fn name(self) -> &'static str {
        match self {
            Strategy::Auto => "auto",
            Strategy::None => "none",
            Strategy::Vls => "vls",
            Strategy::Cow => "cow",
            Strategy::Olcp => "olcp",
        }
    }
}

impl std::str::FromStr for Strategy {
    type Err = Error;
    fn from_str(s: &str) -> Result<Strategy> {
        match s {
            "auto" => Ok(Strategy::Auto),
            "none" => Ok(Strategy::None),
            "vls" => Ok(Strategy::Vls),
            "cow" => Ok(Strategy::Cow),
            "olcp" => Ok(Strategy::Olcp),
            other => Err(Error::bad_value(format!(
                "unknown snapshot strategy '{other}': use none, vls, olcp, cow or auto"
            ))),
        }
    }
}

impl std::fmt::Display for Strategy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// What a scan did.
#[derive(Debug, Clone)]
pub struct ScanOutcome {
    /// The strategy that actually ran (`auto` resolved).
    pub strategy: Strategy,
    /// The commit the scan's snapshot is at (`none`: the state it started from).
    pub start_csn: u64,
    pub plan: Plan,
    /// Documents that came from the remset (VLS only).
    pub from_remset: u64,
    /// Superseded versions handed to the scan by the writer (OLCP only).
    pub propagated: u64,
    /// Most handed-over versions held at once (OLCP only): bounded by the
    /// writes made between two drains, not by the scan's duration.
    pub inflight_peak: u64,
}

/// The index a VLS scan walks, as of the scan's start.
#[derive(Debug, Clone)]
pub enum IndexAtStart {
    Id(BTree<ValueKey, RecordId>),
    Secondary(BTree<(IndexKey, RecordId), ()>),
}

/// Which index to capture at registration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum IndexRef {
    Id,
    Secondary(String),
}

/// Visit every document matching `filter` in collection `coll` of `db`, under
/// `strategy`, until `visit` breaks. Documents come in plan order for `cow`; for
/// `vls` the remset's documents come last; `none` gives no order guarantee.
pub fn scan<F>(
    db: &Database,
    coll: &str,
    filter: &Filter,
    plan_for: impl Fn(&crate::collection::CollectionState) -> Result<Plan>,
    strategy: Strategy,
    mut visit: F,
) -> Result<ScanOutcome>
where
    F: FnMut(&DocRef) -> ControlFlow<()>,
{
    let state = db.writer().published();
    let Some(c) = state.collection(coll) else {
        return Ok(ScanOutcome {
            strategy: resolve(strategy, None),
            start_csn: state.csn,
            plan: Plan {
                access: Access::CollScan { reverse: false },
                provides_sort: true,
            },
            from_remset: 0,
            propagated: 0,
            inflight_peak: 0,
        });
    };
    let plan = plan_for(c)?;
    let strategy = resolve(strategy, Some(&plan));
    match strategy {
        Strategy::Cow | Strategy::Auto => {
            planner::execute(c, &plan, filter, |_, d| visit(d))?;
            Ok(ScanOutcome {
                strategy: Strategy::Cow,
                start_csn: state.csn,
                plan,
                from_remset: 0,
                propagated: 0,
                inflight_peak: 0,
            })
        }
        Strategy::None => {
            let start_csn = state.csn;
            drop(state);
            none_scan(db, coll, filter, &plan, &mut visit)?;
            Ok(ScanOutcome {
                strategy,
                start_csn,
                plan,
                from_remset: 0,
                propagated: 0,
                inflight_peak: 0,
            })
        }
        Strategy::Vls => {
            let vls = c.vls.clone();
            drop(state);
            vls_scan(db, coll, vls, filter, plan, None, &mut visit)
        }
        Strategy::Olcp => {
            let vls = c.vls.clone();
            drop(state);
            let sink = Arc::new(OlcpSink::default());
            vls_scan(db, coll, vls, filter, plan, Some(sink), &mut visit)
        }
    }
}

fn resolve(strategy: Strategy, plan: Option<&Plan>) -> Strategy {
    match strategy {
        Strategy::Auto => match plan.map(|p| &p.access) {
            Some(Access::IdPoints { .. }) | None => Strategy::Cow,
            _ => Strategy::Vls,
        },
        s => s,
    }
}

/// `none`: walk the plan over the *latest* state, reloading it page by page.
fn none_scan<F>(
    db: &Database,
    coll: &str,
    filter: &Filter,
    plan: &Plan,
    visit: &mut F,
) -> Result<()>
where
    F: FnMut(&DocRef) -> ControlFlow<()>,
{
    let emit = |d: &DocRef, visit: &mut F| {
        if filter.matches(d) {
            visit(d)
        } else {
            ControlFlow::Continue(())
        }
    };
    match &plan.access {
        Access::IndexScan {
            index,
            intervals,
            reverse,
            ..
        } if !reverse => {
            for (lo, hi) in intervals {
                let mut lower: Bound<(IndexKey, RecordId)> = lo.clone();
                loop {
                    let state = db.writer().published();
                    let Some(c) = state.collection(coll) else {
                        return Ok(());
                    };
                    let Some(ix) = c.index(index) else {
                        return Ok(());
                    };
                    let mut n = 0;
                    let mut last = None;
                    for (key, _) in ix.tree.range(lower.as_ref(), hi.as_ref()) {
                        if let Some(d) = c.heap.get(key.1) {
                            if emit(d, visit).is_break() {
                                return Ok(());
                            }
                        }
                        last = Some(key.clone());
                        n += 1;
                        if n == PAGE {
                            break;
                        }
                    }
                    match last {
                        Some(k) if n == PAGE => lower = Bound::Excluded(k),
                        _ => break,
                    }
                }
            }
            Ok(())
        }
        Access::CollScan { reverse: false } => {
            let mut next: RecordId = 0;
            loop {
                let state = db.writer().published();
                let Some(c) = state.collection(coll) else {
                    return Ok(());
                };
                let mut n = 0;
                for (rid, d) in c.heap.iter_from(next) {
                    next = rid + 1;
                    if emit(d, visit).is_break() {
                        return Ok(());
                    }
                    n += 1;
                    if n == PAGE {
                        break;
                    }
                }
                if n < PAGE {
                    return Ok(());
                }
            }
        }
        // Point lookups and backward walks: one state is as good as any.
        _ => {
            let state = db.writer().published();
            if let Some(c) = state.collection(coll) {
                planner::execute(c, plan, filter, |_, d| visit(d))?;
            }
            Ok(())
        }
    }
}

/// A scan that holds a slot.
pub(crate) struct Registered<'a> {
    /// Collections captured at the start (copy-on-write roots), by name.
    pub captured: Vec<(String, crate::collection::CollectionState)>,
    pub guard: VlsGuard<'a>,
    pub slot: usize,
    pub start_csn: u64,
    pub start_next_rid: RecordId,
    pub index: Option<IndexAtStart>,
}

/// Register a VLS (or, with `sink`, OLCP) scan: a FIFO ticket, then a writer
/// command at a commit boundary; waits while all slots are taken.
pub(crate) fn register_scan<'a>(
    db: &'a Database,
    coll: &str,
    vls: &Arc<CollectionVls>,
    index_ref: Option<IndexRef>,
    sink: Option<Arc<OlcpSink>>,
    capture: Vec<String>,
) -> Result<Registered<'a>> {
    let ticket = vls.take_ticket();
    let waited_from = Instant::now();
    loop {
        let reply = db.submit(Command::VlsRegister {
            coll: coll.to_string(),
            vls: vls.clone(),
            ticket,
            index: index_ref.clone(),
            sink: sink.clone(),
            capture: capture.clone(),
        });
        match reply {
            Ok(Reply::VlsRegistered {
                slot: Some(slot),
                csn,
                next_rid,
                index,
                captured,
            }) => {
                vls.record_wait(waited_from.elapsed());
                let guard = VlsGuard {
                    db,
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
            Ok(Reply::VlsRegistered { slot: None, .. }) => vls.wait_turn(ticket, SLOT_POLL),
            Ok(Reply::VlsGone) => {
                vls.abandon_ticket(ticket);
                return Err(Error::QueryPlanKilled(format!(
                    "collection {coll} was dropped or renamed"
                )));
            }
            Ok(other) => {
                vls.abandon_ticket(ticket);
                return Err(Error::Internal(format!(
                    "unexpected reply to VLS registration: {other:?}"
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
    db: &'a Database,
    vls: Arc<CollectionVls>,
    slot: usize,
    table_done: bool,
    released: bool,
}

impl VlsGuard<'_> {
    pub(crate) fn finish_table(&mut self, complete: bool) -> Result<()> {
        self.table_done = true;
        self.db
            .submit(Command::VlsFinishTable {
                vls: self.vls.clone(),
                slot: self.slot,
                complete,
            })
            .map(|_| ())
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

fn vls_scan<F>(
    db: &Database,
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
    } = register_scan(db, coll, &vls, index_ref, sink.clone(), Vec::new())?;

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
                let state = db.writer().published();
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
                let state = db.writer().published();
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

/// Writer side of registration. Requires: inside a writer command.
pub(crate) fn register(
    state: &DbState,
    coll: &str,
    vls: &Arc<CollectionVls>,
    ticket: u64,
    index: Option<&IndexRef>,
    sink: Option<&Arc<OlcpSink>>,
    capture: &[String],
) -> Reply {
    let Some(c) = state.collection(coll) else {
        return Reply::VlsGone;
    };
    if !Arc::ptr_eq(&c.vls, vls) || vls.is_dropped() {
        return Reply::VlsGone;
    }
    let captured = match index {
        None => None,
        Some(IndexRef::Id) => Some(IndexAtStart::Id(c.id_index.clone())),
        Some(IndexRef::Secondary(name)) => match c.index(name) {
            Some(ix) => Some(IndexAtStart::Secondary(ix.tree.clone())),
            // Dropped since planning: the scan cannot be answered as planned.
            None => return Reply::VlsGone,
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
                    let c = state.collection(n).cloned().unwrap_or_else(|| {
                        crate::collection::CollectionState::new(n, state.vls_options)
                    });
                    (n.clone(), c)
                })
                .collect();
            Reply::VlsRegistered {
                slot: Some(slot),
                csn: state.csn,
                next_rid: c.next_rid,
                index: captured,
                captured: taken,
            }
        }
        None => Reply::VlsRegistered {
            slot: None,
            csn: state.csn,
            next_rid: c.next_rid,
            index: None,
            captured: Vec::new(),
        },
    }
}

/// Wait briefly for a database-wide condition in tests (e.g. background resets).
#[doc(hidden)]
pub fn wait_for(mut cond: impl FnMut() -> bool, timeout: Duration) -> bool {
    let deadline = Instant::now() + timeout;
    while Instant::now() < deadline {
        if cond() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    cond()
}
