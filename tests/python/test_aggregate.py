"""The aggregation pipeline through pymongo: $group/$sort/$unwind/$project and
friends, checked against plain-Python evaluations; error codes; explain; the
$duet strategy option and snapshot reads."""

import datetime
from collections import defaultdict

import pytest
from bson import Int64
from pymongo.errors import OperationFailure


@pytest.fixture
def orders(db):
    docs = []
    for i in range(120):
        docs.append({
            "_id": i,
            "cust": f"c{i % 7}",
            "status": ["open", "shipped", "done"][i % 3],
            "qty": i % 9,
            "price": (i % 5) + 0.25,
            "items": [{"sku": f"s{(i + k) % 4}", "n": k + 1} for k in range(i % 3)],
            "day": datetime.datetime(2024, 1, 1) + datetime.timedelta(days=i),
        })
    db.o.insert_many(docs)
    return docs


def test_group_sort_matches_python(db, orders):
    out = list(db.o.aggregate([
        {"$match": {"status": {"$ne": "done"}}},
        {"$group": {
            "_id": "$cust",
            "n": {"$sum": 1},
            "qty": {"$sum": "$qty"},
            "avg": {"$avg": "$price"},
            "lo": {"$min": "$qty"},
            "hi": {"$max": "$qty"},
            "statuses": {"$addToSet": "$status"},
            "ids": {"$push": "$_id"},
            "count": {"$count": {}},
        }},
        {"$sort": {"qty": -1, "_id": 1}},
    ]))
    model = defaultdict(list)
    for d in orders:
        if d["status"] != "done":
            model[d["cust"]].append(d)
    want = []
    for cust, ds in model.items():
        want.append({
            "_id": cust,
            "n": len(ds),
            "qty": sum(d["qty"] for d in ds),
            "avg": sum(d["price"] for d in ds) / len(ds),
            "lo": min(d["qty"] for d in ds),
            "hi": max(d["qty"] for d in ds),
            "statuses": sorted({d["status"] for d in ds}),
            "ids": [d["_id"] for d in ds],
            "count": len(ds),
        })
    want.sort(key=lambda g: (-g["qty"], g["_id"]))
    for g in out:
        g["statuses"] = sorted(g["statuses"])
        g["ids"] = sorted(g["ids"])
    assert [g["_id"] for g in out] == [g["_id"] for g in want]
    for got, exp in zip(out, want):
        assert got["avg"] == pytest.approx(exp.pop("avg"))
        got.pop("avg")
        assert got == exp


def test_unwind_project_and_computed_fields(db, orders):
    out = list(db.o.aggregate([
        {"$unwind": {"path": "$items", "includeArrayIndex": "pos"}},
        {"$project": {"_id": 0, "order": "$_id", "sku": "$items.sku",
                      "total": {"$multiply": ["$items.n", "$price"]}, "pos": 1}},
        {"$sort": {"order": 1, "pos": 1}},
    ]))
    want = [{"order": d["_id"], "sku": it["sku"], "total": it["n"] * d["price"], "pos": Int64(k)}
            for d in orders for k, it in enumerate(d["items"])]
    assert len(out) == len(want)
    for got, exp in zip(out, want):
        assert got == {"pos": exp["pos"], "order": exp["order"], "sku": exp["sku"], "total": exp["total"]}
    by_sku = list(db.o.aggregate([
        {"$unwind": "$items"},
        {"$group": {"_id": "$items.sku", "units": {"$sum": "$items.n"}}},
        {"$sort": {"_id": 1}},
    ]))
    model = defaultdict(int)
    for d in orders:
        for it in d["items"]:
            model[it["sku"]] += it["n"]
    assert by_sku == [{"_id": k, "units": v} for k, v in sorted(model.items())]


def test_add_fields_unset_skip_limit_count_and_dates(db, orders):
    out = list(db.o.aggregate([
        {"$addFields": {"month": {"$month": "$day"}, "big": {"$gte": ["$qty", 5]}}},
        {"$set": {"label": {"$concat": [{"$toUpper": "$status"}, "-", "$cust"]}}},
        {"$unset": ["items", "day"]},
        {"$match": {"big": True}},
        {"$sort": {"_id": 1}},
        {"$skip": 3},
        {"$limit": 4},
    ]))
    big = [d for d in orders if d["qty"] >= 5][3:7]
    assert [d["_id"] for d in out] == [d["_id"] for d in big]
    for got, d in zip(out, big):
        assert got["month"] == d["day"].month
        assert got["label"] == d["status"].upper() + "-" + d["cust"]
        assert "items" not in got and "day" not in got
    assert list(db.o.aggregate([{"$match": {"qty": 0}}, {"$count": "zeros"}])) == [
        {"zeros": sum(1 for d in orders if d["qty"] == 0)}]
    # Q1-style: a document _id, a computed sum, conditional counts.
    q1 = list(db.o.aggregate([
        {"$group": {"_id": {"s": "$status", "big": {"$cond": [{"$gt": ["$qty", 4]}, "big", "small"]}},
                    "rev": {"$sum": {"$multiply": ["$qty", "$price"]}}}},
        {"$sort": {"_id.s": 1, "_id.big": 1}},
    ]))
    model = defaultdict(float)
    for d in orders:
        model[(d["status"], "big" if d["qty"] > 4 else "small")] += d["qty"] * d["price"]
    assert [(g["_id"]["s"], g["_id"]["big"]) for g in q1] == sorted(model)
    for g in q1:
        assert g["rev"] == pytest.approx(model[(g["_id"]["s"], g["_id"]["big"])])


def test_large_results_come_in_batches(db, orders):
    out = list(db.o.aggregate([{"$unwind": "$items"}, {"$project": {"items": 1}}], batchSize=5))
    assert len(out) == sum(len(d["items"]) for d in orders)


def test_errors_have_mongodb_codes(db, orders):
    cases = [
        ([{"$frobnicate": {}}], 40324),
        ([{"$match": {}, "$limit": 1}], 40323),
        ([{"$out": 1}], 16990),
        ([{"$planCacheStats": {}}], 115),
        ([{"$lookup": {"from": "x", "as": "y"}}], 9),
        ([{"$group": {"n": {"$sum": 1}}}], 15955),
        ([{"$group": {"_id": None, "n": {"$nope": 1}}}], 15952),
        ([{"$sort": {}}], 15976),
        ([{"$sort": {"a": 2}}], 15975),
        ([{"$sort": {"a": "up"}}], 15974),
        ([{"$skip": -1}], 5107200),
        ([{"$group": {"_id": None, "n": {"$median": "$qty"}}}], 5787801),
        ([{"$limit": 0}], 15958),
        ([{"$project": {"a": 1, "b": 0}}], 31254),
        ([{"$project": {"a": 0, "b": 1}}], 31253),
        ([{"$project": {"x": {"$add": ["$cust", 1]}}}], 14),
        ([{"$project": {"x": {"$nope": 1}}}], 31325),
        ([{"$project": {"x": {"$abs": {"$nope": 1}}}}], 168),
        ([{"$unwind": "items"}], 28818),
        ([{"$unwind": {"path": "$items", "bogus": 1}}], 28811),
        ([{"$count": "$n"}], 40158),
        ([{"$group": {"_id": None, "n": 1}}], 40234),
        ([{"$group": {"_id": None, "a.b": {"$sum": 1}}}], 40235),
    ]
    for pipeline, code in cases:
        with pytest.raises(OperationFailure) as e:
            list(db.o.aggregate(pipeline))
        assert e.value.code == code, (pipeline, e.value)
    with pytest.raises(OperationFailure) as e:
        list(db.o.aggregate([{"$skip": 0}] * 1001))
    assert e.value.code == 2


def test_explain_and_strategies(db, orders):
    pipeline = [{"$match": {"status": "open"}}, {"$group": {"_id": "$cust", "n": {"$sum": 1}}},
                {"$sort": {"_id": 1}}]
    ex = db.command({"aggregate": "o", "pipeline": pipeline, "explain": True})
    assert ex["duet"]["olcpEligible"] is True
    assert ex["duet"]["commutativeStages"] == ["$group"] and ex["duet"]["restStages"] == ["$sort"]
    assert ex["duet"]["scanFilter"] == {"status": "open"}
    assert "queryPlanner" in ex["stages"][0]["$cursor"]
    ex = db.command({"explain": {"aggregate": "o", "pipeline": pipeline, "cursor": {}}})
    assert ex["ok"] == 1.0 and "queryPlanner" in ex["stages"][0]["$cursor"]
    want = list(db.o.aggregate(pipeline))
    for strategy in ("vls", "cow", "none", "auto"):
        r = db.command({"aggregate": "o", "pipeline": pipeline, "cursor": {},
                        "$duet": {"snapshot": strategy}})
        assert r["cursor"]["firstBatch"] == want, strategy
    ex = db.command({"aggregate": "o", "pipeline": [{"$group": {"_id": None, "f": {"$first": "$qty"}}}],
                     "explain": True})
    assert ex["duet"]["olcpEligible"] is False


def test_find_errors_have_mongodb_codes(db, orders):
    """Filters, projections and sorts of `find` answer with MongoDB's codes
    and words (expression_parser.cpp, projection parser, sort_pattern.cpp)."""
    with pytest.raises(OperationFailure) as e:
        db.o.find_one({"$frobnicate": 1})
    assert e.value.code == 2 and str(e.value).startswith("unknown top level operator: $frobnicate.")
    with pytest.raises(OperationFailure) as e:
        db.o.find_one({"qty": {"$frobnicate": 1}})
    assert e.value.code == 2 and "unknown operator: $frobnicate" in str(e.value)
    with pytest.raises(OperationFailure) as e:
        db.o.find_one({"cust": {"$regex": "("}})
    assert e.value.code == 51091 and "Regular expression is invalid" in str(e.value)
    with pytest.raises(OperationFailure) as e:
        db.o.find_one({}, {"a": 1, "b": 0})
    assert e.value.code == 31254
    with pytest.raises(OperationFailure) as e:
        list(db.o.find().sort("qty", 5))
    assert e.value.code == 15975
