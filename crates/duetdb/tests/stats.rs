//! The writer and WAL figures `serverStatus` reports move with real work:
//! commands and groups are counted, a durable database counts records, bytes
//! and fsyncs, and an in-memory one has no log figures.

use duetdb::bson::doc;
use duetdb::{Database, DurabilityOptions};

#[test]
fn writer_counts_commands_and_groups() {
    let db = Database::in_memory();
    let before = db.writer_stats();
    let c = db.collection("c");
    for i in 0..10 {
        c.insert_one(doc! {"_id": i}).expect("insert");
    }
    // A failing command is applied (and counted) but publishes nothing.
    assert!(c.insert_one(doc! {"_id": 3}).is_err());
    let after = db.writer_stats();
    assert_eq!(after.commands - before.commands, 11);
    assert!(after.groups - before.groups >= 1 && after.groups - before.groups <= 11);
    assert!(after.largest_group >= 1);
    assert_eq!(after.csn, db.csn());
    assert_eq!(after.queue_len, 0);
    assert!(db.wal_stats().is_none());
}

#[test]
fn wal_counts_records_bytes_and_fsyncs() {
    let dir = tempfile::tempdir().expect("tempdir");
    let db = Database::open_with(dir.path(), DurabilityOptions::default()).expect("open");
    let w0 = db.wal_stats().expect("a durable database has a log");
    let c = db.collection("c");
    for i in 0..5 {
        c.insert_one(doc! {"_id": i, "x": "y"}).expect("insert");
    }
    let w1 = db.wal_stats().expect("log");
    assert_eq!(
        w1.records - w0.records,
        5,
        "one record per group; the first insert creates the collection in its own record"
    );
    assert!(w1.bytes > w0.bytes);
    assert!(
        w1.fsyncs - w0.fsyncs >= 5,
        "fsync mode syncs every acknowledged group"
    );
    assert_eq!(w1.last_lsn, db.csn());
    assert!(!w1.stopped);
}
