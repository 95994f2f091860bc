//! The seed document of an upsert: what a filter's equalities imply.
//!
//! Invariants:
//! - only equalities count (a plain value, `$eq`, a one-value `$in` that is not
//!   a regex), at the top level or inside a top-level `$and`; `$or`, `$nor`,
//!   `$expr` and regexes imply nothing;
//! - two equalities on one path, or on a path and its prefix, are refused
//!   (code 2) rather than merged;
//! - the seed is built in update order ([`cmp_paths`]) with `_id` first and
//!   nests at most [`MAX_DEPTH`] levels.

use bson::{Bson, Document};

use crate::doc::path;
use crate::doc::MAX_DEPTH;
use crate::error::{Error, Result};

use super::apply::{id_first, too_deep_doc};
use super::parse::{cmp_paths, parse_path};

/// The document an upsert starts from: the equality fields of `filter` (top level
/// and inside a top-level `$and`), dotted paths expanded, `_id` first.
pub fn upsert_seed(filter: &Document) -> Result<Document> {
    let mut eqs: Vec<(Vec<String>, Bson)> = Vec::new();
    collect_equalities(filter, &mut eqs, 1)?;
    let mut paths: Vec<&Vec<String>> = eqs.iter().map(|(p, _)| p).collect();
    paths.sort();
    for w in paths.windows(2) {
        let (a, b) = (w[0], w[1]);
        if a == b {
            return Err(Error::bad_value(format!(
                "cannot infer query fields to set, path '{}' is matched twice",
                a.join(".")
            )));
        }
        if b.starts_with(a) {
            return Err(Error::bad_value(format!(
                "cannot infer query fields to set, both paths '{}' and '{}' are matched",
                b.join("."),
                a.join(".")
            )));
        }
    }
    eqs.sort_by(|a, b| cmp_paths(&a.0, &b.0));
    let mut out = Document::new();
    for (p, v) in eqs {
        path::set_creating(&mut out, &p, v)?;
    }
    id_first(&mut out);
    if too_deep_doc(&out, 1) {
        return Err(Error::NestingTooDeep { limit: MAX_DEPTH });
    }
    Ok(out)
}

/// Push the `(path, value)` equalities `filter` implies onto `out`; `depth`
/// bounds the `$and` recursion so a hostile filter cannot overflow the stack.
fn collect_equalities(
    filter: &Document,
    out: &mut Vec<(Vec<String>, Bson)>,
    depth: usize,
) -> Result<()> {
    if depth > MAX_DEPTH {
        return Err(Error::NestingTooDeep { limit: MAX_DEPTH });
    }
    for (k, v) in filter {
        if k == "$and" {
            if let Bson::Array(items) = v {
                for item in items {
                    if let Bson::Document(d) = item {
                        collect_equalities(d, out, depth + 1)?;
                    }
                }
            }
            continue;
        }
        // $or, $nor, $expr, …: no single value is implied.
        if k.starts_with('$') {
            continue;
        }
        let value = match v {
            Bson::Document(d) if d.keys().next().is_some_and(|f| f.starts_with('$')) => {
                if let Some(x) = d.get("$eq") {
                    Some(x.clone())
                } else {
                    // A one-value $in is an equality, as MongoDB rewrites it.
                    match d.get("$in") {
                        Some(Bson::Array(a)) if a.len() == 1 => match &a[0] {
                            Bson::RegularExpression(_) => None,
                            x => Some(x.clone()),
                        },
                        _ => None,
                    }
                }
            }
            // A regex is a pattern match, not an equality.
            Bson::RegularExpression(_) => None,
            other => Some(other.clone()),
        };
        if let Some(value) = value {
            let p = parse_path(k)?;
            out.push((p, value));
        }
    }
    Ok(())
}
