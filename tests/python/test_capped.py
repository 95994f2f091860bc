"""Capped collections (issue #18 item 8): create with capped/size/max,
insertion order, the oldest removed on overflow within the inserting
command (no delete change events, as MongoDB), $natural order, deletes
allowed, writes in transactions refused, listCollections and collStats
figures, the settings surviving a restart, and convertToCapped refused."""

import signal

import pytest
from pymongo.errors import OperationFailure


def ids(coll, **kw):
    return [d["_id"] for d in coll.find({}, **kw)]


def test_create_and_list(db):
    db.create_collection("c", capped=True, size=5000, max=3)
    info = db.command("listCollections", filter={"name": "c"})["cursor"]["firstBatch"][0]
    # size is rounded up to a multiple of 256, as MongoDB.
    assert info["options"] == {"capped": True, "size": 5120, "max": 3}
    assert db.c.options() == {"capped": True, "size": 5120, "max": 3}
    stats = db.command("collStats", "c")
    assert stats["capped"] is True and stats["max"] == 3 and stats["maxSize"] == 5120
    assert db.command("collStats", "c", scale=1024)["maxSize"] == 5
    db.create_collection("plain")
    stats = db.command("collStats", "plain")
    assert stats["capped"] is False and "maxSize" not in stats


def test_bad_options(db):
    for kw, code in ((dict(capped=True), 72), (dict(size=4096), 72),
                     (dict(capped=True, size=-1), 2), (dict(capped=True, size="x"), 14),
                     (dict(capped=1, size=4096), 14)):
        with pytest.raises(OperationFailure) as e:
            db.command("create", "c", **kw)
        assert e.value.code == code, kw
    assert "c" not in db.list_collection_names()
    db.create_collection("c", capped=True, size=4096)
    # A capped collection stays as made: collMod cannot change it.
    with pytest.raises(OperationFailure) as e:
        db.command("collMod", "c", capped=False)
    assert e.value.code == 115
    # Not built: refused (59 CommandNotFound), never half done.
    for cmd in ("convertToCapped", "cloneCollectionAsCapped"):
        with pytest.raises(OperationFailure) as e:
            db.command(cmd, "c", size=4096)
        assert e.value.code == 59


def test_max_keeps_the_newest_in_insertion_order(db):
    db.create_collection("c", capped=True, size=100000, max=3)
    for i in range(5):
        db.c.insert_one({"_id": 10 - i})
    assert ids(db.c) == [8, 7, 6]
    # One command inserting past the limit trims within it.
    db.c.insert_many([{"_id": 100 + i} for i in range(4)])
    assert ids(db.c) == [101, 102, 103]
    assert ids(db.c, sort=[("$natural", -1)]) == [103, 102, 101]
    assert ids(db.c, hint=[("$natural", 1)]) == [101, 102, 103]
    assert db.c.count_documents({}) == 3
    # Deletes are allowed (MongoDB 5.0+).
    db.c.delete_one({"_id": 102})
    assert ids(db.c) == [101, 103]
    # An upsert inserts (and trims) too.
    db.c.update_one({"_id": 200}, {"$set": {"x": 1}}, upsert=True)
    db.c.update_one({"_id": 201}, {"$set": {"x": 1}}, upsert=True)
    assert ids(db.c) == [103, 200, 201]


def test_size_bounds_the_bytes(db):
    db.create_collection("c", capped=True, size=4096)
    pad = "x" * 1000
    for i in range(20):
        db.c.insert_one({"_id": i, "pad": pad})
    stats = db.command("collStats", "c")
    assert stats["size"] <= 4096
    kept = ids(db.c)
    assert kept == list(range(20 - len(kept), 20)) and 1 <= len(kept) < 5


def test_no_delete_events_for_removed_documents(db):
    db.create_collection("c", capped=True, size=4096, max=2)
    with db.c.watch() as stream:
        for i in range(4):
            db.c.insert_one({"_id": i})
        seen = []
        while len(seen) < 4:
            ev = stream.try_next()
            if ev is not None:
                seen.append((ev["operationType"], ev["documentKey"]["_id"]))
        db.c.insert_one({"_id": "marker"})
        while True:
            ev = stream.try_next()
            if ev is not None:
                seen.append((ev["operationType"], ev["documentKey"]["_id"]))
                break
    assert seen == [("insert", 0), ("insert", 1), ("insert", 2), ("insert", 3),
                    ("insert", "marker")]
    assert ids(db.c) == [3, "marker"]


def test_writes_in_transactions_are_refused(db):
    db.create_collection("c", capped=True, size=4096)
    with db.client.start_session() as s:
        s.start_transaction()
        with pytest.raises(OperationFailure) as e:
            db.c.insert_one({"_id": 1}, session=s)
        assert e.value.code == 263
        s.abort_transaction()
    assert db.c.count_documents({}) == 0


def test_capped_survives_restart(make_server):
    srv = make_server()
    c = srv.client()
    c.v.create_collection("c", capped=True, size=4096, max=2)
    for i in range(3):
        c.v.c.insert_one({"_id": i})
    c.close()
    # Killed: the WAL replay trims as the writer did.
    srv.stop(sig=signal.SIGKILL)
    srv = make_server()
    c = srv.client()
    assert c.v.c.options() == {"capped": True, "size": 4096, "max": 2}
    assert ids(c.v.c) == [1, 2]
    c.v.c.insert_one({"_id": 3})
    # A checkpoint (fsync) and a clean stop: the image carries the options.
    c.admin.command("fsync")
    c.close()
    assert srv.stop() == 0
    srv = make_server()
    c = srv.client()
    assert ids(c.v.c) == [2, 3]
    c.v.c.insert_one({"_id": 4})
    assert ids(c.v.c) == [3, 4]
    c.close()
    assert srv.stop() == 0
