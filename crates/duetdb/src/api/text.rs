//! Running `$text` finds and counts on a live collection or a held
//! snapshot's: the text index
//! gives the candidates (the union of its entries for the query's terms),
//! each candidate is checked against the whole query (`query::text`) and
//! the rest of the filter, and scored; `{$meta: "textScore"}` may be
//! projected and sorted on.
//!
//! Reads one published state (a copy-on-write root: consistent, whatever
//! writes run meanwhile). MongoDB's rules: `$text` at the top level of the
//! filter only, exactly one text index (else 27 IndexNotFound). A compound
//! text index is read only under equalities on all its prefix fields (else
//! 291 NoQueryExecutionPlans): per term, one key range per prefix value.

use std::cmp::Ordering;
use std::collections::BTreeSet;
use std::ops::Bound;
use std::sync::Arc;

use bson::{Bson, Document};

use crate::api::{Collection, SnapshotCollection};
use crate::doc::collation::Collator;
use crate::doc::DocRef;
use crate::error::{Error, Result};
use crate::query::aggregate::{ParseCtx, Pinned, Runtime};
use crate::query::limits::ReadLimits;
use crate::query::text::{equality_on, split, strip_text_score, TextQuery, TEXT_SCORE_FIELD};
use crate::query::{Filter, Pipeline, Projection, SortSpec};
use crate::store::collection::CollectionState;
use crate::store::heap::RecordId;
use crate::store::index::{IndexKind, KeyPart};
use crate::store::DbState;

/// Options of a `$text` find.
#[derive(Debug, Clone, Default)]
pub struct TextFindOptions {
    /// May hold `{field: {$meta: "textScore"}}` entries.
    pub projection: Option<Document>,
    /// May hold `{field: {$meta: "textScore"}}` entries (highest score first).
    pub sort: Option<Document>,
    pub skip: u64,
    /// 0: no limit.
    pub limit: u64,
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

/// Matching `(record, document, score)` of a `$text` filter on `coll`;
/// `rest_doc` is the filter without `$text` (`rest` parsed), where a
/// compound text index finds the equalities on its prefix fields.
fn matches(
    coll: &CollectionState,
    query: &TextQuery,
    rest_doc: &Document,
    rest: &Filter,
) -> Result<Vec<(RecordId, DocRef, f64)>> {
    let index = coll
        .indexes
        .iter()
        .find(|i| matches!(i.spec.kind, IndexKind::Text(_)))
        .ok_or_else(|| Error::IndexNotFound("text index required for $text query".into()))?;
    let IndexKind::Text(spec) = &index.spec.kind else {
        return Err(Error::Internal("text index without a text spec".into()));
    };
    let term_pos = index
        .spec
        .text_term_pos()
        .ok_or_else(|| Error::Internal("text index without its term field".into()))?;
    let prefixes = prefixes(&index.spec.fields[..term_pos], rest_doc)?;
    let mut rids = BTreeSet::new();
    for term in query.terms(spec)? {
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
                rids.insert(*rid);
            }
        }
    }
    let mut out = Vec::new();
    for rid in rids {
        let Some(doc) = coll.heap.get(rid) else {
            continue;
        };
        if !index.spec.holds(doc) || !rest.matches(doc) {
            continue;
        }
        if let Some(score) = query.score(spec, doc)? {
            out.push((rid, doc.clone(), score));
        }
    }
    Ok(out)
}

/// A find whose filter has a top-level `$text` on collection `name` of
/// `state` (see the module doc).
pub(super) fn find_in(
    state: &DbState,
    name: &str,
    filter: &Document,
    options: TextFindOptions,
) -> Result<Vec<Document>> {
    let (query, rest) =
        split(filter)?.ok_or_else(|| Error::BadValue("text_find needs a $text filter".into()))?;
    let rest_doc = rest;
    let rest = Filter::parse(&rest_doc)?;
    // Projection: `$meta` fields added after the rest is applied.
    let mut score_fields = Vec::new();
    let mut plain = Document::new();
    for (k, v) in options.projection.iter().flatten() {
        if is_score_meta(v)? {
            score_fields.push(k.clone());
        } else {
            plain.insert(k.clone(), v.clone());
        }
    }
    let projection = (!plain.is_empty())
        .then(|| Projection::parse(&plain))
        .transpose()?;
    // Sort: components in order, each by score or by a field.
    enum By {
        Score,
        Field(SortSpec),
    }
    let mut order = Vec::new();
    for (k, v) in options.sort.iter().flatten() {
        if is_score_meta(v)? {
            order.push(By::Score);
        } else {
            let mut one = Document::new();
            one.insert(k.clone(), v.clone());
            order.push(By::Field(SortSpec::parse(&one)?));
        }
    }
    let Some(coll) = state.collection(name) else {
        return Ok(Vec::new());
    };
    let mut found = matches(coll, &query, &rest_doc, &rest)?;
    if !order.is_empty() {
        let keyed: Vec<_> = found
            .drain(..)
            .map(|(rid, d, s)| {
                let keys: Vec<_> = order
                    .iter()
                    .map(|b| match b {
                        By::Score => None,
                        By::Field(spec) => Some(spec.sort_key(&d)),
                    })
                    .collect();
                (keys, rid, d, s)
            })
            .collect();
        let mut keyed = keyed;
        keyed.sort_by(|(ka, ra, _, sa), (kb, rb, _, sb)| {
            for (i, b) in order.iter().enumerate() {
                let o = match (b, &ka[i], &kb[i]) {
                    (By::Score, _, _) => sb.partial_cmp(sa).unwrap_or(Ordering::Equal),
                    (By::Field(spec), Some(x), Some(y)) => spec.compare_keys(x, y),
                    _ => Ordering::Equal,
                };
                if o != Ordering::Equal {
                    return o;
                }
            }
            ra.cmp(rb)
        });
        found = keyed.into_iter().map(|(_, r, d, s)| (r, d, s)).collect();
    }
    let skip = usize::try_from(options.skip).unwrap_or(usize::MAX);
    let limit = match options.limit {
        0 => usize::MAX,
        n => usize::try_from(n).unwrap_or(usize::MAX),
    };
    found
        .into_iter()
        .skip(skip)
        .take(limit)
        .map(|(_, d, score)| {
            let mut out = match &projection {
                Some(p) => p.apply(&d)?,
                None => crate::doc::to_document(&d)?,
            };
            for f in &score_fields {
                out.insert(f.clone(), score);
            }
            Ok(out)
        })
        .collect()
}

/// How many documents a filter with a top-level `$text` matches in
/// collection `name` of `state`.
pub(super) fn count_in(state: &DbState, name: &str, filter: &Document) -> Result<u64> {
    let (query, rest) =
        split(filter)?.ok_or_else(|| Error::BadValue("text_count needs a $text filter".into()))?;
    let rest_doc = rest;
    let rest = Filter::parse(&rest_doc)?;
    match state.collection(name) {
        Some(coll) => Ok(matches(coll, &query, &rest_doc, &rest)?.len() as u64),
        None => Ok(0),
    }
}

impl Collection {
    /// A find whose filter has a top-level `$text` (see the module doc), on
    /// the latest published state.
    pub fn text_find(&self, filter: &Document, options: TextFindOptions) -> Result<Vec<Document>> {
        find_in(self.db.snapshot().state(), &self.name, filter, options)
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
        crate::query::expr::under_collation(collator.as_ref(), || {
            let p = TextPipeline::parse(pipeline, let_vars, collator.clone())?;
            let snap = self.db.snapshot();
            let pinned =
                Pinned::from_state(snap.state(), &p.rest.foreign_names(), limits.cancel.clone());
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
        crate::query::expr::under_collation(collator.as_ref(), || {
            let p = TextPipeline::parse(pipeline, let_vars, collator.clone())?;
            if let Some(out) = p.rest.output() {
                return Err(Error::IllegalOperation(format!(
                    "{} cannot run on a held snapshot: it writes; run it on the live collection",
                    out.stage_name()
                )));
            }
            let pinned =
                Pinned::from_state(self.state(), &p.rest.foreign_names(), limits.cancel.clone());
            let rt = Runtime::new(&pinned, limits.clone(), limits.spill_dir_or(None));
            p.run(self.state(), self.name(), &rt)
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
        let rest = Filter::parse(&rest_doc)?;
        let docs = match state.collection(name) {
            Some(coll) => matches(coll, &query, &rest_doc, &rest)?
                .into_iter()
                .map(|(_, d, score)| {
                    let mut d = crate::doc::to_document(&d)?;
                    d.insert(TEXT_SCORE_FIELD, score);
                    Ok(d)
                })
                .collect::<Result<Vec<_>>>()?,
            None => Vec::new(),
        };
        let mut out = self.rest.run_on_with(docs, rt)?;
        out.iter_mut().for_each(strip_text_score);
        Ok(out)
    }
}
