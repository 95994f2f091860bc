"""Collations through pymongo (issue #18 item 6): the `collation` option of
find, count, distinct, aggregate, update, delete and findAndModify; a
collection's default collation; collated indexes (case-insensitive unique,
used by the planner only under the same collation); MongoDB's errors."""

import pytest
from pymongo import ASCENDING
from pymongo.collation import Collation
from pymongo.errors import DuplicateKeyError, OperationFailure

CI = Collation(locale="en", strength=2)
NAMES = ["banana", "Apple", "apple", "cherry", "Banana", "éclair", "Eclair"]


@pytest.fixture
def fruit(db):
    c = db.fruit
    c.insert_many([{"_id": i, "name": n} for i, n in enumerate(NAMES)])
    return c


def names(cursor):
    return [d["name"] for d in cursor]


def plan_text(explain):
    return str(explain.get("queryPlanner", explain))


def test_find_and_sort_under_a_collation(fruit):
    assert sorted(names(fruit.find({"name": "apple"}, collation=CI))) == ["Apple", "apple"]
    # Binary comparison without a collation.
    assert names(fruit.find({"name": "apple"})) == ["apple"]
    # Strength 1 also ignores accents.
    prim = Collation(locale="en", strength=1)
    assert sorted(names(fruit.find({"name": "eclair"}, collation=prim))) == ["Eclair", "éclair"]
    got = names(fruit.find({}, collation=Collation(locale="en")).sort("name", ASCENDING))
    assert got[:5] == ["apple", "Apple", "banana", "Banana", "cherry"]
    assert set(got[5:]) == {"Eclair", "éclair"}
    # Binary order puts upper case first.
    assert names(fruit.find({}).sort("name", ASCENDING))[0] == "Apple"
    assert names(fruit.find({"name": {"$gt": "b"}}, collation=CI).sort("name", 1))[:2] == \
        ["banana", "Banana"]
    assert sorted(names(fruit.find({"name": {"$in": ["APPLE", "CHERRY"]}}, collation=CI))) == \
        ["Apple", "apple", "cherry"]


def test_numeric_ordering(db):
    c = db.items
    c.insert_many([{"v": f"item{n}"} for n in (10, 9, 100, 1)])
    got = [d["v"] for d in c.find({}, collation=Collation(locale="en", numericOrdering=True))
           .sort("v", 1)]
    assert got == ["item1", "item9", "item10", "item100"]
    assert [d["v"] for d in c.find({}).sort("v", 1)] == ["item1", "item10", "item100", "item9"]


def test_count_distinct_aggregate(fruit):
    assert fruit.count_documents({"name": "BANANA"}, collation=CI) == 2
    assert fruit.count_documents({"name": "BANANA"}) == 0
    got = fruit.distinct("name", collation=CI)
    # Strength 2 ignores case, not accents: apple, banana, cherry, eclair, éclair.
    assert len(got) == 5
    assert len(fruit.distinct("name")) == 7
    groups = list(fruit.aggregate(
        [{"$group": {"_id": "$name", "n": {"$sum": 1}}}, {"$sort": {"n": -1, "_id": 1}}],
        collation=CI,
    ))
    assert sorted(g["n"] for g in groups) == [1, 1, 1, 2, 2]
    matched = list(fruit.aggregate([{"$match": {"name": "CHERRY"}}], collation=CI))
    assert [d["name"] for d in matched] == ["cherry"]
    srt = [d["name"] for d in fruit.aggregate(
        [{"$match": {"name": {"$lt": "c"}}}, {"$sort": {"name": 1}}], collation=Collation(locale="en"))]
    assert srt == ["apple", "Apple", "banana", "Banana"]


def test_expressions_and_lookups_use_the_collation(fruit, db):
    # $expr in a filter.
    got = names(fruit.find({"$expr": {"$eq": ["$name", "APPLE"]}}, collation=CI))
    assert sorted(got) == ["Apple", "apple"]
    assert names(fruit.find({"$expr": {"$eq": ["$name", "APPLE"]}})) == []
    # Expressions in stages: $project, $in, $cmp, $switch through $bucket.
    r = list(fruit.aggregate([
        {"$match": {"_id": 1}},
        {"$project": {"_id": 0, "eq": {"$eq": ["$name", "APPLE"]},
                      "in": {"$in": ["$name", ["APPLE", "x"]]},
                      "cmp": {"$cmp": ["$name", "apple"]},
                      "lt": {"$lt": ["$name", "banana"]}}},
    ], collation=CI))
    assert r == [{"eq": True, "in": True, "cmp": 0, "lt": True}]
    r = list(fruit.aggregate([
        {"$match": {"_id": 1}},
        {"$project": {"_id": 0, "eq": {"$eq": ["$name", "APPLE"]}}},
    ]))
    assert r == [{"eq": False}]
    # $bucket boundaries compare under the collation: binary order would put
    # "Apple" and "Banana" before "a".
    buckets = list(fruit.aggregate([
        {"$match": {"name": {"$in": ["apple", "Apple", "banana", "Banana", "cherry"]}}},
        {"$bucket": {"groupBy": "$name", "boundaries": ["a", "c", "z"],
                     "output": {"n": {"$sum": 1}}}},
    ], collation=Collation(locale="en")))
    assert buckets == [{"_id": "a", "n": 4}, {"_id": "c", "n": 1}]
    # $lookup's join compares under the command's collation, both forms.
    db.orders.insert_many([{"_id": 1, "fruit": "APPLE"}, {"_id": 2, "fruit": "CHERRY"}])
    eq_form = {"$lookup": {"from": "fruit", "localField": "fruit",
                           "foreignField": "name", "as": "m"}}
    r = list(db.orders.aggregate([eq_form, {"$sort": {"_id": 1}}], collation=CI))
    assert [sorted(x["name"] for x in d["m"]) for d in r] == [["Apple", "apple"], ["cherry"]]
    r = list(db.orders.aggregate([eq_form, {"$sort": {"_id": 1}}]))
    assert [d["m"] for d in r] == [[], []]
    let_form = {"$lookup": {"from": "fruit", "let": {"f": "$fruit"}, "pipeline": [
        {"$match": {"$expr": {"$eq": ["$name", "$$f"]}}}], "as": "m"}}
    r = list(db.orders.aggregate([let_form, {"$sort": {"_id": 1}}], collation=CI))
    assert [sorted(x["name"] for x in d["m"]) for d in r] == [["Apple", "apple"], ["cherry"]]
    # $graphLookup's frontier too.
    r = list(db.orders.aggregate([
        {"$match": {"_id": 2}},
        {"$graphLookup": {"from": "fruit", "startWith": "$fruit", "connectFromField": "name",
                          "connectToField": "name", "as": "m", "maxDepth": 0}},
    ], collation=CI))
    assert [x["name"] for x in r[0]["m"]] == ["cherry"]


def test_writes_with_a_collation(fruit):
    r = fruit.update_many({"name": "APPLE"}, {"$set": {"seen": True}}, collation=CI)
    assert r.matched_count == 2
    assert fruit.count_documents({"seen": True}) == 2
    doc = fruit.find_one_and_update({"name": "CHERRY"}, {"$set": {"x": 1}}, collation=CI)
    assert doc["name"] == "cherry"
    assert fruit.delete_many({"name": "BANANA"}, collation=CI).deleted_count == 2
    assert fruit.count_documents({}) == 5


def test_case_insensitive_unique_index(db):
    c = db.users
    c.create_index("email", unique=True, collation=CI)
    c.insert_one({"email": "Ann@Example.com"})
    with pytest.raises(DuplicateKeyError):
        c.insert_one({"email": "ann@example.COM"})
    c.insert_one({"email": "bob@example.com"})
    idx = {i["name"]: i for i in c.list_indexes()}
    coll = idx["email_1"]["collation"]
    assert coll["locale"] == "en" and coll["strength"] == 2
    # The index answers a query under its collation ...
    assert c.find_one({"email": "ANN@EXAMPLE.COM"}, collation=CI)["email"] == "Ann@Example.com"
    ex = c.find({"email": "ANN@EXAMPLE.COM"}).collation(CI).explain()
    assert "email_1" in plan_text(ex)
    # ... and not a simple query on strings.
    ex = c.find({"email": "Ann@Example.com"}).explain()
    assert "email_1" not in plan_text(ex)
    assert c.find_one({"email": "Ann@Example.com"})["email"] == "Ann@Example.com"


def test_same_keys_two_collations(db):
    c = db.twin
    c.create_index("k", name="k_simple")
    c.create_index("k", name="k_ci", collation=CI)
    c.insert_many([{"k": "A"}, {"k": "a"}, {"k": "b"}])
    assert c.count_documents({"k": "A"}, collation=CI) == 2
    assert "k_ci" in plan_text(c.find({"k": "A"}).collation(CI).explain())
    assert "k_simple" in plan_text(c.find({"k": "A"}).explain())
    # A numeric bound holds no string: a mismatched index still answers it.
    c.insert_one({"k": 5})
    assert c.count_documents({"k": 5}, collation=CI) == 1


def test_collection_default_collation(db):
    db.create_collection("people", collation=CI)
    c = db.people
    opts = [x for x in db.list_collections() if x["name"] == "people"][0]["options"]
    assert opts["collation"]["locale"] == "en" and opts["collation"]["strength"] == 2
    c.insert_many([{"n": "Zoe"}, {"n": "zoe"}, {"n": "adam"}])
    # Operations without a collation use the collection's.
    assert c.count_documents({"n": "ZOE"}) == 2
    # An explicit simple collation overrides it.
    assert c.count_documents({"n": "ZOE"}, collation=Collation(locale="simple")) == 0
    # New indexes take it by default.
    c.create_index("n")
    idx = {i["name"]: i for i in c.list_indexes()}
    assert idx["n_1"]["collation"]["strength"] == 2
    assert "n_1" in plan_text(c.find({"n": "ZOE"}).explain())
    # collMod cannot change it.
    with pytest.raises(OperationFailure):
        db.command("collMod", "people", collation={"locale": "fr"})


def test_bad_collations_are_refused(fruit, db):
    with pytest.raises(OperationFailure) as e:
        list(fruit.find({}, collation={"locale": "zz_nope"}))
    assert e.value.code == 2
    assert "Field 'locale' is invalid" in str(e.value)
    with pytest.raises(OperationFailure) as e:
        fruit.count_documents({}, collation={"locale": "en", "strength": 6})
    assert e.value.code == 51024
    with pytest.raises(OperationFailure) as e:
        fruit.create_index("name", collation={"strength": 2})
    assert e.value.code == 4
    with pytest.raises(OperationFailure) as e:
        db.create_collection("bad", collation={"locale": "en", "caseFirst": "sideways"})
    assert e.value.code == 9


def test_update_operators_and_pipelines_follow_the_collation(db):
    """MongoDB's update operators take the statement's collation:
    $addToSet, $pull, $pullAll, $min/$max, $push's $sort, arrayFilters, and
    a pipeline update's expressions; findAndModify and bulk writes too."""
    from pymongo import UpdateOne
    c = db.upd
    c.insert_one({"_id": 1, "tags": ["Red", "blue"], "m": "b",
                  "g": [{"k": "X", "v": 1}]})
    c.update_one({"_id": 1}, {"$addToSet": {"tags": {"$each": ["RED", "green"]}}}, collation=CI)
    assert c.find_one()["tags"] == ["Red", "blue", "green"]
    c.update_one({"_id": 1}, {"$pull": {"tags": "GREEN"}}, collation=CI)
    c.update_one({"_id": 1}, {"$min": {"m": "B"}}, collation=CI)
    assert c.find_one()["m"] == "b"
    c.update_one({"_id": 1}, {"$set": {"g.$[e].v": 5}}, array_filters=[{"e.k": "x"}],
                 collation=CI)
    assert c.find_one()["g"][0]["v"] == 5
    c.update_one({"_id": 1}, [{"$set": {"eq": {"$eq": ["$m", "B"]}}}], collation=CI)
    assert c.find_one()["eq"] is True
    c.update_one({"_id": 1}, [{"$set": {"eq": {"$eq": ["$m", "B"]}}}])
    assert c.find_one()["eq"] is False
    doc = c.find_one_and_update({"_id": 1}, {"$pullAll": {"tags": ["red", "BLUE"]}},
                                collation=CI, return_document=True)
    assert doc["tags"] == []
    c.bulk_write([UpdateOne({"_id": 1}, {"$addToSet": {"tags": {"$each": ["a", "A"]}}},
                            collation=CI)])
    assert c.find_one()["tags"] == ["a"]


def test_elem_match_projection_and_database_aggregate(db):
    db.ep.insert_one({"_id": 1, "xs": ["Apple", "pear"]})
    got = db.ep.find_one({}, {"xs": {"$elemMatch": {"$eq": "apple"}}}, collation=CI)
    assert got["xs"] == ["Apple"]
    assert "xs" not in db.ep.find_one({}, {"xs": {"$elemMatch": {"$eq": "apple"}}})
    pipeline = [{"$documents": [{"k": "a"}, {"k": "A"}, {"k": "b"}]},
                {"$group": {"_id": "$k", "s": {"$addToSet": "$k"}}}, {"$sort": {"_id": 1}}]
    r = db.command("aggregate", 1, pipeline=pipeline, cursor={},
                   collation={"locale": "en", "strength": 2})
    assert len(r["cursor"]["firstBatch"]) == 2
    r = db.command("aggregate", 1, pipeline=pipeline, cursor={})
    assert len(r["cursor"]["firstBatch"]) == 3


def test_collation_inside_a_transaction(db):
    db.create_collection("ppl", collation=CI)
    db.ppl.insert_many([{"_id": 1, "n": "Ann"}, {"_id": 2, "n": "ann"}])
    db.plain.insert_many([{"_id": 1, "n": "Bob"}, {"_id": 2, "n": "bob"}])
    with db.client.start_session() as s:
        with s.start_transaction():
            # The collection's default inside the transaction ...
            assert db.ppl.count_documents({"n": "ANN"}, session=s) == 2
            # ... and the option, on reads, updates and deletes.
            assert len(list(db.plain.find({"n": "BOB"}, collation=CI, session=s))) == 2
            r = db.plain.update_many({"n": "BOB"}, {"$set": {"x": 1}}, collation=CI, session=s)
            assert r.matched_count == 2
            assert len(list(db.plain.aggregate([{"$group": {"_id": "$n"}}],
                                               collation=CI, session=s))) == 1
            assert db.plain.delete_many({"n": "BOB"}, collation=CI, session=s).deleted_count == 2
    assert db.plain.count_documents({}) == 0


def test_collation_on_a_tailable_cursor(db):
    from pymongo import CursorType
    db.create_collection("cap", capped=True, size=4096)
    db.cap.insert_many([{"n": "Ann"}, {"n": "bob"}, {"n": "ANN"}])
    cur = db.cap.find({"n": "ann"}, cursor_type=CursorType.TAILABLE, collation=CI)
    assert [d["n"] for d in cur] == ["Ann", "ANN"]
    cur = db.cap.find({"n": "ann"}, cursor_type=CursorType.TAILABLE)
    assert [d["n"] for d in cur] == []


def test_index_kinds_and_collation(db):
    """MongoDB's rule: btree, hashed, 2dsphere and wildcard indexes take a
    collation; a text index refuses one (67), also one inherited from the
    collection's default unless {locale: "simple"} is given."""
    c = db.kinds
    with pytest.raises(OperationFailure) as e:
        c.create_index([("body", "text")], collation=CI)
    assert e.value.code == 67
    assert "Index type 'text' does not support collation: { locale: \"en\"" in str(e.value)
    assert c.create_index([("body", "text")], collation=Collation(locale="simple"))
    db.create_collection("kinds_ci", collation=CI)
    with pytest.raises(OperationFailure) as e:
        db.kinds_ci.create_index([("body", "text")])
    assert e.value.code == 67
    assert db.kinds_ci.create_index([("body", "text")], collation=Collation(locale="simple"))

    # 2dsphere: its other fields are keyed under the collation.
    g = db.geo_ci
    g.create_index([("loc", "2dsphere"), ("name", 1)], collation=CI, name="loc_name")
    g.insert_many([{"loc": {"type": "Point", "coordinates": [1, 1]}, "name": n}
                   for n in ("Ann", "ann", "Bob")])
    near = {"loc": {"$geoWithin": {"$centerSphere": [[1, 1], 0.01]}}, "name": "ANN"}
    assert g.count_documents(near, collation=CI) == 2
    assert "loc_name" in plan_text(g.find(near).collation(CI).explain())
    assert g.count_documents(near) == 0
    idx = {i["name"]: i for i in g.list_indexes()}
    assert idx["loc_name"]["collation"]["strength"] == 2

    # Wildcard: values keyed under the collation, used by a same-collation query.
    w = db.wild_ci
    w.create_index([("$**", 1)], collation=CI, name="all_ci")
    w.insert_many([{"a": {"b": "X"}}, {"a": {"b": "x"}}, {"a": {"b": "y"}}])
    assert w.count_documents({"a.b": "x"}, collation=CI) == 2
    assert "all_ci" in plan_text(w.find({"a.b": "x"}).collation(CI).explain())
    # A simple query on strings does not use it, and answers binary.
    assert "all_ci" not in plan_text(w.find({"a.b": "x"}).explain())
    assert w.count_documents({"a.b": "x"}) == 1
    assert w.count_documents({"a.b": {"$gt": "X"}}, collation=CI) == 1


def test_the_id_index_takes_the_collections_collation(db, client):
    """Issue #18: as MongoDB's, the `_id` index of a collection created with
    a collation takes it: `_id`s equal under it conflict (11000 on `_id_`,
    on insert, upsert, in a transaction, through `$out`), a string `_id`
    equality uses the index under that collation, and `listIndexes` shows
    `_id_` with the collation. A collection without one keeps a simple `_id`."""
    db.create_collection("ids", collation=CI)
    c = db.ids
    c.insert_one({"_id": "a", "v": 1})
    with pytest.raises(DuplicateKeyError) as e:
        c.insert_one({"_id": "A"})
    assert e.value.code == 11000 and "index: _id_" in str(e.value)
    # An upsert by "A" finds "a" (the filter collates): no second document.
    c.update_one({"_id": "A"}, {"$set": {"v": 2}}, upsert=True)
    assert list(c.find()) == [{"_id": "a", "v": 2}]
    # An upsert that inserts a conflicting `_id`: refused.
    with pytest.raises(DuplicateKeyError):
        c.update_one({"_id": "A", "v": 99}, {"$set": {"w": 1}}, upsert=True)
    # Updating other fields keeps the document and the index.
    c.update_many({}, {"$inc": {"v": 1}})
    assert c.find_one({"_id": "A"}) == {"_id": "a", "v": 3}
    # Lookups under the collation go through the `_id` index.
    assert "_id_" in plan_text(c.find({"_id": "A"}).explain())
    assert "COLLSCAN" not in plan_text(c.find({"_id": "A"}).explain())
    # Simple-collation operations still compare bytewise.
    assert c.count_documents({"_id": "A"}, collation=Collation(locale="simple")) == 0
    idx = list(c.list_indexes())
    assert [i["name"] for i in idx] == ["_id_"]
    assert idx[0]["collation"]["locale"] == "en" and idx[0]["collation"]["strength"] == 2
    info = next(db.list_collections(filter={"name": "ids"}))
    assert info["idIndex"]["collation"]["strength"] == 2
    with pytest.raises(OperationFailure):
        c.drop_index("_id_")
    c.drop_indexes()
    assert [i["name"] for i in c.list_indexes()] == ["_id_"]
    with pytest.raises(DuplicateKeyError):
        c.insert_one({"_id": "A"})
    # Inside a transaction: refused at the latest by the commit.
    with client.start_session() as s:
        with pytest.raises(OperationFailure) as e:
            with s.start_transaction():
                c.insert_one({"_id": "B"}, session=s)
                c.insert_one({"_id": "b"}, session=s)
        assert e.value.code == 11000
    assert c.count_documents({}) == 1
    # `$out` into it: a conflicting output fails, changing nothing.
    db.src.insert_many([{"_id": "x"}, {"_id": "X"}])
    with pytest.raises(OperationFailure) as e:
        list(db.src.aggregate([{"$out": "ids"}]))
    assert e.value.code == 11000
    assert [d["_id"] for d in c.find()] == ["a"]
    db.src.delete_one({"_id": "X"})
    list(db.src.aggregate([{"$out": "ids"}]))
    assert [d["_id"] for d in c.find({"_id": "X"})] == ["x"]
    # A renamed collection keeps its collation and its `_id` index.
    c.rename("ids2")
    with pytest.raises(DuplicateKeyError):
        db.ids2.insert_one({"_id": "X"})
    assert [i.get("collation", {}).get("strength") for i in db.ids2.list_indexes()] == [2]
    # Numbers are unaffected by a collation.
    db.ids2.insert_one({"_id": 5})
    assert db.ids2.find_one({"_id": 5}) == {"_id": 5}
    # A capped copy keeps the collation, so its `_id` index takes it too.
    db.command("convertToCapped", "ids2", size=1 << 20)
    assert [i.get("collation", {}).get("strength") for i in db.ids2.list_indexes()] == [2]
    with pytest.raises(DuplicateKeyError):
        db.ids2.insert_one({"_id": "X"})
    # A collection without a collation: the `_id` index stays simple.
    db.plain_ids.insert_many([{"_id": "a"}, {"_id": "A"}])
    assert "collation" not in list(db.plain_ids.list_indexes())[0]
    # `{locale: "simple"}` is no collation.
    db.create_collection("simple_ids", collation=Collation(locale="simple"))
    db.simple_ids.insert_many([{"_id": "a"}, {"_id": "A"}])


def test_explain_of_a_collated_update_counts_what_it_would_modify(db):
    db.create_collection("ex", collation=CI)
    db.ex.insert_one({"_id": 1, "tags": ["a"]})
    r = db.command("explain", {"findAndModify": "ex", "query": {"_id": 1},
                               "update": {"$addToSet": {"tags": "A"}}},
                   verbosity="executionStats")
    stage = r["executionStats"]["executionStages"]
    assert stage["nMatched"] == 1 and stage["nWouldModify"] == 0


def test_explain_of_an_update_or_delete_plans_with_its_statements_collation(fruit, db):
    """Issue #18: `explain` of `update`/`delete` plans with the statement's
    `collation` (MongoDB's commands have none of their own): a collated index
    is chosen under the same collation only, and the matches counted under it."""
    fruit.create_index("name", collation=CI, name="name_ci")
    ci = CI.document

    def explain(cmd):
        return db.command("explain", cmd, verbosity="executionStats")

    upd = {"q": {"name": "apple"}, "u": {"$set": {"x": 1}}, "multi": True}
    r = explain({"update": "fruit", "updates": [dict(upd, collation=ci)]})
    assert "name_ci" in plan_text(r)
    stage = r["executionStats"]["executionStages"]
    assert stage["nMatched"] == 2 and stage["nWouldModify"] == 2
    # Without it: the simple collation, so not that index; one binary match.
    r = explain({"update": "fruit", "updates": [upd]})
    assert "name_ci" not in plan_text(r)
    assert r["executionStats"]["executionStages"]["nMatched"] == 1
    r = explain({"delete": "fruit", "deletes": [{"q": {"name": "BANANA"}, "limit": 0, "collation": ci}]})
    assert "name_ci" in plan_text(r)
    assert r["executionStats"]["executionStages"]["nWouldDelete"] == 2
    r = explain({"delete": "fruit", "deletes": [{"q": {"name": "BANANA"}, "limit": 0}]})
    assert "name_ci" not in plan_text(r)
    assert r["executionStats"]["executionStages"]["nWouldDelete"] == 0
    # A bad statement collation is refused as the write would refuse it.
    with pytest.raises(OperationFailure):
        explain({"update": "fruit", "updates": [dict(upd, collation={"locale": "xx_nope"})]})
    # Nothing was written.
    assert fruit.count_documents({"x": 1}) == 0
