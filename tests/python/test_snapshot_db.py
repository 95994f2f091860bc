"""`db@snapshot`: a named snapshot read as a read-only database (#22 item 6).

Every read command on `shop@nightly` sees the state the named snapshot holds
while the live database keeps changing; every write is refused with
IllegalOperation (20).
"""

import threading

import pytest
from pymongo.errors import OperationFailure

N = 500


def snap_db(client, db, name="nightly"):
    return client[f"{db.name}@{name}"]


def setup(db):
    db.c.insert_many([{"_id": i, "a": i % 10, "open": True} for i in range(N)])
    db.c.create_index("a")
    db.other.insert_one({"_id": 1})
    db.command({"createSnapshot": "nightly"})


def test_reads_equal_the_snapshot_while_the_live_database_changes(server, client, db):
    setup(db)
    frozen = sorted(db.c.find(), key=lambda d: d["_id"])
    stop = threading.Event()
    writes = [0]
    writer_client = server.client()

    def writer():
        live = writer_client[db.name]
        i = 0
        while not stop.is_set():
            live.c.update_one({"_id": i % N}, {"$set": {"open": False, "a": -1}})
            live.c.insert_one({"_id": N + i, "a": 99, "open": True})
            i += 1
            writes[0] = i

    t = threading.Thread(target=writer)
    t.start()
    try:
        s = snap_db(client, db)
        for _ in range(5):
            # find across several getMores, from one state
            assert list(s.c.find(batch_size=37).sort("_id", 1)) == frozen
            assert s.c.count_documents({}) == N
            assert s.c.count_documents({"open": True}) == N
            assert s.command("count", "c")["n"] == N
            assert sorted(s.c.distinct("a")) == list(range(10))
            got = list(s.c.aggregate([{"$group": {"_id": None, "n": {"$sum": 1},
                                                  "t": {"$sum": "$a"}}}]))
            assert got[0]["n"] == N and got[0]["t"] == sum(i % 10 for i in range(N))
            assert list(s.c.find({"a": 99})) == []
    finally:
        stop.set()
        t.join()
        writer_client.close()
    assert writes[0] > 0
    # The live database did change.
    assert db.c.count_documents({}) == N + writes[0]
    assert snap_db(client, db).c.count_documents({}) == N


def test_metadata_reads(client, db):
    setup(db)
    db.c.create_index("open")  # after the snapshot: not in it
    db.created_later.insert_one({})
    s = snap_db(client, db)
    assert sorted(s.list_collection_names()) == ["c", "other"]
    info = list(s.list_collections(filter={"name": "c"}))[0]
    assert info["info"]["readOnly"] is True
    assert [i["name"] for i in s.c.list_indexes()] == ["_id_", "a_1"]
    assert [i["name"] for i in db.c.list_indexes()] == ["_id_", "a_1", "open_1"]
    st = s.command("collStats", "c")
    assert st["count"] == N and st["ns"] == f"{db.name}@nightly.c"
    ds = s.command("dbStats")
    assert ds["collections"] == 2 and ds["objects"] == N + 1
    e = s.command("explain", {"find": "c", "filter": {"a": 1}})
    assert e["ok"] == 1.0


def test_writes_are_refused(client, db):
    setup(db)
    s = snap_db(client, db)
    attempts = [
        lambda: s.c.insert_one({"x": 1}),
        lambda: s.c.update_one({"_id": 1}, {"$set": {"a": 5}}),
        lambda: s.c.delete_one({"_id": 1}),
        lambda: s.c.find_one_and_update({"_id": 1}, {"$set": {"a": 5}}),
        lambda: s.c.create_index("open"),
        lambda: s.c.drop(),
        lambda: s.create_collection("new"),
        lambda: client.drop_database(s.name),
        lambda: s.command({"createSnapshot": "again"}),
    ]
    for attempt in attempts:
        with pytest.raises(OperationFailure) as e:
            attempt()
        assert e.value.code == 20, e.value.details
        assert "read-only" in str(e.value)
    # Nothing changed, and no database named with '@' appeared.
    assert db.c.count_documents({}) == N
    assert db.c.find_one({"_id": 1})["a"] == 1
    assert all("@" not in n for n in client.list_database_names())


def test_refused_options_and_bad_names(client, db):
    setup(db)
    s = snap_db(client, db)
    with pytest.raises(OperationFailure) as e:
        s.command({"find": "c", "$duet": {"snapshot": "vls"}})
    assert e.value.code == 2
    with pytest.raises(OperationFailure) as e:
        s.command({"find": "c", "readConcern": {"level": "snapshot"}})
    assert e.value.code == 72
    with pytest.raises(OperationFailure) as e:
        s.command({"aggregate": "c", "pipeline": [{"$out": "x"}], "cursor": {}})
    assert e.value.code == 20
    with client.start_session() as session:
        with pytest.raises(OperationFailure) as e:
            with session.start_transaction():
                s.c.find_one({}, session=session)
        assert e.value.code == 20
    with pytest.raises(OperationFailure) as e:
        snap_db(client, db, "nosuch").c.find_one()
    assert e.value.code == 246
    for bad in [f"{db.name}@", "@nightly", f"{db.name}@a@b"]:
        with pytest.raises(OperationFailure) as e:
            client[bad].c.find_one()
        assert e.value.code == 73


def test_reads_continue_after_the_snapshot_is_dropped_only_through_open_cursors(client, db):
    setup(db)
    s = snap_db(client, db)
    cursor = s.c.find(batch_size=10)
    first = next(cursor)
    db.command({"dropSnapshot": "nightly"})
    db.c.delete_many({})
    # The open cursor keeps its snapshot (a lease); new reads fail with 246.
    assert 1 + len(list(cursor)) == N and first["_id"] == 0
    with pytest.raises(OperationFailure) as e:
        s.c.find_one()
    assert e.value.code == 246
