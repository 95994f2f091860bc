//! The background merger of delta indexing (`store::delta`) and the writer's
//! side of it.
//!
//! After applying a group, before publishing it, the leader calls
//! [`Merger::maintain`] on its working state:
//! 1. *install*: every merge the merger finished since is installed in the
//!    working state (the index's `tree` becomes the merged root, its
//!    `frozen` layer goes) when that layer is still the index's frozen one
//!    (`IndexState::install`); the group's publish reveals it, so the writer
//!    stays the only publisher and a published state never changes;
//! 2. *cut*: an index whose active layer reached `merge_at` entries and has
//!    no merge under way gets its active layer frozen and sent to the merger
//!    with the tree it tops (both immutable: the merger reads no shared
//!    mutable data);
//! 3. *back-pressure*: an index whose active layer reached `max_active`
//!    while its previous cut is still being merged folds that cut itself
//!    (`merge_frozen_here`, the writer paying the merge) and cuts again, so
//!    unmerged entries stay below about `2 × max_active` per index;
//! 4. with delta indexing off (a database switched off at run time), any
//!    remaining layers are folded into their trees here.
//!
//! One merger thread per database writer, started by the first cut: merges
//! of one database's indexes run one after another in cut order. DStore runs
//! a thread per index; on the two-core machines this runs on, more merge
//! threads than one would only take CPU from the writer they relieve, and a
//! single queue keeps the install order simple. The thread ends when the
//! writer (its queue's sender) is dropped.
//!
//! Merging does not need the writer: a finished merge waits in `done` until
//! the next group publishes it. With no further writes the last cut stays
//! unmerged in published states — correct (reads merge the layers), only
//! stale reads are staler; memory stays bounded since nothing grows.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc;
use std::sync::Arc;
use std::time::Instant;

use parking_lot::Mutex;

use crate::store::btree::BTree;
use crate::store::delta::{DeltaLayer, Entry};
use crate::store::DbState;

/// One merge to run: fold `layer` into `base`.
struct Job {
    coll: String,
    index: String,
    base: BTree<Entry, ()>,
    layer: Arc<DeltaLayer>,
    cut_at: Instant,
}

/// A finished merge, waiting for the writer to install it.
struct Done {
    coll: String,
    index: String,
    layer: Arc<DeltaLayer>,
    merged: BTree<Entry, ()>,
    cut_at: Instant,
}

/// Delta indexing figures of one database (`Database::delta_stats`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DeltaStats {
    /// Layers cut and sent to the merger.
    pub cuts: u64,
    /// Merges the merger finished.
    pub merged: u64,
    /// Entries those merges folded.
    pub merged_entries: u64,
    /// Merges installed by the writer (the rest were overtaken).
    pub installed: u64,
    /// Cuts the writer folded itself (back-pressure).
    pub writer_merges: u64,
    /// Microseconds the merger spent merging.
    pub merge_us: u64,
    /// Sum and maximum, over installed merges, of the time from the cut to
    /// the install (the merge lag), in microseconds.
    pub lag_us_total: u64,
    pub lag_us_max: u64,
}

#[derive(Default)]
struct Counters {
    cuts: AtomicU64,
    merged: AtomicU64,
    merged_entries: AtomicU64,
    installed: AtomicU64,
    writer_merges: AtomicU64,
    merge_us: AtomicU64,
    lag_us_total: AtomicU64,
    lag_us_max: AtomicU64,
}

/// The merger of one database and its queue of finished merges.
#[derive(Default)]
pub struct Merger {
    /// The job queue's sender; the thread starts with the first job.
    jobs: Mutex<Option<mpsc::Sender<Job>>>,
    done: Arc<Mutex<Vec<Done>>>,
    counters: Arc<Counters>,
}

impl Merger {
    pub fn stats(&self) -> DeltaStats {
        let c = &self.counters;
        let l = |a: &AtomicU64| a.load(Ordering::Relaxed);
        DeltaStats {
            cuts: l(&c.cuts),
            merged: l(&c.merged),
            merged_entries: l(&c.merged_entries),
            installed: l(&c.installed),
            writer_merges: l(&c.writer_merges),
            merge_us: l(&c.merge_us),
            lag_us_total: l(&c.lag_us_total),
            lag_us_max: l(&c.lag_us_max),
        }
    }

    /// Are merges queued, running or waiting to be installed? (Tests wait
    /// for quiet.)
    pub fn busy(&self) -> bool {
        let c = &self.counters;
        c.cuts.load(Ordering::Acquire) > c.merged.load(Ordering::Acquire)
            || !self.done.lock().is_empty()
    }

    fn send(&self, job: Job) {
        let mut jobs = self.jobs.lock();
        let tx = jobs.get_or_insert_with(|| {
            let (tx, rx) = mpsc::channel::<Job>();
            let done = self.done.clone();
            let counters = self.counters.clone();
            let spawned = std::thread::Builder::new()
                .name("duet-delta-merge".into())
                .spawn(move || run(rx, done, counters));
            if let Err(e) = spawned {
                tracing::warn!(error = %e, "no delta merge thread: the writer merges");
            }
            tx
        });
        if let Err(mpsc::SendError(job)) = tx.send(job) {
            // No thread (could not be started): merge here, as back-pressure would.
            let mut merged = job.base;
            job.layer.apply_to(&mut merged);
            self.done.lock().push(Done {
                coll: job.coll,
                index: job.index,
                layer: job.layer,
                merged,
                cut_at: job.cut_at,
            });
            self.counters.merged.fetch_add(1, Ordering::Release);
        }
    }

    /// The writer's step after a group (see the module doc). Requires:
    /// caller is the leader, `working` its working state, which it will
    /// publish.
    pub fn maintain(&self, working: &mut DbState) {
        let finished = std::mem::take(&mut *self.done.lock());
        let now = Instant::now();
        for d in finished {
            let installed = working
                .collection_mut(&d.coll)
                .and_then(|c| c.indexes.iter_mut().find(|i| i.spec.name == d.index))
                .is_some_and(|i| i.install(&d.layer, d.merged));
            if installed {
                let lag =
                    u64::try_from(now.duration_since(d.cut_at).as_micros()).unwrap_or(u64::MAX);
                let c = &self.counters;
                c.installed.fetch_add(1, Ordering::Relaxed);
                c.lag_us_total.fetch_add(lag, Ordering::Relaxed);
                c.lag_us_max.fetch_max(lag, Ordering::Relaxed);
            }
        }
        let opts = working.delta;
        // Which collections need a step: read-only first, so a group that
        // left every layer small copies nothing more.
        let due: Vec<String> = working
            .collections
            .iter()
            .filter(|(_, c)| {
                c.indexes.iter().any(|i| {
                    if !opts.on {
                        i.has_delta()
                    } else {
                        i.active.len() >= opts.merge_at
                    }
                })
            })
            .map(|(n, _)| n.clone())
            .collect();
        for name in due {
            let Some(c) = working.collection_mut(&name) else {
                continue;
            };
            for i in &mut c.indexes {
                if !opts.on {
                    i.fold();
                    continue;
                }
                if i.active.len() < opts.merge_at {
                    continue;
                }
                if i.frozen.is_some() && i.active.len() >= opts.max_active {
                    i.merge_frozen_here();
                    self.counters.writer_merges.fetch_add(1, Ordering::Release);
                }
                if let Some((base, layer)) = i.cut() {
                    self.counters.cuts.fetch_add(1, Ordering::Release);
                    self.send(Job {
                        coll: name.clone(),
                        index: i.spec.name.clone(),
                        base,
                        layer,
                        cut_at: now,
                    });
                }
            }
        }
    }
}

/// The merger thread: fold each job's layer into its base, in key order
/// (the layer is a B+tree: DStore's sorted delta buffer for free), and
/// leave the result for the writer.
fn run(rx: mpsc::Receiver<Job>, done: Arc<Mutex<Vec<Done>>>, counters: Arc<Counters>) {
    while let Ok(job) = rx.recv() {
        let t = Instant::now();
        let mut merged = job.base;
        job.layer.apply_to(&mut merged);
        let spent = u64::try_from(t.elapsed().as_micros()).unwrap_or(u64::MAX);
        counters
            .merged_entries
            .fetch_add(job.layer.len() as u64, Ordering::Relaxed);
        counters.merge_us.fetch_add(spent, Ordering::Relaxed);
        done.lock().push(Done {
            coll: job.coll,
            index: job.index,
            layer: job.layer,
            merged,
            cut_at: job.cut_at,
        });
        counters.merged.fetch_add(1, Ordering::Release);
    }
}
