"""Server-side cursors: batches, getMore, killCursors, limits, idle timeout, snapshot per cursor."""

import time

import pytest
from bson import Int64
from pymongo.errors import CursorNotFound, OperationFailure


def test_many_batches(db):
    db.c.insert_many([{"_id": i, "pad": "x" * 100} for i in range(2500)])
    seen = [d["_id"] for d in db.c.find({}, batch_size=7).sort("_id", 1)]
    assert seen == list(range(2500))
    r = db.command({"find": "c", "batchSize": 0})
    assert r["cursor"]["firstBatch"] == [] and r["cursor"]["id"] != 0
    cid = r["cursor"]["id"]
    total = 0
    while cid:
        m = db.command({"getMore": cid, "collection": "c", "batchSize": 1000})
        assert len(m["cursor"]["nextBatch"]) <= 1000
        total += len(m["cursor"]["nextBatch"])
        cid = m["cursor"]["id"]
    assert total == 2500


def test_limit_single_batch_and_default_batch(db):
    db.c.insert_many([{"i": i} for i in range(300)])
    r = db.command({"find": "c"})
    assert len(r["cursor"]["firstBatch"]) == 101 and r["cursor"]["id"] != 0
    db.command({"killCursors": "c", "cursors": [r["cursor"]["id"]]})
    r = db.command({"find": "c", "limit": 5, "batchSize": 2})
    got = len(r["cursor"]["firstBatch"])
    cid = r["cursor"]["id"]
    while cid:
        m = db.command({"getMore": cid, "collection": "c"})
        got += len(m["cursor"]["nextBatch"])
        cid = m["cursor"]["id"]
    assert got == 5
    r = db.command({"find": "c", "batchSize": 3, "singleBatch": True})
    assert len(r["cursor"]["firstBatch"]) == 3 and r["cursor"]["id"] == 0
    assert len(list(db.c.find().limit(-4))) == 4


def test_fractional_skip_limit_and_batch_size_truncate_as_mongodb(db):
    # skip, limit and batchSize are IDL safeInt64 fields: MongoDB truncates
    # a fraction toward zero instead of refusing it.
    db.c.insert_many([{"i": i} for i in range(10)])
    r = db.command({"find": "c", "batchSize": 2.7, "sort": {"i": 1}})
    assert len(r["cursor"]["firstBatch"]) == 2
    m = db.command({"getMore": r["cursor"]["id"], "collection": "c", "batchSize": 3.9})
    assert [d["i"] for d in m["cursor"]["nextBatch"]] == [2, 3, 4]
    r = db.command({"find": "c", "skip": 2.5, "limit": 3.5, "sort": {"i": 1}})
    assert [d["i"] for d in r["cursor"]["firstBatch"]] == [2, 3, 4]
    r = db.command({"aggregate": "c", "pipeline": [], "cursor": {"batchSize": 1.5}})
    assert len(r["cursor"]["firstBatch"]) == 1
    # -0.5 truncates to 0, which passes the `>= 0` check.
    r = db.command({"aggregate": "c", "pipeline": [], "cursor": {"batchSize": -0.5}})
    assert r["cursor"]["firstBatch"] == []
    assert db.command({"count": "c", "limit": 4.2})["n"] == 4
    with pytest.raises(OperationFailure) as e:
        db.command({"find": "c", "batchSize": -1.5})
    assert e.value.code == 51024


def test_kill_cursors_and_not_found(db):
    db.c.insert_many([{"i": i} for i in range(50)])
    r = db.command({"find": "c", "batchSize": 1})
    cid = r["cursor"]["id"]
    k = db.command({"killCursors": "c", "cursors": [cid, Int64(424242)]})
    assert k["cursorsKilled"] == [cid] and k["cursorsNotFound"] == [424242]
    with pytest.raises(OperationFailure) as e:
        db.command({"getMore": cid, "collection": "c"})
    assert e.value.code == 43
    cur = db.c.find({}, batch_size=2)
    next(cur)
    cur.close()


def test_getmore_wrong_collection(db):
    db.c.insert_many([{"i": i} for i in range(10)])
    cid = db.command({"find": "c", "batchSize": 1})["cursor"]["id"]
    with pytest.raises(OperationFailure) as e:
        db.command({"getMore": cid, "collection": "other"})
    assert e.value.code == 13
    assert db.command({"getMore": cid, "collection": "c"})["ok"] == 1.0


def test_cursor_keeps_its_snapshot(db):
    db.c.insert_many([{"_id": i, "v": 0} for i in range(500)])
    cur = db.c.find({}, batch_size=50).sort("_id", 1)
    first = [next(cur) for _ in range(50)]
    db.c.update_many({}, {"$set": {"v": 1}})
    db.c.delete_many({"_id": {"$gte": 400}})
    rest = list(cur)
    assert len(first) + len(rest) == 500
    assert all(d["v"] == 0 for d in first + rest)


def test_idle_cursor_times_out(db):
    # The session server runs with --cursor-timeout-secs 3.
    db.c.insert_many([{"i": i} for i in range(20)])
    cid = db.command({"find": "c", "batchSize": 1})["cursor"]["id"]
    time.sleep(4.5)
    with pytest.raises(OperationFailure) as e:
        db.command({"getMore": cid, "collection": "c"})
    assert e.value.code == 43
    _ = CursorNotFound
