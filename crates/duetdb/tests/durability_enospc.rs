//! A real full disk: a tiny tmpfs is mounted (where the machine allows it;
//! otherwise the test says so and skips), filled through the engine until
//! ENOSPC, checked for a clear error and an intact, readable store, then grown
//! so writing resumes, and reopened.

use std::path::{Path, PathBuf};
use std::process::Command;

use duetdb::bson::doc;
use duetdb::storage::is_no_space;
use duetdb::{Database, Durability, DurabilityOptions, IndexOptions};

struct Mount(PathBuf);

impl Mount {
    fn tmpfs(dir: &Path, size: &str) -> Option<Mount> {
        std::fs::create_dir_all(dir).ok()?;
        let ok = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(dir)
            .status()
            .is_ok_and(|s| s.success());
        ok.then(|| Mount(dir.to_path_buf()))
    }

    fn resize(&self, size: &str) -> bool {
        Command::new("mount")
            .args(["-o", &format!("remount,size={size}")])
            .arg(&self.0)
            .status()
            .is_ok_and(|s| s.success())
    }
}

impl Drop for Mount {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.0).status();
        let _ = std::fs::remove_dir(&self.0);
    }
}

#[test]
fn durability_enospc_on_a_real_tmpfs() {
    let dir = std::env::temp_dir().join(format!("duet-enospc-{}", std::process::id()));
    let Some(mount) = Mount::tmpfs(&dir, "256k") else {
        eprintln!("SKIPPED: cannot mount a tmpfs here (needs root / CAP_SYS_ADMIN); the simulated full-disk test still ran");
        return;
    };
    let path = mount.0.join("db");
    let opts = DurabilityOptions {
        mode: Durability::Fsync,
        segment_bytes: 64 << 10,
        background_checkpoints: false,
        ..Default::default()
    };
    let stored;
    {
        let db = Database::open_with(&path, opts.clone()).expect("open");
        let c = db.collection("c");
        c.create_index(doc! {"k": 1}, IndexOptions::default())
            .expect("index");
        let mut n = 0i64;
        let err = loop {
            match c.insert_one(doc! {"_id": n, "k": n % 7, "pad": "p".repeat(1000)}) {
                Ok(_) => n += 1,
                Err(e) => break e,
            }
            assert!(n < 100_000, "the tmpfs never filled up");
        };
        assert!(is_no_space(&err), "expected ENOSPC, got: {err}");
        assert_eq!(err.code(), 14031);
        // Readable and consistent while full; a checkpoint fails cleanly.
        assert_eq!(c.count(doc! {}).expect("count"), n as u64);
        c.check_invariants().expect("consistent");
        assert!(db.checkpoint().is_err(), "a checkpoint cannot fit either");
        assert!(mount.resize("8m"), "remount to grow the tmpfs");
        c.insert_one(doc! {"_id": -1, "k": 0})
            .expect("writes resume once space is back");
        db.checkpoint().expect("checkpoint after growing");
        stored = n as u64 + 1;
    }
    let db = Database::open_with(&path, opts).expect("reopen");
    let c = db.collection("c");
    assert_eq!(c.count(doc! {}).expect("count"), stored);
    c.check_invariants().expect("indexes equal a rebuild");
}
