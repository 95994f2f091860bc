//! HTAP over the wire: the same documents (`htap_doc`) loaded with `insertMany`
//! in batches and an index on `v` built with `createIndexes`; updates are
//! `update` commands; the analytic queries are `count` commands whose strategy
//! is chosen with duetdb's `$duet: {snapshot: …}` option (honoured by count,
//! find and aggregate; the count is computed at once inside the command).
//!
//! Against a server that is not duetdb no `$duet` option is sent: the target
//! then has one native mechanism (the server's default read concern), and
//! every cell runs once with it.
//!
//! Space: the engine's remset figures come from `serverStatus` (`duet.databases[].vls`).
//! For a spawned server the per-cell peaks are exact (reset in process at the
//! start of a cell, read over the wire at its end) and `rss_mb` is this whole
//! process (server and client); for a running duetdb server the remset is
//! only sampled (no command resets its peaks).

use anyhow::{ensure, Result};
use mongodb::bson::{doc, Document};
use mongodb::IndexModel;

use super::{count_of, Lane, LaneGuard, WireTarget};
use crate::targets::{htap_batches, HtapSession, HtapTarget, Strategy, VPerm, HTAP_TABLE};

const MIB: f64 = 1024.0 * 1024.0;

struct WireHtap<'a> {
    lane: LaneGuard<'a>,
    coll: mongodb::Collection<Document>,
    /// Send `$duet` (the server is duetdb).
    duet: bool,
}

/// A `count` of `query` on the HTAP collection, under `strategy` when the
/// server is duetdb.
fn htap_count(lane: &Lane, duet: bool, query: Document, strategy: Strategy) -> Result<u64> {
    let mut cmd = doc! {"count": HTAP_TABLE, "query": query};
    if duet {
        cmd.insert("$duet", doc! {"snapshot": strategy.name()});
    }
    count_of(&lane.command(cmd)?)
}

impl WireTarget {
    /// (entries, MiB) of the remset from `serverStatus`, current and peak.
    fn remset_figures(&self) -> Result<Option<[f64; 4]>> {
        let Some(v) = self.vls_status()? else {
            return Ok(None);
        };
        let get = |k: &str| v.get_i64(k).map_or(0.0, |n| n as f64);
        Ok(Some([
            get("remsetEntries"),
            get("remsetBytes") / MIB,
            get("remsetEntriesPeak"),
            get("remsetBytesPeak") / MIB,
        ]))
    }
}

impl HtapTarget for WireTarget {
    fn strategy_label(&self, strategy: Strategy) -> Result<String> {
        if self.is_duet() {
            Ok(format!(
                "{} over the wire (`count` with `$duet: {{snapshot: \"{}\"}}`)",
                strategy.name(),
                strategy.name()
            ))
        } else {
            Ok(format!(
                "{} not applied: the server (MongoDB {}) is not duetdb and does not know `$duet`; `count` runs under its default read concern",
                strategy.name(),
                self.facts().version
            ))
        }
    }
    fn native_strategy(&self) -> Option<String> {
        (!self.is_duet()).then(|| {
            format!(
                "native: `count` under the server's default read concern (MongoDB {}; not duetdb, so no `$duet`)",
                self.facts().version
            )
        })
    }
    fn load(&self, records: u64) -> Result<()> {
        let lane = self.lane()?;
        let coll = lane.collection(HTAP_TABLE);
        lane.block_on(coll.drop())?;
        htap_batches(0..records, &VPerm::new(records), |docs| {
            lane.block_on(coll.insert_many(docs))?;
            Ok(())
        })?;
        let index = IndexModel::builder().keys(doc! {"v": 1}).build();
        lane.block_on(coll.create_index(index))?;
        Ok(())
    }
    fn session(&self) -> Result<Box<dyn HtapSession + '_>> {
        let lane = self.lane()?;
        let coll = lane.collection(HTAP_TABLE);
        Ok(Box::new(WireHtap {
            lane,
            coll,
            duet: self.is_duet(),
        }))
    }
    fn space(&self) -> Result<Vec<(String, f64)>> {
        if self.spawned().is_some() {
            // Server and client share this process; the exact remset peaks
            // come from `cell_figures`.
            return Ok(vec![("rss_mb".into(), crate::machine::rss_mb())]);
        }
        Ok(match self.remset_figures()? {
            Some([entries, mb, _, _]) => {
                vec![("remset_entries".into(), entries), ("remset_mb".into(), mb)]
            }
            None => Vec::new(),
        })
    }
    fn begin_cell(&self) {
        self.reset_peaks();
    }
    fn cell_figures(&self) -> Vec<(String, f64)> {
        if self.spawned().is_none() {
            return Vec::new();
        }
        match self.remset_figures() {
            Ok(Some([_, _, entries_peak, mb_peak])) => vec![
                ("remset_entries".into(), entries_peak),
                ("remset_mb".into(), mb_peak),
            ],
            _ => Vec::new(),
        }
    }
}

impl HtapSession for WireHtap<'_> {
    fn update(&mut self, id: u64, payload: &str) -> Result<()> {
        let r = self.lane.block_on(
            self.coll
                .update_one(doc! {"_id": id as i64}, doc! {"$set": {"f2": payload}}),
        )?;
        ensure!(r.matched_count == 1, "document {id} missing");
        Ok(())
    }
    fn full_scan_count(&mut self, strategy: Strategy) -> Result<u64> {
        // `b` is not indexed: the count visits every document.
        htap_count(&self.lane, self.duet, doc! {"b": {"$gte": 0}}, strategy)
    }
    fn range_count(&mut self, lo: u64, hi: u64, strategy: Strategy) -> Result<u64> {
        let query = doc! {"v": {"$gte": lo as i64, "$lt": hi as i64}};
        htap_count(&self.lane, self.duet, query, strategy)
    }
}
