//! Property test: random expressions of a scalar subset (`$add $subtract
//! $multiply $abs $eq $lt $gt $max $min $cond $ifNull $and $or $not $let`
//! over ints, doubles, booleans, null and missing fields) evaluated by the
//! engine and by a deliberately simple reference evaluator written from
//! MongoDB's documented rules: the same value (numerically, and integral vs
//! double) or the same error code.

use bson::{bson, doc, Bson, Document};
use proptest::prelude::*;

use super::{Expr, Root};

/// The reference's values.
#[derive(Debug, Clone, Copy, PartialEq)]
enum RV {
    Missing,
    Null,
    Int(i64),
    Dbl(f64),
    Bool(bool),
}

/// The spec and its meaning, built together.
#[derive(Debug, Clone)]
enum RE {
    Lit(RV),
    Field(&'static str),
    Var,
    Bin(&'static str, Box<RE>, Box<RE>),
    Abs(Box<RE>),
    Not(Box<RE>),
    Cond(Box<RE>, Box<RE>, Box<RE>),
    Let(Box<RE>, Box<RE>),
}

fn doc_under_test() -> Document {
    doc! {"i": 7, "n": -3, "d": 2.5, "z": 0, "b": true, "nul": Bson::Null}
}

fn field(name: &str) -> RV {
    match name {
        "i" => RV::Int(7),
        "n" => RV::Int(-3),
        "d" => RV::Dbl(2.5),
        "z" => RV::Int(0),
        "b" => RV::Bool(true),
        "nul" => RV::Null,
        _ => RV::Missing,
    }
}

fn to_bson(v: RV) -> Bson {
    match v {
        RV::Missing | RV::Null => Bson::Null,
        RV::Int(i) => Bson::Int64(i),
        RV::Dbl(f) => Bson::Double(f),
        RV::Bool(b) => Bson::Boolean(b),
    }
}

impl RE {
    fn spec(&self) -> Bson {
        match self {
            RE::Lit(v) => bson!({"$literal": to_bson(*v)}),
            RE::Field(f) => Bson::String(format!("${f}")),
            RE::Var => bson!("$$x"),
            RE::Bin(op, a, b) => {
                let mut d = Document::new();
                d.insert(*op, vec![a.spec(), b.spec()]);
                Bson::Document(d)
            }
            RE::Abs(a) => bson!({"$abs": a.spec()}),
            RE::Not(a) => bson!({"$not": [a.spec()]}),
            RE::Cond(c, t, e) => bson!({"$cond": [c.spec(), t.spec(), e.spec()]}),
            RE::Let(v, body) => bson!({"$let": {"vars": {"x": v.spec()}, "in": body.spec()}}),
        }
    }

    /// The reference meaning: a value or an error code.
    fn eval(&self, x: Option<RV>) -> Result<RV, i32> {
        Ok(match self {
            RE::Lit(v) => *v,
            RE::Field(f) => field(f),
            RE::Var => x.ok_or(17276)?,
            RE::Abs(a) => match a.eval(x)? {
                RV::Missing | RV::Null => RV::Null,
                RV::Int(i) => RV::Int(i.checked_abs().ok_or(28680)?),
                RV::Dbl(f) => RV::Dbl(f.abs()),
                RV::Bool(_) => return Err(28765),
            },
            RE::Not(a) => RV::Bool(!truthy(a.eval(x)?)),
            RE::Cond(c, t, e) => {
                if truthy(c.eval(x)?) {
                    t.eval(x)?
                } else {
                    e.eval(x)?
                }
            }
            RE::Let(v, body) => {
                let bound = v.eval(x)?;
                body.eval(Some(bound))?
            }
            RE::Bin(op, a, b) => {
                // Lazy operators first.
                match *op {
                    "$and" => return Ok(RV::Bool(truthy(a.eval(x)?) && truthy(b.eval(x)?))),
                    "$or" => return Ok(RV::Bool(truthy(a.eval(x)?) || truthy(b.eval(x)?))),
                    "$ifNull" => {
                        let va = a.eval(x)?;
                        return Ok(if matches!(va, RV::Missing | RV::Null) {
                            b.eval(x)?
                        } else {
                            va
                        });
                    }
                    _ => {}
                }
                let (va, vb) = (a.eval(x)?, b.eval(x)?);
                match *op {
                    "$eq" => RV::Bool(order(va, vb) == std::cmp::Ordering::Equal),
                    "$lt" => RV::Bool(order(va, vb) == std::cmp::Ordering::Less),
                    "$gt" => RV::Bool(order(va, vb) == std::cmp::Ordering::Greater),
                    "$max" | "$min" => {
                        let vals: Vec<RV> = [va, vb]
                            .into_iter()
                            .filter(|v| !matches!(v, RV::Missing | RV::Null))
                            .collect();
                        let want = if *op == "$max" {
                            std::cmp::Ordering::Greater
                        } else {
                            std::cmp::Ordering::Less
                        };
                        match vals.as_slice() {
                            [] => RV::Null,
                            [v] => *v,
                            [p, q, ..] => {
                                if order(*q, *p) == want {
                                    *q
                                } else {
                                    *p
                                }
                            }
                        }
                    }
                    _ => arith(op, va, vb)?,
                }
            }
        })
    }
}

fn truthy(v: RV) -> bool {
    match v {
        RV::Missing | RV::Null => false,
        RV::Int(i) => i != 0,
        RV::Dbl(f) => f != 0.0,
        RV::Bool(b) => b,
    }
}

/// MongoDB's order on these types: missing < null < numbers < booleans.
fn order(a: RV, b: RV) -> std::cmp::Ordering {
    let rank = |v: RV| match v {
        RV::Missing => 0,
        RV::Null => 1,
        RV::Int(_) | RV::Dbl(_) => 2,
        RV::Bool(_) => 3,
    };
    match (a, b) {
        (RV::Int(x), RV::Int(y)) => x.cmp(&y),
        (RV::Bool(x), RV::Bool(y)) => x.cmp(&y),
        (RV::Int(_) | RV::Dbl(_), RV::Int(_) | RV::Dbl(_)) => num(a)
            .partial_cmp(&num(b))
            .unwrap_or(std::cmp::Ordering::Equal),
        _ => rank(a).cmp(&rank(b)),
    }
}

fn num(v: RV) -> f64 {
    match v {
        RV::Int(i) => i as f64,
        RV::Dbl(f) => f,
        _ => f64::NAN,
    }
}

fn arith(op: &str, a: RV, b: RV) -> Result<RV, i32> {
    if matches!(a, RV::Missing | RV::Null) || matches!(b, RV::Missing | RV::Null) {
        return Ok(RV::Null);
    }
    if matches!(a, RV::Bool(_)) || matches!(b, RV::Bool(_)) {
        return Err(14);
    }
    Ok(match (a, b) {
        (RV::Int(x), RV::Int(y)) => {
            let r = match op {
                "$add" => x.checked_add(y),
                "$subtract" => x.checked_sub(y),
                _ => x.checked_mul(y),
            };
            match r {
                Some(i) => RV::Int(i),
                None => RV::Dbl(float_op(op, x as f64, y as f64)),
            }
        }
        _ => RV::Dbl(float_op(op, num(a), num(b))),
    })
}

fn float_op(op: &str, x: f64, y: f64) -> f64 {
    match op {
        "$add" => x + y,
        "$subtract" => x - y,
        _ => x * y,
    }
}

fn arb_leaf(var: bool) -> BoxedStrategy<RE> {
    let mut leaves = vec![
        (-5i64..5).prop_map(|i| RE::Lit(RV::Int(i))).boxed(),
        prop_oneof![Just(0.5f64), Just(-1.25), Just(0.0), Just(1e300)]
            .prop_map(|f| RE::Lit(RV::Dbl(f)))
            .boxed(),
        any::<bool>().prop_map(|b| RE::Lit(RV::Bool(b))).boxed(),
        Just(RE::Lit(RV::Null)).boxed(),
        prop_oneof![
            Just("i"),
            Just("n"),
            Just("d"),
            Just("z"),
            Just("b"),
            Just("nul"),
            Just("missing")
        ]
        .prop_map(RE::Field)
        .boxed(),
    ];
    if var {
        leaves.push(Just(RE::Var).boxed());
    }
    proptest::strategy::Union::new(leaves).boxed()
}

fn arb_expr(depth: u32, var: bool) -> BoxedStrategy<RE> {
    if depth == 0 {
        return arb_leaf(var);
    }
    let sub = move || arb_expr(depth - 1, var);
    prop_oneof![
        2 => arb_leaf(var),
        3 => (
            prop_oneof![
                Just("$add"), Just("$subtract"), Just("$multiply"), Just("$eq"), Just("$lt"),
                Just("$gt"), Just("$max"), Just("$min"), Just("$and"), Just("$or"), Just("$ifNull")
            ],
            sub(),
            sub()
        )
            .prop_map(|(op, a, b)| RE::Bin(op, Box::new(a), Box::new(b))),
        1 => sub().prop_map(|a| RE::Abs(Box::new(a))),
        1 => sub().prop_map(|a| RE::Not(Box::new(a))),
        1 => (sub(), sub(), sub())
            .prop_map(|(c, t, e)| RE::Cond(Box::new(c), Box::new(t), Box::new(e))),
        1 => (sub(), arb_expr(depth - 1, true))
            .prop_map(|(v, body)| RE::Let(Box::new(v), Box::new(body))),
    ]
    .boxed()
}

/// Same value up to the int32/int64 width: numbers equal numerically and of
/// the same kind (integral or double).
fn same(engine: &Bson, reference: RV) -> bool {
    match (engine, reference) {
        (Bson::Null, RV::Null) => true,
        (Bson::Int32(a), RV::Int(b)) => i64::from(*a) == b,
        (Bson::Int64(a), RV::Int(b)) => *a == b,
        (Bson::Double(a), RV::Dbl(b)) => a == &b || (a.is_nan() && b.is_nan()),
        (Bson::Boolean(a), RV::Bool(b)) => *a == b,
        _ => false,
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 2000, ..ProptestConfig::default() })]

    #[test]
    fn engine_agrees_with_the_reference(e in arb_expr(4, false)) {
        let spec = e.spec();
        let d = doc_under_test();
        let got = Expr::parse(&spec).and_then(|x| x.eval(&Root::Doc(&d)));
        match (got, e.eval(None)) {
            (Ok(v), Ok(r)) => {
                let v = v.unwrap_or(Bson::Null);
                let r = if r == RV::Missing { RV::Null } else { r };
                prop_assert!(same(&v, r), "{spec}: engine {v:?}, reference {r:?}");
            }
            (Err(e1), Err(code)) => prop_assert_eq!(e1.code(), code, "{}", spec),
            (g, r) => prop_assert!(false, "{spec}: engine {g:?}, reference {r:?}"),
        }
    }
}

/// Every operator name MongoDB 7.0 has that duetdb implements.
const OPERATORS: &[&str] = &[
    "$abs",
    "$acos",
    "$acosh",
    "$add",
    "$allElementsTrue",
    "$and",
    "$anyElementTrue",
    "$arrayElemAt",
    "$arrayToObject",
    "$asin",
    "$asinh",
    "$atan",
    "$atan2",
    "$atanh",
    "$avg",
    "$binarySize",
    "$bitAnd",
    "$bitNot",
    "$bitOr",
    "$bitXor",
    "$bsonSize",
    "$ceil",
    "$cmp",
    "$concat",
    "$concatArrays",
    "$cond",
    "$convert",
    "$cos",
    "$cosh",
    "$dateAdd",
    "$dateDiff",
    "$dateFromParts",
    "$dateFromString",
    "$dateSubtract",
    "$dateToParts",
    "$dateToString",
    "$dateTrunc",
    "$dayOfMonth",
    "$dayOfWeek",
    "$dayOfYear",
    "$degreesToRadians",
    "$divide",
    "$eq",
    "$exp",
    "$first",
    "$firstN",
    "$floor",
    "$getField",
    "$gt",
    "$gte",
    "$hour",
    "$ifNull",
    "$in",
    "$indexOfArray",
    "$indexOfBytes",
    "$indexOfCP",
    "$isArray",
    "$isNumber",
    "$isoDayOfWeek",
    "$isoWeek",
    "$isoWeekYear",
    "$last",
    "$lastN",
    "$ln",
    "$log",
    "$log10",
    "$lt",
    "$lte",
    "$ltrim",
    "$max",
    "$maxN",
    "$median",
    "$mergeObjects",
    "$millisecond",
    "$min",
    "$minN",
    "$minute",
    "$mod",
    "$month",
    "$multiply",
    "$ne",
    "$not",
    "$objectToArray",
    "$or",
    "$percentile",
    "$pow",
    "$radiansToDegrees",
    "$rand",
    "$range",
    "$regexFind",
    "$regexFindAll",
    "$regexMatch",
    "$replaceAll",
    "$replaceOne",
    "$reverseArray",
    "$round",
    "$rtrim",
    "$second",
    "$setDifference",
    "$setEquals",
    "$setField",
    "$setIntersection",
    "$setIsSubset",
    "$setUnion",
    "$sin",
    "$sinh",
    "$size",
    "$slice",
    "$sortArray",
    "$split",
    "$sqrt",
    "$stdDevPop",
    "$stdDevSamp",
    "$strLenBytes",
    "$strLenCP",
    "$strcasecmp",
    "$substr",
    "$substrBytes",
    "$substrCP",
    "$subtract",
    "$sum",
    "$tan",
    "$tanh",
    "$toBool",
    "$toDate",
    "$toDecimal",
    "$toDouble",
    "$toHashedIndexKey",
    "$toInt",
    "$toLong",
    "$toLower",
    "$toObjectId",
    "$toString",
    "$toUpper",
    "$trim",
    "$trunc",
    "$tsIncrement",
    "$tsSecond",
    "$type",
    "$unsetField",
    "$week",
    "$year",
    "$zip",
    "$let",
    "$map",
    "$filter",
    "$reduce",
    "$switch",
    "$literal",
];

/// Every named-argument key, plus the binding forms' and one unknown.
const KEYS: &[&str] = &[
    "amount",
    "binSize",
    "chars",
    "date",
    "dateString",
    "day",
    "defaults",
    "endDate",
    "field",
    "find",
    "format",
    "hour",
    "input",
    "inputs",
    "iso8601",
    "isoDayOfWeek",
    "isoWeek",
    "isoWeekYear",
    "method",
    "millisecond",
    "minute",
    "month",
    "n",
    "onError",
    "onNull",
    "options",
    "p",
    "regex",
    "replacement",
    "second",
    "sortBy",
    "startDate",
    "startOfWeek",
    "timezone",
    "to",
    "unit",
    "useLongestLength",
    "value",
    "year",
    "vars",
    "in",
    "as",
    "cond",
    "initialValue",
    "branches",
    "default",
    "case",
    "then",
    "bogus",
];

fn arb_value() -> impl Strategy<Value = Bson> {
    let leaf = prop_oneof![
        Just(Bson::Null),
        any::<i32>().prop_map(Bson::Int32),
        any::<i64>().prop_map(Bson::Int64),
        prop_oneof![
            Just(0.0f64),
            Just(-0.5),
            Just(1e308),
            Just(f64::NAN),
            Just(f64::INFINITY),
            Just(2.5)
        ]
        .prop_map(Bson::Double),
        prop_oneof![
            Just("0.1"),
            Just("-1E+6144"),
            Just("NaN"),
            Just("12345678901234567890")
        ]
        .prop_map(|s| Bson::Decimal128(s.parse().expect("decimal"))),
        any::<bool>().prop_map(Bson::Boolean),
        prop_oneof![
            Just(""),
            Just("héllo"),
            Just("$a"),
            Just("$$this"),
            Just("2024-03-10"),
            Just("America/New_York"),
            Just("%Y-%m"),
            Just("day"),
            Just("approximate"),
            Just("int"),
            Just("(a)"),
            Just("5ab9cbfa31c2ab715d42129e")
        ]
        .prop_map(|s| Bson::String(s.to_string())),
        any::<i64>().prop_map(|ms| Bson::DateTime(bson::DateTime::from_millis(ms))),
        Just(Bson::Timestamp(bson::Timestamp {
            time: 5,
            increment: 1
        })),
    ];
    leaf.prop_recursive(3, 24, 4, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4).prop_map(Bson::Array),
            prop::collection::vec((prop::sample::select(KEYS), inner.clone()), 0..4).prop_map(
                |kv| {
                    let mut d = Document::new();
                    for (k, v) in kv {
                        d.insert(k, v);
                    }
                    Bson::Document(d)
                }
            ),
            (prop::sample::select(OPERATORS), inner).prop_map(|(op, arg)| {
                let mut d = Document::new();
                d.insert(op, arg);
                Bson::Document(d)
            }),
        ]
    })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 3000, ..ProptestConfig::default() })]

    /// Any operator with any arguments answers a value or an error, never
    /// a panic (client input reaches every operator).
    #[test]
    fn no_operator_panics_on_any_argument(op in prop::sample::select(OPERATORS), arg in arb_value()) {
        let mut spec = Document::new();
        spec.insert(op, arg);
        let d = doc! {"a": [1, {"b": 2}], "s": "x", "t": bson::DateTime::from_millis(0)};
        if let Ok(e) = Expr::parse(&Bson::Document(spec)) {
            let _ = e.eval(&Root::Doc(&d));
        }
    }
}
