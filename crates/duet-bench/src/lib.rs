//! duet-bench: the benchmark harness of duetdb.
//!
//! Owns the named workloads (`workload`: `ycsb`, `htap`, `snapshot`,
//! `space`, `ycsb-t`, `tpcch`), each written once against the capability it
//! needs from a target (`targets`: the `Target` trait, the embedded engine
//! and the shared documents); the targets beside the embedded engine (`wire`:
//! a MongoDB-wire server through the official driver, default feature `wire`;
//! `peers`: SQLite, PostgreSQL, LMDB behind cargo features so ordinary builds
//! stay fast); the CH-benCHmark-style generator (`chbench`) and the TPC-H
//! queries run as OLCP (`tpch`); the one subcommand runner (`cli`); the
//! JSON/Markdown results with machine facts and the spread of repeated runs
//! (`result`); and `report`, which regenerates `BENCHMARKS.md` sections and
//! PNG charts from the JSON results.
//!
//! Performance is never asserted here: the test suite runs every workload tiny
//! to keep it from rotting, and the numbers live in `BENCHMARKS.md`.

pub mod chbench;
pub mod cli;
pub mod gen;
pub mod machine;
pub mod peers;
pub mod plot;
pub mod progress;
pub mod report;
pub mod result;
pub mod stats;
pub mod targets;
pub mod tpch;
pub mod tpch_pipeline;
#[cfg(feature = "wire")]
pub mod wire;
pub mod workload;

pub use cli::{run, BenchCommand};
