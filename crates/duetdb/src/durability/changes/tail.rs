//! The in-memory change tail: the most recent change records of every
//! database of the process, in time order, bounded in bytes, that readers
//! read without taking the writers' lock.
//!
//! Layout: an append-only log of slots (global index `0..len`) in chunks of
//! [`CHUNK`]; each slot holds a record once appended and is cleared when
//! the record is evicted (from the front only). The list of chunks is an
//! immutable `Vec` behind an [`ArcSwap`], replaced when a chunk is added or
//! dropped (once per [`CHUNK`] records); `len` is published after the slot
//! is filled. Writers (publishers of every database, `abandon`, `skip`)
//! serialize on one mutex that readers never take.
//!
//! Groups of different databases finish out of time order: a finished
//! record waits in `pending` (sorted) until every time below it is final
//! (the clock's `stable()`), then moves to the log — so the log is strictly
//! sorted by time and append-only. Readers bound their reads by
//! [`Tail::readable_upto`] = `min(stable, oldest pending − 1)`.
//!
//! Invariants:
//! - every final record with a time above `covers_from` is in the log or in
//!   `pending`; every record of time `<= readable_upto()` above `covers_from`
//!   is in the log;
//! - a writer raises `covers_from` *before* it clears an evicted slot or
//!   drops a chunk, and a reader re-reads `covers_from` *after* reading its
//!   slots: a reader that raced an eviction sees the raise and falls back to
//!   the logs ([`Tail::records_after`] returns `None`), never a silent gap;
//! - `bytes` (the live records' sizes) is at most the limit, or one record
//!   (the newest is always kept); a reader pins at most the chunk list it
//!   loaded, for the duration of one read.

use std::sync::atomic::{AtomicU64, Ordering::SeqCst};
use std::sync::Arc;

use arc_swap::{ArcSwap, ArcSwapOption};
use parking_lot::Mutex;

use super::clock::ClusterClock;
use super::ChangeRecord;

/// Slots per chunk.
const CHUNK: u64 = 1024;

struct Chunk {
    /// Global index of slot 0 (a multiple of [`CHUNK`]).
    base: u64,
    slots: Box<[ArcSwapOption<ChangeRecord>]>,
}

impl Chunk {
    fn new(base: u64) -> Chunk {
        Chunk {
            base,
            slots: (0..CHUNK).map(|_| ArcSwapOption::from(None)).collect(),
        }
    }
}

/// What only writers touch (under `Tail::writing`).
struct Writing {
    /// The writers' copy of the chunk list (published as `Tail::chunks`).
    chunks: Vec<Arc<Chunk>>,
    /// Index of the oldest live record.
    first: u64,
    /// `Tail::len`'s value.
    len: u64,
    /// Bytes of the live records.
    bytes: usize,
    /// Time of the newest record in the log.
    last_ts: u64,
    /// Finished records not yet final, sorted by time.
    pending: Vec<Arc<ChangeRecord>>,
}

/// See the module documentation.
pub struct Tail {
    chunks: ArcSwap<Vec<Arc<Chunk>>>,
    len: AtomicU64,
    /// Every final record with a time above this is in the tail.
    covers_from: AtomicU64,
    /// The time of the newest record forgotten (0: none yet).
    evicted_upto: AtomicU64,
    /// The oldest pending record's time (`u64::MAX`: none).
    pending_min: AtomicU64,
    writing: Mutex<Writing>,
    limit_bytes: usize,
}

impl Tail {
    pub fn new(limit_bytes: usize) -> Tail {
        Tail {
            chunks: ArcSwap::from_pointee(Vec::new()),
            len: AtomicU64::new(0),
            covers_from: AtomicU64::new(0),
            evicted_upto: AtomicU64::new(0),
            pending_min: AtomicU64::new(u64::MAX),
            writing: Mutex::new(Writing {
                chunks: Vec::new(),
                first: 0,
                len: 0,
                bytes: 0,
                last_ts: 0,
                pending: Vec::new(),
            }),
            limit_bytes: limit_bytes.max(1),
        }
    }

    /// The tail covers nothing at or before `ts`.
    pub fn cover_after(&self, ts: u64) {
        self.covers_from.fetch_max(ts, SeqCst);
    }

    /// Forget time `ts` (a group whose record is not kept): the tail no
    /// longer covers it or anything before.
    pub fn forget(&self, ts: u64) {
        self.covers_from.fetch_max(ts, SeqCst);
        self.evicted_upto.fetch_max(ts, SeqCst);
    }

    /// Finish the group of time `ts` (its record, if kept), mark the time
    /// done on `clock`, and move every record that became final to the log.
    /// Requires: `ts` is in flight on `clock`.
    pub fn finish(&self, clock: &ClusterClock, ts: u64, rec: Option<ChangeRecord>) {
        let mut w = self.writing.lock();
        if let Some(rec) = rec {
            debug_assert_eq!(rec.ts, ts);
            let pos = w.pending.partition_point(|r| r.ts < ts);
            w.pending.insert(pos, Arc::new(rec));
            // Before `done`: a reader that sees the time final sees it pending.
            self.pending_min.store(w.pending[0].ts, SeqCst);
        }
        clock.done(ts);
        let stable = clock.stable();
        let ready = w.pending.partition_point(|r| r.ts <= stable);
        if ready > 0 {
            let moved: Vec<Arc<ChangeRecord>> = w.pending.drain(..ready).collect();
            for rec in moved {
                self.append(&mut w, rec);
            }
            let min = w.pending.first().map_or(u64::MAX, |r| r.ts);
            self.pending_min.store(min, SeqCst);
        }
    }

    fn append(&self, w: &mut Writing, rec: Arc<ChangeRecord>) {
        if rec.ts <= w.last_ts {
            // A replicated group's time adopted below one already in the log
            // (`ClusterClock::adopt`): the log stays sorted by forgetting it —
            // readers from before it read the WAL, which has it.
            self.forget(rec.ts);
            return;
        }
        let idx = w.len;
        if idx.is_multiple_of(CHUNK) {
            w.chunks.push(Arc::new(Chunk::new(idx)));
            self.chunks.store(Arc::new(w.chunks.clone()));
        }
        w.bytes += rec.bytes;
        w.last_ts = rec.ts;
        if let Some(chunk) = w.chunks.last() {
            chunk.slots[(idx % CHUNK) as usize].store(Some(rec));
        }
        w.len = idx + 1;
        self.len.store(w.len, SeqCst);
        while w.bytes > self.limit_bytes && w.first + 1 < w.len {
            self.evict_first(w);
        }
    }

    fn evict_first(&self, w: &mut Writing) {
        let Some(front) = w.chunks.first().cloned() else {
            return;
        };
        debug_assert!(w.first >= front.base && w.first < front.base + CHUNK);
        let slot = &front.slots[(w.first % CHUNK) as usize];
        if let Some(old) = slot.load_full() {
            w.bytes -= old.bytes;
            // Raise the bound before the record disappears (module invariants).
            self.forget(old.ts);
        }
        slot.store(None);
        w.first += 1;
        if w.first.is_multiple_of(CHUNK) {
            w.chunks.remove(0);
            self.chunks.store(Arc::new(w.chunks.clone()));
        }
    }

    /// Every record with a time at or below this (and above
    /// [`Tail::covers_from`]) is in the log.
    pub fn readable_upto(&self, clock: &ClusterClock) -> u64 {
        // Stable first: a record whose time is final was pending before.
        let stable = clock.stable();
        let pending = self.pending_min.load(SeqCst);
        stable.min(pending.saturating_sub(1))
    }

    pub fn covers_from(&self) -> u64 {
        self.covers_from.load(SeqCst)
    }

    pub fn evicted_upto(&self) -> u64 {
        self.evicted_upto.load(SeqCst)
    }

    /// Records with a time in `(after, upto]`, oldest first, at most `max`;
    /// `None` when the tail does not reach back to `after` (read the WALs).
    /// Requires: `upto <= readable_upto()`.
    pub fn records_after(
        &self,
        after: u64,
        upto: u64,
        max: usize,
    ) -> Option<Vec<Arc<ChangeRecord>>> {
        if after < self.covers_from() {
            return None;
        }
        let len = self.len.load(SeqCst);
        let chunks = self.chunks.load();
        let mut out = Vec::new();
        if let Some(first) = chunks.first() {
            let lo = first.base;
            let get = |i: u64| -> Option<Arc<ChangeRecord>> {
                let chunk = chunks.get(((i - lo) / CHUNK) as usize)?;
                chunk.slots[(i % CHUNK) as usize].load_full()
            };
            // Evicted slots are at the front: they count as "not after".
            let (mut a, mut b) = (lo, len);
            while a < b {
                let mid = a + (b - a) / 2;
                match get(mid) {
                    Some(r) if r.ts > after => b = mid,
                    _ => a = mid + 1,
                }
            }
            let mut i = a;
            while i < len && out.len() < max {
                match get(i) {
                    Some(r) if r.ts <= upto => out.push(r),
                    // Newer than asked, or evicted under us (caught below).
                    _ => break,
                }
                i += 1;
            }
        }
        // An eviction that raced this read raised the bound first.
        if after < self.covers_from() {
            return None;
        }
        Some(out)
    }

    /// Live records and their bytes.
    pub fn stats(&self) -> (usize, usize) {
        let w = self.writing.lock();
        ((w.len - w.first) as usize, w.bytes)
    }

    /// Run `f` with the writers' lock held (activation must not race a
    /// publish deciding whether to keep its record).
    pub fn with_writers_locked<T>(&self, f: impl FnOnce() -> T) -> T {
        let _w = self.writing.lock();
        f()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::durability::changes::clock::Stamp;

    fn rec(stamp: Stamp, bytes: usize) -> ChangeRecord {
        let mut r = ChangeRecord::group(Arc::from("db"), stamp, Vec::new());
        r.bytes = bytes;
        r
    }

    #[test]
    fn out_of_order_finishes_become_readable_in_time_order() {
        let clock = ClusterClock::new();
        let tail = Tail::new(1 << 20);
        let a = clock.tick();
        let b = clock.tick();
        tail.finish(&clock, b.ts, Some(rec(b, 10)));
        assert!(tail.readable_upto(&clock) < a.ts, "b waits for a");
        let got = tail.records_after(0, tail.readable_upto(&clock), 10);
        assert_eq!(got.map(|v| v.len()), Some(0));
        tail.finish(&clock, a.ts, Some(rec(a, 10)));
        assert_eq!(tail.readable_upto(&clock), b.ts);
        let got = tail.records_after(0, b.ts, 10).expect("covered");
        let ts: Vec<u64> = got.iter().map(|r| r.ts).collect();
        assert_eq!(ts, vec![a.ts, b.ts]);
        // An abandoned time below a pending record releases it too.
        let c = clock.tick();
        let d = clock.tick();
        tail.finish(&clock, d.ts, Some(rec(d, 10)));
        tail.finish(&clock, c.ts, None);
        let got = tail.records_after(b.ts, tail.readable_upto(&clock), 10);
        assert_eq!(got.map(|v| v.len()), Some(1));
    }

    #[test]
    fn eviction_across_chunks_keeps_the_bound_and_reports_what_is_gone() {
        let clock = ClusterClock::new();
        // Room for 100 records of 10 bytes.
        let tail = Tail::new(1000);
        let mut times = Vec::new();
        for _ in 0..3 * CHUNK + 7 {
            let s = clock.tick();
            tail.finish(&clock, s.ts, Some(rec(s, 10)));
            times.push(s.ts);
        }
        assert_eq!(tail.stats(), (100, 1000));
        let upto = tail.readable_upto(&clock);
        let oldest_live = times[times.len() - 100];
        assert_eq!(tail.covers_from(), oldest_live - 2);
        assert!(tail.records_after(times[0], upto, 10).is_none());
        let got = tail
            .records_after(oldest_live - 2, upto, 1000)
            .expect("covered");
        assert_eq!(got.len(), 100);
        assert!(got.windows(2).all(|w| w[0].ts < w[1].ts));
        assert_eq!(got[0].ts, oldest_live);
        // Only the last two chunks are still held.
        assert_eq!(tail.chunks.load().len(), 2);
        let got = tail.records_after(times[times.len() - 3], upto, 1000);
        assert_eq!(got.map(|v| v.len()), Some(2));
    }

    #[test]
    fn a_record_older_than_the_log_end_is_forgotten_not_misplaced() {
        let clock = ClusterClock::new();
        let tail = Tail::new(1 << 20);
        let a = clock.tick();
        tail.finish(&clock, a.ts, Some(rec(a, 10)));
        // A replicated group adopted below `a`.
        let old = a.ts - 10;
        clock.adopt(old);
        tail.finish(
            &clock,
            old,
            Some(rec(
                Stamp {
                    ts: old,
                    wall_ms: 0,
                },
                10,
            )),
        );
        assert_eq!(tail.covers_from(), old);
        assert!(tail.records_after(old - 2, a.ts, 10).is_none());
        assert_eq!(tail.records_after(old, a.ts, 10).map(|v| v.len()), Some(1));
    }
}
