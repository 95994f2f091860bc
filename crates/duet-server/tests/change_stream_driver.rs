//! The official MongoDB Rust driver's change-stream API against duet:
//! `watch()` on a collection, every operation type with the driver's typed
//! events (it parses resume tokens, `postBatchResumeToken`, update
//! descriptions), then a resume from a token.

mod common;

use std::time::{Duration, Instant};

use common::TestServer;
use mongodb::bson::{doc, Document};
use mongodb::change_stream::event::{ChangeStreamEvent, OperationType};
use mongodb::change_stream::ChangeStream;

async fn next_n(
    s: &mut ChangeStream<ChangeStreamEvent<Document>>,
    n: usize,
) -> Vec<ChangeStreamEvent<Document>> {
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut out = Vec::new();
    while out.len() < n {
        assert!(
            Instant::now() < deadline,
            "only {} of {n} events",
            out.len()
        );
        if let Some(e) = s.next_if_any().await.expect("getMore") {
            out.push(e);
        }
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rust_driver_watch_every_operation_and_resume() {
    let s = TestServer::start(|_| {}).await;
    let client = mongodb::Client::with_uri_str(s.uri())
        .await
        .expect("client");
    let coll = client.database("app").collection::<Document>("c");
    coll.insert_one(doc! {"_id": 0}).await.expect("seed");
    let mut stream = coll
        .watch()
        .max_await_time(Duration::from_millis(200))
        .await
        .expect("watch");
    coll.insert_one(doc! {"_id": 1, "a": 1})
        .await
        .expect("insert");
    coll.update_one(doc! {"_id": 1}, doc! {"$set": {"a": 2}})
        .await
        .expect("update");
    coll.replace_one(doc! {"_id": 1}, doc! {"b": 1})
        .await
        .expect("replace");
    coll.delete_one(doc! {"_id": 1}).await.expect("delete");
    let ev = next_n(&mut stream, 4).await;
    let ops: Vec<OperationType> = ev.iter().map(|e| e.operation_type.clone()).collect();
    assert_eq!(
        ops,
        [
            OperationType::Insert,
            OperationType::Update,
            OperationType::Replace,
            OperationType::Delete
        ]
    );
    assert_eq!(ev[0].full_document, Some(doc! {"_id": 1, "a": 1}));
    let desc = ev[1]
        .update_description
        .as_ref()
        .expect("updateDescription");
    assert_eq!(desc.updated_fields, doc! {"a": 2});
    assert_eq!(ev[3].document_key, Some(doc! {"_id": 1}));
    assert!(ev[0].cluster_time.is_some());

    // Resume after the insert: the other three come again, nothing else.
    let mut resumed = coll
        .watch()
        .resume_after(ev[0].id.clone())
        .max_await_time(Duration::from_millis(200))
        .await
        .expect("resume");
    let again = next_n(&mut resumed, 3).await;
    assert_eq!(again[0].operation_type, OperationType::Update);
    assert_eq!(again[2].operation_type, OperationType::Delete);
    assert!(resumed.resume_token().is_some());

    coll.drop().await.expect("drop");
    let end = next_n(&mut stream, 2).await;
    assert_eq!(end[0].operation_type, OperationType::Drop);
    assert_eq!(end[1].operation_type, OperationType::Invalidate);
    s.shutdown().await;
}
