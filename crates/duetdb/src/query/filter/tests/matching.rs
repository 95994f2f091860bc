//! Which documents each operator matches: equality, dotted paths and the
//! implicit array traversal, null and missing, comparisons with type
//! bracketing, `$in`, `$exists`, `$type`, logical operators, `$not`, regexes,
//! `$size`, `$mod`, `$elemMatch`, `$all`, and robustness on malformed documents.

use bson::{doc, RawDocument};

use super::*;

#[test]
fn empty_filter_matches_all() {
    assert!(parse(doc! {}).is_match_all());
    assert!(parse(doc! {"$comment": "hi"}).is_match_all());
    assert!(!parse(doc! {"a": 1}).is_match_all());
    assert!(m(doc! {}, doc! {"a": 1}));
    assert!(m(doc! {"$comment": "x"}, doc! {}));
}

#[test]
fn implicit_and_explicit_eq() {
    check(
        doc! {"a": 1},
        &[
            doc! {"a": 1},
            doc! {"a": 1.0},
            doc! {"a": 1i64},
            doc! {"a": [3, 1]},
        ],
        &[
            doc! {"a": 2},
            doc! {},
            doc! {"a": "1"},
            doc! {"a": [[1]]},
            doc! {"b": 1},
        ],
    );
    check(
        doc! {"a": {"$eq": "x"}},
        &[doc! {"a": "x"}, doc! {"a": ["y", "x"]}],
        &[doc! {"a": "X"}, doc! {"a": null}],
    );
    // Literal document equality: field order and exact fields matter.
    check(
        doc! {"a": {"b": 1, "c": 2}},
        &[
            doc! {"a": {"b": 1, "c": 2}},
            doc! {"a": [{"b": 1.0, "c": 2}]},
        ],
        &[doc! {"a": {"c": 2, "b": 1}}, doc! {"a": {"b": 1}}],
    );
    // A document whose first key is not an operator is a literal even if
    // later keys start with '$'.
    check(
        doc! {"a": {"b": 1, "$c": 2}},
        &[doc! {"a": {"b": 1, "$c": 2}}],
        &[doc! {"a": {"b": 1}}],
    );
    // `{a: {}}` is equality with the empty document.
    check(
        doc! {"a": {}},
        &[doc! {"a": {}}],
        &[doc! {"a": {"b": 1}}, doc! {}],
    );
}

#[test]
fn array_equality_whole_or_element() {
    check(
        doc! {"a": [1, 2]},
        &[doc! {"a": [1, 2]}, doc! {"a": [[1, 2], 3]}],
        &[
            doc! {"a": [2, 1]},
            doc! {"a": 1},
            doc! {"a": [1, 2, 3]},
            doc! {"a": [[[1, 2]]]},
        ],
    );
    check(
        doc! {"a": []},
        &[doc! {"a": []}, doc! {"a": [[]]}],
        &[doc! {"a": [1]}, doc! {}],
    );
}

#[test]
fn dotted_paths_and_array_traversal() {
    check(
        doc! {"a.b": 1},
        &[
            doc! {"a": {"b": 1}},
            doc! {"a": [{"b": 2}, {"b": 1}]},
            doc! {"a": [{"b": [0, 1]}]},
            doc! {"a": {"b": [1]}},
        ],
        &[
            doc! {"a": [[{"b": 1}]]},
            doc! {"a": 1},
            doc! {"a": {"c": {"b": 1}}},
            doc! {"a": [1]},
        ],
    );
    check(
        doc! {"a.1": 5},
        &[
            doc! {"a": [4, 5]},
            doc! {"a": {"1": 5}},
            doc! {"a": [{"1": 5}]},
        ],
        &[doc! {"a": [5, 4]}, doc! {"a": [5]}, doc! {"a": [0, [5]]}],
    );
    // An element picked by position is taken whole: it is not expanded.
    check(
        doc! {"a.1": [5]},
        &[doc! {"a": [0, [5]]}],
        &[doc! {"a": [0, 5]}],
    );
    check(
        doc! {"a.0": {"$size": 2}},
        &[doc! {"a": [[1, 2]]}],
        &[doc! {"a": [[1]]}],
    );
    check(
        doc! {"a.0.b": 1},
        &[
            doc! {"a": [{"b": 1}]},
            doc! {"a": [{"b": 2}, {"0": {"b": 1}}]},
        ],
        &[doc! {"a": [{"b": 2}, {"b": 1}]}],
    );
    check(
        doc! {"a.b.c": 3},
        &[doc! {"a": [{"b": [{"c": 1}, {"c": 3}]}]}],
        &[doc! {"a": [{"b": [[{"c": 3}]]}]}],
    );
}

#[test]
fn null_and_missing() {
    check(
        doc! {"a": null},
        &[
            doc! {},
            doc! {"a": null},
            doc! {"a": Bson::Undefined},
            doc! {"a": [1, null]},
            doc! {"b": 1},
        ],
        &[
            doc! {"a": 0},
            doc! {"a": []},
            doc! {"a": [1]},
            doc! {"a": false},
        ],
    );
    check(
        doc! {"a.b": null},
        &[
            doc! {},
            doc! {"a": 1},
            doc! {"a": {}},
            doc! {"a": [{"b": 1}, {"c": 1}]},
            doc! {"a": {"b": null}},
        ],
        &[
            doc! {"a": {"b": 1}},
            doc! {"a": [{"b": 1}]},
            doc! {"a": []},
            doc! {"a": [1, 2]},
        ],
    );
    // A numeric component that does not select anything does not yield "missing"
    // from element documents.
    check(
        doc! {"a.0": null},
        &[doc! {"a": [null]}, doc! {"a": 1}, doc! {}],
        &[doc! {"a": [{"x": 1}]}, doc! {"a": [1]}],
    );
    check(
        doc! {"a": {"$ne": null}},
        &[doc! {"a": 1}, doc! {"a": []}],
        &[doc! {}, doc! {"a": null}, doc! {"a": [1, null]}],
    );
    check(
        doc! {"a": {"$in": [null, 1]}},
        &[doc! {}, doc! {"a": 1}, doc! {"a": Bson::Undefined}],
        &[doc! {"a": 2}],
    );
    check(
        doc! {"a": {"$nin": [null]}},
        &[doc! {"a": 1}],
        &[doc! {}, doc! {"a": null}],
    );
    check(
        doc! {"a": {"$gte": null}},
        &[doc! {}, doc! {"a": null}],
        &[doc! {"a": 1}, doc! {"a": "x"}],
    );
    check(
        doc! {"a": {"$lte": null}},
        &[doc! {}, doc! {"a": Bson::Undefined}],
        &[doc! {"a": 1}],
    );
    check(
        doc! {"a": {"$gt": null}},
        &[],
        &[doc! {}, doc! {"a": null}, doc! {"a": 1}],
    );
    check(
        doc! {"a": {"$lt": null}},
        &[],
        &[doc! {}, doc! {"a": null}, doc! {"a": Bson::MinKey}],
    );
}

#[test]
fn ne_and_nin_negate_over_all_values() {
    check(
        doc! {"a": {"$ne": 1}},
        &[doc! {}, doc! {"a": 2}, doc! {"a": [2, 3]}, doc! {"a": "1"}],
        &[doc! {"a": 1}, doc! {"a": [1, 2]}, doc! {"a": 1.0}],
    );
    check(
        doc! {"a": {"$nin": [1, "x"]}},
        &[doc! {}, doc! {"a": 2}, doc! {"a": [2, "y"]}],
        &[doc! {"a": "x"}, doc! {"a": [2, 1]}],
    );
    check(
        doc! {"a.b": {"$ne": 1}},
        &[doc! {"a": [{"b": 2}, {"c": 1}]}],
        &[doc! {"a": [{"b": 2}, {"b": 1}]}],
    );
}

#[test]
fn comparisons_use_type_bracketing() {
    check(
        doc! {"a": {"$gt": 5}},
        &[
            doc! {"a": 6},
            doc! {"a": 5.5},
            doc! {"a": [1, 7]},
            doc! {"a": 6i64},
        ],
        &[
            doc! {"a": 5},
            doc! {"a": "z"},
            doc! {"a": {"b": 1}},
            doc! {"a": true},
            doc! {},
            doc! {"a": [1, 2]},
            doc! {"a": null},
        ],
    );
    check(
        doc! {"a": {"$gte": 5}},
        &[doc! {"a": 5}, doc! {"a": 5.0}],
        &[doc! {"a": 4.9}],
    );
    check(
        doc! {"a": {"$lt": "m"}},
        &[doc! {"a": "a"}, doc! {"a": ["z", "b"]}],
        &[doc! {"a": "m"}, doc! {"a": 1}, doc! {"a": null}, doc! {}],
    );
    check(
        doc! {"a": {"$lte": "m"}},
        &[doc! {"a": "m"}],
        &[doc! {"a": "n"}],
    );
    // Each operator is its own existential over array elements.
    check(
        doc! {"a": {"$gt": 1, "$lt": 5}},
        &[doc! {"a": 3}, doc! {"a": [0, 10]}],
        &[doc! {"a": 10}, doc! {"a": [0, "x"]}],
    );
    // Array operand compares with the whole array.
    check(
        doc! {"a": {"$gt": [1]}},
        &[doc! {"a": [2]}, doc! {"a": [1, 0]}],
        &[doc! {"a": [0]}],
    );
    // Dates and bools stay within their types.
    let d = bson::DateTime::from_millis(1000);
    check(
        doc! {"a": {"$lt": d}},
        &[doc! {"a": bson::DateTime::from_millis(5)}],
        &[doc! {"a": 5}, doc! {"a": true}],
    );
}

#[test]
fn minkey_maxkey_operands_cross_types() {
    check(
        doc! {"a": {"$gt": Bson::MinKey}},
        &[doc! {"a": 1}, doc! {"a": "x"}, doc! {"a": null}],
        &[doc! {"a": Bson::MinKey}, doc! {}],
    );
    check(
        doc! {"a": {"$lte": Bson::MaxKey}},
        &[doc! {"a": 1}, doc! {"a": Bson::MaxKey}],
        &[doc! {}],
    );
    check(
        doc! {"a": {"$lt": Bson::MaxKey}},
        &[doc! {"a": {"x": 1}}],
        &[doc! {"a": Bson::MaxKey}],
    );
    check(
        doc! {"a": {"$gt": Bson::MaxKey}},
        &[],
        &[doc! {"a": 1}, doc! {"a": Bson::MaxKey}],
    );
}

#[test]
fn nan_only_equals_nan() {
    check(
        doc! {"a": f64::NAN},
        &[doc! {"a": f64::NAN}],
        &[doc! {"a": 1}],
    );
    check(
        doc! {"a": {"$gte": f64::NAN}},
        &[doc! {"a": f64::NAN}],
        &[doc! {"a": 1}],
    );
    check(
        doc! {"a": {"$lt": 5}},
        &[doc! {"a": 4}],
        &[doc! {"a": f64::NAN}],
    );
    check(
        doc! {"a": {"$gt": f64::NAN}},
        &[],
        &[doc! {"a": f64::NAN}, doc! {"a": 1}],
    );
}

#[test]
fn in_operator() {
    check(
        doc! {"a": {"$in": [1, "x", [2, 3], re("^ab", "")]}},
        &[
            doc! {"a": 1.0},
            doc! {"a": "x"},
            doc! {"a": [2, 3]},
            doc! {"a": [9, "abc"]},
            doc! {"a": [[2, 3]]},
            doc! {"a": re("^ab", "")},
        ],
        &[
            doc! {"a": 2},
            doc! {"a": "xab"},
            doc! {},
            doc! {"a": [2]},
            doc! {"a": re("^ab", "i")},
        ],
    );
    check(doc! {"a": {"$in": []}}, &[], &[doc! {"a": 1}, doc! {}]);
    check(doc! {"a": {"$nin": []}}, &[doc! {"a": 1}, doc! {}], &[]);
}

#[test]
fn exists() {
    check(
        doc! {"a": {"$exists": true}},
        &[doc! {"a": null}, doc! {"a": []}, doc! {"a": 0}],
        &[doc! {}, doc! {"b": 1}],
    );
    check(
        doc! {"a": {"$exists": false}},
        &[doc! {}],
        &[doc! {"a": null}],
    );
    check(doc! {"a": {"$exists": 1}}, &[doc! {"a": 1}], &[doc! {}]);
    check(doc! {"a": {"$exists": 0}}, &[doc! {}], &[doc! {"a": 1}]);
    check(
        doc! {"a.b": {"$exists": true}},
        &[doc! {"a": [{"c": 1}, {"b": null}]}, doc! {"a": {"b": []}}],
        &[
            doc! {"a": [{"c": 1}]},
            doc! {"a": []},
            doc! {"a": [1]},
            doc! {"a": 1},
        ],
    );
    check(
        doc! {"a.b": {"$exists": false}},
        &[doc! {"a": [{"c": 1}]}, doc! {"a": [1]}],
        &[doc! {"a": [{"b": 1}]}],
    );
}

#[test]
fn type_operator() {
    check(
        doc! {"a": {"$type": "string"}},
        &[doc! {"a": "x"}, doc! {"a": [1, "x"]}],
        &[doc! {"a": 1}, doc! {}],
    );
    check(
        doc! {"a": {"$type": 2}},
        &[doc! {"a": "x"}],
        &[doc! {"a": 1}],
    );
    check(
        doc! {"a": {"$type": 16.0}},
        &[doc! {"a": 1}],
        &[doc! {"a": 1i64}],
    );
    check(
        doc! {"a": {"$type": "number"}},
        &[
            doc! {"a": 1},
            doc! {"a": 1i64},
            doc! {"a": 1.5},
            doc! {"a": ["x", 2]},
        ],
        &[doc! {"a": "1"}, doc! {"a": null}],
    );
    check(
        doc! {"a": {"$type": "array"}},
        &[doc! {"a": []}, doc! {"a": [1]}],
        &[doc! {"a": 1}, doc! {"a": {"0": 1}}],
    );
    check(
        doc! {"a": {"$type": ["null", "bool"]}},
        &[doc! {"a": null}, doc! {"a": true}],
        &[doc! {}, doc! {"a": 0}],
    );
    check(
        doc! {"a": {"$type": "undefined"}},
        &[doc! {"a": Bson::Undefined}],
        &[doc! {"a": null}],
    );
    check(
        doc! {"a": {"$type": -1}},
        &[doc! {"a": Bson::MinKey}],
        &[doc! {"a": Bson::MaxKey}],
    );
    check(
        doc! {"a": {"$type": "maxKey"}},
        &[doc! {"a": Bson::MaxKey}],
        &[doc! {"a": Bson::MinKey}],
    );
    check(
        doc! {"a": {"$type": "object"}},
        &[doc! {"a": {}}, doc! {"a": [{}]}],
        &[doc! {"a": []}],
    );
}

#[test]
fn logical_operators() {
    check(
        doc! {"$and": [{"a": 1}, {"b": 2}]},
        &[doc! {"a": 1, "b": 2}],
        &[doc! {"a": 1}, doc! {"b": 2}],
    );
    check(
        doc! {"$or": [{"a": 1}, {"b": 2}]},
        &[doc! {"a": 1}, doc! {"b": 2}, doc! {"a": 1, "b": 2}],
        &[doc! {"a": 2, "b": 1}, doc! {}],
    );
    check(
        doc! {"$nor": [{"a": 1}, {"b": 2}]},
        &[doc! {}, doc! {"a": 2}],
        &[doc! {"a": 1}, doc! {"b": 2}],
    );
    check(
        doc! {"a": 1, "$or": [{"b": 1}, {"c": {"$exists": true}}]},
        &[doc! {"a": 1, "b": 1}, doc! {"a": 1, "c": null}],
        &[doc! {"a": 1}, doc! {"b": 1, "c": 1}],
    );
    check(doc! {"$alwaysFalse": 1}, &[], &[doc! {}]);
    check(doc! {"$alwaysTrue": 1}, &[doc! {}], &[]);
}

#[test]
fn not_operator() {
    check(
        doc! {"a": {"$not": {"$gt": 5}}},
        &[doc! {"a": 5}, doc! {}, doc! {"a": "z"}, doc! {"a": [1, 2]}],
        &[doc! {"a": 6}, doc! {"a": [1, 6]}],
    );
    // `$not` negates the conjunction, not each operator.
    check(
        doc! {"a": {"$not": {"$gt": 1, "$lt": 5}}},
        &[doc! {"a": 7}, doc! {"a": 0}],
        &[doc! {"a": 3}, doc! {"a": [0, 10]}],
    );
    check(
        doc! {"a": {"$not": re("^x", "")}},
        &[doc! {"a": "yx"}, doc! {}, doc! {"a": 1}],
        &[doc! {"a": "xy"}, doc! {"a": ["q", "xa"]}],
    );
    check(
        doc! {"a": {"$not": {"$regex": "^x", "$options": "i"}}},
        &[doc! {"a": "y"}],
        &[doc! {"a": "Xy"}],
    );
    check(
        doc! {"a": {"$not": {"$not": {"$eq": 1}}}},
        &[doc! {"a": [1, 2]}],
        &[doc! {"a": 2}],
    );
}

#[test]
fn regex_and_options() {
    check(
        doc! {"a": re("^ab", "")},
        &[doc! {"a": "abc"}, doc! {"a": ["x", "abx"]}],
        &[doc! {"a": "ABc"}, doc! {"a": 1}, doc! {}],
    );
    check(
        doc! {"a": re("^ab", "i")},
        &[doc! {"a": "ABc"}],
        &[doc! {"a": "cab"}],
    );
    check(
        doc! {"a": {"$regex": "^ab", "$options": "i"}},
        &[doc! {"a": "AB"}],
        &[doc! {"a": "b"}],
    );
    check(
        doc! {"a": {"$regex": re("b$", "")}},
        &[doc! {"a": "ab"}],
        &[doc! {"a": "ba"}],
    );
    check(
        doc! {"a": {"$regex": re("b", ""), "$options": "i"}},
        &[doc! {"a": "B"}],
        &[doc! {"a": "c"}],
    );
    // m: ^ and $ at line boundaries.
    check(
        doc! {"a": {"$regex": "^b$", "$options": "m"}},
        &[doc! {"a": "a\nb\nc"}],
        &[doc! {"a": "ab"}],
    );
    check(
        doc! {"a": {"$regex": "^b$"}},
        &[doc! {"a": "b"}],
        &[doc! {"a": "a\nb\nc"}],
    );
    // s: dot matches newline.
    check(
        doc! {"a": {"$regex": "a.b", "$options": "s"}},
        &[doc! {"a": "a\nb"}],
        &[],
    );
    check(
        doc! {"a": {"$regex": "a.b"}},
        &[doc! {"a": "axb"}],
        &[doc! {"a": "a\nb"}],
    );
    // x: whitespace and comments in the pattern are ignored.
    check(
        doc! {"a": {"$regex": "a b # comment", "$options": "x"}},
        &[doc! {"a": "ab"}],
        &[doc! {"a": "a b"}],
    );
    // Symbols match like strings; a stored regex matches only the same regex.
    check(
        doc! {"a": re("x", "")},
        &[
            doc! {"a": Bson::Symbol("x".into())},
            doc! {"a": re("x", "")},
        ],
        &[doc! {"a": re("x", "i")}],
    );
    // `$eq` with a regex is literal equality, not a pattern match.
    check(
        doc! {"a": {"$eq": re("x", "")}},
        &[doc! {"a": re("x", "")}],
        &[doc! {"a": "x"}],
    );
}

#[test]
fn size_operator() {
    check(
        doc! {"a": {"$size": 2}},
        &[doc! {"a": [1, [2, 3]]}],
        &[
            doc! {"a": [[1, 2]]},
            doc! {"a": [1]},
            doc! {"a": "ab"},
            doc! {},
        ],
    );
    check(
        doc! {"a": {"$size": 0}},
        &[doc! {"a": []}],
        &[doc! {"a": [1]}, doc! {}],
    );
    check(
        doc! {"a": {"$size": 1.0}},
        &[doc! {"a": [1]}],
        &[doc! {"a": []}],
    );
    check(
        doc! {"a.b": {"$size": 1}},
        &[doc! {"a": [{"b": [1]}, {"b": 1}]}],
        &[doc! {"a": [{"b": 1}]}],
    );
}

#[test]
fn mod_operator() {
    check(
        doc! {"a": {"$mod": [4, 1]}},
        &[
            doc! {"a": 5},
            doc! {"a": 9i64},
            doc! {"a": 5.9},
            doc! {"a": [2, 13]},
        ],
        &[
            doc! {"a": 4},
            doc! {"a": "5"},
            doc! {},
            doc! {"a": f64::NAN},
            doc! {"a": f64::INFINITY},
        ],
    );
    check(
        doc! {"a": {"$mod": [3, -1]}},
        &[doc! {"a": -4}],
        &[doc! {"a": 2}],
    );
    check(doc! {"a": {"$mod": [-1, 0]}}, &[doc! {"a": i64::MIN}], &[]);
    check(
        doc! {"a": {"$mod": [2.5, 0.9]}},
        &[doc! {"a": 4}],
        &[doc! {"a": 5}],
    );
}

#[test]
fn elem_match_value_form() {
    check(
        doc! {"a": {"$elemMatch": {"$gt": 1, "$lt": 5}}},
        &[doc! {"a": [0, 3]}],
        &[doc! {"a": [0, 10]}, doc! {"a": 3}, doc! {}],
    );
    // Elements are not expanded: a nested array is one element.
    check(
        doc! {"a": {"$elemMatch": {"$eq": 1}}},
        &[doc! {"a": [1]}],
        &[doc! {"a": [[1]]}],
    );
    check(
        doc! {"a": {"$elemMatch": {"$not": {"$gt": 5}}}},
        &[doc! {"a": [9, 2]}],
        &[doc! {"a": [9]}, doc! {"a": []}],
    );
    check(
        doc! {"a": {"$elemMatch": {"$regex": "^x"}}},
        &[doc! {"a": ["y", "xz"]}],
        &[doc! {"a": ["y"]}],
    );
}

#[test]
fn elem_match_query_form() {
    check(
        doc! {"a": {"$elemMatch": {"b": 1, "c": {"$gt": 2}}}},
        &[
            doc! {"a": [{"b": 1, "c": 3}]},
            doc! {"a": [{"b": 0}, {"b": [1], "c": [5]}]},
        ],
        &[
            doc! {"a": [{"b": 1, "c": 1}, {"b": 2, "c": 3}]},
            doc! {"a": {"b": 1, "c": 3}},
            doc! {"a": [1, 2]},
        ],
    );
    check(
        doc! {"a": {"$elemMatch": {"$or": [{"b": 1}, {"c": 1}]}}},
        &[doc! {"a": [{"c": 1}]}],
        &[doc! {"a": [{"d": 1}]}],
    );
    check(
        doc! {"a": {"$elemMatch": {}}},
        &[doc! {"a": [1, {}]}],
        &[doc! {"a": [1, 2]}, doc! {"a": []}],
    );
    check(
        doc! {"a.b": {"$elemMatch": {"c": 1}}},
        &[doc! {"a": [{"b": [{"c": 1}]}]}],
        &[doc! {"a": [{"b": {"c": 1}}]}],
    );
}

#[test]
fn nested_elem_match() {
    check(
        doc! {"a": {"$elemMatch": {"b": {"$elemMatch": {"c": {"$gte": 2}}}}}},
        &[doc! {"a": [{"b": [{"c": 1}, {"c": 2}]}]}],
        &[
            doc! {"a": [{"b": [{"c": 1}]}]},
            doc! {"a": [{"b": {"c": 3}}]},
        ],
    );
    check(
        doc! {"a": {"$elemMatch": {"$elemMatch": {"$gt": 5}}}},
        &[doc! {"a": [[1], [6]]}],
        &[doc! {"a": [6]}, doc! {"a": [[1]]}],
    );
}

#[test]
fn all_operator() {
    check(
        doc! {"a": {"$all": [1, 2]}},
        &[doc! {"a": [2, 3, 1]}],
        &[doc! {"a": [1]}, doc! {"a": 1}, doc! {}],
    );
    check(
        doc! {"a": {"$all": [1]}},
        &[doc! {"a": 1}, doc! {"a": [1]}],
        &[doc! {"a": 2}],
    );
    check(
        doc! {"a": {"$all": [[1, 2]]}},
        &[doc! {"a": [1, 2]}, doc! {"a": [[1, 2], 3]}],
        &[doc! {"a": [1, 2, 3]}],
    );
    check(
        doc! {"a": {"$all": [re("^x", ""), "yy"]}},
        &[doc! {"a": ["xa", "yy"]}],
        &[doc! {"a": ["xa"]}],
    );
    check(
        doc! {"a": {"$all": []}},
        &[],
        &[doc! {"a": []}, doc! {"a": [1]}],
    );
    check(
        doc! {"a": {"$all": [{"$elemMatch": {"b": 1}}, {"$elemMatch": {"c": {"$gt": 1}}}]}},
        &[doc! {"a": [{"b": 1}, {"c": 2}]}],
        &[doc! {"a": [{"b": 1}, {"c": 1}]}],
    );
}

#[test]
fn dbref_is_a_literal() {
    check(
        doc! {"a": {"$ref": "c", "$id": 1}},
        &[doc! {"a": {"$ref": "c", "$id": 1}}],
        &[doc! {"a": {"$ref": "c", "$id": 2}}],
    );
}

#[test]
fn malformed_raw_documents_do_not_panic() {
    // A document whose declared length is right but whose element is cut short.
    let bytes: Vec<u8> = vec![13, 0, 0, 0, 0x10, b'a', 0, 1, 0, 0xFF, 0xFF, 0xFF, 0];
    if let Ok(doc) = RawDocument::from_bytes(&bytes) {
        for f in [
            doc! {"a": 1},
            doc! {"a.b": null},
            doc! {"a": {"$exists": false}},
        ] {
            let _ = parse(f).matches(doc);
        }
    }
}
