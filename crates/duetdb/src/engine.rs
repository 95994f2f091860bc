//! A set of named databases (what a server hosts): create on first use, list, drop.
//!
//! Each database has its own single writer; databases share nothing, so writes
//! to different databases proceed in parallel.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use parking_lot::RwLock;

use crate::database::Database;
use crate::error::{Error, Result};

/// Longest database name accepted (MongoDB: 64 bytes).
pub const MAX_DB_NAME: usize = 63;

/// All databases of one server or embedding process.
pub struct Engine {
    dir: Option<PathBuf>,
    dbs: RwLock<BTreeMap<String, Database>>,
}

impl Engine {
    pub fn in_memory() -> Engine {
        Engine {
            dir: None,
            dbs: RwLock::new(BTreeMap::new()),
        }
    }

    /// An engine whose databases live under `dir` (created when missing).
    /// Durability is not built yet: data is kept in memory only.
    pub fn open(dir: impl AsRef<Path>) -> Result<Engine> {
        let dir = dir.as_ref();
        std::fs::create_dir_all(dir).map_err(|e| {
            Error::Internal(format!(
                "cannot create data directory {}: {e}",
                dir.display()
            ))
        })?;
        tracing::warn!(path = %dir.display(), "durability is not implemented yet: data is kept in memory only");
        Ok(Engine {
            dir: Some(dir.to_path_buf()),
            dbs: RwLock::new(BTreeMap::new()),
        })
    }

    pub fn dir(&self) -> Option<&Path> {
        self.dir.as_deref()
    }

    /// The database `name`, created empty when new.
    pub fn database(&self, name: &str) -> Result<Database> {
        validate_db_name(name)?;
        if let Some(db) = self.dbs.read().get(name) {
            return Ok(db.clone());
        }
        let mut dbs = self.dbs.write();
        let path = self.dir.as_ref().map(|d| d.join(name));
        Ok(dbs
            .entry(name.to_string())
            .or_insert_with(|| Database::named(name, path))
            .clone())
    }

    /// Names of databases that hold at least one collection.
    pub fn list_databases(&self) -> Vec<(String, Database)> {
        self.dbs
            .read()
            .iter()
            .filter(|(_, db)| !db.list_collection_names().is_empty())
            .map(|(n, db)| (n.clone(), db.clone()))
            .collect()
    }

    /// Drop a whole database; `false` when it did not exist.
    pub fn drop_database(&self, name: &str) -> bool {
        self.dbs.write().remove(name).is_some()
    }
}

/// MongoDB's database-name rules.
pub fn validate_db_name(name: &str) -> Result<()> {
    if name.is_empty() || name.len() > MAX_DB_NAME {
        return Err(Error::InvalidNamespace(format!(
            "invalid database name '{name}': length must be 1..={MAX_DB_NAME}"
        )));
    }
    if let Some(c) = name.chars().find(|c| "/\\. \"$*<>:|?\0".contains(*c)) {
        return Err(Error::InvalidNamespace(format!(
            "invalid database name '{name}': contains '{c}'"
        )));
    }
    Ok(())
}
