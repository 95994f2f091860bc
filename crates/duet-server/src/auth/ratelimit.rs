//! Failed authentications rate-limited per source address, and the log line
//! every authentication outcome gets (target `duet::auth`).
//!
//! Policy: after `failures` failed authentications from one source within
//! `window` of the first of them, that source is blocked for `window`,
//! doubled at each further block (at most [`MAX_BLOCK`]). A blocked
//! source's `saslStart` and `saslContinue` answer 18 AuthenticationFailed at
//! once, before any credential is looked at — so a right password is refused
//! too until the block ends. Refusing (rather than delaying the reply) holds
//! no thread, no timer and no connection slot; drivers do not retry code 18.
//! A success forgets the source. `failures == 0` turns the limit off.
//! Loopback is not exempt.
//!
//! A source is an IPv4 address, or an IPv6 /64 (one host usually owns a
//! whole /64, so counting single IPv6 addresses would not limit it);
//! IPv4-mapped IPv6 addresses count as their IPv4 address.
//!
//! Invariants:
//! - memory is bounded: at most `max_tracked` sources are remembered; when
//!   full, expired entries are dropped, then the least recently seen;
//! - an entry quiet for [`MAX_BLOCK`] after its last failure and its last
//!   block is expired: its
//!   strikes (the doubling) are forgotten;
//! - nothing here blocks: one short mutex section per authentication step;
//! - log lines carry user, db, mechanism, source and a reason category, never
//!   a password, proof, nonce or salt.

use std::collections::HashMap;
use std::net::{IpAddr, Ipv6Addr};
use std::time::{Duration, Instant};

use crate::error::CommandError;
use crate::state::{ConnInfo, ServerState};

/// Failed authentications from one source before it is blocked
/// (`--auth-failure-limit`).
pub const DEFAULT_FAILURE_LIMIT: u32 = 5;
/// The window those failures must fall in, and the first block's length
/// (`--auth-failure-window-secs`).
pub const DEFAULT_WINDOW: Duration = Duration::from_secs(60);
/// The longest block (the doubling stops here).
pub const MAX_BLOCK: Duration = Duration::from_secs(3600);
/// Sources remembered at most.
pub const MAX_TRACKED: usize = 10_000;

/// The limiter's settings.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// Failures within `window` that block a source; 0: no limit.
    pub failures: u32,
    pub window: Duration,
    pub max_tracked: usize,
}

impl Default for Limits {
    fn default() -> Limits {
        Limits {
            failures: DEFAULT_FAILURE_LIMIT,
            window: DEFAULT_WINDOW,
            max_tracked: MAX_TRACKED,
        }
    }
}

/// What failures are counted against: an IPv4 address or an IPv6 /64.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Source(IpAddr);

impl Source {
    pub fn of(ip: IpAddr) -> Source {
        match ip.to_canonical() {
            IpAddr::V6(v6) => {
                let masked = u128::from(v6) & !((1u128 << 64) - 1);
                Source(IpAddr::V6(Ipv6Addr::from(masked)))
            }
            v4 => Source(v4),
        }
    }
}

#[derive(Debug, Clone, Copy)]
struct Entry {
    /// Failures since `first_failure` (reset when the window passes or a
    /// block starts).
    failures: u32,
    first_failure: Instant,
    blocked_until: Option<Instant>,
    /// Blocks so far: the next one lasts `window * 2^strikes`.
    strikes: u32,
    last_seen: Instant,
}

impl Entry {
    fn new(now: Instant) -> Entry {
        Entry {
            failures: 0,
            first_failure: now,
            blocked_until: None,
            strikes: 0,
            last_seen: now,
        }
    }

    fn blocked(&self, now: Instant) -> Option<Duration> {
        self.blocked_until
            .and_then(|t| t.checked_duration_since(now))
            .filter(|d| !d.is_zero())
    }

    /// Quiet for [`MAX_BLOCK`] since the last failure and the end of the
    /// last block.
    fn expired(&self, now: Instant) -> bool {
        let quiet_since = self
            .blocked_until
            .map_or(self.last_seen, |b| b.max(self.last_seen));
        now.saturating_duration_since(quiet_since) >= MAX_BLOCK
    }
}

/// Whether a source may try to authenticate now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    Allowed,
    Blocked { retry_after: Duration },
}

/// The per-source failure counters (see the module documentation).
#[derive(Debug)]
pub struct RateLimiter {
    limits: Limits,
    entries: parking_lot::Mutex<HashMap<Source, Entry>>,
}

impl RateLimiter {
    pub fn new(limits: Limits) -> RateLimiter {
        RateLimiter {
            limits,
            entries: parking_lot::Mutex::new(HashMap::new()),
        }
    }

    fn enabled(&self) -> bool {
        self.limits.failures > 0 && self.limits.max_tracked > 0
    }

    pub fn check(&self, ip: IpAddr, now: Instant) -> Verdict {
        if !self.enabled() {
            return Verdict::Allowed;
        }
        match self.entries.lock().get(&Source::of(ip)) {
            Some(e) => match e.blocked(now) {
                Some(retry_after) => Verdict::Blocked { retry_after },
                None => Verdict::Allowed,
            },
            None => Verdict::Allowed,
        }
    }

    /// Count a failure; `Some(block)` when it started a block of that length.
    pub fn failure(&self, ip: IpAddr, now: Instant) -> Option<Duration> {
        if !self.enabled() {
            return None;
        }
        let source = Source::of(ip);
        let mut entries = self.entries.lock();
        if !entries.contains_key(&source) && entries.len() >= self.limits.max_tracked {
            make_room(&mut entries, self.limits.max_tracked, now);
        }
        let e = entries.entry(source).or_insert_with(|| Entry::new(now));
        if e.expired(now) {
            *e = Entry::new(now);
        }
        e.last_seen = now;
        if e.blocked(now).is_some() {
            return None;
        }
        if e.failures == 0 || now.saturating_duration_since(e.first_failure) > self.limits.window {
            e.failures = 0;
            e.first_failure = now;
        }
        e.failures += 1;
        if e.failures < self.limits.failures {
            return None;
        }
        let block = self
            .limits
            .window
            .saturating_mul(1u32 << e.strikes.min(31))
            .min(MAX_BLOCK);
        e.blocked_until = now.checked_add(block);
        e.strikes = e.strikes.saturating_add(1);
        e.failures = 0;
        Some(block)
    }

    /// A success forgets the source.
    pub fn success(&self, ip: IpAddr) {
        if self.enabled() {
            self.entries.lock().remove(&Source::of(ip));
        }
    }

    /// Sources remembered now.
    pub fn tracked(&self) -> usize {
        self.entries.lock().len()
    }
}

/// Drop expired entries; if that frees nothing, the least recently seen.
/// O(tracked), paid only when the table is full.
fn make_room(entries: &mut HashMap<Source, Entry>, max: usize, now: Instant) {
    entries.retain(|_, e| !e.expired(now));
    while entries.len() >= max {
        let Some(oldest) = entries
            .iter()
            .min_by_key(|(_, e)| e.last_seen)
            .map(|(s, _)| *s)
        else {
            return;
        };
        entries.remove(&oldest);
    }
}

/// Why an authentication failed, for the log (the client always gets the
/// same answer).
#[derive(Debug, Clone, Copy)]
pub enum Reason {
    UnknownUser,
    /// The user has no credentials for the mechanism asked for.
    NoCredentialsForMechanism,
    WrongProof,
    RateLimited,
}

impl Reason {
    fn as_str(self) -> &'static str {
        match self {
            Reason::UnknownUser => "unknown_user",
            Reason::NoCredentialsForMechanism => "no_credentials_for_mechanism",
            Reason::WrongProof => "wrong_password",
            Reason::RateLimited => "rate_limited",
        }
    }
}

/// Refuse a blocked source (18) before anything is checked; logged.
pub fn refuse_if_blocked(
    state: &ServerState,
    conn: &ConnInfo,
    user: &str,
    db: &str,
    mechanism: &str,
) -> Result<(), CommandError> {
    match state.auth_limiter.check(conn.peer.ip(), Instant::now()) {
        Verdict::Allowed => Ok(()),
        Verdict::Blocked { retry_after } => {
            tracing::warn!(target: "duet::auth", user, db, mechanism, source = %conn.peer,
                reason = Reason::RateLimited.as_str(), retry_after_secs = retry_after.as_secs_f64().ceil() as u64,
                "authentication refused: too many failed attempts from this address");
            Err(CommandError::new(
                18,
                "AuthenticationFailed",
                "Authentication failed: too many failed attempts from this address; try again later.",
            ))
        }
    }
}

/// Log and count a failed authentication.
pub fn failed(
    state: &ServerState,
    conn: &ConnInfo,
    user: &str,
    db: &str,
    mechanism: &str,
    reason: Reason,
) {
    tracing::info!(target: "duet::auth", user, db, mechanism, source = %conn.peer,
        reason = reason.as_str(), "authentication failed");
    if let Some(block) = state.auth_limiter.failure(conn.peer.ip(), Instant::now()) {
        tracing::warn!(target: "duet::auth", source = %conn.peer, limit = state.config.auth_failure_limit,
            window_secs = state.config.auth_failure_window.as_secs_f64(), block_secs = block.as_secs_f64(),
            "too many failed authentications: address blocked");
    }
}

/// Log a successful authentication and forget the source's failures.
pub fn succeeded(state: &ServerState, conn: &ConnInfo, user: &str, db: &str, mechanism: &str) {
    tracing::info!(target: "duet::auth", user, db, mechanism, source = %conn.peer, "authentication succeeded");
    state.auth_limiter.success(conn.peer.ip());
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::Ipv4Addr;

    fn ip(s: &str) -> IpAddr {
        s.parse().expect("ip")
    }

    fn limiter(failures: u32, max_tracked: usize) -> RateLimiter {
        RateLimiter::new(Limits {
            failures,
            window: Duration::from_secs(10),
            max_tracked,
        })
    }

    #[test]
    fn blocks_after_the_limit_within_the_window_and_doubles() {
        let l = limiter(3, 100);
        let a = ip("10.0.0.1");
        let t0 = Instant::now();
        assert_eq!(l.failure(a, t0), None);
        assert_eq!(l.failure(a, t0 + Duration::from_secs(1)), None);
        assert_eq!(l.check(a, t0 + Duration::from_secs(2)), Verdict::Allowed);
        let t = t0 + Duration::from_secs(2);
        assert_eq!(l.failure(a, t), Some(Duration::from_secs(10)));
        assert_eq!(
            l.check(a, t + Duration::from_secs(4)),
            Verdict::Blocked {
                retry_after: Duration::from_secs(6)
            }
        );
        // Another source is not affected.
        assert_eq!(l.check(ip("10.0.0.2"), t), Verdict::Allowed);
        // The block ends; the next block is twice as long.
        let t = t + Duration::from_secs(10);
        assert_eq!(l.check(a, t), Verdict::Allowed);
        assert_eq!(l.failure(a, t), None);
        assert_eq!(l.failure(a, t), None);
        assert_eq!(l.failure(a, t), Some(Duration::from_secs(20)));
    }

    #[test]
    fn failures_outside_the_window_do_not_add_up() {
        let l = limiter(3, 100);
        let a = ip("192.0.2.7");
        let t0 = Instant::now();
        for i in 0..10u64 {
            // Two failures per 11 s: never three within a 10 s window.
            let t = t0 + Duration::from_secs(11 * i);
            assert_eq!(l.failure(a, t), None);
            assert_eq!(l.failure(a, t + Duration::from_secs(1)), None);
        }
    }

    #[test]
    fn success_forgets_and_zero_disables() {
        let l = limiter(2, 100);
        let a = ip("::1");
        let t0 = Instant::now();
        assert_eq!(l.failure(a, t0), None);
        l.success(a);
        assert_eq!(l.failure(a, t0), None);
        assert!(l.failure(a, t0).is_some());
        assert!(matches!(l.check(a, t0), Verdict::Blocked { .. }));

        let off = limiter(0, 100);
        for _ in 0..100 {
            assert_eq!(off.failure(a, t0), None);
        }
        assert_eq!(off.check(a, t0), Verdict::Allowed);
        assert_eq!(off.tracked(), 0);
    }

    #[test]
    fn ipv6_counts_per_64_and_mapped_v4_as_v4() {
        let l = limiter(2, 100);
        let t0 = Instant::now();
        assert_eq!(l.failure(ip("2001:db8:1:2::1"), t0), None);
        assert!(l.failure(ip("2001:db8:1:2:ffff::9"), t0).is_some());
        assert!(matches!(
            l.check(ip("2001:db8:1:2::42"), t0),
            Verdict::Blocked { .. }
        ));
        assert_eq!(l.check(ip("2001:db8:1:3::1"), t0), Verdict::Allowed);

        assert_eq!(l.failure(ip("203.0.113.5"), t0), None);
        assert!(l.failure(ip("::ffff:203.0.113.5"), t0).is_some());
        assert!(matches!(
            l.check(ip("203.0.113.5"), t0),
            Verdict::Blocked { .. }
        ));
    }

    #[test]
    fn memory_is_bounded_and_blocks_expire() {
        let l = limiter(2, 50);
        let t0 = Instant::now();
        for i in 0..1000u32 {
            let a = IpAddr::V4(Ipv4Addr::from(0x0a00_0000 + i));
            let _ = l.failure(a, t0 + Duration::from_millis(u64::from(i)));
            assert!(l.tracked() <= 50);
        }
        // The most recent sources are the ones kept.
        let last = IpAddr::V4(Ipv4Addr::from(0x0a00_0000 + 999));
        assert!(l.failure(last, t0 + Duration::from_secs(2)).is_some());
        // Strikes are forgotten after MAX_BLOCK of quiet: the next block is
        // the first length again.
        let later = t0 + MAX_BLOCK + Duration::from_secs(100);
        assert_eq!(l.check(last, later), Verdict::Allowed);
        assert_eq!(l.failure(last, later), None);
        assert_eq!(l.failure(last, later), Some(Duration::from_secs(10)));
    }

    #[test]
    fn the_block_never_passes_the_maximum() {
        let l = limiter(1, 10);
        let a = ip("198.51.100.1");
        let mut t = Instant::now();
        let mut last = Duration::ZERO;
        for _ in 0..40 {
            let block = l.failure(a, t).expect("blocked at once");
            assert!(block <= MAX_BLOCK && block >= last);
            last = block;
            t += block;
        }
        assert_eq!(last, MAX_BLOCK);
    }
}
