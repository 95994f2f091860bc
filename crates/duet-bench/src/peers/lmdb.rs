//! LMDB peer (through `heed`): the embedded key-value engine with snapshots.
//! One environment in a fresh temp directory (removed on drop), three named
//! databases:
//! - `usertable`: YCSB key (UTF-8 bytes) → the record's fields as a BSON document;
//! - `htap`: `_id` as u64 big-endian (so byte order is id order) → the HTAP
//!   document as BSON, byte for byte the document the duetdb target stores;
//! - `htap_v`: the secondary index, key `v` u64 BE ++ `_id` u64 BE, empty value.
//!
//! Invariants:
//! - `htap_v` holds exactly one entry per document, always written in the same
//!   write transaction as the document (load and update), so every read
//!   transaction sees the two databases consistent with each other;
//! - an analytic query (full scan or index range count) runs inside one read
//!   transaction: LMDB's MVCC snapshot, its native strategy. While it is open,
//!   pages freed by later commits cannot be reused, so updates allocate new
//!   pages and the data file grows: `file_mb` vs `in_use_mb` is the comparison;
//! - LMDB admits one writer at a time: every update is a write transaction and
//!   writers queue on LMDB's own writer lock (no extra mutex here).
//!
//! The environment is opened with `NO_SYNC` (commits are not flushed), as the
//! other peers run without per-commit durability (SQLite `synchronous=NORMAL`,
//! PostgreSQL `synchronous_commit=off`) and the duetdb target is in memory.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use anyhow::{anyhow, ensure, Context, Result};
use bson::{Document, RawDocument};
use heed::types::Bytes;
use heed::{CommitOrAbort, Database, Env, EnvFlags, EnvOpenOptions};

use crate::targets::{
    htap_doc, Field, HtapSession, HtapTarget, Strategy, VPerm, YcsbSession, YcsbTarget,
};

pub const DESCRIPTION: &str = "lmdb: LMDB (heed, mdb.master) on a temp dir, NO_SYNC, map size DUET_BENCH_LMDB_MAP_GIB (default 64 GiB, sparse); documents as BSON under a u64 big-endian key, secondary index (v, id) in a second database maintained in the same write transaction; analytics in one read transaction (LMDB MVCC snapshot); one writer at a time (LMDB's writer lock); index range counts read the index only";

/// Label of the one strategy this peer has.
pub const NATIVE: &str = "lmdb-read-txn (MVCC snapshot of one read transaction)";

/// Default map size: the most the data file may grow to. The file is sparse
/// and grows with the pages actually written, so this only reserves address space.
const DEFAULT_MAP_GIB: usize = 64;
/// Documents per write transaction while loading.
const LOAD_BATCH: u64 = 10_000;
/// Reader slots: one per thread that ever reads (updaters, scanners, the
/// space sampler) — LMDB's default of 126 is too few for wide runs.
const MAX_READERS: u32 = 1024;

static NEXT: AtomicU64 = AtomicU64::new(0);

type Db = Database<'static, Bytes, Bytes>;

/// Removes the environment directory when dropped (after the `Env`, which is
/// declared before it in [`Lmdb`] and so is closed first).
struct TempDir(PathBuf);

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

pub struct Lmdb {
    env: Env,
    usertable: Db,
    htap: Db,
    htap_v: Db,
    page_size: u64,
    _dir: TempDir,
}

/// Map size in bytes: `DUET_BENCH_LMDB_MAP_GIB` or the default.
fn map_size() -> Result<usize> {
    let gib = match std::env::var("DUET_BENCH_LMDB_MAP_GIB") {
        Ok(s) => s
            .trim()
            .parse::<usize>()
            .ok()
            .filter(|&g| g > 0)
            .ok_or_else(|| anyhow!("DUET_BENCH_LMDB_MAP_GIB={s:?} is not a positive integer"))?,
        Err(_) => DEFAULT_MAP_GIB,
    };
    gib.checked_mul(1 << 30)
        .ok_or_else(|| anyhow!("DUET_BENCH_LMDB_MAP_GIB={gib} overflows"))
}

impl Lmdb {
    /// A fresh environment in a new temp directory.
    pub fn create() -> Result<Lmdb> {
        let path = std::env::temp_dir().join(format!(
            "duet-bench-lmdb-{}-{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = std::fs::remove_dir_all(&path);
        std::fs::create_dir_all(&path).with_context(|| format!("creating {}", path.display()))?;
        let dir = TempDir(path);
        let env = open_env(&dir.0)?;
        let wtxn = env.write_txn()?;
        let (usertable, htap, htap_v) = env
            .create_databases_and_commit(wtxn, |dbo, wtxn| -> heed::Result<_> {
                let u: Database<Bytes, Bytes> = dbo.create_database(wtxn, Some("usertable"))?;
                let h: Database<Bytes, Bytes> = dbo.create_database(wtxn, Some("htap"))?;
                let v: Database<Bytes, Bytes> = dbo.create_database(wtxn, Some("htap_v"))?;
                Ok(CommitOrAbort::<_, ()>::Commit((u, h, v)))
            })?
            .unwrap_commit();
        let page_size = u64::from(env.unnamed_database_stat().page_size);
        Ok(Lmdb {
            env,
            usertable,
            htap,
            htap_v,
            page_size,
            _dir: dir,
        })
    }

    /// Pages the live trees use (our databases plus the catalogue), as of a
    /// fresh read transaction.
    fn pages_in_use(&self) -> Result<u64> {
        let rtxn = self.env.read_txn()?;
        let mut pages = 0u64;
        for db in [&self.usertable, &self.htap, &self.htap_v] {
            let s = db.stat(&rtxn)?;
            pages += (s.branch_pages + s.leaf_pages + s.overflow_pages) as u64;
        }
        let main = self.env.unnamed_database_stat();
        pages += (main.branch_pages + main.leaf_pages + main.overflow_pages) as u64;
        Ok(pages)
    }
}

fn open_env(dir: &Path) -> Result<Env> {
    let mut options = EnvOpenOptions::new();
    options
        .map_size(map_size()?)
        .max_dbs(4)
        .max_readers(MAX_READERS);
    // SAFETY: NO_SYNC only gives up durability of the last commits on an OS
    // crash, which a throw-away benchmark directory does not need.
    unsafe {
        options.flags(EnvFlags::NO_SYNC);
    }
    // SAFETY: LMDB requires that an environment file is opened once per
    // process and not modified by anyone else while open: the directory is
    // new, named after this process and a counter, and removed when the
    // `Lmdb` owning this `Env` is dropped.
    let env = unsafe { options.open(dir) }
        .with_context(|| format!("opening an LMDB environment in {}", dir.display()))?;
    Ok(env)
}

struct Session<'a> {
    lmdb: &'a Lmdb,
}

fn fields_doc(fields: &[Field]) -> Result<Vec<u8>> {
    let mut d = Document::new();
    for (k, v) in fields {
        d.insert(k.clone(), v.clone());
    }
    Ok(d.to_vec()?)
}

peer_target!(Lmdb, "lmdb", DESCRIPTION);

impl YcsbTarget for Lmdb {
    fn reset(&self) -> Result<()> {
        let mut wtxn = self.env.write_txn()?;
        self.usertable.clear(&mut wtxn)?;
        wtxn.commit()?;
        Ok(())
    }
    fn session(&self) -> Result<Box<dyn YcsbSession + '_>> {
        Ok(Box::new(Session { lmdb: self }))
    }
}

impl YcsbSession for Session<'_> {
    fn insert_batch(&mut self, records: &[(String, Vec<Field>)]) -> Result<()> {
        let mut wtxn = self.lmdb.env.write_txn()?;
        for (key, fields) in records {
            self.lmdb
                .usertable
                .put(&mut wtxn, key.as_bytes(), &fields_doc(fields)?)?;
        }
        wtxn.commit()?;
        Ok(())
    }
    fn insert(&mut self, key: &str, fields: &[Field]) -> Result<()> {
        let mut wtxn = self.lmdb.env.write_txn()?;
        self.lmdb
            .usertable
            .put(&mut wtxn, key.as_bytes(), &fields_doc(fields)?)?;
        wtxn.commit()?;
        Ok(())
    }
    fn read(&mut self, key: &str) -> Result<bool> {
        let rtxn = self.lmdb.env.read_txn()?;
        match self.lmdb.usertable.get(&rtxn, key.as_bytes())? {
            // YCSB reads every field: decode the record, as the other targets do.
            Some(bytes) => {
                Document::from_reader(bytes)?;
                Ok(true)
            }
            None => Ok(false),
        }
    }
    fn update(&mut self, key: &str, fields: &[Field]) -> Result<bool> {
        let mut wtxn = self.lmdb.env.write_txn()?;
        let Some(bytes) = self.lmdb.usertable.get(&wtxn, key.as_bytes())? else {
            return Ok(false);
        };
        let mut d = Document::from_reader(bytes)?;
        for (k, v) in fields {
            d.insert(k.clone(), v.clone());
        }
        self.lmdb
            .usertable
            .put(&mut wtxn, key.as_bytes(), &d.to_vec()?)?;
        wtxn.commit()?;
        Ok(true)
    }
    fn scan(&mut self, start: &str, count: usize) -> Result<usize> {
        let rtxn = self.lmdb.env.read_txn()?;
        let range = (
            std::ops::Bound::Included(start.as_bytes()),
            std::ops::Bound::Unbounded,
        );
        let mut n = 0;
        for item in self.lmdb.usertable.range(&rtxn, &range)?.take(count) {
            let (_, bytes) = item?;
            Document::from_reader(bytes)?;
            n += 1;
        }
        Ok(n)
    }
}

/// Index key: `v` then `_id`, both big-endian, so byte order is (v, id) order.
fn index_key(v: u64, id: u64) -> [u8; 16] {
    let mut k = [0u8; 16];
    k[..8].copy_from_slice(&v.to_be_bytes());
    k[8..].copy_from_slice(&id.to_be_bytes());
    k
}

/// `v` of a stored document (a non-negative int64, as `htap_doc` writes it).
fn doc_v(raw: &RawDocument) -> Result<u64> {
    let v = raw.get_i64("v")?;
    u64::try_from(v).map_err(|_| anyhow!("negative v {v}"))
}

impl HtapTarget for Lmdb {
    fn strategy_label(&self, _: Strategy) -> Result<String> {
        Ok(NATIVE.into())
    }
    fn native_strategy(&self) -> Option<String> {
        Some(format!("native: {NATIVE}"))
    }
    fn load(&self, records: u64) -> Result<()> {
        let mut wtxn = self.env.write_txn()?;
        self.htap.clear(&mut wtxn)?;
        self.htap_v.clear(&mut wtxn)?;
        wtxn.commit()?;
        let perm = VPerm::new(records);
        let mut from = 0;
        while from < records {
            let to = (from + LOAD_BATCH).min(records);
            let mut wtxn = self.env.write_txn()?;
            for i in from..to {
                let raw = duetdb::raw::to_raw_document(&htap_doc(i, &perm))?;
                self.htap.put(&mut wtxn, &i.to_be_bytes(), raw.as_bytes())?;
                self.htap_v.put(&mut wtxn, &index_key(perm.v(i), i), &[])?;
            }
            wtxn.commit()?;
            from = to;
        }
        Ok(())
    }
    fn session(&self) -> Result<Box<dyn HtapSession + '_>> {
        Ok(Box::new(Session { lmdb: self }))
    }
    fn space(&self) -> Result<Vec<(String, f64)>> {
        const MB: f64 = 1024.0 * 1024.0;
        let file = self.env.real_disk_size()? as f64;
        let info = self.env.info();
        // Pages ever allocated (the high-water mark) vs pages the live trees
        // use: the difference is the freelist plus pages freed by commits
        // that an open read transaction still sees (not reusable yet).
        let allocated = (info.last_page_number as u64 + 1) * self.page_size;
        let in_use = self.pages_in_use()? * self.page_size;
        Ok(vec![
            ("file_mb".into(), file / MB),
            ("allocated_mb".into(), allocated as f64 / MB),
            ("in_use_mb".into(), in_use as f64 / MB),
            (
                "free_or_held_mb".into(),
                allocated.saturating_sub(in_use) as f64 / MB,
            ),
        ])
    }
}

impl HtapSession for Session<'_> {
    fn update(&mut self, id: u64, payload: &str) -> Result<()> {
        let lmdb = self.lmdb;
        let key = id.to_be_bytes();
        let mut wtxn = lmdb.env.write_txn()?;
        let bytes = lmdb
            .htap
            .get(&wtxn, &key)?
            .ok_or_else(|| anyhow!("document {id} missing"))?;
        let old_v = doc_v(RawDocument::from_bytes(bytes)?)?;
        let mut d = Document::from_reader(bytes)?;
        d.insert("f2", payload);
        let raw = duetdb::raw::to_raw_document(&d)?;
        let new_v = doc_v(&raw)?;
        lmdb.htap.put(&mut wtxn, &key, raw.as_bytes())?;
        // The workload only changes `f2`, but the index stays right whatever
        // an update changes.
        if new_v != old_v {
            ensure!(
                lmdb.htap_v.delete(&mut wtxn, &index_key(old_v, id))?,
                "index entry of {id} missing"
            );
            lmdb.htap_v.put(&mut wtxn, &index_key(new_v, id), &[])?;
        }
        wtxn.commit()?;
        Ok(())
    }
    fn full_scan_count(&mut self, _: Strategy) -> Result<u64> {
        let rtxn = self.lmdb.env.read_txn()?;
        let mut n = 0;
        // `b >= 0` is read from every document, as the other targets'
        // unindexed predicate forces them to.
        for item in self.lmdb.htap.iter(&rtxn)? {
            let (_, bytes) = item?;
            let raw = RawDocument::from_bytes(bytes)?;
            if raw.get_i64("b")? >= 0 {
                n += 1;
            }
        }
        Ok(n)
    }
    fn range_count(&mut self, lo: u64, hi: u64, _: Strategy) -> Result<u64> {
        if hi <= lo {
            return Ok(0);
        }
        let rtxn = self.lmdb.env.read_txn()?;
        let (start, end) = (index_key(lo, 0), index_key(hi, 0));
        let range = (
            std::ops::Bound::Included(&start[..]),
            std::ops::Bound::Excluded(&end[..]),
        );
        let mut n = 0;
        for item in self.lmdb.htap_v.range(&rtxn, &range)? {
            item?;
            n += 1;
        }
        Ok(n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn index_follows_documents_and_snapshots_hold() -> Result<()> {
        let l = Lmdb::create()?;
        let dir = l._dir.0.clone();
        HtapTarget::load(&l, 500)?;
        let mut s = HtapTarget::session(&l)?;
        assert_eq!(s.full_scan_count(Strategy::Cow)?, 500);
        assert_eq!(s.range_count(100, 150, Strategy::Cow)?, 50);
        s.update(7, "changed")?;
        // A read transaction opened before a commit keeps seeing the old value.
        let rtxn = l.env.read_txn()?;
        s.update(8, "changed")?;
        let got = l.htap.get(&rtxn, &8u64.to_be_bytes())?.map(|b| b.to_vec());
        drop(rtxn);
        let old = Document::from_reader(got.as_deref().unwrap_or_default())?;
        assert_ne!(old.get_str("f2")?, "changed");
        assert_eq!(s.range_count(0, 500, Strategy::Cow)?, 500);
        let space = l.space()?;
        assert!(space.iter().any(|(n, v)| n == "in_use_mb" && *v > 0.0));
        drop(s);
        drop(l);
        assert!(!dir.exists(), "temp dir removed on drop");
        Ok(())
    }
}
