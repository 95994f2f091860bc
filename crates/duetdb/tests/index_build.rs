//! Index builds outside the writer (issue #18 item 9): a build from a
//! snapshot, caught up with inserts, updates and deletes committed while it
//! ran, equals a fresh build; unique violations fail and leave nothing;
//! dropping the index or the collection, or cancelling, aborts the build
//! and leaves nothing; the WAL holds only the finished index.
//!
//! Writes "during" a build are made deterministic by the build's `on_check`
//! hook, which runs on the building thread at every check (every few
//! hundred records scanned and changes applied): each call commits a few
//! writes through the writer, which the build must then catch up with.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use duetdb::bson::{doc, Document};
use duetdb::{
    CancelReason, CancelToken, Collection, Database, Engine, IndexBuildMode, IndexBuildOptions,
    IndexBuildProgress,
};
use parking_lot::Mutex;
use proptest::prelude::*;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

fn background(on_check: impl Fn() + Send + Sync + 'static) -> IndexBuildOptions {
    IndexBuildOptions {
        mode: IndexBuildMode::Background,
        on_check: Some(Arc::new(on_check)),
        ..Default::default()
    }
}

fn fill(c: &Collection, n: i32) {
    let docs: Vec<Document> = (0..n)
        .map(|i| doc! {"_id": i, "a": i % 97, "tags": [i % 5, i % 7], "s": format!("x{i}")})
        .collect();
    c.insert_many(docs, true).expect("fill");
}

fn index_names(c: &Collection) -> Vec<String> {
    c.list_indexes()
        .expect("list")
        .iter()
        .map(|d| d.get_str("name").expect("name").to_string())
        .collect()
}

/// One random write: insert, update (of indexed and unindexed fields),
/// replace or delete, on ids that may or may not exist.
fn random_write(c: &Collection, rng: &mut StdRng, next_id: &mut i32) {
    let id = rng.gen_range(0..*next_id);
    match rng.gen_range(0..5) {
        0 => {
            *next_id += 1;
            let a = rng.gen_range(0..200);
            c.insert_one(doc! {"_id": *next_id, "a": a, "tags": [a, a + 1]})
                .expect("insert");
        }
        1 => {
            let a = rng.gen_range(0..200);
            c.update_one(doc! {"_id": id}, doc! {"$set": {"a": a}})
                .expect("update");
        }
        2 => {
            c.update_one(
                doc! {"_id": id},
                doc! {"$push": {"tags": rng.gen_range(0..9)}},
            )
            .expect("push");
        }
        3 => {
            c.replace_one(doc! {"_id": id}, doc! {"b": 1})
                .expect("replace");
        }
        _ => {
            c.delete_one(doc! {"_id": id}).expect("delete");
        }
    }
}

/// Index `keys` answers `filter` as a collection scan does.
fn same_answers(c: &Collection, keys: &Document, filter: Document) {
    let ids = |hint: Document| {
        let mut v: Vec<String> = c
            .find(filter.clone())
            .hint(hint)
            .run()
            .expect("find")
            .iter()
            .map(|d| format!("{:?}", d.get("_id")))
            .collect();
        v.sort();
        v
    };
    assert_eq!(ids(doc! {"$natural": 1}), ids(keys.clone()));
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(8))]

    /// Model test: a build outside the writer under concurrent inserts,
    /// updates, replacements and deletes (committed at random points of the
    /// scan and of the catch-up) produces exactly the index a fresh build
    /// makes on the final state (`check_invariants` compares every index
    /// with the records' keys), and queries through it answer as a scan.
    #[test]
    fn background_build_under_writes_equals_a_fresh_build(
        seed in any::<u64>(),
        n in 300i32..2_500,
        writes_per_check in 0usize..40,
        keys in prop_oneof![Just(doc! {"a": 1}), Just(doc! {"tags": 1}), Just(doc! {"a": 1, "tags": 1})],
    ) {
        let db = Database::in_memory();
        let c = db.collection("c");
        fill(&c, n);
        let writer = c.clone();
        let rng = Mutex::new((StdRng::seed_from_u64(seed), n));
        let calls = Arc::new(AtomicUsize::new(0));
        let counted = calls.clone();
        let options = background(move || {
            counted.fetch_add(1, Ordering::Relaxed);
            let mut guard = rng.lock();
            let (rng, next_id) = &mut *guard;
            for _ in 0..writes_per_check {
                random_write(&writer, rng, next_id);
            }
        });
        let name = c
            .create_index_spec_with(&doc! {"key": keys.clone()}, &options)
            .expect("build");
        prop_assert!(calls.load(Ordering::Relaxed) > 0, "the build ran outside the writer");
        prop_assert!(index_names(&c).contains(&name));
        c.check_invariants().map_err(TestCaseError::fail)?;
        same_answers(&c, &keys, doc! {"a": {"$gte": 50}});
        same_answers(&c, &keys, doc! {"tags": 3});
    }
}

/// A unique build over duplicates fails with 11000 and leaves no index;
/// so does one whose duplicate is written during the build (found by the
/// catch-up), while a duplicate written and removed again before the
/// build looks does not fail it (checked at the catch-up, as MongoDB at
/// commit).
#[test]
fn unique_violations_fail_and_leave_nothing() {
    let db = Database::in_memory();
    let c = db.collection("c");
    let docs: Vec<Document> = (0..1000).map(|i| doc! {"_id": i, "u": i}).collect();
    c.insert_many(docs, true).expect("fill");
    c.insert_one(doc! {"_id": -1, "u": 500}).expect("dup");
    let unique = doc! {"key": {"u": 1}, "unique": true};
    let e = c
        .create_index_spec_with(&unique, &background(|| {}))
        .expect_err("duplicate in the snapshot");
    assert_eq!(e.code(), 11000, "{e}");
    assert_eq!(index_names(&c), vec!["_id_"]);
    c.delete_one(doc! {"_id": -1}).expect("delete");

    // A duplicate inserted during the scan.
    let writer = c.clone();
    let once = AtomicUsize::new(0);
    let e = c
        .create_index_spec_with(
            &unique,
            &background(move || {
                if once.fetch_add(1, Ordering::Relaxed) == 1 {
                    writer.insert_one(doc! {"_id": -2, "u": 7}).expect("dup");
                }
            }),
        )
        .expect_err("duplicate during the build");
    assert_eq!(e.code(), 11000, "{e}");
    assert_eq!(index_names(&c), vec!["_id_"]);
    c.delete_one(doc! {"_id": -2}).expect("delete");

    // Inserted and removed again between two checks: never seen.
    let writer = c.clone();
    let name = c
        .create_index_spec_with(
            &unique,
            &background(move || {
                writer.insert_one(doc! {"_id": -3, "u": 8}).expect("dup");
                writer.delete_one(doc! {"_id": -3}).expect("undo");
            }),
        )
        .expect("no duplicate at any catch-up");
    assert_eq!(name, "u_1");
    c.check_invariants().expect("invariants");
    let e = c
        .insert_one(doc! {"_id": -4, "u": 9})
        .expect_err("unique now");
    assert_eq!(e.code(), 11000);
}

/// `dropIndexes` of the index being built, dropping or renaming its
/// collection, dropping its database, and cancelling the command abort the build: 276
/// IndexBuildAborted (11601 for a kill), and no index is left.
#[test]
fn drop_rename_and_kill_abort_the_build() {
    let db = Database::in_memory();
    let c = db.collection("c");
    fill(&c, 2000);
    let spec = doc! {"key": {"a": 1}};

    let handle = c.clone();
    let e = c
        .create_index_spec_with(
            &spec,
            &background(move || {
                // Only an index being built has this name: dropIndexes
                // aborts it and succeeds.
                handle
                    .drop_index("a_1")
                    .expect("dropIndexes aborts the build");
            }),
        )
        .expect_err("aborted by dropIndexes");
    assert_eq!(e.code(), 276, "{e}");
    assert_eq!(index_names(&c), vec!["_id_"]);

    let handle = db.clone();
    let e = c
        .create_index_spec_with(
            &spec,
            &background(move || {
                handle.rename_collection("c", "d", false).ok();
            }),
        )
        .expect_err("aborted by a rename");
    assert_eq!(e.code(), 276, "{e}");
    let d = db.collection("d");
    assert_eq!(index_names(&d), vec!["_id_"]);

    let handle = db.clone();
    let e = d
        .create_index_spec_with(
            &spec,
            &background(move || {
                handle.drop_collection("d").ok();
            }),
        )
        .expect_err("aborted by drop");
    assert_eq!(e.code(), 276, "{e}");
    assert!(!db.list_collection_names().contains(&"d".to_string()));

    let engine = Engine::in_memory();
    let other = engine.database("other").expect("db");
    let o = other.collection("o");
    fill(&o, 1000);
    let e = o
        .create_index_spec_with(
            &spec,
            &background(move || {
                engine.drop_database("other");
            }),
        )
        .expect_err("aborted by dropDatabase");
    assert_eq!(e.code(), 276, "{e}");

    let c = db.collection("c");
    fill(&c, 2000);
    let token = CancelToken::new();
    let killer = token.clone();
    let progress = IndexBuildProgress::new();
    let seen = progress.clone();
    let options = IndexBuildOptions {
        mode: IndexBuildMode::Background,
        cancel: token,
        progress: Some(progress),
        on_check: Some(Arc::new(move || {
            let (_, done, total) = seen.get();
            if done > 0 {
                assert_eq!(total, 2000);
                killer.cancel(CancelReason::Killed);
            }
        })),
    };
    let e = c
        .create_index_spec_with(&spec, &options)
        .expect_err("killed");
    assert_eq!(e.code(), 11601, "{e}");
    assert_eq!(index_names(&c), vec!["_id_"]);
    // Nothing half-done is left behind: the same build then succeeds.
    c.create_index_spec_with(&spec, &background(|| {}))
        .expect("build");
    c.check_invariants().expect("invariants");
}

/// The WAL records only the finished index: after a restart it is there,
/// rebuilt from the log, equal to the writes made during the build; an
/// aborted build left nothing in the log.
#[test]
fn only_the_finished_index_is_logged() {
    let dir = tempfile::tempdir().expect("tmp");
    {
        let db = Database::open(dir.path()).expect("open");
        let c = db.collection("c");
        fill(&c, 1500);
        let handle = c.clone();
        let e = c
            .create_index_spec_with(
                &doc! {"key": {"s": 1}},
                &background(move || {
                    handle.drop_index("s_1").ok();
                }),
            )
            .expect_err("aborted");
        assert_eq!(e.code(), 276);
        let writer = c.clone();
        let state = Mutex::new((StdRng::seed_from_u64(7), 1500));
        c.create_index_spec_with(
            &doc! {"key": {"a": 1}},
            &background(move || {
                let mut guard = state.lock();
                let (rng, next_id) = &mut *guard;
                for _ in 0..5 {
                    random_write(&writer, rng, next_id);
                }
            }),
        )
        .expect("build");
        c.check_invariants().expect("invariants");
    }
    let db = Database::open(dir.path()).expect("reopen");
    let c = db.collection("c");
    assert_eq!(index_names(&c), vec!["_id_", "a_1"]);
    c.check_invariants().expect("invariants after recovery");
}

/// Small collections keep the in-writer build under `Auto` (no check hook
/// runs), and an identical index already there is a no-op either way.
#[test]
fn small_collections_build_in_the_writer() {
    let db = Database::in_memory();
    let c = db.collection("c");
    fill(&c, 100);
    let calls = Arc::new(AtomicUsize::new(0));
    let counted = calls.clone();
    let options = IndexBuildOptions {
        on_check: Some(Arc::new(move || {
            counted.fetch_add(1, Ordering::Relaxed);
        })),
        ..Default::default()
    };
    c.create_index_spec_with(&doc! {"key": {"a": 1}}, &options)
        .expect("build");
    assert_eq!(calls.load(Ordering::Relaxed), 0);
    c.create_index_spec_with(&doc! {"key": {"a": 1}}, &background(|| {}))
        .expect("identical again");
    let e = c
        .create_index_spec_with(&doc! {"key": {"a": 1}, "name": "other"}, &background(|| {}))
        .expect_err("same keys, other name");
    assert_eq!(e.code(), 85);
    assert_eq!(index_names(&c), vec!["_id_", "a_1"]);
}
