//! The public API: `Database`, `Collection`, `Find`, `Snapshot`,
//! `Transaction`, `Engine`, the TTL monitor (`ttl`), index builds outside the writer (`index_build`), and `Crud`, the one CRUD surface of a live
//! collection and of a transaction's view of one. Every `impl` block of an
//! API type lives here; the layers below know nothing of these types.
//! Layer 8: may use every layer below.

pub mod aggregate;
pub mod analytics;
pub mod backup;
pub mod capped;
pub mod changes;
pub mod collection;
pub mod crud;
pub mod database;
pub mod engine;
pub mod find;
pub mod index_build;
pub mod named;
pub mod olcp;
pub mod out;
pub mod snapshot;
pub mod stats;
pub mod text;
pub mod transaction;
pub mod ttl;

pub use crate::query::aggregate::{StageCount, StageStats};
pub use aggregate::{AggregateExplain, StageSpills};
pub use analytics::{AnalyticCollection, AnalyticSession};
pub use backup::{BackedUp, BackupInfo};
pub use capped::TailPosition;
pub use changes::{ChangeBatch, ChangeEvent, ChangeKind, ChangePosition, ChangeScope};
pub use collection::{Collection, IndexOptions, IndexTarget};
pub use crud::{
    Crud, DeleteStatement, FindAndModifyOptions, ReturnDocument, StatementResults, UpdateOptions,
    UpdateStatement,
};
pub use database::{validate_collection_name, CollStats, Database, DbOptions, DbStats};
pub use engine::Engine;
pub use find::{Find, FindOptions, FindOutcome, FindStream};
pub use index_build::{IndexBuildMode, IndexBuildOptions, BACKGROUND_BUILD_MIN_DOCS};
pub use snapshot::{Snapshot, SnapshotCollection};
pub use stats::{IndexSize, StorageStats, Validation};
pub use text::{TextFindOptions, TextStream};
pub use transaction::{Transaction, TxnCollection};
pub use ttl::{TtlCounters, TtlMonitor, TtlPass, DEFAULT_TTL_SLEEP};
