//! `duet bench wire-latency`: the round trip of single raw OP_MSG requests
//! (`ping`, `find` by `_id`, `insert`, `update` by `_id`) against a `duet
//! serve`, beside a plain TCP echo server answering a frame of the same size
//! in the same run, so what the server adds over the network stack shows as
//! the difference. No driver: the client writes prepared frames on one
//! blocking socket (TCP_NODELAY) and reads whole replies, one at a time.
//!
//! Invariants: the echo server and the client live in this process and use
//! loopback only; every request's reply is read completely (and checked to
//! be `ok: 1` once per kind) before the next is sent; the run is bounded by
//! `ops` requests per kind.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::time::Instant;

use anyhow::{anyhow, bail, Context, Result};
use hdrhistogram::Histogram;
use mongodb::bson::{doc, Document};

use super::SpawnedServer;

const DB: &str = "duet_bench";
const COLL: &str = "wire_latency";
/// Documents loaded for `find` and `update`.
const RECORDS: i64 = 1000;

/// One kind of request, measured.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Row {
    pub op: String,
    pub requests: u64,
    pub p50_us: f64,
    pub p99_us: f64,
    pub mean_us: f64,
}

/// An OP_MSG frame carrying `cmd` (a kind-0 section only).
fn op_msg(request_id: i32, cmd: &Document) -> Result<Vec<u8>> {
    let mut body = Vec::new();
    cmd.to_writer(&mut body)?;
    let len = 16 + 4 + 1 + body.len();
    let mut out = Vec::with_capacity(len);
    out.extend_from_slice(&(len as i32).to_le_bytes());
    out.extend_from_slice(&request_id.to_le_bytes());
    out.extend_from_slice(&0i32.to_le_bytes());
    out.extend_from_slice(&2013i32.to_le_bytes());
    out.extend_from_slice(&0u32.to_le_bytes());
    out.push(0);
    out.extend_from_slice(&body);
    Ok(out)
}

/// Read one whole message into `buf` (header included).
fn read_message(s: &mut TcpStream, buf: &mut Vec<u8>) -> Result<()> {
    buf.resize(16, 0);
    s.read_exact(&mut buf[..16])?;
    let len = i32::from_le_bytes([buf[0], buf[1], buf[2], buf[3]]);
    if !(16..=48_000_000).contains(&len) {
        bail!("reply length {len} out of range");
    }
    buf.resize(len as usize, 0);
    s.read_exact(&mut buf[16..])?;
    Ok(())
}

/// The reply document of an OP_MSG reply in `buf`.
fn reply_doc(buf: &[u8]) -> Result<Document> {
    let b = buf.get(21..).ok_or_else(|| anyhow!("short OP_MSG reply"))?;
    Ok(Document::from_reader(b)?)
}

/// A TCP echo server on a free loopback port: every byte read is written back.
fn echo_server() -> Result<SocketAddr> {
    let l = TcpListener::bind("127.0.0.1:0").context("binding the echo server")?;
    let addr = l.local_addr()?;
    std::thread::Builder::new()
        .name("echo-accept".into())
        .spawn(move || {
            for c in l.incoming() {
                let Ok(mut c) = c else { break };
                let _ = c.set_nodelay(true);
                let _ = std::thread::Builder::new()
                    .name("echo".into())
                    .spawn(move || {
                        let mut b = [0u8; 64 * 1024];
                        while let Ok(n) = c.read(&mut b) {
                            if n == 0 || c.write_all(&b[..n]).is_err() {
                                break;
                            }
                        }
                    });
            }
        })?;
    Ok(addr)
}

fn connect(addr: SocketAddr) -> Result<TcpStream> {
    let s = TcpStream::connect(addr).with_context(|| format!("connecting to {addr}"))?;
    s.set_nodelay(true)?;
    Ok(s)
}

/// Send `ops` requests built by `make(i)` one at a time; their latencies.
fn measure(
    s: &mut TcpStream,
    ops: u64,
    mut make: impl FnMut(u64) -> Result<Vec<u8>>,
    check: bool,
) -> Result<Histogram<u64>> {
    let mut h = Histogram::<u64>::new(3)?;
    let mut buf = Vec::with_capacity(1024);
    for i in 0..ops {
        let frame = make(i)?;
        let t0 = Instant::now();
        s.write_all(&frame)?;
        read_message(s, &mut buf)?;
        h.record(t0.elapsed().as_nanos() as u64)?;
        if check && i == 0 {
            let r = reply_doc(&buf)?;
            if r.get_f64("ok").ok() != Some(1.0) && r.get_i32("ok").ok() != Some(1) {
                bail!("request failed: {r}");
            }
            if r.contains_key("writeErrors") {
                bail!("write failed: {r}");
            }
        }
    }
    Ok(h)
}

fn row(op: &str, h: &Histogram<u64>) -> Row {
    let us = |ns: u64| ns as f64 / 1000.0;
    Row {
        op: op.into(),
        requests: h.len(),
        p50_us: us(h.value_at_quantile(0.5)),
        p99_us: us(h.value_at_quantile(0.99)),
        mean_us: h.mean() / 1000.0,
    }
}

/// Every kind against one server: the echo first, then the server's kinds.
fn kinds(
    server: &SpawnedServer,
    echo: SocketAddr,
    ops: u64,
) -> Result<Vec<(String, Histogram<u64>)>> {
    let mut s = connect(server.addr)?;
    let mut e = connect(echo)?;
    let warm = (ops / 10).max(1);
    let ping = op_msg(1, &doc! {"ping": 1, "$db": "admin"})?;
    let mut rid = 2i32;
    let mut next = || {
        rid = rid.wrapping_add(1);
        rid
    };
    // Load the documents `find` and `update` touch.
    let docs: Vec<Document> = (0..RECORDS).map(|i| doc! {"_id": i, "x": 0i64}).collect();
    let load = op_msg(next(), &doc! {"insert": COLL, "documents": docs, "$db": DB})?;
    measure(&mut s, 1, |_| Ok(load.clone()), true)?;
    let mut out = Vec::new();
    for (name, phase) in [
        ("echo", 0),
        ("ping", 1),
        ("find", 2),
        ("insert", 3),
        ("update", 4),
    ] {
        let mut insert_id = RECORDS;
        let mut make = |i: u64| -> Result<Vec<u8>> {
            let k = (i as i64 * 7919) % RECORDS;
            match phase {
                0 | 1 => Ok(ping.clone()),
                2 => op_msg(
                    next(),
                    &doc! {"find": COLL, "filter": {"_id": k}, "limit": 1, "singleBatch": true, "$db": DB},
                ),
                3 => {
                    insert_id += 1;
                    op_msg(
                        next(),
                        &doc! {"insert": COLL, "documents": [{"_id": insert_id, "x": 1i64}], "$db": DB},
                    )
                }
                _ => op_msg(
                    next(),
                    &doc! {"update": COLL, "updates": [{"q": {"_id": k}, "u": {"$inc": {"x": 1i64}}}], "$db": DB},
                ),
            }
        };
        let sock = if phase == 0 { &mut e } else { &mut s };
        measure(sock, warm, &mut make, phase != 0)?;
        let h = measure(sock, ops, &mut make, phase != 0)?;
        out.push((name.to_string(), h));
    }
    Ok(out)
}

/// The request paths compared in one run: the server as it was (every
/// command on a blocking thread) and as it is (short commands inline).
const PATHS: [(&str, bool); 2] = [("spawn_blocking", false), ("inline", true)];

/// Run every kind `ops` times (after `ops / 10` unmeasured warm-up requests
/// each) on each request path, a fresh server each; a Markdown table with
/// each kind's p50 over the echo's of the same pass.
pub fn run(durable: bool, ops: u64) -> Result<(Vec<Row>, String)> {
    let echo = echo_server()?;
    let mut rows = Vec::new();
    let mut md = format!(
        "Servers: `duet serve` spawned in this process ({}), one per request path; client: one blocking loopback socket sending raw OP_MSG frames, one request at a time; echo: a thread-per-connection TCP echo server in the same process answering the `ping` frame, measured in each pass. {ops} requests per kind after {} warm-up.\n\n| path | request | p50 µs | p99 µs | mean µs | p50 over echo µs |\n|---|---|---:|---:|---:|---:|\n",
        if durable { "durable: WAL, fsync per acknowledged write" } else { "in-memory engine" },
        (ops / 10).max(1),
    );
    for (path, inline) in PATHS {
        let server = SpawnedServer::start_with(durable, |c| c.inline_commands = inline)?;
        let measured = kinds(&server, echo, ops)?;
        drop(server);
        let echo_p50 = measured
            .first()
            .map_or(0, |(_, h)| h.value_at_quantile(0.5)) as f64
            / 1000.0;
        for (name, h) in &measured {
            let mut r = row(name, h);
            r.op = format!("{path}/{name}");
            md.push_str(&format!(
                "| {path} | {name} | {:.1} | {:.1} | {:.1} | {:.1} |\n",
                r.p50_us,
                r.p99_us,
                r.mean_us,
                r.p50_us - echo_p50
            ));
            rows.push(r);
        }
    }
    Ok((rows, md))
}
