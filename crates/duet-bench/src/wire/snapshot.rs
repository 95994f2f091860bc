//! The wire target's `snapshot` capability: duetdb's named snapshots as a
//! client sees them (AnKer's Table 1 over the wire), through one lane:
//! - creation: `createSnapshot` and `dropSnapshot` round trips beside a
//!   `ping` round trip (the floor any command pays on this connection);
//! - snapshots are named snapshots (`createSnapshot`/`dropSnapshot`); what a
//!   held one keeps is the server's own exact figure (`listSnapshots`'
//!   `retainedBytes/Docs`: a walk of what only that snapshot references).
//!
//! Needs duetdb: the named-snapshot commands are its own. The process's
//! memory is not reported even for a spawned server: it holds the client too.

use std::time::Instant;

use anyhow::{bail, Result};
use mongodb::bson::{doc, Document};
use mongodb::IndexModel;

use super::{LaneGuard, WireTarget};
use crate::stats::Latencies;
use crate::targets::{SnapshotSession, SnapshotTarget, SNAPSHOT_TABLE};

/// Round trips timed per command kind at each size.
const ROUND_TRIPS: usize = 200;
/// Every snapshot this workload names starts with this (leftovers of an
/// interrupted run are dropped by it).
const PREFIX: &str = "bench-";

impl SnapshotTarget for WireTarget {
    fn session(&self) -> Result<Box<dyn SnapshotSession + '_>> {
        let lane = self.lane()?;
        let coll = lane.collection(SNAPSHOT_TABLE);
        Ok(Box::new(WireSnapshots { lane, coll }))
    }
}

struct WireSnapshots<'a> {
    lane: LaneGuard<'a>,
    coll: mongodb::Collection<Document>,
}

impl WireSnapshots<'_> {
    fn time(&self, lat: &mut Latencies, cmd: Document) -> Result<()> {
        let t0 = Instant::now();
        self.lane.command(cmd)?;
        lat.record(t0.elapsed());
        Ok(())
    }
}

impl SnapshotSession for WireSnapshots<'_> {
    fn reset(&mut self) -> Result<()> {
        self.lane.block_on(self.coll.drop())?;
        // Leftovers of an interrupted run would pin old versions.
        self.lane.drop_snapshots(PREFIX)?;
        let index = IndexModel::builder().keys(doc! {"v": 1}).build();
        self.lane.block_on(self.coll.create_index(index))?;
        Ok(())
    }
    fn finish(&mut self) -> Result<()> {
        self.lane.block_on(self.coll.drop())?;
        Ok(())
    }
    fn insert(&mut self, docs: Vec<Document>) -> Result<()> {
        self.lane.block_on(self.coll.insert_many(docs))?;
        Ok(())
    }
    fn data_bytes(&mut self) -> Result<u64> {
        let stats = self.lane.command(doc! {"collStats": SNAPSHOT_TABLE})?;
        Ok(stats.get_i64("size").map_or(0, |n| n.max(0) as u64))
    }
    fn creation_figures(&mut self, _notes: &mut Vec<String>) -> Result<Vec<(String, f64)>> {
        let (mut ping, mut create, mut drop) =
            (Latencies::new(), Latencies::new(), Latencies::new());
        for i in 0..ROUND_TRIPS {
            self.time(&mut ping, doc! {"ping": 1})?;
            let n = format!("{PREFIX}rt-{i}");
            self.time(&mut create, doc! {"createSnapshot": &n})?;
            self.time(&mut drop, doc! {"dropSnapshot": &n})?;
        }
        let mut out = Vec::new();
        for (metric, l) in [
            ("ping_us", &ping),
            ("create_snapshot_us", &create),
            ("drop_snapshot_us", &drop),
        ] {
            out.push((format!("{metric}_median"), l.quantile_us(0.5)));
            out.push((format!("{metric}_p99"), l.quantile_us(0.99)));
        }
        Ok(out)
    }
    fn create_snapshot(&mut self, name: &str) -> Result<()> {
        self.lane.command(doc! {"createSnapshot": name})?;
        Ok(())
    }
    fn drop_snapshot(&mut self, name: &str) -> Result<()> {
        self.lane.command(doc! {"dropSnapshot": name})?;
        Ok(())
    }
    fn update(&mut self, id: u64, payload: &str) -> Result<()> {
        let r = self.lane.block_on(
            self.coll
                .update_one(doc! {"_id": id as i64}, doc! {"$set": {"f2": payload}}),
        )?;
        anyhow::ensure!(r.matched_count == 1, "document {id} missing");
        Ok(())
    }
    fn update_range(&mut self, lo: u64, hi: u64, payload: &str) -> Result<()> {
        self.lane.block_on(self.coll.update_many(
            doc! {"_id": {"$gte": lo as i64, "$lt": hi as i64}},
            doc! {"$set": {"f2": payload}},
        ))?;
        Ok(())
    }
    fn retained(&mut self, name: &str) -> Result<Option<(f64, f64)>> {
        for s in self.lane.snapshots()? {
            if s.get_str("name").ok() == Some(name) {
                let n = |k: &str| s.get_i64(k).map_or(0.0, |v| v as f64);
                return Ok(Some((n("retainedBytes"), n("retainedDocs"))));
            }
        }
        bail!("snapshot {name} missing from listSnapshots")
    }
}
