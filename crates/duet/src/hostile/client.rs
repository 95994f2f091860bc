//! A minimal blocking MongoDB wire client for the hostile soak: OP_MSG
//! commands over a plain `TcpStream`, plus the raw byte access the attacks
//! need (garbage frames, half-sent messages). It trusts nothing it reads:
//! every length is checked before it is used, and every read has a timeout.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

use anyhow::{bail, Context, Result};
use duetdb::bson::Document;

pub const OP_MSG: i32 = 2013;
/// The server's `maxMessageSizeBytes`: a larger reply header is a protocol error.
const MAX_REPLY: usize = 48_000_000;

/// One connection.
pub struct Conn {
    stream: TcpStream,
    next_id: i32,
}

/// What a command got back.
pub enum Reply {
    Ok(Document),
    /// `ok: 0` with its code.
    Err(i32, String),
}

impl Conn {
    pub fn connect(addr: SocketAddr, timeout: Duration) -> Result<Conn> {
        let stream = TcpStream::connect_timeout(&addr, timeout)
            .with_context(|| format!("connect to {addr}"))?;
        stream.set_read_timeout(Some(timeout))?;
        stream.set_write_timeout(Some(timeout))?;
        let _ = stream.set_nodelay(true);
        Ok(Conn { stream, next_id: 1 })
    }

    /// Run `cmd` on database `db` and wait for its reply.
    pub fn run(&mut self, db: &str, mut cmd: Document) -> Result<Reply> {
        cmd.insert("$db", db);
        let mut body = 0u32.to_le_bytes().to_vec();
        body.push(0);
        cmd.to_writer(&mut body).context("encode command")?;
        self.send_frame(OP_MSG, &body)?;
        let reply = self.read_reply()?;
        Ok(classify(reply))
    }

    /// Send one frame with a correct header around `body`.
    pub fn send_frame(&mut self, op: i32, body: &[u8]) -> Result<()> {
        let mut f = Vec::with_capacity(16 + body.len());
        f.extend(((16 + body.len()) as i32).to_le_bytes());
        f.extend(self.next_id.to_le_bytes());
        self.next_id = self.next_id.wrapping_add(1);
        f.extend(0i32.to_le_bytes());
        f.extend(op.to_le_bytes());
        f.extend_from_slice(body);
        self.send_raw(&f)
    }

    pub fn send_raw(&mut self, bytes: &[u8]) -> Result<()> {
        self.stream.write_all(bytes).context("send")
    }

    /// Read one OP_MSG reply's body document.
    pub fn read_reply(&mut self) -> Result<Document> {
        let mut h = [0u8; 16];
        self.stream
            .read_exact(&mut h)
            .context("read reply header")?;
        let len = i32::from_le_bytes([h[0], h[1], h[2], h[3]]);
        let Ok(len) = usize::try_from(len) else {
            bail!("reply length {len} is negative");
        };
        if !(21..=MAX_REPLY).contains(&len) {
            bail!("reply length {len} is outside 21..={MAX_REPLY}");
        }
        let mut body = vec![0u8; len - 16];
        self.stream
            .read_exact(&mut body)
            .context("read reply body")?;
        // flags u32, section kind 0, then the document.
        if body[4] != 0 {
            bail!("reply section kind {} (expected 0)", body[4]);
        }
        Document::from_reader(&body[5..]).context("decode reply")
    }

    /// Whether the server closed the connection (a read sees EOF or an error
    /// other than a timeout within `wait`).
    pub fn closed_within(&mut self, wait: Duration) -> bool {
        let _ = self.stream.set_read_timeout(Some(wait));
        let mut b = [0u8; 1];
        match self.stream.read(&mut b) {
            Ok(0) => true,
            Ok(_) => false,
            Err(e) => !matches!(
                e.kind(),
                std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
            ),
        }
    }
}

fn classify(reply: Document) -> Reply {
    let ok = match reply.get("ok") {
        Some(duetdb::bson::Bson::Double(f)) => *f == 1.0,
        Some(duetdb::bson::Bson::Int32(i)) => *i == 1,
        Some(duetdb::bson::Bson::Int64(i)) => *i == 1,
        _ => false,
    };
    if ok {
        return Reply::Ok(reply);
    }
    let code = match reply.get("code") {
        Some(duetdb::bson::Bson::Int32(c)) => *c,
        Some(duetdb::bson::Bson::Int64(c)) => *c as i32,
        Some(duetdb::bson::Bson::Double(c)) => *c as i32,
        _ => -1,
    };
    let msg = reply.get_str("errmsg").unwrap_or("").to_string();
    Reply::Err(code, msg)
}
