//! Incremental checkpoints (checkpoint format 7; 5 before the `_id` order,
//! still read): each checkpoint file
//! holds only the heap pages and index leaves that changed since the
//! previous checkpoint, and a map saying, in order, where every piece of the
//! state lies — in this file or in an older one of the chain.
//!
//! The state is copy-on-write: a heap page (64 slots) or index leaf that did
//! not change since the last checkpoint is the *same* node (same address)
//! in the new state. The checkpointer keeps the state it last wrote alive
//! ([`Chain`]), so an address it has seen names the same, unchanged node;
//! for each such node it remembers where it wrote its bytes. Writing the
//! next checkpoint walks the new state's pages and leaves, reuses the
//! location of every node it knows, and writes only the others. The bytes
//! written follow what changed; the walk itself is one hash lookup per page
//! and per leaf (no document or key is touched for an unchanged one).
//!
//! Layout of `ckpt-<csn>.ckpt` in format 7: WAL-style frames
//! `[len u32][crc32c u32][payload]`:
//! - `H`: magic `DUETCKP\x01`, version u32 (7), csn u64, collection count
//!   u32, cluster time u64, count u32 and csns u64 (ascending) of the older
//!   checkpoint files this one's map points into;
//! - piece frames, in any order: `P` a heap page: first record id u64,
//!   present bitmap u64, the documents (BSON) of the set bits in order; `L`
//!   an index leaf: entry count u32, the record id (u64) of each entry in
//!   key order;
//! - per collection `C`: name, document count u64, index spec count u32,
//!   specs, options (as format 4); the heap's extents; then per index its
//!   leaves' extents, and then the `_id` index's (format 7: its leaves'
//!   record ids are its values; format 5 stores none, its ids are sorted at
//!   load). An extents list is: count u32, then per extent file
//!   csn u64, offset u64, length u64, piece count u32 — a run of whole
//!   piece frames, consecutive in that file, in record (heap) or key
//!   (index) order;
//! - `E`: csn u64 and total documents u64; the file ends right after it.
//!
//! Loading reads this file and every file it names, walks each extent's
//! frames (checksums verified, tags and counts checked), decodes the pages'
//! documents on up to one thread per core and builds each collection as a
//! whole image is built (`store::bulk_load`): the record ids become
//! positions (`0..n`), and each index's stored record ids (`_id`'s too)
//! become its entry order, so recovery still needs no sort.
//!
//! Invariants:
//! - a chain file is written once (tmp, fsync, rename) and never changed;
//!   the files a checkpoint names in `H` exist as long as a manifest names
//!   that checkpoint (the cleanup keeps every file the current or previous
//!   checkpoint needs: `Durable::remove_obsolete`);
//! - a location in [`Chain`] is used only while the state it was recorded
//!   for is held by the chain, so an address is never a freed and reused
//!   node's;
//! - damage anywhere (a checksum, a tag, a count, an extent past a file's
//!   end, a missing file) is a `Corrupt` or `Missing` error naming the file,
//!   never a partial state; an intact leaf order that does not fit its
//!   index only costs a sort (as in format 4);
//! - an older file whose bytes are mostly dead, or one of the least live
//!   when the chain spans too many files, is compacted: the next checkpoint
//!   writes its live pieces again rather than pointing into it (so the
//!   chain's files stay few and at least half live, and the cost follows
//!   the writes that made them dead); files are deleted once no installed
//!   checkpoint needs them.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use super::checkpoint::{
    build_collection, checkpoint_name, decode_frames, install, CheckpointInfo, DocFrame, LoadTimes,
    ReadOlder, MAGIC,
};
use super::effect::{put_options, put_spec, put_str, read_options, read_spec, DecodeError, Reader};
use super::io::Vfs;
use super::wal::{frame, frame_unchecked};
use crate::error::StorageError;
use crate::store::btree::BTree;
use crate::store::bulk_load::StoredOrders;
use crate::store::collection::CollectionState;
use crate::store::heap::RecordId;
use crate::store::index::{IndexTree, ValueKey};
use crate::store::DbState;

/// The chain format this build writes: the `_id` index's leaves stored too.
pub const CHAIN_VERSION: u32 = 7;
/// The first chain format (no `_id` leaves: its ids are sorted at load),
/// still read.
pub const CHAIN_VERSION_5: u32 = 5;
/// Write buffers are flushed at about this many bytes.
const CHUNK: usize = 1 << 20;
/// Sync the file every this many bytes (see `checkpoint::BYTES_PER_SYNC`).
const BYTES_PER_SYNC: u64 = 8 << 20;
/// Most files one checkpoint points into (its own included): recovery
/// reads each, and each stays on disk while needed (see [`evicted`]).
const MAX_FILES: usize = 16;
/// An older file less than this share of whose bytes is still live is
/// compacted: its live pieces are written again (see [`evicted`]).
const MIN_LIVE: f64 = 0.5;

/// Where one piece's frame lies.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Loc {
    file: u64,
    off: u64,
    len: u64,
}

/// A run of piece frames, consecutive in one file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Extent {
    file: u64,
    off: u64,
    len: u64,
    pieces: u32,
}

/// Frame one piece's `payload` at the end of `out`, the buffer of file `csn`
/// after its first `written` bytes; where the frame lies.
fn frame_piece(payload: &[u8], out: &mut Vec<u8>, written: u64, csn: u64) -> Loc {
    let off = written + out.len() as u64;
    frame(payload, out);
    Loc {
        file: csn,
        off,
        len: written + out.len() as u64 - off,
    }
}

/// Append `loc` to `extents`, extending the last run when it continues it.
fn push(extents: &mut Vec<Extent>, loc: Loc) {
    if let Some(last) = extents.last_mut() {
        if last.file == loc.file && last.off + last.len == loc.off && last.pieces < u32::MAX {
            last.len += loc.len;
            last.pieces += 1;
            return;
        }
    }
    extents.push(Extent {
        file: loc.file,
        off: loc.off,
        len: loc.len,
        pieces: 1,
    });
}

fn put_extents(p: &mut Vec<u8>, extents: &[Extent]) {
    p.extend_from_slice(&(extents.len() as u32).to_le_bytes());
    for e in extents {
        p.extend_from_slice(&e.file.to_le_bytes());
        p.extend_from_slice(&e.off.to_le_bytes());
        p.extend_from_slice(&e.len.to_le_bytes());
        p.extend_from_slice(&e.pieces.to_le_bytes());
    }
}

fn read_extents(r: &mut Reader) -> Result<Vec<Extent>, DecodeError> {
    let n = r.u32()?;
    let mut out = Vec::new();
    for _ in 0..n {
        out.push(Extent {
            file: r.u64()?,
            off: r.u64()?,
            len: r.u64()?,
            pieces: r.u32()?,
        });
    }
    Ok(out)
}

/// The leaves of one index as a chain file stores them: each leaf's entries'
/// record ids in key order (a secondary index's from its keys, the `_id`
/// index's from its values).
#[derive(Clone, Copy)]
enum Leaves<'a> {
    Index(&'a IndexTree),
    Id(&'a BTree<ValueKey, RecordId>),
}

impl<'a> Leaves<'a> {
    /// The indexes of `c` a file of `version` stores, in map order: the
    /// secondary ones, then (format 7) `_id`.
    fn of(c: &'a CollectionState, version: u32) -> impl Iterator<Item = Leaves<'a>> {
        let id = (version >= CHAIN_VERSION).then_some(Leaves::Id(&c.id_index));
        c.indexes.iter().map(|i| Leaves::Index(&i.tree)).chain(id)
    }

    /// Calls `f` for every leaf in key order with its address (see
    /// [`BTree::for_each_leaf`]) and its entries' record ids.
    fn for_each(self, f: &mut impl FnMut(usize, &mut dyn ExactSizeIterator<Item = RecordId>)) {
        match self {
            Leaves::Index(t) => {
                t.for_each_leaf(&mut |addr, keys, _| f(addr, &mut keys.iter().map(|(_, r)| *r)))
            }
            Leaves::Id(t) => {
                t.for_each_leaf(&mut |addr, _, rids| f(addr, &mut rids.iter().copied()))
            }
        }
    }
}

/// What the checkpointer keeps between two checkpoints: the state it last
/// wrote (held, so the addresses below stay identities) and where each of
/// its pages and leaves lies.
pub struct Chain {
    state: DbState,
    pages: HashMap<usize, Loc>,
    leaves: HashMap<usize, Loc>,
    /// Size of each file the last checkpoint needs, by csn.
    sizes: BTreeMap<u64, u64>,
}

impl Chain {
    /// The files (csns, ascending) the last checkpoint needs, its own included.
    pub fn files(&self) -> Vec<u64> {
        self.sizes.keys().copied().collect()
    }
}

/// What [`write`] produced.
pub struct Written {
    pub info: CheckpointInfo,
    /// To pass to the next [`write`].
    pub chain: Chain,
    /// Written whole: no previous chain, or nothing of it reused.
    pub full: bool,
}

/// The files of `prev` whose pieces `state` still uses are rewritten
/// rather than pointed into (compaction, so the chain's files stay few and
/// mostly live): a file less than `MIN_LIVE` of whose bytes are still live,
/// and, while the chain would span more than `MAX_FILES` files, the files
/// with the fewest live bytes (down to half that). Rewriting a file's live
/// pieces costs what the writes since it was written made dead, so the
/// bytes written still follow the write rate, amortized.
///
/// Also returns the live bytes `state` has in each file of `prev`.
fn evicted(state: &DbState, prev: &Chain) -> (BTreeSet<u64>, BTreeMap<u64, u64>) {
    let mut live: BTreeMap<u64, u64> = BTreeMap::new();
    for c in state.collections.values() {
        c.heap.for_each_page(&mut |addr, _, _| {
            if let Some(l) = prev.pages.get(&addr) {
                *live.entry(l.file).or_default() += l.len;
            }
        });
        for leaves in Leaves::of(c, CHAIN_VERSION) {
            leaves.for_each(&mut |addr, _| {
                if let Some(l) = prev.leaves.get(&addr) {
                    *live.entry(l.file).or_default() += l.len;
                }
            });
        }
    }
    let mut out = BTreeSet::new();
    let mut kept: Vec<(u64, u64)> = Vec::new();
    for (&file, &used) in &live {
        let size = prev.sizes.get(&file).copied().unwrap_or(0);
        if (used as f64) < MIN_LIVE * size as f64 {
            out.insert(file);
        } else {
            kept.push((used, file));
        }
    }
    if kept.len() + 1 > MAX_FILES {
        kept.sort_unstable();
        let drop = kept.len() + 1 - MAX_FILES / 2;
        out.extend(kept.iter().take(drop).map(|&(_, f)| f));
    }
    (out, live)
}

/// Write the checkpoint of `state` to `dir` (tmp, synced, renamed; the
/// caller syncs the directory when it installs the manifest): the pieces
/// `prev` does not hold, or everything when there is no `prev` or the chain
/// needs compacting.
pub fn write(
    vfs: &dyn Vfs,
    dir: &Path,
    state: &DbState,
    prev: Option<&Chain>,
) -> Result<Written, StorageError> {
    write_version(vfs, dir, state, prev, CHAIN_VERSION)
}

/// [`write`] in format `version`: 7 (this build's) or 5 (no `_id` leaves;
/// kept to test that such chains still load, alone or under a newer file).
fn write_version(
    vfs: &dyn Vfs,
    dir: &Path,
    state: &DbState,
    prev: Option<&Chain>,
    version: u32,
) -> Result<Written, StorageError> {
    // Delta indexing: the fresh view of every index (see `checkpoint`); the
    // chain keeps this folded state, so its leaves' addresses stay valid,
    // and the next checkpoint rewrites the leaves a fold copied.
    let folded = state.with_deltas_folded();
    let state = &folded;
    let prev = prev.filter(|p| p.state.csn < state.csn);
    let (evict, live) = prev.map(|p| evicted(state, p)).unwrap_or_default();
    // Where `prev` holds a piece that stays (not in an evicted file).
    let reuse = |map: &HashMap<usize, Loc>, addr: usize| {
        map.get(&addr).filter(|l| !evict.contains(&l.file)).copied()
    };
    let csn = state.csn;
    let name = checkpoint_name(csn);
    let path = dir.join(&name);
    let tmp = dir.join(format!("{name}.tmp"));
    if vfs.exists(&tmp) {
        vfs.remove(&tmp)
            .map_err(|e| StorageError::io("remove", &tmp, &e))?;
    }
    // The files this checkpoint will point into (known before writing: the
    // files of `prev` that hold a live piece and are not evicted).
    let refs: BTreeMap<u64, u64> = match prev {
        Some(p) => live
            .keys()
            .filter(|f| !evict.contains(f))
            .map(|f| (*f, p.sizes.get(f).copied().unwrap_or(0)))
            .collect(),
        None => BTreeMap::new(),
    };
    let file = vfs
        .create(&tmp)
        .map_err(|e| StorageError::io("create", &tmp, &e))?;
    let mut pages = HashMap::new();
    let mut leaves = HashMap::new();
    let mut bytes = 0u64;
    let mut documents = 0u64;
    let result = (|| -> Result<(), StorageError> {
        let mut unsynced = 0u64;
        let mut out: Vec<u8> = Vec::with_capacity(CHUNK + 4096);
        let mut flush = |out: &mut Vec<u8>, bytes: &mut u64, force: bool| {
            if out.len() >= CHUNK || (force && !out.is_empty()) {
                file.append(out)
                    .map_err(|e| StorageError::io("write", &tmp, &e))?;
                *bytes += out.len() as u64;
                unsynced += out.len() as u64;
                out.clear();
                if unsynced >= BYTES_PER_SYNC {
                    file.sync()
                        .map_err(|e| StorageError::io("fsync", &tmp, &e))?;
                    unsynced = 0;
                }
            }
            Ok::<(), StorageError>(())
        };
        let mut p = vec![b'H'];
        p.extend_from_slice(MAGIC);
        p.extend_from_slice(&version.to_le_bytes());
        p.extend_from_slice(&csn.to_le_bytes());
        p.extend_from_slice(&(state.collections.len() as u32).to_le_bytes());
        p.extend_from_slice(&state.ts.to_le_bytes());
        p.extend_from_slice(&(refs.len() as u32).to_le_bytes());
        for f in refs.keys() {
            p.extend_from_slice(&f.to_le_bytes());
        }
        frame(&p, &mut out);
        // Per collection: its heap's extents and each index's.
        let mut maps: Vec<(Vec<Extent>, Vec<Vec<Extent>>)> = Vec::new();
        let mut payload = Vec::new();
        for c in state.collections.values() {
            let mut heap = Vec::new();
            let mut failed = Ok(());
            c.heap.for_each_page(&mut |addr, base, slots| {
                if failed.is_err() {
                    return;
                }
                let loc = match prev.and_then(|p| reuse(&p.pages, addr)) {
                    Some(l) => l,
                    None => {
                        payload.clear();
                        payload.push(b'P');
                        payload.extend_from_slice(&base.to_le_bytes());
                        payload.extend_from_slice(&slots.present().to_le_bytes());
                        for (_, d) in slots {
                            payload.extend_from_slice(d.as_bytes());
                        }
                        let loc = frame_piece(&payload, &mut out, bytes, csn);
                        failed = flush(&mut out, &mut bytes, false);
                        loc
                    }
                };
                pages.insert(addr, loc);
                push(&mut heap, loc);
            });
            std::mem::replace(&mut failed, Ok(()))?;
            documents += c.len() as u64;
            let mut indexes = Vec::new();
            for index in Leaves::of(c, version) {
                let mut ext = Vec::new();
                index.for_each(&mut |addr, rids| {
                    if failed.is_err() {
                        return;
                    }
                    let loc = match prev.and_then(|p| reuse(&p.leaves, addr)) {
                        Some(l) => l,
                        None => {
                            payload.clear();
                            payload.push(b'L');
                            payload.extend_from_slice(&(rids.len() as u32).to_le_bytes());
                            for rid in rids {
                                payload.extend_from_slice(&rid.to_le_bytes());
                            }
                            let loc = frame_piece(&payload, &mut out, bytes, csn);
                            failed = flush(&mut out, &mut bytes, false);
                            loc
                        }
                    };
                    leaves.insert(addr, loc);
                    push(&mut ext, loc);
                });
                std::mem::replace(&mut failed, Ok(()))?;
                indexes.push(ext);
            }
            maps.push((heap, indexes));
        }
        for ((name, c), (heap, indexes)) in state.collections.iter().zip(&maps) {
            let mut p = vec![b'C'];
            put_str(&mut p, name);
            p.extend_from_slice(&(c.len() as u64).to_le_bytes());
            p.extend_from_slice(&(c.indexes.len() as u32).to_le_bytes());
            for i in &c.indexes {
                put_spec(&mut p, &i.spec);
            }
            put_options(&mut p, &c.options);
            put_extents(&mut p, heap);
            for ext in indexes {
                put_extents(&mut p, ext);
            }
            frame(&p, &mut out);
            flush(&mut out, &mut bytes, false)?;
        }
        let mut p = vec![b'E'];
        p.extend_from_slice(&csn.to_le_bytes());
        p.extend_from_slice(&documents.to_le_bytes());
        frame(&p, &mut out);
        flush(&mut out, &mut bytes, true)?;
        Ok(())
    })();
    install(vfs, &*file, &tmp, &path, result)?;
    let mut sizes = refs;
    sizes.insert(csn, bytes);
    let full = sizes.len() == 1;
    Ok(Written {
        info: CheckpointInfo {
            csn,
            path,
            bytes,
            documents,
        },
        chain: Chain {
            state: state.clone(),
            pages,
            leaves,
            sizes,
        },
        full,
    })
}

/// One collection found in the map.
struct CollMap {
    name: String,
    n_docs: u64,
    specs: Vec<crate::store::index::IndexSpec>,
    options: crate::store::options::CollectionOptions,
    heap: Vec<Extent>,
    indexes: Vec<Vec<Extent>>,
    /// The `_id` index's leaves (format 7).
    id: Option<Vec<Extent>>,
    at: usize,
}

/// The files of a chain, read: this one's bytes and each older one's.
struct Files<'a> {
    csn: u64,
    own: &'a [u8],
    own_path: &'a Path,
    older: BTreeMap<u64, (PathBuf, Vec<u8>)>,
}

impl Files<'_> {
    fn get(&self, file: u64) -> Option<(&[u8], &Path)> {
        if file == self.csn {
            return Some((self.own, self.own_path));
        }
        self.older
            .get(&file)
            .map(|(p, b)| (b.as_slice(), p.as_path()))
    }
}

/// A piece frame found in an extent: its payload, stored checksum, offset
/// and file.
type Piece<'a> = (&'a [u8], u32, usize, &'a Path);

/// The frames of `extent`, each checked for its tag (`tag`); their
/// checksums are verified only when `verify` (documents frames are
/// verified beside decoding). Anything that is not whole frames of that
/// tag, `extent.pieces` of them exactly filling it, is `Corrupt`.
fn extent_frames<'a>(
    files: &'a Files<'_>,
    extent: &Extent,
    tag: u8,
    verify: bool,
    map_path: &Path,
    map_at: usize,
) -> Result<Vec<Piece<'a>>, StorageError> {
    let Some((buf, path)) = files.get(extent.file) else {
        return Err(StorageError::corrupt(
            map_path,
            map_at as u64,
            format!(
                "the map points into checkpoint {} its header does not name",
                extent.file
            ),
        ));
    };
    let end = extent
        .off
        .checked_add(extent.len)
        .filter(|&e| e <= buf.len() as u64);
    let Some(end) = end else {
        return Err(StorageError::corrupt(
            path,
            extent.off,
            "a piece extent runs past the end of the file",
        ));
    };
    let region = &buf[..end as usize];
    let mut pos = extent.off as usize;
    let mut out = Vec::with_capacity((extent.pieces as usize).min(1 << 16));
    while pos < region.len() {
        let at = pos;
        let (payload, crc, next) = match frame_unchecked(region, pos) {
            Ok(Some(f)) => f,
            Ok(None) => break,
            Err(why) => return Err(StorageError::corrupt(path, at as u64, why)),
        };
        if (verify || payload.first() != Some(&tag)) && crc32c::crc32c(payload) != crc {
            return Err(StorageError::corrupt(path, at as u64, "checksum mismatch"));
        }
        if payload.first() != Some(&tag) {
            return Err(StorageError::corrupt(
                path,
                at as u64,
                "not the piece its map names",
            ));
        }
        out.push((payload, crc, at, path));
        pos = next;
    }
    if out.len() != extent.pieces as usize {
        return Err(StorageError::corrupt(
            path,
            extent.off,
            "a piece extent does not hold its count of pieces",
        ));
    }
    Ok(out)
}

/// Load a format-5 checkpoint whose header frame was read from `buf` at
/// `path` (fields after the version in `r`): read the older files it names
/// with `read` (`None`: none may be named, as when decoding bytes alone) and
/// build the state. Returns the state, the load's times and the files the
/// checkpoint needs (its own csn included).
pub(super) fn decode(
    buf: &[u8],
    path: &Path,
    db: &str,
    mut r: Reader,
    version: u32,
    header_end: usize,
    read: Option<ReadOlder>,
) -> Result<(DbState, LoadTimes, Vec<u64>), StorageError> {
    let mut times = LoadTimes::default();
    let t = Instant::now();
    let corrupt = |off: usize, what: &str| StorageError::corrupt(path, off as u64, what);
    let dec = |off: usize| move |e: DecodeError| StorageError::corrupt(path, off as u64, e.0);
    let csn = r.u64().map_err(dec(0))?;
    let n_colls = r.u32().map_err(dec(0))?;
    let ts = r.u64().map_err(dec(0))?;
    let n_refs = r.u32().map_err(dec(0))?;
    let mut refs = Vec::new();
    for _ in 0..n_refs {
        let f = r.u64().map_err(dec(0))?;
        if f >= csn || refs.last().is_some_and(|l| *l >= f) {
            return Err(corrupt(0, "the older checkpoints named are not ascending"));
        }
        refs.push(f);
    }
    if !r.done() {
        return Err(corrupt(0, "bytes after the header"));
    }
    // Pieces until the first collection (or end) frame.
    let mut pos = header_end;
    let next = |pos: &mut usize| -> Result<(&[u8], usize), StorageError> {
        let at = *pos;
        match frame_unchecked(buf, at) {
            Ok(Some((p, crc, n))) => {
                *pos = n;
                // Pieces are verified when an extent names them; map and
                // end frames here.
                if !matches!(p.first(), Some(b'P' | b'L')) && crc32c::crc32c(p) != crc {
                    return Err(corrupt(at, "checksum mismatch"));
                }
                Ok((p, at))
            }
            Ok(None) => Err(corrupt(at, "ends before its end frame")),
            Err(why) => Err(corrupt(at, &why)),
        }
    };
    let mut colls = Vec::new();
    let mut frame = next(&mut pos)?;
    while matches!(frame.0.first(), Some(b'P' | b'L')) {
        frame = next(&mut pos)?;
    }
    for _ in 0..n_colls {
        let (p, at) = frame;
        let mut r = Reader::new(p);
        if r.u8().map_err(dec(at))? != b'C' {
            return Err(corrupt(at, "expected a collection frame"));
        }
        let name = r.str().map_err(dec(at))?;
        let n_docs = r.u64().map_err(dec(at))?;
        let n_specs = r.u32().map_err(dec(at))?;
        let mut specs = Vec::new();
        for _ in 0..n_specs {
            specs.push(read_spec(&mut r).map_err(dec(at))?);
        }
        let options = read_options(&mut r).map_err(dec(at))?;
        let heap = read_extents(&mut r).map_err(dec(at))?;
        let mut indexes = Vec::new();
        for _ in 0..n_specs {
            indexes.push(read_extents(&mut r).map_err(dec(at))?);
        }
        let id = if version >= CHAIN_VERSION {
            Some(read_extents(&mut r).map_err(dec(at))?)
        } else {
            None
        };
        if !r.done() {
            return Err(corrupt(at, "bytes after the collection's map"));
        }
        colls.push(CollMap {
            name,
            n_docs,
            specs,
            options,
            heap,
            indexes,
            id,
            at,
        });
        frame = next(&mut pos)?;
    }
    let (p, at) = frame;
    let mut r = Reader::new(p);
    if r.u8().map_err(dec(at))? != b'E' {
        return Err(corrupt(at, "expected the end frame"));
    }
    let total: u64 = colls.iter().map(|c| c.n_docs).sum();
    if r.u64().map_err(dec(at))? != csn || r.u64().map_err(dec(at))? != total {
        return Err(corrupt(at, "end frame does not match the content"));
    }
    if pos != buf.len() {
        return Err(corrupt(pos, "bytes after the end frame"));
    }
    times.frames = t.elapsed();
    let t = Instant::now();
    let mut older = BTreeMap::new();
    for &f in &refs {
        let Some(read) = read else {
            return Err(corrupt(
                0,
                "names older checkpoint files, read without them",
            ));
        };
        older.insert(f, read(f)?);
    }
    times.read = t.elapsed();
    let files = Files {
        csn,
        own: buf,
        own_path: path,
        older,
    };
    let mut state = DbState {
        db: Arc::from(db),
        csn,
        ts,
        ..Default::default()
    };
    let out = Arc::make_mut(&mut state.collections);
    for coll in colls {
        let t = Instant::now();
        let mut frames = Vec::new();
        let mut rids: Vec<RecordId> = Vec::with_capacity(coll.n_docs.min(1 << 24) as usize);
        for e in &coll.heap {
            for (payload, crc, at, fpath) in extent_frames(&files, e, b'P', false, path, coll.at)? {
                let mut r = Reader::new(payload);
                let head = (r.u8(), r.u64(), r.u64());
                let (Ok(_), Ok(base), Ok(present)) = head else {
                    let what = if crc32c::crc32c(payload) != crc {
                        "checksum mismatch"
                    } else {
                        "page frame too short"
                    };
                    return Err(StorageError::corrupt(fpath, at as u64, what));
                };
                let mut bits = present;
                while bits != 0 {
                    let rid = base | u64::from(bits.trailing_zeros());
                    bits &= bits - 1;
                    if rids.last().is_some_and(|l| *l >= rid) || base & 63 != 0 {
                        return Err(StorageError::corrupt(
                            fpath,
                            at as u64,
                            "heap pages out of order",
                        ));
                    }
                    rids.push(rid);
                }
                frames.push(DocFrame {
                    docs: &payload[r.pos..],
                    n: present.count_ones(),
                    payload,
                    crc,
                    at,
                    path: fpath,
                });
            }
        }
        if rids.len() as u64 != coll.n_docs {
            return Err(corrupt(
                coll.at,
                "the collection's pages do not hold its count",
            ));
        }
        let docs = decode_frames(&frames, path)?;
        drop(frames);
        // Record id -> position: a table while the ids are not much sparser
        // than the records (a binary search per entry cost more than the
        // documents' decode), else searched.
        let max = rids.last().map_or(0, |r| r.saturating_add(1));
        let dense = usize::try_from(max)
            .ok()
            .filter(|&m| m <= rids.len().saturating_mul(4).saturating_add(1 << 16))
            .map(|m| {
                let mut at = vec![u32::MAX; m];
                for (pos, &rid) in rids.iter().enumerate() {
                    at[rid as usize] = u32::try_from(pos).unwrap_or(u32::MAX);
                }
                at
            });
        let position = |rid: u64| -> Option<u32> {
            match &dense {
                Some(at) => usize::try_from(rid)
                    .ok()
                    .and_then(|r| at.get(r))
                    .copied()
                    .filter(|&p| p != u32::MAX),
                None => rids
                    .binary_search(&rid)
                    .ok()
                    .and_then(|p| u32::try_from(p).ok()),
            }
        };
        // An index's stored order from its leaves: `None` when a leaf names
        // no record (the order does not fit: sorted at load).
        let order_of = |exts: &[Extent]| -> Result<Option<Vec<u32>>, StorageError> {
            let mut order: Option<Vec<u32>> = Some(Vec::new());
            for e in exts {
                for (payload, _, at, fpath) in extent_frames(&files, e, b'L', true, path, coll.at)?
                {
                    let mut r = Reader::new(&payload[1..]);
                    let n = r.u32().ok();
                    let ids = &payload[payload.len().min(5)..];
                    if n.map(|n| n as usize * 8) != Some(ids.len()) {
                        return Err(StorageError::corrupt(
                            fpath,
                            at as u64,
                            "leaf frame does not match its count",
                        ));
                    }
                    if let Some(o) = order.as_mut() {
                        for b in ids.chunks_exact(8) {
                            let mut a = [0u8; 8];
                            a.copy_from_slice(b);
                            match position(u64::from_le_bytes(a)) {
                                Some(p) => o.push(p),
                                // Names no record: the order does not fit; sorted.
                                None => {
                                    order = None;
                                    break;
                                }
                            }
                        }
                    }
                }
            }
            Ok(order)
        };
        // In map order (the first damaged leaf in it is the one reported).
        let indexes = coll
            .indexes
            .iter()
            .map(|exts| order_of(exts))
            .collect::<Result<_, _>>()?;
        let id = match &coll.id {
            Some(exts) => order_of(exts)?,
            None => None,
        };
        let orders = StoredOrders { id, indexes };
        times.decode += t.elapsed();
        let c = build_collection(
            &format!("{db}.{}", coll.name),
            (coll.options, docs, coll.specs, orders),
            &mut times,
        )
        .map_err(|e| corrupt(coll.at, &e))?;
        out.insert(coll.name, c);
    }
    let mut needs = refs;
    needs.push(csn);
    Ok((state, times, needs))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::durability::checkpoint::{load_with_files, write as write_full};
    use crate::durability::io::SimFs;
    use crate::store::collection::CollectionState;
    use crate::store::index::IndexSpec;
    use bson::doc;
    use proptest::prelude::*;

    fn raw(d: bson::Document) -> (Arc<bson::RawDocumentBuf>, bson::RawBson) {
        let d = bson::RawDocumentBuf::try_from(&d).expect("test value");
        let id = crate::doc::id_of(&d).expect("test value").into();
        (Arc::new(d), id)
    }

    fn coll<'a>(state: &'a mut DbState, name: &str) -> &'a mut CollectionState {
        let ns = format!("t.{name}");
        Arc::make_mut(&mut state.collections)
            .entry(name.to_string())
            .or_insert_with(|| CollectionState::new(&ns, Default::default()))
    }

    fn the_doc(i: i64, v: i64) -> bson::Document {
        doc! {"_id": i, "a": v % 13, "tags": [v % 5, v % 7], "pad": "x".repeat(60)}
    }

    /// A state of `n` documents in `c` with two secondary indexes.
    fn state_of(n: i64) -> DbState {
        let mut state = DbState {
            db: Arc::from("t"),
            csn: 1,
            ..Default::default()
        };
        let c = coll(&mut state, "c");
        for (keys, unique) in [(doc! {"a": 1}, false), (doc! {"tags": 1, "_id": -1}, false)] {
            let spec = IndexSpec::new(&keys, None, unique).expect("test value");
            c.create_index(spec).expect("test value");
        }
        for i in 0..n {
            let (d, id) = raw(the_doc(i, i));
            c.insert(d, id).expect("test value");
        }
        state
    }

    /// `back` holds what `state` does: per collection the documents in
    /// order, the specs and options, and every index's entries (mapped
    /// through the records, as ids are renumbered at load).
    fn assert_same(state: &DbState, back: &DbState) {
        assert_eq!(back.csn, state.csn);
        assert_eq!(
            back.collections.keys().collect::<Vec<_>>(),
            state.collections.keys().collect::<Vec<_>>()
        );
        for (name, a) in state.collections.iter() {
            let b = back.collection(name).expect("test value");
            b.check_invariants().expect("test value");
            let docs =
                |c: &CollectionState| c.heap.iter().map(|(_, d)| d.clone()).collect::<Vec<_>>();
            assert_eq!(docs(a), docs(b), "{name}");
            assert_eq!(a.options, b.options);
            assert_eq!(a.indexes.len(), b.indexes.len());
            let ids = |c: &CollectionState| {
                c.id_index
                    .iter()
                    .map(|(k, rid)| (k.clone(), c.get(*rid).cloned()))
                    .collect::<Vec<_>>()
            };
            assert_eq!(ids(a), ids(b), "{name}");
            for (x, y) in a.indexes.iter().zip(&b.indexes) {
                assert_eq!(x.spec, y.spec);
                let entries = |c: &CollectionState, i: &crate::store::index::IndexState| {
                    i.tree
                        .iter()
                        .map(|((k, rid), ())| (k.clone(), c.get(*rid).cloned()))
                        .collect::<Vec<_>>()
                };
                assert_eq!(entries(a, x), entries(b, y));
            }
        }
    }

    fn load(fs: &SimFs, info: &CheckpointInfo) -> (DbState, LoadTimes, Vec<u64>) {
        load_with_files(fs, &info.path, "t").expect("test value")
    }

    /// A state changed a little and checkpointed again writes only the
    /// changed page and leaves, and loads equal to a full checkpoint of the
    /// same state, with the indexes in their stored order (no sort).
    #[test]
    fn a_small_change_writes_only_its_pieces() {
        let fs = SimFs::new();
        let dir = Path::new("/d");
        let mut state = state_of(20_000);
        let first = write(&fs, dir, &state, None).expect("test value");
        assert!(first.full);
        let full_bytes = first.info.bytes;
        // One document updated (its index keys change), one inserted.
        state.csn = 2;
        let c = coll(&mut state, "c");
        let rid = c
            .rid_of_id(&bson::RawBson::Int64(777))
            .or_else(|| c.rid_of_id(&bson::RawBson::Int32(777)))
            .expect("test value");
        let (d, _) = raw(the_doc(777, 1_000_001));
        c.replace(rid, d).expect("test value");
        let (d, id) = raw(the_doc(20_000, 3));
        c.insert(d, id).expect("test value");
        let second = write(&fs, dir, &state, Some(&first.chain)).expect("test value");
        assert!(!second.full);
        // Two pages (about 64 documents of ~100 bytes each), a few leaves, and the map.
        assert!(
            second.info.bytes * 50 < full_bytes,
            "{} of {full_bytes}",
            second.info.bytes
        );
        assert_eq!(second.chain.files(), vec![1, 2]);
        let (back, times, files) = load(&fs, &second.info);
        assert_eq!(files, vec![1, 2]);
        assert_eq!(
            (times.indexes_in_stored_order, times.indexes_sorted),
            (2, 0)
        );
        assert_eq!((times.ids_in_stored_order, times.ids_sorted), (1, 0));
        assert_same(&state, &back);
        // The same state written whole (format 4) loads the same.
        let whole = write_full(&fs, Path::new("/e"), &state).expect("test value");
        let (full, _, _) = load_with_files(&fs, &whole.path, "t").expect("test value");
        assert_same(&full, &back);
        // Unchanged: nothing but the header, the map and the end.
        let mut same = state.clone();
        same.csn = 3;
        let third = write(&fs, dir, &same, Some(&second.chain)).expect("test value");
        assert!(third.info.bytes < 4096, "{}", third.info.bytes);
        assert_same(&same, &load(&fs, &third.info).0);
    }

    /// A chain of format 5 (no `_id` leaves, as builds before format 7
    /// wrote) loads by sorting the ids; a format-7 checkpoint chained on it
    /// writes the `_id` leaves it lacks (and only the changed pieces
    /// otherwise) and loads with every index in its stored order. An `_id`
    /// leaf whose record ids are out of `_id` order (checksum valid) only
    /// costs the sort; the state is the same each time.
    #[test]
    fn format_5_chains_load_and_the_id_order_is_checked() {
        let fs = SimFs::new();
        let dir = Path::new("/d");
        let mut state = state_of(5_000);
        let old = write_version(&fs, dir, &state, None, CHAIN_VERSION_5).expect("test value");
        let (back, times, _) = load(&fs, &old.info);
        assert_eq!(
            (times.indexes_in_stored_order, times.indexes_sorted),
            (2, 0)
        );
        assert_eq!((times.ids_in_stored_order, times.ids_sorted), (0, 1));
        assert_same(&state, &back);
        state.csn = 2;
        let (d, id) = raw(the_doc(9_000, 4));
        coll(&mut state, "c").insert(d, id).expect("test value");
        let new = write(&fs, dir, &state, Some(&old.chain)).expect("test value");
        assert!(!new.full);
        assert!(new.info.bytes < old.info.bytes / 4, "{}", new.info.bytes);
        let (back, times, files) = load(&fs, &new.info);
        assert_eq!(files, vec![1, 2]);
        assert_eq!((times.ids_in_stored_order, times.ids_sorted), (1, 0));
        assert_same(&state, &back);
        // The `_id` leaves are the last leaves of the newest file: swap the
        // first two record ids of the last one.
        let image = fs.read(&new.info.path).expect("test value");
        let mut pos = 0;
        let mut last_leaf = None;
        while let Ok(Some((p, next))) = super::super::wal::read_frame(&image, pos) {
            if p[0] == b'L' {
                last_leaf = Some((pos, p.to_vec()));
            }
            pos = next;
        }
        let (at, mut p) = last_leaf.expect("test value");
        assert!(p.len() >= 5 + 16);
        let first: Vec<u8> = p[5..13].to_vec();
        p.copy_within(13..21, 5);
        p[13..21].copy_from_slice(&first);
        let mut bad = image[..at].to_vec();
        frame(&p, &mut bad);
        bad.extend_from_slice(&image[bad.len()..]);
        fs.remove(&new.info.path).expect("test value");
        fs.create(&new.info.path)
            .expect("test value")
            .append(&bad)
            .expect("test value");
        let (back, times, _) = load(&fs, &new.info);
        assert_eq!(
            (times.indexes_in_stored_order, times.indexes_sorted),
            (2, 0)
        );
        assert_eq!((times.ids_in_stored_order, times.ids_sorted), (0, 1));
        assert_same(&state, &back);
    }

    /// Damage in an older file the chain points into, or in the newest one,
    /// is `Corrupt` naming that file; a missing older file is `Missing`.
    #[test]
    fn damage_anywhere_in_the_chain_is_an_error() {
        let fs = SimFs::new();
        let dir = Path::new("/d");
        let mut state = state_of(3_000);
        let first = write(&fs, dir, &state, None).expect("test value");
        state.csn = 2;
        let (d, id) = raw(the_doc(5_000, 1));
        coll(&mut state, "c").insert(d, id).expect("test value");
        let second = write(&fs, dir, &state, Some(&first.chain)).expect("test value");
        let older = first.info.path.clone();
        let good = fs.read(&older).expect("test value");
        // In its pages and its leaves (its own header and map are not read:
        // only the pieces the newer map names are part of the state).
        for at in [100, good.len() / 3, good.len() * 9 / 10] {
            let mut bad = good.clone();
            bad[at] ^= 0x10;
            fs.remove(&older).expect("test value");
            let f = fs.create(&older).expect("test value");
            f.append(&bad).expect("test value");
            match load_with_files(&fs, &second.info.path, "t") {
                Err(StorageError::Corrupt { path, .. }) => assert_eq!(path, older, "flip at {at}"),
                other => panic!("flip at {at}: {other:?}"),
            }
        }
        fs.remove(&older).expect("test value");
        assert!(matches!(
            load_with_files(&fs, &second.info.path, "t"),
            Err(StorageError::Missing { .. })
        ));
        let newest = fs.read(&second.info.path).expect("test value");
        for cut in [1, 10, newest.len() / 2] {
            assert!(matches!(
                super::super::checkpoint::decode(
                    &newest[..newest.len() - cut],
                    &second.info.path,
                    "t"
                ),
                Err(StorageError::Corrupt { .. })
            ));
        }
        // Bytes alone (no directory to read older files from) refuse too.
        assert!(matches!(
            super::super::checkpoint::decode(&newest, &second.info.path, "t"),
            Err(StorageError::Corrupt { .. })
        ));
    }

    /// Many small checkpoints never chain more than `MAX_FILES` files, and
    /// compaction rewrites only the live pieces of small or mostly dead
    /// files: the bytes written stay a small share of writing whole each
    /// time. Rewriting most documents makes the first file mostly dead: it
    /// is compacted away.
    #[test]
    fn the_chain_is_compacted() {
        let fs = SimFs::new();
        let dir = Path::new("/d");
        let mut state = state_of(2_000);
        let mut w = write(&fs, dir, &state, None).expect("test value");
        let whole = w.info.bytes;
        let mut written = 0;
        for i in 0..60 {
            state.csn += 1;
            let (d, id) = raw(the_doc(10_000 + i, i));
            coll(&mut state, "c").insert(d, id).expect("test value");
            w = write(&fs, dir, &state, Some(&w.chain)).expect("test value");
            assert!(!w.full);
            written += w.info.bytes;
            assert!(w.chain.files().len() <= MAX_FILES, "{:?}", w.chain.files());
        }
        assert!(written < whole * 60 / 10, "{written} vs {whole} each");
        assert_same(&state, &load(&fs, &w.info).0);
        assert!(w.chain.files().contains(&1));
        // Most documents rewritten: the first file is mostly dead.
        for i in (0..2_000).step_by(2) {
            let c = coll(&mut state, "c");
            let rid = c.rid_of_id(&bson::RawBson::Int64(i)).expect("test value");
            c.replace(rid, raw(the_doc(i, i + 1)).0)
                .expect("test value");
        }
        for _ in 0..2 {
            state.csn += 1;
            w = write(&fs, dir, &state, Some(&w.chain)).expect("test value");
        }
        assert!(!w.chain.files().contains(&1), "{:?}", w.chain.files());
        assert_same(&state, &load(&fs, &w.info).0);
    }

    /// Any single flipped byte or cut of a whole (self-contained) chained
    /// image is an error or, where no checked byte changed, the same state;
    /// never a panic. With valid checksums (fields rewritten), neither.
    #[test]
    fn every_flip_of_a_small_image_is_handled() {
        let fs = SimFs::new();
        let state = state_of(40);
        let w = write(&fs, Path::new("/d"), &state, None).expect("test value");
        let good = fs.read(&w.info.path).expect("test value");
        let decode = |b: &[u8]| super::super::checkpoint::decode(b, &w.info.path, "t");
        for i in 0..good.len() {
            let mut bad = good.clone();
            bad[i] ^= 0x24;
            if let Ok(back) = decode(&bad) {
                assert_same(&state, &back);
            }
            assert!(decode(&good[..i]).is_err());
        }
        // Frames with valid checksums but altered fields.
        let mut pos = 0;
        let mut frames = Vec::new();
        while let Ok(Some((p, next))) = super::super::wal::read_frame(&good, pos) {
            frames.push(p.to_vec());
            pos = next;
        }
        for f in 0..frames.len() {
            // A page's documents are BSON checked at decode: its header only.
            let n = if frames[f][0] == b'P' {
                24
            } else {
                frames[f].len()
            };
            for i in 0..n {
                for x in [0x01u8, 0x80, 0xff] {
                    let mut out = Vec::new();
                    for (g, p) in frames.iter().enumerate() {
                        let mut p = p.clone();
                        if g == f {
                            p[i] ^= x;
                        }
                        frame(&p, &mut out);
                    }
                    let _ = decode(&out);
                }
            }
        }
    }

    #[derive(Debug, Clone)]
    enum Op {
        Insert(i64, i64),
        Update(i64, i64),
        Delete(i64),
        NewCollection(u8),
        DropCollection(u8),
        Checkpoint,
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            4 => (0..3000i64, 0..100i64).prop_map(|(i, v)| Op::Insert(i, v)),
            4 => (0..3000i64, 0..100i64).prop_map(|(i, v)| Op::Update(i, v)),
            2 => (0..3000i64).prop_map(Op::Delete),
            1 => (0..3u8).prop_map(Op::NewCollection),
            1 => (0..3u8).prop_map(Op::DropCollection),
            2 => Just(Op::Checkpoint),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]

        /// Random changes between checkpoints: every chained checkpoint
        /// loads equal to the state it was written from (and so to a full
        /// checkpoint of it).
        #[test]
        fn chained_checkpoints_load_the_state(ops in proptest::collection::vec(op(), 1..120)) {
            let fs = SimFs::new();
            let dir = Path::new("/d");
            let mut state = state_of(1_500);
            let mut chain = write(&fs, dir, &state, None).expect("test value").chain;
            for op in ops.iter().chain([Op::Checkpoint].iter()) {
                let c = coll(&mut state, "c");
                let rid = |c: &CollectionState, i: i64| c.rid_of_id(&bson::RawBson::Int64(i));
                match op {
                    Op::Insert(i, v) => {
                        if rid(c, *i).is_none() {
                            let (d, id) = raw(the_doc(*i, *v));
                            c.insert(d, id).expect("test value");
                        }
                    }
                    Op::Update(i, v) => {
                        if let Some(r) = rid(c, *i) {
                            c.replace(r, raw(the_doc(*i, *v)).0).expect("test value");
                        }
                    }
                    Op::Delete(i) => {
                        if let Some(r) = rid(c, *i) {
                            c.delete(r).expect("test value");
                        }
                    }
                    Op::NewCollection(n) => {
                        let o = coll(&mut state, &format!("o{n}"));
                        let k = o.len() as i64;
                        for j in k..k + 100 {
                            let (d, id) = raw(the_doc(j, j));
                            o.insert(d, id).expect("test value");
                        }
                    }
                    Op::DropCollection(n) => {
                        Arc::make_mut(&mut state.collections).remove(&format!("o{n}"));
                    }
                    Op::Checkpoint => {
                        state.csn += 1;
                        let w = write(&fs, dir, &state, Some(&chain)).expect("test value");
                        let (back, times, files) = load(&fs, &w.info);
                        prop_assert_eq!(times.indexes_sorted, 0);
                        prop_assert_eq!(times.ids_sorted, 0);
                        prop_assert_eq!(files, w.chain.files());
                        assert_same(&state, &back);
                        chain = w.chain;
                    }
                }
            }
        }
    }
}
