//! The stages that are not `$group`: the per-document ones (`$match`,
//! `$project`/`$unset`, `$addFields`/`$set`, `$unwind`,
//! `$replaceRoot`/`$replaceWith`, and `$lookup`/`$graphLookup` through
//! `lookup.rs`), which map one document to zero or more independently of the
//! others, and the whole-set ones (`$sort`, `$skip`, `$limit`, `$count`, and
//! the blocking stages of the other files), which only run after the
//! commutative part.
//!
//! Owns: the document flowing through per-document stages ([`Cur`], read in
//! place until a stage rewrites it), their evaluation ([`per_document`]), the
//! in-order evaluation of any one stage ([`run_stage`]), `$addFields` with its
//! setter, `$unwind`, `$replaceRoot`/`$replaceWith` and the parsing of
//! `$sample`.
//!
//! Invariants: `$sort` is stable (ties keep their input order); a `$addFields`
//! expression sees the input document, never a field the same stage adds;
//! every document `$project`, `$addFields`/`$set` and `$unwind` output is
//! within 16 MiB (else 10334 BSONObjectTooLarge), and `$addFields` stops
//! evaluating once its new values alone pass that; nothing here panics on
//! user input.

use bson::raw::{RawDocument, RawDocumentBuf};
use bson::{Bson, Document};

use crate::doc::size::{check_document, value_len, SizeBudget};
use crate::error::{Error, Result};
use crate::query::aggregate::exec::Exec;
use crate::query::aggregate::group::GroupState;
use crate::query::aggregate::{ParseCtx, Runtime, Stage};
use crate::query::expr::{num_of, parse_field_path, type_name, Expr, Root, Value};
use crate::query::filter::Filter;
use crate::query::text::TEXT_SCORE_FIELD;

/// The document flowing through per-document stages: read in place while no
/// stage has rewritten it.
pub(super) enum Cur<'a> {
    Raw(&'a RawDocument),
    Owned(Document),
}

impl Cur<'_> {
    pub(super) fn root(&self) -> Root<'_> {
        match self {
            Cur::Raw(r) => Root::Raw(r),
            Cur::Owned(d) => Root::Doc(d),
        }
    }

    pub(super) fn into_document(self) -> Result<Document> {
        match self {
            Cur::Raw(r) => crate::doc::to_document(r),
            Cur::Owned(d) => Ok(d),
        }
    }

    fn matches(&self, filter: &Filter) -> Result<bool> {
        let m = match self {
            Cur::Raw(r) => filter.matches(r),
            Cur::Owned(d) => filter.matches(&to_raw_doc(d)?),
        };
        // An `$expr` error fails the pipeline.
        filter.check()?;
        Ok(m)
    }
}

fn to_raw_doc(d: &Document) -> Result<RawDocumentBuf> {
    RawDocumentBuf::try_from(d).map_err(|e| Error::InvalidBson(e.to_string()))
}

/// Run `stages` (all per-document) on one document, handing each output to `out`.
pub(super) fn per_document(
    stages: &[Stage],
    cur: Cur<'_>,
    rt: &Runtime<'_>,
    out: &mut dyn FnMut(Cur<'_>) -> Result<()>,
) -> Result<()> {
    let mut cur = cur;
    for (i, stage) in stages.iter().enumerate() {
        cur = match stage {
            Stage::Match { filter, .. } => {
                if !cur.matches(filter)? {
                    return Ok(());
                }
                cur
            }
            // An exclusion (`$unset`) only shrinks its input.
            Stage::Unset(p) => Cur::Owned(p.apply_to(&cur.root())?),
            Stage::Project(p) => Cur::Owned(checked("$project", p.apply_to(&cur.root())?)?),
            Stage::AddFields(fields) => {
                Cur::Owned(checked(stage.name(), add_fields(fields, cur)?)?)
            }
            Stage::Unwind(u) => {
                let doc = cur.into_document()?;
                for d in u.apply(doc)? {
                    per_document(
                        &stages[i + 1..],
                        Cur::Owned(checked("$unwind", d)?),
                        rt,
                        out,
                    )?;
                }
                return Ok(());
            }
            Stage::ReplaceRoot { expr, with } => Cur::Owned(replace_root(expr, *with, &cur)?),
            Stage::Lookup(l) => Cur::Owned(l.apply(cur, rt)?),
            Stage::GraphLookup(g) => Cur::Owned(g.apply(cur, rt)?),
            Stage::GeoNear(g) => Cur::Owned(checked("$geoNear", g.apply(cur)?)?),
            Stage::Redact(r) => match r.apply(&cur.into_document()?)? {
                Some(d) => Cur::Owned(d),
                None => return Ok(()),
            },
            other => {
                return Err(Error::Internal(format!(
                    "{} is not a per-document stage",
                    other.name()
                )))
            }
        };
    }
    out(cur)
}

/// A stage's output document, refused (10334) past 16 MiB: no document larger
/// than a stored one ever leaves a stage.
fn checked(stage: &'static str, d: Document) -> Result<Document> {
    check_document(stage, &d)?;
    Ok(d)
}

/// Evaluate one stage on materialized documents, in order (the reference
/// evaluation). The stages of the other files run as a one-stage [`Exec`].
pub(super) fn run_stage(
    stage: &Stage,
    docs: Vec<Document>,
    rt: &Runtime<'_>,
) -> Result<Vec<Document>> {
    Ok(match stage {
        s if s.is_per_document() => {
            let mut out = Vec::new();
            let stages = std::slice::from_ref(stage);
            for d in docs {
                per_document(stages, Cur::Owned(d), rt, &mut |c| {
                    out.push(c.into_document()?);
                    Ok(())
                })?;
            }
            out
        }
        Stage::Group(g) => {
            let mut gs = GroupState::default();
            for d in &docs {
                g.accumulate(&mut gs, Root::Doc(d))?;
            }
            g.finish(gs)?
        }
        Stage::Sort(spec) => {
            let mut keyed = docs
                .into_iter()
                .map(|d| Ok((spec.sort_key(&to_raw_doc(&d)?), d)))
                .collect::<Result<Vec<_>>>()?;
            // Stable: ties keep their input order.
            keyed.sort_by(|(a, _), (b, _)| spec.compare_keys(a, b));
            keyed.into_iter().map(|(_, d)| d).collect()
        }
        Stage::Limit(n) => {
            let mut docs = docs;
            docs.truncate(usize::try_from(*n).unwrap_or(usize::MAX));
            docs
        }
        Stage::Skip(n) => {
            let mut docs = docs;
            let n = usize::try_from(*n).unwrap_or(usize::MAX).min(docs.len());
            docs.drain(..n);
            docs
        }
        Stage::Count(field) => {
            if docs.is_empty() {
                Vec::new()
            } else {
                let n = docs.len() as i64;
                let v = i32::try_from(n).map(Bson::Int32).unwrap_or(Bson::Int64(n));
                vec![bson::doc! {field.as_str(): v}]
            }
        }
        _ => {
            let mut exec = Exec::new(std::slice::from_ref(stage), None, &[], rt);
            for d in docs {
                if exec.push_document(d)?.is_break() {
                    break;
                }
            }
            exec.finish()?
        }
    })
}

// ---------------------------------------------------------------- $replaceRoot

/// `$replaceRoot: {newRoot: <expr>}`.
pub(super) fn parse_replace_root(arg: &Bson, ctx: &ParseCtx) -> Result<Stage> {
    let Bson::Document(d) = arg else {
        return Err(coded!(
            40229,
            format!(
                "expected an object as specification for $replaceRoot stage, got {}",
                type_name(&Some(arg.clone()))
            ),
        ));
    };
    let mut new_root = None;
    for (k, v) in d {
        match k.as_str() {
            "newRoot" => new_root = Some(ctx.expr(v)?),
            other => {
                return Err(coded!(
                    40415,
                    format!("BSON field '$replaceRoot.{other}' is an unknown field."),
                ))
            }
        }
    }
    let expr = new_root.ok_or_else(|| {
        coded!(
            40414,
            "BSON field '$replaceRoot.newRoot' is missing but a required field",
        )
    })?;
    Ok(Stage::ReplaceRoot { expr, with: false })
}

/// The new root: the expression's value, which must be a document (40228).
fn replace_root(expr: &Expr, with: bool, cur: &Cur<'_>) -> Result<Document> {
    match expr.eval(&cur.root())? {
        Some(Bson::Document(mut d)) => {
            // A text match's score is metadata: the new root keeps it.
            let score = Expr::Root(vec![TEXT_SCORE_FIELD.to_string()]);
            if let Some(s) = score.eval(&cur.root())? {
                d.insert(TEXT_SCORE_FIELD, s);
            }
            Ok(d)
        }
        other => {
            let what = if with {
                "'replacement document'"
            } else {
                "'newRoot' expression "
            };
            Err(coded!(
                40228,
                format!(
                    "{what} must evaluate to an object, but resulting value was: {}. Type of resulting value: '{}'. Input document: {}",
                    other
                        .as_ref()
                        .map_or_else(|| "MISSING".to_string(), crate::error::render_value),
                    type_name(&other),
                    crate::error::render_value(&cur.root().whole()?),
                ),
            ))
        }
    }
}

// ---------------------------------------------------------------- $sample

/// `$sample: {size: <n>}` (codes of MongoDB's `document_source_sample.cpp`).
pub(super) fn parse_sample(arg: &Bson) -> Result<Stage> {
    let Bson::Document(d) = arg else {
        return Err(coded!(
            28745,
            "the $sample stage specification must be an object",
        ));
    };
    let mut size = None;
    for (k, v) in d {
        match k.as_str() {
            "size" => {
                let n = match num_of(v) {
                    Some(n) => n.to_f64(),
                    None => return Err(coded!(28746, "size argument to $sample must be a number")),
                };
                if n < 0.0 {
                    return Err(coded!(
                        28747,
                        "size argument to $sample must not be negative",
                    ));
                }
                size = Some(if n >= u64::MAX as f64 {
                    u64::MAX
                } else {
                    n as u64
                });
            }
            other => {
                return Err(coded!(
                    28748,
                    format!("unrecognized option to $sample: {other}"),
                ))
            }
        }
    }
    let n = size.ok_or_else(|| coded!(28749, "$sample stage must specify a size"))?;
    Ok(Stage::Sample(n))
}

// ---------------------------------------------------------------- $addFields

fn add_fields(fields: &[(Vec<String>, Expr)], cur: Cur<'_>) -> Result<Document> {
    // Every expression sees the input document, not fields added by this stage.
    // The new values all end up in the output (paths do not overlap), so
    // together they must fit in a document: stop as soon as they do not.
    let mut size = SizeBudget::new("$addFields");
    let mut values = Vec::with_capacity(fields.len());
    for (path, e) in fields {
        let v: Value = e.eval(&cur.root())?;
        if let Some(v) = &v {
            size.add(path.iter().map(|p| p.len() + 7).sum::<usize>() + value_len(v))?;
        }
        values.push(v);
    }
    let mut doc = cur.into_document()?;
    for ((path, _), v) in fields.iter().zip(values) {
        set_mapping_arrays(&mut doc, path, v);
    }
    Ok(doc)
}

/// Aggregation's setter (`$addFields`, `$unwind`): set (or, for missing,
/// remove) `path`; existing fields keep their position; an array on the way
/// gets the field in each of its elements, and a scalar on the way (or in such
/// an array) becomes a document holding just the field. This is not update's
/// rule (update's `$set` addresses array elements by index and refuses to
/// traverse a scalar), which is why it stays private to the pipeline.
pub(super) fn set_mapping_arrays(doc: &mut Document, path: &[String], v: Value) {
    let Some((first, rest)) = path.split_first() else {
        return;
    };
    if rest.is_empty() {
        match v {
            Some(v) => {
                doc.insert(first.clone(), v);
            }
            None => {
                doc.remove(first);
            }
        }
        return;
    }
    match doc.get_mut(first) {
        Some(Bson::Document(d)) => set_mapping_arrays(d, rest, v),
        Some(Bson::Array(a)) => set_in_each_element(a, rest, &v),
        _ => {
            if v.is_some() {
                let mut d = Document::new();
                set_mapping_arrays(&mut d, rest, v);
                doc.insert(first.clone(), d);
            }
        }
    }
}

/// [`set_mapping_arrays`] below an array: in every element, nested arrays included.
fn set_in_each_element(a: &mut [Bson], rest: &[String], v: &Value) {
    for e in a.iter_mut() {
        match e {
            Bson::Document(d) => set_mapping_arrays(d, rest, v.clone()),
            Bson::Array(inner) => set_in_each_element(inner, rest, v),
            other => {
                let mut d = Document::new();
                set_mapping_arrays(&mut d, rest, v.clone());
                *other = Bson::Document(d);
            }
        }
    }
}

// ---------------------------------------------------------------- $unwind

#[derive(Debug, Clone)]
pub(super) struct Unwind {
    path: Vec<String>,
    include_index: Option<Vec<String>>,
    preserve: bool,
}

impl Unwind {
    pub(super) fn parse(arg: &Bson) -> Result<Unwind> {
        let path_of = |v: &Bson| -> Result<Vec<String>> {
            match v {
                Bson::String(s) if s.starts_with('$') => parse_field_path(&s[1..]),
                Bson::String(s) => Err(coded!(
                    28818,
                    format!("path option to $unwind stage should be prefixed with a '$': {s}")
                )),
                _ => Err(Error::bad_value(
                    "expected a string as the path for $unwind stage",
                )),
            }
        };
        match arg {
            Bson::String(_) => Ok(Unwind {
                path: path_of(arg)?,
                include_index: None,
                preserve: false,
            }),
            Bson::Document(d) => {
                let mut u = Unwind {
                    path: Vec::new(),
                    include_index: None,
                    preserve: false,
                };
                for (k, v) in d {
                    match (k.as_str(), v) {
                        ("path", _) => u.path = path_of(v)?,
                        ("preserveNullAndEmptyArrays", Bson::Boolean(b)) => u.preserve = *b,
                        ("preserveNullAndEmptyArrays", _) => {
                            return Err(Error::bad_value(
                                "expected a boolean for the preserveNullAndEmptyArrays option to $unwind stage",
                            ))
                        }
                        ("includeArrayIndex", Bson::String(s)) if !s.starts_with('$') && !s.is_empty() => {
                            u.include_index = Some(parse_field_path(s)?)
                        }
                        ("includeArrayIndex", _) => {
                            return Err(Error::bad_value(
                                "includeArrayIndex option to $unwind stage should be a non-empty string not prefixed with '$'",
                            ))
                        }
                        (other, _) => {
                            return Err(coded!(
                                28811,
                                format!("unrecognized option to $unwind stage: {other}")
                            ))
                        }
                    }
                }
                if u.path.is_empty() {
                    return Err(Error::bad_value("no path specified to $unwind stage"));
                }
                Ok(u)
            }
            other => Err(coded!(
                15981,
                format!(
                    "expected either a string or an object as specification for $unwind stage, got {}",
                    type_name(&Some(other.clone()))
                )
            )),
        }
    }

    fn apply(&self, doc: Document) -> Result<Vec<Document>> {
        let value = Root::Doc(&doc).get(&self.path)?;
        let with = |mut d: Document, v: Value, idx: Option<i64>| -> Document {
            set_mapping_arrays(&mut d, &self.path, v);
            if let Some(ip) = &self.include_index {
                set_mapping_arrays(&mut d, ip, Some(idx.map(Bson::Int64).unwrap_or(Bson::Null)));
            }
            d
        };
        // `$unwind` reads the path through documents only (no array mapping).
        let value = if plain_path_exists(&doc, &self.path) {
            value
        } else {
            None
        };
        Ok(match value {
            Some(Bson::Array(items)) if !items.is_empty() => items
                .into_iter()
                .enumerate()
                .map(|(i, v)| with(doc.clone(), Some(v), Some(i as i64)))
                .collect(),
            Some(Bson::Array(_)) if self.preserve => vec![with(doc, None, None)],
            Some(Bson::Null) | None if self.preserve => {
                let v = value;
                vec![with(doc, v, None)]
            }
            Some(Bson::Array(_)) | Some(Bson::Null) | None => Vec::new(),
            Some(other) => vec![with(doc, Some(other), None)],
        })
    }
}

fn plain_path_exists(doc: &Document, path: &[String]) -> bool {
    let Some((first, rest)) = path.split_first() else {
        return true;
    };
    match (doc.get(first), rest.is_empty()) {
        (Some(_), true) => true,
        (Some(Bson::Document(d)), false) => plain_path_exists(d, rest),
        _ => false,
    }
}
