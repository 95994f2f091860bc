//! What the administrator changes or reads while the server runs: the
//! knobs `setParameter` may change ([`RuntimeParams`]), the `fsync` write
//! lock ([`FsyncLock`]) and the per-namespace figures of `top`
//! ([`TopTable`]).
//!
//! Invariants:
//! - a write command waits while the fsync lock is held, and stops waiting
//!   when its token is cancelled (`killOp`, `maxTimeMS`, a closed
//!   connection, shutdown): a forgotten lock never wedges a connection's
//!   command forever;
//! - `top` holds at most [`MAX_TOP_NAMESPACES`] namespaces; later ones are
//!   counted under [`TOP_OVERFLOW`], so a client creating collections in a
//!   loop cannot grow the table without bound.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use bson::{doc, Document};
use duetdb::CancelToken;
use parking_lot::{Condvar, Mutex};

use crate::error::{CmdResult, CommandError};

/// The slow-operation threshold (`--slow-ms`, MongoDB's `slowms`).
pub const DEFAULT_SLOW_MS: u64 = 100;

/// Server knobs `setParameter` changes at runtime.
pub struct RuntimeParams {
    allow_disk_use_by_default: AtomicBool,
    query_memory_limit_bytes: AtomicUsize,
    slow_ms: AtomicU64,
}

impl RuntimeParams {
    pub fn new(allow_disk_use: bool, memory_limit: usize, slow_ms: u64) -> RuntimeParams {
        RuntimeParams {
            allow_disk_use_by_default: AtomicBool::new(allow_disk_use),
            query_memory_limit_bytes: AtomicUsize::new(memory_limit),
            slow_ms: AtomicU64::new(slow_ms),
        }
    }

    pub fn allow_disk_use_by_default(&self) -> bool {
        self.allow_disk_use_by_default.load(Ordering::Relaxed)
    }

    pub fn set_allow_disk_use_by_default(&self, v: bool) {
        self.allow_disk_use_by_default.store(v, Ordering::Relaxed);
    }

    pub fn query_memory_limit_bytes(&self) -> usize {
        self.query_memory_limit_bytes.load(Ordering::Relaxed)
    }

    pub fn set_query_memory_limit_bytes(&self, v: usize) {
        self.query_memory_limit_bytes.store(v, Ordering::Relaxed);
    }

    /// Operations lasting at least this long are logged as slow.
    pub fn slow_ms(&self) -> u64 {
        self.slow_ms.load(Ordering::Relaxed)
    }

    pub fn set_slow_ms(&self, v: u64) {
        self.slow_ms.store(v, Ordering::Relaxed);
    }
}

/// How often a write waiting for `fsyncUnlock` looks at its token.
const FSYNC_POLL: Duration = Duration::from_millis(50);

/// `fsync: 1, lock: true` … `fsyncUnlock`: a counted lock against writes.
#[derive(Default)]
pub struct FsyncLock {
    count: Mutex<u32>,
    unlocked: Condvar,
}

impl FsyncLock {
    /// Take the lock once more; returns the new lock count.
    pub fn lock(&self) -> u32 {
        let mut c = self.count.lock();
        *c = c.saturating_add(1);
        *c
    }

    /// Release once; `None` when it was not held.
    pub fn unlock(&self) -> Option<u32> {
        let mut c = self.count.lock();
        if *c == 0 {
            return None;
        }
        *c -= 1;
        if *c == 0 {
            self.unlocked.notify_all();
        }
        Some(*c)
    }

    pub fn count(&self) -> u32 {
        *self.count.lock()
    }

    /// Wait until the lock is free, or fail with the token's reason.
    pub fn wait_unlocked(&self, cancel: &CancelToken) -> CmdResult<()> {
        let mut c = self.count.lock();
        while *c > 0 {
            cancel.check().map_err(CommandError::from)?;
            self.unlocked.wait_for(&mut c, FSYNC_POLL);
        }
        Ok(())
    }
}

/// Namespaces `top` tracks at most.
pub const MAX_TOP_NAMESPACES: usize = 10_000;
/// Where operations on namespaces past [`MAX_TOP_NAMESPACES`] are counted.
pub const TOP_OVERFLOW: &str = "duet.$otherNamespaces";

/// Time and count of one kind of operation, microseconds.
#[derive(Default, Clone, Copy)]
struct Tally {
    time_us: u64,
    count: u64,
}

impl Tally {
    fn add(&mut self, us: u64) {
        self.time_us = self.time_us.saturating_add(us);
        self.count = self.count.saturating_add(1);
    }

    fn to_doc(self) -> Document {
        doc! {
            "time": self.time_us.min(i64::MAX as u64) as i64,
            "count": self.count.min(i64::MAX as u64) as i64,
        }
    }
}

#[derive(Default, Clone, Copy)]
struct TopEntry {
    total: Tally,
    read_lock: Tally,
    write_lock: Tally,
    queries: Tally,
    getmore: Tally,
    insert: Tally,
    update: Tally,
    remove: Tally,
    commands: Tally,
}

/// MongoDB's `top`: time and count per namespace and kind of operation.
#[derive(Default)]
pub struct TopTable {
    entries: Mutex<HashMap<String, TopEntry>>,
}

/// Commands that change data (for `top`'s writeLock and the fsync lock).
pub fn is_write(command: &str) -> bool {
    matches!(
        command,
        "insert"
            | "update"
            | "delete"
            | "findAndModify"
            | "findandmodify"
            | "create"
            | "drop"
            | "dropDatabase"
            | "renameCollection"
            | "convertToCapped"
            | "cloneCollectionAsCapped"
            | "createIndexes"
            | "dropIndexes"
            | "deleteIndexes"
            | "collMod"
            | "createSnapshot"
            | "dropSnapshot"
            | "commitTransaction"
            | "createUser"
            | "updateUser"
            | "dropUser"
            | "dropAllUsersFromDatabase"
            | "grantRolesToUser"
            | "revokeRolesFromUser"
            | "duetRunTtlPass"
    )
}

impl TopTable {
    /// Count command `name` on namespace `ns`, which took `us` microseconds.
    pub fn record(&self, ns: &str, name: &str, us: u64) {
        let mut entries = self.entries.lock();
        let key = if entries.contains_key(ns) || entries.len() < MAX_TOP_NAMESPACES {
            ns
        } else {
            TOP_OVERFLOW
        };
        let e = entries.entry(key.to_string()).or_default();
        e.total.add(us);
        if is_write(name) {
            e.write_lock.add(us);
        } else {
            e.read_lock.add(us);
        }
        match name {
            "find" | "count" | "distinct" | "aggregate" => e.queries.add(us),
            "getMore" => e.getmore.add(us),
            "insert" => e.insert.add(us),
            "update" | "findAndModify" | "findandmodify" => e.update.add(us),
            "delete" => e.remove.add(us),
            _ => e.commands.add(us),
        }
    }

    /// `$collStats`' `latencyStats` of namespace `ns` (microseconds).
    pub fn latency(&self, ns: &str) -> Document {
        let e = self.entries.lock().get(ns).copied().unwrap_or_default();
        let pair = |a: Tally, b: Tally| Tally {
            time_us: a.time_us.saturating_add(b.time_us),
            count: a.count.saturating_add(b.count),
        };
        let shape = |t: Tally| {
            doc! {
                "latency": t.time_us.min(i64::MAX as u64) as i64,
                "ops": t.count.min(i64::MAX as u64) as i64,
            }
        };
        doc! {
            "reads": shape(pair(e.queries, e.getmore)),
            "writes": shape(pair(pair(e.insert, e.update), e.remove)),
            "commands": shape(e.commands),
            "transactions": shape(Tally::default()),
        }
    }

    /// `top`'s `totals`, namespaces in name order.
    pub fn totals(&self) -> Document {
        let entries = self.entries.lock();
        let mut names: Vec<&String> = entries.keys().collect();
        names.sort();
        let mut out = doc! {"note": "all times in microseconds"};
        for n in names {
            let e = entries[n];
            out.insert(
                n.clone(),
                doc! {
                    "total": e.total.to_doc(),
                    "readLock": e.read_lock.to_doc(),
                    "writeLock": e.write_lock.to_doc(),
                    "queries": e.queries.to_doc(),
                    "getmore": e.getmore.to_doc(),
                    "insert": e.insert.to_doc(),
                    "update": e.update.to_doc(),
                    "remove": e.remove.to_doc(),
                    "commands": e.commands.to_doc(),
                },
            );
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fsync_lock_counts_and_cancelled_waits_end() {
        let l = FsyncLock::default();
        assert_eq!(l.unlock(), None);
        assert_eq!(l.lock(), 1);
        assert_eq!(l.lock(), 2);
        let token = CancelToken::new();
        token.cancel(duetdb::CancelReason::Killed);
        let e = l.wait_unlocked(&token).expect_err("cancelled while locked");
        assert_eq!(e.code, 11601);
        assert_eq!(l.unlock(), Some(1));
        assert_eq!(l.unlock(), Some(0));
        assert!(l.wait_unlocked(&CancelToken::new()).is_ok());
    }

    #[test]
    fn top_is_bounded() {
        let t = TopTable::default();
        for i in 0..MAX_TOP_NAMESPACES + 5 {
            t.record(&format!("db.c{i}"), "find", 1);
        }
        t.record("db.c0", "insert", 3);
        let totals = t.totals();
        // The note, the tracked namespaces and the overflow entry.
        assert_eq!(totals.len(), MAX_TOP_NAMESPACES + 2);
        let over = totals.get_document(TOP_OVERFLOW).expect("overflow");
        assert_eq!(
            over.get_document("queries")
                .expect("field")
                .get_i64("count")
                .expect("field"),
            5
        );
        let c0 = totals.get_document("db.c0").expect("c0");
        assert_eq!(
            c0.get_document("writeLock")
                .expect("field")
                .get_i64("time")
                .expect("field"),
            3
        );
    }
}
