//! Deterministic simulation of a 3-member replica set under network
//! faults and crashes, with an Elle-style check of the clients' histories
//! (docs/design.md §19, "Simulation").
//!
//! One seed decides everything the harness decides: each member's election
//! timeout, every Raft message's fate on the simulated network
//! (`duet_repl::sim`: loss, delay, long delays that reorder), the fault
//! schedule (partitions, one-way cuts, bridges, crashes and restarts) and
//! the clients' operations. The cluster runs in one current-thread tokio
//! runtime with paused time, so timeouts and delays are virtual.
//!
//! Clients append unique values to a few lists (`$push`, each acknowledged
//! only once a majority committed it: `w: "majority"`) and read lists at
//! one snapshot of the primary or of any member (read concern `majority`:
//! a member publishes only committed entries). Their invoke / ok / fail /
//! info history is checked with `adya` (list-append, model `serializable`:
//! no G0, G1a/b/c, G-single, G2, lost update), and after healing, every
//! member must hold the same lists, containing every acknowledged append.
//!
//! Every run prints its seed; `DUET_SIM_SEED=S` replays one seed and
//! `DUET_SIM_SEEDS=N` runs N seeds from `DUET_SIM_BASE` (default 1000) —
//! the soak, not run in CI.

// Tests fail loudly on any unexpected error; unwrap is the point here.
#![allow(clippy::unwrap_used)]

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use adya::{check, History, Opts, Valid, Workload};
use bson::{doc, Bson, Document};
use duet_repl::network::Transport;
use duet_repl::sim::{Faults, SimNet};
use duet_repl::{Harness, Member, Options};
use duetdb::Engine;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::{json, Value};

const MEMBERS: usize = 3;
const CLIENTS: u64 = 3;
const KEYS: i64 = 4;
/// Virtual time the clients and faults run.
const RUN: Duration = Duration::from_secs(30);
/// The primary's idle no-ops (`--repl-noop-interval-secs`): every 150 ms
/// by default, interleaved with the clients' groups and the faults
/// (idleness is judged by the wall clock, the entries' dates, which runs
/// slower than the virtual one here); `DUET_SIM_NOOP_MS=N` sets another
/// interval, `0` turns them off.
fn noop_interval() -> Duration {
    std::env::var("DUET_SIM_NOOP_MS")
        .ok()
        .and_then(|v| v.parse::<u64>().ok())
        .map_or(Duration::from_millis(150), Duration::from_millis)
}

struct Node {
    engine: Arc<Engine>,
    member: Arc<Member>,
}

/// The simulated cluster: members that may be down (`None`).
struct Cluster {
    seed: u64,
    net: Arc<SimNet>,
    addrs: Vec<String>,
    dirs: Vec<PathBuf>,
    election_ms: Vec<u64>,
    nodes: Mutex<Vec<Option<Node>>>,
    /// What the fault schedule did, with the virtual time (printed on failure).
    timeline: Mutex<Vec<String>>,
    /// Idle no-ops applied by members' earlier incarnations (counted at
    /// each crash).
    noops: std::sync::atomic::AtomicU64,
    start: tokio::time::Instant,
}

impl Cluster {
    fn log(&self, what: String) {
        let t = self.start.elapsed().as_millis();
        self.timeline
            .lock()
            .unwrap()
            .push(format!("{t:>6} ms  {what}"));
    }

    /// Start member `i` from its data directory (as a restarted process
    /// would). The previous incarnation's last users may still hold its
    /// engine (and the directory lock) for a moment: wait for them, in real
    /// time, with virtual time stopped.
    async fn start(&self, i: usize) {
        let mut tries = 0;
        let engine = loop {
            match Engine::open(&self.dirs[i]) {
                Ok(e) => break Arc::new(e),
                Err(e) => {
                    tries += 1;
                    assert!(
                        tries < 1000,
                        "seed {}: member {i} cannot reopen: {e}",
                        self.seed
                    );
                    std::thread::sleep(Duration::from_millis(10));
                }
            }
        };
        let t = self.election_ms[i];
        let member = Member::start_with(
            Options {
                set_name: "rs0".into(),
                member_id: i as u64,
                members: self.addrs.clone(),
                data_dir: self.dirs[i].clone(),
                commit_timeout: Duration::from_secs(2),
                snapshot_entries: 64,
                noop_interval: noop_interval(),
            },
            &engine,
            Harness {
                transport: Transport::Sim(self.net.clone()),
                election_timeout_ms: Some((t, t + 1)),
                // An idle no-op waits on a blocking thread like a client's
                // operation: the clock is paced meanwhile.
                blocking: Some(Arc::new(|on: bool| {
                    if on {
                        IN_FLIGHT.fetch_add(1, Ordering::SeqCst);
                    } else {
                        IN_FLIGHT.fetch_sub(1, Ordering::SeqCst);
                    }
                })),
            },
        )
        .await
        .unwrap_or_else(|e| panic!("seed {}: member {i}: {e}", self.seed));
        self.nodes.lock().unwrap()[i] = Some(Node { engine, member });
    }

    /// Kill member `i`: its Raft node stops, its writers waiting for a
    /// commit fail, and its engine and member are dropped (what is on disk
    /// stays; see docs/design.md on what this does not model).
    async fn crash(&self, i: usize) {
        let node = self.nodes.lock().unwrap()[i].take();
        if let Some(n) = node {
            self.noops
                .fetch_add(n.member.status().noops_applied, Ordering::Relaxed);
            n.member.shutdown().await;
        }
    }

    fn up(&self) -> Vec<usize> {
        let g = self.nodes.lock().unwrap();
        (0..MEMBERS).filter(|i| g[*i].is_some()).collect()
    }

    /// A member that says it is a writable primary (there may be two for a
    /// while: a deposed one that has not heard yet), chosen by `rng`.
    fn primary(&self, rng: &mut StdRng) -> Option<Arc<Engine>> {
        let g = self.nodes.lock().unwrap();
        let p: Vec<&Node> = g
            .iter()
            .flatten()
            .filter(|n| n.member.is_writable_primary())
            .collect();
        (!p.is_empty()).then(|| p[rng.gen_range(0..p.len())].engine.clone())
    }

    fn any(&self, rng: &mut StdRng) -> Option<Arc<Engine>> {
        let g = self.nodes.lock().unwrap();
        let up: Vec<&Node> = g.iter().flatten().collect();
        (!up.is_empty()).then(|| up[rng.gen_range(0..up.len())].engine.clone())
    }
}

/// Client operations under way on blocking threads (see [`pace`]).
static IN_FLIGHT: AtomicUsize = AtomicUsize::new(0);

/// Run `f` on a blocking thread (the engine blocks: its writer waits for
/// the Raft commit, which this runtime must keep driving). While it runs,
/// tokio does not jump the paused clock ahead; [`pace`] moves it instead.
async fn blocking<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
    IN_FLIGHT.fetch_add(1, Ordering::SeqCst);
    let r = tokio::task::spawn_blocking(f).await;
    IN_FLIGHT.fetch_sub(1, Ordering::SeqCst);
    r.unwrap()
}

/// The virtual clock while client operations run on real threads: 1 ms of
/// virtual time per `PACE` of real time (so a write's Raft round trips,
/// virtual, keep pace with its engine work, real, instead of the clock
/// racing ahead while a thread works); with none under way, tokio jumps
/// the paused clock from timer to timer by itself.
async fn pace(stop: Arc<AtomicBool>) {
    const PACE: Duration = Duration::from_micros(50);
    while !stop.load(Ordering::Relaxed) {
        if IN_FLIGHT.load(Ordering::SeqCst) > 0 {
            std::thread::sleep(PACE);
            tokio::time::advance(Duration::from_millis(1)).await;
        } else {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    }
}

fn read_lists(engine: &Engine, keys: &[i64]) -> Result<Vec<Vec<i64>>, String> {
    let db = engine
        .get("d")
        .map_err(|e| e.to_string())?
        .ok_or("no database d yet")?;
    let snap = db.snapshot();
    let coll = snap.collection("la");
    keys.iter()
        .map(|k| {
            let d = coll.find_one(doc! {"_id": *k}).map_err(|e| e.to_string())?;
            Ok(d.and_then(|d| {
                d.get_array("list")
                    .ok()
                    .map(|a| a.iter().filter_map(Bson::as_i64).collect())
            })
            .unwrap_or_default())
        })
        .collect()
}

/// How an append ended: acknowledged, certainly not applied, or unknown.
enum Ended {
    Ok,
    Fail,
    Info,
}

fn append(engine: &Engine, k: i64, v: i64) -> Ended {
    let Ok(db) = engine.database("d") else {
        return Ended::Fail;
    };
    match db
        .collection("la")
        .update_one(doc! {"_id": k}, doc! {"$push": {"list": v}})
    {
        Ok(r) if r.matched == 1 => Ended::Ok,
        Ok(_) => Ended::Info,
        // Superseded by another primary's entry: it never applies anywhere.
        Err(e) if e.code() == 11602 => Ended::Fail,
        // NotWritablePrimary may come after the entry was proposed (the
        // leader lost its role meanwhile), a commit time-out leaves the
        // entry in the log: unknown.
        Err(_) => Ended::Info,
    }
}

struct Recorder {
    lines: Mutex<Vec<Value>>,
}

impl Recorder {
    fn push(&self, process: u64, kind: &str, value: Value) {
        let mut l = self.lines.lock().unwrap();
        let index = l.len();
        l.push(json!({"index": index, "type": kind, "process": process, "value": value}));
    }
}

async fn client(c: Arc<Cluster>, p: u64, rec: Arc<Recorder>, stop: Arc<AtomicBool>) {
    static NEXT: AtomicI64 = AtomicI64::new(1);
    let mut rng = StdRng::seed_from_u64(c.seed.wrapping_mul(1_000_003) ^ (p + 1));
    while !stop.load(Ordering::Relaxed) {
        tokio::time::sleep(Duration::from_millis(rng.gen_range(10..200))).await;
        if rng.gen_bool(0.5) {
            let Some(engine) = c.primary(&mut rng) else {
                continue;
            };
            let k = rng.gen_range(0..KEYS);
            // Unique across clients and seeds run in this process.
            let v = NEXT.fetch_add(1, Ordering::Relaxed);
            rec.push(p, "invoke", json!([["append", k, v]]));
            let kind = match blocking(move || append(&engine, k, v)).await {
                Ended::Ok => "ok",
                Ended::Fail => "fail",
                Ended::Info => "info",
            };
            rec.push(p, kind, json!([["append", k, v]]));
        } else {
            // Read concern majority, on the primary or (read preference
            // nearest) any member.
            let engine = if rng.gen_bool(0.6) {
                c.primary(&mut rng)
            } else {
                c.any(&mut rng)
            };
            let Some(engine) = engine else {
                continue;
            };
            let first = rng.gen_range(0..KEYS);
            let keys: Vec<i64> = (0..rng.gen_range(1..=2))
                .map(|i| (first + i) % KEYS)
                .collect();
            let invoke: Vec<Value> = keys.iter().map(|k| json!(["r", k, null])).collect();
            rec.push(p, "invoke", Value::Array(invoke.clone()));
            let ks = keys.clone();
            match blocking(move || read_lists(&engine, &ks)).await {
                Ok(lists) => {
                    let done: Vec<Value> = keys
                        .iter()
                        .zip(lists)
                        .map(|(k, l)| json!(["r", k, l]))
                        .collect();
                    rec.push(p, "ok", Value::Array(done));
                }
                Err(_) => rec.push(p, "fail", Value::Array(invoke)),
            }
        }
    }
}

/// The fault schedule: every 0.5-3 s (virtual) one of partition, one-way
/// cut, bridge, heal, crash, restart.
async fn nemesis(c: Arc<Cluster>, stop: Arc<AtomicBool>) {
    let mut rng = StdRng::seed_from_u64(c.seed.wrapping_mul(7919) ^ 0x6e656d);
    let a = |i: usize| c.addrs[i].clone();
    while !stop.load(Ordering::Relaxed) {
        tokio::time::sleep(Duration::from_millis(rng.gen_range(500..3000))).await;
        let x = rng.gen_range(0..MEMBERS);
        let y = (x + rng.gen_range(1..MEMBERS)) % MEMBERS;
        let z = (0..MEMBERS).find(|i| *i != x && *i != y).unwrap();
        match rng.gen_range(0..10) {
            0..=1 => {
                c.net.partition(&[vec![a(x)], vec![a(y), a(z)]]);
                c.log(format!("partition: {x} | {y} {z}"));
            }
            2 => {
                c.net.heal();
                c.net.cut(&a(x), &a(y));
                c.net.cut(&a(x), &a(z));
                c.log(format!("one-way: {x} cannot reach {y} {z}"));
            }
            3 => {
                c.net.heal();
                c.net.cut(&a(x), &a(y));
                c.net.cut(&a(y), &a(x));
                c.log(format!("bridge: {x} -/- {y}, both reach {z}"));
            }
            4..=5 => {
                c.net.heal();
                c.log("heal".into());
            }
            _ => {
                let up = c.up();
                if up.len() == MEMBERS {
                    c.crash(x).await;
                    c.log(format!("crash {x}"));
                } else {
                    for i in (0..MEMBERS).filter(|i| !up.contains(i)) {
                        c.start(i).await;
                        c.log(format!("restart {i}"));
                    }
                }
            }
        }
    }
}

/// Wait (virtual time) until a writable primary exists and every member
/// applied the primary's whole log, after a write of the primary's term.
async fn converge(c: &Cluster, rng: &mut StdRng) -> Result<(), String> {
    for _ in 0..600 {
        tokio::time::sleep(Duration::from_millis(100)).await;
        let Some(engine) = c.primary(rng) else {
            continue;
        };
        let barrier = blocking(move || {
            engine
                .database("d")?
                .collection("barrier")
                .insert_one(doc! {})
        })
        .await;
        if barrier.is_err() {
            continue;
        }
        for _ in 0..600 {
            tokio::time::sleep(Duration::from_millis(100)).await;
            let g = c.nodes.lock().unwrap();
            let members: Vec<&Arc<Member>> = g.iter().flatten().map(|n| &n.member).collect();
            let end = members
                .iter()
                .map(|m| m.last_log_index())
                .max()
                .unwrap_or(0);
            if members.iter().all(|m| m.applied_index() >= end) {
                return Ok(());
            }
        }
        return Err("the members did not apply the whole log".into());
    }
    Err("no writable primary after healing".into())
}

struct Run {
    history: String,
    ok_appends: usize,
    summary: String,
    /// Idle no-op entries applied, every member and incarnation together.
    noops: u64,
}

/// One seed's run: the history, or why the cluster went wrong.
async fn simulate(seed: u64) -> Result<Run, String> {
    let tmp = tempfile::tempdir().unwrap();
    let mut rng = StdRng::seed_from_u64(seed);
    let addrs: Vec<String> = (0..MEMBERS)
        .map(|i| format!("sim{i}:{}", 20_000 + i))
        .collect();
    let paced = Arc::new(AtomicBool::new(false));
    let pacer = tokio::spawn(pace(paced.clone()));
    let c = Arc::new(Cluster {
        seed,
        net: SimNet::new(seed, Faults::default()),
        dirs: (0..MEMBERS)
            .map(|i| tmp.path().join(format!("m{i}")))
            .collect(),
        election_ms: (0..MEMBERS).map(|_| rng.gen_range(1000..3000)).collect(),
        addrs,
        nodes: Mutex::new((0..MEMBERS).map(|_| None).collect()),
        timeline: Mutex::new(Vec::new()),
        noops: std::sync::atomic::AtomicU64::new(0),
        start: tokio::time::Instant::now(),
    });
    for i in 0..MEMBERS {
        c.start(i).await;
    }
    // The lists, created by a majority-acknowledged write.
    let mut made = false;
    for _ in 0..600 {
        tokio::time::sleep(Duration::from_millis(100)).await;
        let Some(engine) = c.primary(&mut rng) else {
            continue;
        };
        let ok = blocking(move || {
            let coll = engine.database("d")?.collection("la");
            let docs: Vec<Document> = (0..KEYS).map(|k| doc! {"_id": k, "list": []}).collect();
            coll.insert_many(docs, true)
        })
        .await;
        if ok.is_ok() {
            made = true;
            break;
        }
    }
    if !made {
        return Err("no primary took the first write".into());
    }
    c.log("lists created".into());
    let rec = Arc::new(Recorder {
        lines: Mutex::new(Vec::new()),
    });
    let stop = Arc::new(AtomicBool::new(false));
    let mut tasks = Vec::new();
    for p in 0..CLIENTS {
        tasks.push(tokio::spawn(client(
            c.clone(),
            p,
            rec.clone(),
            stop.clone(),
        )));
    }
    tasks.push(tokio::spawn(nemesis(c.clone(), stop.clone())));
    tokio::time::sleep(RUN).await;
    stop.store(true, Ordering::Relaxed);
    for t in tasks {
        t.await.map_err(|e| format!("a task panicked: {e}"))?;
    }
    c.net.heal();
    for i in 0..MEMBERS {
        if c.nodes.lock().unwrap()[i].is_none() {
            c.start(i).await;
        }
    }
    c.log("healed, all up".into());
    let converged = converge(&c, &mut rng).await;
    let fail = |why: String| {
        format!(
            "{why}\ntimeline:\n{}",
            c.timeline.lock().unwrap().join("\n")
        )
    };
    converged.map_err(fail)?;

    // Every member holds the same lists, with every acknowledged append.
    let keys: Vec<i64> = (0..KEYS).collect();
    let mut finals = Vec::new();
    for i in 0..MEMBERS {
        let engine = c.nodes.lock().unwrap()[i].as_ref().unwrap().engine.clone();
        let ks = keys.clone();
        let lists = blocking(move || read_lists(&engine, &ks))
            .await
            .map_err(fail)?;
        finals.push(lists);
    }
    if finals.iter().any(|f| *f != finals[0]) {
        return Err(fail(format!("the members' lists differ: {finals:?}")));
    }
    let lines = rec.lines.lock().unwrap().clone();
    let acked: BTreeMap<i64, i64> = lines
        .iter()
        .filter(|l| l["type"] == "ok")
        .flat_map(|l| l["value"].as_array().cloned().unwrap_or_default())
        .filter(|m| m[0] == "append")
        .map(|m| (m[2].as_i64().unwrap(), m[1].as_i64().unwrap()))
        .collect();
    for (v, k) in &acked {
        if !finals[0][*k as usize].contains(v) {
            return Err(fail(format!(
                "the acknowledged append of {v} to list {k} is lost: {:?}",
                finals[0][*k as usize]
            )));
        }
    }
    let dups: Vec<&Vec<i64>> = finals[0]
        .iter()
        .filter(|l| l.iter().collect::<BTreeSet<_>>().len() != l.len())
        .collect();
    if !dups.is_empty() {
        return Err(fail(format!("a value was appended twice: {dups:?}")));
    }
    // The final state is one more read, after everything.
    let mut lines = lines;
    let index = lines.len();
    let fin: Vec<Value> = keys.iter().map(|k| json!(["r", k, null])).collect();
    lines.push(json!({"index": index, "type": "invoke", "process": 99, "value": fin}));
    let fin: Vec<Value> = keys
        .iter()
        .map(|k| json!(["r", k, finals[0][*k as usize]]))
        .collect();
    lines.push(json!({"index": index + 1, "type": "ok", "process": 99, "value": fin}));
    let count = |t: &str| lines.iter().filter(|l| l["type"] == t).count();
    let (term, built, installed) = {
        let g = c.nodes.lock().unwrap();
        let st: Vec<_> = g.iter().flatten().map(|n| n.member.status()).collect();
        (
            st.iter().map(|s| s.term).max().unwrap_or(0),
            st.iter().map(|s| s.snapshots_built).sum::<u64>(),
            st.iter().map(|s| s.snapshots_installed).sum::<u64>(),
        )
    };
    let summary = format!(
        "ok {} fail {} info {}; final term {term}; Raft snapshots built {built}, \
         installed {installed} (since the last restarts); {}; net {:?}",
        count("ok"),
        count("fail"),
        count("info"),
        c.timeline
            .lock()
            .unwrap()
            .iter()
            .filter(|l| !l.contains("lists") && !l.contains("healed"))
            .count()
            .to_string()
            + " faults",
        c.net.stats()
    );
    let history = lines
        .iter()
        .map(Value::to_string)
        .collect::<Vec<_>>()
        .join("\n");
    for i in 0..MEMBERS {
        c.crash(i).await;
    }
    paced.store(true, Ordering::Relaxed);
    let _ = pacer.await;
    let noops = c.noops.load(Ordering::Relaxed);
    Ok(Run {
        history,
        ok_appends: acked.len(),
        summary: format!("{summary}; idle no-ops applied {noops}"),
        noops,
    })
}

fn run_seed(seed: u64) -> Run {
    eprintln!("sim seed {seed} (replay: DUET_SIM_SEED={seed})");
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .start_paused(true)
        .build()
        .unwrap();
    match rt.block_on(simulate(seed)) {
        Ok(r) => r,
        Err(e) => panic!("seed {seed}: {e}"),
    }
}

fn verdict(history: &str) -> (Valid, Vec<String>) {
    let h = History::from_json(history).expect("adya reads the history");
    let opts = Opts {
        models: vec!["serializable".to_string()],
        timeout: Duration::from_secs(10),
        ..Opts::default()
    };
    let r = check(&h, Workload::ListAppend, &opts);
    (r.valid, r.anomaly_types)
}

fn check_seed(seed: u64) -> Run {
    let run = run_seed(seed);
    let (valid, anomalies) = verdict(&run.history);
    eprintln!("sim seed {seed}: {}; adya: {valid:?}", run.summary);
    assert_eq!(
        valid,
        Valid::True,
        "seed {seed}: anomalies {anomalies:?} in history:\n{}",
        run.history
    );
    assert!(
        run.ok_appends > 0,
        "seed {seed}: no append was acknowledged"
    );
    assert!(
        noop_interval().is_zero() || run.noops > 0,
        "seed {seed}: no idle no-op was applied"
    );
    run
}

fn seeds() -> Vec<u64> {
    let env = |k: &str| std::env::var(k).ok().and_then(|v| v.parse::<u64>().ok());
    if let Some(s) = env("DUET_SIM_SEED") {
        return vec![s];
    }
    match env("DUET_SIM_SEEDS") {
        Some(n) => {
            let base = env("DUET_SIM_BASE").unwrap_or(1000);
            (base..base + n).collect()
        }
        None => vec![1, 2, 3],
    }
}

#[test]
fn partitions_loss_and_crashes_keep_majority_histories_serializable() {
    for seed in seeds() {
        check_seed(seed);
    }
}

/// The checks would see a broken history: a read that misses an
/// acknowledged append its list held before (a lost or rolled-back write
/// seen by a client) is flagged by adya.
#[test]
fn the_checker_flags_a_read_that_lost_an_acknowledged_append() {
    let run = check_seed(4);
    let mut lines: Vec<Value> = run
        .history
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    // The final read (last line) drops the first element of its longest list.
    let last = lines.last_mut().unwrap();
    let mops = last["value"].as_array_mut().unwrap();
    let longest = mops
        .iter_mut()
        .max_by_key(|m| m[2].as_array().map_or(0, Vec::len))
        .unwrap();
    let list = longest[2].as_array_mut().unwrap();
    assert!(list.len() >= 2, "seed 4 appended too little to plant a bug");
    list.remove(0);
    let broken = lines
        .iter()
        .map(Value::to_string)
        .collect::<Vec<_>>()
        .join("\n");
    let (valid, anomalies) = verdict(&broken);
    assert_eq!(valid, Valid::False, "adya saw nothing: {anomalies:?}");
}
