//! What the Raft log holds and how openraft is instantiated for it.
//!
//! One Raft group replicates every database of the server. A log entry is
//! either one writer group's WAL record of one database — the exact bytes
//! the database's WAL stores (`duetdb::durability::wal::encode_record`) —
//! or a `dropDatabase` or named-snapshot command, which carry the primary's
//! times, or an idle primary's no-op (a time only). New variants are appended (bincode numbers them by position), so
//! logs written by an older build still decode. Entries are encoded with bincode on the wire and in
//! the Raft log file.

use serde::{Deserialize, Serialize};

openraft::declare_raft_types!(
    /// openraft's type configuration for duet replica sets.
    pub TypeConfig:
        D = Request,
        R = Response,
        NodeId = u64,
        Node = openraft::BasicNode,
        Entry = openraft::Entry<TypeConfig>,
        // A Raft snapshot is a file (`snapshot.rs`), sent in chunks.
        SnapshotData = tokio::fs::File,
);

pub type NodeId = u64;
pub type Raft = openraft::Raft<TypeConfig>;
pub type LogId = openraft::LogId<NodeId>;
pub type Entry = openraft::Entry<TypeConfig>;
pub type Vote = openraft::Vote<NodeId>;
pub type StoredMembership = openraft::StoredMembership<NodeId, openraft::BasicNode>;
pub type StorageError = openraft::StorageError<NodeId>;

/// Which writer made a group entry: the member, its process incarnation (a
/// random number per start, so tokens of an earlier run never match) and
/// a token the writer waits on. Only the member that made the entry looks
/// at it: to hand the commit back to its waiting writer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Origin {
    pub member: NodeId,
    pub incarnation: u64,
    pub token: u64,
}

/// One replicated operation (a Raft log entry's application data).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Request {
    /// One writer group of database `db`: its WAL record payload, and the
    /// origin tags of the client operations it applied (`retries.rs`).
    Group {
        db: String,
        origin: Origin,
        payload: Vec<u8>,
        retries: Vec<Vec<u8>>,
    },
    /// Drop database `db` on every member.
    DropDatabase { db: String },
    /// Take named snapshot `name` of database `db` on every member, at this
    /// log position (so it is the same state everywhere).
    CreateSnapshot {
        db: String,
        name: String,
        collections: Option<Vec<String>>,
        ttl_secs: Option<u64>,
        durable: bool,
    },
    /// Drop named snapshot `name` of database `db` on every member.
    DropSnapshot { db: String, name: String },
    // Variants below were added later: bincode numbers variants by
    // position, so new ones go at the end and old logs still decode (the
    // older forms above are still applied as they were).
    /// `dropDatabase` at the primary's cluster time `ts` (taken under the
    /// clock's order, so the log stays in time order) and wall-clock
    /// `wall_ms`: every member drops at that time, and a read waiting for
    /// it (`afterClusterTime`) is served once the drop is applied.
    /// `origin` tells the primary its own entry (its time is already in
    /// flight in its clock; another member adopts it).
    DropDatabaseAt {
        db: String,
        ts: u64,
        wall_ms: i64,
        origin: Origin,
    },
    /// `CreateSnapshot`, created at the primary's wall-clock `created_ms`:
    /// the snapshot's `created`, age and TTL count from there on every
    /// member.
    CreateSnapshotAt {
        db: String,
        name: String,
        collections: Option<Vec<String>>,
        ttl_secs: Option<u64>,
        durable: bool,
        created_ms: u64,
    },
    /// An idle primary's no-op (MongoDB's periodic no-op oplog entry): it
    /// changes no database; every member takes its cluster time `ts` and
    /// wall-clock `wall_ms` as its last write's, so secondaries' `lastWrite`
    /// advance while nothing is written (drivers compare them for
    /// `maxStalenessSeconds`). `origin` as in `DropDatabaseAt`.
    Noop {
        ts: u64,
        wall_ms: i64,
        origin: Origin,
    },
    /// `Group`, its client operations' tags each with what its command did
    /// (`duetdb::WriteOutcome`, encoded), so a retry answered from the
    /// retry table gets the first execution's reply (`retries.rs`). Every
    /// group is proposed in this form now; `Group` entries of older logs
    /// apply as tags without outcomes.
    GroupReplies {
        db: String,
        origin: Origin,
        payload: Vec<u8>,
        retries: Vec<Tagged>,
    },
}

/// One tagged command of a group entry: its client operation's tag and its
/// outcome (empty: nothing to tell).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Tagged {
    pub tag: Vec<u8>,
    pub outcome: Vec<u8>,
}

impl Tagged {
    /// A tag of an older log's `Group` entry (no outcome).
    pub fn bare(tag: Vec<u8>) -> Tagged {
        Tagged {
            tag,
            outcome: Vec::new(),
        }
    }
}

/// What applying an entry did.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Response {
    /// The group was applied (published) on this member.
    Applied,
    /// The group did not continue its database's log (it was made on a
    /// state a concurrent entry moved past) and was skipped by every member.
    Skipped,
    /// A `dropDatabase` was applied (`existed`: the database existed).
    Dropped { existed: bool },
    /// A named-snapshot entry was applied: the snapshot's csn (0 for a
    /// drop), or the engine error's code and message.
    Snapshot(Result<u64, (i32, String)>),
}

/// The commit range of a group record payload, read from its header
/// (`lsn u64 | first u64 | ...`): `(first, lsn)`.
pub fn record_range(payload: &[u8]) -> Option<(u64, u64)> {
    let lsn = u64::from_le_bytes(payload.get(0..8)?.try_into().ok()?);
    let first = u64::from_le_bytes(payload.get(8..16)?.try_into().ok()?);
    Some((first, lsn))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Raft logs written before a variant was added must still decode:
    /// bincode numbers enum variants by position (a u32 first), so existing
    /// variants keep their numbers and new ones go at the end.
    #[test]
    fn variants_keep_their_positions_in_the_log_encoding() {
        let tag = |r: &Request| {
            let b = bincode::serialize(r).expect("encode");
            u32::from_le_bytes(b[..4].try_into().expect("tag"))
        };
        let db = || "d".to_string();
        assert_eq!(tag(&Request::DropDatabase { db: db() }), 1);
        assert_eq!(
            tag(&Request::DropSnapshot {
                db: db(),
                name: "s".into()
            }),
            3
        );
        let at = Request::DropDatabaseAt {
            db: db(),
            ts: 7 << 32 | 2,
            wall_ms: 7000,
            origin: Origin {
                member: 1,
                incarnation: 2,
                token: 3,
            },
        };
        assert_eq!(tag(&at), 4);
        let noop = Request::Noop {
            ts: 8 << 32,
            wall_ms: 8000,
            origin: Origin {
                member: 1,
                incarnation: 2,
                token: 4,
            },
        };
        assert_eq!(tag(&noop), 6);
        let group = Request::GroupReplies {
            db: db(),
            origin: Origin {
                member: 1,
                incarnation: 2,
                token: 5,
            },
            payload: vec![1, 2],
            retries: vec![Tagged {
                tag: vec![3],
                outcome: vec![4],
            }],
        };
        assert_eq!(tag(&group), 7);
        let b = bincode::serialize(&group).expect("encode");
        assert_eq!(bincode::deserialize::<Request>(&b).expect("decode"), group);
        let old = bincode::serialize(&Request::DropDatabase { db: db() }).expect("encode");
        assert_eq!(
            bincode::deserialize::<Request>(&old).expect("an old entry decodes"),
            Request::DropDatabase { db: db() }
        );
        let b = bincode::serialize(&at).expect("encode");
        assert_eq!(bincode::deserialize::<Request>(&b).expect("decode"), at);
    }
}
