"""Reads under limits through the real `duet serve` binary (issue #14, items
9 and 12): `maxTimeMS` and `killOp` stop the work (not only the client's
wait), and a blocking sort over `--query-memory-limit-bytes` fails with 292
under `allowDiskUse: false` or spills into `<data dir>/<db>/spill` (0700,
no file left behind); so does a `$group` (issue #17)."""

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
    # Aggregate: $sort spills or refuses.
    with pytest.raises(OperationFailure) as e:
        list(db.c.aggregate([{"$sort": {"pad": 1, "k": -1}}], allowDiskUse=False))
    assert e.value.code == 292
    assert len(list(db.c.aggregate([{"$sort": {"pad": 1, "k": -1}}]))) == 5_000
    if spill.exists():
        assert list(spill.iterdir()) == []


def test_group_spills_with_allow_disk_use(make_server, tmp_path):
    srv = make_server("--query-memory-limit-bytes", "65536")
    c = srv.client()
    db = c.limits
    load(db.c, 5_000)
    # One group per document: the state passes 64 KiB many times over.
    per_doc = [{"$group": {"_id": "$_id", "p": {"$push": "$pad"}, "k": {"$sum": "$k"}}}]
    with pytest.raises(OperationFailure) as e:
        list(db.c.aggregate(per_doc, allowDiskUse=False))
    assert e.value.code == 292
    assert e.value.details["codeName"] == "QueryExceededMemoryLimitNoDiskUseAllowed"
    got = sorted(db.c.aggregate(per_doc, allowDiskUse=True), key=lambda d: d["_id"])
    assert got == [{"_id": i, "p": ["p" * 40], "k": (i * 7919) % 1000} for i in range(5_000)]
    # Order-dependent accumulators answer as in memory: input order is _id order here.
    ordered = [
        {"$sort": {"_id": 1}},
        {"$group": {
            "_id": "$k",
            "first": {"$first": "$_id"}, "last": {"$last": "$_id"},
            "ids": {"$push": "$_id"}, "n": {"$count": {}},
            "last2": {"$lastN": {"input": "$_id", "n": 2}},
            "pad": {"$push": "$pad"},
        }},
        {"$sort": {"_id": 1}},
    ]
    want = {}
    for i in range(5_000):
        want.setdefault((i * 7919) % 1000, []).append(i)
    got = list(db.c.aggregate(ordered, allowDiskUse=True))
    assert [d["_id"] for d in got] == sorted(want)
    for d in got:
        ids = want[d["_id"]]
        assert (d["first"], d["last"], d["ids"], d["n"], d["last2"]) == (ids[0], ids[-1], ids, len(ids), ids[-2:])
    # explain executionStats says the $group used the disk.
    out = db.command(
        "explain",
        {"aggregate": "c", "pipeline": per_doc, "cursor": {}, "allowDiskUse": True},
        verbosity="executionStats",
    )
    group = [s for s in out["stages"] if "$group" in s]
    assert group and group[0]["usedDisk"] is True and group[0]["spills"] > 0, out
    spill = tmp_path / "data" / "limits" / "spill"
    if spill.exists():
        assert list(spill.iterdir()) == []


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


def test_bucket_auto_spills_with_allow_disk_use(make_server, tmp_path):
    srv = make_server("--query-memory-limit-bytes", "65536")
    c = srv.client()
    db = c.limits
    load(db.c, 5_000)
    stage = {"$bucketAuto": {"groupBy": "$k", "buckets": 4,
                             "output": {"n": {"$sum": 1}, "first": {"$first": "$_id"}}}}
    with pytest.raises(OperationFailure) as e:
        list(db.c.aggregate([stage], allowDiskUse=False))
    assert e.value.code == 292
    got = list(db.c.aggregate([{"$sort": {"_id": 1}}, stage], allowDiskUse=True))
    # k = i * 7919 % 1000 takes each value 0..999 five times: four buckets of 250 values.
    assert [d["_id"] for d in got] == [
        {"min": 0, "max": 250}, {"min": 250, "max": 500}, {"min": 500, "max": 750}, {"min": 750, "max": 999},
    ]
    assert [d["n"] for d in got] == [1250] * 4
    first_of = {}
    for i in range(5_000):
        first_of.setdefault((i * 7919) % 1000, i)
    assert [d["first"] for d in got] == [first_of[0], first_of[250], first_of[500], first_of[750]]
    spill = tmp_path / "data" / "limits" / "spill"
    if spill.exists():
        assert list(spill.iterdir()) == []


def test_set_window_fields_spills_by_partition(make_server, tmp_path):
    srv = make_server("--query-memory-limit-bytes", "65536")
    c = srv.client()
    db = c.limits
    load(db.c, 5_000)
    stage = {"$setWindowFields": {
        "partitionBy": {"$mod": ["$k", 100]},
        "sortBy": {"_id": 1},
        "output": {"n": {"$documentNumber": {}}, "run": {"$sum": "$k", "window": {"documents": ["unbounded", "current"]}}},
    }}
    with pytest.raises(OperationFailure) as e:
        list(db.c.aggregate([stage], allowDiskUse=False))
    assert e.value.code == 292
    got = list(db.c.aggregate([stage, {"$project": {"pad": 0}}], allowDiskUse=True))
    assert len(got) == 5_000
    by_id = {d["_id"]: d for d in got}
    seen = {}
    for i in range(5_000):
        k = (i * 7919) % 1000
        n, run = seen.get(k % 100, (0, 0))
        seen[k % 100] = (n + 1, run + k)
        assert (by_id[i]["n"], by_id[i]["run"]) == (n + 1, run + k)
    # Partitions in partition order, each in _id order.
    keys = [((d["k"] % 100), d["_id"]) for d in got]
    assert keys == sorted(keys)
    # Each partition fits in memory: the input's sort spilled, no partition did.
    plan = db.command("explain", {"aggregate": "c", "pipeline": [stage], "cursor": {}, "allowDiskUse": True},
                      verbosity="executionStats")
    windows = [s for s in plan["stages"] if "$setWindowFields" in s]
    assert windows and windows[0]["usedDisk"] is False and windows[0]["spills"] == 0, plan
    # One partition bigger than the limit: spooled to disk with disk use
    # (bounded, unbounded and shifted windows read it by position), 292 without.
    whole = {"$setWindowFields": {"sortBy": {"_id": 1}, "output": {
        "n": {"$documentNumber": {}},
        "near": {"$sum": "$k", "window": {"documents": [-1, 1]}},
        "top": {"$max": "$k", "window": {"documents": ["unbounded", "unbounded"]}},
        "prev": {"$shift": {"output": "$k", "by": -1, "default": -1}},
    }}}
    with pytest.raises(OperationFailure) as e:
        list(db.c.aggregate([whole], allowDiskUse=False))
    assert e.value.code == 292
    got = list(db.c.aggregate([whole, {"$project": {"pad": 0}}], allowDiskUse=True))
    ks = [(i * 7919) % 1000 for i in range(5_000)]
    assert [d["_id"] for d in got] == list(range(5_000))
    for i, d in enumerate(got):
        near = sum(ks[max(0, i - 1):i + 2])
        prev = ks[i - 1] if i else -1
        assert (d["n"], d["near"], d["top"], d["prev"]) == (i + 1, near, 999, prev), d
    plan = db.command("explain", {"aggregate": "c", "pipeline": [whole], "cursor": {}, "allowDiskUse": True},
                      verbosity="executionStats")
    windows = [s for s in plan["stages"] if "$setWindowFields" in s]
    assert windows and windows[0]["usedDisk"] is True and windows[0]["spills"] > 0, plan
    spill = tmp_path / "data" / "limits" / "spill"
    if spill.exists():
        assert list(spill.iterdir()) == []


def test_densify_streams_with_allow_disk_use(make_server, tmp_path):
    """$densify sorts its input through the sorter (spilled with allowDiskUse,
    292 without) and densifies the sorted stream."""
    srv = make_server("--query-memory-limit-bytes", "65536")
    c = srv.client()
    db = c.limits
    load(db.c, 5_000)
    stage = {"$densify": {"field": "k", "range": {"step": 0.5, "bounds": "full"}}}
    with pytest.raises(OperationFailure) as e:
        list(db.c.aggregate([stage], allowDiskUse=False))
    assert e.value.code == 292
    got = list(db.c.aggregate([stage, {"$project": {"pad": 0}}], allowDiskUse=True))
    # k takes each value 0..999 five times: 999 half steps are generated.
    assert len(got) == 5_000 + 999
    assert [d["k"] for d in got] == sorted(d["k"] for d in got)
    made = [d["k"] for d in got if "_id" not in d]
    assert made == [k + 0.5 for k in range(999)]
    spill = tmp_path / "data" / "limits" / "spill"
    if spill.exists():
        assert list(spill.iterdir()) == []


def test_sample_spills_with_allow_disk_use(make_server, tmp_path):
    """$sample draws through a sorter on random keys (as MongoDB's): a sample
    bigger than the memory limit spills with allowDiskUse, 292 without."""
    srv = make_server("--query-memory-limit-bytes", "65536")
    c = srv.client()
    db = c.limits
    load(db.c, 5_000)
    stage = {"$sample": {"size": 2_000}}
    with pytest.raises(OperationFailure) as e:
        list(db.c.aggregate([stage], allowDiskUse=False))
    assert e.value.code == 292
    got = list(db.c.aggregate([stage], allowDiskUse=True))
    ids = [d["_id"] for d in got]
    assert len(ids) == 2_000 and len(set(ids)) == 2_000
    assert set(ids) <= set(range(5_000))
    # Random order, not the scan's: 2,000 ascending ids would be a sort.
    assert ids != sorted(ids)
    # A small sample stays in memory either way.
    assert len(list(db.c.aggregate([{"$sample": {"size": 5}}], allowDiskUse=False))) == 5
    spill = tmp_path / "data" / "limits" / "spill"
    if spill.exists():
        assert list(spill.iterdir()) == []


def test_text_search_is_bounded_like_a_sort(make_server, tmp_path):
    """Issue #18: a `$text` read over many matches streams (a cursor pulls
    them in batches; a limit reads only what it returns) and a sort by
    `{$meta: "textScore"}`, in find or aggregate, is held under
    `--query-memory-limit-bytes` like any sort: 292 without disk use,
    spilled with it."""
    srv = make_server("--query-memory-limit-bytes", "65536")
    c = srv.client()
    db = c.limits
    n = 3_000
    db.t.insert_many(
        [{"_id": i, "body": " ".join(["coffee"] * (i % 3 + 1)) + " " + "p" * 100} for i in range(n)]
    )
    db.t.create_index([("body", "text")])
    q = {"$text": {"$search": "coffee"}}
    score = {"s": {"$meta": "textScore"}}
    want = sorted(range(n), key=lambda i: -(i % 3))
    # Unsorted: streamed in batches through getMore.
    cur = db.t.find(q, {"_id": 1}, batch_size=100)
    assert [d["_id"] for d in cur] == list(range(n))
    assert [d["_id"] for d in db.t.find(q, limit=5)] == [0, 1, 2, 3, 4]
    # Sorted by score: bounded like a sort.
    with pytest.raises(OperationFailure) as e:
        list(db.t.find(q, score, sort=[("s", {"$meta": "textScore"})], allow_disk_use=False))
    assert e.value.code == 292
    runs = c.admin.command("serverStatus")["duet"]["spill"]["runs"]
    got = list(db.t.find(q, score, sort=[("s", {"$meta": "textScore"})], allow_disk_use=True))
    assert [d["_id"] for d in got] == want
    assert got[0]["s"] > got[-1]["s"]
    assert c.admin.command("serverStatus")["duet"]["spill"]["runs"] > runs
    top = list(db.t.find(q, score, sort=[("s", {"$meta": "textScore"})], limit=7, allow_disk_use=False))
    assert [d["_id"] for d in top] == want[:7]
    pipeline = [{"$match": q}, {"$sort": score}, {"$project": {"_id": 1}}]
    with pytest.raises(OperationFailure) as e:
        list(db.t.aggregate(pipeline, allowDiskUse=False))
    assert e.value.code == 292
    assert [d["_id"] for d in db.t.aggregate(pipeline, allowDiskUse=True)] == want
    assert [d["_id"] for d in db.t.aggregate([{"$match": q}, {"$limit": 3}])] == [0, 1, 2]
