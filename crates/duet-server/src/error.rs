//! Command errors in MongoDB's reply shape: `{ok: 0, errmsg, code, codeName}`
//! plus any extra fields (`keyPattern`/`keyValue` for duplicate keys).
//!
//! Every engine error maps through `duetdb::Error::code()/code_name()`, so the
//! wire answer uses exactly the engine's MongoDB code, and keeps the engine's
//! `errorLabels` (`TransientTransactionError` on a write conflict); the
//! session layer adds the transaction labels drivers retry on.

use bson::{doc, Document};

/// A failed command.
#[derive(Debug, Clone)]
pub struct CommandError {
    pub code: i32,
    pub code_name: &'static str,
    pub message: String,
    /// Extra fields merged into the error reply or write error.
    pub extra: Option<Box<Document>>,
    /// `errorLabels` of the reply (`TransientTransactionError`,
    /// `UnknownTransactionCommitResult`), no duplicates.
    pub labels: Vec<&'static str>,
}

pub type CmdResult<T = Document> = Result<T, CommandError>;

impl CommandError {
    pub fn new(code: i32, code_name: &'static str, message: impl Into<String>) -> CommandError {
        CommandError {
            code,
            code_name,
            message: message.into(),
            extra: None,
            labels: Vec::new(),
        }
    }

    /// The same error carrying `label` in its `errorLabels`.
    pub fn with_label(mut self, label: &'static str) -> CommandError {
        if !self.labels.contains(&label) {
            self.labels.push(label);
        }
        self
    }
    /// The same error with MongoDB's context for errors raised while a
    /// plan executes (`Executor error during find command :: caused by ::
    /// …`): code, labels and details unchanged.
    pub fn caused_by(mut self, context: &str) -> CommandError {
        self.message = format!("{context} :: caused by :: {}", self.message);
        self
    }

    pub fn bad_value(m: impl Into<String>) -> CommandError {
        CommandError::new(2, "BadValue", m)
    }
    pub fn type_mismatch(m: impl Into<String>) -> CommandError {
        CommandError::new(14, "TypeMismatch", m)
    }
    pub fn not_supported(m: impl Into<String>) -> CommandError {
        CommandError::new(115, "CommandNotSupported", m)
    }
    pub fn ns_not_found(m: impl Into<String>) -> CommandError {
        CommandError::new(26, "NamespaceNotFound", m)
    }
    pub fn cursor_not_found(id: i64) -> CommandError {
        CommandError::new(43, "CursorNotFound", format!("cursor id {id} not found"))
    }
    pub fn max_time_expired() -> CommandError {
        CommandError::new(50, "MaxTimeMSExpired", "operation exceeded time limit")
    }
    pub fn internal(m: impl Into<String>) -> CommandError {
        CommandError::new(1, "InternalError", m)
    }

    /// The `{ok: 0, ...}` reply.
    pub fn to_reply(&self) -> Document {
        let mut d = doc! {
            "ok": 0.0,
            "errmsg": self.message.clone(),
            "code": self.code,
            "codeName": self.code_name,
        };
        for (k, v) in self.extra.iter().flat_map(|e| e.iter()) {
            d.insert(k.clone(), v.clone());
        }
        if !self.labels.is_empty() {
            d.insert("errorLabels", self.labels.clone());
        }
        d
    }

    /// A `writeErrors` entry at input position `index`.
    pub fn to_write_error(&self, index: usize) -> Document {
        let mut d = doc! {
            "index": index as i32,
            "code": self.code,
            "codeName": self.code_name,
            "errmsg": self.message.clone(),
        };
        for (k, v) in self.extra.iter().flat_map(|e| e.iter()) {
            d.insert(k.clone(), v.clone());
        }
        d
    }
}

impl From<duetdb::Error> for CommandError {
    fn from(e: duetdb::Error) -> CommandError {
        let mut out = CommandError::new(e.code(), e.code_name(), e.to_string());
        out.labels = e.error_labels().to_vec();
        if let duetdb::Error::DuplicateKey(dk) = &e {
            out.extra = Some(Box::new(doc! {
                "keyPattern": dk.key_pattern.clone(),
                "keyValue": dk.key_value.clone(),
            }));
        }
        if let duetdb::Error::DocumentValidationFailure(info) = &e {
            out.extra = Some(Box::new(doc! {"errInfo": (**info).clone()}));
        }
        out
    }
}

impl From<crate::opmsg::MsgError> for CommandError {
    fn from(e: crate::opmsg::MsgError) -> CommandError {
        CommandError::new(e.code, e.code_name, e.message)
    }
}
