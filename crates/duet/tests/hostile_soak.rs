//! A short run of `duet check hostile` in the suite: every attack of the soak
//! against a real `duet serve` process for a few seconds, then the reference
//! data, the RSS ceiling, ghost databases, a clean SIGTERM and a restart are
//! checked (the command exits non-zero on any violation). Longer runs:
//! `duet check hostile --seconds 600`.

#[test]
fn a_short_hostile_soak_passes() {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_duet"))
        .args(["check", "hostile", "--seconds", "8", "--threads", "6"])
        .args(["--rss-ceiling-mb", "1024", "--seed", "7"])
        .output()
        .expect("run duet check hostile");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "duet check hostile failed:\n{stdout}\n{stderr}"
    );
    assert!(stdout.contains("PASS"), "{stdout}");
}
