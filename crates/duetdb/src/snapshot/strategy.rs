//! The snapshot strategies and the one function that chooses among them.
//!
//! | strategy | reads | guarantee |
//! |---|---|---|
//! | `none` | the latest published state, reloaded page by page | none (cursor stability; MongoDB's default; the baseline) |
//! | `vls` | the live data, with per-record status bits and the shared remset | exactly the start state, keeping only the old versions it still needs |
//! | `cow` | one published root held for the whole scan | exactly the start state; holds every node/version replaced meanwhile |
//! | `olcp` | like `vls`, superseded versions handed to the scan at once | every start-state document exactly once, in no particular order |
//!
//! `auto` (the default) picks `cow` for `_id` point lookups (an O(1) root held
//! for microseconds) and `vls` for everything else.

use std::sync::atomic::{AtomicU64, Ordering};

use crate::error::{Error, Result};
use crate::query::planner::{Access, Plan};

/// How a read is kept consistent while writes continue.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Strategy {
    /// `cow` for `_id` point lookups, `vls` otherwise.
    #[default]
    Auto,
    /// No snapshot: each record read at its latest committed state.
    None,
    /// Virtual Lightweight Snapshot.
    Vls,
    /// Hold a copy-on-write root for the whole read.
    Cow,
    /// One pass over the live data in which versions superseded before the
    /// scan read them are handed to it at once (propagation, KVell+'s OLCP)
    /// instead of being kept: for commutative work that accepts any order.
    Olcp,
}

impl Strategy {
    pub fn name(self) -> &'static str {
        match self {
            Strategy::Auto => "auto",
            Strategy::None => "none",
            Strategy::Vls => "vls",
            Strategy::Cow => "cow",
            Strategy::Olcp => "olcp",
        }
    }
}

impl std::str::FromStr for Strategy {
    type Err = Error;
    fn from_str(s: &str) -> Result<Strategy> {
        match s {
            "auto" => Ok(Strategy::Auto),
            "none" => Ok(Strategy::None),
            "vls" => Ok(Strategy::Vls),
            "cow" => Ok(Strategy::Cow),
            "olcp" => Ok(Strategy::Olcp),
            other => Err(Error::bad_value(format!(
                "unknown snapshot strategy '{other}': use none, vls, olcp, cow or auto"
            ))),
        }
    }
}

impl std::fmt::Display for Strategy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// What kind of read asks, as far as the choice of strategy cares.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Read {
    /// A find. `top_k`: it has a sort and a limit, so when the plan yields
    /// sort order a `cow` walk may stop after about k records.
    Find { top_k: bool },
    /// A count or distinct: every matching document once, order irrelevant.
    /// `match_all`: no filter, answered from one root's size.
    Count { match_all: bool },
    /// An aggregation. `commutative`: its scan part is an OLCP-eligible
    /// commutative part (the result does not depend on arrival order) and
    /// the pipeline does not stop early at a leading `$limit`.
    Aggregate { commutative: bool },
}

/// The strategy a read runs under and why (reported by explain).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Choice {
    /// Never `Auto`.
    pub strategy: Strategy,
    pub reason: &'static str,
}

/// The one place a read's strategy is decided. `plan`: the plan it would run
/// (`None` when the collection does not exist).
///
/// An explicit request is honoured, with one exception that would otherwise
/// give a wrong answer: `olcp` on an order-dependent pipeline runs as `vls`.
/// `auto` picks the cheapest strategy that is consistent.
pub fn choose(requested: Strategy, read: Read, plan: Option<&Plan>) -> Choice {
    let pick = |strategy, reason| Choice { strategy, reason };
    match (requested, read) {
        (Strategy::Olcp, Read::Aggregate { commutative: false }) => pick(
            Strategy::Vls,
            "olcp requested, but the pipeline's result depends on arrival order",
        ),
        (Strategy::Auto, _) => choose_auto(read, plan),
        (s, _) => pick(s, "requested"),
    }
}

fn choose_auto(read: Read, plan: Option<&Plan>) -> Choice {
    let pick = |strategy, reason| Choice { strategy, reason };
    let Some(plan) = plan else {
        return pick(Strategy::Cow, "auto: no such collection");
    };
    if matches!(plan.access, Access::IdPoints { .. }) {
        return pick(
            Strategy::Cow,
            "auto: _id point lookup holds one root briefly",
        );
    }
    match read {
        Read::Count { match_all: true } => pick(Strategy::Cow, "auto: count of one root"),
        Read::Find { top_k: true } if plan.provides_sort => pick(
            Strategy::Cow,
            "auto: top-k read in index order stops after k records",
        ),
        Read::Aggregate { commutative: true } => pick(
            Strategy::Olcp,
            "auto: commutative pipeline, one pass with old versions propagated",
        ),
        _ => pick(
            Strategy::Vls,
            "auto: scan keeps only the old versions it still needs",
        ),
    }
}

/// How many live reads ran under each strategy (after [`choose`]): the
/// evidence that a requested strategy is the one that ran (`serverStatus`).
#[derive(Debug, Default)]
pub struct ReadCounts {
    none: AtomicU64,
    vls: AtomicU64,
    cow: AtomicU64,
    olcp: AtomicU64,
}

/// A copy of [`ReadCounts`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ReadStats {
    pub none: u64,
    pub vls: u64,
    pub cow: u64,
    pub olcp: u64,
}

impl ReadCounts {
    /// Count one read that ran under `strategy` (never `auto`).
    pub fn record(&self, strategy: Strategy) {
        debug_assert_ne!(
            strategy,
            Strategy::Auto,
            "a read runs under a chosen strategy"
        );
        let c = match strategy {
            Strategy::None => &self.none,
            Strategy::Vls => &self.vls,
            Strategy::Cow | Strategy::Auto => &self.cow,
            Strategy::Olcp => &self.olcp,
        };
        c.fetch_add(1, Ordering::Relaxed);
    }

    pub fn stats(&self) -> ReadStats {
        ReadStats {
            none: self.none.load(Ordering::Relaxed),
            vls: self.vls.load(Ordering::Relaxed),
            cow: self.cow.load(Ordering::Relaxed),
            olcp: self.olcp.load(Ordering::Relaxed),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plan(access: Access, provides_sort: bool) -> Plan {
        Plan {
            access,
            provides_sort,
        }
    }

    #[test]
    fn explicit_requests_are_honoured() {
        let scan = plan(Access::CollScan { reverse: false }, false);
        for s in [Strategy::None, Strategy::Vls, Strategy::Cow, Strategy::Olcp] {
            for read in [
                Read::Find { top_k: false },
                Read::Find { top_k: true },
                Read::Count { match_all: true },
                Read::Count { match_all: false },
                Read::Aggregate { commutative: true },
            ] {
                assert_eq!(choose(s, read, Some(&scan)).strategy, s, "{s} {read:?}");
            }
        }
        let c = choose(Strategy::Olcp, Read::Aggregate { commutative: false }, None);
        assert_eq!(c.strategy, Strategy::Vls);
    }

    #[test]
    fn auto_picks_by_plan_and_read() {
        let scan = plan(Access::CollScan { reverse: false }, false);
        let ids = plan(Access::IdPoints { ids: Vec::new() }, true);
        let sorted = plan(Access::CollScan { reverse: false }, true);
        let auto = |read, p| choose(Strategy::Auto, read, p).strategy;
        assert_eq!(auto(Read::Find { top_k: false }, None), Strategy::Cow);
        assert_eq!(auto(Read::Find { top_k: false }, Some(&ids)), Strategy::Cow);
        assert_eq!(
            auto(Read::Find { top_k: false }, Some(&scan)),
            Strategy::Vls
        );
        assert_eq!(
            auto(Read::Find { top_k: true }, Some(&sorted)),
            Strategy::Cow
        );
        assert_eq!(auto(Read::Find { top_k: true }, Some(&scan)), Strategy::Vls);
        assert_eq!(
            auto(Read::Count { match_all: true }, Some(&scan)),
            Strategy::Cow
        );
        assert_eq!(
            auto(Read::Count { match_all: false }, Some(&scan)),
            Strategy::Vls
        );
        let agg = |commutative| Read::Aggregate { commutative };
        assert_eq!(auto(agg(true), Some(&scan)), Strategy::Olcp);
        assert_eq!(auto(agg(false), Some(&scan)), Strategy::Vls);
        assert_eq!(auto(agg(true), Some(&ids)), Strategy::Cow);
    }
}
