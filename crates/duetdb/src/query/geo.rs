//! Geospatial query operators: `$geoWithin` (`$geometry` Polygon or
//! MultiPolygon, `$centerSphere`, and the legacy planar `$box`, `$center`,
//! `$polygon`), `$geoIntersects` (`$geometry`), `$near` / `$nearSphere`
//! (a GeoJSON point with `$minDistance`/`$maxDistance` in meters, or for
//! `$nearSphere` a legacy pair with distances in radians): parsing with
//! MongoDB's errors, the exact predicate on a document's shapes, distances,
//! and the index region a query needs ([`GeoQuery::ranges`]).
//!
//! Geometry: predicates between shapes are the `geo` crate's, planar in
//! longitude/latitude (MongoDB's are on the sphere: the two agree except for
//! edges long enough to bend away from their planar chord, and polygons
//! spanning the antimeridian or a pole); distances are haversine on
//! MongoDB's earth radius ([`EARTH_RADIUS_METERS`]); `$centerSphere` is a
//! spherical cap.
//!
//! Invariant: [`GeoQuery::ranges`] holds the key cells of every shape the
//! predicate can match (`store::geo`'s covering rule), so an index scan over
//! them followed by [`GeoQuery::matches`] equals a collection scan.

use std::sync::Arc;

use bson::{Bson, Document, RawBsonRef};
use geo::{
    Coord, CoordsIter, Distance, Geometry, HaversineClosestPoint, HaversineMeasure, Intersects,
    Point, Polygon, Relate,
};
use s2::cap::Cap;
use s2::s1::{Angle, Rad};

use crate::error::{Error, Result};
use crate::store::geo::{
    bound, covering_ranges, parse_geojson, s2_point, shapes_of, Shape, EARTH_RADIUS_METERS,
};

/// A parsed geo operator.
#[derive(Debug, Clone)]
pub enum GeoQuery {
    Within(Within),
    Intersects(Shape),
    Near(Near),
}

/// A `$geoWithin` region.
#[derive(Debug, Clone)]
pub enum Within {
    /// `$geometry`: a Polygon or MultiPolygon (boundary included).
    Shape(Shape),
    /// `$centerSphere: [[lng, lat], radians]`.
    CenterSphere { center: Coord<f64>, radians: f64 },
    /// `$box: [[x1, y1], [x2, y2]]` (planar).
    Box { lo: Coord<f64>, hi: Coord<f64> },
    /// `$center: [[x, y], r]` (planar).
    Center { center: Coord<f64>, r: f64 },
    /// `$polygon: [[x, y], …]` (planar).
    Polygon(Polygon<f64>),
}

/// `$near` / `$nearSphere`.
#[derive(Debug, Clone)]
pub struct Near {
    pub point: Coord<f64>,
    pub min: Option<f64>,
    pub max: Option<f64>,
    /// Distances in radians (legacy `$nearSphere: [x, y]`), else meters.
    pub radians: bool,
    /// `$near` with a legacy pair: a flat 2d query, which needs a `2d`
    /// index (never built here), so it cannot run.
    pub planar: bool,
}

pub(crate) fn bad(msg: impl Into<String>) -> Error {
    Error::bad_value(msg)
}

/// A BSON number as a double (`None` for anything else).
pub(crate) fn number(v: &Bson) -> Option<f64> {
    match v {
        Bson::Double(d) => Some(*d),
        Bson::Int32(i) => Some(f64::from(*i)),
        Bson::Int64(i) => Some(*i as f64),
        Bson::Decimal128(d) => Some(crate::doc::value::decimal_to_f64(*d)),
        _ => None,
    }
}

/// `[x, y]` (or `{x, y}`) of finite numbers, unchecked range (legacy shapes).
fn pair(v: &Bson) -> Option<Coord<f64>> {
    let nums: Vec<f64> = match v {
        Bson::Array(a) => a.iter().take(2).map(number).collect::<Option<_>>()?,
        Bson::Document(d) => d.values().take(2).map(number).collect::<Option<_>>()?,
        _ => return None,
    };
    match nums.as_slice() {
        [x, y] if x.is_finite() && y.is_finite() => Some(Coord { x: *x, y: *y }),
        _ => None,
    }
}

fn geometry(v: &Bson) -> Result<Shape> {
    let Bson::Document(d) = v else {
        return Err(bad(format!("$geometry must be an object, not {v}")));
    };
    if d.contains_key("crs") {
        return Err(bad(
            "a $geometry with a crs (big polygons) is not supported by duetdb",
        ));
    }
    let raw = bson::RawDocumentBuf::try_from(d).map_err(|e| bad(e.to_string()))?;
    parse_geojson(&raw).map_err(|e| bad(format!("Can't parse $geometry: {e}")))
}

impl GeoQuery {
    /// Parse `$geoWithin`'s / `$within`'s argument.
    pub fn within(arg: &Bson) -> Result<GeoQuery> {
        let Bson::Document(d) = arg else {
            return Err(bad("$geoWithin must be an object"));
        };
        let Some((k, v)) = d.iter().next().filter(|_| d.len() == 1) else {
            return Err(bad(format!("$geoWithin needs exactly one shape: {d}")));
        };
        let region = match k.as_str() {
            "$geometry" => match geometry(v)? {
                s @ (Geometry::Polygon(_) | Geometry::MultiPolygon(_)) => Within::Shape(s),
                _ => {
                    return Err(bad(format!(
                        "$geoWithin not supported with provided geometry: {d}"
                    )))
                }
            },
            "$centerSphere" | "$center" => {
                let parts = match v {
                    Bson::Array(a) if a.len() == 2 => a,
                    _ => return Err(bad(format!("malformed {k}: {v}"))),
                };
                let center = pair(&parts[0]).ok_or_else(|| bad(format!("malformed {k}: {v}")))?;
                let r = number(&parts[1])
                    .filter(|r| r.is_finite() && *r >= 0.0)
                    .ok_or_else(|| bad(format!("{k} radius must be a non-negative number")))?;
                if k == "$center" {
                    Within::Center { center, r }
                } else {
                    if !(-180.0..=180.0).contains(&center.x) || !(-90.0..=90.0).contains(&center.y)
                    {
                        return Err(bad(format!(
                            "longitude/latitude is out of bounds, lng: {} lat: {}",
                            center.x, center.y
                        )));
                    }
                    Within::CenterSphere { center, radians: r }
                }
            }
            "$box" => match v {
                Bson::Array(a) if a.len() == 2 => {
                    let (Some(p), Some(q)) = (pair(&a[0]), pair(&a[1])) else {
                        return Err(bad(format!("malformed $box: {v}")));
                    };
                    Within::Box {
                        lo: Coord {
                            x: p.x.min(q.x),
                            y: p.y.min(q.y),
                        },
                        hi: Coord {
                            x: p.x.max(q.x),
                            y: p.y.max(q.y),
                        },
                    }
                }
                _ => return Err(bad(format!("malformed $box: {v}"))),
            },
            "$polygon" => {
                let Bson::Array(a) = v else {
                    return Err(bad(format!("malformed $polygon: {v}")));
                };
                let mut pts = a
                    .iter()
                    .map(pair)
                    .collect::<Option<Vec<_>>>()
                    .ok_or_else(|| bad(format!("malformed $polygon: {v}")))?;
                if pts.len() < 3 {
                    return Err(bad("Polygon must have at least 3 points"));
                }
                if pts.first() != pts.last() {
                    pts.push(pts[0]);
                }
                Within::Polygon(Polygon::new(geo::LineString(pts), vec![]))
            }
            other => return Err(bad(format!("unknown $geoWithin shape: {other}"))),
        };
        Ok(GeoQuery::Within(region))
    }

    /// Parse `$geoIntersects`' argument.
    pub fn intersects(arg: &Bson) -> Result<GeoQuery> {
        match arg {
            Bson::Document(d) if d.len() == 1 && d.contains_key("$geometry") => {
                let g = d
                    .get("$geometry")
                    .ok_or_else(|| bad("$geoIntersects needs $geometry"))?;
                Ok(GeoQuery::Intersects(geometry(g)?))
            }
            _ => Err(bad(format!(
                "$geoIntersects needs exactly {{$geometry: …}}, not {arg}"
            ))),
        }
    }

    /// Parse a `$near`/`$nearSphere` operator document (`op` is which one),
    /// with its `$minDistance`/`$maxDistance` inside the `$near` document or
    /// beside it.
    pub fn near(op: &str, ops: &Document) -> Result<GeoQuery> {
        let arg = ops.get(op).ok_or_else(|| bad(format!("{op} missing")))?;
        let mut min = None;
        let mut max = None;
        let dist = |k: &str, v: &Bson| -> Result<f64> {
            number(v)
                .filter(|d| !d.is_nan())
                .ok_or_else(|| bad(format!("{k} must be a number")))
                .and_then(|d| {
                    if d < 0.0 {
                        Err(bad(format!("{k} must be non-negative")))
                    } else {
                        Ok(d)
                    }
                })
        };
        for (k, v) in ops {
            match k.as_str() {
                "$minDistance" => min = Some(dist(k, v)?),
                "$maxDistance" => max = Some(dist(k, v)?),
                k if k == op => {}
                other => return Err(bad(format!("invalid argument in geo near query: {other}"))),
            }
        }
        let (point, radians, planar) = match arg {
            Bson::Document(d) if d.contains_key("$geometry") => {
                for (k, v) in d {
                    match k.as_str() {
                        "$geometry" => {}
                        "$minDistance" => min = Some(dist(k, v)?),
                        "$maxDistance" => max = Some(dist(k, v)?),
                        other => {
                            return Err(bad(format!("invalid argument in geo near query: {other}")))
                        }
                    }
                }
                let g = d.get("$geometry").ok_or_else(|| bad("$geometry missing"))?;
                match geometry(g)? {
                    Geometry::Point(p) => (p.0, false, false),
                    _ => {
                        return Err(bad(
                            "invalid point in geo near query $geometry argument: must be a Point",
                        ))
                    }
                }
            }
            other => {
                let p = pair(other)
                    .ok_or_else(|| bad(format!("invalid point in geo near query: {other}")))?;
                (p, true, op == "$near")
            }
        };
        if !planar && (!(-180.0..=180.0).contains(&point.x) || !(-90.0..=90.0).contains(&point.y)) {
            return Err(bad(format!(
                "longitude/latitude is out of bounds, lng: {} lat: {}",
                point.x, point.y
            )));
        }
        Ok(GeoQuery::Near(Near {
            point,
            min,
            max,
            radians,
            planar,
        }))
    }

    /// Does one reached field value (a location or an array of them) match?
    /// Values that are not shapes never match.
    pub fn matches_value(&self, v: RawBsonRef<'_>) -> bool {
        let Ok(shapes) = shapes_of(v) else {
            return false;
        };
        shapes.iter().any(|s| self.matches(s))
    }

    /// The exact predicate on one shape. The `geo` crate's relate may still
    /// panic on inputs it finds degenerate (rounding near a vertex): such a
    /// pair does not match, and the query goes on.
    pub fn matches(&self, s: &Shape) -> bool {
        std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| self.matches_inner(s)))
            .unwrap_or(false)
    }

    fn matches_inner(&self, s: &Shape) -> bool {
        match self {
            GeoQuery::Within(w) => w.contains(s),
            GeoQuery::Intersects(q) => q.intersects(s),
            GeoQuery::Near(n) => {
                let d = n.distance(s);
                n.min.is_none_or(|m| d >= m) && n.max.is_none_or(|m| d <= m)
            }
        }
    }

    /// Key ranges of a 2dsphere field holding every match (see the module
    /// invariant); `None` when the query cannot use such an index (legacy
    /// planar shapes) or must scan all of it (`$near` without a maximum).
    pub fn ranges(&self) -> Option<Vec<(u64, u64)>> {
        // A hair more than the radius, against rounding in the conversions.
        let cap = |c: &Coord<f64>, radians: f64| {
            Cap::from_center_angle(
                &s2_point(c),
                &Angle::from(Rad(radians * (1.0 + 1e-9) + 1e-12)),
            )
        };
        match self {
            GeoQuery::Within(Within::Shape(s)) | GeoQuery::Intersects(s) => {
                Some(covering_ranges(&bound(s)))
            }
            GeoQuery::Within(Within::CenterSphere { center, radians }) => {
                Some(covering_ranges(&cap(center, *radians)))
            }
            GeoQuery::Within(_) => None,
            GeoQuery::Near(n) if n.planar => None,
            GeoQuery::Near(n) => {
                let max = n.max?;
                let radians = if n.radians {
                    max
                } else {
                    max / EARTH_RADIUS_METERS
                };
                if radians >= std::f64::consts::PI {
                    return None;
                }
                Some(covering_ranges(&cap(&n.point, radians)))
            }
        }
    }

    pub fn as_near(&self) -> Option<&Near> {
        match self {
            GeoQuery::Near(n) => Some(n),
            _ => None,
        }
    }
}

impl Within {
    fn contains(&self, s: &Shape) -> bool {
        match self {
            Within::Shape(q) => q.relate(s).is_covers(),
            Within::Polygon(p) => p.relate(s).is_covers(),
            Within::CenterSphere { center, radians } => {
                let unit = HaversineMeasure::new(1.0);
                s.coords_iter()
                    .all(|c| unit.distance(Point(*center), Point(c)) <= *radians)
            }
            Within::Box { lo, hi } => s
                .coords_iter()
                .all(|c| c.x >= lo.x && c.x <= hi.x && c.y >= lo.y && c.y <= hi.y),
            Within::Center { center, r } => s.coords_iter().all(|c| {
                let (dx, dy) = (c.x - center.x, c.y - center.y);
                (dx * dx + dy * dy).sqrt() <= *r
            }),
        }
    }
}

impl Near {
    /// Distance from the query point to the nearest point of `s`, in the
    /// query's unit (meters, or radians for a legacy `$nearSphere`): 0 when
    /// `s` holds the point.
    pub fn distance(&self, s: &Shape) -> f64 {
        // As `GeoQuery::matches`: a shape the `geo` crate chokes on is
        // infinitely far (it never matches a `$near`).
        std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| self.distance_inner(s)))
            .unwrap_or(f64::INFINITY)
    }

    fn distance_inner(&self, s: &Shape) -> f64 {
        let meters = HaversineMeasure::new(EARTH_RADIUS_METERS);
        let p = Point(self.point);
        let d = match s {
            Geometry::Point(q) => meters.distance(p, *q),
            other if other.intersects(&p) => 0.0,
            other => match other.haversine_closest_point(&p) {
                geo::Closest::Intersection(_) => 0.0,
                geo::Closest::SinglePoint(q) => meters.distance(p, q),
                // Several nearest points: any vertex bound is the nearest of them.
                geo::Closest::Indeterminate => other
                    .coords_iter()
                    .map(|c| meters.distance(p, Point(c)))
                    .fold(f64::INFINITY, f64::min),
            },
        };
        if self.radians {
            d / EARTH_RADIUS_METERS
        } else {
            d
        }
    }

    /// The distance of the nearest shape of a reached value (infinite for
    /// none).
    pub fn distance_of_value(&self, v: RawBsonRef<'_>) -> Option<(f64, usize)> {
        let shapes = shapes_of(v).ok()?;
        shapes
            .iter()
            .enumerate()
            .map(|(i, s)| (self.distance(s), i))
            .min_by(|a, b| a.0.total_cmp(&b.0))
    }
}

/// A `$near` sort: documents ordered by their distance at `path`.
#[derive(Debug, Clone)]
pub struct NearSort {
    pub path: String,
    pub near: Arc<GeoQuery>,
}

impl NearSort {
    /// The least distance of the shapes `doc` holds at the path (infinite
    /// when none).
    pub fn distance(&self, doc: &bson::RawDocument) -> f64 {
        let Some(n) = self.near.as_near() else {
            return f64::INFINITY;
        };
        crate::doc::path::values(doc, &self.path)
            .into_iter()
            .filter_map(|v| n.distance_of_value(v).map(|(d, _)| d))
            .fold(f64::INFINITY, f64::min)
    }

    /// The nearest location value `doc` holds at the path, with its distance
    /// (`$geoNear`'s `includeLocs`).
    pub fn nearest(&self, doc: &bson::RawDocument) -> Option<(f64, Bson)> {
        let n = self.near.as_near()?;
        let mut best: Option<(f64, Bson)> = None;
        for v in crate::doc::path::values(doc, &self.path) {
            let Some((d, i)) = n.distance_of_value(v) else {
                continue;
            };
            if best.as_ref().is_some_and(|(b, _)| *b <= d) {
                continue;
            }
            // An array of locations: the element that was nearest.
            let loc = match v {
                RawBsonRef::Array(a)
                    if shapes_of(v).map(|s| s.len()).unwrap_or(0) > 1 || !is_pair(v) =>
                {
                    a.into_iter().flatten().nth(i).unwrap_or(v)
                }
                _ => v,
            };
            let loc = Bson::try_from(bson::RawBson::from(loc)).unwrap_or(Bson::Null);
            best = Some((d, loc));
        }
        best
    }
}

fn is_pair(v: RawBsonRef<'_>) -> bool {
    match v {
        RawBsonRef::Array(a) => matches!(
            a.into_iter().next(),
            Some(Ok(RawBsonRef::Double(_)
                | RawBsonRef::Int32(_)
                | RawBsonRef::Int64(_)
                | RawBsonRef::Decimal128(_)))
        ),
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::geo::random_shapes;
    use rand::rngs::StdRng;
    use rand::SeedableRng;

    fn shape(rng: &mut StdRng) -> Option<Shape> {
        parse_geojson(&random_shapes::geojson(rng)).ok()
    }

    /// The predicates and distances on random degenerate shapes (repeated
    /// and collinear vertices, zero-area rings, poles) never panic.
    #[test]
    fn predicates_on_degenerate_shapes_never_panic() {
        let mut rng = StdRng::seed_from_u64(5);
        for _ in 0..3000 {
            let (Some(a), Some(b)) = (shape(&mut rng), shape(&mut rng)) else {
                continue;
            };
            let Geometry::Point(p) =
                shape(&mut rng).unwrap_or(Geometry::Point(Point::new(0.0, 0.0)))
            else {
                continue;
            };
            let near = Near {
                point: p.0,
                min: None,
                max: None,
                radians: false,
                planar: false,
            };
            let _ = near.distance(&a);
            let _ = GeoQuery::Intersects(a.clone()).matches(&b);
            if matches!(a, Geometry::Polygon(_)) {
                let _ = GeoQuery::Within(Within::Shape(a.clone())).matches(&b);
                let _ = GeoQuery::Within(Within::Shape(a)).ranges();
            }
        }
    }
}
