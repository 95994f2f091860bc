//! The seam between a database's single writer and a replica set (the
//! `duet-repl` crate implements it; the engine knows nothing of Raft).
//!
//! When a replicator is installed ([`crate::Engine::set_replicator`]), the
//! leader of a writer group hands the group's encoded WAL record to
//! [`Replicate::replicate`] *before* it appends it locally or publishes it,
//! and waits. The call returns when the replica set has committed the record
//! (a majority of members hold it) and every earlier committed record of the
//! database has been applied here; the writer then appends the same bytes to
//! its own WAL, publishes, and reports the outcome through [`Commit::finish`].
//! When the call fails (this member is not the primary, the record was
//! superseded by another member's, no majority answered in time) the group
//! fails like a failed WAL append: nothing is logged or published here.
//!
//! Members that are not primary apply committed records through
//! `Database::apply_replicated`, which runs the recovery replay of one record
//! as a writer group of its own — the same effects code, the same bytes
//! appended to the local WAL — so members hold identical states at the same
//! log position.
//!
//! Invariants:
//! - a group is published on a replica-set member only after its record was
//!   committed by the set, so no member ever shows (or acknowledges) a write
//!   that a failover can take back;
//! - a [`Commit`] is finished exactly once: dropping it unfinished reports a
//!   failure, so the replicator never waits for an outcome that cannot come.

use crate::error::Error;

/// One group's record, as the writer hands it over.
#[derive(Clone, Copy)]
pub struct GroupRecord<'a> {
    /// The database the group belongs to.
    pub db: &'a str,
    /// Its commit sequence numbers `first..=lsn`.
    pub first: u64,
    pub lsn: u64,
    /// The record payload (`wal::encode_record`), logged verbatim everywhere.
    pub payload: &'a [u8],
    /// The origin tags of the group's successful commands
    /// (`Database::with_origin`), each with what its command did: which
    /// client operations it applied, and their replies' details.
    pub origins: &'a [Tagged],
    /// To be called once the record is queued in the replicated log, before
    /// waiting for its commit: it lets the next database's writer take its
    /// time (`ClusterClock::order`), so the log holds groups in time order.
    /// Not calling it is safe (the writer releases the order when
    /// `replicate` returns) but serializes every database's commits.
    pub proposed: &'a dyn Fn(),
}

/// One successful command of a tagged client operation: its tag and its
/// outcome (`write::command::WriteOutcome::encode`; empty when the command's
/// reply has nothing to tell, e.g. a transaction's commit), so that a retry
/// answered from the replica set's table gets the first execution's reply.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Tagged {
    pub tag: std::sync::Arc<[u8]>,
    pub outcome: Vec<u8>,
}

impl std::fmt::Debug for GroupRecord<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GroupRecord")
            .field("db", &self.db)
            .field("first", &self.first)
            .field("lsn", &self.lsn)
            .field("payload_len", &self.payload.len())
            .field("origins", &self.origins.len())
            .finish()
    }
}

/// Replicates writer groups (see the module documentation).
pub trait Replicate: Send + Sync {
    /// Propose `rec` and wait until it is committed and may be published
    /// here. `Err`: the group must fail, and publish nothing.
    fn replicate(&self, rec: GroupRecord<'_>) -> Result<Commit, Error>;
}

type Finish = Box<dyn FnOnce(Result<(), String>) + Send>;

/// A committed record whose local append and publish are still to come;
/// the writer reports their outcome with [`Commit::finish`].
pub struct Commit {
    finish: Option<Finish>,
    /// Others hold the record as committed (a replica set): failing to log
    /// it here leaves this copy behind, and stops the writer.
    binds: bool,
}

impl Commit {
    pub fn new(finish: impl FnOnce(Result<(), String>) + Send + 'static) -> Commit {
        Commit {
            finish: Some(Box::new(finish)),
            binds: true,
        }
    }

    /// A commit nobody else holds (a server outside a replica set that
    /// only notes the group's tags): a failed local append fails the group
    /// as it would without a replicator, and the writer carries on.
    pub fn local(finish: impl FnOnce(Result<(), String>) + Send + 'static) -> Commit {
        Commit {
            finish: Some(Box::new(finish)),
            binds: false,
        }
    }

    /// Whether failing to log the record here leaves this member behind
    /// the others ([`Commit::new`]) rather than failing the group only.
    pub fn binds(&self) -> bool {
        self.binds
    }

    /// The record was appended to the local WAL and published (`Ok`), or
    /// could not be (`Err(why)`: this member no longer matches the set).
    pub fn finish(mut self, outcome: Result<(), String>) {
        if let Some(f) = self.finish.take() {
            f(outcome);
        }
    }
}

impl Drop for Commit {
    fn drop(&mut self) {
        if let Some(f) = self.finish.take() {
            f(Err(
                "the writer dropped a committed record unfinished".into()
            ));
        }
    }
}

impl std::fmt::Debug for Commit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Commit")
            .field("finished", &self.finish.is_none())
            .finish()
    }
}
