//! `$group`: the group key, the accumulators and the group state, with the
//! merge that makes a `$group` computable on a parallel scan.
//!
//! Owns: [`Group`] (parsed `$group`), [`GroupState`] (keys → accumulator
//! states, with its memory count), the accumulators `$sum $avg $min $max $first
//! $last $push $addToSet $count $mergeObjects $stdDevPop $stdDevSamp $top
//! $bottom $topN $bottomN $firstN $lastN $maxN $minN $median $percentile`,
//! [`canonical_cmp`] and the memory estimate of a value ([`approx_size`]).
//!
//! Invariants:
//! - Every accumulator but the order-dependent ones (`$first $last $firstN
//!   $lastN $mergeObjects`) is mergeable: merging two states gives what
//!   feeding both inputs into one would (up to `$push` order and double
//!   rounding); [`Group::is_mergeable`] says whether a `$group` may close a
//!   commutative part, so an order-dependent one makes the planner fall back
//!   to one ordered scan. `$top`/`$bottom`/`$maxN`/`$minN` break ties of their
//!   sort key by [`canonical_cmp`] of the output, so their answer does not
//!   depend on arrival order either.
//! - Keys, set elements and min/max equal under `compare` but not identical
//!   keep the representative [`canonical_cmp`] picks, not the first to arrive.
//! - Under a collation ([`Group::with_collation`], the command's) group keys
//!   and `$addToSet` elements are ordered by their collation keys
//!   ([`OrdBson::collated`]), so `"a"` and `"A"` are one group or one element
//!   under strength 2, in memory, merged and spilled alike; `$min`/`$max`
//!   compare under the collation in scope (the aggregation's).
//! - Integer sums are exact (i128); the widest input type decides the result
//!   type; any decimal128 input makes the sum exact decimal128.
//! - The state's memory estimate only grows by what is retained, and a group
//!   past its limit is an error (292), as is an array past 16 MiB (10334) and
//!   an output document past 16 MiB (10334).

use std::cmp::Ordering;
use std::collections::btree_map::Entry;
use std::collections::{BTreeMap, BTreeSet};

use bson::{Bson, Document, RawBson};

use crate::doc::size::check_document;
use crate::doc::MAX_DOC_SIZE;
use crate::error::{Error, Result};
use crate::query::aggregate::GROUP_MEMORY_LIMIT;
use crate::query::expr::{compare, compare_values, decimal, Expr, Root, Scope, SortBy, Value};

#[derive(Debug, Clone)]
pub(super) struct Group {
    id: Expr,
    fields: Vec<(String, AccOp, Expr)>,
    pub(super) memory_limit: usize,
    /// Group keys equal under this collation are one group (the output
    /// `_id` is one of them, chosen as for `1`/`1.0`).
    collator: Option<std::sync::Arc<crate::doc::collation::Collator>>,
}

#[derive(Debug, Clone)]
pub(super) enum AccOp {
    Sum,
    Avg,
    Min,
    Max,
    First,
    Last,
    Push,
    AddToSet,
    MergeObjects,
    StdDev {
        samp: bool,
    },
    /// `$top`/`$bottom`/`$topN`/`$bottomN`: the `n` best by `sort` (the
    /// sort's last ones for bottom); `single`: answer one value, not an array.
    Top {
        n: usize,
        sort: Vec<(Expr, bool)>,
        bottom: bool,
        single: bool,
    },
    FirstN(usize),
    LastN(usize),
    /// `$maxN` (`max: true`) / `$minN`.
    MinMaxN {
        n: usize,
        max: bool,
    },
    /// `$median` (`single`) / `$percentile` with its `p`s.
    Percentile {
        ps: Vec<f64>,
        single: bool,
    },
}

/// One group's accumulator state.
#[derive(Debug, Clone)]
pub(super) enum Acc {
    Sum(SumState),
    Avg(SumState),
    Min(Option<Bson>),
    Max(Option<Bson>),
    /// `None` until the first document; then its value (missing → null).
    First(Option<Bson>),
    Last(Option<Bson>),
    Push(Vec<Bson>, usize),
    AddToSet(BTreeSet<OrdBson>, usize),
    MergeObjects(Document, usize),
    /// Welford's count, mean and sum of squared deviations.
    StdDev(u64, f64, f64),
    /// Sort key and output, kept sorted best first, at most `n`.
    Top(Vec<(Vec<Value>, Bson)>, usize),
    /// `$firstN`/`$lastN`: values in arrival order, at most `n`.
    Ordered(Vec<Bson>, usize),
    /// `$maxN`/`$minN`: values sorted best first, at most `n`.
    Best(Vec<Bson>, usize),
    Numbers(Vec<f64>),
}

/// An exact running sum: integers in i128 (cannot overflow for < 2^64 inputs),
/// doubles separately; the widest input type decides the result type.
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct SumState {
    pub(super) int: i128,
    pub(super) dbl: f64,
    /// The exact sum of the decimal128 inputs, once one was seen.
    pub(super) dec: Option<decimal::Dec>,
    /// 0 = int32, 1 = int64, 2 = double.
    pub(super) widest: u8,
    pub(super) count: u64,
}

impl SumState {
    pub(super) fn add(&mut self, v: &Bson) -> Result<()> {
        match v {
            Bson::Int32(i) => self.int += i128::from(*i),
            Bson::Int64(i) => {
                self.int += i128::from(*i);
                self.widest = self.widest.max(1);
            }
            Bson::Double(f) => {
                self.dbl += f;
                self.widest = 2;
            }
            Bson::Decimal128(d) => {
                let x = decimal::from_bson(*d);
                self.dec = Some(match self.dec {
                    Some(acc) => decimal::cx().add(acc, x),
                    None => x,
                });
            }
            // Non-numeric values are ignored, as in MongoDB.
            _ => return Ok(()),
        }
        self.count += 1;
        Ok(())
    }

    fn merge(&mut self, o: &SumState) {
        self.int += o.int;
        self.dbl += o.dbl;
        self.dec = match (self.dec, o.dec) {
            (Some(a), Some(b)) => Some(decimal::cx().add(a, b)),
            (a, b) => a.or(b),
        };
        self.widest = self.widest.max(o.widest);
        self.count += o.count;
    }

    /// The decimal total (decimals, integers and doubles), when a decimal
    /// was seen.
    fn dec_total(&self) -> Option<decimal::Dec> {
        let d = self.dec?;
        let mut c = decimal::cx();
        let ints = c.from_i128(self.int);
        let total = c.add(d, ints);
        Some(if self.widest == 2 {
            c.add(total, decimal::from_f64(self.dbl))
        } else {
            total
        })
    }

    pub(super) fn sum(&self) -> Bson {
        if let Some(t) = self.dec_total() {
            return Bson::Decimal128(decimal::to_bson(t));
        }
        if self.widest == 2 {
            return Bson::Double(self.int as f64 + self.dbl);
        }
        match (i32::try_from(self.int), i64::try_from(self.int)) {
            (Ok(i), _) if self.widest == 0 => Bson::Int32(i),
            (_, Ok(l)) => Bson::Int64(l),
            _ => Bson::Double(self.int as f64),
        }
    }

    pub(super) fn avg(&self) -> Bson {
        if self.count == 0 {
            return Bson::Null;
        }
        if let Some(t) = self.dec_total() {
            let n = decimal::Dec::from(i64::try_from(self.count).unwrap_or(i64::MAX));
            return Bson::Decimal128(decimal::to_bson(decimal::cx().div(t, n)));
        }
        Bson::Double((self.int as f64 + self.dbl) / self.count as f64)
    }
}

/// A value ordered by MongoDB's comparison (equal values are one key).
/// Documents and arrays carry their raw form, encoded once, because comparing
/// owned documents would re-encode both sides at every comparison; under a
/// collation strings too carry one: their collation key.
#[derive(Debug, Clone)]
pub(super) struct OrdBson(pub(super) Bson, Option<RawBson>);

impl OrdBson {
    pub(super) fn new(v: Bson) -> OrdBson {
        let raw = match &v {
            Bson::Document(_) | Bson::Array(_) => crate::doc::value::to_raw(&v),
            _ => None,
        };
        OrdBson(v, raw)
    }

    /// Ordered by its collation key (strings at any depth keyed by `c`).
    pub(super) fn collated(v: Bson, c: &crate::doc::collation::Collator) -> OrdBson {
        let raw = match &v {
            Bson::String(_) | Bson::Symbol(_) | Bson::Document(_) | Bson::Array(_) => {
                crate::doc::value::to_raw(&v).map(|r| c.key_raw(r.as_raw_bson_ref()))
            }
            _ => None,
        };
        OrdBson(v, raw)
    }
}

impl PartialEq for OrdBson {
    fn eq(&self, o: &Self) -> bool {
        self.cmp(o) == Ordering::Equal
    }
}
impl Eq for OrdBson {}
impl PartialOrd for OrdBson {
    fn partial_cmp(&self, o: &Self) -> Option<Ordering> {
        Some(self.cmp(o))
    }
}
impl Ord for OrdBson {
    fn cmp(&self, o: &Self) -> Ordering {
        match (&self.1, &o.1) {
            (Some(a), Some(b)) => {
                crate::doc::value::compare(a.as_raw_bson_ref(), b.as_raw_bson_ref())
            }
            _ => compare(&self.0, &o.0),
        }
    }
}

/// A total order on values refining `compare`: among values `compare` calls
/// equal (`1`, `1.0`, `NumberLong(1)`), the smaller type code, then the smaller
/// bit pattern / rendering. Used to pick a representative independently of
/// arrival order.
pub fn canonical_cmp(a: &Bson, b: &Bson) -> Ordering {
    compare(a, b).then_with(|| tie_break(a, b))
}

/// [`canonical_cmp`] for two values already known to compare equal (cheap when
/// they are identical, the common case).
pub(super) fn tie_break(a: &Bson, b: &Bson) -> Ordering {
    if a == b {
        return Ordering::Equal;
    }
    (a.element_type() as u8)
        .cmp(&(b.element_type() as u8))
        .then_with(|| match (a, b) {
            (Bson::Double(x), Bson::Double(y)) => x.to_bits().cmp(&y.to_bits()),
            _ => format!("{a:?}").cmp(&format!("{b:?}")),
        })
}

#[derive(Debug, Clone, Default)]
pub(super) struct GroupState {
    groups: BTreeMap<OrdBson, Vec<Acc>>,
    bytes: usize,
}

impl GroupState {
    /// Groups formed so far.
    pub(super) fn len(&self) -> usize {
        self.groups.len()
    }

    /// The memory estimate of the state (what the limit is checked against).
    pub(super) fn bytes(&self) -> usize {
        self.bytes
    }

    /// The groups in key order, emptying the state.
    pub(super) fn take_groups(&mut self) -> BTreeMap<OrdBson, Vec<Acc>> {
        self.bytes = 0;
        std::mem::take(&mut self.groups)
    }
}

/// Rough fixed cost of a group entry beyond its key and values.
const GROUP_ENTRY_OVERHEAD: usize = 64;

impl Group {
    /// Parse a `$group` whose expressions may use the variables of `scope`.
    pub(super) fn parse(spec: &Document, scope: &Scope) -> Result<Group> {
        let id = spec
            .get("_id")
            .ok_or_else(|| coded!(15955, "a group specification must include an _id"))?;
        let id = ex(id, scope)?;
        let mut fields = Vec::new();
        for (k, v) in spec.iter().filter(|(k, _)| k.as_str() != "_id") {
            // MongoDB's codes (accumulation_statement.cpp, document_source_group.cpp).
            if k.starts_with('$') {
                return Err(coded!(
                    40236,
                    format!("The field name '{k}' cannot be an operator name")
                ));
            }
            if k.contains('.') {
                return Err(coded!(
                    40235,
                    format!("The field name '{k}' cannot contain '.'")
                ));
            }
            let Bson::Document(acc) = v else {
                return Err(coded!(
                    40234,
                    format!("The field '{k}' must be an accumulator object")
                ));
            };
            if acc.len() != 1 {
                return Err(coded!(
                    40238,
                    format!("The field '{k}' must specify one accumulator")
                ));
            }
            let Some((op, arg)) = acc.iter().next() else {
                return Err(Error::Internal("empty accumulator".into()));
            };
            let (op, arg) = match op.as_str() {
                "$sum" => (AccOp::Sum, ex(arg, scope)?),
                "$avg" => (AccOp::Avg, ex(arg, scope)?),
                "$min" => (AccOp::Min, ex(arg, scope)?),
                "$max" => (AccOp::Max, ex(arg, scope)?),
                "$first" => (AccOp::First, ex(arg, scope)?),
                "$last" => (AccOp::Last, ex(arg, scope)?),
                "$push" => (AccOp::Push, ex(arg, scope)?),
                "$addToSet" => (AccOp::AddToSet, ex(arg, scope)?),
                "$mergeObjects" => (AccOp::MergeObjects, ex(arg, scope)?),
                "$stdDevPop" => (AccOp::StdDev { samp: false }, ex(arg, scope)?),
                "$stdDevSamp" => (AccOp::StdDev { samp: true }, ex(arg, scope)?),
                "$top" | "$bottom" | "$topN" | "$bottomN" | "$firstN" | "$lastN" | "$maxN"
                | "$minN" | "$median" | "$percentile" => parse_n_acc(op, arg, scope)?,
                "$accumulator" | "$function" => {
                    return Err(Error::bad_value(format!(
                        "{op} is not supported by duetdb: it runs JavaScript"
                    )))
                }
                "$count" => match arg {
                    Bson::Document(d) if d.is_empty() => {
                        (AccOp::Sum, Expr::Literal(Bson::Int32(1)))
                    }
                    _ => {
                        return Err(Error::bad_value(
                            "$count takes no arguments, i.e. $count:{}",
                        ))
                    }
                },
                other => return Err(coded!(15952, format!("unknown group operator '{other}'"))),
            };
            fields.push((k.clone(), op, arg));
        }
        Ok(Group {
            id,
            fields,
            memory_limit: GROUP_MEMORY_LIMIT,
            collator: None,
        })
    }

    /// This `$group` keying strings under `c`.
    pub(super) fn with_collation(
        mut self,
        c: Option<std::sync::Arc<crate::doc::collation::Collator>>,
    ) -> Group {
        self.collator = c;
        self
    }

    /// All accumulators mergeable (none of `$first $last $firstN $lastN
    /// $mergeObjects`, which depend on the order of their input).
    pub(super) fn is_mergeable(&self) -> bool {
        self.fields.iter().all(|(_, op, _)| {
            !matches!(
                op,
                AccOp::First
                    | AccOp::Last
                    | AccOp::FirstN(_)
                    | AccOp::LastN(_)
                    | AccOp::MergeObjects
            )
        })
    }

    fn new_accs(&self) -> Vec<Acc> {
        self.fields
            .iter()
            .map(|(_, op, _)| match op {
                AccOp::Sum => Acc::Sum(SumState::default()),
                AccOp::Avg => Acc::Avg(SumState::default()),
                AccOp::Min => Acc::Min(None),
                AccOp::Max => Acc::Max(None),
                AccOp::First => Acc::First(None),
                AccOp::Last => Acc::Last(None),
                AccOp::Push => Acc::Push(Vec::new(), 0),
                AccOp::AddToSet => Acc::AddToSet(BTreeSet::new(), 0),
                AccOp::MergeObjects => Acc::MergeObjects(Document::new(), 0),
                AccOp::StdDev { .. } => Acc::StdDev(0, 0.0, 0.0),
                AccOp::Top { .. } => Acc::Top(Vec::new(), 0),
                AccOp::FirstN(_) | AccOp::LastN(_) => Acc::Ordered(Vec::new(), 0),
                AccOp::MinMaxN { .. } => Acc::Best(Vec::new(), 0),
                AccOp::Percentile { .. } => Acc::Numbers(Vec::new()),
            })
            .collect()
    }

    pub(super) fn accumulate(&self, gs: &mut GroupState, root: Root<'_>) -> Result<()> {
        self.feed(gs, root)?;
        self.check_memory(gs.bytes)
    }

    /// [`Group::accumulate`] without the memory check (the caller spills or
    /// refuses: `group_spill`).
    pub(super) fn feed(&self, gs: &mut GroupState, root: Root<'_>) -> Result<()> {
        let id = self.id.eval(&root)?.unwrap_or(Bson::Null);
        let key = self.key_of(id);
        replace_key_if_smaller(&mut gs.groups, &key);
        let accs = match gs.groups.entry(key) {
            Entry::Occupied(o) => o.into_mut(),
            Entry::Vacant(v) => {
                gs.bytes +=
                    approx_size(&v.key().0) + GROUP_ENTRY_OVERHEAD * (1 + self.fields.len());
                v.insert(self.new_accs())
            }
        };
        for ((_, op, arg), acc) in self.fields.iter().zip(accs.iter_mut()) {
            let v = arg.eval(&root)?;
            gs.bytes += match op {
                AccOp::Top {
                    n, sort, bottom, ..
                } => {
                    let key = sort
                        .iter()
                        .map(|(e, _)| e.eval(&root))
                        .collect::<Result<Vec<Value>>>()?;
                    let dirs: Vec<bool> = sort.iter().map(|(_, asc)| *asc != *bottom).collect();
                    feed_top(acc, key, v.unwrap_or(Bson::Null), *n, &dirs)?
                }
                _ => feed_acc(acc, op, v, self)?,
            };
        }
        Ok(())
    }

    /// The limit where the state cannot spill (an OLCP part's per-thread
    /// states and their merge; `group_spill` past the limit without
    /// `allowDiskUse`): MongoDB's 292 message. An OLCP run that passes it
    /// with `allowDiskUse` is rerun as one ordered scan, which spills.
    pub(super) fn check_memory_no_disk(&self, bytes: usize) -> Result<()> {
        if bytes > self.memory_limit {
            return Err(Error::ExceededMemoryLimit(format!(
                "Exceeded memory limit for $group ({bytes} bytes, the limit is {} bytes), but didn't allow external sort. Pass allowDiskUse:true to opt in.",
                self.memory_limit
            )));
        }
        Ok(())
    }

    pub(super) fn check_memory(&self, bytes: usize) -> Result<()> {
        if bytes > self.memory_limit {
            return Err(Error::ExceededMemoryLimit(format!(
                "Exceeded memory limit for $group ({} bytes of group state, the limit is {} bytes)",
                bytes, self.memory_limit
            )));
        }
        Ok(())
    }

    pub(super) fn merge(&self, a: GroupState, b: GroupState) -> Result<GroupState> {
        // Fold the smaller map into the larger.
        let (mut big, small) = if a.groups.len() >= b.groups.len() {
            (a, b)
        } else {
            (b, a)
        };
        big.bytes += small.bytes;
        for (key, accs) in small.groups {
            match big.groups.get_mut(&key) {
                Some(mine) => {
                    for ((m, o), (_, op, _)) in mine.iter_mut().zip(accs).zip(&self.fields) {
                        merge_acc(m, o, op)?;
                    }
                    big.bytes = big
                        .bytes
                        .saturating_sub(approx_size(&key.0) + GROUP_ENTRY_OVERHEAD);
                    replace_key_if_smaller(&mut big.groups, &key);
                }
                None => {
                    big.groups.insert(key, accs);
                }
            }
        }
        self.check_memory_no_disk(big.bytes)?;
        Ok(big)
    }

    /// The output fields of a group that received no document (what a window
    /// function answers for an empty window: 0 for `$sum`, null for `$avg`,
    /// `[]` for `$push`, ...), without `_id`.
    pub(super) fn empty_result(&self) -> Document {
        let mut d = Document::new();
        for ((name, op, _), acc) in self.fields.iter().zip(self.new_accs()) {
            d.insert(name.clone(), finish_acc(acc, op));
        }
        d
    }

    pub(super) fn finish(&self, gs: GroupState) -> Result<Vec<Document>> {
        let mut out = Vec::with_capacity(gs.groups.len());
        for (key, accs) in gs.groups {
            out.push(self.finish_group(key, accs)?);
        }
        Ok(out)
    }

    /// The output document of one group.
    pub(super) fn finish_group(&self, key: OrdBson, accs: Vec<Acc>) -> Result<Document> {
        let mut d = Document::new();
        d.insert("_id", key.0);
        for ((name, op, _), acc) in self.fields.iter().zip(accs) {
            d.insert(name.clone(), finish_acc(acc, op));
        }
        // Each array is within 16 MiB, but several together may not be.
        check_document("$group", &d)?;
        Ok(d)
    }

    /// The accumulator operators, in field order.
    pub(super) fn ops(&self) -> impl Iterator<Item = &AccOp> {
        self.fields.iter().map(|(_, op, _)| op)
    }

    /// Keys equal under this collation are one group, and elements equal
    /// under it one `$addToSet` element (MongoDB's accumulators take the
    /// command's collation).
    pub(super) fn key_of(&self, v: Bson) -> OrdBson {
        match &self.collator {
            Some(c) => OrdBson::collated(v, c),
            None => OrdBson::new(v),
        }
    }

    /// Fold `later` (the states of the same group over input that came
    /// after `mine`'s) into `mine`: what feeding both inputs in order into
    /// one state gives, order-dependent accumulators included.
    pub(super) fn append(&self, mine: &mut [Acc], later: Vec<Acc>) -> Result<()> {
        for ((m, l), (_, op, _)) in mine.iter_mut().zip(later).zip(&self.fields) {
            append_acc(m, l, op)?;
        }
        Ok(())
    }
}

/// Parse one expression of the stage in (a copy of) `scope`.
fn ex(v: &Bson, scope: &Scope) -> Result<Expr> {
    Expr::parse_in(v, &mut scope.clone())
}

/// Keep the canonical representative of a group key (see [`canonical_cmp`]).
fn replace_key_if_smaller(groups: &mut BTreeMap<OrdBson, Vec<Acc>>, key: &OrdBson) {
    let replace = groups
        .get_key_value(key)
        .is_some_and(|(k, _)| tie_break(&key.0, &k.0) == Ordering::Less);
    if replace {
        if let Some(v) = groups.remove(key) {
            groups.insert(key.clone(), v);
        }
    }
}

/// Feed one value; returns the bytes the state grew by. `$addToSet` keys
/// its elements as `group` keys its groups (under its collation).
fn feed_acc(acc: &mut Acc, op: &AccOp, v: Value, group: &Group) -> Result<usize> {
    let want = if matches!(acc, Acc::Min(_)) {
        Ordering::Less
    } else {
        Ordering::Greater
    };
    match acc {
        Acc::Sum(s) | Acc::Avg(s) => {
            if let Some(v) = &v {
                s.add(v)?;
            }
            Ok(0)
        }
        Acc::Min(best) | Acc::Max(best) => {
            let Some(v) = v.filter(|x| !matches!(x, Bson::Null | Bson::Undefined)) else {
                return Ok(0);
            };
            // Count the value's memory once, when the group gets its first one.
            let grow = if best.is_none() { approx_size(&v) } else { 0 };
            *best = pick(best.take(), v, want);
            Ok(grow)
        }
        Acc::First(first) => {
            if first.is_none() {
                *first = Some(v.unwrap_or(Bson::Null));
            }
            Ok(0)
        }
        Acc::Last(last) => {
            *last = Some(v.unwrap_or(Bson::Null));
            Ok(0)
        }
        Acc::Push(items, bytes) => {
            // $push keeps null but skips missing, as in MongoDB.
            let Some(v) = v else { return Ok(0) };
            let n = approx_size(&v);
            *bytes += n;
            check_array_size("$push", *bytes)?;
            items.push(v);
            Ok(n)
        }
        Acc::AddToSet(set, bytes) => {
            let Some(v) = v else { return Ok(0) };
            add_to_set(set, bytes, group.key_of(v))
        }
        Acc::MergeObjects(d, bytes) => match v {
            None | Some(Bson::Null) | Some(Bson::Undefined) => Ok(0),
            Some(Bson::Document(x)) => {
                let n = approx_size(&Bson::Document(x.clone()));
                for (k, val) in x {
                    d.insert(k, val);
                }
                *bytes += n;
                check_array_size("$mergeObjects", *bytes)?;
                Ok(n)
            }
            Some(other) => Err(Error::Coded {
                code: 40400,
                name: "Location40400",
                msg: format!(
                    "$mergeObjects requires object inputs, but input {} is of type {}",
                    crate::error::render(&other),
                    crate::doc::types::type_name(&other)
                ),
            }),
        },
        Acc::StdDev(n, mean, m2) => {
            let Some(x) = v.as_ref().and_then(number_f64) else {
                return Ok(0);
            };
            *n += 1;
            let d = x - *mean;
            *mean += d / *n as f64;
            *m2 += d * (x - *mean);
            Ok(0)
        }
        Acc::Ordered(items, bytes) => {
            let cap = match op {
                AccOp::FirstN(n) | AccOp::LastN(n) => *n,
                _ => 0,
            };
            if matches!(op, AccOp::FirstN(_)) && items.len() >= cap {
                return Ok(0);
            }
            // $firstN/$lastN keep null for missing, as MongoDB's.
            let v = v.unwrap_or(Bson::Null);
            let mut n = approx_size(&v);
            items.push(v);
            *bytes += n;
            if items.len() > cap {
                // The state keeps `cap` values: it grows only by the difference.
                let gone = approx_size(&items.remove(0));
                *bytes = bytes.saturating_sub(gone);
                n = n.saturating_sub(gone);
            }
            check_array_size("$lastN", *bytes)?;
            Ok(n)
        }
        Acc::Best(items, bytes) => {
            let Some(v) = v.filter(|x| !matches!(x, Bson::Null | Bson::Undefined)) else {
                return Ok(0);
            };
            let (n, max) = match op {
                AccOp::MinMaxN { n, max } => (*n, *max),
                _ => (0, false),
            };
            Ok(insert_best(items, bytes, v, n, max))
        }
        Acc::Numbers(xs) => match v.as_ref().and_then(number_f64) {
            Some(x) => {
                xs.push(x);
                Ok(16)
            }
            None => Ok(0),
        },
        Acc::Top(..) => Err(Error::Internal("$top is fed with its sort key".into())),
    }
}

/// A number as a double (what `$stdDev*`, `$median`, `$percentile` read;
/// other types are ignored).
fn number_f64(v: &Bson) -> Option<f64> {
    match v {
        Bson::Int32(i) => Some(f64::from(*i)),
        Bson::Int64(i) => Some(*i as f64),
        Bson::Double(f) => Some(*f),
        Bson::Decimal128(d) => Some(crate::doc::value::decimal_to_f64(*d)),
        _ => None,
    }
}

/// Order of two `$maxN`/`$minN` values, best first; equal values by the
/// canonical tie-break, so the kept set does not depend on arrival order.
fn best_cmp(a: &Bson, b: &Bson, max: bool) -> Ordering {
    let c = canonical_cmp(a, b);
    if max {
        c.reverse()
    } else {
        c
    }
}

/// Insert `v` into the sorted best-first list of at most `n`; returns the
/// bytes it grew by.
fn insert_best(items: &mut Vec<Bson>, bytes: &mut usize, v: Bson, n: usize, max: bool) -> usize {
    let pos = items.partition_point(|x| best_cmp(x, &v, max) != Ordering::Greater);
    if pos >= n {
        return 0;
    }
    let mut grow = approx_size(&v);
    items.insert(pos, v);
    *bytes += grow;
    if items.len() > n {
        if let Some(gone) = items.pop() {
            let gone = approx_size(&gone);
            *bytes = bytes.saturating_sub(gone);
            grow = grow.saturating_sub(gone);
        }
    }
    grow
}

/// Order of two `$top`-family entries: by the sort key (`dirs[i]`: ascending),
/// then the output canonically.
fn top_cmp(a: &(Vec<Value>, Bson), b: &(Vec<Value>, Bson), dirs: &[bool]) -> Ordering {
    for ((x, y), asc) in a.0.iter().zip(&b.0).zip(dirs) {
        let c = compare_values(x, y);
        let c = if *asc { c } else { c.reverse() };
        if c != Ordering::Equal {
            return c;
        }
    }
    canonical_cmp(&a.1, &b.1)
}

fn feed_top(acc: &mut Acc, key: Vec<Value>, out: Bson, n: usize, dirs: &[bool]) -> Result<usize> {
    let Acc::Top(items, bytes) = acc else {
        return Err(Error::Internal("mismatched accumulators".into()));
    };
    let entry = (key, out);
    let pos = items.partition_point(|x| top_cmp(x, &entry, dirs) != Ordering::Greater);
    if pos >= n {
        return Ok(0);
    }
    let size = |e: &(Vec<Value>, Bson)| {
        approx_size(&e.1) + e.0.iter().flatten().map(approx_size).sum::<usize>()
    };
    let mut grow = size(&entry);
    items.insert(pos, entry);
    *bytes += grow;
    if items.len() > n {
        if let Some(gone) = items.pop() {
            // The state keeps `n` entries: it grows only by the difference.
            let gone = size(&gone);
            *bytes = bytes.saturating_sub(gone);
            grow = grow.saturating_sub(gone);
        }
    }
    check_array_size("$topN", *bytes)?;
    Ok(grow)
}

/// Parse `$top $bottom $topN $bottomN $firstN $lastN $maxN $minN $median
/// $percentile` (their argument is an object of named parameters; `n` and
/// `p` must be constants).
fn parse_n_acc(op: &str, arg: &Bson, scope: &Scope) -> Result<(AccOp, Expr)> {
    let Bson::Document(d) = arg else {
        return Err(Error::Coded {
            code: 5787801,
            name: "Location5787801",
            msg: format!(
                "specification must be an object; found {}",
                crate::error::render(arg)
            ),
        });
    };
    let allowed: &[&str] = match op {
        "$top" | "$bottom" => &["sortBy", "output"],
        "$topN" | "$bottomN" => &["n", "sortBy", "output"],
        "$median" => &["input", "method"],
        "$percentile" => &["input", "p", "method"],
        _ => &["n", "input"],
    };
    if let Some(k) = d.keys().find(|k| !allowed.contains(&k.as_str())) {
        return Err(Error::Coded {
            code: 5787901,
            name: "Location5787901",
            msg: format!("Unknown argument for '{op}' operator: {k}"),
        });
    }
    let need = |k: &str| -> Result<&Bson> {
        d.get(k).ok_or_else(|| Error::Coded {
            code: 5787906,
            name: "Location5787906",
            msg: format!("Missing value for '{k}'"),
        })
    };
    let constant = |k: &str| -> Result<Value> {
        let empty = Document::new();
        ex(need(k)?, scope)?.eval(&Root::Doc(&empty))
    };
    let n = |single: bool| -> Result<usize> {
        if single {
            return Ok(1);
        }
        crate::query::expr::n_arg(&constant("n")?, op)
    };
    Ok(match op {
        "$top" | "$bottom" | "$topN" | "$bottomN" => {
            let single = matches!(op, "$top" | "$bottom");
            let Bson::Document(by) = need("sortBy")? else {
                return Err(Error::Coded {
                    code: 5788604,
                    name: "Location5788604",
                    msg: format!(
                        "expected 'sortBy' to already be an object in the arguments to {op}"
                    ),
                });
            };
            // Validated as a sort spec; each key becomes a field path.
            SortBy::parse(&Some(Bson::Document(by.clone())), op)?;
            let mut sort = Vec::with_capacity(by.len());
            for (path, dir) in by {
                let asc = crate::query::expr::num_of(dir).is_some_and(|x| x.to_f64() > 0.0);
                sort.push((
                    Expr::Field(crate::query::expr::parse_field_path(path)?),
                    asc,
                ));
            }
            (
                AccOp::Top {
                    n: n(single)?,
                    sort,
                    bottom: matches!(op, "$bottom" | "$bottomN"),
                    single,
                },
                ex(need("output")?, scope)?,
            )
        }
        "$firstN" => (AccOp::FirstN(n(false)?), ex(need("input")?, scope)?),
        "$lastN" => (AccOp::LastN(n(false)?), ex(need("input")?, scope)?),
        "$maxN" | "$minN" => (
            AccOp::MinMaxN {
                n: n(false)?,
                max: op == "$maxN",
            },
            ex(need("input")?, scope)?,
        ),
        _ => {
            match need("method")? {
                Bson::String(m) if m == "approximate" => {}
                other => {
                    return Err(Error::bad_value(format!(
                        "{op}: 'method' must be 'approximate' (the one method of MongoDB 7.0), found {}",
                        crate::error::render(other)
                    )))
                }
            }
            let single = op == "$median";
            let ps = if single {
                vec![0.5]
            } else {
                crate::query::expr::percentiles_arg(&constant("p")?, op)?
            };
            (AccOp::Percentile { ps, single }, ex(need("input")?, scope)?)
        }
    })
}

fn check_array_size(op: &str, bytes: usize) -> Result<()> {
    if bytes > MAX_DOC_SIZE {
        tracing::debug!(
            op,
            bytes,
            "accumulator array exceeds the document size limit"
        );
        return Err(Error::DocumentTooLarge {
            size: bytes,
            limit: MAX_DOC_SIZE,
        });
    }
    Ok(())
}

fn merge_acc(mine: &mut Acc, other: Acc, op: &AccOp) -> Result<()> {
    match (mine, other) {
        (Acc::StdDev(n, mean, m2), Acc::StdDev(bn, bmean, bm2)) => {
            // Chan et al.'s pairwise combination.
            let total = *n + bn;
            if total > 0 {
                let d = bmean - *mean;
                let (na, nb) = (*n as f64, bn as f64);
                *mean += d * nb / total as f64;
                *m2 += bm2 + d * d * na * nb / total as f64;
                *n = total;
            }
        }
        (Acc::Best(a, an), Acc::Best(b, _)) => {
            if let AccOp::MinMaxN { n, max } = op {
                for v in b {
                    insert_best(a, an, v, *n, *max);
                }
            }
        }
        (Acc::Top(a, an), Acc::Top(b, _)) => {
            if let AccOp::Top {
                n, sort, bottom, ..
            } = op
            {
                let dirs: Vec<bool> = sort.iter().map(|(_, asc)| *asc != *bottom).collect();
                let mut tmp = Acc::Top(std::mem::take(a), *an);
                for (k, v) in b {
                    feed_top(&mut tmp, k, v, *n, &dirs)?;
                }
                if let Acc::Top(items, bytes) = tmp {
                    *a = items;
                    *an = bytes;
                }
            }
        }
        (Acc::Numbers(a), Acc::Numbers(b)) => a.extend(b),
        (Acc::Sum(a), Acc::Sum(b)) | (Acc::Avg(a), Acc::Avg(b)) => a.merge(&b),
        (Acc::Min(a), Acc::Min(b)) => {
            if let Some(b) = b {
                *a = pick(a.take(), b, Ordering::Less);
            }
        }
        (Acc::Max(a), Acc::Max(b)) => {
            if let Some(b) = b {
                *a = pick(a.take(), b, Ordering::Greater);
            }
        }
        (Acc::Push(a, an), Acc::Push(b, bn)) => {
            *an += bn;
            check_array_size("$push", *an)?;
            a.extend(b);
        }
        (Acc::AddToSet(a, an), Acc::AddToSet(b, _)) => {
            for key in b {
                add_to_set(a, an, key)?;
            }
        }
        (Acc::First(_), _)
        | (Acc::Last(_), _)
        | (Acc::Ordered(..), _)
        | (Acc::MergeObjects(..), _) => {
            return Err(Error::Internal(
                "order-dependent accumulators are not mergeable".into(),
            ))
        }
        _ => return Err(Error::Internal("mismatched accumulators".into())),
    }
    Ok(())
}

/// [`merge_acc`] where `later`'s input followed `mine`'s: the order-dependent
/// accumulators too (`$first` keeps the earlier, `$last` the later value,
/// `$firstN`/`$lastN` the first/last `n` of both in order, `$mergeObjects`
/// lets the later fields win, `$push` concatenates in order).
fn append_acc(mine: &mut Acc, later: Acc, op: &AccOp) -> Result<()> {
    match (mine, later) {
        (Acc::First(a), Acc::First(b)) => {
            if a.is_none() {
                *a = b;
            }
        }
        (Acc::Last(a), Acc::Last(b)) => {
            if b.is_some() {
                *a = b;
            }
        }
        (Acc::Ordered(a, an), Acc::Ordered(b, _)) => {
            let (n, first) = match op {
                AccOp::FirstN(n) => (*n, true),
                AccOp::LastN(n) => (*n, false),
                _ => return Err(Error::Internal("mismatched accumulators".into())),
            };
            a.extend(b);
            if a.len() > n {
                if first {
                    a.truncate(n);
                } else {
                    a.drain(..a.len() - n);
                }
            }
            *an = a.iter().map(approx_size).sum();
        }
        (Acc::MergeObjects(a, an), Acc::MergeObjects(b, bn)) => {
            for (k, v) in b {
                a.insert(k, v);
            }
            *an += bn;
            check_array_size("$mergeObjects", *an)?;
        }
        (mine, later) => merge_acc(mine, later, op)?,
    }
    Ok(())
}

/// Add one element to a `$addToSet` set (equal elements keep the canonical
/// representative); returns the bytes the set grew by.
fn add_to_set(set: &mut BTreeSet<OrdBson>, bytes: &mut usize, key: OrdBson) -> Result<usize> {
    if let Some(existing) = set.get(&key) {
        if tie_break(&key.0, &existing.0) == Ordering::Less {
            set.replace(key);
        }
        return Ok(0);
    }
    let n = approx_size(&key.0);
    *bytes += n;
    check_array_size("$addToSet", *bytes)?;
    set.insert(key);
    Ok(n)
}

/// The min (`want = Less`) or max of two values, ties broken canonically.
fn pick(a: Option<Bson>, b: Bson, want: Ordering) -> Option<Bson> {
    match a {
        None => Some(b),
        Some(a) => {
            let c = compare(&b, &a);
            if c == want || (c == Ordering::Equal && tie_break(&b, &a) == Ordering::Less) {
                Some(b)
            } else {
                Some(a)
            }
        }
    }
}

fn finish_acc(acc: Acc, op: &AccOp) -> Bson {
    match acc {
        Acc::MergeObjects(d, _) => Bson::Document(d),
        Acc::StdDev(n, _, m2) => {
            let samp = matches!(op, AccOp::StdDev { samp: true });
            let denom = if samp { n.saturating_sub(1) } else { n };
            if denom == 0 {
                Bson::Null
            } else {
                Bson::Double((m2 / denom as f64).sqrt())
            }
        }
        Acc::Top(items, _) => {
            let (single, bottom) = match op {
                AccOp::Top { single, bottom, .. } => (*single, *bottom),
                _ => (true, false),
            };
            // Kept best first (for bottom: last in the sort order first).
            let mut outs: Vec<Bson> = items.into_iter().map(|(_, v)| v).collect();
            if single {
                outs.into_iter().next().unwrap_or(Bson::Null)
            } else {
                if bottom {
                    // $bottomN answers in the sort's order.
                    outs.reverse();
                }
                Bson::Array(outs)
            }
        }
        Acc::Ordered(items, _) | Acc::Best(items, _) => Bson::Array(items),
        Acc::Numbers(mut xs) => {
            xs.sort_by(|a, b| a.total_cmp(b));
            let (ps, single) = match op {
                AccOp::Percentile { ps, single } => (ps.as_slice(), *single),
                _ => (&[][..], true),
            };
            let vals: Vec<Bson> = ps
                .iter()
                .map(|p| {
                    crate::query::expr::discrete_percentile(&xs, *p)
                        .map_or(Bson::Null, Bson::Double)
                })
                .collect();
            if single {
                vals.into_iter().next().unwrap_or(Bson::Null)
            } else {
                Bson::Array(vals)
            }
        }
        Acc::Sum(s) => s.sum(),
        Acc::Avg(s) => s.avg(),
        Acc::Min(v) | Acc::Max(v) | Acc::First(v) | Acc::Last(v) => v.unwrap_or(Bson::Null),
        Acc::Push(items, _) => Bson::Array(items),
        Acc::AddToSet(set, _) => Bson::Array(set.into_iter().map(|k| k.0).collect()),
    }
}

/// Approximate memory held by a value (for the `$group` / `$push` limits):
/// its BSON size plus per-node overhead, computed without serializing.
fn approx_size(v: &Bson) -> usize {
    let mut total = 0usize;
    let mut stack = vec![v];
    while let Some(v) = stack.pop() {
        total += 16;
        match v {
            Bson::String(s) | Bson::Symbol(s) | Bson::JavaScriptCode(s) => total += s.len(),
            Bson::Binary(b) => total += b.bytes.len(),
            Bson::Document(d) => {
                for (k, x) in d {
                    total += k.len() + 8;
                    stack.push(x);
                }
            }
            Bson::Array(a) => stack.extend(a.iter()),
            Bson::RegularExpression(r) => total += r.pattern.len() + r.options.len(),
            Bson::JavaScriptCodeWithScope(c) => {
                total += c.code.len();
                for (k, x) in &c.scope {
                    total += k.len() + 8;
                    stack.push(x);
                }
            }
            _ => {}
        }
    }
    total
}

#[cfg(test)]
mod tests {
    use bson::{bson, doc, Bson, Document};

    use crate::query::Pipeline;

    /// The manual's `gamescores`: players' scores in games G1 and G2.
    fn scores() -> Vec<Document> {
        vec![
            doc! {"playerId": "PlayerA", "gameId": "G1", "score": 31},
            doc! {"playerId": "PlayerB", "gameId": "G1", "score": 33},
            doc! {"playerId": "PlayerC", "gameId": "G1", "score": 99},
            doc! {"playerId": "PlayerD", "gameId": "G1", "score": 1},
            doc! {"playerId": "PlayerA", "gameId": "G2", "score": 10},
            doc! {"playerId": "PlayerB", "gameId": "G2", "score": 14},
            doc! {"playerId": "PlayerC", "gameId": "G2", "score": 66},
            doc! {"playerId": "PlayerD", "gameId": "G2", "score": 80},
        ]
    }

    fn group(spec: Document) -> Vec<Document> {
        let mut g = doc! {"_id": "$gameId"};
        g.extend(spec);
        Pipeline::parse(&[doc! {"$group": g}, doc! {"$sort": {"_id": 1}}])
            .expect("parse")
            .run_on(scores())
            .expect("run")
    }

    fn field(out: &[Document], name: &str) -> Vec<Bson> {
        out.iter()
            .map(|d| d.get(name).cloned().unwrap_or(Bson::Null))
            .collect()
    }

    #[test]
    fn top_bottom_and_n_accumulators() {
        let out = group(doc! {
            "top": {"$top": {"output": ["$playerId", "$score"], "sortBy": {"score": -1}}},
            "bottom": {"$bottom": {"output": ["$playerId", "$score"], "sortBy": {"score": -1}}},
            "top3": {"$topN": {"output": "$playerId", "sortBy": {"score": -1}, "n": 3}},
            "bottom2": {"$bottomN": {"output": "$score", "sortBy": {"score": -1}, "n": 2}},
            "max2": {"$maxN": {"input": "$score", "n": 2}},
            "min2": {"$minN": {"input": "$score", "n": 2}},
            "first2": {"$firstN": {"input": "$playerId", "n": 2}},
            "last1": {"$lastN": {"input": "$playerId", "n": 1}},
        });
        assert_eq!(
            field(&out, "top"),
            vec![bson!(["PlayerC", 99]), bson!(["PlayerD", 80])]
        );
        assert_eq!(
            field(&out, "bottom"),
            vec![bson!(["PlayerD", 1]), bson!(["PlayerA", 10])]
        );
        assert_eq!(
            field(&out, "top3"),
            vec![
                bson!(["PlayerC", "PlayerB", "PlayerA"]),
                bson!(["PlayerD", "PlayerC", "PlayerB"])
            ]
        );
        assert_eq!(
            field(&out, "bottom2"),
            vec![bson!([31, 1]), bson!([14, 10])]
        );
        assert_eq!(field(&out, "max2"), vec![bson!([99, 33]), bson!([80, 66])]);
        assert_eq!(field(&out, "min2"), vec![bson!([1, 31]), bson!([10, 14])]);
        assert_eq!(
            field(&out, "first2"),
            vec![bson!(["PlayerA", "PlayerB"]), bson!(["PlayerA", "PlayerB"])]
        );
        assert_eq!(
            field(&out, "last1"),
            vec![bson!(["PlayerD"]), bson!(["PlayerD"])]
        );
    }

    #[test]
    fn statistics_and_merge_objects() {
        let out = group(doc! {
            "sd": {"$stdDevPop": "$score"},
            "sds": {"$stdDevSamp": "$score"},
            "med": {"$median": {"input": "$score", "method": "approximate"}},
            "pct": {"$percentile": {"input": "$score", "p": [0.25, 1], "method": "approximate"}},
            "m": {"$mergeObjects": {"$arrayToObject": [[["$playerId", "$score"]]]}},
        });
        let g1 = [31.0f64, 33.0, 99.0, 1.0];
        let mean = g1.iter().sum::<f64>() / 4.0;
        let var = g1.iter().map(|x| (x - mean) * (x - mean)).sum::<f64>();
        let Some(Bson::Double(sd)) = out[0].get("sd") else {
            panic!("sd")
        };
        assert!((sd - (var / 4.0).sqrt()).abs() < 1e-9);
        let Some(Bson::Double(sds)) = out[0].get("sds") else {
            panic!("sds")
        };
        assert!((sds - (var / 3.0).sqrt()).abs() < 1e-9);
        assert_eq!(field(&out, "med"), vec![bson!(31.0), bson!(14.0)]);
        assert_eq!(
            field(&out, "pct"),
            vec![bson!([1.0, 99.0]), bson!([10.0, 80.0])]
        );
        assert_eq!(
            out[0].get_document("m").expect("m"),
            &doc! {"PlayerA": 31, "PlayerB": 33, "PlayerC": 99, "PlayerD": 1}
        );
        let err =
            Pipeline::parse(&[doc! {"$group": {"_id": null, "m": {"$mergeObjects": "$score"}}}])
                .expect("parse")
                .run_on(scores())
                .expect_err("not an object");
        assert_eq!(err.code(), 40400);
        let bad_n = Pipeline::parse(&[
            doc! {"$group": {"_id": null, "t": {"$topN": {"n": 0, "sortBy": {"a": 1}, "output": "$a"}}}},
        ]);
        assert_eq!(bad_n.expect_err("n").code(), 5787908);
    }

    #[test]
    fn decimal_sums_are_exact() {
        let docs: Vec<Document> = (0..10)
            .map(|_| doc! {"v": Bson::Decimal128("0.1".parse().expect("dec"))})
            .chain([doc! {"v": 1}])
            .collect();
        let out = Pipeline::parse(&[
            doc! {"$group": {"_id": null, "s": {"$sum": "$v"}, "a": {"$avg": "$v"}}},
        ])
        .expect("parse")
        .run_on(docs)
        .expect("run");
        assert_eq!(
            out[0].get("s"),
            Some(&Bson::Decimal128("2.0".parse().expect("dec")))
        );
        let Some(Bson::Decimal128(a)) = out[0].get("a") else {
            panic!("avg")
        };
        assert!(
            a.to_string()
                .starts_with("0.18181818181818181818181818181818"),
            "{a}"
        );
    }
}
