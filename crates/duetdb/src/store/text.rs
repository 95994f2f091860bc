//! Text indexes: the tokenizer, case and diacritic folding, stop words,
//! Snowball stemming (`rust-stemmers`), and MongoDB's per-term scores.
//!
//! A text index's entries are one key `(term)` per distinct term of a
//! document's indexed strings: a term is a token (a maximal run of letters
//! and digits), case-folded, stripped of diacritics (text index version 3),
//! not a stop word of the document's language, stemmed in that language.
//! The language is the document's `language_override` field (default
//! `language`) when it is a string, else the index's `default_language`; a
//! language the index does not know is refused (17262), as MongoDB.
//!
//! Scores follow MongoDB's formula (`fts_spec.cpp`): in one string of
//! `n` tokens, a term seen `c` times gets `weight * f * (0.5 * c / n + 0.5)`,
//! where `f` sums `1, 1/2, 1/4, …` over its occurrences, times 1.1 when the
//! whole string is that one term; a document's score for a term is the sum
//! over its strings and fields, its score for a query the sum over the
//! query's terms.
//!
//! Invariants: terms are computed by one function for documents and queries
//! (`terms_of`), so a query term and a document term are equal exactly when
//! their folded stems are; key extraction is deterministic (it depends on
//! the document and the spec only).

use std::collections::BTreeMap;

use bson::raw::RawDocument;
use bson::{Bson, Document, RawBsonRef};
use rust_stemmers::{Algorithm, Stemmer};
use unicode_normalization::char::is_combining_mark;
use unicode_normalization::UnicodeNormalization;

use crate::error::{Error, Result};

/// MongoDB's default text index version.
pub const TEXT_INDEX_VERSION: i32 = 3;
/// Largest field weight (MongoDB's: weights are 1 to 99,999).
pub const MAX_WEIGHT: i64 = 99_999;

/// A text search language: its stemmer and stop words (`None`: neither).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Language {
    pub name: &'static str,
    algorithm: Option<Algorithm>,
}

/// MongoDB's text search languages: `(name, ISO 639-1 code, stemmer)`.
const LANGUAGES: &[(&str, &str, Option<Algorithm>)] = &[
    ("danish", "da", Some(Algorithm::Danish)),
    ("dutch", "nl", Some(Algorithm::Dutch)),
    ("english", "en", Some(Algorithm::English)),
    ("finnish", "fi", Some(Algorithm::Finnish)),
    ("french", "fr", Some(Algorithm::French)),
    ("german", "de", Some(Algorithm::German)),
    ("hungarian", "hu", Some(Algorithm::Hungarian)),
    ("italian", "it", Some(Algorithm::Italian)),
    ("norwegian", "nb", Some(Algorithm::Norwegian)),
    ("portuguese", "pt", Some(Algorithm::Portuguese)),
    ("romanian", "ro", Some(Algorithm::Romanian)),
    ("russian", "ru", Some(Algorithm::Russian)),
    ("spanish", "es", Some(Algorithm::Spanish)),
    ("swedish", "sv", Some(Algorithm::Swedish)),
    ("turkish", "tr", Some(Algorithm::Turkish)),
    ("none", "none", None),
];

/// The language named `name` (MongoDB's names or ISO codes).
pub fn language(name: &str) -> Option<Language> {
    let lower = name.to_ascii_lowercase();
    LANGUAGES
        .iter()
        .find(|(n, code, _)| *n == lower || *code == lower)
        .map(|(n, _, a)| Language {
            name: n,
            algorithm: *a,
        })
}

/// The error MongoDB gives for an unknown language (code 17262).
pub fn unknown_language(name: &str) -> Error {
    Error::TextLanguage(format!("language override unsupported: {name}"))
}

/// English stop words (MongoDB's list); other languages use none here.
const ENGLISH_STOP_WORDS: &[&str] = &[
    "a",
    "about",
    "above",
    "after",
    "again",
    "against",
    "all",
    "am",
    "an",
    "and",
    "any",
    "are",
    "aren't",
    "as",
    "at",
    "be",
    "because",
    "been",
    "before",
    "being",
    "below",
    "between",
    "both",
    "but",
    "by",
    "can't",
    "cannot",
    "could",
    "couldn't",
    "did",
    "didn't",
    "do",
    "does",
    "doesn't",
    "doing",
    "don't",
    "down",
    "during",
    "each",
    "few",
    "for",
    "from",
    "further",
    "had",
    "hadn't",
    "has",
    "hasn't",
    "have",
    "haven't",
    "having",
    "he",
    "he'd",
    "he'll",
    "he's",
    "her",
    "here",
    "here's",
    "hers",
    "herself",
    "him",
    "himself",
    "his",
    "how",
    "how's",
    "i",
    "i'd",
    "i'll",
    "i'm",
    "i've",
    "if",
    "in",
    "into",
    "is",
    "isn't",
    "it",
    "it's",
    "its",
    "itself",
    "let's",
    "me",
    "more",
    "most",
    "mustn't",
    "my",
    "myself",
    "no",
    "nor",
    "not",
    "of",
    "off",
    "on",
    "once",
    "only",
    "or",
    "other",
    "ought",
    "our",
    "ours",
    "ourselves",
    "out",
    "over",
    "own",
    "same",
    "shan't",
    "she",
    "she'd",
    "she'll",
    "she's",
    "should",
    "shouldn't",
    "so",
    "some",
    "such",
    "than",
    "that",
    "that's",
    "the",
    "their",
    "theirs",
    "them",
    "themselves",
    "then",
    "there",
    "there's",
    "these",
    "they",
    "they'd",
    "they'll",
    "they're",
    "they've",
    "this",
    "those",
    "through",
    "to",
    "too",
    "under",
    "until",
    "up",
    "very",
    "was",
    "wasn't",
    "we",
    "we'd",
    "we'll",
    "we're",
    "we've",
    "were",
    "weren't",
    "what",
    "what's",
    "when",
    "when's",
    "where",
    "where's",
    "which",
    "while",
    "who",
    "who's",
    "whom",
    "why",
    "why's",
    "with",
    "won't",
    "would",
    "wouldn't",
    "you",
    "you'd",
    "you'll",
    "you're",
    "you've",
    "your",
    "yours",
    "yourself",
    "yourselves",
];

impl Language {
    fn is_stop_word(&self, folded: &str) -> bool {
        self.name == "english" && ENGLISH_STOP_WORDS.binary_search(&folded).is_ok()
    }

    fn stem(&self, folded: &str) -> String {
        match self.algorithm {
            Some(a) => Stemmer::create(a).stem(folded).into_owned(),
            None => folded.to_string(),
        }
    }
}

/// Fold a token: lower case (`case`), without diacritics (`diacritics`).
pub fn fold(token: &str, case: bool, diacritics: bool) -> String {
    let base: String = if diacritics {
        token.nfd().filter(|c| !is_combining_mark(*c)).collect()
    } else {
        token.to_string()
    };
    if case {
        base.to_lowercase()
    } else {
        base
    }
}

/// The tokens of `text`: maximal runs of letters, digits and combining
/// marks (a decomposed accent stays with its letter).
pub fn tokens(text: &str) -> Vec<&str> {
    text.split(|c: char| !(c.is_alphanumeric() || is_combining_mark(c)))
        .filter(|t| !t.is_empty())
        .collect()
}

/// The index terms of `text` in `lang`: folded, stop words dropped, stemmed.
pub fn terms_of(text: &str, lang: Language) -> Vec<String> {
    tokens(text)
        .into_iter()
        .filter_map(|t| {
            let f = fold(t, true, true);
            (!lang.is_stop_word(&f)).then(|| lang.stem(&f))
        })
        .collect()
}

/// What a text index covers and how it weighs and reads documents.
#[derive(Debug, Clone, PartialEq)]
pub struct TextSpec {
    /// `(path, weight)` of the indexed fields, sorted by path; a path `$**`
    /// covers every string of the document.
    pub weights: Vec<(String, i64)>,
    pub default_language: String,
    pub language_override: String,
    pub version: i32,
}

impl TextSpec {
    /// The spec for the text fields of a key pattern and the options.
    pub fn new(
        fields: &[String],
        weights: Option<&Document>,
        default_language: Option<&str>,
        language_override: Option<&str>,
    ) -> Result<TextSpec> {
        let bad = |m: String| Error::CannotCreateIndex(m);
        let mut w: BTreeMap<String, i64> = fields.iter().map(|f| (f.clone(), 1)).collect();
        if let Some(weights) = weights {
            for (path, v) in weights {
                let n = match v {
                    Bson::Int32(i) => i64::from(*i),
                    Bson::Int64(i) => *i,
                    Bson::Double(d) if d.fract() == 0.0 && d.is_finite() => *d as i64,
                    other => {
                        return Err(bad(format!(
                            "weight for '{path}' must be a whole number, not {other}"
                        )))
                    }
                };
                if !(1..=MAX_WEIGHT).contains(&n) {
                    return Err(bad(format!(
                        "text index weight must be in the exclusive interval (0,{}) but found: {n}",
                        MAX_WEIGHT + 1
                    )));
                }
                if path != "$**" {
                    crate::doc::path::validate(path).map_err(bad)?;
                }
                w.insert(path.clone(), n);
            }
        }
        if w.is_empty() {
            return Err(bad("a text index needs at least one field".into()));
        }
        let default_language = default_language.unwrap_or("english");
        let lang = language(default_language)
            .ok_or_else(|| bad(format!("default_language unsupported: {default_language}")))?;
        Ok(TextSpec {
            weights: w.into_iter().collect(),
            default_language: lang.name.to_string(),
            language_override: language_override.unwrap_or("language").to_string(),
            version: TEXT_INDEX_VERSION,
        })
    }

    pub fn is_wildcard(&self) -> bool {
        self.weights.iter().any(|(p, _)| p == "$**")
    }

    /// A wildcard text index's weight for `path`: its own, else `$**`'s.
    fn weight_of(&self, path: &str) -> i64 {
        let of = |p: &str| self.weights.iter().find(|(q, _)| q == p).map(|(_, w)| *w);
        of(path).or_else(|| of("$**")).unwrap_or(1)
    }

    /// The language a document is indexed in.
    pub fn language_of(&self, doc: &RawDocument) -> Result<Language> {
        match crate::doc::rawfield::field(doc, &self.language_override) {
            Some(RawBsonRef::String(s)) => language(s).ok_or_else(|| unknown_language(s)),
            _ => language(&self.default_language)
                .ok_or_else(|| unknown_language(&self.default_language)),
        }
    }

    /// The indexed strings of `doc` with their weights, in document order.
    pub fn strings<'a>(&self, doc: &'a RawDocument) -> Vec<(&'a str, i64)> {
        let mut out = Vec::new();
        if self.is_wildcard() {
            collect_strings(doc, "", self, &mut out);
            return out;
        }
        for (path, w) in &self.weights {
            for v in crate::doc::path::values(doc, path) {
                match v {
                    RawBsonRef::String(s) => out.push((s, *w)),
                    RawBsonRef::Array(a) => {
                        for e in a.into_iter().flatten() {
                            if let RawBsonRef::String(s) = e {
                                out.push((s, *w));
                            }
                        }
                    }
                    _ => {}
                }
            }
        }
        out
    }

    /// Each term of `doc` with its score (empty: the document is not indexed).
    pub fn scores(&self, doc: &RawDocument) -> Result<BTreeMap<String, f64>> {
        let lang = self.language_of(doc)?;
        let mut scores = BTreeMap::new();
        for (s, w) in self.strings(doc) {
            score_string(s, w as f64, lang, &mut scores);
        }
        Ok(scores)
    }
}

fn collect_strings<'a>(
    doc: &'a RawDocument,
    parent: &str,
    spec: &TextSpec,
    out: &mut Vec<(&'a str, i64)>,
) {
    for (name, v) in doc.into_iter().flatten() {
        let path = if parent.is_empty() {
            name.to_string()
        } else {
            format!("{parent}.{name}")
        };
        collect_value(v, &path, spec, out);
    }
}

fn collect_value<'a>(
    v: RawBsonRef<'a>,
    path: &str,
    spec: &TextSpec,
    out: &mut Vec<(&'a str, i64)>,
) {
    match v {
        RawBsonRef::String(s) => out.push((s, spec.weight_of(path))),
        RawBsonRef::Document(d) => collect_strings(d, path, spec, out),
        RawBsonRef::Array(a) => {
            for e in a.into_iter().flatten() {
                collect_value(e, path, spec, out);
            }
        }
        _ => {}
    }
}

/// Add the scores of one string's terms (MongoDB's `_scoreStringV2`).
fn score_string(raw: &str, weight: f64, lang: Language, scores: &mut BTreeMap<String, f64>) {
    let terms = terms_of(raw, lang);
    if terms.is_empty() {
        return;
    }
    let n = terms.len() as f64;
    // term -> (count, freq, next exponent)
    let mut seen: BTreeMap<&str, (f64, f64, f64)> = BTreeMap::new();
    for t in &terms {
        let e = seen.entry(t.as_str()).or_insert((0.0, 0.0, 1.0));
        e.0 += 1.0;
        e.1 += 1.0 / e.2;
        e.2 *= 2.0;
    }
    let whole = fold(raw.trim(), true, true);
    for (term, (count, freq, _)) in seen {
        let coeff = 0.5 * count / n + 0.5;
        let adjustment = if whole == term { 1.1 } else { 1.0 };
        *scores.entry(term.to_string()).or_insert(0.0) += weight * freq * coeff * adjustment;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bson::rawdoc;

    #[test]
    fn stop_words_are_sorted_for_binary_search() {
        let mut sorted = ENGLISH_STOP_WORDS.to_vec();
        sorted.sort_unstable();
        assert_eq!(sorted, ENGLISH_STOP_WORDS);
    }

    #[test]
    fn terms_fold_stem_and_drop_stop_words() {
        let en = language("english").expect("en");
        assert_eq!(terms_of("The Cafés were running!", en), vec!["cafe", "run"]);
        let none = language("none").expect("none");
        assert_eq!(terms_of("The Running", none), vec!["the", "running"]);
        let fr = language("fr").expect("fr");
        assert_eq!(fr.name, "french");
        assert!(language("klingon").is_none());
    }

    #[test]
    fn scores_follow_mongodbs_formula() {
        let spec = TextSpec::new(&["t".into()], None, None, None).expect("spec");
        // A string that is its one term (case aside) gets the 1.1 boost; a
        // stemmed one ("coffee" -> "coffe") does not, as in MongoDB.
        let s = spec.scores(&rawdoc! {"t": "Cake"}).expect("scores");
        assert!((s["cake"] - 1.1).abs() < 1e-9, "{s:?}");
        let s = spec.scores(&rawdoc! {"t": "coffee"}).expect("scores");
        assert!((s["coffe"] - 1.0).abs() < 1e-9, "{s:?}");
        let s = spec
            .scores(&rawdoc! {"t": "coffee and cake"})
            .expect("scores");
        // two terms: coeff = 0.5 * 1/2 + 0.5 = 0.75
        assert!((s["coffe"] - 0.75).abs() < 1e-9, "{s:?}");
        let lang = spec.scores(&rawdoc! {"t": "cafés", "language": "klingon"});
        assert_eq!(lang.expect_err("unknown").code(), 17262);
    }
}
