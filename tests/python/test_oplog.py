"""The `local.oplog.rs` view through pymongo: entry shapes, a Meteor-style
tailing reader (find ts > last, tailable awaitData), $natural order and
hints, count/aggregate, listCollections/listDatabases, refused writes, and
`applyOps` replaying entries into another database."""

import threading
import time

import pytest
from bson import Int64, Timestamp
from pymongo import CursorType
from pymongo.errors import OperationFailure, WriteError


def oplog(client):
    return client.local["oplog.rs"]


def last_ts(client):
    last = list(oplog(client).find({}, sort=[("$natural", -1)], limit=1))
    return last[0]["ts"] if last else Timestamp(0, 0)


def entries_after(client, ts, db_name):
    """Entries after `ts` that touch `db_name` (plain or inside applyOps)."""
    out = []
    for e in oplog(client).find({"ts": {"$gt": ts}}):
        if e["ns"].startswith(db_name + ".") or "applyOps" in e.get("o", {}):
            out.append(e)
    return out


def test_entry_shapes(client, db):
    start = last_ts(client)
    c = db.shapes
    c.insert_one({"_id": 1, "a": {"b": 1, "arr": [1, 2, 3]}, "x": 1})
    c.update_one({"_id": 1}, {"$set": {"a.b": 2, "a.arr.1": 9, "new": True}, "$unset": {"x": ""}})
    c.update_one({"_id": 1}, {"$pop": {"a.arr": 1}})
    c.replace_one({"_id": 1}, {"r": 1})
    c.delete_one({"_id": 1})
    c.create_index("r")
    c.drop_index("r_1")
    c.drop()
    ents = entries_after(client, start, db.name)
    ops = [(e["op"], e["ns"]) for e in ents]
    # (The engine records no event for a collection's implicit creation.)
    assert ops == [
        ("i", f"{db.name}.shapes"),
        ("u", f"{db.name}.shapes"),
        ("u", f"{db.name}.shapes"),
        ("u", f"{db.name}.shapes"),
        ("d", f"{db.name}.shapes"),
        ("c", f"{db.name}.$cmd"),
        ("c", f"{db.name}.$cmd"),
        ("c", f"{db.name}.$cmd"),
    ], ents
    ins, upd, pop, rep, dele, cidx, didx, drop = ents
    for e in ents:
        assert isinstance(e["ts"], Timestamp)
        assert e["t"] == 1 and isinstance(e["t"], Int64)
        assert e["h"] == 0 and isinstance(e["h"], Int64)
        assert e["v"] == 2
        assert "wall" in e and "ui" not in e
    times = [e["ts"] for e in ents]
    assert times == sorted(times) and len(set(times)) == len(times)
    assert ins["o"] == {"_id": 1, "a": {"b": 1, "arr": [1, 2, 3]}, "x": 1}
    assert ins["o2"] == {"_id": 1}
    assert upd["o"] == {"$v": 2, "diff": {
        "sa": {"u": {"b": 2}, "sarr": {"a": True, "u1": 9}},
        "u": {"new": True},
        "d": {"x": False},
    }}, upd["o"]
    assert upd["o2"] == {"_id": 1}
    assert pop["o"] == {"$v": 2, "diff": {"sa": {"sarr": {"a": True, "l": 2}}}}, pop["o"]
    assert rep["o"] == {"_id": 1, "r": 1} and rep["o2"] == {"_id": 1}
    assert dele["o"] == {"_id": 1} and "o2" not in dele
    assert cidx["o"] == {"createIndexes": "shapes", "v": 2, "key": {"r": 1}, "name": "r_1"}
    assert didx["o"] == {"dropIndexes": "shapes", "index": "r_1"}
    assert drop["o"] == {"drop": "shapes"}


def test_transaction_is_one_apply_ops_entry_with_lsid(client, db):
    db.t.insert_one({"_id": 0})
    start = last_ts(client)
    with client.start_session() as s:
        with s.start_transaction():
            db.t.insert_one({"_id": 1}, session=s)
            db.t.update_one({"_id": 0}, {"$set": {"k": 1}}, session=s)
            db.t.insert_one({"_id": 2}, session=s)
        lsid = s.session_id
    [e] = [e for e in oplog(client).find({"ts": {"$gt": start}, "o.applyOps": {"$exists": True}})]
    assert e["op"] == "c" and e["ns"] == "admin.$cmd"
    assert e["lsid"]["id"] == lsid["id"]
    assert isinstance(e["txnNumber"], Int64)
    assert e["prevOpTime"] == {"ts": Timestamp(0, 0), "t": -1}
    inner = e["o"]["applyOps"]
    assert [(o["op"], o["ns"]) for o in inner] == [
        ("i", f"{db.name}.t"), ("u", f"{db.name}.t"), ("i", f"{db.name}.t")], inner
    assert inner[1]["o"] == {"$v": 2, "diff": {"u": {"k": 1}}} and inner[1]["o2"] == {"_id": 0}
    for o in inner:
        assert "ts" not in o and "wall" not in o


def test_meteor_style_tailing_reader_sees_writes_in_order(client, db):
    c = db.tail
    c.insert_one({"_id": "seed"})
    last = last_ts(client)
    seen = []
    stop = threading.Event()
    errors = []

    def tail():
        try:
            cur = oplog(client).find(
                {"ts": {"$gt": last}, "ns": {"$regex": f"^(?:{db.name}\\.|admin\\.\\$cmd)"}},
                cursor_type=CursorType.TAILABLE_AWAIT, oplog_replay=True,
            ).max_await_time_ms(200)
            while not stop.is_set() and cur.alive:
                for e in cur:
                    seen.append(e)
                time.sleep(0.01)
        except Exception as e:  # noqa: BLE001 - reported by the test below
            errors.append(e)

    t = threading.Thread(target=tail)
    t.start()
    try:
        time.sleep(0.3)
        for i in range(20):
            c.insert_one({"_id": i})
        with client.start_session() as s:
            with s.start_transaction():
                c.insert_one({"_id": "t1"}, session=s)
                c.insert_one({"_id": "t2"}, session=s)
        c.update_many({}, {"$set": {"done": True}})
        deadline = time.time() + 10
        while time.time() < deadline and not any(
                e["op"] == "c" and len(e["o"].get("applyOps", [])) > 2 for e in seen):
            time.sleep(0.05)
    finally:
        stop.set()
        t.join(5)
    assert not errors, errors
    ts = [e["ts"] for e in seen]
    assert ts == sorted(ts) and len(set(ts)) == len(ts)
    inserted = [e["o"]["_id"] for e in seen if e["op"] == "i"]
    assert inserted == list(range(20)), seen
    txn = [e for e in seen if "lsid" in e]
    assert len(txn) == 1
    assert [o["o"]["_id"] for o in txn[0]["o"]["applyOps"]] == ["t1", "t2"]
    # update_many of 23 documents in one commit group: one applyOps entry.
    assert seen[-1]["op"] == "c" and len(seen[-1]["o"]["applyOps"]) == 23


def test_await_data_get_more_waits_and_is_woken(client, db):
    db.aw.insert_one({"_id": 0})
    cur = oplog(client).find({"ts": {"$gt": last_ts(client)}},
                             cursor_type=CursorType.TAILABLE_AWAIT).max_await_time_ms(10000)
    t0 = time.time()
    timer = threading.Timer(0.5, lambda: db.aw.insert_one({"_id": 1}))
    timer.start()
    e = None
    while e is None and time.time() - t0 < 10:
        e = next(cur, None)
    timer.join()
    assert e is not None and e["o"] == {"_id": 1}
    # Woken by the write, not by the end of the 10 s await time.
    assert time.time() - t0 < 8
    # Nothing new: the getMore returns empty after the await time.
    cur2 = oplog(client).find({"ts": {"$gt": e["ts"]}},
                              cursor_type=CursorType.TAILABLE_AWAIT).max_await_time_ms(200)
    assert next(cur2, None) is None  # the find: an empty first batch
    t1 = time.time()
    assert next(cur2, None) is None  # a getMore, waiting 200 ms
    assert cur2.alive
    assert time.time() - t1 >= 0.15
    cur.close()
    cur2.close()


def test_natural_order_hint_limit_count_and_aggregate(client, db):
    start = last_ts(client)
    db.n.insert_many([{"_id": i} for i in range(5)], ordered=True)
    for i in range(5, 10):
        db.n.insert_one({"_id": i})
    q = {"ts": {"$gt": start}, "op": "i", "ns": f"{db.name}.n"}
    fwd = [e["o"]["_id"] for e in oplog(client).find(q)]
    assert fwd == list(range(5, 10))  # insert_many is one applyOps entry
    back = [e["o"]["_id"] for e in oplog(client).find(q, sort=[("$natural", -1)], limit=3)]
    assert back == [9, 8, 7]
    hinted = [e["o"]["_id"] for e in oplog(client).find(q).hint([("$natural", -1)]).limit(2)]
    assert hinted == [9, 8]
    assert [e["o"]["_id"] for e in oplog(client).find(q).skip(1).limit(2)] == [6, 7]
    assert oplog(client).count_documents(q) == 5
    groups = list(oplog(client).aggregate([
        {"$match": {"ts": {"$gt": start}, "ns": {"$regex": f"^{db.name}\\."}}},
        {"$group": {"_id": "$op", "n": {"$sum": 1}}},
        {"$sort": {"_id": 1}},
    ]))
    assert groups == [{"_id": "i", "n": 5}], groups
    with pytest.raises(OperationFailure) as e:
        list(oplog(client).find(q).hint([("ts", 1)]))
    assert e.value.code == 2
    projected = list(oplog(client).find(q, {"o": 1, "_id": 0}, limit=1))
    assert projected == [{"o": {"_id": 5}}]
    # The oldest entry comes first in $natural order (mongodump's check).
    oldest = oplog(client).find_one({}, sort=[("$natural", 1)])
    assert oldest["ts"] <= start


def test_writes_and_ddl_on_the_oplog_are_refused(client):
    o = oplog(client)
    with pytest.raises(WriteError) as e:
        o.insert_one({"ts": Timestamp(1, 1), "op": "n"})
    assert e.value.code == 73
    with pytest.raises(WriteError) as e:
        o.delete_many({})
    assert e.value.code == 73
    with pytest.raises(WriteError) as e:
        o.update_one({}, {"$set": {"x": 1}})
    assert e.value.code == 73
    with pytest.raises(OperationFailure) as e:
        o.find_one_and_delete({})
    assert e.value.code == 73
    with pytest.raises(OperationFailure) as e:
        client.local.command("drop", "oplog.rs")
    assert e.value.code == 20
    with pytest.raises(OperationFailure) as e:
        o.create_index("x")
    assert e.value.code == 20
    with pytest.raises(OperationFailure) as e:
        client.admin.command("renameCollection", "local.oplog.rs", to="local.x")
    assert e.value.code == 20
    with pytest.raises(OperationFailure) as e:
        list(o.find({}, cursor_type=CursorType.TAILABLE, sort=[("$natural", -1)]))
    assert e.value.code == 2


def test_local_is_listed_with_a_capped_oplog(client, db):
    db.x.insert_one({})
    assert "local" in client.list_database_names()
    colls = {c["name"]: c for c in client.local.list_collections()}
    assert colls["oplog.rs"]["options"]["capped"] is True
    assert "oplog.rs" in client.local.list_collection_names()
    assert client.local.list_collection_names(filter={"name": "nope"}) == []


def test_reads_in_a_transaction_are_refused(client, db):
    db.r.insert_one({})
    with client.start_session() as s:
        s.start_transaction()
        with pytest.raises(OperationFailure) as e:
            oplog(client).find_one({}, session=s)
        assert e.value.code == 263
        s.abort_transaction()


def test_apply_ops_replays_entries_into_another_database(client, db):
    src, dst = db.src, client[db.name + "_copy"].src
    client.drop_database(db.name + "_copy")
    start = last_ts(client)
    src.insert_one({"_id": 1, "a": {"b": [1, 2, 3]}, "x": 1})
    src.insert_many([{"_id": 2}, {"_id": 3}])
    src.update_one({"_id": 1}, {"$set": {"a.b.0": 7, "y": {"z": 1}}, "$unset": {"x": ""}})
    src.update_one({"_id": 1}, {"$pop": {"a.b": 1}})
    src.replace_one({"_id": 2}, {"r": True})
    src.delete_one({"_id": 3})
    with client.start_session() as s:
        with s.start_transaction():
            src.insert_one({"_id": 4}, session=s)
            src.update_one({"_id": 2}, {"$inc": {"n": 1}}, session=s)
    copy = db.name + "_copy"

    def renamed(op):
        op = dict(op)
        for k in ("ts", "t", "h", "v", "wall", "lsid", "txnNumber", "prevOpTime"):
            op.pop(k, None)
        if op["ns"].startswith(db.name + "."):
            op["ns"] = copy + op["ns"][len(db.name):]
        if "applyOps" in op.get("o", {}):
            op["o"] = {"applyOps": [renamed(i) for i in op["o"]["applyOps"]]}
        return op

    for e in oplog(client).find({"ts": {"$gt": start}}):
        if e["ns"].startswith(db.name + ".") or "applyOps" in e["o"]:
            r = client.admin.command("applyOps", [renamed(e)])
            assert r["applied"] == 1
    assert sorted(dst.find(), key=lambda d: d["_id"]) == sorted(src.find(), key=lambda d: d["_id"])
    # Replaying the same entries again changes nothing (alwaysUpsert, diffs).
    for e in oplog(client).find({"ts": {"$gt": start}}):
        if e["ns"].startswith(db.name + ".") or "applyOps" in e["o"]:
            client.admin.command("applyOps", [renamed(e)])
    assert sorted(dst.find(), key=lambda d: d["_id"]) == sorted(src.find(), key=lambda d: d["_id"])
    client.drop_database(copy)


def test_auth_reading_the_oplog_needs_read_on_local(make_server):
    from test_auth import authed, create_first_user
    s = make_server("--auth")
    create_first_user(s)
    root = authed(s, "root", "s3cret", "SCRAM-SHA-256")
    root.app.c.insert_one({"_id": 1})
    root.admin.command("createUser", "tailer", pwd="pw", roles=[{"role": "read", "db": "local"}],
                       mechanisms=["SCRAM-SHA-256"])
    root.admin.command("createUser", "app", pwd="pw", roles=[{"role": "readWrite", "db": "app"}],
                       mechanisms=["SCRAM-SHA-256"])
    tailer = authed(s, "tailer", "pw", "SCRAM-SHA-256")
    assert [e["o"] for e in tailer.local["oplog.rs"].find({"op": "i", "ns": "app.c"})] == [{"_id": 1}]
    app = authed(s, "app", "pw", "SCRAM-SHA-256")
    with pytest.raises(OperationFailure) as e:
        app.local["oplog.rs"].find_one()
    assert e.value.code == 13
    # applyOps checks each operation as the command it runs.
    with pytest.raises(OperationFailure) as e:
        tailer.admin.command("applyOps", [{"op": "i", "ns": "app.c", "o": {"_id": 2}}])
    assert e.value.code == 13
    app.admin.command("applyOps", [{"op": "i", "ns": "app.c", "o": {"_id": 2}}])
    assert root.app.c.count_documents({}) == 2
    for c in (root, tailer, app):
        c.close()
