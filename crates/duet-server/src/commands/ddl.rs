//! Namespace and index commands: listCollections, create, drop, dropDatabase,
//! renameCollection, createIndexes, listIndexes,
//! dropIndexes, collMod (an index's `expireAfterSeconds`; collection options).
//!
//! Collection options the engine honours (on `create` and `collMod`, durable,
//! shown by `listCollections`; `duetdb::CollectionOptions`):
//! `changeStreamPreAndPostImages`, `validator`, `validationLevel`,
//! `validationAction`, `collation` (on `create` only).
//!
//! Index options the engine honours: `unique`, `sparse`,
//! `partialFilterExpression`, `expireAfterSeconds` (TTL), `wildcardProjection`,
//! text indexes' `weights`, `default_language`, `language_override`,
//! `textIndexVersion`, 2dsphere indexes' `2dsphereIndexVersion`,
//! `collation`; hashed,
//! wildcard, text and 2dsphere key patterns; `v`,
//! `background` and `ns` are accepted and ignored, as MongoDB. Options the
//! engine cannot honor (views, time series,
//! `2d` indexes, hidden indexes, …) are refused with CommandNotSupported (115),
//! never silently dropped.

use bson::{doc, Bson, Document};
use duetdb::IndexTarget;

use super::Ctx;
use crate::args;
use crate::error::{CmdResult, CommandError};

/// A reply carrying all results in its first batch (cursor id 0).
pub fn single_batch_cursor(ns: String, docs: Vec<Bson>) -> Document {
    doc! {"cursor": {"id": 0i64, "ns": ns, "firstBatch": docs}, "ok": 1.0}
}

/// Generic command arguments (`fields.rs`): accepted beside any option.
fn is_generic(k: &str) -> bool {
    super::fields::GENERIC.contains(&k)
}

pub fn list_collections(ctx: &Ctx<'_>, cmd: &Document) -> CmdResult {
    let name_only = args::flag(cmd, "nameOnly")?;
    let filter = args::opt_doc(cmd, "filter")?
        .map(duetdb::lang::Filter::parse)
        .transpose()?;
    let snap = ctx.read_snapshot()?;
    let read_only = ctx.snapshot_name().is_some();
    let mut out = Vec::new();
    for name in snap.list_collection_names() {
        let options = snap.collection_options(&name).unwrap_or_default();
        // The `_id` index as `listIndexes` shows it (with the collection's
        // collation when it took one).
        let id_index = snap
            .collection(&name)
            .list_indexes()
            .ok()
            .and_then(|l| l.into_iter().next())
            .unwrap_or_else(|| doc! {"v": 2, "key": {"_id": 1}, "name": "_id_"});
        let full = doc! {
            "name": name.clone(),
            "type": "collection",
            "options": options.to_document(),
            "info": {"readOnly": read_only},
            "idIndex": id_index,
        };
        if let Some(f) = &filter {
            let raw = duetdb::raw::to_raw_document(&full)?;
            if !f.matches(&raw) {
                continue;
            }
        }
        out.push(Bson::Document(if name_only {
            doc! {"name": name, "type": "collection"}
        } else {
            full
        }));
    }
    // The oplog view (commands/oplog.rs) is a capped collection of `local`.
    if ctx.db == super::oplog::OPLOG_DB {
        let full = super::oplog::list_collections_entry(false);
        if filter.as_ref().map_or(Ok(true), |f| {
            duetdb::raw::to_raw_document(&full).map(|r| f.matches(&r))
        })? {
            out.push(Bson::Document(super::oplog::list_collections_entry(
                name_only,
            )));
        }
    }
    Ok(single_batch_cursor(
        format!("{}.$cmd.listCollections", ctx.db),
        out,
    ))
}

fn is_collection_option(k: &str) -> bool {
    duetdb::CollectionOptions::NAMES.contains(&k)
}

fn option_error(e: duetdb::OptionError) -> CommandError {
    CommandError::new(e.code, e.code_name, e.message)
}

/// The collection options a `create` or `collMod` names, parsed (each with
/// MongoDB's code when malformed: a wrong type is TypeMismatch (14), a bad
/// enumeration value BadValue (2), `changeStreamPreAndPostImages` without
/// `enabled` 40414, with an unknown field 40415) and checked (a validator
/// must compile), before anything changes. Returns the given ones (name and
/// value) and the options they make on their own.
fn collection_options(
    cmd: &Document,
) -> CmdResult<(Vec<(String, Bson)>, duetdb::CollectionOptions)> {
    let mut given = Vec::new();
    let mut options = duetdb::CollectionOptions::default();
    for (k, v) in cmd.iter().filter(|(k, _)| is_collection_option(k)) {
        options.set(k, v).map_err(option_error)?;
        given.push((k.clone(), v.clone()));
    }
    options.check_combination().map_err(option_error)?;
    duetdb::check_collection_options(&options)?;
    Ok((given, options))
}

pub fn create(ctx: &Ctx<'_>, cmd: &Document) -> CmdResult {
    let name = args::collection_name(cmd, "create")?;
    if let Some((k, _)) = cmd
        .iter()
        .skip(1)
        .find(|(k, _)| !is_generic(k) && k.as_str() != "idIndex" && !is_collection_option(k))
    {
        return Err(CommandError::not_supported(format!(
            "create option '{k}' is not supported by duetdb"
        )));
    }
    let (_, options) = collection_options(cmd)?;
    let options = options.with_defaults();
    let db = ctx.database()?;
    match db.create_collection_with(name, options.clone()) {
        Ok(()) => Ok(doc! {"ok": 1.0}),
        // As MongoDB 7.0: creating an existing collection with the same
        // options succeeds; with other options it is NamespaceExists (48).
        Err(duetdb::Error::NamespaceExists(_))
            if db.collection(name).options().ok() == Some(options) =>
        {
            Ok(doc! {"ok": 1.0})
        }
        Err(duetdb::Error::NamespaceExists(_)) => Err(CommandError::new(
            48,
            "NamespaceExists",
            format!(
                "Collection {} already exists with different options",
                ctx.ns(name)
            ),
        )),
        Err(e) => Err(e.into()),
    }
}

pub fn drop(ctx: &Ctx<'_>, cmd: &Document) -> CmdResult {
    let name = args::collection_name(cmd, "drop")?;
    let db = ctx.database()?;
    let n_indexes = db
        .collection(name)
        .stats()
        .map(|s| s.indexes.len() as i32)
        .unwrap_or(0);
    if db.drop_collection(name)? {
        Ok(doc! {"ns": ctx.ns(name), "nIndexesWas": n_indexes, "ok": 1.0})
    } else {
        // MongoDB 7.0: dropping a collection that does not exist succeeds.
        Ok(doc! {"ok": 1.0})
    }
}

pub fn drop_database(ctx: &Ctx<'_>) -> CmdResult {
    duetdb::validate_db_name(ctx.db)?;
    match ctx.state.repl.get() {
        // A replica set drops it on every member, through its log.
        Some(m) => {
            m.drop_database(ctx.db)?;
        }
        None => {
            ctx.state.engine.try_drop_database(ctx.db)?;
        }
    }
    Ok(doc! {"dropped": ctx.db, "ok": 1.0})
}

fn split_ns(ns: &str) -> CmdResult<(&str, &str)> {
    ns.split_once('.')
        .filter(|(d, c)| !d.is_empty() && !c.is_empty())
        .ok_or_else(|| {
            CommandError::new(
                73,
                "InvalidNamespace",
                format!("invalid namespace '{ns}': expected <db>.<collection>"),
            )
        })
}

pub fn rename_collection(ctx: &Ctx<'_>, cmd: &Document) -> CmdResult {
    if ctx.db != "admin" {
        return Err(CommandError::new(
            13,
            "Unauthorized",
            "renameCollection may only be run against the admin database",
        ));
    }
    let from = args::req_str(cmd, "renameCollection")?;
    let to = args::req_str(cmd, "to")?;
    let drop_target = args::flag(cmd, "dropTarget")?;
    let (from_db, from_coll) = split_ns(from)?;
    let (to_db, to_coll) = split_ns(to)?;
    if from_db != to_db {
        return Err(CommandError::not_supported(
            "renameCollection across databases is not supported by duetdb",
        ));
    }
    let db = ctx.database_named(from_db)?;
    match db.rename_collection(from_coll, to_coll, drop_target) {
        Ok(()) => Ok(doc! {"ok": 1.0}),
        // MongoDB's words (rename_collection.cpp).
        Err(duetdb::Error::NamespaceNotFound(_)) => Err(CommandError::ns_not_found(format!(
            "Source collection {from} does not exist"
        ))),
        Err(duetdb::Error::NamespaceExists(_)) => Err(CommandError::new(
            48,
            "NamespaceExists",
            "target namespace exists",
        )),
        Err(e) => Err(e.into()),
    }
}

/// The fields MongoDB 7.0 knows in an index specification
/// (`index_key_validate.cpp`'s allowed names); duet builds the ones in
/// [`INDEX_OPTIONS_OK`] and refuses the others as unsupported (115).
const INDEX_FIELDS_KNOWN: &[&str] = &[
    "key",
    "name",
    "ns",
    "v",
    "background",
    "unique",
    "hidden",
    "partialFilterExpression",
    "sparse",
    "expireAfterSeconds",
    "storageEngine",
    "weights",
    "default_language",
    "language_override",
    "textIndexVersion",
    "2dsphereIndexVersion",
    "bits",
    "min",
    "max",
    "bucketSize",
    "collation",
    "wildcardProjection",
    "coarsestIndexedLevel",
    "finestIndexedLevel",
    "dropDups",
    "originalSpec",
    "clustered",
    "prepareUnique",
    "columnstoreProjection",
    "columnstoreCompressor",
];

/// The index types a key pattern may name (`IndexNames`).
const INDEX_PLUGINS: &[&str] = &[
    "2d",
    "2dsphere",
    "2dsphere_bucket",
    "text",
    "hashed",
    "wildcard",
    "columnstore",
];

/// MongoDB's `validateIndexSpec` checks, in its order, each failure under
/// createIndexes' context `Error in specification <spec> :: caused by ::`
/// (`create_indexes_cmd.cpp`): an unknown field is 197, an empty key
/// pattern or an unknown index type 67, a missing `key` 9.
fn validate_index_spec(spec: &Document) -> CmdResult<()> {
    let fail = |code: i32, name: &'static str, msg: String| {
        Err(CommandError::new(
            code,
            name,
            format!(
                "Error in specification {} :: caused by :: {msg}",
                duetdb::raw::render_shell(&Bson::Document(spec.clone()))
            ),
        ))
    };
    for (k, v) in spec {
        if !INDEX_FIELDS_KNOWN.contains(&k.as_str()) {
            return fail(
                197,
                "InvalidIndexSpecificationOption",
                format!(
                    "The field '{k}' is not valid for an index specification. Specification: {}",
                    duetdb::raw::render_shell(&Bson::Document(spec.clone()))
                ),
            );
        }
        if let ("key", Bson::Document(key)) = (k.as_str(), v) {
            if key.is_empty() {
                return fail(
                    67,
                    "CannotCreateIndex",
                    "Index keys cannot be empty.".into(),
                );
            }
            for (_, part) in key {
                if let Bson::String(plugin) = part {
                    if !INDEX_PLUGINS.contains(&plugin.as_str()) {
                        return fail(
                            67,
                            "CannotCreateIndex",
                            format!("Unknown index plugin '{plugin}'"),
                        );
                    }
                }
            }
        }
    }
    if !spec.contains_key("key") {
        return fail(
            9,
            "FailedToParse",
            "The 'key' field is a required property of an index specification".into(),
        );
    }
    Ok(())
}

const INDEX_OPTIONS_OK: &[&str] = &[
    "key",
    "name",
    "unique",
    "v",
    "background",
    "ns",
    "sparse",
    "partialFilterExpression",
    "expireAfterSeconds",
    "collation",
    "wildcardProjection",
    "weights",
    "default_language",
    "language_override",
    "textIndexVersion",
    "2dsphereIndexVersion",
];

pub fn create_indexes(ctx: &Ctx<'_>, cmd: &Document) -> CmdResult {
    let name = args::collection_name(cmd, "createIndexes")?;
    let specs = args::doc_array(cmd, "indexes")?;
    if specs.is_empty() {
        return Err(CommandError::bad_value(
            "Must specify at least one index to create",
        ));
    }
    let db = ctx.database()?;
    let coll = db.collection(name);
    let before = coll.list_indexes().ok();
    let existed = before.is_some();
    let n_before = before.map(|v| v.len()).unwrap_or(1) as i32;
    for spec in &specs {
        validate_index_spec(spec)?;
    }
    for spec in specs {
        if let Some((k, _)) = spec
            .iter()
            .find(|(k, _)| !INDEX_OPTIONS_OK.contains(&k.as_str()))
        {
            return Err(CommandError::not_supported(format!(
                "index option '{k}' is not supported by duetdb"
            )));
        }
        let progress = duetdb::IndexBuildProgress::new();
        if let Some(report) = ctx.report {
            report.note_index_build(progress.clone());
        }
        let options = duetdb::IndexBuildOptions {
            cancel: ctx.cancel.clone(),
            progress: Some(progress),
            ..Default::default()
        };
        coll.create_index_spec_with(spec, &options)?;
    }
    let n_after = coll.list_indexes().map(|v| v.len()).unwrap_or(0) as i32;
    let mut reply = doc! {
        "createdCollectionAutomatically": !existed,
        "numIndexesBefore": n_before,
        "numIndexesAfter": n_after,
    };
    if n_after == n_before {
        reply.insert("note", "all indexes already exist");
    }
    reply.insert("ok", 1.0);
    Ok(reply)
}

pub fn list_indexes(ctx: &Ctx<'_>, cmd: &Document) -> CmdResult {
    let name = args::collection_name(cmd, "listIndexes")?;
    let idx = ctx
        .read_snapshot()?
        .collection(name)
        .list_indexes()
        .map_err(|_| CommandError::ns_not_found(format!("ns does not exist: {}", ctx.ns(name))))?;
    Ok(single_batch_cursor(
        ctx.ns(name),
        idx.into_iter().map(Bson::Document).collect(),
    ))
}

/// `dropIndexes` (or its alias `deleteIndexes`, `command`): the collection
/// is the value of the command's own first field.
pub fn drop_indexes(ctx: &Ctx<'_>, command: &str, cmd: &Document) -> CmdResult {
    let name = args::collection_name(cmd, command)?;
    let coll = ctx.database()?.collection(name);
    let existing = coll
        .list_indexes()
        .map_err(|_| CommandError::ns_not_found(format!("ns not found {}", ctx.ns(name))))?;
    let n_was = existing.len() as i32;
    let name_of = |d: &Document| d.get_str("name").unwrap_or_default().to_string();
    let targets: Vec<String> = match cmd.get("index") {
        Some(Bson::String(s)) if s == "*" => existing
            .iter()
            .map(name_of)
            .filter(|n| n != "_id_")
            .collect(),
        Some(Bson::String(s)) => vec![s.clone()],
        Some(Bson::Array(a)) => a
            .iter()
            .map(|v| match v {
                Bson::String(s) => Ok(s.clone()),
                other => Err(CommandError::type_mismatch(format!(
                    "dropIndexes index names must be strings, not {:?}",
                    other.element_type()
                ))),
            })
            .collect::<CmdResult<_>>()?,
        Some(Bson::Document(pattern)) => {
            let found = existing
                .iter()
                .find(|d| d.get_document("key").ok() == Some(pattern))
                .ok_or_else(|| {
                    CommandError::new(
                        27,
                        "IndexNotFound",
                        format!("can't find index with key: {pattern}"),
                    )
                })?;
            vec![name_of(found)]
        }
        Some(other) => {
            return Err(CommandError::type_mismatch(format!(
                "dropIndexes 'index' must be a string, array or document, not {:?}",
                other.element_type()
            )))
        }
        None => return Err(CommandError::bad_value("dropIndexes requires 'index'")),
    };
    if targets.iter().any(|t| t == "_id_") {
        return Err(CommandError::new(
            72,
            "InvalidOptions",
            "cannot drop _id index",
        ));
    }
    if matches!(cmd.get("index"), Some(Bson::String(s)) if s == "*") {
        coll.abort_index_builds(None, "indexes dropped during the build");
    }
    for t in &targets {
        coll.drop_index(t)?;
    }
    Ok(doc! {"nIndexesWas": n_was, "ok": 1.0})
}

/// `collMod`: MongoDB's `index: {keyPattern | name, expireAfterSeconds}`
/// changes (or sets) an index's TTL; the collection options
/// (`changeStreamPreAndPostImages`, `validator`, `validationLevel`,
/// `validationAction`) given replace the stored ones, the others are kept.
/// Other options are refused (115).
pub fn coll_mod(ctx: &Ctx<'_>, cmd: &Document) -> CmdResult {
    let name = args::collection_name(cmd, "collMod")?;
    if let Some((k, _)) = cmd.iter().skip(1).find(|(k, _)| {
        !is_generic(k)
            && k.as_str() != "index"
            && (!is_collection_option(k)
                || duetdb::CollectionOptions::CREATE_ONLY.contains(&k.as_str()))
    }) {
        return Err(CommandError::not_supported(format!(
            "collMod option '{k}' is not supported by duetdb"
        )));
    }
    let (given, _) = collection_options(cmd)?;
    let db = ctx.database()?;
    let coll = db.collection(name);
    if coll.list_indexes().is_err() {
        return Err(CommandError::ns_not_found(format!(
            "ns does not exist: {}",
            ctx.ns(name)
        )));
    }
    let set_options = || -> CmdResult<()> {
        if !given.is_empty() {
            let given = given.clone();
            coll.set_options(move |o| {
                for (k, v) in &given {
                    // Parsed above: the same value cannot fail here.
                    let _ = o.set(k, v);
                }
            })?;
        }
        Ok(())
    };
    let Some(index) = args::opt_doc(cmd, "index")? else {
        set_options()?;
        return Ok(doc! {"ok": 1.0});
    };
    if let Some((k, _)) = index
        .iter()
        .find(|(k, _)| !matches!(k.as_str(), "keyPattern" | "name" | "expireAfterSeconds"))
    {
        return Err(CommandError::not_supported(format!(
            "collMod index option '{k}' is not supported by duetdb"
        )));
    }
    let target = match (
        args::opt_doc(index, "keyPattern")?,
        args::opt_str(index, "name")?,
    ) {
        (Some(k), None) => IndexTarget::Keys(k.clone()),
        (None, Some(n)) => IndexTarget::Name(n.to_string()),
        _ => {
            return Err(CommandError::new(
                72,
                "InvalidOptions",
                "collMod 'index' needs exactly one of 'keyPattern' and 'name'",
            ))
        }
    };
    let Some(secs) = index.get("expireAfterSeconds") else {
        return Err(CommandError::new(
            72,
            "InvalidOptions",
            "no collMod index option specified",
        ));
    };
    let (old, new) = coll
        .set_expire_after_seconds(target.clone(), secs)
        .map_err(|e| match e {
            duetdb::Error::IndexNotFound(_) => CommandError::new(
                27,
                "IndexNotFound",
                format!(
                    "cannot find index {} for ns {}",
                    match &target {
                        IndexTarget::Keys(k) => k.to_string(),
                        IndexTarget::Name(n) => n.clone(),
                    },
                    ctx.ns(name)
                ),
            ),
            other => other.into(),
        })?;
    let as_bson = |s: i64| i32::try_from(s).map_or(Bson::Int64(s), Bson::Int32);
    let mut reply = Document::new();
    if let Some(old) = old {
        if old != new {
            reply.insert("expireAfterSeconds_old", as_bson(old));
            reply.insert("expireAfterSeconds_new", as_bson(new));
        }
    } else {
        reply.insert("expireAfterSeconds_new", as_bson(new));
    }
    // After the index change succeeded, so a failing collMod changes nothing.
    set_options()?;
    reply.insert("ok", 1.0);
    Ok(reply)
}
