//! The write path: the single writer, what each command does to a state, and
//! the group's effects handed to the log. Layer 5: uses `error`, `doc`,
//! `store`, `query` and `durability` (the WAL it appends to).

pub mod command;
pub mod writer;
