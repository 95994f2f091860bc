//! SQLite peer (rusqlite, bundled SQLite) in WAL mode: one connection per
//! client thread on a file in the temp directory (removed on drop). YCSB uses
//! the JDBC binding's `usertable` layout; HTAP stores documents as JSON text
//! with an expression index on `v`. An analytic query runs inside a read
//! transaction, which in WAL mode holds a consistent snapshot for its duration
//! (and keeps the WAL from being checkpointed past it: `wal_mb` grows).

use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};

use anyhow::{Context, Result};
use rusqlite::{params, Connection};

use crate::targets::{
    checked_ident, htap_json, Field, HtapSession, HtapTarget, Strategy, VPerm, YcsbSession,
    YcsbTarget,
};

pub const DESCRIPTION: &str = "sqlite-wal: SQLite (bundled) on a temp file, journal_mode=WAL, synchronous=NORMAL, one connection per thread; analytics in a read transaction (WAL snapshot); documents as JSON text with an expression index on v";

static NEXT: AtomicU64 = AtomicU64::new(0);

pub struct Sqlite {
    path: PathBuf,
}

impl Sqlite {
    pub fn create() -> Result<Sqlite> {
        let path = std::env::temp_dir().join(format!(
            "duet-bench-sqlite-{}-{}.db",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        ));
        let s = Sqlite { path };
        s.open()?;
        Ok(s)
    }

    fn open(&self) -> Result<Connection> {
        let c = Connection::open(&self.path)
            .with_context(|| format!("opening {}", self.path.display()))?;
        c.pragma_update(None, "journal_mode", "WAL")?;
        c.pragma_update(None, "synchronous", "NORMAL")?;
        c.busy_timeout(std::time::Duration::from_secs(30))?;
        Ok(c)
    }

    fn file_mb(&self, suffix: &str) -> f64 {
        let mut p = self.path.clone().into_os_string();
        p.push(suffix);
        std::fs::metadata(p).map_or(0.0, |m| m.len() as f64 / 1048576.0)
    }
}

impl Drop for Sqlite {
    fn drop(&mut self) {
        for suffix in ["", "-wal", "-shm"] {
            let mut p = self.path.clone().into_os_string();
            p.push(suffix);
            let _ = std::fs::remove_file(p);
        }
    }
}

struct Session {
    c: Connection,
}

peer_target!(Sqlite, "sqlite-wal", DESCRIPTION);

impl YcsbTarget for Sqlite {
    fn reset(&self) -> Result<()> {
        self.open()?
            .execute_batch("DROP TABLE IF EXISTS usertable")?;
        Ok(())
    }
    fn session(&self) -> Result<Box<dyn YcsbSession + '_>> {
        Ok(Box::new(Session { c: self.open()? }))
    }
}

impl YcsbSession for Session {
    fn insert_batch(&mut self, records: &[(String, Vec<Field>)]) -> Result<()> {
        let Some((_, first)) = records.first() else {
            return Ok(());
        };
        let cols: Vec<&str> = first
            .iter()
            .map(|(k, _)| checked_ident(k))
            .collect::<Result<_>>()?;
        let ddl = format!(
            "CREATE TABLE IF NOT EXISTS usertable (ycsb_key TEXT PRIMARY KEY, {})",
            cols.iter()
                .map(|c| format!("{c} TEXT"))
                .collect::<Vec<_>>()
                .join(", ")
        );
        self.c.execute_batch(&ddl)?;
        let tx = self.c.transaction()?;
        {
            let sql = format!(
                "INSERT INTO usertable (ycsb_key, {}) VALUES (?{})",
                cols.join(", "),
                ", ?".repeat(cols.len())
            );
            let mut st = tx.prepare_cached(&sql)?;
            for (key, fields) in records {
                let mut vals: Vec<&dyn rusqlite::ToSql> = vec![key];
                vals.extend(fields.iter().map(|(_, v)| v as &dyn rusqlite::ToSql));
                st.execute(vals.as_slice())?;
            }
        }
        tx.commit()?;
        Ok(())
    }
    fn insert(&mut self, key: &str, fields: &[Field]) -> Result<()> {
        self.insert_batch(&[(key.to_string(), fields.to_vec())])
    }
    fn read(&mut self, key: &str) -> Result<bool> {
        let mut st = self
            .c
            .prepare_cached("SELECT * FROM usertable WHERE ycsb_key = ?")?;
        let mut rows = st.query([key])?;
        Ok(rows.next()?.is_some())
    }
    fn update(&mut self, key: &str, fields: &[Field]) -> Result<bool> {
        let mut n = 0;
        for (k, v) in fields {
            let sql = format!(
                "UPDATE usertable SET {} = ? WHERE ycsb_key = ?",
                checked_ident(k)?
            );
            n = self.c.prepare_cached(&sql)?.execute(params![v, key])?;
        }
        Ok(n > 0)
    }
    fn scan(&mut self, start: &str, count: usize) -> Result<usize> {
        let mut st = self.c.prepare_cached(
            "SELECT * FROM usertable WHERE ycsb_key >= ? ORDER BY ycsb_key LIMIT ?",
        )?;
        let mut rows = st.query(params![start, count as i64])?;
        let mut n = 0;
        while rows.next()?.is_some() {
            n += 1;
        }
        Ok(n)
    }
}

impl HtapTarget for Sqlite {
    fn strategy_label(&self, _: Strategy) -> Result<String> {
        Ok("read transaction (WAL snapshot)".into())
    }
    fn native_strategy(&self) -> Option<String> {
        Some("native: read transaction (WAL snapshot)".into())
    }
    fn load(&self, records: u64) -> Result<()> {
        let mut c = self.open()?;
        c.execute_batch(
            "DROP TABLE IF EXISTS htap; CREATE TABLE htap (id INTEGER PRIMARY KEY, doc TEXT NOT NULL)",
        )?;
        let perm = VPerm::new(records);
        let tx = c.transaction()?;
        {
            let mut st = tx.prepare("INSERT INTO htap (id, doc) VALUES (?, ?)")?;
            for i in 0..records {
                st.execute(params![i as i64, htap_json(i, &perm)])?;
            }
        }
        tx.commit()?;
        c.execute_batch(
            "CREATE INDEX htap_v ON htap (json_extract(doc, '$.v')); PRAGMA wal_checkpoint(TRUNCATE)",
        )?;
        Ok(())
    }
    fn session(&self) -> Result<Box<dyn HtapSession + '_>> {
        Ok(Box::new(Session { c: self.open()? }))
    }
    fn space(&self) -> Result<Vec<(String, f64)>> {
        Ok(vec![
            ("db_mb".into(), self.file_mb("")),
            ("wal_mb".into(), self.file_mb("-wal")),
        ])
    }
}

impl HtapSession for Session {
    fn update(&mut self, id: u64, payload: &str) -> Result<()> {
        let n = self
            .c
            .prepare_cached("UPDATE htap SET doc = json_set(doc, '$.f2', ?) WHERE id = ?")?
            .execute(params![payload, id as i64])?;
        anyhow::ensure!(n == 1, "document {id} missing");
        Ok(())
    }
    fn full_scan_count(&mut self, _: Strategy) -> Result<u64> {
        let tx = self.c.transaction()?;
        let n: i64 = tx.query_row(
            "SELECT count(*) FROM htap WHERE json_extract(doc, '$.b') >= 0",
            [],
            |r| r.get(0),
        )?;
        tx.commit()?;
        Ok(n as u64)
    }
    fn range_count(&mut self, lo: u64, hi: u64, _: Strategy) -> Result<u64> {
        let tx = self.c.transaction()?;
        let n: i64 = tx.query_row(
            "SELECT count(*) FROM htap WHERE json_extract(doc, '$.v') >= ? AND json_extract(doc, '$.v') < ?",
            params![lo as i64, hi as i64],
            |r| r.get(0),
        )?;
        tx.commit()?;
        Ok(n as u64)
    }
}
