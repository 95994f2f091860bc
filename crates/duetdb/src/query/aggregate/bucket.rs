//! `$sortByCount`, `$bucket` and `$bucketAuto`.
//!
//! Owns: the two desugarings MongoDB itself does — `$sortByCount: e` is
//! `$group {_id: e, count: {$sum: 1}}` then `$sort {count: -1}`; `$bucket`
//! is a `$group` keyed by a `$switch` over the boundaries (no default and a
//! value outside them: 40066, the `$switch` error) then `$sort {_id: 1}` —
//! and [`BucketAuto`], which sorts its input by `groupBy` and cuts it into
//! buckets of about equal counts, never splitting equal values, with
//! optional preferred-number `granularity`.
//!
//! Invariants: the desugared stages are ordinary `$group`/`$sort` stages
//! (so a `$bucket` after a commutative prefix runs as OLCP like any mergeable
//! `$group`); `$bucketAuto` sorts its input through the sorter
//! ([`BucketAutoRun`]: under the read's memory limit, then spilled with
//! `allowDiskUse`, else 292), holds one bucket's accumulators at a time, and
//! cuts the same buckets as the in-memory [`BucketAuto::run`]; its buckets' `_id.min` is inclusive, `_id.max` exclusive except
//! for the last bucket (MongoDB's rule).

use bson::{Bson, Document};

use crate::error::{Error, Result};
use crate::query::aggregate::group::{Group, GroupState};
use crate::query::aggregate::{ParseCtx, Runtime, Stage};
use crate::query::expr::{compare, num_of, type_name, Expr, Root};
use crate::query::sort::SortSpec;
use crate::query::sorter::Sorter;

fn tname(v: &Bson) -> &'static str {
    type_name(&Some(v.clone()))
}

/// `$sortByCount: <expression>`.
pub(super) fn parse_sort_by_count(arg: &Bson, ctx: &ParseCtx) -> Result<Vec<Stage>> {
    let ok = match arg {
        Bson::String(s) => s.starts_with('$'),
        Bson::Document(d) => d.keys().next().is_some_and(|k| k.starts_with('$')),
        _ => false,
    };
    if !ok {
        return Err(coded!(
            40148,
            "the sortByCount field must be defined as a $-prefixed path or an expression",
        ));
    }
    let group = bson::doc! {"_id": arg.clone(), "count": {"$sum": 1}};
    Ok(vec![
        Stage::Group(Group::parse(&group, &ctx.scope)?.with_collation(ctx.collator.clone())),
        Stage::Sort(SortSpec::parse(&bson::doc! {"count": -1})?),
    ])
}

/// A boundary or default: a constant (an expression that reads no
/// document); `not_constant` makes the stage's error (40191 / 40195).
fn constant(v: &Bson, ctx: &ParseCtx, not_constant: impl Fn(&Bson) -> Error) -> Result<Bson> {
    if matches!(v, Bson::String(s) if s.starts_with('$')) {
        return Err(not_constant(v));
    }
    let e = ctx.expr(v)?;
    let empty = Document::new();
    match e.eval(&Root::Doc(&empty)) {
        Ok(Some(b)) => Ok(b),
        _ => Err(not_constant(v)),
    }
}

/// Canonical type rank (numbers together, strings with symbols), for the
/// "same type" rules of `$bucket`.
fn canonical_rank(v: &Bson) -> u8 {
    match v {
        Bson::MinKey => 0,
        Bson::Undefined => 1,
        Bson::Null => 2,
        Bson::Int32(_) | Bson::Int64(_) | Bson::Double(_) | Bson::Decimal128(_) => 3,
        Bson::String(_) | Bson::Symbol(_) => 4,
        Bson::Document(_) => 5,
        Bson::Array(_) => 6,
        Bson::Binary(_) => 7,
        Bson::ObjectId(_) => 8,
        Bson::Boolean(_) => 9,
        Bson::DateTime(_) => 10,
        Bson::Timestamp(_) => 11,
        Bson::RegularExpression(_) => 12,
        Bson::DbPointer(_) => 13,
        Bson::JavaScriptCode(_) => 14,
        Bson::JavaScriptCodeWithScope(_) => 15,
        Bson::MaxKey => 16,
    }
}

/// `$bucket: {groupBy, boundaries, default, output}` (codes 40191–40202).
pub(super) fn parse_bucket(arg: &Bson, ctx: &ParseCtx) -> Result<Vec<Stage>> {
    let Bson::Document(spec) = arg else {
        return Err(coded!(
            40201,
            format!(
                "Argument to $bucket stage must be an object, but found type: {}.",
                tname(arg)
            ),
        ));
    };
    let mut group_by = None;
    let mut boundaries: Vec<Bson> = Vec::new();
    let mut default = None;
    let mut output = None;
    for (k, v) in spec {
        match k.as_str() {
            "groupBy" => {
                let ok = match v {
                    Bson::String(s) => s.starts_with('$'),
                    Bson::Document(d) => d.keys().next().is_some_and(|k| k.starts_with('$')),
                    _ => false,
                };
                if !ok {
                    return Err(coded!(
                        40202,
                        format!(
                            "The $bucket 'groupBy' field must be defined as a $-prefixed path or an expression, but found: {}.",
                            crate::error::render(v)
                        ),
                    ));
                }
                group_by = Some(v.clone());
            }
            "boundaries" => {
                let Bson::Array(items) = v else {
                    return Err(coded!(
                        40200,
                        format!(
                            "The $bucket 'boundaries' field must be an array, but found type: {}.",
                            tname(v)
                        ),
                    ));
                };
                for b in items {
                    boundaries.push(constant(b, ctx, |v| {
                        coded!(
                            40191,
                            format!(
                                "The $bucket 'boundaries' field must be an array of constant values, but found value: {}.",
                                crate::error::render(v)
                            )
                        )
                    })?);
                }
                if boundaries.len() < 2 {
                    return Err(coded!(
                        40192,
                        format!(
                            "The $bucket 'boundaries' field must have at least 2 values, but found {} value(s).",
                            boundaries.len()
                        ),
                    ));
                }
                for i in 1..boundaries.len() {
                    let (lo, hi) = (&boundaries[i - 1], &boundaries[i]);
                    if canonical_rank(lo) != canonical_rank(hi) {
                        return Err(coded!(
                            40193,
                            format!(
                                "All values in the the 'boundaries' option to $bucket must have the same type. Found conflicting types {} and {}.",
                                tname(lo),
                                tname(hi)
                            ),
                        ));
                    }
                    if compare(lo, hi) != std::cmp::Ordering::Less {
                        return Err(coded!(
                            40194,
                            format!(
                                "The 'boundaries' option to $bucket must be sorted, but elements {} and {i} are not in ascending order ({} is not less than {}).",
                                i - 1,
                                crate::error::render(lo),
                                crate::error::render(hi)
                            ),
                        ));
                    }
                }
            }
            "default" => {
                default = Some(constant(v, ctx, |v| {
                    coded!(
                        40195,
                        format!(
                            "The $bucket 'default' field must be a constant expression, but found: {}.",
                            crate::error::render(v)
                        )
                    )
                })?)
            }
            "output" => match v {
                Bson::Document(d) => output = Some(d.clone()),
                other => {
                    return Err(coded!(
                        40196,
                        format!(
                            "The $bucket 'output' field must be an object, but found type: {}.",
                            tname(other)
                        ),
                    ))
                }
            },
            other => {
                return Err(coded!(
                    40197,
                    format!("Unrecognized option to $bucket: {other}."),
                ))
            }
        }
    }
    let Some(group_by) = group_by.filter(|_| !boundaries.is_empty()) else {
        return Err(coded!(
            40198,
            "$bucket requires 'groupBy' and 'boundaries' to be specified.",
        ));
    };
    let (first, last) = (&boundaries[0], &boundaries[boundaries.len() - 1]);
    if let Some(d) = &default {
        if canonical_rank(d) == canonical_rank(first)
            && compare(d, first) != std::cmp::Ordering::Less
            && compare(d, last) == std::cmp::Ordering::Less
        {
            return Err(coded!(
                40199,
                "The $bucket 'default' field must be less than the lowest boundary or greater than or equal to the highest boundary.",
            ));
        }
    }
    let branches: Vec<Bson> = boundaries
        .windows(2)
        .map(|w| {
            Bson::Document(bson::doc! {
                "case": {"$and": [
                    {"$gte": [group_by.clone(), {"$literal": w[0].clone()}]},
                    {"$lt": [group_by.clone(), {"$literal": w[1].clone()}]},
                ]},
                "then": {"$literal": w[0].clone()},
            })
        })
        .collect();
    let mut switch = bson::doc! {"branches": branches};
    if let Some(d) = default {
        switch.insert("default", bson::doc! {"$literal": d});
    }
    let mut group = bson::doc! {"_id": {"$switch": switch}};
    match output {
        Some(out) => group.extend(out),
        None => {
            group.insert("count", bson::doc! {"$sum": 1});
        }
    }
    Ok(vec![
        Stage::Group(Group::parse(&group, &ctx.scope)?.with_collation(ctx.collator.clone())),
        Stage::Sort(SortSpec::parse(&bson::doc! {"_id": 1})?.with_collation(ctx.collator.clone())),
    ])
}

// ---------------------------------------------------------------- $bucketAuto

#[derive(Debug, Clone)]
pub(super) struct BucketAuto {
    group_by: Expr,
    buckets: usize,
    /// The accumulators, as a `$group` keyed by null.
    output: Group,
    granularity: Option<Granularity>,
}

impl BucketAuto {
    pub(super) fn parse(arg: &Bson, ctx: &ParseCtx) -> Result<BucketAuto> {
        let Bson::Document(spec) = arg else {
            return Err(coded!(
                40240,
                format!(
                    "The argument to $bucketAuto must be an object, but found type: {}",
                    tname(arg)
                ),
            ));
        };
        let mut group_by = None;
        let mut buckets = None;
        let mut output = None;
        let mut granularity = None;
        for (k, v) in spec {
            match k.as_str() {
                "groupBy" => {
                    let ok = match v {
                        Bson::String(s) => s.starts_with('$') && s.len() > 1,
                        Bson::Document(d) => d.keys().next().is_some_and(|k| k.starts_with('$')),
                        _ => false,
                    };
                    if !ok {
                        return Err(coded!(
                            40239,
                            format!(
                                "The $bucketAuto 'groupBy' field must be defined as a $-prefixed path or an expression object, but found: {}",
                                crate::error::render(v)
                            ),
                        ));
                    }
                    group_by = Some(ctx.expr(v)?);
                }
                "buckets" => {
                    let n = num_of(v).ok_or_else(|| {
                        coded!(
                            40241,
                            format!(
                                "The $bucketAuto 'buckets' field must be a numeric value, but found type: {}",
                                tname(v)
                            ),
                        )
                    })?;
                    let f = n.to_f64();
                    if f.fract() != 0.0 || f.abs() > f64::from(i32::MAX) {
                        return Err(coded!(
                            40242,
                            format!(
                                "The $bucketAuto 'buckets' field must be representable as a 32-bit integer, but found {f}"
                            ),
                        ));
                    }
                    if f <= 0.0 {
                        return Err(coded!(
                            40243,
                            format!(
                                "The $bucketAuto 'buckets' field must be greater than 0, but found: {}",
                                f as i64
                            ),
                        ));
                    }
                    buckets = Some(f as usize);
                }
                "output" => match v {
                    Bson::Document(d) => output = Some(d.clone()),
                    other => {
                        return Err(coded!(
                            40244,
                            format!(
                                "The $bucketAuto 'output' field must be an object, but found type: {}",
                                tname(other)
                            ),
                        ))
                    }
                },
                "granularity" => match v {
                    Bson::String(s) => granularity = Some(Granularity::parse(s)?),
                    other => {
                        return Err(coded!(
                            40261,
                            format!(
                                "The $bucketAuto 'granularity' field must be a string, but found type: {}",
                                tname(other)
                            ),
                        ))
                    }
                },
                other => {
                    return Err(coded!(
                        40245,
                        format!("Unrecognized option to $bucketAuto: {other}"),
                    ))
                }
            }
        }
        let (Some(group_by), Some(buckets)) = (group_by, buckets) else {
            return Err(coded!(
                40246,
                "$bucketAuto requires 'groupBy' and 'buckets' to be specified",
            ));
        };
        let mut group = bson::doc! {"_id": null};
        match output {
            Some(out) => group.extend(out),
            None => {
                group.insert("count", bson::doc! {"$sum": 1});
            }
        }
        Ok(BucketAuto {
            group_by,
            buckets,
            output: Group::parse(&group, &ctx.scope)?.with_collation(ctx.collator.clone()),
            granularity,
        })
    }

    /// The `groupBy` value of one document (missing is null), checked
    /// against the granularity.
    fn key_of(&self, root: &Root<'_>) -> Result<Bson> {
        let k = self.group_by.eval(root)?.unwrap_or(Bson::Null);
        if let Some(g) = &self.granularity {
            g.check_key(&k)?;
        }
        Ok(k)
    }

    /// The buckets of `rows`, sorted in memory (the reference evaluation).
    pub(super) fn run(&self, rows: Vec<Document>, rt: &Runtime<'_>) -> Result<Vec<Document>> {
        let mut keyed: Vec<(Bson, Document)> = Vec::with_capacity(rows.len());
        for d in rows {
            keyed.push((self.key_of(&Root::Doc(&d))?, d));
        }
        // Stable: equal keys keep their input order (positional accumulators).
        keyed.sort_by(|a, b| compare(&a.0, &b.0));
        let n = keyed.len();
        self.cut(n, keyed.into_iter().map(Ok), rt)
    }

    /// A run whose input goes through a [`Sorter`] keyed by `groupBy`: it
    /// spills past the read's memory limit when disk use is allowed (292
    /// otherwise), as MongoDB's `$bucketAuto` sorts its input.
    pub(super) fn start(&self, rt: &Runtime<'_>) -> Result<BucketAutoRun<'_>> {
        // `k` holds the key wrapped in a one-element array: a sort on it
        // then compares the whole key (an array key included) as `compare`
        // does, not by its least element.
        let spec = SortSpec::parse(&bson::doc! {"k": 1})?;
        Ok(BucketAutoRun {
            stage: self,
            sorter: Sorter::new(spec, &rt.limits, rt.spill_dir.clone(), None),
            n: 0,
        })
    }

    /// Cut `sorted` (`n` documents in key order, equal keys in input order)
    /// into buckets.
    fn cut(
        &self,
        n: usize,
        sorted: impl Iterator<Item = Result<(Bson, Document)>>,
        rt: &Runtime<'_>,
    ) -> Result<Vec<Document>> {
        let mut sorted = sorted;
        let mut pull = || sorted.next().transpose();
        let approx = ((n as f64 / self.buckets as f64).round() as usize).max(1);
        let mut out = Vec::new();
        let mut i = 0;
        let mut prev_max: Option<Bson> = None;
        let mut bucket_no = 0;
        let mut peek = pull()?;
        let same = |peek: &Option<(Bson, Document)>, v: &Bson, want: std::cmp::Ordering| {
            peek.as_ref().is_some_and(|(k, _)| compare(k, v) == want)
        };
        while peek.is_some() && bucket_no < self.buckets {
            bucket_no += 1;
            let last = bucket_no == self.buckets;
            let target = if last { n } else { (i + approx).min(n) };
            let mut state = GroupState::default();
            let mut group = self.output.clone();
            group.memory_limit = group.memory_limit.min(rt.limits.memory_limit_bytes);
            let mut take =
                |peek: &mut Option<(Bson, Document)>, i: &mut usize| -> Result<Option<Bson>> {
                    let Some((k, d)) = peek.take() else {
                        return Ok(None);
                    };
                    group.accumulate(&mut state, Root::Doc(&d))?;
                    *i += 1;
                    *peek = pull()?;
                    Ok(Some(k))
                };
            let Some(mut min) = take(&mut peek, &mut i)? else {
                break;
            };
            let mut max = min.clone();
            while i < target || (last && peek.is_some()) {
                match take(&mut peek, &mut i)? {
                    Some(k) => max = k,
                    None => break,
                }
            }
            match &self.granularity {
                None => {
                    // Absorb every value equal to the bucket's largest.
                    while same(&peek, &max, std::cmp::Ordering::Equal) {
                        take(&mut peek, &mut i)?;
                    }
                    if let Some((k, _)) = &peek {
                        max = k.clone();
                    }
                }
                Some(g) => {
                    min = prev_max.clone().unwrap_or_else(|| g.round_down(&min));
                    let bound = g.round_up(&max);
                    while same(&peek, &bound, std::cmp::Ordering::Less)
                        || same(&peek, &max, std::cmp::Ordering::Equal)
                    {
                        take(&mut peek, &mut i)?;
                    }
                    max = match &peek {
                        Some((k, _)) if number(&bound) == 0.0 => g.round_down(k),
                        _ => bound,
                    };
                }
            }
            let mut doc = group.finish(state)?.pop().unwrap_or_default();
            doc.insert("_id", bson::doc! {"min": min, "max": max.clone()});
            out.push(doc);
            prev_max = Some(max);
        }
        Ok(out)
    }
}

/// A `$bucketAuto` being fed: its input sorted by key through a [`Sorter`].
pub(super) struct BucketAutoRun<'p> {
    stage: &'p BucketAuto,
    sorter: Sorter,
    /// Documents fed.
    n: usize,
}

impl BucketAutoRun<'_> {
    /// Feed one document.
    pub(super) fn push(&mut self, doc: Document) -> Result<()> {
        let key = self.stage.key_of(&Root::Doc(&doc))?;
        let wrapped = bson::doc! {"k": [key], "d": doc};
        let raw = bson::RawDocumentBuf::try_from(&wrapped)
            .map_err(|e| Error::InvalidBson(e.to_string()))?;
        self.sorter.push(std::sync::Arc::new(raw))?;
        self.n += 1;
        Ok(())
    }

    /// The buckets, cut from the sorted (possibly spilled) input.
    pub(super) fn finish(self, rt: &Runtime<'_>) -> Result<Vec<Document>> {
        let sorted = self.sorter.finish()?.map(|d| {
            let mut d = crate::doc::to_document(&d?)?;
            let key = match d.remove("k") {
                Some(Bson::Array(mut a)) if a.len() == 1 => a.pop().unwrap_or(Bson::Null),
                _ => {
                    return Err(Error::Internal(
                        "$bucketAuto: a sorted key is damaged".into(),
                    ))
                }
            };
            match d.remove("d") {
                Some(Bson::Document(doc)) => Ok((key, doc)),
                _ => Err(Error::Internal(
                    "$bucketAuto: a sorted document is damaged".into(),
                )),
            }
        });
        self.stage.cut(self.n, sorted, rt)
    }
}

fn number(v: &Bson) -> f64 {
    num_of(v).map_or(0.0, |n| n.to_f64())
}

/// A preferred-number series (`granularity`): rounds bucket boundaries.
#[derive(Debug, Clone)]
enum Granularity {
    /// Renard / E series / 1-2-5: the mantissas of one decade.
    Series(&'static [f64]),
    PowersOf2,
}

const R5: &[f64] = &[1.0, 1.6, 2.5, 4.0, 6.3];
const R10: &[f64] = &[1.0, 1.25, 1.6, 2.0, 2.5, 3.15, 4.0, 5.0, 6.3, 8.0];
const R20: &[f64] = &[
    1.0, 1.12, 1.25, 1.4, 1.6, 1.8, 2.0, 2.24, 2.5, 2.8, 3.15, 3.55, 4.0, 4.5, 5.0, 5.6, 6.3, 7.1,
    8.0, 9.0,
];
const R40: &[f64] = &[
    1.0, 1.06, 1.12, 1.18, 1.25, 1.32, 1.4, 1.5, 1.6, 1.7, 1.8, 1.9, 2.0, 2.12, 2.24, 2.36, 2.5,
    2.65, 2.8, 3.0, 3.15, 3.35, 3.55, 3.75, 4.0, 4.25, 4.5, 4.75, 5.0, 5.3, 5.6, 6.0, 6.3, 6.7,
    7.1, 7.5, 8.0, 8.5, 9.0, 9.5,
];
const R80: &[f64] = &[
    1.0, 1.03, 1.06, 1.09, 1.12, 1.15, 1.18, 1.22, 1.25, 1.28, 1.32, 1.36, 1.4, 1.45, 1.5, 1.55,
    1.6, 1.65, 1.7, 1.75, 1.8, 1.85, 1.9, 1.95, 2.0, 2.06, 2.12, 2.18, 2.24, 2.3, 2.36, 2.43, 2.5,
    2.58, 2.65, 2.72, 2.8, 2.9, 3.0, 3.07, 3.15, 3.25, 3.35, 3.45, 3.55, 3.65, 3.75, 3.87, 4.0,
    4.12, 4.25, 4.37, 4.5, 4.62, 4.75, 4.87, 5.0, 5.15, 5.3, 5.45, 5.6, 5.8, 6.0, 6.15, 6.3, 6.5,
    6.7, 6.9, 7.1, 7.3, 7.5, 7.75, 8.0, 8.25, 8.5, 8.75, 9.0, 9.25, 9.5, 9.75,
];
const S125: &[f64] = &[1.0, 2.0, 5.0];
const E6: &[f64] = &[1.0, 1.5, 2.2, 3.3, 4.7, 6.8];
const E12: &[f64] = &[1.0, 1.2, 1.5, 1.8, 2.2, 2.7, 3.3, 3.9, 4.7, 5.6, 6.8, 8.2];
const E24: &[f64] = &[
    1.0, 1.1, 1.2, 1.3, 1.5, 1.6, 1.8, 2.0, 2.2, 2.4, 2.7, 3.0, 3.3, 3.6, 3.9, 4.3, 4.7, 5.1, 5.6,
    6.2, 6.8, 7.5, 8.2, 9.1,
];
const E48: &[f64] = &[
    1.0, 1.05, 1.1, 1.15, 1.21, 1.27, 1.33, 1.4, 1.47, 1.54, 1.62, 1.69, 1.78, 1.87, 1.96, 2.05,
    2.15, 2.26, 2.37, 2.49, 2.61, 2.74, 2.87, 3.01, 3.16, 3.32, 3.48, 3.65, 3.83, 4.02, 4.22, 4.42,
    4.64, 4.87, 5.11, 5.36, 5.62, 5.9, 6.19, 6.49, 6.81, 7.15, 7.5, 7.87, 8.25, 8.66, 9.09, 9.53,
];
const E96: &[f64] = &[
    1.0, 1.02, 1.05, 1.07, 1.1, 1.13, 1.15, 1.18, 1.21, 1.24, 1.27, 1.3, 1.33, 1.37, 1.4, 1.43,
    1.47, 1.5, 1.54, 1.58, 1.62, 1.65, 1.69, 1.74, 1.78, 1.82, 1.87, 1.91, 1.96, 2.0, 2.05, 2.1,
    2.15, 2.21, 2.26, 2.32, 2.37, 2.43, 2.49, 2.55, 2.61, 2.67, 2.74, 2.8, 2.87, 2.94, 3.01, 3.09,
    3.16, 3.24, 3.32, 3.4, 3.48, 3.57, 3.65, 3.74, 3.83, 3.92, 4.02, 4.12, 4.22, 4.32, 4.42, 4.53,
    4.64, 4.75, 4.87, 4.99, 5.11, 5.23, 5.36, 5.49, 5.62, 5.76, 5.9, 6.04, 6.19, 6.34, 6.49, 6.65,
    6.81, 6.98, 7.15, 7.32, 7.5, 7.68, 7.87, 8.06, 8.25, 8.45, 8.66, 8.87, 9.09, 9.31, 9.53, 9.76,
];
const E192: &[f64] = &[
    1.0, 1.01, 1.02, 1.04, 1.05, 1.06, 1.07, 1.09, 1.1, 1.11, 1.13, 1.14, 1.15, 1.17, 1.18, 1.2,
    1.21, 1.23, 1.24, 1.26, 1.27, 1.29, 1.3, 1.32, 1.33, 1.35, 1.37, 1.38, 1.4, 1.42, 1.43, 1.45,
    1.47, 1.49, 1.5, 1.52, 1.54, 1.56, 1.58, 1.6, 1.62, 1.64, 1.65, 1.67, 1.69, 1.72, 1.74, 1.76,
    1.78, 1.8, 1.82, 1.84, 1.87, 1.89, 1.91, 1.93, 1.96, 1.98, 2.0, 2.03, 2.05, 2.08, 2.1, 2.13,
    2.15, 2.18, 2.21, 2.23, 2.26, 2.29, 2.32, 2.34, 2.37, 2.4, 2.43, 2.46, 2.49, 2.52, 2.55, 2.58,
    2.61, 2.64, 2.67, 2.71, 2.74, 2.77, 2.8, 2.84, 2.87, 2.91, 2.94, 2.98, 3.01, 3.05, 3.09, 3.12,
    3.16, 3.2, 3.24, 3.28, 3.32, 3.36, 3.4, 3.44, 3.48, 3.52, 3.57, 3.61, 3.65, 3.7, 3.74, 3.79,
    3.83, 3.88, 3.92, 3.97, 4.02, 4.07, 4.12, 4.17, 4.22, 4.27, 4.32, 4.37, 4.42, 4.48, 4.53, 4.59,
    4.64, 4.7, 4.75, 4.81, 4.87, 4.93, 4.99, 5.05, 5.11, 5.17, 5.23, 5.3, 5.36, 5.42, 5.49, 5.56,
    5.62, 5.69, 5.76, 5.83, 5.9, 5.97, 6.04, 6.12, 6.19, 6.26, 6.34, 6.42, 6.49, 6.57, 6.65, 6.73,
    6.81, 6.9, 6.98, 7.06, 7.15, 7.23, 7.32, 7.41, 7.5, 7.59, 7.68, 7.77, 7.87, 7.96, 8.06, 8.16,
    8.25, 8.35, 8.45, 8.56, 8.66, 8.76, 8.87, 8.98, 9.09, 9.19, 9.31, 9.42, 9.53, 9.65, 9.76, 9.88,
];

impl Granularity {
    fn parse(name: &str) -> Result<Granularity> {
        let series: &'static [f64] = match name {
            "R5" => R5,
            "R10" => R10,
            "R20" => R20,
            "R40" => R40,
            "R80" => R80,
            "1-2-5" => S125,
            "E6" => E6,
            "E12" => E12,
            "E24" => E24,
            "E48" => E48,
            "E96" => E96,
            "E192" => E192,
            "POWERSOF2" => return Ok(Granularity::PowersOf2),
            other => {
                return Err(coded!(
                    40257,
                    format!("Rounding granularity not recognized: {other}"),
                ))
            }
        };
        Ok(Granularity::Series(series))
    }

    /// Keys must be non-negative numbers (40258–40260).
    fn check_key(&self, k: &Bson) -> Result<()> {
        let Some(n) = num_of(k) else {
            return Err(coded!(
                40258,
                format!(
                    "$bucketAuto can specify a 'granularity' with numeric boundaries only, but found a value with type: {}",
                    tname(k)
                ),
            ));
        };
        let f = n.to_f64();
        if f.is_nan() {
            return Err(coded!(
                40259,
                "$bucketAuto can specify a 'granularity' with numeric boundaries only, but found a NaN",
            ));
        }
        if f < 0.0 {
            return Err(coded!(
                40260,
                "$bucketAuto can specify a 'granularity' with non-negative numbers only, but found a negative number",
            ));
        }
        Ok(())
    }

    /// The smallest series value strictly greater than `v` (`v` itself is
    /// not a boundary above itself: buckets' max is exclusive).
    fn round_up(&self, v: &Bson) -> Bson {
        let x = number(v);
        match self {
            Granularity::PowersOf2 => {
                if x <= 0.0 {
                    return Bson::Double(0.0);
                }
                let mut p = 2f64.powi(x.log2().floor() as i32);
                while p <= x {
                    p *= 2.0;
                }
                as_number(p, v)
            }
            Granularity::Series(s) => {
                if x <= 0.0 {
                    return Bson::Double(0.0);
                }
                let mut decade = 10f64.powi(x.log10().floor() as i32);
                loop {
                    for m in s.iter() {
                        let c = m * decade;
                        if c > x * (1.0 + 1e-12) {
                            return Bson::Double(c);
                        }
                    }
                    decade *= 10.0;
                }
            }
        }
    }

    /// The largest series value strictly less than `v` (MongoDB's
    /// `roundDown`); 0 for 0.
    fn round_down(&self, v: &Bson) -> Bson {
        let x = number(v);
        match self {
            Granularity::PowersOf2 => {
                if x <= 0.0 {
                    return Bson::Double(0.0);
                }
                let mut p = 2f64.powi(x.log2().ceil() as i32);
                while p >= x {
                    p /= 2.0;
                }
                as_number(p, v)
            }
            Granularity::Series(s) => {
                if x <= 0.0 {
                    return Bson::Double(0.0);
                }
                let mut decade = 10f64.powi(x.log10().ceil() as i32);
                loop {
                    for m in s.iter().rev() {
                        let c = m * decade;
                        if c < x * (1.0 - 1e-12) {
                            return Bson::Double(c);
                        }
                    }
                    decade /= 10.0;
                }
            }
        }
    }
}

/// POWERSOF2 keeps integer types for integer inputs.
fn as_number(p: f64, like: &Bson) -> Bson {
    if p.fract() != 0.0 {
        return Bson::Double(p);
    }
    match like {
        Bson::Int32(_) if p <= f64::from(i32::MAX) => Bson::Int32(p as i32),
        Bson::Int32(_) | Bson::Int64(_) if p <= i64::MAX as f64 => Bson::Int64(p as i64),
        _ => Bson::Double(p),
    }
}

#[cfg(test)]
mod tests {
    use bson::{doc, Bson, Document};
    use proptest::prelude::*;

    use crate::query::aggregate::test_support::{reference, streamed};
    use crate::query::spill::spill_stats;

    /// Keys of several types, arrays (compared whole) and missing included.
    fn key(x: u32) -> Option<Bson> {
        Some(match x % 7 {
            0..=2 => Bson::Int32((x % 97) as i32),
            3 => Bson::Double(f64::from(x % 50) + 0.5),
            4 => Bson::String(format!("s{}", x % 13)),
            5 => Bson::Array(vec![Bson::Int32((x % 4) as i32), Bson::Int32(1)]),
            _ => return None,
        })
    }

    fn input(xs: &[u32], numeric: bool) -> Vec<Document> {
        xs.iter()
            .enumerate()
            .map(|(i, x)| {
                let mut d = doc! {"i": i as i32, "pad": "b".repeat(60)};
                let k = if numeric {
                    Some(Bson::Int32((x % 500) as i32 + 1))
                } else {
                    key(*x)
                };
                if let Some(k) = k {
                    d.insert("v", k);
                }
                d
            })
            .collect()
    }

    fn pipeline(buckets: i32, granularity: Option<&str>) -> Vec<Document> {
        let mut spec = doc! {
            "groupBy": "$v", "buckets": buckets,
            "output": {
                "n": {"$sum": 1}, "first": {"$first": "$i"}, "last": {"$last": "$i"},
                "last3": {"$lastN": {"input": "$i", "n": 3}}, "max": {"$max": "$i"},
            },
        };
        if let Some(g) = granularity {
            spec.insert("granularity", g);
        }
        vec![doc! {"$bucketAuto": spec}]
    }

    #[test]
    fn a_spilled_bucket_auto_cuts_the_in_memory_buckets() {
        let xs: Vec<u32> = (0..3000u32).map(|i| (i * 7919) % 2003).collect();
        for (numeric, granularity) in [
            (false, None),
            (true, None),
            (true, Some("R5")),
            (true, Some("POWERSOF2")),
        ] {
            let docs = input(&xs, numeric);
            for buckets in [1, 7, 50] {
                let p = pipeline(buckets, granularity);
                let want = reference(&p, &docs);
                let before = spill_stats().runs;
                let got = streamed(&p, &docs, 16 * 1024, true).expect("spilled");
                assert!(spill_stats().runs > before, "no spill");
                assert_eq!(got, want, "{granularity:?} {buckets}");
            }
        }
        let e = streamed(&pipeline(5, None), &input(&xs, false), 16 * 1024, false)
            .expect_err("over the limit");
        assert_eq!(e.code(), 292);
        // An empty input has no bucket.
        assert!(streamed(&pipeline(5, None), &[], 16 * 1024, true)
            .expect("empty")
            .is_empty());
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(24))]
        #[test]
        fn any_limit_gives_the_in_memory_buckets(
            xs in proptest::collection::vec(0u32..300, 0..400),
            buckets in 1i32..20,
            limit in 2048usize..32 * 1024,
        ) {
            let docs = input(&xs, false);
            let p = pipeline(buckets, None);
            prop_assert_eq!(streamed(&p, &docs, limit, true).expect("spilled"), reference(&p, &docs));
        }
    }
}
