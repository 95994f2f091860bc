//! Which targets exist in this build and how to build them from the common
//! flags. Peers (SQLite, PostgreSQL) compile only with the cargo feature
//! `peers`, so ordinary builds and CI stay fast; LMDB with `lmdb` (included
//! in `peers`). The MongoDB-wire target (`crate::wire`) is built with the
//! default feature `wire`.

#[cfg(feature = "lmdb")]
pub mod lmdb;
#[cfg(feature = "postgres")]
pub mod postgres;
#[cfg(feature = "sqlite")]
pub mod sqlite;

use anyhow::Result;

use crate::cli::Common;
use crate::target::{Embedded, HtapTarget, YcsbTarget};

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum TargetName {
    /// duetdb in process.
    Duet,
    /// A MongoDB-wire server (`--uri`) through the official `mongodb` driver.
    Wire,
    /// SQLite in WAL mode (rusqlite, bundled).
    Sqlite,
    /// PostgreSQL (`--pg`), documents as jsonb.
    Postgres,
    /// LMDB through heed.
    Lmdb,
}

fn missing(name: &str, feature: &str) -> anyhow::Error {
    anyhow::anyhow!(
        "target {name} is not built in: rebuild with `--features {feature}` (e.g. cargo run --release -p duet --features {feature} -- bench …)"
    )
}

/// Notes on how the targets are set up, recorded with the result.
pub fn notes(c: &Common) -> Vec<String> {
    let mut notes = Vec::new();
    if c.targets.contains(&TargetName::Duet) {
        notes.push("duetdb-embedded: in-memory database in this process (no WAL)".into());
    }
    #[cfg(feature = "sqlite")]
    if c.targets.contains(&TargetName::Sqlite) {
        notes.push(sqlite::DESCRIPTION.into());
    }
    #[cfg(feature = "postgres")]
    if c.targets.contains(&TargetName::Postgres) {
        notes.push(postgres::DESCRIPTION.into());
    }
    #[cfg(feature = "lmdb")]
    if c.targets.contains(&TargetName::Lmdb) {
        notes.push(lmdb::DESCRIPTION.into());
    }
    notes
}

pub fn ycsb_targets(c: &Common) -> Result<Vec<Box<dyn YcsbTarget>>> {
    let mut out: Vec<Box<dyn YcsbTarget>> = Vec::new();
    for t in &c.targets {
        match t {
            TargetName::Duet => out.push(Box::new(Embedded::new())),
            #[cfg(feature = "wire")]
            TargetName::Wire => out.push(Box::new(wire_target(&c.uri)?)),
            #[cfg(feature = "sqlite")]
            TargetName::Sqlite => out.push(Box::new(sqlite::Sqlite::create()?)),
            #[cfg(feature = "postgres")]
            TargetName::Postgres => out.push(Box::new(postgres::Postgres::connect(&c.pg)?)),
            #[cfg(feature = "lmdb")]
            TargetName::Lmdb => out.push(Box::new(lmdb::Lmdb::create()?)),
            #[allow(unreachable_patterns)]
            other => return Err(not_built(*other)),
        }
    }
    Ok(out)
}

pub fn htap_targets(c: &Common) -> Result<Vec<Box<dyn HtapTarget>>> {
    let mut out: Vec<Box<dyn HtapTarget>> = Vec::new();
    for t in &c.targets {
        match t {
            TargetName::Duet => out.push(Box::new(Embedded::new())),
            #[cfg(feature = "wire")]
            TargetName::Wire => out.push(Box::new(wire_target(&c.uri)?)),
            #[cfg(feature = "sqlite")]
            TargetName::Sqlite => out.push(Box::new(sqlite::Sqlite::create()?)),
            #[cfg(feature = "postgres")]
            TargetName::Postgres => out.push(Box::new(postgres::Postgres::connect(&c.pg)?)),
            #[cfg(feature = "lmdb")]
            TargetName::Lmdb => out.push(Box::new(lmdb::Lmdb::create()?)),
            #[allow(unreachable_patterns)]
            other => return Err(not_built(*other)),
        }
    }
    Ok(out)
}

#[allow(dead_code)]
fn not_built(t: TargetName) -> anyhow::Error {
    match t {
        TargetName::Duet => anyhow::anyhow!("duet is always built"),
        TargetName::Wire => missing("wire", "wire"),
        TargetName::Sqlite => missing("sqlite", "peers"),
        TargetName::Postgres => missing("postgres", "peers"),
        TargetName::Lmdb => missing("lmdb", "peers"),
    }
}

#[cfg(feature = "wire")]
fn wire_target(uri: &str) -> Result<crate::wire::WireTarget> {
    crate::wire::WireTarget::connect(&crate::wire::WireSpec::parse(uri))
}

/// Which `snapshot` runs the targets ask for: (embedded, wire).
pub fn snapshot_targets(targets: &[TargetName]) -> Result<(bool, bool)> {
    let mut out = (false, false);
    for t in targets {
        match t {
            TargetName::Duet => out.0 = true,
            TargetName::Wire => out.1 = true,
            other => anyhow::bail!(
                "snapshot runs on duet (in process) and wire (named snapshots over the wire), not on {other:?}: it measures duetdb's own snapshots"
            ),
        }
    }
    Ok(out)
}

/// `snapshot` over the wire (`crate::wire::snapshot`).
#[cfg(feature = "wire")]
pub fn run_wire_snapshot(
    uri: &str,
    p: &crate::workload::snapshot::Params,
    quiet: bool,
    col: &mut crate::result::Collector,
    notes: &mut Vec<String>,
) -> Result<()> {
    let spec = crate::wire::WireSpec::parse(uri);
    crate::wire::snapshot::run(&spec, p, quiet, col, notes)
}

/// `snapshot` over the wire: not built without the `wire` feature.
#[cfg(not(feature = "wire"))]
pub fn run_wire_snapshot(
    _uri: &str,
    _p: &crate::workload::snapshot::Params,
    _quiet: bool,
    _col: &mut crate::result::Collector,
    _notes: &mut Vec<String>,
) -> Result<()> {
    Err(not_built(TargetName::Wire))
}

/// Which `space` runs the targets ask for: (embedded, wire). Other targets
/// are refused: space measures duetdb's own old versions.
pub fn space_targets(targets: &[TargetName]) -> Result<(bool, bool)> {
    let mut out = (false, false);
    for t in targets {
        match t {
            TargetName::Duet => out.0 = true,
            TargetName::Wire => out.1 = true,
            other => anyhow::bail!(
                "space runs on duet (in process) and wire (a duetdb server), not on {other:?}: it measures duetdb's own old versions"
            ),
        }
    }
    Ok(out)
}

/// `space` over the wire (`crate::wire::space`).
#[cfg(feature = "wire")]
pub fn run_wire_space(
    uri: &str,
    p: &crate::workload::space::Params,
    quiet: bool,
    col: &mut crate::result::Collector,
    series: &mut Vec<crate::result::Series>,
    notes: &mut Vec<String>,
) -> Result<()> {
    let spec = crate::wire::WireSpec::parse(uri);
    crate::wire::space::run(&spec, p, quiet, col, series, notes)
}

/// `space` over the wire: not built without the `wire` feature.
#[cfg(not(feature = "wire"))]
pub fn run_wire_space(
    _uri: &str,
    _p: &crate::workload::space::Params,
    _quiet: bool,
    _col: &mut crate::result::Collector,
    _series: &mut Vec<crate::result::Series>,
    _notes: &mut Vec<String>,
) -> Result<()> {
    Err(not_built(TargetName::Wire))
}
