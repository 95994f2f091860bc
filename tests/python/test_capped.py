"""Capped collections (issue #18 item 8): create with capped/size/max,
insertion order, the oldest removed on overflow within the inserting
command (no delete change events, as MongoDB), $natural order, deletes
allowed, writes in transactions refused, listCollections and collStats
figures, the settings surviving a restart; tailable and awaitData cursors
on them; convertToCapped and cloneCollectionAsCapped."""

import signal
import threading
import time

import pytest
from pymongo import CursorType, MongoClient
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
    # A capped collection stays as made: collMod has no `capped` field
    # (MongoDB's coll_mod.idl), so it is an unknown one.
    with pytest.raises(OperationFailure) as e:
        db.command("collMod", "c", capped=False)
    assert e.value.code == 40415


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


# ------------------------------------------------------------ tailable cursors


def test_tailable_await_iterates_while_another_thread_inserts(db):
    db.create_collection("c", capped=True, size=100000)
    db.c.insert_one({"_id": 0})
    done = threading.Event()

    def writer():
        for i in range(1, 11):
            time.sleep(0.02)
            db.c.insert_one({"_id": i})
        done.set()

    t = threading.Thread(target=writer)
    cursor = db.c.find(cursor_type=CursorType.TAILABLE_AWAIT).max_await_time_ms(200)
    t.start()
    seen = []
    deadline = time.time() + 20
    while cursor.alive and len(seen) < 11 and time.time() < deadline:
        for d in cursor:
            seen.append(d["_id"])
    t.join()
    assert seen == list(range(11)), "every insert once, in insertion order"
    assert cursor.alive, "a tailable cursor stays open when it runs dry"
    cursor.close()
    # A filtered tail skips what does not match and goes on past it.
    cursor = db.c.find({"_id": {"$gte": 9}}, cursor_type=CursorType.TAILABLE_AWAIT).max_await_time_ms(50)
    assert [d["_id"] for d in cursor] == [9, 10]
    db.c.insert_many([{"_id": 11}, {"_id": -1}, {"_id": 12}])
    assert [d["_id"] for d in cursor] == [11, 12]
    cursor.close()


def test_await_data_waits_then_returns_an_empty_batch_with_the_same_id(db):
    db.create_collection("c", capped=True, size=4096)
    db.c.insert_one({"_id": 1})
    with db.client.start_session() as s:
        r = db.command("find", "c", tailable=True, awaitData=True, session=s)
        cid = r["cursor"]["id"]
        assert cid != 0 and r["cursor"]["firstBatch"] == [{"_id": 1}]
        # Nothing new: the getMore waits its maxTimeMS, then returns empty.
        r = db.command("getMore", cid, collection="c", maxTimeMS=100, session=s)
        assert r["cursor"]["nextBatch"] == [] and r["cursor"]["id"] == cid
        db.c.insert_one({"_id": 2})
        r = db.command("getMore", cid, collection="c", maxTimeMS=100, session=s)
        assert r["cursor"]["nextBatch"] == [{"_id": 2}] and r["cursor"]["id"] == cid
        db.command("killCursors", "c", cursors=[cid], session=s)
        # Without awaitData a getMore never waits, and maxTimeMS is refused.
        r = db.command("find", "c", tailable=True, session=s)
        cid = r["cursor"]["id"]
        assert cid != 0 and len(r["cursor"]["firstBatch"]) == 2
        r = db.command("getMore", cid, collection="c", session=s)
        assert r["cursor"]["nextBatch"] == [] and r["cursor"]["id"] == cid
        with pytest.raises(OperationFailure) as e:
            db.command("getMore", cid, collection="c", maxTimeMS=10, session=s)
        assert e.value.code == 2


def test_a_waiting_getmore_is_woken_by_an_insert_and_ended_by_a_kill(db):
    db.create_collection("c", capped=True, size=4096)
    db.c.insert_one({"_id": 1})
    with db.client.start_session() as s:
        cid = db.command("find", "c", tailable=True, awaitData=True,
                         session=s)["cursor"]["id"]
        out = {}

        def get_more():
            out["r"] = db.command("getMore", cid, collection="c", maxTimeMS=30000, session=s)

        t = threading.Thread(target=get_more)
        t.start()
        time.sleep(0.2)
        db.c.insert_one({"_id": 2})
        t.join(timeout=20)
        assert not t.is_alive(), "the publish woke the waiting getMore"
        assert out["r"]["cursor"]["nextBatch"] == [{"_id": 2}]
        # A killCursors ends a wait (the reply closes the cursor).
        t = threading.Thread(target=get_more)
        t.start()
        time.sleep(0.2)
        r = db.command("killCursors", "c", cursors=[cid], session=s)
        assert r["cursorsKilled"] == [cid]
        t.join(timeout=20)
        assert not t.is_alive(), "killCursors ended the wait"
        assert out["r"]["cursor"]["id"] == 0
        with pytest.raises(OperationFailure) as e:
            db.command("getMore", cid, collection="c", session=s)
        assert e.value.code == 43


def test_capped_position_lost_when_the_last_seen_document_is_trimmed(db):
    db.create_collection("c", capped=True, size=4096, max=3)
    db.c.insert_many([{"_id": i} for i in range(3)])
    with db.client.start_session() as s:
        r = db.command("find", "c", tailable=True, batchSize=2, session=s)
        cid = r["cursor"]["id"]
        assert [d["_id"] for d in r["cursor"]["firstBatch"]] == [0, 1]
        # Overflow trims 0..4; the cursor last saw 1.
        db.c.insert_many([{"_id": i} for i in range(3, 8)])
        with pytest.raises(OperationFailure) as e:
            db.command("getMore", cid, collection="c", session=s)
        assert e.value.code == 136 and e.value.details["codeName"] == "CappedPositionLost"
        # The cursor is gone.
        with pytest.raises(OperationFailure) as e:
            db.command("getMore", cid, collection="c", session=s)
        assert e.value.code == 43
        # A cursor whose position survives goes on.
        cid = db.command("find", "c", tailable=True, session=s)["cursor"]["id"]
        db.c.insert_one({"_id": 8})
        r = db.command("getMore", cid, collection="c", session=s)
        assert r["cursor"]["nextBatch"] == [{"_id": 8}]
        # A dropped collection ends its tailable cursors.
        db.c.drop()
        db.create_collection("c", capped=True, size=4096)
        db.c.insert_one({"_id": 9})
        with pytest.raises(OperationFailure) as e:
            db.command("getMore", cid, collection="c", session=s)
        assert e.value.code == 43


def test_tailable_errors_and_dead_cursors(db):
    db.create_collection("plain")
    db.plain.insert_one({"_id": 1})
    with pytest.raises(OperationFailure) as e:
        db.command("find", "plain", tailable=True)
    assert e.value.code == 2
    assert "tailable cursor requested on non capped collection" in str(e.value)
    db.create_collection("c", capped=True, size=4096)
    # An empty capped collection, or a missing one, gives no cursor (MongoDB).
    for coll in ("c", "missing"):
        r = db.command("find", coll, tailable=True, awaitData=True)
        assert r["cursor"]["id"] == 0 and r["cursor"]["firstBatch"] == []
    db.c.insert_one({"_id": 1, "a": 1})
    for kw in (dict(sort={"a": 1}), dict(sort={"$natural": -1}), dict(singleBatch=True),
               dict(hint={"_id": 1}), dict(limit=-1)):
        with pytest.raises(OperationFailure) as e:
            db.command("find", "c", tailable=True, **kw)
        assert e.value.code == 2, kw
    with pytest.raises(OperationFailure) as e:
        db.command("find", "c", awaitData=True)
    assert e.value.code == 9
    with pytest.raises(OperationFailure) as e:
        db.command("find", "c", tailable=1)
    assert e.value.code == 14
    # `$natural: 1` as sort or hint is the tail's own order.
    r = db.command("find", "c", tailable=True, sort={"$natural": 1}, hint={"$natural": 1},
                   projection={"a": 0})
    assert r["cursor"]["firstBatch"] == [{"_id": 1}] and r["cursor"]["id"] != 0


def test_tailable_skip_and_limit_count_over_the_cursors_life(db):
    db.create_collection("c", capped=True, size=4096)
    db.c.insert_many([{"_id": 1}, {"_id": 2}])
    cursor = db.c.find(cursor_type=CursorType.TAILABLE, skip=2)
    assert list(cursor) == [] and cursor.alive
    db.c.insert_one({"_id": 3})
    assert [d["_id"] for d in cursor] == [3]
    cursor.close()
    cursor = db.c.find(cursor_type=CursorType.TAILABLE, limit=4)
    assert [d["_id"] for d in cursor] == [1, 2, 3]
    db.c.insert_many([{"_id": 4}, {"_id": 5}])
    assert [d["_id"] for d in cursor] == [4]
    assert not cursor.alive, "closed once the limit is returned"
    assert len(list(db.c.find(cursor_type=CursorType.TAILABLE, limit=1))) == 1


def test_tailable_cursors_under_auth(make_server):
    srv = make_server("--auth")
    c = srv.client()
    c.admin.command("createUser", "root", pwd="s3cret", roles=["root"])
    c.close()
    root = MongoClient(f"mongodb://root:s3cret@127.0.0.1:{srv.port}/?directConnection=true",
                       serverSelectionTimeoutMS=5000)
    root.app.create_collection("c", capped=True, size=4096)
    root.app.c.insert_one({"_id": 1})
    root.app.command("createUser", "reader", pwd="p", roles=["read"])
    root.app.command("createUser", "nobody", pwd="p", roles=[])
    reader = MongoClient(f"mongodb://reader:p@127.0.0.1:{srv.port}/app?directConnection=true",
                         serverSelectionTimeoutMS=5000)
    cursor = reader.app.c.find(cursor_type=CursorType.TAILABLE_AWAIT).max_await_time_ms(50)
    assert [d["_id"] for d in cursor] == [1]
    root.app.c.insert_one({"_id": 2})
    assert [d["_id"] for d in cursor] == [2]
    cursor.close()
    # read cannot convert; nobody cannot tail.
    with pytest.raises(OperationFailure) as e:
        reader.app.command("convertToCapped", "c", size=4096)
    assert e.value.code == 13
    nobody = MongoClient(f"mongodb://nobody:p@127.0.0.1:{srv.port}/app?directConnection=true",
                         serverSelectionTimeoutMS=5000)
    with pytest.raises(OperationFailure) as e:
        list(nobody.app.c.find(cursor_type=CursorType.TAILABLE))
    assert e.value.code == 13
    for cl in (root, reader, nobody):
        cl.close()


# ------------------------------------------------------------ convertToCapped


def test_convert_to_capped_keeps_the_newest_in_natural_order(db):
    pad = "x" * 500
    db.c.insert_many([{"_id": i, "pad": pad} for i in range(40)])
    db.c.create_index("pad")
    db.command("convertToCapped", "c", size=5000)
    assert db.c.options() == {"capped": True, "size": 5120}
    kept = ids(db.c)
    assert 1 <= len(kept) < 40 and kept == list(range(40 - len(kept), 40))
    assert db.command("collStats", "c")["size"] <= 5120
    assert [i["name"] for i in db.c.list_indexes()] == ["_id_"], "only _id survives"
    # It trims as any capped collection from now on.
    db.c.insert_one({"_id": 40, "pad": pad})
    assert ids(db.c)[-1] == 40 and len(ids(db.c)) == len(kept)
    # Errors: a missing collection, a missing or bad size.
    with pytest.raises(OperationFailure) as e:
        db.command("convertToCapped", "missing", size=4096)
    assert e.value.code == 26
    for kw, code in ((dict(), 40414), (dict(size="x"), 14), (dict(size=-1), 2)):
        with pytest.raises(OperationFailure) as e:
            db.command("convertToCapped", "c", **kw)
        assert e.value.code == code, kw


def test_convert_to_capped_ends_tails_and_shows_in_change_streams(db):
    db.create_collection("c", capped=True, size=100000)
    db.c.insert_many([{"_id": i} for i in range(3)])
    with db.client.start_session() as s:
        cid = db.command("find", "c", tailable=True, session=s)["cursor"]["id"]
        with db.watch() as stream:
            db.command("convertToCapped", "c", size=4096)
            db.c.insert_one({"_id": "after"})
            seen = []
            deadline = time.time() + 10
            while time.time() < deadline:
                ev = stream.try_next()
                if ev is None:
                    continue
                seen.append((ev["operationType"], ev.get("documentKey", {}).get("_id")))
                if ev.get("documentKey", {}).get("_id") == "after":
                    break
        # duetdb's record of the conversion (MongoDB logs a copy into a
        # temporary collection and a rename): a drop, then the copy.
        assert seen == [("drop", None), ("insert", 0), ("insert", 1), ("insert", 2),
                        ("insert", "after")], seen
        with pytest.raises(OperationFailure) as e:
            db.command("getMore", cid, collection="c", session=s)
        assert e.value.code == 43


def test_clone_collection_as_capped(db):
    db.src.insert_many([{"_id": i, "v": i} for i in range(10)])
    db.command("cloneCollectionAsCapped", "src", toCollection="dst", size=4096)
    assert ids(db.dst) == list(range(10)) and db.dst.options()["capped"] is True
    assert ids(db.src) == list(range(10)) and db.src.options() == {}
    with pytest.raises(OperationFailure) as e:
        db.command("cloneCollectionAsCapped", "src", toCollection="dst", size=4096)
    assert e.value.code == 48
    with pytest.raises(OperationFailure) as e:
        db.command("cloneCollectionAsCapped", "nope", toCollection="x", size=4096)
    assert e.value.code == 26
    with pytest.raises(OperationFailure) as e:
        db.command("cloneCollectionAsCapped", "src", size=4096)
    assert e.value.code == 40414
