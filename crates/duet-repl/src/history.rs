//! Recent database states on this member, by cluster time: what lets read
//! concern `snapshot` with an `atClusterTime` be served on any member that
//! has applied that time — also a time another member issued (a primary's
//! snapshot read continued on a secondary, or the reverse) after this
//! member has moved on.
//!
//! After each group it applies (its own, handed back to its writer, or
//! another member's), the state machine records the database's published
//! state; a snapshot read asks for the state whose last group has time
//! `atClusterTime - 1` (`duet-server/src/snapshots.rs`). Group times are the
//! primary's, carried in every member's copy of the record, so the state of
//! a time is the same on every member.
//!
//! Invariants:
//! - a recorded state is exactly the database's state just after the group
//!   of its cluster time (recorded only when the published state's time is
//!   that group's);
//! - at most [`MAX_STATES`] states, none older than [`MAX_AGE`], are held:
//!   each one keeps alive the versions later groups replaced (copy-on-write
//!   nodes), so the window is bounded in both count and time; a time that
//!   left it is 239 SnapshotTooOld, as MongoDB's reads past its history
//!   window are.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use parking_lot::Mutex;

/// States held at most (every database together).
pub const MAX_STATES: usize = 256;
/// Oldest state held (MongoDB's `minSnapshotHistoryWindowInSeconds`
/// default).
pub const MAX_AGE: Duration = Duration::from_secs(300);

/// See the module documentation.
#[derive(Default)]
pub struct History {
    held: Mutex<VecDeque<(String, Instant, duetdb::Snapshot)>>,
}

impl History {
    /// The state of `db` just after its group of time `snap.cluster_time()`.
    pub fn record(&self, db: &str, snap: duetdb::Snapshot) {
        let now = Instant::now();
        let mut g = self.held.lock();
        g.push_back((db.to_string(), now, snap));
        while g.len() > MAX_STATES
            || g.front()
                .is_some_and(|(_, at, _)| now.saturating_duration_since(*at) > MAX_AGE)
        {
            g.pop_front();
        }
    }

    /// The state of `db` whose last group has cluster time `ts`, if held.
    pub fn state_at(&self, db: &str, ts: u64) -> Option<duetdb::Snapshot> {
        let now = Instant::now();
        self.held
            .lock()
            .iter()
            .rev()
            .find(|(d, at, s)| {
                d == db && s.cluster_time() == ts && now.saturating_duration_since(*at) <= MAX_AGE
            })
            .map(|(_, _, s)| s.clone())
    }

    pub fn len(&self) -> usize {
        self.held.lock().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bson::doc;

    #[test]
    fn keeps_the_newest_states_and_finds_them_by_time() {
        let h = History::default();
        let db = duetdb::Database::in_memory();
        let mut times = Vec::new();
        for i in 0..(MAX_STATES as i32 + 10) {
            db.collection("c")
                .insert_one(doc! {"_id": i})
                .expect("insert");
            let s = db.snapshot();
            times.push(s.cluster_time());
            h.record("d", s);
        }
        assert_eq!(h.len(), MAX_STATES);
        assert!(
            h.state_at("d", times[0]).is_none(),
            "the oldest left the window"
        );
        let s = h.state_at("d", times[20]).expect("held");
        assert_eq!(s.collection("c").count(doc! {}).expect("count"), 21);
        assert!(h.state_at("other", times[20]).is_none());
    }
}
