"""Geospatial queries through pymongo (issue #18 item 5): 2dsphere indexes,
`$geoWithin`, `$geoIntersects`, `$near`/`$nearSphere`, the `$geoNear` stage,
with the examples of MongoDB's documentation (places in New York) and its
errors."""

import math

import pytest
from pymongo import GEOSPHERE
from pymongo.errors import OperationFailure, WriteError

EARTH_RADIUS_M = 6378100.0

PLACES = [
    {"_id": 1, "name": "Central Park",
     "location": {"type": "Point", "coordinates": [-73.97, 40.77]}, "category": "Parks"},
    {"_id": 2, "name": "Sara D. Roosevelt Park",
     "location": {"type": "Point", "coordinates": [-73.9928, 40.7193]}, "category": "Parks"},
    {"_id": 3, "name": "Polo Grounds",
     "location": {"type": "Point", "coordinates": [-73.9375, 40.8303]}, "category": "Stadiums"},
]


def haversine(a, b):
    lng1, lat1, lng2, lat2 = map(math.radians, (a[0], a[1], b[0], b[1]))
    h = math.sin((lat2 - lat1) / 2) ** 2 + \
        math.cos(lat1) * math.cos(lat2) * math.sin((lng2 - lng1) / 2) ** 2
    return 2 * EARTH_RADIUS_M * math.asin(min(1.0, math.sqrt(h)))


def uses_index(explain, name):
    return f"'indexName': '{name}'" in str(explain)


@pytest.fixture
def places(db):
    c = db.places
    c.insert_many(PLACES)
    name = c.create_index([("location", GEOSPHERE)])
    assert name == "location_2dsphere"
    return c


def test_2dsphere_index_is_listed_with_its_version(places):
    info = places.index_information()["location_2dsphere"]
    assert info["key"] == [("location", "2dsphere")]
    assert info["2dsphereIndexVersion"] == 3
    # Compound with an ordered key, and an explicit version.
    places.create_index([("location", GEOSPHERE), ("category", 1)],
                        **{"2dsphereIndexVersion": 2})
    assert "location_2dsphere_category_1" in places.index_information()


def test_geonear_documented_example(places):
    # MongoDB's $geoNear example: the nearest park within 2 meters.
    out = list(places.aggregate([{"$geoNear": {
        "near": {"type": "Point", "coordinates": [-73.99279, 40.719296]},
        "distanceField": "dist.calculated", "maxDistance": 2,
        "query": {"category": "Parks"}, "includeLocs": "dist.location",
        "spherical": True}}]))
    assert [d["name"] for d in out] == ["Sara D. Roosevelt Park"]
    dist = out[0]["dist"]
    assert dist["calculated"] == pytest.approx(
        haversine([-73.99279, 40.719296], [-73.9928, 40.7193]), rel=1e-6)
    assert dist["location"] == {"type": "Point", "coordinates": [-73.9928, 40.7193]}


def test_geonear_orders_by_distance_with_min_and_max(places):
    here = [-73.9667, 40.78]
    out = list(places.aggregate([{"$geoNear": {
        "near": {"type": "Point", "coordinates": here}, "key": "location",
        "distanceField": "d", "spherical": True}}]))
    want = sorted(PLACES, key=lambda p: haversine(here, p["location"]["coordinates"]))
    assert [d["_id"] for d in out] == [p["_id"] for p in want]
    for d in out:
        ref = haversine(here, d["location"]["coordinates"])
        assert d["d"] == pytest.approx(ref, rel=1e-6)
    # MongoDB's $near example: between 1000 and 5000 meters.
    near = {"$near": {"$geometry": {"type": "Point", "coordinates": here},
                      "$minDistance": 1000, "$maxDistance": 5000}}
    assert [d["name"] for d in places.find({"location": near})] == ["Central Park"]
    assert uses_index(places.find({"location": near}).explain(), "location_2dsphere")
    # Legacy $nearSphere: radians; a limit keeps the nearest.
    found = places.find({"location": {"$nearSphere": here,
                                      "$maxDistance": 10000 / EARTH_RADIUS_M}}).limit(2)
    assert [d["_id"] for d in found] == [p["_id"] for p in want[:2]]
    # distanceMultiplier: kilometers.
    out = list(places.aggregate([{"$geoNear": {
        "near": {"type": "Point", "coordinates": here}, "distanceField": "km",
        "distanceMultiplier": 0.001}}, {"$limit": 1}]))
    assert out[0]["km"] == pytest.approx(
        haversine(here, want[0]["location"]["coordinates"]) / 1000, rel=1e-6)


def test_geo_within_and_intersects(db):
    c = db.shapes
    c.create_index([("loc", GEOSPHERE)])
    c.insert_many([
        {"_id": 1, "loc": {"type": "Point", "coordinates": [3, 3]}},
        {"_id": 2, "loc": {"type": "Point", "coordinates": [10, 10]}},
        {"_id": 3, "loc": [2, 1]},  # legacy pair
        {"_id": 4, "loc": {"type": "LineString", "coordinates": [[1, 1], [9, 9]]}},
        {"_id": 5, "loc": {"type": "Polygon",
                           "coordinates": [[[1, 1], [2, 1], [2, 2], [1, 2], [1, 1]]]}},
        {"_id": 6, "other": True},
    ])
    # MongoDB's documented polygon.
    poly = {"type": "Polygon", "coordinates": [[[0, 0], [3, 6], [6, 1], [0, 0]]]}
    within = {"loc": {"$geoWithin": {"$geometry": poly}}}
    assert sorted(d["_id"] for d in c.find(within)) == [1, 3, 5]
    assert uses_index(c.find(within).explain(), "loc_2dsphere")
    # The same answer from a collection scan.
    assert sorted(d["_id"] for d in c.find(within).hint([("$natural", 1)])) == [1, 3, 5]
    inter = {"loc": {"$geoIntersects": {"$geometry": poly}}}
    assert sorted(d["_id"] for d in c.find(inter)) == [1, 3, 4, 5]
    assert c.count_documents(inter) == 4
    # $centerSphere: radians around [10, 10].
    cap = {"loc": {"$geoWithin": {"$centerSphere": [[10, 10], 0.01]}}}
    assert [d["_id"] for d in c.find(cap)] == [2]
    # Legacy planar $box works without the index too.
    box = {"loc": {"$geoWithin": {"$box": [[0, 0], [2.5, 2.5]]}}}
    assert sorted(d["_id"] for d in c.find(box)) == [3, 5]


def test_geo_errors(db):
    c = db.errs
    c.insert_one({"_id": 1, "loc": {"type": "Point", "coordinates": [1, 1]}})
    # $near needs a 2dsphere index.
    with pytest.raises(OperationFailure) as e:
        list(c.find({"loc": {"$near": {"$geometry": {"type": "Point", "coordinates": [0, 0]}}}}))
    assert e.value.code == 291
    with pytest.raises(OperationFailure) as e:
        list(c.aggregate([{"$geoNear": {"near": {"type": "Point", "coordinates": [0, 0]},
                                        "distanceField": "d"}}]))
    assert e.value.code == 27
    c.create_index([("loc", GEOSPHERE)])
    # Invalid GeoJSON in an indexed collection: 16755, nothing stored.
    with pytest.raises(WriteError) as e:
        c.insert_one({"_id": 2, "loc": {"type": "Point", "coordinates": [181, 0]}})
    assert e.value.code == 16755
    assert "Can't extract geo keys" in str(e.value)
    assert c.count_documents({}) == 1
    # Legacy 2d is refused clearly.
    with pytest.raises(OperationFailure) as e:
        c.create_index([("p", "2d")])
    assert e.value.code == 67
    # $geoNear must come first.
    with pytest.raises(OperationFailure) as e:
        list(c.aggregate([{"$match": {}}, {"$geoNear": {
            "near": {"type": "Point", "coordinates": [0, 0]}, "distanceField": "d"}}]))
    assert e.value.code == 40603
    # $near must be at the top level.
    with pytest.raises(OperationFailure) as e:
        list(c.find({"$or": [{"loc": {"$near": {"$geometry": {
            "type": "Point", "coordinates": [0, 0]}}}}, {"a": 1}]}))
    assert e.value.code == 2
