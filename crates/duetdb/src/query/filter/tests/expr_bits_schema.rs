//! `$expr` (with the command's `let`), the `$bits*` operators, `$jsonSchema`
//! and `$comment`: MongoDB's documented examples and edge cases.

use bson::{doc, spec::BinarySubtype, Binary};

use super::*;

#[test]
fn expr_compares_fields_of_one_document() {
    // The manual's example: spent more than budget.
    check(
        doc! {"$expr": {"$gt": ["$spent", "$budget"]}},
        &[
            doc! {"budget": 400, "spent": 500},
            doc! {"budget": 1.5, "spent": 2},
        ],
        &[doc! {"budget": 400, "spent": 400}, doc! {"budget": 100}],
    );
    check(
        doc! {"$expr": {"$lt": [{"$cond": {"if": {"$gte": ["$qty", 100]}, "then": {"$multiply": ["$price", 0.5]}, "else": {"$multiply": ["$price", 0.75]}}}, 5]}},
        &[doc! {"qty": 300, "price": 8}, doc! {"qty": 50, "price": 6}],
        &[doc! {"qty": 50, "price": 8}],
    );
    // Truthiness: 0, null and missing are false.
    check(
        doc! {"$expr": "$flag"},
        &[doc! {"flag": 1}, doc! {"flag": "x"}],
        &[doc! {"flag": 0}, doc! {}],
    );
    // Beside other conditions, inside $or.
    check(
        doc! {"a": 1, "$or": [{"$expr": {"$eq": ["$b", "$c"]}}, {"d": true}]},
        &[doc! {"a": 1, "b": 2, "c": 2}, doc! {"a": 1, "d": true}],
        &[doc! {"a": 2, "b": 2, "c": 2}, doc! {"a": 1, "b": 1, "c": 2}],
    );
}

#[test]
fn expr_errors_fail_the_query() {
    let f = parse(doc! {"$expr": {"$gt": [{"$add": ["$a", 1]}, 0]}});
    assert!(f.matches(&raw(&doc! {"a": 1})));
    assert!(f.check().is_ok());
    assert!(!f.matches(&raw(&doc! {"a": "text"})));
    assert_eq!(f.check().expect_err("type error kept").code(), 14);
    // Parse errors of the expression are parse errors of the filter.
    assert_eq!(
        Filter::parse(&doc! {"$expr": {"$frob": 1}})
            .expect_err("bad")
            .code(),
        168
    );
    assert_eq!(
        Filter::parse(&doc! {"$expr": "$$undefinedVar"})
            .expect_err("bad")
            .code(),
        17276
    );
}

#[test]
fn expr_with_command_let() {
    let vars = doc! {"target": 5, "label": {"$concat": ["a", "b"]}};
    let f = Filter::parse_with_let(&doc! {"$expr": {"$eq": ["$x", "$$target"]}}, Some(&vars))
        .expect("parse");
    assert!(f.matches(&raw(&doc! {"x": 5})));
    assert!(!f.matches(&raw(&doc! {"x": 4})));
    // The server's path: `let` bound into the filter document itself.
    let bound = Filter::bind_let(
        &doc! {"$and": [{"$expr": {"$eq": ["$s", "$$label"]}}], "k": 1},
        Some(&vars),
    )
    .expect("bind");
    let f = parse(bound);
    assert!(f.matches(&raw(&doc! {"s": "ab", "k": 1})));
    assert!(!f.matches(&raw(&doc! {"s": "ab", "k": 2})));
    assert_eq!(
        Filter::bind_let(&doc! {}, Some(&doc! {"Bad": 1}))
            .expect_err("name")
            .code(),
        16867
    );
    // $$NOW is a date, the same for every document of the query.
    let f = parse(doc! {"$expr": {"$lt": ["$t", "$$NOW"]}});
    assert!(f.matches(&raw(&doc! {"t": bson::DateTime::from_millis(0)})));
}

#[test]
fn bitwise_operators() {
    // The manual's collection: a = 54 (0b110110), 20 (0b10100), 20.0, BinData.
    let docs = [
        doc! {"a": 54},
        doc! {"a": 20},
        doc! {"a": 20.0},
        doc! {"a": Binary { subtype: BinarySubtype::Generic, bytes: vec![0x36] }},
    ];
    let which = |f: Document| -> Vec<usize> {
        let f = parse(f);
        (0..docs.len())
            .filter(|i| f.matches(&raw(&docs[*i])))
            .collect()
    };
    assert_eq!(which(doc! {"a": {"$bitsAllSet": [1, 5]}}), vec![0, 3]);
    assert_eq!(which(doc! {"a": {"$bitsAllSet": 50}}), vec![0, 3]);
    assert_eq!(which(doc! {"a": {"$bitsAnySet": [1, 5]}}), vec![0, 3]);
    assert_eq!(which(doc! {"a": {"$bitsAllClear": [1, 5]}}), vec![1, 2]);
    assert_eq!(which(doc! {"a": {"$bitsAnyClear": [1, 5]}}), vec![1, 2]);
    assert_eq!(which(doc! {"a": {"$bitsAnyClear": 35}}), vec![0, 1, 2, 3]);
    assert_eq!(
        which(
            doc! {"a": {"$bitsAllSet": Binary { subtype: BinarySubtype::Generic, bytes: vec![0x30] }}}
        ),
        vec![0, 3]
    );
    // Negative numbers are two's complement; high positions read the sign.
    assert!(m(doc! {"a": {"$bitsAllSet": [0, 63, 200]}}, doc! {"a": -1}));
    // Fractions, strings and missing never match.
    assert!(!m(doc! {"a": {"$bitsAllClear": [0]}}, doc! {"a": 2.5}));
    assert!(!m(doc! {"a": {"$bitsAllClear": [0]}}, doc! {"a": "x"}));
    assert!(!m(doc! {"a": {"$bitsAllClear": [0]}}, doc! {}));
    // Arrays: any element.
    assert!(m(doc! {"a": {"$bitsAllSet": [0]}}, doc! {"a": [2, 3]}));
    for bad in [
        doc! {"a": {"$bitsAllSet": -1}},
        doc! {"a": {"$bitsAllSet": 1.5}},
        doc! {"a": {"$bitsAllSet": [-1]}},
        doc! {"a": {"$bitsAllSet": "x"}},
    ] {
        assert_eq!(
            Filter::parse(&bad).expect_err("bad mask").code(),
            2,
            "{bad}"
        );
    }
}

#[test]
fn json_schema() {
    let schema = doc! {"$jsonSchema": {
        "required": ["name", "major", "gpa", "address"],
        "properties": {
            "name": {"bsonType": "string", "description": "must be a string"},
            "address": {"bsonType": "object", "required": ["zipcode"], "properties": {
                "street": {"bsonType": "string"}, "zipcode": {"bsonType": "string"}}},
            "major": {"enum": ["Math", "English", "Computer Science", "History", null]},
            "gpa": {"bsonType": ["double"], "minimum": 0},
            "tags": {"bsonType": "array", "items": {"bsonType": "string"}, "minItems": 1, "uniqueItems": true},
            "code": {"bsonType": "string", "minLength": 2, "maxLength": 3, "pattern": "^[A-Z]+$"}
        }
    }};
    let good =
        doc! {"name": "Alice", "major": "History", "gpa": 3.0, "address": {"zipcode": "63109"}};
    let mut with_tags = good.clone();
    with_tags.insert("tags", vec!["a", "b"]);
    let mut with_code = good.clone();
    with_code.insert("code", "AB");
    let mut bad_code = good.clone();
    bad_code.insert("code", "abcd");
    let mut dup_tags = good.clone();
    dup_tags.insert("tags", vec!["a", "a"]);
    check(
        schema,
        &[good.clone(), with_tags, with_code],
        &[
            doc! {"name": "Alice", "major": "History", "gpa": 3, "address": {"zipcode": "63109"}},
            doc! {"name": "Alice", "major": "Art", "gpa": 3.0, "address": {"zipcode": "63109"}},
            doc! {"name": "Alice", "major": "History", "gpa": 3.0, "address": {}},
            doc! {"name": "Alice", "major": "History", "gpa": -1.0, "address": {"zipcode": "1"}},
            doc! {"major": "History", "gpa": 3.0, "address": {"zipcode": "63109"}},
            bad_code,
            dup_tags,
        ],
    );
    check(
        doc! {"$jsonSchema": {"properties": {"a": {"type": "number", "maximum": 10, "exclusiveMaximum": true}}, "additionalProperties": false, "patternProperties": {"^x": {}}}},
        &[doc! {"a": 9}, doc! {}, doc! {"x1": "anything"}],
        &[doc! {"a": 10}, doc! {"a": "s"}, doc! {"b": 1}],
    );
    check(
        doc! {"$jsonSchema": {"properties": {"v": {"anyOf": [{"bsonType": "int"}, {"bsonType": "string"}], "not": {"enum": [0]}}}}},
        &[doc! {"v": 1}, doc! {"v": "s"}, doc! {}],
        &[doc! {"v": 0}, doc! {"v": 1.5}],
    );
    for bad in [
        doc! {"$jsonSchema": {"frob": 1}},
        doc! {"$jsonSchema": {"type": "integer"}},
        doc! {"$jsonSchema": {"$ref": "#/x"}},
        doc! {"$jsonSchema": {"type": "object", "bsonType": "object"}},
        doc! {"$jsonSchema": {"minLength": -1}},
    ] {
        assert_eq!(
            Filter::parse(&bad).expect_err("bad schema").code(),
            9,
            "{bad}"
        );
    }
}

#[test]
fn comment_is_ignored() {
    check(
        doc! {"a": 1, "$comment": {"any": "thing"}},
        &[doc! {"a": 1}],
        &[doc! {"a": 2}],
    );
}
