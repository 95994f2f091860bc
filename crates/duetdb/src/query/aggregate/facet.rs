//! `$facet`: several sub-pipelines over the same input, one output document
//! holding each sub-pipeline's results as an array.
//!
//! Owns: [`Facet`] (parsed, MongoDB's codes 40169–40171 and 40600) and
//! [`FacetRun`] (one nested [`Exec`] per facet, fed every input row).
//!
//! Invariants: each facet sees every input document in input order, exactly
//! as a pipeline of its own would; the facets' outputs together are bounded
//! by the read's memory limit (MongoDB's 100 MB
//! `internalQueryFacetMaxOutputDocSizeBytes`, error 4031700), counted as
//! they are produced, not once they are complete; a facet whose `$limit` is
//! reached stops receiving rows, and once all have, the input stops too.

use std::ops::ControlFlow;
use std::sync::atomic::AtomicUsize;
use std::sync::Arc;

use bson::{Bson, Document};

use crate::error::Result;
use crate::query::aggregate::exec::{Exec, Row};
use crate::query::aggregate::{ParseCtx, Pipeline, Runtime, Within};
use crate::query::expr::type_name;

#[derive(Debug, Clone)]
pub(super) struct Facet {
    facets: Vec<(String, Pipeline)>,
}

impl Facet {
    pub(super) fn parse(arg: &Bson, ctx: &ParseCtx) -> Result<Facet> {
        let spec = match arg {
            Bson::Document(d) if !d.is_empty() => d,
            other => {
                return Err(coded!(
                    40169,
                    format!(
                        "the $facet specification must be a non-empty object, but found: {}",
                        crate::error::render(other)
                    ),
                ))
            }
        };
        let sub_ctx = ctx.nested(Within::Facet)?;
        let mut facets = Vec::with_capacity(spec.len());
        for (name, v) in spec {
            check_facet_name(name)?;
            let Bson::Array(items) = v else {
                return Err(coded!(
                    40170,
                    format!(
                        "arguments to $facet must be arrays, {name} is type {}",
                        type_name(&Some(v.clone()))
                    ),
                ));
            };
            let mut raw = Vec::with_capacity(items.len());
            for item in items {
                match item {
                    Bson::Document(d) => raw.push(d.clone()),
                    other => {
                        return Err(coded!(
                            40171,
                            format!(
                                "elements of arrays in $facet spec must be non-empty objects, {name} argument contained an element of type {}: {}",
                                type_name(&Some(other.clone())),
                                crate::error::render(other)
                            ),
                        ))
                    }
                }
            }
            facets.push((name.clone(), Pipeline::parse_in(&raw, &sub_ctx)?));
        }
        Ok(Facet { facets })
    }

    pub(super) fn foreign_names(&self, out: &mut Vec<String>) {
        for (_, p) in &self.facets {
            out.extend(p.foreign_names());
        }
    }

    /// Does any facet depend on the order its input arrives in?
    pub(super) fn is_order_sensitive(&self) -> bool {
        self.facets.iter().any(|(_, p)| p.is_order_sensitive())
    }
}

/// MongoDB's field name rules for a facet's name (`FieldPath::validateFieldName`).
fn check_facet_name(name: &str) -> Result<()> {
    let why = |msg: &str| {
        format!(
            "$facet pipeline names must follow the naming rules of field path expressions. :: caused by :: {msg}"
        )
    };
    if name.is_empty() {
        Err(coded!(
            15998,
            why("FieldPath field names may not be empty strings.")
        ))
    } else if name.starts_with('$') {
        Err(coded!(
            16410,
            why("FieldPath field names may not start with '$'.")
        ))
    } else if name.contains('.') {
        Err(coded!(
            16412,
            why("FieldPath field names may not contain '.'.")
        ))
    } else {
        Ok(())
    }
}

/// A `$facet` being executed.
pub(super) struct FacetRun<'p> {
    subs: Vec<(&'p str, Exec<'p>)>,
}

impl<'p> FacetRun<'p> {
    pub(super) fn new(facet: &'p Facet, rt: &'p Runtime<'p>) -> FacetRun<'p> {
        let used = Arc::new(AtomicUsize::new(0));
        let subs = facet
            .facets
            .iter()
            .map(|(name, p)| {
                let mut exec = Exec::new(&p.stages, None, &[], rt);
                exec.limit_output(used.clone(), rt.limits.memory_limit_bytes);
                (name.as_str(), exec)
            })
            .collect();
        FacetRun { subs }
    }

    /// Feed `row` to every facet still open; `Break` once none is.
    pub(super) fn push(&mut self, row: Row) -> Result<ControlFlow<()>> {
        let mut open = false;
        for (_, exec) in &mut self.subs {
            if !exec.is_stopped() && exec.push_row(row.duplicate())?.is_continue() {
                open = true;
            }
        }
        Ok(if open {
            ControlFlow::Continue(())
        } else {
            ControlFlow::Break(())
        })
    }

    /// The output document: each facet's results under its name.
    pub(super) fn finish(self) -> Result<Document> {
        let mut out = Document::new();
        for (name, exec) in self.subs {
            let docs = exec.finish()?;
            out.insert(
                name,
                Bson::Array(docs.into_iter().map(Bson::Document).collect()),
            );
        }
        Ok(out)
    }
}
