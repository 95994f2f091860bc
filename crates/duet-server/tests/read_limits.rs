//! Work never outlives its request (issue #14 item 9) and blocking sorts are
//! bounded (item 12), over the wire:
//! - `maxTimeMS` answers 50 and the command's work has stopped by then (the
//!   server lists it in flight until its engine call returned);
//! - `killOp` interrupts a running command (11601), a closed connection
//!   cancels its command, shutdown cancels commands in flight (11600);
//! - a sort over `--query-memory-limit-bytes` fails with 292 under
//!   `allowDiskUse: false` and spills otherwise; `$group` refuses (292).

mod common;

use std::time::Duration;

use bson::{doc, Bson, Document};
use common::TestServer;
use mongodb::{Client, Database};
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;

async fn client(s: &TestServer) -> Client {
    Client::with_uri_str(s.uri()).await.expect("client")
}

fn code(e: mongodb::error::Error) -> i32 {
    match *e.kind {
        mongodb::error::ErrorKind::Command(ref c) => c.code,
        ref other => panic!("not a command error: {other:?}"),
    }
}

/// A collection of `n` small documents.
async fn load(db: &Database, n: i32) {
    let c = db.collection::<Document>("c");
    let docs: Vec<Document> = (0..n)
        .map(|i| doc! {"_id": i, "k": (i * 7919) % 1000, "pad": "p".repeat(40)})
        .collect();
    for chunk in docs.chunks(10_000) {
        c.insert_many(chunk.to_vec()).await.expect("insert");
    }
}

/// A count that takes `n` ms uncancelled (`$duet.workNsPerDoc` of 1 ms).
fn slow_count() -> Document {
    doc! {"count": "c", "query": {}, "$duet": {"workNsPerDoc": 1_000_000}}
}

async fn status(admin: &Database) -> Document {
    let s = admin
        .run_command(doc! {"serverStatus": 1})
        .await
        .expect("serverStatus");
    s.get_document("duet")
        .expect("duet")
        .get_document("operations")
        .expect("operations")
        .clone()
}

/// Operations in flight other than the `currentOp` asking.
async fn others_in_flight(admin: &Database) -> Vec<Document> {
    let r = admin
        .run_command(doc! {"currentOp": 1})
        .await
        .expect("currentOp");
    r.get_array("inprog")
        .expect("inprog")
        .iter()
        .filter_map(|v| v.as_document().cloned())
        .filter(|op| {
            !op.get_document("command")
                .is_ok_and(|c| c.contains_key("currentOp"))
        })
        .collect()
}

/// Wait (bounded) until `cond` holds; the bound is far above what a working
/// server needs and far below what the uncancelled work would take.
async fn eventually<F, Fut>(mut cond: F) -> bool
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    for _ in 0..100 {
        if cond().await {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    false
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn max_time_ms_answers_50_after_the_work_stopped() {
    let s = TestServer::start(|c| c.enable_test_knobs = true).await;
    let c = client(&s).await;
    let db = c.database("lim");
    let admin = c.database("admin");
    // 1000 documents of 2000 numbers: $unwind makes 2 M rows to sort and group.
    let big = db.collection::<Document>("big");
    let docs: Vec<Document> = (0..1000)
        .map(
            |i| doc! {"_id": i, "xs": (0..2000).map(|j| (i * 31 + j) % 9973).collect::<Vec<i32>>()},
        )
        .collect();
    for chunk in docs.chunks(100) {
        big.insert_many(chunk.to_vec()).await.expect("insert");
    }
    load(&db, 20_000).await;
    let before = status(&admin).await;
    let sort_group = doc! {
        "aggregate": "big",
        "pipeline": [
            {"$unwind": "$xs"},
            {"$sort": {"xs": 1}},
            {"$group": {"_id": "$xs", "n": {"$sum": 1}}},
        ],
        "cursor": {},
        "maxTimeMS": 100,
    };
    for cmd in [
        sort_group,
        doc! {"count": "c", "query": {}, "$duet": {"workNsPerDoc": 1_000_000}, "maxTimeMS": 100},
        doc! {"count": "c", "query": {"k": {"$gte": 0}}, "$duet": {"snapshot": "vls", "workNsPerDoc": 1_000_000}, "maxTimeMS": 100},
        doc! {"count": "c", "query": {"k": {"$gte": 0}}, "$duet": {"snapshot": "olcp", "workNsPerDoc": 1_000_000}, "maxTimeMS": 100},
    ] {
        let e = db.run_command(cmd.clone()).await.expect_err("too slow");
        assert_eq!(code(e), 50, "{cmd}");
        // The reply came after the command's engine call returned: nothing
        // of it is still running.
        let left = others_in_flight(&admin).await;
        assert!(left.is_empty(), "{cmd}: still in flight {left:?}");
    }
    let after = status(&admin).await;
    assert!(
        after.get_i64("finishedAfterCancel").expect("n")
            >= before.get_i64("finishedAfterCancel").expect("n") + 4
    );
    // The server and its VLS slots are fine afterwards.
    let n = db
        .run_command(doc! {"count": "c", "query": {"k": {"$gte": 0}}, "$duet": {"snapshot": "vls"}})
        .await
        .expect("count");
    assert_eq!(n.get_i64("n").expect("n"), 20_000);
    s.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_op_interrupts_a_running_command() {
    let s = TestServer::start(|c| c.enable_test_knobs = true).await;
    let c = client(&s).await;
    let db = c.database("lim");
    let admin = c.database("admin");
    load(&db, 20_000).await;
    let running = {
        let db = db.clone();
        tokio::spawn(async move { db.run_command(slow_count()).await })
    };
    let mut opid = None;
    for _ in 0..100 {
        let ops = admin
            .run_command(doc! {"currentOp": 1, "command.count": "c"})
            .await
            .expect("currentOp");
        let inprog = ops.get_array("inprog").expect("inprog");
        if let Some(Bson::Document(op)) = inprog.first() {
            assert_eq!(op.get_str("ns").expect("ns"), "lim.c");
            assert!(op.get_i64("microsecs_running").expect("micros") >= 0);
            opid = Some(op.get("opid").cloned().expect("opid"));
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let opid = opid.expect("the count shows in currentOp");
    // killOp runs on admin only.
    let e = db
        .run_command(doc! {"killOp": 1, "op": opid.clone()})
        .await
        .expect_err("not admin");
    assert_eq!(code(e), 13);
    let r = admin
        .run_command(doc! {"killOp": 1, "op": opid})
        .await
        .expect("killOp");
    assert_eq!(r.get_str("info").expect("info"), "attempting to kill op");
    let e = running.await.expect("join").expect_err("killed");
    assert_eq!(code(e), 11601);
    assert!(others_in_flight(&admin).await.is_empty());
    // An unknown op id is not an error (as in MongoDB).
    admin
        .run_command(doc! {"killOp": 1, "op": 987_654_321i64})
        .await
        .expect("unknown op");
    let e = admin
        .run_command(doc! {"killOp": 1})
        .await
        .expect_err("no op");
    assert_eq!(code(e), 2);
    s.shutdown().await;
}

fn op_msg(d: &Document) -> Vec<u8> {
    let mut p = 0u32.to_le_bytes().to_vec();
    p.push(0);
    d.to_writer(&mut p).expect("encode");
    let mut v = Vec::new();
    v.extend(((16 + p.len()) as i32).to_le_bytes());
    v.extend(1i32.to_le_bytes());
    v.extend(0i32.to_le_bytes());
    v.extend(2013i32.to_le_bytes());
    v.extend(p);
    v
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_closed_connection_cancels_its_command() {
    let s = TestServer::start(|c| c.enable_test_knobs = true).await;
    let c = client(&s).await;
    let db = c.database("lim");
    let admin = c.database("admin");
    load(&db, 20_000).await;
    let before = status(&admin).await.get_i64("killed").expect("killed");
    let mut raw = TcpStream::connect(s.addr).await.expect("connect");
    let mut cmd = slow_count();
    cmd.insert("$db", "lim");
    raw.write_all(&op_msg(&cmd)).await.expect("send");
    assert!(
        eventually(|| async { !others_in_flight(&admin).await.is_empty() }).await,
        "the count never started"
    );
    drop(raw);
    assert!(
        eventually(|| async { others_in_flight(&admin).await.is_empty() }).await,
        "the count outlived its connection"
    );
    assert!(status(&admin).await.get_i64("killed").expect("killed") > before);
    s.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_interrupts_commands_in_flight() {
    let s = TestServer::start(|c| {
        c.shutdown_grace = Duration::from_secs(30);
        c.enable_test_knobs = true;
    })
    .await;
    let c = client(&s).await;
    let db = c.database("lim");
    let admin = c.database("admin");
    load(&db, 20_000).await;
    let running = {
        let db = db.clone();
        tokio::spawn(async move { db.run_command(slow_count()).await })
    };
    assert!(
        eventually(|| async { !others_in_flight(&admin).await.is_empty() }).await,
        "the count never started"
    );
    // With a 30 s grace and 20 s of work, only cancellation ends this in time.
    tokio::time::timeout(Duration::from_secs(10), s.shutdown())
        .await
        .expect("shutdown waited for the command instead of cancelling it");
    let e = running.await.expect("join").expect_err("interrupted");
    assert_eq!(code(e), 11600);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sorts_over_the_memory_limit_spill_or_fail_with_292() {
    let s = TestServer::start(|c| c.query_memory_limit_bytes = 64 * 1024).await;
    let c = client(&s).await;
    let db = c.database("lim");
    let admin = c.database("admin");
    load(&db, 5_000).await;
    let p = admin
        .run_command(doc! {"getParameter": 1, "internalQueryMaxBlockingSortMemoryUsageBytes": 1, "allowDiskUseByDefault": 1})
        .await
        .expect("getParameter");
    assert_eq!(
        p.get_i64("internalQueryMaxBlockingSortMemoryUsageBytes")
            .expect("limit"),
        64 * 1024
    );
    assert!(p.get_bool("allowDiskUseByDefault").expect("default"));
    let find = |extra: Document| {
        let mut d = doc! {"find": "c", "sort": {"pad": 1, "k": -1, "_id": 1}, "batchSize": 5000};
        d.extend(extra);
        d
    };
    let first_batch = |r: Document| -> Vec<i32> {
        r.get_document("cursor")
            .expect("cursor")
            .get_array("firstBatch")
            .expect("batch")
            .iter()
            .map(|d| d.as_document().expect("doc").get_i32("_id").expect("_id"))
            .collect()
    };
    let e = db
        .run_command(find(doc! {"allowDiskUse": false}))
        .await
        .expect_err("over the limit");
    assert_eq!(code(e), 292);
    let e = db
        .run_command(find(doc! {"allowDiskUse": 1}))
        .await
        .expect_err("not a bool");
    assert_eq!(code(e), 14);
    let spilled = |st: Document| {
        st.get_document("duet")
            .and_then(|d| d.get_document("spill"))
            .and_then(|d| d.get_i64("runs"))
            .expect("spill runs")
    };
    let runs = spilled(
        admin
            .run_command(doc! {"serverStatus": 1})
            .await
            .expect("status"),
    );
    let sorted = first_batch(db.run_command(find(doc! {})).await.expect("spilling find"));
    assert_eq!(sorted.len(), 5_000);
    let mut want: Vec<(i32, i32)> = (0..5_000).map(|i| (-((i * 7919) % 1000), i)).collect();
    want.sort();
    assert_eq!(sorted, want.iter().map(|(_, i)| *i).collect::<Vec<_>>());
    assert!(
        spilled(
            admin
                .run_command(doc! {"serverStatus": 1})
                .await
                .expect("status")
        ) > runs
    );
    // A limit makes it a top-k: no memory problem.
    let top = first_batch(
        db.run_command(find(doc! {"allowDiskUse": false, "limit": 7}))
            .await
            .expect("top-k"),
    );
    assert_eq!(top, sorted[..7].to_vec());
    // Aggregate: $sort spills or refuses; $group refuses either way.
    let agg = |pipeline: Vec<Document>, allow: bool| {
        doc! {"aggregate": "c", "pipeline": pipeline, "cursor": {"batchSize": 5000}, "allowDiskUse": allow}
    };
    let sort = vec![doc! {"$sort": {"pad": 1, "k": -1, "_id": 1}}];
    let e = db
        .run_command(agg(sort.clone(), false))
        .await
        .expect_err("aggregate over the limit");
    assert_eq!(code(e), 292);
    db.run_command(agg(sort, true))
        .await
        .expect("aggregate spills");
    // $group spills with allowDiskUse (issue #17), 292 without.
    let group = vec![doc! {"$group": {"_id": "$_id", "pad": {"$push": "$pad"}}}];
    let e = db
        .run_command(agg(group.clone(), false))
        .await
        .expect_err("group over the limit");
    assert_eq!(code(e), 292);
    db.run_command(agg(group, true))
        .await
        .expect("group spills");
    s.shutdown().await;

    // A server that does not allow disk use by default.
    let s = TestServer::start(|c| {
        c.query_memory_limit_bytes = 64 * 1024;
        c.allow_disk_use_by_default = false;
    })
    .await;
    let c = client(&s).await;
    let db = c.database("lim");
    load(&db, 5_000).await;
    let e = db.run_command(find(doc! {})).await.expect_err("no disk");
    assert_eq!(code(e), 292);
    db.run_command(find(doc! {"allowDiskUse": true}))
        .await
        .expect("opted in");
    s.shutdown().await;
}
