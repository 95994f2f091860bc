//! When may the planner use a partial or sparse index? Only when every
//! document the query can match is in the index.
//!
//! [`implies`] is a conservative implication check between a query's
//! [`Sarg`]s (the necessary conditions of its top-level conjunction) and a
//! partial index's filter: `true` only when every document satisfying the
//! sargs satisfies the filter. It may say `false` for an implied filter
//! (the index is then not used: slower, never wrong), never `true` for one
//! that is not — a property test checks it against brute force.
//!
//! Why it is sound: a sarg on path `p` says some value `p` reaches (or an
//! element of a reached array) — a *witness* — is equal to `w`, in a set, or
//! beyond a bound of the same canonical type (comparisons are
//! type-bracketed). The filter's conditions are existential over the same
//! values, so a condition that holds for every possible witness holds for
//! the document. Each filter condition is checked against one sarg alone
//! (a merged two-sided range may have two different witnesses).

use std::cmp::Ordering;
use std::ops::Bound;

use bson::spec::ElementType;
use bson::{Bson, Document, RawBson};

use crate::doc::value;
use crate::query::Sarg;

/// Most `$in` values split into cases (and `$in`s split) by [`implies`].
const MAX_CASES: usize = 16;
const MAX_SPLITS: usize = 2;

/// Does every document satisfying all of `sargs` match the partial filter `expr`?
pub fn implies(sargs: &[(String, Sarg)], expr: &Document) -> bool {
    implies_cases(sargs, expr, MAX_SPLITS)
}

/// When the filter is not implied as a whole, an `$in` may still imply it
/// case by case (`{s: {$in: [A, B]}}` implies `{$or: [{s: A}, {s: B}]}`):
/// a document matching the `$in` matches one of its values' equalities.
fn implies_cases(sargs: &[(String, Sarg)], expr: &Document, splits: usize) -> bool {
    if implies_doc(sargs, expr, 0) {
        return true;
    }
    if splits == 0 {
        return false;
    }
    let Some(at) = sargs
        .iter()
        .position(|(_, s)| matches!(s, Sarg::In(vs) if !vs.is_empty() && vs.len() <= MAX_CASES))
    else {
        return false;
    };
    let Sarg::In(values) = &sargs[at].1 else {
        return false;
    };
    values.iter().all(|v| {
        let mut case = sargs.to_vec();
        case[at].1 = Sarg::Eq(v.clone());
        implies_cases(&case, expr, splits - 1)
    })
}

/// Does every document satisfying `sargs` have a value at one of `paths`
/// (what a sparse index needs to hold it)?
pub fn implies_exists_any(sargs: &[(String, Sarg)], paths: &[&str]) -> bool {
    sargs.iter().any(|(p, s)| {
        paths.contains(&p.as_str()) && sarg_implies(s, "$exists", &Bson::Boolean(true))
    })
}

fn implies_doc(sargs: &[(String, Sarg)], d: &Document, depth: usize) -> bool {
    if depth > crate::query::index_spec::MAX_PARTIAL_DEPTH {
        return false;
    }
    d.iter().all(|(k, v)| match (k.as_str(), v) {
        ("$and", Bson::Array(items)) => items.iter().all(|i| match i {
            Bson::Document(sub) => implies_doc(sargs, sub, depth + 1),
            _ => false,
        }),
        ("$or", Bson::Array(items)) => items.iter().any(|i| match i {
            Bson::Document(sub) => implies_doc(sargs, sub, depth + 1),
            _ => false,
        }),
        (op, _) if op.starts_with('$') => false,
        (path, Bson::Document(ops)) if ops.keys().next().is_some_and(|o| o.starts_with('$')) => ops
            .iter()
            .all(|(op, arg)| implies_atom(sargs, path, op, arg)),
        (path, v) => implies_atom(sargs, path, "$eq", v),
    })
}

fn implies_atom(sargs: &[(String, Sarg)], path: &str, op: &str, arg: &Bson) -> bool {
    sargs
        .iter()
        .any(|(p, s)| p == path && sarg_implies(s, op, arg))
}

fn raw(b: &Bson) -> Option<RawBson> {
    RawBson::try_from(b.clone()).ok()
}

fn rank(v: &RawBson) -> u8 {
    value::canonical_rank(v.as_raw_bson_ref())
}

fn cmp(a: &RawBson, b: &RawBson) -> Ordering {
    value::compare(a.as_raw_bson_ref(), b.as_raw_bson_ref())
}

/// Ranks whose comparisons are type-bracketed and decided by value alone
/// (not MinKey, undefined, null, arrays or MaxKey).
fn plain_rank(r: u8) -> bool {
    (3..=15).contains(&r) && r != 6
}

fn sarg_implies(s: &Sarg, op: &str, arg: &Bson) -> bool {
    match s {
        Sarg::Eq(w) => witness_implies(w, op, arg),
        Sarg::In(ws) => !ws.is_empty() && ws.iter().all(|w| witness_implies(w, op, arg)),
        Sarg::Range { lower, upper } => range_implies(lower, upper, op, arg),
    }
}

/// The BSON types of one canonical rank (what a value equal to one of that
/// rank may be).
fn rank_types(r: u8) -> &'static [ElementType] {
    use ElementType as T;
    match r {
        0 => &[T::MinKey],
        3 => &[T::Double, T::Int32, T::Int64, T::Decimal128],
        4 => &[T::String, T::Symbol],
        5 => &[T::EmbeddedDocument],
        7 => &[T::Binary],
        8 => &[T::ObjectId],
        9 => &[T::Boolean],
        10 => &[T::DateTime],
        11 => &[T::Timestamp],
        12 => &[T::RegularExpression],
        13 => &[T::DbPointer],
        14 => &[T::JavaScriptCode],
        15 => &[T::JavaScriptCodeWithScope],
        16 => &[T::MaxKey],
        _ => &[],
    }
}

/// The types a `$type` argument names; `None` when it names something this
/// check does not model (numeric codes: conservatively never implied).
fn type_set(arg: &Bson) -> Option<Vec<ElementType>> {
    let one = |b: &Bson| -> Option<Vec<ElementType>> {
        match b {
            Bson::String(s) if s == "number" => Some(rank_types(3).to_vec()),
            Bson::String(s) => crate::doc::types::from_alias(s).map(|t| vec![t]),
            _ => None,
        }
    };
    match arg {
        Bson::Array(items) => {
            let mut out = Vec::new();
            for i in items {
                out.extend(one(i)?);
            }
            Some(out)
        }
        other => one(other),
    }
}

fn rank_in_types(r: u8, arg: &Bson) -> bool {
    let types = rank_types(r);
    !types.is_empty() && type_set(arg).is_some_and(|set| types.iter().all(|t| set.contains(t)))
}

/// Does a document with a value equal to `w` at the path satisfy `{op: arg}`?
fn witness_implies(w: &RawBson, op: &str, arg: &Bson) -> bool {
    let wr = rank(w);
    match op {
        "$exists" => !matches!(w, RawBson::Null | RawBson::Undefined),
        "$type" => rank_in_types(wr, arg),
        "$in" => match arg {
            Bson::Array(items) => items.iter().filter_map(raw).any(|a| {
                !matches!(a, RawBson::Array(_))
                    && value::equal(w.as_raw_bson_ref(), a.as_raw_bson_ref())
            }),
            _ => false,
        },
        "$eq" => match raw(arg) {
            // An array operand also matches a whole array value: not modelled.
            Some(RawBson::Array(_)) | None => false,
            Some(a) => value::equal(w.as_raw_bson_ref(), a.as_raw_bson_ref()),
        },
        "$gt" | "$gte" | "$lt" | "$lte" => {
            let Some(a) = raw(arg) else { return false };
            if !plain_rank(wr) || rank(&a) != wr {
                return false;
            }
            let o = cmp(w, &a);
            match op {
                "$gt" => o == Ordering::Greater,
                "$gte" => o != Ordering::Less,
                "$lt" => o == Ordering::Less,
                _ => o != Ordering::Greater,
            }
        }
        _ => false,
    }
}

fn bound_rank(b: &Bound<RawBson>) -> Option<u8> {
    match b {
        Bound::Included(v) | Bound::Excluded(v) => Some(rank(v)),
        Bound::Unbounded => None,
    }
}

/// Does a document with a value beyond the range's bounds (each bound on
/// its own, same canonical rank as the bound) satisfy `{op: arg}`?
fn range_implies(lower: &Bound<RawBson>, upper: &Bound<RawBson>, op: &str, arg: &Bson) -> bool {
    let ranks = [bound_rank(lower), bound_rank(upper)];
    let some_plain = ranks.iter().flatten().any(|r| plain_rank(*r));
    match op {
        "$exists" => some_plain,
        "$type" => ranks
            .iter()
            .flatten()
            .any(|r| plain_rank(*r) && rank_in_types(*r, arg)),
        "$gt" | "$gte" => {
            let Some(a) = raw(arg) else { return false };
            let (Bound::Included(l) | Bound::Excluded(l)) = lower else {
                return false;
            };
            if !plain_rank(rank(l)) || rank(l) != rank(&a) {
                return false;
            }
            match cmp(l, &a) {
                Ordering::Greater => true,
                Ordering::Equal => op == "$gte" || matches!(lower, Bound::Excluded(_)),
                Ordering::Less => false,
            }
        }
        "$lt" | "$lte" => {
            let Some(a) = raw(arg) else { return false };
            let (Bound::Included(u) | Bound::Excluded(u)) = upper else {
                return false;
            };
            if !plain_rank(rank(u)) || rank(u) != rank(&a) {
                return false;
            }
            match cmp(u, &a) {
                Ordering::Less => true,
                Ordering::Equal => op == "$lte" || matches!(upper, Bound::Excluded(_)),
                Ordering::Greater => false,
            }
        }
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::query::Filter;
    use bson::{doc, RawDocumentBuf};
    use proptest::prelude::*;

    fn sargs(q: &Document) -> Vec<(String, Sarg)> {
        Filter::parse(q).expect("query").sargs()
    }

    #[test]
    fn examples() {
        let p = doc! {"a": {"$gt": 5}};
        assert!(implies(&sargs(&doc! {"a": 7}), &p));
        assert!(implies(&sargs(&doc! {"a": {"$gte": 6}}), &p));
        assert!(implies(&sargs(&doc! {"a": {"$gt": 5}, "b": 1}), &p));
        assert!(!implies(&sargs(&doc! {"a": {"$gte": 5}}), &p));
        assert!(!implies(&sargs(&doc! {"a": 5}), &p));
        assert!(!implies(&sargs(&doc! {"a": "x"}), &p));
        assert!(!implies(&sargs(&doc! {}), &p));
        assert!(!implies(&sargs(&doc! {"$or": [{"a": 7}, {"a": 8}]}), &p));
        let e = doc! {"email": {"$exists": true}};
        assert!(implies(&sargs(&doc! {"email": "x@y"}), &e));
        assert!(!implies(&sargs(&doc! {"email": null}), &e));
        let or = doc! {"$or": [{"s": "A"}, {"s": "B"}]};
        assert!(implies(&sargs(&doc! {"s": "B"}), &or));
        assert!(implies(&sargs(&doc! {"s": {"$in": ["A", "B"]}}), &or));
        assert!(!implies(&sargs(&doc! {"s": {"$in": ["A", "C"]}}), &or));
        let t = doc! {"n": {"$type": "number"}};
        assert!(implies(&sargs(&doc! {"n": 5}), &t));
        assert!(!implies(
            &sargs(&doc! {"n": 5}),
            &doc! {"n": {"$type": "int"}}
        ));
    }

    // ---- property test against brute force ----

    fn val() -> impl Strategy<Value = Bson> {
        prop_oneof![
            (0..6i32).prop_map(Bson::Int32),
            (0..6i32).prop_map(|i| Bson::Double(f64::from(i) + 0.5)),
            prop::sample::select(vec!["x", "y"]).prop_map(|s| Bson::String(s.into())),
            Just(Bson::Null),
        ]
    }

    fn path() -> impl Strategy<Value = &'static str> {
        prop::sample::select(vec!["a", "b"])
    }

    fn cond() -> impl Strategy<Value = (String, Bson)> {
        let op = prop::sample::select(vec!["$eq", "$gt", "$gte", "$lt", "$lte"]);
        prop_oneof![
            (path(), val()).prop_map(|(p, v)| (p.to_string(), v)),
            (path(), op, val()).prop_map(|(p, o, v)| (p.to_string(), Bson::Document(doc! {o: v}))),
            (path(), prop::collection::vec(val(), 1..3))
                .prop_map(|(p, vs)| (p.to_string(), Bson::Document(doc! {"$in": vs}))),
            path().prop_map(|p| (p.to_string(), Bson::Document(doc! {"$exists": true}))),
            (
                path(),
                prop::sample::select(vec!["number", "int", "double", "string", "null"])
            )
                .prop_map(|(p, t)| (p.to_string(), Bson::Document(doc! {"$type": t}))),
        ]
    }

    fn conj() -> impl Strategy<Value = Document> {
        prop::collection::vec(cond(), 0..3).prop_map(|cs| {
            let items: Vec<Bson> = cs
                .into_iter()
                .map(|(p, v)| {
                    let mut d = Document::new();
                    d.insert(p, v);
                    Bson::Document(d)
                })
                .collect();
            if items.is_empty() {
                Document::new()
            } else {
                doc! {"$and": items}
            }
        })
    }

    fn partial() -> impl Strategy<Value = Document> {
        prop_oneof![
            conj().prop_filter("non-empty", |d| !d.is_empty()),
            (conj(), conj()).prop_filter_map("non-empty", |(x, y)| {
                (!x.is_empty() && !y.is_empty()).then(|| doc! {"$or": [x, y]})
            }),
        ]
    }

    fn field_value() -> impl Strategy<Value = Option<Bson>> {
        prop_oneof![
            Just(None),
            val().prop_map(Some),
            prop::collection::vec(val(), 0..3).prop_map(|v| Some(Bson::Array(v))),
        ]
    }

    fn docs() -> impl Strategy<Value = Vec<RawDocumentBuf>> {
        prop::collection::vec((field_value(), field_value()), 1..30).prop_map(|rows| {
            rows.into_iter()
                .map(|(a, b)| {
                    let mut d = Document::new();
                    if let Some(a) = a {
                        d.insert("a", a);
                    }
                    if let Some(b) = b {
                        d.insert("b", b);
                    }
                    RawDocumentBuf::try_from(&d).expect("raw")
                })
                .collect()
        })
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 2000, ..ProptestConfig::default() })]
        /// Whenever the check says the query implies the filter, no document
        /// matches the query without matching the filter.
        #[test]
        fn implication_is_sound(q in conj(), p in partial(), docs in docs()) {
            let query = Filter::parse(&q).expect("query");
            let filter = Filter::parse(&p).expect("partial");
            if implies(&query.sargs(), &p) {
                for d in &docs {
                    prop_assert!(!query.matches(d) || filter.matches(d),
                        "query {q} implies {p} but {d:?} breaks it");
                }
            }
        }
    }

    /// The check is not vacuous: over many random pairs it finds implications.
    #[test]
    fn implication_is_found_often_enough() {
        use proptest::strategy::ValueTree;
        use proptest::test_runner::TestRunner;
        let mut runner = TestRunner::deterministic();
        let mut found = 0;
        for _ in 0..3000 {
            let q = conj().new_tree(&mut runner).expect("tree").current();
            let p = partial().new_tree(&mut runner).expect("tree").current();
            if implies(&Filter::parse(&q).expect("q").sargs(), &p) {
                found += 1;
            }
        }
        assert!(found > 20, "only {found} implications found");
    }
}
