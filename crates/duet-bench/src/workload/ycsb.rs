//! YCSB core workloads A–F, faithful to YCSB's `CoreWorkload` and the
//! `workloads/workload[a-f]` property files: `usertable` with `fieldcount`
//! fields of `fieldlength` characters, keys `user<fnvhash64(n)>` (hashed insert
//! order), read all fields, update one random field (`writeallfields=false`),
//! insert all fields, scans of uniform length 1..=`maxscanlength`, RMW = read
//! then update of one field (timed together), and the request distributions
//! uniform / scrambled zipfian / latest. A run is bounded by an operation count
//! or a duration. Load once per target and repeat; workloads run in the given
//! order on the same table (D and E inserts grow it, as in YCSB's usual order).

use std::collections::BTreeMap;

use anyhow::{bail, Result};
use rand::distributions::Alphanumeric;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use crate::gen::{key_name, Distribution, KeyChooser, KeySequence};
use crate::progress::note;
use crate::result::{case, Collector};
use crate::stats::Latencies;
use crate::targets::{Field, YcsbTarget};
use crate::workload::{run_clients, Budget};

/// One core workload's operation mix.
#[derive(Debug, Clone, Copy, serde::Serialize)]
pub struct Mix {
    pub name: char,
    pub read: f64,
    pub update: f64,
    pub insert: f64,
    pub scan: f64,
    pub read_modify_write: f64,
    pub distribution: Distribution,
    pub max_scan_length: u64,
}

/// YCSB's workloads A–F (`workloads/workloada` … `workloadf`).
pub fn core_workload(name: char) -> Result<Mix> {
    let base = Mix {
        name,
        read: 0.0,
        update: 0.0,
        insert: 0.0,
        scan: 0.0,
        read_modify_write: 0.0,
        distribution: Distribution::Zipfian,
        max_scan_length: 1000,
    };
    Ok(match name.to_ascii_uppercase() {
        'A' => Mix {
            name: 'A',
            read: 0.5,
            update: 0.5,
            ..base
        },
        'B' => Mix {
            name: 'B',
            read: 0.95,
            update: 0.05,
            ..base
        },
        'C' => Mix {
            name: 'C',
            read: 1.0,
            ..base
        },
        'D' => Mix {
            name: 'D',
            read: 0.95,
            insert: 0.05,
            distribution: Distribution::Latest,
            ..base
        },
        'E' => Mix {
            name: 'E',
            scan: 0.95,
            insert: 0.05,
            max_scan_length: 100,
            ..base
        },
        'F' => Mix {
            name: 'F',
            read: 0.5,
            read_modify_write: 0.5,
            ..base
        },
        other => bail!("unknown YCSB core workload {other:?} (A–F)"),
    })
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Op {
    Read,
    Update,
    Insert,
    Scan,
    ReadModifyWrite,
}

const OPS: [(Op, &str); 5] = [
    (Op::Read, "read"),
    (Op::Update, "update"),
    (Op::Insert, "insert"),
    (Op::Scan, "scan"),
    (Op::ReadModifyWrite, "rmw"),
];

impl Mix {
    fn choose(&self, rng: &mut impl Rng) -> Op {
        let total = self.read + self.update + self.insert + self.scan + self.read_modify_write;
        let mut x = rng.gen::<f64>() * total;
        for (p, op) in [
            (self.read, Op::Read),
            (self.update, Op::Update),
            (self.insert, Op::Insert),
            (self.scan, Op::Scan),
            (self.read_modify_write, Op::ReadModifyWrite),
        ] {
            if x < p {
                return op;
            }
            x -= p;
        }
        Op::Read
    }
}

/// Parameters of a YCSB invocation.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Params {
    pub records: u64,
    pub field_count: usize,
    pub field_length: usize,
    pub threads: usize,
    pub seconds: f64,
    /// Operations per run (all threads); `None` = run for `seconds`.
    pub operations: Option<u64>,
    pub distribution: Option<Distribution>,
    pub workloads: Vec<char>,
    pub seed: u64,
    pub repeat: usize,
}

fn value(rng: &mut impl Rng, len: usize) -> String {
    rng.sample_iter(&Alphanumeric)
        .take(len)
        .map(char::from)
        .collect()
}

fn all_fields(p: &Params, rng: &mut impl Rng) -> Vec<Field> {
    (0..p.field_count)
        .map(|i| (format!("field{i}"), value(rng, p.field_length)))
        .collect()
}

#[derive(Default)]
struct ClientStats {
    ops: u64,
    not_found: u64,
    latencies: BTreeMap<&'static str, Latencies>,
}

/// Load `records` into a fresh table; returns records per second.
fn load(target: &dyn YcsbTarget, p: &Params, quiet: bool) -> Result<f64> {
    target.reset()?;
    let budget = Budget::new(0.0, Some(p.records.div_ceil(p.threads as u64)));
    let per_thread = p.records.div_ceil(p.threads as u64);
    let t0 = std::time::Instant::now();
    run_clients(
        &format!("{} load", target.name()),
        p.threads,
        &budget,
        quiet,
        "rec",
        |t, b| {
            let mut s = target.session()?;
            let mut rng = StdRng::seed_from_u64(p.seed ^ 0x10ad ^ t as u64);
            let lo = t as u64 * per_thread;
            let hi = (lo + per_thread).min(p.records);
            let mut k = lo;
            while k < hi {
                let end = (k + 1000).min(hi);
                let batch: Vec<(String, Vec<Field>)> = (k..end)
                    .map(|n| (key_name(n), all_fields(p, &mut rng)))
                    .collect();
                s.insert_batch(&batch)?;
                b.count(end - k);
                k = end;
            }
            Ok(())
        },
    )?;
    Ok(p.records as f64 / t0.elapsed().as_secs_f64().max(1e-9))
}

fn run_mix(
    target: &dyn YcsbTarget,
    p: &Params,
    mix: &Mix,
    seq: &KeySequence,
    repeat: usize,
    quiet: bool,
) -> Result<(f64, ClientStats)> {
    let dist = p.distribution.unwrap_or(mix.distribution);
    let quota = p.operations.map(|n| n.div_ceil(p.threads as u64));
    let budget = Budget::new(p.seconds, quota);
    let expected_ops = p.operations.unwrap_or(p.records);
    let expected_new = (expected_ops as f64 * mix.insert * 2.0) as u64;
    let records_now = seq.last() + 1;
    let results = run_clients(
        &format!("{} ycsb-{}", target.name(), mix.name),
        p.threads,
        &budget,
        quiet,
        "ops",
        |t, b| {
            let mut s = target.session()?;
            let mut rng = StdRng::seed_from_u64(
                p.seed ^ ((repeat as u64) << 32) ^ ((mix.name as u64) << 16) ^ t as u64,
            );
            let mut chooser = KeyChooser::new(dist, records_now, expected_new);
            let mut st = ClientStats::default();
            while b.more(st.ops) {
                let op = mix.choose(&mut rng);
                let t0;
                let found = match op {
                    Op::Read => {
                        let key = key_name(chooser.next(seq, &mut rng));
                        t0 = std::time::Instant::now();
                        s.read(&key)?
                    }
                    Op::Update => {
                        let key = key_name(chooser.next(seq, &mut rng));
                        let f = rng.gen_range(0..p.field_count.max(1));
                        let fields = [(format!("field{f}"), value(&mut rng, p.field_length))];
                        t0 = std::time::Instant::now();
                        s.update(&key, &fields)?
                    }
                    Op::Insert => {
                        let n = seq.next_insert();
                        let fields = all_fields(p, &mut rng);
                        t0 = std::time::Instant::now();
                        s.insert(&key_name(n), &fields)?;
                        seq.acknowledge(n);
                        true
                    }
                    Op::Scan => {
                        let key = key_name(chooser.next(seq, &mut rng));
                        let len = rng.gen_range(1..=mix.max_scan_length.max(1)) as usize;
                        t0 = std::time::Instant::now();
                        s.scan(&key, len)? > 0
                    }
                    Op::ReadModifyWrite => {
                        let key = key_name(chooser.next(seq, &mut rng));
                        let f = rng.gen_range(0..p.field_count.max(1));
                        let fields = [(format!("field{f}"), value(&mut rng, p.field_length))];
                        t0 = std::time::Instant::now();
                        s.read(&key)? && s.update(&key, &fields)?
                    }
                };
                let elapsed = t0.elapsed();
                let name = OPS
                    .iter()
                    .find(|(o, _)| *o == op)
                    .map_or("read", |(_, n)| *n);
                st.latencies.entry(name).or_default().record(elapsed);
                st.ops += 1;
                if !found {
                    st.not_found += 1;
                }
                b.count(1);
            }
            Ok(st)
        },
    )?;
    let wall = budget.started.elapsed().as_secs_f64();
    let mut total = ClientStats::default();
    for r in results {
        total.ops += r.ops;
        total.not_found += r.not_found;
        for (k, l) in r.latencies {
            total.latencies.entry(k).or_default().merge(&l);
        }
    }
    Ok((total.ops as f64 / wall.max(1e-9), total))
}

/// Run every workload of `p` on every target, `p.repeat` times, at each of
/// the client thread counts (`p.threads` is ignored). Each count starts from
/// a freshly loaded table (D and E grow it), so the counts are independent.
/// With more than one count every figure's case gets a `threads` key.
pub fn run(
    targets: &[&dyn YcsbTarget],
    p: &Params,
    thread_counts: &[usize],
    quiet: bool,
    col: &mut Collector,
    notes: &mut Vec<String>,
) -> Result<()> {
    let mixes: Vec<Mix> = p
        .workloads
        .iter()
        .map(|c| core_workload(*c))
        .collect::<Result<_>>()?;
    let keyed = thread_counts.len() > 1;
    for rep in 0..p.repeat.max(1) {
        for &target in targets {
            for &threads in thread_counts {
                let p = &Params {
                    threads: threads.max(1),
                    ..p.clone()
                };
                let ts = p.threads.to_string();
                let case_of = |w: &str| {
                    if keyed {
                        case(&[("threads", &ts), ("workload", w)])
                    } else {
                        case(&[("workload", w)])
                    }
                };
                run_one(target, p, &mixes, rep, &case_of, quiet, col, notes)?;
            }
        }
    }
    Ok(())
}

/// Load, then run every mix once, on one target with `p.threads` clients.
#[allow(clippy::too_many_arguments)]
fn run_one(
    target: &dyn YcsbTarget,
    p: &Params,
    mixes: &[Mix],
    rep: usize,
    case_of: &dyn Fn(&str) -> std::collections::BTreeMap<String, String>,
    quiet: bool,
    col: &mut Collector,
    notes: &mut Vec<String>,
) -> Result<()> {
    let name = target.name();
    note(
        quiet,
        &format!(
            "[ycsb] {name}: loading {} records with {} threads (run {}/{})",
            p.records,
            p.threads,
            rep + 1,
            p.repeat
        ),
    );
    let load_rate = load(target, p, quiet)?;
    col.add(&name, &case_of("load"), "ops_per_s", load_rate);
    let seq = KeySequence::new(p.records);
    for mix in mixes {
        let (rate, st) = run_mix(target, p, mix, &seq, rep, quiet)?;
        let w = mix.name.to_string();
        let c = case_of(&w);
        col.add(&name, &c, "ops_per_s", rate);
        for (op, _) in OPS.iter().map(|(o, n)| (n, o)) {
            if let Some(l) = st.latencies.get(op) {
                col.add(
                    &name,
                    &c,
                    &format!("{op}_latency_us_p50"),
                    l.quantile_us(0.50),
                );
                col.add(
                    &name,
                    &c,
                    &format!("{op}_latency_us_p99"),
                    l.quantile_us(0.99),
                );
            }
        }
        if st.not_found > 0 && rep == 0 {
            notes.push(format!(
                "{name} workload {} ({} threads): {} of {} operations found no record",
                mix.name, p.threads, st.not_found, st.ops
            ));
        }
        note(
            quiet,
            &format!(
                "[ycsb] {name} {} ({} threads): {:.0} ops/s",
                mix.name, p.threads, rate
            ),
        );
    }
    Ok(())
}
