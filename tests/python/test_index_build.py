"""Index builds that do not block writes (issue #18 item 9): createIndexes on
a collection of 10,000 documents or more builds from a snapshot outside the
writer, catches up with the writes made meanwhile and publishes; other
clients' writes are acknowledged during the build; currentOp shows the
build's progress; killOp and dropIndexes abort it and leave no index; a
client that disconnects during its build does not abort it (MongoDB keeps
building), and the build stays listed and killable."""

import threading
import time

import pytest
from pymongo import ASCENDING
from pymongo.errors import OperationFailure

import wire

N = 12_000
# 20 keys per document: enough work for the build to last while it is watched.
ARRAY = list(range(20))


def fill(coll):
    coll.insert_many(
        [{"_id": i, "a": i % 101, "arr": [i + k for k in ARRAY]} for i in range(N)],
        ordered=False,
    )


class Watcher:
    """Runs in the background while a build does: a writer on another
    collection and another connection (timestamps of acknowledged writes),
    and a currentOp poller (entries showing a build's progress)."""

    def __init__(self, server, db_name, coll_name):
        self.stop = threading.Event()
        self.acks = []
        self.builds = []
        self.errors = []
        writer_client = server.client()
        op_client = server.client()
        self.clients = [writer_client, op_client]
        wcoll = writer_client[db_name][coll_name]

        def write():
            i = 0
            try:
                while not self.stop.is_set():
                    i += 1
                    wcoll.update_one({"_id": i % N}, {"$inc": {"w": 1}, "$set": {"a": i}})
                    self.acks.append(time.monotonic())
            except Exception as e:  # reported by the test
                self.errors.append(e)

        def poll():
            try:
                while not self.stop.is_set():
                    for op in op_client.admin.command("currentOp")["inprog"]:
                        if "progress" in op and "createIndexes" in op.get("command", {}):
                            self.builds.append(op)
                    time.sleep(0.005)
            except Exception as e:
                self.errors.append(e)

        self.threads = [threading.Thread(target=write), threading.Thread(target=poll)]
        for t in self.threads:
            t.start()

    def finish(self):
        self.stop.set()
        for t in self.threads:
            t.join()
        for c in self.clients:
            c.close()
        assert not self.errors, self.errors


def test_writes_proceed_during_a_large_index_build(server, db):
    fill(db.big)
    watch = Watcher(server, db.name, "big")
    time.sleep(0.1)
    start = time.monotonic()
    name = db.big.create_index([("arr", ASCENDING)])
    end = time.monotonic()
    watch.finish()
    during = [t for t in watch.acks if start < t < end]
    assert len(during) > 0, f"no write acknowledged during a {end - start:.2f} s build"
    assert name == "arr_1"
    # The index holds the writes made during the build: index and scan agree.
    probe = {"arr": {"$gte": N // 2, "$lt": N // 2 + 100}}
    by_index = sorted(d["_id"] for d in db.big.find(probe).hint("arr_1"))
    by_scan = sorted(d["_id"] for d in db.big.find(probe).hint({"$natural": 1}))
    assert by_index == by_scan and by_index
    probe = {"a": {"$gt": 200}}
    db.big.create_index([("a", ASCENDING)])
    assert db.big.count_documents(probe, hint="a_1") == db.big.count_documents(
        probe, hint={"$natural": 1}
    )
    # currentOp showed the build with MongoDB's fields.
    assert watch.builds, "currentOp never showed the build"
    op = watch.builds[-1]
    assert set(op["progress"]) == {"done", "total"}
    assert op["msg"].startswith("Index Build:"), op["msg"]
    scanning = [o for o in watch.builds if "scanning collection" in o["msg"]]
    assert scanning and scanning[0]["progress"]["total"] == N


def build_in_thread(coll, **kw):
    out = {}

    def run():
        try:
            out["name"] = coll.create_index([("arr", ASCENDING)], **kw)
        except OperationFailure as e:
            out["error"] = e

    t = threading.Thread(target=run)
    t.start()
    return t, out


def running_build(client, deadline=20):
    end = time.monotonic() + deadline
    while time.monotonic() < end:
        for op in client.admin.command("currentOp")["inprog"]:
            if "progress" in op and "createIndexes" in op.get("command", {}):
                return op
        time.sleep(0.002)
    pytest.fail("the build never showed in currentOp")


@pytest.mark.parametrize("how", ["killOp", "dropIndexes"])
def test_abort_leaves_no_index(client, db, how):
    fill(db.big)
    t, out = build_in_thread(db.big, unique=False)
    op = running_build(client)
    if how == "killOp":
        client.admin.command("killOp", op=op["opid"])
    else:
        db.command("dropIndexes", "big", index="arr_1")
    t.join()
    assert "error" in out, f"the build finished first: {out}"
    code = out["error"].code
    assert code == (11601 if how == "killOp" else 276), out["error"]
    assert [i["name"] for i in db.big.list_indexes()] == ["_id_"]


def test_unique_build_over_duplicates_fails_and_leaves_nothing(db):
    fill(db.big)
    db.big.insert_one({"_id": -1, "a": 0, "arr": [5]})
    with pytest.raises(OperationFailure) as e:
        db.big.create_index([("arr", ASCENDING)], unique=True)
    assert e.value.code == 11000
    assert [i["name"] for i in db.big.list_indexes()] == ["_id_"]


def index_names(coll):
    return [i["name"] for i in coll.list_indexes()]


@pytest.mark.parametrize("then", ["finish", "killOp"])
def test_a_build_survives_its_clients_disconnect(server, client, db, then):
    """The client sends createIndexes on its own connection and closes it
    while the build runs: the build goes on to the end (the index appears)
    and stays in currentOp meanwhile, where killOp still aborts it."""
    fill(db.big)
    s = wire.connect(server.port)
    s.sendall(wire.op_msg({"createIndexes": "big", "$db": db.name,
                           "indexes": [{"key": {"arr": 1}, "name": "arr_1"}]}))
    op = running_build(client)
    s.close()
    if then == "killOp":
        # Still listed once the server saw the disconnect, and still killable.
        time.sleep(0.05)
        assert any(o.get("opid") == op["opid"]
                   for o in client.admin.command("currentOp")["inprog"]), "ended early"
        client.admin.command("killOp", op=op["opid"])
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        listed = [o for o in client.admin.command("currentOp")["inprog"]
                  if o.get("opid") == op["opid"]]
        if not listed:
            break
        time.sleep(0.02)
    else:
        pytest.fail("the build never ended")
    if then == "finish":
        assert index_names(db.big) == ["_id_", "arr_1"]
        probe = {"arr": {"$gte": N // 2, "$lt": N // 2 + 50}}
        assert sorted(d["_id"] for d in db.big.find(probe).hint("arr_1")) == sorted(
            d["_id"] for d in db.big.find(probe).hint({"$natural": 1}))
    else:
        assert index_names(db.big) == ["_id_"]
