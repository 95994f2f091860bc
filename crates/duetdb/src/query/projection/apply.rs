//! Applying a parsed [`Projection`] to one document.
//!
//! Owns: the inclusion and exclusion passes over a document, `$slice`, the
//! computed fields (expressions and `$elemMatch`), and positional `a.$` on
//! the projected document.
//!
//! Invariants: an inclusion walks only the projected paths, an exclusion copies
//! everything not excluded; both recurse only along the tree, so depth is
//! bounded by the tree and checked against [`MAX_DEPTH`] (arrays of arrays
//! recurse without consuming a path component). Computed fields read the whole
//! input document (`root`), never the sub-document they are placed in, and
//! are evaluated after the fields of their level are copied (MongoDB's
//! `applyProjections` then `applyExpressions`): a new field is appended, an
//! existing one replaced in place, a missing value removes it. The computed
//! values of one level are refused (10334) as soon as together they pass 16
//! MiB, so a projection never builds a far larger document (the pipeline
//! checks each whole output document). Positional `a.$` runs last, on the
//! projected document, as MongoDB's root-replacement expression does.

use bson::raw::RawDocument;
use bson::{Bson, Document, RawDocumentBuf};

use crate::doc::size::{document_len, SizeBudget};
use crate::doc::MAX_DEPTH;
use crate::error::{Error, Result};
use crate::query::expr::{loc, under_collation, Root, Value};
use crate::query::projection::{Leaf, Mode, Node, Positional, Projection};
use crate::query::update::ElemCond;

impl Projection {
    /// Apply it to one stored document (find).
    pub fn apply(&self, doc: &RawDocument) -> Result<Document> {
        self.apply_to(&Root::Raw(doc))
    }

    /// Apply it to the document a pipeline stage sees (raw or already owned);
    /// computed fields are evaluated against it, under this projection's
    /// collation if it has one.
    pub fn apply_to(&self, root: &Root<'_>) -> Result<Document> {
        under_collation(self.collator.as_ref(), || self.apply_here(root))
    }

    fn apply_here(&self, root: &Root<'_>) -> Result<Document> {
        let converted;
        let d: &Document = match root {
            Root::Doc(d) => d,
            // The whole document is wanted: convert it once, without a copy.
            Root::Raw(r) if self.mode == Mode::All => return crate::doc::to_document(r),
            Root::Raw(r) => {
                converted = crate::doc::to_document(r)?;
                &converted
            }
        };
        let mut out = match self.mode {
            Mode::All => return Ok(d.clone()),
            Mode::Include => {
                let mut out = include_doc(&self.root, d, root, 1)?;
                // A text match's score is metadata in MongoDB: a projection
                // keeps it (`query::text`'s module doc).
                if let Some(score) = d.get(crate::query::text::TEXT_SCORE_FIELD) {
                    out.insert(crate::query::text::TEXT_SCORE_FIELD, score.clone());
                }
                out
            }
            Mode::Exclude => exclude_doc(&self.root, d, root, 1)?,
        };
        if let Some(p) = &self.positional {
            positional(p, root, &mut out)?;
        }
        Ok(out)
    }
}

fn check_depth(depth: usize) -> Result<()> {
    if depth > MAX_DEPTH {
        return Err(Error::NestingTooDeep { limit: MAX_DEPTH });
    }
    Ok(())
}

fn slice(leaf_skip: Option<i64>, limit: i64, v: &Bson) -> Bson {
    let Bson::Array(a) = v else {
        return v.clone();
    };
    let len = a.len() as i64;
    let (start, count) = match leaf_skip {
        None if limit >= 0 => (0, limit.min(len)),
        None => {
            let n = limit.saturating_neg().min(len);
            (len - n, n)
        }
        Some(skip) => {
            let start = if skip >= 0 {
                skip.min(len)
            } else {
                (len + skip.max(-len)).max(0)
            };
            (start, limit.min(len - start))
        }
    };
    let (start, count) = (
        usize::try_from(start).unwrap_or(0),
        usize::try_from(count).unwrap_or(0),
    );
    Bson::Array(a.iter().skip(start).take(count).cloned().collect())
}

/// What an inclusion keeps of the value at a leaf (`None`: the field is
/// left out here; computed fields are added by [`add_computed`]).
fn included(leaf: &Leaf, v: &Bson) -> Option<Bson> {
    match leaf {
        Leaf::Include | Leaf::Positional => Some(v.clone()),
        Leaf::Slice { skip, limit } => Some(slice(*skip, *limit, v)),
        Leaf::Exclude | Leaf::ElemMatch(_) | Leaf::Computed(_) => None,
    }
}

fn include_doc(node: &Node, d: &Document, root: &Root<'_>, depth: usize) -> Result<Document> {
    check_depth(depth)?;
    let mut out = Document::new();
    for (k, v) in d {
        let Some(child) = node.child(k) else {
            continue;
        };
        let kept = match &child.leaf {
            Some(leaf) => included(leaf, v),
            None => include_value(child, v, root, depth + 1)?,
        };
        if let Some(x) = kept {
            out.insert(k.clone(), x);
        }
    }
    add_computed(node, &mut out, root)?;
    Ok(out)
}

/// A value below an inner node of an inclusion.
fn include_value(node: &Node, v: &Bson, root: &Root<'_>, depth: usize) -> Result<Option<Bson>> {
    Ok(match v {
        Bson::Document(sub) => Some(Bson::Document(include_doc(node, sub, root, depth)?)),
        Bson::Array(items) => Some(Bson::Array(include_array(node, items, root, depth)?)),
        // Computed fields below a scalar replace it with a document of them.
        _ if node.has_computed => Some(Bson::Document(computed_only(node, root)?)),
        // A scalar where the path continues has nothing to include.
        _ => None,
    })
}

fn include_array(node: &Node, items: &[Bson], root: &Root<'_>, depth: usize) -> Result<Vec<Bson>> {
    check_depth(depth)?;
    let mut out = Vec::new();
    for x in items {
        if let Some(y) = include_value(node, x, root, depth + 1)? {
            out.push(y);
        }
    }
    Ok(out)
}

/// The value of a computed leaf named `k` (`None`: missing).
fn computed(leaf: &Leaf, k: &str, root: &Root<'_>) -> Result<Option<Value>> {
    Ok(match leaf {
        Leaf::Computed(e) => Some(e.eval(root)?),
        Leaf::ElemMatch(cond) => Some(elem_match(cond, k, root)?),
        _ => None,
    })
}

/// `$elemMatch` on top-level field `k` of the input: its first matching
/// element as a one-element array; missing when none matches.
fn elem_match(cond: &ElemCond, k: &str, root: &Root<'_>) -> Result<Value> {
    let Some(Bson::Array(items)) = root.get(&[k.to_string()])? else {
        return Ok(None);
    };
    Ok(items
        .iter()
        .find(|x| cond.matches(x))
        .map(|x| Bson::Array(vec![x.clone()])))
}

/// Set the computed fields of `node`'s children (in spec order) in `out`:
/// a new field is appended, an existing one replaced in place; a missing
/// value removes the field.
fn add_computed(node: &Node, out: &mut Document, root: &Root<'_>) -> Result<()> {
    if !node.has_computed {
        return Ok(());
    }
    // The computed values added at this level: stop as soon as they alone
    // pass the document limit (projected fields are bounded by the input).
    let mut size = SizeBudget::new("$project");
    for (k, child) in &node.children {
        match &child.leaf {
            Some(leaf) => match computed(leaf, k, root)? {
                Some(Some(v)) => {
                    size.add_element(k, &v)?;
                    out.insert(k.clone(), v);
                }
                // Missing (`$$REMOVE`, an absent field) leaves the field out.
                Some(None) => {
                    out.remove(k);
                }
                None => {}
            },
            None if child.has_computed => match out.get(k) {
                // Projected from the input: its computed fields were added there.
                Some(Bson::Document(_)) | Some(Bson::Array(_)) => {}
                _ => {
                    let d = computed_only(child, root)?;
                    size.add(2 + k.len() + document_len(&d))?;
                    out.insert(k.clone(), d);
                }
            },
            None => {}
        }
    }
    Ok(())
}

/// A document holding only the computed fields below `node`.
fn computed_only(node: &Node, root: &Root<'_>) -> Result<Document> {
    let mut d = Document::new();
    add_computed(node, &mut d, root)?;
    Ok(d)
}

fn exclude_doc(node: &Node, d: &Document, root: &Root<'_>, depth: usize) -> Result<Document> {
    check_depth(depth)?;
    let mut out = Document::new();
    for (k, v) in d {
        let Some(child) = node.child(k) else {
            out.insert(k.clone(), v.clone());
            continue;
        };
        let x = match (&child.leaf, v) {
            (Some(Leaf::Exclude), _) => continue,
            (Some(Leaf::Slice { skip, limit }), v) => slice(*skip, *limit, v),
            // Kept; a computed field is set in place below.
            (Some(_), v) => v.clone(),
            (None, Bson::Document(sub)) => {
                Bson::Document(exclude_doc(child, sub, root, depth + 1)?)
            }
            (None, Bson::Array(items)) => {
                Bson::Array(exclude_array(child, items, root, depth + 1)?)
            }
            (None, other) => other.clone(),
        };
        out.insert(k.clone(), x);
    }
    add_computed(node, &mut out, root)?;
    Ok(out)
}

fn exclude_array(node: &Node, items: &[Bson], root: &Root<'_>, depth: usize) -> Result<Vec<Bson>> {
    check_depth(depth)?;
    items
        .iter()
        .map(|x| {
            Ok(match x {
                Bson::Document(sub) => Bson::Document(exclude_doc(node, sub, root, depth + 1)?),
                Bson::Array(inner) => Bson::Array(exclude_array(node, inner, root, depth + 1)?),
                other => other.clone(),
            })
        })
        .collect()
}

/// Positional `a.$` on the projected document `out` (MongoDB's
/// `applyPositionalProjection`): the first array on the path, walked in
/// `out`, becomes the one-element array of the element at the position the
/// query's match went through (in the input document). No array on the
/// path: `out` is left as it is.
fn positional(p: &Positional, root: &Root<'_>, out: &mut Document) -> Result<()> {
    let buf;
    let raw: &RawDocument = match root {
        Root::Raw(r) => r,
        Root::Doc(d) => {
            buf = RawDocumentBuf::try_from(*d).map_err(|e| Error::InvalidBson(e.to_string()))?;
            &buf
        }
    };
    let key = p.filter.match_position(raw).flatten();
    let mut at: &Document = out;
    for (i, part) in p.path.iter().enumerate() {
        match at.get(part) {
            Some(Bson::Array(items)) => {
                let Some(idx) = key else {
                    return Err(loc!(
                        51246,
                        "positional operator '.$' couldn't find a matching element in the array"
                    ));
                };
                let Some(elem) = items.get(idx) else {
                    return Err(loc!(51247, "positional operator '.$' element mismatch"));
                };
                let value = Bson::Array(vec![elem.clone()]);
                set_nested(out, &p.path[..=i], value);
                return Ok(());
            }
            Some(Bson::Document(sub)) => at = sub,
            // Not on a path of documents: MongoDB looks the next component
            // up in the same document.
            _ => {}
        }
    }
    Ok(())
}

/// Set `path` in `d` to `value`, making documents of what is missing or
/// not a document on the way (`MutableDocument::setNestedField`).
fn set_nested(d: &mut Document, path: &[String], value: Bson) {
    let Some((first, rest)) = path.split_first() else {
        return;
    };
    if rest.is_empty() {
        d.insert(first.clone(), value);
        return;
    }
    if !matches!(d.get(first), Some(Bson::Document(_))) {
        d.insert(first.clone(), Document::new());
    }
    if let Some(Bson::Document(sub)) = d.get_mut(first) {
        set_nested(sub, rest, value);
    }
}
