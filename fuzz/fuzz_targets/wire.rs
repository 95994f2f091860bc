//! cargo-fuzz target `wire`: arbitrary bytes as a client's byte stream through
//! framing, OP_MSG / OP_QUERY decoding and command execution (see
//! `src/harness.rs` for what is asserted).
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    duet_fuzz::harness::run(data);
});
