//! `$setWindowFields`: per-document values computed over a window of the
//! document's partition, in `sortBy` order.
//!
//! Owns: [`Window`] (partitionBy, sortBy, the output fields), the window
//! bounds (`documents: [lo, hi]`, `range: [lo, hi]` with an optional time
//! `unit`), and the functions: every mergeable or positional `$group`
//! accumulator (`$sum $avg $min $max $count $push $addToSet $first $last
//! $stdDevPop $stdDevSamp $top $bottom $topN $bottomN $firstN $lastN $maxN
//! $minN $median $percentile $mergeObjects`) over a window, the rank
//! functions `$rank $denseRank $documentNumber`, `$shift`, `$locf` and
//! `$linearFill` (which `$fill` uses); the numeric functions `$derivative
//! $integral $expMovingAvg $covariancePop $covarianceSamp` are in
//! `calculus.rs`.
//!
//! Invariants: the output is the input sorted by (partition, sortBy), ties
//! in input order; an accumulator's window `[lo, hi]` is clipped to the
//! partition and an empty window answers what the accumulator answers for
//! no input (0, null, `[]`); `range` windows need a single numeric (or, with
//! `unit`, date) `sortBy` field; the stage sorts its input through the sorter
//! by (partition, sortBy) ([`WindowRun`]: spilled with `allowDiskUse`, else
//! 292) and holds one partition at a time, under the read's memory limit
//! (292: a partition is computed in memory); each partition's output is what
//! [`Window::run`] gives for it. Cost: a window starting at
//! "unbounded" is accumulated incrementally; other windows are
//! recomputed per document (O(n·w)).

use std::cmp::Ordering;

use bson::{Bson, Document};

use crate::error::{Error, Result};
use crate::query::aggregate::calculus::{self, Calc};
use crate::query::aggregate::group::{Group, GroupState};
use crate::query::aggregate::lookup::set_nested;
use crate::query::aggregate::{ParseCtx, Runtime};
use crate::query::expr::{compare, num_of, parse_field_path, type_name, Expr, Root, Value};
use crate::query::sort::{SortKey, SortSpec};
use crate::query::sorter::Sorter;

fn failed(msg: impl Into<String>) -> Error {
    coded!(9, msg)
}

#[derive(Debug, Clone)]
pub(super) struct Window {
    partition_by: Option<Expr>,
    sort_by: Option<SortSpec>,
    /// The input's order as a sort of `{p: [<partition>], d: <document>}`
    /// (see [`Window::start`]); `None` when `sortBy` cannot be rewritten so.
    spill_sort: Option<SortSpec>,
    outputs: Vec<Output>,
}

#[derive(Debug, Clone)]
struct Output {
    path: Vec<String>,
    func: Func,
}

#[derive(Debug, Clone)]
enum Func {
    /// A `$group` accumulator (a group keyed by null with one field `v`).
    Acc(Box<Group>, Bounds),
    Rank,
    DenseRank,
    DocumentNumber,
    Shift {
        output: Expr,
        by: i64,
        default: Bson,
    },
    Locf(Expr),
    LinearFill(Expr),
    Calc(Calc, Bounds),
}

/// One end of a window.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Bound {
    Unbounded,
    Current,
    /// Documents: an offset in positions; range: an offset in the sortBy
    /// value (in `unit`s for dates).
    At(f64),
}

#[derive(Debug, Clone)]
enum Bounds {
    Documents(Bound, Bound),
    Range(Bound, Bound, Option<Unit>),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Unit {
    Millisecond,
    Second,
    Minute,
    Hour,
    Day,
    Week,
    Month,
    Quarter,
    Year,
}

impl Unit {
    fn parse(s: &str) -> Result<Unit> {
        Ok(match s {
            "millisecond" => Unit::Millisecond,
            "second" => Unit::Second,
            "minute" => Unit::Minute,
            "hour" => Unit::Hour,
            "day" => Unit::Day,
            "week" => Unit::Week,
            "month" => Unit::Month,
            "quarter" => Unit::Quarter,
            "year" => Unit::Year,
            other => return Err(failed(format!("unknown time unit value: {other}"))),
        })
    }

    /// `ms` moved by `n` units (calendar arithmetic for months and up, UTC).
    fn add(self, ms: i64, n: i64) -> Option<i64> {
        let fixed = |per: i64| n.checked_mul(per).and_then(|d| ms.checked_add(d));
        match self {
            Unit::Millisecond => fixed(1),
            Unit::Second => fixed(1000),
            Unit::Minute => fixed(60_000),
            Unit::Hour => fixed(3_600_000),
            Unit::Day => fixed(86_400_000),
            Unit::Week => fixed(604_800_000),
            Unit::Month | Unit::Quarter | Unit::Year => {
                let months = match self {
                    Unit::Month => n,
                    Unit::Quarter => n.checked_mul(3)?,
                    _ => n.checked_mul(12)?,
                };
                let t = chrono::DateTime::from_timestamp_millis(ms)?;
                let m = chrono::Months::new(u32::try_from(months.unsigned_abs()).ok()?);
                let moved = if months >= 0 {
                    t.checked_add_months(m)?
                } else {
                    t.checked_sub_months(m)?
                };
                Some(moved.timestamp_millis())
            }
        }
    }
}

/// Functions that take no `window` (MongoDB's 5371601 for the rank family).
const NO_WINDOW: &[&str] = &[
    "$rank",
    "$denseRank",
    "$documentNumber",
    "$shift",
    "$locf",
    "$linearFill",
];

impl Window {
    pub(super) fn parse(arg: &Bson, ctx: &ParseCtx) -> Result<Window> {
        let Bson::Document(spec) = arg else {
            return Err(failed(format!(
                "the $setWindowFields stage specification must be an object, found {}",
                type_name(&Some(arg.clone()))
            )));
        };
        let mut partition_by = None;
        let mut sort_by = None;
        // `p` holds the partition wrapped in a one-element array: a sort on
        // it compares the whole value as `compare` does; `d.<path>` reads
        // the document's sortBy fields as `sortBy` does.
        let mut spill_sort = Some(bson::doc! {"p": 1});
        let mut output = None;
        for (k, v) in spec {
            match k.as_str() {
                "partitionBy" => partition_by = Some(ctx.expr(v)?),
                "sortBy" => match v {
                    Bson::Document(d) if !d.is_empty() => {
                        sort_by = Some(SortSpec::parse(d)?.with_collation(ctx.collator.clone()));
                        if let Some(spec) = &mut spill_sort {
                            for (path, dir) in d {
                                spec.insert(format!("d.{path}"), dir.clone());
                            }
                        }
                    }
                    other => {
                        return Err(coded!(
                            14,
                            format!(
                                "BSON field '$setWindowFields.sortBy' is the wrong type '{}', expected type 'object'",
                                type_name(&Some(other.clone()))
                            ),
                        ))
                    }
                },
                "output" => match v {
                    Bson::Document(d) => output = Some(d),
                    other => {
                        return Err(coded!(
                            14,
                            format!(
                                "BSON field '$setWindowFields.output' is the wrong type '{}', expected type 'object'",
                                type_name(&Some(other.clone()))
                            ),
                        ))
                    }
                },
                other => {
                    return Err(coded!(
                        40415,
                        format!("BSON field '$setWindowFields.{other}' is an unknown field."),
                    ))
                }
            }
        }
        let output = output.ok_or_else(|| {
            coded!(
                40414,
                "BSON field '$setWindowFields.output' is missing but a required field",
            )
        })?;
        let mut outputs = Vec::with_capacity(output.len());
        for (path, f) in output {
            let path = parse_field_path(path)?;
            let func = parse_func(f, sort_by.as_ref(), ctx)?;
            outputs.push(Output { path, func });
        }
        Ok(Window {
            partition_by,
            sort_by,
            spill_sort: spill_sort
                .and_then(|d| SortSpec::parse(&d).ok())
                .map(|s| s.with_collation(ctx.collator.clone())),
            outputs,
        })
    }

    /// Does it sort its output (by `sortBy`)? Without one the output keeps
    /// the input order within partitions, and positions depend on it.
    pub(super) fn is_sorted(&self) -> bool {
        self.sort_by.is_some()
    }

    /// Sort `rows` by partition then sortBy and compute every output.
    pub(super) fn run(&self, rows: Vec<Document>, rt: &Runtime<'_>) -> Result<Vec<Document>> {
        let mut keyed: Vec<(Bson, Option<SortKey>, Document)> = Vec::with_capacity(rows.len());
        for d in rows {
            let part = match &self.partition_by {
                Some(e) => e.eval(&Root::Doc(&d))?.unwrap_or(Bson::Null),
                None => Bson::Null,
            };
            let key = match &self.sort_by {
                Some(s) => Some(s.sort_key(&crate::doc::to_raw_document(&d)?)),
                None => None,
            };
            keyed.push((part, key, d));
        }
        let sort = self.sort_by.as_ref();
        keyed.sort_by(|a, b| {
            compare(&a.0, &b.0).then_with(|| match (sort, &a.1, &b.1) {
                (Some(s), Some(x), Some(y)) => s.compare_keys(x, y),
                _ => Ordering::Equal,
            })
        });
        let mut out = Vec::with_capacity(keyed.len());
        let mut start = 0;
        while start < keyed.len() {
            let mut end = start + 1;
            while end < keyed.len() && compare(&keyed[end].0, &keyed[start].0) == Ordering::Equal {
                end += 1;
            }
            let part = &keyed[start..end];
            let docs: Vec<&Document> = part.iter().map(|(_, _, d)| d).collect();
            let keys: Vec<Option<&SortKey>> = part.iter().map(|(_, k, _)| k.as_ref()).collect();
            let mut values: Vec<Vec<Value>> = Vec::with_capacity(self.outputs.len());
            for o in &self.outputs {
                values.push(self.compute(&o.func, &docs, &keys, rt)?);
            }
            for (i, (_, _, d)) in keyed[start..end].iter().enumerate() {
                let mut d = d.clone();
                for (o, vals) in self.outputs.iter().zip(&values) {
                    match &vals[i] {
                        Some(v) => set_nested(&mut d, &o.path, v.clone()),
                        None => set_nested(&mut d, &o.path, Bson::Null),
                    }
                }
                out.push(d);
            }
            rt.limits.cancel.check()?;
            start = end;
        }
        Ok(out)
    }

    /// The partition of one document (missing is null).
    fn partition_of(&self, d: &Document) -> Result<Bson> {
        Ok(match &self.partition_by {
            Some(e) => e.eval(&Root::Doc(d))?.unwrap_or(Bson::Null),
            None => Bson::Null,
        })
    }

    /// Can its input be sorted through the sorter ([`Window::start`])?
    pub(super) fn can_spill(&self) -> bool {
        self.spill_sort.is_some()
    }

    /// A run whose input goes through a [`Sorter`] by (partition, sortBy):
    /// it spills past the read's memory limit when disk use is allowed, and
    /// then holds one partition at a time (a partition over the limit is
    /// 292). `None` when the sort cannot be rewritten (the stage then holds
    /// its whole input).
    pub(super) fn start(&self, rt: &Runtime<'_>) -> Option<WindowRun<'_>> {
        let spec = self.spill_sort.clone()?;
        Some(WindowRun {
            stage: self,
            sorter: Sorter::new(spec, &rt.limits, rt.spill_dir.clone(), None),
        })
    }

    /// One output's value for every document of a partition.
    fn compute(
        &self,
        func: &Func,
        docs: &[&Document],
        keys: &[Option<&SortKey>],
        rt: &Runtime<'_>,
    ) -> Result<Vec<Value>> {
        let n = docs.len();
        let same = |i: usize, j: usize| match (&self.sort_by, keys[i], keys[j]) {
            (Some(s), Some(a), Some(b)) => s.compare_keys(a, b) == Ordering::Equal,
            _ => false,
        };
        Ok(match func {
            Func::DocumentNumber => (0..n).map(|i| Some(Bson::Int64(i as i64 + 1))).collect(),
            Func::Rank => {
                let mut out = Vec::with_capacity(n);
                let mut rank = 1;
                for i in 0..n {
                    if i > 0 && !same(i - 1, i) {
                        rank = i as i64 + 1;
                    }
                    out.push(Some(Bson::Int64(rank)));
                }
                out
            }
            Func::DenseRank => {
                let mut out = Vec::with_capacity(n);
                let mut rank = 1;
                for i in 0..n {
                    if i > 0 && !same(i - 1, i) {
                        rank += 1;
                    }
                    out.push(Some(Bson::Int64(rank)));
                }
                out
            }
            Func::Shift {
                output,
                by,
                default,
            } => {
                let mut out = Vec::with_capacity(n);
                for i in 0..n {
                    let j = i as i64 + by;
                    out.push(if j >= 0 && (j as usize) < n {
                        Some(
                            output
                                .eval(&Root::Doc(docs[j as usize]))?
                                .unwrap_or(Bson::Null),
                        )
                    } else {
                        Some(default.clone())
                    });
                }
                out
            }
            Func::Locf(e) => {
                let mut out = Vec::with_capacity(n);
                let mut last: Value = None;
                for d in docs {
                    match e.eval(&Root::Doc(d))? {
                        Some(Bson::Null) | Some(Bson::Undefined) | None => {}
                        v => last = v,
                    }
                    out.push(Some(last.clone().unwrap_or(Bson::Null)));
                }
                out
            }
            Func::LinearFill(e) => self.linear_fill(e, docs)?,
            Func::Acc(group, bounds) => self.accumulate(group, bounds, docs, rt)?,
            Func::Calc(calc, bounds) => {
                let (xs, windows) = if calc.windowed() {
                    (self.sort_field_values(docs)?, self.windows(bounds, docs)?)
                } else {
                    (Vec::new(), Vec::new())
                };
                calc.compute(docs, &xs, &windows)?
            }
        })
    }

    /// `$linearFill`: nulls between two values get the value on the line
    /// through them, by the sortBy value; others stay.
    fn linear_fill(&self, e: &Expr, docs: &[&Document]) -> Result<Vec<Value>> {
        let xs = self.sort_values(docs, None)?;
        let mut ys: Vec<Option<f64>> = Vec::with_capacity(docs.len());
        let mut raw: Vec<Value> = Vec::with_capacity(docs.len());
        for d in docs {
            let v = e.eval(&Root::Doc(d))?;
            let y = match &v {
                Some(Bson::Null) | Some(Bson::Undefined) | None => None,
                Some(b) => Some(num_of(b).map(|n| n.to_f64()).ok_or_else(|| {
                    failed(format!(
                        "Value to $linearFill must be numeric or null, found {}",
                        type_name(&v)
                    ))
                })?),
            };
            ys.push(y);
            raw.push(v);
        }
        let mut out = Vec::with_capacity(docs.len());
        for i in 0..docs.len() {
            if ys[i].is_some() {
                out.push(raw[i].clone());
                continue;
            }
            let prev = (0..i).rev().find(|&j| ys[j].is_some());
            let next = (i + 1..docs.len()).find(|&j| ys[j].is_some());
            out.push(match (prev, next) {
                (Some(p), Some(q)) => {
                    let (x0, x1, x) = (xs[p], xs[q], xs[i]);
                    let (y0, y1) = (ys[p].unwrap_or(0.0), ys[q].unwrap_or(0.0));
                    let y = if x1 == x0 {
                        y0
                    } else {
                        y0 + (y1 - y0) * (x - x0) / (x1 - x0)
                    };
                    Some(Bson::Double(y))
                }
                _ => Some(Bson::Null),
            });
        }
        Ok(out)
    }

    /// The single sortBy field's values as numbers (dates as milliseconds,
    /// checked against `unit`).
    fn sort_values(&self, docs: &[&Document], unit: Option<Unit>) -> Result<Vec<f64>> {
        let Some(sort) = &self.sort_by else {
            return Err(coded!(
                5339902,
                "Range-based bounds require sortBy a single field",
            ));
        };
        if sort.keys.len() != 1 {
            return Err(coded!(
                5339902,
                "Range-based bounds require sortBy a single field",
            ));
        }
        let path = parse_field_path(&sort.keys[0].0)?;
        let mut out = Vec::with_capacity(docs.len());
        for d in docs {
            let v = Root::Doc(d).get(&path)?;
            let x = match (&v, unit) {
                (Some(Bson::DateTime(t)), Some(_)) => t.timestamp_millis() as f64,
                (Some(Bson::DateTime(_)), None) => {
                    return Err(coded!(
                        5429513,
                        "Invalid range: Expected the sortBy field to be a number, but it was Date",
                    ))
                }
                (Some(b), None) if num_of(b).is_some() => num_of(b).map_or(0.0, |n| n.to_f64()),
                (_, Some(_)) => {
                    return Err(coded!(
                        5429513,
                        format!(
                            "Invalid range: Expected the sortBy field to be a Date, but it was {}",
                            type_name(&v)
                        ),
                    ))
                }
                _ => {
                    return Err(coded!(
                        5429414,
                        format!(
                        "Invalid range: Expected the sortBy field to be a number, but it was {}",
                        type_name(&v)
                    ),
                    ))
                }
            };
            out.push(x);
        }
        Ok(out)
    }

    /// The single sortBy field's raw values (parsing made sure there is
    /// exactly one field).
    fn sort_field_values(&self, docs: &[&Document]) -> Result<Vec<Value>> {
        let Some(field) = self.sort_by.as_ref().and_then(|s| s.keys.first()) else {
            return Ok(vec![None; docs.len()]);
        };
        let path = parse_field_path(&field.0)?;
        docs.iter().map(|d| Root::Doc(d).get(&path)).collect()
    }

    /// `[start, end)` of each document's window.
    fn windows(&self, bounds: &Bounds, docs: &[&Document]) -> Result<Vec<(usize, usize)>> {
        let n = docs.len();
        Ok(match bounds {
            Bounds::Documents(lo, hi) => (0..n)
                .map(|i| {
                    let at = |b: &Bound, unbounded: usize| -> i64 {
                        match b {
                            Bound::Unbounded => unbounded as i64,
                            Bound::Current => i as i64,
                            Bound::At(k) => i as i64 + *k as i64,
                        }
                    };
                    let s = at(lo, 0).clamp(0, n as i64) as usize;
                    let e = (at(hi, n.saturating_sub(1)) + 1).clamp(0, n as i64) as usize;
                    (s, e.max(s))
                })
                .collect(),
            Bounds::Range(lo, hi, unit) => self.range_windows(docs, *lo, *hi, *unit)?,
        })
    }

    /// An accumulator over each document's window.
    fn accumulate(
        &self,
        group: &Group,
        bounds: &Bounds,
        docs: &[&Document],
        rt: &Runtime<'_>,
    ) -> Result<Vec<Value>> {
        let n = docs.len();
        let windows = self.windows(bounds, docs)?;
        let mut group = group.clone();
        group.memory_limit = group.memory_limit.min(rt.limits.memory_limit_bytes);
        let value_of = |state: GroupState, group: &Group| -> Result<Value> {
            let doc = match group.finish(state)?.pop() {
                Some(d) => d,
                None => group.empty_result(),
            };
            Ok(doc.get("v").cloned())
        };
        let mut out = Vec::with_capacity(n);
        // Windows starting at the partition's start grow monotonically:
        // accumulate incrementally.
        let incremental =
            windows.iter().all(|(s, _)| *s == 0) && windows.windows(2).all(|w| w[0].1 <= w[1].1);
        if incremental {
            let mut state = GroupState::default();
            let mut fed = 0;
            for &(_, e) in &windows {
                while fed < e {
                    group.accumulate(&mut state, Root::Doc(docs[fed]))?;
                    fed += 1;
                }
                out.push(value_of(state.clone(), &group)?);
            }
            return Ok(out);
        }
        for (i, &(s, e)) in windows.iter().enumerate() {
            if i % 256 == 255 {
                rt.limits.cancel.check()?;
            }
            let mut state = GroupState::default();
            for d in &docs[s..e] {
                group.accumulate(&mut state, Root::Doc(d))?;
            }
            out.push(value_of(state, &group)?);
        }
        Ok(out)
    }

    /// `[start, end)` of each document's range window.
    fn range_windows(
        &self,
        docs: &[&Document],
        lo: Bound,
        hi: Bound,
        unit: Option<Unit>,
    ) -> Result<Vec<(usize, usize)>> {
        let xs = self.sort_values(docs, unit)?;
        let asc = self
            .sort_by
            .as_ref()
            .and_then(|s| s.keys.first())
            .is_none_or(|(_, a)| *a);
        let n = xs.len();
        let shift = |x: f64, b: Bound| -> Option<f64> {
            match b {
                Bound::Unbounded => None,
                Bound::Current => Some(x),
                Bound::At(k) => Some(match unit {
                    None => x + k,
                    Some(u) => u
                        .add(x as i64, k as i64)
                        .map_or(f64::INFINITY, |v| v as f64),
                }),
            }
        };
        let mut out = Vec::with_capacity(n);
        for &x in &xs {
            let (low, high) = (shift(x, lo), shift(x, hi));
            let in_low = |v: f64| low.is_none_or(|l| v >= l);
            let in_high = |v: f64| high.is_none_or(|h| v <= h);
            let (s, e) = if asc {
                (
                    xs.partition_point(|&v| !in_low(v)),
                    xs.partition_point(|&v| in_high(v)),
                )
            } else {
                (
                    xs.partition_point(|&v| !in_high(v)),
                    xs.partition_point(|&v| in_low(v)),
                )
            };
            out.push((s, e.max(s)));
        }
        Ok(out)
    }
}

/// One output field's function (`{$op: arg, window: {...}}`).
fn parse_func(f: &Bson, sort_by: Option<&SortSpec>, ctx: &ParseCtx) -> Result<Func> {
    let Bson::Document(d) = f else {
        return Err(failed(format!(
            "The field '{}' must be an object",
            crate::error::render(f)
        )));
    };
    let mut op = None;
    let mut window = None;
    for (k, v) in d {
        if k == "window" {
            window = Some(v);
        } else if op.is_some() {
            return Err(failed(format!(
                "Window function found an unknown argument: {k}"
            )));
        } else {
            op = Some((k.as_str(), v));
        }
    }
    let Some((name, arg)) = op else {
        return Err(failed(
            "Expected a window function, found only 'window' in the output field",
        ));
    };
    if NO_WINDOW.contains(&name) && window.is_some() {
        return Err(failed(format!("{name} does not accept a 'window' field")));
    }
    let need_sort = |what: &str, one: bool| -> Result<()> {
        match sort_by {
            Some(s) if !one || s.keys.len() == 1 => Ok(()),
            _ => Err(coded!(
                5371602,
                format!(
                    "{what} must be specified with a top level sortBy expression with exactly one element"
                ),
            )),
        }
    };
    let empty_object = |what: &str| -> Result<()> {
        match arg {
            Bson::Document(a) if a.is_empty() => Ok(()),
            _ => Err(coded!(
                5371603,
                format!("{what} must be specified with '{{}}' as the value"),
            )),
        }
    };
    match name {
        "$rank" | "$denseRank" | "$documentNumber" => {
            empty_object(name)?;
            need_sort(name, name != "$documentNumber")?;
            Ok(match name {
                "$rank" => Func::Rank,
                "$denseRank" => Func::DenseRank,
                _ => Func::DocumentNumber,
            })
        }
        "$shift" => {
            need_sort("$shift", false)?;
            let Bson::Document(a) = arg else {
                return Err(failed("Argument to $shift must be an object"));
            };
            let mut output = None;
            let mut by = None;
            let mut default = Bson::Null;
            for (k, v) in a {
                match k.as_str() {
                    "output" => output = Some(ctx.expr(v)?),
                    "by" => {
                        let n = num_of(v)
                            .map(|n| n.to_f64())
                            .filter(|f| f.fract() == 0.0 && f.abs() <= i32::MAX as f64);
                        by = Some(n.ok_or_else(|| {
                            failed(
                                "'$shift:by' field must be an integer, but found an invalid value",
                            )
                        })? as i64);
                    }
                    "default" => {
                        let e = ctx.expr(v)?;
                        let empty = Document::new();
                        default = e
                            .eval(&Root::Doc(&empty))
                            .ok()
                            .flatten()
                            .filter(|_| !matches!(v, Bson::String(s) if s.starts_with('$')))
                            .ok_or_else(|| {
                                failed("'$shift:default' expression must yield a constant value.")
                            })?;
                    }
                    other => return Err(failed(format!("Unknown argument in $shift: {other}"))),
                }
            }
            let (Some(output), Some(by)) = (output, by) else {
                return Err(failed("$shift requires an 'output' and a 'by' field"));
            };
            Ok(Func::Shift {
                output,
                by,
                default,
            })
        }
        "$locf" => Ok(Func::Locf(ctx.expr(arg)?)),
        "$linearFill" => {
            need_sort("$linearFill", true)?;
            Ok(Func::LinearFill(ctx.expr(arg)?))
        }
        "$derivative" | "$integral" => {
            let calc = calculus::parse_with_unit(
                name,
                arg,
                sort_by.map(|s| s.keys.len()),
                window.is_some(),
                ctx,
            )?;
            Ok(Func::Calc(calc, bounds_or_whole(window, sort_by)?))
        }
        "$expMovingAvg" => Ok(Func::Calc(
            calculus::parse_exp_moving_avg(arg, sort_by.is_some(), window.is_some(), ctx)?,
            Bounds::Documents(Bound::Unbounded, Bound::Current),
        )),
        "$covariancePop" | "$covarianceSamp" => Ok(Func::Calc(
            calculus::parse_covariance(name, arg, ctx)?,
            bounds_or_whole(window, sort_by)?,
        )),
        _ => {
            let mut group_spec = bson::doc! {"_id": null};
            group_spec.insert("v", bson::doc! {name: arg.clone()});
            let group = Group::parse(&group_spec, &ctx.scope)
                .map_err(|_| failed(format!("Unrecognized window function, {name}")))?
                .with_collation(ctx.collator.clone());
            Ok(Func::Acc(
                Box::new(group),
                bounds_or_whole(window, sort_by)?,
            ))
        }
    }
}

/// The `window` given, or the whole partition.
fn bounds_or_whole(window: Option<&Bson>, sort_by: Option<&SortSpec>) -> Result<Bounds> {
    match window {
        None => Ok(Bounds::Documents(Bound::Unbounded, Bound::Unbounded)),
        Some(w) => parse_bounds(w, sort_by),
    }
}

/// `{documents: [lo, hi]}` or `{range: [lo, hi], unit}`.
fn parse_bounds(w: &Bson, sort_by: Option<&SortSpec>) -> Result<Bounds> {
    let Bson::Document(w) = w else {
        return Err(failed("'window' field must be an object"));
    };
    let mut documents = None;
    let mut range = None;
    let mut unit = None;
    for (k, v) in w {
        match k.as_str() {
            "documents" => documents = Some(pair("documents", v, true)?),
            "range" => range = Some(pair("range", v, false)?),
            "unit" => match v {
                Bson::String(s) => unit = Some(Unit::parse(s)?),
                _ => return Err(failed("'unit' must be a string")),
            },
            other => {
                return Err(failed(format!(
                    "'window' field can only contain 'documents' as the only argument or 'range' with an optional 'unit' field, found {other}"
                )))
            }
        }
    }
    let sorted = sort_by.is_some();
    match (documents, range) {
        (Some((lo, hi)), None) => {
            if unit.is_some() {
                return Err(failed("'unit' can only be specified with a 'range' window"));
            }
            let positional = lo != Bound::Unbounded || hi != Bound::Unbounded;
            if positional && !sorted {
                return Err(coded!(
                    5339901,
                    "Document-based bounds require a sortBy",
                ));
            }
            Ok(Bounds::Documents(lo, hi))
        }
        (None, Some((lo, hi))) => {
            if sort_by.is_none_or(|s| s.keys.len() != 1) {
                return Err(coded!(
                    5339902,
                    "Range-based bounds require sortBy a single field",
                ));
            }
            Ok(Bounds::Range(lo, hi, unit))
        }
        _ => Err(failed(
            "'window' field can only contain 'documents' as the only argument or 'range' with an optional 'unit' field",
        )),
    }
}

/// A `[lo, hi]` window; documents bounds are integers.
fn pair(what: &str, v: &Bson, integral: bool) -> Result<(Bound, Bound)> {
    let Bson::Array(items) = v else {
        return Err(failed(format!(
            "Window bounds must be a 2-element array: {what}: {}",
            crate::error::render(v)
        )));
    };
    let [lo, hi] = items.as_slice() else {
        return Err(failed(format!(
            "Window bounds must be a 2-element array: {what}: {}",
            crate::error::render(v)
        )));
    };
    let bound = |b: &Bson| -> Result<Bound> {
        match b {
            Bson::String(s) if s == "unbounded" => Ok(Bound::Unbounded),
            Bson::String(s) if s == "current" => Ok(Bound::Current),
            other => {
                let f = num_of(other).map(|n| n.to_f64()).ok_or_else(|| {
                    failed(format!(
                        "Numeric {what}-based bounds must be a number, 'current' or 'unbounded': {}",
                        crate::error::render(other)
                    ))
                })?;
                if integral && f.fract() != 0.0 {
                    return Err(failed(format!(
                        "Numeric document-based bounds must be an integer: {f}"
                    )));
                }
                Ok(Bound::At(f))
            }
        }
    };
    let (lo, hi) = (bound(lo)?, bound(hi)?);
    let pos = |b: Bound| match b {
        Bound::Unbounded => None,
        Bound::Current => Some(0.0),
        Bound::At(k) => Some(k),
    };
    if let (Some(l), Some(h)) = (pos(lo), pos(hi)) {
        if l > h {
            return Err(coded!(
                5339900,
                format!("Lower bound must not exceed upper bound: [{l}, {h}]"),
            ));
        }
    }
    Ok((lo, hi))
}

/// A `$setWindowFields` being fed: its input sorted by (partition, sortBy)
/// through a [`Sorter`], computed one partition at a time.
pub(super) struct WindowRun<'p> {
    stage: &'p Window,
    sorter: Sorter,
}

impl WindowRun<'_> {
    /// Feed one document.
    pub(super) fn push(&mut self, doc: Document) -> Result<()> {
        let part = self.stage.partition_of(&doc)?;
        let wrapped = bson::doc! {"p": [part], "d": doc};
        let raw = bson::RawDocumentBuf::try_from(&wrapped)
            .map_err(|e| Error::InvalidBson(e.to_string()))?;
        self.sorter.push(std::sync::Arc::new(raw))
    }

    /// Compute every partition in order, handing each output document to
    /// `emit` (`true`: stop).
    pub(super) fn finish(
        self,
        rt: &Runtime<'_>,
        emit: &mut dyn FnMut(Document) -> Result<bool>,
    ) -> Result<()> {
        let limit = rt.limits.memory_limit_bytes;
        let mut part: Option<Bson> = None;
        let mut held: Vec<Document> = Vec::new();
        let mut bytes = 0usize;
        let mut flush = |held: &mut Vec<Document>| -> Result<bool> {
            for d in self.stage.run(std::mem::take(held), rt)? {
                if emit(d)? {
                    return Ok(true);
                }
            }
            Ok(false)
        };
        for d in self.sorter.finish()? {
            let mut d = crate::doc::to_document(&d?)?;
            let (Some(Bson::Array(mut p)), Some(Bson::Document(doc))) =
                (d.remove("p"), d.remove("d"))
            else {
                return Err(Error::Internal(
                    "$setWindowFields: a sorted document is damaged".into(),
                ));
            };
            let p = p.pop().unwrap_or(Bson::Null);
            if part
                .as_ref()
                .is_some_and(|q| compare(q, &p) != Ordering::Equal)
            {
                if flush(&mut held)? {
                    return Ok(());
                }
                bytes = 0;
            }
            part = Some(p);
            bytes += crate::doc::size::document_len(&doc);
            if bytes > limit {
                return Err(Error::ExceededMemoryLimit(format!(
                    "$setWindowFields exceeded the memory limit of {limit} bytes in one partition; its input spills to disk, but a partition is computed in memory"
                )));
            }
            held.push(doc);
        }
        if !held.is_empty() {
            flush(&mut held)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use bson::{doc, Bson, Document};
    use proptest::prelude::*;

    use crate::query::aggregate::test_support::{reference, streamed};
    use crate::query::spill::spill_stats;

    /// Partitions of several types (arrays compared whole, missing = null),
    /// sort fields with ties.
    fn input(xs: &[(u32, u32)]) -> Vec<Document> {
        xs.iter()
            .enumerate()
            .map(|(i, (p, s))| {
                let mut d = doc! {"i": i as i32, "s": (*s % 10) as i32, "t": (*s % 3) as i32, "pad": "w".repeat(40)};
                let part = match p % 5 {
                    0 | 1 | 4 => Some(Bson::Int32((p % 40) as i32)),
                    2 => Some(Bson::String(format!("p{}", p % 7))),
                    _ if p % 2 == 0 => Some(Bson::Array(vec![Bson::Int32((p % 3) as i32)])),
                    _ => None,
                };
                if let Some(part) = part {
                    d.insert("g", part);
                }
                d
            })
            .collect()
    }

    /// Two window stages: a two-field sort (document windows, `$shift`), then
    /// a one-field sort (`$rank`, a range window).
    fn pipeline() -> Vec<Document> {
        vec![
            doc! {"$setWindowFields": {
                "partitionBy": "$g",
                "sortBy": {"s": 1, "t": -1},
                "output": {
                    "sum": {"$sum": "$i", "window": {"documents": [-1, 1]}},
                    "run": {"$sum": "$i", "window": {"documents": ["unbounded", "current"]}},
                    "firsts": {"$push": "$i", "window": {"documents": [-2, 0]}},
                    "n": {"$documentNumber": {}},
                    "prev": {"$shift": {"output": "$i", "by": -1, "default": -1}},
                },
            }},
            doc! {"$setWindowFields": {
                "partitionBy": "$g",
                "sortBy": {"s": -1},
                "output": {
                    "rank": {"$rank": {}},
                    "near": {"$count": {}, "window": {"range": [-2, 0]}},
                },
            }},
        ]
    }

    #[test]
    fn a_spilled_window_stage_computes_the_in_memory_answer() {
        let xs: Vec<(u32, u32)> = (0..2500u32)
            .map(|i| ((i * 7919) % 211, (i * 31) % 97))
            .collect();
        let docs = input(&xs);
        let want = reference(&pipeline(), &docs);
        let before = spill_stats().runs;
        let got = streamed(&pipeline(), &docs, 64 * 1024, true).expect("spilled");
        assert!(spill_stats().runs > before, "no spill");
        assert_eq!(got, want);
        // Without disk use: 292, as before.
        let e = streamed(&pipeline(), &docs, 64 * 1024, false).expect_err("over the limit");
        assert_eq!(e.code(), 292);
        // One partition bigger than the limit: 292 even with disk use.
        let one = [
            doc! {"$setWindowFields": {"sortBy": {"s": 1}, "output": {"n": {"$documentNumber": {}}}}},
        ];
        let e = streamed(&one, &docs, 64 * 1024, true).expect_err("partition over the limit");
        assert_eq!(e.code(), 292);
        assert!(e.to_string().contains("one partition"), "{e}");
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(24))]
        #[test]
        fn any_limit_gives_the_in_memory_windows(
            xs in proptest::collection::vec((0u32..50, 0u32..30), 0..300),
            limit in 8 * 1024usize..32 * 1024,
        ) {
            let docs = input(&xs);
            let p = pipeline();
            let want = reference(&p, &docs);
            match streamed(&p, &docs, limit, true) {
                Ok(got) => prop_assert_eq!(got, want),
                // A partition of many small documents may pass a small limit.
                Err(e) => prop_assert_eq!(e.code(), 292),
            }
        }
    }
}
