//! `$geoNear`: the documents nearest a point first, each with its distance
//! (`distanceField`, times `distanceMultiplier`) and optionally the location
//! it was measured to (`includeLocs`).
//!
//! The stage parses into three: a `$match` holding a `$nearSphere` on `key`
//! (with `minDistance`/`maxDistance`) and `query` — as the pipeline's first
//! stage it becomes the scan filter, so the planner answers it with the
//! 2dsphere index or refuses it (291) — then a sort by distance
//! ([`SortSpec::near`]), then [`GeoNear`], which adds the fields. Units are
//! MongoDB's: a GeoJSON `near` measures in meters, a legacy pair with
//! `spherical: true` in radians; a legacy pair without it is a flat `2d`
//! query, which needs a `2d` index (never built here).
//!
//! `key` may be omitted when the collection has exactly one 2dsphere index:
//! [`resolve_key`] (called by the API, which sees the collection) fills it in.

use bson::{Bson, Document};

use super::stages::{set_mapping_arrays, Cur};
use super::{ParseCtx, Stage};
use crate::error::{Error, Result};
use crate::query::filter::Filter;
use crate::query::geo::{bad, number, NearSort};
use crate::query::sort::SortSpec;

/// What `$geoNear` adds to each document.
#[derive(Debug, Clone)]
pub(super) struct GeoNear {
    sort: NearSort,
    distance_field: Vec<String>,
    include_locs: Option<Vec<String>>,
    multiplier: f64,
}

fn field_path(name: &str, v: &Bson) -> Result<Vec<String>> {
    match v {
        Bson::String(s) if !s.is_empty() && !s.starts_with('$') => {
            Ok(s.split('.').map(str::to_string).collect())
        }
        other => Err(bad(format!(
            "$geoNear {name} must be a non-empty field path not starting with '$', not {other}"
        ))),
    }
}

/// Parse a `$geoNear` stage into its three stages (see the module doc).
pub(super) fn parse(arg: &Bson, ctx: &ParseCtx) -> Result<Vec<Stage>> {
    let Bson::Document(spec) = arg else {
        return Err(Error::type_mismatch("$geoNear argument must be an object"));
    };
    let mut near = None;
    let mut distance_field = None;
    let mut include_locs = None;
    let mut key = None;
    let mut spherical = false;
    let mut min = None;
    let mut max = None;
    let mut query = Document::new();
    let mut multiplier = 1.0;
    for (k, v) in spec {
        match k.as_str() {
            "near" => near = Some(v.clone()),
            "distanceField" => distance_field = Some(field_path(k, v)?),
            "includeLocs" => include_locs = Some(field_path(k, v)?),
            "key" => match v {
                Bson::String(s) if !s.is_empty() => key = Some(s.clone()),
                other => {
                    return Err(bad(format!(
                        "$geoNear parameter 'key' must be a non-empty string, not {other}"
                    )))
                }
            },
            "spherical" => spherical = crate::query::expr::truthy_bson(v),
            "minDistance" | "maxDistance" => {
                let d = number(v)
                    .filter(|d| !d.is_nan())
                    .ok_or_else(|| bad(format!("{k} must be a number")))?;
                if d < 0.0 {
                    return Err(bad(format!("{k} must be nonnegative")));
                }
                if k == "minDistance" {
                    min = Some(d);
                } else {
                    max = Some(d);
                }
            }
            "query" => match v {
                Bson::Document(q) => query = q.clone(),
                other => return Err(bad(format!("query must be an object, not {other}"))),
            },
            "distanceMultiplier" => {
                multiplier = number(v)
                    .filter(|m| m.is_finite() && *m >= 0.0)
                    .ok_or_else(|| bad("distanceMultiplier must be a non-negative number"))?;
            }
            // Legacy options MongoDB accepts and ignores (or no longer has).
            "uniqueDocs" => {}
            other => return Err(bad(format!("unknown argument to $geoNear: {other}"))),
        }
    }
    let near = near.ok_or_else(|| bad("$geoNear requires a 'near' option as an Array"))?;
    let distance_field =
        distance_field.ok_or_else(|| bad("$geoNear requires a 'distanceField' option"))?;
    let key = key.ok_or_else(|| {
        bad("$geoNear needs a 'key' here: the collection's 2dsphere index is not known")
    })?;
    let geojson = matches!(&near, Bson::Document(d) if d.contains_key("type"));
    let mut op = Document::new();
    let which = if geojson || spherical {
        "$nearSphere"
    } else {
        "$near"
    };
    if geojson {
        op.insert(which, bson::doc! {"$geometry": near});
    } else {
        op.insert(which, near);
    }
    if let Some(m) = min {
        op.insert("$minDistance", m);
    }
    if let Some(m) = max {
        op.insert("$maxDistance", m);
    }
    let mut near_filter = Document::new();
    near_filter.insert(key.clone(), op);
    let filter_doc = if query.is_empty() {
        near_filter
    } else {
        bson::doc! {"$and": [near_filter, query]}
    };
    let filter = ctx.filter(&filter_doc)?;
    let sort = filter
        .near()
        .ok_or_else(|| Error::Internal("$geoNear's filter lost its $near".into()))?;
    let spec = Filter::bind_let(&filter_doc, ctx.let_doc().as_ref())?;
    Ok(vec![
        Stage::Match { spec, filter },
        Stage::Sort(SortSpec::near(sort.clone())),
        Stage::GeoNear(Box::new(GeoNear {
            sort,
            distance_field,
            include_locs,
            multiplier,
        })),
    ])
}

impl GeoNear {
    /// The document with its distance (and location) added.
    pub(super) fn apply(&self, cur: Cur<'_>) -> Result<Document> {
        let nearest = match &cur {
            Cur::Raw(r) => self.sort.nearest(r),
            Cur::Owned(d) => {
                let raw = bson::RawDocumentBuf::try_from(d)
                    .map_err(|e| Error::InvalidBson(e.to_string()))?;
                self.sort.nearest(&raw)
            }
        };
        let mut doc = cur.into_document()?;
        if let Some((d, loc)) = nearest {
            set_mapping_arrays(
                &mut doc,
                &self.distance_field,
                Some(Bson::Double(d * self.multiplier)),
            );
            if let Some(path) = &self.include_locs {
                set_mapping_arrays(&mut doc, path, Some(loc));
            }
        }
        Ok(doc)
    }
}

/// `pipeline` with its `$geoNear`s' `key` filled in from the collection's
/// 2dsphere fields (`geo_paths`) where they have none: exactly one must
/// exist (else 27 IndexNotFound, as MongoDB). Only a first stage is looked
/// at: a misplaced `$geoNear` gets its own error (40603) when the pipeline
/// parses, whether or not the collection has a geo index.
pub fn resolve_key(pipeline: &mut [Document], geo_paths: &[String]) -> Result<()> {
    // Only a first stage runs: a `$geoNear` elsewhere is refused when the
    // pipeline parses (40602), before any index is looked for.
    if let Some(stage) = pipeline.first_mut() {
        let Some(Bson::Document(spec)) = stage.get_mut("$geoNear") else {
            return Ok(());
        };
        if spec.contains_key("key") {
            return Ok(());
        }
        match geo_paths {
            [one] => {
                spec.insert("key", one.clone());
            }
            [] => {
                return Err(Error::IndexNotFound(
                    "$geoNear requires a 2d or 2dsphere index, but none were found".into(),
                ))
            }
            _ => {
                return Err(Error::IndexNotFound(
                    "There is more than one 2dsphere index; unsure which to use for $geoNear"
                        .into(),
                ))
            }
        }
    }
    Ok(())
}
