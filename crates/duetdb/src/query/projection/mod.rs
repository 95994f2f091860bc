//! Projections: which fields of a document a query returns. One
//! implementation serves find's `projection` and the pipeline's `$project` /
//! `$unset`; the two differ only in which forms they accept (their dialect).
//!
//! Owns: parsing a projection document into a tree ([`Projection::parse`] for
//! find, [`Projection::parse_stage`] for `$project`), and applying the tree to
//! one document (`apply.rs`).
//!
//! Both dialects: inclusion (`{a: 1, "b.c": 1}`), exclusion (`{a: 0}`), the
//! `_id` default (included unless `_id: 0`), nested forms (`{a: {b: 1}}` =
//! `{"a.b": 1}`), dotted paths through arrays of documents.
//! - Find only: `$slice` (`n` or `[skip, limit]`) and top-level `$elemMatch`;
//!   `{}` returns the whole document. Any other value (an expression, `$meta`)
//!   and positional `a.$` are refused with BadValue: find does not evaluate
//!   aggregation expressions (MongoDB 4.4+ does; see the tests pinning it).
//! - `$project` only: a computed field — any value that is not a number, a
//!   boolean or a sub-projection is an aggregation expression, evaluated
//!   against the whole input document (`{sum: {$add: ["$a", "$b"]}}`); `{}` is
//!   refused, and errors read `Invalid $project :: caused by :: …` as in
//!   MongoDB. There `{$slice: …}` is the `$slice` *expression*, not the find
//!   operator.
//!
//! Invariants:
//! - Inclusion and exclusion never mix, except `_id` (MongoDB's messages); a
//!   computed field counts as an inclusion.
//! - No path is a prefix of another ("Path collision"), so the projection is a
//!   tree whose leaves say what happens to the value reached.
//! - Inclusion keeps document field order; computed fields follow the included
//!   ones at their level, in spec order; `$elemMatch` fields come last (as in
//!   MongoDB 4.4+). Through arrays, inclusion keeps only document elements
//!   (reduced to the included fields; a scalar element becomes a document of
//!   the computed fields below, if any) and exclusion keeps every element.
//! - An exclusion never evaluates an expression (a computed `_id` next to
//!   exclusions is dropped, as this engine always did).
//! - Results nest no deeper than the input (plus computed values); input deeper
//!   than [`crate::doc::MAX_DEPTH`] along a projected path is refused. Never
//!   panics on input.

mod apply;
#[cfg(test)]
mod tests;

use bson::{Bson, Document};

use crate::doc::path;
use crate::doc::MAX_DEPTH;
use crate::error::{render, Error, Result};
use crate::query::expr::{truthy_bson, Expr, Scope};
use crate::query::update::ElemCond;

/// A parsed projection.
#[derive(Debug, Clone)]
pub struct Projection {
    mode: Mode,
    root: Node,
    /// Top-level `$elemMatch` fields, in spec order.
    elem_matches: Vec<(String, ElemCond)>,
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Mode {
    /// Empty projection: the whole document.
    All,
    Include,
    /// Exclusion, or only `$slice`/`$elemMatch`: every other field is returned.
    Exclude,
}

/// Which forms a projection document may use (see the module doc).
#[derive(Debug, Clone, Copy, PartialEq)]
enum Dialect {
    Find,
    /// `$project` and `$unset`.
    Stage,
}

impl Dialect {
    /// A BadValue error in this dialect's wording.
    fn error(self, msg: impl std::fmt::Display) -> Error {
        match self {
            Dialect::Find => Error::bad_value(msg.to_string()),
            Dialect::Stage => Error::bad_value(format!("Invalid $project :: caused by :: {msg}")),
        }
    }

    /// [`Dialect::error`] with MongoDB's own code for it.
    fn coded(self, code: i32, name: &'static str, msg: impl std::fmt::Display) -> Error {
        let msg = match self.error(msg) {
            Error::BadValue(m) => m,
            other => other.to_string(),
        };
        Error::Coded { code, name, msg }
    }
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
    /// Handled after the tree pass (see `elem_matches`).
    ElemMatch,
    /// `$project` only: the value of an expression on the whole input document.
    Computed(Expr),
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
        let mut any = matches!(self.leaf, Some(Leaf::Computed(_)));
        for (_, child) in &mut self.children {
            any |= child.mark_computed();
        }
        self.has_computed = any;
        any
    }
}

/// Parse-time bookkeeping.
struct State {
    dialect: Dialect,
    /// An inclusion or a computed field other than `_id` was given.
    has_include: bool,
    /// An exclusion other than `_id` was given.
    has_exclude: bool,
    /// `_id: 0` was given.
    id_excluded: bool,
    /// A `$slice` or `$elemMatch` was given (find).
    has_operator: bool,
    root: Node,
    elem_matches: Vec<(String, ElemCond)>,
    /// Variables computed fields may use (a pipeline's `let`).
    scope: Scope,
}

impl Projection {
    /// Parse a find projection document.
    pub fn parse(spec: &Document) -> Result<Projection> {
        parse(spec, Dialect::Find, Scope::new())
    }

    /// This (freshly parsed) projection under collation `c`: its
    /// `$elemMatch` conditions compare strings by it, as MongoDB's find
    /// projection uses the command's collation. (Computed fields compare
    /// under the collation in scope where they run: a pipeline's.)
    pub fn with_collation(
        mut self,
        c: Option<std::sync::Arc<crate::doc::collation::Collator>>,
    ) -> Projection {
        if c.is_some() {
            self.elem_matches = std::mem::take(&mut self.elem_matches)
                .into_iter()
                .map(|(k, cond)| (k, cond.with_collation(c.clone())))
                .collect();
        }
        self
    }

    /// Parse the argument of a `$project` stage (and of `$unset`, given as
    /// the exclusion of its paths).
    pub fn parse_stage(spec: &Document) -> Result<Projection> {
        Projection::parse_stage_in(spec, &Scope::new())
    }

    /// [`Projection::parse_stage`] whose computed fields may use the
    /// variables of `scope` (a pipeline's `let`).
    pub fn parse_stage_in(spec: &Document, scope: &Scope) -> Result<Projection> {
        if spec.is_empty() {
            return Err(
                Dialect::Stage.error("projection specification must have at least one field")
            );
        }
        parse(spec, Dialect::Stage, scope.clone())
    }
}

fn parse(spec: &Document, dialect: Dialect, scope: Scope) -> Result<Projection> {
    let mut st = State {
        scope,
        dialect,
        has_include: false,
        has_exclude: false,
        id_excluded: false,
        has_operator: false,
        root: Node::default(),
        elem_matches: Vec::new(),
    };
    parse_into(spec, &[], &mut st, 1)?;
    let mode = if st.has_include {
        Mode::Include
    } else if st.has_exclude || st.id_excluded || st.has_operator {
        // Only `$slice`/`$elemMatch` (find): every other field is returned.
        Mode::Exclude
    } else if spec.is_empty() {
        Mode::All
    } else {
        // Nothing but `_id: 1` or a computed `_id`.
        Mode::Include
    };
    let mut root = st.root;
    if mode == Mode::Include && root.child("_id").is_none() {
        root.children
            .push(("_id".to_string(), leaf_node(Leaf::Include)));
    }
    root.mark_computed();
    Ok(Projection {
        mode,
        root,
        elem_matches: st.elem_matches,
    })
}

fn leaf_node(leaf: Leaf) -> Node {
    Node {
        leaf: Some(leaf),
        ..Node::default()
    }
}

fn parse_into(spec: &Document, prefix: &[String], st: &mut State, depth: usize) -> Result<()> {
    if depth > MAX_DEPTH {
        return Err(Error::NestingTooDeep { limit: MAX_DEPTH });
    }
    for (k, v) in spec {
        let full = spec_path(prefix, k, st.dialect)?;
        match v {
            Bson::Document(sub) if sub.is_empty() => {
                return Err(st.dialect.error(format!(
                    "An empty sub-projection is not a valid value. Found empty object at \
                     path {}",
                    full.join(".")
                )));
            }
            // A sub-projection, unless its first key names an operator.
            Bson::Document(sub) if sub.keys().next().is_some_and(|f| !f.starts_with('$')) => {
                parse_into(sub, &full, st, depth + 1)?;
            }
            _ => {
                let leaf = parse_leaf(v, &full, st)?;
                add_leaf(st, &full, leaf)?;
            }
        }
    }
    Ok(())
}

/// The components of spec key `k` below `prefix`, validated.
fn spec_path(prefix: &[String], k: &str, dialect: Dialect) -> Result<Vec<String>> {
    path::validate(k).map_err(|e| dialect.error(format!("invalid projection path: {e}")))?;
    let mut full: Vec<String> = prefix.to_vec();
    full.extend(k.split('.').map(str::to_string));
    let dotted = full.join(".");
    if full.len() > path::MAX_PATH_COMPONENTS {
        return Err(dialect.error(format!("projection path '{dotted}' is too long")));
    }
    if let Some(p) = full.iter().find(|p| p.starts_with('$')) {
        return Err(dialect.error(format!(
            "projection path '{dotted}': '{p}' is not supported (positional and \
             $-prefixed projections are not supported)"
        )));
    }
    Ok(full)
}

/// What happens at `full`: a number or boolean includes or excludes; anything
/// else is an operator (find) or an expression (`$project`).
fn parse_leaf(v: &Bson, full: &[String], st: &mut State) -> Result<Leaf> {
    match v {
        Bson::Boolean(_)
        | Bson::Int32(_)
        | Bson::Int64(_)
        | Bson::Double(_)
        | Bson::Decimal128(_) => Ok(if truthy_bson(v) {
            Leaf::Include
        } else {
            Leaf::Exclude
        }),
        // MongoDB's `$project` names itself in an expression's parse error,
        // which keeps its code: `Invalid $project :: caused by :: …`.
        _ if st.dialect == Dialect::Stage => Expr::parse_in(v, &mut st.scope)
            .map(Leaf::Computed)
            .map_err(|e| match e {
                e @ Error::Optimize(_) => e,
                e => Error::Coded {
                    code: e.code(),
                    name: e.code_name(),
                    msg: format!("Invalid $project :: caused by :: {e}"),
                },
            }),
        Bson::Document(sub) => parse_find_operator(sub, v, full, st),
        other => Err(Error::bad_value(format!(
            "projection value {} for field {} is not supported (use 1/true to \
             include or 0/false to exclude; expressions are not supported)",
            render(other),
            full.join(".")
        ))),
    }
}

/// `{$slice: …}` or `{$elemMatch: …}` in a find projection.
fn parse_find_operator(sub: &Document, v: &Bson, full: &[String], st: &mut State) -> Result<Leaf> {
    let dotted = full.join(".");
    if sub.len() != 1 {
        return Err(Error::bad_value(format!(
            "projection operator for field {dotted} must be the only key: {}",
            render(v)
        )));
    }
    match sub.iter().next() {
        Some((op, arg)) if op == "$slice" => parse_slice(&dotted, arg),
        Some((op, arg)) if op == "$elemMatch" => {
            if full.len() != 1 {
                return Err(Error::bad_value(format!(
                    "Cannot use $elemMatch projection on a nested field: {dotted}"
                )));
            }
            if !matches!(arg, Bson::Document(_)) {
                return Err(Error::bad_value(
                    "elemMatch: Invalid argument, object required.",
                ));
            }
            st.elem_matches.push((dotted, ElemCond::parse(arg)?));
            Ok(Leaf::ElemMatch)
        }
        Some((op, _)) => Err(Error::bad_value(format!(
            "projection operator {op} on field {dotted} is not supported"
        ))),
        None => Err(Error::Internal("empty projection operator".into())),
    }
}

/// Record what `leaf` says about the projection's kind, refusing a mix of
/// inclusion and exclusion, then put it in the tree.
fn add_leaf(st: &mut State, full: &[String], leaf: Leaf) -> Result<()> {
    let is_id = full.len() == 1 && full[0] == "_id";
    // MongoDB's 31253 / 31254 (projection_ast_util / parser).
    let mix = |what: &str, kind: &str| {
        let (code, name) = if what == "inclusion" {
            (31253, "Location31253")
        } else {
            (31254, "Location31254")
        };
        st.dialect.coded(
            code,
            name,
            format!(
                "Cannot do {what} on field {} in {kind} projection",
                full.join(".")
            ),
        )
    };
    match (&leaf, is_id) {
        (Leaf::Include | Leaf::Computed(_), false) => {
            if st.has_exclude {
                return Err(mix("inclusion", "exclusion"));
            }
            st.has_include = true;
        }
        (Leaf::Exclude, false) => {
            if st.has_include {
                return Err(mix("exclusion", "inclusion"));
            }
            st.has_exclude = true;
        }
        (Leaf::Exclude, true) => st.id_excluded = true,
        (Leaf::Slice { .. } | Leaf::ElemMatch, _) => st.has_operator = true,
        // `_id: 1` and a computed `_id` say nothing about the kind.
        (Leaf::Include | Leaf::Computed(_), true) => {}
    }
    insert_leaf(&mut st.root, full, leaf, st.dialect)
}

fn integral(v: &Bson) -> Option<i64> {
    match v {
        Bson::Int32(i) => Some(i64::from(*i)),
        Bson::Int64(i) => Some(*i),
        Bson::Double(f) if f.is_finite() => Some(f.trunc().clamp(-9.0e18, 9.0e18) as i64),
        _ => None,
    }
}

fn parse_slice(field: &str, arg: &Bson) -> Result<Leaf> {
    if let Some(n) = integral(arg) {
        return Ok(Leaf::Slice {
            skip: None,
            limit: n,
        });
    }
    if let Bson::Array(a) = arg {
        if let [skip, limit] = a.as_slice() {
            let (Some(skip), Some(limit)) = (integral(skip), integral(limit)) else {
                return Err(Error::bad_value(format!(
                    "$slice for {field}: skip and limit must be numbers"
                )));
            };
            if limit <= 0 {
                return Err(Error::bad_value(format!(
                    "$slice for {field}: limit must be positive"
                )));
            }
            return Ok(Leaf::Slice {
                skip: Some(skip),
                limit,
            });
        }
    }
    Err(Error::bad_value(format!(
        "$slice for {field} takes a number or an array of two numbers [skip, limit], got {}",
        render(arg)
    )))
}

fn insert_leaf(root: &mut Node, parts: &[String], leaf: Leaf, dialect: Dialect) -> Result<()> {
    let collision = || dialect.error(format!("Path collision at {}", parts.join(".")));
    let mut node = root;
    for part in parts {
        if node.leaf.is_some() {
            return Err(collision());
        }
        let pos = match node.children.iter().position(|(k, _)| k == part) {
            Some(p) => p,
            None => {
                node.children.push((part.clone(), Node::default()));
                node.children.len() - 1
            }
        };
        node = &mut node.children[pos].1;
    }
    if node.leaf.is_some() || !node.children.is_empty() {
        return Err(collision());
    }
    node.leaf = Some(leaf);
    Ok(())
}
