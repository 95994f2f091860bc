//! Sessions and multi-document transactions through the official MongoDB Rust
//! driver against an in-process `duet serve`: commit and abort (seen or not
//! by another client), read-your-writes, the write-conflict label and the
//! driver's `and_run2` retry, retryable writes, and which topologies the
//! driver runs transactions on (the evidence for reporting a replica set).

mod common;

use common::TestServer;
use futures_util::TryStreamExt;
use mongodb::bson::{doc, Document};
use mongodb::error::{TRANSIENT_TRANSACTION_ERROR, UNKNOWN_TRANSACTION_COMMIT_RESULT};
use mongodb::event::command::CommandEvent;
use mongodb::options::ClientOptions;
use mongodb::{Client, Collection};
use std::sync::{Arc, Mutex};

/// A client on a plain `mongodb://host:port` URI (no directConnection): the
/// driver discovers the topology from `hello`, as a user's would.
async fn plain_client(s: &TestServer) -> Client {
    Client::with_uri_str(format!("mongodb://{}", s.addr))
        .await
        .expect("client")
}

async fn count(c: &Collection<Document>, filter: Document) -> u64 {
    c.count_documents(filter).await.expect("count")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn commit_and_abort_with_read_your_writes() {
    let s = TestServer::start(|_| {}).await;
    let client = plain_client(&s).await;
    let other = plain_client(&s).await;
    let coll = client.database("t").collection::<Document>("c");
    let seen_by_other = other.database("t").collection::<Document>("c");
    coll.insert_one(doc! {"_id": 0, "n": 0})
        .await
        .expect("seed");

    let mut session = client.start_session().await.expect("session");
    session.start_transaction().await.expect("start");
    coll.insert_one(doc! {"_id": 1, "n": 1})
        .session(&mut session)
        .await
        .expect("insert in txn");
    coll.update_one(doc! {"_id": 0}, doc! {"$inc": {"n": 10}})
        .session(&mut session)
        .await
        .expect("update in txn");
    // Read-your-writes inside, nothing visible outside before commit.
    let inside: Vec<Document> = coll
        .find(doc! {})
        .sort(doc! {"_id": 1})
        .session(&mut session)
        .await
        .expect("find in txn")
        .stream(&mut session)
        .try_collect()
        .await
        .expect("collect");
    assert_eq!(inside.len(), 2);
    assert_eq!(inside[0].get_i32("n").expect("n"), 10);
    assert_eq!(count(&seen_by_other, doc! {}).await, 1);
    assert_eq!(count(&seen_by_other, doc! {"n": 10}).await, 0);
    session.commit_transaction().await.expect("commit");
    assert_eq!(count(&seen_by_other, doc! {}).await, 2);
    assert_eq!(count(&seen_by_other, doc! {"n": 10}).await, 1);
    // A second commit of the same transaction is a retry: ok again.
    session.commit_transaction().await.expect("commit retry");

    session.start_transaction().await.expect("start 2");
    coll.delete_many(doc! {})
        .session(&mut session)
        .await
        .expect("delete in txn");
    assert_eq!(
        coll.count_documents(doc! {})
            .session(&mut session)
            .await
            .expect("count in txn"),
        0
    );
    session.abort_transaction().await.expect("abort");
    assert_eq!(count(&seen_by_other, doc! {}).await, 2);
    s.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn write_conflict_is_transient_and_and_run2_retries() {
    let s = TestServer::start(|_| {}).await;
    let client = plain_client(&s).await;
    let coll = client.database("t").collection::<Document>("acct");
    coll.insert_one(doc! {"_id": 1, "bal": 100})
        .await
        .expect("seed");

    let mut a = client.start_session().await.expect("a");
    let mut b = client.start_session().await.expect("b");
    a.start_transaction().await.expect("start a");
    b.start_transaction().await.expect("start b");
    coll.update_one(doc! {"_id": 1}, doc! {"$inc": {"bal": -10}})
        .session(&mut a)
        .await
        .expect("a writes");
    coll.update_one(doc! {"_id": 1}, doc! {"$inc": {"bal": -20}})
        .session(&mut b)
        .await
        .expect("b writes");
    a.commit_transaction().await.expect("first committer wins");
    let e = b.commit_transaction().await.expect_err("second conflicts");
    assert!(e.contains_label(TRANSIENT_TRANSACTION_ERROR), "{e:?}");
    assert!(
        !e.contains_label(UNKNOWN_TRANSACTION_COMMIT_RESULT),
        "{e:?}"
    );
    assert_eq!(
        coll.find_one(doc! {"_id": 1})
            .await
            .expect("find")
            .expect("doc")
            .get_i32("bal")
            .expect("bal"),
        90
    );

    // The driver's convenient API retries the conflicting transaction.
    let mut attempts = 0;
    let coll2 = coll.clone();
    let other = client.clone();
    b.start_transaction()
        .and_run2(async |session| {
            attempts += 1;
            coll2
                .update_one(doc! {"_id": 1}, doc! {"$inc": {"bal": -20}})
                .session(&mut *session)
                .await?;
            if attempts == 1 {
                // Someone else commits to the same document meanwhile.
                other
                    .database("t")
                    .collection::<Document>("acct")
                    .update_one(doc! {"_id": 1}, doc! {"$inc": {"bal": -1}})
                    .await?;
            }
            Ok(())
        })
        .await
        .expect("and_run2 succeeds after a retry");
    assert_eq!(attempts, 2);
    let bal = coll
        .find_one(doc! {"_id": 1})
        .await
        .expect("find")
        .expect("doc")
        .get_i32("bal")
        .expect("bal");
    assert_eq!(bal, 69);
    s.shutdown().await;
}

/// Records the `txnNumber` of every insert the driver sends.
async fn insert_txn_numbers(s: &TestServer, direct: bool) -> (Vec<Option<i64>>, bool) {
    let uri = if direct {
        s.uri()
    } else {
        format!("mongodb://{}", s.addr)
    };
    let mut opts = ClientOptions::parse(uri).await.expect("options");
    let seen: Arc<Mutex<Vec<Option<i64>>>> = Arc::default();
    let sink = seen.clone();
    opts.command_event_handler = Some(mongodb::event::EventHandler::callback(
        move |ev: CommandEvent| {
            if let CommandEvent::Started(st) = ev {
                if st.command_name == "insert" {
                    let n = st.command.get_i64("txnNumber").ok();
                    sink.lock().expect("lock").push(n);
                }
            }
        },
    ));
    let client = Client::with_options(opts).expect("client");
    let coll = client.database("t").collection::<Document>("r");
    coll.insert_one(doc! {"x": 1}).await.expect("insert");
    let mut session = client.start_session().await.expect("session");
    let txn_ok = match session.start_transaction().await {
        Ok(()) => {
            coll.insert_one(doc! {"x": 2})
                .session(&mut session)
                .await
                .expect("insert in txn");
            session.commit_transaction().await.expect("commit");
            true
        }
        Err(_) => false,
    };
    let numbers = seen.lock().expect("lock").clone();
    (numbers, txn_ok)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn topology_decides_retryable_writes() {
    // Replica-set mode (the default): retryable writes carry a txnNumber,
    // on a plain URI and with directConnection alike.
    let rs = TestServer::start(|_| {}).await;
    for direct in [false, true] {
        let (numbers, txn_ok) = insert_txn_numbers(&rs, direct).await;
        assert!(txn_ok);
        assert!(numbers[0].is_some(), "retryable write: {numbers:?}");
    }
    rs.shutdown().await;
    // Standalone mode: the driver sends no txnNumber with plain writes (so
    // writes are not retryable), although it does run transactions.
    let standalone = TestServer::start(|c| c.replica_set = None).await;
    let (numbers, txn_ok) = insert_txn_numbers(&standalone, false).await;
    assert_eq!(numbers[0], None);
    assert!(
        txn_ok,
        "this driver version runs transactions on a standalone"
    );
    standalone.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ddl_is_refused_in_a_transaction_and_aborts_it() {
    let s = TestServer::start(|_| {}).await;
    let client = plain_client(&s).await;
    let db = client.database("t");
    let coll = db.collection::<Document>("d");
    let mut session = client.start_session().await.expect("session");
    session.start_transaction().await.expect("start");
    coll.insert_one(doc! {"_id": 1})
        .session(&mut session)
        .await
        .expect("insert");
    let e = db
        .create_collection("other")
        .session(&mut session)
        .await
        .expect_err("ddl refused");
    match *e.kind {
        mongodb::error::ErrorKind::Command(ref c) => assert_eq!(c.code, 263, "{c:?}"),
        ref other => panic!("unexpected error {other:?}"),
    }
    let e = session.commit_transaction().await.expect_err("aborted");
    assert!(e.contains_label(TRANSIENT_TRANSACTION_ERROR), "{e:?}");
    assert_eq!(count(&coll, doc! {}).await, 0);
    s.shutdown().await;
}
