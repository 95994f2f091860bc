//! Snapshots: how a read stays consistent while the writer keeps going.
//! Layer 6: uses `error`, `doc`, `store`, `query`, `durability` and `write`.
//!
//! - `strategy`: the strategies and `choose()`, the one place a strategy is decided;
//! - `scan`: the scan driver for every strategy (`none`, `cow`, `vls`, `olcp`);
//! - `vls`: the scan side of VLS (registration at a commit boundary, claiming);
//! - `olcp`: one-pass commutative queries with old versions propagated;
//! - `named`: named snapshots (the registry, expiry, durable pins), analytics modes;
//! - `retained`: what a held snapshot costs (nodes and bytes no longer shared).

pub mod named;
pub mod olcp;
pub mod retained;
pub mod scan;
pub mod strategy;
pub mod vls;

pub use strategy::{choose, Choice, Read, ReadCounts, ReadStats, Strategy};
