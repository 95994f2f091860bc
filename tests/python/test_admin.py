"""Server-level commands."""

import pytest
from pymongo.errors import OperationFailure


def test_ping_buildinfo_hostinfo(client):
    assert client.admin.command("ping")["ok"] == 1.0
    bi = client.admin.command("buildInfo")
    assert bi["version"].startswith("7.") and bi["versionArray"][0] == 7
    hi = client.admin.command("hostInfo")
    assert hi["system"]["numCores"] >= 1


def test_buildinfo_shape(client):
    """MongoDB 7.0's buildInfo fields, in its order and with its types;
    duetdb's own facts only under `duet`."""
    from bson.int64 import Int64

    bi = client.admin.command("buildInfo")
    assert [k for k in bi if k not in ("operationTime", "$clusterTime")] == [
        "version", "gitVersion", "modules", "allocator", "javascriptEngine",
        "sysInfo", "versionArray", "openssl", "buildEnvironment", "bits",
        "debug", "maxBsonObjectSize", "storageEngines", "duet", "ok",
    ]
    assert bi["versionArray"] == [7, 0, 0, 0]
    assert all(type(x) is int for x in bi["versionArray"])
    assert bi["sysInfo"] == "deprecated" and bi["modules"] == []
    assert bi["javascriptEngine"] == "none"
    assert bi["allocator"] == "mimalloc"
    assert set(bi["openssl"]) == {"running", "compiled"}
    assert set(bi["buildEnvironment"]) == {
        "distmod", "distarch", "cc", "ccflags", "cxx", "cxxflags",
        "linkflags", "target_arch", "target_os", "cppdefines",
    }
    assert bi["buildEnvironment"]["target_os"] == "linux"
    assert bi["bits"] == 64 and isinstance(bi["debug"], bool)
    assert bi["maxBsonObjectSize"] == 16 * 1024 * 1024
    assert not isinstance(bi["maxBsonObjectSize"], Int64)
    assert bi["storageEngines"] == ["duetdb"]
    assert bi["duet"]["version"] == client.admin.command("serverStatus")["duet"]["version"]
    assert "duetVersion" not in bi
    # hello carries only MongoDB's fields.
    hello = client.admin.command("hello")
    assert not any(k.lower().startswith("duet") for k in hello)


def test_get_parameter(client):
    r = client.admin.command({"getParameter": 1, "featureCompatibilityVersion": 1})
    assert r["featureCompatibilityVersion"]["version"] == "7.0"
    assert "maxBsonObjectSize" in client.admin.command({"getParameter": "*"})
    with pytest.raises(OperationFailure) as e:
        client.admin.command({"getParameter": 1, "noSuchParameter": 1})
    assert e.value.code == 72


def test_whatsmyuri_connection_status_list_commands(client):
    assert client.admin.command("whatsmyuri")["you"].startswith("127.0.0.1:")
    st = client.admin.command("connectionStatus")
    assert st["authInfo"]["authenticatedUsers"] == []
    cmds = client.admin.command("listCommands")["commands"]
    for name in ("find", "insert", "aggregate", "hello", "getMore"):
        assert name in cmds


def test_server_status(client, db):
    db.c.insert_many([{"i": i} for i in range(10)])
    st = client.admin.command("serverStatus")
    assert st["connections"]["current"] >= 1
    assert st["opcounters"]["insert"] >= 10
    mine = [d for d in st["duet"]["databases"] if d["name"] == db.name]
    assert mine and mine[0]["csn"] >= 1 and mine[0]["objects"] == 10
    d = mine[0]
    # The insert above was at least one writer group; the WAL (the test server
    # is durable) logged it and synced it before acknowledging.
    assert d["writer"]["commands"] >= 1 and d["writer"]["groups"] >= 1
    assert d["writer"]["queueLength"] >= 0
    assert d["wal"]["records"] >= 1 and d["wal"]["fsyncs"] >= 1
    assert d["wal"]["lastLsn"] == d["csn"] and d["wal"]["stopped"] is False
    assert d["vls"]["remsetEntries"] >= 0


def test_list_databases(client, db):
    db.c.insert_one({"a": 1})
    names = client.list_database_names()
    assert db.name in names
    r = client.admin.command({"listDatabases": 1, "filter": {"name": db.name}})
    assert [d["name"] for d in r["databases"]] == [db.name]
    r = client.admin.command({"listDatabases": 1, "nameOnly": True})
    assert all(set(d) == {"name"} for d in r["databases"])


def test_sessions_commands(client):
    with client.start_session() as s:
        client.t_sessions.c.find_one({}, session=s)
    assert client.admin.command({"endSessions": []})["ok"] == 1.0
    assert client.admin.command({"killSessions": []})["ok"] == 1.0


def test_unknown_command_is_59(client):
    with pytest.raises(OperationFailure) as e:
        client.admin.command("noSuchCommand")
    assert e.value.code == 59
    assert e.value.details["codeName"] == "CommandNotFound"


def test_bad_duet_options_and_sessionless_commit_are_refused_clearly(client, db):
    assert db.command({"find": "c", "$duet": {"snapshot": "olcp"}})["ok"] == 1.0
    with pytest.raises(OperationFailure) as e:
        db.command({"find": "c", "$duet": {"snapshot": "nonsense"}})
    assert e.value.code == 2
    with pytest.raises(OperationFailure) as e:
        db.command({"find": "c", "$duet": {"snapshot": 1}})
    assert e.value.code == 14
    with pytest.raises(OperationFailure) as e:
        db.command({"find": "c", "$duet": {"nosuch": "vls"}})
    assert e.value.code == 2
    with pytest.raises(OperationFailure) as e:
        db.command({"commitTransaction": 1})  # no txnNumber: not a transaction
    assert e.value.code == 72
