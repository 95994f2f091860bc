//! The wire fuzz harness: arbitrary bytes as one client's byte stream, run
//! through the server's own frame reader (`wire::read_frame`), OP_MSG /
//! OP_QUERY decoding and command dispatch (`commands::execute`) against a
//! fresh in-memory server state — the path `connection::serve` takes, minus
//! the socket and the blocking-thread hop.
//!
//! Shared by the cargo-fuzz target (`fuzz/fuzz_targets/wire.rs`) and the
//! stable corpus replay test (`crates/duet-server/tests/fuzz_corpus.rs`, which
//! includes this file by path), so CI runs the same checks without nightly.
//!
//! What a run asserts (a panic is a finding):
//! - no handler or decoder panics on any input;
//! - at most [`MAX_FRAMES`] messages are read per input, and every reply
//!   serializes and fits in a message (`MAX_MESSAGE_BYTES`);
//! - every reply has a numeric `ok`; an error reply (`ok: 0`) carries a
//!   non-zero int32 `code` and a string `errmsg`;
//! - after the stream, the server still answers `ping`, and every collection
//!   it holds passes `check_invariants` (documents, indexes and version chains
//!   agree): hostile commands never corrupt stored data.
//!
//! [`seeds`] builds the seed corpus: valid messages for every command family.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bson::{doc, Bson, Document};
use duet_server::commands;
use duet_server::opmsg::{self, FLAG_CHECKSUM_PRESENT, FLAG_MORE_TO_COME};
use duet_server::state::{Config, ConnInfo, ServerState};
use duet_server::wire::{self, MAX_MESSAGE_BYTES, OP_MSG, OP_QUERY};

/// Messages read from one input at most: enough for insert → find → getMore
/// chains, small enough that one input stays fast.
pub const MAX_FRAMES: usize = 16;

/// What one input did (for the corpus test's expectations).
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Outcome {
    /// Whole messages read before the stream ended or a frame was refused.
    pub frames: usize,
    /// Commands handed to dispatch.
    pub commands: usize,
    /// Codes of the error replies, in order (decode errors included).
    pub error_codes: Vec<i32>,
    /// Why reading stopped: `None` when the stream ended cleanly between
    /// messages or the frame cap was reached, else what closed the connection.
    pub closed_by: Option<String>,
}

thread_local! {
    static RUNTIME: tokio::runtime::Runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .expect("a current-thread tokio runtime (harness setup, not input)");
}

fn fresh_state() -> Arc<ServerState> {
    let config = Config {
        data_dir: None,
        port: 0,
        // Few cursors per connection so the limit is reachable by fuzzing.
        cursors_per_connection: 8,
        ..Config::default()
    };
    ServerState::new(duetdb::Engine::in_memory(), config)
}

/// Run one input as a client's byte stream; panics on a violated invariant.
pub fn run(data: &[u8]) -> Outcome {
    let state = fresh_state();
    let conn = ConnInfo::new(
        1,
        SocketAddr::from(([127, 0, 0, 1], 40000)),
        SocketAddr::from(([127, 0, 0, 1], 27017)),
    );
    let mut out = Outcome::default();
    let mut rest = data;
    while out.frames < MAX_FRAMES {
        let timeouts = wire::Timeouts {
            idle: Duration::from_secs(1),
            message: Duration::from_secs(1),
        };
        let frame = RUNTIME
            .with(|rt| rt.block_on(wire::read_frame(&mut rest, timeouts, &state.incomplete)));
        let frame = match frame {
            Ok(f) => f,
            Err(wire::FrameError::Closed) => break,
            Err(e) => {
                out.closed_by = Some(e.to_string());
                break;
            }
        };
        out.frames += 1;
        assert!(
            frame.body.len() + wire::HEADER_LEN <= MAX_MESSAGE_BYTES,
            "frame over the limit was accepted"
        );
        let reply = match frame.header.op_code {
            OP_MSG => {
                let more_to_come = opmsg::peek_flags(&frame.body) & FLAG_MORE_TO_COME != 0;
                let reply = match opmsg::decode(&frame.header, &frame.body) {
                    Ok(req) => match req.command.get("$db") {
                        Some(Bson::String(db)) => {
                            let db = db.clone();
                            command(&state, &conn, &db, &req.command, &mut out)
                        }
                        _ => doc! {"ok": 0.0, "errmsg": "no $db", "code": 40571},
                    },
                    Err(e) => doc! {"ok": 0.0, "errmsg": e.message, "code": e.code},
                };
                check_reply(&reply, &mut out);
                (!more_to_come).then_some(reply)
            }
            OP_QUERY => {
                let reply = match duet_server::opquery::decode(&frame.body) {
                    Ok(q) => command(&state, &conn, &q.db, &q.command, &mut out),
                    Err(e) => doc! {"ok": 0.0, "errmsg": e.message, "code": e.code},
                };
                check_reply(&reply, &mut out);
                Some(reply)
            }
            other => {
                out.closed_by = Some(format!("unsupported opcode {other}"));
                break;
            }
        };
        if let Some(reply) = reply {
            let mut bytes = Vec::new();
            reply
                .to_writer(&mut bytes)
                .unwrap_or_else(|e| panic!("reply does not serialize: {e}: {reply:?}"));
            let framed = wire::frame_reply(2, 1, OP_MSG, &opmsg::encode_reply(&bytes));
            assert!(
                framed.len() <= MAX_MESSAGE_BYTES,
                "reply of {} bytes is over the message limit",
                framed.len()
            );
        }
    }
    check_server(&state, &conn);
    out
}

/// Dispatch as `connection::run_command` does (its `maxTimeMS` check first).
fn command(
    state: &Arc<ServerState>,
    conn: &ConnInfo,
    db: &str,
    cmd: &Document,
    out: &mut Outcome,
) -> Document {
    match duet_server::args::opt_i64(cmd, "maxTimeMS") {
        Err(e) => return e.to_reply(),
        Ok(Some(ms)) if ms < 0 => {
            return doc! {"ok": 0.0, "errmsg": "maxTimeMS must be non-negative", "code": 2}
        }
        Ok(_) => {}
    }
    out.commands += 1;
    commands::execute(state, conn, db, cmd)
}

fn check_reply(reply: &Document, out: &mut Outcome) {
    let ok = match reply.get("ok") {
        Some(Bson::Double(f)) => *f,
        Some(Bson::Int32(i)) => f64::from(*i),
        Some(Bson::Int64(i)) => *i as f64,
        other => panic!("reply without a numeric ok ({other:?}): {reply:?}"),
    };
    if ok == 0.0 {
        let code = match reply.get("code") {
            Some(Bson::Int32(c)) if *c != 0 => *c,
            other => panic!("error reply without a non-zero int32 code ({other:?}): {reply:?}"),
        };
        assert!(
            matches!(reply.get("errmsg"), Some(Bson::String(_))),
            "error reply without errmsg: {reply:?}"
        );
        out.error_codes.push(code);
    } else {
        assert_eq!(ok, 1.0, "ok is neither 0 nor 1: {reply:?}");
    }
}

/// The server still serves, and nothing it stores is inconsistent.
fn check_server(state: &Arc<ServerState>, conn: &ConnInfo) {
    let pong = commands::execute(state, conn, "admin", &doc! {"ping": 1});
    assert_eq!(
        pong.get_f64("ok").ok(),
        Some(1.0),
        "ping after the input: {pong:?}"
    );
    for (name, db) in state.engine.list_databases() {
        for coll in db.list_collection_names() {
            if let Err(e) = db.collection(&coll).check_invariants() {
                panic!("{name}.{coll} is inconsistent after the input: {e}");
            }
        }
    }
}

// ---- The seed corpus ----------------------------------------------------

/// One seed: a file name in `fuzz/corpus/wire/`, its bytes, and whether
/// every command in it is expected to succeed.
pub struct Seed {
    pub name: &'static str,
    pub bytes: Vec<u8>,
    pub all_ok: bool,
}

fn frame(op: i32, request_id: i32, payload: &[u8]) -> Vec<u8> {
    let mut v = Vec::with_capacity(16 + payload.len());
    v.extend(((16 + payload.len()) as i32).to_le_bytes());
    v.extend(request_id.to_le_bytes());
    v.extend(0i32.to_le_bytes());
    v.extend(op.to_le_bytes());
    v.extend(payload);
    v
}

fn bson_bytes(d: &Document) -> Vec<u8> {
    let mut v = Vec::new();
    d.to_writer(&mut v).expect("seed documents serialize");
    v
}

/// OP_MSG with a kind-0 body and optional kind-1 sequences.
fn msg_with(flags: u32, body: &Document, sequences: &[(&str, Vec<Document>)]) -> Vec<u8> {
    let mut p = flags.to_le_bytes().to_vec();
    p.push(0);
    p.extend(bson_bytes(body));
    for (ident, docs) in sequences {
        let docs: Vec<u8> = docs.iter().flat_map(bson_bytes).collect();
        p.push(1);
        p.extend(((4 + ident.len() + 1 + docs.len()) as i32).to_le_bytes());
        p.extend(ident.as_bytes());
        p.push(0);
        p.extend(docs);
    }
    frame(OP_MSG, 1, &p)
}

fn msg(body: Document) -> Vec<u8> {
    msg_with(0, &body, &[])
}

/// OP_MSG with `checksumPresent` and a correct CRC-32C over header and body.
fn msg_checksummed(body: &Document) -> Vec<u8> {
    let mut m = msg_with(FLAG_CHECKSUM_PRESENT, body, &[]);
    let len = (m.len() + 4) as i32;
    m[0..4].copy_from_slice(&len.to_le_bytes());
    let crc = crc32c::crc32c(&m);
    m.extend(crc.to_le_bytes());
    m
}

fn query(ns: &str, d: &Document) -> Vec<u8> {
    let mut p = 0i32.to_le_bytes().to_vec();
    p.extend(ns.as_bytes());
    p.push(0);
    p.extend(0i32.to_le_bytes());
    p.extend((-1i32).to_le_bytes());
    p.extend(bson_bytes(d));
    frame(OP_QUERY, 1, &p)
}

fn people() -> Vec<Document> {
    (0..6)
        .map(|i| {
            doc! {
                "_id": i,
                "name": format!("p{i}"),
                "age": 20 + i * 7,
                "tags": ["a", if i % 2 == 0 { "even" } else { "odd" }],
                "addr": {"city": if i < 3 { "Oslo" } else { "Lima" }, "zip": i * 100},
            }
        })
        .collect()
}

fn insert_people() -> Vec<u8> {
    msg(doc! {"insert": "people", "documents": people(), "$db": "t"})
}

fn chain(parts: &[Vec<u8>]) -> Vec<u8> {
    parts.concat()
}

/// Valid messages covering every command family, framing feature and both
/// opcodes; each is one file of the seed corpus.
pub fn seeds() -> Vec<Seed> {
    let ok = |name, bytes| Seed {
        name,
        bytes,
        all_ok: true,
    };
    let lsid = doc! {"id": Bson::Binary(bson::Binary {
        subtype: bson::spec::BinarySubtype::Uuid,
        bytes: vec![7; 16],
    })};
    vec![
        ok(
            "hello",
            msg(
                doc! {"hello": 1, "helloOk": true, "client": {"driver": {"name": "fuzz", "version": "1"}}, "$db": "admin"},
            ),
        ),
        ok(
            "legacy-ismaster",
            query("admin.$cmd", &doc! {"isMaster": 1, "helloOk": true}),
        ),
        ok(
            "legacy-wrapped-query",
            query(
                "admin.$cmd",
                &doc! {"$query": {"ismaster": 1}, "$readPreference": {"mode": "primaryPreferred"}},
            ),
        ),
        ok(
            "admin-commands",
            chain(&[
                msg(doc! {"ping": 1, "lsid": lsid.clone(), "$db": "admin"}),
                msg(doc! {"buildInfo": 1, "$db": "admin"}),
                msg(doc! {"hostInfo": 1, "$db": "admin"}),
                msg(doc! {"getParameter": "*", "$db": "admin"}),
                msg(doc! {"whatsmyuri": 1, "$db": "admin"}),
                msg(doc! {"connectionStatus": 1, "$db": "admin"}),
                msg(doc! {"getCmdLineOpts": 1, "$db": "admin"}),
                msg(doc! {"getLog": "global", "$db": "admin"}),
            ]),
        ),
        ok(
            "list-commands",
            msg(doc! {"listCommands": 1, "$db": "admin"}),
        ),
        ok(
            "server-status",
            chain(&[
                insert_people(),
                msg(doc! {"serverStatus": 1, "$db": "admin"}),
            ]),
        ),
        ok("insert-body", insert_people()),
        ok(
            "insert-sequence",
            msg_with(
                0,
                &doc! {"insert": "people", "ordered": false, "writeConcern": {"w": 1}, "$db": "t"},
                &[("documents", people())],
            ),
        ),
        ok(
            "insert-checksum",
            msg_checksummed(&doc! {"insert": "c", "documents": [{"_id": 1, "x": 1.5}], "$db": "t"}),
        ),
        ok(
            "insert-more-to-come-then-find",
            chain(&[
                msg_with(
                    FLAG_MORE_TO_COME,
                    &doc! {"insert": "c", "documents": [{"a": 1}, {"a": 2}], "$db": "t"},
                    &[],
                ),
                msg(doc! {"find": "c", "filter": {"a": {"$gte": 1}}, "$db": "t"}),
            ]),
        ),
        ok(
            "find-options",
            chain(&[
                insert_people(),
                msg(doc! {
                    "find": "people",
                    "filter": {"age": {"$gt": 20, "$lt": 60}, "tags": {"$in": ["even", "x"]}},
                    "sort": {"age": -1},
                    "projection": {"name": 1, "addr.city": 1},
                    "skip": 1,
                    "limit": 3,
                    "$db": "t",
                }),
            ]),
        ),
        ok(
            "find-operators",
            chain(&[
                insert_people(),
                msg(doc! {
                    "find": "people",
                    "filter": {"$or": [
                        {"name": {"$regex": "^p[0-3]$", "$options": "i"}},
                        {"addr.zip": {"$exists": true, "$ne": 300}},
                        {"tags": {"$all": ["a"], "$size": 2}},
                        {"$and": [{"age": {"$not": {"$gt": 40}}}, {"age": {"$type": "int"}}]},
                        {"tags": {"$elemMatch": {"$eq": "odd"}}},
                        {"age": {"$nin": [1, 2], "$mod": [7, 6]}},
                    ]},
                    "$db": "t",
                }),
            ]),
        ),
        // Cursor ids are random 63-bit values, so a fixed stream cannot name
        // the cursor its find opened: its getMore gets CursorNotFound (43)
        // and its killCursors reports the id not found (the path a guessing
        // client takes).
        Seed {
            name: "find-getmore-killcursors",
            bytes: chain(&[
                insert_people(),
                msg(doc! {"find": "people", "batchSize": 2, "$db": "t"}),
                msg(doc! {"getMore": 1i64, "collection": "people", "batchSize": 2, "$db": "t"}),
                msg(doc! {"killCursors": "people", "cursors": [1i64], "$db": "t"}),
            ]),
            all_ok: false,
        },
        ok(
            "update-operators",
            chain(&[
                insert_people(),
                msg(doc! {"update": "people", "updates": [
                    {"q": {"_id": 1}, "u": {"$set": {"name": "x", "addr.city": "Rome"}, "$inc": {"age": 1}}},
                    {"q": {"age": {"$gt": 30}}, "u": {"$push": {"tags": "old"}, "$unset": {"addr.zip": ""}}, "multi": true},
                    {"q": {"_id": 99}, "u": {"$setOnInsert": {"new": true}, "$min": {"age": 5}}, "upsert": true},
                    {"q": {"_id": 2}, "u": {"$rename": {"name": "nm"}, "$mul": {"age": 2}, "$addToSet": {"tags": "a"}, "$pull": {"tags": "even"}}},
                ], "ordered": true, "$db": "t"}),
            ]),
        ),
        ok(
            "update-sequence-array-filters",
            chain(&[
                msg(
                    doc! {"insert": "g", "documents": [{"_id": 1, "grades": [80, 95, 100]}], "$db": "t"},
                ),
                msg_with(
                    0,
                    &doc! {"update": "g", "$db": "t"},
                    &[(
                        "updates",
                        vec![
                            doc! {"q": {"_id": 1}, "u": {"$set": {"grades.$[g]": 0}}, "arrayFilters": [{"g": {"$gte": 95}}]},
                            doc! {"q": {"_id": 1}, "u": {"$pop": {"grades": 1}}},
                        ],
                    )],
                ),
            ]),
        ),
        ok(
            "update-replacement",
            chain(&[
                insert_people(),
                msg(
                    doc! {"update": "people", "updates": [{"q": {"_id": 3}, "u": {"name": "replaced", "n": [1, 2, {"deep": null}]}}], "$db": "t"},
                ),
            ]),
        ),
        ok(
            "delete-sequence",
            chain(&[
                insert_people(),
                msg_with(
                    0,
                    &doc! {"delete": "people", "$db": "t"},
                    &[(
                        "deletes",
                        vec![
                            doc! {"q": {"_id": 0}, "limit": 1},
                            doc! {"q": {"addr.city": "Lima"}, "limit": 0},
                        ],
                    )],
                ),
            ]),
        ),
        ok(
            "find-and-modify",
            chain(&[
                insert_people(),
                msg(
                    doc! {"findAndModify": "people", "query": {"_id": 1}, "update": {"$inc": {"age": 1}}, "new": true, "fields": {"age": 1}, "$db": "t"},
                ),
                msg(
                    doc! {"findAndModify": "people", "query": {"age": {"$gt": 40}}, "sort": {"age": 1}, "remove": true, "$db": "t"},
                ),
                msg(
                    doc! {"findAndModify": "people", "query": {"_id": 50}, "update": {"$set": {"a": 1}}, "upsert": true, "new": true, "$db": "t"},
                ),
            ]),
        ),
        ok(
            "count-distinct",
            chain(&[
                insert_people(),
                msg(
                    doc! {"count": "people", "query": {"age": {"$gte": 27}}, "skip": 1, "limit": 10, "$db": "t"},
                ),
                msg(
                    doc! {"distinct": "people", "key": "addr.city", "query": {"age": {"$lt": 100}}, "$db": "t"},
                ),
            ]),
        ),
        ok(
            "aggregate-find-shaped",
            chain(&[
                insert_people(),
                msg(doc! {"aggregate": "people", "pipeline": [
                    {"$match": {"age": {"$gte": 20}}},
                    {"$sort": {"age": -1, "_id": 1}},
                    {"$skip": 1},
                    {"$limit": 4},
                    {"$project": {"name": 1, "age": 1}},
                ], "cursor": {"batchSize": 2}, "$db": "t"}),
                msg(
                    doc! {"aggregate": "people", "pipeline": [{"$match": {"tags": "odd"}}, {"$count": "n"}], "cursor": {}, "$db": "t"},
                ),
            ]),
        ),
        ok(
            "aggregate-group-unwind",
            chain(&[
                insert_people(),
                msg(doc! {"aggregate": "people", "pipeline": [
                    {"$unwind": "$tags"},
                    {"$group": {"_id": "$tags", "n": {"$sum": 1}, "avgAge": {"$avg": "$age"}, "maxZip": {"$max": "$addr.zip"}}},
                    {"$sort": {"_id": 1}},
                ], "cursor": {}, "$db": "t"}),
            ]),
        ),
        ok(
            "indexes",
            chain(&[
                insert_people(),
                msg(doc! {"createIndexes": "people", "indexes": [
                    {"key": {"age": 1}, "name": "age_1"},
                    {"key": {"addr.city": 1, "name": -1}, "name": "city_name", "unique": true},
                ], "$db": "t"}),
                msg(doc! {"listIndexes": "people", "$db": "t"}),
                msg(
                    doc! {"find": "people", "filter": {"age": {"$gte": 30}}, "hint": "age_1", "$db": "t"},
                ),
                msg(
                    doc! {"update": "people", "updates": [{"q": {"age": {"$gte": 30}}, "u": {"$inc": {"age": 1}}, "multi": true}], "$db": "t"},
                ),
                msg(doc! {"dropIndexes": "people", "index": "age_1", "$db": "t"}),
            ]),
        ),
        Seed {
            name: "duplicate-key",
            bytes: chain(&[
                msg(
                    doc! {"createIndexes": "u", "indexes": [{"key": {"email": 1}, "name": "email_1", "unique": true}], "$db": "t"},
                ),
                msg(
                    doc! {"insert": "u", "documents": [{"email": "a"}, {"email": "a"}], "$db": "t"},
                ),
                msg(doc! {"insert": "u", "documents": [{"_id": 1}, {"_id": 1}], "$db": "t"}),
            ]),
            // The inserts reply ok: 1 with writeErrors, as MongoDB does.
            all_ok: true,
        },
        ok(
            "ddl",
            chain(&[
                msg(doc! {"create": "a", "$db": "t"}),
                msg(doc! {"create": "b", "$db": "t"}),
                msg(
                    doc! {"listCollections": 1, "nameOnly": true, "filter": {"name": "a"}, "$db": "t"},
                ),
                msg(doc! {"renameCollection": "t.a", "to": "t.c", "$db": "admin"}),
                msg(doc! {"collStats": "c", "$db": "t"}),
                msg(doc! {"dbStats": 1, "$db": "t"}),
                msg(doc! {"listDatabases": 1, "nameOnly": false, "$db": "admin"}),
                msg(doc! {"drop": "b", "$db": "t"}),
                msg(doc! {"dropDatabase": 1, "$db": "t"}),
            ]),
        ),
        ok(
            "explain",
            chain(&[
                insert_people(),
                msg(
                    doc! {"explain": {"find": "people", "filter": {"_id": {"$gt": 2}}}, "verbosity": "queryPlanner", "$db": "t"},
                ),
                msg(doc! {"explain": {"count": "people", "query": {"age": 27}}, "$db": "t"}),
            ]),
        ),
        ok(
            "read-concern-snapshot",
            chain(&[
                insert_people(),
                msg(doc! {"find": "people", "readConcern": {"level": "snapshot"}, "$db": "t"}),
                msg(
                    doc! {"aggregate": "people", "pipeline": [{"$count": "n"}], "cursor": {}, "$duet": {"snapshot": "vls"}, "$db": "t"},
                ),
                msg(
                    doc! {"distinct": "people", "key": "name", "readConcern": {"level": "snapshot"}, "$duet": {"snapshot": "olcp"}, "$db": "t"},
                ),
            ]),
        ),
        ok(
            "named-snapshots",
            chain(&[
                insert_people(),
                msg(doc! {"createSnapshot": "s1", "$db": "t"}),
                msg(
                    doc! {"update": "people", "updates": [{"q": {}, "u": {"$set": {"age": 0}}, "multi": true}], "$db": "t"},
                ),
                msg(
                    doc! {"find": "people", "filter": {"age": 0}, "$duet": {"snapshotName": "s1"}, "$db": "t"},
                ),
                msg(doc! {"listSnapshots": 1, "$db": "t"}),
                msg(doc! {"dropSnapshot": "s1", "$db": "t"}),
            ]),
        ),
        ok(
            "sessions",
            chain(&[
                msg(
                    doc! {"find": "x", "lsid": lsid.clone(), "$clusterTime": {"clusterTime": Bson::Timestamp(bson::Timestamp { time: 1, increment: 1 })}, "$readPreference": {"mode": "primary"}, "comment": "c", "maxTimeMS": 1000, "apiVersion": "1", "$db": "t"},
                ),
                msg(doc! {"endSessions": [lsid.clone()], "$db": "admin"}),
                msg(doc! {"killSessions": [], "$db": "admin"}),
            ]),
        ),
        Seed {
            name: "errors",
            bytes: chain(&[
                msg(doc! {"noSuchCommand": 1, "$db": "t"}),
                msg(doc! {"find": 5, "$db": "t"}),
                msg(doc! {"insert": "c", "documents": "notarray", "$db": "t"}),
                msg(doc! {"find": "c", "maxTimeMS": -1, "$db": "t"}),
                msg(doc! {"drop": "missing", "$db": "t"}),
                msg(doc! {"ping": 1}),
                msg(doc! {"find": "c", "startTransaction": true, "autocommit": false, "$db": "t"}),
            ]),
            all_ok: false,
        },
    ]
}
