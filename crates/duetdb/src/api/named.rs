//! The named-snapshot API of [`Database`]: each method delegates to the
//! registry in `snapshot::named`, which owns the protocol and its invariants.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use crate::api::AnalyticSession;
use crate::api::{Database, Snapshot};
use crate::error::Result;
use crate::snapshot::named::{
    AnalyticsSnapshot, Clock, NamedCopy, NamedImage, NamedSnapshots, SnapshotInfo, SnapshotOptions,
};
use crate::snapshot::retained::{retained_between, RetainedCost};

impl Database {
    fn snapshots(&self) -> NamedSnapshots<'_> {
        NamedSnapshots {
            reg: self.snapshot_registry(),
            writer: self.writer(),
            durable: self.durable(),
            db: self.name(),
        }
    }

    /// Take a named snapshot of the latest committed state (of every
    /// collection, or only of `collections`; others are not pinned), held until
    /// dropped or until `ttl` has passed.
    ///
    /// O(1) for the whole database, O(k) for k listed collections; no node is
    /// copied and the writer is not involved: the published root is a
    /// consistent cut at its `csn`.
    pub fn create_snapshot(
        &self,
        name: &str,
        collections: Option<Vec<String>>,
        ttl: Option<Duration>,
    ) -> Result<SnapshotInfo> {
        self.create_snapshot_with(
            name,
            SnapshotOptions {
                collections,
                ttl,
                durable: false,
            },
        )
    }

    /// [`Database::create_snapshot`] with options; `durable: true` also writes
    /// the snapshot's state to its own checkpoint file and records it in the
    /// manifest (O(size of the snapshot) of I/O, on the caller's thread; the
    /// writer keeps going). It then survives restarts and is readable by name
    /// after reopening. A failed write (a full disk, an I/O error) fails the
    /// call and registers nothing. In-memory databases: `IllegalOperation`.
    pub fn create_snapshot_with(&self, name: &str, opts: SnapshotOptions) -> Result<SnapshotInfo> {
        self.snapshots().create_snapshot_with(name, opts)
    }

    /// [`Database::create_snapshot_with`] created at wall-clock time
    /// `created` rather than now: a replica set's members take a named
    /// snapshot at the primary's creation time, so its `created`, age and
    /// TTL expiry are the same everywhere.
    pub fn create_snapshot_at(
        &self,
        name: &str,
        opts: SnapshotOptions,
        created: std::time::SystemTime,
    ) -> Result<SnapshotInfo> {
        self.snapshots()
            .create_snapshot_created(name, opts, Some(created))
    }

    /// Every named snapshot held now, each with its description and what its
    /// image is written from ([`NamedCopy::write_image`]): what a copy of
    /// the database carries besides its state (a replica set's Raft
    /// snapshot). O(snapshots held); nothing is written or opened.
    pub fn named_copies(&self) -> Vec<NamedCopy> {
        self.snapshots().copies()
    }

    /// Hold the named snapshot `image` describes, from its checkpoint image
    /// `from` (moved into the database's directory): durable ones pinned,
    /// every one loaded on its first read (see
    /// `snapshot::named::NamedSnapshots::install_image`).
    pub fn install_named_image(
        &self,
        image: &NamedImage,
        from: &std::path::Path,
    ) -> Result<SnapshotInfo> {
        self.snapshots().install_image(image, from)
    }

    /// Register the durable snapshots the manifest records (at open).
    pub(crate) fn register_durable_snapshots(&self) {
        self.snapshots().register_durable_snapshots()
    }

    /// The named snapshot, to run any read on. The returned handle is a lease:
    /// it stays readable even if the name is dropped or expires meanwhile (its
    /// memory is freed when the last lease ends), but the name no longer
    /// resolves. A durable snapshot reopened from disk is loaded on its first
    /// read; a damaged image gives a storage error naming the snapshot and file.
    pub fn named_snapshot(&self, name: &str) -> Result<Snapshot> {
        self.snapshots()
            .named_snapshot(name)
            .map(Snapshot::from_state)
    }

    /// Forget a named snapshot; its memory is freed once no lease holds it. A
    /// durable one is removed from the manifest (atomically), then its file
    /// deleted; if the manifest cannot be rewritten the call fails and the
    /// snapshot stays.
    pub fn drop_snapshot(&self, name: &str) -> Result<()> {
        self.snapshots().drop_snapshot(name)
    }

    /// Every held named snapshot, by name, with what it retains. Expired ones
    /// are swept first.
    pub fn list_snapshots(&self) -> Vec<SnapshotInfo> {
        self.snapshots().list_snapshots()
    }

    /// One named snapshot's description, with its retained cost.
    pub fn snapshot_info(&self, name: &str) -> Result<SnapshotInfo> {
        self.snapshots().snapshot_info(name)
    }

    /// Drop every expired named snapshot now; returns how many. (Expiry is
    /// otherwise lazy: on access by name, create and list.)
    pub fn expire_snapshots(&self) -> usize {
        self.snapshots().expire_snapshots()
    }

    /// Replace the clock that TTLs are measured with (tests use
    /// [`crate::ManualClock`]).
    pub fn set_snapshot_clock(&self, clock: Arc<dyn Clock>) {
        self.snapshots().set_snapshot_clock(clock)
    }

    /// What the given snapshot retains compared with the latest state.
    pub fn retained_by(&self, snapshot: &Snapshot) -> RetainedCost {
        snapshot.retained(&self.snapshot())
    }

    /// The default snapshot mode of analytic sessions.
    pub fn analytics_mode(&self) -> AnalyticsSnapshot {
        match self.snapshot_registry().analytics.load(Ordering::Relaxed) {
            1 => AnalyticsSnapshot::Latest,
            _ => AnalyticsSnapshot::Fresh,
        }
    }

    pub fn set_analytics_mode(&self, mode: AnalyticsSnapshot) {
        let v = match mode {
            AnalyticsSnapshot::Fresh => 0,
            AnalyticsSnapshot::Latest => 1,
        };
        self.snapshot_registry()
            .analytics
            .store(v, Ordering::Relaxed);
    }

    /// Start an analytic session in the database's analytics mode: under
    /// `Fresh` every call of the session reads one snapshot taken now.
    pub fn analytics(&self) -> AnalyticSession {
        self.analytics_with(self.analytics_mode())
    }

    /// Start an analytic session in an explicit mode.
    pub fn analytics_with(&self, mode: AnalyticsSnapshot) -> AnalyticSession {
        AnalyticSession::new(
            self.clone(),
            match mode {
                AnalyticsSnapshot::Fresh => Some(self.snapshot()),
                AnalyticsSnapshot::Latest => None,
            },
        )
    }
}

impl Snapshot {
    /// Nodes, documents and bytes this snapshot retains that `latest` does not
    /// reach. O(nodes of both versions + documents in pages either one
    /// copied): an explicit accounting call, never on a read or write path.
    pub fn retained(&self, latest: &Snapshot) -> RetainedCost {
        retained_between(self.state(), latest.state())
    }
}
