//! The stages that read another collection of the same database:
//! `$lookup` (equality form, `let` + `pipeline` form, both combined as in
//! MongoDB 5+), `$graphLookup` and `$unionWith`, and the sub-pipelines they
//! run there ([`run_sub`]).
//!
//! Owns: the three stage specs, their parsing (MongoDB's codes from
//! `document_source_lookup.cpp`, `_graph_lookup.cpp`, `_union_with.cpp`),
//! the join filter built from an input document, and the per-document
//! evaluation.
//!
//! Every read goes through the [`Runtime`]'s [`Foreign`](super::Foreign)
//! resolver, which holds the other collections as of the pipeline's one
//! snapshot; nothing here names a database or a state.
//!
//! Invariants:
//! - a sub-pipeline that uses none of its `$lookup`'s `let` variables (and
//!   has no `localField`) is *uncorrelated*: it is run once per execution and
//!   its result reused ([`Runtime`]'s cache); a correlated one is re-parsed
//!   per input document with the variables bound to that document's values;
//! - the join filter of the equality form is MongoDB's: one `$eq`, an `$in`
//!   of every value at `localField` (arrays expanded), or an `$or` of `$eq`s
//!   when a value is a regex (which `$in` would pattern-match); missing is
//!   null;
//! - a `$lookup`'s matches together are bounded by the read's memory limit
//!   (4568), a `$graphLookup`'s visited and frontier sets too (40099);
//! - a correlated sub-pipeline whose first `$match` is an `$expr` equality
//!   of a top-level field and a `let` variable also scans with the plain
//!   equality `{field: value}` (a superset of what `$expr` keeps, so the
//!   result is unchanged) so that an index on the field is used.

use std::ops::ControlFlow;
use std::sync::Arc;

use bson::{Bson, Document};

use crate::doc::collation::Collator;
use crate::doc::size::document_len;
use crate::error::{Error, Result};
use crate::query::aggregate::exec::Exec;
use crate::query::aggregate::stages::Cur;
use crate::query::aggregate::{
    collection_name, plain_path, ParseCtx, Pipeline, Runtime, Stage, Within,
};
use crate::query::expr::{type_name, Expr, Root, Value};
use crate::query::filter::Filter;

fn failed(msg: impl Into<String>) -> Error {
    coded!(9, msg)
}

fn bson_type(v: &Bson) -> &'static str {
    type_name(&Some(v.clone()))
}

/// A sub-pipeline of `$lookup`/`$unionWith`, parsed once in its context.
#[derive(Debug, Clone)]
pub(super) struct SubPipeline {
    raw: Vec<Document>,
    parsed: Pipeline,
    /// The context it was parsed in (re-parsed with `let` values bound).
    ctx: ParseCtx,
}

/// The stage documents of a `pipeline` argument.
fn raw_pipeline(stage: &str, v: &Bson) -> Result<Vec<Document>> {
    let Bson::Array(items) = v else {
        return Err(coded!(
            14,
            format!(
                "BSON field '{stage}.pipeline' is the wrong type '{}', expected type 'array'",
                bson_type(v)
            ),
        ));
    };
    items
        .iter()
        .map(|s| match s {
            Bson::Document(d) => Ok(d.clone()),
            other => Err(coded!(
                14,
                format!(
                    "Each element of the '{stage}.pipeline' array must be an object, found {}",
                    bson_type(other)
                ),
            )),
        })
        .collect()
}

/// Does any string of `v` name one of `vars` (`"$$x"` or `"$$x.path"`)?
fn mentions(v: &Bson, vars: &[String]) -> bool {
    match v {
        Bson::String(s) => s.strip_prefix("$$").is_some_and(|rest| {
            let name = rest.split('.').next().unwrap_or("");
            vars.iter().any(|n| n == name)
        }),
        Bson::Array(a) => a.iter().any(|x| mentions(x, vars)),
        Bson::Document(d) => d.iter().any(|(k, x)| {
            // `$let`/`$map`/... bind names as keys, never as `$$` strings.
            mentions(x, vars)
                || k.strip_prefix("$$")
                    .is_some_and(|n| vars.iter().any(|v| v == n))
        }),
        _ => false,
    }
}

// ---------------------------------------------------------------- $lookup

#[derive(Debug, Clone)]
pub(super) struct Lookup {
    /// `None`: the sub-pipeline starts with `$documents`.
    from: Option<String>,
    as_path: Vec<String>,
    /// `localField` (path components) and `foreignField` (dotted), together.
    join: Option<(Vec<String>, String)>,
    let_vars: Vec<(String, Expr)>,
    pipeline: Option<SubPipeline>,
    /// The sub-pipeline reads one of `let_vars`.
    correlated: bool,
    /// The command's collation: the join compares strings under it, as
    /// MongoDB's `$lookup` does (not the foreign collection's default).
    collator: Option<Arc<Collator>>,
}

impl Lookup {
    pub(super) fn parse(arg: &Bson, ctx: &ParseCtx) -> Result<Lookup> {
        let Bson::Document(spec) = arg else {
            return Err(failed(format!(
                "the $lookup stage specification must be an object, but found {}",
                bson_type(arg)
            )));
        };
        let mut from = None;
        let (mut as_field, mut local, mut foreign) = (None, None, None);
        let mut let_doc: Option<&Document> = None;
        let mut raw: Option<Vec<Document>> = None;
        for (k, v) in spec {
            match (k.as_str(), v) {
                ("pipeline", _) => raw = Some(raw_pipeline("$lookup", v)?),
                ("let", Bson::Document(d)) => let_doc = Some(d),
                ("let", other) => {
                    return Err(failed(format!(
                        "$lookup argument 'let: {}' must be an object, is type {}",
                        crate::error::render(other),
                        bson_type(other)
                    )))
                }
                ("from", Bson::String(s)) => from = Some(collection_name("$lookup", s)?),
                ("from", Bson::Document(d)) => {
                    return Err(failed(format!(
                        "$lookup with syntax {{from: {{db:<>, coll:<>}},..}} is not supported for db: {} and coll: {}",
                        d.get_str("db").unwrap_or(""),
                        d.get_str("coll").unwrap_or("")
                    )))
                }
                ("from", other) => {
                    return Err(failed(format!(
                        "$lookup 'from' field must be a string, but found {}",
                        bson_type(other)
                    )))
                }
                (name, Bson::String(s)) => match name {
                    "as" => as_field = Some(s.clone()),
                    "localField" => local = Some(s.clone()),
                    "foreignField" => foreign = Some(s.clone()),
                    other => return Err(failed(format!("unknown argument to $lookup: {other}"))),
                },
                (name, other) => {
                    if !matches!(name, "as" | "localField" | "foreignField") {
                        return Err(failed(format!("unknown argument to $lookup: {name}")));
                    }
                    return Err(failed(format!(
                        "$lookup argument '{name}: {}' must be a string, found {}",
                        crate::error::render(other),
                        bson_type(other)
                    )));
                }
            }
        }
        if from.is_none() {
            let starts_with_documents = raw
                .as_ref()
                .and_then(|p| p.first())
                .is_some_and(|s| s.contains_key("$documents"));
            if raw.is_none() {
                return Err(failed("must specify 'pipeline' when 'from' is empty"));
            }
            if !starts_with_documents {
                return Err(failed(
                    "$lookup stage without explicit collection must have a pipeline with $documents as first stage",
                ));
            }
        }
        let as_field = as_field
            .filter(|a| !a.is_empty())
            .ok_or_else(|| failed("must specify 'as' field for a $lookup"))?;
        let as_path = plain_path("$lookup", "as", &as_field)?;
        let join = match (local, foreign, raw.is_some()) {
            (Some(l), Some(f), _) if !l.is_empty() && !f.is_empty() => {
                plain_path("$lookup", "foreignField", &f)?;
                Some((plain_path("$lookup", "localField", &l)?, f))
            }
            (None, None, true) => None,
            (_, _, true) => {
                return Err(failed(
                    "$lookup requires both or neither of 'localField' and 'foreignField' to be specified",
                ))
            }
            (_, _, false) => {
                return Err(failed(
                    "$lookup requires either 'pipeline' or both 'localField' and 'foreignField' to be specified",
                ))
            }
        };
        if raw.is_none() && let_doc.is_some() {
            return Err(failed(
                "$lookup with a 'let' argument must also specify 'pipeline'",
            ));
        }
        let mut let_vars = Vec::new();
        for (name, v) in let_doc.into_iter().flatten() {
            let_vars.push((name.clone(), ctx.expr(v)?));
        }
        let names: Vec<String> = let_vars.iter().map(|(n, _)| n.clone()).collect();
        let sub_ctx = ctx.nested(Within::Lookup)?;
        let (pipeline, correlated) = match raw {
            None => (None, false),
            Some(raw) => {
                // Parsed once with the variables bound to missing: every
                // error the per-document parse could raise is raised here.
                let check_ctx =
                    sub_ctx.with_vars(names.iter().map(|n| (n.clone(), None)).collect())?;
                let parsed = Pipeline::parse_in(&raw, &check_ctx)?;
                let correlated = raw
                    .iter()
                    .any(|s| mentions(&Bson::Document(s.clone()), &names));
                (
                    Some(SubPipeline {
                        raw,
                        parsed,
                        ctx: sub_ctx,
                    }),
                    correlated,
                )
            }
        };
        Ok(Lookup {
            from,
            as_path,
            join,
            let_vars,
            pipeline,
            correlated,
            collator: ctx.collator.clone(),
        })
    }

    pub(super) fn foreign_names(&self, out: &mut Vec<String>) {
        out.extend(self.from.iter().cloned());
        if let Some(p) = &self.pipeline {
            out.extend(p.parsed.foreign_names());
        }
    }

    /// The input document with the matches at `as`.
    pub(super) fn apply(&self, cur: Cur<'_>, rt: &Runtime<'_>) -> Result<Document> {
        let root = cur.root();
        let join = match &self.join {
            Some((local, foreign)) => Some(join_filter(&root, local, foreign)?),
            None => None,
        };
        let mut matches = Matches::new(self.from.as_deref(), rt.limits.memory_limit_bytes);
        match &self.pipeline {
            None => {
                let from = self.from.as_deref().unwrap_or_default();
                let filter =
                    Filter::parse(&join.unwrap_or_default())?.with_collation(self.collator.clone());
                rt.foreign.scan(from, &filter, &mut |d| {
                    matches.add(crate::doc::to_document(d)?)?;
                    Ok(ControlFlow::Continue(()))
                })?;
            }
            Some(sub) if !self.correlated && join.is_none() => {
                let key = self as *const Lookup as usize;
                let all = rt.cached(key, || {
                    let mut m = Matches::new(self.from.as_deref(), rt.limits.memory_limit_bytes);
                    run_sub(
                        rt,
                        self.from.as_deref(),
                        None,
                        &sub.parsed,
                        None,
                        &mut |d| {
                            m.add(d)?;
                            Ok(ControlFlow::Continue(()))
                        },
                    )?;
                    Ok(m.docs)
                })?;
                for d in all.iter() {
                    matches.add(d.clone())?;
                }
            }
            Some(sub) if !self.correlated => {
                let coll = self.collator.clone();
                run_sub(
                    rt,
                    self.from.as_deref(),
                    join,
                    &sub.parsed,
                    coll,
                    &mut |d| {
                        matches.add(d)?;
                        Ok(ControlFlow::Continue(()))
                    },
                )?;
            }
            Some(sub) => {
                let mut values = Vec::with_capacity(self.let_vars.len());
                for (name, e) in &self.let_vars {
                    values.push((name.clone(), e.eval(&root)?));
                }
                let pre = sub
                    .raw
                    .first()
                    .and_then(|s| s.get_document("$match").ok())
                    .and_then(|m| prefilter(m, &values));
                let scan = match (join, pre) {
                    (Some(j), Some(p)) => Some(bson::doc! {"$and": [j, p]}),
                    (j, p) => j.or(p),
                };
                let ctx = sub.ctx.with_vars(values)?;
                let parsed = Pipeline::parse_in(&sub.raw, &ctx)?;
                let coll = self.collator.clone();
                run_sub(rt, self.from.as_deref(), scan, &parsed, coll, &mut |d| {
                    matches.add(d)?;
                    Ok(ControlFlow::Continue(()))
                })?;
            }
        }
        let mut doc = cur.into_document()?;
        set_nested(
            &mut doc,
            &self.as_path,
            Bson::Array(matches.docs.into_iter().map(Bson::Document).collect()),
        );
        Ok(doc)
    }
}

/// A `$lookup`'s matches with their size (4568 past the memory limit,
/// MongoDB's `internalLookupStageIntermediateDocumentMaxSizeBytes`).
struct Matches<'a> {
    from: &'a str,
    docs: Vec<Document>,
    bytes: usize,
    limit: usize,
}

impl<'a> Matches<'a> {
    fn new(from: Option<&'a str>, limit: usize) -> Matches<'a> {
        Matches {
            from: from.unwrap_or(""),
            docs: Vec::new(),
            bytes: 0,
            limit,
        }
    }

    fn add(&mut self, d: Document) -> Result<()> {
        self.bytes += document_len(&d);
        if self.bytes > self.limit {
            return Err(coded!(
                4568,
                format!(
                    "Total size of documents in {} matching pipeline's $lookup stage exceeds {} bytes",
                    self.from, self.limit
                ),
            ));
        }
        self.docs.push(d);
        Ok(())
    }
}

/// Every value at `path` in the document at `root`, arrays expanded at every
/// level (MongoDB's `visitAllValuesAtPath`); nothing for missing.
fn values_at_path(root: &Root<'_>, path: &[String]) -> Result<Vec<Bson>> {
    let Some((first, rest)) = path.split_first() else {
        return Ok(Vec::new());
    };
    let mut out = Vec::new();
    if let Some(v) = root.get(std::slice::from_ref(first))? {
        values_below(&v, rest, &mut out);
    }
    Ok(out)
}

fn values_below(v: &Bson, rest: &[String], out: &mut Vec<Bson>) {
    match (rest.split_first(), v) {
        (None, Bson::Array(items)) => out.extend(items.iter().cloned()),
        (None, other) => out.push(other.clone()),
        (Some((first, tail)), Bson::Document(d)) => {
            if let Some(x) = d.get(first) {
                values_below(x, tail, out);
            }
        }
        (Some(_), Bson::Array(items)) => {
            for e in items {
                if let Bson::Document(_) = e {
                    values_below(e, rest, out);
                }
            }
        }
        (Some(_), _) => {}
    }
}

/// The equality form's filter on the foreign collection (see the module
/// invariants).
fn join_filter(root: &Root<'_>, local: &[String], foreign: &str) -> Result<Document> {
    let mut values = values_at_path(root, local)?;
    if values.is_empty() {
        values.push(Bson::Null);
    }
    Ok(if values.len() == 1 {
        bson::doc! {foreign: {"$eq": values.swap_remove(0)}}
    } else if values
        .iter()
        .any(|v| matches!(v, Bson::RegularExpression(_)))
    {
        let ors: Vec<Bson> = values
            .into_iter()
            .map(|v| Bson::Document(bson::doc! {foreign: {"$eq": v}}))
            .collect();
        bson::doc! {"$or": ors}
    } else {
        bson::doc! {foreign: {"$in": values}}
    })
}

/// `{field: value}` for each `$expr` equality of a top-level field and a
/// `let` variable at the top of `first_match` (see the module invariants);
/// `None` when there is none.
fn prefilter(first_match: &Document, values: &[(String, Value)]) -> Option<Document> {
    let expr = first_match.get_document("$expr").ok()?;
    let mut eqs: Vec<&Bson> = Vec::new();
    if expr.len() != 1 {
        return None;
    }
    match expr.iter().next() {
        Some((op, v @ Bson::Array(_))) if op == "$eq" => eqs.push(v),
        Some((op, Bson::Array(items))) if op == "$and" => {
            for item in items {
                if let Bson::Document(d) = item {
                    if let Some(e) = d.get("$eq") {
                        if d.len() == 1 {
                            eqs.push(e);
                        }
                    }
                }
            }
        }
        _ => return None,
    }
    let mut out = Document::new();
    for e in eqs {
        let Bson::Array(pair) = e else { continue };
        let [a, b] = pair.as_slice() else { continue };
        let (field, var) = match (a, b) {
            (Bson::String(f), Bson::String(v)) if is_field(f) && v.starts_with("$$") => (f, v),
            (Bson::String(v), Bson::String(f)) if is_field(f) && v.starts_with("$$") => (f, v),
            _ => continue,
        };
        let Some((_, Some(value))) = values.iter().find(|(n, _)| *n == var[2..]) else {
            continue;
        };
        let usable = !matches!(
            value,
            Bson::RegularExpression(_) | Bson::Array(_) | Bson::Document(_) | Bson::Undefined
        );
        if usable && !out.contains_key(f_name(field)) {
            out.insert(f_name(field), value.clone());
        }
    }
    (!out.is_empty()).then_some(out)
}

/// `"$a"`: a top-level field path (no `$$`, no dots).
fn is_field(s: &str) -> bool {
    s.starts_with('$') && !s.starts_with("$$") && !s.contains('.') && s.len() > 1
}

fn f_name(s: &str) -> String {
    s[1..].to_string()
}

/// Set `path` in `doc` to `v`, replacing whatever is on the way that is not
/// a document (MongoDB's `setNestedField`).
pub(super) fn set_nested(doc: &mut Document, path: &[String], v: Bson) {
    let Some((first, rest)) = path.split_first() else {
        return;
    };
    if rest.is_empty() {
        doc.insert(first.clone(), v);
        return;
    }
    if !matches!(doc.get(first), Some(Bson::Document(_))) {
        doc.insert(first.clone(), Document::new());
    }
    if let Some(Bson::Document(d)) = doc.get_mut(first) {
        set_nested(d, rest, v);
    }
}

/// Run `pipeline` on the documents of `from` (or of its leading
/// `$documents`), scanning with `scan` when given (the join filter), else
/// with the pipeline's first `$match`; each output goes to `out`.
pub(super) fn run_sub(
    rt: &Runtime<'_>,
    from: Option<&str>,
    scan: Option<Document>,
    pipeline: &Pipeline,
    collator: Option<Arc<Collator>>,
    out: &mut dyn FnMut(Document) -> Result<ControlFlow<()>>,
) -> Result<()> {
    let stages = &pipeline.stages;
    let scan_filter = match &scan {
        Some(f) => Some(Filter::parse(f)?.with_collation(collator)),
        None => None,
    };
    let docs = if let Some(Stage::Documents(e)) = stages.first() {
        let mut exec = Exec::new(&stages[1..], None, &[], rt);
        for d in super::exec::documents_of(e)? {
            let keep = match &scan_filter {
                Some(f) => f.matches(&crate::doc::to_raw_document(&d)?),
                None => true,
            };
            if keep && exec.push_document(d)?.is_break() {
                break;
            }
        }
        exec.finish()?
    } else {
        let from = from.ok_or_else(|| {
            Error::Internal("a sub-pipeline without a collection or $documents".into())
        })?;
        let (filter, skip) = match (scan_filter, stages.first()) {
            (Some(f), _) => (f, 0),
            (None, Some(Stage::Match { filter, .. })) => (filter.clone(), 1),
            (None, _) => (Filter::parse(&Document::new())?, 0),
        };
        let mut exec = Exec::new(&stages[skip..], None, &[], rt);
        rt.foreign.scan(from, &filter, &mut |d| exec.push_doc(d))?;
        exec.finish()?
    };
    for d in docs {
        if out(d)?.is_break() {
            break;
        }
    }
    Ok(())
}

// ---------------------------------------------------------------- $unionWith

#[derive(Debug, Clone)]
pub(super) struct UnionWith {
    coll: Option<String>,
    pipeline: Pipeline,
}

impl UnionWith {
    pub(super) fn parse(arg: &Bson, ctx: &ParseCtx) -> Result<UnionWith> {
        let sub_ctx = ctx.nested(Within::UnionWith)?;
        match arg {
            Bson::String(s) => Ok(UnionWith {
                coll: Some(collection_name("$unionWith", s)?),
                pipeline: Pipeline { stages: Vec::new() },
            }),
            Bson::Document(d) => {
                let mut coll = None;
                let mut raw = Vec::new();
                for (k, v) in d {
                    match (k.as_str(), v) {
                        ("coll", Bson::String(s)) => {
                            coll = Some(collection_name("$unionWith", s)?)
                        }
                        ("coll", other) => {
                            return Err(coded!(
                                14,
                                format!(
                                    "BSON field '$unionWith.coll' is the wrong type '{}', expected type 'string'",
                                    bson_type(other)
                                ),
                            ))
                        }
                        ("pipeline", _) => raw = raw_pipeline("$unionWith", v)?,
                        (other, _) => {
                            return Err(coded!(
                                40415,
                                format!("BSON field '$unionWith.{other}' is an unknown field."),
                            ))
                        }
                    }
                }
                if coll.is_none() && !raw.first().is_some_and(|s| s.contains_key("$documents")) {
                    return Err(failed(
                        "$unionWith stage without explicit collection must have a pipeline with $documents as first stage",
                    ));
                }
                Ok(UnionWith {
                    coll,
                    pipeline: Pipeline::parse_in(&raw, &sub_ctx)?,
                })
            }
            other => Err(failed(format!(
                "the $unionWith stage specification must be an object or string, but found {}",
                bson_type(other)
            ))),
        }
    }

    pub(super) fn foreign_names(&self, out: &mut Vec<String>) {
        out.extend(self.coll.iter().cloned());
        out.extend(self.pipeline.foreign_names());
    }

    /// The other collection's documents through the sub-pipeline.
    pub(super) fn run(
        &self,
        rt: &Runtime<'_>,
        out: &mut dyn FnMut(Document) -> Result<ControlFlow<()>>,
    ) -> Result<()> {
        run_sub(rt, self.coll.as_deref(), None, &self.pipeline, None, out)
    }
}

// ---------------------------------------------------------------- $graphLookup

/// MongoDB's `$graphLookup` memory bound when the read's is higher.
const GRAPH_LOOKUP_MEMORY: usize = 100 * 1024 * 1024;

#[derive(Debug, Clone)]
pub(super) struct GraphLookup {
    from: String,
    start_with: Expr,
    connect_from: Vec<String>,
    connect_to: String,
    as_path: Vec<String>,
    max_depth: Option<i64>,
    depth_field: Option<Vec<String>>,
    restrict: Option<Document>,
    /// The command's collation, for the frontier's matches.
    collator: Option<Arc<Collator>>,
}

impl GraphLookup {
    pub(super) fn parse(arg: &Bson, ctx: &ParseCtx) -> Result<GraphLookup> {
        let Bson::Document(spec) = arg else {
            return Err(failed(format!(
                "the $graphLookup stage specification must be an object, but found {}",
                bson_type(arg)
            )));
        };
        let mut from = None;
        let mut start_with = None;
        let (mut connect_from, mut connect_to, mut as_field) = (None, None, None);
        let mut max_depth = None;
        let mut depth_field = None;
        let mut restrict = None;
        for (k, v) in spec {
            match k.as_str() {
                "startWith" => start_with = Some(ctx.expr(v)?),
                "maxDepth" => {
                    let n = crate::query::expr::num_of(v).ok_or_else(|| {
                        coded!(
                            40100,
                            format!("maxDepth must be numeric, found type: {}", bson_type(v)),
                        )
                    })?;
                    let f = n.to_f64();
                    if f < 0.0 {
                        return Err(coded!(
                            40101,
                            format!(
                                "maxDepth requires a nonnegative argument, found: {}",
                                f as i64
                            ),
                        ));
                    }
                    if f.fract() != 0.0 || f > i64::MAX as f64 {
                        return Err(coded!(
                            40102,
                            format!("maxDepth could not be represented as a long long: {f}"),
                        ));
                    }
                    max_depth = Some(f as i64);
                }
                "restrictSearchWithMatch" => match v {
                    Bson::Document(d) => {
                        Filter::parse(d).map_err(|e| {
                            failed(format!(
                                "Failed to parse 'restrictSearchWithMatch' option to $graphLookup :: caused by :: {e}"
                            ))
                        })?;
                        restrict = Some(d.clone());
                    }
                    other => {
                        return Err(coded!(
                            40185,
                            format!(
                                "restrictSearchWithMatch must be an object, found {}",
                                bson_type(other)
                            ),
                        ))
                    }
                },
                "from" | "as" | "connectFromField" | "connectToField" | "depthField" => {
                    let Bson::String(s) = v else {
                        return Err(coded!(
                            40103,
                            format!(
                                "expected string as argument for {k}, found: {}",
                                bson_type(v)
                            ),
                        ));
                    };
                    match k.as_str() {
                        "from" => from = Some(collection_name("$graphLookup", s)?),
                        "as" => as_field = Some(s.clone()),
                        "connectFromField" => connect_from = Some(s.clone()),
                        "connectToField" => connect_to = Some(s.clone()),
                        _ => depth_field = Some(plain_path("$graphLookup", "depthField", s)?),
                    }
                }
                other => {
                    return Err(coded!(
                        40104,
                        format!("Unknown argument to $graphLookup: {other}"),
                    ))
                }
            }
        }
        let (Some(from), Some(as_field), Some(start_with), Some(cf), Some(ct)) =
            (from, as_field, start_with, connect_from, connect_to)
        else {
            return Err(coded!(
                40105,
                "$graphLookup requires 'from', 'as', 'startWith', 'connectFromField', and 'connectToField' to be specified.",
            ));
        };
        if as_field.is_empty() || cf.is_empty() || ct.is_empty() {
            return Err(coded!(
                40105,
                "$graphLookup requires 'from', 'as', 'startWith', 'connectFromField', and 'connectToField' to be specified.",
            ));
        }
        plain_path("$graphLookup", "connectToField", &ct)?;
        Ok(GraphLookup {
            from,
            start_with,
            connect_from: plain_path("$graphLookup", "connectFromField", &cf)?,
            connect_to: ct,
            as_path: plain_path("$graphLookup", "as", &as_field)?,
            max_depth,
            depth_field,
            restrict,
            collator: ctx.collator.clone(),
        })
    }

    pub(super) fn foreign_names(&self, out: &mut Vec<String>) {
        out.push(self.from.clone());
    }

    /// Breadth-first search from `startWith`; the documents reached, each
    /// once (by `_id`), in the order found.
    pub(super) fn apply(&self, cur: Cur<'_>, rt: &Runtime<'_>) -> Result<Document> {
        let limit = rt.limits.memory_limit_bytes.min(GRAPH_LOOKUP_MEMORY);
        let mut frontier: Vec<Bson> = match self.start_with.eval(&cur.root())? {
            Some(Bson::Array(items)) => items,
            Some(v) => vec![v],
            None => Vec::new(),
        };
        let mut visited: Vec<Document> = Vec::new();
        let mut seen: std::collections::BTreeSet<OrdKey> = std::collections::BTreeSet::new();
        let mut bytes = 0usize;
        let mut depth: i64 = 0;
        while !frontier.is_empty() && self.max_depth.is_none_or(|m| depth <= m) {
            dedup_values(&mut frontier);
            let filter = Filter::parse(&self.frontier_filter(&frontier))?
                .with_collation(self.collator.clone());
            let mut next: Vec<Bson> = Vec::new();
            let mut failed_id = None;
            rt.foreign.scan(&self.from, &filter, &mut |d| {
                let mut doc = crate::doc::to_document(d)?;
                let Some(id) = doc.get("_id").cloned() else {
                    failed_id = Some(());
                    return Ok(ControlFlow::Break(()));
                };
                if !seen.insert(OrdKey(id)) {
                    return Ok(ControlFlow::Continue(()));
                }
                if let Some(df) = &self.depth_field {
                    set_nested(&mut doc, df, Bson::Int64(depth));
                }
                values_below(&Bson::Document(doc.clone()), &self.connect_from, &mut next);
                bytes += document_len(&doc);
                if bytes > limit {
                    return Err(coded!(
                        40099,
                        "$graphLookup reached maximum memory consumption",
                    ));
                }
                visited.push(doc);
                Ok(ControlFlow::Continue(()))
            })?;
            if failed_id.is_some() {
                return Err(coded!(
                    40271,
                    format!(
                        "Documents in the '{}' namespace must contain an _id for de-duplication in $graphLookup",
                        self.from
                    ),
                ));
            }
            frontier = next;
            depth += 1;
        }
        let mut doc = cur.into_document()?;
        set_nested(
            &mut doc,
            &self.as_path,
            Bson::Array(visited.into_iter().map(Bson::Document).collect()),
        );
        Ok(doc)
    }

    /// `{$and: [restrict?, {connectTo: {$in: frontier}}, ...]}`, keeping
    /// missing `connectToField`s out and null apart from undefined, as
    /// MongoDB's `makeMatchStageFromFrontier`.
    fn frontier_filter(&self, frontier: &[Bson]) -> Document {
        let ct = self.connect_to.as_str();
        let mut and: Vec<Bson> = Vec::new();
        if let Some(r) = &self.restrict {
            and.push(Bson::Document(r.clone()));
        }
        and.push(Bson::Document(bson::doc! {ct: {"$in": frontier.to_vec()}}));
        let null = frontier.iter().any(|v| matches!(v, Bson::Null));
        let undefined = frontier.iter().any(|v| matches!(v, Bson::Undefined));
        if null || undefined {
            and.push(Bson::Document(bson::doc! {ct: {"$exists": true}}));
            if !undefined {
                and.push(Bson::Document(
                    bson::doc! {ct: {"$not": {"$type": "undefined"}}},
                ));
            } else if !null {
                and.push(Bson::Document(bson::doc! {ct: {"$not": {"$type": "null"}}}));
            }
        }
        bson::doc! {"$and": and}
    }
}

/// A value ordered by the BSON order (for the visited set).
#[derive(Debug, Clone)]
struct OrdKey(Bson);

impl PartialEq for OrdKey {
    fn eq(&self, o: &Self) -> bool {
        self.cmp(o) == std::cmp::Ordering::Equal
    }
}
impl Eq for OrdKey {}
impl PartialOrd for OrdKey {
    fn partial_cmp(&self, o: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(o))
    }
}
impl Ord for OrdKey {
    fn cmp(&self, o: &Self) -> std::cmp::Ordering {
        crate::query::expr::compare(&self.0, &o.0)
    }
}

/// Remove values equal under the BSON order (the frontier is a set).
fn dedup_values(values: &mut Vec<Bson>) {
    let mut seen = std::collections::BTreeSet::new();
    values.retain(|v| seen.insert(OrdKey(v.clone())));
}
