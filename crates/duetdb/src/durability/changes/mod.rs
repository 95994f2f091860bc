//! The change log: every committed writer group of every database as a
//! record of effects stamped with a cluster time, for change streams.
//!
//! Sources (docs/design.md, "Change streams"):
//! - the **tail** ([`ChangeHub`], [`tail`]): the most recent records of all
//!   databases of the process in memory, ordered by time and bounded in
//!   bytes, read without the writers' lock; the writer adds each group after
//!   publishing it, and waiting readers are woken, coalesced ([`wake`]). It
//!   is the only history of databases without a WAL;
//! - the **WAL** of each durable database ([`history`]): version-2 records
//!   carry the time and wall time, so older positions (and everything
//!   before a restart) are read back from the retained segments;
//! - the engine's **drop log** ([`dropped`]): `dropDatabase` records, whose
//!   database's WAL is gone.
//!
//! Invariants:
//! - the tail is sorted by time, and every final record (time `<=`
//!   [`ChangeHub::readable_upto`]) with a time above
//!   [`ChangeHub::covers_from`] is in it: the writer adds a record to the
//!   tail's pending set *before* marking its time done and moves it to the
//!   log once every older time is final; the tail forgets records only from
//!   the front, raising `covers_from` to the time of the last one it forgot
//!   before the record disappears;
//! - the tail keeps records only once [`ChangeHub::activate`] ran (the first
//!   change stream of the process): before, a group's record is dropped and
//!   `covers_from`/`evicted_upto` pass its time, so a process that never
//!   streams keeps no old versions alive and databases without a WAL have
//!   history from the first stream on (an older resume point is 286, never
//!   a silent skip);
//! - the writer never waits for a reader: adding to the tail takes the
//!   writers' lock (publishers of other databases only) and evicts what
//!   passes the byte bound; readers take no lock of the writers (they load
//!   the tail's chunk list and slots, [`tail`]), and a publish wakes at most
//!   one waiting reader, at most once per wake-up round ([`wake`]).

pub mod clock;
pub mod diff;
pub mod dropped;
pub mod history;
pub mod tail;
pub mod wake;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

pub use clock::{ClusterClock, Stamp};
use tail::Tail;
use wake::{Wake, DEFAULT_WAKE_INTERVAL};

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

/// The process-wide change hub: the cluster clock, the tail and the wake-up
/// of waiting readers. Shared by every database of an [`crate::Engine`].
pub struct ChangeHub {
    pub clock: ClusterClock,
    tail: Tail,
    /// Records are kept (see [`ChangeHub::activate`]); set under the tail's
    /// writers' lock.
    active: AtomicBool,
    wake: Wake,
}

impl Default for ChangeHub {
    fn default() -> Self {
        ChangeHub::new(DEFAULT_TAIL_BYTES)
    }
}

impl ChangeHub {
    pub fn new(limit_bytes: usize) -> ChangeHub {
        ChangeHub::with_wake_interval(limit_bytes, DEFAULT_WAKE_INTERVAL)
    }

    /// A hub whose waiting readers are woken at most once per `interval`
    /// under a steady stream of publishes (`wake.rs`).
    pub fn with_wake_interval(limit_bytes: usize, interval: Duration) -> ChangeHub {
        ChangeHub {
            clock: ClusterClock::new(),
            tail: Tail::new(limit_bytes),
            active: AtomicBool::new(false),
            wake: Wake::new(interval),
        }
    }

    /// After recovery: the tail covers only what comes after every time on
    /// disk (older records are read from the WALs).
    pub fn start_after_recovery(&self) {
        self.tail.cover_after(self.clock.last());
    }

    /// Add a published group's record, then mark its time done and wake
    /// readers. Requires: `rec.ts` came from this hub's `tick` and is in flight.
    pub fn publish(&self, rec: ChangeRecord) {
        let ts = rec.ts;
        let keep = self.active.load(Ordering::SeqCst);
        if !keep {
            self.tail.forget(ts);
        }
        self.tail.finish(&self.clock, ts, keep.then_some(rec));
        self.wake.notify();
    }

    /// Keep every record from now on (a change stream opened). Records of
    /// groups whose time was taken before may still be dropped: a stream
    /// starting now starts after [`ClusterClock::last`], past them.
    pub fn activate(&self) {
        if !self.active.load(Ordering::SeqCst) {
            self.tail
                .with_writers_locked(|| self.active.store(true, Ordering::SeqCst));
        }
    }

    /// Whether records are kept: the writer records effects for the tail
    /// only then (a group recorded without them is [`Self::skip`]ped).
    pub fn is_active(&self) -> bool {
        self.active.load(Ordering::Relaxed)
    }

    /// A published group whose effects were not recorded (no WAL, and the
    /// tail was not active when it started): like a dropped record.
    pub fn skip(&self, ts: u64) {
        self.tail.forget(ts);
        self.tail.finish(&self.clock, ts, None);
        self.wake.notify();
    }

    /// A time taken by `tick` whose group was not published (its append
    /// failed, or nothing committed).
    pub fn abandon(&self, ts: u64) {
        self.tail.finish(&self.clock, ts, None);
        self.wake.notify();
    }

    /// The wake-up counter: pass it to [`Self::wait`].
    pub fn seq(&self) -> u64 {
        self.wake.seq()
    }

    /// Sleep until a record is added after `seen` (a [`Self::seq`] value)
    /// or `timeout` passes. Returns whether something was added.
    pub fn wait(&self, seen: u64, timeout: Duration) -> bool {
        self.wake.wait(seen, Some(timeout))
    }

    /// Wake every waiter now (shutdown, a killed cursor).
    pub fn wake_all(&self) {
        self.wake.wake_all();
    }

    /// Every final record with a time above this is in the tail.
    pub fn covers_from(&self) -> u64 {
        self.tail.covers_from()
    }

    /// The newest time the tail forgot (0 when it never forgot anything):
    /// databases without a WAL have lost their history up to it.
    pub fn evicted_upto(&self) -> u64 {
        self.tail.evicted_upto()
    }

    /// Readers stop here: every change with a time at or below it is final
    /// and, above [`Self::covers_from`], readable in the tail (at most the
    /// clock's stable time; below it while a finished group waits for an
    /// older one in flight).
    pub fn readable_upto(&self) -> u64 {
        self.tail.readable_upto(&self.clock)
    }

    /// Records with a time in `(after, upto]`, oldest first, at most `max`;
    /// `None` when the tail does not reach back to `after` (read the WALs).
    /// Requires: `upto <= self.readable_upto()` (read before).
    pub fn records_after(
        &self,
        after: u64,
        upto: u64,
        max: usize,
    ) -> Option<Vec<Arc<ChangeRecord>>> {
        self.tail.records_after(after, upto, max)
    }

    /// Bytes and records held by the tail (for `serverStatus`).
    pub fn tail_stats(&self) -> (usize, usize) {
        self.tail.stats()
    }
}
