//! The single writer of a database and the publish protocol.
//!
//! Every mutation is a [`Command`] submitted to the database's writer queue.
//! Exactly one thread at a time holds the *writer role*: the submitter at the
//! front of the queue becomes the leader, takes a group of queued commands,
//! applies them in queue order to a private working copy of the published
//! [`DbState`], stamps each with the next commit sequence number (`csn`), and
//! publishes the new state with one atomic pointer swap. Then it hands each
//! submitter its reply and passes the role on. This is LevelDB's group-commit
//! writer: a single writer in effect (total commit order, no write locks on
//! data) without a thread hand-off when there is no contention.
//!
//! Invariants:
//! - at most one leader applies commands at any time (it is the queue front, and
//!   only the leader pops the queue);
//! - a group weighs at most [`MAX_GROUP`] (a command weighs 1, a batch its
//!   statements; a first command heavier than that is a group alone);
//! - a batch's statements are applied in order as commands of their own
//!   (each its csn, its effects, its undo when it fails); an ordered batch
//!   applies none after its first failure;
//! - `published.csn` grows strictly with every publish; a command's effects are
//!   visible exactly from the first state whose `csn` >= its own;
//! - a published state is never mutated again (copy-on-write working copy), so a
//!   reader that loaded it holds a consistent snapshot for as long as it likes;
//! - a command that fails changes nothing; a command that panics (a bug) poisons
//!   the writer: the group is not published and later submissions fail;
//! - every published collection satisfies `CollectionState::check_invariants`;
//! - every published group has a cluster time from the process's
//!   [`ChangeHub`] clock (strictly increasing in commit order), carried by
//!   its WAL record and its published state, and is added to the hub's change
//!   tail right after it is published (a failed group's time is abandoned);
//! - with a WAL, a group is appended to it (and synced when any of its
//!   commands asked for `fsync`) before it is published or acknowledged; a
//!   group whose append or sync fails is not published and all its commands
//!   fail (see `durability`).
//!
//! Debug builds execute the rules on failed commands and collection
//! invariants: a cheap fingerprint of the working state (per collection:
//! identity, size, bytes, next record id, entries per index) is compared
//! around every failed command, and after a group the collections it changed
//! are checked in full (see [`CHECK_ALWAYS_MAX`] for which, and when). A
//! violation panics, which poisons the writer like any bug.

use std::collections::VecDeque;
use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use arc_swap::ArcSwap;
use parking_lot::{Condvar, Mutex};

use crate::durability::changes::Stamp;
use crate::durability::changes::{ChangeHub, ChangeRecord};
use crate::durability::effect::{self, Effects};
use crate::durability::replicate::{Commit, GroupRecord, Replicate, Tagged};
use crate::durability::wal::{self, Record, SyncMode, Wal};
use crate::durability::Durability;
use crate::error::{Error, Result};
#[cfg(debug_assertions)]
use crate::store::collection::Fingerprint;
use crate::store::DbState;
use crate::write::command::{
    apply_command, Batch, BoundaryStep, Command, Reply, WriteOutcome, MAX_BATCH_STATEMENTS,
};

/// Most commands one leader applies before publishing (bounds reply
/// latency), a batch counting as its statements (`Command::weight`).
pub const MAX_GROUP: usize = 1024;

// A full batch fits one group: batching never makes a publish wait for more
// statements than a group of single commands would.
const _: () = assert!(MAX_BATCH_STATEMENTS <= MAX_GROUP);

/// Debug builds run `check_invariants` on the collections a group changed,
/// on the writer thread before publishing; collections of at most this many
/// records after every such group.
///
/// The check is O(n log n) — about 10 µs per record in a debug build — so
/// checking a collection of n records after every group makes n single
/// writes cost O(n²): with 1,500 records the snapshot checker's writers
/// managed 13× fewer writes and its scans hit their time limit. So:
/// - up to [`CHECK_ALWAYS_MAX`] records: after every group that changed it;
/// - up to [`CHECK_MAX_RECORDS`]: after a group that changed it when the
///   checks so far took less than 1/[`CHECK_BUDGET_DIVISOR`] of the time the
///   writer spent applying groups (the overhead stays bounded; a violation is
///   caught at the next check, since a broken collection stays broken);
/// - above: never (one check would stall the writer for too long).
#[cfg_attr(not(debug_assertions), allow(dead_code))]
pub const CHECK_ALWAYS_MAX: usize = 256;
/// See [`CHECK_ALWAYS_MAX`].
#[cfg_attr(not(debug_assertions), allow(dead_code))]
pub const CHECK_MAX_RECORDS: usize = 20_000;
/// See [`CHECK_ALWAYS_MAX`].
#[cfg_attr(not(debug_assertions), allow(dead_code))]
pub const CHECK_BUDGET_DIVISOR: u64 = 4;

struct Slot {
    command: Mutex<Option<Command>>,
    /// A record committed by the replica set, to apply as a group of its
    /// own (`solo`; [`Writer::apply_replicated`]) instead of a command.
    replicated: Mutex<Option<Replicated>>,
    /// The slot is a group by itself (a replicated record).
    solo: bool,
    /// The client operation the command belongs to (replicated with it).
    origin: Option<Arc<[u8]>>,
    /// The statement ids of the command's items in that operation
    /// (`Database::with_statements`; `None`: item `i` is statement `i`).
    stmts: Option<Arc<[u32]>>,
    /// Per-write durability (`None`: the database's default).
    durability: Option<Durability>,
    /// What the command weighs in a group (`Command::weight`).
    weight: usize,
    reply: Mutex<Option<Result<Reply>>>,
    /// The csn the command committed at (a batch: its last committed
    /// statement's; 0 when nothing committed).
    csn: AtomicU64,
    done: AtomicBool,
}

/// A record another member's writer made, and its exact bytes.
struct Replicated {
    record: Record,
    payload: Arc<[u8]>,
}

thread_local! {
    static LAST_CSN: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
}

/// The csn at which the last command this thread submitted committed (0 if it
/// failed). Lets a client order its own writes against snapshots (the checker
/// builds its model from it; the server reports it as operationTime).
pub fn last_commit_csn() -> u64 {
    LAST_CSN.with(|c| c.get())
}

/// The writer of one database.
pub struct Writer {
    db_name: Arc<str>,
    queue: Mutex<VecDeque<Arc<Slot>>>,
    wake: Condvar,
    published: ArcSwap<DbState>,
    poisoned: Mutex<Option<String>>,
    /// The write-ahead log, for durable databases.
    wal: Option<Arc<Wal>>,
    /// The process's cluster clock and change tail: every published group
    /// gets a time from it and is added to its tail (change streams).
    hub: Arc<ChangeHub>,
    /// The database's default durability.
    durability: Durability,
    /// The replica set every group's record must be committed by before it
    /// is logged and published here (`durability::replicate`); `None`
    /// outside a replica set.
    replicator: parking_lot::RwLock<Option<Arc<dyn Replicate>>>,
    /// Groups published and commands applied (successful or not), for
    /// `serverStatus`; relaxed counters, never used for ordering.
    groups: AtomicU64,
    commands: AtomicU64,
    largest_group: AtomicU64,
    /// Delta indexing's merger (`write::delta`): its finished merges are
    /// installed, and full layers cut, by each leader before it publishes.
    merger: crate::write::delta::Merger,
    /// Delta indexing's settings, copied into each group's working state
    /// (a setting of the writer, not data: never logged or checkpointed).
    delta: Mutex<crate::store::DeltaOptions>,
    /// Debug builds: nanoseconds spent applying groups and checking them.
    #[cfg(debug_assertions)]
    check_cost: (AtomicU64, AtomicU64),
}

/// Writer figures (`Database::writer_stats`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct WriterStats {
    /// Commands waiting for or being applied by the current leader.
    pub queue_len: u64,
    /// Groups led (one state publish each, when a command in it succeeded).
    pub groups: u64,
    pub commands: u64,
    pub largest_group: u64,
    pub csn: u64,
}

impl Writer {
    /// The change hub this writer's groups go to.
    pub(crate) fn hub(&self) -> &Arc<ChangeHub> {
        &self.hub
    }

    /// A writer with a change hub of its own (a database outside an Engine).
    #[cfg_attr(not(test), allow(dead_code))]
    pub fn new(db_name: &str, initial: DbState) -> Writer {
        Writer::with_hub(db_name, initial, Arc::new(ChangeHub::default()))
    }

    /// A writer stamping its groups with `hub`'s clock and adding them to
    /// its tail. Requires: `hub`'s clock has observed `initial.ts`.
    pub fn with_hub(db_name: &str, mut initial: DbState, hub: Arc<ChangeHub>) -> Writer {
        initial.db = Arc::from(db_name);
        hub.clock.observe(initial.ts);
        Writer {
            db_name: Arc::from(db_name),
            queue: Mutex::new(VecDeque::new()),
            wake: Condvar::new(),
            published: ArcSwap::from_pointee(initial),
            poisoned: Mutex::new(None),
            wal: None,
            hub,
            durability: Durability::None,
            replicator: parking_lot::RwLock::new(None),
            groups: AtomicU64::new(0),
            commands: AtomicU64::new(0),
            largest_group: AtomicU64::new(0),
            merger: Default::default(),
            delta: Mutex::new(crate::store::DeltaOptions::default()),
            #[cfg(debug_assertions)]
            check_cost: (AtomicU64::new(0), AtomicU64::new(0)),
        }
    }

    /// A writer that logs every group to `wal` before publishing it.
    pub fn with_wal(
        db_name: &str,
        initial: DbState,
        wal: Option<Arc<Wal>>,
        durability: Durability,
        hub: Arc<ChangeHub>,
    ) -> Writer {
        Writer {
            wal,
            durability,
            ..Writer::with_hub(db_name, initial, hub)
        }
    }

    pub fn db_name(&self) -> &str {
        &self.db_name
    }

    /// The latest published state: an O(1) consistent snapshot.
    pub fn published(&self) -> Arc<DbState> {
        self.published.load_full()
    }

    pub fn stats(&self) -> WriterStats {
        WriterStats {
            queue_len: self.queue.lock().len() as u64,
            groups: self.groups.load(Ordering::Relaxed),
            commands: self.commands.load(Ordering::Relaxed),
            largest_group: self.largest_group.load(Ordering::Relaxed),
            csn: self.published.load().csn,
        }
    }

    /// Delta indexing's settings from the next group on (switched off:
    /// the next group folds every index's layers into its tree).
    pub fn set_delta(&self, options: crate::store::DeltaOptions) {
        *self.delta.lock() = options;
    }

    pub fn delta(&self) -> crate::store::DeltaOptions {
        *self.delta.lock()
    }

    /// Delta indexing figures (merges, lag).
    pub fn delta_stats(&self) -> crate::write::delta::DeltaStats {
        self.merger.stats()
    }

    /// Are delta merges queued, running or waiting for a group to install them?
    pub fn delta_busy(&self) -> bool {
        self.merger.busy()
    }

    /// The write-ahead log, if the database has one.
    pub fn wal(&self) -> Option<&Arc<Wal>> {
        self.wal.as_ref()
    }

    /// From now on, commit every group through `replicator` before it is
    /// logged and published (see `durability::replicate`). Only databases
    /// with a WAL replicate.
    pub fn set_replicator(&self, replicator: Option<Arc<dyn Replicate>>) {
        *self.replicator.write() = replicator;
    }

    /// Apply one record the replica set committed (made by another member's
    /// writer, or by this one's before it lost its place) as a group of its
    /// own: the recovery replay of its effects, the same bytes appended to
    /// the WAL, then publish. `Ok(false)`: the record does not continue this
    /// database's log (it starts elsewhere than after the published csn) and
    /// was skipped — every member skips it alike, since every member applies
    /// the same records in the same order. A record whose effects do not
    /// apply means this member's state is not the set's: the writer stops.
    pub fn apply_replicated(&self, payload: Arc<[u8]>) -> Result<bool> {
        let record = wal::decode_record(&payload)
            .map_err(|e| Error::Internal(format!("replicated record does not decode: {}", e.0)))?;
        let slot = Arc::new(Slot {
            command: Mutex::new(None),
            replicated: Mutex::new(Some(Replicated { record, payload })),
            solo: true,
            origin: None,
            stmts: None,
            durability: None,
            weight: 1,
            reply: Mutex::new(None),
            csn: AtomicU64::new(0),
            done: AtomicBool::new(false),
        });
        match self.run_slot(slot)? {
            Reply::Existed(applied) => Ok(applied),
            other => Err(Error::Internal(format!(
                "unexpected reply to a replicated record: {other:?}"
            ))),
        }
    }

    /// Run `step` as the single writer at a commit boundary (between two
    /// commands of a group) on the working state, and wait until its group is
    /// published. This is how higher layers (scan registration, transaction
    /// commit) act atomically with respect to every write without the writer
    /// knowing them. The step follows the command contract: on `Err` it must
    /// have changed nothing.
    pub fn at_boundary<R: Send + 'static>(
        &self,
        step: impl FnOnce(&mut DbState, &mut Effects) -> Result<R> + Send + 'static,
    ) -> Result<R> {
        self.at_boundary_tagged(None, step)
    }

    /// [`Writer::at_boundary`] for a step of client operation `origin` (a
    /// transaction's commit: see `Transaction::tag`).
    pub fn at_boundary_tagged<R: Send + 'static>(
        &self,
        origin: Option<Arc<[u8]>>,
        step: impl FnOnce(&mut DbState, &mut Effects) -> Result<R> + Send + 'static,
    ) -> Result<R> {
        let boxed = BoundaryStep(Box::new(move |state, fx| {
            step(state, fx).map(|r| Box::new(r) as Box<dyn std::any::Any + Send>)
        }));
        match self.submit_tagged(Command::AtBoundary(boxed), None, origin)? {
            Reply::Boundary(r) => {
                r.0.downcast::<R>()
                    .map(|r| *r)
                    .map_err(|_| Error::Internal("boundary step returned another type".into()))
            }
            other => Err(Error::Internal(format!(
                "unexpected reply to a boundary step: {other:?}"
            ))),
        }
    }

    /// Execute `command` as the single writer and wait until it is published
    /// (the unit tests' entry; the engine's goes through `submit_tagged`).
    #[cfg(test)]
    pub fn submit(&self, command: Command) -> Result<Reply> {
        self.submit_tagged(command, None, None)
    }

    /// Execute `command` as the single writer, with a per-write durability
    /// (`None`: the default), as client operation `origin` (see
    /// `Database::with_origin`), and wait until it is published.
    pub fn submit_tagged(
        &self,
        command: Command,
        durability: Option<Durability>,
        origin: Option<Arc<[u8]>>,
    ) -> Result<Reply> {
        self.submit_at(command, durability, origin, None)
    }

    /// [`Writer::submit_tagged`] of a command whose items are statements
    /// `stmts` of client operation `origin` (recorded with its outcome).
    pub fn submit_at(
        &self,
        command: Command,
        durability: Option<Durability>,
        origin: Option<Arc<[u8]>>,
        stmts: Option<Arc<[u32]>>,
    ) -> Result<Reply> {
        if let Some(wal) = &self.wal {
            wal.check_writable()?;
        }
        let slot = Arc::new(Slot {
            weight: command.weight(),
            command: Mutex::new(Some(command)),
            replicated: Mutex::new(None),
            solo: false,
            origin,
            stmts,
            durability,
            reply: Mutex::new(None),
            csn: AtomicU64::new(0),
            done: AtomicBool::new(false),
        });
        self.run_slot(slot)
    }

    /// Queue `slot`, lead its group when it reaches the front, and return
    /// its reply.
    fn run_slot(&self, slot: Arc<Slot>) -> Result<Reply> {
        if let Some(why) = self.poisoned.lock().clone() {
            return Err(Error::Internal(format!(
                "writer stopped after a bug: {why}"
            )));
        }
        let mut queue = self.queue.lock();
        queue.push_back(slot.clone());
        loop {
            if slot.done.load(Ordering::Acquire) {
                drop(queue);
                return take_reply(&slot);
            }
            if queue.front().is_some_and(|f| Arc::ptr_eq(f, &slot)) {
                break;
            }
            self.wake.wait(&mut queue);
        }
        // Leader: take a group, release the queue so others can enqueue
        // meanwhile. A replicated record is a group of its own.
        let group: Vec<Arc<Slot>> = if slot.solo {
            vec![slot.clone()]
        } else {
            let mut weight = 0usize;
            queue
                .iter()
                .take_while(|s| {
                    weight += s.weight;
                    !s.solo && (weight <= MAX_GROUP || Arc::ptr_eq(s, &slot))
                })
                .cloned()
                .collect()
        };
        drop(queue);
        debug_assert!(!group.is_empty(), "a leader leads its own command");
        // Counted in statements: a batch's are commands as they were.
        let weight: usize = group.iter().map(|s| s.weight).sum();
        self.groups.fetch_add(1, Ordering::Relaxed);
        self.commands.fetch_add(weight as u64, Ordering::Relaxed);
        self.largest_group
            .fetch_max(weight as u64, Ordering::Relaxed);
        if slot.solo {
            self.lead_replicated(&slot);
        } else {
            self.lead(&group);
        }
        let mut queue = self.queue.lock();
        for s in &group {
            let popped = queue.pop_front();
            debug_assert!(
                popped.is_some_and(|p| Arc::ptr_eq(&p, s)),
                "queue order broken"
            );
            s.done.store(true, Ordering::Release);
        }
        self.wake.notify_all();
        drop(queue);
        take_reply(&slot)
    }

    /// Check the collections of `after` that are not the same version as in
    /// `before` (the state the group started from), as [`CHECK_ALWAYS_MAX`]
    /// says. Requires: caller is leader (the cost counters are its own).
    #[cfg(debug_assertions)]
    fn check_changed(&self, before: &DbState, after: &DbState) {
        let (applying, checking) = &self.check_cost;
        for (name, c) in after.collections.iter() {
            if before.collection(name).is_some_and(|b| c.same_version(b)) {
                continue;
            }
            let within_budget = checking.load(Ordering::Relaxed) * CHECK_BUDGET_DIVISOR
                < applying.load(Ordering::Relaxed);
            let due =
                c.len() <= CHECK_ALWAYS_MAX || (c.len() <= CHECK_MAX_RECORDS && within_budget);
            if !due {
                continue;
            }
            let t = std::time::Instant::now();
            let checked = c.check_invariants();
            let spent = u64::try_from(t.elapsed().as_nanos()).unwrap_or(u64::MAX);
            checking.fetch_add(spent, Ordering::Relaxed);
            if let Err(why) = checked {
                panic!("a writer group broke an invariant of collection {name}: {why}");
            }
        }
    }

    /// Apply `group` to a working copy and publish it. Requires: caller is leader.
    fn lead(&self, group: &[Arc<Slot>]) {
        let mut working: DbState = (*self.published.load_full()).clone();
        working.delta = *self.delta.lock();
        let start_csn = working.csn;
        // Recorded for the WAL, and for the change tail once a stream
        // opened (without either nobody reads them).
        let recorded = self.wal.is_some() || self.hub.is_active();
        let mut fx = Effects::new(recorded);
        let mut sync = SyncMode::Later;
        #[cfg(debug_assertions)]
        let applying = std::time::Instant::now();
        let outcome = std::panic::catch_unwind(AssertUnwindSafe(|| {
            for s in group {
                let Some(cmd) = s.command.lock().take() else {
                    *s.reply.lock() = Some(Err(Error::Internal("command taken twice".into())));
                    continue;
                };
                let before = working.csn;
                let reply = match cmd {
                    Command::Batch(batch) => Ok(apply_batch(&mut working, &mut fx, batch)),
                    cmd => apply_one(&mut working, &mut fx, cmd),
                };
                // Something committed (a command, or a statement of a batch):
                // the slot's csn is its last commit's.
                if working.csn != before {
                    s.csn.store(working.csn, Ordering::Relaxed);
                    if s.durability.unwrap_or(self.durability) == Durability::Fsync {
                        sync = SyncMode::Now;
                    }
                }
                *s.reply.lock() = Some(reply);
            }
            if working.csn != start_csn {
                // Install finished merges, cut full delta layers (the
                // fresh views do not change: no effects, no csn).
                self.merger.maintain(&mut working);
            }
            #[cfg(debug_assertions)]
            if working.csn != start_csn {
                let spent = u64::try_from(applying.elapsed().as_nanos()).unwrap_or(u64::MAX);
                self.check_cost.0.fetch_add(spent, Ordering::Relaxed);
                self.check_changed(&self.published.load(), &working);
            }
        }));
        let effects = fx.into_vec();
        match outcome {
            Ok(()) => {
                if working.csn != start_csn {
                    debug_assert!(working.csn > start_csn);
                    // The time is taken by the leader, so one database's
                    // groups get increasing times in commit order. Under a
                    // replica set, taking it and proposing the group is one
                    // step for all databases (`ClusterClock::order`).
                    let order = self
                        .replicator
                        .read()
                        .is_some()
                        .then(|| self.hub.clock.order());
                    let stamp = self.hub.clock.tick();
                    working.ts = stamp.ts;
                    let mut commit = None;
                    if let Some(wal) = &self.wal {
                        // Committed by the replica set (when there is one),
                        // then logged, before publishing: nobody may see (or
                        // be told about) a group a crash or a failover could
                        // take back.
                        // With what each did: a retry answered from the
                        // replica set's table gets the same reply.
                        // A batch's statements are tagged one by one.
                        let origins: Vec<Tagged> = group
                            .iter()
                            .filter(|s| s.csn.load(Ordering::Relaxed) != 0)
                            .flat_map(|s| {
                                let Some(tag) = s.origin.clone() else {
                                    return Vec::new();
                                };
                                let outcomes = match s.reply.lock().as_ref() {
                                    Some(Ok(r)) => WriteOutcome::recorded(r, s.stmts.as_deref()),
                                    _ => vec![Vec::new()],
                                };
                                outcomes
                                    .into_iter()
                                    .map(|outcome| Tagged {
                                        tag: tag.clone(),
                                        outcome,
                                    })
                                    .collect()
                            })
                            .collect();
                        let logged = self
                            .replicate(start_csn + 1, working.csn, stamp, &effects, &origins, order)
                            .and_then(|(payload, c)| {
                                commit = c;
                                wal.append_payload(start_csn + 1, working.csn, &payload, sync)
                                    .map_err(Error::from)
                            });
                        if let Err(e) = logged {
                            self.hub.abandon(stamp.ts);
                            if let Some(c) = commit.take() {
                                let why =
                                    format!("a committed group could not be logged here: {e}");
                                if c.binds() {
                                    // The set committed what this member could
                                    // not log: its state no longer follows the set.
                                    *self.poisoned.lock() = Some(why.clone());
                                }
                                c.finish(Err(why));
                            }
                            for s in group {
                                let mut r = s.reply.lock();
                                if r.as_ref().is_none_or(|r| r.is_ok()) {
                                    *r = Some(Err(e.clone()));
                                }
                            }
                            return;
                        }
                    }
                    self.published.store(Arc::new(working));
                    // After the publish: a reader woken by the tail finds the
                    // group in the database's state too.
                    if recorded {
                        self.hub
                            .publish(ChangeRecord::group(self.db_name.clone(), stamp, effects));
                    } else {
                        self.hub.skip(stamp.ts);
                    }
                    if let Some(c) = commit {
                        c.finish(Ok(()));
                    }
                }
            }
            Err(panic) => {
                let why = panic
                    .downcast_ref::<String>()
                    .cloned()
                    .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
                    .unwrap_or_else(|| "panic".into());
                tracing::error!(db = %self.db_name, %why, "writer poisoned by a panic");
                *self.poisoned.lock() = Some(why.clone());
                for s in group {
                    let mut r = s.reply.lock();
                    if r.as_ref().is_none_or(|r| r.is_ok()) {
                        *r = Some(Err(Error::Internal(format!(
                            "writer stopped after a bug: {why}"
                        ))));
                    }
                }
            }
        }
    }
}

impl Writer {
    /// The record payload of group `first..=lsn`, committed by the replica
    /// set when there is one (with the [`Commit`] to finish once it is
    /// logged and published here).
    fn replicate(
        &self,
        first: u64,
        lsn: u64,
        stamp: Stamp,
        effects: &[effect::Effect],
        origins: &[Tagged],
        order: Option<parking_lot::MutexGuard<'_, ()>>,
    ) -> Result<(Vec<u8>, Option<Commit>)> {
        let payload = wal::encode_record(first, lsn, stamp, effects)?;
        let replicator = self.replicator.read().clone();
        let Some(r) = replicator else {
            return Ok((payload, None));
        };
        // Released once the group is queued (or when this returns).
        let order = std::cell::Cell::new(order);
        let proposed = || drop(order.take());
        let commit = r.replicate(GroupRecord {
            db: &self.db_name,
            first,
            lsn,
            payload: &payload,
            origins,
            proposed: &proposed,
        })?;
        Ok((payload, Some(commit)))
    }

    /// Apply the replicated record of `slot` as a group of its own (see
    /// [`Writer::apply_replicated`]). Requires: caller is leader.
    fn lead_replicated(&self, slot: &Slot) {
        let reply = match slot.replicated.lock().take() {
            Some(rep) => self.apply_record(rep),
            None => Err(Error::Internal("replicated record taken twice".into())),
        };
        if let Ok(Reply::Existed(true)) = &reply {
            slot.csn.store(self.published.load().csn, Ordering::Relaxed);
        }
        *slot.reply.lock() = Some(reply);
    }

    fn apply_record(&self, rep: Replicated) -> Result<Reply> {
        let published = self.published.load_full();
        let rec = rep.record;
        if rec.first != published.csn + 1 {
            // Made on a state this member's log has moved past (or not
            // reached): skipped here as on every member.
            return Ok(Reply::Existed(false));
        }
        let mut working: DbState = (*published).clone();
        working.delta = *self.delta.lock();
        let recorded = self.hub.is_active();
        let effects = recorded.then(|| rec.effects.clone());
        let applied = std::panic::catch_unwind(AssertUnwindSafe(|| {
            effect::apply_all(&mut working, rec.effects)
        }));
        let why = match applied {
            Ok(Ok(())) => None,
            Ok(Err(why)) => Some(why),
            Err(_) => Some("applying it panicked".into()),
        };
        if let Some(why) = why {
            let why = format!(
                "replicated commits {}..={} do not apply to this member's state: {why}",
                rec.first, rec.lsn
            );
            tracing::error!(db = %self.db_name, %why, "writer stopped");
            *self.poisoned.lock() = Some(why.clone());
            return Err(Error::Internal(why));
        }
        working.csn = rec.lsn;
        self.merger.maintain(&mut working);
        working.ts = working.ts.max(rec.ts);
        let stamp = Stamp {
            ts: rec.ts,
            wall_ms: rec.wall_ms,
        };
        self.hub.clock.adopt(stamp.ts);
        if let Some(wal) = &self.wal {
            if let Err(e) = wal.append_payload(rec.first, rec.lsn, &rep.payload, SyncMode::Now) {
                self.hub.abandon(stamp.ts);
                return Err(e.into());
            }
        }
        self.published.store(Arc::new(working));
        match effects {
            Some(effects) => {
                self.hub
                    .publish(ChangeRecord::group(self.db_name.clone(), stamp, effects))
            }
            None => self.hub.skip(stamp.ts),
        }
        Ok(Reply::Existed(true))
    }
}

/// Apply `cmd` as one commit: it takes the next csn when it succeeds; when
/// it fails it consumed no csn and its effects are cut off (the command
/// undid its own changes: `command`'s contract, checked in debug builds).
/// Requires: caller is leader. Cloning `working` per command would make
/// every node shared again and defeat copy-once-per-group.
fn apply_one(working: &mut DbState, fx: &mut Effects, cmd: Command) -> Result<Reply> {
    #[cfg(debug_assertions)]
    let (name, before) = (cmd.name(), fingerprint(working));
    working.csn += 1;
    let mark = fx.mark();
    let reply = apply_command(working, fx, cmd);
    if reply.is_err() {
        working.csn -= 1;
        fx.truncate(mark);
        #[cfg(debug_assertions)]
        assert_unchanged(&before, &fingerprint(working), name);
    }
    reply
}

/// Apply a batch's statements in order, each with [`apply_one`] (a
/// statement refused before the writer fails in its place); an ordered
/// batch stops after its first failure. Requires: caller is leader.
fn apply_batch(working: &mut DbState, fx: &mut Effects, batch: Batch) -> Reply {
    debug_assert!(
        batch.items.len() <= MAX_BATCH_STATEMENTS,
        "a batch over MAX_BATCH_STATEMENTS"
    );
    let mut results = Vec::with_capacity(batch.items.len());
    for item in batch.items {
        let r = item.and_then(|stmt| apply_one(working, fx, stmt.into()));
        let failed = r.is_err();
        results.push(r);
        if failed && batch.ordered {
            break;
        }
    }
    Reply::Batch(results)
}

/// The working state's fingerprint: its csn and each collection's.
#[cfg(debug_assertions)]
type StateFingerprint = (u64, Vec<(String, Fingerprint)>);

#[cfg(debug_assertions)]
fn fingerprint(state: &DbState) -> StateFingerprint {
    let colls = state
        .collections
        .iter()
        .map(|(name, c)| (name.clone(), c.fingerprint()))
        .collect();
    (state.csn, colls)
}

/// A failed command leaves the state as it found it (the command contract;
/// see `Fingerprint::unchanged_by_failure` for the one allowed difference).
#[cfg(debug_assertions)]
fn assert_unchanged(before: &StateFingerprint, after: &StateFingerprint, command: &str) {
    let same = before.0 == after.0
        && before.1.len() == after.1.len()
        && before
            .1
            .iter()
            .zip(&after.1)
            .all(|((n1, f1), (n2, f2))| n1 == n2 && f1.unchanged_by_failure(f2));
    assert!(
        same,
        "a failed {command} command changed the state: before {before:?}, after {after:?}"
    );
}

fn take_reply(slot: &Slot) -> Result<Reply> {
    LAST_CSN.with(|c| c.set(slot.csn.load(Ordering::Relaxed)));
    slot.reply
        .lock()
        .take()
        .unwrap_or_else(|| Err(Error::Internal("writer finished without a reply".into())))
}

#[cfg(test)]
mod tests {
    use super::*;
    use bson::doc;

    fn insert(writer: &Writer, id: i32) -> Result<Reply> {
        let prepared = crate::doc::prepare_insert(&doc! {"_id": id, "a": id}).expect("doc");
        writer.submit(Command::Insert {
            coll: "c".into(),
            docs: vec![prepared],
            ordered: true,
            bypass_validation: false,
        })
    }

    fn writer_with_a_document() -> Writer {
        let writer = Writer::new("t", DbState::default());
        insert(&writer, 1).expect("insert");
        writer
    }

    #[test]
    fn failing_commands_pass_the_checks_and_leave_the_writer_usable() {
        let writer = writer_with_a_document();
        let dup = insert(&writer, 1);
        assert!(matches!(dup, Err(Error::DuplicateKey(_))), "{dup:?}");
        insert(&writer, 2).expect("the writer still works");
        assert_eq!(writer.published().collection("c").map(|c| c.len()), Some(2));
    }

    /// Planted violation: a step that writes and then fails. Debug builds
    /// catch it, poison the writer and publish nothing.
    #[test]
    #[cfg(debug_assertions)]
    fn a_failed_command_that_changed_the_state_poisons_the_writer() {
        let writer = writer_with_a_document();
        let r: Result<()> = writer.at_boundary(|state, _| {
            let c = state.collection_mut("c").expect("c");
            let prepared = crate::doc::prepare_insert(&doc! {"_id": 9}).expect("doc");
            c.insert(std::sync::Arc::new(prepared.0), prepared.1)?;
            Err(Error::bad_value("fails after writing"))
        });
        let e = r.expect_err("the step fails");
        assert!(
            e.to_string()
                .contains("a failed boundary step command changed the state"),
            "{e}"
        );
        assert!(insert(&writer, 3).is_err(), "the writer is poisoned");
        assert_eq!(writer.published().collection("c").map(|c| c.len()), Some(1));
    }

    /// Planted violation: a step that succeeds but leaves a collection
    /// inconsistent (its byte count off by one). Caught after the group.
    #[test]
    #[cfg(debug_assertions)]
    fn a_group_that_breaks_a_collection_invariant_poisons_the_writer() {
        let writer = writer_with_a_document();
        let r: Result<()> = writer.at_boundary(|state, _| {
            state.collection_mut("c").expect("c").data_bytes += 1;
            Ok(())
        });
        let e = r.expect_err("the group is refused");
        assert!(
            e.to_string()
                .contains("a writer group broke an invariant of collection c: data_bytes"),
            "{e}"
        );
        assert!(insert(&writer, 3).is_err(), "the writer is poisoned");
        assert_eq!(writer.published().csn, 1, "the group was not published");
    }
}
