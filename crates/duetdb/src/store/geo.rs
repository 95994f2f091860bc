//! 2dsphere geometry at the store level: what a document's geo field holds
//! (GeoJSON `Point`, `LineString`, `Polygon`, `MultiPoint`,
//! `MultiLineString`, `MultiPolygon`, `GeometryCollection`, or a legacy
//! coordinate pair `[lng, lat]` / `{lng, lat}`), and the S2 cells that are a
//! 2dsphere index's keys for it.
//!
//! Keys are S2 cell ids (the `s2` crate): a point's leaf cell, or for other
//! shapes a covering (at most [`INDEX_MAX_CELLS`] cells, no finer than level
//! [`INDEX_MAX_LEVEL`]) of a latitude/longitude rectangle bounding the shape.
//! A cell id is stored as an `Int64` part whose order is the cell ids'
//! unsigned order ([`cell_key`]), so the cells below a cell are one key range.
//!
//! Invariants:
//! - the cells of a shape cover every point the query predicates may say the
//!   shape holds: the bound is the union of the shape's geodesic bound
//!   (`RectBounder`, great-circle edges) and its planar longitude/latitude
//!   bounding box (the predicates of `query::geo` are planar), so a query
//!   covering that meets the shape's bound meets one of its cells;
//! - parsing never panics; every coordinate is finite, longitudes in
//!   [-180, 180], latitudes in [-90, 90] (else the error MongoDB gives);
//!   polygons are valid (closed rings, no self-intersection, holes inside):
//!   `query::geo`'s predicates rely on it.

use bson::raw::RawDocument;
use bson::{RawBson, RawBsonRef};
use geo::{
    BoundingRect, Coord, Geometry, GeometryCollection, LineString, MultiLineString, MultiPoint,
    MultiPolygon, Point, Polygon, Validation,
};
use s2::cellid::CellID;
use s2::latlng::LatLng;
use s2::rect::Rect;
use s2::rect_bounder::RectBounder;
use s2::region::{Region, RegionCoverer};

/// The earth's radius MongoDB uses for spherical distances, in meters.
pub const EARTH_RADIUS_METERS: f64 = 6_378_100.0;
/// Most cells in the key covering of one non-point shape.
pub const INDEX_MAX_CELLS: usize = 8;
/// The finest level of a non-point shape's key cells (about 1 m).
pub const INDEX_MAX_LEVEL: u8 = 23;
/// Most cells in a query region's covering.
pub const QUERY_MAX_CELLS: usize = 20;
/// Most shapes (and vertices) one geo field may hold: bounds the work and the
/// keys of one document.
pub const MAX_VERTICES: usize = 100_000;

/// The `2dsphereIndexVersion` this engine writes (MongoDB's current one).
pub const INDEX_VERSION: i32 = 3;

/// A parsed shape.
pub type Shape = Geometry<f64>;

/// The index key part of a cell: its id in an `Int64` that orders as the
/// unsigned id.
pub fn cell_key(id: u64) -> RawBson {
    RawBson::Int64((id ^ (1 << 63)) as i64)
}

fn num(v: RawBsonRef<'_>) -> Option<f64> {
    match v {
        RawBsonRef::Double(d) => Some(d),
        RawBsonRef::Int32(i) => Some(f64::from(i)),
        RawBsonRef::Int64(i) => Some(i as f64),
        RawBsonRef::Decimal128(d) => Some(crate::doc::value::decimal_to_f64(d)),
        _ => None,
    }
}

fn check_coord(lng: f64, lat: f64) -> Result<Coord<f64>, String> {
    if !lng.is_finite() || !lat.is_finite() {
        return Err("coordinates must be finite numbers".into());
    }
    if !(-180.0..=180.0).contains(&lng) || !(-90.0..=90.0).contains(&lat) {
        return Err(format!(
            "longitude/latitude is out of bounds, lng: {lng} lat: {lat}"
        ));
    }
    Ok(Coord { x: lng, y: lat })
}

/// `[lng, lat, …]` (further numbers, an altitude, are ignored, as MongoDB does).
fn position(v: RawBsonRef<'_>) -> Result<Coord<f64>, String> {
    let RawBsonRef::Array(a) = v else {
        return Err("Point must be an array".into());
    };
    let mut it = a.into_iter();
    let mut next = || -> Result<f64, String> {
        match it.next() {
            Some(Ok(v)) => num(v).ok_or_else(|| "Point must only contain numeric elements".into()),
            _ => Err("Point must contain at least two numeric elements".into()),
        }
    };
    let lng = next()?;
    let lat = next()?;
    check_coord(lng, lat)
}

fn array<'a>(v: RawBsonRef<'a>, what: &str) -> Result<Vec<RawBsonRef<'a>>, String> {
    let RawBsonRef::Array(a) = v else {
        return Err(format!("{what} must be an array"));
    };
    let mut out = Vec::new();
    for e in a {
        out.push(e.map_err(|e| e.to_string())?);
        if out.len() > MAX_VERTICES {
            return Err(format!("{what} has more than {MAX_VERTICES} elements"));
        }
    }
    Ok(out)
}

fn line(v: RawBsonRef<'_>) -> Result<LineString<f64>, String> {
    let coords = array(v, "LineString coordinates")?
        .into_iter()
        .map(position)
        .collect::<Result<Vec<_>, _>>()?;
    if coords.len() < 2 {
        return Err("GeoJSON LineString must have at least 2 vertices".into());
    }
    Ok(LineString(coords))
}

fn ring(v: RawBsonRef<'_>) -> Result<LineString<f64>, String> {
    let coords = array(v, "Polygon ring")?
        .into_iter()
        .map(position)
        .collect::<Result<Vec<_>, _>>()?;
    if coords.len() < 4 {
        return Err("Loop must have at least 3 different vertices".into());
    }
    if coords.first() != coords.last() {
        return Err("Loop is not closed, first vertex does not equal last vertex".into());
    }
    Ok(LineString(coords))
}

fn polygon(v: RawBsonRef<'_>) -> Result<Polygon<f64>, String> {
    let mut rings = array(v, "Polygon coordinates")?
        .into_iter()
        .map(ring)
        .collect::<Result<Vec<_>, _>>()?;
    if rings.is_empty() {
        return Err("Polygon has no loops".into());
    }
    let outer = rings.remove(0);
    let p = Polygon::new(outer, rings);
    // MongoDB refuses self-intersecting loops and misplaced holes too; the
    // planar predicates are only defined on valid polygons.
    p.check_validation()
        .map_err(|e| format!("Polygon is not valid: {e}"))?;
    Ok(p)
}

/// Parse a GeoJSON geometry document.
pub fn parse_geojson(d: &RawDocument) -> Result<Shape, String> {
    let ty = match d.get("type") {
        Ok(Some(RawBsonRef::String(s))) => s,
        _ => return Err("unknown GeoJSON type: missing or not a string".into()),
    };
    if ty == "GeometryCollection" {
        let geoms = match d.get("geometries") {
            Ok(Some(v)) => array(v, "GeometryCollection geometries")?,
            _ => return Err("GeometryCollection must have a geometries array".into()),
        };
        let mut out = Vec::with_capacity(geoms.len());
        for g in geoms {
            match g {
                RawBsonRef::Document(g) => out.push(parse_geojson(g)?),
                _ => return Err("GeometryCollection elements must be documents".into()),
            }
        }
        return Ok(Geometry::GeometryCollection(GeometryCollection(out)));
    }
    let coords = match d.get("coordinates") {
        Ok(Some(v)) => v,
        _ => return Err(format!("{ty} must have a coordinates field")),
    };
    Ok(match ty {
        "Point" => Geometry::Point(Point(position(coords)?)),
        "LineString" => Geometry::LineString(line(coords)?),
        "Polygon" => Geometry::Polygon(polygon(coords)?),
        "MultiPoint" => Geometry::MultiPoint(MultiPoint(
            array(coords, "MultiPoint coordinates")?
                .into_iter()
                .map(|p| position(p).map(Point))
                .collect::<Result<_, _>>()?,
        )),
        "MultiLineString" => Geometry::MultiLineString(MultiLineString(
            array(coords, "MultiLineString coordinates")?
                .into_iter()
                .map(line)
                .collect::<Result<_, _>>()?,
        )),
        "MultiPolygon" => Geometry::MultiPolygon(MultiPolygon(
            array(coords, "MultiPolygon coordinates")?
                .into_iter()
                .map(polygon)
                .collect::<Result<_, _>>()?,
        )),
        other => return Err(format!("unknown GeoJSON type: {other}")),
    })
}

/// A legacy point document `{lng: x, lat: y}`: its first two values,
/// whatever their names.
fn legacy_doc_point(d: &RawDocument) -> Result<Coord<f64>, String> {
    let mut it = d.into_iter();
    let mut next = || -> Result<f64, String> {
        match it.next() {
            Some(Ok((_, v))) => {
                num(v).ok_or_else(|| "Point must only contain numeric elements".into())
            }
            _ => Err("Point must contain at least two numeric elements".into()),
        }
    };
    let lng = next()?;
    let lat = next()?;
    check_coord(lng, lat)
}

/// One location value: a GeoJSON document (it has `type`), a legacy pair, or
/// a legacy point document.
pub fn parse_one(v: RawBsonRef<'_>) -> Result<Shape, String> {
    match v {
        RawBsonRef::Document(d) if matches!(d.get("type"), Ok(Some(_))) => parse_geojson(d),
        RawBsonRef::Document(d) => legacy_doc_point(d).map(|c| Geometry::Point(Point(c))),
        RawBsonRef::Array(_) => position(v).map(|c| Geometry::Point(Point(c))),
        _ => Err("geo field is not a GeoJSON object or a coordinate pair".into()),
    }
}

/// The shapes a reached field value holds: one location, or an array of
/// locations (an array whose first element is a number is one legacy pair).
pub fn shapes_of(v: RawBsonRef<'_>) -> Result<Vec<Shape>, String> {
    if let RawBsonRef::Array(a) = v {
        let first = a.into_iter().next();
        let is_pair = matches!(first, Some(Ok(f)) if num(f).is_some());
        if !is_pair {
            let mut out = Vec::new();
            for e in array(v, "geo field")? {
                out.push(parse_one(e)?);
            }
            return Ok(out);
        }
    }
    parse_one(v).map(|s| vec![s])
}

/// Every vertex of `s`, part by part (each part a connected chain).
fn parts(s: &Shape, out: &mut Vec<Vec<Coord<f64>>>) {
    match s {
        Geometry::Point(p) => out.push(vec![p.0]),
        Geometry::MultiPoint(m) => out.extend(m.0.iter().map(|p| vec![p.0])),
        Geometry::LineString(l) => out.push(l.0.clone()),
        Geometry::MultiLineString(m) => out.extend(m.0.iter().map(|l| l.0.clone())),
        Geometry::Polygon(p) => {
            out.push(p.exterior().0.clone());
            out.extend(p.interiors().iter().map(|r| r.0.clone()));
        }
        Geometry::MultiPolygon(m) => {
            for p in &m.0 {
                parts(&Geometry::Polygon(p.clone()), out);
            }
        }
        Geometry::GeometryCollection(c) => c.0.iter().for_each(|g| parts(g, out)),
        Geometry::Line(l) => out.push(vec![l.start, l.end]),
        Geometry::Rect(r) => out.push(r.to_polygon().exterior().0.clone()),
        Geometry::Triangle(t) => out.push(t.to_array().to_vec()),
    }
}

fn latlng(c: &Coord<f64>) -> LatLng {
    LatLng::from_degrees(c.y, c.x)
}

/// A latitude/longitude rectangle holding `s` under both readings of its
/// edges: great-circle arcs and planar longitude/latitude segments (see the
/// module invariants).
pub fn bound(s: &Shape) -> Rect {
    let mut chains = Vec::new();
    parts(s, &mut chains);
    let mut out = Rect::empty();
    for chain in &chains {
        let mut b = RectBounder::new();
        for c in chain {
            b.add_point(&s2::point::Point::from(latlng(c)));
        }
        out = out.union(&b.get_bound());
    }
    if let Some(r) = s.bounding_rect() {
        let planar = Rect::from_degrees(r.min().y, r.min().x, r.max().y, r.max().x);
        out = out.union(&planar);
    }
    // A hair of slack against rounding in the conversions.
    out.expanded(&LatLng::from_radians(1e-9, 1e-9))
        .polar_closure()
}

/// The key cells of one shape, sorted and deduplicated.
pub fn key_cells(s: &Shape) -> Vec<u64> {
    let mut out = Vec::new();
    match s {
        Geometry::Point(p) => out.push(CellID::from(latlng(&p.0)).0),
        Geometry::MultiPoint(m) => out.extend(m.0.iter().map(|p| CellID::from(latlng(&p.0)).0)),
        Geometry::GeometryCollection(c) => {
            for g in &c.0 {
                out.extend(key_cells(g));
            }
        }
        other => {
            let coverer = RegionCoverer {
                min_level: 0,
                max_level: INDEX_MAX_LEVEL,
                level_mod: 1,
                max_cells: INDEX_MAX_CELLS,
            };
            out.extend(coverer.covering(&bound(other)).0.iter().map(|c| c.0));
        }
    }
    out.sort_unstable();
    out.dedup();
    out
}

/// The key ranges (inclusive, in cell-id order, disjoint and sorted) that
/// hold every key cell meeting `region`: for each cell of its covering, the
/// cells below it (one range) and the cells above it (one id each).
pub fn covering_ranges<R: Region + 'static>(region: &R) -> Vec<(u64, u64)> {
    let coverer = RegionCoverer {
        min_level: 0,
        max_level: 30,
        level_mod: 1,
        max_cells: QUERY_MAX_CELLS,
    };
    let mut ranges = Vec::new();
    for cell in coverer.covering(region).0 {
        ranges.push((cell.range_min().0, cell.range_max().0));
        let mut c = cell;
        while c.level() > 0 {
            c = c.immediate_parent();
            ranges.push((c.0, c.0));
        }
    }
    ranges.sort_unstable();
    let mut merged: Vec<(u64, u64)> = Vec::with_capacity(ranges.len());
    for (lo, hi) in ranges {
        match merged.last_mut() {
            Some(last) if lo <= last.1.saturating_add(1) => last.1 = last.1.max(hi),
            _ => merged.push((lo, hi)),
        }
    }
    merged
}

/// The S2 point of a longitude/latitude coordinate.
pub fn s2_point(c: &Coord<f64>) -> s2::point::Point {
    s2::point::Point::from(latlng(c))
}

#[cfg(test)]
mod tests {
    use super::*;
    use bson::rawdoc;

    #[test]
    fn parses_geojson_and_legacy_pairs() {
        let d = rawdoc! {"type": "Point", "coordinates": [-73.97, 40.77]};
        assert!(matches!(parse_geojson(&d), Ok(Geometry::Point(_))));
        let d = rawdoc! {"loc": [-73.97, 40.77]};
        let v = d.get("loc").ok().flatten().expect("loc");
        assert_eq!(shapes_of(v).expect("pair").len(), 1);
        let d = rawdoc! {"type": "Point", "coordinates": [-200.0, 40.0]};
        assert!(parse_geojson(&d)
            .expect_err("invalid")
            .contains("longitude/latitude is out of bounds"));
        let d = rawdoc! {"type": "Polygon", "coordinates": [[[0, 0], [1, 0], [1, 1]]]};
        assert!(parse_geojson(&d).is_err());
        let d = rawdoc! {"type": "Polygon", "coordinates": [[[0, 0], [1, 0], [1, 1], [0, 0.5]]]};
        assert!(parse_geojson(&d)
            .expect_err("invalid")
            .contains("not closed"));
        let d = rawdoc! {"type": "Blob", "coordinates": []};
        assert!(parse_geojson(&d).is_err());
    }

    #[test]
    fn key_order_is_the_unsigned_cell_order() {
        let ids = [0u64, 1, 1 << 62, (1 << 63) - 1, 1 << 63, u64::MAX];
        for w in ids.windows(2) {
            let (RawBson::Int64(a), RawBson::Int64(b)) = (cell_key(w[0]), cell_key(w[1])) else {
                panic!("int64 keys");
            };
            assert!(a < b);
        }
    }

    #[test]
    fn a_point_key_falls_in_the_covering_of_a_cap_around_it() {
        let c = Coord { x: 2.35, y: 48.85 };
        let key = key_cells(&Geometry::Point(Point(c)))[0];
        let cap =
            s2::cap::Cap::from_center_angle(&s2_point(&c), &s2::s1::Angle::from(s2::s1::Rad(1e-6)));
        let ranges = covering_ranges(&cap);
        assert!(ranges.iter().any(|(lo, hi)| *lo <= key && key <= *hi));
    }
}

/// Random, often degenerate GeoJSON shapes for the geo fuzz tests (here and
/// in `query::geo`): poles, the antimeridian, repeated and collinear
/// vertices, zero-area rings; coordinates both anywhere and clustered, so
/// that random pairs of shapes often meet.
#[cfg(test)]
pub(crate) mod random_shapes {
    use bson::{doc, Bson, RawDocumentBuf};
    use rand::rngs::StdRng;
    use rand::Rng;

    /// Where clustered coordinates gather (longitude and latitude).
    const CLUSTER: f64 = 10.0;

    fn coord(rng: &mut StdRng) -> Bson {
        let pick = |rng: &mut StdRng, lim: f64| -> f64 {
            match rng.gen_range(0..8) {
                0 => lim,
                1 => -lim,
                2 => 0.0,
                3 => CLUSTER,
                4 | 5 => rng.gen_range(-lim..=lim),
                _ => (CLUSTER + rng.gen_range(-2.0..2.0)).clamp(-lim, lim),
            }
        };
        Bson::Array(vec![
            Bson::Double(pick(rng, 180.0)),
            Bson::Double(pick(rng, 90.0)),
        ])
    }

    /// A `Point`, `LineString`, `Polygon` or `MultiPoint` of one to six
    /// random vertices; it may well be invalid GeoJSON.
    pub(crate) fn geojson(rng: &mut StdRng) -> RawDocumentBuf {
        let n = rng.gen_range(1..6);
        let mut pts: Vec<Bson> = (0..n).map(|_| coord(rng)).collect();
        if rng.gen_bool(0.3) {
            pts.push(pts[0].clone());
        }
        let mut ring = pts.clone();
        ring.push(pts[0].clone());
        let d = match rng.gen_range(0..4) {
            0 => doc! {"type": "LineString", "coordinates": pts},
            1 => doc! {"type": "Polygon", "coordinates": [ring]},
            2 => doc! {"type": "MultiPoint", "coordinates": pts},
            _ => doc! {"type": "Point", "coordinates": pts[0].clone()},
        };
        RawDocumentBuf::try_from(&d).expect("a document of doubles converts")
    }
}

#[cfg(test)]
mod fuzz {
    use super::*;
    use rand::rngs::StdRng;
    use rand::SeedableRng;

    /// Random (often degenerate) shapes: parsing, keys and bounds never
    /// panic, whatever the coordinates (poles, antimeridian, repeats).
    #[test]
    fn degenerate_shapes_never_panic() {
        let mut rng = StdRng::seed_from_u64(17);
        for _ in 0..3000 {
            if let Ok(s) = parse_geojson(&random_shapes::geojson(&mut rng)) {
                let _ = key_cells(&s);
                let _ = covering_ranges(&bound(&s));
            }
        }
    }
}
