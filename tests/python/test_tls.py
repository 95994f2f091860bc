"""TLS and handshake hardening (issue #15 items 5, 6) through pymongo:
`--tls-mode require` with SCRAM-SHA-256/-1 over TLS (CA, server and client
certificates generated here with `cryptography`), plain clients on a TLS port
closed quickly, untrusted CA and expired certificates refused, allow/prefer
serving both, client certificates against `--tls-ca-file`, startup errors,
and failed logins rate-limited per source address."""

import datetime
import socket
import ssl
import subprocess
import time

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID
from pymongo import MongoClient
from pymongo.errors import OperationFailure, ServerSelectionTimeoutError

from conftest import DUET, free_port


class Pki:
    """A CA in `dir` that signs leaf certificates written as PEM files."""

    def __init__(self, dir, name="duet test CA"):
        dir.mkdir(parents=True, exist_ok=True)
        self.dir = dir
        self.key = ec.generate_private_key(ec.SECP256R1())
        self.name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
        now = datetime.datetime.now(datetime.timezone.utc)
        self.cert = (
            x509.CertificateBuilder()
            .subject_name(self.name).issuer_name(self.name)
            .public_key(self.key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(days=1))
            .not_valid_after(now + datetime.timedelta(days=30))
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .add_extension(x509.KeyUsage(
                digital_signature=False, content_commitment=False, key_encipherment=False,
                data_encipherment=False, key_agreement=False, key_cert_sign=True,
                crl_sign=True, encipher_only=False, decipher_only=False), critical=True)
            .sign(self.key, hashes.SHA256())
        )
        self.ca_file = dir / "ca.pem"
        self.ca_file.write_bytes(self.cert.public_bytes(serialization.Encoding.PEM))

    def leaf(self, file, server=True, expired=False):
        """Write `file` (certificate then key) for 127.0.0.1/localhost."""
        key = ec.generate_private_key(ec.SECP256R1())
        now = datetime.datetime.now(datetime.timezone.utc)
        if expired:
            start, end = now - datetime.timedelta(days=60), now - datetime.timedelta(days=30)
        else:
            start, end = now - datetime.timedelta(days=1), now + datetime.timedelta(days=30)
        import ipaddress
        cert = (
            x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, file)]))
            .issuer_name(self.name)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(start).not_valid_after(end)
            .add_extension(x509.SubjectAlternativeName([
                x509.DNSName("localhost"),
                x509.IPAddress(ipaddress.ip_address("127.0.0.1")),
            ]), critical=False)
            .add_extension(x509.ExtendedKeyUsage(
                [ExtendedKeyUsageOID.SERVER_AUTH if server else ExtendedKeyUsageOID.CLIENT_AUTH]),
                critical=False)
            .sign(self.key, hashes.SHA256())
        )
        path = self.dir / file
        path.write_bytes(
            cert.public_bytes(serialization.Encoding.PEM)
            + key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                serialization.NoEncryption())
        )
        return path


@pytest.fixture
def pki(tmp_path):
    return Pki(tmp_path / "pki")


def tls_client(srv, ca, user=None, pwd=None, mech=None, **kw):
    creds = f"{user}:{pwd}@" if user else ""
    query = f"&authSource=admin&authMechanism={mech}" if mech else ""
    kw.setdefault("serverSelectionTimeoutMS", 10000)
    return MongoClient(
        f"mongodb://{creds}127.0.0.1:{srv.port}/?directConnection=true{query}",
        tls=True, tlsCAFile=str(ca), **kw)


def test_require_mode_with_scram_over_tls(make_server, pki):
    server_pem = pki.leaf("server.pem")
    srv = make_server("--auth", "--tls-mode", "require", "--tls-cert-key-file", str(server_pem))
    anon = tls_client(srv, pki.ca_file)
    anon.admin.command("createUser", "root", pwd="s3cret", roles=["root"])
    anon.close()
    for mech in ["SCRAM-SHA-256", "SCRAM-SHA-1"]:
        c = tls_client(srv, pki.ca_file, "root", "s3cret", mech)
        c.app.items.insert_one({"m": mech})
        assert c.app.items.find_one({"m": mech}) is not None
        opts = c.admin.command("getCmdLineOpts")
        assert opts["parsed"]["net"]["tls"] == {
            "mode": "requireTLS", "certificateKeyFile": str(server_pem)}
        assert "--tls-mode" in opts["argv"]
        assert "PRIVATE KEY" not in str(opts)
        status = c.admin.command("serverStatus")
        assert "PRIVATE KEY" not in str(status) and "PRIVATE KEY" not in str(
            c.admin.command("hello"))
        c.close()
    # A plain pymongo client cannot talk to it.
    plain = srv.client(serverSelectionTimeoutMS=1000)
    with pytest.raises(ServerSelectionTimeoutError):
        plain.admin.command("ping")
    plain.close()
    log = srv.log_text()
    assert "plain (non-TLS) client on a port that requires TLS" in log
    # Drivers close without TLS close_notify: an ordinary close, not a warning.
    assert "close_notify" not in log


def closed(sock):
    """Whether the server closed `sock` (EOF, or a reset when it left our
    bytes unread) rather than answering; the socket's timeout bounds it."""
    try:
        return sock.recv(64) == b""
    except ConnectionResetError:
        return True


def test_plain_client_on_a_require_port_is_closed_not_hung(make_server, pki):
    srv = make_server("--tls-mode", "require", "--tls-cert-key-file", str(pki.leaf("s.pem")),
                      "--tls-handshake-timeout-secs", "0.5")
    # A wire-protocol client speaking first: closed at once, no reply.
    with socket.create_connection(("127.0.0.1", srv.port), timeout=10) as s:
        s.sendall(b"\x3a\x00\x00\x00" + b"\x01\x00\x00\x00" * 2 + b"\xdd\x07\x00\x00" + b"\x00" * 42)
        assert closed(s)
    # A silent client: closed after the handshake timeout.
    with socket.create_connection(("127.0.0.1", srv.port), timeout=10) as s:
        assert closed(s)
    # A TLS client that starts a handshake and stalls: closed too.
    with socket.create_connection(("127.0.0.1", srv.port), timeout=10) as s:
        s.sendall(b"\x16\x03\x01\x00\x40\x01")
        assert closed(s)
    log = srv.log_text()
    assert "plain (non-TLS) client" in log
    assert "no TLS handshake within" in log


@pytest.mark.parametrize("mode", ["allow", "prefer"])
def test_allow_and_prefer_serve_plain_and_tls(make_server, pki, mode):
    srv = make_server("--tls-mode", mode, "--tls-cert-key-file", str(pki.leaf("server.pem")))
    plain = srv.client()
    plain.db.t.insert_one({"via": "plain"})
    secure = tls_client(srv, pki.ca_file)
    secure.db.t.insert_one({"via": "tls"})
    assert sorted(d["via"] for d in plain.db.t.find()) == ["plain", "tls"]
    plain.close()
    secure.close()


def test_untrusted_ca_and_expired_certificate_fail(make_server, pki, tmp_path):
    other = Pki(tmp_path / "other", "another CA")
    srv = make_server("--tls-mode", "require", "--tls-cert-key-file", str(pki.leaf("server.pem")))
    c = tls_client(srv, other.ca_file, serverSelectionTimeoutMS=1000)
    with pytest.raises(ServerSelectionTimeoutError) as e:
        c.admin.command("ping")
    assert "certificate verify failed" in str(e.value)
    c.close()
    srv.stop()

    expired = make_server("--tls-mode", "require", "--tls-cert-key-file",
                          str(pki.leaf("expired.pem", expired=True)))
    c = tls_client(expired, pki.ca_file, serverSelectionTimeoutMS=1000)
    with pytest.raises(ServerSelectionTimeoutError) as e:
        c.admin.command("ping")
    assert "expired" in str(e.value)
    c.close()


def test_client_certificates(make_server, pki, tmp_path):
    other = Pki(tmp_path / "other", "another CA")
    srv = make_server("--tls-mode", "require", "--tls-cert-key-file", str(pki.leaf("server.pem")),
                      "--tls-ca-file", str(pki.ca_file))
    good = tls_client(srv, pki.ca_file, tlsCertificateKeyFile=str(pki.leaf("c.pem", server=False)))
    assert good.admin.command("ping")["ok"] == 1
    good.close()
    for kw in [{}, {"tlsCertificateKeyFile": str(other.leaf("x.pem", server=False))},
               {"tlsCertificateKeyFile": str(pki.leaf("old.pem", server=False, expired=True))}]:
        c = tls_client(srv, pki.ca_file, serverSelectionTimeoutMS=1000, **kw)
        with pytest.raises(ServerSelectionTimeoutError):
            c.admin.command("ping")
        c.close()
    assert "TLS handshake failed" in srv.log_text()


def run_serve(tmp_path, *flags):
    return subprocess.run(
        [str(DUET), "serve", "--port", str(free_port()), "--data-dir", str(tmp_path / "d"), *flags],
        capture_output=True, text=True, timeout=30)


def test_startup_errors(tmp_path, pki):
    r = run_serve(tmp_path, "--tls-mode", "require")
    assert r.returncode != 0 and "--tls-cert-key-file" in r.stderr
    r = run_serve(tmp_path, "--tls-mode", "require", "--tls-cert-key-file", str(tmp_path / "nope.pem"))
    assert r.returncode != 0 and "nope.pem" in r.stderr and "cannot read" in r.stderr
    server_pem = pki.leaf("server.pem")
    r = run_serve(tmp_path, "--tls-cert-key-file", str(server_pem))
    assert r.returncode != 0 and "--tls-mode" in r.stderr
    # A certificate with another key.
    text = server_pem.read_text()
    other = pki.leaf("other.pem").read_text()
    cut = text.index("-----BEGIN PRIVATE KEY")
    bad = tmp_path / "mismatched.pem"
    bad.write_text(text[:cut] + other[other.index("-----BEGIN PRIVATE KEY"):])
    r = run_serve(tmp_path, "--tls-mode", "require", "--tls-cert-key-file", str(bad))
    assert r.returncode != 0 and "do not form a usable pair" in r.stderr
    # Separate files work too.
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    cert.write_text(text[:cut])
    key.write_text(text[cut:])
    r = run_serve(tmp_path, "--tls-mode", "require", "--tls-cert-file", str(cert))
    assert r.returncode != 0 and "--tls-key-file" in r.stderr


def test_done_when_auth_tls_require_on_all_interfaces(make_server, pki, tmp_path):
    """`duet serve --auth --bind 0.0.0.0 --tls-mode require ...` with
    credentials and TLS, connecting through 127.0.0.1."""
    port = free_port()
    log = open(tmp_path / "remote.log", "wb")
    proc = subprocess.Popen(
        [str(DUET), "serve", "--auth", "--bind", "0.0.0.0", "--port", str(port),
         "--data-dir", str(tmp_path / "remote"), "--tls-mode", "require",
         "--tls-cert-key-file", str(pki.leaf("server.pem"))],
        stdout=log, stderr=subprocess.STDOUT)
    try:
        class Srv:
            pass
        srv = Srv()
        srv.port = port
        deadline = time.time() + 20
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
                break
            except OSError:
                assert time.time() < deadline and proc.poll() is None
                time.sleep(0.05)
        anon = tls_client(srv, pki.ca_file)
        anon.admin.command("createUser", "root", pwd="s3cret", roles=["root"])
        with pytest.raises(OperationFailure) as e:
            anon.app.t.insert_one({"x": 1})
        assert e.value.code == 13
        anon.close()
        c = tls_client(srv, pki.ca_file, "root", "s3cret", "SCRAM-SHA-256")
        c.app.t.insert_one({"x": 1})
        assert c.app.t.count_documents({}) == 1
        c.close()
    finally:
        proc.terminate()
        assert proc.wait(timeout=15) == 0
        log.close()


def test_failed_logins_are_rate_limited_per_address(make_server):
    srv = make_server("--auth", "--auth-failure-limit", "3", "--auth-failure-window-secs", "2")
    c = srv.client()
    c.admin.command("createUser", "root", pwd="s3cret", roles=["root"])
    c.close()

    def login(pwd):
        cl = MongoClient(f"mongodb://root:{pwd}@127.0.0.1:{srv.port}/?directConnection=true"
                         "&authSource=admin&authMechanism=SCRAM-SHA-256",
                         serverSelectionTimeoutMS=10000)
        try:
            return cl.admin.command("ping")["ok"]
        except OperationFailure as e:
            return e
        finally:
            cl.close()

    assert login("s3cret") == 1
    for _ in range(3):
        e = login("Bad9pw")
        assert isinstance(e, OperationFailure) and e.code == 18
        assert "too many" not in str(e)
    # Blocked: even the right password is refused until the window passes.
    e = login("s3cret")
    assert isinstance(e, OperationFailure) and e.code == 18
    assert "too many failed attempts" in str(e)
    time.sleep(2.2)
    assert login("s3cret") == 1
    log = srv.log_text()
    assert "address blocked" in log and "rate_limited" in log
    assert "wrong_password" in log and "duet::auth" in log
    assert "s3cret" not in log and "Bad9pw" not in log


def test_one_login_counts_once_even_with_speculative_authentication(make_server):
    """pymongo tries SCRAM inside `hello` first (speculativeAuthenticate), then
    with saslStart: a failed login with an unknown user counts once."""
    srv = make_server("--auth", "--auth-failure-limit", "3", "--auth-failure-window-secs", "60")
    c = srv.client()
    c.admin.command("createUser", "root", pwd="s3cret", roles=["root"])
    c.close()

    def login(user, pwd):
        cl = MongoClient(f"mongodb://{user}:{pwd}@127.0.0.1:{srv.port}/?directConnection=true"
                         "&authSource=admin&authMechanism=SCRAM-SHA-256",
                         serverSelectionTimeoutMS=10000)
        try:
            return cl.admin.command("ping")["ok"]
        except OperationFailure as e:
            return e.code
        finally:
            cl.close()

    assert login("nobody", "x") == 18
    assert login("nobody", "x") == 18
    # Two failures so far, under the limit of three.
    assert login("root", "s3cret") == 1
    assert srv.log_text().count("reason=\"unknown_user\"") + srv.log_text().count(
        "reason=unknown_user") == 2
