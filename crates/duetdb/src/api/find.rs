//! Finds: a query being built ([`Find`]) and its execution on the latest
//! state under the strategy [`choose`] picks, or on a held snapshot.

use std::ops::ControlFlow;
use std::sync::Arc;

use bson::{Bson, Document};

use crate::api::*;
use crate::doc::{self, DocRef};
use crate::error::{Error, Result};
use crate::query::planner::{self, FindSpec, Hint, Plan};
use crate::query::{Filter, Projection, SortSpec};
use crate::snapshot::scan::{self, ScanOutcome};
use crate::snapshot::{choose, Read, Strategy};
use crate::store::DbState;

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

fn empty_outcome(csn: u64) -> ScanOutcome {
    ScanOutcome {
        strategy: Strategy::Cow,
        reason: "held snapshot",
        start_csn: csn,
        plan: Plan {
            access: planner::Access::CollScan { reverse: false },
            provides_sort: true,
        },
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
}

/// A find being built; [`Find::run`] executes it.
pub struct Find {
    pub(crate) source: Source,
    pub(crate) coll: String,
    pub(crate) filter: Document,
    pub(crate) options: FindOptions,
    pub(crate) strategy: Option<Strategy>,
}

/// A find's result with how it was produced.
#[derive(Debug, Clone)]
pub struct FindOutcome {
    pub docs: Vec<DocRef>,
    pub scan: ScanOutcome,
}

impl Find {
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
        self.options = options;
        self
    }
    /// Read under this snapshot strategy instead of the database default.
    /// (Reads from a held [`Snapshot`] are always `cow`.)
    pub fn snapshot(mut self, strategy: Strategy) -> Find {
        self.strategy = Some(strategy);
        self
    }

    /// Execute and report how: the matching stored documents (sorted, skipped,
    /// limited; unprojected), the strategy, the snapshot's csn and the plan.
    pub fn run_detailed(self) -> Result<FindOutcome> {
        let (spec, _) = self.spec()?;
        self.execute(&spec)
    }

    fn execute(&self, spec: &FindSpec) -> Result<FindOutcome> {
        let db = match &self.source {
            Source::Fixed(state) => {
                let Some(c) = state.collection(&self.coll) else {
                    return Ok(FindOutcome {
                        docs: Vec::new(),
                        scan: empty_outcome(state.csn),
                    });
                };
                let (found, plan) = planner::run_find(c, spec)?;
                return Ok(FindOutcome {
                    docs: found.into_iter().map(|(_, d)| d).collect(),
                    scan: held_outcome(state.csn, plan),
                });
            }
            Source::Latest(db) => db,
        };
        let requested = self.strategy.unwrap_or_else(|| db.default_strategy());
        let filter = spec.filter.as_ref().unwrap_or_else(|| planner::match_all());
        let sort = spec.sort.as_ref().filter(|s| !s.keys.is_empty());
        let wanted = if spec.limit > 0 {
            spec.skip.saturating_add(spec.limit)
        } else {
            u64::MAX
        };
        let read = Read::Find {
            top_k: sort.is_some() && spec.limit > 0,
        };
        // Set by the planning closure: the scan yields documents in sort order
        // (a `cow` walk of a plan that provides the sort), so it may stop at `wanted`.
        let in_order = std::cell::Cell::new(false);
        let mut docs: Vec<DocRef> = Vec::new();
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
            |d| {
                docs.push(d.clone());
                // Without a sort, or in sort order, the first `wanted` matches
                // are the answer; stop early.
                if (sort.is_none() || in_order.get()) && docs.len() as u64 >= wanted {
                    ControlFlow::Break(())
                } else {
                    ControlFlow::Continue(())
                }
            },
        )?;
        db.note_read(outcome.strategy);
        if let Some(sort) = sort {
            if !(outcome.strategy == Strategy::Cow && outcome.plan.provides_sort) {
                let mut keyed: Vec<_> = docs.into_iter().map(|d| (sort.sort_key(&d), d)).collect();
                // Stable: ties keep scan order.
                keyed.sort_by(|(a, _), (b, _)| sort.compare_keys(a, b));
                docs = keyed.into_iter().map(|(_, d)| d).collect();
            }
        }
        let skip = usize::try_from(spec.skip)
            .unwrap_or(usize::MAX)
            .min(docs.len());
        docs.drain(..skip);
        if spec.limit > 0 {
            docs.truncate(usize::try_from(spec.limit).unwrap_or(usize::MAX));
        }
        Ok(FindOutcome {
            docs,
            scan: outcome,
        })
    }

    fn spec(&self) -> Result<(FindSpec, Option<Projection>)> {
        let spec = FindSpec {
            filter: Some(Filter::parse(&self.filter)?),
            sort: self
                .options
                .sort
                .as_ref()
                .map(SortSpec::parse)
                .transpose()?,
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
            .map(Projection::parse)
            .transpose()?;
        Ok((spec, projection))
    }

    /// The matching stored documents (shared, unprojected), sorted, skipped
    /// and limited, read under the requested strategy.
    pub fn raw(self) -> Result<Vec<DocRef>> {
        let (spec, _) = self.spec()?;
        Ok(self.execute(&spec)?.docs)
    }

    /// Execute: the matching documents, sorted, skipped, limited and projected.
    pub fn run(self) -> Result<Vec<Document>> {
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
        let plan: Plan = match state.collection(&self.coll) {
            Some(c) => planner::plan(
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
                "summary": plan.summary(),
            },
            "csn": state.csn as i64,
            "strategy": choice.strategy.name(),
            "strategyReason": choice.reason,
        })
    }
}
