//! Analytic sessions (AnKer's hybrid processing): one analytic query made of
//! several read calls, all reading one snapshot (`Fresh`) or the latest state.

use bson::Document;

use crate::api::{Collection, Database, Find, Snapshot, SnapshotCollection};
use crate::error::Result;
use crate::snapshot::named::AnalyticsSnapshot;

/// One analytic query made of any number of read calls (see
/// [`AnalyticsSnapshot`]). Cheap to create; under `Fresh` it holds a snapshot
/// (and so the memory later writes replace) until dropped.
#[derive(Debug, Clone)]
pub struct AnalyticSession {
    db: Database,
    pinned: Option<Snapshot>,
}

impl AnalyticSession {
    pub(crate) fn new(db: Database, pinned: Option<Snapshot>) -> AnalyticSession {
        AnalyticSession { db, pinned }
    }

    pub fn mode(&self) -> AnalyticsSnapshot {
        if self.pinned.is_some() {
            AnalyticsSnapshot::Fresh
        } else {
            AnalyticsSnapshot::Latest
        }
    }

    /// The csn every call reads, when the session is pinned.
    pub fn csn(&self) -> Option<u64> {
        self.pinned.as_ref().map(Snapshot::csn)
    }

    /// The pinned snapshot, if any.
    pub fn snapshot(&self) -> Option<&Snapshot> {
        self.pinned.as_ref()
    }

    pub fn collection(&self, name: &str) -> AnalyticCollection {
        AnalyticCollection(match &self.pinned {
            Some(s) => Reads::Pinned(s.collection(name)),
            None => Reads::Latest(self.db.collection(name)),
        })
    }
}

#[derive(Debug, Clone)]
enum Reads {
    Pinned(SnapshotCollection),
    Latest(Collection),
}

/// Reads on one collection within an analytic session.
#[derive(Debug, Clone)]
pub struct AnalyticCollection(Reads);

impl AnalyticCollection {
    pub fn find(&self, filter: Document) -> Find {
        match &self.0 {
            Reads::Pinned(c) => c.find(filter),
            Reads::Latest(c) => c.find(filter),
        }
    }

    pub fn find_one(&self, filter: Document) -> Result<Option<Document>> {
        match &self.0 {
            Reads::Pinned(c) => c.find_one(filter),
            Reads::Latest(c) => c.find_one(filter),
        }
    }

    pub fn count(&self, filter: Document) -> Result<u64> {
        match &self.0 {
            Reads::Pinned(c) => c.count(filter),
            Reads::Latest(c) => c.count(filter),
        }
    }
}
