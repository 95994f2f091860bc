//! Tests of positional (`$`), all-positional (`$[]`) and filtered
//! (`$[<identifier>]`) updates, `$bit`, and pipeline-style updates — cases
//! and messages from MongoDB's manual and its `update_arrayFilters.js`.

use bson::{bson, doc, Bson, DateTime, Document, RawDocumentBuf};

use super::{ApplyContext, UpdateSpec};
use crate::error::{Error, Result};
use crate::query::filter::Filter;

fn ctx(position: Option<usize>) -> ApplyContext {
    ApplyContext {
        is_upsert_insert: false,
        now: DateTime::from_millis(1_700_000_000_123),
        position,
    }
}

/// Apply `spec` with `filters` to `d` as a statement whose query is `q`.
fn run(q: Document, spec: Document, filters: &[Document], d: Document) -> Result<Document> {
    let u = UpdateSpec::parse_with(&spec, filters)?;
    let raw = RawDocumentBuf::try_from(&d).expect("raw");
    let filter = Filter::parse(&q)?;
    let position = filter.match_position(&raw).expect("the query must match");
    u.apply(&d, &ctx(position))
}

fn ok(q: Document, spec: Document, filters: &[Document], d: Document) -> Document {
    run(q, spec.clone(), filters, d).unwrap_or_else(|e| panic!("{spec:?}: {e}"))
}

fn err(q: Document, spec: Document, filters: &[Document], d: Document) -> Error {
    match run(q, spec.clone(), filters, d) {
        Ok(r) => panic!("{spec:?} should fail, got {r:?}"),
        Err(e) => e,
    }
}

fn parse_err(spec: Document, filters: &[Document]) -> Error {
    match UpdateSpec::parse_with(&spec, filters) {
        Ok(_) => panic!("{spec:?} with {filters:?} should not parse"),
        Err(e) => e,
    }
}

#[test]
fn positional_updates_the_matched_element() {
    // The manual's examples.
    let d = doc! {"_id": 1, "grades": [85, 80, 80]};
    assert_eq!(
        ok(
            doc! {"_id": 1, "grades": 80},
            doc! {"$set": {"grades.$": 82}},
            &[],
            d
        ),
        doc! {"_id": 1, "grades": [85, 82, 80]}
    );
    let d = doc! {"_id": 4, "grades": [
    {"grade": 80, "mean": 75, "std": 8},
    {"grade": 85, "mean": 90, "std": 5},
    {"grade": 85, "mean": 85, "std": 8}]};
    let r = ok(
        doc! {"_id": 4, "grades.grade": 85},
        doc! {"$set": {"grades.$.std": 6}},
        &[],
        d.clone(),
    );
    assert_eq!(
        r.get_array("grades").expect("grades")[1],
        bson!({"grade": 85, "mean": 90, "std": 6})
    );
    // $elemMatch picks the element meeting all its conditions.
    let r = ok(
        doc! {"_id": 4, "grades": {"$elemMatch": {"grade": {"$lte": 90}, "mean": {"$gt": 80}}}},
        doc! {"$set": {"grades.$.std": 6}},
        &[],
        d,
    );
    assert_eq!(
        r.get_array("grades").expect("grades")[1],
        bson!({"grade": 85, "mean": 90, "std": 6})
    );
    // Mongoose's pattern: tags.$ after matching a value in tags.
    assert_eq!(
        ok(
            doc! {"tags": "B"},
            doc! {"$set": {"tags.$": "C"}},
            &[],
            doc! {"_id": 1, "tags": ["A", "B"]}
        ),
        doc! {"_id": 1, "tags": ["A", "C"]}
    );
    // The outermost array's position, through nested documents.
    assert_eq!(
        ok(
            doc! {"reviews.stars": {"$gte": 4}},
            doc! {"$inc": {"reviews.$.stars": 1}},
            &[],
            doc! {"_id": 1, "reviews": [{"stars": 2}, {"stars": 4}]}
        ),
        doc! {"_id": 1, "reviews": [{"stars": 2}, {"stars": 5}]}
    );
}

#[test]
fn positional_without_a_matched_position_is_bad_value() {
    let msg = "The positional operator did not find the match needed from the query.";
    for q in [
        doc! {"_id": 1},
        // Negations and $or record nothing, as in MongoDB.
        doc! {"tags": {"$ne": "Z"}},
        doc! {"$or": [{"tags": "A"}, {"x": 1}]},
    ] {
        let e = err(
            q,
            doc! {"$set": {"tags.$": "C"}},
            &[],
            doc! {"_id": 1, "tags": ["A"]},
        );
        assert_eq!(e.code(), 2);
        assert_eq!(e.to_string(), msg);
    }
    // An upsert's new document has no matched position.
    let u = UpdateSpec::parse(&doc! {"$set": {"a.$": 1}}).expect("parse");
    let ins = ApplyContext {
        is_upsert_insert: true,
        ..ctx(None)
    };
    let e = u.apply(&doc! {"a": [0]}, &ins).expect_err("no position");
    assert_eq!(e.to_string(), msg);
}

#[test]
fn all_positional() {
    assert_eq!(
        ok(
            doc! {},
            doc! {"$inc": {"grades.$[]": 10}},
            &[],
            doc! {"_id": 1, "grades": [85, 82, 80]}
        ),
        doc! {"_id": 1, "grades": [95, 92, 90]}
    );
    assert_eq!(
        ok(
            doc! {},
            doc! {"$set": {"a.$[].b": 2}},
            &[],
            doc! {"_id": 0, "a": [{"b": 0}, {"b": 1}]}
        ),
        doc! {"_id": 0, "a": [{"b": 2}, {"b": 2}]}
    );
    assert_eq!(
        ok(
            doc! {},
            doc! {"$unset": {"a.$[]": true}},
            &[],
            doc! {"_id": 0, "a": [0, 1]}
        ),
        doc! {"_id": 0, "a": [null, null]}
    );
    assert_eq!(
        ok(
            doc! {},
            doc! {"$pull": {"a.$[]": 1}},
            &[],
            doc! {"_id": 0, "a": [[0, 1], [1, 2]]}
        ),
        doc! {"_id": 0, "a": [[0], [2]]}
    );
    // An empty array: nothing to update.
    assert_eq!(
        ok(doc! {}, doc! {"$set": {"a.$[]": 1}}, &[], doc! {"a": []}),
        doc! {"a": []}
    );
    // Missing path or a non-array: refused whatever the operator.
    let e = err(
        doc! {},
        doc! {"$unset": {"x.y.$[]": 1}},
        &[],
        doc! {"_id": 0, "x": 5},
    );
    assert_eq!(e.code(), 2);
    assert_eq!(
        e.to_string(),
        "The path 'x.y' must exist in the document in order to apply array updates."
    );
    let e = err(
        doc! {},
        doc! {"$set": {"a.$[]": 1}},
        &[],
        doc! {"_id": 0, "a": 1},
    );
    assert_eq!(
        e.to_string(),
        "Cannot apply array updates to non-array element a: 1"
    );
    // Elements that are not documents cannot take a field.
    let e = err(doc! {}, doc! {"$set": {"a.$[].b": 1}}, &[], doc! {"a": [1]});
    assert_eq!(e.code(), 28);
}

#[test]
fn filtered_positional() {
    let f = |d: Document| vec![d];
    assert_eq!(
        ok(
            doc! {},
            doc! {"$set": {"a.$[i]": 2}},
            &f(doc! {"i": 0}),
            doc! {"_id": 0, "a": [0, 1, 0, 1]}
        ),
        doc! {"_id": 0, "a": [2, 1, 2, 1]}
    );
    assert_eq!(
        ok(
            doc! {},
            doc! {"$set": {"grades.$[e]": 100}},
            &f(doc! {"e": {"$gte": 100}}),
            doc! {"_id": 1, "grades": [95, 102, 90, 150]}
        ),
        doc! {"_id": 1, "grades": [95, 100, 90, 100]}
    );
    assert_eq!(
        ok(
            doc! {},
            doc! {"$min": {"a.$[i].c": 0}},
            &f(doc! {"i.b": 0}),
            doc! {"_id": 0, "a": [{"b": 0, "c": 1}, {"b": 0, "c": -1}, {"b": 1, "c": 1}]}
        ),
        doc! {"_id": 0, "a": [{"b": 0, "c": 0}, {"b": 0, "c": -1}, {"b": 1, "c": 1}]}
    );
    // Arrays of arrays: an element array matches through its elements.
    assert_eq!(
        ok(
            doc! {},
            doc! {"$addToSet": {"a.$[i]": 2}},
            &f(doc! {"i": 0}),
            doc! {"_id": 0, "a": [[0], [1]]}
        ),
        doc! {"_id": 0, "a": [[0, 2], [1]]}
    );
    assert_eq!(
        ok(
            doc! {},
            doc! {"$set": {"a.$[].$[j]": 2}},
            &f(doc! {"j": 0}),
            doc! {"_id": 0, "a": [[0, 1], [0, 1]]}
        ),
        doc! {"_id": 0, "a": [[2, 1], [2, 1]]}
    );
    // Nested filters and a logical filter.
    assert_eq!(
        ok(
            doc! {},
            doc! {"$set": {"a.$[i].c.$[j].d": 2}},
            &[doc! {"i.b": 0}, doc! {"j.d": 0}],
            doc! {"_id": 0, "a": [{"b": 0, "c": [{"d": 0}, {"d": 1}]}, {"b": 1, "c": [{"d": 0}, {"d": 1}]}]}
        ),
        doc! {"_id": 0, "a": [{"b": 0, "c": [{"d": 2}, {"d": 1}]}, {"b": 1, "c": [{"d": 0}, {"d": 1}]}]}
    );
    assert_eq!(
        ok(
            doc! {},
            doc! {"$set": {"a.$[i]": 2}},
            &f(doc! {"$or": [{"i": 0}, {"i": 3}]}),
            doc! {"_id": 0, "a": [0, 1, 3]}
        ),
        doc! {"_id": 0, "a": [2, 1, 2]}
    );
    // Two identifiers that are not disjoint, on different fields: no conflict.
    assert_eq!(
        ok(
            doc! {},
            doc! {"$set": {"a.$[i].b.$[k].c": 1, "a.$[j].b.$[k].d": 1}},
            &[doc! {"i.x": 0}, doc! {"j.x": 0}, doc! {"k.y": 0}],
            doc! {"_id": 0, "a": [{"x": 0, "b": [{"y": 0, "c": 0, "d": 0}]}]}
        ),
        doc! {"_id": 0, "a": [{"x": 0, "b": [{"y": 0, "c": 1, "d": 1}]}]}
    );
}

#[test]
fn filtered_positional_runtime_conflicts() {
    let filters = [doc! {"i.x": 0}, doc! {"j.x": 0}, doc! {"k.y": 0}];
    let d = doc! {"_id": 0, "a": [{"x": 0, "b": [{"y": 0, "c": 0}]}, {"x": 1, "b": [{"y": 0, "c": 0}]}]};
    let e = err(
        doc! {},
        doc! {"$set": {"a.$[i].b.$[k].c": 1, "a.$[j].b.$[k].c": 2}},
        &filters,
        d.clone(),
    );
    assert_eq!(e.code(), 40);
    assert_eq!(e.to_string(), "Update created a conflict at 'a.0.b.$[k].c'");
    // Disjoint filters: fine.
    let filters = [doc! {"i.x": 0}, doc! {"j.x": 1}, doc! {"k.y": 0}];
    assert_eq!(
        ok(
            doc! {},
            doc! {"$set": {"a.$[i].b.$[k].c": 1, "a.$[j].b.$[k].c": 2}},
            &filters,
            d
        ),
        doc! {"_id": 0, "a": [{"x": 0, "b": [{"y": 0, "c": 1}]}, {"x": 1, "b": [{"y": 0, "c": 2}]}]}
    );
    let d = doc! {"_id": 0, "a": [{"x": 0, "b": [{"y": 0, "c": 0}]}, {"x": 1, "b": [{"y": 0, "c": 0}, {"y": 1, "c": 0}]}]};
    let filters = [
        doc! {"i.x": 0},
        doc! {"j.x": 0},
        doc! {"k.y": 0},
        doc! {"m.y": 0},
    ];
    let e = err(
        doc! {},
        doc! {"$set": {"a.$[i].b.$[k].c": 1, "a.$[j].b.$[m].c": 2}},
        &filters,
        d,
    );
    assert_eq!(e.to_string(), "Update created a conflict at 'a.0.b.0.c'");
    // A positional $ and an index naming the same element.
    let e = err(
        doc! {"a": 5},
        doc! {"$set": {"a.$": 1, "a.0": 2}},
        &[],
        doc! {"a": [5]},
    );
    assert_eq!(e.to_string(), "Update created a conflict at 'a.0'");
}

#[test]
fn array_filter_parse_errors() {
    let set = doc! {"$set": {"a.$[i]": 5}};
    let cases: Vec<(Document, Vec<Document>, i32, &str)> = vec![
        (
            set.clone(),
            vec![doc! {"i": 0, "j": 0}],
            9,
            "Error parsing array filter :: caused by :: Expected a single top-level field name, found 'i' and 'j'",
        ),
        (
            doc! {"$set": {"a.$[i]": 5, "a.$[j]": 6}},
            vec![doc! {"i": 0}, doc! {"j": 0}, doc! {"i": 1}],
            9,
            "Found multiple array filters with the same top-level field name i",
        ),
        (
            set.clone(),
            vec![doc! {"i": 0}, doc! {"j": 0}],
            9,
            "The array filter for identifier 'j' was not used in the update { $set: { a.$[i]: 5 } }",
        ),
        (
            doc! {"$set": {"a.$[I]": 1}},
            vec![doc! {"I": 0}],
            2,
            "Error parsing array filter :: caused by :: The top-level field name must be an alphanumeric string beginning with a lowercase letter, found 'I'",
        ),
        (
            set.clone(),
            vec![doc! {}],
            9,
            "Cannot use an expression without a top-level field name in arrayFilters",
        ),
        (
            doc! {"$set": {"a.$[i]": 0}},
            vec![],
            2,
            "No array filter found for identifier 'i' in path 'a.$[i]'",
        ),
        (
            doc! {"$set": {"a.$[i]": 0, "a.$": 0}},
            vec![doc! {"i": 0}],
            40,
            "Updating the path 'a.$' would create a conflict at 'a'",
        ),
        (
            doc! {"$set": {"a.$[i]": 0, "a.0": 0}},
            vec![doc! {"i": 0}],
            40,
            "Updating the path 'a.0' would create a conflict at 'a'",
        ),
        (
            doc! {"$set": {"a.$[i]": 0, "a.b": 0}},
            vec![doc! {"i": 0}],
            40,
            "Updating the path 'a.b' would create a conflict at 'a'",
        ),
        (
            doc! {"$rename": {"a.$[i]": "b"}},
            vec![doc! {"i": 0}],
            2,
            "The source field for $rename may not be dynamic: a.$[i]",
        ),
        (
            doc! {"$rename": {"a": "b"}},
            vec![doc! {"i": 0}],
            9,
            "The array filter for identifier 'i' was not used in the update { $rename: { a: \"b\" } }",
        ),
        (
            doc! {"$rename": {"a.$[]": "b"}},
            vec![],
            2,
            "The source field for $rename may not be dynamic: a.$[]",
        ),
        (
            doc! {"$rename": {"a": "b.$[]"}},
            vec![],
            2,
            "The destination field for $rename may not be dynamic: b.$[]",
        ),
        (
            doc! {"$set": {"a.$.b.$": 1}},
            vec![],
            2,
            "Too many positional (i.e. '$') elements found in path 'a.$.b.$'",
        ),
        (
            doc! {"$set": {"$[].b": 1}},
            vec![],
            2,
            "Cannot have array filter identifier (i.e. '$[<id>]') element in the first position in path '$[].b'",
        ),
        (
            doc! {"$set": {"a": 1}, "$inc": {"a": 1}},
            vec![],
            40,
            "Updating the path 'a' would create a conflict at 'a'",
        ),
        (
            doc! {"$set": {"a.b": 1, "a": 1}},
            vec![],
            40,
            "Updating the path 'a' would create a conflict at 'a'",
        ),
        (
            doc! {"$set": {"a": 1, "a.b": 1}},
            vec![],
            40,
            "Updating the path 'a.b' would create a conflict at 'a'",
        ),
        (
            doc! {"$foo": {"a": 1}},
            vec![],
            9,
            "Unknown modifier: $foo. Expected a valid update modifier or pipeline-style update specified as an array",
        ),
    ];
    for (spec, filters, code, msg) in cases {
        let e = parse_err(spec.clone(), &filters);
        assert_eq!((e.code(), e.to_string().as_str()), (code, msg), "{spec:?}");
    }
    // A good value for arrayFilters.
    assert!(UpdateSpec::parse_with(
        &doc! {"$set": {"a.$[i]": 5, "a.$[j]": 6}},
        &[doc! {"i": 0}, doc! {"j": 0}]
    )
    .is_ok());
}

#[test]
fn dynamic_paths_cut_index_maintenance() {
    let u =
        UpdateSpec::parse_with(&doc! {"$set": {"a.$[i].b": 1}}, &[doc! {"i.b": 0}]).expect("parse");
    assert!(u.may_affect("a.b"));
    assert!(!u.may_affect("c"));
    let u = UpdateSpec::parse(&doc! {"$set": {"tags.$": "x"}}).expect("parse");
    assert!(u.needs_position());
    assert!(u.may_affect("tags"));
}

#[test]
fn bit() {
    let d = doc! {"_id": 1, "expdata": 13i32, "l": 5i64};
    assert_eq!(
        ok(
            doc! {},
            doc! {"$bit": {"expdata": {"and": 10i32}}},
            &[],
            d.clone()
        ),
        doc! {"_id": 1, "expdata": 8i32, "l": 5i64}
    );
    assert_eq!(
        ok(
            doc! {},
            doc! {"$bit": {"expdata": {"or": 5i32}}},
            &[],
            d.clone()
        ),
        doc! {"_id": 1, "expdata": 13i32, "l": 5i64}
    );
    assert_eq!(
        ok(
            doc! {},
            doc! {"$bit": {"expdata": {"xor": 5i32}}},
            &[],
            d.clone()
        ),
        doc! {"_id": 1, "expdata": 8i32, "l": 5i64}
    );
    // int32 with an int64 operand widens; several operations in order.
    assert_eq!(
        ok(
            doc! {},
            doc! {"$bit": {"expdata": {"or": 16i64, "and": 31i32}}},
            &[],
            d.clone()
        ),
        doc! {"_id": 1, "expdata": 29i64, "l": 5i64}
    );
    // A missing field starts from int32 0.
    assert_eq!(
        ok(
            doc! {},
            doc! {"$bit": {"n": {"or": 3i32}}},
            &[],
            doc! {"_id": 1}
        ),
        doc! {"_id": 1, "n": 3i32}
    );
    let e = err(
        doc! {},
        doc! {"$bit": {"s": {"and": 1}}},
        &[],
        doc! {"_id": 1, "s": "x"},
    );
    assert_eq!(
        e.to_string(),
        "Cannot apply $bit to a value of non-integral type._id: 1 has the field s of non-integer type string"
    );
    for (spec, msg) in [
        (
            doc! {"$bit": {"a": 1}},
            "The $bit modifier is not compatible with a int. You must pass in an embedded document: {$bit: {field: {and/or/xor: #}}",
        ),
        (
            doc! {"$bit": {"a": {"not": 1}}},
            "The $bit modifier only supports 'and', 'or', and 'xor', not 'not' which is an unknown operator: {not: 1}",
        ),
        (
            doc! {"$bit": {"a": {"and": 1.5}}},
            "The $bit modifier field must be an Integer(32/64 bit); a 'double' is not supported here: {and: 1.5}",
        ),
        (
            doc! {"$bit": {"a": {}}},
            "You must pass in at least one bitwise operation. The format is: {$bit: {field: {and/or/xor: #}}",
        ),
    ] {
        let e = parse_err(spec, &[]);
        assert_eq!((e.code(), e.to_string().as_str()), (2, msg));
    }
}

fn pipeline(stages: Vec<Document>) -> Result<UpdateSpec> {
    let stages: Vec<Bson> = stages.into_iter().map(Bson::Document).collect();
    UpdateSpec::parse_pipeline(&stages, None, &[])
}

#[test]
fn pipeline_updates() {
    let d = doc! {"_id": 1, "price": 4, "qty": 3, "tmp": 1};
    let u = pipeline(vec![
        doc! {"$set": {"total": {"$multiply": ["$price", "$qty"]}}},
        doc! {"$unset": "tmp"},
    ])
    .expect("parse");
    assert!(u.is_pipeline());
    assert_eq!(
        u.apply(&d, &ctx(None)).expect("apply"),
        doc! {"_id": 1, "price": 4, "qty": 3, "total": 12}
    );
    // $replaceWith drops _id; the update keeps it.
    let u = pipeline(vec![doc! {"$replaceWith": {"v": "$price"}}]).expect("parse");
    assert_eq!(
        u.apply(&d, &ctx(None)).expect("apply"),
        doc! {"_id": 1, "v": 4}
    );
    let u = pipeline(vec![
        doc! {"$replaceRoot": {"newRoot": {"$mergeObjects": [{"q": 0}, "$$ROOT"]}}},
    ])
    .expect("parse");
    assert_eq!(
        u.apply(&d, &ctx(None)).expect("apply"),
        doc! {"_id": 1, "q": 0, "price": 4, "qty": 3, "tmp": 1}
    );
    let u = pipeline(vec![doc! {"$project": {"price": 1}}]).expect("parse");
    assert_eq!(
        u.apply(&d, &ctx(None)).expect("apply"),
        doc! {"_id": 1, "price": 4}
    );
    // Changing _id is 66.
    let u = pipeline(vec![doc! {"$set": {"_id": 2}}]).expect("parse");
    assert_eq!(u.apply(&d, &ctx(None)).expect_err("immutable").code(), 66);
    // A new root that is not a document is 40228.
    let u = pipeline(vec![doc! {"$replaceWith": "$price"}]).expect("parse");
    assert_eq!(
        u.apply(&d, &ctx(None)).expect_err("not a document").code(),
        40228
    );
    // let variables reach the expressions.
    let stages = vec![Bson::Document(doc! {"$set": {"v": "$$k"}})];
    let u = UpdateSpec::parse_pipeline(&stages, Some(&doc! {"k": 7}), &[]).expect("parse");
    assert_eq!(
        u.apply(&doc! {"_id": 1}, &ctx(None)).expect("apply"),
        doc! {"_id": 1, "v": 7}
    );
}

#[test]
fn pipeline_update_errors() {
    let e = pipeline(vec![doc! {"$group": {"_id": null}}]).expect_err("group");
    assert_eq!(
        (e.code(), e.to_string().as_str()),
        (72, "$group is not allowed to be used within an update")
    );
    let e = pipeline(vec![doc! {"$nope": {}}]).expect_err("unknown");
    assert_eq!(e.code(), 40324);
    let e = pipeline(vec![doc! {"$set": {"a": 1}, "$unset": "b"}]).expect_err("two fields");
    assert_eq!(e.code(), 40323);
    let stages = vec![Bson::Document(doc! {"$set": {"a": 1}})];
    let e = UpdateSpec::parse_pipeline(&stages, None, &[doc! {"i": 0}]).expect_err("filters");
    assert_eq!(
        (e.code(), e.to_string().as_str()),
        (
            9,
            "arrayFilters may not be specified for pipeline-style updates"
        )
    );
}

#[test]
fn rename_and_set_through_arrays_as_mongodb() {
    let d = doc! {"_id": 1, "v": [1, 2], "s": 5, "n": {"l": [{"x": 1}]}};
    let e = err(doc! {}, doc! {"$rename": {"s": "v.-1"}}, &[], d.clone());
    assert_eq!(
        (e.code(), e.to_string().as_str()),
        (
            2,
            "The destination field cannot be an array element, 'v.-1' in doc with _id: 1 has an array field called 'v'"
        )
    );
    let e = err(doc! {}, doc! {"$rename": {"n.l.0.x": "y"}}, &[], d.clone());
    assert_eq!(
        e.to_string(),
        "The source field cannot be an array element, 'n.l.0.x' in doc with _id: 1 has an array field called 'l'"
    );
    // A source path that cannot exist is PathNotViable, as MongoDB's
    // findLongestPrefix reports it; a missing source is a no-op.
    let e = err(doc! {}, doc! {"$rename": {"v.foo": "y"}}, &[], d.clone());
    assert_eq!(
        (e.code(), e.to_string().as_str()),
        (
            28,
            "cannot use the part (v of v.foo) to traverse the element ({v: [ 1, 2 ]})"
        )
    );
    let e = err(doc! {}, doc! {"$rename": {"s.t": "y"}}, &[], d.clone());
    assert_eq!(e.code(), 28);
    assert_eq!(
        ok(doc! {}, doc! {"$rename": {"zz": "v.-1"}}, &[], d.clone()),
        d
    );
    // $set through an array by name: 28 with MongoDB's rendering.
    let e = err(doc! {}, doc! {"$set": {"v.foo": 1}}, &[], d);
    assert_eq!(
        (e.code(), e.to_string().as_str()),
        (28, "Cannot create field 'foo' in element {v: [ 1, 2 ]}")
    );
}
