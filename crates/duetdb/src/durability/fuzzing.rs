//! Entry points for fuzzing the on-disk decoders: WAL segments and records,
//! effects, checkpoint images and the manifest. Each takes arbitrary bytes,
//! decodes them the way recovery does and applies what decodes to a fresh
//! state; none may panic, whatever the input. The cargo-fuzz targets in
//! `fuzz/fuzz_targets/` call these, and `tests/fuzz_corpus.rs` replays their
//! committed corpora on stable.
//!
//! Checksums guard every frame on disk, so random bytes almost never get past
//! them. The `*_reframed` variants take the input as a sequence of payloads
//! (each behind a 2-byte little-endian length) and give each a valid frame,
//! so the fuzzer reaches the decoders behind the checksums.
//!
//! Invariant checked here, beyond "no panic": a state that decoded and applied
//! without error passes every collection's `check_invariants` (a decoder must
//! never build a state the rest of the engine cannot trust).

use std::path::Path;

use super::checkpoint;
use super::effect::{self, Reader};
use super::manifest::Manifest;
use super::wal::{self, SEGMENT_MAGIC};
use crate::store::DbState;

/// What a fuzz input decoded to: how many records, effects or collections.
pub type Decoded = Result<usize, String>;

fn fake_path() -> &'static Path {
    Path::new("fuzz-input")
}

/// Every collection of `state` passes its invariant check. A failure is a
/// bug in a decoder or in `effect::apply`, so it panics for the fuzzer.
fn assert_sound(state: &DbState) {
    for (name, c) in state.collections.iter() {
        if let Err(why) = c.check_invariants() {
            panic!("decoded state breaks collection {name}: {why}");
        }
    }
}

/// Split `input` into payloads, each behind a 2-byte little-endian length
/// (a short last one takes what is left).
fn payloads(input: &[u8]) -> Vec<&[u8]> {
    let mut out = Vec::new();
    let mut rest = input;
    while rest.len() >= 2 {
        let n = usize::from(u16::from_le_bytes([rest[0], rest[1]]));
        rest = &rest[2..];
        let n = n.min(rest.len());
        out.push(&rest[..n]);
        rest = &rest[n..];
    }
    out
}

/// Frame each payload validly, as the writer would.
fn reframe(prefix: &[u8], input: &[u8]) -> Vec<u8> {
    let mut buf = prefix.to_vec();
    for p in payloads(input) {
        wal::frame(p, &mut buf);
    }
    buf
}

/// Decode and apply record payloads in order, as recovery replays a log;
/// stops at the first record that does not decode or apply.
fn replay(records: impl Iterator<Item = Result<Vec<u8>, String>>) -> Decoded {
    let mut state = DbState::default();
    let mut n = 0;
    for payload in records {
        let record = wal::decode_record(&payload?).map_err(|e| e.0)?;
        effect::apply_all(&mut state, record.effects)?;
        state.csn = record.lsn;
        n += 1;
    }
    assert_sound(&state);
    Ok(n)
}

/// A WAL segment file as found on disk: the magic, then frames.
pub fn wal_segment(bytes: &[u8]) -> Decoded {
    let body = bytes
        .strip_prefix(SEGMENT_MAGIC.as_slice())
        .ok_or("not a WAL segment")?;
    let mut pos = 0;
    let mut payloads = Vec::new();
    while let Some((p, next)) = wal::read_frame(body, pos)? {
        payloads.push(Ok(p.to_vec()));
        pos = next;
    }
    replay(payloads.into_iter())
}

/// WAL record payloads with valid frames (see the module doc).
pub fn wal_records_reframed(input: &[u8]) -> Decoded {
    let framed = reframe(SEGMENT_MAGIC, input);
    wal_segment(&framed)
}

/// One effect stream (the body of a record after its header), decoded and
/// applied to a fresh state.
pub fn effects(bytes: &[u8]) -> Decoded {
    let mut r = Reader::new(bytes);
    let mut state = DbState::default();
    let mut n = 0;
    while !r.done() {
        let e = effect::decode(&mut r).map_err(|e| e.0)?;
        effect::apply(&mut state, e)?;
        n += 1;
    }
    assert_sound(&state);
    Ok(n)
}

/// A checkpoint image as found on disk.
pub fn checkpoint_file(bytes: &[u8]) -> Decoded {
    let state = checkpoint::decode(bytes, fake_path(), "fuzz").map_err(|e| e.to_string())?;
    assert_sound(&state);
    Ok(state.collections.len())
}

/// Checkpoint frames with valid checksums (see the module doc).
pub fn checkpoint_reframed(input: &[u8]) -> Decoded {
    checkpoint_file(&reframe(&[], input))
}

/// A manifest file as found on disk; a decoded one must encode back to the
/// same bytes (it has one encoding).
pub fn manifest(bytes: &[u8]) -> Decoded {
    let m = Manifest::decode(fake_path(), bytes).map_err(|e| e.to_string())?;
    let again = m.encode();
    let reread = Manifest::decode(fake_path(), &again).map_err(|e| e.to_string())?;
    assert_eq!(reread.encode(), again, "manifest encoding is not stable");
    Ok(m.pins.len())
}

/// The `wal` fuzz target: the first byte picks the form of the rest
/// (even: a segment file as on disk; odd: reframed record payloads).
pub fn wal_target(data: &[u8]) -> Decoded {
    match data.split_first() {
        Some((m, rest)) if m % 2 == 0 => wal_segment(rest),
        Some((_, rest)) => wal_records_reframed(rest),
        None => Err("empty".into()),
    }
}

/// The `effect` fuzz target: an effect stream.
pub fn effect_target(data: &[u8]) -> Decoded {
    effects(data)
}

/// The `checkpoint` fuzz target: the first byte picks the form of the rest
/// (0 mod 3: a checkpoint file; 1: reframed checkpoint payloads; 2: a manifest).
pub fn checkpoint_target(data: &[u8]) -> Decoded {
    match data.split_first() {
        Some((m, rest)) if m % 3 == 0 => checkpoint_file(rest),
        Some((m, rest)) if m % 3 == 1 => checkpoint_reframed(rest),
        Some((_, rest)) => manifest(rest),
        None => Err("empty".into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn payloads_split_by_length_prefix() {
        assert_eq!(
            payloads(&[2, 0, 7, 8, 1, 0, 9]),
            vec![&[7u8, 8][..], &[9][..]]
        );
        assert_eq!(payloads(&[9, 0, 1]), vec![&[1u8][..]]);
        assert!(payloads(&[1]).is_empty());
    }

    #[test]
    fn garbage_is_an_error_not_a_panic() {
        for input in [&b""[..], b"x", b"DUETWAL\x01\xff\xff\xff\xff", &[0u8; 64]] {
            let _ = wal_segment(input);
            let _ = wal_records_reframed(input);
            let _ = effects(input);
            let _ = checkpoint_file(input);
            let _ = checkpoint_reframed(input);
            let _ = manifest(input);
        }
        assert!(wal_segment(b"nope").is_err());
    }
}
