//! Checkpoints: a complete image of one published state, written from a held
//! `cow` snapshot so writers never pause, and loaded at recovery.
//!
//! This file writes the self-contained image (format 6: durable snapshots,
//! hot backups, replication snapshots) and loads every format; the
//! database's own checkpoints are chained (format 7, or 5 before the `_id`
//! order, [`super::chain`]: only what changed is written) and loaded
//! through [`load_with_files`]. Versions 1 to 4 and 6 are whole images, 5
//! and 7 chained ones (one number space: the version alone says which).
//!
//! Layout of `ckpt-<csn, 20 digits>.ckpt` (see docs/design.md §13.4): a sequence
//! of WAL-style frames `[len u32][crc32c u32][payload]`:
//! - `H`: magic `DUETCKP\x01`, format version u32 (6), csn u64, collection
//!   count u32, cluster time u64 of the state (version 1, still read, has no
//!   time: it loads as 0);
//! - per collection `C`: name, document count u64, index spec count u32, specs
//!   (BSON, the `listIndexes` form), and (version 3 on) the collection options
//!   (BSON, the `listCollections` form; versions 1 and 2, still read, have
//!   none: defaults); then `D` frames of up to ~1 MiB of documents
//!   (count u32, BSON documents) in record order; then (version 4) per
//!   secondary index `O` frames holding its entry order: index number u32,
//!   count u32, and for each entry in key order the position of its record
//!   among the collection's documents (u32); then (version 6) the `_id`
//!   index's order in `O` frames numbered one past the secondary indexes
//!   (the position of each record in `_id` order);
//! - `E`: csn u64 and total documents u64; the file ends right after it.
//!
//! The index entries themselves are not stored: they are formed again at
//! load from the documents and specs, so an index always holds exactly its
//! documents' keys. The stored order (4 bytes an entry, about 5 % of a
//! typical image) only saves the sort: the entries are placed by it and the
//! tree is built from them after one linear check (each entry placed once,
//! neighbours strictly ascending); an order that does not fit — a build
//! whose key order differs — is ignored and the entries sorted, as for an
//! image of version 3 or older, which stores none (version 4 stores none
//! for `_id`: its ids are sorted). Loading walks the frames
//! in order, then verifies and decodes the documents frames on up to one
//! thread per core and builds each collection's heap and indexes side by
//! side (`store::bulk_load`); the phases are timed ([`LoadTimes`], in the
//! recovery report).
//!
//! Invariants:
//! - a checkpoint file under its final name is complete and synced: it is
//!   written as `.tmp`, fsynced, then renamed (the manifest switch syncs the
//!   directory);
//! - loading verifies every checksum, the counts, and that nothing follows `E`;
//!   any mismatch is a `Corrupt` error, never a partial state: nothing is
//!   built before the whole frame walk succeeded, and a damaged frame is
//!   named by its offset whichever thread found it (within a collection,
//!   the first damaged documents frame in file order);
//! - the loaded state does not depend on the stored entry orders, only the
//!   time does: an intact order frame that does not fit its index is not an
//!   error (the index is sorted instead), a damaged one is `Corrupt`.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::chain;
use super::effect::{put_options, put_spec, put_str, read_options, read_spec, DecodeError, Reader};
use super::io::Vfs;
use super::wal::{frame, frame_unchecked, read_frame};
use crate::doc::DocRef;
use crate::error::StorageError;
use crate::store::bulk_load;
use crate::store::collection::CollectionState;
use crate::store::heap::RecordId;
use crate::store::index::IndexSpec;
use crate::store::options::CollectionOptions;
use crate::store::DbState;

pub(super) const MAGIC: &[u8; 8] = b"DUETCKP\x01";
pub const FORMAT_VERSION: u32 = 6;
/// Documents are framed in chunks of about this many bytes.
const CHUNK: usize = 1 << 20;
/// Most record positions in one order frame (about `CHUNK` bytes).
const ORDER_CHUNK: usize = CHUNK / 4;
/// Sync the file every this many bytes (RocksDB's `bytes_per_sync`): a
/// checkpoint that leaves hundreds of MB dirty in the page cache makes the
/// kernel throttle every writer of the machine, the WAL included, and the
/// final fsync one long stall for the disk.
const BYTES_PER_SYNC: u64 = 8 << 20;

pub fn checkpoint_name(csn: u64) -> String {
    format!("ckpt-{csn:020}.ckpt")
}

pub fn parse_checkpoint_name(name: &str) -> Option<u64> {
    name.strip_prefix("ckpt-")?
        .strip_suffix(".ckpt")
        .filter(|d| d.len() == 20)?
        .parse()
        .ok()
}

/// What a checkpoint write produced.
#[derive(Debug, Clone)]
pub struct CheckpointInfo {
    pub csn: u64,
    pub path: PathBuf,
    pub bytes: u64,
    pub documents: u64,
}

/// Write the image of `state` to `dir` under its final name (synced, renamed;
/// the caller syncs the directory when it installs the manifest).
pub fn write(vfs: &dyn Vfs, dir: &Path, state: &DbState) -> Result<CheckpointInfo, StorageError> {
    let name = checkpoint_name(state.csn);
    write_as(vfs, dir, &name, state)
}

/// Write the image of `state` to `dir/<name>` (via `<name>.tmp`, synced,
/// renamed; the caller syncs the directory). Used for regular checkpoints and
/// for the images of durable named snapshots (same format).
pub fn write_as(
    vfs: &dyn Vfs,
    dir: &Path,
    name: &str,
    state: &DbState,
) -> Result<CheckpointInfo, StorageError> {
    write_version(vfs, dir, name, state, FORMAT_VERSION)
}

/// Where each record of a collection lies among its records in heap order
/// (its record id at load), to write the indexes' entry orders.
enum Positions {
    /// Indexed by record id (`u32::MAX`: no such record); used while the
    /// ids are not much sparser than the records.
    Dense(Vec<u32>),
    /// The record ids in order, searched.
    Sparse(Vec<RecordId>),
}

impl Positions {
    fn new(c: &CollectionState) -> Option<Positions> {
        let n = c.len();
        if u32::try_from(n).is_err() {
            // Positions are u32: such a collection's indexes are sorted at load.
            return None;
        }
        let dense = usize::try_from(c.next_rid)
            .ok()
            .filter(|&ids| ids <= n.saturating_mul(4).saturating_add(1 << 16));
        Some(match dense {
            Some(ids) => {
                let mut at = vec![u32::MAX; ids];
                for (pos, (rid, _)) in c.heap.iter().enumerate() {
                    // Ids are below `next_rid`; one that is not only loses the order.
                    if let Some(slot) = usize::try_from(rid).ok().and_then(|r| at.get_mut(r)) {
                        *slot = pos as u32;
                    }
                }
                Positions::Dense(at)
            }
            None => Positions::Sparse(c.heap.iter().map(|(rid, _)| rid).collect()),
        })
    }

    fn of(&self, rid: RecordId) -> Option<u32> {
        match self {
            Positions::Dense(at) => usize::try_from(rid)
                .ok()
                .and_then(|r| at.get(r))
                .copied()
                .filter(|&p| p != u32::MAX),
            Positions::Sparse(ids) => ids.binary_search(&rid).ok().map(|p| p as u32),
        }
    }
}

/// The entry order of an index whose entries name the records `rids` in
/// key order (see [`bulk_load::EntryOrder`]), or `None` when an entry
/// names a record not in the heap (it never does: the index would then be
/// sorted at load).
fn entry_order<'a>(
    rids: impl Iterator<Item = &'a RecordId>,
    positions: &Positions,
) -> Option<Vec<u32>> {
    rids.map(|rid| positions.of(*rid)).collect()
}

/// [`write_as`] in format `version`: 6 (this build's), 4 (no `_id` order)
/// or 3 (no entry orders); the older two kept to test that such images
/// still load.
fn write_version(
    vfs: &dyn Vfs,
    dir: &Path,
    name: &str,
    state: &DbState,
    version: u32,
) -> Result<CheckpointInfo, StorageError> {
    // Delta indexing: write each index's fresh view (its layers folded into
    // a copy of its tree), so a checkpoint holds plain indexes and loads
    // with no layers, equal to the state it was taken of.
    let folded = state.with_deltas_folded();
    let state = &folded;
    let path = dir.join(name);
    let tmp = dir.join(format!("{name}.tmp"));
    if vfs.exists(&tmp) {
        vfs.remove(&tmp)
            .map_err(|e| StorageError::io("remove", &tmp, &e))?;
    }
    let file = vfs
        .create(&tmp)
        .map_err(|e| StorageError::io("create", &tmp, &e))?;
    let mut bytes = 0u64;
    let mut unsynced = 0u64;
    let mut documents = 0u64;
    let result = (|| -> Result<(), StorageError> {
        let mut out = Vec::with_capacity(CHUNK + 4096);
        let mut flush = |out: &mut Vec<u8>, force: bool| -> Result<(), StorageError> {
            if out.len() >= CHUNK || (force && !out.is_empty()) {
                file.append(out)
                    .map_err(|e| StorageError::io("write", &tmp, &e))?;
                bytes += out.len() as u64;
                unsynced += out.len() as u64;
                out.clear();
                if unsynced >= BYTES_PER_SYNC {
                    file.sync()
                        .map_err(|e| StorageError::io("fsync", &tmp, &e))?;
                    unsynced = 0;
                }
            }
            Ok(())
        };
        let mut p = vec![b'H'];
        p.extend_from_slice(MAGIC);
        p.extend_from_slice(&version.to_le_bytes());
        p.extend_from_slice(&state.csn.to_le_bytes());
        p.extend_from_slice(&(state.collections.len() as u32).to_le_bytes());
        p.extend_from_slice(&state.ts.to_le_bytes());
        frame(&p, &mut out);
        for (name, c) in state.collections.iter() {
            let mut p = vec![b'C'];
            put_str(&mut p, name);
            p.extend_from_slice(&(c.len() as u64).to_le_bytes());
            p.extend_from_slice(&(c.indexes.len() as u32).to_le_bytes());
            for i in &c.indexes {
                put_spec(&mut p, &i.spec);
            }
            put_options(&mut p, &c.options);
            frame(&p, &mut out);
            let mut chunk: Vec<u8> = Vec::with_capacity(CHUNK);
            let mut n = 0u32;
            let emit = |chunk: &mut Vec<u8>, n: &mut u32, out: &mut Vec<u8>| {
                let mut p = Vec::with_capacity(chunk.len() + 5);
                p.push(b'D');
                p.extend_from_slice(&n.to_le_bytes());
                p.extend_from_slice(chunk);
                frame(&p, out);
                chunk.clear();
                *n = 0;
            };
            for (_, d) in c.heap.iter() {
                chunk.extend_from_slice(d.as_bytes());
                n += 1;
                documents += 1;
                if chunk.len() >= CHUNK {
                    emit(&mut chunk, &mut n, &mut out);
                    flush(&mut out, false)?;
                }
            }
            if n > 0 {
                emit(&mut chunk, &mut n, &mut out);
            }
            flush(&mut out, false)?;
            if version < 4 || (version < 6 && c.indexes.is_empty()) {
                continue;
            }
            let Some(positions) = Positions::new(c) else {
                continue;
            };
            // The secondary indexes in spec order, then `_id` numbered one
            // past them (format 6).
            let secondary = c.indexes.iter().map(|index| {
                let rids = index.tree.iter().map(|((_, rid), ())| rid);
                entry_order(rids, &positions)
            });
            let id = (version >= 6)
                .then(|| entry_order(c.id_index.iter().map(|(_, rid)| rid), &positions));
            for (i, order) in secondary.chain(id).enumerate() {
                let Some(order) = order else {
                    continue;
                };
                // At least one frame, so an empty index's (empty) order is stored too.
                let runs: Vec<&[u32]> = if order.is_empty() {
                    vec![&[]]
                } else {
                    order.chunks(ORDER_CHUNK).collect()
                };
                for run in runs {
                    let mut p = Vec::with_capacity(9 + 4 * run.len());
                    p.push(b'O');
                    p.extend_from_slice(&(i as u32).to_le_bytes());
                    p.extend_from_slice(&(run.len() as u32).to_le_bytes());
                    for pos in run {
                        p.extend_from_slice(&pos.to_le_bytes());
                    }
                    frame(&p, &mut out);
                    flush(&mut out, false)?;
                }
            }
        }
        let mut p = vec![b'E'];
        p.extend_from_slice(&state.csn.to_le_bytes());
        p.extend_from_slice(&documents.to_le_bytes());
        frame(&p, &mut out);
        flush(&mut out, true)?;
        Ok(())
    })();
    install(vfs, &*file, &tmp, &path, result)?;
    Ok(CheckpointInfo {
        csn: state.csn,
        path,
        bytes,
        documents,
    })
}

/// Where the time of a checkpoint load went (recovery reports it).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LoadTimes {
    /// Reading the file into memory.
    pub read: Duration,
    /// Walking the frames: headers, collection frames, counts.
    pub frames: Duration,
    /// Checksums of the document frames and validating and copying their
    /// documents (on up to one thread per core).
    pub decode: Duration,
    /// The heap, the `_id` index and the secondary indexes (side by side:
    /// `store::bulk_load`).
    pub build: Duration,
    /// Secondary indexes built in the entry order the image stored (no sort).
    pub indexes_in_stored_order: u32,
    /// Secondary indexes whose entries were sorted (an image of format 3 or
    /// older, or an order that did not fit the documents).
    pub indexes_sorted: u32,
    /// `_id` indexes placed by the order the image stored (no sort).
    pub ids_in_stored_order: u32,
    /// `_id` indexes whose ids were sorted (the image stored no `_id`
    /// order — formats 1 to 5 — or one that did not fit).
    pub ids_sorted: u32,
}

/// Load the checkpoint at `path` into a state for database `db`.
pub fn load(vfs: &dyn Vfs, path: &Path, db: &str) -> Result<DbState, StorageError> {
    load_timed(vfs, path, db).map(|(state, _)| state)
}

/// [`load`], also saying where the time went.
pub fn load_timed(
    vfs: &dyn Vfs,
    path: &Path,
    db: &str,
) -> Result<(DbState, LoadTimes), StorageError> {
    load_with_files(vfs, path, db).map(|(state, times, _)| (state, times))
}

/// [`load_timed`], also returning the checkpoint files (csns, ascending)
/// the image needs: its own, and for a chained image (format 5,
/// [`super::chain`]) the older files its map points into, which are read
/// from the same directory.
pub fn load_with_files(
    vfs: &dyn Vfs,
    path: &Path,
    db: &str,
) -> Result<(DbState, LoadTimes, Vec<u64>), StorageError> {
    let t = Instant::now();
    let buf = vfs
        .read(path)
        .map_err(|e| StorageError::io("read", path, &e))?;
    let read = t.elapsed();
    let dir = path.parent().unwrap_or(Path::new("."));
    let older = |csn: u64| -> Result<(PathBuf, Vec<u8>), StorageError> {
        let p = dir.join(checkpoint_name(csn));
        if !vfs.exists(&p) {
            return Err(StorageError::Missing {
                path: p,
                what: format!("an older checkpoint file {} needs", path.display()),
            });
        }
        let b = vfs.read(&p).map_err(|e| StorageError::io("read", &p, &e))?;
        Ok((p, b))
    };
    let (state, mut times, files) = decode_inner(&buf, path, db, Some(&older))?;
    times.read += read;
    Ok((state, times, files))
}

/// Decode a checkpoint image read from `path` (named in errors). Any damage
/// is a `Corrupt` error naming the offset; never a panic.
pub fn decode(buf: &[u8], path: &Path, db: &str) -> Result<DbState, StorageError> {
    decode_timed(buf, path, db).map(|(state, _)| state)
}

/// A documents frame found by the walk: its payload after the tag and count
/// (checksum not verified yet), the count, its checksum and its offset.
pub(super) struct DocFrame<'a> {
    pub(super) docs: &'a [u8],
    pub(super) n: u32,
    pub(super) payload: &'a [u8],
    pub(super) crc: u32,
    pub(super) at: usize,
    /// The file it is in (named in errors; a chained image reads several).
    pub(super) path: &'a Path,
}

/// One collection found by the walk.
struct CollFrames<'a> {
    name: String,
    specs: Vec<IndexSpec>,
    options: CollectionOptions,
    frames: Vec<DocFrame<'a>>,
    /// The stored entry orders (format 4: of the secondary indexes; 6: of
    /// `_id` too; `None`: not stored, sorted at load).
    orders: bulk_load::StoredOrders,
    /// The collection frame's offset (named when its indexes do not build).
    at: usize,
}

/// Below this many documents a collection is decoded on the calling thread:
/// starting threads would cost more than they save.
pub(super) const PARALLEL_MIN_DOCS: u64 = 16 * 1024;

/// [`decode`], also saying where the time went. The frames are walked
/// first (every header, collection frame and count checked in order); the
/// documents frames are then verified (checksum) and decoded on up to one
/// thread per core, and each collection is built with its indexes side by
/// side ([`bulk_load::load_collection`]). Errors name the offset of the
/// damaged frame (the walk's frames first, then, per collection, the first
/// damaged documents frame in file order).
pub fn decode_timed(
    buf: &[u8],
    path: &Path,
    db: &str,
) -> Result<(DbState, LoadTimes), StorageError> {
    decode_inner(buf, path, db, None).map(|(state, times, _)| (state, times))
}

/// Reads an older checkpoint file of a chain by its csn.
pub(super) type ReadOlder<'a> = &'a dyn Fn(u64) -> Result<(PathBuf, Vec<u8>), StorageError>;

/// [`decode_timed`] of any format; a chained image (format 5) reads the
/// older files it needs with `older` (with `None` it must need none).
fn decode_inner(
    buf: &[u8],
    path: &Path,
    db: &str,
    older: Option<ReadOlder>,
) -> Result<(DbState, LoadTimes, Vec<u64>), StorageError> {
    let mut times = LoadTimes::default();
    let t = Instant::now();
    let corrupt = |off: usize, what: String| StorageError::corrupt(path, off as u64, what);
    let dec = |off: usize| move |e: DecodeError| StorageError::corrupt(path, off as u64, e.0);
    let mut pos = 0usize;
    let next = |pos: &mut usize| -> Result<(&[u8], usize), StorageError> {
        let at = *pos;
        match read_frame(buf, at) {
            Ok(Some((p, n))) => {
                *pos = n;
                Ok((p, at))
            }
            Ok(None) => Err(corrupt(at, "ends before its end frame".into())),
            Err(why) => Err(corrupt(at, why)),
        }
    };
    let (h, at) = next(&mut pos)?;
    let mut r = Reader::new(h);
    if r.u8().map_err(dec(at))? != b'H' || r.bytes(8).map_err(dec(at))? != MAGIC {
        return Err(corrupt(at, "not a duetdb checkpoint (bad header)".into()));
    }
    let version = r.u32().map_err(dec(at))?;
    if version == chain::CHAIN_VERSION || version == chain::CHAIN_VERSION_5 {
        return chain::decode(buf, path, db, r, version, pos, older);
    }
    if !(1..=4).contains(&version) && version != FORMAT_VERSION {
        return Err(corrupt(
            at,
            format!(
                "format version {version}, this build reads 1 to {}",
                chain::CHAIN_VERSION
            ),
        ));
    }
    let csn = r.u64().map_err(dec(at))?;
    let n_colls = r.u32().map_err(dec(at))?;
    // Version 2 adds the state's cluster time; version 1 did not know it.
    let ts = if version >= 2 {
        r.u64().map_err(dec(at))?
    } else {
        0
    };
    let mut total = 0u64;
    let mut colls: Vec<CollFrames> = Vec::new();
    for _ in 0..n_colls {
        let (p, at) = next(&mut pos)?;
        let mut r = Reader::new(p);
        if r.u8().map_err(dec(at))? != b'C' {
            return Err(corrupt(at, "expected a collection frame".into()));
        }
        let name = r.str().map_err(dec(at))?;
        let n_docs = r.u64().map_err(dec(at))?;
        let n_specs = r.u32().map_err(dec(at))?;
        let mut specs = Vec::new();
        for _ in 0..n_specs {
            specs.push(read_spec(&mut r).map_err(dec(at))?);
        }
        let options = if version >= 3 {
            read_options(&mut r).map_err(dec(at))?
        } else {
            CollectionOptions::default()
        };
        let mut frames = Vec::new();
        let mut loaded = 0u64;
        while loaded < n_docs {
            let doc_frame = walk_doc_frame(buf, &mut pos, path)?;
            loaded += u64::from(doc_frame.n);
            if loaded > n_docs {
                return Err(doc_frame.damage(path, "documents frame does not match its count"));
            }
            frames.push(doc_frame);
        }
        let orders = if version >= 4 {
            // Format 6 numbers `_id` one past the secondary indexes.
            let with_id = version >= 6;
            let mut indexes = walk_orders(buf, &mut pos, specs.len() + usize::from(with_id), path)?;
            let id = if with_id {
                indexes.pop().flatten()
            } else {
                None
            };
            bulk_load::StoredOrders { id, indexes }
        } else {
            bulk_load::StoredOrders::default()
        };
        total += loaded;
        colls.push(CollFrames {
            name,
            specs,
            options,
            frames,
            orders,
            at,
        });
    }
    let (p, at) = next(&mut pos)?;
    let mut r = Reader::new(p);
    if r.u8().map_err(dec(at))? != b'E' {
        return Err(corrupt(at, "expected the end frame".into()));
    }
    if r.u64().map_err(dec(at))? != csn || r.u64().map_err(dec(at))? != total {
        return Err(corrupt(at, "end frame does not match the content".into()));
    }
    if pos != buf.len() {
        return Err(corrupt(pos, "bytes after the end frame".into()));
    }
    times.frames = t.elapsed();
    let mut state = DbState {
        db: Arc::from(db),
        csn,
        ts,
        ..Default::default()
    };
    let out = Arc::make_mut(&mut state.collections);
    for coll in colls {
        let t = Instant::now();
        let docs = decode_frames(&coll.frames, path)?;
        times.decode += t.elapsed();
        let c = build_collection(
            &format!("{db}.{}", coll.name),
            (coll.options, docs, coll.specs, coll.orders),
            &mut times,
        )
        .map_err(|e| corrupt(coll.at, e))?;
        out.insert(coll.name, c);
    }
    let files = vec![state.csn];
    Ok((state, times, files))
}

/// One collection of a loaded checkpoint built from its decoded documents
/// and stored index orders (`bulk_load`), its build time and index counts
/// added to `times`; the reason it does not load otherwise.
pub(super) fn build_collection(
    ns: &str,
    (options, docs, specs, orders): (
        CollectionOptions,
        Vec<DocRef>,
        Vec<IndexSpec>,
        bulk_load::StoredOrders,
    ),
    times: &mut LoadTimes,
) -> Result<CollectionState, String> {
    let t = Instant::now();
    let (c, counts) = bulk_load::load_collection(ns, options, docs, specs, orders)
        .map_err(|e| format!("collection does not load: {e}"))?;
    times.build += t.elapsed();
    times.indexes_in_stored_order += counts.stored;
    times.indexes_sorted += counts.sorted;
    times.ids_in_stored_order += counts.ids_stored;
    times.ids_sorted += counts.ids_sorted;
    Ok(c)
}

/// The order frames after a collection's documents frames (format 4 on),
/// moving `*pos` past them: each `'O' index:u32 n:u32 position:u32[n]`, the
/// index numbers ascending (an index's order may take several frames) and
/// below `n_specs` (the secondary indexes, and in format 6 `_id` after
/// them). The walk stops at the first frame that is not an order
/// frame (the next collection's or the end frame, checked by the caller: a
/// damaged frame is reported there, at its offset).
fn walk_orders(
    buf: &[u8],
    pos: &mut usize,
    n_specs: usize,
    path: &Path,
) -> Result<Vec<Option<bulk_load::EntryOrder>>, StorageError> {
    let mut orders: Vec<Option<bulk_load::EntryOrder>> = vec![None; n_specs];
    let mut last = 0usize;
    while let Ok(Some((p, next))) = read_frame(buf, *pos) {
        if p.first() != Some(&b'O') {
            break;
        }
        let at = *pos;
        let corrupt = |what: &str| StorageError::corrupt(path, at as u64, what);
        let mut r = Reader::new(p);
        let (index, n) = match (r.u8(), r.u32(), r.u32()) {
            (Ok(_), Ok(index), Ok(n)) => (index as usize, n as usize),
            _ => return Err(corrupt("order frame too short")),
        };
        if index >= n_specs || index < last {
            return Err(corrupt("order frame of no index in order"));
        }
        let positions = &p[r.pos..];
        if positions.len() / 4 != n || positions.len() % 4 != 0 {
            return Err(corrupt("order frame does not match its count"));
        }
        last = index;
        orders[index].get_or_insert_with(Vec::new).extend(
            positions
                .chunks_exact(4)
                .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]])),
        );
        *pos = next;
    }
    Ok(orders)
}

/// The documents frame at `*pos`, its checksum not verified yet (that is
/// done beside decoding, in parallel); moves `*pos` past it. A frame whose
/// structure is wrong reports a checksum mismatch first when it has one:
/// damage, not a writer's bug, is the likely cause.
fn walk_doc_frame<'a>(
    buf: &'a [u8],
    pos: &mut usize,
    path: &'a Path,
) -> Result<DocFrame<'a>, StorageError> {
    let at = *pos;
    let (payload, crc, next) = match frame_unchecked(buf, at) {
        Ok(Some(f)) => f,
        Ok(None) => {
            return Err(StorageError::corrupt(
                path,
                at as u64,
                "ends before its end frame",
            ))
        }
        Err(why) => return Err(StorageError::corrupt(path, at as u64, why)),
    };
    let mut frame = DocFrame {
        docs: &[],
        n: 0,
        payload,
        crc,
        at,
        path,
    };
    let mut r = Reader::new(payload);
    match (r.u8(), r.u32()) {
        (Ok(b'D'), Ok(n)) => {
            frame.n = n;
            frame.docs = &payload[r.pos..];
        }
        (Ok(_), Ok(_)) => return Err(frame.damage(path, "expected a documents frame")),
        (Err(e), _) | (_, Err(e)) => return Err(frame.damage(path, &e.0)),
    }
    *pos = next;
    Ok(frame)
}

impl DocFrame<'_> {
    fn checksum_ok(&self) -> bool {
        crc32c::crc32c(self.payload) == self.crc
    }

    /// `what` at this frame, unless its checksum says it is damaged.
    fn damage(&self, path: &Path, what: &str) -> StorageError {
        let what = if self.checksum_ok() {
            what
        } else {
            "checksum mismatch"
        };
        StorageError::corrupt(path, self.at as u64, what)
    }
}

/// Verify and decode `frames` (in order) on up to one thread per core,
/// each thread a contiguous run of frames; the first error in file order
/// wins.
pub(super) fn decode_frames(frames: &[DocFrame], path: &Path) -> Result<Vec<DocRef>, StorageError> {
    let n_docs: u64 = frames.iter().map(|f| u64::from(f.n)).sum();
    let threads = if n_docs < PARALLEL_MIN_DOCS {
        1
    } else {
        bulk_load::workers(frames.len())
    };
    if threads <= 1 {
        return decode_run(frames, path);
    }
    let per = frames.len().div_ceil(threads);
    let runs: Vec<Result<Vec<DocRef>, StorageError>> = std::thread::scope(|s| {
        let handles: Vec<_> = frames
            .chunks(per)
            .map(|run| s.spawn(move || decode_run(run, path)))
            .collect();
        handles
            .into_iter()
            .map(|h| {
                h.join().unwrap_or_else(|_| {
                    Err(StorageError::corrupt(path, 0, "a decoding thread panicked"))
                })
            })
            .collect()
    });
    let mut docs = Vec::with_capacity(n_docs as usize);
    for run in runs {
        docs.append(&mut run?);
    }
    Ok(docs)
}

/// Verify and decode a run of frames on this thread.
fn decode_run(frames: &[DocFrame], _path: &Path) -> Result<Vec<DocRef>, StorageError> {
    let mut docs = Vec::with_capacity(frames.iter().map(|f| f.n as usize).sum());
    for f in frames {
        let path = f.path;
        if !f.checksum_ok() {
            return Err(StorageError::corrupt(
                path,
                f.at as u64,
                "checksum mismatch",
            ));
        }
        let dec = |e: DecodeError| StorageError::corrupt(path, f.at as u64, e.0);
        let mut r = Reader::new(f.docs);
        for _ in 0..f.n {
            let d = r.doc().map_err(dec)?;
            if crate::doc::id_of(&d).is_none() {
                return Err(StorageError::corrupt(
                    path,
                    f.at as u64,
                    "document without _id",
                ));
            }
            docs.push(Arc::new(d));
        }
        if !r.done() {
            return Err(StorageError::corrupt(
                path,
                f.at as u64,
                "documents frame does not match its count",
            ));
        }
    }
    Ok(docs)
}

/// Finish a checkpoint file written at `tmp`: when its writing `result` is
/// good, sync it and rename it to `path`; otherwise (or when either fails)
/// remove `tmp`, so a file whose fsync failed is never reused (a later
/// checkpoint writes a new one).
pub(super) fn install(
    vfs: &dyn Vfs,
    file: &dyn super::io::VFile,
    tmp: &Path,
    path: &Path,
    result: Result<(), StorageError>,
) -> Result<(), StorageError> {
    let result = result.and_then(|()| {
        file.sync()
            .map_err(|e| StorageError::io("fsync", tmp, &e))?;
        vfs.rename(tmp, path)
            .map_err(|e| StorageError::io("rename", tmp, &e))
    });
    if result.is_err() {
        let _ = vfs.remove(tmp);
    }
    result
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::durability::io::SimFs;
    use crate::store::collection::CollectionState;
    use crate::store::options::{ValidationAction, ValidationLevel};
    use bson::doc;

    fn state_with(options: CollectionOptions) -> DbState {
        let mut state = DbState {
            db: Arc::from("t"),
            csn: 3,
            ..Default::default()
        };
        let mut c = CollectionState::new("t.c", Default::default());
        c.options = options;
        Arc::make_mut(&mut state.collections).insert("c".into(), c);
        state
    }

    #[test]
    fn validation_options_round_trip() {
        let options = CollectionOptions {
            pre_and_post_images: true,
            validator: Some(Arc::new(doc! {"a": {"$gt": 1}})),
            validation_level: Some(ValidationLevel::Moderate),
            validation_action: Some(ValidationAction::Warn),
            ..Default::default()
        };
        let fs = SimFs::new();
        let dir = Path::new("/d");
        let info = write(&fs, dir, &state_with(options.clone())).expect("test value");
        let back = load(&fs, &info.path, "t").expect("test value");
        assert_eq!(back.collection("c").expect("test value").options, options);
    }

    fn big_state(n: i32) -> DbState {
        let mut state = state_with(CollectionOptions::default());
        let colls = Arc::make_mut(&mut state.collections);
        let c = colls.get_mut("c").expect("test value");
        for i in 0..n {
            let tags: Vec<i32> = (0..(i % 4)).map(|t| (i + t) % 17).collect();
            let d = doc! {"_id": (i * 7919) % n, "a": i % 97, "s": format!("v{}", i % 1000), "tags": tags, "u": i, "pad": "x".repeat(40)};
            let d = bson::RawDocumentBuf::try_from(&d).expect("test value");
            let id = crate::doc::id_of(&d).expect("test value").into();
            c.insert(Arc::new(d), id).expect("test value");
        }
        for (keys, name, unique) in [
            (doc! {"a": 1, "s": -1}, None, false),
            (doc! {"tags": 1}, None, false),
            (doc! {"u": -1}, Some("u_unique"), true),
        ] {
            let spec = IndexSpec::new(&keys, name, unique).expect("test value");
            c.create_index(spec).expect("test value");
        }
        state
    }

    /// A loaded image equals the state written: the same records under
    /// the same ids, and every index (built in parallel, bottom-up from
    /// sorted keys) equal to the one built insert by insert, multikey flag
    /// included. Large enough for the parallel decode (several frames).
    #[test]
    fn loaded_indexes_equal_a_fresh_build() {
        let n = (PARALLEL_MIN_DOCS as i32) * 2 + 123;
        let state = big_state(n);
        let fs = SimFs::new();
        let info = write(&fs, Path::new("/d"), &state).expect("test value");
        let (back, times) = load_timed(&fs, &info.path, "t").expect("test value");
        assert_eq!(
            (times.indexes_in_stored_order, times.indexes_sorted),
            (3, 0),
            "built in the stored order, no sort"
        );
        assert_eq!((times.ids_in_stored_order, times.ids_sorted), (1, 0));
        assert_same_collection(&state, &back, n as usize);
    }

    /// `back`'s collection `c` equals `state`'s: records, ids, `_id` index
    /// and every secondary index (entries, multikey), and keeps its
    /// invariants.
    fn assert_same_collection(state: &DbState, back: &DbState, n: usize) {
        let (a, b) = (
            state.collection("c").expect("test value"),
            back.collection("c").expect("test value"),
        );
        b.check_invariants().expect("test value");
        assert_eq!(a.len(), n);
        assert_eq!(b.len(), a.len());
        assert_eq!(b.next_rid, a.next_rid);
        assert_eq!(b.data_bytes, a.data_bytes);
        assert!(b.heap.iter().eq(a.heap.iter()));
        assert_eq!(b.id_index, a.id_index);
        assert_eq!(b.indexes.len(), 3);
        for (x, y) in a.indexes.iter().zip(&b.indexes) {
            assert_eq!(x.spec, y.spec);
            assert_eq!(x.multikey, y.multikey);
            assert_eq!(x.tree, y.tree);
            y.tree.check_invariants();
        }
    }

    /// Damage anywhere in a large image is a `Corrupt` error naming the
    /// frame, never a partial state: a flipped byte in the first, a middle
    /// and the last documents frame (found by the parallel decode), a
    /// duplicate unique key in an otherwise valid image, a truncated file.
    #[test]
    fn damage_in_a_large_image_is_corrupt() {
        let state = big_state((PARALLEL_MIN_DOCS as i32) * 2);
        let fs = SimFs::new();
        let info = write(&fs, Path::new("/d"), &state).expect("test value");
        let good = fs.read(&info.path).expect("test value");
        // Offsets of the documents frames.
        let mut frames = Vec::new();
        let mut pos = 0;
        while let Ok(Some((p, next))) = read_frame(&good, pos) {
            if p[0] == b'D' {
                frames.push(pos);
            }
            pos = next;
        }
        assert!(frames.len() >= 3, "{} frames", frames.len());
        for at in [
            frames[0],
            frames[frames.len() / 2],
            frames[frames.len() - 1],
        ] {
            let len =
                u32::from_le_bytes([good[at], good[at + 1], good[at + 2], good[at + 3]]) as usize;
            for delta in [12, 200, 5000] {
                let mut bad = good.clone();
                bad[at + delta.min(len + 7)] ^= 0x40;
                match decode(&bad, &info.path, "t") {
                    Err(StorageError::Corrupt { offset, what, .. }) => {
                        assert_eq!(offset, at as u64, "{what}");
                        assert_eq!(what, "checksum mismatch");
                    }
                    other => panic!("flip at {at}+{delta}: {other:?}"),
                }
            }
        }
        let cut = good[..good.len() - 10].to_vec();
        assert!(matches!(
            decode(&cut, &info.path, "t"),
            Err(StorageError::Corrupt { .. })
        ));
        // A valid image whose unique index would hold a key twice.
        let mut dup = state.clone();
        let c = Arc::make_mut(&mut dup.collections)
            .get_mut("c")
            .expect("test value");
        let u = c.indexes.pop().expect("test value");
        c.insert(
            Arc::new(bson::rawdoc! {"_id": -1, "u": 5}),
            bson::RawBson::Int32(-1),
        )
        .expect("test value");
        c.indexes.push(u);
        let info = write(&fs, Path::new("/e"), &dup).expect("test value");
        match load(&fs, &info.path, "t") {
            Err(StorageError::Corrupt { what, .. }) => assert!(
                what.contains("E11000") || what.contains("duplicate"),
                "{what}"
            ),
            other => panic!("{other:?}"),
        }
    }

    /// A format-3 image as builds before validation wrote it (options
    /// holding only `changeStreamPreAndPostImages`) loads unchanged: the
    /// validation options extend the options document, not the format.
    #[test]
    fn images_of_earlier_builds_load() {
        let mut out = Vec::new();
        let mut p = vec![b'H'];
        p.extend_from_slice(MAGIC);
        p.extend_from_slice(&3u32.to_le_bytes());
        p.extend_from_slice(&3u64.to_le_bytes());
        p.extend_from_slice(&1u32.to_le_bytes());
        p.extend_from_slice(&0u64.to_le_bytes());
        frame(&p, &mut out);
        let mut p = vec![b'C'];
        put_str(&mut p, "c");
        p.extend_from_slice(&0u64.to_le_bytes());
        p.extend_from_slice(&0u32.to_le_bytes());
        let opts = bson::rawdoc! {"changeStreamPreAndPostImages": {"enabled": true}};
        p.extend_from_slice(opts.as_bytes());
        frame(&p, &mut out);
        let mut p = vec![b'E'];
        p.extend_from_slice(&3u64.to_le_bytes());
        p.extend_from_slice(&0u64.to_le_bytes());
        frame(&p, &mut out);
        let state = decode(&out, Path::new("old.ckpt"), "t").expect("test value");
        let c = state.collection("c").expect("test value");
        assert_eq!(
            c.options,
            CollectionOptions {
                pre_and_post_images: true,
                ..Default::default()
            }
        );
        // And what format 3 writes for those options is that image; this
        // build's (format 6) differs only in the version and the `_id`
        // index's (empty) order frame: no secondary index, no document.
        let fs = SimFs::new();
        let state = state_with(c.options.clone());
        let v3 = write_version(&fs, Path::new("/d"), "v3.ckpt", &state, 3).expect("test value");
        assert_eq!(fs.read(&v3.path).expect("test value"), out);
        let info = write(&fs, Path::new("/d"), &state).expect("test value");
        let written = fs.read(&info.path).expect("test value");
        let header = read_frame(&written, 0)
            .expect("test value")
            .expect("test value");
        assert_eq!(header.0[9..13], 6u32.to_le_bytes());
        assert_eq!(frames_tagged(&written, b'O').len(), 1);
        // The frame: length and checksum, tag, index number, count.
        assert_eq!(written.len(), out.len() + 8 + 9);
    }

    /// An image of format 3 (no entry orders, as every earlier build wrote)
    /// still loads: each index is then sorted, and equals the one built
    /// insert by insert.
    #[test]
    fn a_format_3_image_with_indexes_loads_by_sorting() {
        let n = (PARALLEL_MIN_DOCS as i32) + 77;
        let state = big_state(n);
        let fs = SimFs::new();
        let info = write_version(&fs, Path::new("/d"), "old.ckpt", &state, 3).expect("test value");
        let image = fs.read(&info.path).expect("test value");
        assert!(frames_tagged(&image, b'O').is_empty());
        let (back, times) = load_timed(&fs, &info.path, "t").expect("test value");
        assert_eq!(
            (times.indexes_in_stored_order, times.indexes_sorted),
            (0, 3)
        );
        assert_eq!((times.ids_in_stored_order, times.ids_sorted), (0, 1));
        assert_same_collection(&state, &back, n as usize);
        // The same state in format 6 is larger by the orders only: 4 bytes
        // an entry (a record's for `_id`) plus the frames' headers.
        let new = write(&fs, Path::new("/e"), &state).expect("test value");
        let c = state.collection("c").expect("test value");
        let entries: usize = c.len() + c.indexes.iter().map(|i| i.tree.len()).sum::<usize>();
        let grown = new.bytes - info.bytes;
        assert!(
            grown as usize >= 4 * entries && (grown as usize) < 4 * entries + 4096,
            "{grown}"
        );
    }

    /// An image of format 4 (the secondary indexes' orders, none for `_id`,
    /// as the builds before format 6 wrote) still loads: the secondary
    /// indexes in their stored order, the ids sorted; the state is the same.
    #[test]
    fn a_format_4_image_loads_sorting_the_ids() {
        let n = (PARALLEL_MIN_DOCS as i32) + 31;
        let state = big_state(n);
        let fs = SimFs::new();
        let info = write_version(&fs, Path::new("/d"), "v4.ckpt", &state, 4).expect("test value");
        let image = fs.read(&info.path).expect("test value");
        assert_eq!(
            read_frame(&image, 0)
                .expect("test value")
                .expect("test value")
                .0[9..13],
            4u32.to_le_bytes()
        );
        let (back, times) = load_timed(&fs, &info.path, "t").expect("test value");
        assert_eq!(
            (times.indexes_in_stored_order, times.indexes_sorted),
            (3, 0)
        );
        assert_eq!((times.ids_in_stored_order, times.ids_sorted), (0, 1));
        assert_same_collection(&state, &back, n as usize);
        // Format 6 adds one order frame (a record a position) for `_id`.
        let new = write(&fs, Path::new("/e"), &state).expect("test value");
        let grown = new.bytes - info.bytes;
        assert!(
            grown as usize >= 4 * n as usize && (grown as usize) < 4 * n as usize + 1024,
            "{grown}"
        );
    }

    /// Offsets of the frames whose payload starts with `tag`.
    fn frames_tagged(image: &[u8], tag: u8) -> Vec<usize> {
        let mut at = Vec::new();
        let mut pos = 0;
        while let Ok(Some((p, next))) = read_frame(image, pos) {
            if p[0] == tag {
                at.push(pos);
            }
            pos = next;
        }
        at
    }

    /// Rewrite the frame at `at` with `edit` applied to its payload and a
    /// valid checksum (an intact frame with other content).
    fn reframe(image: &[u8], at: usize, edit: impl FnOnce(&mut Vec<u8>)) -> Vec<u8> {
        let (p, next) = read_frame(image, at)
            .expect("test value")
            .expect("test value");
        let mut p = p.to_vec();
        edit(&mut p);
        let mut out = image[..at].to_vec();
        frame(&p, &mut out);
        out.extend_from_slice(&image[next..]);
        out
    }

    /// A damaged order frame is `Corrupt` at its offset; an intact one that
    /// does not fit its index (entries out of key order) only costs a sort
    /// — the state is the same; an order frame naming no index, or out of
    /// index order, or whose count is wrong, is `Corrupt`.
    #[test]
    fn order_frames_damaged_or_not_fitting() {
        let state = big_state((PARALLEL_MIN_DOCS as i32) + 5);
        let fs = SimFs::new();
        let info = write(&fs, Path::new("/d"), &state).expect("test value");
        let good = fs.read(&info.path).expect("test value");
        let orders = frames_tagged(&good, b'O');
        assert!(orders.len() >= 3, "{} order frames", orders.len());
        for &at in &orders {
            let mut bad = good.clone();
            bad[at + 20] ^= 0x01;
            match decode(&bad, &info.path, "t") {
                Err(StorageError::Corrupt { offset, what, .. }) => {
                    assert_eq!(offset, at as u64, "{what}");
                    assert_eq!(what, "checksum mismatch");
                }
                other => panic!("flip in the order frame at {at}: {other:?}"),
            }
        }
        // An order frame (`'O' index:u32 n:u32 position:u32[n]`) with its
        // first two positions swapped, checksum valid.
        let swap_first_two = |at: usize, index: u32| {
            reframe(&good, at, |p| {
                assert_eq!(p[1..5], index.to_le_bytes());
                let (a, b) = (9..13, 13..17);
                let first: Vec<u8> = p[a.clone()].to_vec();
                p.copy_within(b.clone(), a.start);
                p[b].copy_from_slice(&first);
            })
        };
        // The first index's first two entries swapped.
        let swapped = swap_first_two(orders[0], 0);
        let (back, times) = decode_timed(&swapped, &info.path, "t").expect("test value");
        assert_eq!(
            (times.indexes_in_stored_order, times.indexes_sorted),
            (2, 1)
        );
        assert_eq!((times.ids_in_stored_order, times.ids_sorted), (1, 0));
        assert_same_collection(
            &state,
            &back,
            state.collection("c").expect("test value").len(),
        );
        // The `_id` order (numbered after the 3 secondary indexes, last)
        // with its first two records swapped: the ids are sorted instead.
        let id_at = *orders.last().expect("test value");
        let swapped = swap_first_two(id_at, 3);
        let (back, times) = decode_timed(&swapped, &info.path, "t").expect("test value");
        assert_eq!(
            (times.indexes_in_stored_order, times.indexes_sorted),
            (3, 0)
        );
        assert_eq!((times.ids_in_stored_order, times.ids_sorted), (0, 1));
        assert_same_collection(
            &state,
            &back,
            state.collection("c").expect("test value").len(),
        );
        for (edit, why) in [
            (
                Box::new(|p: &mut Vec<u8>| p[1..5].copy_from_slice(&7u32.to_le_bytes()))
                    as Box<dyn FnOnce(&mut Vec<u8>)>,
                "no index",
            ),
            (
                Box::new(|p: &mut Vec<u8>| p[5..9].copy_from_slice(&1u32.to_le_bytes())),
                "count",
            ),
            (Box::new(|p: &mut Vec<u8>| p.truncate(7)), "too short"),
        ] {
            let bad = reframe(&good, orders[0], edit);
            match decode(&bad, &info.path, "t") {
                Err(StorageError::Corrupt { offset, .. }) => {
                    assert_eq!(offset, orders[0] as u64, "{why}")
                }
                other => panic!("{why}: {other:?}"),
            }
        }
        // The last index's order frame before the first's.
        let last = *orders.last().expect("test value");
        let moved = reframe(&good, orders[0], |p| {
            p[1..5].copy_from_slice(&2u32.to_le_bytes())
        });
        match decode(&moved, &info.path, "t") {
            Err(StorageError::Corrupt { offset, .. }) => assert!(
                offset as usize > orders[0] && offset as usize <= last + 64,
                "{offset}"
            ),
            other => panic!("out of index order: {other:?}"),
        }
    }
}
