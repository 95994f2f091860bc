//! Held snapshots: a frozen database state and read-only collection handles.

use std::sync::Arc;

use bson::{Bson, Document};

use crate::api::find::Source;
use crate::api::*;
use crate::error::Result;
use crate::query::distinct::Distinct;
use crate::query::planner::{self};
use crate::query::Filter;
use crate::store::collection::{CollectionState, ID_INDEX_NAME};
use crate::store::DbState;

/// A frozen, consistent view of a whole database: everything committed up to
/// `csn()` and nothing after, for as long as it is held.
#[derive(Clone, Debug)]
pub struct Snapshot {
    state: Arc<DbState>,
}

impl Snapshot {
    /// A snapshot over a state the caller took from the published root (or a
    /// restriction of one to some collections).
    pub(crate) fn from_state(state: Arc<DbState>) -> Snapshot {
        Snapshot { state }
    }

    pub fn csn(&self) -> u64 {
        self.state.csn
    }

    /// The cluster time of the last commit group in this state (0 when
    /// none is known: an empty database, or a state loaded from a
    /// version-1 checkpoint with no later commit). Every later group of the
    /// database has a greater time, so `cluster_time() + 1` names the moment
    /// just after this state (change streams start there).
    pub fn cluster_time(&self) -> u64 {
        self.state.ts
    }

    /// Read-only handle on a collection as of this snapshot.
    pub fn collection(&self, name: &str) -> SnapshotCollection {
        SnapshotCollection {
            state: self.state.clone(),
            name: name.to_string(),
            collation: None,
        }
    }

    pub fn list_collection_names(&self) -> Vec<String> {
        self.state.collections.keys().cloned().collect()
    }

    /// The `create`/`collMod` options of collection `name`, if it exists.
    pub fn collection_options(
        &self,
        name: &str,
    ) -> Option<crate::store::options::CollectionOptions> {
        self.state.collection(name).map(|c| c.options.clone())
    }

    /// The underlying state (for the query layers built on snapshots).
    pub fn state(&self) -> &Arc<DbState> {
        &self.state
    }
}

/// Read operations shared by live and snapshot collection handles.
pub(crate) fn count_in(state: &DbState, coll: &str, filter: &Document) -> Result<u64> {
    let filter = crate::query::expr::under_read_time(state.ts, || Filter::parse(filter))?;
    match state.collection(coll) {
        Some(c) => planner::count(c, &filter, None),
        None => Ok(0),
    }
}

pub(crate) fn stats_of(c: &CollectionState) -> CollStats {
    let count = c.len() as u64;
    let mut indexes = vec![(ID_INDEX_NAME.to_string(), c.id_index.len() as u64)];
    indexes.extend(
        c.indexes
            .iter()
            .filter(|i| !i.spec.is_collated_id())
            .map(|i| (i.spec.name.clone(), i.len() as u64)),
    );
    CollStats {
        count,
        data_bytes: c.data_bytes,
        avg_obj_size: c.data_bytes.checked_div(count).unwrap_or(0),
        indexes,
        heap_nodes: c.heap.stats().nodes as u64,
    }
}

/// A collection as of a snapshot (read-only).
#[derive(Clone, Debug)]
pub struct SnapshotCollection {
    state: Arc<DbState>,
    name: String,
    /// The reads' `collation` option (`None`: the collection's default).
    collation: Option<Document>,
}

impl SnapshotCollection {
    pub(crate) fn name(&self) -> &str {
        &self.name
    }

    pub fn find(&self, filter: Document) -> Find {
        let mut find = Find::new(Source::Fixed(self.state.clone()), &self.name, filter);
        find.options.collation = self.collation.clone();
        find
    }

    /// The document a find `{_id: id}` reads in this snapshot, looked up in
    /// the `_id` index without planning (the server's point read, which
    /// sends the stored bytes as they are): counted as a use of the `_id`
    /// index as the planned read counts it. `None` when such a find is not a
    /// plain `_id` lookup here, so the caller must plan it: a collation
    /// applies (this handle's or the collection's default), or `id` is not
    /// one of the values whose index key is itself (an integer, string or
    /// ObjectId). `Some(None)`: no document has that `_id` (or the
    /// collection does not exist).
    pub fn point_read(&self, id: &Bson) -> Option<Option<crate::doc::DocRef>> {
        let key = match id {
            Bson::Int32(_) | Bson::Int64(_) | Bson::String(_) | Bson::ObjectId(_) => {
                crate::doc::value::to_raw(id)?
            }
            _ => return None,
        };
        if self.collation.is_some() {
            return None;
        }
        let Some(c) = self.state.collection(&self.name) else {
            return Some(None);
        };
        if c.options.collation.is_some() {
            return None;
        }
        c.id_usage.record();
        Some(c.rid_of_id(&key).and_then(|rid| c.get(rid)).cloned())
    }

    /// Calls `f` with the BSON bytes of every document of the collection as
    /// of this snapshot, in storage order, stopping early when `f` returns
    /// `false`; how many documents it was called with. What a digest of a
    /// snapshot is computed over (a replica set compares members' named
    /// snapshots, docs/design.md §19); no query runs, nothing is decoded.
    pub fn for_each_raw(&self, mut f: impl FnMut(&[u8]) -> bool) -> u64 {
        let Some(c) = self.state.collection(&self.name) else {
            return 0;
        };
        let mut n = 0;
        for (_, doc) in c.heap.iter() {
            n += 1;
            if !f(doc.as_bytes()) {
                break;
            }
        }
        n
    }

    /// This handle reading the collection's indexes in `read`'s view:
    /// `Stale` plans and scans the merged index roots only (`store::delta`:
    /// an earlier state of the indexes, cheaper to walk), fetching this
    /// snapshot's documents, so every result still matches the filter but
    /// documents whose entries are newer than the last merge are missed.
    /// `Fresh` (the default) is exactly the snapshot.
    pub fn with_index_read(mut self, read: crate::store::delta::IndexRead) -> SnapshotCollection {
        if read == crate::store::delta::IndexRead::Stale {
            self.state = Arc::new(self.state.stale_for(&self.name));
        }
        self
    }

    /// This handle with a `collation` option for its reads (`None`: the
    /// collection's default).
    pub fn with_collation(mut self, collation: Option<Document>) -> SnapshotCollection {
        self.collation = collation;
        self
    }

    /// The collator of this handle's reads: its `collation` option, else
    /// the collection's default in the snapshot (`None`: simple).
    pub fn collator(&self) -> Result<Option<Arc<crate::doc::collation::Collator>>> {
        match &self.collation {
            Some(d) => crate::doc::collation::Collator::from_document(d),
            None => Ok(self
                .state
                .collection(&self.name)
                .and_then(|c| c.options.collation.clone())),
        }
    }
    pub fn find_one(&self, filter: Document) -> Result<Option<Document>> {
        Ok(self.find(filter).limit(1).run()?.pop())
    }
    pub fn count(&self, filter: Document) -> Result<u64> {
        if !filter.is_empty() && self.collator()?.is_some() {
            return Ok(self.find(filter).raw()?.len() as u64);
        }
        count_in(&self.state, &self.name, &filter)
    }
    /// Distinct values of `path` among matching documents, in BSON order.
    pub fn distinct(&self, path: &str, filter: Document) -> Result<Vec<Bson>> {
        let mut d = Distinct::new(path)?.with_collation(self.collator()?);
        for doc in self.find(filter).raw()? {
            d.feed(&doc);
        }
        d.finish()
    }
    pub fn stats(&self) -> Option<CollStats> {
        self.state.collection(&self.name).map(stats_of)
    }

    /// The held state (the other collections a pipeline reads come from it).
    /// The collection's name.
    pub(crate) fn coll_name(&self) -> &str {
        &self.name
    }

    pub(crate) fn state(&self) -> &Arc<DbState> {
        &self.state
    }

    /// The index specifications as of the snapshot, `_id` first;
    /// NamespaceNotFound when the collection is not in it.
    pub fn list_indexes(&self) -> Result<Vec<Document>> {
        crate::api::collection::list_indexes_in(&self.state, &self.name)
    }

    /// [`Collection::storage_stats`] of the version the snapshot holds (the
    /// VLS figures are the collection's, shared by every version).
    pub fn storage_stats(&self) -> Result<crate::api::stats::StorageStats> {
        crate::api::stats::storage_stats_in(&self.state, &self.name)
    }
}
