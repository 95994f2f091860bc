//! The commutative split of a pipeline: which leading part may run on a
//! parallel, out-of-order scan, and the mergeable state it accumulates.
//!
//! Owns: [`Pipeline::split`] into [`Split`], the scan-side evaluator
//! [`CommutativePart`] with its [`PartialState`] (`feed`, `merge`, `finish`),
//! and [`prepare`], which turns a pipeline into what `api::aggregate` executes.
//!
//! Invariants: see the module doc of `query::aggregate` — `merge` is
//! associative and commutative on the finished result; `feed` assumes the
//! scan already applied the split's `scan_filter`. A state is only ever fed to,
//! merged with and finished by the part that created it; a mismatch is an
//! internal error, never a panic.

use bson::raw::RawDocument;
use bson::{Bson, Document};

use crate::error::{Error, Result};
use crate::query::aggregate::exec::Exec;
use crate::query::aggregate::group::{Group, GroupState};
use crate::query::aggregate::stages::{per_document, Cur};
use crate::query::aggregate::{ParseCtx, Pipeline, Runtime, Stage};

impl Pipeline {
    /// Split into the scan filter (leading `$match` stages), the commutative part
    /// (the longest following run of per-document stages, optionally closed by one
    /// `$group` with only mergeable accumulators) and the rest.
    pub fn split(self) -> Split {
        let mut stages = self.stages.into_iter().peekable();
        let mut matches = Vec::new();
        while let Some(Stage::Match { .. }) = stages.peek() {
            if let Some(Stage::Match { spec, .. }) = stages.next() {
                if !spec.is_empty() {
                    matches.push(spec);
                }
            }
        }
        let scan_filter = match matches.len() {
            0 => None,
            1 => matches.pop(),
            _ => Some(
                bson::doc! {"$and": matches.into_iter().map(Bson::Document).collect::<Vec<_>>()},
            ),
        };
        let mut per_doc = Vec::new();
        while stages.peek().is_some_and(Stage::is_per_document) {
            if let Some(s) = stages.next() {
                per_doc.push(s);
            }
        }
        let mut group = None;
        if let Some(Stage::Group(g)) = stages.peek() {
            if g.is_mergeable() {
                if let Some(Stage::Group(g)) = stages.next() {
                    group = Some(g);
                }
            }
        }
        let commutative = if per_doc.is_empty() && group.is_none() {
            None
        } else {
            Some(CommutativePart {
                stages: per_doc,
                group,
            })
        };
        Split {
            scan_filter,
            commutative,
            rest: Pipeline {
                stages: stages.collect(),
            },
        }
    }

    /// `skip + limit` when the pipeline starts with `$skip*`/`$limit`: only that
    /// many input documents can matter (the input order is arbitrary anyway).
    fn leading_limit(&self) -> Option<u64> {
        let mut skip = 0u64;
        for s in &self.stages {
            match s {
                Stage::Skip(n) => skip = skip.saturating_add(*n),
                Stage::Limit(n) => return Some(skip.saturating_add(*n)),
                _ => return None,
            }
        }
        None
    }

    /// Does the result depend on the order documents arrive in (before any
    /// `$sort` re-establishes one)?
    pub(super) fn is_order_sensitive(&self) -> bool {
        for s in &self.stages {
            match s {
                // These re-establish an order (or, `$sample`, make it random
                // whatever it was).
                Stage::Sort(_) | Stage::BucketAuto(_) | Stage::Densify(_) | Stage::Sample(_) => {
                    return false
                }
                Stage::Window(w) => return !w.is_sorted(),
                // One output document: what follows cannot see an order.
                Stage::Facet(f) => return f.is_order_sensitive(),
                Stage::Limit(_) | Stage::Skip(_) => return true,
                Stage::Group(g) if !g.is_mergeable() => return true,
                _ => {}
            }
        }
        false
    }
}

/// A pipeline split for scanning: see [`Pipeline::split`].
#[derive(Debug)]
pub struct Split {
    /// The leading `$match` stages, combined with `$and` (`None`: match all).
    pub scan_filter: Option<Document>,
    /// Per-document stages and an optional mergeable `$group` (`None`: no such stage).
    pub commutative: Option<CommutativePart>,
    /// Everything after, run in order on the commutative part's output.
    pub rest: Pipeline,
}

impl Split {
    /// Can an out-of-order, multi-threaded (OLCP) scan run this pipeline with the
    /// same answer as an in-order one? True when there is a scan-side part and the
    /// rest does not depend on the input order.
    pub fn olcp_eligible(&self) -> bool {
        let has_scan_part = self.scan_filter.is_some() || self.commutative.is_some();
        let after_group = self.commutative.as_ref().is_some_and(|c| c.group.is_some());
        has_scan_part && (after_group || !self.rest.is_order_sensitive())
    }
}

/// The commutative scan-side part of a pipeline.
#[derive(Debug, Clone)]
pub struct CommutativePart {
    pub(super) stages: Vec<Stage>,
    pub(super) group: Option<Group>,
}

/// Per-thread (or per-range) state of a [`CommutativePart`]; `Send`, mergeable.
#[derive(Debug, Clone)]
pub struct PartialState(StateInner);

#[derive(Debug, Clone)]
enum StateInner {
    /// No `$group`: the documents that came out of the per-document stages.
    Docs(Vec<Document>),
    Groups(GroupState),
}

impl PartialState {
    /// Output documents collected (no `$group`) or groups formed so far.
    pub fn len(&self) -> usize {
        match &self.0 {
            StateInner::Docs(d) => d.len(),
            StateInner::Groups(g) => g.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Take the documents collected so far (a part without `$group`), leaving
    /// the state empty; `None` for a `$group` state.
    pub fn take_docs(&mut self) -> Option<Vec<Document>> {
        match &mut self.0 {
            StateInner::Docs(d) => Some(std::mem::take(d)),
            StateInner::Groups(_) => None,
        }
    }
}

impl CommutativePart {
    /// A part with no stages: collects the scanned documents as they are.
    pub fn collect_all() -> CommutativePart {
        CommutativePart {
            stages: Vec::new(),
            group: None,
        }
    }

    /// Does it end in a `$group`?
    pub fn has_group(&self) -> bool {
        self.group.is_some()
    }

    /// Stage names in order (for explain).
    pub fn stage_names(&self) -> Vec<&'static str> {
        let mut names: Vec<_> = self.stages.iter().map(Stage::name).collect();
        if self.group.is_some() {
            names.push("$group");
        }
        names
    }

    pub fn new_state(&self) -> PartialState {
        PartialState(match &self.group {
            Some(_) => StateInner::Groups(GroupState::default()),
            None => StateInner::Docs(Vec::new()),
        })
    }

    /// Apply the per-document stages to `doc` and accumulate the result
    /// (no other collection readable: see [`CommutativePart::feed_with`]).
    pub fn feed(&self, state: &mut PartialState, doc: &RawDocument) -> Result<()> {
        self.feed_with(state, doc, &Runtime::standalone())
    }

    /// [`CommutativePart::feed`] with `rt`'s other collections (a `$lookup`
    /// in the part) and limits.
    pub fn feed_with(
        &self,
        state: &mut PartialState,
        doc: &RawDocument,
        rt: &Runtime<'_>,
    ) -> Result<()> {
        let group = self.group.as_ref();
        per_document(
            &self.stages,
            Cur::Raw(doc),
            rt,
            &mut |cur| match (&mut state.0, group) {
                (StateInner::Groups(gs), Some(g)) => g
                    .feed(gs, cur.root())
                    .and_then(|()| g.check_memory_no_disk(gs.bytes())),
                (StateInner::Docs(out), None) => {
                    out.push(cur.into_document()?);
                    Ok(())
                }
                _ => Err(Error::Internal(
                    "partial state does not belong to this pipeline part".into(),
                )),
            },
        )
    }

    /// Combine two states (associative and commutative; see the module invariants).
    pub fn merge(&self, a: PartialState, b: PartialState) -> Result<PartialState> {
        match (a.0, b.0, self.group.as_ref()) {
            (StateInner::Docs(mut x), StateInner::Docs(y), None) => {
                x.extend(y);
                Ok(PartialState(StateInner::Docs(x)))
            }
            (StateInner::Groups(x), StateInner::Groups(y), Some(g)) => {
                Ok(PartialState(StateInner::Groups(g.merge(x, y)?)))
            }
            _ => Err(Error::Internal(
                "partial states do not belong to this pipeline part".into(),
            )),
        }
    }

    /// The output documents (groups in `_id` order).
    pub fn finish(&self, state: PartialState) -> Result<Vec<Document>> {
        match (state.0, self.group.as_ref()) {
            (StateInner::Docs(d), None) => Ok(d),
            (StateInner::Groups(gs), Some(g)) => g.finish(gs),
            _ => Err(Error::Internal(
                "partial state does not belong to this pipeline part".into(),
            )),
        }
    }
}
// ---------------------------------------------------------------- preparation

/// The pieces execution needs, from a parsed pipeline.
pub struct Prepared {
    pub filter: Document,
    pub part: CommutativePart,
    pub rest: Pipeline,
    /// Stop feeding once the part's output holds this many documents.
    pub stop_after: Option<usize>,
    /// [`Split::olcp_eligible`].
    pub eligible: bool,
    /// [`Pipeline::foreign_names`]: what the scan pins at its start.
    pub foreign: Vec<String>,
    /// The pipeline starts with `$documents`: it reads no collection.
    pub documents: bool,
}

/// Parse and split `pipeline` for execution.
pub fn prepare(pipeline: &[Document]) -> Result<Prepared> {
    prepare_with(pipeline, None)
}

/// [`prepare`] with the command's `let` variables.
pub fn prepare_with(pipeline: &[Document], let_vars: Option<&Document>) -> Result<Prepared> {
    prepare_collated(pipeline, let_vars, None)
}

/// [`prepare_with`] under the command's collation (its stages' filters,
/// sorts and group keys compare strings under it; the caller parses the
/// scan filter `Prepared::filter` with it too).
pub fn prepare_collated(
    pipeline: &[Document],
    let_vars: Option<&Document>,
    collator: Option<std::sync::Arc<crate::doc::collation::Collator>>,
) -> Result<Prepared> {
    let ctx = ParseCtx::new(let_vars)?.with_collation(collator);
    let parsed = Pipeline::parse_in(pipeline, &ctx)?;
    let foreign = parsed.foreign_names();
    let documents = parsed.starts_with_documents();
    let split = parsed.split();
    let eligible = split.olcp_eligible();
    let part = split
        .commutative
        .unwrap_or_else(CommutativePart::collect_all);
    let stop_after = if part.has_group() {
        None
    } else {
        split
            .rest
            .leading_limit()
            .map(|n| usize::try_from(n).unwrap_or(usize::MAX))
    };
    Ok(Prepared {
        filter: split.scan_filter.unwrap_or_default(),
        part,
        rest: split.rest,
        stop_after,
        eligible: eligible && !documents,
        foreign,
        documents,
    })
}

impl Prepared {
    /// Lower the memory limit of the commutative part's `$group` to `bytes`
    /// (what an OLCP run feeds and merges directly; [`Exec`] applies the
    /// read's limit to the stages it runs itself).
    pub fn limit_memory(&mut self, bytes: usize) {
        if let Some(g) = &mut self.part.group {
            g.memory_limit = g.memory_limit.min(bytes);
        }
    }

    /// Push-based execution of everything after the scan filter (the
    /// commutative part, then the rest) under `rt`.
    pub fn exec<'p>(&'p self, rt: &'p Runtime<'p>) -> Exec<'p> {
        Exec::new(
            &self.part.stages,
            self.part.group.as_ref(),
            &self.rest.stages,
            rt,
        )
    }

    /// Push-based execution of the rest only (after a commutative part run
    /// elsewhere, e.g. by OLCP threads).
    pub fn rest_exec<'p>(&'p self, rt: &'p Runtime<'p>) -> Exec<'p> {
        Exec::new(&[], None, &self.rest.stages, rt)
    }

    /// The final `$out`/`$merge`, if any.
    pub fn output(&self) -> Option<&crate::query::aggregate::Output> {
        self.rest.output()
    }

    /// The stage names of the commutative part and of the rest.
    pub fn names(&self) -> (Vec<String>, Vec<String>) {
        (
            self.part
                .stage_names()
                .into_iter()
                .map(String::from)
                .collect(),
            self.rest
                .stage_names()
                .into_iter()
                .map(String::from)
                .collect(),
        )
    }
}
