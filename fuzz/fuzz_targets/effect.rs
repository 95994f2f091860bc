//! cargo-fuzz target `effect`: arbitrary bytes through the engine's on-disk
//! decoder of that format and on into a fresh state (see
//! `duetdb::fuzzing::effect_target`: nothing may panic, and whatever decodes
//! must leave every collection's invariants intact).
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = duetdb::fuzzing::effect_target(data);
});
