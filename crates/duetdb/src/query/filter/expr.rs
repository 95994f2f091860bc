//! `$expr`: an aggregation expression as a query predicate.
//!
//! Owns: the `$expr` node ([`ExprNode`]): its spec as written, the compiled
//! expression (compiled after the rest of the filter parsed, in the scope of
//! the command's `let` variables and `$$NOW`), and the error slot an
//! evaluation error lands in.
//!
//! Invariants: a document matches when the expression is truthy (aggregation
//! truthiness); an evaluation error (a type error in `$add`, ...) makes the
//! document not match *and* is kept (the first one) in the filter's error
//! slot, which the executors read through [`super::Filter::check`] so the
//! whole query fails with MongoDB's code, as MongoDB's does — a filter never
//! panics and never silently drops an error that an executor checks for.
//! `$expr` reads the whole document (`$$ROOT`); under `$elemMatch` it is
//! refused at parse time, as MongoDB refuses it.

use std::sync::Arc;

use bson::raw::RawDocument;
use bson::{Bson, Document};
use parking_lot::Mutex;

use crate::doc::collation::Collator;
use crate::error::{Error, Result};
use crate::query::expr::{truthy_bson, under_collation, Expr, Root, Scope};

/// Where the first evaluation error of a filter's `$expr`s is kept.
pub(super) type ErrorSlot = Arc<Mutex<Option<Error>>>;

#[derive(Debug, Clone)]
pub(super) struct ExprNode {
    pub(super) spec: Bson,
    pub(super) expr: Option<Expr>,
    pub(super) error: ErrorSlot,
    /// The filter's collation, in scope while the expression runs.
    pub(super) coll: Option<Arc<Collator>>,
}

impl ExprNode {
    pub(super) fn new(spec: &Bson) -> ExprNode {
        ExprNode {
            spec: spec.clone(),
            expr: None,
            error: Arc::new(Mutex::new(None)),
            coll: None,
        }
    }

    /// Compile the expression in `scope`.
    pub(super) fn compile(&mut self, scope: &mut Scope) -> Result<()> {
        self.expr = Some(Expr::parse_in(&self.spec, scope)?);
        Ok(())
    }

    pub(super) fn matches(&self, doc: &RawDocument) -> bool {
        let Some(e) = &self.expr else {
            return false;
        };
        match under_collation(self.coll.as_ref(), || e.eval(&Root::Raw(doc))) {
            Ok(v) => v.as_ref().is_some_and(truthy_bson),
            Err(err) => {
                let mut slot = self.error.lock();
                if slot.is_none() {
                    *slot = Some(err);
                }
                false
            }
        }
    }
}

/// `spec` with `vars` bound around every `$expr` of it (through `$and`,
/// `$or`, `$nor`, where `$expr` may appear).
pub(super) fn bind_let(spec: &Document, vars: &Document) -> Document {
    let mut out = Document::new();
    for (k, v) in spec {
        let v = match (k.as_str(), v) {
            ("$expr", e) => {
                Bson::Document(bson::doc! {"$let": {"vars": vars.clone(), "in": e.clone()}})
            }
            ("$and" | "$or" | "$nor", Bson::Array(items)) => Bson::Array(
                items
                    .iter()
                    .map(|i| match i {
                        Bson::Document(d) => Bson::Document(bind_let(d, vars)),
                        other => other.clone(),
                    })
                    .collect(),
            ),
            _ => v.clone(),
        };
        out.insert(k.clone(), v);
    }
    out
}
