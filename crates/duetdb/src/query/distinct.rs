//! `distinct`: the set of values a path reaches among matching documents
//! (arrays contribute their elements), in BSON order, by MongoDB equality.

use bson::{Bson, RawBson, RawBsonRef, RawDocument};

use crate::doc::{path, value};
use crate::error::{Error, Result};

/// MongoDB's limit on a distinct result (it must fit one 16 MiB reply).
pub const MAX_DISTINCT_BYTES: usize = 16 * 1024 * 1024;

/// Collects the values of one path, fed one document at a time.
#[derive(Debug)]
pub struct Distinct {
    path: String,
    vals: Vec<RawBson>,
    /// Values equal under it are one (the smallest in binary order is kept).
    collator: Option<std::sync::Arc<crate::doc::collation::Collator>>,
}

impl Distinct {
    /// Refuses an invalid path (empty, empty component, `$` prefix).
    pub fn new(path: &str) -> Result<Distinct> {
        path::validate(path).map_err(Error::BadValue)?;
        Ok(Distinct {
            path: path.to_string(),
            vals: Vec::new(),
            collator: None,
        })
    }

    /// Deduplicate (and order) under `c` (MongoDB's `collation` option).
    pub fn with_collation(
        mut self,
        c: Option<std::sync::Arc<crate::doc::collation::Collator>>,
    ) -> Distinct {
        self.collator = c;
        self
    }

    pub fn feed(&mut self, doc: &RawDocument) {
        for v in path::values(doc, &self.path) {
            match v {
                RawBsonRef::Array(a) => self.vals.extend(a.into_iter().flatten().map(Into::into)),
                other => self.vals.push(other.into()),
            }
        }
        // Keep memory proportional to distinct values, not to documents.
        if self.vals.len() >= 4096 && self.vals.len().is_power_of_two() {
            self.dedup();
        }
    }

    fn dedup(&mut self) {
        if let Some(c) = &self.collator {
            let c = c.clone();
            let cmp = |a: &RawBson, b: &RawBson| {
                c.compare(a.as_raw_bson_ref(), b.as_raw_bson_ref())
                    .then_with(|| value::compare(a.as_raw_bson_ref(), b.as_raw_bson_ref()))
            };
            self.vals.sort_by(cmp);
            self.vals
                .dedup_by(|a, b| c.compare(a.as_raw_bson_ref(), b.as_raw_bson_ref()).is_eq());
            return;
        }
        self.vals
            .sort_by(|a, b| value::compare(a.as_raw_bson_ref(), b.as_raw_bson_ref()));
        self.vals
            .dedup_by(|a, b| value::equal(a.as_raw_bson_ref(), b.as_raw_bson_ref()));
    }

    /// The distinct values in BSON order; refuses a result over 16 MiB
    /// (code 17217, as MongoDB).
    pub fn finish(mut self) -> Result<Vec<Bson>> {
        self.dedup();
        let bytes: usize = self.vals.iter().map(raw_size).sum();
        if bytes > MAX_DISTINCT_BYTES {
            return Err(Error::BadValue(format!(
                "distinct too big, {bytes} bytes; the limit is 16 MB"
            )));
        }
        self.vals
            .into_iter()
            .map(|v| Bson::try_from(v).map_err(|e| Error::InvalidBson(e.to_string())))
            .collect()
    }
}

fn raw_size(v: &RawBson) -> usize {
    match v {
        RawBson::String(s) => s.len() + 8,
        RawBson::Document(d) => d.as_bytes().len() + 4,
        RawBson::Array(a) => a.as_bytes().len() + 4,
        RawBson::Binary(b) => b.bytes.len() + 8,
        _ => 16,
    }
}
