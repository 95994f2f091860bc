//! duet-repl: replica sets for duetdb — every database's WAL replicated
//! through one Raft group ([openraft] 0.9, pinned), so that any member can
//! take over as primary with every majority-acknowledged write.
//!
//! Modules, one concept each:
//! - `types`: the Raft type configuration and the log entry (`Request`);
//! - `log_store`: the durable Raft log and vote (`<data dir>/repl.raft/`);
//! - `state_machine`: applying committed entries to the engine;
//! - `pending`: this member's writer groups waiting for their commit;
//! - `retries`: which retryable writes and transaction commits the set
//!   applied (failover dedup; durable, carried by Raft snapshots);
//! - `local`: the same table for a server outside a replica set, fed by
//!   the same `Replicate` hook, durable in the data directory;
//! - `snapshot`: Raft snapshots (every database's checkpoint image);
//! - `replicator`: the engine's `Replicate` hook (writer → Raft);
//! - `network`: Raft RPCs over TCP between members;
//! - `sim`: a simulated network for deterministic simulation tests;
//! - `digest`: digests of named snapshots, compared across members;
//! - `history`: recent database states by cluster time (snapshot reads);
//! - `member`: one running member and what the server asks of it.
//!
//! The protocol (docs/design.md "Replication"): the primary's writer
//! applies a group to its working copy, encodes its WAL record, proposes it
//! as a Raft entry and waits; once committed, the state machine hands it
//! back and the writer logs and publishes it. Every other member applies
//! the entry through the recovery replay of one record. So a member
//! publishes only committed groups, and members hold identical states at
//! the same log position.

// openraft's storage traits return its `StorageError` (224 bytes); the
// helpers that build one return it too rather than boxing and unboxing.
#![allow(clippy::result_large_err)]

pub mod digest;
pub mod history;
pub mod local;
pub mod log_store;
pub mod member;
pub mod network;
pub mod pending;
pub mod replicator;
pub mod retries;
pub mod sim;
pub mod snapshot;
pub mod state_machine;
pub mod types;

pub use member::{
    ConfigMember, Harness, Member, Options, Role, Status, DEFAULT_COMMIT_TIMEOUT,
    DEFAULT_NOOP_INTERVAL, DEFAULT_RECONFIG_CATCH_UP, DEFAULT_SNAPSHOT_ENTRIES,
};
