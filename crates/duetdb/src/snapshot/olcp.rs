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
//!
//! Point ranges are read "as of the start" from a copy-on-write root of the
//! named collections taken at registration (only those collections are held;
//! documents outside the declared ranges cannot be read).

use std::collections::HashMap;
use std::ops::ControlFlow;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use bson::{doc, Bson, Document};

use crate::doc::DocRef;
use crate::error::{Error, Result};
use crate::query::planner::{self, Access};
use crate::query::Filter;
use crate::snapshot::scan::{IndexRef, PAGE};
use crate::snapshot::vls::{index_rids, register_scan};
use crate::store::collection::CollectionState;
use crate::store::heap::RecordId;
use crate::store::vls::OlcpSink;
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
/// per-thread states.
#[allow(clippy::too_many_arguments)]
pub fn olcp_query<S, I, M, R>(
    writer: &Writer,
    coll: &str,
    scan_ranges: &[Document],
    point_ranges: &[PointRange],
    init: I,
    map: M,
    reduce: R,
    options: OlcpOptions,
) -> Result<(S, OlcpReport)>
where
    S: Send,
    I: Fn() -> S + Sync,
    M: Fn(&mut S, &DocRef, &PointReader) -> Result<()> + Sync,
    R: Fn(S, S) -> S,
{
    let filter_doc = match scan_ranges {
        [] => Document::new(),
        [one] => one.clone(),
        many => doc! {"$or": many.iter().cloned().map(Bson::Document).collect::<Vec<_>>()},
    };
    let filter = Filter::parse(&filter_doc)?;
    let point_filters: Vec<(String, Filter)> = point_ranges
        .iter()
        .map(|p| Ok((p.coll.clone(), Filter::parse(&p.filter)?)))
        .collect::<Result<_>>()?;

    let published = writer.published();
    let Some(c) = published.collection(coll) else {
        return Ok((
            init(),
            OlcpReport {
                start_csn: published.csn,
                threads: 0,
                ..Default::default()
            },
        ));
    };
    let plan = planner::plan(c, &filter, None, None)?;
    let vls = c.vls.clone();
    drop(published);
    let index_ref = match &plan.access {
        Access::CollScan { .. } => None,
        Access::IdPoints { .. } | Access::IdRange { .. } => Some(IndexRef::Id),
        Access::IndexScan { index, .. } => Some(IndexRef::Secondary(index.clone())),
    };
    let sink = Arc::new(OlcpSink::default());
    let capture: Vec<String> = point_filters.iter().map(|(c, _)| c.clone()).collect();
    let mut reg = register_scan(writer, coll, &vls, index_ref, Some(sink.clone()), capture)?;
    let points = point_reader(std::mem::take(&mut reg.captured), &point_filters);

    let work: Work = match reg.index.take() {
        None => Work::Rids {
            end: reg.start_next_rid,
        },
        Some(ix) => Work::List(index_rids(&ix, &plan)),
    };
    let threads = options.threads.clamp(1, 64);
    let from_table = AtomicU64::new(0);
    let mapped_propagated = AtomicU64::new(0);
    let first_error: Mutex<Option<Error>> = Mutex::new(None);
    let slot = reg.slot;
    let fail = |e: Error| {
        if let Ok(mut g) = first_error.lock() {
            g.get_or_insert(e);
        }
    };
    let states: Vec<S> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..threads)
            .map(|t| {
                let (work, filter, sink, vls, points) = (&work, &filter, &sink, &vls, &points);
                let (map, init, from_table, mapped_propagated, fail) =
                    (&map, &init, &from_table, &mapped_propagated, &fail);
                scope.spawn(move || {
                    let mut state = init();
                    let apply = |d: &DocRef, state: &mut S, counter: &AtomicU64| {
                        if filter.matches(d) {
                            counter.fetch_add(1, Ordering::Relaxed);
                            if let Err(e) = map(state, d, points) {
                                fail(e);
                            }
                        }
                    };
                    let chunks = work.chunks(t, threads);
                    for (lo, hi) in chunks {
                        let mut i = lo;
                        while i < hi {
                            for (_, d) in sink.drain() {
                                apply(&d, &mut state, mapped_propagated);
                            }
                            let end = (i + PAGE as u64).min(hi);
                            let latest = writer.published();
                            let view = vls.status_view();
                            let Some(c) = latest.collection(coll) else {
                                break;
                            };
                            if !Arc::ptr_eq(&c.vls, vls) {
                                break;
                            }
                            match work {
                                Work::Rids { .. } => {
                                    for (rid, d) in c.heap.iter_from(i) {
                                        if rid >= end {
                                            break;
                                        }
                                        if vls.claim(&view, slot, rid) {
                                            apply(d, &mut state, from_table);
                                        }
                                    }
                                }
                                Work::List(rids) => {
                                    for &rid in &rids[i as usize..end as usize] {
                                        if let Some(d) = c.heap.get(rid) {
                                            if vls.claim(&view, slot, rid) {
                                                apply(d, &mut state, from_table);
                                            }
                                        }
                                    }
                                }
                            }
                            i = end;
                        }
                    }
                    state
                })
            })
            .collect();
        handles.into_iter().filter_map(|h| h.join().ok()).collect()
    });
    if states.len() != threads {
        return Err(Error::Internal("an OLCP map thread panicked".into()));
    }
    let complete = matches!(work, Work::Rids { .. });
    reg.guard.finish_table(complete)?;
    // Nothing is handed over after the end of the table pass: map the rest.
    let mut states = states.into_iter();
    let mut acc = states.next().unwrap_or_else(&init);
    for (_, d) in sink.drain() {
        if filter.matches(&d) {
            mapped_propagated.fetch_add(1, Ordering::Relaxed);
            map(&mut acc, &d, &points)?;
        }
    }
    // OLCP slots never get remset entries; release just frees the slot.
    reg.guard.release(!complete);
    if vls.is_dropped() {
        return Err(Error::QueryPlanKilled(format!(
            "collection {coll} was dropped or renamed during the query"
        )));
    }
    if let Some(e) = first_error.lock().ok().and_then(|mut g| g.take()) {
        return Err(e);
    }
    for s in states {
        acc = reduce(acc, s);
    }
    let report = OlcpReport {
        start_csn: reg.start_csn,
        from_table: from_table.load(Ordering::Relaxed),
        propagated: sink.propagated(),
        propagated_mapped: mapped_propagated.load(Ordering::Relaxed),
        inflight_peak: sink.inflight_peak(),
        threads,
    };
    Ok((acc, report))
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
