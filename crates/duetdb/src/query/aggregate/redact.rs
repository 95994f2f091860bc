//! `$redact`: restricts each document's content by an expression evaluated
//! at every level of it, as MongoDB's `DocumentSourceRedact` does.
//!
//! The expression must answer `$$DESCEND`, `$$PRUNE` or `$$KEEP` (the
//! strings `"descend"`, `"prune"`, `"keep"`; anything else is 17053). At
//! the top level `$$KEEP` passes the document as it is, `$$PRUNE` drops
//! it, `$$DESCEND` keeps its fields and evaluates the expression again on
//! every embedded document (and every document inside arrays, arrays of
//! arrays included), dropping those it prunes. While an embedded document
//! is evaluated, `$$CURRENT` — so every field path — is that document;
//! `$$ROOT` stays the whole input document.
//!
//! Invariants: values that are neither documents nor arrays are kept as
//! they are; the output never holds a field the input did not; nesting is
//! bounded by the input's own (a stored document's depth is bounded).

use bson::{Bson, Document};

use crate::error::{Error, Result};
use crate::query::aggregate::ParseCtx;
use crate::query::expr::{Expr, Root};

/// A parsed `$redact` stage.
#[derive(Debug, Clone)]
pub struct Redact {
    expr: Expr,
    /// The variable `CURRENT` is bound to while the expression runs.
    current: u32,
}

/// What the expression decided for one (sub)document.
enum Decision {
    Keep,
    Prune,
    Descend,
}

impl Redact {
    pub(super) fn parse(arg: &Bson, ctx: &ParseCtx) -> Result<Redact> {
        let (expr, current) = ctx.scope.parse_redact(arg)?;
        Ok(Redact { expr, current })
    }

    /// The redacted document, or `None` when the top level is pruned.
    pub(super) fn apply(&self, root: &Document) -> Result<Option<Document>> {
        self.object(root, root)
    }

    fn decide(&self, current: &Document, root: &Document) -> Result<Decision> {
        let v = self.expr.eval_bound(
            &Root::Doc(root),
            self.current,
            Some(Bson::Document(current.clone())),
        )?;
        match v.as_ref() {
            Some(Bson::String(s)) if s == "keep" => Ok(Decision::Keep),
            Some(Bson::String(s)) if s == "prune" => Ok(Decision::Prune),
            Some(Bson::String(s)) if s == "descend" => Ok(Decision::Descend),
            other => Err(Error::Coded {
                code: 17053,
                name: "Location17053",
                msg: format!(
                    "$redact's expression should not return anything aside from the variables $$KEEP, $$DESCEND, and $$PRUNE, but returned {}",
                    value_string(other)
                ),
            }),
        }
    }

    fn object(&self, current: &Document, root: &Document) -> Result<Option<Document>> {
        Ok(match self.decide(current, root)? {
            Decision::Keep => Some(current.clone()),
            Decision::Prune => None,
            Decision::Descend => {
                let mut out = Document::new();
                for (k, v) in current {
                    if let Some(v) = self.value(v, root)? {
                        out.insert(k.clone(), v);
                    }
                }
                Some(out)
            }
        })
    }

    fn value(&self, v: &Bson, root: &Document) -> Result<Option<Bson>> {
        Ok(match v {
            Bson::Document(d) => self.object(d, root)?.map(Bson::Document),
            Bson::Array(items) => {
                let mut out = Vec::with_capacity(items.len());
                for item in items {
                    if let Some(kept) = self.value(item, root)? {
                        out.push(kept);
                    }
                }
                Some(Bson::Array(out))
            }
            other => Some(other.clone()),
        })
    }
}

/// A value as MongoDB's `Value::toString` writes it in 17053 (strings
/// quoted, missing as `MISSING`).
fn value_string(v: Option<&Bson>) -> String {
    match v {
        None => "MISSING".to_string(),
        Some(other) => crate::error::render_value(other),
    }
}
