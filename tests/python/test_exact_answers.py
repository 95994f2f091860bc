"""Exactly MongoDB's answers (#17 items 4, 5, 7): positional, all-positional
and filtered array updates (Mongoose's patterns), arrayFilters in update,
findAndModify and bulk writes, pipeline-style updates, $bit; explain's
verbosities; and the validations and reply shapes MongoDB 7.0 has (codes,
code names and messages taken from MongoDB's source and test suite)."""

import pytest
from bson import Int64, SON
from bson.decimal128 import Decimal128
from pymongo import ReturnDocument, UpdateMany, UpdateOne
from pymongo.errors import BulkWriteError, OperationFailure, WriteError


def err(fn):
    with pytest.raises((OperationFailure, WriteError, BulkWriteError)) as e:
        fn()
    d = e.value.details or {}
    if isinstance(e.value, BulkWriteError):
        d = d["writeErrors"][0]
    return e.value.code, d.get("codeName"), d.get("errmsg")


# ---------------------------------------------------------------- updates

def test_mongoose_positional_updates(db):
    db.posts.insert_one({"_id": 1, "tags": ["A", "B"],
                         "reviews": [{"by": "x", "stars": 2}, {"by": "y", "stars": 4}]})
    r = db.posts.update_one({"_id": 1, "tags": "B"}, {"$set": {"tags.$": "C"}})
    assert (r.matched_count, r.modified_count) == (1, 1)
    r = db.posts.update_one({"reviews.by": "y"}, {"$inc": {"reviews.$.stars": 1}})
    assert r.modified_count == 1
    doc = db.posts.find_one({"_id": 1})
    assert doc["tags"] == ["A", "C"] and doc["reviews"][1]["stars"] == 5
    # $elemMatch chooses the element meeting every condition.
    db.posts.update_one({"reviews": {"$elemMatch": {"by": "x", "stars": {"$lt": 3}}}},
                        {"$set": {"reviews.$.flag": True}})
    assert db.posts.find_one()["reviews"][0] == {"by": "x", "stars": 2, "flag": True}
    # No array position matched: BadValue.
    code, name, msg = err(lambda: db.posts.update_one({"_id": 1}, {"$set": {"tags.$": "Z"}}))
    assert (code, name, msg) == (2, "BadValue",
                                 "The positional operator did not find the match needed from the query.")
    # An upsert has no matched position either.
    code, _, msg = err(lambda: db.posts.update_one({"tags": "Q"}, {"$set": {"tags.$": 1}}, upsert=True))
    assert code == 2 and "positional operator did not find" in msg


def test_all_positional_and_array_filters(db):
    db.s.insert_many([{"_id": 1, "grades": [95, 92, 90]},
                      {"_id": 2, "grades": [98, 100, 102]}])
    db.s.update_many({}, {"$inc": {"grades.$[]": 10}})
    assert [d["grades"] for d in db.s.find().sort("_id", 1)] == [[105, 102, 100], [108, 110, 112]]
    r = db.s.update_many({}, {"$set": {"grades.$[g]": 100}}, array_filters=[{"g": {"$gte": 105}}])
    assert r.modified_count == 2
    assert [d["grades"] for d in db.s.find().sort("_id", 1)] == [[100, 102, 100], [100, 100, 100]]
    # Nested filtered updates.
    db.n.insert_one({"_id": 0, "a": [{"b": 0, "c": [{"d": 0}, {"d": 1}]}, {"b": 1, "c": [{"d": 0}]}]})
    db.n.update_one({}, {"$set": {"a.$[i].c.$[j].d": 2}}, array_filters=[{"i.b": 0}, {"j.d": 0}])
    assert db.n.find_one()["a"] == [{"b": 0, "c": [{"d": 2}, {"d": 1}]}, {"b": 1, "c": [{"d": 0}]}]
    # findAndModify and bulk writes take arrayFilters too.
    doc = db.s.find_one_and_update({"_id": 1}, {"$set": {"grades.$[x]": 0}},
                                   array_filters=[{"x": 102}], return_document=ReturnDocument.AFTER)
    assert doc["grades"] == [100, 0, 100]
    res = db.s.bulk_write([UpdateOne({"_id": 2}, {"$inc": {"grades.$[x]": 1}}, array_filters=[{"x": 100}]),
                           UpdateMany({}, {"$set": {"seen": True}})])
    assert res.modified_count == 3
    assert db.s.find_one({"_id": 2})["grades"] == [101, 101, 101]


def test_array_filter_errors_as_mongodb(db):
    db.c.insert_one({"_id": 0, "a": [1, 2]})
    upd = lambda u, f: db.c.update_one({"_id": 0}, u, array_filters=f)
    cases = [
        (lambda: upd({"$set": {"a.$[i]": 5}}, [{"i": 0, "j": 0}]), 9,
         "Error parsing array filter :: caused by :: Expected a single top-level field name, found 'i' and 'j'"),
        (lambda: upd({"$set": {"a.$[i]": 5, "a.$[j]": 6}}, [{"i": 0}, {"j": 0}, {"i": 1}]), 9,
         "Found multiple array filters with the same top-level field name i"),
        (lambda: upd({"$set": {"a.$[i]": 5}}, [{"i": 0}, {"j": 0}]), 9,
         "The array filter for identifier 'j' was not used in the update { $set: { a.$[i]: 5 } }"),
        (lambda: upd({"$set": {"a.$[I]": 1}}, [{"I": 0}]), 2,
         "Error parsing array filter :: caused by :: The top-level field name must be an alphanumeric "
         "string beginning with a lowercase letter, found 'I'"),
        (lambda: upd({"$set": {"a.$[i]": 0}}, None), 2,
         "No array filter found for identifier 'i' in path 'a.$[i]'"),
        (lambda: upd({"$set": {"a.$[i]": 0, "a.0": 0}}, [{"i": 0}]), 40,
         "Updating the path 'a.0' would create a conflict at 'a'"),
        (lambda: upd({"$set": {"b.$[]": 1}}, None), 2,
         "The path 'b' must exist in the document in order to apply array updates."),
    ]
    for fn, code, msg in cases:
        got = err(fn)
        assert (got[0], got[2]) == (code, msg), got
    # Type errors fail the whole command (IDL), before any statement runs.
    with pytest.raises(OperationFailure) as e:
        db.command({"update": "c", "updates": [{"q": {}, "u": {"$set": {"a.$[i]": 1}}, "arrayFilters": {"i": 0}}]})
    assert e.value.code == 14
    assert e.value.details["errmsg"] == \
        "BSON field 'update.updates.arrayFilters' is the wrong type 'object', expected type 'array'"
    with pytest.raises(OperationFailure) as e:
        db.command({"findAndModify": "c", "query": {}, "remove": True, "arrayFilters": [{"i": 0}]})
    assert (e.value.code, e.value.details["errmsg"]) == (9, "Cannot specify arrayFilters and remove=true")
    with pytest.raises(OperationFailure) as e:
        db.command({"findAndModify": "c", "query": {}, "update": [{"$set": {"x": 1}}],
                    "arrayFilters": [{"i": 0}]})
    assert e.value.details["errmsg"] == "Cannot specify arrayFilters and a pipeline update"


def test_pipeline_updates(db):
    db.o.insert_many([{"_id": 1, "price": 4, "qty": 3, "tmp": 1}, {"_id": 2, "price": 5, "qty": 1}])
    r = db.o.update_many({}, [{"$set": {"total": {"$multiply": ["$price", "$qty"]}}}, {"$unset": "tmp"}])
    assert r.modified_count == 2
    assert list(db.o.find().sort("_id", 1)) == [
        {"_id": 1, "price": 4, "qty": 3, "total": 12}, {"_id": 2, "price": 5, "qty": 1, "total": 5}]
    db.o.update_one({"_id": 2}, [{"$replaceWith": {"only": "$price"}}])
    assert db.o.find_one({"_id": 2}) == {"_id": 2, "only": 5}
    doc = db.o.find_one_and_update({"_id": 1}, [{"$project": {"price": 1}}],
                                   return_document=ReturnDocument.AFTER)
    assert doc == {"_id": 1, "price": 4}
    # let variables of the command reach the pipeline.
    db.command({"update": "o", "updates": [{"q": {"_id": 1}, "u": [{"$set": {"v": "$$k"}}]}],
                "let": {"k": 7}})
    assert db.o.find_one({"_id": 1})["v"] == 7
    code, name, msg = err(lambda: db.o.update_one({}, [{"$group": {"_id": None}}]))
    assert (code, name, msg) == (72, "InvalidOptions", "$group is not allowed to be used within an update")
    code, _, _ = err(lambda: db.o.update_one({"_id": 1}, [{"$set": {"_id": 9}}]))
    assert code == 66


def test_inc_and_mul_on_decimal128_are_exact(db):
    db.dec.insert_one({"_id": 1, "price": Decimal128("0.10"), "n": 3})
    db.dec.update_one({"_id": 1}, {"$inc": {"price": Decimal128("0.20")}, "$mul": {"n": Decimal128("1.5")}})
    d = db.dec.find_one({"_id": 1})
    assert d["price"] == Decimal128("0.30") and d["n"] == Decimal128("4.5")
    db.dec.update_one({"_id": 1}, {"$mul": {"missing": Decimal128("2")}})
    assert db.dec.find_one({"_id": 1})["missing"] == Decimal128("0")


def test_bit_and_unknown_modifiers(db):
    db.b.insert_one({"_id": 1, "flags": 13})
    db.b.update_one({"_id": 1}, {"$bit": {"flags": {"and": 10}}})
    assert db.b.find_one()["flags"] == 8
    db.b.update_one({"_id": 1}, {"$bit": {"flags": {"or": 5}, "m": {"xor": Int64(3)}}})
    assert db.b.find_one() == {"_id": 1, "flags": 13, "m": 3}
    code, name, msg = err(lambda: db.b.update_one({}, {"$bogus": {"a": 1}}))
    assert (code, name) == (9, "FailedToParse")
    assert msg == ("Unknown modifier: $bogus. Expected a valid update modifier or pipeline-style "
                   "update specified as an array")
    code, name, _ = err(lambda: db.b.update_one({}, {"$set": {"a": 1}, "$inc": {"a": 1}}))
    assert (code, name) == (40, "ConflictingUpdateOperators")


def test_path_not_viable_as_mongodb(db):
    db.v.insert_one({"_id": 1, "v": [1, 2]})
    code, name, msg = err(lambda: db.v.update_one({"_id": 1}, {"$set": {"v.foo": 1}}))
    assert (code, name, msg) == (28, "PathNotViable", "Cannot create field 'foo' in element {v: [ 1, 2 ]}")
    code, name, msg = err(lambda: db.v.update_one({"_id": 1}, {"$rename": {"v.foo": "w"}}))
    assert (code, name) == (28, "PathNotViable")
    # With a source to move, MongoDB refuses a destination inside an array (2).
    db.v.update_one({"_id": 1}, {"$set": {"s": 1}})
    code, _, msg = err(lambda: db.v.update_one({"_id": 1}, {"$rename": {"s": "v.-1"}}))
    assert (code, msg) == (2, "The destination field cannot be an array element, 'v.-1' in doc with "
                              "_id: 1 has an array field called 'v'")


# ---------------------------------------------------------------- explain

def test_explain_verbosities(db):
    db.e.insert_many([{"_id": i, "a": i % 10, "b": i} for i in range(100)])
    db.e.create_index("a")
    q = {"find": "e", "filter": {"a": 3}}
    p = db.command({"explain": q, "verbosity": "queryPlanner"})
    assert p["queryPlanner"]["namespace"] == f"{db.name}.e"
    assert p["queryPlanner"]["parsedQuery"] == {"a": 3}
    wp = p["queryPlanner"]["winningPlan"]
    assert wp["stage"] == "FETCH" and wp["inputStage"]["stage"] == "IXSCAN"
    assert wp["inputStage"]["indexName"] == "a_1" and wp["inputStage"]["indexBounds"] == {"a": ["[3, 3]"]}
    assert p["queryPlanner"]["rejectedPlans"] == [] and "executionStats" not in p
    assert p["duet"]["strategy"] == "cow"
    s = db.command({"explain": q, "verbosity": "executionStats"})["executionStats"]
    assert s["nReturned"] == 10 and s["totalKeysExamined"] == 10 and s["totalDocsExamined"] == 10
    assert s["executionStages"]["stage"] == "FETCH" and s["executionStages"]["docsExamined"] == 10
    assert s["executionStages"]["inputStage"]["keysExamined"] == 10
    assert "allPlansExecution" not in s
    # The default verbosity is allPlansExecution, as MongoDB's.
    a = db.command({"explain": q})["executionStats"]
    assert a["allPlansExecution"] == [] and a["nReturned"] == 10
    # A collection scan examines every document; sort/skip/limit/projection stages.
    e = db.e.find({"b": {"$gte": 50}}, {"b": 1}).sort("b", -1).skip(2).limit(3).explain()
    assert e["executionStats"]["totalDocsExamined"] == 100 and e["executionStats"]["nReturned"] == 3
    st = e["queryPlanner"]["winningPlan"]
    names = []
    while st:
        names.append(st["stage"])
        st = st.get("inputStage")
    assert names == ["PROJECTION_SIMPLE", "SKIP", "SORT", "COLLSCAN"], names
    with pytest.raises(OperationFailure) as x:
        db.command({"explain": q, "verbosity": "everything"})
    assert x.value.code == 9


def test_explain_lists_the_plans_it_chose_against(db):
    db.r.insert_many([{"_id": i, "a": i % 10, "b": i % 7, "c": i} for i in range(200)])
    db.r.create_index("a")
    db.r.create_index("b")
    db.r.create_index([("a", 1), ("c", 1)])
    p = db.r.find({"a": 3, "b": 2}).explain()["queryPlanner"]
    win = p["winningPlan"]["inputStage"]["indexName"]
    lost = sorted(r["inputStage"]["indexName"] for r in p["rejectedPlans"])
    assert win not in lost and sorted(lost + [win]) == ["a_1", "a_1_c_1", "b_1"], (win, lost)
    for r in p["rejectedPlans"]:
        assert r["stage"] == "FETCH" and r["filter"] == {"a": 3, "b": 2}
    # An _id range that lost to an index is listed; an _id point lookup,
    # a hint and a query no index helps have nothing to reject.
    p = db.r.find({"_id": {"$gt": 5}, "a": 3, "c": {"$gt": 10}}).explain()["queryPlanner"]
    assert p["winningPlan"]["inputStage"]["indexName"] == "a_1_c_1"
    assert sorted(r["inputStage"]["indexName"] for r in p["rejectedPlans"]) == ["_id_", "a_1"]
    assert db.r.find({"_id": 4, "a": 4}).explain()["queryPlanner"]["rejectedPlans"] == []
    assert db.r.find({"a": 3, "b": 2}).hint("b_1").explain()["queryPlanner"]["rejectedPlans"] == []
    assert db.r.find({"c": 3}).explain()["queryPlanner"]["rejectedPlans"] == []


def index_of(stage):
    while "indexName" not in stage:
        stage = stage["inputStage"]
    return stage["indexName"]


def test_all_plans_execution_runs_every_candidate(db):
    """allPlansExecution: each candidate plan's trial (the winner first),
    its access path run to 101 results or its end, with its own counters;
    empty when only one plan could answer."""
    db.r.insert_many([{"_id": i, "a": i % 10, "b": i % 7, "c": i} for i in range(200)])
    db.r.create_index("a")
    db.r.create_index("b")
    db.r.create_index([("a", 1), ("c", 1)])
    e = db.r.find({"a": 3, "b": 2}).explain()
    win = e["queryPlanner"]["winningPlan"]["inputStage"]["indexName"]
    trials = e["executionStats"]["allPlansExecution"]
    assert [index_of(t["executionStages"]) for t in trials][0] == win
    assert sorted(index_of(t["executionStages"]) for t in trials) == ["a_1", "a_1_c_1", "b_1"]
    matches = sum(1 for i in range(200) if i % 10 == 3 and i % 7 == 2)
    keys = {"a_1": 20, "a_1_c_1": 20, "b_1": sum(1 for i in range(200) if i % 7 == 2)}
    for t in trials:
        name = index_of(t["executionStages"])
        assert t["nReturned"] == matches, t
        assert t["totalKeysExamined"] == keys[name] and t["totalDocsExamined"] == keys[name], t
        assert t["executionStages"]["stage"] == "FETCH"
        assert t["executionStages"]["inputStage"]["keysExamined"] == keys[name]
    # Every candidate stops at 101 results, as MongoDB's trial period does.
    trials = db.r.find({"a": {"$gte": 0}, "b": {"$gte": 0}}).explain()[
        "executionStats"]["allPlansExecution"]
    assert len(trials) >= 2 and all(t["nReturned"] == 101 for t in trials), trials
    # One possible plan: nothing to race.
    assert db.r.find({"c": 3}).explain()["executionStats"]["allPlansExecution"] == []
    # Below allPlansExecution the field is absent.
    s = db.command({"explain": {"find": "r", "filter": {"a": 3, "b": 2}},
                    "verbosity": "executionStats"})["executionStats"]
    assert "allPlansExecution" not in s


def test_aggregate_explain_counts_every_stage(db):
    """explain(executionStats) of an aggregate: every stage after $cursor
    has its own nReturned and executionTimeMillisEstimate; a stage the engine
    runs as several ($bucket: $group then $sort) reports the last one's."""
    db.s.insert_many([{"_id": i, "a": i % 10, "b": i} for i in range(100)])
    e = db.command({"explain": {"aggregate": "s", "pipeline": [
        {"$match": {"a": {"$lt": 5}}},
        {"$project": {"a": 1}},
        {"$group": {"_id": "$a", "n": {"$sum": 1}}},
        {"$match": {"_id": {"$gte": 1}}},
        {"$sort": {"_id": 1}},
        {"$limit": 3},
    ], "cursor": {}}, "verbosity": "executionStats"})
    st = e["stages"]
    assert st[0]["$cursor"]["executionStats"]["nReturned"] == 50
    got = [(list(s)[0], s["nReturned"]) for s in st[1:]]
    assert got == [("$project", 50), ("$group", 5), ("$match", 4), ("$sort", 3), ("$limit", 3)], got
    assert all(isinstance(s["executionTimeMillisEstimate"], int) for s in st[1:])
    e = db.command({"explain": {"aggregate": "s", "pipeline": [
        {"$bucket": {"groupBy": "$b", "boundaries": [0, 30, 100]}},
        {"$count": "n"},
    ], "cursor": {}}, "verbosity": "executionStats"})
    got = [(list(s)[0], s["nReturned"]) for s in e["stages"][1:]]
    assert got == [("$bucket", 2), ("$count", 1)], got


def test_explain_of_writes_does_not_write(db):
    db.w.insert_many([{"_id": i, "a": i % 3} for i in range(9)])
    e = db.command({"explain": {"update": "w", "updates": [{"q": {"a": 1}, "u": {"$set": {"a": 1}},
                                                             "multi": True}]},
                    "verbosity": "executionStats"})
    stages = e["executionStats"]["executionStages"]
    assert stages["stage"] == "UPDATE" and stages["nMatched"] == 3 and stages["nWouldModify"] == 0
    e = db.command({"explain": {"update": "w", "updates": [{"q": {"a": 2}, "u": {"$inc": {"a": 1}},
                                                             "multi": True}]},
                    "verbosity": "executionStats"})
    assert e["executionStats"]["executionStages"]["nWouldModify"] == 3
    e = db.command({"explain": {"delete": "w", "deletes": [{"q": {"a": 0}, "limit": 0}]},
                    "verbosity": "executionStats"})
    assert e["executionStats"]["executionStages"]["nWouldDelete"] == 3
    e = db.command({"explain": {"findAndModify": "w", "query": {"a": 9}, "update": {"$set": {"z": 1}},
                                "upsert": True}})
    assert e["executionStats"]["executionStages"]["nWouldUpsert"] == 1
    # Nothing was written.
    assert db.w.count_documents({"a": 0}) == 3 and db.w.count_documents({"a": 2}) == 3
    assert db.w.count_documents({"z": 1}) == 0
    e = db.command({"explain": {"count": "w", "query": {"a": 1}}, "verbosity": "executionStats"})
    assert e["queryPlanner"]["winningPlan"]["stage"] == "COUNT"
    assert e["executionStats"]["executionStages"]["nCounted"] == 3
    e = db.command({"explain": {"aggregate": "w", "pipeline": [{"$match": {"a": 1}},
                                                               {"$group": {"_id": "$a"}}],
                                "cursor": {}}, "verbosity": "executionStats"})
    cursor = e["stages"][0]["$cursor"]
    assert cursor["executionStats"]["totalDocsExamined"] == 9
    assert e["stages"][1]["nReturned"] == 1 and "strategy" in e["duet"]


# ---------------------------------------------------------------- validations

def test_lenient_validations_are_strict_as_mongodb(db):
    db.c.insert_many([{"_id": i} for i in range(5)])
    with pytest.raises(OperationFailure) as e:
        db.command({"delete": "c", "deletes": [{"q": {}}]})
    assert (e.value.code, e.value.details["errmsg"]) == (
        40414, "BSON field 'delete.deletes.limit' is missing but a required field")
    with pytest.raises(OperationFailure) as e:
        db.command({"find": "c", "singleBatch": 1})
    assert (e.value.code, e.value.details["errmsg"]) == (
        14, "BSON field 'find.singleBatch' is the wrong type 'int', expected type 'bool'")
    with pytest.raises(OperationFailure) as e:
        db.command({"find": "c", "showRecordId": None})
    assert e.value.code == 14
    cid = db.command({"find": "c", "batchSize": 1})["cursor"]["id"]
    with pytest.raises(OperationFailure) as e:
        db.command({"killCursors": "c", "cursors": [1]})
    assert (e.value.code, e.value.details["errmsg"]) == (
        14, "BSON field 'killCursors.cursors.0' is the wrong type 'int', expected type 'long'")
    assert db.command({"killCursors": "c", "cursors": [Int64(cid)]})["cursorsKilled"] == [cid]
    # MongoDB 7.0: dropping a collection that does not exist succeeds.
    assert db.command({"drop": "never_there"})["ok"] == 1.0


def test_a_full_first_batch_keeps_its_cursor_open(db):
    db.c.insert_many([{"_id": i} for i in range(5)])
    # The first batch holds the last document but is full: the cursor stays
    # open until a getMore finds nothing, as MongoDB's does.
    r = db.command({"find": "c", "batchSize": 5})
    assert len(r["cursor"]["firstBatch"]) == 5 and r["cursor"]["id"] != 0
    m = db.command({"getMore": r["cursor"]["id"], "collection": "c"})
    assert m["cursor"]["nextBatch"] == [] and m["cursor"]["id"] == 0
    # A first batch that is not full exhausted the results: closed at once.
    assert db.command({"find": "c", "batchSize": 200})["cursor"]["id"] == 0
    assert db.command({"find": "c"})["cursor"]["id"] == 0
    # A reached limit or an in-memory sort knows it is done.
    assert db.command({"find": "c", "batchSize": 5, "limit": 5})["cursor"]["id"] == 0
    assert db.command({"find": "c", "batchSize": 5, "sort": SON([("x", 1)])})["cursor"]["id"] == 0
    # Aggregates keep a full batch's cursor open too.
    r = db.command({"aggregate": "c", "pipeline": [], "cursor": {"batchSize": 5}})
    assert r["cursor"]["id"] != 0
    db.command({"killCursors": "c", "cursors": [Int64(r["cursor"]["id"])]})


# ---------------------------------------------------------------- repeated names

def raw(*pairs):
    """A document with its fields as given: repeated names kept (BSON allows them)."""
    import struct
    import bson
    from bson.raw_bson import RawBSONDocument
    body = b"".join(bson.encode({k: v})[4:-1] for k, v in pairs)
    return RawBSONDocument(struct.pack("<i", len(body) + 5) + body + b"\x00")


def test_repeated_names_in_a_filter_apply_every_condition(db, client):
    db.d.insert_many([{"_id": 1, "a": 1}, {"_id": 2, "a": 2}, {"_id": 3, "a": [1, 2]}])
    # MongoDB applies both: {a: 1} and {a: {$gt: 1}}.
    assert [d["_id"] for d in db.d.find(raw(("a", 1), ("a", {"$gt": 1})))] == [3]
    assert db.d.count_documents(raw(("a", {"$gte": 1}), ("a", {"$lte": 1}))) == 2
    r = db.d.update_many(raw(("a", 2), ("_id", 2), ("a", {"$lt": 5})), {"$set": {"hit": True}})
    assert r.matched_count == 1
    assert db.d.delete_many(raw(("_id", 1), ("_id", {"$gt": 1}))).deleted_count == 0
    assert list(db.d.aggregate([{"$match": raw(("a", 2), ("a", 1))}, {"$project": {"_id": 1}}])) \
        == [{"_id": 3}]
    names = client.admin.command(
        {"listDatabases": 1, "nameOnly": True,
         "filter": raw(("name", db.name), ("name", {"$regex": "^nope"}))})["databases"]
    assert names == []


def test_inserted_documents_keep_repeated_names(db):
    db.d.insert_one(raw(("_id", 5), ("x", 1), ("x", 2)))
    # Stored as sent: a query reads the first occurrence, as MongoDB's.
    assert db.d.count_documents({"x": 1}) == 1
    assert db.d.count_documents({"x": 2}) == 0
    # Two _id fields stay refused.
    with pytest.raises(WriteError) as e:
        db.d.insert_one(raw(("_id", 6), ("_id", 7)))
    assert e.value.code == 2


def test_group_id_with_repeated_names_is_refused(db):
    db.d.insert_one({"v": 1})
    with pytest.raises(OperationFailure) as e:
        list(db.d.aggregate([{"$group": {"_id": raw(("v", "$v"), ("v", "$w"))}}]))
    assert (e.value.code, e.value.details["errmsg"]) == (
        16406, 'duplicate field name specified in object literal: { v: "$v", v: "$w" }')


# ---------------------------------------------------------------- error words

def test_backreferences_and_look_around_match_as_pcre(db):
    # PCRE2 (MongoDB's regex engine) has them; duet runs such patterns by
    # bounded backtracking.
    db.c.insert_many([
        {"_id": 1, "pw": "abcdefg1", "w": "hello"},
        {"_id": 2, "pw": "abcdefgh", "w": "world"},
        {"_id": 3, "pw": "a1", "w": "cost $42"},
    ])
    ids = lambda f: sorted(d["_id"] for d in db.c.find(f))
    assert ids({"pw": {"$regex": r"^(?=.*\d).{8,}$"}}) == [1]
    assert ids({"w": {"$regex": r"(\w)\1"}}) == [1]
    assert ids({"w": {"$regex": r"(?<=\$)\d+"}}) == [3]
    assert ids({"w": {"$regex": r"^(?!h)", "$options": "i"}}) == [2, 3]
    assert ids({"$jsonSchema": {"properties": {"pw": {"pattern": "^(?=.*[0-9])"}}}}) == [1, 3]
    r = list(db.c.aggregate([
        {"$match": {"_id": 1}},
        {"$project": {"_id": 0,
                      "f": {"$regexFind": {"input": "$w", "regex": r"(\w)\1"}},
                      "all": {"$regexFindAll": {"input": "a11b22", "regex": r"(\d)\1"}},
                      "m": {"$regexMatch": {"input": "$pw", "regex": r"^(?=.*\d)"}}}},
    ]))
    assert r == [{"f": {"match": "ll", "idx": 2, "captures": ["l"]},
                  "all": [{"match": "11", "idx": 1, "captures": ["1"]},
                          {"match": "22", "idx": 4, "captures": ["2"]}],
                  "m": True}]
    # A runaway match is bounded: no match in a filter (as PCRE2's match
    # limit in MongoDB), 51156 in an expression.
    db.c.insert_one({"_id": 4, "w": "a" * 40 + "cb"})
    assert ids({"w": {"$regex": r"^(?:(a)|a)+\1b$"}}) == []
    with pytest.raises(OperationFailure) as e:
        list(db.c.aggregate([{"$project": {"m": {"$regexMatch": {
            "input": "$w", "regex": r"^(?:(a)|a)+\1b$"}}}}]))
    assert e.value.code == 51156
    # Mistakes PCRE2 refuses stay refused.
    with pytest.raises(OperationFailure) as e:
        list(db.c.find({"w": {"$regex": "a{3,1}"}}))
    assert e.value.code == 51091


def test_regex_and_conversion_errors_in_mongodb_words(db):
    db.c.insert_one({"_id": 1, "s": "abc"})
    cases = [
        (lambda: list(db.c.find({"s": {"$regex": "a("}})),
         51091, "Regular expression is invalid: missing closing parenthesis"),
        (lambda: list(db.c.find({"s": {"$regex": "[a-"}})),
         51091, "Regular expression is invalid: missing terminating ] for character class"),
        (lambda: list(db.c.find({"s": {"$regex": "a", "$options": "g"}})),
         51108, " invalid flag in regex options: g"),
        (lambda: list(db.c.aggregate([{"$project": {"m": {"$regexMatch": {
            "input": "$s", "regex": "+"}}}}])),
         51111, "Invalid Regex in $regexMatch: quantifier does not follow a repeatable item"),
        # A field's conversion fails while the pipeline runs: the
        # executor's context comes first.
        (lambda: list(db.c.aggregate([{"$project": {"n": {"$toInt": "$s"}}}])),
         241, "PlanExecutor error during aggregation :: caused by :: "
              "Failed to parse number 'abc' in $convert with no onError value: "
              "Did not consume whole string."),
        (lambda: list(db.c.aggregate([{"$project": {"n": {"$convert": {
            "input": "$s", "to": "double"}}}}])),
         241, "PlanExecutor error during aggregation :: caused by :: "
              "Failed to parse number 'abc' in $convert with no onError value: "
              "Did not consume any digits"),
        # MongoDB's optimizer folds an operator on constants before the
        # pipeline runs, so its error is bare there; duetdb evaluates it while
        # running (docs/design.md §14.4): the same words after the executor's
        # context.
        (lambda: list(db.c.aggregate([{"$project": {"n": {"$toInt": 1e10}}}])),
         241, "PlanExecutor error during aggregation :: caused by :: "
              "Conversion would overflow target type in $convert with no onError value: 1e+10"),
    ]
    for run, code, msg in cases:
        with pytest.raises(OperationFailure) as e:
            run()
        assert (e.value.code, e.value.details["errmsg"]) == (code, msg)
    # onError still catches every one of them.
    r = list(db.c.aggregate([{"$project": {"_id": 0, "n": {"$convert": {
        "input": "$s", "to": "int", "onError": "bad"}}}}]))
    assert r == [{"n": "bad"}]


def test_errors_raised_while_executing_carry_mongodbs_context(db):
    """An error raised while a plan runs carries MongoDB 7's context
    ("PlanExecutor error during aggregation :: caused by :: …", "Executor
    error during find command", "… during getMore"), code unchanged; an
    error of parsing does not."""
    db.g.insert_many([{"_id": i, "x": i} for i in range(3000)])

    def failure(f):
        with pytest.raises(OperationFailure) as e:
            f()
        return e.value.code, e.value.details["errmsg"]

    by_zero = {"$divide": [1, {"$subtract": ["$x", "$x"]}]}
    assert failure(lambda: list(db.g.aggregate([{"$project": {"d": by_zero}}]))) \
        == (2, "PlanExecutor error during aggregation :: caused by :: can't $divide by zero")
    code, msg = failure(lambda: list(db.g.aggregate([{"$project": {"d": {"$nope": 1}}}])))
    assert code == 31325 and not msg.startswith("PlanExecutor"), msg
    assert failure(lambda: list(db.g.find({"$expr": by_zero}))) \
        == (2, "Executor error during find command :: caused by :: can't $divide by zero")
    # A constant regex is compiled by MongoDB's optimizer, before anything
    # runs: its error is bare, also inside a $project (no "Invalid $project"
    # either), and it fails even on an empty collection or a dead branch.
    bad = {"$regexMatch": {"input": "$s", "regex": "+"}}
    words = "Invalid Regex in $regexMatch: quantifier does not follow a repeatable item"
    for coll in (db.g, db.empty):
        assert failure(lambda: list(coll.aggregate([{"$project": {"d": bad}}]))) \
            == (51111, words)
        assert failure(lambda: list(coll.find({"$expr": {"$cond": [False, bad, True]}}))) \
            == (51111, words)
    assert failure(lambda: db.g.distinct("x", {"$expr": by_zero})) \
        == (2, "Executor error during distinct command :: caused by :: can't $divide by zero")
    code, msg = failure(lambda: db.g.distinct("x", {"x": {"$nope": 1}}))
    assert code == 2 and not msg.startswith("Executor"), msg
    # Past the first batch, the error reaches a getMore.
    late = {"$expr": {"$lt": [{"$divide": [1, {"$subtract": ["$x", 2500]}]}, 100]}}
    seen = []
    code, msg = failure(lambda: [seen.append(d) for d in db.g.find(late).batch_size(2)])
    assert seen and (code, msg) == (
        2, "Executor error during getMore :: caused by :: can't $divide by zero")


def test_updates_of_a_document_with_repeated_names_keep_every_field(db):
    # MongoDB's update addresses the first field of a name and keeps the
    # others where they are; a stored document is never collapsed silently.
    import bson
    from bson.raw_bson import RawBSONDocument

    def pairs(data):
        """A document's elements in order, repeated names kept (nested too)."""
        opts = bson.CodecOptions(document_class=RawBSONDocument)
        out, pos, end = [], 4, len(data) - 1
        while pos < end:
            k, v, pos = bson._element_to_dict(data, memoryview(data), pos, end, opts)
            out.append((k, pairs(v.raw) if isinstance(v, RawBSONDocument) else v))
        return out

    def stored(_id):
        return pairs(db.d.with_options(
            codec_options=bson.CodecOptions(document_class=RawBSONDocument)
        ).find_one({"_id": _id}).raw)

    cases = [
        ({"$set": {"x": 9}}, [("_id", 0), ("x", 9), ("x", 2)]),
        ({"$inc": {"x": 1}}, [("_id", 1), ("x", 2), ("x", 2)]),
        ({"$unset": {"x": ""}}, [("_id", 2), ("x", 2)]),
        ({"$push": {"y": 1}}, [("_id", 3), ("x", 1), ("x", 2), ("y", [1])]),
        ({"$set": {"x": [1]}, "$push": {"z": 1}}, [("_id", 4), ("x", [1]), ("x", 2), ("z", [1])]),
        ({"$rename": {"x": "w"}}, [("_id", 5), ("x", 2), ("w", 1)]),
    ]
    for i, (update, want) in enumerate(cases):
        db.d.insert_one(raw(("_id", i), ("x", 1), ("x", 2)))
        assert db.d.update_one({"_id": i}, update).modified_count == 1, update
        assert stored(i) == want, update
    # The first occurrence decides what a path can reach.
    db.d.insert_one(raw(("_id", 10), ("x", 1), ("x", {"a": 1})))
    with pytest.raises(WriteError) as e:
        db.d.update_one({"_id": 10}, {"$set": {"x.y": 9}})
    assert (e.value.code, e.value.details["errmsg"]) == (28, "Cannot create field 'y' in element {x: 1}")
    # Nested repeats: a field beside them, and the first of them, change alone.
    db.d.insert_one({"_id": 11, "a": raw(("b", 1), ("b", 2))})
    db.d.update_one({"_id": 11}, {"$set": {"c": 1}})
    db.d.update_one({"_id": 11}, {"$inc": {"a.b": 10}})
    assert stored(11) == [("_id", 11), ("a", [("b", 11), ("b", 2)]), ("c", 1)]
    # A pipeline-style update and findAndModify keep them too.
    db.d.update_one({"_id": 0}, [{"$set": {"p": 1}}])
    assert stored(0) == [("_id", 0), ("x", 9), ("x", 2), ("p", 1)]
    db.d.find_one_and_update({"_id": 1}, {"$set": {"q": 1}})
    assert stored(1) == [("_id", 1), ("x", 2), ("x", 2), ("q", 1)]
