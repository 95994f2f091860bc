//! 2dsphere indexes and geo queries (issue #18 item 5): index scans equal a
//! collection scan and a brute-force reference on random shapes; `$near` and
//! `$geoNear` order by haversine distance on MongoDB's earth radius; MongoDB's
//! errors; a held snapshot keeps answering from its own index version.

use duetdb::bson::{doc, Bson, Document};
use duetdb::{Collection, Database};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

const R: f64 = 6_378_100.0;

fn haversine(a: (f64, f64), b: (f64, f64)) -> f64 {
    let (lng1, lat1) = (a.0.to_radians(), a.1.to_radians());
    let (lng2, lat2) = (b.0.to_radians(), b.1.to_radians());
    let h = ((lat2 - lat1) / 2.0).sin().powi(2)
        + lat1.cos() * lat2.cos() * ((lng2 - lng1) / 2.0).sin().powi(2);
    2.0 * R * h.sqrt().min(1.0).asin()
}

fn index_used(c: &Collection, filter: Document) -> Option<String> {
    let e = c.find(filter).explain().expect("explain");
    let text = format!("{e:?}");
    let at = text.find("indexName")?;
    let rest = &text[at..];
    let start = rest.find("String(\"")? + 8;
    let end = rest[start..].find('"')?;
    Some(rest[start..start + end].to_string())
}

fn ids_of(docs: &[Document]) -> Vec<i32> {
    docs.iter()
        .map(|d| d.get_i32("_id").expect("_id"))
        .collect()
}

fn sorted_ids(c: &Collection, filter: Document, natural: bool) -> Vec<i32> {
    let mut f = c.find(filter);
    if natural {
        f = f.hint(doc! {"$natural": 1});
    }
    let mut v = ids_of(&f.run().expect("find"));
    v.sort();
    v
}

fn point(p: (f64, f64)) -> Document {
    doc! {"type": "Point", "coordinates": [p.0, p.1]}
}

fn ring(c: (f64, f64), r: f64, rng: &mut StdRng) -> Vec<Bson> {
    // A random convex-ish quadrilateral around c.
    let mut pts: Vec<Bson> = (0..4)
        .map(|i| {
            let a = std::f64::consts::FRAC_PI_2 * i as f64 + rng.gen_range(0.0..0.7);
            let rr = r * rng.gen_range(0.5..1.0);
            Bson::Array(vec![
                Bson::Double(c.0 + rr * a.cos()),
                Bson::Double(c.1 + rr * a.sin()),
            ])
        })
        .collect();
    pts.push(pts[0].clone());
    pts
}

fn random_location(rng: &mut StdRng) -> Option<Bson> {
    let c = (rng.gen_range(-10.0..10.0), rng.gen_range(40.0..55.0));
    Some(match rng.gen_range(0..8) {
        0 | 1 => Bson::Document(point(c)),
        2 => Bson::Array(vec![Bson::Double(c.0), Bson::Double(c.1)]),
        3 => Bson::Document(doc! {"lng": c.0, "lat": c.1}),
        4 => Bson::Document(doc! {"type": "LineString", "coordinates": [
        [c.0, c.1], [c.0 + rng.gen_range(-1.0..1.0), c.1 + rng.gen_range(-1.0..1.0)]]}),
        5 => Bson::Document(doc! {"type": "Polygon", "coordinates": [ring(c, 0.8, rng)]}),
        6 => Bson::Array(vec![
            Bson::Document(point(c)),
            Bson::Document(point((c.0 + 1.5, c.1 - 1.0))),
        ]),
        _ => return None,
    })
}

fn random_query(rng: &mut StdRng) -> Document {
    let c = (rng.gen_range(-10.0..10.0), rng.gen_range(40.0..55.0));
    match rng.gen_range(0..5) {
        0 => doc! {"loc": {"$geoWithin": {"$geometry":
        {"type": "Polygon", "coordinates": [ring(c, rng.gen_range(0.5..5.0), rng)]}}}},
        1 => {
            doc! {"loc": {"$geoWithin": {"$centerSphere": [[c.0, c.1], rng.gen_range(0.001..0.06)]}}}
        }
        2 => doc! {"loc": {"$geoIntersects": {"$geometry":
        {"type": "Polygon", "coordinates": [ring(c, rng.gen_range(0.5..4.0), rng)]}}}},
        3 => doc! {"loc": {"$geoIntersects": {"$geometry": {"type": "LineString",
        "coordinates": [[c.0, c.1], [c.0 + rng.gen_range(-3.0..3.0), c.1 + rng.gen_range(-3.0..3.0)]]}}}},
        _ => doc! {"loc": {"$geoWithin": {"$geometry": {"type": "MultiPolygon", "coordinates": [
        [ring(c, 1.0, rng)], [ring((c.0 + 4.0, c.1), 1.0, rng)]]}}}},
    }
}

fn geo_collection(db: &Database, n: i32, seed: u64) -> Collection {
    let c = db.collection("places");
    let mut rng = StdRng::seed_from_u64(seed);
    let docs: Vec<Document> = (0..n)
        .map(|i| {
            let mut d = doc! {"_id": i, "cat": i % 3};
            if let Some(loc) = random_location(&mut rng) {
                d.insert("loc", loc);
            }
            d
        })
        .collect();
    c.insert_many(docs, true).expect("insert");
    c
}

/// Index scans over the query region's cell ranges, then the exact
/// predicate, equal a collection scan with the same predicate.
#[test]
fn index_scans_equal_collection_scans_on_random_shapes() {
    let db = Database::in_memory();
    let c = geo_collection(&db, 600, 7);
    c.create_index_spec(&doc! {"key": {"loc": "2dsphere"}})
        .expect("2dsphere");
    let mut rng = StdRng::seed_from_u64(99);
    let mut nonempty = 0;
    for _ in 0..120 {
        let q = random_query(&mut rng);
        assert_eq!(
            index_used(&c, q.clone()).as_deref(),
            Some("loc_2dsphere"),
            "{q}"
        );
        let via_index = sorted_ids(&c, q.clone(), false);
        let scanned = sorted_ids(&c, q.clone(), true);
        assert_eq!(via_index, scanned, "{q}");
        nonempty += usize::from(!via_index.is_empty());
    }
    assert!(nonempty > 30, "queries should match something: {nonempty}");
}

/// Points against a brute-force reference: a lng/lat box and a spherical cap.
#[test]
fn point_queries_match_a_brute_force_reference() {
    let db = Database::in_memory();
    let c = db.collection("pts");
    let mut rng = StdRng::seed_from_u64(3);
    let pts: Vec<(f64, f64)> = (0..800)
        .map(|_| (rng.gen_range(-20.0..20.0), rng.gen_range(-30.0..30.0)))
        .collect();
    let docs: Vec<Document> = pts
        .iter()
        .enumerate()
        .map(|(i, p)| doc! {"_id": i as i32, "loc": point(*p)})
        .collect();
    c.insert_many(docs, true).expect("insert");
    c.create_index_spec(&doc! {"key": {"loc": "2dsphere"}})
        .expect("2dsphere");
    for _ in 0..40 {
        let (x0, y0) = (rng.gen_range(-20.0..15.0), rng.gen_range(-30.0..25.0));
        let (x1, y1) = (x0 + rng.gen_range(0.5..5.0), y0 + rng.gen_range(0.5..5.0));
        let q = doc! {"loc": {"$geoWithin": {"$geometry": {"type": "Polygon",
        "coordinates": [[[x0, y0], [x1, y0], [x1, y1], [x0, y1], [x0, y0]]]}}}};
        let want: Vec<i32> = (0..pts.len())
            .filter(|&i| {
                let (x, y) = pts[i];
                x >= x0 && x <= x1 && y >= y0 && y <= y1
            })
            .map(|i| i as i32)
            .collect();
        assert_eq!(sorted_ids(&c, q, false), want);

        let center = (rng.gen_range(-20.0..20.0), rng.gen_range(-30.0..30.0));
        let radians: f64 = rng.gen_range(0.005..0.08);
        let q = doc! {"loc": {"$geoWithin": {"$centerSphere": [[center.0, center.1], radians]}}};
        let want: Vec<i32> = (0..pts.len())
            .filter(|&i| haversine(center, pts[i]) <= radians * R)
            .map(|i| i as i32)
            .collect();
        assert_eq!(sorted_ids(&c, q, false), want);
    }
}

/// `$near` and `$geoNear`: nearest first, distances in meters equal to
/// haversine on MongoDB's radius (1e-6 relative), min/max honored.
#[test]
fn near_orders_by_haversine_distance() {
    let db = Database::in_memory();
    let c = db.collection("pts");
    let mut rng = StdRng::seed_from_u64(11);
    let pts: Vec<(f64, f64)> = (0..500)
        .map(|_| (rng.gen_range(-5.0..5.0), rng.gen_range(45.0..50.0)))
        .collect();
    let docs: Vec<Document> = pts
        .iter()
        .enumerate()
        .map(|(i, p)| doc! {"_id": i as i32, "loc": point(*p), "odd": i % 2 == 1})
        .collect();
    c.insert_many(docs, true).expect("insert");
    // Without a 2dsphere index `$near` cannot run (291).
    let e = c
        .find(doc! {"loc": {"$near": {"$geometry": point((0.0, 47.0))}}})
        .run()
        .expect_err("no index");
    assert_eq!(e.code(), 291, "{e}");
    c.create_index_spec(&doc! {"key": {"loc": "2dsphere"}})
        .expect("2dsphere");
    let here = (0.3, 47.2);
    let (min, max) = (20_000.0, 150_000.0);
    let mut want: Vec<(f64, i32)> = pts
        .iter()
        .enumerate()
        .map(|(i, p)| (haversine(here, *p), i as i32))
        .filter(|(d, _)| *d >= min && *d <= max)
        .collect();
    want.sort_by(|a, b| a.0.total_cmp(&b.0));
    let want_ids: Vec<i32> = want.iter().map(|(_, i)| *i).collect();
    assert!(want_ids.len() > 20);

    let q = doc! {"loc": {"$near": {"$geometry": point(here), "$minDistance": min, "$maxDistance": max}}};
    assert_eq!(index_used(&c, q.clone()).as_deref(), Some("loc_2dsphere"));
    assert_eq!(ids_of(&c.find(q).run().expect("near")), want_ids);
    // The sibling form and `$nearSphere`.
    let q = doc! {"loc": {"$nearSphere": {"$geometry": point(here)}, "$minDistance": min, "$maxDistance": max}};
    assert_eq!(ids_of(&c.find(q).run().expect("nearSphere")), want_ids);
    // Legacy `$nearSphere`: radians.
    let q = doc! {"loc": {"$nearSphere": [here.0, here.1], "$maxDistance": max / R, "$minDistance": min / R}};
    assert_eq!(ids_of(&c.find(q).run().expect("legacy")), want_ids);
    // A limit keeps the nearest.
    let q = doc! {"loc": {"$near": {"$geometry": point(here), "$maxDistance": max}}};
    let first = ids_of(&c.find(q).limit(3).run().expect("limit"));
    let all: Vec<(f64, i32)> = {
        let mut v: Vec<(f64, i32)> = pts
            .iter()
            .enumerate()
            .map(|(i, p)| (haversine(here, *p), i as i32))
            .collect();
        v.sort_by(|a, b| a.0.total_cmp(&b.0));
        v
    };
    assert_eq!(
        first,
        all.iter().take(3).map(|(_, i)| *i).collect::<Vec<_>>()
    );

    // $geoNear: distances, multiplier, includeLocs, query, key inferred.
    let out = c
        .aggregate(vec![doc! {"$geoNear": {
        "near": point(here), "distanceField": "dist.m", "includeLocs": "where",
        "minDistance": min, "maxDistance": max, "query": {"odd": true},
        "distanceMultiplier": 0.001, "spherical": true}}])
        .expect("geoNear");
    let want_odd: Vec<&(f64, i32)> = want.iter().filter(|(_, i)| i % 2 == 1).collect();
    assert_eq!(out.len(), want_odd.len());
    for (d, (dist, id)) in out.iter().zip(want_odd) {
        assert_eq!(d.get_i32("_id").expect("_id"), *id);
        let got = d
            .get_document("dist")
            .and_then(|x| x.get_f64("m"))
            .expect("distance");
        let want_km = dist / 1000.0;
        assert!(
            (got - want_km).abs() <= 1e-6 * want_km,
            "{got} vs {want_km}"
        );
        assert_eq!(
            d.get_document("where").expect("includeLocs"),
            &point(pts[*id as usize])
        );
    }
    // Not first: 40603. Two $near: refused.
    let e = c
        .aggregate(vec![
            doc! {"$match": {}},
            doc! {"$geoNear": {"near": point(here), "distanceField": "d"}},
        ])
        .expect_err("not first");
    assert_eq!(e.code(), 40603);
    let e = c
        .aggregate(vec![
            doc! {"$geoNear": {"near": point(here), "distanceField": "d",
            "query": {"loc": {"$near": {"$geometry": point(here)}}}}},
        ])
        .expect_err("two near");
    assert_eq!(e.code(), 2);
}

#[test]
fn geo_errors_are_mongodbs() {
    let db = Database::in_memory();
    let c = db.collection("g");
    c.create_index_spec(&doc! {"key": {"loc": "2dsphere", "cat": 1}, "2dsphereIndexVersion": 3})
        .expect("compound 2dsphere");
    let listed = c.list_indexes().expect("list");
    let g = listed
        .iter()
        .find(|d| d.get_str("name").ok() == Some("loc_2dsphere_cat_1"))
        .expect("listed");
    assert_eq!(g.get_i32("2dsphereIndexVersion").ok(), Some(3));
    assert_eq!(
        g.get_document("key").expect("key"),
        &doc! {"loc": "2dsphere", "cat": 1}
    );
    // Invalid shapes are refused (16755) and not stored; a missing or null
    // location is simply not indexed.
    for bad in [
        doc! {"_id": 1, "loc": {"type": "Point", "coordinates": [200.0, 0.0]}},
        doc! {"_id": 1, "loc": {"type": "Polygon", "coordinates": [[[0, 0], [1, 0], [1, 1], [0, 1]]]}},
        doc! {"_id": 1, "loc": "here"},
        // A self-intersecting loop (a bow tie).
        doc! {"_id": 1, "loc": {"type": "Polygon", "coordinates": [[[0, 0], [2, 2], [2, 0], [0, 2], [0, 0]]]}},
        doc! {"_id": 1, "loc": {"type": "Pointy", "coordinates": [1, 1]}},
    ] {
        let e = c.insert_one(bad.clone()).expect_err("invalid");
        assert_eq!(e.code(), 16755, "{bad}: {e}");
        assert!(e.to_string().contains("Can't extract geo keys"), "{e}");
    }
    assert_eq!(c.count(doc! {}).expect("count"), 0);
    c.insert_one(doc! {"_id": 2}).expect("missing loc");
    c.insert_one(doc! {"_id": 3, "loc": Bson::Null})
        .expect("null loc");
    // A compound query: equality on the other field, geo on the 2dsphere one.
    c.insert_one(doc! {"_id": 4, "loc": point((1.0, 1.0)), "cat": "a"})
        .expect("ok");
    c.insert_one(doc! {"_id": 5, "loc": point((1.0, 1.0)), "cat": "b"})
        .expect("ok");
    let q = doc! {"cat": "a", "loc": {"$geoWithin": {"$centerSphere": [[1.0, 1.0], 0.01]}}};
    assert_eq!(
        index_used(&c, q.clone()).as_deref(),
        Some("loc_2dsphere_cat_1")
    );
    assert_eq!(sorted_ids(&c, q, false), vec![4]);
    // Building an index over an invalid document fails the build.
    let d = db.collection("h");
    d.insert_one(doc! {"_id": 1, "loc": {"type": "Point", "coordinates": "x"}})
        .expect("no index yet");
    let e = d
        .create_index_spec(&doc! {"key": {"loc": "2dsphere"}})
        .expect_err("bad doc");
    assert_eq!(e.code(), 16755);
    assert_eq!(d.list_indexes().expect("list").len(), 1);
    // Malformed operators: BadValue.
    for q in [
        doc! {"loc": {"$geoWithin": {"$geometry": point((0.0, 0.0))}}},
        doc! {"loc": {"$near": {"$geometry": point((0.0, 0.0)), "$maxDistance": -1}}},
        doc! {"loc": {"$maxDistance": 5}},
        doc! {"$or": [{"loc": {"$near": {"$geometry": point((0.0, 0.0))}}}, {"a": 1}]},
        doc! {"loc": {"$geoIntersects": {"$geometry": {"type": "Point", "coordinates": [0, 95]}}}},
    ] {
        let e = c.find(q.clone()).run().expect_err("malformed");
        assert_eq!(e.code(), 2, "{q}: {e}");
    }
    // `2d` is refused clearly.
    let e = c
        .create_index_spec(&doc! {"key": {"p": "2d"}})
        .expect_err("2d");
    assert_eq!(e.code(), 67);
}

/// A held snapshot answers geo queries from its own version of the index,
/// whatever moves after it.
#[test]
fn snapshots_keep_their_geo_index_version() {
    let db = Database::in_memory();
    let c = geo_collection(&db, 300, 5);
    c.create_index_spec(&doc! {"key": {"loc": "2dsphere"}})
        .expect("2dsphere");
    let q = doc! {"loc": {"$geoWithin": {"$geometry": {"type": "Polygon",
    "coordinates": [[[-10, 40], [0, 40], [0, 55], [-10, 55], [-10, 40]]]}}}};
    let before = sorted_ids(&c, q.clone(), false);
    assert!(!before.is_empty());
    let snap = db.snapshot();
    // Move every location east, out of the region, and drop a few.
    c.update_many(doc! {}, doc! {"$set": {"loc": point((30.0, 10.0))}})
        .expect("move");
    c.delete_many(doc! {"_id": {"$lt": 50}}).expect("delete");
    assert!(sorted_ids(&c, q.clone(), false).is_empty());
    let held = snap.collection("places");
    let mut from_snapshot = ids_of(&held.find(q.clone()).run().expect("snapshot find"));
    from_snapshot.sort();
    assert_eq!(from_snapshot, before);
    let explain = format!("{:?}", held.find(q).explain().expect("explain"));
    assert!(explain.contains("loc_2dsphere"), "{explain}");
}
