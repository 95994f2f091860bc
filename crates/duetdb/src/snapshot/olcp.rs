//! `olcp_query`: one-pass commutative analytics with propagation (KVell+'s OLCP).
//!
//! `map` is called exactly once for every document of the query's start
//! snapshot that lies in its scan ranges, in no particular order, possibly on
//! several threads with one state each; `reduce` merges the states. Built on the
//! VLS bookkeeping (`vls.rs`): the status bits decide "not yet processed"; a
//! version superseded before the query reached it is handed to the query at once
//! through its sink (propagation) and dropped once mapped, so what the query
//! holds is bounded by the writes made between two drains (one page of records
//! per thread), never by how long it runs.
//!
//! Exactly once: a record is mapped from the table when the query's CAS on its
//! status bit wins, from the sink when the writer's wins (see `vls.rs`); never
//! both, never neither. Inserts after the start carry a "changed" bit and are
//! skipped. Several scan ranges are one `$or` filter, so a document in two
//! overlapping ranges is still mapped once. Documents outside the ranges are
//! never mapped; superseded ones may be handed over and are then dropped at once.
//! Debug builds check this on every query: each record read from the table
//! or handed over at most once and only from the start state, a full pass
//! reading exactly the start state's count (`ReadLog`), each record handed
//! to the sink at most once, and nothing handed over after the table pass.
//!
//! Point ranges are read "as of the start" from a copy-on-write root of the
//! named collections taken at registration (only those collections are held;
//! documents outside the declared ranges cannot be read). A [`Capture`]
//! (a pipeline's `$lookup` targets) is pinned at the same registration
//! boundary, before any document is mapped.
//!
//! Cancellation: every map thread checks the query's `CancelToken` once per
//! page; a cancelled query ends its table pass incomplete (the slot's bits
//! are reset in the background, as for a VLS scan that stopped early), drains
//! and drops what the writer handed over without mapping it, releases its
//! slot, and only then returns `Error::Interrupted`. "Exactly once" is then
//! void by design: the query has no result.

use std::collections::HashMap;
use std::ops::ControlFlow;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use bson::{doc, Bson, Document};

use crate::doc::DocRef;
use crate::error::{CancelToken, Error, Result};
use crate::query::planner;
use crate::query::Filter;
use crate::snapshot::scan::{Capture, PAGE};
use crate::snapshot::vls::{index_ref, index_rids, register_scan, ReadLog, Registered};
use crate::store::collection::CollectionState;
use crate::store::heap::RecordId;
use crate::store::vls::{CollectionVls, OlcpSink};
use crate::write::writer::Writer;

/// A declared point range: documents of `coll` matching `filter` may be read
/// by key, as of the query's start, any number of times.
#[derive(Debug, Clone)]
pub struct PointRange {
    pub coll: String,
    pub filter: Document,
}

/// Options of an OLCP query.
#[derive(Debug, Clone, Copy)]
pub struct OlcpOptions {
    /// Map threads (each with its own state).
    pub threads: usize,
}

impl Default for OlcpOptions {
    fn default() -> Self {
        OlcpOptions { threads: 1 }
    }
}

/// What an OLCP query did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct OlcpReport {
    /// The commit the query's snapshot is at.
    pub start_csn: u64,
    /// Documents mapped from the table.
    pub from_table: u64,
    /// Superseded versions handed to the query by the writer.
    pub propagated: u64,
    /// Of those, mapped (the rest lay outside the scan ranges).
    pub propagated_mapped: u64,
    /// Most handed-over versions held at once.
    pub inflight_peak: u64,
    pub threads: usize,
}

/// Reads of the declared point ranges as of the query's start.
pub struct PointReader {
    colls: HashMap<String, (CollectionState, Vec<Filter>)>,
}

impl PointReader {
    /// Documents of `coll` matching `filter` that lie in a declared point range.
    pub fn find(&self, coll: &str, filter: &Document) -> Result<Vec<DocRef>> {
        let (c, ranges) = self.colls.get(coll).ok_or_else(|| {
            Error::bad_value(format!("no point range declared on collection '{coll}'"))
        })?;
        let filter = Filter::parse(filter)?;
        let plan = planner::plan(c, &filter, None, None)?;
        let mut out = Vec::new();
        planner::execute(c, &plan, &filter, |_, d| {
            if ranges.iter().any(|r| r.matches(d)) {
                out.push(d.clone());
            }
            ControlFlow::Continue(())
        })?;
        Ok(out)
    }
}

/// Run `map` exactly once over every document of the start snapshot of
/// `coll` that matches one of `scan_ranges` (an empty list means the whole
/// collection; a range is a filter, typically a range on `_id` or an indexed
/// field), with `point_ranges` readable as of the start, then `reduce` the
/// per-thread states; stop when `cancel` is cancelled (see the module doc).
#[allow(clippy::too_many_arguments)]
pub fn olcp_query_with<S, I, M, R>(
    writer: &Writer,
    coll: &str,
    scan_ranges: &[Document],
    point_ranges: &[PointRange],
    init: I,
    map: M,
    reduce: R,
    options: OlcpOptions,
    cancel: &CancelToken,
    capture: Option<Capture<'_>>,
) -> Result<(S, OlcpReport)>
where
    S: Send,
    I: Fn() -> S + Sync,
    M: Fn(&mut S, &DocRef, &PointReader) -> Result<()> + Sync,
    R: Fn(S, S) -> S,
{
    let filter = Filter::parse(&scan_filter(scan_ranges))?;
    let point_filters: Vec<(String, Filter)> = point_ranges
        .iter()
        .map(|p| Ok((p.coll.clone(), Filter::parse(&p.filter)?)))
        .collect::<Result<_>>()?;
    let mut query = match start(writer, coll, &filter, &point_filters, cancel, capture)? {
        Started::Absent { csn } => {
            let report = OlcpReport {
                start_csn: csn,
                threads: 0,
                ..Default::default()
            };
            return Ok((init(), report));
        }
        Started::Running(q) => q,
    };
    let threads = options.threads.clamp(1, 64);
    let pass = MapPass {
        writer,
        coll,
        vls: &query.vls,
        slot: query.reg.slot,
        sink: &query.sink,
        filter: &filter,
        points: &query.points,
        map: &map,
        cancel,
        from_table: AtomicU64::new(0),
        mapped_propagated: AtomicU64::new(0),
        first_error: Mutex::new(None),
    };
    let (states, mut read) = pass.run(&query.work, threads, &init, query.reg.start_next_rid)?;
    let cancelled = cancel.check().err();
    let complete = matches!(query.work, Work::Rids { .. }) && cancelled.is_none();
    query.reg.guard.finish_table(complete)?;
    // Nothing is handed over after the end of the table pass: map the rest
    // (a cancelled query only drops it).
    let mut states = states.into_iter();
    let mut acc = states.next().unwrap_or_else(&init);
    for (rid, d) in query.sink.drain() {
        read.read(rid, "sink");
        if cancelled.is_none() && filter.matches(&d) {
            pass.mapped_propagated.fetch_add(1, Ordering::Relaxed);
            map(&mut acc, &d, &query.points)?;
        }
    }
    debug_assert_eq!(
        query.sink.inflight(),
        0,
        "versions handed to an OLCP query after its table pass"
    );
    // OLCP slots never get remset entries; release just frees the slot.
    query.reg.guard.release(!complete);
    if let Some(e) = cancelled {
        return Err(e);
    }
    if query.vls.is_dropped() {
        return Err(Error::QueryPlanKilled(format!(
            "collection {coll} was dropped or renamed during the query"
        )));
    }
    if complete {
        // Every start-state document was mapped from the table or handed over.
        read.check_complete(query.reg.start_len);
    }
    if let Some(e) = pass.first_error.lock().ok().and_then(|mut g| g.take()) {
        return Err(e);
    }
    // An `$expr` that failed on some document fails the whole query.
    filter.check()?;
    for s in states {
        acc = reduce(acc, s);
    }
    let report = OlcpReport {
        start_csn: query.reg.start_csn,
        from_table: pass.from_table.load(Ordering::Relaxed),
        propagated: query.sink.propagated(),
        propagated_mapped: pass.mapped_propagated.load(Ordering::Relaxed),
        inflight_peak: query.sink.inflight_peak(),
        threads,
    };
    Ok((acc, report))
}

/// The scan ranges as one filter (several ranges are one `$or`, so a
/// document in two overlapping ranges is still mapped once).
fn scan_filter(scan_ranges: &[Document]) -> Document {
    match scan_ranges {
        [] => Document::new(),
        [one] => one.clone(),
        many => doc! {"$or": many.iter().cloned().map(Bson::Document).collect::<Vec<_>>()},
    }
}

/// How an OLCP query started.
enum Started<'a> {
    /// The collection does not exist (at commit `csn`): nothing to map.
    Absent {
        csn: u64,
    },
    Running(Running<'a>),
}

/// A registered OLCP query: its slot, sink, point ranges and table work.
struct Running<'a> {
    reg: Registered<'a>,
    vls: Arc<CollectionVls>,
    sink: Arc<OlcpSink>,
    points: PointReader,
    work: Work,
}

/// Plan the query, register it at a commit boundary with a sink, capture the
/// point-range collections, and list its table work.
fn start<'a>(
    writer: &'a Writer,
    coll: &str,
    filter: &Filter,
    point_filters: &[(String, Filter)],
    cancel: &CancelToken,
    capture: Option<Capture<'_>>,
) -> Result<Started<'a>> {
    let published = writer.published();
    let Some(c) = published.collection(coll) else {
        if let Some(cap) = capture {
            cap.pin_from_state(&published, cancel);
        }
        return Ok(Started::Absent { csn: published.csn });
    };
    let plan = planner::plan(c, filter, None, None)?;
    let vls = c.vls.clone();
    drop(published);
    let sink = Arc::new(OlcpSink::default());
    let mut names: Vec<String> = point_filters.iter().map(|(c, _)| c.clone()).collect();
    if let Some(cap) = capture {
        names.extend(cap.names.iter().cloned());
    }
    let index_ref = index_ref(&plan.access);
    let mut reg = register_scan(
        writer,
        coll,
        &vls,
        index_ref,
        Some(sink.clone()),
        names,
        cancel,
    )?;
    if let Some(cap) = capture {
        cap.pin_from_captured(reg.start_csn, &reg.captured, cancel);
    }
    let captured = std::mem::take(&mut reg.captured)
        .into_iter()
        .filter(|(n, _)| point_filters.iter().any(|(p, _)| p == n))
        .collect();
    let points = point_reader(captured, point_filters);
    let work = match reg.index.take() {
        None => Work::Rids {
            end: reg.start_next_rid,
        },
        Some(ix) => Work::List(index_rids(&ix, &plan)),
    };
    Ok(Started::Running(Running {
        reg,
        vls,
        sink,
        points,
        work,
    }))
}

/// The table pass of an OLCP query, shared by its map threads.
struct MapPass<'q, M> {
    writer: &'q Writer,
    coll: &'q str,
    vls: &'q Arc<CollectionVls>,
    slot: usize,
    sink: &'q OlcpSink,
    filter: &'q Filter,
    points: &'q PointReader,
    map: &'q M,
    cancel: &'q CancelToken,
    /// Documents mapped from the table, and handed-over versions mapped.
    from_table: AtomicU64,
    mapped_propagated: AtomicU64,
    /// The first error `map` returned (the threads go on; the query fails).
    first_error: Mutex<Option<Error>>,
}

impl<M> MapPass<'_, M> {
    /// Run the table pass on `threads` threads, each with its own state;
    /// returns the states and what the threads read.
    fn run<S, I>(
        &self,
        work: &Work,
        threads: usize,
        init: &I,
        start_next_rid: RecordId,
    ) -> Result<(Vec<S>, ReadLog)>
    where
        S: Send,
        I: Fn() -> S + Sync,
        M: Fn(&mut S, &DocRef, &PointReader) -> Result<()> + Sync,
    {
        let done: Vec<(S, ReadLog)> = std::thread::scope(|scope| {
            let handles: Vec<_> = (0..threads)
                .map(|t| scope.spawn(move || self.thread(work, t, threads, init())))
                .collect();
            handles.into_iter().filter_map(|h| h.join().ok()).collect()
        });
        if done.len() != threads {
            return Err(Error::Internal("an OLCP map thread panicked".into()));
        }
        let mut read = ReadLog::new(start_next_rid);
        let mut states = Vec::with_capacity(threads);
        for (state, log) in done {
            read.merge(log);
            states.push(state);
        }
        Ok((states, read))
    }

    /// Thread `t` of `n`: its share of the work, page by page, draining the
    /// sink before each page.
    fn thread<S>(&self, work: &Work, t: usize, n: usize, mut state: S) -> (S, ReadLog)
    where
        M: Fn(&mut S, &DocRef, &PointReader) -> Result<()>,
    {
        let mut read = ReadLog::new(RecordId::MAX);
        for (lo, hi) in work.chunks(t, n) {
            let mut i = lo;
            while i < hi {
                if self.cancel.is_cancelled() {
                    break;
                }
                for (rid, d) in self.sink.drain() {
                    read.read(rid, "sink");
                    self.apply(&mut state, &d, &self.mapped_propagated);
                }
                let end = (i + PAGE as u64).min(hi);
                if !self.page(work, i, end, &mut state, &mut read) {
                    break;
                }
                i = end;
            }
        }
        (state, read)
    }

    /// Claim and map the positions `i..end` of `work` on the latest state;
    /// false once the collection was dropped or renamed.
    fn page<S>(&self, work: &Work, i: u64, end: u64, state: &mut S, read: &mut ReadLog) -> bool
    where
        M: Fn(&mut S, &DocRef, &PointReader) -> Result<()>,
    {
        let latest = self.writer.published();
        let view = self.vls.status_view();
        let Some(c) = latest.collection(self.coll) else {
            return false;
        };
        if !Arc::ptr_eq(&c.vls, self.vls) {
            return false;
        }
        let mut claim = |rid: RecordId, d: &DocRef| {
            if self.vls.claim(&view, self.slot, rid) {
                read.read(rid, "table");
                self.apply(state, d, &self.from_table);
            }
        };
        match work {
            Work::Rids { .. } => {
                for (rid, d) in c.heap.iter_from(i) {
                    if rid >= end {
                        break;
                    }
                    claim(rid, d);
                }
            }
            Work::List(rids) => {
                for &rid in &rids[i as usize..end as usize] {
                    if let Some(d) = c.heap.get(rid) {
                        claim(rid, d);
                    }
                }
            }
        }
        true
    }

    /// Map `d` if it lies in the scan ranges, counting it in `counter`.
    fn apply<S>(&self, state: &mut S, d: &DocRef, counter: &AtomicU64)
    where
        M: Fn(&mut S, &DocRef, &PointReader) -> Result<()>,
    {
        if self.filter.matches(d) {
            counter.fetch_add(1, Ordering::Relaxed);
            if let Err(e) = (self.map)(state, d, self.points) {
                if let Ok(mut g) = self.first_error.lock() {
                    g.get_or_insert(e);
                }
            }
        }
    }
}

/// The point ranges over the collections captured at the start.
fn point_reader(
    captured: Vec<(String, CollectionState)>,
    ranges: &[(String, Filter)],
) -> PointReader {
    let mut colls: HashMap<String, (CollectionState, Vec<Filter>)> = HashMap::new();
    for (name, c) in captured {
        colls.insert(name, (c, Vec::new()));
    }
    for (name, f) in ranges {
        if let Some(entry) = colls.get_mut(name) {
            entry.1.push(f.clone());
        }
    }
    PointReader { colls }
}

/// The table work of a query, split among threads.
enum Work {
    /// Record ids `0..end` (a full pass).
    Rids { end: RecordId },
    /// Record ids from the start-time index, in index order.
    List(Vec<RecordId>),
}

impl Work {
    /// Thread `t` of `n`: contiguous ranges of positions (`Rids`: record ids;
    /// `List`: indexes into the list).
    fn chunks(&self, t: usize, n: usize) -> Vec<(u64, u64)> {
        let len = match self {
            Work::Rids { end } => *end,
            Work::List(v) => v.len() as u64,
        };
        let per = len.div_ceil(n as u64).max(1);
        let lo = per * t as u64;
        let hi = (lo + per).min(len);
        if lo >= hi {
            Vec::new()
        } else {
            vec![(lo, hi)]
        }
    }
}
