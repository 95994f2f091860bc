"""Admin commands as mongosh and monitoring agents call them (issue #22
items 1-4): statistics, validate, currentOp/killOp with plan and strategy,
top, getLog, parameters, the replica-set commands, fsync lock, shutdown,
metrics, the configuration file and the logs."""

import datetime
import json
import re
import socket
import subprocess
import threading
import time
import urllib.request

import pytest
from bson.int64 import Int64
from pymongo.errors import AutoReconnect, ExecutionTimeout, OperationFailure

from conftest import DUET, free_port

DOCS = 2000
NS = 500_000  # 2000 docs x 0.5 ms: a count lasting about a second


def test_coll_stats_and_its_stage(db):
    db.c.create_index("a")
    db.c.insert_many([{"_id": i, "a": i, "s": "x" * 50} for i in range(300)])
    st = db.command("collStats", "c")
    assert st["ns"] == f"{db.name}.c" and st["count"] == 300
    assert type(st["count"]) is int and not isinstance(st["count"], Int64)
    assert st["size"] > 300 * 50 and st["avgObjSize"] == st["size"] // 300
    assert st["storageSize"] >= st["size"]
    assert set(st["indexSizes"]) == {"_id_", "a_1"}
    assert st["totalIndexSize"] == sum(st["indexSizes"].values()) > 0
    assert st["nindexes"] == 2
    assert st["duet"]["remsetEntries"] == 0
    assert st["duet"]["retainedBySnapshots"]["versions"] == 0
    # A named snapshot retains the old versions of what is updated after it.
    db.command({"createSnapshot": "s"})
    db.c.update_many({"a": {"$lt": 10}}, {"$set": {"s": "y"}})
    st = db.command("collStats", "c")
    assert st["duet"]["retainedBySnapshots"]["versions"] == 10
    db.command({"dropSnapshot": "s"})
    # scale
    scaled = db.command({"collStats": "c", "scale": 1024})
    assert scaled["size"] == st["size"] // 1024 and scaled["scaleFactor"] == 1024
    # The stage, as mongosh's db.c.stats() sends it.
    out = list(db.c.aggregate([{"$collStats": {"storageStats": {}, "count": {},
                                               "latencyStats": {}}}]))
    assert len(out) == 1
    assert out[0]["storageStats"]["count"] == 300 and out[0]["count"] == 300
    assert out[0]["latencyStats"]["writes"]["ops"] >= 1
    # Later stages run on the stage's document.
    out = list(db.c.aggregate([{"$collStats": {"count": {}}}, {"$project": {"n": "$count"}}]))
    assert out[0]["n"] == 300
    with pytest.raises(OperationFailure) as e:
        list(db.c.aggregate([{"$match": {}}, {"$collStats": {}}]))
    assert e.value.code == 40602
    with pytest.raises(OperationFailure) as e:
        db.command("collStats", "missing")
    assert e.value.code == 26


def test_index_stats_and_db_stats(db):
    db.c.create_index([("a", 1), ("b", -1)])
    db.c.insert_many([{"a": i, "b": i} for i in range(50)])
    db.d.insert_one({"x": 1})
    idx = {d["name"]: d for d in db.c.aggregate([{"$indexStats": {}}])}
    assert set(idx) == {"_id_", "a_1_b_-1"}
    assert idx["a_1_b_-1"]["key"] == {"a": 1, "b": -1}
    assert "ops" in idx["a_1_b_-1"]["accesses"]
    st = db.command("dbStats")
    assert st["collections"] == 2 and st["objects"] == 51 and st["indexes"] == 3
    assert st["dataSize"] > 0 and st["indexSize"] > 0
    assert st["totalSize"] == st["storageSize"] + st["indexSize"]
    assert db.command("dbstats")["objects"] == 51


def test_index_stats_count_index_uses(db):
    db.c.create_index("a")
    db.c.insert_many([{"_id": i, "a": i, "b": i} for i in range(100)])

    def ops():
        return {d["name"]: d["accesses"]["ops"] for d in db.c.aggregate([{"$indexStats": {}}])}

    assert ops() == {"_id_": 0, "a_1": 0}
    assert len(list(db.c.find({"a": 3}))) == 1
    assert len(list(db.c.find({"a": {"$gte": 10}}).batch_size(5))) == 90  # getMores: one use
    assert db.c.count_documents({"a": {"$lt": 5}}) == 5
    assert list(db.c.aggregate([{"$match": {"a": 7}}]))[0]["_id"] == 7
    assert db.c.update_one({"a": 8}, {"$set": {"b": 0}}).modified_count == 1
    assert ops() == {"_id_": 0, "a_1": 5}
    # A collection scan uses no index; an _id lookup uses _id_.
    assert len(list(db.c.find({"b": 3}))) == 1
    assert db.c.find_one({"_id": 4})["a"] == 4
    # explain without execution does not count (MongoDB's queryPlanner).
    db.command({"explain": {"find": "c", "filter": {"a": 1}}, "verbosity": "queryPlanner"})
    assert ops() == {"_id_": 1, "a_1": 5}
    assert all(isinstance(d["accesses"]["since"], datetime.datetime)
               for d in db.c.aggregate([{"$indexStats": {}}]))


def test_validate(db):
    db.c.create_index("a")
    db.c.insert_many([{"a": i % 5} for i in range(100)])
    v = db.command("validate", "c")
    assert v["valid"] is True and v["errors"] == [] and v["warnings"] == []
    assert v["nrecords"] == 100 and v["nIndexes"] == 2
    assert v["keysPerIndex"] == {"_id_": 100, "a_1": 100}
    assert db.command({"validate": "c", "full": True})["valid"] is True
    with pytest.raises(OperationFailure) as e:
        db.command("validate", "missing")
    assert e.value.code == 26


def running_count(server, db, duet):
    """Start a slow count on another connection; returns (thread, result box)."""
    other = server.client()
    box = {}

    def run():
        try:
            box["reply"] = other[db.name].command(
                {"count": "c", "query": {"a": {"$gte": 0}}, "$duet": duet})
        except OperationFailure as e:
            box["error"] = e
        finally:
            other.close()

    t = threading.Thread(target=run)
    t.start()
    return t, box


def wait_for_op(client, pred, what):
    """The first op `pred` accepts once its read has started: an op shows in
    currentOp from the moment its command is registered, and gains its
    `duet` section (strategy, snapshot) and plan only when its read has
    chosen what it runs on, a moment later."""
    deadline = time.time() + 10
    while time.time() < deadline:
        ops = [
            o
            for o in client.admin.command("currentOp")["inprog"]
            if pred(o) and "duet" in o
        ]
        if ops:
            return ops[0]
        time.sleep(0.02)
    pytest.fail(f"{what} never showed in currentOp")


def test_current_op_shows_plan_and_strategy_and_kill_op_stops_it(server, client, db):
    db.c.create_index("a")
    db.c.insert_many([{"_id": i, "a": i} for i in range(DOCS)])
    t, box = running_count(server, db, {"snapshot": "vls", "workNsPerDoc": NS})
    op = wait_for_op(client, lambda o: o.get("command", {}).get("count") == "c", "the count")
    assert op["ns"] == f"{db.name}.c"
    assert op["planSummary"] == "IXSCAN { a: 1 }"
    assert op["duet"]["strategy"] == "vls"
    assert op["duet"]["oldVersionsHeld"] >= 0
    assert isinstance(op["secs_running"], int) and op["opid"] > 0
    # The stage lists it too.
    staged = list(client.admin.aggregate([{"$currentOp": {}}, {"$match": {"opid": op["opid"]}}]))
    assert len(staged) == 1 and staged[0]["planSummary"] == "IXSCAN { a: 1 }"
    assert client.admin.command("killOp", op=op["opid"])["ok"] == 1.0
    t.join(timeout=10)
    assert not t.is_alive()
    assert box["error"].code == 11601


def test_current_op_of_a_held_snapshot_reports_cow(server, client, db):
    db.c.insert_many([{"_id": i, "a": i} for i in range(DOCS)])
    db.command({"createSnapshot": "old"})
    db.c.update_many({"_id": {"$lt": 100}}, {"$set": {"a": -1}})
    t, box = running_count(server, db, {"snapshotName": "old", "workNsPerDoc": NS})
    try:
        op = wait_for_op(client, lambda o: o.get("command", {}).get("count") == "c", "the count")
        assert op["duet"]["strategy"] == "cow"
        assert op["duet"]["oldVersionsHeld"] == 100
        assert op["planSummary"] == "COLLSCAN"
    finally:
        client.admin.command("killOp", op=op["opid"])
        t.join(timeout=10)
    db.command({"dropSnapshot": "old"})


def test_top_get_log_host_info(client, db):
    db.c.insert_one({"a": 1})
    db.c.find_one()
    top = client.admin.command("top")["totals"]
    mine = top[f"{db.name}.c"]
    assert mine["insert"]["count"] >= 1 and mine["queries"]["count"] >= 1
    assert mine["total"]["time"] >= 0
    log = client.admin.command({"getLog": "global"})
    assert log["totalLinesWritten"] >= 1 and len(log["log"]) >= 1
    json.loads(log["log"][-1])
    assert client.admin.command({"getLog": "*"})["names"] == ["global", "startupWarnings"]
    hi = client.admin.command("hostInfo")
    assert hi["system"]["memSizeMB"] > 0 and hi["os"]["type"]


def test_get_and_set_parameter(client):
    r = client.admin.command({"getParameter": {"showDetails": True}, "slowOpThresholdMs": 1})
    assert r["slowOpThresholdMs"]["settableAtRuntime"] is True
    before = r["slowOpThresholdMs"]["value"]
    r = client.admin.command({"setParameter": 1, "slowOpThresholdMs": 250})
    assert r["was"] == before
    assert client.admin.command({"getParameter": 1, "slowOpThresholdMs": 1})["slowOpThresholdMs"] == 250
    client.admin.command({"setParameter": 1, "slowOpThresholdMs": before})
    every = client.admin.command({"getParameter": {"allParameters": True, "showDetails": True}})
    assert every["maxBsonObjectSize"]["settableAtRuntime"] is False
    with pytest.raises(OperationFailure) as e:
        client.admin.command({"setParameter": 1, "maxBsonObjectSize": 5})
    assert "at runtime" in str(e.value)
    with pytest.raises(OperationFailure) as e:
        client.admin.command({"setParameter": 1, "noSuchKnob": 5})
    assert e.value.code == 72
    old = client.admin.command({"getParameter": 1, "allowDiskUseByDefault": 1})["allowDiskUseByDefault"]
    client.admin.command({"setParameter": 1, "allowDiskUseByDefault": False})
    assert client.admin.command({"getParameter": 1, "allowDiskUseByDefault": 1})["allowDiskUseByDefault"] is False
    client.admin.command({"setParameter": 1, "allowDiskUseByDefault": old})


def test_replica_set_commands(client, make_server):
    st = client.admin.command("replSetGetStatus")
    assert st["set"] == "duet" and st["myState"] == 1
    assert st["members"][0]["stateStr"] == "PRIMARY" and st["members"][0]["self"] is True
    cfg = client.admin.command("replSetGetConfig")["config"]
    assert cfg["_id"] == "duet" and len(cfg["members"]) == 1
    standalone = make_server("--standalone")
    with standalone.client() as c:
        with pytest.raises(OperationFailure) as e:
            c.admin.command("replSetGetStatus")
        assert e.value.code == 76


def test_fsync_lock_makes_writes_wait(server, client, db):
    db.c.insert_one({"_id": 0})
    r = client.admin.command("fsync", lock=True)
    assert r["lockCount"] == 1 and r["numFiles"] >= 1
    try:
        # A write waits (bounded here by its maxTimeMS) ...
        with pytest.raises(ExecutionTimeout):
            db.command({"insert": "c", "documents": [{"_id": 1}], "maxTimeMS": 300})
        # ... reads do not.
        assert db.c.count_documents({}) == 1
        done = threading.Event()
        other = server.client()

        def write():
            other[db.name].c.insert_one({"_id": 2})
            done.set()

        t = threading.Thread(target=write)
        t.start()
        assert not done.wait(0.5), "a write went through the fsync lock"
    finally:
        assert client.admin.command("fsyncUnlock")["lockCount"] == 0
    t.join(timeout=10)
    assert done.is_set()
    other.close()
    with pytest.raises(OperationFailure) as e:
        client.admin.command("fsyncUnlock")
    assert e.value.code == 125


def test_shutdown_command_stops_the_server_cleanly(make_server):
    srv = make_server()
    c = srv.client()
    c.t.c.insert_one({"a": 1})
    with pytest.raises(OperationFailure) as e:
        c.t.command("shutdown")
    assert e.value.code == 13
    try:
        c.admin.command("shutdown")
    except AutoReconnect:
        pass  # the server may close before the reply is read
    assert srv.proc.wait(timeout=15) == 0
    assert "shutdown command received" in srv.log_text()


def test_disconnects_are_not_warnings_and_slow_ops_are_logged(make_server):
    srv = make_server("--slow-ms", "5", "--enable-test-knobs")
    c = srv.client()
    c.t.c.insert_many([{"a": i} for i in range(DOCS)])
    c.t.command({"count": "c", "$duet": {"snapshot": "vls", "workNsPerDoc": 20_000}})
    c.close()
    # A client that resets its connection.
    s = socket.create_connection(("127.0.0.1", srv.port))
    s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
    s.close()
    time.sleep(0.5)
    assert srv.stop() == 0
    log = srv.log_text()
    assert " WARN " not in log, log
    assert log.count("listening on") == 1, log
    slow = [l for l in log.splitlines() if "Slow query" in l and "count" in l]
    assert slow, log
    assert "strategy=vls" in slow[0] and "plan_summary=COLLSCAN" in slow[0], slow[0]


def test_json_logs_are_one_object_per_line(make_server):
    srv = make_server("--log-format", "json", "--slow-ms", "0")
    with srv.client() as c:
        c.t.c.insert_one({"a": 1})
    assert srv.stop() == 0
    lines = [l for l in srv.log_text().splitlines() if l.startswith("{")]
    assert lines
    events = [json.loads(l) for l in lines]
    assert any(e["fields"].get("message") == "Slow query" for e in events)


def parse_metrics(text):
    """Prometheus/OpenMetrics text: {(name, frozenset(labels)): value}."""
    out = {}
    sample = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{(.*)\})? (\S+)$')
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        m = sample.match(line)
        assert m, f"unparseable metrics line: {line!r}"
        labels = frozenset(re.findall(r'(\w+)="([^"]*)"', m.group(3) or ""))
        out[(m.group(1), labels)] = float(m.group(4))
    return out


def test_metrics_endpoint_is_scraped_and_parsed(make_server):
    port = free_port()
    srv = make_server("--metrics-addr", f"127.0.0.1:{port}")
    with srv.client() as c:
        c.t.c.insert_many([{"a": i} for i in range(10)])
        c.t.c.find_one()
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
            assert r.status == 200
            assert "openmetrics-text" in r.headers["Content-Type"]
            text = r.read().decode()
    assert text.endswith("# EOF\n")
    m = parse_metrics(text)
    assert m[("duet_commands_total", frozenset({("command", "insert")}))] >= 1
    assert m[("duet_commands_total", frozenset({("command", "find")}))] >= 1
    assert ("duet_command_duration_seconds_count", frozenset({("command", "find")})) in m
    assert m[("duet_documents", frozenset({("db", "t")}))] == 10
    assert m[("duet_wal_fsyncs_total", frozenset({("db", "t")}))] >= 1
    assert m[("duet_connections_current", frozenset())] >= 1
    assert ("duet_process_resident_memory_bytes", frozenset()) in m
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(f"http://127.0.0.1:{port}/nothing", timeout=10)
    assert e.value.code == 404


def test_config_file_and_get_cmd_line_opts(tmp_path, make_server):
    conf = tmp_path / "duet.toml"
    conf.write_text('max-connections = 7\nslow_ms = 42\nport = 1\n')
    srv = make_server("--config", str(conf))
    with srv.client() as c:
        opts = c.admin.command("getCmdLineOpts")
        assert "--config" in opts["argv"]
        parsed = opts["parsed"]
        assert parsed["max-connections"] == 7 and parsed["slow-ms"] == 42
        # The command line's --port overrides the file's.
        assert parsed["port"] == srv.port
        assert c.admin.command({"getParameter": 1, "slowOpThresholdMs": 1})["slowOpThresholdMs"] == 42


def test_config_file_with_an_unknown_key_is_refused(tmp_path):
    conf = tmp_path / "duet.toml"
    conf.write_text('max-conections = 7\n')
    r = subprocess.run([str(DUET), "serve", "--config", str(conf), "--data-dir",
                        str(tmp_path / "d"), "--port", "0"],
                       capture_output=True, text=True, timeout=30)
    assert r.returncode != 0
    assert "unknown key 'max-conections'" in r.stderr
