//! duet-fuzz: fuzz harnesses shared by the cargo-fuzz targets and, through
//! `#[path]` includes, by stable tests that replay the committed corpus.

pub mod harness;
