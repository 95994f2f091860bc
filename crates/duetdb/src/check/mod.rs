//! Checkers that try to break the engine's promises: the snapshot checker
//! (`consistency`: every scan returns exactly its start state; `lookup`: a
//! `$lookup` reads the other collection at the scan's csn), the crash
//! campaign (`killtest`: no acknowledged write is lost across SIGKILL) and
//! the data-directory campaign (`datadir`: a deleted, truncated or damaged
//! file is recovered from or refused by name, never silently lost).
//! Layer 9, the top: uses the public API and anything below it.

pub mod consistency;
pub mod datadir;
pub mod killtest;
pub mod lookup;

pub use consistency::*;
