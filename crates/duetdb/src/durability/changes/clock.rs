//! The cluster clock: one per [`crate::Engine`] (process), handing out the
//! BSON Timestamps change events and snapshots are ordered by.
//!
//! A time is a Timestamp packed into a `u64` (`seconds << 32 | increment`,
//! so numeric order is Timestamp order). Every committed writer group of any
//! database takes one with [`ClusterClock::tick`]:
//! `max(previous + 2, now_seconds << 32 | 2)`. Group times are therefore
//! strictly increasing across all databases of the process, **even**, and
//! never below the times recovered from disk ([`ClusterClock::observe`]),
//! even when the wall clock went back. The odd time `t + 1` is "just after
//! group `t`": no group ever has it, which is what a snapshot's
//! `atClusterTime` uses (docs/design.md, "Change streams").
//!
//! Invariants:
//! - `tick` results are strictly increasing and even;
//! - a time stays *in flight* from `tick` (or `adopt`) until the matching
//!   [`ClusterClock::done`] (published or abandoned); [`ClusterClock::stable`]
//!   is below every time in flight, so every group with a time `<= stable()`
//!   is final: it is either visible (in the change tail and its database's
//!   published state) or will never exist. A reader that stops at `stable()`
//!   can never later find a group it skipped.
//! - in flight is counted per time: under a replica set two members' clocks
//!   may take the same time for different entries of which at most one
//!   commits (an old primary's proposal, later truncated, and the new
//!   primary's); the old primary then adopts the committed one's time while
//!   its own proposal of that time is still in flight, and each of the two
//!   finishes once.
//! - under a replica set, every database's writer takes its time and
//!   proposes its group while holding [`ClusterClock::order`], so the
//!   replicated log holds groups in time order across databases;
//! - `stable()` and `last()` read atomics the mutex's holder keeps equal to
//!   what the mutex guards (stored before it is released): change-stream
//!   readers call them on every read and must not contend with the writers'
//!   `tick`/`done`.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};

use parking_lot::Mutex;

/// A cluster time and the wall-clock milliseconds it was taken at.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Stamp {
    pub ts: u64,
    pub wall_ms: i64,
}

#[derive(Default)]
struct Inner {
    last: u64,
    /// Each time in flight and how many takers hold it (see the module
    /// invariants: more than one only under a replica set).
    in_flight: BTreeMap<u64, u32>,
}

/// See the module documentation.
#[derive(Default)]
pub struct ClusterClock {
    inner: Mutex<Inner>,
    /// Held from a replicated group's `tick` until its proposal is queued
    /// (see [`Self::order`]).
    order: Mutex<()>,
    /// `Inner::stable()`, stored under `inner` at every change.
    stable: AtomicU64,
    /// `Inner::last`, likewise.
    last: AtomicU64,
}

impl Inner {
    fn stable(&self) -> u64 {
        match self.in_flight.first_key_value() {
            Some((first, _)) => first - 1,
            None => self.last,
        }
    }
}

/// `(seconds, increment)` of a packed time.
pub fn parts(ts: u64) -> (u32, u32) {
    ((ts >> 32) as u32, ts as u32)
}

/// The packed time of `(seconds, increment)`.
#[cfg_attr(not(test), allow(dead_code))]
pub fn pack(secs: u32, inc: u32) -> u64 {
    (u64::from(secs) << 32) | u64::from(inc)
}

fn wall_now() -> (u64, i64) {
    let d = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    (d.as_secs(), d.as_millis().min(i64::MAX as u128) as i64)
}

impl ClusterClock {
    pub fn new() -> ClusterClock {
        ClusterClock::default()
    }

    /// Never hand out a time at or below `ts` (a time recovered from disk).
    pub fn observe(&self, ts: u64) {
        let mut g = self.inner.lock();
        // Keep `last` even: the next tick is `last + 2` at least.
        let even = ts + (ts & 1);
        g.last = g.last.max(even);
        self.publish(&g);
    }

    /// Make `g`'s figures visible to the lock-free readers. Requires: called
    /// with the lock held, after every change of `g`.
    fn publish(&self, g: &Inner) {
        self.last.store(g.last, Ordering::SeqCst);
        self.stable.store(g.stable(), Ordering::SeqCst);
    }

    /// Serializes "take a time, then propose the group" across the writers
    /// of every database: a replicated writer holds it from its `tick` until
    /// its group is queued in the replicated log, so log order is time order
    /// (without it, two databases' writers could tick in one order and
    /// propose in the other, and a secondary's applied time would pass a
    /// group it has yet to apply). Writers without a replica set never take it.
    pub fn order(&self) -> parking_lot::MutexGuard<'_, ()> {
        self.order.lock()
    }

    /// The next group time, registered as in flight until [`Self::done`].
    pub fn tick(&self) -> Stamp {
        let (secs, wall_ms) = wall_now();
        let mut g = self.inner.lock();
        let from_wall = (secs.min(u64::from(u32::MAX)) << 32) | 2;
        let ts = from_wall.max(g.last + 2);
        debug_assert!(ts & 1 == 0 && ts > g.last);
        g.last = ts;
        let fresh = g.in_flight.insert(ts, 1).is_none();
        debug_assert!(fresh, "time {ts} ticked while in flight");
        self.publish(&g);
        Stamp { ts, wall_ms }
    }

    /// A group time another member's clock took (a replicated group being
    /// applied here): in flight until [`Self::done`], like a tick, and later
    /// ticks are above it. A time at or below [`Self::stable`] (this clock
    /// ran ahead of the member that took it) is still registered, but a
    /// change-stream reader may already have passed it. A time this clock
    /// holds in flight already (its own proposal of the same time, which
    /// can then never commit) is held once more.
    pub fn adopt(&self, ts: u64) {
        let mut g = self.inner.lock();
        g.last = g.last.max(ts + (ts & 1));
        *g.in_flight.entry(ts).or_insert(0) += 1;
        self.publish(&g);
    }

    /// The group of time `ts` was published or abandoned.
    pub fn done(&self, ts: u64) {
        let mut g = self.inner.lock();
        match g.in_flight.get_mut(&ts) {
            Some(n) if *n > 1 => *n -= 1,
            Some(_) => {
                g.in_flight.remove(&ts);
            }
            None => debug_assert!(false, "time {ts} finished twice or never started"),
        }
        self.publish(&g);
    }

    /// Every group with a time `<=` this is final (see the module invariants).
    pub fn stable(&self) -> u64 {
        self.stable.load(Ordering::SeqCst)
    }

    /// The last time handed out (or observed): a reply's `operationTime`.
    pub fn last(&self) -> u64 {
        self.last.load(Ordering::SeqCst)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ticks_are_even_increasing_and_above_observed_times() {
        let c = ClusterClock::new();
        let far = pack(u32::MAX - 1, 7);
        c.observe(far);
        let a = c.tick();
        let b = c.tick();
        assert!(a.ts > far && b.ts > a.ts);
        assert_eq!((a.ts & 1, b.ts & 1), (0, 0));
        assert_eq!(c.stable(), a.ts - 1, "a is in flight");
        c.done(b.ts);
        assert_eq!(c.stable(), a.ts - 1, "b is done but a is not");
        c.done(a.ts);
        assert_eq!(c.stable(), b.ts);
    }

    /// An old primary's own proposal of time `t` (never to commit) and the
    /// new primary's committed entry of the same `t`, applied here: `t`
    /// stays in flight until both finished, in either order.
    #[test]
    fn a_time_held_twice_is_in_flight_until_both_finish() {
        for own_first in [true, false] {
            let c = ClusterClock::new();
            let before = c.tick();
            c.done(before.ts);
            let t = c.tick();
            c.adopt(t.ts);
            assert_eq!(c.stable(), t.ts - 1);
            c.done(t.ts);
            assert_eq!(c.stable(), t.ts - 1, "one taker of {t:?} still holds it");
            if own_first {
                c.done(t.ts);
            } else {
                c.adopt(t.ts);
                c.done(t.ts);
                c.done(t.ts);
            }
            assert_eq!(c.stable(), t.ts);
            let next = c.tick();
            assert!(next.ts > t.ts);
        }
    }
}
