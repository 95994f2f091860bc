//! Reading change records back from a database's WAL segments: the source
//! of positions older than the in-memory tail, and of everything before a
//! restart.
//!
//! Only version-2 records carry a cluster time; version-1 records (written
//! before change streams existed) are skipped: no event was ever issued for
//! them, so no resume token can point among them.
//!
//! Invariants: a segment is read whole (at most `segment_bytes`, 64 MiB by
//! default) and decoded frame by frame; reading stops at the first frame that
//! does not decode — the end of the active segment being appended to, or
//! damage, which recovery (not this reader) judges. Records are returned in
//! log order, which is time order within one database.

use std::path::Path;
use std::sync::Arc;

use super::{ChangeRecord, Stamp};
use crate::durability::io::Vfs;
use crate::durability::wal::{self, SEGMENT_MAGIC};
use crate::error::StorageError;

/// The records of one segment's bytes with a time in `(after, upto]`, at
/// most `max`; the flag says whether the segment holds more beyond `max`
/// (still `<= upto`).
pub fn records_in(
    bytes: &[u8],
    db: &Arc<str>,
    after: u64,
    upto: u64,
    max: usize,
) -> (Vec<ChangeRecord>, bool) {
    let mut out = Vec::new();
    if bytes.len() < SEGMENT_MAGIC.len() || &bytes[..SEGMENT_MAGIC.len()] != SEGMENT_MAGIC {
        return (out, false);
    }
    let mut pos = SEGMENT_MAGIC.len();
    while let Ok(Some((payload, next))) = wal::read_frame(bytes, pos) {
        pos = next;
        let Some(ts) = wal::record_time(payload) else {
            continue;
        };
        if ts <= after {
            continue;
        }
        if ts > upto {
            break;
        }
        if out.len() == max {
            return (out, true);
        }
        let Ok(rec) = wal::decode_record(payload) else {
            break;
        };
        out.push(ChangeRecord::group(
            db.clone(),
            Stamp {
                ts: rec.ts,
                wall_ms: rec.wall_ms,
            },
            rec.effects,
        ));
    }
    (out, false)
}

/// The time of the first version-2 record of a segment's bytes.
pub fn first_time(bytes: &[u8]) -> Option<u64> {
    if bytes.len() < SEGMENT_MAGIC.len() {
        return None;
    }
    let mut pos = SEGMENT_MAGIC.len();
    while let Ok(Some((payload, next))) = wal::read_frame(bytes, pos) {
        if let Some(ts) = wal::record_time(payload) {
            return Some(ts);
        }
        pos = next;
    }
    None
}

/// Read a whole segment file.
pub fn read_segment(vfs: &dyn Vfs, dir: &Path, first: u64) -> Result<Vec<u8>, StorageError> {
    let path = dir.join(wal::segment_name(first));
    vfs.read(&path)
        .map_err(|e| StorageError::io("read", &path, &e))
}
