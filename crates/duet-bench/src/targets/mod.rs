//! Targets: what a workload runs against, and the one interface every
//! workload is written against. A [`Target`] is a system (the embedded
//! engine, a MongoDB-wire server through the official driver, a peer); it
//! offers the capabilities it has — YCSB, HTAP, snapshots, old-version
//! space — and a workload asks for the one it needs, so each workload body
//! exists once and runs on every target that can serve it.
//!
//! A target hands out one session per client thread (connections of
//! client/server targets are not shareable). Sessions are created before a
//! timed phase starts where a workload controls that (`space`), so no
//! measured operation pays for a connection.
//!
//! Where the operations live: the embedded engine in [`embedded`], the wire
//! target in `crate::wire`, the peers in `crate::peers`; the documents they
//! all store in [`model`].

pub mod embedded;
pub mod model;

pub use embedded::Embedded;
pub use model::{
    checked_ident, htap_batches, htap_doc, htap_doc_bytes, htap_json, htap_payload, ycsb_doc,
    Field, VPerm, HTAP_TABLE, LOAD_BATCH, SNAPSHOT_TABLE, SPACE_TABLE, YCSB_TABLE,
};

use anyhow::{anyhow, Result};
use bson::Document;

/// The engine's snapshot strategy is the one a workload names: results
/// record it by `Strategy::name`.
pub use duetdb::Strategy;

/// The strategies a benchmark may ask for. `auto` is left out on purpose: a
/// figure must say which strategy it measured, not which one was delegated.
pub const STRATEGIES: [&str; 4] = ["none", "vls", "olcp", "cow"];

/// The clap parser of `--strategy` values (one of [`STRATEGIES`]).
pub fn strategy_arg() -> impl clap::builder::TypedValueParser<Value = Strategy> {
    use clap::builder::TypedValueParser;
    clap::builder::PossibleValuesParser::new(STRATEGIES).try_map(|s| s.parse::<Strategy>())
}

/// Serialize strategies by name (the `params` of a result).
pub fn serialize_strategies<S: serde::Serializer>(v: &[Strategy], s: S) -> Result<S::Ok, S::Error> {
    s.collect_seq(v.iter().map(|x| x.name()))
}

/// A system the workloads run against.
pub trait Target: Sync {
    /// The name its figures are recorded under (e.g. `duetdb-embedded`).
    fn name(&self) -> String;
    /// How this target was set up, recorded in the result's notes.
    fn setup_note(&self) -> Option<String> {
        None
    }
    fn as_ycsb(&self) -> Option<&dyn YcsbTarget> {
        None
    }
    fn as_htap(&self) -> Option<&dyn HtapTarget> {
        None
    }
    /// duetdb's own snapshots (creation, copy-on-write, what a held one keeps).
    fn as_snapshot(&self) -> Option<&dyn SnapshotTarget> {
        None
    }
    /// duetdb's old versions under updates and long queries.
    fn as_space(&self) -> Option<&dyn SpaceTarget> {
        None
    }
}

/// The capability `cap` of every target, or an error naming the first target
/// without it (before anything runs).
pub fn capable<'a, T: ?Sized>(
    targets: &'a [Box<dyn Target>],
    workload: &str,
    cap: impl Fn(&'a dyn Target) -> Option<&'a T>,
) -> Result<Vec<&'a T>> {
    targets
        .iter()
        .map(|t| {
            cap(t.as_ref()).ok_or_else(|| {
                let how = t.setup_note().unwrap_or_else(|| t.name());
                anyhow!("{workload} cannot run on {}: {how}", t.name())
            })
        })
        .collect()
}

/// A store YCSB can run on (YCSB's `DB` interface).
pub trait YcsbTarget: Target {
    /// Drop and recreate the table.
    fn reset(&self) -> Result<()>;
    fn session(&self) -> Result<Box<dyn YcsbSession + '_>>;
}

pub trait YcsbSession {
    fn insert_batch(&mut self, records: &[(String, Vec<Field>)]) -> Result<()>;
    fn insert(&mut self, key: &str, fields: &[Field]) -> Result<()>;
    /// Read all fields; false when the key is absent.
    fn read(&mut self, key: &str) -> Result<bool>;
    /// Set the given fields; false when the key is absent.
    fn update(&mut self, key: &str, fields: &[Field]) -> Result<bool>;
    /// Up to `count` records in key order from `start`; how many were read.
    fn scan(&mut self, start: &str, count: usize) -> Result<usize>;
}

/// A store the HTAP workload can run on.
pub trait HtapTarget: Target {
    /// How a requested strategy is served here: `Ok(label)` or unsupported.
    fn strategy_label(&self, strategy: Strategy) -> Result<String>;
    /// Peers have one mechanism of their own (e.g. a REPEATABLE READ
    /// transaction): its label, and every cell runs once with it.
    fn native_strategy(&self) -> Option<String> {
        None
    }
    /// Load documents `0..records` (see [`htap_doc`]) and index `v`.
    fn load(&self, records: u64) -> Result<()>;
    fn session(&self) -> Result<Box<dyn HtapSession + '_>>;
    /// Space figures (name with unit → value), sampled during a run.
    fn space(&self) -> Result<Vec<(String, f64)>>;
    /// A measured cell starts (targets reset their own peak counters here).
    fn begin_cell(&self) {}
    /// Figures the target tracks exactly over a cell (e.g. engine-kept peaks).
    fn cell_figures(&self) -> Vec<(String, f64)> {
        Vec::new()
    }
    /// Figures of the whole cell reported under their own name (e.g. the
    /// mean number of scans a remset version served).
    fn cell_counters(&self) -> Vec<(String, f64)> {
        Vec::new()
    }
}

pub trait HtapSession {
    /// Replace the `f2` payload of document `id`.
    fn update(&mut self, id: u64, payload: &str) -> Result<()>;
    /// Count every document with a predicate that forces a full scan.
    fn full_scan_count(&mut self, strategy: Strategy) -> Result<u64>;
    /// Count documents with `lo <= v < hi` through the index on `v`.
    fn range_count(&mut self, lo: u64, hi: u64, strategy: Strategy) -> Result<u64>;
}

/// A duetdb the `snapshot` workload can measure: one client at a time.
pub trait SnapshotTarget: Target {
    fn session(&self) -> Result<Box<dyn SnapshotSession + '_>>;
}

/// One client of the `snapshot` workload, on [`SNAPSHOT_TABLE`].
pub trait SnapshotSession {
    /// Start a run: an empty collection indexed on `v`, no snapshot of an
    /// earlier (possibly interrupted) run left.
    fn reset(&mut self) -> Result<()>;
    /// Remove what the run made.
    fn finish(&mut self) -> Result<()>;
    fn insert(&mut self, docs: Vec<Document>) -> Result<()>;
    /// Bytes of the stored documents, as the engine counts them.
    fn data_bytes(&mut self) -> Result<u64>;
    /// The cost of making a snapshot of what is loaded, by this target's
    /// own means, as (figure, value) in the order they are recorded.
    fn creation_figures(&mut self, notes: &mut Vec<String>) -> Result<Vec<(String, f64)>>;
    /// Make (and hold) a snapshot called `name`.
    fn create_snapshot(&mut self, name: &str) -> Result<()>;
    fn drop_snapshot(&mut self, name: &str) -> Result<()>;
    /// Set `f2` of document `id`.
    fn update(&mut self, id: u64, payload: &str) -> Result<()>;
    /// Set `f2` of documents `lo..hi` in one command.
    fn update_range(&mut self, lo: u64, hi: u64, payload: &str) -> Result<()>;
    /// Resident memory (MiB) of the process the engine runs in, when that
    /// is this process and nothing else shares it.
    fn memory_mb(&mut self) -> Option<f64> {
        None
    }
    /// (bytes, documents) that only snapshot `name` still references, when
    /// the target reports it.
    fn retained(&mut self, _name: &str) -> Result<Option<(f64, f64)>> {
        Ok(None)
    }
}

/// The engine's old-version figures at one moment (`space`).
#[derive(Debug, Clone, Copy, Default)]
pub struct VlsFigures {
    /// Versions handed to running OLCP queries and not yet mapped.
    pub olcp_inflight: f64,
    /// Propagations since the engine started (a running total).
    pub olcp_propagated: u64,
    pub remset_entries: f64,
    pub remset_bytes: f64,
    pub scans_active: f64,
}

/// A duetdb the `space` workload can measure.
pub trait SpaceTarget: Target {
    /// Load documents `0..records` into [`SPACE_TABLE`] (no index), dropping
    /// what an earlier run left; returns the size of one document.
    fn load(&self, records: u64) -> Result<u64>;
    /// How this target runs the queries and reads old versions, for the notes.
    fn space_notes(&self, work_ns_per_doc: u64, sample_ms: u64, retained_every_ms: u64) -> String;
    fn session(&self) -> Result<Box<dyn SpaceSession + '_>>;
    /// A measured cell starts: the engine's peak counters restart.
    fn begin_cell(&self);
    /// Resident memory (MiB) of the process the engine runs in, when it is
    /// this one.
    fn rss_mb(&self) -> Option<f64>;
    /// Remove what the run made.
    fn finish(&self) -> Result<()>;
}

/// The latest state of [`SPACE_TABLE`], one version per document: what the
/// bench's own `steam` strategy (`crate::workload::steam`) keeps old
/// versions beside.
pub trait SpaceLatest {
    /// Set `f2` of document `id`; false when that changed nothing (no
    /// version made). A missing document is an error.
    fn update(&mut self, id: u64, payload: &str) -> Result<bool>;
    /// The stored bytes of document `id` now (a missing one is an error).
    fn get_doc(&mut self, id: u64) -> Result<Vec<u8>>;
    /// Hand every document of the latest state (read page by page, no
    /// snapshot) with its `_id` to `visit`, stopping at its first error;
    /// how many were visited.
    fn scan_latest(&mut self, visit: &mut dyn FnMut(u64, &[u8]) -> Result<()>) -> Result<u64>;
}

/// One thread of a `space` cell: an update stream, a query loop or the sampler.
pub trait SpaceSession: SpaceLatest + Send {
    /// A full-collection OLCP query with `ns` of busy work per document;
    /// the documents it visited.
    fn olcp_query(&mut self, ns: u64) -> Result<u64>;
    /// A full scan under `vls`, likewise.
    fn vls_query(&mut self, ns: u64) -> Result<u64>;
    /// A full scan of a snapshot held for the query's duration, as query
    /// thread `slot` (the sampler sums what the held snapshots retain).
    fn held_query(&mut self, ns: u64, slot: usize) -> Result<u64>;
    fn vls(&mut self) -> Result<VlsFigures>;
    /// (documents, bytes) the snapshots held by running queries retain.
    fn retained_by_queries(&mut self) -> Result<(f64, f64)>;
}
