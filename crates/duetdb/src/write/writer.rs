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

use crate::durability::changes::{ChangeHub, ChangeRecord};
use crate::durability::effect::Effects;
use crate::durability::wal::{SyncMode, Wal};
use crate::durability::Durability;
use crate::error::{Error, Result};
#[cfg(debug_assertions)]
use crate::store::collection::Fingerprint;
use crate::store::DbState;
use crate::write::command::{apply_command, BoundaryStep, Command, Reply};

/// Most commands one leader applies before publishing (bounds reply latency).
pub const MAX_GROUP: usize = 1024;

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
    /// Per-write durability (`None`: the database's default).
    durability: Option<Durability>,
    reply: Mutex<Option<Result<Reply>>>,
    /// The csn the command committed at (0 when it failed).
    csn: AtomicU64,
    done: AtomicBool,
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
    /// Groups published and commands applied (successful or not), for
    /// `serverStatus`; relaxed counters, never used for ordering.
    groups: AtomicU64,
    commands: AtomicU64,
    largest_group: AtomicU64,
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
            groups: AtomicU64::new(0),
            commands: AtomicU64::new(0),
            largest_group: AtomicU64::new(0),
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

    /// The write-ahead log, if the database has one.
    pub fn wal(&self) -> Option<&Arc<Wal>> {
        self.wal.as_ref()
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
        let boxed = BoundaryStep(Box::new(move |state, fx| {
            step(state, fx).map(|r| Box::new(r) as Box<dyn std::any::Any + Send>)
        }));
        match self.submit(Command::AtBoundary(boxed))? {
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

    /// Execute `command` as the single writer and wait until it is published.
    pub fn submit(&self, command: Command) -> Result<Reply> {
        self.submit_with(command, None)
    }

    /// [`Writer::submit`] with a per-write durability (`None`: the default).
    pub fn submit_with(&self, command: Command, durability: Option<Durability>) -> Result<Reply> {
        if let Some(wal) = &self.wal {
            wal.check_writable()?;
        }
        if let Some(why) = self.poisoned.lock().clone() {
            return Err(Error::Internal(format!(
                "writer stopped after a bug: {why}"
            )));
        }
        let slot = Arc::new(Slot {
            command: Mutex::new(Some(command)),
            durability,
            reply: Mutex::new(None),
            csn: AtomicU64::new(0),
            done: AtomicBool::new(false),
        });
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
        // Leader: take a group, release the queue so others can enqueue meanwhile.
        let group: Vec<Arc<Slot>> = queue.iter().take(MAX_GROUP).cloned().collect();
        drop(queue);
        self.groups.fetch_add(1, Ordering::Relaxed);
        self.commands
            .fetch_add(group.len() as u64, Ordering::Relaxed);
        self.largest_group
            .fetch_max(group.len() as u64, Ordering::Relaxed);
        self.lead(&group);
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
                // Cloning `working` here would make every node shared again and
                // defeat copy-once-per-group; instead each command undoes its own
                // partial effects on failure (see `command`), and consumes no csn.
                #[cfg(debug_assertions)]
                let (name, before) = (cmd.name(), fingerprint(&working));
                working.csn += 1;
                let mark = fx.mark();
                let reply = apply_command(&mut working, &mut fx, cmd);
                if reply.is_err() {
                    working.csn -= 1;
                    fx.truncate(mark);
                    #[cfg(debug_assertions)]
                    assert_unchanged(&before, &fingerprint(&working), name);
                } else {
                    s.csn.store(working.csn, Ordering::Relaxed);
                    if s.durability.unwrap_or(self.durability) == Durability::Fsync {
                        sync = SyncMode::Now;
                    }
                }
                *s.reply.lock() = Some(reply);
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
                    // groups get increasing times in commit order.
                    let stamp = self.hub.clock.tick();
                    working.ts = stamp.ts;
                    if let Some(wal) = &self.wal {
                        // Log before publishing: nobody may see (or be told
                        // about) a group a crash could take back.
                        if let Err(e) =
                            wal.append(start_csn + 1, working.csn, stamp, &effects, sync)
                        {
                            self.hub.abandon(stamp.ts);
                            let e = crate::error::Error::from(e);
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
