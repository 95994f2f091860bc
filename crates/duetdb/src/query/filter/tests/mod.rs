//! Tests of query filters, by concern: what documents a filter matches
//! (`matching`), what it refuses to parse (`errors`), the index bounds it offers
//! the planner (`sarg`), and property tests against a deliberately simple
//! evaluator (`reference`): of `Filter::matches` (`props`) and of a
//! collection validator's verdict under each level and action
//! (`validation`). The helpers here are shared by all of them.

use bson::{Bson, Document, RawDocumentBuf};

use super::Filter;

mod errors;
mod expr_bits_schema;
mod matching;
mod props;
mod reference;
mod sarg;
mod validation;

fn parse(f: Document) -> Filter {
    Filter::parse(&f).unwrap_or_else(|e| panic!("parse {f}: {e}"))
}

fn raw(d: &Document) -> RawDocumentBuf {
    RawDocumentBuf::try_from(d).expect("encodable document")
}

fn m(f: Document, d: Document) -> bool {
    parse(f).matches(&raw(&d))
}

/// Assert which of `docs` match `f`.
fn check(f: Document, yes: &[Document], no: &[Document]) {
    let filter = parse(f.clone());
    for d in yes {
        assert!(filter.matches(&raw(d)), "{f} should match {d}");
    }
    for d in no {
        assert!(!filter.matches(&raw(d)), "{f} should not match {d}");
    }
}

fn err(f: Document) -> String {
    match Filter::parse(&f) {
        Ok(_) => panic!("{f} should not parse"),
        Err(e) => e.to_string(),
    }
}

fn re(pattern: &str, options: &str) -> Bson {
    Bson::RegularExpression(bson::Regex {
        pattern: pattern.to_string().try_into().expect("cstring"),
        options: options.to_string().try_into().expect("cstring"),
    })
}
