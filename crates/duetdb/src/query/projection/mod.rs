//! Projections: which fields of a document a query returns, and what it
//! computes. One implementation serves find's `projection` (also
//! findAndModify's `fields`) and the pipeline's `$project` / `$unset`; the
//! two differ only in which forms they accept (their dialect), as MongoDB
//! 4.4+ parses both with one parser (`projection_parser.cpp`).
//!
//! Owns: parsing a projection document into a tree (`parse.rs`:
//! [`Projection::parse_find`] for find, [`Projection::parse_stage_in`] for
//! `$project`, [`Projection::parse_unset`]), and applying the tree to one
//! document (`apply.rs`).
//!
//! Both dialects: inclusion (`{a: 1, "b.c": 1}`), exclusion (`{a: 0}`), the
//! `_id` default (included unless `_id: 0`), nested forms (`{a: {b: 1}}` =
//! `{"a.b": 1}`), dotted paths through arrays of documents, and computed
//! fields: any value that is not a number, a boolean or a sub-projection is
//! an aggregation expression evaluated against the whole input document
//! (`{t: "$a"}`, `{t: {$add: ["$a", 1]}}`, `{t: "$$ROOT"}`, `{t: {$literal:
//! 1}}`, `{a: {b: "$x"}}`), with `$$NOW`, `$$CLUSTER_TIME` and the command's
//! `let` variables in scope.
//! - Find only: `$slice` (`n` or `[skip, limit]`; any other argument is the
//!   `$slice` *expression*, as MongoDB tries both), top-level `$elemMatch`,
//!   positional `a.$` (the element the query's match picked), `{$meta:
//!   "textScore"}` (a `$text` find; elsewhere 40218); `{}` returns the whole
//!   document.
//! - `$project` only: `{}` is refused, errors read `Invalid $project :: caused
//!   by :: …` (`$unset`'s `Invalid $unset …`), code kept, as in MongoDB.
//!
//! Invariants:
//! - The projection's kind is decided as MongoDB's parser decides it: the
//!   first inclusion, exclusion or expression fixes it (`_id` aside), and a
//!   later element of the other kind is refused with MongoDB's code (31253,
//!   31254, 31252, 31310); with none of them, `$slice`, `$elemMatch`,
//!   `$meta` and `_id` decide (`computeProjectionType`).
//! - No path is a prefix of another (31249 / 31250, "Path collision"), so the
//!   projection is a tree whose leaves say what happens to the value reached.
//! - Inclusion keeps document field order; computed fields (and `$elemMatch`
//!   results) follow the included ones at their level, in spec order; an
//!   exclusion's computed field (`$elemMatch`, `$meta`) replaces the field in
//!   place. Through arrays, inclusion keeps only document elements (reduced
//!   to the included fields; a scalar element becomes a document of the
//!   computed fields below, if any) and exclusion keeps every element.
//! - Expressions compare strings under the collation given to
//!   [`Projection::with_collation`] (find: the command's), else under the one
//!   in scope where they run (a pipeline's).
//! - Results nest no deeper than the input (plus computed values); input deeper
//!   than [`crate::doc::MAX_DEPTH`] along a projected path is refused. Never
//!   panics on input.

mod apply;
mod parse;
#[cfg(test)]
mod tests;
#[cfg(test)]
mod tests_find;

use std::sync::Arc;

use bson::{Bson, Document};

use crate::doc::collation::Collator;
use crate::error::Result;
use crate::query::expr::{Expr, Scope};
use crate::query::update::ElemCond;
use crate::query::Filter;

/// A parsed projection.
#[derive(Debug, Clone)]
pub struct Projection {
    mode: Mode,
    root: Node,
    /// A positional `a.$` (find): the path without `.$`, and the query whose
    /// match picks the array element.
    positional: Option<Positional>,
    /// The collation expressions compare strings under (`None`: the one in
    /// scope where the projection runs).
    collator: Option<Arc<Collator>>,
    /// Reads `{$meta: "textScore"}` somewhere.
    text_score: bool,
}

#[derive(Debug, Clone)]
struct Positional {
    path: Vec<String>,
    filter: Box<Filter>,
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Mode {
    /// Empty find projection: the whole document.
    All,
    Include,
    /// Every field not excluded is returned.
    Exclude,
}

/// Which forms a projection document may use (see the module doc).
#[derive(Debug, Clone, Copy, PartialEq)]
enum Dialect {
    Find,
    /// `$project` or `$unset` (the stage's name, for its messages).
    Stage(&'static str),
}

#[derive(Debug, Clone, Default)]
struct Node {
    children: Vec<(String, Node)>,
    leaf: Option<Leaf>,
    /// A computed leaf at or below this node (set once parsing is done), so
    /// applying does not search the subtree for every document.
    has_computed: bool,
}

#[derive(Debug, Clone)]
enum Leaf {
    Include,
    Exclude,
    /// `skip`: elements to skip (negative: from the end); `limit`: how many to keep,
    /// or with `skip == None`, `n` from the front (negative: from the end).
    Slice {
        skip: Option<i64>,
        limit: i64,
    },
    /// Top-level `$elemMatch` (find): the first matching element, as a
    /// one-element array, computed like an expression.
    ElemMatch(Box<ElemCond>),
    /// `a.$` (find): the path is included, then [`Projection::positional`]
    /// picks the element.
    Positional,
    /// The value of an expression on the whole input document.
    Computed(Expr),
}

impl Leaf {
    /// Evaluated against the input document (not copied from it).
    fn is_computed(&self) -> bool {
        matches!(self, Leaf::Computed(_) | Leaf::ElemMatch(_))
    }
}

impl Node {
    fn child(&self, name: &str) -> Option<&Node> {
        self.children
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, n)| n)
    }

    /// Set `has_computed` on this node and every node below; returns it.
    fn mark_computed(&mut self) -> bool {
        let mut any = self.leaf.as_ref().is_some_and(Leaf::is_computed);
        for (_, child) in &mut self.children {
            any |= child.mark_computed();
        }
        self.has_computed = any;
        any
    }

    /// Every leaf slot of the subtree, mutably.
    fn leaves_mut(&mut self, f: &mut impl FnMut(&mut Option<Leaf>)) {
        f(&mut self.leaf);
        for (_, child) in &mut self.children {
            child.leaves_mut(f);
        }
    }
}

impl Projection {
    /// Parse a find projection with no query and no `let` variables (a
    /// positional `a.$` is refused: 51050).
    pub fn parse(spec: &Document) -> Result<Projection> {
        Projection::parse_find(spec, None, None)
    }

    /// Parse a find projection: `query` is the find's filter (what a
    /// positional `a.$` matches again, per document), `let_vars` the
    /// command's `let` (each evaluated once, here; `$$NOW` and
    /// `$$CLUSTER_TIME` are read once too). A `{$meta: "textScore"}` is
    /// refused (40218) unless `query` has a top-level `$text`.
    pub fn parse_find(
        spec: &Document,
        query: Option<&Document>,
        let_vars: Option<&Document>,
    ) -> Result<Projection> {
        let scope = Scope::with_let(let_vars)?;
        let p = parse::parse(spec, Dialect::Find, scope, query)?;
        if p.text_score && !query.is_some_and(|q| q.contains_key("$text")) {
            return Err(crate::query::text::no_text_score());
        }
        Ok(p)
    }

    /// [`Projection::parse_find`] for a `$text` find: `rest` is its filter
    /// without the `$text` (what a positional `a.$` matches), and
    /// `{$meta: "textScore"}` reads the match's score.
    pub(crate) fn parse_text_find(
        spec: &Document,
        rest: &Document,
        let_vars: Option<&Document>,
    ) -> Result<Projection> {
        let scope = Scope::with_let(let_vars)?;
        parse::parse(spec, Dialect::Find, scope, Some(rest))
    }

    /// This (freshly parsed) projection under collation `c`: its
    /// expressions, `$elemMatch` conditions and positional match compare
    /// strings by it, as MongoDB's find projection uses the command's
    /// collation. `None` keeps whatever collation is in scope where it runs.
    pub fn with_collation(mut self, c: Option<Arc<Collator>>) -> Projection {
        let Some(c) = c else {
            return self;
        };
        self.root.leaves_mut(&mut |slot| {
            if let Some(Leaf::ElemMatch(cond)) = slot {
                let old = std::mem::replace(cond.as_mut(), ElemCond::Equal(Bson::Null));
                **cond = old.with_collation(Some(c.clone()));
            }
        });
        if let Some(mut p) = self.positional.take() {
            p.filter = Box::new(p.filter.with_collation(Some(c.clone())));
            self.positional = Some(p);
        }
        self.collator = Some(c);
        self
    }

    /// Does it use a positional `a.$`? (findAndModify refuses one with
    /// `new: true`.)
    pub fn has_positional(&self) -> bool {
        self.positional.is_some()
    }

    /// Does it read `{$meta: "textScore"}`?
    pub fn reads_text_score(&self) -> bool {
        self.text_score
    }

    /// Parse the argument of a `$project` stage.
    pub fn parse_stage(spec: &Document) -> Result<Projection> {
        Projection::parse_stage_in(spec, &Scope::new())
    }

    /// [`Projection::parse_stage`] whose computed fields may use the
    /// variables of `scope` (a pipeline's `let`).
    pub fn parse_stage_in(spec: &Document, scope: &Scope) -> Result<Projection> {
        let dialect = Dialect::Stage("$project");
        if spec.is_empty() {
            return Err(parse::empty_stage_spec(dialect));
        }
        parse::parse(spec, dialect, scope.clone(), None)
    }

    /// `$unset`'s paths as the exclusion projection of each, in order (a
    /// repeated or overlapping path is a path collision, as in MongoDB).
    pub fn parse_unset(paths: &[&str]) -> Result<Projection> {
        parse::parse_exclusions(paths, Dialect::Stage("$unset"))
    }
}
