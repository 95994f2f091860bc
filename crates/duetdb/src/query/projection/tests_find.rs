//! Unit tests of find's projection as MongoDB 4.4+ has it: computed fields
//! and variables, the kind rules (`computeProjectionType`), `$elemMatch` and
//! `$slice` beside expressions, positional `a.$`, collation, and every error
//! code of the parser with MongoDB's words.

use bson::{doc, Bson, Document, RawDocumentBuf};

use super::*;
use crate::error::Error;

fn raw(d: &Document) -> RawDocumentBuf {
    RawDocumentBuf::try_from(d).expect("encode")
}

/// `spec` applied to `d` by a find whose filter is `query`.
fn run(spec: Document, query: Document, d: &Document) -> Result<Document> {
    Projection::parse_find(&spec, Some(&query), None)?.apply(&raw(d))
}

fn ok(spec: Document, d: &Document) -> Document {
    run(spec.clone(), doc! {}, d).unwrap_or_else(|e| panic!("{spec:?}: {e}"))
}

/// The parse error of `spec` in a find with an empty filter.
fn refused(spec: Document) -> (i32, String) {
    let e = Projection::parse_find(&spec, Some(&doc! {}), None).expect_err("must be refused");
    (e.code(), e.to_string())
}

fn sample() -> Document {
    doc! {"_id": 1, "a": 1, "s": "abc", "n": {"m": 2, "k": 3}, "arr": [{"x": 1, "y": 1}, {"x": 5, "y": 2}, 7]}
}

#[test]
fn computed_fields_of_every_form() {
    let d = sample();
    assert_eq!(ok(doc! {"t": "$a"}, &d), doc! {"_id": 1, "t": 1});
    assert_eq!(
        ok(doc! {"t": {"$add": ["$a", 1]}}, &d),
        doc! {"_id": 1, "t": 2}
    );
    assert_eq!(
        ok(doc! {"t": "$$ROOT"}, &d),
        doc! {"_id": 1, "t": d.clone()}
    );
    assert_eq!(ok(doc! {"t": "$$CURRENT.n.m", "_id": 0}, &d), doc! {"t": 2});
    assert_eq!(
        ok(doc! {"t": {"$literal": 5}, "u": {"$literal": "$a"}}, &d),
        doc! {"_id": 1, "t": 5, "u": "$a"}
    );
    // Included fields in document order, then computed ones in spec order.
    assert_eq!(
        ok(doc! {"u": {"$toUpper": "$s"}, "a": 1}, &d),
        doc! {"_id": 1, "a": 1, "u": "ABC"}
    );
    // A value that is not a number, boolean or object is an operand: a
    // constant, an array of expressions, null.
    assert_eq!(
        ok(doc! {"t": "x", "l": [1, "$a"], "z": Bson::Null}, &d),
        doc! {"_id": 1, "t": "x", "l": [1, 1], "z": Bson::Null}
    );
    // Documents of expressions, nested or dotted; a missing value is no field.
    assert_eq!(
        ok(
            doc! {"n": {"m": "$a", "q": {"$literal": 1}}, "gone": "$zz"},
            &d
        ),
        doc! {"_id": 1, "n": {"m": 1, "q": 1}}
    );
    assert_eq!(
        ok(doc! {"n.m": "$a", "n.k": 1, "r": "$$REMOVE"}, &d),
        doc! {"_id": 1, "n": {"k": 3, "m": 1}}
    );
    // `_id`: excluded beside expressions, or computed itself.
    assert_eq!(ok(doc! {"_id": 0, "t": "$a"}, &d), doc! {"t": 1});
    assert_eq!(ok(doc! {"_id": "$s"}, &d), doc! {"_id": "abc"});
    // `$slice` whose arguments are not find's form is the expression.
    assert_eq!(
        ok(doc! {"arr": {"$slice": ["$arr", -1]}, "_id": 0}, &d),
        doc! {"arr": [7]}
    );
}

#[test]
fn command_variables_now_and_cluster_time() {
    let d = sample();
    let lets = doc! {"x": 3, "y": {"$add": [1, 2]}, "o": {"k": "v"}};
    let p = Projection::parse_find(
        &doc! {"t": "$$x", "u": "$$y", "v": "$$o.k", "w": {"$add": ["$a", "$$x"]}},
        Some(&doc! {}),
        Some(&lets),
    )
    .expect("parse");
    assert_eq!(
        p.apply(&raw(&d)).expect("apply"),
        doc! {"_id": 1, "t": 3, "u": 3, "v": "v", "w": 4}
    );
    // Without the variable: MongoDB's 17276.
    assert_eq!(
        refused(doc! {"t": "$$x"}),
        (17276, "Use of undefined variable: x".to_string())
    );
    // `$$NOW` is read once per parse; `$$CLUSTER_TIME` is the read's time.
    let p = crate::query::expr::under_read_time((7 << 32) | 9, || {
        Projection::parse(&doc! {"now": "$$NOW", "ct": "$$CLUSTER_TIME"})
    })
    .expect("parse");
    let a = p.apply(&raw(&d)).expect("apply");
    let b = p.apply(&raw(&doc! {"_id": 2})).expect("apply");
    assert_eq!(a.get("now"), b.get("now"));
    assert!(matches!(a.get("now"), Some(Bson::DateTime(_))));
    assert_eq!(
        a.get("ct"),
        Some(&Bson::Timestamp(bson::Timestamp {
            time: 7,
            increment: 9
        }))
    );
}

#[test]
fn the_kind_follows_mongodbs_rules() {
    let d = doc! {"_id": 1, "arr": [1, 2, 3], "b": 2, "s": "x"};
    // `$slice` alone, or with `_id: 0`: an exclusion; with `_id: 1`: an inclusion.
    assert_eq!(
        ok(doc! {"arr": {"$slice": 1}}, &d),
        doc! {"_id": 1, "arr": [1], "b": 2, "s": "x"}
    );
    assert_eq!(
        ok(doc! {"arr": {"$slice": 1}, "_id": 0}, &d),
        doc! {"arr": [1], "b": 2, "s": "x"}
    );
    assert_eq!(
        ok(doc! {"_id": 1, "arr": {"$slice": -1}}, &d),
        doc! {"_id": 1, "arr": [3]}
    );
    // `$elemMatch` without `$slice`: an inclusion, whatever `_id` says.
    assert_eq!(
        ok(doc! {"arr": {"$elemMatch": {"$gt": 1}}, "_id": 0}, &d),
        doc! {"arr": [2]}
    );
    // Beside an exclusion it replaces the field in place (or drops it).
    assert_eq!(
        ok(doc! {"arr": {"$elemMatch": {"$gt": 1}}, "s": 0}, &d),
        doc! {"_id": 1, "arr": [2], "b": 2}
    );
    assert_eq!(
        ok(doc! {"arr": {"$elemMatch": {"$gt": 9}}, "s": 0}, &d),
        doc! {"_id": 1, "b": 2}
    );
    // Among computed fields it keeps its place in the spec.
    assert_eq!(
        ok(
            doc! {"t": "$b", "arr": {"$elemMatch": {"$gt": 2}}, "u": "$s", "s": 1},
            &d
        ),
        doc! {"_id": 1, "s": "x", "t": 2, "arr": [3], "u": "x"}
    );
    // `_id` alone.
    assert_eq!(ok(doc! {"_id": 1}, &d), doc! {"_id": 1});
    assert_eq!(
        ok(doc! {"_id": 0}, &d),
        doc! {"arr": [1, 2, 3], "b": 2, "s": "x"}
    );
    assert_eq!(
        ok(doc! {"_id": 1, "b": 0}, &d),
        doc! {"_id": 1, "arr": [1, 2, 3], "s": "x"}
    );
}

#[test]
fn positional_projection_picks_the_matched_element() {
    let d = sample();
    let q = doc! {"arr.x": 5};
    assert_eq!(
        run(doc! {"arr.$": 1}, q.clone(), &d).expect("positional"),
        doc! {"_id": 1, "arr": [{"x": 5, "y": 2}]}
    );
    // Beside expressions and inclusions.
    assert_eq!(
        run(
            doc! {"arr.$": 1, "t": {"$add": ["$a", 1]}, "s": 1},
            q.clone(),
            &d
        )
        .expect("positional"),
        doc! {"_id": 1, "s": "abc", "arr": [{"x": 5, "y": 2}], "t": 2}
    );
    // The path below the array is included first (scalars dropped), then
    // the element is picked.
    assert_eq!(
        run(doc! {"arr.x.$": 1, "_id": 0}, q, &d).expect("positional"),
        doc! {"arr": [{"x": 5}]}
    );
    let nested = doc! {"_id": 1, "o": {"l": [1, 2, 3]}, "p": [1, 2, 3], "q": [9]};
    assert_eq!(
        run(doc! {"o.l.$": 1}, doc! {"o.l": {"$gte": 2}}, &nested).expect("nested"),
        doc! {"_id": 1, "o": {"l": [2]}}
    );
    // No array on the path: the value as included.
    assert_eq!(
        run(doc! {"o.$": 1}, doc! {}, &nested).expect("no array"),
        doc! {"_id": 1, "o": {"l": [1, 2, 3]}}
    );
    // An array the query did not match through: 51246; a position past the
    // projected array: 51247.
    let e = run(doc! {"p.$": 1}, doc! {"_id": 1}, &nested).expect_err("no position");
    assert_eq!(
        (e.code(), e.to_string()),
        (
            51246,
            "positional operator '.$' couldn't find a matching element in the array".to_string()
        )
    );
    let e = run(doc! {"q.$": 1}, doc! {"p": 3}, &nested).expect_err("mismatch");
    assert_eq!(
        (e.code(), e.to_string()),
        (
            51247,
            "positional operator '.$' element mismatch".to_string()
        )
    );
}

#[test]
fn expressions_compare_under_the_collation() {
    let d = doc! {"_id": 1, "s": "abc", "l": ["x", "ABC"]};
    let spec = doc! {"eq": {"$eq": ["$s", "ABC"]}, "in": {"$in": ["ABC", ["abc"]]}, "_id": 0};
    let p = Projection::parse(&spec).expect("parse");
    assert_eq!(
        p.apply(&raw(&d)).expect("binary"),
        doc! {"eq": false, "in": false}
    );
    let c = crate::doc::collation::Collator::from_document(&doc! {"locale": "en", "strength": 2})
        .expect("collator");
    let p = Projection::parse(&spec)
        .expect("parse")
        .with_collation(c.clone());
    assert_eq!(
        p.apply(&raw(&d)).expect("collated"),
        doc! {"eq": true, "in": true}
    );
    // `$elemMatch` and positional matching take it too.
    let p = Projection::parse(&doc! {"l": {"$elemMatch": {"$eq": "abc"}}})
        .expect("parse")
        .with_collation(c.clone());
    assert_eq!(
        p.apply(&raw(&d)).expect("elemMatch"),
        doc! {"_id": 1, "l": ["ABC"]}
    );
    let p = Projection::parse_find(&doc! {"l.$": 1}, Some(&doc! {"l": "abc"}), None)
        .expect("parse")
        .with_collation(c);
    assert_eq!(
        p.apply(&raw(&d)).expect("positional"),
        doc! {"_id": 1, "l": ["ABC"]}
    );
}

#[test]
fn evaluation_errors_keep_mongodbs_codes() {
    let d = sample();
    let e = run(doc! {"t": {"$add": ["$s", 1]}}, doc! {}, &d).expect_err("string");
    assert_eq!(
        (e.code(), e.to_string()),
        (
            14,
            "$add only supports numeric or date types, not string".to_string()
        )
    );
    // Find's `$slice` needs a positive limit; otherwise it is the expression,
    // whose first argument must be an array.
    let e = run(doc! {"arr": {"$slice": [1, 0]}}, doc! {}, &d).expect_err("not an array");
    assert_eq!(
        (e.code(), e.to_string()),
        (
            28724,
            "First argument to $slice must be an array, but is of type: int".to_string()
        )
    );
}

#[test]
fn text_score_is_read_where_a_text_search_gives_it() {
    let d = doc! {"_id": 1, "a": 2, crate::query::text::TEXT_SCORE_FIELD: 1.5};
    let p = Projection::parse_text_find(
        &doc! {"_id": 0, "s": {"$meta": "textScore"}, "t": {"$multiply": [{"$meta": "textScore"}, "$a"]}},
        &doc! {},
        None,
    )
    .expect("parse");
    assert!(p.reads_text_score());
    let mut out = p.apply(&raw(&d)).expect("apply");
    out.remove(crate::query::text::TEXT_SCORE_FIELD);
    assert_eq!(out, doc! {"s": 1.5, "t": 3.0});
    // Elsewhere: MongoDB's 40218, also inside an expression.
    for spec in [
        doc! {"s": {"$meta": "textScore"}},
        doc! {"t": {"$add": [{"$meta": "textScore"}, 1]}},
    ] {
        assert_eq!(
            refused(spec),
            (
                40218,
                "query requires text score metadata, but it is not available".to_string()
            )
        );
    }
}

#[test]
fn parse_errors_in_mongodbs_words() {
    let dollar = "FieldPath field names may not start with '$'. Consider using $getField or \
                  $setField.";
    let positional_middle = "As of 4.4, it's illegal to specify positional operator in the \
                             middle of a path.Positional projection may only be used at the \
                             end, for example: a.b.$. If the query previously used a form like \
                             a.b.$.d, remove the parts following the '$' and the results will \
                             be equivalent.";
    for (spec, code, words) in [
        // Mixing kinds: the first element decides, the key as written is named.
        (
            doc! {"a": 1, "n": {"k": 0}},
            31254,
            "Cannot do exclusion on field k in inclusion projection",
        ),
        (
            doc! {"n.k": 0, "a": true},
            31253,
            "Cannot do inclusion on field a in exclusion projection",
        ),
        (
            doc! {"a": 0, "t": {"$add": [1, 2]}},
            31252,
            "Cannot use expression other than $meta in exclusion projection",
        ),
        (
            doc! {"a": 0, "t": "$s"},
            31310,
            "Cannot use an expression t: \"$s\" in an exclusion projection",
        ),
        (
            doc! {"t": "$s", "a": 0},
            31254,
            "Cannot do exclusion on field a in inclusion projection",
        ),
        // Path collisions.
        (doc! {"a.b": 1, "a": 1}, 31250, "Path collision at a"),
        (
            doc! {"a": 1, "a.b.c": "$x"},
            31249,
            "Path collision at a.b.c remaining portion b.c",
        ),
        (
            doc! {"a": {"b": 1, "b.c": 0}},
            31249,
            "Path collision at b.c remaining portion c",
        ),
        // Field names.
        (doc! {"$a": 1}, 16410, dollar),
        (doc! {"a.$b": "$x"}, 16410, dollar),
        (doc! {"t": {"$add": [1], "b": 1}}, 16410, dollar),
        (
            doc! {"a..b": 1},
            15998,
            "FieldPath field names may not be empty strings.",
        ),
        (
            doc! {"": 1},
            40352,
            "FieldPath cannot be constructed with empty string",
        ),
        (doc! {"a.": 1}, 40353, "FieldPath must not end with a '.'."),
        (
            doc! {"a": {}},
            51270,
            "An empty sub-projection is not a valid value. Found empty object at path",
        ),
        // Expressions.
        (doc! {"t": {"$frob": 1}}, 31325, "Unknown expression $frob"),
        (
            doc! {"t": {"$add": [{"$frob": 1}]}},
            168,
            "Unrecognized expression '$frob'",
        ),
        (
            doc! {"t": "$"},
            16872,
            "'$' by itself is not a valid FieldPath",
        ),
        // Find's operators.
        (
            doc! {"a": {"$slice": "x"}},
            28667,
            "Invalid $slice syntax. The given syntax { $slice: \"x\" } did not match the find() \
             syntax because :: Location31273: $slice only supports numbers and [skip, limit] \
             arrays :: The given syntax did not match the expression $slice syntax. :: caused \
             by :: Expression $slice takes at least 2 arguments, and at most 3, but 1 were \
             passed in.",
        ),
        (
            doc! {"a": {"$slice": [1, 2, 3, 4]}},
            28667,
            "Invalid $slice syntax. The given syntax { $slice: [ 1, 2, 3, 4 ] } did not match \
             the find() syntax because :: Location31272: $slice array argument should be of \
             form [skip, limit] :: The given syntax did not match the expression $slice \
             syntax. :: caused by :: Expression $slice takes at least 2 arguments, and at most \
             3, but 4 were passed in.",
        ),
        (
            doc! {"a": 0, "b": {"$slice": ["$x", 1]}},
            31252,
            "Invalid $slice syntax. The given syntax { $slice: [ \"$x\", 1 ] } did not match \
             the find() syntax because :: Location31257: $slice expects the skip argument to \
             be a number, got string :: The given syntax did not match the expression $slice \
             syntax. :: caused by :: Cannot use expression other than $meta in exclusion \
             projection",
        ),
        (
            doc! {"a": {"$elemMatch": 1}},
            31274,
            "elemMatch: Invalid argument, object required, but got int",
        ),
        (
            doc! {"a.b": {"$elemMatch": {"c": 1}}},
            31275,
            "Cannot use $elemMatch projection on a nested field.",
        ),
        (
            doc! {"a": {"b": {"$elemMatch": {"c": 1}}}},
            31275,
            "Cannot use $elemMatch projection on a nested field.",
        ),
        // Positional projection.
        (
            doc! {"a.$": 1, "b.$": 1},
            31276,
            "Cannot specify more than one positional projection per query.",
        ),
        (
            doc! {"a.$": 1, "b": {"$elemMatch": {"c": 1}}},
            31255,
            "Cannot specify positional operator and $elemMatch.",
        ),
        (
            doc! {"b": {"$elemMatch": {"c": 1}}, "a.$": 1},
            31256,
            "Cannot specify positional operator and $elemMatch.",
        ),
        (
            doc! {"a.$": {"$slice": 1}},
            31271,
            "positional projection cannot be used with an expression or sub object",
        ),
        (
            doc! {"a.$": "x"},
            31308,
            "positional projection cannot be used with a literal",
        ),
        (
            doc! {"a.$": 0},
            31395,
            "positional projection cannot be used with exclusion",
        ),
        (doc! {"a.$.b": 1}, 31394, positional_middle),
        (
            doc! {"b": 0, "a.$": 1},
            31253,
            "Cannot do inclusion on field a.$ in exclusion projection",
        ),
    ] {
        assert_eq!(refused(spec.clone()), (code, words.to_string()), "{spec:?}");
    }
    // `$function` is an expression MongoDB knows; duetdb runs no JavaScript.
    assert_eq!(
        refused(doc! {"t": {"$function": {"body": "f", "args": [], "lang": "js"}}}),
        (
            2,
            "$function is not supported by duetdb: it runs JavaScript".to_string()
        )
    );
    // A positional projection needs the find's filter.
    let e: Error = Projection::parse(&doc! {"a.$": 1}).expect_err("no matcher");
    assert_eq!(
        (e.code(), e.to_string()),
        (
            51050,
            "Projections with a positional operator require a matcher".to_string()
        )
    );
}
