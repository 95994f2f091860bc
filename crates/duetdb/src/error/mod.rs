//! The engine's error type.
//!
//! One `#[non_exhaustive]` enum; every variant that has a MongoDB counterpart
//! reports MongoDB's numeric code and code name through [`Error::code`] and
//! [`Error::code_name`], so the wire server can answer exactly as drivers expect.
//! Errors from outside input never leave stored data changed.

mod cancel;
mod storage;

use bson::Bson;

pub use cancel::{CancelReason, CancelToken};
pub use storage::StorageError;

/// Engine result.
pub type Result<T, E = Error> = std::result::Result<T, E>;

#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A unique index (including `_id`) already holds this key. MongoDB code 11000.
    #[error("E11000 duplicate key error collection: {} index: {} dup key: {}", .0.ns, .0.index, .0.key)]
    DuplicateKey(Box<DuplicateKey>),
    /// A value of the wrong type for the operation. MongoDB code 14 (TypeMismatch).
    #[error("{0}")]
    TypeMismatch(String),
    /// Malformed or unsupported input (bad operator argument, invalid spec). Code 2.
    #[error("{0}")]
    BadValue(String),
    /// An operator or stage the engine does not know. Code 2 (MongoDB reports unknown
    /// query operators as BadValue).
    #[error("unknown operator: {0}")]
    UnknownOperator(String),
    /// An update that would change `_id` or otherwise break an immutable field. Code 66.
    #[error("{0}")]
    ImmutableField(String),
    /// A field path that conflicts with another in the same update. Code 40.
    #[error("{0}")]
    ConflictingUpdateOperators(String),
    /// An update tried to traverse a non-document / non-array. Code 28 (PathNotViable).
    #[error("{0}")]
    PathNotViable(String),
    /// A document that exceeds the size limit. Code 10334 (BSONObjectTooLarge).
    #[error("document is too large: {size} bytes, the limit is {limit} bytes")]
    DocumentTooLarge { size: usize, limit: usize },
    /// Nesting deeper than the limit. Code 15 (Overflow).
    #[error("document nesting is too deep: more than {limit} levels")]
    NestingTooDeep { limit: usize },
    /// Invalid BSON bytes from outside. Code 22 (InvalidBSON).
    #[error("invalid BSON: {0}")]
    InvalidBson(String),
    /// `_id` of a type MongoDB forbids (array, regex, undefined). Code 2.
    #[error("{0}")]
    InvalidId(String),
    /// Namespace does not exist. Code 26 (NamespaceNotFound).
    #[error("ns not found: {0}")]
    NamespaceNotFound(String),
    /// Namespace already exists. Code 48 (NamespaceExists).
    #[error("collection already exists: {0}")]
    NamespaceExists(String),
    /// Invalid collection or database name. Code 73 (InvalidNamespace).
    #[error("invalid namespace: {0}")]
    InvalidNamespace(String),
    /// A new database whose name differs only in case from an existing one
    /// (`existing`, `requested`). Code 13297 (DatabaseDifferCase), as MongoDB.
    #[error("db already exists with different case already have: [{0}] trying to create [{1}]")]
    DatabaseDifferCase(String, String),
    /// No index of that name. Code 27 (IndexNotFound).
    #[error("index not found with name [{0}]")]
    IndexNotFound(String),
    /// An index with the same name but a different spec exists. Code 86 (IndexKeySpecsConflict).
    #[error("{0}")]
    IndexConflict(String),
    /// An index with the same key pattern (or the same name and keys) but
    /// other options or another name exists. Code 85 (IndexOptionsConflict).
    #[error("{0}")]
    IndexOptionsConflict(String),
    /// An array where a hashed index needs a single value. Code 16766, as MongoDB.
    #[error("{0}")]
    HashedArray(String),
    /// A text language MongoDB does not know. Code 17262, as MongoDB.
    #[error("{0}")]
    TextLanguage(String),
    /// Invalid index specification. Code 67 (CannotCreateIndex).
    #[error("{0}")]
    CannotCreateIndex(String),
    /// An operation that is not allowed in this state. Code 20 (IllegalOperation).
    #[error("{0}")]
    IllegalOperation(String),
    /// A running query lost its collection (dropped or renamed). Code 175 (QueryPlanKilled).
    #[error("query plan killed: {0}")]
    QueryPlanKilled(String),
    /// An index build in progress was aborted (its collection or index was
    /// dropped, renamed or recreated meanwhile). Code 276 (IndexBuildAborted).
    #[error("{0}")]
    IndexBuildAborted(String),
    /// The database has been closed or its writer stopped.
    #[error("database is closed")]
    Closed,
    /// A bug that was caught instead of corrupting data. Code 1 (InternalError).
    #[error("internal error: {0}")]
    Internal(String),
    /// A named snapshot of that name is already held. Code 48 (NamespaceExists),
    /// as for a collection that exists.
    #[error("snapshot already exists: {0}")]
    SnapshotExists(String),
    /// No named snapshot of that name (never created, dropped, or expired; the
    /// message says which when known). Code 246 (SnapshotUnavailable).
    #[error("{0}")]
    SnapshotNotFound(String),
    /// Several documents of an `insert_many` failed (see [`BulkWriteFailure`]).
    #[error("bulk write failed: {} error(s)", .0.errors.len())]
    BulkWrite(Box<BulkWriteFailure>),
    /// A storage failure (I/O error, full disk, corrupt or missing file, writes
    /// stopped after an fsync failure). Its code says which
    /// ([`StorageError::code`]: 14031 full disk, 20 permission denied or
    /// read-only, 264 too many open files, 8 other OS errors, 301 damaged
    /// or missing files, 98 locked, 42 writes stopped, 257 record too large);
    /// the message names the path and the OS error.
    #[error("storage: {0}")]
    Storage(Box<StorageError>),
    /// A blocking stage (a sort or `$group` that may not spill) exceeded its
    /// memory limit. Code 292 (QueryExceededMemoryLimitNoDiskUseAllowed).
    #[error("{0}")]
    ExceededMemoryLimit(String),
    /// The read was cancelled ([`CancelToken`]): code 50, 11601, 279 or 11600
    /// by [`CancelReason`].
    #[error("{}", .0.message())]
    Interrupted(CancelReason),
    /// A transaction wrote (or, under `serializable`, read) a document or range
    /// that a commit after its snapshot changed; it changed nothing and may be
    /// retried. Code 112, labelled `TransientTransactionError`.
    #[error("WriteConflict: {0}")]
    WriteConflict(String),
    /// The transaction was aborted or has ended (committed, aborted, expired). Code 251.
    #[error("NoSuchTransaction: {0}")]
    NoSuchTransaction(String),
    /// The transaction outlived its lifetime limit and was aborted. Code 290.
    #[error("transaction exceeded its lifetime limit of {0} seconds and was aborted")]
    TransactionExceededLifetimeLimitSeconds(u64),
    /// The transaction's write set exceeds the limits. Code 257 (TransactionTooLarge).
    #[error("{0}")]
    TransactionTooLarge(String),
    /// A value or document being built (by an expression, a stage, a
    /// projection) would exceed the document size limit; building stopped at
    /// `size` bytes, before the whole value existed. Code 10334
    /// (BSONObjectTooLarge), as for a stored document.
    #[error("{what} would exceed the {limit}-byte BSON size limit (at least {size} bytes)")]
    ValueTooLarge {
        what: String,
        size: usize,
        limit: usize,
    },
    /// A change stream asked for a position older than the retained change
    /// history. Code 286 (ChangeStreamHistoryLost), as MongoDB: events are
    /// never skipped silently.
    #[error("{0}")]
    ChangeStreamHistoryLost(String),
    /// A write failed the collection's validator. MongoDB code 121; the
    /// document is MongoDB's `errInfo` (`failingDocumentId`, `details`).
    #[error("Document failed validation")]
    DocumentValidationFailure(Box<bson::Document>),
    /// An error MongoDB raises with a specific code of its own: a named code
    /// (241 ConversionFailure, 9 FailedToParse, ...) or a numbered assertion
    /// location (`Location16554`), as the expression language's operators do.
    #[error("{msg}")]
    Coded {
        code: i32,
        name: &'static str,
        msg: String,
    },
    /// An error of optimizing a parsed expression (MongoDB's precompilation
    /// of a constant regex, `query::expr::regex::precompile`): reported exactly as
    /// the error it holds, and never under a stage's parse context
    /// (`Invalid $project :: caused by :: …`), since MongoDB optimizes after
    /// parsing.
    #[error("{0}")]
    Optimize(Box<Error>),
}

impl Error {
    /// MongoDB's numeric error code for this error.
    pub fn code(&self) -> i32 {
        match self {
            Error::DuplicateKey(_) => 11000,
            Error::TypeMismatch(_) => 14,
            Error::BadValue(_) | Error::UnknownOperator(_) | Error::InvalidId(_) => 2,
            Error::ImmutableField(_) => 66,
            Error::ConflictingUpdateOperators(_) => 40,
            Error::PathNotViable(_) => 28,
            Error::DocumentTooLarge { .. } => 10334,
            Error::NestingTooDeep { .. } => 15,
            Error::InvalidBson(_) => 22,
            Error::NamespaceNotFound(_) => 26,
            Error::NamespaceExists(_) => 48,
            Error::InvalidNamespace(_) => 73,
            Error::DatabaseDifferCase(..) => 13297,
            Error::IndexNotFound(_) => 27,
            Error::IndexConflict(_) => 86,
            Error::IndexOptionsConflict(_) => 85,
            Error::HashedArray(_) => 16766,
            Error::TextLanguage(_) => 17262,
            Error::CannotCreateIndex(_) => 67,
            Error::IllegalOperation(_) => 20,
            Error::QueryPlanKilled(_) => 175,
            Error::IndexBuildAborted(_) => 276,
            Error::Closed => 91,
            Error::Internal(_) => 1,
            Error::BulkWrite(_) => 65,
            Error::SnapshotExists(_) => 48,
            Error::SnapshotNotFound(_) => 246,
            Error::Storage(e) => e.code(),
            Error::ExceededMemoryLimit(_) => 292,
            Error::Interrupted(r) => r.code(),
            Error::WriteConflict(_) => 112,
            Error::NoSuchTransaction(_) => 251,
            Error::TransactionExceededLifetimeLimitSeconds(_) => 290,
            Error::TransactionTooLarge(_) => 257,
            Error::ValueTooLarge { .. } => 10334,
            Error::ChangeStreamHistoryLost(_) => 286,
            Error::DocumentValidationFailure(_) => 121,
            Error::Coded { code, .. } => *code,
            Error::Optimize(inner) => inner.code(),
        }
    }

    /// MongoDB's code name for this error.
    pub fn code_name(&self) -> &'static str {
        match self {
            Error::DuplicateKey(_) => "DuplicateKey",
            Error::TypeMismatch(_) => "TypeMismatch",
            Error::BadValue(_) | Error::UnknownOperator(_) | Error::InvalidId(_) => "BadValue",
            Error::ImmutableField(_) => "ImmutableField",
            Error::ConflictingUpdateOperators(_) => "ConflictingUpdateOperators",
            Error::PathNotViable(_) => "PathNotViable",
            Error::DocumentTooLarge { .. } => "BSONObjectTooLarge",
            Error::NestingTooDeep { .. } => "Overflow",
            Error::InvalidBson(_) => "InvalidBSON",
            Error::NamespaceNotFound(_) => "NamespaceNotFound",
            Error::NamespaceExists(_) => "NamespaceExists",
            Error::InvalidNamespace(_) => "InvalidNamespace",
            Error::DatabaseDifferCase(..) => "DatabaseDifferCase",
            Error::IndexNotFound(_) => "IndexNotFound",
            Error::IndexConflict(_) => "IndexKeySpecsConflict",
            Error::IndexOptionsConflict(_) => "IndexOptionsConflict",
            Error::HashedArray(_) => "Location16766",
            Error::DocumentValidationFailure(_) => "DocumentValidationFailure",
            Error::TextLanguage(_) => "Location17262",
            Error::CannotCreateIndex(_) => "CannotCreateIndex",
            Error::IllegalOperation(_) => "IllegalOperation",
            Error::QueryPlanKilled(_) => "QueryPlanKilled",
            Error::IndexBuildAborted(_) => "IndexBuildAborted",
            Error::Closed => "ShutdownInProgress",
            Error::Internal(_) => "InternalError",
            Error::BulkWrite(_) => "MultipleErrorsOccurred",
            Error::SnapshotExists(_) => "NamespaceExists",
            Error::SnapshotNotFound(_) => "SnapshotUnavailable",
            Error::Storage(e) => e.code_name(),
            Error::ExceededMemoryLimit(_) => "QueryExceededMemoryLimitNoDiskUseAllowed",
            Error::Interrupted(r) => r.code_name(),
            Error::WriteConflict(_) => "WriteConflict",
            Error::NoSuchTransaction(_) => "NoSuchTransaction",
            Error::TransactionExceededLifetimeLimitSeconds(_) => {
                "TransactionExceededLifetimeLimitSeconds"
            }
            Error::TransactionTooLarge(_) => "TransactionTooLarge",
            Error::ValueTooLarge { .. } => "BSONObjectTooLarge",
            Error::ChangeStreamHistoryLost(_) => "ChangeStreamHistoryLost",
            Error::Coded { name, .. } => name,
            Error::Optimize(inner) => inner.code_name(),
        }
    }

    /// True for errors after which the whole transaction may simply be retried
    /// (MongoDB's `TransientTransactionError` label): a write conflict.
    pub fn is_transient_transaction_error(&self) -> bool {
        matches!(self, Error::WriteConflict(_))
    }

    /// True for errors that end the transaction they happened in rather
    /// than one statement of it (a write conflict, an aborted, expired or
    /// too large transaction): a server fails the whole command with them
    /// instead of reporting a write error, and a batch stops at them.
    pub fn ends_transaction(&self) -> bool {
        matches!(
            self,
            Error::WriteConflict(_)
                | Error::NoSuchTransaction(_)
                | Error::TransactionExceededLifetimeLimitSeconds(_)
                | Error::TransactionTooLarge(_)
        )
    }

    /// MongoDB's `errorLabels` for this error (what the server puts on the reply).
    pub fn error_labels(&self) -> &'static [&'static str] {
        if self.is_transient_transaction_error() {
            &["TransientTransactionError"]
        } else {
            &[]
        }
    }

    pub(crate) fn bad_value(msg: impl Into<String>) -> Error {
        Error::BadValue(msg.into())
    }

    pub(crate) fn type_mismatch(msg: impl Into<String>) -> Error {
        Error::TypeMismatch(msg.into())
    }
}

/// Details of a duplicate-key error (boxed: errors stay small on the happy path).
#[derive(Debug, Clone)]
pub struct DuplicateKey {
    /// The collection.
    pub ns: String,
    /// The index name (`_id_` for the primary index).
    pub index: String,
    /// The index's key pattern, e.g. `{ email: 1 }`.
    pub key_pattern: bson::Document,
    /// The offending key, e.g. `{ email: "a@b" }`.
    pub key_value: bson::Document,
    /// `key_value` rendered for the message.
    pub key: String,
}

/// Short human rendering of a BSON value for error messages.
pub(crate) fn render(v: &Bson) -> String {
    let s = v.to_string();
    if s.len() > 200 {
        let mut end = 200;
        while !s.is_char_boundary(end) {
            end -= 1;
        }
        format!("{}…", &s[..end])
    } else {
        s
    }
}

/// A BSON value as MongoDB's `BSONElement::toString` prints it in error
/// messages (`{ a: 1, b: "x" }`, `[ 1.0, 2 ]`, `ObjectId('…')`): field names
/// unquoted, doubles with a fraction (`5.0`), strings in double quotes.
/// Messages that quote a document the way MongoDB does use this, so a client
/// matching on MongoDB's text sees the same text. Long output is cut at
/// 1,000 bytes with `…` (MongoDB prints the whole value; a hostile document
/// must not make an error message huge).
pub fn render_shell(v: &Bson) -> String {
    let mut out = String::new();
    shell_into(v, &mut out, 0);
    cut_rendered(&mut out);
    out
}

/// Cut a rendered value at 1,000 bytes (on a character boundary) with `…`.
fn cut_rendered(out: &mut String) {
    if out.len() > 1000 {
        let mut end = 1000;
        while !out.is_char_boundary(end) {
            end -= 1;
        }
        out.truncate(end);
        out.push('…');
    }
}

/// A value as MongoDB's `Value`/`Document` `operator<<` prints it in the
/// messages of the aggregation layer (`Input document: {_id: 1, a: [1, 2],
/// s: "x"}`): no spaces inside braces or brackets, field names unquoted,
/// strings in double quotes; other scalars as [`render_shell`]. Cut at
/// 1,000 bytes with `…`, as `render_shell`.
pub fn render_value(v: &Bson) -> String {
    let mut out = String::new();
    value_into(v, &mut out, 0);
    cut_rendered(&mut out);
    out
}

fn value_into(v: &Bson, out: &mut String, depth: usize) {
    use std::fmt::Write;
    if out.len() > 1000 || depth > 200 {
        return;
    }
    match v {
        Bson::Document(d) => {
            out.push('{');
            for (i, (k, x)) in d.iter().enumerate() {
                if i > 0 {
                    out.push_str(", ");
                }
                out.push_str(k);
                out.push_str(": ");
                value_into(x, out, depth + 1);
            }
            out.push('}');
        }
        Bson::Array(a) => {
            out.push('[');
            for (i, x) in a.iter().enumerate() {
                if i > 0 {
                    out.push_str(", ");
                }
                value_into(x, out, depth + 1);
            }
            out.push(']');
        }
        Bson::Double(f) => {
            let _ = write!(out, "{f}");
        }
        other => out.push_str(&render_shell(other)),
    }
}

/// `render_shell` of a whole document.
pub(crate) fn render_shell_doc(d: &bson::Document) -> String {
    let mut out = String::new();
    shell_doc_into(d, &mut out, 0);
    out
}

/// Past this depth (or 2,000 bytes) the rest of a value is elided; bounds the
/// recursion on hostile input.
const SHELL_MAX_DEPTH: usize = 32;

fn shell_doc_into(d: &bson::Document, out: &mut String, depth: usize) {
    if d.is_empty() {
        out.push_str("{}");
        return;
    }
    out.push_str("{ ");
    for (i, (k, v)) in d.iter().enumerate() {
        if i > 0 {
            out.push_str(", ");
        }
        if out.len() > 2000 || depth > SHELL_MAX_DEPTH {
            out.push_str("...");
            break;
        }
        out.push_str(k);
        out.push_str(": ");
        shell_into(v, out, depth + 1);
    }
    out.push_str(" }");
}

fn shell_into(v: &Bson, out: &mut String, depth: usize) {
    use std::fmt::Write;
    match v {
        Bson::Double(f) => {
            if f.is_nan() {
                out.push_str("nan.0");
            } else if f.is_infinite() {
                out.push_str(if *f > 0.0 { "inf.0" } else { "-inf.0" });
            } else if f.fract() == 0.0 && f.abs() < 1e16 {
                let _ = write!(out, "{f:.1}");
            } else {
                let _ = write!(out, "{f}");
            }
        }
        Bson::String(s) => {
            out.push('"');
            out.push_str(s);
            out.push('"');
        }
        Bson::Document(d) => shell_doc_into(d, out, depth),
        Bson::Array(a) => {
            if a.is_empty() {
                out.push_str("[]");
                return;
            }
            out.push_str("[ ");
            for (i, x) in a.iter().enumerate() {
                if i > 0 {
                    out.push_str(", ");
                }
                if out.len() > 2000 || depth > SHELL_MAX_DEPTH {
                    out.push_str("...");
                    break;
                }
                shell_into(x, out, depth + 1);
            }
            out.push_str(" ]");
        }
        Bson::Boolean(b) => out.push_str(if *b { "true" } else { "false" }),
        Bson::Null => out.push_str("null"),
        Bson::Undefined => out.push_str("undefined"),
        Bson::Int32(i) => {
            let _ = write!(out, "{i}");
        }
        Bson::Int64(i) => {
            let _ = write!(out, "{i}");
        }
        Bson::ObjectId(o) => {
            let _ = write!(out, "ObjectId('{o}')");
        }
        Bson::DateTime(d) => {
            let _ = write!(out, "new Date({})", d.timestamp_millis());
        }
        Bson::Timestamp(t) => {
            let _ = write!(out, "Timestamp({}, {})", t.time, t.increment);
        }
        Bson::Decimal128(d) => {
            let _ = write!(out, "NumberDecimal(\"{d}\")");
        }
        Bson::RegularExpression(r) => {
            let _ = write!(out, "/{}/{}", r.pattern, r.options);
        }
        Bson::MinKey => out.push_str("MinKey"),
        Bson::MaxKey => out.push_str("MaxKey"),
        other => out.push_str(&other.to_string()),
    }
}

/// Per-document errors of an `insert_many` (MongoDB's `writeErrors`).
#[derive(Debug, Clone)]
pub struct BulkWriteFailure {
    /// `(index in the input, error)` for each failed document.
    pub errors: Vec<(usize, Error)>,
    /// How many documents were inserted.
    pub inserted: usize,
}
