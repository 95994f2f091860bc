//! Per-operator tests of the MongoDB 7.0 expression language: the
//! documented examples of each operator's manual page, null/missing
//! propagation, type errors with MongoDB's codes, Decimal128 exactness and
//! time zones.

use super::*;
use bson::{bson, doc, Decimal128};

fn ev(spec: Bson, d: &Document) -> Result<Value> {
    Expr::parse(&spec)?.eval(&Root::Doc(d))
}

fn ok(spec: Bson, d: &Document) -> Bson {
    match ev(spec.clone(), d) {
        Ok(v) => v.unwrap_or(Bson::String("MISSING".into())),
        Err(e) => panic!("{spec} failed: {e}"),
    }
}

fn code(spec: Bson, d: &Document) -> i32 {
    match ev(spec.clone(), d) {
        Ok(v) => panic!("{spec} should fail, gave {v:?}"),
        Err(e) => e.code(),
    }
}

fn parse_code(spec: Bson) -> i32 {
    match Expr::parse(&spec) {
        Ok(_) => panic!("{spec} should not parse"),
        Err(e) => e.code(),
    }
}

fn dec(s: &str) -> Bson {
    Bson::Decimal128(s.parse::<Decimal128>().expect("decimal"))
}

fn date(s: &str) -> Bson {
    Bson::DateTime(bson::DateTime::parse_rfc3339_str(s).expect("date"))
}

fn re(p: &str, o: &str) -> bson::Regex {
    bson::Regex {
        pattern: p.try_into().expect("cstr"),
        options: o.try_into().expect("cstr"),
    }
}

fn e() -> Document {
    Document::new()
}

#[test]
fn let_and_variables() {
    let d = doc! {"price": 10, "tax": 0.5, "applyDiscount": true};
    let spec = bson!({"$let": {
        "vars": {"total": {"$add": ["$price", "$tax"]}, "discounted": {"$cond": {"if": "$applyDiscount", "then": 0.9, "else": 1}}},
        "in": {"$multiply": ["$$total", "$$discounted"]}
    }});
    assert_eq!(ok(spec, &d), bson!(9.450000000000001));
    // Shadowing: the inner binding wins; the outer one is back after it.
    let spec = bson!({"$let": {"vars": {"x": 1}, "in": [
        {"$let": {"vars": {"x": 2}, "in": "$$x"}}, "$$x"
    ]}});
    assert_eq!(ok(spec, &d), bson!([2, 1]));
    // Values see the outer scope only.
    assert_eq!(
        parse_code(bson!({"$let": {"vars": {"a": 1, "b": "$$a"}, "in": "$$b"}})),
        17276
    );
    assert_eq!(parse_code(bson!("$$nope")), 17276);
    assert_eq!(
        parse_code(bson!({"$let": {"vars": {"Bad": 1}, "in": 1}})),
        16867
    );
    assert_eq!(parse_code(bson!({"$let": {"vars": {}}})), 16877);
    assert_eq!(parse_code(bson!({"$let": {"in": 1}})), 16876);
    assert_eq!(ok(bson!("$$CURRENT.price"), &d), bson!(10));
    assert_eq!(
        ok(
            bson!({"$let": {"vars": {"doc": "$$ROOT"}, "in": "$$doc.tax"}}),
            &d
        ),
        bson!(0.5)
    );
    assert_eq!(
        ok(bson!({"$ifNull": ["$$REMOVE", "gone"]}), &d),
        bson!("gone")
    );
    // $$NOW is one value for the whole parse.
    let e1 = Expr::parse(&bson!(["$$NOW", "$$NOW"])).expect("parse");
    let Some(Bson::Array(a)) = e1.eval(&Root::Doc(&d)).expect("eval") else {
        panic!("array")
    };
    assert!(matches!(a[0], Bson::DateTime(_)));
    assert_eq!(a[0], a[1]);
    assert!(matches!(
        ok(bson!("$$CLUSTER_TIME"), &d),
        Bson::Timestamp(_)
    ));
}

#[test]
fn command_let_constants() {
    let mut scope =
        Scope::with_let(Some(&doc! {"target": 5, "twice": {"$multiply": [2, 3]}})).expect("let");
    let e1 = Expr::parse_in(&bson!({"$add": ["$$target", "$$twice"]}), &mut scope).expect("parse");
    assert_eq!(e1.eval(&Root::Doc(&e())).expect("eval"), Some(bson!(11)));
    assert_eq!(
        Scope::with_let(Some(&doc! {"x": {"$add": ["$field", 1]}}))
            .expect_err("reads a field")
            .code(),
        4890500
    );
    assert_eq!(
        Scope::with_let(Some(&doc! {"X": 1}))
            .expect_err("name")
            .code(),
        16867
    );
}

#[test]
fn conditionals() {
    let d = doc! {"qty": 250, "n": null};
    assert_eq!(
        ok(
            bson!({"$cond": {"if": {"$gte": ["$qty", 250]}, "then": 30, "else": 20}}),
            &d
        ),
        bson!(30)
    );
    assert_eq!(
        ok(bson!({"$ifNull": ["$n", "$missing", "Unspecified"]}), &d),
        bson!("Unspecified")
    );
    let sw = bson!({"$switch": {"branches": [
        {"case": {"$lt": ["$qty", 100]}, "then": "small"},
        {"case": {"$lt": ["$qty", 300]}, "then": "medium"}
    ], "default": "large"}});
    assert_eq!(ok(sw, &d), bson!("medium"));
    let nodefault = bson!({"$switch": {"branches": [{"case": false, "then": 1}]}});
    assert_eq!(code(nodefault, &d), 40066);
    assert_eq!(parse_code(bson!({"$switch": {"branches": []}})), 40068);
    assert_eq!(
        parse_code(bson!({"$switch": {"branches": [{"case": 1}]}})),
        40065
    );
    assert_eq!(
        parse_code(bson!({"$switch": {"branches": [{"then": 1}]}})),
        40064
    );
    assert_eq!(parse_code(bson!({"$cond": {"if": 1, "then": 2}})), 17082);
    // Lazy: the failing branch is never evaluated.
    assert_eq!(
        ok(
            bson!({"$switch": {"branches": [{"case": true, "then": 1}], "default": {"$divide": [1, 0]}}}),
            &d
        ),
        bson!(1)
    );
}

#[test]
fn map_filter_reduce() {
    let d = doc! {"quizzes": [5, 6, 7], "items": [
        {"item_id": 43, "quantity": 2, "price": 10},
        {"item_id": 2, "quantity": 1, "price": 240}
    ], "n": null};
    assert_eq!(
        ok(
            bson!({"$map": {"input": "$quizzes", "as": "grade", "in": {"$add": ["$$grade", 2]}}}),
            &d
        ),
        bson!([7, 8, 9])
    );
    assert_eq!(
        ok(
            bson!({"$map": {"input": "$quizzes", "in": {"$multiply": ["$$this", 10]}}}),
            &d
        ),
        bson!([50, 60, 70])
    );
    assert_eq!(
        ok(bson!({"$map": {"input": "$n", "in": 1}}), &d),
        Bson::Null
    );
    assert_eq!(code(bson!({"$map": {"input": 1, "in": 1}}), &d), 16883);
    assert_eq!(
        parse_code(bson!({"$map": {"input": [], "x": 1, "in": 1}})),
        16879
    );
    let f = bson!({"$filter": {"input": "$items", "as": "item", "cond": {"$gte": ["$$item.price", 100]}}});
    assert_eq!(
        ok(f, &d),
        bson!([{"item_id": 2, "quantity": 1, "price": 240}])
    );
    assert_eq!(
        ok(
            bson!({"$filter": {"input": [1, 2, 3, 4], "cond": {"$gt": ["$$this", 1]}, "limit": 2}}),
            &d
        ),
        bson!([2, 3])
    );
    assert_eq!(
        code(
            bson!({"$filter": {"input": [1], "cond": true, "limit": 0}}),
            &d
        ),
        327392
    );
    assert_eq!(
        code(bson!({"$filter": {"input": "x", "cond": true}}), &d),
        28651
    );
    assert_eq!(
        ok(
            bson!({"$reduce": {"input": ["a", "b", "c"], "initialValue": "", "in": {"$concat": ["$$value", "$$this"]}}}),
            &d
        ),
        bson!("abc")
    );
    assert_eq!(
        ok(
            bson!({"$reduce": {"input": [1, 2, 3, 4], "initialValue": {"sum": 5, "product": 2}, "in": {
        "sum": {"$add": ["$$value.sum", "$$this"]}, "product": {"$multiply": ["$$value.product", "$$this"]}}}}),
            &d
        ),
        bson!({"sum": 15, "product": 48})
    );
    assert_eq!(
        ok(
            bson!({"$reduce": {"input": [[3, 4], [5, 6]], "initialValue": [1, 2], "in": {"$concatArrays": ["$$value", "$$this"]}}}),
            &d
        ),
        bson!([1, 2, 3, 4, 5, 6])
    );
    assert_eq!(
        code(
            bson!({"$reduce": {"input": 5, "initialValue": 0, "in": 1}}),
            &d
        ),
        40080
    );
    // Nested: an inner $map sees the outer variable.
    assert_eq!(
        ok(
            bson!({"$map": {"input": [1, 2], "as": "o", "in": {"$map": {"input": [10, 20], "as": "i", "in": {"$add": ["$$o", "$$i"]}}}}}),
            &d
        ),
        bson!([[11, 21], [12, 22]])
    );
}

#[test]
fn arithmetic_more() {
    let d = e();
    assert_eq!(ok(bson!({"$pow": [5, 0]}), &d), bson!(1));
    assert_eq!(ok(bson!({"$pow": [5, 2]}), &d), bson!(25));
    assert_eq!(
        ok(bson!({"$pow": [-5, 0.5]}), &d).as_f64().map(f64::is_nan),
        Some(true)
    );
    assert_eq!(ok(bson!({"$pow": [2, -1]}), &d), bson!(0.5));
    assert_eq!(code(bson!({"$pow": [0, -1]}), &d), 28764);
    assert_eq!(ok(bson!({"$pow": [2, 40]}), &d), Bson::Int64(1 << 40));
    assert_eq!(ok(bson!({"$sqrt": 25}), &d), bson!(5.0));
    assert_eq!(code(bson!({"$sqrt": -1}), &d), 28714);
    assert_eq!(ok(bson!({"$exp": 0}), &d), bson!(1.0));
    assert_eq!(ok(bson!({"$ln": 1}), &d), bson!(0.0));
    assert_eq!(code(bson!({"$ln": 0}), &d), 28766);
    assert_eq!(ok(bson!({"$log10": 100}), &d), bson!(2.0));
    assert_eq!(ok(bson!({"$log": [100, 10]}), &d), bson!(2.0));
    assert_eq!(code(bson!({"$log": [100, 1]}), &d), 28759);
    assert_eq!(code(bson!({"$log": [-1, 10]}), &d), 28758);
    assert_eq!(ok(bson!({"$trunc": [7.8, 0]}), &d), bson!(7.0));
    assert_eq!(ok(bson!({"$trunc": [-7.89, 1]}), &d), bson!(-7.8));
    assert_eq!(ok(bson!({"$trunc": [1899, -2]}), &d), bson!(1800));
    assert_eq!(ok(bson!({"$round": [19.25, 1]}), &d), bson!(19.2));
    assert_eq!(code(bson!({"$round": [1.5, 1.5]}), &d), 51081);
    assert_eq!(code(bson!({"$mod": [5, 0]}), &d), 16610);
    assert_eq!(code(bson!({"$mod": ["a", 1]}), &d), 16611);
    assert_eq!(code(bson!({"$divide": ["a", 1]}), &d), 14);
    assert_eq!(
        code(
            bson!({"$add": [date("2020-01-01T00:00:00Z"), date("2020-01-01T00:00:00Z")]}),
            &d
        ),
        16612
    );
    assert_eq!(code(bson!({"$abs": "x"}), &d), 28765);
    assert_eq!(ok(bson!({"$sin": 0}), &d), bson!(0.0));
    assert_eq!(code(bson!({"$acos": 2}), &d), 50989);
    assert_eq!(
        ok(bson!({"$degreesToRadians": 180}), &d),
        bson!(std::f64::consts::PI)
    );
    assert_eq!(ok(bson!({"$sum": [[1, 2, "x", 3]]}), &d), bson!(6));
    assert_eq!(ok(bson!({"$sum": [1, 2.5]}), &d), bson!(3.5));
    assert_eq!(ok(bson!({"$avg": [[1, 2, 3, 4]]}), &d), bson!(2.5));
    assert_eq!(ok(bson!({"$avg": [["x"]]}), &d), Bson::Null);
    assert_eq!(
        ok(bson!({"$stdDevPop": [[1, 2, 3, 4]]}), &d),
        bson!(1.118033988749895)
    );
    assert_eq!(ok(bson!({"$stdDevSamp": [[1]]}), &d), Bson::Null);
    assert_eq!(ok(bson!({"$bitAnd": [12, 10]}), &d), bson!(8));
    assert_eq!(ok(bson!({"$bitOr": [12, 10i64]}), &d), Bson::Int64(14));
    assert_eq!(ok(bson!({"$bitXor": [12, 10]}), &d), bson!(6));
    assert_eq!(ok(bson!({"$bitNot": 0}), &d), bson!(-1));
    assert_eq!(ok(bson!({"$bitAnd": [1, null]}), &d), Bson::Null);
    assert_eq!(code(bson!({"$bitAnd": [1, 1.5]}), &d), 14);
    let ts = Bson::Timestamp(bson::Timestamp {
        time: 1_700_000_000,
        increment: 7,
    });
    assert_eq!(
        ok(bson!({"$tsSecond": ts.clone()}), &d),
        Bson::Int64(1_700_000_000)
    );
    assert_eq!(ok(bson!({"$tsIncrement": ts}), &d), Bson::Int64(7));
    assert_eq!(code(bson!({"$tsSecond": 1}), &d), 5687301);
    let Bson::Double(r) = ok(bson!({"$rand": {}}), &d) else {
        panic!("double")
    };
    assert!((0.0..1.0).contains(&r));
}

#[test]
fn decimal_is_exact() {
    let d = doc! {"a": dec("0.1"), "b": dec("0.2")};
    assert_eq!(ok(bson!({"$add": ["$a", "$b"]}), &d), dec("0.3"));
    assert_eq!(ok(bson!({"$add": ["$a", 1]}), &d), dec("1.1"));
    // A double becomes a decimal of 15 significant digits, as MongoDB's.
    assert_eq!(
        ok(bson!({"$add": ["$a", 0.1]}), &d),
        dec("0.200000000000000")
    );
    assert_eq!(ok(bson!({"$subtract": ["$b", "$a"]}), &d), dec("0.1"));
    assert_eq!(ok(bson!({"$multiply": ["$a", "$b"]}), &d), dec("0.02"));
    assert_eq!(
        ok(bson!({"$divide": [dec("1"), dec("3")]}), &d),
        dec("0.3333333333333333333333333333333333")
    );
    assert_eq!(code(bson!({"$divide": [dec("1"), dec("0")]}), &d), 2);
    assert_eq!(ok(bson!({"$mod": [dec("10.5"), 3]}), &d), dec("1.5"));
    assert_eq!(ok(bson!({"$abs": dec("-2.50")}), &d), dec("2.50"));
    assert_eq!(ok(bson!({"$round": [dec("2.345"), 2]}), &d), dec("2.34"));
    assert_eq!(ok(bson!({"$trunc": [dec("2.349"), 2]}), &d), dec("2.34"));
    assert_eq!(ok(bson!({"$floor": dec("-2.5")}), &d), dec("-3"));
    assert_eq!(ok(bson!({"$ceil": dec("2.1")}), &d), dec("3"));
    assert_eq!(ok(bson!({"$sqrt": dec("16")}), &d), dec("4"));
    assert_eq!(ok(bson!({"$sum": [["$a", "$b", 1]]}), &d), dec("1.3"));
    assert_eq!(ok(bson!({"$toDecimal": "1.25"}), &d), dec("1.25"));
    assert_eq!(ok(bson!({"$toDouble": dec("1.25")}), &d), bson!(1.25));
    assert_eq!(ok(bson!({"$toInt": dec("7.9")}), &d), bson!(7));
    let big = "12345678901234567890.123456789";
    assert_eq!(ok(bson!({"$add": [dec(big), dec("0")]}), &d), dec(big));
    assert_eq!(
        ok(
            bson!({"$add": [date("2020-01-01T00:00:00Z"), dec("1000")]}),
            &d
        ),
        date("2020-01-01T00:00:01Z")
    );
}

#[test]
fn arrays() {
    let d =
        doc! {"a": [1, 2, 3], "n": null, "favorites": ["chocolate", "cake", "butter", "apples"]};
    assert_eq!(ok(bson!({"$first": "$a"}), &d), bson!(1));
    assert_eq!(ok(bson!({"$last": "$a"}), &d), bson!(3));
    assert_eq!(ok(bson!({"$first": "$n"}), &d), Bson::Null);
    assert_eq!(ok(bson!({"$first": [[]]}), &d), bson!("MISSING"));
    assert_eq!(code(bson!({"$first": 1}), &d), 28689);
    assert_eq!(
        ok(bson!({"$concatArrays": ["$a", [4], [[5]]]}), &d),
        bson!([1, 2, 3, 4, [5]])
    );
    assert_eq!(ok(bson!({"$concatArrays": ["$a", "$n"]}), &d), Bson::Null);
    assert_eq!(code(bson!({"$concatArrays": ["$a", 1]}), &d), 28664);
    assert_eq!(
        ok(bson!({"$indexOfArray": [["a", "abc", "b"], "b"]}), &d),
        bson!(2)
    );
    assert_eq!(
        ok(bson!({"$indexOfArray": [[1, 2, 3, 2], 2, 2]}), &d),
        bson!(3)
    );
    assert_eq!(ok(bson!({"$indexOfArray": [[1, 2], 5]}), &d), bson!(-1));
    assert_eq!(ok(bson!({"$indexOfArray": ["$n", 5]}), &d), Bson::Null);
    assert_eq!(code(bson!({"$indexOfArray": [1, 5]}), &d), 40090);
    assert_eq!(ok(bson!({"$isArray": ["$a"]}), &d), bson!(true));
    assert_eq!(ok(bson!({"$range": [0, 10, 3]}), &d), bson!([0, 3, 6, 9]));
    assert_eq!(ok(bson!({"$range": [10, 0, -4]}), &d), bson!([10, 6, 2]));
    assert_eq!(ok(bson!({"$range": [0, 0]}), &d), bson!([]));
    assert_eq!(code(bson!({"$range": [0, 5, 0]}), &d), 34449);
    assert_eq!(code(bson!({"$range": ["a", 5]}), &d), 34443);
    assert_eq!(code(bson!({"$range": [0.5, 5]}), &d), 34444);
    assert_eq!(ok(bson!({"$reverseArray": "$a"}), &d), bson!([3, 2, 1]));
    assert_eq!(code(bson!({"$reverseArray": 1}), &d), 34435);
    assert_eq!(
        ok(bson!({"$slice": ["$favorites", 1]}), &d),
        bson!(["chocolate"])
    );
    assert_eq!(
        ok(bson!({"$slice": ["$favorites", -2]}), &d),
        bson!(["butter", "apples"])
    );
    assert_eq!(
        ok(bson!({"$slice": ["$favorites", 1, 2]}), &d),
        bson!(["cake", "butter"])
    );
    assert_eq!(
        ok(bson!({"$slice": ["$favorites", -3, 2]}), &d),
        bson!(["cake", "butter"])
    );
    assert_eq!(ok(bson!({"$slice": ["$favorites", 10, 2]}), &d), bson!([]));
    assert_eq!(code(bson!({"$slice": ["$favorites", 1, 0]}), &d), 28729);
    assert_eq!(code(bson!({"$slice": [1, 1]}), &d), 28724);
    assert_eq!(
        ok(
            bson!({"$arrayToObject": [[["item", "abc123"], ["qty", 25]]]}),
            &d
        ),
        bson!({"item": "abc123", "qty": 25})
    );
    assert_eq!(
        ok(
            bson!({"$arrayToObject": [[{"k": "item", "v": "abc123"}, {"k": "qty", "v": 25}]]}),
            &d
        ),
        bson!({"item": "abc123", "qty": 25})
    );
    assert_eq!(
        code(
            bson!({"$arrayToObject": [[["a", 1], {"k": "b", "v": 2}]]}),
            &d
        ),
        40396
    );
    assert_eq!(code(bson!({"$arrayToObject": [[[1, 1]]]}), &d), 40395);
    assert_eq!(
        ok(bson!({"$objectToArray": {"item": "foo", "qty": 25}}), &d),
        bson!([{"k": "item", "v": "foo"}, {"k": "qty", "v": 25}])
    );
    assert_eq!(code(bson!({"$objectToArray": 1}), &d), 40390);
    assert_eq!(
        ok(bson!({"$zip": {"inputs": [[1, 2, 3], ["a", "b"]]}}), &d),
        bson!([[1, "a"], [2, "b"]])
    );
    assert_eq!(
        ok(
            bson!({"$zip": {"inputs": [[1, 2, 3], ["a"]], "useLongestLength": true, "defaults": [0, "z"]}}),
            &d
        ),
        bson!([[1, "a"], [2, "z"], [3, "z"]])
    );
    assert_eq!(ok(bson!({"$zip": {"inputs": [[1], "$n"]}}), &d), Bson::Null);
    assert_eq!(code(bson!({"$zip": {"inputs": [[1], 1]}}), &d), 34468);
    assert_eq!(
        ok(
            bson!({"$sortArray": {"input": [3, 1, "a", 2], "sortBy": 1}}),
            &d
        ),
        bson!([1, 2, 3, "a"])
    );
    assert_eq!(
        ok(
            bson!({"$sortArray": {"input": [{"n": 2}, {"n": 1}], "sortBy": {"n": -1}}}),
            &d
        ),
        bson!([{"n": 2}, {"n": 1}])
    );
    assert_eq!(
        ok(bson!({"$firstN": {"n": 2, "input": [10, 20, 30]}}), &d),
        bson!([10, 20])
    );
    assert_eq!(
        ok(bson!({"$lastN": {"n": 2, "input": [10, 20, 30]}}), &d),
        bson!([20, 30])
    );
    assert_eq!(
        ok(bson!({"$maxN": {"n": 2, "input": [null, 10, 30, 20]}}), &d),
        bson!([30, 20])
    );
    assert_eq!(
        ok(bson!({"$minN": {"n": 5, "input": [null, 10, 30, 20]}}), &d),
        bson!([10, 20, 30])
    );
    assert_eq!(
        code(bson!({"$firstN": {"n": 0, "input": [1]}}), &d),
        5787908
    );
    assert_eq!(ok(bson!({"$in": [2, "$a"]}), &d), bson!(true));
    assert_eq!(
        ok(
            bson!({"$median": {"input": [1, 2, 3, 4, 5], "method": "approximate"}}),
            &d
        ),
        bson!(3.0)
    );
    assert_eq!(
        ok(
            bson!({"$percentile": {"input": [1, 2, 3, 4], "p": [0.5, 0.95], "method": "approximate"}}),
            &d
        ),
        bson!([2.0, 4.0])
    );
}

#[test]
fn sets() {
    let d = doc! {"a": ["a", "b", "a"], "b": ["b", "a"], "c": ["c"], "n": null};
    assert_eq!(ok(bson!({"$setEquals": ["$a", "$b"]}), &d), bson!(true));
    assert_eq!(ok(bson!({"$setEquals": ["$a", "$c"]}), &d), bson!(false));
    assert_eq!(
        ok(bson!({"$setIntersection": ["$a", ["a", "x"]]}), &d),
        bson!(["a"])
    );
    assert_eq!(
        ok(bson!({"$setUnion": ["$a", "$c"]}), &d),
        bson!(["a", "b", "c"])
    );
    assert_eq!(ok(bson!({"$setUnion": [[1, 1.0, 2]]}), &d), bson!([1, 2]));
    assert_eq!(ok(bson!({"$setDifference": ["$a", "$b"]}), &d), bson!([]));
    assert_eq!(
        ok(bson!({"$setDifference": [["x", "a"], "$b"]}), &d),
        bson!(["x"])
    );
    assert_eq!(ok(bson!({"$setIsSubset": ["$b", "$a"]}), &d), bson!(true));
    assert_eq!(ok(bson!({"$setUnion": ["$a", "$n"]}), &d), Bson::Null);
    assert_eq!(code(bson!({"$setUnion": ["$a", 1]}), &d), 17043);
    assert_eq!(code(bson!({"$setEquals": ["$a", "$n"]}), &d), 17044);
    assert_eq!(code(bson!({"$setIsSubset": [1, "$a"]}), &d), 17046);
    assert_eq!(code(bson!({"$setDifference": ["$a", 1]}), &d), 17049);
    assert_eq!(
        ok(bson!({"$anyElementTrue": [[0, null, 1]]}), &d),
        bson!(true)
    );
    assert_eq!(
        ok(bson!({"$allElementsTrue": [[true, 1, "x", []]]}), &d),
        bson!(true)
    );
    assert_eq!(ok(bson!({"$allElementsTrue": [[]]}), &d), bson!(true));
    assert_eq!(code(bson!({"$anyElementTrue": [1]}), &d), 17041);
}

#[test]
fn strings_more() {
    let d = doc! {"s": "cafétéria", "n": null};
    assert_eq!(ok(bson!({"$strLenBytes": "$s"}), &d), bson!(11));
    assert_eq!(ok(bson!({"$strLenCP": "$s"}), &d), bson!(9));
    assert_eq!(code(bson!({"$strLenCP": "$n"}), &d), 34471);
    assert_eq!(ok(bson!({"$substrCP": ["$s", 2, 3]}), &d), bson!("fét"));
    assert_eq!(code(bson!({"$substrCP": ["$s", -1, 3]}), &d), 34455);
    assert_eq!(ok(bson!({"$indexOfCP": ["$s", "é"]}), &d), bson!(3));
    assert_eq!(ok(bson!({"$indexOfBytes": ["$s", "é"]}), &d), bson!(3));
    assert_eq!(ok(bson!({"$indexOfCP": ["$s", "é", 4]}), &d), bson!(5));
    assert_eq!(ok(bson!({"$indexOfCP": ["$s", "z"]}), &d), bson!(-1));
    assert_eq!(ok(bson!({"$indexOfCP": ["$n", "z"]}), &d), Bson::Null);
    assert_eq!(code(bson!({"$indexOfCP": [1, "z"]}), &d), 40091);
    assert_eq!(
        ok(bson!({"$split": ["June-15-2013", "-"]}), &d),
        bson!(["June", "15", "2013"])
    );
    assert_eq!(ok(bson!({"$split": ["$n", "-"]}), &d), Bson::Null);
    assert_eq!(code(bson!({"$split": ["a", ""]}), &d), 40087);
    assert_eq!(code(bson!({"$split": [1, "-"]}), &d), 40085);
    assert_eq!(ok(bson!({"$strcasecmp": ["ABC", "abc"]}), &d), bson!(0));
    assert_eq!(ok(bson!({"$strcasecmp": ["a", "B"]}), &d), bson!(-1));
    assert_eq!(
        ok(bson!({"$trim": {"input": "  \n good  bye \t "}}), &d),
        bson!("good  bye")
    );
    assert_eq!(
        ok(bson!({"$ltrim": {"input": "xxhixx", "chars": "x"}}), &d),
        bson!("hixx")
    );
    assert_eq!(
        ok(bson!({"$rtrim": {"input": "xxhixx", "chars": "x"}}), &d),
        bson!("xxhi")
    );
    assert_eq!(ok(bson!({"$trim": {"input": "$n"}}), &d), Bson::Null);
    assert_eq!(code(bson!({"$trim": {"input": 1}}), &d), 50699);
    assert_eq!(parse_code(bson!({"$trim": {"chars": "x"}})), 50695);
    assert_eq!(
        ok(
            bson!({"$replaceOne": {"input": "blue paint blue", "find": "blue", "replacement": "red"}}),
            &d
        ),
        bson!("red paint blue")
    );
    assert_eq!(
        ok(
            bson!({"$replaceAll": {"input": "blue paint blue", "find": "blue", "replacement": "red"}}),
            &d
        ),
        bson!("red paint red")
    );
    assert_eq!(
        ok(
            bson!({"$replaceAll": {"input": "$n", "find": "a", "replacement": "b"}}),
            &d
        ),
        Bson::Null
    );
    assert_eq!(
        code(
            bson!({"$replaceAll": {"input": 1, "find": "a", "replacement": "b"}}),
            &d
        ),
        51746
    );
    assert_eq!(ok(bson!({"$toUpper": 5}), &d), bson!("5"));
}

#[test]
fn regexes() {
    let d = doc! {"description": "Single LINE description.", "n": null};
    assert_eq!(
        ok(
            bson!({"$regexMatch": {"input": "$description", "regex": "line"}}),
            &d
        ),
        bson!(false)
    );
    assert_eq!(
        ok(
            bson!({"$regexMatch": {"input": "$description", "regex": "line", "options": "i"}}),
            &d
        ),
        bson!(true)
    );
    assert_eq!(
        ok(
            bson!({"$regexMatch": {"input": "$description", "regex": Bson::RegularExpression(re("line", "i"))}}),
            &d
        ),
        bson!(true)
    );
    assert_eq!(
        ok(
            bson!({"$regexFind": {"input": "$description", "regex": "(L)(I)N(x)?"}}),
            &d
        ),
        bson!({"match": "LIN", "idx": 7, "captures": ["L", "I", null]})
    );
    assert_eq!(
        ok(
            bson!({"$regexFindAll": {"input": "a1b22", "regex": "[0-9]+"}}),
            &d
        ),
        bson!([{"match": "1", "idx": 1, "captures": []}, {"match": "22", "idx": 3, "captures": []}])
    );
    assert_eq!(
        ok(bson!({"$regexFind": {"input": "$n", "regex": "x"}}), &d),
        Bson::Null
    );
    assert_eq!(
        ok(bson!({"$regexFindAll": {"input": "$n", "regex": "x"}}), &d),
        bson!([])
    );
    assert_eq!(
        code(bson!({"$regexMatch": {"input": 1, "regex": "x"}}), &d),
        51104
    );
    assert_eq!(
        code(bson!({"$regexMatch": {"input": "a", "regex": 1}}), &d),
        51105
    );
    assert_eq!(
        code(bson!({"$regexMatch": {"input": "a", "regex": "(", }}), &d),
        51111
    );
    assert_eq!(
        code(
            bson!({"$regexMatch": {"input": "a", "regex": Bson::RegularExpression(re("a", "i")), "options": "m"}}),
            &d
        ),
        51107
    );
    assert_eq!(
        ok(bson!({"$regexFind": {"input": "héllo", "regex": "l+"}}), &d),
        bson!({"match": "ll", "idx": 2, "captures": []})
    );
}

#[test]
fn conversions() {
    let d = doc! {"n": null};
    assert_eq!(ok(bson!({"$type": "$missing"}), &d), bson!("missing"));
    assert_eq!(ok(bson!({"$type": [[1]]}), &d), bson!("array"));
    assert_eq!(ok(bson!({"$type": 1i64}), &d), bson!("long"));
    assert_eq!(ok(bson!({"$isNumber": dec("1")}), &d), bson!(true));
    assert_eq!(ok(bson!({"$toInt": "42"}), &d), bson!(42));
    assert_eq!(ok(bson!({"$toInt": 3.9}), &d), bson!(3));
    assert_eq!(ok(bson!({"$toInt": true}), &d), bson!(1));
    assert_eq!(code(bson!({"$toInt": "4.5"}), &d), 241);
    assert_eq!(code(bson!({"$toInt": 1e20}), &d), 241);
    assert_eq!(
        ok(bson!({"$toLong": date("1970-01-01T00:00:01Z")}), &d),
        Bson::Int64(1000)
    );
    assert_eq!(ok(bson!({"$toDouble": "2.5"}), &d), bson!(2.5));
    assert_eq!(ok(bson!({"$toString": 2.5}), &d), bson!("2.5"));
    assert_eq!(ok(bson!({"$toString": 2.0}), &d), bson!("2"));
    assert_eq!(
        ok(bson!({"$toString": date("2018-03-27T16:58:51.538Z")}), &d),
        bson!("2018-03-27T16:58:51.538Z")
    );
    assert_eq!(ok(bson!({"$toBool": 0}), &d), bson!(false));
    assert_eq!(ok(bson!({"$toBool": ""}), &d), bson!(true));
    assert_eq!(
        ok(bson!({"$toDate": "2018-03-03"}), &d),
        date("2018-03-03T00:00:00Z")
    );
    assert_eq!(
        ok(bson!({"$toDate": "2018-03-20T11:00:06.000+01:00"}), &d),
        date("2018-03-20T10:00:06Z")
    );
    assert_eq!(
        ok(bson!({"$toDate": 120000000000.5}), &d),
        date("1973-10-20T21:20:00Z")
    );
    assert_eq!(code(bson!({"$toDate": 5}), &d), 241);
    let oid = bson::oid::ObjectId::parse_str("5ab9cbfa31c2ab715d42129e").expect("oid");
    assert_eq!(
        ok(bson!({"$toObjectId": "5ab9cbfa31c2ab715d42129e"}), &d),
        Bson::ObjectId(oid)
    );
    assert_eq!(code(bson!({"$toObjectId": "xyz"}), &d), 241);
    assert_eq!(ok(bson!({"$toInt": "$n"}), &d), Bson::Null);
    assert_eq!(
        ok(
            bson!({"$convert": {"input": "abc", "to": "int", "onError": -1}}),
            &d
        ),
        bson!(-1)
    );
    assert_eq!(
        ok(
            bson!({"$convert": {"input": "$n", "to": "int", "onNull": 0}}),
            &d
        ),
        bson!(0)
    );
    assert_eq!(
        ok(
            bson!({"$convert": {"input": "$missing", "to": "int", "onNull": "none"}}),
            &d
        ),
        bson!("none")
    );
    assert_eq!(
        ok(bson!({"$convert": {"input": "5", "to": 16}}), &d),
        bson!(5)
    );
    assert_eq!(
        ok(bson!({"$convert": {"input": 5, "to": "bool"}}), &d),
        bson!(true)
    );
    assert_eq!(
        code(bson!({"$convert": {"input": 5, "to": "objectId"}}), &d),
        241
    );
    assert_eq!(code(bson!({"$convert": {"input": 5, "to": "nope"}}), &d), 2);
    // onError is lazy: not evaluated when the conversion succeeds.
    assert_eq!(
        ok(
            bson!({"$convert": {"input": "5", "to": "int", "onError": {"$divide": [1, 0]}}}),
            &d
        ),
        bson!(5)
    );
}

#[test]
fn objects() {
    let d =
        doc! {"a": {"x": 1, "y": 2}, "b": {"y": 3, "z": 4}, "n": null, "p": {"a.b": 7, "$c": 8}};
    assert_eq!(
        ok(bson!({"$mergeObjects": ["$a", "$n", "$b"]}), &d),
        bson!({"x": 1, "y": 3, "z": 4})
    );
    assert_eq!(ok(bson!({"$mergeObjects": []}), &d), bson!({}));
    assert_eq!(code(bson!({"$mergeObjects": ["$a", 1]}), &d), 40400);
    assert_eq!(
        ok(bson!({"$getField": {"field": "a.b", "input": "$p"}}), &d),
        bson!(7)
    );
    assert_eq!(
        ok(
            bson!({"$getField": {"field": {"$literal": "$c"}, "input": "$p"}}),
            &d
        ),
        bson!(8)
    );
    assert_eq!(ok(bson!({"$getField": "n"}), &d), Bson::Null);
    assert_eq!(
        ok(bson!({"$getField": {"field": "x", "input": 5}}), &d),
        bson!("MISSING")
    );
    assert_eq!(
        code(bson!({"$getField": {"field": 5, "input": "$p"}}), &d),
        3041704
    );
    assert_eq!(
        ok(
            bson!({"$setField": {"field": "a.b", "input": "$p", "value": 1}}),
            &d
        ),
        bson!({"a.b": 1, "$c": 8})
    );
    assert_eq!(
        ok(
            bson!({"$setField": {"field": "q", "input": "$a", "value": "$$REMOVE"}}),
            &d
        ),
        bson!({"x": 1, "y": 2})
    );
    assert_eq!(
        ok(bson!({"$unsetField": {"field": "x", "input": "$a"}}), &d),
        bson!({"y": 2})
    );
    assert_eq!(
        ok(bson!({"$unsetField": {"field": "x", "input": "$n"}}), &d),
        Bson::Null
    );
    assert_eq!(
        code(bson!({"$unsetField": {"field": "x", "input": 3}}), &d),
        4161105
    );
    assert_eq!(ok(bson!({"$bsonSize": "$a"}), &d), bson!(19));
    assert_eq!(ok(bson!({"$binarySize": "héllo"}), &d), bson!(6));
    assert_eq!(ok(bson!({"$literal": {"$add": 1}}), &d), bson!({"$add": 1}));
    assert_eq!(parse_code(bson!({"$frobnicate": 1})), 168);
}

#[test]
fn dates_with_zones() {
    // 2014-01-01T08:15:39.736Z, the manual's example.
    let d = doc! {"date": date("2014-01-01T08:15:39.736Z"), "n": null};
    let part = |op: &str, tz: Option<&str>| -> Bson {
        let arg = match tz {
            Some(z) => bson!({"date": "$date", "timezone": z}),
            None => bson!("$date"),
        };
        ok(Bson::Document(doc! {op: arg}), &d)
    };
    assert_eq!(part("$year", None), bson!(2014));
    assert_eq!(part("$month", None), bson!(1));
    assert_eq!(part("$dayOfMonth", None), bson!(1));
    assert_eq!(part("$hour", None), bson!(8));
    assert_eq!(part("$minute", None), bson!(15));
    assert_eq!(part("$second", None), bson!(39));
    assert_eq!(part("$millisecond", None), bson!(736));
    assert_eq!(part("$dayOfYear", None), bson!(1));
    assert_eq!(part("$dayOfWeek", None), bson!(4));
    assert_eq!(part("$week", None), bson!(0));
    assert_eq!(part("$isoWeek", None), bson!(1));
    assert_eq!(part("$isoDayOfWeek", None), bson!(3));
    assert_eq!(part("$isoWeekYear", None), Bson::Int64(2014));
    assert_eq!(part("$hour", Some("America/New_York")), bson!(3));
    assert_eq!(part("$hour", Some("+05:30")), bson!(13));
    assert_eq!(part("$minute", Some("+05:30")), bson!(45));
    assert_eq!(part("$year", Some("-09")), bson!(2013));
    assert_eq!(part("$dayOfMonth", Some("-0900")), bson!(31));
    assert_eq!(
        code(
            bson!({"$hour": {"date": "$date", "timezone": "Mars/Olympus"}}),
            &d
        ),
        40485
    );
    assert_eq!(
        ok(bson!({"$hour": {"date": "$date", "timezone": "$n"}}), &d),
        Bson::Null
    );
    assert_eq!(ok(bson!({"$year": "$n"}), &d), Bson::Null);
    // DST: New York is UTC-4 in July.
    let summer = doc! {"date": date("2014-07-01T08:00:00Z")};
    assert_eq!(
        ok(
            bson!({"$hour": {"date": "$date", "timezone": "America/New_York"}}),
            &summer
        ),
        bson!(4)
    );
    assert_eq!(
        ok(
            bson!({"$dateToString": {"format": "%Y-%m-%d", "date": "$date"}}),
            &d
        ),
        bson!("2014-01-01")
    );
    assert_eq!(
        ok(
            bson!({"$dateToString": {"format": "%H:%M:%S:%L%z", "date": "$date", "timezone": "America/New_York"}}),
            &d
        ),
        bson!("03:15:39:736-0500")
    );
    assert_eq!(
        ok(
            bson!({"$dateToString": {"format": "%Z", "date": "$date", "timezone": "America/New_York"}}),
            &d
        ),
        bson!("-300")
    );
    assert_eq!(
        ok(bson!({"$dateToString": {"date": "$date"}}), &d),
        bson!("2014-01-01T08:15:39.736Z")
    );
    assert_eq!(
        ok(
            bson!({"$dateToString": {"format": "%j %w %U %u %V %G", "date": "$date"}}),
            &d
        ),
        bson!("001 4 00 3 01 2014")
    );
    assert_eq!(
        ok(
            bson!({"$dateToString": {"date": "$n", "onNull": "none"}}),
            &d
        ),
        bson!("none")
    );
    assert_eq!(
        code(
            bson!({"$dateToString": {"format": "%Q", "date": "$date"}}),
            &d
        ),
        18536
    );
    assert_eq!(
        code(
            bson!({"$dateToString": {"format": "%", "date": "$date"}}),
            &d
        ),
        18535
    );
    assert_eq!(
        ok(bson!({"$dateToParts": {"date": "$date"}}), &d),
        bson!({"year": 2014, "month": 1, "day": 1, "hour": 8, "minute": 15, "second": 39, "millisecond": 736})
    );
    assert_eq!(
        ok(
            bson!({"$dateToParts": {"date": "$date", "timezone": "America/New_York", "iso8601": true}}),
            &d
        ),
        bson!({"isoWeekYear": 2014, "isoWeek": 1, "isoDayOfWeek": 3, "hour": 3, "minute": 15, "second": 39, "millisecond": 736})
    );
    assert_eq!(
        ok(
            bson!({"$dateFromParts": {"year": 2017, "month": 2, "day": 8, "hour": 12}}),
            &d
        ),
        date("2017-02-08T12:00:00Z")
    );
    assert_eq!(
        ok(
            bson!({"$dateFromParts": {"isoWeekYear": 2017, "isoWeek": 6, "isoDayOfWeek": 3, "hour": 12}}),
            &d
        ),
        date("2017-02-08T12:00:00Z")
    );
    assert_eq!(
        ok(
            bson!({"$dateFromParts": {"year": 2016, "month": 12, "day": 31, "hour": 23, "minute": 46, "second": 12, "timezone": "America/New_York"}}),
            &d
        ),
        date("2017-01-01T04:46:12Z")
    );
    // Out-of-range parts carry over.
    assert_eq!(
        ok(
            bson!({"$dateFromParts": {"year": 2017, "month": 14, "day": 1}}),
            &d
        ),
        date("2018-02-01T00:00:00Z")
    );
    assert_eq!(
        ok(
            bson!({"$dateFromParts": {"year": 2017, "month": 1, "day": 0}}),
            &d
        ),
        date("2016-12-31T00:00:00Z")
    );
    assert_eq!(code(bson!({"$dateFromParts": {"year": 0}}), &d), 40523);
    assert_eq!(
        code(bson!({"$dateFromParts": {"year": 2017, "isoWeek": 1}}), &d),
        40525
    );
    assert_eq!(
        ok(bson!({"$dateFromParts": {"year": "$n"}}), &d),
        Bson::Null
    );
}

#[test]
fn date_strings_and_calendar_arithmetic() {
    let d = doc! {"n": null};
    assert_eq!(
        ok(
            bson!({"$dateFromString": {"dateString": "2017-02-08T12:10:40.787"}}),
            &d
        ),
        date("2017-02-08T12:10:40.787Z")
    );
    assert_eq!(
        ok(
            bson!({"$dateFromString": {"dateString": "2017-02-08T12:10:40.787", "timezone": "America/New_York"}}),
            &d
        ),
        date("2017-02-08T17:10:40.787Z")
    );
    assert_eq!(
        ok(
            bson!({"$dateFromString": {"dateString": "15-06-2018", "format": "%d-%m-%Y"}}),
            &d
        ),
        date("2018-06-15T00:00:00Z")
    );
    assert_eq!(
        ok(
            bson!({"$dateFromString": {"dateString": "2017-02-08 12:10:40+0130"}}),
            &d
        ),
        date("2017-02-08T10:40:40Z")
    );
    assert_eq!(
        code(bson!({"$dateFromString": {"dateString": "not a date"}}), &d),
        241
    );
    assert_eq!(
        ok(
            bson!({"$dateFromString": {"dateString": "not a date", "onError": "bad"}}),
            &d
        ),
        bson!("bad")
    );
    assert_eq!(
        ok(
            bson!({"$dateFromString": {"dateString": "$n", "onNull": "nothing"}}),
            &d
        ),
        bson!("nothing")
    );
    assert_eq!(code(bson!({"$dateFromString": {"dateString": 5}}), &d), 241);
    assert_eq!(
        ok(
            bson!({"$dateTrunc": {"date": date("2021-03-20T11:30:05.123Z"), "unit": "hour"}}),
            &d
        ),
        date("2021-03-20T11:00:00Z")
    );
    assert_eq!(
        ok(
            bson!({"$dateTrunc": {"date": date("2021-03-20T11:30:05Z"), "unit": "week", "startOfWeek": "monday"}}),
            &d
        ),
        date("2021-03-15T00:00:00Z")
    );
    assert_eq!(
        ok(
            bson!({"$dateTrunc": {"date": date("2021-03-20T11:30:05Z"), "unit": "week"}}),
            &d
        ),
        date("2021-03-14T00:00:00Z")
    );
    assert_eq!(
        ok(
            bson!({"$dateTrunc": {"date": date("2021-05-20T11:30:05Z"), "unit": "quarter"}}),
            &d
        ),
        date("2021-04-01T00:00:00Z")
    );
    assert_eq!(
        ok(
            bson!({"$dateTrunc": {"date": date("2021-05-20T11:30:05Z"), "unit": "month", "binSize": 6}}),
            &d
        ),
        date("2021-01-01T00:00:00Z")
    );
    assert_eq!(
        ok(
            bson!({"$dateTrunc": {"date": date("2021-03-20T03:30:05Z"), "unit": "day", "timezone": "America/New_York"}}),
            &d
        ),
        date("2021-03-19T04:00:00Z")
    );
    assert_eq!(
        code(
            bson!({"$dateTrunc": {"date": date("2021-03-20T03:30:05Z"), "unit": "fortnight"}}),
            &d
        ),
        5439014
    );
    assert_eq!(
        code(bson!({"$dateTrunc": {"date": 5, "unit": "day"}}), &d),
        5439012
    );
    assert_eq!(
        ok(
            bson!({"$dateAdd": {"startDate": date("2020-10-31T12:10:05Z"), "unit": "month", "amount": 1}}),
            &d
        ),
        date("2020-11-30T12:10:05Z")
    );
    assert_eq!(
        ok(
            bson!({"$dateAdd": {"startDate": date("2021-03-13T12:00:00Z"), "unit": "day", "amount": 1, "timezone": "America/New_York"}}),
            &d
        ),
        date("2021-03-14T11:00:00Z")
    );
    assert_eq!(
        ok(
            bson!({"$dateAdd": {"startDate": date("2021-03-13T12:00:00Z"), "unit": "hour", "amount": 24, "timezone": "America/New_York"}}),
            &d
        ),
        date("2021-03-14T12:00:00Z")
    );
    assert_eq!(
        ok(
            bson!({"$dateSubtract": {"startDate": date("2021-03-31T00:00:00Z"), "unit": "month", "amount": 1}}),
            &d
        ),
        date("2021-02-28T00:00:00Z")
    );
    assert_eq!(
        code(
            bson!({"$dateAdd": {"startDate": date("2021-03-31T00:00:00Z"), "unit": "day", "amount": 1.5}}),
            &d
        ),
        5166402
    );
    assert_eq!(
        ok(
            bson!({"$dateAdd": {"startDate": "$n", "unit": "day", "amount": 1}}),
            &d
        ),
        Bson::Null
    );
    let diff = |s: &str, e: &str, unit: &str, extra: Document| -> Bson {
        let mut spec = doc! {"startDate": date(s), "endDate": date(e), "unit": unit};
        spec.extend(extra);
        ok(Bson::Document(doc! {"$dateDiff": spec}), &d)
    };
    assert_eq!(
        diff(
            "2020-12-31T23:59:59Z",
            "2021-01-01T00:00:01Z",
            "year",
            doc! {}
        ),
        Bson::Int64(1)
    );
    assert_eq!(
        diff(
            "2021-01-01T00:00:00Z",
            "2021-12-31T00:00:00Z",
            "year",
            doc! {}
        ),
        Bson::Int64(0)
    );
    assert_eq!(
        diff(
            "2021-01-31T00:00:00Z",
            "2021-03-01T00:00:00Z",
            "month",
            doc! {}
        ),
        Bson::Int64(2)
    );
    assert_eq!(
        diff(
            "2021-01-01T00:00:00Z",
            "2021-04-01T00:00:00Z",
            "quarter",
            doc! {}
        ),
        Bson::Int64(1)
    );
    assert_eq!(
        diff(
            "2021-03-13T00:00:00Z",
            "2021-03-15T00:00:00Z",
            "week",
            doc! {}
        ),
        Bson::Int64(1)
    );
    assert_eq!(
        diff(
            "2021-03-13T00:00:00Z",
            "2021-03-15T00:00:00Z",
            "week",
            doc! {"startOfWeek": "tue"}
        ),
        Bson::Int64(0)
    );
    assert_eq!(
        diff(
            "2021-03-13T23:00:00Z",
            "2021-03-14T01:00:00Z",
            "day",
            doc! {}
        ),
        Bson::Int64(1)
    );
    assert_eq!(
        diff(
            "2021-03-13T23:00:00Z",
            "2021-03-14T01:00:00Z",
            "day",
            doc! {"timezone": "America/New_York"}
        ),
        Bson::Int64(0)
    );
    assert_eq!(
        diff(
            "2021-03-13T23:00:00Z",
            "2021-03-14T01:00:00Z",
            "millisecond",
            doc! {}
        ),
        Bson::Int64(7_200_000)
    );
}

/// A required argument that is absent is an error with the operator's own
/// code; present and null is not (mongod's codes, measured by a
/// compatibility suite that drops one field at a time).
#[test]
fn missing_and_unknown_named_arguments() {
    for (spec, want) in [
        (bson!({"$trim": {}}), 50695),
        (bson!({"$regexFind": {}}), 31022),
        (bson!({"$regexMatch": {"input": "a"}}), 31023),
        (bson!({"$replaceAll": {}}), 51749),
        (
            bson!({"$replaceAll": {"input": "a", "replacement": "b"}}),
            51748,
        ),
        (bson!({"$replaceAll": {"input": "a", "find": "a"}}), 51747),
        (bson!({"$setField": {}}), 4161102),
        (bson!({"$setField": {"field": "f", "value": 1}}), 4161109),
        (bson!({"$setField": {"field": "f", "input": {}}}), 4161103),
        (bson!({"$sortArray": {}}), 2942502),
        (bson!({"$sortArray": {"input": [1]}}), 2942503),
        (bson!({"$dateToString": {}}), 18628),
        (bson!({"$dateAdd": {}}), 5166402),
        (bson!({"$zip": {}}), 34465),
        (bson!({"$trim": {"k": 1}}), 50694),
        (bson!({"$trim": "x"}), 50696),
        (bson!({"$filter": {}}), 28648),
        (bson!({"$map": {"input": [1]}}), 16882),
        (bson!({"$reduce": {"input": [1], "in": 1}}), 40078),
    ] {
        assert_eq!(parse_code(spec.clone()), want, "{spec}");
    }
    assert_eq!(code(bson!({"$zip": {"inputs": []}}), &e()), 34465);
    assert_eq!(ok(bson!({"$trim": {"input": null}}), &e()), Bson::Null);
    assert_eq!(
        ok(bson!({"$regexMatch": {"input": null, "regex": "a"}}), &e()),
        bson!(false)
    );
}

/// Dates at the ends of the i64 range never panic, whatever the operator
/// and zone: they answer a value or an error.
#[test]
fn extreme_dates_do_not_panic() {
    for ms in [i64::MIN, i64::MIN + 1, -1, 0, i64::MAX - 1, i64::MAX] {
        let d = doc! {"t": bson::DateTime::from_millis(ms)};
        for tz in [
            "UTC",
            "America/New_York",
            "+14:00",
            "-12:00",
            "Asia/Kathmandu",
        ] {
            for spec in [
                bson!({"$hour": {"date": "$t", "timezone": tz}}),
                bson!({"$isoWeekYear": {"date": "$t", "timezone": tz}}),
                bson!({"$dateToParts": {"date": "$t", "timezone": tz, "iso8601": true}}),
                bson!({"$dateToString": {"date": "$t", "timezone": tz, "format": "%G-%V-%u %j %z"}}),
                bson!({"$dateTrunc": {"date": "$t", "unit": "hour", "binSize": 5, "timezone": tz}}),
                bson!({"$dateTrunc": {"date": "$t", "unit": "week", "timezone": tz}}),
                bson!({"$dateTrunc": {"date": "$t", "unit": "year", "timezone": tz}}),
                bson!({"$dateAdd": {"startDate": "$t", "unit": "month", "amount": 7, "timezone": tz}}),
                bson!({"$dateSubtract": {"startDate": "$t", "unit": "day", "amount": 3, "timezone": tz}}),
                bson!({"$dateDiff": {"startDate": "$t", "endDate": bson::DateTime::from_millis(0), "unit": "week", "timezone": tz}}),
                bson!({"$add": ["$t", 1]}),
                bson!({"$subtract": ["$t", 1]}),
                bson!({"$toString": "$t"}),
            ] {
                let _ = ev(spec, &d);
            }
        }
    }
}

/// The message of a failing expression.
fn msg(spec: Bson) -> String {
    match ev(spec.clone(), &doc! {}) {
        Ok(v) => panic!("{spec} should fail, gave {v:?}"),
        Err(e) => e.to_string(),
    }
}

#[test]
fn conversion_failures_in_mongodb_words() {
    let c = "in $convert with no onError value";
    for (spec, want) in [
        (bson!({"$toInt": "abc"}), format!("Failed to parse number 'abc' {c}: Did not consume whole string.")),
        (bson!({"$toInt": ""}), format!("Failed to parse number '' {c}: No digits")),
        (bson!({"$toInt": "2147483648"}), format!("Failed to parse number '2147483648' {c}: Overflow")),
        (bson!({"$toLong": "99999999999999999999"}), format!("Failed to parse number '99999999999999999999' {c}: Overflow")),
        (bson!({"$toInt": "0x10"}), format!("Illegal hexadecimal input {c}: 0x10")),
        (bson!({"$toDouble": ""}), format!("Failed to parse number '' {c}: Empty string")),
        (bson!({"$toDouble": "x"}), format!("Failed to parse number 'x' {c}: Did not consume any digits")),
        (bson!({"$toDouble": " 5"}), format!("Failed to parse number ' 5' {c}: Leading whitespace")),
        (bson!({"$toDouble": "12abc"}), format!("Failed to parse number '12abc' {c}: Did not consume whole string.")),
        (bson!({"$toDouble": "1e400"}), format!("Failed to parse number '1e400' {c}: Out of range")),
        (bson!({"$toDecimal": "x"}), format!("Failed to parse number 'x' {c}: Failed to parse string to decimal")),
        (bson!({"$toInt": 1e300}), format!("Conversion would overflow target type {c}: 1e+300")),
        (bson!({"$toInt": 3.0e9}), format!("Conversion would overflow target type {c}: 3e+09")),
        (bson!({"$toInt": 5_000_000_000i64}), format!("Conversion would overflow target type {c}: 5000000000")),
        (bson!({"$toInt": f64::NAN}), format!("Attempt to convert NaN value to integer type {c}")),
        (bson!({"$toLong": f64::INFINITY}), format!("Attempt to convert infinity value to integer type {c}")),
        (bson!({"$toObjectId": "0123456789abcdef0123456z"}), format!("Failed to parse objectId '0123456789abcdef0123456z' {c}: Invalid character found in hex string: z")),
        (bson!({"$toObjectId": "x"}), format!("Failed to parse objectId 'x' {c}: Invalid string length for parsing to OID, expected 24 but found 1")),
    ] {
        assert_eq!(msg(spec.clone()), want, "{spec}");
        assert_eq!(code(spec, &doc! {}), 241);
    }
    // What strtod accepts still converts.
    for s in ["1e3", "inf", "-Infinity", ".5", "5.", "+5", "1.5"] {
        assert!(
            matches!(ok(bson!({"$toDouble": s}), &doc! {}), Bson::Double(_)),
            "{s}"
        );
    }
    assert_eq!(printf_g_of(2147483648.0), "2.14748e+09");
    assert_eq!(printf_g_of(123456.0), "123456");
    assert_eq!(printf_g_of(0.0001), "0.0001");
    assert_eq!(printf_g_of(1.0e-5), "1e-05");
}

#[test]
fn regex_expression_errors_in_pcre2_words() {
    let e = msg(bson!({"$regexMatch": {"input": "a", "regex": "a("}}));
    assert_eq!(
        e,
        "Invalid Regex in $regexMatch: missing closing parenthesis"
    );
    let e = msg(bson!({"$regexFind": {"input": "a", "regex": "a", "options": "g"}}));
    assert_eq!(e, "$regexFind invalid flag in regex options: g");
}

fn printf_g_of(f: f64) -> String {
    super::convert::printf_g(f)
}

#[test]
fn let_may_rebind_current_and_field_paths_follow_it() {
    let d = doc! {"a": 1, "sub": {"a": 2, "b": {"a": 3}}};
    let rebound = |current: Bson, body: Bson| {
        ok(
            bson!({"$let": {"vars": {"CURRENT": current}, "in": body}}),
            &d,
        )
    };
    assert_eq!(rebound(bson!("$sub"), bson!("$a")), bson!(2));
    assert_eq!(rebound(bson!("$sub"), bson!("$$CURRENT.b.a")), bson!(3));
    assert_eq!(rebound(bson!("$sub"), bson!("$$ROOT.a")), bson!(1));
    assert_eq!(rebound(bson!("$sub"), bson!({"$getField": "a"})), bson!(2));
    // Nested: the inner binding is seen from the outer one's value.
    assert_eq!(
        rebound(
            bson!("$sub"),
            bson!({"$let": {"vars": {"CURRENT": "$b"}, "in": "$a"}})
        ),
        bson!(3)
    );
    // Outside the $let, paths start from the document again.
    assert_eq!(
        ok(
            bson!([{"$let": {"vars": {"CURRENT": "$sub"}, "in": "$a"}}, "$a"]),
            &d
        ),
        bson!([2, 1])
    );
    // `as` may bind it too: paths then start from the element.
    assert_eq!(
        ok(
            bson!({"$map": {"input": [{"a": 5}, {"a": 6}], "as": "CURRENT", "in": "$a"}}),
            &d
        ),
        bson!([5, 6])
    );
    // Other system names stay refused.
    assert_eq!(
        parse_code(bson!({"$let": {"vars": {"ROOT": 1}, "in": 1}})),
        16867
    );
}

/// `$toHashedIndexKey`: the manual's example and MongoDB's hasher test
/// vectors (`hasher_test.cpp`), a long in every case; missing hashes as null.
#[test]
fn to_hashed_index_key() {
    let d = doc! {"val": "string to hash", "n": 42.123, "o": {"a": "abc", "b": 123i64}};
    let h = |spec: Bson| ok(bson!({"$toHashedIndexKey": spec}), &d);
    assert_eq!(h(bson!("$val")), Bson::Int64(763543691661428748));
    assert_eq!(h(bson!(42)), Bson::Int64(-944302157085130861));
    assert_eq!(h(bson!("$n")), Bson::Int64(-944302157085130861));
    assert_eq!(h(bson!(42i64)), Bson::Int64(-944302157085130861));
    assert_eq!(h(bson!(f64::NAN)), Bson::Int64(4854801880128277513));
    assert_eq!(h(Bson::Null), Bson::Int64(2338878944348059895));
    assert_eq!(h(bson!("$missing")), Bson::Int64(2338878944348059895));
    assert_eq!(h(bson!("abc")), Bson::Int64(8478485326885698097));
    assert_eq!(h(bson!("$o")), Bson::Int64(4771603801758380216));
    assert_eq!(
        h(bson!({"$literal": ["bar", "baz", "qux"]})),
        Bson::Int64(-2938911267422831539)
    );
    assert_eq!(h(bson!(true)), Bson::Int64(6405873908747105701));
    assert_eq!(
        h(date("1970-01-01T00:00:00Z")),
        Bson::Int64(-1178696894582842035)
    );
    assert_eq!(parse_code(bson!({"$toHashedIndexKey": [1, 2]})), 16020);
}
