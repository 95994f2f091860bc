//! Effects: the physical changes a committed command made, which is what the
//! WAL stores and recovery replays.
//!
//! Recovery never re-runs filters or updates: an update's effect is the new
//! version of each document it changed (`Put`), a delete's effect is the `_id`s
//! it removed. Replay is therefore deterministic even for `$currentDate`,
//! generated `_id`s, or a planner that would pick documents in another order.
//!
//! Recording: the writer creates an [`Effects`] log per group and passes it
//! explicitly to every command; a command records each change it keeps. A
//! command that fails has its effects cut off again ([`Effects::mark`] /
//! [`Effects::truncate`]), matching the command contract (a failed command
//! changes nothing). Without a WAL the log is disabled and does not even build
//! the effect.
//!
//! Change streams read the same log, so an effect also says what kind of
//! change it was (`Insert`, `Update` with its update description, `Replace`,
//! and transaction boundaries); replay treats every put kind alike and
//! ignores the boundaries. `Put` is what version-1 records hold (kind
//! unknown).
//!
//! Invariants:
//! - the effects of a group, replayed in order on the state the group started
//!   from, yield exactly the state the group published;
//! - `Put` replaces the document with the same `_id` or inserts it; `Delete`
//!   requires the `_id` to exist (replay reports corruption otherwise).

use std::sync::Arc;

use bson::raw::RawDocumentBuf;
use bson::{Bson, Document, RawBson};

use crate::doc::{self, DocRef};
use crate::store::collection::CollectionState;
use crate::store::index::IndexSpec;
use crate::store::options::CollectionOptions;
use crate::store::DbState;

/// One physical change.
#[derive(Debug, Clone)]
pub enum Effect {
    /// Insert the document, or replace the one with its `_id`; creates the
    /// collection when missing.
    Put {
        coll: String,
        doc: DocRef,
    },
    /// `pre`: the deleted version, recorded only for collections with
    /// `changeStreamPreAndPostImages` (change streams' pre-image).
    Delete {
        coll: String,
        id: RawBson,
        pre: Option<DocRef>,
    },
    CreateCollection {
        name: String,
    },
    DropCollection {
        name: String,
    },
    /// Rename, replacing an existing `to` (the command checked it was allowed).
    Rename {
        from: String,
        to: String,
    },
    /// Creates the collection when missing.
    CreateIndex {
        coll: String,
        spec: IndexSpec,
    },
    DropIndex {
        coll: String,
        name: String,
    },
    /// A put that inserted a new document (replays as `Put`).
    Insert {
        coll: String,
        doc: DocRef,
    },
    /// A put that replaced a document with a whole new one (replays as `Put`).
    Replace {
        coll: String,
        doc: DocRef,
        pre: Option<DocRef>,
    },
    /// A put made by update operators (replays as `Put`); `desc` is the
    /// change in MongoDB's `updateDescription` shape, computed by the writer
    /// from the old and new versions (`changes::diff`). `pre` (as for
    /// `Replace`): the old version, kept only when the collection records
    /// pre-images.
    Update {
        coll: String,
        doc: DocRef,
        desc: Arc<RawDocumentBuf>,
        pre: Option<DocRef>,
    },
    /// The collection's options are now `options` (`create` with options,
    /// `collMod`); the collection exists.
    SetOptions {
        coll: String,
        options: CollectionOptions,
    },
    /// The effects up to the next `TxnEnd` are one transaction's; `origin` is
    /// the opaque metadata its client gave (the server's `lsid`/`txnNumber`).
    /// Replay ignores it.
    TxnBegin {
        origin: Arc<RawDocumentBuf>,
    },
    TxnEnd,
}

impl Effect {
    /// The version a change replaced or deleted, when it was recorded.
    pub fn pre_image(&self) -> Option<&DocRef> {
        match self {
            Effect::Update { pre, .. }
            | Effect::Replace { pre, .. }
            | Effect::Delete { pre, .. } => pre.as_ref(),
            _ => None,
        }
    }

    /// The collection and new version of any put kind.
    pub fn as_put(&self) -> Option<(&str, &DocRef)> {
        match self {
            Effect::Put { coll, doc }
            | Effect::Insert { coll, doc }
            | Effect::Replace { coll, doc, .. }
            | Effect::Update { coll, doc, .. } => Some((coll, doc)),
            _ => None,
        }
    }
}

/// The effects of one writer group, passed explicitly to every command that
/// changes state (no hidden thread-local): the writer creates it per group,
/// cuts it back when a command fails, and hands it to the WAL.
///
/// Invariant: after a group, it holds exactly the effects of the commands that
/// succeeded, in commit order, so replaying it yields the published state.
#[derive(Debug, Default)]
pub struct Effects {
    /// `false` when nobody will read the effects (no WAL): recording is skipped.
    enabled: bool,
    list: Vec<Effect>,
}

impl Effects {
    /// A log that records (`enabled`) or ignores every effect.
    pub fn new(enabled: bool) -> Effects {
        Effects {
            enabled,
            list: Vec::new(),
        }
    }

    /// Position to cut back to if the next command fails.
    pub fn mark(&self) -> usize {
        self.list.len()
    }

    /// Forget effects recorded after `mark` (the command that made them failed).
    pub fn truncate(&mut self, mark: usize) {
        self.list.truncate(mark);
    }

    /// The recorded effects, in order.
    pub fn into_vec(self) -> Vec<Effect> {
        self.list
    }

    /// Reorder the effects recorded since `mark` by `keys` (one per effect,
    /// stable for equal keys). Does nothing when not recording or when the
    /// counts differ (the caller's bookkeeping is then not about this log).
    pub fn order_since(&mut self, mark: usize, keys: &[usize]) {
        let n = self.list.len().saturating_sub(mark);
        if !self.enabled || n == 0 || n != keys.len() || keys.windows(2).all(|w| w[0] <= w[1]) {
            return;
        }
        let tail = self.list.split_off(mark);
        let mut keyed: Vec<(usize, Effect)> = keys.iter().copied().zip(tail).collect();
        keyed.sort_by_key(|(k, _)| *k);
        self.list.extend(keyed.into_iter().map(|(_, e)| e));
    }

    /// Record an effect; `make` runs only when recording.
    pub fn record(&mut self, make: impl FnOnce() -> Effect) {
        if self.enabled {
            self.list.push(make());
        }
    }

    /// Record the insert of `doc` into `coll`.
    pub fn insert(&mut self, coll: &str, doc: &DocRef) {
        self.record(|| Effect::Insert {
            coll: coll.to_string(),
            doc: doc.clone(),
        });
    }

    /// Record that `new` replaced `old` in `coll`: by update operators
    /// (`operators`, with the update description computed here) or as a
    /// whole replacement; `old` is kept as the pre-image when `pre_images`
    /// (the collection's `changeStreamPreAndPostImages`).
    pub fn replace(
        &mut self,
        coll: &str,
        old: &DocRef,
        new: &DocRef,
        operators: bool,
        pre_images: bool,
    ) {
        self.record(|| {
            let pre = pre_images.then(|| old.clone());
            if operators {
                Effect::Update {
                    coll: coll.to_string(),
                    doc: new.clone(),
                    desc: Arc::new(crate::durability::changes::diff::update_description(
                        old, new,
                    )),
                    pre,
                }
            } else {
                Effect::Replace {
                    coll: coll.to_string(),
                    doc: new.clone(),
                    pre,
                }
            }
        });
    }

    /// Record the delete of `doc` (by its `_id`) from `coll`, keeping `doc`
    /// as the pre-image when `pre_images`.
    pub fn delete(&mut self, coll: &str, doc: &DocRef, pre_images: bool) {
        self.record(|| Effect::Delete {
            coll: coll.to_string(),
            id: doc::id_of(doc).map_or(RawBson::Null, Into::into),
            pre: pre_images.then(|| doc.clone()),
        });
    }
}

// ------------------------------------------------------------------ encoding

const T_PUT: u8 = 1;
const T_DELETE: u8 = 2;
const T_CREATE_COLL: u8 = 3;
const T_DROP_COLL: u8 = 4;
const T_RENAME: u8 = 5;
const T_CREATE_INDEX: u8 = 6;
const T_DROP_INDEX: u8 = 7;
// Version 2 (change streams): put kinds and transaction boundaries.
const T_INSERT: u8 = 8;
const T_REPLACE: u8 = 9;
const T_UPDATE: u8 = 10;
const T_TXN_BEGIN: u8 = 11;
const T_TXN_END: u8 = 12;
// Pre-images (collections with `changeStreamPreAndPostImages`) and
// collection options. Records without them decode as before.
const T_SET_OPTIONS: u8 = 13;
const T_UPDATE_PRE: u8 = 14;
const T_REPLACE_PRE: u8 = 15;
const T_DELETE_PRE: u8 = 16;

/// A decoding failure: what was wrong (the caller adds file and offset).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DecodeError(pub String);

pub fn put_str(out: &mut Vec<u8>, s: &str) {
    // Names are at most 255 bytes (collection) or a few KB (index names).
    out.extend_from_slice(&(s.len() as u32).to_le_bytes());
    out.extend_from_slice(s.as_bytes());
}

/// A cursor over bytes that fails instead of panicking on short input.
pub struct Reader<'a> {
    pub buf: &'a [u8],
    pub pos: usize,
}

impl<'a> Reader<'a> {
    pub fn new(buf: &'a [u8]) -> Reader<'a> {
        Reader { buf, pos: 0 }
    }
    pub fn bytes(&mut self, n: usize) -> Result<&'a [u8], DecodeError> {
        let end = self
            .pos
            .checked_add(n)
            .filter(|e| *e <= self.buf.len())
            .ok_or_else(|| DecodeError(format!("truncated at byte {}", self.pos)))?;
        let s = &self.buf[self.pos..end];
        self.pos = end;
        Ok(s)
    }
    pub fn u8(&mut self) -> Result<u8, DecodeError> {
        Ok(self.bytes(1)?[0])
    }
    pub fn u32(&mut self) -> Result<u32, DecodeError> {
        let b = self.bytes(4)?;
        Ok(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    }
    pub fn u64(&mut self) -> Result<u64, DecodeError> {
        let b = self.bytes(8)?;
        let mut a = [0u8; 8];
        a.copy_from_slice(b);
        Ok(u64::from_le_bytes(a))
    }
    pub fn str(&mut self) -> Result<String, DecodeError> {
        let n = self.u32()? as usize;
        let b = self.bytes(n)?;
        String::from_utf8(b.to_vec()).map_err(|_| DecodeError("name is not UTF-8".into()))
    }
    /// One BSON document (its length prefix says how long), validated.
    pub fn doc(&mut self) -> Result<RawDocumentBuf, DecodeError> {
        let start = self.pos;
        let len = self.u32()? as usize;
        self.pos = start;
        if len < 5 {
            return Err(DecodeError(format!("bad document length {len}")));
        }
        let b = self.bytes(len)?;
        let raw = RawDocumentBuf::from_bytes(b.to_vec())
            .map_err(|e| DecodeError(format!("bad document: {e}")))?;
        doc::validate_raw(&raw).map_err(|e| DecodeError(format!("bad document: {e}")))?;
        Ok(raw)
    }
    pub fn done(&self) -> bool {
        self.pos == self.buf.len()
    }
}

/// Encode an index spec as a BSON document: the form `listIndexes`
/// reports (`IndexSpec::to_document`), which `read_spec` parses back.
pub fn put_spec(out: &mut Vec<u8>, spec: &IndexSpec) {
    put_document(out, &spec.to_document());
}

fn put_document(out: &mut Vec<u8>, d: &Document) {
    // Serialising a Document built from valid parts cannot fail; an empty
    // document keeps the frame well formed if it ever did (decode then fails).
    match RawDocumentBuf::try_from(d) {
        Ok(b) => out.extend_from_slice(b.as_bytes()),
        Err(_) => out.extend_from_slice(&[5, 0, 0, 0, 0]),
    }
}

/// Encode collection options (the `listCollections` form).
pub fn put_options(out: &mut Vec<u8>, options: &CollectionOptions) {
    put_document(out, &options.to_document());
}

/// Decode collection options written by [`put_options`].
pub fn read_options(r: &mut Reader<'_>) -> Result<CollectionOptions, DecodeError> {
    let raw = r.doc()?;
    let d =
        doc::to_document(&raw).map_err(|e| DecodeError(format!("bad collection options: {e}")))?;
    CollectionOptions::from_document(&d)
        .map_err(|e| DecodeError(format!("bad collection options: {e}")))
}

/// Decode an index spec: every version's form (the first stored only
/// `{key, name, unique}`; later ones every option `listIndexes` reports).
pub fn read_spec(r: &mut Reader<'_>) -> Result<IndexSpec, DecodeError> {
    let raw = r.doc()?;
    let d = doc::to_document(&raw).map_err(|e| DecodeError(format!("bad index spec: {e}")))?;
    crate::query::index_spec::parse(&d).map_err(|e| DecodeError(format!("bad index spec: {e}")))
}

/// Append the encoding of `e` to `out`.
pub fn encode(e: &Effect, out: &mut Vec<u8>) {
    match e {
        Effect::Put { coll, doc } => {
            out.push(T_PUT);
            put_str(out, coll);
            out.extend_from_slice(doc.as_bytes());
        }
        Effect::Delete { coll, id, pre } => {
            out.push(if pre.is_some() {
                T_DELETE_PRE
            } else {
                T_DELETE
            });
            put_str(out, coll);
            let mut d = Document::new();
            d.insert("_id", Bson::try_from(id.clone()).unwrap_or(Bson::Null));
            put_document(out, &d);
            if let Some(p) = pre {
                out.extend_from_slice(p.as_bytes());
            }
        }
        Effect::CreateCollection { name } => {
            out.push(T_CREATE_COLL);
            put_str(out, name);
        }
        Effect::DropCollection { name } => {
            out.push(T_DROP_COLL);
            put_str(out, name);
        }
        Effect::Rename { from, to } => {
            out.push(T_RENAME);
            put_str(out, from);
            put_str(out, to);
        }
        Effect::CreateIndex { coll, spec } => {
            out.push(T_CREATE_INDEX);
            put_str(out, coll);
            put_spec(out, spec);
        }
        Effect::DropIndex { coll, name } => {
            out.push(T_DROP_INDEX);
            put_str(out, coll);
            put_str(out, name);
        }
        Effect::Insert { coll, doc } => {
            out.push(T_INSERT);
            put_str(out, coll);
            out.extend_from_slice(doc.as_bytes());
        }
        Effect::Replace { coll, doc, pre } => {
            out.push(if pre.is_some() {
                T_REPLACE_PRE
            } else {
                T_REPLACE
            });
            put_str(out, coll);
            out.extend_from_slice(doc.as_bytes());
            if let Some(p) = pre {
                out.extend_from_slice(p.as_bytes());
            }
        }
        Effect::Update {
            coll,
            doc,
            desc,
            pre,
        } => {
            out.push(if pre.is_some() {
                T_UPDATE_PRE
            } else {
                T_UPDATE
            });
            put_str(out, coll);
            out.extend_from_slice(doc.as_bytes());
            out.extend_from_slice(desc.as_bytes());
            if let Some(p) = pre {
                out.extend_from_slice(p.as_bytes());
            }
        }
        Effect::SetOptions { coll, options } => {
            out.push(T_SET_OPTIONS);
            put_str(out, coll);
            put_options(out, options);
        }
        Effect::TxnBegin { origin } => {
            out.push(T_TXN_BEGIN);
            out.extend_from_slice(origin.as_bytes());
        }
        Effect::TxnEnd => out.push(T_TXN_END),
    }
}

/// Decode one effect.
pub fn decode(r: &mut Reader<'_>) -> Result<Effect, DecodeError> {
    Ok(match r.u8()? {
        T_PUT => Effect::Put {
            coll: r.str()?,
            doc: Arc::new(r.doc()?),
        },
        t @ (T_DELETE | T_DELETE_PRE) => {
            let coll = r.str()?;
            let d = r.doc()?;
            let id = d
                .get("_id")
                .ok()
                .flatten()
                .ok_or_else(|| DecodeError("delete without _id".into()))?
                .into();
            let pre = if t == T_DELETE_PRE {
                Some(Arc::new(r.doc()?))
            } else {
                None
            };
            Effect::Delete { coll, id, pre }
        }
        T_CREATE_COLL => Effect::CreateCollection { name: r.str()? },
        T_DROP_COLL => Effect::DropCollection { name: r.str()? },
        T_RENAME => Effect::Rename {
            from: r.str()?,
            to: r.str()?,
        },
        T_CREATE_INDEX => Effect::CreateIndex {
            coll: r.str()?,
            spec: read_spec(r)?,
        },
        T_DROP_INDEX => Effect::DropIndex {
            coll: r.str()?,
            name: r.str()?,
        },
        T_INSERT => Effect::Insert {
            coll: r.str()?,
            doc: Arc::new(r.doc()?),
        },
        t @ (T_REPLACE | T_REPLACE_PRE) => Effect::Replace {
            coll: r.str()?,
            doc: Arc::new(r.doc()?),
            pre: if t == T_REPLACE_PRE {
                Some(Arc::new(r.doc()?))
            } else {
                None
            },
        },
        t @ (T_UPDATE | T_UPDATE_PRE) => Effect::Update {
            coll: r.str()?,
            doc: Arc::new(r.doc()?),
            desc: Arc::new(r.doc()?),
            pre: if t == T_UPDATE_PRE {
                Some(Arc::new(r.doc()?))
            } else {
                None
            },
        },
        T_SET_OPTIONS => Effect::SetOptions {
            coll: r.str()?,
            options: read_options(r)?,
        },
        T_TXN_BEGIN => Effect::TxnBegin {
            origin: Arc::new(r.doc()?),
        },
        T_TXN_END => Effect::TxnEnd,
        t => return Err(DecodeError(format!("unknown effect tag {t}"))),
    })
}

// -------------------------------------------------------------------- replay

fn ensure<'a>(state: &'a mut DbState, name: &str) -> &'a mut CollectionState {
    let ns = format!("{}.{name}", state.db);
    let options = state.vls_options;
    let delta = state.delta.on;
    let c = Arc::make_mut(&mut state.collections)
        .entry(name.to_string())
        .or_insert_with(|| CollectionState::new(&ns, options));
    c.delta_indexing = delta;
    c
}

/// Apply one record's effects in order (recovery). A transaction's block
/// (`TxnBegin` .. `TxnEnd`) holds its writes in statement order, not in the
/// order the commit applied them (deletes, replacements, inserts), so one
/// write may depend on a later one for a unique key (an insert taking the key
/// a later-listed delete frees). The block is therefore applied as a whole:
/// every touched document is removed first, then every new version is
/// inserted — the commit succeeded, so the final versions fit together.
pub fn apply_all(state: &mut DbState, effects: Vec<Effect>) -> Result<(), String> {
    let mut block: Option<Vec<Effect>> = None;
    for e in effects {
        match (e, &mut block) {
            (Effect::TxnBegin { .. }, b) => {
                if b.is_some() {
                    return Err("a transaction begins inside another".into());
                }
                *b = Some(Vec::new());
            }
            (Effect::TxnEnd, b) => {
                let list = b.take().ok_or("a transaction ends that never began")?;
                apply_txn_block(state, list)?;
            }
            (e, Some(list)) => list.push(e),
            (e, None) => apply(state, e)?,
        }
    }
    match block {
        // A record is a whole group: an unterminated block is a bad record.
        Some(_) => Err("a transaction never ends in its record".into()),
        None => Ok(()),
    }
}

fn apply_txn_block(state: &mut DbState, list: Vec<Effect>) -> Result<(), String> {
    let mut puts: Vec<(String, DocRef, RawBson)> = Vec::new();
    for e in list {
        match e {
            Effect::Delete { .. } => apply(state, e)?,
            Effect::Put { coll, doc }
            | Effect::Insert { coll, doc }
            | Effect::Replace { coll, doc, .. }
            | Effect::Update { coll, doc, .. } => {
                let id: RawBson = doc::id_of(&doc)
                    .ok_or("put of a document without _id")?
                    .into();
                let c = ensure(state, &coll);
                if let Some(rid) = c.rid_of_id(&id) {
                    c.delete(rid).map_err(|e| e.to_string())?;
                }
                puts.push((coll, doc, id));
            }
            other => apply(state, other)?,
        }
    }
    for (coll, doc, id) in puts {
        ensure(state, &coll)
            .insert(doc, id)
            .map_err(|e| e.to_string())?;
    }
    Ok(())
}

/// Apply one effect to `state` (recovery). An effect that does not fit the
/// state (a delete of a missing `_id`, a failing index build) means the log
/// does not belong to this state: it is reported, never papered over.
pub fn apply(state: &mut DbState, e: Effect) -> Result<(), String> {
    match e {
        Effect::Put { coll, doc }
        | Effect::Insert { coll, doc }
        | Effect::Replace { coll, doc, .. }
        | Effect::Update { coll, doc, .. } => {
            let id: RawBson = doc::id_of(&doc)
                .ok_or("put of a document without _id")?
                .into();
            let c = ensure(state, &coll);
            match c.rid_of_id(&id) {
                Some(rid) => c.replace(rid, doc).map_err(|e| e.to_string())?,
                None => {
                    c.insert(doc, id).map_err(|e| e.to_string())?;
                    // As the writer did after this insert (not logged).
                    c.trim_capped().map_err(|e| e.to_string())?;
                }
            }
        }
        Effect::Delete { coll, id, .. } => {
            let c = state
                .collection_mut(&coll)
                .ok_or_else(|| format!("delete in missing collection {coll}"))?;
            let rid = c
                .rid_of_id(&id)
                .ok_or_else(|| format!("delete of a missing _id in {coll}"))?;
            c.delete(rid).map_err(|e| e.to_string())?;
        }
        Effect::CreateCollection { name } => {
            ensure(state, &name);
        }
        Effect::SetOptions { coll, options } => {
            state
                .collection_mut(&coll)
                .ok_or_else(|| format!("options of missing collection {coll}"))?
                .options = options;
        }
        Effect::DropCollection { name } => {
            Arc::make_mut(&mut state.collections).remove(&name);
        }
        Effect::Rename { from, to } => {
            let ns = format!("{}.{to}", state.db);
            let map = Arc::make_mut(&mut state.collections);
            let mut c = map
                .remove(&from)
                .ok_or_else(|| format!("rename of missing collection {from}"))?;
            c.ns = Arc::from(ns.as_str());
            map.insert(to, c);
        }
        Effect::CreateIndex { coll, spec } => {
            ensure(state, &coll)
                .create_index(spec)
                .map_err(|e| e.to_string())?;
        }
        Effect::DropIndex { coll, name } => {
            state
                .collection_mut(&coll)
                .ok_or_else(|| format!("drop index in missing collection {coll}"))?
                .drop_index(&name)
                .map_err(|e| e.to_string())?;
        }
        Effect::TxnBegin { .. } | Effect::TxnEnd => {}
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use bson::rawdoc;

    fn round_trip(e: &Effect) -> Effect {
        let mut out = Vec::new();
        encode(e, &mut out);
        let mut r = Reader::new(&out);
        let back = decode(&mut r).expect("decode");
        assert!(r.done(), "{e:?} left bytes");
        back
    }

    /// Records written before pre-images existed (tags 2, 9, 10 without a
    /// trailing document) still decode, with no pre-image; the new tags
    /// carry it, and replay ignores it.
    #[test]
    fn pre_images_round_trip_and_old_effects_still_decode() {
        let old = Arc::new(rawdoc! {"_id": 1, "v": 1});
        let new = Arc::new(rawdoc! {"_id": 1, "v": 2});
        let desc = Arc::new(rawdoc! {"updatedFields": {"v": 2}});
        for pre in [None, Some(old.clone())] {
            let effects = [
                Effect::Update {
                    coll: "c".into(),
                    doc: new.clone(),
                    desc: desc.clone(),
                    pre: pre.clone(),
                },
                Effect::Replace {
                    coll: "c".into(),
                    doc: new.clone(),
                    pre: pre.clone(),
                },
                Effect::Delete {
                    coll: "c".into(),
                    id: RawBson::Int32(1),
                    pre: pre.clone(),
                },
            ];
            for e in &effects {
                let back = round_trip(e);
                assert_eq!(
                    back.pre_image().map(|d| d.as_bytes().to_vec()),
                    pre.as_ref().map(|d| d.as_bytes().to_vec()),
                    "{e:?}"
                );
            }
        }
        // The pre-image-less encodings are byte for byte what version-2
        // records hold: tag, name, documents.
        let mut plain = Vec::new();
        encode(
            &Effect::Replace {
                coll: "c".into(),
                doc: new.clone(),
                pre: None,
            },
            &mut plain,
        );
        let mut expect = vec![T_REPLACE];
        put_str(&mut expect, "c");
        expect.extend_from_slice(new.as_bytes());
        assert_eq!(plain, expect);
        let opts = Effect::SetOptions {
            coll: "c".into(),
            options: CollectionOptions {
                pre_and_post_images: true,
                ..Default::default()
            },
        };
        match round_trip(&opts) {
            Effect::SetOptions { coll, options } => {
                assert_eq!(coll, "c");
                assert!(options.pre_and_post_images);
            }
            other => panic!("{other:?}"),
        }
    }

    /// `SetOptions` records of builds before validation (options holding
    /// only `changeStreamPreAndPostImages`) decode unchanged, and the
    /// validation options ride in the same record (same tag, same layout).
    #[test]
    fn set_options_records_of_earlier_builds_load() {
        let mut old = vec![T_SET_OPTIONS];
        put_str(&mut old, "c");
        old.extend_from_slice(
            rawdoc! {"changeStreamPreAndPostImages": {"enabled": true}}.as_bytes(),
        );
        let mut r = Reader::new(&old);
        let pre_only = CollectionOptions {
            pre_and_post_images: true,
            ..Default::default()
        };
        match decode(&mut r).expect("decodes") {
            Effect::SetOptions { coll, options } => {
                assert_eq!(coll, "c");
                assert_eq!(options, pre_only);
            }
            other => panic!("{other:?}"),
        }
        let mut again = Vec::new();
        encode(
            &Effect::SetOptions {
                coll: "c".into(),
                options: pre_only,
            },
            &mut again,
        );
        assert_eq!(again, old);
        let full = CollectionOptions {
            pre_and_post_images: false,
            validator: Some(Arc::new(bson::doc! {"$jsonSchema": {"required": ["a"]}})),
            validation_level: Some(crate::store::options::ValidationLevel::Off),
            validation_action: Some(crate::store::options::ValidationAction::Warn),
            ..Default::default()
        };
        match round_trip(&Effect::SetOptions {
            coll: "c".into(),
            options: full.clone(),
        }) {
            Effect::SetOptions { options, .. } => assert_eq!(options, full),
            other => panic!("{other:?}"),
        }
    }

    /// Replaying inserts into a capped collection trims it as the writer
    /// did (the removals are not logged).
    #[test]
    fn replay_trims_capped_collections() {
        let mut state = DbState::default();
        let mut effects = vec![
            Effect::CreateCollection { name: "c".into() },
            Effect::SetOptions {
                coll: "c".into(),
                options: CollectionOptions {
                    capped: true,
                    capped_size: Some(4096),
                    capped_max: Some(2),
                    ..Default::default()
                },
            },
        ];
        for i in 0..5 {
            effects.push(Effect::Insert {
                coll: "c".into(),
                doc: Arc::new(rawdoc! {"_id": i}),
            });
        }
        apply_all(&mut state, effects).expect("replay");
        let c = state.collection("c").expect("c");
        let kept: Vec<i32> = c
            .heap
            .iter()
            .map(|(_, d)| d.get_i32("_id").expect("test value"))
            .collect();
        assert_eq!(kept, [3, 4]);
        c.check_invariants().expect("consistent");
    }

    #[test]
    fn replay_sets_options_and_ignores_pre_images() {
        let mut state = DbState::default();
        apply_all(
            &mut state,
            vec![
                Effect::CreateCollection { name: "c".into() },
                Effect::SetOptions {
                    coll: "c".into(),
                    options: CollectionOptions {
                        pre_and_post_images: true,
                        ..Default::default()
                    },
                },
                Effect::Insert {
                    coll: "c".into(),
                    doc: Arc::new(rawdoc! {"_id": 1}),
                },
                Effect::Delete {
                    coll: "c".into(),
                    id: RawBson::Int32(1),
                    pre: Some(Arc::new(rawdoc! {"_id": 1})),
                },
            ],
        )
        .expect("replay");
        let c = state.collection("c").expect("c");
        assert!(c.options.pre_and_post_images);
        assert!(c.is_empty());
        let mut missing = DbState::default();
        assert!(apply(
            &mut missing,
            Effect::SetOptions {
                coll: "x".into(),
                options: CollectionOptions::default(),
            }
        )
        .is_err());
    }
}
