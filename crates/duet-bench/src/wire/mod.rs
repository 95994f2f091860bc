//! The `wire` target: every workload against a MongoDB-wire server through the
//! official `mongodb` Rust driver, so `duet serve` is measured as a user sees
//! it — and any other MongoDB-compatible server can be measured the same way.
//!
//! How the synchronous workload threads drive the async driver: each client
//! thread works through a [`Lane`] of its own — a current-thread tokio runtime
//! and a driver `Client` created on it — and blocks on its operations there,
//! so the thread that waits for the reply also drives its socket. One shared
//! multi-threaded runtime (or the driver's `sync` feature, which is the same
//! thing with a global runtime) adds two thread hand-offs per operation on
//! the client side: measured here on loopback, a `ping` took ~180–230 µs that
//! way vs ~105 µs with a lane per thread, i.e. the shared runtime would charge
//! client overhead to the server. Lanes are pooled and reused: they are
//! created (and connected, with a `ping`) when a run first needs them, so the
//! timed phases that follow a load never pay for connection set-up.
//!
//! The wire target serves every workload capability (`crate::targets`):
//! YCSB and HTAP on any MongoDB-wire server, `snapshot` and `space` only on
//! duetdb, whose own commands they need (`as_snapshot`/`as_space` are `None`
//! for another server, and the workload refuses it before it runs).
//!
//! `--uri self` starts a `duet serve` in this process for the run (see
//! [`spawn`]); otherwise the URI names a running server. Whether the server is
//! duetdb is read from `serverStatus` (a `duet` section): only then are the
//! `$duet` options sent. The target drops and recreates its collections in the
//! database [`WIRE_DB`].
//!
//! Invariants: every lane's client is shut down on its own runtime before that
//! runtime is dropped, and all lanes before a spawned server is stopped, so no
//! driver task outlives what it talks to.

pub mod group_commit;
mod htap;
mod insert_stream;
pub mod latency;
pub mod replication;
mod snapshot;
mod space;
mod spawn;
mod ycsb;

pub use spawn::SpawnedServer;

use std::future::IntoFuture;
use std::sync::Mutex;
use std::time::Duration;

use anyhow::{anyhow, Context, Result};
use mongodb::bson::{doc, Bson, Document};
use mongodb::options::ClientOptions;
use mongodb::Client;

use crate::targets::{HtapTarget, SnapshotTarget, SpaceTarget, Target, YcsbTarget};

/// The database the wire target works in.
pub const WIRE_DB: &str = "duet_bench";

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

/// One client thread's driver: a current-thread runtime and a client on it.
pub struct Lane {
    // `client` is shut down in `WireTarget::drop` before `rt` goes.
    client: Client,
    rt: tokio::runtime::Runtime,
}

impl Lane {
    fn open(opts: &ClientOptions) -> Result<Lane> {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .context("starting a wire client runtime")?;
        let client = rt.block_on(async {
            let client = Client::with_options(opts.clone())?;
            // Connect now, so no measured operation pays for the handshake.
            client
                .database("admin")
                .run_command(doc! {"ping": 1})
                .await?;
            Ok::<_, mongodb::error::Error>(client)
        })?;
        Ok(Lane { client, rt })
    }

    /// Run a driver operation to completion on this thread.
    pub fn block_on<F: IntoFuture>(&self, f: F) -> F::Output {
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

    fn admin_command(&self, cmd: Document) -> Result<Document> {
        Ok(self.block_on(self.client.database("admin").run_command(cmd))?)
    }

    /// The named snapshots `listSnapshots` reports.
    fn snapshots(&self) -> Result<Vec<Document>> {
        let r = self.command(doc! {"listSnapshots": 1})?;
        let list = r.get_array("snapshots").context("listSnapshots reply")?;
        Ok(list
            .iter()
            .filter_map(|s| match s {
                Bson::Document(d) => Some(d.clone()),
                _ => None,
            })
            .collect())
    }

    /// Drop every named snapshot whose name starts with `prefix`.
    fn drop_snapshots(&self, prefix: &str) -> Result<()> {
        for s in self.snapshots()? {
            if let Ok(n) = s.get_str("name") {
                if n.starts_with(prefix) {
                    self.command(doc! {"dropSnapshot": n})?;
                }
            }
        }
        Ok(())
    }

    /// `serverStatus.duet.databases[name = WIRE_DB].vls`, when the server
    /// reports it (duetdb, once the database exists).
    fn vls_status(&self) -> Result<Option<Document>> {
        let status = self.admin_command(doc! {"serverStatus": 1})?;
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

/// A lane borrowed from the target's pool; returned when dropped.
pub struct LaneGuard<'a> {
    pool: &'a Mutex<Vec<Lane>>,
    lane: Option<Lane>,
}

impl std::ops::Deref for LaneGuard<'_> {
    type Target = Lane;
    fn deref(&self) -> &Lane {
        // Requires: `lane` is `Some` until `drop` (set at creation, taken only there).
        self.lane
            .as_ref()
            .expect("a lane guard holds its lane until dropped")
    }
}

impl Drop for LaneGuard<'_> {
    fn drop(&mut self) {
        if let (Some(lane), Ok(mut pool)) = (self.lane.take(), self.pool.lock()) {
            pool.push(lane);
        }
    }
}

/// A MongoDB-wire server reached through the official driver.
pub struct WireTarget {
    opts: ClientOptions,
    /// Idle lanes (see the module comment).
    lanes: Mutex<Vec<Lane>>,
    /// Dropped last (fields drop in order, after `Drop::drop` closed the lanes).
    server: Option<SpawnedServer>,
    facts: ServerFacts,
    /// The URI with any password removed, for the notes.
    shown_uri: String,
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
        let shown_uri = redact(&uri);
        let parse_rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .context("starting a wire client runtime")?;
        let mut opts = parse_rt
            .block_on(ClientOptions::parse(&uri).into_future())
            .with_context(|| format!("parsing the wire URI {shown_uri}"))?;
        opts.server_selection_timeout.get_or_insert(SELECT_TIMEOUT);
        opts.app_name.get_or_insert_with(|| "duet-bench".into());
        let lane = Lane::open(&opts)
            .with_context(|| format!("connecting to the wire target {shown_uri}"))?;
        let facts = server_facts(&lane).context("asking the wire target what it is")?;
        Ok(WireTarget {
            opts,
            lanes: Mutex::new(vec![lane]),
            server,
            facts,
            shown_uri,
        })
    }

    /// A lane for one client thread: an idle one, or a new connection.
    pub fn lane(&self) -> Result<LaneGuard<'_>> {
        let idle = self
            .lanes
            .lock()
            .map_err(|_| anyhow!("wire lane pool poisoned"))?
            .pop();
        let lane = match idle {
            Some(l) => l,
            None => Lane::open(&self.opts)
                .with_context(|| format!("connecting to the wire target {}", self.shown_uri))?,
        };
        Ok(LaneGuard {
            pool: &self.lanes,
            lane: Some(lane),
        })
    }

    /// A command in [`WIRE_DB`] on any lane.
    pub fn command(&self, cmd: Document) -> Result<Document> {
        self.lane()?.command(cmd)
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
            "{}: {server}. Client: the official mongodb Rust driver (3.x, async API); each client thread has its own driver client and connection on a current-thread tokio runtime it blocks on, set up before the timed phases; database `{WIRE_DB}`",
            self.label(),
        )
    }

    /// As [`Lane::vls_status`], on any lane.
    fn vls_status(&self) -> Result<Option<Document>> {
        self.lane()?.vls_status()
    }

    /// Restart the engine's peak counters (remset) for a measured cell. No
    /// command does that, so it is done in process for a spawned server (the
    /// only figure not taken over the wire) and not at all otherwise.
    fn reset_peaks(&self) {
        if let Some(db) = self
            .spawned()
            .and_then(|s| s.engine())
            .and_then(|e| e.database(WIRE_DB).ok())
        {
            db.reset_vls_peaks();
        }
    }
}

impl Target for WireTarget {
    fn name(&self) -> String {
        self.label()
    }
    fn setup_note(&self) -> Option<String> {
        Some(self.description())
    }
    fn as_ycsb(&self) -> Option<&dyn YcsbTarget> {
        Some(self)
    }
    fn as_htap(&self) -> Option<&dyn HtapTarget> {
        Some(self)
    }
    /// Named snapshots are duetdb's own commands.
    fn as_snapshot(&self) -> Option<&dyn SnapshotTarget> {
        self.is_duet().then_some(self as &dyn SnapshotTarget)
    }
    /// `$duet.workNsPerDoc`, named snapshots and `serverStatus.duet` are duetdb's own.
    fn as_space(&self) -> Option<&dyn SpaceTarget> {
        self.is_duet().then_some(self as &dyn SpaceTarget)
    }
}

impl Drop for WireTarget {
    fn drop(&mut self) {
        // Each client ends its sessions and monitors on its own runtime.
        let lanes = match self.lanes.get_mut() {
            Ok(l) => std::mem::take(l),
            Err(poisoned) => std::mem::take(poisoned.into_inner()),
        };
        for lane in lanes {
            let client = lane.client.clone();
            lane.block_on(client.shutdown().immediate(true));
        }
    }
}

fn server_facts(lane: &Lane) -> Result<ServerFacts> {
    let build = lane
        .admin_command(doc! {"buildInfo": 1})
        .context("buildInfo")?;
    let version = build.get_str("version").unwrap_or("unknown").to_string();
    // A server may refuse serverStatus (e.g. missing privileges): then it is
    // treated as not duetdb, which only means `$duet` is not sent.
    let duet_version = lane
        .admin_command(doc! {"serverStatus": 1})
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
