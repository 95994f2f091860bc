//! Cancellation of long-running reads: a [`CancelToken`] that every layer can
//! check, carrying why the work was cancelled.
//!
//! Owns: the token (a shared atomic flag plus an optional deadline) and
//! [`CancelReason`], which maps to MongoDB's codes through
//! [`crate::error::Error::Interrupted`].
//!
//! Contract with the code that checks it: long-running work (scans under every
//! strategy, sorts, `$group`, other pipeline stages, counts, distinct, OLCP
//! maps) calls [`CancelToken::check`] at *page* granularity — every few
//! hundred documents examined, not only every few hundred returned — so a
//! cancelled read stops within one page of work. A check costs one atomic
//! load, plus one clock read when the token has a deadline.
//!
//! Invariants:
//! - the first reason wins: once cancelled, a token stays cancelled with the
//!   same reason (later `cancel` calls and the deadline change nothing);
//! - [`CancelToken::never`] (the default) can never be cancelled, so callers
//!   that pass no token keep today's behaviour and pay one branch per check;
//! - cancelling only sets the flag: the work notices it at its next check and
//!   unwinds through its ordinary error path (drop guards release VLS slots,
//!   spill files are removed), so no lock or resource is left behind.

use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::Arc;
use std::time::Instant;

use crate::error::{Error, Result};

/// Why a read was cancelled.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum CancelReason {
    /// Its `maxTimeMS` deadline passed. Code 50 (MaxTimeMSExpired).
    MaxTimeExpired,
    /// `killOp` (or an embedding application) killed it. Code 11601 (Interrupted).
    Killed,
    /// The client closed its connection while the command ran. Code 279
    /// (ClientDisconnect), as MongoDB reports it in its log; nobody reads the reply.
    ClientDisconnected,
    /// The server is shutting down. Code 11600 (InterruptedAtShutdown).
    Shutdown,
}

impl CancelReason {
    fn to_u8(self) -> u8 {
        match self {
            CancelReason::MaxTimeExpired => 1,
            CancelReason::Killed => 2,
            CancelReason::ClientDisconnected => 3,
            CancelReason::Shutdown => 4,
        }
    }

    fn from_u8(v: u8) -> Option<CancelReason> {
        Some(match v {
            1 => CancelReason::MaxTimeExpired,
            2 => CancelReason::Killed,
            3 => CancelReason::ClientDisconnected,
            4 => CancelReason::Shutdown,
            _ => return None,
        })
    }

    /// MongoDB's numeric code.
    pub fn code(self) -> i32 {
        match self {
            CancelReason::MaxTimeExpired => 50,
            CancelReason::Killed => 11601,
            CancelReason::ClientDisconnected => 279,
            CancelReason::Shutdown => 11600,
        }
    }

    /// MongoDB's code name.
    pub fn code_name(self) -> &'static str {
        match self {
            CancelReason::MaxTimeExpired => "MaxTimeMSExpired",
            CancelReason::Killed => "Interrupted",
            CancelReason::ClientDisconnected => "ClientDisconnect",
            CancelReason::Shutdown => "InterruptedAtShutdown",
        }
    }

    /// MongoDB's message.
    pub fn message(self) -> &'static str {
        match self {
            CancelReason::MaxTimeExpired => "operation exceeded time limit",
            CancelReason::Killed => "operation was interrupted",
            CancelReason::ClientDisconnected => {
                "operation was interrupted because a client disconnected"
            }
            CancelReason::Shutdown => "interrupted at shutdown",
        }
    }
}

/// A shared cancellation flag with an optional deadline; cheap to clone and
/// to check. See the module documentation for the checking contract.
#[derive(Clone, Default)]
pub struct CancelToken {
    inner: Option<Arc<Inner>>,
}

struct Inner {
    /// 0 while live, else [`CancelReason::to_u8`].
    reason: AtomicU8,
    deadline: Option<Instant>,
}

impl std::fmt::Debug for CancelToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CancelToken")
            .field("cancellable", &self.inner.is_some())
            .field("reason", &self.peek())
            .finish()
    }
}

impl CancelToken {
    /// A token that is never cancelled (what callers without one pass).
    pub fn never() -> CancelToken {
        CancelToken { inner: None }
    }

    /// A token cancelled only by [`CancelToken::cancel`].
    pub fn new() -> CancelToken {
        CancelToken::build(None)
    }

    /// A token that also counts as cancelled (MaxTimeMSExpired) from `deadline` on.
    pub fn with_deadline(deadline: Instant) -> CancelToken {
        CancelToken::build(Some(deadline))
    }

    fn build(deadline: Option<Instant>) -> CancelToken {
        CancelToken {
            inner: Some(Arc::new(Inner {
                reason: AtomicU8::new(0),
                deadline,
            })),
        }
    }

    /// The deadline, if the token has one.
    pub fn deadline(&self) -> Option<Instant> {
        self.inner.as_ref().and_then(|i| i.deadline)
    }

    /// Cancel for `reason`; returns false when it was already cancelled (the
    /// first reason is kept). A token made with [`CancelToken::never`] ignores it.
    pub fn cancel(&self, reason: CancelReason) -> bool {
        let Some(inner) = &self.inner else {
            return false;
        };
        inner
            .reason
            .compare_exchange(0, reason.to_u8(), Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
    }

    /// The reason, without consulting the clock.
    fn peek(&self) -> Option<CancelReason> {
        let inner = self.inner.as_ref()?;
        CancelReason::from_u8(inner.reason.load(Ordering::Acquire))
    }

    /// Why the token is cancelled, if it is; a passed deadline cancels it now
    /// (MaxTimeMSExpired) unless another reason came first.
    pub fn reason(&self) -> Option<CancelReason> {
        let inner = self.inner.as_ref()?;
        if let Some(r) = CancelReason::from_u8(inner.reason.load(Ordering::Acquire)) {
            return Some(r);
        }
        let deadline = inner.deadline?;
        if Instant::now() < deadline {
            return None;
        }
        self.cancel(CancelReason::MaxTimeExpired);
        self.peek()
    }

    pub fn is_cancelled(&self) -> bool {
        self.reason().is_some()
    }

    /// `Err(Interrupted)` once cancelled: the check long-running work makes
    /// every page.
    #[inline]
    pub fn check(&self) -> Result<()> {
        if self.inner.is_none() {
            return Ok(());
        }
        match self.reason() {
            None => Ok(()),
            Some(r) => Err(Error::Interrupted(r)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn never_is_never_cancelled() {
        let t = CancelToken::never();
        assert!(!t.cancel(CancelReason::Killed));
        assert!(t.check().is_ok());
        assert_eq!(t.reason(), None);
    }

    #[test]
    fn first_reason_wins_and_clones_share_it() {
        let t = CancelToken::new();
        let c = t.clone();
        assert!(t.check().is_ok());
        assert!(c.cancel(CancelReason::Killed));
        assert!(!t.cancel(CancelReason::Shutdown));
        let e = t.check().expect_err("must fail");
        assert_eq!((e.code(), e.code_name()), (11601, "Interrupted"));
    }

    #[test]
    fn a_passed_deadline_is_max_time_expired() {
        let t = CancelToken::with_deadline(Instant::now() - Duration::from_millis(1));
        let e = t.check().expect_err("must fail");
        assert_eq!((e.code(), e.code_name()), (50, "MaxTimeMSExpired"));
        // The deadline fixed the reason: a later kill changes nothing.
        assert!(!t.cancel(CancelReason::Killed));
        assert_eq!(t.reason(), Some(CancelReason::MaxTimeExpired));
        let far = CancelToken::with_deadline(Instant::now() + Duration::from_secs(3600));
        assert!(far.check().is_ok());
    }

    #[test]
    fn every_reason_has_mongodb_codes() {
        for (r, code) in [
            (CancelReason::MaxTimeExpired, 50),
            (CancelReason::Killed, 11601),
            (CancelReason::ClientDisconnected, 279),
            (CancelReason::Shutdown, 11600),
        ] {
            assert_eq!(Error::Interrupted(r).code(), code);
            assert_eq!(CancelReason::from_u8(r.to_u8()), Some(r));
        }
    }
}
