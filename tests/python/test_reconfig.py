"""Replica-set membership changes (issue #21): `replSetReconfig` (mongosh
`rs.add`/`rs.remove`/`rs.reconfig`) adds a member (a Raft learner that
catches up, then a voter through a joint-consensus change) or removes one;
hidden `{priority: 0, votes: 0}` members are Raft learners that serve
analytics reads; a data directory of another set (or a member's, started
outside its set) is refused at start.
"""

import signal
import subprocess
import time

import pytest
from pymongo import ReadPreference
from pymongo.errors import NotPrimaryError, OperationFailure
from pymongo.write_concern import WriteConcern

from conftest import DUET
from test_replication import SET, Member, free_ports, primary_of, set_client, wait_for


def host(m):
    return f"127.0.0.1:{m.port}"


def config(m):
    with m.direct(read_preference=ReadPreference.SECONDARY_PREFERRED) as c:
        return c.admin.command("replSetGetConfig")["config"]


def hello(m):
    with m.direct(read_preference=ReadPreference.SECONDARY_PREFERRED) as c:
        return c.admin.command("hello")


def reconfig(primary, conf, **kw):
    with primary.direct() as c:
        return c.admin.command("replSetReconfig", conf, **kw)


def add(primary, m, **opts):
    conf = config(primary)
    conf["version"] += 1
    conf["members"].append({"_id": m.i, "host": host(m), **opts})
    return reconfig(primary, conf)


def remove(primary, m):
    conf = config(primary)
    conf["version"] += 1
    conf["members"] = [c for c in conf["members"] if c["_id"] != m.i]
    return reconfig(primary, conf)


def stop_all(members):
    codes = [m.stop() for m in members]
    for m, code in zip(members, codes):
        if m.proc.returncode != -signal.SIGKILL:
            assert code == 0, f"member {m.i} exited with {code}:\n{m.log_path.read_text()[-3000:]}"


@pytest.fixture
def four(tmp_path):
    """A 3-member set, and a 4th member started (empty) but not yet added."""
    ports = free_ports(4)
    members = [Member(tmp_path, i, ports[:3]) for i in range(3)]
    # The new member's own view of the list: it names itself at --member-id.
    members.append(Member(tmp_path, 3, ports))
    yield members
    stop_all(members)


def test_a_member_added_catches_up_votes_and_one_removed_leaves(four):
    old, new = four[:3], four[3]
    p = primary_of(old)
    with set_client(old) as c:
        c.app.items.insert_many([{"_id": i} for i in range(200)])
    # Waiting to be added: not in any configuration, refuses reads.
    h = hello(new)
    assert h["isWritablePrimary"] is False and h["secondary"] is False
    assert "setName" not in h and h["info"] == "Does not have a valid replica set config"
    with new.direct(read_preference=ReadPreference.SECONDARY_PREFERRED) as d:
        with pytest.raises(NotPrimaryError) as e:
            d.app.items.count_documents({})
        assert e.value.details["code"] == 13436
    version = config(p)["version"]
    add(p, new)
    conf = config(p)
    assert conf["version"] > version
    assert [(m["_id"], m["votes"], m["hidden"]) for m in conf["members"]] == [
        (0, 1, False), (1, 1, False), (2, 1, False), (3, 1, False)]
    # Every member holds the same configuration, and hello lists the new one.
    for m in four:
        wait_for(f"member {m.i} to see the new config", lambda: config(m) == conf)
        assert sorted(hello(m)["hosts"]) == sorted(host(x) for x in four)
        assert hello(m)["setVersion"] == conf["version"]
    with new.direct(read_preference=ReadPreference.SECONDARY_PREFERRED) as d:
        wait_for("the new member to catch up", lambda: d.app.items.count_documents({}) == 200)
        assert d.admin.command("hello")["secondary"] is True
    with set_client(four) as c:
        # w: 4 needs the new member's log.
        c.app.get_collection("items", write_concern=WriteConcern(w=4, wtimeout=20000)) \
            .insert_one({"_id": "w4"})
    # Four voters: after the primary's death the new primary needs three
    # votes of the three left, the new member's among them.
    p.kill()
    alive = [m for m in four if m is not p]
    q = primary_of(alive, timeout=60)
    with set_client(alive) as c:
        c.app.get_collection("items", write_concern=WriteConcern("majority")) \
            .insert_one({"_id": "after the kill"})
    # rs.remove of the dead member, then of a live secondary: one voter at a time.
    remove(q, p)
    gone = next(m for m in alive if m is not q)
    remove(q, gone)
    conf = config(q)
    rest = [m for m in alive if m is not gone]
    assert sorted(m["_id"] for m in conf["members"]) == sorted(m.i for m in rest)
    for m in rest:
        wait_for(f"member {m.i} to see the config", lambda: config(m) == conf)
        assert sorted(hello(m)["hosts"]) == sorted(host(x) for x in rest)
    # The removed member says so and refuses writes and reads.
    wait_for("the removed member to know", lambda: "setName" not in hello(gone))
    h = hello(gone)
    assert h["secondary"] is False and h["isWritablePrimary"] is False
    with gone.direct(read_preference=ReadPreference.SECONDARY_PREFERRED) as d:
        with pytest.raises(NotPrimaryError):
            d.app.items.insert_one({"_id": "on the removed one"})
        with pytest.raises(NotPrimaryError) as e:
            d.app.items.count_documents({})
        assert e.value.details["code"] == 13436
        assert d.admin.command("replSetGetStatus")["myState"] == 10
    # The two left still form a majority of the new configuration.
    with set_client(rest) as c:
        c.app.get_collection("items", write_concern=WriteConcern("majority")) \
            .insert_one({"_id": "after the removals"})
        assert c.app.items.count_documents({}) == 203
    # A restart of the removed member remembers it was removed.
    assert gone.stop() == 0
    gone.start()
    time.sleep(1)
    assert "setName" not in hello(gone)
    # The member removed while it was down learns it when it comes back:
    # the first member that refuses it a vote tells it.
    p.start()
    wait_for("the member removed while down to learn it",
             lambda: "setName" not in hello(p), 60)
    with p.direct(read_preference=ReadPreference.SECONDARY_PREFERRED) as d:
        assert d.admin.command("replSetGetStatus")["myState"] == 10
    assert primary_of(rest) is q


def test_a_hidden_member_is_a_learner_serving_analytics_reads(four):
    old, new = four[:3], four[3]
    p = primary_of(old)
    with set_client(old) as c:
        c.app.items.insert_many([{"_id": i, "v": i % 7} for i in range(300)])
    add(p, new, hidden=True, priority=0, votes=0)
    conf = config(p)
    assert conf["members"][3] == {**conf["members"][3], "_id": 3, "hidden": True,
                                  "votes": 0, "priority": 0.0}
    wait_for("the hidden member to follow", lambda: hello(new).get("secondary"))
    h = hello(new)
    assert h["hidden"] is True and h["setName"] == SET and h["me"] == host(new)
    assert host(new) not in h["hosts"]
    for m in old:
        assert sorted(hello(m)["hosts"]) == sorted(host(x) for x in old)
        assert "hidden" not in hello(m)
    with new.direct(read_preference=ReadPreference.SECONDARY_PREFERRED) as d:
        wait_for("the hidden member to catch up", lambda: d.app.items.count_documents({}) == 300)
        # A long scan runs there.
        groups = list(d.app.items.aggregate([{"$group": {"_id": "$v", "n": {"$sum": 1}}},
                                             {"$sort": {"_id": 1}}]))
        assert [g["n"] for g in groups] == [43, 43, 43, 43, 43, 43, 42]
        st = d.admin.command("replSetGetStatus")
        assert st["myState"] == 2
        with pytest.raises(NotPrimaryError):
            d.app.items.insert_one({"_id": "x"})
    # It never votes: the majority is still two of the three voters, and
    # w: 4 counts it (it holds the log).
    with set_client(old) as c:
        c.app.get_collection("items", write_concern=WriteConcern(w=4, wtimeout=20000)) \
            .insert_one({"_id": 300, "v": 0})
        assert c.primary == ("127.0.0.1", p.port)
    # Removing it (a learner) needs no voter change.
    remove(p, new)
    wait_for("the learner to be removed", lambda: "setName" not in hello(new))
    assert [m["_id"] for m in config(p)["members"]] == [0, 1, 2]


def test_reconfig_rules(four):
    old, new = four[:3], four[3]
    p = primary_of(old)
    base = config(p)

    def refused(conf, code, **kw):
        with pytest.raises(OperationFailure) as e:
            reconfig(p, conf, **kw)
        assert e.value.code == code, e.value.details
        return str(e.value)

    # The version must be above the current one.
    assert "not newer" in refused(base, 103)
    conf = {**base, "version": base["version"] + 1}
    # At most one voter added or removed.
    assert "at most 1 voting member" in refused({**conf, "members": base["members"][:1]}, 103)
    # Another set's name.
    refused({**conf, "_id": "other"}, 103)
    # Duplicate ids or hosts; a non-voter with a priority.
    refused({**conf, "members": base["members"] + [{**base["members"][0], "host": host(new)}]}, 93)
    refused({**conf, "members": base["members"] + [{"_id": 3, "host": host(p)}]}, 93)
    refused({**conf, "members": base["members"] + [
        {"_id": 3, "host": host(new), "votes": 0, "priority": 1}]}, 93)
    # What duet does not support: visible non-voters, arbiters, force.
    refused({**conf, "members": base["members"] + [
        {"_id": 3, "host": host(new), "votes": 0, "priority": 0}]}, 115)
    refused({**conf, "members": base["members"] + [
        {"_id": 3, "host": host(new), "arbiterOnly": True}]}, 115)
    refused(conf, 115, force=True)
    # The primary cannot remove itself.
    refused({**conf, "members": [m for m in base["members"] if m["host"] != host(p)]}, 103)
    # Only on the primary.
    s = next(m for m in old if m is not p)
    with s.direct(read_preference=ReadPreference.SECONDARY_PREFERRED) as d:
        with pytest.raises(NotPrimaryError):
            d.admin.command("replSetReconfig", conf)
    assert config(p) == base


def run_serve(data, *args, port=None):
    port = port or free_ports(1)[0]
    return subprocess.run(
        [str(DUET), "serve", "--bind", "127.0.0.1", "--port", str(port),
         "--data-dir", str(data), *args],
        capture_output=True, text=True, timeout=60)


def test_a_data_directory_of_another_set_is_refused(tmp_path):
    ports = free_ports(1)
    m = Member(tmp_path, 0, ports)
    primary_of([m])
    with m.direct() as c:
        c.app.items.insert_one({"_id": 1})
    assert m.stop() == 0
    other = run_serve(m.dir, "--replica-set", "other", "--member-id", "0",
                      "--members", host(m), port=m.port)
    assert other.returncode != 0
    assert "replica set 'rs0'" in other.stderr + other.stdout, other
    for outside in (["--standalone"], ["--replica-set", SET], []):
        r = run_serve(m.dir, *outside)
        assert r.returncode != 0, (outside, r)
        out = r.stderr + r.stdout
        assert f"belongs to member 0 of replica set '{SET}'" in out, (outside, out)
    # Its own set still opens it.
    m.start()
    primary_of([m])
    with m.direct() as c:
        assert c.app.items.count_documents({}) == 1
    assert m.stop() == 0


def test_two_sets_of_one_name_keep_apart(tmp_path):
    """A member's data directory of set A reused as a member of a new set B
    of the same name and addresses: the set ids differ, so neither side
    serves the other's Raft requests (both log why) and B keeps its own
    primary and data."""
    ports = free_ports(3)
    (tmp_path / "a").mkdir()
    a = [Member(tmp_path / "a", i, ports) for i in range(3)]
    primary_of(a)
    with set_client(a) as c:
        c.app.items.insert_many([{"_id": i, "set": "A"} for i in range(20)])
    wait_for("A's member 2 to apply",
             lambda: a[2].direct(read_preference=ReadPreference.SECONDARY_PREFERRED)
             .app.items.count_documents({}) == 20)
    a_id = config(a[0])["settings"]["replicaSetId"]
    assert config(a[2])["settings"]["replicaSetId"] == a_id
    stop_all(a)
    (tmp_path / "b").mkdir()
    (tmp_path / "a" / "m2").rename(tmp_path / "b" / "m2")
    b = [Member(tmp_path / "b", i, ports) for i in range(3)]
    try:
        p = primary_of(b[:2])
        with set_client(b[:2]) as c:
            c.app.get_collection("items", write_concern=WriteConcern("majority")) \
                .insert_one({"_id": "b", "set": "B"})
        b_id = config(p)["settings"]["replicaSetId"]
        assert b_id != a_id
        wait_for("the refusal to be logged", lambda: any(
            "another replica set named 'rs0'" in m.log_path.read_text() for m in b), 20)
        assert "another replica set named 'rs0'" in b[2].log_path.read_text()
        # Past an election timeout: B's primary stands, with B's data only.
        time.sleep(6)
        assert primary_of(b[:2]) is p
        with p.direct() as d:
            assert d.app.items.count_documents({"set": "A"}) == 0
            assert d.app.items.count_documents({"set": "B"}) == 1
        with b[2].direct(read_preference=ReadPreference.SECONDARY_PREFERRED) as d:
            assert d.app.items.count_documents({"set": "A"}) == 20
            assert d.app.items.count_documents({"set": "B"}) == 0
    finally:
        stop_all(b)
