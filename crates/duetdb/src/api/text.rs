//! Running `$text` finds, counts and aggregates on a live collection, a
//! held snapshot's or a transaction's: the text index gives the candidates
//! (the union of its entries for the query's terms), each candidate is
//! checked against the whole query (`query::text`) and the rest of the
//! filter, and scored; `{$meta: "textScore"}` may be projected and sorted
//! on.
//!
//! Reads one published state (a copy-on-write root: consistent, whatever
//! writes run meanwhile). MongoDB's rules: `$text` at the top level of the
//! filter only, exactly one text index (else 27 IndexNotFound). A compound
//! text index is read only under equalities on all its prefix fields (else
//! 291 NoQueryExecutionPlans): per term, one key range per prefix value.
//!
//! Memory (issue #18): what is held is bounded as in any read. The matches
//! are pulled one at a time ([`Matches`]: the candidates' record ids, never
//! their documents); a find is a [`TextStream`] (lazy without a sort; a sort
//! goes through a [`Sorter`] under the read's memory limit: top-k, spilled
//! runs, or 292); an aggregate pushes each match through the other stages'
//! [`Exec`](crate::query::aggregate::Exec) (`$limit` stops the scan,
//! blocking stages are bounded there).

use std::ops::Bound;
use std::path::PathBuf;
use std::sync::Arc;

use bson::{Bson, Document};

use crate::api::{Collection, SnapshotCollection};
use crate::doc::collation::Collator;
use crate::doc::DocRef;
use crate::error::{CancelToken, Error, Result};
use crate::query::aggregate::{ParseCtx, Pinned, Runtime};
use crate::query::limits::{ReadLimits, PAGE_DOCS};
use crate::query::sorter::{SortedStream, Sorter};
use crate::query::text::{equality_on, split, strip_text_score, TextQuery, TEXT_SCORE_FIELD};
use crate::query::{Filter, Pipeline, Projection, SortSpec};
use crate::store::collection::CollectionState;
use crate::store::heap::RecordId;
use crate::store::index::{IndexKind, IndexSpec, KeyPart};
use crate::store::text::TextSpec;
use crate::store::DbState;

/// Options of a `$text` find.
#[derive(Debug, Clone, Default)]
pub struct TextFindOptions {
    /// A find projection; `{$meta: "textScore"}` reads the match's score.
    pub projection: Option<Document>,
    /// May hold `{field: {$meta: "textScore"}}` entries (highest score first).
    pub sort: Option<Document>,
    pub skip: u64,
    /// 0: no limit.
    pub limit: u64,
    /// The command's `let` variables (the projection's expressions may use them).
    pub let_vars: Option<Document>,
}

fn is_score_meta(v: &Bson) -> Result<bool> {
    match v {
        Bson::Document(d) if d.contains_key("$meta") => match d.get("$meta") {
            Some(Bson::String(s)) if s == "textScore" && d.len() == 1 => Ok(true),
            _ => Err(Error::BadValue(format!(
                "unsupported $meta: {d} (only {{$meta: \"textScore\"}})"
            ))),
        },
        _ => Ok(false),
    }
}

/// The error MongoDB's planner gives for a `$text` query that cannot use the
/// text index (a compound one without equalities on all its prefix fields).
fn no_text_plan() -> Error {
    Error::Coded {
        code: 291,
        name: "NoQueryExecutionPlans",
        msg: "error processing query: planner returned error :: caused by :: failed to use text index to satisfy $text query (if text index is compound, are equality predicates given for all prefix fields?)".into(),
    }
}

/// The key prefixes to read for each query term: one per combination of
/// the prefix fields' equality values (a `null` equality also reads
/// `undefined`, which it matches too). Empty prefix: one empty prefix.
fn prefixes(fields: &[(String, bool)], rest_doc: &Document) -> Result<Vec<Vec<KeyPart>>> {
    let mut out: Vec<Vec<KeyPart>> = vec![Vec::new()];
    for (path, _) in fields {
        let v = equality_on(rest_doc, path).ok_or_else(no_text_plan)?;
        let raw = bson::RawBson::try_from(v)
            .map_err(|e| Error::BadValue(format!("equality on '{path}': {e}")))?;
        let mut vals = vec![raw];
        if matches!(vals[0], bson::RawBson::Null) {
            vals.push(bson::RawBson::Undefined);
        }
        out = out
            .into_iter()
            .flat_map(|p| {
                vals.iter().map(move |v| {
                    let mut p = p.clone();
                    p.push(KeyPart::Val(v.clone()));
                    p
                })
            })
            .collect();
    }
    Ok(out)
}

/// The matches of a `$text` filter on one held collection version, produced
/// on demand in record order: what every `$text` read (find, count, the
/// first stage of an aggregate) pulls from.
///
/// Holds the version (shared nodes, never copied) and the candidates'
/// record ids (the union of the text index's entries for the query's terms,
/// deduplicated, as MongoDB's TEXT_OR stage keeps its record ids): 8 bytes
/// a candidate, never a document. Each candidate is fetched, checked against
/// the whole text query and the rest of the filter, and scored when it is
/// pulled.
struct Matches {
    coll: Box<CollectionState>,
    spec: IndexSpec,
    text: TextSpec,
    query: TextQuery,
    rest: Filter,
    rids: std::vec::IntoIter<RecordId>,
    cancel: CancelToken,
    pulled: usize,
}

impl Matches {
    /// The candidates of `query` in `coll`; `rest_doc` is the filter without
    /// `$text` (`rest` parsed), where a compound text index finds the
    /// equalities on its prefix fields.
    fn open(
        coll: &CollectionState,
        query: TextQuery,
        rest_doc: &Document,
        rest: Filter,
        cancel: CancelToken,
    ) -> Result<Matches> {
        let index = coll
            .indexes
            .iter()
            .find(|i| matches!(i.spec.kind, IndexKind::Text(_)))
            .ok_or_else(|| Error::Coded {
                code: 27,
                name: "IndexNotFound",
                msg: "text index required for $text query".into(),
            })?;
        let IndexKind::Text(text) = &index.spec.kind else {
            return Err(Error::Internal("text index without a text spec".into()));
        };
        let term_pos = index
            .spec
            .text_term_pos()
            .ok_or_else(|| Error::Internal("text index without its term field".into()))?;
        let prefixes = prefixes(&index.spec.fields[..term_pos], rest_doc)?;
        // One range per (term, prefix): each in record order only within
        // one key, so the union is sorted and deduplicated at the end.
        let mut rids: Vec<RecordId> = Vec::new();
        let mut entries = 0usize;
        for term in query.terms(text)? {
            for prefix in &prefixes {
                let mut parts = prefix.clone();
                parts.push(KeyPart::Val(bson::RawBson::String(term.clone())));
                // Every suffix value lies between the Low and High fills.
                let lo = (
                    index.spec.bound_key(parts.clone(), KeyPart::Low),
                    RecordId::MIN,
                );
                let hi = (index.spec.bound_key(parts, KeyPart::High), RecordId::MAX);
                for ((_, rid), _) in index.range(Bound::Included(&lo), Bound::Included(&hi)) {
                    rids.push(*rid);
                    entries += 1;
                    if entries.is_multiple_of(PAGE_DOCS) {
                        cancel.check()?;
                    }
                }
            }
        }
        rids.sort_unstable();
        rids.dedup();
        Ok(Matches {
            coll: Box::new(coll.clone()),
            spec: IndexSpec::clone(&index.spec),
            text: TextSpec::clone(text),
            query,
            rest,
            rids: rids.into_iter(),
            cancel,
            pulled: 0,
        })
    }

    /// The next match: its record, document and score.
    fn next(&mut self) -> Result<Option<(RecordId, DocRef, f64)>> {
        for rid in self.rids.by_ref() {
            self.pulled += 1;
            if self.pulled.is_multiple_of(PAGE_DOCS) {
                self.cancel.check()?;
            }
            let Some(doc) = self.coll.heap.get(rid) else {
                continue;
            };
            if !self.spec.holds(doc) || !self.rest.matches(doc) {
                continue;
            }
            if let Some(score) = self.query.score(&self.text, doc)? {
                return Ok(Some((rid, doc.clone(), score)));
            }
        }
        Ok(None)
    }

    /// Bytes held: the candidates not yet pulled.
    fn held_bytes(&self) -> usize {
        self.rids.len() * std::mem::size_of::<RecordId>()
    }
}

/// `doc` with its score as the hidden [`TEXT_SCORE_FIELD`] (a copy: what a
/// sort or a pipeline stage reads the score from).
fn scored(doc: &DocRef, score: f64) -> Result<DocRef> {
    let key = <&bson::raw::CStr>::try_from(TEXT_SCORE_FIELD)
        .map_err(|e| Error::Internal(format!("text score field name: {e}")))?;
    let mut buf = bson::RawDocumentBuf::clone(doc);
    buf.append(key, score);
    Ok(Arc::new(buf))
}

/// Where a [`TextStream`]'s documents come from.
enum Kind {
    /// The matches in record order, pulled as asked for.
    Scan(Box<Matches>),
    /// A sort's output (top-k, in memory, or merged from spilled runs);
    /// documents carry their score as [`TEXT_SCORE_FIELD`].
    Sorted(SortedStream),
    Done,
}

/// The documents of a `$text` find, produced on demand with skip, limit and
/// projection applied (`{$meta: "textScore"}` fields filled in):
/// `Iterator<Item = Result<Document>> + Send + 'static`, so a server cursor
/// can keep it between `getMore`s. Without a sort it holds the candidates'
/// record ids and a position; with one, what the [`Sorter`] holds (at most
/// the read's memory limit, then spilled runs, or 292 without disk use; a
/// top-k heap of `skip + limit` documents under a limit), as a find's sort.
pub struct TextStream {
    kind: Kind,
    projection: Option<Projection>,
    skip: u64,
    /// Documents still to yield (`None`: no limit).
    left: Option<u64>,
    spilled_runs: u64,
    failed: bool,
}

impl std::fmt::Debug for TextStream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TextStream")
            .field("held_bytes", &self.held_bytes())
            .field("spilled_runs", &self.spilled_runs)
            .finish()
    }
}

impl TextStream {
    fn empty() -> TextStream {
        TextStream {
            kind: Kind::Done,
            projection: None,
            skip: 0,
            left: None,
            spilled_runs: 0,
            failed: false,
        }
    }

    /// Bytes this stream holds itself: the candidates' record ids not yet
    /// read, or the sort's in-memory part. Not the collection version it
    /// reads, whose nodes and documents are shared with the database.
    pub fn held_bytes(&self) -> usize {
        match &self.kind {
            Kind::Scan(m) => m.held_bytes(),
            Kind::Sorted(s) => s.held_bytes(),
            Kind::Done => 0,
        }
    }

    /// Sorted runs the read spilled to disk (0 when the sort fit in memory).
    pub fn spilled_runs(&self) -> u64 {
        self.spilled_runs
    }

    /// Was the result sorted (and so already computed, not streamed)?
    pub fn ran_sort(&self) -> bool {
        matches!(self.kind, Kind::Sorted(_))
    }

    /// Check `token` from now on (each `getMore` runs under its own token).
    pub fn set_cancel(&mut self, token: CancelToken) {
        match &mut self.kind {
            Kind::Scan(m) => m.cancel = token,
            Kind::Sorted(s) => s.set_cancel(token),
            Kind::Done => {}
        }
    }

    /// The next match (before skip/limit) and its score.
    fn next_match(&mut self) -> Result<Option<(DocRef, f64)>> {
        match &mut self.kind {
            Kind::Scan(m) => Ok(m.next()?.map(|(_, d, s)| (d, s))),
            Kind::Sorted(s) => match s.next().transpose()? {
                None => Ok(None),
                Some(d) => {
                    let mut doc = crate::doc::to_document(&d)?;
                    let score = match doc.remove(TEXT_SCORE_FIELD) {
                        Some(Bson::Double(s)) => s,
                        _ => {
                            return Err(Error::Internal(
                                "a sorted text match lost its score".into(),
                            ))
                        }
                    };
                    let raw = bson::RawDocumentBuf::try_from(&doc)
                        .map_err(|e| Error::InvalidBson(e.to_string()))?;
                    Ok(Some((Arc::new(raw), score)))
                }
            },
            Kind::Done => Ok(None),
        }
    }

    fn step(&mut self) -> Result<Option<Document>> {
        if self.left == Some(0) {
            return Ok(None);
        }
        while self.skip > 0 {
            if self.next_match()?.is_none() {
                return Ok(None);
            }
            self.skip -= 1;
        }
        let Some((d, score)) = self.next_match()? else {
            return Ok(None);
        };
        if let Some(n) = &mut self.left {
            *n -= 1;
        }
        Ok(Some(match &self.projection {
            // `{$meta: "textScore"}` reads the hidden score field, as in a
            // pipeline; it never reaches the result.
            Some(p) if p.reads_text_score() => {
                let mut out = p.apply(&scored(&d, score)?)?;
                out.remove(TEXT_SCORE_FIELD);
                out
            }
            Some(p) => p.apply(&d)?,
            None => crate::doc::to_document(&d)?,
        }))
    }
}

impl Iterator for TextStream {
    type Item = Result<Document>;

    fn next(&mut self) -> Option<Result<Document>> {
        if self.failed {
            return None;
        }
        match self.step() {
            Ok(Some(d)) => Some(Ok(d)),
            Ok(None) => {
                self.kind = Kind::Done;
                None
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
    assert_send_static::<TextStream>();
};

/// A find whose filter has a top-level `$text` on collection `name` of
/// `state` (see the module doc), under `limits` (a sort spills to
/// `spill_dir` when allowed).
pub(super) fn stream_in(
    state: &DbState,
    name: &str,
    filter: &Document,
    options: TextFindOptions,
    limits: &ReadLimits,
    spill_dir: Option<PathBuf>,
) -> Result<TextStream> {
    let (query, rest) =
        split(filter)?.ok_or_else(|| Error::BadValue("text_find needs a $text filter".into()))?;
    let rest_doc = rest;
    let rest = crate::query::expr::under_read_time(state.ts, || Filter::parse(&rest_doc))?;
    // Projection: `{$meta: "textScore"}` reads the match's score.
    let projection = options
        .projection
        .as_ref()
        .filter(|p| !p.is_empty())
        .map(|p| {
            crate::query::expr::under_read_time(state.ts, || {
                Projection::parse_text_find(p, &rest_doc, options.let_vars.as_ref())
            })
        })
        .transpose()?;
    // Sort: components in order, each by score (highest first, the hidden
    // field a pipeline's `$sort` reads) or by a field.
    let sort = match &options.sort {
        Some(s) if !s.is_empty() => {
            for v in s.values() {
                is_score_meta(v)?;
            }
            Some(SortSpec::parse_in_pipeline(s)?)
        }
        _ => None,
    };
    let Some(coll) = state.collection(name) else {
        return Ok(TextStream::empty());
    };
    let mut matches = Matches::open(coll, query, &rest_doc, rest, limits.cancel.clone())?;
    let (kind, spilled_runs) = match sort {
        None => (Kind::Scan(Box::new(matches)), 0),
        Some(sort) => {
            // A limit keeps only the first `skip + limit` (top-k).
            let keep = (options.limit > 0).then(|| {
                usize::try_from(options.skip.saturating_add(options.limit)).unwrap_or(usize::MAX)
            });
            let mut sorter = Sorter::new(sort, limits, limits.spill_dir_or(spill_dir), keep);
            // Ties in record order, as before any spill.
            while let Some((rid, d, score)) = matches.next()? {
                sorter.push_tied(scored(&d, score)?, rid)?;
            }
            let sorted = sorter.finish()?;
            let runs = sorted.spilled_runs();
            (Kind::Sorted(sorted), runs)
        }
    };
    Ok(TextStream {
        kind,
        projection,
        skip: options.skip,
        left: (options.limit > 0).then_some(options.limit),
        spilled_runs,
        failed: false,
    })
}

/// [`stream_in`] collected under the default limits.
pub(super) fn find_in(
    state: &DbState,
    name: &str,
    filter: &Document,
    options: TextFindOptions,
) -> Result<Vec<Document>> {
    stream_in(state, name, filter, options, &ReadLimits::default(), None)?.collect()
}

/// How many documents a filter with a top-level `$text` matches in
/// collection `name` of `state` (counted as they are pulled: none held).
pub(super) fn count_in(state: &DbState, name: &str, filter: &Document) -> Result<u64> {
    let (query, rest) =
        split(filter)?.ok_or_else(|| Error::BadValue("text_count needs a $text filter".into()))?;
    let rest_doc = rest;
    let rest = crate::query::expr::under_read_time(state.ts, || Filter::parse(&rest_doc))?;
    let Some(coll) = state.collection(name) else {
        return Ok(0);
    };
    let mut matches = Matches::open(coll, query, &rest_doc, rest, CancelToken::never())?;
    let mut n = 0u64;
    while matches.next()?.is_some() {
        n += 1;
    }
    Ok(n)
}

impl Collection {
    /// A find whose filter has a top-level `$text` (see the module doc), on
    /// the latest published state.
    pub fn text_find(&self, filter: &Document, options: TextFindOptions) -> Result<Vec<Document>> {
        find_in(self.db.snapshot().state(), &self.name, filter, options)
    }

    /// [`Collection::text_find`] as a stream under `limits` (see
    /// [`TextStream`]): it holds the collection version it reads.
    pub fn text_find_stream(
        &self,
        filter: &Document,
        options: TextFindOptions,
        limits: &ReadLimits,
    ) -> Result<TextStream> {
        let spill = self.database().spill_dir();
        stream_in(
            self.db.snapshot().state(),
            &self.name,
            filter,
            options,
            limits,
            spill,
        )
    }

    /// A pipeline whose first stage is `{$match: {$text: …}}` on the latest
    /// published state: the text matches (with their score), then the other
    /// stages under `limits`, the command's `let` and the collection's
    /// collation, their `$lookup`s reading the same state. A final
    /// `$out`/`$merge` writes into `out_db` (`None`: this database) and
    /// returns nothing.
    pub fn text_aggregate(
        &self,
        pipeline: &[Document],
        limits: &ReadLimits,
        let_vars: Option<&Document>,
        out_db: Option<&crate::api::Database>,
    ) -> Result<Vec<Document>> {
        let collator = self.collator()?;
        let snap = self.db.snapshot();
        crate::query::expr::under_read_time(snap.state().ts, || {
            crate::query::expr::under_collation(collator.as_ref(), || {
                let p = TextPipeline::parse(pipeline, let_vars, collator.clone())?;
                let pinned = Pinned::from_state(
                    snap.state(),
                    &p.rest.foreign_names(),
                    limits.cancel.clone(),
                );
                let spill = limits.spill_dir_or(self.database().spill_dir());
                let rt = Runtime::new(&pinned, limits.clone(), spill);
                let docs = p.run(snap.state(), &self.name, &rt)?;
                match p.rest.output() {
                    Some(out) => {
                        out_db.unwrap_or(self.database()).write_output(out, docs)?;
                        Ok(Vec::new())
                    }
                    None => Ok(docs),
                }
            })
        })
    }

    /// How many documents a filter with a top-level `$text` matches.
    pub fn text_count(&self, filter: &Document) -> Result<u64> {
        count_in(self.db.snapshot().state(), &self.name, filter)
    }
}

impl SnapshotCollection {
    /// [`Collection::text_find`] as of this snapshot.
    pub fn text_find(&self, filter: &Document, options: TextFindOptions) -> Result<Vec<Document>> {
        find_in(self.state(), self.name(), filter, options)
    }

    /// [`Collection::text_find_stream`] as of this snapshot.
    pub fn text_find_stream(
        &self,
        filter: &Document,
        options: TextFindOptions,
        limits: &ReadLimits,
    ) -> Result<TextStream> {
        stream_in(self.state(), self.name(), filter, options, limits, None)
    }

    /// [`Collection::text_count`] as of this snapshot.
    pub fn text_count(&self, filter: &Document) -> Result<u64> {
        count_in(self.state(), self.name(), filter)
    }

    /// [`Collection::text_aggregate`] as of this snapshot; its `$lookup`s
    /// read the same snapshot. A held snapshot cannot write: `$out`/`$merge`
    /// are refused.
    pub fn text_aggregate(
        &self,
        pipeline: &[Document],
        limits: &ReadLimits,
        let_vars: Option<&Document>,
    ) -> Result<Vec<Document>> {
        let collator = self.collator()?;
        crate::query::expr::under_read_time(self.state().ts, || {
            crate::query::expr::under_collation(collator.as_ref(), || {
                let p = TextPipeline::parse(pipeline, let_vars, collator.clone())?;
                if let Some(out) = p.rest.output() {
                    return Err(Error::IllegalOperation(format!(
                    "{} cannot run on a held snapshot: it writes; run it on the live collection",
                    out.stage_name()
                )));
                }
                let pinned = Pinned::from_state(
                    self.state(),
                    &p.rest.foreign_names(),
                    limits.cancel.clone(),
                );
                let rt = Runtime::new(&pinned, limits.clone(), limits.spill_dir_or(None));
                p.run(self.state(), self.name(), &rt)
            })
        })
    }
}

/// A pipeline whose first stage is `{$match: {$text: …}}`, parsed: that
/// filter, and the other stages, whose documents carry the match's score
/// (`query::text`'s module doc).
pub(super) struct TextPipeline {
    first: Document,
    pub(super) rest: Pipeline,
}

impl TextPipeline {
    pub(super) fn parse(
        pipeline: &[Document],
        let_vars: Option<&Document>,
        collator: Option<Arc<Collator>>,
    ) -> Result<TextPipeline> {
        let Some(Ok(first)) = pipeline.first().map(|s| s.get_document("$match")) else {
            return Err(Error::BadValue(
                "$text is only allowed in the first $match stage".into(),
            ));
        };
        let ctx = ParseCtx::new(let_vars)?
            .with_collation(collator)
            .with_text_score();
        Ok(TextPipeline {
            first: first.clone(),
            rest: Pipeline::parse_in(&pipeline[1..], &ctx)?,
        })
    }

    /// The text matches in collection `name` of `state`, each with its
    /// score, through the other stages under `rt`; the score taken out of
    /// what comes back.
    pub(super) fn run(
        &self,
        state: &DbState,
        name: &str,
        rt: &Runtime<'_>,
    ) -> Result<Vec<Document>> {
        let (query, rest_doc) = split(&self.first)?.ok_or_else(|| {
            Error::BadValue("$text is only allowed in the first $match stage".into())
        })?;
        let rest = crate::query::expr::under_read_time(state.ts, || Filter::parse(&rest_doc))?;
        let Some(coll) = state.collection(name) else {
            let mut out = self.rest.run_on_with(Vec::new(), rt)?;
            out.iter_mut().for_each(strip_text_score);
            return Ok(out);
        };
        // The matches are pushed one at a time through the other stages
        // (`query::aggregate::exec`): per-document stages and `$limit` hold
        // nothing (a `$limit` ends the scan), blocking ones hold what they
        // must under the read's memory limit (a `$sort` on the score spills
        // or fails with 292 as any `$sort`).
        let mut matches = Matches::open(coll, query, &rest_doc, rest, rt.limits.cancel.clone())?;
        let mut exec = self.rest.exec(rt);
        while let Some((_, d, score)) = matches.next()? {
            if exec.push_doc(&scored(&d, score)?)?.is_break() {
                break;
            }
        }
        let mut out = exec.finish()?;
        out.iter_mut().for_each(strip_text_score);
        Ok(out)
    }
}
