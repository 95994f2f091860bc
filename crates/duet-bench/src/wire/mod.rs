//! The `wire` target: every workload against a MongoDB-wire server through the
//! official `mongodb` Rust driver, so `duet serve` is measured as a user sees
//! it — and any other MongoDB-compatible server can be measured the same way.
//!
//! How the synchronous workload threads drive the async driver: one tokio
//! runtime per target, shared by all client threads; each client thread
//! `block_on`s its own operation (the driver's `sync` feature does exactly this
//! with a global runtime). The operation future — encoding, the socket write,
//! waiting for the reply, decoding — is polled on the client thread itself; the
//! runtime's workers drive the I/O reactor and the driver's monitors. The
//! connection pool is raised to [`POOL_SIZE`] (unless the URI sets
//! `maxPoolSize`), so every client thread has a connection of its own and the
//! figures measure the server, not a wait for a pooled connection.
//!
//! `--uri self` starts a `duet serve` in this process for the run (see
//! [`spawn`]); otherwise the URI names a running server. Whether the server is
//! duetdb is read from `serverStatus` (a `duet` section): only then are the
//! `$duet` options sent. The target drops and recreates its collections in the
//! database [`WIRE_DB`].
//!
//! Invariants: the client is shut down before the runtime, and the runtime
//! before a spawned server, so no driver task outlives what it talks to.

mod htap;
pub mod snapshot;
mod spawn;
mod ycsb;

pub use spawn::SpawnedServer;

use std::future::IntoFuture;
use std::time::Duration;

use anyhow::{anyhow, Context, Result};
use mongodb::bson::{doc, Bson, Document};
use mongodb::options::ClientOptions;
use mongodb::Client;

/// The database the wire target works in.
pub const WIRE_DB: &str = "duet_bench";

/// Connections the driver may open (above the 32 client threads of the
/// largest YCSB run plus the HTAP analytics and samplers).
pub const POOL_SIZE: u32 = 256;

/// How long the driver may look for the server before an operation fails.
const SELECT_TIMEOUT: Duration = Duration::from_secs(10);

/// What `--uri` names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WireSpec {
    /// `self` (in memory) or `self-durable` (temporary data directory).
    Spawn { durable: bool },
    /// A running server.
    Uri(String),
}

impl WireSpec {
    pub fn parse(s: &str) -> WireSpec {
        match s {
            "self" => WireSpec::Spawn { durable: false },
            "self-durable" => WireSpec::Spawn { durable: true },
            other => WireSpec::Uri(other.to_string()),
        }
    }
}

/// What the server says about itself.
#[derive(Debug, Clone)]
pub struct ServerFacts {
    /// `buildInfo.version` (duetdb reports the MongoDB version it is compatible with).
    pub version: String,
    /// `serverStatus.duet.version`: `Some` exactly when the server is duetdb.
    pub duet_version: Option<String>,
}

/// A MongoDB-wire server reached through the official driver.
pub struct WireTarget {
    client: Client,
    rt: tokio::runtime::Runtime,
    /// Dropped last (fields drop in order): the server outlives its client.
    server: Option<SpawnedServer>,
    facts: ServerFacts,
    /// The URI with any password removed, for the notes.
    shown_uri: String,
    pool_size: Option<u32>,
}

impl WireTarget {
    /// Connect to (or first start) the server `spec` names and ask what it is.
    pub fn connect(spec: &WireSpec) -> Result<WireTarget> {
        let (server, uri) = match spec {
            WireSpec::Spawn { durable } => {
                let s = SpawnedServer::start(*durable)?;
                let uri = s.uri();
                (Some(s), uri)
            }
            WireSpec::Uri(u) => (None, u.clone()),
        };
        let rt = tokio::runtime::Builder::new_multi_thread()
            .enable_all()
            .thread_name("wire-client")
            .build()
            .context("starting the wire client's runtime")?;
        let shown_uri = redact(&uri);
        let (client, facts, pool_size) = rt
            .block_on(async {
                let mut opts = ClientOptions::parse(&uri).await?;
                opts.max_pool_size.get_or_insert(POOL_SIZE);
                opts.server_selection_timeout.get_or_insert(SELECT_TIMEOUT);
                opts.app_name.get_or_insert_with(|| "duet-bench".into());
                let pool_size = opts.max_pool_size;
                let client = Client::with_options(opts)?;
                let facts = server_facts(&client).await?;
                Ok::<_, anyhow::Error>((client, facts, pool_size))
            })
            .with_context(|| format!("connecting to the wire target {shown_uri}"))?;
        Ok(WireTarget {
            client,
            rt,
            server,
            facts,
            shown_uri,
            pool_size,
        })
    }

    pub fn is_duet(&self) -> bool {
        self.facts.duet_version.is_some()
    }

    pub fn facts(&self) -> &ServerFacts {
        &self.facts
    }

    pub fn spawned(&self) -> Option<&SpawnedServer> {
        self.server.as_ref()
    }

    /// The target's name in results: `duetdb-wire`, or `mongo-wire` for a
    /// server that is not duetdb.
    pub fn label(&self) -> String {
        if self.is_duet() {
            "duetdb-wire".into()
        } else {
            "mongo-wire".into()
        }
    }

    /// Exactly what the wire target was, for the result's notes.
    pub fn description(&self) -> String {
        let server = match (&self.facts.duet_version, &self.server) {
            (Some(v), Some(s)) => format!(
                "`duet serve` (duetdb {v}, reports MongoDB {}) spawned in this process on {} ({}; its own tokio runtime)",
                self.facts.version,
                s.addr,
                match &s.data_dir {
                    None => "in-memory engine, like duetdb-embedded".to_string(),
                    Some(d) => format!(
                        "durable: temporary data directory {} with the default WAL durability (fsync group commit), removed afterwards",
                        d.display()
                    ),
                }
            ),
            (Some(v), None) => format!(
                "duetdb {v} (reports MongoDB {}) at {}, not spawned (its durability is whatever it was started with)",
                self.facts.version, self.shown_uri
            ),
            (None, _) => format!(
                "a MongoDB-wire server that is not duetdb (MongoDB {}) at {}: no `$duet` options are sent",
                self.facts.version, self.shown_uri
            ),
        };
        format!(
            "{}: {server}. Client: the official mongodb Rust driver (3.x, async API) on one tokio runtime shared by all client threads, each blocking on its own operation; connection pool up to {} connections; database `{WIRE_DB}`",
            self.label(),
            self.pool_size
                .map_or_else(|| "the driver's default".to_string(), |n| n.to_string()),
        )
    }

    /// Run a future of the driver to completion on this thread.
    fn block_on<F: IntoFuture>(&self, f: F) -> F::Output {
        self.rt.block_on(f.into_future())
    }

    fn database(&self) -> mongodb::Database {
        self.client.database(WIRE_DB)
    }

    fn collection(&self, name: &str) -> mongodb::Collection<Document> {
        self.database().collection(name)
    }

    /// A command in [`WIRE_DB`].
    pub fn command(&self, cmd: Document) -> Result<Document> {
        Ok(self.block_on(self.database().run_command(cmd))?)
    }

    /// `serverStatus.duet.databases[name = WIRE_DB].vls`, when the server
    /// reports it (duetdb, once the database exists).
    fn vls_status(&self) -> Result<Option<Document>> {
        let status = self.block_on(
            self.client
                .database("admin")
                .run_command(doc! {"serverStatus": 1}),
        )?;
        let Ok(dbs) = status
            .get_document("duet")
            .and_then(|d| d.get_array("databases"))
        else {
            return Ok(None);
        };
        Ok(dbs.iter().find_map(|d| match d {
            Bson::Document(d) if d.get_str("name").ok() == Some(WIRE_DB) => {
                d.get_document("vls").ok().cloned()
            }
            _ => None,
        }))
    }
}

impl Drop for WireTarget {
    fn drop(&mut self) {
        // Ends the driver's sessions and monitors while the runtime still runs.
        let client = self.client.clone();
        self.block_on(client.shutdown().immediate(true));
    }
}

async fn server_facts(client: &Client) -> Result<ServerFacts> {
    let admin = client.database("admin");
    let build = admin
        .run_command(doc! {"buildInfo": 1})
        .await
        .context("buildInfo")?;
    let version = build.get_str("version").unwrap_or("unknown").to_string();
    // A server may refuse serverStatus (e.g. missing privileges): then it is
    // treated as not duetdb, which only means `$duet` is not sent.
    let duet_version = admin
        .run_command(doc! {"serverStatus": 1})
        .await
        .ok()
        .and_then(|s| {
            s.get_document("duet")
                .ok()
                .and_then(|d| d.get_str("version").ok())
                .map(String::from)
        });
    Ok(ServerFacts {
        version,
        duet_version,
    })
}

/// `mongodb://user:secret@host/…` → `mongodb://user:***@host/…`.
fn redact(uri: &str) -> String {
    let Some(scheme_end) = uri.find("://").map(|i| i + 3) else {
        return uri.to_string();
    };
    let rest = &uri[scheme_end..];
    let host_end = rest.find('/').unwrap_or(rest.len());
    match rest[..host_end].rfind('@') {
        Some(at) => {
            let user = rest[..at].split(':').next().unwrap_or("");
            format!("{}{user}:***{}", &uri[..scheme_end], &rest[at..])
        }
        None => uri.to_string(),
    }
}

/// A count reply's `n` (Int32 from MongoDB, Int64 from duetdb).
fn count_of(reply: &Document) -> Result<u64> {
    match reply.get("n") {
        Some(Bson::Int32(n)) if *n >= 0 => Ok(*n as u64),
        Some(Bson::Int64(n)) if *n >= 0 => Ok(*n as u64),
        Some(Bson::Double(n)) if *n >= 0.0 && n.fract() == 0.0 => Ok(*n as u64),
        other => Err(anyhow!("count reply without a valid `n`: {other:?}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uri_passwords_are_not_recorded() {
        assert_eq!(
            redact("mongodb://ann:pw@h:1/db?x=1"),
            "mongodb://ann:***@h:1/db?x=1"
        );
        assert_eq!(redact("mongodb://h:1/"), "mongodb://h:1/");
        assert_eq!(WireSpec::parse("self"), WireSpec::Spawn { durable: false });
        assert_eq!(
            WireSpec::parse("mongodb://h"),
            WireSpec::Uri("mongodb://h".into())
        );
    }

    #[test]
    fn counts_accept_every_integer_type() {
        assert_eq!(count_of(&doc! {"n": 3i32}).ok(), Some(3));
        assert_eq!(count_of(&doc! {"n": 3i64}).ok(), Some(3));
        assert!(count_of(&doc! {"n": -1i64}).is_err());
        assert!(count_of(&doc! {"ok": 1}).is_err());
    }
}
