//! Thousands of databases under the common 1,024 open-file limit (#14 item
//! 2): the engine keeps working, and restarts — before, every open database
//! held its WAL segment and its LOCK open, opens failed after ~500
//! databases, and the engine then refused to restart ("Too many open
//! files").
//!
//! Its own test binary: `RLIMIT_NOFILE` is process-wide, and the descriptor
//! cache takes its default bound from it at the first file operation.

use duetdb::bson::doc;
use duetdb::{Durability, DurabilityOptions, Engine};

const LIMIT: u64 = 1024;
const DATABASES: usize = 2000;

fn open_descriptors() -> usize {
    std::fs::read_dir("/proc/self/fd")
        .expect("/proc/self/fd")
        .count()
}

#[test]
fn fd_limit_thousands_of_databases_work_and_restart_under_1024_files() {
    let limit = libc::rlimit {
        rlim_cur: LIMIT,
        rlim_max: LIMIT,
    };
    // SAFETY: setrlimit reads the struct we pass; lowering a limit is always allowed.
    assert_eq!(unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &limit) }, 0);
    let tmp = tempfile::tempdir().expect("tempdir");
    let options = DurabilityOptions {
        // One fsync per database is enough to prove the point quickly.
        mode: Durability::Batch,
        ..Default::default()
    };
    let mut peak = 0;
    {
        let engine = Engine::open_with(tmp.path(), options.clone()).expect("open");
        for i in 0..DATABASES {
            let db = engine.database(&format!("db{i}")).expect("create");
            db.collection("c")
                .insert_one(doc! {"i": i as i64})
                .expect("insert");
            peak = peak.max(open_descriptors());
        }
        assert!(
            duetdb::storage::open_files() <= duetdb::storage::max_open_files() + 2,
            "{} cached descriptors",
            duetdb::storage::open_files()
        );
    }
    assert!(peak < LIMIT as usize, "peak {peak} descriptors");
    // Restart: recovery must not need one descriptor per database at once.
    let engine = Engine::open_with(tmp.path(), options).expect("restart");
    assert_eq!(engine.list_databases().len(), DATABASES);
    for i in (0..DATABASES).rev() {
        let db = engine
            .get(&format!("db{i}"))
            .expect("valid")
            .expect("recovered");
        assert_eq!(
            db.collection("c")
                .count(doc! {"i": i as i64})
                .expect("count"),
            1
        );
        // And each still takes writes (its descriptor reopened on demand).
        db.collection("c")
            .insert_one(doc! {"again": true})
            .expect("insert after restart");
    }
    assert!(open_descriptors() < LIMIT as usize);
}
