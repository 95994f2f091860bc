//! The I/O seam: every file operation of the durability layer goes through
//! [`Vfs`], with a real implementation ([`RealFs`]) and a simulated one
//! ([`SimFs`]) that counts operations, injects failures, and can produce the
//! images a crash could leave on disk.
//!
//! The interface is deliberately narrow — whole-file (or streamed) reads,
//! append-only files, rename, remove, directory sync — because that is all the WAL, checkpoint and
//! manifest code needs, and a narrow interface is one whose crash behaviour we
//! can model completely.
//!
//! The simulated disk's model (what it promises, and therefore what the engine
//! may assume of a real disk):
//! - bytes appended to a file are durable only after `sync` of that file;
//!   until then a crash may keep none, a prefix, a torn prefix, or a subset of
//!   them (sector granularity, holes read back as zeros);
//! - a create, rename or remove is durable only after `sync_dir` of its
//!   directory; until then a crash may keep any subset of the pending
//!   namespace operations, applied in order;
//! - synced bytes and synced directory entries are never lost or changed.

use std::collections::BTreeMap;
use std::fs::{File, OpenOptions};
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use parking_lot::Mutex;

use super::fdcache::CachedFile;

/// An append-only open file.
pub trait VFile: Send + Sync {
    /// Append `buf` at the end of the file.
    fn append(&self, buf: &[u8]) -> io::Result<()>;
    /// Make everything appended so far durable (fdatasync).
    fn sync(&self) -> io::Result<()>;
    /// Cut the file to `len` bytes (used to undo a failed append).
    fn set_len(&self, len: u64) -> io::Result<()>;
}

/// A held directory lock; released on drop.
pub trait DirLock: Send + Sync {}

/// The file system as the durability layer sees it.
pub trait Vfs: Send + Sync {
    fn create_dir_all(&self, dir: &Path) -> io::Result<()>;
    /// Names of the files in `dir` (not sorted).
    fn list(&self, dir: &Path) -> io::Result<Vec<String>>;
    /// Create `path` (it must not exist) for appending.
    fn create(&self, path: &Path) -> io::Result<Arc<dyn VFile>>;
    /// Open an existing file for appending at its end.
    fn open_append(&self, path: &Path) -> io::Result<Arc<dyn VFile>>;
    fn read(&self, path: &Path) -> io::Result<Vec<u8>>;
    /// `path` to read from its start as a stream, so a large file can be
    /// copied without being held in memory whole (the default reads it
    /// whole: fine where files are in memory already, as the simulated
    /// disk's are).
    fn open_read(&self, path: &Path) -> io::Result<Box<dyn io::Read + Send>> {
        Ok(Box::new(io::Cursor::new(self.read(path)?)))
    }
    fn exists(&self, path: &Path) -> bool;
    /// Atomically replace `to` by `from` (durable after `sync_dir`).
    fn rename(&self, from: &Path, to: &Path) -> io::Result<()>;
    fn remove(&self, path: &Path) -> io::Result<()>;
    /// Cut an existing file to `len` bytes and make that durable.
    fn truncate(&self, path: &Path, len: u64) -> io::Result<()>;
    /// Make the directory's entries (creates, renames, removes) durable.
    fn sync_dir(&self, dir: &Path) -> io::Result<()>;
    /// Take an exclusive lock on `path` (created when missing) against other
    /// processes and other opens; fails with `WouldBlock` when held elsewhere.
    fn lock(&self, path: &Path) -> io::Result<Box<dyn DirLock>>;
}

// ---------------------------------------------------------------- real files

/// The real file system (`std::fs`, `fdatasync`, `flock`).
///
/// Everything it creates is private to the owner whatever the umask, as
/// MongoDB does: directories 0700, files 0600 (set explicitly after
/// creation, since the umask only ever removes bits). Appendable files go
/// through the process-wide descriptor cache ([`super::fdcache`]), so the
/// descriptors held open stay bounded however many databases are open.
#[derive(Debug, Default, Clone, Copy)]
pub struct RealFs;

/// Mode of every directory the engine creates.
pub const DIR_MODE: u32 = 0o700;
/// Mode of every file the engine creates.
pub const FILE_MODE: u32 = 0o600;

/// Create `dir` and its missing ancestors, each with mode [`DIR_MODE`].
/// Directories that exist already are left as they are (an operator's
/// choice, e.g. `/tmp`).
pub fn create_private_dir_all(dir: &Path) -> io::Result<()> {
    if dir.as_os_str().is_empty() || dir.is_dir() {
        return Ok(());
    }
    if let Some(parent) = dir.parent() {
        create_private_dir_all(parent)?;
    }
    let mut b = std::fs::DirBuilder::new();
    #[cfg(unix)]
    {
        use std::os::unix::fs::DirBuilderExt;
        b.mode(DIR_MODE);
    }
    match b.create(dir) {
        Ok(()) => set_mode(dir, DIR_MODE),
        // Created meanwhile by someone else: theirs to decide.
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists && dir.is_dir() => Ok(()),
        Err(e) => Err(e),
    }
}

#[cfg(unix)]
fn set_mode(path: &Path, mode: u32) -> io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))
}

#[cfg(not(unix))]
fn set_mode(_path: &Path, _mode: u32) -> io::Result<()> {
    Ok(())
}

/// `options` opening with mode [`FILE_MODE`] when they create the file.
fn private(options: &mut OpenOptions) -> &mut OpenOptions {
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        options.mode(FILE_MODE);
    }
    options
}

/// Give a file just created exactly [`FILE_MODE`] (the umask may have removed bits).
fn fix_file_mode(f: &File) -> io::Result<()> {
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        f.set_permissions(std::fs::Permissions::from_mode(FILE_MODE))?;
    }
    #[cfg(not(unix))]
    let _ = f;
    Ok(())
}

struct RealLock(#[allow(dead_code)] File); // the open descriptor holds the flock

impl DirLock for RealLock {}

impl Vfs for RealFs {
    fn create_dir_all(&self, dir: &Path) -> io::Result<()> {
        create_private_dir_all(dir)
    }
    fn list(&self, dir: &Path) -> io::Result<Vec<String>> {
        let mut out = Vec::new();
        for e in std::fs::read_dir(dir)? {
            let e = e?;
            if e.file_type()?.is_file() {
                if let Some(n) = e.file_name().to_str() {
                    out.push(n.to_string());
                }
            }
        }
        Ok(out)
    }
    fn create(&self, path: &Path) -> io::Result<Arc<dyn VFile>> {
        let f = private(OpenOptions::new().append(true).create_new(true)).open(path)?;
        fix_file_mode(&f)?;
        Ok(CachedFile::new(path, f))
    }
    fn open_append(&self, path: &Path) -> io::Result<Arc<dyn VFile>> {
        let f = OpenOptions::new().append(true).open(path)?;
        Ok(CachedFile::new(path, f))
    }
    fn read(&self, path: &Path) -> io::Result<Vec<u8>> {
        std::fs::read(path)
    }
    fn open_read(&self, path: &Path) -> io::Result<Box<dyn io::Read + Send>> {
        Ok(Box::new(File::open(path)?))
    }
    fn exists(&self, path: &Path) -> bool {
        path.exists()
    }
    fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        std::fs::rename(from, to)
    }
    fn remove(&self, path: &Path) -> io::Result<()> {
        std::fs::remove_file(path)
    }
    fn truncate(&self, path: &Path, len: u64) -> io::Result<()> {
        let f = OpenOptions::new().write(true).open(path)?;
        f.set_len(len)?;
        f.sync_all()
    }
    fn sync_dir(&self, dir: &Path) -> io::Result<()> {
        File::open(dir)?.sync_all()
    }
    fn lock(&self, path: &Path) -> io::Result<Box<dyn DirLock>> {
        let created = !path.exists();
        let f = private(
            OpenOptions::new()
                .read(true)
                .write(true)
                .create(true)
                .truncate(false),
        )
        .open(path)?;
        if created {
            fix_file_mode(&f)?;
        }
        flock_exclusive(&f)?;
        Ok(Box::new(RealLock(f)))
    }
}

#[cfg(unix)]
fn flock_exclusive(f: &File) -> io::Result<()> {
    use std::os::unix::io::AsRawFd;
    // SAFETY: flock on a descriptor we own; no memory is passed to the kernel.
    let rc = unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

#[cfg(not(unix))]
fn flock_exclusive(_f: &File) -> io::Result<()> {
    Ok(()) // no advisory locking off unix: documented in docs/design.md
}

// ------------------------------------------------------------ simulated disk

/// Which error an injected fault raises.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FaultKind {
    /// EIO.
    Io,
    /// ENOSPC.
    NoSpace,
}

/// Kinds of operation, for aiming faults.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OpKind {
    Append,
    Sync,
    SyncDir,
    Create,
    Rename,
    Remove,
    Read,
    Other,
}

/// An injected fault: the `at`-th counted operation (1-based, counting from
/// when it was armed) fails; with `persistent`, every later one does too.
#[derive(Debug, Clone, Copy)]
pub struct Fault {
    pub at: u64,
    pub persistent: bool,
    pub kind: FaultKind,
    /// Only count operations of this kind (`None`: all).
    pub only: Option<OpKind>,
}

#[derive(Debug, Clone, Default)]
struct Inode {
    data: Vec<u8>,
    /// `data[..synced]` is durable.
    synced: usize,
}

#[derive(Debug, Clone)]
enum NsOp {
    Link { name: PathBuf, ino: usize },
    Unlink { name: PathBuf },
}

/// The whole simulated disk at one moment (cheap to clone at test sizes).
#[derive(Debug, Clone, Default)]
pub struct SimState {
    inodes: Vec<Inode>,
    /// The namespace as the running process sees it.
    names: BTreeMap<PathBuf, usize>,
    /// The namespace a crash now would certainly keep.
    durable_names: BTreeMap<PathBuf, usize>,
    /// Namespace operations since the last `sync_dir`, in order.
    pending: Vec<NsOp>,
    dirs: std::collections::BTreeSet<PathBuf>,
}

/// How a crash image is cut from a running disk.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CrashKind {
    /// Only synced bytes and synced directory entries survive.
    DropUnsynced,
    /// Each file keeps a random prefix of its unsynced bytes; a random prefix
    /// of the pending namespace operations is kept.
    RandomPrefix,
    /// A random subset of unsynced sectors survives (holes read as zeros) and
    /// a random subset of pending namespace operations.
    ReorderedSubset,
    /// Random prefix whose last sector is torn (partly garbage).
    TornSector,
    /// Random prefix with one unsynced sector replaced by garbage.
    CorruptSector,
}

pub const SECTOR: usize = 512;

/// A small deterministic generator (xorshift*), so images depend only on a seed.
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }
    pub fn next_u64(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    /// Uniform in `0..n` (`n > 0`).
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n.max(1)
    }
    pub fn chance(&mut self, one_in: u64) -> bool {
        self.below(one_in) == 0
    }
}

impl SimState {
    /// The disk a crash at this moment could leave, cut as `kind` says.
    pub fn crash_image(&self, kind: CrashKind, rng: &mut Rng) -> SimState {
        let mut out = SimState {
            dirs: self.dirs.clone(),
            ..Default::default()
        };
        // Namespace: the durable entries plus some pending operations.
        let mut names = self.durable_names.clone();
        let n_pending = self.pending.len() as u64;
        let keep_upto = match kind {
            CrashKind::DropUnsynced => 0,
            _ => rng.below(n_pending + 1) as usize,
        };
        for (i, op) in self.pending.iter().enumerate() {
            let keep = match kind {
                CrashKind::ReorderedSubset => rng.chance(2),
                _ => i < keep_upto,
            };
            if !keep {
                continue;
            }
            match op {
                NsOp::Link { name, ino } => {
                    names.insert(name.clone(), *ino);
                }
                NsOp::Unlink { name } => {
                    names.remove(name);
                }
            }
        }
        // Contents: renumber the reachable inodes.
        let mut map: BTreeMap<usize, usize> = BTreeMap::new();
        for (name, ino) in names {
            let new = *map.entry(ino).or_insert_with(|| {
                let src = self.inodes.get(ino).cloned().unwrap_or_default();
                out.inodes.push(cut_file(&src, kind, rng));
                out.inodes.len() - 1
            });
            out.names.insert(name, new);
        }
        out.durable_names = out.names.clone();
        out
    }

    /// Total bytes a path holds (tests).
    pub fn file_len(&self, path: &Path) -> Option<usize> {
        self.names
            .get(path)
            .and_then(|i| self.inodes.get(*i))
            .map(|f| f.data.len())
    }

    /// Overwrite one byte of a file in place, as bit rot would (tests).
    pub fn poke(&mut self, path: &Path, offset: usize, byte: u8) -> bool {
        match self.names.get(path).and_then(|i| self.inodes.get_mut(*i)) {
            Some(f) if offset < f.data.len() => {
                f.data[offset] = byte;
                true
            }
            _ => false,
        }
    }

    /// The file names under `dir` (tests).
    pub fn files_in(&self, dir: &Path) -> Vec<String> {
        self.names
            .keys()
            .filter(|p| p.parent() == Some(dir))
            .filter_map(|p| p.file_name().and_then(|n| n.to_str()).map(String::from))
            .collect()
    }
}

fn cut_file(src: &Inode, kind: CrashKind, rng: &mut Rng) -> Inode {
    let synced = src.synced.min(src.data.len());
    let unsynced = src.data.len() - synced;
    let mut data = src.data[..synced].to_vec();
    let keep = match kind {
        CrashKind::DropUnsynced => 0,
        _ => rng.below(unsynced as u64 + 1) as usize,
    };
    data.extend_from_slice(&src.data[synced..synced + keep]);
    match kind {
        CrashKind::DropUnsynced | CrashKind::RandomPrefix => {}
        CrashKind::ReorderedSubset => {
            // Each unsynced sector independently made it or did not.
            let mut s = synced - synced % SECTOR;
            while s < data.len() {
                let e = (s + SECTOR).min(data.len());
                if rng.chance(2) {
                    for b in &mut data[s.max(synced)..e] {
                        *b = 0;
                    }
                }
                s = e;
            }
        }
        CrashKind::TornSector => {
            if keep > 0 {
                let last = (data.len() - 1) / SECTOR * SECTOR;
                let from = last.max(synced) + rng.below(SECTOR as u64) as usize;
                for b in data.iter_mut().skip(from) {
                    *b = rng.next_u64() as u8;
                }
            }
        }
        CrashKind::CorruptSector => {
            if keep > 0 {
                let first = synced / SECTOR;
                let last = (data.len() - 1) / SECTOR;
                let s = (first + rng.below((last - first + 1) as u64) as usize) * SECTOR;
                let e = (s + SECTOR).min(data.len());
                for b in &mut data[s.max(synced)..e] {
                    *b = rng.next_u64() as u8;
                }
            }
        }
    }
    let len = data.len();
    Inode { data, synced: len }
}

/// Statistics of a simulated disk.
#[derive(Debug, Clone, Copy, Default)]
pub struct SimCounters {
    pub ops: u64,
    pub syncs: u64,
    pub dir_syncs: u64,
}

type OpHook = Box<dyn FnMut(OpKind, &SimState) + Send>;

struct SimInner {
    state: SimState,
    counters: SimCounters,
    fault: Option<Fault>,
    /// Operations counted towards `fault` since it was armed.
    fault_count: u64,
    /// Bytes the disk may hold in total (ENOSPC beyond), if limited.
    capacity: Option<usize>,
    locks: std::collections::BTreeSet<PathBuf>,
    hook: Option<OpHook>,
}

/// A simulated disk in memory. Cloning the handle shares the disk.
#[derive(Clone)]
pub struct SimFs {
    inner: Arc<Mutex<SimInner>>,
}

impl std::fmt::Debug for SimFs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SimFs")
    }
}

impl Default for SimFs {
    fn default() -> Self {
        SimFs::new()
    }
}

impl SimFs {
    pub fn new() -> SimFs {
        SimFs::from_state(SimState::default())
    }

    /// A disk holding `state` (e.g. a crash image).
    pub fn from_state(state: SimState) -> SimFs {
        SimFs {
            inner: Arc::new(Mutex::new(SimInner {
                state,
                counters: SimCounters::default(),
                fault: None,
                fault_count: 0,
                capacity: None,
                locks: Default::default(),
                hook: None,
            })),
        }
    }

    /// A copy of the disk as the running process sees it.
    pub fn state(&self) -> SimState {
        self.inner.lock().state.clone()
    }

    pub fn counters(&self) -> SimCounters {
        self.inner.lock().counters
    }

    /// Arm (or with `None`, clear) an injected fault.
    pub fn set_fault(&self, fault: Option<Fault>) {
        let mut g = self.inner.lock();
        g.fault = fault;
        g.fault_count = 0;
    }

    /// Limit the bytes the disk holds (`None`: unlimited).
    pub fn set_capacity(&self, bytes: Option<usize>) {
        self.inner.lock().capacity = bytes;
    }

    /// Call `hook` before every operation with the disk state at that moment:
    /// a crash just before the operation would leave an image of that state.
    pub fn set_hook(&self, hook: Option<OpHook>) {
        self.inner.lock().hook = hook;
    }

    /// Count the operation, run the hook, and fail it if a fault says so.
    fn enter(&self, kind: OpKind) -> io::Result<parking_lot::MutexGuard<'_, SimInner>> {
        let mut g = self.inner.lock();
        g.counters.ops += 1;
        if let Some(mut hook) = g.hook.take() {
            hook(kind, &g.state);
            g.hook = Some(hook);
        }
        if let Some(f) = g.fault {
            if f.only.is_none_or(|o| o == kind) {
                g.fault_count += 1;
                let hit = if f.persistent {
                    g.fault_count >= f.at
                } else {
                    g.fault_count == f.at
                };
                if hit {
                    return Err(match f.kind {
                        FaultKind::Io => io::Error::other("injected I/O error (EIO)"),
                        FaultKind::NoSpace => io::Error::from_raw_os_error(28),
                    });
                }
            }
        }
        Ok(g)
    }
}

fn not_found(p: &Path) -> io::Error {
    io::Error::new(
        io::ErrorKind::NotFound,
        format!("{}: no such file", p.display()),
    )
}

struct SimFile {
    fs: SimFs,
    ino: usize,
}

impl VFile for SimFile {
    fn append(&self, buf: &[u8]) -> io::Result<()> {
        let mut g = self.fs.enter(OpKind::Append)?;
        let used: usize = g.state.inodes.iter().map(|i| i.data.len()).sum();
        let room = g.capacity.map(|c| c.saturating_sub(used));
        let inode = g
            .state
            .inodes
            .get_mut(self.ino)
            .ok_or_else(|| io::Error::other("stale file"))?;
        match room {
            Some(room) if room < buf.len() => {
                // A short write, as a full disk produces.
                inode.data.extend_from_slice(&buf[..room]);
                Err(io::Error::from_raw_os_error(28))
            }
            _ => {
                inode.data.extend_from_slice(buf);
                Ok(())
            }
        }
    }
    fn sync(&self) -> io::Result<()> {
        let mut g = self.fs.enter(OpKind::Sync)?;
        g.counters.syncs += 1;
        if let Some(i) = g.state.inodes.get_mut(self.ino) {
            i.synced = i.data.len();
        }
        Ok(())
    }
    fn set_len(&self, len: u64) -> io::Result<()> {
        let mut g = self.fs.enter(OpKind::Other)?;
        if let Some(i) = g.state.inodes.get_mut(self.ino) {
            i.data.truncate(len as usize);
            i.synced = i.synced.min(i.data.len());
        }
        Ok(())
    }
}

struct SimLock {
    fs: SimFs,
    path: PathBuf,
}

impl DirLock for SimLock {}

impl Drop for SimLock {
    fn drop(&mut self) {
        self.fs.inner.lock().locks.remove(&self.path);
    }
}

impl Vfs for SimFs {
    fn create_dir_all(&self, dir: &Path) -> io::Result<()> {
        let mut g = self.enter(OpKind::Other)?;
        g.state.dirs.insert(dir.to_path_buf());
        Ok(())
    }
    fn list(&self, dir: &Path) -> io::Result<Vec<String>> {
        let g = self.enter(OpKind::Other)?;
        if !g.state.dirs.contains(dir) {
            return Err(not_found(dir));
        }
        Ok(g.state.files_in(dir))
    }
    fn create(&self, path: &Path) -> io::Result<Arc<dyn VFile>> {
        let mut g = self.enter(OpKind::Create)?;
        if g.state.names.contains_key(path) {
            return Err(io::Error::new(
                io::ErrorKind::AlreadyExists,
                format!("{} exists", path.display()),
            ));
        }
        g.state.inodes.push(Inode::default());
        let ino = g.state.inodes.len() - 1;
        g.state.names.insert(path.to_path_buf(), ino);
        g.state.pending.push(NsOp::Link {
            name: path.to_path_buf(),
            ino,
        });
        Ok(Arc::new(SimFile {
            fs: self.clone(),
            ino,
        }))
    }
    fn open_append(&self, path: &Path) -> io::Result<Arc<dyn VFile>> {
        let g = self.enter(OpKind::Other)?;
        let ino = *g.state.names.get(path).ok_or_else(|| not_found(path))?;
        Ok(Arc::new(SimFile {
            fs: self.clone(),
            ino,
        }))
    }
    fn read(&self, path: &Path) -> io::Result<Vec<u8>> {
        let g = self.enter(OpKind::Read)?;
        let ino = *g.state.names.get(path).ok_or_else(|| not_found(path))?;
        Ok(g.state
            .inodes
            .get(ino)
            .map(|i| i.data.clone())
            .unwrap_or_default())
    }
    fn exists(&self, path: &Path) -> bool {
        self.inner.lock().state.names.contains_key(path)
    }
    fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        let mut g = self.enter(OpKind::Rename)?;
        let ino = g.state.names.remove(from).ok_or_else(|| not_found(from))?;
        g.state.names.insert(to.to_path_buf(), ino);
        g.state.pending.push(NsOp::Link {
            name: to.to_path_buf(),
            ino,
        });
        g.state.pending.push(NsOp::Unlink {
            name: from.to_path_buf(),
        });
        Ok(())
    }
    fn remove(&self, path: &Path) -> io::Result<()> {
        let mut g = self.enter(OpKind::Remove)?;
        g.state.names.remove(path).ok_or_else(|| not_found(path))?;
        g.state.pending.push(NsOp::Unlink {
            name: path.to_path_buf(),
        });
        Ok(())
    }
    fn truncate(&self, path: &Path, len: u64) -> io::Result<()> {
        let mut g = self.enter(OpKind::Sync)?;
        let ino = *g.state.names.get(path).ok_or_else(|| not_found(path))?;
        if let Some(i) = g.state.inodes.get_mut(ino) {
            i.data.truncate(len as usize);
            i.synced = i.data.len();
        }
        Ok(())
    }
    fn sync_dir(&self, dir: &Path) -> io::Result<()> {
        let mut g = self.enter(OpKind::SyncDir)?;
        g.counters.dir_syncs += 1;
        let pending = std::mem::take(&mut g.state.pending);
        let mut rest = Vec::new();
        for op in pending {
            let name = match &op {
                NsOp::Link { name, .. } | NsOp::Unlink { name } => name,
            };
            if name.parent() != Some(dir) {
                rest.push(op);
                continue;
            }
            match op {
                NsOp::Link { name, ino } => {
                    g.state.durable_names.insert(name, ino);
                }
                NsOp::Unlink { name } => {
                    g.state.durable_names.remove(&name);
                }
            }
        }
        g.state.pending = rest;
        Ok(())
    }
    fn lock(&self, path: &Path) -> io::Result<Box<dyn DirLock>> {
        let mut g = self.enter(OpKind::Other)?;
        if !g.locks.insert(path.to_path_buf()) {
            return Err(io::Error::new(
                io::ErrorKind::WouldBlock,
                "lock held by another opener",
            ));
        }
        Ok(Box::new(SimLock {
            fs: self.clone(),
            path: path.to_path_buf(),
        }))
    }
}
