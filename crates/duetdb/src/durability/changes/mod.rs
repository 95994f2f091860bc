//! The change log: every committed writer group of every database as a
//! record of effects stamped with a cluster time, for change streams.
//!
//! Sources (docs/design.md, "Change streams"):
//! - the **tail** ([`ChangeHub`]): the most recent records of all databases
//!   of the process in memory, ordered by time and bounded in bytes; the
//!   writer adds each group after publishing it, and waiting readers are
//!   woken. It is the only history of databases without a WAL;
//! - the **WAL** of each durable database ([`history`]): version-2 records
//!   carry the time and wall time, so older positions (and everything
//!   before a restart) are read back from the retained segments;
//! - the engine's **drop log** ([`dropped`]): `dropDatabase` records, whose
//!   database's WAL is gone.
//!
//! Invariants:
//! - the tail is sorted by time, and every final record (time `<=`
//!   [`ClusterClock::stable`]) with a time above [`ChangeHub::covers_from`]
//!   is in it: the writer adds a record to the tail *before* marking its
//!   time done, and the tail forgets records only from the front, raising
//!   `covers_from` to the time of the last one it forgot;
//! - the tail keeps records only once [`ChangeHub::activate`] ran (the first
//!   change stream of the process): before, a group's record is dropped and
//!   `covers_from`/`evicted_upto` pass its time, so a process that never
//!   streams keeps no old versions alive and databases without a WAL have
//!   history from the first stream on (an older resume point is 286, never
//!   a silent skip);
//! - the writer never waits for a reader: adding to the tail takes one
//!   short lock and evicts what passes the byte bound; readers copy `Arc`s
//!   out under the same lock.

pub mod clock;
pub mod diff;
pub mod dropped;
pub mod history;

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::{Condvar, Mutex};

pub use clock::{ClusterClock, Stamp};

use super::effect::Effect;

/// Default bound of the in-memory tail (`--change-tail-mb` is not a flag:
/// durable databases read older records from their WAL).
pub const DEFAULT_TAIL_BYTES: usize = 64 << 20;

/// What a record stands for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RecordKind {
    /// A writer group (its effects).
    Group,
    /// The database was dropped (never in a WAL: its directory went with
    /// it; the engine's drop log keeps it, `dropped.rs`). Its effects are a
    /// `DropCollection` per collection it held, reported before the
    /// `dropDatabase` event.
    DropDatabase,
}

/// One committed writer group of one database (or a database drop).
#[derive(Debug)]
pub struct ChangeRecord {
    pub db: Arc<str>,
    pub ts: u64,
    pub wall_ms: i64,
    pub kind: RecordKind,
    pub effects: Vec<Effect>,
    /// Approximate bytes the record keeps alive (its documents counted whole).
    pub bytes: usize,
}

impl ChangeRecord {
    pub fn group(db: Arc<str>, stamp: Stamp, effects: Vec<Effect>) -> ChangeRecord {
        let bytes = 96 + effects.iter().map(effect_bytes).sum::<usize>();
        ChangeRecord {
            db,
            ts: stamp.ts,
            wall_ms: stamp.wall_ms,
            kind: RecordKind::Group,
            effects,
            bytes,
        }
    }
}

fn effect_bytes(e: &Effect) -> usize {
    let pre = e.pre_image().map_or(0, |d| d.as_bytes().len());
    64 + pre
        + match e {
            Effect::Update { doc, desc, .. } => doc.as_bytes().len() + desc.as_bytes().len(),
            Effect::TxnBegin { origin } => origin.as_bytes().len(),
            other => other.as_put().map_or(0, |(_, d)| d.as_bytes().len()),
        }
}

struct Tail {
    records: VecDeque<Arc<ChangeRecord>>,
    bytes: usize,
    /// Every final record with a time above this is in `records`.
    covers_from: u64,
    /// The time of the newest record evicted (0: none yet).
    evicted_upto: u64,
}

/// The process-wide change hub: the cluster clock, the tail and the wake-up
/// of waiting readers. Shared by every database of an [`crate::Engine`].
pub struct ChangeHub {
    pub clock: ClusterClock,
    tail: Mutex<Tail>,
    limit_bytes: usize,
    /// Records are kept (see [`ChangeHub::activate`]); set under `tail`.
    active: AtomicBool,
    /// Bumped on every record added; waiters sleep on `wake`.
    seq: Mutex<u64>,
    wake: Condvar,
}

impl Default for ChangeHub {
    fn default() -> Self {
        ChangeHub::new(DEFAULT_TAIL_BYTES)
    }
}

impl ChangeHub {
    pub fn new(limit_bytes: usize) -> ChangeHub {
        ChangeHub {
            clock: ClusterClock::new(),
            tail: Mutex::new(Tail {
                records: VecDeque::new(),
                bytes: 0,
                covers_from: 0,
                evicted_upto: 0,
            }),
            limit_bytes: limit_bytes.max(1),
            active: AtomicBool::new(false),
            seq: Mutex::new(0),
            wake: Condvar::new(),
        }
    }

    /// After recovery: the tail covers only what comes after every time on
    /// disk (older records are read from the WALs).
    pub fn start_after_recovery(&self) {
        let last = self.clock.last();
        let mut t = self.tail.lock();
        t.covers_from = t.covers_from.max(last);
    }

    /// Add a published group's record, then mark its time done and wake
    /// readers. Requires: `rec.ts` came from this hub's `tick` and is in flight.
    pub fn publish(&self, rec: ChangeRecord) {
        let ts = rec.ts;
        {
            let mut t = self.tail.lock();
            if !self.active.load(Ordering::Relaxed) {
                Self::forget(&mut t, ts);
                drop(t);
                self.clock.done(ts);
                self.notify();
                return;
            }
            t.bytes += rec.bytes;
            let rec = Arc::new(rec);
            // Groups of different databases finish out of time order, but
            // only by the few groups in flight: insert from the back.
            let pos = t
                .records
                .iter()
                .rposition(|r| r.ts < ts)
                .map_or(0, |p| p + 1);
            t.records.insert(pos, rec);
            while t.bytes > self.limit_bytes && t.records.len() > 1 {
                if let Some(old) = t.records.pop_front() {
                    t.bytes -= old.bytes;
                    t.covers_from = t.covers_from.max(old.ts);
                    t.evicted_upto = t.evicted_upto.max(old.ts);
                }
            }
        }
        self.clock.done(ts);
        self.notify();
    }

    /// Keep every record from now on (a change stream opened). Records of
    /// groups whose time was taken before may still be dropped: a stream
    /// starting now starts after [`ClusterClock::last`], past them.
    pub fn activate(&self) {
        let _t = self.tail.lock();
        self.active.store(true, Ordering::Relaxed);
    }

    /// Whether records are kept: the writer records effects for the tail
    /// only then (a group recorded without them is [`Self::skip`]ped).
    pub fn is_active(&self) -> bool {
        self.active.load(Ordering::Relaxed)
    }

    /// A published group whose effects were not recorded (no WAL, and the
    /// tail was not active when it started): like a dropped record.
    pub fn skip(&self, ts: u64) {
        Self::forget(&mut self.tail.lock(), ts);
        self.clock.done(ts);
        self.notify();
    }

    /// The tail no longer covers time `ts` or before.
    fn forget(t: &mut Tail, ts: u64) {
        t.covers_from = t.covers_from.max(ts);
        t.evicted_upto = t.evicted_upto.max(ts);
    }

    /// A time taken by `tick` whose group was not published (its append
    /// failed, or nothing committed).
    pub fn abandon(&self, ts: u64) {
        self.clock.done(ts);
        self.notify();
    }

    fn notify(&self) {
        *self.seq.lock() += 1;
        self.wake.notify_all();
    }

    /// The wake-up counter: pass it to [`Self::wait`].
    pub fn seq(&self) -> u64 {
        *self.seq.lock()
    }

    /// Sleep until a record is added after `seen` (a [`Self::seq`] value)
    /// or `timeout` passes. Returns whether something was added.
    pub fn wait(&self, seen: u64, timeout: Duration) -> bool {
        let deadline = std::time::Instant::now() + timeout;
        let mut g = self.seq.lock();
        while *g == seen {
            if self.wake.wait_until(&mut g, deadline).timed_out() {
                break;
            }
        }
        *g != seen
    }

    /// Wake every waiter now (shutdown, a killed cursor).
    pub fn wake_all(&self) {
        self.notify();
    }

    /// Every final record with a time above this is in the tail.
    pub fn covers_from(&self) -> u64 {
        self.tail.lock().covers_from
    }

    /// The newest time the tail forgot (0 when it never forgot anything):
    /// databases without a WAL have lost their history up to it.
    pub fn evicted_upto(&self) -> u64 {
        self.tail.lock().evicted_upto
    }

    /// Records with a time in `(after, upto]`, oldest first, at most `max`;
    /// `None` when the tail does not reach back to `after` (read the WALs).
    pub fn records_after(
        &self,
        after: u64,
        upto: u64,
        max: usize,
    ) -> Option<Vec<Arc<ChangeRecord>>> {
        let t = self.tail.lock();
        if after < t.covers_from {
            return None;
        }
        let start = t.records.partition_point(|r| r.ts <= after);
        Some(
            t.records
                .iter()
                .skip(start)
                .take_while(|r| r.ts <= upto)
                .take(max)
                .cloned()
                .collect(),
        )
    }

    /// Bytes and records held by the tail (for `serverStatus`).
    pub fn tail_stats(&self) -> (usize, usize) {
        let t = self.tail.lock();
        (t.records.len(), t.bytes)
    }
}
