//! The `duet` command: a demo of the engine, import and queries over JSON data.
//!
//! Durability is not built yet, so every invocation starts from an empty
//! in-memory store: `import` validates and loads a file and reports what it
//! stored, and the query commands take `--load FILE` to load data first. Each
//! command says so when it is given a `--data-dir`.

use std::fs::File;
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{bail, Context, Result};
use clap::{Args, Parser, Subcommand};
use duetdb::bson::{doc, Bson, Document};
use duetdb::{Collection, Database, IndexOptions};

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
    /// Serve the MongoDB wire protocol (see the README's "Server" section).
    Serve(duet_server::ServeArgs),
    /// Benchmarks: ycsb, htap, snapshot workloads; `report` regenerates BENCHMARKS.md.
    Bench {
        #[command(subcommand)]
        command: duet_bench::BenchCommand,
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
    },
}

#[derive(Args)]
struct Target {
    /// Data directory (durability is not built yet: nothing is read from or kept in it).
    #[arg(long)]
    data_dir: Option<PathBuf>,
    /// Collection name.
    #[arg(long, short = 'c', default_value = "docs")]
    collection: String,
    /// Files (JSON Lines or JSON array) to load into the collection first.
    #[arg(long)]
    load: Vec<PathBuf>,
}

fn main() {
    if let Err(e) = run(Cli::parse()) {
        eprintln!("error: {e:#}");
        std::process::exit(1);
    }
}

fn open(target: &Target) -> Result<Collection> {
    let db = match &target.data_dir {
        Some(dir) => {
            eprintln!(
                "note: durability is not implemented yet; {} is not read or written: data lives only for this command",
                dir.display()
            );
            Database::open(dir)?
        }
        None => Database::in_memory(),
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
        Box::new(BufReader::new(
            File::open(file).with_context(|| format!("cannot open {}", file.display()))?,
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
    match c.insert_many(docs, !unordered) {
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
        Command::Serve(args) => duet_server::serve_cli(args).map_err(|e| anyhow::anyhow!(e)),
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
            let c = open(&target)?;
            let n = import(&c, &file, unordered)?;
            writeln!(
                out,
                "imported {n} documents into '{}' (in memory; durability is not built yet)",
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
            let c = open(&target)?;
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
            let c = open(&target)?;
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
                },
        } => {
            let strategy: duetdb::Strategy = strategy.parse()?;
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
            };
            writeln!(out, "checking {strategy} for {seconds}s: {scans} scans, {writers} writers, {docs} documents per round")?;
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
            let c = open(&target)?;
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
