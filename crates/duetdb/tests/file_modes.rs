//! Every directory the engine creates is 0700 and every file 0600, whatever
//! the umask (#14 item 5; MongoDB's rule). Before, they were 0755/0644, and
//! 0777/0666 under umask 0.
//!
//! Its own test binary: the umask is process-wide.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use duetdb::bson::doc;
use duetdb::{Database, Durability, DurabilityOptions, Engine, SnapshotOptions};

/// Every path under `root` (itself included) with its permission bits.
fn walk(root: &Path, out: &mut Vec<(PathBuf, u32, bool)>) {
    let meta = std::fs::symlink_metadata(root).expect("stat");
    out.push((
        root.to_path_buf(),
        meta.permissions().mode() & 0o7777,
        meta.is_dir(),
    ));
    if meta.is_dir() {
        for e in std::fs::read_dir(root).expect("list") {
            walk(&e.expect("entry").path(), out);
        }
    }
}

#[test]
fn file_modes_are_private_under_umask_zero() {
    // SAFETY: umask only sets the process's file-creation mask.
    unsafe { libc::umask(0) };
    let tmp = tempfile::tempdir().expect("tempdir");
    // Missing ancestors are created too, each 0700.
    let data = tmp.path().join("deep").join("data");
    let options = DurabilityOptions {
        mode: Durability::Fsync,
        segment_bytes: 4096, // several WAL segments
        ..Default::default()
    };
    {
        let engine = Engine::open_with(&data, options.clone()).expect("open");
        let db = engine.database("shop").expect("create");
        let c = db.collection("orders");
        for i in 0..200 {
            c.insert_one(doc! {"i": i, "pad": "x".repeat(64)})
                .expect("insert");
        }
        db.checkpoint().expect("checkpoint").expect("written");
        db.create_snapshot_with(
            "pinned",
            SnapshotOptions {
                durable: true,
                ..Default::default()
            },
        )
        .expect("durable snapshot");
        c.insert_one(doc! {"after": true}).expect("insert");
    }
    // A database opened on its own, and its LOCK.
    let solo = tmp.path().join("solo");
    {
        let db = Database::open_with(&solo, options).expect("open");
        db.collection("c")
            .insert_one(doc! {"x": 1})
            .expect("insert");
        db.checkpoint().expect("checkpoint");
    }
    let mut seen = Vec::new();
    walk(&tmp.path().join("deep"), &mut seen);
    walk(&solo, &mut seen);
    let names: Vec<String> = seen
        .iter()
        .filter_map(|(p, _, _)| p.file_name().map(|n| n.to_string_lossy().into_owned()))
        .collect();
    for wanted in ["LOCK", "MANIFEST", "shop"] {
        assert!(
            names.iter().any(|n| n == wanted),
            "no {wanted} in {names:?}"
        );
    }
    for prefix in ["wal-", "ckpt-", "snap-pinned"] {
        assert!(
            names.iter().any(|n| n.starts_with(prefix)),
            "no {prefix}* in {names:?}"
        );
    }
    for (path, mode, is_dir) in &seen {
        let want = if *is_dir { 0o700 } else { 0o600 };
        assert_eq!(*mode, want, "{} has mode {mode:o}", path.display());
    }
    assert_eq!(duetdb::storage::DIR_MODE, 0o700);
    assert_eq!(duetdb::storage::FILE_MODE, 0o600);
}
