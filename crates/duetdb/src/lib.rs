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

// The engine's modules, lowest layer first (docs/design.md §1; the order is
// enforced by tests/layering.rs). None is public: what other crates use is
// exported below, deliberately.
mod api;
pub mod check;
mod doc;
mod durability;
mod error;
mod query;
mod snapshot;
mod store;
mod txn;
mod write;

pub use bson;

// The embedded API.
pub use api::aggregate::pipeline_parses;
pub use api::engine::validate_db_name;
pub use api::out::output_database;
pub use api::{crud::FindAndModifyOutcome, Crud, TxnCollection};
pub use api::{
    AggregateExplain, AnalyticCollection, AnalyticSession, BackedUp, BackupInfo, CollStats,
    Collection, Database, DbOptions, DbStats, DeleteStatement, Engine, Find, FindAndModifyOptions,
    FindOptions, FindOutcome, FindStream, IndexBuildMode, IndexBuildOptions, IndexOptions,
    IndexSize, IndexTarget, ReturnDocument, Snapshot, SnapshotCollection, StageCount, StageSpills,
    StageStats, StatementResults, StorageStats, TailPosition, TextFindOptions, TextStream,
    Transaction, TtlCounters, TtlMonitor, TtlPass, UpdateOptions, UpdateStatement, Validation,
    BACKGROUND_BUILD_MIN_DOCS, DEFAULT_TTL_SLEEP,
};
pub use api::{ChangeBatch, ChangeEvent, ChangeKind, ChangePosition, ChangeScope};
pub use doc::collation::{Collation, Collator};
pub use durability::wal::WalStats;
pub use durability::{
    CheckpointInfo, CheckpointStats, Durability, DurabilityOptions, RecoveryReport, Truncation,
    DEFAULT_CHANGE_RETENTION, DEFAULT_CHANGE_RETENTION_BYTES, DEFAULT_CHECKPOINT_NICE,
};
pub use error::{
    BulkWriteFailure, CancelReason, CancelToken, DuplicateKey, Error, Result, StorageError,
};
pub use query::limits::{ReadLimits, DEFAULT_MEMORY_LIMIT};
pub use query::spill::{spill_stats, SpillStats};
pub use query::validator::check as check_collection_options;
pub use snapshot::named::{
    AnalyticsSnapshot, Clock, ManualClock, SnapshotInfo, SnapshotOptions, MAX_NAMED_SNAPSHOTS,
};
pub use snapshot::olcp::{OlcpOptions, OlcpReport, PointRange, PointReader};
pub use snapshot::retained::{CollectionCost, RetainedCost};
pub use snapshot::scan::ScanOutcome;
pub use snapshot::{Choice, ReadStats, Strategy};
pub use store::delta::IndexRead;
pub use store::index_build::{BuildPhase, IndexBuildProgress};
pub use store::options::{CollectionOptions, OptionError, ValidationAction, ValidationLevel};
pub use store::remset::{RemsetMode, RemsetStats};
pub use store::vls::{VlsOptions, VlsStats};
pub use store::DeltaOptions;
pub use txn::{CommitInfo, CommitOutcome, Isolation, TxnOptions, DEFAULT_LIFETIME};
pub use write::command::{UpdateResult, WriteOutcome, MAX_BATCH_STATEMENTS};
pub use write::delta::DeltaStats;
pub use write::writer::{last_commit_csn, WriterStats};

/// Documents as the engine stores them (raw BSON behind an `Arc`), and the
/// checks every document from outside passes: for servers that validate and
/// convert what clients send.
pub mod raw {
    pub use crate::doc::path::{validate as validate_path, values as path_values};
    pub use crate::doc::size::{array_element_len, document_len, element_len, value_len};
    pub use crate::doc::types::type_name;
    pub use crate::doc::value::{compare, equal};
    pub use crate::doc::{
        has_duplicate_id, id_of, prepare_insert, to_document, to_raw_document, validate_raw,
        validate_raw_depth, DocRef, DUPLICATE_ID_MARK, MAX_DEPTH, MAX_DOC_SIZE, RAW_DOCUMENT_MARK,
    };
    pub use crate::error::render_shell;
    pub use crate::store::hashed::hash64 as hashed_index_key;
}

/// The query language, parsed once into typed forms: filters, projections,
/// updates and aggregation pipelines.
pub mod lang {
    pub use crate::query::aggregate::canonical_cmp;
    pub use crate::query::distinct::Distinct;
    pub use crate::query::expr::under_read_time;
    pub use crate::query::filter::Examined;
    pub use crate::query::{
        CommutativePart, Filter, PartialState, Pipeline, Projection, Split, UpdateSpec,
    };
}

/// The persistent structures under every version, exported for their
/// benchmarks (`benches/btree.rs`) and for tests that prove structural
/// sharing between versions (`Snapshot::state`). Read-only inspection: no
/// API mutates them from outside.
pub mod structures {
    pub use crate::store::btree::BTree;
    pub use crate::store::collection::CollectionState;
    pub use crate::store::delta::DeltaLayer;
    pub use crate::store::heap::{Heap, RecordId};
    pub use crate::store::index::{IndexKey, IndexState};
    pub use crate::store::DbState;
}

/// The seam a replica set plugs into (`durability::replicate`).
pub mod replication {
    pub use crate::api::backup::write_image;
    pub use crate::durability::replicate::{Commit, GroupRecord, Replicate, Tagged};
    pub use crate::snapshot::named::{NamedCopy, NamedImage};
}

/// The storage seam: the file-system trait with its real and simulated
/// implementations (fault injection, crash images), the bound on open
/// descriptors, the modes of created files, and what crash tests read of
/// the WAL.
pub mod storage {
    pub use crate::durability::background::registered as background_registrations;
    pub use crate::durability::checkpoint::checkpoint_name;
    pub use crate::durability::fdcache::{
        max_open_files, open_files, set_max_open_files, DEFAULT_MAX_OPEN_FILES,
    };
    pub use crate::durability::io::{
        CrashKind, DirLock, Fault, FaultKind, OpKind, RealFs, Rng, SimFs, SimState, VFile, Vfs,
    };
    pub use crate::durability::io::{DIR_MODE, FILE_MODE};
    pub use crate::durability::is_no_space;
    /// WAL segment names and framing, for tests that damage segments.
    pub mod wal {
        pub use crate::durability::wal::{read_frame, segment_name, SEGMENT_MAGIC};
    }
}

/// Test hooks (the `testing` feature): planted bugs the checkers must catch,
/// and waits for background work. Not in builds users get.
#[cfg(feature = "testing")]
pub mod testing {
    pub use crate::snapshot::scan::wait_for;
    pub use crate::txn::PlantedBug;
}

/// Decoders of the on-disk formats (WAL, effects, checkpoints, manifest)
/// behind one entry point each, for the cargo-fuzz targets and their corpus
/// replay. Not part of the stable API.
#[doc(hidden)]
pub mod fuzzing {
    pub use crate::durability::fuzzing::*;
}
