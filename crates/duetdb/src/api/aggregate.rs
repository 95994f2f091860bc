//! Aggregation on live collections, held snapshots and whole databases: the
//! pipeline is prepared in `query::aggregate` (parse with the command's
//! `let`, commutative split), its strategy chosen by [`choose`], then the
//! scanned documents are pushed through the pipeline's executor
//! ([`crate::query::aggregate::Exec`]) one at a time — or, under OLCP, the
//! commutative part runs on the map threads and its output is pushed
//! through the rest. A pipeline ending in `$out`/`$merge` then writes its
//! output as one writer command (`api::out`).
//!
//! One snapshot per pipeline: every collection a pipeline reads besides its
//! own (`$lookup`, `$graphLookup`, `$unionWith`, in sub-pipelines too) is
//! pinned by the scan itself, from the very state it starts at (the `cow`
//! root, or the VLS/OLCP registration boundary; `snapshot::scan::Capture`),
//! before the first document is visited. So a `$lookup` sees the other
//! collection at the same csn as the outer scan, under every strategy,
//! although neither is held for the whole read under `vls`/`olcp`: only the
//! pinned *other* collections are (their copy-on-write roots). MongoDB gives
//! no such guarantee outside a transaction.
//!
//! Every aggregation runs under [`ReadLimits`]: the scan, the OLCP threads and
//! the executor check its cancellation token once per page, a `$sort` is
//! bounded by its memory limit (spilled or 292), a `$group` too (292). Under
//! OLCP without a `$group`, each map thread hands its output to the shared
//! executor every page, so nothing is materialized before the rest's `$sort`.

use std::ops::ControlFlow;
use std::sync::{Arc, Mutex, OnceLock};

use bson::Document;

use crate::api::{Collection, Database, SnapshotCollection};
use crate::doc::collation::Collator;
use crate::error::{Error, Result};
pub use crate::query::aggregate::StageSpills;
use crate::query::aggregate::{
    counts_bson, prepare_collated, prepare_with, Exec, PartialState, Pinned, Prepared, Runtime,
    StageCount, StageStats,
};
use crate::query::limits::{ReadLimits, PAGE_DOCS};
use crate::query::{planner, Filter};
use crate::snapshot::olcp::{self, OlcpOptions};
use crate::snapshot::scan::{self, Capture};
use crate::snapshot::{choose, Choice, Read, Strategy};

/// How an aggregation ran (or would run).
#[derive(Debug, Clone)]
pub struct AggregateExplain {
    /// Could an out-of-order (OLCP) scan run it? See [`Split::olcp_eligible`].
    pub olcp_eligible: bool,
    /// The scan's filter (`{}` for all documents).
    pub scan_filter: Document,
    /// Stages evaluated during the scan, per document (and the merged `$group`).
    pub commutative_stages: Vec<String>,
    /// Stages run afterwards on the materialized output.
    pub rest_stages: Vec<String>,
    /// The strategy that actually ran (never `auto`).
    pub strategy: Strategy,
    /// Why [`choose`] picked it.
    pub reason: &'static str,
    /// The snapshot's commit number.
    pub start_csn: u64,
    /// The scan plan (`winningPlan`-style).
    pub plan: Document,
    /// Documents the scan read from the VLS remset.
    pub from_remset: u64,
    /// Whether the scan stopped early because of a leading `$limit`.
    pub stopped_early: bool,
    /// The commit the other collections (`$lookup`, `$unionWith`, ...) were
    /// read at: always `start_csn` (one snapshot per pipeline).
    pub foreign_csn: Option<u64>,
    /// What the pipeline's `$group` and `$setWindowFields` stages spilled
    /// to disk (MongoDB's per-stage `spills`; `usedDisk` when above 0).
    pub spills: StageSpills,
    /// What each executed stage (after the scan filter: the commutative
    /// part's, then the rest's) returned, when the read was counted
    /// (`ReadLimits::examined`); `None` for the stages of an OLCP pass but
    /// its last (whose output the rest received).
    pub stage_counts: Vec<Option<StageCount>>,
}

impl AggregateExplain {
    pub fn to_document(&self) -> Document {
        bson::doc! {
            "olcpEligible": self.olcp_eligible,
            "scanFilter": self.scan_filter.clone(),
            "commutativeStages": self.commutative_stages.clone(),
            "restStages": self.rest_stages.clone(),
            "strategy": self.strategy.name(),
            "strategyReason": self.reason,
            "csn": self.start_csn as i64,
            "winningPlan": self.plan.clone(),
            "fromRemset": self.from_remset as i64,
            "stoppedEarly": self.stopped_early,
            "foreignCsn": self.foreign_csn.map(|c| c as i64),
            "usedDisk": self.spills.group + self.spills.window > 0,
            "spills": (self.spills.group + self.spills.window) as i64,
            "groupSpills": self.spills.group as i64,
            "windowSpills": self.spills.window as i64,
            "stageCounts": counts_bson(&self.stage_counts),
        }
    }
}

/// The executed stages' counts of an OLCP run: the part's stages are not
/// counted one by one (map threads), but the last one's output is what the
/// rest received; then the rest's stages.
fn olcp_counts(p: &Prepared, rt: &Runtime<'_>) -> Vec<Option<StageCount>> {
    let counts = rt.stage_counts();
    if counts.is_empty() {
        return Vec::new();
    }
    let part_len = p.part.stage_names().len();
    let mut out: Vec<Option<StageCount>> = vec![None; part_len];
    if let (Some(last), Some(input)) = (out.last_mut(), counts.first()) {
        *last = Some(*input);
    }
    out.extend(counts.into_iter().skip(1).map(Some));
    out
}

/// The executed stages' counts of a scan run (every node counted; the
/// input's count dropped).
fn scan_counts(rt: &Runtime<'_>) -> Vec<Option<StageCount>> {
    rt.stage_counts().into_iter().skip(1).map(Some).collect()
}

impl Collection {
    /// Run an aggregation pipeline under the database's default strategy.
    pub fn aggregate(&self, pipeline: Vec<Document>) -> Result<Vec<Document>> {
        Ok(self
            .aggregate_with(pipeline, self.database().default_strategy())?
            .0)
    }

    /// Run an aggregation pipeline with one scan under `strategy` (whose snapshot
    /// makes the result consistent under concurrent writes), feeding the
    /// commutative part, then the rest on its output.
    pub fn aggregate_with(
        &self,
        pipeline: Vec<Document>,
        strategy: Strategy,
    ) -> Result<(Vec<Document>, AggregateExplain)> {
        self.aggregate_limited(pipeline, strategy, &ReadLimits::default())
    }

    /// [`Collection::aggregate_with`] under `limits`: cancellable, `$sort`
    /// and `$group` bounded by `limits.memory_limit_bytes`.
    pub fn aggregate_limited(
        &self,
        pipeline: Vec<Document>,
        strategy: Strategy,
        limits: &ReadLimits,
    ) -> Result<(Vec<Document>, AggregateExplain)> {
        self.aggregate_let(pipeline, strategy, limits, None)
    }

    /// [`Collection::aggregate_limited`] with the command's `let` variables
    /// (`$$name` in every stage's expressions and `$expr` filters). A
    /// pipeline ending in `$out`/`$merge` writes its output (one writer
    /// command) and returns no document.
    pub fn aggregate_let(
        &self,
        pipeline: Vec<Document>,
        strategy: Strategy,
        limits: &ReadLimits,
        let_vars: Option<&Document>,
    ) -> Result<(Vec<Document>, AggregateExplain)> {
        self.aggregate_into(pipeline, strategy, limits, let_vars, None)
    }

    /// [`Collection::aggregate_let`] whose `$out`/`$merge` writes into
    /// `out_db` (`None`: this collection's database): the target of a stage
    /// naming another database (`{db, coll}`, as MongoDB allows). The output
    /// is still one writer command, of the target's writer.
    pub fn aggregate_into(
        &self,
        pipeline: Vec<Document>,
        strategy: Strategy,
        limits: &ReadLimits,
        let_vars: Option<&Document>,
        out_db: Option<&Database>,
    ) -> Result<(Vec<Document>, AggregateExplain)> {
        let out_db = out_db.unwrap_or(self.database());
        let state = self.database().writer().published();
        let pipeline = geo_key(pipeline, state.collection(self.name()))?;
        // `$$CLUSTER_TIME`: the time of the state the read starts from (a
        // strategy's scan may take a later one; design §14.1).
        let read_time = state.ts;
        drop(state);
        let collator = self.collator()?;
        // Expressions (`$project`, `$bucket`, a `$lookup`'s sub-pipeline…)
        // compare strings under the command's collation, as MongoDB's do.
        crate::query::expr::under_read_time(read_time, || {
            crate::query::expr::under_collation(collator.as_ref(), || {
                let mut p = prepare_collated(&pipeline, let_vars, collator.clone())?;
                p.limit_memory(limits.memory_limit_bytes);
                // OLCP's partitioned scans parse the scan filter themselves, without
                // the collation: a collated pipeline runs as `vls` instead (below).
                if p.documents {
                    let docs = self.database().run_documents(&p, limits)?;
                    let explain = documents_explain(&p, self.database().csn());
                    if let Some(out) = p.output() {
                        out_db.write_output(out, docs)?;
                        return Ok((Vec::new(), explain));
                    }
                    return Ok((docs, explain));
                }
                let mut choice = self.choose_for(&p, strategy)?;
                if collator.is_some() && choice.strategy == Strategy::Olcp {
                    choice.strategy = Strategy::Vls;
                }
                let spill_dir = limits.spill_dir_or(self.database().spill_dir());
                let pinned: OnceLock<Pinned> = OnceLock::new();
                let rt = Runtime::new(&pinned, limits.clone(), spill_dir);
                let capture = Capture {
                    names: &p.foreign,
                    into: &pinned,
                };
                let (docs, explain) = if choice.strategy == Strategy::Olcp {
                    match self.aggregate_olcp(&p, choice.reason, &rt, capture) {
                        // The map threads' `$group` states are merged in memory: past
                        // the limit, run once more as one ordered scan, whose `$group`
                        // spills (another snapshot; the failed pass returned nothing).
                        Err(e)
                            if e.code() == 292 && limits.allow_disk_use && p.part.has_group() =>
                        {
                            let pinned: OnceLock<Pinned> = OnceLock::new();
                            let rt = Runtime::new(&pinned, limits.clone(), rt.spill_dir.clone());
                            let capture = Capture {
                                names: &p.foreign,
                                into: &pinned,
                            };
                            let choice = Choice {
                            strategy: Strategy::Vls,
                            reason: "olcp's $group passed the memory limit: rerun under vls, whose $group spills to disk",
                        };
                            self.aggregate_scan(&p, choice, &rt, capture)?
                        }
                        r => r?,
                    }
                } else {
                    self.aggregate_scan(&p, choice, &rt, capture)?
                };
                match p.output() {
                    Some(out) => {
                        out_db.write_output(out, docs)?;
                        Ok((Vec::new(), explain))
                    }
                    None => Ok((docs, explain)),
                }
            })
        })
    }

    /// One scan under a non-OLCP strategy, every document pushed through
    /// the whole pipeline as it comes.
    fn aggregate_scan(
        &self,
        p: &Prepared,
        choice: Choice,
        rt: &Runtime<'_>,
        capture: Capture<'_>,
    ) -> Result<(Vec<Document>, AggregateExplain)> {
        let mut exec = p.exec(rt);
        if rt.limits.examined.is_some() {
            exec.count_stages();
        }
        let mut failed: Option<Error> = None;
        let mut stopped_early = false;
        let mut filter = Filter::parse(&p.filter)?.with_collation(self.collator()?);
        // explain's executionStats counters (`ReadLimits::examined`).
        rt.limits.counting(&mut filter);
        let outcome = scan::scan_capturing(
            self.database().writer(),
            self.name(),
            &filter,
            |c| planner::plan(c, &filter, None, None),
            choice.strategy,
            read_of(p),
            &rt.limits.cancel,
            Some(capture),
            |d| match exec.push_doc(d) {
                Ok(ControlFlow::Continue(())) => ControlFlow::Continue(()),
                Ok(ControlFlow::Break(())) => {
                    stopped_early = true;
                    ControlFlow::Break(())
                }
                Err(e) => {
                    failed = Some(e);
                    ControlFlow::Break(())
                }
            },
        )?;
        self.database().note_read(outcome.strategy);
        if let Some(e) = failed {
            return Err(e);
        }
        let docs = exec.finish()?;
        let (commutative_stages, rest_stages) = p.names();
        Ok((
            docs,
            AggregateExplain {
                olcp_eligible: p.eligible,
                scan_filter: p.filter.clone(),
                commutative_stages,
                rest_stages,
                strategy: outcome.strategy,
                reason: choice.reason,
                start_csn: outcome.start_csn,
                plan: outcome.plan.explain(),
                from_remset: outcome.from_remset,
                stopped_early,
                foreign_csn: rt.foreign.csn(),
                spills: rt.spills(),
                stage_counts: scan_counts(rt),
            },
        ))
    }

    /// The commutative part as an OLCP query: one pass, map = feed on one state
    /// per thread, reduce = merge; superseded versions are handed over, not
    /// kept. Without a `$group`, each thread hands its documents to the shared
    /// executor of the rest every page (so a `$sort` there bounds them). The
    /// other collections a `$lookup` reads are pinned at the query's
    /// registration boundary, before any document is mapped.
    fn aggregate_olcp(
        &self,
        p: &Prepared,
        reason: &'static str,
        rt: &Runtime<'_>,
        capture: Capture<'_>,
    ) -> Result<(Vec<Document>, AggregateExplain)> {
        let threads = std::thread::available_parallelism()
            .map_or(1, |n| n.get())
            .min(4);
        let ranges: Vec<Document> = if p.filter.is_empty() {
            Vec::new()
        } else {
            vec![p.filter.clone()]
        };
        let part = &p.part;
        let mut rest_exec = p.rest_exec(rt);
        if rt.limits.examined.is_some() {
            rest_exec.count_stages();
        }
        let rest = Mutex::new(rest_exec);
        let hand_over = |st: &mut PartialState| -> Result<()> {
            if let Some(docs) = st.take_docs() {
                let mut exec = rest
                    .lock()
                    .map_err(|_| Error::Internal("an OLCP map thread panicked".into()))?;
                for d in docs {
                    // The rest of an OLCP-eligible pipeline cannot stop early
                    // while documents arrive (order cannot matter to it).
                    if exec.push_document(d)?.is_break() {
                        break;
                    }
                }
            }
            Ok(())
        };
        self.database().note_read(Strategy::Olcp);
        let (state, report) = olcp::olcp_query_with(
            self.database().writer(),
            self.name(),
            &ranges,
            &[],
            || Ok(part.new_state()),
            |s: &mut Result<PartialState>, d, _| {
                if let Ok(st) = s {
                    let fed = part.feed_with(st, d, rt).and_then(|()| {
                        if st.len() >= PAGE_DOCS {
                            hand_over(st)
                        } else {
                            Ok(())
                        }
                    });
                    if let Err(e) = fed {
                        *s = Err(e);
                    }
                }
                Ok(())
            },
            |a, b| match (a, b) {
                (Ok(a), Ok(b)) => part.merge(a, b),
                (Err(e), _) | (_, Err(e)) => Err(e),
            },
            OlcpOptions { threads },
            &rt.limits.cancel,
            Some(capture),
        )?;
        let mut exec = rest
            .into_inner()
            .map_err(|_| Error::Internal("an OLCP map thread panicked".into()))?;
        for d in part.finish(state?)? {
            if exec.push_document(d)?.is_break() {
                break;
            }
        }
        let docs = exec.finish()?;
        let (commutative_stages, rest_stages) = p.names();
        let plan = bson::doc! {
            "stage": "OLCP",
            "threads": report.threads as i64,
            "fromTable": report.from_table as i64,
            "propagated": report.propagated as i64,
            "propagatedMapped": report.propagated_mapped as i64,
            "inflightPeak": report.inflight_peak as i64,
        };
        Ok((
            docs,
            AggregateExplain {
                olcp_eligible: p.eligible,
                scan_filter: p.filter.clone(),
                commutative_stages,
                rest_stages,
                strategy: Strategy::Olcp,
                reason,
                start_csn: report.start_csn,
                plan,
                from_remset: 0,
                stopped_early: false,
                foreign_csn: rt.foreign.csn(),
                spills: rt.spills(),
                stage_counts: olcp_counts(p, rt),
            },
        ))
    }

    /// How [`Collection::aggregate`] would run `pipeline`, without running it.
    pub fn explain_aggregate(&self, pipeline: Vec<Document>) -> Result<Document> {
        let state = self.database().writer().published();
        let pipeline = geo_key(pipeline, state.collection(self.name()))?;
        drop(state);
        let p = prepare_with(&pipeline, None)?;
        let find = self.find(p.filter.clone()).explain()?;
        let requested = self.database().default_strategy();
        let choice = self.choose_for(&p, requested)?;
        Ok(explain_doc(&p, find, requested, choice))
    }

    /// The strategy the pipeline runs under: [`choose`] with the plan of its
    /// scan filter on the latest state.
    fn choose_for(&self, p: &Prepared, requested: Strategy) -> Result<Choice> {
        let filter = Filter::parse(&p.filter)?.with_collation(self.collator()?);
        let state = self.database().writer().published();
        let plan = state
            .collection(self.name())
            .map(|c| planner::plan(c, &filter, None, None))
            .transpose()?;
        Ok(choose(requested, read_of(p), plan.as_ref()))
    }
}

/// `pipeline` with a leading `$geoNear`'s `key` taken from the collection's
/// one 2dsphere index when it names none (`query::aggregate::geonear`).
fn geo_key(
    mut pipeline: Vec<Document>,
    coll: Option<&crate::store::collection::CollectionState>,
) -> Result<Vec<Document>> {
    let paths: Vec<String> = coll
        .map(|c| {
            c.indexes
                .iter()
                .filter_map(|i| match i.spec.kind {
                    crate::store::index::IndexKind::Geo { pos } => {
                        Some(i.spec.fields[pos].0.clone())
                    }
                    _ => None,
                })
                .collect()
        })
        .unwrap_or_default();
    crate::query::aggregate::geonear::resolve_key(&mut pipeline, &paths)?;
    Ok(pipeline)
}

/// The kind of read a prepared pipeline is: commutative when its scan part is
/// OLCP-eligible and it does not stop early (arrival order then cannot matter).
fn read_of(p: &Prepared) -> Read {
    Read::Aggregate {
        commutative: p.eligible && p.stop_after.is_none(),
    }
}

/// Whether `pipeline` parses as a run of it would parse it (a `$text`
/// first stage included): an error of a run whose pipeline parses was
/// raised while executing it, which MongoDB reports under "PlanExecutor
/// error during aggregation" (the server adds that context). Called only
/// after a run failed, so a successful run parses once.
pub fn pipeline_parses(pipeline: &[Document], let_vars: Option<&Document>) -> bool {
    let text_first = pipeline
        .first()
        .and_then(|s| s.get_document("$match").ok())
        .is_some_and(|m| m.contains_key("$text"));
    if text_first {
        crate::api::text::TextPipeline::parse(pipeline, let_vars, None).is_ok()
    } else {
        prepare_with(pipeline, let_vars).is_ok()
    }
}

impl SnapshotCollection {
    /// Run an aggregation pipeline on this snapshot (always `cow`: the snapshot
    /// is held anyway).
    pub fn aggregate(&self, pipeline: Vec<Document>) -> Result<Vec<Document>> {
        self.aggregate_limited(pipeline, &ReadLimits::default())
    }

    /// [`SnapshotCollection::aggregate`] under `limits`; the snapshot's
    /// documents are walked lazily and pushed through the pipeline. A
    /// snapshot does not know its database's directory: a spilling `$sort`
    /// goes to `limits.spill_dir`, else the OS temporary directory.
    pub fn aggregate_limited(
        &self,
        pipeline: Vec<Document>,
        limits: &ReadLimits,
    ) -> Result<Vec<Document>> {
        self.aggregate_let(pipeline, limits, None)
    }

    /// [`SnapshotCollection::aggregate_limited`] with the command's `let`
    /// variables. The other collections are read from the same snapshot. A
    /// held snapshot cannot write: `$out`/`$merge` are refused (run them on
    /// the live collection).
    pub fn aggregate_let(
        &self,
        pipeline: Vec<Document>,
        limits: &ReadLimits,
        let_vars: Option<&Document>,
    ) -> Result<Vec<Document>> {
        Ok(self.aggregate_spilling(pipeline, limits, let_vars)?.0)
    }

    /// [`SnapshotCollection::aggregate_let`], with the files its `$group`
    /// and `$setWindowFields` stages spilled to disk (explain's `usedDisk` / `spills`).
    pub fn aggregate_spilling(
        &self,
        pipeline: Vec<Document>,
        limits: &ReadLimits,
        let_vars: Option<&Document>,
    ) -> Result<(Vec<Document>, StageStats)> {
        let pipeline = geo_key(pipeline, self.state().collection(self.coll_name()))?;
        let collator = self.collator()?;
        crate::query::expr::under_read_time(self.state().ts, || {
            crate::query::expr::under_collation(collator.as_ref(), || {
                let p = prepare_collated(&pipeline, let_vars, collator.clone())?;
                if let Some(out) = p.output() {
                    return Err(Error::IllegalOperation(format!(
                    "{} cannot run on a held snapshot: it writes; run it on the live collection",
                    out.stage_name()
                )));
                }
                let pinned = Pinned::from_state(self.state(), &p.foreign, limits.cancel.clone());
                let rt = Runtime::new(&pinned, limits.clone(), limits.spill_dir_or(None));
                let mut exec: Exec<'_> = p.exec(&rt);
                if limits.examined.is_some() {
                    exec.count_stages();
                }
                if !p.documents {
                    for d in self
                        .find(p.filter.clone())
                        .limits(limits.clone())
                        .stream()?
                    {
                        if exec.push_doc(&d?)?.is_break() {
                            break;
                        }
                    }
                }
                let docs = exec.finish()?;
                let stats = StageStats {
                    spills: rt.spills(),
                    counts: scan_counts(&rt),
                };
                Ok((docs, stats))
            })
        })
    }

    /// How [`SnapshotCollection::aggregate`] would run `pipeline`.
    pub fn explain_aggregate(&self, pipeline: Vec<Document>) -> Result<Document> {
        let p = prepare_with(&pipeline, None)?;
        let find = self.find(p.filter.clone()).explain()?;
        let held = Choice {
            strategy: Strategy::Cow,
            reason: "held snapshot",
        };
        Ok(explain_doc(&p, find, Strategy::Cow, held))
    }
}

impl Database {
    /// A database-level aggregation (`{aggregate: 1}`): a pipeline that
    /// starts with `$documents` and reads no collection of its own (its
    /// `$lookup`s and `$unionWith`s read the latest published state, one
    /// snapshot). Ends in `$out`/`$merge`: written, nothing returned.
    pub fn aggregate(
        &self,
        pipeline: Vec<Document>,
        limits: &ReadLimits,
        let_vars: Option<&Document>,
    ) -> Result<Vec<Document>> {
        self.aggregate_into(pipeline, limits, let_vars, None)
    }

    /// [`Database::aggregate`] whose `$out`/`$merge` writes into `out_db`
    /// (`None`: this database), as [`Collection::aggregate_into`].
    pub fn aggregate_into(
        &self,
        pipeline: Vec<Document>,
        limits: &ReadLimits,
        let_vars: Option<&Document>,
        out_db: Option<&Database>,
    ) -> Result<Vec<Document>> {
        self.aggregate_collated(pipeline, limits, let_vars, out_db, None)
    }

    /// [`Database::aggregate_into`] under the command's `collation`
    /// (`None`: simple; there is no collection default to fall back on):
    /// its stages and expressions compare strings under it, as a
    /// collection's aggregation does.
    pub fn aggregate_collated(
        &self,
        pipeline: Vec<Document>,
        limits: &ReadLimits,
        let_vars: Option<&Document>,
        out_db: Option<&Database>,
        collation: Option<&Document>,
    ) -> Result<Vec<Document>> {
        let collator = match collation {
            Some(d) => Collator::from_document(d)?,
            None => None,
        };
        let read_time = self.writer().published().ts;
        crate::query::expr::under_read_time(read_time, || {
            crate::query::expr::under_collation(collator.as_ref(), || {
                self.aggregate_documents(&pipeline, limits, let_vars, out_db, collator.clone())
            })
        })
    }

    /// [`Database::aggregate_collated`] with the collation in scope.
    fn aggregate_documents(
        &self,
        pipeline: &[Document],
        limits: &ReadLimits,
        let_vars: Option<&Document>,
        out_db: Option<&Database>,
        collator: Option<Arc<Collator>>,
    ) -> Result<Vec<Document>> {
        let mut p = prepare_collated(pipeline, let_vars, collator)?;
        p.limit_memory(limits.memory_limit_bytes);
        if !p.documents {
            let first = pipeline
                .first()
                .and_then(|s| s.keys().next().cloned())
                .unwrap_or_default();
            return Err(Error::Coded {
                code: 73,
                name: "InvalidNamespace",
                msg: format!(
                    "{{aggregate: 1}} is not valid for '{first}'; a collection is required."
                ),
            });
        }
        let docs = self.run_documents(&p, limits)?;
        match p.output() {
            Some(out) => {
                out_db.unwrap_or(self).write_output(out, docs)?;
                Ok(Vec::new())
            }
            None => Ok(docs),
        }
    }

    /// A pipeline that starts with `$documents`, on the latest state.
    pub(crate) fn run_documents(&self, p: &Prepared, limits: &ReadLimits) -> Result<Vec<Document>> {
        let state = self.writer().published();
        let pinned = Pinned::from_state(&state, &p.foreign, limits.cancel.clone());
        drop(state);
        let rt = Runtime::new(
            &pinned,
            limits.clone(),
            limits.spill_dir_or(self.spill_dir()),
        );
        p.exec(&rt).finish()
    }
}

/// What a `$documents` pipeline ran as (no scan).
fn documents_explain(p: &Prepared, csn: u64) -> AggregateExplain {
    let (commutative_stages, rest_stages) = p.names();
    AggregateExplain {
        olcp_eligible: false,
        scan_filter: Document::new(),
        commutative_stages,
        rest_stages,
        strategy: Strategy::Cow,
        reason: "$documents reads no collection",
        start_csn: csn,
        plan: bson::doc! {"stage": "DOCUMENTS"},
        from_remset: 0,
        stopped_early: false,
        foreign_csn: Some(csn),
        spills: StageSpills::default(),
        stage_counts: Vec::new(),
    }
}

fn explain_doc(p: &Prepared, find: Document, requested: Strategy, choice: Choice) -> Document {
    let planner = find.get_document("queryPlanner").ok();
    let (commutative, rest) = p.names();
    let mut out = bson::doc! {
        "olcpEligible": p.eligible,
        "scanFilter": p.filter.clone(),
        "commutativeStages": commutative,
        "restStages": rest,
        "strategy": choice.strategy.name(),
        "strategyReason": choice.reason,
        "requestedStrategy": requested.name(),
    };
    if let Some(q) = planner {
        out.insert("queryPlanner", q.clone());
    }
    if let Ok(csn) = find.get_i64("csn") {
        out.insert("csn", csn);
    }
    out
}
