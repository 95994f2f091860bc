//! The embedded target: the duetdb engine in this process, an in-memory
//! database with no WAL, serving every workload's capability directly
//! through the engine's API. Snapshots are `Database::snapshot()` roots;
//! process memory (RSS) is the engine's, so the embedded target is the one
//! that can compare itself with `fork()` and a deep copy.

use std::collections::{BTreeMap, HashMap};
use std::ops::ControlFlow;
use std::sync::Mutex;
use std::time::Instant;

use anyhow::{anyhow, bail, ensure, Result};
use bson::{doc, Bson, Document};
use duetdb::{Collection, Database, IndexOptions, OlcpOptions, RemsetMode, Snapshot};

use super::{
    htap_batches, htap_doc_bytes, ycsb_doc, Field, HtapSession, HtapTarget, SnapshotSession,
    SnapshotTarget, SpaceLatest, SpaceSession, SpaceTarget, Strategy, Target, VPerm, VlsFigures,
    YcsbSession, YcsbTarget, HTAP_TABLE, SNAPSHOT_TABLE, SPACE_TABLE, YCSB_TABLE,
};
use crate::machine::rss_mb;
use crate::stats::{median, Latencies};
use crate::workload::space::busy_work;

/// The duetdb engine, in process.
pub struct Embedded {
    db: Database,
    remset: RemsetMode,
    /// The snapshot each running `space` held-snapshot query holds, by query
    /// thread, so the sampler can walk what they retain.
    held: Mutex<BTreeMap<usize, Snapshot>>,
    /// The remset's (versions kept, scans needing them) when the current
    /// HTAP cell began: its counters are totals since the collection's load.
    cell_base: Mutex<(u64, u64)>,
}

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
            held: Mutex::new(BTreeMap::new()),
            cell_base: Mutex::new((0, 0)),
        }
    }

    pub fn database(&self) -> &Database {
        &self.db
    }
}

impl Target for Embedded {
    fn name(&self) -> String {
        match self.remset {
            RemsetMode::Shared => "duetdb-embedded".into(),
            RemsetMode::PerScan => "duetdb-embedded[remset=per-scan]".into(),
            RemsetMode::ReclaimAtScanEnd => "duetdb-embedded[remset=scan-end]".into(),
        }
    }
    fn setup_note(&self) -> Option<String> {
        Some(format!(
            "{}: in-memory database in this process (no WAL)",
            self.name()
        ))
    }
    fn as_ycsb(&self) -> Option<&dyn YcsbTarget> {
        Some(self)
    }
    fn as_htap(&self) -> Option<&dyn HtapTarget> {
        Some(self)
    }
    fn as_snapshot(&self) -> Option<&dyn SnapshotTarget> {
        Some(self)
    }
    fn as_space(&self) -> Option<&dyn SpaceTarget> {
        Some(self)
    }
}

struct EmbeddedYcsb {
    coll: Collection,
}

impl YcsbTarget for Embedded {
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

/// One client's handle on a collection (HTAP and `space` sessions).
struct EmbeddedColl<'a> {
    target: &'a Embedded,
    coll: Collection,
}

impl EmbeddedColl<'_> {
    /// Set `f2` of document `id`; whether that changed it.
    fn set_f2(&self, id: u64, payload: &str) -> Result<bool> {
        let r = self
            .coll
            .update_one(doc! {"_id": id as i64}, doc! {"$set": {"f2": payload}})?;
        ensure!(r.matched == 1, "document {id} missing");
        Ok(r.modified > 0)
    }
}

impl HtapTarget for Embedded {
    fn begin_cell(&self) {
        self.db.reset_vls_peaks();
        let r = self.db.vls_stats().remset;
        if let Ok(mut base) = self.cell_base.lock() {
            *base = (r.insert_calls, r.needing_total);
        }
    }
    fn cell_counters(&self) -> Vec<(String, f64)> {
        let r = self.db.vls_stats().remset;
        let (calls0, needing0) = self.cell_base.lock().map_or((0, 0), |b| *b);
        let calls = r.insert_calls.saturating_sub(calls0);
        if calls == 0 {
            return Vec::new();
        }
        let needing = r.needing_total.saturating_sub(needing0);
        vec![
            ("remset_versions_kept".into(), calls as f64),
            ("remset_needing_mean".into(), needing as f64 / calls as f64),
        ]
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
        htap_batches(0..records, &VPerm::new(records), |docs| {
            coll.insert_many(docs, true)?;
            Ok(())
        })?;
        coll.create_index(doc! {"v": 1}, IndexOptions::default())?;
        Ok(())
    }
    fn session(&self) -> Result<Box<dyn HtapSession + '_>> {
        Ok(Box::new(EmbeddedColl {
            target: self,
            coll: self.db.collection(HTAP_TABLE),
        }))
    }
    fn space(&self) -> Result<Vec<(String, f64)>> {
        Ok(vec![("rss_mb".into(), rss_mb())])
    }
}

impl HtapSession for EmbeddedColl<'_> {
    fn update(&mut self, id: u64, payload: &str) -> Result<()> {
        self.set_f2(id, payload).map(|_| ())
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

impl SnapshotTarget for Embedded {
    fn session(&self) -> Result<Box<dyn SnapshotSession + '_>> {
        Ok(Box::new(EmbeddedSnapshots {
            db: &self.db,
            coll: self.db.collection(SNAPSHOT_TABLE),
            held: HashMap::new(),
        }))
    }
}

/// The `snapshot` workload's client: named snapshots are `db.snapshot()`
/// roots kept here until dropped.
struct EmbeddedSnapshots<'a> {
    db: &'a Database,
    coll: Collection,
    held: HashMap<String, Snapshot>,
}

/// `db.snapshot()` calls timed one by one at each size.
const SNAPSHOTS_TIMED: usize = 1000;
/// `fork()` calls timed at each size (each copies the page tables).
const FORKS_TIMED: usize = 5;

impl SnapshotSession for EmbeddedSnapshots<'_> {
    fn reset(&mut self) -> Result<()> {
        self.held.clear();
        self.db.drop_collection(SNAPSHOT_TABLE)?;
        self.coll
            .create_index(doc! {"v": 1}, IndexOptions::default())?;
        Ok(())
    }
    fn finish(&mut self) -> Result<()> {
        self.held.clear();
        self.db.drop_collection(SNAPSHOT_TABLE)?;
        Ok(())
    }
    fn insert(&mut self, docs: Vec<Document>) -> Result<()> {
        self.coll.insert_many(docs, true)?;
        Ok(())
    }
    fn data_bytes(&mut self) -> Result<u64> {
        Ok(self.coll.stats()?.data_bytes)
    }
    /// `db.snapshot()` (publishing an `Arc` root) vs `fork()` of this
    /// process (the HyPer way) vs a physical deep copy of every document.
    fn creation_figures(&mut self, notes: &mut Vec<String>) -> Result<Vec<(String, f64)>> {
        let mut create = Latencies::new();
        for _ in 0..SNAPSHOTS_TIMED {
            let t0 = Instant::now();
            let s = self.db.snapshot();
            create.record(t0.elapsed());
            drop(s);
        }
        let (mut forks, mut reaped) = (Vec::new(), Vec::new());
        for _ in 0..FORKS_TIMED {
            let (f, r) = fork_once()?;
            forks.push(f);
            reaped.push(r);
        }
        let data_bytes = self.data_bytes()?;
        let t0 = Instant::now();
        let snap = self.db.snapshot();
        let docs = snap.collection(SNAPSHOT_TABLE).find(doc! {}).raw()?;
        let mut copy: Vec<Vec<u8>> = Vec::with_capacity(docs.len());
        copy.extend(docs.iter().map(|d| d.as_bytes().to_vec()));
        let deep_ms = t0.elapsed().as_secs_f64() * 1000.0;
        let copied: u64 = copy.iter().map(|d| d.len() as u64).sum();
        drop((copy, docs, snap));
        if copied != data_bytes {
            notes.push(format!("deep copy copied {copied} bytes of {data_bytes}"));
        }
        let snapshot_us = create.quantile_us(0.5);
        Ok(vec![
            ("duet_snapshot_us_median".into(), snapshot_us),
            ("fork_ms_median".into(), median(&forks)),
            ("fork_reaped_ms_median".into(), median(&reaped)),
            ("deep_copy_ms".into(), deep_ms),
            (
                "fork_over_duet_ratio".into(),
                median(&forks) * 1000.0 / snapshot_us.max(1e-3),
            ),
        ])
    }
    fn create_snapshot(&mut self, name: &str) -> Result<()> {
        self.held.insert(name.to_string(), self.db.snapshot());
        Ok(())
    }
    fn drop_snapshot(&mut self, name: &str) -> Result<()> {
        self.held
            .remove(name)
            .map(drop)
            .ok_or_else(|| anyhow!("no snapshot {name} held"))
    }
    fn update(&mut self, id: u64, payload: &str) -> Result<()> {
        let r = self
            .coll
            .update_one(doc! {"_id": id as i64}, doc! {"$set": {"f2": payload}})?;
        ensure!(r.matched == 1, "document {id} missing");
        Ok(())
    }
    fn update_range(&mut self, lo: u64, hi: u64, payload: &str) -> Result<()> {
        self.coll.update_many(
            doc! {"_id": {"$gte": lo as i64, "$lt": hi as i64}},
            doc! {"$set": {"f2": payload}},
        )?;
        Ok(())
    }
    fn memory_mb(&mut self) -> Option<f64> {
        Some(rss_mb())
    }
}

/// Fork this process; the child `_exit`s at once. Returns (fork call ms, until reaped ms).
fn fork_once() -> Result<(f64, f64)> {
    let t0 = Instant::now();
    // SAFETY: the child calls only `_exit`, which is async-signal-safe, so the
    // multi-threaded parent's state (locks held by other threads) is never
    // touched in the child.
    let pid = unsafe { libc::fork() };
    if pid == 0 {
        // SAFETY: see above; `_exit` skips atexit handlers and destructors.
        unsafe { libc::_exit(0) };
    }
    let fork_ms = t0.elapsed().as_secs_f64() * 1000.0;
    if pid < 0 {
        bail!("fork failed: {}", std::io::Error::last_os_error());
    }
    let mut status = 0;
    // SAFETY: waiting for our own child; `status` is a valid out-pointer.
    let r = unsafe { libc::waitpid(pid, &mut status, 0) };
    if r != pid {
        bail!("waitpid failed: {}", std::io::Error::last_os_error());
    }
    Ok((fork_ms, t0.elapsed().as_secs_f64() * 1000.0))
}

impl SpaceTarget for Embedded {
    fn load(&self, records: u64) -> Result<u64> {
        self.db.drop_collection(SPACE_TABLE)?;
        let coll = self.db.collection(SPACE_TABLE);
        let perm = VPerm::new(records);
        htap_batches(0..records, &perm, |docs| {
            coll.insert_many(docs, true)?;
            Ok(())
        })?;
        Ok(htap_doc_bytes(records / 2, &perm))
    }
    fn space_notes(&self, work_ns_per_doc: u64, _sample_ms: u64, retained_every_ms: u64) -> String {
        format!(
            "{}: queries do {work_ns_per_doc} ns of busy work per document in this process; \
             olcp reads vls_stats().olcp_inflight and vls its remset; cow sums the \
             retained cost of each held db.snapshot() (sampled every {retained_every_ms} ms; \
             shared versions count once per snapshot)",
            self.name()
        )
    }
    fn session(&self) -> Result<Box<dyn SpaceSession + '_>> {
        Ok(Box::new(EmbeddedColl {
            target: self,
            coll: self.db.collection(SPACE_TABLE),
        }))
    }
    fn begin_cell(&self) {
        self.db.reset_vls_peaks();
    }
    fn rss_mb(&self) -> Option<f64> {
        Some(rss_mb())
    }
    fn finish(&self) -> Result<()> {
        self.held
            .lock()
            .map_err(|_| anyhow!("held snapshots poisoned"))?
            .clear();
        self.db.drop_collection(SPACE_TABLE)?;
        Ok(())
    }
}

/// Busy work standing in for a real per-document computation.
fn work(d: &bson::RawDocumentBuf, ns: u64) -> u64 {
    busy_work(d.as_bytes(), ns)
}

impl SpaceLatest for EmbeddedColl<'_> {
    fn update(&mut self, id: u64, payload: &str) -> Result<bool> {
        self.set_f2(id, payload)
    }
    fn get_doc(&mut self, id: u64) -> Result<Vec<u8>> {
        let d = self
            .coll
            .get(&Bson::Int64(i64::try_from(id)?))?
            .ok_or_else(|| anyhow!("document {id} missing"))?;
        Ok(d.as_bytes().to_vec())
    }
    fn scan_latest(&mut self, visit: &mut dyn FnMut(u64, &[u8]) -> Result<()>) -> Result<u64> {
        let (mut n, mut failed) = (0u64, None);
        self.coll.scan_with(Document::new(), Strategy::None, |d| {
            let r = d
                .get_i64("_id")
                .map_err(anyhow::Error::from)
                .and_then(|id| Ok(u64::try_from(id)?))
                .and_then(|id| visit(id, d.as_bytes()));
            match r {
                Ok(()) => {
                    n += 1;
                    ControlFlow::Continue(())
                }
                Err(e) => {
                    failed = Some(e);
                    ControlFlow::Break(())
                }
            }
        })?;
        failed.map_or(Ok(n), Err)
    }
}

impl SpaceSession for EmbeddedColl<'_> {
    fn olcp_query(&mut self, ns: u64) -> Result<u64> {
        let (acc, _) = self.target.db.olcp_query(
            SPACE_TABLE,
            &[],
            &[],
            || (0u64, 0u64),
            |s, d, _| {
                s.0 += 1;
                s.1 = s.1.wrapping_add(work(d, ns));
                Ok(())
            },
            |a, b| (a.0 + b.0, a.1.wrapping_add(b.1)),
            OlcpOptions { threads: 1 },
        )?;
        std::hint::black_box(acc.1);
        Ok(acc.0)
    }
    fn vls_query(&mut self, ns: u64) -> Result<u64> {
        let (mut n, mut h) = (0u64, 0u64);
        self.coll.scan_with(Document::new(), Strategy::Vls, |d| {
            n += 1;
            h = h.wrapping_add(work(d, ns));
            ControlFlow::Continue(())
        })?;
        std::hint::black_box(h);
        Ok(n)
    }
    fn held_query(&mut self, ns: u64, slot: usize) -> Result<u64> {
        let held = &self.target.held;
        let snap = self.target.db.snapshot();
        held.lock()
            .map_err(|_| anyhow!("held snapshots poisoned"))?
            .insert(slot, snap.clone());
        let docs = snap.collection(SPACE_TABLE).find(doc! {}).raw();
        let (mut n, mut h) = (0u64, 0u64);
        let r = docs.map(|docs| {
            for d in &docs {
                n += 1;
                h = h.wrapping_add(work(d, ns));
            }
        });
        // Released whatever the read did, so no later cell sees it held.
        held.lock()
            .map_err(|_| anyhow!("held snapshots poisoned"))?
            .remove(&slot);
        r?;
        std::hint::black_box(h);
        Ok(n)
    }
    fn vls(&mut self) -> Result<VlsFigures> {
        let v = self.target.db.vls_stats();
        Ok(VlsFigures {
            olcp_inflight: v.olcp_inflight as f64,
            olcp_propagated: v.olcp_propagated,
            remset_entries: v.remset.entries as f64,
            remset_bytes: v.remset.bytes as f64,
            scans_active: v.scans_active as f64,
        })
    }
    fn retained_by_queries(&mut self) -> Result<(f64, f64)> {
        let held: Vec<Snapshot> = self
            .target
            .held
            .lock()
            .map_err(|_| anyhow!("held snapshots poisoned"))?
            .values()
            .cloned()
            .collect();
        let latest = self.target.db.snapshot();
        let (mut docs, mut bytes) = (0u64, 0u64);
        for h in &held {
            let c = h.retained(&latest);
            docs += c.docs;
            bytes += c.bytes;
        }
        Ok((docs as f64, bytes as f64))
    }
}
