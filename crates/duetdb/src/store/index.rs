//! Secondary indexes: specifications (key pattern and options: unique,
//! sparse, partial filter, TTL, hashed and wildcard kinds), key extraction and
//! the key order.
//!
//! An index is a persistent [`BTree`] over `(IndexKey, RecordId)` entries (the
//! record id makes entries of equal keys distinct and orders them), plus its spec.
//!
//! Invariants:
//! - the tree holds exactly the keys [`IndexSpec::keys_for`] yields for every
//!   stored document, once each (duplicates within one document are collapsed);
//! - for a `unique` index no two different records share a key;
//! - keys compare part by part with [`crate::doc::value::compare`], a descending part
//!   reversed; the [`KeyPart::Low`]/[`KeyPart::High`] sentinels never reach the tree:
//!   they only build range bounds;
//! - `multikey` is set once any document produced more than one key or reached a
//!   value through an array, and never cleared (range bounds must then stay one-sided);
//!   a wildcard index is multikey from its first key;
//! - a document the index does not hold (its partial filter does not match it,
//!   or a sparse index's fields are all missing) has no entry at all, so
//!   uniqueness holds among the held documents only;
//! - a hashed field's key part is `Int64(hash64(value))` (missing: the hash
//!   of null), never an array's: arrays there are refused;
//! - a wildcard key is `(String(path), value)`, see [`crate::store::wildcard`];
//! - a text key is `(prefix values…, String(term), suffix values…)`: the
//!   compound fields hold single values (an array there is refused, 171),
//!   see [`IndexSpec::text`];
//! - a 2dsphere field's key parts are S2 cell ids ([`crate::store::geo::cell_key`]):
//!   one per cell of each shape the field holds; a document without the
//!   field (or with null there) has no entry (MongoDB's 2dsphere v2+ rule),
//!   and one whose field is not a valid shape is refused (16755).
//! - [`IndexUsage`] is shared by every version of one index (an `Arc`): it
//!   counts the reads that used it since it was built or loaded (`$indexStats`'
//!   `accesses`), is never checkpointed and restarts at 0, as MongoDB's.

use std::cmp::Ordering;
use std::sync::atomic::{AtomicU64, Ordering as AtomicOrdering};
use std::sync::Arc;
use std::time::SystemTime;

use bson::raw::RawDocument;
use bson::{Bson, Document, RawBson, RawBsonRef};

use crate::doc::collation::{self, Collator};
use crate::doc::value;
use crate::error::{Error, Result};
use crate::store::btree::BTree;
use crate::store::delta::{DeltaLayer, IndexRange};
use crate::store::heap::RecordId;
pub use crate::store::text::TextSpec;
pub use crate::store::wildcard::{WildcardProjection, WildcardSpec};

/// The field name standing for the term in a text index's `fields` (MongoDB's
/// `_fts`; a real field of that name cannot be indexed).
pub const TEXT_MARKER: &str = "_fts";
/// Most fields in one compound index (MongoDB's limit).
pub const MAX_INDEX_FIELDS: usize = 32;
/// Most keys one document may produce for one index (bounds multikey fan-out).
pub const MAX_KEYS_PER_DOC: usize = 100_000;

/// One component of an index key.
#[derive(Debug, Clone)]
pub enum KeyPart {
    /// Sorts before every value, whatever the direction (range bounds only).
    Low,
    Val(RawBson),
    /// Sorts after every value, whatever the direction (range bounds only).
    High,
}

/// A whole index key; `desc` bit i reverses part i.
///
/// A key of one part (every single-field index) holds it inline, as a
/// compact [`ValueKey`]: comparing two keys in a node's binary search then
/// reads only the node, and a write that shadows the node copies its keys
/// without touching any other allocation. Longer keys share their parts
/// (`Arc`), so a clone costs a reference-count increment, not an allocation.
#[derive(Debug, Clone)]
pub struct IndexKey {
    parts: Parts,
    pub desc: u32,
}

#[derive(Debug, Clone)]
enum Parts {
    One(Part),
    Many(Arc<[Part]>),
}

/// A [`KeyPart`] as an index key holds it.
#[derive(Debug, Clone)]
enum Part {
    Low,
    Val(ValueKey),
    High,
}

impl From<KeyPart> for Part {
    fn from(p: KeyPart) -> Part {
        match p {
            KeyPart::Low => Part::Low,
            KeyPart::Val(v) => Part::Val(ValueKey::from(v)),
            KeyPart::High => Part::High,
        }
    }
}

impl IndexKey {
    /// The key of `parts` (in field order) under the direction bits `desc`.
    pub fn new(parts: Vec<KeyPart>, desc: u32) -> IndexKey {
        let parts = match <[KeyPart; 1]>::try_from(parts) {
            Ok([part]) => Parts::One(part.into()),
            Err(parts) => Parts::Many(parts.into_iter().map(Part::from).collect()),
        };
        IndexKey { parts, desc }
    }

    fn parts(&self) -> &[Part] {
        match &self.parts {
            Parts::One(p) => std::slice::from_ref(p),
            Parts::Many(ps) => ps,
        }
    }

    /// How many parts the key has (its index's fields).
    pub fn len(&self) -> usize {
        self.parts().len()
    }

    /// Never true for a key of an index (an index has at least one field).
    pub fn is_empty(&self) -> bool {
        self.parts().is_empty()
    }

    /// Part `i`'s value; `None` for a range sentinel or past the end.
    pub fn value(&self, i: usize) -> Option<RawBsonRef<'_>> {
        match self.parts().get(i)? {
            Part::Val(v) => Some(v.as_raw_ref()),
            Part::Low | Part::High => None,
        }
    }

    /// Bytes this key owns outside itself (memory accounting).
    pub fn out_of_line_bytes(&self) -> usize {
        let values = self
            .parts()
            .iter()
            .map(|p| match p {
                Part::Val(v) => v.out_of_line_bytes(),
                Part::Low | Part::High => 0,
            })
            .sum::<usize>();
        match &self.parts {
            Parts::One(_) => values,
            Parts::Many(ps) => {
                2 * std::mem::size_of::<usize>() + std::mem::size_of_val::<[Part]>(ps) + values
            }
        }
    }

    fn cmp_parts(&self, other: &Self) -> Ordering {
        let (a, b) = (self.parts(), other.parts());
        for (i, (a, b)) in a.iter().zip(b.iter()).enumerate() {
            let ord = match (a, b) {
                (Part::Low, Part::Low) | (Part::High, Part::High) => Ordering::Equal,
                (Part::Low, _) | (_, Part::High) => Ordering::Less,
                (_, Part::Low) | (Part::High, _) => Ordering::Greater,
                (Part::Val(x), Part::Val(y)) => {
                    let o = x.cmp(y);
                    if self.desc & (1 << i) != 0 {
                        o.reverse()
                    } else {
                        o
                    }
                }
            };
            if ord != Ordering::Equal {
                return ord;
            }
        }
        a.len().cmp(&b.len())
    }

    /// The key as a document `{field: value, …}` (for error messages and explain).
    pub fn to_document(&self, spec: &IndexSpec) -> Document {
        let mut d = Document::new();
        for ((path, _), part) in spec.fields.iter().zip(self.parts()) {
            let v = match part {
                Part::Low => Bson::MinKey,
                Part::High => Bson::MaxKey,
                Part::Val(v) => Bson::try_from(v.to_raw()).unwrap_or(Bson::Null),
            };
            d.insert(path.clone(), v);
        }
        d
    }
}

impl PartialEq for IndexKey {
    fn eq(&self, other: &Self) -> bool {
        self.cmp_parts(other) == Ordering::Equal
    }
}
impl Eq for IndexKey {}
impl PartialOrd for IndexKey {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for IndexKey {
    fn cmp(&self, other: &Self) -> Ordering {
        self.cmp_parts(other)
    }
}

/// A single BSON value ordered by MongoDB's order: the `_id` index key, and
/// the key of a one-field secondary index ([`IndexKey`]).
///
/// 32 bytes, where a `RawBson` is 56: the common key types (32- and 64-bit
/// integers, doubles, dates, booleans, null, ObjectIds, strings — inline up
/// to [`SHORT_STR`] bytes) are kept inline and everything else behind an
/// `Arc`, so a B+tree node of these keys spans fewer cache lines, and a
/// write that shadows a node copies its keys without allocating. Ordered
/// exactly as `value::compare` orders the values they stand for.
#[derive(Clone)]
pub enum ValueKey {
    Int32(i32),
    Int64(i64),
    Double(f64),
    DateTime(i64),
    Bool(bool),
    Null,
    ObjectId([u8; 12]),
    /// A string of at most [`SHORT_STR`] bytes, inline: comparing two of them
    /// touches no other cache line (YCSB's `user…` keys are 23 bytes, hex
    /// ObjectId strings 24).
    ShortStr(ShortStr),
    Str(Arc<str>),
    Other(Arc<RawBson>),
}

/// The longest string a [`ValueKey`] holds inline.
pub const SHORT_STR: usize = 30;

/// The bytes of a string of at most [`SHORT_STR`] bytes; always UTF-8
/// (built only from a `&str`).
#[derive(Clone, Copy)]
pub struct ShortStr {
    len: u8,
    bytes: [u8; SHORT_STR],
}

impl ShortStr {
    fn new(s: &str) -> Option<ShortStr> {
        let len = s.len();
        if len > SHORT_STR {
            return None;
        }
        let mut bytes = [0; SHORT_STR];
        bytes[..len].copy_from_slice(s.as_bytes());
        Some(ShortStr {
            len: len as u8,
            bytes,
        })
    }

    fn as_bytes(&self) -> &[u8] {
        &self.bytes[..usize::from(self.len)]
    }

    fn as_str(&self) -> &str {
        let s = std::str::from_utf8(self.as_bytes());
        debug_assert!(s.is_ok(), "a ShortStr is built from a &str");
        s.unwrap_or_default()
    }
}

/// The key of a string value: inline when short enough.
fn str_key(s: &str) -> ValueKey {
    match ShortStr::new(s) {
        Some(short) => ValueKey::ShortStr(short),
        None => ValueKey::Str(s.into()),
    }
}

impl From<RawBson> for ValueKey {
    fn from(v: RawBson) -> Self {
        // A value kept whole is moved into its `Arc`, not copied.
        ValueKey::inline(v.as_raw_bson_ref()).unwrap_or_else(|| ValueKey::Other(Arc::new(v)))
    }
}

impl From<&RawBson> for ValueKey {
    fn from(v: &RawBson) -> Self {
        ValueKey::from(v.as_raw_bson_ref())
    }
}

impl From<RawBsonRef<'_>> for ValueKey {
    fn from(v: RawBsonRef<'_>) -> Self {
        ValueKey::inline(v).unwrap_or_else(|| ValueKey::Other(Arc::new(RawBson::from(v))))
    }
}

impl ValueKey {
    /// The key of `v` when it is one of the kinds held without an `Arc` of
    /// the whole value (a long string is, in an `Arc<str>`).
    fn inline(v: RawBsonRef<'_>) -> Option<ValueKey> {
        Some(match v {
            RawBsonRef::Int32(i) => ValueKey::Int32(i),
            RawBsonRef::Int64(i) => ValueKey::Int64(i),
            RawBsonRef::Double(d) => ValueKey::Double(d),
            RawBsonRef::DateTime(d) => ValueKey::DateTime(d.timestamp_millis()),
            RawBsonRef::Boolean(b) => ValueKey::Bool(b),
            RawBsonRef::Null => ValueKey::Null,
            RawBsonRef::ObjectId(o) => ValueKey::ObjectId(o.bytes()),
            RawBsonRef::String(s) => str_key(s),
            _ => return None,
        })
    }

    /// The value, borrowed.
    pub fn as_raw_ref(&self) -> RawBsonRef<'_> {
        match self {
            ValueKey::Int32(i) => RawBsonRef::Int32(*i),
            ValueKey::Int64(i) => RawBsonRef::Int64(*i),
            ValueKey::Double(d) => RawBsonRef::Double(*d),
            ValueKey::DateTime(d) => RawBsonRef::DateTime(bson::DateTime::from_millis(*d)),
            ValueKey::Bool(b) => RawBsonRef::Boolean(*b),
            ValueKey::Null => RawBsonRef::Null,
            ValueKey::ObjectId(b) => RawBsonRef::ObjectId(bson::oid::ObjectId::from_bytes(*b)),
            ValueKey::ShortStr(s) => RawBsonRef::String(s.as_str()),
            ValueKey::Str(s) => RawBsonRef::String(s),
            ValueKey::Other(v) => v.as_raw_bson_ref(),
        }
    }

    /// The value, owned.
    pub fn to_raw(&self) -> RawBson {
        match self {
            ValueKey::Other(v) => (**v).clone(),
            _ => RawBson::from(self.as_raw_ref()),
        }
    }

    /// Bytes this key owns outside itself (memory accounting; an `Arc`
    /// shared by several versions' nodes counts in full for each).
    pub fn out_of_line_bytes(&self) -> usize {
        const ARC_COUNTS: usize = 2 * std::mem::size_of::<usize>();
        match self {
            ValueKey::Str(s) => ARC_COUNTS + s.len(),
            ValueKey::Other(v) => {
                ARC_COUNTS + std::mem::size_of::<RawBson>() + raw_bson_out_of_line(v)
            }
            _ => 0,
        }
    }
}

/// Bytes a key value owns outside the node (strings, embedded documents,
/// binary). Approximate: regexes and code-with-scope count 0.
pub(crate) fn raw_bson_out_of_line(v: &RawBson) -> usize {
    match v {
        RawBson::String(s) | RawBson::Symbol(s) | RawBson::JavaScriptCode(s) => s.capacity(),
        RawBson::Document(d) => d.as_bytes().len(),
        RawBson::Array(a) => a.as_bytes().len(),
        RawBson::Binary(b) => b.bytes.capacity(),
        _ => 0,
    }
}

impl std::fmt::Debug for ValueKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("ValueKey").field(&self.as_raw_ref()).finish()
    }
}

impl PartialEq for ValueKey {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}
impl Eq for ValueKey {}
impl PartialOrd for ValueKey {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for ValueKey {
    fn cmp(&self, other: &Self) -> Ordering {
        // Fast paths for the common `_id` types (same results as `value::compare`).
        match (self, other) {
            (ValueKey::Int64(a), ValueKey::Int64(b)) => a.cmp(b),
            (ValueKey::Int32(a), ValueKey::Int32(b)) => a.cmp(b),
            (ValueKey::ObjectId(a), ValueKey::ObjectId(b)) => a.cmp(b),
            (ValueKey::ShortStr(a), ValueKey::ShortStr(b)) => a.as_bytes().cmp(b.as_bytes()),
            (ValueKey::ShortStr(a), ValueKey::Str(b)) => a.as_bytes().cmp(b.as_bytes()),
            (ValueKey::Str(a), ValueKey::ShortStr(b)) => a.as_bytes().cmp(b.as_bytes()),
            (ValueKey::Str(a), ValueKey::Str(b)) => a.as_bytes().cmp(b.as_bytes()),
            (a, b) => value::compare(a.as_raw_ref(), b.as_raw_ref()),
        }
    }
}

/// How an index forms its keys, beyond its fields' directions.
#[derive(Debug, Clone, PartialEq)]
pub enum IndexKind {
    /// Ascending and descending fields: the values themselves.
    Ordered,
    /// Field `pos` holds MongoDB's 64-bit hash of its value
    /// ([`crate::store::hashed::hash64`]); arrays there are refused.
    Hashed { pos: usize },
    /// `$**` / `path.$**`: one `(path, value)` key per covered leaf; `fields`
    /// holds the single pattern field.
    Wildcard(Box<WildcardSpec>),
    /// A text index: one key per distinct term of the document's indexed
    /// strings ([`crate::store::text`]). `fields` is the prefix fields, then
    /// `("_fts", true)` (the term's place), then the suffix fields: a key is
    /// `(prefix values…, term, suffix values…)`, so a `$text` query with
    /// equalities on every prefix field reads one contiguous range per term.
    /// Used only by `$text` queries, never by the planner.
    Text(Box<TextSpec>),
    /// A 2dsphere index: field `pos` holds S2 cell ids of the shapes there
    /// ([`crate::store::geo`]); the other fields are ordered values.
    Geo { pos: usize },
}

/// A document predicate decided above the store (the query layer parses a
/// `partialFilterExpression` into one); the store only asks it.
pub trait DocPredicate: Send + Sync + std::fmt::Debug {
    fn matches(&self, doc: &RawDocument) -> bool;
}

/// A partial index's filter: only documents it matches are indexed.
#[derive(Debug, Clone)]
pub struct PartialFilter {
    /// As given (reported by `listIndexes`, stored in the WAL and checkpoints).
    pub expr: Document,
    /// The paths it reads (an update touching one may change membership).
    pub paths: Vec<String>,
    pub pred: Arc<dyn DocPredicate>,
}

impl PartialEq for PartialFilter {
    fn eq(&self, other: &Self) -> bool {
        self.expr == other.expr
    }
}

/// What an index is over.
#[derive(Debug, Clone, PartialEq)]
pub struct IndexSpec {
    pub name: String,
    /// `(path, ascending)` in key order (a hashed or wildcard field: `true`).
    pub fields: Vec<(String, bool)>,
    pub unique: bool,
    pub kind: IndexKind,
    /// Documents lacking every indexed field are not indexed.
    pub sparse: bool,
    /// Only documents matching it are indexed.
    pub partial: Option<Box<PartialFilter>>,
    /// TTL: documents whose (earliest) date in the field is older than this
    /// many seconds are deleted by the TTL monitor.
    pub expire_after_seconds: Option<i64>,
    /// The index's collation: its string keys are collation keys
    /// (`doc::collation`), so a query uses it for string bounds only under
    /// the same collation. `None`: simple (binary).
    pub collation: Option<Arc<Collator>>,
}

/// Largest `expireAfterSeconds` (MongoDB's: a 32-bit signed integer).
pub const MAX_EXPIRE_AFTER_SECONDS: i64 = i32::MAX as i64;

impl IndexSpec {
    /// Parse `keys` (`{a: 1, "b.c": -1}`, `{a: "hashed"}`, `{"$**": 1}`) with
    /// an optional name and unique flag; no other options.
    pub fn new(keys: &Document, name: Option<&str>, unique: bool) -> Result<IndexSpec> {
        if keys.is_empty() {
            return Err(Error::CannotCreateIndex(
                "index key pattern must not be empty".into(),
            ));
        }
        if keys.len() > MAX_INDEX_FIELDS {
            return Err(Error::CannotCreateIndex(format!(
                "an index may have at most {MAX_INDEX_FIELDS} fields"
            )));
        }
        let mut fields: Vec<(String, bool)> = Vec::with_capacity(keys.len());
        let mut hashed = None;
        let mut geo = None;
        let mut wildcard = None;
        for (path, dir) in keys {
            let is_wildcard = path == "$**" || path.ends_with(".$**");
            if is_wildcard {
                if keys.len() > 1 {
                    return Err(Error::CannotCreateIndex(
                        "compound wildcard indexes are not supported by duetdb".into(),
                    ));
                }
                if !matches!(dir, Bson::Int32(1) | Bson::Int64(1))
                    && !matches!(dir, Bson::Double(d) if *d == 1.0)
                {
                    return Err(Error::CannotCreateIndex(format!(
                        "a wildcard index key must be 1, not {dir}"
                    )));
                }
                let prefix = path.strip_suffix(".$**").map(str::to_string);
                if let Some(p) = &prefix {
                    check_path(p)?;
                }
                wildcard = Some(WildcardSpec {
                    prefix,
                    projection: None,
                });
                fields.push((path.clone(), true));
                continue;
            }
            check_path(path)?;
            let asc = match dir {
                Bson::Int32(1) | Bson::Int64(1) => true,
                Bson::Int32(-1) | Bson::Int64(-1) => false,
                Bson::Double(d) if *d == 1.0 => true,
                Bson::Double(d) if *d == -1.0 => false,
                Bson::String(s) if s == "hashed" => {
                    if hashed.is_some() {
                        return Err(Error::CannotCreateIndex(
                            "A maximum of one index field is allowed to be hashed".into(),
                        ));
                    }
                    hashed = Some(fields.len());
                    true
                }
                Bson::String(s) if s == "2dsphere" => {
                    if geo.is_some() {
                        return Err(Error::CannotCreateIndex(
                            "duetdb supports one 2dsphere field per index".into(),
                        ));
                    }
                    geo = Some(fields.len());
                    true
                }
                Bson::String(s) if matches!(s.as_str(), "2d" | "geoHaystack") => {
                    return Err(Error::CannotCreateIndex(format!(
                        "index type '{s}' is not supported by duetdb: use a 2dsphere index"
                    )))
                }
                Bson::String(s) if s == "text" => {
                    return Err(Error::CannotCreateIndex(format!(
                        "index type '{s}' is not supported by duetdb"
                    )))
                }
                Bson::String(s) => {
                    return Err(Error::CannotCreateIndex(format!(
                        "Unknown index plugin '{s}'"
                    )))
                }
                other => {
                    return Err(Error::CannotCreateIndex(format!(
                        "bad index key direction for '{path}': {other}; use 1, -1 or \"hashed\""
                    )))
                }
            };
            if fields.iter().any(|(p, _)| p == path) {
                return Err(Error::CannotCreateIndex(format!(
                    "duplicate index field '{path}'"
                )));
            }
            fields.push((path.clone(), asc));
        }
        if hashed.is_some() && geo.is_some() {
            return Err(Error::CannotCreateIndex(
                "a 2dsphere index may not also have a hashed field".into(),
            ));
        }
        let kind = match (hashed, wildcard, geo) {
            (_, Some(w), _) => IndexKind::Wildcard(Box::new(w)),
            (Some(pos), None, _) => IndexKind::Hashed { pos },
            (None, None, Some(pos)) => IndexKind::Geo { pos },
            (None, None, None) => IndexKind::Ordered,
        };
        if unique && !matches!(kind, IndexKind::Ordered) {
            return Err(Error::CannotCreateIndex(match kind {
                IndexKind::Hashed { .. } => {
                    "Currently hashed indexes cannot guarantee uniqueness. Use a regular index."
                        .into()
                }
                IndexKind::Geo { .. } => {
                    "Index type '2dsphere' does not support the unique option".into()
                }
                _ => "Index type 'wildcard' does not support the unique option".into(),
            }));
        }
        let name = match name {
            Some("") => {
                return Err(Error::CannotCreateIndex(
                    "index name must not be empty".into(),
                ))
            }
            Some(n) => n.to_string(),
            None => default_name(keys),
        };
        Ok(IndexSpec {
            name,
            fields,
            unique,
            kind,
            sparse: false,
            partial: None,
            expire_after_seconds: None,
            collation: None,
        })
    }

    /// Is this the primary key pattern `{_id: 1}`?
    /// The primary key pattern `{_id: 1}`, simple: the `_id` index itself.
    /// A collated `{_id: 1}` is a secondary index (it enforces `_id`
    /// uniqueness and answers `_id` bounds under its collation, which the
    /// simple `_id` index cannot: docs/design.md §6.1).
    pub fn is_id_pattern(&self) -> bool {
        self.collation.is_none()
            && matches!(self.kind, IndexKind::Ordered)
            && self.fields.len() == 1
            && self.fields[0].0 == "_id"
            && self.fields[0].1
    }

    /// The collated `_id` index of a collection created with a non-simple
    /// default collation (`collation`): `{_id: 1}`, unique, named `_id_`,
    /// kept beside the simple primary index (`CollectionState::id_index`,
    /// which every exact `_id` lookup keeps using) so that `_id`s equal
    /// under the collation conflict (11000 on `_id_`) and `_id` bounds
    /// under the collation have an index, as MongoDB's `_id` index that
    /// takes the collection's collation.
    pub fn collated_id(collation: Arc<Collator>) -> IndexSpec {
        IndexSpec {
            name: crate::store::collection::ID_INDEX_NAME.to_string(),
            fields: vec![("_id".to_string(), true)],
            unique: true,
            kind: IndexKind::Ordered,
            sparse: false,
            partial: None,
            expire_after_seconds: None,
            collation: Some(collation),
        }
    }

    /// Is this the collated `_id` index ([`IndexSpec::collated_id`])? Only
    /// it may carry the name `_id_` among the secondary indexes.
    pub fn is_collated_id(&self) -> bool {
        self.name == crate::store::collection::ID_INDEX_NAME
            && self.unique
            && self.collation.is_some()
            && matches!(self.kind, IndexKind::Ordered)
            && self.fields.len() == 1
            && self.fields[0] == ("_id".to_string(), true)
            && !self.sparse
            && self.partial.is_none()
            && self.expire_after_seconds.is_none()
    }

    /// The key pattern document (`{a: 1, b: -1}`, `{c: "hashed"}`, `{"$**": 1}`).
    pub fn key_pattern(&self) -> Document {
        let mut d = Document::new();
        if matches!(self.kind, IndexKind::Text(_)) {
            // MongoDB's stored form: the text fields become `_fts`/`_ftsx`
            // (they are listed in `weights`), the other keys stay in place.
            for (p, asc) in &self.fields {
                if p == TEXT_MARKER {
                    d.insert("_fts", "text");
                    d.insert("_ftsx", 1);
                } else {
                    d.insert(p.clone(), if *asc { 1 } else { -1 });
                }
            }
            return d;
        }
        for (i, (p, asc)) in self.fields.iter().enumerate() {
            if matches!(self.kind, IndexKind::Hashed { pos } if pos == i) {
                d.insert(p.clone(), "hashed");
            } else if matches!(self.kind, IndexKind::Geo { pos } if pos == i) {
                d.insert(p.clone(), "2dsphere");
            } else {
                d.insert(p.clone(), if *asc { 1 } else { -1 });
            }
        }
        d
    }

    /// The index as `listIndexes` reports it: `v`, `key`, `name`, then the
    /// options that were set, in MongoDB's names.
    pub fn to_document(&self) -> Document {
        let mut d = bson::doc! {"v": 2, "key": self.key_pattern(), "name": self.name.clone()};
        if self.unique {
            d.insert("unique", true);
        }
        if self.sparse {
            d.insert("sparse", true);
        }
        if let Some(p) = &self.partial {
            d.insert("partialFilterExpression", p.expr.clone());
        }
        if let Some(s) = self.expire_after_seconds {
            match i32::try_from(s) {
                Ok(i) => d.insert("expireAfterSeconds", i),
                Err(_) => d.insert("expireAfterSeconds", s),
            };
        }
        if let Some(c) = &self.collation {
            d.insert("collation", c.spec().to_document());
        }
        if let IndexKind::Wildcard(w) = &self.kind {
            if let Some(p) = &w.projection {
                d.insert("wildcardProjection", p.doc.clone());
            }
        }
        if let IndexKind::Text(t) = &self.kind {
            let mut weights = Document::new();
            for (p, w) in &t.weights {
                match i32::try_from(*w) {
                    Ok(i) => weights.insert(p.clone(), i),
                    Err(_) => weights.insert(p.clone(), *w),
                };
            }
            d.insert("weights", weights);
            d.insert("default_language", t.default_language.clone());
            d.insert("language_override", t.language_override.clone());
            d.insert("textIndexVersion", t.version);
        }
        if matches!(self.kind, IndexKind::Geo { .. }) {
            d.insert("2dsphereIndexVersion", crate::store::geo::INDEX_VERSION);
        }
        d
    }

    /// A text index named `name` (MongoDB's default: `title_text_body_text`)
    /// with the ordered keys `prefix` before the text fields and `suffix`
    /// after them (compound text index; both empty for a plain one).
    ///
    /// Requires: no prefix or suffix path is `_fts`/`_ftsx` (the parser
    /// refuses them, as MongoDB).
    pub fn text(
        name: String,
        text: TextSpec,
        prefix: Vec<(String, bool)>,
        suffix: Vec<(String, bool)>,
    ) -> IndexSpec {
        debug_assert!(prefix
            .iter()
            .chain(&suffix)
            .all(|(p, _)| p != TEXT_MARKER && p != "_ftsx"));
        let mut fields = prefix;
        fields.push((TEXT_MARKER.into(), true));
        fields.extend(suffix);
        IndexSpec {
            name,
            fields,
            unique: false,
            kind: IndexKind::Text(Box::new(text)),
            sparse: false,
            partial: None,
            expire_after_seconds: None,
            collation: None,
        }
    }

    /// The same index for MongoDB's conflict rules: same key pattern, the
    /// same partial filter and the same collation (two indexes on one
    /// pattern may differ by either).
    pub fn same_keys_as(&self, other: &IndexSpec) -> bool {
        self.fields == other.fields
            && self.kind == other.kind
            && self.partial == other.partial
            && collation::same(self.collation.as_deref(), other.collation.as_deref())
    }

    /// Could an update that may change the paths `may_affect` accepts
    /// change this index's entries for a document (its keys or membership)?
    pub fn may_be_affected(&self, may_affect: &dyn Fn(&str) -> bool) -> bool {
        match &self.kind {
            IndexKind::Wildcard(_) => return true,
            IndexKind::Text(t) => {
                return t.is_wildcard()
                    || may_affect(&t.language_override)
                    || t.weights.iter().any(|(p, _)| may_affect(p))
                    || self.fields.iter().any(|(p, _)| may_affect(p))
                    || self
                        .partial
                        .as_ref()
                        .is_some_and(|f| f.paths.iter().any(|p| may_affect(p)));
            }
            _ => {}
        }
        self.fields.iter().any(|(p, _)| may_affect(p))
            || self
                .partial
                .as_ref()
                .is_some_and(|f| f.paths.iter().any(|p| may_affect(p)))
    }

    /// Number of parts of each key: the fields, or `(path, value)` for a
    /// wildcard index.
    pub fn key_len(&self) -> usize {
        match self.kind {
            IndexKind::Wildcard(_) => 2,
            _ => self.fields.len(),
        }
    }

    /// Does the index hold `doc` at all (partial filter, sparse)?
    pub fn holds(&self, doc: &RawDocument) -> bool {
        if let Some(p) = &self.partial {
            if !p.pred.matches(doc) {
                return false;
            }
        }
        if self.sparse {
            return self
                .fields
                .iter()
                .any(|(path, _)| !crate::doc::path::values(doc, path).is_empty());
        }
        true
    }

    fn desc_mask(&self) -> u32 {
        self.fields
            .iter()
            .enumerate()
            .filter(|(_, (_, asc))| !asc)
            .fold(0, |m, (i, _)| m | (1 << i))
    }

    /// A bound key: `parts` for the leading fields, then `fill` for the rest.
    pub fn bound_key(&self, parts: Vec<KeyPart>, fill: KeyPart) -> IndexKey {
        let mut parts = parts;
        while parts.len() < self.key_len() {
            parts.push(fill.clone());
        }
        IndexKey::new(parts, self.desc_mask())
    }

    /// The keys of `doc` for this index, deduplicated, and whether the document
    /// made the index multikey. A document the index does not hold (partial
    /// filter, sparse) has no keys. Missing fields index as null, an empty
    /// array as undefined (MongoDB's rule). Arrays on more than one field of a
    /// compound index are refused ("cannot index parallel arrays"), and any
    /// array on a hashed field.
    pub fn keys_for(&self, doc: &RawDocument) -> Result<(Vec<IndexKey>, bool)> {
        if !self.holds(doc) {
            return Ok((Vec::new(), false));
        }
        if let IndexKind::Wildcard(w) = &self.kind {
            return self.wildcard_keys(w, doc);
        }
        if let IndexKind::Text(t) = &self.kind {
            return self.text_keys(t, doc);
        }
        if let IndexKind::Geo { pos } = self.kind {
            return self.geo_keys(pos, doc);
        }
        if let Some(key) = self.single_plain_key(doc) {
            return Ok((vec![key], false));
        }
        self.ordered_keys(doc)
    }

    /// The keys of an ordered or hashed index (the general path of
    /// [`Self::keys_for`]: any fields, arrays, collation).
    fn ordered_keys(&self, doc: &RawDocument) -> Result<(Vec<IndexKey>, bool)> {
        let hashed_pos = match self.kind {
            IndexKind::Hashed { pos } => Some(pos),
            _ => None,
        };
        let mut per_field: Vec<Vec<RawBson>> = Vec::with_capacity(self.fields.len());
        let mut multikey = false;
        let mut array_fields = 0;
        for (i, (path, _)) in self.fields.iter().enumerate() {
            let (reached, through_array) = crate::doc::path::values_with_multikey(doc, path);
            if hashed_pos == Some(i) {
                if through_array
                    || reached.len() > 1
                    || reached.iter().any(|v| matches!(v, RawBsonRef::Array(_)))
                {
                    return Err(Error::HashedArray(format!(
                        "hashed indexes do not currently support array values; found an array at '{path}' for index {}",
                        self.name
                    )));
                }
                let v = reached.first().copied().unwrap_or(RawBsonRef::Null);
                let h = match &self.collation {
                    Some(c) => crate::store::hashed::hash64(c.key_raw(v).as_raw_bson_ref()),
                    None => crate::store::hashed::hash64(v),
                };
                per_field.push(vec![RawBson::Int64(h)]);
                continue;
            }
            let mut vals: Vec<RawBson> = Vec::new();
            let mut field_multi = through_array;
            if reached.is_empty() {
                vals.push(RawBson::Null);
            }
            for v in reached {
                match v {
                    RawBsonRef::Array(a) => {
                        field_multi = true;
                        let before = vals.len();
                        for elem in a.into_iter().flatten() {
                            vals.push(elem.into());
                        }
                        if vals.len() == before {
                            vals.push(RawBson::Undefined);
                        }
                    }
                    other => vals.push(other.into()),
                }
            }
            if let Some(c) = &self.collation {
                for v in &mut vals {
                    *v = c.key_raw(v.as_raw_bson_ref());
                }
            }
            vals.sort_by(|a, b| value::compare(a.as_raw_bson_ref(), b.as_raw_bson_ref()));
            vals.dedup_by(|a, b| value::equal(a.as_raw_bson_ref(), b.as_raw_bson_ref()));
            if field_multi || vals.len() > 1 {
                multikey = true;
                if vals.len() > 1 {
                    array_fields += 1;
                }
            }
            per_field.push(vals);
        }
        if array_fields > 1 {
            let arrays: Vec<&str> = self
                .fields
                .iter()
                .zip(per_field.iter())
                .filter(|(_, v)| v.len() > 1)
                .map(|((p, _), _)| p.as_str())
                .collect();
            return Err(Error::CannotCreateIndex(format!(
                "cannot index parallel arrays [{}] in index {}",
                arrays.join("] ["),
                self.name
            )));
        }
        let total: usize = per_field.iter().map(Vec::len).product();
        if total > MAX_KEYS_PER_DOC {
            return Err(Error::CannotCreateIndex(format!(
                "document produces {total} keys for index {}, more than {MAX_KEYS_PER_DOC}",
                self.name
            )));
        }
        // At most one field has several values, so the product is a single loop.
        let desc = self.desc_mask();
        let mut keys = Vec::with_capacity(total);
        let multi_field = per_field.iter().position(|v| v.len() > 1);
        let n = multi_field.map_or(1, |i| per_field[i].len());
        for j in 0..n {
            let parts: Vec<KeyPart> = per_field
                .iter()
                .enumerate()
                .map(|(i, vals)| {
                    let v = if Some(i) == multi_field {
                        &vals[j]
                    } else {
                        &vals[0]
                    };
                    KeyPart::Val(v.clone())
                })
                .collect();
            keys.push(IndexKey::new(parts, desc));
        }
        Ok((keys, multikey))
    }

    /// The one key of `doc` when the general path of [`Self::keys_for`]
    /// would find a single value and no array: an ordered index of one
    /// top-level field (no dot in its path), no collation, a value that is
    /// not an array (missing: null) — the same key, without that path's
    /// vectors and value copies (a bulk load forms one key per record and
    /// index). `None`: take the general path.
    fn single_plain_key(&self, doc: &RawDocument) -> Option<IndexKey> {
        if !matches!(self.kind, IndexKind::Ordered) || self.collation.is_some() {
            return None;
        }
        let [(path, _)] = self.fields.as_slice() else {
            return None;
        };
        if path.contains('.') {
            return None;
        }
        let v: RawBson = match crate::doc::rawfield::field(doc, path) {
            Some(RawBsonRef::Array(_)) => return None,
            Some(v) => v.into(),
            None => RawBson::Null,
        };
        Some(IndexKey::new(vec![KeyPart::Val(v)], self.desc_mask()))
    }

    /// The values one ordered field contributes (missing: null; an array:
    /// its elements, empty: undefined), sorted and deduplicated.
    /// `vals` (sorted, deduplicated) as collation keys under this index's
    /// collation, sorted and deduplicated again (keys may collide).
    fn collated(&self, mut vals: Vec<RawBson>) -> Vec<RawBson> {
        let Some(c) = &self.collation else {
            return vals;
        };
        for v in &mut vals {
            *v = c.key_raw(v.as_raw_bson_ref());
        }
        vals.sort_by(|a, b| value::compare(a.as_raw_bson_ref(), b.as_raw_bson_ref()));
        vals.dedup_by(|a, b| value::equal(a.as_raw_bson_ref(), b.as_raw_bson_ref()));
        vals
    }

    fn field_values(doc: &RawDocument, path: &str) -> Vec<RawBson> {
        let mut vals: Vec<RawBson> = Vec::new();
        let reached = crate::doc::path::values(doc, path);
        if reached.is_empty() {
            vals.push(RawBson::Null);
        }
        for v in reached {
            match v {
                RawBsonRef::Array(a) => {
                    let before = vals.len();
                    vals.extend(a.into_iter().flatten().map(RawBson::from));
                    if vals.len() == before {
                        vals.push(RawBson::Undefined);
                    }
                }
                other => vals.push(other.into()),
            }
        }
        vals.sort_by(|a, b| value::compare(a.as_raw_bson_ref(), b.as_raw_bson_ref()));
        vals.dedup_by(|a, b| value::equal(a.as_raw_bson_ref(), b.as_raw_bson_ref()));
        vals
    }

    /// A 2dsphere index's keys: the cells of every shape at the geo field,
    /// crossed with the other fields' values. No geo value: no entry.
    fn geo_keys(&self, pos: usize, doc: &RawDocument) -> Result<(Vec<IndexKey>, bool)> {
        let (geo_path, _) = &self.fields[pos];
        let reached: Vec<RawBsonRef<'_>> = crate::doc::path::values(doc, geo_path)
            .into_iter()
            .filter(|v| !matches!(v, RawBsonRef::Null | RawBsonRef::Undefined))
            .collect();
        if reached.is_empty() {
            return Ok((Vec::new(), false));
        }
        let mut cells = Vec::new();
        for v in reached {
            let shapes = crate::store::geo::shapes_of(v).map_err(|reason| {
                let shown = crate::doc::to_document(doc)
                    .map(|d| crate::error::render_shell(&Bson::Document(d)))
                    .unwrap_or_default();
                Error::Coded {
                    code: 16755,
                    name: "Location16755",
                    msg: format!("Can't extract geo keys: {shown}  {reason}"),
                }
            })?;
            for s in &shapes {
                cells.extend(crate::store::geo::key_cells(s));
            }
        }
        cells.sort_unstable();
        cells.dedup();
        let mut per_field: Vec<Vec<RawBson>> = Vec::with_capacity(self.fields.len());
        for (i, (path, _)) in self.fields.iter().enumerate() {
            if i == pos {
                per_field.push(
                    cells
                        .iter()
                        .map(|c| crate::store::geo::cell_key(*c))
                        .collect(),
                );
            } else {
                // The other fields are keyed as an ordered index's are,
                // under the index's collation.
                per_field.push(self.collated(Self::field_values(doc, path)));
            }
        }
        let total = per_field
            .iter()
            .try_fold(1usize, |n, v| n.checked_mul(v.len()))
            .unwrap_or(usize::MAX);
        if total > MAX_KEYS_PER_DOC {
            return Err(Error::CannotCreateIndex(format!(
                "document produces {total} keys for index {}, more than {MAX_KEYS_PER_DOC}",
                self.name
            )));
        }
        let desc = self.desc_mask();
        let mut keys: Vec<Vec<KeyPart>> = vec![Vec::new()];
        for vals in &per_field {
            let mut next = Vec::with_capacity(keys.len() * vals.len());
            for k in &keys {
                for v in vals {
                    let mut k = k.clone();
                    k.push(KeyPart::Val(v.clone()));
                    next.push(k);
                }
            }
            keys = next;
        }
        let keys = keys
            .into_iter()
            .map(|parts| IndexKey::new(parts, desc))
            .collect();
        // A shape may have several cells: the planner treats the index as multikey.
        Ok((keys, true))
    }

    /// The position of the term in a text index's keys (the number of
    /// prefix fields); `None` for other kinds.
    pub fn text_term_pos(&self) -> Option<usize> {
        match self.kind {
            IndexKind::Text(_) => self.fields.iter().position(|(p, _)| p == TEXT_MARKER),
            _ => None,
        }
    }

    /// A text index's keys: `(prefix values…, term, suffix values…)` per
    /// distinct term. The other fields hold one value each (missing: null);
    /// an array on their path is refused (171 CannotBuildIndexKeys, as
    /// MongoDB's `extractNonFTSKeyElement`), checked before the terms so a
    /// document without text is refused too. No terms: no entry (text
    /// indexes are sparse, the other fields do not decide membership).
    fn text_keys(&self, t: &TextSpec, doc: &RawDocument) -> Result<(Vec<IndexKey>, bool)> {
        let mut extra: Vec<Option<RawBson>> = Vec::with_capacity(self.fields.len());
        for (path, _) in &self.fields {
            if path == TEXT_MARKER {
                extra.push(None);
                continue;
            }
            let (reached, through_array) = crate::doc::path::values_with_multikey(doc, path);
            if through_array || reached.iter().any(|v| matches!(v, RawBsonRef::Array(_))) {
                let shown = crate::doc::to_document(doc)
                    .map(|d| crate::error::render_shell(&Bson::Document(d)))
                    .unwrap_or_default();
                return Err(Error::Coded {
                    code: 171,
                    name: "CannotBuildIndexKeys",
                    msg: format!(
                        "Field '{path}' of text index contains an array in document: {shown}"
                    ),
                });
            }
            extra.push(Some(
                reached.first().map_or(RawBson::Null, |v| RawBson::from(*v)),
            ));
        }
        let desc = self.desc_mask();
        let keys = t
            .scores(doc)?
            .into_keys()
            .map(|term| {
                let mut term = Some(term);
                let parts: Vec<KeyPart> = extra
                    .iter()
                    .map(|v| match v {
                        Some(v) => KeyPart::Val(v.clone()),
                        None => KeyPart::Val(RawBson::String(term.take().unwrap_or_default())),
                    })
                    .collect();
                IndexKey::new(parts, desc)
            })
            .collect();
        Ok((keys, true))
    }

    fn wildcard_keys(&self, w: &WildcardSpec, doc: &RawDocument) -> Result<(Vec<IndexKey>, bool)> {
        let mut pairs = w.keys(doc, MAX_KEYS_PER_DOC)?;
        // Values (not paths) are keyed under the index's collation.
        if let Some(c) = &self.collation {
            for (_, v) in &mut pairs {
                *v = c.key_raw(v.as_raw_bson_ref());
            }
        }
        pairs.sort_by(|(pa, va), (pb, vb)| {
            pa.cmp(pb)
                .then_with(|| value::compare(va.as_raw_bson_ref(), vb.as_raw_bson_ref()))
        });
        pairs.dedup_by(|(pa, va), (pb, vb)| {
            pa == pb && value::equal(va.as_raw_bson_ref(), vb.as_raw_bson_ref())
        });
        let keys = pairs
            .into_iter()
            .map(|(p, v)| IndexKey::new(vec![KeyPart::Val(RawBson::String(p)), KeyPart::Val(v)], 0))
            .collect();
        // Every path may hold arrays: the planner treats the index as multikey.
        Ok((keys, true))
    }
}

fn check_path(path: &str) -> Result<()> {
    crate::doc::path::validate(path).map_err(Error::CannotCreateIndex)?;
    if path.split('.').any(|p| p.starts_with('$')) {
        return Err(Error::CannotCreateIndex(format!(
            "index key path '{path}' must not contain '$'-prefixed components"
        )));
    }
    Ok(())
}

/// MongoDB's default index name: `field_value` joined by `_` (`a_1_b_-1`,
/// `c_hashed`, `$**_1`).
fn default_name(keys: &Document) -> String {
    keys.iter()
        .map(|(p, v)| {
            let v = match v {
                Bson::String(s) => s.clone(),
                Bson::Int32(i) => i.to_string(),
                Bson::Int64(i) => i.to_string(),
                Bson::Double(d) if d.fract() == 0.0 => format!("{}", *d as i64),
                other => other.to_string(),
            };
            format!("{p}_{v}")
        })
        .collect::<Vec<_>>()
        .join("_")
}

/// How often an index served a read, and since when (`$indexStats`'
/// `accesses`). One atomic add per read that walks the index.
#[derive(Debug)]
pub struct IndexUsage {
    ops: AtomicU64,
    since: SystemTime,
}

impl IndexUsage {
    pub fn new() -> Arc<IndexUsage> {
        Arc::new(IndexUsage {
            ops: AtomicU64::new(0),
            since: SystemTime::now(),
        })
    }

    /// One more read used the index.
    pub fn record(&self) {
        self.ops.fetch_add(1, AtomicOrdering::Relaxed);
    }

    pub fn ops(&self) -> u64 {
        self.ops.load(AtomicOrdering::Relaxed)
    }

    pub fn since(&self) -> SystemTime {
        self.since
    }
}

/// The B+tree of a secondary index's entries.
pub type IndexTree = BTree<(IndexKey, RecordId), ()>;

/// One secondary index of a collection version. Cloning is O(1).
///
/// With delta indexing (`store::delta`), `tree` is the merged root and
/// `frozen`/`active` the delta layers above it; every read of the index goes
/// through [`IndexState::range`] (the fresh view) unless it asked for the
/// stale view ([`IndexState::stale`]: the merged root alone). Without delta
/// indexing both layers stay empty and `range` is the tree's own range.
#[derive(Debug, Clone)]
pub struct IndexState {
    pub spec: Arc<IndexSpec>,
    /// The merged root (the whole index when there are no delta layers).
    pub tree: IndexTree,
    /// The layer cut from `active` and being merged into `tree` off the
    /// writer's thread (`write::delta`); its `Arc` identifies the merge.
    pub frozen: Option<Arc<DeltaLayer>>,
    /// The writer's changes since the last cut, net of `tree` + `frozen`.
    pub active: DeltaLayer,
    pub multikey: bool,
    /// Shared by all versions of this index.
    pub usage: Arc<IndexUsage>,
}

impl IndexState {
    pub fn new(spec: IndexSpec) -> IndexState {
        IndexState {
            spec: Arc::new(spec),
            tree: BTree::new(),
            frozen: None,
            active: DeltaLayer::default(),
            multikey: false,
            usage: IndexUsage::new(),
        }
    }

    /// May this index keep delta layers? Ordinary (single-field or compound,
    /// possibly multikey) b-tree indexes only: hashed, wildcard, text and
    /// 2dsphere indexes keep synchronous maintenance (their readers, the
    /// text search and the geo covering, are not worth a second path).
    pub fn delta_eligible(&self) -> bool {
        matches!(self.spec.kind, IndexKind::Ordered)
    }

    /// Does this version have delta layers (entries not yet in `tree`)?
    pub fn has_delta(&self) -> bool {
        self.frozen.is_some() || !self.active.is_empty()
    }

    /// Entries in the fresh view: `tree`'s, plus the layers' net inserts.
    pub fn len(&self) -> usize {
        let net = |l: &DeltaLayer| l.inserts() as isize - l.removes() as isize;
        let n =
            self.tree.len() as isize + self.frozen.as_deref().map_or(0, net) + net(&self.active);
        n.max(0) as usize
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Delta entries not yet merged (frozen and active), the merge lag.
    pub fn delta_len(&self) -> usize {
        self.frozen.as_deref().map_or(0, DeltaLayer::len) + self.active.len()
    }

    /// Entries with `lo <= entry <= hi` (per the bounds) in the fresh view,
    /// ascending; `.rev()` for descending. Crossing bounds: empty.
    pub fn range<'a>(
        &'a self,
        lo: std::ops::Bound<&(IndexKey, RecordId)>,
        hi: std::ops::Bound<&(IndexKey, RecordId)>,
    ) -> IndexRange<'a> {
        match &self.frozen {
            Some(f) => IndexRange::new(&self.tree, &[f, &self.active], lo, hi),
            None => IndexRange::new(&self.tree, &[&self.active], lo, hi),
        }
    }

    /// Every entry of the fresh view, ascending.
    pub fn iter(&self) -> IndexRange<'_> {
        use std::ops::Bound::Unbounded;
        self.range(Unbounded, Unbounded)
    }

    /// The stale view of this version: the merged root alone (an earlier
    /// fresh view, see `store::delta`), as an index without layers.
    pub fn stale(&self) -> IndexState {
        IndexState {
            frozen: None,
            active: DeltaLayer::default(),
            ..self.clone()
        }
    }

    /// The fresh view as one tree: `tree` with the layers folded in (a
    /// checkpoint writes this; cost O(layer entries · log n), sharing every
    /// node the layers do not touch).
    pub fn merged_tree(&self) -> IndexTree {
        let mut t = self.tree.clone();
        if let Some(f) = &self.frozen {
            f.apply_to(&mut t);
        }
        self.active.apply_to(&mut t);
        t
    }

    /// Fold both layers into `tree` here (delta indexing turned off, or a
    /// checkpoint's copy).
    pub fn fold(&mut self) {
        if self.has_delta() {
            self.tree = self.merged_tree();
            self.frozen = None;
            self.active = DeltaLayer::default();
        }
    }

    /// Add `entry` to the index: to the active layer when `delta` (and the
    /// index is eligible), else to the tree (folding any layers first, so
    /// the tree is the whole index again).
    pub fn insert_entry(&mut self, entry: (IndexKey, RecordId), delta: bool) {
        if delta && self.delta_eligible() {
            self.active.insert(entry);
        } else {
            self.fold();
            self.tree.insert(entry, ());
        }
    }

    /// Remove `entry` (present in the fresh view); see [`IndexState::insert_entry`].
    pub fn remove_entry(&mut self, entry: (IndexKey, RecordId), delta: bool) {
        if delta && self.delta_eligible() {
            self.active.remove(entry);
        } else {
            self.fold();
            self.tree.remove(&entry);
        }
    }

    /// Move the active layer to `frozen` for a merge: the merged root and
    /// the layer to fold into it. `None` when a layer is frozen already (one
    /// merge at a time) or nothing is active.
    pub fn cut(&mut self) -> Option<(IndexTree, Arc<DeltaLayer>)> {
        if self.frozen.is_some() || self.active.is_empty() {
            return None;
        }
        let layer = Arc::new(std::mem::take(&mut self.active));
        self.frozen = Some(layer.clone());
        Some((self.tree.clone(), layer))
    }

    /// Install `merged` (the tree this version's `frozen` was cut over, with
    /// `layer` folded in) when `layer` is still this version's frozen layer;
    /// false (nothing changed) when it is not (merged here meanwhile, index
    /// rebuilt or dropped). The fresh view is unchanged either way.
    pub fn install(&mut self, layer: &Arc<DeltaLayer>, merged: IndexTree) -> bool {
        match &self.frozen {
            Some(f) if Arc::ptr_eq(f, layer) => {
                self.tree = merged;
                self.frozen = None;
                true
            }
            _ => false,
        }
    }

    /// Fold the frozen layer into `tree` on this thread (the writer's
    /// back-pressure when the merger lags); a later merge result for it no
    /// longer installs.
    pub fn merge_frozen_here(&mut self) {
        if let Some(f) = self.frozen.take() {
            f.apply_to(&mut self.tree);
        }
    }

    /// A record other than `except` that holds `key` in the fresh view, if
    /// any (unique checks: the merged tree and the layers, on the writer's
    /// path, so a duplicate is refused at the write as without layers).
    pub fn holder_of(&self, key: &IndexKey, except: Option<RecordId>) -> Option<RecordId> {
        use std::ops::Bound::Included;
        let lo = (key.clone(), RecordId::MIN);
        let hi = (key.clone(), RecordId::MAX);
        self.range(Included(&lo), Included(&hi))
            .map(|((_, rid), _)| *rid)
            .find(|rid| Some(*rid) != except)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bson::{doc, rawdoc};

    fn spec(keys: Document) -> IndexSpec {
        IndexSpec::new(&keys, None, false).expect("spec")
    }

    fn key_values(keys: &[IndexKey]) -> Vec<Vec<Bson>> {
        keys.iter()
            .map(|k| {
                (0..k.len())
                    .map(|i| match k.value(i) {
                        Some(v) => Bson::try_from(RawBson::from(v)).expect("bson"),
                        None => Bson::Null,
                    })
                    .collect()
            })
            .collect()
    }

    /// The one-field shortcut of `keys_for` gives exactly the general
    /// path's keys (values compared by representation, not only by order:
    /// 1 and 1.0 stay apart), and leaves arrays, dotted paths and compound
    /// or hashed indexes to it.
    #[test]
    fn the_single_field_shortcut_equals_the_general_path() {
        let docs = [
            rawdoc! {"a": 1},
            rawdoc! {"a": 1.0},
            rawdoc! {"a": "s"},
            rawdoc! {"a": null},
            rawdoc! {"b": 1},
            rawdoc! {"a": {"x": 1}},
            rawdoc! {"a": {"$numberDecimal": "1"}},
            rawdoc! {"a": 2, "a": 3},
            rawdoc! {"a": bson::oid::ObjectId::from_bytes([7; 12])},
        ];
        for keys in [doc! {"a": 1}, doc! {"a": -1}] {
            let s = spec(keys);
            for d in &docs {
                let fast = s.single_plain_key(d).expect("shortcut");
                let (general, multikey) = s.ordered_keys(d).expect("keys");
                assert!(!multikey);
                assert_eq!(general.len(), 1);
                assert_eq!(fast.desc, general[0].desc);
                assert_eq!(key_values(&[fast]), key_values(&general), "{d:?}");
            }
        }
        let arrays = rawdoc! {"a": [1, 2], "b": {"c": 1}};
        assert!(spec(doc! {"a": 1}).single_plain_key(&arrays).is_none());
        assert!(spec(doc! {"b.c": 1}).single_plain_key(&arrays).is_none());
        assert!(spec(doc! {"a": 1, "b": 1})
            .single_plain_key(&arrays)
            .is_none());
        assert!(spec(doc! {"b": "hashed"})
            .single_plain_key(&arrays)
            .is_none());
    }

    #[test]
    fn names_and_errors() {
        assert_eq!(spec(doc! {"a": 1, "b.c": -1}).name, "a_1_b.c_-1");
        assert!(IndexSpec::new(&doc! {}, None, false).is_err());
        assert!(IndexSpec::new(&doc! {"a": "text"}, None, false).is_err());
        assert!(IndexSpec::new(&doc! {"a": 2}, None, false).is_err());
        assert!(IndexSpec::new(&doc! {"a..b": 1}, None, false).is_err());
    }

    #[test]
    fn missing_is_null_and_arrays_fan_out() {
        let s = spec(doc! {"a": 1});
        let (k, multi) = s.keys_for(&rawdoc! {"b": 1}).expect("keys");
        assert_eq!(key_values(&k), vec![vec![Bson::Null]]);
        assert!(!multi);
        let (k, multi) = s.keys_for(&rawdoc! {"a": [3, 1, 3]}).expect("keys");
        assert_eq!(
            key_values(&k),
            vec![vec![Bson::Int32(1)], vec![Bson::Int32(3)]]
        );
        assert!(multi);
        let (k, _) = s.keys_for(&rawdoc! {"a": []}).expect("keys");
        assert_eq!(key_values(&k), vec![vec![Bson::Undefined]]);
    }

    #[test]
    fn parallel_arrays_refused() {
        let s = spec(doc! {"a": 1, "b": 1});
        assert!(s.keys_for(&rawdoc! {"a": [1, 2], "b": [3, 4]}).is_err());
        let (k, _) = s
            .keys_for(&rawdoc! {"a": [1, 2], "b": 5})
            .expect("one array is fine");
        assert_eq!(k.len(), 2);
    }

    #[test]
    fn value_key_fast_paths_agree_with_the_bson_order() {
        let vals = vec![
            RawBson::Int32(-1),
            RawBson::Int32(5),
            RawBson::Int64(5),
            RawBson::Int64(i64::MIN),
            RawBson::Double(5.0),
            RawBson::Double(-0.5),
            RawBson::String("a".into()),
            RawBson::String("ab".into()),
            RawBson::String(String::new()),
            RawBson::String("a".repeat(SHORT_STR)),
            RawBson::String("a".repeat(SHORT_STR + 1)),
            RawBson::String(format!("{}b", "a".repeat(SHORT_STR))),
            RawBson::ObjectId(bson::oid::ObjectId::from_bytes([1; 12])),
            RawBson::ObjectId(bson::oid::ObjectId::from_bytes([0; 12])),
            RawBson::Null,
            RawBson::Boolean(true),
            RawBson::Document(rawdoc! {"a": 1}),
            RawBson::Document(rawdoc! {"a": 1_i64}),
            RawBson::Symbol("a".into()),
            RawBson::Double(f64::NAN),
            RawBson::Double(f64::NEG_INFINITY),
            RawBson::DateTime(bson::DateTime::from_millis(-5)),
            RawBson::DateTime(bson::DateTime::from_millis(5)),
            RawBson::Boolean(false),
            RawBson::Decimal128("5".parse().expect("decimal")),
        ];
        for a in &vals {
            for b in &vals {
                let fast = ValueKey::from(a).cmp(&ValueKey::from(b));
                let slow = value::compare(a.as_raw_bson_ref(), b.as_raw_bson_ref());
                assert_eq!(fast, slow, "{a:?} vs {b:?}");
            }
        }
    }

    fn any_id() -> impl proptest::strategy::Strategy<Value = RawBson> {
        use proptest::prelude::*;
        prop_oneof![
            (-3i32..3).prop_map(RawBson::Int32),
            any::<i32>().prop_map(RawBson::Int32),
            (-3i64..3).prop_map(RawBson::Int64),
            any::<i64>().prop_map(RawBson::Int64),
            (-3i32..3).prop_map(|i| RawBson::Double(f64::from(i) / 2.0)),
            any::<f64>().prop_map(RawBson::Double),
            "[a-c]{0,3}".prop_map(RawBson::String),
            // Either side of the inline limit, sharing long prefixes.
            "u{26,29}[a-c]{0,5}".prop_map(RawBson::String),
            ".{0,40}".prop_map(RawBson::String),
            any::<[u8; 12]>().prop_map(|b| RawBson::ObjectId(bson::oid::ObjectId::from_bytes(b))),
            Just(RawBson::Null),
            any::<bool>().prop_map(RawBson::Boolean),
            any::<i64>().prop_map(|t| RawBson::DateTime(bson::DateTime::from_millis(t))),
            (-3i64..3).prop_map(|t| RawBson::DateTime(bson::DateTime::from_millis(t))),
            (-3i32..3).prop_map(|i| RawBson::Decimal128(i.to_string().parse().expect("decimal"))),
        ]
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(2000))]

        /// Whatever the two values' types, the compact key orders them as
        /// MongoDB does, and gives the value back.
        #[test]
        fn value_keys_order_as_the_values_do(a in any_id(), b in any_id()) {
            let (ka, kb) = (ValueKey::from(&a), ValueKey::from(b.clone()));
            let want = value::compare(a.as_raw_bson_ref(), b.as_raw_bson_ref());
            proptest::prop_assert_eq!(ka.cmp(&kb), want);
            proptest::prop_assert_eq!(kb.cmp(&ka), want.reverse());
            proptest::prop_assert_eq!(ka == kb, want == Ordering::Equal);
            // Debug text, not `==`: a NaN double is not equal to itself.
            proptest::prop_assert_eq!(format!("{:?}", ka.to_raw()), format!("{a:?}"));
        }
    }

    #[test]
    fn a_one_field_key_is_inline_and_orders_as_its_value() {
        // A secondary index's node size follows it (entries are `(key, rid)`).
        assert!(std::mem::size_of::<IndexKey>() <= 40);
        let s = spec(doc! {"a": -1});
        let key = |d: bson::RawDocumentBuf| s.keys_for(&d).expect("keys").0.remove(0);
        let (one, two) = (key(rawdoc! {"a": 1.5}), key(rawdoc! {"a": 2_i64}));
        assert!(matches!(
            one.parts,
            Parts::One(Part::Val(ValueKey::Double(_)))
        ));
        assert_eq!(one.out_of_line_bytes(), 0);
        // Descending: 2 before 1.5.
        assert_eq!(two.cmp(&one), Ordering::Less);
        assert_eq!(one.value(0), Some(RawBsonRef::Double(1.5)));
        assert_eq!(one.value(1), None);
        let low = s.bound_key(Vec::new(), KeyPart::Low);
        let high = s.bound_key(Vec::new(), KeyPart::High);
        assert!(low < two && two < one && one < high);
        // Compound keys share their parts.
        let c = spec(doc! {"a": 1, "b": 1});
        let k = c
            .keys_for(&rawdoc! {"a": 1, "b": "x"})
            .expect("keys")
            .0
            .remove(0);
        assert!(matches!(k.parts, Parts::Many(_)));
        assert_eq!(k.len(), 2);
        assert_eq!(k.value(1), Some(RawBsonRef::String("x")));
    }

    #[test]
    fn a_value_key_is_compact_and_gives_back_the_value_it_was_made_from() {
        // The B+tree node size (and so a point read's cache misses) follows it.
        assert_eq!(std::mem::size_of::<ValueKey>(), 32);
        let vals = [
            RawBson::Int32(-7),
            RawBson::Int64(1 << 40),
            RawBson::ObjectId(bson::oid::ObjectId::from_bytes([9; 12])),
            RawBson::String("k\u{e9}y".into()),
            RawBson::String("x".repeat(SHORT_STR)),
            RawBson::String("\u{e9}".repeat(SHORT_STR)),
            RawBson::Double(2.5),
            RawBson::Document(rawdoc! {"x": [1, "y"]}),
        ];
        for v in vals {
            let by_ref = ValueKey::from(v.as_raw_bson_ref());
            let owned = ValueKey::from(v.clone());
            assert_eq!(by_ref.to_raw(), v);
            assert_eq!(owned.to_raw(), v);
            assert_eq!(ValueKey::from(&v).as_raw_ref(), v.as_raw_bson_ref());
        }
        assert!(matches!(
            ValueKey::from(RawBson::Double(2.5)),
            ValueKey::Double(_)
        ));
        assert!(matches!(
            ValueKey::from(RawBson::Decimal128(bson::Decimal128::from_bytes([0; 16]))),
            ValueKey::Other(_)
        ));
        assert!(matches!(
            ValueKey::from(RawBson::Int64(1)),
            ValueKey::Int64(1)
        ));
        let short = "u".repeat(SHORT_STR);
        let long = "u".repeat(SHORT_STR + 1);
        assert!(matches!(
            ValueKey::from(RawBson::String(short)),
            ValueKey::ShortStr(_)
        ));
        assert!(matches!(
            ValueKey::from(RawBsonRef::String(&long)),
            ValueKey::Str(_)
        ));
    }

    #[test]
    fn descending_parts_reverse_order() {
        let s = spec(doc! {"a": 1, "b": -1});
        let k = |a: i32, b: i32| {
            s.keys_for(&rawdoc! {"a": a, "b": b})
                .expect("keys")
                .0
                .remove(0)
        };
        assert!(k(1, 5) < k(1, 4));
        assert!(k(1, 0) < k(2, 9));
        let low = s.bound_key(vec![KeyPart::Val(RawBson::Int32(1))], KeyPart::Low);
        let high = s.bound_key(vec![KeyPart::Val(RawBson::Int32(1))], KeyPart::High);
        assert!(low < k(1, 100) && k(1, -100) < high);
        assert!(high < k(2, 100));
    }
}
