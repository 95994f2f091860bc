//! A set of named databases (what a server hosts): create on first use, list, drop.
//!
//! Each database has its own single writer; databases share nothing, so writes
//! to different databases proceed in parallel.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use parking_lot::RwLock;

use crate::api::Database;
use crate::durability::DurabilityOptions;
use crate::error::{Error, Result};

/// Longest database name accepted (MongoDB: 64 bytes).
pub const MAX_DB_NAME: usize = 63;

/// All databases of one server or embedding process.
pub struct Engine {
    dir: Option<PathBuf>,
    options: DurabilityOptions,
    dbs: RwLock<BTreeMap<String, Database>>,
}

impl Engine {
    pub fn in_memory() -> Engine {
        Engine {
            dir: None,
            options: DurabilityOptions::default(),
            dbs: RwLock::new(BTreeMap::new()),
        }
    }

    /// An engine whose databases live under `dir` (created when missing), one
    /// durable database per subdirectory; existing ones are opened (recovered) now.
    pub fn open(dir: impl AsRef<Path>) -> Result<Engine> {
        Engine::open_with(dir, DurabilityOptions::default())
    }

    /// [`Engine::open`] with the durability options every database uses.
    pub fn open_with(dir: impl AsRef<Path>, options: DurabilityOptions) -> Result<Engine> {
        let dir = dir.as_ref();
        std::fs::create_dir_all(dir).map_err(|e| {
            Error::Internal(format!(
                "cannot create data directory {}: {e}",
                dir.display()
            ))
        })?;
        let mut dbs = BTreeMap::new();
        let entries = std::fs::read_dir(dir).map_err(|e| {
            Error::Internal(format!("cannot list data directory {}: {e}", dir.display()))
        })?;
        for entry in entries.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            if entry.path().is_dir() && validate_db_name(&name).is_ok() {
                let db = Database::open_named(&name, &entry.path(), options.clone())?;
                dbs.insert(name, db);
            }
        }
        Ok(Engine {
            dir: Some(dir.to_path_buf()),
            options,
            dbs: RwLock::new(dbs),
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
        if let Some(db) = dbs.get(name) {
            return Ok(db.clone());
        }
        let db = match &self.dir {
            Some(d) => Database::open_named(name, &d.join(name), self.options.clone())?,
            None => Database::named(name, None),
        };
        dbs.insert(name.to_string(), db.clone());
        Ok(db)
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

    /// Drop a whole database; `false` when it did not exist. A durable
    /// database's directory is deleted once this engine's handle is closed
    /// (handles cloned out earlier keep working on unlinked files until dropped).
    pub fn drop_database(&self, name: &str) -> bool {
        let Some(db) = self.dbs.write().remove(name) else {
            return false;
        };
        let path = db.path().map(Path::to_path_buf);
        drop(db);
        if let Some(p) = path {
            if let Err(e) = std::fs::remove_dir_all(&p) {
                tracing::warn!(path = %p.display(), error = %e, "could not delete dropped database");
            }
        }
        true
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
