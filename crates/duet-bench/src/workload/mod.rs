//! The named workloads, each one body written against the capability it
//! needs from a target (`crate::targets`), and what they share: a run budget
//! (duration or operation count) checked by every client thread and a runner
//! that starts client threads (`ycsb`); the timed cell of writers beside
//! readers (`htap`, `ycsb-t`, `tpcch`); the pacing of an update stream; one
//! join loop. `ycsb-t` and `tpcch` run on the embedded engine only: they
//! drive its transactions directly.

pub mod changes;
pub mod delta;
pub mod htap;
pub mod index_build;
pub mod recovery;
pub mod snapshot;
pub mod space;
pub mod steam;
pub mod tpcch;
pub mod ycsb;
pub mod ycsbt;

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use anyhow::{anyhow, Result};

/// When a client thread stops: at the deadline, after its quota, or when told.
pub struct Budget {
    pub started: Instant,
    pub deadline: Instant,
    pub quota_per_thread: Option<u64>,
    pub stop: AtomicBool,
    /// Operations done by all threads (progress and live throughput).
    pub ops: AtomicU64,
}

impl Budget {
    pub fn new(seconds: f64, quota_per_thread: Option<u64>) -> Budget {
        let started = Instant::now();
        let deadline = match quota_per_thread {
            // An operation count bounds the run; the deadline is a safety net.
            Some(_) => started + Duration::from_secs(24 * 3600),
            None => started + Duration::from_secs_f64(seconds.max(0.0)),
        };
        Budget {
            started,
            deadline,
            quota_per_thread,
            stop: AtomicBool::new(false),
            ops: AtomicU64::new(0),
        }
    }

    /// May a thread that has done `done` operations start another?
    pub fn more(&self, done: u64) -> bool {
        if self.stop.load(Ordering::Relaxed) {
            return false;
        }
        match self.quota_per_thread {
            Some(q) => done < q,
            None => !done.is_multiple_of(16) || Instant::now() < self.deadline,
        }
    }

    pub fn count(&self, n: u64) {
        self.ops.fetch_add(n, Ordering::Relaxed);
    }
}

/// Paces one thread's share of an attempted rate: `rate` operations per
/// second over `threads` threads, 0 = as fast as possible. Late operations
/// are not skipped: a thread that fell behind catches up at full speed.
pub struct Pacer {
    interval: Option<Duration>,
    next_at: Instant,
}

impl Pacer {
    pub fn new(rate: u64, threads: usize) -> Pacer {
        Pacer {
            interval: (rate > 0)
                .then(|| Duration::from_secs_f64(threads.max(1) as f64 / rate as f64)),
            next_at: Instant::now(),
        }
    }

    /// Sleep until this thread's next operation is due.
    pub fn wait(&mut self) {
        if let Some(iv) = self.interval {
            let now = Instant::now();
            if self.next_at > now {
                std::thread::sleep(self.next_at - now);
            }
            self.next_at += iv;
        }
    }
}

/// Run `threads` clients of `body(thread_index, budget)` with a progress bar;
/// returns their results in thread order, or the first error.
pub fn run_clients<T: Send>(
    label: &str,
    threads: usize,
    budget: &Budget,
    quiet: bool,
    what: &str,
    body: impl Fn(usize, &Budget) -> Result<T> + Sync,
) -> Result<Vec<T>> {
    let finished = AtomicUsize::new(0);
    let all_done = AtomicBool::new(false);
    let threads = threads.max(1);
    let seconds = budget
        .deadline
        .saturating_duration_since(budget.started)
        .as_secs_f64();
    let quota_total = budget.quota_per_thread.map(|q| q * threads as u64);
    std::thread::scope(|s| {
        let handles: Vec<_> = (0..threads)
            .map(|t| {
                let body = &body;
                let finished = &finished;
                let all_done = &all_done;
                s.spawn(move || {
                    let r = body(t, budget);
                    if r.is_err() {
                        budget.stop.store(true, Ordering::Relaxed);
                    }
                    if finished.fetch_add(1, Ordering::AcqRel) + 1 == threads {
                        all_done.store(true, Ordering::Release);
                    }
                    r
                })
            })
            .collect();
        crate::progress::watch(
            label,
            seconds,
            quota_total,
            &budget.ops,
            &all_done,
            quiet,
            what,
        );
        handles
            .into_iter()
            .map(|h| h.join().map_err(|_| anyhow!("client thread panicked"))?)
            .collect()
    })
}

/// The clock of a timed cell (`htap`, `ycsb-t`, `tpcch`): writers work until
/// the deadline; readers loop until the writers have stopped, each
/// completing at least one read even when it outlasts the window.
pub struct CellClock {
    pub started: Instant,
    pub deadline: Instant,
    /// Writer operations so far (the bar's throughput).
    pub ops: AtomicU64,
    writers_done: AtomicBool,
}

impl CellClock {
    /// May a writer start another operation?
    pub fn writing(&self) -> bool {
        Instant::now() < self.deadline
    }

    /// May a writer that has completed `done` operations start another? At
    /// least one always runs, so a cell shorter than a thread's set-up (its
    /// connection and handshake on a loaded machine) still measures a write
    /// instead of reporting none.
    pub fn writing_after(&self, done: u64) -> bool {
        done == 0 || self.writing()
    }

    /// May a reader that has completed `done` reads start another?
    pub fn reading(&self, done: usize) -> bool {
        done == 0 || !self.writers_done.load(Ordering::Relaxed)
    }

    /// One writer operation done.
    pub fn count(&self) {
        self.ops.fetch_add(1, Ordering::Relaxed);
    }
}

/// What a timed cell's threads returned, in thread order, and the writers'
/// wall time (from the start until the last writer stopped).
pub struct CellRun<W, R> {
    pub writers: Vec<W>,
    pub readers: Vec<R>,
    pub wall_s: f64,
}

/// Run a timed cell of `seconds`: `writers` threads of `write(t, clock)` and
/// `readers` threads of `read(t, clock)`, with a bar of the writers'
/// throughput. Every thread is joined before it returns; the first error any
/// of them returned is the result.
pub fn timed_cell<W: Send, R: Send>(
    (label, seconds, quiet, what): (&str, f64, bool, &str),
    (writers, write): (usize, impl Fn(usize, &CellClock) -> Result<W> + Sync),
    (readers, read): (usize, impl Fn(usize, &CellClock) -> Result<R> + Sync),
) -> Result<CellRun<W, R>> {
    let started = Instant::now();
    let clock = CellClock {
        started,
        deadline: started + Duration::from_secs_f64(seconds.max(0.0)),
        ops: AtomicU64::new(0),
        writers_done: AtomicBool::new(false),
    };
    std::thread::scope(|s| {
        let (clock, write, read) = (&clock, &write, &read);
        let w: Vec<_> = (0..writers)
            .map(|t| s.spawn(move || write(t, clock)))
            .collect();
        let r: Vec<_> = (0..readers)
            .map(|t| s.spawn(move || read(t, clock)))
            .collect();
        crate::progress::watch_while(label, seconds, &clock.ops, quiet, what, || clock.writing());
        let mut first_err = None;
        let writers = join_all(w, "writer", &mut first_err)?;
        let wall_s = started.elapsed().as_secs_f64();
        clock.writers_done.store(true, Ordering::Relaxed);
        let readers = join_all(r, "reader", &mut first_err)?;
        match first_err {
            Some(e) => Err(e),
            None => Ok(CellRun {
                writers,
                readers,
                wall_s,
            }),
        }
    })
}

/// Join `handles` in order: the values of those that succeeded, the first
/// error into `first_err`; a panicked thread is an error at once.
pub fn join_all<T>(
    handles: Vec<std::thread::ScopedJoinHandle<'_, Result<T>>>,
    what: &str,
    first_err: &mut Option<anyhow::Error>,
) -> Result<Vec<T>> {
    let mut out = Vec::with_capacity(handles.len());
    for h in handles {
        match h.join().map_err(|_| anyhow!("{what} thread panicked"))? {
            Ok(v) => out.push(v),
            Err(e) => {
                first_err.get_or_insert(e);
            }
        }
    }
    Ok(out)
}

/// CPU time `clock` has counted so far (zero where it is unavailable).
fn cpu_clock(clock: libc::clockid_t) -> std::time::Duration {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec for the call's duration.
    let rc = unsafe { libc::clock_gettime(clock, &mut ts) };
    if rc != 0 {
        return std::time::Duration::ZERO;
    }
    std::time::Duration::new(
        u64::try_from(ts.tv_sec).unwrap_or(0),
        u32::try_from(ts.tv_nsec).unwrap_or(0),
    )
}

/// CPU time this thread has used so far (zero where the clock is unavailable).
pub(crate) fn thread_cpu() -> std::time::Duration {
    cpu_clock(libc::CLOCK_THREAD_CPUTIME_ID)
}

/// CPU time this process has used so far (zero where the clock is unavailable).
pub(crate) fn process_cpu() -> std::time::Duration {
    cpu_clock(libc::CLOCK_PROCESS_CPUTIME_ID)
}
