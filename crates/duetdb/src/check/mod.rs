//! Checkers that try to break the engine's promises: the snapshot checker
//! (`consistency`: every scan returns exactly its start state) and the crash
//! campaign (`killtest`: no acknowledged write is lost across SIGKILL).
//! Layer 9, the top: uses the public API and anything below it.

pub mod consistency;
pub mod killtest;

pub use consistency::*;
