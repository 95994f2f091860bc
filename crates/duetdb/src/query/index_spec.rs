//! Index specifications as documents (`createIndexes`' `indexes` entries, the
//! WAL's and checkpoints' stored specs): parsing and validation of every
//! option, with MongoDB's refusals.
//!
//! Lives above the store because a `partialFilterExpression` is a query
//! filter: it is parsed here into a [`Filter`] and handed to the store as a
//! [`DocPredicate`], so index membership and query matching are one
//! evaluator.
//!
//! Invariants:
//! - `parse(&spec.to_document())` yields `spec` again (round trip through
//!   the WAL and checkpoints), and old stored forms (`{key, name, unique}`)
//!   still parse;
//! - every option is validated before the spec exists: an index that could
//!   not be rebuilt at recovery is never created.

use std::sync::Arc;

use bson::raw::RawDocument;
use bson::{Bson, Document};

use crate::error::{Error, Result};
use crate::query::Filter;
use crate::store::index::{
    DocPredicate, IndexKind, IndexSpec, PartialFilter, WildcardProjection, MAX_EXPIRE_AFTER_SECONDS,
};

/// Most nesting of `$and`/`$or` in a partial filter (bounds validation and
/// the planner's implication check).
pub const MAX_PARTIAL_DEPTH: usize = 8;

/// Spec fields accepted and not kept: MongoDB ignores them too.
const IGNORED: &[&str] = &["v", "background", "ns"];

impl DocPredicate for Filter {
    fn matches(&self, doc: &RawDocument) -> bool {
        Filter::matches(self, doc)
    }
}

fn cannot(msg: impl Into<String>) -> Error {
    Error::CannotCreateIndex(msg.into())
}

/// Parse one index specification document (`{key, name, unique, sparse,
/// partialFilterExpression, expireAfterSeconds, wildcardProjection}`).
/// Unknown fields are refused (BadValue): the server filters the ones it
/// refuses as unsupported before calling this.
pub fn parse(d: &Document) -> Result<IndexSpec> {
    for (k, _) in d {
        if !IGNORED.contains(&k.as_str())
            && !matches!(
                k.as_str(),
                "key"
                    | "name"
                    | "unique"
                    | "sparse"
                    | "partialFilterExpression"
                    | "expireAfterSeconds"
                    | "wildcardProjection"
                    | "weights"
                    | "default_language"
                    | "language_override"
                    | "textIndexVersion"
                    | "2dsphereIndexVersion"
                    | "collation"
            )
        {
            return Err(Error::BadValue(format!(
                "The field '{k}' is not valid for an index specification"
            )));
        }
    }
    let keys = match d.get("key") {
        Some(Bson::Document(k)) => k,
        Some(_) => {
            return Err(Error::TypeMismatch(
                "The field 'key' must be an object".into(),
            ))
        }
        None => return Err(Error::BadValue("index specification has no 'key'".into())),
    };
    let name = match d.get("name") {
        Some(Bson::String(s)) => Some(s.as_str()),
        Some(_) => {
            return Err(Error::TypeMismatch(
                "The field 'name' must be a string".into(),
            ))
        }
        None => None,
    };
    let is_text = keys
        .iter()
        .any(|(k, v)| k == "_fts" || matches!(v, Bson::String(s) if s == "text"));
    let mut spec = if is_text {
        text_spec(d, keys, name)?
    } else {
        for k in [
            "weights",
            "default_language",
            "language_override",
            "textIndexVersion",
        ] {
            if d.contains_key(k) {
                return Err(cannot(format!(
                    "The field '{k}' is only valid for text indexes"
                )));
            }
        }
        let mut spec = IndexSpec::new(keys, name, flag(d, "unique")?)?;
        spec.sparse = flag(d, "sparse")?;
        spec
    };
    if let Some(p) = d.get("partialFilterExpression") {
        let Bson::Document(expr) = p else {
            return Err(Error::TypeMismatch(
                "The field 'partialFilterExpression' must be an object".into(),
            ));
        };
        if spec.sparse {
            return Err(cannot(
                "cannot mix \"partialFilterExpression\" and \"sparse\" options",
            ));
        }
        spec.partial = Some(Box::new(partial_filter(expr)?));
    }
    match d.get("collation") {
        None => {}
        Some(Bson::Document(c)) => {
            spec.collation = crate::doc::collation::Collator::from_document(c)?;
            // MongoDB's rule (index_key_validate): btree, hashed, 2dsphere
            // and wildcard indexes take a collation; text (and 2d, refused
            // anyway) do not, even one inherited from the collection's
            // default: `{locale: "simple"}` must then be given.
            if let (Some(c), IndexKind::Text(_)) = (&spec.collation, &spec.kind) {
                return Err(cannot(format!(
                    "Index type 'text' does not support collation: {}",
                    crate::error::render_shell(&Bson::Document(c.spec().to_document()))
                )));
            }
        }
        Some(_) => {
            return Err(Error::TypeMismatch(
                "The field 'collation' must be an object".into(),
            ))
        }
    }
    if let Some(v) = d.get("expireAfterSeconds") {
        spec.expire_after_seconds = Some(expire_after_seconds(v, &spec)?);
    }
    if let Some(p) = d.get("wildcardProjection") {
        let Bson::Document(p) = p else {
            return Err(Error::TypeMismatch(
                "The field 'wildcardProjection' must be an object".into(),
            ));
        };
        match &mut spec.kind {
            IndexKind::Wildcard(w) if w.prefix.is_none() => {
                w.projection = Some(WildcardProjection::parse(p)?);
            }
            _ => {
                return Err(cannot(
                    "The field 'wildcardProjection' is only allowed in an '$**' index",
                ))
            }
        }
    }
    if let Some(v) = d.get("2dsphereIndexVersion") {
        geo_version(v, &spec)?;
    }
    if spec.sparse && matches!(spec.kind, IndexKind::Wildcard(_)) {
        return Err(cannot(
            "Index type 'wildcard' does not support the sparse option",
        ));
    }
    Ok(spec)
}

/// `2dsphereIndexVersion`: only on a 2dsphere index; 1 to 3 are accepted and
/// the index is built as version 3 (what `listIndexes` then reports).
fn geo_version(v: &Bson, spec: &IndexSpec) -> Result<()> {
    if !matches!(spec.kind, IndexKind::Geo { .. }) {
        return Err(cannot(
            "The field '2dsphereIndexVersion' is only valid for 2dsphere indexes",
        ));
    }
    let n = match v {
        Bson::Int32(i) => i64::from(*i),
        Bson::Int64(i) => *i,
        Bson::Double(d) if d.fract() == 0.0 => *d as i64,
        other => {
            return Err(Error::TypeMismatch(format!(
                "2dsphereIndexVersion must be a number, not {other}"
            )))
        }
    };
    if !(1..=3).contains(&n) {
        return Err(cannot(format!(
            "unsupported geo index version {{ 2dsphereIndexVersion : {n} }}, only support versions: [1,2,3]"
        )));
    }
    Ok(())
}

/// A text index spec: `{a: "text", b: "text"}` or `{"$**": "text"}` (or the
/// stored form `{_fts: "text", _ftsx: 1}` with `weights`), with `weights`,
/// `default_language`, `language_override`, `textIndexVersion` (3).
/// Compound text indexes (MongoDB's `fts_spec.cpp` rules, all 67): ordered
/// keys (1 or -1) before the text fields are the prefix, after them the
/// suffix (`{dept: 1, body: "text", year: -1}`); the text fields must be
/// adjacent; `_fts`/`_ftsx` are reserved names.
fn text_spec(d: &Document, keys: &Document, name: Option<&str>) -> Result<IndexSpec> {
    let mut fields = Vec::new();
    let mut prefix: Vec<(String, bool)> = Vec::new();
    let mut suffix: Vec<(String, bool)> = Vec::new();
    // Seen the text part (`_fts` or a "text" key) yet?
    let mut in_text = false;
    for (k, v) in keys {
        let is_text = matches!(v, Bson::String(s) if s == "text");
        match (k.as_str(), v) {
            ("_fts", _) => {
                if !is_text {
                    return Err(cannot("expecting _fts:\"text\""));
                }
                if in_text || !suffix.is_empty() {
                    return Err(cannot("'text' fields in index must all be adjacent"));
                }
                in_text = true;
            }
            ("_ftsx", v) => {
                if !(matches!(v, Bson::Int32(1) | Bson::Int64(1))
                    || matches!(v, Bson::Double(x) if *x == 1.0))
                {
                    return Err(cannot("expecting _ftsx:1"));
                }
                if !in_text || !suffix.is_empty() {
                    return Err(cannot("expected _ftsx after _fts"));
                }
            }
            (path, _) if is_text => {
                if !suffix.is_empty() {
                    return Err(cannot("'text' fields in index must all be adjacent"));
                }
                if path != "$**" {
                    crate::doc::path::validate(path).map_err(cannot)?;
                }
                in_text = true;
                fields.push(path.to_string());
            }
            (path, v) => {
                let asc = match v {
                    Bson::Int32(1) | Bson::Int64(1) => true,
                    Bson::Int32(-1) | Bson::Int64(-1) => false,
                    Bson::Double(x) if *x == 1.0 => true,
                    Bson::Double(x) if *x == -1.0 => false,
                    _ => {
                        return Err(cannot(
                            "expected value 1 or -1 for non-text key in compound index",
                        ))
                    }
                };
                crate::doc::path::validate(path).map_err(cannot)?;
                if path.split('.').any(|p| p.starts_with('$')) {
                    return Err(cannot(format!(
                        "index key path '{path}' must not contain '$'-prefixed components"
                    )));
                }
                if prefix.iter().chain(&suffix).any(|(p, _)| p == path) {
                    return Err(cannot(format!("duplicate index field '{path}'")));
                }
                if in_text {
                    suffix.push((path.to_string(), asc));
                } else {
                    prefix.push((path.to_string(), asc));
                }
            }
        }
    }
    if !in_text {
        return Err(cannot(
            "expected additional fields in text index key pattern",
        ));
    }
    if prefix.len() + suffix.len() + 1 > crate::store::index::MAX_INDEX_FIELDS {
        return Err(cannot(format!(
            "an index may have at most {} fields",
            crate::store::index::MAX_INDEX_FIELDS
        )));
    }
    if flag(d, "unique")? {
        return Err(cannot(
            "Index type 'text' does not support the unique option",
        ));
    }
    let str_opt = |k: &str| -> Result<Option<&str>> {
        match d.get(k) {
            None => Ok(None),
            Some(Bson::String(s)) => Ok(Some(s.as_str())),
            Some(other) => Err(Error::TypeMismatch(format!(
                "'{k}' must be a string, not {other}"
            ))),
        }
    };
    let weights = match d.get("weights") {
        None => None,
        Some(Bson::Document(w)) => Some(w),
        Some(other) => return Err(cannot(format!("'weights' must be an object, not {other}"))),
    };
    if let Some(v) = d.get("textIndexVersion") {
        if !matches!(v, Bson::Int32(3) | Bson::Int64(3))
            && !matches!(v, Bson::Double(x) if *x == 3.0)
        {
            return Err(cannot(format!(
                "textIndexVersion {v} is not supported: duetdb builds version 3"
            )));
        }
    }
    let text = crate::store::text::TextSpec::new(
        &fields,
        weights,
        str_opt("default_language")?,
        str_opt("language_override")?,
    )?;
    let name = match name {
        Some("") => return Err(cannot("index name must not be empty")),
        Some(n) => n.to_string(),
        None => keys
            .iter()
            .map(|(k, v)| match v {
                Bson::String(s) => format!("{k}_{s}"),
                other => format!("{k}_{other}"),
            })
            .collect::<Vec<_>>()
            .join("_"),
    };
    Ok(IndexSpec::text(name, text, prefix, suffix))
}

fn flag(d: &Document, k: &str) -> Result<bool> {
    Ok(match d.get(k) {
        None | Some(Bson::Null) => false,
        Some(Bson::Boolean(b)) => *b,
        Some(Bson::Int32(i)) => *i != 0,
        Some(Bson::Int64(i)) => *i != 0,
        Some(Bson::Double(x)) => *x != 0.0,
        Some(other) => {
            return Err(Error::TypeMismatch(format!(
                "The field '{k}' must be a boolean, not {other}"
            )))
        }
    })
}

/// Validate `expireAfterSeconds` for `spec` (MongoDB's refusals, all 67
/// CannotCreateIndex): a single-field ascending/descending index not on
/// `_id`, a whole number from 0 to 2^31 - 1.
pub fn expire_after_seconds(v: &Bson, spec: &IndexSpec) -> Result<i64> {
    if spec.fields.len() != 1 {
        return Err(cannot(
            "TTL indexes are single-field indexes, compound indexes do not support TTL",
        ));
    }
    if spec.fields[0].0 == "_id" {
        return Err(cannot(
            "The field 'expireAfterSeconds' is not valid for an _id index specification",
        ));
    }
    if !matches!(spec.kind, IndexKind::Ordered) {
        return Err(cannot(
            "TTL indexes must be ascending or descending indexes on one date field",
        ));
    }
    let secs = match v {
        Bson::Int32(i) => i64::from(*i),
        Bson::Int64(i) => *i,
        Bson::Double(x) if x.is_finite() && x.fract() == 0.0 && x.abs() < 1e18 => *x as i64,
        Bson::Double(x) => {
            return Err(cannot(format!(
                "TTL index 'expireAfterSeconds' option must be a whole number of seconds, not {x}"
            )))
        }
        other => {
            return Err(cannot(format!(
            "TTL index 'expireAfterSeconds' option must be numeric, but received a type of '{}'",
            crate::doc::types::type_name(other)
        )))
        }
    };
    if !(0..=MAX_EXPIRE_AFTER_SECONDS).contains(&secs) {
        return Err(cannot(format!(
            "TTL index 'expireAfterSeconds' option must be within an acceptable range (0 to {MAX_EXPIRE_AFTER_SECONDS}), not {secs}"
        )));
    }
    Ok(secs)
}

/// Check and parse a `partialFilterExpression`: MongoDB allows only
/// equalities, `$exists: true`, `$gt`/`$gte`/`$lt`/`$lte`, `$type`, `$in`,
/// and `$and`/`$or` (67 CannotCreateIndex otherwise).
pub fn partial_filter(expr: &Document) -> Result<PartialFilter> {
    let mut paths = Vec::new();
    check_partial(expr, 0, &mut paths)?;
    let filter =
        Filter::parse(expr).map_err(|e| cannot(format!("Bad partialFilterExpression: {e}")))?;
    paths.sort();
    paths.dedup();
    Ok(PartialFilter {
        expr: expr.clone(),
        paths,
        pred: Arc::new(filter),
    })
}

fn unsupported(what: &str) -> Error {
    cannot(format!("Expression not supported in partial index: {what}"))
}

fn check_partial(d: &Document, depth: usize, paths: &mut Vec<String>) -> Result<()> {
    if depth > MAX_PARTIAL_DEPTH {
        return Err(unsupported("$and/$or nested too deeply"));
    }
    for (k, v) in d {
        match k.as_str() {
            "$and" | "$or" => {
                let Bson::Array(items) = v else {
                    return Err(unsupported(&format!("{k} needs an array")));
                };
                if items.is_empty() {
                    return Err(unsupported(&format!("{k} with no expressions")));
                }
                for item in items {
                    let Bson::Document(sub) = item else {
                        return Err(unsupported(&format!("{k} entries must be objects")));
                    };
                    check_partial(sub, depth + 1, paths)?;
                }
            }
            op if op.starts_with('$') => return Err(unsupported(op)),
            path => {
                paths.push(path.to_string());
                match v {
                    Bson::RegularExpression(_) => return Err(unsupported("$regex")),
                    Bson::Document(ops)
                        if ops.keys().next().is_some_and(|o| o.starts_with('$')) =>
                    {
                        for (op, arg) in ops {
                            match op.as_str() {
                                "$eq" | "$gt" | "$gte" | "$lt" | "$lte" | "$type" | "$in" => {
                                    if matches!(arg, Bson::RegularExpression(_)) {
                                        return Err(unsupported("$regex"));
                                    }
                                }
                                "$exists"
                                    if matches!(arg, Bson::Boolean(true))
                                        || matches!(arg, Bson::Int32(i) if *i != 0) => {}
                                "$exists" => return Err(unsupported("$exists: false")),
                                other => return Err(unsupported(other)),
                            }
                        }
                    }
                    _ => {}
                }
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use bson::doc;

    #[test]
    fn round_trips_through_its_document() {
        for d in [
            doc! {"key": {"a": 1}, "name": "a_1"},
            doc! {"key": {"a": 1, "b": -1}, "name": "x", "unique": true},
            doc! {"key": {"a": 1}, "name": "s", "sparse": true},
            doc! {"key": {"t": 1}, "name": "ttl", "expireAfterSeconds": 3600},
            doc! {"key": {"a": 1}, "name": "p", "unique": true,
            "partialFilterExpression": {"a": {"$gt": 5}, "$or": [{"b": 1}, {"c": {"$exists": true}}]}},
            doc! {"key": {"a": "hashed", "b": 1}, "name": "h"},
            doc! {"key": {"loc": "2dsphere", "b": 1}, "name": "g", "2dsphereIndexVersion": 3},
            doc! {"key": {"$**": 1}, "name": "w", "wildcardProjection": {"a": 1, "b.c": 1}},
            doc! {"key": {"a.$**": 1}, "name": "wa"},
            doc! {"key": {"title": "text", "body": "text"}, "name": "t",
            "weights": {"title": 10}, "default_language": "french"},
            doc! {"key": {"$**": "text"}, "name": "all", "language_override": "lang"},
            doc! {"key": {"dept": 1, "body": "text", "year": -1}, "name": "ct"},
            doc! {"key": {"a.b": -1, "c": 1, "$**": "text"}, "name": "cw"},
        ] {
            let spec = parse(&d).expect("parse");
            let again = parse(&spec.to_document()).expect("reparse");
            assert_eq!(spec, again, "{d}");
        }
        // The checkpoint's old form still parses.
        let old = parse(&doc! {"key": {"a": 1}, "name": "a_1", "unique": false}).expect("old");
        assert!(!old.unique && old.partial.is_none());
    }

    #[test]
    fn refusals_have_mongodbs_codes() {
        let code = |d: Document| parse(&d).expect_err("must fail").code();
        assert_eq!(
            code(doc! {"key": {"a": 1, "b": 1}, "expireAfterSeconds": 10}),
            67
        );
        assert_eq!(code(doc! {"key": {"_id": 1}, "expireAfterSeconds": 10}), 67);
        assert_eq!(code(doc! {"key": {"a": 1}, "expireAfterSeconds": -1}), 67);
        assert_eq!(code(doc! {"key": {"a": 1}, "expireAfterSeconds": 1.5}), 67);
        assert_eq!(code(doc! {"key": {"a": 1}, "expireAfterSeconds": "1"}), 67);
        assert_eq!(
            code(doc! {"key": {"a": 1}, "expireAfterSeconds": 3_000_000_000i64}),
            67
        );
        assert_eq!(
            code(doc! {"key": {"a": 1}, "sparse": true, "partialFilterExpression": {"a": 1}}),
            67
        );
        assert_eq!(
            code(doc! {"key": {"a": 1}, "partialFilterExpression": {"a": {"$ne": 1}}}),
            67
        );
        assert_eq!(
            code(doc! {"key": {"a": 1}, "partialFilterExpression": {"$nor": [{"a": 1}]}}),
            67
        );
        assert_eq!(
            code(doc! {"key": {"a": 1}, "partialFilterExpression": {"a": {"$exists": false}}}),
            67
        );
        assert_eq!(code(doc! {"key": {"a": "hashed"}, "unique": true}), 67);
        assert_eq!(code(doc! {"key": {"a": "hashed", "b": "hashed"}}), 67);
        assert_eq!(code(doc! {"key": {"$**": 1}, "unique": true}), 67);
        assert_eq!(
            code(doc! {"key": {"a.$**": 1}, "wildcardProjection": {"b": 1}}),
            67
        );
        // Compound text: ordered keys around adjacent text fields only.
        assert_eq!(code(doc! {"key": {"a": "text", "b": 1, "c": "text"}}), 67);
        assert_eq!(code(doc! {"key": {"a": "hashed", "b": "text"}}), 67);
        assert_eq!(code(doc! {"key": {"a": 2, "b": "text"}}), 67);
        assert_eq!(code(doc! {"key": {"_ftsx": 1, "b": "text"}}), 67);
        assert_eq!(code(doc! {"key": {"_fts": 1, "b": "text"}}), 67);
        assert_eq!(code(doc! {"key": {"a": 1, "a.$x": 1, "b": "text"}}), 67);
        assert_eq!(
            code(doc! {"key": {"a": "text"}, "default_language": "klingon"}),
            67
        );
        assert_eq!(code(doc! {"key": {"a": "text"}, "weights": {"a": 0}}), 67);
        assert_eq!(code(doc! {"key": {"a": 1}, "weights": {"a": 2}}), 67);
        assert_eq!(code(doc! {"key": {"a": "2d"}}), 67);
        assert_eq!(code(doc! {"key": {"a": "2dsphere"}, "unique": true}), 67);
        assert_eq!(
            code(doc! {"key": {"a": "2dsphere"}, "2dsphereIndexVersion": 9}),
            67
        );
        assert_eq!(code(doc! {"key": {"a": 1}, "2dsphereIndexVersion": 3}), 67);
        assert_eq!(
            code(doc! {"key": {"a": 1}, "partialFilterExpression": 5}),
            14
        );
        // Accepted: a whole double, MongoDB's ignored fields.
        let s =
            parse(&doc! {"key": {"a": 1}, "expireAfterSeconds": 60.0, "v": 2, "background": true})
                .expect("ok");
        assert_eq!(s.expire_after_seconds, Some(60));
        assert_eq!(s.name, "a_1");
        assert_eq!(
            parse(&doc! {"key": {"a": "hashed"}}).expect("h").name,
            "a_hashed"
        );
        assert_eq!(parse(&doc! {"key": {"$**": 1}}).expect("w").name, "$**_1");
        let t = parse(&doc! {"key": {"title": "text", "body": "text"}}).expect("t");
        assert_eq!(t.name, "title_text_body_text");
        assert_eq!(
            t.to_document(),
            doc! {"v": 2, "key": {"_fts": "text", "_ftsx": 1}, "name": "title_text_body_text",
            "weights": {"body": 1, "title": 1}, "default_language": "english",
            "language_override": "language", "textIndexVersion": 3}
        );
        let c = parse(&doc! {"key": {"dept": 1, "body": "text", "year": -1}}).expect("ct");
        assert_eq!(c.name, "dept_1_body_text_year_-1");
        assert_eq!(c.text_term_pos(), Some(1));
        assert_eq!(
            c.key_pattern(),
            doc! {"dept": 1, "_fts": "text", "_ftsx": 1, "year": -1}
        );
    }
}
