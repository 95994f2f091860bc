//! `$group`: the group key, the accumulators and the group state, with the
//! merge that makes a `$group` computable on a parallel scan.
//!
//! Owns: [`Group`] (parsed `$group`), [`GroupState`] (keys → accumulator
//! states, with its memory count), the accumulators `$sum $avg $min $max $first
//! $last $push $addToSet $count`, [`canonical_cmp`] and the memory estimate of a
//! value ([`approx_size`]).
//!
//! Invariants:
//! - Every accumulator but `$first`/`$last` is mergeable: merging two states
//!   gives what feeding both inputs into one would (up to `$push` order);
//!   [`Group::is_mergeable`] says whether a `$group` may close a commutative part.
//! - Keys, set elements and min/max equal under `compare` but not identical
//!   keep the representative [`canonical_cmp`] picks, not the first to arrive.
//! - Integer sums are exact (i128); the widest input type decides the result type.
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
use crate::query::expr::{compare, Expr, Root, Value};

#[derive(Debug, Clone)]
pub(super) struct Group {
    id: Expr,
    fields: Vec<(String, AccOp, Expr)>,
    pub(super) memory_limit: usize,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum AccOp {
    Sum,
    Avg,
    Min,
    Max,
    First,
    Last,
    Push,
    AddToSet,
}

/// One group's accumulator state.
#[derive(Debug, Clone)]
enum Acc {
    Sum(SumState),
    Avg(SumState),
    Min(Option<Bson>),
    Max(Option<Bson>),
    /// `None` until the first document; then its value (missing → null).
    First(Option<Bson>),
    Last(Option<Bson>),
    Push(Vec<Bson>, usize),
    AddToSet(BTreeSet<OrdBson>, usize),
}

/// An exact running sum: integers in i128 (cannot overflow for < 2^64 inputs),
/// doubles separately; the widest input type decides the result type.
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct SumState {
    int: i128,
    dbl: f64,
    /// 0 = int32, 1 = int64, 2 = double.
    widest: u8,
    count: u64,
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
            Bson::Decimal128(_) => {
                return Err(Error::bad_value(
                    "$sum/$avg: decimal128 arithmetic is not supported by duetdb",
                ))
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
        self.widest = self.widest.max(o.widest);
        self.count += o.count;
    }

    pub(super) fn sum(&self) -> Bson {
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
        Bson::Double((self.int as f64 + self.dbl) / self.count as f64)
    }
}

/// A value ordered by MongoDB's comparison (equal values are one key).
/// Documents and arrays carry their raw form, encoded once, because comparing
/// owned documents would re-encode both sides at every comparison.
#[derive(Debug, Clone)]
struct OrdBson(Bson, Option<RawBson>);

impl OrdBson {
    fn new(v: Bson) -> OrdBson {
        let raw = match &v {
            Bson::Document(_) | Bson::Array(_) => crate::doc::value::to_raw(&v),
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
fn tie_break(a: &Bson, b: &Bson) -> Ordering {
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
}

/// Rough fixed cost of a group entry beyond its key and values.
const GROUP_ENTRY_OVERHEAD: usize = 64;

impl Group {
    pub(super) fn parse(spec: &Document) -> Result<Group> {
        let id = spec
            .get("_id")
            .ok_or_else(|| Error::bad_value("a group specification must include an _id"))?;
        let id = Expr::parse(id)?;
        let mut fields = Vec::new();
        for (k, v) in spec.iter().filter(|(k, _)| k.as_str() != "_id") {
            if k.starts_with('$') {
                return Err(Error::bad_value(format!(
                    "The field name '{k}' cannot be an operator name"
                )));
            }
            if k.contains('.') {
                return Err(Error::bad_value(format!(
                    "the group aggregate field name '{k}' cannot be used because $group's field names cannot contain '.'"
                )));
            }
            let Bson::Document(acc) = v else {
                return Err(Error::bad_value(format!(
                    "the group aggregate field '{k}' must be defined as an expression inside an object"
                )));
            };
            if acc.len() != 1 {
                return Err(Error::bad_value(format!(
                    "the computed aggregate '{k}' must specify exactly one operator"
                )));
            }
            let Some((op, arg)) = acc.iter().next() else {
                return Err(Error::Internal("empty accumulator".into()));
            };
            let (op, arg) = match op.as_str() {
                "$sum" => (AccOp::Sum, Expr::parse(arg)?),
                "$avg" => (AccOp::Avg, Expr::parse(arg)?),
                "$min" => (AccOp::Min, Expr::parse(arg)?),
                "$max" => (AccOp::Max, Expr::parse(arg)?),
                "$first" => (AccOp::First, Expr::parse(arg)?),
                "$last" => (AccOp::Last, Expr::parse(arg)?),
                "$push" => (AccOp::Push, Expr::parse(arg)?),
                "$addToSet" => (AccOp::AddToSet, Expr::parse(arg)?),
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
                other => {
                    return Err(Error::bad_value(format!(
                        "unknown group operator '{other}'"
                    )))
                }
            };
            fields.push((k.clone(), op, arg));
        }
        Ok(Group {
            id,
            fields,
            memory_limit: GROUP_MEMORY_LIMIT,
        })
    }

    /// All accumulators mergeable (no `$first`/`$last`, which depend on order).
    pub(super) fn is_mergeable(&self) -> bool {
        self.fields
            .iter()
            .all(|(_, op, _)| !matches!(op, AccOp::First | AccOp::Last))
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
            })
            .collect()
    }

    pub(super) fn accumulate(&self, gs: &mut GroupState, root: Root<'_>) -> Result<()> {
        let key = OrdBson::new(self.id.eval(&root)?.unwrap_or(Bson::Null));
        replace_key_if_smaller(&mut gs.groups, &key);
        let accs = match gs.groups.entry(key) {
            Entry::Occupied(o) => o.into_mut(),
            Entry::Vacant(v) => {
                gs.bytes +=
                    approx_size(&v.key().0) + GROUP_ENTRY_OVERHEAD * (1 + self.fields.len());
                v.insert(self.new_accs())
            }
        };
        for ((_, _, arg), acc) in self.fields.iter().zip(accs.iter_mut()) {
            let v = arg.eval(&root)?;
            gs.bytes += feed_acc(acc, v)?;
        }
        self.check_memory(gs.bytes)
    }

    fn check_memory(&self, bytes: usize) -> Result<()> {
        if bytes > self.memory_limit {
            return Err(Error::ExceededMemoryLimit(format!(
                "Exceeded memory limit for $group ({} bytes of group state, the limit is {} bytes); $group does not spill to disk in duetdb, whatever allowDiskUse says",
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
                    for (m, o) in mine.iter_mut().zip(accs) {
                        merge_acc(m, o)?;
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
        self.check_memory(big.bytes)?;
        Ok(big)
    }

    pub(super) fn finish(&self, gs: GroupState) -> Result<Vec<Document>> {
        let mut out = Vec::with_capacity(gs.groups.len());
        for (key, accs) in gs.groups {
            let mut d = Document::new();
            d.insert("_id", key.0);
            for ((name, _, _), acc) in self.fields.iter().zip(accs) {
                d.insert(name.clone(), finish_acc(acc));
            }
            // Each array is within 16 MiB, but several together may not be.
            check_document("$group", &d)?;
            out.push(d);
        }
        Ok(out)
    }
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

/// Feed one value; returns the bytes the state grew by.
fn feed_acc(acc: &mut Acc, v: Value) -> Result<usize> {
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
            add_to_set(set, bytes, OrdBson::new(v))
        }
    }
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

fn merge_acc(mine: &mut Acc, other: Acc) -> Result<()> {
    match (mine, other) {
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
        (Acc::First(_), _) | (Acc::Last(_), _) => {
            return Err(Error::Internal("$first/$last are not mergeable".into()))
        }
        _ => return Err(Error::Internal("mismatched accumulators".into())),
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

fn finish_acc(acc: Acc) -> Bson {
    match acc {
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
