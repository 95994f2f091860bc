//! Tests of update parsing and application, through the public API.

use bson::{doc, Bson, DateTime, Document};

use super::{upsert_seed, ApplyContext, UpdateSpec};
use crate::doc::MAX_DEPTH;
use crate::error::{Error, Result};
use proptest::prelude::*;

fn ctx() -> ApplyContext {
    ApplyContext {
        is_upsert_insert: false,
        now: DateTime::from_millis(1_700_000_000_123),
        position: None,
    }
}

fn upd(spec: Document, d: Document) -> Result<Document> {
    UpdateSpec::parse(&spec)?.apply(&d, &ctx())
}

fn ok(spec: Document, d: Document) -> Document {
    upd(spec.clone(), d).unwrap_or_else(|e| panic!("{spec:?}: {e}"))
}

fn code(spec: Document, d: Document) -> i32 {
    match upd(spec.clone(), d) {
        Ok(r) => panic!("{spec:?} should fail, got {r:?}"),
        Err(e) => e.code(),
    }
}

#[test]
fn set_paths_and_order() {
    let d = doc! {"_id": 1, "x": 1, "a": {"b": 1}};
    assert_eq!(
        ok(doc! {"$set": {"z": 1, "a.c": 2, "x": 5, "b": 0}}, d.clone()),
        doc! {"_id": 1, "x": 5, "a": {"b": 1, "c": 2}, "b": 0, "z": 1}
    );
    assert_eq!(
        ok(doc! {"$set": {"n.m.o": 1}}, doc! {"_id": 1}),
        doc! {"_id": 1, "n": {"m": {"o": 1}}}
    );
    // Numeric components index arrays and pad with null.
    assert_eq!(
        ok(doc! {"$set": {"a.3": "x"}}, doc! {"a": [1]}),
        doc! {"a": [1, null, null, "x"]}
    );
    assert_eq!(
        ok(doc! {"$set": {"a.0.b": 2}}, doc! {"a": [{"b": 1}, 5]}),
        doc! {"a": [{"b": 2}, 5]}
    );
    assert_eq!(
        ok(doc! {"$set": {"a.2.b": 2}}, doc! {"a": []}),
        doc! {"a": [null, null, {"b": 2}]}
    );
    // On a missing field a numeric component names a document field.
    assert_eq!(ok(doc! {"$set": {"a.0": 1}}, doc! {}), doc! {"a": {"0": 1}});
    // Through a scalar, or by name into an array: PathNotViable.
    assert_eq!(code(doc! {"$set": {"a.b": 1}}, doc! {"a": 1}), 28);
    assert_eq!(code(doc! {"$set": {"a.b": 1}}, doc! {"a": [1]}), 28);
    assert_eq!(
        code(doc! {"$inc": {"a.b.c": 1}}, doc! {"a": {"b": "s"}}),
        28
    );
    assert_eq!(code(doc! {"$set": {"a.9999999": 1}}, doc! {"a": []}), 2);
    // Empty operator documents are a no-op.
    assert_eq!(ok(doc! {"$set": {}}, doc! {"a": 1}), doc! {"a": 1});
}

#[test]
fn input_is_not_mutated() {
    let d = doc! {"a": 1};
    let spec = UpdateSpec::parse(&doc! {"$set": {"a": 2}}).expect("parse");
    let r = spec.apply(&d, &ctx()).expect("apply");
    assert_eq!(d, doc! {"a": 1});
    assert_eq!(r, doc! {"a": 2});
}

#[test]
fn parse_errors() {
    for (spec, c) in [
        (doc! {"$foo": {"a": 1}}, 9),
        (doc! {"$set": {"a": 1}, "b": 1}, 9),
        (doc! {"$set": 1}, 9),
        (doc! {"$set": {"": 1}}, 56),
        (doc! {"$set": {"a..b": 1}}, 56),
        (doc! {"$set": {"$.a": 1}}, 2),
        (doc! {"$set": {"a.$.b.$": 1}}, 2),
        (doc! {"$set": {"$[].a": 1}}, 2),
        (doc! {"$set": {"a.$[i]": 1}}, 2),
        (doc! {"$set": {"$x": 1}}, 2),
        (doc! {"a": 1, "$set": {"b": 1}}, 52),
        (doc! {"$inc": {"a": "x"}}, 14),
        (doc! {"$mul": {"a": null}}, 14),
        (doc! {"$pop": {"a": 2}}, 9),
        (doc! {"$rename": {"a": 1}}, 2),
        (doc! {"$rename": {"a": "a"}}, 2),
        (doc! {"$rename": {"a": "a.b"}}, 2),
        (doc! {"$rename": {"a.b": "a"}}, 2),
        (doc! {"$currentDate": {"a": {"$type": "x"}}}, 2),
        (doc! {"$currentDate": {"a": 1}}, 2),
        (doc! {"$push": {"a": {"$each": 1}}}, 2),
        (doc! {"$push": {"a": {"$each": [1], "$foo": 1}}}, 2),
        (doc! {"$push": {"a": {"$each": [1], "$slice": 1.5}}}, 2),
        (doc! {"$push": {"a": {"$each": [1], "$sort": 2}}}, 2),
        (doc! {"$push": {"a": {"$each": [1], "$sort": {}}}}, 2),
        (doc! {"$addToSet": {"a": {"$each": 1}}}, 14),
        (doc! {"$pullAll": {"a": 1}}, 2),
    ] {
        let e = UpdateSpec::parse(&spec).expect_err("must fail");
        assert_eq!(e.code(), c, "{spec:?}: {e}");
    }
    let e = UpdateSpec::parse(&doc! {"$foo": {"a": 1}}).expect_err("unknown");
    assert!(e.to_string().contains("Unknown modifier: $foo"), "{e}");
}

#[test]
fn conflicts() {
    for spec in [
        doc! {"$set": {"a": 1}, "$inc": {"a": 1}},
        doc! {"$set": {"a": 1, "a.b": 1}},
        doc! {"$set": {"a.b.c": 1}, "$unset": {"a.b": 1}},
        doc! {"$rename": {"a": "b"}, "$set": {"b.c": 1}},
        doc! {"$rename": {"a": "b"}, "$set": {"a": 1}},
        doc! {"$setOnInsert": {"x": 1}, "$set": {"x": 2}},
    ] {
        let e = UpdateSpec::parse(&spec).expect_err("conflict");
        assert_eq!(e.code(), 40, "{spec:?}");
        assert!(matches!(e, Error::ConflictingUpdateOperators(_)));
    }
    // Sibling paths and shared prefixes of names are fine.
    assert!(UpdateSpec::parse(&doc! {"$set": {"a.b": 1, "a.c": 1, "ab": 1}}).is_ok());
}

#[test]
fn unset() {
    let d = doc! {"_id": 1, "a": 1, "b": {"c": 1, "d": 2}, "l": [1, 2, 3]};
    assert_eq!(
        ok(
            doc! {"$unset": {"a": "", "b.c": 1, "l.1": true, "zz": 1, "a2.x": 1}},
            d
        ),
        doc! {"_id": 1, "b": {"d": 2}, "l": [1, null, 3]}
    );
    // Through a scalar: nothing to remove.
    assert_eq!(
        ok(doc! {"$unset": {"a.b": 1}}, doc! {"a": 1}),
        doc! {"a": 1}
    );
}

#[test]
fn inc_and_mul_types() {
    assert_eq!(ok(doc! {"$inc": {"a": 1}}, doc! {"a": 1}), doc! {"a": 2});
    assert_eq!(
        ok(doc! {"$inc": {"a": 1}}, doc! {"a": i32::MAX}),
        doc! {"a": i64::from(i32::MAX) + 1}
    );
    assert_eq!(
        ok(doc! {"$inc": {"a": 1i64}}, doc! {"a": 1}),
        doc! {"a": 2i64}
    );
    assert_eq!(
        ok(doc! {"$inc": {"a": 0.5}}, doc! {"a": 1}),
        doc! {"a": 1.5}
    );
    assert_eq!(
        ok(doc! {"$inc": {"a": 2}}, doc! {"a": 1.5}),
        doc! {"a": 3.5}
    );
    assert_eq!(
        ok(doc! {"$inc": {"a.b": 5i64}}, doc! {}),
        doc! {"a": {"b": 5i64}}
    );
    // int64 overflow is an error, as in MongoDB.
    assert_eq!(code(doc! {"$inc": {"a": 1}}, doc! {"a": i64::MAX}), 2);
    assert_eq!(code(doc! {"$mul": {"a": 2}}, doc! {"a": i64::MAX}), 2);
    let e = upd(doc! {"$inc": {"a": 1}}, doc! {"_id": 7, "a": "s"}).expect_err("type");
    assert_eq!(e.code(), 14);
    assert!(
        e.to_string().contains("'a'") && e.to_string().contains("string"),
        "{e}"
    );
    assert_eq!(code(doc! {"$mul": {"a": 2}}, doc! {"a": null}), 14);
    assert_eq!(ok(doc! {"$mul": {"a": 3}}, doc! {"a": 4}), doc! {"a": 12});
    assert_eq!(
        ok(doc! {"$mul": {"a": 65536}}, doc! {"a": 65536}),
        doc! {"a": 65536i64 * 65536}
    );
    assert_eq!(
        ok(doc! {"$mul": {"a": 2.0}}, doc! {"a": 2i64}),
        doc! {"a": 4.0}
    );
    // $mul of a missing field creates zero of the multiplier's type.
    assert_eq!(ok(doc! {"$mul": {"a": 5i64}}, doc! {}), doc! {"a": 0i64});
    assert_eq!(ok(doc! {"$mul": {"a": 5.5}}, doc! {}), doc! {"a": 0.0});
    assert_eq!(
        ok(doc! {"$inc": {"a.1": 1}}, doc! {"a": [1, 2]}),
        doc! {"a": [1, 3]}
    );
}

#[test]
fn min_max() {
    assert_eq!(ok(doc! {"$min": {"a": 3}}, doc! {"a": 5}), doc! {"a": 3});
    assert_eq!(ok(doc! {"$min": {"a": 7}}, doc! {"a": 5}), doc! {"a": 5});
    assert_eq!(ok(doc! {"$max": {"a": 7}}, doc! {"a": 5}), doc! {"a": 7});
    assert_eq!(ok(doc! {"$max": {"a": 5.0}}, doc! {"a": 5}), doc! {"a": 5});
    assert_eq!(ok(doc! {"$min": {"a": 1}}, doc! {}), doc! {"a": 1});
    // Cross-type order: null < numbers < strings.
    assert_eq!(
        ok(doc! {"$min": {"a": null}}, doc! {"a": 1}),
        doc! {"a": null}
    );
    assert_eq!(
        ok(doc! {"$max": {"a": "s"}}, doc! {"a": 100}),
        doc! {"a": "s"}
    );
}

#[test]
fn rename() {
    let d = doc! {"_id": 1, "a": 1, "b": {"c": 2}, "l": [{"x": 1}]};
    assert_eq!(
        ok(doc! {"$rename": {"a": "z", "b.c": "b.d"}}, d.clone()),
        doc! {"_id": 1, "b": {"d": 2}, "l": [{"x": 1}], "z": 1}
    );
    assert_eq!(ok(doc! {"$rename": {"nope": "z"}}, d.clone()), d);
    assert_eq!(code(doc! {"$rename": {"l.0.x": "y"}}, d.clone()), 2);
    assert_eq!(code(doc! {"$rename": {"a": "l.0.x"}}, d.clone()), 2);
    assert_eq!(code(doc! {"$rename": {"_id": "id"}}, d.clone()), 66);
    assert_eq!(code(doc! {"$rename": {"a": "b.c.d"}}, d), 28);
}

#[test]
fn push_modifiers() {
    assert_eq!(ok(doc! {"$push": {"a": 1}}, doc! {}), doc! {"a": [1]});
    assert_eq!(
        ok(doc! {"$push": {"a": [1]}}, doc! {"a": [0]}),
        doc! {"a": [0, [1]]}
    );
    assert_eq!(
        ok(doc! {"$push": {"a": {"x": 1}}}, doc! {"a": []}),
        doc! {"a": [{"x": 1}]}
    );
    assert_eq!(
        ok(
            doc! {"$push": {"a": {"$each": [3, 4], "$position": 1}}},
            doc! {"a": [1, 2]}
        ),
        doc! {"a": [1, 3, 4, 2]}
    );
    assert_eq!(
        ok(
            doc! {"$push": {"a": {"$each": [9], "$position": -1}}},
            doc! {"a": [1, 2]}
        ),
        doc! {"a": [1, 9, 2]}
    );
    assert_eq!(
        ok(
            doc! {"$push": {"a": {"$each": [9], "$position": 99}}},
            doc! {"a": [1]}
        ),
        doc! {"a": [1, 9]}
    );
    assert_eq!(
        ok(
            doc! {"$push": {"a": {"$each": [5, 0], "$sort": -1, "$slice": 3}}},
            doc! {"a": [3, 1, 4]}
        ),
        doc! {"a": [5, 4, 3]}
    );
    assert_eq!(
        ok(
            doc! {"$push": {"a": {"$each": [5], "$slice": -2}}},
            doc! {"a": [1, 2, 3]}
        ),
        doc! {"a": [3, 5]}
    );
    assert_eq!(
        ok(
            doc! {"$push": {"a": {"$each": [], "$slice": 0}}},
            doc! {"a": [1]}
        ),
        doc! {"a": []}
    );
    assert_eq!(
        ok(
            doc! {"$push": {"a": {"$each": [{"s": 2}], "$sort": {"s": 1}}}},
            doc! {"a": [{"s": 3}, {"s": 1}]}
        ),
        doc! {"a": [{"s": 1}, {"s": 2}, {"s": 3}]}
    );
    assert_eq!(code(doc! {"$push": {"a": 1}}, doc! {"a": 1}), 2);
}

#[test]
fn add_to_set_pop_pull() {
    assert_eq!(
        ok(doc! {"$addToSet": {"a": 1.0}}, doc! {"a": [1]}),
        doc! {"a": [1]}
    );
    assert_eq!(
        ok(
            doc! {"$addToSet": {"a": {"$each": [2, 2, 3, 1]}}},
            doc! {"a": [1]}
        ),
        doc! {"a": [1, 2, 3]}
    );
    assert_eq!(
        ok(doc! {"$addToSet": {"a": [1]}}, doc! {}),
        doc! {"a": [[1]]}
    );
    assert_eq!(code(doc! {"$addToSet": {"a": 1}}, doc! {"a": 5}), 2);

    assert_eq!(
        ok(doc! {"$pop": {"a": 1}}, doc! {"a": [1, 2, 3]}),
        doc! {"a": [1, 2]}
    );
    assert_eq!(
        ok(doc! {"$pop": {"a": -1}}, doc! {"a": [1, 2, 3]}),
        doc! {"a": [2, 3]}
    );
    assert_eq!(ok(doc! {"$pop": {"a": 1}}, doc! {"a": []}), doc! {"a": []});
    assert_eq!(ok(doc! {"$pop": {"a": 1}}, doc! {}), doc! {});
    assert_eq!(code(doc! {"$pop": {"a": 1}}, doc! {"a": 3}), 14);

    let d = doc! {"a": [1, 5, 1.0, "x", [1], 7, 9]};
    assert_eq!(
        ok(doc! {"$pull": {"a": 1}}, d.clone()),
        doc! {"a": [5, "x", [1], 7, 9]}
    );
    assert_eq!(
        ok(doc! {"$pull": {"a": {"$gte": 5, "$ne": 7}}}, d.clone()),
        doc! {"a": [1, 1.0, "x", [1], 7]}
    );
    assert_eq!(
        ok(doc! {"$pull": {"a": {"$in": ["x", 9]}}}, d.clone()),
        doc! {"a": [1, 5, 1.0, [1], 7]}
    );
    assert_eq!(
        ok(doc! {"$pull": {"a": {"$lt": 2}}}, d.clone()),
        doc! {"a": [5, "x", 7, 9]}
    );
    assert_eq!(
        ok(doc! {"$pullAll": {"a": [1, 9, [1]]}}, d),
        doc! {"a": [5, "x", 7]}
    );
    assert_eq!(ok(doc! {"$pull": {"a": 1}}, doc! {}), doc! {});
    assert_eq!(code(doc! {"$pull": {"a": 1}}, doc! {"a": 1}), 2);
}

#[test]
fn current_date_and_set_on_insert() {
    let r = ok(
        doc! {"$currentDate": {"d": true, "t": {"$type": "timestamp"}}},
        doc! {},
    );
    assert_eq!(r.get("d"), Some(&Bson::DateTime(ctx().now)));
    assert!(matches!(r.get("t"), Some(Bson::Timestamp(t)) if t.time == 1_700_000_000));
    let spec =
        UpdateSpec::parse(&doc! {"$setOnInsert": {"x": 1}, "$set": {"y": 1}}).expect("parse");
    assert_eq!(spec.apply(&doc! {}, &ctx()).expect("apply"), doc! {"y": 1});
    let ins = ApplyContext {
        is_upsert_insert: true,
        ..ctx()
    };
    assert_eq!(
        spec.apply(&doc! {}, &ins).expect("apply"),
        doc! {"x": 1, "y": 1}
    );
}

#[test]
fn id_is_immutable() {
    let d = doc! {"_id": 1, "a": 1};
    assert_eq!(code(doc! {"$set": {"_id": 2}}, d.clone()), 66);
    assert_eq!(code(doc! {"$unset": {"_id": 1}}, d.clone()), 66);
    assert_eq!(code(doc! {"$inc": {"_id": 1}}, d.clone()), 66);
    assert_eq!(
        code(doc! {"$set": {"_id.x": 1}}, doc! {"_id": {"y": 1}}),
        66
    );
    assert_eq!(
        ok(doc! {"$set": {"_id": 1, "a": 2}}, d.clone()),
        doc! {"_id": 1, "a": 2}
    );
    // Replacement: keeps the old _id, first; a different _id is refused.
    assert_eq!(ok(doc! {"b": 2}, d.clone()), doc! {"_id": 1, "b": 2});
    assert_eq!(
        ok(doc! {"b": 2, "_id": 1}, d.clone()),
        doc! {"_id": 1, "b": 2}
    );
    assert_eq!(code(doc! {"_id": 2, "b": 2}, d.clone()), 66);
    assert_eq!(ok(doc! {}, d.clone()), doc! {"_id": 1});
    // An upsert seed without _id may get one; it is moved first.
    let ins = ApplyContext {
        is_upsert_insert: true,
        ..ctx()
    };
    let spec = UpdateSpec::parse(&doc! {"$set": {"_id": 5}}).expect("parse");
    assert_eq!(
        spec.apply(&doc! {"a": 1}, &ins).expect("apply"),
        doc! {"_id": 5, "a": 1}
    );
}

#[test]
fn replacement() {
    let spec = UpdateSpec::parse(&doc! {"x": 1, "y": {"z": 2}}).expect("parse");
    assert!(spec.is_replacement());
    assert!(!UpdateSpec::parse(&doc! {"$set": {"a": 1}})
        .expect("p")
        .is_replacement());
    assert_eq!(
        spec.apply(&doc! {"_id": "k", "old": 1}, &ctx())
            .expect("apply"),
        doc! {"_id": "k", "x": 1, "y": {"z": 2}}
    );
    assert_eq!(spec.modified_paths(), vec![String::new()]);
    assert!(spec.may_affect("anything.at.all"));
}

#[test]
fn modified_paths_and_may_affect() {
    let spec = UpdateSpec::parse(&doc! {
        "$set": {"a.0.b": 1, "c.d": 1},
        "$rename": {"e": "f"},
    })
    .expect("parse");
    let mut m = spec.modified_paths();
    m.sort();
    assert_eq!(m, vec!["a", "c.d", "e", "f"]);
    assert!(spec.may_affect("a.b"));
    assert!(spec.may_affect("c"));
    assert!(spec.may_affect("c.d.e"));
    assert!(!spec.may_affect("c.x"));
    assert!(!spec.may_affect("g"));
    assert!(spec.may_affect("e"));
}

#[test]
fn upsert_seed_cases() {
    let f = doc! {
        "_id": 3,
        "a": 1,
        "b.c": "x",
        "g": {"$gt": 5},
        "h": {"$eq": [1, 2]},
        "i": {"$in": [7]},
        "j": {"$in": [7, 8]},
        "$and": [{"k": 1}, {"l": {"$lt": 1}}],
        "$or": [{"m": 1}],
        "n": {"sub": 1},
    };
    assert_eq!(
        upsert_seed(&f).expect("seed"),
        doc! {"_id": 3, "a": 1, "b": {"c": "x"}, "h": [1, 2], "i": 7, "k": 1, "n": {"sub": 1}}
    );
    assert_eq!(upsert_seed(&doc! {}).expect("seed"), doc! {});
    assert_eq!(
        upsert_seed(&doc! {"x": 1, "_id": 2}).expect("seed"),
        doc! {"_id": 2, "x": 1}
    );
    assert_eq!(
        upsert_seed(&doc! {"a": 1, "$and": [{"a": 2}]})
            .expect_err("twice")
            .code(),
        2
    );
    assert_eq!(
        upsert_seed(&doc! {"a": 1, "a.b": 2})
            .expect_err("prefix")
            .code(),
        2
    );
    assert!(upsert_seed(&doc! {"a.b": 1, "a.c": 2}).is_ok());
}

#[test]
fn nesting_limit() {
    let mut deep = Bson::Int32(1);
    for _ in 0..MAX_DEPTH {
        deep = Bson::Document(doc! {"x": deep});
    }
    let e = upd(doc! {"$set": {"a": deep.clone()}}, doc! {}).expect_err("too deep");
    assert!(matches!(e, Error::NestingTooDeep { .. }));
    let mut shallow = Bson::Int32(1);
    for _ in 0..MAX_DEPTH - 2 {
        shallow = Bson::Document(doc! {"x": shallow});
    }
    assert!(upd(doc! {"$set": {"a": shallow}}, doc! {}).is_ok());
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]
    /// $set/$inc/$unset on flat documents agree with a map model.
    #[test]
    fn flat_ops_agree_with_model(
        start in prop::collection::btree_map("[a-e]", -100i32..100, 0..5),
        sets in prop::collection::btree_map("[a-e]", -100i32..100, 0..3),
        incs in prop::collection::btree_map("[f-j]", -100i32..100, 0..3),
        unsets in prop::collection::btree_set("[k-o]", 0..3),
        unset_existing in any::<bool>(),
    ) {
        let mut d = Document::new();
        for (k, v) in &start { d.insert(k.clone(), *v); }
        let mut model: std::collections::BTreeMap<String, i32> = start.clone();
        let mut spec = Document::new();
        let mut set = Document::new();
        for (k, v) in &sets { set.insert(k.clone(), *v); model.insert(k.clone(), *v); }
        let mut inc = Document::new();
        for (k, v) in &incs {
            inc.insert(k.clone(), *v);
            let base = model.get(k).copied().unwrap_or(0);
            model.insert(k.clone(), base + v);
        }
        let mut unset = Document::new();
        for k in &unsets { unset.insert(k.clone(), ""); model.remove(k); }
        if unset_existing {
            if let Some(k) = start.keys().find(|k| !sets.contains_key(*k)) {
                unset.insert(k.clone(), 1);
                model.remove(k);
            }
        }
        spec.insert("$set", set);
        spec.insert("$inc", inc);
        spec.insert("$unset", unset);
        let out = UpdateSpec::parse(&spec).and_then(|s| s.apply(&d, &ctx()));
        let out = out.map_err(|e| TestCaseError::fail(e.to_string()))?;
        let got: std::collections::BTreeMap<String, i32> = out
            .iter()
            .map(|(k, v)| (k.clone(), v.as_i32().unwrap_or(i32::MIN)))
            .collect();
        prop_assert_eq!(got, model);
        // Existing fields keep their relative order.
        let kept: Vec<&String> = out.keys().filter(|k| start.contains_key(*k)).collect();
        let mut sorted = kept.clone();
        sorted.sort();
        prop_assert_eq!(kept, sorted);
    }
}

#[test]
fn inc_and_mul_on_decimal128_are_exact() {
    let dec = |s: &str| Bson::Decimal128(s.parse().expect("decimal"));
    // 0.1 + 0.2 is exactly 0.3 in decimal (a double would give 0.30000000000000004).
    let d = ok(
        doc! {"$inc": {"a": dec("0.2")}},
        doc! {"_id": 1, "a": dec("0.1")},
    );
    assert_eq!(d.get("a"), Some(&dec("0.3")));
    // An integer meeting a decimal becomes a decimal.
    let d = ok(doc! {"$inc": {"a": dec("1.5")}}, doc! {"_id": 1, "a": 2});
    assert_eq!(d.get("a"), Some(&dec("3.5")));
    // A double meeting a decimal is first rounded to 15 significant digits.
    let d = ok(doc! {"$mul": {"a": dec("10")}}, doc! {"_id": 1, "a": 0.1});
    assert_eq!(d.get("a"), Some(&dec("1.000000000000000")));
    // $mul on a missing field sets zero of the multiplier's type.
    let d = ok(doc! {"$mul": {"a": dec("3")}}, doc! {"_id": 1});
    assert_eq!(d.get("a"), Some(&dec("0")));
    // $inc on a missing field sets the increment itself.
    let d = ok(doc! {"$inc": {"a": dec("-7.25")}}, doc! {"_id": 1});
    assert_eq!(d.get("a"), Some(&dec("-7.25")));
    // A non-numeric current value is still a type mismatch.
    assert_eq!(
        code(doc! {"$inc": {"a": dec("1")}}, doc! {"_id": 1, "a": "x"}),
        14
    );
}

/// Under a collation `$pull`'s query conditions compare by it; giving the
/// collation twice keeps the first (operands are not keyed twice).
#[test]
fn a_collated_update_keys_its_conditions_once() {
    let ci = crate::doc::collation::Collator::from_document(&doc! {"locale": "en", "strength": 2})
        .expect("valid");
    let spec = UpdateSpec::parse(&doc! {"$pull": {"g": {"k": "X"}}})
        .expect("parse")
        .with_collation(ci.clone())
        .with_collation(ci);
    let doc = doc! {"_id": 1, "g": [{"k": "x"}, {"k": "q"}, {"k": "y"}]};
    let ctx = ApplyContext {
        is_upsert_insert: false,
        now: bson::DateTime::now(),
        position: None,
    };
    let out = spec.apply(&doc, &ctx).expect("apply");
    assert_eq!(
        out.get_array("g").ok(),
        Some(&vec![
            Bson::Document(doc! {"k": "q"}),
            Bson::Document(doc! {"k": "y"})
        ])
    );
}

/// A value for the raw-patch property test: the types `$inc` meets and
/// others it must refuse, nested values, and the edge integers.
fn arb_value() -> impl Strategy<Value = Bson> {
    let leaf = prop_oneof![
        any::<i32>().prop_map(Bson::Int32),
        prop_oneof![Just(i64::MAX), Just(i64::MIN), any::<i64>()].prop_map(Bson::Int64),
        prop_oneof![Just(f64::NAN), Just(-0.0), any::<f64>()].prop_map(Bson::Double),
        (-1000i64..1000).prop_map(|n| Bson::Decimal128(
            format!("{n}.5")
                .parse()
                .unwrap_or_else(|_| bson::Decimal128::from_bytes([0; 16]))
        )),
        "[a-z]{0,6}".prop_map(Bson::String),
        Just(Bson::Null),
        any::<bool>().prop_map(Bson::Boolean),
    ];
    leaf.prop_recursive(3, 12, 3, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..3).prop_map(Bson::Array),
            prop::collection::btree_map("[a-c]", inner, 0..3)
                .prop_map(|m| Bson::Document(m.into_iter().collect())),
        ]
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(400))]
    /// The raw patch (`raw.rs`) of top-level `$set`/`$inc`/`$unset`/
    /// `$setOnInsert`, when it answers, is byte for byte the general path's
    /// document; when the general path fails, the patch does not answer.
    #[test]
    fn raw_patch_is_the_general_path_byte_for_byte(
        start in prop::collection::btree_map("[a-f]", arb_value(), 0..6),
        ops in prop::collection::btree_map(
            "[a-h]",
            (0..4u8, arb_value()),
            1..4,
        ),
        repeat in prop::option::of(("[a-f]", arb_value())),
    ) {
        let mut d = doc! {"_id": 7};
        for (k, v) in &start { d.insert(k.clone(), v.clone()); }
        let mut spec = Document::new();
        for (k, (op, v)) in &ops {
            let name = ["$set", "$inc", "$unset", "$setOnInsert"][usize::from(*op)];
            let arg = if *op == 1 { Bson::Int32(3) } else { v.clone() };
            let arg = if *op == 1 && matches!(v, Bson::Int64(_) | Bson::Double(_)) { v.clone() } else { arg };
            let entry = spec.entry(name.to_string()).or_insert_with(|| Bson::Document(Document::new()));
            if let Bson::Document(e) = entry { e.insert(k.clone(), arg); }
        }
        let Ok(u) = UpdateSpec::parse(&spec) else { return Ok(()) };
        let mut old = crate::doc::to_raw_document(&d).map_err(|e| TestCaseError::fail(e.to_string()))?;
        // A name stored twice (BSON allows it): the update addresses the
        // first occurrence and keeps the other (`doc/repeated.rs`).
        if let Some((k, v)) = &repeat {
            let v = bson::RawBson::try_from(v.clone()).map_err(|e| TestCaseError::fail(e.to_string()))?;
            old.append(bson::raw::CString::try_from(k.as_str()).map_err(|e| TestCaseError::fail(e.to_string()))?, v);
        }
        let general = crate::doc::repeated::to_document_marked(&old)
            .and_then(|d| u.apply(&d, &ctx()))
            .and_then(|n| crate::doc::repeated::to_raw_unmarked(&n));
        match (u.patch_raw(&old), general) {
            (Some(p), Ok(g)) => prop_assert_eq!(p.as_bytes(), g.as_bytes(), "{:?}", spec),
            (Some(p), Err(e)) => prop_assert!(false, "patched {:?} where the general path fails: {}", p, e),
            (None, _) => {}
        }
    }
}

#[test]
fn raw_patch_answers_the_common_updates() {
    let d = doc! {"_id": 1, "a": 1, "b": "x", "c": {"d": 1}};
    let old = crate::doc::to_raw_document(&d).expect("encodes");
    for (spec, want) in [
        (
            doc! {"$set": {"b": "yy"}},
            doc! {"_id": 1, "a": 1, "b": "yy", "c": {"d": 1}},
        ),
        (
            doc! {"$inc": {"a": 2_i64}},
            doc! {"_id": 1, "a": 3_i64, "b": "x", "c": {"d": 1}},
        ),
        (
            doc! {"$unset": {"c": ""}, "$set": {"z": 1, "e": [1]}},
            doc! {"_id": 1, "a": 1, "b": "x", "e": [1], "z": 1},
        ),
        (
            doc! {"$setOnInsert": {"q": 1}, "$inc": {"n": 1.5}},
            doc! {"_id": 1, "a": 1, "b": "x", "c": {"d": 1}, "n": 1.5},
        ),
    ] {
        let u = UpdateSpec::parse(&spec).expect("parses");
        let got = u
            .patch_raw(&old)
            .unwrap_or_else(|| panic!("{spec:?} not patched"));
        assert_eq!(
            crate::doc::to_document(&got).expect("decodes"),
            want,
            "{spec:?}"
        );
    }
    // What the patch leaves to the general path.
    for spec in [
        doc! {"$set": {"c.d": 2}},
        doc! {"$inc": {"b": 1}},
        doc! {"$inc": {"a": i64::MAX}},
        doc! {"$push": {"e": 1}},
        doc! {"$set": {"_id": 1}},
    ] {
        let u = UpdateSpec::parse(&spec).expect("parses");
        assert!(u.patch_raw(&old).is_none(), "{spec:?}");
    }
}
