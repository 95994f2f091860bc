//! The `duet` binary end to end: demo, import, find, count, stats, and errors.

use std::io::Write;
use std::process::Command;

fn duet(args: &[&str]) -> (bool, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_duet"))
        .args(args)
        .output()
        .expect("run duet");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn people_file() -> tempfile_path::Path {
    tempfile_path::Path::new(
        "{\"name\":\"ada\",\"age\":36}\n{\"name\":\"bob\",\"age\":25}\n\n{\"name\":\"cy\",\"age\":41,\"born\":{\"$date\":\"1980-01-01T00:00:00Z\"}}\n",
    )
}

/// A file in the target directory that is removed on drop.
mod tempfile_path {
    use std::path::PathBuf;
    pub struct Path(pub PathBuf);
    impl Path {
        pub fn new(content: &str) -> Path {
            let dir = std::env::temp_dir();
            let p = dir.join(format!(
                "duet-cli-{}-{}.jsonl",
                std::process::id(),
                rand_suffix()
            ));
            std::fs::write(&p, content).expect("write temp file");
            Path(p)
        }
        pub fn as_str(&self) -> &str {
            self.0.to_str().expect("utf-8 path")
        }
    }
    impl Drop for Path {
        fn drop(&mut self) {
            let _ = std::fs::remove_file(&self.0);
        }
    }
    fn rand_suffix() -> u128 {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0)
    }
}

#[test]
fn demo_runs_and_shows_the_snapshot() {
    let (ok, out, err) = duet(&["demo", "--docs", "2000"]);
    assert!(ok, "demo failed: {err}");
    assert!(out.contains("snapshot at csn"), "{out}");
    assert!(out.contains("live state sees 0"), "{out}");
}

#[test]
fn import_find_count_stats() {
    let f = people_file();
    let (ok, out, err) = duet(&["import", "-c", "people", f.as_str()]);
    assert!(ok, "{err}");
    assert!(out.contains("imported 3 documents"), "{out}");

    let (ok, out, err) = duet(&[
        "find",
        "-c",
        "people",
        "--load",
        f.as_str(),
        "--filter",
        r#"{"age": {"$gt": 30}}"#,
        "--sort",
        r#"{"age": -1}"#,
        "--projection",
        r#"{"_id": 0, "name": 1}"#,
    ]);
    assert!(ok, "{err}");
    assert_eq!(out, "{\"name\":\"cy\"}\n{\"name\":\"ada\"}\n");

    let (ok, out, _) = duet(&[
        "count",
        "-c",
        "people",
        "--load",
        f.as_str(),
        "--filter",
        r#"{"age": 25}"#,
    ]);
    assert!(ok);
    assert_eq!(out.trim(), "1");

    let (ok, out, _) = duet(&["stats", "-c", "people", "--load", f.as_str()]);
    assert!(ok);
    assert!(out.contains("count: 3"), "{out}");
}

#[test]
fn errors_are_clear_and_exit_nonzero() {
    let f = people_file();
    let (ok, _, err) = duet(&[
        "find",
        "-c",
        "people",
        "--load",
        f.as_str(),
        "--filter",
        r#"{"age": {"$bad": 1}}"#,
    ]);
    assert!(!ok);
    assert!(err.contains("unknown operator: $bad"), "{err}");
    let (ok, _, err) = duet(&["find", "--filter", "{not json"]);
    assert!(!ok);
    assert!(err.contains("not valid JSON"), "{err}");
    let (ok, _, err) = duet(&["import", "/nonexistent/file.jsonl"]);
    assert!(!ok);
    assert!(err.contains("cannot open"), "{err}");
    let mut bad = std::env::temp_dir().join(format!("duet-cli-bad-{}.jsonl", std::process::id()));
    bad.set_extension("jsonl");
    std::fs::File::create(&bad)
        .and_then(|mut w| w.write_all(b"{\"_id\":1}\n{\"_id\":1}\n"))
        .expect("write");
    let (ok, _, err) = duet(&["import", bad.to_str().expect("path")]);
    let _ = std::fs::remove_file(&bad);
    assert!(!ok);
    assert!(err.contains("E11000"), "{err}");
}

#[test]
fn data_dir_persists_across_commands_and_checkpoints() {
    let dir = std::env::temp_dir().join(format!("duet-cli-dd-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let d = dir.to_str().expect("path");
    let file = people_file();
    let (ok, out, err) = duet(&["import", "--data-dir", d, "-c", "people", file.as_str()]);
    assert!(ok, "{err}");
    assert!(out.contains("persisted in"), "{out}");
    // A later command sees the data without --load.
    let (ok, out, err) = duet(&["count", "--data-dir", d, "-c", "people"]);
    assert!(ok, "{err}");
    assert_eq!(out.trim(), "3");
    let (ok, out, err) = duet(&["checkpoint", "--data-dir", d]);
    assert!(ok, "{err}");
    assert!(out.contains("checkpoint at csn"), "{out}");
    let (ok, out, err) = duet(&[
        "count",
        "--data-dir",
        d,
        "-c",
        "people",
        "--filter",
        "{\"age\": {\"$gt\": 30}}",
    ]);
    let _ = std::fs::remove_dir_all(&dir);
    assert!(ok, "{err}");
    assert_eq!(out.trim(), "2");
}

#[test]
fn check_crash_runs_a_short_campaign() {
    let (ok, out, err) = duet(&["check", "crash", "--seconds", "3", "--seed", "3"]);
    assert!(ok, "{out}{err}");
    assert!(out.contains("0 losses"), "{out}");
}
