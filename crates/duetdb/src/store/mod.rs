//! The store: persistent (copy-on-write) structures that hold one version of
//! the data. Layer 2: uses `error` and `doc` only.
//!
//! - `heap`: radix tree `RecordId → document` (the record heap);
//! - `btree`: the persistent B+tree under every index;
//! - `delta`: delta indexing's layers over an index's merged tree and the
//!   merged (fresh) view of a key range;
//! - `index`: index specs, key extraction, key order; `hashed`: MongoDB's
//!   hash of a value (hashed indexes); `wildcard`: wildcard index coverage and keys; `text`: text index terms and scores;
//! - `collection`: one version of a collection (heap + indexes + VLS bookkeeping);
//!   `index_build`: an index built outside the writer from a published version,
//!   caught up by diffing heaps;
//!   `bulk_load`: a collection built at once from its records (checkpoint
//!   load), its structures side by side, indexes bottom-up from sorted keys;
//!   `options`: its `create`/`collMod` options (`changeStreamPreAndPostImages`);
//! - `state`: one version of a database (`DbState`);
//! - `vls`, `remset`: the VLS status masks and shared remset kept beside the
//!   heap; the writer updates them before each change, scans (in `snapshot`)
//!   claim records through them.

pub mod btree;
pub mod bulk_load;
pub mod collection;
pub mod delta;
pub mod geo;
pub mod hashed;
pub mod heap;
pub mod index;
pub mod index_build;
pub mod options;
pub mod remset;
pub mod state;
pub mod text;
pub mod vls;
pub mod wildcard;

pub use state::{DbState, DeltaOptions};
