//! The query language: filters, updates, projections, sort specifications and
//! aggregation pipelines (expressions, stages), parsed once from BSON into typed forms and then evaluated on raw documents.

pub mod aggregate;
pub mod distinct;
pub mod expr;
pub mod filter;
pub mod geo;
pub mod index_spec;
pub mod limits;
pub mod partial;
pub mod pattern;
pub mod pcre_words;
pub mod planner;
pub mod projection;
pub mod sort;
pub mod sorter;
pub mod spill;
pub mod text;
pub mod update;
pub mod validator;
pub mod walk;

pub use aggregate::{CommutativePart, PartialState, Pipeline, Split};

pub use filter::{Filter, Sarg};
pub use projection::Projection;
pub use sort::SortSpec;
pub use update::{ApplyContext, UpdateSpec};
