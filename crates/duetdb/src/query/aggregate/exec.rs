//! Push-based execution of a pipeline over a stream of documents, under a
//! read's limits: what `api::aggregate` runs on a scan (or on the output of
//! an OLCP part), instead of materializing every stage's input.
//!
//! Owns: [`Exec`] (one node per stage; documents are pushed in one at a
//! time, blocking stages keep what they must and emit at [`Exec::finish`]).
//!
//! Why push: the scan drives (it calls back per document), so per-document
//! stages, `$skip` and `$limit` hold nothing; `$limit` answers "stop" and
//! the scan ends early; only the blocking stages hold documents, and each is
//! bounded:
//! - `$sort` goes through a [`Sorter`]: at most the memory limit (100 MiB by
//!   default), then spilled runs (or 292 when disk use is not allowed); a
//!   `$sort` followed by `$skip*`/`$limit` keeps only `skip + limit`
//!   documents (top-k);
//! - `$group` keeps its state under the same limit and never spills: over
//!   it, 292 whatever `allowDiskUse` says (the documented choice);
//! - `$count` keeps a number.
//!
//! The final output (what the cursor gets) is collected as it is today: the
//! result of a pipeline is materialized.
//!
//! Invariants: the answer equals the reference evaluation
//! [`Pipeline::run_on`] of the same stages on the same input in the same
//! order (tested); stored documents that no stage rewrote stay shared
//! (`DocRef`s) through per-document stages and the sort; the cancellation
//! token is checked every [`PAGE_DOCS`] rows handed to any node (an
//! `$unwind` that turns one document into thousands is checked per row, not
//! per scanned document).
//!
//! [`Pipeline::run_on`]: crate::query::aggregate::Pipeline::run_on

use std::ops::ControlFlow;
use std::path::PathBuf;
use std::sync::Arc;

use bson::{Bson, Document, RawDocumentBuf};

use crate::doc::DocRef;
use crate::error::{CancelToken, Error, Result};
use crate::query::aggregate::group::{Group, GroupState};
use crate::query::aggregate::stages::{per_document, Cur};
use crate::query::aggregate::Stage;
use crate::query::expr::Root;
use crate::query::limits::{ReadLimits, PAGE_DOCS};
use crate::query::sorter::Sorter;

/// A document flowing between nodes.
enum Row {
    /// A stored document no stage has rewritten (shared, not copied).
    Shared(DocRef),
    Owned(Document),
}

impl Row {
    fn into_document(self) -> Result<Document> {
        match self {
            Row::Shared(d) => crate::doc::to_document(&d),
            Row::Owned(d) => Ok(d),
        }
    }

    fn into_docref(self) -> Result<DocRef> {
        match self {
            Row::Shared(d) => Ok(d),
            Row::Owned(d) => Ok(Arc::new(
                RawDocumentBuf::try_from(&d).map_err(|e| Error::InvalidBson(e.to_string()))?,
            )),
        }
    }
}

/// One stage's execution state.
enum Node<'p> {
    PerDoc(&'p Stage),
    Group { group: Group, state: GroupState },
    Sort(Option<Sorter>),
    Skip(u64),
    Limit(u64),
    Count { field: &'p str, n: u64 },
}

/// Counts rows handed between nodes and checks the token every page.
struct Ticker {
    cancel: CancelToken,
    rows: usize,
}

impl Ticker {
    fn tick(&mut self) -> Result<()> {
        self.rows += 1;
        if self.rows.is_multiple_of(PAGE_DOCS) {
            self.cancel.check()?;
        }
        Ok(())
    }
}

/// A pipeline being executed; see the module documentation.
pub struct Exec<'p> {
    nodes: Vec<Node<'p>>,
    out: Vec<Document>,
    ticker: Ticker,
    /// A `$limit` was reached: nothing pushed from now on can matter.
    stopped: bool,
}

impl std::fmt::Debug for Exec<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Exec")
            .field("nodes", &self.nodes.len())
            .field("out", &self.out.len())
            .finish()
    }
}

impl<'p> Exec<'p> {
    /// Execute `stages` in order (`group` is a `$group` inserted after them
    /// all when given first: the commutative part's).
    pub(super) fn new(
        stages: &'p [Stage],
        group: Option<&'p Group>,
        rest: &'p [Stage],
        limits: &ReadLimits,
        spill_dir: PathBuf,
    ) -> Exec<'p> {
        let mut all: Vec<StageRef<'p>> = stages.iter().map(StageRef::Stage).collect();
        if let Some(g) = group {
            all.push(StageRef::Group(g));
        }
        all.extend(rest.iter().map(StageRef::Stage));
        let mut nodes = Vec::with_capacity(all.len());
        for (i, s) in all.iter().enumerate() {
            let node = match *s {
                StageRef::Group(g) | StageRef::Stage(Stage::Group(g)) => {
                    let mut group = g.clone();
                    group.memory_limit = group.memory_limit.min(limits.memory_limit_bytes);
                    Node::Group {
                        group,
                        state: GroupState::default(),
                    }
                }
                StageRef::Stage(Stage::Sort(spec)) => {
                    let keep = top_k(&all[i + 1..]);
                    Node::Sort(Some(Sorter::new(
                        spec.clone(),
                        limits,
                        spill_dir.clone(),
                        keep,
                    )))
                }
                StageRef::Stage(Stage::Skip(n)) => Node::Skip(*n),
                StageRef::Stage(Stage::Limit(n)) => Node::Limit(*n),
                StageRef::Stage(Stage::Count(field)) => Node::Count {
                    field: field.as_str(),
                    n: 0,
                },
                StageRef::Stage(stage) => Node::PerDoc(stage),
            };
            nodes.push(node);
        }
        Exec {
            nodes,
            out: Vec::new(),
            ticker: Ticker {
                cancel: limits.cancel.clone(),
                rows: 0,
            },
            stopped: false,
        }
    }

    /// Push a stored document; `Break`: nothing more can change the answer.
    pub fn push_doc(&mut self, d: &DocRef) -> Result<ControlFlow<()>> {
        self.push_row(Row::Shared(d.clone()))
    }

    /// Push a computed document.
    pub fn push_document(&mut self, d: Document) -> Result<ControlFlow<()>> {
        self.push_row(Row::Owned(d))
    }

    fn push_row(&mut self, row: Row) -> Result<ControlFlow<()>> {
        if self.stopped {
            return Ok(ControlFlow::Break(()));
        }
        let flow = push_at(&mut self.nodes, &mut self.out, &mut self.ticker, row)?;
        if flow.is_break() {
            self.stopped = true;
        }
        Ok(flow)
    }

    /// Flush the blocking stages in order; the pipeline's output.
    pub fn finish(mut self) -> Result<Vec<Document>> {
        self.ticker.cancel.check()?;
        for i in 0..self.nodes.len() {
            let (head, rest) = self.nodes.split_at_mut(i + 1);
            let (out, ticker) = (&mut self.out, &mut self.ticker);
            match &mut head[i] {
                Node::Group { group, state } => {
                    let docs = group.finish(std::mem::take(state))?;
                    for d in docs {
                        if push_at(rest, out, ticker, Row::Owned(d))?.is_break() {
                            break;
                        }
                    }
                }
                Node::Sort(sorter) => {
                    let Some(sorter) = sorter.take() else {
                        continue;
                    };
                    for d in sorter.finish()? {
                        if push_at(rest, out, ticker, Row::Shared(d?))?.is_break() {
                            break;
                        }
                    }
                }
                Node::Count { field, n } => {
                    if *n > 0 {
                        let v = i32::try_from(*n)
                            .map(Bson::Int32)
                            .unwrap_or(Bson::Int64(*n as i64));
                        let _ = push_at(rest, out, ticker, Row::Owned(bson::doc! {*field: v}))?;
                    }
                }
                Node::PerDoc(_) | Node::Skip(_) | Node::Limit(_) => {}
            }
        }
        Ok(self.out)
    }
}

/// A stage of the executed sequence (the commutative part's `$group` is
/// not a [`Stage`] value of its own).
#[derive(Clone, Copy)]
enum StageRef<'p> {
    Stage(&'p Stage),
    Group(&'p Group),
}

/// `skip + limit` when the stages right after a `$sort` are `$skip*` then
/// `$limit`: only that many sorted documents can reach the output.
fn top_k(after: &[StageRef<'_>]) -> Option<usize> {
    let mut skip = 0u64;
    for s in after {
        match s {
            StageRef::Stage(Stage::Skip(n)) => skip = skip.saturating_add(*n),
            StageRef::Stage(Stage::Limit(n)) => {
                return Some(usize::try_from(skip.saturating_add(*n)).unwrap_or(usize::MAX))
            }
            _ => return None,
        }
    }
    None
}

/// Push `row` into the first of `nodes` (or the output when none is left).
fn push_at(
    nodes: &mut [Node<'_>],
    out: &mut Vec<Document>,
    ticker: &mut Ticker,
    row: Row,
) -> Result<ControlFlow<()>> {
    ticker.tick()?;
    let Some((node, rest)) = nodes.split_first_mut() else {
        out.push(row.into_document()?);
        return Ok(ControlFlow::Continue(()));
    };
    match node {
        Node::PerDoc(stage) => {
            let mut flow = ControlFlow::Continue(());
            let stages = std::slice::from_ref(*stage);
            let mut emit = |cur: Cur<'_>, shared: Option<&DocRef>| -> Result<()> {
                if flow.is_break() {
                    return Ok(());
                }
                let next = match (cur, shared) {
                    // Only an untouched input stays raw: share it.
                    (Cur::Raw(_), Some(d)) => Row::Shared(d.clone()),
                    (cur, _) => Row::Owned(cur.into_document()?),
                };
                flow = push_at(rest, out, ticker, next)?;
                Ok(())
            };
            match row {
                Row::Shared(d) => {
                    per_document(stages, Cur::Raw(&d), &mut |c| emit(c, Some(&d)))?;
                }
                Row::Owned(doc) => per_document(stages, Cur::Owned(doc), &mut |c| emit(c, None))?,
            }
            Ok(flow)
        }
        Node::Group { group, state } => {
            match &row {
                Row::Shared(d) => group.accumulate(state, Root::Raw(d))?,
                Row::Owned(d) => group.accumulate(state, Root::Doc(d))?,
            }
            Ok(ControlFlow::Continue(()))
        }
        Node::Sort(sorter) => {
            let sorter = sorter
                .as_mut()
                .ok_or_else(|| Error::Internal("push into a finished $sort".into()))?;
            sorter.push(row.into_docref()?)?;
            Ok(ControlFlow::Continue(()))
        }
        Node::Skip(left) => {
            if *left > 0 {
                *left -= 1;
                return Ok(ControlFlow::Continue(()));
            }
            push_at(rest, out, ticker, row)
        }
        Node::Limit(left) => {
            if *left == 0 {
                return Ok(ControlFlow::Break(()));
            }
            *left -= 1;
            let flow = push_at(rest, out, ticker, row)?;
            if *left == 0 {
                return Ok(ControlFlow::Break(()));
            }
            Ok(flow)
        }
        Node::Count { n, .. } => {
            *n += 1;
            Ok(ControlFlow::Continue(()))
        }
    }
}
