//! Facts about the machine and the build recorded with every result (cores,
//! memory, load, kernel, CPU, git commit), and the process's resident memory.

use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Serialize, Deserialize, Default)]
pub struct Machine {
    pub cores: usize,
    pub cpu_model: String,
    pub memory_mb_total: u64,
    pub memory_mb_available: u64,
    /// 1-minute load average when the run started: above `cores`, others were busy.
    pub loadavg_1m_start: f64,
    pub kernel: String,
    /// `git rev-parse HEAD` of the working directory, "unknown" outside git.
    pub commit: String,
    /// Uncommitted changes in the tree when the run started.
    pub commit_dirty: bool,
    pub build_profile: String,
}

fn read(path: &str) -> String {
    std::fs::read_to_string(path).unwrap_or_default()
}

fn meminfo_mb(field: &str) -> u64 {
    read("/proc/meminfo")
        .lines()
        .find(|l| l.starts_with(field))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|kb| kb.parse::<u64>().ok())
        .map_or(0, |kb| kb / 1024)
}

/// The 1-minute load average, 0 when unknown.
pub fn loadavg_1m() -> f64 {
    read("/proc/loadavg")
        .split_whitespace()
        .next()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0.0)
}

fn git(args: &[&str]) -> Option<String> {
    let out = std::process::Command::new("git").args(args).output().ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).trim().to_string())
}

pub fn collect() -> Machine {
    Machine {
        cores: std::thread::available_parallelism().map_or(1, |n| n.get()),
        cpu_model: read("/proc/cpuinfo")
            .lines()
            .find(|l| l.starts_with("model name"))
            .and_then(|l| l.split(':').nth(1))
            .map_or_else(|| "unknown".into(), |s| s.trim().to_string()),
        memory_mb_total: meminfo_mb("MemTotal:"),
        memory_mb_available: meminfo_mb("MemAvailable:"),
        loadavg_1m_start: loadavg_1m(),
        kernel: read("/proc/sys/kernel/osrelease").trim().to_string(),
        commit: git(&["rev-parse", "HEAD"]).unwrap_or_else(|| "unknown".into()),
        commit_dirty: git(&["status", "--porcelain", "--untracked-files=no"])
            .is_some_and(|s| !s.is_empty()),
        build_profile: if cfg!(debug_assertions) {
            "debug".into()
        } else {
            "release".into()
        },
    }
}

/// Resident set size of this process in bytes (`/proc/self/statm`), if known.
pub fn rss_bytes() -> Option<u64> {
    let statm = read("/proc/self/statm");
    let pages: u64 = statm.split_whitespace().nth(1)?.parse().ok()?;
    // SAFETY: sysconf has no preconditions; it only reads a system constant.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    u64::try_from(page).ok().map(|p| pages * p)
}

/// Resident set size in MiB (0 when unknown).
pub fn rss_mb() -> f64 {
    rss_bytes().map_or(0.0, |b| b as f64 / (1024.0 * 1024.0))
}
