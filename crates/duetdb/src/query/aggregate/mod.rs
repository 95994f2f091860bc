//! The aggregation pipeline: parsing, the split into a commutative scan part
//! and an ordered rest, and evaluation on documents.
//!
//! Owns: [`Pipeline`] (parsed stages), its stage parser and the parse context
//! [`ParseCtx`] (the command's and an enclosing `$lookup`'s `let` variables,
//! the sub-pipeline depth and where a stage may stand) — here; the
//! per-document and whole-set stages (`stages.rs`), `$group` and its
//! accumulators (`group.rs`; its spilling: `group_spill.rs`), `$lookup`/`$graphLookup`/`$unionWith` and the
//! sub-pipelines they run on other collections (`lookup.rs`), `$facet`
//! (`facet.rs`), `$bucket`/`$bucketAuto`/`$sortByCount` (`bucket.rs`),
//! `$setWindowFields` (`window.rs`), `$densify`/`$fill` (`fill.rs`),
//! `$out`/`$merge` (`output.rs`: the specs and how a merged document is
//! built; the write itself is the API's), what a pipeline reads besides its
//! own collection and shares while it runs (`foreign.rs`: [`Foreign`],
//! [`Pinned`], [`Runtime`]), and the split into a commutative scan part with a
//! mergeable state (`split.rs`: [`Split`], [`CommutativePart`],
//! [`PartialState`], [`prepare`]). `$project` and `$unset` are projections of
//! `query::projection` (the one implementation find uses too, in its
//! `$project` dialect). Executing a pipeline on a collection (choosing a scan,
//! OLCP, pinning the other collections, writing `$out`/`$merge`) belongs to
//! `api::aggregate`, which pushes the scanned documents through [`Exec`]
//! (`exec.rs`: push-based execution under the read's limits).
//!
//! Why the split: an OLCP scan (and any parallel scan) hands documents to the
//! query in an arbitrary order, possibly on several threads. A prefix of
//! per-document stages (`$match $project $addFields $set $unset $unwind
//! $replaceRoot $replaceWith $lookup $graphLookup`) optionally closed by one
//! `$group` whose accumulators are all mergeable can be computed per thread
//! and merged, whatever the order; the rest runs afterwards on the (small)
//! merged output. `$lookup` and `$graphLookup` are per-document because they
//! read the other collection at the pipeline's one snapshot ([`Pinned`]),
//! which no arrival order changes.
//!
//! Invariants:
//! - `merge` is associative and commutative on the *finished* result: feeding any
//!   permutation of the documents into any number of states and merging them in
//!   any tree shape gives the same `finish()` as feeding them in order into one
//!   state, except for the order of `$push` arrays and, without a `$group`, the
//!   order of the output documents (both are unordered in MongoDB too). Integer
//!   sums are exact (i128) so their result type does not depend on the merge
//!   shape; double sums may differ in the last bits (as in a sharded MongoDB).
//! - Values equal under [`crate::doc::value::compare`] but not identical (`1` and
//!   `1.0`) are one group / one set element / one min; which representative is
//!   kept is decided by a total order refining `compare` ([`canonical_cmp`]), not
//!   by arrival order, so it too is independent of the merge shape.
//! - `feed` assumes the document already passed the split's `scan_filter` (the
//!   scan applies it); it never re-checks it.
//! - Every collection a pipeline reads is named before it runs
//!   ([`Pipeline::foreign_names`], sub-pipelines included), so the scan can
//!   pin all of them at its own start (one snapshot per pipeline).
//! - Memory: a `$group`'s state is bounded ([`GROUP_MEMORY_LIMIT`], or the
//!   read's lower limit; spilled by [`Exec`] with `allowDiskUse`
//!   (`group_spill.rs`), else 292); a `$push`/`$addToSet`
//!   array by the 16 MiB document size (error 10334); a `$sort` run by
//!   [`Exec`] by the read's memory limit (spilled, or 292); a `$lookup`'s
//!   matches (4568), `$facet`'s outputs (4031700), `$graphLookup`'s visited
//!   set (40099) by the read's memory limit; the inputs of `$sample`,
//!   `$bucketAuto`, `$setWindowFields`, `$densify` and `$fill` go through
//!   the sorter (spilled with `allowDiskUse`, else 292), and a window
//!   partition past the limit is spooled to disk the same way.
//! - Nothing here panics on user input.

/// An error with one of MongoDB's codes: `FailedToParse`, `TypeMismatch`,
/// `InvalidOptions`, ... by name, any other as its `Location<code>`.
macro_rules! coded {
    ($code:literal, $msg:expr $(,)?) => {
        $crate::error::Error::Coded {
            code: $code,
            name: code_name!($code),
            msg: ::std::convert::Into::<String>::into($msg),
        }
    };
}

/// The code name MongoDB reports for `code`.
macro_rules! code_name {
    (2) => {
        "BadValue"
    };
    (9) => {
        "FailedToParse"
    };
    (14) => {
        "TypeMismatch"
    };
    (72) => {
        "InvalidOptions"
    };
    (73) => {
        "InvalidNamespace"
    };
    (115) => {
        "CommandNotSupported"
    };
    (232) => {
        "MaxSubPipelineDepthExceeded"
    };
    (13113) => {
        "MergeStageNoMatchingDocument"
    };
    ($code:literal) => {
        concat!("Location", stringify!($code))
    };
}

mod bucket;
mod calculus;
mod exec;
mod facet;
mod fill;
mod foreign;
pub mod geonear;
mod group;
mod group_spill;
mod lookup;
mod output;
mod redact;
mod split;
mod stages;
#[cfg(test)]
mod test_support;
#[cfg(test)]
mod tests;
#[cfg(test)]
mod tests_stages;
mod window;

use bson::{Bson, Document};

use crate::error::{Error, Result};
use crate::query::expr::{num_of, parse_field_path, type_name, Expr, Num, Scope};
use crate::query::filter::Filter;
use crate::query::projection::Projection;
use crate::query::sort::SortSpec;

use bucket::BucketAuto;
use facet::Facet;
use fill::Densify;
use group::Group;
use lookup::{GraphLookup, Lookup, UnionWith};
use stages::Unwind;
use window::Window;

pub use exec::Exec;
pub use foreign::{counts_bson, Foreign, Pinned, Runtime, StageCount, StageSpills, StageStats};
pub use group::canonical_cmp;
pub use output::{merged_version, MergeSpec, Output};
pub use split::{
    prepare, prepare_collated, prepare_with, CommutativePart, PartialState, Prepared, Split,
};

/// Most stages in one pipeline (MongoDB's default `internalPipelineLengthLimit`).
pub const MAX_PIPELINE_STAGES: usize = 1000;
/// Most memory one `$group` may hold (MongoDB's 100 MB without `allowDiskUse`).
pub const GROUP_MEMORY_LIMIT: usize = 100 * 1024 * 1024;
/// Most nested sub-pipelines (`$lookup`, `$unionWith`, `$facet` inside one
/// another): MongoDB's `kMaxSubPipelineDepth`; deeper is 232.
pub const MAX_SUB_PIPELINE_DEPTH: usize = 20;

/// A parsed pipeline.
#[derive(Debug, Clone)]
pub struct Pipeline {
    stages: Vec<Stage>,
}

#[derive(Debug, Clone)]
enum Stage {
    Match {
        spec: Document,
        filter: Filter,
    },
    Project(Projection),
    AddFields(Vec<(Vec<String>, Expr)>),
    /// `$unset` is an exclusion projection; kept apart only for its name.
    Unset(Projection),
    Unwind(Unwind),
    Group(Group),
    Sort(SortSpec),
    Limit(u64),
    Skip(u64),
    Count(String),
    /// `$replaceRoot` (`with: false`) / `$replaceWith`.
    ReplaceRoot {
        expr: Expr,
        with: bool,
    },
    Lookup(Box<Lookup>),
    GraphLookup(Box<GraphLookup>),
    UnionWith(Box<UnionWith>),
    Facet(Box<Facet>),
    /// `$sample: {size}`.
    Sample(u64),
    BucketAuto(Box<BucketAuto>),
    Window(Box<Window>),
    Densify(Box<Densify>),
    /// `$documents`: the pipeline's input, evaluated once.
    Documents(Expr),
    /// `$out` / `$merge`: the last stage; the API writes what reaches it.
    Output(Box<Output>),
    /// `$geoNear`'s last part: the distance (and location) fields
    /// (`geonear.rs`; its `$match` and distance sort precede it).
    GeoNear(Box<geonear::GeoNear>),
    /// `$redact` (`redact.rs`).
    Redact(Box<redact::Redact>),
}

impl Stage {
    fn name(&self) -> &'static str {
        match self {
            Stage::Match { .. } => "$match",
            Stage::Project(_) => "$project",
            Stage::AddFields(_) => "$addFields",
            Stage::Unset(_) => "$unset",
            Stage::Unwind(_) => "$unwind",
            Stage::Group(_) => "$group",
            Stage::Sort(_) => "$sort",
            Stage::Limit(_) => "$limit",
            Stage::Skip(_) => "$skip",
            Stage::Count(_) => "$count",
            Stage::ReplaceRoot { with: false, .. } => "$replaceRoot",
            Stage::ReplaceRoot { with: true, .. } => "$replaceWith",
            Stage::Lookup(_) => "$lookup",
            Stage::GraphLookup(_) => "$graphLookup",
            Stage::UnionWith(_) => "$unionWith",
            Stage::Facet(_) => "$facet",
            Stage::Sample(_) => "$sample",
            Stage::BucketAuto(_) => "$bucketAuto",
            Stage::Window(_) => "$setWindowFields",
            Stage::Densify(_) => "$densify",
            Stage::Documents(_) => "$documents",
            Stage::Output(o) => o.stage_name(),
            Stage::GeoNear(_) => "$geoNear",
            Stage::Redact(_) => "$redact",
        }
    }

    /// A stage that maps one document to zero or more, independently of
    /// others and of the order they arrive in.
    fn is_per_document(&self) -> bool {
        matches!(
            self,
            Stage::Match { .. }
                | Stage::Project(_)
                | Stage::AddFields(_)
                | Stage::Unset(_)
                | Stage::Unwind(_)
                | Stage::ReplaceRoot { .. }
                | Stage::Lookup(_)
                | Stage::GraphLookup(_)
                | Stage::GeoNear(_)
                | Stage::Redact(_)
        )
    }

    /// Collections this stage reads besides its input (sub-pipelines included).
    fn foreign_names(&self, out: &mut Vec<String>) {
        match self {
            Stage::Lookup(l) => l.foreign_names(out),
            Stage::GraphLookup(g) => g.foreign_names(out),
            Stage::UnionWith(u) => u.foreign_names(out),
            Stage::Facet(f) => f.foreign_names(out),
            _ => {}
        }
    }
}

/// Where a pipeline being parsed stands: which stages it may hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Within {
    /// The command's pipeline.
    Top,
    Lookup,
    Facet,
    UnionWith,
    /// A `$merge` `whenMatched` pipeline (update stages only).
    MergeUpdate,
}

/// What parsing a stage needs besides the stage: the variables in scope (the
/// command's `let`, an enclosing `$lookup`'s `let`), how deep in
/// sub-pipelines it is, and where it stands.
#[derive(Debug, Clone)]
pub struct ParseCtx {
    scope: Scope,
    depth: usize,
    within: Within,
    /// The command's collation: `$match` filters, `$sort` and `$group` keys
    /// compare strings under it (`None`: simple).
    collator: Option<std::sync::Arc<crate::doc::collation::Collator>>,
    /// Whether documents carry a text score (the stages after a `$text`
    /// first stage): else `{$meta: "textScore"}` is 40218.
    text_score: bool,
}

impl ParseCtx {
    /// The context of a command's pipeline with its `let` variables (each
    /// evaluated once, here).
    pub fn new(let_vars: Option<&Document>) -> Result<ParseCtx> {
        Ok(ParseCtx {
            scope: Scope::with_let(let_vars)?,
            depth: 0,
            within: Within::Top,
            collator: None,
            text_score: false,
        })
    }

    /// This context for the stages after a `$text` first stage: their
    /// documents carry the match's score (`query::text::TEXT_SCORE_FIELD`).
    pub fn with_text_score(mut self) -> ParseCtx {
        self.text_score = true;
        self
    }

    /// This context with the command's collation.
    pub fn with_collation(
        mut self,
        c: Option<std::sync::Arc<crate::doc::collation::Collator>>,
    ) -> ParseCtx {
        self.collator = c;
        self
    }

    fn expr(&self, v: &Bson) -> Result<Expr> {
        Expr::parse_in(v, &mut self.scope.clone())
    }

    /// The variables as a filter's `let` document (values as literals).
    fn let_doc(&self) -> Option<Document> {
        let consts = self.scope.consts();
        if consts.is_empty() {
            return None;
        }
        let mut d = Document::new();
        for (name, v) in consts {
            let lit = match v {
                Some(v) => Bson::Document(bson::doc! {"$literal": v.clone()}),
                None => Bson::String("$$REMOVE".into()),
            };
            d.insert(name.clone(), lit);
        }
        Some(d)
    }

    fn filter(&self, spec: &Document) -> Result<Filter> {
        Ok(Filter::parse_with_let(spec, self.let_doc().as_ref())?
            .with_collation(self.collator.clone()))
    }

    /// The context of a sub-pipeline of this one (232 past
    /// [`MAX_SUB_PIPELINE_DEPTH`]).
    fn nested(&self, within: Within) -> Result<ParseCtx> {
        if self.depth + 1 > MAX_SUB_PIPELINE_DEPTH {
            return Err(Error::Coded {
                code: 232,
                name: "MaxSubPipelineDepthExceeded",
                msg: format!(
                    "Maximum number of nested sub-pipelines exceeded. Limit is {MAX_SUB_PIPELINE_DEPTH}"
                ),
            });
        }
        Ok(ParseCtx {
            scope: self.scope.clone(),
            depth: self.depth + 1,
            within,
            collator: self.collator.clone(),
            text_score: self.text_score,
        })
    }

    /// This context with `vars` bound as constants (a `$lookup`'s `let`).
    fn with_vars(&self, vars: Vec<(String, Option<Bson>)>) -> Result<ParseCtx> {
        let mut ctx = self.clone();
        ctx.scope.bind_consts(vars)?;
        Ok(ctx)
    }
}

impl Pipeline {
    /// Parse a pipeline. Unknown stages, malformed arguments and pipelines longer
    /// than [`MAX_PIPELINE_STAGES`] are errors.
    pub fn parse(stages: &[Document]) -> Result<Pipeline> {
        Pipeline::parse_in(stages, &ParseCtx::new(None)?)
    }

    /// Parse a pipeline whose expressions and `$expr` filters may use the
    /// command's `let` variables (each evaluated once).
    pub fn parse_with_let(stages: &[Document], let_vars: Option<&Document>) -> Result<Pipeline> {
        Pipeline::parse_in(stages, &ParseCtx::new(let_vars)?)
    }

    /// Parse in `ctx`, checking where each stage may stand.
    pub fn parse_in(stages: &[Document], ctx: &ParseCtx) -> Result<Pipeline> {
        if stages.len() > MAX_PIPELINE_STAGES {
            return Err(Error::bad_value(format!(
                "Pipeline length must be no longer than {MAX_PIPELINE_STAGES} stages"
            )));
        }
        if !ctx.text_score && ctx.depth == 0 {
            crate::query::text::text_score_unavailable(stages)?;
        }
        let mut out = Vec::with_capacity(stages.len());
        for (i, s) in stages.iter().enumerate() {
            // MongoDB refuses a `$text` `$match` anywhere but first before
            // it parses the filter (`DocumentSourceMatch`).
            if i > 0
                && s.get_document("$match")
                    .is_ok_and(|m| m.contains_key("$text"))
            {
                return Err(coded!(
                    17313,
                    "$match with $text is only allowed as the first pipeline stage"
                ));
            }
            // A misplaced `$geoNear` is refused before its arguments are
            // (its `key` is only looked up for a first stage).
            if i > 0 && s.contains_key("$geoNear") {
                return Err(coded!(
                    40603,
                    "$geoNear was not the first stage in the pipeline."
                ));
            }
            let parsed = parse_stage(s, ctx)?;
            for stage in &parsed {
                check_position(stage, i, stages.len(), ctx.within)?;
            }
            out.extend(parsed);
        }
        Ok(Pipeline { stages: out })
    }

    /// How many executed stages each written stage of `stages` becomes
    /// (`$bucket` is a `$group` and a `$sort`, `$sortByCount` likewise, …):
    /// what maps explain's per-stage counts back to the stages as written.
    /// A stage that does not parse here (it needs the command's `let`, or
    /// a `$text` score) counts as one.
    pub fn stage_widths(stages: &[Document]) -> Vec<usize> {
        let ctx = ParseCtx::new(None).map(ParseCtx::with_text_score);
        stages
            .iter()
            .map(|s| match &ctx {
                Ok(ctx) => parse_stage(s, ctx).map_or(1, |v| v.len()),
                Err(_) => 1,
            })
            .collect()
    }

    /// Lower the `$group` memory limit (tests; a server knob later).
    pub fn set_group_memory_limit(&mut self, bytes: usize) {
        for s in &mut self.stages {
            if let Stage::Group(g) = s {
                g.memory_limit = bytes;
            }
        }
    }

    pub fn len(&self) -> usize {
        self.stages.len()
    }

    pub fn is_empty(&self) -> bool {
        self.stages.is_empty()
    }

    /// Stage names in order (for explain).
    pub fn stage_names(&self) -> Vec<&'static str> {
        self.stages.iter().map(Stage::name).collect()
    }

    /// Every collection the pipeline reads besides its input (`$lookup`,
    /// `$graphLookup`, `$unionWith`, in sub-pipelines too), sorted, once each.
    pub fn foreign_names(&self) -> Vec<String> {
        let mut out = Vec::new();
        for s in &self.stages {
            s.foreign_names(&mut out);
        }
        out.sort();
        out.dedup();
        out
    }

    /// The final `$out`/`$merge`, if the pipeline ends with one.
    pub fn output(&self) -> Option<&Output> {
        match self.stages.last() {
            Some(Stage::Output(o)) => Some(o),
            _ => None,
        }
    }

    /// Does the pipeline start with `$documents` (it then reads no collection)?
    pub fn starts_with_documents(&self) -> bool {
        matches!(self.stages.first(), Some(Stage::Documents(_)))
    }

    /// Evaluate every stage in order on materialized documents (the reference
    /// evaluation; no other collection is readable).
    pub fn run_on(&self, docs: Vec<Document>) -> Result<Vec<Document>> {
        self.run_on_with(docs, &Runtime::standalone())
    }

    /// Push-based execution of these stages under `rt` ([`Exec`]):
    /// what a caller that produces the input itself (the `$text` first stage,
    /// `api::text`) pushes its documents into, one at a time.
    pub fn exec<'p>(&'p self, rt: &'p Runtime<'p>) -> Exec<'p> {
        exec::Exec::new(&[], None, &self.stages, rt)
    }

    /// [`Pipeline::run_on`] with `rt`'s other collections and limits.
    pub fn run_on_with(&self, docs: Vec<Document>, rt: &Runtime<'_>) -> Result<Vec<Document>> {
        let mut docs = docs;
        for stage in &self.stages {
            docs = stages::run_stage(stage, docs, rt)?;
        }
        Ok(docs)
    }
}

/// MongoDB's rules of where stages stand: `$out`/`$merge` last and never in a
/// sub-pipeline, `$documents` first, no `$facet` inside `$facet`, only
/// update stages in a `$merge` pipeline.
fn check_position(stage: &Stage, i: usize, len: usize, within: Within) -> Result<()> {
    let name = stage.name();
    if let Stage::Output(_) = stage {
        let why = |w: &str| format!("{name} {w}");
        match within {
            Within::Top => {}
            Within::Lookup => {
                return Err(coded!(
                    51047,
                    why("is not allowed within a $lookup's sub-pipeline")
                ))
            }
            Within::UnionWith => {
                return Err(coded!(
                    31441,
                    why("is not allowed within a $unionWith's sub-pipeline")
                ))
            }
            Within::Facet | Within::MergeUpdate => {
                return Err(coded!(
                    40600,
                    why("is not allowed to be used within a $facet stage")
                ))
            }
        }
        if i + 1 != len {
            return Err(coded!(
                40601,
                format!("{name} can only be the final stage in the pipeline"),
            ));
        }
    }
    if let Stage::GeoNear(_) = stage {
        if i != 0 || within == Within::Facet {
            return Err(coded!(
                40603,
                "$geoNear was not the first stage in the pipeline."
            ));
        }
    }
    if let Stage::Documents(_) = stage {
        if i != 0 || within == Within::Facet {
            return Err(coded!(
                40602,
                format!("{name} is only valid as the first stage in a pipeline"),
            ));
        }
    }
    if within == Within::Facet && matches!(stage, Stage::Facet(_)) {
        return Err(coded!(
            40600,
            "$facet is not allowed to be used within a $facet stage",
        ));
    }
    if within == Within::MergeUpdate
        && !matches!(
            stage,
            Stage::AddFields(_) | Stage::Project(_) | Stage::Unset(_) | Stage::ReplaceRoot { .. }
        )
    {
        return Err(coded!(
            72,
            format!(
                "{name} is not allowed to be used within an update; only $addFields, $set, $project, $unset, $replaceRoot and $replaceWith are"
            ),
        ));
    }
    Ok(())
}

// ---------------------------------------------------------------- parsing

fn parse_stage(stage: &Document, ctx: &ParseCtx) -> Result<Vec<Stage>> {
    if stage.len() != 1 {
        return Err(Error::bad_value(
            "A pipeline stage specification object must contain exactly one field.",
        ));
    }
    let Some((name, arg)) = stage.iter().next() else {
        return Err(Error::Internal("empty stage".into()));
    };
    let want_doc = || -> Result<&Document> {
        match arg {
            Bson::Document(d) => Ok(d),
            other => Err(not_an_object(name, other)),
        }
    };
    let one = |s: Stage| Ok(vec![s]);
    match name.as_str() {
        "$match" => {
            let spec = want_doc()?;
            // The spec carries its variables: a leading `$match` becomes the
            // scan filter and is parsed again there.
            let bound = Filter::bind_let(spec, ctx.let_doc().as_ref())?;
            one(Stage::Match {
                filter: ctx.filter(spec)?,
                spec: bound,
            })
        }
        "$project" => one(Stage::Project(Projection::parse_stage_in(
            want_doc()?,
            &ctx.scope,
        )?)),
        "$addFields" | "$set" => one(parse_add_fields(name, want_doc()?, ctx)?),
        "$unset" => one(parse_unset(arg)?),
        "$unwind" => one(Stage::Unwind(Unwind::parse(arg)?)),
        "$group" => one(Stage::Group(
            Group::parse(want_doc()?, &ctx.scope)?.with_collation(ctx.collator.clone()),
        )),
        "$sort" => {
            let spec = want_doc()?;
            if spec.is_empty() {
                return Err(coded!(15976, "$sort stage must have at least one sort key"));
            }
            one(Stage::Sort(
                SortSpec::parse_in_pipeline(spec)?.with_collation(ctx.collator.clone()),
            ))
        }
        "$limit" => {
            let n = whole_number(name, arg)?;
            if n <= 0 {
                return Err(coded!(15958, "the limit must be positive"));
            }
            one(Stage::Limit(n as u64))
        }
        "$skip" => {
            let n = whole_number(name, arg)?;
            if n < 0 {
                return Err(coded!(
                    5107200,
                    format!("invalid argument to $skip stage: Expected a non-negative number in: $skip: {n}")
                ));
            }
            one(Stage::Skip(n as u64))
        }
        "$count" => one(parse_count(arg)?),
        "$replaceRoot" => one(stages::parse_replace_root(arg, ctx)?),
        "$redact" => one(Stage::Redact(Box::new(redact::Redact::parse(arg, ctx)?))),
        "$replaceWith" => one(Stage::ReplaceRoot {
            expr: ctx.expr(arg)?,
            with: true,
        }),
        "$lookup" => one(Stage::Lookup(Box::new(Lookup::parse(arg, ctx)?))),
        "$graphLookup" => one(Stage::GraphLookup(Box::new(GraphLookup::parse(arg, ctx)?))),
        "$unionWith" => one(Stage::UnionWith(Box::new(UnionWith::parse(arg, ctx)?))),
        "$facet" => one(Stage::Facet(Box::new(Facet::parse(arg, ctx)?))),
        "$sample" => one(stages::parse_sample(arg)?),
        "$sortByCount" => bucket::parse_sort_by_count(arg, ctx),
        "$bucket" => bucket::parse_bucket(arg, ctx),
        "$bucketAuto" => one(Stage::BucketAuto(Box::new(BucketAuto::parse(arg, ctx)?))),
        "$setWindowFields" => one(Stage::Window(Box::new(Window::parse(arg, ctx)?))),
        "$geoNear" => geonear::parse(arg, ctx),
        "$densify" => one(Stage::Densify(Box::new(Densify::parse(arg)?))),
        "$fill" => fill::parse_fill(arg, ctx),
        "$documents" => one(Stage::Documents(ctx.expr(arg)?)),
        "$out" => one(Stage::Output(Box::new(Output::parse_out(arg)?))),
        "$merge" => one(Stage::Output(Box::new(Output::parse_merge(arg, ctx)?))),
        "$planCacheStats" => Err(Error::Coded {
            code: 115,
            name: "CommandNotSupported",
            msg: "$planCacheStats is not supported by duetdb: it keeps no plan cache (every query is planned when it runs; see explain)".into(),
        }),
        other => Err(coded!(
            40324,
            format!("Unrecognized pipeline stage name: '{other}'"),
        )),
    }
}

/// `$addFields` / `$set` (`name` is the one used, for messages).
fn parse_add_fields(name: &str, spec: &Document, ctx: &ParseCtx) -> Result<Stage> {
    let mut fields = Vec::with_capacity(spec.len());
    for (k, v) in spec {
        let path = parse_field_path(k)
            .map_err(|e| Error::bad_value(format!("Invalid {name} :: caused by :: {e}")))?;
        fields.push((path, ctx.expr(v)?));
    }
    if fields.is_empty() {
        return Err(Error::bad_value(format!(
            "Invalid {name} :: caused by :: specification must have at least one field"
        )));
    }
    Ok(Stage::AddFields(fields))
}

/// `$unset: "a"` or `$unset: ["a", "b.c"]`: the exclusion projection of those paths.
fn parse_unset(arg: &Bson) -> Result<Stage> {
    let paths: Vec<&str> = match arg {
        Bson::String(s) => vec![s.as_str()],
        Bson::Array(a) if !a.is_empty() => a
            .iter()
            .map(|v| match v {
                Bson::String(s) => Ok(s.as_str()),
                _ => Err(Error::bad_value(
                    "$unset specification must be a string or an array containing only string values",
                )),
            })
            .collect::<Result<_>>()?,
        _ => {
            return Err(Error::bad_value(
                "$unset specification must be a string or an array with at least one field",
            ))
        }
    };
    Ok(Stage::Unset(Projection::parse_unset(&paths)?))
}

/// `$count: "<field>"`: a plain, non-empty top-level field name.
/// MongoDB's codes (document_source_count.cpp).
fn parse_count(arg: &Bson) -> Result<Stage> {
    match arg {
        Bson::String(s) if s.is_empty() => {
            Err(coded!(40157, "the count field must be a non-empty string"))
        }
        Bson::String(s) if s.starts_with('$') => {
            Err(coded!(40158, "the count field cannot be a $-prefixed path"))
        }
        Bson::String(s) if s.contains('\0') => {
            Err(coded!(40159, "the count field cannot contain a null byte"))
        }
        Bson::String(s) if s.contains('.') => {
            Err(coded!(40160, "the count field cannot contain '.'"))
        }
        Bson::String(s) => Ok(Stage::Count(s.clone())),
        _ => Err(coded!(40156, "the count field must be a non-empty string")),
    }
}

/// The integral argument of `$limit` / `$skip` (a double must be whole).
fn whole_number(stage: &str, v: &Bson) -> Result<i64> {
    match num_of(v) {
        Some(Num::I32(i)) => Ok(i64::from(i)),
        Some(Num::I64(i)) => Ok(i),
        Some(Num::F64(f)) if f.fract() == 0.0 && f.abs() < 9.2e18 => Ok(f as i64),
        // `$skip`: MongoDB's `parseIntegerElementToLong` under 5107200,
        // the element printed with its name.
        None if stage == "$skip" => Err(coded!(
            5107200,
            format!(
                "invalid argument to $skip stage: Expected a number in: $skip: {}",
                crate::error::render_shell(v)
            )
        )),
        None if stage == "$limit" => Err(coded!(15957, "the limit must be specified as a number")),
        _ => Err(Error::bad_value(format!(
            "invalid argument to {stage} stage: Expected an integer: {}",
            crate::error::render(v)
        ))),
    }
}

/// A stage whose specification must be a document got `other`: MongoDB's
/// code and words for each stage (`DocumentSource*::createFromBson`).
fn not_an_object(name: &str, other: &Bson) -> Error {
    let ty = type_name(&Some(other.clone()));
    match name {
        "$match" => coded!(15959, "the match filter must be an expression in an object"),
        "$project" => coded!(15969, "$project specification must be an object"),
        "$group" => coded!(15947, "a group's fields must be specified in an object"),
        "$sort" => coded!(15973, "the $sort key specification must be an object"),
        "$addFields" | "$set" => coded!(
            40272,
            format!("{name} specification stage must be an object, got {ty}")
        ),
        _ => Error::type_mismatch(format!(
            "the {name} stage specification must be an object, not {ty}"
        )),
    }
}

/// A collection name given to a stage (`from`, `coll`, `into`): MongoDB's
/// rules, InvalidNamespace (73) otherwise.
fn collection_name(stage: &str, name: &str) -> Result<String> {
    let bad = name.is_empty()
        || name.contains('\0')
        || name.contains('$')
        || name.starts_with('.')
        || name.starts_with("system.")
        || name.len() > 255;
    if bad {
        return Err(coded!(73, format!("invalid {stage} namespace: {name}")));
    }
    Ok(name.to_string())
}

/// A dotted field path given as a plain string (`as`, `localField`, ...).
fn plain_path(stage: &str, what: &str, s: &str) -> Result<Vec<String>> {
    if s.starts_with('$') {
        return Err(coded!(
            16410,
            format!("{stage} '{what}': FieldPath field names may not start with '$': {s}"),
        ));
    }
    parse_field_path(s)
}
