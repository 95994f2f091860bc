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
//! 292) and holds one partition at a time in memory while it fits under the
//! read's memory limit; a bigger partition moves to a [`Spool`] (with
//! `allowDiskUse`, else 292), the functions read its documents by position
//! ([`Rows`]) and its output values go to one spool per output, so every
//! partition, in memory or on disk, is computed by the one code path
//! ([`Window::partition`]) and gives what [`Window::run`] gives for it. What
//! a spilled partition still keeps in memory is O(n) small figures per
//! function (window bounds, the sortBy numbers, `$linearFill`'s and the
//! numeric functions' points) and one file offset per document and output.
//! Cost: a window starting at "unbounded" is accumulated incrementally;
//! other windows are recomputed per document (O(n·w)), and a spilled
//! partition decodes a document at every read.

use std::borrow::Cow;
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
use crate::query::spill::Spool;

fn failed(msg: impl Into<String>) -> Error {
    coded!(9, msg)
}

/// A partition's documents by position, in sortBy order: in memory, or
/// spilled in a [`Spool`] (each read decodes the document again).
pub(super) trait Rows {
    fn len(&self) -> usize;
    fn get(&self, i: usize) -> Result<Cow<'_, Document>>;
    /// Are the documents on disk (so the outputs should be too)?
    fn on_disk(&self) -> bool;
}

impl Rows for Vec<&Document> {
    fn len(&self) -> usize {
        Vec::len(self)
    }

    fn get(&self, i: usize) -> Result<Cow<'_, Document>> {
        self.as_slice()
            .get(i)
            .map(|d| Cow::Borrowed(*d))
            .ok_or_else(|| Error::Internal(format!("$setWindowFields: no document {i}")))
    }

    fn on_disk(&self) -> bool {
        false
    }
}

impl Rows for Spool {
    fn len(&self) -> usize {
        Spool::len(self)
    }

    fn get(&self, i: usize) -> Result<Cow<'_, Document>> {
        Ok(Cow::Owned(crate::doc::to_document(&Spool::get(self, i)?)?))
    }

    fn on_disk(&self) -> bool {
        self.spilled()
    }
}

/// One output's values for a partition's documents, by position.
enum Column {
    Mem(Vec<Value>),
    /// Each value as `{v: value}` (`{}` for missing).
    Disk(Spool),
}

impl Column {
    fn push(&mut self, v: Value) -> Result<()> {
        match self {
            Column::Mem(vs) => vs.push(v),
            Column::Disk(s) => {
                let mut d = Document::new();
                if let Some(v) = v {
                    d.insert("v", v);
                }
                s.push(std::sync::Arc::new(crate::doc::to_raw_document(&d)?))?;
            }
        }
        Ok(())
    }

    fn len(&self) -> usize {
        match self {
            Column::Mem(vs) => vs.len(),
            Column::Disk(s) => s.len(),
        }
    }

    fn get(&self, i: usize) -> Result<Value> {
        match self {
            Column::Mem(vs) => Ok(vs.get(i).cloned().flatten()),
            Column::Disk(s) => Ok(crate::doc::to_document(&s.get(i)?)?.remove("v")),
        }
    }
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
            let docs: Vec<&Document> = keyed[start..end].iter().map(|(_, _, d)| d).collect();
            self.partition(&docs, rt, &mut |d| {
                out.push(d);
                Ok(false)
            })?;
            start = end;
        }
        Ok(out)
    }

    /// Compute every output over one partition (`rows`, in sortBy order) and
    /// hand each document with its outputs to `emit` (`true`: stop). A
    /// partition on disk keeps its output values on disk too (a column
    /// [`Spool`] per output, sharing the memory limit); one in memory keeps
    /// them in memory. Returns whether `emit` stopped.
    fn partition(
        &self,
        rows: &dyn Rows,
        rt: &Runtime<'_>,
        emit: &mut dyn FnMut(Document) -> Result<bool>,
    ) -> Result<bool> {
        let n = rows.len();
        let mut columns: Vec<Column> = Vec::with_capacity(self.outputs.len());
        for o in &self.outputs {
            let mut col = if rows.on_disk() {
                let share = rt.limits.memory_limit_bytes / self.outputs.len().max(1);
                Column::Disk(Spool::new(
                    share,
                    true,
                    rt.spill_dir.clone(),
                    "$setWindowFields",
                ))
            } else {
                Column::Mem(Vec::with_capacity(n))
            };
            self.compute(&o.func, rows, rt, &mut |v| col.push(v))?;
            if col.len() != n {
                return Err(Error::Internal(format!(
                    "$setWindowFields: {} values for {n} documents",
                    col.len()
                )));
            }
            if let Column::Disk(s) = &col {
                if s.spilled() {
                    rt.note_window_spills(1);
                }
            }
            columns.push(col);
        }
        for i in 0..n {
            if i % 256 == 255 {
                rt.limits.cancel.check()?;
            }
            let mut d = rows.get(i)?.into_owned();
            for (o, col) in self.outputs.iter().zip(&columns) {
                set_nested(&mut d, &o.path, col.get(i)?.unwrap_or(Bson::Null));
            }
            if emit(d)? {
                return Ok(true);
            }
        }
        rt.limits.cancel.check()?;
        Ok(false)
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

    /// One output's value for every document of a partition, in order, to
    /// `out`.
    fn compute(
        &self,
        func: &Func,
        rows: &dyn Rows,
        rt: &Runtime<'_>,
        out: &mut dyn FnMut(Value) -> Result<()>,
    ) -> Result<()> {
        let n = rows.len();
        let key_of = |i: usize| -> Result<Option<SortKey>> {
            Ok(match &self.sort_by {
                Some(s) => Some(s.sort_key(&crate::doc::to_raw_document(&*rows.get(i)?)?)),
                None => None,
            })
        };
        let same = |a: &Option<SortKey>, b: &Option<SortKey>| match (&self.sort_by, a, b) {
            (Some(s), Some(a), Some(b)) => s.compare_keys(a, b) == Ordering::Equal,
            _ => false,
        };
        match func {
            Func::DocumentNumber => {
                for i in 0..n {
                    out(Some(Bson::Int64(i as i64 + 1)))?;
                }
            }
            Func::Rank | Func::DenseRank => {
                let dense = matches!(func, Func::DenseRank);
                let mut rank = 1;
                let mut prev: Option<SortKey> = None;
                for i in 0..n {
                    let key = key_of(i)?;
                    if i > 0 && !same(&prev, &key) {
                        rank = if dense { rank + 1 } else { i as i64 + 1 };
                    }
                    out(Some(Bson::Int64(rank)))?;
                    prev = key;
                }
            }
            Func::Shift {
                output,
                by,
                default,
            } => {
                for i in 0..n {
                    let j = i as i64 + by;
                    out(if j >= 0 && (j as usize) < n {
                        Some(
                            output
                                .eval(&Root::Doc(&*rows.get(j as usize)?))?
                                .unwrap_or(Bson::Null),
                        )
                    } else {
                        Some(default.clone())
                    })?;
                }
            }
            Func::Locf(e) => {
                let mut last: Value = None;
                for i in 0..n {
                    match e.eval(&Root::Doc(&*rows.get(i)?))? {
                        Some(Bson::Null) | Some(Bson::Undefined) | None => {}
                        v => last = v,
                    }
                    out(Some(last.clone().unwrap_or(Bson::Null)))?;
                }
            }
            Func::LinearFill(e) => self.linear_fill(e, rows, out)?,
            Func::Acc(group, bounds) => self.accumulate(group, bounds, rows, rt, out)?,
            Func::Calc(calc, bounds) => {
                let (xs, windows) = if calc.windowed() {
                    (self.sort_field_values(rows)?, self.windows(bounds, rows)?)
                } else {
                    (Vec::new(), Vec::new())
                };
                calc.compute(rows, &xs, &windows, out)?
            }
        }
        Ok(())
    }

    /// `$linearFill`: nulls between two values get the value on the line
    /// through them, by the sortBy value; others stay.
    fn linear_fill(
        &self,
        e: &Expr,
        rows: &dyn Rows,
        out: &mut dyn FnMut(Value) -> Result<()>,
    ) -> Result<()> {
        let n = rows.len();
        let xs = self.sort_values(rows, None)?;
        let mut ys: Vec<Option<f64>> = Vec::with_capacity(n);
        // The values themselves are numbers: as small as ys.
        let mut raw: Vec<Value> = Vec::with_capacity(n);
        for i in 0..n {
            let v = e.eval(&Root::Doc(&*rows.get(i)?))?;
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
            raw.push(if y.is_some() { v } else { None });
        }
        for i in 0..n {
            if ys[i].is_some() {
                out(raw[i].clone())?;
                continue;
            }
            let prev = (0..i).rev().find(|&j| ys[j].is_some());
            let next = (i + 1..n).find(|&j| ys[j].is_some());
            out(match (prev, next) {
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
            })?;
        }
        Ok(())
    }

    /// The single sortBy field's values as numbers (dates as milliseconds,
    /// checked against `unit`).
    fn sort_values(&self, rows: &dyn Rows, unit: Option<Unit>) -> Result<Vec<f64>> {
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
        let mut out = Vec::with_capacity(rows.len());
        for i in 0..rows.len() {
            let d = rows.get(i)?;
            let v = Root::Doc(&d).get(&path)?;
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
    fn sort_field_values(&self, rows: &dyn Rows) -> Result<Vec<Value>> {
        let Some(field) = self.sort_by.as_ref().and_then(|s| s.keys.first()) else {
            return Ok(vec![None; rows.len()]);
        };
        let path = parse_field_path(&field.0)?;
        (0..rows.len())
            .map(|i| Root::Doc(&*rows.get(i)?).get(&path))
            .collect()
    }

    /// `[start, end)` of each document's window.
    fn windows(&self, bounds: &Bounds, rows: &dyn Rows) -> Result<Vec<(usize, usize)>> {
        let n = rows.len();
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
            Bounds::Range(lo, hi, unit) => self.range_windows(rows, *lo, *hi, *unit)?,
        })
    }

    /// An accumulator over each document's window.
    fn accumulate(
        &self,
        group: &Group,
        bounds: &Bounds,
        rows: &dyn Rows,
        rt: &Runtime<'_>,
        out: &mut dyn FnMut(Value) -> Result<()>,
    ) -> Result<()> {
        let windows = self.windows(bounds, rows)?;
        let mut group = group.clone();
        group.memory_limit = group.memory_limit.min(rt.limits.memory_limit_bytes);
        let value_of = |state: GroupState, group: &Group| -> Result<Value> {
            let doc = match group.finish(state)?.pop() {
                Some(d) => d,
                None => group.empty_result(),
            };
            Ok(doc.get("v").cloned())
        };
        // Windows starting at the partition's start grow monotonically:
        // accumulate incrementally.
        let incremental =
            windows.iter().all(|(s, _)| *s == 0) && windows.windows(2).all(|w| w[0].1 <= w[1].1);
        if incremental {
            let mut state = GroupState::default();
            let mut fed = 0;
            for &(_, e) in &windows {
                while fed < e {
                    group.accumulate(&mut state, Root::Doc(&*rows.get(fed)?))?;
                    fed += 1;
                }
                out(value_of(state.clone(), &group)?)?;
            }
            return Ok(());
        }
        for (i, &(s, e)) in windows.iter().enumerate() {
            if i % 256 == 255 {
                rt.limits.cancel.check()?;
            }
            let mut state = GroupState::default();
            for j in s..e {
                group.accumulate(&mut state, Root::Doc(&*rows.get(j)?))?;
            }
            out(value_of(state, &group)?)?;
        }
        Ok(())
    }

    /// `[start, end)` of each document's range window.
    fn range_windows(
        &self,
        rows: &dyn Rows,
        lo: Bound,
        hi: Bound,
        unit: Option<Unit>,
    ) -> Result<Vec<(usize, usize)>> {
        let xs = self.sort_values(rows, unit)?;
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
    /// `emit` (`true`: stop). A partition is held in memory while it fits
    /// under the read's memory limit; past it, with disk use allowed, it
    /// moves to a [`Spool`] and its window functions read its documents
    /// from disk (else 292).
    pub(super) fn finish(
        self,
        rt: &Runtime<'_>,
        emit: &mut dyn FnMut(Document) -> Result<bool>,
    ) -> Result<()> {
        let limits = &rt.limits;
        let limit = limits.memory_limit_bytes;
        let stage = self.stage;
        let mut part: Option<Bson> = None;
        let mut held: Vec<Document> = Vec::new();
        let mut spool: Option<Spool> = None;
        let mut bytes = 0usize;
        // The sorter gives (partition, sortBy) order, ties in input order:
        // a held partition is computed as it is, without sorting again.
        let mut flush = |held: &mut Vec<Document>, spool: &mut Option<Spool>| -> Result<bool> {
            match spool.take() {
                Some(s) => {
                    if s.spilled() {
                        rt.note_window_spills(1);
                    }
                    stage.partition(&s, rt, emit)
                }
                None => {
                    let docs = std::mem::take(held);
                    let refs: Vec<&Document> = docs.iter().collect();
                    stage.partition(&refs, rt, emit)
                }
            }
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
                if flush(&mut held, &mut spool)? {
                    return Ok(());
                }
                bytes = 0;
            }
            part = Some(p);
            if let Some(s) = &mut spool {
                s.push(std::sync::Arc::new(crate::doc::to_raw_document(&doc)?))?;
                continue;
            }
            bytes += crate::doc::size::document_len(&doc);
            held.push(doc);
            if bytes > limit {
                if !limits.allow_disk_use {
                    return Err(Error::ExceededMemoryLimit(format!(
                        "$setWindowFields exceeded the memory limit of {limit} bytes in one partition, but did not opt in to external sorting. Pass allowDiskUse:true to opt in."
                    )));
                }
                // Everything held moves to disk (the spool's memory is
                // the limit, which these bytes passed).
                let mut s = Spool::new(limit, true, rt.spill_dir.clone(), "$setWindowFields");
                for h in held.drain(..) {
                    s.push(std::sync::Arc::new(crate::doc::to_raw_document(&h)?))?;
                }
                spool = Some(s);
            }
        }
        if !held.is_empty() || spool.as_ref().is_some_and(|s| !s.is_empty()) {
            flush(&mut held, &mut spool)?;
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

    /// One partition (no partitionBy) with every kind of function:
    /// bounded and unbounded document windows, range windows, ranks,
    /// `$shift`, `$locf`/`$linearFill` and the numeric functions.
    fn one_partition() -> Vec<Document> {
        vec![doc! {"$setWindowFields": {
            "sortBy": {"s": 1},
            "output": {
                "n": {"$documentNumber": {}},
                "rank": {"$rank": {}},
                "dense": {"$denseRank": {}},
                "next": {"$shift": {"output": "$i", "by": 3, "default": "none"}},
                "prev": {"$shift": {"output": "$i", "by": -2}},
                "near": {"$sum": "$i", "window": {"documents": [-3, 2]}},
                "all": {"$max": "$i", "window": {"documents": ["unbounded", "unbounded"]}},
                "rest": {"$sum": "$i", "window": {"documents": ["current", "unbounded"]}},
                "run": {"$count": {}, "window": {"documents": ["unbounded", "current"]}},
                "close": {"$push": "$i", "window": {"range": [-1, 0]}},
                "ahead": {"$avg": "$i", "window": {"range": [0, 2]}},
                "lf": {"$linearFill": "$gap"},
                "locf": {"$locf": "$gap"},
                "der": {"$derivative": {"input": "$i"}, "window": {"documents": [-1, 0]}},
                "area": {"$integral": {"input": "$i"}, "window": {"range": [-2, 0]}},
                "ema": {"$expMovingAvg": {"input": "$i", "N": 3}},
                "cov": {"$covariancePop": ["$i", "$t"], "window": {"documents": [-4, 4]}},
            },
        }}]
    }

    /// `input` with a field `gap` that is null in most documents.
    fn gappy(docs: &[Document]) -> Vec<Document> {
        docs.iter()
            .map(|d| {
                let mut d = d.clone();
                let i = d.get_i32("i").unwrap_or(0);
                d.insert(
                    "gap",
                    if i % 7 == 0 {
                        Bson::Int32(i)
                    } else {
                        Bson::Null
                    },
                );
                d
            })
            .collect()
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
    }

    #[test]
    fn a_partition_bigger_than_the_memory_limit_is_read_from_disk() {
        let xs: Vec<(u32, u32)> = (0..600u32).map(|i| (0, (i * 31) % 97)).collect();
        let docs = gappy(&input(&xs));
        let p = one_partition();
        let want = reference(&p, &docs);
        // Every kind of function, the partition ~8 times the limit.
        let got = streamed(&p, &docs, 8 * 1024, true).expect("spilled partition");
        assert_eq!(got.len(), want.len());
        assert_eq!(got, want);
        // Explain's counter: the partition and its output columns spilled.
        let pipeline = crate::query::aggregate::Pipeline::parse(&p).expect("parse");
        let mut rt = crate::query::aggregate::Runtime::standalone();
        rt.limits.memory_limit_bytes = 8 * 1024;
        rt.limits.allow_disk_use = true;
        let mut exec = crate::query::aggregate::exec::Exec::new(&pipeline.stages, None, &[], &rt);
        for d in &docs {
            let _ = exec.push_document(d.clone()).expect("push");
        }
        assert_eq!(exec.finish().expect("finish"), want);
        assert!(rt.window_spills() > 1, "spills {:?}", rt.spills());
        assert_eq!(rt.group_spills(), 0);
        // Without disk use it stays 292.
        let e = streamed(&p, &docs, 8 * 1024, false).expect_err("over the limit");
        assert_eq!(e.code(), 292);
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(24))]
        #[test]
        fn any_limit_gives_the_in_memory_windows(
            xs in proptest::collection::vec((0u32..50, 0u32..30), 0..300),
            limit in 2 * 1024usize..32 * 1024,
            one in any::<bool>(),
        ) {
            let mut docs = input(&xs);
            let p = if one {
                docs = gappy(&docs);
                one_partition()
            } else {
                pipeline()
            };
            let want = reference(&p, &docs);
            // With disk use: whatever the limit, the in-memory answer.
            match streamed(&p, &docs, limit, true) {
                Ok(got) => prop_assert_eq!(got, want.clone()),
                Err(e) => prop_assert!(false, "with disk use: {}", e),
            }
            // Without: the answer or 292.
            match streamed(&p, &docs, limit, false) {
                Ok(got) => prop_assert_eq!(got, want),
                Err(e) => prop_assert_eq!(e.code(), 292),
            }
        }
    }
}
