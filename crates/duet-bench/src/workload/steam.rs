//! `steam`: the Steam baseline of KVell+'s Fig. 4 (the paper's §4.3, after
//! Steam) as a strategy of the bench, over any `space` target. The target
//! stores one version of every document, the latest (read page by page, as
//! duetdb's `none` strategy reads it); this module keeps the old versions
//! Steam keeps, in this process, and serves every query its snapshot:
//!
//! - an update takes a timestamp; if an active snapshot `s` sees the version
//!   it replaces (`begin <= s < ts`), that version is copied (a point read
//!   of the target) into the document's version chain; then the chain is
//!   pruned of every old version no active snapshot sees (Steam's garbage
//!   collection on update), and the target is written;
//! - a query registers a snapshot (the current timestamp), waits until the
//!   updates with smaller timestamps have finished writing, then scans the
//!   target's latest state: a document whose latest version is newer than the
//!   snapshot is read from its chain instead;
//! - when a query ends, its snapshot is unregistered and every chain is swept
//!   of the versions no remaining snapshot sees (KVell+'s Steam deletes old
//!   versions after commit; the paper's Table 1 reports that cleaning time,
//!   and so does [`Steam::sweep_ms_max`]).
//!
//! So at most one old version per document per active snapshot is kept, a
//! version several snapshots see is kept (and counted) once, and nothing is
//! kept once no query runs. The figures are exact counters of the kept
//! copies and their document bytes, cheap enough to read at every sample.
//!
//! Invariants (what makes every query read exactly its snapshot):
//! - a document's target write, chain and latest timestamp change only under
//!   its stripe lock, and its timestamps grow (they are taken under it);
//! - timestamps and snapshots are taken under one clock lock, so an update
//!   with `ts > s` was stamped after `s` was registered and saw it, and kept
//!   the version `s` needs before overwriting it;
//! - a snapshot is read only after every update stamped `<= s` has written,
//!   so a scanned document whose latest timestamp is `<= s` (checked under its
//!   lock after reading it) is the version `s` sees.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Result};

use crate::targets::SpaceLatest;

/// Lock stripes over the documents (document `id` lives in stripe
/// `id % STRIPES`): enough that the update and query threads of a cell
/// (a handful) rarely meet on one.
const STRIPES: usize = 1024;

/// How long a query sleeps between looks at the updates it waits for (they
/// are single writes: microseconds).
const WAIT_POLL: Duration = Duration::from_micros(20);

/// One kept old version: seen by the snapshots `begin <= s < end`.
struct OldVersion {
    begin: u64,
    end: u64,
    doc: Box<[u8]>,
}

impl OldVersion {
    fn seen_by(&self, s: u64) -> bool {
        self.begin <= s && s < self.end
    }
}

/// The documents of one stripe.
struct Stripe {
    /// Timestamp of each document's latest version (0: as loaded), by
    /// `id / STRIPES`.
    latest: Vec<u64>,
    /// Kept old versions per document, oldest first; no empty chains.
    chains: HashMap<u64, Vec<OldVersion>>,
}

/// Timestamps and the snapshots they are compared with.
#[derive(Default)]
struct Clock {
    /// The last timestamp handed out.
    last: u64,
    /// Active snapshots (timestamp → queries reading it).
    active: BTreeMap<u64, usize>,
    /// Timestamps of updates still writing.
    writing: BTreeSet<u64>,
}

/// Steam's version store beside a target holding the latest versions.
pub struct Steam {
    records: u64,
    stripes: Vec<Mutex<Stripe>>,
    clock: Mutex<Clock>,
    kept_versions: AtomicU64,
    kept_bytes: AtomicU64,
    sweep_ns_max: AtomicU64,
}

fn lock<T>(m: &Mutex<T>) -> Result<MutexGuard<'_, T>> {
    m.lock().map_err(|_| anyhow!("steam: a lock was poisoned"))
}

impl Steam {
    /// A store for documents `0..records`, all as loaded (timestamp 0).
    pub fn new(records: u64) -> Steam {
        let per_stripe = records.div_ceil(STRIPES as u64) as usize;
        Steam {
            records,
            stripes: (0..STRIPES)
                .map(|_| {
                    Mutex::new(Stripe {
                        latest: vec![0; per_stripe],
                        chains: HashMap::new(),
                    })
                })
                .collect(),
            clock: Mutex::new(Clock::default()),
            kept_versions: AtomicU64::new(0),
            kept_bytes: AtomicU64::new(0),
            sweep_ns_max: AtomicU64::new(0),
        }
    }

    /// Old versions kept now.
    pub fn kept_versions(&self) -> f64 {
        self.kept_versions.load(Ordering::Acquire) as f64
    }

    /// Document bytes of the old versions kept now.
    pub fn kept_bytes(&self) -> f64 {
        self.kept_bytes.load(Ordering::Acquire) as f64
    }

    /// The longest sweep after a query so far (ms).
    pub fn sweep_ms_max(&self) -> f64 {
        self.sweep_ns_max.load(Ordering::Acquire) as f64 / 1e6
    }

    fn locate(&self, id: u64) -> Result<(&Mutex<Stripe>, usize)> {
        if id >= self.records {
            bail!(
                "steam: document {id} outside the loaded 0..{}",
                self.records
            );
        }
        Ok((
            &self.stripes[(id % STRIPES as u64) as usize],
            (id / STRIPES as u64) as usize,
        ))
    }

    /// Set `f2` of document `id` on `store`, keeping the version it replaces
    /// if an active snapshot sees it; whether the target changed, and the
    /// update's timestamp.
    pub fn update<S: SpaceLatest + ?Sized>(
        &self,
        store: &mut S,
        id: u64,
        payload: &str,
    ) -> Result<(bool, u64)> {
        let (stripe, slot) = self.locate(id)?;
        let mut guard = lock(stripe)?;
        let (ts, active) = {
            let mut c = lock(&self.clock)?;
            c.last += 1;
            let ts = c.last;
            c.writing.insert(ts);
            (ts, c.active.keys().copied().collect::<Vec<_>>())
        };
        let written = self.write(&mut guard, store, id, slot, ts, &active, payload);
        lock(&self.clock)?.writing.remove(&ts);
        written.map(|changed| (changed, ts))
    }

    /// Requires: the stripe of `id` is locked (`st`), `ts` is registered as
    /// writing and `active` is the snapshots at the time `ts` was taken.
    #[allow(clippy::too_many_arguments)]
    fn write<S: SpaceLatest + ?Sized>(
        &self,
        st: &mut Stripe,
        store: &mut S,
        id: u64,
        slot: usize,
        ts: u64,
        active: &[u64],
        payload: &str,
    ) -> Result<bool> {
        let prev = st.latest[slot];
        debug_assert!(prev < ts, "a document's timestamps grow");
        let chain = st.chains.entry(id).or_default();
        if active.iter().any(|&s| prev <= s && s < ts) {
            let doc = store.get_doc(id)?.into_boxed_slice();
            self.kept_versions.fetch_add(1, Ordering::AcqRel);
            self.kept_bytes
                .fetch_add(doc.len() as u64, Ordering::AcqRel);
            chain.push(OldVersion {
                begin: prev,
                end: ts,
                doc,
            });
        }
        self.prune(chain, active);
        if chain.is_empty() {
            st.chains.remove(&id);
        }
        let changed = store.update(id, payload)?;
        st.latest[slot] = ts;
        Ok(changed)
    }

    /// Delete the versions of `chain` no snapshot of `active` sees.
    fn prune(&self, chain: &mut Vec<OldVersion>, active: &[u64]) {
        chain.retain(|v| {
            let keep = active.iter().any(|&s| v.seen_by(s));
            if !keep {
                self.kept_versions.fetch_sub(1, Ordering::AcqRel);
                self.kept_bytes
                    .fetch_sub(v.doc.len() as u64, Ordering::AcqRel);
            }
            keep
        });
    }

    /// One query: take a snapshot, hand every document as of it to `visit`
    /// (outside every lock), release the snapshot and sweep. Returns the
    /// documents visited and the snapshot's timestamp.
    pub fn query<S: SpaceLatest + ?Sized>(
        &self,
        store: &mut S,
        visit: &mut dyn FnMut(u64, &[u8]),
    ) -> Result<(u64, u64)> {
        let s = self.begin()?;
        let read = self
            .wait_for_writes(s)
            .and_then(|()| self.read(store, s, visit));
        // Released whatever the read did, so no later query pays for it.
        let ended = self.end(s);
        let n = read?;
        ended?;
        Ok((n, s))
    }

    fn begin(&self) -> Result<u64> {
        let mut c = lock(&self.clock)?;
        let s = c.last;
        *c.active.entry(s).or_insert(0) += 1;
        Ok(s)
    }

    /// Wait until every update stamped `<= s` has written the target.
    fn wait_for_writes(&self, s: u64) -> Result<()> {
        while lock(&self.clock)?.writing.range(..=s).next().is_some() {
            std::thread::sleep(WAIT_POLL);
        }
        Ok(())
    }

    /// Requires: snapshot `s` is active and every update stamped `<= s` has
    /// written.
    fn read<S: SpaceLatest + ?Sized>(
        &self,
        store: &mut S,
        s: u64,
        visit: &mut dyn FnMut(u64, &[u8]),
    ) -> Result<u64> {
        let mut old = Vec::new();
        store.scan_latest(&mut |id, latest| {
            let (stripe, slot) = self.locate(id)?;
            let st = lock(stripe)?;
            if st.latest[slot] <= s {
                drop(st);
                visit(id, latest);
                return Ok(());
            }
            let v = st
                .chains
                .get(&id)
                .and_then(|c| c.iter().find(|v| v.seen_by(s)))
                .ok_or_else(|| {
                    anyhow!("steam: no version of document {id} kept for snapshot {s} (a bug)")
                })?;
            old.clear();
            old.extend_from_slice(&v.doc);
            drop(st);
            visit(id, &old);
            Ok(())
        })
    }

    /// Unregister snapshot `s` and sweep every chain of the versions no
    /// remaining snapshot sees.
    fn end(&self, s: u64) -> Result<()> {
        {
            let mut c = lock(&self.clock)?;
            match c.active.get_mut(&s) {
                Some(n) if *n > 1 => *n -= 1,
                Some(_) => {
                    c.active.remove(&s);
                }
                None => bail!("steam: snapshot {s} ended twice (a bug)"),
            }
        }
        let t0 = Instant::now();
        for stripe in &self.stripes {
            let mut st = lock(stripe)?;
            // Read under the stripe lock: newer than what any update of this
            // stripe saw, so no version a registered snapshot needs is lost.
            let active: Vec<u64> = lock(&self.clock)?.active.keys().copied().collect();
            st.chains.retain(|_, chain| {
                self.prune(chain, &active);
                !chain.is_empty()
            });
        }
        self.sweep_ns_max
            .fetch_max(t0.elapsed().as_nanos() as u64, Ordering::AcqRel);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;
    use std::sync::atomic::AtomicBool;

    /// A single-version store: document `id` is its payload's bytes.
    struct Fake<'a> {
        docs: &'a Mutex<Vec<Vec<u8>>>,
    }

    impl SpaceLatest for Fake<'_> {
        fn update(&mut self, id: u64, payload: &str) -> Result<bool> {
            let mut d = lock(self.docs)?;
            let slot = &mut d[id as usize];
            let changed = slot.as_slice() != payload.as_bytes();
            *slot = payload.as_bytes().to_vec();
            Ok(changed)
        }
        fn get_doc(&mut self, id: u64) -> Result<Vec<u8>> {
            Ok(lock(self.docs)?[id as usize].clone())
        }
        fn scan_latest(&mut self, visit: &mut dyn FnMut(u64, &[u8]) -> Result<()>) -> Result<u64> {
            let n = lock(self.docs)?.len();
            for id in 0..n {
                // One document at a time, as a page-by-page scan: updates
                // run between documents.
                let d = lock(self.docs)?[id].clone();
                visit(id as u64, &d)?;
            }
            Ok(n as u64)
        }
    }

    fn loaded(n: usize) -> Mutex<Vec<Vec<u8>>> {
        Mutex::new((0..n).map(|i| format!("load-{i}").into_bytes()).collect())
    }

    #[test]
    fn one_version_per_document_per_snapshot_and_none_after() {
        let docs = loaded(4);
        let mut f = Fake { docs: &docs };
        let steam = Steam::new(4);
        // No snapshot: nothing is kept however often a document changes.
        for n in 0..5 {
            steam.update(&mut f, 1, &format!("a{n}")).expect("update");
        }
        assert_eq!(steam.kept_versions(), 0.0);
        let s1 = steam.begin().expect("begin");
        for n in 0..5 {
            steam.update(&mut f, 1, &format!("b{n}")).expect("update");
        }
        // One version for s1, not one per update.
        assert_eq!(steam.kept_versions(), 1.0);
        assert_eq!(steam.kept_bytes(), 2.0);
        let s2 = steam.begin().expect("begin");
        steam.update(&mut f, 2, "c").expect("update");
        // Document 2 was not updated between s1 and s2: one version both see.
        assert_eq!(steam.kept_versions(), 2.0);
        steam.update(&mut f, 1, "d").expect("update");
        assert_eq!(steam.kept_versions(), 3.0);
        let mut seen = HashMap::new();
        steam
            .read(&mut f, s1, &mut |id, d| {
                seen.insert(id, String::from_utf8_lossy(d).into_owned());
            })
            .expect("read s1");
        assert_eq!(seen[&1], "a4");
        assert_eq!(seen[&2], "load-2");
        steam.end(s1).expect("end");
        // s1's own version of document 1 goes; the shared one of 2 stays for s2.
        assert_eq!(steam.kept_versions(), 2.0);
        steam.end(s2).expect("end");
        assert_eq!(steam.kept_versions(), 0.0);
        assert_eq!(steam.kept_bytes(), 0.0);
        assert!(steam.end(s2).is_err());
    }

    #[test]
    fn out_of_range_documents_are_errors() {
        let docs = loaded(2);
        let steam = Steam::new(2);
        assert!(steam.update(&mut Fake { docs: &docs }, 2, "x").is_err());
    }

    /// Every query, with updates racing it, reads exactly the state its
    /// snapshot names: for each document the payload of its last update
    /// stamped `<= s`.
    #[test]
    fn concurrent_queries_read_exactly_their_snapshot() {
        const DOCS: usize = 300;
        let docs = loaded(DOCS);
        let steam = Steam::new(DOCS as u64);
        let log = Mutex::new(Vec::<(u64, u64, String)>::new());
        let stop = AtomicBool::new(false);
        let reads = Mutex::new(Vec::<(u64, Vec<String>)>::new());
        std::thread::scope(|sc| {
            for t in 0..2u64 {
                let (docs, steam, log, stop) = (&docs, &steam, &log, &stop);
                sc.spawn(move || {
                    let mut f = Fake { docs };
                    let mut n = 0u64;
                    while !stop.load(Ordering::Acquire) || n < 2000 {
                        // Every third update on five hot documents.
                        let id = if n.is_multiple_of(3) {
                            n % 5
                        } else {
                            (n * 7 + t * 13) % DOCS as u64
                        };
                        let payload = format!("t{t}-{n}");
                        let (_, ts) = steam.update(&mut f, id, &payload).expect("update");
                        lock(log).expect("log").push((ts, id, payload));
                        n += 1;
                    }
                });
            }
            let queries: Vec<_> = (0..2)
                .map(|_| {
                    let (docs, steam, reads) = (&docs, &steam, &reads);
                    sc.spawn(move || {
                        let mut f = Fake { docs };
                        for _ in 0..6 {
                            let mut got = vec![String::new(); DOCS];
                            let (n, s) = steam
                                .query(&mut f, &mut |id, d| {
                                    got[id as usize] = String::from_utf8_lossy(d).into_owned();
                                })
                                .expect("query");
                            assert_eq!(n, DOCS as u64);
                            lock(reads).expect("reads").push((s, got));
                        }
                    })
                })
                .collect();
            for q in queries {
                q.join().expect("query thread");
            }
            stop.store(true, Ordering::Release);
        });
        let mut log = log.into_inner().expect("log");
        log.sort_by_key(|e| e.0);
        let reads = reads.into_inner().expect("reads");
        assert_eq!(reads.len(), 12);
        for (s, got) in reads {
            let mut want: Vec<String> = (0..DOCS).map(|i| format!("load-{i}")).collect();
            for (ts, id, p) in &log {
                if *ts <= s {
                    want[*id as usize] = p.clone();
                }
            }
            assert_eq!(got, want, "snapshot {s}");
        }
        // Nothing is kept once no query runs.
        assert_eq!(steam.kept_versions(), 0.0);
    }
}
