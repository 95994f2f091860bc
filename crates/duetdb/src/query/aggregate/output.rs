//! `$out` and `$merge`: the specs, and what `$merge` writes for one output
//! document ([`merged_version`]). Writing is the API's (`api::aggregate`):
//! all of a pipeline's writes are one writer command, published at once.
//!
//! Owns: [`Output`], [`MergeSpec`] with [`WhenMatched`]/[`WhenNotMatched`]
//! (MongoDB's codes: 16990, 51182, 40414, 40415, 51183, 51132, 13113, 66,
//! 11000), finding the target document a `$merge` output matches
//! ([`MergeSpec::target_of`]) and checking that its `on` fields have a unique
//! index ([`MergeSpec::check_on_index`]).
//!
//! Invariants: [`merged_version`] is a pure function of the existing target
//! document and the output document (plus the `let`/pipeline of
//! `whenMatched`); it never changes a matched document's `_id` (66) and
//! never invents a match.

use std::ops::ControlFlow;

use bson::{Bson, Document};

use crate::doc::DocRef;
use crate::error::{Error, Result};
use crate::query::aggregate::{collection_name, ParseCtx, Pipeline, Within};
use crate::query::expr::{type_name, Expr, Root};
use crate::query::filter::Filter;
use crate::query::planner;
use crate::store::collection::CollectionState;
use crate::store::heap::RecordId;

/// The last stage of a pipeline that writes its output.
#[derive(Debug, Clone)]
pub enum Output {
    /// `$out`: replace the target's documents with the output (its indexes
    /// stay).
    Out {
        db: Option<String>,
        coll: String,
    },
    Merge(MergeSpec),
}

/// A parsed `$merge`.
#[derive(Debug, Clone)]
pub struct MergeSpec {
    pub db: Option<String>,
    pub coll: String,
    /// The fields that identify the target document (`["_id"]` by default).
    pub on: Vec<String>,
    pub when_matched: WhenMatched,
    pub when_not_matched: WhenNotMatched,
    /// `let` of a `whenMatched` pipeline (default `{new: "$$ROOT"}`).
    let_vars: Vec<(String, Expr)>,
    ctx: ParseCtx,
}

#[derive(Debug, Clone)]
pub enum WhenMatched {
    Replace,
    KeepExisting,
    Merge,
    Fail,
    /// An update pipeline run on the matched document.
    Pipeline(Vec<Document>),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WhenNotMatched {
    Insert,
    Discard,
    Fail,
}

/// `{db, coll}` or a plain collection name.
fn target(stage: &str, v: &Bson) -> Result<(Option<String>, String)> {
    match v {
        Bson::String(s) => Ok((None, collection_name(stage, s)?)),
        Bson::Document(d) => {
            let mut db = None;
            let mut coll = None;
            for (k, x) in d {
                match (k.as_str(), x) {
                    ("db", Bson::String(s)) => db = Some(s.clone()),
                    ("coll", Bson::String(s)) => coll = Some(collection_name(stage, s)?),
                    ("db" | "coll", other) => {
                        return Err(coded!(
                            14,
                            format!(
                                "BSON field '{stage}.{k}' is the wrong type '{}', expected type 'string'",
                                type_name(&Some(other.clone()))
                            ),
                        ))
                    }
                    (other, _) => {
                        return Err(coded!(
                            40415,
                            format!("BSON field '{stage}.{other}' is an unknown field."),
                        ))
                    }
                }
            }
            let coll = coll.ok_or_else(|| {
                coded!(
                    40414,
                    format!("BSON field '{stage}.coll' is missing but a required field"),
                )
            })?;
            Ok((db, coll))
        }
        other => Err(coded!(
            14,
            format!(
                "{stage} target must be a string or an object, not {}",
                type_name(&Some(other.clone()))
            ),
        )),
    }
}

impl Output {
    pub fn stage_name(&self) -> &'static str {
        match self {
            Output::Out { .. } => "$out",
            Output::Merge(_) => "$merge",
        }
    }

    /// The target's database (`None`: the pipeline's own) and collection.
    pub fn target(&self) -> (Option<&str>, &str) {
        match self {
            Output::Out { db, coll } => (db.as_deref(), coll),
            Output::Merge(m) => (m.db.as_deref(), &m.coll),
        }
    }

    pub(super) fn parse_out(arg: &Bson) -> Result<Output> {
        match arg {
            Bson::String(_) | Bson::Document(_) => {
                if let Bson::Document(d) = arg {
                    if d.contains_key("timeseries") {
                        return Err(Error::Coded {
                            code: 115,
                            name: "CommandNotSupported",
                            msg: "$out to a time-series collection is not supported by duetdb"
                                .into(),
                        });
                    }
                }
                let (db, coll) = target("$out", arg)?;
                Ok(Output::Out { db, coll })
            }
            other => Err(coded!(
                16990,
                format!(
                    "$out only supports a string or object argument, not {}",
                    type_name(&Some(other.clone()))
                ),
            )),
        }
    }

    pub(super) fn parse_merge(arg: &Bson, ctx: &ParseCtx) -> Result<Output> {
        let mut spec = MergeSpec {
            db: None,
            coll: String::new(),
            on: vec!["_id".into()],
            when_matched: WhenMatched::Merge,
            when_not_matched: WhenNotMatched::Insert,
            let_vars: Vec::new(),
            ctx: ctx.nested(Within::MergeUpdate)?,
        };
        let d = match arg {
            Bson::String(s) => {
                spec.coll = collection_name("$merge", s)?;
                return Ok(Output::Merge(spec));
            }
            Bson::Document(d) => d,
            other => {
                return Err(coded!(
                    51182,
                    format!(
                        "$merge only supports a string or object argument, not {}",
                        type_name(&Some(other.clone()))
                    ),
                ))
            }
        };
        let mut into = None;
        let mut let_doc = None;
        for (k, v) in d {
            match k.as_str() {
                "into" => into = Some(target("$merge", v)?),
                "on" => spec.on = parse_on(v)?,
                "let" => match v {
                    Bson::Document(l) => let_doc = Some(l),
                    other => {
                        return Err(coded!(
                            14,
                            format!(
                                "BSON field '$merge.let' is the wrong type '{}', expected type 'object'",
                                type_name(&Some(other.clone()))
                            ),
                        ))
                    }
                },
                "whenMatched" => {
                    spec.when_matched = match v {
                        Bson::String(s) => match s.as_str() {
                            "replace" => WhenMatched::Replace,
                            "keepExisting" => WhenMatched::KeepExisting,
                            "merge" => WhenMatched::Merge,
                            "fail" => WhenMatched::Fail,
                            other => {
                                return Err(Error::bad_value(format!(
                                    "Enumeration value '{other}' for field 'whenMatched' is not a valid value."
                                )))
                            }
                        },
                        Bson::Array(items) => {
                            let mut raw = Vec::with_capacity(items.len());
                            for i in items {
                                match i {
                                    Bson::Document(s) => raw.push(s.clone()),
                                    other => {
                                        return Err(coded!(
                                            14,
                                            format!(
                                                "each stage of the whenMatched pipeline must be an object, found {}",
                                                type_name(&Some(other.clone()))
                                            ),
                                        ))
                                    }
                                }
                            }
                            WhenMatched::Pipeline(raw)
                        }
                        other => {
                            return Err(coded!(
                                14,
                                format!(
                                    "BSON field '$merge.whenMatched' is the wrong type '{}', expected types '[string, array]'",
                                    type_name(&Some(other.clone()))
                                ),
                            ))
                        }
                    }
                }
                "whenNotMatched" => {
                    spec.when_not_matched = match v {
                        Bson::String(s) => match s.as_str() {
                            "insert" => WhenNotMatched::Insert,
                            "discard" => WhenNotMatched::Discard,
                            "fail" => WhenNotMatched::Fail,
                            other => {
                                return Err(Error::bad_value(format!(
                                    "Enumeration value '{other}' for field 'whenNotMatched' is not a valid value."
                                )))
                            }
                        },
                        other => {
                            return Err(coded!(
                                14,
                                format!(
                                    "BSON field '$merge.whenNotMatched' is the wrong type '{}', expected type 'string'",
                                    type_name(&Some(other.clone()))
                                ),
                            ))
                        }
                    }
                }
                other => {
                    return Err(coded!(
                        40415,
                        format!("BSON field '$merge.{other}' is an unknown field."),
                    ))
                }
            }
        }
        let (db, coll) = into.ok_or_else(|| {
            coded!(
                40414,
                "BSON field '$merge.into' is missing but a required field",
            )
        })?;
        spec.db = db;
        spec.coll = coll;
        match (&spec.when_matched, let_doc) {
            (WhenMatched::Pipeline(raw), l) => {
                let default = bson::doc! {"new": "$$ROOT"};
                let l = l.unwrap_or(&default);
                for (name, v) in l {
                    spec.let_vars.push((name.clone(), ctx.expr(v)?));
                }
                // Validate the pipeline once, the variables bound to missing.
                let names = spec
                    .let_vars
                    .iter()
                    .map(|(n, _)| (n.clone(), None))
                    .collect();
                Pipeline::parse_in(raw, &spec.ctx.with_vars(names)?)?;
            }
            (_, Some(_)) => {
                return Err(coded!(
                    51199,
                    "Cannot use 'let' variables with 'whenMatched' mode other than a pipeline",
                ))
            }
            (_, None) => {}
        }
        Ok(Output::Merge(spec))
    }
}

/// `on`: one field or a non-empty array of distinct fields.
fn parse_on(v: &Bson) -> Result<Vec<String>> {
    let fields: Vec<String> = match v {
        Bson::String(s) => vec![s.clone()],
        Bson::Array(items) if !items.is_empty() => items
            .iter()
            .map(|i| match i {
                Bson::String(s) => Ok(s.clone()),
                _ => Err(coded!(
                    51134,
                    "Array elements of the 'on' field must be strings",
                )),
            })
            .collect::<Result<_>>()?,
        Bson::Array(_) => {
            return Err(coded!(
                51187,
                "If explicitly specifying $merge 'on', must include at least one field",
            ))
        }
        _ => {
            return Err(coded!(
                51186,
                "$merge 'on' field must be either a string or an array of strings",
            ))
        }
    };
    for f in &fields {
        crate::query::expr::parse_field_path(f)?;
    }
    let mut sorted = fields.clone();
    sorted.sort();
    sorted.dedup();
    if sorted.len() != fields.len() {
        return Err(coded!(31465, "Found a duplicate field in the 'on' list"));
    }
    Ok(fields)
}

impl MergeSpec {
    fn on_is_id(&self) -> bool {
        self.on.len() == 1 && self.on[0] == "_id"
    }

    /// `on` other than `_id` needs a unique index on exactly those fields
    /// (51183), so that an output document matches at most one target.
    pub fn check_on_index(&self, target: Option<&CollectionState>) -> Result<()> {
        if self.on_is_id() {
            return Ok(());
        }
        let mut want: Vec<&str> = self.on.iter().map(String::as_str).collect();
        want.sort_unstable();
        let found = target.is_some_and(|c| {
            c.indexes.iter().any(|ix| {
                let spec = &ix.spec;
                let mut have: Vec<&str> = spec.fields.iter().map(|(p, _)| p.as_str()).collect();
                have.sort_unstable();
                spec.unique && spec.partial.is_none() && have == want
            })
        });
        if found {
            Ok(())
        } else {
            Err(coded!(
                51183,
                "Cannot find index to verify that join fields will be unique",
            ))
        }
    }

    /// The values of `on` in an output document (51132 when one is missing,
    /// null, undefined or an array).
    pub fn on_values(&self, new: &Document) -> Result<Vec<(String, Bson)>> {
        let mut out = Vec::with_capacity(self.on.len());
        for f in &self.on {
            let path = crate::query::expr::parse_field_path(f)?;
            let v = Root::Doc(new).get(&path)?;
            match v {
                None | Some(Bson::Null) | Some(Bson::Undefined) | Some(Bson::Array(_)) => {
                    return Err(coded!(
                        51132,
                        format!(
                            "$merge write error: 'on' field '{f}' cannot be missing, null, undefined or an array"
                        ),
                    ))
                }
                Some(v) => out.push((f.clone(), v)),
            }
        }
        Ok(out)
    }

    /// The target document whose `on` fields equal `values`, if any.
    pub fn target_of(
        &self,
        c: &CollectionState,
        values: &[(String, Bson)],
    ) -> Result<Option<(RecordId, DocRef)>> {
        let mut spec = Document::new();
        for (f, v) in values {
            spec.insert(f.clone(), bson::doc! {"$eq": v.clone()});
        }
        let filter = Filter::parse(&spec)?;
        let plan = planner::plan(c, &filter, None, None)?;
        let mut found = None;
        planner::execute(c, &plan, &filter, |rid, d| {
            found = Some((rid, d.clone()));
            ControlFlow::Break(())
        })?;
        Ok(found)
    }
}

/// What `$merge` writes for output document `new` given the target document
/// it matched (`None`: none): the new version, or `None` to leave the target
/// as it is. Errors are MongoDB's: `whenMatched: fail` 11000-like
/// DuplicateKey, `whenNotMatched: fail` 13113, a changed `_id` 66.
pub fn merged_version(
    spec: &MergeSpec,
    ns: &str,
    existing: Option<&Document>,
    new: Document,
) -> Result<Option<Document>> {
    let Some(old) = existing else {
        return match spec.when_not_matched {
            WhenNotMatched::Insert => Ok(Some(new)),
            WhenNotMatched::Discard => Ok(None),
            WhenNotMatched::Fail => Err(coded!(
                13113,
                "$merge could not find a matching document in the target collection for at least one document in the source collection",
            )),
        };
    };
    let old_id = old.get("_id").cloned().unwrap_or(Bson::Null);
    let keep_id = |mut d: Document| -> Result<Document> {
        match d.get("_id") {
            Some(id) if crate::query::expr::compare(id, &old_id) != std::cmp::Ordering::Equal => {
                Err(Error::ImmutableField(format!(
                    "$merge failed to update the matching document, did you attempt to modify the _id or the shard key? :: caused by :: Performing an update on the path '_id' would modify the immutable field '_id' (collection {ns})"
                )))
            }
            Some(_) => Ok(d),
            None => {
                let mut out = Document::new();
                out.insert("_id", old_id.clone());
                out.extend(std::mem::take(&mut d));
                Ok(out)
            }
        }
    };
    match &spec.when_matched {
        WhenMatched::KeepExisting => Ok(None),
        WhenMatched::Fail => Err(Error::DuplicateKey(Box::new(crate::error::DuplicateKey {
            ns: ns.to_string(),
            index: "_id_".into(),
            key_pattern: bson::doc! {"_id": 1},
            key_value: bson::doc! {"_id": old_id.clone()},
            key: format!(
                "{{ _id: {} }} ($merge with whenMatched: 'fail' found an existing document with the same values for the 'on' field)",
                crate::error::render(&old_id)
            ),
        }))),
        WhenMatched::Replace => keep_id(new).map(Some),
        WhenMatched::Merge => {
            let new = keep_id(new)?;
            let mut out = old.clone();
            for (k, v) in new {
                out.insert(k, v);
            }
            Ok(Some(out))
        }
        WhenMatched::Pipeline(raw) => {
            let mut values = Vec::with_capacity(spec.let_vars.len());
            for (name, e) in &spec.let_vars {
                values.push((name.clone(), e.eval(&Root::Doc(&new))?));
            }
            let p = Pipeline::parse_in(raw, &spec.ctx.with_vars(values)?)?;
            let mut docs = p.run_on(vec![old.clone()])?;
            let out = docs
                .pop()
                .ok_or_else(|| Error::Internal("$merge pipeline returned no document".into()))?;
            keep_id(out).map(Some)
        }
    }
}
