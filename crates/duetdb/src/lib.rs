//! duetdb: a document database engine in which analytics and updates run side by
//! side. One writer per database applies every mutation in commit order to a
//! copy-on-write state (record heap + indexes) and publishes a new root per
//! batch; any reader that takes the published root holds a consistent snapshot.
//!
//! See `docs/design.md` for formats, protocols and invariants.

pub mod btree;
pub mod error;
pub mod heap;
pub mod path;
pub mod query;
pub mod value;

pub use error::{Error, Result};

/// Per-document errors of an `insert_many` (MongoDB's `writeErrors`).
#[derive(Debug, Clone)]
pub struct BulkWriteFailure {
    /// `(index in the input, error)` for each failed document.
    pub errors: Vec<(usize, Error)>,
    /// How many documents were inserted.
    pub inserted: usize,
}
