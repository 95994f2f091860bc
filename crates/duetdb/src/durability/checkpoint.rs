//! Checkpoints: a complete image of one published state, written from a held
//! `cow` snapshot so writers never pause, and loaded at recovery.
//!
//! Layout of `ckpt-<csn, 20 digits>.ckpt` (see docs/design.md §13.4): a sequence
//! of WAL-style frames `[len u32][crc32c u32][payload]`:
//! - `H`: magic `DUETCKP\x01`, format version u32 (3), csn u64, collection
//!   count u32, cluster time u64 of the state (version 1, still read, has no
//!   time: it loads as 0);
//! - per collection `C`: name, document count u64, index spec count u32, specs
//!   (BSON, the `listIndexes` form), and (version 3) the collection options
//!   (BSON, the `listCollections` form; versions 1 and 2, still read, have
//!   none: defaults); then `D` frames of up to ~1 MiB of documents
//!   (count u32, BSON documents) in record order;
//! - `E`: csn u64 and total documents u64; the file ends right after it.
//!
//! Indexes are not stored: they are rebuilt at load from the documents and
//! specs (a stored index would double the checkpoint and need its own format
//! and checks). Loading walks the frames in order, then verifies and decodes
//! the documents frames on up to one thread per core and builds each
//! collection's heap and indexes side by side (`store::bulk_load`); the
//! phases are timed ([`LoadTimes`], in the recovery report).
//!
//! Invariants:
//! - a checkpoint file under its final name is complete and synced: it is
//!   written as `.tmp`, fsynced, then renamed (the manifest switch syncs the
//!   directory);
//! - loading verifies every checksum, the counts, and that nothing follows `E`;
//!   any mismatch is a `Corrupt` error, never a partial state: nothing is
//!   built before the whole frame walk succeeded, and a damaged frame is
//!   named by its offset whichever thread found it (within a collection,
//!   the first damaged documents frame in file order).

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::effect::{put_options, put_spec, put_str, read_options, read_spec, DecodeError, Reader};
use super::io::Vfs;
use super::wal::{frame, frame_unchecked, read_frame};
use crate::doc::DocRef;
use crate::error::StorageError;
use crate::store::bulk_load;
use crate::store::index::IndexSpec;
use crate::store::options::CollectionOptions;
use crate::store::DbState;

const MAGIC: &[u8; 8] = b"DUETCKP\x01";
pub const FORMAT_VERSION: u32 = 3;
/// Documents are framed in chunks of about this many bytes.
const CHUNK: usize = 1 << 20;
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
        p.extend_from_slice(&FORMAT_VERSION.to_le_bytes());
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
        }
        let mut p = vec![b'E'];
        p.extend_from_slice(&state.csn.to_le_bytes());
        p.extend_from_slice(&documents.to_le_bytes());
        frame(&p, &mut out);
        flush(&mut out, true)?;
        file.sync()
            .map_err(|e| StorageError::io("fsync", &tmp, &e))?;
        vfs.rename(&tmp, &path)
            .map_err(|e| StorageError::io("rename", &tmp, &e))
    })();
    if let Err(e) = result {
        // Never reuse a file whose fsync failed; a later checkpoint writes a new one.
        let _ = vfs.remove(&tmp);
        return Err(e);
    }
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
    let t = Instant::now();
    let buf = vfs
        .read(path)
        .map_err(|e| StorageError::io("read", path, &e))?;
    let read = t.elapsed();
    let (state, mut times) = decode_timed(&buf, path, db)?;
    times.read = read;
    Ok((state, times))
}

/// Decode a checkpoint image read from `path` (named in errors). Any damage
/// is a `Corrupt` error naming the offset; never a panic.
pub fn decode(buf: &[u8], path: &Path, db: &str) -> Result<DbState, StorageError> {
    decode_timed(buf, path, db).map(|(state, _)| state)
}

/// A documents frame found by the walk: its payload after the tag and count
/// (checksum not verified yet), the count, its checksum and its offset.
struct DocFrame<'a> {
    docs: &'a [u8],
    n: u32,
    payload: &'a [u8],
    crc: u32,
    at: usize,
}

/// One collection found by the walk.
struct CollFrames<'a> {
    name: String,
    specs: Vec<IndexSpec>,
    options: CollectionOptions,
    frames: Vec<DocFrame<'a>>,
    /// The collection frame's offset (named when its indexes do not build).
    at: usize,
}

/// Below this many documents a collection is decoded on the calling thread:
/// starting threads would cost more than they save.
const PARALLEL_MIN_DOCS: u64 = 16 * 1024;

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
    if !(1..=FORMAT_VERSION).contains(&version) {
        return Err(corrupt(
            at,
            format!("format version {version}, this build reads {FORMAT_VERSION}"),
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
        total += loaded;
        colls.push(CollFrames {
            name,
            specs,
            options,
            frames,
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
        let t = Instant::now();
        let c = bulk_load::load_collection(
            &format!("{db}.{}", coll.name),
            coll.options,
            docs,
            coll.specs,
        )
        .map_err(|e| corrupt(coll.at, format!("collection does not load: {e}")))?;
        times.build += t.elapsed();
        out.insert(coll.name, c);
    }
    Ok((state, times))
}

/// The documents frame at `*pos`, its checksum not verified yet (that is
/// done beside decoding, in parallel); moves `*pos` past it. A frame whose
/// structure is wrong reports a checksum mismatch first when it has one:
/// damage, not a writer's bug, is the likely cause.
fn walk_doc_frame<'a>(
    buf: &'a [u8],
    pos: &mut usize,
    path: &Path,
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
fn decode_frames(frames: &[DocFrame], path: &Path) -> Result<Vec<DocRef>, StorageError> {
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
fn decode_run(frames: &[DocFrame], path: &Path) -> Result<Vec<DocRef>, StorageError> {
    let mut docs = Vec::with_capacity(frames.iter().map(|f| f.n as usize).sum());
    for f in frames {
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
        let (back, _) = load_timed(&fs, &info.path, "t").expect("test value");
        let (a, b) = (
            state.collection("c").expect("test value"),
            back.collection("c").expect("test value"),
        );
        b.check_invariants().expect("test value");
        assert_eq!(a.len(), n as usize);
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
        // And what this build writes for those options is that image.
        let fs = SimFs::new();
        let info = write(&fs, Path::new("/d"), &state_with(c.options.clone())).expect("test value");
        let written = fs.read(&info.path).expect("test value");
        assert_eq!(written, out);
    }
}
