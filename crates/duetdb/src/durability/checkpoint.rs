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
//! specs (measured in the final report: the rebuild is a fraction of recovery
//! time, and a stored index would double the checkpoint and need its own
//! format and checks).
//!
//! Invariants:
//! - a checkpoint file under its final name is complete and synced: it is
//!   written as `.tmp`, fsynced, then renamed (the manifest switch syncs the
//!   directory);
//! - loading verifies every checksum, the counts, and that nothing follows `E`;
//!   any mismatch is a `Corrupt` error, never a partial state.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::effect::{put_options, put_spec, put_str, read_options, read_spec, DecodeError, Reader};
use super::io::Vfs;
use super::wal::{frame, read_frame};
use crate::error::StorageError;
use crate::store::collection::CollectionState;
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

/// Load the checkpoint at `path` into a state for database `db`.
pub fn load(vfs: &dyn Vfs, path: &Path, db: &str) -> Result<DbState, StorageError> {
    let buf = vfs
        .read(path)
        .map_err(|e| StorageError::io("read", path, &e))?;
    decode(&buf, path, db)
}

/// Decode a checkpoint image read from `path` (named in errors). Any damage
/// is a `Corrupt` error naming the offset; never a panic.
pub fn decode(buf: &[u8], path: &Path, db: &str) -> Result<DbState, StorageError> {
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
    let mut state = DbState {
        db: Arc::from(db),
        csn,
        ts,
        ..Default::default()
    };
    let mut total = 0u64;
    let colls = Arc::make_mut(&mut state.collections);
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
        let mut c = CollectionState::new(&format!("{db}.{name}"), Default::default());
        c.options = options;
        let mut loaded = 0u64;
        while loaded < n_docs {
            let (p, at) = next(&mut pos)?;
            let mut r = Reader::new(p);
            if r.u8().map_err(dec(at))? != b'D' {
                return Err(corrupt(at, "expected a documents frame".into()));
            }
            let n = r.u32().map_err(dec(at))?;
            for _ in 0..n {
                let d = Arc::new(r.doc().map_err(dec(at))?);
                let id = crate::doc::id_of(&d)
                    .ok_or_else(|| corrupt(at, "document without _id".into()))?
                    .into();
                c.insert(d, id)
                    .map_err(|e| corrupt(at, format!("document does not load: {e}")))?;
                loaded += 1;
            }
            if !r.done() || loaded > n_docs {
                return Err(corrupt(
                    at,
                    "documents frame does not match its count".into(),
                ));
            }
        }
        for spec in specs {
            c.create_index(spec)
                .map_err(|e| corrupt(at, format!("index does not rebuild: {e}")))?;
        }
        total += loaded;
        colls.insert(name, c);
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
    Ok(state)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::durability::io::SimFs;
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
