//! Background work of durable databases, shared by all of them: one flusher
//! thread (syncs `batch` records every flush interval) and one checkpointer
//! thread (size and time triggers) per process, started on the first
//! registration.
//!
//! Why shared: a thread pair per database made threads grow with the number
//! of databases (300 databases, 600 threads); a server hosts thousands. The
//! work itself is serial per database anyway, and idle databases cost one
//! atomic check per tick.
//!
//! Invariants:
//! - a database is worked on only while registered: dropping its
//!   [`Registration`] waits for work in flight on it (flush or checkpoint)
//!   and none starts afterwards, so once a database is closed nothing of it
//!   runs in the background (its directory may then be deleted);
//! - the threads never hold the registry lock while working, and take a
//!   database's state (`source`) before its work lock, so a database whose
//!   last handle is dropped on a background thread deregisters without
//!   waiting on itself;
//! - costs are shared too: a long checkpoint of one database delays the
//!   checkpoints of others (never their writes), and a slow fsync delays
//!   other databases' `batch` syncs beyond their interval.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock, Weak};
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};

use super::Durable;
use crate::store::DbState;

/// How often the checkpointer looks at each database's triggers.
const CHECKPOINT_POLL: Duration = Duration::from_millis(200);
/// Longest sleep of the flusher with nothing due (new registrations wake it).
const FLUSH_IDLE: Duration = Duration::from_secs(1);

type Source = Box<dyn Fn() -> Option<Arc<DbState>> + Send + Sync>;

struct Entry {
    id: u64,
    /// Weak: only the database keeps its durable side alive, so once it is
    /// closed its files and locks are released at once (a reopen right
    /// after a close must not find them held by a background thread).
    durable: Weak<Durable>,
    flush_interval: Duration,
    has_wal: bool,
    checkpoints: bool,
    /// The latest published state, or `None` once the database is gone.
    source: Source,
    /// Held while a background thread works on this database.
    busy: Mutex<()>,
    closed: AtomicBool,
    next_flush: Mutex<Instant>,
    last_checkpoint: Mutex<Instant>,
}

#[derive(Default)]
struct Registry {
    next_id: u64,
    entries: Vec<Arc<Entry>>,
    /// Bumped by every registration, so the flusher never sleeps past the
    /// first flush of a database registered while it was looking.
    generation: u64,
    /// Threads running (set once both started).
    running: bool,
}

struct Service {
    registry: Mutex<Registry>,
    /// Wakes the flusher when a registration may need an earlier flush.
    wake: Condvar,
}

fn service() -> &'static Service {
    static SERVICE: OnceLock<Service> = OnceLock::new();
    SERVICE.get_or_init(|| Service {
        registry: Mutex::new(Registry::default()),
        wake: Condvar::new(),
    })
}

/// A database's place in the background service. Dropping it deregisters
/// the database, after waiting for work in flight on it.
pub struct Registration {
    entry: Arc<Entry>,
}

impl Registration {
    /// Register a database. `source` yields its latest published state, or
    /// `None` once the database is gone.
    pub fn register(
        durable: &Arc<Durable>,
        source: impl Fn() -> Option<Arc<DbState>> + Send + Sync + 'static,
    ) -> Registration {
        let svc = service();
        let now = Instant::now();
        let mut reg = svc.registry.lock();
        reg.next_id += 1;
        let entry = Arc::new(Entry {
            id: reg.next_id,
            durable: Arc::downgrade(durable),
            flush_interval: durable.opts.flush_interval,
            has_wal: durable.wal.is_some(),
            checkpoints: durable.opts.background_checkpoints,
            source: Box::new(source),
            busy: Mutex::new(()),
            closed: AtomicBool::new(false),
            next_flush: Mutex::new(now + durable.opts.flush_interval),
            last_checkpoint: Mutex::new(now),
        });
        reg.entries.push(entry.clone());
        reg.generation += 1;
        if !reg.running {
            reg.running = start_threads();
        }
        drop(reg);
        svc.wake.notify_all();
        Registration { entry }
    }
}

impl Drop for Registration {
    fn drop(&mut self) {
        self.entry.closed.store(true, Ordering::Release);
        // Wait for a flush or checkpoint in flight on this database.
        drop(self.entry.busy.lock());
        let id = self.entry.id;
        service().registry.lock().entries.retain(|e| e.id != id);
    }
}

/// Databases registered now (tests).
pub fn registered() -> usize {
    service().registry.lock().entries.len()
}

fn start_threads() -> bool {
    let flusher = std::thread::Builder::new()
        .name("duet-wal-flush".into())
        .spawn(flush_loop);
    let checkpointer = std::thread::Builder::new()
        .name("duet-checkpoint".into())
        .spawn(checkpoint_loop);
    match (flusher, checkpointer) {
        (Ok(_), Ok(_)) => true,
        (f, c) => {
            // Out of threads: writes stay correct, but `batch` syncs and
            // automatic checkpoints wait until a later registration manages
            // to start the threads (a thread that did start keeps running).
            for e in [f.err(), c.err()].into_iter().flatten() {
                tracing::error!(error = %e, "could not start a background thread");
            }
            false
        }
    }
}

fn entries() -> (Vec<Arc<Entry>>, u64) {
    let reg = service().registry.lock();
    (reg.entries.clone(), reg.generation)
}

fn flush_loop() {
    let svc = service();
    loop {
        let now = Instant::now();
        let mut next = now + FLUSH_IDLE;
        let (list, generation) = entries();
        for e in list {
            if !e.has_wal {
                continue;
            }
            let due = *e.next_flush.lock();
            if due <= now {
                let busy = e.busy.lock();
                if !e.closed.load(Ordering::Acquire) {
                    if let Some(wal) = e.durable.upgrade().as_ref().and_then(|d| d.wal.as_ref()) {
                        if let Err(err) = wal.flush() {
                            tracing::error!(error = %err, "WAL flush failed");
                        }
                    }
                }
                drop(busy);
                *e.next_flush.lock() = now + e.flush_interval;
            }
            next = next.min(*e.next_flush.lock());
        }
        let mut reg = svc.registry.lock();
        let wait = next.saturating_duration_since(Instant::now());
        if !wait.is_zero() && reg.generation == generation {
            svc.wake.wait_for(&mut reg, wait);
        }
    }
}

fn checkpoint_loop() {
    loop {
        std::thread::sleep(CHECKPOINT_POLL);
        for e in entries().0 {
            if !e.checkpoints || e.closed.load(Ordering::Acquire) {
                continue;
            }
            // Before the work lock: dropping the last handle here deregisters.
            let Some(state) = (e.source)() else { continue };
            let _busy = e.busy.lock();
            if e.closed.load(Ordering::Acquire) {
                continue;
            }
            let Some(durable) = e.durable.upgrade() else {
                continue;
            };
            let last = *e.last_checkpoint.lock();
            if durable.checkpoint_due(last, state.csn) {
                if let Err(err) = durable.checkpoint(&state) {
                    tracing::error!(error = %err, "background checkpoint failed; will retry");
                }
                *e.last_checkpoint.lock() = Instant::now();
            }
            // `durable` goes before `_busy`: a deregistration waiting on the
            // work lock finds no strong reference left here.
            drop(durable);
        }
    }
}
