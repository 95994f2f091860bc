//! PLACEHOLDER: replaced by the projection implementation.

use bson::raw::RawDocument;
use bson::Document;

use crate::error::Result;

/// A parsed projection.
#[derive(Debug, Clone)]
pub struct Projection {}

impl Projection {
    /// Parse a projection document.
    pub fn parse(_spec: &Document) -> Result<Projection> {
        Ok(Projection {})
    }

    /// Apply it to one document.
    pub fn apply(&self, doc: &RawDocument) -> Result<Document> {
        Document::try_from(doc).map_err(|e| crate::Error::InvalidBson(e.to_string()))
    }
}
