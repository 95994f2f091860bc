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
//! statements (`delete.deletes.foo`), and in `cursor`
//! (`SimpleCursorOptions`: `batchSize` only, `>= 0` else 51024). A
//! command's own field sent twice is 40413 (`BSON field 'find.filter' is a
//! duplicate field`): a decoded `Document` keeps one of two equal names, so
//! the decoder runs [`check_raw`] on the bytes of a body that repeats a name
//! at a level checked here (`dupfields.rs`). Index specifications have their
//! own rule (197 InvalidIndexSpecificationOption, `query/index_spec.rs`).
//!
//! Invariants:
//! - a command without an entry in [`SPECS`] is not checked here (its
//!   handler parses it); every entry names a [`super::COMMANDS`] command;
//! - every field of [`GENERIC`] and duet's own `$duet` is accepted by every
//!   checked command (a unit test sends each), so nothing a driver or tool
//!   adds to any command is refused;
//! - the first offending field in document order decides the error, as
//!   MongoDB's parser reports the first it meets;
//! - generic arguments are skipped without a duplicate check, as MongoDB's
//!   strict parsers do; only a field repeated inside `writeConcern` is
//!   refused (40413 under `WriteConcernOptions`, its parser's name), after
//!   the command's own fields;
//! - only types are checked here, and `cursor.batchSize`'s range; values
//!   (ranges, meanings) stay with the handlers. A `null` counts as absent for every type but a strict bool
//!   (MongoDB's `optionalBool` refuses it; duet's handlers treat `null` as
//!   absent elsewhere, and nothing is gained by refusing it).

use bson::raw::{RawBsonRef, RawDocument};
use bson::spec::ElementType;
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
            ("pipeline", Arr),
            ("explain", Any),
            ("allowDiskUse", Bool),
            // Its own deserializer checks the type (`check_elems`).
            ("cursor", Any),
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

/// `cursor` (`SimpleCursorOptions`, strict): aggregate's, listCollections'
/// and listIndexes'. `batchSize` is a `safeInt64` with `validator: {gte: 0}`.
const CURSOR: &[(&str, Ty)] = &[("batchSize", Num)];

/// One element's value as the checker sees it: from a decoded `Document`
/// (names unique) or from the raw bytes as sent (a name may repeat: the
/// only way to see MongoDB's 40413 duplicate field).
#[derive(Clone, Copy)]
enum Val<'a> {
    Doc(&'a Bson),
    Raw(RawBsonRef<'a>),
}

type Elems<'a> = Vec<(&'a str, Val<'a>)>;

fn doc_elems(d: &Document) -> Elems<'_> {
    d.iter().map(|(k, v)| (k.as_str(), Val::Doc(v))).collect()
}

/// A raw document's elements in order, repeats kept; a malformed tail
/// (the decoder validated the message, so none is expected) ends the list.
fn raw_elems(d: &RawDocument) -> Elems<'_> {
    d.into_iter()
        .map_while(Result::ok)
        .map(|(k, v)| (k.as_str(), Val::Raw(v)))
        .collect()
}

impl<'a> Val<'a> {
    fn element_type(self) -> ElementType {
        match self {
            Val::Doc(b) => b.element_type(),
            Val::Raw(r) => r.element_type(),
        }
    }

    fn is_null(self) -> bool {
        self.element_type() == ElementType::Null
    }

    fn type_name(self) -> &'static str {
        match self {
            Val::Doc(b) => duetdb::raw::type_name(b),
            Val::Raw(RawBsonRef::Document(_)) => "object",
            Val::Raw(RawBsonRef::Array(_)) => "array",
            Val::Raw(r) => duetdb::raw::type_name(&Bson::try_from(r).unwrap_or(Bson::Null)),
        }
    }

    /// The elements of a document value.
    fn sub(self) -> Option<Elems<'a>> {
        match self {
            Val::Doc(Bson::Document(d)) => Some(doc_elems(d)),
            Val::Raw(RawBsonRef::Document(d)) => Some(raw_elems(d)),
            _ => None,
        }
    }

    /// The items of an array value.
    fn items(self) -> Option<Vec<Val<'a>>> {
        match self {
            Val::Doc(Bson::Array(a)) => Some(a.iter().map(Val::Doc).collect()),
            Val::Raw(RawBsonRef::Array(a)) => {
                Some(a.into_iter().map_while(Result::ok).map(Val::Raw).collect())
            }
            _ => None,
        }
    }

    /// A number as `safeInt64` reads it (`safeNumberLong`: doubles
    /// truncated toward zero, saturated; NaN is 0).
    fn safe_i64(self) -> Option<i64> {
        match self {
            Val::Doc(b) => crate::args::safe_number_long(b),
            Val::Raw(r) => crate::args::safe_number_long(&Bson::try_from(r).ok()?),
        }
    }
}

/// Hold command `cmd` (canonical name `canonical`) to its field list:
/// 40415 for an unknown field, 14 for a known one of the wrong type, and
/// the checks of the sub-documents parsed with it (`cursor`, update and
/// delete statements); for `explain`, the explained command too. Commands
/// without a spec pass.
pub fn check(canonical: &str, cmd: &Document) -> CmdResult<()> {
    check_elems(canonical, &doc_elems(cmd))?;
    check_required(canonical, cmd)
}

/// The fields MongoDB's IDL declares required (no `optional: true`, no
/// default) for the commands checked here: their absence is 40414 with the
/// field's path, after the fields present were parsed.
const REQUIRED: &[(&str, &str)] = &[
    ("insert", "documents"),
    ("update", "updates"),
    ("delete", "deletes"),
    ("distinct", "key"),
    ("aggregate", "pipeline"),
];

/// MongoDB's 40414 for a required field `canonical` lacks (`null` counts
/// as absent for an IDL field that is not optional too, but handlers meet
/// that as a type error: only absence is decided here). Checked on the
/// whole command, document sequences included, never on a body alone.
fn check_required(canonical: &str, cmd: &Document) -> CmdResult<()> {
    for &(command, field) in REQUIRED {
        if command == canonical && !cmd.contains_key(field) {
            return Err(CommandError::new(
                40414,
                "Location40414",
                format!("BSON field '{command}.{field}' is missing but a required field"),
            ));
        }
    }
    Ok(())
}

/// [`check`] on the command as sent, where a name may repeat: a command's
/// own field sent twice is MongoDB's 40413, `BSON field 'find.filter' is a
/// duplicate field` (so is one inside `cursor` or a statement). The decoder
/// calls it for a body that repeats a name (`dupfields.rs`): the first
/// offending field in document order decides, whichever its kind.
pub fn check_raw(canonical: &str, cmd: &RawDocument) -> CmdResult<()> {
    check_elems(canonical, &raw_elems(cmd))
}

/// [`check_raw`] for one update or delete statement sent in a document
/// sequence (`updates`/`deletes`); other sequences pass.
pub fn check_raw_statement(ident: &str, stmt: &RawDocument) -> CmdResult<()> {
    let elems = raw_elems(stmt);
    match ident {
        "updates" => statement("update.updates", UPDATE_STATEMENT, &elems)?,
        "deletes" => statement("delete.deletes", DELETE_STATEMENT, &elems)?,
        _ => return Ok(()),
    }
    // The statement's collation is parsed when it runs, after its fields.
    no_repeat(sub_of(&elems, "collation"), "collation")
}

fn check_elems(canonical: &str, cmd: &Elems<'_>) -> CmdResult<()> {
    let Some(spec) = spec(canonical) else {
        return repeats_in_parsed_objects(cmd);
    };
    let mut seen: Vec<&str> = Vec::new();
    for &(k, v) in cmd.iter().skip(1) {
        let write_base = WRITE_BASE_USERS.contains(&canonical) && in_list(WRITE_BASE, k).is_some();
        let ty = if write_base {
            Any
        } else if GENERIC.contains(&k) {
            // A generic argument is not the command's own field: MongoDB's
            // strict parsers skip it without a duplicate check.
            continue;
        } else {
            match in_list(spec.fields, k) {
                Some(ty) => ty,
                None => return Err(unknown(&format!("{canonical}.{k}"))),
            }
        };
        let path = format!("{canonical}.{k}");
        if !field(&path, ty, v, &mut seen, k)? {
            continue;
        }
        match (canonical, k) {
            ("update", "updates") => statements("update.updates", UPDATE_STATEMENT, v)?,
            ("delete", "deletes") => statements("delete.deletes", DELETE_STATEMENT, v)?,
            // aggregate's `cursor` has its own deserializer
            // (`parseAggregateCursorFromBSON`): anything but an object,
            // null included, is refused, and its fields' paths start at
            // `cursor`.
            ("aggregate", "cursor") => match v.sub() {
                Some(c) => statement("cursor", CURSOR, &c)?,
                None => {
                    return Err(CommandError::type_mismatch(
                        "cursor field must be missing or an object",
                    ))
                }
            },
            ("listCollections" | "listIndexes", "cursor") => {
                if let Some(c) = v.sub() {
                    statement(&path, CURSOR, &c)?;
                }
            }
            _ => {}
        }
    }
    repeats_in_parsed_objects(cmd)?;
    if canonical == "explain" {
        if let Some(inner) = cmd
            .iter()
            .find(|(k, _)| *k == "explain")
            .and_then(|(_, v)| v.sub())
        {
            if let Some(name) = inner.first().and_then(|(n, _)| super::canonical_name(n)) {
                if name != "explain" {
                    return check_elems(name, &inner);
                }
            }
        }
    }
    Ok(())
}

/// The objects MongoDB parses with their own IDL structs after the
/// command's fields, each refusing a field sent twice with 40413 under its
/// parser's context name: `writeConcern` (`WriteConcernOptions.w`), then
/// `readConcern` (`readConcern.level`, `ReadConcernArgs::parse`) for every
/// command, and a `collation` when the command runs
/// (`CollatorFactoryICU::makeFromBSON`: `collation.locale`), also the one of
/// each update or delete statement.
fn repeats_in_parsed_objects(cmd: &Elems<'_>) -> CmdResult<()> {
    no_repeat(sub_of(cmd, "writeConcern"), "WriteConcernOptions")?;
    no_repeat(sub_of(cmd, "readConcern"), "readConcern")?;
    no_repeat(sub_of(cmd, "collation"), "collation")?;
    for list in ["updates", "deletes"] {
        let items = cmd
            .iter()
            .find(|(k, _)| *k == list)
            .and_then(|(_, v)| v.items())
            .unwrap_or_default();
        for stmt in items.into_iter().filter_map(Val::sub) {
            no_repeat(sub_of(&stmt, "collation"), "collation")?;
        }
    }
    Ok(())
}

/// The elements of the object field `name` of `d` (the first one).
fn sub_of<'a>(d: &Elems<'a>, name: &str) -> Option<Elems<'a>> {
    d.iter()
        .find(|(k, _)| *k == name)
        .and_then(|(_, v)| v.sub())
}

/// 40413 under `context` for the first name `obj` repeats.
fn no_repeat(obj: Option<Elems<'_>>, context: &str) -> CmdResult<()> {
    let mut seen: Vec<&str> = Vec::new();
    for (k, _) in obj.unwrap_or_default() {
        if seen.contains(&k) {
            return Err(duplicate(&format!("{context}.{k}")));
        }
        seen.push(k);
    }
    Ok(())
}

/// One known field at `path` (named `k`) of type `ty`: its type, then
/// whether it was already seen (MongoDB's order: a typed field's type is
/// checked first and a null one is skipped, as if absent; an untyped or
/// `optionalBool` field is counted before its value is parsed). `false`
/// when the field is skipped (null).
fn field<'a>(
    path: &str,
    ty: Ty,
    v: Val<'_>,
    seen: &mut Vec<&'a str>,
    k: &'a str,
) -> CmdResult<bool> {
    let typed = !matches!(ty, Any | Bool);
    if typed {
        if v.is_null() {
            return Ok(false);
        }
        check_type(path, ty, v)?;
    }
    if seen.contains(&k) {
        return Err(duplicate(path));
    }
    seen.push(k);
    if !typed {
        check_type(path, ty, v)?;
    }
    Ok(true)
}

/// The commands [`WRITE_BASE`]'s fields belong to.
const WRITE_BASE_USERS: &[&str] = &["insert", "update", "delete"];

fn in_list(fields: &[(&str, Ty)], k: &str) -> Option<Ty> {
    fields.iter().find(|(n, _)| *n == k).map(|(_, t)| *t)
}

/// Each document of array `v` held to `fields` (`path` names them in
/// errors); elements that are not documents are left to the handler.
fn statements(path: &str, fields: &[(&str, Ty)], v: Val<'_>) -> CmdResult<()> {
    for item in v.items().unwrap_or_default() {
        if let Some(d) = item.sub() {
            statement(path, fields, &d)?;
        }
    }
    Ok(())
}

/// One strictly parsed sub-document held to `fields`; `cursor.batchSize`
/// also to its validator (51024 below 0).
fn statement(path: &str, fields: &[(&str, Ty)], d: &Elems<'_>) -> CmdResult<()> {
    let cursor = fields == CURSOR;
    let mut seen: Vec<&str> = Vec::new();
    for &(k, v) in d {
        let Some(ty) = in_list(fields, k) else {
            return Err(unknown(&format!("{path}.{k}")));
        };
        let p = format!("{path}.{k}");
        if field(&p, ty, v, &mut seen, k)? && cursor {
            match v.safe_i64() {
                Some(n) if n < 0 => {
                    return Err(CommandError::new(
                        51024,
                        "Location51024",
                        format!("BSON field '{p}' value must be >= 0, actual value '{n}'"),
                    ))
                }
                _ => {}
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

/// MongoDB's 40413 for a field sent twice (`IDLParserContext::
/// throwDuplicateField`).
pub fn duplicate(path: &str) -> CommandError {
    CommandError::new(
        40413,
        "Location40413",
        format!("BSON field '{path}' is a duplicate field"),
    )
}

/// Whether `v` has type `ty`; MongoDB's 14 TypeMismatch if not.
fn check_type(path: &str, ty: Ty, v: Val<'_>) -> CmdResult<()> {
    use ElementType as E;
    let t = v.element_type();
    let ok = match (ty, t) {
        (Any, _) => true,
        (Bool, t) => t == E::Boolean,
        (_, E::Null) => true,
        (Num, t) => matches!(t, E::Int32 | E::Int64 | E::Double | E::Decimal128),
        (Obj, t) => t == E::EmbeddedDocument,
        (Str, t) => t == E::String,
        (Arr, t) => t == E::Array,
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
        v.type_name()
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
                for &(command, field) in REQUIRED {
                    if command == spec.command {
                        let value = match in_list(spec.fields, field) {
                            Some(Str) => Bson::String("k".into()),
                            _ => Bson::Array(Vec::new()),
                        };
                        cmd.insert(field, value);
                    }
                }
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
    fn a_missing_required_field_is_40414_with_its_path() {
        for &(command, field) in REQUIRED {
            assert!(
                in_list(spec(command).expect("a spec").fields, field).is_some(),
                "{command}.{field} is required but not in its field list"
            );
            let e = check(command, &doc! {command: "c"}).expect_err("refused");
            assert_eq!(e.code, 40414);
            assert_eq!(
                e.message,
                format!("BSON field '{command}.{field}' is missing but a required field")
            );
        }
        // An unknown field is reported before a missing one, as MongoDB's
        // parser meets it first.
        let e = check("insert", &doc! {"insert": "c", "foo": 1}).expect_err("refused");
        assert_eq!(e.code, 40415);
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
        let e = check(
            "aggregate",
            &doc! {"aggregate": "c", "pipeline": [], "cursor": {"batchSize": -3}, "x": 1},
        )
        .expect_err("refused");
        assert_eq!(
            (e.code, e.message.as_str()),
            (
                51024,
                "BSON field 'cursor.batchSize' value must be >= 0, actual value '-3'"
            )
        );
        let e = check(
            "listIndexes",
            &doc! {"listIndexes": "c", "cursor": {"n": 1}},
        )
        .expect_err("refused");
        assert_eq!(
            e.message,
            "BSON field 'listIndexes.cursor.n' is an unknown field."
        );
        // The first field is the command's own; a command without a spec passes.
        assert!(check("find", &doc! {"find": "c", "filter": null}).is_ok());
        assert!(check("ping", &doc! {"ping": 1, "foo": 1}).is_ok());
    }

    #[test]
    fn a_field_sent_twice_is_40413_in_document_order() {
        use bson::rawdoc;
        let r = rawdoc! {"find": "c", "filter": {}, "filter": {"a": 1}};
        let e = check_raw("find", &r).expect_err("refused");
        assert_eq!((e.code, e.code_name), (40413, "Location40413"));
        assert_eq!(e.message, "BSON field 'find.filter' is a duplicate field");
        // An unknown field before the repeat decides; a wrong type is first.
        let r = rawdoc! {"find": "c", "foo": 1, "limit": 1, "limit": 1};
        assert_eq!(check_raw("find", &r).expect_err("refused").code, 40415);
        let r = rawdoc! {"find": "c", "limit": 1, "limit": "x"};
        assert_eq!(check_raw("find", &r).expect_err("refused").code, 14);
        // A null repeat is skipped; generic arguments are not checked.
        let r = rawdoc! {"find": "c", "limit": 1, "limit": null};
        assert!(check_raw("find", &r).is_ok());
        let r = rawdoc! {"find": "c", "comment": 1, "comment": 2};
        assert!(check_raw("find", &r).is_ok());
        // Inside cursor, a statement, an explained command.
        let r = rawdoc! {
            "aggregate": "c", "pipeline": [], "cursor": {"batchSize": 1, "batchSize": 2}
        };
        let e = check_raw("aggregate", &r).expect_err("refused");
        assert_eq!(
            e.message,
            "BSON field 'cursor.batchSize' is a duplicate field"
        );
        let stmt = rawdoc! {"q": {}, "limit": 0, "limit": 1};
        let e = check_raw_statement("deletes", &stmt).expect_err("refused");
        assert_eq!(
            e.message,
            "BSON field 'delete.deletes.limit' is a duplicate field"
        );
        let r = rawdoc! {"update": "c", "updates": [{"q": {}, "u": {}, "u": {}}]};
        let e = check_raw("update", &r).expect_err("refused");
        assert_eq!(
            e.message,
            "BSON field 'update.updates.u' is a duplicate field"
        );
        let r = rawdoc! {"explain": {"find": "c", "sort": {}, "sort": {}}};
        let e = check_raw("explain", &r).expect_err("refused");
        assert_eq!(e.message, "BSON field 'find.sort' is a duplicate field");
        let r = rawdoc! {"insert": "c", "documents": [], "writeConcern": {"w": 1, "w": "majority"}};
        let e = check_raw("insert", &r).expect_err("refused");
        assert_eq!(
            e.message,
            "BSON field 'WriteConcernOptions.w' is a duplicate field"
        );
        // Its own fields come first.
        let r = rawdoc! {"insert": "c", "writeConcern": {"w": 1, "w": 1}, "frob": 1};
        assert_eq!(check_raw("insert", &r).expect_err("refused").code, 40415);
    }

    #[test]
    fn a_field_repeated_in_read_concern_or_collation_is_40413() {
        use bson::rawdoc;
        let message = |cmd: &str, r: &RawDocument| check_raw(cmd, r).expect_err("refused").message;
        let r = rawdoc! {"find": "c", "readConcern": {"level": "local", "level": "snapshot"}};
        assert_eq!(
            message("find", &r),
            "BSON field 'readConcern.level' is a duplicate field"
        );
        // readConcern is parsed for every command, checked by a spec or not.
        let r = rawdoc! {"dbStats": 1, "readConcern": {"level": "local", "level": "local"}};
        assert_eq!(
            message("dbStats", &r),
            "BSON field 'readConcern.level' is a duplicate field"
        );
        let r = rawdoc! {"find": "c", "collation": {"locale": "en", "strength": 1, "locale": "fr"}};
        assert_eq!(
            message("find", &r),
            "BSON field 'collation.locale' is a duplicate field"
        );
        let r = rawdoc! {
            "update": "c",
            "updates": [{"q": {}, "u": {}, "collation": {"locale": "en", "locale": "en"}}]
        };
        assert_eq!(
            message("update", &r),
            "BSON field 'collation.locale' is a duplicate field"
        );
        let stmt = rawdoc! {"q": {}, "limit": 0, "collation": {"strength": 1, "strength": 2}};
        let e = check_raw_statement("deletes", &stmt).expect_err("refused");
        assert_eq!(
            e.message,
            "BSON field 'collation.strength' is a duplicate field"
        );
        // Distinct names pass.
        let r =
            rawdoc! {"find": "c", "collation": {"locale": "en"}, "readConcern": {"level": "local"}};
        assert!(check_raw("find", &r).is_ok());
    }
}
