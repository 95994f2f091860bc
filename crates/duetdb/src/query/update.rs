//! PLACEHOLDER: replaced by the update implementation (MongoDB update operators).

use bson::{DateTime, Document};

use crate::error::Result;

/// Inputs of one update application besides the document.
#[derive(Debug, Clone, Copy)]
pub struct ApplyContext {
    /// True when the update produces a new document through upsert (enables `$setOnInsert`).
    pub is_upsert_insert: bool,
    /// The time `$currentDate` writes.
    pub now: DateTime,
}

/// A parsed update: operators (`{$set: …}`) or a replacement document.
#[derive(Debug, Clone)]
pub struct UpdateSpec {}

impl UpdateSpec {
    /// Parse an update document.
    pub fn parse(_spec: &Document) -> Result<UpdateSpec> {
        Ok(UpdateSpec {})
    }

    /// A replacement document (no operators)?
    pub fn is_replacement(&self) -> bool {
        false
    }

    /// The new version of `doc`.
    pub fn apply(&self, doc: &Document, _ctx: &ApplyContext) -> Result<Document> {
        Ok(doc.clone())
    }
}

/// The document an upsert starts from: the equality fields of `filter`.
pub fn upsert_seed(_filter: &Document) -> Result<Document> {
    Ok(Document::new())
}
