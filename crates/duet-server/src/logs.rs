//! The server's log: one line per event on standard error, as text or JSON
//! (`--log-format`), a level that `setParameter: {logLevel}` changes at
//! runtime, and a bounded ring of recent lines for `getLog`.
//!
//! Invariants:
//! - every event is one line (fields never contain a raw newline: text
//!   escapes them with `Debug`, JSON with JSON escapes);
//! - the ring holds at most [`RING_LINES`] lines (MongoDB's RamLog keeps
//!   1024); `totalLinesWritten` counts every line ever put in it;
//! - warnings logged before the server first listens are also kept, at most
//!   [`RING_LINES`] of them, as `getLog: "startupWarnings"`.

use std::collections::VecDeque;
use std::fmt::Write as _;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::OnceLock;

use parking_lot::Mutex;
use tracing::field::{Field, Visit};
use tracing::{Event, Level, Subscriber};
use tracing_subscriber::layer::{Context, SubscriberExt};
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{reload, EnvFilter, Layer, Registry};

/// Recent log lines `getLog` returns at most.
pub const RING_LINES: usize = 1024;

/// `--log-format`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    /// `2024-05-01T10:00:00.123456Z  INFO target: message key=value`
    Text,
    /// One JSON object per line (`timestamp`, `level`, `target`, `fields`).
    Json,
}

impl LogFormat {
    pub fn name(self) -> &'static str {
        match self {
            LogFormat::Text => "text",
            LogFormat::Json => "json",
        }
    }
}

/// Recent lines, as MongoDB's structured log lines (JSON strings).
#[derive(Default)]
pub struct LogRing {
    lines: Mutex<VecDeque<String>>,
    startup_warnings: Mutex<Vec<String>>,
    total: AtomicU64,
    started: AtomicBool,
}

impl LogRing {
    fn push(&self, line: String, warning: bool) {
        if warning && !self.started.load(Ordering::Relaxed) {
            let mut w = self.startup_warnings.lock();
            if w.len() < RING_LINES {
                w.push(line.clone());
            }
        }
        let mut lines = self.lines.lock();
        if lines.len() == RING_LINES {
            lines.pop_front();
        }
        lines.push_back(line);
        self.total.fetch_add(1, Ordering::Relaxed);
    }

    /// The recent lines, oldest first.
    pub fn lines(&self) -> Vec<String> {
        self.lines.lock().iter().cloned().collect()
    }

    pub fn startup_warnings(&self) -> Vec<String> {
        self.startup_warnings.lock().clone()
    }

    pub fn total(&self) -> u64 {
        self.total.load(Ordering::Relaxed)
    }
}

static RING: OnceLock<LogRing> = OnceLock::new();
static LEVEL: OnceLock<reload::Handle<EnvFilter, Registry>> = OnceLock::new();

/// The ring of recent lines (empty until [`init`]; servers embedded in
/// tests log nowhere).
pub fn ring() -> &'static LogRing {
    RING.get_or_init(LogRing::default)
}

/// From now on warnings are no longer startup warnings.
pub fn mark_started() {
    ring().started.store(true, Ordering::Relaxed);
}

/// openraft narrates every vote and heartbeat at info: warnings only,
/// unless the directive names it.
fn with_quiet_raft(level: &str) -> String {
    if level.contains("openraft") {
        level.to_string()
    } else {
        format!("{level},openraft=warn")
    }
}

/// Install the process's logger: `level` is an `EnvFilter` directive
/// (`info`, `debug`, `duet_server=debug,info`, ...).
pub fn init(level: &str, format: LogFormat) -> Result<(), String> {
    let filter = EnvFilter::try_new(with_quiet_raft(level))
        .map_err(|e| format!("--log-level {level}: {e}"))?;
    let (filter, handle) = reload::Layer::new(filter);
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let text = (format == LogFormat::Text).then(|| {
        tracing_subscriber::fmt::layer()
            .with_writer(std::io::stderr)
            .with_ansi(ansi)
    });
    let json = (format == LogFormat::Json).then(|| {
        tracing_subscriber::fmt::layer()
            .json()
            .with_writer(std::io::stderr)
            .with_current_span(false)
            .with_span_list(false)
    });
    tracing_subscriber::registry()
        .with(filter)
        .with(text)
        .with(json)
        .with(RingLayer)
        .try_init()
        .map_err(|e| format!("logging: {e}"))?;
    let _ = LEVEL.set(handle);
    let _ = ring();
    Ok(())
}

/// The filter directive for MongoDB's `logLevel` (0 = info, 1 = debug,
/// 2 and more = trace).
pub fn directive_for(level: i64) -> &'static str {
    match level {
        i64::MIN..=0 => "info",
        1 => "debug",
        _ => "trace",
    }
}

/// Change the level at runtime; false when no logger was installed by [`init`].
pub fn set_level(directive: &str) -> Result<bool, String> {
    let Some(handle) = LEVEL.get() else {
        return Ok(false);
    };
    let filter = EnvFilter::try_new(with_quiet_raft(directive)).map_err(|e| e.to_string())?;
    handle.reload(filter).map_err(|e| e.to_string())?;
    Ok(true)
}

/// The current level directive (`None` without [`init`]).
pub fn level() -> Option<String> {
    LEVEL.get()?.with_current(|f| f.to_string()).ok()
}

/// Puts each event, as a MongoDB-style JSON line, into the ring.
struct RingLayer;

#[derive(Default)]
struct Fields {
    msg: String,
    attr: serde_json::Map<String, serde_json::Value>,
}

impl Visit for Fields {
    fn record_str(&mut self, field: &Field, value: &str) {
        if field.name() == "message" {
            self.msg = value.to_string();
        } else {
            self.attr
                .insert(field.name().to_string(), serde_json::Value::from(value));
        }
    }

    fn record_i64(&mut self, field: &Field, value: i64) {
        self.attr
            .insert(field.name().to_string(), serde_json::Value::from(value));
    }

    fn record_u64(&mut self, field: &Field, value: u64) {
        self.attr
            .insert(field.name().to_string(), serde_json::Value::from(value));
    }

    fn record_bool(&mut self, field: &Field, value: bool) {
        self.attr
            .insert(field.name().to_string(), serde_json::Value::from(value));
    }

    fn record_f64(&mut self, field: &Field, value: f64) {
        self.attr
            .insert(field.name().to_string(), serde_json::Value::from(value));
    }

    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        let mut s = String::new();
        let _ = write!(s, "{value:?}");
        if field.name() == "message" {
            self.msg = s;
        } else {
            self.attr
                .insert(field.name().to_string(), serde_json::Value::from(s));
        }
    }
}

/// MongoDB's severity letters.
fn severity(level: &Level) -> &'static str {
    match *level {
        Level::ERROR => "E",
        Level::WARN => "W",
        Level::INFO => "I",
        _ => "D1",
    }
}

impl<S: Subscriber> Layer<S> for RingLayer {
    fn on_event(&self, event: &Event<'_>, _ctx: Context<'_, S>) {
        let mut fields = Fields::default();
        event.record(&mut fields);
        let meta = event.metadata();
        let date = bson::DateTime::now()
            .try_to_rfc3339_string()
            .unwrap_or_default();
        let line = serde_json::json!({
            "t": {"$date": date},
            "s": severity(meta.level()),
            "c": meta.target(),
            "msg": fields.msg,
            "attr": fields.attr,
        });
        ring().push(line.to_string(), *meta.level() <= Level::WARN);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_ring_is_bounded_and_keeps_startup_warnings() {
        let r = LogRing::default();
        r.push("w0".into(), true);
        for i in 0..RING_LINES + 10 {
            r.push(format!("l{i}"), false);
        }
        r.started.store(true, Ordering::Relaxed);
        r.push("late warning".into(), true);
        assert_eq!(r.lines().len(), RING_LINES);
        assert_eq!(r.total(), RING_LINES as u64 + 12);
        assert_eq!(r.lines().last().map(String::as_str), Some("late warning"));
        assert_eq!(r.startup_warnings(), vec!["w0".to_string()]);
    }

    #[test]
    fn mongodb_log_levels_map_to_directives() {
        assert_eq!(directive_for(0), "info");
        assert_eq!(directive_for(1), "debug");
        assert_eq!(directive_for(5), "trace");
    }
}
