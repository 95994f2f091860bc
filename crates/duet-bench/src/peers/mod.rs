//! Which targets exist in this build and how `--targets` builds them. Peers
//! SQLite and LMDB compile only with the cargo feature `peers`, so ordinary
//! builds and CI stay fast; the PostgreSQL client (`postgres`, pure Rust) is
//! a default feature, so its tests run wherever a server can start.
//! The MongoDB-wire target (`crate::wire`) is built with the default feature
//! `wire`.

/// The `Target` of a peer: its name, its description (recorded in the
/// notes) and its capabilities, YCSB and HTAP (the others measure duetdb's
/// own snapshots).
#[allow(unused_macros)] // unused when no peer is built in
macro_rules! peer_target {
    ($ty:ty, $name:expr, $note:expr) => {
        impl crate::targets::Target for $ty {
            fn name(&self) -> String {
                $name.into()
            }
            fn setup_note(&self) -> Option<String> {
                Some($note.into())
            }
            fn as_ycsb(&self) -> Option<&dyn crate::targets::YcsbTarget> {
                Some(self)
            }
            fn as_htap(&self) -> Option<&dyn crate::targets::HtapTarget> {
                Some(self)
            }
        }
    };
}

#[cfg(feature = "lmdb")]
pub mod lmdb;
#[cfg(feature = "postgres")]
pub mod postgres;
#[cfg(feature = "postgres")]
pub mod postgres_tpcch;
#[cfg(feature = "sqlite")]
pub mod sqlite;

use anyhow::{bail, Result};

use crate::targets::{Embedded, Target};

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

/// Where the client/server targets are.
pub struct Connect<'a> {
    /// `--uri` of the wire target (a URI, `self` or `self-durable`).
    pub uri: &'a str,
    /// `--pg` of the PostgreSQL peer.
    pub pg: &'a str,
}

/// Refuse, before anything is built or started, targets a workload cannot
/// run on: `allowed` with the reason (`what`) in the message.
pub fn only(
    workload: &str,
    names: &[TargetName],
    allowed: &[TargetName],
    what: &str,
) -> Result<()> {
    match names.iter().find(|n| !allowed.contains(n)) {
        Some(other) => bail!("{workload} runs on {what}, not on {other:?}"),
        None => Ok(()),
    }
}

/// Build the named targets, in order.
pub fn build(names: &[TargetName], at: &Connect) -> Result<Vec<Box<dyn Target>>> {
    names.iter().map(|n| build_one(*n, at)).collect()
}

#[allow(unused_variables)] // `at` is unused when no client/server target is built in
fn build_one(name: TargetName, at: &Connect) -> Result<Box<dyn Target>> {
    Ok(match name {
        TargetName::Duet => Box::new(Embedded::new()),
        #[cfg(feature = "wire")]
        TargetName::Wire => Box::new(crate::wire::WireTarget::connect(
            &crate::wire::WireSpec::parse(at.uri),
        )?),
        #[cfg(feature = "sqlite")]
        TargetName::Sqlite => Box::new(sqlite::Sqlite::create()?),
        #[cfg(feature = "postgres")]
        TargetName::Postgres => Box::new(postgres::Postgres::connect(at.pg)?),
        #[cfg(feature = "lmdb")]
        TargetName::Lmdb => Box::new(lmdb::Lmdb::create()?),
        #[allow(unreachable_patterns)]
        other => return Err(not_built(other)),
    })
}

#[allow(dead_code)]
fn not_built(t: TargetName) -> anyhow::Error {
    let (name, feature) = match t {
        TargetName::Duet => return anyhow::anyhow!("duet is always built"),
        TargetName::Wire => ("wire", "wire"),
        TargetName::Sqlite => ("sqlite", "peers"),
        TargetName::Postgres => ("postgres", "peers"),
        TargetName::Lmdb => ("lmdb", "peers"),
    };
    anyhow::anyhow!(
        "target {name} is not built in: rebuild with `--features {feature}` (e.g. cargo run --release -p duet --features {feature} -- bench …)"
    )
}
