//! `explain` of find, count, distinct, aggregate, update, delete and
//! findAndModify, in MongoDB's shape and verbosities.
//!
//! - `queryPlanner` (and `aggregate` with `explain: true`): what would run —
//!   `queryPlanner: {namespace: "db.coll", parsedQuery, winningPlan,
//!   rejectedPlans}`, the stage tree from the engine's plan (`COLLSCAN`,
//!   `IDHACK`, `FETCH`/`IXSCAN`) under `SORT`, `SKIP`, `LIMIT`,
//!   `PROJECTION_*`, `COUNT`, `UPDATE`, `DELETE` as the command needs;
//!   nothing is executed.
//! - `executionStats`, `allPlansExecution` (the default, as MongoDB's):
//!   the read is executed on the same source a real command would use, and
//!   `executionStats` reports `nReturned`, `executionTimeMillis`,
//!   `totalKeysExamined`, `totalDocsExamined` and the stage tree with
//!   per-stage counters. Keys and documents are counted as the read runs
//!   (`ReadLimits::examined`: the executors count index entries and every
//!   document they test), never estimated. The planner is rule-based (it
//!   ranks index bounds, it does not race plans): `rejectedPlans` lists the
//!   other indexes (and the `_id` range) that could have answered, as their
//!   access paths (`FETCH`/`IXSCAN` with the filter, without the command's
//!   `SORT`/`LIMIT`/projection stages), and `allPlansExecution` holds a
//!   trial of each candidate (the winner first), its access path run alone
//!   to MongoDB's trial end of 101 results (design §14.4). Each later stage
//!   of an aggregate reports its own `nReturned` and
//!   `executionTimeMillisEstimate` (the engine's per-stage counts).
//! - duetdb's own facts — the strategy that runs and why, the requested
//!   strategy, the snapshot's csn, a pipeline's split — are in one `duet`
//!   sub-document.
//!
//! Invariants: explain never writes (a write is explained by finding what it
//! would match and computing, for an update, whether each match would
//! change: `nMatched`, `nWouldModify`, `nWouldUpsert`; `nWouldDelete`), and
//! never runs in a transaction.

use std::sync::Arc;
use std::time::Instant;

use bson::{doc, Bson, Document};
use duetdb::lang::{Examined, Filter};
use duetdb::FindOptions;

use super::read::{pipeline_of, FindPlan};
use super::source::{read_limits, read_source, Explained, ReadSource, Target};
use super::Ctx;
use crate::args;
use crate::error::{CmdResult, CommandError};

/// How much `explain` reports (MongoDB's verbosity modes, in order).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Verbosity {
    QueryPlanner,
    ExecutionStats,
    AllPlansExecution,
}

/// The command's `verbosity` (default `allPlansExecution`, as MongoDB).
fn verbosity(cmd: &Document) -> CmdResult<Verbosity> {
    let fail = |m: &str| CommandError::new(9, "FailedToParse", m.to_string());
    match cmd.get("verbosity") {
        None => Ok(Verbosity::AllPlansExecution),
        Some(Bson::String(s)) => match s.as_str() {
            "queryPlanner" => Ok(Verbosity::QueryPlanner),
            "executionStats" => Ok(Verbosity::ExecutionStats),
            "allPlansExecution" => Ok(Verbosity::AllPlansExecution),
            _ => Err(fail(
                "verbosity string must be one of {'queryPlanner', 'executionStats', \
                 'allPlansExecution'}",
            )),
        },
        Some(_) => Err(fail("explain verbosity must be a string")),
    }
}

/// The `explain` command.
pub fn explain(ctx: &Ctx<'_>, cmd: &Document) -> CmdResult {
    let inner = args::opt_doc(cmd, "explain")?
        .ok_or_else(|| CommandError::bad_value("explain requires a command document"))?;
    let v = verbosity(cmd)?;
    let name = super::command_name(inner).unwrap_or_default();
    let coll = args::collection_name(inner, name)?;
    // `$duet` options are the inner command's, or the outer's when the inner has none.
    let options = if inner.contains_key("$duet") || !cmd.contains_key("$duet") {
        inner
    } else {
        cmd
    };
    // An update's or delete's collation is its statement's (the command has
    // none): the source is built under it, so the plan (index choice), the
    // filter and `nWouldModify` follow it, as the write would.
    let with_stmt_collation;
    let options = match statement_collation(name, inner)? {
        Some(c) if !options.contains_key("collation") => {
            let mut o = options.clone();
            o.insert("collation", c);
            with_stmt_collation = o;
            &with_stmt_collation
        }
        _ => options,
    };
    let mut target = Target::Live;
    let source = read_source(ctx, options, coll, &mut target)?;
    let ex = Explainer {
        ctx,
        ns: ctx.ns(coll),
        source: &source,
        verbosity: v,
        limits_cmd: options,
        rejected: Default::default(),
        trials: Default::default(),
    };
    let mut out = match name {
        "find" => ex.find(&FindPlan::from_find(inner)?)?,
        "count" => ex.count(inner)?,
        "distinct" => ex.distinct(inner)?,
        "aggregate" => ex.aggregate(pipeline_of(inner)?)?,
        "update" => ex.update(inner)?,
        "delete" => ex.delete(inner)?,
        "findAndModify" | "findandmodify" => ex.find_and_modify(inner)?,
        other => {
            return Err(CommandError::not_supported(format!(
                "explain of '{other}' is not supported by duetdb (find, count, distinct, \
                 aggregate, update, delete, findAndModify)"
            )))
        }
    };
    out.insert("command", inner.clone());
    out.insert(
        "serverInfo",
        doc! {"host": "localhost", "version": super::admin::COMPAT_VERSION},
    );
    out.insert("ok", 1.0);
    Ok(out)
}

/// The `collation` of the one statement of an explained `update` (in
/// `updates`) or `delete` (in `deletes`); `None` for other commands, or a
/// statement without one. A batch of other than one statement is refused
/// later (16).
fn statement_collation(name: &str, inner: &Document) -> CmdResult<Option<Document>> {
    let field = match name {
        "update" => "updates",
        "delete" => "deletes",
        _ => return Ok(None),
    };
    let stmts = args::doc_array(inner, field)?;
    match stmts.as_slice() {
        [stmt] => Ok(args::opt_doc(stmt, "collation")?.cloned()),
        _ => Ok(None),
    }
}

/// `aggregate` with `explain: true`: the `queryPlanner` explain of its pipeline.
pub fn aggregate_explain_flag(
    ctx: &Ctx<'_>,
    cmd: &Document,
    coll: &str,
    source: &ReadSource<'_>,
    stages: Vec<Document>,
) -> CmdResult {
    let ex = Explainer {
        ctx,
        ns: ctx.ns(coll),
        source,
        verbosity: Verbosity::QueryPlanner,
        limits_cmd: cmd,
        rejected: Default::default(),
        trials: Default::default(),
    };
    let mut out = ex.aggregate(stages)?;
    out.insert("ok", 1.0);
    Ok(out)
}

/// What one explain needs.
struct Explainer<'a, 'c, 's> {
    ctx: &'a Ctx<'c>,
    ns: String,
    source: &'a ReadSource<'s>,
    verbosity: Verbosity,
    /// The command whose read options (`allowDiskUse`) the execution uses.
    limits_cmd: &'a Document,
    /// The access paths the engine's planner chose against, from the last
    /// [`Explainer::plan`].
    rejected: std::cell::RefCell<Vec<Document>>,
    /// `allPlansExecution`: each candidate's trial run, from the last
    /// [`Explainer::plan`] (empty when only one plan could answer).
    trials: std::cell::RefCell<Vec<Bson>>,
}

/// MongoDB's trial period ends when a candidate has returned this many
/// documents (`internalQueryPlanEvaluationMaxResults`).
const TRIAL_MAX_RESULTS: u64 = 101;

/// What one execution counted.
#[derive(Debug, Default, Clone, Copy)]
struct Counted {
    keys: u64,
    docs: u64,
    /// Documents the scan stage passed on (matched the filter).
    matched: u64,
    millis: i64,
}

/// A stage above the scan, outermost last in a [`Stages`] list.
struct Stage {
    doc: Document,
    /// Its `nReturned` under execution.
    returned: u64,
}

impl Explainer<'_, '_, '_> {
    fn executes(&self) -> bool {
        self.verbosity >= Verbosity::ExecutionStats
    }

    /// The engine's plan for a find on this source: the scan stage tree
    /// (blocking-sort mark removed: `true` when a sort must be added), the
    /// engine's strategy facts for `duet`.
    fn plan(&self, find: &FindPlan) -> CmdResult<(Document, bool, Document)> {
        let engine = self.source.explain(Explained::Find(find))?;
        let mut base = engine
            .get_document("queryPlanner")
            .and_then(|q| q.get_document("winningPlan"))
            .cloned()
            .unwrap_or_else(|_| doc! {"stage": "EOF"});
        let blocking = base.remove("blockingSortIfRequested").is_some();
        let rejected: Vec<Document> = engine
            .get_document("queryPlanner")
            .and_then(|q| q.get_array("rejectedPlans"))
            .map(|r| {
                r.iter()
                    .filter_map(|p| p.as_document().cloned())
                    .map(|mut p| {
                        p.remove("blockingSortIfRequested");
                        p
                    })
                    .collect()
            })
            .unwrap_or_default();
        let trials = if self.verbosity == Verbosity::AllPlansExecution && !rejected.is_empty() {
            std::iter::once(&base)
                .chain(rejected.iter())
                .map(|plan| self.trial(find, plan))
                .collect::<CmdResult<Vec<Bson>>>()?
        } else {
            Vec::new()
        };
        *self.trials.borrow_mut() = trials;
        *self.rejected.borrow_mut() = rejected;
        Ok((base, blocking, duet_facts(&engine)))
    }

    /// One candidate's trial (`allPlansExecution`): its access path run
    /// alone — the filter through its index, hinted — until it has returned
    /// [`TRIAL_MAX_RESULTS`] documents or ends, with the counters it kept.
    /// MongoDB races the candidates round-robin and stops them all at the
    /// same work count; duetdb ranks plans by rule and has no work units, so
    /// each candidate runs on its own to that result count (design §14.4).
    fn trial(&self, find: &FindPlan, plan: &Document) -> CmdResult<Bson> {
        let hint = index_name(plan).map_or_else(
            || Bson::Document(doc! {"$natural": 1}),
            |n| Bson::String(n.to_string()),
        );
        let trial = FindPlan {
            filter: find.filter.clone(),
            options: FindOptions {
                hint: Some(hint),
                limit: TRIAL_MAX_RESULTS,
                collation: find.options.collation.clone(),
                ..FindOptions::default()
            },
            projection: None,
        };
        let (returned, c) = self.counted(|limits| {
            let mut n = 0u64;
            for d in self.source.find_stream(&trial, limits)? {
                d?;
                n += 1;
                if n >= TRIAL_MAX_RESULTS {
                    break;
                }
            }
            Ok(n)
        })?;
        let stages = tree(with_filter(plan.clone(), &find.filter), &[], Some(&c));
        Ok(Bson::Document(doc! {
            "nReturned": returned as i64,
            "executionTimeMillisEstimate": c.millis,
            "totalKeysExamined": c.keys as i64,
            "totalDocsExamined": c.docs as i64,
            "executionStages": stages,
        }))
    }

    /// Run `f` with counters attached to the read's limits; the counts and
    /// the elapsed time.
    fn counted<T>(
        &self,
        f: impl FnOnce(&duetdb::ReadLimits) -> CmdResult<T>,
    ) -> CmdResult<(T, Counted)> {
        let counters = Arc::new(Examined::default());
        let mut limits = read_limits(self.ctx, self.limits_cmd)?;
        limits.examined = Some(counters.clone());
        let t0 = Instant::now();
        let out = f(&limits)?;
        let millis = i64::try_from(t0.elapsed().as_millis()).unwrap_or(i64::MAX);
        let (keys, docs, matched) = counters.get();
        Ok((
            out,
            Counted {
                keys,
                docs,
                matched,
                millis,
            },
        ))
    }

    /// The explain document: `queryPlanner` with the stage tree (`base`
    /// under `stages`, innermost first), `executionStats` from `run` when
    /// executed, and `duet`.
    fn document(
        &self,
        filter: &Document,
        base: Document,
        stages: Vec<Stage>,
        run: Option<(Counted, u64)>,
        duet: Document,
    ) -> Document {
        let mut planner = doc! {
            "namespace": self.ns.clone(),
            "indexFilterSet": false,
            "parsedQuery": filter.clone(),
            "maxIndexedOrSolutionsReached": false,
            "maxIndexedAndSolutionsReached": false,
            "maxScansToExplodeReached": false,
        };
        planner.insert("winningPlan", tree(base.clone(), &stages, None));
        let rejected: Vec<Bson> = self
            .rejected
            .take()
            .into_iter()
            .map(|p| Bson::Document(with_filter(p, filter)))
            .collect();
        planner.insert("rejectedPlans", Bson::Array(rejected));
        let mut out = doc! {"explainVersion": "1", "queryPlanner": planner};
        if let Some((c, returned)) = run {
            let mut stats = doc! {
                "executionSuccess": true,
                "nReturned": returned as i64,
                "executionTimeMillis": c.millis,
                "totalKeysExamined": c.keys as i64,
                "totalDocsExamined": c.docs as i64,
                "executionStages": tree(base, &stages, Some(&c)),
            };
            if self.verbosity == Verbosity::AllPlansExecution {
                stats.insert("allPlansExecution", Bson::Array(self.trials.take()));
            }
            out.insert("executionStats", stats);
        }
        out.insert("duet", duet);
        out
    }

    fn find(&self, find: &FindPlan) -> CmdResult<Document> {
        find.parsed_projection()?;
        let (base, blocking, duet) = self.plan(find)?;
        let o = &find.options;
        let run = if self.executes() {
            let (returned, c) = self.counted(|limits| {
                let mut n = 0u64;
                for d in self.source.find_stream(find, limits)? {
                    d?;
                    n += 1;
                }
                Ok(n)
            })?;
            Some((c, returned))
        } else {
            None
        };
        let matched = run.map_or(0, |(c, _)| c.matched);
        let mut stages = Vec::new();
        let mut flowing = matched;
        let sort = o.sort.as_ref().filter(|s| !s.is_empty());
        if let Some(sort) = sort.filter(|_| blocking) {
            let mut d = doc! {"stage": "SORT", "sortPattern": sort.clone(), "memLimit": 104857600_i64, "type": "simple"};
            if o.limit > 0 {
                d.insert("limitAmount", o.skip.saturating_add(o.limit) as i64);
                flowing = flowing.min(o.skip.saturating_add(o.limit));
            }
            stages.push(Stage {
                doc: d,
                returned: flowing,
            });
        }
        if o.skip > 0 {
            flowing = flowing.saturating_sub(o.skip);
            stages.push(Stage {
                doc: doc! {"stage": "SKIP", "skipAmount": o.skip as i64},
                returned: flowing,
            });
        }
        if o.limit > 0 && !(blocking && sort.is_some()) {
            flowing = flowing.min(o.limit);
            stages.push(Stage {
                doc: doc! {"stage": "LIMIT", "limitAmount": o.limit as i64},
                returned: flowing,
            });
        }
        if let Some(p) = find.projection.as_ref().filter(|p| !p.is_empty()) {
            stages.push(Stage {
                doc: doc! {"stage": projection_stage(p), "transformBy": p.clone()},
                returned: flowing,
            });
        }
        if let (Some(last), Some((_, returned))) = (stages.last_mut(), run) {
            last.returned = returned;
        }
        let base = with_filter(base, &find.filter);
        Ok(self.document(&find.filter, base, stages, run, duet))
    }

    fn count(&self, cmd: &Document) -> CmdResult<Document> {
        let query = args::opt_doc(cmd, "query")?.cloned().unwrap_or_default();
        let query = Filter::bind_let(&query, args::opt_doc(cmd, "let")?)?;
        let skip = args::opt_count(cmd, "skip")?.unwrap_or(0);
        let limit = args::opt_safe_i64(cmd, "limit")?
            .unwrap_or(0)
            .unsigned_abs();
        let hint = cmd
            .get("hint")
            .filter(|h| !matches!(h, Bson::Null))
            .cloned();
        let find = FindPlan {
            filter: query.clone(),
            options: FindOptions {
                hint: hint.clone(),
                ..FindOptions::default()
            },
            projection: None,
        };
        let (base, _, mut duet) = self.plan(&find)?;
        if let Ok(e) = self.source.explain(Explained::Count(query.clone())) {
            duet = duet_facts(&e);
        }
        // Counting everything is O(1) only on a held root (`cow`): the other
        // strategies walk the collection.
        let fast = query.is_empty()
            && hint.is_none()
            && duet.get_str("strategy").map_or(true, |s| s == "cow");
        let run = if self.executes() {
            let (n, c) = self.counted(|limits| {
                self.source
                    .count(query.clone(), hint.as_ref(), None, limits)
            })?;
            Some((c, n))
        } else {
            None
        };
        let n = run.map_or(0, |(_, n)| n);
        let counted = n.saturating_sub(skip);
        let counted = if limit > 0 {
            counted.min(limit)
        } else {
            counted
        };
        let mut count = doc! {"stage": "COUNT"};
        if self.executes() {
            count.insert("nCounted", counted as i64);
            count.insert("nSkipped", skip.min(n) as i64);
        }
        let stages = vec![Stage {
            doc: count,
            returned: 0,
        }];
        let base = if fast {
            doc! {"stage": "RECORD_STORE_FAST_COUNT"}
        } else {
            with_filter(base, &query)
        };
        Ok(self.document(&query, base, stages, run.map(|(c, _)| (c, 0)), duet))
    }

    fn distinct(&self, cmd: &Document) -> CmdResult<Document> {
        let key = args::req_str(cmd, "key")?;
        let query = args::opt_doc(cmd, "query")?.cloned().unwrap_or_default();
        let find = FindPlan {
            filter: query.clone(),
            ..FindPlan::default()
        };
        let (base, _, mut duet) = self.plan(&find)?;
        if let Ok(e) = self.source.explain(Explained::Distinct(query.clone())) {
            duet = duet_facts(&e);
        }
        let run = if self.executes() {
            let (_, c) = self.counted(|limits| self.source.distinct(key, query.clone(), limits))?;
            Some((c, c.matched))
        } else {
            None
        };
        let mut transform = doc! {"_id": 0};
        transform.insert(key, 1);
        let stages = vec![Stage {
            doc: doc! {"stage": "PROJECTION_DEFAULT", "transformBy": transform},
            returned: run.map_or(0, |(c, _)| c.matched),
        }];
        let base = with_filter(base, &query);
        Ok(self.document(&query, base, stages, run, duet))
    }

    /// MongoDB's aggregate explain: `stages: [{$cursor: {queryPlanner,
    /// executionStats}}, <each later stage>]`, the final stage's
    /// `nReturned` when executed.
    fn aggregate(&self, stages: Vec<Document>) -> CmdResult<Document> {
        let engine = self.source.explain(Explained::Aggregate(stages.clone()))?;
        let scan_filter = engine
            .get_document("scanFilter")
            .cloned()
            .unwrap_or_default();
        let find = FindPlan {
            filter: scan_filter.clone(),
            ..FindPlan::default()
        };
        let (base, _, _) = self.plan(&find)?;
        let mut duet = duet_facts(&engine);
        for k in [
            "olcpEligible",
            "scanFilter",
            "commutativeStages",
            "restStages",
        ] {
            if let Some(v) = engine.get(k) {
                duet.insert(k, v.clone());
            }
        }
        // Runs the `$group` stages spilled and files the `$setWindowFields`
        // stages (`$fill`'s included) spooled (MongoDB's per-stage `spills`).
        let (mut group_spills, mut window_spills) = (0i64, 0i64);
        let mut stage_counts: Vec<Option<Document>> = Vec::new();
        let run = if self.executes() {
            let ((docs, report), mut c) =
                self.counted(|limits| self.source.aggregate_run(stages.clone(), limits))?;
            let count = |k: &str| report.as_ref().and_then(|r| r.get_i64(k).ok()).unwrap_or(0);
            (group_spills, window_spills) = (count("groupSpills"), count("windowSpills"));
            stage_counts = report
                .as_ref()
                .and_then(|r| r.get_array("stageCounts").ok())
                .map(|a| a.iter().map(|c| c.as_document().cloned()).collect())
                .unwrap_or_default();
            // An OLCP pass counts its own work: every version it read.
            if let Some(plan) = report
                .as_ref()
                .and_then(|r| r.get_document("winningPlan").ok())
            {
                if plan.get_str("stage").ok() == Some("OLCP") {
                    let n = |k: &str| plan.get_i64(k).unwrap_or(0).max(0) as u64;
                    c.docs = n("fromTable") + n("propagated");
                    c.matched = c.docs;
                }
            }
            Some((c, docs.len() as u64))
        } else {
            None
        };
        let base = with_filter(base, &scan_filter);
        let cursor = self.document(
            &scan_filter,
            base,
            Vec::new(),
            run.map(|(c, _)| (c, c.matched)),
            Document::new(),
        );
        let mut cursor_stage = Document::new();
        for k in ["queryPlanner", "executionStats"] {
            if let Some(v) = cursor.get(k) {
                cursor_stage.insert(k, v.clone());
            }
        }
        let mut out_stages = vec![Bson::Document(doc! {"$cursor": cursor_stage})];
        // The leading $match stages are the scan's filter.
        let rest: Vec<&Document> = stages
            .iter()
            .skip_while(|s| s.contains_key("$match"))
            .collect();
        let last = rest.len();
        // Each written stage's counts: those of the last executed stage it
        // became (`Pipeline::stage_widths`), in order after the scan's
        // leading `$match`es.
        let widths = duetdb::lang::Pipeline::stage_widths(&stages);
        let mut executed = 0usize;
        let counts_of = |written: usize, executed: &mut usize| -> Option<Document> {
            let width = widths.get(written).copied().unwrap_or(1);
            *executed += width;
            stage_counts
                .get(executed.checked_sub(1)?)
                .cloned()
                .flatten()
        };
        let leading = stages.len() - last;
        for (i, s) in rest.into_iter().enumerate() {
            let counted = counts_of(leading + i, &mut executed);
            let mut d = s.clone();
            let spills = if d.contains_key("$group") {
                Some(group_spills)
            } else if d.contains_key("$setWindowFields") || d.contains_key("$fill") {
                Some(window_spills)
            } else {
                None
            };
            if let (Some(spills), true) = (spills, run.is_some()) {
                d.insert("usedDisk", spills > 0);
                d.insert("spills", spills);
            }
            if let Some((c, returned)) = run {
                if i + 1 == last {
                    d.insert("nReturned", returned as i64);
                    d.insert("executionTimeMillisEstimate", c.millis);
                } else if let Some(counted) = counted {
                    for k in ["nReturned", "executionTimeMillisEstimate"] {
                        if let Some(v) = counted.get(k) {
                            d.insert(k, v.clone());
                        }
                    }
                }
            }
            out_stages.push(Bson::Document(d));
        }
        Ok(doc! {"explainVersion": "1", "stages": out_stages, "duet": duet})
    }

    /// `update` (one statement, as MongoDB): an `UPDATE` stage over the
    /// plan of its query; executed, the matches and how many would change.
    fn update(&self, cmd: &Document) -> CmdResult<Document> {
        let stmts = args::doc_array(cmd, "updates")?;
        let [stmt] = stmts.as_slice() else {
            return Err(one_statement());
        };
        let filters = super::write::array_filters(stmt, "update.updates.arrayFilters")?;
        let let_vars = args::opt_doc(cmd, "let")?;
        let spec = super::write::update_spec(
            stmt.get("u"),
            filters.as_deref().unwrap_or_default(),
            let_vars,
            args::opt_doc(stmt, "c")?,
        )?;
        let q = args::opt_doc(stmt, "q")?.cloned().unwrap_or_default();
        let q = Filter::bind_let(&q, let_vars)?;
        let multi = args::flag(stmt, "multi")?;
        let upsert = args::flag(stmt, "upsert")?;
        let hint = stmt
            .get("hint")
            .filter(|h| !matches!(h, Bson::Null))
            .cloned();
        let find = FindPlan {
            filter: q.clone(),
            options: FindOptions {
                limit: u64::from(!multi),
                hint,
                ..FindOptions::default()
            },
            projection: None,
        };
        self.write(&find, WriteKind::Update { spec, upsert })
    }

    fn delete(&self, cmd: &Document) -> CmdResult<Document> {
        let stmts = args::doc_array(cmd, "deletes")?;
        let [stmt] = stmts.as_slice() else {
            return Err(one_statement());
        };
        let q = args::opt_doc(stmt, "q")?.cloned().unwrap_or_default();
        let q = Filter::bind_let(&q, args::opt_doc(cmd, "let")?)?;
        let limit = args::opt_i64(stmt, "limit")?.unwrap_or(0);
        let hint = stmt
            .get("hint")
            .filter(|h| !matches!(h, Bson::Null))
            .cloned();
        let find = FindPlan {
            filter: q,
            options: FindOptions {
                limit: u64::from(limit == 1),
                hint,
                ..FindOptions::default()
            },
            projection: None,
        };
        self.write(&find, WriteKind::Delete)
    }

    fn find_and_modify(&self, cmd: &Document) -> CmdResult<Document> {
        let q = args::opt_doc(cmd, "query")?.cloned().unwrap_or_default();
        let let_vars = args::opt_doc(cmd, "let")?;
        let q = Filter::bind_let(&q, let_vars)?;
        let find = FindPlan {
            filter: q,
            options: FindOptions {
                sort: args::opt_doc(cmd, "sort")?
                    .cloned()
                    .filter(|s| !s.is_empty()),
                limit: 1,
                hint: cmd
                    .get("hint")
                    .filter(|h| !matches!(h, Bson::Null))
                    .cloned(),
                ..FindOptions::default()
            },
            projection: None,
        };
        if args::flag(cmd, "remove")? {
            return self.write(&find, WriteKind::Delete);
        }
        let filters = super::write::array_filters(cmd, "findAndModify.arrayFilters")?;
        let update = cmd.get("update").filter(|u| !matches!(u, Bson::Null));
        let spec = super::write::update_spec(
            update,
            filters.as_deref().unwrap_or_default(),
            let_vars,
            None,
        )?;
        let upsert = args::flag(cmd, "upsert")?;
        self.write(&find, WriteKind::Update { spec, upsert })
    }

    /// A write's explain: its matches found (never written) on this source.
    fn write(&self, find: &FindPlan, kind: WriteKind) -> CmdResult<Document> {
        let (base, blocking, duet) = self.plan(find)?;
        // The write's collation (the command's, else the collection's):
        // its filter and `nWouldModify` compare under it, as the write would.
        let collator = self.source.collator()?;
        let parsed = Filter::parse(&find.filter)?.with_collation(collator.clone());
        let run = if self.executes() {
            let (found, c) = self.counted(|limits| {
                let mut docs = Vec::new();
                for d in self.source.find_stream(find, limits)? {
                    docs.push(d?);
                }
                Ok(docs)
            })?;
            Some((c, found))
        } else {
            None
        };
        let mut stages = Vec::new();
        let matched = run.as_ref().map_or(0, |(_, f)| f.len() as u64);
        if let Some(sort) = find.options.sort.as_ref().filter(|_| blocking) {
            stages.push(Stage {
                doc: doc! {"stage": "SORT", "sortPattern": sort.clone(), "memLimit": 104857600_i64, "limitAmount": 1_i64, "type": "simple"},
                returned: matched,
            });
        }
        let mut top = match &kind {
            WriteKind::Update { .. } => doc! {"stage": "UPDATE"},
            WriteKind::Delete => doc! {"stage": "DELETE"},
        };
        if let Some((_, found)) = &run {
            match &kind {
                WriteKind::Update { spec, upsert } => {
                    let spec = spec.clone().with_collation(collator);
                    let mut modify = 0i64;
                    for d in found {
                        if spec.would_modify(d, &parsed)? {
                            modify += 1;
                        }
                    }
                    let upserts = i64::from(*upsert && found.is_empty());
                    top.insert("nMatched", found.len() as i64);
                    top.insert("nWouldModify", modify);
                    top.insert("nWouldUpsert", upserts);
                    top.insert("wouldInsert", upserts > 0);
                }
                WriteKind::Delete => {
                    top.insert("nWouldDelete", found.len() as i64);
                }
            }
        }
        stages.push(Stage {
            doc: top,
            returned: 0,
        });
        let base = with_filter(base, &find.filter);
        let run = run.map(|(c, _)| (c, 0));
        Ok(self.document(&find.filter, base, stages, run, duet))
    }
}

enum WriteKind {
    Update {
        spec: duetdb::lang::UpdateSpec,
        upsert: bool,
    },
    Delete,
}

fn one_statement() -> CommandError {
    CommandError::new(
        16,
        "InvalidLength",
        "explained write batches must be of size 1",
    )
}

/// duetdb's facts from an engine explain document.
fn duet_facts(engine: &Document) -> Document {
    let mut d = Document::new();
    for k in ["strategy", "strategyReason", "requestedStrategy"] {
        if let Some(v) = engine.get(k) {
            d.insert(k, v.clone());
        }
    }
    if let Ok(csn) = engine.get_i64("csn") {
        d.insert("csn", csn);
    }
    if let Some(s) = engine
        .get_document("queryPlanner")
        .ok()
        .and_then(|q| q.get_str("summary").ok())
    {
        d.insert("plan", s);
    }
    d
}

/// A scan stage with the filter it applies, as MongoDB shows it on
/// `COLLSCAN` and `FETCH` (not on `IDHACK`, whose lookup is the filter).
fn with_filter(mut base: Document, filter: &Document) -> Document {
    let stage = base.get_str("stage").unwrap_or_default().to_string();
    if !filter.is_empty() && (stage == "COLLSCAN" || stage == "FETCH") {
        base.insert("filter", filter.clone());
    }
    base
}

/// `PROJECTION_SIMPLE` for a projection of top-level fields by 0/1/bool,
/// `PROJECTION_DEFAULT` otherwise (MongoDB's two names).
fn projection_stage(p: &Document) -> &'static str {
    let simple = p.iter().all(|(k, v)| {
        !k.contains('.')
            && !k.starts_with('$')
            && matches!(
                v,
                Bson::Int32(_) | Bson::Int64(_) | Bson::Double(_) | Bson::Boolean(_)
            )
    });
    if simple {
        "PROJECTION_SIMPLE"
    } else {
        "PROJECTION_DEFAULT"
    }
}

/// The stage tree: `stages` (innermost first) over `base`; with counters
/// when executed.
/// The index a plan's access path reads (`IXSCAN`'s `indexName`, under
/// any `FETCH`); `None` for a collection scan.
fn index_name(plan: &Document) -> Option<&str> {
    let mut node = plan;
    loop {
        if let Ok(name) = node.get_str("indexName") {
            return Some(name);
        }
        node = node.get_document("inputStage").ok()?;
    }
}

fn tree(base: Document, stages: &[Stage], run: Option<&Counted>) -> Document {
    let mut node = match run {
        Some(c) => scan_stats(base, c),
        None => base,
    };
    let works = run.map_or(0, |c| c.keys.max(c.docs) + 1);
    for s in stages {
        let mut d = s.doc.clone();
        if let Some(c) = run {
            stats_into(&mut d, s.returned, c.millis, works);
        }
        d.insert("inputStage", node);
        node = d;
    }
    node
}

/// The counters MongoDB reports on every stage.
fn stats_into(d: &mut Document, returned: u64, millis: i64, works: u64) {
    d.insert("nReturned", returned as i64);
    d.insert("executionTimeMillisEstimate", millis);
    d.insert("works", works as i64);
    d.insert("advanced", returned as i64);
    d.insert(
        "needTime",
        works.saturating_sub(returned).saturating_sub(1) as i64,
    );
    d.insert("needYield", 0_i64);
    d.insert("saveState", 0_i64);
    d.insert("restoreState", 0_i64);
    d.insert("isEOF", 1_i64);
}

/// The scan stages with their counters: documents on `COLLSCAN`, `FETCH`
/// and `IDHACK`, keys on `IXSCAN` and `IDHACK`.
fn scan_stats(mut base: Document, c: &Counted) -> Document {
    let works = c.keys.max(c.docs) + 1;
    match base.get_str("stage").unwrap_or_default() {
        "FETCH" => {
            if let Ok(ix) = base.get_document_mut("inputStage") {
                stats_into(ix, c.docs, c.millis, works);
                ix.insert("keysExamined", c.keys as i64);
                ix.insert("seeks", 1_i64);
                ix.insert("dupsTested", 0_i64);
                ix.insert("dupsDropped", 0_i64);
            }
            stats_into(&mut base, c.matched, c.millis, works);
            base.insert("docsExamined", c.docs as i64);
            base.insert("alreadyHasObj", 0_i64);
        }
        "IDHACK" => {
            stats_into(&mut base, c.matched, c.millis, works);
            base.insert("keysExamined", c.keys as i64);
            base.insert("docsExamined", c.docs as i64);
        }
        "RECORD_STORE_FAST_COUNT" | "EOF" => {
            stats_into(&mut base, 0, c.millis, 1);
        }
        _ => {
            stats_into(&mut base, c.matched, c.millis, works);
            base.insert("docsExamined", c.docs as i64);
        }
    }
    base
}
