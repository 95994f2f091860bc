//! TLS (rustls, `ring` provider): the `--tls-*` options, loading the
//! certificate, key and client CA from PEM files, and turning an accepted TCP
//! connection into the [`Stream`] the connection code serves.
//!
//! Modes, as MongoDB's `net.tls.mode`:
//! - `disabled`: plain TCP only; nothing is peeked;
//! - `allow` / `prefer`: one port takes both: the first bytes a client sends
//!   decide (a TLS handshake record header — 0x16, 0x03, 0x01..=0x04 —
//!   starts TLS; anything else is served as plain TCP). The two differ in MongoDB only for connections
//!   the server opens itself, which duet never does;
//! - `require`: a client whose first bytes are not a TLS handshake is closed
//!   at once, with a log line (it gets no reply: it would not be able to read
//!   a TLS one, and a plain one would defeat the mode).
//!
//! Invariants:
//! - waiting for the first bytes and the whole handshake are bounded by
//!   `Config::tls_handshake_timeout`: a silent or slow client is closed with
//!   a log line, never held;
//! - with a client CA (`--tls-ca-file`) a client must present a certificate
//!   that chains to it, unless `--tls-allow-connections-without-certificates`
//!   (then a certificate, when presented, must still verify);
//! - nothing secret leaves this module: [`TlsConfig`]'s `Debug` and
//!   [`TlsConfig::summary`] name the mode and the file paths, never a key.

use std::fmt;
use std::io;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::WebPkiClientVerifier;
use rustls::{RootCertStore, ServerConfig};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio_rustls::server::TlsStream;
use tokio_rustls::TlsAcceptor;

/// How long a new connection may take to send its first byte and, for TLS,
/// to complete the handshake (`--tls-handshake-timeout-secs`).
pub const DEFAULT_HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// The first byte of a TLS record carrying a handshake message (ClientHello).
const TLS_HANDSHAKE_RECORD: u8 = 0x16;

/// Whether the client's first bytes are a TLS record header: content type
/// handshake (0x16), version 3.1–3.4 (TLS 1.0–1.3 record layers). A MongoDB
/// message starts with its little-endian length instead; one whose first
/// three bytes read so would be `0x16 + 0x03 << 8 + (1..=4) << 16` bytes
/// long (over 64 KiB), never a driver's opening `hello`.
fn is_tls_record_header(b: [u8; 3]) -> bool {
    b[0] == TLS_HANDSHAKE_RECORD && b[1] == 0x03 && (0x01..=0x04).contains(&b[2])
}

/// Peek the client's first three bytes (without consuming them) and tell
/// whether they start TLS. Bytes arriving one by one are waited for in 5 ms
/// steps (rare: they normally come in one segment); the caller bounds it.
async fn starts_tls(tcp: &TcpStream) -> Result<bool, AcceptError> {
    let mut b = [0u8; 3];
    loop {
        match tcp.peek(&mut b).await {
            Ok(0) | Err(_) => return Err(AcceptError::Closed),
            Ok(n) if n >= b.len() => return Ok(is_tls_record_header(b)),
            Ok(_) if b[0] != TLS_HANDSHAKE_RECORD => return Ok(false),
            Ok(_) => tokio::time::sleep(Duration::from_millis(5)).await,
        }
    }
}

/// `--tls-mode`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum TlsMode {
    Disabled,
    Allow,
    Prefer,
    Require,
}

impl TlsMode {
    /// MongoDB's name of the mode (`getCmdLineOpts`' `net.tls.mode`).
    pub fn mongodb_name(self) -> &'static str {
        match self {
            TlsMode::Disabled => "disabled",
            TlsMode::Allow => "allowTLS",
            TlsMode::Prefer => "preferTLS",
            TlsMode::Require => "requireTLS",
        }
    }
}

/// Where the certificate and keys come from (the `--tls-*` file options).
#[derive(Debug, Clone, Default)]
pub struct TlsFiles {
    /// One PEM holding the certificate chain and the private key.
    pub cert_key_file: Option<PathBuf>,
    /// The certificate chain alone (with `key_file`).
    pub cert_file: Option<PathBuf>,
    pub key_file: Option<PathBuf>,
    /// CA certificates client certificates must chain to.
    pub ca_file: Option<PathBuf>,
    /// With `ca_file`: clients without a certificate are accepted too.
    pub allow_without_certificates: bool,
}

/// Why TLS could not be set up (a startup error: the message names the file).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TlsError {
    #[error("--tls-mode {mode} needs a certificate: --tls-cert-key-file FILE, or --tls-cert-file FILE with --tls-key-file FILE")]
    NoCertificate { mode: &'static str },
    #[error(
        "{option} is given but --tls-mode is disabled: add --tls-mode require (or allow/prefer)"
    )]
    ModeDisabled { option: &'static str },
    #[error("{option} {path}: cannot read: {source}")]
    Read {
        option: &'static str,
        path: PathBuf,
        source: io::Error,
    },
    #[error("{option} {path}: {what}")]
    Content {
        option: &'static str,
        path: PathBuf,
        what: String,
    },
    #[error("the certificate and the private key do not form a usable pair: {0}")]
    Pair(rustls::Error),
    #[error("TLS provider: {0}")]
    Provider(rustls::Error),
    #[error("--tls-ca-file {path}: {what}")]
    Ca { path: PathBuf, what: String },
}

/// A loaded TLS setup: the mode and the acceptor (certificate, key, client
/// verification), shared by every connection.
#[derive(Clone)]
pub struct TlsConfig {
    pub mode: TlsMode,
    acceptor: TlsAcceptor,
    files: TlsFiles,
}

impl fmt::Debug for TlsConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TlsConfig")
            .field("mode", &self.mode)
            .field("files", &self.files)
            .finish_non_exhaustive()
    }
}

impl TlsConfig {
    /// Load the files for `mode`. `Ok(None)` for `disabled` (and no file
    /// option given); errors name the option and the file.
    pub fn load(mode: TlsMode, files: TlsFiles) -> Result<Option<Arc<TlsConfig>>, TlsError> {
        if mode == TlsMode::Disabled {
            let given = [
                ("--tls-cert-key-file", files.cert_key_file.is_some()),
                ("--tls-cert-file", files.cert_file.is_some()),
                ("--tls-key-file", files.key_file.is_some()),
                ("--tls-ca-file", files.ca_file.is_some()),
            ];
            return match given.iter().find(|(_, g)| *g) {
                Some((option, _)) => Err(TlsError::ModeDisabled { option }),
                None => Ok(None),
            };
        }
        let (certs, key) = match (&files.cert_key_file, &files.cert_file, &files.key_file) {
            (Some(both), _, _) => {
                let pem = read("--tls-cert-key-file", both)?;
                (
                    certs_in("--tls-cert-key-file", both, &pem)?,
                    key_in("--tls-cert-key-file", both, &pem)?,
                )
            }
            (None, Some(cert), Some(key)) => (
                certs_in("--tls-cert-file", cert, &read("--tls-cert-file", cert)?)?,
                key_in("--tls-key-file", key, &read("--tls-key-file", key)?)?,
            ),
            _ => {
                return Err(TlsError::NoCertificate {
                    mode: mode.mongodb_name(),
                })
            }
        };
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let builder = ServerConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()
            .map_err(TlsError::Provider)?;
        let builder = match &files.ca_file {
            None => builder.with_no_client_auth(),
            Some(path) => {
                let pem = read("--tls-ca-file", path)?;
                let mut roots = RootCertStore::empty();
                for cert in certs_in("--tls-ca-file", path, &pem)? {
                    roots.add(cert).map_err(|e| TlsError::Ca {
                        path: path.clone(),
                        what: e.to_string(),
                    })?;
                }
                let mut verifier =
                    WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider);
                if files.allow_without_certificates {
                    verifier = verifier.allow_unauthenticated();
                }
                let verifier = verifier.build().map_err(|e| TlsError::Ca {
                    path: path.clone(),
                    what: e.to_string(),
                })?;
                builder.with_client_cert_verifier(verifier)
            }
        };
        let server = builder
            .with_single_cert(certs, key)
            .map_err(TlsError::Pair)?;
        Ok(Some(Arc::new(TlsConfig {
            mode,
            acceptor: TlsAcceptor::from(Arc::new(server)),
            files,
        })))
    }

    /// What `getCmdLineOpts` reports under `parsed.net.tls`: the mode and
    /// file paths as MongoDB names them (no key material).
    pub fn summary(&self) -> bson::Document {
        let mut d = bson::doc! {"mode": self.mode.mongodb_name()};
        let path = |p: &Option<PathBuf>| p.as_ref().map(|p| p.display().to_string());
        if let Some(p) = path(&self.files.cert_key_file) {
            d.insert("certificateKeyFile", p);
        }
        if let Some(p) = path(&self.files.cert_file) {
            d.insert("certificateFile", p);
        }
        if let Some(p) = path(&self.files.key_file) {
            d.insert("privateKeyFile", p);
        }
        if let Some(p) = path(&self.files.ca_file) {
            d.insert("CAFile", p);
        }
        if self.files.allow_without_certificates {
            d.insert("allowConnectionsWithoutCertificates", true);
        }
        d
    }
}

fn read(option: &'static str, path: &Path) -> Result<Vec<u8>, TlsError> {
    std::fs::read(path).map_err(|source| TlsError::Read {
        option,
        path: path.to_path_buf(),
        source,
    })
}

fn certs_in(
    option: &'static str,
    path: &Path,
    pem: &[u8],
) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let content = |what: String| TlsError::Content {
        option,
        path: path.to_path_buf(),
        what,
    };
    let certs = CertificateDer::pem_slice_iter(pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| content(format!("not a valid PEM file: {e}")))?;
    if certs.is_empty() {
        return Err(content(
            "no certificate (-----BEGIN CERTIFICATE-----) in the file".into(),
        ));
    }
    Ok(certs)
}

fn key_in(
    option: &'static str,
    path: &Path,
    pem: &[u8],
) -> Result<PrivateKeyDer<'static>, TlsError> {
    PrivateKeyDer::from_pem_slice(pem).map_err(|e| TlsError::Content {
        option,
        path: path.to_path_buf(),
        what: match e {
            rustls::pki_types::pem::Error::NoItemsFound => {
                "no private key (-----BEGIN PRIVATE KEY-----, RSA or EC) in the file".into()
            }
            e => format!("not a valid PEM file: {e}"),
        },
    })
}

/// A served connection: plain TCP or TLS over TCP. One type, so the
/// connection code has one path for both.
pub enum Stream {
    Plain(TcpStream),
    Tls {
        inner: Box<TlsStream<TcpStream>>,
        /// A byte read ahead by [`Stream::peer_closed`], returned first by
        /// the next read (a TLS stream cannot be peeked).
        stash: Option<u8>,
    },
}

impl Stream {
    pub fn is_tls(&self) -> bool {
        matches!(self, Stream::Tls { .. })
    }

    /// Resolves once the peer has closed the connection (or it broke); pends
    /// forever once the peer has sent more bytes (pipelined messages: they are
    /// read after the command in flight). Cancel-safe: a byte read ahead is
    /// kept for the next read.
    pub async fn peer_closed(&mut self) {
        match self {
            Stream::Plain(s) => {
                let mut b = [0u8; 1];
                match s.peek(&mut b).await {
                    Ok(0) | Err(_) => {}
                    Ok(_) => std::future::pending::<()>().await,
                }
            }
            Stream::Tls { inner, stash } => {
                if stash.is_some() {
                    return std::future::pending::<()>().await;
                }
                let got = std::future::poll_fn(|cx| {
                    let mut b = [0u8; 1];
                    let mut buf = ReadBuf::new(&mut b);
                    match Pin::new(inner.as_mut()).poll_read(cx, &mut buf) {
                        Poll::Ready(Ok(())) => {
                            let byte = buf.filled().first().copied();
                            *stash = byte;
                            Poll::Ready(byte.is_some())
                        }
                        Poll::Ready(Err(_)) => Poll::Ready(false),
                        Poll::Pending => Poll::Pending,
                    }
                })
                .await;
                if got {
                    std::future::pending::<()>().await
                }
            }
        }
    }
}

impl AsyncRead for Stream {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Stream::Plain(s) => Pin::new(s).poll_read(cx, buf),
            Stream::Tls { inner, stash } => {
                if buf.remaining() > 0 {
                    if let Some(b) = stash.take() {
                        buf.put_slice(&[b]);
                        return Poll::Ready(Ok(()));
                    }
                }
                // Drivers close without TLS close_notify; MongoDB messages
                // carry their length, so a truncated one is still caught by
                // the framing: read the missing close_notify as a plain EOF.
                match Pin::new(inner.as_mut()).poll_read(cx, buf) {
                    Poll::Ready(Err(e)) if e.kind() == io::ErrorKind::UnexpectedEof => {
                        Poll::Ready(Ok(()))
                    }
                    other => other,
                }
            }
        }
    }
}

impl AsyncWrite for Stream {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Stream::Plain(s) => Pin::new(s).poll_write(cx, buf),
            Stream::Tls { inner, .. } => Pin::new(inner.as_mut()).poll_write(cx, buf),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Stream::Plain(s) => Pin::new(s).poll_flush(cx),
            Stream::Tls { inner, .. } => Pin::new(inner.as_mut()).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Stream::Plain(s) => Pin::new(s).poll_shutdown(cx),
            Stream::Tls { inner, .. } => Pin::new(inner.as_mut()).poll_shutdown(cx),
        }
    }
}

/// Why a new connection was closed before its first message.
#[derive(Debug, thiserror::Error)]
pub enum AcceptError {
    #[error("the client closed the connection before sending anything")]
    Closed,
    #[error("no TLS handshake within {0:?}")]
    Timeout(Duration),
    #[error("plain (non-TLS) client on a port that requires TLS (--tls-mode require)")]
    PlainOnTlsPort,
    #[error("TLS handshake failed: {0}")]
    Handshake(io::Error),
}

/// Turn an accepted TCP connection into the stream to serve: plain when TLS
/// is off (nothing is awaited), else after peeking the first bytes and, for
/// TLS, the handshake — both within `timeout`.
pub async fn accept(
    tcp: TcpStream,
    tls: Option<&TlsConfig>,
    timeout: Duration,
) -> Result<Stream, AcceptError> {
    let Some(tls) = tls else {
        return Ok(Stream::Plain(tcp));
    };
    let work = async {
        if !starts_tls(&tcp).await? {
            return match tls.mode {
                TlsMode::Require => Err(AcceptError::PlainOnTlsPort),
                _ => Ok(Stream::Plain(tcp)),
            };
        }
        let inner = tls
            .acceptor
            .accept(tcp)
            .await
            .map_err(AcceptError::Handshake)?;
        Ok(Stream::Tls {
            inner: Box::new(inner),
            stash: None,
        })
    };
    match tokio::time::timeout(timeout, work).await {
        Ok(r) => r,
        Err(_) => Err(AcceptError::Timeout(timeout)),
    }
}

/// [`accept`], logging why a connection was closed.
pub async fn accept_logged(
    tcp: TcpStream,
    tls: Option<&TlsConfig>,
    timeout: Duration,
    peer: SocketAddr,
) -> Option<Stream> {
    match accept(tcp, tls, timeout).await {
        Ok(s) => Some(s),
        Err(AcceptError::Closed) => {
            tracing::debug!(peer = %peer, "client closed the connection before sending anything");
            None
        }
        Err(e) => {
            tracing::warn!(peer = %peer, reason = %e, "closing connection");
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::is_tls_record_header;

    #[test]
    fn tls_record_headers_and_mongodb_lengths_are_told_apart() {
        for v in 1..=4u8 {
            assert!(is_tls_record_header([0x16, 0x03, v]));
        }
        assert!(!is_tls_record_header([0x16, 0x03, 0x00]));
        assert!(!is_tls_record_header([0x16, 0x02, 0x01]));
        // Every MongoDB message under 64 KiB, whatever its length.
        for len in 16u32..65536 {
            let b = len.to_le_bytes();
            assert!(!is_tls_record_header([b[0], b[1], b[2]]), "{len}");
        }
    }
}
