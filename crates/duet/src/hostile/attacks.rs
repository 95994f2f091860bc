//! The attacks of the hostile soak, one function each. An attack opens its
//! own connection(s), does one hostile thing, and says what came back. It
//! never decides that an error is bad on its own: most attacks *should* be
//! refused. A [`Outcome::Violation`] is reserved for what must never happen
//! (another connection's cursor yielding documents, an oversized document
//! accepted, a test knob open to everyone, a duplicate `_id` stored).

use std::net::SocketAddr;
use std::time::Duration;

use duetdb::bson::{doc, Bson, Document};
use rand::rngs::StdRng;
use rand::Rng;

use super::client::{Conn, Reply, OP_MSG};
use super::Shared;

/// Database and collection every heavy attack reads.
pub const BIG_DB: &str = "hostile_big";
pub const BIG_COLL: &str = "docs";

/// How an attack ended.
#[derive(Debug)]
pub enum Outcome {
    /// The server answered `ok: 1`.
    Ok,
    /// The server refused with this code.
    Refused(i32),
    /// The server closed the connection (or the attack gave up on it).
    Closed,
    /// Something that must never happen.
    Violation(String),
}

impl From<Reply> for Outcome {
    fn from(r: Reply) -> Outcome {
        match r {
            Reply::Ok(_) => Outcome::Ok,
            Reply::Err(code, _) => Outcome::Refused(code),
        }
    }
}

/// Every attack, by name.
pub const ATTACKS: &[(&str, Attack)] = &[
    ("ghost_read", ghost_read),
    ("cursor_flood", cursor_flood),
    ("cursor_steal", cursor_steal),
    ("kill_foreign", kill_foreign),
    ("slow_aggregate", slow_aggregate),
    ("huge_document", huge_document),
    ("big_sort", big_sort),
    ("partial_message", partial_message),
    ("idle_connection", idle_connection),
    ("garbage_frame", garbage_frame),
    ("deep_nesting", deep_nesting),
    ("duplicate_id", duplicate_id),
    ("test_knob", test_knob),
];

pub type Attack = fn(&Shared, &mut StdRng) -> Outcome;

const IO_WAIT: Duration = Duration::from_secs(30);

fn connect(addr: SocketAddr) -> Option<Conn> {
    Conn::connect(addr, IO_WAIT).ok()
}

/// Run one command on a fresh connection.
fn once(s: &Shared, db: &str, cmd: Document) -> Outcome {
    let Some(mut c) = connect(s.addr) else {
        return Outcome::Closed;
    };
    match c.run(db, cmd) {
        Ok(r) => r.into(),
        Err(_) => Outcome::Closed,
    }
}

/// Reads, deletes and drops on a database that does not exist: none of them
/// may create it (checked at the end of the soak).
fn ghost_read(s: &Shared, rng: &mut StdRng) -> Outcome {
    let db = format!("ghost_{}", rng.gen::<u32>());
    let cmd = match rng.gen_range(0..7) {
        0 => doc! {"find": "c", "filter": {"x": 1}},
        1 => doc! {"count": "c"},
        2 => doc! {"listCollections": 1},
        3 => doc! {"dbStats": 1},
        4 => doc! {"distinct": "c", "key": "x"},
        5 => doc! {"delete": "c", "deletes": [{"q": {}, "limit": 0}]},
        _ => doc! {"drop": "c"},
    };
    once(s, &db, cmd)
}

/// Open many cursors and walk away (sometimes closing the connection,
/// sometimes leaving it open until the attack ends).
fn cursor_flood(s: &Shared, rng: &mut StdRng) -> Outcome {
    let Some(mut c) = connect(s.addr) else {
        return Outcome::Closed;
    };
    let n = rng.gen_range(20..200);
    let mut last = Outcome::Ok;
    for _ in 0..n {
        match c.run(BIG_DB, doc! {"find": BIG_COLL, "batchSize": 1}) {
            Ok(Reply::Ok(r)) => {
                if let Some(id) = cursor_id(&r) {
                    s.remember_cursor(id);
                }
            }
            Ok(r) => {
                last = r.into();
                break;
            }
            Err(_) => return Outcome::Closed,
        }
    }
    last
}

fn cursor_id(reply: &Document) -> Option<i64> {
    match reply.get_document("cursor").ok()?.get("id")? {
        Bson::Int64(id) if *id != 0 => Some(*id),
        _ => None,
    }
}

/// `getMore` on cursors other connections opened, and on random ids: it must
/// never yield documents.
fn cursor_steal(s: &Shared, rng: &mut StdRng) -> Outcome {
    let Some(mut c) = connect(s.addr) else {
        return Outcome::Closed;
    };
    let id = s
        .some_cursor(rng)
        .unwrap_or_else(|| rng.gen_range(1..i64::MAX));
    match c.run(
        BIG_DB,
        doc! {"getMore": id, "collection": BIG_COLL, "batchSize": 5},
    ) {
        Ok(Reply::Ok(r)) => {
            let got = r
                .get_document("cursor")
                .ok()
                .and_then(|c| c.get_array("nextBatch").ok())
                .map_or(0, Vec::len);
            Outcome::Violation(format!(
                "getMore on cursor {id} from another connection returned {got} documents"
            ))
        }
        Ok(r) => r.into(),
        Err(_) => Outcome::Closed,
    }
}

/// `killCursors` on other connections' cursors and random ids.
fn kill_foreign(s: &Shared, rng: &mut StdRng) -> Outcome {
    let ids: Vec<i64> = (0..rng.gen_range(1..20))
        .map(|_| s.some_cursor(rng).unwrap_or_else(|| rng.gen()))
        .collect();
    once(s, BIG_DB, doc! {"killCursors": BIG_COLL, "cursors": ids})
}

/// A sort + group over the big collection with a tiny `maxTimeMS`: the
/// server must stop the work, not only the client's wait (RSS is watched).
fn slow_aggregate(s: &Shared, rng: &mut StdRng) -> Outcome {
    let ms = rng.gen_range(1..20);
    once(
        s,
        BIG_DB,
        doc! {
            "aggregate": BIG_COLL,
            "pipeline": [
                {"$sort": {"r": 1}},
                {"$group": {"_id": "$g", "n": {"$sum": 1}, "all": {"$push": "$pad"}}},
            ],
            "cursor": {},
            "maxTimeMS": ms,
        },
    )
}

/// A `$concat` whose result is far above 16 MiB: must be refused (10334)
/// before the server builds it all.
fn huge_document(s: &Shared, rng: &mut StdRng) -> Outcome {
    // Literal pieces (the command stays under the 48 MB message limit);
    // their concatenation is 18–35 MB.
    let piece = "x".repeat(rng.gen_range(6..8) << 20);
    let copies = rng.gen_range(3..6);
    let parts: Vec<Bson> = (0..copies).map(|_| Bson::String(piece.clone())).collect();
    match once(
        s,
        BIG_DB,
        doc! {
            "aggregate": BIG_COLL,
            "pipeline": [
                {"$limit": 1},
                {"$project": {"big": {"$concat": parts}}},
            ],
            "cursor": {},
        },
    ) {
        Outcome::Ok => Outcome::Violation(format!(
            "a {copies}-piece $concat (> 16 MiB) was answered ok"
        )),
        other => other,
    }
}

/// A sort the server must do itself (no index gives the order).
fn big_sort(s: &Shared, rng: &mut StdRng) -> Outcome {
    let mut cmd = doc! {"find": BIG_COLL, "sort": {"r": -1}, "batchSize": 10};
    // Past the soak's small sort limit: 292 without disk use, spilled runs with it.
    cmd.insert("allowDiskUse", rng.gen_bool(0.5));
    once(s, BIG_DB, cmd)
}

/// A header claiming a 40 MB message, part of the body, then silence or a
/// hang-up: the server must not keep the bytes.
fn partial_message(s: &Shared, rng: &mut StdRng) -> Outcome {
    let Some(mut c) = connect(s.addr) else {
        return Outcome::Closed;
    };
    let claimed = 40_000_000i32;
    let mut bytes = Vec::new();
    bytes.extend(claimed.to_le_bytes());
    bytes.extend(7i32.to_le_bytes());
    bytes.extend(0i32.to_le_bytes());
    bytes.extend(OP_MSG.to_le_bytes());
    bytes.resize(16 + (rng.gen_range(1..8) << 20), b'p');
    let _ = c.send_raw(&bytes);
    std::thread::sleep(Duration::from_millis(rng.gen_range(0..1500)));
    Outcome::Closed
}

/// Hold a connection without sending anything for a while.
fn idle_connection(s: &Shared, rng: &mut StdRng) -> Outcome {
    let Some(mut c) = connect(s.addr) else {
        return Outcome::Closed;
    };
    let wait = Duration::from_millis(rng.gen_range(500..4000));
    if c.closed_within(wait) {
        Outcome::Closed
    } else {
        Outcome::Ok
    }
}

/// Random bytes in a well-framed OP_MSG, and a truncated BSON body.
fn garbage_frame(s: &Shared, rng: &mut StdRng) -> Outcome {
    let Some(mut c) = connect(s.addr) else {
        return Outcome::Closed;
    };
    let mut body: Vec<u8> = (0..rng.gen_range(1..4096)).map(|_| rng.gen()).collect();
    if rng.gen_bool(0.5) {
        // A plausible start: flags 0, kind 0, a document length larger than what follows.
        let len = body.len();
        body[..4.min(len)].fill(0);
        if len > 9 {
            body[4] = 0;
            body[5..9].copy_from_slice(&(len as i32 * 2).to_le_bytes());
        }
    }
    if c.send_frame(OP_MSG, &body).is_err() {
        return Outcome::Closed;
    }
    match c.read_reply() {
        Ok(r) => match r.get("ok") {
            Some(Bson::Double(f)) if *f == 1.0 => {
                Outcome::Violation("a garbage OP_MSG body was answered ok".into())
            }
            _ => Outcome::Refused(r.get_i32("code").unwrap_or(-1)),
        },
        Err(_) => Outcome::Closed,
    }
}

/// A command nested deeper than the BSON depth limit.
fn deep_nesting(s: &Shared, rng: &mut StdRng) -> Outcome {
    let depth = rng.gen_range(100..160);
    let mut d = doc! {"x": 1};
    for _ in 0..depth {
        d = doc! {"a": d};
    }
    let Some(mut c) = connect(s.addr) else {
        return Outcome::Closed;
    };
    match c.run("hostile_junk", doc! {"insert": "deep", "documents": [d]}) {
        Ok(Reply::Ok(r)) if stored(&r) => {
            Outcome::Violation(format!("a document {depth} levels deep was stored: {r}"))
        }
        Ok(Reply::Ok(r)) => Outcome::Refused(first_write_error(&r)),
        Ok(r) => r.into(),
        Err(_) => Outcome::Closed,
    }
}

/// An insert whose document has two top-level `_id` fields (raw BSON: a
/// `Document` cannot hold duplicate keys). MongoDB refuses it.
fn duplicate_id(s: &Shared, rng: &mut StdRng) -> Outcome {
    let Some(mut c) = connect(s.addr) else {
        return Outcome::Closed;
    };
    let a: i32 = rng.gen();
    let doc = raw_doc(&[("_id", a), ("v", 1), ("_id", a.wrapping_add(1))]);
    let cmd = doc! {"insert": "dups", "$db": "hostile_junk"};
    let mut body = 0u32.to_le_bytes().to_vec();
    body.push(0);
    if cmd.to_writer(&mut body).is_err() {
        return Outcome::Closed;
    }
    // Kind-1 section "documents" holding the raw document.
    body.push(1);
    let ident = b"documents\0";
    body.extend(((4 + ident.len() + doc.len()) as i32).to_le_bytes());
    body.extend_from_slice(ident);
    body.extend_from_slice(&doc);
    if c.send_frame(OP_MSG, &body).is_err() {
        return Outcome::Closed;
    }
    match c.read_reply() {
        Ok(r) if stored(&r) => {
            Outcome::Violation("a document with two _id fields was stored".into())
        }
        Ok(r) => Outcome::Refused(r.get_i32("code").unwrap_or_else(|_| first_write_error(&r))),
        Err(_) => Outcome::Closed,
    }
}

/// Whether a write reply says a document was written.
fn stored(reply: &Document) -> bool {
    match reply.get("n") {
        Some(Bson::Int32(n)) => *n > 0,
        Some(Bson::Int64(n)) => *n > 0,
        _ => false,
    }
}

/// The code of a write reply's first write error (-1: none).
fn first_write_error(reply: &Document) -> i32 {
    reply
        .get_array("writeErrors")
        .ok()
        .and_then(|e| e.first())
        .and_then(|e| e.as_document())
        .and_then(|e| e.get_i32("code").ok())
        .unwrap_or(-1)
}

/// A BSON document of int32 fields, keys as given (duplicates allowed).
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

/// `$duet.workNsPerDoc` without `--enable-test-knobs`: must be refused.
fn test_knob(s: &Shared, _rng: &mut StdRng) -> Outcome {
    match once(
        s,
        BIG_DB,
        doc! {"count": BIG_COLL, "$duet": {"snapshot": "vls", "workNsPerDoc": 1i64}},
    ) {
        Outcome::Ok => {
            Outcome::Violation("$duet.workNsPerDoc accepted without --enable-test-knobs".into())
        }
        other => other,
    }
}
