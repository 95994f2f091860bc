"""Fixtures: start `target/debug/duet serve` on a free loopback port in a temp
data dir, wait until it listens, and stop it with SIGTERM (checking that it
exits 0, i.e. shuts down gracefully).

Nothing is built here: scripts/test.sh builds `duet` before running pytest.
Set DUET_BIN to test another binary.
"""

import os
import signal
import socket
import subprocess
import time
from pathlib import Path

import pytest
from pymongo import MongoClient

ROOT = Path(__file__).resolve().parents[2]
DUET = Path(os.environ.get("DUET_BIN", ROOT / "target" / "debug" / "duet"))


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class DuetServer:
    def __init__(self, tmp: Path, *extra: str):
        if not DUET.exists():
            pytest.fail(f"{DUET} not found: build it first (cargo build -p duet)")
        self.port = free_port()
        self.log_path = tmp / "server.log"
        self.log = open(self.log_path, "wb")
        self.proc = subprocess.Popen(
            [str(DUET), "serve", "--bind", "127.0.0.1", "--port", str(self.port),
             "--data-dir", str(tmp / "data"), "--log-level", "info", *extra],
            stdout=self.log, stderr=subprocess.STDOUT,
        )
        deadline = time.time() + 20
        while time.time() < deadline:
            if self.proc.poll() is not None:
                pytest.fail(f"duet serve exited early:\n{self.log_path.read_text()}")
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=0.2).close()
                return
            except OSError:
                time.sleep(0.05)
        self.stop()
        pytest.fail("duet serve did not start listening within 20 s")

    @property
    def uri(self):
        return f"mongodb://127.0.0.1:{self.port}/?directConnection=true"

    def client(self, **kw):
        kw.setdefault("serverSelectionTimeoutMS", 5000)
        return MongoClient(self.uri, **kw)

    def stop(self, sig=signal.SIGTERM, timeout=15):
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()
        return self.proc.returncode

    def log_text(self):
        if not self.log.closed:
            self.log.flush()
        return self.log_path.read_text(errors="replace")


@pytest.fixture(scope="session")
def server(tmp_path_factory):
    # --enable-test-knobs: test_space_knob.py uses `$duet.workNsPerDoc`.
    srv = DuetServer(tmp_path_factory.mktemp("duet"), "--message-timeout-secs", "1.5",
                     "--cursor-timeout-secs", "3", "--enable-test-knobs")
    yield srv
    code = srv.stop()
    assert code == 0, f"duet serve exited with {code}:\n{srv.log_text()[-4000:]}"


@pytest.fixture(scope="session")
def client(server):
    c = server.client()
    yield c
    c.close()


@pytest.fixture
def db(client, request):
    """A fresh database per test."""
    name = "t_" + request.node.name.replace("[", "_").replace("]", "_")[:50]
    client.drop_database(name)
    yield client[name]
    client.drop_database(name)


@pytest.fixture
def make_server(tmp_path):
    """Start extra servers with their own flags (stopped at the end of the test)."""
    started = []

    def make(*extra):
        srv = DuetServer(tmp_path, *extra)
        started.append(srv)
        return srv

    yield make
    for s in started:
        s.stop()
