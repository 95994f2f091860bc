//! `--uri self` / `--uri self-durable`: a `duet serve` started inside this
//! process for the run, on a free loopback port, with its own tokio runtime
//! (so the server's async work never shares worker threads with the driver's)
//! and stopped gracefully when dropped.
//!
//! Invariants:
//! - the server listens on 127.0.0.1 only (it has no auth);
//! - `self` runs an in-memory engine (the same as the embedded target, so the
//!   comparison isolates the server); `self-durable` runs on a fresh temporary
//!   data directory with the engine's default durability (WAL, `fsync` group
//!   commit), removed when the server is dropped;
//! - dropping stops accepting, waits for the server to return (it lets
//!   commands in flight finish), then shuts the runtime down.
//!
//! [`ServeProcess`] is the other way: `duet serve` as a child process, for
//! what a server in this process cannot show (a member SIGKILLed in the
//! replication benchmark). A child is killed and reaped when dropped, so no
//! member outlives the run; its output goes to a log file of its own.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};
use duet_server::{Config, Server, ServerState};
use tokio::sync::oneshot;

/// How long dropping a spawned server waits for it to return.
const STOP_WAIT: Duration = Duration::from_secs(15);

pub struct SpawnedServer {
    pub addr: SocketAddr,
    /// `Some` for `self-durable`: the temporary data directory.
    pub data_dir: Option<PathBuf>,
    /// `None` only while dropping (released before the data directory is removed).
    state: Option<Arc<ServerState>>,
    stop: Option<oneshot::Sender<()>>,
    done: Option<tokio::task::JoinHandle<std::io::Result<()>>>,
    rt: Option<tokio::runtime::Runtime>,
}

impl SpawnedServer {
    /// Start `duet serve` on 127.0.0.1 with a port the OS picks.
    pub fn start(durable: bool) -> Result<SpawnedServer> {
        SpawnedServer::start_with(durable, |_| {})
    }

    /// [`SpawnedServer::start`] with the configuration changed by `configure`.
    pub fn start_with(durable: bool, configure: impl FnOnce(&mut Config)) -> Result<SpawnedServer> {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .enable_all()
            .thread_name("duet-serve")
            .build()
            .context("starting the spawned server's runtime")?;
        let data_dir = if durable {
            let nanos = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.subsec_nanos());
            let dir = std::env::temp_dir()
                .join(format!("duet-bench-serve-{}-{nanos}", std::process::id()));
            Some(dir)
        } else {
            None
        };
        let engine = match &data_dir {
            Some(dir) => duetdb::Engine::open(dir)
                .with_context(|| format!("opening a data directory at {}", dir.display()))?,
            None => duetdb::Engine::in_memory(),
        };
        let mut config = Config {
            bind: "127.0.0.1".into(),
            port: 0,
            data_dir: data_dir.clone(),
            // The space benchmark's queries use `$duet.workNsPerDoc`.
            enable_test_knobs: true,
            ..Config::default()
        };
        configure(&mut config);
        let state = ServerState::new(engine, config);
        let server = rt
            .block_on(Server::bind(state.clone()))
            .context("binding the spawned server to 127.0.0.1")?;
        let addr = server.local_addr()?;
        let (tx, rx) = oneshot::channel::<()>();
        let done = rt.spawn(server.run(async move {
            let _ = rx.await;
        }));
        Ok(SpawnedServer {
            addr,
            data_dir,
            state: Some(state),
            stop: Some(tx),
            done: Some(done),
            rt: Some(rt),
        })
    }

    pub fn uri(&self) -> String {
        format!("mongodb://{}/?directConnection=true", self.addr)
    }

    /// The server's engine, for what no command offers: resetting the remset
    /// peak counters at the start of a measured cell.
    pub fn engine(&self) -> Option<&duetdb::Engine> {
        self.state.as_ref().map(|s| &*s.engine)
    }
}

impl Drop for SpawnedServer {
    fn drop(&mut self) {
        if let Some(tx) = self.stop.take() {
            let _ = tx.send(());
        }
        if let (Some(rt), Some(done)) = (self.rt.take(), self.done.take()) {
            let r = rt.block_on(async { tokio::time::timeout(STOP_WAIT, done).await });
            if !matches!(r, Ok(Ok(Ok(())))) {
                eprintln!("warning: the spawned duet serve did not stop cleanly");
            }
            rt.shutdown_timeout(STOP_WAIT);
        }
        // The engine (and its files) goes before its directory.
        drop(self.state.take());
        if let Some(dir) = &self.data_dir {
            let _ = std::fs::remove_dir_all(dir);
        }
    }
}

/// `duet serve` as a child process (see the module comment).
pub struct ServeProcess {
    exe: PathBuf,
    args: Vec<String>,
    log: PathBuf,
    /// `None` after [`ServeProcess::kill`] until [`ServeProcess::restart`].
    child: Option<Child>,
}

impl ServeProcess {
    /// Start `exe` with `args`, its stdout and stderr appended to `log`.
    pub fn start(exe: &Path, args: &[String], log: &Path) -> Result<ServeProcess> {
        let mut p = ServeProcess {
            exe: exe.to_path_buf(),
            args: args.to_vec(),
            log: log.to_path_buf(),
            child: None,
        };
        p.restart()?;
        Ok(p)
    }

    /// Start it again with the same arguments (after [`ServeProcess::kill`]).
    pub fn restart(&mut self) -> Result<()> {
        self.kill()?;
        let out = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .with_context(|| format!("opening {}", self.log.display()))?;
        let err = out.try_clone()?;
        let child = Command::new(&self.exe)
            .args(&self.args)
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .spawn()
            .with_context(|| format!("spawning {} serve", self.exe.display()))?;
        self.child = Some(child);
        Ok(())
    }

    /// SIGKILL (no shutdown of any kind), then reap it.
    pub fn kill(&mut self) -> Result<()> {
        if let Some(mut c) = self.child.take() {
            if c.try_wait()?.is_none() {
                c.kill().context("killing duet serve")?;
            }
            c.wait()?;
        }
        Ok(())
    }
}

impl Drop for ServeProcess {
    fn drop(&mut self) {
        let _ = self.kill();
    }
}
