//! Finds: a query being built ([`Find`]) and its execution on the latest
//! state under the strategy [`choose`] picks, or on a held snapshot; the
//! streaming form of its result ([`FindStream`]).
//!
//! Every find runs under [`ReadLimits`]: its cancellation token is checked
//! once per page of documents examined, and a sort the plan does not provide
//! goes through a [`Sorter`] bounded by the memory limit (spilling to the
//! database's spill directory, or failing with 292 when disk use is not
//! allowed). A sort with a limit keeps only `skip + limit` documents.
//!
//! Streaming: [`Find::stream`] on a held snapshot, or on the latest state
//! when the read runs as `cow`, holds the collection version it reads (a
//! root: its nodes and documents stay shared, nothing is copied) and a
//! position ([`Walk`]), and produces documents page by page on demand — when
//! the plan provides the order (no sort, or an index/`_id` order). A sort the
//! plan does not provide is materialized in the sorter (spilled runs are
//! merged on demand). Live `vls`, `olcp` and `none` reads stay materialized:
//! a VLS/OLCP scan holds a slot (and makes the writer keep versions for it)
//! until its pass ends, so it must not wait for a client's next `getMore`,
//! and `none` has no state to resume from.
//!
//! Invariants: a stream yields exactly what [`Find::raw`] returns, in the same
//! order (`raw` is the stream collected); after an error it yields nothing.

use std::collections::VecDeque;
use std::ops::ControlFlow;
use std::path::PathBuf;
use std::sync::Arc;

use bson::{Bson, Document};

use crate::api::*;
use crate::doc::collation::Collator;
use crate::doc::{self, DocRef};
use crate::error::{CancelToken, Error, Result};
use crate::query::limits::ReadLimits;
use crate::query::planner::{self, FindSpec, Hint, Plan};
use crate::query::sorter::{SortedStream, Sorter};
use crate::query::walk::Walk;
use crate::query::{Filter, Projection, SortSpec};
use crate::snapshot::scan::{self, ScanOutcome};
use crate::snapshot::{choose, Choice, Read, Strategy};
use crate::store::collection::CollectionState;
use crate::store::DbState;

/// Name of a database's spill directory, inside its data directory.
pub const SPILL_DIR: &str = "spill";

/// How a read of a held snapshot ran: it is `cow` by construction.
fn held_outcome(csn: u64, plan: Plan) -> ScanOutcome {
    ScanOutcome {
        strategy: Strategy::Cow,
        reason: "held snapshot",
        start_csn: csn,
        plan,
        from_remset: 0,
        propagated: 0,
        inflight_peak: 0,
    }
}

fn empty_plan() -> Plan {
    Plan {
        access: planner::Access::CollScan { reverse: false },
        provides_sort: true,
    }
}

fn outcome_of(choice: Choice, csn: u64, plan: Plan) -> ScanOutcome {
    ScanOutcome {
        strategy: choice.strategy,
        reason: choice.reason,
        start_csn: csn,
        plan,
        from_remset: 0,
        propagated: 0,
        inflight_peak: 0,
    }
}

/// Where a read takes its state from.
#[derive(Clone)]
pub(crate) enum Source {
    Latest(Database),
    Fixed(Arc<DbState>),
}

impl Source {
    pub(crate) fn state(&self) -> Arc<DbState> {
        match self {
            Source::Latest(db) => db.writer().published(),
            Source::Fixed(s) => s.clone(),
        }
    }

    /// The spill directory of the database, when the source knows it.
    fn spill_dir(&self) -> Option<PathBuf> {
        match self {
            Source::Latest(db) => db.spill_dir(),
            Source::Fixed(_) => None,
        }
    }
}

impl Database {
    /// Where sorts over this database spill: `<data dir>/spill` for a
    /// database opened from a directory, `None` for an in-memory one (its
    /// reads spill to the OS temporary directory; see [`ReadLimits`]).
    pub fn spill_dir(&self) -> Option<PathBuf> {
        self.path().map(|p| p.join(SPILL_DIR))
    }
}

/// Options of a find.
#[derive(Debug, Clone, Default)]
pub struct FindOptions {
    pub sort: Option<Document>,
    pub projection: Option<Document>,
    pub skip: u64,
    /// 0 = no limit.
    pub limit: u64,
    pub hint: Option<Bson>,
    /// The `collation` option (`None`: the collection's default).
    pub collation: Option<Document>,
    /// The command's `let` variables, for the projection's expressions (a
    /// filter carries its own: `Filter::bind_let`).
    pub let_vars: Option<Document>,
}

/// A find being built; [`Find::run`] executes it.
pub struct Find {
    pub(crate) source: Source,
    pub(crate) coll: String,
    pub(crate) filter: Document,
    pub(crate) options: FindOptions,
    pub(crate) strategy: Option<Strategy>,
    pub(crate) limits: ReadLimits,
    /// The index view (`None`: the database's default, fresh for a held
    /// snapshot, which chooses with `SnapshotCollection::with_index_read`).
    pub(crate) index_read: Option<crate::store::delta::IndexRead>,
}

/// A find's result with how it was produced.
#[derive(Debug, Clone)]
pub struct FindOutcome {
    pub docs: Vec<DocRef>,
    pub scan: ScanOutcome,
}

impl Find {
    pub(crate) fn new(source: Source, coll: &str, filter: Document) -> Find {
        Find {
            source,
            coll: coll.to_string(),
            filter,
            options: FindOptions::default(),
            strategy: None,
            limits: ReadLimits::default(),
            index_read: None,
        }
    }

    /// Read the indexes in this view (`store::delta`). A stale find on the
    /// live database reads the latest published version held, as `cow`
    /// (the strategies that follow the writer would mix index views).
    pub fn index_read(mut self, read: crate::store::delta::IndexRead) -> Find {
        self.index_read = Some(read);
        self
    }

    pub fn sort(mut self, sort: Document) -> Find {
        self.options.sort = Some(sort);
        self
    }
    pub fn projection(mut self, projection: Document) -> Find {
        self.options.projection = Some(projection);
        self
    }
    pub fn skip(mut self, n: u64) -> Find {
        self.options.skip = n;
        self
    }
    /// 0 = no limit.
    pub fn limit(mut self, n: u64) -> Find {
        self.options.limit = n;
        self
    }
    /// Force an index (by name or key pattern) or `{$natural: 1}`.
    pub fn hint(mut self, hint: impl Into<Bson>) -> Find {
        self.options.hint = Some(hint.into());
        self
    }
    pub fn options(mut self, options: FindOptions) -> Find {
        // A handle's collation stays unless the options name one.
        let collation = self.options.collation.take();
        self.options = options;
        if self.options.collation.is_none() {
            self.options.collation = collation;
        }
        self
    }
    /// Read under this snapshot strategy instead of the database default.
    /// (Reads from a held [`Snapshot`] are always `cow`.)
    pub fn snapshot(mut self, strategy: Strategy) -> Find {
        self.strategy = Some(strategy);
        self
    }
    /// Run under these limits (cancellation, sort memory, disk use).
    pub fn limits(mut self, limits: ReadLimits) -> Find {
        self.limits = limits;
        self
    }
    /// Stop (with `Error::Interrupted`) once `token` is cancelled.
    pub fn cancel(mut self, token: CancelToken) -> Find {
        self.limits.cancel = token;
        self
    }
    /// May a sort over the memory limit spill to disk (MongoDB's `allowDiskUse`)?
    pub fn allow_disk_use(mut self, allow: bool) -> Find {
        self.limits.allow_disk_use = allow;
        self
    }

    /// Execute and report how: the matching stored documents (sorted, skipped,
    /// limited; unprojected), the strategy, the snapshot's csn and the plan.
    pub fn run_detailed(self) -> Result<FindOutcome> {
        if let Some((doc, scan)) = self.id_hack() {
            let docs = doc.into_iter().collect();
            return Ok(FindOutcome { docs, scan });
        }
        let (spec, _) = self.spec()?;
        self.execute(&spec)
    }

    /// MongoDB's IDHACK: a find whose filter is `{_id: <scalar>}` alone, with
    /// no sort, skip, hint or counting, read as `cow` (the choice `auto`
    /// makes for it), is one `_id` index lookup in the version read: no
    /// filter parsing, no planning, no walk. The answer, and what it reports
    /// (plan `IDHACK`, strategy, csn, the `_id` index's use), are the general
    /// path's. `None`: not such a find; the general path answers it.
    fn id_hack(&self) -> Option<(Option<DocRef>, ScanOutcome)> {
        let o = &self.options;
        if self.filter.len() != 1
            || o.skip != 0
            || o.hint.is_some()
            || o.sort.as_ref().is_some_and(|s| !s.is_empty())
            || self.limits.examined.is_some()
            || self.limits.cancel.check().is_err()
        {
            return None;
        }
        let id = self.filter.get("_id")?;
        let string = match id {
            Bson::String(_) => true,
            Bson::Int32(_)
            | Bson::Int64(_)
            | Bson::Double(_)
            | Bson::ObjectId(_)
            | Bson::Boolean(_)
            | Bson::DateTime(_)
            | Bson::Timestamp(_)
            | Bson::Decimal128(_)
            | Bson::Binary(_) => false,
            // Documents (operators or whole-document equality), arrays,
            // null, regexes and the rest keep their own semantics.
            _ => return None,
        };
        // A collation changes how strings compare; the `_id` index's is simple.
        if string && o.collation.is_some() {
            return None;
        }
        // The strategy the general path would read under; a live scan
        // (`vls`, `olcp`, `none`) is not a root lookup.
        let live = match &self.source {
            Source::Fixed(_) => None,
            Source::Latest(db) => {
                let requested = self.strategy.unwrap_or_else(|| db.default_strategy());
                if !matches!(requested, Strategy::Auto | Strategy::Cow) {
                    return None;
                }
                Some((db, requested))
            }
        };
        let state = self.source.state();
        let c = state.collection(&self.coll);
        if string && c.is_some_and(|c| c.options.collation.is_some()) {
            return None;
        }
        let raw = doc::value::to_raw(id)?;
        let found = c.and_then(|c| {
            c.id_usage.record();
            c.rid_of_id(&raw).and_then(|rid| c.heap.get(rid)).cloned()
        });
        let plan = match c {
            Some(_) => Plan {
                access: planner::Access::IdPoints { ids: vec![raw] },
                provides_sort: true,
            },
            None => empty_plan(),
        };
        let stale = |db: &Database| {
            self.index_read.unwrap_or_else(|| db.default_index_read())
                == crate::store::delta::IndexRead::Stale
        };
        let scan = match live {
            Some((db, requested)) if !stale(db) => {
                let choice = choose(requested, Read::Find { top_k: false }, c.map(|_| &plan));
                db.note_read(choice.strategy);
                outcome_of(choice, state.csn, plan)
            }
            // A stale read of the latest version reads it as a held one (the
            // `_id` index has no delta layers: stale and fresh agree).
            Some((db, _)) => {
                db.note_read(Strategy::Cow);
                held_outcome(state.csn, plan)
            }
            None => held_outcome(state.csn, plan),
        };
        Some((found, scan))
    }

    fn execute(&self, spec: &FindSpec) -> Result<FindOutcome> {
        let stream = self.open(spec)?;
        let scan = stream.scan.clone();
        let docs = stream.collect::<Result<Vec<_>>>()?;
        Ok(FindOutcome { docs, scan })
    }

    /// The matching stored documents as a stream (see the module doc for
    /// when it is lazy); unprojected.
    pub fn stream(self) -> Result<FindStream> {
        if let Some((doc, scan)) = self.id_hack() {
            let docs = doc.into_iter().collect::<Vec<_>>().into_iter();
            let limit = self.options.limit;
            return Ok(FindStream::new(
                Kind::Docs(docs),
                0,
                limit,
                self.limits.cancel,
                scan,
            ));
        }
        let (spec, _) = self.spec()?;
        self.open(&spec)
    }

    fn open(&self, spec: &FindSpec) -> Result<FindStream> {
        let filter = spec
            .filter
            .clone()
            .unwrap_or_else(|| planner::match_all().clone());
        let sort = spec.sort.as_ref().filter(|s| !s.keys.is_empty());
        let read = Read::Find {
            top_k: sort.is_some() && spec.limit > 0,
        };
        let stale = match &self.source {
            Source::Latest(db) => {
                self.index_read.unwrap_or_else(|| db.default_index_read())
                    == crate::store::delta::IndexRead::Stale
            }
            Source::Fixed(_) => self.index_read == Some(crate::store::delta::IndexRead::Stale),
        };
        let stale_state;
        let source = if stale {
            stale_state = Source::Fixed(Arc::new(self.source.state().stale_for(&self.coll)));
            if let Source::Latest(db) = &self.source {
                db.note_read(Strategy::Cow);
            }
            &stale_state
        } else {
            &self.source
        };
        let db = match source {
            Source::Fixed(state) => {
                let Some(c) = state.collection(&self.coll) else {
                    return Ok(self.done_stream(held_outcome(state.csn, empty_plan())));
                };
                let plan = planner::plan(c, &filter, sort, spec.hint.as_ref())?;
                let outcome = held_outcome(state.csn, plan);
                return self.walk_or_sort(c, filter, sort, spec, outcome);
            }
            Source::Latest(db) => db,
        };
        let requested = self.strategy.unwrap_or_else(|| db.default_strategy());
        let state = db.writer().published();
        let Some(c) = state.collection(&self.coll) else {
            db.note_read(choose(requested, read, None).strategy);
            let choice = choose(requested, read, None);
            return Ok(self.done_stream(outcome_of(choice, state.csn, empty_plan())));
        };
        let plan = planner::plan(c, &filter, sort, spec.hint.as_ref())?;
        let choice = choose(requested, read, Some(&plan));
        if choice.strategy == Strategy::Cow {
            db.note_read(Strategy::Cow);
            let outcome = outcome_of(choice, state.csn, plan);
            return self.walk_or_sort(c, filter, sort, spec, outcome);
        }
        drop(state);
        self.scan_live(db, &filter, sort, spec, requested, read)
    }

    fn done_stream(&self, scan: ScanOutcome) -> FindStream {
        FindStream::new(Kind::Done, 0, 0, self.limits.cancel.clone(), scan)
    }

    /// The number of documents a sort must keep: `skip + limit`, or all.
    fn keep(spec: &FindSpec) -> Option<usize> {
        (spec.limit > 0)
            .then(|| usize::try_from(spec.skip.saturating_add(spec.limit)).unwrap_or(usize::MAX))
    }

    fn sorter(&self, sort: &SortSpec, spec: &FindSpec) -> Sorter {
        let dir = self.limits.spill_dir_or(self.source.spill_dir());
        Sorter::new(sort.clone(), &self.limits, dir, Find::keep(spec))
    }

    /// A read of one held collection version: a lazy walk when the plan
    /// yields the order, else the matches through the sorter.
    fn walk_or_sort(
        &self,
        c: &CollectionState,
        filter: Filter,
        sort: Option<&SortSpec>,
        spec: &FindSpec,
        outcome: ScanOutcome,
    ) -> Result<FindStream> {
        let cancel = self.limits.cancel.clone();
        match sort {
            Some(sort) if !outcome.plan.provides_sort => {
                let mut sorter = self.sorter(sort, spec);
                let mut failed = None;
                // Ties in record order: every plan gives the same answer.
                planner::execute_with(c, &outcome.plan, &filter, &cancel, |rid, d| {
                    match sorter.push_tied(d.clone(), rid) {
                        Ok(()) => ControlFlow::Continue(()),
                        Err(e) => {
                            failed = Some(e);
                            ControlFlow::Break(())
                        }
                    }
                })?;
                if let Some(e) = failed {
                    return Err(e);
                }
                let sorted = sorter.finish()?;
                Ok(FindStream::new(
                    Kind::Sorted(sorted),
                    spec.skip,
                    spec.limit,
                    cancel,
                    outcome,
                ))
            }
            _ => {
                let walk = Walk::new(c, &outcome.plan);
                let kind = Kind::Walk {
                    coll: Box::new(c.clone()),
                    filter: Box::new(filter),
                    walk,
                    buffer: VecDeque::new(),
                };
                Ok(FindStream::new(
                    kind, spec.skip, spec.limit, cancel, outcome,
                ))
            }
        }
    }

    /// A live `vls`/`olcp`/`none` read: the scan runs to its end now (see
    /// the module doc), into a vector or the sorter.
    fn scan_live(
        &self,
        db: &Database,
        filter: &Filter,
        sort: Option<&SortSpec>,
        spec: &FindSpec,
        requested: Strategy,
        read: Read,
    ) -> Result<FindStream> {
        let wanted = if spec.limit > 0 {
            spec.skip.saturating_add(spec.limit)
        } else {
            u64::MAX
        };
        // Set by the planning closure: the scan yields documents in sort order
        // (a `cow` walk of a plan that provides the sort), so it may stop at `wanted`.
        let in_order = std::cell::Cell::new(false);
        let mut docs: Vec<DocRef> = Vec::new();
        let mut sorter = sort.map(|s| self.sorter(s, spec));
        let mut failed = None;
        let cancel = self.limits.cancel.clone();
        let outcome = scan::scan(
            db.writer(),
            &self.coll,
            filter,
            |c| {
                let p = planner::plan(c, filter, sort, spec.hint.as_ref())?;
                // The choice `scan` makes from this plan: a `cow` walk of a
                // plan that provides the sort yields documents in order.
                let cow = choose(requested, read, Some(&p)).strategy == Strategy::Cow;
                in_order.set(cow && p.provides_sort);
                Ok(p)
            },
            requested,
            read,
            &cancel,
            |d: &DocRef| {
                match sorter.as_mut().filter(|_| !in_order.get()) {
                    Some(s) => {
                        if let Err(e) = s.push(d.clone()) {
                            failed = Some(e);
                            return ControlFlow::Break(());
                        }
                        ControlFlow::Continue(())
                    }
                    None => {
                        docs.push(d.clone());
                        // Without a sort, or in sort order, the first `wanted`
                        // matches are the answer; stop early.
                        if docs.len() as u64 >= wanted {
                            ControlFlow::Break(())
                        } else {
                            ControlFlow::Continue(())
                        }
                    }
                }
            },
        )?;
        db.note_read(outcome.strategy);
        if let Some(e) = failed {
            return Err(e);
        }
        let kind = match sorter.filter(|_| !in_order.get()) {
            Some(s) => Kind::Sorted(s.finish()?),
            None => Kind::Docs(docs.into_iter()),
        };
        Ok(FindStream::new(
            kind, spec.skip, spec.limit, cancel, outcome,
        ))
    }

    /// The collator of this find: its `collation` option, else the
    /// collection's default (`None`: simple).
    pub fn collator(&self) -> Result<Option<Arc<Collator>>> {
        if let Some(d) = &self.options.collation {
            return Collator::from_document(d);
        }
        let state = match &self.source {
            Source::Fixed(state) => state.clone(),
            Source::Latest(db) => db.writer().published(),
        };
        Ok(state
            .collection(&self.coll)
            .and_then(|c| c.options.collation.clone()))
    }

    fn spec(&self) -> Result<(FindSpec, Option<Projection>)> {
        // `$$CLUSTER_TIME` in the filter and projection: the time of the
        // state this find reads (a live strategy's scan may take a later one).
        let read_time = match &self.source {
            Source::Fixed(state) => state.ts,
            Source::Latest(db) => db.writer().published().ts,
        };
        crate::query::expr::under_read_time(read_time, || self.spec_parsed())
    }

    fn spec_parsed(&self) -> Result<(FindSpec, Option<Projection>)> {
        let collator = self.collator()?;
        let mut filter = Filter::parse(&self.filter)?.with_collation(collator.clone());
        // explain's executionStats: count what this read examines.
        self.limits.counting(&mut filter);
        let sort = self
            .options
            .sort
            .as_ref()
            .map(SortSpec::parse)
            .transpose()?
            .map(|s| s.with_collation(collator.clone()))
            .filter(|s| !s.is_empty())
            // `$near` orders by distance unless the find sorts otherwise.
            .or_else(|| filter.near().map(SortSpec::near));
        let spec = FindSpec {
            filter: Some(filter),
            sort,
            skip: self.options.skip,
            limit: self.options.limit,
            hint: self
                .options
                .hint
                .as_ref()
                .map(Hint::from_bson)
                .transpose()?,
        };
        let projection = self
            .options
            .projection
            .as_ref()
            .filter(|p| !p.is_empty())
            .map(|p| Projection::parse_find(p, Some(&self.filter), self.options.let_vars.as_ref()))
            .transpose()?
            // Expressions, `$elemMatch` and `a.$` compare under the find's
            // collation.
            .map(|p| p.with_collation(collator));
        Ok((spec, projection))
    }

    /// The matching stored documents (shared, unprojected), sorted, skipped
    /// and limited, read under the requested strategy.
    pub fn raw(self) -> Result<Vec<DocRef>> {
        if let Some((doc, _)) = self.id_hack() {
            return Ok(doc.into_iter().collect());
        }
        let (spec, _) = self.spec()?;
        Ok(self.execute(&spec)?.docs)
    }

    /// Execute: the matching documents, sorted, skipped, limited and projected.
    pub fn run(self) -> Result<Vec<Document>> {
        let no_projection = self
            .options
            .projection
            .as_ref()
            .is_none_or(|p| p.is_empty());
        if no_projection {
            if let Some((doc, _)) = self.id_hack() {
                return doc.iter().map(|d| doc::to_document(d)).collect();
            }
        }
        let (spec, projection) = self.spec()?;
        let found = self.execute(&spec)?.docs;
        found
            .iter()
            .map(|d| match &projection {
                Some(p) => p.apply(d),
                None => doc::to_document(d),
            })
            .collect()
    }

    /// The plan the query would use (MongoDB-style `queryPlanner` document).
    pub fn explain(self) -> Result<Document> {
        let (spec, _) = self.spec()?;
        let state = self.source.state();
        let (plan, rejected): (Plan, Vec<Plan>) = match state.collection(&self.coll) {
            Some(c) => planner::plan_with_rejected(
                c,
                spec.filter
                    .as_ref()
                    .ok_or_else(|| Error::Internal("no filter".into()))?,
                spec.sort.as_ref().filter(|s| !s.keys.is_empty()),
                spec.hint.as_ref(),
            )?,
            None => {
                return Ok(
                    bson::doc! {"queryPlanner": {"namespace": self.coll.clone(), "winningPlan": {"stage": "EOF"}}},
                )
            }
        };
        let choice = match &self.source {
            Source::Fixed(_) => held_outcome(state.csn, plan.clone()).choice(),
            Source::Latest(db) => {
                let requested = self.strategy.unwrap_or_else(|| db.default_strategy());
                let top_k =
                    spec.sort.as_ref().is_some_and(|s| !s.keys.is_empty()) && spec.limit > 0;
                choose(requested, Read::Find { top_k }, Some(&plan))
            }
        };
        Ok(bson::doc! {
            "queryPlanner": {
                "namespace": self.coll.clone(),
                "parsedQuery": self.filter.clone(),
                "winningPlan": plan.explain(),
                "rejectedPlans": rejected.iter().map(|p| Bson::Document(p.explain())).collect::<Vec<_>>(),
                "summary": plan.summary(),
            },
            "csn": state.csn as i64,
            "strategy": choice.strategy.name(),
            "strategyReason": choice.reason,
        })
    }
}

/// Where a stream's documents come from.
enum Kind {
    /// A lazy walk over a held collection version, refilled page by page.
    Walk {
        /// The version read: held for as long as the stream lives (its nodes
        /// and documents are shared with every other holder, never copied).
        coll: Box<CollectionState>,
        filter: Box<Filter>,
        walk: Walk,
        buffer: VecDeque<DocRef>,
    },
    /// A sort's output (in memory, or merged from spilled runs on demand).
    Sorted(SortedStream),
    /// A materialized result (live `vls`/`olcp`/`none` reads).
    Docs(std::vec::IntoIter<DocRef>),
    Done,
}

/// The documents of a find, produced on demand, with skip and limit applied:
/// `Iterator<Item = Result<DocRef>> + Send + 'static`, so a server cursor can
/// keep it between `getMore`s. See the module doc for what it holds.
pub struct FindStream {
    kind: Kind,
    /// Matches still to drop (`skip`).
    skip: u64,
    /// Documents still to yield (`None`: no limit).
    left: Option<u64>,
    cancel: CancelToken,
    scan: ScanOutcome,
    failed: bool,
}

impl std::fmt::Debug for FindStream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FindStream")
            .field("held_bytes", &self.held_bytes())
            .field("strategy", &self.scan.strategy)
            .finish()
    }
}

impl FindStream {
    fn new(
        kind: Kind,
        skip: u64,
        limit: u64,
        cancel: CancelToken,
        scan: ScanOutcome,
    ) -> FindStream {
        FindStream {
            kind,
            skip,
            left: (limit > 0).then_some(limit),
            cancel,
            scan,
            failed: false,
        }
    }

    /// A stream over documents already materialized (a transaction's view,
    /// a result computed elsewhere), so every read can be handed on as a
    /// stream. Its [`FindStream::scan`] says `cow`, "materialized", csn 0.
    pub fn from_docs(docs: Vec<DocRef>) -> FindStream {
        let scan = ScanOutcome {
            strategy: Strategy::Cow,
            reason: "materialized",
            start_csn: 0,
            plan: empty_plan(),
            from_remset: 0,
            propagated: 0,
            inflight_peak: 0,
        };
        FindStream::new(
            Kind::Docs(docs.into_iter()),
            0,
            0,
            CancelToken::never(),
            scan,
        )
    }

    /// How the read runs: strategy (and why), the snapshot's csn, the plan.
    pub fn scan(&self) -> &ScanOutcome {
        &self.scan
    }

    /// Sorted runs the read spilled to disk (0 when the sort fit in memory).
    pub fn spilled_runs(&self) -> u64 {
        match &self.kind {
            Kind::Sorted(s) => s.spilled_runs(),
            _ => 0,
        }
    }

    /// Is it a lazy walk over a held version (as opposed to a sorted or
    /// materialized result)?
    pub fn is_streaming(&self) -> bool {
        matches!(self.kind, Kind::Walk { .. })
    }

    /// Bytes this stream holds itself: buffered or materialized documents,
    /// the sort's in-memory part, the walk's position. Not the version a
    /// walk holds, whose nodes and documents are shared with the database.
    pub fn held_bytes(&self) -> usize {
        let docs = |it: &mut dyn Iterator<Item = &DocRef>| -> usize {
            it.map(|d| d.as_bytes().len() + std::mem::size_of::<DocRef>())
                .sum()
        };
        match &self.kind {
            Kind::Walk { walk, buffer, .. } => walk.held_bytes() + docs(&mut buffer.iter()),
            Kind::Sorted(s) => s.held_bytes(),
            Kind::Docs(it) => docs(&mut it.as_slice().iter()),
            Kind::Done => 0,
        }
    }

    /// Check `token` from now on (each `getMore` of a cursor runs under its
    /// own command's token).
    pub fn set_cancel(&mut self, token: CancelToken) {
        if let Kind::Sorted(s) = &mut self.kind {
            s.set_cancel(token.clone());
        }
        self.cancel = token;
    }

    /// The next match before skip/limit.
    fn next_match(&mut self) -> Result<Option<DocRef>> {
        match &mut self.kind {
            Kind::Walk {
                coll,
                filter,
                walk,
                buffer,
            } => loop {
                if let Some(d) = buffer.pop_front() {
                    return Ok(Some(d));
                }
                if walk.is_done() {
                    return Ok(None);
                }
                self.cancel.check()?;
                walk.page(coll, filter, |_, d| {
                    buffer.push_back(d.clone());
                    ControlFlow::Continue(())
                })?;
            },
            Kind::Sorted(s) => s.next().transpose(),
            Kind::Docs(it) => Ok(it.next()),
            Kind::Done => Ok(None),
        }
    }

    fn step(&mut self) -> Result<Option<DocRef>> {
        if self.left == Some(0) {
            return Ok(None);
        }
        while self.skip > 0 {
            if self.next_match()?.is_none() {
                return Ok(None);
            }
            self.skip -= 1;
        }
        let d = self.next_match()?;
        if d.is_some() {
            if let Some(n) = &mut self.left {
                *n -= 1;
            }
        }
        Ok(d)
    }
}

impl Iterator for FindStream {
    type Item = Result<DocRef>;

    fn next(&mut self) -> Option<Result<DocRef>> {
        if self.failed {
            return None;
        }
        match self.step() {
            Ok(d) => {
                if d.is_none() {
                    self.kind = Kind::Done;
                }
                d.map(Ok)
            }
            Err(e) => {
                self.failed = true;
                self.kind = Kind::Done;
                Some(Err(e))
            }
        }
    }
}

// A server cursor keeps a stream across commands, on any thread.
const _: fn() = || {
    fn assert_send_static<T: Send + 'static>() {}
    assert_send_static::<FindStream>();
};
