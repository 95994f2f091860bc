//! Writer groups of this member waiting for their Raft commit.
//!
//! The primary's writer proposes a group's record and blocks (see
//! `replicator.rs`); the state machine, applying committed entries in log
//! order, hands each of this member's own entries back to its waiting
//! writer ([`Pending::take`]), which logs and publishes it. When an entry
//! of another origin is about to change a database that has a writer
//! waiting, that writer's group was made on a state the log has moved
//! past: it can only be skipped when its entry comes, so it is failed now
//! ([`Pending::supersede`]) — which also frees the writer role the apply
//! needs.
//!
//! Invariants:
//! - every registered slot gets exactly one [`Outcome`] (the state machine,
//!   the proposal's failure, the writer's time-out or a supersede sends it,
//!   whoever removes the slot first);
//! - while an entry that continues database D's log is being applied by
//!   another path, no writer of D can register a group made on the state
//!   before it (`blocked`): its registration fails at once.

use std::collections::HashMap;
use std::sync::mpsc::SyncSender;

use parking_lot::Mutex;

/// What a waiting writer is told.
pub enum Outcome {
    /// Committed and next to be applied: log and publish it, then report
    /// the outcome on the sender (the state machine waits for it).
    Committed(tokio::sync::oneshot::Sender<Result<(), String>>),
    /// The group must fail with this error.
    Failed(duetdb::Error),
}

struct Slot {
    db: String,
    first: u64,
    tx: SyncSender<Outcome>,
}

#[derive(Default)]
struct Inner {
    next: u64,
    slots: HashMap<u64, Slot>,
    /// Database → the first csn of an entry being applied by another path
    /// (`None`: the database is being dropped).
    blocked: HashMap<String, Option<u64>>,
}

/// See the module documentation.
#[derive(Default)]
pub struct Pending {
    inner: Mutex<Inner>,
}

impl Pending {
    /// Register a group of `db` starting at csn `first`; its token, or the
    /// error to fail it with when it is already superseded.
    pub fn register(
        &self,
        db: &str,
        first: u64,
        tx: SyncSender<Outcome>,
    ) -> Result<u64, duetdb::Error> {
        let mut g = self.inner.lock();
        if g.blocked
            .get(db)
            .is_some_and(|b| b.is_none_or(|b| b == first))
        {
            return Err(superseded(db));
        }
        g.next += 1;
        let token = g.next;
        g.slots.insert(
            token,
            Slot {
                db: db.to_string(),
                first,
                tx,
            },
        );
        Ok(token)
    }

    /// Remove the slot `token` (whoever gets it sends its outcome).
    pub fn take(&self, token: u64) -> Option<SyncSender<Outcome>> {
        self.inner.lock().slots.remove(&token).map(|s| s.tx)
    }

    /// An entry continuing `db`'s log at csn `first` is being applied (or,
    /// with `None`, `db` is being dropped): fail any writer of `db` waiting
    /// with a group made on the state before it, and refuse new ones until
    /// [`Pending::unblock`].
    pub fn supersede(&self, db: &str, first: Option<u64>) {
        let mut g = self.inner.lock();
        g.blocked.insert(db.to_string(), first);
        let stale: Vec<u64> = g
            .slots
            .iter()
            .filter(|(_, s)| s.db == db && first.is_none_or(|f| f == s.first))
            .map(|(t, _)| *t)
            .collect();
        for t in stale {
            if let Some(s) = g.slots.remove(&t) {
                let _ = s.tx.try_send(Outcome::Failed(superseded(db)));
            }
        }
    }

    pub fn unblock(&self, db: &str) {
        self.inner.lock().blocked.remove(db);
    }

    /// Fail every waiting writer (this member stopped being primary, or
    /// shuts down).
    pub fn fail_all(&self, make: impl Fn() -> duetdb::Error) {
        let slots: Vec<Slot> = self.inner.lock().slots.drain().map(|(_, s)| s).collect();
        for s in slots {
            let _ = s.tx.try_send(Outcome::Failed(make()));
        }
    }
}

/// The error of a group another entry superseded: the primary changed
/// under it (MongoDB's InterruptedDueToReplStateChange, which drivers retry).
pub fn superseded(db: &str) -> duetdb::Error {
    duetdb::Error::Coded {
        code: 11602,
        name: "InterruptedDueToReplStateChange",
        msg: format!(
            "a write of database {db} was interrupted: the replica set committed another \
             member's write first (the primary changed)"
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_superseded_group_fails_and_cannot_register_until_unblocked() {
        let p = Pending::default();
        let (tx, rx) = std::sync::mpsc::sync_channel(1);
        let t = p.register("d", 5, tx).expect("register");
        let (tx2, rx2) = std::sync::mpsc::sync_channel(1);
        let other = p.register("e", 5, tx2).expect("other db");
        p.supersede("d", Some(5));
        assert!(matches!(rx.try_recv(), Ok(Outcome::Failed(e)) if e.code() == 11602));
        assert!(p.take(t).is_none(), "the slot is gone");
        assert!(
            rx2.try_recv().is_err(),
            "another database's writer is untouched"
        );
        let (tx3, _rx3) = std::sync::mpsc::sync_channel(1);
        assert!(p.register("d", 5, tx3.clone()).is_err(), "blocked");
        p.unblock("d");
        assert!(p.register("d", 5, tx3).is_ok());
        assert!(p.take(other).is_some());
    }
}
