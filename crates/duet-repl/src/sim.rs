//! A simulated network for deterministic simulation tests
//! (`tests/sim.rs`): members started with `Transport::Sim` send their Raft
//! requests — the same envelopes and bytes as over TCP — through a
//! [`SimNet`], which hands them to the target member's `network::Handler`
//! after a delay it chooses, or loses them.
//!
//! What decides a message's fate: a seeded RNG per directed link (sender,
//! receiver), so the k-th message on a link gets the same fate whatever
//! happens on the other links. Per message it draws: whether the request is
//! lost, its delay, whether the reply is lost, the reply's delay. A delay is
//! short (`Faults::delay_ms`) or, now and then (`Faults::slow`), long
//! (`Faults::slow_ms`): long enough to overtake later messages (reorder)
//! and to outlive the sender's deadline (openraft then sees a time-out and
//! retries, while the late request may still be applied). Partitions cut
//! directed links ([`SimNet::cut`], [`SimNet::partition`]); a request is
//! lost when its link is cut as it arrives, a reply when the way back is.
//! A member that is not attached (crashed, not yet restarted) refuses at
//! once, like a closed port.
//!
//! Delays are `tokio::time` sleeps: in a runtime with paused time they are
//! virtual, and the simulation of minutes of faults runs in seconds.
//!
//! Invariant: a request is handled only by the member incarnation attached
//! when it arrives (a crashed member's in-flight requests die with it).

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use crate::network::Handler;
use crate::state_machine::Shared;
use crate::types::Raft;

/// The network faults a [`SimNet`] injects on every message.
#[derive(Debug, Clone, Copy)]
pub struct Faults {
    /// Probability that a request is lost; the same for its reply.
    pub loss: f64,
    /// The usual one-way delay range, ms.
    pub delay_ms: (u64, u64),
    /// Probability that a one-way delay is long instead.
    pub slow: f64,
    /// The long one-way delay range, ms.
    pub slow_ms: (u64, u64),
}

impl Default for Faults {
    fn default() -> Faults {
        Faults {
            loss: 0.05,
            delay_ms: (1, 20),
            slow: 0.05,
            slow_ms: (100, 1500),
        }
    }
}

/// What the network did with the messages (requests) it carried.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Stats {
    pub sent: u64,
    /// Requests handled and replies returned to a waiting sender.
    pub answered: u64,
    /// Requests or replies lost at random.
    pub lost: u64,
    /// Requests or replies lost to a cut link.
    pub cut: u64,
    /// Messages given a long delay.
    pub slow: u64,
    /// Requests to a member that was down.
    pub refused: u64,
}

struct Endpoint {
    raft: Raft,
    shared: Arc<Shared>,
}

#[derive(Default)]
struct Inner {
    /// Attached members by wire address.
    endpoints: HashMap<String, Endpoint>,
    /// Each directed link's RNG, made on its first message.
    links: HashMap<(String, String), StdRng>,
    /// Directed links that are cut (sender, receiver).
    cut: BTreeSet<(String, String)>,
    stats: Stats,
}

/// See the module documentation.
pub struct SimNet {
    seed: u64,
    faults: Faults,
    inner: Mutex<Inner>,
}

/// One message's fate, drawn when it is sent.
struct Fate {
    lose_request: bool,
    there: Duration,
    lose_reply: bool,
    back: Duration,
}

impl SimNet {
    pub fn new(seed: u64, faults: Faults) -> Arc<SimNet> {
        Arc::new(SimNet {
            seed,
            faults,
            inner: Mutex::new(Inner::default()),
        })
    }

    /// Member `addr` (its wire address) is up: requests to it are handled
    /// by `raft`.
    pub(crate) fn attach(&self, addr: &str, raft: Raft, shared: Arc<Shared>) {
        self.inner
            .lock()
            .endpoints
            .insert(addr.to_string(), Endpoint { raft, shared });
    }

    /// Member `addr` is down (if `shared` is the incarnation attached).
    pub(crate) fn detach(&self, addr: &str, shared: &Arc<Shared>) {
        let mut g = self.inner.lock();
        if g.endpoints
            .get(addr)
            .is_some_and(|e| Arc::ptr_eq(&e.shared, shared))
        {
            g.endpoints.remove(addr);
        }
    }

    /// Cut the directed link `from` → `to`.
    pub fn cut(&self, from: &str, to: &str) {
        self.inner
            .lock()
            .cut
            .insert((from.to_string(), to.to_string()));
    }

    /// Cut every link between members of different `groups` (both ways),
    /// after healing every cut.
    pub fn partition(&self, groups: &[Vec<String>]) {
        let mut g = self.inner.lock();
        g.cut.clear();
        for (i, a) in groups.iter().enumerate() {
            for (j, b) in groups.iter().enumerate() {
                if i != j {
                    for x in a {
                        for y in b {
                            g.cut.insert((x.clone(), y.clone()));
                        }
                    }
                }
            }
        }
    }

    /// Heal every cut link.
    pub fn heal(&self) {
        self.inner.lock().cut.clear();
    }

    /// The directed links cut now.
    pub fn cuts(&self) -> Vec<(String, String)> {
        self.inner.lock().cut.iter().cloned().collect()
    }

    pub fn stats(&self) -> Stats {
        self.inner.lock().stats
    }

    fn fate(&self, from: &str, to: &str) -> Fate {
        let mut g = self.inner.lock();
        let seed = self.seed;
        let f = self.faults;
        let rng = g
            .links
            .entry((from.to_string(), to.to_string()))
            .or_insert_with(|| StdRng::seed_from_u64(seed ^ link_hash(from, to)));
        let mut slow = 0;
        let mut delay = |rng: &mut StdRng| {
            let (lo, hi) = if rng.gen_bool(f.slow) {
                slow += 1;
                f.slow_ms
            } else {
                f.delay_ms
            };
            Duration::from_millis(rng.gen_range(lo..=hi.max(lo)))
        };
        let lose_request = rng.gen_bool(f.loss);
        let there = delay(rng);
        let lose_reply = rng.gen_bool(f.loss);
        let back = delay(rng);
        g.stats.slow += slow;
        Fate {
            lose_request,
            there,
            lose_reply,
            back,
        }
    }

    fn is_cut(&self, from: &str, to: &str) -> bool {
        self.inner
            .lock()
            .cut
            .contains(&(from.to_string(), to.to_string()))
    }

    fn count(&self, f: impl FnOnce(&mut Stats)) {
        f(&mut self.inner.lock().stats)
    }

    /// Send request `bytes` from member `from` to member `to` and wait for
    /// the reply, at most `ttl`.
    pub(crate) async fn call(
        self: &Arc<Self>,
        from: &str,
        to: &str,
        bytes: Vec<u8>,
        ttl: Duration,
    ) -> std::io::Result<Vec<u8>> {
        self.count(|s| s.sent += 1);
        if !self.inner.lock().endpoints.contains_key(to) {
            self.count(|s| s.refused += 1);
            // A closed port answers at once; a little later here, so a
            // sender retrying in a loop still lets virtual time pass.
            tokio::time::sleep(Duration::from_millis(1)).await;
            return Err(std::io::Error::new(
                std::io::ErrorKind::ConnectionRefused,
                format!("simulated member {to} is down"),
            ));
        }
        let fate = self.fate(from, to);
        let (tx, rx) = tokio::sync::oneshot::channel();
        let net = self.clone();
        let (from, to) = (from.to_string(), to.to_string());
        tokio::spawn(async move {
            tokio::time::sleep(fate.there).await;
            if net.is_cut(&from, &to) {
                net.count(|s| s.cut += 1);
                return;
            }
            if fate.lose_request {
                net.count(|s| s.lost += 1);
                return;
            }
            let target = {
                let g = net.inner.lock();
                g.endpoints
                    .get(&to)
                    .map(|e| (e.raft.clone(), e.shared.clone()))
            };
            let Some((raft, shared)) = target else {
                net.count(|s| s.refused += 1);
                return;
            };
            let handler = Handler::new(raft, shared, from.clone());
            let Some(reply) = handler.handle_owned(bytes).await else {
                return;
            };
            tokio::time::sleep(fate.back).await;
            if net.is_cut(&to, &from) {
                net.count(|s| s.cut += 1);
                return;
            }
            if fate.lose_reply {
                net.count(|s| s.lost += 1);
                return;
            }
            if tx.send(reply).is_ok() {
                net.count(|s| s.answered += 1);
            }
        });
        match tokio::time::timeout(ttl, rx).await {
            Ok(Ok(reply)) => Ok(reply),
            _ => Err(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                "simulated Raft RPC timed out",
            )),
        }
    }
}

/// A stable hash of a directed link (FNV-1a; `std`'s hasher is seeded per
/// process, which would make fates differ between runs of one seed).
fn link_hash(from: &str, to: &str) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in from.bytes().chain([0u8]).chain(to.bytes()) {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A link's fates depend on the seed and the link alone.
    #[test]
    fn fates_are_a_function_of_seed_and_link() {
        let draw = |net: &SimNet, from: &str, to: &str| {
            (0..50)
                .map(|_| {
                    let f = net.fate(from, to);
                    (f.lose_request, f.there, f.lose_reply, f.back)
                })
                .collect::<Vec<_>>()
        };
        let a = SimNet::new(7, Faults::default());
        let b = SimNet::new(7, Faults::default());
        let on_a = draw(&a, "h:1", "h:2");
        // Traffic on another link in between changes nothing.
        draw(&b, "h:2", "h:1");
        assert_eq!(on_a, draw(&b, "h:1", "h:2"));
        let c = SimNet::new(8, Faults::default());
        assert_ne!(on_a, draw(&c, "h:1", "h:2"));
    }

    #[test]
    fn a_partition_cuts_both_ways_between_groups_only() {
        let n = SimNet::new(1, Faults::default());
        n.cut("x", "y");
        n.partition(&[vec!["a".into()], vec!["b".into(), "c".into()]]);
        assert!(n.is_cut("a", "b") && n.is_cut("c", "a"));
        assert!(!n.is_cut("b", "c") && !n.is_cut("x", "y"));
        n.heal();
        assert!(n.cuts().is_empty());
    }
}
