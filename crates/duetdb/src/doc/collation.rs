//! Collations: MongoDB's `collation` documents and the string order they
//! select, through ICU4X's collator (`icu_collator`, compiled CLDR data).
//!
//! Owns the parsing and validation of a collation document (MongoDB's
//! fields, defaults and error codes), its resolved form (what `listIndexes`
//! and `listCollections` report), and the two ways the engine compares
//! under one: [`Collator::compare_str`] and *collation keys*.
//!
//! A collation key is what MongoDB stores in a collated index: every string
//! of a value (inside documents and arrays too) replaced by the ICU sort key
//! of that string. ICU4X writes sort keys as bytes; here each byte `b` becomes
//! the char `U+00bb` (a Latin-1 reading), so the key is again a valid BSON
//! string, and since UTF-8 preserves code-point order the byte order of two
//! encoded keys is the byte order of the sort keys.
//!
//! Invariants:
//! - `value::compare(key(a), key(b)) == Collator::compare(a, b)` for every two
//!   values: keys replace only strings, keep every other value as it is, and
//!   two strings' keys compare as the collator compares the strings (equal
//!   keys iff equal under the collation's strength).
//! - "simple" (binary comparison) is no collator: [`Collation::parse`]
//!   returns `None` for it, and everything that takes an
//!   `Option<&Collator>` treats `None` as `value::compare`.
//! - Parsing never panics on client input; every malformed field is
//!   MongoDB's error (code and message).

use std::cmp::Ordering;
use std::sync::Arc;

use bson::raw::{RawArray, RawArrayBuf, RawDocument, RawDocumentBuf};
use bson::{doc, Bson, Document, RawBson, RawBsonRef};
use icu_collator::options::{AlternateHandling, CaseLevel, CollatorOptions, MaxVariable, Strength};
use icu_collator::{CollatorBorrowed, CollatorPreferences};

use crate::doc::value;
use crate::error::{render_shell_doc, Error, Result};

/// The ICU version MongoDB reports in a resolved collation (`version`).
pub const COLLATION_VERSION: &str = "57.1";

/// `caseFirst`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CaseFirst {
    Off,
    Upper,
    Lower,
}

/// A parsed, resolved collation (every field set, as MongoDB reports it).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Collation {
    pub locale: String,
    pub case_level: bool,
    pub case_first: CaseFirst,
    /// 1 (primary) to 5 (identical).
    pub strength: u8,
    pub numeric_ordering: bool,
    /// `alternate: "shifted"` (else "non-ignorable").
    pub shifted: bool,
    /// `maxVariable: "space"` (else "punct").
    pub max_variable_space: bool,
    pub normalization: bool,
    pub backwards: bool,
}

/// MongoDB's supported locales (its documented list); a locale outside it is
/// 2 BadValue "Field 'locale' is invalid", as MongoDB's.
const LOCALES: &[&str] = &[
    "af",
    "am",
    "ar",
    "as",
    "az",
    "be",
    "bg",
    "bn",
    "bo",
    "bs",
    "bs_Cyrl",
    "ca",
    "chr",
    "cs",
    "cy",
    "da",
    "de",
    "de_AT",
    "dsb",
    "dz",
    "ee",
    "el",
    "en",
    "en_US",
    "en_US_POSIX",
    "eo",
    "es",
    "et",
    "fa",
    "fa_AF",
    "fi",
    "fil",
    "fo",
    "fr",
    "fr_CA",
    "ga",
    "gl",
    "gu",
    "ha",
    "haw",
    "he",
    "hi",
    "hr",
    "hsb",
    "hu",
    "hy",
    "id",
    "ig",
    "is",
    "it",
    "ja",
    "ka",
    "kk",
    "kl",
    "km",
    "kn",
    "ko",
    "kok",
    "ku",
    "ky",
    "lb",
    "lkt",
    "ln",
    "lo",
    "lt",
    "lv",
    "mk",
    "ml",
    "mn",
    "mr",
    "ms",
    "mt",
    "my",
    "nb",
    "ne",
    "nl",
    "nn",
    "om",
    "or",
    "pa",
    "pa_Arab",
    "pl",
    "ps",
    "pt",
    "ro",
    "ru",
    "se",
    "si",
    "sk",
    "sl",
    "smn",
    "sq",
    "sr",
    "sr_Latn",
    "sv",
    "sw",
    "ta",
    "te",
    "th",
    "tk",
    "to",
    "tr",
    "uk",
    "ur",
    "uz",
    "vi",
    "wae",
    "yi",
    "yo",
    "zh",
    "zh_Hant",
    "root",
];

/// `locale@collation=variant` forms MongoDB accepts, with the BCP-47 `co` value.
const VARIANTS: &[(&str, &str)] = &[
    ("de@collation=phonebook", "phonebk"),
    ("es@collation=search", "search"),
    ("fi@collation=search", "search"),
    ("hi@collation=direct", "direct"),
    ("ko@collation=search", "search"),
    ("ln@collation=phonetic", "phonetic"),
    ("si@collation=dictionary", "dict"),
    ("sv@collation=search", "search"),
    ("zh@collation=big5han", "big5han"),
    ("zh@collation=gb2312han", "gb2312"),
    ("zh@collation=pinyin", "pinyin"),
    ("zh@collation=stroke", "stroke"),
    ("zh@collation=unihan", "unihan"),
    ("zh@collation=zhuyin", "zhuyin"),
    ("zh_Hant@collation=pinyin", "pinyin"),
    ("zh_Hant@collation=stroke", "stroke"),
];

const FIELDS: &[&str] = &[
    "locale",
    "caseLevel",
    "caseFirst",
    "strength",
    "numericOrdering",
    "alternate",
    "maxVariable",
    "normalization",
    "backwards",
    "version",
];

fn failed_to_parse(msg: String) -> Error {
    Error::Coded {
        code: 9,
        name: "FailedToParse",
        msg,
    }
}

fn wrong_type(field: &str, expected: &str, v: &Bson) -> Error {
    Error::TypeMismatch(format!(
        "\"{field}\" had the wrong type. Expected {expected}, found {}",
        crate::doc::types::type_name(v)
    ))
}

fn get_bool(spec: &Document, field: &str) -> Result<Option<bool>> {
    match spec.get(field) {
        None => Ok(None),
        Some(Bson::Boolean(b)) => Ok(Some(*b)),
        Some(other) => Err(wrong_type(field, "bool", other)),
    }
}

fn get_str<'a>(spec: &'a Document, field: &str) -> Result<Option<&'a str>> {
    match spec.get(field) {
        None => Ok(None),
        Some(Bson::String(s)) => Ok(Some(s)),
        Some(other) => Err(wrong_type(field, "string", other)),
    }
}

impl Collation {
    /// Parse a `collation` document; `Ok(None)` is `{locale: "simple"}`
    /// (binary comparison, no collator).
    pub fn parse(spec: &Document) -> Result<Option<Collation>> {
        let shown = || render_shell_doc(spec);
        let locale = match spec.get("locale") {
            None => {
                return Err(Error::Coded {
                    code: 4,
                    name: "NoSuchKey",
                    msg: "Missing expected field \"locale\"".into(),
                })
            }
            Some(Bson::String(s)) => s.as_str(),
            Some(other) => return Err(wrong_type("locale", "string", other)),
        };
        if locale.contains('\0') {
            return Err(Error::BadValue(format!(
                "Field 'locale' cannot contain null byte. Collation spec: {}",
                shown()
            )));
        }
        if locale == "simple" {
            if spec.len() > 1 {
                return Err(failed_to_parse(format!(
                    "If locale=simple, no other fields should be present in: {}",
                    shown()
                )));
            }
            return Ok(None);
        }
        if locale.is_empty() {
            return Err(Error::BadValue(format!(
                "Field 'locale' cannot be the empty string in: {}",
                shown()
            )));
        }
        if !LOCALES.contains(&locale) && !VARIANTS.iter().any(|(l, _)| *l == locale) {
            return Err(Error::BadValue(format!(
                "Field 'locale' is invalid in: {}",
                shown()
            )));
        }
        if spec.keys().any(|k| !FIELDS.contains(&k.as_str())) {
            return Err(failed_to_parse(format!(
                "Collation spec contains unknown field. Collation spec: {}",
                shown()
            )));
        }
        let case_first = match get_str(spec, "caseFirst")? {
            None => default_case_first(locale),
            Some("off") => CaseFirst::Off,
            Some("upper") => CaseFirst::Upper,
            Some("lower") => CaseFirst::Lower,
            Some(other) => {
                return Err(failed_to_parse(format!(
                    "Field 'caseFirst' must be 'upper', 'lower', or 'off'. Got: {other}"
                )))
            }
        };
        let strength = match spec.get("strength") {
            None => 3,
            Some(v) => {
                let n = match v {
                    Bson::Int32(n) => i64::from(*n),
                    Bson::Int64(n) => *n,
                    Bson::Double(f) if f.fract() == 0.0 && f.abs() < 1e15 => *f as i64,
                    Bson::Double(f) => {
                        return Err(Error::BadValue(format!(
                            "Expected an integer, but found: {f}"
                        )))
                    }
                    other => return Err(wrong_type("strength", "number", other)),
                };
                if !(1..=5).contains(&n) {
                    let bound = if n < 1 { ">= 1" } else { "<= 5" };
                    return Err(Error::Coded {
                        code: 51024,
                        name: "Location51024",
                        msg: format!(
                            "BSON field 'strength' value must be {bound}, actual value '{n}'"
                        ),
                    });
                }
                n as u8
            }
        };
        let shifted = match get_str(spec, "alternate")? {
            None | Some("non-ignorable") => false,
            Some("shifted") => true,
            Some(other) => {
                return Err(failed_to_parse(format!(
                    "Field 'alternate' must be 'non-ignorable' or 'shifted'. Got: {other}"
                )))
            }
        };
        let max_variable_space = match get_str(spec, "maxVariable")? {
            None | Some("punct") => false,
            Some("space") => true,
            Some(other) => {
                return Err(failed_to_parse(format!(
                    "Field 'maxVariable' must be 'punct' or 'space'. Got: {other}"
                )))
            }
        };
        let default_backwards = locale == "fr_CA";
        let backwards = get_bool(spec, "backwards")?.unwrap_or(default_backwards);
        if backwards != default_backwards {
            // ICU4X sets backward secondary order only from the locale's data.
            return Err(Error::BadValue(format!(
                "'backwards: {backwards}' differs from locale '{locale}''s default and is not supported by duetdb"
            )));
        }
        if let Some(v) = get_str(spec, "version")? {
            if v != COLLATION_VERSION {
                return Err(Error::Coded {
                    code: 263,
                    name: "IncompatibleCollationVersion",
                    msg: format!(
                        "Requested collation version {v} but the only available collator version was {COLLATION_VERSION}. Requested collation spec: {}",
                        shown()
                    ),
                });
            }
        }
        Ok(Some(Collation {
            locale: locale.to_string(),
            case_level: get_bool(spec, "caseLevel")?.unwrap_or(false),
            case_first,
            strength,
            numeric_ordering: get_bool(spec, "numericOrdering")?.unwrap_or(false),
            shifted,
            max_variable_space,
            normalization: get_bool(spec, "normalization")?.unwrap_or(false),
            backwards,
        }))
    }

    /// The resolved form, every field, as MongoDB reports a collation.
    pub fn to_document(&self) -> Document {
        doc! {
            "locale": &self.locale,
            "caseLevel": self.case_level,
            "caseFirst": match self.case_first {
                CaseFirst::Off => "off",
                CaseFirst::Upper => "upper",
                CaseFirst::Lower => "lower",
            },
            "strength": i32::from(self.strength),
            "numericOrdering": self.numeric_ordering,
            "alternate": if self.shifted { "shifted" } else { "non-ignorable" },
            "maxVariable": if self.max_variable_space { "space" } else { "punct" },
            "normalization": self.normalization,
            "backwards": self.backwards,
            "version": COLLATION_VERSION,
        }
    }

    /// The BCP-47 tag of the locale with the `-u-` options ICU4X reads from it.
    fn bcp47(&self) -> String {
        let (base, co) = match VARIANTS.iter().find(|(l, _)| *l == self.locale) {
            Some((l, co)) => (l.split('@').next().unwrap_or("und"), Some(*co)),
            None => (self.locale.as_str(), None),
        };
        let base = match base {
            "root" => "und".to_string(),
            "en_US_POSIX" => "en-US-posix".to_string(),
            other => other.replace('_', "-"),
        };
        let mut tag = format!("{base}-u");
        if let Some(co) = co {
            tag.push_str("-co-");
            tag.push_str(co);
        }
        tag.push_str(match self.case_first {
            CaseFirst::Off => "-kf-false",
            CaseFirst::Upper => "-kf-upper",
            CaseFirst::Lower => "-kf-lower",
        });
        if self.numeric_ordering {
            tag.push_str("-kn");
        } else {
            tag.push_str("-kn-false");
        }
        tag
    }
}

/// Danish and Maltese sort upper case first by default (CLDR).
fn default_case_first(locale: &str) -> CaseFirst {
    match locale {
        "da" | "mt" => CaseFirst::Upper,
        _ => CaseFirst::Off,
    }
}

/// A collation ready to compare: its spec and an ICU4X collator.
pub struct Collator {
    spec: Collation,
    icu: CollatorBorrowed<'static>,
}

impl std::fmt::Debug for Collator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Collator({:?})", self.spec)
    }
}

impl PartialEq for Collator {
    fn eq(&self, other: &Collator) -> bool {
        self.spec == other.spec
    }
}

impl Collator {
    /// The collator of a parsed collation.
    pub fn new(spec: Collation) -> Result<Arc<Collator>> {
        let tag = spec.bcp47();
        let locale = icu_locale_core::Locale::try_from_str(&tag)
            .map_err(|e| Error::BadValue(format!("collation locale '{tag}': {e:?}")))?;
        let prefs = CollatorPreferences::from(&locale);
        let mut options = CollatorOptions::default();
        options.strength = Some(match spec.strength {
            1 => Strength::Primary,
            2 => Strength::Secondary,
            3 => Strength::Tertiary,
            4 => Strength::Quaternary,
            _ => Strength::Identical,
        });
        options.case_level = Some(if spec.case_level {
            CaseLevel::On
        } else {
            CaseLevel::Off
        });
        options.alternate_handling = Some(if spec.shifted {
            AlternateHandling::Shifted
        } else {
            AlternateHandling::NonIgnorable
        });
        options.max_variable = Some(if spec.max_variable_space {
            MaxVariable::Space
        } else {
            MaxVariable::Punctuation
        });
        let icu = CollatorBorrowed::try_new(prefs, options)
            .map_err(|e| Error::BadValue(format!("collation '{}': {e}", spec.locale)))?;
        Ok(Arc::new(Collator { spec, icu }))
    }

    /// The collator of a `collation` document (`None`: simple).
    pub fn from_document(d: &Document) -> Result<Option<Arc<Collator>>> {
        Collation::parse(d)?.map(Collator::new).transpose()
    }

    pub fn spec(&self) -> &Collation {
        &self.spec
    }

    /// Two strings in this collation's order.
    pub fn compare_str(&self, a: &str, b: &str) -> Ordering {
        self.icu.compare(a, b)
    }

    /// The collation key of one string (see the module doc).
    pub fn key_string(&self, s: &str) -> String {
        let mut bytes: Vec<u8> = Vec::with_capacity(s.len() * 2);
        // Writing into a Vec cannot fail.
        let _ = self.icu.write_sort_key_to(s, &mut bytes);
        bytes.into_iter().map(char::from).collect()
    }

    /// The collation key of a value: its strings replaced by their keys, at
    /// any depth (values without strings come back unchanged).
    pub fn key_raw(&self, v: RawBsonRef<'_>) -> RawBson {
        match v {
            RawBsonRef::String(s) | RawBsonRef::Symbol(s) => RawBson::String(self.key_string(s)),
            RawBsonRef::Document(d) if has_strings_doc(d) => RawBson::Document(self.key_doc(d)),
            RawBsonRef::Array(a) if has_strings_arr(a) => RawBson::Array(self.key_arr(a)),
            other => RawBson::from(other),
        }
    }

    fn key_doc(&self, d: &RawDocument) -> RawDocumentBuf {
        let mut out = RawDocumentBuf::new();
        for (k, v) in d.iter().flatten() {
            out.append(k, self.key_raw(v));
        }
        out
    }

    fn key_arr(&self, a: &RawArray) -> RawArrayBuf {
        let mut out = RawArrayBuf::new();
        for v in a.into_iter().flatten() {
            out.push(self.key_raw(v));
        }
        out
    }

    /// [`Collator::key_raw`] of an owned value (values that cannot be
    /// encoded come back unchanged).
    pub fn key_bson(&self, v: &Bson) -> Bson {
        match v {
            Bson::String(s) | Bson::Symbol(s) => Bson::String(self.key_string(s)),
            Bson::Document(_) | Bson::Array(_) => match value::to_raw(v) {
                Some(raw) => Bson::try_from(self.key_raw(raw.as_raw_bson_ref()))
                    .unwrap_or_else(|_| v.clone()),
                None => v.clone(),
            },
            other => other.clone(),
        }
    }

    /// MongoDB's order of two values under this collation.
    pub fn compare(&self, a: RawBsonRef<'_>, b: RawBsonRef<'_>) -> Ordering {
        match (a, b) {
            (
                RawBsonRef::String(x) | RawBsonRef::Symbol(x),
                RawBsonRef::String(y) | RawBsonRef::Symbol(y),
            ) => self.compare_str(x, y),
            _ => value::compare(
                self.key_raw(a).as_raw_bson_ref(),
                self.key_raw(b).as_raw_bson_ref(),
            ),
        }
    }
}

/// `value::compare`, or the collator's order when there is one.
pub fn compare_with(c: Option<&Collator>, a: RawBsonRef<'_>, b: RawBsonRef<'_>) -> Ordering {
    match c {
        Some(c) => c.compare(a, b),
        None => value::compare(a, b),
    }
}

/// Whether a value holds a string anywhere (a collation changes how it compares).
pub fn has_strings(v: RawBsonRef<'_>) -> bool {
    match v {
        RawBsonRef::String(_) | RawBsonRef::Symbol(_) => true,
        RawBsonRef::Document(d) => has_strings_doc(d),
        RawBsonRef::Array(a) => has_strings_arr(a),
        _ => false,
    }
}

fn has_strings_doc(d: &RawDocument) -> bool {
    d.iter().flatten().any(|(_, v)| has_strings(v))
}

fn has_strings_arr(a: &RawArray) -> bool {
    a.into_iter().flatten().any(has_strings)
}

/// Two optional collators describe the same order (both simple, or equal specs).
pub fn same(a: Option<&Collator>, b: Option<&Collator>) -> bool {
    match (a, b) {
        (None, None) => true,
        (Some(x), Some(y)) => x.spec == y.spec,
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn coll(d: Document) -> Arc<Collator> {
        Collator::from_document(&d)
            .expect("valid")
            .expect("not simple")
    }

    /// A plain reference for ASCII letters and digits under "en".
    fn reference(strength: u8, a: &str, b: &str) -> Ordering {
        // Primary: letters case-folded (digits < letters, as in CLDR).
        let fold = |s: &str| s.to_ascii_lowercase();
        let primary = fold(a).cmp(&fold(b));
        if strength <= 2 || primary != Ordering::Equal {
            return primary;
        }
        // Tertiary: at the first case difference, lower case sorts first.
        for (x, y) in a.chars().zip(b.chars()) {
            if x != y {
                return match (x.is_ascii_lowercase(), y.is_ascii_lowercase()) {
                    (true, false) => Ordering::Less,
                    (false, true) => Ordering::Greater,
                    _ => x.cmp(&y),
                };
            }
        }
        Ordering::Equal
    }

    proptest! {
        #[test]
        fn ascii_order_matches_reference(a in "[a-zA-Z0-9]{0,6}", b in "[a-zA-Z0-9]{0,6}", strength in 1u8..=3) {
            let c = coll(doc! {"locale": "en", "strength": i32::from(strength)});
            let want = reference(strength, &a, &b);
            prop_assert_eq!(c.compare_str(&a, &b), want);
            // Keys order as the collator does.
            prop_assert_eq!(c.key_string(&a).as_bytes().cmp(c.key_string(&b).as_bytes()), want);
            let (ra, rb) = (RawBson::String(a.clone()), RawBson::String(b.clone()));
            prop_assert_eq!(c.compare(ra.as_raw_bson_ref(), rb.as_raw_bson_ref()), want);
        }

        #[test]
        fn numeric_ordering_compares_digit_runs_by_value(x in 0u32..100_000, y in 0u32..100_000) {
            let c = coll(doc! {"locale": "en", "numericOrdering": true});
            let (a, b) = (format!("item{x}"), format!("item{y}"));
            prop_assert_eq!(c.compare_str(&a, &b), x.cmp(&y));
            prop_assert_eq!(c.key_string(&a).cmp(&c.key_string(&b)), x.cmp(&y));
        }

        #[test]
        fn keys_of_nested_values_agree_with_compare(a in "[a-cA-C]{0,3}", b in "[a-cA-C]{0,3}", n in 0i32..3) {
            let c = coll(doc! {"locale": "en", "strength": 2});
            let va = Bson::Document(doc! {"x": [a.clone(), n]});
            let vb = Bson::Document(doc! {"x": [b.clone(), n]});
            let (ra, rb) = (value::to_raw(&va).expect("raw"), value::to_raw(&vb).expect("raw"));
            let keyed = value::compare(
                c.key_raw(ra.as_raw_bson_ref()).as_raw_bson_ref(),
                c.key_raw(rb.as_raw_bson_ref()).as_raw_bson_ref(),
            );
            prop_assert_eq!(keyed, a.to_lowercase().cmp(&b.to_lowercase()));
        }
    }

    #[test]
    fn simple_is_no_collator_and_resolved_form_is_complete() {
        assert!(Collation::parse(&doc! {"locale": "simple"})
            .expect("ok")
            .is_none());
        let c = Collation::parse(&doc! {"locale": "fr_CA", "strength": 1})
            .expect("ok")
            .expect("some");
        let d = c.to_document();
        assert_eq!(d.get_i32("strength").ok(), Some(1));
        assert_eq!(d.get_bool("backwards").ok(), Some(true));
        assert_eq!(d.get_str("alternate").ok(), Some("non-ignorable"));
        assert_eq!(Collation::parse(&d).expect("ok"), Some(c));
        // Every supported locale builds a collator.
        for l in LOCALES.iter().chain(VARIANTS.iter().map(|(l, _)| l)) {
            if *l == "fr_CA" {
                continue;
            }
            Collator::from_document(&doc! {"locale": *l}).expect(l);
        }
    }

    #[test]
    fn malformed_collations_have_mongodbs_errors() {
        let err = |d: Document| Collation::parse(&d).expect_err("must fail");
        let e = err(doc! {"locale": "zz_nope"});
        assert_eq!(e.code(), 2);
        assert_eq!(
            e.to_string(),
            "Field 'locale' is invalid in: { locale: \"zz_nope\" }"
        );
        assert_eq!(err(doc! {"strength": 2}).code(), 4);
        assert_eq!(err(doc! {"locale": 1}).code(), 14);
        let e = err(doc! {"locale": "en", "strength": 6});
        assert_eq!(e.code(), 51024);
        assert_eq!(
            e.to_string(),
            "BSON field 'strength' value must be <= 5, actual value '6'"
        );
        assert_eq!(err(doc! {"locale": "en", "strength": 0}).code(), 51024);
        assert_eq!(err(doc! {"locale": "en", "caseFirst": "x"}).code(), 9);
        assert_eq!(err(doc! {"locale": "en", "alternate": "x"}).code(), 9);
        assert_eq!(err(doc! {"locale": "en", "maxVariable": "x"}).code(), 9);
        assert_eq!(err(doc! {"locale": "en", "caseLevel": 1}).code(), 14);
        assert_eq!(err(doc! {"locale": "en", "bogus": 1}).code(), 9);
        assert_eq!(err(doc! {"locale": "simple", "strength": 1}).code(), 9);
        assert_eq!(err(doc! {"locale": ""}).code(), 2);
        assert_eq!(err(doc! {"locale": "en", "version": "1"}).code(), 263);
    }

    #[test]
    fn options_change_the_order() {
        let upper = coll(doc! {"locale": "en", "caseFirst": "upper"});
        assert_eq!(upper.compare_str("A", "a"), Ordering::Less);
        let lower = coll(doc! {"locale": "en"});
        assert_eq!(lower.compare_str("A", "a"), Ordering::Greater);
        let accents = coll(doc! {"locale": "en", "strength": 1});
        assert_eq!(accents.compare_str("café", "CAFE"), Ordering::Equal);
        let two = coll(doc! {"locale": "en", "strength": 2});
        assert_ne!(two.compare_str("café", "cafe"), Ordering::Equal);
        assert_eq!(two.compare_str("Cafe", "cafe"), Ordering::Equal);
        let case_level = coll(doc! {"locale": "en", "strength": 1, "caseLevel": true});
        assert_ne!(case_level.compare_str("A", "a"), Ordering::Equal);
        let shifted = coll(doc! {"locale": "en", "alternate": "shifted"});
        assert_eq!(shifted.compare_str("a b", "ab"), Ordering::Equal);
        // Non-string values are untouched by keys.
        let five = RawBson::Int32(5);
        assert_eq!(two.key_raw(five.as_raw_bson_ref()), five);
    }
}
