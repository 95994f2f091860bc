//! A resumable walk of a plan over one collection version: the position of a
//! streaming read, advanced one page at a time.
//!
//! Owns: [`Walk`], which visits exactly the documents [`planner::execute`]
//! visits, in the same order, but in pages: between two pages it holds only
//! its position (the last key or record id visited), never a result list, so
//! a cursor can keep it across `getMore`s for as long as it holds the version
//! it walks.
//!
//! Invariants:
//! - the concatenation of all pages equals `planner::execute` over the same
//!   version (same documents, same order; tested against it);
//! - a page examines at most [`PAGE_DOCS`] entries (records or index
//!   entries), so the work between two cancellation checks is bounded;
//! - what a walk holds besides its position is bounded by its plan: the
//!   `_id` list of an `IDHACK` plan, the record ids of a backward collection
//!   scan (the heap cannot iterate backwards: 8 bytes per record), and for a
//!   deduplicating index scan the ids already returned ([`Walk::held_bytes`]).
//!
//! [`planner::execute`]: crate::query::planner::execute

use std::collections::HashSet;
use std::ops::{Bound, ControlFlow};

use bson::RawBson;

use crate::doc::DocRef;
use crate::error::{Error, Result};
use crate::query::limits::PAGE_DOCS;
use crate::query::planner::{self, Access, Plan};
use crate::query::Filter;
use crate::store::collection::CollectionState;
use crate::store::heap::RecordId;
use crate::store::index::{IndexKey, ValueKey};

type EntryKey = (IndexKey, RecordId);

/// Where a walk stands.
#[derive(Debug, Clone)]
enum Pos {
    /// Forward collection scan: the next record id to look at.
    Rids {
        next: RecordId,
    },
    /// Backward collection scan: record ids, last first.
    RidList {
        rids: Vec<RecordId>,
        i: usize,
    },
    /// `_id` point lookups.
    Ids {
        ids: Vec<RawBson>,
        i: usize,
    },
    /// `_id` range; the visited side of the range shrinks past each page.
    IdRange {
        lower: Bound<ValueKey>,
        upper: Bound<ValueKey>,
        reverse: bool,
    },
    /// Secondary index intervals (in walk order), the current one and the
    /// last entry visited in it.
    Index {
        index: String,
        intervals: Vec<(Bound<EntryKey>, Bound<EntryKey>)>,
        i: usize,
        after: Option<EntryKey>,
        reverse: bool,
        seen: Option<HashSet<RecordId>>,
    },
    Done,
}

/// A plan's walk over a collection version, page by page.
#[derive(Debug, Clone)]
pub struct Walk {
    pos: Pos,
}

impl Walk {
    /// The start of `plan`'s walk over `coll`.
    pub fn new(coll: &CollectionState, plan: &Plan) -> Walk {
        planner::record_use(coll, &plan.access);
        let pos = match &plan.access {
            Access::CollScan { reverse: false } => Pos::Rids { next: 0 },
            Access::CollScan { reverse: true } => {
                let mut rids: Vec<RecordId> = coll.heap.iter().map(|(rid, _)| rid).collect();
                rids.reverse();
                Pos::RidList { rids, i: 0 }
            }
            Access::IdPoints { ids } => Pos::Ids {
                ids: ids.clone(),
                i: 0,
            },
            Access::IdRange {
                lower,
                upper,
                reverse,
            } => Pos::IdRange {
                lower: lower.clone(),
                upper: upper.clone(),
                reverse: *reverse,
            },
            Access::IndexScan {
                index,
                intervals,
                reverse,
                dedup,
                ..
            } => {
                let mut intervals = intervals.clone();
                if *reverse {
                    intervals.reverse();
                }
                Pos::Index {
                    index: index.clone(),
                    intervals,
                    i: 0,
                    after: None,
                    reverse: *reverse,
                    seen: dedup.then(HashSet::new),
                }
            }
        };
        Walk { pos }
    }

    /// Nothing more to visit.
    pub fn is_done(&self) -> bool {
        matches!(self.pos, Pos::Done)
    }

    /// Bytes the position holds (see the module invariants).
    pub fn held_bytes(&self) -> usize {
        match &self.pos {
            Pos::RidList { rids, .. } => rids.capacity() * std::mem::size_of::<RecordId>(),
            Pos::Ids { ids, .. } => ids.len() * 32,
            Pos::Index {
                seen, intervals, ..
            } => seen.as_ref().map_or(0, |s| s.capacity() * 16) + intervals.len() * 128,
            _ => 0,
        }
    }

    /// Examine at most [`PAGE_DOCS`] entries from the position on, handing
    /// every document `filter` matches to `visit` (which may stop the walk).
    /// The position moves past everything examined.
    pub fn page<F>(&mut self, coll: &CollectionState, filter: &Filter, mut visit: F) -> Result<()>
    where
        F: FnMut(RecordId, &DocRef) -> ControlFlow<()>,
    {
        let match_all = filter.is_match_all();
        let mut emit = |rid: RecordId, d: &DocRef| {
            if match_all || filter.matches(d) {
                visit(rid, d)
            } else {
                ControlFlow::Continue(())
            }
        };
        let mut stop = false;
        match &mut self.pos {
            Pos::Done => {}
            Pos::Rids { next } => {
                let mut n = 0;
                for (rid, d) in coll.heap.iter_from(*next) {
                    *next = rid + 1;
                    n += 1;
                    if emit(rid, d).is_break() {
                        stop = true;
                        break;
                    }
                    if n == PAGE_DOCS {
                        break;
                    }
                }
                stop |= n < PAGE_DOCS;
            }
            Pos::RidList { rids, i } => {
                let end = (*i + PAGE_DOCS).min(rids.len());
                while *i < end {
                    let rid = rids[*i];
                    *i += 1;
                    if let Some(d) = coll.heap.get(rid) {
                        if emit(rid, d).is_break() {
                            stop = true;
                            break;
                        }
                    }
                }
                stop |= *i >= rids.len();
            }
            Pos::Ids { ids, i } => {
                let end = (*i + PAGE_DOCS).min(ids.len());
                while *i < end {
                    let id = &ids[*i];
                    *i += 1;
                    if let Some(rid) = coll.rid_of_id(id) {
                        filter.count_key();
                        if let Some(d) = coll.heap.get(rid) {
                            if emit(rid, d).is_break() {
                                stop = true;
                                break;
                            }
                        }
                    }
                }
                stop |= *i >= ids.len();
            }
            Pos::IdRange {
                lower,
                upper,
                reverse,
            } => {
                let entries =
                    crate::query::planner::id_range(coll, lower.as_ref(), upper.as_ref(), *reverse);
                let mut n = 0;
                let mut last: Option<ValueKey> = None;
                for (k, rid) in entries {
                    n += 1;
                    filter.count_key();
                    last = Some(k.clone());
                    if let Some(d) = coll.heap.get(*rid) {
                        if emit(*rid, d).is_break() {
                            stop = true;
                            break;
                        }
                    }
                    if n == PAGE_DOCS {
                        break;
                    }
                }
                if let Some(k) = last {
                    if *reverse {
                        *upper = Bound::Excluded(k);
                    } else {
                        *lower = Bound::Excluded(k);
                    }
                }
                stop |= n < PAGE_DOCS;
            }
            Pos::Index {
                index,
                intervals,
                i,
                after,
                reverse,
                seen,
            } => {
                let ix = coll
                    .index(index)
                    .ok_or_else(|| Error::Internal(format!("planned index {index} is gone")))?;
                let mut n = 0;
                while n < PAGE_DOCS && *i < intervals.len() && !stop {
                    let (lo, hi) = &intervals[*i];
                    let (lo, hi) = match (after.as_ref(), *reverse) {
                        (None, _) => (lo.as_ref(), hi.as_ref()),
                        (Some(k), false) => (Bound::Excluded(k), hi.as_ref()),
                        (Some(k), true) => (lo.as_ref(), Bound::Excluded(k)),
                    };
                    let mut in_interval = 0;
                    let mut last: Option<EntryKey> = None;
                    // The tree gives an empty range for crossing bounds.
                    {
                        let range = ix.range(lo, hi);
                        let entries: Box<dyn Iterator<Item = (&EntryKey, &())>> = if *reverse {
                            Box::new(range.rev())
                        } else {
                            Box::new(range)
                        };
                        for (key, _) in entries {
                            n += 1;
                            filter.count_key();
                            in_interval += 1;
                            last = Some(key.clone());
                            let rid = key.1;
                            let fresh = seen.as_mut().is_none_or(|s| s.insert(rid));
                            if fresh {
                                if let Some(d) = coll.heap.get(rid) {
                                    if emit(rid, d).is_break() {
                                        stop = true;
                                        break;
                                    }
                                }
                            }
                            if n == PAGE_DOCS {
                                break;
                            }
                        }
                    }
                    let exhausted = !stop && n < PAGE_DOCS;
                    if exhausted || (in_interval == 0 && !stop) {
                        *i += 1;
                        *after = None;
                    } else if let Some(k) = last {
                        *after = Some(k);
                    }
                }
                stop |= *i >= intervals.len();
            }
        }
        if stop {
            self.pos = Pos::Done;
        }
        // An `$expr` that failed on some document fails the whole query.
        filter.check()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::query::planner::{self, Hint};
    use crate::query::SortSpec;
    use crate::store::index::IndexSpec;
    use crate::store::vls::VlsOptions;
    use bson::{doc, Document};
    use std::sync::Arc;

    fn coll(n: i32) -> CollectionState {
        let mut c = CollectionState::new("t", VlsOptions::default());
        c.create_index(IndexSpec::new(&doc! {"a": 1}, None, false).expect("test setup"))
            .expect("test setup");
        c.create_index(IndexSpec::new(&doc! {"tags": 1}, None, false).expect("test setup"))
            .expect("test setup");
        for i in 0..n {
            let d = doc! {"_id": i, "a": (i * 37) % 101, "tags": [i % 3, i % 5]};
            let raw = Arc::new(bson::RawDocumentBuf::try_from(&d).expect("test setup"));
            c.insert(raw, bson::RawBson::Int32(i)).expect("test setup");
        }
        c
    }

    fn both(c: &CollectionState, filter: Document, sort: Option<Document>, hint: Option<Hint>) {
        let f = Filter::parse(&filter).expect("test setup");
        let s = sort.map(|s| SortSpec::parse(&s).expect("test setup"));
        let plan = planner::plan(c, &f, s.as_ref(), hint.as_ref()).expect("test setup");
        let mut want = Vec::new();
        planner::execute(c, &plan, &f, |rid, _| {
            want.push(rid);
            ControlFlow::Continue(())
        })
        .expect("test setup");
        let mut got = Vec::new();
        let mut w = Walk::new(c, &plan);
        let mut pages = 0;
        while !w.is_done() {
            w.page(c, &f, |rid, _| {
                got.push(rid);
                ControlFlow::Continue(())
            })
            .expect("test setup");
            pages += 1;
            assert!(pages < 10_000, "walk does not end");
        }
        assert_eq!(got, want, "plan {}", plan.summary());
    }

    #[test]
    fn pages_concatenate_to_execute_for_every_access_path() {
        let c = coll(2000);
        both(&c, doc! {}, None, None);
        both(&c, doc! {}, None, Some(Hint::Natural { reverse: true }));
        both(
            &c,
            doc! {"_id": {"$in": (0..700).collect::<Vec<i32>>()}},
            None,
            None,
        );
        both(&c, doc! {"_id": {"$gte": 10, "$lt": 1500}}, None, None);
        both(&c, doc! {"_id": {"$gte": 10}}, Some(doc! {"_id": -1}), None);
        both(&c, doc! {"a": {"$gte": 5, "$lt": 90}}, None, None);
        both(&c, doc! {"a": {"$gte": 5}}, Some(doc! {"a": -1}), None);
        both(&c, doc! {"a": {"$in": [1, 7, 50, 99]}}, None, None);
        both(&c, doc! {"tags": {"$gte": 1}}, None, None);
        both(&c, doc! {"tags": {"$in": [0, 4]}}, None, None);
        both(
            &c,
            doc! {"a": {"$gt": 3}, "tags": 2},
            None,
            Some(Hint::Name("a_1".into())),
        );
    }

    #[test]
    fn a_page_examines_at_most_one_page_even_when_nothing_matches() {
        let c = coll(2000);
        let f = Filter::parse(&doc! {"nothing": 1}).expect("test setup");
        let plan = planner::plan(&c, &f, None, None).expect("test setup");
        let mut w = Walk::new(&c, &plan);
        w.page(&c, &f, |_, _| ControlFlow::Continue(()))
            .expect("test setup");
        assert!(!w.is_done());
        match &w.pos {
            Pos::Rids { next } => assert_eq!(*next, PAGE_DOCS as RecordId),
            other => panic!("unexpected position {other:?}"),
        }
    }
}
