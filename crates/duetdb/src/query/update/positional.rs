//! Dynamic update paths: the positional `$` (the array position the query
//! matched), `$[]` (every element) and `$[<identifier>]` (the elements its
//! array filter accepts), resolved per document into the plain paths the
//! operators then apply to; and the `arrayFilters` themselves.
//!
//! Invariants:
//! - resolution reads the document before any operator ran: operators of one
//!   update never overlap statically (`conflict`), so no operator can change
//!   what another one's dynamic path resolves to;
//! - `$` without a matched position (the query matched no array element, or
//!   the document is an upsert's new one) is BadValue (2), as MongoDB;
//! - an array update on a missing path is 2 ("must exist"), on a non-array 2
//!   ("Cannot apply array updates to non-array element"), whatever the
//!   operator, as MongoDB's array node refuses before its leaf runs;
//! - two resolved paths of one update that meet (equal, or one a prefix of
//!   the other) are 40 "Update created a conflict at …", named as MongoDB
//!   names it: resolved up to the last array position where the two paths
//!   were spelled differently, as written after it;
//! - an array filter matches an element `e` exactly as the filter matches the
//!   document `{<identifier>: e}` (arrays traversed as in any query).

use bson::{Bson, Document, RawDocumentBuf};

use crate::doc::path::numeric_component;
use crate::error::{render_shell, Error, Result};
use crate::query::filter::Filter;

use super::parse::{cmp_paths, failed_to_parse};
use super::FieldOp;

/// The identifier of an array-filter component `$[<identifier>]` (`""` for
/// `$[]`), as MongoDB's `fieldchecker::isArrayFilterIdentifier` reads it.
pub(crate) fn array_filter_ident(part: &str) -> Option<&str> {
    (part.len() >= 3 && part.starts_with("$[") && part.ends_with(']'))
        .then(|| &part[2..part.len() - 1])
}

/// The parsed `arrayFilters` of one update, by identifier.
#[derive(Debug, Clone, Default)]
pub struct ArrayFilters {
    /// Sorted by identifier (MongoDB reports the first unused one in this order).
    filters: Vec<(String, Filter)>,
}

impl ArrayFilters {
    /// Parse `arrayFilters` (each a filter over one top-level identifier), with
    /// MongoDB's codes and messages.
    pub fn parse(docs: &[Document]) -> Result<ArrayFilters> {
        let mut filters: Vec<(String, Filter)> = Vec::with_capacity(docs.len());
        for d in docs {
            let filter = Filter::parse(d).map_err(|e| context(e, "Error parsing array filter"))?;
            let ident =
                match top_level_name(d)? {
                    Some(id) => id,
                    None => return Err(failed_to_parse(
                        "Cannot use an expression without a top-level field name in arrayFilters",
                    )),
                };
            let valid = ident.bytes().next().is_some_and(|b| b.is_ascii_lowercase())
                && ident.bytes().all(|b| b.is_ascii_alphanumeric());
            if !valid {
                return Err(Error::bad_value(format!(
                    "Error parsing array filter :: caused by :: The top-level field name must \
                     be an alphanumeric string beginning with a lowercase letter, found '{ident}'"
                )));
            }
            if filters.iter().any(|(id, _)| *id == ident) {
                return Err(failed_to_parse(format!(
                    "Found multiple array filters with the same top-level field name {ident}"
                )));
            }
            filters.push((ident, filter));
        }
        filters.sort_by(|a, b| a.0.cmp(&b.0));
        Ok(ArrayFilters { filters })
    }

    pub(super) fn contains(&self, ident: &str) -> bool {
        self.get(ident).is_some()
    }

    /// These filters under collation `c` (the update's).
    pub(super) fn with_collation(
        self,
        c: Option<std::sync::Arc<crate::doc::collation::Collator>>,
    ) -> ArrayFilters {
        ArrayFilters {
            filters: self
                .filters
                .into_iter()
                .map(|(id, f)| (id, f.with_collation(c.clone())))
                .collect(),
        }
    }

    pub(super) fn names(&self) -> impl Iterator<Item = &str> {
        self.filters.iter().map(|(id, _)| id.as_str())
    }

    fn get(&self, ident: &str) -> Option<&Filter> {
        self.filters
            .binary_search_by(|(id, _)| id.as_str().cmp(ident))
            .ok()
            .map(|i| &self.filters[i].1)
    }

    /// Does `elem` pass the filter of `ident` (`""`: `$[]`, every element)?
    fn accepts(&self, ident: &str, elem: &Bson) -> Result<bool> {
        if ident.is_empty() {
            return Ok(true);
        }
        let Some(filter) = self.get(ident) else {
            return Err(Error::Internal(format!("no array filter '{ident}'")));
        };
        let mut d = Document::new();
        d.insert(ident, elem.clone());
        let raw = RawDocumentBuf::try_from(&d).map_err(|e| Error::InvalidBson(e.to_string()))?;
        let m = filter.matches(&raw);
        filter.check()?;
        Ok(m)
    }
}

/// `e` with MongoDB's `withContext`: the same code, the message prefixed.
fn context(e: Error, prefix: &str) -> Error {
    Error::Coded {
        code: e.code(),
        name: e.code_name(),
        msg: format!("{prefix} :: caused by :: {e}"),
    }
}

/// The one top-level field (first path component) an array filter is over,
/// looking through `$and`/`$or`/`$nor` (MongoDB's `parseTopLevelFieldName`);
/// two different ones are 9.
fn top_level_name(d: &Document) -> Result<Option<String>> {
    let mut found: Option<String> = None;
    let mut add = |name: Option<String>| -> Result<()> {
        match (&found, name) {
            (_, None) => {}
            (None, Some(n)) => found = Some(n),
            (Some(f), Some(n)) if *f != n => {
                return Err(failed_to_parse(format!(
                    "Error parsing array filter :: caused by :: Expected a single top-level \
                     field name, found '{f}' and '{n}'"
                )))
            }
            _ => {}
        }
        Ok(())
    };
    for (k, v) in d {
        match k.as_str() {
            "$and" | "$or" | "$nor" => {
                if let Bson::Array(items) = v {
                    for item in items {
                        if let Bson::Document(sub) = item {
                            add(top_level_name(sub)?)?;
                        }
                    }
                }
            }
            k if k.starts_with('$') => {}
            k => add(Some(k.split('.').next().unwrap_or(k).to_string()))?,
        }
    }
    Ok(found)
}

/// Every `(resolved path, operator)` of a dynamic update on `doc`, in the
/// order they apply (resolved paths in update order).
pub(super) fn resolve_all<'a>(
    ops: &'a [FieldOp],
    doc: &Document,
    position: Option<usize>,
    filters: &ArrayFilters,
) -> Result<Vec<(Vec<String>, &'a FieldOp)>> {
    let mut out: Vec<(Vec<String>, &'a FieldOp)> = Vec::new();
    for fop in ops {
        for p in resolve(doc, &fop.path, position, filters)? {
            out.push((p, fop));
        }
        if let super::Op::Rename { from, .. } = &fop.op {
            // A rename's source is static; it takes part in conflicts.
            check_meet(&out, from, &fop.path)?;
        }
    }
    check_conflicts(&out)?;
    out.sort_by(|a, b| cmp_paths(&a.0, &b.0));
    Ok(out)
}

/// A rename source against the resolved paths so far.
fn check_meet(out: &[(Vec<String>, &FieldOp)], from: &[String], _to: &[String]) -> Result<()> {
    for (p, fop) in out {
        if p.starts_with(from) || from.starts_with(p) {
            return Err(runtime_conflict(p, &fop.path, from, from));
        }
    }
    Ok(())
}

/// Two resolved paths that meet (equal, or one a prefix of the other).
fn check_conflicts(out: &[(Vec<String>, &FieldOp)]) -> Result<()> {
    let mut idx: Vec<usize> = (0..out.len()).collect();
    idx.sort_by(|&a, &b| out[a].0.cmp(&out[b].0));
    // In component-wise order a path is directly followed by its extensions.
    for w in idx.windows(2) {
        let (a, b) = (&out[w[0]], &out[w[1]]);
        if b.0.starts_with(&a.0) {
            return Err(runtime_conflict(&a.0, &a.1.path, &b.0, &b.1.path));
        }
    }
    Ok(())
}

/// MongoDB merges the update subtrees of two array updates that reach the
/// same element; the conflict is reported where the merge fails: resolved
/// up to the last component at which the two paths were written differently
/// (each a dynamic component), as written after it.
fn runtime_conflict(a: &[String], a_pat: &[String], b: &[String], b_pat: &[String]) -> Error {
    let n = a.len().min(b.len());
    let last_diff = (0..n)
        .rev()
        .find(|&i| a_pat.get(i) != b_pat.get(i))
        .unwrap_or(n.saturating_sub(1));
    let mut at: Vec<&str> = a[..=last_diff.min(n.saturating_sub(1))]
        .iter()
        .map(String::as_str)
        .collect();
    let (shorter_pat, shorter) = if a.len() <= b.len() {
        (a_pat, a)
    } else {
        (b_pat, b)
    };
    for i in at.len()..shorter.len() {
        at.push(shorter_pat.get(i).map(String::as_str).unwrap_or(""));
    }
    Error::ConflictingUpdateOperators(format!("Update created a conflict at '{}'", at.join(".")))
}

/// The plain paths `pattern` names in `doc`.
fn resolve(
    doc: &Document,
    pattern: &[String],
    position: Option<usize>,
    filters: &ArrayFilters,
) -> Result<Vec<Vec<String>>> {
    let mut parts = pattern.to_vec();
    if let Some(i) = parts.iter().position(|p| p == "$") {
        let Some(pos) = position else {
            return Err(Error::bad_value(
                "The positional operator did not find the match needed from the query.",
            ));
        };
        parts[i] = pos.to_string();
    }
    let mut out = Vec::new();
    let root = Bson::Document(doc.clone());
    expand(&root, &parts, 0, Vec::new(), filters, &mut out)?;
    Ok(out)
}

/// Expand the array-filter components of `parts[i..]`; `cur` is the value
/// `prefix` names.
fn expand(
    cur: &Bson,
    parts: &[String],
    i: usize,
    prefix: Vec<String>,
    filters: &ArrayFilters,
    out: &mut Vec<Vec<String>>,
) -> Result<()> {
    let Some(j) = (i..parts.len()).find(|&j| array_filter_ident(&parts[j]).is_some()) else {
        let mut full = prefix;
        full.extend_from_slice(&parts[i..]);
        out.push(full);
        return Ok(());
    };
    let mut base = prefix;
    let mut target = Some(cur);
    for part in &parts[i..j] {
        target = target.and_then(|t| child(t, part));
        base.push(part.clone());
    }
    let Some(target) = target else {
        return Err(Error::bad_value(format!(
            "The path '{}' must exist in the document in order to apply array updates.",
            base.join(".")
        )));
    };
    let Bson::Array(arr) = target else {
        let name = base.last().map(String::as_str).unwrap_or("");
        return Err(Error::bad_value(format!(
            "Cannot apply array updates to non-array element {name}: {}",
            render_shell(target)
        )));
    };
    let ident = array_filter_ident(&parts[j]).unwrap_or("");
    for (k, elem) in arr.iter().enumerate() {
        if !filters.accepts(ident, elem)? {
            continue;
        }
        let mut next = base.clone();
        next.push(k.to_string());
        expand(elem, parts, j + 1, next, filters, out)?;
    }
    Ok(())
}

/// What `part` names inside `v`: a field of a document, an element of an
/// array by canonical index.
fn child<'a>(v: &'a Bson, part: &str) -> Option<&'a Bson> {
    match v {
        Bson::Document(d) => d.get(part),
        Bson::Array(a) => numeric_component(part).and_then(|i| a.get(i)),
        _ => None,
    }
}
