//! Property test: on generated filters and documents, `Filter::matches`
//! agrees with the reference evaluator.

use super::reference::{ROp, RF};
use super::*;
use proptest::prelude::*;

fn scalar() -> impl Strategy<Value = Bson> {
    prop_oneof![
        (0i32..4).prop_map(Bson::Int32),
        (0i64..4).prop_map(Bson::Int64),
        prop_oneof![Just(0.5), Just(1.0), Just(2.5), Just(f64::NAN)].prop_map(Bson::Double),
        prop_oneof![Just("x"), Just("xy"), Just("y"), Just("")]
            .prop_map(|s| Bson::String(s.into())),
        Just(Bson::Null),
        Just(Bson::Undefined),
        any::<bool>().prop_map(Bson::Boolean),
        Just(Bson::MinKey),
    ]
}

pub(super) fn value() -> impl Strategy<Value = Bson> {
    scalar().prop_recursive(2, 12, 3, |inner| {
        prop_oneof![
            proptest::collection::vec(inner.clone(), 0..3).prop_map(Bson::Array),
            proptest::collection::vec((prop_oneof![Just("a"), Just("b"), Just("0")], inner), 0..3)
                .prop_map(|kv| {
                    let mut d = Document::new();
                    for (k, v) in kv {
                        d.insert(k, v);
                    }
                    Bson::Document(d)
                }),
        ]
    })
}

pub(super) fn document() -> impl Strategy<Value = Document> {
    proptest::collection::vec((prop_oneof![Just("a"), Just("b")], value()), 0..3).prop_map(|kv| {
        let mut d = Document::new();
        for (k, v) in kv {
            d.insert(k, v);
        }
        d
    })
}

/// Operands: like values, minus `undefined` (rejected by the parser) and
/// documents with `$` keys (none are generated).
pub(super) fn operand() -> impl Strategy<Value = Bson> {
    value().prop_filter("no undefined operand", |v| !matches!(v, Bson::Undefined))
}

fn path() -> impl Strategy<Value = &'static str> {
    prop_oneof![
        Just("a"),
        Just("b"),
        Just("a.a"),
        Just("a.b"),
        Just("a.0"),
        Just("a.0.a"),
        Just("b.1")
    ]
}

fn op() -> impl Strategy<Value = ROp> {
    let leaf = prop_oneof![
        (operand(), any::<bool>()).prop_map(|(v, implicit)| ROp::Eq(v, implicit)),
        operand().prop_map(ROp::Ne),
        (
            prop_oneof![Just("$gt"), Just("$gte"), Just("$lt"), Just("$lte")],
            operand()
        )
            .prop_map(|(o, v)| ROp::Cmp(o, v)),
        proptest::collection::vec(operand(), 0..3).prop_map(ROp::In),
        proptest::collection::vec(operand(), 0..3).prop_map(ROp::Nin),
        any::<bool>().prop_map(ROp::Exists),
        prop_oneof![
            Just(1),
            Just(2),
            Just(3),
            Just(4),
            Just(6),
            Just(8),
            Just(10),
            Just(16),
            Just(18),
            Just(-1)
        ]
        .prop_map(ROp::Type),
        Just(ROp::TypeNumber),
        (0i32..3).prop_map(ROp::Size),
        (1i64..4, 0i64..3).prop_map(|(d, r)| ROp::Mod(d, r)),
        prop_oneof![Just("^x"), Just("y$"), Just("x")].prop_map(ROp::Regex),
        proptest::collection::vec(operand(), 1..3).prop_map(ROp::All),
    ];
    leaf.prop_recursive(2, 6, 1, |inner| {
        prop_oneof![
            inner.clone().prop_map(|o| ROp::ElemMatchValue(Box::new(o))),
            (prop_oneof![Just("a"), Just("b")], inner.clone())
                .prop_map(|(p, o)| ROp::ElemMatchObj(p, Box::new(o))),
            inner.prop_map(|o| ROp::Not(Box::new(o))),
        ]
    })
}

fn is_valid_inside_elem_match_value(op: &ROp) -> bool {
    // Implicit equality is not an operator and cannot appear in the value form.
    !matches!(op, ROp::Eq(_, true))
}

fn is_valid(op: &ROp) -> bool {
    match op {
        ROp::ElemMatchValue(inner) => is_valid_inside_elem_match_value(inner) && is_valid(inner),
        ROp::ElemMatchObj(_, inner) => is_valid(inner),
        // `$not` takes operators only, and implicit equality with a document
        // is a literal.
        ROp::Not(inner) => !matches!(**inner, ROp::Eq(_, true)) && is_valid(inner),
        // Implicit equality with a document whose first key is `$ref` would
        // be a DBRef; the generator never makes `$` keys, so all are fine.
        _ => true,
    }
}

pub(super) fn filter() -> impl Strategy<Value = RF> {
    let field = (path(), op().prop_filter("valid", is_valid)).prop_map(|(p, o)| RF::Field(p, o));
    field.prop_recursive(2, 8, 3, |inner| {
        prop_oneof![
            proptest::collection::vec(inner.clone(), 1..3).prop_map(RF::And),
            proptest::collection::vec(inner.clone(), 1..3).prop_map(RF::Or),
            proptest::collection::vec(inner, 1..3).prop_map(RF::Nor),
        ]
    })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 1000, ..ProptestConfig::default() })]

    #[test]
    fn matches_agrees_with_reference(f in filter(), docs in proptest::collection::vec(document(), 1..6)) {
        let spec = f.to_doc();
        let parsed = Filter::parse(&spec).map_err(|e| TestCaseError::fail(format!("{spec}: {e}")))?;
        for d in &docs {
            let expected = f.eval(d);
            let got = parsed.matches(&raw(d));
            prop_assert_eq!(got, expected, "filter {} on {}", spec, d);
        }
    }
}
