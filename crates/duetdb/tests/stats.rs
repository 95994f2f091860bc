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

/// `$indexStats`' `accesses.ops`: each read that walks an index adds one to
/// it, whichever strategy runs the read (each has its own executor), and a
/// read that walks no index adds nothing.
#[test]
fn index_uses_are_counted_once_per_read_under_every_strategy() {
    use duetdb::{IndexOptions, Strategy};
    let db = Database::in_memory();
    let c = db.collection("c");
    c.insert_many(
        (0..300i64).map(|i| doc! {"_id": i, "k": i % 7, "v": i}),
        true,
    )
    .expect("seed");
    c.create_index(doc! {"k": 1}, IndexOptions::default())
        .expect("index");
    let uses = |name: &str| {
        c.index_usage()
            .into_iter()
            .find(|(n, _, _)| n == name)
            .map(|(_, ops, _)| ops)
            .expect("the index is listed")
    };
    assert_eq!((uses("_id_"), uses("k_1")), (0, 0));
    let mut want = 0;
    for s in [
        Strategy::None,
        Strategy::Vls,
        Strategy::Cow,
        Strategy::Olcp,
        Strategy::Auto,
    ] {
        let docs = c.find(doc! {"k": 3}).snapshot(s).raw().expect("find");
        assert_eq!(docs.len(), 43);
        want += 1;
        assert_eq!(uses("k_1"), want, "find under {s}");
        let (n, _) = c.count_detailed(doc! {"k": {"$lt": 2}}, s).expect("count");
        assert_eq!(n, 86);
        want += 1;
        assert_eq!(uses("k_1"), want, "count under {s}");
    }
    // A streamed find walks page by page: still one use.
    let streamed = c
        .find(doc! {"k": {"$gte": 0}})
        .snapshot(Strategy::Cow)
        .stream()
        .expect("stream")
        .count();
    assert_eq!(streamed, 300);
    assert_eq!(uses("k_1"), want + 1);
    // No index: nothing counted; an _id lookup counts on _id_.
    let before = uses("_id_");
    assert_eq!(c.find(doc! {"v": 5}).raw().expect("scan").len(), 1);
    assert_eq!((uses("_id_"), uses("k_1")), (before, want + 1));
    assert_eq!(c.find(doc! {"_id": 5}).raw().expect("idhack").len(), 1);
    assert_eq!(uses("_id_"), before + 1);
    assert!(c
        .index_usage()
        .iter()
        .all(|(_, _, since)| *since <= std::time::SystemTime::now()));
    assert!(db.collection("missing").index_usage().is_empty());
}
