"""`$duet: {workNsPerDoc: N}` on count: a benchmark knob that busy-waits N ns per
document the count visits (so a query lasts seconds while updates stream),
under every strategy and on a named snapshot, without changing the count."""

import threading
import time

import pytest
from pymongo.errors import OperationFailure

DOCS = 2000
NS = 200_000  # 2000 docs x 0.2 ms = at least 0.4 s per count


def timed_count(db, duet, query=None):
    cmd = {"count": "c", "query": query or {}, "$duet": duet}
    t0 = time.monotonic()
    r = db.command(cmd)
    return r["n"], time.monotonic() - t0


@pytest.mark.parametrize("strategy", ["olcp", "vls", "cow", "none", "auto"])
def test_count_with_work_is_exact_and_slow(db, strategy):
    db.c.insert_many([{"_id": i, "k": i % 2} for i in range(DOCS)])
    n, took = timed_count(db, {"snapshot": strategy, "workNsPerDoc": NS})
    assert n == DOCS
    assert took >= DOCS * NS / 1e9
    # A filter: only matches are visited (and counted).
    n, took = timed_count(db, {"snapshot": strategy, "workNsPerDoc": NS}, {"k": 1})
    assert n == DOCS // 2
    assert took >= DOCS // 2 * NS / 1e9
    # Without the knob the same count is fast.
    n, took = timed_count(db, {"snapshot": strategy})
    assert n == DOCS and took < DOCS * NS / 1e9


def test_olcp_count_with_work_stays_exact_under_updates(server, db):
    """Updates during a long olcp count are propagated to it, never counted twice."""
    db.c.insert_many([{"_id": i, "v": 0} for i in range(DOCS)])
    other = server.client()
    stop = threading.Event()
    updates = [0]

    def writer():
        coll = other[db.name].c
        i = 0
        while not stop.is_set():
            coll.update_one({"_id": (i * 7919) % DOCS}, {"$set": {"v": i + 1}})
            updates[0] += 1
            i += 1

    t = threading.Thread(target=writer)
    t.start()
    try:
        for strategy in ["olcp", "vls"]:
            n, _ = timed_count(db, {"snapshot": strategy, "workNsPerDoc": NS})
            assert n == DOCS, strategy
    finally:
        stop.set()
        t.join()
        other.close()
    assert updates[0] > 0


def test_named_snapshot_count_with_work(db):
    db.c.insert_many([{"_id": i} for i in range(DOCS)])
    db.command({"createSnapshot": "knob"})
    try:
        db.c.insert_many([{"_id": DOCS + i} for i in range(10)])
        n, took = timed_count(db, {"snapshotName": "knob", "workNsPerDoc": NS})
        assert n == DOCS
        assert took >= DOCS * NS / 1e9
    finally:
        db.command({"dropSnapshot": "knob"})
    # The command's own snapshot (no strategy, no name) honours it too.
    n, took = timed_count(db, {"workNsPerDoc": NS})
    assert n == DOCS + 10
    assert took >= (DOCS + 10) * NS / 1e9


@pytest.mark.parametrize(
    "value,code",
    [
        ("100", 14),
        (True, 14),
        ({"n": 1}, 14),
        (-1, 2),
        (1_000_001, 2),
        (2**40, 2),
        (1.5, 2),
    ],
    ids=["string", "bool", "document", "negative", "over-max", "huge", "fraction"],
)
def test_bad_values_are_refused(db, value, code):
    db.c.insert_one({"_id": 1})
    with pytest.raises(OperationFailure) as e:
        db.command({"count": "c", "$duet": {"snapshot": "vls", "workNsPerDoc": value}})
    assert e.value.code == code


def test_bounds_and_whole_doubles_are_accepted(db):
    db.c.insert_one({"_id": 1})
    for v in [0, 1_000_000, 10.0]:
        r = db.command({"count": "c", "$duet": {"snapshot": "vls", "workNsPerDoc": v}})
        assert r["n"] == 1


def test_other_commands_refuse_the_knob(db):
    db.c.insert_one({"_id": 1})
    with pytest.raises(OperationFailure) as e:
        db.command({"find": "c", "$duet": {"snapshot": "vls", "workNsPerDoc": 10}})
    assert e.value.code == 2
    with pytest.raises(OperationFailure) as e:
        db.command({"distinct": "c", "key": "_id", "$duet": {"workNsPerDoc": 10}})
    assert e.value.code == 2
