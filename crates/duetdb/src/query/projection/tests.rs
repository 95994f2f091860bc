//! Unit tests of projections: find's forms and errors, `$project`'s computed
//! fields, and the properties both share.

use super::*;
use crate::error::Error;
use crate::query::expr::Root;
use bson::{doc, RawDocumentBuf};
use proptest::prelude::*;

fn proj(spec: Document, d: Document) -> Document {
    let p = Projection::parse(&spec).unwrap_or_else(|e| panic!("{spec:?}: {e}"));
    let raw = RawDocumentBuf::try_from(&d).expect("encode");
    p.apply(&raw).expect("apply")
}

fn parse_err(spec: Document) -> Error {
    Projection::parse(&spec).expect_err("must be refused")
}

fn sample() -> Document {
    doc! {"_id": 1, "a": 1, "b": {"c": 2, "d": 3}, "e": [{"c": 1, "d": 2}, {"d": 4}, 5, [{"c": 9}]]}
}

#[test]
fn empty_is_whole_document() {
    assert_eq!(proj(doc! {}, sample()), sample());
}

#[test]
fn inclusion() {
    assert_eq!(proj(doc! {"a": 1}, sample()), doc! {"_id": 1, "a": 1});
    assert_eq!(
        proj(doc! {"b.c": true, "_id": 0}, sample()),
        doc! {"b": {"c": 2}}
    );
    assert_eq!(
        proj(doc! {"b": {"d": 1}}, sample()),
        doc! {"_id": 1, "b": {"d": 3}}
    );
    // Field order follows the document, not the projection.
    assert_eq!(
        proj(doc! {"b": 1, "a": 2.5}, sample()),
        doc! {"_id": 1, "a": 1, "b": {"c": 2, "d": 3}}
    );
    // Through arrays: documents keep the included fields, scalars are dropped.
    assert_eq!(
        proj(doc! {"e.c": 1, "_id": false}, sample()),
        doc! {"e": [{"c": 1}, {}, [{"c": 9}]]}
    );
    // Missing and scalar-blocked paths.
    assert_eq!(proj(doc! {"zz": 1, "a.x": 1}, sample()), doc! {"_id": 1});
    assert_eq!(proj(doc! {"_id": 1}, sample()), doc! {"_id": 1});
    assert_eq!(proj(doc! {"b.x": 1}, sample()), doc! {"_id": 1, "b": {}});
}

#[test]
fn exclusion() {
    assert_eq!(
        proj(doc! {"a": 0, "b.c": false}, sample()),
        doc! {"_id": 1, "b": {"d": 3}, "e": [{"c": 1, "d": 2}, {"d": 4}, 5, [{"c": 9}]]}
    );
    assert_eq!(
        proj(doc! {"e.d": 0, "_id": 0, "b": 0}, sample()),
        doc! {"a": 1, "e": [{"c": 1}, {}, 5, [{"c": 9}]]}
    );
    assert_eq!(
        proj(doc! {"_id": 0}, doc! {"_id": 1, "x": 2}),
        doc! {"x": 2}
    );
    assert_eq!(
        proj(doc! {"_id": 1, "x": 0}, doc! {"_id": 1, "x": 2, "y": 3}),
        doc! {"_id": 1, "y": 3}
    );
}

#[test]
fn errors() {
    let e = parse_err(doc! {"a": 1, "b": 0});
    assert_eq!(e.code(), 31254);
    assert!(e
        .to_string()
        .contains("Cannot do exclusion on field b in inclusion projection"));
    let e = parse_err(doc! {"a": 0, "b": 1});
    assert_eq!(e.code(), 31253);
    assert!(e
        .to_string()
        .contains("Cannot do inclusion on field b in exclusion projection"));
    // Each error's code (the words are pinned in `tests_find.rs`).
    for (spec, code) in [
        (doc! {"a": 1, "a.b": 1}, 31249),
        (doc! {"a.b": 0, "a": 0}, 31250),
        (doc! {"a": {}}, 51270),
        (doc! {"a.$": 1}, 51050),
        (doc! {"$a": 1}, 16410),
        (doc! {"a": {"$meta": "textScore"}}, 40218),
        (doc! {"a": {"$slice": "x"}}, 28667),
        (doc! {"a": {"$slice": [1, 2, 3, 4]}}, 28667),
        (doc! {"a.b": {"$elemMatch": {"$gt": 1}}}, 31275),
        (doc! {"a": {"$elemMatch": 1}}, 31274),
        (doc! {"a..b": 1}, 15998),
        (doc! {"": 1}, 40352),
    ] {
        assert_eq!(parse_err(spec.clone()).code(), code, "{spec:?}");
    }
}

#[test]
fn slice() {
    let d = doc! {"_id": 1, "a": [1, 2, 3, 4, 5], "b": 7, "n": {"l": [1, 2]}};
    assert_eq!(
        proj(doc! {"a": {"$slice": 2}}, d.clone()),
        doc! {"_id": 1, "a": [1, 2], "b": 7, "n": {"l": [1, 2]}}
    );
    assert_eq!(
        proj(
            doc! {"a": {"$slice": -2}, "_id": 0, "b": 0, "n": 0},
            d.clone()
        ),
        doc! {"a": [4, 5]}
    );
    assert_eq!(
        proj(doc! {"a": {"$slice": [1, 2]}, "b": 1}, d.clone()),
        doc! {"_id": 1, "a": [2, 3], "b": 7}
    );
    assert_eq!(
        proj(doc! {"a": {"$slice": [-2, 5]}, "b": 1}, d.clone()),
        doc! {"_id": 1, "a": [4, 5], "b": 7}
    );
    assert_eq!(
        proj(doc! {"a": {"$slice": [9, 5]}, "b": 1}, d.clone()),
        doc! {"_id": 1, "a": [], "b": 7}
    );
    assert_eq!(
        proj(doc! {"a": {"$slice": -9}, "b": 1}, d.clone()),
        doc! {"_id": 1, "a": [1, 2, 3, 4, 5], "b": 7}
    );
    // A non-array is returned as it is; nested paths work.
    assert_eq!(
        proj(doc! {"b": {"$slice": 1}, "a": 0}, d.clone()),
        doc! {"_id": 1, "b": 7, "n": {"l": [1, 2]}}
    );
    assert_eq!(
        proj(doc! {"n.l": {"$slice": 1}, "_id": 0, "a": 0, "b": 0}, d),
        doc! {"n": {"l": [1]}}
    );
}

#[test]
fn elem_match_scalar_conditions() {
    let d = doc! {"_id": 1, "a": [1, 5, 9], "b": 2};
    // Alone, `$elemMatch` makes an inclusion (MongoDB 4.4+).
    assert_eq!(
        proj(doc! {"a": {"$elemMatch": {"$gt": 3}}}, d.clone()),
        doc! {"_id": 1, "a": [5]}
    );
    assert_eq!(
        proj(doc! {"a": {"$elemMatch": {"$gt": 30}}, "b": 1}, d.clone()),
        doc! {"_id": 1, "b": 2}
    );
    assert_eq!(
        proj(doc! {"a": {"$elemMatch": {"$lt": 30}}, "_id": 0, "b": 1}, d),
        doc! {"b": 2, "a": [1]}
    );
}

#[test]
fn deep_input_is_refused_not_overflowed() {
    let mut deep = Bson::Int32(1);
    for _ in 0..150 {
        deep = Bson::Array(vec![deep]);
    }
    let d = doc! {"a": deep};
    let raw = RawDocumentBuf::try_from(&d).expect("encode");
    let p = Projection::parse(&doc! {"a.b": 1}).expect("parse");
    assert!(matches!(p.apply(&raw), Err(Error::NestingTooDeep { .. })));
}

fn stage(spec: Document, d: &Document) -> Document {
    let p = Projection::parse_stage(&spec).unwrap_or_else(|e| panic!("{spec:?}: {e}"));
    p.apply_to(&Root::Doc(d)).expect("apply")
}

fn stage_err(spec: Document) -> String {
    Projection::parse_stage(&spec)
        .expect_err("must be refused")
        .to_string()
}

#[test]
fn stage_computed_fields() {
    let d = doc! {"_id": 1, "a": {"x": 1}, "arr": [{"x": 1}, 2, [{"x": 3}]], "s": 5};
    // Below a document, an array (each element, a scalar element becoming a
    // document) and a scalar; a missing parent is created at the end.
    assert_eq!(
        stage(
            doc! {"a.y": "$s", "arr.y": {"$add": ["$s", 1]}, "s.z": "$s", "m": {"z": "$s"}},
            &d
        ),
        doc! {"_id": 1, "a": {"y": 5}, "arr": [{"y": 6}, {"y": 6}, [{"y": 6}]], "s": {"z": 5}, "m": {"z": 5}}
    );
    // Computed fields follow included ones; missing leaves the field out.
    assert_eq!(
        stage(
            doc! {"c": "$a.x", "s": 1, "gone": "$$REMOVE", "lit": "x"},
            &d
        ),
        doc! {"_id": 1, "s": 5, "c": 1, "lit": "x"}
    );
    // A computed `_id` is an inclusion of just it (and so cannot sit next
    // to exclusions: `stage_errors`).
    assert_eq!(stage(doc! {"_id": "$s"}, &d), doc! {"_id": 5});
    // `$unset`'s form and the find forms agree with find's projection.
    let raw = RawDocumentBuf::try_from(&d).expect("encode");
    for spec in [doc! {"a": 0, "arr.x": 0}, doc! {"arr.x": 1, "_id": 0}] {
        let find = Projection::parse(&spec).and_then(|p| p.apply(&raw));
        assert_eq!(stage(spec.clone(), &d), find.expect("find"), "{spec:?}");
    }
}

#[test]
fn stage_errors() {
    assert_eq!(
        stage_err(doc! {}),
        "Invalid $project :: caused by :: projection specification must have at least one field"
    );
    assert!(stage_err(doc! {"a": 1, "b": 0}).contains(
        "Invalid $project :: caused by :: Cannot do exclusion on field b in inclusion projection"
    ));
    assert_eq!(
        stage_err(doc! {"a": 0, "b": "$x"}),
        "Invalid $project :: caused by :: Cannot use an expression b: \"$x\" in an exclusion \
         projection"
    );
    assert_eq!(
        stage_err(doc! {"_id": "$s", "a": 0}),
        "Invalid $project :: caused by :: Cannot do exclusion on field a in inclusion projection"
    );
    assert!(stage_err(doc! {"a": 1, "a.b": "$x"}).contains("Path collision at a.b"));
    assert!(stage_err(doc! {"a": {}}).contains("An empty sub-projection"));
    // `$slice` is an expression in `$project`, taking 2 or 3 arguments.
    assert!(stage_err(doc! {"a": {"$slice": 1}}).contains("Expression $slice takes at least 2"));
    // An unknown operator where an expression may stand is 31325, as
    // MongoDB's parser answers; deeper inside an expression, 168.
    for (spec, code, words) in [
        (doc! {"a": {"$frob": 1}}, 31325, "Unknown expression $frob"),
        (
            doc! {"a": {"$add": [{"$frob": 1}]}},
            168,
            "Unrecognized expression '$frob'",
        ),
        (
            doc! {"$a": 1},
            16410,
            "FieldPath field names may not start with '$'. Consider using $getField or \
             $setField.",
        ),
        (
            doc! {"a.$": 1},
            31324,
            "Cannot use positional projection in aggregation projection",
        ),
        (
            doc! {"a..b": 1},
            15998,
            "FieldPath field names may not be empty strings.",
        ),
        (
            doc! {"a": {"$elemMatch": {"b": 1}}},
            168,
            "Cannot use $elemMatch in this context",
        ),
    ] {
        let e = Projection::parse_stage(&spec).expect_err("refused");
        assert_eq!(
            (e.code(), e.to_string()),
            (code, format!("Invalid $project :: caused by :: {words}")),
            "{spec:?}"
        );
    }
    // `$unset` names itself, and a repeated path collides.
    let e = Projection::parse_unset(&["v", "v.w"]).expect_err("refused");
    assert_eq!(
        (e.code(), e.to_string()),
        (
            31249,
            "Invalid $unset :: caused by :: Path collision at v.w remaining portion w".to_string()
        )
    );
    let e = Projection::parse_unset(&["v", "v"]).expect_err("refused");
    assert_eq!(e.code(), 31250);
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]
    /// On flat documents, including a set of fields and excluding its complement
    /// give the same result, and both are sub-documents of the input.
    #[test]
    fn include_and_exclude_complement(
        fields in prop::collection::btree_map("[a-f]", any::<i32>(), 0..6),
        chosen in prop::collection::btree_set("[a-f]", 1..4),
    ) {
        let mut d = doc! {"_id": 0};
        for (k, v) in &fields { d.insert(k.clone(), *v); }
        let mut inc = Document::new();
        let mut exc = Document::new();
        for k in ["a", "b", "c", "d", "e", "f"] {
            if chosen.contains(k) { inc.insert(k, 1); } else { exc.insert(k, 0); }
        }
        let raw = RawDocumentBuf::try_from(&d).expect("encode");
        let a = Projection::parse(&inc).and_then(|p| p.apply(&raw));
        let a = a.map_err(|e| TestCaseError::fail(e.to_string()))?;
        if exc.is_empty() {
            prop_assert_eq!(&a, &d);
        } else {
            let b = Projection::parse(&exc).and_then(|p| p.apply(&raw));
            let b = b.map_err(|e| TestCaseError::fail(e.to_string()))?;
            prop_assert_eq!(&a, &b);
        }
        for (k, v) in &a { prop_assert_eq!(d.get(k), Some(v)); }
    }
}
