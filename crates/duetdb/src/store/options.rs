//! Collection options: what `create` and `collMod` set on a collection
//! besides its indexes, kept with the collection's state (so snapshots,
//! checkpoints and renames carry them) and logged as a whole by the
//! `SetOptions` effect.
//!
//! The stored and logged form is the document `listCollections` reports as
//! `options` (`{}` when every option has its default), so adding an option
//! changes no format: records and checkpoints written before an option
//! existed still load (they do not name it), and an older build that meets
//! an option it does not know refuses the document instead of silently
//! dropping it.
//!
//! Options:
//! - `changeStreamPreAndPostImages: {enabled: bool}` — writes record the
//!   version each update, replace and delete changed (the pre-image) in their
//!   effect, for change streams' `fullDocumentBeforeChange`.
//! - `validator` (a filter document), `validationLevel`
//!   (`strict`/`moderate`/`off`), `validationAction` (`error`/`warn`) —
//!   document validation. This layer keeps the validator as given; the
//!   query layer (`query::validator`) compiles it, and the API checks that
//!   it compiles before storing it, so every stored validator compiles. With
//!   a validator set, a missing level or action is stored as its default
//!   ([`CollectionOptions::with_defaults`]), as MongoDB reports them.
//! - `collation` (on `create` only) — the collection's default collation
//!   (`doc::collation`), stored in its resolved form (every field, as
//!   `listCollections` reports it); `{locale: "simple"}` is no collation.
//! - `capped: true, size, max` (on `create` only) — a capped collection:
//!   documents stay in insertion order and the oldest are removed when an
//!   insert takes the collection past `size` bytes or `max` documents
//!   (`store::collection::CollectionState::trim_capped`). `size` is rounded
//!   as MongoDB rounds it (at least 4096, else up to a multiple of 256).

use std::sync::Arc;

use bson::{doc, Bson, Document};

use crate::doc::collation::Collator;

/// `validationLevel`: which writes the validator judges.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ValidationLevel {
    /// Every insert and update.
    Strict,
    /// Inserts, and updates of documents that pass before the update.
    Moderate,
    /// None.
    Off,
}

/// `validationAction`: what a failed validation does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ValidationAction {
    /// Refuse the write (121 DocumentValidationFailure).
    Error,
    /// Log the failure and accept the write.
    Warn,
}

impl ValidationLevel {
    pub fn name(self) -> &'static str {
        match self {
            ValidationLevel::Strict => "strict",
            ValidationLevel::Moderate => "moderate",
            ValidationLevel::Off => "off",
        }
    }
}

impl ValidationAction {
    pub fn name(self) -> &'static str {
        match self {
            ValidationAction::Error => "error",
            ValidationAction::Warn => "warn",
        }
    }
}

/// A malformed option: MongoDB's code and code name for it, and a message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OptionError {
    pub code: i32,
    pub code_name: &'static str,
    pub message: String,
}

impl std::fmt::Display for OptionError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

fn type_mismatch(message: String) -> OptionError {
    OptionError {
        code: 14,
        code_name: "TypeMismatch",
        message,
    }
}

fn bad_value(message: String) -> OptionError {
    OptionError {
        code: 2,
        code_name: "BadValue",
        message,
    }
}

/// The options of one collection (all defaults: none set).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct CollectionOptions {
    /// `changeStreamPreAndPostImages: {enabled: true}`.
    pub pre_and_post_images: bool,
    /// `validator`, as given.
    pub validator: Option<Arc<Document>>,
    /// `validationLevel` (`None`: not set, strict).
    pub validation_level: Option<ValidationLevel>,
    /// `validationAction` (`None`: not set, error).
    pub validation_action: Option<ValidationAction>,
    /// `capped: true`.
    pub capped: bool,
    /// `size` of a capped collection, in bytes (rounded).
    pub capped_size: Option<u64>,
    /// `max` documents of a capped collection.
    pub capped_max: Option<u64>,
    /// `collation` (on `create` only): the default collation of the
    /// collection's operations and new indexes (`None`: simple).
    pub collation: Option<Arc<Collator>>,
}

/// The largest `size` of a capped collection (MongoDB's 1 PB).
pub const MAX_CAPPED_SIZE: u64 = 1 << 50;

/// MongoDB's rounding of a capped `size`: at least 4096 bytes, else up to a
/// multiple of 256.
pub fn round_capped_size(n: u64) -> u64 {
    if n <= 4096 {
        4096
    } else {
        n.div_ceil(256) * 256
    }
}

/// A non-negative whole number (any numeric type with an integral value).
fn whole(field: &str, v: &Bson) -> Result<u64, OptionError> {
    let n = match v {
        Bson::Int32(n) => i64::from(*n),
        Bson::Int64(n) => *n,
        Bson::Double(f) if f.fract() == 0.0 && f.abs() < 9.0e15 => *f as i64,
        Bson::Double(_) => {
            return Err(bad_value(format!(
                "'{field}' must be a whole number, not {v}"
            )))
        }
        other => {
            return Err(type_mismatch(format!(
                "'{field}' must be a number, not {}",
                type_name(other)
            )))
        }
    };
    u64::try_from(n).map_err(|_| bad_value(format!("'{field}' must not be negative, not {n}")))
}

const PRE_AND_POST_IMAGES: &str = "changeStreamPreAndPostImages";
const VALIDATOR: &str = "validator";
const VALIDATION_LEVEL: &str = "validationLevel";
const VALIDATION_ACTION: &str = "validationAction";
const CAPPED: &str = "capped";
const SIZE: &str = "size";
const MAX: &str = "max";
const COLLATION: &str = "collation";

impl CollectionOptions {
    /// The option's name in `create`, `collMod` and `listCollections`.
    pub const PRE_AND_POST_IMAGES: &'static str = PRE_AND_POST_IMAGES;
    pub const VALIDATOR: &'static str = VALIDATOR;
    pub const VALIDATION_LEVEL: &'static str = VALIDATION_LEVEL;
    pub const VALIDATION_ACTION: &'static str = VALIDATION_ACTION;
    /// Every option name this build knows, in `listCollections` order.
    pub const NAMES: &'static [&'static str] = &[
        CAPPED,
        SIZE,
        MAX,
        PRE_AND_POST_IMAGES,
        VALIDATOR,
        VALIDATION_LEVEL,
        VALIDATION_ACTION,
        COLLATION,
    ];
    /// The options only `create` sets (a capped collection stays as made;
    /// a collation too, as MongoDB's).
    pub const CREATE_ONLY: &'static [&'static str] = &[CAPPED, SIZE, MAX, COLLATION];

    /// The value of `changeStreamPreAndPostImages`: `{enabled: <bool>}`.
    pub fn parse_pre_and_post_images(v: &Bson) -> Result<bool, OptionError> {
        parse_pre_and_post_images(v)
    }

    /// Whether every option has its default.
    pub fn is_default(&self) -> bool {
        *self == CollectionOptions::default()
    }

    /// These options with the defaults MongoDB stores beside a validator
    /// (`validationLevel: "strict"`, `validationAction: "error"`) filled in.
    pub fn with_defaults(mut self) -> CollectionOptions {
        if self.validator.is_some() {
            self.validation_level.get_or_insert(ValidationLevel::Strict);
            self.validation_action
                .get_or_insert(ValidationAction::Error);
        }
        self
    }

    /// Set the option `name` from its `create`/`collMod` value; an option
    /// this build does not know is an error naming it.
    pub fn set(&mut self, name: &str, v: &Bson) -> Result<(), OptionError> {
        match name {
            PRE_AND_POST_IMAGES => self.pre_and_post_images = parse_pre_and_post_images(v)?,
            VALIDATOR => match v {
                Bson::Document(d) => self.validator = Some(Arc::new(d.clone())),
                other => {
                    return Err(type_mismatch(format!(
                        "'{VALIDATOR}' option must be an object, not {}",
                        type_name(other)
                    )))
                }
            },
            VALIDATION_LEVEL => {
                self.validation_level = Some(match v {
                    Bson::String(s) if s == "strict" => ValidationLevel::Strict,
                    Bson::String(s) if s == "moderate" => ValidationLevel::Moderate,
                    Bson::String(s) if s == "off" => ValidationLevel::Off,
                    other => return Err(enumeration(VALIDATION_LEVEL, other)),
                })
            }
            VALIDATION_ACTION => {
                self.validation_action = Some(match v {
                    Bson::String(s) if s == "error" => ValidationAction::Error,
                    Bson::String(s) if s == "warn" => ValidationAction::Warn,
                    other => return Err(enumeration(VALIDATION_ACTION, other)),
                })
            }
            CAPPED => match v {
                Bson::Boolean(b) => self.capped = *b,
                other => {
                    return Err(type_mismatch(format!(
                        "'{CAPPED}' must be a boolean, not {}",
                        type_name(other)
                    )))
                }
            },
            SIZE => {
                let n = whole(SIZE, v)?;
                if n > MAX_CAPPED_SIZE {
                    return Err(bad_value(format!(
                        "capped size {n} is above the limit of {MAX_CAPPED_SIZE} bytes"
                    )));
                }
                self.capped_size = Some(round_capped_size(n));
            }
            // MongoDB: a `max` of 0 or less means no limit on the count.
            MAX => {
                self.capped_max = match v {
                    Bson::Int32(n) if *n <= 0 => None,
                    Bson::Int64(n) if *n <= 0 => None,
                    Bson::Double(f) if *f <= 0.0 => None,
                    _ => Some(whole(MAX, v)?),
                }
            }
            COLLATION => match v {
                Bson::Document(d) => {
                    self.collation = Collator::from_document(d).map_err(|e| OptionError {
                        code: e.code(),
                        code_name: e.code_name(),
                        message: e.to_string(),
                    })?
                }
                other => {
                    return Err(type_mismatch(format!(
                        "'{COLLATION}' option must be an object, not {}",
                        type_name(other)
                    )))
                }
            },
            other => {
                return Err(OptionError {
                    code: 40415,
                    code_name: "Location40415",
                    message: format!("unknown collection option '{other}'"),
                })
            }
        }
        Ok(())
    }

    /// Check the options together: `capped: true` needs a `size`, and
    /// `size`/`max` need `capped: true` (72 InvalidOptions).
    pub fn check_combination(&self) -> Result<(), OptionError> {
        let invalid = |message: &str| OptionError {
            code: 72,
            code_name: "InvalidOptions",
            message: message.to_string(),
        };
        if self.capped && self.capped_size.is_none() {
            return Err(invalid(
                "the 'size' field is required when 'capped' is true",
            ));
        }
        if !self.capped && (self.capped_size.is_some() || self.capped_max.is_some()) {
            return Err(invalid("'size' and 'max' apply only with 'capped: true'"));
        }
        Ok(())
    }

    /// Whether an insert has taken a capped collection of `count`
    /// documents and `bytes` bytes past its limits.
    pub fn over_capped_limits(&self, count: u64, bytes: u64) -> bool {
        self.capped
            && (self.capped_size.is_some_and(|s| bytes > s)
                || self.capped_max.is_some_and(|m| count > m))
    }

    /// The `options` document of `listCollections` (empty for defaults).
    pub fn to_document(&self) -> Document {
        let mut d = Document::new();
        if self.capped {
            d.insert(CAPPED, true);
            if let Some(n) = self.capped_size {
                d.insert(SIZE, i64::try_from(n).unwrap_or(i64::MAX));
            }
            if let Some(n) = self.capped_max {
                d.insert(MAX, i64::try_from(n).unwrap_or(i64::MAX));
            }
        }
        if self.pre_and_post_images {
            d.insert(PRE_AND_POST_IMAGES, doc! {"enabled": true});
        }
        if let Some(v) = &self.validator {
            d.insert(VALIDATOR, (**v).clone());
        }
        if let Some(l) = self.validation_level {
            d.insert(VALIDATION_LEVEL, l.name());
        }
        if let Some(a) = self.validation_action {
            d.insert(VALIDATION_ACTION, a.name());
        }
        if let Some(c) = &self.collation {
            d.insert(COLLATION, c.spec().to_document());
        }
        d
    }

    /// Parse the form [`Self::to_document`] writes; an unknown option or a
    /// malformed value is an error naming it.
    pub fn from_document(d: &Document) -> Result<CollectionOptions, OptionError> {
        let mut out = CollectionOptions::default();
        for (k, v) in d {
            out.set(k, v)?;
        }
        out.check_combination()?;
        Ok(out)
    }
}

fn type_name(v: &Bson) -> String {
    format!("{:?}", v.element_type())
}

fn enumeration(field: &str, v: &Bson) -> OptionError {
    match v {
        Bson::String(s) => bad_value(format!(
            "Enumeration value '{s}' for field '{field}' is not a valid value."
        )),
        other => type_mismatch(format!(
            "'{field}' must be a string, not {}",
            type_name(other)
        )),
    }
}

/// The value of `changeStreamPreAndPostImages`: `{enabled: <bool>}`, nothing
/// else (MongoDB's rule, also for `create` and `collMod`: a wrong type is
/// TypeMismatch (14), a missing `enabled` 40414, an unknown field 40415).
fn parse_pre_and_post_images(v: &Bson) -> Result<bool, OptionError> {
    let Bson::Document(d) = v else {
        return Err(type_mismatch(format!(
            "'{PRE_AND_POST_IMAGES}' must be an object, not {v}"
        )));
    };
    let mut enabled = None;
    for (k, v) in d {
        match (k.as_str(), v) {
            ("enabled", Bson::Boolean(b)) => enabled = Some(*b),
            ("enabled", other) => {
                return Err(type_mismatch(format!(
                    "'{PRE_AND_POST_IMAGES}.enabled' must be a boolean, not {other}"
                )))
            }
            (other, _) => {
                return Err(OptionError {
                    code: 40415,
                    code_name: "Location40415",
                    message: format!(
                        "BSON field '{PRE_AND_POST_IMAGES}.{other}' is an unknown field."
                    ),
                })
            }
        }
    }
    enabled.ok_or_else(|| OptionError {
        code: 40414,
        code_name: "Location40414",
        message: format!(
            "BSON field '{PRE_AND_POST_IMAGES}.enabled' is missing but a required field"
        ),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_and_refuses_what_it_does_not_know() {
        for o in [
            CollectionOptions::default(),
            CollectionOptions {
                pre_and_post_images: true,
                ..Default::default()
            },
            CollectionOptions {
                validator: Some(Arc::new(doc! {"a": {"$gt": 1}})),
                ..Default::default()
            }
            .with_defaults(),
            CollectionOptions {
                pre_and_post_images: true,
                validator: Some(Arc::new(doc! {"$jsonSchema": {"required": ["a"]}})),
                validation_level: Some(ValidationLevel::Moderate),
                validation_action: Some(ValidationAction::Warn),
                ..Default::default()
            },
            CollectionOptions {
                capped: true,
                capped_size: Some(8192),
                capped_max: Some(3),
                ..Default::default()
            },
            CollectionOptions {
                validation_level: Some(ValidationLevel::Off),
                ..Default::default()
            },
        ] {
            assert_eq!(CollectionOptions::from_document(&o.to_document()), Ok(o));
        }
        assert!(CollectionOptions::default().to_document().is_empty());
        assert!(CollectionOptions::from_document(&doc! {"capped": true}).is_err());
        assert!(CollectionOptions::from_document(&doc! {"bogus": true}).is_err());
        for bad in [
            Bson::Int32(1),
            Bson::Document(doc! {}),
            Bson::Document(doc! {"enabled": 1}),
            Bson::Document(doc! {"enabled": true, "x": 1}),
        ] {
            assert!(parse_pre_and_post_images(&bad).is_err(), "{bad}");
        }
        assert_eq!(
            parse_pre_and_post_images(&Bson::Document(doc! {"enabled": false})),
            Ok(false)
        );
    }

    #[test]
    fn capped_options() {
        let o = |d: Document| CollectionOptions::from_document(&d);
        let c = o(doc! {"capped": true, "size": 1}).expect("test value");
        assert_eq!(c.capped_size, Some(4096));
        assert_eq!(
            o(doc! {"capped": true, "size": 5000.0, "max": 0})
                .expect("test value")
                .to_document(),
            doc! {"capped": true, "size": 5120_i64}
        );
        assert_eq!(o(doc! {"capped": true}).expect_err("refused").code, 72);
        assert_eq!(o(doc! {"size": 4096}).expect_err("refused").code, 72);
        assert_eq!(
            o(doc! {"capped": true, "size": -1})
                .expect_err("refused")
                .code,
            2
        );
        assert_eq!(
            o(doc! {"capped": true, "size": "x"})
                .expect_err("refused")
                .code,
            14
        );
        assert_eq!(
            o(doc! {"capped": 1, "size": 1}).expect_err("refused").code,
            14
        );
        let c = o(doc! {"capped": true, "size": 4096, "max": 2}).expect("test value");
        assert!(!c.over_capped_limits(2, 4096));
        assert!(c.over_capped_limits(3, 10));
        assert!(c.over_capped_limits(1, 4097));
        assert!(!CollectionOptions::default().over_capped_limits(u64::MAX, u64::MAX));
    }

    #[test]
    fn validation_options_are_checked_with_mongodb_codes() {
        let code = |d: Document| {
            CollectionOptions::from_document(&d)
                .expect_err("refused")
                .code
        };
        assert_eq!(code(doc! {"validator": 1}), 14);
        assert_eq!(code(doc! {"validationLevel": "loose"}), 2);
        assert_eq!(code(doc! {"validationLevel": 1}), 14);
        assert_eq!(code(doc! {"validationAction": "log"}), 2);
        // With a validator, level and action are stored with their defaults.
        let o = CollectionOptions::from_document(&doc! {"validator": {"a": 1}})
            .expect("test value")
            .with_defaults();
        assert_eq!(
            o.to_document(),
            doc! {"validator": {"a": 1}, "validationLevel": "strict", "validationAction": "error"}
        );
        // Without one, nothing is filled in.
        let o = CollectionOptions::from_document(&doc! {"validationAction": "warn"})
            .expect("test value")
            .with_defaults();
        assert_eq!(o.to_document(), doc! {"validationAction": "warn"});
    }
}
