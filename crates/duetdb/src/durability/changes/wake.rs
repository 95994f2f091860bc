//! Coalesced wake-ups of change-stream readers waiting for the next publish.
//!
//! Readers wait for a sequence number to move ([`Wake::seq`], then
//! [`Wake::wait`]); every publish bumps it ([`Wake::notify`]). The writer
//! must not pay per waiting reader, nor contend with them: with 64 streams
//! waiting, a publish that woke each of them (a `notify_all` under the lock
//! every woken reader takes again) cost the writer 87 % of its throughput
//! (BENCHMARKS.md, change streams). So a publish wakes **one** sleeper, and
//! only when no wake-up round is already on its way; that sleeper (the
//! round's *leader*) waits out the coalescing interval since the previous
//! round (never past its own deadline), then wakes every other sleeper.
//! Each woken reader reads everything published up to then in one go, so
//! under a steady update stream each reader wakes at most once per interval
//! however fast the writer commits, and an idle stream is woken at once.
//!
//! Protocol (`pending` = a round is on its way):
//! - `notify`: bump `seq`; if nobody is `registered`, done (a reader that
//!   registers later checks `seq` after registering: SeqCst on both sides,
//!   so one of the two sees the other); else if `pending` was already set,
//!   done (the round's leader will wake everyone); else, under the state
//!   lock, `notify_one` when someone sleeps, or clear `pending` when every
//!   registered reader is still awake (each checks `seq` under the lock
//!   before it sleeps, so it sees the bump).
//! - `wait`: register, then under the lock: leave if `seq` moved or the
//!   deadline passed; else count itself `sleeping` and sleep on the condvar.
//!   Every time it wakes (notified, timed out or spurious) and finds
//!   `pending` set, it leads: waits out the interval, clears `pending` and
//!   `notify_all`s.
//!
//! Invariants:
//! - no lost wake-up: while `pending` is set, some thread that was counted
//!   `sleeping` when it was set will wake (the `notify_one`, or its own
//!   timeout it already returned from) and see it, so `pending` is always
//!   cleared and followed by a `notify_all`; a reader whose `seen` is older
//!   than `seq` never sleeps (checked under the lock the notifier takes);
//! - the writer's cost per publish is one `fetch_add` and one load when no
//!   one waits, plus one `swap` when someone does, plus one lock and one
//!   `notify_one` at most once per round;
//! - no busy polling: a reader sleeps until notified or its deadline, and a
//!   leader sleeps once per round.
//!
//! The body is written once (`wake_body!`) and built twice: with `std`'s
//! primitives for the engine, and (tests) with `shuttle`'s, whose
//! randomized scheduler checks the protocol (`model` tests below: untimed
//! waits, so a lost wake-up is a deadlock shuttle reports).

use std::time::Duration;

/// How long a round's leader waits since the previous round before it wakes
/// the other readers. Bounds each waiting reader to ~1,000 wake-ups per
/// second under a steady update stream (the event lag it adds is at most
/// this, and only under load: an idle stream's first event wakes it at once).
pub const DEFAULT_WAKE_INTERVAL: Duration = Duration::from_millis(1);

macro_rules! wake_body {
    () => {
        use std::time::{Duration, Instant};

        use sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering::SeqCst};
        use sync::{Condvar, Mutex, MutexGuard};

        struct State {
            /// Readers asleep on `cv` (counted under the lock).
            sleeping: usize,
            /// When the last round's `notify_all` ran.
            last_round: Option<Instant>,
        }

        /// See the module documentation.
        pub struct Wake {
            seq: AtomicU64,
            /// Readers inside `wait`.
            registered: AtomicUsize,
            /// A round's wake-up is on its way.
            pending: AtomicBool,
            state: Mutex<State>,
            cv: Condvar,
            interval: Duration,
        }

        impl Wake {
            pub fn new(interval: Duration) -> Wake {
                Wake {
                    seq: AtomicU64::new(0),
                    registered: AtomicUsize::new(0),
                    pending: AtomicBool::new(false),
                    state: Mutex::new(State {
                        sleeping: 0,
                        last_round: None,
                    }),
                    cv: Condvar::new(),
                    interval,
                }
            }

            fn lock(&self) -> MutexGuard<'_, State> {
                // The state is two counters: a panic elsewhere leaves it usable.
                self.state.lock().unwrap_or_else(|e| e.into_inner())
            }

            /// The sequence number: read it before looking for news, then pass
            /// it to [`Wake::wait`].
            pub fn seq(&self) -> u64 {
                self.seq.load(SeqCst)
            }

            /// Something was published: wake waiting readers (coalesced).
            pub fn notify(&self) {
                self.seq.fetch_add(1, SeqCst);
                if self.registered.load(SeqCst) == 0 || self.pending.swap(true, SeqCst) {
                    return;
                }
                let st = self.lock();
                if st.sleeping == 0 {
                    self.pending.store(false, SeqCst);
                } else {
                    self.cv.notify_one();
                }
            }

            /// Wake every waiting reader now (shutdown, a killed cursor).
            pub fn wake_all(&self) {
                self.seq.fetch_add(1, SeqCst);
                let _st = self.lock();
                self.cv.notify_all();
            }

            /// Sleep until `seq` moves past `seen` or `timeout` passes (`None`:
            /// no timeout). Returns whether it moved.
            pub fn wait(&self, seen: u64, timeout: Option<Duration>) -> bool {
                let deadline = timeout.map(|t| Instant::now() + t);
                self.registered.fetch_add(1, SeqCst);
                let mut st = self.lock();
                let moved = loop {
                    if self.seq.load(SeqCst) != seen {
                        break true;
                    }
                    let left = match deadline {
                        None => None,
                        Some(d) => match d.checked_duration_since(Instant::now()) {
                            Some(left) if !left.is_zero() => Some(left),
                            _ => break false,
                        },
                    };
                    st.sleeping += 1;
                    st = match left {
                        None => self.cv.wait(st).unwrap_or_else(|e| e.into_inner()),
                        Some(left) => {
                            self.cv
                                .wait_timeout(st, left)
                                .unwrap_or_else(|e| e.into_inner())
                                .0
                        }
                    };
                    st.sleeping -= 1;
                    if self.pending.load(SeqCst) {
                        drop(st);
                        self.lead(deadline);
                        st = self.lock();
                    }
                };
                drop(st);
                self.registered.fetch_sub(1, SeqCst);
                moved
            }

            /// Finish the round on its way: wait out the interval since the
            /// previous one (not past `deadline`), then wake everyone.
            fn lead(&self, deadline: Option<Instant>) {
                if !self.interval.is_zero() {
                    let last = self.lock().last_round;
                    if let Some(last) = last {
                        let mut until = last + self.interval;
                        if let Some(d) = deadline {
                            until = until.min(d);
                        }
                        if let Some(nap) = until.checked_duration_since(Instant::now()) {
                            std::thread::sleep(nap);
                        }
                    }
                }
                if self.pending.swap(false, SeqCst) {
                    let mut st = self.lock();
                    if !self.interval.is_zero() {
                        st.last_round = Some(Instant::now());
                    }
                    self.cv.notify_all();
                }
            }
        }
    };
}

mod real {
    use std::sync;
    wake_body!();
}

pub use real::Wake;

impl Default for Wake {
    fn default() -> Self {
        Wake::new(DEFAULT_WAKE_INTERVAL)
    }
}

#[cfg(test)]
mod model {
    //! The protocol under shuttle's randomized scheduler: readers with
    //! untimed waits must see every bump (a lost wake-up deadlocks, which
    //! shuttle reports), whatever the interleaving.

    #[allow(dead_code)] // `wake_all` is the engine's, not the model's.
    mod shuttled {
        use shuttle::sync;
        wake_body!();
    }

    use shuttle::sync::atomic::{AtomicU64, Ordering::SeqCst};
    use shuttle::sync::Arc;
    use shuttle::thread;
    use shuttled::Wake;

    /// `readers` readers each wait until they saw `publishes` publishes of a
    /// writer (the published count is the "log": a reader reads it after
    /// taking `seq`, exactly as a change stream reads the tail).
    fn scenario(readers: usize, publishes: u64) {
        let wake = Arc::new(Wake::new(std::time::Duration::ZERO));
        let log = Arc::new(AtomicU64::new(0));
        let mut handles = Vec::new();
        for _ in 0..readers {
            let (wake, log) = (wake.clone(), log.clone());
            handles.push(thread::spawn(move || {
                let mut read = 0;
                while read < publishes {
                    let seen = wake.seq();
                    let now = log.load(SeqCst);
                    assert!(now >= read, "the log went back");
                    if now > read {
                        read = now;
                        continue;
                    }
                    wake.wait(seen, None);
                }
            }));
        }
        let writer = {
            let (wake, log) = (wake.clone(), log.clone());
            thread::spawn(move || {
                for _ in 0..publishes {
                    log.fetch_add(1, SeqCst);
                    wake.notify();
                }
            })
        };
        writer.join().expect("writer");
        for h in handles {
            h.join().expect("reader");
        }
    }

    #[test]
    fn no_lost_wake_up_with_one_reader() {
        shuttle::check_random(|| scenario(1, 3), 2000);
    }

    #[test]
    fn no_lost_wake_up_with_three_readers() {
        shuttle::check_random(|| scenario(3, 3), 2000);
    }

    #[test]
    fn no_lost_wake_up_under_pct() {
        shuttle::check_pct(|| scenario(3, 4), 2000, 3);
    }
}
