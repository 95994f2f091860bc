//! TLS (issue #15 item 5) with the official MongoDB Rust driver: a CA, server
//! and client certificates generated here with rcgen; `--tls-mode require`
//! with SCRAM over TLS, allow mode serving plain and TLS clients on one
//! port, client certificates against `--tls-ca-file`, an untrusted CA and an
//! expired certificate refused, plain or silent clients on a TLS port
//! closed; and the startup errors of `TlsConfig::load` for bad files.

mod common;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use common::TestServer;
use duet_server::tls::{TlsConfig, TlsError, TlsFiles, TlsMode};
use mongodb::bson::{doc, Document};
use mongodb::Client;
use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DnType, ExtendedKeyUsagePurpose, IsCa,
    KeyPair, KeyUsagePurpose,
};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// A CA and the PEM files it signed, in a temporary directory.
struct Pki {
    dir: PathBuf,
    ca: CertifiedIssuer<'static, KeyPair>,
}

impl Pki {
    fn new(name: &str) -> Pki {
        let dir = std::env::temp_dir().join(format!("duet-tls-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("temp dir");
        let mut params = CertificateParams::new(Vec::<String>::new()).expect("params");
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params
            .distinguished_name
            .push(DnType::CommonName, format!("duet test CA {name}"));
        params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        let ca = CertifiedIssuer::self_signed(params, KeyPair::generate().expect("key"))
            .expect("CA certificate");
        std::fs::write(dir.join("ca.pem"), ca.pem()).expect("write CA");
        Pki { dir, ca }
    }

    fn ca_file(&self) -> PathBuf {
        self.dir.join("ca.pem")
    }

    /// A leaf certificate for 127.0.0.1/localhost (`server`) or a client;
    /// `expired`: valid only in 2000. Writes `<file>` (certificate and key)
    /// and returns its path.
    fn leaf(&self, file: &str, server: bool, expired: bool) -> PathBuf {
        let mut params = CertificateParams::new(vec!["localhost".to_string(), "127.0.0.1".into()])
            .expect("params");
        params.distinguished_name.push(DnType::CommonName, file);
        params.extended_key_usages = vec![if server {
            ExtendedKeyUsagePurpose::ServerAuth
        } else {
            ExtendedKeyUsagePurpose::ClientAuth
        }];
        if expired {
            params.not_before = rcgen::date_time_ymd(2000, 1, 1);
            params.not_after = rcgen::date_time_ymd(2000, 12, 31);
        }
        let key = KeyPair::generate().expect("key");
        let cert = params.signed_by(&key, &self.ca).expect("sign");
        let path = self.dir.join(file);
        std::fs::write(&path, format!("{}{}", cert.pem(), key.serialize_pem())).expect("write");
        path
    }
}

impl Drop for Pki {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn tls(mode: TlsMode, cert_key: &Path, ca: Option<&Path>, optional: bool) -> Arc<TlsConfig> {
    TlsConfig::load(
        mode,
        TlsFiles {
            cert_key_file: Some(cert_key.to_path_buf()),
            ca_file: ca.map(Path::to_path_buf),
            allow_without_certificates: optional,
            ..TlsFiles::default()
        },
    )
    .expect("load TLS")
    .expect("TLS on")
}

fn tls_uri(s: &TestServer, creds: &str, ca: &Path, extra: &str) -> String {
    format!(
        "mongodb://{creds}127.0.0.1:{}/?directConnection=true&tls=true&tlsCAFile={}&serverSelectionTimeoutMS=10000{extra}",
        s.addr.port(),
        ca.display()
    )
}

async fn ping(uri: &str) -> mongodb::error::Result<Document> {
    let c = Client::with_uri_str(uri).await?;
    c.database("admin").run_command(doc! {"ping": 1}).await
}

/// A ping expected to fail: server selection gives up after 1 s, not 10.
async fn ping_fails(uri: &str) -> mongodb::error::Error {
    let quick = uri.replace(
        "serverSelectionTimeoutMS=10000",
        "serverSelectionTimeoutMS=1000",
    );
    match ping(&quick).await {
        Ok(r) => panic!("ping succeeded: {r}"),
        Err(e) => e,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn require_mode_with_scram_over_tls() {
    let pki = Pki::new("require");
    let server_pem = pki.leaf("server.pem", true, false);
    let cfg = tls(TlsMode::Require, &server_pem, None, false);
    let s = TestServer::start(|c| {
        c.auth = true;
        c.tls = Some(cfg);
    })
    .await;

    let anon = Client::with_uri_str(tls_uri(&s, "", &pki.ca_file(), ""))
        .await
        .expect("client");
    anon.database("admin")
        .run_command(doc! {"createUser": "root", "pwd": "pw", "roles": ["root"]})
        .await
        .expect("first user over TLS (localhost exception)");
    for mech in ["SCRAM-SHA-256", "SCRAM-SHA-1"] {
        let uri = tls_uri(
            &s,
            "root:pw@",
            &pki.ca_file(),
            &format!("&authSource=admin&authMechanism={mech}"),
        );
        let c = Client::with_uri_str(&uri).await.expect("client");
        let coll = c.database("app").collection::<Document>("c");
        coll.insert_one(doc! {"m": mech}).await.expect("insert");
        let found = coll.find_one(doc! {"m": mech}).await.expect("find");
        assert!(found.is_some());
        let opts = c
            .database("admin")
            .run_command(doc! {"getCmdLineOpts": 1})
            .await
            .expect("getCmdLineOpts");
        let tls = opts
            .get_document("parsed")
            .and_then(|p| p.get_document("net"))
            .and_then(|n| n.get_document("tls"))
            .expect("parsed.net.tls");
        assert_eq!(tls.get_str("mode").expect("mode"), "requireTLS");
        assert!(!format!("{opts}").contains("PRIVATE KEY"));
    }

    // A plain driver is refused (the server closes the connection).
    let plain = format!(
        "mongodb://{}/?directConnection=true&serverSelectionTimeoutMS=1000",
        s.addr
    );
    assert!(ping(&plain).await.is_err());
    s.shutdown().await;
}

/// A raw plain-TCP client speaking first to a TLS-required port is closed
/// at once; a silent one after the handshake timeout. Neither hangs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plain_and_silent_clients_on_a_tls_port_are_closed() {
    let pki = Pki::new("plain");
    let server_pem = pki.leaf("server.pem", true, false);
    let cfg = tls(TlsMode::Require, &server_pem, None, false);
    let s = TestServer::start(|c| {
        c.tls = Some(cfg);
        c.tls_handshake_timeout = Duration::from_millis(300);
    })
    .await;
    let bound = Duration::from_secs(10);

    let mut hello = Vec::new();
    let body = doc! {"hello": 1, "$db": "admin"};
    let mut bytes = Vec::new();
    body.to_writer(&mut bytes).expect("bson");
    let len = 16 + 4 + 1 + bytes.len();
    hello.extend_from_slice(&(len as i32).to_le_bytes());
    hello.extend_from_slice(&1i32.to_le_bytes());
    hello.extend_from_slice(&0i32.to_le_bytes());
    hello.extend_from_slice(&2013i32.to_le_bytes());
    hello.extend_from_slice(&0u32.to_le_bytes());
    hello.push(0);
    hello.extend_from_slice(&bytes);

    let mut tcp = tokio::net::TcpStream::connect(s.addr)
        .await
        .expect("connect");
    tcp.write_all(&hello).await.expect("send hello");
    let mut buf = [0u8; 64];
    let n = tokio::time::timeout(bound, tcp.read(&mut buf))
        .await
        .expect("closed, not hung")
        .unwrap_or(0);
    assert_eq!(n, 0, "no reply to a plain client");

    let mut silent = tokio::net::TcpStream::connect(s.addr)
        .await
        .expect("connect");
    let n = tokio::time::timeout(bound, silent.read(&mut buf))
        .await
        .expect("closed after the handshake timeout, not hung")
        .unwrap_or(0);
    assert_eq!(n, 0);
    s.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn allow_mode_serves_plain_and_tls_on_one_port() {
    let pki = Pki::new("allow");
    let server_pem = pki.leaf("server.pem", true, false);
    for mode in [TlsMode::Allow, TlsMode::Prefer] {
        let cfg = tls(mode, &server_pem, None, false);
        let s = TestServer::start(|c| c.tls = Some(cfg)).await;
        let plain = format!("mongodb://{}/?directConnection=true", s.addr);
        ping(&plain).await.expect("plain client");
        ping(&tls_uri(&s, "", &pki.ca_file(), ""))
            .await
            .expect("TLS client");
        s.shutdown().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn untrusted_and_expired_server_certificates_are_refused_by_the_driver() {
    let pki = Pki::new("untrusted");
    let other = Pki::new("other");
    let good = pki.leaf("server.pem", true, false);
    let expired = pki.leaf("expired.pem", true, true);

    let s = TestServer::start(|c| c.tls = Some(tls(TlsMode::Require, &good, None, false))).await;
    ping(&tls_uri(&s, "", &pki.ca_file(), ""))
        .await
        .expect("trusted CA");
    let err = ping_fails(&tls_uri(&s, "", &other.ca_file(), "")).await;
    assert!(
        format!("{err}").to_lowercase().contains("certificate"),
        "{err}"
    );
    s.shutdown().await;

    let s = TestServer::start(|c| c.tls = Some(tls(TlsMode::Require, &expired, None, false))).await;
    let err = ping_fails(&tls_uri(&s, "", &pki.ca_file(), "")).await;
    assert!(format!("{err}").to_lowercase().contains("expired"), "{err}");
    s.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_certificates_are_checked_against_the_ca_file() {
    let pki = Pki::new("clientca");
    let other = Pki::new("clientother");
    let server_pem = pki.leaf("server.pem", true, false);
    let client_pem = pki.leaf("client.pem", false, false);
    let expired_client = pki.leaf("client-expired.pem", false, true);
    let stranger = other.leaf("stranger.pem", false, false);
    let cert = |p: &Path| format!("&tlsCertificateKeyFile={}", p.display());

    let cfg = tls(TlsMode::Require, &server_pem, Some(&pki.ca_file()), false);
    let s = TestServer::start(|c| c.tls = Some(cfg)).await;
    ping(&tls_uri(&s, "", &pki.ca_file(), &cert(&client_pem)))
        .await
        .expect("client certificate signed by the CA");
    // No client certificate, one from another CA, an expired one.
    ping_fails(&tls_uri(&s, "", &pki.ca_file(), "")).await;
    ping_fails(&tls_uri(&s, "", &pki.ca_file(), &cert(&stranger))).await;
    ping_fails(&tls_uri(&s, "", &pki.ca_file(), &cert(&expired_client))).await;
    s.shutdown().await;

    // --tls-allow-connections-without-certificates: none is fine, a bad one is not.
    let cfg = tls(TlsMode::Require, &server_pem, Some(&pki.ca_file()), true);
    let s = TestServer::start(|c| c.tls = Some(cfg)).await;
    ping(&tls_uri(&s, "", &pki.ca_file(), ""))
        .await
        .expect("no client certificate allowed");
    ping_fails(&tls_uri(&s, "", &pki.ca_file(), &cert(&stranger))).await;
    s.shutdown().await;
}

#[test]
fn startup_errors_name_the_file_and_the_problem() {
    let pki = Pki::new("errors");
    let good = pki.leaf("server.pem", true, false);
    let other = pki.leaf("other.pem", true, false);
    let load = |mode, files| {
        TlsConfig::load(mode, files)
            .map(|_| ())
            .map_err(|e| e.to_string())
    };
    let files = |cert_key: Option<&Path>| TlsFiles {
        cert_key_file: cert_key.map(Path::to_path_buf),
        ..TlsFiles::default()
    };

    assert!(load(TlsMode::Disabled, files(None)).is_ok());
    let e = load(TlsMode::Require, files(None)).expect_err("no certificate");
    assert!(e.contains("--tls-cert-key-file"), "{e}");
    let e = load(TlsMode::Disabled, files(Some(&good))).expect_err("mode off");
    assert!(e.contains("--tls-mode"), "{e}");

    let missing = pki.dir.join("missing.pem");
    let e = load(TlsMode::Require, files(Some(&missing))).expect_err("missing file");
    assert!(
        e.contains("missing.pem") && e.contains("cannot read"),
        "{e}"
    );

    // Certificate without key, key without certificate.
    let text = std::fs::read_to_string(&good).expect("read");
    let split = text.find("-----BEGIN PRIVATE KEY").expect("key part");
    let cert_only = pki.dir.join("cert-only.pem");
    let key_only = pki.dir.join("key-only.pem");
    std::fs::write(&cert_only, &text[..split]).expect("write");
    std::fs::write(&key_only, &text[split..]).expect("write");
    let e = load(TlsMode::Require, files(Some(&cert_only))).expect_err("no key");
    assert!(e.contains("no private key"), "{e}");
    let e = load(TlsMode::Require, files(Some(&key_only))).expect_err("no cert");
    assert!(e.contains("no certificate"), "{e}");
    let garbage = pki.dir.join("garbage.pem");
    std::fs::write(&garbage, "not a pem file\n").expect("write");
    let e = load(TlsMode::Require, files(Some(&garbage))).expect_err("garbage");
    assert!(e.contains("garbage.pem"), "{e}");

    // A certificate with another certificate's key.
    let other_text = std::fs::read_to_string(&other).expect("read");
    let other_key = &other_text[other_text.find("-----BEGIN PRIVATE KEY").expect("key")..];
    let mismatched = pki.dir.join("mismatched.pem");
    std::fs::write(&mismatched, format!("{}{}", &text[..split], other_key)).expect("write");
    let err = TlsConfig::load(TlsMode::Require, files(Some(&mismatched))).expect_err("mismatch");
    assert!(matches!(err, TlsError::Pair(_)), "{err}");
    assert!(
        err.to_string().contains("do not form a usable pair"),
        "{err}"
    );

    // Separate certificate and key files; a bad CA file.
    let ok = TlsConfig::load(
        TlsMode::Require,
        TlsFiles {
            cert_file: Some(cert_only.clone()),
            key_file: Some(key_only.clone()),
            ..TlsFiles::default()
        },
    );
    assert!(matches!(ok, Ok(Some(_))));
    let e = load(
        TlsMode::Require,
        TlsFiles {
            cert_key_file: Some(good.clone()),
            ca_file: Some(garbage.clone()),
            ..TlsFiles::default()
        },
    )
    .expect_err("bad CA file");
    assert!(
        e.contains("--tls-ca-file") && e.contains("garbage.pem"),
        "{e}"
    );
    // The debug form names paths, never key material.
    let cfg = tls(TlsMode::Require, &good, None, false);
    assert!(!format!("{cfg:?}").contains("PRIVATE"));
}

// ---- Raw TLS clients: the connection limits hold on TLS as on plain TCP.

fn op_msg(d: &Document) -> Vec<u8> {
    let mut payload = 0u32.to_le_bytes().to_vec();
    payload.push(0);
    d.to_writer(&mut payload).expect("encode");
    let mut v = Vec::new();
    v.extend(((16 + payload.len()) as i32).to_le_bytes());
    v.extend(1i32.to_le_bytes());
    v.extend(0i32.to_le_bytes());
    v.extend(2013i32.to_le_bytes());
    v.extend(payload);
    v
}

async fn reply<S: tokio::io::AsyncRead + Unpin>(s: &mut S) -> Option<Document> {
    let mut h = [0u8; 16];
    tokio::time::timeout(Duration::from_secs(5), s.read_exact(&mut h))
        .await
        .ok()?
        .ok()?;
    let len = i32::from_le_bytes([h[0], h[1], h[2], h[3]]) as usize;
    let mut body = vec![0u8; len - 16];
    s.read_exact(&mut body).await.ok()?;
    Document::from_reader(&body[5..]).ok()
}

/// Whether the server closed the stream (EOF or error) within 5 s.
async fn closed<S: tokio::io::AsyncRead + Unpin>(s: &mut S) -> bool {
    let mut b = [0u8; 1];
    matches!(
        tokio::time::timeout(Duration::from_secs(5), s.read(&mut b)).await,
        Ok(Ok(0)) | Ok(Err(_))
    )
}

async fn tls_connect(
    addr: std::net::SocketAddr,
    ca: &Path,
) -> tokio_rustls::client::TlsStream<tokio::net::TcpStream> {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, ServerName};
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_file_iter(ca).expect("CA file") {
        roots.add(cert.expect("CA cert")).expect("add CA");
    }
    let config = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .expect("versions")
    .with_root_certificates(roots)
    .with_no_client_auth();
    let tcp = tokio::net::TcpStream::connect(addr).await.expect("connect");
    let name = ServerName::try_from("127.0.0.1").expect("name");
    tokio_rustls::TlsConnector::from(Arc::new(config))
        .connect(name, tcp)
        .await
        .expect("TLS handshake")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pipelined_messages_over_tls_are_all_answered() {
    let pki = Pki::new("pipeline");
    let cfg = tls(
        TlsMode::Require,
        &pki.leaf("s.pem", true, false),
        None,
        false,
    );
    let s = TestServer::start(|c| c.tls = Some(cfg)).await;
    let mut c = tls_connect(s.addr, &pki.ca_file()).await;
    // Three messages in one write: while the first runs, the server's
    // peer-closed check reads ahead into the second; nothing may be lost.
    let mut bytes = op_msg(&doc! {"insert": "t", "documents": [{"_id": 1}], "$db": "p"});
    bytes.extend(op_msg(&doc! {"ping": 1, "$db": "admin"}));
    bytes.extend(op_msg(&doc! {"count": "t", "$db": "p"}));
    c.write_all(&bytes).await.expect("write");
    c.flush().await.expect("flush");
    let first = reply(&mut c).await.expect("insert reply");
    assert_eq!(first.get_i32("n").expect("n"), 1, "{first}");
    let second = reply(&mut c).await.expect("ping reply");
    assert_eq!(second.get_f64("ok").expect("ok"), 1.0);
    let third = reply(&mut c).await.expect("count reply");
    let n = third
        .get_i64("n")
        .or_else(|_| third.get_i32("n").map(i64::from));
    assert_eq!(n.expect("n"), 1, "{third}");
    s.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connection_limit_and_timeouts_hold_over_tls() {
    let pki = Pki::new("limits");
    let cfg = tls(
        TlsMode::Require,
        &pki.leaf("s.pem", true, false),
        None,
        false,
    );
    let s = TestServer::start(|c| {
        c.tls = Some(cfg);
        c.max_connections = 1;
        c.admin_connections = 0;
        c.idle_timeout = Duration::from_millis(400);
    })
    .await;
    // The one slot, then a refusal read over TLS.
    let mut a = tls_connect(s.addr, &pki.ca_file()).await;
    a.write_all(&op_msg(&doc! {"ping": 1, "$db": "admin"}))
        .await
        .expect("write");
    assert!(reply(&mut a).await.is_some());
    let mut b = tls_connect(s.addr, &pki.ca_file()).await;
    b.write_all(&op_msg(&doc! {"hello": 1, "$db": "admin"}))
        .await
        .expect("write");
    let r = reply(&mut b).await.expect("refusal over TLS");
    assert_eq!(r.get_i32("code").expect("code"), 20);
    assert!(r.get_str("errmsg").expect("msg").contains("limit of 1"));
    assert!(closed(&mut b).await);
    // The idle timeout closes the TLS connection holding the slot ...
    assert!(closed(&mut a).await, "idle TLS connection closed");
    drop(a);
    // ... and the message timeout a half-sent message (800 ms in TestServer).
    let mut c = tls_connect(s.addr, &pki.ca_file()).await;
    let msg = op_msg(&doc! {"ping": 1, "$db": "admin"});
    c.write_all(&msg[..20]).await.expect("write part");
    c.flush().await.expect("flush");
    assert!(closed(&mut c).await, "half-sent message closed");
    s.shutdown().await;
}

/// Shutdown does not wait for a client that never starts its handshake.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_does_not_wait_for_a_pending_handshake() {
    let pki = Pki::new("shutdown");
    let cfg = tls(
        TlsMode::Require,
        &pki.leaf("s.pem", true, false),
        None,
        false,
    );
    let s = TestServer::start(|c| {
        c.tls = Some(cfg);
        c.tls_handshake_timeout = Duration::from_secs(120);
        c.shutdown_grace = Duration::from_secs(120);
    })
    .await;
    let mut silent = tokio::net::TcpStream::connect(s.addr)
        .await
        .expect("connect");
    // Let the server accept it and start waiting for the first bytes.
    ping(&tls_uri(&s, "", &pki.ca_file(), ""))
        .await
        .expect("a TLS client meanwhile");
    tokio::time::timeout(Duration::from_secs(30), s.shutdown())
        .await
        .expect("shutdown within 30 s, not after the 120 s handshake timeout");
    assert!(closed(&mut silent).await);
}
