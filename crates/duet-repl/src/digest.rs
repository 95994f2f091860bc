//! Digests of named snapshots, compared across members: a read on a named
//! snapshot with a consistency level (`majority`, `all`) is served only when
//! that many members hold the same copy (the Cassandra Snapshotted Reads
//! paper's consistency levels; docs/design.md §19, "Snapshot consistency
//! levels").
//!
//! A digest covers one collection of a named snapshot: the number of
//! documents and the wrapping sum of each document's SHA-256 (its first 16
//! bytes, over the document's exact BSON bytes). A sum does not depend on
//! the order documents are stored in, so two members' copies agree when
//! they hold the same documents byte for byte, however each was built (from
//! the log, or from a Raft snapshot's checkpoint). Computing one reads every
//! document of the collection once (O(n), no query, nothing decoded).
//!
//! Invariants:
//! - the digest is a function of the collection's documents alone (name
//!   and contents), so equal snapshots give equal digests on every member
//!   and build;
//! - a member answers for a snapshot only once it has applied the log up to
//!   the index the asking member had applied when it asked (so a member
//!   that has yet to apply the `createSnapshot` entry waits, bounded, rather
//!   than reporting the snapshot missing).

use serde::{Deserialize, Serialize};
use sha2::{Digest as _, Sha256};

/// One collection of a named snapshot, summed up.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Digest {
    pub count: u64,
    /// Hex of SHA-256 over (collection name, count, sum of the documents'
    /// hashes).
    pub hash: String,
}

/// The digest of collection `coll` of `snap`.
pub fn of_snapshot(snap: &duetdb::Snapshot, coll: &str) -> Digest {
    let mut sum: u128 = 0;
    let count = snap.collection(coll).for_each_raw(|bytes| {
        let h = Sha256::digest(bytes);
        let mut first = [0u8; 16];
        first.copy_from_slice(&h[..16]);
        sum = sum.wrapping_add(u128::from_le_bytes(first));
        true
    });
    let mut outer = Sha256::new();
    outer.update((coll.len() as u64).to_le_bytes());
    outer.update(coll.as_bytes());
    outer.update(count.to_le_bytes());
    outer.update(sum.to_le_bytes());
    let hash = outer
        .finalize()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect::<String>();
    Digest { count, hash }
}

/// The digest of collection `coll` of named snapshot `name` of database
/// `db` on this member; the engine's error (code, message) when it lacks
/// the database or the snapshot.
pub fn of_named(
    engine: &duetdb::Engine,
    db: &str,
    name: &str,
    coll: &str,
) -> Result<Digest, (i32, String)> {
    let database = engine
        .get(db)
        .map_err(|e| (e.code(), e.to_string()))?
        .ok_or_else(|| (26, format!("database {db} does not exist on this member")))?;
    let snap = database
        .named_snapshot(name)
        .map_err(|e| (e.code(), e.to_string()))?;
    Ok(of_snapshot(&snap, coll))
}

#[cfg(test)]
mod tests {
    use super::*;
    use bson::doc;

    #[test]
    fn equal_documents_give_equal_digests_whatever_their_order() {
        let a = duetdb::Database::in_memory();
        let b = duetdb::Database::in_memory();
        for i in 0..50 {
            a.collection("c")
                .insert_one(doc! {"_id": i, "v": i * 2})
                .expect("insert");
        }
        for i in (0..50).rev() {
            b.collection("c")
                .insert_one(doc! {"_id": i, "v": i * 2})
                .expect("insert");
        }
        let (da, db) = (
            of_snapshot(&a.snapshot(), "c"),
            of_snapshot(&b.snapshot(), "c"),
        );
        assert_eq!(da, db);
        assert_eq!(da.count, 50);
        // One field of one document differs: another digest.
        b.collection("c")
            .update_one(doc! {"_id": 7}, doc! {"$set": {"v": 15}})
            .expect("update");
        assert_ne!(of_snapshot(&b.snapshot(), "c"), da);
        // Another collection's name with the same documents differs too,
        // and a missing collection is empty.
        assert_ne!(of_snapshot(&a.snapshot(), "d"), da);
        assert_eq!(of_snapshot(&a.snapshot(), "d").count, 0);
    }
}
