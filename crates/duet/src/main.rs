//! The `duet` command: a demo of the engine, import and queries over JSON data,
//! checkpoints, and the durability checks.
//!
//! A data directory holds databases, one subdirectory each — the layout
//! `duet serve` uses. With `--data-dir` a command opens the data directory
//! (taking its lock, so it fails clearly beside a live server) and works on
//! database `--db` (default `test`, as the mongo shell); what it writes
//! persists. Reads of a database that does not exist create nothing.
//! Without `--data-dir` the command works on an empty in-memory store (the
//! query commands take `--load FILE` to load data first).

use std::fs::File;
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{bail, Context, Result};
use clap::{Args, Parser, Subcommand};
use duetdb::bson::{doc, Bson, Document};
use duetdb::check::killtest;
use duetdb::{Collection, Database, Durability, DurabilityOptions, Engine, IndexOptions};

mod durability_bench;
mod hostile;
mod progress;

// The engine allocates many small short-lived objects (copy-on-write nodes,
// index keys); mimalloc handles that pattern far better than glibc malloc.
#[global_allocator]
static ALLOC: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[derive(Parser)]
#[command(
    name = "duet",
    version,
    about = "duetdb: consistent analytics beside live updates"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Load generated data, index it, query it, and show a snapshot staying consistent under updates.
    Demo {
        /// Documents to generate.
        #[arg(long, default_value_t = 200_000)]
        docs: u64,
    },
    /// Load JSON Lines or a JSON array (extended JSON accepted) into a collection.
    Import {
        #[command(flatten)]
        target: Target,
        /// The file to import (`-` for standard input).
        file: PathBuf,
        /// Continue past documents that fail (default: stop at the first).
        #[arg(long)]
        unordered: bool,
    },
    /// Find documents matching a filter.
    Find {
        #[command(flatten)]
        target: Target,
        /// Filter as JSON (extended JSON), e.g. '{"age": {"$gt": 30}}'.
        #[arg(long, default_value = "{}")]
        filter: String,
        #[arg(long)]
        sort: Option<String>,
        #[arg(long)]
        projection: Option<String>,
        #[arg(long, default_value_t = 0)]
        skip: u64,
        /// 0 = no limit.
        #[arg(long, default_value_t = 20)]
        limit: u64,
        /// Print the plan instead of the documents.
        #[arg(long)]
        explain: bool,
    },
    /// Count documents matching a filter.
    Count {
        #[command(flatten)]
        target: Target,
        #[arg(long, default_value = "{}")]
        filter: String,
    },
    /// Collection statistics.
    Stats {
        #[command(flatten)]
        target: Target,
    },
    /// Serve the MongoDB wire protocol (see the README's "Server" and
    /// "Operating duet" sections). `--config FILE` reads these flags from a
    /// TOML (or `.yaml`/`.yml`) file; flags on the command line override it.
    #[command(args_override_self = true)]
    Serve(Box<duet_server::ServeArgs>),
    /// Benchmarks: ycsb, htap, snapshot workloads; `report` regenerates BENCHMARKS.md.
    Bench {
        #[command(subcommand)]
        command: duet_bench::BenchCommand,
    },
    /// Write a checkpoint of the databases of a data directory now (and drop
    /// the WAL each covers).
    Checkpoint {
        /// The data directory (one subdirectory per database).
        #[arg(long)]
        data_dir: PathBuf,
        /// Only this database (default: every database).
        #[arg(long)]
        db: Option<String>,
    },
    /// Hot backup, offline form: copy every database of a data directory that
    /// no server has open into a new directory (a running server: use the
    /// `duetBackup` admin command instead, the directory is locked).
    Backup {
        /// The data directory to back up.
        #[arg(long)]
        data_dir: PathBuf,
        /// The new (or empty) directory to write; itself a data directory.
        #[arg(long)]
        to: PathBuf,
    },
    /// Restore a backup into a new data directory (or serve the backup
    /// directory itself: `duet serve --data-dir <backup>`).
    Restore {
        /// The backup directory (`duet backup` or `duetBackup`).
        #[arg(long)]
        from: PathBuf,
        /// The new (or empty) data directory to create.
        #[arg(long)]
        data_dir: PathBuf,
    },
    /// The child of `duet check crash` (writes until killed).
    #[command(hide = true)]
    CrashChild {
        #[arg(long)]
        data_dir: PathBuf,
        #[arg(long)]
        run: u64,
        #[arg(long)]
        seed: u64,
    },
    /// Long-running checks (soaks) of the engine's guarantees.
    Check {
        #[command(subcommand)]
        check: CheckCommand,
    },
}

#[derive(Subcommand)]
enum CheckCommand {
    /// Snapshot consistency: writers change data while scans run under a
    /// strategy; every scan must equal a model of the data at its start commit.
    Consistency {
        /// none, vls, cow or auto (`none` is expected to show violations).
        #[arg(long, default_value = "vls")]
        strategy: String,
        /// How long to run.
        #[arg(long, default_value_t = 60)]
        seconds: u64,
        /// Concurrent scans.
        #[arg(long, default_value_t = 8)]
        scans: usize,
        #[arg(long, default_value_t = 2)]
        writers: usize,
        /// Documents per round.
        #[arg(long, default_value_t = 5000)]
        docs: i64,
        /// VLS scan slots: 64 or 128.
        #[arg(long, default_value_t = 64)]
        slots: usize,
        #[arg(long, default_value_t = 1)]
        seed: u64,
        /// Kind of the index scans use: plain, partial, sparse, hashed, wildcard, geo or
        /// text (`$text` searches join the mix).
        #[arg(long, default_value = "plain")]
        index: String,
        /// Run with delta indexing on (small delta layers, so merges run mid-scan).
        #[arg(long)]
        delta_indexing: bool,
    },
    /// SIGKILL campaign: a child writes batches (fsync durability) and is
    /// killed at random moments; every recovery is checked against the
    /// acknowledged writes, batch atomicity and index rebuilds.
    Crash {
        /// How long to run.
        #[arg(long, default_value_t = 60)]
        seconds: u64,
        /// Data directory to use (default: a fresh one under the temp dir).
        #[arg(long)]
        data_dir: Option<PathBuf>,
        /// Longest time a child writes before it is killed (ms).
        #[arg(long, default_value_t = 40)]
        max_delay_ms: u64,
        #[arg(long, default_value_t = 1)]
        seed: u64,
    },
    /// Data-directory campaign: build a durable database (acknowledged
    /// writes, two checkpoints, a durable snapshot, several WAL segments),
    /// then delete, truncate and corrupt each of its files in turn on a
    /// fresh copy; every open must recover all acknowledged writes or refuse
    /// with an error naming the damaged file.
    Datadir {
        /// Acknowledged write operations.
        #[arg(long, default_value_t = 3000)]
        writes: usize,
        /// WAL segment size in bytes (small: many segments).
        #[arg(long, default_value_t = 16 << 10)]
        segment_bytes: u64,
        /// Work on real files under this directory (default: the simulated disk).
        #[arg(long)]
        real_dir: Option<PathBuf>,
        #[arg(long, default_value_t = 1)]
        seed: u64,
    },
    /// Durability benchmark: update throughput and p99 latency for
    /// in-memory / none / batch / fsync, latency during checkpoints, and
    /// recovery time.
    Durability {
        /// Documents loaded for the recovery measurement.
        #[arg(long, default_value_t = 1_000_000)]
        docs: u64,
        /// Seconds per throughput measurement.
        #[arg(long, default_value_t = 3)]
        seconds: u64,
        /// Concurrent writer threads.
        #[arg(long, default_value_t = 4)]
        threads: usize,
        /// Where to put the databases (default: the temp dir).
        #[arg(long)]
        dir: Option<PathBuf>,
    },
    /// Hostile-client soak: random attacks (cursor theft and floods,
    /// oversized results, huge sorts, half-sent messages, idle sockets,
    /// garbage frames, reads of missing databases, test knobs) from many
    /// connections against a `duet serve` process, while a reference
    /// collection takes acknowledged writes. Passes when the server stayed
    /// under the RSS ceiling, still answers, kept every acknowledged write,
    /// created no database for a read, and restarts with the same data.
    Hostile {
        #[arg(long, default_value_t = 60)]
        seconds: u64,
        /// Concurrent attacking threads (each opens its own connections).
        #[arg(long, default_value_t = 16)]
        threads: usize,
        /// Most resident memory the server may reach (MB).
        #[arg(long, default_value_t = 2048)]
        rss_ceiling_mb: u64,
        #[arg(long, default_value_t = 1)]
        seed: u64,
        /// Working directory (default: a fresh one under the temp dir, removed on success).
        #[arg(long)]
        dir: Option<PathBuf>,
        /// Extra `duet serve` flags (repeat), e.g. `--server-arg=--max-connections=50`.
        #[arg(long = "server-arg", allow_hyphen_values = true)]
        server_args: Vec<String>,
    },
}

#[derive(Args)]
struct Target {
    /// Data directory (as `duet serve --data-dir`: one subdirectory per
    /// database): it is locked and recovered, and what the command writes
    /// persists. Without it: in memory only.
    #[arg(long)]
    data_dir: Option<PathBuf>,
    /// Database name.
    #[arg(long, default_value = "test")]
    db: String,
    /// Durability of writes with --data-dir: none, batch or fsync.
    #[arg(long, default_value = "fsync")]
    durability: Durability,
    /// Collection name.
    #[arg(long, short = 'c', default_value = "docs")]
    collection: String,
    /// Files (JSON Lines or JSON array) to load into the collection first.
    #[arg(long)]
    load: Vec<PathBuf>,
}

fn main() {
    // `serve --config FILE`: the file's flags go before the command line's.
    let argv = match duet_server::config::expand_args(std::env::args_os().collect()) {
        Ok(a) => a,
        Err(e) => {
            eprintln!("error: {e}");
            std::process::exit(2);
        }
    };
    if let Err(e) = run(Cli::parse_from(argv)) {
        eprintln!("error: {e:#}");
        std::process::exit(1);
    }
}

/// Open the data directory (or an in-memory engine) and the target's
/// database: created when `create` or when files are to be loaded into it;
/// otherwise a database that does not exist reads as empty and nothing is
/// created.
fn open(target: &Target, create: bool) -> Result<Collection> {
    let engine = match &target.data_dir {
        Some(dir) => Engine::open_with(
            dir,
            DurabilityOptions {
                mode: target.durability,
                ..Default::default()
            },
        )
        .with_context(|| format!("cannot open data directory {}", dir.display()))?,
        None => Engine::in_memory(),
    };
    let db = if create || !target.load.is_empty() {
        engine.database(&target.db)?
    } else {
        engine
            .get(&target.db)?
            .unwrap_or_else(|| Database::named(&target.db, None))
    };
    let c = db.collection(&target.collection);
    for f in &target.load {
        let n = import(&c, f, false)?;
        eprintln!("loaded {n} documents from {}", f.display());
    }
    Ok(c)
}

fn parse_json_doc(text: &str, what: &str) -> Result<Document> {
    let value: serde_json::Value =
        serde_json::from_str(text).with_context(|| format!("{what} is not valid JSON"))?;
    match Bson::try_from(value).with_context(|| format!("{what} is not valid extended JSON"))? {
        Bson::Document(d) => Ok(d),
        other => bail!("{what} must be a JSON object, got {other}"),
    }
}

/// Import a file: a JSON array of objects, or one object per line.
fn import(c: &Collection, file: &Path, unordered: bool) -> Result<u64> {
    let reader: Box<dyn BufRead> = if file == Path::new("-") {
        Box::new(BufReader::new(std::io::stdin()))
    } else {
        let f = File::open(file).with_context(|| format!("cannot open {}", file.display()))?;
        let len = f.metadata().map(|m| m.len()).unwrap_or(0);
        Box::new(BufReader::new(
            progress::bar(len, "reading", true).wrap_read(f),
        ))
    };
    let mut docs = Vec::new();
    let mut lines = reader.lines().peekable();
    let mut first_line: Option<String> = None;
    while let Some(line) = lines.next() {
        let line = line.context("read error")?;
        if line.trim().is_empty() {
            continue;
        }
        if first_line.is_none() && line.trim_start().starts_with('[') {
            // A JSON array: read the whole rest and parse it at once.
            let mut all = line;
            for l in lines.by_ref() {
                all.push('\n');
                all.push_str(&l.context("read error")?);
            }
            let value: serde_json::Value =
                serde_json::from_str(&all).context("file is not a valid JSON array")?;
            let serde_json::Value::Array(items) = value else {
                bail!("expected a JSON array")
            };
            for (i, item) in items.into_iter().enumerate() {
                match Bson::try_from(item)
                    .with_context(|| format!("element {i} is not valid extended JSON"))?
                {
                    Bson::Document(d) => docs.push(d),
                    other => bail!("element {i} is not an object: {other}"),
                }
            }
            break;
        }
        let n = docs.len() + 1;
        first_line.get_or_insert_with(|| line.clone());
        docs.push(parse_json_doc(&line, &format!("line {n}"))?);
    }
    let total = docs.len() as u64;
    let spinner = progress::spinner(&format!("inserting {total} documents"));
    let inserted = c.insert_many(docs, !unordered);
    spinner.finish_and_clear();
    match inserted {
        Ok(_) => Ok(total),
        Err(duetdb::Error::BulkWrite(f)) => {
            for (i, e) in f.errors.iter().take(10) {
                eprintln!("document {i}: {e}");
            }
            if unordered {
                eprintln!("{} of {total} documents failed", f.errors.len());
                Ok(f.inserted as u64)
            } else {
                bail!(
                    "import stopped at document {} after inserting {}",
                    f.errors[0].0,
                    f.inserted
                )
            }
        }
        Err(e) => Err(e.into()),
    }
}

fn print_doc(out: &mut impl Write, d: Document) -> Result<()> {
    writeln!(out, "{}", Bson::Document(d).into_relaxed_extjson())?;
    Ok(())
}

fn run(cli: Cli) -> Result<()> {
    let stdout = std::io::stdout();
    let mut out = stdout.lock();
    match cli.command {
        Command::Serve(args) => {
            // mimalloc frees per thread: `--max-memory-gb` asks each thread
            // to collect (duet_server::memory).
            duet_server::memory::set_allocator("mimalloc", || {
                // SAFETY: collects the calling thread's own mimalloc heap.
                unsafe { libmimalloc_sys::mi_collect(true) }
            });
            duet_server::serve_cli(*args).map_err(|e| anyhow::anyhow!(e))
        }
        Command::Demo { docs } => demo(docs, &mut out),
        Command::Bench { command } => {
            drop(out);
            duet_bench::run(command).map(|_| ())
        }
        Command::Import {
            target,
            file,
            unordered,
        } => {
            let c = open(&target, true)?;
            let n = import(&c, &file, unordered)?;
            let whereto = match &target.data_dir {
                Some(d) => format!("persisted in {}", d.display()),
                None => "in memory only: no --data-dir".to_string(),
            };
            writeln!(
                out,
                "imported {n} documents into '{}.{}' ({whereto})",
                target.db,
                c.name()
            )?;
            Ok(())
        }
        Command::Find {
            target,
            filter,
            sort,
            projection,
            skip,
            limit,
            explain,
        } => {
            let c = open(&target, false)?;
            let mut find = c
                .find(parse_json_doc(&filter, "--filter")?)
                .skip(skip)
                .limit(limit);
            if let Some(s) = sort {
                find = find.sort(parse_json_doc(&s, "--sort")?);
            }
            if let Some(p) = projection {
                find = find.projection(parse_json_doc(&p, "--projection")?);
            }
            if explain {
                return print_doc(&mut out, find.explain()?);
            }
            for d in find.run()? {
                print_doc(&mut out, d)?;
            }
            Ok(())
        }
        Command::Count { target, filter } => {
            let c = open(&target, false)?;
            writeln!(out, "{}", c.count(parse_json_doc(&filter, "--filter")?)?)?;
            Ok(())
        }
        Command::Check {
            check:
                CheckCommand::Consistency {
                    strategy,
                    seconds,
                    scans,
                    writers,
                    docs,
                    slots,
                    seed,
                    index,
                    delta_indexing,
                },
        } => {
            let strategy: duetdb::Strategy = strategy.parse()?;
            let index = duetdb::check::CheckIndex::parse(&index).map_err(anyhow::Error::msg)?;
            let cfg = duetdb::check::CheckConfig {
                strategy,
                scans,
                writers,
                docs,
                scans_per_round: 8,
                rounds: u64::MAX,
                max_duration: std::time::Duration::from_secs(seconds),
                seed,
                slots,
                stop_on_violation: false,
                index,
                delta_indexing,
            };
            let delta = if delta_indexing {
                ", delta indexing on"
            } else {
                ""
            };
            writeln!(out, "checking {strategy} for {seconds}s: {scans} scans, {writers} writers, {docs} documents per round{delta}")?;
            let started = Instant::now();
            let mut last_print = Instant::now();
            let report = duetdb::check::run(&cfg, |r| {
                if last_print.elapsed().as_secs() >= 10 {
                    last_print = Instant::now();
                    eprintln!(
                        "  {:>4}s: {} rounds, {} scans checked, {} writes, {} violations",
                        started.elapsed().as_secs(),
                        r.rounds,
                        r.scans_checked,
                        r.writes,
                        r.violations
                    );
                }
            });
            writeln!(
                out,
                "{} rounds, {} scans checked ({} overlapped writes), {} writes, {} documents read from the remset, {} violations in {:.0?}",
                report.rounds,
                report.scans_checked,
                report.scans_overlapping_writes,
                report.writes,
                report.docs_from_remset,
                report.violations,
                started.elapsed()
            )?;
            for e in &report.examples {
                writeln!(out, "  violation: {e}")?;
            }
            if report.violations > 0 {
                bail!("{} violations", report.violations);
            }
            Ok(())
        }
        Command::Stats { target } => {
            let c = open(&target, false)?;
            match c.stats() {
                Ok(s) => {
                    writeln!(
                        out,
                        "count: {}\ndata bytes: {}\navg object size: {}",
                        s.count, s.data_bytes, s.avg_obj_size
                    )?;
                    for (name, entries) in s.indexes {
                        writeln!(out, "index {name}: {entries} entries")?;
                    }
                }
                Err(duetdb::Error::NamespaceNotFound(_)) => {
                    writeln!(out, "collection '{}' is empty", c.name())?
                }
                Err(e) => return Err(e.into()),
            }
            Ok(())
        }
        Command::Checkpoint { data_dir, db } => checkpoint(&data_dir, db.as_deref(), &mut out),
        Command::Backup { data_dir, to } => backup(&data_dir, &to, &mut out),
        Command::Restore { from, data_dir } => restore(&from, &data_dir, &mut out),
        Command::CrashChild {
            data_dir,
            run,
            seed,
        } => {
            let mut stdout = std::io::stdout();
            killtest::child(&data_dir, run, seed, &mut stdout)?;
            Ok(())
        }
        Command::Check {
            check:
                CheckCommand::Crash {
                    seconds,
                    data_dir,
                    max_delay_ms,
                    seed,
                },
        } => check_crash(seconds, data_dir, max_delay_ms, seed, &mut out),
        Command::Check {
            check:
                CheckCommand::Datadir {
                    writes,
                    segment_bytes,
                    real_dir,
                    seed,
                },
        } => {
            let cfg = duetdb::check::datadir::DatadirConfig {
                writes,
                segment_bytes,
                seed,
                real_dir,
            };
            let report = duetdb::check::datadir::run(&cfg).map_err(|e| anyhow::anyhow!(e))?;
            write!(out, "{report}")?;
            let violations = report.violations().len();
            if violations > 0 {
                bail!("data-directory check FAILED: {violations} violations");
            }
            Ok(())
        }
        Command::Check {
            check:
                CheckCommand::Durability {
                    docs,
                    seconds,
                    threads,
                    dir,
                },
        } => durability_bench::run(docs, seconds, threads, dir, &mut out),
        Command::Check {
            check:
                CheckCommand::Hostile {
                    seconds,
                    threads,
                    rss_ceiling_mb,
                    seed,
                    dir,
                    server_args,
                },
        } => hostile::run(
            hostile::Options {
                seconds,
                threads,
                rss_ceiling_mb,
                seed,
                dir,
                server_args,
            },
            &mut out,
        ),
    }
}

/// `duet backup`: `Engine::backup_to` on a data directory opened here.
fn backup(data_dir: &Path, to: &Path, out: &mut impl Write) -> Result<()> {
    let engine = Engine::open(data_dir).with_context(|| {
        format!(
            "cannot open data directory {} (while a server runs on it, send it {{duetBackup: 1, to: <path>}} instead)",
            data_dir.display()
        )
    })?;
    let pb = progress::bar(0, "backing up databases", false);
    let info = engine
        .backup_to(to, |done, total| {
            pb.set_length(total as u64);
            pb.set_position(done as u64);
        })
        .with_context(|| format!("backup to {} failed", to.display()))?;
    pb.finish_and_clear();
    for b in &info.databases {
        writeln!(
            out,
            "{}: csn {}: {} documents, {} bytes",
            b.name, b.csn, b.documents, b.bytes
        )?;
    }
    writeln!(
        out,
        "backup of {} database(s) in {}",
        info.databases.len(),
        to.display()
    )?;
    Ok(())
}

/// `duet restore`: copy the databases a backup lists into a new data
/// directory, then open it to check that every database loads.
fn restore(from: &Path, data_dir: &Path, out: &mut impl Write) -> Result<()> {
    let listing = std::fs::read_to_string(from.join("BACKUP")).with_context(|| {
        format!(
            "{} is not a complete backup (no BACKUP file)",
            from.display()
        )
    })?;
    if data_dir.exists() && std::fs::read_dir(data_dir)?.next().is_some() {
        bail!(
            "{} exists and is not empty: restore into a new directory",
            data_dir.display()
        );
    }
    std::fs::create_dir_all(data_dir)?;
    let pb = progress::bar(listing.lines().count() as u64, "restoring databases", false);
    for line in listing.lines() {
        let Some((name, _csn)) = line.split_once(' ') else {
            bail!("bad line in {}: {line:?}", from.join("BACKUP").display());
        };
        duetdb::validate_db_name(name)?;
        let (src, dst) = (from.join(name), data_dir.join(name));
        std::fs::create_dir_all(&dst)?;
        for entry in std::fs::read_dir(&src)? {
            let entry = entry?;
            std::fs::copy(entry.path(), dst.join(entry.file_name()))
                .with_context(|| format!("copy {}", entry.path().display()))?;
        }
        pb.inc(1);
    }
    pb.finish_and_clear();
    let engine = Engine::open(data_dir).with_context(|| {
        format!(
            "the restored directory {} does not open",
            data_dir.display()
        )
    })?;
    for (name, db) in engine.list_databases() {
        writeln!(out, "{name}: csn {}", db.stats().csn)?;
    }
    writeln!(
        out,
        "restored {} into {}",
        from.display(),
        data_dir.display()
    )?;
    Ok(())
}

/// `duet checkpoint`: checkpoint database `only`, or every database.
fn checkpoint(data_dir: &Path, only: Option<&str>, out: &mut impl Write) -> Result<()> {
    let engine = Engine::open(data_dir)
        .with_context(|| format!("cannot open data directory {}", data_dir.display()))?;
    let dbs: Vec<(String, Database)> = match only {
        Some(name) => match engine.get(name)? {
            Some(db) => vec![(name.to_string(), db)],
            None => bail!("no database '{name}' in {}", data_dir.display()),
        },
        None => engine.list_databases(),
    };
    if dbs.is_empty() {
        writeln!(out, "no databases in {}", data_dir.display())?;
    }
    for (name, db) in dbs {
        if let Some(r) = db.recovery_report() {
            writeln!(out, "{name}: recovered: {r}")?;
        }
        match db.checkpoint()? {
            Some(info) => writeln!(
                out,
                "{name}: checkpoint at csn {}: {} documents, {} bytes in {}",
                info.csn,
                info.documents,
                info.bytes,
                info.path.display()
            )?,
            None => writeln!(
                out,
                "{name}: nothing new since the last checkpoint (csn {})",
                db.csn()
            )?,
        }
    }
    Ok(())
}

fn check_crash(
    seconds: u64,
    data_dir: Option<PathBuf>,
    max_delay_ms: u64,
    seed: u64,
    out: &mut impl Write,
) -> Result<()> {
    let dir = data_dir.unwrap_or_else(|| {
        std::env::temp_dir().join(format!("duet-crash-{}-{seed}", std::process::id()))
    });
    if dir.exists() {
        bail!("{} exists: give a fresh directory", dir.display());
    }
    let exe = std::env::current_exe().context("cannot find the duet binary")?;
    let mut spawn = |run: u64, child_seed: u64| {
        std::process::Command::new(&exe)
            .arg("crash-child")
            .arg("--data-dir")
            .arg(&dir)
            .args(["--run", &run.to_string(), "--seed", &child_seed.to_string()])
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
    };
    writeln!(out, "SIGKILL campaign for {seconds}s in {}", dir.display())?;
    let t = Instant::now();
    let result = killtest::campaign(
        &dir,
        u64::MAX,
        t + std::time::Duration::from_secs(seconds),
        seed,
        std::time::Duration::from_millis(max_delay_ms),
        &mut spawn,
    );
    match result {
        Ok(r) => {
            writeln!(
                out,
                "{} kills, {} acknowledged operations verified, 0 losses; recovery mean {:.1?}, max {:.1?}; {:.1?} total",
                r.kills,
                r.acked_ops,
                r.total_recovery / (r.kills.max(1) as u32),
                r.max_recovery,
                t.elapsed()
            )?;
            let _ = std::fs::remove_dir_all(&dir);
            Ok(())
        }
        Err(e) => bail!(
            "crash check FAILED (directory kept: {}): {e}",
            dir.display()
        ),
    }
}

fn demo(n: u64, out: &mut impl Write) -> Result<()> {
    let db = Database::in_memory();
    let c = db.collection("orders");
    writeln!(out, "duetdb demo: {n} orders in memory")?;
    let t = Instant::now();
    let regions = ["north", "south", "east", "west"];
    let mut batch = Vec::with_capacity(10_000);
    for i in 0..n {
        batch.push(doc! {
            "_id": i as i64,
            "region": regions[(i % 4) as usize],
            "amount": ((i * 7919) % 1000) as i64,
            "status": if i % 10 == 0 { "open" } else { "done" },
        });
        if batch.len() == 10_000 {
            c.insert_many(std::mem::take(&mut batch), true)?;
        }
    }
    c.insert_many(batch, true)?;
    writeln!(out, "  inserted in {:.2?}", t.elapsed())?;
    let t = Instant::now();
    c.create_index(doc! {"amount": 1}, IndexOptions::default())?;
    writeln!(out, "  index {{amount: 1}} built in {:.2?}", t.elapsed())?;

    let filter = doc! {"amount": {"$gte": 990}};
    let plan = c.find(filter.clone()).explain()?;
    let t = Instant::now();
    let hits = c.count(filter.clone())?;
    writeln!(
        out,
        "  count {{amount >= 990}} = {hits} in {:.2?} via {}",
        t.elapsed(),
        plan.get_document("queryPlanner")?.get_str("summary")?
    )?;
    let t = Instant::now();
    let open = c.count(doc! {"status": "open", "region": "north"})?;
    writeln!(
        out,
        "  count {{status: open, region: north}} = {open} in {:.2?} via COLLSCAN",
        t.elapsed()
    )?;

    // A snapshot stays fixed while updates continue.
    let snap = db.snapshot();
    let before = snap.collection("orders").count(doc! {"status": "open"})?;
    let t = Instant::now();
    let r = c.update_many(doc! {"status": "open"}, doc! {"$set": {"status": "done"}})?;
    writeln!(
        out,
        "  closed {} open orders in {:.2?}",
        r.modified,
        t.elapsed()
    )?;
    let after_live = c.count(doc! {"status": "open"})?;
    let after_snap = snap.collection("orders").count(doc! {"status": "open"})?;
    writeln!(
        out,
        "  open orders: snapshot at csn {} still sees {after_snap} (was {before}); live state sees {after_live}",
        snap.csn()
    )?;
    if after_snap != before || after_live != 0 {
        bail!("snapshot isolation violated in the demo");
    }
    let top = c
        .find(doc! {})
        .sort(doc! {"amount": -1, "_id": 1})
        .limit(3)
        .projection(doc! {"amount": 1})
        .run()?;
    writeln!(out, "  top 3 by amount:")?;
    for d in top {
        print_doc(out, d)?;
    }
    Ok(())
}
