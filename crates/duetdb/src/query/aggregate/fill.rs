//! `$fill` and `$densify`.
//!
//! Owns: `$fill`'s desugaring (as MongoDB's: `method` outputs become one
//! `$setWindowFields` with `$locf`/`$linearFill`, `value` outputs an
//! `$addFields` of `$ifNull`; a `sortBy` without methods a `$sort` — so a
//! `$fill` spills as those stages do, a partition past the memory limit
//! included), and
//! [`Densify`]: missing values of a numeric or date field generated at
//! `step` intervals, per partition, within `full`, `partition` or explicit
//! `[lower, upper)` bounds.
//!
//! Invariants: `$densify` emits every input document once, partitions in
//! partition-key order and each partition by its field (documents without
//! a numeric/date field first, as they came; values in [`f64::total_cmp`]
//! order); a generated document holds only the field and the partition
//! fields (the values of the partition's first document); at most
//! [`MAX_DENSIFY_DOCS`] documents are generated per stage (5897900). It
//! streams as MongoDB's does after its implicit sort ([`DensifyRun`]): the
//! input goes through the sorter by (partition, has a value, value) —
//! spilled with `allowDiskUse`, else 292 — and is densified as it comes out,
//! holding one partition's figures (origin, step count, upper bound, the
//! partition's field values); `full` bounds take the range of the whole
//! input, counted while it is fed. Generated documents are emitted as they
//! are made, never held. A value past explicit bounds is not walked to
//! step by step (nothing is generated there).

use std::cmp::Ordering;

use bson::{Bson, Document};

use crate::error::{Error, Result};
use crate::query::aggregate::lookup::set_nested;
use crate::query::aggregate::window::Window;
use crate::query::aggregate::{ParseCtx, Runtime, Stage};
use crate::query::expr::{compare, num_of, parse_field_path, type_name, Root};
use crate::query::sort::SortSpec;
use crate::query::sorter::Sorter;

/// Most documents one `$densify` generates (MongoDB's
/// `internalQueryMaxAllowedDensifyDocs`).
pub const MAX_DENSIFY_DOCS: usize = 500_000;

fn failed(msg: impl Into<String>) -> Error {
    coded!(9, msg)
}

fn wrong_type(field: &str, v: &Bson, want: &str) -> Error {
    coded!(
        14,
        format!(
            "BSON field '{field}' is the wrong type '{}', expected type '{want}'",
            type_name(&Some(v.clone()))
        ),
    )
}

/// `partitionByFields: ["a", "b.c"]` as the expression `{a: "$a", ...}` and
/// the paths.
fn partition_fields(stage: &str, v: &Bson) -> Result<Vec<String>> {
    let Bson::Array(items) = v else {
        return Err(wrong_type(
            &format!("{stage}.partitionByFields"),
            v,
            "array",
        ));
    };
    items
        .iter()
        .map(|i| match i {
            Bson::String(s) if !s.starts_with('$') => {
                parse_field_path(s)?;
                Ok(s.clone())
            }
            other => Err(failed(format!(
                "{stage} partitionByFields must be field names, found {}",
                crate::error::render(other)
            ))),
        })
        .collect()
}

/// `$fill` as the stages it stands for (see the module doc).
pub(super) fn parse_fill(arg: &Bson, ctx: &ParseCtx) -> Result<Vec<Stage>> {
    let Bson::Document(spec) = arg else {
        return Err(failed(format!(
            "$fill specification must be an object, found {}",
            type_name(&Some(arg.clone()))
        )));
    };
    let mut partition_by: Option<Bson> = None;
    let mut sort_by: Option<Document> = None;
    let mut output: Option<&Document> = None;
    for (k, v) in spec {
        match k.as_str() {
            "partitionBy" => {
                if partition_by.is_some() {
                    return Err(failed(
                        "Only one of 'partitionBy' and 'partitionByFields' may be specified in $fill",
                    ));
                }
                partition_by = Some(v.clone());
            }
            "partitionByFields" => {
                if partition_by.is_some() {
                    return Err(failed(
                        "Only one of 'partitionBy' and 'partitionByFields' may be specified in $fill",
                    ));
                }
                let mut d = Document::new();
                for f in partition_fields("$fill", v)? {
                    d.insert(f.replace('.', "_"), format!("${f}"));
                }
                partition_by = Some(Bson::Document(d));
            }
            "sortBy" => match v {
                Bson::Document(d) => sort_by = Some(d.clone()),
                other => return Err(wrong_type("$fill.sortBy", other, "object")),
            },
            "output" => match v {
                Bson::Document(d) => output = Some(d),
                other => return Err(wrong_type("$fill.output", other, "object")),
            },
            other => {
                return Err(coded!(
                    40415,
                    format!("BSON field '$fill.{other}' is an unknown field."),
                ))
            }
        }
    }
    let output = output.ok_or_else(|| {
        coded!(
            40414,
            "BSON field '$fill.output' is missing but a required field",
        )
    })?;
    let mut window_out = Document::new();
    let mut values = Document::new();
    for (field, how) in output {
        let Bson::Document(how) = how else {
            return Err(wrong_type(&format!("$fill.output.{field}"), how, "object"));
        };
        match (how.get("value"), how.get("method"), how.len()) {
            (Some(v), None, 1) => {
                values.insert(
                    field.clone(),
                    bson::doc! {"$ifNull": [format!("${field}"), v.clone()]},
                );
            }
            (None, Some(Bson::String(m)), 1) if m == "locf" => {
                window_out.insert(field.clone(), bson::doc! {"$locf": format!("${field}")});
            }
            (None, Some(Bson::String(m)), 1) if m == "linear" => {
                if sort_by.is_none() {
                    return Err(coded!(
                        6050204,
                        "Method 'linear' requires a sortBy to be specified in $fill",
                    ));
                }
                window_out.insert(
                    field.clone(),
                    bson::doc! {"$linearFill": format!("${field}")},
                );
            }
            _ => {
                return Err(failed(format!(
                    "Each fill output specification must have exactly one of 'value' or 'method' ('locf' or 'linear'): {field}"
                )))
            }
        }
    }
    let mut stages = Vec::new();
    if !window_out.is_empty() {
        let mut w = bson::doc! {"output": window_out};
        if let Some(p) = &partition_by {
            w.insert("partitionBy", p.clone());
        }
        if let Some(s) = &sort_by {
            w.insert("sortBy", s.clone());
        }
        stages.push(Stage::Window(Box::new(Window::parse(
            &Bson::Document(w),
            ctx,
        )?)));
    } else if let Some(s) = &sort_by {
        stages.push(Stage::Sort(
            SortSpec::parse(s)?.with_collation(ctx.collator.clone()),
        ));
    }
    if !values.is_empty() {
        let mut fields = Vec::with_capacity(values.len());
        for (k, v) in &values {
            fields.push((parse_field_path(k)?, ctx.expr(v)?));
        }
        stages.push(Stage::AddFields(fields));
    }
    Ok(stages)
}

// ---------------------------------------------------------------- $densify

#[derive(Debug, Clone)]
pub(super) struct Densify {
    field: Vec<String>,
    partition: Vec<Vec<String>>,
    step: f64,
    unit: Option<DateUnit>,
    bounds: DensifyBounds,
}

#[derive(Debug, Clone)]
enum DensifyBounds {
    Full,
    Partition,
    /// `[lower, upper)`, as numbers or milliseconds.
    Explicit(f64, f64),
}

/// A time unit of `$densify` (calendar arithmetic for months and up).
#[derive(Debug, Clone, Copy)]
struct DateUnit {
    ms: Option<i64>,
    months: i64,
}

impl DateUnit {
    fn parse(s: &str) -> Result<DateUnit> {
        let (ms, months) = match s {
            "millisecond" => (Some(1), 0),
            "second" => (Some(1000), 0),
            "minute" => (Some(60_000), 0),
            "hour" => (Some(3_600_000), 0),
            "day" => (Some(86_400_000), 0),
            "week" => (Some(604_800_000), 0),
            "month" => (None, 1),
            "quarter" => (None, 3),
            "year" => (None, 12),
            other => return Err(failed(format!("unknown time unit value: {other}"))),
        };
        Ok(DateUnit { ms, months })
    }

    /// `t` plus `steps` units.
    fn add(self, t: i64, steps: i64) -> Option<i64> {
        match self.ms {
            Some(ms) => t.checked_add(ms.checked_mul(steps)?),
            None => {
                let months = self.months.checked_mul(steps)?;
                let d = chrono::DateTime::from_timestamp_millis(t)?;
                let m = chrono::Months::new(u32::try_from(months.unsigned_abs()).ok()?);
                let moved = if months >= 0 {
                    d.checked_add_months(m)?
                } else {
                    d.checked_sub_months(m)?
                };
                Some(moved.timestamp_millis())
            }
        }
    }
}

impl Densify {
    pub(super) fn parse(arg: &Bson) -> Result<Densify> {
        let Bson::Document(spec) = arg else {
            return Err(failed(format!(
                "The $densify stage specification must be an object, found {}",
                type_name(&Some(arg.clone()))
            )));
        };
        let mut field = None;
        let mut partition = Vec::new();
        let mut range = None;
        for (k, v) in spec {
            match k.as_str() {
                "field" => match v {
                    Bson::String(s) if !s.starts_with('$') => field = Some(parse_field_path(s)?),
                    Bson::String(_) => {
                        return Err(coded!(
                            16410,
                            "FieldPath field names may not start with '$'.",
                        ))
                    }
                    other => return Err(wrong_type("$densify.field", other, "string")),
                },
                "partitionByFields" => {
                    partition = partition_fields("$densify", v)?
                        .iter()
                        .map(|f| parse_field_path(f))
                        .collect::<Result<_>>()?
                }
                "range" => match v {
                    Bson::Document(d) => range = Some(d),
                    other => return Err(wrong_type("$densify.range", other, "object")),
                },
                other => {
                    return Err(coded!(
                        40415,
                        format!("BSON field '$densify.{other}' is an unknown field."),
                    ))
                }
            }
        }
        let field = field.ok_or_else(|| {
            coded!(
                40414,
                "BSON field '$densify.field' is missing but a required field",
            )
        })?;
        let range = range.ok_or_else(|| {
            coded!(
                40414,
                "BSON field '$densify.range' is missing but a required field",
            )
        })?;
        let mut step = None;
        let mut unit = None;
        let mut bounds = None;
        for (k, v) in range {
            match k.as_str() {
                "step" => {
                    let f = num_of(v).map(|n| n.to_f64()).ok_or_else(|| {
                        wrong_type("$densify.range.step", v, "number")
                    })?;
                    if f <= 0.0 || !f.is_finite() {
                        return Err(coded!(
                            5733401,
                            "the step parameter in a range statement must be a strictly positive numeric value",
                        ));
                    }
                    step = Some(f);
                }
                "unit" => match v {
                    Bson::String(s) => unit = Some(DateUnit::parse(s)?),
                    other => return Err(wrong_type("$densify.range.unit", other, "string")),
                },
                "bounds" => {
                    bounds = Some(match v {
                        Bson::String(s) if s == "full" => DensifyBounds::Full,
                        Bson::String(s) if s == "partition" => DensifyBounds::Partition,
                        Bson::Array(items) if items.len() == 2 => {
                            let as_num = |b: &Bson| -> Result<f64> {
                                match b {
                                    Bson::DateTime(t) => Ok(t.timestamp_millis() as f64),
                                    other => num_of(other).map(|n| n.to_f64()).ok_or_else(|| {
                                        coded!(
                                            5733402,
                                            "a bounding array must contain either both dates or both numeric types",
                                        )
                                    }),
                                }
                            };
                            let dates = matches!(items[0], Bson::DateTime(_));
                            if dates != matches!(items[1], Bson::DateTime(_)) {
                                return Err(coded!(
                                    5733402,
                                    "a bounding array must contain either both dates or both numeric types",
                                ));
                            }
                            let (lo, hi) = (as_num(&items[0])?, as_num(&items[1])?);
                            if lo > hi {
                                return Err(coded!(
                                    5733403,
                                    "a bounding array in a range statement must have the lower bound first",
                                ));
                            }
                            DensifyBounds::Explicit(lo, hi)
                        }
                        other => {
                            return Err(coded!(
                                5946800,
                                format!(
                                    "bounds must be 'full', 'partition' or an array of two values, found {}",
                                    crate::error::render(other)
                                ),
                            ))
                        }
                    })
                }
                other => {
                    return Err(coded!(
                        40415,
                        format!("BSON field '$densify.range.{other}' is an unknown field."),
                    ))
                }
            }
        }
        let step = step.ok_or_else(|| {
            coded!(
                40414,
                "BSON field '$densify.range.step' is missing but a required field",
            )
        })?;
        let bounds = bounds.ok_or_else(|| {
            coded!(
                40414,
                "BSON field '$densify.range.bounds' is missing but a required field",
            )
        })?;
        if unit.is_some() && step.fract() != 0.0 {
            return Err(coded!(
                5733402,
                "the step must be an integer when a unit is given",
            ));
        }
        if matches!(bounds, DensifyBounds::Partition) && partition.is_empty() {
            return Err(coded!(
                5733408,
                "one may not specify the bounds as 'partition' without specifying a non-empty array of partitionByFields",
            ));
        }
        Ok(Densify {
            field,
            partition,
            step,
            unit,
            bounds,
        })
    }

    /// The field's value as a number (dates as milliseconds when `unit` is
    /// given); `None` for documents without a densifiable value.
    fn value_of(&self, d: &Document) -> Result<Option<f64>> {
        let v = Root::Doc(d).get(&self.field)?;
        Ok(match (&v, self.unit) {
            (Some(Bson::DateTime(t)), Some(_)) => Some(t.timestamp_millis() as f64),
            (Some(Bson::DateTime(_)), None) => {
                return Err(coded!(
                    6053600,
                    "Encountered date field value in $densify without a unit",
                ))
            }
            (Some(b), None) if num_of(b).is_some() => num_of(b).map(|n| n.to_f64()),
            (Some(b), Some(_)) if num_of(b).is_some() => {
                return Err(coded!(
                    6053600,
                    "Encountered non-date field value in $densify with a unit",
                ))
            }
            _ => None,
        })
    }

    /// The value after `x` by `steps` steps from `origin`.
    fn at(&self, origin: f64, steps: i64) -> Option<f64> {
        match self.unit {
            None => Some(origin + self.step * steps as f64),
            Some(u) => u
                .add(origin as i64, (self.step as i64).checked_mul(steps)?)
                .map(|t| t as f64),
        }
    }

    fn make(&self, value: f64, part: &[(Vec<String>, Bson)]) -> Document {
        let mut d = Document::new();
        for (p, v) in part {
            set_nested(&mut d, p, v.clone());
        }
        let v = match self.unit {
            Some(_) => Bson::DateTime(bson::DateTime::from_millis(value as i64)),
            None if value.fract() == 0.0 && value.abs() < 2f64.powi(31) => {
                Bson::Int32(value as i32)
            }
            None => Bson::Double(value),
        };
        set_nested(&mut d, &self.field, v);
        d
    }

    /// `$densify` over materialized documents: the streaming run fed and
    /// finished at once (the reference evaluation, a `$densify` that cannot
    /// stream).
    pub(super) fn run(&self, rows: Vec<Document>, rt: &Runtime<'_>) -> Result<Vec<Document>> {
        let mut run = self.start(rt)?;
        for d in rows {
            run.push(d)?;
        }
        let mut out = Vec::new();
        run.finish(rt, &mut |d| {
            out.push(d);
            Ok(false)
        })?;
        Ok(out)
    }

    /// A run whose input goes through a [`Sorter`] by (partition, has a
    /// value, value): spilled past the read's memory limit with
    /// `allowDiskUse` (else 292), then densified as it streams out, one
    /// partition's few figures at a time.
    pub(super) fn start(&self, rt: &Runtime<'_>) -> Result<DensifyRun<'_>> {
        Ok(DensifyRun {
            stage: self,
            sorter: Sorter::new(sort_spec()?, &rt.limits, rt.spill_dir.clone(), None),
            gmin: f64::INFINITY,
            gmax: f64::NEG_INFINITY,
        })
    }
}

/// The sort of the wrapped documents (see [`DensifyRun::push`]).
fn sort_spec() -> Result<SortSpec> {
    SortSpec::parse(&bson::doc! {"p": 1, "h": 1, "x": 1})
}

/// `x` as an integer ordered as [`f64::total_cmp`] orders doubles (the
/// in-memory order of the values: -NaN first, +NaN last, -0 before 0).
fn total_order_key(x: f64) -> i64 {
    let b = x.to_bits() as i64;
    b ^ ((((b >> 63) as u64) >> 1) as i64)
}

/// A `$densify` being fed: its input sorted by (partition, has a value,
/// value) through a [`Sorter`]; `full` bounds' range is the feed's.
pub(super) struct DensifyRun<'p> {
    stage: &'p Densify,
    sorter: Sorter,
    gmin: f64,
    gmax: f64,
}

/// What one partition needs while it streams out.
struct PartState {
    /// The partition fields' values (of the partition's first document).
    fields: Vec<(Vec<String>, Bson)>,
    origin: f64,
    /// `partition` bounds: the origin is the first value seen.
    origin_set: bool,
    /// The last value generated documents reach; `partition` bounds: the
    /// greatest value so far.
    upper: f64,
    inclusive: bool,
    /// Steps from `origin` already generated or covered.
    k: i64,
}

impl DensifyRun<'_> {
    /// Feed one document.
    pub(super) fn push(&mut self, doc: Document) -> Result<()> {
        let st = self.stage;
        let mut key = Vec::with_capacity(st.partition.len());
        for p in &st.partition {
            key.push(Root::Doc(&doc).get(p)?.unwrap_or(Bson::Null));
        }
        let x = st.value_of(&doc)?;
        if let Some(x) = x {
            self.gmin = self.gmin.min(x);
            self.gmax = self.gmax.max(x);
        }
        // `p` wraps the key in a one-element array: the sort compares the
        // whole key as `compare` does.
        let wrapped = bson::doc! {
            "p": [Bson::Array(key)],
            "h": i32::from(x.is_some()),
            "x": x.map_or(0, total_order_key),
            "d": doc,
        };
        let raw = bson::RawDocumentBuf::try_from(&wrapped)
            .map_err(|e| Error::InvalidBson(e.to_string()))?;
        self.sorter.push(std::sync::Arc::new(raw))
    }

    /// Densify the sorted input, handing every document (input and
    /// generated) to `emit` (`true`: stop).
    pub(super) fn finish(
        self,
        rt: &Runtime<'_>,
        emit: &mut dyn FnMut(Document) -> Result<bool>,
    ) -> Result<()> {
        let st = self.stage;
        let (gmin, gmax) = (self.gmin, self.gmax);
        let mut part: Option<Bson> = None;
        let mut cur: Option<PartState> = None;
        let mut generated = 0usize;
        for (n, d) in self.sorter.finish()?.enumerate() {
            if n % 256 == 255 {
                rt.limits.cancel.check()?;
            }
            let mut w = crate::doc::to_document(&d?)?;
            let (Some(Bson::Array(mut p)), Some(Bson::Document(doc))) =
                (w.remove("p"), w.remove("d"))
            else {
                return Err(Error::Internal(
                    "$densify: a sorted document is damaged".into(),
                ));
            };
            let p = p.pop().unwrap_or(Bson::Null);
            if part
                .as_ref()
                .is_none_or(|q| compare(q, &p) != Ordering::Equal)
            {
                if let Some(s) = cur.take() {
                    if st.end_partition(s, &mut generated, emit)? {
                        return Ok(());
                    }
                }
                cur = Some(st.begin_partition(&doc, gmin, gmax)?);
                part = Some(p);
            }
            let Some(s) = cur.as_mut() else {
                return Err(Error::Internal("$densify: no partition".into()));
            };
            if let Some(x) = st.value_of(&doc)? {
                if st.before_value(s, x, &mut generated, emit)? {
                    return Ok(());
                }
            }
            if emit(doc)? {
                return Ok(());
            }
        }
        if let Some(s) = cur.take() {
            st.end_partition(s, &mut generated, emit)?;
        }
        rt.limits.cancel.check()
    }
}

impl Densify {
    fn begin_partition(&self, first: &Document, gmin: f64, gmax: f64) -> Result<PartState> {
        let mut fields = Vec::with_capacity(self.partition.len());
        for p in &self.partition {
            fields.push((p.clone(), Root::Doc(first).get(p)?.unwrap_or(Bson::Null)));
        }
        let (origin, origin_set, upper, inclusive) = match self.bounds {
            DensifyBounds::Full => (gmin, true, gmax, true),
            DensifyBounds::Partition => (f64::INFINITY, false, f64::NEG_INFINITY, true),
            DensifyBounds::Explicit(lo, hi) => (lo, true, hi, false),
        };
        Ok(PartState {
            fields,
            origin,
            origin_set,
            upper,
            inclusive,
            k: 0,
        })
    }

    /// Generate what comes before a document of value `x` (values arrive
    /// in ascending order); `true`: `emit` stopped.
    fn before_value(
        &self,
        s: &mut PartState,
        x: f64,
        generated: &mut usize,
        emit: &mut dyn FnMut(Document) -> Result<bool>,
    ) -> Result<bool> {
        if matches!(self.bounds, DensifyBounds::Partition) && !x.is_nan() {
            if !s.origin_set {
                s.origin = x;
                s.origin_set = true;
            }
            s.upper = s.upper.max(x);
        }
        if x >= s.origin {
            if self.generate(s, x, true, generated, emit)? {
                return Ok(true);
            }
            // Skip the aligned values this document covers (never past
            // the bounds: nothing is generated there).
            while self.at(s.origin, s.k).is_some_and(|v| v <= x && s.below(v)) {
                s.k += 1;
            }
        }
        Ok(false)
    }

    /// Generate up to the partition's upper bound; `true`: `emit` stopped.
    fn end_partition(
        &self,
        mut s: PartState,
        generated: &mut usize,
        emit: &mut dyn FnMut(Document) -> Result<bool>,
    ) -> Result<bool> {
        if !s.origin.is_finite() {
            return Ok(false);
        }
        let (upper, strict) = (s.upper, !s.inclusive);
        self.generate(&mut s, upper, strict, generated, emit)
    }

    /// Generate the aligned values from step `s.k` below `limit` (up to it
    /// when not `strict`) and within the bounds.
    fn generate(
        &self,
        s: &mut PartState,
        limit: f64,
        strict: bool,
        generated: &mut usize,
        emit: &mut dyn FnMut(Document) -> Result<bool>,
    ) -> Result<bool> {
        while let Some(v) = self.at(s.origin, s.k) {
            let before = if strict { v < limit } else { v <= limit };
            if !(before && s.below(v) && s.origin.is_finite()) {
                break;
            }
            *generated += 1;
            if *generated > MAX_DENSIFY_DOCS {
                return Err(too_many(*generated));
            }
            s.k += 1;
            if emit(self.make(v, &s.fields))? {
                return Ok(true);
            }
        }
        Ok(false)
    }
}

impl PartState {
    fn below(&self, v: f64) -> bool {
        if self.inclusive {
            v <= self.upper
        } else {
            v < self.upper
        }
    }
}

/// 5897900: more generated documents than MongoDB's default
/// `internalQueryMaxAllowedDensifyDocs`.
fn too_many(generated: usize) -> Error {
    coded!(
        5897900,
        format!(
            "Generated {generated} documents in $densify, which is over the limit of {MAX_DENSIFY_DOCS}. Increase the 'internalQueryMaxAllowedDensifyDocs' parameter to allow more generated documents"
        ),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use bson::doc;
    use proptest::prelude::*;

    use crate::query::aggregate::test_support::streamed;
    use crate::query::spill::spill_stats;

    /// The in-memory `$densify` this stage had before it streamed (the
    /// oracle): every document held, partitioned, sorted, then densified.
    fn held(st: &Densify, rows: Vec<Document>) -> Result<Vec<Document>> {
        type Partition = (Bson, Vec<(Vec<String>, Bson)>, Vec<(Option<f64>, Document)>);
        let mut parts: Vec<Partition> = Vec::new();
        let (mut gmin, mut gmax) = (f64::INFINITY, f64::NEG_INFINITY);
        for d in rows {
            let mut key = Vec::new();
            let mut fields = Vec::new();
            for p in &st.partition {
                let v = Root::Doc(&d).get(p)?.unwrap_or(Bson::Null);
                key.push(v.clone());
                fields.push((p.clone(), v));
            }
            let key = Bson::Array(key);
            let x = st.value_of(&d)?;
            if let Some(x) = x {
                gmin = gmin.min(x);
                gmax = gmax.max(x);
            }
            match parts
                .iter_mut()
                .find(|(k, _, _)| compare(k, &key) == Ordering::Equal)
            {
                Some(p) => p.2.push((x, d)),
                None => parts.push((key, fields, vec![(x, d)])),
            }
        }
        parts.sort_by(|a, b| compare(&a.0, &b.0));
        let mut out = Vec::new();
        let mut generated = 0usize;
        for (_, fields, mut docs) in parts {
            docs.sort_by(|a, b| match (a.0, b.0) {
                (None, None) => Ordering::Equal,
                (None, Some(_)) => Ordering::Less,
                (Some(_), None) => Ordering::Greater,
                (Some(x), Some(y)) => x.total_cmp(&y),
            });
            let (pmin, pmax) = docs
                .iter()
                .filter_map(|(x, _)| *x)
                .fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), x| {
                    (lo.min(x), hi.max(x))
                });
            let (origin, upper, inclusive) = match st.bounds {
                DensifyBounds::Full => (gmin, gmax, true),
                DensifyBounds::Partition => (pmin, pmax, true),
                DensifyBounds::Explicit(lo, hi) => (lo, hi, false),
            };
            let below = |v: f64| if inclusive { v <= upper } else { v < upper };
            let mut k: i64 = 0;
            let mut emit_until =
                |limit: f64, strict: bool, k: &mut i64, out: &mut Vec<Document>| -> Result<()> {
                    while let Some(v) = st.at(origin, *k) {
                        let before = if strict { v < limit } else { v <= limit };
                        if !(before && below(v) && origin.is_finite()) {
                            break;
                        }
                        generated += 1;
                        if generated > MAX_DENSIFY_DOCS {
                            return Err(too_many(generated));
                        }
                        out.push(st.make(v, &fields));
                        *k += 1;
                    }
                    Ok(())
                };
            for (x, d) in docs {
                if let Some(x) = x {
                    if x >= origin {
                        emit_until(x, true, &mut k, &mut out)?;
                        while st.at(origin, k).is_some_and(|v| v <= x && below(v)) {
                            k += 1;
                        }
                    }
                }
                out.push(d);
            }
            if origin.is_finite() {
                emit_until(upper, !inclusive, &mut k, &mut out)?;
            }
        }
        Ok(out)
    }

    /// Documents in a few partitions (`g`, sometimes missing) with values
    /// `v` (sometimes missing or not a number), padded.
    fn input(xs: &[(u8, i16)]) -> Vec<Document> {
        xs.iter()
            .enumerate()
            .map(|(i, (g, v))| {
                let mut d = doc! {"i": i as i32, "pad": "z".repeat(40)};
                if g % 5 != 4 {
                    d.insert("g", i32::from(g % 4));
                }
                match v % 9 {
                    0 => {}
                    1 => {
                        d.insert("v", "text");
                    }
                    2 => {
                        d.insert("v", f64::from(*v) / 4.0);
                    }
                    _ => {
                        d.insert("v", i32::from(*v));
                    }
                }
                d
            })
            .collect()
    }

    fn stage(bounds: Bson, step: f64, partitioned: bool) -> Document {
        let mut spec = doc! {"field": "v", "range": {"step": step, "bounds": bounds}};
        if partitioned {
            spec.insert("partitionByFields", ["g"]);
        }
        doc! {"$densify": spec}
    }

    fn oracle(stage: &Document, docs: &[Document]) -> Result<Vec<Document>> {
        let d = Densify::parse(stage.get("$densify").expect("test setup"))?;
        held(&d, docs.to_vec())
    }

    #[test]
    fn densify_streams_over_more_than_the_memory_limit() {
        let xs: Vec<(u8, i16)> = (0..3000u32)
            .map(|i| ((i % 7) as u8, ((i * 37) % 600) as i16 - 100))
            .collect();
        let docs = input(&xs);
        for s in [
            stage(Bson::String("full".into()), 1.0, true),
            stage(Bson::String("partition".into()), 2.0, true),
            stage(bson::bson!([-50, 450]), 3.0, true),
            stage(Bson::String("full".into()), 0.5, false),
        ] {
            let want = oracle(&s, &docs).expect("oracle");
            let before = spill_stats().runs;
            let got = streamed(std::slice::from_ref(&s), &docs, 32 * 1024, true).expect("spilled");
            assert!(spill_stats().runs > before, "no spill: {s}");
            assert_eq!(got, want, "{s}");
            let e = streamed(std::slice::from_ref(&s), &docs, 32 * 1024, false)
                .expect_err("over the limit without disk use");
            assert_eq!(e.code(), 292, "{s}");
        }
    }

    #[test]
    fn generated_documents_are_limited_while_streaming() {
        let docs = vec![doc! {"v": 0}, doc! {"v": 600_000}];
        let s = stage(Bson::String("full".into()), 1.0, false);
        let e = streamed(std::slice::from_ref(&s), &docs, 1024, true).expect_err("too many");
        assert_eq!(e.code(), 5897900);
        // Under the limit: generated as they stream, not held.
        let docs = vec![doc! {"v": 0}, doc! {"v": 400_000}];
        let got = streamed(&[s, doc! {"$count": "n"}], &docs, 1024, false).expect("streams");
        assert_eq!(got, vec![doc! {"n": 400_001}]);
    }

    #[test]
    fn a_value_far_past_explicit_bounds_does_not_walk_to_it() {
        let docs = vec![doc! {"v": 0}, doc! {"v": 1e15}];
        let s = stage(bson::bson!([0, 3]), 1.0, false);
        let got = streamed(std::slice::from_ref(&s), &docs, 1 << 20, true).expect("densify");
        let vs: Vec<f64> = got
            .iter()
            .map(|d| num_of(d.get("v").expect("v")).expect("num").to_f64())
            .collect();
        assert_eq!(vs, vec![0.0, 1.0, 2.0, 1e15]);
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(32))]
        #[test]
        fn any_limit_gives_the_held_densify(
            xs in proptest::collection::vec((0u8..10, -40i16..80), 0..200),
            limit in 1024usize..16 * 1024,
            bounds in 0u8..3,
            step in 1u8..4,
            partitioned in any::<bool>(),
        ) {
            let docs = input(&xs);
            let b = match bounds {
                0 => Bson::String("full".into()),
                1 if partitioned => Bson::String("partition".into()),
                _ => bson::bson!([-10, 30]),
            };
            let s = stage(b, f64::from(step) / 2.0, partitioned);
            let want = oracle(&s, &docs).map_err(|e| e.code());
            let got = streamed(std::slice::from_ref(&s), &docs, limit, true).map_err(|e| e.code());
            prop_assert_eq!(got, want.clone());
            match streamed(std::slice::from_ref(&s), &docs, limit, false) {
                Ok(got) => prop_assert_eq!(Ok(got), want),
                Err(e) => prop_assert_eq!(e.code(), 292),
            }
        }
    }

    /// `$fill` is a `$setWindowFields` (methods) and a `$sort` + `$addFields`
    /// (values): one partition past the limit spills with disk use.
    #[test]
    fn fill_over_one_partition_past_the_limit_spills() {
        let docs: Vec<Document> = (0..1500i32)
            .map(|i| {
                let mut d = doc! {"i": i, "t": (i * 7919) % 1500, "pad": "f".repeat(40)};
                if i % 5 == 0 {
                    d.insert("a", i);
                    d.insert("b", f64::from(i) * 2.0);
                }
                d
            })
            .collect();
        let pipelines = [
            vec![doc! {"$fill": {"sortBy": {"t": 1}, "output": {
                "a": {"method": "locf"}, "b": {"method": "linear"}, "c": {"value": 7},
            }}}],
            vec![doc! {"$fill": {"sortBy": {"t": -1}, "output": {"c": {"value": 7}}}}],
        ];
        for p in pipelines {
            let want = crate::query::aggregate::test_support::reference(&p, &docs);
            let before = spill_stats().runs;
            let got = streamed(&p, &docs, 16 * 1024, true).expect("spilled");
            assert!(spill_stats().runs > before, "no spill");
            assert_eq!(got, want);
            let e = streamed(&p, &docs, 16 * 1024, false).expect_err("over the limit");
            assert_eq!(e.code(), 292);
        }
    }
}
