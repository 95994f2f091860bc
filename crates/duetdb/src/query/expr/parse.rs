//! Parsing BSON into [`Expr`], with the variable scopes of `$let`, `$map`,
//! `$filter`, `$reduce` and the command's `let`.
//!
//! Owns: [`Scope`] (which variables are visible where, and the values read
//! once per command: `$$NOW`, `$$CLUSTER_TIME`, `let` constants), the read
//! time `$$CLUSTER_TIME` takes ([`under_read_time`]) and the grammar of
//! every operator's argument.
//!
//! Invariants: a `$$name` that no enclosing scope binds is refused here
//! (17276), so evaluation never meets an unbound variable; every variable a
//! scope binds gets an id unique within the parse, so an inner binding of the
//! same name shadows the outer one without any name lookup at evaluation;
//! user variable names follow MongoDB's rule (a lowercase ASCII letter or a
//! non-ASCII character first, then letters, digits, `_`), checked where they
//! are bound (16866–16871) — built-in names are upper case.

use bson::{Bson, Document};

use crate::error::{Error, Result};
use crate::query::expr::{Expr, Named, Op, Root, MAX_EXPR_DEPTH};

/// Which variables are in scope while parsing, and the per-command values.
#[derive(Debug, Clone)]
pub struct Scope {
    /// User variables bound by enclosing operators, innermost last.
    vars: Vec<(String, u32)>,
    next_id: u32,
    /// The command's `let` variables (and an enclosing `$lookup`'s), already
    /// evaluated; `None` is a variable bound to missing.
    consts: Vec<(String, Option<Bson>)>,
    now: bson::DateTime,
    /// `$$CLUSTER_TIME`: the read time in force ([`under_read_time`]).
    cluster_time: bson::Timestamp,
}

thread_local! {
    /// The cluster time of the read whose expressions this thread is
    /// parsing (a packed `(seconds << 32) | increment`, the engine's clock
    /// format). Set only by [`under_read_time`], which restores the previous
    /// one when it returns or unwinds.
    static READ_TIME: std::cell::Cell<Option<u64>> = const { std::cell::Cell::new(None) };
}

/// Run `f` with `$$CLUSTER_TIME` bound to `ts` in every expression parsed on
/// this thread: the engine's read entry points pass their snapshot's cluster
/// time (the last commit group it holds), the server every command's cluster
/// clock, so one command sees one value. Nested calls: the innermost wins.
pub fn under_read_time<R>(ts: u64, f: impl FnOnce() -> R) -> R {
    struct Restore(Option<u64>);
    impl Drop for Restore {
        fn drop(&mut self) {
            READ_TIME.set(self.0);
        }
    }
    let _restore = Restore(READ_TIME.replace(Some(ts)));
    f()
}

/// `$$CLUSTER_TIME` for a scope made now: the read time in force, else (an
/// expression parsed outside any read, e.g. by a caller of `Expr::parse`)
/// the wall clock's second, increment 1.
fn cluster_time_now(now: bson::DateTime) -> bson::Timestamp {
    match READ_TIME.get() {
        Some(ts) => bson::Timestamp {
            time: (ts >> 32) as u32,
            increment: ts as u32,
        },
        None => bson::Timestamp {
            time: u32::try_from(now.timestamp_millis().div_euclid(1000)).unwrap_or(0),
            increment: 1,
        },
    }
}

impl Default for Scope {
    fn default() -> Self {
        Scope::new()
    }
}

impl Scope {
    /// A scope with only the built-in variables; `$$NOW` is read now.
    pub fn new() -> Scope {
        let now = bson::DateTime::now();
        Scope {
            vars: Vec::new(),
            next_id: 0,
            consts: Vec::new(),
            now,
            cluster_time: cluster_time_now(now),
        }
    }

    /// A scope holding a command's `let` variables: each value is an
    /// expression evaluated once, now, against no document (it may use
    /// `$$NOW` and the `let` variables before it, not fields).
    pub fn with_let(let_vars: Option<&Document>) -> Result<Scope> {
        let mut scope = Scope::new();
        let Some(vars) = let_vars else {
            return Ok(scope);
        };
        let empty = Document::new();
        for (name, v) in vars {
            check_var_name(name)?;
            let e = parse_at(v, 0, &mut scope)?;
            if e.reads_document() {
                return Err(loc!(
                    4890500,
                    "Command let Expression tried to access a field, but this is not allowed because command let expressions run before the query examines any documents."
                ));
            }
            let value = e.eval(&Root::Doc(&empty))?;
            scope.consts.retain(|(n, _)| n != name);
            scope.consts.push((name.clone(), value));
        }
        Ok(scope)
    }

    /// Bind already evaluated variables (a `$lookup`'s `let`, evaluated per
    /// input document) on top of this scope's; names follow the user rule
    /// (16866–16868) and shadow earlier ones. `$$NOW` stays this scope's.
    pub fn bind_consts(&mut self, vars: Vec<(String, Option<Bson>)>) -> Result<()> {
        for (name, value) in vars {
            check_var_name(&name)?;
            self.consts.retain(|(n, _)| *n != name);
            self.consts.push((name, value));
        }
        Ok(())
    }

    /// Parse `$redact`'s expression: `CURRENT` bound to a variable of its
    /// own (returned), which the stage sets to each (sub)document it visits,
    /// so field paths start there while `$$ROOT` stays the whole document;
    /// and `$$DESCEND`/`$$PRUNE`/`$$KEEP`, the strings `"descend"`,
    /// `"prune"`, `"keep"` (MongoDB defines them for this stage only).
    pub fn parse_redact(&self, v: &Bson) -> Result<(Expr, u32)> {
        let mut scope = self.clone();
        for (name, value) in [("DESCEND", "descend"), ("PRUNE", "prune"), ("KEEP", "keep")] {
            scope.consts.retain(|(n, _)| n != name);
            scope
                .consts
                .push((name.to_string(), Some(Bson::String(value.to_string()))));
        }
        let current = scope.bind("CURRENT");
        let e = parse_at(v, 0, &mut scope)?;
        Ok((e, current))
    }

    /// The constant variables in scope (command `let`, `$lookup` `let`), in
    /// binding order; `None` is missing.
    pub fn consts(&self) -> &[(String, Option<Bson>)] {
        &self.consts
    }

    /// Bind `name` for the expressions parsed until [`Scope::unbind`].
    fn bind(&mut self, name: &str) -> u32 {
        let id = self.next_id;
        self.next_id += 1;
        self.vars.push((name.to_string(), id));
        id
    }

    fn unbind(&mut self, n: usize) {
        let keep = self.vars.len().saturating_sub(n);
        self.vars.truncate(keep);
    }

    fn lookup(&self, name: &str) -> Option<u32> {
        self.vars
            .iter()
            .rev()
            .find(|(n, _)| n == name)
            .map(|(_, id)| *id)
    }
}

/// MongoDB's rule for a variable name that is being bound.
pub(super) fn check_var_name(name: &str) -> Result<()> {
    let Some(first) = name.chars().next() else {
        return Err(loc!(16866, "empty variable names are not allowed"));
    };
    if first.is_ascii() && !first.is_ascii_lowercase() {
        return Err(loc!(
            16867,
            "'{name}' starts with an invalid character for a user variable name"
        ));
    }
    if let Some(c) = name
        .chars()
        .find(|c| c.is_ascii() && !(c.is_ascii_alphanumeric() || *c == '_'))
    {
        return Err(loc!(
            16868,
            "'{name}' contains an invalid character for a variable name: '{c}'"
        ));
    }
    Ok(())
}

/// A name an expression binds (`$let`'s `vars`, an `as`): a user variable
/// name, or `CURRENT`, the one system variable MongoDB lets users rebind
/// (`validateNameForUserWrite`); a command's or `$lookup`'s `let` constants
/// may not.
fn check_bound_name(name: &str) -> Result<()> {
    if name == "CURRENT" {
        return Ok(());
    }
    check_var_name(name)
}

pub(super) fn parse_at(v: &Bson, depth: usize, scope: &mut Scope) -> Result<Expr> {
    if depth > MAX_EXPR_DEPTH {
        return Err(Error::bad_value(format!(
            "expression nests deeper than {MAX_EXPR_DEPTH} levels"
        )));
    }
    match v {
        Bson::String(s) if s.starts_with("$$") => parse_variable(&s[2..], scope),
        Bson::String(s) if s.starts_with('$') => Ok(current(scope, parse_field_path(&s[1..])?)),
        Bson::Array(items) => Ok(Expr::Array(
            items
                .iter()
                .map(|i| parse_at(i, depth + 1, scope))
                .collect::<Result<_>>()?,
        )),
        Bson::Document(d) => parse_object(d, depth, scope),
        other => Ok(Expr::Literal(other.clone())),
    }
}

/// A field path of `$$CURRENT`: the document itself unless a `$let` rebound
/// `CURRENT`, whose value field paths inside its `in` then start from (as
/// MongoDB's do).
fn current(scope: &Scope, path: Vec<String>) -> Expr {
    match scope.lookup("CURRENT") {
        Some(id) => Expr::Var(id, path),
        None => Expr::Field(path),
    }
}

/// Components of a field path given without its `$` (`"a.b"`).
pub fn parse_field_path(p: &str) -> Result<Vec<String>> {
    if p.is_empty() {
        return Err(loc!(16872, "'$' by itself is not a valid FieldPath"));
    }
    crate::doc::path::validate(p)
        .map_err(|e| Error::bad_value(format!("invalid field path: {e}")))?;
    let parts: Vec<String> = p.split('.').map(str::to_string).collect();
    if let Some(bad) = parts.iter().find(|c| c.starts_with('$')) {
        return Err(loc!(
            16410,
            "FieldPath field names may not start with '$'. Consider using $getField or $setField. (field '{bad}' in '${p}')"
        ));
    }
    Ok(parts)
}

fn parse_variable(v: &str, scope: &Scope) -> Result<Expr> {
    let (name, rest) = match v.split_once('.') {
        Some((n, r)) => (n, Some(r)),
        None => (v, None),
    };
    let path = match rest {
        Some(r) => parse_field_path(r)?,
        None => Vec::new(),
    };
    if let Some(id) = scope.lookup(name) {
        return Ok(Expr::Var(id, path));
    }
    if let Some((_, value)) = scope.consts.iter().rev().find(|(n, _)| n == name) {
        return Ok(match value {
            Some(v) => literal_path(v, &path),
            None => Expr::Remove,
        });
    }
    match name {
        "ROOT" | "CURRENT" => Ok(Expr::Root(path)),
        "REMOVE" => Ok(Expr::Remove),
        "NOW" => Ok(literal_path(&Bson::DateTime(scope.now), &path)),
        "CLUSTER_TIME" => Ok(literal_path(&Bson::Timestamp(scope.cluster_time), &path)),
        "" => Err(loc!(16869, "empty variable names are not allowed")),
        other => Err(loc!(17276, "Use of undefined variable: {other}")),
    }
}

/// A constant variable followed by a path, folded at parse time.
fn literal_path(v: &Bson, path: &[String]) -> Expr {
    match crate::query::expr::path_bson(v, path) {
        Some(b) => Expr::Literal(b),
        None => Expr::Remove,
    }
}

fn parse_object(d: &Document, depth: usize, scope: &mut Scope) -> Result<Expr> {
    let first_dollar = d.keys().next().is_some_and(|k| k.starts_with('$'));
    if first_dollar {
        if d.len() != 1 {
            return Err(loc!(
                15983,
                "An object representing an expression must have exactly one field: {}",
                crate::error::render(&Bson::Document(d.clone()))
            ));
        }
        let Some((name, arg)) = d.iter().next() else {
            return Err(Error::Internal("empty operator document".into()));
        };
        return parse_operator(name, arg, depth, scope);
    }
    let mut fields = Vec::with_capacity(d.len());
    for (k, v) in d {
        if k.starts_with('$') {
            return Err(loc!(
                16404,
                "field names in an expression object may not start with '$': '{k}'"
            ));
        }
        if k.contains('.') {
            return Err(loc!(
                16412,
                "FieldPath field names may not contain '.'. Consider using $getField or $setField."
            ));
        }
        fields.push((k.clone(), parse_at(v, depth + 1, scope)?));
    }
    Ok(Expr::Doc(fields))
}

/// `{$meta: "textScore"}`: the hidden score field a `$text` first stage
/// gives its documents (`query::text::TEXT_SCORE_FIELD`); MongoDB's other
/// metadata kinds are known but not produced here.
fn parse_meta(arg: &Bson) -> Result<Expr> {
    let Bson::String(kind) = arg else {
        return Err(loc!(17307, "$meta only supports string arguments"));
    };
    match kind.as_str() {
        "textScore" => Ok(Expr::Root(vec![
            crate::query::text::TEXT_SCORE_FIELD.to_string()
        ])),
        "randVal"
        | "searchScore"
        | "searchHighlights"
        | "searchScoreDetails"
        | "geoNearDistance"
        | "geoNearPoint"
        | "recordId"
        | "indexKey"
        | "sortKey"
        | "searchSequenceToken" => Err(Error::Coded {
            code: 2,
            name: "BadValue",
            msg: format!("$meta \"{kind}\" is not supported (only \"textScore\")"),
        }),
        other => Err(loc!(17308, "Unsupported argument to $meta: {other}")),
    }
}

/// Is `name` an expression operator (`$add`, `$literal`, …)? What MongoDB's
/// `Expression::isExpressionName` answers: a projection's `{a: {$name: …}}`
/// is an expression exactly when `$name` is one.
pub fn is_expression_name(name: &str) -> bool {
    matches!(
        name,
        "$literal"
            | "$meta"
            | "$let"
            | "$map"
            | "$filter"
            | "$reduce"
            | "$switch"
            | "$getField"
            | "$function"
    ) || Named::from_name(name).is_some()
        || Op::from_name(name).is_some()
}

fn parse_operator(name: &str, arg: &Bson, depth: usize, scope: &mut Scope) -> Result<Expr> {
    let sub = depth + 1;
    match name {
        "$literal" => return Ok(Expr::Literal(arg.clone())),
        // MongoDB knows it; it runs JavaScript, which duetdb does not embed.
        "$function" => {
            return Err(Error::bad_value(
                "$function is not supported by duetdb: it runs JavaScript",
            ))
        }
        "$meta" => return parse_meta(arg),
        "$let" => return parse_let(arg, sub, scope),
        "$map" => return parse_map(arg, sub, scope),
        "$filter" => return parse_filter(arg, sub, scope),
        "$reduce" => return parse_reduce(arg, sub, scope),
        "$switch" => return parse_switch(arg, sub, scope),
        "$getField" if !matches!(arg, Bson::Document(d) if d.keys().all(|k| !k.starts_with('$'))) =>
        {
            // `{$getField: "name"}`: the field of $$CURRENT.
            return Ok(Expr::Named(
                Named::GetField,
                vec![
                    Some(parse_at(arg, sub, scope)?),
                    Some(match scope.lookup("CURRENT") {
                        Some(id) => Expr::Var(id, Vec::new()),
                        None => Expr::Root(Vec::new()),
                    }),
                ],
            ));
        }
        _ => {}
    }
    if let Some(n) = Named::from_name(name) {
        return parse_named(n, arg, sub, scope);
    }
    let Some(op) = Op::from_name(name) else {
        return Err(Error::Coded {
            code: 168,
            name: "InvalidPipelineOperator",
            msg: format!("Unrecognized expression '{name}'"),
        });
    };
    let args: Vec<Expr> = match (op, arg) {
        (Op::Cond, Bson::Document(d)) if !d.keys().any(|k| k.starts_with('$')) => {
            for k in d.keys() {
                if !matches!(k.as_str(), "if" | "then" | "else") {
                    return Err(loc!(17083, "Unrecognized parameter to $cond: {k}"));
                }
            }
            vec![
                part(d, "if", sub, scope, || {
                    loc!(17080, "Missing 'if' parameter to $cond")
                })?,
                part(d, "then", sub, scope, || {
                    loc!(17081, "Missing 'then' parameter to $cond")
                })?,
                part(d, "else", sub, scope, || {
                    loc!(17082, "Missing 'else' parameter to $cond")
                })?,
            ]
        }
        (Op::Rand, Bson::Document(d)) if d.is_empty() => Vec::new(),
        (_, Bson::Array(items)) => items
            .iter()
            .map(|i| parse_at(i, sub, scope))
            .collect::<Result<_>>()?,
        (_, single) => vec![parse_at(single, sub, scope)?],
    };
    let (lo, hi) = op.arity();
    let n = args.len();
    if lo == hi && n != lo {
        return Err(loc!(
            16020,
            "Expression {} takes exactly {lo} arguments. {n} were passed in.",
            op.name()
        ));
    }
    if n < lo || n > hi {
        return Err(if hi == usize::MAX {
            loc!(
                28667,
                "Expression {} takes at least {lo} arguments, but {n} were passed in.",
                op.name()
            )
        } else {
            loc!(
                28667,
                "Expression {} takes at least {lo} arguments, and at most {hi}, but {n} were passed in.",
                op.name()
            )
        });
    }
    Ok(Expr::Op(op, args))
}

fn parse_named(n: Named, arg: &Bson, sub: usize, scope: &mut Scope) -> Result<Expr> {
    let keys = n.keys();
    let d = match arg {
        Bson::Document(d) if !d.keys().any(|k| k.starts_with('$')) => d,
        // `{$year: <date>}` and `{$year: [<date>]}`.
        Bson::Array(items) if n.is_date_part() => {
            let [one] = items.as_slice() else {
                return Err(loc!(
                    40536,
                    "{} accepts exactly one argument if given an array, but was given {}",
                    n.name(),
                    items.len()
                ));
            };
            return Ok(Expr::Named(n, vec![Some(parse_at(one, sub, scope)?), None]));
        }
        single if n.is_date_part() => {
            return Ok(Expr::Named(
                n,
                vec![Some(parse_at(single, sub, scope)?), None],
            ));
        }
        other if matches!(n, Named::Trim | Named::LTrim | Named::RTrim) => {
            return Err(loc!(
                50696,
                "{} only supports an object as an argument, found {}",
                n.name(),
                crate::doc::types::type_name(other)
            ))
        }
        other => {
            return Err(Error::bad_value(format!(
                "{} only supports an object as its argument, found: {}",
                n.name(),
                crate::doc::types::type_name(other)
            )))
        }
    };
    let mut args: Vec<Option<Expr>> = vec![None; keys.len()];
    for (k, v) in d {
        let Some(i) = keys.iter().position(|x| x == k) else {
            return Err(unknown_arg(n, k, d));
        };
        if let Some(slot) = args.get_mut(i) {
            *slot = Some(parse_at(v, sub, scope)?);
        }
    }
    for r in n.required() {
        if !d.contains_key(*r) {
            return Err(missing_arg(n, r, d));
        }
    }
    if matches!(
        n,
        Named::RegexMatch | Named::RegexFind | Named::RegexFindAll
    ) {
        let arg = |name: &str| {
            keys.iter()
                .position(|x| *x == name)
                .and_then(|i| args[i].as_ref())
        };
        if let (Some(Expr::Literal(regex)), None | Some(Expr::Literal(_))) =
            (arg("regex"), arg("options"))
        {
            let options = match arg("options") {
                Some(Expr::Literal(o)) => Some(o),
                _ => None,
            };
            super::regex::precompile(n, regex, options)
                .map_err(|e| Error::Optimize(Box::new(e)))?;
        }
    }
    Ok(Expr::Named(n, args))
}

/// The value of `key` in an operator's object, parsed; `missing` if absent.
fn part(
    d: &Document,
    key: &str,
    sub: usize,
    scope: &mut Scope,
    missing: impl FnOnce() -> Error,
) -> Result<Expr> {
    match d.get(key) {
        Some(v) => parse_at(v, sub, scope),
        None => Err(missing()),
    }
}

fn check_keys(d: &Document, allowed: &[&str], unknown: impl Fn(&str) -> Error) -> Result<()> {
    match d.keys().find(|k| !allowed.contains(&k.as_str())) {
        Some(k) => Err(unknown(k)),
        None => Ok(()),
    }
}

/// The name an `as` argument binds (`this` by default).
fn as_name(d: &Document, op: &str) -> Result<String> {
    match d.get("as") {
        None => Ok("this".to_string()),
        Some(Bson::String(s)) => {
            check_bound_name(s)?;
            Ok(s.clone())
        }
        Some(other) => Err(Error::bad_value(format!(
            "{op}: 'as' must be a string, found: {}",
            crate::doc::types::type_name(other)
        ))),
    }
}

fn parse_let(arg: &Bson, sub: usize, scope: &mut Scope) -> Result<Expr> {
    let Bson::Document(d) = arg else {
        return Err(loc!(16874, "$let only supports an object as its argument"));
    };
    check_keys(d, &["vars", "in"], |k| {
        loc!(16875, "Unrecognized parameter to $let: {k}")
    })?;
    let vars = match d.get("vars") {
        Some(Bson::Document(v)) => v,
        Some(_) => return Err(loc!(10065, "invalid parameter: expected an object (vars)")),
        None => return Err(loc!(16876, "Missing 'vars' parameter to $let")),
    };
    // Every value sees the outer scope only; the body sees them all.
    let mut values = Vec::with_capacity(vars.len());
    for (name, v) in vars {
        check_bound_name(name)?;
        values.push((name.as_str(), parse_at(v, sub, scope)?));
    }
    let bound: Vec<(u32, Expr)> = values
        .into_iter()
        .map(|(name, e)| (scope.bind(name), e))
        .collect();
    let body = part(d, "in", sub, scope, || {
        loc!(16877, "Missing 'in' parameter to $let")
    });
    scope.unbind(bound.len());
    Ok(Expr::Let(bound, Box::new(body?)))
}

fn parse_map(arg: &Bson, sub: usize, scope: &mut Scope) -> Result<Expr> {
    let Bson::Document(d) = arg else {
        return Err(loc!(16878, "$map only supports an object as its argument"));
    };
    check_keys(d, &["input", "as", "in"], |k| {
        loc!(16879, "Unrecognized parameter to $map: {k}")
    })?;
    let input = part(d, "input", sub, scope, || {
        loc!(16880, "Missing 'input' parameter to $map")
    })?;
    let name = as_name(d, "$map")?;
    let id = scope.bind(&name);
    let body = part(d, "in", sub, scope, || {
        loc!(16882, "Missing 'in' parameter to $map")
    });
    scope.unbind(1);
    Ok(Expr::Map(Box::new(input), id, Box::new(body?)))
}

fn parse_filter(arg: &Bson, sub: usize, scope: &mut Scope) -> Result<Expr> {
    let Bson::Document(d) = arg else {
        return Err(loc!(
            28646,
            "$filter only supports an object as its argument"
        ));
    };
    check_keys(d, &["input", "as", "cond", "limit"], |k| {
        loc!(28647, "Unrecognized parameter to $filter: {k}")
    })?;
    let input = part(d, "input", sub, scope, || {
        loc!(28648, "Missing 'input' parameter to $filter")
    })?;
    let limit = match d.get("limit") {
        Some(v) => Some(Box::new(parse_at(v, sub, scope)?)),
        None => None,
    };
    let name = as_name(d, "$filter")?;
    let id = scope.bind(&name);
    let cond = part(d, "cond", sub, scope, || {
        loc!(28650, "Missing 'cond' parameter to $filter")
    });
    scope.unbind(1);
    Ok(Expr::Filter(Box::new(input), id, Box::new(cond?), limit))
}

fn parse_reduce(arg: &Bson, sub: usize, scope: &mut Scope) -> Result<Expr> {
    let Bson::Document(d) = arg else {
        return Err(loc!(
            40075,
            "$reduce only supports an object as its argument"
        ));
    };
    check_keys(d, &["input", "initialValue", "in"], |k| {
        loc!(40076, "$reduce found an unknown argument: {k}")
    })?;
    let input = part(d, "input", sub, scope, || {
        loc!(40077, "$reduce requires 'input' to be specified")
    })?;
    let init = part(d, "initialValue", sub, scope, || {
        loc!(40078, "$reduce requires 'initialValue' to be specified")
    })?;
    let value = scope.bind("value");
    let this = scope.bind("this");
    let body = part(d, "in", sub, scope, || {
        loc!(40079, "$reduce requires 'in' to be specified")
    });
    scope.unbind(2);
    Ok(Expr::Reduce(
        Box::new(input),
        Box::new(init),
        value,
        this,
        Box::new(body?),
    ))
}

fn parse_switch(arg: &Bson, sub: usize, scope: &mut Scope) -> Result<Expr> {
    let Bson::Document(d) = arg else {
        return Err(loc!(
            40060,
            "$switch requires an object as an argument, found: {}",
            crate::doc::types::type_name(arg)
        ));
    };
    let mut branches = Vec::new();
    let mut default = None;
    for (k, v) in d {
        match k.as_str() {
            "branches" => {
                let Bson::Array(items) = v else {
                    return Err(loc!(
                        40061,
                        "$switch expected an array for 'branches', found: {}",
                        crate::doc::types::type_name(v)
                    ));
                };
                for b in items {
                    let Bson::Document(b) = b else {
                        return Err(loc!(
                            40062,
                            "$switch expected each branch to be an object, found: {}",
                            crate::doc::types::type_name(b)
                        ));
                    };
                    check_keys(b, &["case", "then"], |k| {
                        loc!(40063, "$switch found an unknown argument to a branch: {k}")
                    })?;
                    let case = part(b, "case", sub, scope, || {
                        loc!(
                            40064,
                            "$switch requires each branch have a 'case' expression"
                        )
                    })?;
                    let then = part(b, "then", sub, scope, || {
                        loc!(
                            40065,
                            "$switch requires each branch have a 'then' expression."
                        )
                    })?;
                    branches.push((case, then));
                }
            }
            "default" => default = Some(Box::new(parse_at(v, sub, scope)?)),
            other => return Err(loc!(40067, "$switch found an unknown argument: {other}")),
        }
    }
    if branches.is_empty() {
        return Err(loc!(40068, "$switch requires at least one branch."));
    }
    Ok(Expr::Switch(branches, default))
}

impl Expr {
    /// Whether evaluating this reads the document (a field path, `$$ROOT`,
    /// `$$CURRENT`): what a command's `let` may not do.
    pub(super) fn reads_document(&self) -> bool {
        let any = |es: &[Expr]| es.iter().any(Expr::reads_document);
        match self {
            Expr::Field(_) | Expr::Root(_) => true,
            Expr::Literal(_) | Expr::Remove | Expr::Var(..) => false,
            Expr::Doc(fields) => fields.iter().any(|(_, e)| e.reads_document()),
            Expr::Array(items) | Expr::Op(_, items) => any(items),
            Expr::Named(_, args) => args.iter().flatten().any(Expr::reads_document),
            Expr::Let(bound, body) => {
                bound.iter().any(|(_, e)| e.reads_document()) || body.reads_document()
            }
            Expr::Map(a, _, b) => a.reads_document() || b.reads_document(),
            Expr::Filter(a, _, b, c) => {
                a.reads_document()
                    || b.reads_document()
                    || c.as_ref().is_some_and(|c| c.reads_document())
            }
            Expr::Reduce(a, b, _, _, c) => {
                a.reads_document() || b.reads_document() || c.reads_document()
            }
            Expr::Switch(branches, default) => {
                branches
                    .iter()
                    .any(|(c, t)| c.reads_document() || t.reads_document())
                    || default.as_ref().is_some_and(|d| d.reads_document())
            }
        }
    }
}

/// MongoDB's error for an argument a named-argument operator does not take.
fn unknown_arg(n: Named, k: &str, d: &Document) -> Error {
    use Named::*;
    let op = n.name();
    match n {
        Trim | LTrim | RTrim => loc!(50694, "{op} found an unknown argument: {k}"),
        RegexMatch | RegexFind | RegexFindAll => {
            loc!(31024, "{op} found an unknown field: {k}")
        }
        ReplaceOne | ReplaceAll => loc!(51750, "{op} found an unknown argument: {k}"),
        SetField | UnsetField => loc!(4161100, "{op} found an unknown argument: {k}"),
        GetField => loc!(3041701, "$getField found an unknown argument: {k}"),
        SortArray => loc!(2942501, "$sortArray found an unknown argument: {k}"),
        DateToString => loc!(18534, "Unrecognized parameter to $dateToString: {k}"),
        DateFromString => loc!(40541, "Unrecognized argument to $dateFromString: {k}"),
        DateToParts => loc!(40520, "Unrecognized argument to $dateToParts: {k}"),
        DateFromParts => loc!(40518, "Unrecognized argument to $dateFromParts: {k}"),
        DateAdd | DateSubtract => loc!(5166401, "Unrecognized argument to {op}: {k}. Expected arguments are startDate, unit, amount, and optionally timezone."),
        DateDiff => loc!(5166300, "Unrecognized argument to $dateDiff: {k}"),
        DateTrunc => loc!(5439006, "Unrecognized argument to $dateTrunc: {k}"),
        Zip => loc!(34464, "$zip found an unknown argument: {k}"),
        Convert => Error::Coded {
            code: 9,
            name: "FailedToParse",
            msg: format!("$convert found an unknown argument: {k}"),
        },
        FirstN | LastN | MaxN | MinN => {
            loc!(5787901, "Unknown argument for '{op}' operator: {k}")
        }
        Median | Percentile => Error::Coded {
            code: 40415,
            name: "IDLUnknownField",
            msg: format!("BSON field '{op}.{k}' is an unknown field."),
        },
        _ => loc!(
            40535,
            "unrecognized option to {op}: \"{k}\" in {}",
            crate::error::render(&Bson::Document(d.clone()))
        ),
    }
}

/// MongoDB's error for a required argument that is absent (present and
/// null is not an error: the operator answers null).
fn missing_arg(n: Named, r: &str, d: &Document) -> Error {
    use Named::*;
    let op = n.name();
    match (n, r) {
        (Trim | LTrim | RTrim, _) => loc!(50695, "{op} requires an 'input' field"),
        (RegexMatch | RegexFind | RegexFindAll, "input") => {
            loc!(31022, "{op} requires 'input' parameter")
        }
        (RegexMatch | RegexFind | RegexFindAll, _) => {
            loc!(31023, "{op} requires 'regex' parameter")
        }
        (ReplaceOne | ReplaceAll, "input") => loc!(51749, "{op} requires 'input' to be specified"),
        (ReplaceOne | ReplaceAll, "find") => loc!(51748, "{op} requires 'find' to be specified"),
        (ReplaceOne | ReplaceAll, _) => {
            loc!(51747, "{op} requires 'replacement' to be specified")
        }
        (SetField | UnsetField, "field") => loc!(4161102, "{op} requires 'field' to be specified"),
        (SetField | UnsetField, "input") => loc!(4161109, "{op} requires 'input' to be specified"),
        (SetField | UnsetField, _) => loc!(4161103, "{op} requires 'value' to be specified"),
        (GetField, _) => loc!(3041702, "$getField requires 'field' to be specified"),
        (SortArray, "input") => loc!(2942502, "$sortArray requires 'input' to be specified"),
        (SortArray, _) => loc!(2942503, "$sortArray requires 'sortBy' to be specified"),
        (DateToString, _) => loc!(18628, "Missing 'date' parameter to $dateToString"),
        (DateFromString, _) => loc!(40542, "Missing 'dateString' parameter to $dateFromString"),
        (DateToParts, _) => loc!(40522, "Missing 'date' parameter to $dateToParts"),
        (DateAdd | DateSubtract, _) => loc!(
            5166402,
            "{op} requires startDate, unit, and amount to be present"
        ),
        (DateDiff, "startDate") => loc!(5166301, "$dateDiff requires 'startDate' to be specified"),
        (DateDiff, "endDate") => loc!(5166302, "$dateDiff requires 'endDate' to be specified"),
        (DateDiff, _) => loc!(5166303, "$dateDiff requires 'unit' to be specified"),
        (DateTrunc, "date") => loc!(5439007, "$dateTrunc requires 'date' to be specified"),
        (DateTrunc, _) => loc!(5439008, "$dateTrunc requires 'unit' to be specified"),
        (Zip, _) => loc!(34465, "$zip requires at least one input array"),
        (Convert, _) => Error::Coded {
            code: 9,
            name: "FailedToParse",
            msg: format!("Missing '{r}' parameter to $convert"),
        },
        (FirstN | LastN | MaxN | MinN, "n") => loc!(5787906, "Missing value for 'n'"),
        (FirstN | LastN | MaxN | MinN, _) => loc!(5787907, "Missing value for 'input'"),
        (Median | Percentile, _) => Error::Coded {
            code: 40414,
            name: "IDLFailedToParse",
            msg: format!("BSON field '{op}.{r}' is missing but a required field"),
        },
        _ => loc!(
            40539,
            "missing '{r}' argument to {op}, provided: {}",
            crate::error::render(&Bson::Document(d.clone()))
        ),
    }
}
