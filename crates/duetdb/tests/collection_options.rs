//! Collection options through the engine API (issue #18 items 7 and 8):
//! validation of live writes and of writes inside transactions (a refused
//! write leaves the transaction's other writes in place), bypass, capped
//! trimming, and both surviving recovery from the WAL and from a checkpoint;
//! model tests of validation levels and actions on random write sequences
//! and of capped collections (a `VecDeque`) on random inserts, updates and
//! deletes.

use std::path::PathBuf;
use std::sync::Arc;

use duetdb::bson::{doc, Bson, Document};
use duetdb::storage::SimFs;
use duetdb::{
    CollectionOptions, Crud, Database, Durability, DurabilityOptions, Error, ValidationAction,
    ValidationLevel,
};
use proptest::prelude::*;

fn validated() -> CollectionOptions {
    CollectionOptions {
        validator: Some(Arc::new(doc! {"a": {"$gte": 0}})),
        ..Default::default()
    }
}

fn capped(max: u64) -> CollectionOptions {
    CollectionOptions {
        capped: true,
        capped_size: Some(4096),
        capped_max: Some(max),
        ..Default::default()
    }
}

fn ids(db: &Database, coll: &str) -> Vec<Bson> {
    db.snapshot()
        .collection(coll)
        .find(doc! {})
        .run()
        .expect("find")
        .into_iter()
        .map(|d: Document| d.get("_id").cloned().unwrap_or(Bson::Null))
        .collect()
}

#[test]
fn live_writes_are_validated_and_bypass_skips() {
    let db = Database::in_memory();
    db.create_collection_with("c", validated()).expect("create");
    let c = db.collection("c");
    c.insert_one(doc! {"_id": 1, "a": 1}).expect("valid");
    let e = c.insert_one(doc! {"_id": 2, "a": -1}).expect_err("invalid");
    assert_eq!(e.code(), 121);
    db.collection("c")
        .bypass_document_validation(true)
        .insert_one(doc! {"_id": 3, "a": -1})
        .expect("bypassed");
    // Stored with the defaults MongoDB lists beside a validator.
    assert_eq!(
        c.options().expect("options").to_document(),
        doc! {"validator": {"a": {"$gte": 0}}, "validationLevel": "strict", "validationAction": "error"}
    );
    // A validator that does not compile is refused; nothing changes.
    let bad = c.set_options(|o| o.validator = Some(Arc::new(doc! {"a": {"$bogus": 1}})));
    assert!(bad.is_err());
    assert_eq!(c.options().expect("options"), validated().with_defaults());
}

#[test]
fn transaction_writes_are_validated_and_the_others_stay() {
    let db = Database::in_memory();
    db.create_collection_with("c", validated()).expect("create");
    db.collection("c")
        .insert_one(doc! {"_id": 1, "a": 1})
        .expect("valid");
    let mut txn = db.begin(Default::default());
    txn.insert_one("c", doc! {"_id": 2, "a": 2}).expect("valid");
    let e = txn
        .insert_one("c", doc! {"_id": 3, "a": -3})
        .expect_err("invalid");
    assert_eq!(e.code(), 121);
    let e = txn
        .update_one("c", doc! {"_id": 1}, doc! {"$set": {"a": -1}})
        .expect_err("invalid");
    assert_eq!(e.code(), 121);
    txn.collection("c")
        .bypass_document_validation(true)
        .insert_one(doc! {"_id": 4, "a": -4})
        .expect("bypassed");
    txn.commit().expect("commit");
    assert_eq!(
        ids(&db, "c"),
        [Bson::Int32(1), Bson::Int32(2), Bson::Int32(4)]
    );
}

#[test]
fn capped_collections_trim_and_refuse_transactions() {
    let db = Database::in_memory();
    db.create_collection_with("c", capped(2)).expect("create");
    let c = db.collection("c");
    for i in 0..5 {
        c.insert_one(doc! {"_id": i}).expect("insert");
    }
    assert_eq!(ids(&db, "c"), [Bson::Int32(3), Bson::Int32(4)]);
    let mut txn = db.begin(Default::default());
    let e = txn.insert_one("c", doc! {"_id": 9}).expect_err("refused");
    assert_eq!(e.code(), 263);
    assert!(matches!(
        db.create_collection_with(
            "d",
            CollectionOptions {
                capped: true,
                ..Default::default()
            }
        ),
        Err(Error::Coded { code: 72, .. })
    ));
}

#[test]
fn options_and_trims_survive_recovery() {
    let fs = SimFs::new();
    let opts = DurabilityOptions {
        mode: Durability::Fsync,
        checkpoint_wal_bytes: u64::MAX,
        checkpoint_interval: None,
        background_checkpoints: false,
        vfs: Arc::new(fs.clone()),
        ..Default::default()
    };
    let dir = PathBuf::from("/db");
    {
        let db = Database::open_with(&dir, opts.clone()).expect("open");
        db.create_collection_with("v", validated()).expect("create");
        db.create_collection_with("k", capped(2)).expect("create");
        for i in 0..4 {
            db.collection("k")
                .insert_one(doc! {"_id": i})
                .expect("insert");
        }
    }
    for round in 0..2 {
        let db = Database::open_with(&dir, opts.clone()).expect("reopen");
        assert_eq!(
            db.collection("v").options().expect("v"),
            validated().with_defaults()
        );
        assert_eq!(db.collection("k").options().expect("k"), capped(2));
        assert_eq!(ids(&db, "k"), [Bson::Int32(2), Bson::Int32(3)]);
        let e = db
            .collection("v")
            .insert_one(doc! {"a": -1})
            .expect_err("invalid");
        assert_eq!(e.code(), 121);
        db.collection("k").check_invariants().expect("consistent");
        if round == 0 {
            // The second round recovers from this checkpoint.
            db.checkpoint().expect("checkpoint");
        }
    }
}

/// `convertToCapped` and `cloneCollectionAsCapped` are logged as plain
/// effects that rebuild the same capped collections on replay.
#[test]
fn converted_collections_survive_recovery() {
    let fs = SimFs::new();
    let opts = DurabilityOptions {
        mode: Durability::Fsync,
        checkpoint_wal_bytes: u64::MAX,
        checkpoint_interval: None,
        background_checkpoints: false,
        vfs: Arc::new(fs.clone()),
        ..Default::default()
    };
    let dir = PathBuf::from("/db");
    let (before, cloned) = {
        let db = Database::open_with(&dir, opts.clone()).expect("open");
        let c = db.collection("c");
        for i in 0..60 {
            c.insert_one(doc! {"_id": i, "pad": "y".repeat(200)})
                .expect("insert");
        }
        c.clone_as_capped("copy", 5000).expect("clone");
        c.convert_to_capped(4096).expect("convert");
        c.insert_one(doc! {"_id": 60, "pad": "y".repeat(200)})
            .expect("insert after");
        (ids(&db, "c"), ids(&db, "copy"))
    };
    assert!(before.len() < 60 && before.last() == Some(&Bson::Int32(60)));
    let db = Database::open_with(&dir, opts).expect("reopen");
    assert_eq!(ids(&db, "c"), before);
    assert_eq!(ids(&db, "copy"), cloned);
    assert!(db.collection("c").options().expect("c").capped);
    assert_eq!(
        db.collection("copy").options().expect("copy").capped_size,
        Some(5120)
    );
    db.collection("c").check_invariants().expect("consistent");
}

// ------------------------------------------------ models of levels and capping

/// `a` in the validation model: a small int or a string.
fn a_value() -> impl Strategy<Value = Bson> {
    prop_oneof![
        (-2i32..8).prop_map(Bson::Int32),
        Just(Bson::String("x".into()))
    ]
}

/// The validators of the level model, with the model's own verdicts.
const VALIDATORS: usize = 3;

fn validator_doc(k: usize) -> Document {
    match k {
        0 => doc! {"a": {"$gte": 0}},
        1 => doc! {"$jsonSchema": {"properties": {"a": {"bsonType": "int", "maximum": 4}}}},
        _ => doc! {"$or": [{"a": {"$gte": 5}}, {"b": true}]},
    }
}

fn valid_under(k: usize, d: &Document) -> bool {
    let a = d.get("a");
    match k {
        0 => matches!(a, Some(Bson::Int32(n)) if *n >= 0),
        1 => match a {
            None => true,
            Some(Bson::Int32(n)) => *n <= 4,
            Some(_) => false,
        },
        _ => {
            matches!(a, Some(Bson::Int32(n)) if *n >= 5) || d.get("b") == Some(&Bson::Boolean(true))
        }
    }
}

#[derive(Debug, Clone)]
enum VOp {
    Insert(Option<Bson>, Option<bool>, bool),
    /// `$set` (`Some`) or `$unset` (`None`) of `a` on the n-th document.
    Set(usize, Option<Bson>, bool),
    Replace(usize, Option<Bson>, Option<bool>, bool),
    /// `$set` of `a` with upsert on `_id` n (present or not).
    Upsert(i32, Bson),
    Delete(usize),
    Level(ValidationLevel),
    Action(ValidationAction),
    Validator(usize),
}

fn v_op() -> impl Strategy<Value = VOp> {
    let a = || proptest::option::of(a_value());
    let b = || proptest::option::of(any::<bool>());
    prop_oneof![
        3 => (a(), b(), any::<bool>()).prop_map(|(a, b, by)| VOp::Insert(a, b, by)),
        3 => (0usize..8, a(), any::<bool>()).prop_map(|(i, a, by)| VOp::Set(i, a, by)),
        2 => (0usize..8, a(), b(), any::<bool>()).prop_map(|(i, a, b, by)| VOp::Replace(i, a, b, by)),
        1 => (0i32..12, a_value()).prop_map(|(i, a)| VOp::Upsert(i, a)),
        1 => (0usize..8).prop_map(VOp::Delete),
        1 => prop_oneof![
            Just(ValidationLevel::Strict),
            Just(ValidationLevel::Moderate),
            Just(ValidationLevel::Off)
        ]
        .prop_map(VOp::Level),
        1 => prop_oneof![Just(ValidationAction::Error), Just(ValidationAction::Warn)].prop_map(VOp::Action),
        1 => (0..VALIDATORS).prop_map(VOp::Validator),
    ]
}

fn with_fields(id: i32, a: &Option<Bson>, b: &Option<bool>) -> Document {
    let mut d = doc! {"_id": id};
    if let Some(a) = a {
        d.insert("a", a.clone());
    }
    if let Some(b) = b {
        d.insert("b", *b);
    }
    d
}

/// A write as the model judges it: the old version (`None`: an insert), the
/// new one, and whether validation is bypassed.
type Write = (Option<Document>, Document, bool);

/// The validation model: the collection's documents by `_id` and its rules.
struct VModel {
    docs: std::collections::BTreeMap<i32, Document>,
    validator: usize,
    level: ValidationLevel,
    action: ValidationAction,
}

impl VModel {
    /// Is writing `new` over `old` (`None`: an insert) accepted?
    fn accepts(&self, old: Option<&Document>, new: &Document, bypass: bool) -> bool {
        let valid = |d: &Document| valid_under(self.validator, d);
        // A document's fields are ordered: a replacement with the same
        // fields in another order is a write (judged), not a no-op.
        // (`Document`'s `==` ignores order, so it cannot tell.)
        let unchanged = old.is_some_and(|o| o.iter().eq(new.iter()));
        if bypass || unchanged {
            // Bypassed, or a no-op update (nothing is written, nothing judged).
            return true;
        }
        match (self.level, self.action) {
            (ValidationLevel::Off, _) | (_, ValidationAction::Warn) => true,
            (ValidationLevel::Strict, _) => valid(new),
            (ValidationLevel::Moderate, _) => valid(new) || old.is_some_and(|o| !valid(o)),
        }
    }

    fn nth_id(&self, n: usize) -> i32 {
        self.docs
            .keys()
            .nth(n % self.docs.len().max(1))
            .copied()
            .unwrap_or(1000)
    }
}

/// `$set`/`$unset` of `a` as the update operators write it: in place when
/// present, appended when new.
fn set_a(old: &Document, a: &Option<Bson>) -> Document {
    let mut new = old.clone();
    match a {
        Some(v) => {
            new.insert("a", v.clone());
        }
        None => {
            new.remove("a");
        }
    }
    new
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    /// Random write sequences under changing validators, levels and actions
    /// (`collMod`), with and without `bypassDocumentValidation`: each write
    /// is accepted or refused (121, nothing changed) as the model says, and
    /// the collection holds the model's documents after every step.
    #[test]
    fn validation_levels_and_actions_decide_as_the_model(ops in proptest::collection::vec(v_op(), 1..40)) {
        let db = Database::in_memory();
        db.create_collection_with("c", CollectionOptions {
            validator: Some(Arc::new(validator_doc(0))),
            ..Default::default()
        }).expect("create");
        let c = db.collection("c");
        let mut m = VModel {
            docs: Default::default(),
            validator: 0,
            level: ValidationLevel::Strict,
            action: ValidationAction::Error,
        };
        let mut next_id = 100;
        for op in ops {
            let handle = |bypass: bool| db.collection("c").bypass_document_validation(bypass);
            let (got, write): (duetdb::Result<()>, Option<Write>) = match &op {
                VOp::Insert(a, b, bypass) => {
                    next_id += 1;
                    let d = with_fields(next_id, a, b);
                    (handle(*bypass).insert_one(d.clone()).map(|_| ()), Some((None, d, *bypass)))
                }
                VOp::Set(n, a, bypass) => {
                    let id = m.nth_id(*n);
                    let update = match a {
                        Some(v) => doc! {"$set": {"a": v.clone()}},
                        None => doc! {"$unset": {"a": 1}},
                    };
                    let r = handle(*bypass).update_one(doc! {"_id": id}, update).map(|_| ());
                    (r, m.docs.get(&id).map(|old| (Some(old.clone()), set_a(old, a), *bypass)))
                }
                VOp::Replace(n, a, b, bypass) => {
                    let id = m.nth_id(*n);
                    let new = with_fields(id, a, b);
                    let mut body = new.clone();
                    body.remove("_id");
                    let r = handle(*bypass).replace_one(doc! {"_id": id}, body).map(|_| ());
                    (r, m.docs.get(&id).map(|old| (Some(old.clone()), new, *bypass)))
                }
                VOp::Upsert(id, a) => {
                    let r = c.update_one_with(
                        doc! {"_id": id},
                        doc! {"$set": {"a": a.clone()}},
                        duetdb::UpdateOptions { upsert: true, ..Default::default() },
                    ).map(|_| ());
                    let write = match m.docs.get(id) {
                        Some(old) => (Some(old.clone()), set_a(old, &Some(a.clone())), false),
                        None => (None, doc! {"_id": *id, "a": a.clone()}, false),
                    };
                    (r, Some(write))
                }
                VOp::Delete(n) => {
                    let id = m.nth_id(*n);
                    m.docs.remove(&id);
                    (c.delete_one(doc! {"_id": id}).map(|_| ()), None)
                }
                VOp::Level(l) => {
                    m.level = *l;
                    let l = *l;
                    (c.set_options(move |o| o.validation_level = Some(l)).map(|_| ()), None)
                }
                VOp::Action(a) => {
                    m.action = *a;
                    let a = *a;
                    (c.set_options(move |o| o.validation_action = Some(a)).map(|_| ()), None)
                }
                VOp::Validator(k) => {
                    m.validator = *k;
                    let v = Arc::new(validator_doc(*k));
                    (c.set_options(move |o| o.validator = Some(v)).map(|_| ()), None)
                }
            };
            match write {
                Some((old, new, bypass)) => {
                    let want = m.accepts(old.as_ref(), &new, bypass);
                    match got {
                        Ok(()) => {
                            prop_assert!(want, "{:?} accepted", op);
                            let id = new.get_i32("_id").expect("_id");
                            m.docs.insert(id, new);
                        }
                        Err(e) => {
                            prop_assert!(!want, "{:?} refused: {}", op, e);
                            prop_assert_eq!(e.code(), 121, "{:?}", op);
                        }
                    }
                }
                None => {
                    got.map_err(|e| TestCaseError::fail(format!("{op:?}: {e}")))?;
                }
            }
            let stored = db.snapshot().collection("c").find(doc! {}).sort(doc! {"_id": 1}).run().expect("find");
            let want: Vec<Document> = m.docs.values().cloned().collect();
            prop_assert_eq!(stored, want, "after {:?}", op);
        }
    }
}

/// A capped collection's model: documents (`_id`, bytes) in insertion
/// order; after each insert, the oldest go until both limits hold again
/// (never the newest).
struct CappedModel {
    docs: std::collections::VecDeque<(i32, u64)>,
    size: u64,
    max: Option<u64>,
}

impl CappedModel {
    fn bytes(&self) -> u64 {
        self.docs.iter().map(|(_, b)| b).sum()
    }

    fn insert(&mut self, id: i32, bytes: u64) {
        self.docs.push_back((id, bytes));
        while self.docs.len() > 1
            && (self.bytes() > self.size || self.max.is_some_and(|m| self.docs.len() as u64 > m))
        {
            self.docs.pop_front();
        }
    }
}

#[derive(Debug, Clone)]
enum CapOp {
    /// Documents of these padding lengths, one insert command.
    Insert(Vec<usize>),
    /// Change the padding of the n-th document (updates never trim).
    Pad(usize, usize),
    Delete(usize),
}

fn cap_op() -> impl Strategy<Value = CapOp> {
    prop_oneof![
        6 => proptest::collection::vec(0usize..1500, 1..4).prop_map(CapOp::Insert),
        2 => (0usize..20, 0usize..1500).prop_map(|(i, p)| CapOp::Pad(i, p)),
        1 => (0usize..20).prop_map(CapOp::Delete),
    ]
}

fn bson_len(d: &Document) -> u64 {
    let mut v = Vec::new();
    d.to_writer(&mut v).expect("encode");
    v.len() as u64
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    /// Random inserts (single and batched), updates and deletes on a capped
    /// collection with random `size` and `max`: after every step its
    /// documents in `$natural` order are the model's, and `size` is
    /// MongoDB's rounding of the requested one.
    #[test]
    fn capped_collections_keep_what_the_model_keeps(
        size in prop_oneof![Just(1u64), Just(4096u64), Just(5000u64), Just(9000u64)],
        max in proptest::option::of(0u64..12),
        ops in proptest::collection::vec(cap_op(), 1..40),
    ) {
        let db = Database::in_memory();
        // As `create` parses them (rounding `size`, `max: 0` is no limit).
        let mut options = CollectionOptions::default();
        options.set("capped", &Bson::Boolean(true)).expect("capped");
        options.set("size", &Bson::Int64(size as i64)).expect("size");
        if let Some(n) = max {
            options.set("max", &Bson::Int64(n as i64)).expect("max");
        }
        db.create_collection_with("k", options).expect("create");
        let c = db.collection("k");
        let rounded = c.options().expect("options").capped_size.expect("size");
        prop_assert_eq!(rounded, if size <= 4096 { 4096 } else { size.div_ceil(256) * 256 });
        let max = max.filter(|n| *n > 0);
        let mut m = CappedModel { docs: Default::default(), size: rounded, max };
        let mut next = 0i32;
        for op in &ops {
            match op {
                CapOp::Insert(pads) => {
                    let docs: Vec<Document> = pads.iter().map(|p| {
                        next += 1;
                        doc! {"_id": next, "pad": "p".repeat(*p)}
                    }).collect();
                    for d in &docs {
                        m.insert(d.get_i32("_id").expect("_id"), bson_len(d));
                    }
                    c.insert_many(docs, true).expect("insert");
                }
                CapOp::Pad(n, p) => {
                    if m.docs.is_empty() {
                        continue;
                    }
                    let at = n % m.docs.len();
                    let id = m.docs[at].0;
                    let new = doc! {"_id": id, "pad": "p".repeat(*p)};
                    m.docs[at].1 = bson_len(&new);
                    c.update_one(doc! {"_id": id}, doc! {"$set": {"pad": "p".repeat(*p)}}).expect("update");
                }
                CapOp::Delete(n) => {
                    if m.docs.is_empty() {
                        continue;
                    }
                    let at = n % m.docs.len();
                    let (id, _) = m.docs.remove(at).expect("in range");
                    prop_assert_eq!(c.delete_one(doc! {"_id": id}).expect("delete"), 1);
                }
            }
            let natural: Vec<i32> = c
                .find(doc! {})
                .hint(doc! {"$natural": 1})
                .run()
                .expect("scan")
                .iter()
                .map(|d| d.get_i32("_id").expect("_id"))
                .collect();
            let want: Vec<i32> = m.docs.iter().map(|(id, _)| *id).collect();
            prop_assert_eq!(&natural, &want, "after {:?}", op);
            let stats = c.stats().expect("stats");
            prop_assert_eq!(stats.data_bytes, m.bytes(), "after {:?}", op);
        }
        c.check_invariants().map_err(TestCaseError::fail)?;
    }
}
