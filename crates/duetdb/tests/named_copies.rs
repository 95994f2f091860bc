//! Named snapshots carried by a copy of their database (what a replica
//! set's Raft snapshot does, docs/design.md §19): `Database::named_copies`
//! takes every held snapshot — in memory, durable and read, durable and
//! still on disk since a reopen — with its description; each image written
//! with `NamedCopy::write_image` and installed with
//! `Engine::restore_database_with` gives another engine the same named
//! snapshots (same name, csn, cluster time, creation time, TTL,
//! collections, durability, documents); durable ones survive its restart,
//! the others do not and leave no file behind. A pinned image dropped
//! between the copy's capture and its write is reported gone, not an error;
//! an expired snapshot is left out of a copy (and not swept by it).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use duetdb::bson::doc;
use duetdb::replication::NamedImage;
use duetdb::{Database, Engine, SnapshotOptions};

/// Per collection, the documents of named snapshot `name` (in `_id` order).
fn contents(db: &Database, name: &str) -> BTreeMap<String, Vec<String>> {
    let snap = db.named_snapshot(name).expect("named snapshot");
    let mut out = BTreeMap::new();
    for c in snap.list_collection_names() {
        let mut docs: Vec<String> = snap
            .collection(&c)
            .find(doc! {})
            .run()
            .expect("find")
            .iter()
            .map(|d| format!("{d}"))
            .collect();
        docs.sort();
        out.insert(c, docs);
    }
    out
}

/// A snapshot as `list_snapshots` describes it: name, csn, creation time
/// (unix ms), TTL, collections, durability.
type Described = (
    String,
    u64,
    u128,
    Option<Duration>,
    Option<Vec<String>>,
    bool,
);

/// What `list_snapshots` says that a copy must keep (not the age or the
/// retained cost, which depend on the holder).
fn described(db: &Database) -> Vec<Described> {
    db.list_snapshots()
        .into_iter()
        .map(|i| {
            let created = i
                .created
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_millis());
            (i.name, i.csn, created, i.ttl, i.collections, i.durable)
        })
        .collect()
}

fn snap_files(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .expect("read dir")
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with("snap-"))
        .collect();
    v.sort();
    v
}

fn fill(db: &Database, from: i32, to: i32) {
    for i in from..to {
        db.collection("c")
            .insert_one(doc! {"_id": i, "v": i * 3})
            .expect("insert c");
        db.collection("k")
            .insert_one(doc! {"_id": i, "w": format!("k{i}")})
            .expect("insert k");
    }
}

fn opts(durable: bool, collections: Option<Vec<String>>, ttl: Option<Duration>) -> SnapshotOptions {
    SnapshotOptions {
        collections,
        ttl,
        durable,
    }
}

#[test]
fn named_snapshots_travel_with_a_copy_of_their_database() {
    let tmp = tempfile::tempdir().expect("tmp");
    let a_dir = tmp.path().join("a");
    let engine = Engine::open(&a_dir).expect("open a");
    let db = engine.database("d").expect("d");
    db.collection("c")
        .create_index(doc! {"v": 1}, duetdb::IndexOptions::default())
        .expect("index");
    fill(&db, 0, 20);
    db.create_snapshot_with("on-disk", opts(true, None, None))
        .expect("durable");
    fill(&db, 20, 30);
    db.create_snapshot_with("only-c", opts(true, Some(vec!["c".into()]), None))
        .expect("durable, one collection");
    // Reopened: both durable snapshots are on disk, unread.
    drop(db);
    drop(engine);
    let engine = Engine::open(&a_dir).expect("reopen a");
    let db = engine.get("d").expect("name").expect("d");
    db.collection("c")
        .delete_many(doc! {"_id": {"$lt": 5}})
        .expect("delete");
    let ttl = Some(Duration::from_secs(3600));
    db.create_snapshot_with("in-memory", opts(false, None, ttl))
        .expect("in memory");
    db.collection("k")
        .update_many(doc! {}, doc! {"$set": {"u": true}})
        .expect("update");
    // Read once: loaded, so copied from memory rather than from its file.
    let only_c = contents(&db, "only-c");
    assert_eq!(only_c.len(), 1);

    // The copy: the database's image and one per named snapshot.
    let copies = db.named_copies();
    let mut names: Vec<&str> = copies.iter().map(|c| c.image.name.as_str()).collect();
    names.sort();
    assert_eq!(names, ["in-memory", "on-disk", "only-c"]);
    let work = tmp.path().join("work");
    std::fs::create_dir_all(&work).expect("work");
    let image = work.join("d");
    duetdb::replication::write_image("d", &db.snapshot(), &image).expect("image");
    let mut named: Vec<(NamedImage, PathBuf)> = Vec::new();
    for (i, c) in copies.iter().enumerate() {
        let to = work.join(format!("{i}.ckpt"));
        let bytes = c.write_image(&to).expect("write").expect("still there");
        assert!(bytes > 0);
        named.push((c.image.clone(), to));
    }

    let b_dir = tmp.path().join("b");
    let b = Engine::open(&b_dir).expect("open b");
    let rdb = b
        .restore_database_with("d", &image, &named)
        .expect("restore with named snapshots");
    assert_eq!(described(&rdb), described(&db));
    for name in ["in-memory", "on-disk", "only-c"] {
        assert_eq!(contents(&rdb, name), contents(&db, name), "{name}");
        assert_eq!(
            rdb.named_snapshot(name).expect("b").cluster_time(),
            db.named_snapshot(name).expect("a").cluster_time(),
            "{name}: the same cluster time"
        );
    }
    let info = rdb.snapshot_info("in-memory").expect("info");
    assert_eq!(info.ttl, ttl);
    assert!(!info.durable);
    // The one that is not durable lives in a file of its own, removed with it.
    let files = snap_files(&b_dir.join("d"));
    assert_eq!(files.len(), 3, "{files:?}");
    rdb.drop_snapshot("in-memory").expect("drop");
    assert_eq!(snap_files(&b_dir.join("d")).len(), 2);
    rdb.install_named_image(&named[0].0, &named[0].1)
        .expect_err("its image was moved away");

    // Restarted: the durable ones are still there, unchanged.
    let want_on_disk = contents(&db, "on-disk");
    drop(rdb);
    drop(b);
    let b = Engine::open(&b_dir).expect("reopen b");
    let rdb = b.get("d").expect("name").expect("d");
    let mut left: Vec<String> = rdb.list_snapshots().into_iter().map(|i| i.name).collect();
    left.sort();
    assert_eq!(left, ["on-disk", "only-c"]);
    assert!(rdb.snapshot_info("on-disk").expect("info").durable);
    assert_eq!(contents(&rdb, "on-disk"), want_on_disk);
    assert_eq!(contents(&rdb, "only-c"), only_c);
    assert_eq!(snap_files(&b_dir.join("d")).len(), 2);

    // A pinned image dropped after the capture is gone, not an error.
    drop(db);
    drop(engine);
    let engine = Engine::open(&a_dir).expect("reopen a again");
    let db = engine.get("d").expect("name").expect("d");
    let copies = db.named_copies();
    db.drop_snapshot("on-disk").expect("drop on a");
    let gone = copies
        .iter()
        .find(|c| c.image.name == "on-disk")
        .expect("captured");
    assert_eq!(
        gone.write_image(&work.join("late.ckpt")).expect("write"),
        None
    );
}

#[test]
fn an_installed_snapshot_that_is_not_durable_leaves_no_file_after_a_restart() {
    let tmp = tempfile::tempdir().expect("tmp");
    let engine = Engine::open(tmp.path().join("a")).expect("open a");
    let db = engine.database("d").expect("d");
    fill(&db, 0, 5);
    db.create_snapshot("s", None, None).expect("snapshot");
    let copy = db.named_copies().pop().expect("one");
    let work = tmp.path().join("work");
    std::fs::create_dir_all(&work).expect("work");
    let file = work.join("s.ckpt");
    copy.write_image(&file).expect("write").expect("there");
    let image = work.join("d");
    duetdb::replication::write_image("d", &db.snapshot(), &image).expect("image");

    let b_dir = tmp.path().join("b");
    let b = Engine::open(&b_dir).expect("open b");
    b.restore_database_with("d", &image, &[(copy.image.clone(), file)])
        .expect("restore");
    assert_eq!(snap_files(&b_dir.join("d")).len(), 1);
    drop(b);
    let b = Engine::open(&b_dir).expect("reopen b");
    let rdb = b.get("d").expect("name").expect("d");
    assert!(rdb.list_snapshots().is_empty());
    assert_eq!(rdb.named_snapshot("s").expect_err("gone").code(), 246);
    assert!(snap_files(&b_dir.join("d")).is_empty());
}

#[test]
fn an_expired_snapshot_is_left_out_of_a_copy() {
    let tmp = tempfile::tempdir().expect("tmp");
    let engine = Engine::open(tmp.path()).expect("open");
    let db = engine.database("d").expect("d");
    let clock = std::sync::Arc::new(duetdb::ManualClock::new());
    db.set_snapshot_clock(clock.clone());
    fill(&db, 0, 3);
    db.create_snapshot_with("short", opts(true, None, Some(Duration::from_secs(1))))
        .expect("short");
    db.create_snapshot("long", None, None).expect("long");
    clock.advance(Duration::from_secs(2));
    let names: Vec<String> = db
        .named_copies()
        .into_iter()
        .map(|c| c.image.name)
        .collect();
    assert_eq!(names, ["long"]);
    // Left for the next sweep, which unpins it (a copy does no I/O).
    assert_eq!(snap_files(&tmp.path().join("d")).len(), 1);
    assert_eq!(db.expire_snapshots(), 1);
    assert!(snap_files(&tmp.path().join("d")).is_empty());
}
