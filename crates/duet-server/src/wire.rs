//! Message framing: the 16-byte header every MongoDB wire message starts with,
//! and reading one whole message off a stream within the limits.
//!
//! Invariants:
//! - a frame is never larger than [`MAX_MESSAGE_BYTES`] nor smaller than
//!   [`HEADER_LEN`]; a header that claims otherwise is refused before any body
//!   byte is read;
//! - body memory grows with the bytes actually received (never pre-allocated
//!   from the claimed length), so a peer that claims 48 MB and sends 10 bytes
//!   costs 10 bytes until the message timeout closes it;
//! - once the first byte of a message has arrived, the rest must arrive within
//!   the message timeout; waiting for the first byte has no timeout (pooled
//!   driver connections sit idle for long periods).

use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt};

/// Length of the standard message header.
pub const HEADER_LEN: usize = 16;
/// Largest message accepted or sent (MongoDB's `maxMessageSizeBytes`).
pub const MAX_MESSAGE_BYTES: usize = 48_000_000;

/// Operation codes we know.
pub const OP_REPLY: i32 = 1;
pub const OP_QUERY: i32 = 2004;
pub const OP_COMPRESSED: i32 = 2012;
pub const OP_MSG: i32 = 2013;

/// The standard message header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Header {
    /// Total message length including the header.
    pub message_length: i32,
    pub request_id: i32,
    pub response_to: i32,
    pub op_code: i32,
}

impl Header {
    pub fn parse(b: &[u8; HEADER_LEN]) -> Header {
        let i = |k: usize| i32::from_le_bytes([b[k], b[k + 1], b[k + 2], b[k + 3]]);
        Header {
            message_length: i(0),
            request_id: i(4),
            response_to: i(8),
            op_code: i(12),
        }
    }

    pub fn write(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.message_length.to_le_bytes());
        out.extend_from_slice(&self.request_id.to_le_bytes());
        out.extend_from_slice(&self.response_to.to_le_bytes());
        out.extend_from_slice(&self.op_code.to_le_bytes());
    }
}

/// Why a frame could not be read. Every variant ends the connection.
#[derive(Debug, thiserror::Error)]
pub enum FrameError {
    /// The peer closed the connection between messages (normal).
    #[error("connection closed by peer")]
    Closed,
    #[error("message length {0} is outside 16..=48000000")]
    BadLength(i32),
    #[error("connection closed in the middle of a message ({got} of {want} bytes)")]
    Truncated { got: usize, want: usize },
    #[error("message not completed within {0:?}")]
    Timeout(Duration),
    #[error("i/o error: {0}")]
    Io(#[from] std::io::Error),
}

/// One whole message: its header and the bytes after the header.
#[derive(Debug)]
pub struct Frame {
    pub header: Header,
    pub body: Vec<u8>,
}

/// Read the first byte of the next message; `Ok(None)` on a clean close.
async fn first_byte<R: AsyncRead + Unpin>(r: &mut R) -> Result<Option<u8>, FrameError> {
    let mut b = [0u8; 1];
    match r.read(&mut b).await? {
        0 => Ok(None),
        _ => Ok(Some(b[0])),
    }
}

/// Read one message. Waits indefinitely for its first byte, then at most
/// `timeout` for the rest.
pub async fn read_frame<R: AsyncRead + Unpin>(
    r: &mut R,
    timeout: Duration,
) -> Result<Frame, FrameError> {
    let Some(b0) = first_byte(r).await? else {
        return Err(FrameError::Closed);
    };
    match tokio::time::timeout(timeout, read_rest(r, b0)).await {
        Ok(res) => res,
        Err(_) => Err(FrameError::Timeout(timeout)),
    }
}

async fn read_rest<R: AsyncRead + Unpin>(r: &mut R, b0: u8) -> Result<Frame, FrameError> {
    let mut hb = [0u8; HEADER_LEN];
    hb[0] = b0;
    let mut got = 1;
    while got < HEADER_LEN {
        let n = r.read(&mut hb[got..]).await?;
        if n == 0 {
            return Err(FrameError::Truncated {
                got,
                want: HEADER_LEN,
            });
        }
        got += n;
    }
    let header = Header::parse(&hb);
    let len = header.message_length;
    if len < HEADER_LEN as i32 || len as i64 > MAX_MESSAGE_BYTES as i64 {
        return Err(FrameError::BadLength(len));
    }
    let want = len as usize - HEADER_LEN;
    let mut body = Vec::with_capacity(want.min(64 * 1024));
    let read = (&mut *r).take(want as u64).read_to_end(&mut body).await?;
    if read < want {
        return Err(FrameError::Truncated {
            got: HEADER_LEN + read,
            want: len as usize,
        });
    }
    Ok(Frame { header, body })
}

/// Frame `payload` (everything after the header) as a reply.
pub fn frame_reply(request_id: i32, response_to: i32, op_code: i32, payload: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(HEADER_LEN + payload.len());
    let total = (HEADER_LEN + payload.len()).min(i32::MAX as usize) as i32;
    Header {
        message_length: total,
        request_id,
        response_to,
        op_code,
    }
    .write(&mut out);
    out.extend_from_slice(payload);
    out
}

/// Reads a little-endian i32 at `at`, if the slice is long enough.
pub fn le_i32(b: &[u8], at: usize) -> Option<i32> {
    let s = b.get(at..at.checked_add(4)?)?;
    Some(i32::from_le_bytes([s[0], s[1], s[2], s[3]]))
}

/// Reads a NUL-terminated UTF-8 string at `at`; returns it and the offset after the NUL.
pub fn cstring(b: &[u8], at: usize) -> Option<(&str, usize)> {
    let rest = b.get(at..)?;
    let nul = rest.iter().position(|&c| c == 0)?;
    let s = std::str::from_utf8(&rest[..nul]).ok()?;
    Some((s, at + nul + 1))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn reads_a_frame_and_refuses_bad_lengths() {
        let msg = frame_reply(7, 0, OP_MSG, b"abcd");
        let mut r = &msg[..];
        let f = read_frame(&mut r, Duration::from_secs(1))
            .await
            .expect("frame");
        assert_eq!(f.header.request_id, 7);
        assert_eq!(f.body, b"abcd");

        let mut bad = frame_reply(1, 0, OP_MSG, b"");
        bad[0..4].copy_from_slice(&15i32.to_le_bytes());
        let mut r = &bad[..];
        assert!(matches!(
            read_frame(&mut r, Duration::from_secs(1)).await,
            Err(FrameError::BadLength(15))
        ));
        let mut big = frame_reply(1, 0, OP_MSG, b"");
        big[0..4].copy_from_slice(&48_000_001i32.to_le_bytes());
        let mut r = &big[..];
        assert!(matches!(
            read_frame(&mut r, Duration::from_secs(1)).await,
            Err(FrameError::BadLength(_))
        ));
        let mut r = &msg[..10];
        assert!(matches!(
            read_frame(&mut r, Duration::from_secs(1)).await,
            Err(FrameError::Truncated { .. })
        ));
        let mut r: &[u8] = &[];
        assert!(matches!(
            read_frame(&mut r, Duration::from_secs(1)).await,
            Err(FrameError::Closed)
        ));
    }

    #[test]
    fn cstrings_and_ints_are_bounds_checked() {
        assert_eq!(cstring(b"ab\0c", 0), Some(("ab", 3)));
        assert_eq!(cstring(b"ab", 0), None);
        assert_eq!(cstring(b"ab", 9), None);
        assert_eq!(le_i32(&[1, 0, 0], 0), None);
        assert_eq!(le_i32(&[1, 0, 0, 0], 0), Some(1));
    }
}
