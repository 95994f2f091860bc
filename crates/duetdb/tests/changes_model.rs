//! Change streams against a model (issue 16's property test): for random
//! histories — inserts, updates, replaces, deletes, transactions,
//! collection drops, database drops, checkpoints and restarts, over a few
//! collections of two databases, one collection recording pre-images — the
//! stream of a random scope, walked in random batch sizes and filtered by a
//! random `$match`-like predicate, equals the committed changes the model
//! predicts under the same scope and predicate; and resuming from every
//! event's position yields exactly the rest.
//!
//! Histories run on an in-memory engine (every event from the tail) or on a
//! data directory with 4 KiB WAL segments, opening the stream first (tail)
//! or only after the writes (every event read back from the logs,
//! checkpoints' history segments included), with restarts between writes.

use std::collections::BTreeMap;

use bson::{doc, Bson, Document};
use duetdb::{
    ChangeEvent, ChangeKind, ChangePosition, ChangeScope, CollectionOptions, Durability,
    DurabilityOptions, Engine, TxnOptions,
};
use proptest::prelude::*;

const COLLS: [&str; 3] = ["a", "b", "p"];
const DBS: [&str; 2] = ["d", "e"];
/// The collection created with `changeStreamPreAndPostImages`.
const PRE: &str = "p";

#[derive(Debug, Clone, Copy)]
enum Write {
    /// Insert `{_id, v}`, or `$set` `v` when the `_id` exists.
    Upsert,
    /// Replace with `{_id, w}` when it exists.
    Replace,
    /// Delete when it exists.
    Delete,
}

#[derive(Debug, Clone)]
enum Op {
    One(usize, usize, Write, i32),
    /// A transaction on database `d`: (collection, write, id).
    Txn(Vec<(usize, Write, i32)>),
    DropColl(usize, usize),
    /// Drop database `e` (only in-memory runs: a restart turns resuming
    /// from before a drop into 286, tested in `changes.rs`).
    DropDb,
    Checkpoint,
    Restart,
}

fn write() -> impl Strategy<Value = Write> {
    prop_oneof![
        3 => Just(Write::Upsert),
        1 => Just(Write::Replace),
        1 => Just(Write::Delete)
    ]
}

fn op(durable: bool) -> impl Strategy<Value = Op> {
    let one =
        (0..2usize, 0..3usize, write(), 0..5i32).prop_map(|(d, c, w, id)| Op::One(d, c, w, id));
    let txn = prop::collection::vec((0..3usize, write(), 0..5i32), 1..5).prop_map(Op::Txn);
    let drop_coll = (0..2usize, 0..3usize).prop_map(|(d, c)| Op::DropColl(d, c));
    let rare = if durable {
        prop_oneof![Just(Op::Checkpoint), Just(Op::Restart)].boxed()
    } else {
        Just(Op::DropDb).boxed()
    };
    prop_oneof![12 => one, 3 => txn, 1 => drop_coll, 1 => rare]
}

/// One expected event: database, kind, collection, `_id`, document (the
/// new version) and pre-image.
#[derive(Debug, Clone, PartialEq)]
struct Ev {
    db: String,
    kind: &'static str,
    coll: Option<String>,
    id: Option<i32>,
    doc: Option<Document>,
    before: Option<Document>,
}

#[derive(Default)]
struct Model {
    /// `(db, coll)` → (pre-images on, documents by `_id`).
    colls: BTreeMap<(usize, usize), (bool, BTreeMap<i32, Document>)>,
    /// Database `e` exists (a drop of it is an event).
    e_exists: bool,
    events: Vec<Ev>,
    n: i32,
}

impl Model {
    fn ev(
        &mut self,
        db: usize,
        kind: &'static str,
        c: usize,
        id: i32,
        doc: Option<Document>,
        before: Option<Document>,
    ) {
        self.events.push(Ev {
            db: DBS[db].into(),
            kind,
            coll: Some(COLLS[c].into()),
            id: Some(id),
            doc,
            before,
        });
    }

    /// Apply one write as the engine will; returns whether it changes
    /// anything. `txn`: a transaction reports replacements as updates.
    fn write(&mut self, db: usize, c: usize, w: Write, id: i32, txn: bool) -> Option<Document> {
        self.n += 1;
        let n = self.n;
        if db == 1 {
            self.e_exists = true;
        }
        let (pre, docs) = self.colls.get(&(db, c)).cloned().unwrap_or_default();
        let old = docs.get(&id).cloned();
        let keep = |d: &Option<Document>| if pre { d.clone() } else { None };
        let (kind, new) = match (w, &old) {
            (Write::Upsert, None) => ("insert", Some(doc! {"_id": id, "v": n})),
            (Write::Upsert, Some(o)) => {
                let mut d = o.clone();
                d.insert("v", n);
                ("update", Some(d))
            }
            (Write::Replace, Some(_)) => (
                if txn { "update" } else { "replace" },
                Some(doc! {"_id": id, "w": n}),
            ),
            (Write::Delete, Some(_)) => ("delete", None),
            (_, None) => return None,
        };
        let entry = self
            .colls
            .entry((db, c))
            .or_insert((false, BTreeMap::new()));
        match &new {
            Some(d) => entry.1.insert(id, d.clone()),
            None => entry.1.remove(&id),
        };
        let before = if kind == "insert" { None } else { keep(&old) };
        self.ev(db, kind, c, id, new.clone(), before);
        Some(new.unwrap_or_default())
    }
}

fn filter_doc(id: i32) -> Document {
    doc! {"_id": id}
}

/// Run `w` through the engine's collection API.
fn run_one(engine: &Engine, db: usize, c: usize, w: Write, id: i32, n: i32) {
    let coll = engine.database(DBS[db]).expect("db").collection(COLLS[c]);
    match w {
        Write::Upsert => {
            let r = coll
                .update_one(filter_doc(id), doc! {"$set": {"v": n}})
                .expect("update");
            if r.matched == 0 {
                coll.insert_one(doc! {"_id": id, "v": n}).expect("insert");
            }
        }
        Write::Replace => {
            coll.replace_one(filter_doc(id), doc! {"w": n})
                .expect("replace");
        }
        Write::Delete => {
            coll.delete_one(filter_doc(id)).expect("delete");
        }
    }
}

fn open(dir: Option<&std::path::Path>) -> Engine {
    match dir {
        None => Engine::in_memory(),
        Some(d) => Engine::open_with(
            d,
            DurabilityOptions {
                mode: Durability::Batch,
                segment_bytes: 4096,
                background_checkpoints: false,
                ..Default::default()
            },
        )
        .expect("open"),
    }
}

fn as_ev(e: &ChangeEvent) -> Ev {
    let doc_of = |d: &duetdb::raw::DocRef| duetdb::raw::to_document(d).expect("document");
    let id_of = |d: &Document| d.get_i32("_id").ok();
    let (kind, coll, doc): (&'static str, Option<&str>, Option<Document>) = match &e.kind {
        ChangeKind::Insert { coll, doc } => ("insert", Some(coll), Some(doc_of(doc))),
        ChangeKind::Update { coll, doc, .. } => ("update", Some(coll), Some(doc_of(doc))),
        ChangeKind::Replace { coll, doc } => ("replace", Some(coll), Some(doc_of(doc))),
        ChangeKind::Delete { coll, .. } => ("delete", Some(coll), None),
        ChangeKind::Drop { coll } => ("drop", Some(coll), None),
        ChangeKind::Create { coll } => ("create", Some(coll), None),
        ChangeKind::DropDatabase => ("dropDatabase", None, None),
        other => panic!("unexpected event {other:?}"),
    };
    let id = match &e.kind {
        ChangeKind::Delete {
            id: Bson::Int32(i), ..
        } => Some(*i),
        _ => doc.as_ref().and_then(id_of),
    };
    Ev {
        db: e.db.to_string(),
        kind,
        coll: coll.map(str::to_string),
        id,
        doc,
        before: e.before.as_ref().map(doc_of),
    }
}

fn in_scope(scope: &ChangeScope, e: &Ev) -> bool {
    match scope {
        ChangeScope::Cluster => true,
        ChangeScope::Database(d) => &e.db == d,
        ChangeScope::Collection { db, coll } => {
            &e.db == db && e.coll.as_deref() == Some(coll) && e.kind != "dropDatabase"
        }
    }
}

/// A `$match`-like predicate: a set of operation types and an optional
/// condition on the document key's parity.
#[derive(Debug, Clone)]
struct Pred {
    kinds: u8,
    parity: Option<i32>,
}

const KINDS: [&str; 7] = [
    "insert",
    "update",
    "replace",
    "delete",
    "drop",
    "create",
    "dropDatabase",
];

impl Pred {
    fn matches(&self, e: &Ev) -> bool {
        let k = KINDS.iter().position(|k| *k == e.kind).unwrap_or(0);
        self.kinds & (1 << k) != 0
            && self
                .parity
                .is_none_or(|p| e.id.is_none_or(|i| i.rem_euclid(2) == p))
    }
}

fn scope_of(k: usize) -> ChangeScope {
    match k {
        0 => ChangeScope::Cluster,
        1 => ChangeScope::Database("d".into()),
        2 => ChangeScope::Database("e".into()),
        k => ChangeScope::Collection {
            db: DBS[(k - 3) / 3].into(),
            coll: COLLS[(k - 3) % 3].into(),
        },
    }
}

#[derive(Debug)]
struct Case {
    durable: bool,
    stream_first: bool,
    ops: Vec<Op>,
    scope: usize,
    pred: Pred,
    batch: usize,
}

fn run(case: Case) -> Result<(), TestCaseError> {
    let dir = tempfile::tempdir().expect("tmp");
    let path = case.durable.then(|| dir.path());
    let mut engine = open(path);
    if case.stream_first || !case.durable {
        engine.open_change_stream();
    }
    let mut model = Model::default();
    engine
        .database("d")
        .expect("d")
        .create_collection_with(
            PRE,
            CollectionOptions {
                pre_and_post_images: true,
                ..Default::default()
            },
        )
        .expect("create p");
    model.colls.insert((0, 2), (true, BTreeMap::new()));
    model.events.push(Ev {
        db: "d".into(),
        kind: "create",
        coll: Some(PRE.into()),
        id: None,
        doc: None,
        before: None,
    });
    for op in &case.ops {
        match op {
            Op::One(db, c, w, id) => {
                let n = model.n + 1;
                model.write(*db, *c, *w, *id, false);
                run_one(&engine, *db, *c, *w, *id, n);
            }
            Op::Txn(writes) => {
                let d = engine.database("d").expect("d");
                let mut tx = d.begin(TxnOptions::default());
                let mut seen = Vec::new();
                for (c, w, id) in writes {
                    if seen.contains(&(*c, *id)) {
                        continue;
                    }
                    seen.push((*c, *id));
                    let existed = model
                        .colls
                        .get(&(0, *c))
                        .is_some_and(|(_, docs)| docs.contains_key(id));
                    let n = model.n + 1;
                    if model.write(0, *c, *w, *id, true).is_none() {
                        continue;
                    }
                    let coll = COLLS[*c];
                    match (w, existed) {
                        (Write::Upsert, true) => {
                            tx.update_one(coll, filter_doc(*id), doc! {"$set": {"v": n}})
                                .expect("txn update");
                        }
                        (Write::Upsert, false) => {
                            tx.insert_one(coll, doc! {"_id": *id, "v": n})
                                .expect("txn insert");
                        }
                        (Write::Replace, _) => {
                            tx.replace_one(coll, filter_doc(*id), doc! {"w": n})
                                .expect("txn replace");
                        }
                        (Write::Delete, _) => {
                            tx.delete_one(coll, filter_doc(*id)).expect("txn delete");
                        }
                    }
                }
                tx.commit().expect("commit");
            }
            Op::DropColl(db, c) => {
                if *db == 1 {
                    model.e_exists = true;
                }
                let dropped = engine
                    .database(DBS[*db])
                    .expect("db")
                    .drop_collection(COLLS[*c])
                    .expect("drop");
                let expected = model.colls.remove(&(*db, *c)).is_some();
                prop_assert_eq!(dropped, expected, "drop of {}.{}", DBS[*db], COLLS[*c]);
                if dropped {
                    model.events.push(Ev {
                        db: DBS[*db].into(),
                        kind: "drop",
                        coll: Some(COLLS[*c].into()),
                        id: None,
                        doc: None,
                        before: None,
                    });
                }
            }
            Op::DropDb => {
                let existed = engine.drop_database("e");
                prop_assert_eq!(existed, model.e_exists);
                if existed {
                    let colls: Vec<usize> = model
                        .colls
                        .keys()
                        .filter(|(d, _)| *d == 1)
                        .map(|(_, c)| *c)
                        .collect();
                    for c in colls {
                        model.colls.remove(&(1, c));
                        model.events.push(Ev {
                            db: "e".into(),
                            kind: "drop",
                            coll: Some(COLLS[c].into()),
                            id: None,
                            doc: None,
                            before: None,
                        });
                    }
                    model.events.push(Ev {
                        db: "e".into(),
                        kind: "dropDatabase",
                        coll: None,
                        id: None,
                        doc: None,
                        before: None,
                    });
                    model.e_exists = false;
                }
            }
            Op::Checkpoint => {
                for db in engine.all_databases() {
                    db.checkpoint().expect("checkpoint");
                }
            }
            Op::Restart => {
                drop(engine);
                engine = open(path);
                if case.stream_first {
                    engine.open_change_stream();
                }
            }
        }
    }
    engine.open_change_stream();
    let scope = scope_of(case.scope);
    let want_all: Vec<Ev> = model
        .events
        .iter()
        .filter(|e| in_scope(&scope, e))
        .cloned()
        .collect();
    // Walk the whole stream in batches of `batch`.
    let mut got: Vec<ChangeEvent> = Vec::new();
    let mut pos = ChangePosition::default();
    loop {
        let b = engine.read_changes(&scope, pos, case.batch).expect("read");
        prop_assert!(b.position >= pos, "positions never move back");
        if b.events.is_empty() {
            break;
        }
        got.extend(b.events);
        pos = b.position;
    }
    let got_ev: Vec<Ev> = got.iter().map(as_ev).collect();
    prop_assert_eq!(&got_ev, &want_all, "scope {:?}", scope);
    let filtered =
        |v: &[Ev]| -> Vec<Ev> { v.iter().filter(|e| case.pred.matches(e)).cloned().collect() };
    prop_assert_eq!(filtered(&got_ev), filtered(&want_all));
    // Resuming from every event's position: exactly the rest.
    for (i, e) in got.iter().enumerate() {
        let rest = engine.read_changes(&scope, e.pos, 10_000).expect("resume");
        let rest: Vec<Ev> = rest.events.iter().map(as_ev).collect();
        prop_assert_eq!(&rest[..], &want_all[i + 1..], "resume after event {}", i);
    }
    Ok(())
}

fn case(durable: bool) -> impl Strategy<Value = Case> {
    (
        any::<bool>(),
        prop::collection::vec(op(durable), 10..60),
        // Mostly whole databases and the cluster (more events per case).
        prop_oneof![2 => 0..3usize, 1 => 3..9usize],
        (1u8..=127, prop::option::of(0..2i32)),
        1..6usize,
    )
        .prop_map(
            move |(stream_first, ops, scope, (kinds, parity), batch)| Case {
                durable,
                stream_first,
                ops,
                scope,
                pred: Pred { kinds, parity },
                batch,
            },
        )
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]

    #[test]
    fn stream_equals_the_model_in_memory(c in case(false)) {
        run(c)?;
    }

    #[test]
    fn stream_equals_the_model_from_the_logs_across_restarts(c in case(true)) {
        run(c)?;
    }
}
