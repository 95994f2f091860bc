//! duet-bench: the benchmark harness of duetdb.
//!
//! Owns the named workloads (`ycsb`, `htap`, `snapshot`, `space`, `ycsb-t`,
//! `tpcch`), the
//! CH-benCHmark-style generator (`chbench`) and the TPC-H queries run as OLCP
//! (`tpch`), the targets they run
//! against (the embedded engine always; the MongoDB-wire target `wire`, through
//! the official driver, with the default feature `wire`; peers behind the
//! `peers` feature so ordinary builds stay fast), the JSON/Markdown results with
//! machine facts and the spread of repeated runs, and `report`, which regenerates
//! `BENCHMARKS.md` sections and PNG charts from the JSON results.
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
#[cfg(feature = "wire")]
pub mod wire;
pub mod workload;

pub use cli::{run, BenchCommand};
