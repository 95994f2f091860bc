//! Update documents: MongoDB's update operators and replacement updates.
//!
//! Owns: the typed form of an update ([`UpdateSpec`] and the operators it holds),
//! its public API (parse, apply, the paths it may touch so the engine can skip
//! index maintenance) and the seed document of an upsert. The work is split by
//! concern:
//! - `parse`: BSON → typed operators, their validation and error codes;
//! - `apply`: applying operators to a document, path lookup and removal;
//! - `arithmetic`: `$inc`, `$mul` and `$min`/`$max`;
//! - `array`: `$push` and its modifiers, `$addToSet`, `$pop`, `$pull`, `$pullAll`;
//! - `elem_cond`: conditions on one array element (`$pull`, `$elemMatch` projection);
//! - `upsert`: the document an upsert starts from;
//! - `conflict`: parse-time path conflicts, as MongoDB's update tree finds them;
//! - `positional`: `arrayFilters` and the per-document resolution of `$`,
//!   `$[]` and `$[<identifier>]`;
//! - `pipeline`: pipeline-style updates (`u: [{$set: …}, …]`).
//!
//! Invariants:
//! - `apply` never mutates its input; it returns the new version or an error, so a
//!   failed update leaves nothing half-applied.
//! - Parsing rejects conflicting paths (one path equal to or a prefix of another,
//!   across all operators, `$rename` sources included) with code 40, so the
//!   operators of one update commute and may be applied one after another;
//!   dynamic paths are resolved per document first, and resolved paths that
//!   meet are refused (40) before anything is applied.
//! - Operators are applied in path order (numeric components numerically, others
//!   bytewise), as MongoDB 5.0+ does; existing fields keep their position and new
//!   fields are appended in that order.
//! - `_id` never changes once the input has one (code 66) and stays the first field.
//! - Values are compared only through [`crate::doc::value`] (`$min`, `$max`,
//!   `$addToSet`, `$pull`), so updates agree with filters and indexes.
//! - Under a collation ([`UpdateSpec::with_collation`], the command's or the
//!   collection's default, as MongoDB's update nodes take the expression
//!   context's collator) strings compare by it in `$min`/`$max`,
//!   `$addToSet`, `$pull` (its conditions too), `$pullAll`, `$push`'s
//!   `$sort`, `arrayFilters` and a pipeline's expressions: [`UpdateSpec::apply`]
//!   puts the collation in scope ([`crate::query::expr::under_collation`])
//!   and the operators compare through [`compare`]; filters inside the
//!   update (`$pull` conditions, `arrayFilters`) are re-keyed by
//!   [`crate::query::Filter::with_collation`].
//! - Results nest at most [`MAX_DEPTH`] levels; paths have at most
//!   [`crate::doc::path::MAX_PATH_COMPONENTS`] components. No input makes this
//!   module panic.

mod apply;
mod arithmetic;
mod array;
mod conflict;
mod elem_cond;
mod parse;
mod pipeline;
mod positional;
mod raw;
mod upsert;

use std::cmp::Ordering;
use std::sync::Arc;

use bson::{Bson, DateTime, Document};

use crate::doc::collation::Collator;
use crate::doc::path::numeric_component;
use crate::doc::MAX_DEPTH;
use crate::error::{render, Error, Result};
use crate::query::sort::SortSpec;
use crate::query::Filter;

pub(crate) use elem_cond::ElemCond;
pub use positional::ArrayFilters;
pub use upsert::upsert_seed;

/// Inputs of one update application besides the document.
#[derive(Debug, Clone, Copy)]
pub struct ApplyContext {
    /// True when the update produces a new document through upsert (enables `$setOnInsert`).
    pub is_upsert_insert: bool,
    /// The time `$currentDate` writes.
    pub now: DateTime,
    /// The array position the query matched (MongoDB's `elemMatchKey`), which
    /// a positional `$` stands for; see [`crate::query::Filter::match_position`].
    pub position: Option<usize>,
}

/// A parsed update: operators (`{$set: …}`) or a replacement document.
#[derive(Debug, Clone)]
pub struct UpdateSpec {
    kind: Kind,
    filters: ArrayFilters,
    /// Some operator path has a `$`, `$[]` or `$[<identifier>]` component.
    dynamic: bool,
    /// Some operator path has a positional `$`.
    positional: bool,
    /// The collation strings compare under while it applies (`None`: binary).
    coll: Option<Arc<Collator>>,
}

#[derive(Debug, Clone)]
enum Kind {
    Replacement(Document),
    /// Sorted by target path (see [`parse::cmp_paths`]); paths as written.
    Operators(Vec<FieldOp>),
    Pipeline(pipeline::UpdatePipeline),
}

/// One operator applied to one path.
#[derive(Debug, Clone)]
struct FieldOp {
    path: Vec<String>,
    op: Op,
}

#[derive(Debug, Clone)]
enum Op {
    Set(Bson),
    SetOnInsert(Bson),
    Unset,
    Inc(Bson),
    Mul(Bson),
    Min(Bson),
    Max(Bson),
    /// `path` of the [`FieldOp`] is the destination.
    Rename {
        from: Vec<String>,
    },
    Push(PushArgs),
    AddToSet(Vec<Bson>),
    /// `true`: remove the first element (`-1`); `false`: the last (`1`).
    Pop(bool),
    Pull(ElemCond),
    PullAll(Vec<Bson>),
    /// `true` for a timestamp, `false` for a date.
    CurrentDate(bool),
    /// `$bit`: the operations in order, each with an int32/int64 operand.
    Bit(Vec<(BitOp, Bson)>),
}

#[derive(Debug, Clone, Copy)]
enum BitOp {
    And,
    Or,
    Xor,
}

#[derive(Debug, Clone)]
struct PushArgs {
    each: Vec<Bson>,
    position: Option<i64>,
    slice: Option<i64>,
    sort: Option<PushSort>,
}

#[derive(Debug, Clone)]
enum PushSort {
    /// Whole elements, ascending when true.
    Whole(bool),
    /// Elements are documents sorted by a pattern.
    Pattern(SortSpec),
}

/// What an operator does at its path, decided from the current value there.
enum Action {
    Keep,
    Set(Bson),
    Remove,
}

impl UpdateSpec {
    /// Parse an update document: all keys `$`-prefixed (operators) or none (replacement).
    pub fn parse(spec: &Document) -> Result<UpdateSpec> {
        UpdateSpec::parse_with(spec, &[])
    }

    /// Parse an update document with the statement's `arrayFilters` (each
    /// must be used by a `$[<identifier>]` of an operator update; a
    /// replacement ignores them, as MongoDB's does).
    pub fn parse_with(spec: &Document, array_filters: &[Document]) -> Result<UpdateSpec> {
        let filters = ArrayFilters::parse(array_filters)?;
        let kind = parse::kind(spec, &filters)?;
        let (dynamic, positional) = match &kind {
            Kind::Operators(ops) => (
                ops.iter()
                    .any(|o| o.path.iter().any(|p| parse::is_dynamic(p))),
                ops.iter().any(|o| o.path.iter().any(|p| p == "$")),
            ),
            _ => (false, false),
        };
        Ok(UpdateSpec {
            kind,
            filters,
            dynamic,
            positional,
            coll: None,
        })
    }

    /// Parse a pipeline-style update (`u: [{$set: …}, …]`): `$addFields`,
    /// `$set`, `$project`, `$unset`, `$replaceRoot`, `$replaceWith`, their
    /// expressions seeing `let_vars` (the command's `let` and the
    /// statement's `c`). `arrayFilters` are refused with it (9).
    pub fn parse_pipeline(
        stages: &[Bson],
        let_vars: Option<&Document>,
        array_filters: &[Document],
    ) -> Result<UpdateSpec> {
        if !array_filters.is_empty() {
            return Err(parse::failed_to_parse(
                "arrayFilters may not be specified for pipeline-style updates",
            ));
        }
        Ok(UpdateSpec {
            kind: Kind::Pipeline(pipeline::UpdatePipeline::parse(stages, let_vars)?),
            filters: ArrayFilters::default(),
            dynamic: false,
            positional: false,
            coll: None,
        })
    }

    /// This update applied under collation `c` (`None`: binary): its value
    /// comparisons, `$pull` conditions, `arrayFilters`, `$push` `$sort` and
    /// pipeline expressions compare strings by it, as MongoDB's do under
    /// the command's collation. A spec already under a collation keeps it
    /// (its filters' operands are keys already: keying them again would
    /// corrupt them).
    pub fn with_collation(mut self, c: Option<Arc<Collator>>) -> UpdateSpec {
        if self.coll.is_some() || c.is_none() {
            return self;
        }
        if let Kind::Operators(ops) = &mut self.kind {
            for fop in ops.iter_mut() {
                match &mut fop.op {
                    Op::Pull(cond) => *cond = cond.clone().with_collation(c.clone()),
                    Op::Push(PushArgs {
                        sort: Some(PushSort::Pattern(spec)),
                        ..
                    }) => *spec = spec.clone().with_collation(c.clone()),
                    _ => {}
                }
            }
        }
        self.filters = std::mem::take(&mut self.filters).with_collation(c.clone());
        self.coll = c;
        self
    }

    /// A replacement document (no operators)?
    pub fn is_replacement(&self) -> bool {
        matches!(self.kind, Kind::Replacement(_))
    }

    /// A pipeline-style update? (It may rewrite the whole document, like a
    /// replacement.)
    pub fn is_pipeline(&self) -> bool {
        matches!(self.kind, Kind::Pipeline(_))
    }

    /// Does applying need the array position the query matched (a positional `$`)?
    pub fn needs_position(&self) -> bool {
        self.positional
    }

    /// Would applying this update to `old` (a stored document `filter`
    /// matched) change it? Computed as the write computes it; nothing is
    /// written (explain of an update reports `nWouldModify`).
    pub fn would_modify(&self, old: &bson::RawDocument, filter: &Filter) -> Result<bool> {
        let repeats = crate::doc::repeated::has_repeated_names(old);
        let doc = if repeats {
            crate::doc::repeated::to_document_marked(old)?
        } else {
            crate::doc::to_document(old)?
        };
        let position = if self.positional {
            filter.match_position(old).flatten()
        } else {
            None
        };
        let ctx = ApplyContext {
            is_upsert_insert: false,
            now: DateTime::now(),
            position,
        };
        let new = self.apply(&doc, &ctx)?;
        let new = if repeats {
            crate::doc::repeated::to_raw_unmarked(&new)?
        } else {
            crate::doc::to_raw_document(&new)?
        };
        Ok(new.as_bytes() != old.as_bytes())
    }

    /// The new version of stored document `old` (an update of it, not an
    /// upsert's insert) built from its bytes, when the update is one `raw.rs`
    /// patches (top-level `$set`/`$inc`/`$unset`); `None`: use
    /// [`UpdateSpec::apply`], which gives the same document or the error.
    pub fn patch_raw(&self, old: &bson::RawDocument) -> Option<bson::RawDocumentBuf> {
        raw::patch(self, old)
    }

    /// The new version of `doc`.
    pub fn apply(&self, doc: &Document, ctx: &ApplyContext) -> Result<Document> {
        crate::query::expr::under_collation(self.coll.as_ref(), || self.apply_here(doc, ctx))
    }

    /// [`UpdateSpec::apply`] with the collation in scope.
    fn apply_here(&self, doc: &Document, ctx: &ApplyContext) -> Result<Document> {
        let mut out = match &self.kind {
            Kind::Replacement(repl) => apply::apply_replacement(repl, doc)?,
            Kind::Pipeline(p) => apply::apply_replacement(&p.run(doc)?, doc)?,
            Kind::Operators(ops) => {
                let mut out = doc.clone();
                if self.dynamic {
                    let plan = positional::resolve_all(ops, doc, ctx.position, &self.filters)?;
                    for (path, op) in plan {
                        apply::apply_op(op, &path, &mut out, doc, ctx)?;
                    }
                } else {
                    for op in ops {
                        apply::apply_op(op, &op.path, &mut out, doc, ctx)?;
                    }
                }
                apply::check_id_unchanged(doc, &out)?;
                out
            }
        };
        apply::id_first(&mut out);
        if apply::too_deep_doc(&out, 1) {
            return Err(Error::NestingTooDeep { limit: MAX_DEPTH });
        }
        Ok(out)
    }

    /// The top-level-rooted paths this update may change. Paths are cut before their
    /// first numeric component (`a.0.b` → `a`) because such a change is seen by
    /// index paths like `a.b`. A replacement returns `[""]`: the root, which is a
    /// prefix of every path. Use [`UpdateSpec::may_affect`] to test an index path.
    pub fn modified_paths(&self) -> Vec<String> {
        let Kind::Operators(ops) = &self.kind else {
            // A replacement or a pipeline may change anything.
            return vec![String::new()];
        };
        let mut out: Vec<String> = Vec::new();
        let mut add = |p: &[String]| {
            let s = cut_at_numeric(p).join(".");
            if !out.contains(&s) {
                out.push(s);
            }
        };
        for op in ops {
            add(&op.path);
            if let Op::Rename { from, .. } = &op.op {
                add(from);
            }
        }
        out
    }

    /// Can this update change the values reached by `index_path` (a dotted path)?
    /// Conservative: true whenever a modified path and `index_path` overlap.
    pub fn may_affect(&self, index_path: &str) -> bool {
        let ip: Vec<String> = index_path.split('.').map(str::to_string).collect();
        let ip = cut_at_numeric(&ip);
        self.modified_paths().iter().any(|m| {
            if m.is_empty() {
                return true;
            }
            let mp: Vec<&str> = m.split('.').collect();
            mp.iter().zip(ip.iter()).all(|(a, b)| *a == b.as_str())
        })
    }
}

/// `p` up to (not including) its first numeric or dynamic (`$`, `$[…]`)
/// component after the first: an index on `a.b` sees a change to `a.0.b` or
/// `a.$[].b`, so all must compare as `a`.
fn cut_at_numeric(p: &[String]) -> &[String] {
    let end = p
        .iter()
        .enumerate()
        .skip(1)
        .find(|(_, c)| numeric_component(c).is_some() || parse::is_dynamic(c))
        .map(|(i, _)| i)
        .unwrap_or(p.len());
    &p[..end]
}

/// `a` against `b` in BSON order, strings under the collation in scope
/// (the update's, while [`UpdateSpec::apply`] runs).
fn compare(a: &Bson, b: &Bson) -> Ordering {
    match crate::query::expr::collation_in_scope() {
        // In key space, as filters and collated indexes compare.
        Some(c) => crate::doc::value::compare_bson(&c.key_bson(a), &c.key_bson(b)),
        None => crate::doc::value::compare_bson(a, b),
    }
}

/// `a` equals `b` under [`compare`].
fn equal(a: &Bson, b: &Bson) -> bool {
    compare(a, b) == Ordering::Equal
}

/// `{_id: …}` of the document being updated, for error messages (as MongoDB
/// names the document it failed on).
fn id_render(doc: &Document) -> String {
    match doc.get("_id") {
        Some(id) => format!("{{_id: {}}}", render(id)),
        None => "{}".to_string(),
    }
}

#[cfg(test)]
mod tests;
#[cfg(test)]
mod tests_array;
