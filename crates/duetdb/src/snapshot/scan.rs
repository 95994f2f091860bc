//! The scan driver: visit the documents a plan reaches under a strategy
//! (chosen by [`crate::snapshot::choose`]). `cow` walks one held root, `none`
//! reloads the latest root page by page, `vls` and `olcp` are in
//! [`crate::snapshot::vls`].
//!
//! Every strategy checks the read's [`CancelToken`] once per page of records
//! examined ([`PAGE`]), matching or not: a cancelled scan returns
//! `Error::Interrupted` within one page, after releasing what it holds (a
//! VLS/OLCP slot goes through its ordinary end-of-scan path, so the status
//! masks and the remset stay consistent).
//!
//! A scan may also pin other collections at its own snapshot ([`Capture`]:
//! a pipeline's `$lookup`/`$unionWith` targets): taken from the root a
//! `cow` scan walks, the first root a `none` scan reads, or the state at a
//! VLS/OLCP registration boundary, and always before the first visit — so
//! the scanned collection and the pinned ones are one csn.

use std::ops::{Bound, ControlFlow};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use crate::doc::DocRef;
use crate::error::{CancelToken, Result};
use crate::query::aggregate::Pinned;
use crate::query::planner::{self, Access, Plan};
use crate::query::Filter;
use crate::snapshot::vls::vls_scan;
use crate::snapshot::{choose, Read, Strategy};
use crate::store::btree::BTree;
use crate::store::collection::CollectionState;
use crate::store::heap::RecordId;
use crate::store::index::{IndexKey, IndexState, ValueKey};
use crate::store::vls::OlcpSink;
use crate::store::DbState;
use crate::write::writer::Writer;

/// Records read from one published state before reloading the latest one: small
/// enough that a VLS scan never pins old versions for long, large enough that the
/// reload (an atomic pointer load) costs nothing per record.
pub(crate) const PAGE: usize = 256;

/// What a scan did.
#[derive(Debug, Clone)]
pub struct ScanOutcome {
    /// The strategy that actually ran (never `auto`).
    pub strategy: Strategy,
    /// Why [`choose`] picked it (explain's `strategyReason`).
    pub reason: &'static str,
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

impl ScanOutcome {
    /// The strategy that ran and why.
    pub fn choice(&self) -> crate::snapshot::Choice {
        crate::snapshot::Choice {
            strategy: self.strategy,
            reason: self.reason,
        }
    }
}

/// The index a VLS scan walks, as of the scan's start.
#[derive(Debug, Clone)]
pub enum IndexAtStart {
    Id(BTree<ValueKey, RecordId>),
    /// The index version (merged tree and delta layers: read fresh).
    Secondary(Box<IndexState>),
}

/// Which index to capture at registration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum IndexRef {
    Id,
    Secondary(String),
}

/// Other collections a scan pins at its own snapshot (see the module doc).
#[derive(Debug, Clone, Copy)]
pub struct Capture<'a> {
    pub names: &'a [String],
    /// Filled once, before the scan's first visit.
    pub into: &'a OnceLock<Pinned>,
}

impl Capture<'_> {
    /// Pin `names` from `state` (O(1) per name).
    pub(crate) fn pin_from_state(&self, state: &DbState, cancel: &CancelToken) {
        let _ = self
            .into
            .set(Pinned::from_state(state, self.names, cancel.clone()));
    }

    /// Pin the roots a registration boundary captured at `csn`.
    pub(crate) fn pin_from_captured(
        &self,
        csn: u64,
        captured: &[(String, CollectionState)],
        cancel: &CancelToken,
    ) {
        let colls = captured
            .iter()
            .filter(|(n, _)| self.names.contains(n))
            .map(|(n, c)| (n.clone(), Some(c.clone())));
        let _ = self.into.set(Pinned::new(csn, colls, cancel.clone()));
    }
}

/// Visit every document matching `filter` in collection `coll`, under the
/// strategy [`choose`] picks for `requested` and `read` once the plan is
/// known, until `visit` breaks or `cancel` is cancelled (then
/// `Err(Interrupted)`). Documents come in plan order for `cow`; for `vls` the
/// remset's documents come last; `none` gives no order guarantee.
#[allow(clippy::too_many_arguments)]
pub fn scan<F>(
    writer: &Writer,
    coll: &str,
    filter: &Filter,
    plan_for: impl Fn(&CollectionState) -> Result<Plan>,
    requested: Strategy,
    read: Read,
    cancel: &CancelToken,
    visit: F,
) -> Result<ScanOutcome>
where
    F: FnMut(&DocRef) -> ControlFlow<()>,
{
    scan_capturing(
        writer, coll, filter, plan_for, requested, read, cancel, None, visit,
    )
}

/// [`scan`] that first pins `capture`'s collections at the scan's snapshot.
#[allow(clippy::too_many_arguments)]
pub fn scan_capturing<F>(
    writer: &Writer,
    coll: &str,
    filter: &Filter,
    plan_for: impl Fn(&CollectionState) -> Result<Plan>,
    requested: Strategy,
    read: Read,
    cancel: &CancelToken,
    capture: Option<Capture<'_>>,
    mut visit: F,
) -> Result<ScanOutcome>
where
    F: FnMut(&DocRef) -> ControlFlow<()>,
{
    let state = writer.published();
    let Some(c) = state.collection(coll) else {
        if let Some(cap) = capture {
            cap.pin_from_state(&state, cancel);
        }
        let choice = choose(requested, read, None);
        return Ok(ScanOutcome {
            strategy: choice.strategy,
            reason: choice.reason,
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
    let choice = choose(requested, read, Some(&plan));
    debug_assert_ne!(choice.strategy, Strategy::Auto, "choose() resolves auto");
    let done = |start_csn, plan| ScanOutcome {
        strategy: choice.strategy,
        reason: choice.reason,
        start_csn,
        plan,
        from_remset: 0,
        propagated: 0,
        inflight_peak: 0,
    };
    match choice.strategy {
        Strategy::Cow | Strategy::Auto => {
            if let Some(cap) = capture {
                cap.pin_from_state(&state, cancel);
            }
            planner::execute_with(c, &plan, filter, cancel, |_, d| visit(d))?;
            Ok(done(state.csn, plan))
        }
        Strategy::None => {
            let start_csn = state.csn;
            if let Some(cap) = capture {
                cap.pin_from_state(&state, cancel);
            }
            drop(state);
            none_scan(writer, coll, filter, &plan, cancel, &mut visit)?;
            // An `$expr` that failed on some document fails the whole read.
            filter.check()?;
            Ok(done(start_csn, plan))
        }
        Strategy::Vls | Strategy::Olcp => {
            let vls = c.vls.clone();
            drop(state);
            let sink = (choice.strategy == Strategy::Olcp).then(|| Arc::new(OlcpSink::default()));
            let mut outcome = vls_scan(
                writer, coll, vls, filter, plan, sink, cancel, capture, &mut visit,
            )?;
            filter.check()?;
            outcome.reason = choice.reason;
            Ok(outcome)
        }
    }
}

/// Count the documents matching `filter` under the strategy [`choose`]
/// picks. Counting everything under `cow` reads one root's size (O(1)).
pub fn count(
    writer: &Writer,
    coll: &str,
    filter: &Filter,
    requested: Strategy,
    cancel: &CancelToken,
) -> Result<(u64, ScanOutcome)> {
    let match_all = filter.is_match_all();
    let read = Read::Count { match_all };
    if match_all {
        let state = writer.published();
        let plan = Plan {
            access: Access::CollScan { reverse: false },
            provides_sort: false,
        };
        let c = state.collection(coll);
        let choice = choose(requested, read, c.map(|_| &plan));
        if choice.strategy == Strategy::Cow {
            let n = c.map_or(0, |c| c.len() as u64);
            let outcome = ScanOutcome {
                strategy: choice.strategy,
                reason: choice.reason,
                start_csn: state.csn,
                plan,
                from_remset: 0,
                propagated: 0,
                inflight_peak: 0,
            };
            return Ok((n, outcome));
        }
    }
    let mut n = 0u64;
    let outcome = scan(
        writer,
        coll,
        filter,
        |c| planner::plan(c, filter, None, None),
        requested,
        read,
        cancel,
        |_| {
            n += 1;
            ControlFlow::Continue(())
        },
    )?;
    Ok((n, outcome))
}

/// `none`: walk the plan over the *latest* state, reloading it page by page.
fn none_scan<F>(
    writer: &Writer,
    coll: &str,
    filter: &Filter,
    plan: &Plan,
    cancel: &CancelToken,
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
            if let Some(c) = writer.published().collection(coll) {
                planner::record_use(c, &plan.access);
            }
            for (lo, hi) in intervals {
                let mut lower: Bound<(IndexKey, RecordId)> = lo.clone();
                loop {
                    cancel.check()?;
                    let state = writer.published();
                    let Some(c) = state.collection(coll) else {
                        return Ok(());
                    };
                    let Some(ix) = c.index(index) else {
                        return Ok(());
                    };
                    let mut n = 0;
                    let mut last = None;
                    for (key, _) in ix.range(lower.as_ref(), hi.as_ref()) {
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
                cancel.check()?;
                let state = writer.published();
                let Some(c) = state.collection(coll) else {
                    return Ok(());
                };
                let mut n = 0;
                for (rid, d) in crate::doc::prefetching(c.heap.iter_from(next)) {
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
            let state = writer.published();
            if let Some(c) = state.collection(coll) {
                planner::execute_with(c, plan, filter, cancel, |_, d| visit(d))?;
            }
            Ok(())
        }
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
