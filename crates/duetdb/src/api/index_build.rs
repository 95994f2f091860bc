//! Index builds that do not block the writer (issue #18 item 9; MongoDB's
//! hybrid index build on our copy-on-write versions).
//!
//! `createIndexes` on a collection of at least [`BACKGROUND_BUILD_MIN_DOCS`]
//! documents builds on the caller's thread, not in the writer:
//! 1. it scans the latest published version (immutable: holding it is free)
//!    into a new index ([`IndexBuild::scan`]); the writer keeps committing;
//! 2. it catches up with the versions published since, by diffing record
//!    heaps (`store::index_build`: no side log in the writer), until fewer
//!    than [`CATCH_UP_IN_WRITER`] records changed in a round (at most
//!    [`MAX_CATCH_UP_ROUNDS`] rounds);
//! 3. one short writer step catches up the last changes against the
//!    working version, checks the spec again, adds the index and logs the
//!    one `CreateIndex` effect — so no write is missed, the WAL and replicas
//!    see only the finished index (replay rebuilds it in the writer, as
//!    before), and a crash mid-build leaves no index (never acknowledged).
//!
//! Smaller collections (and a collection created by the build) keep the
//! in-writer build: the snapshot and catch-up would cost more than they save.
//!
//! Unique indexes: a duplicate in the snapshot, in a catch-up round or in the
//! final step fails the build with 11000 and leaves no index. Writes during
//! the build are not checked against the unfinished index (MongoDB also
//! accepts them and decides at commit): a duplicate written and removed
//! again before a round sees it does not fail the build.
//!
//! Aborts: the build registers itself per database ([`Builds`]);
//! `dropIndexes` of its name (or `*`), dropping or renaming its collection
//! or dropping its database abort it with 276 IndexBuildAborted, and the command's cancel token
//! (`killOp`, `maxTimeMS`, shutdown; the server does not cancel it when the
//! client disconnects, as MongoDB) with the token's code; either way no
//! index is left. An abort that comes too late for the
//! checks still finds the collection replaced or gone at the final step.

use std::sync::Arc;

use bson::Document;
use parking_lot::Mutex;

use crate::api::database::validate_collection_name;
use crate::api::Collection;
use crate::durability::effect::Effect;
use crate::error::{CancelToken, Error, Result};
use crate::store::collection::ID_INDEX_NAME;
use crate::store::index::IndexSpec;
use crate::store::index_build::{IndexBuild, IndexBuildProgress};
use crate::write::command::Command;

/// Collections with fewer documents build their indexes inside the writer.
pub const BACKGROUND_BUILD_MIN_DOCS: usize = 10_000;
/// A catch-up round that found fewer changed records than this leaves the
/// rest to the final step inside the writer.
pub const CATCH_UP_IN_WRITER: usize = 1_000;
/// Catch-up rounds outside the writer before the final step takes whatever
/// is left (bounds a build against a writer that never slows down).
pub const MAX_CATCH_UP_ROUNDS: usize = 16;

/// Where an index is built.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum IndexBuildMode {
    /// Outside the writer for collections of [`BACKGROUND_BUILD_MIN_DOCS`]
    /// documents or more, inside it otherwise.
    #[default]
    Auto,
    /// Inside the writer (every write of the database waits).
    Foreground,
    /// Outside the writer whatever the size (tests, benchmarks).
    Background,
}

/// How [`Collection::create_index_spec_with`] builds.
#[derive(Clone, Default)]
pub struct IndexBuildOptions {
    pub mode: IndexBuildMode,
    /// Cancels a build outside the writer (a build inside it runs to the end).
    pub cancel: CancelToken,
    /// Filled in while the build runs (`currentOp`).
    pub progress: Option<Arc<IndexBuildProgress>>,
    /// Called at every check of a build outside the writer (every few
    /// hundred records, on the building thread, never inside the writer):
    /// lets tests and benchmarks write, drop or cancel at a known point of
    /// the build.
    pub on_check: Option<Arc<dyn Fn() + Send + Sync>>,
}

/// The builds in progress outside the writer, per database.
#[derive(Default)]
pub(crate) struct Builds {
    list: Mutex<Vec<Arc<BuildEntry>>>,
}

struct BuildEntry {
    coll: String,
    index: String,
    /// Why it was aborted, once it was.
    aborted: Mutex<Option<String>>,
}

impl BuildEntry {
    fn check(&self) -> Result<()> {
        match &*self.aborted.lock() {
            Some(why) => Err(Error::IndexBuildAborted(why.clone())),
            None => Ok(()),
        }
    }
}

/// A build's place in [`Builds`], left when it ends however it ends.
struct Registered<'a> {
    builds: &'a Builds,
    entry: Arc<BuildEntry>,
}

impl Drop for Registered<'_> {
    fn drop(&mut self) {
        self.builds
            .list
            .lock()
            .retain(|e| !Arc::ptr_eq(e, &self.entry));
    }
}

impl Builds {
    fn register(&self, coll: &str, index: &str) -> Registered<'_> {
        let entry = Arc::new(BuildEntry {
            coll: coll.to_string(),
            index: index.to_string(),
            aborted: Mutex::new(None),
        });
        self.list.lock().push(entry.clone());
        Registered {
            builds: self,
            entry,
        }
    }

    /// Abort every build of the database (it is being dropped).
    pub(crate) fn abort_all(&self, why: &str) {
        for e in self.list.lock().iter() {
            e.aborted
                .lock()
                .get_or_insert_with(|| format!("Index build aborted: {}: {why}", e.index));
        }
    }

    /// Abort the builds on `coll` (of index `index`, or all); returns how
    /// many. They stop at their next check with 276 IndexBuildAborted.
    pub(crate) fn abort(&self, coll: &str, index: Option<&str>, why: &str) -> usize {
        let list = self.list.lock();
        let mut n = 0;
        for e in list
            .iter()
            .filter(|e| e.coll == coll && index.is_none_or(|i| e.index == i))
        {
            e.aborted
                .lock()
                .get_or_insert_with(|| format!("Index build aborted: {}: {why}", e.index));
            n += 1;
        }
        n
    }
}

impl Collection {
    /// [`Collection::create_index_spec`] with a build mode, a cancel token
    /// and a progress report (`createIndexes` over the wire): see the module
    /// doc for how a large collection is built without blocking writes.
    pub fn create_index_spec_with(
        &self,
        spec: &Document,
        options: &IndexBuildOptions,
    ) -> Result<String> {
        validate_collection_name(&self.name)?;
        // An index without a `collation` gets the collection's default
        // (MongoDB's rule), resolved here so the logged spec names it and
        // replay never re-derives it.
        let default = self
            .db
            .writer()
            .published()
            .collection(&self.name)
            .and_then(|c| c.options.collation.clone());
        let bare = crate::query::index_spec::parse(spec)?;
        let spec = match default {
            // A bare `{_id: 1}` names the `_id` index, which stays simple.
            Some(c) if !spec.contains_key("collation") && !bare.is_id_pattern() => {
                let mut d = spec.clone();
                d.insert("collation", c.spec().to_document());
                crate::query::index_spec::parse(&d)?
            }
            _ => bare,
        };
        let name = if spec.is_id_pattern() {
            ID_INDEX_NAME.to_string()
        } else {
            spec.name.clone()
        };
        if self.build_outside_writer(&spec, options)?.is_none() {
            self.db.submit(Command::CreateIndex {
                coll: self.name.clone(),
                spec,
            })?;
        }
        Ok(name)
    }

    /// Abort the index builds in progress on this collection (of index
    /// `index`, or all of them); returns how many were aborted.
    pub fn abort_index_builds(&self, index: Option<&str>, why: &str) -> usize {
        self.db.index_builds().abort(&self.name, index, why)
    }

    /// The build outside the writer: `None` when it belongs inside the
    /// writer instead, else whether an index was created.
    fn build_outside_writer(
        &self,
        spec: &IndexSpec,
        options: &IndexBuildOptions,
    ) -> Result<Option<bool>> {
        if options.mode == IndexBuildMode::Foreground {
            return Ok(None);
        }
        // Registered before the snapshot is taken, so an abort after it
        // reaches this build.
        let registered = self.db.index_builds().register(&self.name, &spec.name);
        let snapshot = self.db.writer().published();
        let Some(c) = snapshot.collection(&self.name) else {
            return Ok(None); // the writer creates the collection with it
        };
        if options.mode == IndexBuildMode::Auto && c.len() < BACKGROUND_BUILD_MIN_DOCS {
            return Ok(None);
        }
        if !c.check_new_index(spec)? {
            return Ok(Some(false));
        }
        let progress = options.progress.clone().unwrap_or_default();
        let checker = |cancel: CancelToken, entry: Arc<BuildEntry>| {
            move || -> Result<()> {
                cancel.check()?;
                entry.check()
            }
        };
        let mut check = {
            let check = checker(options.cancel.clone(), registered.entry.clone());
            let hook = options.on_check.clone();
            move || -> Result<()> {
                if let Some(hook) = &hook {
                    hook();
                }
                check()
            }
        };
        let mut build = IndexBuild::scan(spec.clone(), c, progress, &mut check)?;
        drop(snapshot);
        let gone = |coll: &str| {
            Error::IndexBuildAborted(format!(
                "Index build aborted: {}: collection {coll} was dropped or renamed during the build",
                spec.name
            ))
        };
        for _ in 0..MAX_CATCH_UP_ROUNDS {
            let latest = self.db.writer().published();
            let c = latest
                .collection(&self.name)
                .ok_or_else(|| gone(&self.name))?;
            if build.catch_up(c, &mut check)? < CATCH_UP_IN_WRITER {
                break;
            }
        }
        let coll = self.name.clone();
        let logged = spec.clone();
        let gone_final = gone(&coll);
        let check = checker(options.cancel.clone(), registered.entry.clone());
        let created = self.db.writer().at_boundary(move |state, fx| {
            check()?;
            let c = state.collection_mut(&coll).ok_or(gone_final)?;
            let created = build.finish(c)?;
            if created {
                fx.record(|| Effect::CreateIndex { coll, spec: logged });
            }
            Ok(created)
        })?;
        drop(registered);
        Ok(Some(created))
    }
}
