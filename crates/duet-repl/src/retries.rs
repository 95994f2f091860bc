//! Which retryable writes the replica set applied: every member records the
//! origin tags (`lsid` + `txnNumber`, see `Database::with_origin`) of each
//! group entry it applies, so a driver retrying a write on a new primary
//! after a failover is answered "done" instead of running the write twice.
//!
//! Bounded: the newest [`MAX_RETRIES`] tags are kept (MongoDB keeps them as
//! long as the session lives). Kept in memory: a member that restarts knows
//! the tags of the entries it applies after the restart only (see
//! docs/design.md "Replication").

use std::collections::{HashSet, VecDeque};

use parking_lot::Mutex;

/// Most origin tags remembered.
pub const MAX_RETRIES: usize = 100_000;

/// The tags, and their order of arrival (oldest first, evicted first).
type Tags = (HashSet<Vec<u8>>, VecDeque<Vec<u8>>);

#[derive(Default)]
pub struct Retries {
    inner: Mutex<Tags>,
}

impl Retries {
    pub fn record(&self, tag: &[u8]) {
        let mut g = self.inner.lock();
        let (set, order) = &mut *g;
        if set.insert(tag.to_vec()) {
            order.push_back(tag.to_vec());
            while order.len() > MAX_RETRIES {
                if let Some(old) = order.pop_front() {
                    set.remove(&old);
                }
            }
        }
    }

    pub fn contains(&self, tag: &[u8]) -> bool {
        self.inner.lock().0.contains(tag)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keeps_the_newest_tags() {
        let r = Retries::default();
        for i in 0..(MAX_RETRIES + 10) as u64 {
            r.record(&i.to_le_bytes());
        }
        assert!(!r.contains(&0u64.to_le_bytes()));
        assert!(r.contains(&10u64.to_le_bytes()));
        assert!(r.contains(&((MAX_RETRIES + 9) as u64).to_le_bytes()));
    }
}
