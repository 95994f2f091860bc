//! `$project` (and `$unset`, its exclusion form).

use bson::{Bson, Document};

use crate::error::{Error, Result};
use crate::query::expr::{self, parse_field_path, Expr, Root};

#[derive(Debug, Clone)]
pub(super) struct Project {
    inclusion: bool,
    root: ProjNode,
}

#[derive(Debug, Clone, Default)]
struct ProjNode {
    fields: Vec<(String, ProjItem)>,
}

#[derive(Debug, Clone)]
enum ProjItem {
    Include,
    Exclude,
    Computed(Expr),
    Nested(ProjNode),
}

impl ProjNode {
    fn get(&self, k: &str) -> Option<&ProjItem> {
        self.fields.iter().find(|(f, _)| f == k).map(|(_, i)| i)
    }

    fn has_computed(&self) -> bool {
        self.fields.iter().any(|(_, i)| match i {
            ProjItem::Computed(_) => true,
            ProjItem::Nested(n) => n.has_computed(),
            _ => false,
        })
    }

    /// Insert an item at `path`, refusing collisions (`a` and `a.b`).
    fn insert(&mut self, path: &[String], item: ProjItem, full: &str) -> Result<()> {
        let collision = || {
            Error::bad_value(format!(
                "Invalid $project :: caused by :: Path collision at {full}"
            ))
        };
        let Some((first, rest)) = path.split_first() else {
            return Err(collision());
        };
        let pos = self.fields.iter().position(|(f, _)| f == first);
        if rest.is_empty() {
            if pos.is_some() {
                return Err(collision());
            }
            self.fields.push((first.clone(), item));
            return Ok(());
        }
        match pos {
            Some(p) => match &mut self.fields[p].1 {
                ProjItem::Nested(n) => n.insert(rest, item, full),
                _ => Err(collision()),
            },
            None => {
                let mut n = ProjNode::default();
                n.insert(rest, item, full)?;
                self.fields.push((first.clone(), ProjItem::Nested(n)));
                Ok(())
            }
        }
    }
}

impl Project {
    pub(super) fn parse(spec: &Document) -> Result<Project> {
        if spec.is_empty() {
            return Err(Error::bad_value(
                "Invalid $project :: caused by :: projection specification must have at least one field",
            ));
        }
        let mut root = ProjNode::default();
        let (mut includes, mut excludes) = (false, false);
        parse_projection(spec, &[], &mut root, &mut includes, &mut excludes, 0)?;
        if includes && excludes {
            return Err(Error::bad_value(
                "Invalid $project :: caused by :: Cannot do exclusion on a field in an inclusion projection",
            ));
        }
        // Only `_id: 0` (or nothing but `_id` exclusions) is an exclusion projection.
        let id_excluded = matches!(root.get("_id"), Some(ProjItem::Exclude));
        let inclusion = includes || !(excludes || id_excluded);
        if inclusion && !id_excluded && root.get("_id").is_none() {
            root.fields
                .insert(0, ("_id".to_string(), ProjItem::Include));
        }
        Ok(Project { inclusion, root })
    }

    pub(super) fn apply(&self, root: &Root<'_>) -> Result<Document> {
        let doc = match root {
            Root::Doc(d) => project_node(&self.root, d, self.inclusion, root)?,
            Root::Raw(r) => {
                let d = crate::doc::to_document(r)?;
                project_node(&self.root, &d, self.inclusion, root)?
            }
        };
        Ok(doc)
    }
}

fn parse_projection(
    spec: &Document,
    prefix: &[String],
    root: &mut ProjNode,
    includes: &mut bool,
    excludes: &mut bool,
    depth: usize,
) -> Result<()> {
    if depth > 100 {
        return Err(Error::bad_value("$project specification nests too deeply"));
    }
    for (k, v) in spec {
        let parts = parse_field_path(k)
            .map_err(|e| Error::bad_value(format!("Invalid $project :: caused by :: {e}")))?;
        let mut path = prefix.to_vec();
        path.extend(parts);
        let full = path.join(".");
        let is_id = path.len() == 1 && path[0] == "_id";
        let item = match v {
            Bson::Boolean(_)
            | Bson::Int32(_)
            | Bson::Int64(_)
            | Bson::Double(_)
            | Bson::Decimal128(_) => {
                if expr::truthy(&Some(v.clone())) {
                    ProjItem::Include
                } else {
                    ProjItem::Exclude
                }
            }
            Bson::Document(d) if d.keys().next().is_some_and(|k| k.starts_with('$')) => {
                ProjItem::Computed(Expr::parse(v)?)
            }
            Bson::Document(d) => {
                if d.is_empty() {
                    return Err(Error::bad_value(format!(
                        "Invalid $project :: caused by :: An empty sub-projection is not a valid value. Found empty object at path {full}"
                    )));
                }
                parse_projection(d, &path, root, includes, excludes, depth + 1)?;
                continue;
            }
            other => ProjItem::Computed(Expr::parse(other)?),
        };
        match (&item, is_id) {
            (_, true) => {}
            (ProjItem::Exclude, false) => *excludes = true,
            (_, false) => *includes = true,
        }
        root.insert(&path, item, &full)?;
    }
    Ok(())
}

fn project_node(
    node: &ProjNode,
    doc: &Document,
    inclusion: bool,
    root: &Root<'_>,
) -> Result<Document> {
    let mut out = Document::new();
    for (k, v) in doc {
        match (node.get(k), inclusion) {
            (Some(ProjItem::Include), _) => {
                out.insert(k.clone(), v.clone());
            }
            (Some(ProjItem::Nested(child)), _) => {
                if let Some(x) = project_value(child, v, inclusion, root)? {
                    out.insert(k.clone(), x);
                }
            }
            (Some(ProjItem::Exclude), _) | (Some(ProjItem::Computed(_)), _) => {}
            (None, true) => {}
            (None, false) => {
                out.insert(k.clone(), v.clone());
            }
        }
    }
    if inclusion {
        add_computed(node, &mut out, root)?;
    }
    Ok(out)
}

/// Project a value under a nested spec: documents recursively, arrays element by
/// element; scalars are dropped by an inclusion and kept by an exclusion.
fn project_value(
    node: &ProjNode,
    v: &Bson,
    inclusion: bool,
    root: &Root<'_>,
) -> Result<Option<Bson>> {
    Ok(match v {
        Bson::Document(d) => Some(Bson::Document(project_node(node, d, inclusion, root)?)),
        Bson::Array(a) => {
            let mut out = Vec::with_capacity(a.len());
            for e in a {
                if let Some(x) = project_value(node, e, inclusion, root)? {
                    out.push(x);
                }
            }
            Some(Bson::Array(out))
        }
        // Computed fields below a scalar replace it with a document.
        _ if inclusion && node.has_computed() => {
            let mut d = Document::new();
            add_computed(node, &mut d, root)?;
            Some(Bson::Document(d))
        }
        _ if inclusion => None,
        other => Some(other.clone()),
    })
}

/// Append an inclusion's computed fields (in spec order) to `out`.
fn add_computed(node: &ProjNode, out: &mut Document, root: &Root<'_>) -> Result<()> {
    for (k, item) in &node.fields {
        match item {
            ProjItem::Computed(e) => {
                if let Some(v) = e.eval(root)? {
                    out.insert(k.clone(), v);
                }
            }
            ProjItem::Nested(child) if child.has_computed() => match out.get_mut(k) {
                // Already projected from the input: computed fields were added there.
                Some(Bson::Document(_)) | Some(Bson::Array(_)) => {}
                _ => {
                    let mut d = Document::new();
                    add_computed(child, &mut d, root)?;
                    out.insert(k.clone(), d);
                }
            },
            _ => {}
        }
    }
    Ok(())
}
