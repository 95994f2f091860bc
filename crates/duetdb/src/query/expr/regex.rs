//! `$regexMatch`, `$regexFind`, `$regexFindAll`.
//!
//! Owns: compiling the pattern (`query/pattern.rs`, as the filter's
//! `$regex`: backreferences and look-around by bounded backtracking, a
//! match past the step limit is 51156 as PCRE2's match limit is in MongoDB;
//! syntax errors read in PCRE2's words, `query/pcre_words.rs`, 51111) and
//! the result shapes `{match, idx, captures}`, where `idx` counts code
//! points and an unmatched group is null.
//!
//! Invariants: a null or missing input gives `false` / null / `[]`; options
//! may come from a BSON regex or from `options`, not both (51107); the last
//! compiled pattern is cached per thread, since the pattern is nearly always
//! a constant; compiled size is bounded like the filter's.

use std::cell::RefCell;

use bson::{doc, Bson};

use crate::error::Result;
use crate::query::expr::eval::Args;
use crate::query::expr::{is_nullish, Named, Value};
use crate::query::pattern::{self, CompileError, EachError, Groups, MatchError, Pattern};

thread_local! {
    static LAST: RefCell<Option<(String, String, Pattern)>> = const { RefCell::new(None) };
}

fn compile(name: &str, pattern: &str, options: &str) -> Result<Pattern> {
    let hit = LAST.with(|l| {
        l.borrow()
            .as_ref()
            .filter(|(p, o, _)| p == pattern && o == options)
            .map(|(_, _, r)| r.clone())
    });
    if let Some(r) = hit {
        return Ok(r);
    }
    if let Some(other) = options
        .chars()
        .find(|c| !matches!(c, 'i' | 'm' | 's' | 'x' | 'u'))
    {
        return Err(loc!(51108, "{name} invalid flag in regex options: {other}"));
    }
    if pattern.contains('\0') {
        return Err(loc!(
            51109,
            "{name}: regular expression cannot contain an embedded null byte"
        ));
    }
    let re = pattern::compile(pattern, options).map_err(|e| match e {
        CompileError::Syntax(e) => loc!(
            51111,
            "Invalid Regex in {name}: {}",
            crate::query::pcre_words::compile_error(pattern, options, &e)
        ),
        CompileError::Flag(other) => loc!(51108, "{name} invalid flag in regex options: {other}"),
    })?;
    LAST.with(|l| *l.borrow_mut() = Some((pattern.to_string(), options.to_string(), re.clone())));
    Ok(re)
}

/// MongoDB's 51156 for a match that failed while running (PCRE2's match
/// limit there; the backtracking step limit here).
fn failed(name: &str, e: MatchError) -> crate::error::Error {
    loc!(
        51156,
        "Error occurred while executing the regular expression in {name}. Result code: {}",
        e.0
    )
}

/// The pattern and options of `regex` and `options` as given (`None`: no
/// pattern, null or missing), with MongoDB's type checks.
fn pattern_of(name: &str, regex: &Value, options: &Value) -> Result<(Option<String>, String)> {
    let (pattern, mut opts) = match regex {
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
    match options {
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
    Ok((pattern, opts))
}

/// MongoDB compiles a constant `regex` (with constant or no `options`) once,
/// when the pipeline is optimized, before it runs: its errors are the
/// optimizer's, reported bare (`Error::Optimize`), even when the operator
/// would never be evaluated.
pub(super) fn precompile(n: Named, regex: &Bson, options: Option<&Bson>) -> Result<()> {
    let (pattern, opts) = pattern_of(n.name(), &Some(regex.clone()), &options.cloned())?;
    if let Some(p) = pattern {
        compile(n.name(), &p, &opts)?;
    }
    Ok(())
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
    let (pattern, opts) = pattern_of(name, &regex, &options)?;
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
        Named::RegexMatch => Ok(Some(Bson::Boolean(
            re.is_match(s).map_err(|e| failed(name, e))?,
        ))),
        Named::RegexFind => Ok(Some(match re.captures(s).map_err(|e| failed(name, e))? {
            Some(g) => found(s, &g),
            None => Bson::Null,
        })),
        _ => {
            let mut out = Vec::new();
            let mut size = crate::doc::size::SizeBudget::new(name);
            re.each_captures(s, |g| {
                let f = found(s, &g);
                size.add(crate::doc::size::array_element_len(out.len(), &f))?;
                out.push(f);
                Ok(())
            })
            .map_err(|e| match e {
                EachError::Match(e) => failed(name, e),
                EachError::Caller(e) => e,
            })?;
            Ok(Some(Bson::Array(out)))
        }
    }
}

fn found(s: &str, g: &Groups) -> Bson {
    let Some(Some((start, end))) = g.first().copied() else {
        return Bson::Null;
    };
    let text = |(a, b): (usize, usize)| s.get(a..b).unwrap_or_default().to_string();
    let idx = s.get(..start).map_or(0, |p| p.chars().count());
    let captures: Vec<Bson> = g
        .iter()
        .skip(1)
        .map(|m| m.map_or(Bson::Null, |m| Bson::String(text(m))))
        .collect();
    Bson::Document(doc! {
        "match": text((start, end)),
        "idx": i32::try_from(idx).unwrap_or(i32::MAX),
        "captures": captures,
    })
}
