"""Collection, index, CRUD, explain and aggregate commands, with their error codes."""

import pytest
from bson import Int64
from pymongo import ASCENDING, DESCENDING, ReturnDocument, UpdateOne, InsertOne, DeleteOne
from pymongo.errors import BulkWriteError, DuplicateKeyError, OperationFailure, ExecutionTimeout


def test_create_list_rename_drop(db, client):
    db.create_collection("a")
    db.command({"create": "b"})
    assert sorted(db.list_collection_names()) == ["a", "b"]
    assert [c["name"] for c in db.list_collections(filter={"name": "b"})] == ["b"]
    only = db.command({"listCollections": 1, "nameOnly": True})["cursor"]["firstBatch"]
    assert {frozenset(d) for d in only} == {frozenset({"name", "type"})}
    db.a.rename("c")
    assert sorted(db.list_collection_names()) == ["b", "c"]
    db.b.insert_one({"x": 1})
    with pytest.raises(OperationFailure) as e:
        db.c.rename("b")
    assert e.value.code == 48
    db.c.rename("b", dropTarget=True)
    assert db.list_collection_names() == ["b"] and db.b.count_documents({}) == 0
    assert db.command({"drop": "b"})["ok"] == 1.0
    # MongoDB 7.0: dropping a collection that does not exist succeeds.
    assert db.command({"drop": "b"})["ok"] == 1.0
    with pytest.raises(OperationFailure) as e:
        db.command({"create": "ts", "timeseries": {"timeField": "t"}})
    assert e.value.code == 115


def test_drop_database(client, db):
    db.c.insert_one({})
    assert db.name in client.list_database_names()
    client.drop_database(db.name)
    assert db.name not in client.list_database_names()


def test_coll_and_db_stats(db):
    db.c.insert_many([{"i": i, "s": "x" * 10} for i in range(20)])
    cs = db.command({"collStats": "c"})
    assert cs["count"] == 20 and cs["size"] > 0 and cs["nindexes"] == 1
    ds = db.command("dbStats")
    assert ds["collections"] == 1 and ds["objects"] == 20
    with pytest.raises(OperationFailure) as e:
        db.command({"collStats": "missing"})
    assert e.value.code == 26


def test_insert_find_and_duplicate_key(db):
    db.c.insert_many([{"_id": i, "v": i * 2} for i in range(10)])
    with pytest.raises(DuplicateKeyError) as e:
        db.c.insert_one({"_id": 3})
    assert e.value.code == 11000
    with pytest.raises(BulkWriteError) as e:
        db.c.insert_many([{"_id": 100}, {"_id": 1}, {"_id": 101}], ordered=False)
    errs = e.value.details["writeErrors"]
    assert len(errs) == 1 and errs[0]["index"] == 1 and errs[0]["code"] == 11000
    assert errs[0]["keyPattern"] == {"_id": 1} and errs[0]["keyValue"] == {"_id": 1}
    assert e.value.details["nInserted"] == 2
    with pytest.raises(BulkWriteError) as e:
        db.c.insert_many([{"_id": 200}, {"_id": 2}, {"_id": 201}], ordered=True)
    assert e.value.details["nInserted"] == 1
    assert db.c.find_one({"_id": 201}) is None


def test_find_options(db):
    db.c.insert_many([{"_id": i, "g": i % 3, "v": i, "sub": {"a": i}} for i in range(30)])
    docs = list(db.c.find({"g": 1}, {"v": 1, "_id": 0}).sort("v", DESCENDING).skip(2).limit(3))
    assert docs == [{"v": 22}, {"v": 19}, {"v": 16}]
    assert [d["_id"] for d in db.c.find({"sub.a": {"$gte": 27}})] == [27, 28, 29]
    db.c.create_index([("g", ASCENDING)], name="g_idx")
    assert len(list(db.c.find({"g": 2}).hint("g_idx"))) == 10
    with pytest.raises(OperationFailure) as e:
        list(db.c.find({}).hint("nope"))
    assert e.value.code == 2
    with pytest.raises(OperationFailure) as e:
        list(db.c.find({"v": {"$bogus": 1}}))
    assert e.value.code == 2
    with pytest.raises(OperationFailure) as e:
        db.command({"find": "c", "limit": "x"})
    assert e.value.code == 14


def test_update_forms(db):
    db.c.insert_many([{"_id": i, "v": i} for i in range(5)])
    r = db.c.update_many({"v": {"$gte": 3}}, {"$inc": {"v": 10}})
    assert (r.matched_count, r.modified_count) == (2, 2)
    r = db.c.update_one({"_id": 0}, {"$set": {"v": 0}})
    assert (r.matched_count, r.modified_count) == (1, 0)
    r = db.c.replace_one({"_id": 1}, {"replaced": True})
    assert r.modified_count == 1 and db.c.find_one({"_id": 1}) == {"_id": 1, "replaced": True}
    r = db.c.update_one({"_id": 99}, {"$set": {"v": 99}}, upsert=True)
    assert r.upserted_id == 99 and db.c.find_one({"_id": 99})["v"] == 99
    with pytest.raises(OperationFailure) as e:
        db.c.update_one({"_id": 2}, {"$set": {"_id": 5}})
    assert e.value.code == 66
    # Array updates and pipeline updates run (test_exact_answers.py has the rest).
    with pytest.raises(OperationFailure) as e:
        db.c.update_one({"_id": 2}, {"$set": {"a.$[x]": 1}}, array_filters=[{"x": 1}])
    assert e.value.code == 2  # the path 'a' must exist
    r = db.c.update_one({"_id": 2}, [{"$set": {"a": 1}}])
    assert r.modified_count == 1 and db.c.find_one({"_id": 2})["a"] == 1


def test_bulk_write_and_delete(db):
    db.c.insert_many([{"_id": i, "k": i % 2} for i in range(10)])
    r = db.c.bulk_write([InsertOne({"_id": 10}), UpdateOne({"_id": 0}, {"$set": {"z": 1}}), DeleteOne({"_id": 1})])
    assert (r.inserted_count, r.modified_count, r.deleted_count) == (1, 1, 1)
    assert db.c.delete_one({"k": 0}).deleted_count == 1
    assert db.c.delete_many({"k": 1}).deleted_count == 4
    r = db.command({"delete": "c", "deletes": [{"q": {}, "limit": 5}]})
    assert r["n"] == 0 and r["writeErrors"][0]["code"] == 9


def writer_of(client, db):
    """The database's writer figures (serverStatus.duet)."""
    st = client.admin.command("serverStatus")
    return next(d for d in st["duet"]["databases"] if d["name"] == db.name)["writer"]


@pytest.mark.parametrize("ordered", [True, False])
def test_bulk_update_with_a_failing_statement_in_the_middle(client, db, ordered):
    """300 update statements in one command, with an upsert, a statement
    matching nothing, a no-op one and a duplicate key at index 150: MongoDB's
    reply (an ordered bulk stops there, an unordered one goes on), each
    statement's effects kept on its own. The statements are applied in a
    few writer groups (one batch), not one per statement; the WAL still
    logs and syncs each group before the reply."""
    db.c.create_index("k", unique=True)
    db.c.insert_many([{"_id": i, "k": i, "n": 0} for i in range(100)])
    ops = [UpdateOne({"_id": i % 100}, {"$inc": {"n": 1}}) for i in range(300)]
    ops[10] = UpdateOne({"_id": "new"}, {"$set": {"k": 1000}}, upsert=True)
    ops[20] = UpdateOne({"_id": "absent"}, {"$set": {"k": 2000}})
    ops[30] = UpdateOne({"_id": 30}, {"$set": {"k": 30}})
    ops[150] = UpdateOne({"_id": 50}, {"$set": {"k": 51}})
    before = writer_of(client, db)
    with pytest.raises(BulkWriteError) as e:
        db.c.bulk_write(ops, ordered=ordered)
    after = writer_of(client, db)
    r = e.value.details
    applied = range(150) if ordered else [i for i in range(300) if i != 150]
    incs = [i for i in applied if i not in (10, 20, 30)]
    assert r["nInserted"] == 0 and r["nRemoved"] == 0
    assert r["nUpserted"] == 1 and r["upserted"] == [{"index": 10, "_id": "new"}]
    assert r["nMatched"] == len(incs) + 1  # and the no-op at 30
    assert r["nModified"] == len(incs)
    assert [(w["index"], w["code"]) for w in r["writeErrors"]] == [(150, 11000)]
    assert r["writeErrors"][0]["keyValue"] == {"k": 51}
    got = {d["_id"]: d for d in db.c.find({"_id": {"$type": "number"}})}
    for i in range(100):
        want = sum(1 for j in incs if j % 100 == i)
        assert got[i]["n"] == want, i
    assert got[50]["k"] == 50 and db.c.find_one({"_id": "new"})["k"] == 1000
    assert after["commands"] - before["commands"] >= (150 if ordered else 299)
    assert after["groups"] - before["groups"] <= 3, (before, after)


@pytest.mark.parametrize("ordered", [True, False])
def test_bulk_delete_with_a_failing_statement_in_the_middle(client, db, ordered):
    """200 delete statements with a malformed filter at index 120 (reported
    in its place) and a statement matching nothing."""
    db.c.insert_many([{"_id": i} for i in range(300)])
    deletes = [{"q": {"_id": i}, "limit": 1} for i in range(200)]
    deletes[120] = {"q": {"_id": {"$nope": 1}}, "limit": 1}
    deletes[7] = {"q": {"_id": 999}, "limit": 0}
    before = writer_of(client, db)
    r = db.command({"delete": "c", "deletes": deletes, "ordered": ordered})
    after = writer_of(client, db)
    applied = [i for i in (range(120) if ordered else range(200)) if i not in (7, 120)]
    assert r["n"] == len(applied)
    assert [(w["index"], w["code"]) for w in r["writeErrors"]] == [(120, 2)]
    assert sorted(d["_id"] for d in db.c.find()) == [i for i in range(300) if i not in applied]
    assert after["groups"] - before["groups"] <= 2, (before, after)


def test_find_and_modify(db):
    db.c.insert_many([{"_id": i, "n": i} for i in range(5)])
    before = db.c.find_one_and_update({"n": {"$gte": 2}}, {"$inc": {"n": 100}}, sort=[("n", -1)])
    assert before == {"_id": 4, "n": 4}
    after = db.c.find_one_and_update({"_id": 3}, {"$inc": {"n": 1}}, return_document=ReturnDocument.AFTER,
                                     projection={"_id": 0})
    assert after == {"n": 4}
    rep = db.c.find_one_and_replace({"_id": 2}, {"r": 1}, return_document=ReturnDocument.AFTER)
    assert rep == {"_id": 2, "r": 1}
    gone = db.c.find_one_and_delete({"_id": 0})
    assert gone == {"_id": 0, "n": 0} and db.c.count_documents({}) == 4
    up = db.c.find_one_and_update({"_id": 50}, {"$set": {"n": 50}}, upsert=True,
                                  return_document=ReturnDocument.AFTER)
    assert up == {"_id": 50, "n": 50}
    raw = db.command({"findAndModify": "c", "query": {"_id": 51}, "update": {"$set": {"a": 1}}, "upsert": True})
    assert raw["lastErrorObject"]["upserted"] == 51 and raw["value"] is None
    with pytest.raises(OperationFailure):
        db.command({"findAndModify": "c", "query": {}, "remove": True, "update": {"$set": {"a": 1}}})


def test_count_and_distinct(db):
    db.c.insert_many([{"i": i, "tags": ["a", "b"] if i % 2 else ["c"]} for i in range(20)])
    assert db.c.count_documents({"i": {"$lt": 5}}) == 5
    assert db.c.count_documents({}, skip=5, limit=10) == 10
    assert db.c.estimated_document_count() == 20
    assert db.command({"count": "c", "query": {"i": {"$gte": 15}}})["n"] == 5
    assert db.command({"count": "missing"})["n"] == 0
    assert db.c.distinct("tags") == ["a", "b", "c"]
    assert db.c.distinct("i", {"i": {"$lt": 3}}) == [0, 1, 2]


def test_indexes(db):
    db.c.insert_many([{"a": i, "b": -i} for i in range(10)])
    assert db.c.create_index([("a", 1)], unique=True) == "a_1"
    assert db.c.create_index([("a", 1), ("b", -1)], name="ab") == "ab"
    names = sorted(i["name"] for i in db.c.list_indexes())
    assert names == ["_id_", "a_1", "ab"]
    info = db.c.index_information()
    assert info["a_1"]["unique"] is True
    with pytest.raises(DuplicateKeyError) as e:
        db.c.insert_one({"a": 3})
    assert e.value.details["keyPattern"] == {"a": 1} and e.value.details["keyValue"] == {"a": 3}
    r = db.command({"createIndexes": "c", "indexes": [{"key": {"a": 1}, "name": "a_1", "unique": True}]})
    assert r["numIndexesBefore"] == r["numIndexesAfter"] == 3
    with pytest.raises(OperationFailure) as e:
        db.c.create_index([("b", 1)], hidden=True)
    assert e.value.code == 115
    db.c.drop_index("ab")
    db.c.drop_index([("a", 1)])
    assert [i["name"] for i in db.c.list_indexes()] == ["_id_"]
    db.c.create_index("b")
    db.c.drop_indexes()
    assert [i["name"] for i in db.c.list_indexes()] == ["_id_"]
    with pytest.raises(OperationFailure) as e:
        db.c.drop_index("_id_")
    assert e.value.code == 72
    with pytest.raises(OperationFailure) as e:
        db.c.drop_index("nope")
    assert e.value.code == 27
    with pytest.raises(OperationFailure) as e:
        db.command({"listIndexes": "missing"})
    assert e.value.code == 26


def test_explain(db):
    db.c.insert_many([{"a": i} for i in range(10)])
    db.c.create_index("a")
    plan = db.c.find({"a": 3}).explain()
    assert "IXSCAN" in str(plan["queryPlanner"]["winningPlan"])
    plan = db.command({"explain": {"find": "c", "filter": {"b": 1}}, "verbosity": "queryPlanner"})
    assert "COLLSCAN" in str(plan["queryPlanner"]["winningPlan"])
    plan = db.command({"explain": {"count": "c", "query": {"a": 1}}})
    assert plan["ok"] == 1.0


def test_aggregate_basics(db):
    db.c.insert_many([{"_id": i, "g": i % 4, "v": i} for i in range(40)])
    out = list(db.c.aggregate([{"$match": {"g": 1}}, {"$sort": {"v": -1}}, {"$skip": 1}, {"$limit": 2},
                               {"$project": {"v": 1, "_id": 0}}]))
    assert out == [{"v": 33}, {"v": 29}]
    assert list(db.c.aggregate([{"$match": {"g": 2}}, {"$count": "n"}])) == [{"n": 10}]
    assert list(db.c.aggregate([{"$match": {"g": 9}}, {"$count": "n"}])) == []
    assert len(list(db.c.aggregate([], batchSize=7))) == 40
    groups = list(db.c.aggregate([{"$group": {"_id": "$g", "n": {"$sum": 1}}}, {"$sort": {"_id": 1}}]))
    assert groups == [{"_id": g, "n": 10} for g in range(4)]
    assert len(list(db.c.aggregate([{"$limit": 2}, {"$match": {}}]))) == 2
    joined = list(db.c.aggregate([{"$lookup": {"from": "x", "as": "y", "localField": "a", "foreignField": "b"}}]))
    assert len(joined) == 40 and all(d["y"] == [] for d in joined)
    with pytest.raises(OperationFailure) as e:
        list(db.c.aggregate([{"$frobnicate": {}}]))
    assert e.value.code == 40324
    ex = db.command({"aggregate": "c", "pipeline": [{"$match": {"g": 1}}], "explain": True})
    assert "queryPlanner" in ex["stages"][0]["$cursor"]


def test_max_time_ms_is_enforced(db):
    db.c.insert_many([{"i": i, "s": f"value-{i}-" * 4} for i in range(40000)])
    with pytest.raises(ExecutionTimeout) as e:
        list(db.c.find({"s": {"$regex": "9-$"}}).sort("s", -1).max_time_ms(1))
    assert e.value.code == 50
    # The server is fine afterwards.
    assert db.c.count_documents({"i": {"$lt": 10}}) == 10


def test_wrong_types_are_14(db):
    with pytest.raises(OperationFailure) as e:
        db.command({"find": "c", "filter": 5})
    assert e.value.code == 14
    with pytest.raises(OperationFailure) as e:
        db.command({"count": "c", "query": 5})
    assert e.value.code == 14
    with pytest.raises(OperationFailure) as e:
        db.command({"getMore": "x", "collection": "c"})
    assert e.value.code == 14
    _ = Int64
