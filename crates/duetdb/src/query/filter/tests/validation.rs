//! Property test: a collection validator's verdict ([`Validator::check`])
//! is the reference evaluator's, under every `validationLevel` and
//! `validationAction`, on generated validators and (old, new) document
//! pairs. The small model of the levels: `off` or `warn` accept everything;
//! `strict` accepts a valid new version; `moderate` also accepts an update
//! of a document that was already invalid (an insert has no old version).

use std::sync::Arc;

use super::props::{document, filter};
use super::*;
use crate::query::validator::{self, Validator};
use crate::store::options::{CollectionOptions, ValidationAction, ValidationLevel};
use proptest::prelude::*;

fn level() -> impl Strategy<Value = ValidationLevel> {
    prop_oneof![
        Just(ValidationLevel::Strict),
        Just(ValidationLevel::Moderate),
        Just(ValidationLevel::Off),
    ]
}

fn action() -> impl Strategy<Value = ValidationAction> {
    prop_oneof![Just(ValidationAction::Error), Just(ValidationAction::Warn)]
}

/// The model: is writing `new` (over `old`, for an update) accepted?
fn accepted(
    valid: impl Fn(&Document) -> bool,
    level: ValidationLevel,
    action: ValidationAction,
    old: Option<&Document>,
    new: &Document,
) -> bool {
    match (level, action) {
        (ValidationLevel::Off, _) | (_, ValidationAction::Warn) => true,
        (ValidationLevel::Strict, _) => valid(new),
        (ValidationLevel::Moderate, _) => valid(new) || old.is_some_and(|o| !valid(o)),
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 400, ..ProptestConfig::default() })]

    #[test]
    fn a_validators_verdict_is_the_reference_evaluators(
        f in filter(),
        level in level(),
        action in action(),
        writes in proptest::collection::vec((proptest::option::of(document()), document()), 1..6),
    ) {
        let spec = f.to_doc();
        let options = CollectionOptions {
            validator: Some(Arc::new(spec.clone())),
            validation_level: Some(level),
            validation_action: Some(action),
            ..Default::default()
        };
        validator::check(&options).map_err(|e| TestCaseError::fail(format!("{spec}: {e}")))?;
        let compiled = Validator::of(&options).map_err(|e| TestCaseError::fail(e.to_string()))?;
        prop_assert_eq!(compiled.is_none(), level == ValidationLevel::Off);
        for (old, new) in &writes {
            let want = accepted(|d| f.eval(d), level, action, old.as_ref(), new);
            let got = match &compiled {
                None => Ok(()),
                Some(v) => v.check("t.c", old.as_ref().map(raw).as_deref(), &raw(new)),
            };
            match got {
                Ok(()) => prop_assert!(want, "{} accepted {} over {:?} ({:?}, {:?})", spec, new, old, level, action),
                Err(e) => {
                    prop_assert!(!want, "{} refused {} over {:?} ({:?}, {:?}): {}", spec, new, old, level, action, e);
                    prop_assert_eq!(e.code(), 121);
                }
            }
        }
    }
}
