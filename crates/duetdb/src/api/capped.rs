//! Capped collections beyond their trimming: tailing one (the engine half of
//! tailable cursors) and turning a collection into a capped copy
//! (`convertToCapped`, `cloneCollectionAsCapped`).
//!
//! Tailing: a [`TailPosition`] is the record id of the last document a
//! tailable cursor scanned (record ids grow with each insert, so the heap's
//! order is insertion order) and the collection it read. Each
//! [`Collection::read_tail`] reads the *latest published* state after that
//! record: what any writer published since is seen, in `$natural` order;
//! nothing is held between reads (no snapshot pinned). If the last scanned
//! record is gone from that state (trimmed by an insert, or deleted), the
//! position is lost: CappedPositionLost (136), as MongoDB's collection scan
//! fails to restore. A collection that was dropped, renamed or replaced
//! (its VLS bookkeeping is per incarnation, `store::vls`) ends the tail
//! with CursorNotFound (43), as MongoDB kills cursors of a dropped
//! collection.
//!
//! Conversion: ONE writer step (a boundary step) builds the capped copy —
//! the source's documents inserted in `$natural` order into a collection
//! with the source's options plus `capped`/`size`, trimmed after each
//! insert exactly as inserts trim — and puts it in place (`convertToCapped`)
//! or under a new name (`cloneCollectionAsCapped`). Readers see the old
//! collection or the new one, never a part. Secondary indexes are not
//! copied (MongoDB keeps only `_id`). Logged as the plain effects that
//! rebuild the same state on replay: the drop (conversion only), the
//! creation, the options, and one insert per document kept — a prefix of a
//! set that fits never trims, so replay keeps exactly these.
//!
//! Invariants:
//! - a tail never skips a record: every record after its position in the
//!   state it reads is scanned, and the position moves only over scanned
//!   records;
//! - a conversion either publishes the whole copy or changes nothing.

use std::sync::{Arc, Weak};

use bson::RawBson;

use crate::api::{validate_collection_name, Collection};
use crate::doc::{self, DocRef};
use crate::durability::effect::Effect;
use crate::error::{CancelToken, Error, Result};
use crate::query::Filter;
use crate::store::collection::CollectionState;
use crate::store::heap::RecordId;
use crate::store::index::IndexSpec;
use crate::store::options::{round_capped_size, CollectionOptions};
use crate::store::vls::{CollectionVls, VlsOptions};

/// How many records a tail read scans between two cancellation checks.
const CANCEL_CHECK_EVERY: usize = 1024;

/// Where a tailable cursor on a capped collection stands (see the module
/// doc). Opaque: made by [`Collection::open_tail`], moved by
/// [`Collection::read_tail`].
#[derive(Debug, Clone)]
pub struct TailPosition {
    /// The last record scanned; `None` before the first.
    last: Option<RecordId>,
    /// The collection incarnation read (weak: a position keeps nothing alive).
    incarnation: Weak<CollectionVls>,
}

impl TailPosition {
    /// Whether any record was scanned yet.
    pub fn started(&self) -> bool {
        self.last.is_some()
    }
}

fn not_capped(ns: &str) -> Error {
    Error::Coded {
        code: 2,
        name: "BadValue",
        msg: format!(
            "error processing query: ns={ns} tailable cursor requested on non capped collection"
        ),
    }
}

impl Collection {
    fn ns(&self) -> String {
        format!("{}.{}", self.db.name(), self.name)
    }

    /// Start tailing this collection at its beginning. `None` when it does
    /// not exist or is empty: MongoDB returns no cursor then (a tailable
    /// cursor on an empty capped collection is dead). A collection that is
    /// not capped is BadValue (2), MongoDB's message.
    pub fn open_tail(&self) -> Result<Option<TailPosition>> {
        let state = self.db.writer().published();
        let Some(c) = state.collection(&self.name) else {
            return Ok(None);
        };
        if !c.options.capped {
            return Err(not_capped(&self.ns()));
        }
        Ok((!c.is_empty()).then(|| TailPosition {
            last: None,
            incarnation: Arc::downgrade(&c.vls),
        }))
    }

    /// The documents after `pos` matching `filter` in the latest published
    /// state, in `$natural` order: at most `max_docs`, and no more once
    /// `max_bytes` of documents are taken (at least one). `pos` moves past
    /// every record scanned, matching or not. Errors: CappedPositionLost
    /// (136) when the record at `pos` is gone, CursorNotFound (43) when the
    /// collection is not the one `pos` read, Interrupted once `cancel` is.
    pub fn read_tail(
        &self,
        pos: &mut TailPosition,
        filter: &Filter,
        max_docs: usize,
        max_bytes: usize,
        cancel: &CancelToken,
    ) -> Result<Vec<DocRef>> {
        let state = self.db.writer().published();
        let same = |c: &&CollectionState| {
            pos.incarnation
                .upgrade()
                .is_some_and(|v| Arc::ptr_eq(&v, &c.vls))
        };
        let Some(c) = state.collection(&self.name).filter(same) else {
            return Err(Error::Coded {
                code: 43,
                name: "CursorNotFound",
                msg: format!(
                    "the collection {} this tailable cursor read was dropped, renamed or converted",
                    self.ns()
                ),
            });
        };
        if let Some(last) = pos.last {
            if c.get(last).is_none() {
                return Err(Error::Coded {
                    code: 136,
                    name: "CappedPositionLost",
                    msg: format!(
                        "CollectionScan died due to position in capped collection being deleted. \
                         Last seen record id: RecordId({last})"
                    ),
                });
            }
        }
        let start = pos.last.map_or(0, |l| l.saturating_add(1));
        let mut out = Vec::new();
        let mut bytes = 0usize;
        for (i, (rid, d)) in c.heap.iter_from(start).enumerate() {
            if out.len() >= max_docs || (bytes >= max_bytes && !out.is_empty()) {
                break;
            }
            if i % CANCEL_CHECK_EVERY == CANCEL_CHECK_EVERY - 1 {
                cancel.check()?;
            }
            pos.last = Some(rid);
            if filter.matches(d) {
                bytes += d.as_bytes().len();
                out.push(d.clone());
            }
        }
        Ok(out)
    }

    /// `convertToCapped`: replace this collection by a capped copy of at
    /// most `size` bytes (rounded as `create` rounds it), in one writer
    /// step (see the module doc). NamespaceNotFound (26) when it does not
    /// exist.
    pub fn convert_to_capped(&self, size: u64) -> Result<()> {
        let coll = self.name.clone();
        self.db.writer().at_boundary(move |state, fx| {
            let ns = format!("{}.{coll}", state.db);
            let old = state
                .collection(&coll)
                .ok_or_else(|| Error::NamespaceNotFound(ns.clone()))?;
            let new = capped_copy(old, &ns, size, state.vls_options)?;
            let docs: Vec<DocRef> = new.heap.iter().map(|(_, d)| d.clone()).collect();
            let options = new.options.clone();
            let map = Arc::make_mut(&mut state.collections);
            if let Some(old) = map.insert(coll.clone(), new) {
                old.vls.mark_dropped();
            }
            fx.record(|| Effect::DropCollection { name: coll.clone() });
            log_creation(fx, &coll, options, &docs);
            Ok(())
        })
    }

    /// `cloneCollectionAsCapped`: a capped copy of this collection of at
    /// most `size` bytes under the name `to`, in one writer step; this one
    /// stays as it is. NamespaceNotFound (26) when this one does not exist,
    /// NamespaceExists (48) when `to` does.
    pub fn clone_as_capped(&self, to: &str, size: u64) -> Result<()> {
        validate_collection_name(to)?;
        let (from, to) = (self.name.clone(), to.to_string());
        self.db.writer().at_boundary(move |state, fx| {
            let old = state
                .collection(&from)
                .ok_or_else(|| Error::NamespaceNotFound(format!("{}.{from}", state.db)))?;
            if state.collection(&to).is_some() {
                return Err(Error::NamespaceExists(to));
            }
            let ns = format!("{}.{to}", state.db);
            let new = capped_copy(old, &ns, size, state.vls_options)?;
            let docs: Vec<DocRef> = new.heap.iter().map(|(_, d)| d.clone()).collect();
            let options = new.options.clone();
            Arc::make_mut(&mut state.collections).insert(to.clone(), new);
            log_creation(fx, &to, options, &docs);
            Ok(())
        })
    }
}

/// Log the creation of `coll` with `options` holding `docs` (in order).
fn log_creation(
    fx: &mut crate::durability::effect::Effects,
    coll: &str,
    options: CollectionOptions,
    docs: &[DocRef],
) {
    fx.record(|| Effect::CreateCollection {
        name: coll.to_string(),
    });
    let id_index = options.collation.clone().map(IndexSpec::collated_id);
    fx.record(|| Effect::SetOptions {
        coll: coll.to_string(),
        options,
    });
    // The collated `_id` index comes with the creation (as `capped_copy`
    // builds it), before the documents.
    if let Some(spec) = id_index {
        fx.record(|| Effect::CreateIndex {
            coll: coll.to_string(),
            spec,
        });
    }
    for d in docs {
        fx.insert(coll, d);
    }
}

/// A capped copy of `old` named `ns`: its options plus `capped` and `size`,
/// holding what inserting its documents in `$natural` order into that
/// capped collection keeps (the same trim as every insert), with record ids
/// from 0 as replaying the logged inserts gives them.
fn capped_copy(
    old: &CollectionState,
    ns: &str,
    size: u64,
    vls: VlsOptions,
) -> Result<CollectionState> {
    let mut options = old.options.clone();
    options.capped = true;
    options.capped_size = Some(round_capped_size(size));
    let insert_all = |docs: &mut dyn Iterator<Item = &DocRef>, trim: bool| {
        let mut c = CollectionState::new(ns, vls);
        c.options = options.clone();
        // A collation: the `_id` index takes it (`IndexSpec::collated_id`).
        if let Some(col) = &options.collation {
            c.create_index(IndexSpec::collated_id(col.clone()))?;
        }
        for d in docs {
            let id: RawBson = doc::id_of(d)
                .ok_or_else(|| Error::Internal(format!("a document of {ns} has no _id")))?
                .into();
            c.insert(d.clone(), id)?;
            if trim {
                c.trim_capped()?;
            }
        }
        Ok::<_, Error>(c)
    };
    let kept = insert_all(&mut old.heap.iter().map(|(_, d)| d), true)?;
    insert_all(&mut kept.heap.iter().map(|(_, d)| d), false)
}

#[cfg(test)]
mod tests {
    use bson::{doc, Bson};

    use super::*;
    use crate::api::Database;

    fn capped(db: &Database, name: &str, max: Option<u64>) {
        let options = CollectionOptions {
            capped: true,
            capped_size: Some(4096),
            capped_max: max,
            ..Default::default()
        };
        db.create_collection_with(name, options).expect("create");
    }

    fn ids(docs: &[DocRef]) -> Vec<i32> {
        docs.iter()
            .map(|d| d.get_i32("_id").expect("int _id"))
            .collect()
    }

    #[test]
    fn a_tail_reads_what_is_inserted_after_it_and_loses_a_trimmed_position() {
        let db = Database::in_memory();
        assert!(db.collection("k").open_tail().expect("missing").is_none());
        capped(&db, "k", Some(3));
        let k = db.collection("k");
        assert!(k.open_tail().expect("empty").is_none(), "empty: no cursor");
        k.insert_one(doc! {"_id": 0, "even": true}).expect("insert");
        let mut pos = k.open_tail().expect("tail").expect("not empty");
        let all = Filter::parse(&doc! {}).expect("filter");
        let even = Filter::parse(&doc! {"even": true}).expect("filter");
        let never = CancelToken::never();
        assert_eq!(
            ids(&k
                .read_tail(&mut pos, &all, 10, 1 << 20, &never)
                .expect("read")),
            [0]
        );
        assert!(k
            .read_tail(&mut pos, &all, 10, 1 << 20, &never)
            .expect("dry")
            .is_empty());
        k.insert_one(doc! {"_id": 1}).expect("insert");
        k.insert_one(doc! {"_id": 2, "even": true}).expect("insert");
        // A filter that skips a record still moves past it.
        assert_eq!(
            ids(&k
                .read_tail(&mut pos, &even, 10, 1 << 20, &never)
                .expect("read")),
            [2]
        );
        k.insert_one(doc! {"_id": 3}).expect("insert");
        assert_eq!(
            ids(&k
                .read_tail(&mut pos, &all, 1, 1 << 20, &never)
                .expect("read")),
            [3]
        );
        // Overflow trims the last seen record (max 3): the position is lost.
        for i in 4..8 {
            k.insert_one(doc! {"_id": i}).expect("insert");
        }
        let e = k
            .read_tail(&mut pos, &all, 10, 1 << 20, &never)
            .expect_err("lost");
        assert_eq!(e.code(), 136, "{e}");
        // A tail of a collection dropped and created again is gone.
        let mut pos = k.open_tail().expect("tail").expect("not empty");
        db.drop_collection("k").expect("drop");
        capped(&db, "k", None);
        k.insert_one(doc! {"_id": 1}).expect("insert");
        let e = k
            .read_tail(&mut pos, &all, 10, 1 << 20, &never)
            .expect_err("dropped");
        assert_eq!(e.code(), 43, "{e}");
        // Not capped: BadValue.
        db.collection("plain")
            .insert_one(doc! {"_id": 1})
            .expect("insert");
        let e = db.collection("plain").open_tail().expect_err("not capped");
        assert_eq!(e.code(), 2, "{e}");
    }

    #[test]
    fn converting_keeps_the_newest_documents_that_fit_in_natural_order() {
        let db = Database::in_memory();
        let c = db.collection("c");
        for i in 0..100 {
            c.insert_one(doc! {"_id": i, "pad": "x".repeat(100)})
                .expect("insert");
        }
        c.create_index(doc! {"pad": 1}, Default::default())
            .expect("index");
        c.convert_to_capped(4096).expect("convert");
        let options = c.options().expect("options");
        assert!(options.capped);
        assert_eq!(options.capped_size, Some(4096));
        let docs = c
            .find(doc! {})
            .hint(doc! {"$natural": 1})
            .run()
            .expect("find");
        let got: Vec<i32> = docs.iter().map(|d| d.get_i32("_id").expect("id")).collect();
        assert!(!got.is_empty() && got.len() < 100, "{got:?}");
        let expected: Vec<i32> = (100 - got.len() as i32..100).collect();
        assert_eq!(got, expected, "the newest, in insertion order");
        assert_eq!(c.list_indexes().expect("indexes").len(), 1, "only _id");
        c.check_invariants().expect("consistent");
        // Trimming goes on as for any capped collection.
        c.insert_one(doc! {"_id": 100, "pad": "x".repeat(100)})
            .expect("insert");
        let first = c
            .find(doc! {})
            .hint(doc! {"$natural": 1})
            .run()
            .expect("find");
        assert_eq!(first.len(), got.len());
        assert_eq!(first[0].get("_id"), Some(&Bson::Int32(expected[1])));
        // Missing: 26. Clone: a new capped collection, the source unchanged.
        assert_eq!(
            db.collection("none")
                .convert_to_capped(4096)
                .expect_err("missing")
                .code(),
            26
        );
        c.clone_as_capped("copy", 1).expect("clone");
        assert_eq!(
            db.collection("copy").count(doc! {}).expect("count"),
            got.len() as u64
        );
        assert_eq!(c.clone_as_capped("copy", 1).expect_err("exists").code(), 48);
        assert!(db
            .collection("copy")
            .options()
            .expect("o")
            .capped_max
            .is_none());
    }
}
