//! Find projections: which fields of a document a query returns.
//!
//! Owns: parsing a projection document and applying it to one stored document.
//! Supported: inclusion (`{a: 1, "b.c": 1}`), exclusion (`{a: 0}`), the `_id`
//! default (included unless `_id: 0`), nested forms (`{a: {b: 1}}` = `{"a.b": 1}`),
//! dotted paths through arrays of documents, `$slice` (`n` or `[skip, limit]`) and
//! top-level `$elemMatch`. Aggregation expressions, `$meta` and positional `a.$`
//! are refused with BadValue.
//!
//! Invariants:
//! - Inclusion and exclusion never mix, except `_id` (MongoDB's messages).
//! - No path is a prefix of another ("Path collision"), so the projection is a
//!   tree whose leaves say what happens to the value reached.
//! - Inclusion keeps document field order; `$elemMatch` fields come last (as in
//!   MongoDB 4.4+). Through arrays, inclusion keeps only document elements
//!   (reduced to the included fields) and exclusion keeps every element.
//! - Results nest no deeper than the input; input deeper than
//!   [`crate::doc::MAX_DEPTH`] is refused. Never panics on input.

use bson::raw::RawDocument;
use bson::{Bson, Document};

use crate::doc::path;
use crate::doc::MAX_DEPTH;
use crate::error::{render, Error, Result};
use crate::query::update::ElemCond;

/// A parsed projection.
#[derive(Debug, Clone)]
pub struct Projection {
    mode: Mode,
    root: Node,
    /// Top-level `$elemMatch` fields, in spec order.
    elem_matches: Vec<(String, ElemCond)>,
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Mode {
    /// Empty projection: the whole document.
    All,
    Include,
    /// Exclusion, or only `$slice`/`$elemMatch`: every other field is returned.
    Exclude,
}

#[derive(Debug, Clone, Default)]
struct Node {
    children: Vec<(String, Node)>,
    leaf: Option<Leaf>,
}

#[derive(Debug, Clone, Copy)]
enum Leaf {
    Include,
    Exclude,
    /// `skip`: elements to skip (negative: from the end); `limit`: how many to keep,
    /// or with `skip == None`, `n` from the front (negative: from the end).
    Slice {
        skip: Option<i64>,
        limit: i64,
    },
    /// Handled after the tree pass (see `elem_matches`).
    ElemMatch,
}

impl Node {
    fn child(&self, name: &str) -> Option<&Node> {
        self.children
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, n)| n)
    }
}

/// Parse-time bookkeeping.
#[derive(Default)]
struct State {
    has_include: bool,
    has_exclude: bool,
    /// `Some(true/false)` when `_id` itself was given.
    id: Option<bool>,
    /// Some path below `_id` (`_id.x`) was given.
    id_subpath: bool,
    root: Node,
    elem_matches: Vec<(String, ElemCond)>,
}

impl Projection {
    /// Parse a projection document.
    pub fn parse(spec: &Document) -> Result<Projection> {
        let mut st = State::default();
        parse_into(spec, &[], &mut st, 1)?;
        let mode = if st.has_include {
            Mode::Include
        } else if st.has_exclude || st.id == Some(false) {
            Mode::Exclude
        } else if st.id == Some(true) && st.root.children.is_empty() && !st.id_subpath {
            Mode::Include
        } else if spec.is_empty() {
            Mode::All
        } else {
            Mode::Exclude
        };
        let mut root = st.root;
        match (mode, st.id) {
            (Mode::Include, None | Some(true)) if !st.id_subpath => {
                insert_leaf(&mut root, &["_id".to_string()], Leaf::Include)?;
            }
            (Mode::Exclude, Some(false)) => {
                insert_leaf(&mut root, &["_id".to_string()], Leaf::Exclude)?;
            }
            _ => {}
        }
        Ok(Projection {
            mode,
            root,
            elem_matches: st.elem_matches,
        })
    }

    /// Apply it to one document.
    pub fn apply(&self, doc: &RawDocument) -> Result<Document> {
        let d = Document::try_from(doc).map_err(|e| Error::InvalidBson(e.to_string()))?;
        let mut out = match self.mode {
            Mode::All => return Ok(d),
            Mode::Include => include_doc(&self.root, &d, 1)?,
            Mode::Exclude => exclude_doc(&self.root, &d, 1)?,
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

fn parse_into(spec: &Document, prefix: &[String], st: &mut State, depth: usize) -> Result<()> {
    if depth > MAX_DEPTH {
        return Err(Error::NestingTooDeep { limit: MAX_DEPTH });
    }
    for (k, v) in spec {
        path::validate(k).map_err(|e| Error::bad_value(format!("invalid projection path: {e}")))?;
        let mut full: Vec<String> = prefix.to_vec();
        full.extend(k.split('.').map(str::to_string));
        let dotted = full.join(".");
        if full.len() > path::MAX_PATH_COMPONENTS {
            return Err(Error::bad_value(format!(
                "projection path '{dotted}' is too long"
            )));
        }
        if let Some(p) = full.iter().find(|p| p.starts_with('$')) {
            return Err(Error::bad_value(format!(
                "projection path '{dotted}': '{p}' is not supported (positional and \
                 $-prefixed projections are not supported)"
            )));
        }
        let is_id = full.len() == 1 && full[0] == "_id";
        if full.len() > 1 && full[0] == "_id" {
            st.id_subpath = true;
        }
        match v {
            Bson::Boolean(_)
            | Bson::Int32(_)
            | Bson::Int64(_)
            | Bson::Double(_)
            | Bson::Decimal128(_) => {
                let include = truthy(v);
                if is_id {
                    st.id = Some(include);
                    continue;
                }
                if include {
                    if st.has_exclude {
                        return Err(Error::bad_value(format!(
                            "Cannot do inclusion on field {dotted} in exclusion projection"
                        )));
                    }
                    st.has_include = true;
                    insert_leaf(&mut st.root, &full, Leaf::Include)?;
                } else {
                    if st.has_include {
                        return Err(Error::bad_value(format!(
                            "Cannot do exclusion on field {dotted} in inclusion projection"
                        )));
                    }
                    st.has_exclude = true;
                    insert_leaf(&mut st.root, &full, Leaf::Exclude)?;
                }
            }
            Bson::Document(sub) => {
                let Some(first) = sub.keys().next() else {
                    return Err(Error::bad_value(format!(
                        "An empty sub-projection is not a valid value. Found empty object at \
                         path {dotted}"
                    )));
                };
                if !first.starts_with('$') {
                    parse_into(sub, &full, st, depth + 1)?;
                    continue;
                }
                if sub.len() != 1 {
                    return Err(Error::bad_value(format!(
                        "projection operator for field {dotted} must be the only key: {}",
                        render(v)
                    )));
                }
                match (first.as_str(), sub.get(first)) {
                    ("$slice", Some(arg)) => {
                        let leaf = parse_slice(&dotted, arg)?;
                        insert_leaf(&mut st.root, &full, leaf)?;
                    }
                    ("$elemMatch", Some(arg)) => {
                        if full.len() != 1 {
                            return Err(Error::bad_value(format!(
                                "Cannot use $elemMatch projection on a nested field: {dotted}"
                            )));
                        }
                        if !matches!(arg, Bson::Document(_)) {
                            return Err(Error::bad_value(
                                "elemMatch: Invalid argument, object required.",
                            ));
                        }
                        let cond = ElemCond::parse(arg)?;
                        insert_leaf(&mut st.root, &full, Leaf::ElemMatch)?;
                        st.elem_matches.push((dotted, cond));
                    }
                    (op, _) => {
                        return Err(Error::bad_value(format!(
                            "projection operator {op} on field {dotted} is not supported"
                        )))
                    }
                }
            }
            other => {
                return Err(Error::bad_value(format!(
                    "projection value {} for field {dotted} is not supported (use 1/true to \
                     include or 0/false to exclude; expressions are not supported)",
                    render(other)
                )))
            }
        }
    }
    Ok(())
}

fn truthy(v: &Bson) -> bool {
    match v {
        Bson::Boolean(b) => *b,
        Bson::Int32(i) => *i != 0,
        Bson::Int64(i) => *i != 0,
        Bson::Double(f) => *f != 0.0,
        Bson::Decimal128(d) => crate::doc::value::decimal_to_f64(*d) != 0.0,
        _ => false,
    }
}

fn integral(v: &Bson) -> Option<i64> {
    match v {
        Bson::Int32(i) => Some(i64::from(*i)),
        Bson::Int64(i) => Some(*i),
        Bson::Double(f) if f.is_finite() => Some(f.trunc().clamp(-9.0e18, 9.0e18) as i64),
        _ => None,
    }
}

fn parse_slice(field: &str, arg: &Bson) -> Result<Leaf> {
    if let Some(n) = integral(arg) {
        return Ok(Leaf::Slice {
            skip: None,
            limit: n,
        });
    }
    if let Bson::Array(a) = arg {
        if let [skip, limit] = a.as_slice() {
            let (Some(skip), Some(limit)) = (integral(skip), integral(limit)) else {
                return Err(Error::bad_value(format!(
                    "$slice for {field}: skip and limit must be numbers"
                )));
            };
            if limit <= 0 {
                return Err(Error::bad_value(format!(
                    "$slice for {field}: limit must be positive"
                )));
            }
            return Ok(Leaf::Slice {
                skip: Some(skip),
                limit,
            });
        }
    }
    Err(Error::bad_value(format!(
        "$slice for {field} takes a number or an array of two numbers [skip, limit], got {}",
        render(arg)
    )))
}

fn insert_leaf(root: &mut Node, parts: &[String], leaf: Leaf) -> Result<()> {
    let collision = || Error::bad_value(format!("Path collision at {}", parts.join(".")));
    let mut node = root;
    for part in parts {
        if node.leaf.is_some() {
            return Err(collision());
        }
        let pos = match node.children.iter().position(|(k, _)| k == part) {
            Some(p) => p,
            None => {
                node.children.push((part.clone(), Node::default()));
                node.children.len() - 1
            }
        };
        node = &mut node.children[pos].1;
    }
    if node.leaf.is_some() || !node.children.is_empty() {
        return Err(collision());
    }
    node.leaf = Some(leaf);
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

fn apply_leaf(leaf: Leaf, v: &Bson) -> Option<Bson> {
    match leaf {
        Leaf::Include => Some(v.clone()),
        Leaf::Slice { skip, limit } => Some(slice(skip, limit, v)),
        Leaf::Exclude | Leaf::ElemMatch => None,
    }
}

fn include_doc(node: &Node, d: &Document, depth: usize) -> Result<Document> {
    if depth > MAX_DEPTH {
        return Err(Error::NestingTooDeep { limit: MAX_DEPTH });
    }
    let mut out = Document::new();
    for (k, v) in d {
        let Some(child) = node.child(k) else {
            continue;
        };
        if let Some(leaf) = child.leaf {
            if let Some(x) = apply_leaf(leaf, v) {
                out.insert(k.clone(), x);
            }
            continue;
        }
        match v {
            Bson::Document(sub) => {
                out.insert(k.clone(), include_doc(child, sub, depth + 1)?);
            }
            Bson::Array(items) => {
                out.insert(k.clone(), include_array(child, items, depth + 1)?);
            }
            // A scalar where the path continues has nothing to include.
            _ => {}
        }
    }
    Ok(out)
}

fn include_array(node: &Node, items: &[Bson], depth: usize) -> Result<Vec<Bson>> {
    if depth > MAX_DEPTH {
        return Err(Error::NestingTooDeep { limit: MAX_DEPTH });
    }
    let mut out = Vec::new();
    for x in items {
        match x {
            Bson::Document(sub) => out.push(Bson::Document(include_doc(node, sub, depth + 1)?)),
            Bson::Array(inner) => out.push(Bson::Array(include_array(node, inner, depth + 1)?)),
            _ => {}
        }
    }
    Ok(out)
}

fn exclude_doc(node: &Node, d: &Document, depth: usize) -> Result<Document> {
    if depth > MAX_DEPTH {
        return Err(Error::NestingTooDeep { limit: MAX_DEPTH });
    }
    let mut out = Document::new();
    for (k, v) in d {
        let Some(child) = node.child(k) else {
            out.insert(k.clone(), v.clone());
            continue;
        };
        if let Some(leaf) = child.leaf {
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
    if depth > MAX_DEPTH {
        return Err(Error::NestingTooDeep { limit: MAX_DEPTH });
    }
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

#[cfg(test)]
mod tests {
    use super::*;
    use bson::{doc, RawDocumentBuf};
    use proptest::prelude::*;

    fn proj(spec: Document, d: Document) -> Document {
        let p = Projection::parse(&spec).unwrap_or_else(|e| panic!("{spec:?}: {e}"));
        let raw = RawDocumentBuf::try_from(&d).expect("encode");
        p.apply(&raw).expect("apply")
    }

    fn parse_err(spec: Document) -> Error {
        Projection::parse(&spec).expect_err("must be refused")
    }

    fn sample() -> Document {
        doc! {"_id": 1, "a": 1, "b": {"c": 2, "d": 3}, "e": [{"c": 1, "d": 2}, {"d": 4}, 5, [{"c": 9}]]}
    }

    #[test]
    fn empty_is_whole_document() {
        assert_eq!(proj(doc! {}, sample()), sample());
    }

    #[test]
    fn inclusion() {
        assert_eq!(proj(doc! {"a": 1}, sample()), doc! {"_id": 1, "a": 1});
        assert_eq!(
            proj(doc! {"b.c": true, "_id": 0}, sample()),
            doc! {"b": {"c": 2}}
        );
        assert_eq!(
            proj(doc! {"b": {"d": 1}}, sample()),
            doc! {"_id": 1, "b": {"d": 3}}
        );
        // Field order follows the document, not the projection.
        assert_eq!(
            proj(doc! {"b": 1, "a": 2.5}, sample()),
            doc! {"_id": 1, "a": 1, "b": {"c": 2, "d": 3}}
        );
        // Through arrays: documents keep the included fields, scalars are dropped.
        assert_eq!(
            proj(doc! {"e.c": 1, "_id": false}, sample()),
            doc! {"e": [{"c": 1}, {}, [{"c": 9}]]}
        );
        // Missing and scalar-blocked paths.
        assert_eq!(proj(doc! {"zz": 1, "a.x": 1}, sample()), doc! {"_id": 1});
        assert_eq!(proj(doc! {"_id": 1}, sample()), doc! {"_id": 1});
        assert_eq!(proj(doc! {"b.x": 1}, sample()), doc! {"_id": 1, "b": {}});
    }

    #[test]
    fn exclusion() {
        assert_eq!(
            proj(doc! {"a": 0, "b.c": false}, sample()),
            doc! {"_id": 1, "b": {"d": 3}, "e": [{"c": 1, "d": 2}, {"d": 4}, 5, [{"c": 9}]]}
        );
        assert_eq!(
            proj(doc! {"e.d": 0, "_id": 0, "b": 0}, sample()),
            doc! {"a": 1, "e": [{"c": 1}, {}, 5, [{"c": 9}]]}
        );
        assert_eq!(
            proj(doc! {"_id": 0}, doc! {"_id": 1, "x": 2}),
            doc! {"x": 2}
        );
        assert_eq!(
            proj(doc! {"_id": 1, "x": 0}, doc! {"_id": 1, "x": 2, "y": 3}),
            doc! {"_id": 1, "y": 3}
        );
    }

    #[test]
    fn errors() {
        let e = parse_err(doc! {"a": 1, "b": 0});
        assert_eq!(e.code(), 2);
        assert!(e
            .to_string()
            .contains("Cannot do exclusion on field b in inclusion projection"));
        let e = parse_err(doc! {"a": 0, "b": 1});
        assert!(e
            .to_string()
            .contains("Cannot do inclusion on field b in exclusion projection"));
        for spec in [
            doc! {"a": 1, "a.b": 1},
            doc! {"a.b": 0, "a": 0},
            doc! {"a": "x"},
            doc! {"a": null},
            doc! {"a": {}},
            doc! {"a.$": 1},
            doc! {"$a": 1},
            doc! {"a": {"$meta": "textScore"}},
            doc! {"a": {"$add": [1, 2]}},
            doc! {"a": {"$slice": "x"}},
            doc! {"a": {"$slice": [1, 0]}},
            doc! {"a": {"$slice": [1, 2, 3]}},
            doc! {"a.b": {"$elemMatch": {"$gt": 1}}},
            doc! {"a": {"$elemMatch": 1}},
            doc! {"a..b": 1},
            doc! {"": 1},
        ] {
            assert_eq!(parse_err(spec.clone()).code(), 2, "{spec:?}");
        }
    }

    #[test]
    fn slice() {
        let d = doc! {"_id": 1, "a": [1, 2, 3, 4, 5], "b": 7, "n": {"l": [1, 2]}};
        assert_eq!(
            proj(doc! {"a": {"$slice": 2}}, d.clone()),
            doc! {"_id": 1, "a": [1, 2], "b": 7, "n": {"l": [1, 2]}}
        );
        assert_eq!(
            proj(
                doc! {"a": {"$slice": -2}, "_id": 0, "b": 0, "n": 0},
                d.clone()
            ),
            doc! {"a": [4, 5]}
        );
        assert_eq!(
            proj(doc! {"a": {"$slice": [1, 2]}, "b": 1}, d.clone()),
            doc! {"_id": 1, "a": [2, 3], "b": 7}
        );
        assert_eq!(
            proj(doc! {"a": {"$slice": [-2, 5]}, "b": 1}, d.clone()),
            doc! {"_id": 1, "a": [4, 5], "b": 7}
        );
        assert_eq!(
            proj(doc! {"a": {"$slice": [9, 5]}, "b": 1}, d.clone()),
            doc! {"_id": 1, "a": [], "b": 7}
        );
        assert_eq!(
            proj(doc! {"a": {"$slice": -9}, "b": 1}, d.clone()),
            doc! {"_id": 1, "a": [1, 2, 3, 4, 5], "b": 7}
        );
        // A non-array is returned as it is; nested paths work.
        assert_eq!(
            proj(doc! {"b": {"$slice": 1}, "a": 0}, d.clone()),
            doc! {"_id": 1, "b": 7, "n": {"l": [1, 2]}}
        );
        assert_eq!(
            proj(doc! {"n.l": {"$slice": 1}, "_id": 0, "a": 0, "b": 0}, d),
            doc! {"n": {"l": [1]}}
        );
    }

    #[test]
    fn elem_match_scalar_conditions() {
        let d = doc! {"_id": 1, "a": [1, 5, 9], "b": 2};
        assert_eq!(
            proj(doc! {"a": {"$elemMatch": {"$gt": 3}}}, d.clone()),
            doc! {"_id": 1, "b": 2, "a": [5]}
        );
        assert_eq!(
            proj(doc! {"a": {"$elemMatch": {"$gt": 30}}, "b": 1}, d.clone()),
            doc! {"_id": 1, "b": 2}
        );
        assert_eq!(
            proj(doc! {"a": {"$elemMatch": {"$lt": 30}}, "_id": 0, "b": 1}, d),
            doc! {"b": 2, "a": [1]}
        );
    }

    #[test]
    fn deep_input_is_refused_not_overflowed() {
        let mut deep = Bson::Int32(1);
        for _ in 0..150 {
            deep = Bson::Array(vec![deep]);
        }
        let d = doc! {"a": deep};
        let raw = RawDocumentBuf::try_from(&d).expect("encode");
        let p = Projection::parse(&doc! {"a.b": 1}).expect("parse");
        assert!(matches!(p.apply(&raw), Err(Error::NestingTooDeep { .. })));
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(200))]
        /// On flat documents, including a set of fields and excluding its complement
        /// give the same result, and both are sub-documents of the input.
        #[test]
        fn include_and_exclude_complement(
            fields in prop::collection::btree_map("[a-f]", any::<i32>(), 0..6),
            chosen in prop::collection::btree_set("[a-f]", 1..4),
        ) {
            let mut d = doc! {"_id": 0};
            for (k, v) in &fields { d.insert(k.clone(), *v); }
            let mut inc = Document::new();
            let mut exc = Document::new();
            for k in ["a", "b", "c", "d", "e", "f"] {
                if chosen.contains(k) { inc.insert(k, 1); } else { exc.insert(k, 0); }
            }
            let raw = RawDocumentBuf::try_from(&d).expect("encode");
            let a = Projection::parse(&inc).and_then(|p| p.apply(&raw));
            let a = a.map_err(|e| TestCaseError::fail(e.to_string()))?;
            if exc.is_empty() {
                prop_assert_eq!(&a, &d);
            } else {
                let b = Projection::parse(&exc).and_then(|p| p.apply(&raw));
                let b = b.map_err(|e| TestCaseError::fail(e.to_string()))?;
                prop_assert_eq!(&a, &b);
            }
            for (k, v) in &a { prop_assert_eq!(d.get(k), Some(v)); }
        }
    }
}
