//! explain's execution counters (`ReadLimits::examined`): keys and documents
//! are counted as the read runs, on every path — a held snapshot's lazy walk,
//! the sorter's scan, and the live `cow`, `vls` and `none` scans — and equal
//! what each plan must examine.

use std::sync::Arc;

use duetdb::bson::doc;
use duetdb::lang::Examined;
use duetdb::{Database, IndexOptions, ReadLimits, Strategy};

fn seeded() -> duetdb::Collection {
    let db = Database::in_memory();
    let c = db.collection("c");
    let docs: Vec<_> = (0..200)
        .map(|i| doc! {"_id": i, "a": i % 10, "b": i})
        .collect();
    c.insert_many(docs, true).expect("seed");
    c.create_index(doc! {"a": 1}, IndexOptions::default())
        .expect("index");
    c
}

/// `(keys, docs, matched, returned)` of a find of `filter` read as `how`.
fn counted(
    c: &duetdb::Collection,
    filter: duetdb::bson::Document,
    how: Option<Strategy>,
) -> (u64, u64, u64, u64) {
    let counters = Arc::new(Examined::default());
    let limits = ReadLimits {
        examined: Some(counters.clone()),
        ..ReadLimits::default()
    };
    let returned = match how {
        None => c
            .database()
            .snapshot()
            .collection("c")
            .find(filter)
            .limits(limits)
            .stream(),
        Some(s) => c.find(filter).snapshot(s).limits(limits).stream(),
    }
    .expect("stream")
    .inspect(|d| assert!(d.is_ok(), "{d:?}"))
    .count() as u64;
    let (keys, docs, matched) = counters.get();
    (keys, docs, matched, returned)
}

#[test]
fn an_index_scan_counts_its_keys_and_fetches() {
    let c = seeded();
    // 20 keys of a = 3, each fetched and matched.
    assert_eq!(counted(&c, doc! {"a": 3}, None), (20, 20, 20, 20));
    assert_eq!(
        counted(&c, doc! {"a": 3}, Some(Strategy::Cow)),
        (20, 20, 20, 20)
    );
    // A VLS pass reads the same index entries (its index table pass).
    assert_eq!(
        counted(&c, doc! {"a": 3}, Some(Strategy::Vls)),
        (20, 20, 20, 20)
    );
    // A residual predicate: every key fetched, fewer match.
    assert_eq!(
        counted(&c, doc! {"a": 3, "b": {"$lt": 100}}, None),
        (20, 20, 10, 10)
    );
    // _id lookups are keys too.
    assert_eq!(
        counted(&c, doc! {"_id": {"$in": [1, 2, 999]}}, None),
        (2, 2, 2, 2)
    );
}

#[test]
fn a_collection_scan_counts_every_document_under_every_strategy() {
    let c = seeded();
    for how in [
        None,
        Some(Strategy::Cow),
        Some(Strategy::Vls),
        Some(Strategy::None),
    ] {
        let (keys, docs, matched, returned) = counted(&c, doc! {"b": {"$gte": 150}}, how);
        assert_eq!((keys, docs, matched, returned), (0, 200, 50, 50), "{how:?}");
    }
    // Even the empty filter is tested, so every document is counted.
    assert_eq!(counted(&c, doc! {}, None), (0, 200, 200, 200));
}

#[test]
fn counting_changes_no_answer() {
    let c = seeded();
    let plain: Vec<_> = c
        .find(doc! {"a": {"$in": [1, 2]}})
        .sort(doc! {"b": -1})
        .raw()
        .expect("find");
    let counters = Arc::new(Examined::default());
    let limits = ReadLimits {
        examined: Some(counters.clone()),
        ..ReadLimits::default()
    };
    let with: Vec<_> = c
        .find(doc! {"a": {"$in": [1, 2]}})
        .sort(doc! {"b": -1})
        .limits(limits)
        .raw()
        .expect("find");
    assert_eq!(plain, with);
    assert_eq!(counters.get(), (40, 40, 40));
}
