//! Evaluation of a parsed [`Expr`] against one document.
//!
//! Owns: [`Env`] (the document and the variables bound around the expression
//! being evaluated), the walk over the expression tree and the dispatch of
//! each operator to its family module. Short-circuiting operators (`$and`,
//! `$or`, `$cond`, `$ifNull`, `$switch`) and every named-argument operator
//! receive their unevaluated arguments, because evaluating every argument
//! first would raise errors MongoDB never raises (`{$cond: [false, {$divide:
//! [1, 0]}, 0]}` is `0`; `onError`/`onNull` are evaluated only when needed);
//! so does `$concat`, which stops at its first null argument (as MongoDB's
//! does) and at the size limit; every other operator receives its evaluated
//! arguments.
//!
//! Invariants: arity was checked at parse time; [`arg`] re-checks it and
//! answers an internal error rather than panicking, so a parser bug cannot
//! crash a query. Variables were resolved at parse time: an id without a
//! frame is an internal error, never a panic. Values that grow (documents and
//! arrays built from expressions, `$concat`) are measured as they are built
//! and refused with BSONObjectTooLarge (10334) the moment they pass 16 MiB: a
//! too-large value is never completed, so the memory an expression holds
//! stays within a few times the document limit.

use bson::{Bson, Document};

use crate::doc::size::{array_element_len, SizeBudget};
use crate::error::{Error, Result};
use crate::query::expr::{arithmetic, array, compare, convert, date, logic, object};
use crate::query::expr::{path_bson, regex, set, string, vars};
use crate::query::expr::{Expr, Named, Op, Root, Value};

/// What an expression is evaluated in: the document (`$$ROOT`/`$$CURRENT`)
/// and the variables bound by enclosing `$let`/`$map`/`$filter`/`$reduce`.
#[derive(Clone, Copy)]
pub struct Env<'a> {
    pub(super) root: &'a Root<'a>,
    frame: Option<&'a Frame<'a>>,
}

/// One bound variable, linked to the frames around it.
pub(super) struct Frame<'a> {
    id: u32,
    value: Value,
    parent: Option<&'a Frame<'a>>,
}

impl Frame<'_> {
    /// The bound value, taken back.
    pub(super) fn into_value(self) -> Value {
        self.value
    }
}

impl<'a> Env<'a> {
    /// An environment with no user variables bound.
    pub fn new(root: &'a Root<'a>) -> Env<'a> {
        Env { root, frame: None }
    }

    /// A frame binding `id` to `value` inside this environment (to be
    /// entered with [`Env::enter`]).
    pub(super) fn frame(&self, id: u32, value: Value) -> Frame<'a> {
        Frame {
            id,
            value,
            parent: self.frame,
        }
    }

    /// This environment with `frame` innermost.
    pub(super) fn enter<'b>(&self, frame: &'b Frame<'b>) -> Env<'b>
    where
        'a: 'b,
    {
        Env {
            root: self.root,
            frame: Some(frame),
        }
    }

    fn var(&self, id: u32) -> Result<&Value> {
        let mut f = self.frame;
        while let Some(fr) = f {
            if fr.id == id {
                return Ok(&fr.value);
            }
            f = fr.parent;
        }
        Err(Error::Internal(format!("variable {id} is not bound")))
    }
}

impl Expr {
    /// Evaluate against `root`, with no user variables bound.
    pub fn eval(&self, root: &Root<'_>) -> Result<Value> {
        self.eval_in(&Env::new(root))
    }

    /// Evaluate against `root` with the variable `id` bound to `value` (a
    /// stage's own binding: `$redact`'s `CURRENT`, from
    /// [`Scope::parse_redact`](crate::query::expr::Scope::parse_redact)).
    pub fn eval_bound(&self, root: &Root<'_>, id: u32, value: Value) -> Result<Value> {
        let env = Env::new(root);
        let frame = env.frame(id, value);
        self.eval_in(&env.enter(&frame))
    }

    /// Evaluate in `cx`.
    pub fn eval_in(&self, cx: &Env<'_>) -> Result<Value> {
        match self {
            Expr::Literal(b) => Ok(Some(b.clone())),
            Expr::Field(parts) | Expr::Root(parts) => cx.root.get(parts),
            Expr::Remove => Ok(None),
            Expr::Var(id, path) => Ok(cx.var(*id)?.as_ref().and_then(|v| path_bson(v, path))),
            Expr::Doc(fields) => {
                let mut out = Document::new();
                let mut size = SizeBudget::new("an expression's document");
                for (k, e) in fields {
                    if let Some(v) = e.eval_in(cx)? {
                        size.add_element(k, &v)?;
                        out.insert(k.clone(), v);
                    }
                }
                Ok(Some(Bson::Document(out)))
            }
            Expr::Array(items) => {
                let mut out = Vec::with_capacity(items.len());
                let mut size = SizeBudget::new("an expression's array");
                for e in items {
                    // Missing inside an array literal becomes null, as in MongoDB.
                    let v = e.eval_in(cx)?.unwrap_or(Bson::Null);
                    size.add(array_element_len(out.len(), &v))?;
                    out.push(v);
                }
                Ok(Some(Bson::Array(out)))
            }
            Expr::Op(op, args) => eval_op(*op, args, cx),
            Expr::Named(n, args) => eval_named(*n, args, cx),
            Expr::Let(bound, body) => vars::eval_let(bound, body, cx),
            Expr::Map(input, id, body) => vars::eval_map(input, *id, body, cx),
            Expr::Filter(input, id, cond, limit) => {
                vars::eval_filter(input, *id, cond, limit.as_deref(), cx)
            }
            Expr::Reduce(input, init, value, this, body) => {
                vars::eval_reduce(input, init, (*value, *this), body, cx)
            }
            Expr::Switch(branches, default) => logic::eval_switch(branches, default.as_deref(), cx),
        }
    }
}

fn eval_op(op: Op, args: &[Expr], cx: &Env<'_>) -> Result<Value> {
    match op {
        Op::And | Op::Or | Op::Cond | Op::IfNull => logic::eval_lazy(op, args, cx),
        // One argument at a time, so a too-long result is refused before it exists.
        Op::Concat => string::concat(args, cx),
        _ => {
            let vals = args
                .iter()
                .map(|a| a.eval_in(cx))
                .collect::<Result<Vec<Value>>>()?;
            apply(op, vals)
        }
    }
}

/// Apply a non-short-circuiting operator to evaluated arguments, by family.
fn apply(op: Op, vals: Vec<Value>) -> Result<Value> {
    use Op::*;
    match op {
        Add | Subtract | Multiply | Divide | Mod | Abs | Floor | Ceil | Round | Trunc | Pow
        | Log | Log10 | Ln | Exp | Sqrt | Sin | Cos | Tan | Asin | Acos | Atan | Atan2 | Sinh
        | Cosh | Tanh | Asinh | Acosh | Atanh | DegreesToRadians | RadiansToDegrees | Sum | Avg
        | StdDevPop | StdDevSamp | Rand => arithmetic::apply(op, &vals),
        Eq | Ne | Gt | Gte | Lt | Lte | Cmp | Max | Min => compare::apply(op, vals),
        Not => Ok(Some(Bson::Boolean(!logic::truthy(arg(op, &vals, 0)?)))),
        In | Size | ArrayElemAt | First | Last | ConcatArrays | IndexOfArray | IsArray | Range
        | ReverseArray | Slice | ArrayToObject | ObjectToArray => array::apply(op, vals),
        SetUnion | SetIntersection | SetDifference | SetEquals | SetIsSubset | AnyElementTrue
        | AllElementsTrue => set::apply(op, &vals),
        ToLower | ToUpper | SubstrBytes | SubstrCP | StrLenBytes | StrLenCP | Split
        | IndexOfBytes | IndexOfCP | Strcasecmp => string::apply(op, &vals),
        Type | IsNumber | ToString | ToInt | ToLong | ToDouble | ToDecimal | ToBool | ToDate
        | ToObjectId | ToHashedIndexKey => convert::apply(op, &vals),
        MergeObjects | BsonSize | BinarySize | TsSecond | TsIncrement => object::apply(op, vals),
        BitAnd | BitOr | BitXor | BitNot => arithmetic::bitwise(op, &vals),
        And | Or | Cond | IfNull | Concat => Err(Error::Internal(format!(
            "{} is evaluated lazily",
            op.name()
        ))),
    }
}

fn eval_named(n: Named, args: &[Option<Expr>], cx: &Env<'_>) -> Result<Value> {
    use Named::*;
    let a = Args { n, args, cx };
    match n {
        Convert => convert::convert(&a),
        Trim | LTrim | RTrim | ReplaceOne | ReplaceAll => string::named(&a),
        RegexMatch | RegexFind | RegexFindAll => regex::named(&a),
        Zip | SortArray | FirstN | LastN | MaxN | MinN | Median | Percentile => array::named(&a),
        GetField | SetField | UnsetField => object::named(&a),
        _ => date::named(&a),
    }
}

/// The unevaluated arguments of a named-argument operator.
pub(super) struct Args<'x, 'a> {
    pub n: Named,
    args: &'x [Option<Expr>],
    pub cx: &'x Env<'a>,
}

impl Args<'_, '_> {
    fn index(&self, key: &str) -> Result<usize> {
        self.n
            .keys()
            .iter()
            .position(|k| *k == key)
            .ok_or_else(|| Error::Internal(format!("{} has no argument {key}", self.n.name())))
    }

    /// Whether argument `key` was given.
    pub fn given(&self, key: &str) -> bool {
        self.index(key)
            .ok()
            .and_then(|i| self.args.get(i))
            .is_some_and(Option::is_some)
    }

    /// Argument `key` evaluated (missing when not given).
    pub fn get(&self, key: &str) -> Result<Value> {
        let i = self.index(key)?;
        match self.args.get(i) {
            Some(Some(e)) => e.eval_in(self.cx),
            _ => Ok(None),
        }
    }

    /// The operator's name.
    pub fn name(&self) -> &'static str {
        self.n.name()
    }
}

/// Argument `i` of `op` (arity was checked at parse time; re-checked here
/// defensively without panicking).
pub(super) fn arg(op: Op, vals: &[Value], i: usize) -> Result<&Value> {
    vals.get(i)
        .ok_or_else(|| Error::Internal(format!("{}: missing argument {i}", op.name())))
}

/// The answer of most operators to a null or missing argument.
pub(super) fn null() -> Result<Value> {
    Ok(Some(Bson::Null))
}
