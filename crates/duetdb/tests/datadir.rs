//! The data directory (#14 items 2, 4, 16): lookups that create nothing, a
//! database that exists once written and forgotten when a creating command
//! committed nothing, one flusher and one checkpointer thread whatever the
//! number of databases, one lock for the whole directory, the layout of a
//! single database refused, and case-variant database names refused.
//!
//! Open descriptors under a low `RLIMIT_NOFILE` are in `fd_limit.rs`, file
//! modes under umask 0 in `file_modes.rs` (both change process-wide state).

use std::path::Path;

use duetdb::bson::doc;
use duetdb::{Database, Engine, Error, StorageError};

fn entries(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .expect("list")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .collect();
    v.sort();
    v
}

/// Threads of this process whose name starts with `prefix`.
fn threads_named(prefix: &str) -> usize {
    std::fs::read_dir("/proc/self/task")
        .expect("/proc/self/task")
        .filter_map(|t| std::fs::read_to_string(t.ok()?.path().join("comm")).ok())
        .filter(|name| name.trim_end().starts_with(prefix))
        .count()
}

#[test]
fn datadir_lookup_of_a_missing_database_creates_nothing() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let engine = Engine::open(tmp.path()).expect("open");
    for i in 0..50 {
        assert!(engine.get(&format!("missing{i}")).expect("valid").is_none());
    }
    assert!(matches!(
        engine.get("bad.name"),
        Err(Error::InvalidNamespace(_))
    ));
    assert_eq!(entries(tmp.path()), vec!["LOCK".to_string()]);
    assert!(engine.list_databases().is_empty());
    drop(engine);
    // Nothing to recover either.
    let engine = Engine::open(tmp.path()).expect("reopen");
    assert!(engine.get("missing0").expect("valid").is_none());
    assert_eq!(entries(tmp.path()), vec!["LOCK".to_string()]);
}

#[test]
fn datadir_database_exists_once_written_and_restart_agrees() {
    let tmp = tempfile::tempdir().expect("tempdir");
    {
        let engine = Engine::open(tmp.path()).expect("open");
        let (db, created) = engine.database_created("shop").expect("create");
        assert!(created);
        db.collection("c")
            .insert_one(doc! {"x": 1})
            .expect("insert");
        assert!(
            !engine.discard_if_unused("shop"),
            "a written database stays"
        );
        drop(db);
        // Created, but nothing committed (a failed insert): forgotten again.
        let (db, created) = engine.database_created("empty").expect("create");
        assert!(created);
        assert!(
            !engine.discard_if_unused("empty"),
            "kept while a handle is held"
        );
        drop(db);
        assert!(engine.discard_if_unused("empty"));
        assert!(engine.get("empty").expect("valid").is_none());
        let names: Vec<String> = engine
            .list_databases()
            .into_iter()
            .map(|(n, _)| n)
            .collect();
        assert_eq!(names, vec!["shop".to_string()]);
    }
    assert_eq!(
        entries(tmp.path()),
        vec!["LOCK".to_string(), "shop".to_string()]
    );
    let engine = Engine::open(tmp.path()).expect("reopen");
    let names: Vec<String> = engine
        .list_databases()
        .into_iter()
        .map(|(n, _)| n)
        .collect();
    assert_eq!(names, vec!["shop".to_string()]);
    let shop = engine.get("shop").expect("valid").expect("exists");
    assert_eq!(shop.collection("c").count(doc! {}).expect("count"), 1);
}

#[test]
fn datadir_background_threads_do_not_grow_per_database() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let engine = Engine::open(tmp.path()).expect("open");
    for i in 0..100 {
        engine
            .database(&format!("db{i}"))
            .expect("create")
            .collection("c")
            .insert_one(doc! {"i": i})
            .expect("insert");
    }
    assert!(duetdb::storage::background_registrations() >= 100);
    // One flusher and one checkpointer for the whole process (other tests
    // of this binary open databases too: the count would grow with them).
    assert_eq!(threads_named("duet-wal-flush"), 1);
    assert_eq!(threads_named("duet-checkpoint"), 1);
    drop(engine);
}

#[test]
fn datadir_closed_database_leaves_the_background_service() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let db = Database::open(tmp.path().join("solo")).expect("open");
    db.collection("c")
        .insert_one(doc! {"x": 1})
        .expect("insert");
    let path = db.path().expect("path").to_path_buf();
    drop(db);
    // Reopening at once finds nothing held by a background thread.
    let db = Database::open(&path).expect("reopen right after close");
    assert_eq!(db.collection("c").count(doc! {}).expect("count"), 1);
}

fn assert_locked(r: duetdb::Result<impl std::fmt::Debug>, dir: &Path) {
    match r {
        Err(Error::Storage(e)) => {
            assert!(
                matches!(&*e, StorageError::Locked { path } if path == dir),
                "{e}"
            );
            let msg = e.to_string();
            assert!(msg.contains(&dir.display().to_string()), "{msg}");
            assert!(msg.contains("another process"), "{msg}");
        }
        other => panic!(
            "expected a lock error naming {}, got {other:?}",
            dir.display()
        ),
    }
}

#[test]
fn datadir_is_locked_as_a_whole() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path().join("data");
    // Empty: before, each database had its own lock, so two engines could
    // share an empty data directory.
    let engine = Engine::open(&dir).expect("open");
    assert_locked(Engine::open(&dir), &dir);
    let db = engine.database("test").expect("create");
    db.collection("c")
        .insert_one(doc! {"x": 1})
        .expect("insert");
    // A database of a locked data directory cannot be opened on its own.
    assert_locked(Database::open(dir.join("test")), &dir);
    assert_locked(Database::open(dir.join("other")), &dir);
    // The lock lives as long as any of its databases.
    drop(engine);
    assert_locked(Engine::open(&dir), &dir);
    drop(db);
    let engine = Engine::open(&dir).expect("reopen once everything is closed");
    drop(engine);
    // A database opened on its own keeps the server out of its data directory.
    let solo = Database::open(dir.join("test")).expect("open alone");
    assert_locked(Engine::open(&dir), &dir);
    drop(solo);
    Engine::open(&dir).expect("reopen");
}

#[test]
fn datadir_single_database_layout_is_refused() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let db = Database::open(tmp.path()).expect("open");
    db.collection("c")
        .insert_one(doc! {"x": 1})
        .expect("insert");
    drop(db);
    match Engine::open(tmp.path()) {
        Err(Error::IllegalOperation(m)) => {
            assert!(m.contains("single database"), "{m}");
            assert!(m.contains(&tmp.path().display().to_string()), "{m}");
        }
        other => panic!("expected the layout to be refused, got {other:?}"),
    }
}

#[test]
fn datadir_case_variant_database_is_refused() {
    for engine in [
        Engine::in_memory(),
        Engine::open(tempfile::tempdir().expect("tempdir").keep()).expect("open"),
    ] {
        engine
            .database("refdb")
            .expect("create")
            .collection("c")
            .insert_one(doc! {"x": 1})
            .expect("insert");
        let e = engine.database("Refdb").expect_err("case variant");
        assert_eq!(e.code(), 13297);
        assert_eq!(e.code_name(), "DatabaseDifferCase");
        assert_eq!(
            e.to_string(),
            "db already exists with different case already have: [refdb] trying to create [Refdb]"
        );
        assert!(engine.get("Refdb").expect("valid").is_none());
        // The existing name itself is fine, and so is a lookup.
        engine.database("refdb").expect("same name");
        if let Some(dir) = engine.dir() {
            let dir = dir.to_path_buf();
            drop(engine);
            assert!(!dir.join("Refdb").exists());
            let _ = std::fs::remove_dir_all(dir);
        }
    }
}

#[test]
fn datadir_transaction_moves_from_a_stand_in_to_the_created_database() {
    let engine = Engine::in_memory();
    // A server's stand-in for a database that did not exist at the start.
    let stand_in = Database::named("late", None);
    let mut tx = stand_in.begin(Default::default());
    tx.insert_one("c", doc! {"_id": 1}).expect("buffered");
    let db = engine.database("late").expect("create");
    assert!(!tx.is_on(&db));
    tx.rebind(&db).expect("empty snapshot rebinds");
    assert!(tx.is_on(&db));
    tx.commit().expect("commit");
    assert_eq!(db.collection("c").count(doc! {}).expect("count"), 1);
    // A transaction on a database with content cannot move: its snapshot
    // is not an earlier state of the other database.
    let mut tx = db.begin(Default::default());
    tx.insert_one("c", doc! {"_id": 2}).expect("buffered");
    let other = Database::named("late", None);
    assert_eq!(tx.rebind(&other).expect_err("conflict").code(), 112);
}
