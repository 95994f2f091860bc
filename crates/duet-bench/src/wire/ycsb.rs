//! YCSB over the wire: `usertable` as a collection (`_id` = the key, one string
//! field per YCSB field), with the same operations as the embedded target —
//! read = `find_one` by `_id` (all fields, decoded), update = `$set` of the
//! given fields, insert = `insert_one`, scan = `find {_id: {$gte: start}}`
//! sorted by `_id` with a limit (every returned document decoded).

use anyhow::Result;
use mongodb::bson::{doc, Document};

use super::{LaneGuard, WireTarget};
use crate::targets::{ycsb_doc, Field, YcsbSession, YcsbTarget, YCSB_TABLE};

struct WireYcsb<'a> {
    t: LaneGuard<'a>,
    coll: mongodb::Collection<Document>,
}

impl YcsbTarget for WireTarget {
    fn reset(&self) -> Result<()> {
        // The driver treats "namespace not found" on drop as success.
        let lane = self.lane()?;
        lane.block_on(lane.collection(YCSB_TABLE).drop())?;
        Ok(())
    }
    fn session(&self) -> Result<Box<dyn YcsbSession + '_>> {
        let lane = self.lane()?;
        let coll = lane.collection(YCSB_TABLE);
        Ok(Box::new(WireYcsb { t: lane, coll }))
    }
}

impl YcsbSession for WireYcsb<'_> {
    fn insert_batch(&mut self, records: &[(String, Vec<Field>)]) -> Result<()> {
        let docs: Vec<Document> = records.iter().map(|(k, f)| ycsb_doc(k, f)).collect();
        self.t.block_on(self.coll.insert_many(docs))?;
        Ok(())
    }
    fn insert(&mut self, key: &str, fields: &[Field]) -> Result<()> {
        self.t
            .block_on(self.coll.insert_one(ycsb_doc(key, fields)))?;
        Ok(())
    }
    fn read(&mut self, key: &str) -> Result<bool> {
        Ok(self
            .t
            .block_on(self.coll.find_one(doc! {"_id": key}))?
            .is_some())
    }
    fn update(&mut self, key: &str, fields: &[Field]) -> Result<bool> {
        let mut set = Document::new();
        for (k, v) in fields {
            set.insert(k.clone(), v.clone());
        }
        let r = self
            .t
            .block_on(self.coll.update_one(doc! {"_id": key}, doc! {"$set": set}))?;
        Ok(r.matched_count > 0)
    }
    fn scan(&mut self, start: &str, count: usize) -> Result<usize> {
        let coll = &self.coll;
        self.t.block_on(async {
            let mut cursor = coll
                .find(doc! {"_id": {"$gte": start}})
                .sort(doc! {"_id": 1})
                .limit(i64::try_from(count).unwrap_or(i64::MAX))
                .await?;
            let mut n = 0;
            while cursor.advance().await? {
                let _doc: Document = cursor.deserialize_current()?;
                n += 1;
            }
            Ok(n)
        })
    }
}
