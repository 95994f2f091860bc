"""Mongoose against `duet serve`: the Node project in tests/node/ (mongoose
pinned by its package-lock.json) is installed with `npm ci` when its
node_modules are missing or older than the lock file, then its scripts run
against the session's server. Node.js and npm are required, as pymongo is:
a missing one fails the test with what to install, never skips it."""

import os
import shutil
import subprocess

import pytest

from conftest import ROOT

NODE_DIR = ROOT / "tests" / "node"


def node_project():
    """Install tests/node with `npm ci` if needed; returns the node binary."""
    node, npm = shutil.which("node"), shutil.which("npm")
    if node is None or npm is None:
        pytest.fail("the Mongoose tests need Node.js (18+) and npm on PATH: "
                    "install them (e.g. apt-get install nodejs npm)")
    lock = NODE_DIR / "package-lock.json"
    installed = NODE_DIR / "node_modules" / ".package-lock.json"
    if not installed.exists() or installed.stat().st_mtime < lock.stat().st_mtime:
        r = subprocess.run([npm, "ci", "--no-audit", "--no-fund", "--loglevel=error"],
                           cwd=NODE_DIR, capture_output=True, text=True, timeout=300)
        if r.returncode != 0:
            pytest.fail(f"npm ci in {NODE_DIR} failed:\n{r.stdout}\n{r.stderr}")
    return node


def run_node(script, *args, timeout=60):
    node = node_project()
    r = subprocess.run([node, str(NODE_DIR / script), *args], cwd=NODE_DIR,
                       capture_output=True, text=True, timeout=timeout,
                       env=dict(os.environ, NODE_OPTIONS=""))
    out = r.stdout + r.stderr
    assert r.returncode == 0 and "PASSED" in r.stdout, out
    return out


def test_mongoose_expires_model_init_and_a_ttl_pass(server, client):
    # The session server runs with --enable-test-knobs (duetRunTtlPass).
    name = "t_mongoose_ttl"
    client.drop_database(name)
    out = run_node("mongoose_ttl.js", server.uri, name)
    for step in ("Model.init(): the TTL index created",
                 "Model.init() again from a second connection is a no-op",
                 "syncIndexes()", "a TTL pass deletes exactly the expired",
                 "collMod expireAfterSeconds"):
        assert step in out, out
    client.drop_database(name)
