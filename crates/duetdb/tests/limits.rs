//! Reads under limits (issue #14, items 9, 10 and 12):
//! - a cancelled read stops within a page of work under every strategy, also
//!   when nothing it examines matches, and a cancelled VLS/OLCP scan leaves
//!   the status masks and the remset consistent for every later scan;
//! - a sort the plan does not provide is bounded by the memory limit: 292
//!   without disk use, spilled runs (same answer) with it, a top-k heap with
//!   a limit; `$group` is bounded too (292, never spilled);
//! - a find stream reads its snapshot page by page, holding a position, not
//!   the result.

use std::ops::ControlFlow;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use duetdb::bson::{doc, Bson, Document};
use duetdb::testing::wait_for;
use duetdb::{
    spill_stats, CancelReason, CancelToken, Collection, Database, IndexOptions, OlcpOptions,
    ReadLimits, Strategy,
};

/// Documents examined between two cancellation checks (the engine's page).
const PAGE: u64 = 256;

fn loaded(n: i32) -> (Database, Collection) {
    let db = Database::in_memory();
    let c = db.collection("t");
    c.insert_many(
        (0..n).map(|i| {
            doc! {
                "_id": i,
                "k": (i * 7919) % 1000,
                "rare": i % 1000 == 0,
                "pad": "x".repeat(60),
            }
        }),
        true,
    )
    .expect("insert");
    c.create_index(doc! {"idx": 1}, IndexOptions::default())
        .expect("index");
    (db, c)
}

fn limited(bytes: usize, disk: bool) -> ReadLimits {
    ReadLimits {
        memory_limit_bytes: bytes,
        allow_disk_use: disk,
        ..ReadLimits::default()
    }
}

fn ids(docs: &[Document]) -> Vec<i32> {
    docs.iter()
        .map(|d| d.get_i32("_id").expect("_id"))
        .collect()
}

/// Wait until no scan holds a slot (background resets included).
fn quiet(db: &Database) {
    assert!(
        wait_for(
            || db.vls_stats().scans_active == 0 && db.vls_stats().scans_queued == 0,
            Duration::from_secs(10)
        ),
        "a cancelled scan kept its slot: {:?}",
        db.vls_stats()
    );
}

#[test]
fn a_cancelled_scan_stops_within_a_page_under_every_strategy() {
    let (db, c) = loaded(20_000);
    for strategy in [Strategy::Cow, Strategy::None, Strategy::Vls, Strategy::Olcp] {
        let token = CancelToken::new();
        let limits = ReadLimits::with_cancel(token.clone());
        let (mut seen, mut after) = (0u64, 0u64);
        let r = c.scan_limited(doc! {}, strategy, &limits, |_| {
            seen += 1;
            if seen == 3000 {
                token.cancel(CancelReason::Killed);
            } else if seen > 3000 {
                after += 1;
            }
            ControlFlow::Continue(())
        });
        let e = r.expect_err("a cancelled scan fails");
        assert_eq!(
            (e.code(), e.code_name()),
            (11601, "Interrupted"),
            "{strategy}"
        );
        assert!(
            after <= PAGE,
            "{strategy}: {after} documents after the cancel"
        );
        quiet(&db);
    }
    // Every slot came back and every later scan is complete.
    for strategy in [Strategy::Vls, Strategy::Olcp, Strategy::None] {
        assert_eq!(c.count_with(doc! {}, strategy).expect("count"), 20_000);
        let mut n = 0;
        c.scan_with(doc! {"k": {"$gte": 0}}, strategy, |_| {
            n += 1;
            ControlFlow::Continue(())
        })
        .expect("scan");
        assert_eq!(n, 20_000, "{strategy}");
    }
    assert_eq!(db.vls_stats().remset.entries, 0);
    c.check_invariants().expect("invariants");
}

#[test]
fn cancellation_is_checked_per_document_examined_not_per_match() {
    let (db, c) = loaded(20_000);
    // One match in 1000 documents: the next match lies several pages after
    // the cancel, so a scan that checked only on matches would return more.
    for strategy in [Strategy::Cow, Strategy::None, Strategy::Vls, Strategy::Olcp] {
        let token = CancelToken::new();
        let limits = ReadLimits::with_cancel(token.clone());
        let mut matches = 0u64;
        let r = c.scan_limited(doc! {"rare": true}, strategy, &limits, |_| {
            matches += 1;
            token.cancel(CancelReason::Killed);
            ControlFlow::Continue(())
        });
        assert_eq!(r.expect_err("cancelled").code(), 11601, "{strategy}");
        assert_eq!(matches, 1, "{strategy}: matches visited after the cancel");
        quiet(&db);
    }
}

#[test]
fn a_passed_deadline_fails_every_read_with_50() {
    let (_db, c) = loaded(3_000);
    let past = || ReadLimits::with_cancel(CancelToken::with_deadline(Instant::now()));
    let is_50 = |r: duetdb::Error| assert_eq!((r.code(), r.code_name()), (50, "MaxTimeMSExpired"));
    for strategy in [Strategy::Cow, Strategy::Vls, Strategy::Olcp, Strategy::None] {
        is_50(
            c.count_limited(doc! {"k": {"$gte": 1}}, strategy, &past())
                .expect_err("count"),
        );
        is_50(
            c.distinct_limited("k", doc! {}, strategy, &past())
                .expect_err("distinct"),
        );
        is_50(
            c.find(doc! {})
                .snapshot(strategy)
                .sort(doc! {"k": 1})
                .limits(past())
                .raw()
                .expect_err("find"),
        );
        let sort_group = vec![
            doc! {"$match": {"k": {"$gte": 0}}},
            doc! {"$sort": {"k": 1}},
            doc! {"$group": {"_id": "$k", "n": {"$sum": 1}}},
        ];
        is_50(
            c.aggregate_limited(sort_group, strategy, &past())
                .expect_err("aggregate"),
        );
    }
    let snap = c.database().snapshot().collection("t");
    is_50(
        snap.aggregate_limited(vec![doc! {"$sort": {"k": -1}}], &past())
            .expect_err("snapshot aggregate"),
    );
    is_50(
        snap.find(doc! {})
            .limits(past())
            .stream()
            .expect("open")
            .find_map(|r| r.err())
            .expect("the stream fails"),
    );
}

#[test]
fn a_cancelled_olcp_query_maps_nothing_more_and_releases_its_slot() {
    let (db, c) = loaded(20_000);
    let stop = Arc::new(AtomicBool::new(false));
    let writer = {
        let c = c.clone();
        let stop = stop.clone();
        std::thread::spawn(move || {
            let mut i = 0;
            while !stop.load(Ordering::Relaxed) {
                c.update_one(doc! {"_id": i % 20_000}, doc! {"$inc": {"u": 1}})
                    .expect("update");
                i += 7;
            }
        })
    };
    for threads in [1, 3] {
        let token = CancelToken::new();
        let mapped = AtomicU64::new(0);
        let after = AtomicU64::new(0);
        let r = db.olcp_query_with(
            "t",
            &[],
            &[],
            || 0u64,
            |s, _, _| {
                *s += 1;
                let n = mapped.fetch_add(1, Ordering::SeqCst) + 1;
                if n == 2_000 {
                    token.cancel(CancelReason::Killed);
                } else if n > 2_000 {
                    after.fetch_add(1, Ordering::SeqCst);
                }
                Ok(())
            },
            |a, b| a + b,
            OlcpOptions { threads },
            &token,
        );
        assert_eq!(r.expect_err("cancelled").code(), 11601);
        let after = after.load(Ordering::SeqCst);
        assert!(
            after <= PAGE * threads as u64,
            "{after} documents mapped after the cancel on {threads} threads"
        );
        quiet(&db);
        // The next query maps every document exactly once.
        let (n, _) = db
            .olcp_query(
                "t",
                &[],
                &[],
                || 0u64,
                |s, _, _| {
                    *s += 1;
                    Ok(())
                },
                |a, b| a + b,
                OlcpOptions { threads },
            )
            .expect("olcp");
        assert_eq!(n, 20_000);
    }
    stop.store(true, Ordering::Relaxed);
    writer.join().expect("writer");
    quiet(&db);
    assert_eq!(db.vls_stats().remset.entries, 0);
    assert_eq!(db.vls_stats().olcp_inflight, 0);
}

/// Transfers keep Σ sign·balance at 0 at every commit; cancelled VLS and
/// OLCP scans run between complete ones, and every complete scan still sees
/// one consistent state with every account exactly once.
#[test]
fn cancelled_scans_leave_vls_state_consistent_under_concurrent_transfers() {
    let db = Database::in_memory();
    let accounts = db.collection("accounts");
    let n = 2_000i32;
    accounts
        .insert_many(
            (0..n)
                .map(|i| doc! {"_id": i, "sign": if i % 2 == 0 { 1 } else { -1 }, "balance": 1000}),
            true,
        )
        .expect("insert");
    let stop = Arc::new(AtomicBool::new(false));
    let writer = {
        let c = accounts.clone();
        let stop = stop.clone();
        std::thread::spawn(move || {
            let mut x = 0x9E37_79B9_7F4A_7C15u64;
            while !stop.load(Ordering::Relaxed) {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                let a = ((x % (n as u64 / 2)) * 2) as i32;
                let b = (((x >> 20) % (n as u64 / 2)) * 2 + 1) as i32;
                c.update_many(doc! {"_id": {"$in": [a, b]}}, doc! {"$inc": {"balance": 3}})
                    .expect("transfer");
            }
        })
    };
    let total = vec![
        doc! {"$group": {"_id": null, "t": {"$sum": {"$multiply": ["$sign", "$balance"]}}, "n": {"$sum": 1}}},
    ];
    for round in 0..40u64 {
        let strategy = if round % 2 == 0 {
            Strategy::Vls
        } else {
            Strategy::Olcp
        };
        // Cancel somewhere in the table pass.
        let token = CancelToken::new();
        let limits = ReadLimits::with_cancel(token.clone());
        let mut seen = 0u64;
        let stop_at = 1 + (round * 97) % (n as u64 - 1);
        let r = accounts.scan_limited(doc! {}, strategy, &limits, |_| {
            seen += 1;
            if seen == stop_at {
                token.cancel(CancelReason::Killed);
            }
            ControlFlow::Continue(())
        });
        if let Err(e) = r {
            assert_eq!(e.code(), 11601);
        }
        // A complete scan right after sees one state, every account once.
        let (out, _) = accounts
            .aggregate_with(total.clone(), strategy)
            .expect("aggregate");
        assert_eq!(
            out,
            vec![doc! {"_id": Bson::Null, "t": 0, "n": n}],
            "round {round}"
        );
    }
    stop.store(true, Ordering::Relaxed);
    writer.join().expect("writer");
    quiet(&db);
    assert_eq!(db.vls_stats().remset.entries, 0);
    accounts.check_invariants().expect("invariants");
}

#[test]
fn find_sort_is_bounded_by_the_memory_limit() {
    let (db, c) = loaded(5_000);
    c.create_index(doc! {"k": 1}, IndexOptions::default())
        .expect("index");
    let reference = c
        .find(doc! {})
        .sort(doc! {"pad": 1, "_id": -1})
        .run()
        .expect("unbounded");
    let snap = db.snapshot().collection("t");
    for strategy in [Strategy::Cow, Strategy::Vls, Strategy::None] {
        let find = || {
            c.find(doc! {})
                .snapshot(strategy)
                .sort(doc! {"pad": 1, "_id": -1})
        };
        // 5000 documents of ~100 bytes do not fit in 64 KB.
        let e = find()
            .limits(limited(64 * 1024, false))
            .run()
            .map(|d| d.len())
            .expect_err("over the limit");
        assert_eq!(
            (e.code(), e.code_name()),
            (292, "QueryExceededMemoryLimitNoDiskUseAllowed"),
            "{strategy}"
        );
        let before = spill_stats();
        let stream = find()
            .limits(limited(64 * 1024, true))
            .stream()
            .expect("spilling sort");
        assert!(stream.spilled_runs() > 1, "{strategy}: no spill");
        assert!(stream.held_bytes() < 2 * 64 * 1024 + 65 * 64 * 1024);
        let got: Vec<Document> = stream
            .map(|d| duetdb::raw::to_document(&d.expect("doc")).expect("convert"))
            .collect();
        assert_eq!(ids(&got), ids(&reference), "{strategy}");
        assert!(spill_stats().runs > before.runs);
        // A limit makes it a top-k: 10 documents fit.
        let top = find()
            .limit(10)
            .skip(3)
            .limits(limited(64 * 1024, false))
            .run()
            .expect("top-k");
        assert_eq!(ids(&top), ids(&reference)[3..13].to_vec(), "{strategy}");
    }
    // An index-provided order read from one root (`cow`, a held snapshot)
    // needs no sort memory at all. (Under `vls` the remset's versions come
    // after the table pass, so even an index scan is sorted afterwards.)
    for find in [c.find(doc! {}).snapshot(Strategy::Cow), snap.find(doc! {})] {
        let n = find
            .sort(doc! {"k": 1})
            .limits(limited(1, false))
            .raw()
            .map(|d| d.len());
        assert_eq!(n.ok(), Some(5_000));
    }
    let e = snap
        .find(doc! {})
        .sort(doc! {"pad": 1, "_id": -1})
        .limits(limited(64 * 1024, false))
        .run()
        .map(|d| d.len())
        .expect_err("held snapshot too");
    assert_eq!(e.code(), 292);
    let held = snap
        .find(doc! {})
        .sort(doc! {"pad": 1, "_id": -1})
        .limits(limited(64 * 1024, true))
        .run()
        .expect("held snapshot spills");
    assert_eq!(ids(&held), ids(&reference));
}

#[test]
fn aggregate_sort_and_group_spill_over_the_limit_or_refuse_without_disk_use() {
    let (db, c) = loaded(5_000);
    let sort = vec![
        doc! {"$match": {"k": {"$gte": 0}}},
        doc! {"$project": {"k": 1, "pad": 1}},
        doc! {"$sort": {"k": -1, "_id": 1}},
    ];
    let (reference, _) = c
        .aggregate_with(sort.clone(), Strategy::Cow)
        .expect("reference");
    assert_eq!(reference.len(), 5_000);
    let snap = db.snapshot().collection("t");
    for strategy in [Strategy::Cow, Strategy::Vls, Strategy::Olcp, Strategy::Auto] {
        let e = c
            .aggregate_limited(sort.clone(), strategy, &limited(64 * 1024, false))
            .map(|(d, _)| d.len())
            .expect_err("over the limit");
        assert_eq!(e.code(), 292, "{strategy}");
        let before = spill_stats();
        let (got, _) = c
            .aggregate_limited(sort.clone(), strategy, &limited(64 * 1024, true))
            .expect("spilled");
        assert_eq!(got, reference, "{strategy}");
        assert!(spill_stats().runs > before.runs, "{strategy}: no spill");
        // $sort + $limit keeps only skip + limit documents.
        let mut top = sort.clone();
        top.push(doc! {"$skip": 2});
        top.push(doc! {"$limit": 5});
        let (got, _) = c
            .aggregate_limited(top, strategy, &limited(64 * 1024, false))
            .expect("top-k");
        assert_eq!(got, reference[2..7].to_vec(), "{strategy}");
        // $group spills with disk use allowed (OLCP reruns as one ordered
        // scan) and answers what it answers in memory; 292 without.
        let group = vec![
            doc! {"$group": {"_id": "$_id", "pad": {"$push": "$pad"}, "k": {"$sum": "$k"}}},
            doc! {"$sort": {"_id": 1}},
        ];
        let (in_memory, _) = c
            .aggregate_with(group.clone(), strategy)
            .expect("in memory");
        assert_eq!(in_memory.len(), 5_000);
        let e = c
            .aggregate_limited(group.clone(), strategy, &limited(64 * 1024, false))
            .map(|(d, _)| d.len())
            .expect_err("group over the limit");
        assert_eq!(e.code(), 292, "{strategy}");
        assert!(e.to_string().contains("allowDiskUse:true"), "{e}");
        let before = spill_stats();
        let (got, explain) = c
            .aggregate_limited(group, strategy, &limited(64 * 1024, true))
            .expect("group spills");
        assert_eq!(got, in_memory, "{strategy}");
        assert!(explain.spills.group > 0, "{strategy}: {explain:?}");
        assert_eq!(explain.to_document().get_bool("usedDisk").ok(), Some(true));
        assert!(spill_stats().runs > before.runs, "{strategy}: no spill");
    }
    assert_eq!(
        snap.aggregate_limited(sort.clone(), &limited(64 * 1024, false))
            .map(|d| d.len())
            .expect_err("snapshot")
            .code(),
        292
    );
    assert_eq!(
        snap.aggregate_limited(sort, &limited(64 * 1024, true))
            .expect("snapshot spills"),
        reference
    );
}

#[cfg(unix)]
#[test]
fn spill_files_are_private_and_gone_after_the_query() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().expect("tempdir");
    let db = Database::open(dir.path()).expect("open");
    let c = db.collection("t");
    c.insert_many(
        (0..3_000).map(|i| doc! {"_id": i, "k": (i * 31) % 997, "pad": "y".repeat(80)}),
        true,
    )
    .expect("insert");
    let spill = db.spill_dir().expect("durable databases have one");
    assert_eq!(spill, dir.path().join("spill"));
    let mut stream = c
        .find(doc! {})
        .sort(doc! {"k": 1})
        .limits(limited(32 * 1024, true))
        .stream()
        .expect("spilling sort");
    assert!(stream.spilled_runs() > 0);
    let mode = std::fs::metadata(&spill)
        .expect("spill dir")
        .permissions()
        .mode()
        & 0o777;
    assert_eq!(mode, 0o700);
    // Runs are unlinked at creation: nothing to see even mid-query.
    assert_eq!(std::fs::read_dir(&spill).expect("list").count(), 0);
    assert!(stream.next().is_some());
    drop(stream);
    assert_eq!(std::fs::read_dir(&spill).expect("list").count(), 0);
    // A spilling $group writes its runs there too, and leaves nothing.
    let (groups, explain) = c
        .aggregate_limited(
            vec![doc! {"$group": {"_id": "$k", "ids": {"$push": "$_id"}}}],
            Strategy::Vls,
            &limited(32 * 1024, true),
        )
        .expect("spilling group");
    assert_eq!(groups.len(), 997);
    assert!(explain.spills.group > 0);
    assert_eq!(std::fs::read_dir(&spill).expect("list").count(), 0);
    // A file a crash left behind is removed when the database opens again.
    std::fs::write(spill.join("run-1-1"), b"left by a crash").expect("plant");
    drop(c);
    drop(db);
    let db = Database::open(dir.path()).expect("reopen");
    assert_eq!(std::fs::read_dir(&spill).expect("list").count(), 0);
    drop(db);
}

#[test]
fn a_find_stream_reads_its_snapshot_page_by_page() {
    let (db, c) = loaded(20_000);
    let snap = db.snapshot();
    let all = snap.collection("t").find(doc! {}).raw().expect("raw");
    let mut stream = snap.collection("t").find(doc! {}).stream().expect("stream");
    assert!(stream.is_streaming());
    let first: Vec<_> = stream.by_ref().take(10).map(|d| d.expect("doc")).collect();
    // It holds a position and at most a page, not the result.
    assert!(
        stream.held_bytes() < 64 * 1024,
        "a stream holds {} bytes",
        stream.held_bytes()
    );
    // Writes after the stream started are invisible to it.
    c.update_many(doc! {}, doc! {"$set": {"changed": true}})
        .expect("update");
    c.delete_many(doc! {"k": {"$lt": 500}}).expect("delete");
    let rest: Vec<_> = stream.map(|d| d.expect("doc")).collect();
    assert_eq!(first.len() + rest.len(), all.len());
    for (a, b) in first.iter().chain(rest.iter()).zip(all.iter()) {
        assert!(
            Arc::ptr_eq(a, b),
            "the stream must yield the snapshot's own documents"
        );
    }
    // Every access path streams the same answer as `raw`, skip and limit included.
    c.create_index(doc! {"k": 1}, IndexOptions::default())
        .expect("index");
    let snap = db.snapshot().collection("t");
    for (filter, sort) in [
        (doc! {"k": {"$gte": 100, "$lt": 700}}, None),
        (doc! {"k": {"$gte": 100}}, Some(doc! {"k": -1})),
        (doc! {"_id": {"$gte": 5}}, Some(doc! {"_id": -1})),
        (doc! {"_id": {"$in": [1, 5, 9, 20_000]}}, None),
        (doc! {"pad": {"$exists": true}}, Some(doc! {"pad": 1})),
    ] {
        for (skip, limit) in [(0, 0), (7, 0), (300, 1000)] {
            let f = || {
                let mut f = snap.find(filter.clone()).skip(skip).limit(limit);
                if let Some(s) = &sort {
                    f = f.sort(s.clone());
                }
                f
            };
            let want = f().raw().expect("raw");
            let got: Vec<_> = f()
                .stream()
                .expect("stream")
                .map(|d| d.expect("doc"))
                .collect();
            assert_eq!(got, want, "{filter} {sort:?} {skip} {limit}");
        }
    }
    // Live reads: `cow` streams from the root it took; `vls` is materialized.
    let live = c
        .find(doc! {})
        .snapshot(Strategy::Cow)
        .stream()
        .expect("cow");
    assert!(live.is_streaming());
    let vls = c
        .find(doc! {})
        .snapshot(Strategy::Vls)
        .stream()
        .expect("vls");
    assert!(!vls.is_streaming());
    assert_eq!(live.count(), vls.count());
    // A materialized result can be handed on as a stream too.
    let docs = snap.find(doc! {"k": 3}).raw().expect("raw");
    let from: Vec<_> = duetdb::FindStream::from_docs(docs.clone())
        .map(|d| d.expect("doc"))
        .collect();
    assert_eq!(from, docs);
    // A stream runs each batch under the token it is given.
    let mut s = snap.find(doc! {}).stream().expect("stream");
    assert!(s.next().is_some());
    let token = CancelToken::new();
    s.set_cancel(token.clone());
    token.cancel(CancelReason::ClientDisconnected);
    let errs: Vec<_> = s.by_ref().filter_map(|r| r.err()).collect();
    assert_eq!(errs.len(), 1);
    assert_eq!(errs[0].code(), 279);
    assert!(s.next().is_none());
}

/// A collection of `n` documents that all match `$text: {$search: "coffee"}`
/// (scores differ: 1 to 4 repeats), ~160 bytes each, with a text index.
fn text_loaded(n: i32) -> (Database, Collection) {
    let db = Database::in_memory();
    let c = db.collection("t");
    c.insert_many(
        (0..n).map(|i| {
            let words = vec!["coffee"; (i % 4 + 1) as usize].join(" ");
            doc! {"_id": i, "body": format!("{words} house {}", "x".repeat(100))}
        }),
        true,
    )
    .expect("insert");
    c.create_index_spec(&doc! {"key": {"body": "text"}})
        .expect("text index");
    (db, c)
}

/// Issue #18: `$text` reads stream the matches through the same bounded
/// execution as other reads: an unsorted find holds record ids and a
/// position, not documents; a sort by score (find or aggregate) is bounded by
/// the memory limit exactly as a sort: 292 without disk use, spilled runs
/// (same answer) with it, a top-k under a limit; an aggregate's `$limit`
/// ends the scan.
#[test]
fn text_reads_stream_or_are_bounded_by_the_memory_limit() {
    let n = 5_000;
    let (_db, c) = text_loaded(n);
    let search = doc! {"$text": {"$search": "coffee"}};
    let by_score = doc! {"s": {"$meta": "textScore"}};
    // Unsorted, with a limit: 10 documents read, the rest never fetched;
    // what the stream holds is the candidates' record ids (8 bytes each),
    // far below the documents' bytes.
    let limits = limited(64 * 1024, false);
    let mut stream = c
        .text_find_stream(
            &search,
            duetdb::TextFindOptions {
                limit: 10,
                ..Default::default()
            },
            &limits,
        )
        .expect("stream");
    assert!(!stream.ran_sort());
    let held_at_start = stream.held_bytes();
    assert!(held_at_start <= n as usize * 8, "{held_at_start}");
    let first: Vec<_> = stream.by_ref().take(10).map(|d| d.expect("doc")).collect();
    assert_eq!(ids(&first), (0..10).collect::<Vec<_>>());
    assert!(stream.next().is_none());
    // Without a limit, every match, in record order, read as pulled.
    let all = c
        .text_find_stream(&search, Default::default(), &limits)
        .expect("stream")
        .collect::<duetdb::Result<Vec<_>>>()
        .expect("all");
    assert_eq!(ids(&all), (0..n).collect::<Vec<_>>());
    // The order a sort by score gives: highest first, ties in record order.
    let mut want: Vec<i32> = (0..n).collect();
    want.sort_by_key(|i| std::cmp::Reverse(i % 4));
    let sorted_find = |limits: &ReadLimits, limit: u64| {
        c.text_find_stream(
            &search,
            duetdb::TextFindOptions {
                sort: Some(by_score.clone()),
                projection: Some(doc! {"_id": 1, "s": {"$meta": "textScore"}}),
                limit,
                ..Default::default()
            },
            limits,
        )
    };
    // 5000 documents of ~160 bytes do not fit in 64 KB: 292, as a sort.
    let e = sorted_find(&limited(64 * 1024, false), 0).expect_err("over the limit");
    assert_eq!(
        (e.code(), e.code_name()),
        (292, "QueryExceededMemoryLimitNoDiskUseAllowed")
    );
    let before = spill_stats();
    let stream = sorted_find(&limited(64 * 1024, true), 0).expect("spilling sort");
    assert!(stream.ran_sort());
    assert!(stream.spilled_runs() > 1, "no spill");
    let got = stream.collect::<duetdb::Result<Vec<_>>>().expect("sorted");
    assert_eq!(ids(&got), want);
    assert!(got[0].get_f64("s").expect("score") > got[n as usize - 1].get_f64("s").expect("s"));
    assert!(spill_stats().runs > before.runs);
    // A limit: a top-k of 10 fits.
    let top = sorted_find(&limited(64 * 1024, false), 10)
        .expect("top-k")
        .collect::<duetdb::Result<Vec<_>>>()
        .expect("top");
    assert_eq!(ids(&top), want[..10].to_vec());
    // Aggregate: a `$sort` on the score is bounded the same way.
    let pipeline = vec![
        doc! {"$match": search.clone()},
        doc! {"$sort": by_score.clone()},
        doc! {"$project": {"_id": 1}},
    ];
    let e = c
        .text_aggregate(&pipeline, &limited(64 * 1024, false), None, None)
        .expect_err("over the limit");
    assert_eq!(e.code(), 292);
    let before = spill_stats();
    let got = c
        .text_aggregate(&pipeline, &limited(64 * 1024, true), None, None)
        .expect("spilled");
    assert_eq!(ids(&got), want);
    assert!(spill_stats().runs > before.runs);
    // A `$limit` after the `$text` stage: 10 documents, under any limit.
    let got = c
        .text_aggregate(
            &[doc! {"$match": search.clone()}, doc! {"$limit": 10}],
            &limited(4 * 1024, false),
            None,
            None,
        )
        .expect("limited");
    assert_eq!(ids(&got), (0..10).collect::<Vec<_>>());
    assert_eq!(c.text_count(&search).expect("count"), n as u64);
}
