//! Query filters: MongoDB's query language parsed once into a compact predicate
//! tree and evaluated directly on raw documents.
//!
//! Owns the meaning of every query operator (`$eq` … `$mod`, `$and`/`$or`/`$nor`,
//! `$not`, `$elemMatch`, `$all`, regexes, the `$bits*` operators, `$expr`,
//! `$jsonSchema`, `$comment`; the geo operators' arguments and predicates are
//! `query::geo`'s) and the extraction of index-answerable
//! predicates ([`Filter::sargs`]) that the planner uses.
//!
//! Invariants:
//! - Every comparison goes through [`crate::doc::value`] (`compare`, `equal`,
//!   `canonical_rank`), so a filter agrees with index order and with sort.
//! - A condition on a path is existential over the values the path reaches
//!   (MongoDB's implicit array traversal, the rule of [`crate::doc::path`]): it matches
//!   when any reached value matches, and a reached array also stands for each of
//!   its elements — except for `$size`, `$elemMatch` and `$exists`, which look at
//!   the reached values themselves, and an array element picked by a final
//!   numeric component (`a.0`), which is taken whole. Negations (`$ne`, `$nin`,
//!   `$not`, `$nor`, `$exists: false`) negate the whole existential.
//! - A path that reaches nothing where a field is absent (a missing field, a
//!   scalar in the middle of the path, an array element document lacking the
//!   field) yields "missing", which only null equality (`$eq`/`$in`/`$lte`/`$gte`
//!   with `null`) matches.
//! - Parsing rejects every malformed filter with an error; `matches` never panics
//!   whatever the document's shape (malformed elements count as absent) and
//!   walks paths with callbacks instead of building per-document Vecs.
//! - Filter nesting is bounded by [`MAX_FILTER_DEPTH`], so evaluation recursion is
//!   bounded too (path walking recurses at most once per path component).
//! - [`Filter::sargs`] returns only conditions that every matching document
//!   satisfies (a superset of the matches, never a subset; see [`Sarg`]).
//!
//! Layout, one concern a file: `tree` (the typed predicate tree), `parse`
//! (BSON to tree, every error message), `eval` (matching on raw documents) with
//! `walk` (the implicit array traversal), `sarg` (index-answerable predicates
//! for the planner), `expr` (`$expr`), `bits` (`$bits*`), `schema`
//! (`$jsonSchema`), `tests`.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use bson::raw::RawDocument;
use bson::Document;

use crate::doc::collation::Collator;
use crate::error::Result;

mod bits;
mod eval;
mod expr;
mod parse;
mod sarg;
mod schema;
#[cfg(test)]
mod tests;
mod tree;
mod walk;

pub use sarg::Sarg;

use eval::Ctx;
use parse::parse_query;
use tree::Node;

/// How deeply `$and`/`$or`/`$nor`/`$not`/`$elemMatch` may nest (MongoDB's limit).
pub const MAX_FILTER_DEPTH: usize = 100;

/// A parsed MongoDB filter document.
#[derive(Debug, Clone)]
pub struct Filter {
    root: Node,
    /// The error slots of its `$expr`s (empty without one).
    expr_errors: Vec<expr::ErrorSlot>,
    /// Counters of what the read examined (explain's `executionStats`),
    /// when asked for: carried by the filter because every executor — the
    /// planner's walks, VLS, OLCP, `none` — holds it and tests each examined
    /// document with [`Filter::matches`] exactly once.
    examined: Option<Arc<Examined>>,
    /// The collation its string comparisons use (`None`: simple, binary).
    collator: Option<Arc<Collator>>,
}

/// What a read examined, counted as it runs (see [`Filter::count_into`]).
#[derive(Debug, Default)]
pub struct Examined {
    /// Documents tested against the filter (MongoDB's `docsExamined`).
    pub docs: AtomicU64,
    /// Index entries (and `_id` lookups) visited (`keysExamined`).
    pub keys: AtomicU64,
    /// Documents that matched (what the scan stage returned).
    pub matched: AtomicU64,
}

impl Examined {
    /// `(keys, docs, matched)` so far.
    pub fn get(&self) -> (u64, u64, u64) {
        (
            self.keys.load(Ordering::Relaxed),
            self.docs.load(Ordering::Relaxed),
            self.matched.load(Ordering::Relaxed),
        )
    }
}

impl Filter {
    /// Parse a filter document; unknown operators and malformed arguments are errors.
    pub fn parse(spec: &Document) -> Result<Filter> {
        Filter::parse_with_let(spec, None)
    }

    /// Parse a filter whose `$expr`s may use the command's `let` variables
    /// (each evaluated once, here; `$$NOW` is read once too).
    pub fn parse_with_let(spec: &Document, let_vars: Option<&Document>) -> Result<Filter> {
        let root = parse_query(spec, 0).map_err(|e| *e)?;
        // MongoDB's rules for `$near`: one, in the top-level conjunction.
        let near = sarg::count_near(&root);
        if near > 1 {
            return Err(crate::error::Error::bad_value(
                "Too many geoNear expressions",
            ));
        }
        if near == 1
            && !sarg::geo_sargs(&root)
                .iter()
                .any(|(_, g)| g.as_near().is_some())
        {
            return Err(crate::error::Error::bad_value(
                "geo near must be top-level expr",
            ));
        }
        let mut root = root;
        let mut expr_errors = Vec::new();
        let mut scope = None;
        compile_exprs(&mut root, let_vars, &mut scope, &mut expr_errors)?;
        Ok(Filter {
            root,
            expr_errors,
            examined: None,
            collator: None,
        })
    }

    /// This filter comparing strings under `c` (MongoDB's `collation`
    /// option): the operands of its equalities, comparisons and `$in`s
    /// become collation keys, at any depth (`$elemMatch`, `$not`, `$or`), so
    /// its sargs are in the key space of an index with the same collation.
    /// `None` keeps the simple (binary) comparison. `$expr` and `$jsonSchema`
    /// compare as before (a documented gap), as do regexes (as MongoDB's).
    pub fn with_collation(mut self, c: Option<Arc<Collator>>) -> Filter {
        if let Some(c) = &c {
            collate(&mut self.root, c);
        }
        self.collator = c;
        self
    }

    /// The collation of its string comparisons (`None`: simple).
    pub fn collator(&self) -> Option<&Arc<Collator>> {
        self.collator.as_ref()
    }

    /// Count what reads with this filter examine into `counters`: each
    /// [`Filter::matches`] is a document examined, each
    /// [`Filter::count_key`] an index entry. A counting filter is never
    /// "match all", so executors test (and count) every document.
    pub fn count_into(&mut self, counters: Arc<Examined>) {
        self.examined = Some(counters);
    }

    /// An executor visited one index entry (or `_id` lookup).
    #[inline]
    pub fn count_key(&self) {
        self.count_keys(1);
    }

    /// An executor visited `n` index entries.
    #[inline]
    pub fn count_keys(&self, n: u64) {
        if let Some(c) = &self.examined {
            c.keys.fetch_add(n, Ordering::Relaxed);
        }
    }

    /// `spec` with the command's `let` variables bound around each of its
    /// `$expr`s (`{$expr: E}` becomes `{$expr: {$let: {vars: let, in: E}}}`),
    /// so that a filter document carries its variables wherever the engine
    /// takes it (find, count, delete, update, findAndModify). The variables'
    /// names and values are checked here (16866–16871, 17276), even when the
    /// filter has no `$expr`.
    pub fn bind_let(spec: &Document, let_vars: Option<&Document>) -> Result<Document> {
        let Some(vars) = let_vars else {
            return Ok(spec.clone());
        };
        crate::query::expr::Scope::with_let(Some(vars))?;
        Ok(expr::bind_let(spec, vars))
    }

    /// The first error an `$expr` raised while matching (a query that met
    /// one fails with it, as MongoDB's does); `Ok` when none did. Executors
    /// call this after a scan.
    pub fn check(&self) -> Result<()> {
        for slot in &self.expr_errors {
            if let Some(e) = slot.lock().clone() {
                return Err(e);
            }
        }
        Ok(())
    }

    /// True when the filter matches every document (`{}`) and need not be
    /// tested (a counting filter always is, see [`Filter::count_into`]).
    pub fn is_match_all(&self) -> bool {
        self.examined.is_none() && self.root.is_always_true()
    }

    /// Does `doc` match?
    pub fn matches(&self, doc: &RawDocument) -> bool {
        let m = self.root.eval(Ctx::Doc(doc));
        if let Some(c) = &self.examined {
            c.docs.fetch_add(1, Ordering::Relaxed);
            if m {
                c.matched.fetch_add(1, Ordering::Relaxed);
            }
        }
        m
    }

    /// Does `doc` match, and through which array position? `Some(Some(i))`:
    /// it matched and a leaf of the top-level conjunction matched through
    /// element `i` of the outermost array on its path (the last such leaf);
    /// `Some(None)`: it matched through no array position; `None`: no match.
    /// What a positional `$` in an update stands for, as MongoDB's
    /// `elemMatchKey`.
    pub fn match_position(&self, doc: &RawDocument) -> Option<Option<usize>> {
        let mut pos = None;
        self.root.eval_pos(doc, &mut pos).then_some(pos)
    }

    /// Index-answerable predicates of the top-level conjunction, per path.
    ///
    /// Only conditions every matching document satisfies are returned: top-level
    /// fields and members of (nested) top-level `$and`s. Nothing comes from
    /// negations, `$exists`, regexes, `$elemMatch` or `$or`/`$nor`.
    pub fn sargs(&self) -> Vec<(String, Sarg)> {
        sarg::sargs(&self.root)
    }

    /// The geo operators of the top-level conjunction, per path (what a
    /// 2dsphere index may answer; see [`crate::query::geo`]).
    pub fn geo_sargs(&self) -> Vec<(String, Arc<crate::query::geo::GeoQuery>)> {
        sarg::geo_sargs(&self.root)
    }

    /// The filter's `$near`/`$nearSphere` (at most one, top-level), as the
    /// distance order it imposes on results.
    pub fn near(&self) -> Option<crate::query::geo::NearSort> {
        self.geo_sargs()
            .into_iter()
            .find(|(_, g)| g.as_near().is_some())
            .map(|(path, near)| crate::query::geo::NearSort { path, near })
    }
}

/// Rewrite the operands of the tree's leaves as collation keys (see
/// [`Filter::with_collation`]).
fn collate(node: &mut Node, c: &Arc<Collator>) {
    match node {
        Node::And(ch) | Node::Or(ch) | Node::Nor(ch) => ch.iter_mut().for_each(|n| collate(n, c)),
        Node::Not(n) => collate(n, c),
        Node::Expr(e) => e.coll = Some(c.clone()),
        Node::Schema(_) => {}
        Node::Leaf(leaf) => {
            match &mut leaf.op {
                tree::Op::Eq(v) | tree::Op::Cmp(_, v) => *v = c.key_raw(v.as_raw_bson_ref()),
                tree::Op::In(set) => {
                    let mut keys: Vec<bson::RawBson> = set
                        .values
                        .iter()
                        .map(|v| c.key_raw(v.as_raw_bson_ref()))
                        .collect();
                    keys.sort_by(|a, b| {
                        crate::doc::value::compare(a.as_raw_bson_ref(), b.as_raw_bson_ref())
                    });
                    keys.dedup_by(|a, b| {
                        crate::doc::value::equal(a.as_raw_bson_ref(), b.as_raw_bson_ref())
                    });
                    set.values = keys;
                }
                tree::Op::ElemMatchObject(n) | tree::Op::ElemMatchValue(n) => collate(n, c),
                _ => {}
            }
            leaf.coll = Some(c.clone());
        }
    }
}

/// Compile every `$expr` of the tree in one scope (built on the first one).
fn compile_exprs(
    node: &mut Node,
    let_vars: Option<&Document>,
    scope: &mut Option<crate::query::expr::Scope>,
    errors: &mut Vec<expr::ErrorSlot>,
) -> Result<()> {
    match node {
        Node::And(c) | Node::Or(c) | Node::Nor(c) => {
            for n in c {
                compile_exprs(n, let_vars, scope, errors)?;
            }
        }
        Node::Not(n) => compile_exprs(n, let_vars, scope, errors)?,
        Node::Expr(e) => {
            if scope.is_none() {
                *scope = Some(crate::query::expr::Scope::with_let(let_vars)?);
            }
            if let Some(s) = scope.as_mut() {
                e.compile(s)?;
            }
            errors.push(e.error.clone());
        }
        Node::Leaf(tree::Leaf {
            op: tree::Op::ElemMatchObject(n) | tree::Op::ElemMatchValue(n),
            ..
        }) => compile_exprs(n, let_vars, scope, errors)?,
        Node::Leaf(_) | Node::Schema(_) => {}
    }
    Ok(())
}
