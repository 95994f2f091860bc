"""Issue #14's limits seen from a real driver and from the server process's
memory (the `duet` binary with its own allocator): cursors belong to their
session, a huge `$concat` fails before it is built, and half-sent messages
give their memory back to the OS when their connections close."""

import socket
import struct
import time

import pytest
from bson import Int64
from pymongo.errors import OperationFailure

MB = 1024 * 1024


def status_mb(pid, field):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) // 1024
    raise AssertionError(f"no {field} for {pid}")


def test_a_cursor_belongs_to_its_session(server, db):
    db.c.insert_many([{"_id": i} for i in range(10)])
    other = server.client()
    try:
        with db.client.start_session() as mine:
            r = db.command({"find": "c", "batchSize": 2}, session=mine)
            cid = r["cursor"]["id"]
            assert cid != 0
            # Another client (another session) can neither read nor kill it.
            with pytest.raises(OperationFailure) as e:
                other[db.name].command({"getMore": Int64(cid), "collection": "c"})
            assert e.value.code == 50738
            k = other[db.name].command({"killCursors": "c", "cursors": [Int64(cid)]})
            assert k["cursorsNotFound"] == [cid]
            # The owner goes on.
            m = db.command({"getMore": Int64(cid), "collection": "c", "batchSize": 100},
                           session=mine)
            assert len(m["cursor"]["nextBatch"]) == 8
            assert m["cursor"]["id"] == 0
        # Ordinary driver cursors just work.
        assert len(list(db.c.find(batch_size=3))) == 10
    finally:
        other.close()


def test_huge_concat_fails_before_it_is_built(make_server):
    srv = make_server("--message-timeout-secs", "30")
    c = srv.client()
    try:
        coll = c.t.big
        coll.insert_one({"_id": 1, "s": "x" * (8 * MB)})
        before = status_mb(srv.proc.pid, "VmHWM")
        with pytest.raises(OperationFailure) as e:
            list(coll.aggregate([{"$project": {"c": {"$concat": ["$s"] * 40}}}]))
        assert e.value.code == 10334
        grown = status_mb(srv.proc.pid, "VmHWM") - before
        # Built whole, this was a 320 MB string and +1 GB of RSS.
        assert grown < 200, f"peak grew by {grown} MB"
        assert c.admin.command("ping")["ok"] == 1.0
    finally:
        c.close()


def test_half_sent_messages_give_their_memory_back(make_server):
    srv = make_server("--max-incomplete-message-mb", "512", "--message-timeout-secs", "30")
    pid = srv.proc.pid
    base = status_mb(pid, "VmRSS")
    socks = []
    chunk = b"\0" * MB
    for _ in range(8):
        s = socket.create_connection(("127.0.0.1", srv.port))
        s.sendall(struct.pack("<iiii", 40_000_000, 1, 0, 2013))
        for _ in range(20):
            s.sendall(chunk)
        socks.append(s)
    held = base
    deadline = time.time() + 10
    while time.time() < deadline:
        held = status_mb(pid, "VmRSS")
        if held - base >= 120:
            break
        time.sleep(0.05)
    assert held - base >= 120, f"8 x 20 MB arrived, RSS only +{held - base} MB"
    for s in socks:
        s.close()
    after = held
    deadline = time.time() + 10
    while time.time() < deadline:
        after = status_mb(pid, "VmRSS")
        if after - base < 30:
            break
        time.sleep(0.05)
    assert after - base < 30, f"RSS {base} -> {held} -> {after} MB after the connections closed"
    c = srv.client()
    try:
        assert c.admin.command("ping")["ok"] == 1.0
    finally:
        c.close()


def test_writes_past_max_memory_fail_clearly_and_resume(make_server):
    """--max-memory-gb: past it, commands that add data fail with 146
    ExceededMemoryLimit and change nothing; reads, deletes and drops work;
    once memory is freed, writes resume."""
    from pymongo.errors import OperationFailure as OF
    probe = make_server()
    with probe.client() as c:
        mem = c.admin.command("serverStatus")["duet"]["memory"]
        assert mem["limitBytes"] is None and mem["writesRefused"] == 0
        base = mem["residentBytes"]
    probe.stop()
    assert base > 0
    srv = make_server("--max-memory-gb", f"{(base + 64 * MB) / 1024 ** 3:.6f}")
    c = srv.client()
    try:
        big = c.t.big
        pad = "x" * 2000
        state = {"n": 0, "batch": 0}

        def fill():
            """Insert batches until one is refused; that refusal."""
            while state["batch"] < 1000:
                i = state["batch"]
                state["batch"] += 1
                try:
                    big.insert_many([{"_id": i * 500 + j, "pad": pad} for j in range(500)])
                    state["n"] += 500
                except OF as e:
                    return e
            pytest.fail(f"{state['n']} documents inserted, never refused")

        def refused(op):
            """`op` refused with 146 once the data fills the limit. A refusal
            asks every thread to hand its free pages back (threads that write
            in place answer when they park), so the resident size may fall
            back under 90% of the limit right after one — writes are then
            admitted again, rightly; so fill again and retry until `op` meets
            a limit the data itself fills."""
            for attempt in range(50):
                fill()
                try:
                    op(attempt)
                except OF as e:
                    return e
            pytest.fail("never refused")

        first = fill()
        assert first.code == 146 and "--max-memory-gb" in str(first), first.details
        # The refused batch changed nothing; reads work.
        assert big.count_documents({}) == state["n"]
        e = refused(lambda _: big.update_one({"_id": 0}, {"$set": {"more": pad}}, upsert=True))
        assert e.code == 146
        e = refused(lambda k: c.t.create_collection(f"another{k}"))
        assert e.code == 146
        st = c.admin.command("serverStatus")["duet"]["memory"]
        # Three refusals counted. (The resident size is not checked against
        # the limit here: the refusals asked every thread to hand its free
        # pages back, and threads that write in place answer as soon as they
        # park, so the size may already be under 90% of the limit, where
        # writes are admitted again; seen once at 86 of 110 MB.)
        assert st["writesRefused"] >= 3 and st["limitBytes"] > 0
        # Deletes and drops are not refused; once memory is back, writes are.
        assert big.delete_many({"_id": {"$lt": 1000}}).deleted_count == 1000
        big.drop()
        # Every thread hands the freed pages back when asked (memory.rs);
        # before that, mimalloc kept them for 9-19 s or for good.
        deadline = time.time() + 10
        while True:
            try:
                c.t.small.insert_one({"_id": 1})
                break
            except OF as e:
                assert e.code == 146
                if time.time() > deadline:
                    pytest.fail(f"writes still refused 10 s after the drop: {e}")
                time.sleep(0.2)
        assert c.t.small.find_one() == {"_id": 1}
    finally:
        c.close()
