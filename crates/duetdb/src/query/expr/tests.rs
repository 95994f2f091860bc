//! Unit tests of expression parsing and evaluation, by operator family.

use super::datefmt::civil_from_days;
use super::*;
use bson::{bson, doc};

fn ev(spec: Bson, d: &Document) -> Result<Value> {
    Expr::parse(&spec)?.eval(&Root::Doc(d))
}

fn ok(spec: Bson, d: &Document) -> Bson {
    ev(spec, d)
        .expect("evaluates")
        .unwrap_or(Bson::String("MISSING".into()))
}

#[test]
fn field_paths_and_arrays() {
    let d = doc! {"a": {"b": 1}, "xs": [{"v": 1}, {"w": 2}, 3, {"v": [4]}]};
    assert_eq!(ok(bson!("$a.b"), &d), bson!(1));
    assert_eq!(ok(bson!("$xs.v"), &d), bson!([1, [4]]));
    assert_eq!(ok(bson!("$nope"), &d), bson!("MISSING"));
    assert_eq!(ok(bson!("$$ROOT.a"), &d), bson!({"b": 1}));
    let raw = bson::RawDocumentBuf::try_from(&d).expect("raw");
    let e = Expr::parse(&bson!("$xs.v")).expect("parse");
    assert_eq!(
        e.eval(&Root::Raw(&raw)).expect("eval"),
        Some(bson!([1, [4]]))
    );
    assert!(Expr::parse(&bson!("$")).is_err());
    assert!(Expr::parse(&bson!("$$foo")).is_err());
    assert!(Expr::parse(&bson!("$a.$b")).is_err());
}

#[test]
fn arithmetic_types() {
    let d = doc! {"i": i32::MAX, "l": i64::MAX, "f": 1.5, "n": Bson::Null};
    assert_eq!(ok(bson!({"$add": [1, 2]}), &d), bson!(3));
    assert_eq!(
        ok(bson!({"$add": ["$i", 1]}), &d),
        Bson::Int64(i64::from(i32::MAX) + 1)
    );
    assert!(matches!(
        ok(bson!({"$add": ["$l", 1]}), &d),
        Bson::Double(_)
    ));
    assert_eq!(ok(bson!({"$add": [1, "$f"]}), &d), bson!(2.5));
    assert_eq!(ok(bson!({"$add": [1, "$n"]}), &d), Bson::Null);
    assert_eq!(ok(bson!({"$add": [1, "$missing"]}), &d), Bson::Null);
    assert_eq!(
        ok(bson!({"$multiply": ["$i", 2]}), &d),
        Bson::Int64(i64::from(i32::MAX) * 2)
    );
    assert_eq!(ok(bson!({"$divide": [3, 2]}), &d), bson!(1.5));
    assert_eq!(ok(bson!({"$mod": [7, 3]}), &d), bson!(1));
    assert_eq!(ok(bson!({"$subtract": [7, 10]}), &d), bson!(-3));
    let e = ev(bson!({"$add": [1, "x"]}), &d).expect_err("type");
    assert_eq!(e.code(), 14);
    assert!(
        e.to_string()
            .contains("$add only supports numeric or date types"),
        "{e}"
    );
    assert_eq!(
        ev(bson!({"$divide": [1, 0]}), &d).expect_err("zero").code(),
        2
    );
    assert!(ev(bson!({"$subtract": [1]}), &d).is_err());
}

#[test]
fn dates() {
    let t = bson::DateTime::from_millis(951_782_400_000 + 3_600_000); // 2000-02-29T01:00Z
    let d = doc! {"t": t};
    assert_eq!(ok(bson!({"$year": "$t"}), &d), bson!(2000));
    assert_eq!(ok(bson!({"$month": "$t"}), &d), bson!(2));
    assert_eq!(ok(bson!({"$dayOfMonth": {"date": "$t"}}), &d), bson!(29));
    assert_eq!(
        ok(bson!({"$subtract": ["$t", 3_600_000]}), &d),
        Bson::DateTime(bson::DateTime::from_millis(951_782_400_000))
    );
    assert_eq!(ok(bson!({"$subtract": ["$t", "$t"]}), &d), Bson::Int64(0));
    assert_eq!(
        ev(bson!({"$year": "x"}), &d).expect_err("type").code(),
        16006
    );
    let (y, m, dd) = civil_from_days(-1);
    assert_eq!((y, m, dd), (1969, 12, 31));
}

#[test]
fn logic_and_comparison() {
    let d = doc! {"a": 5, "s": "x", "arr": [1, 2, 3]};
    assert_eq!(ok(bson!({"$gt": ["$a", 4]}), &d), bson!(true));
    assert_eq!(ok(bson!({"$eq": ["$a", 5.0]}), &d), bson!(true));
    assert_eq!(ok(bson!({"$eq": ["$missing", null]}), &d), bson!(false));
    assert_eq!(ok(bson!({"$lt": ["$missing", null]}), &d), bson!(true));
    assert_eq!(ok(bson!({"$cmp": ["$s", "y"]}), &d), bson!(-1));
    assert_eq!(ok(bson!({"$and": [1, "$s", []]}), &d), bson!(true));
    assert_eq!(ok(bson!({"$or": [0, null, "$missing"]}), &d), bson!(false));
    assert_eq!(ok(bson!({"$not": [0]}), &d), bson!(true));
    assert_eq!(
        ok(bson!({"$cond": [{"$gt": ["$a", 1]}, "big", "small"]}), &d),
        bson!("big")
    );
    assert_eq!(
        ok(bson!({"$cond": {"if": false, "then": 1, "else": 2}}), &d),
        bson!(2)
    );
    assert_eq!(
        ok(bson!({"$ifNull": ["$missing", null, "dflt"]}), &d),
        bson!("dflt")
    );
    assert_eq!(ok(bson!({"$in": [2, "$arr"]}), &d), bson!(true));
    assert_eq!(ok(bson!({"$size": "$arr"}), &d), bson!(3));
    assert_eq!(
        ev(bson!({"$size": "$a"}), &d)
            .expect_err("not array")
            .code(),
        17124
    );
    assert_eq!(
        ev(bson!({"$in": [1, "$a"]}), &d)
            .expect_err("not array")
            .code(),
        40081
    );
    assert_eq!(ok(bson!({"$max": "$arr"}), &d), bson!(3));
    assert_eq!(ok(bson!({"$min": [4, null, "$a", 9]}), &d), bson!(4));
    assert_eq!(ok(bson!({"$max": []}), &d), Bson::Null);
    assert_eq!(ok(bson!({"$arrayElemAt": ["$arr", -1]}), &d), bson!(3));
    assert_eq!(
        ok(bson!({"$arrayElemAt": ["$arr", 7]}), &d),
        bson!("MISSING")
    );
}

#[test]
fn strings_and_rounding() {
    let d = doc! {"s": "Hello", "u": "héllo"};
    assert_eq!(
        ok(bson!({"$concat": ["$s", " ", "w"]}), &d),
        bson!("Hello w")
    );
    assert_eq!(ok(bson!({"$concat": ["$s", "$nope"]}), &d), Bson::Null);
    assert_eq!(ok(bson!({"$toUpper": "$s"}), &d), bson!("HELLO"));
    assert_eq!(ok(bson!({"$toLower": "$nope"}), &d), bson!(""));
    assert_eq!(ok(bson!({"$substr": ["$s", 1, 3]}), &d), bson!("ell"));
    assert_eq!(ok(bson!({"$substrBytes": ["$s", 2, -1]}), &d), bson!("llo"));
    assert!(ev(bson!({"$substrBytes": ["$u", 2, 1]}), &d).is_err());
    assert_eq!(ok(bson!({"$round": [2.5]}), &d), bson!(2.0));
    assert_eq!(ok(bson!({"$round": [3.5, 0]}), &d), bson!(4.0));
    assert_eq!(ok(bson!({"$round": [1.2345, 2]}), &d), bson!(1.23));
    assert_eq!(ok(bson!({"$round": [1250, -2]}), &d), bson!(1200));
    assert_eq!(ok(bson!({"$abs": -3}), &d), bson!(3));
    assert_eq!(
        ok(bson!({"$abs": i32::MIN}), &d),
        Bson::Int64(-i64::from(i32::MIN))
    );
    assert_eq!(ok(bson!({"$floor": 1.7}), &d), bson!(1.0));
    assert_eq!(ok(bson!({"$ceil": 1.2}), &d), bson!(2.0));
    assert_eq!(ok(bson!({"$literal": "$s"}), &d), bson!("$s"));
}

#[test]
fn parse_errors() {
    for bad in [
        bson!({"$frob": 1}),
        bson!({"$add": 1, "$sub": 2}),
        bson!({"$cond": [1, 2]}),
        bson!({"$cond": {"if": 1, "then": 2}}),
        bson!({"a": {"$nope": 1}}),
        bson!({"$year": {"date": "$t", "timezone": "Europe/Paris", "x": 1}}),
    ] {
        assert!(Expr::parse(&bad).is_err(), "{bad}");
    }
}

/// Values that grow are refused (10334) while they are built: the error's
/// size shows building stopped just past 16 MiB, not at the full result.
#[test]
fn growing_values_stop_at_the_size_limit() {
    let eight_mib = "x".repeat(8 << 20);
    let d = doc! {"s": eight_mib};
    let too_large = |spec: Bson| -> usize {
        match ev(spec, &d) {
            Err(Error::ValueTooLarge { size, limit, .. }) => {
                assert_eq!(limit, crate::doc::MAX_DOC_SIZE);
                size
            }
            other => panic!("expected ValueTooLarge, got {other:?}"),
        }
    };
    let seven: Vec<Bson> = (0..7).map(|_| bson!("$s")).collect();
    let size = too_large(bson!({"$concat": seven.clone()}));
    assert!(size < 3 * (8 << 20), "stopped at {size} bytes");
    let size = too_large(Bson::Array(seven.clone()));
    assert!(size < 3 * (8 << 20), "stopped at {size} bytes");
    let mut fields = Document::new();
    for i in 0..7 {
        fields.insert(format!("f{i}"), "$s");
    }
    let size = too_large(Bson::Document(fields));
    assert!(size < 3 * (8 << 20), "stopped at {size} bytes");
    // One value below the limit is fine; a null still wins over size.
    assert!(ev(bson!({"$concat": ["$s", "$s"]}), &doc! {"s": "ab"}).is_ok());
    let mut with_null = vec![bson!("$nope")];
    with_null.extend(seven);
    assert_eq!(ok(bson!({"$concat": with_null}), &d), Bson::Null);
    assert_eq!(
        ev(bson!({"$concat": ["$s", "$s", "$s"]}), &d)
            .expect_err("too large")
            .code(),
        10334
    );
}
