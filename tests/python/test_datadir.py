"""The data directory over the wire (#14 items 2, 3, 4, 16): reads create no
database, writes do; threads and open files do not grow per database (and the
server restarts with thousands under a 1,024-file limit); one lock for the
whole data directory, shared by the CLI; case-variant names refused."""

import contextlib
import os
import resource
import subprocess

import pytest
from pymongo.errors import OperationFailure, PyMongoError

from conftest import DUET, DuetServer


def threads(srv):
    return len(os.listdir(f"/proc/{srv.proc.pid}/task"))


def open_fds(srv):
    return len(os.listdir(f"/proc/{srv.proc.pid}/fd"))


def data_entries(tmp_path):
    # `retries.local` is the retry table of retryable writes (created by the
    # first one), not a database.
    return sorted(e for e in os.listdir(tmp_path / "data") if e != "retries.local")


@contextlib.contextmanager
def nofile_limit(n):
    """Children started inside inherit a soft RLIMIT_NOFILE of `n`."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(n, hard), hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def ignore_errors(f):
    try:
        f()
    except PyMongoError:
        pass


def read_everything(client, name):
    """Every command that must not create database `name`."""
    db = client[name]
    c = db.c
    list(c.find({"x": 1}))
    c.count_documents({})
    db.command("count", "c")
    c.distinct("x")
    list(c.aggregate([{"$match": {"x": 1}}]))
    db.list_collection_names()
    db.command("dbStats")
    ignore_errors(lambda: db.command("collStats", "c"))
    ignore_errors(lambda: list(c.list_indexes()))
    c.delete_many({"x": 1})
    c.update_many({"x": 1}, {"$set": {"y": 2}})
    c.find_one_and_update({"x": 1}, {"$set": {"y": 2}})
    ignore_errors(lambda: c.drop_index("x_1"))
    c.drop()
    db.command("listSnapshots")
    ignore_errors(lambda: db.command("dropSnapshot", "nope"))
    db.command("explain", {"find": "c", "filter": {}})
    ignore_errors(lambda: client.admin.command("renameCollection", f"{name}.c", to=f"{name}.d"))
    client.drop_database(name)


def test_reads_of_missing_databases_create_nothing(tmp_path):
    srv = DuetServer(tmp_path)
    client = srv.client()
    read_everything(client, "warmup")
    before = threads(srv)
    for i in range(300):
        read_everything(client, f"ghost{i}")
        # A read-only transaction creates nothing either.
        with client.start_session() as s:
            with s.start_transaction():
                list(client[f"ghost{i}"].c.find({}, session=s))
    assert threads(srv) <= before + 8, (before, threads(srv))
    assert data_entries(tmp_path) == ["LOCK"]
    assert client.list_database_names() == ["local"]  # the oplog view
    client.close()
    assert srv.stop() == 0
    srv = DuetServer(tmp_path)
    client = srv.client()
    assert client.list_database_names() == ["local"]  # the oplog view
    client.close()
    assert srv.stop() == 0
    assert data_entries(tmp_path) == ["LOCK"]


def test_writes_create_databases_and_threads_stay_flat(tmp_path):
    srv = DuetServer(tmp_path)
    client = srv.client()
    client.first.c.insert_one({"i": -1})
    before = threads(srv)
    for i in range(200):
        client[f"w{i}"].c.insert_one({"i": i})
    assert threads(srv) <= before + 8, (before, threads(srv))
    names = sorted(client.list_database_names())
    assert len(names) == 202 and "w199" in names  # and local
    client.close()
    assert srv.stop() == 0
    srv = DuetServer(tmp_path)
    client = srv.client()
    assert sorted(client.list_database_names()) == names
    assert client.w123.c.find_one({}, {"_id": 0}) == {"i": 123}
    client.close()
    assert srv.stop() == 0


def test_a_failed_first_write_leaves_no_database(tmp_path):
    srv = DuetServer(tmp_path)
    client = srv.client()
    with pytest.raises(PyMongoError):
        client.bad1.c.insert_one({"_id": [1]})
    with pytest.raises(PyMongoError):
        client.bad2.c.update_one({"x": 1}, {"$bogus": {"y": 1}}, upsert=True)
    with pytest.raises(PyMongoError):
        client.bad3.c.create_index([("a", "bogus")])
    assert data_entries(tmp_path) == ["LOCK"]
    # An upsert writes: it creates its database.
    client.up.c.update_one({"x": 1}, {"$set": {"y": 1}}, upsert=True)
    assert data_entries(tmp_path) == ["LOCK", "up"]
    client.close()
    assert srv.stop() == 0


def test_a_transaction_creates_its_database_when_it_commits_writes(tmp_path):
    srv = DuetServer(tmp_path)
    client = srv.client()
    with client.start_session() as s:
        with s.start_transaction():
            assert list(client.late.c.find({}, session=s)) == []
            client.late.c.insert_one({"_id": 1}, session=s)
            assert data_entries(tmp_path) == ["LOCK"]
    assert data_entries(tmp_path) == ["LOCK", "late"]
    assert client.late.c.find_one() == {"_id": 1}
    # Aborted: nothing.
    with client.start_session() as s:
        s.start_transaction()
        client.never.c.insert_one({"_id": 1}, session=s)
        s.abort_transaction()
    assert "never" not in data_entries(tmp_path)
    client.close()
    assert srv.stop() == 0


def test_case_variant_database_is_refused(server, client):
    client.drop_database("refdb")
    client.refdb.c.insert_one({"x": 1})
    try:
        for make in (lambda: client.Refdb.c.insert_one({"x": 1}),
                     lambda: client.REFDB.create_collection("c")):
            with pytest.raises(OperationFailure) as e:
                make()
            assert e.value.code == 13297
            assert e.value.details["codeName"] == "DatabaseDifferCase"
        with pytest.raises(OperationFailure) as e:
            client.Refdb.c.insert_one({"x": 1})
        assert e.value.details["errmsg"] == (
            "db already exists with different case already have: [refdb] trying to create [Refdb]"
        )
        assert "Refdb" not in client.list_database_names()
    finally:
        client.drop_database("refdb")


def test_two_servers_cannot_share_an_empty_data_directory(tmp_path):
    srv = DuetServer(tmp_path)
    second = subprocess.run(
        [str(DUET), "serve", "--port", "0", "--data-dir", str(tmp_path / "data")],
        capture_output=True, text=True, timeout=20,
    )
    assert second.returncode != 0
    assert "is locked" in second.stderr and str(tmp_path / "data") in second.stderr, second.stderr
    assert srv.stop() == 0


def duet(*args):
    return subprocess.run([str(DUET), *args], capture_output=True, text=True, timeout=60)


def test_cli_and_server_share_one_layout_and_one_lock(tmp_path):
    data = str(tmp_path / "data")
    people = tmp_path / "people.jsonl"
    people.write_text("".join(f'{{"_id": {i}, "city": "{"Oslo" if i % 2 else "Rome"}"}}\n'
                              for i in range(10)))
    srv = DuetServer(tmp_path)
    r = duet("count", "--data-dir", data, "--db", "shop", "-c", "people")
    assert r.returncode != 0 and "is locked" in r.stderr, r.stderr
    assert srv.stop() == 0

    r = duet("import", "--data-dir", data, "--db", "shop", "-c", "people", str(people))
    assert r.returncode == 0, r.stderr
    r = duet("count", "--data-dir", data, "--db", "shop", "-c", "people",
             "--filter", '{"city": "Oslo"}')
    assert (r.returncode, r.stdout.strip()) == (0, "5"), r.stderr
    # A database that does not exist counts 0 and is not created.
    r = duet("count", "--data-dir", data, "--db", "nothere", "-c", "people")
    assert (r.returncode, r.stdout.strip()) == (0, "0"), r.stderr
    r = duet("checkpoint", "--data-dir", data)
    assert r.returncode == 0 and "shop: checkpoint at csn" in r.stdout, r.stdout + r.stderr
    assert data_entries(tmp_path) == ["LOCK", "shop"]

    srv = DuetServer(tmp_path)
    client = srv.client()
    assert client.shop.people.count_documents({}) == 10
    client.shop.people.insert_one({"_id": 10, "city": "Oslo"})
    client.close()
    assert srv.stop() == 0
    r = duet("count", "--data-dir", data, "--db", "shop", "-c", "people",
             "--filter", '{"city": "Oslo"}')
    assert (r.returncode, r.stdout.strip()) == (0, "6"), r.stderr


def test_thousands_of_databases_under_1024_open_files(tmp_path):
    # More databases than the limit has descriptors (crates/duetdb/tests/fd_limit.rs
    # runs 2,000 on the engine alone).
    n = 1200
    with nofile_limit(1024):
        srv = DuetServer(tmp_path)
    client = srv.client()
    peak = 0
    for i in range(n):
        client[f"d{i}"].c.insert_one({"i": i})
        if i % 100 == 0:
            peak = max(peak, open_fds(srv))
    peak = max(peak, open_fds(srv))
    assert peak < 1024, peak
    assert threads(srv) < 100, threads(srv)
    client.close()
    assert srv.stop() == 0
    with nofile_limit(1024):
        srv = DuetServer(tmp_path)
    client = srv.client()
    assert len(client.list_database_names()) == n + 1  # and local
    for i in range(0, n, 7):
        assert client[f"d{i}"].c.find_one({}, {"_id": 0}) == {"i": i}
    client[f"d{n - 1}"].c.insert_one({"after": "restart"})
    assert open_fds(srv) < 1024
    client.close()
    assert srv.stop() == 0
