//! PostgreSQL peer (the `postgres` crate, no TLS; loopback only — start one
//! with `scripts/peers/postgres.sh start`). Documents as `jsonb` with a bigint
//! primary key and an expression index on `(doc->>'v')::bigint`; YCSB uses the
//! JDBC binding's `usertable`. Analytic queries run under REPEATABLE READ while
//! updates run; space is the table's total size and its dead tuples, which a
//! long snapshot keeps vacuum from reclaiming. Sessions set
//! `synchronous_commit = off`, since the duetdb target is not durable either.

use std::io::Write;
use std::sync::Mutex;

use anyhow::{anyhow, Context, Result};
use postgres::{Client, NoTls};

use crate::targets::{
    checked_ident, htap_json, Field, HtapSession, HtapTarget, Strategy, VPerm, YcsbSession,
    YcsbTarget,
};

pub const DESCRIPTION: &str = "postgres: PostgreSQL on 127.0.0.1 (scripts/peers/postgres.sh), synchronous_commit=off, one connection per thread; analytics under REPEATABLE READ; documents as jsonb with primary key and expression index on (doc->>'v')::bigint; autovacuum on (defaults)";

pub struct Postgres {
    conn: String,
    /// For space figures, sampled while the workload runs.
    monitor: Mutex<Client>,
}

impl Postgres {
    pub fn connect(conn: &str) -> Result<Postgres> {
        let monitor = Client::connect(conn, NoTls).with_context(|| {
            format!(
                "connecting to PostgreSQL ({conn}); start it with scripts/peers/postgres.sh start"
            )
        })?;
        Ok(Postgres {
            conn: conn.to_string(),
            monitor: Mutex::new(monitor),
        })
    }

    fn client(&self) -> Result<Client> {
        let mut c = Client::connect(&self.conn, NoTls)?;
        c.batch_execute("SET synchronous_commit = off")?;
        Ok(c)
    }
}

struct Session {
    c: Client,
}

peer_target!(Postgres, "postgres", DESCRIPTION);

impl YcsbTarget for Postgres {
    fn reset(&self) -> Result<()> {
        self.client()?
            .batch_execute("DROP TABLE IF EXISTS usertable")?;
        Ok(())
    }
    fn session(&self) -> Result<Box<dyn YcsbSession + '_>> {
        Ok(Box::new(Session { c: self.client()? }))
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
        // CREATE TABLE IF NOT EXISTS is not safe against itself in PostgreSQL
        // (two sessions can both pass the check and one fails on the catalog's
        // unique index), and load threads insert concurrently.
        static CREATE: std::sync::Mutex<()> = std::sync::Mutex::new(());
        let one_at_a_time = CREATE.lock().unwrap_or_else(|e| e.into_inner());
        self.c.batch_execute(&format!(
            "CREATE TABLE IF NOT EXISTS usertable (ycsb_key TEXT PRIMARY KEY, {})",
            cols.iter()
                .map(|c| format!("{c} TEXT"))
                .collect::<Vec<_>>()
                .join(", ")
        ))?;
        drop(one_at_a_time);
        let mut tx = self.c.transaction()?;
        let sql = format!(
            "INSERT INTO usertable (ycsb_key, {}) VALUES ({})",
            cols.join(", "),
            (1..=cols.len() + 1)
                .map(|i| format!("${i}"))
                .collect::<Vec<_>>()
                .join(", ")
        );
        let st = tx.prepare(&sql)?;
        for (key, fields) in records {
            let mut vals: Vec<&(dyn postgres::types::ToSql + Sync)> = vec![key];
            vals.extend(
                fields
                    .iter()
                    .map(|(_, v)| v as &(dyn postgres::types::ToSql + Sync)),
            );
            tx.execute(&st, &vals)?;
        }
        tx.commit()?;
        Ok(())
    }
    fn insert(&mut self, key: &str, fields: &[Field]) -> Result<()> {
        self.insert_batch(&[(key.to_string(), fields.to_vec())])
    }
    fn read(&mut self, key: &str) -> Result<bool> {
        Ok(!self
            .c
            .query("SELECT * FROM usertable WHERE ycsb_key = $1", &[&key])?
            .is_empty())
    }
    fn update(&mut self, key: &str, fields: &[Field]) -> Result<bool> {
        let mut n = 0;
        for (k, v) in fields {
            let sql = format!(
                "UPDATE usertable SET {} = $1 WHERE ycsb_key = $2",
                checked_ident(k)?
            );
            n = self.c.execute(&sql, &[v, &key])?;
        }
        Ok(n > 0)
    }
    fn scan(&mut self, start: &str, count: usize) -> Result<usize> {
        Ok(self
            .c
            .query(
                "SELECT * FROM usertable WHERE ycsb_key >= $1 ORDER BY ycsb_key LIMIT $2",
                &[&start, &(count as i64)],
            )?
            .len())
    }
}

impl HtapTarget for Postgres {
    fn strategy_label(&self, _: Strategy) -> Result<String> {
        Ok("REPEATABLE READ transaction (MVCC snapshot)".into())
    }
    fn native_strategy(&self) -> Option<String> {
        Some("native: REPEATABLE READ transaction (MVCC snapshot)".into())
    }
    fn load(&self, records: u64) -> Result<()> {
        let mut c = self.client()?;
        c.batch_execute(
            "DROP TABLE IF EXISTS htap; CREATE TABLE htap (id bigint PRIMARY KEY, doc jsonb NOT NULL)",
        )?;
        let perm = VPerm::new(records);
        let mut w = c.copy_in("COPY htap (id, doc) FROM STDIN")?;
        for i in 0..records {
            // JSON text never holds a tab or newline here (no such characters generated).
            writeln!(w, "{i}\t{}", htap_json(i, &perm))?;
        }
        w.finish()?;
        c.batch_execute("CREATE INDEX htap_v ON htap (((doc->>'v')::bigint))")?;
        // VACUUM may not run inside the implicit transaction of a multi-statement batch.
        c.batch_execute("VACUUM ANALYZE htap")?;
        Ok(())
    }
    fn session(&self) -> Result<Box<dyn HtapSession + '_>> {
        Ok(Box::new(Session { c: self.client()? }))
    }
    fn space(&self) -> Result<Vec<(String, f64)>> {
        let mut c = self
            .monitor
            .lock()
            .map_err(|_| anyhow!("postgres monitor poisoned"))?;
        let row = c.query_one(
            "SELECT pg_total_relation_size('htap')::float8 / 1048576.0, \
             coalesce((SELECT n_dead_tup FROM pg_stat_user_tables WHERE relname = 'htap'), 0)::float8",
            &[],
        )?;
        Ok(vec![
            ("table_mb".into(), row.get(0)),
            ("dead_tuples".into(), row.get(1)),
        ])
    }
}

impl HtapSession for Session {
    fn update(&mut self, id: u64, payload: &str) -> Result<()> {
        let n = self.c.execute(
            "UPDATE htap SET doc = jsonb_set(doc, '{f2}', to_jsonb($1::text)) WHERE id = $2",
            &[&payload, &(id as i64)],
        )?;
        anyhow::ensure!(n == 1, "document {id} missing");
        Ok(())
    }
    fn full_scan_count(&mut self, _: Strategy) -> Result<u64> {
        let mut tx = self
            .c
            .build_transaction()
            .isolation_level(postgres::IsolationLevel::RepeatableRead)
            .start()?;
        let n: i64 = tx
            .query_one(
                "SELECT count(*) FROM htap WHERE (doc->>'b')::bigint >= 0",
                &[],
            )?
            .get(0);
        tx.commit()?;
        Ok(n as u64)
    }
    fn range_count(&mut self, lo: u64, hi: u64, _: Strategy) -> Result<u64> {
        let mut tx = self
            .c
            .build_transaction()
            .isolation_level(postgres::IsolationLevel::RepeatableRead)
            .start()?;
        let n: i64 = tx
            .query_one(
                "SELECT count(*) FROM htap WHERE (doc->>'v')::bigint >= $1 AND (doc->>'v')::bigint < $2",
                &[&(lo as i64), &(hi as i64)],
            )?
            .get(0);
        tx.commit()?;
        Ok(n as u64)
    }
}
