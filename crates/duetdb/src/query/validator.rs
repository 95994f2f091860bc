//! Document validation (MongoDB's collection `validator`, `validationLevel`,
//! `validationAction`): checking the options a `create`/`collMod` sets, and
//! judging a new document version against them.
//!
//! The options live in `CollectionState::options` (`store::options`, the
//! validator as a plain document: the store layer cannot hold a compiled
//! filter); [`Validator::of`] compiles them once per write command (and per
//! write inside a transaction). Invariants: every stored validator passed
//! [`check`], so compiling it again cannot fail except on an internal
//! error; a write that fails validation under `error` changes nothing;
//! `warn` only logs.

use bson::{doc, Bson, Document, RawDocument};

use crate::error::{Error, Result};
use crate::query::Filter;
use crate::store::options::{CollectionOptions, ValidationAction, ValidationLevel};

/// Check `options` as a whole (capped `size`/`max` with `capped`, 72) and
/// that the validator (if any) compiles: what the API runs before storing
/// options, so every stored validator compiles.
pub fn check(options: &CollectionOptions) -> Result<()> {
    options.check_combination().map_err(|e| Error::Coded {
        code: e.code,
        name: e.code_name,
        msg: e.message,
    })?;
    match &options.validator {
        Some(v) => compile(v).map(|_| ()),
        None => Ok(()),
    }
}

fn compile(validator: &Document) -> Result<Filter> {
    // MongoDB refuses these in a validator (code 2 BadValue in 5.0+... the
    // geo/text ones are not built here anyway).
    for k in ["$where", "$near", "$nearSphere", "$text"] {
        if validator.contains_key(k) {
            return Err(Error::bad_value(format!(
                "{k} is not allowed in collection validators"
            )));
        }
    }
    Filter::parse(validator)
}

/// A collection's compiled validation rules.
#[derive(Debug)]
pub struct Validator {
    source: Document,
    filter: Filter,
    level: ValidationLevel,
    action: ValidationAction,
}

impl Validator {
    /// The rules of a collection's options; `None` when nothing is to be
    /// checked (no validator, an empty one, or level `off`).
    pub fn of(options: &CollectionOptions) -> Result<Option<Validator>> {
        let Some(source) = options.validator.as_deref() else {
            return Ok(None);
        };
        let level = options.validation_level.unwrap_or(ValidationLevel::Strict);
        if level == ValidationLevel::Off || source.is_empty() {
            return Ok(None);
        }
        Ok(Some(Validator {
            filter: compile(source)?,
            source: source.clone(),
            level,
            action: options.validation_action.unwrap_or(ValidationAction::Error),
        }))
    }

    /// Judge `new`, the version an insert (`old` = None) or update writes.
    /// `Err(DocumentValidationFailure)` refuses it; under `warn` the failure
    /// is logged (`ns` names the collection) and the write accepted.
    pub fn check(&self, ns: &str, old: Option<&RawDocument>, new: &RawDocument) -> Result<()> {
        if self.filter.matches(new) {
            return Ok(());
        }
        if self.level == ValidationLevel::Moderate {
            if let Some(old) = old {
                if !self.filter.matches(old) {
                    return Ok(());
                }
            }
        }
        let info = self.err_info(new);
        match self.action {
            ValidationAction::Error => Err(Error::DocumentValidationFailure(Box::new(info))),
            ValidationAction::Warn => {
                tracing::warn!(ns = %ns, err_info = %info, "Document would fail validation");
                Ok(())
            }
        }
    }

    /// MongoDB's `errInfo`: `failingDocumentId` and `details`, naming the
    /// top-level clauses (and `$jsonSchema` keywords or properties) that
    /// the document does not satisfy.
    fn err_info(&self, new: &RawDocument) -> Document {
        let id = new
            .get("_id")
            .ok()
            .flatten()
            .and_then(|v| Bson::try_from(bson::RawBson::from(v)).ok())
            .unwrap_or(Bson::Null);
        let failing: Vec<Document> = self
            .source
            .iter()
            .filter(|(k, v)| !clause_matches(k, v, new))
            .map(|(k, v)| clause_details(k, v, new))
            .collect();
        let details = match failing.len() {
            1 if self.source.len() == 1 => failing.into_iter().next().unwrap_or_default(),
            _ => doc! {
                "operatorName": "$and",
                "clausesNotSatisfied": failing.into_iter().map(|d| doc! {"details": d}).collect::<Vec<_>>(),
            },
        };
        doc! {"failingDocumentId": id, "details": details}
    }
}

fn clause_matches(key: &str, value: &Bson, d: &RawDocument) -> bool {
    let mut one = Document::new();
    one.insert(key, value.clone());
    Filter::parse(&one).map(|f| f.matches(d)).unwrap_or(true)
}

fn clause_details(key: &str, value: &Bson, d: &RawDocument) -> Document {
    if key == "$jsonSchema" {
        if let Bson::Document(schema) = value {
            return schema_details(schema, d);
        }
    }
    let operator = if key.starts_with('$') {
        key.to_string()
    } else {
        match value {
            Bson::Document(ops) => match ops.keys().next() {
                Some(op) if op.starts_with('$') => op.clone(),
                _ => "$eq".to_string(),
            },
            _ => "$eq".to_string(),
        }
    };
    let mut spec = Document::new();
    spec.insert(key, value.clone());
    doc! {"operatorName": operator, "specifiedAs": spec}
}

/// `$jsonSchema` details: each top-level keyword the document fails,
/// `properties` broken down per property.
fn schema_details(schema: &Document, d: &RawDocument) -> Document {
    let holds = |s: Document| clause_matches("$jsonSchema", &Bson::Document(s), d);
    let mut rules = Vec::new();
    for (k, v) in schema {
        if matches!(k.as_str(), "title" | "description") {
            continue;
        }
        let mut one = Document::new();
        one.insert(k, v.clone());
        if holds(one.clone()) {
            continue;
        }
        match (k.as_str(), v) {
            ("properties", Bson::Document(props)) => {
                let failing: Vec<Document> = props
                    .iter()
                    .filter(|(p, s)| !holds(doc! {"properties": {p.as_str(): (*s).clone()}}))
                    .map(|(p, s)| {
                        doc! {"propertyName": p.as_str(), "details": [{"operatorName": "properties", "specifiedAs": {p.as_str(): s.clone()}}]}
                    })
                    .collect();
                rules.push(doc! {"operatorName": "properties", "propertiesNotSatisfied": failing});
            }
            ("required", Bson::Array(names)) => {
                let missing: Vec<Bson> = names
                    .iter()
                    .filter(|n| match n {
                        Bson::String(s) => d.get(s).ok().flatten().is_none(),
                        _ => false,
                    })
                    .cloned()
                    .collect();
                rules.push(doc! {"operatorName": "required", "specifiedAs": one, "missingProperties": missing});
            }
            _ => rules.push(doc! {"operatorName": k.as_str(), "specifiedAs": one}),
        }
    }
    let mut out = doc! {"operatorName": "$jsonSchema"};
    if let Ok(t) = schema.get_str("title") {
        out.insert("title", t);
    }
    out.insert("schemaRulesNotSatisfied", rules);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn raw(d: Document) -> bson::RawDocumentBuf {
        bson::RawDocumentBuf::try_from(&d).expect("test value")
    }

    fn opts(d: Document) -> CollectionOptions {
        CollectionOptions::from_document(&d).expect("test value")
    }

    #[test]
    fn validators_must_compile() {
        assert!(check(&opts(doc! {"validator": {"$bogus": 1}})).is_err());
        assert_eq!(
            check(&opts(doc! {"validator": {"$where": "1"}}))
                .expect_err("refused")
                .code(),
            2
        );
        assert!(check(&opts(doc! {"validator": {"a": {"$gt": 1}}})).is_ok());
        assert!(check(&opts(doc! {"validationLevel": "off"})).is_ok());
    }

    #[test]
    fn strict_moderate_off_and_warn() {
        let v = Validator::of(&opts(doc! {"validator": {"a": {"$gt": 1}}}))
            .expect("test value")
            .expect("test value");
        assert!(v.check("t.c", None, &raw(doc! {"_id": 1, "a": 2})).is_ok());
        let e = v
            .check("t.c", None, &raw(doc! {"_id": 1, "a": 0}))
            .expect_err("refused");
        assert_eq!(e.code(), 121);
        let Error::DocumentValidationFailure(info) = e else {
            panic!()
        };
        assert_eq!(info.get("failingDocumentId"), Some(&Bson::Int32(1)));
        assert_eq!(
            info.get_document("details")
                .expect("test value")
                .get_str("operatorName")
                .expect("test value"),
            "$gt"
        );
        // An update of a document that already fails: refused under strict,
        // allowed under moderate.
        let bad_old = raw(doc! {"_id": 1, "a": 0});
        assert!(v
            .check("t.c", Some(&bad_old), &raw(doc! {"_id": 1, "a": -1}))
            .is_err());
        let m = Validator::of(&opts(
            doc! {"validator": {"a": {"$gt": 1}}, "validationLevel": "moderate"},
        ))
        .expect("test value")
        .expect("test value");
        assert!(m
            .check("t.c", Some(&bad_old), &raw(doc! {"_id": 1, "a": -1}))
            .is_ok());
        let good_old = raw(doc! {"_id": 1, "a": 5});
        assert!(m
            .check("t.c", Some(&good_old), &raw(doc! {"_id": 1, "a": -1}))
            .is_err());
        assert!(m
            .check("t.c", None, &raw(doc! {"_id": 1, "a": -1}))
            .is_err());
        assert!(Validator::of(&opts(
            doc! {"validator": {"a": 1}, "validationLevel": "off"}
        ))
        .expect("test value")
        .is_none());
        let w = Validator::of(&opts(
            doc! {"validator": {"a": 1}, "validationAction": "warn"},
        ))
        .expect("test value")
        .expect("test value");
        assert!(w.check("t.c", None, &raw(doc! {"_id": 1})).is_ok());
    }

    #[test]
    fn json_schema_details() {
        let v = Validator::of(&opts(doc! {"validator": {"$jsonSchema": {
            "bsonType": "object", "required": ["name", "age"],
            "properties": {"age": {"bsonType": "int", "minimum": 0}, "name": {"bsonType": "string"}}
        }}}))
        .expect("test value")
        .expect("test value");
        let Err(Error::DocumentValidationFailure(info)) =
            v.check("t.c", None, &raw(doc! {"_id": 7, "age": -3}))
        else {
            panic!()
        };
        let d = info.get_document("details").expect("test value");
        assert_eq!(
            d.get_str("operatorName").expect("test value"),
            "$jsonSchema"
        );
        let rules = d.get_array("schemaRulesNotSatisfied").expect("test value");
        let names: Vec<&str> = rules
            .iter()
            .map(|r| {
                r.as_document()
                    .expect("test value")
                    .get_str("operatorName")
                    .expect("test value")
            })
            .collect();
        assert_eq!(names, ["required", "properties"]);
        let req = rules[0].as_document().expect("test value");
        assert_eq!(
            req.get_array("missingProperties").expect("test value"),
            &vec![Bson::from("name")]
        );
        let props = rules[1]
            .as_document()
            .expect("test value")
            .get_array("propertiesNotSatisfied")
            .expect("test value");
        assert_eq!(props.len(), 1);
        // $expr and several clauses: `$and` with the failing clauses.
        let e = Validator::of(&opts(
            doc! {"validator": {"$expr": {"$lt": ["$a", "$b"]}, "c": {"$exists": true}}},
        ))
        .expect("test value")
        .expect("test value");
        let Err(Error::DocumentValidationFailure(info)) =
            e.check("t.c", None, &raw(doc! {"_id": 1, "a": 2, "b": 1, "c": 0}))
        else {
            panic!()
        };
        let d = info.get_document("details").expect("test value");
        assert_eq!(d.get_str("operatorName").expect("test value"), "$and");
        assert_eq!(
            d.get_array("clausesNotSatisfied")
                .expect("test value")
                .len(),
            1
        );
    }
}
