//! PLACEHOLDER: replaced by the sort implementation.

use std::cmp::Ordering;

use bson::raw::RawDocument;
use bson::Document;

use crate::error::Result;

/// A parsed sort specification: `(path, ascending)` in priority order.
#[derive(Debug, Clone)]
pub struct SortSpec {
    pub keys: Vec<(String, bool)>,
}

impl SortSpec {
    /// Parse `{a: 1, b: -1}`.
    pub fn parse(_spec: &Document) -> Result<SortSpec> {
        Ok(SortSpec { keys: Vec::new() })
    }

    /// Compare two documents under this sort.
    pub fn compare(&self, _a: &RawDocument, _b: &RawDocument) -> Ordering {
        Ordering::Equal
    }
}
