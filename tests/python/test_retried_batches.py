"""Retried write batches (issue #21): a retryable `insert`/`update`/`delete`
(the same `lsid` and `txnNumber` sent again, as a driver does after a
network error) whose first execution applied only some of its statements
runs the others again, as MongoDB does (the retryable-writes spec: the
statements that executed are answered by `stmtId`, the others execute
again). So an ordered batch stopped by a duplicate key answers the same
`writeErrors` again and applies nothing twice; once the conflict is gone,
its retry applies the rest. Indexes in `writeErrors` and `upserted` are the
original statement positions. On a standalone, a one-member set, and a
three-member set after the primary that ran the write was killed (the
new primary answers from the replicated table of outcomes). Outside a
replica set the server's own table is durable: a write retried after a
SIGKILL and restart is answered, not run again.

The commands go over the raw wire (`wire.py`): pymongo replaces a
command's `lsid` with one of its pooled sessions, whose numbers it uses
for its own retryable writes."""

import os
import signal

import bson
import pytest

import wire
from conftest import DuetServer
from test_replication import cluster, primary_of  # noqa: F401  (fixture)

DB = "retried_batches"


def tagged(body, n):
    """`body` as retryable write `n` of a session of its own."""
    return dict(body, **{"$db": DB, "lsid": {"id": bson.Binary(os.urandom(16), 4)},
                         "txnNumber": bson.Int64(n)})


def plain(sock, body):
    reply = wire.command(sock, dict(body, **{"$db": DB}))
    assert reply["ok"] == 1.0, reply
    return reply


def ids(sock, coll):
    reply = plain(sock, {"find": coll, "sort": {"_id": 1}})
    return [d["_id"] for d in reply["cursor"]["firstBatch"]]


def strip(reply):
    """The parts of a write reply a retry must repeat."""
    return {k: reply[k] for k in ("n", "nModified", "upserted", "writeErrors") if k in reply}


def error_indexes(reply):
    return [(e["index"], e["code"]) for e in reply.get("writeErrors", [])]


def setup(sock):
    """`c` holds `_id` 3; `u` has a unique index on `k` and a document
    holding `k: 1`."""
    for coll in ("c", "u"):
        wire.command(sock, {"drop": coll, "$db": DB})
    plain(sock, {"insert": "c", "documents": [{"_id": 3, "pre": True}]})
    plain(sock, {"createIndexes": "u", "indexes": [{"key": {"k": 1}, "name": "k", "unique": True}]})
    plain(sock, {"insert": "u", "documents": [{"_id": "blocker", "k": 1}]})


# An ordered insert of 5 stopped by a duplicate key at statement 3 (index 2).
INSERT = {"insert": "c", "documents": [{"_id": i} for i in range(1, 6)]}
# An unordered update whose statement 1 (an upsert) fails on the unique
# index, between two upserts and an update of the blocker.
UPDATE = {"update": "u", "ordered": False, "updates": [
    {"q": {"_id": "a"}, "u": {"$set": {"k": 0}}, "upsert": True},
    {"q": {"_id": "b"}, "u": {"$set": {"k": 1}}, "upsert": True},
    {"q": {"_id": "c"}, "u": {"$set": {"k": 2}}, "upsert": True},
    {"q": {"_id": "blocker"}, "u": {"$set": {"seen": 1}}},
]}


def first_attempts(sock):
    ins, upd = tagged(INSERT, 1), tagged(UPDATE, 7)
    first = wire.command(sock, ins)
    assert first["n"] == 2 and error_indexes(first) == [(2, 11000)], first
    first_u = wire.command(sock, upd)
    assert first_u["n"] == 3 and first_u["nModified"] == 1, first_u
    assert first_u["upserted"] == [{"index": 0, "_id": "a"}, {"index": 2, "_id": "c"}], first_u
    assert error_indexes(first_u) == [(1, 11000)], first_u
    return ins, first, upd, first_u


def retries(sock, ins, first, upd, first_u):
    """Retries answer the first attempts' replies (the conflicts are still
    there) and apply nothing twice; once the conflicts are gone, they apply
    the statements not applied, reported at their own indexes."""
    again = wire.command(sock, ins)
    assert strip(again) == strip(first), (first, again)
    again_u = wire.command(sock, upd)
    assert strip(again_u) == strip(first_u), (first_u, again_u)
    assert ids(sock, "c") == [1, 2, 3]
    plain(sock, {"delete": "c", "deletes": [{"q": {"_id": 3}, "limit": 1}]})
    plain(sock, {"delete": "u", "deletes": [{"q": {"_id": "blocker"}, "limit": 1}]})
    last = wire.command(sock, ins)
    assert last["n"] == 5 and "writeErrors" not in last, last
    assert ids(sock, "c") == [1, 2, 3, 4, 5]
    last_u = wire.command(sock, upd)
    assert "writeErrors" not in last_u, last_u
    # Statement 3 (the blocker's update) is answered from the first run,
    # not run again (the blocker is gone: it would match nothing).
    assert last_u["n"] == 4 and last_u["nModified"] == 1, last_u
    assert last_u["upserted"] == [{"index": 0, "_id": "a"}, {"index": 1, "_id": "b"},
                                  {"index": 2, "_id": "c"}], last_u
    assert ids(sock, "u") == ["a", "b", "c"]
    # Nothing left to run: answered as is.
    assert strip(wire.command(sock, ins)) == strip(last)
    assert strip(wire.command(sock, upd)) == strip(last_u)


@pytest.mark.parametrize("mode", ["standalone", "one-member set"])
def test_a_retried_batch_runs_only_the_statements_not_applied(make_server, mode):
    srv = make_server("--standalone") if mode == "standalone" else make_server()
    with wire.connected(srv.port, timeout=20) as sock:
        setup(sock)
        retries(sock, *first_attempts(sock))


def test_a_retried_batch_on_a_new_primary_runs_only_the_statements_not_applied(cluster):  # noqa: F811
    p = primary_of(cluster)
    with wire.connected(p.port, timeout=20) as sock:
        setup(sock)
        attempts = first_attempts(sock)
        # Every member holds them before the primary goes.
        plain(sock, {"insert": "sync", "documents": [{}], "writeConcern": {"w": 3}})
    p.kill()
    # The new primary's session table never saw them: answered from the
    # set's table, the statements not applied run again.
    with wire.connected(primary_of(cluster).port, timeout=20) as sock:
        retries(sock, *attempts)


@pytest.mark.parametrize("mode", ["standalone", "one-member set"])
def test_a_write_retried_after_a_restart_is_answered_not_run_again(tmp_path, mode):
    extra = ("--standalone",) if mode == "standalone" else ()
    srv = DuetServer(tmp_path, *extra)
    try:
        with wire.connected(srv.port, timeout=20) as sock:
            setup(sock)
            # The second document gets a generated `_id`: run again, it
            # would be a third document.
            ins = tagged({"insert": "k", "documents": [{"_id": 1, "n": 0}, {"x": 1}]}, 3)
            first = wire.command(sock, ins)
            assert first["n"] == 2 and "writeErrors" not in first, first
            inc = tagged({"update": "k", "updates": [{"q": {"_id": 1}, "u": {"$inc": {"n": 1}}}]}, 4)
            first_inc = wire.command(sock, inc)
            assert first_inc["nModified"] == 1, first_inc
            attempts = first_attempts(sock)
    finally:
        srv.stop(signal.SIGKILL)
    srv = DuetServer(tmp_path, *extra)
    try:
        with wire.connected(srv.port, timeout=20) as sock:
            assert strip(wire.command(sock, ins)) == strip(first)
            assert strip(wire.command(sock, inc)) == strip(first_inc)
            found = plain(sock, {"find": "k", "sort": {"_id": 1}})["cursor"]["firstBatch"]
            assert len(found) == 2 and found[0] == {"_id": 1, "n": 1}, found
            # The batches that applied some statements: the same errors,
            # then the rest once the conflicts are gone.
            retries(sock, *attempts)
    finally:
        assert srv.stop() == 0, srv.log_text()[-3000:]
