//! `$regexMatch`, `$regexFind`, `$regexFindAll`.
//!
//! Owns: compiling the pattern (the `regex` crate, as the filter's `$regex`:
//! no backreferences or lookaround — refused with 51111 "Invalid Regex",
//! a documented gap; other syntax errors read in PCRE2's words, as
//! MongoDB's, `query/pcre_words.rs`) and the result shapes `{match, idx, captures}`, where
//! `idx` counts code points and an unmatched group is null.
//!
//! Invariants: a null or missing input gives `false` / null / `[]`; options
//! may come from a BSON regex or from `options`, not both (51107); the last
//! compiled pattern is cached per thread, since the pattern is nearly always
//! a constant; compiled size is bounded like the filter's.

use std::cell::RefCell;

use bson::{doc, Bson};
use regex::{Regex, RegexBuilder};

use crate::error::Result;
use crate::query::expr::eval::Args;
use crate::query::expr::{is_nullish, Named, Value};

/// Compiled size bound of one pattern (as the filter's `$regex`).
const REGEX_SIZE_LIMIT: usize = 1 << 20;

thread_local! {
    static LAST: RefCell<Option<(String, String, Regex)>> = const { RefCell::new(None) };
}

fn compile(name: &str, pattern: &str, options: &str) -> Result<Regex> {
    let hit = LAST.with(|l| {
        l.borrow()
            .as_ref()
            .filter(|(p, o, _)| p == pattern && o == options)
            .map(|(_, _, r)| r.clone())
    });
    if let Some(r) = hit {
        return Ok(r);
    }
    let mut b = RegexBuilder::new(pattern);
    b.size_limit(REGEX_SIZE_LIMIT);
    for c in options.chars() {
        match c {
            'i' => b.case_insensitive(true),
            'm' => b.multi_line(true),
            's' => b.dot_matches_new_line(true),
            'x' => b.ignore_whitespace(true),
            'u' => &mut b,
            other => return Err(loc!(51108, "{name} invalid flag in regex options: {other}")),
        };
    }
    if pattern.contains('\0') {
        return Err(loc!(
            51109,
            "{name}: regular expression cannot contain an embedded null byte"
        ));
    }
    let re = b.build().map_err(|e| {
        loc!(
            51111,
            "Invalid Regex in {name}: {}",
            crate::query::pcre_words::compile_error(pattern, options, &e)
        )
    })?;
    LAST.with(|l| *l.borrow_mut() = Some((pattern.to_string(), options.to_string(), re.clone())));
    Ok(re)
}

/// Evaluate `$regexMatch` / `$regexFind` / `$regexFindAll`.
pub(super) fn named(a: &Args<'_, '_>) -> Result<Value> {
    let name = a.name();
    let empty = || -> Result<Value> {
        Ok(Some(match a.n {
            Named::RegexMatch => Bson::Boolean(false),
            Named::RegexFind => Bson::Null,
            _ => Bson::Array(Vec::new()),
        }))
    };
    let input = a.get("input")?;
    let regex = a.get("regex")?;
    let options = a.get("options")?;
    let (pattern, mut opts) = match &regex {
        v if is_nullish(v) => (None, String::new()),
        Some(Bson::String(s)) => (Some(s.clone()), String::new()),
        Some(Bson::RegularExpression(r)) => (Some(r.pattern.to_string()), r.options.to_string()),
        _ => {
            return Err(loc!(
                51105,
                "{name} needs 'regex' to be of type string or regex"
            ))
        }
    };
    match &options {
        v if is_nullish(v) => {}
        Some(Bson::String(o)) => {
            if !opts.is_empty() {
                return Err(loc!(
                    51107,
                    "{name} found regex option(s) specified in both 'regex' and 'option' fields"
                ));
            }
            opts = o.clone();
        }
        _ => return Err(loc!(51106, "{name} needs 'options' to be of type string")),
    }
    if is_nullish(&input) {
        return empty();
    }
    let Some(Bson::String(s)) = &input else {
        return Err(loc!(51104, "{name} needs 'input' to be of type string"));
    };
    let Some(pattern) = pattern else {
        return empty();
    };
    let re = compile(name, &pattern, &opts)?;
    match a.n {
        Named::RegexMatch => Ok(Some(Bson::Boolean(re.is_match(s)))),
        Named::RegexFind => Ok(Some(match re.captures(s) {
            Some(c) => found(s, &c),
            None => Bson::Null,
        })),
        _ => {
            let mut out = Vec::new();
            let mut size = crate::doc::size::SizeBudget::new(name);
            for c in re.captures_iter(s) {
                let f = found(s, &c);
                size.add(crate::doc::size::array_element_len(out.len(), &f))?;
                out.push(f);
            }
            Ok(Some(Bson::Array(out)))
        }
    }
}

fn found(s: &str, c: &regex::Captures<'_>) -> Bson {
    let Some(m) = c.get(0) else {
        return Bson::Null;
    };
    let idx = s.get(..m.start()).map_or(0, |p| p.chars().count());
    let captures: Vec<Bson> = c
        .iter()
        .skip(1)
        .map(|g| g.map_or(Bson::Null, |g| Bson::String(g.as_str().to_string())))
        .collect();
    Bson::Document(doc! {
        "match": m.as_str(),
        "idx": i32::try_from(idx).unwrap_or(i32::MAX),
        "captures": captures,
    })
}
