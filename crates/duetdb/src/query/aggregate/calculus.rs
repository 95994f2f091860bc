//! The numeric window functions of `$setWindowFields` that are not `$group`
//! accumulators: `$derivative`, `$integral` (over the single sortBy field as
//! the x axis), `$expMovingAvg`, `$covariancePop` and `$covarianceSamp`.
//!
//! Owns their parsing (MongoDB's argument rules and codes: 9 FailedToParse
//! for malformed arguments, 5490710 for a unit above a week) and their
//! evaluation over the windows `window.rs` computed for a partition.
//!
//! Invariants, MongoDB's semantics:
//! - `$derivative` is (y_last − y_first) / (x_last − x_first) over the
//!   window's first and last documents; a zero run (a one-document window)
//!   answers null, an empty window null; it needs explicit window bounds.
//! - `$integral` is the trapezoidal rule over consecutive documents of the
//!   window; one document gives 0, none null, any NaN makes NaN.
//! - With `unit` the x values must be dates and the result is per `unit`;
//!   without it they must be numbers (5624900–5624902, 5423900–5423902).
//! - `$expMovingAvg` runs from the partition's start to each document
//!   (no `window`), skipping non-numeric inputs: r = v·α + r·(1 − α).
//! - `$covariance*` take `[x, y]`; pairs that are not both finite numbers
//!   are skipped; the population form needs one pair, the sample form two.
//! - Results are doubles; Decimal128 inputs are computed as doubles (MongoDB
//!   answers Decimal128 for them: a documented difference).
//!
//! Cost: `$integral` and `$covariance*` use prefix sums over the partition,
//! O(n) after the windows are known, whatever the window sizes.

use bson::Bson;

use crate::error::Result;
use crate::query::aggregate::window::Rows;
use crate::query::aggregate::ParseCtx;
use crate::query::expr::{decimal, num_of, type_name, Expr, Root, Value};

fn failed(msg: impl Into<String>) -> crate::error::Error {
    coded!(9, msg)
}

/// A parsed numeric window function.
#[derive(Debug, Clone)]
pub(super) enum Calc {
    Derivative { input: Expr, unit_ms: Option<i64> },
    Integral { input: Expr, unit_ms: Option<i64> },
    ExpMovingAvg { input: Expr, alpha: f64 },
    Covariance { input: Expr, sample: bool },
}

/// Milliseconds in a `unit` of `$derivative`/`$integral` (week or smaller).
fn unit_millis(v: &Bson) -> Result<i64> {
    let Bson::String(s) = v else {
        return Err(failed(format!(
            "unit' must be a string, but got {}",
            type_name(&Some(v.clone()))
        )));
    };
    Ok(match s.as_str() {
        "millisecond" => 1,
        "second" => 1_000,
        "minute" => 60_000,
        "hour" => 3_600_000,
        "day" => 86_400_000,
        "week" => 604_800_000,
        "month" | "quarter" | "year" => {
            return Err(coded!(5490710, "unit must be 'week' or smaller"))
        }
        other => return Err(failed(format!("unknown time unit value: {other}"))),
    })
}

/// `{input, unit}` of `$derivative` / `$integral`.
fn input_and_unit(name: &str, arg: &Bson, ctx: &ParseCtx) -> Result<(Expr, Option<i64>)> {
    let Bson::Document(a) = arg else {
        return Err(failed(format!(
            "{name} expects an object, but got a {}: {}",
            type_name(&Some(arg.clone())),
            crate::error::render(arg)
        )));
    };
    let mut input = None;
    let mut unit = None;
    for (k, v) in a {
        match k.as_str() {
            "input" => input = Some(ctx.expr(v)?),
            "unit" if unit.is_none() => unit = Some(unit_millis(v)?),
            "unit" => {
                return Err(failed(format!(
                    "There can be only one 'unit' field for {name}"
                )))
            }
            other => return Err(failed(format!("{name} got unexpected argument: {other}"))),
        }
    }
    let input = input.ok_or_else(|| failed(format!("{name} requires an 'input' expression")))?;
    Ok((input, unit))
}

/// `$derivative` / `$integral`: a single-field sortBy (9 otherwise) and, for
/// `$derivative`, explicit window bounds.
pub(super) fn parse_with_unit(
    name: &str,
    arg: &Bson,
    sort_fields: Option<usize>,
    has_window: bool,
    ctx: &ParseCtx,
) -> Result<Calc> {
    match sort_fields {
        None => return Err(failed(format!("{name} requires a sortBy"))),
        Some(1) => {}
        Some(_) => return Err(failed(format!("{name} requires a non-compound sortBy"))),
    }
    let (input, unit_ms) = input_and_unit(name, arg, ctx)?;
    if name == "$derivative" {
        if !has_window {
            return Err(failed("$derivative requires explicit window bounds"));
        }
        Ok(Calc::Derivative { input, unit_ms })
    } else {
        Ok(Calc::Integral { input, unit_ms })
    }
}

/// `$expMovingAvg: {input, N | alpha}` (no window; a sortBy).
pub(super) fn parse_exp_moving_avg(
    arg: &Bson,
    sorted: bool,
    has_window: bool,
    ctx: &ParseCtx,
) -> Result<Calc> {
    let shape = || {
        failed(
            "$expMovingAvg sub object must have exactly two fields: An 'input' field, and either an 'N' field or an 'alpha' field",
        )
    };
    if has_window {
        return Err(failed(
            "$expMovingAvg must have exactly one argument that is an object",
        ));
    }
    let Bson::Document(a) = arg else {
        return Err(failed(
            "$expMovingAvg must have exactly one argument that is an object",
        ));
    };
    if a.len() != 2 || !a.contains_key("input") {
        return Err(shape());
    }
    if !sorted {
        return Err(failed("$expMovingAvg requires an explicit 'sortBy'"));
    }
    let input = ctx.expr(a.get("input").ok_or_else(shape)?)?;
    let alpha = if let Some(n) = a.get("N") {
        let Some(num) = num_of(n) else {
            return Err(failed(format!(
                "'N' field must be an integer, but found type {}",
                type_name(&Some(n.clone()))
            )));
        };
        let f = num.to_f64();
        if f.fract() != 0.0 {
            return Err(failed(format!(
                "'N' field must be an integer, but found  {f}. To use a non-integer, use the 'alpha' argument instead"
            )));
        }
        if f <= 0.0 {
            return Err(failed(format!("'N' must be greater than zero. Got {f}")));
        }
        2.0 / (f + 1.0)
    } else if let Some(al) = a.get("alpha") {
        let Some(num) = num_of(al) else {
            return Err(failed(format!(
                "'alpha' field must be numeric, but found type {}",
                type_name(&Some(al.clone()))
            )));
        };
        let f = num.to_f64();
        if !(f > 0.0 && f < 1.0) {
            return Err(failed(format!(
                "'alpha' must be between 0 and 1 (exclusive), found {f}"
            )));
        }
        f
    } else {
        return Err(shape());
    };
    Ok(Calc::ExpMovingAvg { input, alpha })
}

/// `$covariancePop` / `$covarianceSamp: [x, y]` (an expression giving a pair).
pub(super) fn parse_covariance(name: &str, arg: &Bson, ctx: &ParseCtx) -> Result<Calc> {
    Ok(Calc::Covariance {
        input: ctx.expr(arg)?,
        sample: name == "$covarianceSamp",
    })
}

/// A number as f64 (Decimal128 included), if `v` is one.
fn as_f64(v: &Value) -> Option<f64> {
    match v {
        Some(Bson::Decimal128(d)) => Some(decimal::to_f64(decimal::from_bson(*d))),
        Some(b) => num_of(b).map(|n| n.to_f64()),
        None => None,
    }
}

fn nullish(v: &Value) -> bool {
    matches!(v, None | Some(Bson::Null) | Some(Bson::Undefined))
}

fn double(f: f64) -> Value {
    Some(Bson::Double(f))
}

impl Calc {
    /// Whether the function takes windows (and so needs `windows`).
    pub(super) fn windowed(&self) -> bool {
        !matches!(self, Calc::ExpMovingAvg { .. })
    }

    /// The value for every document of a partition, in order, to `out`.
    /// `xs` are the sortBy field's values; `windows[i]` is document i's
    /// `[start, end)`.
    pub(super) fn compute(
        &self,
        rows: &dyn Rows,
        xs: &[Value],
        windows: &[(usize, usize)],
        out: &mut dyn FnMut(Value) -> Result<()>,
    ) -> Result<()> {
        match self {
            Calc::Derivative { input, unit_ms } => {
                derivative(input, *unit_ms, rows, xs, windows, out)
            }
            Calc::Integral { input, unit_ms } => integral(input, *unit_ms, rows, xs, windows, out),
            Calc::ExpMovingAvg { input, alpha } => {
                let mut cur: Option<f64> = None;
                for i in 0..rows.len() {
                    if let Some(v) = as_f64(&input.eval(&Root::Doc(&*rows.get(i)?))?) {
                        cur = Some(match cur {
                            None => v,
                            Some(r) => v * alpha + r * (1.0 - alpha),
                        });
                    }
                    out(Some(cur.map_or(Bson::Null, Bson::Double)))?;
                }
                Ok(())
            }
            Calc::Covariance { input, sample } => covariance(input, *sample, rows, windows, out),
        }
    }
}

/// The x value of a `$derivative` (`deriv`) or `$integral` point: dates (as
/// ms) with a unit, numbers without one.
fn x_of(x: &Value, unit: bool, deriv: bool) -> Result<f64> {
    let date = matches!(x, Some(Bson::DateTime(_)));
    match (x, unit, deriv) {
        (Some(Bson::DateTime(t)), true, _) => Ok(t.timestamp_millis() as f64),
        (_, true, true) => Err(coded!(
            5624900,
            "$derivative with 'unit' expects the sortBy field to be a Date",
        )),
        (_, true, false) => Err(coded!(
            5423901,
            "$integral with 'unit' expects the sortBy field to be a Date",
        )),
        (_, false, true) if date => Err(coded!(
            5624901,
            "$derivative where the sortBy is a Date requires an 'unit'",
        )),
        (v, false, true) => as_f64(v).ok_or_else(|| {
            coded!(
                5624902,
                "$derivative (with no 'unit') expects the sortBy field to be numeric",
            )
        }),
        (v, false, false) => as_f64(v).ok_or_else(|| {
            coded!(
                5423902,
                "$integral (with no 'unit') expects the sortBy field to be numeric",
            )
        }),
    }
}

fn derivative(
    input: &Expr,
    unit_ms: Option<i64>,
    rows: &dyn Rows,
    xs: &[Value],
    windows: &[(usize, usize)],
    out: &mut dyn FnMut(Value) -> Result<()>,
) -> Result<()> {
    for &(s, e) in windows {
        if e <= s {
            out(Some(Bson::Null))?;
            continue;
        }
        let (l, r) = (s, e - 1);
        let x0 = x_of(&xs[l], unit_ms.is_some(), true)?;
        let x1 = x_of(&xs[r], unit_ms.is_some(), true)?;
        let (y0, y1) = (
            input.eval(&Root::Doc(&*rows.get(l)?))?,
            input.eval(&Root::Doc(&*rows.get(r)?))?,
        );
        if nullish(&y0) || nullish(&y1) {
            return Err(coded!(
                5624903,
                "$derivative input must not be null or missing"
            ));
        }
        let (Some(y0n), Some(y1n)) = (as_f64(&y0), as_f64(&y1)) else {
            let bad = if as_f64(&y1).is_none() { &y1 } else { &y0 };
            return Err(coded!(
                16556,
                format!(
                    "cant $subtract a {} from a {}",
                    type_name(&y0),
                    type_name(bad)
                ),
            ));
        };
        let run = x1 - x0;
        if run == 0.0 {
            out(Some(Bson::Null))?;
            continue;
        }
        let rate = (y1n - y0n) / run;
        out(double(match unit_ms {
            Some(ms) => rate * ms as f64,
            None => rate,
        }))?;
    }
    Ok(())
}

/// Which documents belong to at least one window (only those are checked,
/// as MongoDB checks the values it adds to a window).
fn covered(n: usize, windows: &[(usize, usize)]) -> Vec<bool> {
    let mut delta = vec![0i64; n + 1];
    for &(s, e) in windows {
        if e > s {
            delta[s] += 1;
            delta[e] -= 1;
        }
    }
    let mut run = 0;
    (0..n)
        .map(|i| {
            run += delta[i];
            run > 0
        })
        .collect()
}

fn integral(
    input: &Expr,
    unit_ms: Option<i64>,
    rows: &dyn Rows,
    xs: &[Value],
    windows: &[(usize, usize)],
    out: &mut dyn FnMut(Value) -> Result<()>,
) -> Result<()> {
    let n = rows.len();
    let used = covered(n, windows);
    let shape = || {
        coded!(
            5423900,
            "The input value of $integral window function must be a vector of 2 value, the first value must be numeric or date type and the second must be numeric.",
        )
    };
    // Points (x, y) of the covered documents; others are never read.
    let mut pts: Vec<(f64, f64)> = Vec::with_capacity(n);
    for i in 0..n {
        if !used[i] {
            pts.push((0.0, 0.0));
            continue;
        }
        let y = as_f64(&input.eval(&Root::Doc(&*rows.get(i)?))?).ok_or_else(shape)?;
        let is_x = matches!(&xs[i], Some(Bson::DateTime(_))) || as_f64(&xs[i]).is_some();
        if !is_x {
            return Err(shape());
        }
        let x = x_of(&xs[i], unit_ms.is_some(), false)?;
        pts.push((x, y));
    }
    // trap[i]: the area between points i and i+1 (0 with a NaN, counted
    // in nan[] instead); prefix sums of both.
    let mut area = vec![0.0f64; n.max(1)];
    let mut nans = vec![0u64; n + 1];
    for i in 0..n {
        let is_nan = pts[i].0.is_nan() || pts[i].1.is_nan();
        nans[i + 1] = nans[i] + u64::from(is_nan && used[i]);
        if i + 1 < n {
            let (a, b) = (pts[i], pts[i + 1]);
            let t = if [a.0, a.1, b.0, b.1].iter().any(|v| v.is_nan()) {
                0.0
            } else {
                (b.0 - a.0) * (a.1 + b.1) / 2.0
            };
            area[i + 1] = area[i] + t;
        }
    }
    for &(s, e) in windows {
        if e <= s {
            out(Some(Bson::Null))?;
            continue;
        }
        if nans[e] - nans[s] > 0 {
            out(double(f64::NAN))?;
            continue;
        }
        let v = area[e - 1] - area[s];
        out(double(match unit_ms {
            Some(ms) => v / ms as f64,
            None => v,
        }))?;
    }
    Ok(())
}

fn covariance(
    input: &Expr,
    sample: bool,
    rows: &dyn Rows,
    windows: &[(usize, usize)],
    out: &mut dyn FnMut(Value) -> Result<()>,
) -> Result<()> {
    let n = rows.len();
    let mut pairs: Vec<Option<(f64, f64)>> = Vec::with_capacity(n);
    for i in 0..n {
        let v = input.eval(&Root::Doc(&*rows.get(i)?))?;
        pairs.push(match &v {
            Some(Bson::Array(a)) if a.len() == 2 => {
                match (as_f64(&Some(a[0].clone())), as_f64(&Some(a[1].clone()))) {
                    (Some(x), Some(y)) if x.is_finite() && y.is_finite() => Some((x, y)),
                    _ => None,
                }
            }
            _ => None,
        });
    }
    // Centre on the partition's means so the prefix sums stay small.
    let valid: Vec<(f64, f64)> = pairs.iter().flatten().copied().collect();
    let (mx, my) = if valid.is_empty() {
        (0.0, 0.0)
    } else {
        let k = valid.len() as f64;
        (
            valid.iter().map(|p| p.0).sum::<f64>() / k,
            valid.iter().map(|p| p.1).sum::<f64>() / k,
        )
    };
    let mut cnt = vec![0u64; n + 1];
    let mut sx = vec![0.0f64; n + 1];
    let mut sy = vec![0.0f64; n + 1];
    let mut sxy = vec![0.0f64; n + 1];
    for i in 0..n {
        let (c, x, y) = match pairs[i] {
            Some((x, y)) => (1, x - mx, y - my),
            None => (0, 0.0, 0.0),
        };
        cnt[i + 1] = cnt[i] + c;
        sx[i + 1] = sx[i] + x;
        sy[i + 1] = sy[i] + y;
        sxy[i + 1] = sxy[i] + x * y;
    }
    for &(s, e) in windows {
        let e = e.max(s);
        let k = (cnt[e] - cnt[s]) as f64;
        let need = if sample { 2.0 } else { 1.0 };
        if k < need {
            out(Some(Bson::Null))?;
            continue;
        }
        let (x, y, xy) = (sx[e] - sx[s], sy[e] - sy[s], sxy[e] - sxy[s]);
        let c = xy - x * y / k;
        out(double(c / if sample { k - 1.0 } else { k }))?;
    }
    Ok(())
}
