"""`$duet: {snapshot: <strategy>}` over the wire: find, count, distinct and
aggregate each run the strategy they ask for. The evidence is the engine's
own count of live reads by the strategy that ran (`serverStatus.duet.reads`,
which must move by exactly one read, under exactly the requested strategy)
and explain's `strategy`; a server that ignored the request (reading its
held snapshot, or the engine's `auto` choice) fails here."""

import pytest

STRATEGIES = ["none", "vls", "cow", "olcp"]
N = 60


def reads(db):
    return db.client.admin.command("serverStatus")["duet"]["reads"]


def moved(before, after):
    """The counters that changed, with by how much."""
    return {k: after[k] - before[k] for k in after if after[k] != before[k]}


# Two shapes of the same selection (documents 10..N-1): under `auto` the
# engine reads a collection scan with `vls` and `_id` point lookups with
# `cow`, so a server that fell back to `auto` fails for every strategy.
SHAPES = {
    "scan": {"v": {"$gte": 10}},
    "ids": {"_id": {"$in": list(range(10, N))}},
}
SELECTED = range(10, N)


def commands(strategy, shape="scan"):
    """One command of each read kind, asking for `strategy`, with a check of
    its result (whatever strategy ran, the result is the same here: nothing
    writes meanwhile)."""
    duet = {"snapshot": strategy}
    f = SHAPES[shape]
    groups = sorted({i % 3: sum(1 for j in SELECTED if j % 3 == i % 3) for i in SELECTED}.items())
    return {
        "find": ({"find": "s", "filter": f, "batchSize": 1000, "$duet": duet},
                 lambda r: sorted(d["_id"] for d in r["cursor"]["firstBatch"]) == list(SELECTED)),
        "count": ({"count": "s", "query": f, "$duet": duet},
                  lambda r: r["n"] == len(SELECTED)),
        "distinct": ({"distinct": "s", "key": "g", "query": f, "$duet": duet},
                     lambda r: r["values"] == [0, 1, 2]),
        # $match + $group: commutative, so `olcp` runs as asked.
        "aggregate": ({"aggregate": "s", "cursor": {}, "$duet": duet, "pipeline": [
                          {"$match": f}, {"$group": {"_id": "$g", "n": {"$sum": 1}}}]},
                      lambda r: sorted((d["_id"], d["n"]) for d in r["cursor"]["firstBatch"])
                      == groups),
    }


@pytest.fixture
def coll(db):
    db.s.insert_many([{"_id": i, "g": i % 3, "v": i} for i in range(N)])
    return db.s


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("strategy", STRATEGIES)
def test_each_read_runs_the_requested_strategy(db, coll, strategy, shape):
    for name, (cmd, correct) in commands(strategy, shape).items():
        before = reads(db)
        r = db.command(cmd)
        after = reads(db)
        assert correct(r), (name, r)
        assert moved(before, after) == {strategy: 1}, (name, before, after)
        e = db.command({"explain": cmd, "verbosity": "queryPlanner"})
        assert e["duet"]["strategy"] == strategy, (name, e)
        assert e["duet"]["strategyReason"] == "requested", (name, e)
        # Explaining the plan runs nothing.
        assert reads(db) == after, name
        # Explaining with execution statistics runs the read once, as the command would.
        e = db.command({"explain": cmd, "verbosity": "executionStats"})
        assert e["duet"]["strategy"] == strategy, (name, e)
        assert moved(after, reads(db)) == {strategy: 1}, name


def test_aggregate_explain_flag_reports_the_strategy(db, coll):
    for strategy in STRATEGIES:
        cmd = commands(strategy)["aggregate"][0]
        e = db.command(dict(cmd, explain=True))["duet"]
        assert e["strategy"] == strategy and e["requestedStrategy"] == strategy, e


def test_olcp_on_an_order_dependent_pipeline_runs_vls_and_says_why(db, coll):
    # A $limit right after the scan stops it early: which documents arrive
    # first decides the result, so an out-of-order OLCP pass could not run it.
    pipeline = [{"$match": {"v": {"$gte": 0}}}, {"$limit": 5}, {"$count": "n"}]
    cmd = {"aggregate": "s", "pipeline": pipeline, "cursor": {}, "$duet": {"snapshot": "olcp"}}
    before = reads(db)
    r = db.command(cmd)
    after = reads(db)
    assert r["cursor"]["firstBatch"] == [{"n": 5}]
    assert moved(before, after) == {"vls": 1}
    for e in (db.command({"explain": cmd}), db.command(dict(cmd, explain=True))):
        e = e["duet"]
        assert e["strategy"] == "vls" and e["requestedStrategy"] == "olcp", e
        assert "order" in e["strategyReason"], e


def test_auto_is_resolved_by_the_engine(db, coll):
    # `auto` reads the live collection too; the engine picks (never "auto").
    before = reads(db)
    r = db.command({"count": "s", "query": {}, "$duet": {"snapshot": "auto"}})
    after = reads(db)
    assert r["n"] == N
    assert moved(before, after) == {"cow": 1}  # a count of everything: one root's size
    e = db.command({"explain": {"count": "s", "query": {}, "$duet": {"snapshot": "auto"}}})["duet"]
    assert e["strategy"] == "cow" and e["strategyReason"].startswith("auto")


def test_default_and_snapshot_reads_hold_a_snapshot_and_are_not_live_reads(db, coll):
    before = reads(db)
    assert db.s.count_documents({"v": {"$gte": 10}}) == N - 10
    assert sorted(db.s.distinct("g")) == [0, 1, 2]
    assert len(list(db.s.find({}))) == N
    assert len(list(db.s.aggregate([{"$match": {}}]))) == N
    d = db.command({"distinct": "s", "key": "g", "readConcern": {"level": "snapshot"}})
    assert d["values"] == [0, 1, 2] and "atClusterTime" in d
    assert reads(db) == before
    e = db.command({"explain": {"distinct": "s", "key": "g", "query": {}}})["duet"]
    assert e["strategy"] == "cow" and e["strategyReason"] == "held snapshot"


def test_distinct_strategy_errors(db, coll):
    from pymongo.errors import OperationFailure
    with pytest.raises(OperationFailure) as e:
        db.command({"distinct": "s", "key": "g", "$duet": {"snapshot": "bogus"}})
    assert e.value.code == 2
    with pytest.raises(OperationFailure) as e:
        db.command({"distinct": "s", "key": "a..b", "$duet": {"snapshot": "vls"}})
    assert e.value.code == 2
