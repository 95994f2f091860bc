"""Multi-document transactions through pymongo: with_transaction commit and
abort, read-your-writes, write conflicts and their retry, commit retries,
DDL refusal, the lifetime reaper, and the transaction state machine's errors."""

import threading
import time
import uuid

import pytest
from bson import Binary
from pymongo import ReturnDocument
from pymongo.errors import OperationFailure, PyMongoError

import wire

TRANSIENT = "TransientTransactionError"


def test_with_transaction_commit_is_visible_to_other_clients(server, db):
    other = server.client()[db.name].c
    db.c.insert_one({"_id": 0, "bal": 100})

    def transfer(s):
        db.c.update_one({"_id": 0}, {"$inc": {"bal": -30}}, session=s)
        db.c.insert_one({"_id": 1, "bal": 30}, session=s)
        # Not visible outside before the commit.
        assert other.count_documents({}) == 1
        assert other.find_one({"_id": 0})["bal"] == 100
        return "done"

    with db.client.start_session() as s:
        assert s.with_transaction(transfer) == "done"
    assert sorted((d["_id"], d["bal"]) for d in other.find()) == [(0, 70), (1, 30)]


def test_abort_and_callback_error_leave_nothing(server, db):
    other = server.client()[db.name].c
    db.c.insert_one({"_id": 0})

    class Boom(Exception):
        pass

    def fails(s):
        db.c.insert_one({"_id": 1}, session=s)
        db.c.delete_one({"_id": 0}, session=s)
        raise Boom()

    with db.client.start_session() as s:
        with pytest.raises(Boom):
            s.with_transaction(fails)
        s.start_transaction()
        db.c.insert_one({"_id": 2}, session=s)
        s.abort_transaction()
    assert [d["_id"] for d in other.find()] == [0]


def test_read_your_writes_inside_a_transaction(db):
    db.c.insert_many([{"_id": i, "g": i % 3, "v": i} for i in range(10)])
    with db.client.start_session() as s:
        with s.start_transaction():
            db.c.insert_one({"_id": 100, "g": 7, "v": 100}, session=s)
            db.c.update_many({"g": 0}, {"$set": {"v": -1}}, session=s)
            db.c.delete_one({"_id": 1}, session=s)
            assert db.c.count_documents({}, session=s) == 10
            assert db.c.find_one({"_id": 100}, session=s)["g"] == 7
            assert sorted(db.c.distinct("g", session=s)) == [0, 1, 2, 7]
            groups = {d["_id"]: d["n"] for d in db.c.aggregate(
                [{"$match": {"g": {"$lt": 3}}}, {"$group": {"_id": "$g", "n": {"$sum": 1}}}],
                session=s)}
            assert groups == {0: 4, 1: 2, 2: 3}
            # A find across several batches (getMore inside the transaction).
            got = [d["_id"] for d in db.c.find({}, session=s).sort("_id", 1).batch_size(3)]
            assert got == [0, 2, 3, 4, 5, 6, 7, 8, 9, 100]
            assert [d["v"] for d in db.c.find({"g": 0}, {"v": 1, "_id": 0}, session=s)] == [-1] * 4
            doc = db.c.find_one_and_update({"_id": 2}, {"$inc": {"v": 10}}, session=s,
                                           return_document=ReturnDocument.AFTER)
            assert doc["v"] == 12
            up = db.c.find_one_and_update({"_id": 500}, {"$set": {"v": 5}}, upsert=True,
                                          session=s, return_document=ReturnDocument.AFTER)
            assert up == {"_id": 500, "v": 5}
            gone = db.c.find_one_and_delete({"g": 2}, sort=[("_id", -1)], session=s)
            assert gone["_id"] == 8
            # Outside the transaction nothing has changed yet.
            assert db.c.count_documents({}) == 10 and db.c.find_one({"_id": 100}) is None
    assert db.c.count_documents({}) == 10  # +100, +500, -1, -8
    assert db.c.find_one({"_id": 2})["v"] == 12 and db.c.find_one({"_id": 8}) is None


def test_write_conflict_is_transient_and_with_transaction_retries(server, db):
    db.c.insert_one({"_id": 1, "n": 0})
    c = db.client
    with c.start_session() as a, c.start_session() as b:
        a.start_transaction()
        b.start_transaction()
        db.c.update_one({"_id": 1}, {"$inc": {"n": 1}}, session=a)
        db.c.update_one({"_id": 1}, {"$inc": {"n": 100}}, session=b)
        a.commit_transaction()
        with pytest.raises(OperationFailure) as e:
            b.commit_transaction()
        assert e.value.code == 112 and e.value.has_error_label(TRANSIENT)
    assert db.c.find_one({"_id": 1})["n"] == 1

    # with_transaction retries when another client commits in between.
    outside = server.client()[db.name].c
    attempts = []

    def bump(s):
        attempts.append(1)
        db.c.update_one({"_id": 1}, {"$inc": {"n": 10}}, session=s)
        if len(attempts) == 1:
            outside.update_one({"_id": 1}, {"$inc": {"n": 1000}})

    with c.start_session() as s:
        s.with_transaction(bump)
    assert len(attempts) == 2
    assert db.c.find_one({"_id": 1})["n"] == 1011


def test_concurrent_increments_lose_nothing(server, db):
    db.c.insert_one({"_id": 1, "n": 0})
    threads, per_thread, errors = 4, 10, []

    def worker():
        client = server.client()
        coll = client[db.name].c
        try:
            for _ in range(per_thread):
                with client.start_session() as s:
                    s.with_transaction(
                        lambda s: coll.update_one({"_id": 1}, {"$inc": {"n": 1}}, session=s))
        except PyMongoError as e:  # pragma: no cover - reported below
            errors.append(e)
        finally:
            client.close()

    ts = [threading.Thread(target=worker) for _ in range(threads)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert not errors
    assert db.c.find_one({"_id": 1})["n"] == threads * per_thread


def lsid():
    return {"id": Binary(uuid.uuid4().bytes, 4)}


def txn_cmd(doc, session, n, start=False, db="t_raw_txn"):
    d = dict(doc, lsid=session, txnNumber=n, autocommit=False, **{"$db": db})
    if start:
        d["startTransaction"] = True
    return d


def test_commit_retry_is_idempotent_and_state_errors(server):
    s = wire.connect(server.port)
    L = lsid()
    wire.command(s, {"drop": "c", "$db": "t_raw_txn"})
    r = wire.command(s, txn_cmd({"insert": "c", "documents": [{"_id": 1}]}, L, 1, start=True))
    assert r["ok"] == 1.0 and r["n"] == 1
    for _ in range(2):  # a driver's commit retry gets ok again
        r = wire.command(s, txn_cmd({"commitTransaction": 1}, L, 1, db="admin"))
        assert r["ok"] == 1.0, r
    r = wire.command(s, {"count": "c", "$db": "t_raw_txn"})
    assert r["n"] == 1
    # Continuing a committed transaction, an older number, an unknown one.
    r = wire.command(s, txn_cmd({"find": "c"}, L, 1))
    assert r["code"] == 256
    r = wire.command(s, txn_cmd({"find": "c"}, L, 0, start=True))
    assert r["code"] == 225 and r["codeName"] == "TransactionTooOld"
    r = wire.command(s, txn_cmd({"find": "c"}, L, 7))
    assert r["code"] == 251 and TRANSIENT in r["errorLabels"]
    r = wire.command(s, txn_cmd({"commitTransaction": 1}, L, 7, db="admin"))
    assert r["code"] == 251 and TRANSIENT in r["errorLabels"]
    # Only the first command may carry a readConcern; starting twice fails.
    r = wire.command(s, txn_cmd({"find": "c", "readConcern": {"level": "snapshot"}}, L, 8, start=True))
    assert r["ok"] == 1.0
    r = wire.command(s, txn_cmd({"find": "c", "readConcern": {"level": "snapshot"}}, L, 8))
    assert r["code"] == 72
    r = wire.command(s, txn_cmd({"find": "c"}, L, 8, start=True))
    assert r["ok"] == 0.0
    r = wire.command(s, txn_cmd({"abortTransaction": 1}, L, 8, db="admin"))
    assert r["ok"] == 1.0
    r = wire.command(s, txn_cmd({"commitTransaction": 1}, L, 8, db="admin"))
    assert r["code"] == 251 and TRANSIENT in r["errorLabels"]
    s.close()


def test_ddl_and_explain_are_refused_in_a_transaction(db):
    db.c.insert_one({"_id": 0})
    with db.client.start_session() as s:
        for ddl in (lambda: db.create_collection("new_one", session=s),
                    lambda: db.c.drop(session=s),
                    lambda: db.c.create_index("x", session=s)):
            s.start_transaction()
            db.c.insert_one({"_id": 1}, session=s)
            with pytest.raises(OperationFailure) as e:
                ddl()
            assert e.value.code == 263, e.value.details
            assert e.value.details["codeName"] == "OperationNotSupportedInTransaction"
            # The failed command aborted the transaction.
            with pytest.raises(OperationFailure) as e:
                s.commit_transaction()
            assert e.value.code == 251 and e.value.has_error_label(TRANSIENT)
    assert db.c.count_documents({}) == 1
    assert "new_one" not in db.list_collection_names()
    assert [i["name"] for i in db.c.list_indexes()] == ["_id_"]


def test_write_error_aborts_the_transaction(db):
    db.c.insert_one({"_id": 1})
    with db.client.start_session() as s:
        s.start_transaction()
        db.c.insert_one({"_id": 2}, session=s)
        with pytest.raises(PyMongoError) as e:
            db.c.insert_one({"_id": 1}, session=s)
        assert "E11000" in str(e.value)
        with pytest.raises(OperationFailure) as e:
            s.commit_transaction()
        assert e.value.code == 251
    assert db.c.count_documents({}) == 1


def test_reaper_aborts_transactions_past_their_lifetime(make_server):
    srv = make_server("--transaction-lifetime-secs", "1")
    c = srv.client()
    coll = c.t_reaper.c
    coll.drop()
    with c.start_session() as s:
        s.start_transaction()
        coll.insert_one({"_id": 1}, session=s)
        assert c.admin.command("serverStatus")["transactions"]["currentOpen"] == 1
        deadline = time.time() + 10
        while c.admin.command("serverStatus")["transactions"]["currentOpen"] != 0:
            assert time.time() < deadline, "the reaper did not abort the transaction"
            time.sleep(0.1)
        with pytest.raises(OperationFailure) as e:
            s.commit_transaction()
        assert e.value.code == 251 and e.value.has_error_label(TRANSIENT)
        assert "lifetime" in str(e.value)
    assert coll.count_documents({}) == 0
    c.close()
