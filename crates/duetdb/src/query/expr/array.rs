//! Array operators: `$size $in $arrayElemAt $first $last $concatArrays
//! $indexOfArray $isArray $range $reverseArray $slice $arrayToObject
//! $objectToArray`, and the named-argument ones `$zip $sortArray $firstN
//! $lastN $maxN $minN $median $percentile`.
//!
//! Invariants: membership and ordering use the shared value order (so `1` is
//! in `[1.0]`, and `$sortArray` sorts as `$sort` does); `$arrayElemAt` takes
//! negative indexes from the end and answers missing, not an error, for an
//! index out of range; arrays built here (`$range`, `$concatArrays`, `$zip`)
//! are measured as they grow and refused past 16 MiB (10334); a null or
//! missing array argument gives null, any other non-array MongoDB's code.

use std::cmp::Ordering;

use bson::{Bson, Document};

use crate::doc::size::{array_element_len, SizeBudget};
use crate::error::{Error, Result};
use crate::query::expr::eval::{arg, null, Args};
use crate::query::expr::logic::truthy;
use crate::query::expr::{compare, compare_values, is_nullish, num_of, type_name, Num, Op, Value};

/// Apply an array operator to its evaluated arguments.
pub(super) fn apply(op: Op, vals: Vec<Value>) -> Result<Value> {
    match op {
        Op::In => {
            let (needle, hay) = (arg(op, &vals, 0)?, arg(op, &vals, 1)?);
            let Some(Bson::Array(items)) = hay else {
                return Err(loc!(
                    40081,
                    "$in requires an array as a second argument, found: {}",
                    type_name(hay)
                ));
            };
            Ok(Some(Bson::Boolean(items.iter().any(|i| {
                compare_values(needle, &Some(i.clone())) == Ordering::Equal
            }))))
        }
        Op::Size => match arg(op, &vals, 0)? {
            Some(Bson::Array(a)) => Ok(Some(Bson::Int32(
                i32::try_from(a.len()).unwrap_or(i32::MAX),
            ))),
            other => Err(loc!(
                17124,
                "The argument to $size must be an array. Type of the argument was: {}",
                type_name(other)
            )),
        },
        Op::ArrayElemAt => array_elem_at(arg(op, &vals, 0)?, arg(op, &vals, 1)?),
        Op::First | Op::Last => {
            let a = arg(op, &vals, 0)?;
            if is_nullish(a) {
                return null();
            }
            let Some(Bson::Array(items)) = a else {
                return Err(loc!(
                    28689,
                    "{}'s argument must be an array, but is {}",
                    op.name(),
                    type_name(a)
                ));
            };
            Ok(if op == Op::First {
                items.first().cloned()
            } else {
                items.last().cloned()
            })
        }
        Op::ConcatArrays => {
            let mut out = Vec::new();
            let mut size = SizeBudget::new("$concatArrays");
            for v in vals {
                if is_nullish(&v) {
                    return null();
                }
                let Some(Bson::Array(items)) = v else {
                    return Err(loc!(
                        28664,
                        "$concatArrays only supports arrays, not {}",
                        type_name(&v)
                    ));
                };
                for i in items {
                    size.add(array_element_len(out.len(), &i))?;
                    out.push(i);
                }
            }
            Ok(Some(Bson::Array(out)))
        }
        Op::IndexOfArray => index_of_array(&vals),
        Op::IsArray => Ok(Some(Bson::Boolean(matches!(
            arg(op, &vals, 0)?,
            Some(Bson::Array(_))
        )))),
        Op::Range => range(&vals),
        Op::ReverseArray => {
            let a = arg(op, &vals, 0)?;
            if is_nullish(a) {
                return null();
            }
            match a {
                Some(Bson::Array(items)) => {
                    Ok(Some(Bson::Array(items.iter().rev().cloned().collect())))
                }
                other => Err(loc!(
                    34435,
                    "The argument to $reverseArray must be an array, but was of type: {}",
                    type_name(other)
                )),
            }
        }
        Op::Slice => slice(&vals),
        Op::ArrayToObject => array_to_object(arg(op, &vals, 0)?),
        Op::ObjectToArray => {
            let a = arg(op, &vals, 0)?;
            if is_nullish(a) {
                return null();
            }
            let Some(Bson::Document(d)) = a else {
                return Err(loc!(
                    40390,
                    "$objectToArray requires a document input, found: {}",
                    type_name(a)
                ));
            };
            Ok(Some(Bson::Array(
                d.iter()
                    .map(|(k, v)| Bson::Document(bson::doc! {"k": k.clone(), "v": v.clone()}))
                    .collect(),
            )))
        }
        other => Err(Error::Internal(format!(
            "{} is not an array operator",
            other.name()
        ))),
    }
}

/// A value that must be a 32-bit integer (integral doubles and longs in range
/// count), or `None`.
pub(super) fn int32_of(v: &Bson) -> Option<i64> {
    match num_of(v)? {
        Num::I32(x) => Some(i64::from(x)),
        Num::I64(x) if i32::try_from(x).is_ok() => Some(x),
        Num::F64(f) if f.fract() == 0.0 && f.abs() <= f64::from(i32::MAX) => Some(f as i64),
        _ => None,
    }
    .or_else(|| match v {
        Bson::Decimal128(d) => {
            let f = crate::doc::value::decimal_to_f64(*d);
            (f.fract() == 0.0 && f.abs() <= f64::from(i32::MAX)).then_some(f as i64)
        }
        _ => None,
    })
}

fn render(v: &Value) -> String {
    crate::error::render(v.as_ref().unwrap_or(&Bson::Null))
}

fn array_elem_at(a: &Value, i: &Value) -> Result<Value> {
    if is_nullish(a) || is_nullish(i) {
        return null();
    }
    let Some(Bson::Array(items)) = a else {
        return Err(loc!(
            28689,
            "$arrayElemAt's first argument must be an array, but is {}",
            type_name(a)
        ));
    };
    let Some(b) = i.as_ref().filter(|b| is_num(b)) else {
        return Err(loc!(
            28690,
            "$arrayElemAt's second argument must be a numeric value, but is {}",
            type_name(i)
        ));
    };
    let Some(idx) = int32_of(b) else {
        return Err(loc!(
            28691,
            "$arrayElemAt's second argument must be representable as a 32-bit integer: {}",
            render(i)
        ));
    };
    Ok(elem(items, idx).cloned())
}

fn elem(items: &[Bson], idx: i64) -> Option<&Bson> {
    let len = items.len() as i64;
    let pos = if idx < 0 { len + idx } else { idx };
    usize::try_from(pos).ok().and_then(|p| items.get(p))
}

fn index_of_array(vals: &[Value]) -> Result<Value> {
    let op = Op::IndexOfArray;
    let a = arg(op, vals, 0)?;
    if is_nullish(a) {
        return null();
    }
    let Some(Bson::Array(items)) = a else {
        return Err(loc!(
            40090,
            "$indexOfArray requires an array as a first argument, found: {}",
            type_name(a)
        ));
    };
    let needle = arg(op, vals, 1)?;
    let bound =
        |i: usize, dflt: usize| -> Result<usize> {
            let Some(v) = vals.get(i) else {
                return Ok(dflt);
            };
            let Some(n) = v.as_ref().and_then(int32_of) else {
                return Err(loc!(
                40096,
                "$indexOfArray requires an integral {}, found a value of type: {}, with value: {}",
                if i == 2 { "starting index" } else { "ending index" },
                type_name(v),
                render(v)
            ));
            };
            usize::try_from(n).map_err(|_| {
                loc!(
                    40097,
                    "$indexOfArray requires a nonnegative {}, found: {n}",
                    if i == 2 {
                        "starting index"
                    } else {
                        "ending index"
                    }
                )
            })
        };
    let start = bound(2, 0)?;
    let end = bound(3, items.len())?.min(items.len());
    for (i, item) in items.iter().enumerate().take(end).skip(start) {
        if compare_values(needle, &Some(item.clone())) == Ordering::Equal {
            return Ok(Some(Bson::Int32(i32::try_from(i).unwrap_or(i32::MAX))));
        }
    }
    Ok(Some(Bson::Int32(-1)))
}

fn range(vals: &[Value]) -> Result<Value> {
    let op = Op::Range;
    let int = |i: usize, numeric: (&str, i32), int: i32| -> Result<i64> {
        let v = arg(op, vals, i)?;
        let Some(b) = v.as_ref().filter(|b| is_num(b)) else {
            return Err(Error::Coded {
                code: numeric.1,
                name: if numeric.1 == 34443 {
                    "Location34443"
                } else if numeric.1 == 34445 {
                    "Location34445"
                } else {
                    "Location34447"
                },
                msg: format!(
                    "$range requires a numeric {}, found value of type: {}",
                    numeric.0,
                    type_name(v)
                ),
            });
        };
        int32_of(b).ok_or_else(|| Error::Coded {
            code: int,
            name: if int == 34444 {
                "Location34444"
            } else if int == 34446 {
                "Location34446"
            } else {
                "Location34448"
            },
            msg: format!(
                "$range requires a {} that can be represented as a 32-bit integer, found value: {}",
                numeric.0,
                render(v)
            ),
        })
    };
    let start = int(0, ("starting value", 34443), 34444)?;
    let end = int(1, ("ending value", 34445), 34446)?;
    let step = if vals.len() > 2 {
        int(2, ("step value", 34447), 34448)?
    } else {
        1
    };
    if step == 0 {
        return Err(loc!(34449, "$range requires a non-zero step value"));
    }
    let mut out = Vec::new();
    let mut size = SizeBudget::new("$range");
    let mut x = start;
    while (step > 0 && x < end) || (step < 0 && x > end) {
        let v = Bson::Int32(i32::try_from(x).unwrap_or(0));
        size.add(array_element_len(out.len(), &v))?;
        out.push(v);
        x += step;
    }
    Ok(Some(Bson::Array(out)))
}

fn slice(vals: &[Value]) -> Result<Value> {
    let op = Op::Slice;
    if vals.iter().any(is_nullish) {
        return null();
    }
    let a = arg(op, vals, 0)?;
    let Some(Bson::Array(items)) = a else {
        return Err(loc!(
            28724,
            "First argument to $slice must be an array, but is of type: {}",
            type_name(a)
        ));
    };
    let second = arg(op, vals, 1)?;
    let Some(b) = second.as_ref().filter(|b| is_num(b)) else {
        return Err(loc!(
            28725,
            "Second argument to $slice must be a numeric value, but is of type: {}",
            type_name(second)
        ));
    };
    let Some(first_n) = int32_of(b) else {
        return Err(loc!(
            28726,
            "Second argument to $slice can't be represented as a 32-bit integer: {}",
            render(second)
        ));
    };
    let len = items.len() as i64;
    let (start, n) = if let Some(third) = vals.get(2) {
        let Some(c) = third.as_ref().filter(|b| is_num(b)) else {
            return Err(loc!(
                28727,
                "Third argument to $slice must be numeric, but is of type: {}",
                type_name(third)
            ));
        };
        let Some(n) = int32_of(c) else {
            return Err(loc!(
                28728,
                "Third argument to $slice can't be represented as a 32-bit integer: {}",
                render(third)
            ));
        };
        if n <= 0 {
            return Err(loc!(
                28729,
                "Third argument to $slice must be positive: {}",
                render(third)
            ));
        }
        let start = if first_n < 0 {
            (len + first_n).max(0)
        } else {
            first_n.min(len)
        };
        (start, n)
    } else if first_n < 0 {
        ((len + first_n).max(0), -first_n)
    } else {
        (0, first_n)
    };
    let start = usize::try_from(start).unwrap_or(0);
    let n = usize::try_from(n).unwrap_or(0);
    Ok(Some(Bson::Array(
        items.iter().skip(start).take(n).cloned().collect(),
    )))
}

fn array_to_object(a: &Value) -> Result<Value> {
    if is_nullish(a) {
        return null();
    }
    let Some(Bson::Array(items)) = a else {
        return Err(loc!(
            40386,
            "$arrayToObject requires an array input, found: {}",
            type_name(a)
        ));
    };
    let mut out = Document::new();
    let mut pairs_form: Option<bool> = None;
    for item in items {
        let (k, v, is_pair) = match item {
            Bson::Array(kv) => {
                let [k, v] = kv.as_slice() else {
                    return Err(loc!(
                        40397,
                        "$arrayToObject requires an array of size 2 arrays,found array of size: {}",
                        kv.len()
                    ));
                };
                let Bson::String(k) = k else {
                    return Err(loc!(
                        40395,
                        "$arrayToObject requires an array of key-value pairs, where the key must be of type string. Found key type: {}",
                        crate::doc::types::type_name(k)
                    ));
                };
                (k, v, true)
            }
            Bson::Document(d) => {
                if d.len() != 2 {
                    return Err(loc!(
                        40392,
                        "$arrayToObject requires an object keys of 'k' and 'v'. Found incorrect number of keys:{}",
                        d.len()
                    ));
                }
                let (Some(k), Some(v)) = (d.get("k"), d.get("v")) else {
                    return Err(loc!(
                        40393,
                        "$arrayToObject requires an object with keys 'k' and 'v'. Missing either or both keys from: {}",
                        crate::error::render(item)
                    ));
                };
                let Bson::String(k) = k else {
                    return Err(loc!(
                        40394,
                        "$arrayToObject requires an object with keys 'k' and 'v', where the value of 'k' must be of type string. Found type: {}",
                        crate::doc::types::type_name(k)
                    ));
                };
                (k, v, false)
            }
            other => {
                return Err(loc!(
                    40398,
                    "Unrecognised input type format for $arrayToObject: {}",
                    crate::doc::types::type_name(other)
                ))
            }
        };
        if pairs_form.is_some_and(|p| p != is_pair) {
            return Err(loc!(
                40396,
                "$arrayToObject requires a consistent input format. Elements must all be arrays or all be objects. Array was detected, now found: {}",
                crate::doc::types::type_name(item)
            ));
        }
        pairs_form = Some(is_pair);
        if k.contains('\0') {
            return Err(loc!(
                4940400,
                "Key field cannot contain an embedded null byte"
            ));
        }
        out.insert(k.clone(), v.clone());
    }
    Ok(Some(Bson::Document(out)))
}

/// Evaluate a named-argument array operator.
pub(super) fn named(a: &Args<'_, '_>) -> Result<Value> {
    use crate::query::expr::Named::*;
    match a.n {
        Zip => zip(a),
        SortArray => sort_array(a),
        FirstN | LastN | MaxN | MinN => n_of(a),
        _ => percentile(a),
    }
}

fn zip(a: &Args<'_, '_>) -> Result<Value> {
    let inputs = a.get("inputs")?;
    if matches!(&inputs, Some(Bson::Array(a)) if a.is_empty()) {
        return Err(loc!(34465, "$zip requires at least one input array"));
    }
    let Some(Bson::Array(inputs)) = inputs else {
        return Err(loc!(
            34460,
            "inputs must be an array of expressions, found {}",
            type_name(&inputs)
        ));
    };
    let longest = match a.get("useLongestLength")? {
        None => false,
        Some(Bson::Boolean(b)) => b,
        Some(other) => {
            return Err(loc!(
                34463,
                "useLongestLength must be a bool, found {}",
                crate::doc::types::type_name(&other)
            ))
        }
    };
    let defaults = match a.get("defaults")? {
        None => None,
        Some(Bson::Array(d)) => Some(d),
        Some(other) => {
            return Err(loc!(
                34462,
                "defaults must be an array of expressions, found {}",
                crate::doc::types::type_name(&other)
            ))
        }
    };
    if defaults.is_some() && !longest {
        return Err(loc!(
            34466,
            "cannot specify defaults unless useLongestLength is true"
        ));
    }
    if defaults.as_ref().is_some_and(|d| d.len() != inputs.len()) {
        return Err(loc!(34467, "defaults and inputs must be the same length"));
    }
    let mut arrays = Vec::with_capacity(inputs.len());
    for i in inputs {
        match i {
            Bson::Null | Bson::Undefined => return null(),
            Bson::Array(x) => arrays.push(x),
            other => {
                return Err(loc!(
                    34468,
                    "$zip found a non-array expression in input: {}",
                    crate::error::render(&other)
                ))
            }
        }
    }
    let lens = arrays.iter().map(Vec::len);
    let n = if longest { lens.max() } else { lens.min() }.unwrap_or(0);
    let mut out = Vec::with_capacity(n);
    let mut size = SizeBudget::new("$zip");
    for row in 0..n {
        let tuple: Vec<Bson> = arrays
            .iter()
            .enumerate()
            .map(|(col, arr)| {
                arr.get(row).cloned().unwrap_or_else(|| {
                    defaults
                        .as_ref()
                        .and_then(|d| d.get(col).cloned())
                        .unwrap_or(Bson::Null)
                })
            })
            .collect();
        let t = Bson::Array(tuple);
        size.add(array_element_len(out.len(), &t))?;
        out.push(t);
    }
    Ok(Some(Bson::Array(out)))
}

/// A `$sort`-style order: `1`/`-1` on whole values, or a document of fields
/// (`$sortArray`, and the `sortBy` of `$top`/`$bottom`/`$topN`/`$bottomN`).
pub enum SortBy {
    Whole(bool),
    Fields(Vec<(Vec<String>, bool)>),
}

impl SortBy {
    pub fn parse(v: &Value, what: &str) -> Result<SortBy> {
        let dir = |b: &Bson| -> Option<bool> {
            match num_of(b)? {
                n if n.to_f64() == 1.0 => Some(true),
                n if n.to_f64() == -1.0 => Some(false),
                _ => None,
            }
        };
        match v {
            Some(Bson::Document(d)) if !d.is_empty() => {
                let mut fields = Vec::with_capacity(d.len());
                for (k, b) in d {
                    let asc = dir(b).ok_or_else(|| {
                        loc!(15975, "{what}: $sort key ordering must be 1 (for ascending) or -1 (for descending)")
                    })?;
                    fields.push((k.split('.').map(str::to_string).collect(), asc));
                }
                Ok(SortBy::Fields(fields))
            }
            Some(b) if dir(b).is_some() => Ok(SortBy::Whole(dir(b).unwrap_or(true))),
            _ => Err(loc!(
                2942505,
                "{what}: sortBy must be either 1, -1, or an object of fields, found {}",
                render(v)
            )),
        }
    }

    pub fn cmp(&self, x: &Bson, y: &Bson) -> Ordering {
        match self {
            SortBy::Whole(asc) => {
                let c = compare(x, y);
                if *asc {
                    c
                } else {
                    c.reverse()
                }
            }
            SortBy::Fields(fields) => {
                for (path, asc) in fields {
                    let get = |v: &Bson| match v {
                        Bson::Document(_) => crate::query::expr::path_bson(v, path),
                        _ => None,
                    };
                    let c = compare_values(&get(x), &get(y));
                    let c = if *asc { c } else { c.reverse() };
                    if c != Ordering::Equal {
                        return c;
                    }
                }
                Ordering::Equal
            }
        }
    }
}

fn sort_array(a: &Args<'_, '_>) -> Result<Value> {
    let input = a.get("input")?;
    let by = SortBy::parse(&a.get("sortBy")?, "$sortArray")?;
    if is_nullish(&input) {
        return null();
    }
    let Some(Bson::Array(mut items)) = input else {
        return Err(loc!(
            2942504,
            "The input argument to $sortArray must be an array, but was of type: {}",
            type_name(&input)
        ));
    };
    items.sort_by(|x, y| by.cmp(x, y));
    Ok(Some(Bson::Array(items)))
}

/// The `n` of `$firstN`/`$lastN`/`$maxN`/`$minN` (and of their accumulators).
pub(crate) fn n_arg(v: &Value, name: &str) -> Result<usize> {
    let Some(n) = v.as_ref().and_then(|b| {
        num_of(b).and_then(|n| match n {
            Num::I32(i) => Some(i64::from(i)),
            Num::I64(i) => Some(i),
            Num::F64(f) if f.fract() == 0.0 && f.abs() < 9.2e18 => Some(f as i64),
            Num::F64(_) => None,
        })
    }) else {
        return Err(loc!(
            5787902,
            "Value for 'n' must be of integral type, but found {}",
            render(v)
        ));
    };
    if n <= 0 {
        return Err(loc!(5787908, "'n' must be greater than 0, found {n}"));
    }
    let _ = name;
    Ok(usize::try_from(n).unwrap_or(usize::MAX))
}

fn n_of(a: &Args<'_, '_>) -> Result<Value> {
    use crate::query::expr::Named::*;
    let n = n_arg(&a.get("n")?, a.name())?;
    let input = a.get("input")?;
    if is_nullish(&input) {
        return null();
    }
    let Some(Bson::Array(mut items)) = input else {
        return Err(loc!(
            5788200,
            "Input to {} must be an array, but found {}",
            a.name(),
            type_name(&input)
        ));
    };
    Ok(Some(Bson::Array(match a.n {
        FirstN => items.into_iter().take(n).collect(),
        LastN => {
            let skip = items.len().saturating_sub(n);
            items.split_off(skip)
        }
        _ => {
            items.retain(|v| !matches!(v, Bson::Null | Bson::Undefined));
            if a.n == MaxN {
                items.sort_by(|x, y| compare(y, x));
            } else {
                items.sort_by(compare);
            }
            items.truncate(n);
            items
        }
    })))
}

/// `$median` / `$percentile` as expressions: over one number or an array's
/// numbers (others ignored); the discrete percentile of the sorted values
/// (`approximate`, the one method of MongoDB 7.0, answers a value of the
/// input: the smallest whose rank reaches `p`).
fn percentile(a: &Args<'_, '_>) -> Result<Value> {
    use crate::query::expr::Named::*;
    match a.get("method")? {
        Some(Bson::String(m)) if m == "approximate" => {}
        other => {
            return Err(loc!(
                7436202,
                "{}: 'method' must be 'approximate', found {}",
                a.name(),
                render(&other)
            ))
        }
    }
    let ps: Vec<f64> = if a.n == Median {
        vec![0.5]
    } else {
        percentiles_arg(&a.get("p")?, a.name())?
    };
    let input = a.get("input")?;
    let mut xs: Vec<f64> = match &input {
        Some(Bson::Array(items)) => items.iter().filter_map(number_f64).collect(),
        Some(b) => number_f64(b).into_iter().collect(),
        None => Vec::new(),
    };
    xs.sort_by(|x, y| x.total_cmp(y));
    let vals: Vec<Bson> = ps
        .iter()
        .map(|p| discrete_percentile(&xs, *p).map_or(Bson::Null, Bson::Double))
        .collect();
    Ok(Some(if a.n == Median {
        vals.into_iter().next().unwrap_or(Bson::Null)
    } else {
        Bson::Array(vals)
    }))
}

fn number_f64(b: &Bson) -> Option<f64> {
    match b {
        Bson::Decimal128(d) => Some(crate::doc::value::decimal_to_f64(*d)),
        other => num_of(other).map(Num::to_f64),
    }
}

/// The `p` array of `$percentile`: numbers in [0, 1].
pub(crate) fn percentiles_arg(v: &Value, name: &str) -> Result<Vec<f64>> {
    let Some(Bson::Array(items)) = v else {
        return Err(loc!(
            7750301,
            "{name}: 'p' must be an array of numbers, found {}",
            render(v)
        ));
    };
    if items.is_empty() {
        return Err(loc!(7750302, "{name}: 'p' must not be empty"));
    }
    items
        .iter()
        .map(|b| match number_f64(b) {
            Some(p) if (0.0..=1.0).contains(&p) => Ok(p),
            _ => Err(loc!(
                7750303,
                "{name}: 'p' must be an array of numeric values from [0.0, 1.0] range, but found: {}",
                crate::error::render(b)
            )),
        })
        .collect()
}

/// The value of sorted `xs` at percentile `p` (discrete: an element).
pub(crate) fn discrete_percentile(xs: &[f64], p: f64) -> Option<f64> {
    if xs.is_empty() {
        return None;
    }
    let n = xs.len() as f64;
    let rank = (p * n).ceil() as usize;
    xs.get(rank.saturating_sub(1).min(xs.len() - 1)).copied()
}

/// Whether any element of an array is truthy (used by set operators).
pub(super) fn any_truthy(items: &[Bson]) -> bool {
    items.iter().any(|b| truthy(&Some(b.clone())))
}

/// One of the four numeric types.
pub(super) fn is_num(b: &Bson) -> bool {
    matches!(
        b,
        Bson::Int32(_) | Bson::Int64(_) | Bson::Double(_) | Bson::Decimal128(_)
    )
}
