//! The data-directory campaign: damage each file of a durable database in
//! turn and check that opening it either recovers every acknowledged write
//! or refuses with an error naming that file — never opens with less.
//!
//! Build: a database with small WAL segments writes acknowledged (`fsync`)
//! inserts, replacements and deletes into two collections, against a model
//! updated after each acknowledgement; on the way it checkpoints twice (so
//! the older segments are cleaned up and two checkpoints are installed),
//! pins a durable named snapshot (its model taken at that moment), and is
//! closed and reopened once (one more segment). Then it is closed cleanly.
//!
//! Cases: for every file of the directory and every [`Damage`], a fresh copy
//! of the directory is damaged and opened. A case passes when:
//! - the database opens, holds exactly the model (every acknowledged write,
//!   nothing else), its pinned snapshot reads exactly as its model or fails
//!   with an error naming the damaged file, and a second open of the same
//!   copy agrees (recovery did nothing destructive); or
//! - the open fails with an error whose message names the damaged file.
//!
//! Anything else — a state with fewer or other writes, an error that does
//! not name the file, a panic — is a violation. Because the database was
//! closed cleanly, the manifest vouches for the whole log, so not even the
//! last record may be cut as a torn write (docs/design.md §13.5).
//!
//! Runs on the simulated disk (fast; the test suite) or on real files under
//! a directory (`duet check datadir --real`). Used by
//! `tests/datadir_campaign.rs` and `duet check datadir`.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bson::{doc, Document};

use crate::api::{Database, Snapshot};
use crate::durability::io::{RealFs, Rng, SimFs, SimState, Vfs};
use crate::durability::wal::{read_frame, SEGMENT_MAGIC};
use crate::durability::{Durability, DurabilityOptions};
use crate::snapshot::named::SnapshotOptions;

/// What the campaign builds and where.
#[derive(Debug, Clone)]
pub struct DatadirConfig {
    /// Acknowledged write operations.
    pub writes: usize,
    /// WAL segment size (small: many segments).
    pub segment_bytes: u64,
    pub seed: u64,
    /// `None`: the simulated disk. `Some(dir)`: real files, in fresh
    /// subdirectories of `dir` (removed afterwards).
    pub real_dir: Option<PathBuf>,
}

impl Default for DatadirConfig {
    fn default() -> Self {
        DatadirConfig {
            writes: 240,
            segment_bytes: 2048,
            seed: 1,
            real_dir: None,
        }
    }
}

/// One way of damaging a file.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Damage {
    Delete,
    TruncateToZero,
    TruncateToHalf,
    TruncateLastByte,
    FlipHeaderByte,
    FlipMiddleByte,
    /// A byte in the middle of the last record (the last frame's payload;
    /// the checksum's last byte for the manifest).
    FlipLastRecordByte,
}

pub const DAMAGES: [Damage; 7] = [
    Damage::Delete,
    Damage::TruncateToZero,
    Damage::TruncateToHalf,
    Damage::TruncateLastByte,
    Damage::FlipHeaderByte,
    Damage::FlipMiddleByte,
    Damage::FlipLastRecordByte,
];

impl std::fmt::Display for Damage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Damage::Delete => "delete",
            Damage::TruncateToZero => "truncate to 0",
            Damage::TruncateToHalf => "truncate to half",
            Damage::TruncateLastByte => "truncate by 1 byte",
            Damage::FlipHeaderByte => "flip a header byte",
            Damage::FlipMiddleByte => "flip a middle byte",
            Damage::FlipLastRecordByte => "flip a byte of the last record",
        })
    }
}

/// How a case ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Outcome {
    /// Opened with every acknowledged write (and the pinned snapshot intact).
    Intact,
    /// Opened with every acknowledged write; the pinned snapshot's read
    /// failed with an error naming the damaged file.
    PinUnreadable,
    /// Refused to open with an error naming the damaged file.
    Refused,
    /// The damage does not apply (an empty file has no byte to flip or halve).
    NotApplicable,
    /// A promise broken: see the case's detail.
    Violation,
}

impl std::fmt::Display for Outcome {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Outcome::Intact => "intact",
            Outcome::PinUnreadable => "intact, snapshot unreadable",
            Outcome::Refused => "refused",
            Outcome::NotApplicable => "n/a",
            Outcome::Violation => "VIOLATION",
        })
    }
}

/// One damaged copy and what opening it did.
#[derive(Debug, Clone)]
pub struct Case {
    /// The file's kind and name (`wal-…`, `ckpt-…`, …).
    pub file: String,
    pub damage: Damage,
    pub outcome: Outcome,
    /// The error, or what went wrong.
    pub detail: String,
}

/// The campaign's result.
#[derive(Debug, Clone, Default)]
pub struct DatadirReport {
    /// The files of the built directory, with their sizes.
    pub files: Vec<(String, u64)>,
    pub acked_writes: usize,
    pub documents: usize,
    pub cases: Vec<Case>,
    pub elapsed: Duration,
}

impl DatadirReport {
    pub fn violations(&self) -> Vec<&Case> {
        self.cases
            .iter()
            .filter(|c| c.outcome == Outcome::Violation)
            .collect()
    }

    /// Outcome counts per kind of file and damage: `(kind, damage) → outcome → n`.
    pub fn table(&self) -> BTreeMap<(String, Damage), BTreeMap<Outcome, usize>> {
        let mut t: BTreeMap<(String, Damage), BTreeMap<Outcome, usize>> = BTreeMap::new();
        for c in &self.cases {
            *t.entry((file_kind(&c.file).to_string(), c.damage))
                .or_default()
                .entry(c.outcome)
                .or_default() += 1;
        }
        t
    }
}

impl std::fmt::Display for DatadirReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        writeln!(
            f,
            "{} acknowledged writes ({} documents), {} files, {} cases in {:.1?}",
            self.acked_writes,
            self.documents,
            self.files.len(),
            self.cases.len(),
            self.elapsed
        )?;
        for ((kind, damage), outcomes) in self.table() {
            let list: Vec<String> = outcomes.iter().map(|(o, n)| format!("{o} ×{n}")).collect();
            writeln!(
                f,
                "  {kind:<9} {:<31} {}",
                damage.to_string(),
                list.join(", ")
            )?;
        }
        let v = self.violations();
        writeln!(f, "{} violations", v.len())?;
        for c in v {
            writeln!(f, "  VIOLATION {} / {}: {}", c.file, c.damage, c.detail)?;
        }
        Ok(())
    }
}

/// The kind of a data-directory file, for the summary.
pub fn file_kind(name: &str) -> &'static str {
    if name.starts_with("wal-") {
        "wal"
    } else if name.starts_with("ckpt-") {
        "ckpt"
    } else if name.starts_with("snap-") {
        "snapshot"
    } else if name == "MANIFEST" {
        "MANIFEST"
    } else if name == "LOCK" {
        "LOCK"
    } else {
        "other"
    }
}

const PIN: &str = "campaign";
const COLLECTIONS: [&str; 2] = ["items", "other"];

/// Collection → `_id` → document.
type Model = BTreeMap<String, BTreeMap<i64, Document>>;

/// Where the directory lives: a simulated disk or real files.
enum Medium {
    Sim(SimState),
    Real { base: PathBuf, built: PathBuf },
}

/// A copy of the built directory to damage and open.
struct Copy {
    vfs: Arc<dyn Vfs>,
    dir: PathBuf,
    /// Real files: removed when the case is done.
    cleanup: Option<PathBuf>,
}

impl Drop for Copy {
    fn drop(&mut self) {
        if let Some(p) = &self.cleanup {
            let _ = std::fs::remove_dir_all(p);
        }
    }
}

impl Medium {
    fn files(&self) -> Result<Vec<(String, u64)>, String> {
        let copy = self.copy(usize::MAX)?;
        let mut names = copy.vfs.list(&copy.dir).map_err(|e| e.to_string())?;
        names.sort();
        names
            .into_iter()
            .map(|n| {
                let len = copy
                    .vfs
                    .read(&copy.dir.join(&n))
                    .map_or(0, |b| b.len() as u64);
                Ok((n, len))
            })
            .collect()
    }

    fn copy(&self, case: usize) -> Result<Copy, String> {
        match self {
            Medium::Sim(state) => Ok(Copy {
                vfs: Arc::new(SimFs::from_state(state.clone())),
                dir: sim_dir(),
                cleanup: None,
            }),
            Medium::Real { base, built } => {
                let dir = base.join(format!("case-{case}"));
                let _ = std::fs::remove_dir_all(&dir);
                std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
                let entries = std::fs::read_dir(built).map_err(|e| e.to_string())?;
                for e in entries {
                    let e = e.map_err(|e| e.to_string())?;
                    if e.path().is_file() {
                        std::fs::copy(e.path(), dir.join(e.file_name()))
                            .map_err(|err| format!("copy {}: {err}", e.path().display()))?;
                    }
                }
                Ok(Copy {
                    vfs: Arc::new(RealFs),
                    dir: dir.clone(),
                    cleanup: Some(dir),
                })
            }
        }
    }
}

fn sim_dir() -> PathBuf {
    PathBuf::from("/campaign/db")
}

fn options(vfs: Arc<dyn Vfs>, segment_bytes: u64) -> DurabilityOptions {
    DurabilityOptions {
        mode: Durability::Fsync,
        segment_bytes,
        checkpoint_wal_bytes: u64::MAX,
        checkpoint_interval: None,
        background_checkpoints: false,
        vfs,
        // No change-history segments: every segment on disk is one recovery
        // may need, which is what this campaign damages (history segments
        // are never read by recovery; `tests/changes.rs` covers them).
        change_retention_bytes: 0,
        ..Default::default()
    }
}

/// Run the campaign.
pub fn run(cfg: &DatadirConfig) -> Result<DatadirReport, String> {
    let t0 = Instant::now();
    let (medium, model, pin_model, acked) = build(cfg)?;
    let mut report = DatadirReport {
        files: medium.files()?,
        acked_writes: acked,
        documents: model.values().map(BTreeMap::len).sum(),
        ..Default::default()
    };
    let files = report.files.clone();
    for (name, len) in &files {
        for damage in DAMAGES {
            let n = report.cases.len();
            let case = run_case(&medium, cfg, n, name, *len, damage, &model, &pin_model);
            report.cases.push(case);
        }
    }
    if let Medium::Real { base, .. } = &medium {
        let _ = std::fs::remove_dir_all(base);
    }
    report.elapsed = t0.elapsed();
    Ok(report)
}

/// Build the database; returns the medium, the final model, the pinned
/// snapshot's model and the number of acknowledged writes.
fn build(cfg: &DatadirConfig) -> Result<(Medium, Model, Model, usize), String> {
    let (vfs, dir, sim, base): (Arc<dyn Vfs>, PathBuf, Option<SimFs>, Option<PathBuf>) =
        match &cfg.real_dir {
            None => {
                let fs = SimFs::new();
                (Arc::new(fs.clone()), sim_dir(), Some(fs), None)
            }
            Some(root) => {
                let base = root.join(format!("duet-datadir-{}-{}", std::process::id(), cfg.seed));
                if base.exists() {
                    return Err(format!("{} exists: remove it first", base.display()));
                }
                (Arc::new(RealFs), base.join("built"), None, Some(base))
            }
        };
    let opts = options(vfs, cfg.segment_bytes);
    let err = |what: &str, e: crate::error::Error| format!("build: {what}: {e}");
    let mut db = Database::open_with(&dir, opts.clone()).map_err(|e| err("open", e))?;
    let mut rng = Rng::new(cfg.seed);
    let mut model = Model::new();
    let mut pin_model = Model::new();
    let mut next_id = 0i64;
    let n = cfg.writes.max(8);
    for i in 0..n {
        if i == n / 4 || i == 7 * n / 10 {
            db.checkpoint().map_err(|e| err("checkpoint", e))?;
        }
        if i == 2 * n / 5 {
            db.create_snapshot_with(
                PIN,
                SnapshotOptions {
                    collections: None,
                    ttl: None,
                    durable: true,
                },
            )
            .map_err(|e| err("pin", e))?;
            pin_model = model.clone();
        }
        if i == 11 * n / 20 {
            drop(db);
            db = Database::open_with(&dir, opts.clone()).map_err(|e| err("reopen", e))?;
        }
        write(&db, &mut rng, &mut model, &mut next_id, i).map_err(|e| err("write", e))?;
    }
    drop(db);
    let medium = match (sim, base) {
        (Some(fs), _) => Medium::Sim(fs.state()),
        (None, Some(base)) => Medium::Real { base, built: dir },
        (None, None) => return Err("no medium".into()),
    };
    Ok((medium, model, pin_model, n))
}

/// One acknowledged write, applied to the model after it returned.
fn write(
    db: &Database,
    rng: &mut Rng,
    model: &mut Model,
    next_id: &mut i64,
    step: usize,
) -> crate::error::Result<()> {
    let coll = COLLECTIONS[usize::from(rng.chance(5))];
    let c = db.collection(coll);
    let docs = model.entry(coll.to_string()).or_default();
    let pick = (!docs.is_empty()).then(|| {
        let k = rng.below(docs.len() as u64) as usize;
        docs.keys().nth(k).copied().unwrap_or_default()
    });
    let body = |id: i64, rng: &mut Rng| {
        doc! {"_id": id, "step": step as i64, "v": rng.below(1000) as i64, "pad": "p".repeat(rng.below(120) as usize)}
    };
    match (rng.below(10), pick) {
        (0..=2, Some(id)) => {
            let d = body(id, rng);
            c.replace_one(doc! {"_id": id}, d.clone())?;
            docs.insert(id, d);
        }
        (3, Some(id)) => {
            c.delete_one(doc! {"_id": id})?;
            docs.remove(&id);
        }
        _ => {
            let batch: Vec<Document> = (0..1 + rng.below(3))
                .map(|_| {
                    *next_id += 1;
                    body(*next_id, rng)
                })
                .collect();
            c.insert_many(batch.clone(), true)?;
            for d in batch {
                if let Ok(id) = d.get_i64("_id") {
                    docs.insert(id, d);
                }
            }
        }
    }
    Ok(())
}

/// Damage a fresh copy of `name` and open it.
#[allow(clippy::too_many_arguments)]
fn run_case(
    medium: &Medium,
    cfg: &DatadirConfig,
    n: usize,
    name: &str,
    len: u64,
    damage: Damage,
    model: &Model,
    pin_model: &Model,
) -> Case {
    let case = |outcome, detail: String| Case {
        file: name.to_string(),
        damage,
        outcome,
        detail,
    };
    let copy = match medium.copy(n) {
        Ok(c) => c,
        Err(e) => return case(Outcome::Violation, format!("could not copy: {e}")),
    };
    match apply(&*copy.vfs, &copy.dir.join(name), len, damage) {
        Ok(true) => {}
        Ok(false) => return case(Outcome::NotApplicable, String::new()),
        Err(e) => return case(Outcome::Violation, format!("could not damage: {e}")),
    }
    let opts = options(copy.vfs.clone(), cfg.segment_bytes);
    let checked = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        check_open(&copy.dir, &opts, name, model, pin_model)
    }));
    match checked {
        Ok((outcome, detail)) => case(outcome, detail),
        Err(_) => case(Outcome::Violation, "open panicked".into()),
    }
}

/// Open the damaged copy (twice when it opens) and judge it.
fn check_open(
    dir: &Path,
    opts: &DurabilityOptions,
    name: &str,
    model: &Model,
    pin_model: &Model,
) -> (Outcome, String) {
    let mut outcome = Outcome::Intact;
    let mut detail = String::new();
    for attempt in 0..2 {
        let db = match Database::open_with(dir, opts.clone()) {
            Ok(db) => db,
            Err(e) => {
                let msg = e.to_string();
                return if attempt == 0 && msg.contains(name) {
                    (Outcome::Refused, msg)
                } else if attempt == 0 {
                    (
                        Outcome::Violation,
                        format!("refused without naming {name}: {msg}"),
                    )
                } else {
                    (
                        Outcome::Violation,
                        format!("opened once, then refused: {msg}"),
                    )
                };
            }
        };
        let found = contents(&db);
        if &found != model {
            return (Outcome::Violation, difference(model, &found));
        }
        match db.named_snapshot(PIN) {
            Ok(s) => {
                let snap = snapshot_contents(&s);
                if &snap != pin_model {
                    return (
                        Outcome::Violation,
                        format!("pinned snapshot: {}", difference(pin_model, &snap)),
                    );
                }
            }
            Err(e) if e.to_string().contains(name) => {
                outcome = Outcome::PinUnreadable;
                detail = e.to_string();
            }
            Err(e) => {
                return (
                    Outcome::Violation,
                    format!("pinned snapshot unreadable without naming {name}: {e}"),
                )
            }
        }
    }
    (outcome, detail)
}

fn contents(db: &Database) -> Model {
    snapshot_contents(&db.snapshot())
}

fn snapshot_contents(s: &Snapshot) -> Model {
    let mut m = Model::new();
    for coll in s.list_collection_names() {
        let docs = s.collection(&coll).find(doc! {}).run().unwrap_or_default();
        let e: &mut BTreeMap<i64, Document> = m.entry(coll).or_default();
        for d in docs {
            if let Ok(id) = d.get_i64("_id") {
                e.insert(id, d);
            }
        }
    }
    m.retain(|_, docs| !docs.is_empty());
    m
}

/// How a recovered state differs from the model (for a violation's detail).
fn difference(model: &Model, found: &Model) -> String {
    let (mut missing, mut extra, mut changed) = (0, 0, 0);
    for coll in model.keys().chain(found.keys()) {
        let (a, b) = (model.get(coll), found.get(coll));
        let empty = BTreeMap::new();
        let (a, b) = (a.unwrap_or(&empty), b.unwrap_or(&empty));
        for (id, d) in a {
            match b.get(id) {
                None => missing += 1,
                Some(x) if x != d => changed += 1,
                _ => {}
            }
        }
        extra += b.keys().filter(|id| !a.contains_key(id)).count();
    }
    format!(
        "opened with a different state: {missing} acknowledged documents missing, {changed} changed, {extra} extra"
    )
}

/// Damage `path` (of `len` bytes); `Ok(false)` when the damage does not apply.
fn apply(vfs: &dyn Vfs, path: &Path, len: u64, damage: Damage) -> std::io::Result<bool> {
    let flip = |offset: u64| -> std::io::Result<bool> {
        let mut b = vfs.read(path)?;
        let Some(byte) = b.get_mut(offset as usize) else {
            return Ok(false);
        };
        *byte ^= 0x5A;
        rewrite(vfs, path, &b)?;
        Ok(true)
    };
    match damage {
        Damage::Delete => vfs.remove(path).map(|()| true),
        Damage::TruncateToZero | Damage::TruncateToHalf | Damage::TruncateLastByte => {
            let to = match damage {
                Damage::TruncateToZero => 0,
                Damage::TruncateToHalf => len / 2,
                _ => len.saturating_sub(1),
            };
            if len == 0 || (damage == Damage::TruncateToHalf && len < 2) {
                return Ok(false);
            }
            vfs.truncate(path, to).map(|()| true)
        }
        Damage::FlipHeaderByte => flip(5.min(len.saturating_sub(1))).map(|f| f && len > 0),
        Damage::FlipMiddleByte => flip(len / 2).map(|f| f && len > 0),
        Damage::FlipLastRecordByte => {
            let b = vfs.read(path)?;
            flip(last_record_byte(path, &b))
        }
    }
}

/// A byte in the middle of the last frame's payload (WAL segments,
/// checkpoint and snapshot images), else the last byte.
fn last_record_byte(path: &Path, b: &[u8]) -> u64 {
    let name = path.file_name().map(|n| n.to_string_lossy().into_owned());
    let start = match name.as_deref() {
        Some(n) if n.starts_with("wal-") => SEGMENT_MAGIC.len(),
        Some(n) if n.ends_with(".ckpt") => 0,
        _ => return b.len().saturating_sub(1) as u64,
    };
    let (mut pos, mut last) = (start, None);
    while let Ok(Some((payload, next))) = read_frame(b, pos) {
        last = Some((pos + 8, payload.len()));
        pos = next;
    }
    match last {
        Some((at, n)) => (at + n / 2) as u64,
        None => b.len().saturating_sub(1) as u64,
    }
}

/// Replace the content of `path` by `bytes` (synced).
fn rewrite(vfs: &dyn Vfs, path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    vfs.remove(path)?;
    let f = vfs.create(path)?;
    f.append(bytes)?;
    f.sync()
}
