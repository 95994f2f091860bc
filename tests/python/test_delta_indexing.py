"""Delta indexing over the wire (docs/design.md "Delta indexing"):
`duet serve --delta-indexing`, `$duet: {indexRead: "fresh" | "stale"}` on
find, count and aggregate, `--index-read` as the server's default, and the
errors for bad values."""

import pytest
from pymongo.errors import OperationFailure


def load(db, n=3000):
    c = db["c"]
    c.create_index("a", unique=True)
    c.create_index([("b", 1), ("a", -1)])
    c.insert_many([{"_id": i, "a": i, "b": i % 10} for i in range(n)])
    # Moves keys of both indexes: the changes sit in delta layers or merges.
    for i in range(0, n, 7):
        c.update_one({"_id": i}, {"$set": {"a": n + i, "b": 11}})
    return c


def test_fresh_reads_are_exact_with_delta_indexing(make_server):
    srv = make_server("--delta-indexing")
    db = srv.client()["t"]
    c = load(db)
    n_moved = len(range(0, 3000, 7))
    assert c.count_documents({"b": 11}) == n_moved
    q = {"find": "c", "filter": {"b": 11}, "$duet": {"indexRead": "fresh"}, "batchSize": 10000}
    got = db.command(q)["cursor"]["firstBatch"]
    assert len(got) == n_moved
    count = db.command({"count": "c", "query": {"a": {"$gte": 3000}}, "$duet": {"indexRead": "fresh"}})
    assert count["n"] == n_moved
    agg = db.command({"aggregate": "c", "pipeline": [{"$match": {"b": 11}}, {"$count": "n"}],
                      "cursor": {}, "$duet": {"indexRead": "fresh"}})
    assert agg["cursor"]["firstBatch"] == [{"n": n_moved}]
    # Unique checks see the delta layers: a moved key is taken.
    with pytest.raises(OperationFailure) as e:
        c.insert_one({"_id": -1, "a": 3000})
    assert e.value.code == 11000


def test_stale_reads_return_only_matching_documents(make_server):
    srv = make_server("--delta-indexing")
    db = srv.client()["t"]
    load(db)
    stale = {"find": "c", "filter": {"b": 11}, "$duet": {"indexRead": "stale"}, "batchSize": 10000}
    for d in db.command(stale)["cursor"]["firstBatch"]:
        assert d["b"] == 11
    n = db.command({"count": "c", "query": {"b": {"$lte": 11}}, "$duet": {"indexRead": "stale"}})["n"]
    assert 0 < n <= 3000


def test_server_default_index_read(make_server):
    srv = make_server("--delta-indexing", "--index-read", "stale")
    db = srv.client()["t"]
    load(db)
    for d in db["c"].find({"b": 11}):
        assert d["b"] == 11
    opts = srv.client().admin.command("getCmdLineOpts")
    assert "index-read" in str(opts) or "index_read" in str(opts)


def test_bad_index_read_values(client):
    db = client["delta_bad"]
    db["c"].insert_one({"_id": 1})
    with pytest.raises(OperationFailure) as e:
        db.command({"find": "c", "$duet": {"indexRead": "stalest"}})
    assert e.value.code == 2
    with pytest.raises(OperationFailure) as e:
        db.command({"find": "c", "$duet": {"indexRead": 1}})
    assert e.value.code == 14
    with pytest.raises(OperationFailure) as e:
        db.command({"find": "c", "$duet": {"indexRead": "stale", "snapshot": "vls"}})
    assert e.value.code == 2
    # cow (a held version) and stale go together.
    db.command({"find": "c", "$duet": {"indexRead": "stale", "snapshot": "cow"}})
    client.drop_database("delta_bad")
