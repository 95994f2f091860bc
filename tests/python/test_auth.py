"""Authentication (issue #15 items 1, 2, 4): `duet serve --auth`, SCRAM-SHA-256
and SCRAM-SHA-1 through pymongo, the localhost exception, user management,
users surviving a restart, and the non-loopback bind refusal."""

import os
import signal
import subprocess
import time

import pytest
from pymongo import MongoClient
from pymongo.errors import OperationFailure

from conftest import DUET, free_port


def authed(srv, user, pwd, mech, source="admin", **kw):
    kw.setdefault("serverSelectionTimeoutMS", 5000)
    return MongoClient(
        f"mongodb://{user}:{pwd}@127.0.0.1:{srv.port}/?directConnection=true"
        f"&authSource={source}&authMechanism={mech}",
        **kw,
    )


def create_first_user(srv):
    c = srv.client()
    c.admin.command("createUser", "root", pwd="s3cret", roles=["root"])
    c.close()


def test_unauthenticated_commands_are_refused(make_server):
    srv = make_server("--auth")
    c = srv.client()
    # The handshake commands work without authentication.
    assert c.admin.command("ping")["ok"] == 1
    assert c.admin.command("hello")["ok"] == 1
    assert "version" in c.admin.command("buildInfo")
    st = c.admin.command("connectionStatus")
    assert st["authInfo"]["authenticatedUsers"] == []
    with pytest.raises(OperationFailure) as e:
        c.db.coll.insert_one({"a": 1})
    assert e.value.code == 13
    assert "requires authentication" in str(e.value)
    with pytest.raises(OperationFailure) as e:
        c.list_database_names()
    assert e.value.code == 13
    # A find by `_id` runs on the connection's task (the thin path), under
    # the same authorization as every other command.
    with pytest.raises(OperationFailure) as e:
        c.db.coll.find_one({"_id": 1})
    assert e.value.code == 13
    # The localhost exception: the first user, in admin only.
    with pytest.raises(OperationFailure) as e:
        c.other.command("createUser", "u", pwd="p", roles=["read"])
    assert e.value.code == 13
    c.admin.command("createUser", "root", pwd="s3cret", roles=["root"])
    # ... and only while no user exists.
    with pytest.raises(OperationFailure) as e:
        c.admin.command("createUser", "second", pwd="p", roles=["root"])
    assert e.value.code == 13
    c.close()


@pytest.mark.parametrize("mech", ["SCRAM-SHA-256", "SCRAM-SHA-1"])
def test_scram_login_and_crud(make_server, mech):
    srv = make_server("--auth")
    create_first_user(srv)
    c = authed(srv, "root", "s3cret", mech)
    c.app.items.insert_one({"_id": 1, "v": "x"})
    assert c.app.items.find_one({"_id": 1})["v"] == "x"
    st = c.admin.command("connectionStatus")
    assert st["authInfo"]["authenticatedUsers"] == [{"user": "root", "db": "admin"}]
    assert st["authInfo"]["authenticatedUserRoles"] == [{"role": "root", "db": "admin"}]
    c.close()


@pytest.mark.parametrize("mech", ["SCRAM-SHA-256", "SCRAM-SHA-1"])
def test_wrong_password_is_code_18(make_server, mech):
    srv = make_server("--auth")
    create_first_user(srv)
    for user, pwd in [("root", "Zq9notit"), ("nobody", "s3cret")]:
        c = authed(srv, user, pwd, mech)
        with pytest.raises(OperationFailure) as e:
            c.admin.command("ping")
        assert e.value.code == 18
        assert str(e.value).startswith("Authentication failed")
        c.close()
    assert "authentication failed" in srv.log_text()
    log = srv.log_text()
    assert "s3cret" not in log and "Zq9notit" not in log


def test_unsupported_mechanism_is_refused(make_server):
    srv = make_server("--auth")
    create_first_user(srv)
    c = srv.client()
    with pytest.raises(OperationFailure) as e:
        c.admin.command("saslStart", mechanism="PLAIN", payload=b"\0root\0s3cret")
    assert e.value.code == 334
    c.close()


def test_user_management_and_restart(make_server):
    srv = make_server("--auth")
    create_first_user(srv)
    admin = authed(srv, "root", "s3cret", "SCRAM-SHA-256")
    admin.app.command("createUser", "ann", pwd="pw1", roles=["readWrite"])
    with pytest.raises(OperationFailure) as e:
        admin.app.command("createUser", "ann", pwd="pw1", roles=["readWrite"])
    assert e.value.code == 51003
    with pytest.raises(OperationFailure) as e:
        admin.app.command("createUser", "bob", pwd="pw", roles=["noSuchRole"])
    assert e.value.code == 31
    info = admin.app.command("usersInfo", "ann")["users"]
    assert len(info) == 1
    assert info[0]["user"] == "ann" and info[0]["db"] == "app"
    assert info[0]["roles"] == [{"role": "readWrite", "db": "app"}]
    assert sorted(info[0]["mechanisms"]) == ["SCRAM-SHA-1", "SCRAM-SHA-256"]
    assert "credentials" not in info[0]
    # A per-database user authenticates against its own database only.
    ann = authed(srv, "ann", "pw1", "SCRAM-SHA-256", source="app")
    ann.app.t.insert_one({"x": 1})
    ann.close()
    wrong_source = authed(srv, "ann", "pw1", "SCRAM-SHA-256", source="admin")
    with pytest.raises(OperationFailure) as e:
        wrong_source.admin.command("ping")
    assert e.value.code == 18
    wrong_source.close()
    # updateUser: password and roles.
    admin.app.command("updateUser", "ann", pwd="pw2")
    admin.app.command("grantRolesToUser", "ann", roles=["dbAdmin"])
    admin.app.command("revokeRolesFromUser", "ann", roles=["readWrite"])
    assert admin.app.command("usersInfo", 1)["users"][0]["roles"] == [
        {"role": "dbAdmin", "db": "app"}
    ]
    old = authed(srv, "ann", "pw1", "SCRAM-SHA-1", source="app")
    with pytest.raises(OperationFailure) as e:
        old.app.command("ping")
    assert e.value.code == 18
    old.close()
    admin.app.command("createUser", "tmp", pwd="t", roles=[])
    admin.close()
    assert srv.stop() == 0

    # Users and their roles survive a restart (same data directory): ann is
    # dbAdmin of app now, which reads statistics, not documents.
    srv2 = make_server("--auth")
    ann = authed(srv2, "ann", "pw2", "SCRAM-SHA-1", source="app")
    assert ann.app.command("dbStats")["objects"] == 1
    with pytest.raises(OperationFailure) as e:
        ann.app.t.count_documents({})
    assert e.value.code == 13
    ann.close()
    admin = authed(srv2, "root", "s3cret", "SCRAM-SHA-256")
    admin.app.command("dropUser", "tmp")
    with pytest.raises(OperationFailure) as e:
        admin.app.command("dropUser", "tmp")
    assert e.value.code == 11
    assert admin.app.command("dropAllUsersFromDatabase")["n"] == 1
    assert admin.app.command("usersInfo", 1)["users"] == []
    assert [u["user"] for u in admin.admin.command("usersInfo", {"forAllDBs": True})["users"]] == ["root"]
    admin.close()


def test_logout(make_server):
    srv = make_server("--auth")
    create_first_user(srv)
    c = authed(srv, "root", "s3cret", "SCRAM-SHA-256", maxPoolSize=1)
    assert c.admin.command("listDatabases")["ok"] == 1
    c.admin.command("logout")
    with pytest.raises(OperationFailure) as e:
        c.admin.command("listDatabases")
    assert e.value.code == 13
    c.close()


def test_without_auth_users_are_optional(make_server):
    srv = make_server()
    c = srv.client()
    c.db.coll.insert_one({"a": 1})
    c.admin.command("createUser", "root", pwd="s3cret", roles=["root"])
    # Credentials work (and are checked) even when not required.
    good = authed(srv, "root", "s3cret", "SCRAM-SHA-256")
    assert good.db.coll.count_documents({}) == 1
    good.close()
    bad = authed(srv, "root", "nope", "SCRAM-SHA-256")
    with pytest.raises(OperationFailure) as e:
        bad.admin.command("ping")
    assert e.value.code == 18
    bad.close()
    c.close()


def test_non_loopback_bind_needs_auth(tmp_path):
    port = str(free_port())
    base = [str(DUET), "serve", "--bind", "0.0.0.0", "--port", port,
            "--data-dir", str(tmp_path / "data")]
    r = subprocess.run(base, capture_output=True, text=True, timeout=30)
    assert r.returncode != 0
    assert "--auth" in r.stderr and "--allow-unauthenticated-remote" in r.stderr


def test_mechanism_negotiation_and_hello_fields(make_server):
    srv = make_server("--auth")
    create_first_user(srv)
    c = srv.client()
    hello = c.admin.command("hello", saslSupportedMechs="admin.root")
    assert sorted(hello["saslSupportedMechs"]) == ["SCRAM-SHA-1", "SCRAM-SHA-256"]
    assert "saslSupportedMechs" not in c.admin.command("hello", saslSupportedMechs="admin.nobody")
    spec = c.admin.command(
        "hello",
        speculativeAuthenticate={"saslStart": 1, "mechanism": "SCRAM-SHA-256",
                                 "payload": b"n,,n=root,r=abcdefghijklmnop", "db": "admin"},
    )["speculativeAuthenticate"]
    assert spec["done"] is False
    assert bytes(spec["payload"]).startswith(b"r=abcdefghijklmnop")
    c.close()
    # No authMechanism: the driver negotiates through saslSupportedMechs.
    n = MongoClient(f"mongodb://root:s3cret@127.0.0.1:{srv.port}/?directConnection=true",
                    serverSelectionTimeoutMS=5000)
    assert n.admin.command("listDatabases")["ok"] == 1
    n.close()


def test_unauthenticated_remote_override_warns(tmp_path):
    port = str(free_port())
    log = tmp_path / "serve.log"
    with open(log, "wb") as out:
        p = subprocess.Popen(
            [str(DUET), "serve", "--bind", "0.0.0.0", "--port", port,
             "--data-dir", str(tmp_path / "data"), "--allow-unauthenticated-remote"],
            stdout=out, stderr=subprocess.STDOUT,
        )
        try:
            deadline = time.time() + 20
            while "listening on" not in log.read_text(errors="replace"):
                assert p.poll() is None, log.read_text(errors="replace")
                assert time.time() < deadline, "did not start"
                time.sleep(0.05)
            # Serving (so the signal handlers are installed): then stop it.
            c = MongoClient(f"mongodb://127.0.0.1:{port}/?directConnection=true",
                            serverSelectionTimeoutMS=5000)
            assert c.admin.command("ping")["ok"] == 1
            c.close()
        finally:
            p.send_signal(signal.SIGTERM)
            p.wait(timeout=15)
    text = log.read_text(errors="replace")
    assert "WITHOUT authentication" in text
    assert p.returncode == 0


def test_dropped_user_is_logged_out(make_server):
    srv = make_server("--auth")
    create_first_user(srv)
    admin = authed(srv, "root", "s3cret", "SCRAM-SHA-256")
    admin.admin.command("createUser", "eve", pwd="pw", roles=["root"])
    eve = authed(srv, "eve", "pw", "SCRAM-SHA-256", maxPoolSize=1)
    assert eve.admin.command("listDatabases")["ok"] == 1
    admin.admin.command("dropUser", "eve")
    with pytest.raises(OperationFailure) as e:
        eve.admin.command("listDatabases")
    assert e.value.code == 13
    assert admin.admin.command("listDatabases")["ok"] == 1
    eve.close()
    admin.close()


@pytest.mark.parametrize("mech", ["SCRAM-SHA-256", "SCRAM-SHA-1"])
def test_non_ascii_password(make_server, mech):
    srv = make_server("--auth")
    c = srv.client()
    c.admin.command("createUser", "uni", pwd="pässwörd\u00a0✓", roles=["root"])
    c.close()
    from urllib.parse import quote_plus
    ok = authed(srv, "uni", quote_plus("pässwörd\u00a0✓"), mech)
    assert ok.admin.command("listDatabases")["ok"] == 1
    ok.close()


def test_initial_root_user_for_containers(make_server, tmp_path, monkeypatch):
    # A container's clients never reach its loopback, so the localhost
    # exception cannot create the first user: --initial-root-user (or
    # DUET_INITIAL_ROOT_USER) does, at start, on a fresh data directory only.
    pw = tmp_path / "root-password"
    pw.write_text("first-pw\nignored second line\n")
    srv = make_server("--auth", "--initial-root-user", "boss", "--initial-root-password-file", str(pw))
    assert "initial root user created" in srv.log_text()
    root = authed(srv, "boss", "first-pw", "SCRAM-SHA-256")
    assert [u["user"] for u in root.admin.command("usersInfo", 1)["users"]] == ["boss"]
    root.app.t.insert_one({"x": 1})
    root.close()
    # The localhost exception is closed: a user exists.
    anon = srv.client()
    with pytest.raises(OperationFailure) as e:
        anon.admin.command("createUser", "intruder", pwd="x", roles=["root"])
    assert e.value.code == 13
    anon.close()
    assert srv.stop() == 0

    # A restart with another password in the environment changes nothing.
    monkeypatch.setenv("DUET_INITIAL_ROOT_USER", "boss")
    monkeypatch.setenv("DUET_INITIAL_ROOT_PASSWORD", "other-pw")
    srv2 = make_server("--auth")
    assert "users exist" in srv2.log_text()
    with pytest.raises(OperationFailure) as e:
        authed(srv2, "boss", "other-pw", "SCRAM-SHA-256").admin.command("ping")
    assert e.value.code == 18
    root = authed(srv2, "boss", "first-pw", "SCRAM-SHA-1")
    assert root.app.t.count_documents({}) == 1
    root.close()
    assert srv2.stop() == 0


def test_initial_root_user_needs_auth_and_a_password(tmp_path):
    base = [str(DUET), "serve", "--bind", "127.0.0.1", "--port", str(free_port()),
            "--data-dir", str(tmp_path / "data")]
    env = {k: v for k, v in os.environ.items() if not k.startswith("DUET_INITIAL_ROOT")}
    # No --auth: clap refuses the flag; the environment variable is refused by us.
    r = subprocess.run(base + ["--initial-root-user", "boss"], capture_output=True, text=True, timeout=30, env=env)
    assert r.returncode != 0 and "--auth" in r.stderr
    r = subprocess.run(base, capture_output=True, text=True, timeout=30,
                       env={**env, "DUET_INITIAL_ROOT_USER": "boss", "DUET_INITIAL_ROOT_PASSWORD": "pw"})
    assert r.returncode != 0 and "needs --auth" in r.stderr
    # --auth but no password anywhere.
    r = subprocess.run(base + ["--auth", "--initial-root-user", "boss"], capture_output=True, text=True,
                       timeout=30, env=env)
    assert r.returncode != 0 and "DUET_INITIAL_ROOT_PASSWORD" in r.stderr
    # An unreadable password file names the file.
    r = subprocess.run(base + ["--auth", "--initial-root-user", "boss", "--initial-root-password-file",
                               str(tmp_path / "missing")], capture_output=True, text=True, timeout=30, env=env)
    assert r.returncode != 0 and "missing" in r.stderr


def test_the_docker_images_command_starts_and_takes_its_first_user_from_the_environment(tmp_path):
    # No Docker engine runs here, so the image is not built; this runs the
    # image's own ENTRYPOINT + CMD (read from the Dockerfile) as the
    # container would, with its port and volume mapped to a temp dir.
    import json
    from conftest import ROOT
    lines = (ROOT / "Dockerfile").read_text().splitlines()
    entry = json.loads(next(l for l in lines if l.startswith("ENTRYPOINT"))[len("ENTRYPOINT"):])
    cmd = json.loads(next(l for l in lines if l.startswith("CMD"))[len("CMD"):])
    port = str(free_port())
    data = tmp_path / "data"
    # The image listens on every interface, which duet allows only with
    # --auth; the test listens on loopback only.
    assert "0.0.0.0" in entry and "--auth" in cmd
    mapped = {"/usr/local/bin/duet": str(DUET), "27017": port, "/data": str(data), "0.0.0.0": "127.0.0.1"}
    argv = [mapped.get(a, a) for a in entry + cmd]
    secret = tmp_path / "secret"
    secret.write_text("docker-pw\n")
    env = {**os.environ, "DUET_INITIAL_ROOT_USER": "admin", "DUET_INITIAL_ROOT_PASSWORD_FILE": str(secret)}
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline()
        assert "listening" in line and "authentication required" in line, (line, proc.poll())
        c = MongoClient(f"mongodb://admin:docker-pw@127.0.0.1:{port}/?directConnection=true&authSource=admin",
                        serverSelectionTimeoutMS=5000)
        c.app.t.insert_one({"x": 1})
        assert c.app.t.count_documents({}) == 1
        c.close()
        anon = MongoClient(f"mongodb://127.0.0.1:{port}/?directConnection=true", serverSelectionTimeoutMS=5000)
        with pytest.raises(OperationFailure) as e:
            anon.app.t.find_one()
        assert e.value.code == 13
        anon.close()
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
