"""Find projections with aggregation expressions (MongoDB 4.4+), through
pymongo: computed fields, variables, the mixing rules and their codes, the
find-only operators beside expressions, and every place a find-style
projection is accepted — find and its getMore batches under every snapshot
strategy, a named snapshot, a transaction, a tailable cursor, a `$text`
find, findAndModify's `fields` — with the statement's collation and `let`.
"""

import pytest
from bson import Timestamp
from pymongo import ReturnDocument
from pymongo.errors import OperationFailure

CI = {"locale": "en", "strength": 2}
DOCS = [
    {"_id": 1, "a": 1, "s": "abc", "n": {"m": 2}, "arr": [{"x": 1}, {"x": 5}]},
    {"_id": 2, "a": 2, "s": "XYZ", "arr": [3]},
]


def failure(run):
    with pytest.raises(OperationFailure) as e:
        run()
    return e.value.code, e.value.details["errmsg"]


@pytest.fixture
def coll(db):
    db.c.insert_many(DOCS)
    return db.c


def test_the_forms_applications_send(coll):
    def find(*a, **kw):
        return list(coll.find(*a, **kw).sort("_id", 1))

    assert find({}, {"t": "$a"}) == [{"_id": 1, "t": 1}, {"_id": 2, "t": 2}]
    assert find({}, {"t": {"$add": ["$a", 1]}}) == [{"_id": 1, "t": 2}, {"_id": 2, "t": 3}]
    assert find({"_id": 2}, {"t": "$$ROOT"}) == [{"_id": 2, "t": DOCS[1]}]
    assert find({"_id": 1}, {"_id": 0, "t": "$$CURRENT.n.m"}) == [{"t": 2}]
    assert find({}, {"t": {"$literal": 5}}) == [{"_id": 1, "t": 5}, {"_id": 2, "t": 5}]
    assert find({}, {"a": 1, "u": {"$toUpper": "$s"}}) == [
        {"_id": 1, "a": 1, "u": "ABC"}, {"_id": 2, "a": 2, "u": "XYZ"}]
    assert find({}, {"t": "$$x"}, let={"x": 3}) == [{"_id": 1, "t": 3}, {"_id": 2, "t": 3}]
    # Documents of expressions; a string is a constant, a missing value no field.
    assert find({"_id": 1}, {"n": {"m": "$a", "k": "lit"}, "gone": "$zz"}) == [
        {"_id": 1, "n": {"m": 1, "k": "lit"}}]
    # _id: excluded beside expressions, or computed.
    assert find({"_id": 1}, {"_id": 0, "s": 1, "t": "$a"}) == [{"s": "abc", "t": 1}]
    assert find({"_id": 2}, {"_id": "$s"}) == [{"_id": "XYZ"}]


def test_now_and_cluster_time_hold_for_the_whole_command(coll):
    coll.insert_many([{"_id": i} for i in range(10, 15)])
    got = list(coll.find({}, {"now": "$$NOW", "ct": "$$CLUSTER_TIME"}, batch_size=2))
    assert len(got) == 7
    assert len({d["now"] for d in got}) == 1
    assert len({d["ct"] for d in got}) == 1 and isinstance(got[0]["ct"], Timestamp)


def test_mixing_rules_and_their_codes(coll):
    dollar = ("FieldPath field names may not start with '$'. "
              "Consider using $getField or $setField.")
    cases = [
        ({"a": 1, "b": 0}, 31254, "Cannot do exclusion on field b in inclusion projection"),
        ({"t": "$a", "b": 0}, 31254, "Cannot do exclusion on field b in inclusion projection"),
        ({"a": 0, "b": 1}, 31253, "Cannot do inclusion on field b in exclusion projection"),
        ({"a": 0, "t": {"$add": ["$a", 1]}}, 31252,
         "Cannot use expression other than $meta in exclusion projection"),
        ({"a": 0, "t": "$s"}, 31310, 'Cannot use an expression t: "$s" in an exclusion projection'),
        ({"a.b": 1, "a": "$s"}, 31250, "Path collision at a"),
        ({"a": 1, "a.b": "$s"}, 31249, "Path collision at a.b remaining portion b"),
        ({"$t": "$s"}, 16410, dollar),
        ({"t": {"$add": [1], "b": 1}}, 16410, dollar),
        ({"t": {}}, 51270, "An empty sub-projection is not a valid value. Found empty object at path"),
        ({"t": {"$frob": 1}}, 31325, "Unknown expression $frob"),
        ({"t": {"$add": [{"$frob": 1}]}}, 168, "Unrecognized expression '$frob'"),
        ({"t": "$$nope"}, 17276, "Use of undefined variable: nope"),
        ({"t": {"$meta": "textScore"}}, 40218,
         "query requires text score metadata, but it is not available"),
        ({"arr": {"$slice": "x"}}, 28667,
         'Invalid $slice syntax. The given syntax { $slice: "x" } did not match the find() '
         "syntax because :: Location31273: $slice only supports numbers and [skip, limit] "
         "arrays :: The given syntax did not match the expression $slice syntax. :: caused by "
         ":: Expression $slice takes at least 2 arguments, and at most 3, but 1 were passed in."),
        # Positional projection and expressions: never on one field.
        ({"arr.$": {"$add": [1, 2]}}, 31271,
         "positional projection cannot be used with an expression or sub object"),
        ({"arr.$": "$a"}, 31308, "positional projection cannot be used with a literal"),
        ({"arr.$": 1, "b": {"$elemMatch": {"x": 1}}}, 31255,
         "Cannot specify positional operator and $elemMatch."),
    ]
    for spec, code, words in cases:
        assert failure(lambda: list(coll.find({}, spec))) == (code, words), spec


def test_find_operators_beside_expressions(coll):
    # $slice in find's form, or the $slice expression when its arguments are not.
    assert coll.find_one({"_id": 1}, {"arr": {"$slice": 1}, "t": "$a"}) == {
        "_id": 1, "arr": [{"x": 1}], "t": 1}
    assert coll.find_one({"_id": 1}, {"_id": 0, "arr": {"$slice": ["$arr", -1]}}) == {
        "arr": [{"x": 5}]}
    # $elemMatch alone is an inclusion; among computed fields it keeps its place.
    assert coll.find_one({"_id": 1}, {"arr": {"$elemMatch": {"x": 5}}}) == {
        "_id": 1, "arr": [{"x": 5}]}
    assert coll.find_one({"_id": 1}, {"t": "$a", "arr": {"$elemMatch": {"x": 1}}, "s": 1}) == {
        "_id": 1, "s": "abc", "t": 1, "arr": [{"x": 1}]}
    # Positional: the element the query matched, beside computed fields.
    assert coll.find_one({"arr.x": 5}, {"arr.$": 1, "t": {"$add": ["$a", 10]}}) == {
        "_id": 1, "arr": [{"x": 5}], "t": 11}
    assert failure(lambda: coll.find_one({"_id": 1}, {"arr.$": 1})) == (
        51246, "Executor error during find command :: caused by :: "
               "positional operator '.$' couldn't find a matching element in the array")


def test_errors_while_evaluating_carry_the_executors_context(coll):
    words = "$add only supports numeric or date types, not string"
    assert failure(lambda: list(coll.find({}, {"t": {"$add": ["$s", 1]}}))) == (
        14, "Executor error during find command :: caused by :: " + words)
    # In a later batch: getMore's context.
    coll.insert_many([{"_id": i, "s": 1} for i in range(10, 13)] + [{"_id": 20, "s": "x"}])
    cursor = coll.find({"_id": {"$gte": 10}}, {"t": {"$add": ["$s", 1]}}, batch_size=2)
    assert [next(cursor)["t"], next(cursor)["t"]] == [2, 2]
    assert failure(lambda: list(cursor)) == (
        14, "Executor error during getMore :: caused by :: " + words)


@pytest.mark.parametrize("strategy", ["vls", "olcp", "cow", "none"])
def test_every_snapshot_strategy(db, coll, strategy):
    r = db.command({"find": "c", "filter": {}, "sort": {"_id": 1}, "batchSize": 1,
                    "projection": {"t": {"$multiply": ["$a", "$$k"]}},
                    "let": {"k": 10}, "$duet": {"snapshot": strategy}})
    got = r["cursor"]["firstBatch"]
    if r["cursor"]["id"]:
        got += db.command({"getMore": r["cursor"]["id"], "collection": "c"})[
            "cursor"]["nextBatch"]
    assert got == [{"_id": 1, "t": 10}, {"_id": 2, "t": 20}]


def test_named_snapshots_and_transactions(client, db, coll):
    db.command({"createSnapshot": "before"})
    try:
        coll.update_one({"_id": 1}, {"$set": {"a": 100}})
        r = db.command({"find": "c", "filter": {"_id": 1}, "projection": {"t": {"$add": ["$a", 1]}},
                        "$duet": {"snapshotName": "before"}})
        assert r["cursor"]["firstBatch"] == [{"_id": 1, "t": 2}]
    finally:
        db.command({"dropSnapshot": "before"})
    with client.start_session() as s:
        with s.start_transaction():
            coll.insert_one({"_id": 3, "a": 3}, session=s)
            got = list(coll.find({"_id": {"$gte": 2}}, {"t": {"$add": ["$a", 1]}}, session=s))
            assert got == [{"_id": 2, "t": 3}, {"_id": 3, "t": 4}]


def test_expressions_compare_under_the_statements_collation(coll):
    spec = {"eq": {"$eq": ["$s", "ABC"]}, "_id": 0}
    assert list(coll.find({"_id": 1}, spec)) == [{"eq": False}]
    assert list(coll.find({"_id": 1}, spec, collation=CI)) == [{"eq": True}]
    got = coll.find_one_and_update({"_id": 1}, {"$set": {"b": 1}}, projection=spec,
                                   collation=CI)
    assert got == {"eq": True}


def test_find_and_modify_fields(db, coll):
    got = coll.find_one_and_update({"_id": 1}, {"$inc": {"a": 1}},
                                   projection={"t": {"$add": ["$a", 100]}, "s": 1},
                                   return_document=ReturnDocument.AFTER)
    assert got == {"_id": 1, "s": "abc", "t": 102}
    got = coll.find_one_and_update({"_id": 1}, {"$inc": {"a": 1}},
                                   projection={"_id": 0, "old": "$$ROOT.a"})
    assert got == {"old": 2}
    got = db.command({"findAndModify": "c", "query": {"_id": 2}, "remove": True,
                      "fields": {"v": "$$x", "u": {"$toLower": "$s"}}, "let": {"x": 7}})
    assert got["value"] == {"_id": 2, "v": 7, "u": "xyz"}
    # Positional: the old version matched the query; the new one need not.
    assert coll.find_one_and_update({"arr.x": 5}, {"$set": {"z": 1}},
                                    projection={"arr.$": 1}) == {"_id": 1, "arr": [{"x": 5}]}
    assert failure(lambda: coll.find_one_and_update(
        {"arr.x": 5}, {"$set": {"z": 1}}, projection={"arr.$": 1},
        return_document=ReturnDocument.AFTER)) == (
        2, "cannot use a positional projection and return the new document")
    # A parse error changes nothing; an evaluation error comes after the
    # write, with the executor's context, as in MongoDB.
    assert failure(lambda: coll.find_one_and_update(
        {"_id": 1}, {"$set": {"w": 1}}, projection={"a": 1, "b": 0}))[0] == 31254
    assert "w" not in coll.find_one({"_id": 1})
    assert failure(lambda: coll.find_one_and_update(
        {"_id": 1}, {"$set": {"w": 1}}, projection={"t": {"$add": ["$s", 1]}})) == (
        14, "Plan executor error during findAndModify :: caused by :: "
            "$add only supports numeric or date types, not string")
    assert coll.find_one({"_id": 1})["w"] == 1


def test_text_finds_and_tailable_cursors(db):
    db.t.create_index([("body", "text")])
    db.t.insert_many([{"_id": 1, "body": "red fox", "k": 2}, {"_id": 2, "body": "blue", "k": 3}])
    got = db.t.find_one({"$text": {"$search": "fox"}},
                        {"_id": 0, "k": 1, "s": {"$meta": "textScore"},
                         "double": {"$multiply": [{"$meta": "textScore"}, 2]}})
    assert got["k"] == 2 and got["double"] == 2 * got["s"] > 0
    assert set(got) == {"k", "s", "double"}
    db.create_collection("cap", capped=True, size=1 << 16)
    db.cap.insert_many([{"_id": i, "v": i} for i in range(3)])
    r = db.command({"find": "cap", "filter": {}, "tailable": True,
                    "projection": {"sq": {"$multiply": ["$v", "$v"]}}})
    assert r["cursor"]["firstBatch"] == [{"_id": 0, "sq": 0}, {"_id": 1, "sq": 1},
                                         {"_id": 2, "sq": 4}]
    db.command({"killCursors": "cap", "cursors": [r["cursor"]["id"]]})
