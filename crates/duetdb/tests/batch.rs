//! Batches of update and delete statements (`Crud::update_statements`,
//! `Crud::delete_statements`) against their reference: the same statements
//! run one by one, each an engine command of its own, as the server ran
//! them before batches. Random statements over a collection with a unique
//! index, a validator and pre-images, many of them failing (duplicate keys,
//! validation, a non-numeric `$inc`, a changed `_id`, a bad filter, a bad
//! hint, a multi replacement), under per-statement collations, ordered and
//! unordered. Per statement the results must be equal (values, error codes
//! and messages), and after every command the documents, the change events
//! (kinds, documents, pre-images, in order) and what a replica set records
//! for retryable writes (each applied statement's outcome with its
//! statement id) must be equal too. Beside it: a batch is applied in as few
//! writer groups as its bound allows, ordered batches stop and unordered
//! ones go on across that bound.

use std::sync::Arc;

use duetdb::bson::{doc, Bson, Document};
use duetdb::lang::UpdateSpec;
use duetdb::replication::{Commit, GroupRecord, Replicate};
use duetdb::{
    ChangePosition, ChangeScope, CollectionOptions, Crud, Database, DeleteStatement, Engine,
    IndexOptions, UpdateOptions, UpdateStatement,
};
use parking_lot::Mutex;
use proptest::prelude::*;

/// Records what a replica set would keep of each group: its tagged
/// outcomes, in order.
#[derive(Default)]
struct Recorder(Mutex<Vec<(Vec<u8>, Vec<u8>)>>);

impl Replicate for Recorder {
    fn replicate(&self, rec: GroupRecord<'_>) -> duetdb::Result<Commit> {
        (rec.proposed)();
        let mut seen = self.0.lock();
        for t in rec.origins {
            seen.push((t.tag.to_vec(), t.outcome.clone()));
        }
        Ok(Commit::local(|_| {}))
    }
}

/// One side of the comparison: an engine with a log (replication needs
/// one), its recorder and an open change stream.
struct Side {
    _dir: tempfile::TempDir,
    engine: Engine,
    db: Database,
    recorder: Arc<Recorder>,
    changes: ChangePosition,
}

const COLL: &str = "c";
const DOCS: i32 = 10;

/// The documents every side starts from: every third `s` a string (so
/// that `$inc: {s: 1}` fails there), in varying case.
fn seed_docs() -> Vec<Document> {
    (0..DOCS)
        .map(|i| {
            let s = if i % 3 == 0 {
                Bson::String(["a", "B", "c", "A"][(i / 3) as usize % 4].into())
            } else {
                Bson::Int32(i)
            };
            doc! {"_id": i, "u": i * 10, "v": i, "s": s}
        })
        .collect()
}

impl Side {
    fn new() -> Side {
        let dir = tempfile::tempdir().expect("tempdir");
        let engine = Engine::open(dir.path()).expect("open");
        let recorder = Arc::new(Recorder::default());
        engine.set_replicator(Some(recorder.clone()));
        let db = engine.database("t").expect("db");
        prepare(&db, true);
        let changes = engine.open_change_stream();
        Side {
            _dir: dir,
            engine,
            db,
            recorder,
            changes,
        }
    }

    fn docs(&self) -> Vec<Document> {
        all_docs(&self.db)
    }

    /// The change events since the last call, without their positions and
    /// times (a batch is one group where the reference made many).
    fn events(&mut self) -> Vec<String> {
        let scope = ChangeScope::Database("t".into());
        let mut out = Vec::new();
        loop {
            let b = self
                .engine
                .read_changes(&scope, self.changes, 1000)
                .expect("changes");
            self.changes = b.position;
            if b.events.is_empty() {
                return out;
            }
            out.extend(
                b.events
                    .iter()
                    .map(|e| format!("{:?} before {:?}", e.kind, e.before)),
            );
        }
    }

    fn recorded(&self) -> Vec<(Vec<u8>, Vec<u8>)> {
        std::mem::take(&mut *self.recorder.0.lock())
    }
}

/// A statement drawn by the strategy: an update or a delete, its filter,
/// collation and options.
#[derive(Debug, Clone)]
enum Stmt {
    Update {
        filter: Query,
        update: Change,
        multi: bool,
        upsert: bool,
        hint: Option<Bson>,
        folded: bool,
    },
    Delete {
        filter: Query,
        multi: bool,
        folded: bool,
    },
}

#[derive(Debug, Clone)]
enum Query {
    Id(i32),
    VAtLeast(i32),
    /// A string match, case-insensitive under the folded collation.
    S(&'static str),
    /// Refused when parsed (an unknown operator).
    Bad,
}

#[derive(Debug, Clone)]
enum Change {
    /// May collide on the unique index.
    SetUnique(i32),
    /// May go below the validator's 0.
    IncV(i32),
    /// Fails on a string `s`.
    IncS,
    /// A whole new document (a `multi` one is refused).
    Replace(i32),
    /// Changes `_id` (66) unless it is the same.
    ReplaceId(i32),
}

impl Query {
    fn doc(&self) -> Document {
        match self {
            Query::Id(i) => doc! {"_id": i},
            Query::VAtLeast(v) => doc! {"v": {"$gte": v}},
            Query::S(s) => doc! {"s": s},
            Query::Bad => doc! {"v": {"$nope": 1}},
        }
    }
}

impl Change {
    fn spec(&self) -> UpdateSpec {
        let d = match self {
            Change::SetUnique(u) => doc! {"$set": {"u": u}},
            Change::IncV(by) => doc! {"$inc": {"v": by}},
            Change::IncS => doc! {"$inc": {"s": 1}},
            Change::Replace(u) => doc! {"u": u, "v": 1, "s": "r"},
            Change::ReplaceId(id) => doc! {"_id": id, "u": 1000 + id, "v": 1},
        };
        UpdateSpec::parse(&d).expect("update")
    }
}

fn folded(on: bool) -> Option<Document> {
    on.then(|| doc! {"locale": "en", "strength": 2})
}

fn arb_filter() -> impl Strategy<Value = Query> {
    prop_oneof![
        4 => (0..DOCS + 3).prop_map(Query::Id),
        2 => (0..DOCS).prop_map(Query::VAtLeast),
        1 => prop_oneof![Just("a"), Just("b"), Just("C")].prop_map(Query::S),
        1 => Just(Query::Bad),
    ]
}

fn arb_update() -> impl Strategy<Value = Change> {
    prop_oneof![
        3 => (0..DOCS + 3).prop_map(|k| Change::SetUnique(k * 10)),
        3 => (-6..4).prop_map(Change::IncV),
        1 => Just(Change::IncS),
        1 => (0..DOCS + 3).prop_map(|k| Change::Replace(k * 10 + 5)),
        1 => (0..DOCS).prop_map(Change::ReplaceId),
    ]
}

fn arb_hint() -> impl Strategy<Value = Option<Bson>> {
    prop_oneof![
        6 => Just(None),
        1 => Just(Some(Bson::Document(doc! {"u": 1}))),
        1 => Just(Some(Bson::String("no_such_index".into()))),
    ]
}

fn arb_stmt(updates: bool) -> BoxedStrategy<Stmt> {
    if updates {
        (
            arb_filter(),
            arb_update(),
            any::<bool>(),
            prop::bool::weighted(0.3),
            arb_hint(),
            prop::bool::weighted(0.2),
        )
            .prop_map(
                |(filter, update, multi, upsert, hint, folded)| Stmt::Update {
                    // Upserts by `_id` only: any other would generate an `_id`,
                    // different on each side.
                    upsert: upsert && matches!(filter, Query::Id(_)),
                    filter,
                    update,
                    multi,
                    hint,
                    folded,
                },
            )
            .boxed()
    } else {
        (arb_filter(), any::<bool>(), prop::bool::weighted(0.2))
            .prop_map(|(filter, multi, folded)| Stmt::Delete {
                filter,
                multi,
                folded,
            })
            .boxed()
    }
}

/// One client command: update or delete statements, ordered or not.
#[derive(Debug, Clone)]
struct Cmd {
    stmts: Vec<Stmt>,
    ordered: bool,
}

fn arb_cmd() -> impl Strategy<Value = Cmd> {
    (any::<bool>(), any::<bool>()).prop_flat_map(|(updates, ordered)| {
        prop::collection::vec(arb_stmt(updates), 1..12)
            .prop_map(move |stmts| Cmd { stmts, ordered })
    })
}

/// A statement's result as compared: the value, or the error's code and
/// message.
fn shown<T: std::fmt::Debug>(r: &duetdb::Result<T>) -> String {
    match r {
        Ok(v) => format!("ok {v:?}"),
        Err(e) => format!("error {} {e}", e.code()),
    }
}

fn update_options(upsert: bool, hint: &Option<Bson>) -> UpdateOptions {
    UpdateOptions {
        upsert,
        hint: hint.clone(),
    }
}

impl Stmt {
    fn folded(&self) -> bool {
        match self {
            Stmt::Update { folded, .. } | Stmt::Delete { folded, .. } => *folded,
        }
    }

    fn as_update(&self) -> Option<UpdateStatement> {
        match self {
            Stmt::Update {
                filter,
                update,
                multi,
                upsert,
                hint,
                folded: f,
            } => Some(UpdateStatement {
                filter: filter.doc(),
                update: update.spec(),
                multi: *multi,
                options: update_options(*upsert, hint),
                collation: folded(*f),
            }),
            Stmt::Delete { .. } => None,
        }
    }

    fn as_delete(&self) -> Option<DeleteStatement> {
        match self {
            Stmt::Delete {
                filter,
                multi,
                folded: f,
            } => Some(DeleteStatement {
                filter: filter.doc(),
                multi: *multi,
                collation: folded(*f),
            }),
            Stmt::Update { .. } => None,
        }
    }
}

/// One statement as its own call on `c` (a handle under its collation).
fn run_one(c: &dyn Crud, s: &Stmt) -> String {
    if let Some(u) = s.as_update() {
        return shown(&c.update_with_spec(u.filter, u.update, u.multi, u.options));
    }
    match s.as_delete() {
        Some(d) if d.multi => shown(&c.delete_many(d.filter)),
        Some(d) => shown(&c.delete_one(d.filter)),
        None => unreachable!("a statement is an update or a delete"),
    }
}

/// The reference: each statement run by `run` (given its position),
/// stopping at the first failure when ordered.
fn one_by_one(cmd: &Cmd, mut run: impl FnMut(usize, &Stmt) -> String) -> Vec<String> {
    let mut out = Vec::new();
    for (i, s) in cmd.stmts.iter().enumerate() {
        let r = run(i, s);
        let failed = r.starts_with("error");
        out.push(r);
        if failed && cmd.ordered {
            break;
        }
    }
    out
}

/// The live reference: each statement its own engine command, tagged as
/// the server tagged it (statement `i` of the operation).
fn live_one_by_one(db: &Database, tag: &Arc<[u8]>, cmd: &Cmd) -> Vec<String> {
    one_by_one(cmd, |i, s| {
        let id = u32::try_from(i).expect("few statements");
        let db = db.with_origin(tag.clone()).with_statements(Arc::from([id]));
        run_one(&db.collection(COLL).with_collation(folded(s.folded())), s)
    })
}

/// The same command as one batch, on `coll` (live or a transaction's view).
fn batched(coll: &dyn Crud, cmd: &Cmd) -> Vec<String> {
    let updates: Vec<UpdateStatement> = cmd.stmts.iter().filter_map(Stmt::as_update).collect();
    if updates.is_empty() {
        let deletes = cmd.stmts.iter().filter_map(Stmt::as_delete).collect();
        coll.delete_statements(deletes, cmd.ordered)
            .expect("batch")
            .iter()
            .map(shown)
            .collect()
    } else {
        coll.update_statements(updates, cmd.ordered)
            .expect("batch")
            .iter()
            .map(shown)
            .collect()
    }
}

/// `db` with the seed in a collection with a validator (`v >= 0`), a
/// unique index on `u` and, when asked, pre-images for change streams.
fn prepare(db: &Database, pre_images: bool) {
    let options = CollectionOptions {
        pre_and_post_images: pre_images,
        validator: Some(Arc::new(doc! {"v": {"$gte": 0}})),
        ..Default::default()
    };
    db.create_collection_with(COLL, options).expect("create");
    let c = db.collection(COLL);
    let unique = IndexOptions {
        unique: true,
        ..Default::default()
    };
    c.create_index(doc! {"u": 1}, unique).expect("index");
    c.insert_many(seed_docs(), true).expect("seed");
}

/// A database without a log holding the seed, for transactions.
fn seeded_for_transactions() -> Database {
    let db = Database::in_memory();
    prepare(&db, false);
    db
}

fn all_docs(db: &Database) -> Vec<Document> {
    db.collection(COLL)
        .find(doc! {})
        .sort(doc! {"_id": 1})
        .run()
        .expect("find")
}

fn check_commands(cmds: &[Cmd]) -> Result<(), TestCaseError> {
    let (mut batch, mut reference) = (Side::new(), Side::new());
    let (txn_batch, txn_reference) = (seeded_for_transactions(), seeded_for_transactions());
    for (k, cmd) in cmds.iter().enumerate() {
        let tag: Arc<[u8]> = Arc::from(format!("op{k}").into_bytes());
        let want = live_one_by_one(&reference.db, &tag, cmd);
        let tagged = batch.db.with_origin(tag.clone());
        let got = batched(&tagged.collection(COLL), cmd);
        prop_assert_eq!(&got, &want, "statement results of command {}", k);
        prop_assert_eq!(
            batch.docs(),
            reference.docs(),
            "documents after command {}",
            k
        );
        prop_assert_eq!(
            batch.events(),
            reference.events(),
            "change events of command {}",
            k
        );
        prop_assert_eq!(
            batch.recorded(),
            reference.recorded(),
            "retry outcomes of command {}",
            k
        );
        // In a transaction (its own rules: a unique index is checked at
        // commit) a batch is also its statements one by one.
        let mut tx = txn_reference.begin(Default::default());
        let want = one_by_one(cmd, |_, s| {
            run_one(&tx.collection(COLL).with_collation(folded(s.folded())), s)
        });
        let want_commit = tx.commit().map(|_| ()).map_err(|e| e.code());
        let mut tx = txn_batch.begin(Default::default());
        let got = batched(&tx.collection(COLL), cmd);
        prop_assert_eq!(&got, &want, "in a transaction, command {}", k);
        prop_assert_eq!(tx.commit().map(|_| ()).map_err(|e| e.code()), want_commit);
        prop_assert_eq!(all_docs(&txn_batch), all_docs(&txn_reference));
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    #[test]
    fn a_batch_is_its_statements_one_by_one(cmds in prop::collection::vec(arb_cmd(), 1..6)) {
        check_commands(&cmds)?;
    }
}

/// `n` `$inc` statements by `_id` over documents 0..10; statement `bad`
/// sets `u` to a value another document holds (a duplicate key).
fn incs(n: usize, bad: usize) -> Vec<UpdateStatement> {
    (0..n)
        .map(|i| {
            let id = i32::try_from(i % 10).expect("small");
            let update = if i == bad {
                doc! {"$set": {"u": (id + 1) % 10}}
            } else {
                doc! {"$inc": {"n": 1}}
            };
            UpdateStatement {
                filter: doc! {"_id": id},
                update: UpdateSpec::parse(&update).expect("update"),
                multi: false,
                options: UpdateOptions::default(),
                collation: None,
            }
        })
        .collect()
}

fn seeded() -> Database {
    let db = Database::in_memory();
    let c = db.collection(COLL);
    let unique = IndexOptions {
        unique: true,
        ..Default::default()
    };
    c.create_index(doc! {"u": 1}, unique).expect("index");
    c.insert_many((0..10).map(|i| doc! {"_id": i, "u": i, "n": 0}), true)
        .expect("seed");
    db
}

fn total_n(db: &Database) -> i64 {
    db.collection(COLL)
        .find(doc! {})
        .run()
        .expect("find")
        .iter()
        .map(|d| i64::from(d.get_i32("n").unwrap_or(-1_000_000)))
        .sum()
}

#[test]
fn a_thousand_statements_are_one_writer_group() {
    let db = seeded();
    let before = db.writer_stats();
    let r = db
        .collection(COLL)
        .update_statements(incs(1000, usize::MAX), true)
        .expect("batch");
    assert_eq!(r.len(), 1000);
    assert!(r.iter().all(|r| matches!(r, Ok(u) if u.modified == 1)));
    let after = db.writer_stats();
    assert_eq!(after.groups - before.groups, 1, "one group, one publish");
    // Still one commit per statement, and counted as 1000 commands.
    assert_eq!(after.csn - before.csn, 1000);
    assert_eq!(after.commands - before.commands, 1000);
    assert_eq!(total_n(&db), 1000);
}

#[test]
fn batches_past_the_bound_split_and_ordered_ones_stop() {
    let bound = duetdb::MAX_BATCH_STATEMENTS;
    let n = 2 * bound + 500;
    let bad = bound + 300;
    // Ordered: everything before the failure applied, nothing after.
    let db = seeded();
    let before = db.writer_stats();
    let r = db
        .collection(COLL)
        .update_statements(incs(n, bad), true)
        .expect("batch");
    assert_eq!(r.len(), bad + 1);
    assert_eq!(r[bad].as_ref().map_err(|e| e.code()).err(), Some(11000));
    assert!(r[..bad].iter().all(Result::is_ok));
    // (Counted before reading: a read may register at a commit boundary.)
    assert_eq!(db.writer_stats().groups - before.groups, 2);
    assert_eq!(total_n(&db), i64::try_from(bad).expect("small"));
    // Unordered: every statement but the failing one, in three groups.
    let db = seeded();
    let before = db.writer_stats();
    let r = db
        .collection(COLL)
        .update_statements(incs(n, bad), false)
        .expect("batch");
    assert_eq!(r.len(), n);
    let failed: Vec<usize> = (0..n).filter(|&i| r[i].is_err()).collect();
    assert_eq!(failed, vec![bad]);
    assert_eq!(db.writer_stats().groups - before.groups, 3);
    assert_eq!(total_n(&db), i64::try_from(n - 1).expect("small"));
}
