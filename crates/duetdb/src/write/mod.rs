//! The write path: the single writer, what each command does to a state, and
//! the group's effects handed to the log; `delta`: delta indexing's merger. Layer 5: uses `error`, `doc`,
//! `store`, `query` and `durability` (the WAL it appends to).

pub mod command;
pub mod delta;
pub mod writer;
