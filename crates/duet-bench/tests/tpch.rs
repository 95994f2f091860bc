//! TPC-H Q1, Q4 and Q17 through `olcp_query` against the reference evaluation:
//! on a static copy, under answer-neutral concurrent updates (exact equality
//! with the static answer, exactly-once counts), and under answer-changing
//! concurrent updates (exact equality with the reference evaluated on a model
//! rebuilt from the update log up to the query's `start_csn`).

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;

use bson::{doc, Bson, Document};
use duet_bench::chbench::{self, Scale, ORDERS, ORDER_LINE};
use duet_bench::tpch::{self, Q17Params};
use duetdb::Database;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

const SF: f64 = 0.02;
const SEED: u64 = 11;

fn loaded() -> (Database, chbench::Loaded) {
    let db = Database::in_memory();
    let scale = Scale::new(SF).expect("scale");
    let loaded = chbench::load(&db, &scale, SEED).expect("load");
    (db, loaded)
}

/// Brand and container of the part of the first order line (so Q17 selects something).
fn q17_params(items: &[Document], lines: &[Document]) -> Q17Params {
    let part = lines[0].get_i64("ol_i_id").expect("ol_i_id");
    let it = items
        .iter()
        .find(|d| d.get_i64("_id").ok() == Some(part))
        .expect("item");
    Q17Params {
        brand: it.get_str("i_brand").expect("brand").into(),
        container: it.get_str("i_container").expect("container").into(),
    }
}

#[test]
fn queries_match_the_static_evaluation() {
    let (db, loaded) = loaded();
    let (items, orders, lines) = tpch::static_copy(&db.snapshot()).expect("copy");
    assert_eq!(lines.len() as u64, loaded.order_lines);
    let p17 = q17_params(&items, &lines);
    for threads in [1, 3] {
        let (q1, r1) = tpch::q1_olcp(&db, threads).expect("q1");
        let want1 = tpch::reference_q1(&lines);
        assert_eq!(q1, want1);
        assert!(q1.len() >= 3, "{q1:?}");
        let n1: u64 = want1.values().map(|g| g.count_order).sum();
        assert_eq!(r1.from_table + r1.propagated_mapped, n1);

        let (q4, r4) = tpch::q4_olcp(&db, threads).expect("q4");
        assert_eq!(q4, tpch::reference_q4(&orders, &lines));
        assert!(q4.values().sum::<u64>() > 0, "{q4:?}");
        assert!(r4.from_table > 0);

        let (q17, _) = tpch::q17_olcp(&db, &p17, threads).expect("q17");
        assert_eq!(q17, tpch::reference_q17(&items, &lines, &p17));
        assert!(q17.parts >= 1, "{q17:?}");
    }
}

/// Runs `updates` on a thread while `queries` runs on this one.
fn with_updates<T>(
    db: &Database,
    updates: impl Fn(&Database, &mut StdRng) + Send + Sync,
    queries: impl FnOnce() -> T,
) -> T {
    let stop = AtomicBool::new(false);
    std::thread::scope(|s| {
        let h = s.spawn(|| {
            let mut rng = StdRng::seed_from_u64(99);
            let mut n = 0u64;
            while !stop.load(Ordering::Relaxed) || n < 200 {
                updates(db, &mut rng);
                n += 1;
            }
            n
        });
        let out = queries();
        stop.store(true, Ordering::Relaxed);
        let n = h.join().expect("updater");
        assert!(n >= 200);
        out
    })
}

#[test]
fn answer_neutral_updates_leave_results_exact() {
    let (db, loaded) = loaded();
    let (items, orders, lines) = tpch::static_copy(&db.snapshot()).expect("copy");
    let p17 = q17_params(&items, &lines);
    let (want1, want4, want17) = (
        tpch::reference_q1(&lines),
        tpch::reference_q4(&orders, &lines),
        tpch::reference_q17(&items, &lines, &p17),
    );
    let n1: u64 = want1.values().map(|g| g.count_order).sum();
    let orders_n = loaded.orders as i64;
    let mut propagated = 0;
    with_updates(
        &db,
        |db, rng| {
            let o = rng.gen_range(0..orders_n);
            let key = o * chbench::LINES_PER_KEY + 1; // every order has line 1
            let note = format!("{:n>24}", rng.gen::<u32>());
            db.collection(ORDER_LINE)
                .update_one(doc! {"_id": key}, doc! {"$set": {"ol_note": note}})
                .expect("update line");
            db.collection(ORDERS)
                .update_one(doc! {"_id": o}, doc! {"$set": {"o_comment": "touched"}})
                .expect("update order");
        },
        || {
            for round in 0..4 {
                let threads = 1 + round % 2;
                let (q1, r1) = tpch::q1_olcp(&db, threads).expect("q1");
                assert_eq!(q1, want1, "round {round}");
                // Exactly once: every start-snapshot line in range mapped once.
                assert_eq!(r1.from_table + r1.propagated_mapped, n1);
                propagated += r1.propagated;
                let (q4, r4) = tpch::q4_olcp(&db, threads).expect("q4");
                assert_eq!(q4, want4, "round {round}");
                propagated += r4.propagated;
                let (q17, r17) = tpch::q17_olcp(&db, &p17, threads).expect("q17");
                assert_eq!(q17, want17, "round {round}");
                assert_eq!(r17.from_table + r17.propagated_mapped, loaded.order_lines);
                propagated += r17.propagated;
            }
        },
    );
    eprintln!("versions propagated to the queries: {propagated}");
}

/// One logged update: (commit csn, collection, _id, field, value).
type Log = Vec<(u64, &'static str, i64, &'static str, Bson)>;

fn model_at(base: &[Document], log: &Log, coll: &str, csn: u64) -> Vec<Document> {
    let mut by_id: HashMap<i64, Document> = base
        .iter()
        .map(|d| (d.get_i64("_id").expect("_id"), d.clone()))
        .collect();
    for (c, name, id, field, value) in log {
        if *c <= csn && *name == coll {
            if let Some(d) = by_id.get_mut(id) {
                d.insert(*field, value.clone());
            }
        }
    }
    let mut v: Vec<Document> = by_id.into_values().collect();
    v.sort_by_key(|d| d.get_i64("_id").unwrap_or(0));
    v
}

#[test]
fn answer_changing_updates_match_the_start_snapshot() {
    let (db, loaded) = loaded();
    let base_snap = db.snapshot();
    let (items, orders, lines) = tpch::static_copy(&base_snap).expect("copy");
    let p17 = q17_params(&items, &lines);
    let orders_n = loaded.orders as i64;
    let log: Mutex<Log> = Mutex::new(Vec::new());
    let results = with_updates(
        &db,
        |db, rng| {
            let o = rng.gen_range(0..orders_n);
            let line = o * chbench::LINES_PER_KEY + 1;
            let mut logged: Log = Vec::new();
            let pick = rng.gen_range(0..3);
            let (coll, field, value): (&'static str, &'static str, Bson) = match pick {
                0 => (
                    ORDER_LINE,
                    "ol_quantity",
                    Bson::Int64(rng.gen_range(1..=50)),
                ),
                1 => (
                    ORDER_LINE,
                    "ol_receiptdate_day",
                    Bson::Int64(rng.gen_range(0..=chbench::LAST_ENTRY_DAY + 150)),
                ),
                _ => (
                    ORDERS,
                    "o_orderpriority",
                    Bson::String(chbench::PRIORITIES[rng.gen_range(0..5)].into()),
                ),
            };
            let id = if coll == ORDERS { o } else { line };
            let r = db
                .collection(coll)
                .update_one(doc! {"_id": id}, doc! {"$set": {field: value.clone()}})
                .expect("update");
            assert_eq!(r.matched, 1);
            logged.push((duetdb::last_commit_csn(), coll, id, field, value));
            log.lock().expect("log").extend(logged);
        },
        || {
            let mut out = Vec::new();
            for round in 0..4 {
                let threads = 1 + round % 2;
                let q1 = tpch::q1_olcp(&db, threads).expect("q1");
                let q4 = tpch::q4_olcp(&db, threads).expect("q4");
                let q17 = tpch::q17_olcp(&db, &p17, threads).expect("q17");
                out.push((q1, q4, q17));
            }
            out
        },
    );
    let log = log.into_inner().expect("log");
    assert!(log.iter().all(|e| e.0 > base_snap.csn()));
    let mut changed = 0;
    for (round, ((q1, r1), (q4, r4), (q17, r17))) in results.into_iter().enumerate() {
        let l1 = model_at(&lines, &log, ORDER_LINE, r1.start_csn);
        assert_eq!(q1, tpch::reference_q1(&l1), "Q1 round {round}");
        let l4 = model_at(&lines, &log, ORDER_LINE, r4.start_csn);
        let o4 = model_at(&orders, &log, ORDERS, r4.start_csn);
        assert_eq!(q4, tpch::reference_q4(&o4, &l4), "Q4 round {round}");
        let l17 = model_at(&lines, &log, ORDER_LINE, r17.start_csn);
        assert_eq!(
            q17,
            tpch::reference_q17(&items, &l17, &p17),
            "Q17 round {round}"
        );
        if q1 != tpch::reference_q1(&lines) {
            changed += 1;
        }
    }
    // The updates did change the answers (the check is not vacuous).
    assert!(changed > 0);
}

/// Q1 written as an aggregation pipeline: the engine runs its commutative part
/// (`$match` + `$group`) as an OLCP query and must agree exactly with the
/// hand-written `olcp_query` version.
#[test]
fn q1_as_an_aggregation_pipeline_equals_the_olcp_query() {
    let (db, _) = loaded();
    let (expected, _) = tpch::q1_olcp(&db, 2).expect("q1 olcp");
    let pipeline = vec![
        doc! {"$match": {"ol_shipdate_day": {"$lte": tpch::Q1_CUTOFF_DAY}}},
        doc! {"$group": {
            "_id": {"rf": "$ol_returnflag", "ls": "$ol_linestatus"},
            "sum_qty": {"$sum": "$ol_quantity"},
            "sum_base_price": {"$sum": "$ol_extendedprice_cents"},
            "sum_disc_price": {"$sum": {"$multiply": [
                "$ol_extendedprice_cents", {"$subtract": [100, "$ol_discount_pct"]}]}},
            "sum_charge": {"$sum": {"$multiply": [
                "$ol_extendedprice_cents",
                {"$subtract": [100, "$ol_discount_pct"]},
                {"$add": [100, "$ol_tax_pct"]}]}},
            "sum_disc": {"$sum": "$ol_discount_pct"},
            "count_order": {"$sum": 1},
        }},
        doc! {"$sort": {"_id.rf": 1, "_id.ls": 1}},
    ];
    let coll = db.collection(ORDER_LINE);
    let (rows, explain) = coll
        .aggregate_with(pipeline, duetdb::Strategy::Auto)
        .expect("pipeline");
    assert_eq!(
        explain.strategy,
        duetdb::Strategy::Olcp,
        "Q1's scan part is commutative"
    );
    assert_eq!(rows.len(), expected.len());
    let num = |d: &Document, f: &str| -> i128 {
        match d.get(f) {
            Some(Bson::Int32(v)) => i128::from(*v),
            Some(Bson::Int64(v)) => i128::from(*v),
            other => panic!("{f}: {other:?}"),
        }
    };
    for row in &rows {
        let id = row.get_document("_id").expect("_id");
        let key = (
            id.get_str("rf").expect("rf").to_string(),
            id.get_str("ls").expect("ls").to_string(),
        );
        let g = expected.get(&key).expect("group present in both");
        assert_eq!(num(row, "sum_qty"), i128::from(g.sum_qty), "{key:?}");
        assert_eq!(
            num(row, "sum_base_price"),
            i128::from(g.sum_base_price_cents)
        );
        assert_eq!(num(row, "sum_disc_price"), g.sum_disc_price_centicents);
        assert_eq!(num(row, "sum_charge"), g.sum_charge_cents_e4);
        assert_eq!(num(row, "sum_disc"), i128::from(g.sum_discount_pct));
        assert_eq!(num(row, "count_order"), i128::from(g.count_order));
    }
}

/// Q1, Q4 and Q17 as ordinary pipelines (`$lookup` joins) give the OLCP
/// versions' exact answers under every strategy; their scan parts are
/// commutative, so `auto` runs them as OLCP, and the joined collection is
/// read at the scan's csn.
#[test]
fn pipelines_match_the_olcp_versions_under_every_strategy() {
    use duet_bench::tpch::{Answer, Query};
    use duet_bench::tpch_pipeline::run_pipeline;
    use duetdb::Strategy;
    let (db, _) = loaded();
    let (items, _, lines) = tpch::static_copy(&db.snapshot()).expect("copy");
    let p17 = q17_params(&items, &lines);
    let olcp = [
        Answer::Q1(tpch::q1_olcp(&db, 2).expect("q1").0),
        Answer::Q4(tpch::q4_olcp(&db, 2).expect("q4").0),
        Answer::Q17(tpch::q17_olcp(&db, &p17, 2).expect("q17").0),
    ];
    for (query, want) in Query::ALL.into_iter().zip(&olcp) {
        for s in [
            Strategy::Auto,
            Strategy::Cow,
            Strategy::Vls,
            Strategy::Olcp,
            Strategy::None,
        ] {
            let (got, explain) = run_pipeline(&db, query, s, &p17).expect("pipeline");
            assert_eq!(&got, want, "{query:?} under {s:?}");
            assert_eq!(explain.foreign_csn, Some(explain.start_csn));
            if s == Strategy::Auto {
                assert!(explain.olcp_eligible, "{query:?}");
                assert_eq!(explain.strategy, Strategy::Olcp, "{query:?}");
            }
        }
    }
    if let Answer::Q4(q4) = &olcp[1] {
        assert!(q4.values().sum::<u64>() > 0);
    }
    if let Answer::Q17(q17) = &olcp[2] {
        assert!(q17.parts >= 1);
    }
}

/// The pipelines stay exact while answer-neutral updates run (OLCP hands
/// superseded versions over; the joined collection is pinned at the start).
#[test]
fn pipelines_stay_exact_under_answer_neutral_updates() {
    use duet_bench::tpch::{Answer, Query};
    use duet_bench::tpch_pipeline::run_pipeline;
    use duetdb::Strategy;
    let (db, loaded) = loaded();
    let (items, orders, lines) = tpch::static_copy(&db.snapshot()).expect("copy");
    let p17 = q17_params(&items, &lines);
    let want = [
        Answer::Q1(tpch::reference_q1(&lines)),
        Answer::Q4(tpch::reference_q4(&orders, &lines)),
        Answer::Q17(tpch::reference_q17(&items, &lines, &p17)),
    ];
    let orders_n = loaded.orders as i64;
    with_updates(
        &db,
        |db, rng| {
            let o = rng.gen_range(0..orders_n);
            let key = o * chbench::LINES_PER_KEY + 1;
            db.collection(ORDER_LINE)
                .update_one(doc! {"_id": key}, doc! {"$set": {"ol_note": "n"}})
                .expect("update line");
            db.collection(ORDERS)
                .update_one(doc! {"_id": o}, doc! {"$set": {"o_comment": "touched"}})
                .expect("update order");
        },
        || {
            for s in [Strategy::Auto, Strategy::Vls] {
                for (query, want) in Query::ALL.into_iter().zip(&want) {
                    let (got, _) = run_pipeline(&db, query, s, &p17).expect("pipeline");
                    assert_eq!(&got, want, "{query:?} under {s:?}");
                }
            }
        },
    );
}
