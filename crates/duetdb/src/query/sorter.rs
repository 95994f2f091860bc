//! A memory-bounded sort of documents: in memory up to a byte limit, then
//! either refused (292) or spilled as sorted runs and merged (an external
//! merge sort); with a `keep` bound (sort + limit) a top-k heap that never
//! holds more than `keep` documents.
//!
//! Owns: [`Sorter`] (accumulate, spill, compact) and [`SortedStream`] (the
//! ordered output: an in-memory vector or a k-way merge of runs).
//!
//! Invariants:
//! - equal keys come out by their tie-breaker: the arrival order for
//!   [`Sorter::push`] (a stable sort), the given value for
//!   [`Sorter::push_tied`] (a find's record id, so every plan gives the same
//!   order); runs store the tie, so a spilled sort orders ties exactly as an
//!   in-memory one;
//! - the buffer holds at most `memory_limit_bytes` of documents and keys
//!   (accounted as document bytes + key bytes + item overhead) after every
//!   [`Sorter::push`]; over it the buffer is spilled, or the push fails with
//!   [`Error::ExceededMemoryLimit`] when disk use is not allowed;
//! - with `keep = Some(k)` the buffer holds at most `k` documents: a document
//!   worse than the current `k`-th best is dropped at once;
//! - at most [`MAX_FAN_IN`] runs are open at once (older runs are merged into
//!   one first), bounding descriptors and merge buffers;
//! - the sort itself never panics on documents (keys are total orders).

use std::cmp::Ordering;
use std::path::PathBuf;

use bson::RawBson;

use crate::doc::DocRef;
use crate::error::{CancelToken, Error, Result};
use crate::query::limits::ReadLimits;
use crate::query::sort::{SortKey, SortSpec};
use crate::query::spill::{RunReader, RunWriter};

/// Runs merged at once; more are first compacted into one.
pub const MAX_FAN_IN: usize = 64;
/// Documents between two cancellation checks while merging.
const CHECK_EVERY: usize = 256;

/// One buffered document with its key.
struct Item {
    key: SortKey,
    /// Tie-breaker: arrival order or the caller's value.
    tie: u64,
    doc: DocRef,
    /// What it counts against the memory limit.
    bytes: usize,
}

fn key_bytes(key: &SortKey) -> usize {
    key.0
        .iter()
        .map(|v| {
            std::mem::size_of::<RawBson>()
                + match v {
                    RawBson::String(s) | RawBson::JavaScriptCode(s) | RawBson::Symbol(s) => s.len(),
                    RawBson::Document(d) => d.as_bytes().len(),
                    RawBson::Array(a) => a.as_bytes().len(),
                    RawBson::Binary(b) => b.bytes.len(),
                    _ => 0,
                }
        })
        .sum()
}

/// Min-heap (by `before`) helpers over a slice; `before(a, b)`: `a` belongs
/// nearer the root.
fn sift_up<T>(v: &mut [T], mut i: usize, before: &impl Fn(&T, &T) -> bool) {
    while i > 0 {
        let p = (i - 1) / 2;
        if before(&v[i], &v[p]) {
            v.swap(i, p);
            i = p;
        } else {
            break;
        }
    }
}

fn sift_down<T>(v: &mut [T], mut i: usize, before: &impl Fn(&T, &T) -> bool) {
    let n = v.len();
    loop {
        let l = 2 * i + 1;
        if l >= n {
            break;
        }
        let r = l + 1;
        let c = if r < n && before(&v[r], &v[l]) { r } else { l };
        if before(&v[c], &v[i]) {
            v.swap(c, i);
            i = c;
        } else {
            break;
        }
    }
}

/// A sort in progress.
pub struct Sorter {
    spec: SortSpec,
    memory_limit: usize,
    allow_disk_use: bool,
    spill_dir: PathBuf,
    cancel: CancelToken,
    /// Only the first `keep` documents in sort order are wanted.
    keep: Option<usize>,
    /// Arrival order; with `keep`, a heap whose root is the worst kept item.
    buf: Vec<Item>,
    buf_bytes: usize,
    peak_bytes: usize,
    /// Spilled runs, oldest first.
    runs: Vec<RunReader>,
    spilled_runs: u64,
    seq: u64,
}

impl std::fmt::Debug for Sorter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sorter")
            .field("spec", &self.spec)
            .field("buffered", &self.buf.len())
            .field("buf_bytes", &self.buf_bytes)
            .field("runs", &self.runs.len())
            .finish()
    }
}

impl Sorter {
    /// A sort by `spec` under `limits`, spilling (when allowed) to `spill_dir`;
    /// `keep`: only that many first documents are wanted (sort + limit).
    pub fn new(
        spec: SortSpec,
        limits: &ReadLimits,
        spill_dir: PathBuf,
        keep: Option<usize>,
    ) -> Sorter {
        Sorter {
            spec,
            memory_limit: limits.memory_limit_bytes,
            allow_disk_use: limits.allow_disk_use,
            spill_dir,
            cancel: limits.cancel.clone(),
            keep,
            buf: Vec::new(),
            buf_bytes: 0,
            peak_bytes: 0,
            runs: Vec::new(),
            spilled_runs: 0,
            seq: 0,
        }
    }

    fn cmp(spec: &SortSpec, a: &Item, b: &Item) -> Ordering {
        spec.compare_keys(&a.key, &b.key)
            .then_with(|| a.tie.cmp(&b.tie))
    }

    /// Add one document; equal keys keep their arrival order.
    pub fn push(&mut self, doc: DocRef) -> Result<()> {
        let tie = self.seq;
        self.seq += 1;
        self.push_tied(doc, tie)
    }

    /// Add one document; equal keys are ordered by `tie`.
    pub fn push_tied(&mut self, doc: DocRef, tie: u64) -> Result<()> {
        if self.keep == Some(0) {
            return Ok(());
        }
        let key = self.spec.sort_key(&doc);
        let bytes = doc.as_bytes().len() + key_bytes(&key) + std::mem::size_of::<Item>();
        let item = Item {
            key,
            tie,
            doc,
            bytes,
        };
        match self.keep {
            Some(k) => {
                let spec = &self.spec;
                let worst_first = |a: &Item, b: &Item| Sorter::cmp(spec, a, b) == Ordering::Greater;
                if self.buf.len() < k {
                    self.buf.push(item);
                    self.buf_bytes += bytes;
                    let last = self.buf.len() - 1;
                    sift_up(&mut self.buf, last, &worst_first);
                } else if Sorter::cmp(spec, &item, &self.buf[0]) == Ordering::Less {
                    let old = std::mem::replace(&mut self.buf[0], item);
                    self.buf_bytes = self.buf_bytes - old.bytes + bytes;
                    sift_down(&mut self.buf, 0, &worst_first);
                } else {
                    return Ok(());
                }
            }
            None => {
                self.buf.push(item);
                self.buf_bytes += bytes;
            }
        }
        self.peak_bytes = self.peak_bytes.max(self.buf_bytes);
        if self.buf_bytes > self.memory_limit {
            self.spill()?;
        }
        Ok(())
    }

    /// Write the buffer as one sorted run (or refuse when disk use is not allowed).
    fn spill(&mut self) -> Result<()> {
        if !self.allow_disk_use {
            return Err(Error::ExceededMemoryLimit(format!(
                "Sort exceeded memory limit of {} bytes, but did not opt in to external sorting. Aborting operation. Pass allowDiskUse:true to opt in.",
                self.memory_limit
            )));
        }
        self.cancel.check()?;
        let spec = &self.spec;
        self.buf.sort_by(|a, b| Sorter::cmp(spec, a, b));
        let mut w = RunWriter::create(&self.spill_dir)?;
        for item in self.buf.drain(..) {
            w.push(item.tie, &item.doc)?;
        }
        self.buf_bytes = 0;
        self.runs.push(w.finish()?);
        self.spilled_runs += 1;
        if self.runs.len() >= MAX_FAN_IN {
            self.compact()?;
        }
        Ok(())
    }

    /// Merge every run into one (they are the oldest documents, so stability holds).
    fn compact(&mut self) -> Result<()> {
        let runs = std::mem::take(&mut self.runs);
        let mut merge = Merger::new(
            self.spec.clone(),
            runs.into_iter().map(Source::Run).collect(),
        )?;
        let mut w = RunWriter::create(&self.spill_dir)?;
        let mut n = 0usize;
        while let Some((tie, doc)) = merge.next_doc()? {
            w.push(tie, &doc)?;
            n += 1;
            if n.is_multiple_of(CHECK_EVERY) {
                self.cancel.check()?;
            }
        }
        self.runs.push(w.finish()?);
        self.spilled_runs += 1;
        Ok(())
    }

    /// The most bytes the buffer held.
    #[cfg(test)]
    fn peak_bytes(&self) -> usize {
        self.peak_bytes
    }

    /// Documents currently buffered in memory.
    #[cfg(test)]
    fn buffered(&self) -> usize {
        self.buf.len()
    }

    /// The sorted output.
    pub fn finish(mut self) -> Result<SortedStream> {
        let spec = self.spec.clone();
        let mut buf = std::mem::take(&mut self.buf);
        buf.sort_by(|a, b| Sorter::cmp(&spec, a, b));
        let held: usize = buf.iter().map(|i| i.bytes).sum();
        let inner = if self.runs.is_empty() {
            Inner::Mem(buf.into_iter())
        } else {
            let mut sources: Vec<Source> = std::mem::take(&mut self.runs)
                .into_iter()
                .map(Source::Run)
                .collect();
            sources.push(Source::Mem(buf.into_iter()));
            Inner::Merge(Merger::new(spec, sources)?)
        };
        Ok(SortedStream {
            inner,
            left: self.keep,
            cancel: self.cancel.clone(),
            yielded: 0,
            held,
            spilled_runs: self.spilled_runs,
            done: false,
        })
    }
}

/// One input of a merge.
enum Source {
    Run(RunReader),
    Mem(std::vec::IntoIter<Item>),
}

impl Source {
    fn next_doc(&mut self) -> Result<Option<(u64, DocRef)>> {
        match self {
            Source::Run(r) => r.next_doc(),
            Source::Mem(it) => Ok(it.next().map(|i| (i.tie, i.doc))),
        }
    }
}

/// A head of a merge source: key, tie-breaker, document.
type Head = (SortKey, u64, DocRef);

/// A k-way merge of sorted sources by (key, tie).
struct Merger {
    spec: SortSpec,
    sources: Vec<Source>,
    heads: Vec<Option<Head>>,
    /// Indices of sources with a head, a min-heap by (head key, index).
    heap: Vec<usize>,
}

impl Merger {
    fn new(spec: SortSpec, mut sources: Vec<Source>) -> Result<Merger> {
        let mut heads = Vec::with_capacity(sources.len());
        for s in &mut sources {
            heads.push(s.next_doc()?.map(|(t, d)| (spec.sort_key(&d), t, d)));
        }
        let mut m = Merger {
            spec,
            sources,
            heads,
            heap: Vec::new(),
        };
        for i in 0..m.sources.len() {
            if m.heads[i].is_some() {
                m.heap.push(i);
                let last = m.heap.len() - 1;
                let (heads, spec) = (&m.heads, &m.spec);
                sift_up(&mut m.heap, last, &|a, b| {
                    Merger::before(spec, heads, *a, *b)
                });
            }
        }
        Ok(m)
    }

    fn before(spec: &SortSpec, heads: &[Option<Head>], a: usize, b: usize) -> bool {
        match (&heads[a], &heads[b]) {
            (Some((ka, ta, _)), Some((kb, tb, _))) => {
                spec.compare_keys(ka, kb).then(ta.cmp(tb)).then(a.cmp(&b)) == Ordering::Less
            }
            (Some(_), None) => true,
            _ => false,
        }
    }

    fn next_doc(&mut self) -> Result<Option<(u64, DocRef)>> {
        let Some(&top) = self.heap.first() else {
            return Ok(None);
        };
        let next = self.sources[top].next_doc()?;
        let out = std::mem::replace(
            &mut self.heads[top],
            next.map(|(t, d)| (self.spec.sort_key(&d), t, d)),
        );
        if self.heads[top].is_none() {
            let last = self.heap.len() - 1;
            self.heap.swap(0, last);
            self.heap.pop();
        }
        let (heads, spec) = (&self.heads, &self.spec);
        sift_down(&mut self.heap, 0, &|a, b| {
            Merger::before(spec, heads, *a, *b)
        });
        Ok(out.map(|(_, t, d)| (t, d)))
    }

    /// Bytes held in memory by the merge (heads, in-memory source, read buffers).
    fn held_bytes(&self) -> usize {
        let heads: usize = self
            .heads
            .iter()
            .flatten()
            .map(|(k, _, d)| d.as_bytes().len() + key_bytes(k))
            .sum();
        let mem: usize = self
            .sources
            .iter()
            .map(|s| match s {
                Source::Mem(it) => it.as_slice().iter().map(|i| i.bytes).sum(),
                Source::Run(_) => 64 * 1024,
            })
            .sum();
        heads + mem
    }
}

enum Inner {
    Mem(std::vec::IntoIter<Item>),
    Merge(Merger),
}

/// The sorted documents, produced on demand. Checks the cancellation token
/// every [`CHECK_EVERY`] documents; after an error it yields nothing more.
pub struct SortedStream {
    inner: Inner,
    /// Documents still wanted (`keep`).
    left: Option<usize>,
    cancel: CancelToken,
    yielded: usize,
    /// Bytes of the in-memory items not yet yielded.
    held: usize,
    spilled_runs: u64,
    done: bool,
}

impl std::fmt::Debug for SortedStream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SortedStream")
            .field("held_bytes", &self.held_bytes())
            .field("spilled_runs", &self.spilled_runs)
            .finish()
    }
}

impl SortedStream {
    /// Bytes this stream holds in memory.
    pub fn held_bytes(&self) -> usize {
        match &self.inner {
            Inner::Mem(_) => self.held,
            Inner::Merge(m) => m.held_bytes(),
        }
    }

    /// Runs the sort spilled to disk.
    pub fn spilled_runs(&self) -> u64 {
        self.spilled_runs
    }

    /// Replace the token checked while producing documents (a cursor's next
    /// batch runs under its own command's token).
    pub fn set_cancel(&mut self, cancel: CancelToken) {
        self.cancel = cancel;
    }

    fn step(&mut self) -> Result<Option<DocRef>> {
        if self.left == Some(0) {
            return Ok(None);
        }
        self.yielded += 1;
        if self.yielded.is_multiple_of(CHECK_EVERY) {
            self.cancel.check()?;
        }
        let doc = match &mut self.inner {
            Inner::Mem(it) => it.next().map(|i| {
                self.held = self.held.saturating_sub(i.bytes);
                i.doc
            }),
            Inner::Merge(m) => m.next_doc()?.map(|(_, d)| d),
        };
        if doc.is_some() {
            if let Some(n) = &mut self.left {
                *n -= 1;
            }
        }
        Ok(doc)
    }
}

impl Iterator for SortedStream {
    type Item = Result<DocRef>;

    fn next(&mut self) -> Option<Result<DocRef>> {
        if self.done {
            return None;
        }
        match self.step() {
            Ok(Some(d)) => Some(Ok(d)),
            Ok(None) => {
                self.done = true;
                None
            }
            Err(e) => {
                self.done = true;
                Some(Err(e))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bson::{doc, Document, RawDocumentBuf};
    use proptest::prelude::*;
    use std::sync::Arc;

    /// The process's temporary spill directory: removed again after each
    /// run file is created, so these tests leave nothing behind.
    fn dir() -> PathBuf {
        crate::query::limits::default_temp_spill_dir()
    }

    fn d(doc: Document) -> DocRef {
        Arc::new(RawDocumentBuf::try_from(&doc).expect("test setup"))
    }

    fn limits(bytes: usize, disk: bool) -> ReadLimits {
        ReadLimits {
            memory_limit_bytes: bytes,
            allow_disk_use: disk,
            ..ReadLimits::default()
        }
    }

    fn run(docs: &[(i32, i32)], bytes: usize, keep: Option<usize>) -> (Vec<(i32, i32)>, u64) {
        let spec = SortSpec::parse(&doc! {"k": 1}).expect("test setup");
        let mut s = Sorter::new(spec, &limits(bytes, true), dir(), keep);
        for (k, i) in docs {
            s.push(d(doc! {"k": k, "i": i})).expect("test setup");
            if let Some(k) = keep {
                assert!(s.buffered() <= k, "top-k holds more than k");
            }
            assert!(
                s.peak_bytes() <= bytes.saturating_add(200),
                "over the memory limit"
            );
        }
        let out = s.finish().expect("test setup");
        let runs = out.spilled_runs();
        let got = out
            .map(|r| {
                let r = r.expect("test setup");
                (
                    r.get_i32("k").expect("test setup"),
                    r.get_i32("i").expect("test setup"),
                )
            })
            .collect();
        (got, runs)
    }

    fn reference(docs: &[(i32, i32)], keep: Option<usize>) -> Vec<(i32, i32)> {
        let mut v = docs.to_vec();
        v.sort_by_key(|(k, _)| *k); // stable: ties keep input order
        if let Some(k) = keep {
            v.truncate(k);
        }
        v
    }

    #[test]
    fn over_the_limit_without_disk_use_is_292() {
        let spec = SortSpec::parse(&doc! {"k": 1}).expect("test setup");
        let mut s = Sorter::new(spec, &limits(2_000, false), dir(), None);
        let mut err = None;
        for i in 0..100 {
            if let Err(e) = s.push(d(doc! {"k": i, "pad": "x".repeat(100)})) {
                err = Some(e);
                break;
            }
        }
        let e = err.expect("the limit must be enforced");
        assert_eq!(e.code(), 292);
        assert_eq!(e.code_name(), "QueryExceededMemoryLimitNoDiskUseAllowed");
    }

    #[test]
    fn spilled_sort_equals_in_memory_sort_and_is_stable() {
        let docs: Vec<(i32, i32)> = (0..5000).map(|i| ((i * 7919) % 97, i)).collect();
        let (got, runs) = run(&docs, 4_000, None);
        assert!(
            runs > MAX_FAN_IN as u64,
            "expected compaction, got {runs} runs"
        );
        assert_eq!(got, reference(&docs, None));
    }

    #[test]
    fn top_k_holds_k_and_spills_when_k_does_not_fit() {
        let docs: Vec<(i32, i32)> = (0..3000).map(|i| ((i * 31) % 101, i)).collect();
        assert_eq!(
            run(&docs, usize::MAX, Some(10)).0,
            reference(&docs, Some(10))
        );
        let (got, runs) = run(&docs, 3_000, Some(200));
        assert!(runs > 0);
        assert_eq!(got, reference(&docs, Some(200)));
        assert!(run(&docs, 1_000, Some(0)).0.is_empty());
    }

    #[test]
    fn a_cancelled_merge_stops_with_the_cancel_error() {
        let spec = SortSpec::parse(&doc! {"k": 1}).expect("test setup");
        let token = CancelToken::new();
        let l = ReadLimits {
            cancel: token.clone(),
            ..limits(1_000, true)
        };
        let mut s = Sorter::new(spec, &l, dir(), None);
        for i in 0..2000 {
            s.push(d(doc! {"k": i})).expect("test setup");
        }
        let mut out = s.finish().expect("test setup");
        assert!(out.next().expect("test setup").is_ok());
        token.cancel(crate::error::CancelReason::Killed);
        let errs: Vec<_> = out.by_ref().filter_map(|r| r.err()).collect();
        assert_eq!(errs.len(), 1);
        assert_eq!(errs[0].code(), 11601);
        assert!(out.next().is_none());
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(48))]
        #[test]
        fn any_limit_and_keep_give_the_stable_sort(
            keys in proptest::collection::vec(0i32..20, 0..400),
            bytes in 200usize..20_000,
            keep in proptest::option::of(0usize..50),
        ) {
            let docs: Vec<(i32, i32)> = keys.iter().enumerate().map(|(i, k)| (*k, i as i32)).collect();
            prop_assert_eq!(run(&docs, bytes, keep).0, reference(&docs, keep));
        }
    }
}
