//! Prometheus metrics (`--metrics-addr`): per-command counters and latency
//! histograms recorded as commands finish ([`CommandMetrics`]), and
//! everything else read from the server and engine at scrape time
//! ([`render`]), served as OpenMetrics text on `GET /metrics` by a small
//! HTTP/1.1 responder ([`serve`]).
//!
//! Invariants:
//! - recording a command costs two map lookups under a read lock; label
//!   values are canonical command names only (at most `COMMANDS.len()`
//!   series), never client-chosen strings;
//! - a scrape reads counters the engine keeps anyway, except the bytes named
//!   snapshots retain (`listSnapshots`' walk: O(nodes of the latest version)
//!   per named snapshot);
//! - the endpoint has no authentication: it binds to loopback unless told
//!   otherwise, and reads nothing but figures (no names of users, no data);
//! - a scrape request is at most [`MAX_REQUEST_BYTES`] and must arrive
//!   within [`REQUEST_TIMEOUT`]; at most [`MAX_SCRAPES_IN_FLIGHT`] are
//!   served at once (more are closed at once).

use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::{ConstCounter, Counter};
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;
use tokio::sync::Semaphore;

use crate::state::ServerState;

/// Largest scrape request head read.
pub const MAX_REQUEST_BYTES: usize = 8 * 1024;
/// A scrape request must arrive within this.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);
/// Scrapes served at once.
pub const MAX_SCRAPES_IN_FLIGHT: usize = 8;

type Labels = Vec<(&'static str, String)>;
/// One family read at scrape time: name, help, counter (else gauge), samples.
type FamilyValues = (&'static str, &'static str, bool, Vec<(Labels, f64)>);

fn new_histogram() -> Histogram {
    // 50 µs … ~26 s, doubling.
    Histogram::new(exponential_buckets(0.000_05, 2.0, 20))
}

/// Per-command figures, recorded by the connection as each command ends.
#[derive(Clone)]
pub struct CommandMetrics {
    commands: Family<Labels, Counter>,
    failures: Family<Labels, Counter>,
    latency: Family<Labels, Histogram, fn() -> Histogram>,
}

impl Default for CommandMetrics {
    fn default() -> CommandMetrics {
        CommandMetrics {
            commands: Family::default(),
            failures: Family::default(),
            latency: Family::new_with_constructor(new_histogram),
        }
    }
}

impl CommandMetrics {
    /// Count one command (its canonical name; unknown names as `unknown`).
    pub fn record(&self, name: &str, seconds: f64, ok: bool) {
        let name = crate::commands::canonical_name(name).unwrap_or("unknown");
        let labels = vec![("command", name.to_string())];
        self.commands.get_or_create(&labels).inc();
        if !ok {
            self.failures.get_or_create(&labels).inc();
        }
        self.latency.get_or_create(&labels).observe(seconds);
    }
}

/// Reads the server's and engine's figures at each scrape.
struct Figures(Arc<ServerState>);

impl std::fmt::Debug for Figures {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Figures")
    }
}

/// One metric family of constant values.
struct Out<'e, 'a> {
    enc: &'e mut DescriptorEncoder<'a>,
}

impl Out<'_, '_> {
    fn gauge(&mut self, name: &str, help: &str, values: &[(Labels, f64)]) -> std::fmt::Result {
        let mut fam =
            self.enc
                .encode_descriptor(name, help, None, ConstGauge::new(0.0).metric_type())?;
        for (labels, v) in values {
            ConstGauge::new(*v).encode(fam.encode_family(labels)?)?;
        }
        Ok(())
    }

    fn counter(&mut self, name: &str, help: &str, values: &[(Labels, f64)]) -> std::fmt::Result {
        let mut fam =
            self.enc
                .encode_descriptor(name, help, None, ConstCounter::new(0.0).metric_type())?;
        for (labels, v) in values {
            ConstCounter::new(*v).encode(fam.encode_family(labels)?)?;
        }
        Ok(())
    }
}

impl prometheus_client::collector::Collector for Figures {
    fn encode(&self, mut enc: DescriptorEncoder) -> std::fmt::Result {
        let s = &self.0;
        let mut o = Out { enc: &mut enc };
        let none: Labels = Vec::new();
        let one = |v: f64| vec![(none.clone(), v)];
        o.gauge(
            "duet_uptime_seconds",
            "Seconds since the server started",
            &one(s.started.elapsed().as_secs_f64()),
        )?;
        o.gauge(
            "duet_connections_current",
            "Connections served now",
            &one(s.connections_current.load(Ordering::Relaxed) as f64),
        )?;
        o.counter(
            "duet_connections_accepted",
            "Connections accepted since start",
            &one(s.connections_total.load(Ordering::Relaxed) as f64),
        )?;
        o.counter(
            "duet_connections_refused",
            "Connections refused over --max-connections",
            &one(s.connections_refused.load(Ordering::Relaxed) as f64),
        )?;
        o.gauge(
            "duet_cursors_open",
            "Open server-side cursors",
            &one(s.cursors.len() as f64),
        )?;
        o.gauge(
            "duet_cursors_held_bytes",
            "Bytes held by open cursors",
            &one(s.cursors.held_bytes() as f64),
        )?;
        o.gauge(
            "duet_operations_in_flight",
            "Commands running now",
            &one(s.operations.len() as f64),
        )?;
        o.gauge(
            "duet_snapshots_held",
            "Snapshots held for readConcern atClusterTime",
            &one(s.snapshots.len() as f64),
        )?;
        o.gauge(
            "duet_fsync_lock_count",
            "fsync locks held (writes wait while above 0)",
            &one(f64::from(s.fsync.count())),
        )?;
        o.gauge(
            "duet_incomplete_message_bytes",
            "Bytes held by messages still arriving",
            &one(s.incomplete.used() as f64),
        )?;
        if let Some((rss, virt)) = crate::memory::process_memory() {
            o.gauge(
                "duet_process_resident_memory_bytes",
                "Resident memory",
                &one(rss as f64),
            )?;
            o.gauge(
                "duet_process_virtual_memory_bytes",
                "Virtual memory",
                &one(virt as f64),
            )?;
        }
        o.gauge(
            "duet_open_data_files",
            "Data-file descriptors open (--max-open-files)",
            &one(duetdb::storage::open_files() as f64),
        )?;
        let spill = duetdb::spill_stats();
        o.counter(
            "duet_spill_runs",
            "Sorted runs spilled to disk",
            &one(spill.runs as f64),
        )?;
        o.counter(
            "duet_spill_bytes",
            "Bytes spilled to disk by sorts",
            &one(spill.bytes as f64),
        )?;

        // Per database.
        let mut reads = duetdb::ReadStats::default();
        let mut per: Vec<FamilyValues> = Vec::new();
        let mut push =
            |name: &'static str, help: &'static str, counter: bool, l: Labels, v: f64| match per
                .iter_mut()
                .find(|(n, ..)| *n == name)
            {
                Some(e) => e.3.push((l, v)),
                None => per.push((name, help, counter, vec![(l, v)])),
            };
        for (name, db) in s.engine.list_databases() {
            let l: Labels = vec![("db", name.clone())];
            let r = db.read_stats();
            reads.none += r.none;
            reads.vls += r.vls;
            reads.cow += r.cow;
            reads.olcp += r.olcp;
            let st = db.stats();
            push(
                "duet_documents",
                "Documents stored",
                false,
                l.clone(),
                st.objects as f64,
            );
            push(
                "duet_data_bytes",
                "Bytes of stored documents",
                false,
                l.clone(),
                st.data_bytes as f64,
            );
            push(
                "duet_collections",
                "Collections",
                false,
                l.clone(),
                st.collections as f64,
            );
            let w = db.writer_stats();
            push(
                "duet_writer_queue_length",
                "Commands waiting for the writer",
                false,
                l.clone(),
                w.queue_len as f64,
            );
            push(
                "duet_writer_groups",
                "Commit groups applied",
                true,
                l.clone(),
                w.groups as f64,
            );
            push(
                "duet_writer_commands",
                "Commands applied by the writer",
                true,
                l.clone(),
                w.commands as f64,
            );
            push(
                "duet_writer_largest_group",
                "Largest commit group so far (commands)",
                false,
                l.clone(),
                w.largest_group as f64,
            );
            let v = db.vls_stats();
            push(
                "duet_vls_scans_active",
                "VLS scans running",
                false,
                l.clone(),
                v.scans_active as f64,
            );
            push(
                "duet_vls_scans_queued",
                "VLS scans waiting for a slot",
                false,
                l.clone(),
                v.scans_queued as f64,
            );
            push(
                "duet_remset_entries",
                "Old versions kept for VLS scans in flight",
                false,
                l.clone(),
                v.remset.entries as f64,
            );
            push(
                "duet_remset_bytes",
                "Bytes of old versions kept for VLS scans",
                false,
                l.clone(),
                v.remset.bytes as f64,
            );
            push(
                "duet_olcp_propagated",
                "Versions handed to OLCP queries",
                true,
                l.clone(),
                v.olcp_propagated as f64,
            );
            push(
                "duet_olcp_inflight",
                "Versions held for running OLCP queries",
                false,
                l.clone(),
                v.olcp_inflight as f64,
            );
            let snaps = db.list_snapshots();
            let retained: u64 = snaps.iter().map(|i| i.retained.bytes).sum();
            push(
                "duet_named_snapshots",
                "Named snapshots held",
                false,
                l.clone(),
                snaps.len() as f64,
            );
            push(
                "duet_named_snapshots_retained_bytes",
                "Bytes named snapshots keep alive beyond the latest version",
                false,
                l.clone(),
                retained as f64,
            );
            if let Some(wal) = db.wal_stats() {
                push(
                    "duet_wal_records",
                    "WAL records written",
                    true,
                    l.clone(),
                    wal.records as f64,
                );
                push(
                    "duet_wal_bytes",
                    "WAL bytes written",
                    true,
                    l.clone(),
                    wal.bytes as f64,
                );
                push(
                    "duet_wal_fsyncs",
                    "WAL fsyncs",
                    true,
                    l.clone(),
                    wal.fsyncs as f64,
                );
                push(
                    "duet_wal_fsync_seconds",
                    "Seconds spent in WAL fsyncs",
                    true,
                    l.clone(),
                    wal.fsync_micros_total as f64 / 1e6,
                );
                push(
                    "duet_wal_bytes_since_checkpoint",
                    "WAL bytes a checkpoint has not covered yet",
                    false,
                    l.clone(),
                    wal.bytes_since_checkpoint as f64,
                );
            }
            if let Some(c) = db.checkpoint_stats() {
                push(
                    "duet_checkpoints",
                    "Checkpoints installed",
                    true,
                    l.clone(),
                    c.checkpoints as f64,
                );
                push(
                    "duet_checkpoint_seconds",
                    "Seconds spent writing checkpoints",
                    true,
                    l.clone(),
                    c.micros_total as f64 / 1e6,
                );
                push(
                    "duet_checkpoint_last_seconds",
                    "Duration of the last checkpoint",
                    false,
                    l.clone(),
                    c.last_micros as f64 / 1e6,
                );
                push(
                    "duet_checkpoint_last_bytes",
                    "Size of the last checkpoint",
                    false,
                    l.clone(),
                    c.last_bytes as f64,
                );
            }
        }
        for (name, help, counter, values) in &per {
            if *counter {
                o.counter(name, help, values)?;
            } else {
                o.gauge(name, help, values)?;
            }
        }
        let by = |s: &str, n: u64| (vec![("strategy", s.to_string())], n as f64);
        o.counter(
            "duet_reads",
            "Live reads by the snapshot strategy that ran",
            &[
                by("none", reads.none),
                by("vls", reads.vls),
                by("cow", reads.cow),
                by("olcp", reads.olcp),
            ],
        )?;
        let ttl = s.ttl.counters();
        o.counter(
            "duet_ttl_deleted_documents",
            "Documents the TTL monitor deleted",
            &one(ttl.deleted_documents as f64),
        )?;
        Ok(())
    }
}

/// The metrics as OpenMetrics text (what `GET /metrics` returns).
pub fn render(state: &Arc<ServerState>) -> String {
    let mut registry = Registry::default();
    let m = &state.metrics;
    registry.register(
        "duet_commands",
        "Commands run, by canonical name",
        m.commands.clone(),
    );
    registry.register(
        "duet_command_failures",
        "Commands that answered ok: 0",
        m.failures.clone(),
    );
    registry.register(
        "duet_command_duration_seconds",
        "Command latency from dispatch to reply",
        m.latency.clone(),
    );
    registry.register_collector(Box::new(Figures(state.clone())));
    let mut out = String::new();
    if prometheus_client::encoding::text::encode(&mut out, &registry).is_err() {
        out = "# EOF\n".into();
    }
    out
}

/// Bind the metrics endpoint.
pub async fn bind(addr: &str) -> std::io::Result<TcpListener> {
    TcpListener::bind(addr).await
}

/// Serve `GET /metrics` on `listener` until `stop` is notified.
pub async fn serve(
    listener: TcpListener,
    state: std::sync::Weak<ServerState>,
    mut stop: tokio::sync::watch::Receiver<bool>,
) {
    let slots = Arc::new(Semaphore::new(MAX_SCRAPES_IN_FLIGHT));
    loop {
        let (stream, peer) = tokio::select! {
            r = listener.accept() => match r {
                Ok(x) => x,
                Err(e) => {
                    tracing::debug!(error = %e, "metrics: accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            _ = stop.changed() => return,
        };
        let Ok(permit) = slots.clone().try_acquire_owned() else {
            continue;
        };
        let state = state.clone();
        tokio::spawn(async move {
            if let Err(e) = answer(stream, peer, state).await {
                tracing::debug!(peer = %peer, error = %e, "metrics: scrape failed");
            }
            drop(permit);
        });
    }
}

async fn answer(
    mut stream: tokio::net::TcpStream,
    _peer: SocketAddr,
    state: std::sync::Weak<ServerState>,
) -> std::io::Result<()> {
    let mut head = Vec::with_capacity(1024);
    let mut buf = [0u8; 1024];
    let read = async {
        while !head.windows(4).any(|w| w == b"\r\n\r\n") && head.len() < MAX_REQUEST_BYTES {
            let n = stream.read(&mut buf).await?;
            if n == 0 {
                break;
            }
            head.extend_from_slice(&buf[..n]);
        }
        Ok::<_, std::io::Error>(())
    };
    if tokio::time::timeout(REQUEST_TIMEOUT, read).await.is_err() {
        return Ok(());
    }
    let line = head.split(|b| *b == b'\n').next().unwrap_or_default();
    let line = String::from_utf8_lossy(line);
    let mut parts = line.split_whitespace();
    let (method, path) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""));
    let (status, ctype, body) = match (method, path.split('?').next().unwrap_or("")) {
        ("GET", "/metrics") => match state.upgrade() {
            Some(st) => {
                let body = tokio::task::spawn_blocking(move || render(&st))
                    .await
                    .unwrap_or_default();
                (
                    "200 OK",
                    "application/openmetrics-text; version=1.0.0; charset=utf-8",
                    body,
                )
            }
            None => ("503 Service Unavailable", "text/plain", "stopping\n".into()),
        },
        ("GET", _) => ("404 Not Found", "text/plain", "try /metrics\n".into()),
        _ => (
            "405 Method Not Allowed",
            "text/plain",
            "GET /metrics\n".into(),
        ),
    };
    let reply = format!(
        "HTTP/1.1 {status}\r\nContent-Type: {ctype}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    stream.write_all(reply.as_bytes()).await?;
    stream.shutdown().await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn render_is_parseable_and_names_the_figures() {
        let state = ServerState::new(duetdb::Engine::in_memory(), crate::state::Config::default());
        state.metrics.record("find", 0.002, true);
        state.metrics.record("insert", 0.001, false);
        state.metrics.record("noSuchCommand", 0.001, false);
        state
            .engine
            .database("m")
            .expect("db")
            .collection("c")
            .insert_one(bson::doc! {"a": 1})
            .expect("insert");
        let text = render(&state);
        assert!(text.ends_with("# EOF\n"), "{text}");
        for line in text.lines().filter(|l| !l.starts_with('#')) {
            let (series, value) = line.rsplit_once(' ').expect("a sample line");
            assert!(value.parse::<f64>().is_ok(), "{line}");
            assert!(series.starts_with("duet_"), "{line}");
        }
        for needle in [
            "duet_commands_total{command=\"find\"} 1",
            "duet_command_failures_total{command=\"insert\"} 1",
            "duet_commands_total{command=\"unknown\"} 1",
            "duet_command_duration_seconds_bucket{",
            "duet_documents{db=\"m\"} 1",
            "duet_writer_groups_total{db=\"m\"}",
            "duet_reads_total{strategy=\"vls\"}",
            "duet_connections_current ",
        ] {
            assert!(text.contains(needle), "{needle} missing:\n{text}");
        }
    }

    /// Every metric the Grafana dashboard (ops/grafana/duet.json) queries is
    /// one the server exports (for a durable database with a checkpoint).
    #[test]
    fn the_dashboard_queries_exported_metrics() {
        let dir = std::env::temp_dir().join(format!("duet-metrics-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let engine = duetdb::Engine::open(&dir).expect("engine");
        let state = ServerState::new(engine, crate::state::Config::default());
        state.metrics.record("find", 0.001, false);
        let db = state.engine.database("m").expect("db");
        db.collection("c")
            .insert_one(bson::doc! {"a": 1})
            .expect("insert");
        db.checkpoint().expect("checkpoint");
        let text = render(&state);
        let dashboard = include_str!("../../../ops/grafana/duet.json");
        let _: serde_json::Value = serde_json::from_str(dashboard).expect("valid JSON");
        let mut names: Vec<&str> = Vec::new();
        let bytes = dashboard.as_bytes();
        let mut i = 0;
        while let Some(at) = dashboard[i..].find("duet_") {
            let start = i + at;
            let mut end = start;
            while end < bytes.len() && (bytes[end].is_ascii_alphanumeric() || bytes[end] == b'_') {
                end += 1;
            }
            names.push(&dashboard[start..end]);
            i = end;
        }
        assert!(names.len() > 20);
        for name in names {
            let exported = text.lines().any(|l| {
                !l.starts_with('#')
                    && (l.starts_with(&format!("{name}{{")) || l.starts_with(&format!("{name} ")))
            });
            assert!(
                exported,
                "the dashboard queries {name}, which is not exported:\n{text}"
            );
        }
        drop(state);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
