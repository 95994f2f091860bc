//! Targets: what a workload runs against. A target hands out one session per
//! client thread (connections of client/server peers are not shareable);
//! workloads only speak these traits, so the embedded engine, the MongoDB-wire
//! target and the peers are interchangeable.
//!
//! Two data models: YCSB's `usertable` (string key, `field0..fieldN` strings)
//! and the HTAP table (integer `_id`, ~240-byte documents with an indexed,
//! uniformly distributed `v` used for range scans of a given selectivity).

use anyhow::{bail, Result};
use duetdb::bson::{doc, Document};
use duetdb::RemsetMode;
use duetdb::{Collection, Database, IndexOptions};

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

/// One YCSB field value.
pub type Field = (String, String);

/// A store YCSB can run on (YCSB's `DB` interface).
pub trait YcsbTarget: Sync {
    fn name(&self) -> String;
    /// How this target was set up, recorded in the result's notes (e.g. the
    /// wire target's server, version and durability).
    fn setup_note(&self) -> Option<String> {
        None
    }
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
pub trait HtapTarget: Sync {
    fn name(&self) -> String;
    /// As [`YcsbTarget::setup_note`].
    fn setup_note(&self) -> Option<String> {
        None
    }
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
}

pub trait HtapSession {
    /// Replace the `f2` payload of document `id`.
    fn update(&mut self, id: u64, payload: &str) -> Result<()>;
    /// Count every document with a predicate that forces a full scan.
    fn full_scan_count(&mut self, strategy: Strategy) -> Result<u64>;
    /// Count documents with `lo <= v < hi` through the index on `v`.
    fn range_count(&mut self, lo: u64, hi: u64, strategy: Strategy) -> Result<u64>;
}

/// `v` of each document: a permutation of `0..records` (affine map modulo a
/// prime ≥ records, cycle-walked back into range), so a range of width w
/// selects exactly w documents spread over the whole table.
#[derive(Debug, Clone, Copy)]
pub struct VPerm {
    records: u64,
    prime: u64,
}

impl VPerm {
    pub fn new(records: u64) -> VPerm {
        let is_prime = |m: u64| {
            m >= 2
                && (2..)
                    .take_while(|d| d * d <= m)
                    .all(|d| !m.is_multiple_of(d))
        };
        let prime = (records.max(2)..).find(|&m| is_prime(m)).unwrap_or(records);
        VPerm { records, prime }
    }

    /// Requires: `i < records`.
    pub fn v(&self, i: u64) -> u64 {
        debug_assert!(i < self.records);
        let mut x = i;
        loop {
            x = ((x as u128 * 2_654_435_761u128 + 7) % self.prime as u128) as u64;
            if x < self.records {
                return x;
            }
        }
    }
}

/// The HTAP document: about 240 bytes of BSON (the VLS paper's record size).
pub fn htap_doc(i: u64, perm: &VPerm) -> Document {
    let id = i as i64;
    let region = ["north", "south", "east", "west"][(i % 4) as usize];
    doc! {
        "_id": id,
        "v": perm.v(i) as i64,
        "b": id % 1000,
        "region": region,
        "f1": format!("{:0>40}", i),
        "f2": format!("{:x>60}", i.wrapping_mul(7)),
        "f3": format!("{:y>60}", i.wrapping_mul(13)),
    }
}

/// A payload for `f2` of the same length as the loaded one.
pub fn htap_payload(n: u64) -> String {
    format!("{:z>60}", n)
}

/// The duetdb engine, in process.
pub struct Embedded {
    db: Database,
    remset: RemsetMode,
}

pub const YCSB_TABLE: &str = "usertable";
pub const HTAP_TABLE: &str = "htap";

impl Default for Embedded {
    fn default() -> Self {
        Self::new()
    }
}

impl Embedded {
    pub fn new() -> Embedded {
        Embedded::with_remset(RemsetMode::Shared)
    }

    /// An embedded target whose VLS remset is kept in `remset` mode (the
    /// paper's comparison: shared vs one per scan vs reclaim at scan end).
    pub fn with_remset(remset: RemsetMode) -> Embedded {
        let options = duetdb::DbOptions {
            vls: duetdb::VlsOptions {
                remset,
                ..Default::default()
            },
            ..Default::default()
        };
        Embedded {
            db: Database::with_options("bench", None, options),
            remset,
        }
    }
    pub fn database(&self) -> &Database {
        &self.db
    }
}

struct EmbeddedYcsb {
    coll: Collection,
}

fn ycsb_doc(key: &str, fields: &[Field]) -> Document {
    let mut d = doc! {"_id": key};
    for (k, v) in fields {
        d.insert(k.clone(), v.clone());
    }
    d
}

impl YcsbTarget for Embedded {
    fn name(&self) -> String {
        "duetdb-embedded".into()
    }
    fn reset(&self) -> Result<()> {
        self.db.drop_collection(YCSB_TABLE)?;
        Ok(())
    }
    fn session(&self) -> Result<Box<dyn YcsbSession + '_>> {
        Ok(Box::new(EmbeddedYcsb {
            coll: self.db.collection(YCSB_TABLE),
        }))
    }
}

impl YcsbSession for EmbeddedYcsb {
    fn insert_batch(&mut self, records: &[(String, Vec<Field>)]) -> Result<()> {
        let docs: Vec<Document> = records.iter().map(|(k, f)| ycsb_doc(k, f)).collect();
        self.coll.insert_many(docs, true)?;
        Ok(())
    }
    fn insert(&mut self, key: &str, fields: &[Field]) -> Result<()> {
        self.coll.insert_one(ycsb_doc(key, fields))?;
        Ok(())
    }
    fn read(&mut self, key: &str) -> Result<bool> {
        Ok(self.coll.find_one(doc! {"_id": key})?.is_some())
    }
    fn update(&mut self, key: &str, fields: &[Field]) -> Result<bool> {
        let mut set = Document::new();
        for (k, v) in fields {
            set.insert(k.clone(), v.clone());
        }
        let r = self
            .coll
            .update_one(doc! {"_id": key}, doc! {"$set": set})?;
        Ok(r.matched > 0)
    }
    fn scan(&mut self, start: &str, count: usize) -> Result<usize> {
        let docs = self
            .coll
            .find(doc! {"_id": {"$gte": start}})
            .sort(doc! {"_id": 1})
            .limit(count as u64)
            .run()?;
        Ok(docs.len())
    }
}

struct EmbeddedHtap {
    coll: Collection,
}

impl HtapTarget for Embedded {
    fn name(&self) -> String {
        match self.remset {
            RemsetMode::Shared => "duetdb-embedded".into(),
            RemsetMode::PerScan => "duetdb-embedded[remset=per-scan]".into(),
            RemsetMode::ReclaimAtScanEnd => "duetdb-embedded[remset=scan-end]".into(),
        }
    }
    fn begin_cell(&self) {
        self.db.reset_vls_peaks();
    }
    fn cell_figures(&self) -> Vec<(String, f64)> {
        let v = self.db.vls_stats();
        // The workload reports these as `<name>_peak`; the engine tracks the
        // exact peaks since `begin_cell`.
        vec![
            ("remset_entries".into(), v.remset.entries_peak as f64),
            (
                "remset_mb".into(),
                v.remset.bytes_peak as f64 / (1024.0 * 1024.0),
            ),
        ]
    }
    fn strategy_label(&self, strategy: Strategy) -> Result<String> {
        match strategy {
            Strategy::None => Ok("none (latest state, page by page)".into()),
            Strategy::Cow => Ok("cow (held root)".into()),
            Strategy::Vls => Ok("vls (status bits + shared remset)".into()),
            Strategy::Olcp => Ok("olcp (status bits + propagation)".into()),
            Strategy::Auto => bail!("auto is not a measured strategy"),
        }
    }
    fn load(&self, records: u64) -> Result<()> {
        self.db.drop_collection(HTAP_TABLE)?;
        let coll = self.db.collection(HTAP_TABLE);
        let perm = VPerm::new(records);
        let mut batch = Vec::with_capacity(10_000);
        for i in 0..records {
            batch.push(htap_doc(i, &perm));
            if batch.len() == 10_000 {
                coll.insert_many(std::mem::take(&mut batch), true)?;
            }
        }
        if !batch.is_empty() {
            coll.insert_many(batch, true)?;
        }
        coll.create_index(doc! {"v": 1}, IndexOptions::default())?;
        Ok(())
    }
    fn session(&self) -> Result<Box<dyn HtapSession + '_>> {
        Ok(Box::new(EmbeddedHtap {
            coll: self.db.collection(HTAP_TABLE),
        }))
    }
    fn space(&self) -> Result<Vec<(String, f64)>> {
        Ok(vec![("rss_mb".into(), crate::machine::rss_mb())])
    }
}

impl HtapSession for EmbeddedHtap {
    fn update(&mut self, id: u64, payload: &str) -> Result<()> {
        let r = self
            .coll
            .update_one(doc! {"_id": id as i64}, doc! {"$set": {"f2": payload}})?;
        anyhow::ensure!(r.matched == 1, "document {id} missing");
        Ok(())
    }
    fn full_scan_count(&mut self, strategy: Strategy) -> Result<u64> {
        // `b` is not indexed: the count visits every document.
        let filter = doc! {"b": {"$gte": 0}};
        Ok(self.coll.count_with(filter, strategy)?)
    }
    fn range_count(&mut self, lo: u64, hi: u64, strategy: Strategy) -> Result<u64> {
        let filter = doc! {"v": {"$gte": lo as i64, "$lt": hi as i64}};
        Ok(self.coll.count_with(filter, strategy)?)
    }
}

/// The HTAP document as JSON text (for SQL peers): the same fields and sizes.
pub fn htap_json(i: u64, perm: &VPerm) -> String {
    let region = ["north", "south", "east", "west"][(i % 4) as usize];
    serde_json::json!({
        "_id": i,
        "v": perm.v(i),
        "b": i % 1000,
        "region": region,
        "f1": format!("{:0>40}", i),
        "f2": format!("{:x>60}", i.wrapping_mul(7)),
        "f3": format!("{:y>60}", i.wrapping_mul(13)),
    })
    .to_string()
}

/// A SQL identifier we generated ourselves (`field7`); refuses anything else.
pub fn checked_ident(name: &str) -> Result<&str> {
    if !name.is_empty() && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
        Ok(name)
    } else {
        bail!("not a plain identifier: {name:?}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn v_is_a_permutation_and_docs_are_about_240_bytes() {
        let n = 1000;
        let perm = VPerm::new(n);
        let mut seen = vec![false; n as usize];
        for i in 0..n {
            let v = perm.v(i) as usize;
            assert!(!seen[v]);
            seen[v] = true;
        }
        let bytes = duetdb::raw::to_raw_document(&htap_doc(123_456, &VPerm::new(1_000_000)))
            .map_or(0, |b| b.as_bytes().len());
        assert!((220..=260).contains(&bytes), "{bytes}");
    }
}
