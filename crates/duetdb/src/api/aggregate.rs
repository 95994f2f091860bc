//! Aggregation on live collections and held snapshots: the pipeline is
//! prepared in `query::aggregate` (parse, commutative split), its strategy
//! chosen by [`choose`], then the scanned documents are pushed through the
//! pipeline's executor ([`crate::query::aggregate::Exec`]) one at a time — or,
//! under OLCP, the commutative part runs on the map threads and its output is
//! pushed through the rest.
//!
//! Every aggregation runs under [`ReadLimits`]: the scan, the OLCP threads and
//! the executor check its cancellation token once per page, a `$sort` is
//! bounded by its memory limit (spilled or 292), a `$group` too (292). Under
//! OLCP without a `$group`, each map thread hands its output to the shared
//! executor every page, so nothing is materialized before the rest's `$sort`.

use std::ops::ControlFlow;
use std::path::PathBuf;
use std::sync::Mutex;

use bson::Document;

use crate::api::{Collection, SnapshotCollection};
use crate::error::{Error, Result};
use crate::query::aggregate::{prepare, Exec, PartialState, Prepared};
use crate::query::limits::{ReadLimits, PAGE_DOCS};
use crate::query::{planner, Filter};
use crate::snapshot::olcp::{self, OlcpOptions};
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
        }
    }
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
        let mut p = prepare(&pipeline)?;
        p.limit_memory(limits.memory_limit_bytes);
        let choice = self.choose_for(&p, strategy)?;
        let spill_dir = limits.spill_dir_or(self.database().spill_dir());
        if choice.strategy == Strategy::Olcp {
            return self.aggregate_olcp(p, choice.reason, limits, spill_dir);
        }
        let mut exec = p.exec(limits, spill_dir);
        let mut failed: Option<Error> = None;
        let mut stopped_early = false;
        let read = read_of(&p);
        let outcome =
            self.scan_read(
                p.filter.clone(),
                choice.strategy,
                read,
                limits,
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
        if let Some(e) = failed {
            return Err(e);
        }
        let docs = exec.finish()?;
        let (commutative_stages, rest_stages) = p.names();
        Ok((
            docs,
            AggregateExplain {
                olcp_eligible: p.eligible,
                scan_filter: p.filter,
                commutative_stages,
                rest_stages,
                strategy: outcome.strategy,
                reason: choice.reason,
                start_csn: outcome.start_csn,
                plan: outcome.plan.explain(),
                from_remset: outcome.from_remset,
                stopped_early,
            },
        ))
    }

    /// The commutative part as an OLCP query: one pass, map = feed on one state
    /// per thread, reduce = merge; superseded versions are handed over, not
    /// kept. Without a `$group`, each thread hands its documents to the shared
    /// executor of the rest every page (so a `$sort` there bounds them).
    fn aggregate_olcp(
        &self,
        p: Prepared,
        reason: &'static str,
        limits: &ReadLimits,
        spill_dir: PathBuf,
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
        let rest = Mutex::new(p.rest_exec(limits, spill_dir));
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
                    let fed = part.feed(st, d).and_then(|()| {
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
            &limits.cancel,
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
                scan_filter: p.filter,
                commutative_stages,
                rest_stages,
                strategy: Strategy::Olcp,
                reason,
                start_csn: report.start_csn,
                plan,
                from_remset: 0,
                stopped_early: false,
            },
        ))
    }

    /// How [`Collection::aggregate`] would run `pipeline`, without running it.
    pub fn explain_aggregate(&self, pipeline: Vec<Document>) -> Result<Document> {
        let p = prepare(&pipeline)?;
        let find = self.find(p.filter.clone()).explain()?;
        let requested = self.database().default_strategy();
        let choice = self.choose_for(&p, requested)?;
        Ok(explain_doc(&p, find, requested, choice))
    }

    /// The strategy the pipeline runs under: [`choose`] with the plan of its
    /// scan filter on the latest state.
    fn choose_for(&self, p: &Prepared, requested: Strategy) -> Result<Choice> {
        let filter = Filter::parse(&p.filter)?;
        let state = self.database().writer().published();
        let plan = state
            .collection(self.name())
            .map(|c| planner::plan(c, &filter, None, None))
            .transpose()?;
        Ok(choose(requested, read_of(p), plan.as_ref()))
    }
}

/// The kind of read a prepared pipeline is: commutative when its scan part is
/// OLCP-eligible and it does not stop early (arrival order then cannot matter).
fn read_of(p: &Prepared) -> Read {
    Read::Aggregate {
        commutative: p.eligible && p.stop_after.is_none(),
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
        let p = prepare(&pipeline)?;
        let mut exec: Exec<'_> = p.exec(limits, limits.spill_dir_or(None));
        for d in self
            .find(p.filter.clone())
            .limits(limits.clone())
            .stream()?
        {
            if exec.push_doc(&d?)?.is_break() {
                break;
            }
        }
        exec.finish()
    }

    /// How [`SnapshotCollection::aggregate`] would run `pipeline`.
    pub fn explain_aggregate(&self, pipeline: Vec<Document>) -> Result<Document> {
        let p = prepare(&pipeline)?;
        let find = self.find(p.filter.clone()).explain()?;
        let held = Choice {
            strategy: Strategy::Cow,
            reason: "held snapshot",
        };
        Ok(explain_doc(&p, find, Strategy::Cow, held))
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
