//! Applying a parsed [`Projection`] to one document.
//!
//! Owns: the inclusion and exclusion passes over a document, `$slice`, the
//! `$elemMatch` pass, and the computed fields of `$project`.
//!
//! Invariants: an inclusion walks only the projected paths, an exclusion copies
//! everything not excluded; both recurse only along the tree, so depth is
//! bounded by the tree and checked against [`MAX_DEPTH`] (arrays of arrays
//! recurse without consuming a path component). Computed fields read the whole
//! input document (`root`), never the sub-document they are placed in; the
//! computed values of one level are refused (10334) as soon as together they
//! pass 16 MiB, so a projection never builds a far larger document (the
//! pipeline checks each whole output document).

use bson::raw::RawDocument;
use bson::{Bson, Document};

use crate::doc::size::{document_len, SizeBudget};
use crate::doc::MAX_DEPTH;
use crate::error::{Error, Result};
use crate::query::expr::Root;
use crate::query::projection::{Leaf, Mode, Node, Projection};

impl Projection {
    /// Apply it to one stored document (find).
    pub fn apply(&self, doc: &RawDocument) -> Result<Document> {
        self.apply_to(&Root::Raw(doc))
    }

    /// Apply it to the document a pipeline stage sees (raw or already owned);
    /// computed fields are evaluated against it.
    pub fn apply_to(&self, root: &Root<'_>) -> Result<Document> {
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
            Mode::Exclude => exclude_doc(&self.root, d, 1)?,
        };
        for (name, cond) in &self.elem_matches {
            if let Some(Bson::Array(items)) = d.get(name) {
                if let Some(first) = items.iter().find(|x| cond.matches(x)) {
                    out.insert(name.clone(), Bson::Array(vec![first.clone()]));
                }
            }
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

/// The value a leaf keeps from the input (`None`: the field is left out here;
/// computed and `$elemMatch` fields are added by their own passes).
fn apply_leaf(leaf: &Leaf, v: &Bson) -> Option<Bson> {
    match leaf {
        Leaf::Include => Some(v.clone()),
        Leaf::Slice { skip, limit } => Some(slice(*skip, *limit, v)),
        Leaf::Exclude | Leaf::ElemMatch | Leaf::Computed(_) => None,
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
            Some(leaf) => apply_leaf(leaf, v),
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

/// Append the computed fields of `node`'s children (in spec order) to `out`.
fn add_computed(node: &Node, out: &mut Document, root: &Root<'_>) -> Result<()> {
    if !node.has_computed {
        return Ok(());
    }
    // The computed values added at this level: stop as soon as they alone
    // pass the document limit (projected fields are bounded by the input).
    let mut size = SizeBudget::new("$project");
    for (k, child) in &node.children {
        match &child.leaf {
            Some(Leaf::Computed(e)) => {
                // Missing (`$$REMOVE`, an absent field) leaves the field out.
                if let Some(v) = e.eval(root)? {
                    size.add_element(k, &v)?;
                    out.insert(k.clone(), v);
                }
            }
            None if child.has_computed => match out.get(k) {
                // Projected from the input: its computed fields were added there.
                Some(Bson::Document(_)) | Some(Bson::Array(_)) => {}
                _ => {
                    let d = computed_only(child, root)?;
                    size.add(2 + k.len() + document_len(&d))?;
                    out.insert(k.clone(), d);
                }
            },
            _ => {}
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

fn exclude_doc(node: &Node, d: &Document, depth: usize) -> Result<Document> {
    check_depth(depth)?;
    let mut out = Document::new();
    for (k, v) in d {
        let Some(child) = node.child(k) else {
            out.insert(k.clone(), v.clone());
            continue;
        };
        if let Some(leaf) = &child.leaf {
            if let Some(x) = apply_leaf(leaf, v) {
                out.insert(k.clone(), x);
            }
            continue;
        }
        let x = match v {
            Bson::Document(sub) => Bson::Document(exclude_doc(child, sub, depth + 1)?),
            Bson::Array(items) => Bson::Array(exclude_array(child, items, depth + 1)?),
            other => other.clone(),
        };
        out.insert(k.clone(), x);
    }
    Ok(out)
}

fn exclude_array(node: &Node, items: &[Bson], depth: usize) -> Result<Vec<Bson>> {
    check_depth(depth)?;
    items
        .iter()
        .map(|x| {
            Ok(match x {
                Bson::Document(sub) => Bson::Document(exclude_doc(node, sub, depth + 1)?),
                Bson::Array(inner) => Bson::Array(exclude_array(node, inner, depth + 1)?),
                other => other.clone(),
            })
        })
        .collect()
}
