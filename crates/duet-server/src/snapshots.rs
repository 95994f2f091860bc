//! `readConcern: {level: "snapshot"}`: which engine snapshot a read runs on,
//! and the bounded registry that lets a client come back to the same snapshot
//! by sending the `atClusterTime` it was given.
//!
//! A duetdb snapshot is a published state of one database. The
//! `atClusterTime` we hand out is the cluster time just after the state's
//! last commit group (`Snapshot::cluster_time() + 1`, an odd time no group
//! ever has; see the engine's `changes::clock`): a change stream started
//! there (`startAtOperationTime`, inclusive) delivers exactly the changes
//! after the snapshot — no gap, no duplicate (docs/design.md, "Change
//! streams"). (Named snapshots still report their csn as a Timestamp,
//! `csn_to_timestamp`.)
//!
//! Invariants:
//! - at most `capacity` snapshots are held here (least recently used evicted),
//!   because each one keeps the old versions it references alive; cursors hold
//!   their own snapshot and do not depend on this registry;
//! - a requested time is either served exactly (from the registry, from the
//!   live state when that is still the state at that time, or from a
//!   replica-set member's recent states) or refused with
//!   SnapshotTooOld (239) / BadValue (2) for a time not reached yet — never
//!   silently replaced by another state.

use std::collections::VecDeque;

use bson::Timestamp;
use duetdb::{Database, Snapshot};
use parking_lot::Mutex;

use crate::error::{CmdResult, CommandError};

/// Snapshots kept for `atClusterTime` by default.
pub const DEFAULT_CAPACITY: usize = 128;

pub fn csn_to_timestamp(csn: u64) -> Timestamp {
    Timestamp {
        time: ((csn >> 32) as u32).saturating_add(1),
        increment: (csn & 0xffff_ffff) as u32,
    }
}

/// The `atClusterTime` of a snapshot: just after its last commit group.
pub fn snapshot_time(snap: &Snapshot) -> Timestamp {
    crate::commands::changes::timestamp(snap.cluster_time() + 1)
}

#[cfg_attr(not(test), allow(dead_code))]
pub fn timestamp_to_csn(ts: Timestamp) -> Option<u64> {
    let hi = ts.time.checked_sub(1)?;
    Some((u64::from(hi) << 32) | u64::from(ts.increment))
}

pub struct SnapshotRegistry {
    capacity: usize,
    /// Most recently used at the back.
    held: Mutex<VecDeque<(String, Snapshot)>>,
}

impl SnapshotRegistry {
    pub fn new(capacity: usize) -> SnapshotRegistry {
        SnapshotRegistry {
            capacity: capacity.max(1),
            held: Mutex::new(VecDeque::new()),
        }
    }

    pub fn len(&self) -> usize {
        self.held.lock().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn remember(&self, db: &str, snap: &Snapshot) {
        let mut g = self.held.lock();
        if let Some(pos) = g
            .iter()
            .position(|(d, s)| d == db && s.cluster_time() == snap.cluster_time())
        {
            if let Some(e) = g.remove(pos) {
                g.push_back(e);
            }
            return;
        }
        g.push_back((db.to_string(), snap.clone()));
        while g.len() > self.capacity {
            g.pop_front();
        }
    }

    /// The snapshot a snapshot-read runs on: the one at `at` when given,
    /// else the latest (which is then remembered for later `atClusterTime`).
    pub fn resolve(
        &self,
        db_name: &str,
        db: &Database,
        at: Option<Timestamp>,
    ) -> CmdResult<Snapshot> {
        self.resolve_with(db_name, db, at, |_| None)
    }

    /// [`Self::resolve`], asking `older(t)` for the state whose last group
    /// has time `t` when neither the registry nor the live state is the one
    /// at the requested time: a replica-set member's recent states
    /// (`duet_repl::history`), so a time another member issued is served
    /// here too.
    pub fn resolve_with(
        &self,
        db_name: &str,
        db: &Database,
        at: Option<Timestamp>,
        older: impl FnOnce(u64) -> Option<Snapshot>,
    ) -> CmdResult<Snapshot> {
        let Some(ts) = at else {
            let snap = db.snapshot();
            self.remember(db_name, &snap);
            return Ok(snap);
        };
        let want = crate::commands::changes::packed(ts);
        // Only odd times (just after a group) are issued.
        if want & 1 == 0 {
            return Err(CommandError::new(
                239,
                "SnapshotTooOld",
                format!("atClusterTime {ts:?} was not issued by this server"),
            ));
        }
        let found = {
            let g = self.held.lock();
            g.iter()
                .find(|(d, s)| d == db_name && s.cluster_time() + 1 == want)
                .map(|(_, s)| s.clone())
        };
        if let Some(snap) = found {
            self.remember(db_name, &snap);
            return Ok(snap);
        }
        let live = db.snapshot();
        if live.cluster_time() + 1 == want {
            self.remember(db_name, &live);
            return Ok(live);
        }
        if want > live.cluster_time() + 1 {
            return Err(CommandError::bad_value(format!(
                "readConcern atClusterTime {ts:?} is later than database '{db_name}' has reached"
            )));
        }
        if let Some(snap) = older(want - 1).filter(|s| s.cluster_time() + 1 == want) {
            self.remember(db_name, &snap);
            return Ok(snap);
        }
        Err(CommandError::new(
            239,
            "SnapshotTooOld",
            format!(
                "the snapshot of database '{db_name}' at {ts:?} is no longer held (the server keeps the {} most recently used); start a new snapshot read",
                self.capacity
            ),
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bson::doc;

    #[test]
    fn atclustertime_returns_the_same_state_or_refuses() {
        assert_eq!(timestamp_to_csn(csn_to_timestamp(0)), Some(0));
        assert_eq!(
            timestamp_to_csn(csn_to_timestamp(u64::from(u32::MAX) + 5)),
            Some(u64::from(u32::MAX) + 5)
        );
        let reg = SnapshotRegistry::new(2);
        let db = Database::in_memory();
        let c = db.collection("c");
        c.insert_one(doc! {"a": 1}).expect("insert");
        let s1 = reg.resolve("d", &db, None).expect("latest");
        c.insert_one(doc! {"a": 2}).expect("insert");
        let again = reg
            .resolve("d", &db, Some(snapshot_time(&s1)))
            .expect("same");
        assert_eq!(again.collection("c").count(doc! {}).expect("count"), 1);
        assert_eq!(
            reg.resolve(
                "d",
                &db,
                Some(Timestamp {
                    time: u32::MAX,
                    increment: 1
                })
            )
            .expect_err("future")
            .code,
            2
        );
        // Evict s1 by using two newer snapshots.
        reg.resolve("d", &db, None).expect("latest");
        c.insert_one(doc! {"a": 3}).expect("insert");
        reg.resolve("d", &db, None).expect("latest");
        assert_eq!(
            reg.resolve("d", &db, Some(snapshot_time(&s1)))
                .expect_err("evicted")
                .code,
            239
        );
    }
}
