//! Pipeline-style updates (`u: [{$set: …}, {$unset: …}, …]`): the stages
//! MongoDB allows in an update, evaluated on the one document with the
//! aggregation expressions of `query::expr`; the result replaces the
//! document (its `_id` kept when the pipeline dropped it, a changed `_id`
//! refused with 66, as for a replacement).
//!
//! `$addFields`/`$set`, `$project` and `$unset` are the aggregation
//! pipeline's own stages (`query::aggregate`, one implementation);
//! `$replaceRoot`/`$replaceWith` are evaluated here.
//!
//! Invariants:
//! - a stage MongoDB does not allow in an update is 72 (InvalidOptions)
//!   "<stage> is not allowed to be used within an update"; an unknown stage
//!   name is 40324; a stage document without exactly one field is 40323;
//! - variables (`let` of the command, `c` of the statement) reach every
//!   expression: each one is wrapped in a `$let` binding them, so they are
//!   checked and scoped by the expression parser like any `$let`;
//! - a new root that is not a document is 40228, as MongoDB's.

use bson::{Bson, Document};

use crate::error::{render_shell, Error, Result};
use crate::query::aggregate::Pipeline;
use crate::query::expr::{Expr, Root};

/// Stages allowed in an update pipeline.
const ALLOWED: &[&str] = &[
    "$addFields",
    "$set",
    "$project",
    "$unset",
    "$replaceRoot",
    "$replaceWith",
];

/// Every other stage name MongoDB 7.0 knows (refused with 72, not 40324).
const OTHER_STAGES: &[&str] = &[
    "$match",
    "$group",
    "$sort",
    "$limit",
    "$skip",
    "$count",
    "$unwind",
    "$lookup",
    "$graphLookup",
    "$facet",
    "$bucket",
    "$bucketAuto",
    "$sortByCount",
    "$sample",
    "$out",
    "$merge",
    "$geoNear",
    "$redact",
    "$collStats",
    "$indexStats",
    "$densify",
    "$fill",
    "$setWindowFields",
    "$unionWith",
    "$documents",
    "$currentOp",
    "$listSessions",
    "$listLocalSessions",
    "$planCacheStats",
    "$changeStream",
    "$search",
    "$searchMeta",
];

#[derive(Debug, Clone)]
pub(super) struct UpdatePipeline {
    stages: Vec<Step>,
}

#[derive(Debug, Clone)]
enum Step {
    /// One `$addFields`/`$set`/`$project`/`$unset` stage.
    Stage(Pipeline),
    /// `$replaceRoot: {newRoot: E}` or `$replaceWith: E`.
    ReplaceRoot(Expr),
}

impl UpdatePipeline {
    pub(super) fn parse(stages: &[Bson], let_vars: Option<&Document>) -> Result<UpdatePipeline> {
        if stages.len() > crate::query::aggregate::MAX_PIPELINE_STAGES {
            return Err(Error::bad_value(format!(
                "Pipeline length must be no longer than {} stages",
                crate::query::aggregate::MAX_PIPELINE_STAGES
            )));
        }
        if let Some(vars) = let_vars {
            // Names and values checked once, as for a command's `let`.
            crate::query::expr::Scope::with_let(Some(vars))?;
        }
        let mut out = Vec::with_capacity(stages.len());
        for stage in stages {
            let Bson::Document(stage) = stage else {
                return Err(Error::type_mismatch(
                    "Each element of the 'pipeline' array must be an object",
                ));
            };
            let mut fields = stage.iter();
            let (Some((name, arg)), None) = (fields.next(), fields.next()) else {
                return Err(Error::Coded {
                    code: 40323,
                    name: "Location40323",
                    msg: "A pipeline stage specification object must contain exactly one field."
                        .into(),
                });
            };
            if !ALLOWED.contains(&name.as_str()) {
                if OTHER_STAGES.contains(&name.as_str()) {
                    return Err(Error::Coded {
                        code: 72,
                        name: "InvalidOptions",
                        msg: format!("{name} is not allowed to be used within an update"),
                    });
                }
                return Err(Error::Coded {
                    code: 40324,
                    name: "Location40324",
                    msg: format!("Unrecognized pipeline stage name: '{name}'"),
                });
            }
            let arg = match let_vars {
                Some(vars) => bind_vars(name, arg, vars),
                None => arg.clone(),
            };
            out.push(match name.as_str() {
                "$replaceWith" => Step::ReplaceRoot(Expr::parse(&arg)?),
                "$replaceRoot" => Step::ReplaceRoot(parse_replace_root(&arg)?),
                _ => {
                    let mut one = Document::new();
                    one.insert(name.clone(), arg);
                    Step::Stage(Pipeline::parse(std::slice::from_ref(&one))?)
                }
            });
        }
        Ok(UpdatePipeline { stages: out })
    }

    /// The document the pipeline makes of `doc` (before `_id` is restored).
    pub(super) fn run(&self, doc: &Document) -> Result<Document> {
        let mut cur = doc.clone();
        for step in &self.stages {
            cur = match step {
                Step::Stage(p) => {
                    let mut out = p.run_on(vec![cur])?;
                    match (out.pop(), out.is_empty()) {
                        (Some(d), true) => d,
                        _ => {
                            return Err(Error::Internal(
                                "an update pipeline stage did not give one document".into(),
                            ))
                        }
                    }
                }
                Step::ReplaceRoot(e) => match e.eval(&Root::Doc(&cur))? {
                    Some(Bson::Document(d)) => d,
                    other => {
                        let shown = other.as_ref().map(render_shell).unwrap_or("missing".into());
                        let ty = crate::query::expr::type_name(&other);
                        return Err(Error::Coded {
                            code: 40228,
                            name: "Location40228",
                            msg: format!(
                                "'newRoot' expression must evaluate to an object, but resulting \
                                 value was: {shown}. Type of resulting value: '{ty}'. Input \
                                 document: {}",
                                crate::error::render_shell_doc(&cur)
                            ),
                        });
                    }
                },
            };
        }
        Ok(cur)
    }
}

/// `$replaceRoot`'s argument: `{newRoot: <expression>}` and nothing else.
fn parse_replace_root(arg: &Bson) -> Result<Expr> {
    let Bson::Document(d) = arg else {
        return Err(Error::Coded {
            code: 40229,
            name: "Location40229",
            msg: format!(
                "expected an object as specification for $replaceRoot stage, got {}",
                crate::doc::types::type_name(arg)
            ),
        });
    };
    let mut root = None;
    for (k, v) in d {
        if k == "newRoot" {
            root = Some(v);
        } else {
            return Err(Error::Coded {
                code: 40415,
                name: "Location40415",
                msg: format!("BSON field '$replaceRoot.{k}' is an unknown field."),
            });
        }
    }
    let Some(root) = root else {
        return Err(Error::Coded {
            code: 40414,
            name: "Location40414",
            msg: "BSON field '$replaceRoot.newRoot' is missing but a required field".into(),
        });
    };
    Expr::parse(root)
}

/// `arg` of stage `name` with each expression wrapped in
/// `{$let: {vars, in: <expression>}}`.
fn bind_vars(name: &str, arg: &Bson, vars: &Document) -> Bson {
    let wrap =
        |e: &Bson| Bson::Document(bson::doc! {"$let": {"vars": vars.clone(), "in": e.clone()}});
    match (name, arg) {
        ("$replaceWith", e) => wrap(e),
        ("$replaceRoot", Bson::Document(d)) => Bson::Document(
            d.iter()
                .map(|(k, v)| {
                    let v = if k == "newRoot" { wrap(v) } else { v.clone() };
                    (k.clone(), v)
                })
                .collect(),
        ),
        ("$addFields" | "$set", Bson::Document(d)) => {
            Bson::Document(d.iter().map(|(k, v)| (k.clone(), wrap(v))).collect())
        }
        ("$project", Bson::Document(d)) => Bson::Document(bind_project(d, vars, 0)),
        _ => arg.clone(),
    }
}

/// A `$project` spec with its computed fields wrapped (inclusions and
/// exclusions — numbers and booleans — and nested projections kept).
fn bind_project(d: &Document, vars: &Document, depth: usize) -> Document {
    d.iter()
        .map(|(k, v)| {
            let v = match v {
                Bson::Int32(_)
                | Bson::Int64(_)
                | Bson::Double(_)
                | Bson::Decimal128(_)
                | Bson::Boolean(_) => v.clone(),
                Bson::Document(sub)
                    if depth < crate::doc::MAX_DEPTH
                        && !sub.keys().next().is_some_and(|f| f.starts_with('$')) =>
                {
                    Bson::Document(bind_project(sub, vars, depth + 1))
                }
                e => Bson::Document(bson::doc! {"$let": {"vars": vars.clone(), "in": e.clone()}}),
            };
            (k.clone(), v)
        })
        .collect()
}
