//! `$jsonSchema`: a document validated against a JSON Schema (draft 4, as
//! MongoDB implements it) as a query predicate.
//!
//! Owns: parsing a schema ([`Schema::parse`]) and validating a value.
//! Keywords: `bsonType`, `type`, `required`, `properties`,
//! `additionalProperties`, `patternProperties`, `minProperties`,
//! `maxProperties`, `minimum`, `maximum`, `exclusiveMinimum`,
//! `exclusiveMaximum`, `multipleOf`, `minLength`, `maxLength`, `pattern`,
//! `enum`, `items`, `additionalItems`, `minItems`, `maxItems`,
//! `uniqueItems`, `allOf`, `anyOf`, `oneOf`, `not`, `dependencies` (the
//! property-list form), and the annotations `title`/`description`.
//!
//! Invariants (MongoDB's semantics): a keyword constrains only values of the
//! type it is about (`minimum` says nothing of a string, `properties`
//! nothing of a number); `properties` constrain fields that exist (`required`
//! says which must); `enum` compares with the BSON value order's equality;
//! lengths count code points; an unknown keyword is FailedToParse (9) and one
//! MongoDB does not support (`$ref`, `format`, `type: "integer"`, ...) is
//! FailedToParse as well, never ignored. Schema nesting is bounded by the
//! document depth limit, so validation recursion is bounded.

use std::cmp::Ordering;

use crate::query::pattern::{self, Pattern};
use bson::{Bson, Document};

use crate::error::Error;
use crate::query::expr::{compare, num_of};

fn fail(msg: impl Into<String>) -> Box<Error> {
    Box::new(Error::Coded {
        code: 9,
        name: "FailedToParse",
        msg: msg.into(),
    })
}

type PResult<T> = std::result::Result<T, Box<Error>>;

#[derive(Debug, Clone)]
enum Additional {
    Allowed(bool),
    Schema(Box<Schema>),
}

#[derive(Debug, Clone)]
enum Items {
    All(Box<Schema>),
    Tuple(Vec<Schema>),
}

/// A parsed JSON schema.
#[derive(Debug, Clone, Default)]
pub(super) struct Schema {
    /// Allowed types as a `$type` mask; `None`: any.
    types: Option<u32>,
    required: Vec<String>,
    properties: Vec<(String, Schema)>,
    pattern_properties: Vec<(Pattern, Schema)>,
    additional_properties: Option<Additional>,
    min_properties: Option<usize>,
    max_properties: Option<usize>,
    minimum: Option<(Bson, bool)>,
    maximum: Option<(Bson, bool)>,
    multiple_of: Option<f64>,
    min_length: Option<usize>,
    max_length: Option<usize>,
    pattern: Option<Pattern>,
    enumeration: Option<Vec<Bson>>,
    items: Option<Items>,
    additional_items: Option<Additional>,
    min_items: Option<usize>,
    max_items: Option<usize>,
    unique_items: bool,
    all_of: Vec<Schema>,
    any_of: Vec<Schema>,
    one_of: Vec<Schema>,
    not: Option<Box<Schema>>,
    dependencies: Vec<(String, Vec<String>)>,
}

const T_OBJECT: u32 = 1 << 3;
const T_ARRAY: u32 = 1 << 4;
const T_STRING: u32 = 1 << 2;

fn bit_of(v: &Bson) -> u32 {
    super::tree::type_bit(v.element_type())
}

fn count(v: &Bson, kw: &str) -> PResult<usize> {
    match num_of(v).map(|n| n.to_f64()) {
        Some(f) if f >= 0.0 && f.fract() == 0.0 && f < 1e15 => Ok(f as usize),
        _ => Err(fail(format!(
            "$jsonSchema keyword '{kw}' must be a non-negative integer"
        ))),
    }
}

fn strings(v: &Bson, kw: &str) -> PResult<Vec<String>> {
    let Bson::Array(items) = v else {
        return Err(fail(format!("$jsonSchema keyword '{kw}' must be an array")));
    };
    items
        .iter()
        .map(|i| match i {
            Bson::String(s) => Ok(s.clone()),
            _ => Err(fail(format!(
                "$jsonSchema keyword '{kw}' must be an array of strings"
            ))),
        })
        .collect()
}

fn regex(v: &Bson, kw: &str) -> PResult<Pattern> {
    let Bson::String(p) = v else {
        return Err(fail(format!("$jsonSchema keyword '{kw}' must be a string")));
    };
    pattern::compile(p, "").map_err(|e| {
        let why = match e {
            pattern::CompileError::Syntax(e) => e.to_string(),
            pattern::CompileError::Flag(c) => format!("invalid flag {c}"),
        };
        fail(format!(
            "$jsonSchema keyword '{kw}' has an invalid regex: {why}"
        ))
    })
}

fn type_mask(v: &Bson, bson_type: bool) -> PResult<u32> {
    let one = |s: &Bson| -> PResult<u32> {
        let Bson::String(s) = s else {
            return Err(fail(
                "$jsonSchema type must be a string or an array of strings",
            ));
        };
        if bson_type {
            if s == "number" {
                return Ok(super::tree::NUMBER_MASK);
            }
            return crate::doc::types::from_alias(s)
                .map(super::tree::type_bit)
                .ok_or_else(|| fail(format!("Unknown type name alias: {s}")));
        }
        Ok(match s.as_str() {
            "object" => T_OBJECT,
            "array" => T_ARRAY,
            "string" => T_STRING,
            "number" => super::tree::NUMBER_MASK,
            "boolean" => 1 << 8,
            "null" => 1 << 10,
            "integer" => {
                return Err(fail(
                    "$jsonSchema type 'integer' is not currently supported.",
                ))
            }
            other => return Err(fail(format!("Unknown type name alias: {other}"))),
        })
    };
    match v {
        Bson::Array(items) if !items.is_empty() => items.iter().try_fold(0, |m, i| Ok(m | one(i)?)),
        Bson::Array(_) => Err(fail("$jsonSchema type array must not be empty")),
        other => one(other),
    }
}

fn sub(v: &Bson, kw: &str, depth: usize) -> PResult<Schema> {
    match v {
        Bson::Document(d) => Schema::parse(d, depth + 1),
        _ => Err(fail(format!(
            "$jsonSchema keyword '{kw}' must be an object"
        ))),
    }
}

fn subs(v: &Bson, kw: &str, depth: usize) -> PResult<Vec<Schema>> {
    match v {
        Bson::Array(items) if !items.is_empty() => {
            items.iter().map(|i| sub(i, kw, depth)).collect()
        }
        _ => Err(fail(format!(
            "$jsonSchema keyword '{kw}' must be a nonempty array of objects"
        ))),
    }
}

fn additional(v: &Bson, kw: &str, depth: usize) -> PResult<Additional> {
    match v {
        Bson::Boolean(b) => Ok(Additional::Allowed(*b)),
        Bson::Document(_) => Ok(Additional::Schema(Box::new(sub(v, kw, depth)?))),
        _ => Err(fail(format!(
            "$jsonSchema keyword '{kw}' must be either an object or a boolean"
        ))),
    }
}

impl Schema {
    pub(super) fn parse(d: &Document, depth: usize) -> PResult<Schema> {
        if depth > crate::query::filter::MAX_FILTER_DEPTH {
            return Err(fail("$jsonSchema is nested too deeply"));
        }
        let mut s = Schema::default();
        if d.contains_key("type") && d.contains_key("bsonType") {
            return Err(fail(
                "Cannot specify both $jsonSchema keywords 'type' and 'bsonType'",
            ));
        }
        for (k, v) in d {
            match k.as_str() {
                "bsonType" => s.types = Some(type_mask(v, true)?),
                "type" => s.types = Some(type_mask(v, false)?),
                "required" => s.required = strings(v, k)?,
                "properties" => {
                    let Bson::Document(p) = v else {
                        return Err(fail("$jsonSchema keyword 'properties' must be an object"));
                    };
                    for (name, schema) in p {
                        s.properties.push((name.clone(), sub(schema, k, depth)?));
                    }
                }
                "patternProperties" => {
                    let Bson::Document(p) = v else {
                        return Err(fail(
                            "$jsonSchema keyword 'patternProperties' must be an object",
                        ));
                    };
                    for (pat, schema) in p {
                        s.pattern_properties.push((
                            regex(&Bson::String(pat.clone()), k)?,
                            sub(schema, k, depth)?,
                        ));
                    }
                }
                "additionalProperties" => s.additional_properties = Some(additional(v, k, depth)?),
                "minProperties" => s.min_properties = Some(count(v, k)?),
                "maxProperties" => s.max_properties = Some(count(v, k)?),
                "minimum" | "maximum" => {
                    if num_of(v).is_none() && !matches!(v, Bson::Decimal128(_)) {
                        return Err(fail(format!("$jsonSchema keyword '{k}' must be a number")));
                    }
                    let excl_key = if k == "minimum" {
                        "exclusiveMinimum"
                    } else {
                        "exclusiveMaximum"
                    };
                    let excl = matches!(d.get(excl_key), Some(Bson::Boolean(true)));
                    if k == "minimum" {
                        s.minimum = Some((v.clone(), excl));
                    } else {
                        s.maximum = Some((v.clone(), excl));
                    }
                }
                "exclusiveMinimum" | "exclusiveMaximum" => {
                    if !matches!(v, Bson::Boolean(_)) {
                        return Err(fail(format!("$jsonSchema keyword '{k}' must be a boolean")));
                    }
                    let base = if k == "exclusiveMinimum" {
                        "minimum"
                    } else {
                        "maximum"
                    };
                    if !d.contains_key(base) {
                        return Err(fail(format!(
                            "$jsonSchema keyword '{base}' must be a present if {k} is present"
                        )));
                    }
                }
                "multipleOf" => match num_of(v).map(|n| n.to_f64()) {
                    Some(f) if f > 0.0 => s.multiple_of = Some(f),
                    _ => {
                        return Err(fail(
                            "$jsonSchema keyword 'multipleOf' must be a positive number",
                        ))
                    }
                },
                "minLength" => s.min_length = Some(count(v, k)?),
                "maxLength" => s.max_length = Some(count(v, k)?),
                "pattern" => s.pattern = Some(regex(v, k)?),
                "enum" => match v {
                    Bson::Array(items) if !items.is_empty() => s.enumeration = Some(items.clone()),
                    _ => return Err(fail("$jsonSchema keyword 'enum' must be a nonempty array")),
                },
                "items" => {
                    s.items = Some(match v {
                        Bson::Array(_) => Items::Tuple(subs(v, k, depth)?),
                        _ => Items::All(Box::new(sub(v, k, depth)?)),
                    })
                }
                "additionalItems" => s.additional_items = Some(additional(v, k, depth)?),
                "minItems" => s.min_items = Some(count(v, k)?),
                "maxItems" => s.max_items = Some(count(v, k)?),
                "uniqueItems" => match v {
                    Bson::Boolean(b) => s.unique_items = *b,
                    _ => return Err(fail("$jsonSchema keyword 'uniqueItems' must be a boolean")),
                },
                "allOf" => s.all_of = subs(v, k, depth)?,
                "anyOf" => s.any_of = subs(v, k, depth)?,
                "oneOf" => s.one_of = subs(v, k, depth)?,
                "not" => s.not = Some(Box::new(sub(v, k, depth)?)),
                "dependencies" => {
                    let Bson::Document(deps) = v else {
                        return Err(fail("$jsonSchema keyword 'dependencies' must be an object"));
                    };
                    for (name, list) in deps {
                        match list {
                            Bson::Array(_) => s.dependencies.push((name.clone(), strings(list, k)?)),
                            _ => {
                                return Err(fail(
                                    "$jsonSchema schema dependencies are not supported by duetdb; use a property list",
                                ))
                            }
                        }
                    }
                }
                "title" | "description" => {
                    if !matches!(v, Bson::String(_)) {
                        return Err(fail(format!("$jsonSchema keyword '{k}' must be a string")));
                    }
                }
                "$ref" | "$schema" | "default" | "definitions" | "format" | "id" => {
                    return Err(fail(format!(
                        "$jsonSchema keyword '{k}' is not currently supported"
                    )))
                }
                other => return Err(fail(format!("Unknown $jsonSchema keyword: {other}"))),
            }
        }
        Ok(s)
    }

    /// Does `v` satisfy the schema?
    pub(super) fn matches(&self, v: &Bson) -> bool {
        if let Some(mask) = self.types {
            if mask & bit_of(v) == 0 {
                return false;
            }
        }
        if let Some(e) = &self.enumeration {
            if !e.iter().any(|x| compare(x, v) == Ordering::Equal) {
                return false;
            }
        }
        if !self.all_of.iter().all(|s| s.matches(v)) {
            return false;
        }
        if !self.any_of.is_empty() && !self.any_of.iter().any(|s| s.matches(v)) {
            return false;
        }
        if !self.one_of.is_empty() && self.one_of.iter().filter(|s| s.matches(v)).count() != 1 {
            return false;
        }
        if self.not.as_ref().is_some_and(|s| s.matches(v)) {
            return false;
        }
        match v {
            Bson::Document(d) => self.matches_object(d),
            Bson::Array(a) => self.matches_array(a),
            Bson::String(s) => self.matches_string(s),
            other if num_of(other).is_some() || matches!(other, Bson::Decimal128(_)) => {
                self.matches_number(other)
            }
            _ => true,
        }
    }

    fn matches_object(&self, d: &Document) -> bool {
        if !self.required.iter().all(|r| d.contains_key(r)) {
            return false;
        }
        if self.min_properties.is_some_and(|n| d.len() < n)
            || self.max_properties.is_some_and(|n| d.len() > n)
        {
            return false;
        }
        for (name, deps) in &self.dependencies {
            if d.contains_key(name) && !deps.iter().all(|x| d.contains_key(x)) {
                return false;
            }
        }
        for (k, v) in d {
            let mut covered = false;
            if let Some((_, s)) = self.properties.iter().find(|(n, _)| n == k) {
                covered = true;
                if !s.matches(v) {
                    return false;
                }
            }
            for (re, s) in &self.pattern_properties {
                // A backtracking match past its step limit counts as no match.
                if re.is_match(k).unwrap_or(false) {
                    covered = true;
                    if !s.matches(v) {
                        return false;
                    }
                }
            }
            if !covered {
                match &self.additional_properties {
                    Some(Additional::Allowed(false)) => return false,
                    Some(Additional::Schema(s)) if !s.matches(v) => return false,
                    _ => {}
                }
            }
        }
        true
    }

    fn matches_array(&self, a: &[Bson]) -> bool {
        if self.min_items.is_some_and(|n| a.len() < n)
            || self.max_items.is_some_and(|n| a.len() > n)
        {
            return false;
        }
        if self.unique_items {
            for (i, x) in a.iter().enumerate() {
                if a.iter()
                    .skip(i + 1)
                    .any(|y| compare(x, y) == Ordering::Equal)
                {
                    return false;
                }
            }
        }
        match &self.items {
            Some(Items::All(s)) => a.iter().all(|x| s.matches(x)),
            Some(Items::Tuple(ss)) => {
                if !a.iter().zip(ss).all(|(x, s)| s.matches(x)) {
                    return false;
                }
                match &self.additional_items {
                    Some(Additional::Allowed(false)) => a.len() <= ss.len(),
                    Some(Additional::Schema(s)) => a.iter().skip(ss.len()).all(|x| s.matches(x)),
                    _ => true,
                }
            }
            None => true,
        }
    }

    fn matches_string(&self, s: &str) -> bool {
        let n = s.chars().count();
        if self.min_length.is_some_and(|m| n < m) || self.max_length.is_some_and(|m| n > m) {
            return false;
        }
        self.pattern
            .as_ref()
            .is_none_or(|re| re.is_match(s).unwrap_or(false))
    }

    fn matches_number(&self, v: &Bson) -> bool {
        if let Some((min, excl)) = &self.minimum {
            let c = compare(v, min);
            if c == Ordering::Less || (*excl && c == Ordering::Equal) {
                return false;
            }
        }
        if let Some((max, excl)) = &self.maximum {
            let c = compare(v, max);
            if c == Ordering::Greater || (*excl && c == Ordering::Equal) {
                return false;
            }
        }
        if let Some(m) = self.multiple_of {
            let x = num_of(v).map_or_else(
                || match v {
                    Bson::Decimal128(d) => crate::doc::value::decimal_to_f64(*d),
                    _ => f64::NAN,
                },
                |n| n.to_f64(),
            );
            if (x / m).fract() != 0.0 {
                return false;
            }
        }
        true
    }
}
