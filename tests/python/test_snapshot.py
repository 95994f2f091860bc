"""readConcern snapshot: consistent counts under concurrent updates, atClusterTime round trips."""

import threading

import pytest
from bson import Timestamp
from pymongo.errors import OperationFailure


def test_snapshot_count_stays_exact_under_updates(server, db):
    n = 2000
    db.c.insert_many([{"_id": i, "open": True} for i in range(n)])
    writer_client = server.client()
    stop = threading.Event()
    flips = [0]

    def writer():
        coll = writer_client[db.name].c
        i = 0
        while not stop.is_set():
            coll.update_one({"_id": i % n}, {"$set": {"open": False}})
            coll.insert_one({"open": True, "extra": i})
            flips[0] += 1
            i += 1

    t = threading.Thread(target=writer)
    t.start()
    try:
        with db.client.start_session(snapshot=True) as s:
            first = list(db.c.aggregate([{"$match": {"open": True}}, {"$count": "n"}], session=s))
            total = db.c.count_documents({}, session=s)
            for _ in range(10):
                again = list(db.c.aggregate([{"$match": {"open": True}}, {"$count": "n"}], session=s))
                assert again == first
                assert db.c.count_documents({}, session=s) == total
                assert len(list(db.c.find({}, {"_id": 1}, session=s, batch_size=100))) == total
                assert len(db.c.distinct("_id", session=s)) == total
    finally:
        stop.set()
        t.join()
        writer_client.close()
    assert flips[0] > 0
    assert db.c.count_documents({}) == n + flips[0]


def test_at_cluster_time_round_trip(db):
    db.c.insert_many([{"i": i} for i in range(10)])
    r = db.command({"find": "c", "readConcern": {"level": "snapshot"}})
    ts = r["cursor"]["atClusterTime"]
    assert isinstance(ts, Timestamp)
    db.c.insert_many([{"i": i} for i in range(10)])
    r2 = db.command({"aggregate": "c", "pipeline": [{"$count": "n"}], "cursor": {},
                     "readConcern": {"level": "snapshot", "atClusterTime": ts}})
    assert r2["cursor"]["firstBatch"] == [{"n": 10}]
    assert r2["cursor"]["atClusterTime"] == ts
    d = db.command({"distinct": "c", "key": "i", "readConcern": {"level": "snapshot", "atClusterTime": ts}})
    assert d["values"] == list(range(10)) and d["atClusterTime"] == ts
    live = db.command({"count": "c"})
    assert live["n"] == 20


def test_unknown_or_future_cluster_time_is_refused(db):
    db.c.insert_one({})
    with pytest.raises(OperationFailure) as e:
        # A time after everything the database has reached (atClusterTime is a
        # cluster time: just after a state's last commit).
        db.command({"find": "c", "readConcern": {"level": "snapshot", "atClusterTime": Timestamp(4294967295, 1)}})
    assert e.value.code == 2
    with pytest.raises(OperationFailure) as e:
        db.command({"find": "c", "readConcern": {"level": "snapshot", "atClusterTime": Timestamp(0, 1)}})
    assert e.value.code == 239
    with pytest.raises(OperationFailure) as e:
        db.command({"count": "c", "readConcern": {"level": "snapshot"}})
    assert e.value.code == 72


def test_duet_snapshot_strategies_stay_exact_under_updates(server, db):
    """`$duet: {snapshot: vls|cow}` scans see exactly one state while another client
    moves documents; each result is internally consistent (a transfer keeps the sum)."""
    n = 3000
    db.acct.insert_many([{"_id": i, "bal": 100} for i in range(n)])
    db.acct.create_index("bal")
    writer_client = server.client()
    stop = threading.Event()
    moves = [0]

    def writer():
        coll = writer_client[db.name].acct
        i = 0
        while not stop.is_set():
            a, b = i % n, (i * 7 + 1) % n
            if a != b:
                # One command changing two documents: both or neither are visible.
                coll.update_many({"_id": {"$in": [a, b]}}, {"$inc": {"bal": 0, "moves": 1}})
            i += 1
            moves[0] += 1

    t = threading.Thread(target=writer)
    t.start()
    try:
        for strategy in ["vls", "olcp", "cow", "auto"]:
            for _ in range(5):
                docs = db.command({"find": "acct", "filter": {"bal": {"$gte": 0}}, "batchSize": 10**6,
                                   "$duet": {"snapshot": strategy}})["cursor"]["firstBatch"]
                assert len(docs) == n, strategy
                assert sum(d.get("moves", 0) for d in docs) % 2 == 0, strategy
                c = db.command({"count": "acct", "query": {"bal": {"$gte": 0}}, "$duet": {"snapshot": strategy}})
                assert c["n"] == n
        # `none` is accepted too (no guarantee, the baseline).
        db.command({"find": "acct", "filter": {}, "$duet": {"snapshot": "none"}})
    finally:
        stop.set()
        t.join()
        writer_client.close()
    assert moves[0] > 0


def test_named_snapshots_over_the_wire(db):
    db.ns.insert_many([{"_id": i, "v": 0} for i in range(50)])
    r = db.command({"createSnapshot": "before"})
    assert r["ok"] == 1.0 and r["name"] == "before"
    db.ns.update_many({}, {"$set": {"v": 1}})
    db.ns.insert_one({"_id": 99, "v": 1})
    # Reads by name see the state at creation, through find, count and aggregate.
    docs = db.command({"find": "ns", "filter": {}, "batchSize": 1000,
                       "$duet": {"snapshotName": "before"}})["cursor"]["firstBatch"]
    assert len(docs) == 50 and all(d["v"] == 0 for d in docs)
    assert db.command({"count": "ns", "query": {"v": 0}, "$duet": {"snapshotName": "before"}})["n"] == 50
    assert db.ns.count_documents({"v": 0}) == 0
    listed = db.command({"listSnapshots": 1})["snapshots"]
    assert [s["name"] for s in listed] == ["before"]
    assert listed[0]["retainedBytes"] > 0
    with pytest.raises(OperationFailure) as e:
        db.command({"createSnapshot": "before"})
    assert e.value.code == 48
    db.command({"dropSnapshot": "before"})
    with pytest.raises(OperationFailure) as e:
        db.command({"find": "ns", "filter": {}, "$duet": {"snapshotName": "before"}})
    assert e.value.code == 246
    with pytest.raises(OperationFailure) as e:
        db.command({"dropSnapshot": "before"})
    assert e.value.code == 246
    with pytest.raises(OperationFailure) as e:
        db.command({"createSnapshot": "bad name!"})
    assert e.value.code == 2
    with pytest.raises(OperationFailure) as e:
        db.command({"find": "ns", "$duet": {"snapshot": "vls", "snapshotName": "x"}})
    assert e.value.code == 2
    # A TTL'd snapshot is listed with its TTL.
    db.command({"createSnapshot": "short", "ttlSeconds": 3600, "collections": ["ns"]})
    s = db.command({"listSnapshots": 1})["snapshots"][0]
    assert s["ttlSeconds"] == 3600 and s["collections"] == ["ns"]


def test_durable_named_snapshot_survives_a_restart(make_server):
    """`createSnapshot` with `durable: true` is readable by name after a restart."""
    srv = make_server()
    c = srv.client()
    d = c.dsnap
    d.c.insert_many([{"_id": i, "v": 0} for i in range(100)])
    r = d.command({"createSnapshot": "keep", "durable": True})
    assert r["ok"] == 1.0 and r["durable"] is True
    d.command({"createSnapshot": "volatile"})
    d.command({"createSnapshot": "gone", "durable": True, "collections": ["c"]})
    d.command({"dropSnapshot": "gone"})
    d.c.update_many({}, {"$set": {"v": 1}})
    d.c.insert_one({"_id": 1000, "v": 1})
    c.close()
    assert srv.stop() == 0
    srv = make_server()
    c = srv.client()
    d = c.dsnap
    listed = {s["name"]: s for s in d.command({"listSnapshots": 1})["snapshots"]}
    assert list(listed) == ["keep"] and listed["keep"]["durable"] is True
    docs = d.command({"find": "c", "filter": {}, "batchSize": 1000,
                      "$duet": {"snapshotName": "keep"}})["cursor"]["firstBatch"]
    assert len(docs) == 100 and all(x["v"] == 0 for x in docs)
    assert d.c.count_documents({"v": 1}) == 101
    for name in ("volatile", "gone"):
        with pytest.raises(OperationFailure) as e:
            d.command({"count": "c", "$duet": {"snapshotName": name}})
        assert e.value.code == 246
    d.command({"dropSnapshot": "keep"})
    assert d.command({"listSnapshots": 1})["snapshots"] == []
    c.close()
