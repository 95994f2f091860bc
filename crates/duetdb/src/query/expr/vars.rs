//! Operators that bind variables: `$let`, `$map`, `$filter`, `$reduce`.
//!
//! Invariants: a bound value lives in a stack frame ([`super::eval::Frame`])
//! only while its body is evaluated; `$let`'s values are all evaluated in the
//! outer environment before any is bound (as MongoDB's), `$map`/`$filter`
//! bind each element in turn, `$reduce` binds `$$value` and `$$this`. A
//! null or missing input gives null. Outputs that grow are measured as they
//! are built (10334).

use bson::Bson;

use crate::doc::size::{array_element_len, SizeBudget};
use crate::error::Result;
use crate::query::expr::eval::{null, Env};
use crate::query::expr::logic::truthy;
use crate::query::expr::{is_nullish, num_of, type_name, Expr, Num, Value};

pub(super) fn eval_let(bound: &[(u32, Expr)], body: &Expr, cx: &Env<'_>) -> Result<Value> {
    let values = bound
        .iter()
        .map(|(id, e)| Ok((*id, e.eval_in(cx)?)))
        .collect::<Result<Vec<_>>>()?;
    bind_all(&values, body, cx)
}

fn bind_all(values: &[(u32, Value)], body: &Expr, cx: &Env<'_>) -> Result<Value> {
    let Some(((id, v), rest)) = values.split_first() else {
        return body.eval_in(cx);
    };
    let f = cx.frame(*id, v.clone());
    bind_all(rest, body, &cx.enter(&f))
}

/// The array input of `$map`/`$filter`/`$reduce`; `None`: null or missing.
fn input_array(
    v: Value,
    err: impl FnOnce(&Value) -> crate::error::Error,
) -> Result<Option<Vec<Bson>>> {
    if is_nullish(&v) {
        return Ok(None);
    }
    match v {
        Some(Bson::Array(a)) => Ok(Some(a)),
        other => Err(err(&other)),
    }
}

pub(super) fn eval_map(input: &Expr, id: u32, body: &Expr, cx: &Env<'_>) -> Result<Value> {
    let Some(items) = input_array(input.eval_in(cx)?, |v| {
        loc!(16883, "input to $map must be an array not {}", type_name(v))
    })?
    else {
        return null();
    };
    let mut out = Vec::with_capacity(items.len());
    let mut size = SizeBudget::new("$map");
    for item in items {
        let f = cx.frame(id, Some(item));
        let v = body.eval_in(&cx.enter(&f))?.unwrap_or(Bson::Null);
        size.add(array_element_len(out.len(), &v))?;
        out.push(v);
    }
    Ok(Some(Bson::Array(out)))
}

pub(super) fn eval_filter(
    input: &Expr,
    id: u32,
    cond: &Expr,
    limit: Option<&Expr>,
    cx: &Env<'_>,
) -> Result<Value> {
    let Some(items) = input_array(input.eval_in(cx)?, |v| {
        loc!(
            28651,
            "input to $filter must be an array not {}",
            type_name(v)
        )
    })?
    else {
        return null();
    };
    let limit = match limit {
        None => usize::MAX,
        Some(e) => {
            let v = e.eval_in(cx)?;
            if is_nullish(&v) {
                usize::MAX
            } else {
                let n = match v.as_ref().and_then(num_of) {
                    Some(Num::I32(i)) => i64::from(i),
                    Some(Num::I64(i)) if i32::try_from(i).is_ok() => i,
                    Some(Num::F64(f)) if f.fract() == 0.0 && f.abs() <= f64::from(i32::MAX) => {
                        f as i64
                    }
                    _ => {
                        return Err(loc!(
                            327391,
                            "$filter: limit must be represented as a 32-bit integral value: {}",
                            crate::error::render(v.as_ref().unwrap_or(&Bson::Null))
                        ))
                    }
                };
                if n < 1 {
                    return Err(loc!(327392, "$filter: limit must be greater than 0: {n}"));
                }
                usize::try_from(n).unwrap_or(usize::MAX)
            }
        }
    };
    let mut out = Vec::new();
    for item in items {
        if out.len() >= limit {
            break;
        }
        let f = cx.frame(id, Some(item));
        if truthy(&cond.eval_in(&cx.enter(&f))?) {
            if let Some(v) = f.into_value() {
                out.push(v);
            }
        }
    }
    Ok(Some(Bson::Array(out)))
}

pub(super) fn eval_reduce(
    input: &Expr,
    init: &Expr,
    (value_id, this_id): (u32, u32),
    body: &Expr,
    cx: &Env<'_>,
) -> Result<Value> {
    let Some(items) = input_array(input.eval_in(cx)?, |v| {
        loc!(
            40080,
            "$reduce requires that 'input' be an array, found: {}",
            crate::error::render(v.as_ref().unwrap_or(&Bson::Null))
        )
    })?
    else {
        return null();
    };
    let mut acc = init.eval_in(cx)?;
    for item in items {
        let fv = cx.frame(value_id, acc);
        let outer = cx.enter(&fv);
        let ft = outer.frame(this_id, Some(item));
        acc = body.eval_in(&outer.enter(&ft))?;
        if let Some(v) = &acc {
            SizeBudget::new("$reduce").add(crate::doc::size::value_len(v))?;
        }
    }
    Ok(acc)
}
