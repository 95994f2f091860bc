//! PLACEHOLDER: replaced by the filter implementation (MongoDB query operators).

use bson::raw::RawDocument;
use bson::{Document, RawBson};

use crate::error::Result;

/// A parsed MongoDB filter document.
#[derive(Debug, Clone)]
pub struct Filter {}

/// A predicate on one path that an ordered index can answer (a superset is fine:
/// the executor re-checks every fetched document against the whole filter).
#[derive(Debug, Clone, PartialEq)]
pub enum Sarg {
    /// `{p: v}` / `{p: {$eq: v}}` with `v` neither an array nor a regex.
    Eq(RawBson),
    /// `{p: {$in: [...]}}` whose values are neither arrays nor regexes.
    In(Vec<RawBson>),
    /// `$gt`/`$gte`/`$lt`/`$lte` on one path, merged (values neither arrays nor regexes).
    Range {
        lower: std::ops::Bound<RawBson>,
        upper: std::ops::Bound<RawBson>,
    },
}

impl Filter {
    /// Parse a filter document; unknown operators and malformed arguments are errors.
    pub fn parse(_spec: &Document) -> Result<Filter> {
        Ok(Filter {})
    }

    /// True when the filter matches every document (`{}`).
    pub fn is_match_all(&self) -> bool {
        true
    }

    /// Does `doc` match?
    pub fn matches(&self, _doc: &RawDocument) -> bool {
        true
    }

    /// Index-answerable predicates of the top-level conjunction, per path.
    pub fn sargs(&self) -> Vec<(String, Sarg)> {
        Vec::new()
    }
}
