//! `$group` past its memory limit: with `allowDiskUse`, its partial states
//! are written to sorted runs (the sorter's run files, `query::spill`) and
//! merged by group key at the end, as MongoDB's `DocumentSourceGroup` does;
//! without it, 292 QueryExceededMemoryLimitNoDiskUseAllowed.
//!
//! Owns: [`SpillingGroup`] (feed, spill, compact, finish), [`GroupOutput`]
//! (the groups in key order, from memory or merged from runs) and the
//! encoding of accumulator states as BSON ([`encode_acc`] / [`decode_acc`]).
//!
//! A spilled record is `{k: <group key>, a: [<state of each accumulator>]}`;
//! a run holds the whole table at the time it was spilled, in key order (the
//! table's `BTreeMap` order), so each key appears at most once per run.
//!
//! Invariants:
//! - runs are kept in input order: run `i` holds the states of documents that
//!   all came before those of run `i + 1` (and the in-memory table comes
//!   last); a merge folds equal keys in that order ([`Group::append`]), so the
//!   order-dependent accumulators (`$first $last $firstN $lastN $push
//!   $mergeObjects`) answer what one in-memory table would. Double sums and
//!   `$stdDev*` are combined pairwise and may differ from the in-memory
//!   answer in the last bits (as MongoDB's do);
//! - the table holds at most the memory limit after every document is fed
//!   (it is spilled whole when a document takes it past the limit); a merge
//!   holds one decoded record per run, at most [`MAX_FAN_IN`] runs (older
//!   runs are first compacted into one);
//! - equal keys from several runs keep the canonical representative (the
//!   smaller by `tie_break`), as the in-memory table does;
//! - a damaged run is an error, never a panic.

use std::cmp::Ordering;
use std::path::PathBuf;

use bson::spec::BinarySubtype;
use bson::{Binary, Bson, Document, RawDocumentBuf};

use crate::error::{CancelToken, Error, Result};
use crate::query::aggregate::group::{tie_break, Acc, AccOp, Group, GroupState, OrdBson, SumState};
use crate::query::expr::{decimal, Root};
use crate::query::limits::{ReadLimits, PAGE_DOCS};
use crate::query::sorter::MAX_FAN_IN;
use crate::query::spill::{RunReader, RunWriter};

/// A `$group` that spills its table when it passes the memory limit.
pub(super) struct SpillingGroup {
    group: Group,
    state: GroupState,
    allow_disk_use: bool,
    dir: PathBuf,
    cancel: CancelToken,
    /// Spilled runs, oldest input first.
    runs: Vec<RunReader>,
    /// Runs written (compactions included): explain's `spills`.
    spills: u64,
}

impl SpillingGroup {
    /// `group` under `limits` (its memory limit lowered to the read's),
    /// spilling to `dir`.
    pub(super) fn new(mut group: Group, limits: &ReadLimits, dir: PathBuf) -> SpillingGroup {
        group.memory_limit = group.memory_limit.min(limits.memory_limit_bytes);
        SpillingGroup {
            group,
            state: GroupState::default(),
            allow_disk_use: limits.allow_disk_use,
            dir,
            cancel: limits.cancel.clone(),
            runs: Vec::new(),
            spills: 0,
        }
    }

    /// Feed one document; spill (or refuse) when the table passes the limit.
    pub(super) fn push(&mut self, root: Root<'_>) -> Result<()> {
        self.group.feed(&mut self.state, root)?;
        if self.state.bytes() > self.group.memory_limit {
            if !self.allow_disk_use {
                return self.group.check_memory_no_disk(self.state.bytes());
            }
            self.spill()?;
        }
        Ok(())
    }

    /// Write the table as one run, in key order, and empty it.
    fn spill(&mut self) -> Result<()> {
        self.cancel.check()?;
        let mut w = RunWriter::create(&self.dir)?;
        for (i, (key, accs)) in self.state.take_groups().into_iter().enumerate() {
            w.push(i as u64, &encode_record(key, accs)?)?;
        }
        self.runs.push(w.finish()?);
        self.spills += 1;
        if self.runs.len() >= MAX_FAN_IN {
            self.compact()?;
        }
        Ok(())
    }

    /// Merge every run into one (they are the oldest input, so order holds).
    fn compact(&mut self) -> Result<()> {
        let runs = std::mem::take(&mut self.runs);
        let mut merge = Merge::new(&self.group, runs, self.cancel.clone())?;
        let mut w = RunWriter::create(&self.dir)?;
        let mut i = 0u64;
        while let Some((key, accs)) = merge.next_group(&self.group)? {
            w.push(i, &encode_record(key, accs)?)?;
            i += 1;
        }
        self.runs.push(w.finish()?);
        self.spills += 1;
        Ok(())
    }

    /// Runs written so far.
    pub(super) fn spills(&self) -> u64 {
        self.spills
    }

    /// The groups in key order: from memory when nothing was spilled, else
    /// the table spilled as the last run and every run merged.
    pub(super) fn finish(mut self) -> Result<GroupOutput> {
        if self.runs.is_empty() {
            let out = self.group.finish(std::mem::take(&mut self.state))?;
            return Ok(GroupOutput::Mem(out.into_iter()));
        }
        if self.state.len() > 0 {
            self.spill()?;
        }
        let runs = std::mem::take(&mut self.runs);
        let merge = Merge::new(&self.group, runs, self.cancel.clone())?;
        Ok(GroupOutput::Merge(Box::new(merge), self.group))
    }
}

/// A `$group`'s output, one group at a time.
pub(super) enum GroupOutput {
    Mem(std::vec::IntoIter<Document>),
    Merge(Box<Merge>, Group),
}

impl GroupOutput {
    /// The next group's output document, `None` after the last.
    pub(super) fn next_doc(&mut self) -> Result<Option<Document>> {
        match self {
            GroupOutput::Mem(it) => Ok(it.next()),
            GroupOutput::Merge(m, group) => match m.next_group(group)? {
                Some((key, accs)) => Ok(Some(group.finish_group(key, accs)?)),
                None => Ok(None),
            },
        }
    }
}

/// A k-way merge of runs by group key, folding equal keys in run order.
pub(super) struct Merge {
    runs: Vec<RunReader>,
    heads: Vec<Option<(OrdBson, Vec<Acc>)>>,
    cancel: CancelToken,
    merged: usize,
}

impl Merge {
    fn new(group: &Group, mut runs: Vec<RunReader>, cancel: CancelToken) -> Result<Merge> {
        let mut heads = Vec::with_capacity(runs.len());
        for r in &mut runs {
            heads.push(read_record(group, r)?);
        }
        Ok(Merge {
            runs,
            heads,
            cancel,
            merged: 0,
        })
    }

    /// The next key with its states folded over every run, in key order.
    fn next_group(&mut self, group: &Group) -> Result<Option<(OrdBson, Vec<Acc>)>> {
        self.merged += 1;
        if self.merged.is_multiple_of(PAGE_DOCS) {
            self.cancel.check()?;
        }
        // At most MAX_FAN_IN heads: a linear scan for the least key.
        let mut least: Option<usize> = None;
        for (i, h) in self.heads.iter().enumerate() {
            let Some((k, _)) = h else { continue };
            let less = match least.and_then(|j| self.heads[j].as_ref()) {
                Some((lk, _)) => k.cmp(lk) == Ordering::Less,
                None => true,
            };
            if less {
                least = Some(i);
            }
        }
        let Some(first) = least else {
            return Ok(None);
        };
        let mut out: Option<(OrdBson, Vec<Acc>)> = None;
        for i in first..self.heads.len() {
            let equal = match (&self.heads[i], &out) {
                (Some((k, _)), Some((ok, _))) => k.cmp(ok) == Ordering::Equal,
                (Some(_), None) => true,
                (None, _) => false,
            };
            if !equal {
                continue;
            }
            let next = read_record(group, &mut self.runs[i])?;
            let Some((key, accs)) = std::mem::replace(&mut self.heads[i], next) else {
                continue;
            };
            out = Some(match out {
                None => (key, accs),
                Some((mut ok, mut oaccs)) => {
                    group.append(&mut oaccs, accs)?;
                    if tie_break(&key.0, &ok.0) == Ordering::Less {
                        ok = key;
                    }
                    (ok, oaccs)
                }
            });
        }
        Ok(out)
    }
}

fn damaged(what: &str) -> Error {
    Error::Internal(format!("a spilled $group state is damaged: {what}"))
}

fn encode_record(key: OrdBson, accs: Vec<Acc>) -> Result<RawDocumentBuf> {
    let states: Vec<Bson> = accs.into_iter().map(encode_acc).collect();
    let d = bson::doc! {"k": key.0, "a": states};
    RawDocumentBuf::try_from(&d).map_err(|e| Error::InvalidBson(e.to_string()))
}

fn read_record(group: &Group, run: &mut RunReader) -> Result<Option<(OrdBson, Vec<Acc>)>> {
    let Some((_, raw)) = run.next_doc()? else {
        return Ok(None);
    };
    let mut d = crate::doc::to_document(&raw)?;
    let key = d.remove("k").ok_or_else(|| damaged("no key"))?;
    let Some(Bson::Array(states)) = d.remove("a") else {
        return Err(damaged("no states"));
    };
    let ops: Vec<&AccOp> = group.ops().collect();
    if states.len() != ops.len() {
        return Err(damaged("wrong number of states"));
    }
    let accs = states
        .into_iter()
        .zip(ops)
        .map(|(s, op)| decode_acc(s, op, group))
        .collect::<Result<Vec<Acc>>>()?;
    Ok(Some((group.key_of(key), accs)))
}

fn opt(v: Option<Bson>) -> Bson {
    Bson::Array(v.into_iter().collect())
}

fn un_opt(v: Bson) -> Result<Option<Bson>> {
    match v {
        Bson::Array(mut a) if a.len() <= 1 => Ok(a.pop()),
        _ => Err(damaged("an optional value")),
    }
}

fn int(n: u64) -> Bson {
    Bson::Int64(n as i64)
}

fn un_int(v: &Bson) -> Result<u64> {
    match v {
        Bson::Int64(n) => Ok(*n as u64),
        _ => Err(damaged("a count")),
    }
}

fn array(v: Bson) -> Result<Vec<Bson>> {
    match v {
        Bson::Array(a) => Ok(a),
        _ => Err(damaged("an array")),
    }
}

fn sum_to_bson(s: &SumState) -> Bson {
    Bson::Array(vec![
        Bson::Binary(Binary {
            subtype: BinarySubtype::Generic,
            bytes: s.int.to_le_bytes().to_vec(),
        }),
        Bson::Double(s.dbl),
        opt(s.dec.map(|d| Bson::Decimal128(decimal::to_bson(d)))),
        Bson::Int32(i32::from(s.widest)),
        int(s.count),
    ])
}

fn sum_from_bson(v: Bson) -> Result<SumState> {
    let bad = || damaged("a sum");
    let mut it = array(v)?.into_iter();
    let (Some(Bson::Binary(b)), Some(Bson::Double(dbl)), Some(dec), Some(Bson::Int32(w)), Some(c)) =
        (it.next(), it.next(), it.next(), it.next(), it.next())
    else {
        return Err(bad());
    };
    let bytes: [u8; 16] = b.bytes.as_slice().try_into().map_err(|_| bad())?;
    let dec = match un_opt(dec)? {
        Some(Bson::Decimal128(d)) => Some(decimal::from_bson(d)),
        None => None,
        Some(_) => return Err(bad()),
    };
    Ok(SumState {
        int: i128::from_le_bytes(bytes),
        dbl,
        dec,
        widest: u8::try_from(w).map_err(|_| bad())?,
        count: un_int(&c)?,
    })
}

/// One accumulator state as BSON (exact: integers, doubles' bits and
/// decimals survive the round trip).
pub(super) fn encode_acc(acc: Acc) -> Bson {
    match acc {
        Acc::Sum(s) | Acc::Avg(s) => sum_to_bson(&s),
        Acc::Min(v) | Acc::Max(v) | Acc::First(v) | Acc::Last(v) => opt(v),
        Acc::Push(items, n) | Acc::Ordered(items, n) | Acc::Best(items, n) => {
            Bson::Array(vec![Bson::Array(items), int(n as u64)])
        }
        Acc::AddToSet(set, n) => Bson::Array(vec![
            Bson::Array(set.into_iter().map(|k| k.0).collect()),
            int(n as u64),
        ]),
        Acc::MergeObjects(d, n) => Bson::Array(vec![Bson::Document(d), int(n as u64)]),
        Acc::StdDev(n, mean, m2) => Bson::Array(vec![int(n), Bson::Double(mean), Bson::Double(m2)]),
        Acc::Top(items, n) => Bson::Array(vec![
            Bson::Array(
                items
                    .into_iter()
                    .map(|(key, out)| {
                        Bson::Array(vec![Bson::Array(key.into_iter().map(opt).collect()), out])
                    })
                    .collect(),
            ),
            int(n as u64),
        ]),
        Acc::Numbers(xs) => Bson::Array(xs.into_iter().map(Bson::Double).collect()),
    }
}

/// The state [`encode_acc`] wrote for an accumulator `op`.
pub(super) fn decode_acc(v: Bson, op: &AccOp, group: &Group) -> Result<Acc> {
    let pair = |v: Bson| -> Result<(Bson, usize)> {
        let mut it = array(v)?.into_iter();
        match (it.next(), it.next(), it.next()) {
            (Some(x), Some(n), None) => Ok((x, un_int(&n)? as usize)),
            _ => Err(damaged("a pair")),
        }
    };
    Ok(match op {
        AccOp::Sum => Acc::Sum(sum_from_bson(v)?),
        AccOp::Avg => Acc::Avg(sum_from_bson(v)?),
        AccOp::Min => Acc::Min(un_opt(v)?),
        AccOp::Max => Acc::Max(un_opt(v)?),
        AccOp::First => Acc::First(un_opt(v)?),
        AccOp::Last => Acc::Last(un_opt(v)?),
        AccOp::Push => {
            let (items, n) = pair(v)?;
            Acc::Push(array(items)?, n)
        }
        AccOp::FirstN(_) | AccOp::LastN(_) => {
            let (items, n) = pair(v)?;
            Acc::Ordered(array(items)?, n)
        }
        AccOp::MinMaxN { .. } => {
            let (items, n) = pair(v)?;
            Acc::Best(array(items)?, n)
        }
        AccOp::AddToSet => {
            let (items, n) = pair(v)?;
            Acc::AddToSet(
                array(items)?.into_iter().map(|v| group.key_of(v)).collect(),
                n,
            )
        }
        AccOp::MergeObjects => match pair(v)? {
            (Bson::Document(d), n) => Acc::MergeObjects(d, n),
            _ => return Err(damaged("$mergeObjects")),
        },
        AccOp::StdDev { .. } => {
            let mut it = array(v)?.into_iter();
            match (it.next(), it.next(), it.next()) {
                (Some(n), Some(Bson::Double(mean)), Some(Bson::Double(m2))) => {
                    Acc::StdDev(un_int(&n)?, mean, m2)
                }
                _ => return Err(damaged("$stdDev")),
            }
        }
        AccOp::Top { .. } => {
            let (items, n) = pair(v)?;
            let mut out = Vec::new();
            for item in array(items)? {
                let mut it = array(item)?.into_iter();
                let (Some(key), Some(o), None) = (it.next(), it.next(), it.next()) else {
                    return Err(damaged("$top"));
                };
                let key = array(key)?
                    .into_iter()
                    .map(un_opt)
                    .collect::<Result<Vec<_>>>()?;
                out.push((key, o));
            }
            Acc::Top(out, n)
        }
        AccOp::Percentile { .. } => Acc::Numbers(
            array(v)?
                .into_iter()
                .map(|x| match x {
                    Bson::Double(f) => Ok(f),
                    _ => Err(damaged("a number")),
                })
                .collect::<Result<Vec<f64>>>()?,
        ),
    })
}

#[cfg(test)]
mod tests {
    use bson::{doc, Bson, Document};
    use proptest::prelude::*;

    use crate::error::{CancelReason, CancelToken};
    use crate::query::aggregate::exec::Exec;
    use crate::query::aggregate::{Pipeline, Runtime};
    use crate::query::limits::ReadLimits;

    /// A fresh, empty spill directory for one test.
    fn spill_dir(name: &str) -> std::path::PathBuf {
        static N: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let d = std::env::temp_dir().join(format!(
            "duet-group-spill-{name}-{}-{n}",
            std::process::id()
        ));
        let _ = std::fs::remove_dir_all(&d);
        d
    }

    fn files_in(dir: &std::path::Path) -> usize {
        std::fs::read_dir(dir).map_or(0, |e| e.count())
    }

    /// Run `pipeline` through [`Exec`] under a memory limit; the output and
    /// the runs its `$group`s spilled.
    fn run(
        pipeline: &[Document],
        docs: &[Document],
        memory_limit_bytes: usize,
        allow_disk_use: bool,
        dir: &std::path::Path,
        cancel: CancelToken,
    ) -> crate::error::Result<(Vec<Document>, u64)> {
        let p = Pipeline::parse(pipeline)?;
        let mut rt = Runtime::standalone();
        rt.limits = ReadLimits {
            memory_limit_bytes,
            allow_disk_use,
            cancel,
            ..ReadLimits::default()
        };
        rt.spill_dir = dir.to_path_buf();
        let mut exec = Exec::new(&p.stages, None, &[], &rt);
        for d in docs {
            if exec.push_document(d.clone())?.is_break() {
                break;
            }
        }
        let out = exec.finish()?;
        Ok((out, rt.group_spills()))
    }

    /// Every accumulator of `$group`, order-dependent ones included.
    fn every_accumulator() -> Document {
        doc! {
            "_id": "$k",
            "sum": {"$sum": "$v"}, "avg": {"$avg": "$v"},
            "min": {"$min": "$v"}, "max": {"$max": "$v"},
            "first": {"$first": "$v"}, "last": {"$last": "$v"},
            "push": {"$push": "$v"}, "set": {"$addToSet": "$v"},
            "n": {"$count": {}},
            "merged": {"$mergeObjects": "$o"},
            "sdp": {"$stdDevPop": "$v"}, "sds": {"$stdDevSamp": "$v"},
            "top": {"$top": {"output": ["$i", "$v"], "sortBy": {"v": -1}}},
            "bottom": {"$bottom": {"output": "$i", "sortBy": {"v": -1}}},
            "topN": {"$topN": {"output": "$i", "sortBy": {"v": 1}, "n": 3}},
            "bottomN": {"$bottomN": {"output": "$i", "sortBy": {"v": 1}, "n": 2}},
            "firstN": {"$firstN": {"input": "$v", "n": 3}},
            "lastN": {"$lastN": {"input": "$v", "n": 2}},
            "maxN": {"$maxN": {"input": "$v", "n": 2}},
            "minN": {"$minN": {"input": "$v", "n": 3}},
            "median": {"$median": {"input": "$v", "method": "approximate"}},
            "pct": {"$percentile": {"input": "$v", "p": [0.1, 0.9], "method": "approximate"}},
        }
    }

    /// A value of one of several types, picked by `x` (missing for some).
    fn value(x: u32) -> Option<Bson> {
        Some(match x % 9 {
            0 => Bson::Int32(x as i32 % 50),
            1 => Bson::Int64(i64::from(x % 70) - 20),
            // Integral doubles: their sums are exact whatever the grouping.
            2 => Bson::Double(f64::from(x % 40)),
            3 => Bson::Decimal128(format!("{}.25", x % 13).parse().ok()?),
            4 => Bson::String(format!("s{}", x % 11)),
            5 => Bson::Null,
            6 => return None,
            7 => Bson::Array(vec![Bson::Int32((x % 5) as i32)]),
            _ => Bson::Int32(-(x as i32 % 17)),
        })
    }

    fn input(items: &[(u32, u32)]) -> Vec<Document> {
        items
            .iter()
            .enumerate()
            .map(|(i, (k, x))| {
                let mut d = doc! {"i": i as i32, "k": (*k as i32) % 3 * 1000 + *k as i32, "pad": "p".repeat(40)};
                if let Some(v) = value(*x) {
                    d.insert("v", v);
                }
                d.insert("o", doc! {format!("f{}", x % 4): *x as i32, "i": i as i32});
                d
            })
            .collect()
    }

    /// Equal, doubles within a relative 1e-9 (pairwise-combined `$stdDev*`
    /// may differ from the sequential one in the last bits).
    fn close(a: &Bson, b: &Bson) -> bool {
        match (a, b) {
            (Bson::Double(x), Bson::Double(y)) => {
                x == y || (x - y).abs() <= 1e-9 * x.abs().max(y.abs()).max(1.0)
            }
            (Bson::Document(x), Bson::Document(y)) => {
                x.len() == y.len()
                    && x.iter()
                        .zip(y.iter())
                        .all(|((ka, va), (kb, vb))| ka == kb && close(va, vb))
            }
            (Bson::Array(x), Bson::Array(y)) => {
                x.len() == y.len() && x.iter().zip(y).all(|(p, q)| close(p, q))
            }
            _ => a == b,
        }
    }

    fn assert_same(got: &[Document], want: &[Document]) {
        assert_eq!(got.len(), want.len(), "number of groups");
        for (g, w) in got.iter().zip(want) {
            assert!(
                close(&Bson::Document(g.clone()), &Bson::Document(w.clone())),
                "spilled {g:?}\nin memory {w:?}"
            );
        }
    }

    #[test]
    fn every_accumulator_spilled_equals_in_memory_with_compaction() {
        let items: Vec<(u32, u32)> = (0..4000u32)
            .map(|i| ((i * 7919) % 301, (i * 104_729) % 1000))
            .collect();
        let docs = input(&items);
        let pipeline = [doc! {"$group": every_accumulator()}];
        let dir = spill_dir("every");
        let (want, none) = run(
            &pipeline,
            &docs,
            usize::MAX,
            false,
            &dir,
            CancelToken::never(),
        )
        .expect("memory");
        assert_eq!(none, 0);
        assert_eq!(want.len(), 301);
        // The reference evaluator agrees with the in-memory execution.
        let reference = Pipeline::parse(&pipeline)
            .expect("parse")
            .run_on(docs.clone())
            .expect("reference");
        assert_same(&want, &reference);
        let (got, spills) = run(
            &pipeline,
            &docs,
            16 * 1024,
            true,
            &dir,
            CancelToken::never(),
        )
        .expect("spilled");
        assert!(
            spills > super::MAX_FAN_IN as u64,
            "expected a compaction, got {spills} runs"
        );
        assert_same(&got, &want);
        assert_eq!(files_in(&dir), 0, "spill files left behind");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn without_disk_use_a_group_over_the_limit_is_292() {
        let docs = input(&(0..2000u32).map(|i| (i, i)).collect::<Vec<_>>());
        let dir = spill_dir("refuse");
        let e = run(
            &[doc! {"$group": {"_id": "$i", "all": {"$push": "$$ROOT"}}}],
            &docs,
            64 * 1024,
            false,
            &dir,
            CancelToken::never(),
        )
        .expect_err("over the limit");
        assert_eq!(e.code(), 292);
        assert_eq!(e.code_name(), "QueryExceededMemoryLimitNoDiskUseAllowed");
        assert!(e.to_string().contains("allowDiskUse:true"), "{e}");
        assert_eq!(files_in(&dir), 0);
    }

    #[test]
    fn a_spilled_group_feeds_the_stages_after_it_and_leaves_no_file_after_an_error() {
        let docs = input(&(0..3000u32).map(|i| (i % 700, i)).collect::<Vec<_>>());
        let dir = spill_dir("after");
        let pipeline = [
            doc! {"$group": {"_id": "$k", "n": {"$sum": 1}, "last": {"$last": "$i"}}},
            doc! {"$sort": {"last": -1}},
            doc! {"$limit": 5},
        ];
        let (want, _) = run(
            &pipeline,
            &docs,
            usize::MAX,
            true,
            &dir,
            CancelToken::never(),
        )
        .expect("memory");
        let (got, spills) =
            run(&pipeline, &docs, 8 * 1024, true, &dir, CancelToken::never()).expect("spilled");
        assert!(spills > 0);
        assert_eq!(got, want);
        // An error while merging ($toInt of a string in a later stage).
        let bad = [
            doc! {"$group": {"_id": "$k", "s": {"$first": "$pad"}}},
            doc! {"$project": {"x": {"$toInt": "$s"}}},
        ];
        let e = run(&bad, &docs, 8 * 1024, true, &dir, CancelToken::never())
            .expect_err("conversion fails");
        assert_eq!(e.code(), 241);
        assert_eq!(files_in(&dir), 0);
        // A killed query.
        let token = CancelToken::new();
        token.cancel(CancelReason::Killed);
        let e = run(&pipeline, &docs, 8 * 1024, true, &dir, token).expect_err("killed");
        assert_eq!(e.code(), 11601);
        assert_eq!(files_in(&dir), 0);
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn bounded_accumulators_count_only_what_they_keep() {
        // One group, 20,000 documents: $lastN/$maxN/$topN keep 2 values each,
        // so the state stays far below 64 KiB (it was counted per document).
        let docs: Vec<Document> = (0..20_000i32).map(|i| doc! {"i": i}).collect();
        let pipeline = [doc! {"$group": {
            "_id": null,
            "last": {"$lastN": {"input": "$i", "n": 2}},
            "max": {"$maxN": {"input": "$i", "n": 2}},
            "top": {"$topN": {"output": "$i", "sortBy": {"i": -1}, "n": 2}},
        }}];
        let dir = spill_dir("bounded");
        let (out, spills) = run(
            &pipeline,
            &docs,
            64 * 1024,
            false,
            &dir,
            CancelToken::never(),
        )
        .expect("fits");
        assert_eq!(spills, 0);
        assert_eq!(
            out,
            vec![
                doc! {"_id": null, "last": [19_998, 19_999], "max": [19_999, 19_998], "top": [19_999, 19_998]}
            ]
        );
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(24))]
        #[test]
        fn any_limit_gives_the_in_memory_answer(
            items in proptest::collection::vec((0u32..60, 0u32..1000), 0..600),
            limit in 1024usize..32 * 1024,
        ) {
            let docs = input(&items);
            let pipeline = [doc! {"$group": every_accumulator()}];
            let dir = spill_dir("prop");
            let (want, _) = run(&pipeline, &docs, usize::MAX, false, &dir, CancelToken::never())
                .expect("memory");
            let (got, _) = run(&pipeline, &docs, limit, true, &dir, CancelToken::never())
                .expect("spilled");
            assert_same(&got, &want);
            prop_assert_eq!(files_in(&dir), 0);
            let _ = std::fs::remove_dir_all(&dir);
        }
    }
}
