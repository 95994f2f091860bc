"""Reads under limits through the real `duet serve` binary (issue #14, items
9 and 12): `maxTimeMS` and `killOp` stop the work (not only the client's
wait), and a blocking sort over `--query-memory-limit-bytes` fails with 292
under `allowDiskUse: false` or spills into `<data dir>/<db>/spill` (0700,
no file left behind)."""

import os
import stat
import threading
import time

import pytest
from pymongo.errors import ExecutionTimeout, OperationFailure

SLOW = {"$duet": {"workNsPerDoc": 1_000_000}}  # 1 ms per document


def load(coll, n):
    coll.insert_many([{"_id": i, "k": (i * 7919) % 1000, "pad": "p" * 40} for i in range(n)])


def in_flight(client):
    ops = client.admin.command("currentOp")["inprog"]
    return [op for op in ops if "currentOp" not in op.get("command", {})]


def test_max_time_ms_stops_the_work(make_server):
    srv = make_server("--enable-test-knobs")
    c = srv.client()
    db = c.limits
    load(db.c, 20_000)
    with pytest.raises(ExecutionTimeout) as e:
        db.command({"count": "c", "query": {}, **SLOW}, maxTimeMS=100)
    assert e.value.code == 50
    # The reply came after the count's work ended: nothing is left running.
    assert in_flight(c) == []
    ops = c.admin.command("serverStatus")["duet"]["operations"]
    assert ops["finishedAfterCancel"] >= 1


def test_kill_op_interrupts_a_running_count(make_server):
    srv = make_server("--enable-test-knobs")
    c = srv.client()
    db = c.limits
    load(db.c, 20_000)
    result = {}

    def run():
        try:
            db.command({"count": "c", "query": {}, **SLOW})
        except OperationFailure as e:
            result["code"] = e.code

    t = threading.Thread(target=run)
    t.start()
    deadline = time.time() + 10
    ops = []
    while time.time() < deadline and not ops:
        ops = [op for op in in_flight(c) if op.get("command", {}).get("count") == "c"]
        time.sleep(0.02)
    assert ops, "the count never showed in currentOp"
    assert ops[0]["ns"] == "limits.c"
    assert c.admin.command("killOp", op=ops[0]["opid"])["info"] == "attempting to kill op"
    t.join(timeout=10)
    assert not t.is_alive()
    assert result.get("code") == 11601
    assert in_flight(c) == []


def test_sort_memory_limit_spill_directory(make_server, tmp_path):
    srv = make_server("--query-memory-limit-bytes", "65536")
    c = srv.client()
    db = c.limits
    load(db.c, 5_000)
    params = c.admin.command("getParameter", 1, internalQueryMaxBlockingSortMemoryUsageBytes=1)
    assert params["internalQueryMaxBlockingSortMemoryUsageBytes"] == 65536
    with pytest.raises(OperationFailure) as e:
        list(db.c.find({}, sort=[("pad", 1), ("k", -1)], allow_disk_use=False))
    assert e.value.code == 292
    assert e.value.details["codeName"] == "QueryExceededMemoryLimitNoDiskUseAllowed"
    got = [d["_id"] for d in db.c.find({}, sort=[("pad", 1), ("k", -1), ("_id", 1)])]
    want = [i for _, i in sorted(((-((i * 7919) % 1000), i) for i in range(5_000)))]
    assert got == want
    assert c.admin.command("serverStatus")["duet"]["spill"]["runs"] > 0
    spill = tmp_path / "data" / "limits" / "spill"
    if spill.exists():
        assert stat.S_IMODE(os.stat(spill).st_mode) == 0o700
        assert list(spill.iterdir()) == []
    # Aggregate: $sort spills or refuses; $group refuses whatever allowDiskUse says.
    with pytest.raises(OperationFailure) as e:
        list(db.c.aggregate([{"$sort": {"pad": 1, "k": -1}}], allowDiskUse=False))
    assert e.value.code == 292
    assert len(list(db.c.aggregate([{"$sort": {"pad": 1, "k": -1}}]))) == 5_000
    with pytest.raises(OperationFailure) as e:
        list(db.c.aggregate([{"$group": {"_id": "$_id", "p": {"$push": "$pad"}}}], allowDiskUse=True))
    assert e.value.code == 292


def test_disk_use_can_be_off_by_default(make_server):
    srv = make_server("--query-memory-limit-bytes", "65536", "--allow-disk-use-by-default", "false")
    c = srv.client()
    db = c.limits
    load(db.c, 5_000)
    assert c.admin.command("getParameter", 1, allowDiskUseByDefault=1)["allowDiskUseByDefault"] is False
    with pytest.raises(OperationFailure) as e:
        list(db.c.find({}, sort=[("pad", 1)]))
    assert e.value.code == 292
    assert len(list(db.c.find({}, sort=[("pad", 1)], allow_disk_use=True))) == 5_000
