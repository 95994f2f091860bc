//! Wildcard indexes (`{"$**": 1}`, `{"a.b.$**": 1}`, `wildcardProjection`):
//! which paths they cover and the `(path, value)` keys a document gives.
//!
//! A wildcard index holds one entry per leaf value of every covered path:
//! the key is `(dotted path, value)`. Array elements are keys of the array's
//! path (positions are not part of paths), documents inside arrays are
//! descended into, and an empty document or array is itself a leaf.
//!
//! Invariant (what makes the index usable for a query on one path `p` with
//! a scalar equality or range): every value a filter on `p` compares — the
//! values `p` reaches through documents and arrays, and the elements of an
//! array reached — is a key `(p, value)`. Keys are generated generously
//! (nested arrays are flattened too), never sparingly: an extra key costs
//! space, a missing one would lose a match. `_id` is not covered unless the
//! projection includes it (MongoDB's rule).

use bson::raw::{RawArray, RawDocument};
use bson::{Bson, Document, RawBson, RawBsonRef};

use crate::error::{Error, Result};

/// A `wildcardProjection`: include or exclude these paths (and their subtrees).
#[derive(Debug, Clone, PartialEq)]
pub struct WildcardProjection {
    /// As given (reported by `listIndexes`).
    pub doc: Document,
    /// `true`: only the listed paths; `false`: all but the listed paths.
    pub include: bool,
    /// The listed paths, `_id` excepted.
    pub paths: Vec<String>,
    /// `_id` explicitly included (`true`) or excluded (`false`).
    pub id: Option<bool>,
}

impl WildcardProjection {
    /// Parse a `wildcardProjection` document (`{a: 1, "b.c": 1}` or `{a: 0}`;
    /// only `_id` may differ from the others, as MongoDB).
    pub fn parse(doc: &Document) -> Result<WildcardProjection> {
        let bad = |m: String| {
            Error::CannotCreateIndex(format!("Failed to parse: wildcardProjection: {m}"))
        };
        if doc.is_empty() {
            return Err(bad("the projection must not be empty".into()));
        }
        let mut include: Option<bool> = None;
        let mut paths = Vec::new();
        let mut id = None;
        for (k, v) in doc {
            crate::doc::path::validate(k).map_err(&bad)?;
            if k.split('.').any(|p| p.starts_with('$')) {
                return Err(bad(format!(
                    "path '{k}' must not contain '$'-prefixed components"
                )));
            }
            let on = match v {
                Bson::Boolean(b) => *b,
                Bson::Int32(i) => *i != 0,
                Bson::Int64(i) => *i != 0,
                Bson::Double(d) => *d != 0.0,
                other => {
                    return Err(bad(format!(
                        "'{k}' must be 0, 1, true or false, not {other}"
                    )))
                }
            };
            if k == "_id" {
                id = Some(on);
                continue;
            }
            match include {
                Some(i) if i != on => {
                    return Err(bad(
                        "cannot mix inclusion and exclusion (only _id may differ)".into(),
                    ))
                }
                _ => include = Some(on),
            }
            paths.push(k.clone());
        }
        Ok(WildcardProjection {
            doc: doc.clone(),
            // Only `_id` listed: `{_id: 1}` includes `_id` and everything else
            // stays covered, as an exclusion of nothing.
            include: include.unwrap_or(false),
            paths,
            id,
        })
    }
}

/// What a wildcard index covers: the subtree under `prefix` (`a.b.$**`) or
/// the whole document (`$**`, optionally projected).
#[derive(Debug, Clone, PartialEq)]
pub struct WildcardSpec {
    pub prefix: Option<String>,
    pub projection: Option<WildcardProjection>,
}

/// How much of a path's subtree is covered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Coverage {
    /// The path and everything under it.
    All,
    /// Only some paths under it (descend to find them).
    Some,
    None,
}

fn is_under(path: &str, ancestor: &str) -> bool {
    path == ancestor
        || (path.len() > ancestor.len()
            && path.starts_with(ancestor)
            && path.as_bytes()[ancestor.len()] == b'.')
}

impl WildcardSpec {
    /// The coverage of `path` (a dotted path of field names).
    pub fn coverage(&self, path: &str) -> Coverage {
        if let Some(prefix) = &self.prefix {
            return if is_under(path, prefix) {
                Coverage::All
            } else if is_under(prefix, path) {
                Coverage::Some
            } else {
                Coverage::None
            };
        }
        let top_is_id = path == "_id" || path.starts_with("_id.");
        let Some(p) = &self.projection else {
            return if top_is_id {
                Coverage::None
            } else {
                Coverage::All
            };
        };
        if top_is_id {
            return if p.id == Some(true) {
                Coverage::All
            } else {
                Coverage::None
            };
        }
        let listed = p.paths.iter().any(|s| is_under(path, s));
        let ancestor_of_listed = p.paths.iter().any(|s| is_under(s, path) && s != path);
        match (p.include, listed, ancestor_of_listed) {
            (true, true, _) => Coverage::All,
            (true, false, true) => Coverage::Some,
            (true, false, false) => Coverage::None,
            (false, true, _) => Coverage::None,
            (false, false, true) => Coverage::Some,
            (false, false, false) => Coverage::All,
        }
    }

    /// The `(path, value)` keys of `doc`, sorted and deduplicated by the
    /// caller. Errors when they would pass `max` (multikey fan-out bound).
    pub fn keys(&self, doc: &RawDocument, max: usize) -> Result<Vec<(String, RawBson)>> {
        let mut out = Vec::new();
        self.walk_fields(doc, "", &mut out, max)?;
        Ok(out)
    }

    fn walk_fields(
        &self,
        doc: &RawDocument,
        parent: &str,
        out: &mut Vec<(String, RawBson)>,
        max: usize,
    ) -> Result<()> {
        for (name, v) in doc.into_iter().flatten() {
            let path = if parent.is_empty() {
                name.to_string()
            } else {
                format!("{parent}.{name}")
            };
            match self.coverage(&path) {
                Coverage::None => {}
                Coverage::All => leaves(&path, v, out, max)?,
                Coverage::Some => match v {
                    RawBsonRef::Document(d) => self.walk_fields(d, &path, out, max)?,
                    RawBsonRef::Array(a) => {
                        for e in a.into_iter().flatten() {
                            if let RawBsonRef::Document(d) = e {
                                self.walk_fields(d, &path, out, max)?;
                            }
                        }
                    }
                    _ => {}
                },
            }
        }
        Ok(())
    }
}

fn push(out: &mut Vec<(String, RawBson)>, path: &str, v: RawBsonRef<'_>, max: usize) -> Result<()> {
    if out.len() >= max {
        return Err(Error::CannotCreateIndex(format!(
            "document produces more than {max} wildcard index keys"
        )));
    }
    out.push((path.to_string(), v.into()));
    Ok(())
}

/// Every leaf under `path` whose value is `v` (its whole subtree is covered).
fn leaves(
    path: &str,
    v: RawBsonRef<'_>,
    out: &mut Vec<(String, RawBson)>,
    max: usize,
) -> Result<()> {
    match v {
        RawBsonRef::Document(d) => {
            let mut any = false;
            for (name, child) in d.into_iter().flatten() {
                any = true;
                leaves(&format!("{path}.{name}"), child, out, max)?;
            }
            if !any {
                push(out, path, v, max)?;
            }
        }
        RawBsonRef::Array(a) => array_leaves(path, a, v, out, max)?,
        other => push(out, path, other, max)?,
    }
    Ok(())
}

fn array_leaves(
    path: &str,
    a: &RawArray,
    whole: RawBsonRef<'_>,
    out: &mut Vec<(String, RawBson)>,
    max: usize,
) -> Result<()> {
    let mut any = false;
    for e in a.into_iter().flatten() {
        any = true;
        match e {
            RawBsonRef::Document(_) => leaves(path, e, out, max)?,
            // Generous: a nested array is a key of the path and so are its elements.
            RawBsonRef::Array(inner) => {
                push(out, path, e, max)?;
                array_leaves(path, inner, e, out, max)?;
            }
            other => push(out, path, other, max)?,
        }
    }
    if !any {
        push(out, path, whole, max)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use bson::{doc, rawdoc};

    fn paths(spec: &WildcardSpec, d: &RawDocument) -> Vec<String> {
        let mut k: Vec<String> = spec
            .keys(d, 1000)
            .expect("keys")
            .into_iter()
            .map(|(p, v)| format!("{p}={}", Bson::try_from(v).expect("bson")))
            .collect();
        k.sort();
        k.dedup();
        k
    }

    #[test]
    fn whole_document_skips_id_and_descends() {
        let all = WildcardSpec {
            prefix: None,
            projection: None,
        };
        let d = rawdoc! {"_id": 1, "a": 1, "b": {"c": "x", "d": {}}, "e": [1, {"f": 2}, [3]]};
        assert_eq!(
            paths(&all, &d),
            vec!["a=1", "b.c=\"x\"", "b.d={}", "e.f=2", "e=1", "e=3", "e=[3]"]
        );
    }

    #[test]
    fn prefix_and_projection() {
        let under = WildcardSpec {
            prefix: Some("b".into()),
            projection: None,
        };
        let d = rawdoc! {"_id": 1, "a": 1, "b": {"c": 1}, "bb": 2};
        assert_eq!(paths(&under, &d), vec!["b.c=1"]);
        let proj = |p: Document| WildcardSpec {
            prefix: None,
            projection: Some(WildcardProjection::parse(&p).expect("projection")),
        };
        assert_eq!(paths(&proj(doc! {"b.c": 1}), &d), vec!["b.c=1"]);
        assert_eq!(paths(&proj(doc! {"b": 0}), &d), vec!["a=1", "bb=2"]);
        assert_eq!(
            paths(&proj(doc! {"a": 1, "_id": 1}), &d),
            vec!["_id=1", "a=1"]
        );
        assert!(WildcardProjection::parse(&doc! {"a": 1, "b": 0}).is_err());
    }
}
