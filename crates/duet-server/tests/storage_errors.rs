//! What a client sees when the disk refuses a write (issue 14, item 7): the
//! storage error's MongoDB code and a message naming the file and the OS
//! error — not code 1 (InternalError).
//!
//! The server runs on a real data directory whose file system wrapper turns
//! every change into a chosen OS error once switched on (tests often run as
//! root, whom `chmod` does not stop).

use std::io;
use std::path::Path;
use std::sync::atomic::{AtomicI32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use duet_server::{Config, Server, ServerState};
use duetdb::storage::{DirLock, RealFs, VFile, Vfs};
use mongodb::bson::{doc, Document};
use mongodb::Client;

struct Failing {
    errno: Arc<AtomicI32>,
}

struct FailingFile {
    inner: Arc<dyn VFile>,
    errno: Arc<AtomicI32>,
}

fn check(errno: &AtomicI32) -> io::Result<()> {
    match errno.load(Ordering::SeqCst) {
        0 => Ok(()),
        n => Err(io::Error::from_raw_os_error(n)),
    }
}

impl VFile for FailingFile {
    fn append(&self, buf: &[u8]) -> io::Result<()> {
        check(&self.errno)?;
        self.inner.append(buf)
    }
    fn sync(&self) -> io::Result<()> {
        check(&self.errno)?;
        self.inner.sync()
    }
    fn set_len(&self, len: u64) -> io::Result<()> {
        self.inner.set_len(len)
    }
}

impl Failing {
    fn wrap(&self, f: Arc<dyn VFile>) -> Arc<dyn VFile> {
        Arc::new(FailingFile {
            inner: f,
            errno: self.errno.clone(),
        })
    }
}

impl Vfs for Failing {
    fn create_dir_all(&self, dir: &Path) -> io::Result<()> {
        RealFs.create_dir_all(dir)
    }
    fn list(&self, dir: &Path) -> io::Result<Vec<String>> {
        RealFs.list(dir)
    }
    fn create(&self, path: &Path) -> io::Result<Arc<dyn VFile>> {
        check(&self.errno)?;
        RealFs.create(path).map(|f| self.wrap(f))
    }
    fn open_append(&self, path: &Path) -> io::Result<Arc<dyn VFile>> {
        RealFs.open_append(path).map(|f| self.wrap(f))
    }
    fn read(&self, path: &Path) -> io::Result<Vec<u8>> {
        RealFs.read(path)
    }
    fn exists(&self, path: &Path) -> bool {
        RealFs.exists(path)
    }
    fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        check(&self.errno)?;
        RealFs.rename(from, to)
    }
    fn remove(&self, path: &Path) -> io::Result<()> {
        check(&self.errno)?;
        RealFs.remove(path)
    }
    fn truncate(&self, path: &Path, len: u64) -> io::Result<()> {
        check(&self.errno)?;
        RealFs.truncate(path, len)
    }
    fn sync_dir(&self, dir: &Path) -> io::Result<()> {
        check(&self.errno)?;
        RealFs.sync_dir(dir)
    }
    fn lock(&self, path: &Path) -> io::Result<Box<dyn DirLock>> {
        check(&self.errno)?;
        RealFs.lock(path)
    }
}

/// The code and message of a failed insert, whether the server answered it
/// as a command error or as a `writeErrors` entry.
fn failure(reply: &Document) -> Option<(i32, String)> {
    if let Ok(errors) = reply.get_array("writeErrors") {
        let e = errors.first()?.as_document()?;
        return Some((
            e.get_i32("code").ok()?,
            e.get_str("errmsg").ok()?.to_string(),
        ));
    }
    Some((
        reply.get_i32("code").ok()?,
        reply.get_str("errmsg").ok()?.to_string(),
    ))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_disk_write_reaches_the_client_with_its_storage_code() {
    let tmp = tempfile_dir();
    let switch = Arc::new(AtomicI32::new(0));
    let options = duetdb::DurabilityOptions {
        vfs: Arc::new(Failing {
            errno: switch.clone(),
        }),
        background_checkpoints: false,
        ..Default::default()
    };
    let engine = duetdb::Engine::open_with(&tmp, options).expect("engine");
    let config = Config {
        port: 0,
        data_dir: None,
        message_timeout: Duration::from_millis(800),
        ..Config::default()
    };
    let server = Server::bind(ServerState::new(engine, config))
        .await
        .expect("bind");
    let addr = server.local_addr().expect("addr");
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let done = tokio::spawn(server.run(async move {
        let _ = stopped.await;
    }));
    let client = Client::with_uri_str(format!("mongodb://{addr}/?directConnection=true"))
        .await
        .expect("client");
    let db = client.database("shop");
    let insert = |id: i32| doc! {"insert": "c", "documents": [{"_id": id}]};
    let ok = db.run_command(insert(1)).await.expect("insert");
    assert!(failure(&ok).is_none(), "{ok}");
    for (errno, code, name) in [
        (EROFS, 20, "Read-only file system"),
        (ENOSPC, 14031, "No space left on device"),
    ] {
        switch.store(errno, Ordering::SeqCst);
        let reply = match db.run_command(insert(2)).await {
            Ok(reply) => reply,
            Err(e) => match *e.kind {
                mongodb::error::ErrorKind::Command(c) => {
                    doc! {"code": c.code, "errmsg": c.message}
                }
                other => panic!("unexpected driver error {other:?}"),
            },
        };
        let (got, msg) = failure(&reply).expect("the insert failed");
        assert_eq!(got, code, "errno {errno}: {reply}");
        assert!(
            msg.contains(&tmp.join("shop").display().to_string()) && msg.contains(name),
            "errno {errno}: {msg}"
        );
        switch.store(0, Ordering::SeqCst);
    }
    let count = db.run_command(doc! {"count": "c"}).await.expect("count");
    let n = count
        .get_i64("n")
        .or_else(|_| count.get_i32("n").map(i64::from));
    assert_eq!(n.ok(), Some(1), "the refused inserts left nothing: {count}");
    let _ = stop.send(());
    done.await.expect("join").expect("server run");
    let _ = std::fs::remove_dir_all(&tmp);
}

/// Linux's numbers (the server crate does not depend on libc).
const EROFS: i32 = 30;
const ENOSPC: i32 = 28;

/// A fresh directory under the temp dir (the server crate has no tempfile).
fn tempfile_dir() -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!(
        "duet-storage-errors-{}-{}",
        std::process::id(),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos())
    ));
    std::fs::create_dir_all(&dir).expect("mkdir");
    dir
}
