//! The index-answerable predicates (`Filter::sargs`): what is extracted, how
//! ranges merge, and that every matching document satisfies every sarg.

use std::cmp::Ordering;
use std::ops::Bound;

use bson::{doc, RawBson};

use super::*;
use crate::doc::value;
use crate::query::filter::Sarg;

fn s(f: Document) -> Vec<(String, Sarg)> {
    parse(f).sargs()
}

fn rb(b: Bson) -> RawBson {
    value::to_raw(&b).expect("raw")
}

#[test]
fn sargs_equality_and_in() {
    assert_eq!(
        s(doc! {"a": 1}),
        vec![("a".to_string(), Sarg::Eq(rb(1.into())))]
    );
    assert_eq!(
        s(doc! {"a.b": {"$eq": "x"}}),
        vec![("a.b".to_string(), Sarg::Eq(rb("x".into())))]
    );
    assert_eq!(
        s(doc! {"a": null}),
        vec![("a".to_string(), Sarg::Eq(RawBson::Null))]
    );
    assert_eq!(
        s(doc! {"a": {"b": 1}}),
        vec![("a".to_string(), Sarg::Eq(rb(doc! {"b": 1}.into())))]
    );
    assert_eq!(
        s(doc! {"a": {"$in": [3, 1, 1.0]}}),
        vec![("a".to_string(), Sarg::In(vec![rb(1.into()), rb(3.into())]))]
    );
    assert!(s(doc! {"a": [1, 2]}).is_empty());
    assert!(s(doc! {"a": re("x", "")}).is_empty());
    assert!(s(doc! {"a": {"$eq": re("x", "")}}).is_empty());
    assert!(s(doc! {"a": {"$in": [1, [2]]}}).is_empty());
    assert!(s(doc! {"a": {"$in": [1, re("x", "")]}}).is_empty());
}

#[test]
fn sargs_ranges_merge() {
    assert_eq!(
        s(doc! {"a": {"$gt": 1, "$lte": 5}}),
        vec![(
            "a".to_string(),
            Sarg::Range {
                lower: Bound::Excluded(rb(1.into())),
                upper: Bound::Included(rb(5.into()))
            }
        )]
    );
    assert_eq!(
        s(
            doc! {"$and": [{"a": {"$gte": 2}}, {"a": {"$gt": 2}}, {"a": {"$gte": 1}}, {"a": {"$lt": 9}}, {"a": {"$lt": 7}}]}
        ),
        vec![(
            "a".to_string(),
            Sarg::Range {
                lower: Bound::Excluded(rb(2.into())),
                upper: Bound::Excluded(rb(7.into()))
            }
        )]
    );
    assert_eq!(
        s(doc! {"a": {"$lt": "m"}}),
        vec![(
            "a".to_string(),
            Sarg::Range {
                lower: Bound::Unbounded,
                upper: Bound::Excluded(rb("m".into()))
            }
        )]
    );
    assert!(s(doc! {"a": {"$gt": [1]}}).is_empty());
}

#[test]
fn sargs_only_from_top_level_conjunction() {
    let got = s(
        doc! {"a": 1, "$and": [{"b": {"$in": [2]}}, {"$and": [{"c": {"$gte": 0}}]}], "d": {"$all": [4, 5]}},
    );
    let paths: Vec<&str> = got.iter().map(|(p, _)| p.as_str()).collect();
    assert_eq!(paths, vec!["a", "b", "c", "d", "d"]);
    for f in [
        doc! {"a": {"$ne": 1}},
        doc! {"a": {"$nin": [1]}},
        doc! {"a": {"$not": {"$gt": 1}}},
        doc! {"a": {"$exists": true}},
        doc! {"a": {"$regex": "x"}},
        doc! {"a": {"$elemMatch": {"b": 1}}},
        doc! {"a": {"$elemMatch": {"$eq": 1}}},
        doc! {"$or": [{"a": 1}]},
        doc! {"$nor": [{"a": 1}]},
        doc! {"a": {"$size": 1}},
        doc! {"a": {"$type": "string"}},
        doc! {"a": {"$mod": [2, 0]}},
    ] {
        assert!(s(f.clone()).is_empty(), "{f}");
    }
    // Mixed: only the indexable part is returned.
    assert_eq!(s(doc! {"a": {"$ne": 1, "$gt": 0}}).len(), 1);
}

#[test]
fn sargs_are_supersets_of_matches() {
    // Every matching document satisfies every sarg (checked on a non-multikey
    // document set, where a merged range is exact).
    let docs = [
        doc! {"a": 1},
        doc! {"a": 3},
        doc! {"a": "x"},
        doc! {"a": null},
        doc! {},
        doc! {"a": 7.5},
    ];
    let filters = [
        doc! {"a": {"$gte": 1, "$lt": 7}},
        doc! {"a": {"$in": [1, "x", null]}},
        doc! {"a": 3},
        doc! {"$and": [{"a": {"$gt": 1}}, {"a": {"$lte": 8}}]},
    ];
    for f in filters {
        let filter = parse(f.clone());
        for d in &docs {
            if !filter.matches(&raw(d)) {
                continue;
            }
            let v = d.get("a").cloned().unwrap_or(Bson::Null);
            let v = value::to_raw(&v).expect("raw");
            let v = v.as_raw_bson_ref();
            for (_, sarg) in filter.sargs() {
                let ok = match &sarg {
                    Sarg::Eq(x) => value::equal(x.as_raw_bson_ref(), v),
                    Sarg::In(xs) => xs.iter().any(|x| value::equal(x.as_raw_bson_ref(), v)),
                    Sarg::Range { lower, upper } => {
                        let lo = match lower {
                            Bound::Included(x) => {
                                value::compare(v, x.as_raw_bson_ref()) != Ordering::Less
                            }
                            Bound::Excluded(x) => {
                                value::compare(v, x.as_raw_bson_ref()) == Ordering::Greater
                            }
                            Bound::Unbounded => true,
                        };
                        let hi = match upper {
                            Bound::Included(x) => {
                                value::compare(v, x.as_raw_bson_ref()) != Ordering::Greater
                            }
                            Bound::Excluded(x) => {
                                value::compare(v, x.as_raw_bson_ref()) == Ordering::Less
                            }
                            Bound::Unbounded => true,
                        };
                        lo && hi
                    }
                };
                assert!(ok, "{f} matches {d} but sarg {sarg:?} excludes it");
            }
        }
    }
}
