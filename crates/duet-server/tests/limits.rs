//! Issue #14's server limits over raw sockets, each against a server with
//! small configured limits so it runs in seconds: cursor ownership (8),
//! cursor limits and lifetime (10), result and batch sizes (11), the budget
//! of incomplete messages (13), idle connections and administrator slots
//! (14), the test-knob flag (15), one depth limit for every section (16).

mod common;

use std::net::SocketAddr;
use std::time::Duration;

use bson::spec::BinarySubtype;
use bson::{doc, Binary, Bson, Document};
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

fn encode(d: &Document) -> Vec<u8> {
    let mut v = Vec::new();
    d.to_writer(&mut v).expect("encode");
    v
}

fn op_msg(d: &Document) -> Vec<u8> {
    let mut p = 0u32.to_le_bytes().to_vec();
    p.push(0);
    p.extend(encode(d));
    frame(2013, &p)
}

/// An OP_MSG whose `documents` come in a kind-1 section.
fn op_msg_sequence(body: &Document, docs: &[Document]) -> Vec<u8> {
    let mut p = 0u32.to_le_bytes().to_vec();
    p.push(0);
    p.extend(encode(body));
    p.push(1);
    let encoded: Vec<Vec<u8>> = docs.iter().map(encode).collect();
    let size = 4 + "documents".len() + 1 + encoded.iter().map(Vec::len).sum::<usize>();
    p.extend((size as i32).to_le_bytes());
    p.extend(b"documents\0");
    for d in encoded {
        p.extend(d);
    }
    frame(2013, &p)
}

fn lsid(b: u8) -> Document {
    doc! {"id": Binary { subtype: BinarySubtype::Uuid, bytes: vec![b; 16] }}
}

/// One raw connection.
struct Conn {
    s: TcpStream,
}

impl Conn {
    async fn open(addr: SocketAddr) -> Conn {
        Conn {
            s: TcpStream::connect(addr).await.expect("connect"),
        }
    }

    /// Send a command and return the reply and its message length.
    async fn cmd_len(&mut self, d: Document) -> (Document, usize) {
        self.s.write_all(&op_msg(&d)).await.expect("write");
        self.reply().await.expect("reply")
    }

    async fn cmd(&mut self, d: Document) -> Document {
        self.cmd_len(d).await.0
    }

    async fn reply(&mut self) -> Option<(Document, usize)> {
        let mut h = [0u8; 16];
        tokio::time::timeout(Duration::from_secs(20), self.s.read_exact(&mut h))
            .await
            .ok()?
            .ok()?;
        let len = i32::from_le_bytes([h[0], h[1], h[2], h[3]]) as usize;
        let mut body = vec![0u8; len - 16];
        self.s.read_exact(&mut body).await.ok()?;
        Some((Document::from_reader(&body[5..]).ok()?, len))
    }

    /// True once the server has closed the connection.
    async fn closed(&mut self) -> bool {
        let mut b = [0u8; 1];
        matches!(
            tokio::time::timeout(Duration::from_secs(5), self.s.read(&mut b)).await,
            Ok(Ok(0)) | Ok(Err(_))
        )
    }
}

fn code(r: &Document) -> i32 {
    r.get_i32("code").unwrap_or(0)
}

fn cursor_id(r: &Document) -> i64 {
    r.get_document("cursor")
        .and_then(|c| c.get_i64("id"))
        .unwrap_or_else(|_| panic!("no cursor in {r}"))
}

fn batch_len(r: &Document, which: &str) -> usize {
    r.get_document("cursor")
        .and_then(|c| c.get_array(which))
        .map(Vec::len)
        .unwrap_or_else(|_| panic!("no {which} in {r}"))
}

async fn server_status(addr: SocketAddr) -> Document {
    let mut c = Conn::open(addr).await;
    let r = c.cmd(doc! {"serverStatus": 1, "$db": "admin"}).await;
    r.get_document("duet").expect("duet section").clone()
}

async fn open_cursors(addr: SocketAddr) -> i64 {
    server_status(addr)
        .await
        .get_i64("cursorsOpen")
        .expect("cursorsOpen")
}

async fn fill(c: &mut Conn, n: i32) {
    let docs: Vec<Bson> = (0..n).map(|i| Bson::Document(doc! {"_id": i})).collect();
    let r = c
        .cmd(doc! {"insert": "c", "documents": docs, "$db": "t"})
        .await;
    assert_eq!(r.get_i32("n").expect("n"), n, "{r}");
}

/// Item 8: a cursor belongs to its session, or to its connection when it was
/// opened without one; ids are random.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cursors_belong_to_their_session_or_connection() {
    let s = TestServer::start(|_| {}).await;
    let mut a = Conn::open(s.addr).await;
    let mut b = Conn::open(s.addr).await;
    fill(&mut a, 20).await;
    let find = |l: Option<Document>| {
        let mut d = doc! {"find": "c", "batchSize": 2, "$db": "t"};
        if let Some(l) = l {
            d.insert("lsid", l);
        }
        d
    };
    let get_more = |id: i64, l: Option<Document>| {
        let mut d = doc! {"getMore": id, "collection": "c", "batchSize": 2, "$db": "t"};
        if let Some(l) = l {
            d.insert("lsid", l);
        }
        d
    };
    // Without a session: the connection's.
    let plain = cursor_id(&a.cmd(find(None)).await);
    let other = cursor_id(&a.cmd(find(None)).await);
    assert!(plain > 0 && other > 0 && plain != other);
    assert!(
        plain > 1 << 32 || other > 1 << 32,
        "ids are not sequential: {plain}, {other}"
    );
    let r = b.cmd(get_more(plain, None)).await;
    assert_eq!(code(&r), 13, "{r}");
    assert!(!r.get_str("errmsg").unwrap_or("").contains("t.c"), "{r}");
    let r = a.cmd(get_more(plain, Some(lsid(1)))).await;
    assert_eq!(code(&r), 50736, "{r}");
    let r = b
        .cmd(doc! {"killCursors": "c", "cursors": [plain], "$db": "t"})
        .await;
    assert_eq!(r.get_array("cursorsNotFound").expect("nf").len(), 1, "{r}");
    let r = a.cmd(get_more(plain, None)).await;
    assert_eq!(
        batch_len(&r, "nextBatch"),
        2,
        "the owner still reads it: {r}"
    );

    // With a session: the session's, on any connection (drivers pool them).
    let mine = cursor_id(&a.cmd(find(Some(lsid(7)))).await);
    let r = b.cmd(get_more(mine, Some(lsid(7)))).await;
    assert_eq!(batch_len(&r, "nextBatch"), 2, "{r}");
    let r = b.cmd(get_more(mine, Some(lsid(8)))).await;
    assert_eq!(code(&r), 50738, "{r}");
    let r = a.cmd(get_more(mine, None)).await;
    assert_eq!(code(&r), 50737, "{r}");
    let mut k = doc! {"killCursors": "c", "cursors": [mine], "$db": "t"};
    k.insert("lsid", lsid(8));
    let r = b.cmd(k).await;
    assert_eq!(r.get_array("cursorsNotFound").expect("nf").len(), 1, "{r}");
    let mut k = doc! {"killCursors": "c", "cursors": [mine], "$db": "t"};
    k.insert("lsid", lsid(7));
    let r = b.cmd(k).await;
    assert_eq!(
        r.get_array("cursorsKilled").expect("killed").len(),
        1,
        "{r}"
    );
    s.shutdown().await;
}

/// Item 10: count and memory limits per server, session-less cursors die
/// with their connection, sessions' cursors with `endSessions`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cursor_limits_and_cursors_die_with_their_connection() {
    let s = TestServer::start(|c| {
        c.max_cursors = 3;
        c.max_cursor_bytes = 256 * 1024;
    })
    .await;
    let mut a = Conn::open(s.addr).await;
    fill(&mut a, 2000).await;
    let find = doc! {"find": "c", "batchSize": 1, "$db": "t"};
    for _ in 0..3 {
        cursor_id(&a.cmd(find.clone()).await);
    }
    let r = a.cmd(find.clone()).await;
    assert_eq!(code(&r), 146, "{r}");
    assert!(r.get_str("errmsg").expect("msg").contains("--max-cursors"));
    assert_eq!(open_cursors(s.addr).await, 3);
    // The connection ends: its cursors go.
    drop(a);
    let mut gone = false;
    for _ in 0..100 {
        if open_cursors(s.addr).await == 0 {
            gone = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(gone, "cursors of a closed connection must be killed");

    // Memory: an aggregate result held by the cursor, ~500 KB > 256 KiB.
    let mut b = Conn::open(s.addr).await;
    let r = b
        .cmd(
            doc! {"aggregate": "c", "pipeline": [{"$addFields": {"pad": "p".repeat(200)}}],
            "cursor": {"batchSize": 1}, "$db": "t"},
        )
        .await;
    assert_eq!(code(&r), 146, "{r}");
    assert!(r
        .get_str("errmsg")
        .expect("msg")
        .contains("--max-cursor-memory-mb"));
    // A session's cursor survives its connection, not endSessions.
    let mut f = find.clone();
    f.insert("lsid", lsid(3));
    cursor_id(&b.cmd(f).await);
    drop(b);
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(open_cursors(s.addr).await, 1);
    let mut c = Conn::open(s.addr).await;
    c.cmd(doc! {"endSessions": [lsid(3)], "$db": "admin"}).await;
    assert_eq!(open_cursors(s.addr).await, 0);
    s.shutdown().await;
}

/// Item 11: results past 16 MiB are refused (10334) and batches are cut by
/// real bytes, so every reply fits in a message.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batches_and_results_stay_within_the_size_limits() {
    let s = TestServer::start(|c| c.message_timeout = Duration::from_secs(20)).await;
    let mut a = Conn::open(s.addr).await;
    let six = "x".repeat(6 << 20);
    for i in 0..4 {
        let r = a
            .cmd(doc! {"insert": "big", "documents": [{"_id": i, "s": &six}], "$db": "t"})
            .await;
        assert_eq!(r.get_i32("n").expect("n"), 1, "{r}");
    }
    let seven: Vec<Bson> = (0..7).map(|_| Bson::String("$s".into())).collect();
    let r = a
        .cmd(
            doc! {"aggregate": "big", "pipeline": [{"$project": {"c": {"$concat": seven}}}],
            "cursor": {}, "$db": "t"},
        )
        .await;
    assert_eq!(code(&r), 10334, "{}", r.get_str("errmsg").unwrap_or(""));
    // Each output is 12 MiB: one per batch, every reply below 48 MB.
    let (r, len) = a
        .cmd_len(
            doc! {"aggregate": "big", "pipeline": [{"$addFields": {"t": "$s"}}],
            "cursor": {}, "$db": "t"},
        )
        .await;
    assert!(len < 48_000_000);
    let mut seen = batch_len(&r, "firstBatch");
    let mut id = cursor_id(&r);
    while id != 0 {
        let (r, len) = a
            .cmd_len(doc! {"getMore": id, "collection": "big", "$db": "t"})
            .await;
        assert!(len < 48_000_000, "{len}");
        let n = batch_len(&r, "nextBatch");
        assert!(n <= 1, "{n} documents of 12 MiB in one batch");
        seen += n;
        id = cursor_id(&r);
    }
    assert_eq!(seen, 4);
    s.shutdown().await;
}

/// Item 13: incomplete messages share one budget; a message that would pass
/// it closes its connection, and closing returns what was held.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn incomplete_messages_share_a_budget() {
    let s = TestServer::start(|c| {
        c.max_incomplete_message_bytes = 4 << 20;
        c.message_timeout = Duration::from_secs(10);
    })
    .await;
    let mut head = frame(2013, b"");
    head[0..4].copy_from_slice(&40_000_000i32.to_le_bytes());
    let mut a = Conn::open(s.addr).await;
    a.s.write_all(&head).await.expect("write");
    a.s.write_all(&vec![0u8; 3 << 20]).await.expect("write");
    let mut held = 0;
    for _ in 0..100 {
        held = server_status(s.addr)
            .await
            .get_i64("incompleteMessageBytes")
            .expect("figure");
        if held >= 3 << 20 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!((3 << 20..=4 << 20).contains(&held), "{held}");
    let mut b = Conn::open(s.addr).await;
    b.s.write_all(&head).await.expect("write");
    let _ = b.s.write_all(&vec![0u8; 2 << 20]).await;
    assert!(b.closed().await, "over the budget: closed");
    // Small commands never wait on the budget.
    let mut c = Conn::open(s.addr).await;
    assert_eq!(
        c.cmd(doc! {"ping": 1, "$db": "admin"})
            .await
            .get_f64("ok")
            .expect("ok"),
        1.0
    );
    drop(a);
    let mut released = false;
    for _ in 0..100 {
        let st = server_status(s.addr).await;
        if st.get_i64("incompleteMessageBytes").expect("figure") == 0 {
            released = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(
        released,
        "a closed connection's partial message is released"
    );
    s.shutdown().await;
}

/// Item 14: idle connections are closed; loopback peers get the reserved
/// slots beyond `max_connections`, and no more.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_connections_close_and_loopback_gets_the_admin_slots() {
    let s = TestServer::start(|c| {
        c.max_connections = 2;
        c.admin_connections = 1;
        c.idle_timeout = Duration::from_millis(1500);
    })
    .await;
    let ping = doc! {"ping": 1, "$db": "admin"};
    let mut a = Conn::open(s.addr).await;
    let mut b = Conn::open(s.addr).await;
    a.cmd(ping.clone()).await;
    b.cmd(ping.clone()).await;
    // Beyond max_connections: the loopback administrator's slot.
    let mut admin = Conn::open(s.addr).await;
    assert_eq!(
        admin.cmd(ping.clone()).await.get_f64("ok").expect("ok"),
        1.0
    );
    // And nothing beyond that.
    let mut over = Conn::open(s.addr).await;
    let r = over.cmd(ping.clone()).await;
    assert_eq!(r.get_f64("ok").expect("ok"), 0.0, "{r}");
    assert!(over.closed().await);
    // Idle connections are closed; a busy one is not.
    for _ in 0..4 {
        tokio::time::sleep(Duration::from_millis(500)).await;
        admin.cmd(ping.clone()).await;
    }
    assert!(a.closed().await, "idle past the timeout");
    assert!(b.closed().await, "idle past the timeout");
    assert_eq!(
        admin.cmd(ping.clone()).await.get_f64("ok").expect("ok"),
        1.0
    );
    // Their slots are free again.
    let mut again = Conn::open(s.addr).await;
    assert_eq!(again.cmd(ping).await.get_f64("ok").expect("ok"), 1.0);
    s.shutdown().await;
}

/// Item 15: `$duet.workNsPerDoc` only on a server started with the flag.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn test_knobs_need_the_flag() {
    let count = doc! {"count": "c", "$duet": {"workNsPerDoc": 10}, "$db": "t"};
    let s = TestServer::start(|_| {}).await;
    let mut a = Conn::open(s.addr).await;
    fill(&mut a, 5).await;
    let r = a.cmd(count.clone()).await;
    assert_eq!(code(&r), 20, "{r}");
    assert!(r
        .get_str("errmsg")
        .expect("msg")
        .contains("--enable-test-knobs"));
    s.shutdown().await;
    let s = TestServer::start(|c| c.enable_test_knobs = true).await;
    let mut a = Conn::open(s.addr).await;
    fill(&mut a, 5).await;
    let r = a.cmd(count).await;
    let n = r
        .get_i64("n")
        .or_else(|_| r.get_i32("n").map(i64::from))
        .unwrap_or(-1);
    assert_eq!(n, 5, "{r}");
    s.shutdown().await;
}

/// `{a: {a: ... {a: 1}}}` with `levels` documents.
fn nested(levels: usize) -> Document {
    let mut d = doc! {"a": 1};
    for _ in 1..levels {
        d = doc! {"a": d};
    }
    d
}

/// Item 16: a document is accepted or refused alike in the body and in a
/// document sequence: 100 levels are stored, 101 refused (15) as a write error.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_depth_limit_over_the_wire() {
    let s = TestServer::start(|_| {}).await;
    let mut a = Conn::open(s.addr).await;
    for (levels, ok) in [(100, true), (101, false)] {
        let mut d = nested(levels);
        d.insert("_id", format!("body{levels}"));
        let r = a
            .cmd(doc! {"insert": "deep", "documents": [d], "$db": "t"})
            .await;
        let in_body = (
            r.get_i32("n").unwrap_or(-1),
            r.get_array("writeErrors").ok().map(|e| e.len()),
        );
        let mut d = nested(levels);
        d.insert("_id", format!("seq{levels}"));
        a.s.write_all(&op_msg_sequence(&doc! {"insert": "deep", "$db": "t"}, &[d]))
            .await
            .expect("write");
        let (r2, _) = a.reply().await.expect("reply");
        let in_seq = (
            r2.get_i32("n").unwrap_or(-1),
            r2.get_array("writeErrors").ok().map(|e| e.len()),
        );
        assert_eq!(in_body, in_seq, "{levels}: {r} vs {r2}");
        if ok {
            assert_eq!(in_body.0, 1, "{r}");
        } else {
            let e = r2.get_array("writeErrors").expect("errors")[0]
                .as_document()
                .expect("doc")
                .clone();
            assert_eq!(code(&e), 15, "{e}");
        }
    }
    s.shutdown().await;
}
