//! `duet bench …`: the command-line surface of the harness (clap), shared by
//! the `duet` binary. Each workload command runs, prints its Markdown table and
//! writes `<out>/<workload>[-tag].json` + `.md`; `report` turns a results
//! directory into BENCHMARKS.md sections and PNG charts.

use std::path::{Path, PathBuf};

use anyhow::{bail, Result};
use clap::{Args, Subcommand};

use crate::gen::Distribution;
use crate::peers::{self, Connect, TargetName};
use crate::result::{BenchResult, Sink, Started};
use crate::targets::{capable, Embedded, Strategy, Target};
use crate::workload::{changes, htap, snapshot, space, tpcch, ycsb, ycsbt};

#[derive(Subcommand, Debug)]
pub enum BenchCommand {
    /// YCSB core workloads A–F.
    Ycsb(YcsbArgs),
    /// Update stream beside K concurrent analytic scans (VLS paper set-up).
    Htap(HtapArgs),
    /// Snapshot creation vs fork() vs deep copy; copy-on-write costs (AnKer Table 1).
    Snapshot(SnapshotArgs),
    /// Old versions over time under a 100 %-update stream with long queries:
    /// olcp vs vls vs held snapshots (Steam-like) vs an SI model (KVell+ Fig. 4).
    Space(SpaceArgs),
    /// YCSB-T (KVell+): transactions of 16 read-modify-writes, alone and beside
    /// K concurrent analytic scans per strategy.
    #[command(name = "ycsb-t")]
    YcsbT(YcsbTArgs),
    /// TPC-CH: the TPC-C mix beside K threads looping TPC-H Q1, Q4, Q17 per
    /// strategy (AnKer's and KVell+'s mixes); duet and PostgreSQL side by side.
    Tpcch(TpcchArgs),
    /// Change streams beside an update stream at full speed: events/s and
    /// commit-to-delivery lag with 1, 8, 64 streams, and the writer's
    /// throughput with 64 streams vs none (embedded engine).
    Changes(ChangesArgs),
    /// Group commit across connections: N clients × `insert_one` with
    /// `j: true` over the wire on a durable server; inserts/s, latency and
    /// WAL fsyncs per write for each N.
    #[cfg(feature = "wire")]
    #[command(name = "group-commit")]
    GroupCommit(GroupCommitArgs),
    /// Raw OP_MSG round trips (ping, find by _id, insert, update) against a
    /// spawned `duet serve`, beside a TCP echo server in the same run.
    #[cfg(feature = "wire")]
    #[command(name = "wire-latency")]
    WireLatency(WireLatencyArgs),
    /// A 3-member replica set of `duet serve` processes on loopback: inserts/s
    /// with `w: 1` vs `w: "majority"` (the ratio), reads/s over 1, 2, 3
    /// members, failover time after SIGKILL of the primary, and the catch-up
    /// time of a new member after a large load.
    #[cfg(feature = "wire")]
    Replication(ReplicationArgs),
    /// Index build of a large collection inside the writer (foreground) vs
    /// outside it (background) while an updater runs at full speed: the
    /// writer's throughput during the build as a ratio, and build times.
    #[command(name = "index-build")]
    IndexBuild(IndexBuildArgs),
    /// DStore's delta indexing on vs off: an update mix moving the keys of 3
    /// secondary indexes (updates/s, CPU per update, merge lag), and range
    /// reads in the fresh vs the stale index view (embedded engine).
    Delta(DeltaArgs),
    /// Recovery of N documents with 3 secondary indexes (checkpoint + WAL
    /// tail): open time split into phases, and the time until `duet serve`
    /// on the directory answers a `ping`.
    Recovery(RecoveryArgs),
    /// Regenerate BENCHMARKS.md sections and PNG charts from JSON results.
    Report(ReportArgs),
}

#[derive(Args, Debug)]
pub struct RecoveryArgs {
    /// Documents per run, comma-separated (e.g. 1000000,3000000,10000000).
    #[arg(long, value_delimiter = ',', default_value = "1000000")]
    pub sizes: Vec<u64>,
    /// Updates committed after the checkpoint (the WAL tail replayed).
    #[arg(long, default_value_t = 10_000)]
    pub tail: u64,
    #[arg(long, default_value_t = 42)]
    pub seed: u64,
    /// Where the data directories go (default: the system's temporary directory).
    #[arg(long)]
    pub dir: Option<PathBuf>,
    /// Skip measuring `duet serve` (time until it answers a `ping`).
    #[arg(long)]
    pub no_serve: bool,
    /// Keep the data directories under `--dir`, and reuse those a previous
    /// `--keep` run left (no build): to profile the open alone.
    #[arg(long)]
    pub keep: bool,
    /// Directory for `recovery.json`, `.md` and the chart `recovery.png`.
    #[arg(long, default_value = "bench-results")]
    pub out: PathBuf,
}

#[derive(Args, Debug)]
pub struct DeltaArgs {
    /// Documents in the collection updated.
    #[arg(long, default_value_t = 300_000)]
    pub records: u64,
    /// Seconds the updater runs per round.
    #[arg(long, default_value_t = 3.0)]
    pub seconds: f64,
    /// Rounds per mode (off and on alternate).
    #[arg(long, default_value_t = 5)]
    pub repeat: usize,
    /// Seconds of range reads per index view.
    #[arg(long, default_value_t = 1.0)]
    pub read_seconds: f64,
    /// Width of a range read's interval on `a` (values in 0..records).
    #[arg(long, default_value_t = 100)]
    pub read_width: i64,
    #[arg(long, default_value_t = 42)]
    pub seed: u64,
    /// Directory for `delta.json` and `.md`.
    #[arg(long, default_value = "bench-results")]
    pub out: PathBuf,
}

#[derive(Args, Debug)]
pub struct IndexBuildArgs {
    /// Documents in the collection indexed.
    #[arg(long, default_value_t = 1_000_000)]
    pub records: u64,
    /// Seconds the updater runs alone before each build (its baseline).
    #[arg(long, default_value_t = 2.0)]
    pub warmup: f64,
    #[arg(long, default_value_t = 42)]
    pub seed: u64,
    /// Directory for `index-build.json` and `.md`.
    #[arg(long, default_value = "bench-results")]
    pub out: PathBuf,
}

#[cfg(feature = "wire")]
#[derive(Args, Debug)]
pub struct WireLatencyArgs {
    /// Measured requests per kind.
    #[arg(long, default_value_t = 20_000)]
    pub ops: u64,
    /// Serve a durable engine (temporary data directory, fsync per write)
    /// instead of an in-memory one.
    #[arg(long)]
    pub durable: bool,
    /// Directory for `wire-latency.json` and `.md`.
    #[arg(long, default_value = "bench-results")]
    pub out: PathBuf,
}

#[cfg(feature = "wire")]
#[derive(Args, Debug)]
pub struct ReplicationArgs {
    /// Client threads inserting (one document per insert).
    #[arg(long, default_value_t = 8)]
    pub threads: usize,
    /// Reader threads (spread over 1, 2, 3 members).
    #[arg(long, default_value_t = 8)]
    pub readers: usize,
    /// Seconds per measured write or read run.
    #[arg(long, default_value_t = 10.0)]
    pub seconds: f64,
    /// Primary kills measured.
    #[arg(long, default_value_t = 3)]
    pub failovers: usize,
    /// Documents (~200 bytes) loaded before a new member is added (also read).
    #[arg(long, default_value_t = 1_000_000)]
    pub catchup_docs: u64,
    /// Inserts per second while the new member catches up.
    #[arg(long, default_value_t = 200)]
    pub catchup_rate: u64,
    /// Every member's `--repl-snapshot-entries` (Raft snapshot interval).
    #[arg(long, default_value_t = 1000)]
    pub snapshot_entries: u64,
    /// The `duet` binary started as each member (default: this one).
    #[arg(long)]
    pub duet: Option<PathBuf>,
    /// Where the members' data directories go (default: the system's
    /// temporary directory); removed afterwards unless the run fails.
    #[arg(long)]
    pub dir: Option<PathBuf>,
    #[arg(long, default_value_t = 42)]
    pub seed: u64,
    /// Directory for `replication.json` and `.md`.
    #[arg(long, default_value = "bench-results")]
    pub out: PathBuf,
}

#[cfg(feature = "wire")]
#[derive(Args, Debug)]
pub struct GroupCommitArgs {
    /// Client counts, one run each (comma-separated).
    #[arg(long, value_delimiter = ',', default_value = "1,32")]
    pub clients: Vec<usize>,
    /// Seconds per run.
    #[arg(long, default_value_t = 5.0)]
    pub seconds: f64,
    /// `self-durable` (a `duet serve` on a temporary data directory in this
    /// process) or the `mongodb://` URI of a durable duetdb server.
    #[arg(long, default_value = "self-durable")]
    pub uri: String,
    /// Directory for `group-commit.json` and `.md`.
    #[arg(long, default_value = "bench-results")]
    pub out: PathBuf,
}

/// Flags every workload takes.
#[derive(Args, Debug, Clone)]
pub struct Common {
    /// Records (documents) loaded before the run.
    #[arg(long, default_value_t = 100_000)]
    pub records: u64,
    /// Seconds per measured run (per cell for htap).
    #[arg(long, default_value_t = 5.0)]
    pub seconds: f64,
    /// Client threads (update threads for htap).
    #[arg(long, default_value_t = 1)]
    pub threads: usize,
    /// Snapshot strategies for analytic reads (comma-separated).
    #[arg(long, value_delimiter = ',', default_value = "cow", value_parser = crate::targets::strategy_arg())]
    pub strategy: Vec<Strategy>,
    /// Repeated runs (figures report min / median / max).
    #[arg(long, default_value_t = 3)]
    pub repeat: usize,
    /// Targets side by side: duet, wire, sqlite, postgres, lmdb (comma-separated).
    #[arg(long, value_delimiter = ',', default_value = "duet")]
    pub targets: Vec<TargetName>,
    /// PostgreSQL connection (scripts/peers/postgres.sh starts one on loopback).
    #[arg(
        long,
        default_value = "host=127.0.0.1 port=54329 user=postgres dbname=postgres"
    )]
    pub pg: String,
    /// MongoDB-wire server for the `wire` target: a `mongodb://` URI (its
    /// `duet_bench` database is overwritten), `self` (start `duet serve` in
    /// this process for the run: in-memory, free loopback port) or
    /// `self-durable` (the same on a temporary data directory, fsync durability).
    #[arg(long, default_value = "self")]
    pub uri: String,
    #[command(flatten)]
    pub run: RunArgs,
}

/// Flags of every workload command: the seed, where results go, how loud.
#[derive(Args, Debug, Clone)]
pub struct RunArgs {
    #[arg(long, default_value_t = 42)]
    pub seed: u64,
    /// Directory for JSON and Markdown results.
    #[arg(long, default_value = "bench-results")]
    pub out: PathBuf,
    /// Suffix of the result file names (`<workload>-<tag>.json`).
    #[arg(long)]
    pub tag: Option<String>,
    /// No progress bars or progress lines.
    #[arg(long)]
    pub quiet: bool,
}

#[derive(Args, Debug)]
pub struct YcsbArgs {
    #[command(flatten)]
    pub common: Common,
    /// Core workloads to run, in order.
    #[arg(long, value_delimiter = ',', default_value = "A,B,C,F,D,E")]
    pub workloads: Vec<char>,
    /// Override every workload's request distribution.
    #[arg(long)]
    pub distribution: Option<Distribution>,
    #[arg(long, default_value_t = 10)]
    pub field_count: usize,
    #[arg(long, default_value_t = 100)]
    pub field_length: usize,
    /// Operations per workload run (all threads); default: run for --seconds.
    #[arg(long)]
    pub operations: Option<u64>,
    /// Client thread counts to run every workload at, each on a freshly loaded
    /// table (e.g. 1,8,32); overrides --threads. Cases then carry `threads`.
    #[arg(long, value_delimiter = ',')]
    pub thread_counts: Vec<usize>,
}

#[derive(Args, Debug)]
pub struct HtapArgs {
    #[command(flatten)]
    pub common: Common,
    /// Numbers of concurrent analytic threads (K).
    #[arg(long, value_delimiter = ',', default_value = "0,1,8")]
    pub analytics: Vec<usize>,
    /// Analytic queries: full, idx5, idx10, idx25.
    #[arg(long, value_delimiter = ',', default_value = "full,idx10")]
    pub scans: Vec<htap::ScanKind>,
    /// Attempted updates per second (all threads); 0 = as fast as possible.
    #[arg(long, default_value_t = 0)]
    pub update_rate: u64,
    /// duetdb remset modes to compare: shared (VLS), per-scan (individual
    /// remsets), scan-end (no immediate reclamation).
    #[arg(long, value_delimiter = ',', default_value = "shared")]
    pub remset: Vec<String>,
    /// Scan starts: staggered (each thread rescans as soon as it finishes)
    /// or aligned (every round of K scans starts together: fully overlapping
    /// scans, the VLS paper's remset set-up).
    #[arg(long, value_enum, default_value = "staggered")]
    pub scan_start: htap::ScanStart,
}

#[derive(Args, Debug)]
pub struct SnapshotArgs {
    /// Data sizes (MiB of documents), loaded incrementally.
    #[arg(long, value_delimiter = ',', default_value = "200,1000")]
    pub sizes_mb: Vec<u64>,
    /// Percent of the data rewritten while a snapshot is held.
    #[arg(long, value_delimiter = ',', default_value = "1,10,50")]
    pub rewrite_pct: Vec<u64>,
    /// Updates timed right after a snapshot and without one.
    #[arg(long, default_value_t = 2000)]
    pub first_writes: usize,
    /// Repeated runs (figures report min / median / max).
    #[arg(long, default_value_t = 1)]
    pub repeat: usize,
    #[command(flatten)]
    pub run: RunArgs,
    /// duet (in process: db.snapshot(), fork, deep copy) and/or wire (named
    /// snapshots over the wire: createSnapshot/dropSnapshot, retained bytes).
    #[arg(long, value_delimiter = ',', default_value = "duet")]
    pub targets: Vec<TargetName>,
    /// Server of the `wire` target (as for ycsb/htap: a URI, `self` or `self-durable`).
    #[arg(long, default_value = "self")]
    pub uri: String,
}

#[derive(Args, Debug)]
pub struct SpaceArgs {
    /// Records (~240-byte documents) loaded before the run.
    #[arg(long, default_value_t = 1_000_000)]
    pub records: u64,
    /// Seconds of updates per cell (a query running at the deadline finishes,
    /// with updates still running).
    #[arg(long, default_value_t = 10.0)]
    pub seconds: f64,
    /// Update threads.
    #[arg(long, default_value_t = 1)]
    pub threads: usize,
    /// Attempted updates per second (all threads); 0 = as fast as possible.
    #[arg(long, default_value_t = 0)]
    pub update_rate: u64,
    /// Update key distributions.
    #[arg(long, value_delimiter = ',', default_value = "uniform,zipfian")]
    pub dist: Vec<space::KeyDist>,
    /// Numbers of concurrent full-collection queries.
    #[arg(long, value_delimiter = ',', default_value = "1,3")]
    pub queries: Vec<usize>,
    /// Systems: olcp, vls, cow (held duetdb snapshots; `cow-steam` is an old
    /// name of it), steam (the bench's Steam baseline); `steam`, or else
    /// `cow`, also yields the counted si-model.
    #[arg(long, value_delimiter = ',', default_value = "olcp,vls,cow,steam")]
    pub systems: Vec<space::System>,
    /// `duet` (embedded) and/or `wire` (a duetdb server: queries are `count`
    /// commands with `$duet.workNsPerDoc`, old versions come from serverStatus
    /// and listSnapshots).
    #[arg(long, value_delimiter = ',', default_value = "duet")]
    pub targets: Vec<TargetName>,
    /// Server of the `wire` target (a URI of a duetdb server, `self` or `self-durable`).
    #[arg(long, default_value = "self")]
    pub uri: String,
    /// Busy work per document in the queries, so they last several seconds.
    #[arg(long, default_value_t = 3000)]
    pub work_ns_per_doc: u64,
    /// Sampling interval of old versions.
    #[arg(long, default_value_t = 200)]
    pub sample_ms: u64,
    /// Interval of the (O(size)) retained-cost walks of held snapshots.
    #[arg(long, default_value_t = 1000)]
    pub retained_every_ms: u64,
    /// Repeated runs (figures report min / median / max).
    #[arg(long, default_value_t = 1)]
    pub repeat: usize,
    #[command(flatten)]
    pub run: RunArgs,
}

#[derive(Args, Debug)]
pub struct YcsbTArgs {
    /// --records, --seconds (per cell), --threads (transaction clients),
    /// --strategy (of the analytic scans); only the duet target.
    #[command(flatten)]
    pub common: Common,
    /// Numbers of concurrent analytic scan threads (K).
    #[arg(long, value_delimiter = ',', default_value = "0,1")]
    pub analytics: Vec<usize>,
    /// Isolation levels: si, serializable.
    #[arg(long, value_delimiter = ',', default_value = "si")]
    pub isolation: Vec<ycsbt::IsolationArg>,
    /// Request distribution of the keys (KVell+: uniform).
    #[arg(long, default_value = "uniform")]
    pub distribution: Distribution,
    /// Read-modify-writes per transaction.
    #[arg(long, default_value_t = 16)]
    pub txn_size: usize,
    /// Attempts per transaction before it is given up.
    #[arg(long, default_value_t = 100)]
    pub max_attempts: u32,
}

#[derive(Args, Debug)]
pub struct TpcchArgs {
    /// Scale factor: warehouses (a fraction shrinks one warehouse).
    #[arg(long, default_value_t = 1.0)]
    pub scale: f64,
    /// Seconds per cell.
    #[arg(long, default_value_t = 5.0)]
    pub seconds: f64,
    /// Transaction threads (T).
    #[arg(long, default_value_t = 1)]
    pub threads: usize,
    /// Numbers of concurrent analytic threads (K), each looping Q1, Q4, Q17.
    #[arg(long, value_delimiter = ',', default_value = "0,1")]
    pub analytics: Vec<usize>,
    /// Snapshot strategies of the analytic queries.
    #[arg(long, value_delimiter = ',', default_value = "olcp", value_parser = crate::targets::strategy_arg())]
    pub strategy: Vec<Strategy>,
    /// Isolation levels of the transactions: si, serializable.
    #[arg(long, value_delimiter = ',', default_value = "si")]
    pub isolation: Vec<ycsbt::IsolationArg>,
    /// Weights of NewOrder, Payment, OrderStatus, Delivery, StockLevel
    /// (three weights: Delivery and StockLevel do not run).
    #[arg(long, value_delimiter = ',', default_value = "45,43,4,4,4")]
    pub mix: Vec<u32>,
    /// Map threads of each OLCP query.
    #[arg(long, default_value_t = 1)]
    pub query_threads: usize,
    /// Attempts per transaction before it is given up.
    #[arg(long, default_value_t = 100)]
    pub max_attempts: u32,
    /// After each run, check every query under every strategy against the
    /// reference evaluation (materializes a copy of the data set).
    #[arg(long)]
    pub verify: bool,
    /// Repeated runs (figures report min / median / max).
    #[arg(long, default_value_t = 1)]
    pub repeat: usize,
    /// Targets side by side in each run: duet, postgres (comma-separated).
    /// An unreachable PostgreSQL server skips its target with a note.
    #[arg(long, value_delimiter = ',', default_value = "duet")]
    pub targets: Vec<TargetName>,
    /// PostgreSQL connection (scripts/peers/postgres.sh starts one on loopback).
    #[arg(
        long,
        default_value = "host=127.0.0.1 port=54329 user=postgres dbname=postgres"
    )]
    pub pg: String,
    #[command(flatten)]
    pub run: RunArgs,
}

#[derive(Args, Debug)]
pub struct ChangesArgs {
    /// Documents updated (uniformly at random).
    #[arg(long, default_value_t = 10_000)]
    pub records: u64,
    /// Seconds per cell.
    #[arg(long, default_value_t = 5.0)]
    pub seconds: f64,
    /// Updater threads (each as fast as it can).
    #[arg(long, default_value_t = 1)]
    pub updaters: usize,
    /// Numbers of open change streams, one cell each (0: the writer alone).
    #[arg(long, value_delimiter = ',', default_value = "0,1,8,64")]
    pub streams: Vec<usize>,
    /// 0: caught-up streams wait for the next publish (as the server's
    /// getMore); N: streams sleep N ms after every read instead (polling).
    #[arg(long, default_value_t = 0)]
    pub reader_pause_ms: u64,
    /// Repeated runs (figures report min / median / max).
    #[arg(long, default_value_t = 3)]
    pub repeat: usize,
    #[command(flatten)]
    pub run: RunArgs,
}

#[derive(Args, Debug)]
pub struct ReportArgs {
    /// Directory of JSON results.
    #[arg(long, default_value = "bench-results")]
    pub results: PathBuf,
    /// The Markdown file whose generated sections are replaced.
    #[arg(long, default_value = "BENCHMARKS.md")]
    pub out: PathBuf,
    /// Where PNG charts go (linked relative to --out).
    #[arg(long, default_value = "docs/bench")]
    pub charts: PathBuf,
}

fn file_name(workload: &str, tag: &Option<String>) -> String {
    match tag {
        Some(t) => format!("{workload}-{t}"),
        None => workload.to_string(),
    }
}

/// Run one `duet bench` command; returns the result of a workload command.
pub fn run(cmd: BenchCommand) -> Result<Option<BenchResult>> {
    match cmd {
        BenchCommand::Ycsb(a) => ycsb(&a).map(Some),
        BenchCommand::Htap(a) => htap(&a).map(Some),
        BenchCommand::Snapshot(a) => snapshot(&a).map(Some),
        BenchCommand::Space(a) => space(&a).map(Some),
        BenchCommand::YcsbT(a) => ycsb_t(&a).map(Some),
        BenchCommand::Tpcch(a) => tpcch(&a).map(Some),
        BenchCommand::Changes(a) => changes(&a).map(Some),
        #[cfg(feature = "wire")]
        BenchCommand::GroupCommit(a) => {
            let (rows, md) = crate::wire::group_commit::run(&a.uri, &a.clients, a.seconds)?;
            std::fs::create_dir_all(&a.out)?;
            std::fs::write(
                a.out.join("group-commit.json"),
                serde_json::to_string_pretty(&rows)?,
            )?;
            std::fs::write(a.out.join("group-commit.md"), &md)?;
            println!("{md}");
            Ok(None)
        }
        #[cfg(feature = "wire")]
        BenchCommand::WireLatency(a) => {
            let (rows, md) = crate::wire::latency::run(a.durable, a.ops.max(1))?;
            std::fs::create_dir_all(&a.out)?;
            std::fs::write(
                a.out.join("wire-latency.json"),
                serde_json::to_string_pretty(&rows)?,
            )?;
            std::fs::write(a.out.join("wire-latency.md"), &md)?;
            println!("{md}");
            Ok(None)
        }
        #[cfg(feature = "wire")]
        BenchCommand::Replication(a) => {
            let duet = match &a.duet {
                Some(p) => p.clone(),
                None => std::env::current_exe()?,
            };
            let params = crate::wire::replication::Params {
                duet,
                dir: a.dir.clone().unwrap_or_else(std::env::temp_dir),
                threads: a.threads,
                readers: a.readers,
                seconds: a.seconds,
                failovers: a.failovers,
                catchup_docs: a.catchup_docs,
                catchup_rate: a.catchup_rate,
                snapshot_entries: a.snapshot_entries,
                seed: a.seed,
            };
            let (report, md) = crate::wire::replication::run(&params)?;
            std::fs::create_dir_all(&a.out)?;
            std::fs::write(
                a.out.join("replication.json"),
                serde_json::to_string_pretty(&report)?,
            )?;
            std::fs::write(a.out.join("replication.md"), &md)?;
            println!("{md}");
            Ok(None)
        }
        BenchCommand::Delta(a) => {
            let params = crate::workload::delta::Params {
                records: a.records,
                seconds: a.seconds,
                repeat: a.repeat,
                seed: a.seed,
                read_seconds: a.read_seconds,
                read_width: a.read_width,
            };
            let (report, md) = crate::workload::delta::run(&params)?;
            std::fs::create_dir_all(&a.out)?;
            std::fs::write(
                a.out.join("delta.json"),
                serde_json::to_string_pretty(&report)?,
            )?;
            std::fs::write(a.out.join("delta.md"), &md)?;
            println!("{md}");
            Ok(None)
        }
        BenchCommand::IndexBuild(a) => {
            let (rows, md) = crate::workload::index_build::run(a.records, a.warmup, a.seed)?;
            std::fs::create_dir_all(&a.out)?;
            std::fs::write(
                a.out.join("index-build.json"),
                serde_json::to_string_pretty(&rows)?,
            )?;
            std::fs::write(a.out.join("index-build.md"), &md)?;
            println!("{md}");
            Ok(None)
        }
        BenchCommand::Recovery(a) => {
            let params = crate::workload::recovery::Params {
                sizes: a.sizes.clone(),
                tail: a.tail,
                seed: a.seed,
                dir: a.dir.clone().unwrap_or_else(std::env::temp_dir),
                serve: !a.no_serve,
                keep: a.keep,
            };
            let (rows, md) = crate::workload::recovery::run(&params)?;
            std::fs::create_dir_all(&a.out)?;
            std::fs::write(
                a.out.join("recovery.json"),
                serde_json::to_string_pretty(&rows)?,
            )?;
            std::fs::write(a.out.join("recovery.md"), &md)?;
            let png = a.out.join("recovery.png");
            crate::workload::recovery::chart(&rows, &png)?;
            println!("{md}\nchart: {}", png.display());
            Ok(None)
        }
        BenchCommand::Report(a) => {
            crate::report::regenerate(&a.results, &a.out, &a.charts)?;
            Ok(None)
        }
    }
}

/// Where a workload's result goes.
struct Output<'a> {
    out: &'a Path,
    tag: &'a Option<String>,
}

/// The one runner of every workload command: capture the machine and the
/// start, run `body` (which builds its targets, so their set-up counts in
/// the wall time) into a fresh [`Sink`], assemble the result with the
/// parameters, write `<out>/<workload>[-tag].json` and `.md`, and print the
/// Markdown table.
fn run_workload(
    workload: &str,
    params: serde_json::Value,
    repeat: usize,
    to: Output,
    body: impl FnOnce(&mut Sink) -> Result<()>,
) -> Result<BenchResult> {
    let started = Started::now();
    let mut sink = Sink::default();
    body(&mut sink)?;
    let Sink { col, notes, series } = sink;
    let result = BenchResult::finish(workload, params, repeat, started, notes, col.figures())
        .with_series(series);
    let path = result.write(to.out, &file_name(workload, to.tag))?;
    println!("{}", crate::report::markdown_for(&result, None));
    eprintln!("wrote {}", path.display());
    Ok(result)
}

/// Build the named targets and record how each was set up.
fn targets(names: &[TargetName], at: &Connect, sink: &mut Sink) -> Result<Vec<Box<dyn Target>>> {
    let built = peers::build(names, at)?;
    sink.notes
        .extend(built.iter().filter_map(|t| t.setup_note()));
    Ok(built)
}

fn ycsb(a: &YcsbArgs) -> Result<BenchResult> {
    let c = &a.common;
    let p = ycsb::Params {
        records: c.records,
        field_count: a.field_count,
        field_length: a.field_length,
        threads: c.threads.max(1),
        seconds: c.seconds,
        operations: a.operations,
        distribution: a.distribution,
        workloads: a.workloads.clone(),
        seed: c.run.seed,
        repeat: c.repeat.max(1),
    };
    let mut params = serde_json::to_value(&p)?;
    let counts = if a.thread_counts.is_empty() {
        vec![p.threads]
    } else {
        params["threads"] = serde_json::to_value(&a.thread_counts)?;
        a.thread_counts.clone()
    };
    run_workload("ycsb", params, p.repeat, c.run.output(), |sink| {
        let built = targets(&c.targets, &c.connect(), sink)?;
        let ts = capable(&built, "ycsb", |t| t.as_ycsb())?;
        ycsb::run(
            &ts,
            &p,
            &counts,
            c.run.quiet,
            &mut sink.col,
            &mut sink.notes,
        )
    })
}

fn htap(a: &HtapArgs) -> Result<BenchResult> {
    let c = &a.common;
    let p = htap::Params {
        records: c.records,
        threads: c.threads.max(1),
        seconds: c.seconds,
        strategies: c.strategy.clone(),
        analytics: a.analytics.clone(),
        scans: a.scans.clone(),
        update_rate: a.update_rate,
        seed: c.run.seed,
        repeat: c.repeat.max(1),
        scan_start: a.scan_start,
    };
    let mut remset_modes = Vec::new();
    for mode in &a.remset {
        remset_modes.push(match mode.as_str() {
            "shared" => continue, // the default duet target
            "per-scan" => duetdb::RemsetMode::PerScan,
            "scan-end" => duetdb::RemsetMode::ReclaimAtScanEnd,
            other => bail!("unknown remset mode '{other}': shared, per-scan or scan-end"),
        });
    }
    run_workload(
        "htap",
        serde_json::to_value(&p)?,
        p.repeat,
        c.run.output(),
        |sink| {
            let mut built = targets(&c.targets, &c.connect(), sink)?;
            for mode in remset_modes {
                let t = Embedded::with_remset(mode);
                sink.notes.extend(t.setup_note());
                built.push(Box::new(t));
            }
            let ts = capable(&built, "htap", |t| t.as_htap())?;
            htap::run(&ts, &p, c.run.quiet, &mut sink.col, &mut sink.notes)
        },
    )
}

/// Run `body` on each named target in turn, each built just before and
/// dropped after its run. `snapshot` and `space` read this process's
/// memory, which a spawned server or a loaded engine beside the measured
/// target would inflate.
fn one_at_a_time(
    names: &[TargetName],
    uri: &str,
    sink: &mut Sink,
    mut body: impl FnMut(&[Box<dyn Target>], &mut Sink) -> Result<()>,
) -> Result<()> {
    for name in names {
        let built = targets(&[*name], &Connect { uri, pg: "" }, sink)?;
        body(&built, sink)?;
    }
    Ok(())
}

/// The targets `snapshot` and `space` run on: duetdb's own mechanisms.
const DUETDB_ONLY: [TargetName; 2] = [TargetName::Duet, TargetName::Wire];

fn snapshot(a: &SnapshotArgs) -> Result<BenchResult> {
    peers::only(
        "snapshot",
        &a.targets,
        &DUETDB_ONLY,
        "duet (in process) and wire (named snapshots of a duetdb server; it measures duetdb's own snapshots)",
    )?;
    let p = snapshot::Params {
        sizes_mb: a.sizes_mb.clone(),
        rewrite_pct: a.rewrite_pct.clone(),
        first_writes: a.first_writes,
        seed: a.run.seed,
        repeat: a.repeat.max(1),
    };
    run_workload(
        "snapshot",
        serde_json::to_value(&p)?,
        p.repeat,
        a.run.output(),
        |sink| {
            one_at_a_time(&a.targets, &a.uri, sink, |t, sink| {
                let ts = capable(t, "snapshot", |t| t.as_snapshot())?;
                snapshot::run(&ts, &p, a.run.quiet, sink)
            })
        },
    )
}

fn space(a: &SpaceArgs) -> Result<BenchResult> {
    peers::only(
        "space",
        &a.targets,
        &DUETDB_ONLY,
        "duet (in process) and wire (a duetdb server; it measures duetdb's own old versions)",
    )?;
    let p = space::Params {
        records: a.records.max(1),
        seconds: a.seconds,
        update_threads: a.threads.max(1),
        update_rate: a.update_rate,
        dists: a.dist.clone(),
        queries: a.queries.clone(),
        systems: a.systems.clone(),
        work_ns_per_doc: a.work_ns_per_doc,
        sample_ms: a.sample_ms,
        retained_every_ms: a.retained_every_ms,
        seed: a.run.seed,
        repeat: a.repeat.max(1),
    };
    let r = run_workload(
        "space",
        serde_json::to_value(&p)?,
        p.repeat,
        a.run.output(),
        |sink| {
            one_at_a_time(&a.targets, &a.uri, sink, |t, sink| {
                let ts = capable(t, "space", |t| t.as_space())?;
                space::run(&ts, &p, a.run.quiet, sink)
            })
        },
    )?;
    // The chart beside the JSON (`report` redraws it into the charts directory).
    let charts = crate::report::charts_for(&r, &a.run.out.join(file_name("space", &a.run.tag)))?;
    for (_, p) in charts {
        eprintln!("wrote {}", p.display());
    }
    Ok(r)
}

fn ycsb_t(a: &YcsbTArgs) -> Result<BenchResult> {
    let c = &a.common;
    peers::only(
        "ycsb-t",
        &c.targets,
        &[TargetName::Duet],
        "the duet target only (embedded transactions)",
    )?;
    let p = ycsbt::Params {
        records: c.records,
        threads: c.threads.max(1),
        seconds: c.seconds,
        strategies: c.strategy.clone(),
        analytics: a.analytics.clone(),
        isolations: a.isolation.clone(),
        distribution: a.distribution,
        txn_size: a.txn_size,
        max_attempts: a.max_attempts.max(1),
        seed: c.run.seed,
        repeat: c.repeat.max(1),
    };
    run_workload(
        "ycsb-t",
        serde_json::to_value(&p)?,
        p.repeat,
        c.run.output(),
        |sink| ycsbt::run(&p, c.run.quiet, &mut sink.col, &mut sink.notes),
    )
}

fn tpcch(a: &TpcchArgs) -> Result<BenchResult> {
    let mix: [u32; 5] = match *a.mix.as_slice() {
        [n, p, o] => [n, p, o, 0, 0],
        [n, p, o, d, s] => [n, p, o, d, s],
        _ => anyhow::bail!(
            "--mix takes five weights (NewOrder,Payment,OrderStatus,Delivery,StockLevel) or the first three"
        ),
    };
    peers::only(
        "tpcch",
        &a.targets,
        &[TargetName::Duet, TargetName::Postgres],
        "duet (embedded) and postgres (TPC-C as SQL transactions)",
    )?;
    let mut targets = Vec::new();
    for (name, t) in [
        ("duet", TargetName::Duet),
        ("postgres", TargetName::Postgres),
    ] {
        if a.targets.contains(&t) {
            targets.push(name);
        }
    }
    let p = tpcch::Params {
        targets,
        pg: a.pg.clone(),
        scale: a.scale,
        threads: a.threads.max(1),
        seconds: a.seconds,
        strategies: a.strategy.clone(),
        analytics: a.analytics.clone(),
        isolations: a.isolation.clone(),
        mix,
        query_threads: a.query_threads.max(1),
        max_attempts: a.max_attempts.max(1),
        verify: a.verify,
        seed: a.run.seed,
        repeat: a.repeat.max(1),
    };
    run_workload(
        "tpcch",
        serde_json::to_value(&p)?,
        p.repeat,
        a.run.output(),
        |sink| tpcch::run(&p, a.run.quiet, &mut sink.col, &mut sink.notes),
    )
}

fn changes(a: &ChangesArgs) -> Result<BenchResult> {
    let p = changes::Params {
        records: a.records.max(1),
        seconds: a.seconds,
        updaters: a.updaters.max(1),
        streams: a.streams.clone(),
        reader_pause_ms: a.reader_pause_ms,
        seed: a.run.seed,
        repeat: a.repeat.max(1),
    };
    run_workload(
        "changes",
        serde_json::to_value(&p)?,
        p.repeat,
        a.run.output(),
        |sink| changes::run(&p, a.run.quiet, &mut sink.col, &mut sink.notes),
    )
}

impl RunArgs {
    fn output(&self) -> Output<'_> {
        Output {
            out: &self.out,
            tag: &self.tag,
        }
    }
}

impl Common {
    fn connect(&self) -> Connect<'_> {
        Connect {
            uri: &self.uri,
            pg: &self.pg,
        }
    }
}
