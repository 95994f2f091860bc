"""Server-side sessions: retryable writes run once per (lsid, txnNumber),
endSessions/killSessions abort open transactions, and the topology `hello`
reports (a one-member replica set by default, so drivers send retryable
writes and connect with a plain URI; a standalone with --standalone)."""

import uuid

from bson import Binary
from pymongo import MongoClient, monitoring

import wire

DB = "t_raw_sessions"


def lsid():
    return {"id": Binary(uuid.uuid4().bytes, 4)}


def test_retried_write_is_applied_once(server):
    s = wire.connect(server.port)
    L = lsid()
    wire.command(s, {"drop": "c", "$db": DB})
    wire.command(s, {"insert": "c", "documents": [{"_id": 1, "n": 0}], "$db": DB})
    inc = {"update": "c", "updates": [{"q": {"_id": 1}, "u": {"$inc": {"n": 1}}}],
           "lsid": L, "$db": DB}
    first = wire.command(s, dict(inc, txnNumber=5))
    again = wire.command(s, dict(inc, txnNumber=5))  # a driver's retry
    assert first["ok"] == 1.0 and first == again
    assert wire.command(s, {"find": "c", "$db": DB})["cursor"]["firstBatch"][0]["n"] == 1
    # The next number runs; an older one is refused.
    assert wire.command(s, dict(inc, txnNumber=6))["nModified"] == 1
    stale = wire.command(s, dict(inc, txnNumber=5))
    assert stale["code"] == 225 and stale["codeName"] == "TransactionTooOld"
    # An insert retried with the same number does not hit its own duplicate key.
    ins = {"insert": "c", "documents": [{"_id": 2}], "lsid": L, "txnNumber": 7, "$db": DB}
    assert wire.command(s, ins) == wire.command(s, ins) == {"n": 1, "ok": 1.0}
    # findAndModify too: the retry gets the first reply (the old value).
    fam = {"findAndModify": "c", "query": {"_id": 1}, "update": {"$inc": {"n": 1}},
           "lsid": L, "txnNumber": 8, "$db": DB}
    r1, r2 = wire.command(s, fam), wire.command(s, fam)
    assert r1 == r2 and r1["value"]["n"] == 2
    doc = wire.command(s, {"find": "c", "filter": {"_id": 1}, "$db": DB})["cursor"]["firstBatch"][0]
    assert doc["n"] == 3
    # Each session has its own numbers.
    other = wire.command(s, dict(inc, lsid=lsid(), txnNumber=5))
    assert other["nModified"] == 1
    # txnNumber on a command that is not a write is refused.
    r = wire.command(s, {"find": "c", "lsid": L, "txnNumber": 9, "$db": DB})
    assert r["ok"] == 0.0 and r["code"] == 50768
    s.close()


def start_txn_insert(s, L, n, _id):
    r = wire.command(s, {"insert": "c", "documents": [{"_id": _id}], "lsid": L, "txnNumber": n,
                         "autocommit": False, "startTransaction": True, "$db": DB})
    assert r["ok"] == 1.0, r


def commit(s, L, n):
    return wire.command(s, {"commitTransaction": 1, "lsid": L, "txnNumber": n,
                            "autocommit": False, "$db": "admin"})


def test_end_and_kill_sessions_abort_open_transactions(server):
    s = wire.connect(server.port)
    wire.command(s, {"drop": "c", "$db": DB})
    a, b, c = lsid(), lsid(), lsid()
    start_txn_insert(s, a, 1, "a")
    start_txn_insert(s, b, 1, "b")
    start_txn_insert(s, c, 1, "c")
    open_now = wire.command(s, {"serverStatus": 1, "$db": "admin"})["transactions"]["currentOpen"]
    assert open_now >= 3
    assert wire.command(s, {"endSessions": [a], "$db": "admin"})["ok"] == 1.0
    assert wire.command(s, {"killSessions": [b], "$db": "admin"})["ok"] == 1.0
    for L in (a, b):
        r = commit(s, L, 1)
        assert r["code"] == 251 and "TransientTransactionError" in r["errorLabels"]
    assert commit(s, c, 1)["ok"] == 1.0
    ids = [d["_id"] for d in wire.command(s, {"find": "c", "$db": DB})["cursor"]["firstBatch"]]
    assert ids == ["c"]
    s.close()


def test_pymongo_end_session_aborts_its_transaction(server, db):
    s = db.client.start_session()
    s.start_transaction()
    db.c.insert_one({"_id": 1}, session=s)
    s.end_session()  # pymongo aborts; the server forgets the session
    assert db.c.count_documents({}) == 0


class Inserts(monitoring.CommandListener):
    def __init__(self):
        self.txn_numbers = []

    def started(self, event):
        if event.command_name == "insert":
            self.txn_numbers.append(event.command.get("txnNumber"))

    def succeeded(self, event):
        pass

    def failed(self, event):
        pass


def test_plain_uri_sees_a_replica_set_and_sends_retryable_writes(server):
    s = wire.connect(server.port)
    hello = wire.command(s, {"hello": 1, "$db": "admin"})
    s.close()
    me = f"127.0.0.1:{server.port}"
    assert hello["setName"] == "duet" and hello["isWritablePrimary"] is True
    assert hello["hosts"] == [me] and hello["me"] == me and hello["primary"] == me
    assert hello["secondary"] is False and hello["setVersion"] == 1 and "electionId" in hello
    listener = Inserts()
    c = MongoClient(f"mongodb://127.0.0.1:{server.port}", serverSelectionTimeoutMS=5000,
                    event_listeners=[listener])
    try:
        c.t_plain.c.drop()
        c.t_plain.c.insert_one({"x": 1})
        assert c.topology_description.topology_type_name == "ReplicaSetWithPrimary"
        assert isinstance(listener.txn_numbers[0], int)
        with c.start_session() as sess:
            sess.with_transaction(lambda ss: c.t_plain.c.insert_one({"x": 2}, session=ss))
        assert c.t_plain.c.count_documents({}) == 2
    finally:
        c.t_plain.c.drop()
        c.close()


def test_standalone_flag(make_server):
    srv = make_server("--standalone")
    s = wire.connect(srv.port)
    hello = wire.command(s, {"hello": 1, "$db": "admin"})
    s.close()
    assert "setName" not in hello and "hosts" not in hello and hello["isWritablePrimary"] is True
    listener = Inserts()
    c = MongoClient(f"mongodb://127.0.0.1:{srv.port}", serverSelectionTimeoutMS=5000,
                    event_listeners=[listener])
    try:
        c.t.c.insert_one({"x": 1})
        assert c.topology_description.topology_type_name == "Single"
        assert listener.txn_numbers == [None]  # no retryable writes to a standalone
        with c.start_session() as sess:  # pymongo still runs transactions
            sess.with_transaction(lambda ss: c.t.c.insert_one({"x": 2}, session=ss))
        assert c.t.c.count_documents({}) == 2
    finally:
        c.close()


def test_advertise_flag(make_server):
    srv = make_server("--advertise", "localhost:1")
    s = wire.connect(srv.port)
    hello = wire.command(s, {"hello": 1, "$db": "admin"})
    s.close()
    assert hello["hosts"] == ["localhost:1"] and hello["me"] == "localhost:1"
