//! Storage statistics and validation as mongosh and monitoring agents ask
//! for them: `collStats`, `dbStats` (alias `dbstats`), `validate`, and the
//! aggregation stages `$collStats`, `$indexStats` and `$currentOp` (the
//! aggregate handler hands a pipeline starting with one of them to
//! [`aggregate_stage`]).
//!
//! Figures come from the engine's `Collection::storage_stats` (one walk of
//! the heap and index nodes of the latest version): `size` is the BSON bytes
//! of the documents, `storageSize` those plus the heap's nodes (duet keeps
//! documents in memory, so "storage" is what holding them costs),
//! `indexSizes` the bytes of each index's nodes and out-of-line keys.
//! Counts and sizes are int32 when they fit, as MongoDB's `appendNumber`
//! sends them. The `duet` section adds what no MongoDB field says: the
//! collection's csn, the old versions kept for VLS scans in flight (remset)
//! and what named snapshots retain of the collection.
//!
//! `validate` runs the engine's `Collection::validate` (every invariant
//! `check_invariants` knows, on one version) and answers in MongoDB's shape
//! (`valid`, `errors`, `warnings`, `nrecords`, `nIndexes`, `keysPerIndex`,
//! `indexDetails`); `repair: true` is refused (115): a version in memory is
//! rebuilt by restarting from the log, not patched.

use bson::{doc, Bson, DateTime, Document};

use super::Ctx;
use crate::args;
use crate::error::{CmdResult, CommandError};

/// A count or size as MongoDB's `appendNumber` sends it: int32 when it fits.
pub fn num(n: u64) -> Bson {
    match i32::try_from(n) {
        Ok(i) => Bson::Int32(i),
        Err(_) => Bson::Int64(n.min(i64::MAX as u64) as i64),
    }
}

/// The `scale` option: a positive whole number (default 1).
fn scale_of(d: &Document) -> CmdResult<u64> {
    match d.get("scale") {
        None | Some(Bson::Null) => Ok(1),
        Some(v) => {
            let n = match v {
                Bson::Int32(i) => i64::from(*i),
                Bson::Int64(i) => *i,
                Bson::Double(f) if f.fract() == 0.0 && f.abs() < 9e15 => *f as i64,
                _ => {
                    return Err(CommandError::type_mismatch(
                        "scale has to be a number greater than 0",
                    ))
                }
            };
            u64::try_from(n)
                .ok()
                .filter(|n| *n >= 1)
                .ok_or_else(|| CommandError::bad_value("scale has to be >= 1"))
        }
    }
}

fn not_found(ctx: &Ctx<'_>, coll: &str) -> CommandError {
    CommandError::ns_not_found(format!("Collection [{}] not found.", ctx.ns(coll)))
}

/// What named snapshots retain of one collection: (snapshots, versions, bytes).
fn retained_by_snapshots(db: &duetdb::Database, coll: &str) -> (u64, u64, u64) {
    let mut out = (0, 0, 0);
    for info in db.list_snapshots() {
        if let Some(c) = info.retained.by_collection.get(coll) {
            out.0 += 1;
            out.1 += c.docs;
            out.2 += c.bytes();
        }
    }
    out
}

/// `storageStats` of `$collStats` and the body of `collStats`.
fn storage_stats(ctx: &Ctx<'_>, coll: &str, scale: u64) -> CmdResult<Document> {
    let db = ctx.database()?;
    let s = match ctx.snapshot_name() {
        Some(_) => ctx.read_snapshot()?.collection(coll).storage_stats(),
        None => db.collection(coll).storage_stats(),
    }
    .map_err(|_| not_found(ctx, coll))?;
    let storage = s.data_bytes + s.heap_bytes;
    let total_index: u64 = s.indexes.iter().map(|i| i.bytes).sum();
    let mut index_sizes = Document::new();
    let mut entries = Document::new();
    let mut details = Document::new();
    for i in &s.indexes {
        index_sizes.insert(i.name.clone(), num(i.bytes / scale));
        entries.insert(i.name.clone(), num(i.entries));
        details.insert(i.name.clone(), doc! {"entries": num(i.entries)});
    }
    let (snapshots, versions, bytes) = retained_by_snapshots(&db, coll);
    let options = db.collection(coll).options().unwrap_or_default();
    let mut out = doc! {
        "size": num(s.data_bytes / scale),
        "count": num(s.count),
        "avgObjSize": num(s.data_bytes.checked_div(s.count).unwrap_or(0)),
        "numOrphanDocs": 0,
        "storageSize": num(storage / scale),
        "freeStorageSize": 0,
        "capped": options.capped,
        "nindexes": num(s.indexes.len() as u64),
        "indexDetails": details,
        "indexBuilds": [],
        "totalIndexSize": num(total_index / scale),
        "totalSize": num((storage + total_index) / scale),
        "indexSizes": index_sizes,
        "scaleFactor": num(scale),
        "duet": {
            "csn": num(s.csn),
            "heapNodes": num(s.heap_nodes),
            "indexEntries": entries,
            // Old versions kept for the VLS scans in flight on this collection.
            "remsetEntries": num(s.remset_entries),
            "remsetBytes": num(s.remset_bytes),
            "vlsScansActive": num(s.scans_active),
            // Old versions of this collection that named snapshots keep
            // alive (no longer reachable from the latest version).
            "retainedBySnapshots": {
                "snapshots": num(snapshots),
                "versions": num(versions),
                "bytes": num(bytes / scale),
            },
        },
    };
    // As MongoDB's, for a capped collection: its `max` (0: none) and
    // `maxSize` (scaled).
    if options.capped {
        out.insert("max", num(options.capped_max.unwrap_or(0)));
        out.insert("maxSize", num(options.capped_size.unwrap_or(0) / scale));
    }
    Ok(out)
}

/// `{collStats: <coll>, scale?}` (deprecated in MongoDB 6.2 but still sent
/// by tools): the `storageStats` figures at the top level.
pub fn coll_stats(ctx: &Ctx<'_>, cmd: &Document) -> CmdResult {
    let coll = args::collection_name(cmd, "collStats")?;
    let scale = scale_of(cmd)?;
    let mut out = doc! {"ns": ctx.ns(coll)};
    out.extend(storage_stats(ctx, coll, scale)?);
    out.insert("ok", 1.0);
    Ok(out)
}

/// `{dbStats: 1, scale?}`: the same figures summed over the collections.
pub fn db_stats(ctx: &Ctx<'_>, cmd: &Document) -> CmdResult {
    let scale = scale_of(cmd)?;
    let db = ctx.database()?;
    let st = db.stats();
    let (mut data, mut storage, mut index, mut indexes, mut objects) = (0u64, 0, 0, 0, 0);
    let (mut remset, mut retained_versions) = (0u64, 0u64);
    let mut collections = 0u64;
    let held = match ctx.snapshot_name() {
        Some(_) => Some(ctx.read_snapshot()?),
        None => None,
    };
    let names = match &held {
        Some(snap) => snap.list_collection_names(),
        None => db.list_collection_names(),
    };
    for name in names {
        let stats = match &held {
            Some(snap) => snap.collection(&name).storage_stats(),
            None => db.collection(&name).storage_stats(),
        };
        let Ok(s) = stats else {
            continue; // dropped meanwhile
        };
        collections += 1;
        data += s.data_bytes;
        storage += s.data_bytes + s.heap_bytes;
        index += s.indexes.iter().map(|i| i.bytes).sum::<u64>();
        indexes += s.indexes.len() as u64;
        objects += s.count;
        remset += s.remset_entries;
    }
    let snaps = db.list_snapshots();
    let mut retained_bytes = 0u64;
    for i in &snaps {
        retained_versions += i.retained.docs;
        retained_bytes += i.retained.bytes;
    }
    Ok(doc! {
        "db": ctx.db,
        "collections": num(collections),
        "views": 0,
        "objects": num(objects),
        "avgObjSize": data.checked_div(objects).unwrap_or(0) as f64,
        "dataSize": (data / scale) as f64,
        "storageSize": (storage / scale) as f64,
        "indexes": num(indexes),
        "indexSize": (index / scale) as f64,
        "totalSize": ((storage + index) / scale) as f64,
        "scaleFactor": num(scale),
        "duet": {
            "csn": held.as_ref().map_or(st.csn, |s| s.csn()).min(i64::MAX as u64) as i64,
            "remsetEntries": num(remset),
            "namedSnapshots": num(snaps.len() as u64),
            "retainedBySnapshots": {"versions": num(retained_versions), "bytes": num(retained_bytes / scale)},
        },
        "ok": 1.0,
    })
}

/// `{validate: <coll>, full?, background?, repair?}`.
pub fn validate(ctx: &Ctx<'_>, cmd: &Document) -> CmdResult {
    let coll = args::collection_name(cmd, "validate")?;
    if args::flag(cmd, "repair")? {
        return Err(CommandError::not_supported(
            "validate with repair: true is not supported by duetdb (restart the server to rebuild from the log)",
        ));
    }
    let v = ctx.database()?.collection(coll).validate().map_err(|_| {
        CommandError::ns_not_found(format!(
            "Collection '{}' does not exist to validate.",
            ctx.ns(coll)
        ))
    })?;
    let valid = v.errors.is_empty();
    let mut keys = Document::new();
    let mut details = Document::new();
    for (name, n) in &v.keys_per_index {
        keys.insert(name.clone(), num(*n));
        let index_errors: Vec<Bson> = v
            .errors
            .iter()
            .filter(|e| e.contains(&format!("index {name}")))
            .map(|e| Bson::String(e.clone()))
            .collect();
        details.insert(
            name.clone(),
            doc! {"valid": index_errors.is_empty(), "keysTraversed": num(*n), "errors": index_errors},
        );
    }
    let errors: Vec<Bson> = v.errors.iter().cloned().map(Bson::String).collect();
    if !valid {
        tracing::error!(ns = %ctx.ns(coll), errors = ?v.errors, "validate found a damaged collection");
    }
    Ok(doc! {
        "ns": ctx.ns(coll),
        "nInvalidDocuments": 0,
        "nNonCompliantDocuments": 0,
        "nrecords": num(v.records),
        "nIndexes": num(v.keys_per_index.len() as u64),
        "keysPerIndex": keys,
        "indexDetails": details,
        "valid": valid,
        "repaired": false,
        "warnings": [],
        "errors": errors,
        "extraIndexEntries": [],
        "missingIndexEntries": [],
        "corruptRecords": [],
        "advice": "A collection that is not valid is a bug: keep the data directory and report it.",
        "duet": {"csn": v.csn.min(i64::MAX as u64) as i64},
        "ok": 1.0,
    })
}

/// Stages that must come first and that the server answers itself.
const SERVER_STAGES: &[&str] = &["$collStats", "$indexStats", "$currentOp"];

/// A pipeline starting with `$collStats`, `$indexStats` or `$currentOp`:
/// the stage's documents, then the rest of the pipeline on them. `None`
/// for any other pipeline.
pub fn aggregate_stage(
    ctx: &Ctx<'_>,
    cmd: &Document,
    in_transaction: bool,
) -> CmdResult<Option<Document>> {
    let Some(Bson::Array(pipeline)) = cmd.get("pipeline") else {
        return Ok(None);
    };
    let name_of = |s: &Bson| {
        s.as_document()
            .and_then(|d| d.keys().next())
            .map(String::to_string)
    };
    let Some(first) = pipeline.first().and_then(name_of) else {
        return Ok(None);
    };
    if let Some(later) = pipeline
        .iter()
        .skip(1)
        .filter_map(name_of)
        .find(|n| SERVER_STAGES.contains(&n.as_str()))
    {
        return Err(CommandError::new(
            40602,
            "Location40602",
            format!("{later} is only valid as the first stage in a pipeline"),
        ));
    }
    if !SERVER_STAGES.contains(&first.as_str()) {
        return Ok(None);
    }
    if in_transaction {
        return Err(super::txn::not_in_transaction(&first));
    }
    let spec = match pipeline
        .first()
        .and_then(Bson::as_document)
        .and_then(|d| d.get(&first))
    {
        Some(Bson::Document(d)) => d.clone(),
        _ => {
            return Err(CommandError::type_mismatch(format!(
                "{first} takes a document"
            )))
        }
    };
    let (ns, docs) = match first.as_str() {
        "$currentOp" => (
            format!("{}.$cmd.aggregate", ctx.db),
            super::currentop::stage(ctx, &spec)?,
        ),
        _ => {
            let coll = match cmd.get("aggregate") {
                Some(Bson::String(s)) => {
                    args::collection_name(cmd, "aggregate").map(|_| s.as_str())?
                }
                _ => {
                    return Err(CommandError::new(
                        73,
                        "InvalidNamespace",
                        format!("{first} must be run against a collection"),
                    ))
                }
            };
            let docs = if first == "$collStats" {
                vec![coll_stats_stage(ctx, coll, &spec)?]
            } else {
                index_stats_stage(ctx, coll)?
            };
            (ctx.ns(coll), docs)
        }
    };
    let rest: Vec<Document> = pipeline
        .iter()
        .skip(1)
        .filter_map(|s| s.as_document().cloned())
        .collect();
    let docs = if rest.is_empty() {
        docs
    } else {
        duetdb::lang::Pipeline::parse(&rest)?.run_on(docs)?
    };
    Ok(Some(super::ddl::single_batch_cursor(
        ns,
        docs.into_iter().map(Bson::Document).collect(),
    )))
}

fn host(ctx: &Ctx<'_>) -> String {
    ctx.conn.local.to_string()
}

/// `{$collStats: {storageStats?: {scale?}, count?: {}, latencyStats?: {},
/// queryExecStats?: {}}}`: one document.
fn coll_stats_stage(ctx: &Ctx<'_>, coll: &str, spec: &Document) -> CmdResult<Document> {
    let mut out = doc! {
        "ns": ctx.ns(coll),
        "host": host(ctx),
        "localTime": DateTime::now(),
    };
    for (k, v) in spec {
        let opts = match v {
            Bson::Document(d) => d,
            _ => {
                return Err(CommandError::type_mismatch(format!(
                    "$collStats.{k} must be a document"
                )))
            }
        };
        match k.as_str() {
            "storageStats" => {
                out.insert("storageStats", storage_stats(ctx, coll, scale_of(opts)?)?);
            }
            "count" => {
                let s = ctx
                    .database()?
                    .collection(coll)
                    .stats()
                    .map_err(|_| not_found(ctx, coll))?;
                out.insert("count", num(s.count));
            }
            "latencyStats" => {
                out.insert("latencyStats", ctx.state.top.latency(&ctx.ns(coll)));
            }
            "queryExecStats" => {
                out.insert(
                    "queryExecStats",
                    doc! {"collectionScans": {"total": 0_i64, "nonTailable": 0_i64}},
                );
            }
            other => {
                return Err(CommandError::new(
                    40415,
                    "Location40415",
                    format!("BSON field '$collStats.{other}' is an unknown field."),
                ))
            }
        }
    }
    Ok(out)
}

/// `{$indexStats: {}}`: one document per index; `accesses.ops` counts the
/// reads that walked the index since it was built or the server started
/// (the engine's per-index counter).
fn index_stats_stage(ctx: &Ctx<'_>, coll: &str) -> CmdResult<Vec<Document>> {
    let c = ctx.database()?.collection(coll);
    let specs = c.list_indexes().unwrap_or_default();
    let usage = c.index_usage();
    let started =
        DateTime::from_system_time(std::time::SystemTime::now() - ctx.state.started.elapsed());
    Ok(specs
        .into_iter()
        .map(|spec| {
            let name = spec.get_str("name").unwrap_or_default();
            let (ops, since) = usage
                .iter()
                .find(|(n, _, _)| n == name)
                .map_or((0, started), |(_, ops, since)| {
                    (*ops, DateTime::from_system_time(*since))
                });
            doc! {
                "name": name,
                "key": spec.get_document("key").cloned().unwrap_or_default(),
                "host": host(ctx),
                "accesses": {"ops": i64::try_from(ops).unwrap_or(i64::MAX), "since": since},
                "spec": spec.clone(),
            }
        })
        .collect())
}
