//! Delta indexing (docs/design.md "Delta indexing"): a model test of the
//! index views against a plain reference, the snapshot checker with delta
//! indexing on, and checkpoint/recovery of indexes with delta layers.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use bson::{doc, Bson, Document};
use duetdb::check::{self, CheckConfig};
use duetdb::structures::{CollectionState, IndexKey, IndexState};
use duetdb::{Database, DbOptions, DeltaOptions, IndexOptions, IndexRead, Strategy};

/// Small layers: cuts, merges, installs and back-pressure all happen within
/// a few dozen writes.
const SMALL: DeltaOptions = DeltaOptions {
    on: true,
    merge_at: 4,
    max_active: 12,
};

struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// An index's entries as comparable values: (key document, record id).
fn entries<'a>(
    it: impl Iterator<Item = &'a (IndexKey, u64)>,
    ix: &IndexState,
) -> Vec<(Document, u64)> {
    it.map(|(k, rid)| (k.to_document(&ix.spec), *rid)).collect()
}

fn fresh(ix: &IndexState) -> Vec<(Document, u64)> {
    entries(ix.iter().map(|(e, _)| e), ix)
}

fn stale(ix: &IndexState) -> Vec<(Document, u64)> {
    entries(ix.tree.iter().map(|(e, _)| e), ix)
}

fn coll(db: &Database) -> CollectionState {
    db.snapshot()
        .state()
        .collection("c")
        .cloned()
        .expect("collection c")
}

fn a_of(d: &Document) -> Option<i64> {
    d.get_i64("a").ok()
}

/// Random inserts, updates (moving keys of a unique, a compound multikey
/// and a hashed index), deletes and multi-document updates through the
/// writer with delta indexing on, checked after every write:
/// - every published version satisfies the collection invariants over
///   the fresh view (each index holds exactly its records' keys);
/// - each eligible index's stale view (its merged tree alone) equals its
///   fresh view at some earlier published version;
/// - unique violations are refused exactly when the reference has a holder;
/// - a fresh find through each index equals the reference, a stale one
///   returns only matching documents, each at most once.
#[test]
fn fresh_and_stale_views_follow_a_reference() {
    for seed in 1..=4u64 {
        let db = Database::with_options(
            "t",
            None,
            DbOptions {
                delta: SMALL,
                ..DbOptions::default()
            },
        );
        let c = db.collection("c");
        c.create_index(
            doc! {"a": 1},
            IndexOptions {
                unique: true,
                ..Default::default()
            },
        )
        .expect("unique index");
        c.create_index(doc! {"b": 1, "x": -1}, IndexOptions::default())
            .expect("compound index");
        c.create_index(doc! {"h": "hashed"}, IndexOptions::default())
            .expect("hashed index");
        let mut rng = Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1);
        let mut model: BTreeMap<i64, Document> = BTreeMap::new();
        // Fresh views of each eligible index at every published version.
        // (The empty indexes are the first.)
        let mut history: Vec<Vec<Vec<(Document, u64)>>> = vec![vec![Vec::new(); 2]];
        let mut next_id = 0i64;
        let mut refused = 0;
        for step in 0..400 {
            let pick = rng.below(10);
            let b: Bson = if rng.below(3) == 0 {
                Bson::Array(vec![
                    Bson::Int64(rng.below(6) as i64),
                    Bson::Int64(rng.below(6) as i64),
                ])
            } else {
                Bson::Int64(rng.below(6) as i64)
            };
            let a = rng.below(60) as i64;
            let x = rng.below(4) as i64;
            let holder = |m: &BTreeMap<i64, Document>, a: i64, except: Option<i64>| {
                m.iter()
                    .any(|(id, d)| Some(*id) != except && a_of(d) == Some(a))
            };
            match pick {
                0..=3 => {
                    let d = doc! {"_id": next_id, "a": a, "b": b, "x": x, "h": x};
                    let got = c.insert_one(d.clone());
                    if holder(&model, a, None) {
                        assert!(
                            got.is_err(),
                            "seed {seed} step {step}: duplicate a={a} accepted"
                        );
                        refused += 1;
                    } else {
                        got.expect("insert");
                        model.insert(next_id, d);
                    }
                    next_id += 1;
                }
                4..=6 if !model.is_empty() => {
                    let id = *model
                        .keys()
                        .nth(rng.below(model.len() as u64) as usize)
                        .expect("id");
                    let got = c.update_one(
                        doc! {"_id": id},
                        doc! {"$set": {"a": a, "b": b.clone(), "h": x}},
                    );
                    if holder(&model, a, Some(id)) {
                        assert!(
                            got.is_err(),
                            "seed {seed} step {step}: duplicate a={a} by update"
                        );
                        refused += 1;
                    } else {
                        got.expect("update");
                        let d = model.get_mut(&id).expect("doc");
                        d.insert("a", a);
                        d.insert("b", b);
                        d.insert("h", x);
                    }
                }
                7 if !model.is_empty() => {
                    let id = *model
                        .keys()
                        .nth(rng.below(model.len() as u64) as usize)
                        .expect("id");
                    c.delete_one(doc! {"_id": id}).expect("delete");
                    model.remove(&id);
                }
                _ => {
                    // Move `x` of every document with b == v: many index
                    // changes in one command.
                    let v = rng.below(6) as i64;
                    c.update_many(doc! {"b": v}, doc! {"$inc": {"x": 1}})
                        .expect("update many");
                    for d in model.values_mut() {
                        let hit = match d.get("b") {
                            Some(Bson::Int64(n)) => *n == v,
                            Some(Bson::Array(xs)) => xs.contains(&Bson::Int64(v)),
                            _ => false,
                        };
                        if hit {
                            let n = d.get_i64("x").expect("x") + 1;
                            d.insert("x", n);
                        }
                    }
                }
            }
            let state = coll(&db);
            state
                .check_invariants()
                .unwrap_or_else(|e| panic!("seed {seed} step {step}: {e}"));
            assert_eq!(state.len(), model.len());
            let eligible: Vec<&IndexState> = state
                .indexes
                .iter()
                .filter(|i| i.delta_eligible())
                .collect();
            assert!(
                state
                    .indexes
                    .iter()
                    .filter(|i| !i.delta_eligible())
                    .all(|i| !i.has_delta()),
                "an ineligible index got delta layers"
            );
            history.push(eligible.iter().map(|i| fresh(i)).collect());
            for (n, ix) in eligible.iter().enumerate() {
                let s = stale(ix);
                assert!(
                    history.iter().any(|h| h[n] == s),
                    "seed {seed} step {step}: stale view of {} is no earlier fresh view",
                    ix.spec.name
                );
            }
            if step % 25 == 0 {
                let snap = db.snapshot();
                for filter in [
                    doc! {"a": {"$gte": 10, "$lt": 40}},
                    doc! {"b": {"$in": [1i64, 3]}},
                    doc! {"b": 2i64, "x": {"$gte": 1}},
                ] {
                    let mut want: Vec<i64> = model
                        .iter()
                        .filter(|(_, d)| matches(d, &filter))
                        .map(|(id, _)| *id)
                        .collect();
                    want.sort_unstable();
                    let ids = |docs: Vec<Document>| {
                        let mut v: Vec<i64> = docs
                            .iter()
                            .map(|d| d.get_i64("_id").expect("_id"))
                            .collect();
                        v.sort_unstable();
                        v
                    };
                    let got = ids(snap
                        .collection("c")
                        .find(filter.clone())
                        .run()
                        .expect("fresh find"));
                    assert_eq!(got, want, "seed {seed} step {step}: fresh find {filter}");
                    let live = ids(c.find(filter.clone()).run().expect("live find"));
                    assert_eq!(live, want, "seed {seed} step {step}: live find {filter}");
                    let old = ids(snap
                        .collection("c")
                        .with_index_read(IndexRead::Stale)
                        .find(filter.clone())
                        .run()
                        .expect("stale find"));
                    let mut dedup = old.clone();
                    dedup.dedup();
                    assert_eq!(dedup, old, "a stale find returned a document twice");
                    assert!(
                        old.iter().all(|id| want.contains(id)),
                        "stale find {filter}: {old:?} not within {want:?}"
                    );
                    let live_old = ids(c
                        .find(filter.clone())
                        .index_read(IndexRead::Stale)
                        .run()
                        .expect("live stale find"));
                    assert!(live_old.iter().all(|id| want.contains(id)));
                }
            }
        }
        assert!(refused > 0, "seed {seed}: no duplicate was tried");
        // The merger ran, its merges were installed, and back-pressure
        // folded some cuts on the writer. Wait for the merges to finish
        // (not for `delta_busy`: finished merges wait for the next write to
        // be installed, so it stays true until the insert below).
        let deadline = Instant::now() + Duration::from_secs(60);
        while Instant::now() < deadline {
            let s = db.delta_stats();
            if s.merged >= s.cuts {
                break;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        c.insert_one(doc! {"_id": -1i64, "a": -1i64})
            .expect("a write installs finished merges");
        let s = db.delta_stats();
        assert!(s.cuts > 0 && s.merged > 0 && s.installed > 0, "{s:?}");
        // Switched off: the next group folds every layer.
        db.set_delta_indexing(DeltaOptions::default());
        c.insert_one(doc! {"_id": -2i64, "a": -2i64})
            .expect("write");
        let state = coll(&db);
        assert!(state.indexes.iter().all(|i| !i.has_delta()));
        state.check_invariants().expect("invariants after folding");
    }
}

/// The reference's filter: the three shapes the model test uses.
fn matches(d: &Document, filter: &Document) -> bool {
    let num = |k: &str| d.get_i64(k).ok();
    let bs: Vec<i64> = match d.get("b") {
        Some(Bson::Int64(n)) => vec![*n],
        Some(Bson::Array(xs)) => xs.iter().filter_map(Bson::as_i64).collect(),
        _ => vec![],
    };
    if filter.contains_key("a") {
        return num("a").is_some_and(|a| (10..40).contains(&a));
    }
    match filter.get("b") {
        Some(Bson::Document(_)) => bs.iter().any(|b| *b == 1 || *b == 3),
        _ => bs.contains(&2) && num("x").is_some_and(|x| x >= 1),
    }
}

/// Without delta indexing nothing has layers and stale reads are fresh.
#[test]
fn off_by_default_writes_the_trees() {
    let db = Database::in_memory();
    let c = db.collection("c");
    c.create_index(doc! {"a": 1}, IndexOptions::default())
        .expect("index");
    for i in 0..50i64 {
        c.insert_one(doc! {"_id": i, "a": i}).expect("insert");
    }
    let state = coll(&db);
    assert!(state.indexes.iter().all(|i| !i.has_delta()));
    let n = c
        .find(doc! {"a": {"$gte": 0}})
        .index_read(IndexRead::Stale)
        .run()
        .expect("find")
        .len();
    assert_eq!(n, 50);
}

/// A checkpoint taken while indexes have delta layers writes their fresh
/// views: the reopened database (loaded from the checkpoint, nothing to
/// replay) has the same documents and index entries.
#[test]
fn checkpoint_captures_delta_layers() {
    let dir = tempfile::tempdir().expect("tempdir");
    let before: Vec<Vec<(Document, u64)>>;
    let docs_before;
    {
        let db = Database::open(dir.path()).expect("open");
        db.set_delta_indexing(DeltaOptions {
            on: true,
            merge_at: 1_000_000,
            max_active: 1_000_000,
        });
        let c = db.collection("c");
        c.create_index(
            doc! {"a": 1},
            IndexOptions {
                unique: true,
                ..Default::default()
            },
        )
        .expect("index");
        c.create_index(doc! {"b": 1, "a": -1}, IndexOptions::default())
            .expect("index");
        for i in 0..300i64 {
            c.insert_one(doc! {"_id": i, "a": i, "b": [i % 7, i % 5]})
                .expect("insert");
        }
        for i in (0..300i64).step_by(3) {
            c.update_one(doc! {"_id": i}, doc! {"$set": {"a": 1000 + i, "b": i % 11}})
                .expect("update");
        }
        c.delete_many(doc! {"a": {"$lt": 50}}).expect("delete");
        let state = coll(&db);
        assert!(
            state.indexes.iter().all(|i| i.delta_len() > 0),
            "the layers hold the changes (nothing merged)"
        );
        before = state.indexes.iter().map(fresh).collect();
        docs_before = c.find(doc! {}).run().expect("docs");
        db.checkpoint().expect("checkpoint").expect("written");
    }
    let db = Database::open(dir.path()).expect("reopen");
    let state = coll(&db);
    state.check_invariants().expect("invariants after recovery");
    let after: Vec<Vec<(Document, u64)>> = state.indexes.iter().map(fresh).collect();
    assert!(state.indexes.iter().all(|i| !i.has_delta()));
    assert_eq!(
        after.iter().map(Vec::len).collect::<Vec<_>>(),
        before.iter().map(Vec::len).collect::<Vec<_>>()
    );
    // Record ids may be renumbered at load: compare keys, and documents.
    let keys = |v: &Vec<Vec<(Document, u64)>>| {
        v.iter()
            .map(|i| i.iter().map(|(k, _)| k.clone()).collect::<Vec<_>>())
            .collect::<Vec<_>>()
    };
    assert_eq!(keys(&after), keys(&before));
    assert_eq!(
        db.collection("c").find(doc! {}).run().expect("docs"),
        docs_before
    );
}

/// The snapshot checker passes with delta indexing on, under every
/// strategy that must be exact (small layers: merges land mid-scan).
#[test]
fn snapshot_checker_passes_with_delta_indexing() {
    for strategy in [Strategy::Vls, Strategy::Cow, Strategy::Olcp] {
        let cfg = CheckConfig {
            strategy,
            scans: 3,
            writers: 2,
            docs: 800,
            scans_per_round: 6,
            rounds: 4,
            max_duration: Duration::from_secs(600),
            seed: 7,
            slots: 64,
            stop_on_violation: false,
            index: check::CheckIndex::Plain,
            delta_indexing: true,
        };
        let report = check::run(&cfg, |_| {});
        assert_eq!(report.violations, 0, "{strategy}: {:?}", report.examples);
        assert!(report.scans_checked > 0);
    }
}
