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
//! - `upsert`: the document an upsert starts from.
//!
//! Invariants:
//! - `apply` never mutates its input; it returns the new version or an error, so a
//!   failed update leaves nothing half-applied.
//! - Parsing rejects conflicting paths (one path equal to or a prefix of another,
//!   across all operators, `$rename` sources included) with code 40, so the
//!   operators of one update commute and may be applied one after another.
//! - Operators are applied in path order (numeric components numerically, others
//!   bytewise), as MongoDB 5.0+ does; existing fields keep their position and new
//!   fields are appended in that order.
//! - `_id` never changes once the input has one (code 66) and stays the first field.
//! - Values are compared only through [`crate::doc::value`] (`$min`, `$max`,
//!   `$addToSet`, `$pull`), so updates agree with filters and indexes.
//! - Results nest at most [`MAX_DEPTH`] levels; paths have at most
//!   [`crate::doc::path::MAX_PATH_COMPONENTS`] components. No input makes this
//!   module panic.

mod apply;
mod arithmetic;
mod array;
mod elem_cond;
mod parse;
mod upsert;

use bson::{Bson, DateTime, Document};

use crate::doc::path::numeric_component;
use crate::doc::MAX_DEPTH;
use crate::error::{render, Error, Result};
use crate::query::sort::SortSpec;

pub(crate) use elem_cond::ElemCond;
pub use upsert::upsert_seed;

/// Inputs of one update application besides the document.
#[derive(Debug, Clone, Copy)]
pub struct ApplyContext {
    /// True when the update produces a new document through upsert (enables `$setOnInsert`).
    pub is_upsert_insert: bool,
    /// The time `$currentDate` writes.
    pub now: DateTime,
}

/// A parsed update: operators (`{$set: …}`) or a replacement document.
#[derive(Debug, Clone)]
pub struct UpdateSpec {
    kind: Kind,
}

#[derive(Debug, Clone)]
enum Kind {
    Replacement(Document),
    /// Sorted by target path (see [`parse::cmp_paths`]).
    Operators(Vec<FieldOp>),
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
        to: Vec<String>,
    },
    Push(PushArgs),
    AddToSet(Vec<Bson>),
    /// `true`: remove the first element (`-1`); `false`: the last (`1`).
    Pop(bool),
    Pull(ElemCond),
    PullAll(Vec<Bson>),
    /// `true` for a timestamp, `false` for a date.
    CurrentDate(bool),
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
        Ok(UpdateSpec {
            kind: parse::kind(spec)?,
        })
    }

    /// A replacement document (no operators)?
    pub fn is_replacement(&self) -> bool {
        matches!(self.kind, Kind::Replacement(_))
    }

    /// The new version of `doc`.
    pub fn apply(&self, doc: &Document, ctx: &ApplyContext) -> Result<Document> {
        let mut out = match &self.kind {
            Kind::Replacement(repl) => apply::apply_replacement(repl, doc)?,
            Kind::Operators(ops) => {
                let mut out = doc.clone();
                for op in ops {
                    apply::apply_op(op, &mut out, doc, ctx)?;
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

/// `p` up to (not including) its first numeric component after the first: an
/// index on `a.b` sees a change to `a.0.b`, so both must compare as `a`.
fn cut_at_numeric(p: &[String]) -> &[String] {
    let end = p
        .iter()
        .enumerate()
        .skip(1)
        .find(|(_, c)| numeric_component(c).is_some())
        .map(|(i, _)| i)
        .unwrap_or(p.len());
    &p[..end]
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
