//! Hostile input over raw sockets: every case ends in an error reply or a
//! closed connection, and the server keeps serving others.

mod common;

use std::time::Duration;

use bson::{doc, Document};
use common::TestServer;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

fn frame(op: i32, payload: &[u8]) -> Vec<u8> {
    let mut v = Vec::new();
    v.extend(((16 + payload.len()) as i32).to_le_bytes());
    v.extend(1i32.to_le_bytes());
    v.extend(0i32.to_le_bytes());
    v.extend(op.to_le_bytes());
    v.extend(payload);
    v
}

fn op_msg(d: &Document) -> Vec<u8> {
    let mut p = 0u32.to_le_bytes().to_vec();
    p.push(0);
    d.to_writer(&mut p).expect("encode");
    frame(2013, &p)
}

async fn reply(s: &mut TcpStream) -> Option<Document> {
    let mut h = [0u8; 16];
    tokio::time::timeout(Duration::from_secs(5), s.read_exact(&mut h))
        .await
        .ok()?
        .ok()?;
    let len = i32::from_le_bytes([h[0], h[1], h[2], h[3]]) as usize;
    let mut body = vec![0u8; len - 16];
    s.read_exact(&mut body).await.ok()?;
    Document::from_reader(&body[5..]).ok()
}

async fn closed(s: &mut TcpStream) -> bool {
    let mut b = [0u8; 1];
    matches!(
        tokio::time::timeout(Duration::from_secs(5), s.read(&mut b)).await,
        Ok(Ok(0)) | Ok(Err(_))
    )
}

async fn ping_ok(addr: std::net::SocketAddr) {
    let mut s = TcpStream::connect(addr).await.expect("connect");
    s.write_all(&op_msg(&doc! {"ping": 1, "$db": "admin"}))
        .await
        .expect("write");
    let r = reply(&mut s).await.expect("reply");
    assert_eq!(r.get_f64("ok").expect("ok"), 1.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_frames_close_or_error_and_never_hurt_others() {
    let s = TestServer::start(|c| c.max_connections = 64).await;
    let addr = s.addr;
    // A bystander connection that stays open throughout.
    let mut bystander = TcpStream::connect(addr).await.expect("connect");

    for len in [0i32, 15, -5, 48_000_001, i32::MAX] {
        let mut c = TcpStream::connect(addr).await.expect("connect");
        let mut h = frame(2013, b"");
        h[0..4].copy_from_slice(&len.to_le_bytes());
        c.write_all(&h).await.expect("write");
        assert!(closed(&mut c).await, "length {len} must close");
    }
    // Unknown opcode, and OP_COMPRESSED with the noop compressor (not offered).
    for op in [4242, 2012] {
        let mut c = TcpStream::connect(addr).await.expect("connect");
        c.write_all(&frame(op, &[0u8; 16])).await.expect("write");
        assert!(closed(&mut c).await);
    }
    // Stalled half-sent header: closed by the message timeout.
    let mut c = TcpStream::connect(addr).await.expect("connect");
    c.write_all(&[40, 0, 0]).await.expect("write");
    assert!(closed(&mut c).await);
    // Invalid BSON inside a good frame: an error reply, connection usable.
    let mut c = TcpStream::connect(addr).await.expect("connect");
    let mut p = 0u32.to_le_bytes().to_vec();
    p.push(0);
    p.extend([12, 0, 0, 0, 2, b'a', 0, 255, 255, 255, 127, 0]);
    c.write_all(&frame(2013, &p)).await.expect("write");
    let r = reply(&mut c).await.expect("error reply");
    assert_eq!(r.get_i32("code").expect("code"), 22);
    // Deep nesting (built by hand, 50,000 levels): refused with code 15.
    let depth = 50_000usize;
    let mut doc_bytes = Vec::new();
    let mut sizes = Vec::with_capacity(depth);
    let mut size = 5usize;
    for _ in 0..depth {
        size += 4 + 3 + 1;
        sizes.push(size);
    }
    for i in 0..depth {
        doc_bytes.extend((sizes[depth - 1 - i] as i32).to_le_bytes());
        doc_bytes.extend([3, b'a', 0]);
    }
    doc_bytes.extend([5, 0, 0, 0, 0]);
    doc_bytes.extend(std::iter::repeat_n(0u8, depth));
    let mut p = 0u32.to_le_bytes().to_vec();
    p.push(0);
    p.extend(doc_bytes);
    c.write_all(&frame(2013, &p)).await.expect("write");
    let r = reply(&mut c).await.expect("error reply");
    assert_eq!(r.get_i32("code").expect("code"), 15);

    bystander
        .write_all(&op_msg(&doc! {"ping": 1, "$db": "admin"}))
        .await
        .expect("write");
    assert!(reply(&mut bystander).await.is_some());
    ping_ok(addr).await;
    s.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connection_limit_refuses_with_a_message() {
    // No administrator slots: this loopback client must be refused.
    let s = TestServer::start(|c| {
        c.max_connections = 1;
        c.admin_connections = 0;
    })
    .await;
    let mut a = TcpStream::connect(s.addr).await.expect("a");
    a.write_all(&op_msg(&doc! {"ping": 1, "$db": "admin"}))
        .await
        .expect("write");
    assert!(reply(&mut a).await.is_some());
    let mut b = TcpStream::connect(s.addr).await.expect("b");
    b.write_all(&op_msg(&doc! {"hello": 1, "$db": "admin"}))
        .await
        .expect("write");
    let r = reply(&mut b).await.expect("refusal");
    assert_eq!(r.get_f64("ok").expect("ok"), 0.0);
    assert!(r.get_str("errmsg").expect("msg").contains("limit of 1"));
    assert!(closed(&mut b).await);
    drop(a);
    s.shutdown().await;
}

/// A BSON document of int32 fields, keys as given (duplicates allowed:
/// `Document` cannot hold them).
fn raw_doc(fields: &[(&str, i32)]) -> Vec<u8> {
    let mut b = vec![0u8; 4];
    for (k, v) in fields {
        b.push(0x10);
        b.extend_from_slice(k.as_bytes());
        b.push(0);
        b.extend(v.to_le_bytes());
    }
    b.push(0);
    let len = b.len() as i32;
    b[..4].copy_from_slice(&len.to_le_bytes());
    b
}

/// An OP_MSG whose body is `body` plus one kind-1 section `ident` of raw documents.
fn op_msg_with_sequence(body: &Document, ident: &str, docs: &[Vec<u8>]) -> Vec<u8> {
    let mut p = 0u32.to_le_bytes().to_vec();
    p.push(0);
    body.to_writer(&mut p).expect("encode");
    p.push(1);
    let size = 4 + ident.len() + 1 + docs.iter().map(Vec::len).sum::<usize>();
    p.extend((size as i32).to_le_bytes());
    p.extend(ident.as_bytes());
    p.push(0);
    for d in docs {
        p.extend(d);
    }
    frame(2013, &p)
}

/// A raw statement `{q: {}, u: <u>, upsert: true}`.
fn raw_update_statement(u: &[u8]) -> Vec<u8> {
    let mut b = vec![0u8; 4];
    b.extend([3, b'q', 0, 5, 0, 0, 0, 0]);
    b.extend([3, b'u', 0]);
    b.extend(u);
    b.extend([8]);
    b.extend(b"upsert\0");
    b.push(1);
    b.push(0);
    let len = b.len() as i32;
    b[..4].copy_from_slice(&len.to_le_bytes());
    b
}

async fn count(s: &mut TcpStream, coll: &str) -> i64 {
    s.write_all(&op_msg(&doc! {"count": coll, "$db": "dups"}))
        .await
        .expect("write");
    let r = reply(s).await.expect("reply");
    n(&r)
}

/// A reply's `n`, whichever integer type it has.
fn n(r: &Document) -> i64 {
    match r.get("n") {
        Some(bson::Bson::Int32(v)) => i64::from(*v),
        Some(bson::Bson::Int64(v)) => *v,
        other => panic!("reply without an integer n: {other:?} in {r}"),
    }
}

/// The OP_MSG body `body` with one more field `key` of BSON type `kind`
/// holding the raw bytes `value` (for values a `Document` cannot hold).
fn op_msg_with_raw_field(body: &Document, kind: u8, key: &str, value: &[u8]) -> Vec<u8> {
    let mut b = Vec::new();
    body.to_writer(&mut b).expect("encode");
    b.pop(); // the terminating 0
    b.push(kind);
    b.extend(key.as_bytes());
    b.push(0);
    b.extend(value);
    b.push(0);
    let len = b.len() as i32;
    b[..4].copy_from_slice(&len.to_le_bytes());
    let mut p = 0u32.to_le_bytes().to_vec();
    p.push(0);
    p.extend(&b);
    frame(2013, &p)
}

fn first_write_error(r: &Document) -> (i32, i32, String) {
    let e = r
        .get_array("writeErrors")
        .expect("writeErrors")
        .first()
        .and_then(|e| e.as_document())
        .expect("a write error");
    (
        e.get_i32("index").expect("index"),
        e.get_i32("code").expect("code"),
        e.get_str("errmsg").expect("errmsg").to_string(),
    )
}

/// MongoDB refuses a document with two top-level `_id`s (a `Document` would
/// silently keep the last): in a kind-1 sequence, in the body's `documents`,
/// as an update's replacement and as findAndModify's replacement. The other
/// documents of an unordered insert are still written.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn documents_with_two_ids_are_refused() {
    let s = TestServer::start(|_| {}).await;
    let mut c = TcpStream::connect(s.addr).await.expect("connect");
    let dup = raw_doc(&[("_id", 1), ("v", 1), ("_id", 2)]);
    let good = raw_doc(&[("_id", 3), ("v", 3)]);

    // Kind-1 `documents`, unordered: the good one is written.
    c.write_all(&op_msg_with_sequence(
        &doc! {"insert": "a", "ordered": false, "$db": "dups"},
        "documents",
        &[dup.clone(), good.clone()],
    ))
    .await
    .expect("write");
    let r = reply(&mut c).await.expect("reply");
    assert_eq!(n(&r), 1, "{r}");
    let (index, code, msg) = first_write_error(&r);
    assert_eq!((index, code), (0, 2), "{r}");
    assert!(msg.contains("multiple _id"), "{msg}");
    assert_eq!(count(&mut c, "a").await, 1);

    // The body's `documents` array (hand-built: a raw array holding the raw doc).
    let mut arr = vec![0u8; 4];
    arr.push(3);
    arr.extend(b"0\0");
    arr.extend(&dup);
    arr.push(0);
    let alen = arr.len() as i32;
    arr[..4].copy_from_slice(&alen.to_le_bytes());
    c.write_all(&op_msg_with_raw_field(
        &doc! {"insert": "b", "$db": "dups"},
        4,
        "documents",
        &arr,
    ))
    .await
    .expect("write");
    let r = reply(&mut c).await.expect("reply");
    assert_eq!(first_write_error(&r).1, 2, "{r}");
    assert_eq!(count(&mut c, "b").await, 0);

    // An upserting replacement with two `_id`s.
    c.write_all(&op_msg_with_sequence(
        &doc! {"update": "c", "$db": "dups"},
        "updates",
        &[raw_update_statement(&dup)],
    ))
    .await
    .expect("write");
    let r = reply(&mut c).await.expect("reply");
    assert_eq!(first_write_error(&r).1, 2, "{r}");
    assert_eq!(count(&mut c, "c").await, 0);

    // findAndModify's replacement, upserting.
    c.write_all(&op_msg_with_raw_field(
        &doc! {"findAndModify": "d", "query": {}, "upsert": true, "$db": "dups"},
        3,
        "update",
        &dup,
    ))
    .await
    .expect("write");
    let r = reply(&mut c).await.expect("reply");
    assert_eq!(r.get_i32("code").expect("code"), 2, "{r}");
    assert_eq!(count(&mut c, "d").await, 0);

    // A legitimate insert still works on the same connection.
    c.write_all(&op_msg_with_sequence(
        &doc! {"insert": "a", "$db": "dups"},
        "documents",
        &[raw_doc(&[("_id", 9)])],
    ))
    .await
    .expect("write");
    let r = reply(&mut c).await.expect("reply");
    assert_eq!(n(&r), 1, "{r}");
    s.shutdown().await;
}
