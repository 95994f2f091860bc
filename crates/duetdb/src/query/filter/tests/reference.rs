//! A deliberately simple evaluator over `bson::Document`: builds the list
//! of reached values with `None` for "missing", expands leaf arrays into
//! a Vec, and applies each operator to the list.

use crate::doc::value;
use bson::{Bson, Document};
use std::cmp::Ordering;

#[derive(Debug, Clone)]
pub enum RF {
    And(Vec<RF>),
    Or(Vec<RF>),
    Nor(Vec<RF>),
    Field(&'static str, ROp),
}

#[derive(Debug, Clone)]
pub enum ROp {
    Eq(Bson, bool),
    Ne(Bson),
    Cmp(&'static str, Bson),
    In(Vec<Bson>),
    Nin(Vec<Bson>),
    Exists(bool),
    Type(i32),
    TypeNumber,
    Size(i32),
    Mod(i64, i64),
    Regex(&'static str),
    All(Vec<Bson>),
    ElemMatchValue(Box<ROp>),
    ElemMatchObj(&'static str, Box<ROp>),
    Not(Box<ROp>),
}

impl RF {
    pub fn to_doc(&self) -> Document {
        let list = |v: &[RF]| Bson::Array(v.iter().map(|c| Bson::Document(c.to_doc())).collect());
        match self {
            RF::And(v) => bson::doc! {"$and": list(v)},
            RF::Or(v) => bson::doc! {"$or": list(v)},
            RF::Nor(v) => bson::doc! {"$nor": list(v)},
            RF::Field(p, op) => {
                let mut d = Document::new();
                d.insert(*p, op.to_bson());
                d
            }
        }
    }

    pub fn eval(&self, doc: &Document) -> bool {
        match self {
            RF::And(v) => v.iter().all(|c| c.eval(doc)),
            RF::Or(v) => v.iter().any(|c| c.eval(doc)),
            RF::Nor(v) => !v.iter().any(|c| c.eval(doc)),
            RF::Field(p, op) => op.eval(&reach(doc, p)),
        }
    }
}

impl ROp {
    pub fn to_bson(&self) -> Bson {
        use bson::doc;
        match self {
            ROp::Eq(v, true) => v.clone(),
            ROp::Eq(v, false) => doc! {"$eq": v.clone()}.into(),
            ROp::Ne(v) => doc! {"$ne": v.clone()}.into(),
            ROp::Cmp(op, v) => {
                let mut d = Document::new();
                d.insert(*op, v.clone());
                d.into()
            }
            ROp::In(v) => doc! {"$in": v.clone()}.into(),
            ROp::Nin(v) => doc! {"$nin": v.clone()}.into(),
            ROp::Exists(b) => doc! {"$exists": *b}.into(),
            ROp::Type(t) => doc! {"$type": *t}.into(),
            ROp::TypeNumber => doc! {"$type": "number"}.into(),
            ROp::Size(n) => doc! {"$size": *n}.into(),
            ROp::Mod(d, r) => doc! {"$mod": [*d, *r]}.into(),
            ROp::Regex(p) => doc! {"$regex": *p}.into(),
            ROp::All(v) => doc! {"$all": v.clone()}.into(),
            ROp::ElemMatchValue(op) => doc! {"$elemMatch": op.to_bson()}.into(),
            ROp::ElemMatchObj(p, op) => {
                let mut inner = Document::new();
                inner.insert(*p, op.to_bson());
                doc! {"$elemMatch": inner}.into()
            }
            ROp::Not(op) => doc! {"$not": op.to_bson()}.into(),
        }
    }

    /// The operator on the values a path reached.
    pub fn eval(&self, r: &Reached) -> bool {
        self.eval_cands(&r.values, &r.cands)
    }

    /// Inside `$elemMatch`'s value form: the element alone, never expanded.
    fn eval_single(&self, e: &Bson) -> bool {
        let one = [Some(e.clone())];
        self.eval_cands(&one, &one)
    }

    /// `reached` for the operators that look at reached values themselves,
    /// `cands` (arrays expanded) for the others.
    fn eval_cands(&self, reached: &[Option<Bson>], cands: &[Option<Bson>]) -> bool {
        let any = |f: &dyn Fn(&Option<Bson>) -> bool| cands.iter().any(f);
        match self {
            ROp::Eq(v, _) => any(&|c| eq(c, v)),
            ROp::Ne(v) => !any(&|c| eq(c, v)),
            ROp::Cmp(op, v) => any(&|c| cmp(op, c, v)),
            ROp::In(vs) => any(&|c| vs.iter().any(|v| eq(c, v))),
            ROp::Nin(vs) => !any(&|c| vs.iter().any(|v| eq(c, v))),
            ROp::Exists(b) => reached.iter().any(Option::is_some) == *b,
            ROp::Type(t) => any(&|c| c.as_ref().is_some_and(|c| type_code(c) == *t)),
            ROp::TypeNumber => any(&|c| {
                c.as_ref()
                    .is_some_and(|c| [1, 16, 18, 19].contains(&type_code(c)))
            }),
            ROp::Size(n) => reached
                .iter()
                .any(|r| matches!(r, Some(Bson::Array(a)) if a.len() == *n as usize)),
            ROp::Mod(d, r) => any(&|c| match c {
                Some(Bson::Int32(i)) => i64::from(*i) % d == *r,
                Some(Bson::Int64(i)) => i % d == *r,
                Some(Bson::Double(f)) if f.is_finite() => (f.trunc() as i64) % d == *r,
                _ => false,
            }),
            ROp::Regex(p) => {
                let re = regex::Regex::new(p).expect("test regex");
                any(&|c| matches!(c, Some(Bson::String(s)) if re.is_match(s)))
            }
            ROp::All(vs) => !vs.is_empty() && vs.iter().all(|v| any(&|c| eq(c, v))),
            ROp::ElemMatchValue(op) => reached.iter().any(|r| match r {
                Some(Bson::Array(a)) => a.iter().any(|e| op.eval_single(e)),
                _ => false,
            }),
            ROp::ElemMatchObj(p, op) => reached.iter().any(|r| match r {
                Some(Bson::Array(a)) => a.iter().any(|e| match e {
                    Bson::Document(d) => op.eval(&reach(d, p)),
                    _ => false,
                }),
                _ => false,
            }),
            ROp::Not(op) => !op.eval_cands(reached, cands),
        }
    }
}

/// Values reached by a dotted path (`None` where a field is missing), and
/// the candidates operators compare with: reached arrays also stand for
/// their elements (elements first), except an element picked positionally.
#[derive(Default)]
pub struct Reached {
    pub values: Vec<Option<Bson>>,
    pub cands: Vec<Option<Bson>>,
}

impl Reached {
    fn push(&mut self, v: Option<Bson>, expand: bool) {
        if let (true, Some(Bson::Array(a))) = (expand, &v) {
            self.cands.extend(a.iter().cloned().map(Some));
        }
        self.cands.push(v.clone());
        self.values.push(v);
    }
}

pub fn reach(doc: &Document, path: &str) -> Reached {
    let parts: Vec<&str> = path.split('.').collect();
    let mut out = Reached::default();
    reach_doc(doc, &parts, true, &mut out);
    out
}

fn reach_doc(doc: &Document, parts: &[&str], yield_missing: bool, out: &mut Reached) {
    match doc.get(parts[0]) {
        Some(v) => reach_value(v, &parts[1..], out),
        None if yield_missing => out.push(None, false),
        None => {}
    }
}

fn reach_value(v: &Bson, rest: &[&str], out: &mut Reached) {
    if rest.is_empty() {
        out.push(Some(v.clone()), true);
        return;
    }
    match v {
        Bson::Document(d) => reach_doc(d, rest, true, out),
        Bson::Array(a) => {
            let numeric = crate::doc::path::numeric_component(rest[0]);
            if let Some(e) = numeric.and_then(|i| a.get(i)) {
                if rest.len() == 1 {
                    out.push(Some(e.clone()), false);
                } else {
                    reach_value(e, &rest[1..], out);
                }
            }
            for e in a {
                if let Bson::Document(d) = e {
                    reach_doc(d, rest, numeric.is_none(), out);
                }
            }
        }
        _ => out.push(None, false),
    }
}

fn rank(v: &Bson) -> u8 {
    let raw = value::to_raw(v).expect("raw");
    value::canonical_rank(raw.as_raw_bson_ref())
}

fn eq(c: &Option<Bson>, v: &Bson) -> bool {
    match (c, v) {
        (None, Bson::Null) => true,
        (None, _) => false,
        (Some(Bson::Undefined), Bson::Null) => true,
        (Some(c), v) => value::equal_bson(c, v),
    }
}

fn is_nan(v: &Bson) -> bool {
    matches!(v, Bson::Double(f) if f.is_nan())
}

fn cmp(op: &str, c: &Option<Bson>, v: &Bson) -> bool {
    let inclusive = op == "$gte" || op == "$lte";
    let Some(c) = c else {
        return inclusive && *v == Bson::Null;
    };
    let (rc, rv) = (rank(c), rank(v));
    if rc != rv {
        return (rc == 1 && rv == 2) && inclusive
            || (*v == Bson::MinKey && op.starts_with("$gt"))
            || (*v == Bson::MaxKey && op.starts_with("$lt"));
    }
    if is_nan(c) || is_nan(v) {
        return inclusive && is_nan(c) && is_nan(v);
    }
    let ord = value::compare_bson(c, v);
    match op {
        "$gt" => ord == Ordering::Greater,
        "$gte" => ord != Ordering::Less,
        "$lt" => ord == Ordering::Less,
        _ => ord != Ordering::Greater,
    }
}

fn type_code(v: &Bson) -> i32 {
    // MinKey's element type byte is 0xFF; `$type` calls it -1.
    match v {
        Bson::MinKey => -1,
        _ => i32::from(v.element_type() as u8),
    }
}
