//! The process's memory and `--max-memory-gb`: documents live in memory
//! (the copy-on-write state is the store), so a server that keeps taking
//! writes past what the machine has is killed by the operating system and
//! loses every connection. Past the limit, commands that add data (inserts,
//! updates, upserts, index and collection creation, `$out`/`$merge`,
//! named snapshots) fail with 146 ExceededMemoryLimit; reads, deletes and
//! drops keep working, and writes resume once memory is freed.
//!
//! Invariants:
//! - the limit is checked against the resident set size (what the kernel's
//!   out-of-memory killer weighs), sampled at most every [`SAMPLE_EVERY`]:
//!   a check costs an atomic load, not a file read, on the write path;
//! - the check runs before the command, so a refused command changed
//!   nothing; one admitted just below the limit may pass it by its own size
//!   (at most the 48 MB message limit), which is why the limit should leave
//!   headroom below the machine's memory;
//! - once refusing, the guard keeps refusing until the resident size is
//!   back under [`RESUME_AT`] of the limit, so writes do not flap on and
//!   off around it as freed buffers come and go;
//! - before refusing, free heap memory is handed back to the kernel (at
//!   most once per [`TRIM_EVERY`]) and the size sampled again: memory freed
//!   by a drop can otherwise stay resident in the allocator and keep writes
//!   refused after the data is gone. `duet` runs on mimalloc, whose free
//!   pages belong to the thread that allocated them and return to the
//!   kernel only when *that* thread collects (measured: 60 MB of dropped
//!   documents stayed resident for minutes while the blocking threads that
//!   had inserted them sat idle or served only refused commands). So a
//!   release is a request every thread answers: the binary installs its
//!   allocator's per-thread collect ([`set_allocator`]), the guard
//!   bumps [`RELEASE_EPOCH`], and each command thread runs
//!   [`release_if_asked`] after its command and each runtime worker when it
//!   parks; an idle blocking thread exits after the runtime's keep-alive,
//!   which hands its pages back too. Without an installed hook (the system
//!   allocator) glibc's process-wide `malloc_trim` is used.

use std::cell::Cell;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use crate::error::{CmdResult, CommandError};

/// Below this fraction of the limit, a refusing guard admits writes again.
pub const RESUME_AT: f64 = 0.9;

/// How old a resident-size sample may be when a write is checked.
pub const SAMPLE_EVERY: Duration = Duration::from_millis(20);

/// How often a refusing guard may ask the allocator to return free memory.
pub const TRIM_EVERY: Duration = Duration::from_secs(1);

/// The global allocator's "return this thread's free memory" call, set
/// once by the binary that chose the allocator.
static ALLOCATOR_RELEASE: OnceLock<fn()> = OnceLock::new();

/// Bumped each time the guard wants free memory back; every thread that
/// has not released since the last bump does so at its next chance.
pub static RELEASE_EPOCH: AtomicU64 = AtomicU64::new(0);

thread_local! {
    /// The last [`RELEASE_EPOCH`] this thread answered.
    static RELEASED_AT: Cell<u64> = const { Cell::new(0) };
}

/// The global allocator's name, as `buildInfo.allocator` reports it.
static ALLOCATOR_NAME: OnceLock<&'static str> = OnceLock::new();

/// Installs the global allocator's name (`buildInfo.allocator`) and its
/// per-thread release (e.g. mimalloc's `mi_collect(true)`); the first call
/// wins.
pub fn set_allocator(name: &'static str, release: fn()) {
    let _ = ALLOCATOR_NAME.set(name);
    let _ = ALLOCATOR_RELEASE.set(release);
}

/// The global allocator's name: the one installed with [`set_allocator`],
/// else `system` (the process runs on the platform's malloc).
pub fn allocator_name() -> &'static str {
    ALLOCATOR_NAME.get().copied().unwrap_or("system")
}

/// Hands this thread's free heap memory back to the kernel (or, under the
/// system allocator, the process's).
fn release_this_thread() {
    if let Some(release) = ALLOCATOR_RELEASE.get() {
        release();
        return;
    }
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim only walks the allocator's own free lists.
    unsafe {
        libc::malloc_trim(0);
    }
}

/// Answers a pending release request on this thread: called where a
/// thread has just finished work (after a command, when a runtime worker
/// parks). One atomic load when nothing was asked.
pub fn release_if_asked() {
    let epoch = RELEASE_EPOCH.load(Ordering::Relaxed);
    if epoch != 0 && RELEASED_AT.get() != epoch {
        RELEASED_AT.set(epoch);
        release_this_thread();
    }
}

/// Asks every thread for its free memory and releases this thread's now.
fn request_release() {
    RELEASE_EPOCH.fetch_add(1, Ordering::Relaxed);
    release_if_asked();
}

/// Resident and virtual memory of this process, bytes (Linux `/proc`;
/// `None` elsewhere).
pub fn process_memory() -> Option<(u64, u64)> {
    let statm = std::fs::read_to_string("/proc/self/statm").ok()?;
    let mut it = statm.split_whitespace();
    let virt: u64 = it.next()?.parse().ok()?;
    let rss: u64 = it.next()?.parse().ok()?;
    // Pages of 4 KiB on the platforms duet runs on.
    Some((rss * 4096, virt * 4096))
}

/// `--max-memory-gb` and what it refused.
pub struct MemoryGuard {
    limit: Option<u64>,
    start: Instant,
    /// Last resident size sampled, bytes, and when (ms since `start`, + 1;
    /// 0: never).
    rss: AtomicU64,
    sampled_at: AtomicU64,
    refused: AtomicU64,
    /// Refusing: past the limit, and not yet back under `RESUME_AT` of it.
    over: AtomicBool,
    /// When the allocator was last asked to trim (ms since `start`, 0 = never).
    trimmed_at: AtomicU64,
}

impl MemoryGuard {
    pub fn new(limit: Option<u64>) -> MemoryGuard {
        MemoryGuard {
            limit,
            start: Instant::now(),
            rss: AtomicU64::new(0),
            sampled_at: AtomicU64::new(0),
            refused: AtomicU64::new(0),
            over: AtomicBool::new(false),
            trimmed_at: AtomicU64::new(0),
        }
    }

    pub fn limit(&self) -> Option<u64> {
        self.limit
    }

    /// Writes refused since start.
    pub fn refused(&self) -> u64 {
        self.refused.load(Ordering::Relaxed)
    }

    /// The resident size, at most [`SAMPLE_EVERY`] old (0 when unknown).
    pub fn resident(&self) -> u64 {
        let now = self.start.elapsed().as_millis() as u64 + 1;
        let at = self.sampled_at.load(Ordering::Acquire);
        if at == 0 || now.saturating_sub(at) >= SAMPLE_EVERY.as_millis() as u64 {
            let rss = process_memory().map_or(0, |(r, _)| r);
            self.rss.store(rss, Ordering::Relaxed);
            self.sampled_at.store(now, Ordering::Release);
            return rss;
        }
        self.rss.load(Ordering::Relaxed)
    }

    /// The resident size above which a write is refused now.
    fn bar(&self, limit: u64) -> u64 {
        if self.over.load(Ordering::Relaxed) {
            (limit as f64 * RESUME_AT) as u64
        } else {
            limit
        }
    }

    /// Whether the allocator may be asked to trim now (claims the turn).
    fn trim_due(&self) -> bool {
        let now = self.start.elapsed().as_millis() as u64 + 1;
        let at = self.trimmed_at.load(Ordering::Relaxed);
        (at == 0 || now.saturating_sub(at) >= TRIM_EVERY.as_millis() as u64)
            && self
                .trimmed_at
                .compare_exchange(at, now, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
    }

    /// Whether a write is refused with `rss` resident (counted if so).
    fn refuses_at(&self, rss: u64, limit: u64) -> bool {
        let bar = self.bar(limit);
        if rss <= bar {
            self.over.store(false, Ordering::Relaxed);
            return false;
        }
        self.over.store(true, Ordering::Relaxed);
        self.refused.fetch_add(1, Ordering::Relaxed);
        true
    }

    /// Refuse command `name` (one that adds data) when the process is over
    /// the limit.
    pub fn admit(&self, name: &str) -> CmdResult<()> {
        let Some(limit) = self.limit else {
            return Ok(());
        };
        let mut rss = self.resident();
        if rss > self.bar(limit) && self.trim_due() {
            request_release();
            rss = process_memory().map_or(0, |(r, _)| r);
            self.rss.store(rss, Ordering::Relaxed);
        }
        if !self.refuses_at(rss, limit) {
            return Ok(());
        }
        let mib = |b: u64| b as f64 / (1024.0 * 1024.0);
        Err(CommandError::new(
            146,
            "ExceededMemoryLimit",
            format!(
                "{name} refused: the server holds {:.0} MiB, over --max-memory-gb ({:.0} MiB); \
                 reads, deletes and drops still work, and writes resume once memory is back \
                 under {:.0} MiB (delete documents, drop collections or named snapshots, close \
                 cursors)",
                mib(rss),
                mib(limit),
                mib(limit) * RESUME_AT
            ),
        ))
    }
}

/// Whether command `name` (`cmd`) adds data the server must hold: the
/// commands `--max-memory-gb` refuses past the limit.
pub fn adds_data(name: &str, cmd: &bson::Document) -> bool {
    match name {
        "insert" | "update" | "create" | "createIndexes" | "createSnapshot" | "applyOps" => true,
        "findAndModify" => !crate::args::flag(cmd, "remove").unwrap_or(false),
        "aggregate" => cmd.get_array("pipeline").is_ok_and(|p| {
            p.last().is_some_and(|s| {
                matches!(s, bson::Bson::Document(d) if d.contains_key("$out") || d.contains_key("$merge"))
            })
        }),
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    thread_local! {
        /// Releases the test hook ran on this thread.
        static RELEASES: Cell<u64> = const { Cell::new(0) };
    }

    #[test]
    fn a_release_request_is_answered_once_by_every_thread() {
        set_allocator("test", || RELEASES.set(RELEASES.get() + 1));
        // Other tests of this binary may bump the epoch at any time, so each
        // check holds only while the epoch did not move under it.
        let on_a_new_thread = |f: fn() -> Option<(u64, u64)>| {
            std::thread::spawn(f).join().expect("the checking thread")
        };
        // The requesting thread releases at once, and only once.
        let asked = on_a_new_thread(|| {
            request_release();
            let epoch = RELEASE_EPOCH.load(Ordering::SeqCst);
            let first = RELEASES.get();
            release_if_asked();
            (RELEASE_EPOCH.load(Ordering::SeqCst) == epoch).then(|| (first, RELEASES.get()))
        });
        if let Some((first, then)) = asked {
            assert_eq!((first, then), (1, 1));
        }
        // A thread that has not answered the request yet answers it once.
        let other = on_a_new_thread(|| {
            let epoch = RELEASE_EPOCH.load(Ordering::SeqCst);
            release_if_asked();
            let first = RELEASES.get();
            release_if_asked();
            (RELEASE_EPOCH.load(Ordering::SeqCst) == epoch).then(|| (first, RELEASES.get()))
        });
        if let Some((first, then)) = other {
            assert_eq!((first, then), (1, 1));
        }
    }

    #[test]
    fn no_limit_admits_everything() {
        assert!(MemoryGuard::new(None).admit("insert").is_ok());
    }

    #[test]
    fn over_the_limit_refuses_with_146_and_counts() {
        let g = MemoryGuard::new(Some(1));
        let e = g
            .admit("insert")
            .expect_err("a process holds more than 1 byte");
        assert_eq!(e.code, 146);
        assert!(e.message.contains("--max-memory-gb"), "{}", e.message);
        assert_eq!(g.refused(), 1);
        let roomy = MemoryGuard::new(Some(u64::MAX));
        assert!(roomy.admit("insert").is_ok());
        assert!(roomy.resident() > 0);
    }

    #[test]
    fn refusing_lasts_until_back_under_ninety_percent() {
        let g = MemoryGuard::new(Some(1000));
        assert!(!g.refuses_at(1000, 1000));
        assert!(g.refuses_at(1001, 1000));
        assert!(g.refuses_at(950, 1000), "still refusing above 90%");
        assert!(!g.refuses_at(900, 1000));
        assert!(!g.refuses_at(990, 1000), "admitting again up to the limit");
        assert_eq!(g.refused(), 2);
    }

    #[test]
    fn what_adds_data() {
        use bson::doc;
        assert!(adds_data("insert", &doc! {}));
        assert!(adds_data("findAndModify", &doc! {"update": {}}));
        assert!(!adds_data("findAndModify", &doc! {"remove": true}));
        assert!(!adds_data("delete", &doc! {}));
        assert!(!adds_data("drop", &doc! {}));
        assert!(adds_data(
            "aggregate",
            &doc! {"pipeline": [{"$match": {}}, {"$out": "x"}]}
        ));
        assert!(!adds_data(
            "aggregate",
            &doc! {"pipeline": [{"$match": {}}]}
        ));
    }
}
