//! Parse-time conflicts between the paths of one update, decided as MongoDB's
//! update tree (`UpdateObjectNode::parseAndMerge`) decides them, so the error
//! and its message are the ones MongoDB gives.
//!
//! Each path is entered in order (operators as written, fields as written;
//! `$rename` enters its source, then its destination). A path walks down a
//! trie whose inner nodes are *object* nodes (children named by field, or `$`
//! for the positional element) or *array* nodes (children named by array
//! filter identifier, `""` for `$[]`): a node is an array node exactly when
//! the component after it is `$[…]`.
//!
//! Invariants:
//! - a path that passes through an existing leaf, or needs an object node
//!   where an array node is (or the reverse), conflicts at that prefix:
//!   "Updating the path 'P' would create a conflict at 'prefix'" (40);
//! - a path ending where any node already is conflicts at itself;
//! - `$[<identifier>]` first is refused (2), an identifier without an array
//!   filter is refused (2), and every identifier met is recorded in `used`
//!   (the caller refuses unused filters);
//! - so two static paths that pass never overlap; dynamic paths (`$`, `$[…]`)
//!   that pass may still meet on one element of one document, which the
//!   executor detects per document (`positional`).

use std::collections::{BTreeMap, BTreeSet};

use crate::error::{Error, Result};

use super::positional::{array_filter_ident, ArrayFilters};

#[derive(Debug, Default)]
pub(super) struct Trie {
    kind: NodeKind,
    children: BTreeMap<String, Trie>,
}

#[derive(Debug, Default, PartialEq, Eq, Clone, Copy)]
enum NodeKind {
    #[default]
    Object,
    Array,
    Leaf,
}

impl Trie {
    /// Enter `path` (split, already checked by `parse_update_path`).
    pub(super) fn insert(
        &mut self,
        path: &[String],
        filters: &ArrayFilters,
        used: &mut BTreeSet<String>,
    ) -> Result<()> {
        let dotted = path.join(".");
        let Some(last) = path.len().checked_sub(1) else {
            return Err(Error::Internal("empty update path".into()));
        };
        let mut cur = self;
        for i in 0..last {
            let name = child_name(path, i, &dotted, filters, used)?;
            let want = if array_filter_ident(&path[i + 1]).is_some() {
                NodeKind::Array
            } else {
                NodeKind::Object
            };
            let child = cur.children.entry(name).or_insert_with(|| Trie {
                kind: want,
                children: BTreeMap::new(),
            });
            if child.kind != want {
                return Err(conflict(&dotted, &path[..=i].join(".")));
            }
            cur = child;
        }
        let name = child_name(path, last, &dotted, filters, used)?;
        if cur.children.contains_key(&name) {
            return Err(conflict(&dotted, &dotted));
        }
        cur.children.insert(
            name,
            Trie {
                kind: NodeKind::Leaf,
                children: BTreeMap::new(),
            },
        );
        Ok(())
    }
}

/// The trie key of `path[i]`: the identifier of `$[<identifier>]` (checked:
/// not first, has a filter), else the component itself.
fn child_name(
    path: &[String],
    i: usize,
    dotted: &str,
    filters: &ArrayFilters,
    used: &mut BTreeSet<String>,
) -> Result<String> {
    let part = &path[i];
    let Some(ident) = array_filter_ident(part) else {
        return Ok(part.clone());
    };
    if i == 0 {
        return Err(Error::bad_value(format!(
            "Cannot have array filter identifier (i.e. '$[<id>]') element in the first \
             position in path '{dotted}'"
        )));
    }
    if !ident.is_empty() {
        if !filters.contains(ident) {
            return Err(Error::bad_value(format!(
                "No array filter found for identifier '{ident}' in path '{dotted}'"
            )));
        }
        used.insert(ident.to_string());
    }
    Ok(ident.to_string())
}

fn conflict(path: &str, at: &str) -> Error {
    Error::ConflictingUpdateOperators(format!(
        "Updating the path '{path}' would create a conflict at '{at}'"
    ))
}
