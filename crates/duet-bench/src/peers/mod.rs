//! Which targets exist in this build and how to build them from the common
//! flags. Peers (SQLite, PostgreSQL) compile only with the cargo feature
//! `peers`, so ordinary builds and CI stay fast. The MongoDB-wire target is
//! named here but not implemented yet (a clear error says so).

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
        notes.push(
            "duetdb-embedded: in-memory database in this process (durability not built yet)".into(),
        );
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
        TargetName::Wire => anyhow::anyhow!(
            "the wire target is not implemented yet (see BENCHMARKS.md: the MongoDB-wire server is being written)"
        ),
        TargetName::Sqlite => missing("sqlite", "peers"),
        TargetName::Postgres => missing("postgres", "peers"),
        TargetName::Lmdb => missing("lmdb", "peers"),
    }
}
