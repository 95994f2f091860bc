//! The official MongoDB Rust driver against `--auth`: the localhost
//! exception, SCRAM-SHA-256 and SCRAM-SHA-1 logins, wrong password (18) and
//! unauthenticated commands (13).

mod common;

use common::TestServer;
use mongodb::bson::{doc, Document};
use mongodb::error::{Error, ErrorKind};
use mongodb::Client;

fn code(e: &Error) -> Option<i32> {
    match &*e.kind {
        ErrorKind::Command(c) => Some(c.code),
        ErrorKind::Authentication { .. } => Some(18),
        _ => None,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scram_logins_with_the_rust_driver() {
    let s = TestServer::start(|c| c.auth = true).await;
    let anon = Client::with_uri_str(s.uri()).await.expect("client");
    let err = anon
        .database("app")
        .collection::<Document>("c")
        .insert_one(doc! {"a": 1})
        .await
        .expect_err("unauthenticated insert");
    assert_eq!(code(&err), Some(13), "{err}");
    anon.database("admin")
        .run_command(doc! {"createUser": "root", "pwd": "pw", "roles": ["root"]})
        .await
        .expect("first user through the localhost exception");

    for mech in ["SCRAM-SHA-256", "SCRAM-SHA-1"] {
        let uri = format!(
            "mongodb://root:pw@{}/?directConnection=true&authSource=admin&authMechanism={mech}",
            s.addr
        );
        let c = Client::with_uri_str(&uri).await.expect("client");
        let coll = c.database("app").collection::<Document>("c");
        coll.insert_one(doc! {"m": mech}).await.expect("insert");
        assert!(coll
            .find_one(doc! {"m": mech})
            .await
            .expect("find")
            .is_some());

        let bad_uri = format!(
            "mongodb://root:nope@{}/?directConnection=true&authSource=admin&authMechanism={mech}",
            s.addr
        );
        let bad = Client::with_uri_str(&bad_uri).await.expect("client");
        let err = bad
            .database("admin")
            .run_command(doc! {"ping": 1})
            .await
            .expect_err("wrong password");
        assert!(
            matches!(&*err.kind, ErrorKind::Authentication { .. }) || code(&err) == Some(18),
            "{err}"
        );
    }
    s.shutdown().await;
}
