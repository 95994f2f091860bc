"""The MongoDB 7.0 expression language through pymongo: aggregations an
application runs ($let, $map/$filter/$reduce, $switch, strings, dates with
time zones, conversions, sets, objects, exact Decimal128), the new $group
accumulators, and finds/counts/updates/deletes with $expr and the command's
`let`, $bits* and $jsonSchema — results checked against plain Python, errors
against MongoDB's codes."""

import datetime
from decimal import Decimal

import pytest
from bson import Decimal128, ObjectId
from pymongo.errors import OperationFailure


@pytest.fixture
def shop(db):
    docs = []
    for i in range(40):
        docs.append({
            "_id": i,
            "cust": f"c{i % 4}",
            "qty": i % 6,
            "price": Decimal128(f"{i % 5}.10"),
            "budget": 10,
            "spent": i % 15,
            "tags": [f"t{(i + k) % 3}" for k in range(i % 3)],
            "name": f"  Item-{i:02d} ",
            "day": datetime.datetime(2024, 3, 9, 12) + datetime.timedelta(hours=5 * i),
            "flags": i,
        })
    db.s.insert_many(docs)
    return docs


def agg(db, pipeline, **kw):
    return list(db.s.aggregate(pipeline, **kw))


def test_let_map_filter_reduce_switch(db, shop):
    out = agg(db, [
        {"$match": {"_id": {"$lt": 6}}},
        {"$project": {
            "total": {"$let": {"vars": {"q": "$qty", "p": {"$toDouble": "$price"}},
                               "in": {"$multiply": ["$$q", "$$p"]}}},
            "upper": {"$map": {"input": "$tags", "as": "t", "in": {"$toUpper": "$$t"}}},
            "t0": {"$filter": {"input": "$tags", "cond": {"$eq": ["$$this", "t0"]}}},
            "joined": {"$reduce": {"input": "$tags", "initialValue": "",
                                   "in": {"$concat": ["$$value", "$$this", ";"]}}},
            "size": {"$switch": {"branches": [
                {"case": {"$lt": ["$qty", 2]}, "then": "small"},
                {"case": {"$lt": ["$qty", 4]}, "then": "medium"}],
                "default": "large"}},
        }},
        {"$sort": {"_id": 1}},
    ])
    for d, src in zip(out, shop):
        assert d["total"] == pytest.approx(src["qty"] * float(src["price"].to_decimal()))
        assert d["upper"] == [t.upper() for t in src["tags"]]
        assert d["t0"] == [t for t in src["tags"] if t == "t0"]
        assert d["joined"] == "".join(t + ";" for t in src["tags"])
        q = src["qty"]
        assert d["size"] == ("small" if q < 2 else "medium" if q < 4 else "large")


def test_strings_sets_objects_and_conversions(db, shop):
    out = agg(db, [
        {"$match": {"_id": 7}},
        {"$project": {
            "_id": 0,
            "trim": {"$trim": {"input": "$name"}},
            "split": {"$split": [{"$trim": {"input": "$name"}}, "-"]},
            "len": {"$strLenCP": "$name"},
            "sub": {"$substrCP": ["$name", 2, 4]},
            "re": {"$regexFind": {"input": "$name", "regex": "([0-9]+)"}},
            "rep": {"$replaceAll": {"input": "$name", "find": " ", "replacement": "_"}},
            "union": {"$setUnion": ["$tags", ["t9"]]},
            "merged": {"$mergeObjects": [{"a": 1}, {"b": "$qty"}]},
            "toint": {"$toInt": "42"},
            "bad": {"$convert": {"input": "x", "to": "int", "onError": -1}},
            "str": {"$toString": "$qty"},
            "type": {"$type": "$price"},
            "oid": {"$toObjectId": "5ab9cbfa31c2ab715d42129e"},
            "range": {"$range": [0, 10, 4]},
            "zip": {"$zip": {"inputs": [[1, 2], ["a", "b"]]}},
            "sorted": {"$sortArray": {"input": [3, 1, 2], "sortBy": -1}},
            "field": {"$getField": {"field": "x.y", "input": {"$literal": {"x.y": 5}}}},
        }},
    ])
    assert out == [{
        "trim": "Item-07", "split": ["Item", "07"], "len": 10, "sub": "Item",
        "re": {"match": "07", "idx": 7, "captures": ["07"]},
        "rep": "__Item-07_", "union": out[0]["union"], "merged": {"a": 1, "b": 1},
        "toint": 42, "bad": -1, "str": "1", "type": "decimal",
        "oid": ObjectId("5ab9cbfa31c2ab715d42129e"), "range": [0, 4, 8],
        "zip": [[1, "a"], [2, "b"]], "sorted": [3, 2, 1], "field": 5,
    }]
    assert sorted(out[0]["union"]) == sorted(set(shop[7]["tags"]) | {"t9"})


def test_decimal128_arithmetic_is_exact(db, shop):
    out = agg(db, [{"$group": {"_id": None, "total": {"$sum": "$price"},
                               "avg": {"$avg": "$price"}}}])
    total = sum(d["price"].to_decimal() for d in shop)
    assert out[0]["total"].to_decimal() == total
    assert out[0]["avg"].to_decimal() == total / len(shop)
    out = agg(db, [{"$match": {"_id": 1}}, {"$project": {
        "x": {"$add": [Decimal128("0.1"), Decimal128("0.2")]},
        "y": {"$multiply": ["$price", 3]},
        "r": {"$round": [Decimal128("2.345"), 2]}}}])
    assert out[0]["x"] == Decimal128("0.3")
    assert out[0]["y"].to_decimal() == Decimal("3.30")
    assert out[0]["r"] == Decimal128("2.34")


def test_dates_with_time_zones(db, shop):
    out = agg(db, [{"$match": {"_id": 0}}, {"$project": {
        "ny": {"$dateToString": {"date": "$day", "format": "%Y-%m-%d %H:%M %z",
                                 "timezone": "America/New_York"}},
        "hour": {"$hour": {"date": "$day", "timezone": "+05:30"}},
        "parts": {"$dateToParts": {"date": "$day"}},
        "trunc": {"$dateTrunc": {"date": "$day", "unit": "week", "startOfWeek": "monday"}},
        "plus": {"$dateAdd": {"startDate": "$day", "unit": "month", "amount": 1}},
        "diff": {"$dateDiff": {"startDate": "$day", "endDate": datetime.datetime(2024, 12, 25),
                               "unit": "day"}},
        "parsed": {"$dateFromString": {"dateString": "2024-03-10T03:30:00",
                                       "timezone": "America/New_York"}},
    }}])[0]
    assert out["ny"] == "2024-03-09 07:00 -0500"
    assert out["hour"] == 17
    assert out["parts"]["year"] == 2024 and out["parts"]["day"] == 9
    assert out["trunc"] == datetime.datetime(2024, 3, 4)
    assert out["plus"] == datetime.datetime(2024, 4, 9, 12)
    assert out["diff"] == (datetime.date(2024, 12, 25) - datetime.date(2024, 3, 9)).days
    # 03:30 on 2024-03-10 is after New York's spring-forward: EDT, UTC-4.
    assert out["parsed"] == datetime.datetime(2024, 3, 10, 7, 30)


def test_new_accumulators(db, shop):
    out = agg(db, [
        {"$group": {
            "_id": "$cust",
            "top": {"$top": {"sortBy": {"spent": -1, "_id": 1}, "output": "$_id"}},
            "last2": {"$lastN": {"n": 2, "input": "$_id"}},
            "max2": {"$maxN": {"n": 2, "input": "$spent"}},
            "sd": {"$stdDevPop": "$qty"},
            "med": {"$median": {"input": "$qty", "method": "approximate"}},
            "m": {"$mergeObjects": {"$arrayToObject": [[["k", "$_id"]]]}},
        }},
        {"$sort": {"_id": 1}},
    ])
    assert [d["_id"] for d in out] == ["c0", "c1", "c2", "c3"]
    for d in out:
        mine = [s for s in shop if s["cust"] == d["_id"]]
        best = sorted(mine, key=lambda s: (-s["spent"], s["_id"]))[0]
        assert d["top"] == best["_id"]
        assert sorted(d["max2"], reverse=True) == sorted((s["spent"] for s in mine), reverse=True)[:2]
        qs = [s["qty"] for s in mine]
        mean = sum(qs) / len(qs)
        assert d["sd"] == pytest.approx((sum((q - mean) ** 2 for q in qs) / len(qs)) ** 0.5)
        assert d["med"] in qs
        assert d["m"]["k"] in [s["_id"] for s in mine]


def test_expr_and_let_in_find_count_update_delete(db, shop):
    over = [d["_id"] for d in shop if d["spent"] > d["budget"]]
    got = [d["_id"] for d in db.s.find({"$expr": {"$gt": ["$spent", "$budget"]}}).sort("_id", 1)]
    assert got == over
    got = [d["_id"] for d in db.s.find({"$expr": {"$gt": ["$spent", "$$limit"]}},
                                       let={"limit": 12}).sort("_id", 1)]
    assert got == [d["_id"] for d in shop if d["spent"] > 12]
    n = db.command("count", "s", query={"$expr": {"$eq": ["$qty", "$$q"]}}, let={"q": 3})["n"]
    assert n == sum(1 for d in shop if d["qty"] == 3)
    r = db.s.update_many({"$expr": {"$eq": ["$qty", "$$q"]}}, {"$set": {"hit": True}}, let={"q": 2})
    assert r.matched_count == sum(1 for d in shop if d["qty"] == 2)
    r = db.s.delete_many({"$expr": {"$eq": ["$hit", "$$yes"]}}, let={"yes": True})
    assert r.deleted_count == sum(1 for d in shop if d["qty"] == 2)
    # An expression error fails the query with MongoDB's code.
    with pytest.raises(OperationFailure) as e:
        list(db.s.find({"$expr": {"$gt": [{"$add": ["$cust", 1]}, 0]}}))
    assert e.value.code == 14
    with pytest.raises(OperationFailure) as e:
        list(db.s.find({"$expr": {"$eq": ["$qty", "$$nope"]}}))
    assert e.value.code == 17276
    # A command's `let` runs before any document is read: no field paths.
    with pytest.raises(OperationFailure) as e:
        list(db.s.find({"$expr": {"$eq": ["$qty", "$$q"]}}, let={"q": "$qty"}))
    assert e.value.code == 4890500


def test_bits_json_schema_comment(db, shop):
    got = [d["_id"] for d in db.s.find({"flags": {"$bitsAllSet": [0, 2]}, "$comment": "bits"})]
    assert sorted(got) == [d["_id"] for d in shop if d["flags"] & 5 == 5]
    got = [d["_id"] for d in db.s.find({"flags": {"$bitsAnyClear": 3}})]
    assert sorted(got) == [d["_id"] for d in shop if d["flags"] & 3 != 3]
    schema = {"$jsonSchema": {"required": ["qty"], "properties": {
        "qty": {"bsonType": "int", "minimum": 4}, "tags": {"maxItems": 1}}}}
    got = sorted(d["_id"] for d in db.s.find(schema))
    assert got == [d["_id"] for d in shop if d["qty"] >= 4 and len(d["tags"]) <= 1]
    with pytest.raises(OperationFailure) as e:
        list(db.s.find({"$jsonSchema": {"frob": 1}}))
    assert e.value.code == 9


@pytest.mark.parametrize("spec,code", [
    ({"$abs": {"$frob": 1}}, 168),
    # Directly as a projection's value, MongoDB's projection parser answers.
    ({"$frob": 1}, 31325),
    ({"$size": 1}, 17124),
    ({"$arrayElemAt": [[1], "x"]}, 28690),
    ({"$mod": [1, 0]}, 16610),
    ({"$divide": [1, 0]}, 2),
    ({"$toInt": "x"}, 241),
    ({"$dateToString": {"date": "$day", "format": "%Q"}}, 18536),
    ({"$hour": {"date": "$day", "timezone": "Mars/Base"}}, 40485),
    ({"$switch": {"branches": [{"case": False, "then": 1}]}}, 40066),
    ({"$concatArrays": [[1], 2]}, 28664),
    ({"$let": {"vars": {"Bad": 1}, "in": 1}}, 16867),
])
def test_error_codes(db, shop, spec, code):
    with pytest.raises(OperationFailure) as e:
        agg(db, [{"$project": {"x": spec}}])
    assert e.value.code == code, e.value.details


def test_cluster_time_is_the_reads_snapshot_time(make_server):
    """$$CLUSTER_TIME is the Timestamp of the read's snapshot — on a quiet
    server, the reply's operationTime and $clusterTime — not the wall
    clock; the same in a $expr filter of find and count."""
    from bson import Timestamp

    srv = make_server()
    with srv.client() as c:
        db = c.cts
        db.c.insert_many([{"_id": i} for i in range(3)])
        r = db.command("aggregate", "c", pipeline=[
            {"$limit": 1}, {"$project": {"_id": 0, "t": "$$CLUSTER_TIME"}}], cursor={})
        t = r["cursor"]["firstBatch"][0]["t"]
        assert isinstance(t, Timestamp)
        assert t == r["operationTime"] == r["$clusterTime"]["clusterTime"]
        same = {"$expr": {"$eq": ["$$CLUSTER_TIME", t]}}
        assert db.c.count_documents(same) == 3
        assert len(list(db.c.find(same))) == 3
        # A later write moves it on.
        db.c.insert_one({"_id": 9})
        r2 = db.command("aggregate", "c", pipeline=[
            {"$limit": 1}, {"$project": {"_id": 0, "t": "$$CLUSTER_TIME"}}], cursor={})
        t2 = r2["cursor"]["firstBatch"][0]["t"]
        assert t2 > t and t2 == r2["operationTime"]
        assert db.c.count_documents(same) == 0
