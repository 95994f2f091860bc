//! What parsing refuses: the error messages and codes of malformed filters, and
//! the nesting bound.

use bson::doc;

use super::*;
use crate::error::Error;
use crate::query::filter::MAX_FILTER_DEPTH;

#[test]
fn parse_errors() {
    assert_eq!(err(doc! {"a": {"$foo": 1}}), "unknown operator: $foo");
    assert!(err(doc! {"$foo": 1}).starts_with("unknown top level operator: $foo. If you have"));
    assert_eq!(err(doc! {"a": {"$gt": 1, "b": 2}}), "unknown operator: b");
    assert!(err(doc! {"$where": "1"}).contains("not supported"));
    assert!(err(doc! {"$text": {"$search": "x"}}).contains("not supported"));
    assert!(err(doc! {"$expr": {"$eq": [1]}}).contains("takes exactly 2 arguments"));
    assert!(err(doc! {"a": {"$near": "here"}}).contains("invalid point in geo near query"));
    assert!(err(
        doc! {"a": {"$geoWithin": {"$geometry": {"type": "Point", "coordinates": [0, 0]}}}}
    )
    .contains("$geoWithin not supported with provided geometry"));
    assert!(err(doc! {"a": {"$near": [0, 0]}, "b": {"$near": [0, 0]}})
        .contains("Too many geoNear expressions"));
    assert!(err(doc! {"$nor": [{"a": {"$nearSphere": [0, 0]}}]})
        .contains("geo near must be top-level expr"));
    for op in ["$and", "$or", "$nor"] {
        assert!(err(doc! {op: []}).contains("nonempty array"), "{op}");
        assert!(err(doc! {op: 1}).contains("must be an array"), "{op}");
        assert!(err(doc! {op: [1]}).contains("must be objects"), "{op}");
    }
    assert_eq!(err(doc! {"a": {"$in": 1}}), "$in needs an array");
    assert_eq!(err(doc! {"a": {"$nin": "x"}}), "$nin needs an array");
    assert_eq!(err(doc! {"a": {"$all": 1}}), "$all needs an array");
    assert!(err(doc! {"a": {"$in": [{"$gt": 1}]}}).contains("cannot nest $"));
    assert!(err(doc! {"a": {"$all": [{"$gt": 1}]}}).contains("no $ expressions"));
    assert!(err(doc! {"a": {"$all": [{"$elemMatch": {}}, 1]}}).contains("consistent"));
    assert_eq!(err(doc! {"a": {"$size": -1}}), "$size may not be negative");
    assert_eq!(
        err(doc! {"a": {"$size": 1.5}}),
        "$size must be a whole number"
    );
    assert_eq!(err(doc! {"a": {"$size": "1"}}), "$size needs a number");
    assert_eq!(err(doc! {"a": {"$mod": [0, 1]}}), "divisor cannot be 0");
    assert!(err(doc! {"a": {"$mod": [1]}}).contains("not enough elements"));
    assert!(err(doc! {"a": {"$mod": [1, 2, 3]}}).contains("too many elements"));
    assert!(err(doc! {"a": {"$mod": 4}}).contains("needs to be an array"));
    assert!(err(doc! {"a": {"$mod": ["x", 1]}}).contains("divisor not a number"));
    assert!(err(doc! {"a": {"$mod": [f64::NAN, 1]}}).contains("invalid"));
    // MongoDB's words: PCRE2's text after 51091's prefix; 51108 with the
    // empty operator name of a query (a leading space); the flags before a
    // null byte.
    assert_eq!(
        err(doc! {"a": {"$regex": "("}}),
        "Regular expression is invalid: missing closing parenthesis"
    );
    assert_eq!(
        err(doc! {"a": re("[a-", "")}),
        "Regular expression is invalid: missing terminating ] for character class"
    );
    assert_eq!(
        err(doc! {"a": {"$regex": "*x"}}),
        "Regular expression is invalid: quantifier does not follow a repeatable item"
    );
    assert_eq!(
        err(doc! {"a": {"$regex": "x", "$options": "iq"}}),
        " invalid flag in regex options: q"
    );
    assert_eq!(
        err(doc! {"a": {"$regex": "x\0", "$options": "q"}}),
        " invalid flag in regex options: q"
    );
    assert_eq!(
        err(doc! {"a": {"$regex": "x\0"}}),
        "Regular expression cannot contain an embedded null byte"
    );
    assert_eq!(err(doc! {"a": {"$regex": 5}}), "$regex has to be a string");
    assert_eq!(
        err(doc! {"a": {"$options": "i"}}),
        "$options needs a $regex"
    );
    assert!(err(doc! {"a": {"$regex": re("x", "i"), "$options": "m"}}).contains("both"));
    assert_eq!(
        err(doc! {"a": {"$type": "foo"}}),
        "Unknown type name alias: foo"
    );
    assert!(err(doc! {"a": {"$type": 99}}).contains("Invalid numerical type code"));
    assert!(err(doc! {"a": {"$type": 2.5}}).contains("Invalid numerical type code"));
    assert!(err(doc! {"a": {"$type": []}}).contains("at least one type"));
    assert!(err(doc! {"a": {"$type": true}}).contains("number or a string"));
    assert_eq!(
        err(doc! {"a": {"$not": 1}}),
        "$not needs a regex or a document"
    );
    assert_eq!(err(doc! {"a": {"$not": {}}}), "$not cannot be empty");
    assert_eq!(err(doc! {"a": {"$not": {"b": 1}}}), "unknown operator: b");
    assert_eq!(
        err(doc! {"a": {"$elemMatch": 1}}),
        "$elemMatch needs an Object"
    );
    assert!(err(doc! {"a": Bson::Undefined}).contains("undefined"));
    assert!(err(doc! {"a": {"$in": [Bson::Undefined]}}).contains("undefined"));
    // Errors inside nested clauses surface too.
    assert_eq!(
        err(doc! {"$or": [{"a": 1}, {"b": {"$bad": 1}}]}),
        "unknown operator: $bad"
    );
    assert_eq!(
        err(doc! {"a": {"$elemMatch": {"b": {"$bad": 1}}}}),
        "unknown operator: $bad"
    );
}

#[test]
fn errors_are_bad_value() {
    let e = Filter::parse(&doc! {"a": {"$in": 1}}).expect_err("error");
    assert_eq!(e.code(), 2);
    let e = Filter::parse(&doc! {"a": {"$foo": 1}}).expect_err("error");
    assert!(matches!(e, Error::UnknownOperator(_)));
}

#[test]
fn nesting_depth_is_bounded() {
    let mut f = doc! {"a": 1};
    for _ in 0..MAX_FILTER_DEPTH {
        f = doc! {"$and": [f]};
    }
    assert!(m(f.clone(), doc! {"a": 1}));
    let deeper = doc! {"$and": [f]};
    assert!(err(deeper).contains("nested too deeply"));

    let mut g = doc! {"$eq": 1};
    for _ in 0..=MAX_FILTER_DEPTH {
        g = doc! {"$not": g};
    }
    assert!(err(doc! {"a": g}).contains("nested too deeply"));

    let mut h = doc! {"b": 1};
    for _ in 0..=MAX_FILTER_DEPTH {
        h = doc! {"b": {"$elemMatch": h}};
    }
    assert!(err(h).contains("nested too deeply"));
}
