//! Query planning and execution over one collection version.
//!
//! The planner picks, per query, one access path: a collection scan, `_id`
//! lookups/ranges, or a scan of one secondary index over intervals derived from
//! the filter's index-answerable predicates ([`Sarg`]s). Execution always
//! re-checks every fetched document against the whole filter, so intervals only
//! need to be a superset of the matches — that is what keeps the index answer
//! equal to the collection-scan answer, which property tests check.
//!
//! Rules that keep intervals sound:
//! - comparisons are type-bracketed (`$gt: 5` only reaches numbers), so a
//!   one-sided range is closed at the edge of its type's rank;
//! - on a multikey index a two-sided range keeps only its lower side (one array
//!   element may satisfy `$gt` and another `$lt`);
//! - `{a: null}` also matches missing fields and `undefined`: interval [undefined, null];
//! - a multikey index or overlapping intervals can yield a record twice: deduplicated;
//! - a partial index is used only when the query implies its filter, a sparse
//!   one only when every match has one of its fields (`query::partial`): an
//!   index that lacks some matches is never chosen (hinting a sparse one is
//!   allowed, as MongoDB);
//! - a hashed field is looked up by the hashes of equality and `$in` values
//!   only, and never yields sort order;
//! - a wildcard index is scanned for one path with a scalar equality, `$in`
//!   or range (not null, documents or arrays), as a multikey index;
//! - a 2dsphere index is scanned only for a geo operator on its geo field
//!   (after equalities on the fields before it), over the key ranges of the
//!   operator's region ([`crate::query::geo::GeoQuery::ranges`]), deduplicated,
//!   never in sort order; a `$near` must have one (291 otherwise), and its
//!   distance order is a sort ([`SortSpec::near`]), never an index order.

use std::collections::HashSet;
use std::ops::{Bound, ControlFlow};
use std::sync::Arc;

use bson::spec::BinarySubtype;
use bson::{doc, Bson, Document, RawBson};

use crate::doc::collation;
use crate::doc::value;
use crate::doc::DocRef;
use crate::error::{CancelToken, Error, Result};
use crate::query::geo::GeoQuery;
use crate::query::limits::PAGE_DOCS;
use crate::query::{Filter, Sarg, SortSpec};
use crate::store::collection::{CollectionState, ID_INDEX_NAME};
use crate::store::heap::RecordId;
use crate::store::index::{IndexKey, IndexKind, IndexSpec, IndexState, KeyPart, ValueKey};
use crate::store::wildcard::{Coverage, WildcardSpec};

/// How the client constrained the plan.
#[derive(Debug, Clone, PartialEq)]
pub enum Hint {
    /// `{$natural: 1|-1}`: collection scan.
    Natural { reverse: bool },
    /// An index by name.
    Name(String),
    /// An index by key pattern.
    Keys(Document),
}

impl Hint {
    /// Parse MongoDB's `hint` field (a name string or a key-pattern document).
    pub fn from_bson(b: &Bson) -> Result<Hint> {
        match b {
            Bson::String(s) => Ok(Hint::Name(s.clone())),
            Bson::Document(d) => match d.get("$natural") {
                Some(v) => Ok(Hint::Natural {
                    reverse: matches!(v, Bson::Int32(-1) | Bson::Int64(-1))
                        || matches!(v, Bson::Double(x) if *x == -1.0),
                }),
                None => Ok(Hint::Keys(d.clone())),
            },
            other => Err(Error::bad_value(format!(
                "hint must be a string or a document, not {other}"
            ))),
        }
    }
}

type ValueBound = Bound<RawBson>;
type EntryKey = (IndexKey, RecordId);

/// The chosen access path.
#[derive(Debug, Clone)]
pub enum Access {
    CollScan {
        reverse: bool,
    },
    IdPoints {
        ids: Vec<RawBson>,
    },
    IdRange {
        lower: Bound<ValueKey>,
        upper: Bound<ValueKey>,
        reverse: bool,
    },
    IndexScan {
        index: String,
        intervals: Vec<(Bound<EntryKey>, Bound<EntryKey>)>,
        reverse: bool,
        dedup: bool,
        /// `indexBounds` for `explain` (field → interval strings).
        bounds: Document,
        /// The index's other explain fields (`keyPattern`, `isMultiKey`, …).
        facts: Document,
    },
}

/// A plan: the access path and whether it already yields documents in sort order.
#[derive(Debug, Clone)]
pub struct Plan {
    pub access: Access,
    pub provides_sort: bool,
}

impl Plan {
    /// The access path as the leaf stages of MongoDB's `winningPlan`:
    /// `COLLSCAN`, `IDHACK`, or `FETCH` over an `IXSCAN` with MongoDB's
    /// fields (`keyPattern`, `indexName`, `isMultiKey`, `isUnique`,
    /// `isSparse`, `isPartial`, `indexVersion`, `direction`, `indexBounds`
    /// as interval strings like `"[1, 5)"`). `blockingSortIfRequested: true`
    /// marks a plan that does not yield the sort order (a caller adds the
    /// `SORT` stage and removes the mark).
    pub fn explain(&self) -> Document {
        let dir = |reverse: bool| if reverse { "backward" } else { "forward" };
        let mut stage = match &self.access {
            Access::CollScan { reverse } => doc! {
                "stage": "COLLSCAN",
                "direction": dir(*reverse),
            },
            Access::IdPoints { .. } => doc! {"stage": "IDHACK"},
            Access::IdRange {
                lower,
                upper,
                reverse,
            } => {
                let lo = lower.as_ref().map(ValueKey::to_raw);
                let hi = upper.as_ref().map(ValueKey::to_raw);
                doc! {
                    "stage": "FETCH",
                    "inputStage": {
                        "stage": "IXSCAN",
                        "keyPattern": {"_id": 1},
                        "indexName": ID_INDEX_NAME,
                        "isMultiKey": false,
                        "isUnique": true,
                        "isSparse": false,
                        "isPartial": false,
                        "indexVersion": 2,
                        "direction": dir(*reverse),
                        "indexBounds": {"_id": [interval(lo.as_ref(), hi.as_ref())]},
                    },
                }
            }
            Access::IndexScan {
                index,
                reverse,
                bounds,
                facts,
                ..
            } => {
                let mut ix = doc! {"stage": "IXSCAN"};
                ix.insert(
                    "keyPattern",
                    facts.get("keyPattern").cloned().unwrap_or(Bson::Null),
                );
                ix.insert("indexName", index.clone());
                for (k, v) in facts {
                    if k != "keyPattern" {
                        ix.insert(k.clone(), v.clone());
                    }
                }
                ix.insert("indexVersion", 2);
                ix.insert("direction", dir(*reverse));
                ix.insert("indexBounds", bounds.clone());
                doc! {"stage": "FETCH", "inputStage": ix}
            }
        };
        if !self.provides_sort {
            stage.insert("blockingSortIfRequested", true);
        }
        stage
    }

    /// Stage name summary: `COLLSCAN`, `IDHACK` or `IXSCAN <name>`.
    pub fn summary(&self) -> String {
        match &self.access {
            Access::CollScan { .. } => "COLLSCAN".into(),
            Access::IdPoints { .. } => "IDHACK".into(),
            Access::IdRange { .. } => format!("IXSCAN {ID_INDEX_NAME}"),
            Access::IndexScan { index, .. } => format!("IXSCAN {index}"),
        }
    }
}

/// The `_id` index entries between `lower` and `upper`, in index order or
/// reversed (one place for `execute` and the resumable `walk`).
pub(crate) fn id_range<'c>(
    coll: &'c CollectionState,
    lower: Bound<&ValueKey>,
    upper: Bound<&ValueKey>,
    reverse: bool,
) -> Box<dyn Iterator<Item = (&'c ValueKey, &'c RecordId)> + 'c> {
    let range = coll.id_index.range(lower, upper);
    if reverse {
        Box::new(range.rev())
    } else {
        Box::new(range)
    }
}

/// The lowest value of each canonical rank that has one (see [`value::canonical_rank`]).
fn rank_floor(rank: u8) -> Option<RawBson> {
    Some(match rank {
        0 => RawBson::MinKey,
        1 => RawBson::Undefined,
        2 => RawBson::Null,
        3 => RawBson::Double(f64::NAN),
        4 => RawBson::String(String::new()),
        5 => RawBson::Document(bson::RawDocumentBuf::new()),
        6 => RawBson::Array(bson::RawArrayBuf::new()),
        7 => RawBson::Binary(bson::Binary {
            subtype: BinarySubtype::Generic,
            bytes: vec![],
        }),
        8 => RawBson::ObjectId(bson::oid::ObjectId::from_bytes([0; 12])),
        9 => RawBson::Boolean(false),
        10 => RawBson::DateTime(bson::DateTime::from_millis(i64::MIN)),
        11 => RawBson::Timestamp(bson::Timestamp {
            time: 0,
            increment: 0,
        }),
        16 => RawBson::MaxKey,
        _ => return None,
    })
}

fn rank(v: &RawBson) -> u8 {
    value::canonical_rank(v.as_raw_bson_ref())
}

/// Value-order intervals that contain every value satisfying `sarg`.
fn value_intervals(sarg: &Sarg, multikey: bool) -> Vec<(ValueBound, ValueBound)> {
    match sarg {
        Sarg::Eq(v) => vec![eq_interval(v)],
        Sarg::In(vs) => {
            let mut vs: Vec<&RawBson> = vs.iter().collect();
            vs.sort_by(|a, b| value::compare(a.as_raw_bson_ref(), b.as_raw_bson_ref()));
            vs.dedup_by(|a, b| value::equal(a.as_raw_bson_ref(), b.as_raw_bson_ref()));
            // null's interval [undefined, null] may overlap an explicit undefined; harmless (dedup).
            vs.into_iter().map(eq_interval).collect()
        }
        Sarg::Range { lower, upper } => {
            let (mut lower, mut upper) = (lower.clone(), upper.clone());
            // `$gte: null` also matches missing (indexed as null) and undefined.
            if matches!(lower, Bound::Included(RawBson::Null)) {
                lower = Bound::Included(RawBson::Undefined);
            }
            if multikey && !matches!(lower, Bound::Unbounded) {
                upper = Bound::Unbounded;
            }
            let bracket_rank = match (&lower, &upper) {
                (Bound::Included(v) | Bound::Excluded(v), _) => Some(rank(v)),
                (_, Bound::Included(v) | Bound::Excluded(v)) => Some(rank(v)),
                _ => None,
            };
            if let Some(r) = bracket_rank.filter(|r| (3..=11).contains(r)) {
                if matches!(upper, Bound::Unbounded) {
                    upper = rank_floor(r + 1).map_or(Bound::Unbounded, Bound::Excluded);
                }
                if matches!(lower, Bound::Unbounded) {
                    lower = rank_floor(r).map_or(Bound::Unbounded, Bound::Included);
                }
            }
            vec![(lower, upper)]
        }
    }
}

fn eq_interval(v: &RawBson) -> (ValueBound, ValueBound) {
    if matches!(v, RawBson::Null) {
        (
            Bound::Included(RawBson::Undefined),
            Bound::Included(RawBson::Null),
        )
    } else {
        (Bound::Included(v.clone()), Bound::Included(v.clone()))
    }
}

/// Turn a value-order interval on field `k` (after an equality prefix) into
/// entry-key bounds in the index's key order.
fn key_interval(
    spec: &IndexSpec,
    prefix: &[KeyPart],
    (lower, upper): (ValueBound, ValueBound),
    asc: bool,
) -> (Bound<EntryKey>, Bound<EntryKey>) {
    // In key order a descending field swaps the roles of the value bounds.
    let (key_lower, key_upper) = if asc { (lower, upper) } else { (upper, lower) };
    let build = |v: RawBson, fill: KeyPart, rid: RecordId| {
        let mut parts = prefix.to_vec();
        parts.push(KeyPart::Val(v));
        (spec.bound_key(parts, fill), rid)
    };
    let whole = |fill: KeyPart, rid: RecordId| (spec.bound_key(prefix.to_vec(), fill), rid);
    let lo = match key_lower {
        Bound::Included(v) => Bound::Included(build(v, KeyPart::Low, RecordId::MIN)),
        Bound::Excluded(v) => Bound::Excluded(build(v, KeyPart::High, RecordId::MAX)),
        Bound::Unbounded if prefix.is_empty() => Bound::Unbounded,
        Bound::Unbounded => Bound::Included(whole(KeyPart::Low, RecordId::MIN)),
    };
    let hi = match key_upper {
        Bound::Included(v) => Bound::Included(build(v, KeyPart::High, RecordId::MAX)),
        Bound::Excluded(v) => Bound::Excluded(build(v, KeyPart::Low, RecordId::MIN)),
        Bound::Unbounded if prefix.is_empty() => Bound::Unbounded,
        Bound::Unbounded => Bound::Included(whole(KeyPart::High, RecordId::MAX)),
    };
    (lo, hi)
}

/// An index interval as MongoDB prints it in `indexBounds`: `[1, 1]`,
/// `(5, inf.0]`, `[MinKey, MaxKey]` (an unbounded side is MinKey/MaxKey,
/// inclusive).
fn interval(lo: Bound<&RawBson>, hi: Bound<&RawBson>) -> Bson {
    let side = |b: Bound<&RawBson>, unbounded: &str| -> (bool, String) {
        match b {
            Bound::Included(v) => (true, bound_value(v)),
            Bound::Excluded(v) => (false, bound_value(v)),
            Bound::Unbounded => (true, unbounded.to_string()),
        }
    };
    let (li, l) = side(lo, "MinKey");
    let (hi_inc, h) = side(hi, "MaxKey");
    Bson::String(format!(
        "{}{l}, {h}{}",
        if li { '[' } else { '(' },
        if hi_inc { ']' } else { ')' }
    ))
}

fn bound_value(v: &RawBson) -> String {
    match Bson::try_from(v.clone()) {
        Ok(Bson::MinKey) => "MinKey".into(),
        Ok(Bson::MaxKey) => "MaxKey".into(),
        Ok(b) => crate::error::render_shell(&b),
        Err(_) => "?".into(),
    }
}

fn render_interval((l, u): &(ValueBound, ValueBound)) -> Bson {
    interval(l.as_ref(), u.as_ref())
}

/// What explain says of an index besides its bounds (MongoDB's IXSCAN fields).
fn index_facts(index: &IndexState) -> Document {
    let spec = &index.spec;
    doc! {
        "keyPattern": spec.key_pattern(),
        "isMultiKey": index.multikey,
        "isUnique": spec.unique,
        "isSparse": spec.sparse,
        "isPartial": spec.partial.is_some(),
    }
}

/// A candidate plan for one secondary index.
struct IndexCandidate {
    access: Access,
    score: u32,
    provides_sort: bool,
}

/// A sarg on a hashed field, in hash space: equality and `$in` become the
/// hashes of their values (null also matches missing and undefined, whose
/// keys are the hashes of null and undefined); ranges cannot use the hash.
fn hashed_sarg(sarg: &Sarg) -> Option<Sarg> {
    let hashes = |v: &RawBson| -> Vec<RawBson> {
        let h = |v: &RawBson| RawBson::Int64(crate::store::hashed::hash64(v.as_raw_bson_ref()));
        if matches!(v, RawBson::Null) {
            vec![h(&RawBson::Null), h(&RawBson::Undefined)]
        } else {
            vec![h(v)]
        }
    };
    match sarg {
        Sarg::Eq(v) if !matches!(v, RawBson::Null) => hashes(v).pop().map(Sarg::Eq),
        Sarg::Eq(v) => Some(Sarg::In(hashes(v))),
        Sarg::In(vs) => Some(Sarg::In(vs.iter().flat_map(hashes).collect())),
        Sarg::Range { .. } => None,
    }
}

fn plan_index(
    index: &IndexState,
    sargs: &[(String, Sarg)],
    sort: Option<&SortSpec>,
) -> IndexCandidate {
    let spec = &index.spec;
    let hashed_pos = match spec.kind {
        IndexKind::Hashed { pos } => Some(pos),
        _ => None,
    };
    let field_sargs: Vec<Option<Sarg>> = spec
        .fields
        .iter()
        .enumerate()
        .map(|(i, (path, _))| {
            let s = sargs.iter().find(|(p, _)| p == path).map(|(_, s)| s)?;
            if hashed_pos == Some(i) {
                hashed_sarg(s)
            } else {
                Some(s.clone())
            }
        })
        .collect();
    let mut prefix: Vec<KeyPart> = Vec::new();
    let mut bounds = Document::new();
    let mut k = 0;
    while k < spec.fields.len() {
        match field_sargs[k].as_ref() {
            Some(Sarg::Eq(v)) if !matches!(v, RawBson::Null) => {
                prefix.push(KeyPart::Val(v.clone()));
                bounds.insert(
                    spec.fields[k].0.clone(),
                    vec![interval(Bound::Included(v), Bound::Included(v))],
                );
                k += 1;
            }
            _ => break,
        }
    }
    let eq_len = k;
    let mut score = 4 * eq_len as u32;
    let intervals = if k < spec.fields.len() {
        let (path, asc) = &spec.fields[k];
        match field_sargs[k].as_ref() {
            Some(sarg) => {
                let mut vi = value_intervals(sarg, index.multikey);
                score += if matches!(sarg, Sarg::Range { .. }) {
                    1
                } else {
                    2
                };
                bounds.insert(
                    path.clone(),
                    vi.iter().map(render_interval).collect::<Vec<_>>(),
                );
                if !asc {
                    vi.reverse();
                }
                vi.into_iter()
                    .map(|iv| key_interval(spec, &prefix, iv, *asc))
                    .collect()
            }
            None => vec![key_interval(
                spec,
                &prefix,
                (Bound::Unbounded, Bound::Unbounded),
                true,
            )],
        }
    } else {
        vec![key_interval(
            spec,
            &prefix,
            (Bound::Unbounded, Bound::Unbounded),
            true,
        )]
    };
    if spec.unique && eq_len == spec.fields.len() {
        score += 8;
    }
    // Fields the query does not constrain are scanned whole.
    for (path, _) in &spec.fields {
        if !bounds.contains_key(path) {
            bounds.insert(path.clone(), vec![Bson::String("[MinKey, MaxKey]".into())]);
        }
    }
    // The index yields sort order when the sort keys continue its equality prefix,
    // all in its direction or all against it, and no document is in it twice.
    let mut reverse = false;
    let mut provides_sort = false;
    if let Some(sort) = sort.filter(|s| !s.keys.is_empty()) {
        let past_hash = hashed_pos.is_some_and(|h| h < eq_len + sort.keys.len());
        if !index.multikey
            && !past_hash
            && eq_len + sort.keys.len() <= spec.fields.len()
            && intervals.len() == 1
        {
            let fields = &spec.fields[eq_len..eq_len + sort.keys.len()];
            let same = fields
                .iter()
                .zip(&sort.keys)
                .all(|((p, a), (q, b))| p == q && a == b);
            let flipped = fields
                .iter()
                .zip(&sort.keys)
                .all(|((p, a), (q, b))| p == q && a != b);
            if same || flipped {
                provides_sort = true;
                reverse = flipped;
            }
        }
    }
    IndexCandidate {
        access: Access::IndexScan {
            index: spec.name.clone(),
            dedup: index.multikey || intervals.len() > 1,
            intervals,
            reverse,
            bounds,
            facts: index_facts(index),
        },
        score,
        provides_sort,
    }
}

/// Is `v` a value a wildcard index can look up: a scalar whose matches are
/// all keys of the path (not null, which matches missing paths; not a
/// document or array, whose matches are not leaves; not MinKey/MaxKey).
fn wildcard_value(v: &RawBson) -> bool {
    let r = rank(v);
    (3..=15).contains(&r) && r != 5 && r != 6
}

/// The best single-path scan of a wildcard index, if a sarg allows one.
fn plan_wildcard(
    index: &IndexState,
    w: &WildcardSpec,
    sargs: &[(String, Sarg)],
) -> Option<IndexCandidate> {
    let mut best: Option<IndexCandidate> = None;
    for (path, sarg) in sargs {
        if w.coverage(path) != Coverage::All
            || path
                .split('.')
                .any(|p| crate::doc::path::numeric_component(p).is_some())
        {
            continue;
        }
        let (usable, score) = match sarg {
            Sarg::Eq(v) => (wildcard_value(v), 4),
            Sarg::In(vs) => (!vs.is_empty() && vs.iter().all(wildcard_value), 2),
            Sarg::Range { lower, upper } => {
                let ok = |b: &ValueBound| match b {
                    Bound::Included(v) | Bound::Excluded(v) => wildcard_value(v),
                    Bound::Unbounded => true,
                };
                (
                    ok(lower)
                        && ok(upper)
                        && !matches!((lower, upper), (Bound::Unbounded, Bound::Unbounded)),
                    1,
                )
            }
        };
        if !usable || best.as_ref().is_some_and(|b| b.score >= score) {
            continue;
        }
        let prefix = vec![KeyPart::Val(RawBson::String(path.clone()))];
        // Every path may hold arrays: ranges stay one-sided, results deduplicated.
        let vi = value_intervals(sarg, true);
        let mut bounds = Document::new();
        bounds.insert(
            "$_path",
            vec![Bson::String(format!("[\"{path}\", \"{path}\"]"))],
        );
        bounds.insert(
            path.clone(),
            vi.iter().map(render_interval).collect::<Vec<_>>(),
        );
        let intervals = vi
            .into_iter()
            .map(|iv| key_interval(&index.spec, &prefix, iv, true))
            .collect();
        best = Some(IndexCandidate {
            access: Access::IndexScan {
                index: index.spec.name.clone(),
                intervals,
                reverse: false,
                dedup: true,
                bounds,
                facts: index_facts(index),
            },
            score,
            provides_sort: false,
        });
    }
    best
}

/// May `index` answer a query with these sargs at all? A partial index only
/// when the query implies its filter, a sparse one only when every match has
/// one of its fields (MongoDB's rules: otherwise matches would be missed).
fn index_usable(index: &IndexState, sargs: &[(String, Sarg)]) -> bool {
    let spec = &index.spec;
    if let Some(p) = &spec.partial {
        if !crate::query::partial::implies(sargs, &p.expr) {
            return false;
        }
    }
    if spec.sparse {
        let paths: Vec<&str> = spec.fields.iter().map(|(p, _)| p.as_str()).collect();
        if !crate::query::partial::implies_exists_any(sargs, &paths) {
            return false;
        }
    }
    true
}

/// A scan of a 2dsphere index for a geo operator on its geo field (field
/// `pos`), after equalities on the fields before it.
fn plan_geo(
    index: &IndexState,
    pos: usize,
    sargs: &[(String, Sarg)],
    geo: &[(String, Arc<GeoQuery>)],
) -> Option<IndexCandidate> {
    let spec = &index.spec;
    let geo_path = &spec.fields[pos].0;
    let mut on_path = geo.iter().filter(|(p, _)| p == geo_path).map(|(_, g)| g);
    // Any bounded operator's ranges hold every match; else a `$near`
    // without a maximum scans every key of the field.
    let ranges = match on_path.clone().find_map(|g| g.ranges()) {
        Some(r) => r,
        None if on_path.any(|g| g.as_near().is_some_and(|n| !n.planar)) => vec![(0, u64::MAX)],
        None => return None,
    };
    let mut prefix = Vec::with_capacity(pos);
    let mut bounds = Document::new();
    for (path, _) in &spec.fields[..pos] {
        match sargs.iter().find(|(p, _)| p == path).map(|(_, s)| s) {
            Some(Sarg::Eq(v)) if !matches!(v, RawBson::Null) => {
                prefix.push(KeyPart::Val(v.clone()));
                bounds.insert(
                    path.clone(),
                    vec![interval(Bound::Included(v), Bound::Included(v))],
                );
            }
            _ => return None,
        }
    }
    let mut rendered = Vec::with_capacity(ranges.len());
    let intervals = ranges
        .iter()
        .map(|&(lo, hi)| {
            let (l, h) = (
                crate::store::geo::cell_key(lo),
                crate::store::geo::cell_key(hi),
            );
            rendered.push(interval(Bound::Included(&l), Bound::Included(&h)));
            let mut lo_parts = prefix.clone();
            lo_parts.push(KeyPart::Val(l));
            let mut hi_parts = prefix.clone();
            hi_parts.push(KeyPart::Val(h));
            (
                Bound::Included((spec.bound_key(lo_parts, KeyPart::Low), RecordId::MIN)),
                Bound::Included((spec.bound_key(hi_parts, KeyPart::High), RecordId::MAX)),
            )
        })
        .collect();
    bounds.insert(geo_path.clone(), rendered);
    for (path, _) in &spec.fields {
        if !bounds.contains_key(path) {
            bounds.insert(path.clone(), vec![Bson::String("[MinKey, MaxKey]".into())]);
        }
    }
    Some(IndexCandidate {
        access: Access::IndexScan {
            index: spec.name.clone(),
            intervals,
            reverse: false,
            dedup: true,
            bounds,
            facts: index_facts(index),
        },
        score: 3 + 4 * pos as u32,
        provides_sort: false,
    })
}

/// MongoDB's error for a `$near` no 2dsphere index can answer.
fn no_near_index() -> Error {
    Error::Coded {
        code: 291,
        name: "NoQueryExecutionPlans",
        msg: "error processing query: planner returned error :: caused by :: unable to find index for $geoNear query".into(),
    }
}

/// The candidate of one index (a wildcard one only with a usable sarg).
fn candidate(
    index: &IndexState,
    sargs: &[(String, Sarg)],
    geo: &[(String, Arc<GeoQuery>)],
    sort: Option<&SortSpec>,
) -> Option<IndexCandidate> {
    match &index.spec.kind {
        IndexKind::Geo { pos } => plan_geo(index, *pos, sargs, geo),
        IndexKind::Wildcard(w) => plan_wildcard(index, w, sargs),
        // Only `$text` queries read a text index (`query::text`).
        IndexKind::Text(_) => None,
        _ => Some(plan_index(index, sargs, sort)),
    }
}

/// The plan of a query with a `$near` on `path`: the best 2dsphere index
/// scan for it (291 when none can answer it).
fn plan_near(
    coll: &CollectionState,
    path: &str,
    sargs: &[(String, Sarg)],
    geo: &[(String, Arc<GeoQuery>)],
) -> Result<Plan> {
    let best = coll
        .indexes
        .iter()
        .filter(|i| matches!(i.spec.kind, IndexKind::Geo { pos } if i.spec.fields[pos].0 == path))
        .filter(|i| index_usable(i, sargs))
        .filter_map(|i| candidate(i, sargs, geo, None))
        .max_by_key(|c| c.score)
        .ok_or_else(no_near_index)?;
    Ok(Plan {
        access: best.access,
        provides_sort: false,
    })
}

fn plan_id(sargs: &[(String, Sarg)], sort: Option<&SortSpec>) -> Option<Plan> {
    let sort_dir = match sort.map(|s| s.keys.as_slice()) {
        None | Some([]) => Some(false),
        Some([(p, asc)]) if p == "_id" => Some(!asc),
        _ => None,
    };
    let (_, sarg) = sargs.iter().find(|(p, _)| p == "_id")?;
    match sarg {
        Sarg::Eq(v) => Some(Plan {
            access: Access::IdPoints {
                ids: vec![v.clone()],
            },
            provides_sort: true,
        }),
        Sarg::In(vs) => {
            let mut ids = vs.clone();
            ids.sort_by(|a, b| value::compare(a.as_raw_bson_ref(), b.as_raw_bson_ref()));
            ids.dedup_by(|a, b| value::equal(a.as_raw_bson_ref(), b.as_raw_bson_ref()));
            if sort_dir == Some(true) {
                ids.reverse();
            }
            Some(Plan {
                access: Access::IdPoints { ids },
                provides_sort: sort_dir.is_some(),
            })
        }
        Sarg::Range { .. } => {
            let (lower, upper) = value_intervals(sarg, false).pop()?;
            Some(Plan {
                access: Access::IdRange {
                    lower: lower.map(ValueKey::from),
                    upper: upper.map(ValueKey::from),
                    reverse: sort_dir == Some(true),
                },
                provides_sort: sort_dir.is_some(),
            })
        }
    }
}

/// A sarg whose bounds hold no string: it selects the same keys in an index
/// of any collation.
fn string_free(s: &Sarg) -> bool {
    let free = |v: &RawBson| !collation::has_strings(v.as_raw_bson_ref());
    match s {
        Sarg::Eq(v) => free(v),
        Sarg::In(vs) => vs.iter().all(free),
        Sarg::Range { lower, upper } => {
            let bound_free = |b: &Bound<RawBson>| match b {
                Bound::Included(v) | Bound::Excluded(v) => free(v),
                Bound::Unbounded => true,
            };
            bound_free(lower) && bound_free(upper)
        }
    }
}

fn bad_hint() -> Error {
    Error::bad_value("error processing query: planner returned error :: caused by :: hint provided does not correspond to an existing index")
}

/// Choose an access path for `filter` (and `sort`) on `coll`.
pub fn plan(
    coll: &CollectionState,
    filter: &Filter,
    sort: Option<&SortSpec>,
    hint: Option<&Hint>,
) -> Result<Plan> {
    plan_among(coll, filter, sort, hint, None)
}

/// [`plan`], and the plans it chose against (explain's `rejectedPlans`):
/// every other index that could answer the query, and the `_id` range when
/// an index won over it. None when a hint, an `_id` point lookup or `$near`
/// decides alone, or when no index applies (a collection scan is no
/// candidate beside an index, as in MongoDB's planner).
pub fn plan_with_rejected(
    coll: &CollectionState,
    filter: &Filter,
    sort: Option<&SortSpec>,
    hint: Option<&Hint>,
) -> Result<(Plan, Vec<Plan>)> {
    let mut rejected = Vec::new();
    let p = plan_among(coll, filter, sort, hint, Some(&mut rejected))?;
    Ok((p, rejected))
}

fn plan_among(
    coll: &CollectionState,
    filter: &Filter,
    sort: Option<&SortSpec>,
    hint: Option<&Hint>,
    mut rejected: Option<&mut Vec<Plan>>,
) -> Result<Plan> {
    let all_sargs = filter.sargs();
    // Collation (MongoDB's rule): an index answers string bounds only under
    // the query's collation (the sargs of a collated filter are collation
    // keys, and a collated index holds them); bounds without strings mean
    // the same in every index, and nothing else may use a mismatched one.
    let coll_q = filter.collator().map(|c| &**c);
    let simple_sargs: Vec<(String, Sarg)> = all_sargs
        .iter()
        .filter(|(_, s)| string_free(s))
        .cloned()
        .collect();
    let sargs_for = |index: &IndexState| -> Vec<(String, Sarg)> {
        if collation::same(index.spec.collation.as_deref(), coll_q) {
            all_sargs.clone()
        } else {
            simple_sargs.clone()
        }
    };
    let sort_for = |index: &IndexState| {
        sort.filter(|s| collation::same(index.spec.collation.as_deref(), s.collator.as_deref()))
    };
    // The primary `_id` index is simple (a collated `_id` index is one of
    // the secondary indexes).
    let id_sort = sort.filter(|s| s.collator.is_none());
    let sargs = if coll_q.is_some() {
        simple_sargs.clone()
    } else {
        all_sargs.clone()
    };
    let geo = filter.geo_sargs();
    // A `$near`'s distance order is a sort no index order gives.
    let sort = sort.filter(|s| s.near.is_none());
    if let Some(near) = filter.near() {
        return plan_near(coll, &near.path, &sargs, &geo);
    }
    match hint {
        Some(Hint::Natural { reverse }) => {
            return Ok(Plan {
                access: Access::CollScan { reverse: *reverse },
                provides_sort: false,
            })
        }
        Some(h @ (Hint::Name(_) | Hint::Keys(_))) => {
            let is_id = match h {
                Hint::Name(n) => n == ID_INDEX_NAME,
                Hint::Keys(k) => k.len() == 1 && k.contains_key("_id"),
                Hint::Natural { .. } => false,
            };
            if is_id {
                if let Some(p) = plan_id(&sargs, id_sort) {
                    return Ok(p);
                }
                let reverse =
                    matches!(id_sort.map(|s| s.keys.as_slice()), Some([(p, false)]) if p == "_id");
                let provides_sort = sort.is_none_or(|s| s.keys.is_empty())
                    || id_sort.is_some_and(|s| {
                        s.keys.is_empty() || (s.keys.len() == 1 && s.keys[0].0 == "_id")
                    });
                return Ok(Plan {
                    access: Access::IdRange {
                        lower: Bound::Unbounded,
                        upper: Bound::Unbounded,
                        reverse,
                    },
                    provides_sort,
                });
            }
            let index = coll
                .indexes
                .iter()
                .find(|i| match h {
                    Hint::Name(n) => &i.spec.name == n,
                    Hint::Keys(k) => &i.spec.key_pattern() == k,
                    Hint::Natural { .. } => false,
                })
                .ok_or_else(bad_hint)?;
            // As MongoDB: a partial index the query does not imply, or a
            // wildcard index without a usable predicate, cannot be hinted; a
            // sparse index can (its answer may then miss documents).
            if index.spec.partial.is_some() && !index_usable(index, &sargs) {
                return Err(bad_hint());
            }
            let c =
                candidate(index, &sargs_for(index), &geo, sort_for(index)).ok_or_else(bad_hint)?;
            return Ok(Plan {
                access: c.access,
                provides_sort: c.provides_sort,
            });
        }
        None => {}
    }
    if let Some(p) = plan_id(&sargs, id_sort) {
        if matches!(p.access, Access::IdPoints { .. }) {
            return Ok(p);
        }
    }
    let mut best: Option<IndexCandidate> = None;
    let as_plan = |c: IndexCandidate| Plan {
        access: c.access,
        provides_sort: c.provides_sort,
    };
    for index in &coll.indexes {
        if !index_usable(index, &sargs) {
            continue;
        }
        let Some(c) = candidate(index, &sargs_for(index), &geo, sort_for(index)) else {
            continue;
        };
        if c.score == 0 && !c.provides_sort {
            continue;
        }
        let better = match &best {
            None => true,
            Some(b) => (c.score, c.provides_sort) > (b.score, b.provides_sort),
        };
        let loser = if better { best.replace(c) } else { Some(c) };
        if let (Some(r), Some(l)) = (rejected.as_deref_mut(), loser) {
            r.push(as_plan(l));
        }
    }
    if let Some(p) = plan_id(&sargs, id_sort) {
        // An _id range competes with a secondary range of the same strength.
        if best.as_ref().is_none_or(|b| b.score <= 1) {
            if let (Some(r), Some(b)) = (rejected, best) {
                r.push(as_plan(b));
            }
            return Ok(p);
        }
        if let Some(r) = rejected {
            r.push(p);
        }
    }
    if let Some(b) = best {
        return Ok(Plan {
            access: b.access,
            provides_sort: b.provides_sort,
        });
    }
    // A sort on _id alone is served by the primary index.
    if let Some([(p, asc)]) = id_sort.map(|s| s.keys.as_slice()) {
        if p == "_id" {
            return Ok(Plan {
                access: Access::IdRange {
                    lower: Bound::Unbounded,
                    upper: Bound::Unbounded,
                    reverse: !asc,
                },
                provides_sort: true,
            });
        }
    }
    Ok(Plan {
        access: Access::CollScan { reverse: false },
        provides_sort: sort.is_none_or(|s| s.keys.is_empty()),
    })
}

/// Count one use of the index `access` walks (`$indexStats`' `accesses.ops`),
/// once per read that starts walking it: every executor of a plan calls this.
pub fn record_use(coll: &CollectionState, access: &Access) {
    match access {
        Access::CollScan { .. } => {}
        Access::IdPoints { .. } | Access::IdRange { .. } => coll.id_usage.record(),
        Access::IndexScan { index, .. } => {
            if let Some(index) = coll.index(index) {
                index.usage.record();
            }
        }
    }
}

/// Visit every document of `coll` that the plan reaches and `filter` matches, in
/// the plan's order, until `visit` breaks.
pub fn execute<F>(coll: &CollectionState, plan: &Plan, filter: &Filter, visit: F) -> Result<()>
where
    F: FnMut(RecordId, &DocRef) -> ControlFlow<()>,
{
    execute_with(coll, plan, filter, &CancelToken::never(), visit)
}

/// [`execute`], checking `cancel` every [`PAGE_DOCS`] entries examined
/// (matching or not), so a cancelled walk stops within one page. Index
/// entries and `_id` lookups are counted into a counting filter's keys
/// (explain's `keysExamined`; [`Filter::count_into`]).
pub fn execute_with<F>(
    coll: &CollectionState,
    plan: &Plan,
    filter: &Filter,
    cancel: &CancelToken,
    mut visit: F,
) -> Result<()>
where
    F: FnMut(RecordId, &DocRef) -> ControlFlow<()>,
{
    record_use(coll, &plan.access);
    let mut examined = 0usize;
    let mut tick = || -> Result<()> {
        examined += 1;
        if examined.is_multiple_of(PAGE_DOCS) {
            cancel.check()?;
        }
        Ok(())
    };
    let match_all = filter.is_match_all();
    let mut emit = |rid: RecordId, doc: &DocRef| -> ControlFlow<()> {
        if match_all || filter.matches(doc) {
            visit(rid, doc)
        } else {
            ControlFlow::Continue(())
        }
    };
    match &plan.access {
        Access::CollScan { reverse: false } => {
            for (rid, doc) in crate::doc::prefetching(coll.heap.iter()) {
                tick()?;
                if emit(rid, doc).is_break() {
                    break;
                }
            }
        }
        Access::CollScan { reverse: true } => {
            let all: Vec<(RecordId, &DocRef)> = coll.heap.iter().collect();
            for (rid, doc) in all.into_iter().rev() {
                tick()?;
                if emit(rid, doc).is_break() {
                    break;
                }
            }
        }
        Access::IdPoints { ids } => {
            for id in ids {
                tick()?;
                if let Some(rid) = coll.rid_of_id(id) {
                    filter.count_key();
                    if let Some(doc) = coll.heap.get(rid) {
                        if emit(rid, doc).is_break() {
                            break;
                        }
                    }
                }
            }
        }
        Access::IdRange {
            lower,
            upper,
            reverse,
        } => {
            for (_, rid) in id_range(coll, lower.as_ref(), upper.as_ref(), *reverse) {
                tick()?;
                filter.count_key();
                if let Some(doc) = coll.heap.get(*rid) {
                    if emit(*rid, doc).is_break() {
                        break;
                    }
                }
            }
        }
        Access::IndexScan {
            index,
            intervals,
            reverse,
            dedup,
            ..
        } => {
            let index = coll
                .index(index)
                .ok_or_else(|| Error::Internal(format!("planned index {index} is gone")))?;
            let mut seen: HashSet<RecordId> = HashSet::new();
            let order: Box<dyn Iterator<Item = &(Bound<EntryKey>, Bound<EntryKey>)>> = if *reverse {
                Box::new(intervals.iter().rev())
            } else {
                Box::new(intervals.iter())
            };
            'outer: for (lo, hi) in order {
                if !bounds_nonempty(lo, hi) {
                    continue;
                }
                let range = index.range(lo.as_ref(), hi.as_ref());
                let entries: Box<dyn Iterator<Item = (&EntryKey, &())>> = if *reverse {
                    Box::new(range.rev())
                } else {
                    Box::new(range)
                };
                for ((_, rid), _) in entries {
                    tick()?;
                    filter.count_key();
                    if *dedup && !seen.insert(*rid) {
                        continue;
                    }
                    if let Some(doc) = coll.heap.get(*rid) {
                        if emit(*rid, doc).is_break() {
                            break 'outer;
                        }
                    }
                }
            }
        }
    }
    // An `$expr` that failed on some document fails the whole query.
    filter.check()
}

/// `std`'s range panics when lower > upper; such an interval is simply empty.
fn bounds_nonempty(lo: &Bound<EntryKey>, hi: &Bound<EntryKey>) -> bool {
    match (lo, hi) {
        (Bound::Included(a), Bound::Included(b)) => a <= b,
        (Bound::Included(a) | Bound::Excluded(a), Bound::Included(b) | Bound::Excluded(b)) => a < b,
        _ => true,
    }
}

/// The empty filter, parsed once.
pub fn match_all() -> &'static Filter {
    static MATCH_ALL: std::sync::OnceLock<Filter> = std::sync::OnceLock::new();
    MATCH_ALL.get_or_init(|| {
        Filter::parse(&Document::new())
            .unwrap_or_else(|e| panic!("the empty filter must parse: {e}"))
    })
}

/// A find's shape, parsed.
#[derive(Debug, Clone, Default)]
pub struct FindSpec {
    pub filter: Option<Filter>,
    pub sort: Option<SortSpec>,
    pub skip: u64,
    /// 0 = no limit.
    pub limit: u64,
    pub hint: Option<Hint>,
}

/// Run a find to completion: the matching documents, sorted, skipped and limited.
pub fn run_find(
    coll: &CollectionState,
    spec: &FindSpec,
) -> Result<(Vec<(RecordId, DocRef)>, Plan)> {
    let filter = match &spec.filter {
        Some(f) => f,
        None => match_all(),
    };
    let near_sort = filter.near().map(SortSpec::near);
    let sort = spec
        .sort
        .as_ref()
        .filter(|s| !s.keys.is_empty())
        .or(near_sort.as_ref());
    let plan = plan(coll, filter, sort, spec.hint.as_ref())?;
    let mut out: Vec<(RecordId, DocRef)> = Vec::new();
    if sort.is_none() || plan.provides_sort {
        let mut to_skip = spec.skip;
        let limit = spec.limit;
        execute(coll, &plan, filter, |rid, doc| {
            if to_skip > 0 {
                to_skip -= 1;
                return ControlFlow::Continue(());
            }
            out.push((rid, doc.clone()));
            if limit > 0 && out.len() as u64 >= limit {
                ControlFlow::Break(())
            } else {
                ControlFlow::Continue(())
            }
        })?;
        return Ok((out, plan));
    }
    let sort = sort.ok_or_else(|| Error::Internal("sort vanished".into()))?;
    execute(coll, &plan, filter, |rid, doc| {
        out.push((rid, doc.clone()));
        ControlFlow::Continue(())
    })?;
    // Keys are computed once per document, not once per comparison; ties keep
    // record order, so results are deterministic.
    let mut keyed: Vec<_> = out
        .into_iter()
        .map(|(rid, d)| (sort.sort_key(&d), rid, d))
        .collect();
    keyed.sort_by(|(ka, ra, _), (kb, rb, _)| sort.compare_keys(ka, kb).then(ra.cmp(rb)));
    let mut out: Vec<(RecordId, DocRef)> = keyed.into_iter().map(|(_, rid, d)| (rid, d)).collect();
    let skip = usize::try_from(spec.skip)
        .unwrap_or(usize::MAX)
        .min(out.len());
    out.drain(..skip);
    if spec.limit > 0 {
        out.truncate(usize::try_from(spec.limit).unwrap_or(usize::MAX));
    }
    Ok((out, plan))
}

/// Count the matching documents (no materialization).
pub fn count(coll: &CollectionState, filter: &Filter, hint: Option<&Hint>) -> Result<u64> {
    if filter.is_match_all() && hint.is_none() {
        return Ok(coll.len() as u64);
    }
    let plan = plan(coll, filter, None, hint)?;
    let mut n = 0u64;
    execute(coll, &plan, filter, |_, _| {
        n += 1;
        ControlFlow::Continue(())
    })?;
    Ok(n)
}
