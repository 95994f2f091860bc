//! Replays the committed cargo-fuzz corpora of the on-disk decoders
//! (`fuzz/corpus/{wal,effect,checkpoint}/`) through the same entry points the
//! fuzz targets call (`duetdb::fuzzing::*_target`), so stable CI runs every
//! seed and every kept reproducer without nightly or libFuzzer.
//!
//! The seeds are real files: a database on the simulated file system goes
//! through every kind of write (inserts of many BSON types, updates, deletes,
//! unique and compound indexes, rename, drop, a durable named snapshot,
//! checkpoints); its WAL segments, record payloads, effect streams, checkpoint
//! images and manifest become the seeds. Fresh seeds are generated on every
//! run and must decode completely (so a decoder that rejects valid input
//! fails here); the committed files must replay without panic. To rewrite the
//! committed seeds after a format change:
//! `DUET_WRITE_FUZZ_CORPUS=1 cargo test -p duetdb --test fuzz_corpus`.

use std::path::PathBuf;
use std::sync::Arc;

use duetdb::bson::{doc, oid::ObjectId, Binary, Bson, DateTime, Decimal128, Timestamp};
use duetdb::storage::{wal, SimFs, Vfs};
use duetdb::{Database, Durability, DurabilityOptions, IndexOptions, SnapshotOptions};

type Target = fn(&[u8]) -> duetdb::fuzzing::Decoded;

const TARGETS: [(&str, Target); 3] = [
    ("wal", duetdb::fuzzing::wal_target),
    ("effect", duetdb::fuzzing::effect_target),
    ("checkpoint", duetdb::fuzzing::checkpoint_target),
];

fn corpus_dir(target: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../fuzz/corpus")
        .join(target)
}

fn db_dir() -> PathBuf {
    PathBuf::from("/db")
}

/// Every kind of write the log and checkpoints record.
fn workload(db: &Database) {
    let c = db.collection("items");
    let ok = "workload write";
    c.create_index(
        doc! {"sku": 1},
        IndexOptions {
            unique: true,
            ..Default::default()
        },
    )
    .expect(ok);
    c.create_index(doc! {"tags": 1, "price": -1}, IndexOptions::default())
        .expect(ok);
    for i in 0..40i64 {
        c.insert_one(doc! {
            "_id": i,
            "sku": format!("sku-{i}"),
            "price": Bson::Double(i as f64 * 1.5),
            "qty": i as i32,
            "tags": ["a", format!("t{}", i % 3)],
            "nested": {"deep": {"er": [1, {"x": i}]}},
            "when": DateTime::from_millis(1_700_000_000_000 + i),
            "oid": ObjectId::from_bytes([i as u8; 12]),
            "bin": Binary { subtype: duetdb::bson::spec::BinarySubtype::Generic, bytes: vec![i as u8; 5] },
            "dec": Decimal128::from_bytes([i as u8; 16]),
            "ts": Timestamp { time: 1, increment: i as u32 },
            "null": Bson::Null,
        })
        .expect(ok);
    }
    c.insert_one(doc! {"_id": "string-id", "sku": "s", "tags": []})
        .expect(ok);
    c.insert_one(doc! {"_id": {"compound": 1, "k": "v"}, "sku": "c"})
        .expect(ok);
    c.update_many(
        doc! {"qty": {"$lt": 10}},
        doc! {"$inc": {"qty": 100}, "$set": {"updated": true}},
    )
    .expect(ok);
    c.replace_one(doc! {"_id": 7}, doc! {"sku": "replaced", "v": 2})
        .expect(ok);
    c.delete_many(doc! {"qty": {"$gt": 30, "$lt": 100}})
        .expect(ok);
    db.checkpoint().expect(ok);
    let other = db.collection("other");
    other.insert_one(doc! {"_id": 1, "x": 1}).expect(ok);
    db.rename_collection("other", "renamed", false).expect(ok);
    db.collection("gone").insert_one(doc! {"_id": 1}).expect(ok);
    db.drop_collection("gone").expect(ok);
    c.drop_index("tags_1_price_-1").expect(ok);
    db.create_snapshot_with(
        "nightly",
        SnapshotOptions {
            collections: None,
            ttl: None,
            durable: true,
        },
    )
    .expect(ok);
    c.update_one(doc! {"_id": 1}, doc! {"$unset": {"nested": ""}})
        .expect(ok);
}

/// `len:u16 | payload` for each payload (the reframed input form).
fn length_prefixed(payloads: &[&[u8]]) -> Option<Vec<u8>> {
    let mut out = Vec::new();
    for p in payloads {
        out.extend_from_slice(&u16::try_from(p.len()).ok()?.to_le_bytes());
        out.extend_from_slice(p);
    }
    Some(out)
}

fn with_mode(mode: u8, body: &[u8]) -> Vec<u8> {
    let mut v = vec![mode];
    v.extend_from_slice(body);
    v
}

/// The frames of a file after `skip` bytes of magic.
fn frames(buf: &[u8], skip: usize) -> Vec<Vec<u8>> {
    let mut out = Vec::new();
    let mut pos = skip;
    while let Ok(Some((p, next))) = wal::read_frame(buf, pos) {
        out.push(p.to_vec());
        pos = next;
    }
    out
}

/// `(target, file name, bytes)` of every seed.
fn seeds() -> Vec<(&'static str, String, Vec<u8>)> {
    let fs = SimFs::new();
    let opts = DurabilityOptions {
        mode: Durability::Fsync,
        // One segment: every seed decodes from an empty state.
        segment_bytes: 1 << 30,
        checkpoint_wal_bytes: u64::MAX,
        checkpoint_interval: None,
        background_checkpoints: false,
        vfs: Arc::new(fs.clone()),
        ..Default::default()
    };
    let db = Database::open_with(db_dir(), opts).expect("open on SimFs");
    workload(&db);
    drop(db);
    let state = fs.state();
    let read = |name: &str| -> Vec<u8> {
        Vfs::read(&SimFs::from_state(state.clone()), &db_dir().join(name)).expect("read seed file")
    };
    let mut names = state.files_in(&db_dir());
    names.sort();
    let mut out = Vec::new();
    for name in names {
        let bytes = read(&name);
        if name.starts_with("wal-") {
            let records = frames(&bytes, wal::SEGMENT_MAGIC.len());
            let name = "segment.log";
            out.push(("wal", format!("seed-{name}"), with_mode(0, &bytes)));
            let refs: Vec<&[u8]> = records.iter().map(Vec::as_slice).collect();
            if let Some(body) = length_prefixed(&refs) {
                out.push(("wal", format!("seed-{name}-reframed"), with_mode(1, &body)));
            }
            // Effect streams of the first k records (a record is lsn:u64,
            // first:u64, count:u32 — with bit 31 set, version 2, then
            // time:u64 and wall_ms:i64 — then its effects), so each applies
            // to an empty state.
            let mut stream = Vec::new();
            for (i, r) in records.iter().enumerate() {
                let v2 = r.get(19).is_some_and(|b| b & 0x80 != 0);
                let header = if v2 { 36 } else { 20 };
                stream.extend_from_slice(r.get(header..).unwrap_or_default());
                if i % 8 == 7 || i + 1 == records.len() {
                    out.push(("effect", format!("seed-{name}-{i:03}"), stream.clone()));
                }
            }
        } else if name.ends_with(".ckpt") {
            // Pinned images carry a random id in their name: name seeds by kind.
            let name = if name.starts_with("snap-") {
                "snapshot.ckpt"
            } else {
                "checkpoint.ckpt"
            };
            let framed = frames(&bytes, 0);
            let refs: Vec<&[u8]> = framed.iter().map(Vec::as_slice).collect();
            out.push(("checkpoint", format!("seed-{name}"), with_mode(0, &bytes)));
            if let Some(body) = length_prefixed(&refs) {
                out.push((
                    "checkpoint",
                    format!("seed-{name}-reframed"),
                    with_mode(1, &body),
                ));
            }
        } else if name == "MANIFEST" {
            out.push(("checkpoint", "seed-MANIFEST".into(), with_mode(2, &bytes)));
        }
    }
    out
}

fn corpus_files(target: &str) -> Vec<(String, Vec<u8>)> {
    let dir = corpus_dir(target);
    let mut files: Vec<(String, Vec<u8>)> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{} exists: {e}", dir.display()))
        .map(|e| {
            let path = e.expect("directory entry").path();
            let name = path
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default();
            (name, std::fs::read(&path).expect("corpus file reads"))
        })
        .collect();
    files.sort();
    files
}

fn write_corpus(seeds: &[(&str, String, Vec<u8>)]) {
    for (target, _) in TARGETS {
        let dir = corpus_dir(target);
        std::fs::create_dir_all(&dir).expect("mkdir corpus");
        for (name, _) in corpus_files(target) {
            if name.starts_with("seed-") {
                std::fs::remove_file(dir.join(name)).expect("remove old seed");
            }
        }
    }
    for (target, name, bytes) in seeds {
        std::fs::write(corpus_dir(target).join(name), bytes).expect("write seed");
    }
}

#[test]
fn fresh_seeds_decode_completely() {
    let seeds = seeds();
    if std::env::var_os("DUET_WRITE_FUZZ_CORPUS").is_some() {
        write_corpus(&seeds);
    }
    for (target, _) in TARGETS {
        let n = seeds.iter().filter(|s| s.0 == target).count();
        assert!(n >= 2, "only {n} seeds for {target}");
    }
    for (target, name, bytes) in &seeds {
        let run = TARGETS
            .iter()
            .find(|(t, _)| t == target)
            .map(|(_, f)| *f)
            .expect("target");
        // Valid files decode completely: an error means the decoder rejects
        // what the engine itself wrote.
        match run(bytes) {
            Ok(_) => {}
            Err(e) => panic!("{target} seed {name} does not decode: {e}"),
        }
    }
}

#[test]
fn committed_corpus_replays_without_panic() {
    if std::env::var_os("DUET_WRITE_FUZZ_CORPUS").is_some() {
        return; // the corpus is being rewritten by the other test
    }
    for (target, run) in TARGETS {
        let files = corpus_files(target);
        assert!(
            files.len() >= 2,
            "only {} files in fuzz/corpus/{target}",
            files.len()
        );
        for (name, bytes) in &files {
            let out = std::panic::catch_unwind(|| run(bytes));
            assert!(out.is_ok(), "{target}/{name} panicked");
        }
    }
}

#[test]
fn damaged_seeds_are_errors_not_panics() {
    // Every single-byte flip of a few seeds (beyond the frame checksums that
    // the reframed forms bypass).
    for (target, name, bytes) in seeds().into_iter().filter(|s| s.2.len() < 4096).take(6) {
        let run = TARGETS
            .iter()
            .find(|(t, _)| *t == target)
            .map(|(_, f)| *f)
            .expect("target");
        let step = (bytes.len() / 400).max(1);
        for i in (1..bytes.len()).step_by(step) {
            let mut b = bytes.clone();
            b[i] ^= 0x5a;
            let out = std::panic::catch_unwind(|| run(&b));
            assert!(
                out.is_ok(),
                "{target} seed {name} with byte {i} flipped panicked"
            );
        }
    }
}
