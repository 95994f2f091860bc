//! The projection parser: a projection document into the tree of `mod.rs`,
//! rule for rule as MongoDB 7.0's `projection_parser.cpp`, with its codes
//! and words, for find and for `$project` / `$unset`.
//!
//! Owns: MongoDB's `FieldPath` rules for projection keys (40352, 40353,
//! 15998, 16410, 15 Overflow); adding a node at a path with its collision
//! errors (31250 at the last component, 31249 through a leaf); the kind
//! state machine (an inclusion, exclusion or expression fixes the kind; the
//! other kind is then 31253, 31254, 31252 or 31310) and, when nothing fixed
//! it, `computeProjectionType`; find's operators (`$slice` 31257–31273 then
//! the `$slice` expression, `$elemMatch` 31274/31275, positional `a.$`
//! 31255/31256/31271/31276/31308/31394/31395/51050; 31324 in a stage); the
//! default `_id`.
//!
//! Invariants: every error of an element is raised before the next element
//! is read, in MongoDB's order of checks, so the first offending element
//! decides the error as in MongoDB; a stage's errors are wrapped once, at
//! the top (`Invalid $project :: caused by :: …`, code kept), an optimizer
//! error never (`Error::Optimize`). Nesting of sub-projections is bounded by
//! [`MAX_DEPTH`].

use bson::{Bson, Document};

use crate::doc::path::MAX_PATH_COMPONENTS;
use crate::doc::MAX_DEPTH;
use crate::error::{render_shell, Error, Result};
use crate::query::expr::{is_expression_name, loc, truthy_bson, Expr, Scope};
use crate::query::projection::{Dialect, Leaf, Mode, Node, Positional, Projection};
use crate::query::text::asks_text_score;
use crate::query::update::ElemCond;
use crate::query::Filter;

/// `$`-prefixed names MongoDB's `FieldPath` accepts (DBRef fields and
/// metadata it uses itself).
const ALLOWED_DOLLAR_FIELDS: [&str; 7] = [
    "$id",
    "$ref",
    "$db",
    "$sortKey",
    "$recordId",
    "$searchSortValues",
    "$searchScore",
];

/// The kind an element fixed.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Kind {
    Inclusion,
    Exclusion,
}

/// MongoDB's `ParseContext`.
struct Ctx<'q> {
    dialect: Dialect,
    scope: Scope,
    /// The find's filter (a positional `a.$` matches it again).
    query: Option<&'q Document>,
    kind: Option<Kind>,
    has_positional: bool,
    has_elem_match: bool,
    has_find_slice: bool,
    has_meta: bool,
    /// Reads `{$meta: "textScore"}` anywhere (also inside an expression).
    reads_score: bool,
    id_included: bool,
    id_excluded: bool,
    root: Node,
    positional: Option<Positional>,
}

/// `e` in `dialect`'s words: a stage names itself (`Invalid $project ::
/// caused by :: …`, code kept), except for an optimizer's error.
fn in_dialect(dialect: Dialect, e: Error) -> Error {
    match (dialect, e) {
        (Dialect::Find, e) => e,
        (Dialect::Stage(_), e @ Error::Optimize(_)) => e,
        (Dialect::Stage(name), e) => Error::Coded {
            code: e.code(),
            name: e.code_name(),
            msg: format!("Invalid {name} :: caused by :: {e}"),
        },
    }
}

/// A `$project` of nothing (51272), in `dialect`'s words.
pub(super) fn empty_stage_spec(dialect: Dialect) -> Error {
    in_dialect(
        dialect,
        loc!(
            51272,
            "projection specification must have at least one field"
        ),
    )
}

/// Parse `spec` in `dialect`.
pub(super) fn parse(
    spec: &Document,
    dialect: Dialect,
    scope: Scope,
    query: Option<&Document>,
) -> Result<Projection> {
    let mut cx = Ctx::new(dialect, scope, query);
    let mut id_specified = false;
    for (k, v) in spec {
        id_specified |= k == "_id" || k.starts_with("_id.");
        cx.element(k, v, &[], 1)
            .map_err(|e| in_dialect(dialect, e))?;
    }
    Ok(cx.finish(id_specified, spec.is_empty()))
}

/// The exclusion of each of `paths`, in order (`$unset`).
pub(super) fn parse_exclusions(paths: &[&str], dialect: Dialect) -> Result<Projection> {
    let mut cx = Ctx::new(dialect, Scope::new(), None);
    let mut id_specified = false;
    for p in paths {
        id_specified |= *p == "_id" || p.starts_with("_id.");
        cx.element(p, &Bson::Int32(0), &[], 1)
            .map_err(|e| in_dialect(dialect, e))?;
    }
    Ok(cx.finish(id_specified, paths.is_empty()))
}

/// MongoDB's `FieldPath` of projection key `key`: its components, or the
/// error MongoDB's constructor raises.
fn field_path(key: &str) -> Result<Vec<String>> {
    if key.is_empty() {
        return Err(loc!(
            40352,
            "FieldPath cannot be constructed with empty string"
        ));
    }
    if key.ends_with('.') {
        return Err(loc!(40353, "FieldPath must not end with a '.'."));
    }
    let parts: Vec<String> = key.split('.').map(str::to_string).collect();
    if parts.len() > MAX_PATH_COMPONENTS {
        return Err(overflow("FieldPath is too long"));
    }
    for p in &parts {
        if p.is_empty() {
            return Err(loc!(
                15998,
                "FieldPath field names may not be empty strings."
            ));
        }
        if p.starts_with('$') && !ALLOWED_DOLLAR_FIELDS.contains(&p.as_str()) {
            return Err(loc!(
                16410,
                "FieldPath field names may not start with '$'. Consider using $getField or \
                 $setField."
            ));
        }
        if p.contains('\0') {
            return Err(loc!(16411, "FieldPath field names may not contain '\\0'."));
        }
    }
    Ok(parts)
}

fn overflow(msg: &str) -> Error {
    Error::Coded {
        code: 15,
        name: "Overflow",
        msg: msg.to_string(),
    }
}

/// Does this value say include or exclude (a number or a boolean)?
fn is_inclusion_or_exclusion(v: &Bson) -> bool {
    matches!(
        v,
        Bson::Boolean(_) | Bson::Int32(_) | Bson::Int64(_) | Bson::Double(_) | Bson::Decimal128(_)
    )
}

/// MongoDB's `BSONElement::numberInt` of a number: int64 truncated to its
/// low 32 bits, a double truncated toward zero (NaN and out-of-range
/// values as the x86 conversion gives them, `i32::MIN`).
fn number_int(v: &Bson) -> Option<i64> {
    let from_f64 = |f: f64| {
        if !(-2_147_483_648.0..2_147_483_648.0).contains(&f) {
            i64::from(i32::MIN)
        } else {
            f.trunc() as i64
        }
    };
    match v {
        Bson::Int32(i) => Some(i64::from(*i)),
        Bson::Int64(i) => Some(i64::from(*i as i32)),
        Bson::Double(f) => Some(from_f64(*f)),
        Bson::Decimal128(d) => Some(from_f64(d.to_string().parse::<f64>().unwrap_or(f64::NAN))),
        _ => None,
    }
}

/// Find's `$slice: n` or `$slice: [skip, limit]`, or why it is not one (as
/// MongoDB's `attemptToParseFindSlice`).
fn find_slice(arg: &Bson) -> Result<Leaf> {
    if let Some(n) = number_int(arg) {
        return Ok(Leaf::Slice {
            skip: None,
            limit: n,
        });
    }
    let Bson::Array(a) = arg else {
        return Err(loc!(
            31273,
            "$slice only supports numbers and [skip, limit] arrays"
        ));
    };
    let [skip, limit] = a.as_slice() else {
        return Err(loc!(
            31272,
            "$slice array argument should be of form [skip, limit]"
        ));
    };
    let type_name = crate::doc::types::type_name;
    let Some(skip) = number_int(skip) else {
        return Err(loc!(
            31257,
            "$slice expects the skip argument to be a number, got {}",
            type_name(skip)
        ));
    };
    let Some(limit) = number_int(limit) else {
        return Err(loc!(
            31258,
            "$slice expects the limit argument to be a number, got {}",
            type_name(limit)
        ));
    };
    if limit <= 0 {
        return Err(loc!(31259, "$slice limit must be positive, got {limit}"));
    }
    Ok(Leaf::Slice {
        skip: Some(skip),
        limit,
    })
}

/// The node at `path` below `root`, if every component is an inner node
/// (MongoDB's `findLastInnerNodeOnPath`).
fn inner_node_exists(root: &Node, path: &[String]) -> bool {
    let mut at = root;
    for p in path {
        match at.child(p) {
            Some(n) if n.leaf.is_none() => at = n,
            _ => return false,
        }
    }
    true
}

/// Put `new` at `rel` below the inner node at `parent` (MongoDB's
/// `addNodeAtPath`): a node already at `rel` is 31250, a leaf on the way
/// 31249; missing inner nodes are created.
fn add_node(root: &mut Node, parent: &[String], rel: &[String], new: Node) -> Result<()> {
    let mut at = root;
    for p in parent {
        let i = at
            .children
            .iter()
            .position(|(k, _)| k == p)
            .ok_or_else(|| Error::Internal(format!("projection parent {p} missing")))?;
        at = &mut at.children[i].1;
    }
    let dotted = rel.join(".");
    for (i, part) in rel.iter().enumerate() {
        let last = i + 1 == rel.len();
        let pos = at.children.iter().position(|(k, _)| k == part);
        let idx = match (pos, last) {
            (Some(_), true) => return Err(loc!(31250, "Path collision at {dotted}")),
            (None, true) => {
                at.children.push((part.clone(), new));
                return Ok(());
            }
            (None, false) => {
                at.children.push((part.clone(), Node::default()));
                at.children.len() - 1
            }
            (Some(p), false) if at.children[p].1.leaf.is_some() => {
                return Err(loc!(
                    31249,
                    "Path collision at {dotted} remaining portion {}",
                    rel[1..].join(".")
                ))
            }
            (Some(p), false) => p,
        };
        at = &mut at.children[idx].1;
    }
    Err(Error::Internal("empty projection path".into()))
}

fn leaf(l: Leaf) -> Node {
    Node {
        leaf: Some(l),
        ..Node::default()
    }
}

impl<'q> Ctx<'q> {
    fn new(dialect: Dialect, scope: Scope, query: Option<&'q Document>) -> Ctx<'q> {
        Ctx {
            dialect,
            scope,
            query,
            kind: None,
            has_positional: false,
            has_elem_match: false,
            has_find_slice: false,
            has_meta: false,
            reads_score: false,
            id_included: false,
            id_excluded: false,
            root: Node::default(),
            positional: None,
        }
    }

    /// The projection, its kind decided and its `_id` default applied.
    fn finish(self, id_specified: bool, empty: bool) -> Projection {
        let kind = self.kind.unwrap_or_else(|| self.default_kind());
        let mut root = self.root;
        if kind == Kind::Inclusion && !id_specified {
            root.children.push(("_id".to_string(), leaf(Leaf::Include)));
        }
        if kind == Kind::Exclusion && self.id_included {
            root.children.retain(|(k, _)| k != "_id");
        }
        root.mark_computed();
        let mode = match kind {
            _ if empty && self.dialect == Dialect::Find => Mode::All,
            Kind::Inclusion => Mode::Include,
            Kind::Exclusion => Mode::Exclude,
        };
        Projection {
            mode,
            root,
            positional: self.positional,
            collator: None,
            text_score: self.reads_score,
        }
    }

    /// MongoDB's `computeProjectionType`: the kind of a projection no
    /// inclusion, exclusion or expression decided.
    fn default_kind(&self) -> Kind {
        if self.has_find_slice {
            if self.id_included {
                Kind::Inclusion
            } else {
                Kind::Exclusion
            }
        } else if self.has_elem_match {
            Kind::Inclusion
        } else if self.has_meta {
            match self.dialect {
                Dialect::Find if self.id_excluded => Kind::Exclusion,
                Dialect::Find if self.id_included => Kind::Inclusion,
                Dialect::Find => Kind::Exclusion,
                Dialect::Stage(_) => Kind::Inclusion,
            }
        } else if self.id_included {
            Kind::Inclusion
        } else {
            Kind::Exclusion
        }
    }

    /// One element `key: v` below the inner node at `parent` (MongoDB's
    /// `parseElement`).
    fn element(&mut self, key: &str, v: &Bson, parent: &[String], depth: usize) -> Result<()> {
        if depth > MAX_DEPTH {
            return Err(Error::NestingTooDeep { limit: MAX_DEPTH });
        }
        let positional = key.ends_with(".$");
        if positional && self.dialect != Dialect::Find {
            return Err(loc!(
                31324,
                "Cannot use positional projection in aggregation projection"
            ));
        }
        if key.contains(".$.") {
            return Err(loc!(
                31394,
                "As of 4.4, it's illegal to specify positional operator in the middle of a \
                 path.Positional projection may only be used at the end, for example: a.b.$. \
                 If the query previously used a form like a.b.$.d, remove the parts following \
                 the '$' and the results will be equivalent."
            ));
        }
        match v {
            Bson::Document(sub) => {
                if positional {
                    return Err(loc!(
                        31271,
                        "positional projection cannot be used with an expression or sub object"
                    ));
                }
                self.sub_object(key, sub, parent, depth)
            }
            _ if is_inclusion_or_exclusion(v) && truthy_bson(v) => {
                self.inclusion(key, parent, positional)
            }
            _ if is_inclusion_or_exclusion(v) => {
                if positional {
                    return Err(loc!(
                        31395,
                        "positional projection cannot be used with exclusion"
                    ));
                }
                self.exclusion(key, parent)
            }
            _ => {
                if positional {
                    return Err(loc!(
                        31308,
                        "positional projection cannot be used with a literal"
                    ));
                }
                self.literal(key, v, parent)
            }
        }
    }

    /// `key: {…}`: an expression or find operator when it has one
    /// `$`-field, else a sub-projection (MongoDB's `parseSubObject`).
    fn sub_object(
        &mut self,
        key: &str,
        sub: &Document,
        parent: &[String],
        depth: usize,
    ) -> Result<()> {
        if sub.is_empty() {
            return Err(loc!(
                51270,
                "An empty sub-projection is not a valid value. Found empty object at path"
            ));
        }
        let path = field_path(key)?;
        if parent.len() + path.len() > MAX_PATH_COMPONENTS {
            return Err(overflow("FieldPath concat would be too long"));
        }
        if let (1, Some((name, arg))) = (sub.len(), sub.iter().next()) {
            if name.starts_with('$') {
                if self.operator(&path, name, arg, sub, parent)? {
                    return Ok(());
                }
                // Meant as an expression, unless the name is a valid field
                // path (`$id`): then a sub-projection.
                if field_path(name).is_err() {
                    return Err(loc!(31325, "Unknown expression {name}"));
                }
            }
        }
        let full: Vec<String> = parent.iter().chain(&path).cloned().collect();
        if !inner_node_exists(&self.root, &full) {
            add_node(&mut self.root, parent, &path, Node::default())?;
        }
        for (k, v) in sub {
            self.element(k, v, &full, depth + 1)?;
        }
        Ok(())
    }

    /// `{name: arg}` at `path`: find's `$slice` / `$elemMatch`, or an
    /// expression; `false` when `name` names none (MongoDB's
    /// `parseSubObjectAsExpression`).
    fn operator(
        &mut self,
        path: &[String],
        name: &str,
        arg: &Bson,
        sub: &Document,
        parent: &[String],
    ) -> Result<bool> {
        match (self.dialect, name) {
            (Dialect::Find, "$slice") => {
                let found =
                    find_slice(arg).and_then(|l| add_node(&mut self.root, parent, path, leaf(l)));
                let Err(find_error) = found else {
                    self.has_find_slice = true;
                    return Ok(true);
                };
                // Not find's form: the `$slice` expression, or both errors.
                self.expression(path, name, sub, parent)
                    .map_err(|e| Error::Coded {
                        code: e.code(),
                        name: e.code_name(),
                        msg: format!(
                            "Invalid $slice syntax. The given syntax {} did not match the find() \
                         syntax because :: {}: {find_error} :: The given syntax did not match \
                         the expression $slice syntax. :: caused by :: {e}",
                            render_shell(&Bson::Document(sub.clone())),
                            find_error.code_name()
                        ),
                    })
            }
            (Dialect::Find, "$elemMatch") => {
                let Bson::Document(_) = arg else {
                    return Err(loc!(
                        31274,
                        "elemMatch: Invalid argument, object required, but got {}",
                        crate::doc::types::type_name(arg)
                    ));
                };
                if self.has_positional {
                    return Err(loc!(
                        31255,
                        "Cannot specify positional operator and $elemMatch."
                    ));
                }
                if path.len() != 1 || !parent.is_empty() {
                    return Err(loc!(
                        31275,
                        "Cannot use $elemMatch projection on a nested field."
                    ));
                }
                let cond = ElemCond::parse(arg)?;
                add_node(
                    &mut self.root,
                    parent,
                    path,
                    leaf(Leaf::ElemMatch(Box::new(cond))),
                )?;
                self.has_elem_match = true;
                Ok(true)
            }
            (Dialect::Stage(_), "$elemMatch") => Err(Error::Coded {
                code: 168,
                name: "InvalidPipelineOperator",
                msg: "Cannot use $elemMatch in this context".into(),
            }),
            _ => self.expression(path, name, sub, parent),
        }
    }

    /// `{$op: …}` at `path` as an expression, if `$op` is one (MongoDB's
    /// `attemptToParseGenericExpression`).
    fn expression(
        &mut self,
        path: &[String],
        name: &str,
        sub: &Document,
        parent: &[String],
    ) -> Result<bool> {
        if !is_expression_name(name) {
            return Ok(false);
        }
        let is_meta = name == "$meta";
        if !is_meta {
            self.fix_kind(Kind::Inclusion, || {
                loc!(
                    31252,
                    "Cannot use expression other than $meta in exclusion projection"
                )
            })?;
        }
        let v = Bson::Document(sub.clone());
        let e = Expr::parse_in(&v, &mut self.scope)?;
        add_node(&mut self.root, parent, path, leaf(Leaf::Computed(e)))?;
        self.has_meta |= is_meta;
        self.reads_score |= asks_text_score(&v);
        Ok(true)
    }

    /// `key: <true or a non-zero number>` (MongoDB's `parseInclusion`).
    fn inclusion(&mut self, key: &str, parent: &[String], positional: bool) -> Result<()> {
        let top_id = key == "_id" && parent.is_empty();
        if positional {
            if self.has_positional {
                return Err(loc!(
                    31276,
                    "Cannot specify more than one positional projection per query."
                ));
            }
            if self.has_elem_match {
                return Err(loc!(
                    31256,
                    "Cannot specify positional operator and $elemMatch."
                ));
            }
            let Some(query) = self.query else {
                return Err(loc!(
                    51050,
                    "Projections with a positional operator require a matcher"
                ));
            };
            let path = field_path(&key[..key.len() - 2])?;
            let filter = Filter::parse(query)?;
            add_node(&mut self.root, parent, &path, leaf(Leaf::Positional))?;
            self.positional = Some(Positional {
                path: parent.iter().chain(&path).cloned().collect(),
                filter: Box::new(filter),
            });
            self.has_positional = true;
        } else {
            let path = field_path(key)?;
            add_node(&mut self.root, parent, &path, leaf(Leaf::Include))?;
            self.id_included |= top_id;
        }
        if top_id {
            return Ok(());
        }
        self.fix_kind(Kind::Inclusion, || {
            loc!(
                31253,
                "Cannot do inclusion on field {key} in exclusion projection"
            )
        })
    }

    /// `key: <false or 0>` (MongoDB's `parseExclusion`).
    fn exclusion(&mut self, key: &str, parent: &[String]) -> Result<()> {
        let path = field_path(key)?;
        add_node(&mut self.root, parent, &path, leaf(Leaf::Exclude))?;
        if key == "_id" && parent.is_empty() {
            self.id_excluded = true;
            return Ok(());
        }
        self.fix_kind(Kind::Exclusion, || {
            loc!(
                31254,
                "Cannot do exclusion on field {key} in inclusion projection"
            )
        })
    }

    /// `key: <any other value>`: an expression operand — a field path, a
    /// variable, an array of expressions, or a constant (MongoDB's
    /// `parseLiteral`).
    fn literal(&mut self, key: &str, v: &Bson, parent: &[String]) -> Result<()> {
        let e = Expr::parse_in(v, &mut self.scope)?;
        let path = field_path(key)?;
        add_node(&mut self.root, parent, &path, leaf(Leaf::Computed(e)))?;
        self.reads_score |= asks_text_score(v);
        self.fix_kind(Kind::Inclusion, || {
            loc!(
                31310,
                "Cannot use an expression {key}: {} in an exclusion projection",
                render_shell(v)
            )
        })
    }

    /// The element makes the projection of `kind`: refused with `refuse`'s
    /// error when the other kind is already fixed.
    fn fix_kind(&mut self, kind: Kind, refuse: impl FnOnce() -> Error) -> Result<()> {
        if self.kind.is_some_and(|k| k != kind) {
            return Err(refuse());
        }
        self.kind = Some(kind);
        Ok(())
    }
}
