//! Duplicate field names in a command, kept apart before the command becomes
//! a `Document` (which keeps only the last of two equal keys).
//!
//! BSON allows one name twice; MongoDB gives each occurrence its meaning:
//! - in a **filter** every condition applies: `{a: 1, a: {$gt: 1}}` matches
//!   nothing, `{a: {$gt: 1, $gt: 5}}` needs both. A filter whose raw form
//!   repeats a name (at any level) is rewritten into the equivalent `$and`
//!   of its conditions, in their order: `{$and: [{a: 1}, {a: {$gt: 1}}]}`.
//!   Filters: find's `filter`, count, distinct and findAndModify's `query`,
//!   update and delete statements' `q`, an aggregate's `$match` stages,
//!   listDatabases' and listCollections' `filter`;
//! - an **inserted document** is stored as sent: an insert's document whose
//!   raw form repeats a name gets the engine's [`RAW_DOCUMENT_MARK`] holding
//!   its bytes, and the engine stores those bytes (`doc::prepare_insert`);
//!   two top-level `_id`s stay refused (`opmsg::mark_duplicate_ids`);
//! - a `$group` `_id` that repeats a name is refused with MongoDB's 16406,
//!   as every expression object literal is.
//!
//! Invariants: only documents that do repeat a name are touched (the common
//! path decodes as before); the rewriting is bounded by the message's depth
//! limit (every raw document here was depth-checked by the decoder), and
//! never fails: a value it cannot read is left as the `Document` has it.

use std::collections::HashSet;

use bson::raw::{RawArray, RawBsonRef, RawDocument};
use bson::{Bson, Document};
use duetdb::raw::RAW_DOCUMENT_MARK;

use crate::opmsg::MsgError;

/// Apply this module's rules to one decoded document: the command body
/// (`ident: None`) or one document of the kind-1 sequence `ident`.
pub fn keep_duplicates(
    raw: &RawDocument,
    ident: Option<&str>,
    doc: &mut Document,
) -> Result<(), MsgError> {
    match ident {
        Some("documents") => mark_raw(raw, doc),
        Some(ident @ ("updates" | "deletes")) => {
            if statement_repeats(raw) {
                crate::commands::fields::check_raw_statement(ident, raw).map_err(to_msg)?;
            }
            statement_filter(raw, doc)
        }
        Some(_) => {}
        None => body(raw, doc)?,
    }
    Ok(())
}

fn body(raw: &RawDocument, doc: &mut Document) -> Result<(), MsgError> {
    let name = match raw.into_iter().next() {
        Some(Ok((k, _))) => k.to_string(),
        _ => return Ok(()),
    };
    if let Some(canonical) = crate::commands::canonical_name(&name) {
        if strict_levels_repeat(raw) {
            crate::commands::fields::check_raw(canonical, raw).map_err(to_msg)?;
        }
    }
    match name.as_str() {
        "find" | "listDatabases" | "listCollections" => rewrite_field(raw, doc, "filter"),
        "count" | "distinct" | "findAndModify" | "findandmodify" => {
            rewrite_field(raw, doc, "query")
        }
        "insert" => each_in_array(raw, doc, "documents", mark_raw),
        "update" => each_in_array(raw, doc, "updates", statement_filter),
        "delete" => each_in_array(raw, doc, "deletes", statement_filter),
        "aggregate" => pipeline(raw, doc)?,
        _ => {}
    }
    Ok(())
}

/// Does a level the strict field check reads repeat a name: the body, its
/// `cursor` or `writeConcern`, its update or delete statements, or an
/// explained command's?
/// Only then is the check run on the raw form (`fields::check_raw`); the
/// decoded `Document` is checked as usual otherwise.
fn strict_levels_repeat(raw: &RawDocument) -> bool {
    let statements = |field: &str| {
        raw.get_array(field).is_ok_and(|a| {
            a.into_iter()
                .flatten()
                .any(|s| matches!(s, RawBsonRef::Document(d) if statement_repeats(d)))
        })
    };
    let sub_repeats = |field: &str| {
        raw.get_document(field)
            .is_ok_and(|c| first_repeat(c).is_some())
    };
    first_repeat(raw).is_some()
        || sub_repeats("cursor")
        || statements("updates")
        || statements("deletes")
        || sub_repeats("writeConcern")
        || sub_repeats("readConcern")
        || sub_repeats("collation")
        || raw.get_document("explain").is_ok_and(strict_levels_repeat)
}

/// Whether an update or delete statement, or its `collation`, repeats a name.
fn statement_repeats(stmt: &RawDocument) -> bool {
    first_repeat(stmt).is_some()
        || stmt
            .get_document("collation")
            .is_ok_and(|c| first_repeat(c).is_some())
}

fn to_msg(e: crate::error::CommandError) -> MsgError {
    MsgError {
        code: e.code,
        code_name: e.code_name,
        message: e.message,
    }
}

/// Apply `f` to each document of the array `field` and its decoded twin.
fn each_in_array(
    raw: &RawDocument,
    doc: &mut Document,
    field: &str,
    f: fn(&RawDocument, &mut Document),
) {
    let (Ok(items), Ok(out)) = (raw.get_array(field), doc.get_array_mut(field)) else {
        return;
    };
    for (i, el) in items.into_iter().enumerate() {
        if let (Ok(RawBsonRef::Document(d)), Some(Bson::Document(o))) = (el, out.get_mut(i)) {
            f(d, o);
        }
    }
}

/// An inserted document with a repeated name carries its bytes.
fn mark_raw(raw: &RawDocument, doc: &mut Document) {
    if repeats(raw, 0) {
        doc.insert(
            RAW_DOCUMENT_MARK,
            Bson::Binary(bson::Binary {
                subtype: bson::spec::BinarySubtype::Generic,
                bytes: raw.as_bytes().to_vec(),
            }),
        );
    }
}

/// An update or delete statement's `q`.
fn statement_filter(raw: &RawDocument, doc: &mut Document) {
    rewrite_field(raw, doc, "q");
}

/// Rewrite the filter at `field` when its raw form repeats a name.
fn rewrite_field(raw: &RawDocument, doc: &mut Document, field: &str) {
    if let Ok(f) = raw.get_document(field) {
        if repeats(f, 0) {
            doc.insert(field, Bson::Document(filter(f, 0)));
        }
    }
}

/// An aggregate's `$match` stages rewritten; a `$group` `_id` object with a
/// repeated name refused (16406).
fn pipeline(raw: &RawDocument, doc: &mut Document) -> Result<(), MsgError> {
    let (Ok(stages), Ok(out)) = (raw.get_array("pipeline"), doc.get_array_mut("pipeline")) else {
        return Ok(());
    };
    for (i, el) in stages.into_iter().enumerate() {
        let Ok(RawBsonRef::Document(stage)) = el else {
            continue;
        };
        if let Ok(m) = stage.get_document("$match") {
            if repeats(m, 0) {
                if let Some(Bson::Document(o)) = out.get_mut(i) {
                    o.insert("$match", Bson::Document(filter(m, 0)));
                }
            }
        }
        if let Ok(Some(RawBsonRef::Document(id))) = stage
            .get_document("$group")
            .map(|g| g.get("_id").ok().flatten())
        {
            if first_repeat(id).is_some() {
                return Err(MsgError {
                    code: 16406,
                    code_name: "Location16406",
                    message: format!(
                        "duplicate field name specified in object literal: {}",
                        render_raw(id)
                    ),
                });
            }
        }
    }
    Ok(())
}

/// `d` as MongoDB's `BSONObj::toString` prints it, every field kept.
fn render_raw(d: &RawDocument) -> String {
    let fields: Vec<String> = d
        .into_iter()
        .flatten()
        .map(|(k, v)| format!("{k}: {}", duetdb::raw::render_shell(&to_bson(v))))
        .collect();
    if fields.is_empty() {
        "{}".into()
    } else {
        format!("{{ {} }}", fields.join(", "))
    }
}

/// The first name `d` repeats at its top level.
fn first_repeat(d: &RawDocument) -> Option<String> {
    let mut seen = HashSet::new();
    for (k, _) in d.into_iter().flatten() {
        if !seen.insert(k) {
            return Some(k.to_string());
        }
    }
    None
}

/// Does `d`, or a document or array nested in it, repeat a name?
fn repeats(d: &RawDocument, depth: usize) -> bool {
    if depth > duetdb::raw::MAX_DEPTH * 2 {
        return false;
    }
    let mut seen = HashSet::new();
    for (k, v) in d.into_iter().flatten() {
        if !seen.insert(k) {
            return true;
        }
        let nested = match v {
            RawBsonRef::Document(x) => repeats(x, depth + 1),
            RawBsonRef::Array(a) => array_repeats(a, depth + 1),
            _ => false,
        };
        if nested {
            return true;
        }
    }
    false
}

fn array_repeats(a: &RawArray, depth: usize) -> bool {
    a.into_iter().flatten().any(|v| match v {
        RawBsonRef::Document(x) => repeats(x, depth + 1),
        RawBsonRef::Array(x) => array_repeats(x, depth + 1),
        _ => false,
    })
}

/// The filter `f` with every condition kept: a repeated name anywhere
/// becomes an `$and` of the conditions at that level, in order.
fn filter(f: &RawDocument, depth: usize) -> Document {
    let mut entries: Vec<(String, Bson)> = Vec::new();
    for (k, v) in f.into_iter().flatten() {
        let k = k.as_str();
        match (k, v) {
            ("$and" | "$or" | "$nor", RawBsonRef::Array(items)) => {
                let clauses = items
                    .into_iter()
                    .flatten()
                    .map(|c| match c {
                        RawBsonRef::Document(d) => Bson::Document(filter(d, depth + 1)),
                        other => to_bson(other),
                    })
                    .collect();
                entries.push((k.to_string(), Bson::Array(clauses)));
            }
            (field, RawBsonRef::Document(ops))
                if !field.starts_with('$') && is_operator_doc(ops) =>
            {
                for group in operator_groups(ops, depth) {
                    entries.push((field.to_string(), Bson::Document(group)));
                }
            }
            (name, other) => entries.push((name.to_string(), to_bson(other))),
        }
    }
    let mut seen = HashSet::new();
    let unique = entries.iter().all(|(k, _)| seen.insert(k.clone()));
    if unique {
        return entries.into_iter().collect();
    }
    let clauses = entries
        .into_iter()
        .map(|(k, v)| {
            let mut d = Document::new();
            d.insert(k, v);
            Bson::Document(d)
        })
        .collect::<Vec<_>>();
    let mut out = Document::new();
    out.insert("$and", clauses);
    out
}

/// A field's operator document split so that no group repeats an operator:
/// the n-th occurrence of each operator goes to group n (`$regex` and its
/// `$options` stay together unless repeated). `$elemMatch` and `$not`
/// arguments are filters themselves.
fn operator_groups(ops: &RawDocument, depth: usize) -> Vec<Document> {
    let mut groups: Vec<Document> = Vec::new();
    for (op, v) in ops.into_iter().flatten() {
        let op = op.as_str();
        let value = match (op, v) {
            ("$elemMatch", RawBsonRef::Document(d)) => {
                if is_operator_doc(d) {
                    let parts = operator_groups(d, depth + 1);
                    merge_or_and(parts)
                } else {
                    Bson::Document(filter(d, depth + 1))
                }
            }
            ("$not", RawBsonRef::Document(d)) => merge_or_and(operator_groups(d, depth + 1)),
            (_, other) => to_bson(other),
        };
        match groups.iter_mut().find(|g| !g.contains_key(op)) {
            Some(g) => {
                g.insert(op, value);
            }
            None => {
                let mut g = Document::new();
                g.insert(op, value);
                groups.push(g);
            }
        }
    }
    groups
}

/// Operator groups under `$elemMatch`/`$not` as one operator document. One
/// operator document cannot repeat an operator, so a repeated one keeps its
/// last occurrence there (as the `Document` would): a known gap, rare
/// enough (`{$elemMatch: {$gt: 1, $gt: 5}}`) to leave.
fn merge_or_and(groups: Vec<Document>) -> Bson {
    let mut out = Document::new();
    for g in groups {
        out.extend(g);
    }
    Bson::Document(out)
}

/// A document of operators (`{$gt: 1}`): decided by its first key, as the
/// filter parser decides it; a DBRef is a literal.
fn is_operator_doc(d: &RawDocument) -> bool {
    match d.into_iter().next() {
        Some(Ok((k, _))) => k.as_str().starts_with('$') && k.as_str() != "$ref",
        _ => false,
    }
}

fn to_bson(v: RawBsonRef<'_>) -> Bson {
    Bson::try_from(v).unwrap_or(Bson::Null)
}

#[cfg(test)]
mod tests {
    use super::*;
    use bson::raw::{cstr, RawArrayBuf, RawDocumentBuf};
    use bson::{doc, rawdoc};

    fn one(d: RawDocumentBuf) -> RawArrayBuf {
        let mut a = RawArrayBuf::new();
        a.push(d);
        a
    }

    /// Decode `raw` as the OP_MSG decoder does.
    fn decoded(raw: &RawDocumentBuf) -> Result<Document, MsgError> {
        let mut doc = Document::try_from(raw.as_ref()).expect("document");
        keep_duplicates(raw, None, &mut doc)?;
        Ok(doc)
    }

    /// `{a: 1, a: {$gt: 1}}` built with both elements.
    fn twice_a() -> RawDocumentBuf {
        let mut f = RawDocumentBuf::new();
        f.append(cstr!("a"), 1);
        f.append(cstr!("a"), rawdoc! {"$gt": 1});
        f
    }

    #[test]
    fn a_filter_that_repeats_a_name_keeps_every_condition() {
        let mut cmd = rawdoc! {"find": "c"};
        cmd.append(cstr!("filter"), twice_a());
        let d = decoded(&cmd).expect("decode");
        assert_eq!(
            d.get_document("filter").expect("filter"),
            &doc! {"$and": [{"a": 1}, {"a": {"$gt": 1}}]}
        );
        // A repeated operator of one field: one condition per occurrence.
        let mut ops = RawDocumentBuf::new();
        ops.append(cstr!("$gt"), 1);
        ops.append(cstr!("$lt"), 9);
        ops.append(cstr!("$gt"), 5);
        let mut q = RawDocumentBuf::new();
        q.append(cstr!("a"), ops);
        let mut stmt = RawDocumentBuf::new();
        stmt.append(cstr!("q"), q);
        stmt.append(cstr!("limit"), 0);
        let mut cmd = rawdoc! {"delete": "c"};
        cmd.append(cstr!("deletes"), one(stmt));
        let d = decoded(&cmd).expect("decode");
        let stmt = d.get_array("deletes").expect("deletes")[0].clone();
        assert_eq!(
            stmt.as_document().and_then(|s| s.get_document("q").ok()),
            Some(&doc! {"$and": [{"a": {"$gt": 1, "$lt": 9}}, {"a": {"$gt": 5}}]})
        );
        // Nothing repeated: untouched.
        let cmd = rawdoc! {"find": "c", "filter": {"a": 1, "b": {"$gt": 2}}};
        assert_eq!(
            decoded(&cmd).expect("decode"),
            doc! {"find": "c", "filter": {"a": 1, "b": {"$gt": 2}}}
        );
    }

    #[test]
    fn the_filter_matches_as_mongodb_after_the_rewrite() {
        let mut cmd = rawdoc! {"find": "c"};
        cmd.append(cstr!("filter"), twice_a());
        let d = decoded(&cmd).expect("decode");
        let f =
            duetdb::lang::Filter::parse(d.get_document("filter").expect("filter")).expect("parse");
        assert!(!f.matches(&rawdoc! {"a": 2}));
        assert!(!f.matches(&rawdoc! {"a": 1}));
        assert!(f.matches(&rawdoc! {"a": [1, 2]}));
    }

    #[test]
    fn an_inserted_document_that_repeats_a_name_carries_its_bytes() {
        let mut d = RawDocumentBuf::new();
        d.append(cstr!("x"), 1);
        d.append(cstr!("x"), 2);
        let mut cmd = rawdoc! {"insert": "c"};
        cmd.append(cstr!("documents"), one(d.clone()));
        let out = decoded(&cmd).expect("decode");
        let stored = out.get_array("documents").expect("documents")[0].clone();
        let Some(Bson::Binary(b)) = stored.as_document().and_then(|s| s.get(RAW_DOCUMENT_MARK))
        else {
            panic!("no raw mark: {stored:?}");
        };
        assert_eq!(b.bytes, d.as_bytes());
        // The engine stores those bytes, `_id` first, both `x` kept.
        let (raw, _) =
            duetdb::raw::prepare_insert(stored.as_document().expect("doc")).expect("prepare");
        let keys: Vec<String> = raw
            .iter()
            .map(|e| e.expect("element").0.to_string())
            .collect();
        assert_eq!(keys, ["_id", "x", "x"]);
    }

    #[test]
    fn a_group_id_that_repeats_a_name_is_16406() {
        let mut id = RawDocumentBuf::new();
        id.append(cstr!("v"), "$v");
        id.append(cstr!("v"), "$non-existent");
        let mut group = RawDocumentBuf::new();
        group.append(cstr!("_id"), id);
        let mut stage = RawDocumentBuf::new();
        stage.append(cstr!("$group"), group);
        let mut cmd = rawdoc! {"aggregate": "c"};
        cmd.append(cstr!("pipeline"), one(stage));
        cmd.append(cstr!("cursor"), rawdoc! {});
        let e = decoded(&cmd).expect_err("refused");
        assert_eq!(e.code, 16406);
        assert_eq!(
            e.message,
            "duplicate field name specified in object literal: { v: \"$v\", v: \"$non-existent\" }"
        );
    }
}
