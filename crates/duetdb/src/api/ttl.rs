//! TTL: deleting documents whose indexed date has expired (MongoDB's TTL
//! monitor), through the writer like any client delete.
//!
//! A pass ([`Database::ttl_pass`]) looks at every TTL index of every
//! collection in one snapshot: the documents whose indexed date (the
//! earliest, for an array of dates; other values never expire) is older than
//! `now - expireAfterSeconds` and that match the index's partial filter are
//! found through the index, then deleted in batches of [`TTL_BATCH`]
//! documents, one delete command each — so each batch is one WAL record and
//! shows as ordinary deletes to change streams. Each delete re-checks the
//! expiry against the latest state, so a document updated since the
//! snapshot (a new date) is not deleted.
//!
//! [`TtlMonitor`] runs passes on one background thread per process (not per
//! database) every sleep interval (MongoDB's `ttlMonitorSleepSecs`, 60 s by
//! default), over the databases its source lists; [`TtlMonitor::run_pass`]
//! runs one now (tests, the server's test hook). Passes never overlap.
//!
//! Invariants:
//! - a pass deletes only documents expired at its `now` at the moment of
//!   their delete command (the command's filter says so);
//! - at most [`TTL_MAX_PER_INDEX_PASS`] documents per index per pass (the
//!   rest waits for the next pass), so one pass cannot hold the writer queue
//!   for long;
//! - dropping the monitor stops and joins its thread (unless the drop runs
//!   on that thread itself, which then ends on its own).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use bson::{doc, Bson, DateTime, Document, RawBson};
use parking_lot::{Condvar, Mutex};

use crate::api::Database;
use crate::error::Result;
use crate::query::planner::{self, Hint};
use crate::query::Filter;
use crate::store::index::IndexKind;

/// Documents per delete command of a pass.
pub const TTL_BATCH: usize = 1000;
/// Documents one TTL index may expire in one pass.
pub const TTL_MAX_PER_INDEX_PASS: usize = 100_000;
/// Seconds between passes by default (MongoDB's `ttlMonitorSleepSecs`).
pub const DEFAULT_TTL_SLEEP: Duration = Duration::from_secs(60);

/// What one pass did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TtlPass {
    pub deleted_documents: u64,
    /// TTL indexes looked at.
    pub indexes: u64,
}

/// `serverStatus.metrics.ttl`: passes run and documents deleted since start.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TtlCounters {
    pub passes: u64,
    pub deleted_documents: u64,
}

/// The expired-documents filter of one TTL index at `cutoff`.
fn expired_filter(field: &str, cutoff: DateTime, partial: Option<&Document>) -> Document {
    let mut expired = Document::new();
    expired.insert(field, doc! {"$lt": cutoff});
    match partial {
        Some(p) => doc! {"$and": [Bson::Document(expired), Bson::Document(p.clone())]},
        None => expired,
    }
}

impl Database {
    /// One TTL pass at `now` over this database; see the module doc.
    pub fn ttl_pass(&self, now: DateTime) -> Result<TtlPass> {
        let state = self.snapshot().state().clone();
        let mut pass = TtlPass::default();
        for (name, coll) in state.collections.iter() {
            for index in &coll.indexes {
                let spec = &index.spec;
                let Some(secs) = spec.expire_after_seconds else {
                    continue;
                };
                if !matches!(spec.kind, IndexKind::Ordered) || spec.fields.len() != 1 {
                    continue;
                }
                pass.indexes += 1;
                let field = &spec.fields[0].0;
                let cutoff = DateTime::from_millis(
                    now.timestamp_millis()
                        .saturating_sub(secs.saturating_mul(1000)),
                );
                let partial = spec.partial.as_ref().map(|p| &p.expr);
                let filter_doc = expired_filter(field, cutoff, partial);
                let filter = Filter::parse(&filter_doc)?;
                // Through the TTL index when the planner may use it (its
                // partial filter implied), else whatever the planner picks.
                let plan = planner::plan(coll, &filter, None, Some(&Hint::Name(spec.name.clone())))
                    .or_else(|_| planner::plan(coll, &filter, None, None))?;
                let mut ids: Vec<RawBson> = Vec::new();
                planner::execute(coll, &plan, &filter, |_, d| {
                    if let Some(id) = crate::doc::id_of(d) {
                        ids.push(id.into());
                    }
                    if ids.len() >= TTL_MAX_PER_INDEX_PASS {
                        std::ops::ControlFlow::Break(())
                    } else {
                        std::ops::ControlFlow::Continue(())
                    }
                })?;
                let target = self.collection(name);
                for batch in ids.chunks(TTL_BATCH) {
                    let in_ids: Vec<Bson> = batch
                        .iter()
                        .map(|id| Bson::try_from(id.clone()).unwrap_or(Bson::Null))
                        .collect();
                    let f = doc! {"$and": [
                        {"_id": {"$in": in_ids}},
                        Bson::Document(filter_doc.clone()),
                    ]};
                    pass.deleted_documents += target.delete_many(f)?;
                }
            }
        }
        Ok(pass)
    }
}

type Source = Box<dyn Fn() -> Vec<Database> + Send + Sync>;

struct Shared {
    source: Source,
    sleep: Mutex<Duration>,
    enabled: AtomicBool,
    stop: Mutex<bool>,
    wake: Condvar,
    /// Held for a whole pass: passes never overlap.
    running: Mutex<()>,
    passes: AtomicU64,
    deleted: AtomicU64,
}

impl Shared {
    fn pass(&self, now: DateTime) -> TtlPass {
        let _one_at_a_time = self.running.lock();
        let mut total = TtlPass::default();
        for db in (self.source)() {
            match db.ttl_pass(now) {
                Ok(p) => {
                    total.deleted_documents += p.deleted_documents;
                    total.indexes += p.indexes;
                }
                // A database dropped or closed meanwhile, writes stopped:
                // the next pass tries again.
                Err(e) => tracing::warn!(db = db.name(), error = %e, "TTL pass failed"),
            }
        }
        self.passes.fetch_add(1, Ordering::Relaxed);
        self.deleted
            .fetch_add(total.deleted_documents, Ordering::Relaxed);
        total
    }
}

/// The background TTL monitor: one thread, a pass every sleep interval.
pub struct TtlMonitor {
    shared: Arc<Shared>,
    thread: Option<JoinHandle<()>>,
}

impl std::fmt::Debug for TtlMonitor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TtlMonitor")
            .field("sleep", &*self.shared.sleep.lock())
            .field("counters", &self.counters())
            .finish()
    }
}

impl TtlMonitor {
    /// A monitor over the databases `source` lists at each pass; with
    /// `background`, its thread runs a pass every `sleep` (when the thread
    /// cannot be started, that is logged and [`TtlMonitor::has_thread`] says so).
    pub fn new(
        sleep: Duration,
        background: bool,
        source: impl Fn() -> Vec<Database> + Send + Sync + 'static,
    ) -> TtlMonitor {
        let shared = Arc::new(Shared {
            source: Box::new(source),
            sleep: Mutex::new(sleep),
            enabled: AtomicBool::new(true),
            stop: Mutex::new(false),
            wake: Condvar::new(),
            running: Mutex::new(()),
            passes: AtomicU64::new(0),
            deleted: AtomicU64::new(0),
        });
        let thread = if background {
            let s = shared.clone();
            match std::thread::Builder::new()
                .name("duet-ttl".into())
                .spawn(move || run(&s))
            {
                Ok(t) => Some(t),
                Err(e) => {
                    tracing::error!(error = %e, "cannot start the TTL monitor thread; expired documents are not deleted");
                    None
                }
            }
        } else {
            None
        };
        TtlMonitor { shared, thread }
    }

    /// Whether a background thread runs passes.
    pub fn has_thread(&self) -> bool {
        self.thread.is_some()
    }

    /// Run one pass now (at the wall clock), waiting for one in progress.
    pub fn run_pass(&self) -> TtlPass {
        self.shared.pass(DateTime::now())
    }

    /// Run one pass as if the time were `now` (tests).
    pub fn run_pass_at(&self, now: DateTime) -> TtlPass {
        self.shared.pass(now)
    }

    pub fn counters(&self) -> TtlCounters {
        TtlCounters {
            passes: self.shared.passes.load(Ordering::Relaxed),
            deleted_documents: self.shared.deleted.load(Ordering::Relaxed),
        }
    }

    pub fn sleep(&self) -> Duration {
        *self.shared.sleep.lock()
    }

    /// Change the interval; the next wait uses it.
    pub fn set_sleep(&self, sleep: Duration) {
        *self.shared.sleep.lock() = sleep;
        self.shared.wake.notify_all();
    }

    /// MongoDB's `ttlMonitorEnabled`: a disabled monitor's thread runs no
    /// passes ([`TtlMonitor::run_pass`] still does).
    pub fn set_enabled(&self, enabled: bool) {
        self.shared.enabled.store(enabled, Ordering::Relaxed);
    }

    pub fn enabled(&self) -> bool {
        self.shared.enabled.load(Ordering::Relaxed)
    }
}

fn run(shared: &Shared) {
    loop {
        {
            let mut stop = shared.stop.lock();
            if *stop {
                return;
            }
            let sleep = *shared.sleep.lock();
            shared.wake.wait_for(&mut stop, sleep);
            if *stop {
                return;
            }
        }
        if shared.enabled.load(Ordering::Relaxed) {
            shared.pass(DateTime::now());
        }
    }
}

impl Drop for TtlMonitor {
    fn drop(&mut self) {
        *self.shared.stop.lock() = true;
        self.shared.wake.notify_all();
        if let Some(t) = self.thread.take() {
            if t.thread().id() != std::thread::current().id() {
                let _ = t.join();
            }
        }
    }
}
