//! The `_id` point-lookup fast path (`Find::id_hack`, MongoDB's IDHACK): a
//! find of `{_id: <scalar>}` skips parsing, planning and the walk, and must
//! answer exactly as the general path does. The general path is reached with
//! the same predicate spelled `{_id: {$eq: v}}`, which the fast path leaves
//! alone: same documents (the stored ones, not copies), same plan, strategy
//! and reason, same read and `$indexStats` counts, same errors.

use std::sync::Arc;

use duetdb::bson::{doc, oid::ObjectId, Binary, Bson, DateTime, Decimal128, Document, Timestamp};
use duetdb::{
    CancelReason, CancelToken, Collator, CollectionOptions, Database, Error, FindOutcome, Strategy,
};

fn ids() -> Vec<Bson> {
    vec![
        Bson::Int32(1),
        Bson::Int64(2),
        Bson::Double(3.5),
        Bson::String("ada".into()),
        Bson::String("a string longer than thirty bytes, held boxed".into()),
        Bson::ObjectId(ObjectId::from_bytes([7; 12])),
        Bson::Boolean(true),
        Bson::DateTime(DateTime::from_millis(1_700_000_000_000)),
        Bson::Timestamp(Timestamp {
            time: 5,
            increment: 6,
        }),
        Bson::Decimal128("7.25".parse::<Decimal128>().expect("decimal")),
        Bson::Binary(Binary {
            subtype: duetdb::bson::spec::BinarySubtype::Generic,
            bytes: vec![1, 2, 3],
        }),
        Bson::Document(doc! {"k": 1}),
        Bson::Null,
    ]
}

/// Probes: every stored id, numeric spellings of stored numbers, and
/// values stored nowhere.
fn probes() -> Vec<Bson> {
    let mut p = ids();
    p.extend([
        Bson::Double(1.0),
        Bson::Int64(1),
        Bson::Int32(2),
        Bson::Decimal128("2".parse::<Decimal128>().expect("decimal")),
        Bson::Double(f64::NAN),
        Bson::Int64(99),
        Bson::String("ADA".into()),
        Bson::String("missing".into()),
        Bson::Boolean(false),
        Bson::ObjectId(ObjectId::from_bytes([8; 12])),
    ]);
    p
}

fn loaded(db: &Database, name: &str) -> duetdb::Collection {
    let c = db.collection(name);
    for (i, id) in ids().into_iter().enumerate() {
        c.insert_one(doc! {"_id": id, "i": i as i64})
            .expect("insert");
    }
    c
}

fn same_outcome(fast: &FindOutcome, general: &FindOutcome, what: &str) {
    assert_eq!(fast.docs.len(), general.docs.len(), "{what}");
    for (a, b) in fast.docs.iter().zip(&general.docs) {
        assert!(Arc::ptr_eq(a, b), "{what}: not the stored document");
    }
    assert_eq!(fast.scan.strategy, general.scan.strategy, "{what}");
    assert_eq!(fast.scan.reason, general.scan.reason, "{what}");
    // A live scan (`vls`) starts at a csn of its own; a root read at the
    // version it holds.
    if fast.scan.strategy == Strategy::Cow {
        assert_eq!(fast.scan.start_csn, general.scan.start_csn, "{what}");
    }
    assert_eq!(
        fast.scan.plan.summary(),
        general.scan.plan.summary(),
        "{what}"
    );
    assert_eq!(
        format!("{:?}", fast.scan.plan.access),
        format!("{:?}", general.scan.plan.access),
        "{what}"
    );
}

fn eq(v: &Bson) -> Document {
    doc! {"_id": {"$eq": v.clone()}}
}

#[test]
fn id_lookups_answer_as_the_general_path() {
    let db = Database::in_memory();
    let c = loaded(&db, "t");
    let snap = db.snapshot();
    let held = snap.collection("t");
    for v in probes() {
        let fast = doc! {"_id": v.clone()};
        let what = format!("{fast}");
        // The latest state and a held snapshot; every way to read a find.
        same_outcome(
            &c.find(fast.clone()).run_detailed().expect("fast"),
            &c.find(eq(&v)).run_detailed().expect("general"),
            &what,
        );
        same_outcome(
            &held.find(fast.clone()).run_detailed().expect("fast"),
            &held.find(eq(&v)).run_detailed().expect("general"),
            &what,
        );
        assert_eq!(
            c.find(fast.clone()).run().expect("fast"),
            c.find(eq(&v)).run().expect("general"),
            "{what}"
        );
        assert_eq!(
            c.find_one(fast.clone()).expect("fast"),
            c.find_one(eq(&v)).expect("general"),
            "{what}"
        );
        let stream: Vec<_> = c
            .find(fast.clone())
            .limit(1)
            .stream()
            .expect("fast")
            .map(|d| d.expect("doc"))
            .collect();
        assert_eq!(stream, c.find(eq(&v)).raw().expect("general"), "{what}");
        // A projection is applied as on the general path.
        assert_eq!(
            c.find(fast.clone())
                .projection(doc! {"i": 0})
                .run()
                .expect("fast"),
            c.find(eq(&v))
                .projection(doc! {"i": 0})
                .run()
                .expect("general"),
            "{what}"
        );
        // Skip and an explicit live strategy take the general path; their
        // answers still agree.
        assert_eq!(
            c.find(fast.clone()).skip(1).raw().expect("fast").len(),
            0,
            "{what}"
        );
        for strategy in [Strategy::Vls, Strategy::Olcp, Strategy::None, Strategy::Cow] {
            let run = |filter: Document| {
                c.find(filter)
                    .snapshot(strategy)
                    .run_detailed()
                    .expect("find")
            };
            same_outcome(&run(fast.clone()), &run(eq(&v)), &what);
        }
    }
    // Writes after the snapshot are invisible to it, visible to the latest.
    c.delete_one(doc! {"_id": 1}).expect("delete");
    c.insert_one(doc! {"_id": 42, "i": 42}).expect("insert");
    assert_eq!(held.find(doc! {"_id": 1}).raw().expect("held").len(), 1);
    assert_eq!(held.find(doc! {"_id": 42}).raw().expect("held").len(), 0);
    assert_eq!(c.find(doc! {"_id": 1}).raw().expect("latest").len(), 0);
    assert_eq!(c.find(doc! {"_id": 42}).raw().expect("latest").len(), 1);
    // A collection that does not exist.
    let none = db.collection("absent");
    same_outcome(
        &none.find(doc! {"_id": 1}).run_detailed().expect("fast"),
        &none
            .find(eq(&Bson::Int32(1)))
            .run_detailed()
            .expect("general"),
        "absent collection",
    );
}

#[test]
fn id_lookups_count_reads_and_index_use_as_the_general_path() {
    let db = Database::in_memory();
    let c = loaded(&db, "t");
    let id_ops = |c: &duetdb::Collection| c.index_usage()[0].1;
    for v in probes() {
        let (reads, ops) = (db.read_stats(), id_ops(&c));
        c.find(eq(&v)).raw().expect("general");
        let (general_reads, general_ops) = (db.read_stats(), id_ops(&c));
        c.find(doc! {"_id": v.clone()}).raw().expect("fast");
        let (fast_reads, fast_ops) = (db.read_stats(), id_ops(&c));
        assert_eq!(general_ops - ops, fast_ops - general_ops, "{v}");
        assert_eq!(general_ops - ops, 1, "{v}");
        assert_eq!(general_reads.cow - reads.cow, 1, "{v}");
        assert_eq!(fast_reads.cow - general_reads.cow, 1, "{v}");
        assert_eq!(fast_reads.vls, reads.vls, "{v}");
    }
}

#[test]
fn collated_string_ids_and_cancelled_lookups_agree_with_the_general_path() {
    let ci = doc! {"locale": "en", "strength": 2};
    let db = Database::in_memory();
    db.create_collection_with(
        "p",
        CollectionOptions {
            collation: Collator::from_document(&ci).expect("collation"),
            ..Default::default()
        },
    )
    .expect("create");
    let p = loaded(&db, "p");
    let simple = loaded(&db, "s");
    for v in probes() {
        let fast = doc! {"_id": v.clone()};
        // The collection's default collation.
        same_outcome(
            &p.find(fast.clone()).run_detailed().expect("fast"),
            &p.find(eq(&v)).run_detailed().expect("general"),
            &format!("collated collection: {fast}"),
        );
        // A handle's collation.
        let handle = simple.clone().with_collation(Some(ci.clone()));
        same_outcome(
            &handle.find(fast.clone()).run_detailed().expect("fast"),
            &handle.find(eq(&v)).run_detailed().expect("general"),
            &format!("collated handle: {fast}"),
        );
    }
    // Under a case-insensitive collation "ADA" finds "ada"; without, not.
    assert_eq!(p.find(doc! {"_id": "ADA"}).raw().expect("p").len(), 1);
    assert_eq!(simple.find(doc! {"_id": "ADA"}).raw().expect("s").len(), 0);
    // A cancelled read fails as the general path does.
    let token = CancelToken::new();
    token.cancel(CancelReason::Killed);
    for filter in [doc! {"_id": 1}, eq(&Bson::Int32(1))] {
        let err = simple
            .find(filter.clone())
            .cancel(token.clone())
            .raw()
            .expect_err("cancelled");
        assert!(matches!(err, Error::Interrupted(_)), "{filter}: {err:?}");
    }
}
