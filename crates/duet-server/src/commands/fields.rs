//! The fields each strictly parsed command accepts, as MongoDB's IDL
//! declares them (`find_command.idl`, `aggregate_command.idl`,
//! `write_ops.idl`, …), and the one checker that holds a command to them
//! before its handler runs.
//!
//! MongoDB parses these commands with `strict: true`: a field that is
//! neither the command's own nor a generic argument (`generic_argument.idl`,
//! [`GENERIC`]) is refused with 40415 IDLUnknownField, `BSON field
//! 'find.foo' is an unknown field.`, and a known field of the wrong BSON
//! type with 14 TypeMismatch. The same holds inside the sub-documents it
//! parses strictly: update statements (`update.updates.foo`) and delete
//! statements (`delete.deletes.foo`). Index specifications have their own
//! rule (197 InvalidIndexSpecificationOption, `query/index_spec.rs`).
//!
//! Invariants:
//! - a command without an entry in [`SPECS`] is not checked here (its
//!   handler parses it); every entry names a [`super::COMMANDS`] command;
//! - every field of [`GENERIC`] and duet's own `$duet` is accepted by every
//!   checked command (a unit test sends each), so nothing a driver or tool
//!   adds to any command is refused;
//! - the first offending field in document order decides the error, as
//!   MongoDB's parser reports the first it meets;
//! - only types are checked here; values (ranges, meanings) stay with the
//!   handlers. A `null` counts as absent for every type but a strict bool
//!   (MongoDB's `optionalBool` refuses it; duet's handlers treat `null` as
//!   absent elsewhere, and nothing is gained by refusing it).

use bson::{Bson, Document};

use crate::error::{CmdResult, CommandError};

/// The BSON type a known field must have.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Ty {
    /// Not checked here: the handler parses it (a hint is a string or an
    /// object, a pipeline has its own messages, …).
    Any,
    /// `optionalBool`: a boolean only (not a number, not null).
    Bool,
    /// `safeInt64`/`safeInt`: any number.
    Num,
    /// `object`.
    Obj,
    /// `string`.
    Str,
    /// `array`.
    Arr,
}

use Ty::{Any, Arr, Bool, Num, Obj, Str};

/// One strictly parsed command: its own fields (beside [`GENERIC`]).
pub struct Spec {
    pub command: &'static str,
    pub fields: &'static [(&'static str, Ty)],
}

/// The generic arguments every command accepts (`generic_argument.idl`,
/// stable and unstable lists), and duet's own `$duet`.
pub const GENERIC: &[&str] = &[
    "apiVersion",
    "apiStrict",
    "apiDeprecationErrors",
    "$db",
    "maxTimeMS",
    "readConcern",
    "writeConcern",
    "lsid",
    "clientOperationKey",
    "txnNumber",
    "autocommit",
    "startTransaction",
    "stmtId",
    "comment",
    "$readPreference",
    "$clusterTime",
    "$audit",
    "$client",
    "$configServerState",
    "allowImplicitCollectionCreation",
    "$oplogQueryData",
    "$queryOptions",
    "$replData",
    "databaseVersion",
    "shardVersion",
    "tracking_info",
    "coordinator",
    "maxTimeMSOpOnly",
    "$configTime",
    "$topologyTime",
    "txnRetryCounter",
    "mayBypassWriteBlocking",
    "$tenant",
    "expectPrefix",
    "$duet",
];

/// Fields the write commands share (`WriteCommandBase`).
const WRITE_BASE: &[(&str, Ty)] = &[
    ("bypassDocumentValidation", Any),
    ("ordered", Any),
    ("stmtIds", Any),
    ("isTimeseriesNamespace", Any),
    ("collectionUUID", Any),
    ("encryptionInformation", Any),
];

/// Commands parsed strictly, with MongoDB 7.0's field lists (internal and
/// deprecated fields included: a mongos or an old tool may send them), and
/// the few duet honours beyond them (marked).
pub const SPECS: &[Spec] = &[
    Spec {
        command: "find",
        fields: &[
            ("filter", Obj),
            ("projection", Obj),
            ("sort", Obj),
            ("hint", Any),
            ("collation", Obj),
            ("skip", Num),
            ("limit", Num),
            ("batchSize", Num),
            ("ntoreturn", Num),
            ("singleBatch", Bool),
            ("allowDiskUse", Bool),
            ("min", Obj),
            ("max", Obj),
            ("returnKey", Bool),
            ("showRecordId", Bool),
            ("tailable", Bool),
            ("oplogReplay", Any),
            ("noCursorTimeout", Bool),
            ("awaitData", Bool),
            ("allowPartialResults", Bool),
            ("let", Obj),
            ("options", Any),
            ("term", Any),
            ("readOnce", Any),
            ("allowSpeculativeMajorityRead", Any),
            ("$_requestResumeToken", Any),
            ("$_resumeAfter", Any),
            ("$_startAt", Any),
            ("runtimeConstants", Any),
            ("collectionUUID", Any),
            ("encryptionInformation", Any),
            ("includeQueryStatsMetrics", Any),
            ("isTimeseriesNamespace", Any),
            ("mirrored", Any),
        ],
    },
    Spec {
        command: "getMore",
        fields: &[
            ("collection", Str),
            ("batchSize", Num),
            ("term", Any),
            ("lastKnownCommittedOpTime", Any),
            ("includeQueryStatsMetrics", Any),
        ],
    },
    Spec {
        command: "killCursors",
        fields: &[("cursors", Arr)],
    },
    Spec {
        command: "aggregate",
        fields: &[
            ("pipeline", Any),
            ("explain", Any),
            ("allowDiskUse", Bool),
            ("cursor", Obj),
            ("bypassDocumentValidation", Any),
            ("collation", Obj),
            ("hint", Any),
            ("let", Obj),
            ("needsMerge", Any),
            ("fromMongos", Any),
            ("fromRouter", Any),
            ("$_requestReshardingResumeToken", Any),
            ("exchange", Any),
            ("runtimeConstants", Any),
            ("isMapReduceCommand", Any),
            ("collectionUUID", Any),
            ("$_passthroughToShard", Any),
            ("encryptionInformation", Any),
            ("$_externalDataSources", Any),
            ("sampleId", Any),
            ("$_isClusterQueryWithoutShardKeyCmd", Any),
            ("$_requestResumeToken", Any),
            ("$_resumeAfter", Any),
            ("$_generateV2ResumeTokens", Any),
            ("includeQueryStatsMetrics", Any),
            ("isTimeseriesNamespace", Any),
        ],
    },
    Spec {
        command: "count",
        fields: &[
            ("query", Obj),
            // duet binds `let` around count's and distinct's `$expr` as
            // find's (#17 item 3); MongoDB 7.0's lists lack it.
            ("let", Obj),
            ("limit", Num),
            ("skip", Num),
            ("hint", Any),
            ("collation", Obj),
            ("fields", Any),
            ("encryptionInformation", Any),
            ("mirrored", Any),
            ("sampleId", Any),
        ],
    },
    Spec {
        command: "distinct",
        fields: &[
            ("key", Str),
            ("query", Obj),
            ("let", Obj),
            ("collation", Obj),
            ("hint", Any),
            ("mirrored", Any),
            ("sampleId", Any),
        ],
    },
    Spec {
        command: "insert",
        fields: &[("documents", Arr)],
    },
    Spec {
        command: "update",
        fields: &[("updates", Arr), ("let", Obj), ("runtimeConstants", Any)],
    },
    Spec {
        command: "delete",
        fields: &[("deletes", Arr), ("let", Obj), ("runtimeConstants", Any)],
    },
    Spec {
        command: "findAndModify",
        fields: &[
            ("query", Obj),
            ("fields", Obj),
            ("sort", Obj),
            ("hint", Any),
            ("collation", Obj),
            ("arrayFilters", Arr),
            ("remove", Any),
            ("update", Any),
            ("upsert", Any),
            ("new", Any),
            ("bypassDocumentValidation", Any),
            ("let", Obj),
            ("runtimeConstants", Any),
            ("encryptionInformation", Any),
            ("sampleId", Any),
            ("isTimeseriesNamespace", Any),
            ("collectionUUID", Any),
        ],
    },
    Spec {
        command: "createIndexes",
        fields: &[
            ("indexes", Arr),
            ("commitQuorum", Any),
            ("ignoreUnknownIndexOptions", Any),
            ("isTimeseriesNamespace", Any),
            ("collectionUUID", Any),
            ("returnOnStart", Any),
        ],
    },
    Spec {
        command: "dropIndexes",
        fields: &[
            ("index", Any),
            ("collectionUUID", Any),
            ("isTimeseriesNamespace", Any),
        ],
    },
    Spec {
        command: "listIndexes",
        fields: &[
            ("cursor", Obj),
            ("includeBuildUUIDs", Any),
            ("includeIndexBuildInfo", Any),
            ("collectionUUID", Any),
            ("isTimeseriesNamespace", Any),
        ],
    },
    Spec {
        command: "listCollections",
        fields: &[
            ("filter", Obj),
            ("cursor", Obj),
            ("nameOnly", Any),
            ("authorizedCollections", Any),
            ("includePendingDrops", Any),
        ],
    },
    Spec {
        command: "create",
        fields: &[
            ("capped", Any),
            ("autoIndexId", Any),
            ("idIndex", Any),
            ("size", Any),
            ("max", Any),
            ("storageEngine", Any),
            ("validator", Any),
            ("validationLevel", Any),
            ("validationAction", Any),
            ("indexOptionDefaults", Any),
            ("viewOn", Any),
            ("pipeline", Any),
            ("collation", Any),
            ("changeStreamPreAndPostImages", Any),
            ("timeseries", Any),
            ("clusteredIndex", Any),
            ("recordIdsReplicated", Any),
            ("expireAfterSeconds", Any),
            ("encryptedFields", Any),
            ("temp", Any),
            ("flags", Any),
        ],
    },
    Spec {
        command: "drop",
        fields: &[("collectionUUID", Any), ("isTimeseriesNamespace", Any)],
    },
    Spec {
        command: "collMod",
        fields: &[
            ("index", Any),
            ("validator", Any),
            ("validationLevel", Any),
            ("validationAction", Any),
            ("viewOn", Any),
            ("pipeline", Any),
            ("recordPreImages", Any),
            ("changeStreamPreAndPostImages", Any),
            ("expireAfterSeconds", Any),
            ("timeseries", Any),
            ("timeseriesBucketsMayHaveMixedSchemaData", Any),
            ("dryRun", Any),
            ("cappedSize", Any),
            ("cappedMax", Any),
            ("collectionUUID", Any),
            ("isTimeseriesNamespace", Any),
            ("noPadding", Any),
            ("usePowerOf2Sizes", Any),
        ],
    },
    Spec {
        command: "explain",
        fields: &[("verbosity", Str)],
    },
];

/// The fields of one update statement (`UpdateOpEntry`).
const UPDATE_STATEMENT: &[(&str, Ty)] = &[
    ("q", Obj),
    ("u", Any),
    ("c", Obj),
    ("arrayFilters", Arr),
    ("hint", Any),
    ("multi", Any),
    ("upsert", Any),
    ("upsertSupplied", Any),
    ("collation", Obj),
    ("sampleId", Any),
    ("$_allowShardKeyUpdatesWithoutFullShardKey", Any),
];

/// The fields of one delete statement (`DeleteOpEntry`).
const DELETE_STATEMENT: &[(&str, Ty)] = &[
    ("q", Obj),
    ("limit", Any),
    ("hint", Any),
    ("collation", Obj),
    ("sampleId", Any),
];

/// The spec of command `canonical` (a [`super::COMMANDS`] name), if it is
/// parsed strictly.
pub fn spec(canonical: &str) -> Option<&'static Spec> {
    SPECS.iter().find(|s| s.command == canonical)
}

/// Hold command `cmd` (canonical name `canonical`) to its field list:
/// 40415 for an unknown field, 14 for a known one of the wrong type; for
/// `explain`, the explained command too. Commands without a spec pass.
pub fn check(canonical: &str, cmd: &Document) -> CmdResult<()> {
    let Some(spec) = spec(canonical) else {
        return Ok(());
    };
    for (k, v) in cmd.iter().skip(1) {
        let write_base = WRITE_BASE_USERS.contains(&canonical) && in_list(WRITE_BASE, k).is_some();
        if write_base || GENERIC.contains(&k.as_str()) {
            continue;
        }
        match in_list(spec.fields, k) {
            Some(ty) => check_type(&format!("{canonical}.{k}"), ty, v)?,
            None => return Err(unknown(&format!("{canonical}.{k}"))),
        }
    }
    match canonical {
        "update" => statements(cmd, "update.updates", "updates", UPDATE_STATEMENT),
        "delete" => statements(cmd, "delete.deletes", "deletes", DELETE_STATEMENT),
        "explain" => match cmd.get("explain") {
            Some(Bson::Document(inner)) => {
                match inner.keys().next().and_then(|n| super::canonical_name(n)) {
                    Some(name) if name != "explain" => check(name, inner),
                    _ => Ok(()),
                }
            }
            _ => Ok(()),
        },
        _ => Ok(()),
    }
}

/// The commands [`WRITE_BASE`]'s fields belong to.
const WRITE_BASE_USERS: &[&str] = &["insert", "update", "delete"];

fn in_list(fields: &[(&str, Ty)], k: &str) -> Option<Ty> {
    fields.iter().find(|(n, _)| *n == k).map(|(_, t)| *t)
}

/// Each document of array `field` held to `fields` (`path` names them in
/// errors); elements that are not documents are left to the handler.
fn statements(cmd: &Document, path: &str, field: &str, fields: &[(&str, Ty)]) -> CmdResult<()> {
    let Some(Bson::Array(items)) = cmd.get(field) else {
        return Ok(());
    };
    for item in items {
        let Bson::Document(d) = item else { continue };
        for (k, v) in d {
            match in_list(fields, k) {
                Some(ty) => check_type(&format!("{path}.{k}"), ty, v)?,
                None => return Err(unknown(&format!("{path}.{k}"))),
            }
        }
    }
    Ok(())
}

/// MongoDB's 40415 for the unknown field at `path` (`find.foo`).
pub fn unknown(path: &str) -> CommandError {
    CommandError::new(
        40415,
        "IDLUnknownField",
        format!("BSON field '{path}' is an unknown field."),
    )
}

/// Whether `v` has type `ty`; MongoDB's 14 TypeMismatch if not.
fn check_type(path: &str, ty: Ty, v: &Bson) -> CmdResult<()> {
    let ok = match (ty, v) {
        (Any, _) => true,
        (Bool, v) => matches!(v, Bson::Boolean(_)),
        (_, Bson::Null) => true,
        (Num, v) => matches!(
            v,
            Bson::Int32(_) | Bson::Int64(_) | Bson::Double(_) | Bson::Decimal128(_)
        ),
        (Obj, v) => matches!(v, Bson::Document(_)),
        (Str, v) => matches!(v, Bson::String(_)),
        (Arr, v) => matches!(v, Bson::Array(_)),
    };
    if ok {
        return Ok(());
    }
    let want = match ty {
        Any => "any",
        Bool => "expected type 'bool'",
        Num => "expected types '[long, int, decimal, double]'",
        Obj => "expected type 'object'",
        Str => "expected type 'string'",
        Arr => "expected type 'array'",
    };
    Err(CommandError::type_mismatch(format!(
        "BSON field '{path}' is the wrong type '{}', {want}",
        duetdb::raw::type_name(v)
    )))
}

#[cfg(test)]
mod tests {
    use super::*;
    use bson::doc;

    #[test]
    fn every_spec_names_a_command_and_accepts_the_generic_fields() {
        for spec in SPECS {
            assert!(
                super::super::COMMANDS
                    .iter()
                    .any(|(n, _)| *n == spec.command),
                "{} has a field list but is not in COMMANDS",
                spec.command
            );
            for g in GENERIC {
                let mut cmd = doc! {spec.command: "c"};
                cmd.insert(*g, doc! {});
                assert!(
                    check(spec.command, &cmd).is_ok(),
                    "{} refuses the generic field {g}",
                    spec.command
                );
                assert!(
                    in_list(spec.fields, g).is_none(),
                    "{} lists the generic field {g} as its own",
                    spec.command
                );
            }
        }
    }

    #[test]
    fn commands_with_field_lists_include_those_apps_send_most() {
        for name in [
            "find",
            "getMore",
            "killCursors",
            "aggregate",
            "count",
            "distinct",
            "insert",
            "update",
            "delete",
            "findAndModify",
            "createIndexes",
            "dropIndexes",
            "listIndexes",
            "listCollections",
            "create",
            "drop",
            "collMod",
            "explain",
        ] {
            assert!(spec(name).is_some(), "{name} has no field list");
        }
    }

    #[test]
    fn unknown_fields_and_wrong_types_answer_as_mongodb() {
        let e = check("find", &doc! {"find": "c", "foo": 1}).expect_err("refused");
        assert_eq!((e.code, e.code_name), (40415, "IDLUnknownField"));
        assert_eq!(e.message, "BSON field 'find.foo' is an unknown field.");
        let e = check("find", &doc! {"find": "c", "limit": "x"}).expect_err("refused");
        assert_eq!(e.code, 14);
        assert_eq!(
            e.message,
            "BSON field 'find.limit' is the wrong type 'string', expected types '[long, int, decimal, double]'"
        );
        let e = check(
            "update",
            &doc! {"update": "c", "updates": [{"q": {}, "u": {}, "x": 1}]},
        )
        .expect_err("refused");
        assert_eq!(
            e.message,
            "BSON field 'update.updates.x' is an unknown field."
        );
        let e = check(
            "explain",
            &doc! {"explain": {"count": "c", "nope": 1}, "verbosity": "queryPlanner"},
        )
        .expect_err("refused");
        assert_eq!(e.message, "BSON field 'count.nope' is an unknown field.");
        // The first field is the command's own; a command without a spec passes.
        assert!(check("find", &doc! {"find": "c", "filter": null}).is_ok());
        assert!(check("ping", &doc! {"ping": 1, "foo": 1}).is_ok());
    }
}
