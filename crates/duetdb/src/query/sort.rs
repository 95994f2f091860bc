//! Sort specifications (`{a: 1, "b.c": -1}`) and MongoDB's document order under them.
//!
//! Owns: parsing a sort document, computing a document's sort key, and comparing
//! documents / keys. Also used by `$push … $sort` with a pattern.
//!
//! Invariants:
//! - Values are compared only through [`crate::doc::value::compare`] (under a
//!   collation: the collator's order, and sort keys hold collation keys), so
//!   a sort agrees with filters and index order of the same collation.
//! - The key of one sort component is chosen among every value the path reaches
//!   (arrays stand for their elements, as in MongoDB's multikey sort): ascending
//!   takes the smallest, descending the largest. A missing field counts as `null`
//!   (also a document inside a traversed array that lacks the field); an empty
//!   array counts as `undefined`, i.e. it sorts before `null` and missing, which
//!   is what MongoDB documents ("an empty array is less than null or missing").
//! - `compare(a, b) == compare_keys(&sort_key(a), &sort_key(b))`, and both are
//!   total orders (lexicographic over a total order per component).
//! - Never panics on any input.

use std::cmp::Ordering;
use std::sync::Arc;

use crate::doc::collation::{compare_with, Collator};

use bson::raw::{RawArray, RawDocument};
use bson::{Bson, Document, RawBson, RawBsonRef};

use crate::doc::path::{self, numeric_component};
use crate::doc::value;
use crate::error::{Error, Result};

/// A parsed sort specification: `(path, ascending)` in priority order.
#[derive(Debug, Clone)]
pub struct SortSpec {
    pub keys: Vec<(String, bool)>,
    /// A `$near` order ([`SortSpec::near`]): the one key is the distance
    /// of the path's nearest shape, ascending; never a plan's index order.
    pub near: Option<crate::query::geo::NearSort>,
    /// The collation strings sort by (`None`: simple, binary); its sort keys
    /// hold collation keys, so they compare with the plain order.
    pub collator: Option<Arc<Collator>>,
}

/// A document's precomputed sort key: one owned value per sort component, already
/// chosen (min for ascending, max for descending). Compute it once per document
/// and compare with [`SortSpec::compare_keys`] to avoid re-walking paths.
#[derive(Debug, Clone, PartialEq)]
pub struct SortKey(pub Vec<RawBson>);

impl SortSpec {
    /// Parse `{a: 1, b: -1}`. Directions must be numbers equal to 1 or -1; `$meta`
    /// sorts are not supported; `{}` means "no sort" (every pair compares equal).
    pub fn parse(spec: &Document) -> Result<SortSpec> {
        SortSpec::parse_in(spec, false)
    }

    /// [`SortSpec::parse`] for a pipeline's `$sort`: `{k: {$meta:
    /// "textScore"}}` orders by the hidden score a `$text` first stage gives
    /// (`query::text::TEXT_SCORE_FIELD`), highest first.
    pub fn parse_in_pipeline(spec: &Document) -> Result<SortSpec> {
        SortSpec::parse_in(spec, true)
    }

    fn parse_in(spec: &Document, text_score: bool) -> Result<SortSpec> {
        let mut keys = Vec::with_capacity(spec.len());
        for (k, v) in spec {
            if text_score {
                if let Bson::Document(d) = v {
                    if d.len() == 1
                        && matches!(d.get("$meta"), Some(Bson::String(m)) if m == "textScore")
                    {
                        keys.push((crate::query::text::TEXT_SCORE_FIELD.to_string(), false));
                        continue;
                    }
                }
            }
            path::validate(k).map_err(|e| Error::bad_value(format!("invalid sort path: {e}")))?;
            if k.split('.').any(|p| p.starts_with('$')) {
                return Err(Error::bad_value(format!(
                    "FieldPath field names may not start with '$': '{k}'"
                )));
            }
            let asc = match v {
                Bson::Document(d) if d.contains_key("$meta") => {
                    return Err(Error::bad_value(format!(
                        "$meta sort on '{k}' is not supported"
                    )));
                }
                Bson::Int32(1) | Bson::Int64(1) => true,
                Bson::Int32(-1) | Bson::Int64(-1) => false,
                Bson::Double(f) if *f == 1.0 => true,
                Bson::Double(f) if *f == -1.0 => false,
                Bson::Decimal128(d) => {
                    let f = value::decimal_to_f64(*d);
                    if f == 1.0 {
                        true
                    } else if f == -1.0 {
                        false
                    } else {
                        return Err(bad_direction(k));
                    }
                }
                Bson::Int32(_) | Bson::Int64(_) | Bson::Double(_) => return Err(bad_direction(k)),
                other => {
                    return Err(Error::Coded {
                        code: 15974,
                        name: "Location15974",
                        msg: format!("Illegal key in $sort specification: {k}: {other}"),
                    })
                }
            };
            keys.push((k.clone(), asc));
        }
        Ok(SortSpec {
            keys,
            near: None,
            collator: None,
        })
    }

    /// The order a `$near`/`$nearSphere` gives: nearest first.
    pub fn near(near: crate::query::geo::NearSort) -> SortSpec {
        SortSpec {
            keys: vec![(near.path.clone(), true)],
            near: Some(near),
            collator: None,
        }
    }

    /// This sort ordering strings under `c` (MongoDB's `collation` option).
    pub fn with_collation(mut self, c: Option<Arc<Collator>>) -> SortSpec {
        self.collator = c;
        self
    }

    /// A spec without components: no ordering is imposed.
    pub fn is_empty(&self) -> bool {
        self.keys.is_empty()
    }

    #[cfg(test)]
    /// Compare two documents under this sort.
    pub fn compare(&self, a: &RawDocument, b: &RawDocument) -> Ordering {
        if self.near.is_some() || self.collator.is_some() {
            return self.compare_keys(&self.sort_key(a), &self.sort_key(b));
        }
        for (path, asc) in &self.keys {
            let ka = component_key(a, path, *asc, None);
            let kb = component_key(b, path, *asc, None);
            let ord = directed(value::compare(ka.as_ref(), kb.as_ref()), *asc);
            if ord != Ordering::Equal {
                return ord;
            }
        }
        Ordering::Equal
    }

    /// The owned sort key of `doc` (see [`SortKey`]).
    pub fn sort_key(&self, doc: &RawDocument) -> SortKey {
        if let Some(n) = &self.near {
            return SortKey(vec![RawBson::Double(n.distance(doc))]);
        }
        SortKey(
            self.keys
                .iter()
                .map(|(path, asc)| {
                    let chosen = component_key(doc, path, *asc, self.collator.as_deref());
                    match &self.collator {
                        Some(c) => c.key_raw(chosen.as_ref()),
                        None => chosen.to_owned_raw(),
                    }
                })
                .collect(),
        )
    }

    /// Compare two keys produced by [`SortSpec::sort_key`] of this spec.
    pub fn compare_keys(&self, a: &SortKey, b: &SortKey) -> Ordering {
        for (i, (_, asc)) in self.keys.iter().enumerate() {
            let (Some(x), Some(y)) = (a.0.get(i), b.0.get(i)) else {
                // Keys of another spec: order by length so the result stays total.
                return a.0.len().cmp(&b.0.len());
            };
            let ord = directed(
                value::compare(x.as_raw_bson_ref(), y.as_raw_bson_ref()),
                *asc,
            );
            if ord != Ordering::Equal {
                return ord;
            }
        }
        Ordering::Equal
    }
}

/// MongoDB's 15975 (sort_pattern.cpp), which does not name the key.
fn bad_direction(_k: &str) -> Error {
    Error::Coded {
        code: 15975,
        name: "Location15975",
        msg: "$sort key ordering must be 1 (for ascending) or -1 (for descending)".into(),
    }
}

fn directed(ord: Ordering, asc: bool) -> Ordering {
    if asc {
        ord
    } else {
        ord.reverse()
    }
}

/// The chosen value of one component, borrowed from `doc` where possible.
enum Chosen<'a> {
    Value(RawBsonRef<'a>),
    Null,
    Undefined,
}

impl Chosen<'_> {
    fn as_ref(&self) -> RawBsonRef<'_> {
        match self {
            Chosen::Value(v) => *v,
            Chosen::Null => RawBsonRef::Null,
            Chosen::Undefined => RawBsonRef::Undefined,
        }
    }

    fn to_owned_raw(&self) -> RawBson {
        match self {
            Chosen::Value(v) => RawBson::from(*v),
            Chosen::Null => RawBson::Null,
            Chosen::Undefined => RawBson::Undefined,
        }
    }
}

/// Collects the candidate values of one path: reached values (arrays expanded one
/// level), plus whether some branch was missing and whether an empty array was reached.
#[derive(Default)]
struct Candidates<'a> {
    values: Vec<RawBsonRef<'a>>,
    missing: bool,
    empty_array: bool,
}

fn component_key<'a>(
    doc: &'a RawDocument,
    path: &str,
    asc: bool,
    coll: Option<&Collator>,
) -> Chosen<'a> {
    let parts: Vec<&str> = path.split('.').collect();
    let mut c = Candidates::default();
    walk_doc(doc, &parts, &mut c);
    let mut best: Option<Chosen<'a>> = None;
    let mut consider = |cand: Chosen<'a>| {
        let better = match &best {
            None => true,
            Some(b) => {
                let ord = compare_with(coll, cand.as_ref(), b.as_ref());
                if asc {
                    ord == Ordering::Less
                } else {
                    ord == Ordering::Greater
                }
            }
        };
        if better {
            best = Some(cand);
        }
    };
    for v in c.values {
        consider(Chosen::Value(v));
    }
    if c.missing {
        consider(Chosen::Null);
    }
    if c.empty_array {
        consider(Chosen::Undefined);
    }
    best.unwrap_or(Chosen::Null)
}

fn walk_doc<'a>(doc: &'a RawDocument, parts: &[&str], c: &mut Candidates<'a>) {
    let Some((first, rest)) = parts.split_first() else {
        return;
    };
    match crate::doc::rawfield::field(doc, first) {
        Some(v) => walk_value(v, rest, c),
        None => c.missing = true,
    }
}

fn walk_value<'a>(v: RawBsonRef<'a>, rest: &[&str], c: &mut Candidates<'a>) {
    if rest.is_empty() {
        match v {
            RawBsonRef::Array(a) => push_elements(a, c),
            other => c.values.push(other),
        }
        return;
    }
    match v {
        RawBsonRef::Document(d) => walk_doc(d, rest, c),
        RawBsonRef::Array(a) => walk_array(a, rest, c),
        // A scalar where the path continues: the field is missing.
        _ => c.missing = true,
    }
}

fn push_elements<'a>(a: &'a RawArray, c: &mut Candidates<'a>) {
    let before = c.values.len();
    c.values.extend(a.into_iter().flatten());
    if c.values.len() == before {
        c.empty_array = true;
    }
}

fn walk_array<'a>(a: &'a RawArray, rest: &[&str], c: &mut Candidates<'a>) {
    let (first, tail) = (rest[0], &rest[1..]);
    if let Some(idx) = numeric_component(first) {
        if let Ok(Some(elem)) = a.get(idx) {
            // A positional component selects that element; documents that happen
            // to have a field named like the index are also reached, but their
            // absence in other elements is not a "missing" branch.
            walk_value(elem, tail, c);
            for elem in a.into_iter().flatten() {
                if let RawBsonRef::Document(d) = elem {
                    if let Some(v) = crate::doc::rawfield::field(d, first) {
                        walk_value(v, tail, c);
                    }
                }
            }
            return;
        }
    }
    let mut any = false;
    for elem in a.into_iter().flatten() {
        // Only documents are traversed; nested arrays and scalars are not (as in MongoDB).
        if let RawBsonRef::Document(d) = elem {
            any = true;
            walk_doc(d, rest, c);
        }
    }
    if !any {
        c.missing = true;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bson::{doc, rawdoc, RawDocumentBuf};
    use proptest::prelude::*;

    fn spec(d: Document) -> SortSpec {
        SortSpec::parse(&d).expect("valid sort")
    }

    fn order(s: &SortSpec, docs: &[RawDocumentBuf]) -> Vec<usize> {
        let mut idx: Vec<usize> = (0..docs.len()).collect();
        idx.sort_by(|&i, &j| s.compare(&docs[i], &docs[j]).then(i.cmp(&j)));
        idx
    }

    #[test]
    fn parse_directions() {
        assert_eq!(spec(doc! {"a": 1, "b": -1}).keys.len(), 2);
        assert!(!spec(doc! {"a": -1.0}).keys[0].1);
        assert!(spec(doc! {"a": 1i64}).keys[0].1);
        assert!(spec(doc! {}).is_empty());
        for bad in [
            doc! {"a": 2},
            doc! {"a": 0},
            doc! {"a": "asc"},
            doc! {"a": true},
            doc! {"a": 0.5},
            doc! {"a": {"$meta": "textScore"}},
            doc! {"": 1},
            doc! {"a..b": 1},
            doc! {"$a": 1},
        ] {
            let e = SortSpec::parse(&bad).expect_err("must reject");
            // MongoDB's codes: a number other than ±1 is 15975, another
            // type 15974, a bad key 2.
            let key_ok = bad
                .keys()
                .all(|k| !k.is_empty() && !k.starts_with('$') && !k.contains(".."));
            let want = match bad.values().next() {
                Some(Bson::Int32(_) | Bson::Double(_)) if key_ok => 15975,
                Some(Bson::String(_) | Bson::Boolean(_)) if key_ok => 15974,
                _ => 2,
            };
            assert_eq!(e.code(), want, "{bad:?}");
        }
    }

    #[test]
    fn mixed_types_follow_canonical_order() {
        let docs = vec![
            rawdoc! {"a": "x"},
            rawdoc! {"a": 3},
            rawdoc! {"a": null},
            rawdoc! {},
            rawdoc! {"a": 1.5},
            rawdoc! {"a": {"z": 1}},
            rawdoc! {"a": true},
        ];
        let s = spec(doc! {"a": 1});
        assert_eq!(order(&s, &docs), vec![2, 3, 4, 1, 0, 5, 6]);
        let s = spec(doc! {"a": -1});
        assert_eq!(order(&s, &docs), vec![6, 5, 0, 1, 4, 2, 3]);
    }

    #[test]
    fn arrays_use_min_ascending_and_max_descending() {
        let docs = vec![
            rawdoc! {"a": [5, 1]},
            rawdoc! {"a": 3},
            rawdoc! {"a": [2, 4]},
            rawdoc! {"a": []},
            rawdoc! {"a": null},
        ];
        // asc keys: 1, 3, 2, undefined, null
        assert_eq!(order(&spec(doc! {"a": 1}), &docs), vec![3, 4, 0, 2, 1]);
        // desc keys: 5, 3, 4, undefined, null
        assert_eq!(order(&spec(doc! {"a": -1}), &docs), vec![0, 2, 1, 4, 3]);
    }

    #[test]
    fn dotted_paths_through_arrays() {
        let docs = vec![
            rawdoc! {"a": [{"b": 7}, {"b": 2}]},
            rawdoc! {"a": {"b": 5}},
            rawdoc! {"a": [{"b": 9}, {"c": 1}]}, // the missing b counts as null
            rawdoc! {"a": 1},                    // path blocked: null
        ];
        let s = spec(doc! {"a.b": 1});
        assert_eq!(order(&s, &docs), vec![2, 3, 0, 1]);
        let s = spec(doc! {"a.b": -1});
        assert_eq!(order(&s, &docs), vec![2, 0, 1, 3]);
        let s = spec(doc! {"a.1.b": 1});
        let docs = vec![
            rawdoc! {"a": [{"b": 1}, {"b": 5}]},
            rawdoc! {"a": [{"b": 9}, {"b": 3}]},
        ];
        assert_eq!(order(&s, &docs), vec![1, 0]);
    }

    #[test]
    fn multi_key_specs_and_ties() {
        let docs = vec![
            rawdoc! {"a": 1, "b": 1},
            rawdoc! {"a": 1, "b": 2},
            rawdoc! {"a": 0, "b": 9},
            rawdoc! {"a": 1.0, "b": 2i64},
        ];
        let s = spec(doc! {"a": 1, "b": -1});
        assert_eq!(order(&s, &docs), vec![2, 1, 3, 0]);
        assert_eq!(s.compare(&docs[1], &docs[3]), Ordering::Equal);
        assert_eq!(spec(doc! {}).compare(&docs[0], &docs[2]), Ordering::Equal);
    }

    #[test]
    fn keys_agree_with_compare() {
        let s = spec(doc! {"a": -1, "b.c": 1});
        let x = rawdoc! {"a": [1, 9], "b": [{"c": 2}]};
        let y = rawdoc! {"a": 9, "b": {"c": 1}};
        let (kx, ky) = (s.sort_key(&x), s.sort_key(&y));
        assert_eq!(kx.0[0], RawBson::Int32(9));
        assert_eq!(s.compare_keys(&kx, &ky), s.compare(&x, &y));
        assert_eq!(s.compare(&x, &y), Ordering::Greater);
    }

    fn arb_value() -> impl Strategy<Value = Bson> {
        let leaf = prop_oneof![
            Just(Bson::Null),
            any::<i32>().prop_map(Bson::Int32),
            (-5i64..5).prop_map(Bson::Int64),
            prop_oneof![Just(f64::NAN), -5.0f64..5.0].prop_map(Bson::Double),
            "[a-c]{0,2}".prop_map(Bson::String),
            any::<bool>().prop_map(Bson::Boolean),
        ];
        leaf.prop_recursive(2, 8, 3, |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..3).prop_map(Bson::Array),
                inner.prop_map(|v| Bson::Document(doc! {"b": v})),
            ]
        })
    }

    fn arb_doc() -> impl Strategy<Value = RawDocumentBuf> {
        (prop::option::of(arb_value()), prop::option::of(arb_value())).prop_map(|(a, b)| {
            let mut d = Document::new();
            if let Some(a) = a {
                d.insert("a", a);
            }
            if let Some(b) = b {
                d.insert("b", b);
            }
            RawDocumentBuf::try_from(&d).expect("encodable")
        })
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(200))]
        #[test]
        fn compare_is_a_total_order_consistent_with_keys(
            x in arb_doc(), y in arb_doc(), z in arb_doc(),
            dirs in (any::<bool>(), any::<bool>()),
        ) {
            let mut d = Document::new();
            d.insert("a.b", if dirs.0 { 1 } else { -1 });
            d.insert("a", if dirs.1 { 1 } else { -1 });
            d.insert("b", 1);
            let s = spec(d);
            let xy = s.compare(&x, &y);
            prop_assert_eq!(xy, s.compare(&y, &x).reverse());
            prop_assert_eq!(s.compare(&x, &x), Ordering::Equal);
            prop_assert_eq!(xy, s.compare_keys(&s.sort_key(&x), &s.sort_key(&y)));
            let yz = s.compare(&y, &z);
            if xy != Ordering::Greater && yz != Ordering::Greater {
                prop_assert_ne!(s.compare(&x, &z), Ordering::Greater);
            }
        }
    }
}
