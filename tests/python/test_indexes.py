"""Index kinds and options through pymongo (issue #18): TTL indexes and the
TTL monitor (with Mongoose's `expires` pattern), collMod, partial and sparse
indexes, hashed and wildcard indexes, text indexes and `$text`, listIndexes
and MongoDB's conflict codes."""

import datetime
import time

import pytest
from pymongo import ASCENDING, HASHED
from pymongo.errors import DuplicateKeyError, OperationFailure


def utcnow():
    return datetime.datetime.now(datetime.timezone.utc)


def winning_index(coll, flt):
    plan = coll.find(flt).explain()["queryPlanner"]["winningPlan"]
    return plan.get("inputStage", {}).get("indexName")


def ttl_pass(client):
    return client.admin.command("duetRunTtlPass")


def test_ttl_index_expires_documents_on_a_pass(client, db):
    now = utcnow()
    db.s.insert_many([
        {"_id": 1, "at": now - datetime.timedelta(hours=2)},
        {"_id": 2, "at": now},
        {"_id": 3, "at": [now, now - datetime.timedelta(days=1)]},
        {"_id": 4, "at": "not a date"},
        {"_id": 5},
    ])
    name = db.s.create_index("at", expireAfterSeconds=3600)
    assert name == "at_1"
    before = client.admin.command("serverStatus")["metrics"]["ttl"]
    reply = ttl_pass(client)
    assert reply["deletedDocuments"] >= 2
    assert sorted(d["_id"] for d in db.s.find()) == [2, 4, 5]
    after = client.admin.command("serverStatus")["metrics"]["ttl"]
    assert after["passes"] == before["passes"] + 1
    assert after["deletedDocuments"] >= before["deletedDocuments"] + 2
    info = db.s.index_information()["at_1"]
    assert info["expireAfterSeconds"] == 3600
    params = client.admin.command("getParameter", 1, ttlMonitorSleepSecs=1)
    assert params["ttlMonitorSleepSecs"] == 60


def test_ttl_index_created_again_is_a_no_op_and_coll_mod_changes_it(db):
    # The requests Mongoose sends for `createdAt: {type: Date, expires: 3600}`
    # at Model.init(), and again at the next start (Mongoose itself runs in
    # test_mongoose.py).
    spec = {"key": {"createdAt": 1}, "name": "createdAt_1",
            "expireAfterSeconds": 3600, "background": True}
    first = db.command("createIndexes", "sessions", indexes=[spec])
    assert first["numIndexesAfter"] == 2
    again = db.command("createIndexes", "sessions", indexes=[spec])
    assert again["numIndexesBefore"] == again["numIndexesAfter"] == 2
    assert again.get("note") == "all indexes already exist"
    listed = list(db.sessions.list_indexes())
    assert listed[1] == {"v": 2, "key": {"createdAt": 1}, "name": "createdAt_1",
                         "expireAfterSeconds": 3600}
    # A changed `expires` without collMod conflicts, as on MongoDB.
    with pytest.raises(OperationFailure) as e:
        db.command("createIndexes", "sessions",
                   indexes=[dict(spec, expireAfterSeconds=60)])
    assert e.value.code == 85
    # collMod changes it in place.
    r = db.command("collMod", "sessions",
                   index={"keyPattern": {"createdAt": 1}, "expireAfterSeconds": 60})
    assert r["expireAfterSeconds_old"] == 3600 and r["expireAfterSeconds_new"] == 60
    assert db.sessions.index_information()["createdAt_1"]["expireAfterSeconds"] == 60
    with pytest.raises(OperationFailure) as e:
        db.command("collMod", "sessions", index={"name": "nope", "expireAfterSeconds": 5})
    assert e.value.code == 27


def test_ttl_refusals_have_mongodbs_codes(db):
    for keys, opts in [
        ([("a", 1), ("b", 1)], {"expireAfterSeconds": 10}),
        ([("_id", 1)], {"expireAfterSeconds": 10}),
        ([("a", 1)], {"expireAfterSeconds": -1}),
        ([("a", 1)], {"expireAfterSeconds": "10"}),
        ([("a", 1)], {"expireAfterSeconds": 2 ** 40}),
    ]:
        with pytest.raises(OperationFailure) as e:
            db.t.create_index(keys, **opts)
        assert e.value.code == 67, (keys, opts)


def test_background_monitor_deletes_without_a_hook(make_server):
    srv = make_server("--ttl-monitor-sleep-secs", "0.3")
    c = srv.client()
    coll = c.ttldb.events
    coll.create_index("at", expireAfterSeconds=0)
    coll.insert_many([{"at": utcnow() - datetime.timedelta(seconds=5)} for _ in range(50)])
    deadline = time.time() + 20
    while coll.count_documents({}) and time.time() < deadline:
        time.sleep(0.1)
    assert coll.count_documents({}) == 0
    assert c.admin.command("serverStatus")["metrics"]["ttl"]["deletedDocuments"] >= 50
    # The hook is a test knob.
    with pytest.raises(OperationFailure) as e:
        c.admin.command("duetRunTtlPass")
    assert e.value.code == 20
    c.close()


def test_partial_and_sparse_unique_indexes(db):
    db.u.create_index("email", unique=True, sparse=True)
    db.u.insert_many([{"_id": 1}, {"_id": 2}, {"_id": 3, "email": "a"}])
    with pytest.raises(DuplicateKeyError):
        db.u.insert_one({"_id": 4, "email": "a"})
    assert winning_index(db.u, {"email": "a"}) == "email_1"
    assert winning_index(db.u, {"email": None}) is None
    assert db.u.count_documents({"email": None}) == 2

    db.p.create_index("user", unique=True, partialFilterExpression={"active": True})
    db.p.insert_many([{"_id": 1, "user": "x", "active": True},
                      {"_id": 2, "user": "x", "active": False}])
    with pytest.raises(DuplicateKeyError):
        db.p.insert_one({"_id": 3, "user": "x", "active": True})
    assert winning_index(db.p, {"user": "x", "active": True}) == "user_1"
    assert winning_index(db.p, {"user": "x"}) is None
    assert db.p.count_documents({"user": "x"}) == 2
    info = db.p.index_information()["user_1"]
    assert info["partialFilterExpression"] == {"active": True}
    with pytest.raises(OperationFailure) as e:
        db.p.create_index("z", partialFilterExpression={"z": {"$ne": 1}})
    assert e.value.code == 67


def test_hashed_and_wildcard_indexes(db):
    db.h.insert_many([{"_id": i, "k": i % 5, "n": {"x": i}} for i in range(40)])
    assert db.h.create_index([("k", HASHED)]) == "k_hashed"
    assert winning_index(db.h, {"k": 3}) == "k_hashed"
    assert winning_index(db.h, {"k": {"$gt": 3}}) is None
    assert db.h.count_documents({"k": 3}) == 8
    with pytest.raises(OperationFailure) as e:
        db.h.insert_one({"k": [1, 2]})
    assert e.value.code == 16766
    assert db.h.create_index([("$**", ASCENDING)]) == "$**_1"
    assert winning_index(db.h, {"n.x": {"$gte": 30}}) == "$**_1"
    assert db.h.count_documents({"n.x": {"$gte": 30}}) == 10
    names = [i["name"] for i in db.h.list_indexes()]
    assert names == ["_id_", "k_hashed", "$**_1"]


def test_index_conflicts(db):
    db.c.create_index("a", name="a_1")
    with pytest.raises(OperationFailure) as e:
        db.c.create_index("a", name="other")
    assert e.value.code == 85
    with pytest.raises(OperationFailure) as e:
        db.c.create_index([("a", -1)], name="a_1")
    assert e.value.code == 86
    with pytest.raises(OperationFailure) as e:
        db.c.create_index("a", name="a_1", unique=True)
    assert e.value.code == 85
    # Flat 2d geo indexes are refused clearly.
    with pytest.raises(OperationFailure) as e:
        db.c.create_index([("g", "2d")])
    assert e.value.code == 67
    # Collations are built (test_collation.py).
    assert db.c.create_index("b", collation={"locale": "fr"}) == "b_1"


def test_text_index_and_text_search(db):
    from pymongo import TEXT
    db.a.insert_many([
        {"_id": 1, "title": "Coffee", "body": "the best coffee shops"},
        {"_id": 2, "title": "Tea", "body": "tea houses and a coffee corner"},
        {"_id": 3, "title": "Cakes", "body": "baking cakes"},
    ])
    name = db.a.create_index([("title", TEXT), ("body", TEXT)], weights={"title": 10})
    assert name == "title_text_body_text"
    info = [i for i in db.a.list_indexes() if i["name"] == name][0]
    assert info["key"] == {"_fts": "text", "_ftsx": 1}
    assert info["weights"] == {"body": 1, "title": 10}
    assert info["default_language"] == "english"
    # Creating it again (as Mongoose's Model.init does) is a no-op.
    db.a.create_index([("title", TEXT), ("body", TEXT)], weights={"title": 10})
    cur = db.a.find({"$text": {"$search": "coffee"}},
                    {"score": {"$meta": "textScore"}}).sort([("score", {"$meta": "textScore"})])
    found = list(cur)
    assert [d["_id"] for d in found] == [1, 2]
    assert found[0]["score"] > found[1]["score"] > 0
    assert sorted(d["_id"] for d in db.a.find({"$text": {"$search": "shop -tea"}})) == [1]
    assert db.a.count_documents({"$text": {"$search": "coffee"}}) == 2
    assert db.a.count_documents({"$text": {"$search": "\"coffee corner\""}}) == 1
    with pytest.raises(OperationFailure) as e:
        db.a.create_index([("other", TEXT)])
    assert e.value.code == 85
    db.plain.insert_one({"x": "coffee"})
    with pytest.raises(OperationFailure) as e:
        list(db.plain.find({"$text": {"$search": "coffee"}}))
    assert e.value.code == 27


def test_text_search_reads_the_commands_snapshot(client, db):
    # $text reads what every other read of the command reads: a named
    # snapshot, atClusterTime, a transaction's snapshot.
    db.a.create_index([("body", "text")])
    db.a.insert_many([{"_id": 1, "body": "coffee shop"}, {"_id": 2, "body": "tea room"}])
    db.command({"createSnapshot": "before"})
    ts = db.command({"find": "a", "readConcern": {"level": "snapshot"}})["cursor"]["atClusterTime"]
    db.a.update_one({"_id": 2}, {"$set": {"body": "coffee bar"}})
    db.a.delete_one({"_id": 1})
    q = {"$text": {"$search": "coffee"}}
    named = {"$duet": {"snapshotName": "before"}}

    def ids(r):
        return sorted(d["_id"] for d in r["cursor"]["firstBatch"])

    assert ids(db.command({"find": "a", "filter": q})) == [2]
    assert ids(db.command({"find": "a", "filter": q, **named})) == [1]
    r = db.command({"find": "a", "filter": q,
                    "readConcern": {"level": "snapshot", "atClusterTime": ts}})
    assert ids(r) == [1] and r["cursor"]["atClusterTime"] == ts
    assert db.command({"count": "a", "query": q, **named})["n"] == 1
    r = db.command({"aggregate": "a", "pipeline": [{"$match": q}, {"$project": {"_id": 1}}],
                    "cursor": {}, **named})
    assert ids(r) == [1]
    db.command({"dropSnapshot": "before"})
    with client.start_session() as s:
        s.start_transaction()
        assert [d["_id"] for d in db.a.find(q, session=s)] == [2]
        # A write from outside after the transaction's snapshot is not seen.
        db.a.insert_one({"_id": 3, "body": "coffee again"})
        assert [d["_id"] for d in db.a.find(q, session=s)] == [2]
        assert db.a.count_documents(q, session=s) == 1
        # After the transaction writes the collection: refused, not answered
        # without its own writes.
        db.a.update_one({"_id": 2}, {"$set": {"body": "juice"}}, session=s)
        with pytest.raises(OperationFailure) as e:
            list(db.a.find(q, session=s))
        assert e.value.code == 263
        s.abort_transaction()
    assert sorted(d["_id"] for d in db.a.find(q)) == [2, 3]



def test_text_search_in_a_pipeline_keeps_its_score_and_joins(client, db):
    """A $text first stage in an aggregation: {$meta: "textScore"} in later
    stages (also after an inclusion $project and inside $facet), $sort by it,
    $lookup into another collection (of the same snapshot), let variables,
    $out; the score never leaks into what is returned or written."""
    db.a.create_index([("body", "text")])
    db.a.insert_many([{"_id": 1, "body": "red apple", "k": 1},
                      {"_id": 2, "body": "green pear", "k": 2},
                      {"_id": 3, "body": "apple apple pie", "k": 2}])
    db.b.insert_many([{"_id": 10, "k": 1, "n": "one"}, {"_id": 11, "k": 2, "n": "two"}])
    text = {"$match": {"$text": {"$search": "apple"}}}
    by_score = {"$sort": {"s": {"$meta": "textScore"}}}
    r = list(db.a.aggregate([text, by_score, {"$project": {"s": {"$meta": "textScore"}}}]))
    assert [d["_id"] for d in r] == [3, 1] and r[0]["s"] > r[1]["s"] > 0
    r = list(db.a.aggregate([text, {"$project": {"k": 1}}, by_score,
                             {"$addFields": {"s": {"$meta": "textScore"}}}]))
    assert [d["_id"] for d in r] == [3, 1] and all("s" in d for d in r)
    r = list(db.a.aggregate([text, {"$lookup": {"from": "b", "localField": "k",
                                                "foreignField": "k", "as": "j"}}, by_score]))
    assert [(d["_id"], [j["n"] for j in d["j"]]) for d in r] == [(3, ["two"]), (1, ["one"])]
    assert all(set(d) == {"_id", "body", "k", "j"} for d in r)
    r = list(db.a.aggregate([text, {"$facet": {"f": [by_score]}},
                             {"$project": {"ids": "$f._id", "f": 1}}]))
    assert r[0]["ids"] == [3, 1] and all(set(d) == {"_id", "body", "k"} for d in r[0]["f"])
    r = list(db.a.aggregate([text, {"$match": {"$expr": {"$gt": ["$k", "$$lim"]}}}],
                            let={"lim": 1}))
    assert [d["_id"] for d in r] == [3]
    db.a.aggregate([text, {"$project": {"s": {"$meta": "textScore"}}}, {"$out": "o"}])
    assert sorted(d["_id"] for d in db.o.find()) == [1, 3]
    assert all(set(d) == {"_id", "s"} for d in db.o.find())
    # Without a $text first stage there is no score (MongoDB's 40218); an
    # unknown $meta kind is 17308.
    with pytest.raises(OperationFailure) as e:
        list(db.a.aggregate([{"$addFields": {"s": {"$meta": "textScore"}}}]))
    assert e.value.code == 40218
    with pytest.raises(OperationFailure) as e:
        list(db.a.aggregate([text, {"$addFields": {"s": {"$meta": "bogus"}}}]))
    assert e.value.code == 17308
    # In a transaction, the join reads the transaction's view of the other collection.
    with client.start_session() as s:
        s.start_transaction()
        db.b.update_one({"_id": 10}, {"$set": {"n": "uno"}}, session=s)
        r = list(db.a.aggregate([text, {"$lookup": {"from": "b", "localField": "k",
                                                    "foreignField": "k", "as": "j"}}],
                                session=s))
        assert sorted(j["n"] for d in r for j in d["j"]) == ["two", "uno"]
        s.abort_transaction()

def test_compound_text_indexes(db):
    from pymongo import DESCENDING, TEXT
    from pymongo.errors import WriteError
    db.p.insert_many([
        {"_id": 1, "dept": "a", "body": "coffee beans", "year": 2020},
        {"_id": 2, "dept": "b", "body": "coffee cups", "year": 2021},
        {"_id": 3, "dept": "a", "body": "tea leaves", "year": 2022},
        {"_id": 4, "dept": "a", "body": "coffee coffee coffee", "year": 2023},
    ])
    name = db.p.create_index([("dept", ASCENDING), ("body", TEXT), ("year", DESCENDING)])
    assert name == "dept_1_body_text_year_-1"
    info = [i for i in db.p.list_indexes() if i["name"] == name][0]
    assert info["key"] == {"dept": 1, "_fts": "text", "_ftsx": 1, "year": -1}
    # A $text query always uses the text index: a hint is refused (MongoDB's 2).
    with pytest.raises(OperationFailure) as e:
        list(db.p.find({"dept": "a", "$text": {"$search": "coffee"}}).hint("_id_"))
    assert e.value.code == 2 and "text and hint not allowed" in str(e.value)
    assert list(info["key"]) == ["dept", "_fts", "_ftsx", "year"]
    assert info["weights"] == {"body": 1}
    assert info["default_language"] == "english"
    # Only one text index per collection, compound or not.
    with pytest.raises(OperationFailure) as e:
        db.p.create_index([("other", TEXT)])
    assert e.value.code == 85
    # Under an equality on the prefix field only that dept is read.
    cur = db.p.find({"dept": "a", "$text": {"$search": "coffee"}},
                    {"score": {"$meta": "textScore"}}).sort([("score", {"$meta": "textScore"})])
    found = list(cur)
    assert [d["_id"] for d in found] == [4, 1]
    assert all(d["dept"] == "a" for d in found)
    assert found[0]["score"] > found[1]["score"] > 0
    assert db.p.count_documents({"dept": "b", "$text": {"$search": "coffee"}}) == 1
    assert db.p.count_documents({"dept": "c", "$text": {"$search": "coffee"}}) == 0
    # Without equalities on every prefix field MongoDB's planner refuses.
    for flt in [{"$text": {"$search": "coffee"}},
                {"dept": {"$in": ["a", "b"]}, "$text": {"$search": "coffee"}}]:
        with pytest.raises(OperationFailure) as e:
            list(db.p.find(flt))
        assert e.value.code == 291
        assert "are equality predicates given for all prefix fields" in str(e.value)
    with pytest.raises(OperationFailure) as e:
        db.p.count_documents({"$text": {"$search": "coffee"}})
    assert e.value.code == 291
    # Arrays in a prefix or suffix field cannot be indexed.
    for d in [{"_id": 9, "dept": ["a", "b"], "body": "x"},
              {"_id": 9, "dept": "a", "body": "x", "year": [1, 2]}]:
        with pytest.raises(WriteError) as e:
            db.p.insert_one(d)
        assert e.value.code == 171
        assert "of text index contains an array" in str(e.value)
    with pytest.raises(WriteError) as e:
        db.p.update_one({"_id": 1}, {"$set": {"dept": ["a"]}})
    assert e.value.code == 171
    # A move to another prefix value moves the document's entries.
    db.p.update_one({"_id": 2}, {"$set": {"dept": "a"}})
    assert sorted(d["_id"] for d in db.p.find({"dept": "a", "$text": {"$search": "coffee"}})) \
        == [1, 2, 4]
    assert list(db.p.find({"dept": "b", "$text": {"$search": "coffee"}})) == []


def test_compound_wildcard_text_index(db):
    from pymongo import TEXT
    db.w.insert_many([
        {"_id": 1, "dept": "a", "title": "coffee", "notes": {"x": "milk"}},
        {"_id": 2, "dept": "b", "body": "coffee and milk"},
        {"_id": 3, "dept": "a", "tags": ["tea", "milk"]},
    ])
    name = db.w.create_index([("dept", ASCENDING), ("$**", TEXT)])
    assert name == "dept_1_$**_text"
    info = [i for i in db.w.list_indexes() if i["name"] == name][0]
    assert info["key"] == {"dept": 1, "_fts": "text", "_ftsx": 1}
    assert info["weights"] == {"$**": 1}
    assert sorted(d["_id"] for d in db.w.find({"dept": "a", "$text": {"$search": "milk"}})) \
        == [1, 3]
    assert [d["_id"] for d in db.w.find({"dept": "b", "$text": {"$search": "milk"}})] == [2]
    with pytest.raises(OperationFailure) as e:
        list(db.w.find({"$text": {"$search": "milk"}}))
    assert e.value.code == 291
