//! The engine's [`Replicate`] hook on a replica-set member: a writer
//! group's record becomes a Raft entry, and the writer waits until the
//! state machine hands it back as committed (`pending.rs`).
//!
//! The writer calls from its own (blocking) thread and queues the entry in
//! Raft's log from there, in the order the groups took their cluster times
//! (`GroupRecord::proposed`); the commit is awaited on the member's tokio
//! runtime, and the answer comes back over a channel.
//! The wait is bounded by the commit timeout: past it the group fails with
//! WriteConcernFailed (64) and its outcome is unknown — the entry may still
//! commit, and is then applied like any other member's (every member
//! applies it, or skips it when a later group of the database was made
//! first). Writes on a member that is not a writable primary fail at once
//! with NotWritablePrimary (10107), before anything is proposed.

use std::sync::mpsc::{sync_channel, RecvTimeoutError};
use std::sync::Arc;
use std::time::Duration;

use duetdb::replication::{Commit, GroupRecord, Replicate};
use duetdb::Error;
use openraft::error::{ClientWriteError, RaftError};

use crate::member::Member;
use crate::pending::Outcome;
use crate::types::{NodeId, Origin, Request, Tagged};

pub struct Replicator {
    pub member: Arc<Member>,
    pub commit_timeout: Duration,
}

/// 10107 NotWritablePrimary, which drivers answer by rediscovering the set.
pub fn not_primary(msg: impl Into<String>) -> Error {
    Error::Coded {
        code: 10107,
        name: "NotWritablePrimary",
        msg: msg.into(),
    }
}

pub(crate) fn write_error(
    e: RaftError<NodeId, ClientWriteError<NodeId, openraft::BasicNode>>,
) -> Error {
    match e {
        RaftError::APIError(ClientWriteError::ForwardToLeader(f)) => not_primary(format!(
            "not primary: this member lost the primary role (primary now: {})",
            f.leader_node
                .map_or_else(|| "unknown".to_string(), |n| n.addr)
        )),
        RaftError::APIError(ClientWriteError::ChangeMembershipError(e)) => {
            Error::Internal(format!("replica set: {e}"))
        }
        RaftError::Fatal(f) => Error::Coded {
            code: 91,
            name: "ShutdownInProgress",
            msg: format!("the replica-set member stopped: {f}"),
        },
    }
}

impl Replicate for Replicator {
    fn replicate(&self, rec: GroupRecord<'_>) -> Result<Commit, Error> {
        let m = &self.member;
        if !m.is_writable_primary() {
            return Err(not_primary(
                "not primary: writes go to the replica set's primary",
            ));
        }
        let (tx, rx) = sync_channel(1);
        let token = m.shared.pending.register(rec.db, rec.first, tx)?;
        let req = Request::GroupReplies {
            db: rec.db.to_string(),
            origin: Origin {
                member: m.shared.me,
                incarnation: m.shared.incarnation,
                token,
            },
            payload: rec.payload.to_vec(),
            retries: rec
                .origins
                .iter()
                .map(|o| Tagged {
                    tag: o.tag.to_vec(),
                    outcome: o.outcome.clone(),
                })
                .collect(),
        };
        // Queued in Raft's log here, on the writer's thread, so entries
        // enter the log in the order their times were taken (the writer
        // holds the clock's order until `proposed`); the commit is awaited
        // on the member's runtime.
        let queued = m.runtime.block_on(m.raft.client_write_ff(req));
        (rec.proposed)();
        let fail = |e: Error| {
            if let Some(tx) = m.shared.pending.take(token) {
                let _ = tx.try_send(Outcome::Failed(e));
            }
        };
        match queued {
            Err(fatal) => fail(write_error(RaftError::Fatal(fatal))),
            Ok(answer) => {
                let shared = m.shared.clone();
                m.runtime.spawn(async move {
                    let e = match answer.await {
                        Ok(Ok(_)) => return,
                        Ok(Err(e)) => write_error(RaftError::APIError(e)),
                        Err(_) => Error::Coded {
                            code: 91,
                            name: "ShutdownInProgress",
                            msg: "the replica-set member stopped before the write committed".into(),
                        },
                    };
                    if let Some(tx) = shared.pending.take(token) {
                        let _ = tx.try_send(Outcome::Failed(e));
                    }
                });
            }
        }
        let outcome = match rx.recv_timeout(self.commit_timeout) {
            Ok(o) => o,
            Err(RecvTimeoutError::Timeout) => {
                if m.shared.pending.take(token).is_some() {
                    return Err(Error::Coded {
                        code: 64,
                        name: "WriteConcernFailed",
                        msg: format!(
                            "no majority of the replica set committed the write within {:?} \
                             (it may still commit)",
                            self.commit_timeout
                        ),
                    });
                }
                // The state machine took it meanwhile: its answer is coming.
                rx.recv()
                    .map_err(|_| Error::Internal("the commit's outcome was lost".into()))?
            }
            Err(RecvTimeoutError::Disconnected) => {
                return Err(Error::Internal("the commit's outcome was lost".into()))
            }
        };
        match outcome {
            Outcome::Committed(ack) => Ok(Commit::new(move |r| {
                let _ = ack.send(r);
            })),
            Outcome::Failed(e) => Err(e),
        }
    }
}
