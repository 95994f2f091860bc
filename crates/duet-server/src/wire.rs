//! Message framing: the 16-byte header every MongoDB wire message starts with,
//! and reading one whole message off a stream within the limits.
//!
//! Invariants:
//! - a frame is never larger than [`MAX_MESSAGE_BYTES`] nor smaller than
//!   [`HEADER_LEN`]; a header that claims otherwise is refused before any body
//!   byte is read;
//! - body memory grows with the bytes actually received: a body past 64 KiB
//!   is an anonymous mapping of the claimed length whose pages become memory
//!   only as bytes arrive (a peer that claims 48 MB and sends 10 bytes costs
//!   one page until the message timeout closes it), and which is unmapped —
//!   returned to the OS, not to the allocator — when the message is dropped
//!   or its connection ends;
//! - bytes of messages still arriving are charged, 1 MiB ahead at most, to
//!   one server-wide [`MessageBudget`] (each message's first 64 KiB free) and
//!   released when the message is complete; a message that would pass the
//!   budget closes its connection (it does not wait: waiting partial
//!   messages could hold the budget against each other);
//! - waiting for the first byte of a message is bounded by the idle timeout
//!   (pooled driver connections sit idle, but not for ever); once it has
//!   arrived, the rest must arrive within the message timeout.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt};

/// Length of the standard message header.
pub const HEADER_LEN: usize = 16;
/// Largest message accepted or sent (MongoDB's `maxMessageSizeBytes`).
pub const MAX_MESSAGE_BYTES: usize = 48_000_000;
/// Deepest nesting accepted in a message's command (MongoDB's `maxBSONDepth`
/// for incoming BSON), whichever section carries a document. Stored
/// documents are held to the engine's 100 levels where they are stored, so
/// a document may be sent in a body or a sequence alike.
pub const MAX_MESSAGE_DEPTH: usize = 200;
/// Bytes of each message not charged to the [`MessageBudget`].
pub const UNCHARGED_MESSAGE_BYTES: usize = 64 * 1024;
/// A large message's charge grows by this much at a time, ahead of the bytes
/// its next reads may bring.
const CHARGE_STEP_BYTES: usize = 1024 * 1024;

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
        out.extend_from_slice(&self.bytes());
    }

    pub fn bytes(&self) -> [u8; HEADER_LEN] {
        let mut b = [0u8; HEADER_LEN];
        b[..4].copy_from_slice(&self.message_length.to_le_bytes());
        b[4..8].copy_from_slice(&self.request_id.to_le_bytes());
        b[8..12].copy_from_slice(&self.response_to.to_le_bytes());
        b[12..].copy_from_slice(&self.op_code.to_le_bytes());
        b
    }
}

/// Why a frame could not be read. Every variant ends the connection.
#[derive(Debug, thiserror::Error)]
pub enum FrameError {
    /// The peer closed the connection between messages (normal).
    #[error("connection closed by peer")]
    Closed,
    /// No message started within the idle timeout.
    #[error("idle for {0:?} with no message (--idle-timeout-secs)")]
    Idle(Duration),
    #[error("message length {0} is outside 16..=48000000")]
    BadLength(i32),
    #[error("connection closed in the middle of a message ({got} of {want} bytes)")]
    Truncated { got: usize, want: usize },
    #[error("message not completed within {0:?}")]
    Timeout(Duration),
    /// Receiving the rest of this message would pass the server's budget of
    /// bytes held by incomplete messages.
    #[error(
        "a {want}-byte message would pass the limit of {limit} bytes held by incomplete \
         messages across connections (--max-incomplete-message-mb)"
    )]
    OverBudget { want: usize, limit: usize },
    #[error("i/o error: {0}")]
    Io(#[from] std::io::Error),
}

/// One whole message: its header and the bytes after the header.
#[derive(Debug)]
pub struct Frame {
    pub header: Header,
    pub body: Body,
}

/// How long a connection may wait.
#[derive(Debug, Clone, Copy)]
pub struct Timeouts {
    /// For the first byte of the next message.
    pub idle: Duration,
    /// For the rest of a message once its first byte arrived.
    pub message: Duration,
}

/// The server-wide budget of bytes held by messages still arriving. Each
/// message's first [`UNCHARGED_MESSAGE_BYTES`] are free (ordinary commands
/// never touch the budget; with at most `max_connections` connections they
/// are bounded anyway); the rest is charged as its buffers are allocated and
/// released when the message is complete or its connection ends.
#[derive(Debug)]
pub struct MessageBudget {
    used: AtomicUsize,
    limit: usize,
}

impl MessageBudget {
    pub fn new(limit: usize) -> MessageBudget {
        MessageBudget {
            used: AtomicUsize::new(0),
            limit,
        }
    }

    /// Bytes charged now.
    pub fn used(&self) -> usize {
        self.used.load(Ordering::Relaxed)
    }

    pub fn limit(&self) -> usize {
        self.limit
    }

    fn try_charge(&self, n: usize) -> bool {
        self.used
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |u| {
                u.checked_add(n).filter(|t| *t <= self.limit)
            })
            .is_ok()
    }

    fn release(&self, n: usize) {
        self.used.fetch_sub(n, Ordering::AcqRel);
    }
}

/// Bytes of one message charged to a [`MessageBudget`]; released on drop.
struct Charge<'a> {
    budget: &'a MessageBudget,
    bytes: usize,
}

impl Charge<'_> {
    /// Charge up to `allocated` bytes of buffers in total for this message.
    fn grow_to(&mut self, allocated: usize, want: usize) -> Result<(), FrameError> {
        let due = allocated.saturating_sub(UNCHARGED_MESSAGE_BYTES);
        if due > self.bytes {
            if !self.budget.try_charge(due - self.bytes) {
                return Err(FrameError::OverBudget {
                    want,
                    limit: self.budget.limit,
                });
            }
            self.bytes = due;
        }
        Ok(())
    }
}

impl Drop for Charge<'_> {
    fn drop(&mut self) {
        self.budget.release(self.bytes);
    }
}

/// Read the first byte of the next message; `Ok(None)` on a clean close.
async fn first_byte<R: AsyncRead + Unpin>(r: &mut R) -> Result<Option<u8>, FrameError> {
    let mut b = [0u8; 1];
    match r.read(&mut b).await? {
        0 => Ok(None),
        _ => Ok(Some(b[0])),
    }
}

/// Read one message: at most `t.idle` for its first byte, then at most
/// `t.message` for the rest, its buffers charged to `budget`.
pub async fn read_frame<R: AsyncRead + Unpin>(
    r: &mut R,
    t: Timeouts,
    budget: &MessageBudget,
) -> Result<Frame, FrameError> {
    let b0 = match tokio::time::timeout(t.idle, first_byte(r)).await {
        Ok(Ok(Some(b))) => b,
        Ok(Ok(None)) => return Err(FrameError::Closed),
        Ok(Err(e)) => return Err(e),
        Err(_) => return Err(FrameError::Idle(t.idle)),
    };
    match tokio::time::timeout(t.message, read_rest(r, b0, budget)).await {
        Ok(res) => res,
        Err(_) => Err(FrameError::Timeout(t.message)),
    }
}

async fn read_rest<R: AsyncRead + Unpin>(
    r: &mut R,
    b0: u8,
    budget: &MessageBudget,
) -> Result<Frame, FrameError> {
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
    let mut body = Body::for_length(want)?;
    let mut charge = Charge { budget, bytes: 0 };
    let mut received = 0usize;
    while received < want {
        // Charge ahead of what the next read may fill, one step at a time.
        let step_end = (received + CHARGE_STEP_BYTES).min(want);
        charge.grow_to(step_end, len as usize)?;
        let buf = body.as_mut_slice();
        while received < step_end {
            let n = r.read(&mut buf[received..step_end]).await?;
            if n == 0 {
                return Err(FrameError::Truncated {
                    got: HEADER_LEN + received,
                    want: len as usize,
                });
            }
            received += n;
        }
    }
    Ok(Frame { header, body })
}

/// A message body. Small ones live on the heap; larger ones in an anonymous
/// mapping of the claimed length — address space only: a page becomes
/// memory when bytes arrive in it — which is unmapped when the body is
/// dropped, so the memory goes back to the OS at once, whatever the
/// allocator would keep (measured: mimalloc kept 8 × 20 MB of freed
/// half-received bodies resident after their connections closed).
pub enum Body {
    Heap(Vec<u8>),
    Mapped(memmap2::MmapMut),
}

impl Body {
    pub(crate) fn for_length(want: usize) -> Result<Body, FrameError> {
        if want <= UNCHARGED_MESSAGE_BYTES {
            return Ok(Body::Heap(vec![0u8; want]));
        }
        Ok(Body::Mapped(memmap2::MmapMut::map_anon(want)?))
    }

    pub(crate) fn as_mut_slice(&mut self) -> &mut [u8] {
        match self {
            Body::Heap(v) => v,
            Body::Mapped(m) => m,
        }
    }
}

impl std::ops::Deref for Body {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        match self {
            Body::Heap(v) => v,
            Body::Mapped(m) => m,
        }
    }
}

impl std::fmt::Debug for Body {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Body({} bytes)", self.len())
    }
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

    fn t() -> Timeouts {
        Timeouts {
            idle: Duration::from_secs(1),
            message: Duration::from_secs(1),
        }
    }

    async fn read_frame_t<R: AsyncRead + Unpin>(r: &mut R) -> Result<Frame, FrameError> {
        let budget = MessageBudget::new(usize::MAX);
        read_frame(r, t(), &budget).await
    }

    #[tokio::test]
    async fn large_messages_are_charged_while_they_arrive() {
        let payload = vec![7u8; 3 * CHARGE_STEP_BYTES + 5];
        let msg = frame_reply(1, 0, OP_MSG, &payload);
        let budget = MessageBudget::new(4 * CHARGE_STEP_BYTES);
        let mut r = &msg[..];
        let f = read_frame(&mut r, t(), &budget).await.expect("fits");
        assert_eq!(&f.body[..], &payload[..]);
        assert_eq!(budget.used(), 0, "released once complete");
        // Over the budget: refused, and nothing stays charged.
        let small = MessageBudget::new(CHARGE_STEP_BYTES / 2);
        let mut r = &msg[..];
        assert!(matches!(
            read_frame(&mut r, t(), &small).await,
            Err(FrameError::OverBudget { .. })
        ));
        assert_eq!(small.used(), 0);
        // Messages within the uncharged prefix never touch it.
        let none = MessageBudget::new(0);
        let msg = frame_reply(1, 0, OP_MSG, &vec![1u8; UNCHARGED_MESSAGE_BYTES - 16]);
        let mut r = &msg[..];
        assert!(read_frame(&mut r, t(), &none).await.is_ok());
        // A truncated large message releases its charge too.
        let msg = frame_reply(1, 0, OP_MSG, &payload);
        let mut r = &msg[..2 * CHARGE_STEP_BYTES];
        assert!(matches!(
            read_frame(&mut r, t(), &budget).await,
            Err(FrameError::Truncated { .. })
        ));
        assert_eq!(budget.used(), 0);
    }

    #[tokio::test]
    async fn reads_a_frame_and_refuses_bad_lengths() {
        let msg = frame_reply(7, 0, OP_MSG, b"abcd");
        let mut r = &msg[..];
        let f = read_frame_t(&mut r).await.expect("frame");
        assert_eq!(f.header.request_id, 7);
        assert_eq!(&f.body[..], b"abcd");

        let mut bad = frame_reply(1, 0, OP_MSG, b"");
        bad[0..4].copy_from_slice(&15i32.to_le_bytes());
        let mut r = &bad[..];
        assert!(matches!(
            read_frame_t(&mut r).await,
            Err(FrameError::BadLength(15))
        ));
        let mut big = frame_reply(1, 0, OP_MSG, b"");
        big[0..4].copy_from_slice(&48_000_001i32.to_le_bytes());
        let mut r = &big[..];
        assert!(matches!(
            read_frame_t(&mut r).await,
            Err(FrameError::BadLength(_))
        ));
        let mut r = &msg[..10];
        assert!(matches!(
            read_frame_t(&mut r).await,
            Err(FrameError::Truncated { .. })
        ));
        let mut r: &[u8] = &[];
        assert!(matches!(
            read_frame_t(&mut r).await,
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
