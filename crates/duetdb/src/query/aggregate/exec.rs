//! Push-based execution of a pipeline over a stream of documents, under a
//! read's limits: what `api::aggregate` runs on a scan (or on the output of
//! an OLCP part), instead of materializing every stage's input.
//!
//! Owns: [`Exec`] (one node per stage; documents are pushed in one at a
//! time, blocking stages keep what they must and emit at [`Exec::finish`]).
//!
//! Why push: the scan drives (it calls back per document), so per-document
//! stages (`$lookup` included: it reads the other collection at the
//! pipeline's snapshot through the [`Runtime`]), `$skip` and `$limit` hold
//! nothing; `$limit` answers "stop" and the scan ends early; only the
//! blocking stages hold documents, and each is bounded:
//! - `$sort` goes through a [`Sorter`]: at most the memory limit (100 MiB by
//!   default), then spilled runs (or 292 when disk use is not allowed); a
//!   `$sort` followed by `$skip*`/`$limit` keeps only `skip + limit`
//!   documents (top-k);
//! - `$group` keeps its state under the same limit, then spills it as runs
//!   of partial states merged by key at the end (`group_spill.rs`), or 292
//!   when disk use is not allowed;
//! - `$count` keeps a number;
//! - `$facet` runs one nested [`Exec`] per facet on every document (each
//!   bounded the same way) and their outputs together by the memory limit
//!   (4031700);
//! - `$sample` gives every document a random key and keeps the `size`
//!   smallest (uniform without replacement, emitted in key order, so in
//!   random order), as MongoDB's `$sample` sorts on a random key: through
//!   a [`Sorter`] with `keep = size`, so past the memory limit the kept
//!   documents spill as sorted runs when disk use is allowed (292, the
//!   sort's message, when not);
//! - `$densify` sorts its input by (partition, value) through a [`Sorter`]
//!   (spilled, or 292) and densifies the sorted stream holding one
//!   partition's few figures; the documents it generates are emitted as
//!   they are made (at most 500,000 per stage: 5897900);
//! - `$setWindowFields` (and `$fill`'s methods, which are one) sorts its
//!   input by (partition, sortBy) through a [`Sorter`] and holds one
//!   partition at a time; a partition past the limit is spooled to disk
//!   (`spill.rs` `Spool`) when disk use is allowed, else 292;
//! - `$bucketAuto` sorts its input by `groupBy` through a [`Sorter`]
//!   (spilled, or 292 when disk use is not allowed) and cuts the buckets
//!   from the sorted stream;
//! - `$unionWith` holds nothing: at the end of its input it runs its
//!   sub-pipeline on the other collection and passes the results on.
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
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use bson::{Bson, Document, RawDocumentBuf};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use crate::doc::size::document_len;
use crate::doc::DocRef;
use crate::error::{CancelToken, Error, Result};
use crate::query::aggregate::bucket::{BucketAuto, BucketAutoRun};
use crate::query::aggregate::facet::FacetRun;
use crate::query::aggregate::fill::{Densify, DensifyRun};
use crate::query::aggregate::group::Group;
use crate::query::aggregate::group_spill::SpillingGroup;
use crate::query::aggregate::stages::{per_document, Cur};
use crate::query::aggregate::window::{Window, WindowRun};
use crate::query::aggregate::{Runtime, Stage, StageCount};
use crate::query::expr::{Expr, Root};
use crate::query::limits::PAGE_DOCS;
use crate::query::sort::SortSpec;
use crate::query::sorter::Sorter;

/// A document flowing between nodes.
pub(super) enum Row {
    /// A stored document no stage has rewritten (shared, not copied).
    Shared(DocRef),
    Owned(Document),
}

impl Row {
    pub(super) fn into_document(self) -> Result<Document> {
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

    /// A copy for another consumer (`$facet`): shared rows cost a pointer.
    pub(super) fn duplicate(&self) -> Row {
        match self {
            Row::Shared(d) => Row::Shared(d.clone()),
            Row::Owned(d) => Row::Owned(d.clone()),
        }
    }

    /// The bytes this row holds (its encoded size).
    pub(super) fn bytes(&self) -> usize {
        match self {
            Row::Shared(d) => d.as_bytes().len(),
            Row::Owned(d) => document_len(d),
        }
    }
}

/// One stage's execution state.
enum Node<'p> {
    PerDoc(&'p Stage),
    Group(Option<SpillingGroup>),
    Sort(Option<Sorter>),
    Skip(u64),
    Limit(u64),
    Count {
        field: &'p str,
        n: u64,
    },
    /// `$unionWith`: passes its input on, then the other collection's.
    UnionWith(&'p crate::query::aggregate::lookup::UnionWith),
    Facet(Option<FacetRun<'p>>),
    Sample(u64, Option<Box<Sample>>),
    /// `$bucketAuto`: its input through a sorter (started at the first row).
    BucketAuto(&'p BucketAuto, Option<BucketAutoRun<'p>>),
    /// `$setWindowFields`: its input through a sorter (started at the first
    /// row), one partition held at a time.
    Window(&'p Window, Option<WindowRun<'p>>),
    /// `$densify`: its input through a sorter (started at the first row).
    Densify(&'p Densify, Option<DensifyRun<'p>>),
    /// A stage that needs its whole input (a `$setWindowFields` whose sort
    /// cannot go through the sorter).
    Hold(Held<'p>),
    /// `$documents`: emits its documents when the pipeline finishes.
    Documents(&'p Expr),
    /// `$out` / `$merge`: the API writes what reaches the end.
    PassThrough,
}

/// Counts rows handed between nodes and checks the token every page.
struct Ticker {
    cancel: CancelToken,
    rows: usize,
    /// Per-position counts when explain asked for them ([`Exec::count_stages`]).
    stages: Option<StageClock>,
}

/// Rows that arrived at each position of the node list (position 0: the
/// pipeline's input; position `i + 1`: what node `i` emitted; the last: the
/// output) and when the last one did, from the execution's start.
struct StageClock {
    nodes: usize,
    started: std::time::Instant,
    arrived: Vec<u64>,
    last_at: Vec<std::time::Duration>,
}

impl StageClock {
    fn arrive(&mut self, nodes_left: usize) {
        let pos = self.nodes - nodes_left;
        if let (Some(n), Some(t)) = (self.arrived.get_mut(pos), self.last_at.get_mut(pos)) {
            *n += 1;
            *t = self.started.elapsed();
        }
    }

    /// The input's count, then each node's output count, each with the
    /// time of its last row.
    fn counts(&self) -> Vec<StageCount> {
        (0..=self.nodes)
            .map(|pos| StageCount {
                returned: self.arrived[pos],
                millis: u64::try_from(self.last_at[pos].as_millis()).unwrap_or(u64::MAX),
            })
            .collect()
    }
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

/// Where the pipeline's output goes, with an optional bound on its bytes
/// (a `$facet`'s outputs share one).
struct Out {
    docs: Vec<Document>,
    budget: Option<(Arc<AtomicUsize>, usize)>,
}

impl Out {
    fn push(&mut self, d: Document) -> Result<()> {
        if let Some((used, limit)) = &self.budget {
            let now = used.fetch_add(document_len(&d), Ordering::Relaxed) + document_len(&d);
            if now > *limit {
                return Err(coded!(
                    4031700,
                    format!(
                        "document constructed by $facet is {now} bytes, which exceeds the limit of {limit} bytes"
                    ),
                ));
            }
        }
        self.docs.push(d);
        Ok(())
    }
}

/// A pipeline being executed; see the module documentation.
pub struct Exec<'p> {
    nodes: Vec<Node<'p>>,
    rt: &'p Runtime<'p>,
    out: Out,
    ticker: Ticker,
    /// A `$limit` was reached: nothing pushed from now on can matter.
    stopped: bool,
}

impl std::fmt::Debug for Exec<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Exec")
            .field("nodes", &self.nodes.len())
            .field("out", &self.out.docs.len())
            .finish()
    }
}

impl<'p> Exec<'p> {
    /// Execute `stages` in order (`group` is a `$group` inserted after them
    /// all when given first: the commutative part's), then `rest`.
    pub(super) fn new(
        stages: &'p [Stage],
        group: Option<&'p Group>,
        rest: &'p [Stage],
        rt: &'p Runtime<'p>,
    ) -> Exec<'p> {
        let limits = &rt.limits;
        let mut all: Vec<StageRef<'p>> = stages.iter().map(StageRef::Stage).collect();
        if let Some(g) = group {
            all.push(StageRef::Group(g));
        }
        all.extend(rest.iter().map(StageRef::Stage));
        let mut nodes = Vec::with_capacity(all.len());
        for (i, s) in all.iter().enumerate() {
            let node = match *s {
                StageRef::Group(g) | StageRef::Stage(Stage::Group(g)) => Node::Group(Some(
                    SpillingGroup::new(g.clone(), limits, rt.spill_dir.clone()),
                )),
                StageRef::Stage(Stage::Sort(spec)) => {
                    let keep = top_k(&all[i + 1..]);
                    Node::Sort(Some(Sorter::new(
                        spec.clone(),
                        limits,
                        rt.spill_dir.clone(),
                        keep,
                    )))
                }
                StageRef::Stage(Stage::Skip(n)) => Node::Skip(*n),
                StageRef::Stage(Stage::Limit(n)) => Node::Limit(*n),
                StageRef::Stage(Stage::Count(field)) => Node::Count {
                    field: field.as_str(),
                    n: 0,
                },
                StageRef::Stage(Stage::UnionWith(u)) => Node::UnionWith(u),
                StageRef::Stage(Stage::Facet(f)) => Node::Facet(Some(FacetRun::new(f, rt))),
                StageRef::Stage(Stage::Sample(n)) => Node::Sample(*n, None),
                StageRef::Stage(Stage::BucketAuto(b)) => Node::BucketAuto(b, None),
                StageRef::Stage(Stage::Window(w)) if w.can_spill() => Node::Window(w, None),
                StageRef::Stage(Stage::Densify(d)) => Node::Densify(d, None),
                StageRef::Stage(stage @ Stage::Window(_)) => Node::Hold(Held {
                    stage,
                    rows: Vec::new(),
                    bytes: 0,
                }),
                StageRef::Stage(Stage::Documents(e)) => Node::Documents(e),
                StageRef::Stage(Stage::Output(_)) => Node::PassThrough,
                StageRef::Stage(stage) => Node::PerDoc(stage),
            };
            nodes.push(node);
        }
        Exec {
            nodes,
            rt,
            out: Out {
                docs: Vec::new(),
                budget: None,
            },
            ticker: Ticker {
                cancel: limits.cancel.clone(),
                rows: 0,
                stages: None,
            },
            stopped: false,
        }
    }

    /// Bound the bytes of this execution's output by `limit`, counted in
    /// `used` (shared with the other facets of one `$facet`): 4031700 past it.
    pub(super) fn limit_output(&mut self, used: Arc<AtomicUsize>, limit: usize) {
        self.out.budget = Some((used, limit));
    }

    /// Count what each stage returns (explain's executionStats): at
    /// [`Exec::finish`] the counts go to the runtime
    /// ([`Runtime::stage_counts`]). Costs a clock read per row per stage.
    pub fn count_stages(&mut self) {
        let nodes = self.nodes.len();
        self.ticker.stages = Some(StageClock {
            nodes,
            started: std::time::Instant::now(),
            arrived: vec![0; nodes + 1],
            last_at: vec![std::time::Duration::ZERO; nodes + 1],
        });
    }

    /// Has a `$limit` ended this execution (nothing pushed can matter)?
    pub(super) fn is_stopped(&self) -> bool {
        self.stopped
    }

    /// Push a stored document; `Break`: nothing more can change the answer.
    pub fn push_doc(&mut self, d: &DocRef) -> Result<ControlFlow<()>> {
        self.push_row(Row::Shared(d.clone()))
    }

    /// Push a computed document.
    pub fn push_document(&mut self, d: Document) -> Result<ControlFlow<()>> {
        self.push_row(Row::Owned(d))
    }

    pub(super) fn push_row(&mut self, row: Row) -> Result<ControlFlow<()>> {
        if self.stopped {
            return Ok(ControlFlow::Break(()));
        }
        let flow = push_at(
            self.rt,
            &mut self.nodes,
            &mut self.out,
            &mut self.ticker,
            row,
        )?;
        if flow.is_break() {
            self.stopped = true;
        }
        Ok(flow)
    }

    /// Flush the blocking stages in order; the pipeline's output.
    pub fn finish(mut self) -> Result<Vec<Document>> {
        self.ticker.cancel.check()?;
        let rt = self.rt;
        for i in 0..self.nodes.len() {
            let (head, rest) = self.nodes.split_at_mut(i + 1);
            let (out, ticker) = (&mut self.out, &mut self.ticker);
            let mut emit = |row: Row| push_at(rt, rest, out, ticker, row);
            match &mut head[i] {
                Node::Group(group) => {
                    let Some(group) = group.take() else {
                        continue;
                    };
                    rt.note_group_spills(group.spills());
                    let mut out = group.finish()?;
                    while let Some(d) = out.next_doc()? {
                        if emit(Row::Owned(d))?.is_break() {
                            break;
                        }
                    }
                }
                Node::Sort(sorter) => {
                    let Some(sorter) = sorter.take() else {
                        continue;
                    };
                    for d in sorter.finish()? {
                        if emit(Row::Shared(d?))?.is_break() {
                            break;
                        }
                    }
                }
                Node::Count { field, n } => {
                    if *n > 0 {
                        let v = i32::try_from(*n)
                            .map(Bson::Int32)
                            .unwrap_or(Bson::Int64(*n as i64));
                        let _ = emit(Row::Owned(bson::doc! {*field: v}))?;
                    }
                }
                Node::UnionWith(u) => u.run(rt, &mut |d| emit(Row::Owned(d)))?,
                Node::Facet(run) => {
                    if let Some(run) = run.take() {
                        let _ = emit(Row::Owned(run.finish()?))?;
                    }
                }
                Node::Sample(_, run) => {
                    if let Some(run) = run.take() {
                        for doc in run.sorter.finish()? {
                            if emit(Row::Shared(doc?))?.is_break() {
                                break;
                            }
                        }
                    }
                }
                Node::BucketAuto(stage, run) => {
                    let out = match run.take() {
                        Some(run) => run.finish(rt)?,
                        None => stage.run(Vec::new(), rt)?,
                    };
                    for d in out {
                        if emit(Row::Owned(d))?.is_break() {
                            break;
                        }
                    }
                }
                Node::Window(stage, run) => match run.take() {
                    Some(run) => {
                        run.finish(rt, &mut |d| Ok(emit(Row::Owned(d))?.is_break()))?;
                    }
                    None => {
                        for d in stage.run(Vec::new(), rt)? {
                            if emit(Row::Owned(d))?.is_break() {
                                break;
                            }
                        }
                    }
                },
                Node::Densify(_, run) => {
                    if let Some(run) = run.take() {
                        run.finish(rt, &mut |d| Ok(emit(Row::Owned(d))?.is_break()))?;
                    }
                }
                Node::Hold(held) => {
                    let rows = std::mem::take(&mut held.rows);
                    for d in finish_held(held.stage, rows, rt)? {
                        if emit(Row::Owned(d))?.is_break() {
                            break;
                        }
                    }
                }
                Node::Documents(e) => {
                    for d in documents_of(e)? {
                        if emit(Row::Owned(d))?.is_break() {
                            break;
                        }
                    }
                }
                Node::PerDoc(_) | Node::Skip(_) | Node::Limit(_) | Node::PassThrough => {}
            }
        }
        if let Some(clock) = &self.ticker.stages {
            rt.note_stage_counts(clock.counts());
        }
        Ok(self.out.docs)
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
    rt: &Runtime<'_>,
    nodes: &mut [Node<'_>],
    out: &mut Out,
    ticker: &mut Ticker,
    row: Row,
) -> Result<ControlFlow<()>> {
    ticker.tick()?;
    if let Some(clock) = &mut ticker.stages {
        clock.arrive(nodes.len());
    }
    let Some((node, rest)) = nodes.split_first_mut() else {
        out.push(row.into_document()?)?;
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
                flow = push_at(rt, rest, out, ticker, next)?;
                Ok(())
            };
            match row {
                Row::Shared(d) => {
                    per_document(stages, Cur::Raw(&d), rt, &mut |c| emit(c, Some(&d)))?;
                }
                Row::Owned(doc) => {
                    per_document(stages, Cur::Owned(doc), rt, &mut |c| emit(c, None))?
                }
            }
            Ok(flow)
        }
        Node::Group(group) => {
            let group = group
                .as_mut()
                .ok_or_else(|| Error::Internal("push into a finished $group".into()))?;
            match &row {
                Row::Shared(d) => group.push(Root::Raw(d))?,
                Row::Owned(d) => group.push(Root::Doc(d))?,
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
            push_at(rt, rest, out, ticker, row)
        }
        Node::Limit(left) => {
            if *left == 0 {
                return Ok(ControlFlow::Break(()));
            }
            *left -= 1;
            let flow = push_at(rt, rest, out, ticker, row)?;
            if *left == 0 {
                return Ok(ControlFlow::Break(()));
            }
            Ok(flow)
        }
        Node::Count { n, .. } => {
            *n += 1;
            Ok(ControlFlow::Continue(()))
        }
        Node::UnionWith(_) | Node::PassThrough => push_at(rt, rest, out, ticker, row),
        Node::Facet(run) => {
            let run = run
                .as_mut()
                .ok_or_else(|| Error::Internal("push into a finished $facet".into()))?;
            run.push(row)
        }
        Node::Sample(n, run) => {
            let run = match run {
                Some(run) => run,
                None => run.insert(Box::new(Sample::new(*n, rt)?)),
            };
            run.push(row)?;
            Ok(ControlFlow::Continue(()))
        }
        Node::BucketAuto(stage, run) => {
            let run = match run {
                Some(run) => run,
                None => run.insert(stage.start(rt)?),
            };
            run.push(row.into_document()?)?;
            Ok(ControlFlow::Continue(()))
        }
        Node::Window(stage, run) => {
            let run = match run {
                Some(run) => run,
                None => run.insert(
                    stage
                        .start(rt)
                        .ok_or_else(|| Error::Internal("$setWindowFields cannot sort".into()))?,
                ),
            };
            run.push(row.into_document()?)?;
            Ok(ControlFlow::Continue(()))
        }
        Node::Densify(stage, run) => {
            let run = match run {
                Some(run) => run,
                None => run.insert(stage.start(rt)?),
            };
            run.push(row.into_document()?)?;
            Ok(ControlFlow::Continue(()))
        }
        Node::Hold(held) => {
            held.bytes += row.bytes();
            if held.bytes > rt.limits.memory_limit_bytes {
                return Err(over_memory(held.stage.name(), rt.limits.memory_limit_bytes));
            }
            held.rows.push(row.into_document()?);
            Ok(ControlFlow::Continue(()))
        }
        // `$documents` replaces its input.
        Node::Documents(_) => Ok(ControlFlow::Continue(())),
    }
}

/// 292 for a stage that holds documents past the read's memory limit.
fn over_memory(stage: &str, limit: usize) -> Error {
    Error::ExceededMemoryLimit(format!(
        "{stage} exceeded the memory limit of {limit} bytes; it holds its input in memory and does not spill to disk in duetdb"
    ))
}

/// The input of a stage that needs all of it, with its byte count.
struct Held<'p> {
    stage: &'p Stage,
    rows: Vec<Document>,
    bytes: usize,
}

/// What a holding stage outputs once its input is complete.
fn finish_held(stage: &Stage, rows: Vec<Document>, rt: &Runtime<'_>) -> Result<Vec<Document>> {
    match stage {
        Stage::BucketAuto(b) => b.run(rows, rt),
        Stage::Window(w) => w.run(rows, rt),
        Stage::Densify(d) => d.run(rows, rt),
        other => Err(Error::Internal(format!(
            "{} does not hold its input",
            other.name()
        ))),
    }
}

/// `$documents`: the expression (evaluated against no document) must be an
/// array of documents.
pub(super) fn documents_of(e: &Expr) -> Result<Vec<Document>> {
    let empty = Document::new();
    match e.eval(&Root::Doc(&empty))? {
        Some(Bson::Array(items)) => items
            .into_iter()
            .map(|v| match v {
                Bson::Document(d) => Ok(d),
                other => Err(coded!(
                    40228,
                    format!(
                        "'replacement document' must evaluate to an object, but resulting value was: {}. Type of resulting value: '{}'.",
                        crate::error::render(&other),
                        crate::doc::types::type_name(&other)
                    ),
                )),
            })
            .collect(),
        other => Err(coded!(
            5858203,
            format!(
                "an array is expected: $documents must evaluate to an array of objects, found {}",
                other
                    .as_ref()
                    .map_or_else(|| "missing".to_string(), crate::error::render)
            ),
        )),
    }
}

/// `$sample`: a uniform sample without replacement of `n` rows: each row
/// gets a random 64-bit key (the sorter's tie-breaker under an empty sort
/// spec) and the `n` smallest are kept, in key order. Keeping the `n`
/// smallest keys of every prefix of the input is what makes the spilled
/// and the in-memory answers the same distribution: a row dropped early
/// had `n` better keys already and can never be among the final `n`.
pub(super) struct Sample {
    sorter: Sorter,
    rng: StdRng,
}

impl Sample {
    fn new(n: u64, rt: &Runtime<'_>) -> Result<Sample> {
        let keep = usize::try_from(n).unwrap_or(usize::MAX);
        Ok(Sample {
            sorter: Sorter::new(
                SortSpec::parse(&Document::new())?,
                &rt.limits,
                rt.spill_dir.clone(),
                Some(keep),
            ),
            rng: StdRng::from_entropy(),
        })
    }

    fn push(&mut self, row: Row) -> Result<()> {
        let key: u64 = self.rng.gen();
        self.sorter.push_tied(row.into_docref()?, key)
    }
}
