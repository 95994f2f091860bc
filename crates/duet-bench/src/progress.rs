//! Live progress: an indicatif bar over the run's duration (or operation
//! count) with the current throughput, polled from a shared op counter.
//! Hidden when stderr is not a terminal or `--quiet` is given.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

pub struct Progress {
    bar: ProgressBar,
    started: Instant,
    last: (Instant, u64),
}

impl Progress {
    /// A bar of `total` units (tenths of a second for timed phases).
    pub fn new(label: &str, total: u64, quiet: bool) -> Progress {
        let bar = ProgressBar::with_draw_target(
            Some(total.max(1)),
            if quiet {
                ProgressDrawTarget::hidden()
            } else {
                ProgressDrawTarget::stderr()
            },
        );
        bar.set_style(
            ProgressStyle::with_template("{prefix:>28} [{bar:30}] {elapsed_precise} {msg}")
                .unwrap_or_else(|_| ProgressStyle::default_bar())
                .progress_chars("=> "),
        );
        bar.set_prefix(label.to_string());
        let now = Instant::now();
        Progress {
            bar,
            started: now,
            last: (now, 0),
        }
    }

    /// Update position and the throughput message from the op counter.
    pub fn update(&mut self, position: u64, ops_done: u64, what: &str) {
        let now = Instant::now();
        let dt = now.duration_since(self.last.0).as_secs_f64();
        if dt >= 0.25 {
            let rate = (ops_done.saturating_sub(self.last.1)) as f64 / dt;
            self.bar
                .set_message(format!("{} {what}/s, {ops_done} {what}", human(rate)));
            self.last = (now, ops_done);
        }
        self.bar.set_position(position);
    }

    pub fn finish(&self) {
        self.bar.finish_and_clear();
    }

    pub fn elapsed(&self) -> Duration {
        self.started.elapsed()
    }
}

/// Print a line without tearing an active bar (plain eprintln when quiet).
pub fn note(quiet: bool, line: &str) {
    if !quiet {
        eprintln!("{line}");
    }
}

/// 1234567.0 → "1.23M".
pub fn human(x: f64) -> String {
    if x >= 1e6 {
        format!("{:.2}M", x / 1e6)
    } else if x >= 1e3 {
        format!("{:.1}k", x / 1e3)
    } else {
        format!("{x:.0}")
    }
}

/// Drive a bar while `work` threads run: polls `ops` until `done`
/// is set (by the caller's threads) and returns when it is.
pub fn watch(
    label: &str,
    seconds: f64,
    ops_limit: Option<u64>,
    ops: &AtomicU64,
    done: &std::sync::atomic::AtomicBool,
    quiet: bool,
    what: &str,
) {
    drive(label, seconds, ops_limit, ops, quiet, what, || {
        !done.load(Ordering::Acquire)
    });
}

/// Drive a bar over a timed phase of `seconds` while `running()` holds
/// (e.g. until the deadline, or until the last long query has ended).
pub fn watch_while(
    label: &str,
    seconds: f64,
    ops: &AtomicU64,
    quiet: bool,
    what: &str,
    running: impl Fn() -> bool,
) {
    drive(label, seconds, None, ops, quiet, what, running);
}

fn drive(
    label: &str,
    seconds: f64,
    ops_limit: Option<u64>,
    ops: &AtomicU64,
    quiet: bool,
    what: &str,
    running: impl Fn() -> bool,
) {
    let total = match ops_limit {
        Some(n) => n,
        None => (seconds * 10.0).ceil() as u64,
    };
    let mut p = Progress::new(label, total, quiet);
    // A short poll: the caller joins its threads when this returns, and a
    // timed phase's wall time is taken after that.
    while running() {
        std::thread::sleep(Duration::from_millis(25));
        let n = ops.load(Ordering::Relaxed);
        let pos = match ops_limit {
            Some(_) => n,
            None => (p.elapsed().as_secs_f64() * 10.0) as u64,
        };
        p.update(pos.min(total), n, what);
    }
    p.finish();
}
