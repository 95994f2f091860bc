//! Progress bars for long CLI work (`duet import`, `backup`, `restore`):
//! indicatif bars with rate and ETA on standard error, drawn only when
//! standard error is a terminal, so scripts, pipes and tests see nothing
//! (the bars are hidden, every call on them is a no-op).

use std::io::IsTerminal;

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

fn shown() -> bool {
    std::io::stderr().is_terminal()
}

/// A bar of `len` units (`bytes`: shown as sizes) labelled `what`.
pub fn bar(len: u64, what: &str, bytes: bool) -> ProgressBar {
    if !shown() {
        return ProgressBar::hidden();
    }
    let template = if bytes {
        "{msg} [{bar:40}] {bytes}/{total_bytes} {bytes_per_sec} ETA {eta}"
    } else {
        "{msg} [{bar:40}] {pos}/{len} {per_sec} ETA {eta}"
    };
    let pb = ProgressBar::with_draw_target(Some(len), ProgressDrawTarget::stderr());
    if let Ok(style) = ProgressStyle::with_template(template) {
        pb.set_style(style.progress_chars("=> "));
    }
    pb.set_message(what.to_string());
    pb
}

/// A spinner with elapsed time for work of unknown length.
pub fn spinner(what: &str) -> ProgressBar {
    if !shown() {
        return ProgressBar::hidden();
    }
    let pb = ProgressBar::with_draw_target(None, ProgressDrawTarget::stderr());
    if let Ok(style) = ProgressStyle::with_template("{spinner} {msg} {elapsed}") {
        pb.set_style(style);
    }
    pb.set_message(what.to_string());
    pb.enable_steady_tick(std::time::Duration::from_millis(100));
    pb
}
