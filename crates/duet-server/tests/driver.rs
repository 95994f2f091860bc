//! The official MongoDB Rust driver against an in-process `duet serve`.

mod common;

use common::TestServer;
use futures_util::TryStreamExt;
use mongodb::bson::{doc, Document};
use mongodb::options::ReturnDocument;
use mongodb::Client;

async fn client(s: &TestServer) -> Client {
    Client::with_uri_str(s.uri()).await.expect("client")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn crud_cursors_indexes_and_errors() {
    let s = TestServer::start(|_| {}).await;
    let c = client(&s).await;
    let db = c.database("rs");
    let coll = db.collection::<Document>("c");
    let docs: Vec<Document> = (0..1000).map(|i| doc! {"_id": i, "g": i % 10}).collect();
    let r = coll.insert_many(docs).await.expect("insert");
    assert_eq!(r.inserted_ids.len(), 1000);

    let all: Vec<Document> = coll
        .find(doc! {})
        .sort(doc! {"_id": 1})
        .batch_size(33)
        .await
        .expect("find")
        .try_collect()
        .await
        .expect("collect");
    assert_eq!(all.len(), 1000);
    assert_eq!(all[999].get_i32("_id").expect("_id"), 999);

    assert_eq!(
        coll.count_documents(doc! {"g": 3}).await.expect("count"),
        100
    );
    assert_eq!(coll.estimated_document_count().await.expect("est"), 1000);
    let u = coll
        .update_many(doc! {"g": 3}, doc! {"$set": {"seen": true}})
        .await
        .expect("update");
    assert_eq!((u.matched_count, u.modified_count), (100, 100));
    let d = coll.delete_many(doc! {"g": 9}).await.expect("delete");
    assert_eq!(d.deleted_count, 100);
    let after = coll
        .find_one_and_update(doc! {"_id": 1}, doc! {"$inc": {"g": 100}})
        .return_document(ReturnDocument::After)
        .await
        .expect("fam")
        .expect("doc");
    assert_eq!(after.get_i32("g").expect("g"), 101);
    let vals = coll
        .distinct("g", doc! {"_id": {"$lt": 5}})
        .await
        .expect("distinct");
    assert_eq!(vals.len(), 5);

    let idx = mongodb::IndexModel::builder()
        .keys(doc! {"g": 1})
        .options(
            mongodb::options::IndexOptions::builder()
                .unique(false)
                .build(),
        )
        .build();
    assert_eq!(
        coll.create_index(idx).await.expect("index").index_name,
        "g_1"
    );
    let names = coll.list_index_names().await.expect("names");
    assert_eq!(names, vec!["_id_".to_string(), "g_1".to_string()]);

    let dup = coll
        .insert_one(doc! {"_id": 5})
        .await
        .expect_err("duplicate");
    match *dup.kind {
        mongodb::error::ErrorKind::Write(mongodb::error::WriteFailure::WriteError(ref e)) => {
            assert_eq!(e.code, 11000)
        }
        ref other => panic!("unexpected error {other:?}"),
    }
    let unknown = db
        .run_command(doc! {"frobnicate": 1})
        .await
        .expect_err("unknown");
    match *unknown.kind {
        mongodb::error::ErrorKind::Command(ref e) => assert_eq!(e.code, 59),
        ref other => panic!("unexpected error {other:?}"),
    }

    let mut names = db.list_collection_names().await.expect("collections");
    names.sort();
    assert_eq!(names, vec!["c".to_string()]);
    coll.drop().await.expect("drop");
    s.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn snapshot_session_sees_one_state() {
    let s = TestServer::start(|_| {}).await;
    let c = client(&s).await;
    let coll = c.database("rs").collection::<Document>("snap");
    let docs: Vec<Document> = (0..200).map(|i| doc! {"i": i}).collect();
    coll.insert_many(docs).await.expect("insert");
    let mut session = c.start_session().snapshot(true).await.expect("session");
    let first = coll
        .count_documents(doc! {})
        .session(&mut session)
        .await
        .expect("count");
    coll.insert_one(doc! {"i": -1}).await.expect("insert");
    let again = coll
        .count_documents(doc! {})
        .session(&mut session)
        .await
        .expect("count");
    assert_eq!(first, 200);
    assert_eq!(again, 200);
    assert_eq!(coll.count_documents(doc! {}).await.expect("live"), 201);
    drop(session);
    s.shutdown().await;
}

/// The engine's count of live reads by the strategy that ran
/// (`serverStatus.duet.reads`).
async fn live_reads(c: &Client) -> Document {
    let status = c
        .database("admin")
        .run_command(doc! {"serverStatus": 1})
        .await
        .expect("serverStatus");
    status
        .get_document("duet")
        .and_then(|d| d.get_document("reads"))
        .expect("duet.reads")
        .clone()
}

/// `$duet: {snapshot: <strategy>}` through the official driver: a `count`
/// runs exactly the requested strategy (one live read, counted under it and
/// nowhere else) and its explain reports it. A server that fell back to its
/// held snapshot or to `auto` fails here.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn count_runs_the_requested_strategy() {
    const STRATEGIES: [&str; 4] = ["none", "vls", "cow", "olcp"];
    let s = TestServer::start(|_| {}).await;
    let c = client(&s).await;
    let db = c.database("strategies");
    let docs: Vec<Document> = (0..50).map(|i| doc! {"_id": i, "v": i}).collect();
    db.collection::<Document>("c")
        .insert_many(docs)
        .await
        .expect("insert");
    for strategy in STRATEGIES {
        let count =
            doc! {"count": "c", "query": {"v": {"$gte": 10}}, "$duet": {"snapshot": strategy}};
        let before = live_reads(&c).await;
        let r = db.run_command(count.clone()).await.expect("count");
        let after = live_reads(&c).await;
        assert_eq!(r.get_i64("n").expect("n"), 40, "{strategy}");
        for k in STRATEGIES {
            let moved = after.get_i64(k).expect(k) - before.get_i64(k).expect(k);
            assert_eq!(
                moved,
                i64::from(k == strategy),
                "{strategy}: {k} moved {moved}"
            );
        }
        let e = db
            .run_command(doc! {"explain": count})
            .await
            .expect("explain");
        let e = e.get_document("duet").expect("duet");
        assert_eq!(e.get_str("strategy").ok(), Some(strategy), "{e:?}");
        assert_eq!(e.get_str("strategyReason").ok(), Some("requested"), "{e:?}");
    }
    s.shutdown().await;
}

/// Point writes (inserts, statements by one `_id`) run in place on the
/// connection's worker thread (`connection.rs::is_point_write`). With two
/// workers and many more connections writing at once, every write lands
/// exactly once, and another connection's commands keep being answered
/// while they run: a worker blocked in a write has handed its other tasks
/// away. The timeout turns a starved or deadlocked runtime into a failure.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn point_writes_in_place_from_many_connections() {
    const CLIENTS: i64 = 24;
    const EACH: i64 = 60;
    let s = TestServer::start(|_| {}).await;
    let c = client(&s).await;
    let coll = c.database("inplace").collection::<Document>("c");
    let pinger = Client::with_uri_str(s.uri()).await.expect("pinger");
    let work = async {
        let writers: Vec<_> = (0..CLIENTS)
            .map(|t| {
                let coll = coll.clone();
                tokio::spawn(async move {
                    for i in 0..EACH {
                        let id = t * 1000 + i;
                        coll.insert_one(doc! {"_id": id, "n": 0})
                            .await
                            .expect("insert");
                        coll.update_one(doc! {"_id": id}, doc! {"$inc": {"n": 1}})
                            .await
                            .expect("update");
                        coll.find_one_and_update(doc! {"_id": id}, doc! {"$inc": {"n": 1}})
                            .await
                            .expect("findAndModify");
                        if i % 3 == 0 {
                            let d = coll.delete_one(doc! {"_id": id}).await.expect("delete");
                            assert_eq!(d.deleted_count, 1);
                        }
                    }
                })
            })
            .collect();
        let mut pings = 0u32;
        let admin = pinger.database("admin");
        while writers.iter().any(|w| !w.is_finished()) {
            admin.run_command(doc! {"ping": 1}).await.expect("ping");
            pings += 1;
        }
        for w in writers {
            w.await.expect("writer");
        }
        pings
    };
    let pings = tokio::time::timeout(std::time::Duration::from_secs(120), work)
        .await
        .expect("writes and pings finished");
    assert!(pings > 0);
    let kept = CLIENTS * (EACH - (EACH + 2) / 3);
    assert_eq!(
        coll.count_documents(doc! {}).await.expect("count"),
        kept as u64
    );
    assert_eq!(
        coll.count_documents(doc! {"n": 2}).await.expect("count n"),
        kept as u64
    );
    s.shutdown().await;
}
