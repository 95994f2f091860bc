//! Change streams' engine side: every committed change of a database, a
//! database or the whole engine, as events in cluster-time order, read from
//! a position and resumable from any event's position.
//!
//! Where events come from (docs/design.md, "Change streams"): the in-memory
//! change tail while the position is within it, else each durable database's
//! WAL (merged by time across databases). A position is `(time, index)`:
//! the group's cluster time and the effect's index in its record; a batch
//! returns events strictly after the position it was given, and the position
//! to continue from.
//!
//! Invariants:
//! - events are delivered in `(time, index)` order and only up to the
//!   change hub's readable time (at most the clock's stable time), so a
//!   group still in flight (a lower time than one already visible) is never
//!   skipped;
//! - reading from a position whose history is gone — older than a durable
//!   database's retained log, or than what the tail forgot of a database
//!   without a log — fails with ChangeStreamHistoryLost (286); it never
//!   skips silently;
//! - a reader holds nothing between batches but its position: a slow stream
//!   pins no memory and never slows the writer.

use std::sync::Arc;
use std::time::Duration;

use bson::raw::RawDocumentBuf;
use bson::{Bson, Document};

use crate::api::{Database, Engine};
use crate::doc::DocRef;
use crate::durability::changes::dropped::DropLog;
use crate::durability::changes::{ChangeHub, ChangeRecord, RecordKind};
use crate::durability::effect::Effect;
use crate::error::{Error, Result};

/// Most records one batch reads from a source (tail or one database's log).
const MAX_RECORDS_PER_READ: usize = 4096;

/// Which changes a stream follows.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ChangeScope {
    /// Every database (`allChangesForCluster`).
    Cluster,
    Database(String),
    Collection {
        db: String,
        coll: String,
    },
}

/// A place in the change history: events strictly after it come next.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Default, Hash)]
pub struct ChangePosition {
    /// Cluster time (packed BSON Timestamp) of the group.
    pub ts: u64,
    /// Index of the effect within its group's record (`u32::MAX`: after the
    /// whole group).
    pub index: u32,
}

impl ChangePosition {
    /// After every change of time `<= ts`.
    pub fn after_time(ts: u64) -> ChangePosition {
        ChangePosition {
            ts,
            index: u32::MAX,
        }
    }

    /// Before every change of time `>= ts` (MongoDB's inclusive
    /// `startAtOperationTime`).
    pub fn at_time(ts: u64) -> ChangePosition {
        ChangePosition::after_time(ts.saturating_sub(1))
    }
}

/// What a change did.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub enum ChangeKind {
    Insert {
        coll: String,
        doc: DocRef,
    },
    /// By update operators: the new version and MongoDB's
    /// `updateDescription` `{updatedFields, removedFields, truncatedArrays}`.
    Update {
        coll: String,
        doc: DocRef,
        desc: Arc<RawDocumentBuf>,
    },
    Replace {
        coll: String,
        doc: DocRef,
    },
    Delete {
        coll: String,
        id: Bson,
    },
    Create {
        coll: String,
    },
    Drop {
        coll: String,
    },
    Rename {
        from: String,
        to: String,
    },
    CreateIndex {
        coll: String,
        spec: Document,
    },
    DropIndex {
        coll: String,
        name: String,
    },
    /// The collection's options changed (`collMod`; MongoDB's `modify`
    /// event): `options` is the whole new `listCollections` options document.
    Modify {
        coll: String,
        options: Document,
    },
    DropDatabase,
}

impl ChangeKind {
    /// The collection the event is about (a rename's source), if any.
    pub fn coll(&self) -> Option<&str> {
        match self {
            ChangeKind::Insert { coll, .. }
            | ChangeKind::Update { coll, .. }
            | ChangeKind::Replace { coll, .. }
            | ChangeKind::Delete { coll, .. }
            | ChangeKind::Create { coll }
            | ChangeKind::Drop { coll }
            | ChangeKind::CreateIndex { coll, .. }
            | ChangeKind::DropIndex { coll, .. }
            | ChangeKind::Modify { coll, .. } => Some(coll),
            ChangeKind::Rename { from, .. } => Some(from),
            ChangeKind::DropDatabase => None,
        }
    }
}

/// One change.
#[derive(Debug, Clone)]
pub struct ChangeEvent {
    pub pos: ChangePosition,
    pub wall_ms: i64,
    pub db: Arc<str>,
    pub kind: ChangeKind,
    /// The transaction's origin metadata (`Transaction::set_origin`) when
    /// the change was part of one.
    pub txn: Option<Arc<RawDocumentBuf>>,
    /// The document before an update, replace or delete (its pre-image),
    /// recorded when the collection had `changeStreamPreAndPostImages`
    /// enabled at the time of the change; `None` otherwise.
    pub before: Option<DocRef>,
}

/// A batch of events and where to continue.
#[derive(Debug, Clone, Default)]
pub struct ChangeBatch {
    pub events: Vec<ChangeEvent>,
    /// Resume after this (the last event's position, or the time up to
    /// which the history was read when the batch is not full).
    pub position: ChangePosition,
}

fn in_scope(scope: &ChangeScope, db: &str) -> bool {
    match scope {
        ChangeScope::Cluster => true,
        ChangeScope::Database(d) | ChangeScope::Collection { db: d, .. } => d == db,
    }
}

/// The events of `rec` in `scope`, after `after`, appended to `out` until it
/// holds `max`; returns whether it stopped because `out` is full.
fn events_of(
    rec: &ChangeRecord,
    scope: &ChangeScope,
    after: ChangePosition,
    max: usize,
    out: &mut Vec<ChangeEvent>,
) -> bool {
    if !in_scope(scope, &rec.db) {
        return false;
    }
    let coll_scope = match scope {
        ChangeScope::Collection { coll, .. } => Some(coll.as_str()),
        _ => None,
    };
    let mut push = |index: u32,
                    kind: ChangeKind,
                    txn: Option<Arc<RawDocumentBuf>>,
                    before: Option<DocRef>|
     -> bool {
        let pos = ChangePosition { ts: rec.ts, index };
        if pos <= after {
            return false;
        }
        if coll_scope.is_some_and(|c| kind.coll() != Some(c)) {
            return false;
        }
        if out.len() >= max {
            return true;
        }
        out.push(ChangeEvent {
            pos,
            wall_ms: rec.wall_ms,
            db: rec.db.clone(),
            kind,
            txn,
            before,
        });
        false
    };
    if rec.kind == RecordKind::DropDatabase {
        // As MongoDB's: a `drop` per collection it held (a collection
        // stream sees only its own, then is invalidated), then the
        // `dropDatabase` (not on collection streams).
        for (i, e) in rec.effects.iter().enumerate() {
            if let Effect::DropCollection { name } = e {
                let kind = ChangeKind::Drop { coll: name.clone() };
                if push(i as u32, kind, None, None) {
                    return true;
                }
            }
        }
        if coll_scope.is_some() {
            return false;
        }
        return push(
            rec.effects.len() as u32,
            ChangeKind::DropDatabase,
            None,
            None,
        );
    }
    let mut txn: Option<Arc<RawDocumentBuf>> = None;
    // A collection created with options is one `create` event: its
    // `SetOptions` right after the `CreateCollection` is no `modify`.
    let mut created: Option<&str> = None;
    for (i, e) in rec.effects.iter().enumerate() {
        let index = i as u32;
        let just_created = created.take();
        let kind = match e {
            Effect::TxnBegin { origin } => {
                // An engine transaction without origin has an empty one.
                txn = (origin.as_bytes().len() > 5).then(|| origin.clone());
                continue;
            }
            Effect::TxnEnd => {
                txn = None;
                continue;
            }
            Effect::Insert { coll, doc } => ChangeKind::Insert {
                coll: coll.clone(),
                doc: doc.clone(),
            },
            Effect::Update {
                coll, doc, desc, ..
            } => ChangeKind::Update {
                coll: coll.clone(),
                doc: doc.clone(),
                desc: desc.clone(),
            },
            // Version-1 puts (kind unknown) never reach here: they have no
            // time. Report one as a replacement all the same.
            Effect::Replace { coll, doc, .. } | Effect::Put { coll, doc } => ChangeKind::Replace {
                coll: coll.clone(),
                doc: doc.clone(),
            },
            Effect::Delete { coll, id, .. } => ChangeKind::Delete {
                coll: coll.clone(),
                id: Bson::try_from(id.clone()).unwrap_or(Bson::Null),
            },
            Effect::SetOptions { coll, .. } if just_created == Some(coll.as_str()) => continue,
            Effect::SetOptions { coll, options } => ChangeKind::Modify {
                coll: coll.clone(),
                options: options.to_document(),
            },
            Effect::CreateCollection { name } => {
                created = Some(name);
                ChangeKind::Create { coll: name.clone() }
            }
            Effect::DropCollection { name } => ChangeKind::Drop { coll: name.clone() },
            Effect::Rename { from, to } => ChangeKind::Rename {
                from: from.clone(),
                to: to.clone(),
            },
            // The collated `_id` index is part of its collection's creation
            // (MongoDB reports no index creation for `_id_` either).
            Effect::CreateIndex { spec, .. } if spec.is_collated_id() => continue,
            Effect::CreateIndex { coll, spec } => ChangeKind::CreateIndex {
                coll: coll.clone(),
                spec: bson::doc! {"v": 2, "key": spec.key_pattern(), "name": spec.name.clone(), "unique": spec.unique},
            },
            Effect::DropIndex { coll, name } => ChangeKind::DropIndex {
                coll: coll.clone(),
                name: name.clone(),
            },
        };
        if push(index, kind, txn.clone(), e.pre_image().cloned()) {
            return true;
        }
    }
    false
}

fn show_time(ts: u64) -> String {
    let (s, i) = crate::durability::changes::clock::parts(ts);
    format!("Timestamp({s}, {i})")
}

fn history_lost(after: ChangePosition, why: &str) -> Error {
    Error::ChangeStreamHistoryLost(format!(
        "Resume of change stream was not possible, as the resume point may no longer be in \
         the oplog: {why}, and the stream asked for changes after {}",
        show_time(after.ts)
    ))
}

/// Turn time-sorted records into a batch after `after`, reading up to
/// `bound` (every record of the scope with a time `<= bound` is in `recs`).
fn batch_of(
    recs: &[Arc<ChangeRecord>],
    scope: &ChangeScope,
    after: ChangePosition,
    bound: u64,
    max: usize,
) -> ChangeBatch {
    let mut events = Vec::new();
    for rec in recs {
        if rec.ts > bound {
            break;
        }
        if events_of(rec, scope, after, max, &mut events) {
            let position = events.last().map_or(after, |e: &ChangeEvent| e.pos);
            return ChangeBatch { events, position };
        }
    }
    let position = match events.last() {
        Some(e) if events.len() >= max => e.pos,
        _ => after.max(ChangePosition::after_time(bound)),
    };
    ChangeBatch { events, position }
}

impl Engine {
    /// The last cluster time handed out (a reply's `operationTime`).
    pub fn cluster_time(&self) -> u64 {
        self.hub().clock.last()
    }

    /// Every commit with a time at or below this is visible (or will never
    /// exist) and readable by [`Engine::read_changes`]: what a
    /// snapshot-then-stream hand-off and the oplog view's scans may rely on.
    pub fn stable_cluster_time(&self) -> u64 {
        self.hub().readable_upto()
    }

    /// A counter that changes whenever a change is published (pass it to
    /// [`Engine::wait_for_changes`]).
    pub fn change_seq(&self) -> u64 {
        self.hub().seq()
    }

    /// Sleep until a change is published after `seen` (a
    /// [`Engine::change_seq`] value) or `timeout` passes; true if one was.
    /// Wake-ups are coalesced (`durability/changes/wake.rs`): under a steady
    /// stream of publishes a waiter wakes at most about once a millisecond,
    /// and then reads everything published so far in one go; the writer
    /// never waits for it.
    pub fn wait_for_changes(&self, seen: u64, timeout: Duration) -> bool {
        self.hub().wait(seen, timeout)
    }

    /// Wake every waiting reader (shutdown).
    pub fn wake_change_readers(&self) {
        self.hub().wake_all();
    }

    /// Records and bytes in the in-memory change tail.
    pub fn change_tail_stats(&self) -> (usize, usize) {
        self.hub().tail_stats()
    }

    fn sources(&self, scope: &ChangeScope) -> Result<Sources<'_>> {
        Ok(Sources {
            hub: self.hub(),
            dbs: match scope {
                ChangeScope::Cluster => self.all_databases(),
                ChangeScope::Database(d) | ChangeScope::Collection { db: d, .. } => {
                    self.get(d)?.into_iter().collect()
                }
            },
            drops: Some(self.drops()),
        })
    }

    /// Start keeping changes in the in-memory tail (change streams call this
    /// when they open; until then the process keeps no change records, and
    /// databases without a WAL have no history before this call). Returns
    /// where a stream opening now starts: after every time already taken.
    pub fn open_change_stream(&self) -> ChangePosition {
        let hub = self.hub();
        hub.activate();
        ChangePosition::after_time(hub.clock.last())
    }

    /// Fail with ChangeStreamHistoryLost (286) unless every change of
    /// `scope` after `after` can still be read.
    pub fn check_change_history(&self, scope: &ChangeScope, after: ChangePosition) -> Result<()> {
        self.sources(scope)?.check(scope, after)
    }

    /// The cluster time after which every change of `scope` can still be
    /// read: [`Engine::read_changes`] from `ChangePosition::after_time` of it
    /// (or any later position) never fails with ChangeStreamHistoryLost.
    /// The oplog view starts its scans here (MongoDB's oldest oplog entry).
    pub fn change_history_floor(&self, scope: &ChangeScope) -> Result<u64> {
        self.sources(scope)?.floor(scope)
    }

    /// The next events of `scope` after `after`, at most `max` (≥ 1). Never
    /// waits; see [`Engine::wait_for_changes`].
    pub fn read_changes(
        &self,
        scope: &ChangeScope,
        after: ChangePosition,
        max: usize,
    ) -> Result<ChangeBatch> {
        self.sources(scope)?.read(scope, after, max)
    }
}

impl Database {
    /// [`Engine::open_change_stream`] for a database opened on its own (its
    /// own clock and tail).
    pub fn open_change_stream(&self) -> ChangePosition {
        let hub = self.writer().hub();
        hub.activate();
        ChangePosition::after_time(hub.clock.last())
    }

    /// [`Engine::read_changes`] of this database (scope: the database) for a
    /// database opened on its own; through an Engine, use the Engine's.
    pub fn read_changes(&self, after: ChangePosition, max: usize) -> Result<ChangeBatch> {
        let scope = ChangeScope::Database(self.name().to_string());
        Sources {
            hub: self.writer().hub(),
            dbs: vec![self.clone()],
            drops: None,
        }
        .read(&scope, after, max)
    }
}

/// Where a read finds the changes of a scope: the tail, the logs of the
/// scope's databases, and the drop log.
struct Sources<'a> {
    hub: &'a ChangeHub,
    dbs: Vec<Database>,
    drops: Option<&'a DropLog>,
}

impl Sources<'_> {
    /// The earliest time after which [`Sources::check`] passes: the latest
    /// of every database's retained history, the last event of each dropped
    /// database in scope (its log went with it) and the drop log's own
    /// retention; everything the in-memory tail covers is readable anyway.
    fn floor(&self, scope: &ChangeScope) -> Result<u64> {
        let hub = self.hub;
        let mut floor = 0;
        for db in &self.dbs {
            floor = floor.max(match db.durable() {
                Some(d) if d.wal().is_some() => d.history_floor()?,
                _ => hub.evicted_upto(),
            });
        }
        if let Some(drops) = self.drops {
            floor = floor.max(drops.floor());
            for e in drops.entries() {
                if e.last_ts > 0 && in_scope(scope, &e.db) {
                    floor = floor.max(e.last_ts);
                }
            }
        }
        Ok(floor.min(hub.covers_from()))
    }

    fn check(&self, scope: &ChangeScope, after: ChangePosition) -> Result<()> {
        let hub = self.hub;
        if after.ts >= hub.covers_from() {
            return Ok(());
        }
        for db in &self.dbs {
            let floor = match db.durable() {
                Some(d) if d.wal().is_some() => d.history_floor()?,
                // No log: the tail was its only history.
                _ => hub.evicted_upto(),
            };
            if after.ts < floor {
                return Err(history_lost(
                    after,
                    &format!(
                        "database '{}' retains changes after {} only",
                        db.name(),
                        show_time(floor)
                    ),
                ));
            }
        }
        let Some(drops) = self.drops else {
            return Ok(());
        };
        // A dropped database's log went with it: events between `after`
        // and its last one before the drop cannot be read any more.
        for e in drops.entries() {
            let last = ChangePosition {
                ts: e.last_ts,
                index: e.last_index,
            };
            if e.ts > after.ts && e.last_ts > 0 && after < last && in_scope(scope, &e.db) {
                return Err(history_lost(
                    after,
                    &format!(
                        "database '{}' was dropped at {} with its changes up to {}",
                        e.db,
                        show_time(e.ts),
                        show_time(e.last_ts)
                    ),
                ));
            }
        }
        if after.ts < drops.floor() {
            return Err(history_lost(
                after,
                &format!(
                    "database drops are kept after {} only",
                    show_time(drops.floor())
                ),
            ));
        }
        Ok(())
    }

    fn read(&self, scope: &ChangeScope, after: ChangePosition, max: usize) -> Result<ChangeBatch> {
        let max = max.max(1);
        let hub = self.hub;
        // Final and in the tail's log (or forgotten by it) up to here.
        let stable = hub.readable_upto();
        if after.ts > stable {
            return Ok(ChangeBatch {
                events: Vec::new(),
                position: after,
            });
        }
        // Records of time `after.ts` may still hold events after `index`.
        let from = if after.index == u32::MAX {
            after.ts
        } else {
            after.ts.saturating_sub(1)
        };
        if let Some(recs) = hub.records_after(from, stable, MAX_RECORDS_PER_READ) {
            let bound = if recs.len() == MAX_RECORDS_PER_READ {
                recs.last().map_or(stable, |r| r.ts)
            } else {
                stable
            };
            return Ok(batch_of(&recs, scope, after, bound, max));
        }
        // Older than the tail: each durable database's log, merged by time.
        self.check(scope, after)?;
        let covers = hub.covers_from();
        let mut bound = covers.min(stable);
        let mut recs: Vec<Arc<ChangeRecord>> = Vec::new();
        for db in &self.dbs {
            let Some(d) = db.durable().filter(|d| d.wal().is_some()) else {
                continue;
            };
            let name: Arc<str> = Arc::from(db.name());
            let (got, more) = d.read_changes(&name, from, bound, MAX_RECORDS_PER_READ)?;
            if more {
                if let Some(last) = got.last() {
                    bound = bound.min(last.ts);
                }
            }
            recs.extend(got.into_iter().map(Arc::new));
        }
        // Dropped databases: their drop events, from the drop log.
        for e in self.drops.map(DropLog::entries).unwrap_or_default() {
            if e.ts > from && e.ts <= bound && in_scope(scope, &e.db) {
                recs.push(Arc::new(e.record()));
            }
        }
        recs.sort_by_key(|r| r.ts);
        let mut batch = batch_of(&recs, scope, after, bound, max);
        // Caught up with the tail: continue there in the same batch.
        if batch.events.len() < max && batch.position.ts >= covers {
            if let Some(recs) = hub.records_after(batch.position.ts, stable, MAX_RECORDS_PER_READ) {
                let rest = batch_of(
                    &recs,
                    scope,
                    batch.position,
                    stable,
                    max - batch.events.len(),
                );
                batch.events.extend(rest.events);
                batch.position = rest.position;
            }
        }
        Ok(batch)
    }
}
