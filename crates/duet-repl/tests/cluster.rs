//! A 3-member replica set in one process (three engines on three data
//! directories, Raft on loopback ports): the log/apply path end to end.
//!
//! - writes made through the primary's engine reach every member, and the
//!   members' WALs then hold byte-identical records (the followers log the
//!   primary's record verbatim);
//! - a member that is not primary refuses writes (NotWritablePrimary) and
//!   publishes nothing;
//! - after the primary stops, another member is elected and takes writes,
//!   and every write acknowledged before is on the new primary;
//! - a restarted member catches up from the Raft log and skips what its
//!   databases already hold, and still knows the retryable writes and the
//!   transaction commits it applied before (their origin tags);
//! - with Raft snapshots every few entries, the log is purged, and a member
//!   whose disk was wiped catches up from a snapshot (then from the log),
//!   also across its own restart, and knows the retryable writes the
//!   snapshot holds and has its named snapshots (same documents, digests
//!   and descriptions; the durable one also after its restart);
//! - an idle primary writes no-op entries, so a secondary's last write time
//!   and date advance while no database changes.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bson::doc;
use duet_repl::{Member, Options, Role};
use duetdb::Engine;

struct Node {
    engine: Arc<Engine>,
    member: Arc<Member>,
}

/// Wire ports whose Raft ports (+1000) are free too, both below the
/// kernel's ephemeral range (32768 and up on Linux), where an outgoing
/// connection could take one before the member binds it.
fn free_ports(n: usize) -> Vec<u16> {
    let seed = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos())
        ^ std::process::id();
    let mut out: Vec<u16> = Vec::new();
    let mut i = 0u32;
    while out.len() < n {
        i += 1;
        let p = 20_000 + (seed.wrapping_add(i.wrapping_mul(7919)) % 11_000) as u16;
        if out
            .iter()
            .any(|q| p.abs_diff(*q) == 0 || p.abs_diff(*q) == 1000)
        {
            continue;
        }
        let free = |port: u16| std::net::TcpListener::bind(("127.0.0.1", port)).is_ok();
        if free(p) && free(p + 1000) {
            out.push(p);
        }
    }
    out
}

async fn start(dir: &Path, id: u64, members: &[String]) -> Node {
    start_with(dir, id, members, 0).await
}

async fn start_with(dir: &Path, id: u64, members: &[String], snapshot_entries: u64) -> Node {
    start_opts(dir, id, members, snapshot_entries, Duration::ZERO).await
}

async fn start_opts(
    dir: &Path,
    id: u64,
    members: &[String],
    snapshot_entries: u64,
    noop_interval: Duration,
) -> Node {
    let engine = Arc::new(Engine::open(dir).expect("engine"));
    let member = Member::start(
        Options {
            set_name: "rs0".into(),
            member_id: id,
            members: members.to_vec(),
            data_dir: dir.to_path_buf(),
            commit_timeout: Duration::from_secs(10),
            snapshot_entries,
            noop_interval,
        },
        &engine,
    )
    .await
    .expect("member");
    Node { engine, member }
}

/// A retryable write's (or a transaction commit's) origin tag, as the
/// server makes it: `txnNumber` then the session id.
fn tag(lsid: u8, n: i64) -> Arc<[u8]> {
    let mut t = n.to_le_bytes().to_vec();
    t.extend_from_slice(&[lsid; 16]);
    t.into()
}

/// A retryable write of `tag` on `engine`'s database `d`.
fn tagged_insert(engine: &Engine, tag: Arc<[u8]>, id: i32) {
    engine
        .database("d")
        .expect("db")
        .with_origin(tag)
        .collection("c")
        .insert_one(doc! {"_id": id, "v": id})
        .expect("tagged insert");
}

fn wait_until(what: &str, mut ok: impl FnMut() -> bool) {
    let start = Instant::now();
    while !ok() {
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "timed out waiting for {what}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn primary(nodes: &[Option<Node>]) -> usize {
    let mut found = None;
    wait_until("a writable primary", || {
        found = nodes
            .iter()
            .position(|n| n.as_ref().is_some_and(|n| n.member.is_writable_primary()));
        found.is_some()
    });
    found.expect("primary")
}

fn count(n: &Node) -> u64 {
    match n.engine.get("d").expect("name") {
        // Reads of a held snapshot: they need no writer (a VLS scan
        // registers through the writer, which a secondary refuses).
        Some(db) => db.snapshot().collection("c").count(doc! {}).expect("count"),
        None => 0,
    }
}

/// Every WAL record payload of database `d` under `dir`, in order.
fn wal_records(dir: &Path) -> Vec<Vec<u8>> {
    let mut segs: Vec<PathBuf> = std::fs::read_dir(dir.join("d"))
        .expect("dir")
        .flatten()
        .map(|e| e.path())
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with("wal-"))
        })
        .collect();
    segs.sort();
    let mut out = Vec::new();
    for s in segs {
        let buf = std::fs::read(&s).expect("segment");
        let mut pos = 8;
        while let Ok(Some((payload, next))) = duetdb::storage::wal::read_frame(&buf, pos) {
            out.push(payload.to_vec());
            pos = next;
        }
    }
    out
}

#[test]
fn three_members_replicate_fail_over_and_catch_up() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(4)
        .enable_all()
        .build()
        .expect("runtime");
    let tmp = tempfile::tempdir().expect("tmp");
    let ports = free_ports(3);
    let members: Vec<String> = ports.iter().map(|p| format!("127.0.0.1:{p}")).collect();
    let dirs: Vec<PathBuf> = (0..3).map(|i| tmp.path().join(format!("m{i}"))).collect();
    let mut nodes: Vec<Option<Node>> = rt.block_on(async {
        let mut v = Vec::new();
        for (i, d) in dirs.iter().enumerate() {
            v.push(Some(start(d, i as u64, &members).await));
        }
        v
    });

    // Writes on the primary reach every member.
    let p = primary(&nodes);
    let pe = nodes[p].as_ref().expect("p").engine.clone();
    let coll = pe.database("d").expect("db").collection("c");
    for i in 0..20 {
        coll.insert_one(doc! {"_id": i, "v": i}).expect("insert");
    }
    coll.update_many(doc! {"_id": {"$lt": 5}}, doc! {"$set": {"u": true}})
        .expect("update");
    // A retryable write and a transaction's commit, tagged as the server
    // tags them.
    tagged_insert(&pe, tag(1, 1), 20);
    let mut tx = pe
        .database("d")
        .expect("db")
        .begin(duetdb::TxnOptions::default());
    tx.insert_one("c", doc! {"_id": 21}).expect("txn insert");
    tx.tag(tag(2, 5));
    tx.commit().expect("commit");
    coll.delete_many(doc! {"_id": {"$gte": 20}})
        .expect("delete");
    let csn = pe.get("d").expect("n").expect("d").csn();
    for n in nodes.iter().flatten() {
        wait_until("replication to every member", || {
            n.engine
                .get("d")
                .expect("name")
                .is_some_and(|d| d.csn() == csn)
        });
        assert_eq!(count(n), 20);
        let db = n.engine.get("d").expect("name").expect("d");
        let snap = db.snapshot();
        assert_eq!(
            snap.collection("c").count(doc! {"u": true}).expect("count"),
            5
        );
    }
    let want = wal_records(&dirs[p]);
    assert!(!want.is_empty());
    for d in &dirs {
        assert_eq!(
            wal_records(d),
            want,
            "byte-identical WAL records on {}",
            d.display()
        );
    }

    // A secondary refuses writes and publishes nothing.
    let s = (p + 1) % 3;
    let se = nodes[s].as_ref().expect("s");
    assert_eq!(se.member.status().role, Role::Secondary);
    let e = se
        .engine
        .database("d")
        .expect("db")
        .collection("c")
        .insert_one(doc! {"_id": 100})
        .expect_err("a secondary refuses writes");
    assert_eq!(e.code(), 10107, "{e}");
    assert_eq!(count(se), 20);

    // The primary stops: another member takes over with every write.
    drop((pe, coll));
    let old = nodes[p].take().expect("old primary");
    rt.block_on(old.member.shutdown());
    drop(old);
    let q = primary(&nodes);
    assert_ne!(q, p);
    let qe = nodes[q].as_ref().expect("q").engine.clone();
    assert_eq!(count(nodes[q].as_ref().expect("q")), 20);
    let coll = qe.database("d").expect("db").collection("c");
    for i in 20..30 {
        coll.insert_one(doc! {"_id": i})
            .expect("insert on the new primary");
    }

    for n in nodes.iter().flatten() {
        assert!(n.member.applied_retryable(&tag(1, 1)));
        assert!(n.member.applied_retryable(&tag(2, 5)));
        assert!(!n.member.applied_retryable(&tag(2, 4)));
    }

    // The old primary comes back and catches up from the log; it knows the
    // retryable writes it applied before it stopped (their entries are not
    // applied again: its databases hold them), from its own files.
    let back = rt.block_on(start(&dirs[p], p as u64, &members));
    assert!(back.member.applied_retryable(&tag(1, 1)), "after a restart");
    assert!(back.member.applied_retryable(&tag(2, 5)), "after a restart");
    wait_until("the restarted member to catch up", || count(&back) == 30);
    nodes[p] = Some(back);
    let want = wal_records(&dirs[q]);
    for d in &dirs {
        assert_eq!(
            wal_records(d),
            want,
            "byte-identical after failover: {}",
            d.display()
        );
    }
    for n in nodes.iter().flatten() {
        rt.block_on(n.member.shutdown());
    }
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(4)
        .enable_all()
        .build()
        .expect("runtime")
}

/// The documents of collection `c` of `snap`, sorted by `_id`.
fn sorted_c(snap: duetdb::Snapshot) -> Vec<bson::Document> {
    let mut docs: Vec<bson::Document> = snap.collection("c").find(doc! {}).run().expect("find");
    docs.sort_by_key(|d| d.get_i32("_id").unwrap_or(-1));
    docs
}

/// The documents of `d.c` on `n`, sorted by `_id`.
fn documents(n: &Node) -> Vec<bson::Document> {
    match n.engine.get("d").expect("name") {
        Some(db) => sorted_c(db.snapshot()),
        None => Vec::new(),
    }
}

/// The documents of `d.c` in named snapshot `name` on `n`, sorted by `_id`.
fn named_documents(n: &Node, name: &str) -> Vec<bson::Document> {
    let db = n.engine.get("d").expect("name").expect("d");
    sorted_c(db.named_snapshot(name).expect("named snapshot"))
}

/// What a member's copy of named snapshot `name` of `d` is described by
/// (csn, creation time, TTL, durability).
fn named_info(n: &Node, name: &str) -> (u64, std::time::SystemTime, Option<Duration>, bool) {
    let i = n
        .engine
        .get("d")
        .expect("name")
        .expect("d")
        .snapshot_info(name)
        .expect("info");
    (i.csn, i.created, i.ttl, i.durable)
}

/// Whether every other member holds the same copy of collection `c` of
/// named snapshot `name` as `n` (consistency `all`).
fn all_agree(n: &Node, name: &str) -> bool {
    let mine = duet_repl::digest::of_named(&n.engine, "d", name, "c").expect("digest");
    let others = n.member.member_digests(
        ("d", name, "c"),
        &mine,
        2,
        Duration::from_secs(5),
        Duration::from_secs(15),
    );
    others.len() == 2 && others.iter().all(|(_, d)| d.as_ref() == Ok(&mine))
}

#[test]
fn a_wiped_member_catches_up_from_a_snapshot() {
    let rt = runtime();
    let tmp = tempfile::tempdir().expect("tmp");
    let ports = free_ports(3);
    let members: Vec<String> = ports.iter().map(|p| format!("127.0.0.1:{p}")).collect();
    let dirs: Vec<PathBuf> = (0..3).map(|i| tmp.path().join(format!("m{i}"))).collect();
    const EVERY: u64 = 20;
    let mut nodes: Vec<Option<Node>> = rt.block_on(async {
        let mut v = Vec::new();
        for (i, d) in dirs.iter().enumerate() {
            v.push(Some(start_with(d, i as u64, &members, EVERY).await));
        }
        v
    });
    let p = primary(&nodes);
    let pe = nodes[p].as_ref().expect("p").engine.clone();
    let db = pe.database("d").expect("db");
    let coll = db.collection("c");
    coll.create_index(doc! {"v": 1}, duetdb::IndexOptions::default())
        .expect("index");
    for i in 0..40 {
        coll.insert_one(doc! {"_id": i, "v": i}).expect("insert");
    }
    // Retryable writes the wiped member must know from the snapshot: one
    // before the wipe, one after (the log of both is purged).
    tagged_insert(&pe, tag(3, 1), 1000);
    // Another database the wiped member must get too, and one dropped.
    pe.database("e")
        .expect("e")
        .collection("x")
        .insert_one(doc! {"_id": 1})
        .expect("insert e");
    pe.database("gone")
        .expect("gone")
        .collection("x")
        .insert_one(doc! {"_id": 1})
        .expect("insert gone");
    // Named snapshots the wiped member must get from the snapshot (one is
    // dropped while it is away), then changes under them.
    let pm = nodes[p].as_ref().expect("p").member.clone();
    let ttl = Some(Duration::from_secs(3600));
    for (name, durable) in [("kept", false), ("pinned", true), ("doomed", false)] {
        let opts = duetdb::SnapshotOptions {
            ttl: ttl.filter(|_| !durable),
            durable,
            ..Default::default()
        };
        pm.create_snapshot("d", name, opts)
            .expect("create snapshot");
    }
    let s = (p + 1) % 3;
    wait_until("replication before the wipe", || {
        documents(nodes[s].as_ref().expect("s")).len() == 41
    });
    let want_named = named_documents(nodes[p].as_ref().expect("p"), "kept");
    assert_eq!(want_named.len(), 41);

    // Member s loses its disk; the set goes on writing and purges its log.
    let lost = nodes[s].take().expect("s");
    rt.block_on(lost.member.shutdown());
    drop(lost);
    // A snapshot build the member started may still be finishing its files.
    wait_until("the wipe", || std::fs::remove_dir_all(&dirs[s]).is_ok());
    nodes[p]
        .as_ref()
        .expect("p")
        .member
        .drop_database("gone")
        .expect("drop gone");
    pm.drop_snapshot("d", "doomed").expect("drop snapshot");
    coll.update_many(doc! {"_id": {"$lt": 10}}, doc! {"$set": {"u": true}})
        .expect("update");
    tagged_insert(&pe, tag(3, 2), 1001);
    coll.delete_many(doc! {"_id": {"$gte": 1000}})
        .expect("delete");
    for i in 40..100 {
        coll.insert_one(doc! {"_id": i, "v": i}).expect("insert");
    }
    wait_until("a snapshot and a purge on the primary", || {
        let st = pm.status();
        st.snapshots_built > 0 && st.purged_index > 0
    });
    let st = pm.status();
    assert!(st.snapshot_index >= EVERY, "{}", st.snapshot_index);

    // It comes back empty: a snapshot, then the log.
    let back = rt.block_on(start_with(&dirs[s], s as u64, &members, EVERY));
    let want = documents(nodes[p].as_ref().expect("p"));
    assert_eq!(want.len(), 100);
    wait_until("the wiped member to catch up", || documents(&back) == want);
    assert!(back.member.status().snapshots_installed >= 1);
    for n in [1, 2] {
        assert!(
            back.member.applied_retryable(&tag(3, n)),
            "retryable write {n} known from the snapshot"
        );
    }
    assert!(back.engine.get("gone").expect("name").is_none());
    let e = back.engine.get("e").expect("name").expect("e").snapshot();
    assert_eq!(e.collection("x").count(doc! {}).expect("count"), 1);
    let idx = back
        .engine
        .get("d")
        .expect("name")
        .expect("d")
        .collection("c")
        .list_indexes()
        .expect("indexes");
    assert_eq!(idx.len(), 2, "the index came with the snapshot: {idx:?}");
    // Its named snapshots: the same copies as everyone's, the same
    // descriptions, the dropped one absent.
    let pn = nodes[p].as_ref().expect("p");
    for name in ["kept", "pinned"] {
        assert_eq!(named_documents(&back, name), want_named, "{name}");
        assert_eq!(named_info(&back, name), named_info(pn, name), "{name}");
        assert!(
            all_agree(&back, name),
            "{name}: every member's digest agrees"
        );
    }
    assert!(named_info(&back, "pinned").3, "still durable");
    let d = back.engine.get("d").expect("name").expect("d");
    assert_eq!(d.named_snapshot("doomed").expect_err("dropped").code(), 246);
    drop(d);
    nodes[s] = Some(back);
    for i in 100..110 {
        coll.insert_one(doc! {"_id": i, "v": i})
            .expect("insert after");
    }
    let want = documents(nodes[p].as_ref().expect("p"));
    for n in nodes.iter().flatten() {
        wait_until("every member after the catch-up", || documents(n) == want);
    }

    // The snapshot-installed member restarts from its own files.
    let again = nodes[s].take().expect("s");
    rt.block_on(again.member.shutdown());
    drop(again);
    let back = rt.block_on(start_with(&dirs[s], s as u64, &members, EVERY));
    assert_eq!(documents(&back), want, "at once, from its own disk");
    for n in [1, 2] {
        assert!(
            back.member.applied_retryable(&tag(3, n)),
            "{n} after a restart"
        );
    }
    // The durable named snapshot survives the restart; the other does not
    // (as on any member restarted).
    assert_eq!(named_documents(&back, "pinned"), want_named);
    assert!(all_agree(&back, "pinned"));
    let d = back.engine.get("d").expect("name").expect("d");
    assert!(d.named_snapshot("kept").is_err());
    drop(d);
    nodes[s] = Some(back);
    drop((coll, db, pe));
    for n in nodes.iter().flatten() {
        rt.block_on(n.member.shutdown());
    }
}

#[test]
fn an_idle_primary_writes_noops_that_advance_every_members_last_write() {
    let rt = runtime();
    let tmp = tempfile::tempdir().expect("tmp");
    let ports = free_ports(3);
    let members: Vec<String> = ports.iter().map(|p| format!("127.0.0.1:{p}")).collect();
    let dirs: Vec<PathBuf> = (0..3).map(|i| tmp.path().join(format!("m{i}"))).collect();
    let every = Duration::from_millis(200);
    let nodes: Vec<Option<Node>> = rt.block_on(async {
        let mut v = Vec::new();
        for (i, d) in dirs.iter().enumerate() {
            v.push(Some(start_opts(d, i as u64, &members, 0, every).await));
        }
        v
    });
    let p = primary(&nodes);
    let pe = nodes[p].as_ref().expect("p").engine.clone();
    pe.database("d")
        .expect("db")
        .collection("c")
        .insert_one(doc! {"_id": 1})
        .expect("insert");
    let csn = pe.get("d").expect("n").expect("d").csn();
    let s = (p + 1) % 3;
    let sm = nodes[s].as_ref().expect("s").member.clone();
    let se = nodes[s].as_ref().expect("s").engine.clone();
    wait_until("the write on the secondary", || {
        se.get("d").expect("name").is_some_and(|d| d.csn() == csn)
    });
    let before = sm.status();
    let wal = wal_records(&dirs[s]);
    // Nothing is written; the secondary's last write moves on by a second
    // (five intervals) with the primary's clock, through applied entries.
    wait_until("the secondary's last write to advance", || {
        let now = sm.status();
        now.last_write_wall_ms >= before.last_write_wall_ms + 1000
            && now.last_write_ts > before.last_write_ts
            && now.applied.1 > before.applied.1
    });
    assert_eq!(se.get("d").expect("n").expect("d").csn(), csn);
    assert_eq!(wal_records(&dirs[s]), wal, "no-ops change no database");
    let noop_ts = sm.status().last_write_ts;
    // A write after the no-ops takes a later time (the primary's clock
    // went through theirs).
    pe.database("d")
        .expect("db")
        .collection("c")
        .insert_one(doc! {"_id": 2})
        .expect("insert after");
    let ts = pe
        .get("d")
        .expect("n")
        .expect("d")
        .snapshot()
        .cluster_time();
    assert!(ts > noop_ts, "{ts} after {noop_ts}");
    wait_until("the write after the no-ops", || {
        count(nodes[s].as_ref().expect("s")) == 2
    });
    for n in nodes.iter().flatten() {
        rt.block_on(n.member.shutdown());
    }
}
