"""The aggregation stages a reporting application sends, through pymongo:
a sales report with $lookup + $group + $facet, joins in both forms,
$unionWith, $graphLookup, $bucket/$bucketAuto/$sortByCount, windows, $out and
$merge (published at once), {aggregate: 1} with $documents, the command's
`let`, transactions, and MongoDB's error codes. Answers are checked against
plain-Python evaluations."""

import datetime
from collections import defaultdict

import pytest
from pymongo.errors import OperationFailure


@pytest.fixture
def shop(db):
    customers = [{"_id": c, "name": f"cust{c}", "region": ["north", "south", "east"][c % 3],
                  "since": 2015 + c % 8} for c in range(30)]
    products = [{"_id": f"p{p}", "category": ["tools", "toys", "food", "books"][p % 4],
                 "price": 5 + (p * 7) % 40} for p in range(20)]
    orders = []
    for i in range(300):
        lines = [{"product": f"p{(i + k * 3) % 20}", "qty": 1 + (i + k) % 4} for k in range(1 + i % 3)]
        orders.append({"_id": i, "customer": i % 33, "lines": lines,
                       "day": datetime.datetime(2024, 1, 1) + datetime.timedelta(days=i % 90),
                       "status": ["paid", "shipped", "cancelled"][i % 3]})
    db.customers.insert_many(customers)
    db.products.insert_many(products)
    db.orders.insert_many(orders)
    db.orders.create_index("customer")
    return customers, products, orders


def model_report(customers, products, orders):
    """Revenue per region and per category over non-cancelled orders."""
    region = {c["_id"]: c["region"] for c in customers}
    price = {p["_id"]: p["price"] for p in products}
    category = {p["_id"]: p["category"] for p in products}
    by_region, by_category, unknown = defaultdict(int), defaultdict(int), 0
    for o in orders:
        if o["status"] == "cancelled":
            continue
        total = sum(price[l["product"]] * l["qty"] for l in o["lines"])
        if o["customer"] in region:
            by_region[region[o["customer"]]] += total
        else:
            unknown += 1
        for l in o["lines"]:
            by_category[category[l["product"]]] += price[l["product"]] * l["qty"]
    return by_region, by_category, unknown


def test_sales_report_with_lookup_group_and_facet(db, shop):
    customers, products, orders = shop
    pipeline = [
        {"$match": {"status": {"$ne": "cancelled"}}},
        {"$lookup": {"from": "customers", "localField": "customer", "foreignField": "_id", "as": "cust"}},
        {"$unwind": "$lines"},
        {"$lookup": {"from": "products", "let": {"p": "$lines.product"},
                     "pipeline": [{"$match": {"$expr": {"$eq": ["$_id", "$$p"]}}},
                                  {"$project": {"_id": 0, "price": 1, "category": 1}}],
                     "as": "prod"}},
        {"$set": {"prod": {"$first": "$prod"},
                  "region": {"$ifNull": [{"$first": "$cust.region"}, "unknown"]}}},
        {"$set": {"amount": {"$multiply": ["$prod.price", "$lines.qty"]}}},
        {"$facet": {
            "byRegion": [{"$group": {"_id": "$region", "revenue": {"$sum": "$amount"}}},
                         {"$sort": {"_id": 1}}],
            "byCategory": [{"$group": {"_id": "$prod.category", "revenue": {"$sum": "$amount"}}},
                           {"$sort": {"revenue": -1}}],
            "orphanOrders": [{"$match": {"cust": []}}, {"$group": {"_id": "$_id"}}, {"$count": "n"}],
        }},
    ]
    [report] = list(db.orders.aggregate(pipeline))
    by_region, by_category, unknown = model_report(customers, products, orders)
    got_region = {r["_id"]: r["revenue"] for r in report["byRegion"] if r["_id"] != "unknown"}
    assert got_region == dict(by_region)
    assert {r["_id"]: r["revenue"] for r in report["byCategory"]} == dict(by_category)
    revenues = [r["revenue"] for r in report["byCategory"]]
    assert revenues == sorted(revenues, reverse=True)
    assert report["orphanOrders"] == [{"n": unknown}]
    # The same report under every strategy of the live collection.
    for s in ["cow", "vls", "olcp", "auto"]:
        [again] = list(db.orders.aggregate(pipeline, **{"$duet": {"snapshot": s}}))
        assert again == report, s


def test_lookup_forms_and_union(db, shop):
    customers, _, orders = shop
    out = list(db.customers.aggregate([
        {"$match": {"_id": {"$lt": 3}}},
        {"$lookup": {"from": "orders", "localField": "_id", "foreignField": "customer",
                     "let": {"r": "$region"},
                     "pipeline": [{"$match": {"status": "paid"}}, {"$project": {"_id": 1}}],
                     "as": "paid"}},
        {"$project": {"n": {"$size": "$paid"}}},
        {"$sort": {"_id": 1}},
    ]))
    want = [sum(1 for o in orders if o["customer"] == c and o["status"] == "paid") for c in range(3)]
    assert [d["n"] for d in out] == want
    union = list(db.customers.aggregate([
        {"$project": {"kind": "customer"}},
        {"$unionWith": {"coll": "products", "pipeline": [{"$project": {"kind": "product"}}]}},
        {"$sortByCount": "$kind"},
    ]))
    assert union == [{"_id": "customer", "count": 30}, {"_id": "product", "count": 20}]


def test_graph_lookup_and_buckets(db):
    db.staff.insert_many([
        {"_id": 1, "name": "Dev"},
        {"_id": 2, "name": "Eliot", "reportsTo": "Dev"},
        {"_id": 3, "name": "Ron", "reportsTo": "Eliot"},
        {"_id": 4, "name": "Andrew", "reportsTo": "Eliot"},
        {"_id": 5, "name": "Asya", "reportsTo": "Ron"},
    ])
    [asya] = list(db.staff.aggregate([
        {"$match": {"name": "Asya"}},
        {"$graphLookup": {"from": "staff", "startWith": "$reportsTo", "connectFromField": "reportsTo",
                          "connectToField": "name", "as": "chain", "depthField": "d"}},
    ]))
    assert [(c["name"], c["d"]) for c in asya["chain"]] == [("Ron", 0), ("Eliot", 1), ("Dev", 2)]
    db.v.insert_many([{"_id": i, "x": i} for i in range(1, 21)])
    buckets = list(db.v.aggregate([{"$bucket": {"groupBy": "$x", "boundaries": [0, 5, 10],
                                                "default": "big", "output": {"n": {"$sum": 1}}}}]))
    assert buckets == [{"_id": 0, "n": 4}, {"_id": 5, "n": 5}, {"_id": "big", "n": 11}]
    auto = list(db.v.aggregate([{"$bucketAuto": {"groupBy": "$x", "buckets": 4}}]))
    assert [b["count"] for b in auto] == [5, 5, 5, 5]
    assert auto[0]["_id"] == {"min": 1, "max": 6}
    sample = list(db.v.aggregate([{"$sample": {"size": 7}}]))
    assert len({d["_id"] for d in sample}) == 7


def test_windows(db):
    db.sales.insert_many([
        {"_id": i, "store": "ab"[i % 2], "day": i, "amount": 10 * (i % 5)} for i in range(12)
    ])
    out = list(db.sales.aggregate([
        {"$setWindowFields": {
            "partitionBy": "$store", "sortBy": {"day": 1},
            "output": {
                "running": {"$sum": "$amount", "window": {"documents": ["unbounded", "current"]}},
                "moving": {"$avg": "$amount", "window": {"documents": [-1, 1]}},
                "rank": {"$rank": {}},
            }}},
    ]))
    running = defaultdict(int)
    for d in out:
        running[d["store"]] += d["amount"]
        assert d["running"] == running[d["store"]]
    assert [d["rank"] for d in out if d["store"] == "a"] == list(range(1, 7))


def test_numeric_window_functions(db):
    t0 = datetime.datetime(2020, 5, 18, 14, 10, 30)
    miles = [1295.1, 1295.63, 1296.25, 1298.9]
    db.fleet.insert_many([{"_id": i, "t": t0 + datetime.timedelta(seconds=30 * i), "miles": m}
                          for i, m in enumerate(miles)])
    out = list(db.fleet.aggregate([
        {"$setWindowFields": {"sortBy": {"t": 1}, "output": {
            "mph": {"$derivative": {"input": "$miles", "unit": "hour"},
                    "window": {"documents": [-1, 0]}},
            "ema": {"$expMovingAvg": {"input": "$miles", "N": 3}},
            "cov": {"$covarianceSamp": ["$_id", "$miles"]},
        }}},
    ]))
    assert out[0]["mph"] is None
    for i in range(1, 4):
        assert out[i]["mph"] == pytest.approx((miles[i] - miles[i - 1]) * 120)
    ema = miles[0]
    for d, m in zip(out, miles):
        ema = m if d["_id"] == 0 else m * 0.5 + ema * 0.5
        assert d["ema"] == pytest.approx(ema)
    mean_i, mean_m = 1.5, sum(miles) / 4
    cov = sum((i - mean_i) * (m - mean_m) for i, m in enumerate(miles)) / 3
    assert all(d["cov"] == pytest.approx(cov) for d in out)
    with pytest.raises(OperationFailure) as e:
        list(db.fleet.aggregate([{"$setWindowFields": {"sortBy": {"t": 1}, "output": {
            "d": {"$derivative": {"input": "$miles"}}}}}]))
    assert e.value.code == 9 and "explicit window bounds" in str(e.value)


def test_out_and_merge_publish_at_once(db, shop):
    _, _, orders = shop
    db.summary.insert_many([{"_id": "stale", "n": 0}])
    db.summary.create_index("n")
    res = list(db.orders.aggregate([
        {"$group": {"_id": "$status", "n": {"$sum": 1}}},
        {"$out": "summary"},
    ]))
    assert res == []
    assert sorted((d["_id"], d["n"]) for d in db.summary.find()) == [("cancelled", 100), ("paid", 100), ("shipped", 100)]
    assert "n_1" in db.summary.index_information()
    db.orders.aggregate([
        {"$match": {"status": "paid"}},
        {"$group": {"_id": "$status", "n": {"$sum": 1}}},
        {"$set": {"checked": True}},
        {"$merge": {"into": "summary", "whenMatched": "merge", "whenNotMatched": "discard"}},
    ])
    assert db.summary.find_one({"_id": "paid"}) == {"_id": "paid", "n": 100, "checked": True}
    db.orders.aggregate([
        {"$group": {"_id": "$status", "n": {"$sum": 1}}},
        {"$merge": {"into": "summary", "whenMatched": [{"$set": {"n": {"$add": ["$n", "$$new.n"]}}}]}},
    ])
    assert db.summary.find_one({"_id": "shipped"})["n"] == 200
    with pytest.raises(OperationFailure) as e:
        db.orders.aggregate([{"$project": {"_id": {"$mod": ["$_id", 2]}}}, {"$out": "summary"}])
    assert e.value.code == 11000
    assert db.summary.count_documents({}) == 3
    with pytest.raises(OperationFailure) as e:
        db.orders.aggregate([{"$merge": {"into": "summary", "on": "n"}}])
    assert e.value.code == 51183


def test_out_and_merge_into_another_database(client, db, shop):
    """MongoDB 4.4+ writes $out/$merge targets in another database
    ({db, coll}); the target database is created by the write, and a
    failed write leaves none behind."""
    other = db.name + "_x"
    client.drop_database(other)
    try:
        db.orders.aggregate([
            {"$group": {"_id": "$status", "n": {"$sum": 1}}},
            {"$out": {"db": other, "coll": "summary"}},
        ])
        assert other in client.list_database_names()
        assert sorted((d["_id"], d["n"]) for d in client[other].summary.find()) == [
            ("cancelled", 100), ("paid", 100), ("shipped", 100)]
        db.orders.aggregate([
            {"$match": {"status": "paid"}},
            {"$group": {"_id": "$status", "m": {"$sum": 1}}},
            {"$merge": {"into": {"db": other, "coll": "summary"}, "whenMatched": "merge"}},
        ])
        assert client[other].summary.find_one({"_id": "paid"}) == {"_id": "paid", "n": 100, "m": 100}
        # {aggregate: 1} with $documents into another database.
        db.command("aggregate", 1, pipeline=[
            {"$documents": [{"_id": 1}, {"_id": 2}]},
            {"$out": {"db": other, "coll": "docs"}},
        ], cursor={})
        assert client[other].docs.count_documents({}) == 2
        # A failed $out into a database that does not exist creates nothing.
        missing = db.name + "_y"
        client.drop_database(missing)
        with pytest.raises(OperationFailure) as e:
            db.orders.aggregate([{"$project": {"_id": {"$mod": ["$_id", 2]}}},
                                 {"$out": {"db": missing, "coll": "c"}}])
        assert e.value.code == 11000
        assert missing not in client.list_database_names()
        # A named snapshot is not a target.
        with pytest.raises(OperationFailure) as e:
            db.orders.aggregate([{"$out": {"db": other + "@snap", "coll": "c"}}])
        assert e.value.code == 73
    finally:
        client.drop_database(other)


def test_database_aggregate_let_and_errors(db, shop):
    out = list(db.aggregate([
        {"$documents": [{"c": 1}, {"c": 2}, {"c": 99}]},
        {"$lookup": {"from": "customers", "localField": "c", "foreignField": "_id", "as": "cust"}},
        {"$project": {"_id": 0, "c": 1, "found": {"$size": "$cust"}, "tag": "$$tag"}},
    ], let={"tag": "t"}))
    assert out == [{"c": 1, "found": 1, "tag": "t"}, {"c": 2, "found": 1, "tag": "t"},
                   {"c": 99, "found": 0, "tag": "t"}]
    big = list(db.orders.aggregate([
        {"$match": {"$expr": {"$gte": [{"$size": "$lines"}, "$$min"]}}},
        {"$count": "n"},
    ], let={"min": 3}))
    assert big == [{"n": 100}]
    cases = [
        ([{"$lookup": {"from": "customers", "localField": "a", "as": "x"}}], 9),
        ([{"$lookup": {"from": "customers", "pipeline": [{"$out": "z"}], "as": "x"}}], 51047),
        ([{"$facet": {"a": [{"$facet": {"b": []}}]}}], 40600),
        ([{"$out": "a"}, {"$match": {}}], 40601),
        ([{"$bucket": {"groupBy": "$x", "boundaries": [3, 1]}}], 40194),
        ([{"$sample": {"size": -1}}], 28747),
        ([{"$replaceWith": "$status"}], 40228),
        ([{"$planCacheStats": {}}], 115),
        ([{"$setWindowFields": {"output": {"r": {"$rank": {}}}}}], 5371602),
    ]
    for pipeline, code in cases:
        with pytest.raises(OperationFailure) as e:
            list(db.orders.aggregate(pipeline))
        assert e.value.code == code, (pipeline, e.value.details)


def test_transactions_lookup_own_writes(client, db, shop):
    with client.start_session() as s:
        with s.start_transaction():
            db.customers.insert_one({"_id": 31, "name": "late", "region": "west"}, session=s)
            out = list(db.orders.aggregate([
                {"$match": {"customer": 31}},
                {"$lookup": {"from": "customers", "localField": "customer", "foreignField": "_id", "as": "c"}},
                {"$group": {"_id": {"$first": "$c.region"}, "n": {"$sum": 1}}},
            ], session=s))
            assert out == [{"_id": "west", "n": 9}]
        assert db.customers.find_one({"_id": 31})["region"] == "west"
        s.start_transaction()
        with pytest.raises(OperationFailure) as e:
            list(db.orders.aggregate([{"$out": "x"}], session=s))
        assert e.value.code == 263
        s.abort_transaction()


def test_redact(db):
    """$redact through the server: the manual's level example (documents in
    arrays pruned too) and 17053 for an answer that is no decision."""

    db.accounts.insert_one({
        "_id": 1, "level": 1, "acct_id": "xyz123",
        "cc": {"level": 5, "type": "yy", "billing_addr": {"level": 5, "addr1": "123 ABC Street"},
               "shipping_addr": [{"level": 3, "addr1": "987 XYZ Ave"}]},
        "hist": [{"level": 5}, {"level": 2, "x": 1}],
        "status": "A",
    })
    out = list(db.accounts.aggregate([
        {"$match": {"status": "A"}},
        {"$redact": {"$cond": {"if": {"$eq": ["$level", 5]},
                               "then": "$$PRUNE", "else": "$$DESCEND"}}},
    ]))
    assert out == [{"_id": 1, "level": 1, "acct_id": "xyz123",
                    "hist": [{"level": 2, "x": 1}], "status": "A"}]
    with pytest.raises(OperationFailure) as e:
        list(db.accounts.aggregate([{"$redact": "$acct_id"}]))
    assert e.value.code == 17053
    assert "aside from the variables $$KEEP, $$DESCEND, and $$PRUNE, but returned \"xyz123\"" in str(e.value)
