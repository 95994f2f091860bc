//! The query language: filters, updates, projections and sort specifications,
//! parsed once from BSON into typed forms and then evaluated on raw documents.

pub mod filter;
pub mod projection;
pub mod sort;
pub mod update;

pub use filter::{Filter, Sarg};
pub use projection::Projection;
pub use sort::SortSpec;
pub use update::{ApplyContext, UpdateSpec};
