//! Wire compression (`OP_COMPRESSED`, opcode 2012) as the drivers' "Wire
//! Compression" specification describes it: the compressors a server offers
//! (`--network-message-compressors`), their negotiation in `hello`, and
//! unwrapping and wrapping messages with snappy, zlib and zstd.
//!
//! Layout after the header: `originalOpcode: i32`, `uncompressedSize: i32`
//! (the wrapped message without its header), `compressorId: u8`, then the
//! compressed bytes.
//!
//! Invariants:
//! - a compressed message is accepted only with a compressor this server
//!   offers; its declared size must be within 0..=`MAX_MESSAGE_BYTES - 16`
//!   and the decompressed bytes must be exactly that many: decompression
//!   writes into a buffer of the declared size and never past it (a bomb
//!   stops at the declared size and is refused), and that buffer's memory
//!   grows with the bytes actually produced (`wire::Body`: a large one is
//!   an anonymous mapping whose pages become memory only when written);
//! - every failure is a [`CompressionError`] (the connection then closes,
//!   as mongod does), never a panic;
//! - a reply is compressed only when its request was, with the request's
//!   compressor, and never for the commands the specification keeps
//!   uncompressed (handshake and authentication: [`must_not_compress`]);
//!   a reply that compression would not shrink below the message limit is
//!   sent uncompressed.

use std::io::Read;

use bson::{Bson, Document};

use crate::wire::{self, Body, Frame, Header, HEADER_LEN, MAX_MESSAGE_BYTES, OP_COMPRESSED};

/// `--network-message-compressors`' default (mongod's).
pub const DEFAULT_COMPRESSORS: &str = "snappy,zstd,zlib";

/// Bytes of an `OP_COMPRESSED` body before the compressed message.
const PREFIX_LEN: usize = 9;

/// A compressor, by its wire id.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Compressor {
    /// Id 0: the message is not compressed (for tests; offered only when
    /// named in the flag).
    Noop,
    Snappy,
    Zlib,
    Zstd,
}

impl Compressor {
    pub fn id(self) -> u8 {
        match self {
            Compressor::Noop => 0,
            Compressor::Snappy => 1,
            Compressor::Zlib => 2,
            Compressor::Zstd => 3,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Compressor::Noop => "noop",
            Compressor::Snappy => "snappy",
            Compressor::Zlib => "zlib",
            Compressor::Zstd => "zstd",
        }
    }

    pub fn from_id(id: u8) -> Option<Compressor> {
        [
            Compressor::Noop,
            Compressor::Snappy,
            Compressor::Zlib,
            Compressor::Zstd,
        ]
        .into_iter()
        .find(|c| c.id() == id)
    }

    pub fn from_name(name: &str) -> Option<Compressor> {
        [
            Compressor::Noop,
            Compressor::Snappy,
            Compressor::Zlib,
            Compressor::Zstd,
        ]
        .into_iter()
        .find(|c| c.name() == name)
    }
}

/// The compressors `--network-message-compressors` names, in its order:
/// a comma-separated list, or `disabled` for none.
pub fn parse_list(s: &str) -> Result<Vec<Compressor>, String> {
    let s = s.trim();
    if s == "disabled" || s.is_empty() {
        return Ok(Vec::new());
    }
    let mut out = Vec::new();
    for name in s.split(',').map(str::trim) {
        let c = Compressor::from_name(name).ok_or_else(|| {
            format!(
                "--network-message-compressors: unknown compressor '{name}' \
                 (snappy, zstd, zlib, noop, or disabled)"
            )
        })?;
        if !out.contains(&c) {
            out.push(c);
        }
    }
    Ok(out)
}

/// The `compression` field of a `hello` reply: the compressors of the
/// client's list (`cmd.compression`) this server offers, in the client's
/// order; `None` when there are none in common (the field is then left out)
/// or the client sent none. A list that is not an array of strings is
/// BadValue, as mongod answers.
pub fn negotiate(
    offered: &[Compressor],
    cmd: &Document,
) -> Result<Option<Vec<Bson>>, crate::error::CommandError> {
    let list = match cmd.get("compression") {
        None => return Ok(None),
        Some(Bson::Array(a)) => a,
        Some(other) => {
            return Err(crate::error::CommandError::bad_value(format!(
                "'compression' is not an array: {other}"
            )))
        }
    };
    let mut out: Vec<Bson> = Vec::new();
    for v in list {
        let Bson::String(name) = v else {
            return Err(crate::error::CommandError::bad_value(format!(
                "'compression' element is not a string: {v}"
            )));
        };
        if let Some(c) = Compressor::from_name(name) {
            let b = Bson::String(c.name().to_string());
            if offered.contains(&c) && !out.contains(&b) {
                out.push(b);
            }
        }
    }
    Ok((!out.is_empty()).then_some(out))
}

/// Commands whose messages are never compressed (the specification's list:
/// the handshake and authentication ones).
pub fn must_not_compress(command: &str) -> bool {
    matches!(
        command,
        "hello"
            | "isMaster"
            | "ismaster"
            | "saslStart"
            | "saslContinue"
            | "getnonce"
            | "authenticate"
            | "createUser"
            | "updateUser"
            | "copydbSaslStart"
            | "copydbgetnonce"
            | "copydb"
    )
}

/// Why an `OP_COMPRESSED` message was refused. Every variant closes the
/// connection.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum CompressionError {
    #[error("OP_COMPRESSED body of {0} bytes is shorter than its 9-byte prefix")]
    TooShort(usize),
    #[error(
        "OP_COMPRESSED declares an uncompressed size of {0} bytes, outside 0..={max}",
        max = MAX_MESSAGE_BYTES - HEADER_LEN
    )]
    BadSize(i32),
    #[error("OP_COMPRESSED wraps another OP_COMPRESSED")]
    Nested,
    #[error("OP_COMPRESSED uses unknown compressor id {0}")]
    UnknownCompressor(u8),
    #[error(
        "OP_COMPRESSED uses compressor {0}, which this server does not offer \
         (--network-message-compressors)"
    )]
    NotOffered(&'static str),
    #[error("{compressor} decompression failed: {message}")]
    Corrupt {
        compressor: &'static str,
        message: String,
    },
    #[error(
        "{compressor} decompressed to {}{actual} bytes, but the message declares {declared}",
        if *.more { "more than " } else { "" }
    )]
    SizeMismatch {
        compressor: &'static str,
        declared: usize,
        actual: usize,
        /// The stream had more bytes than declared (a bomb stops here).
        more: bool,
    },
    #[error("i/o error while decompressing: {0}")]
    Io(String),
}

/// Unwrap an `OP_COMPRESSED` frame: the wrapped message (its header the
/// original opcode and the decompressed length) and the compressor used.
pub fn decompress(
    frame: &Frame,
    offered: &[Compressor],
) -> Result<(Frame, Compressor), CompressionError> {
    let body: &[u8] = &frame.body;
    if body.len() < PREFIX_LEN {
        return Err(CompressionError::TooShort(body.len()));
    }
    let original = wire::le_i32(body, 0).ok_or(CompressionError::TooShort(body.len()))?;
    let declared = wire::le_i32(body, 4).ok_or(CompressionError::TooShort(body.len()))?;
    let id = body[8];
    if declared < 0 || declared as usize > MAX_MESSAGE_BYTES - HEADER_LEN {
        return Err(CompressionError::BadSize(declared));
    }
    if original == OP_COMPRESSED {
        return Err(CompressionError::Nested);
    }
    let c = Compressor::from_id(id).ok_or(CompressionError::UnknownCompressor(id))?;
    if !offered.contains(&c) {
        return Err(CompressionError::NotOffered(c.name()));
    }
    let declared = declared as usize;
    let input = &body[PREFIX_LEN..];
    let mut out = Body::for_length(declared).map_err(|e| CompressionError::Io(e.to_string()))?;
    let produced = decompress_into(c, input, out.as_mut_slice())?;
    if produced != declared {
        return Err(CompressionError::SizeMismatch {
            compressor: c.name(),
            declared,
            actual: produced,
            more: false,
        });
    }
    let header = Header {
        message_length: (HEADER_LEN + declared) as i32,
        request_id: frame.header.request_id,
        response_to: frame.header.response_to,
        op_code: original,
    };
    Ok((Frame { header, body: out }, c))
}

/// Decompress `input` into `out`, never writing past it; the number of
/// bytes produced. More bytes than `out` holds is a size mismatch.
fn decompress_into(c: Compressor, input: &[u8], out: &mut [u8]) -> Result<usize, CompressionError> {
    let corrupt = |message: String| CompressionError::Corrupt {
        compressor: c.name(),
        message,
    };
    let declared = out.len();
    let too_many = move |actual: usize| CompressionError::SizeMismatch {
        compressor: c.name(),
        declared,
        actual,
        more: true,
    };
    match c {
        Compressor::Noop => {
            if input.len() > out.len() {
                return Err(too_many(input.len()));
            }
            out[..input.len()].copy_from_slice(input);
            Ok(input.len())
        }
        Compressor::Snappy => {
            // The raw format starts with its own length: check it before
            // decoding, so a bomb costs nothing.
            let n = snap::raw::decompress_len(input).map_err(|e| corrupt(e.to_string()))?;
            if n != declared {
                return Err(CompressionError::SizeMismatch {
                    compressor: c.name(),
                    declared,
                    actual: n,
                    more: n > declared,
                });
            }
            snap::raw::Decoder::new()
                .decompress(input, out)
                .map_err(|e| corrupt(e.to_string()))
        }
        Compressor::Zstd => {
            // Decompressing into a flat buffer needs no window buffer, and
            // stops with an error at the buffer's end.
            let mut d =
                zstd::bulk::Decompressor::new().map_err(|e| CompressionError::Io(e.to_string()))?;
            d.decompress_to_buffer(input, out).map_err(|e| {
                let m = e.to_string();
                if m.contains("too small") {
                    too_many(declared)
                } else {
                    corrupt(m)
                }
            })
        }
        Compressor::Zlib => {
            let mut r = flate2::read::ZlibDecoder::new(input);
            let mut got = 0;
            while got < out.len() {
                match r.read(&mut out[got..]) {
                    Ok(0) => break,
                    Ok(n) => got += n,
                    Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                    Err(e) => return Err(corrupt(e.to_string())),
                }
            }
            let mut extra = [0u8; 1];
            match r.read(&mut extra) {
                Ok(0) => Ok(got),
                Ok(_) => Err(too_many(got)),
                Err(e) => Err(corrupt(e.to_string())),
            }
        }
    }
}

/// The whole `OP_COMPRESSED` message wrapping a reply (`payload`: the reply
/// after its header, of opcode `op_code`); `None` when the compressed
/// message would not fit in one message (send it uncompressed then).
pub fn frame_compressed(
    c: Compressor,
    request_id: i32,
    response_to: i32,
    op_code: i32,
    payload: &[u8],
) -> Option<Vec<u8>> {
    let compressed = compress(c, payload)?;
    let total = HEADER_LEN + PREFIX_LEN + compressed.len();
    if total > MAX_MESSAGE_BYTES {
        return None;
    }
    let mut out = Vec::with_capacity(total);
    Header {
        message_length: total as i32,
        request_id,
        response_to,
        op_code: OP_COMPRESSED,
    }
    .write(&mut out);
    out.extend_from_slice(&op_code.to_le_bytes());
    out.extend_from_slice(&(payload.len() as i32).to_le_bytes());
    out.push(c.id());
    out.extend_from_slice(&compressed);
    Some(out)
}

/// `payload` compressed with `c`; `None` if the compressor failed (it only
/// can on allocation failure or an input past its limits).
pub fn compress(c: Compressor, payload: &[u8]) -> Option<Vec<u8>> {
    match c {
        Compressor::Noop => Some(payload.to_vec()),
        Compressor::Snappy => snap::raw::Encoder::new().compress_vec(payload).ok(),
        Compressor::Zstd => zstd::bulk::compress(payload, zstd::DEFAULT_COMPRESSION_LEVEL).ok(),
        Compressor::Zlib => {
            use std::io::Write;
            let mut e = flate2::write::ZlibEncoder::new(
                Vec::with_capacity(payload.len() / 2 + 64),
                flate2::Compression::default(),
            );
            e.write_all(payload).ok()?;
            e.finish().ok()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::{frame_reply, OP_MSG};

    const ALL: [Compressor; 4] = [
        Compressor::Noop,
        Compressor::Snappy,
        Compressor::Zlib,
        Compressor::Zstd,
    ];

    /// Parse a whole message (header included) into a frame.
    fn frame_of(msg: &[u8]) -> Frame {
        let mut hb = [0u8; HEADER_LEN];
        hb.copy_from_slice(&msg[..HEADER_LEN]);
        Frame {
            header: Header::parse(&hb),
            body: Body::Heap(msg[HEADER_LEN..].to_vec()),
        }
    }

    /// An OP_COMPRESSED message with the given prefix fields and bytes.
    fn raw(original: i32, declared: i32, id: u8, data: &[u8]) -> Frame {
        let mut body = Vec::new();
        body.extend_from_slice(&original.to_le_bytes());
        body.extend_from_slice(&declared.to_le_bytes());
        body.push(id);
        body.extend_from_slice(data);
        frame_of(&frame_reply(5, 0, OP_COMPRESSED, &body))
    }

    #[test]
    fn round_trips_with_every_compressor() {
        let small = b"\x00\x00\x00\x00\x00hello".to_vec();
        let large: Vec<u8> = (0..300_000u32).map(|i| (i % 251) as u8).collect();
        for c in ALL {
            for payload in [&small, &large] {
                let msg = frame_compressed(c, 9, 4, OP_MSG, payload).expect("compresses");
                let f = frame_of(&msg);
                assert_eq!(f.header.op_code, OP_COMPRESSED);
                assert_eq!(f.header.message_length as usize, msg.len());
                let (inner, used) = decompress(&f, &ALL).expect("decompresses");
                assert_eq!(used, c);
                assert_eq!(inner.header.op_code, OP_MSG);
                assert_eq!(inner.header.request_id, 9);
                assert_eq!(inner.header.response_to, 4);
                assert_eq!(
                    inner.header.message_length as usize,
                    HEADER_LEN + payload.len()
                );
                assert_eq!(&inner.body[..], &payload[..], "{c:?}");
            }
        }
    }

    #[test]
    fn refuses_compressors_not_offered_and_unknown_ids() {
        let msg = frame_compressed(Compressor::Zstd, 1, 0, OP_MSG, b"abc").expect("zstd");
        assert_eq!(
            decompress(&frame_of(&msg), &[Compressor::Snappy]).err(),
            Some(CompressionError::NotOffered("zstd"))
        );
        assert_eq!(
            decompress(&raw(OP_MSG, 3, 9, b"abc"), &ALL).err(),
            Some(CompressionError::UnknownCompressor(9))
        );
        assert_eq!(
            decompress(&raw(OP_COMPRESSED, 3, 0, b"abc"), &ALL).err(),
            Some(CompressionError::Nested)
        );
        let short = frame_of(&frame_reply(1, 0, OP_COMPRESSED, &[1, 2, 3]));
        assert_eq!(
            decompress(&short, &ALL).err(),
            Some(CompressionError::TooShort(3))
        );
    }

    #[test]
    fn refuses_sizes_outside_the_message_limit() {
        for bad in [-1, (MAX_MESSAGE_BYTES - HEADER_LEN + 1) as i32, i32::MAX] {
            assert_eq!(
                decompress(&raw(OP_MSG, bad, 1, b"abc"), &ALL).err(),
                Some(CompressionError::BadSize(bad))
            );
        }
    }

    #[test]
    fn refuses_sizes_that_do_not_match() {
        let payload = vec![42u8; 10_000];
        for c in ALL {
            let data = compress(c, &payload).expect("compresses");
            // Declared smaller than the data: decompression stops there.
            let e = decompress(&raw(OP_MSG, 100, c.id(), &data), &ALL).expect_err("refused");
            assert!(
                matches!(e, CompressionError::SizeMismatch { declared: 100, .. }),
                "{c:?}: {e}"
            );
            // Declared larger: the data runs out first.
            let e = decompress(&raw(OP_MSG, 20_000, c.id(), &data), &ALL).expect_err("refused");
            assert!(
                matches!(
                    e,
                    CompressionError::SizeMismatch {
                        declared: 20_000,
                        ..
                    }
                ),
                "{c:?}: {e}"
            );
        }
    }

    #[test]
    fn a_bomb_stops_at_the_declared_size() {
        // 8 MB of zeros compress to a few KiB; declared as 1 KiB, nothing
        // beyond that is ever produced.
        let zeros = vec![0u8; 8_000_000];
        for c in [Compressor::Snappy, Compressor::Zlib, Compressor::Zstd] {
            let data = compress(c, &zeros).expect("compresses");
            assert!(data.len() < 2_000_000, "{c:?}: {}", data.len());
            let e = decompress(&raw(OP_MSG, 1024, c.id(), &data), &ALL).expect_err("refused");
            assert!(
                matches!(
                    e,
                    CompressionError::SizeMismatch {
                        declared: 1024,
                        more: true,
                        ..
                    }
                ),
                "{c:?}: {e}"
            );
        }
    }

    #[test]
    fn garbage_is_an_error_not_a_panic() {
        let junk: Vec<u8> = (0..200u32).map(|i| (i * 37 % 256) as u8).collect();
        for c in ALL {
            for n in [0, 1, 7, 200] {
                let r = decompress(&raw(OP_MSG, 64, c.id(), &junk[..n]), &ALL);
                assert!(r.is_err(), "{c:?} with {n} junk bytes");
            }
        }
    }

    #[test]
    fn negotiation_keeps_the_clients_order() {
        let offered = parse_list(DEFAULT_COMPRESSORS).expect("default");
        let cmd = bson::doc! {"hello": 1, "compression": ["zlib", "lz4", "snappy"]};
        assert_eq!(
            negotiate(&offered, &cmd).expect("ok"),
            Some(vec![Bson::from("zlib"), Bson::from("snappy")])
        );
        let none = bson::doc! {"hello": 1, "compression": ["lz4"]};
        assert_eq!(negotiate(&offered, &none).expect("ok"), None);
        assert_eq!(negotiate(&[], &cmd).expect("ok"), None);
        assert_eq!(
            negotiate(&offered, &bson::doc! {"hello": 1}).expect("ok"),
            None
        );
        let bad = bson::doc! {"hello": 1, "compression": "zlib"};
        assert_eq!(negotiate(&offered, &bad).expect_err("refused").code, 2);
        let bad = bson::doc! {"hello": 1, "compression": [1]};
        assert_eq!(negotiate(&offered, &bad).expect_err("refused").code, 2);
    }

    #[test]
    fn parses_the_flag() {
        assert_eq!(
            parse_list("snappy,zstd,zlib").expect("ok"),
            vec![Compressor::Snappy, Compressor::Zstd, Compressor::Zlib]
        );
        assert_eq!(parse_list("disabled").expect("ok"), vec![]);
        assert_eq!(
            parse_list(" zlib , zlib").expect("ok"),
            vec![Compressor::Zlib]
        );
        assert!(parse_list("lz4").is_err());
    }

    #[test]
    fn handshake_and_authentication_stay_uncompressed() {
        for name in [
            "hello",
            "isMaster",
            "ismaster",
            "saslStart",
            "saslContinue",
            "createUser",
        ] {
            assert!(must_not_compress(name), "{name}");
        }
        assert!(!must_not_compress("find"));
    }
}
