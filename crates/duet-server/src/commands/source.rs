//! Where a CRUD command runs and reads: [`Target`] (the live database, or
//! the session's open transaction) and [`ReadSource`], the one read path of
//! find, count, distinct, aggregate and explain.
//!
//! [`read_source`] decides, in this order:
//! 1. inside a transaction: the transaction (its snapshot overlaid with its
//!    own writes; `txn.rs` has already refused any `$duet` option, 263);
//! 2. `$duet: {snapshot: <none|vls|cow|olcp|auto>}` (and not a stale
//!    index read, below): the live collection
//!    under that strategy, resolved by the engine's one chooser (`auto` by
//!    plan; `olcp` on an order-dependent pipeline runs as `vls`). Refused
//!    with `readConcern.atClusterTime`, which names a held state;
//! 3. otherwise a held snapshot with its cluster time: the named one
//!    (`$duet.snapshotName`; with `$duet.consistency` `majority`/`all` its
//!    digest first checked against that many members', `named.rs`), the one read concern `snapshot` resolves
//!    (reported as `atClusterTime`), or the latest published root — the
//!    default read, `cow` by construction.
//!
//! `$duet: {indexRead: "stale"}` (or the database's default index read,
//! `duet serve --index-read`) reads the held version's indexes in their
//! stale view (delta indexing's merged roots only); it is refused beside a
//! `$duet.snapshot` other than `cow`/`auto` (those follow the writer).
//!
//! Every read runs under the command's [`ReadLimits`] ([`read_limits`]): its
//! cancellation token (`maxTimeMS`, `killOp`, a closed connection,
//! shutdown), the server's memory limit for a blocking sort or `$group`
//! (`--query-memory-limit-bytes`, 100 MiB), and `allowDiskUse` (default
//! `--allow-disk-use-by-default`, true) — a sort over the limit spills to the
//! database's `spill` directory or fails with 292. Reads inside a
//! transaction run on the transaction's materialized view and take no
//! limits (a gap: they are bounded only by the `maxTimeMS` reply).
//!
//! Invariants: a command reads exactly one source; live reads are counted
//! by the engine under the strategy that ran (`serverStatus.duet.reads`),
//! held reads are not; explain reports what the same command would run.

use std::path::PathBuf;

use bson::{Bson, Document, Timestamp};
use duetdb::raw::DocRef;
use duetdb::{
    Collection, Crud, ReadLimits, Snapshot, SnapshotCollection, Strategy, Transaction,
    TxnCollection,
};

use super::read::FindPlan;
use super::{duet_index_read, duet_strategy, read_concern, Ctx, ReadConcern};
use crate::error::{CmdResult, CommandError};

/// Where a CRUD command's reads and writes go.
pub enum Target<'t> {
    /// The live database: each write (an update's or delete's statement
    /// too, though they reach the writer in batches) is one atomic commit.
    Live,
    /// The session's open transaction: writes are buffered until commit.
    Txn(&'t mut Transaction),
}

impl Target<'_> {
    pub fn in_transaction(&self) -> bool {
        matches!(self, Target::Txn(_))
    }

    /// The handle a write command runs its statements on.
    pub fn collection<'s>(
        &'s mut self,
        ctx: &Ctx<'_>,
        name: &str,
    ) -> CmdResult<Box<dyn Crud + 's>> {
        self.collection_with(ctx, name, false)
    }

    /// [`Target::collection`] for a command that may set
    /// `bypassDocumentValidation` (`bypass`: the validator is not run).
    pub fn collection_with<'s>(
        &'s mut self,
        ctx: &Ctx<'_>,
        name: &str,
        bypass: bool,
    ) -> CmdResult<Box<dyn Crud + 's>> {
        self.collection_collated(ctx, name, bypass, None)
    }

    /// [`Target::collection_with`] under a statement's `collation` option
    /// (`None`: the collection's default), live or in the transaction.
    pub fn collection_collated<'s>(
        &'s mut self,
        ctx: &Ctx<'_>,
        name: &str,
        bypass: bool,
        collation: Option<Document>,
    ) -> CmdResult<Box<dyn Crud + 's>> {
        Ok(match self {
            Target::Live => Box::new(
                ctx.database()?
                    .collection(name)
                    .bypass_document_validation(bypass)
                    .with_collation(collation),
            ),
            Target::Txn(txn) => Box::new(
                txn.collection(name)
                    .bypass_document_validation(bypass)
                    .with_collation(collation),
            ),
        })
    }
}

/// What one read command reads (see the module documentation).
pub enum ReadSource<'s> {
    Live {
        coll: Collection,
        strategy: Strategy,
    },
    Held {
        coll: SnapshotCollection,
        snap: Snapshot,
        /// Reported as `atClusterTime` (read concern snapshot, named snapshots).
        at: Option<Timestamp>,
        /// Where a sort of this read spills (the database's directory).
        spill_dir: Option<PathBuf>,
    },
    Txn(TxnCollection<'s>),
}

/// What an explain describes.
pub enum Explained<'a> {
    Find(&'a FindPlan),
    Count(Document),
    Distinct(Document),
    Aggregate(Vec<Document>),
}

/// The source command `cmd` reads collection `coll` from (noted for
/// `currentOp` and the slow-operation log).
pub fn read_source<'s>(
    ctx: &Ctx<'_>,
    cmd: &Document,
    coll: &str,
    target: &'s mut Target<'_>,
) -> CmdResult<ReadSource<'s>> {
    let collation = collation_of(cmd)?;
    let source = match choose_source(ctx, cmd, coll, target)? {
        ReadSource::Live { coll, strategy } => ReadSource::Live {
            coll: coll.with_collation(collation),
            strategy,
        },
        ReadSource::Held {
            coll,
            snap,
            at,
            spill_dir,
        } => ReadSource::Held {
            coll: coll.with_collation(collation),
            snap,
            at,
            spill_dir,
        },
        ReadSource::Txn(c) => ReadSource::Txn(c.with_collation(collation)),
    };
    ctx.note_read(coll, cmd, &source);
    Ok(source)
}

/// A command's `collation` option, validated (MongoDB's errors for a
/// malformed one); `None` when absent (the collection's default applies).
pub fn collation_of(cmd: &Document) -> CmdResult<Option<Document>> {
    let Some(c) = crate::args::opt_doc(cmd, "collation")? else {
        return Ok(None);
    };
    duetdb::Collator::from_document(c)?;
    Ok(Some(c.clone()))
}

fn choose_source<'s>(
    ctx: &Ctx<'_>,
    cmd: &Document,
    coll: &str,
    target: &'s mut Target<'_>,
) -> CmdResult<ReadSource<'s>> {
    if let Target::Txn(txn) = target {
        return Ok(ReadSource::Txn(txn.collection(coll)));
    }
    let db = ctx.database()?;
    let index_read = duet_index_read(cmd)?;
    let stale = index_read.unwrap_or_else(|| db.default_index_read()) == duetdb::IndexRead::Stale;
    if let Some(strategy) = duet_strategy(cmd)? {
        if index_read == Some(duetdb::IndexRead::Stale)
            && !matches!(strategy, Strategy::Cow | Strategy::Auto)
        {
            return Err(CommandError::bad_value(format!(
                "$duet.indexRead \"stale\" reads a held copy-on-write version: it cannot be combined with $duet.snapshot \"{}\"",
                strategy.name()
            )));
        }
        if !stale {
            if cmd
                .get_document("readConcern")
                .is_ok_and(|rc| rc.contains_key("atClusterTime"))
            {
                return Err(CommandError::bad_value(
                    "$duet.snapshot cannot be combined with readConcern.atClusterTime",
                ));
            }
            return Ok(ReadSource::Live {
                coll: db.collection(coll),
                strategy,
            });
        }
    }
    // `db@snapshot` (snapdb.rs) names the snapshot as the database.
    let named = crate::args::opt_doc(cmd, "$duet")?
        .and_then(|d| d.get_str("snapshotName").ok())
        .or(ctx.snapshot_name());
    if named.is_none() && super::named::Consistency::of(cmd)?.is_some() {
        return Err(CommandError::bad_value(
            "$duet.consistency applies to a named snapshot: give $duet.snapshotName",
        ));
    }
    let (snap, at) = match (named, read_concern(cmd)?) {
        (Some(_), ReadConcern::Snapshot(_)) => {
            return Err(CommandError::bad_value(
                "$duet.snapshotName cannot be combined with readConcern snapshot",
            ))
        }
        (Some(name), ReadConcern::Default) => {
            let snap = db.named_snapshot(name)?;
            super::named::check_consistency(ctx, cmd, name, &snap, coll)?;
            let ts = crate::snapshots::csn_to_timestamp(snap.csn());
            (snap, Some(ts))
        }
        (None, ReadConcern::Snapshot(at)) => {
            let snap = ctx.state.snapshots.resolve_with(ctx.db, &db, at, |ts| {
                ctx.state.repl.get().and_then(|m| m.state_at(ctx.db, ts))
            })?;
            let ts = crate::snapshots::snapshot_time(&snap);
            (snap, Some(ts))
        }
        (None, ReadConcern::Default) => (db.snapshot(), None),
    };
    // The stale view: the merged index roots of the read's version.
    let read = if stale {
        duetdb::IndexRead::Stale
    } else {
        duetdb::IndexRead::Fresh
    };
    Ok(ReadSource::Held {
        coll: snap.collection(coll).with_index_read(read),
        snap,
        at,
        spill_dir: db.spill_dir(),
    })
}

/// The limits a read command runs under: the command's cancellation token,
/// the server's memory limit, and `allowDiskUse` (a boolean; absent or null:
/// the server's default).
pub fn read_limits(ctx: &Ctx<'_>, cmd: &Document) -> CmdResult<ReadLimits> {
    let params = &ctx.state.params;
    let allow_disk_use = match cmd.get("allowDiskUse") {
        None | Some(Bson::Null) => params.allow_disk_use_by_default(),
        Some(Bson::Boolean(b)) => *b,
        Some(other) => {
            return Err(CommandError::type_mismatch(format!(
                "BSON field 'allowDiskUse' is the wrong type '{}', expected type 'bool'",
                duetdb::raw::type_name(other)
            )))
        }
    };
    Ok(ReadLimits {
        cancel: ctx.cancel.clone(),
        memory_limit_bytes: params.query_memory_limit_bytes(),
        allow_disk_use,
        spill_dir: None,
        examined: None,
    })
}

impl ReadSource<'_> {
    /// A find with a top-level `$text` on this source (the live state, the
    /// held snapshot (named, `atClusterTime`), or the transaction's) as a
    /// stream under `limits` (`duetdb::TextStream`).
    pub fn text_find(
        &self,
        filter: &Document,
        options: duetdb::TextFindOptions,
        limits: &ReadLimits,
    ) -> CmdResult<duetdb::TextStream> {
        let limits = self.limits_for(limits);
        Ok(match self {
            ReadSource::Live { coll, .. } => coll.text_find_stream(filter, options, &limits)?,
            ReadSource::Held { coll, .. } => coll.text_find_stream(filter, options, &limits)?,
            ReadSource::Txn(c) => c.text_find_stream(filter, options, &limits)?,
        })
    }

    /// How many documents a `$text` filter matches on this source.
    pub fn text_count(&self, filter: &Document) -> CmdResult<u64> {
        Ok(match self {
            ReadSource::Live { coll, .. } => coll.text_count(filter)?,
            ReadSource::Held { coll, .. } => coll.text_count(filter)?,
            ReadSource::Txn(c) => c.text_count(filter)?,
        })
    }

    /// A pipeline starting with a `$text` `$match`, on this source.
    pub fn text_aggregate(
        &self,
        stages: &[Document],
        limits: &ReadLimits,
        let_vars: Option<&Document>,
    ) -> CmdResult<Vec<Document>> {
        let limits = self.limits_for(limits);
        Ok(match self {
            ReadSource::Live { coll, .. } => {
                coll.text_aggregate(stages, &limits, let_vars, None)?
            }
            ReadSource::Held { coll, .. } => coll.text_aggregate(stages, &limits, let_vars)?,
            ReadSource::Txn(c) => c.text_aggregate(stages, &limits, let_vars)?,
        })
    }

    /// The cluster time to report (`atClusterTime`), if the client asked for one.
    pub fn at(&self) -> Option<Timestamp> {
        match self {
            ReadSource::Held { at, .. } => *at,
            _ => None,
        }
    }

    /// The snapshot a cursor over this source's documents keeps alive
    /// (`None`: the documents are all the cursor needs).
    pub fn snapshot(&self) -> Option<Snapshot> {
        match self {
            ReadSource::Held { snap, .. } => Some(snap.clone()),
            _ => None,
        }
    }

    /// `limits` with this source's spill directory filled in.
    fn limits_for(&self, limits: &ReadLimits) -> ReadLimits {
        let mut l = limits.clone();
        if let ReadSource::Held { spill_dir, .. } = self {
            if l.spill_dir.is_none() {
                l.spill_dir = spill_dir.clone();
            }
        }
        l
    }

    /// The matching stored documents, sorted, skipped and limited
    /// (unprojected), materialized.
    pub fn find(&self, plan: &FindPlan, limits: &ReadLimits) -> CmdResult<Vec<DocRef>> {
        Ok(self
            .find_stream(plan, limits)?
            .collect::<duetdb::Result<Vec<_>>>()?)
    }

    /// The same documents as a stream: lazy on a held snapshot (the default
    /// read) and under `$duet: {snapshot: "cow"}` when the plan yields the
    /// order; a sort's output otherwise (spilled runs merged on demand);
    /// materialized for live `vls`/`olcp`/`none` reads and in a transaction.
    /// What a server cursor can keep between `getMore`s (see
    /// `duetdb::FindStream`).
    /// The collator this read compares strings under: the command's
    /// `collation`, else the collection's default (`None`: simple).
    pub fn collator(&self) -> CmdResult<Option<std::sync::Arc<duetdb::Collator>>> {
        Ok(match self {
            ReadSource::Live { coll, .. } => coll.collator()?,
            ReadSource::Held { coll, .. } => coll.collator()?,
            ReadSource::Txn(coll) => coll.collator()?,
        })
    }

    pub fn find_stream(
        &self,
        plan: &FindPlan,
        limits: &ReadLimits,
    ) -> CmdResult<duetdb::FindStream> {
        let (filter, options) = (plan.filter.clone(), plan.options.clone());
        let limits = self.limits_for(limits);
        Ok(match self {
            ReadSource::Live { coll, strategy } => coll
                .find(filter)
                .options(options)
                .snapshot(*strategy)
                .limits(limits)
                .stream()?,
            ReadSource::Held { coll, .. } => {
                coll.find(filter).options(options).limits(limits).stream()?
            }
            ReadSource::Txn(coll) => duetdb::FindStream::from_docs(coll.find_raw(filter, options)?),
        })
    }

    /// How many documents match `query`. `visit`: a per-document cost (the
    /// `$duet.workNsPerDoc` knob) that makes the count visit every match.
    /// `hint` is honoured on a held snapshot only (a live scan and a
    /// transaction plan for themselves).
    pub fn count(
        &self,
        query: Document,
        hint: Option<&Bson>,
        visit: Option<&dyn Fn(&DocRef)>,
        limits: &ReadLimits,
    ) -> CmdResult<u64> {
        let limits = self.limits_for(limits);
        match (self, visit) {
            (ReadSource::Live { coll, strategy }, None) => {
                Ok(coll.count_limited(query, *strategy, &limits)?.0)
            }
            (ReadSource::Live { coll, strategy }, Some(visit)) => {
                // Visit every match (no O(1) size shortcut); under `olcp` the
                // scan is handed superseded versions, so each document still
                // counts exactly once.
                let mut n = 0u64;
                coll.scan_limited(query, *strategy, &limits, |d| {
                    n += 1;
                    visit(d);
                    std::ops::ControlFlow::Continue(())
                })?;
                Ok(n)
            }
            (ReadSource::Held { coll, .. }, None) if hint.is_none() && query.is_empty() => {
                Ok(coll.count(query)?)
            }
            (ReadSource::Held { coll, .. }, visit) => {
                // Streamed from the snapshot: nothing is materialized.
                let mut find = coll.find(query).limits(limits);
                if let Some(h) = hint {
                    find = find.hint(h.clone());
                }
                let mut n = 0u64;
                for d in find.stream()? {
                    let d = d?;
                    if let Some(visit) = visit {
                        visit(&d);
                    }
                    n += 1;
                }
                Ok(n)
            }
            (ReadSource::Txn(coll), _) => Ok(Crud::count(coll, query)?),
        }
    }

    /// The engine's distinct values of `key` among documents matching `query`.
    pub fn distinct(
        &self,
        key: &str,
        query: Document,
        limits: &ReadLimits,
    ) -> CmdResult<Vec<Bson>> {
        let limits = self.limits_for(limits);
        Ok(match self {
            ReadSource::Live { coll, strategy } => {
                coll.distinct_limited(key, query, *strategy, &limits)?.0
            }
            ReadSource::Held { coll, .. } => {
                let mut d = duetdb::lang::Distinct::new(key)?.with_collation(coll.collator()?);
                for doc in coll.find(query).limits(limits).stream()? {
                    d.feed(&doc?);
                }
                d.finish()?
            }
            ReadSource::Txn(coll) => Crud::distinct(coll, key, query)?,
        })
    }

    /// Run a pipeline (its stages already checked) with the command's `let`
    /// variables; the result is materialized. Its `$lookup`s read the other
    /// collections from the same source (the held snapshot, the live
    /// scan's start, the transaction).
    pub fn aggregate(
        &self,
        stages: Vec<Document>,
        limits: &ReadLimits,
        let_vars: Option<&Document>,
    ) -> CmdResult<Vec<Document>> {
        let limits = self.limits_for(limits);
        Ok(match self {
            ReadSource::Live { coll, strategy } => {
                coll.aggregate_let(stages, *strategy, &limits, let_vars)?.0
            }
            ReadSource::Held { coll, .. } => coll.aggregate_let(stages, &limits, let_vars)?,
            ReadSource::Txn(coll) => coll.aggregate_let(stages, let_vars)?,
        })
    }

    /// [`ReadSource::aggregate`] and, for a live run, the engine's account
    /// of it (`AggregateExplain`: strategy, plan, OLCP pass counters).
    pub fn aggregate_run(
        &self,
        stages: Vec<Document>,
        limits: &ReadLimits,
    ) -> CmdResult<(Vec<Document>, Option<Document>)> {
        let limits = self.limits_for(limits);
        Ok(match self {
            ReadSource::Live { coll, strategy } => {
                let (docs, report) = coll.aggregate_limited(stages, *strategy, &limits)?;
                (docs, Some(report.to_document()))
            }
            ReadSource::Held { coll, .. } => {
                let (docs, spills) = coll.aggregate_spilling(stages, &limits, None)?;
                (docs, Some(spills.to_document()))
            }
            ReadSource::Txn(coll) => (Crud::aggregate(coll, stages)?, None),
        })
    }

    /// The engine's explain document of `what` on this source: the plan, and
    /// the strategy that would run with why (`strategy`, `strategyReason`).
    pub fn explain(&self, what: Explained<'_>) -> CmdResult<Document> {
        Ok(match (self, what) {
            (ReadSource::Txn(_), _) => return Err(super::txn::not_in_transaction("'explain'")),
            (ReadSource::Live { coll, strategy }, what) => {
                let s = *strategy;
                match what {
                    Explained::Find(plan) => coll
                        .find(plan.filter.clone())
                        .options(plan.options.clone())
                        .snapshot(s)
                        .explain()?,
                    Explained::Count(query) => coll.explain_count(query, s)?,
                    Explained::Distinct(query) => coll.explain_distinct(query, s)?,
                    Explained::Aggregate(stages) => coll.explain_aggregate_with(stages, s)?,
                }
            }
            (ReadSource::Held { coll, .. }, what) => match what {
                Explained::Find(plan) => coll
                    .find(plan.filter.clone())
                    .options(plan.options.clone())
                    .explain()?,
                Explained::Count(query) | Explained::Distinct(query) => {
                    coll.find(query).explain()?
                }
                Explained::Aggregate(stages) => coll.explain_aggregate(stages)?,
            },
        })
    }
}
