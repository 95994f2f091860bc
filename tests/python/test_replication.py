"""Replica sets (issue #21): three `duet serve` processes on loopback ports
form a set (`--replica-set rs0 --members a,b,c --member-id N`); pymongo with
`replicaSet=rs0` discovers it, writes go to the primary and are read on the
secondaries, and SIGKILL of the primary during a `w: "majority"` write
stream loses no acknowledged write while pymongo's retryable writes carry on
on the newly elected primary.
"""

import os
import random
import shutil
import signal
import socket
import subprocess
import threading
import time
from pathlib import Path

import bson
import pytest
from pymongo import MongoClient, ReadPreference, monitoring
from pymongo.read_concern import ReadConcern
from pymongo.errors import (
    ConnectionFailure,
    NotPrimaryError,
    OperationFailure,
    ServerSelectionTimeoutError,
    WriteConcernError,
)
from pymongo.write_concern import WriteConcern

import wire
from conftest import DUET

SET = "rs0"


def free_ports(n):
    """Ports p with p + 1000 (the member's Raft port) free too, both below
    the kernel's ephemeral range (32768 and up on Linux): a port taken from
    that range can be handed to any outgoing connection (a driver's, another
    test's) before the member binds it."""
    out = []
    rng = random.Random()
    while len(out) < n:
        p = rng.randrange(20000, 31000)
        if any(abs(p - q) in (0, 1000) for q in out):
            continue
        try:
            with socket.socket() as a, socket.socket() as b:
                a.bind(("127.0.0.1", p))
                b.bind(("127.0.0.1", p + 1000))
        except OSError:
            continue
        out.append(p)
    return out


class Member:
    def __init__(self, tmp: Path, i: int, ports, extra=()):
        self.i, self.port = i, ports[i]
        self.extra = list(extra)
        self.members = ",".join(f"127.0.0.1:{p}" for p in ports)
        self.dir = tmp / f"m{i}"
        self.log_path = tmp / f"m{i}.log"
        self.proc = None
        self.start()

    def start(self):
        self.log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(
            [str(DUET), "serve", "--bind", "127.0.0.1", "--port", str(self.port),
             "--data-dir", str(self.dir), "--log-level", "info",
             "--replica-set", SET, "--members", self.members, "--member-id", str(self.i),
             *self.extra],
            stdout=self.log, stderr=subprocess.STDOUT,
        )
        deadline = time.time() + 20
        while time.time() < deadline:
            if self.proc.poll() is not None:
                pytest.fail(f"member {self.i} exited early:\n{self.log_path.read_text()}")
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=0.2).close()
                return
            except OSError:
                time.sleep(0.05)
        pytest.fail(f"member {self.i} did not listen within 20 s")

    def direct(self, **kw):
        kw.setdefault("serverSelectionTimeoutMS", 5000)
        return MongoClient(f"mongodb://127.0.0.1:{self.port}/?directConnection=true", **kw)

    def kill(self):
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()
        self.log.close()

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                return self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
                return None
            finally:
                self.log.close()
        return self.proc.returncode


@pytest.fixture
def cluster(tmp_path):
    ports = free_ports(3)
    members = [Member(tmp_path, i, ports) for i in range(3)]
    yield members
    codes = [m.stop() for m in members]
    for m, code in zip(members, codes):
        if m.proc.returncode != -signal.SIGKILL:
            assert code == 0, f"member {m.i} exited with {code}:\n{m.log_path.read_text()[-3000:]}"


def set_client(members, **kw):
    hosts = ",".join(f"127.0.0.1:{m.port}" for m in members)
    kw.setdefault("serverSelectionTimeoutMS", 30000)
    return MongoClient(f"mongodb://{hosts}/?replicaSet={SET}", **kw)


def primary_of(members, timeout=30):
    deadline = time.time() + timeout
    while time.time() < deadline:
        for m in members:
            if m.proc.poll() is not None:
                continue
            try:
                with m.direct(serverSelectionTimeoutMS=1000) as c:
                    if c.admin.command("hello").get("isWritablePrimary"):
                        return m
            except ConnectionFailure:
                pass
        time.sleep(0.1)
    pytest.fail("no primary elected")


def wait_for(what, ok, timeout=30):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if ok():
            return
        time.sleep(0.05)
    pytest.fail(f"timed out waiting for {what}")


def test_drivers_discover_the_set_and_read_writes_on_secondaries(cluster):
    p = primary_of(cluster)
    with set_client(cluster) as c:
        coll = c.get_database("app", write_concern=WriteConcern("majority")).items
        coll.insert_many([{"_id": i, "v": i} for i in range(50)])
        coll.update_many({"_id": {"$lt": 10}}, {"$set": {"tag": "x"}})
        assert c.primary == ("127.0.0.1", p.port)
        hello = c.admin.command("hello")
        assert hello["setName"] == SET
        assert sorted(hello["hosts"]) == sorted(f"127.0.0.1:{m.port}" for m in cluster)
        assert hello["primary"] == f"127.0.0.1:{p.port}"
        assert hello["isWritablePrimary"] is True
        assert hello["lastWrite"]["opTime"]["t"] >= 1
        # Reads routed by the driver to a secondary see the writes.
        sec = c.get_database("app", read_preference=ReadPreference.SECONDARY).items
        wait_for("the secondaries to apply", lambda: sec.count_documents({"tag": "x"}) == 10)
    for m in cluster:
        if m is p:
            continue
        with m.direct(read_preference=ReadPreference.SECONDARY_PREFERRED) as d:
            # A member that lost the first election follows the primary
            # once it hears from it.
            wait_for("member %d to follow" % m.i, lambda: d.admin.command("hello")["secondary"])
            h = d.admin.command("hello")
            assert h["secondary"] is True and h["isWritablePrimary"] is False
            assert h["primary"] == f"127.0.0.1:{p.port}" and "electionId" not in h
            # Both writes: the inserts and the update (the wait through
            # readPreference above may have read the other secondary).
            wait_for("member %d to apply" % m.i,
                     lambda: d.app.items.count_documents({}) == 50
                     and d.app.items.count_documents({"tag": "x"}) == 10)
            assert d.app.items.find_one({"_id": 3}) == {"_id": 3, "v": 3, "tag": "x"}
            # Writes on a secondary: NotWritablePrimary (10107).
            with pytest.raises(NotPrimaryError) as e:
                d.app.items.insert_one({"_id": 1000})
            assert e.value.details["code"] == 10107
            assert d.app.items.count_documents({"_id": 1000}) == 0


def test_secondary_reads_need_secondary_ok(cluster):
    p = primary_of(cluster)
    s = next(m for m in cluster if m is not p)
    with set_client(cluster) as c:
        c.app.items.insert_one({"_id": 1})
    with wire.connected(s.port) as sock:
        reply = wire.command(sock, {"find": "items", "$db": "app"})
        assert reply["ok"] == 0 and reply["code"] == 13435, reply
        assert reply["codeName"] == "NotPrimaryNoSecondaryOk"
        reply = wire.command(sock, {"find": "items", "$db": "app",
                                    "$readPreference": {"mode": "secondaryPreferred"}})
        assert reply["ok"] == 1, reply
        # A retryable write on a secondary carries the label drivers retry on.
        reply = wire.command(sock, {"insert": "items", "$db": "app", "documents": [{"_id": 2}],
                                    "lsid": {"id": bson.Binary(os.urandom(16), 4)},
                                    "txnNumber": bson.Int64(1)})
        assert reply["code"] == 10107 and "RetryableWriteError" in reply["errorLabels"], reply


def test_linearizable_reads_are_served_by_the_primary_only(cluster):
    """Read concern linearizable: the primary serves it (once a majority
    confirmed it still leads); a secondary refuses it with 10107
    NotWritablePrimary and MongoDB's message, though it serves the same read
    without it."""
    p = primary_of(cluster)
    with set_client(cluster) as c:
        c.get_database("app", write_concern=WriteConcern(w=3)).items.insert_one({"_id": 1})
        lin = c.get_database("app", read_concern=ReadConcern("linearizable")).items
        assert lin.find_one({"_id": 1}) == {"_id": 1}
    find = {"find": "items", "$db": "app", "filter": {"_id": 1}}
    linearizable = {"readConcern": {"level": "linearizable"}}
    on_sec = {"$readPreference": {"mode": "secondaryPreferred"}}
    with wire.connected(p.port) as sock:
        reply = wire.command(sock, {**find, **linearizable})
        assert reply["ok"] == 1 and reply["cursor"]["firstBatch"] == [{"_id": 1}], reply
    for m in cluster:
        if m is p:
            continue
        with wire.connected(m.port) as sock:
            reply = wire.command(sock, {**find, **linearizable, **on_sec})
            assert reply["ok"] == 0 and reply["code"] == 10107, reply
            assert reply["codeName"] == "NotWritablePrimary"
            assert reply["errmsg"] == "cannot satisfy linearizable read concern on non-primary node"
            reply = wire.command(sock, {**find, **on_sec})
            assert reply["ok"] == 1 and reply["cursor"]["firstBatch"] == [{"_id": 1}], reply


class Served(monitoring.CommandListener):
    """Which server each `find` went to."""

    def __init__(self):
        self.finds = []

    def started(self, event):
        if event.command_name == "find":
            self.finds.append(event.connection_id)

    def succeeded(self, event):
        pass

    def failed(self, event):
        pass


def test_read_preference_nearest_is_served_by_any_member(cluster):
    """readPreference=nearest: with every member within the latency window,
    pymongo spreads reads over all of them, and secondaries serve them (a
    secondary accepts mode 'nearest' as allowing it to answer)."""
    p = primary_of(cluster)
    with set_client(cluster) as c:
        c.get_database("app", write_concern=WriteConcern(w=3)).items.insert_many(
            [{"_id": i} for i in range(5)])
    served = Served()
    hosts = ",".join(f"127.0.0.1:{m.port}" for m in cluster)
    with MongoClient(f"mongodb://{hosts}/?replicaSet={SET}&readPreference=nearest"
                     "&localThresholdMS=100000", event_listeners=[served],
                     serverSelectionTimeoutMS=30000) as c:
        wait_for("every member known", lambda: len(c.nodes) == 3)
        for _ in range(40):
            assert sorted(d["_id"] for d in c.app.items.find()) == list(range(5))
    ports = {addr[1] for addr in served.finds}
    assert len(served.finds) == 40
    assert len(ports) >= 2 and ports - {p.port}, ports
    with wire.connected(next(m for m in cluster if m is not p).port) as sock:
        reply = wire.command(sock, {"find": "items", "$db": "app", "filter": {"_id": 0},
                                    "$readPreference": {"mode": "nearest"}})
        assert reply["ok"] == 1 and reply["cursor"]["firstBatch"] == [{"_id": 0}], reply


def test_a_change_stream_resumes_on_the_new_primary_after_a_kill(cluster):
    """A change stream read on the primary; the primary is SIGKILLed; the
    stream resumed on the new primary with the last token the old one gave
    returns every later event once, in order: those written before the kill
    that the old stream had not returned, and those written after it."""
    old = primary_of(cluster)
    with set_client(cluster, retryWrites=True) as c:
        coll = c.get_database("app", write_concern=WriteConcern("majority")).events
        coll.insert_one({"_id": -1})
        seen = []
        with old.direct() as d, d.app.events.watch(max_await_time_ms=200) as s:
            coll.insert_many([{"_id": i} for i in range(10)])
            deadline = time.time() + 30
            while len(seen) < 6 and time.time() < deadline:
                e = s.try_next()
                if e is not None:
                    seen.append(e["documentKey"]["_id"])
            token = s.resume_token
        assert seen == list(range(6)), seen
        old.kill()
        survivors = [m for m in cluster if m is not old]
        new = primary_of(survivors, timeout=60)
        sees_primary(c, new)
        for i in range(10, 20):
            coll.insert_one({"_id": i})
        got = []
        with new.direct() as d, d.app.events.watch(resume_after=token,
                                                    max_await_time_ms=200) as s:
            deadline = time.time() + 30
            while len(got) < 14 and time.time() < deadline:
                e = s.try_next()
                if e is not None:
                    assert e["operationType"] == "insert", e
                    got.append(e["documentKey"]["_id"])
            # Nothing more: no event twice.
            time.sleep(0.5)
            while (e := s.try_next()) is not None:
                got.append(e["documentKey"]["_id"])
        assert got == list(range(6, 20)), got
    old.start()


def test_write_concerns(cluster):
    primary_of(cluster)
    with set_client(cluster) as c:
        db = c.app
        for w in (1, "majority", 2, 3):
            db.get_collection("wc", write_concern=WriteConcern(w=w, wtimeout=20000)).insert_one({"w": str(w)})
        assert db.wc.count_documents({}) == 4
        with pytest.raises(OperationFailure) as e:
            db.get_collection("wc", write_concern=WriteConcern(w=4)).insert_one({})
        assert e.value.code == 100
        with pytest.raises(OperationFailure) as e:
            db.get_collection("wc", write_concern=WriteConcern(w="dc1")).insert_one({})
        assert e.value.code == 79


def test_write_concern_times_out_when_members_are_down(cluster):
    p = primary_of(cluster)
    others = [m for m in cluster if m is not p]
    with set_client(cluster) as c:
        c.app.wc.insert_one({"_id": 0})
        others[0].kill()
        coll = c.app.get_collection("wc", write_concern=WriteConcern(w=3, wtimeout=500))
        with pytest.raises(WriteConcernError) as e:
            coll.insert_one({"_id": 1})
        assert e.value.code == 64
        assert e.value.details["errInfo"]["wtimeout"] is True
        # The write itself was committed (a majority is up).
        assert c.app.wc.find_one({"_id": 1}) == {"_id": 1}


def test_w_n_counts_members_that_applied_the_write(cluster):
    """`w: N` waits for N members that applied the write (MongoDB's
    meaning), not N Raft logs holding it: a secondary under `fsync` lock
    receives the log but applies nothing, so `w: 3` times out (64) while
    `w: 2` (the primary and the other secondary) is met; unlocked, `w: 3`
    is met again."""
    p = primary_of(cluster)
    locked = [m for m in cluster if m is not p][0]
    with set_client(cluster) as c:
        c.app.get_collection("wa", write_concern=WriteConcern(w=3, wtimeout=20000)).insert_one({"_id": 0})
        with locked.direct() as d:
            assert d.admin.command("fsync", lock=True)["ok"] == 1
            try:
                coll = c.app.get_collection("wa", write_concern=WriteConcern(w=3, wtimeout=1500))
                with pytest.raises(WriteConcernError) as e:
                    coll.insert_one({"_id": 1})
                assert e.value.code == 64, e.value.details
                c.app.get_collection("wa", write_concern=WriteConcern(w=2, wtimeout=20000)).insert_one({"_id": 2})
            finally:
                d.admin.command("fsyncUnlock")
        c.app.get_collection("wa", write_concern=WriteConcern(w=3, wtimeout=20000)).insert_one({"_id": 3})
        assert c.app.wa.count_documents({}) == 4


def test_status_config_and_step_down(cluster):
    p = primary_of(cluster)
    with p.direct() as d:
        st = d.admin.command("replSetGetStatus")
        assert st["set"] == SET and st["myState"] == 1
        names = sorted(m["name"] for m in st["members"])
        assert names == sorted(f"127.0.0.1:{m.port}" for m in cluster)
        me = [m for m in st["members"] if m["self"]]
        assert len(me) == 1 and me[0]["stateStr"] == "PRIMARY"
        conf = d.admin.command("replSetGetConfig")["config"]
        assert conf["_id"] == SET and [m["_id"] for m in conf["members"]] == [0, 1, 2]
        with pytest.raises(OperationFailure) as e:
            d.app.command("replSetGetStatus")
        assert e.value.code == 13
        # Membership changes (test_reconfig.py): a config whose version is
        # not above the current one is refused.
        conf["members"] = conf["members"][:2]
        with pytest.raises(OperationFailure) as e:
            d.admin.command("replSetReconfig", conf)
        assert e.value.code == 103 and "not newer" in str(e.value), e.value.details
        assert d.admin.command("replSetGetConfig")["config"]["version"] == 1
        d.admin.command("replSetStepDown", 30, secondaryCatchUpPeriodSecs=10)
    q = primary_of(cluster)
    assert q is not p
    with set_client(cluster) as c:
        c.app.after.insert_one({"_id": "after step-down"})
        assert c.primary == ("127.0.0.1", q.port)
    with p.direct(read_preference=ReadPreference.SECONDARY_PREFERRED) as d:
        with pytest.raises(NotPrimaryError) as e:
            d.admin.command("replSetStepDown", 10)
        assert e.value.details["code"] == 10107


def test_leader_kill_during_majority_writes_loses_nothing(cluster):
    """SIGKILL the primary during a stream of `w: majority` retryable
    inserts: a new primary is elected, the stream completes through the
    driver's retries, and every acknowledged insert is on the surviving
    members (and on the killed one after it restarts)."""
    primary_of(cluster)
    acked, errors = [], []
    n = 400
    with set_client(cluster, retryWrites=True) as c:
        coll = c.get_database("app", write_concern=WriteConcern("majority")).stream
        kill_at = 120

        def writer():
            # No retry loop of our own: a new attempt would be a new write
            # (a new txnNumber), so only the driver's own retry, which the
            # set deduplicates, may repeat an insert.
            for i in range(n):
                try:
                    coll.insert_one({"_id": i})
                    acked.append(i)
                except Exception as e:  # noqa: BLE001 - recorded for the assert
                    errors.append((i, repr(e)))

        t = threading.Thread(target=writer)
        t.start()
        wait_for("writes before the kill", lambda: len(acked) >= kill_at)
        victim = primary_of(cluster)
        started = time.time()
        victim.kill()
        t.join(timeout=120)
        assert not t.is_alive(), "the write stream did not finish"
        failover_s = time.time() - started
        assert errors == [], errors
        assert acked == list(range(n))
        survivors = [m for m in cluster if m is not victim]
        new = primary_of(survivors)
        assert new is not victim
        for m in survivors:
            with m.direct(read_preference=ReadPreference.SECONDARY_PREFERRED) as d:
                wait_for("member %d to hold every acknowledged write" % m.i,
                         lambda: d.app.stream.count_documents({}) == n)
        print(f"stream finished {failover_s:.1f} s after the kill")
    victim.start()
    with victim.direct(read_preference=ReadPreference.SECONDARY_PREFERRED) as d:
        wait_for("the killed member to catch up", lambda: d.app.stream.count_documents({}) == n)
        assert d.admin.command("hello")["secondary"] is True


def test_a_retried_write_is_not_applied_twice_on_a_new_primary(cluster):
    """A retryable write applied through one primary, retried with the same
    lsid and txnNumber on the next one (what a driver does when the first
    primary dies before answering), is answered as done, not re-run."""
    p = primary_of(cluster)
    lsid = {"id": bson.Binary(os.urandom(16), 4)}
    insert = {"insert": "retry", "$db": "app", "documents": [{"_id": 1}],
              "lsid": lsid, "txnNumber": bson.Int64(7)}
    # A primary younger than its followers' leader lease (5 s) cannot hand
    # over at once: its heir's first election is refused and it stands
    # again after its election timeout.
    with wire.connected(p.port, timeout=20) as sock:
        assert wire.command(sock, insert)["n"] == 1
        assert wire.command(sock, {"replSetStepDown": 30, "$db": "admin"})["ok"] == 1
    q = primary_of(cluster)
    assert q is not p
    # The stepping-down primary asked its heir to stand (Raft TimeoutNow).
    assert any("asked to stand for election" in m.log_path.read_text()
               for m in cluster if m is not p)
    with wire.connected(q.port) as sock:
        wait_for("the new primary to apply the write", lambda: wire.command(
            sock, {"count": "retry", "$db": "app"})["n"] == 1)
        reply = wire.command(sock, insert)
        assert reply["ok"] == 1 and reply["n"] == 1 and "writeErrors" not in reply, reply
        # Control: the same insert as a new write (another txnNumber) does run.
        reply = wire.command(sock, dict(insert, txnNumber=bson.Int64(8)))
        assert reply["writeErrors"][0]["code"] == 11000, reply
        assert wire.command(sock, {"count": "retry", "$db": "app"})["n"] == 1


def sees_primary(client, m, timeout=30):
    """Wait until `client` has found `m` as the set's primary."""
    def ok():
        try:
            return client.admin.command("hello")["me"] == f"127.0.0.1:{m.port}"
        except ConnectionFailure:
            return False
    wait_for("the driver to find the new primary", ok, timeout)


def test_a_retried_commit_and_write_are_recognised_after_a_leader_kill_and_restarts(cluster):
    """The set remembers which retryable writes and transaction commits it
    applied (their lsid + txnNumber), durably and on every member: a
    pymongo `commit_transaction` retried after SIGKILL of the primary that
    committed it succeeds on the new primary (MongoDB answers a retried
    commit of a committed transaction with ok), and after every member
    restarted, the primary (a restarted member) still answers the retried
    commit and a retried write as done without applying the write again."""
    p = primary_of(cluster)
    lsid = {"id": bson.Binary(os.urandom(16), 4)}
    insert = {"insert": "retry", "$db": "app", "documents": [{"_id": 1}],
              "lsid": lsid, "txnNumber": bson.Int64(7)}
    with wire.connected(p.port, timeout=20) as sock:
        assert wire.command(sock, insert)["n"] == 1
    with set_client(cluster, retryWrites=True) as c:
        coll = c.get_database("app", write_concern=WriteConcern("majority")).txn
        with c.start_session() as s:
            s.start_transaction()
            coll.insert_one({"_id": 1}, session=s)
            coll.insert_one({"_id": 2}, session=s)
            s.commit_transaction()
            p.kill()
            new = primary_of(cluster)
            assert new is not p
            # The driver's one retry of a commit follows its rediscovery;
            # here the test waits for that rather than racing it.
            sees_primary(c, new)
            # pymongo sends the commit again (same lsid and txnNumber) to
            # the new primary, whose session table never saw it.
            s.commit_transaction()
            assert coll.count_documents({}) == 2
            for m in cluster:
                if m is not p:
                    m.stop()
            for m in cluster:
                m.start()
            q = primary_of(cluster)
            sees_primary(c, q)
            s.commit_transaction()
        assert coll.count_documents({}) == 2
    with wire.connected(q.port, timeout=20) as sock:
        reply = wire.command(sock, insert)
        assert reply["ok"] == 1 and reply["n"] == 1 and "writeErrors" not in reply, reply
        # Control: the same insert as a new write (another txnNumber) does run.
        reply = wire.command(sock, dict(insert, txnNumber=bson.Int64(8)))
        assert reply["writeErrors"][0]["code"] == 11000, reply
        # A commit of a transaction the set never ran is still 251.
        reply = wire.command(sock, {"commitTransaction": 1, "$db": "admin", "lsid": lsid,
                                    "txnNumber": bson.Int64(9), "autocommit": False})
        assert reply["ok"] == 0 and reply["code"] == 251, reply


def assert_committed(sock, txn, where=""):
    """`abortTransaction` of committed transaction `txn` is MongoDB's 256,
    before and after a retried `commitTransaction` (ok)."""
    for command in ("abortTransaction", "commitTransaction", "abortTransaction"):
        reply = wire.command(sock, dict({command: 1, "$db": "admin"}, **txn))
        if command == "commitTransaction":
            assert reply["ok"] == 1, (where, reply)
        else:
            assert reply["ok"] == 0 and reply["code"] == 256, (where, reply)
            assert reply["codeName"] == "TransactionCommitted", (where, reply)
            assert reply["errmsg"] == "Transaction 4 has been committed.", (where, reply)


def test_a_retried_write_gets_its_first_reply_after_a_failover_and_restarts(cluster):
    """A retried write (same lsid and txnNumber) answered from the set's
    retry table carries the first execution's reply: an update's `n`,
    `nModified` and `upserted` ids, a findAndModify's `lastErrorObject` and
    `value` (projected by the command's `fields`) — on the primary that ran
    it, on the next primary after a SIGKILL of that one, and on a primary
    after every member restarted. Nothing is applied twice. An
    `abortTransaction` of a transaction committed there is 256
    TransactionCommitted on each of them (251 on the others before)."""
    p = primary_of(cluster)

    def cmd(n, body):
        # A session of its own each: a driver retries its session's newest
        # number only (an older one is 225 TransactionTooOld).
        lsid = {"id": bson.Binary(os.urandom(16), 4)}
        return dict(body, **{"$db": "app", "lsid": lsid, "txnNumber": bson.Int64(n)})

    writes = [
        cmd(1, {"update": "r", "updates": [
            {"q": {"_id": "u1"}, "u": {"$set": {"v": 1}}, "upsert": True}]}),
        cmd(2, {"update": "r", "ordered": True, "updates": [
            {"q": {"_id": "u2"}, "u": {"$inc": {"v": 1}}, "upsert": True},
            {"q": {"_id": "u1"}, "u": {"$inc": {"v": 1}}},
            {"q": {"_id": "none"}, "u": {"$inc": {"v": 1}}},
            {"q": {"_id": "u3"}, "u": {"$set": {"v": 3}}, "upsert": True}]}),
        cmd(3, {"findAndModify": "r", "query": {"_id": "u1"}, "update": {"$inc": {"v": 10}},
                "new": True, "fields": {"v": 1, "_id": 0}}),
        cmd(4, {"findAndModify": "r", "query": {"_id": "f1"}, "update": {"$set": {"w": 1}},
                "upsert": True}),
        cmd(5, {"findAndModify": "r", "query": {"_id": "u2"}, "remove": True}),
        cmd(6, {"delete": "r", "deletes": [{"q": {"_id": "u3"}, "limit": 1}]}),
        cmd(7, {"insert": "r", "documents": [{"_id": "i1"}, {"_id": "i2"}]}),
    ]
    with wire.connected(p.port, timeout=20) as sock:
        first = [wire.command(sock, w) for w in writes]
        assert first[0]["upserted"] == [{"index": 0, "_id": "u1"}], first[0]
        assert first[1]["n"] == 3 and first[1]["nModified"] == 1, first[1]
        assert first[1]["upserted"] == [{"index": 0, "_id": "u2"}, {"index": 3, "_id": "u3"}]
        assert first[2]["value"] == {"v": 12}, first[2]
        assert first[3]["lastErrorObject"]["upserted"] == "f1" and first[3]["value"] is None
        assert first[4]["value"] == {"_id": "u2", "v": 1}, first[4]
        # The primary that ran them answers from its session table.
        assert [wire.command(sock, w) for w in writes] == first
        # A transaction committed there: aborting it is 256 TransactionCommitted.
        txn = {"lsid": {"id": bson.Binary(os.urandom(16), 4)}, "txnNumber": bson.Int64(4),
               "autocommit": False}
        reply = wire.command(sock, dict({"insert": "t", "documents": [{"_id": 1}],
                                         "startTransaction": True, "$db": "app"}, **txn))
        assert reply["ok"] == 1, reply
        assert wire.command(sock, dict({"commitTransaction": 1, "$db": "admin"}, **txn))["ok"] == 1
        assert_committed(sock, txn)
    want = {"u1": 12, "f1": None}

    def check(where):
        m = primary_of(cluster)
        with wire.connected(m.port, timeout=20) as sock:
            again = [wire.command(sock, w) for w in writes]
            for w, a, b in zip(writes, first, again):
                assert a == b, (where, w, a, b)
            # Its session table never saw the transaction; the set did.
            assert_committed(sock, txn, where)
            found = wire.command(sock, {"find": "r", "$db": "app", "sort": {"_id": 1}})
            docs = found["cursor"]["firstBatch"]
        assert {d["_id"]: d.get("v") for d in docs} == dict(want, i1=None, i2=None), (where, docs)

    p.kill()
    check("the next primary after a SIGKILL of the one that ran them")
    for m in cluster:
        if m is not p:
            m.stop()
    for m in cluster:
        m.start()
    check("a primary after every member restarted")


def snapshot_docs(d, name):
    reply = d.app.command(bson.SON([("find", "items"), ("filter", {}), ("sort", {"_id": 1}),
                                    ("batchSize", 1000), ("$duet", {"snapshotName": name})]),
                          read_preference=ReadPreference.SECONDARY_PREFERRED)
    return reply["cursor"]["firstBatch"]


def test_named_snapshot_is_the_same_on_every_member_and_survives_restarts(cluster):
    """createSnapshot is a log entry: every member takes the snapshot at the
    same log position, so reading it by name gives the same documents on
    every member, and a durable one survives each member's restart."""
    primary_of(cluster)
    with set_client(cluster) as c:
        db = c.get_database("app", write_concern=WriteConcern("majority"))
        db.items.insert_many([{"_id": i, "v": i} for i in range(20)])
        r = db.command("createSnapshot", "s1", durable=True)
        assert r["ok"] == 1 and r["durable"] is True
        db.items.update_many({}, {"$inc": {"v": 100}})
        db.items.insert_one({"_id": 99})
        want = [{"_id": i, "v": i} for i in range(20)]
        with pytest.raises(OperationFailure) as e:
            db.command("createSnapshot", "s1")
        assert e.value.code == 48
    for m in cluster:
        with m.direct(read_preference=ReadPreference.SECONDARY_PREFERRED) as d:
            wait_for("member %d to take the snapshot" % m.i, lambda: any(
                s["name"] == "s1" for s in d.app.command(
                    "listSnapshots", read_preference=ReadPreference.SECONDARY_PREFERRED)["snapshots"]))
            assert snapshot_docs(d, "s1") == want, m.i
    for m in cluster:
        assert m.stop() == 0
        m.start()
        primary_of(cluster)
        with m.direct(read_preference=ReadPreference.SECONDARY_PREFERRED) as d:
            assert snapshot_docs(d, "s1") == want, f"member {m.i} after its restart"
    with set_client(cluster) as c:
        c.app.command("dropSnapshot", "s1")
    for m in cluster:
        with m.direct(read_preference=ReadPreference.SECONDARY_PREFERRED) as d:
            wait_for("member %d to drop the snapshot" % m.i, lambda: not d.app.command(
                "listSnapshots", read_preference=ReadPreference.SECONDARY_PREFERRED)["snapshots"])


def status(m):
    with m.direct() as c:
        return c.admin.command("replSetGetStatus")


def count_if_member(coll):
    try:
        return coll.count_documents({})
    except NotPrimaryError as e:
        assert e.details["code"] == 13436, e.details
        return None


def test_a_wiped_member_catches_up_from_a_raft_snapshot(tmp_path):
    """With a Raft snapshot every 50 entries the log is purged; a member
    whose data directory is wiped comes back empty, receives a snapshot
    (every database's checkpoint image, in chunks), then the log, and holds
    every document; its own restart then starts from its files. The
    snapshot carries the retry table: made primary, the member answers a
    write retried from before the wipe as done, without applying it again.
    It carries the named snapshots too: those created before the wipe read
    the same on the rebuilt member with consistency 'all' (every member's
    digest agrees); one dropped while it was away is not there; after its
    restart the durable one still is."""
    ports = free_ports(3)
    members = [Member(tmp_path, i, ports, ["--repl-snapshot-entries", "50"]) for i in range(3)]
    try:
        p = primary_of(members)
        client = set_client(members)
        coll = client.d.c
        # DUET_CATCHUP_DOCS measures larger sets (docs/design.md §19).
        n = int(os.environ.get("DUET_CATCHUP_DOCS", "2000")) // 200 * 200
        step = max(100, n // 2 // 50)
        for b in range(0, n // 2, step):
            coll.insert_many([{"_id": i, "pad": "x" * 100} for i in range(b, b + step)])
        client.e.x.insert_one({"_id": 1})
        lsid = {"id": bson.Binary(os.urandom(16), 4)}
        retried = {"insert": "r", "$db": "d", "documents": [{"_id": 1}],
                   "lsid": lsid, "txnNumber": bson.Int64(3)}
        with wire.connected(p.port, timeout=20) as sock:
            assert wire.command(sock, retried)["n"] == 1
        # Named snapshots taken before the wipe, then changed under them.
        named = client.get_database("d", write_concern=WriteConcern("majority"))
        named.s.insert_many([{"_id": i, "v": i} for i in range(20)])
        named.command("createSnapshot", "kept", ttlSeconds=3600)
        named.command("createSnapshot", "pinned", durable=True, collections=["s"])
        named.command("createSnapshot", "doomed")
        named.s.update_many({}, {"$inc": {"v": 100}})
        named.s.delete_many({"_id": {"$gte": 15}})
        want_s = [{"_id": i, "v": i} for i in range(20)]
        victim = next(m for m in members if m is not p)
        wait_for("replication before the wipe",
                 lambda: victim.direct().d.c.with_options(
                     read_preference=ReadPreference.SECONDARY).count_documents({}) == n // 2)
        victim.stop()
        shutil.rmtree(victim.dir)
        named.command("dropSnapshot", "doomed")
        step = n // 2 // 100
        for b in range(n // 2, n, step):
            coll.insert_many([{"_id": i, "pad": "y" * 100} for i in range(b, b + step)])
        wait_for("a purged log on the primary",
                 lambda: status(p)["duet"]["raftPurgedIndex"] > 0)
        started = time.time()
        victim.start()
        sec = lambda: victim.direct().d.c.with_options(  # noqa: E731
            read_preference=ReadPreference.SECONDARY)
        # Until the primary reaches it, the wiped member has no configuration
        # and refuses reads (13436 NotPrimaryOrSecondary).
        wait_for("the wiped member to catch up", lambda: count_if_member(sec()) == n, 300)
        took = time.time() - started
        print(f"catch-up of {n} documents from a snapshot: {took:.2f} s")
        st = status(victim)["duet"]
        assert st["snapshotsInstalled"] >= 1, st
        assert victim.direct().e.x.with_options(
            read_preference=ReadPreference.SECONDARY).count_documents({}) == 1
        assert sorted(d["_id"] for d in sec().find({}, {"_id": 1})) == list(range(n))
        with victim.direct() as d, p.direct() as pd:
            listed = lambda c: sorted(  # noqa: E731
                (x["name"], x["csn"], x["created"], x.get("ttlSeconds"), x["durable"])
                for x in c.d.command("listSnapshots",
                                     read_preference=ReadPreference.SECONDARY_PREFERRED)["snapshots"])
            assert listed(d) == listed(pd)
            assert [x[0] for x in listed(d)] == ["kept", "pinned"]
            for name in ("kept", "pinned"):
                assert snapshot_read(d, name, "all", coll="s", db="d") == want_s, name
                assert snapshot_read(d, name, "all", coll="s", db="d", agg=True) == want_s, name
            with pytest.raises(OperationFailure) as e:
                snapshot_read(d, "doomed", "one", coll="s", db="d")
            assert e.value.code == 246, e.value.details
        # It keeps up from the log afterwards, and restarts from its files.
        coll.insert_one({"_id": n})
        wait_for("a write after the catch-up", lambda: sec().count_documents({}) == n + 1)
        assert victim.stop() == 0
        victim.start()
        wait_for("the restarted member", lambda: sec().count_documents({}) == n + 1)
        # The durable named snapshot survives its restart ('kept' is not
        # durable: gone from a restarted member, as from any).
        with victim.direct() as d:
            assert snapshot_read(d, "pinned", "all", coll="s", db="d") == want_s
        # Made primary (the third member stopped, the primary stepping down),
        # it answers the write retried from before its wipe as done.
        third = next(m for m in members if m is not p and m is not victim)
        third.proc.send_signal(signal.SIGSTOP)
        try:
            with p.direct() as d:
                try:
                    d.admin.command("replSetStepDown", 60, secondaryCatchUpPeriodSecs=20)
                except OperationFailure as e:
                    assert e.code == 262, e.details
            assert primary_of(members, timeout=60) is victim
            with wire.connected(victim.port, timeout=20) as sock:
                reply = wire.command(sock, retried)
                assert reply["ok"] == 1 and reply["n"] == 1 and "writeErrors" not in reply, reply
                assert wire.command(sock, {"count": "r", "$db": "d"})["n"] == 1
        finally:
            third.proc.send_signal(signal.SIGCONT)
        client.close()
    finally:
        for m in members:
            m.stop()


def test_cluster_time_reads_wait_on_a_secondary(cluster):
    """Group times are the primary's, carried in every member's copy of the
    record: a time a reply on the primary gave names the same write on a
    secondary. afterClusterTime / atClusterTime on a secondary wait until it
    applied that write; a time not reached fails after maxTimeMS with 50."""
    p = primary_of(cluster)
    client = set_client(cluster)
    sec = next(m for m in cluster if m is not p)
    on_sec = dict(read_preference=ReadPreference.SECONDARY_PREFERRED)
    with sec.direct() as c:
        for i in range(5):
            r = client.d.command("insert", "c", documents=[{"_id": i}])
            t = r["operationTime"]
            got = c.d.command("find", "c", filter={"_id": i},
                              readConcern={"afterClusterTime": t}, **on_sec)
            assert got["cursor"]["firstBatch"] == [{"_id": i}], (i, got)
            assert got["operationTime"] >= t
        # A snapshot read on the primary; the same time on the secondary.
        snap = client.d.command("find", "c", filter={}, readConcern={"level": "snapshot"})
        at = snap["cursor"]["atClusterTime"]
        got = c.d.command("find", "c", filter={},
                          readConcern={"level": "snapshot", "atClusterTime": at}, **on_sec)
        assert got["cursor"]["firstBatch"] == snap["cursor"]["firstBatch"]
        assert got["cursor"]["atClusterTime"] == at
        # A time the set has not reached: waits, then MaxTimeMSExpired.
        future = bson.Timestamp(t.time + 3600, 1)
        for rc in ({"afterClusterTime": future},
                   {"level": "snapshot", "atClusterTime": bson.Timestamp(t.time + 3600, 3)}):
            started = time.time()
            with pytest.raises(OperationFailure) as e:
                c.d.command("find", "c", filter={}, readConcern=rc, maxTimeMS=300, **on_sec)
            assert e.value.code == 50, e.value.details
            assert time.time() - started >= 0.3
        # The primary answers such a read at once (it published every write
        # it acknowledged), as a one-member set does.
        got = client.d.command("find", "c", filter={"_id": 0},
                               readConcern={"afterClusterTime": future}, maxTimeMS=300)
        assert got["cursor"]["firstBatch"] == [{"_id": 0}]
    client.close()


def test_drop_database_and_named_snapshot_times_are_the_primarys(cluster):
    """dropDatabase and createSnapshot carry the primary's time in their log
    entry: a secondary applying a drop reaches the drop's cluster time (an
    afterClusterTime equal to the primary's reply's operationTime is served
    at once, not at the next write), and a named snapshot's creation time is
    the same on every member (its TTL counts from there everywhere)."""
    p = primary_of(cluster)
    client = set_client(cluster)
    db = client.get_database("gone", write_concern=WriteConcern("majority"))
    db.c.insert_many([{"_id": i} for i in range(3)])
    app = client.get_database("app", write_concern=WriteConcern("majority"))
    app.items.insert_many([{"_id": i} for i in range(3)])
    r = app.command("createSnapshot", "s1", ttlSeconds=3600)
    secs = [m for m in cluster if m is not p]
    on_sec = dict(read_preference=ReadPreference.SECONDARY_PREFERRED)
    infos = []
    for m in cluster:
        with m.direct() as d:
            wait_for("member %d to take the snapshot" % m.i, lambda: any(
                s["name"] == "s1" for s in d.app.command("listSnapshots", **on_sec)["snapshots"]))
            s = next(s for s in d.app.command("listSnapshots", **on_sec)["snapshots"]
                     if s["name"] == "s1")
            infos.append((s["csn"], s["created"], s["ttlSeconds"]))
    assert len(set(infos)) == 1, infos
    dropped = db.command("dropDatabase")
    t = dropped["operationTime"]
    for m in secs:
        with m.direct() as d:
            started = time.time()
            got = d.gone.command("find", "c", filter={},
                                 readConcern={"afterClusterTime": t}, maxTimeMS=5000, **on_sec)
            assert got["cursor"]["firstBatch"] == [], got
            assert got["operationTime"] >= t
            assert time.time() - started < 4, "the drop's time was not reached by the drop"
            assert "gone" not in d.list_database_names()
    assert r["ok"] == 1
    client.close()


def snapshot_read(d, name, consistency=None, coll="items", agg=False, db="app"):
    duet = {"snapshotName": name}
    if consistency is not None:
        duet["consistency"] = consistency
    if agg:
        cmd = bson.SON([("aggregate", coll), ("pipeline", [{"$sort": {"_id": 1}}]),
                        ("cursor", {"batchSize": 1000}), ("$duet", duet)])
    else:
        cmd = bson.SON([("find", coll), ("filter", {}), ("sort", {"_id": 1}),
                        ("batchSize", 1000), ("$duet", duet)])
    reply = d[db].command(cmd, read_preference=ReadPreference.SECONDARY_PREFERRED)
    return reply["cursor"]["firstBatch"]


def test_named_snapshot_reads_with_consistency_levels(cluster):
    """A read on a named snapshot with consistency 'majority' or 'all' is
    served only when that many members hold the same copy (their digests of
    the collection read agree): with one member of three not answering,
    'majority' does not wait for it and 'all' ends at maxTimeMS (50); with
    it down, 'all' fails with 133 and 'majority' (and 'one') still read, on
    any member."""
    p = primary_of(cluster)
    client = set_client(cluster)
    db = client.get_database("app", write_concern=WriteConcern("majority"))
    db.items.insert_many([{"_id": i, "v": i} for i in range(30)])
    db.users.insert_many([{"_id": i, "name": f"u{i}"} for i in range(3)])
    db.command("createSnapshot", "s1")
    db.items.update_many({}, {"$inc": {"v": 100}})
    db.users.update_many({}, {"$set": {"name": "changed"}})
    want = [{"_id": i, "v": i} for i in range(30)]
    joined = [{"_id": i, "v": i, "u": [{"_id": i, "name": f"u{i}"}]} for i in range(3)]
    lookup = bson.SON([
        ("aggregate", "items"),
        ("pipeline", [{"$match": {"_id": {"$lt": 3}}}, {"$sort": {"_id": 1}},
                      {"$lookup": {"from": "users", "localField": "_id",
                                   "foreignField": "_id", "as": "u"}}]),
        ("cursor", {}), ("$duet", {"snapshotName": "s1", "consistency": "all"})])
    for m in cluster:
        with m.direct() as d:
            wait_for("member %d to take the snapshot" % m.i, lambda: any(
                s["name"] == "s1" for s in d.app.command(
                    "listSnapshots", read_preference=ReadPreference.SECONDARY_PREFERRED)["snapshots"]))
            for level in ("one", "majority", "all"):
                assert snapshot_read(d, "s1", level) == want, (m.i, level)
            assert snapshot_read(d, "s1", "all", agg=True) == want, m.i
            # The $lookup's collection is checked too, and read in the snapshot.
            got = d.app.command(lookup, read_preference=ReadPreference.SECONDARY_PREFERRED)
            assert got["cursor"]["firstBatch"] == joined, (m.i, got)
            # A collection the snapshot does not hold is empty everywhere.
            assert snapshot_read(d, "s1", "all", coll="nothing") == []
    with p.direct() as d:
        for bad in ({"snapshotName": "s1", "consistency": "quorum"},
                    {"consistency": "all"}):
            with pytest.raises(OperationFailure) as e:
                d.app.command(bson.SON([("find", "items"), ("$duet", bad)]))
            assert e.value.code == 2, e.value.details
        with pytest.raises(OperationFailure) as e:
            snapshot_read(d, "nope", "majority")
        assert e.value.code != 133
    down = next(m for m in cluster if m is not p)
    # A member that does not answer (stopped): 'majority' does not wait for
    # it; 'all' waits up to maxTimeMS, then 50.
    down.proc.send_signal(signal.SIGSTOP)
    try:
        with p.direct() as d:
            started = time.time()
            assert snapshot_read(d, "s1", "majority") == want
            assert time.time() - started < 4
            started = time.time()
            with pytest.raises(OperationFailure) as e:
                d.app.command(bson.SON([("find", "items"), ("maxTimeMS", 1500),
                                        ("$duet", {"snapshotName": "s1", "consistency": "all"})]))
            assert e.value.code == 50, e.value.details
            assert 1.4 < time.time() - started < 6
    finally:
        down.proc.send_signal(signal.SIGCONT)
    down.kill()
    for m in cluster:
        if m is down:
            continue
        with m.direct() as d:
            started = time.time()
            with pytest.raises(OperationFailure) as e:
                snapshot_read(d, "s1", "all")
            assert e.value.code == 133, e.value.details
            assert f"127.0.0.1:{down.port}" in e.value.details["errmsg"]
            assert time.time() - started < 15
            assert snapshot_read(d, "s1", "majority") == want, m.i
            assert snapshot_read(d, "s1") == want, m.i
    down.start()
    with down.direct() as d:
        wait_for("the restarted member", lambda: count_if_member(
            d.app.items.with_options(read_preference=ReadPreference.SECONDARY_PREFERRED)) == 30)
    client.close()


def test_snapshot_reads_at_a_time_another_member_issued(cluster):
    """Read concern snapshot with an atClusterTime is served on any member
    that has applied that time, also after that member moved on and when
    the time was issued by another member: every member keeps its recent
    states by cluster time (a primary's snapshot read continued on a
    secondary, and the reverse)."""
    p = primary_of(cluster)
    client = set_client(cluster)
    sec = next(m for m in cluster if m is not p)
    on_sec = dict(read_preference=ReadPreference.SECONDARY_PREFERRED)
    db = client.get_database("d", write_concern=WriteConcern("majority"))
    db.c.insert_many([{"_id": i} for i in range(5)])
    first = db.command("find", "c", filter={}, sort={"_id": 1},
                       readConcern={"level": "snapshot"})
    at = first["cursor"]["atClusterTime"]
    # The set moves on; the secondary applies the later writes.
    last = None
    for i in range(5, 10):
        last = db.command("insert", "c", documents=[{"_id": i}])["operationTime"]
    with sec.direct() as c:
        wait_for("the secondary to apply", lambda: c.d.command(
            "count", "c", readConcern={"afterClusterTime": last}, **on_sec)["n"] == 10)
        got = c.d.command("find", "c", filter={}, sort={"_id": 1},
                          readConcern={"level": "snapshot", "atClusterTime": at}, **on_sec)
        assert got["cursor"]["firstBatch"] == first["cursor"]["firstBatch"]
        assert got["cursor"]["atClusterTime"] == at
        # A snapshot read started on the secondary, continued on the primary
        # after further writes.
        mine = c.d.command("find", "c", filter={}, sort={"_id": 1},
                           readConcern={"level": "snapshot"}, **on_sec)
    at2 = mine["cursor"]["atClusterTime"]
    db.c.insert_one({"_id": 10})
    got = db.command("find", "c", filter={}, sort={"_id": 1},
                     readConcern={"level": "snapshot", "atClusterTime": at2})
    assert got["cursor"]["firstBatch"] == [{"_id": i} for i in range(10)]
    # pymongo's snapshot sessions on secondaries.
    sclient = set_client(cluster, readPreference="secondary")
    with sclient.start_session(snapshot=True) as s:
        n = len(list(sclient.d.c.find({}, session=s)))
        db.c.insert_one({"_id": 11})
        time.sleep(0.5)
        assert len(list(sclient.d.c.find({}, session=s))) == n
    sclient.close()
    client.close()


def test_max_staleness_selects_by_last_write(cluster):
    """Drivers choose secondaries under maxStalenessSeconds from hello's
    lastWrite: it is the last applied write's time (the same opTime and
    date as the primary's once caught up), also on a member just restarted
    with no write since — which must stay selectable, and serve
    afterClusterTime reads of the writes it holds at once."""
    p = primary_of(cluster)
    client = set_client(cluster)
    db = client.get_database("d", write_concern=WriteConcern(w=3))
    for i in range(3):
        last = db.command("insert", "c", documents=[{"_id": i}])["operationTime"]
    restarted, other = [m for m in cluster if m is not p]
    # Applied before the stop, so nothing is left to apply after the restart
    # (the restarted member's lastWrite must come from its own files).
    with restarted.direct() as c:
        wait_for("the member to apply every write",
                 lambda: c.admin.command("hello")["lastWrite"]["opTime"]["ts"] == last, 10)
    assert restarted.stop() == 0
    restarted.start()
    with p.direct() as c:
        plw = c.admin.command("hello")["lastWrite"]
    with restarted.direct() as c:
        wait_for("the restarted member to follow",
                 lambda: c.admin.command("hello").get("secondary"))
        # Before the restart reported its newest group time, this stayed
        # Timestamp(0, 0) (and 1970) until the next write.
        wait_for("the restarted member's lastWrite",
                 lambda: c.admin.command("hello")["lastWrite"]["opTime"]["ts"] == last, 10)
        lw = c.admin.command("hello")["lastWrite"]
        assert lw["opTime"]["ts"] == plw["opTime"]["ts"] == last, (lw, plw, last)
        assert abs((lw["lastWriteDate"] - plw["lastWriteDate"]).total_seconds()) < 2, (lw, plw)
        started = time.time()
        got = c.d.command("count", "c", readConcern={"afterClusterTime": last}, maxTimeMS=5000,
                          read_preference=ReadPreference.SECONDARY_PREFERRED)
        assert got["n"] == 3 and time.time() - started < 4
    # Only the restarted member is a secondary now.
    other.kill()
    stale = set_client(cluster, readPreference="secondary", maxStalenessSeconds=90,
                       serverSelectionTimeoutMS=10000)
    assert stale.d.c.count_documents({}) == 3
    stale.close()
    client.close()


def test_max_staleness_excludes_a_secondary_kept_behind(tmp_path):
    """maxStalenessSeconds end to end: a secondary under an `fsync` lock
    stops applying the set's log (as MongoDB's does), so its `lastWrite`
    stays while the primary's idle no-ops move the primary's on. pymongo
    then leaves it out of `readPreference=secondary&maxStalenessSeconds=90`
    reads (staleness = lag + heartbeatFrequencyMS; 80 s here, so a lag of
    over 10 s is too stale, a no-op interval is not), reads from the other
    secondary; with that one stopped, selection fails while a client
    without maxStalenessSeconds reads the stale copy. After `fsyncUnlock`
    it catches up and is selected again."""
    ports = free_ports(3)
    members = [Member(tmp_path, i, ports, extra=["--repl-noop-interval-secs", "0.3"])
               for i in range(3)]
    clients = []

    def client(secondaries=1, **kw):
        c = set_client(members, readPreference="secondary", **kw)
        clients.append(c)
        # Staleness counts from the primary's lastWriteDate once the driver
        # knows it (before, from the freshest secondary's it knows).
        wait_for("the driver to discover the set", lambda: c.primary is not None
                 and len(c.secondaries) == secondaries)
        return c

    try:
        p = primary_of(members)
        lag, fresh = [m for m in members if m is not p]
        with set_client(members) as c:
            c.get_database("d", write_concern=WriteConcern(w=3)).c.insert_one({"_id": 1})
        with lag.direct() as d:
            # w: 3 is answered once every member holds the entry in its log;
            # this one may still be applying it.
            wait_for("the write applied on the member to lock", lambda: d.d.command(
                "count", "c", read_preference=ReadPreference.SECONDARY_PREFERRED)["n"] == 1)
            assert d.admin.command("fsync", lock=True)["lockCount"] == 1
            held = d.admin.command("hello")["lastWrite"]
            with set_client(members) as c:
                c.get_database("d", write_concern=WriteConcern(w=2)).c.insert_one({"_id": 2})
            time.sleep(12)
            now = d.admin.command("hello")["lastWrite"]
            assert now == held, (now, held)
            with p.direct() as pd:
                plw = pd.admin.command("hello")["lastWrite"]
            assert (plw["lastWriteDate"] - held["lastWriteDate"]).total_seconds() > 11, (plw, held)
            assert d.d.command("count", "c",
                               read_preference=ReadPreference.SECONDARY_PREFERRED)["n"] == 1

            stale_ok = client(2, maxStalenessSeconds=90, heartbeatFrequencyMS=80000)
            for _ in range(10):
                cur = stale_ok.d.c.find({})
                assert len(list(cur)) == 2
                assert cur.address[1] == fresh.port, (cur.address, fresh.port, lag.port)
            assert fresh.stop() == 0
            picky = client(maxStalenessSeconds=90, heartbeatFrequencyMS=80000,
                           serverSelectionTimeoutMS=3000)
            with pytest.raises(ServerSelectionTimeoutError):
                picky.d.c.find_one({})
            anyone = client()
            cur = anyone.d.c.find({})
            assert len(list(cur)) == 1 and cur.address[1] == lag.port
            assert d.admin.command("fsyncUnlock")["lockCount"] == 0
            wait_for("the unlocked member to catch up", lambda: d.d.command(
                "count", "c", read_preference=ReadPreference.SECONDARY_PREFERRED)["n"] == 2)
        caught_up = client(maxStalenessSeconds=90, heartbeatFrequencyMS=80000)
        cur = caught_up.d.c.find({})
        assert len(list(cur)) == 2 and cur.address[1] == lag.port
    finally:
        for c in clients:
            c.close()
        for m in members:
            m.stop()


def test_an_idle_primary_writes_noops(tmp_path):
    """`--repl-noop-interval-secs` (MongoDB's periodic no-op, every 10 s by
    default; 0.3 s here): with nothing written, the primary writes no-op
    entries, so a secondary's `lastWrite` (opTime and date, what drivers
    compare for maxStalenessSeconds) and its `rs.status()` optime follow
    the primary's clock; no database changes."""
    ports = free_ports(3)
    members = [Member(tmp_path, i, ports, extra=["--repl-noop-interval-secs", "0.3"])
               for i in range(3)]
    try:
        p = primary_of(members)
        with set_client(members) as c:
            c.get_database("d", write_concern=WriteConcern(w=3)).c.insert_one({"_id": 1})
        sec = next(m for m in members if m is not p)
        with sec.direct() as d:
            first = d.admin.command("hello")["lastWrite"]

            def advanced():
                lw = d.admin.command("hello")["lastWrite"]
                return (lw["lastWriteDate"] - first["lastWriteDate"]).total_seconds() >= 2 \
                    and lw["opTime"]["ts"] > first["opTime"]["ts"]
            wait_for("the secondary's lastWrite to advance while idle", advanced)
            st = d.admin.command("replSetGetStatus")
            me = next(x for x in st["members"] if x.get("self"))
            assert me["optime"]["ts"] > first["opTime"]["ts"], me
            assert d.d.command("count", "c",
                               read_preference=ReadPreference.SECONDARY_PREFERRED)["n"] == 1
    finally:
        for m in members:
            m.stop()
