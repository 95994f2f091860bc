//! Writing a pipeline's `$out` / `$merge` output: all of it as ONE writer
//! command (a boundary step that applies a transaction-style write set
//! through `txn::apply_commit`), so readers see the target's old contents
//! or its new ones, never a part; a failure (a duplicate key, a `$merge`
//! `fail` mode, a changed `_id`) changes nothing.
//!
//! `$out` replaces every document of the target (its indexes stay; a
//! missing target is created); `$merge` decides each output document
//! against the target *as it is at that commit boundary* (not as of the
//! pipeline's snapshot: nothing a concurrent writer committed in between is
//! lost), earlier outputs of the same `$merge` included.
//!
//! Limits: the whole output is applied in one writer step (it holds the
//! writer while it runs, like a large update) and logged as one WAL record
//! (over 1 GiB: 257 TransactionTooLarge). A target in another database
//! (`{db, coll}`) is written by that database's writer: the caller opens
//! it ([`output_database`]); one that is not passed in is refused (115).

use std::collections::BTreeMap;
use std::sync::Arc;

use bson::{Bson, Document, RawBson};

use crate::api::{validate_collection_name, Database};
use crate::doc::{self, DocRef};
use crate::error::{DuplicateKey, Error, Result};
use crate::query::aggregate::{merged_version, MergeSpec, Output};
use crate::store::index::ValueKey;
use crate::store::DbState;
use crate::txn::{apply_commit, Isolation, Pending, PlantedBug, TxnCommit, WriteSet};

/// The database a pipeline's final `$out`/`$merge` names (`{db, coll}`),
/// when it names one: the caller opens it and passes it to
/// [`crate::Collection::aggregate_into`]. A malformed stage says `None`;
/// the pipeline's own parse reports it.
pub fn output_database(pipeline: &[Document]) -> Option<String> {
    let last = pipeline.last()?;
    let target = match (last.get("$out"), last.get("$merge")) {
        (Some(Bson::Document(d)), _) => d,
        (_, Some(Bson::Document(m))) => match m.get("into") {
            Some(Bson::Document(d)) => d,
            _ => return None,
        },
        _ => return None,
    };
    target.get_str("db").ok().map(str::to_string)
}

impl Database {
    /// Write `docs` as `out` says (see the module doc).
    pub(crate) fn write_output(&self, out: &Output, docs: Vec<Document>) -> Result<()> {
        let (db, coll) = out.target();
        if let Some(db) = db.filter(|d| *d != self.name()) {
            return Err(Error::Coded {
                code: 115,
                name: "CommandNotSupported",
                msg: format!(
                    "{} into another database ('{db}') is not supported by duetdb: the target must be in '{}'",
                    out.stage_name(),
                    self.name()
                ),
            });
        }
        validate_collection_name(coll)?;
        match out {
            Output::Out { .. } => self.write_out(coll, docs),
            Output::Merge(spec) => self.write_merge(spec, docs),
        }
    }

    fn write_out(&self, coll: &str, docs: Vec<Document>) -> Result<()> {
        let mut new: Vec<(DocRef, RawBson)> = Vec::with_capacity(docs.len());
        for d in docs {
            let (raw, id) = doc::prepare_insert(&d)?;
            new.push((Arc::new(raw), id));
        }
        if new.is_empty() && self.writer().published().collection(coll).is_none() {
            match self.create_collection(coll) {
                Ok(()) | Err(Error::NamespaceExists(_)) => {}
                Err(e) => return Err(e),
            }
        }
        let snapshot = self.writer().published();
        let coll = coll.to_string();
        self.writer().at_boundary(move |state, fx| {
            let mut w: BTreeMap<ValueKey, Pending> = BTreeMap::new();
            let mut seq = 0;
            if let Some(c) = state.collection(&coll) {
                for (_, d) in c.heap.iter() {
                    let Some(id) = doc::id_of(d) else { continue };
                    w.insert(
                        ValueKey::from(id),
                        Pending {
                            base: Some(d.clone()),
                            new: None,
                            seq,
                        },
                    );
                    seq += 1;
                }
            }
            for (raw, id) in new {
                let key = ValueKey::from(id);
                match w.get_mut(&key) {
                    Some(p) if p.new.is_some() => return Err(dup_id(state, &coll, &key)),
                    Some(p) => p.new = Some(raw),
                    None => {
                        w.insert(
                            key,
                            Pending {
                                base: None,
                                new: Some(raw),
                                seq,
                            },
                        );
                        seq += 1;
                    }
                }
            }
            commit(state, fx, snapshot, coll, w)
        })?;
        Ok(())
    }

    fn write_merge(&self, spec: &MergeSpec, docs: Vec<Document>) -> Result<()> {
        let spec = spec.clone();
        let snapshot = self.writer().published();
        self.writer().at_boundary(move |state, fx| {
            let coll = spec.coll.clone();
            let ns = format!("{}.{}", state.db, coll);
            spec.check_on_index(state.collection(&coll))?;
            let mut w: BTreeMap<ValueKey, Pending> = BTreeMap::new();
            // Outputs written so far by their `on` values: a later output
            // with the same values matches what the earlier one wrote.
            let mut by_on: BTreeMap<OnKey, ValueKey> = BTreeMap::new();
            for (seq, mut new) in docs.into_iter().enumerate() {
                if spec.on == ["_id"] && !new.contains_key("_id") {
                    let mut d = Document::new();
                    d.insert("_id", bson::oid::ObjectId::new());
                    d.extend(new);
                    new = d;
                }
                let values = spec.on_values(&new)?;
                let on_key = OnKey(values.iter().map(|(_, v)| v.clone()).collect());
                let existing: Option<Document> = match by_on.get(&on_key) {
                    Some(k) => match w.get(k).and_then(|p| p.new.as_ref()) {
                        Some(d) => Some(doc::to_document(d)?),
                        None => None,
                    },
                    None => match state.collection(&coll) {
                        Some(c) => match spec.target_of(c, &values)? {
                            Some((_, d)) => Some(doc::to_document(&d)?),
                            None => None,
                        },
                        None => None,
                    },
                };
                let matched = existing.is_some();
                let Some(out) = merged_version(&spec, &ns, existing.as_ref(), new)? else {
                    continue;
                };
                let (raw, id) = doc::prepare_insert(&out)?;
                let key = ValueKey::from(id);
                let latest = latest_version(state, &coll, &key);
                if !matched && (latest.is_some() || w.get(&key).is_some_and(|p| p.new.is_some())) {
                    // An insert whose `_id` another target document holds.
                    return Err(dup_id(state, &coll, &key));
                }
                match w.get_mut(&key) {
                    Some(p) => p.new = Some(Arc::new(raw)),
                    None => {
                        w.insert(
                            key.clone(),
                            Pending {
                                base: latest,
                                new: Some(Arc::new(raw)),
                                seq,
                            },
                        );
                    }
                }
                by_on.insert(on_key, key);
            }
            commit(state, fx, snapshot, coll, w)
        })?;
        Ok(())
    }
}

/// Apply the write set of one target through the transaction commit path
/// (validated against the same state it was computed from: it cannot
/// conflict; unique indexes are checked there).
fn commit(
    state: &mut DbState,
    fx: &mut crate::durability::effect::Effects,
    snapshot: Arc<DbState>,
    coll: String,
    w: BTreeMap<ValueKey, Pending>,
) -> Result<()> {
    let mut writes: WriteSet = BTreeMap::new();
    writes.insert(coll, w);
    let commit = TxnCommit {
        snapshot,
        isolation: Isolation::Snapshot,
        writes,
        point_reads: Vec::new(),
        predicate_reads: Vec::new(),
        collection_reads: Vec::new(),
        planted_bug: PlantedBug::None,
        origin: None,
    };
    apply_commit(state, fx, commit).map(|_| ())
}

fn latest_version(state: &DbState, coll: &str, key: &ValueKey) -> Option<DocRef> {
    let c = state.collection(coll)?;
    c.get(c.rid_of_key(key)?).cloned()
}

fn dup_id(state: &DbState, coll: &str, key: &ValueKey) -> Error {
    let id = Bson::try_from(key.to_raw()).unwrap_or(Bson::Null);
    Error::DuplicateKey(Box::new(DuplicateKey {
        ns: format!("{}.{coll}", state.db),
        index: "_id_".into(),
        key_pattern: bson::doc! {"_id": 1},
        key_value: bson::doc! {"_id": id.clone()},
        key: format!("{{ _id: {} }}", crate::error::render(&id)),
    }))
}

/// The values of a `$merge`'s `on` fields, ordered by the BSON order.
#[derive(Debug, Clone)]
struct OnKey(Vec<Bson>);

impl PartialEq for OnKey {
    fn eq(&self, o: &Self) -> bool {
        self.cmp(o) == std::cmp::Ordering::Equal
    }
}
impl Eq for OnKey {}
impl PartialOrd for OnKey {
    fn partial_cmp(&self, o: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(o))
    }
}
impl Ord for OnKey {
    fn cmp(&self, o: &Self) -> std::cmp::Ordering {
        for (a, b) in self.0.iter().zip(&o.0) {
            let c = crate::query::expr::compare(a, b);
            if c != std::cmp::Ordering::Equal {
                return c;
            }
        }
        self.0.len().cmp(&o.0.len())
    }
}
