//! What a pipeline reads besides the collection it scans (`$lookup`,
//! `$graphLookup`, `$unionWith`), and what one execution of a pipeline
//! shares between its stages.
//!
//! Owns: the [`Foreign`] trait (the resolver the API layer passes down: the
//! query layer never names a database or a transaction), [`Pinned`] (copy-on-write
//! roots of the named collections taken from one published state), and
//! [`Runtime`] (the resolver, the read's limits, the spill directory and the
//! cache of uncorrelated `$lookup` results).
//!
//! Invariant (one snapshot per pipeline): a [`Pinned`] holds the collections
//! of exactly one published state, the one the outer scan starts at. The
//! scan driver (`snapshot::scan`, `snapshot::olcp`) fills it at the same
//! commit boundary at which it registers (VLS/OLCP) or from the very root it
//! walks (`cow`), before visiting any document; so every stage of a pipeline
//! reads one csn. A pipeline never reads a collection it did not name before
//! the scan started ([`crate::query::aggregate::Pipeline::foreign_names`]):
//! asking a [`Pinned`] for another one is an internal error, not a read of
//! some later state.

use std::collections::HashMap;
use std::ops::ControlFlow;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, OnceLock};

use bson::{Bson, Document};

use crate::doc::DocRef;
use crate::error::{CancelToken, Error, Result};
use crate::query::limits::{default_temp_spill_dir, ReadLimits};
use crate::query::planner;
use crate::query::Filter;
use crate::store::collection::CollectionState;

/// The collections a pipeline reads besides the one it scans, as of the
/// pipeline's snapshot (or, in a transaction, as the transaction sees them).
pub trait Foreign: Sync {
    /// Visit the documents of `coll` that match `filter` (none when the
    /// collection does not exist), until `visit` breaks or fails.
    fn scan(
        &self,
        coll: &str,
        filter: &Filter,
        visit: &mut dyn FnMut(&DocRef) -> Result<ControlFlow<()>>,
    ) -> Result<()>;

    /// The commit every collection is read at (`None`: not one published
    /// state, e.g. a transaction's view with its own writes).
    fn csn(&self) -> Option<u64> {
        None
    }
}

/// A pipeline that names no other collection: reading one is a bug.
#[derive(Debug, Default, Clone, Copy)]
pub struct NoForeign;

impl Foreign for NoForeign {
    fn scan(
        &self,
        coll: &str,
        _: &Filter,
        _: &mut dyn FnMut(&DocRef) -> Result<ControlFlow<()>>,
    ) -> Result<()> {
        Err(Error::Internal(format!(
            "collection '{coll}' read by a pipeline that named no other collection"
        )))
    }
}

/// Copy-on-write roots of some collections, all from one published state
/// (see the module invariant).
#[derive(Debug, Clone)]
pub struct Pinned {
    csn: u64,
    colls: HashMap<String, Option<CollectionState>>,
    cancel: CancelToken,
}

impl Pinned {
    /// `colls` as of commit `csn` (`None`: the collection does not exist
    /// there). Requires: every root comes from the state published at `csn`.
    pub fn new(
        csn: u64,
        colls: impl IntoIterator<Item = (String, Option<CollectionState>)>,
        cancel: CancelToken,
    ) -> Pinned {
        Pinned {
            csn,
            colls: colls.into_iter().collect(),
            cancel,
        }
    }

    /// Take `names` from `state` (O(1) per name: roots are shared, not copied).
    pub fn from_state(
        state: &crate::store::DbState,
        names: &[String],
        cancel: CancelToken,
    ) -> Pinned {
        Pinned::new(
            state.csn,
            names
                .iter()
                .map(|n| (n.clone(), state.collection(n).cloned())),
            cancel,
        )
    }
}

impl Foreign for Pinned {
    fn scan(
        &self,
        coll: &str,
        filter: &Filter,
        visit: &mut dyn FnMut(&DocRef) -> Result<ControlFlow<()>>,
    ) -> Result<()> {
        let c = self.colls.get(coll).ok_or_else(|| {
            Error::Internal(format!(
                "collection '{coll}' was not pinned before the pipeline started"
            ))
        })?;
        let Some(c) = c else {
            return Ok(());
        };
        let plan = planner::plan(c, filter, None, None)?;
        let mut failed = None;
        planner::execute_with(c, &plan, filter, &self.cancel, |_, d| match visit(d) {
            Ok(flow) => flow,
            Err(e) => {
                failed = Some(e);
                ControlFlow::Break(())
            }
        })?;
        if let Some(e) = failed {
            return Err(e);
        }
        filter.check()
    }

    fn csn(&self) -> Option<u64> {
        Some(self.csn)
    }
}

/// A [`Pinned`] the scan fills once it has started (see `snapshot::scan::Capture`).
impl Foreign for OnceLock<Pinned> {
    fn scan(
        &self,
        coll: &str,
        filter: &Filter,
        visit: &mut dyn FnMut(&DocRef) -> Result<ControlFlow<()>>,
    ) -> Result<()> {
        self.get()
            .ok_or_else(|| {
                Error::Internal(format!(
                    "collection '{coll}' read before the scan pinned its snapshot"
                ))
            })?
            .scan(coll, filter, visit)
    }

    fn csn(&self) -> Option<u64> {
        self.get().and_then(Foreign::csn)
    }
}

/// What one execution of a pipeline shares between its stages (and, under
/// OLCP, between its map threads): the resolver, the read's limits, where
/// sorts spill, and the results of uncorrelated `$lookup` sub-pipelines
/// (computed once per execution, keyed by the stage's address, which does not
/// move while the pipeline runs).
pub struct Runtime<'a> {
    pub foreign: &'a dyn Foreign,
    pub limits: ReadLimits,
    pub spill_dir: PathBuf,
    cache: Mutex<HashMap<usize, Arc<Vec<Document>>>>,
    /// Runs the `$group` stages of this execution spilled (explain).
    group_spills: std::sync::atomic::AtomicU64,
    /// Partitions (and their output columns) the `$setWindowFields` stages
    /// of this execution spooled to disk (explain).
    window_spills: std::sync::atomic::AtomicU64,
    /// The input, then what each stage of the counted execution produced
    /// (explain's executionStats; `None` until a counted [`Exec`] finishes).
    ///
    /// [`Exec`]: crate::query::aggregate::Exec
    stage_counts: Mutex<Option<Vec<StageCount>>>,
}

/// What one executed stage produced: explain's per-stage `nReturned` and
/// `executionTimeMillisEstimate` (milliseconds from the start of the
/// execution to the stage's last output, so it includes the stages before
/// it, as MongoDB's estimate includes its children's time).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StageCount {
    pub returned: u64,
    pub millis: u64,
}

/// A pipeline's per-stage figures for explain: what spilled, and what each
/// executed stage (after the scan's leading `$match`es, in order; `None`
/// for a stage of an OLCP pass, whose map threads count nothing per stage)
/// returned.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StageStats {
    pub spills: StageSpills,
    pub counts: Vec<Option<StageCount>>,
}

impl StageStats {
    /// `{groupSpills, windowSpills, stageCounts: [{nReturned,
    /// executionTimeMillisEstimate} | null]}` (what explain reads).
    pub fn to_document(&self) -> Document {
        let mut d = self.spills.to_document();
        d.insert("stageCounts", counts_bson(&self.counts));
        d
    }
}

/// `stageCounts` as explain reads it.
pub fn counts_bson(counts: &[Option<StageCount>]) -> Bson {
    Bson::Array(
        counts
            .iter()
            .map(|c| match c {
                Some(c) => Bson::Document(bson::doc! {
                    "nReturned": c.returned as i64,
                    "executionTimeMillisEstimate": c.millis as i64,
                }),
                None => Bson::Null,
            })
            .collect(),
    )
}

impl std::fmt::Debug for Runtime<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Runtime")
            .field("limits", &self.limits)
            .field("spill_dir", &self.spill_dir)
            .finish_non_exhaustive()
    }
}

static NO_FOREIGN: NoForeign = NoForeign;

/// What a pipeline's stages spilled to disk (explain's per-stage `usedDisk`
/// and `spills`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StageSpills {
    /// Runs the `$group` stages spilled.
    pub group: u64,
    /// Files the `$setWindowFields` stages (and `$fill`'s) spooled.
    pub window: u64,
}

impl StageSpills {
    /// `{groupSpills, windowSpills}` (what explain reads).
    pub fn to_document(self) -> Document {
        bson::doc! {
            "groupSpills": self.group as i64,
            "windowSpills": self.window as i64,
        }
    }
}

impl<'a> Runtime<'a> {
    pub fn new(foreign: &'a dyn Foreign, limits: ReadLimits, spill_dir: PathBuf) -> Runtime<'a> {
        Runtime {
            foreign,
            limits,
            spill_dir,
            cache: Mutex::new(HashMap::new()),
            group_spills: std::sync::atomic::AtomicU64::new(0),
            window_spills: std::sync::atomic::AtomicU64::new(0),
            stage_counts: Mutex::new(None),
        }
    }

    /// Record what each stage of a counted execution produced.
    pub(super) fn note_stage_counts(&self, counts: Vec<StageCount>) {
        if let Ok(mut g) = self.stage_counts.lock() {
            *g = Some(counts);
        }
    }

    /// The counted execution's input (first), then what each of its stages
    /// produced (empty when none was counted).
    pub fn stage_counts(&self) -> Vec<StageCount> {
        self.stage_counts
            .lock()
            .ok()
            .and_then(|g| g.clone())
            .unwrap_or_default()
    }

    /// Default limits, no other collection, the OS temporary spill directory
    /// (the reference evaluation, tests).
    pub fn standalone() -> Runtime<'static> {
        Runtime::new(&NO_FOREIGN, ReadLimits::default(), default_temp_spill_dir())
    }

    /// Count runs a `$group` of this execution spilled.
    pub(super) fn note_group_spills(&self, runs: u64) {
        self.group_spills
            .fetch_add(runs, std::sync::atomic::Ordering::Relaxed);
    }

    /// Count files a `$setWindowFields` of this execution spooled.
    pub(super) fn note_window_spills(&self, files: u64) {
        self.window_spills
            .fetch_add(files, std::sync::atomic::Ordering::Relaxed);
    }

    /// Runs the `$group` stages of this execution spilled so far.
    pub fn group_spills(&self) -> u64 {
        self.group_spills.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Files the `$setWindowFields` stages of this execution spooled so far.
    pub fn window_spills(&self) -> u64 {
        self.window_spills
            .load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Both, for explain.
    pub fn spills(&self) -> StageSpills {
        StageSpills {
            group: self.group_spills(),
            window: self.window_spills(),
        }
    }

    /// The cached result of the uncorrelated sub-pipeline of the stage at
    /// `key`, computing it with `compute` the first time.
    pub(super) fn cached(
        &self,
        key: usize,
        compute: impl FnOnce() -> Result<Vec<Document>>,
    ) -> Result<Arc<Vec<Document>>> {
        if let Some(v) = self
            .cache
            .lock()
            .map_err(|_| Error::Internal("lookup cache poisoned".into()))?
            .get(&key)
        {
            return Ok(v.clone());
        }
        // Computed outside the lock: two threads may both compute it once;
        // the results are equal (same snapshot, same pipeline).
        let v = Arc::new(compute()?);
        self.cache
            .lock()
            .map_err(|_| Error::Internal("lookup cache poisoned".into()))?
            .entry(key)
            .or_insert_with(|| v.clone());
        Ok(v)
    }
}
