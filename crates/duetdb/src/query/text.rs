//! `$text` queries: parsing `{$search, $language, $caseSensitive,
//! $diacriticSensitive}` and deciding, with a text index's spec, whether a
//! document matches and with what score (`{$meta: "textScore"}`).
//!
//! Semantics (MongoDB's): the search string's words are ORed, phrases
//! (`"..."`) and negations (`-word`, `-"..."`) are ANDed; a phrase's words
//! are also search words. Words become terms as documents' strings do
//! (`store::text::terms_of`) in the query's language (`$language`, else the
//! index's default). A document matches when one of its terms is a query
//! term, it contains every phrase and no negated word or phrase; its score is
//! the sum of its scores for the query's terms. `$caseSensitive` and
//! `$diacriticSensitive` also require the word as written to agree with the
//! document's token in case / diacritics over the stem's length; phrases are
//! substrings, folded the same way.
//!
//! Invariant: a matching document has one of the query's terms among its
//! index keys, so the union of the index entries of the query terms holds
//! every match (what `api::text` scans).
//!
//! In a pipeline, a text match's score travels with its document as the
//! hidden top-level field [`TEXT_SCORE_FIELD`] (MongoDB keeps it as document
//! metadata): `{$meta: "textScore"}` reads it, `$sort` orders by it, stages
//! that keep or reshape the document keep it (an inclusion `$project` and
//! `$replaceRoot` too),
//! `$group` drops it, and [`strip_text_score`] removes it, at any depth,
//! from what the pipeline returns or writes. Its name starts with `$`, so no
//! filter, projection or update path can name it.

use bson::raw::RawDocument;
use bson::{Bson, Document};

use crate::error::{Error, Result};
use crate::store::text::{fold, language, terms_of, tokens, unknown_language, Language, TextSpec};

/// The hidden field holding a text match's score in a pipeline (see the
/// module doc).
pub const TEXT_SCORE_FIELD: &str = "$__duet_textScore";

/// Remove [`TEXT_SCORE_FIELD`] from `doc` and every document below it (a
/// `$facet` output or a `$push` of `$$ROOT` may carry matched documents).
pub fn strip_text_score(doc: &mut Document) {
    doc.remove(TEXT_SCORE_FIELD);
    for (_, v) in doc.iter_mut() {
        strip_in(v);
    }
}

fn strip_in(v: &mut Bson) {
    match v {
        Bson::Document(d) => strip_text_score(d),
        Bson::Array(items) => items.iter_mut().for_each(strip_in),
        _ => {}
    }
}

/// Does `v` (an expression, a stage, a sort) ask for `{$meta: "textScore"}`
/// anywhere?
pub(crate) fn asks_text_score(v: &Bson) -> bool {
    match v {
        Bson::Document(d) => {
            matches!(d.get("$meta"), Some(Bson::String(s)) if s == "textScore")
                || d.values().any(asks_text_score)
        }
        Bson::Array(items) => items.iter().any(asks_text_score),
        _ => false,
    }
}

/// MongoDB's 40218: a text score asked for where no `$text` gives one.
pub(crate) fn no_text_score() -> Error {
    Error::Coded {
        code: 40218,
        name: "Location40218",
        msg: "query requires text score metadata, but it is not available".into(),
    }
}

/// MongoDB's 40218 when a pipeline asks for `{$meta: "textScore"}` (in an
/// expression or a `$sort`) without a `$text` first stage to give it.
pub fn text_score_unavailable(stages: &[Document]) -> Result<()> {
    if stages.iter().any(|s| s.values().any(asks_text_score)) {
        return Err(no_text_score());
    }
    Ok(())
}

/// A parsed `$text` operator.
#[derive(Debug, Clone, PartialEq)]
pub struct TextQuery {
    pub search: String,
    pub language: Option<String>,
    pub case_sensitive: bool,
    pub diacritic_sensitive: bool,
    /// Words as written (positive: also the phrases' words).
    words: Vec<String>,
    negated: Vec<String>,
    phrases: Vec<String>,
    negated_phrases: Vec<String>,
}

/// Split a filter's top-level `$text` off: the text query and the rest.
pub fn split(filter: &Document) -> Result<Option<(TextQuery, Document)>> {
    let Some(arg) = filter.get("$text") else {
        return Ok(None);
    };
    let query = TextQuery::parse(arg)?;
    let mut rest = filter.clone();
    rest.remove("$text");
    Ok(Some((query, rest)))
}

/// The value a filter's top level (or a top-level `$and`) requires `path`
/// to equal: `{path: v}` or `{path: {$eq: v}}`, `v` not a regex. `None`
/// when there is no such equality (a compound text index's prefix then
/// cannot be read: MongoDB's planner refuses the query, 291).
pub fn equality_on(filter: &Document, path: &str) -> Option<Bson> {
    for (k, v) in filter {
        if k == "$and" {
            if let Bson::Array(items) = v {
                for item in items {
                    if let Some(found) = item.as_document().and_then(|d| equality_on(d, path)) {
                        return Some(found);
                    }
                }
            }
            continue;
        }
        if k != path {
            continue;
        }
        match v {
            Bson::RegularExpression(_) => {}
            Bson::Document(ops) if ops.keys().next().is_some_and(|o| o.starts_with('$')) => {
                match ops.get("$eq") {
                    Some(Bson::RegularExpression(_)) | None => {}
                    Some(eq) => return Some(eq.clone()),
                }
            }
            other => return Some(other.clone()),
        }
    }
    None
}

fn bool_opt(d: &Document, k: &str) -> Result<bool> {
    match d.get(k) {
        None => Ok(false),
        Some(Bson::Boolean(b)) => Ok(*b),
        Some(other) => Err(Error::TypeMismatch(format!(
            "{k} requires a boolean value, not {other}"
        ))),
    }
}

impl TextQuery {
    pub fn parse(arg: &Bson) -> Result<TextQuery> {
        let Bson::Document(d) = arg else {
            return Err(Error::BadValue("$text expects an object".into()));
        };
        for (k, _) in d {
            if !matches!(
                k.as_str(),
                "$search" | "$language" | "$caseSensitive" | "$diacriticSensitive"
            ) {
                return Err(Error::BadValue(format!("extra fields in $text: {k}")));
            }
        }
        let search = match d.get("$search") {
            Some(Bson::String(s)) => s.clone(),
            Some(_) => {
                return Err(Error::TypeMismatch(
                    "$search requires a string value".into(),
                ))
            }
            None => return Err(Error::BadValue("$search required".into())),
        };
        let language = match d.get("$language") {
            None => None,
            Some(Bson::String(s)) => {
                language(s).ok_or_else(|| unknown_language(s))?;
                Some(s.clone())
            }
            Some(_) => {
                return Err(Error::TypeMismatch(
                    "$language requires a string value".into(),
                ))
            }
        };
        let mut q = TextQuery {
            search: search.clone(),
            language,
            case_sensitive: bool_opt(d, "$caseSensitive")?,
            diacritic_sensitive: bool_opt(d, "$diacriticSensitive")?,
            words: Vec::new(),
            negated: Vec::new(),
            phrases: Vec::new(),
            negated_phrases: Vec::new(),
        };
        q.parse_search(&search);
        Ok(q)
    }

    fn parse_search(&mut self, s: &str) {
        let chars: Vec<char> = s.chars().collect();
        let mut i = 0;
        while i < chars.len() {
            if chars[i].is_whitespace() {
                i += 1;
                continue;
            }
            let negate = chars[i] == '-' && i + 1 < chars.len() && !chars[i + 1].is_whitespace();
            let start = if negate { i + 1 } else { i };
            if chars.get(start) == Some(&'"') {
                let end = chars[start + 1..]
                    .iter()
                    .position(|c| *c == '"')
                    .map_or(chars.len(), |p| start + 1 + p);
                let phrase: String = chars[start + 1..end].iter().collect();
                if negate {
                    self.negated_phrases.push(phrase);
                } else {
                    self.words
                        .extend(tokens(&phrase).into_iter().map(str::to_string));
                    self.phrases.push(phrase);
                }
                i = end + 1;
            } else {
                let end = chars[start..]
                    .iter()
                    .position(|c| c.is_whitespace() || *c == '"')
                    .map_or(chars.len(), |p| start + p);
                let word: String = chars[start..end].iter().collect();
                let toks = tokens(&word).into_iter().map(str::to_string);
                if negate {
                    self.negated.extend(toks);
                } else {
                    self.words.extend(toks);
                }
                i = end.max(start + 1);
            }
        }
    }

    /// The language the query's words are read in.
    pub fn language_for(&self, spec: &TextSpec) -> Result<Language> {
        let name = self.language.as_deref().unwrap_or(&spec.default_language);
        language(name).ok_or_else(|| unknown_language(name))
    }

    /// The query's positive terms (what to look up in the index), deduplicated.
    pub fn terms(&self, spec: &TextSpec) -> Result<Vec<String>> {
        let lang = self.language_for(spec)?;
        let mut out: Vec<String> = self.words.iter().flat_map(|w| terms_of(w, lang)).collect();
        out.sort();
        out.dedup();
        Ok(out)
    }

    fn sensitive(&self) -> bool {
        self.case_sensitive || self.diacritic_sensitive
    }

    fn folded(&self, s: &str) -> String {
        fold(s, !self.case_sensitive, !self.diacritic_sensitive)
    }

    /// Does the document (read by `spec`) contain `word` in the query's
    /// sensitivity?
    fn has_word(
        &self,
        doc_lang: Language,
        q_lang: Language,
        strings: &[(&str, i64)],
        doc_terms: &std::collections::BTreeMap<String, f64>,
        word: &str,
    ) -> bool {
        let wanted = terms_of(word, q_lang);
        let Some(term) = wanted.first() else {
            return false;
        };
        if !doc_terms.contains_key(term) {
            return false;
        }
        if !self.sensitive() {
            return true;
        }
        let n = term.chars().count();
        let q: String = self.folded(word).chars().take(n).collect();
        strings.iter().any(|(s, _)| {
            tokens(s).into_iter().any(|t| {
                terms_of(t, doc_lang).first() == Some(term)
                    && self.folded(t).chars().take(n).collect::<String>() == q
            })
        })
    }

    /// The document's score when it matches (see the module doc).
    pub fn score(&self, spec: &TextSpec, doc: &RawDocument) -> Result<Option<f64>> {
        let q_lang = self.language_for(spec)?;
        let doc_lang = spec.language_of(doc)?;
        let doc_terms = spec.scores(doc)?;
        if doc_terms.is_empty() {
            return Ok(None);
        }
        let strings = spec.strings(doc);
        let mut score = 0.0;
        let mut any = false;
        let mut counted: Vec<String> = Vec::new();
        for w in &self.words {
            if self.has_word(doc_lang, q_lang, &strings, &doc_terms, w) {
                any = true;
                for t in terms_of(w, q_lang) {
                    if !counted.contains(&t) {
                        score += doc_terms.get(&t).copied().unwrap_or(0.0);
                        counted.push(t);
                    }
                }
            }
        }
        if !any {
            return Ok(None);
        }
        for w in &self.negated {
            if self.has_word(doc_lang, q_lang, &strings, &doc_terms, w) {
                return Ok(None);
            }
        }
        let contains = |p: &str| {
            let p = self.folded(p);
            strings.iter().any(|(s, _)| self.folded(s).contains(&p))
        };
        if !self.phrases.iter().all(|p| contains(p))
            || self.negated_phrases.iter().any(|p| contains(p))
        {
            return Ok(None);
        }
        Ok(Some(score))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bson::{doc, rawdoc};

    fn spec() -> TextSpec {
        TextSpec::new(&["t".into()], None, None, None).expect("spec")
    }

    fn q(search: &str) -> TextQuery {
        TextQuery::parse(&Bson::Document(doc! {"$search": search})).expect("query")
    }

    #[test]
    fn words_phrases_and_negations() {
        let s = spec();
        let d = rawdoc! {"t": "Coffee shops serve espresso drinks"};
        assert!(q("coffee").score(&s, &d).expect("score").is_some());
        assert!(q("tea coffee").score(&s, &d).expect("score").is_some());
        assert!(q("tea").score(&s, &d).expect("score").is_none());
        assert!(q("shop").score(&s, &d).expect("score").is_some(), "stemmed");
        assert!(q("\"serve espresso\"")
            .score(&s, &d)
            .expect("score")
            .is_some());
        assert!(q("\"espresso serve\"")
            .score(&s, &d)
            .expect("score")
            .is_none());
        assert!(q("coffee -espresso")
            .score(&s, &d)
            .expect("score")
            .is_none());
        assert!(q("coffee -\"espresso drinks\"")
            .score(&s, &d)
            .expect("score")
            .is_none());
        assert!(
            q("the").score(&s, &d).expect("score").is_none(),
            "stop words only"
        );
        let sensitive = TextQuery::parse(&Bson::Document(
            doc! {"$search": "coffee", "$caseSensitive": true},
        ))
        .expect("q");
        assert!(sensitive.score(&s, &d).expect("score").is_none());
        let d2 = rawdoc! {"t": "un café"};
        assert!(q("cafe").score(&s, &d2).expect("score").is_some());
        let dia = TextQuery::parse(&Bson::Document(
            doc! {"$search": "cafe", "$diacriticSensitive": true},
        ))
        .expect("q");
        assert!(dia.score(&s, &d2).expect("score").is_none());
    }

    #[test]
    fn refusals() {
        let code = |d: Document| {
            TextQuery::parse(&Bson::Document(d))
                .expect_err("bad")
                .code()
        };
        assert_eq!(code(doc! {}), 2);
        assert_eq!(code(doc! {"$search": 1}), 14);
        assert_eq!(code(doc! {"$search": "x", "$language": "klingon"}), 17262);
        assert_eq!(code(doc! {"$search": "x", "$foo": 1}), 2);
    }

    #[test]
    fn the_score_reaches_meta_sort_and_projection_and_never_leaves_the_pipeline() {
        use crate::query::aggregate::{ParseCtx, Pipeline, Runtime};
        let scored = |id: i32, s: f64| {
            let mut d = doc! {"_id": id, "t": "x"};
            d.insert(TEXT_SCORE_FIELD, s);
            d
        };
        let stages = vec![
            doc! {"$project": {"t": 1}},
            doc! {"$sort": {"s": {"$meta": "textScore"}}},
            doc! {"$replaceRoot": {"newRoot": {"id": "$_id"}}},
            doc! {"$addFields": {"score": {"$meta": "textScore"}}},
        ];
        let ctx = ParseCtx::new(None).expect("ctx").with_text_score();
        let p = Pipeline::parse_in(&stages, &ctx).expect("parse");
        let docs = vec![scored(1, 0.5), scored(2, 2.0), scored(3, 1.0)];
        let mut out = p.run_on_with(docs, &Runtime::standalone()).expect("run");
        let ids: Vec<_> = out.iter().map(|d| d.get_i32("id").expect("id")).collect();
        assert_eq!(ids, vec![2, 3, 1]);
        assert_eq!(out[0].get_f64("score").expect("score"), 2.0);
        out.iter_mut().for_each(strip_text_score);
        assert_eq!(out[0], doc! {"id": 2, "score": 2.0});
        // Nested copies (a $push of $$ROOT, a $facet) go too.
        let mut d = doc! {"a": [scored(1, 1.0)], "b": {"c": scored(2, 1.0)}};
        strip_text_score(&mut d);
        assert_eq!(
            d,
            doc! {"a": [{"_id": 1, "t": "x"}], "b": {"c": {"_id": 2, "t": "x"}}}
        );
        // Without a $text first stage: 40218, in an expression or a $sort.
        for stage in [
            doc! {"$sort": {"s": {"$meta": "textScore"}}},
            doc! {"$facet": {"f": [{"$project": {"s": {"$meta": "textScore"}}}]}},
        ] {
            let e = Pipeline::parse(&[stage]).expect_err("no score");
            assert_eq!(e.code(), 40218);
        }
        let e = Pipeline::parse_in(&[doc! {"$project": {"s": {"$meta": 1}}}], &ctx)
            .expect_err("not a string");
        assert_eq!(e.code(), 17307);
    }
}
