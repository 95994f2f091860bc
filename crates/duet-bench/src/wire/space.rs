//! The wire target's `space` capability: every operation a driver call on a
//! [`Lane`](super::Lane) of its own thread:
//! - load: `insertMany` of the same documents (`htap_doc`);
//! - updates: `update` commands;
//! - queries: `olcp` / `vls` = `count` with `$duet: {snapshot, workNsPerDoc}`
//!   (the server busy-waits per document); the held-snapshot query =
//!   `createSnapshot` → `count` with `$duet: {snapshotName, workNsPerDoc}` →
//!   `dropSnapshot` (the named snapshot is what the query holds); the bench's
//!   `steam` reads the latest state with `find` and `$duet: {snapshot: "none"}`
//!   (point reads with `find` by `_id`);
//! - old versions from `serverStatus.duet.databases[WIRE_DB].vls`
//!   (`olcpInflight`, `remsetEntries`/`remsetBytes`) and the sum of
//!   `listSnapshots`' `retainedDocs`/`retainedBytes` of the query snapshots.
//!
//! Needs duetdb: `$duet.workNsPerDoc` and the named-snapshot commands are its own;
//! the knob is honoured only by a server started with `--enable-test-knobs`
//! (`--uri self` starts one so).
//! Invariant: every snapshot a query creates is dropped before the query
//! returns, whatever the count did (otherwise it would pin versions for the
//! cells that follow); leftovers of an interrupted run are dropped at load.

use anyhow::{anyhow, Result};
use mongodb::bson::{doc, Bson, Document, RawDocumentBuf};

use super::{count_of, LaneGuard, WireTarget};
use crate::targets::{
    htap_batches, htap_doc_bytes, SpaceLatest, SpaceSession, SpaceTarget, VPerm, VlsFigures,
    SPACE_TABLE,
};

/// Named snapshots of the held-snapshot queries start with this.
const SNAP_PREFIX: &str = "bench-space-";

/// A number field of a server reply (0 when absent).
fn number(v: &Document, k: &str) -> f64 {
    match v.get(k) {
        Some(Bson::Int64(n)) => *n as f64,
        Some(Bson::Int32(n)) => f64::from(*n),
        Some(Bson::Double(n)) => *n,
        _ => 0.0,
    }
}

impl SpaceTarget for WireTarget {
    fn load(&self, records: u64) -> Result<u64> {
        let lane = self.lane()?;
        lane.drop_snapshots(SNAP_PREFIX)?;
        let coll = lane.collection(SPACE_TABLE);
        lane.block_on(coll.drop())?;
        let perm = VPerm::new(records);
        htap_batches(0..records, &perm, |docs| {
            lane.block_on(coll.insert_many(docs))?;
            Ok(())
        })?;
        Ok(htap_doc_bytes(records / 2, &perm))
    }
    fn space_notes(&self, work_ns_per_doc: u64, sample_ms: u64, retained_every_ms: u64) -> String {
        format!(
            "{}: every operation over the wire; queries are `count` commands with `$duet.workNsPerDoc` = {work_ns_per_doc} (the server busy-waits per document); \
             olcp reads serverStatus olcpInflight, vls remsetEntries/remsetBytes (every {sample_ms} ms); cow holds a named snapshot per query \
             (createSnapshot → count with snapshotName → dropSnapshot) and sums listSnapshots' retainedDocs/retainedBytes every {retained_every_ms} ms",
            self.label()
        )
    }
    fn session(&self) -> Result<Box<dyn SpaceSession + '_>> {
        let lane = self.lane()?;
        let coll = lane.collection(SPACE_TABLE);
        Ok(Box::new(WireSpace { lane, coll }))
    }
    fn begin_cell(&self) {
        self.reset_peaks();
    }
    fn rss_mb(&self) -> Option<f64> {
        // Server and client share this process only when it was spawned.
        self.spawned().map(|_| crate::machine::rss_mb())
    }
    fn finish(&self) -> Result<()> {
        let lane = self.lane()?;
        lane.drop_snapshots(SNAP_PREFIX)?;
        lane.block_on(lane.collection(SPACE_TABLE).drop())?;
        Ok(())
    }
}

struct WireSpace<'a> {
    lane: LaneGuard<'a>,
    coll: mongodb::Collection<Document>,
}

impl WireSpace<'_> {
    fn count(&self, duet: Document) -> Result<u64> {
        count_of(
            &self
                .lane
                .command(doc! {"count": SPACE_TABLE, "query": {}, "$duet": duet})?,
        )
    }
}

/// `workNsPerDoc` as the server takes it.
fn ns_arg(ns: u64) -> i64 {
    ns.min(i64::MAX as u64) as i64
}

impl SpaceLatest for WireSpace<'_> {
    fn update(&mut self, id: u64, payload: &str) -> Result<bool> {
        let r = self.lane.block_on(
            self.coll
                .update_one(doc! {"_id": id as i64}, doc! {"$set": {"f2": payload}}),
        )?;
        anyhow::ensure!(r.matched_count == 1, "document {id} missing");
        Ok(r.modified_count > 0)
    }
    fn get_doc(&mut self, id: u64) -> Result<Vec<u8>> {
        let raw = self.coll.clone_with_type::<RawDocumentBuf>();
        let d = self
            .lane
            .block_on(raw.find_one(doc! {"_id": i64::try_from(id)?}))?
            .ok_or_else(|| anyhow!("document {id} missing"))?;
        Ok(d.into_bytes())
    }
    fn scan_latest(&mut self, visit: &mut dyn FnMut(u64, &[u8]) -> Result<()>) -> Result<u64> {
        let db = self.lane.database();
        let cmd = doc! {"find": SPACE_TABLE, "filter": {}, "$duet": {"snapshot": "none"}};
        self.lane.block_on(async {
            let mut cursor = db.run_cursor_command(cmd).await?;
            let mut n = 0u64;
            while cursor.advance().await? {
                let d = cursor.current();
                let id = u64::try_from(d.get_i64("_id")?)?;
                visit(id, d.as_bytes())?;
                n += 1;
            }
            Ok(n)
        })
    }
}

impl SpaceSession for WireSpace<'_> {
    fn olcp_query(&mut self, ns: u64) -> Result<u64> {
        self.count(doc! {"snapshot": "olcp", "workNsPerDoc": ns_arg(ns)})
    }
    fn vls_query(&mut self, ns: u64) -> Result<u64> {
        self.count(doc! {"snapshot": "vls", "workNsPerDoc": ns_arg(ns)})
    }
    fn held_query(&mut self, ns: u64, slot: usize) -> Result<u64> {
        let name = format!("{SNAP_PREFIX}{slot}");
        self.lane.command(doc! {"createSnapshot": &name})?;
        let n = self.count(doc! {"snapshotName": &name, "workNsPerDoc": ns_arg(ns)});
        let dropped = self.lane.command(doc! {"dropSnapshot": &name});
        let n = n?;
        dropped?;
        Ok(n)
    }
    fn vls(&mut self) -> Result<VlsFigures> {
        let v = self
            .lane
            .vls_status()?
            .ok_or_else(|| anyhow!("serverStatus reports no vls section for the bench database"))?;
        Ok(VlsFigures {
            olcp_inflight: number(&v, "olcpInflight"),
            olcp_propagated: number(&v, "olcpPropagated") as u64,
            remset_entries: number(&v, "remsetEntries"),
            remset_bytes: number(&v, "remsetBytes"),
            scans_active: number(&v, "scansActive"),
        })
    }
    fn retained_by_queries(&mut self) -> Result<(f64, f64)> {
        let (mut docs, mut bytes) = (0.0, 0.0);
        for s in self.lane.snapshots()? {
            if s.get_str("name").is_ok_and(|n| n.starts_with(SNAP_PREFIX)) {
                docs += number(&s, "retainedDocs");
                bytes += number(&s, "retainedBytes");
            }
        }
        Ok((docs, bytes))
    }
}
