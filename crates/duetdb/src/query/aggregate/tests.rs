//! Unit tests of the pipeline internals: sums, canonical representatives,
//! split shapes. Stage semantics are tested end to end in `tests/aggregate.rs`.

use std::cmp::Ordering;

use super::group::SumState;
use super::*;
use bson::doc;

fn run(p: Vec<Document>, docs: Vec<Document>) -> Result<Vec<Document>> {
    Pipeline::parse(&p)?.run_on(docs)
}

#[test]
fn sum_types() {
    let mut s = SumState::default();
    s.add(&Bson::Int32(i32::MAX)).expect("add");
    assert_eq!(s.sum(), Bson::Int32(i32::MAX));
    s.add(&Bson::Int32(1)).expect("add");
    assert_eq!(s.sum(), Bson::Int64(i64::from(i32::MAX) + 1));
    let mut l = SumState::default();
    l.add(&Bson::Int64(1)).expect("add");
    assert_eq!(l.sum(), Bson::Int64(1));
    l.add(&Bson::Int64(i64::MAX)).expect("add");
    assert!(matches!(l.sum(), Bson::Double(_)));
    l.add(&Bson::String("x".into())).expect("ignored");
    assert_eq!(SumState::default().sum(), Bson::Int32(0));
    assert_eq!(SumState::default().avg(), Bson::Null);
}

#[test]
fn canonical_representatives() {
    assert_eq!(
        canonical_cmp(&Bson::Double(1.0), &Bson::Int32(1)),
        Ordering::Less
    );
    assert_eq!(
        canonical_cmp(&Bson::Int32(1), &Bson::Int32(1)),
        Ordering::Equal
    );
    let out = run(
        vec![doc! {"$group": {"_id": "$k", "n": {"$sum": 1}}}],
        vec![doc! {"k": 1.0}, doc! {"k": 1}, doc! {"k": 1_i64}],
    )
    .expect("runs");
    assert_eq!(out.len(), 1);
    assert_eq!(out[0].get("n"), Some(&Bson::Int32(3)));
}

#[test]
fn split_shapes() {
    let p = Pipeline::parse(&[
        doc! {"$match": {"a": 1}},
        doc! {"$match": {"b": 2}},
        doc! {"$project": {"a": 1}},
        doc! {"$group": {"_id": "$a", "n": {"$sum": 1}}},
        doc! {"$sort": {"n": -1}},
    ])
    .expect("parse");
    let s = p.split();
    assert_eq!(s.scan_filter, Some(doc! {"$and": [{"a": 1}, {"b": 2}]}));
    let c = s.commutative.as_ref().expect("commutative");
    assert_eq!(c.stage_names(), vec!["$project", "$group"]);
    assert_eq!(s.rest.stage_names(), vec!["$sort"]);
    assert!(s.olcp_eligible());

    let s = Pipeline::parse(&[
        doc! {"$match": {"a": 1}},
        doc! {"$group": {"_id": null, "f": {"$first": "$a"}}},
    ])
    .expect("parse")
    .split();
    assert!(s.commutative.is_none());
    assert!(!s.olcp_eligible());

    let s = Pipeline::parse(&[doc! {"$sort": {"a": 1}}, doc! {"$limit": 1}])
        .expect("parse")
        .split();
    assert!(s.scan_filter.is_none() && s.commutative.is_none());
    assert!(!s.olcp_eligible());
}

/// Every stage output past 16 MiB is refused with 10334, and `$addFields` /
/// `$project` stop evaluating once their new values alone pass the limit.
#[test]
fn stage_outputs_are_within_the_document_limit() {
    let big = "x".repeat(6 << 20);
    let input = || vec![doc! {"_id": 1, "s": big.clone()}];
    let code = |p: Vec<Document>| run(p, input()).expect_err("too large").code();
    // Three 6 MiB copies: each value fits, the document does not.
    assert_eq!(
        code(vec![doc! {"$addFields": {"a": "$s", "b": "$s", "c": "$s"}}]),
        10334
    );
    assert_eq!(
        code(vec![doc! {"$project": {"a": "$s", "b": "$s", "c": "$s"}}]),
        10334
    );
    assert_eq!(
        code(vec![
            doc! {"$project": {"n": {"a": "$s", "b": "$s", "c": "$s"}}}
        ]),
        10334
    );
    // Input (6 MiB) plus two more copies: the output check catches it.
    assert_eq!(
        code(vec![doc! {"$addFields": {"a": "$s", "b": "$s"}}]),
        10334
    );
    assert_eq!(
        code(vec![doc! {"$group": {
            "_id": null,
            "a": {"$first": "$s"}, "b": {"$last": "$s"}, "c": {"$max": "$s"}
        }}]),
        10334
    );
    assert_eq!(
        code(vec![
            doc! {"$addFields": {"xs": [1, 2]}},
            doc! {"$addFields": {"t": "$s"}},
            doc! {"$unwind": "$xs"},
            doc! {"$addFields": {"u": "$s"}},
        ]),
        10334
    );
    // Right below the limit everything passes.
    let out = run(
        vec![
            doc! {"$addFields": {"a": "$s"}},
            doc! {"$project": {"a": 1}},
        ],
        input(),
    )
    .expect("fits");
    assert_eq!(out.len(), 1);
}
