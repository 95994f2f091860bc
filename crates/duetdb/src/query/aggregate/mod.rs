//! The aggregation pipeline: parsing, the split into a commutative scan part
//! and an ordered rest, and evaluation on documents.
//!
//! Owns: [`Pipeline`] (parsed stages) and its stage parser (here), the
//! per-document and whole-set stages (`stages.rs`), `$group` and its
//! accumulators (`group.rs`), and the split into a commutative scan part with
//! a mergeable state (`split.rs`: [`Split`], [`CommutativePart`],
//! [`PartialState`], [`prepare`]). `$project` and `$unset` are projections of
//! `query::projection` (the one implementation find uses too, in its `$project`
//! dialect). Executing a pipeline on a collection (choosing a scan, OLCP)
//! belongs to `api::aggregate`, which pushes the scanned documents through
//! [`Exec`] (`exec.rs`: push-based execution under the read's limits).
//!
//! Why the split: an OLCP scan (and any parallel scan) hands documents to the
//! query in an arbitrary order, possibly on several threads. A prefix of
//! per-document stages (`$match $project $addFields $set $unset $unwind`)
//! optionally closed by one `$group` whose accumulators are all mergeable can be
//! computed per thread and merged, whatever the order; the rest runs afterwards
//! on the (small) merged output.
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
//! - Memory: a `$group`'s state is bounded ([`GROUP_MEMORY_LIMIT`], or the
//!   read's lower limit; error 292, never spilled); a `$push`/`$addToSet`
//!   array by the 16 MiB document size (error 10334); a `$sort` run by
//!   [`Exec`] by the read's memory limit (spilled, or 292).
//! - Nothing here panics on user input.

mod exec;
mod group;
mod split;
mod stages;
#[cfg(test)]
mod tests;

use bson::{Bson, Document};

use crate::error::{Error, Result};
use crate::query::expr::{num_of, parse_field_path, type_name, Expr, Num};
use crate::query::filter::Filter;
use crate::query::projection::Projection;
use crate::query::sort::SortSpec;

use group::Group;
use stages::{run_stage, Unwind};

pub use exec::Exec;
pub use group::canonical_cmp;
pub use split::{prepare, CommutativePart, PartialState, Prepared, Split};

/// Most stages in one pipeline (MongoDB's default `internalPipelineLengthLimit`).
pub const MAX_PIPELINE_STAGES: usize = 1000;
/// Most memory one `$group` may hold (MongoDB's 100 MB without `allowDiskUse`).
pub const GROUP_MEMORY_LIMIT: usize = 100 * 1024 * 1024;

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
        }
    }

    /// A stage that maps one document to zero or more, independently of others.
    fn is_per_document(&self) -> bool {
        matches!(
            self,
            Stage::Match { .. }
                | Stage::Project(_)
                | Stage::AddFields(_)
                | Stage::Unset(_)
                | Stage::Unwind(_)
        )
    }
}

impl Pipeline {
    /// Parse a pipeline. Unknown stages, malformed arguments and pipelines longer
    /// than [`MAX_PIPELINE_STAGES`] are errors.
    pub fn parse(stages: &[Document]) -> Result<Pipeline> {
        if stages.len() > MAX_PIPELINE_STAGES {
            return Err(Error::bad_value(format!(
                "Pipeline length must be no longer than {MAX_PIPELINE_STAGES} stages"
            )));
        }
        let stages = stages.iter().map(parse_stage).collect::<Result<_>>()?;
        Ok(Pipeline { stages })
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

    /// Evaluate every stage in order on materialized documents (the reference
    /// evaluation, and the "reduce" side after a commutative part).
    pub fn run_on(&self, docs: Vec<Document>) -> Result<Vec<Document>> {
        let mut docs = docs;
        for stage in &self.stages {
            docs = run_stage(stage, docs)?;
        }
        Ok(docs)
    }
}

// ---------------------------------------------------------------- parsing

fn parse_stage(stage: &Document) -> Result<Stage> {
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
            other => Err(Error::type_mismatch(format!(
                "the {name} stage specification must be an object, not {}",
                type_name(&Some(other.clone()))
            ))),
        }
    };
    match name.as_str() {
        "$match" => {
            let spec = want_doc()?.clone();
            Ok(Stage::Match {
                filter: Filter::parse(&spec)?,
                spec,
            })
        }
        "$project" => Ok(Stage::Project(Projection::parse_stage(want_doc()?)?)),
        "$addFields" | "$set" => parse_add_fields(name, want_doc()?),
        "$unset" => parse_unset(arg),
        "$unwind" => Ok(Stage::Unwind(Unwind::parse(arg)?)),
        "$group" => Ok(Stage::Group(Group::parse(want_doc()?)?)),
        "$sort" => {
            let spec = want_doc()?;
            if spec.is_empty() {
                return Err(Error::bad_value(
                    "$sort stage must have at least one sort key",
                ));
            }
            Ok(Stage::Sort(SortSpec::parse(spec)?))
        }
        "$limit" => {
            let n = whole_number(name, arg)?;
            if n <= 0 {
                return Err(Error::bad_value(format!(
                    "the limit must be positive, got {n}"
                )));
            }
            Ok(Stage::Limit(n as u64))
        }
        "$skip" => {
            let n = whole_number(name, arg)?;
            if n < 0 {
                return Err(Error::bad_value(format!(
                    "invalid argument to $skip stage: Expected a non-negative number, got {n}"
                )));
            }
            Ok(Stage::Skip(n as u64))
        }
        "$count" => parse_count(arg),
        other => Err(Error::UnknownOperator(format!(
            "Unrecognized pipeline stage name: '{other}'"
        ))),
    }
}

/// `$addFields` / `$set` (`name` is the one used, for messages).
fn parse_add_fields(name: &str, spec: &Document) -> Result<Stage> {
    let mut fields = Vec::with_capacity(spec.len());
    for (k, v) in spec {
        let path = parse_field_path(k)
            .map_err(|e| Error::bad_value(format!("Invalid {name} :: caused by :: {e}")))?;
        fields.push((path, Expr::parse(v)?));
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
    let mut spec = Document::new();
    for p in paths {
        spec.insert(p, 0);
    }
    Ok(Stage::Unset(Projection::parse_stage(&spec)?))
}

/// `$count: "<field>"`: a plain, non-empty top-level field name.
fn parse_count(arg: &Bson) -> Result<Stage> {
    match arg {
        Bson::String(s) if s.is_empty() => Err(Error::bad_value(
            "the count field must be a non-empty string",
        )),
        Bson::String(s) if s.starts_with('$') => Err(Error::bad_value(
            "the count field cannot be a $-prefixed path",
        )),
        Bson::String(s) if s.contains('.') => {
            Err(Error::bad_value("the count field cannot contain '.'"))
        }
        Bson::String(s) => Ok(Stage::Count(s.clone())),
        _ => Err(Error::type_mismatch(
            "the count field must be a non-empty string",
        )),
    }
}

/// The integral argument of `$limit` / `$skip` (a double must be whole).
fn whole_number(stage: &str, v: &Bson) -> Result<i64> {
    match num_of(v) {
        Some(Num::I32(i)) => Ok(i64::from(i)),
        Some(Num::I64(i)) => Ok(i),
        Some(Num::F64(f)) if f.fract() == 0.0 && f.abs() < 9.2e18 => Ok(f as i64),
        _ => Err(Error::bad_value(format!(
            "invalid argument to {stage} stage: Expected an integer: {}",
            crate::error::render(v)
        ))),
    }
}
