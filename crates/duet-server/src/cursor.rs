//! Server-side cursors: the rest of a query's result, handed out in batches by
//! `getMore`, until exhausted, killed, or idle past the timeout.
//!
//! Invariants:
//! - a cursor holds the `Snapshot` its query ran on and the matching stored
//!   documents (shared `Arc`s, not copies), so every batch comes from that one
//!   consistent state whatever writes happen meanwhile; projection is applied
//!   per batch;
//! - cursors are global (drivers may send `getMore` on any pooled connection),
//!   but each is charged to the connection that opened it, and a connection may
//!   hold at most [`CursorRegistry::per_connection_limit`] open cursors;
//! - a cursor in use by a `getMore` is taken out of the registry meanwhile, so
//!   two concurrent `getMore`s on one id cannot both read it (the second gets
//!   CursorNotFound);
//! - a batch never exceeds [`MAX_BATCH_BYTES`] of documents (at least one
//!   document is always returned, and one document is at most 16 MiB, so the
//!   reply stays below the 48 MB message limit).

use std::collections::HashMap;
use std::time::{Duration, Instant};

use bson::{Bson, Document};
use duetdb::lang::Projection;
use duetdb::raw::DocRef;
use duetdb::Snapshot;
use parking_lot::Mutex;

use crate::error::{CmdResult, CommandError};

/// Most document bytes in one batch.
pub const MAX_BATCH_BYTES: usize = 16 * 1024 * 1024;
/// Documents in a first batch when the client sets no `batchSize` (MongoDB's 101).
pub const DEFAULT_FIRST_BATCH: usize = 101;

/// The remainder of one query.
pub struct Cursor {
    pub ns: String,
    /// The connection that opened it (for the per-connection limit).
    pub owner: u64,
    /// Keeps the state the documents came from alive and identifies it.
    pub snapshot: Option<Snapshot>,
    docs: std::vec::IntoIter<DocRef>,
    /// Pre-computed documents (commands whose results are not stored documents).
    owned: std::vec::IntoIter<Document>,
    projection: Option<Projection>,
    last_used: Instant,
}

impl Cursor {
    pub fn from_docs(
        ns: String,
        owner: u64,
        snapshot: Option<Snapshot>,
        docs: Vec<DocRef>,
        projection: Option<Projection>,
    ) -> Cursor {
        Cursor {
            ns,
            owner,
            snapshot,
            docs: docs.into_iter(),
            owned: Vec::new().into_iter(),
            projection,
            last_used: Instant::now(),
        }
    }

    pub fn from_owned(ns: String, owner: u64, docs: Vec<Document>) -> Cursor {
        Cursor {
            ns,
            owner,
            snapshot: None,
            docs: Vec::new().into_iter(),
            owned: docs.into_iter(),
            projection: None,
            last_used: Instant::now(),
        }
    }

    pub fn is_exhausted(&self) -> bool {
        self.docs.len() == 0 && self.owned.len() == 0
    }

    /// The next batch of at most `max` documents (`usize::MAX` = as many as
    /// fit in [`MAX_BATCH_BYTES`]; 0 = an empty batch).
    pub fn next_batch(&mut self, max: usize) -> CmdResult<Vec<Bson>> {
        let mut out = Vec::new();
        let mut bytes = 0usize;
        while out.len() < max {
            let next_size = match (self.docs.as_slice().first(), self.owned.as_slice().first()) {
                (Some(d), _) => d.as_bytes().len(),
                (None, Some(_)) => 0,
                (None, None) => break,
            };
            if !out.is_empty() && bytes + next_size > MAX_BATCH_BYTES {
                break;
            }
            let doc = if let Some(raw) = self.docs.next() {
                match &self.projection {
                    Some(p) => p.apply(&raw)?,
                    None => duetdb::raw::to_document(&raw)?,
                }
            } else if let Some(d) = self.owned.next() {
                d
            } else {
                break;
            };
            bytes += next_size.max(doc_len_hint(&doc));
            out.push(Bson::Document(doc));
        }
        self.last_used = Instant::now();
        Ok(out)
    }
}

fn doc_len_hint(d: &Document) -> usize {
    // Owned documents are small command results; estimate cheaply.
    d.len() * 32
}

/// All open cursors of a server.
pub struct CursorRegistry {
    inner: Mutex<Inner>,
    pub per_connection_limit: usize,
    pub idle_timeout: Duration,
}

struct Inner {
    next_id: i64,
    cursors: HashMap<i64, Cursor>,
    per_owner: HashMap<u64, usize>,
}

impl CursorRegistry {
    pub fn new(per_connection_limit: usize, idle_timeout: Duration) -> CursorRegistry {
        CursorRegistry {
            inner: Mutex::new(Inner {
                next_id: 1,
                cursors: HashMap::new(),
                per_owner: HashMap::new(),
            }),
            per_connection_limit,
            idle_timeout,
        }
    }

    /// Register a cursor that still has documents; returns its id.
    pub fn open(&self, cursor: Cursor) -> CmdResult<i64> {
        let mut g = self.inner.lock();
        let owned = g.per_owner.get(&cursor.owner).copied().unwrap_or(0);
        if owned >= self.per_connection_limit {
            return Err(CommandError::new(
                2,
                "BadValue",
                format!(
                    "too many open cursors on this connection (limit {}); exhaust or kill some",
                    self.per_connection_limit
                ),
            ));
        }
        // Ids are positive, never 0 (0 means "no cursor"), and not reused soon.
        let id = g.next_id;
        g.next_id = if id >= i64::MAX - 1 { 1 } else { id + 1 };
        *g.per_owner.entry(cursor.owner).or_insert(0) += 1;
        g.cursors.insert(id, cursor);
        Ok(id)
    }

    /// Take a cursor out for a `getMore`.
    pub fn take(&self, id: i64) -> Option<Cursor> {
        let mut g = self.inner.lock();
        let c = g.cursors.remove(&id)?;
        Self::uncharge(&mut g, c.owner);
        Some(c)
    }

    /// Put a cursor back after a `getMore` (or drop it when exhausted).
    pub fn put_back(&self, id: i64, cursor: Cursor) {
        if cursor.is_exhausted() {
            return;
        }
        let mut g = self.inner.lock();
        *g.per_owner.entry(cursor.owner).or_insert(0) += 1;
        g.cursors.insert(id, cursor);
    }

    /// Kill a cursor; `true` when it existed.
    pub fn kill(&self, id: i64) -> bool {
        self.take(id).is_some()
    }

    /// The namespace of an open cursor.
    pub fn ns_of(&self, id: i64) -> Option<String> {
        self.inner.lock().cursors.get(&id).map(|c| c.ns.clone())
    }

    pub fn len(&self) -> usize {
        self.inner.lock().cursors.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Drop cursors idle longer than the timeout; returns how many.
    pub fn reap_idle(&self) -> usize {
        let now = Instant::now();
        let mut g = self.inner.lock();
        let idle: Vec<i64> = g
            .cursors
            .iter()
            .filter(|(_, c)| now.duration_since(c.last_used) > self.idle_timeout)
            .map(|(id, _)| *id)
            .collect();
        for id in &idle {
            if let Some(c) = g.cursors.remove(id) {
                Self::uncharge(&mut g, c.owner);
            }
        }
        idle.len()
    }

    fn uncharge(g: &mut Inner, owner: u64) {
        if let Some(n) = g.per_owner.get_mut(&owner) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                g.per_owner.remove(&owner);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bson::doc;

    #[test]
    fn batches_limits_and_idle_reaping() {
        let reg = CursorRegistry::new(2, Duration::from_millis(0));
        let docs: Vec<Document> = (0..5).map(|i| doc! {"i": i}).collect();
        let mut c = Cursor::from_owned("t.c".into(), 1, docs);
        assert_eq!(c.next_batch(2).expect("batch").len(), 2);
        let id = reg.open(c).expect("open");
        assert_ne!(id, 0);
        reg.open(Cursor::from_owned("t.c".into(), 1, vec![doc! {}]))
            .expect("second");
        assert!(reg
            .open(Cursor::from_owned("t.c".into(), 1, vec![doc! {}]))
            .is_err());
        let mut c = reg.take(id).expect("take");
        assert_eq!(c.next_batch(usize::MAX).expect("rest").len(), 3);
        assert!(c.is_exhausted());
        reg.put_back(id, c);
        assert!(reg.take(id).is_none());
        std::thread::sleep(Duration::from_millis(2));
        assert_eq!(reg.reap_idle(), 1);
        assert!(reg.is_empty());
    }
}
