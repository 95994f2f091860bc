//! duetdb: a document database engine in which analytics and updates run side by
//! side. One writer per database applies every mutation in commit order to a
//! copy-on-write state (record heap + indexes) and publishes a new root per
//! batch; any reader that takes the published root holds a consistent snapshot.
//!
//! See `docs/design.md` for formats, protocols and invariants.
//!
//! ```
//! use duetdb::{bson::doc, Database};
//! let db = Database::in_memory();
//! let people = db.collection("people");
//! people.insert_one(doc! {"name": "Ada", "born": 1815}).unwrap();
//! let snap = db.snapshot();
//! people.update_one(doc! {"name": "Ada"}, doc! {"$set": {"born": 1816}}).unwrap();
//! // The snapshot still sees the state at its csn.
//! let old = snap.collection("people").find_one(doc! {"name": "Ada"}).unwrap().unwrap();
//! assert_eq!(old.get_i32("born").unwrap(), 1815);
//! ```

pub mod btree;
pub mod check;
pub mod collection;
pub mod command;
pub mod database;
pub mod doc;
pub mod durability;
pub mod engine;
pub mod error;
pub mod heap;
pub mod index;
pub mod path;
pub mod planner;
pub mod query;
pub mod rawfield;
pub mod scan;
pub mod snapshot;
pub mod txn;
pub mod value;
pub mod writer;

pub use bson;
pub use command::UpdateResult;
pub use database::{
    CollStats, Collection, Database, DbOptions, DbStats, Find, FindAndModifyOptions, FindOptions,
    IndexOptions, ReturnDocument, Snapshot, SnapshotCollection, UpdateOptions,
};
pub use durability::{Durability, DurabilityOptions};
pub use engine::Engine;
pub use error::{Error, Result};
pub use scan::olcp::{OlcpOptions, OlcpReport, PointRange, PointReader};
pub use scan::Strategy;
pub use snapshot::{
    AnalyticCollection, AnalyticSession, AnalyticsSnapshot, CollectionCost, ManualClock,
    RetainedCost, SnapshotInfo, SnapshotOptions,
};
pub use txn::{CommitInfo, Isolation, Transaction, TxnOptions};

/// Per-document errors of an `insert_many` (MongoDB's `writeErrors`).
#[derive(Debug, Clone)]
pub struct BulkWriteFailure {
    /// `(index in the input, error)` for each failed document.
    pub errors: Vec<(usize, Error)>,
    /// How many documents were inserted.
    pub inserted: usize,
}
