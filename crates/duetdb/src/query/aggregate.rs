//! The aggregation pipeline: parsing, the split into a commutative scan part
//! and an ordered rest, and execution on a collection.
//!
//! Owns: [`Pipeline`] (parsed stages), [`Pipeline::split`] into [`Split`], the
//! commutative evaluator [`CommutativePart`] with its mergeable
//! [`PartialState`], the plain in-order evaluator [`Pipeline::run_on`], and the
//! `aggregate*` methods of [`Collection`] / [`SnapshotCollection`].
//!
//! Why the split: an OLCP scan (and any parallel scan) hands documents to the
//! query in an arbitrary order, possibly on several threads. A prefix of
//! per-document stages (`$match $project $addFields $set $unset $unwind`)
//! optionally closed by one `$group` whose accumulators are all mergeable can be
//! computed per thread and merged, whatever the order; the rest runs afterwards
//! on the (small) merged output.
//!
//! Invariants:
//! - `merge` is associative and commutative on the *finished* result: feeding any
//!   permutation of the documents into any number of states and merging them in
//!   any tree shape gives the same `finish()` as feeding them in order into one
//!   state, except for the order of `$push` arrays and, without a `$group`, the
//!   order of the output documents (both are unordered in MongoDB too). Integer
//!   sums are exact (i128) so their result type does not depend on the merge
//!   shape; double sums may differ in the last bits (as in a sharded MongoDB).
//! - Values equal under [`crate::doc::value::compare`] but not identical (`1` and
//!   `1.0`) are one group / one set element / one min; which representative is
//!   kept is decided by a total order refining `compare` ([`canonical_cmp`]), not
//!   by arrival order, so it too is independent of the merge shape.
//! - `feed` assumes the document already passed the split's `scan_filter` (the
//!   scan applies it); it never re-checks it.
//! - Memory: a `$group`'s state is bounded ([`GROUP_MEMORY_LIMIT`], error 292);
//!   a `$push`/`$addToSet` array by the 16 MiB document size (error 10334).
//! - Nothing here panics on user input.

use std::cmp::Ordering;
use std::collections::btree_map::Entry;
use std::collections::{BTreeMap, BTreeSet};

use bson::raw::{RawDocument, RawDocumentBuf};
use bson::{Bson, Document, RawBson};

use crate::doc::MAX_DOC_SIZE;
use crate::error::{Error, Result};
use crate::query::expr::{self, compare, num_of, parse_field_path, Expr, Num, Root, Value};
use crate::query::{Filter, SortSpec};

/// Most stages in one pipeline (MongoDB's default `internalPipelineLengthLimit`).
pub const MAX_PIPELINE_STAGES: usize = 1000;
/// Most memory one `$group` may hold (MongoDB's 100 MB without `allowDiskUse`).
pub const GROUP_MEMORY_LIMIT: usize = 100 * 1024 * 1024;

/// A parsed pipeline.
#[derive(Debug, Clone)]
pub struct Pipeline {
    stages: Vec<Stage>,
}

#[derive(Debug, Clone)]
enum Stage {
    Match {
        spec: Document,
        filter: Filter,
    },
    Project(Project),
    AddFields(Vec<(Vec<String>, Expr)>),
    /// `$unset` is an exclusion projection; kept apart only for its name.
    Unset(Project),
    Unwind(Unwind),
    Group(Group),
    Sort(SortSpec),
    Limit(u64),
    Skip(u64),
    Count(String),
}

impl Stage {
    fn name(&self) -> &'static str {
        match self {
            Stage::Match { .. } => "$match",
            Stage::Project(_) => "$project",
            Stage::AddFields(_) => "$addFields",
            Stage::Unset(_) => "$unset",
            Stage::Unwind(_) => "$unwind",
            Stage::Group(_) => "$group",
            Stage::Sort(_) => "$sort",
            Stage::Limit(_) => "$limit",
            Stage::Skip(_) => "$skip",
            Stage::Count(_) => "$count",
        }
    }

    /// A stage that maps one document to zero or more, independently of others.
    fn is_per_document(&self) -> bool {
        matches!(
            self,
            Stage::Match { .. }
                | Stage::Project(_)
                | Stage::AddFields(_)
                | Stage::Unset(_)
                | Stage::Unwind(_)
        )
    }
}

impl Pipeline {
    /// Parse a pipeline. Unknown stages, malformed arguments and pipelines longer
    /// than [`MAX_PIPELINE_STAGES`] are errors.
    pub fn parse(stages: &[Document]) -> Result<Pipeline> {
        if stages.len() > MAX_PIPELINE_STAGES {
            return Err(Error::bad_value(format!(
                "Pipeline length must be no longer than {MAX_PIPELINE_STAGES} stages"
            )));
        }
        let stages = stages.iter().map(parse_stage).collect::<Result<_>>()?;
        Ok(Pipeline { stages })
    }

    /// Lower the `$group` memory limit (tests; a server knob later).
    pub fn set_group_memory_limit(&mut self, bytes: usize) {
        for s in &mut self.stages {
            if let Stage::Group(g) = s {
                g.memory_limit = bytes;
            }
        }
    }

    pub fn len(&self) -> usize {
        self.stages.len()
    }

    pub fn is_empty(&self) -> bool {
        self.stages.is_empty()
    }

    /// Stage names in order (for explain).
    pub fn stage_names(&self) -> Vec<&'static str> {
        self.stages.iter().map(Stage::name).collect()
    }

    /// Split into the scan filter (leading `$match` stages), the commutative part
    /// (the longest following run of per-document stages, optionally closed by one
    /// `$group` with only mergeable accumulators) and the rest.
    pub fn split(self) -> Split {
        let mut stages = self.stages.into_iter().peekable();
        let mut matches = Vec::new();
        while let Some(Stage::Match { .. }) = stages.peek() {
            if let Some(Stage::Match { spec, .. }) = stages.next() {
                if !spec.is_empty() {
                    matches.push(spec);
                }
            }
        }
        let scan_filter = match matches.len() {
            0 => None,
            1 => matches.pop(),
            _ => Some(
                bson::doc! {"$and": matches.into_iter().map(Bson::Document).collect::<Vec<_>>()},
            ),
        };
        let mut per_doc = Vec::new();
        while stages.peek().is_some_and(Stage::is_per_document) {
            if let Some(s) = stages.next() {
                per_doc.push(s);
            }
        }
        let mut group = None;
        if let Some(Stage::Group(g)) = stages.peek() {
            if g.is_mergeable() {
                if let Some(Stage::Group(g)) = stages.next() {
                    group = Some(g);
                }
            }
        }
        let commutative = if per_doc.is_empty() && group.is_none() {
            None
        } else {
            Some(CommutativePart {
                stages: per_doc,
                group,
            })
        };
        Split {
            scan_filter,
            commutative,
            rest: Pipeline {
                stages: stages.collect(),
            },
        }
    }

    /// Evaluate every stage in order on materialized documents (the reference
    /// evaluation, and the "reduce" side after a commutative part).
    pub fn run_on(&self, docs: Vec<Document>) -> Result<Vec<Document>> {
        let mut docs = docs;
        for stage in &self.stages {
            docs = run_stage(stage, docs)?;
        }
        Ok(docs)
    }

    /// `skip + limit` when the pipeline starts with `$skip*`/`$limit`: only that
    /// many input documents can matter (the input order is arbitrary anyway).
    fn leading_limit(&self) -> Option<u64> {
        let mut skip = 0u64;
        for s in &self.stages {
            match s {
                Stage::Skip(n) => skip = skip.saturating_add(*n),
                Stage::Limit(n) => return Some(skip.saturating_add(*n)),
                _ => return None,
            }
        }
        None
    }

    /// Does the result depend on the order documents arrive in (before any
    /// `$sort` re-establishes one)?
    fn is_order_sensitive(&self) -> bool {
        for s in &self.stages {
            match s {
                Stage::Sort(_) => return false,
                Stage::Limit(_) | Stage::Skip(_) => return true,
                Stage::Group(g) if !g.is_mergeable() => return true,
                _ => {}
            }
        }
        false
    }
}

/// A pipeline split for scanning: see [`Pipeline::split`].
#[derive(Debug)]
pub struct Split {
    /// The leading `$match` stages, combined with `$and` (`None`: match all).
    pub scan_filter: Option<Document>,
    /// Per-document stages and an optional mergeable `$group` (`None`: no such stage).
    pub commutative: Option<CommutativePart>,
    /// Everything after, run in order on the commutative part's output.
    pub rest: Pipeline,
}

impl Split {
    /// Can an out-of-order, multi-threaded (OLCP) scan run this pipeline with the
    /// same answer as an in-order one? True when there is a scan-side part and the
    /// rest does not depend on the input order.
    pub fn olcp_eligible(&self) -> bool {
        let has_scan_part = self.scan_filter.is_some() || self.commutative.is_some();
        let after_group = self.commutative.as_ref().is_some_and(|c| c.group.is_some());
        has_scan_part && (after_group || !self.rest.is_order_sensitive())
    }
}

/// The commutative scan-side part of a pipeline.
#[derive(Debug, Clone)]
pub struct CommutativePart {
    stages: Vec<Stage>,
    group: Option<Group>,
}

/// Per-thread (or per-range) state of a [`CommutativePart`]; `Send`, mergeable.
#[derive(Debug, Clone)]
pub struct PartialState(StateInner);

#[derive(Debug, Clone)]
enum StateInner {
    /// No `$group`: the documents that came out of the per-document stages.
    Docs(Vec<Document>),
    Groups(GroupState),
}

impl PartialState {
    /// Output documents collected (no `$group`) or groups formed so far.
    pub fn len(&self) -> usize {
        match &self.0 {
            StateInner::Docs(d) => d.len(),
            StateInner::Groups(g) => g.groups.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl CommutativePart {
    /// A part with no stages: collects the scanned documents as they are.
    pub fn collect_all() -> CommutativePart {
        CommutativePart {
            stages: Vec::new(),
            group: None,
        }
    }

    /// Does it end in a `$group`?
    pub fn has_group(&self) -> bool {
        self.group.is_some()
    }

    /// Stage names in order (for explain).
    pub fn stage_names(&self) -> Vec<&'static str> {
        let mut names: Vec<_> = self.stages.iter().map(Stage::name).collect();
        if self.group.is_some() {
            names.push("$group");
        }
        names
    }

    pub fn new_state(&self) -> PartialState {
        PartialState(match &self.group {
            Some(_) => StateInner::Groups(GroupState::default()),
            None => StateInner::Docs(Vec::new()),
        })
    }

    /// Apply the per-document stages to `doc` and accumulate the result.
    pub fn feed(&self, state: &mut PartialState, doc: &RawDocument) -> Result<()> {
        let group = self.group.as_ref();
        per_document(
            &self.stages,
            Cur::Raw(doc),
            &mut |cur| match (&mut state.0, group) {
                (StateInner::Groups(gs), Some(g)) => g.accumulate(gs, cur.root()),
                (StateInner::Docs(out), None) => {
                    out.push(cur.into_document()?);
                    Ok(())
                }
                _ => Err(Error::Internal(
                    "partial state does not belong to this pipeline part".into(),
                )),
            },
        )
    }

    /// Combine two states (associative and commutative; see the module invariants).
    pub fn merge(&self, a: PartialState, b: PartialState) -> Result<PartialState> {
        match (a.0, b.0, self.group.as_ref()) {
            (StateInner::Docs(mut x), StateInner::Docs(y), None) => {
                x.extend(y);
                Ok(PartialState(StateInner::Docs(x)))
            }
            (StateInner::Groups(x), StateInner::Groups(y), Some(g)) => {
                Ok(PartialState(StateInner::Groups(g.merge(x, y)?)))
            }
            _ => Err(Error::Internal(
                "partial states do not belong to this pipeline part".into(),
            )),
        }
    }

    /// The output documents (groups in `_id` order).
    pub fn finish(&self, state: PartialState) -> Result<Vec<Document>> {
        match (state.0, self.group.as_ref()) {
            (StateInner::Docs(d), None) => Ok(d),
            (StateInner::Groups(gs), Some(g)) => g.finish(gs),
            _ => Err(Error::Internal(
                "partial state does not belong to this pipeline part".into(),
            )),
        }
    }
}

// ---------------------------------------------------------------- documents

/// The document flowing through per-document stages: read in place while no
/// stage has rewritten it.
enum Cur<'a> {
    Raw(&'a RawDocument),
    Owned(Document),
}

impl Cur<'_> {
    fn root(&self) -> Root<'_> {
        match self {
            Cur::Raw(r) => Root::Raw(r),
            Cur::Owned(d) => Root::Doc(d),
        }
    }

    fn into_document(self) -> Result<Document> {
        match self {
            Cur::Raw(r) => crate::doc::to_document(r),
            Cur::Owned(d) => Ok(d),
        }
    }

    fn matches(&self, filter: &Filter) -> Result<bool> {
        match self {
            Cur::Raw(r) => Ok(filter.matches(r)),
            Cur::Owned(d) => Ok(filter.matches(&to_raw_doc(d)?)),
        }
    }
}

fn to_raw_doc(d: &Document) -> Result<RawDocumentBuf> {
    RawDocumentBuf::try_from(d).map_err(|e| Error::InvalidBson(e.to_string()))
}

/// Run `stages` (all per-document) on one document, handing each output to `out`.
fn per_document(
    stages: &[Stage],
    cur: Cur<'_>,
    out: &mut dyn FnMut(Cur<'_>) -> Result<()>,
) -> Result<()> {
    let mut cur = cur;
    for (i, stage) in stages.iter().enumerate() {
        cur = match stage {
            Stage::Match { filter, .. } => {
                if !cur.matches(filter)? {
                    return Ok(());
                }
                cur
            }
            Stage::Project(p) | Stage::Unset(p) => Cur::Owned(p.apply(&cur.root())?),
            Stage::AddFields(fields) => Cur::Owned(add_fields(fields, cur)?),
            Stage::Unwind(u) => {
                let doc = cur.into_document()?;
                for d in u.apply(doc)? {
                    per_document(&stages[i + 1..], Cur::Owned(d), out)?;
                }
                return Ok(());
            }
            other => {
                return Err(Error::Internal(format!(
                    "{} is not a per-document stage",
                    other.name()
                )))
            }
        };
    }
    out(cur)
}

fn run_stage(stage: &Stage, docs: Vec<Document>) -> Result<Vec<Document>> {
    Ok(match stage {
        Stage::Match { .. }
        | Stage::Project(_)
        | Stage::AddFields(_)
        | Stage::Unset(_)
        | Stage::Unwind(_) => {
            let mut out = Vec::new();
            let stages = std::slice::from_ref(stage);
            for d in docs {
                per_document(stages, Cur::Owned(d), &mut |c| {
                    out.push(c.into_document()?);
                    Ok(())
                })?;
            }
            out
        }
        Stage::Group(g) => {
            let mut gs = GroupState::default();
            for d in &docs {
                g.accumulate(&mut gs, Root::Doc(d))?;
            }
            g.finish(gs)?
        }
        Stage::Sort(spec) => {
            let mut keyed = docs
                .into_iter()
                .map(|d| Ok((spec.sort_key(&to_raw_doc(&d)?), d)))
                .collect::<Result<Vec<_>>>()?;
            // Stable: ties keep their input order.
            keyed.sort_by(|(a, _), (b, _)| spec.compare_keys(a, b));
            keyed.into_iter().map(|(_, d)| d).collect()
        }
        Stage::Limit(n) => {
            let mut docs = docs;
            docs.truncate(usize::try_from(*n).unwrap_or(usize::MAX));
            docs
        }
        Stage::Skip(n) => {
            let mut docs = docs;
            let n = usize::try_from(*n).unwrap_or(usize::MAX).min(docs.len());
            docs.drain(..n);
            docs
        }
        Stage::Count(field) => {
            if docs.is_empty() {
                Vec::new()
            } else {
                let n = docs.len() as i64;
                let v = i32::try_from(n).map(Bson::Int32).unwrap_or(Bson::Int64(n));
                vec![bson::doc! {field.as_str(): v}]
            }
        }
    })
}

// ---------------------------------------------------------------- parsing

fn parse_stage(stage: &Document) -> Result<Stage> {
    if stage.len() != 1 {
        return Err(Error::bad_value(
            "A pipeline stage specification object must contain exactly one field.",
        ));
    }
    let Some((name, arg)) = stage.iter().next() else {
        return Err(Error::Internal("empty stage".into()));
    };
    let want_doc = || -> Result<&Document> {
        match arg {
            Bson::Document(d) => Ok(d),
            other => Err(Error::type_mismatch(format!(
                "the {name} stage specification must be an object, not {}",
                expr::type_name(&Some(other.clone()))
            ))),
        }
    };
    match name.as_str() {
        "$match" => {
            let spec = want_doc()?.clone();
            Ok(Stage::Match {
                filter: Filter::parse(&spec)?,
                spec,
            })
        }
        "$project" => Ok(Stage::Project(Project::parse(want_doc()?)?)),
        "$addFields" | "$set" => {
            let spec = want_doc()?;
            let mut fields = Vec::with_capacity(spec.len());
            for (k, v) in spec {
                let path = parse_field_path(k)
                    .map_err(|e| Error::bad_value(format!("Invalid {name} :: caused by :: {e}")))?;
                fields.push((path, Expr::parse(v)?));
            }
            if fields.is_empty() {
                return Err(Error::bad_value(format!(
                    "Invalid {name} :: caused by :: specification must have at least one field"
                )));
            }
            Ok(Stage::AddFields(fields))
        }
        "$unset" => {
            let paths: Vec<&str> = match arg {
                Bson::String(s) => vec![s.as_str()],
                Bson::Array(a) if !a.is_empty() => a
                    .iter()
                    .map(|v| match v {
                        Bson::String(s) => Ok(s.as_str()),
                        _ => Err(Error::bad_value(
                            "$unset specification must be a string or an array containing only string values",
                        )),
                    })
                    .collect::<Result<_>>()?,
                _ => {
                    return Err(Error::bad_value(
                        "$unset specification must be a string or an array with at least one field",
                    ))
                }
            };
            let mut spec = Document::new();
            for p in paths {
                spec.insert(p, 0);
            }
            Ok(Stage::Unset(Project::parse(&spec)?))
        }
        "$unwind" => Ok(Stage::Unwind(Unwind::parse(arg)?)),
        "$group" => Ok(Stage::Group(Group::parse(want_doc()?)?)),
        "$sort" => {
            let spec = want_doc()?;
            if spec.is_empty() {
                return Err(Error::bad_value(
                    "$sort stage must have at least one sort key",
                ));
            }
            Ok(Stage::Sort(SortSpec::parse(spec)?))
        }
        "$limit" => {
            let n = whole_number(name, arg)?;
            if n <= 0 {
                return Err(Error::bad_value(format!(
                    "the limit must be positive, got {n}"
                )));
            }
            Ok(Stage::Limit(n as u64))
        }
        "$skip" => {
            let n = whole_number(name, arg)?;
            if n < 0 {
                return Err(Error::bad_value(format!(
                    "invalid argument to $skip stage: Expected a non-negative number, got {n}"
                )));
            }
            Ok(Stage::Skip(n as u64))
        }
        "$count" => match arg {
            Bson::String(s) if s.is_empty() => Err(Error::bad_value(
                "the count field must be a non-empty string",
            )),
            Bson::String(s) if s.starts_with('$') => Err(Error::bad_value(
                "the count field cannot be a $-prefixed path",
            )),
            Bson::String(s) if s.contains('.') => {
                Err(Error::bad_value("the count field cannot contain '.'"))
            }
            Bson::String(s) => Ok(Stage::Count(s.clone())),
            _ => Err(Error::type_mismatch(
                "the count field must be a non-empty string",
            )),
        },
        other => Err(Error::UnknownOperator(format!(
            "Unrecognized pipeline stage name: '{other}'"
        ))),
    }
}

fn whole_number(stage: &str, v: &Bson) -> Result<i64> {
    match num_of(v) {
        Some(Num::I32(i)) => Ok(i64::from(i)),
        Some(Num::I64(i)) => Ok(i),
        Some(Num::F64(f)) if f.fract() == 0.0 && f.abs() < 9.2e18 => Ok(f as i64),
        _ => Err(Error::bad_value(format!(
            "invalid argument to {stage} stage: Expected an integer: {}",
            crate::error::render(v)
        ))),
    }
}

// ---------------------------------------------------------------- $project

#[derive(Debug, Clone)]
struct Project {
    inclusion: bool,
    root: ProjNode,
}

#[derive(Debug, Clone, Default)]
struct ProjNode {
    fields: Vec<(String, ProjItem)>,
}

#[derive(Debug, Clone)]
enum ProjItem {
    Include,
    Exclude,
    Computed(Expr),
    Nested(ProjNode),
}

impl ProjNode {
    fn get(&self, k: &str) -> Option<&ProjItem> {
        self.fields.iter().find(|(f, _)| f == k).map(|(_, i)| i)
    }

    fn has_computed(&self) -> bool {
        self.fields.iter().any(|(_, i)| match i {
            ProjItem::Computed(_) => true,
            ProjItem::Nested(n) => n.has_computed(),
            _ => false,
        })
    }

    /// Insert an item at `path`, refusing collisions (`a` and `a.b`).
    fn insert(&mut self, path: &[String], item: ProjItem, full: &str) -> Result<()> {
        let collision = || {
            Error::bad_value(format!(
                "Invalid $project :: caused by :: Path collision at {full}"
            ))
        };
        let Some((first, rest)) = path.split_first() else {
            return Err(collision());
        };
        let pos = self.fields.iter().position(|(f, _)| f == first);
        if rest.is_empty() {
            if pos.is_some() {
                return Err(collision());
            }
            self.fields.push((first.clone(), item));
            return Ok(());
        }
        match pos {
            Some(p) => match &mut self.fields[p].1 {
                ProjItem::Nested(n) => n.insert(rest, item, full),
                _ => Err(collision()),
            },
            None => {
                let mut n = ProjNode::default();
                n.insert(rest, item, full)?;
                self.fields.push((first.clone(), ProjItem::Nested(n)));
                Ok(())
            }
        }
    }
}

impl Project {
    fn parse(spec: &Document) -> Result<Project> {
        if spec.is_empty() {
            return Err(Error::bad_value(
                "Invalid $project :: caused by :: projection specification must have at least one field",
            ));
        }
        let mut root = ProjNode::default();
        let (mut includes, mut excludes) = (false, false);
        parse_projection(spec, &[], &mut root, &mut includes, &mut excludes, 0)?;
        if includes && excludes {
            return Err(Error::bad_value(
                "Invalid $project :: caused by :: Cannot do exclusion on a field in an inclusion projection",
            ));
        }
        // Only `_id: 0` (or nothing but `_id` exclusions) is an exclusion projection.
        let id_excluded = matches!(root.get("_id"), Some(ProjItem::Exclude));
        let inclusion = includes || !(excludes || id_excluded);
        if inclusion && !id_excluded && root.get("_id").is_none() {
            root.fields
                .insert(0, ("_id".to_string(), ProjItem::Include));
        }
        Ok(Project { inclusion, root })
    }

    fn apply(&self, root: &Root<'_>) -> Result<Document> {
        let doc = match root {
            Root::Doc(d) => project_node(&self.root, d, self.inclusion, root)?,
            Root::Raw(r) => {
                let d = crate::doc::to_document(r)?;
                project_node(&self.root, &d, self.inclusion, root)?
            }
        };
        Ok(doc)
    }
}

fn parse_projection(
    spec: &Document,
    prefix: &[String],
    root: &mut ProjNode,
    includes: &mut bool,
    excludes: &mut bool,
    depth: usize,
) -> Result<()> {
    if depth > 100 {
        return Err(Error::bad_value("$project specification nests too deeply"));
    }
    for (k, v) in spec {
        let parts = parse_field_path(k)
            .map_err(|e| Error::bad_value(format!("Invalid $project :: caused by :: {e}")))?;
        let mut path = prefix.to_vec();
        path.extend(parts);
        let full = path.join(".");
        let is_id = path.len() == 1 && path[0] == "_id";
        let item = match v {
            Bson::Boolean(_)
            | Bson::Int32(_)
            | Bson::Int64(_)
            | Bson::Double(_)
            | Bson::Decimal128(_) => {
                if expr::truthy(&Some(v.clone())) {
                    ProjItem::Include
                } else {
                    ProjItem::Exclude
                }
            }
            Bson::Document(d) if d.keys().next().is_some_and(|k| k.starts_with('$')) => {
                ProjItem::Computed(Expr::parse(v)?)
            }
            Bson::Document(d) => {
                if d.is_empty() {
                    return Err(Error::bad_value(format!(
                        "Invalid $project :: caused by :: An empty sub-projection is not a valid value. Found empty object at path {full}"
                    )));
                }
                parse_projection(d, &path, root, includes, excludes, depth + 1)?;
                continue;
            }
            other => ProjItem::Computed(Expr::parse(other)?),
        };
        match (&item, is_id) {
            (_, true) => {}
            (ProjItem::Exclude, false) => *excludes = true,
            (_, false) => *includes = true,
        }
        root.insert(&path, item, &full)?;
    }
    Ok(())
}

fn project_node(
    node: &ProjNode,
    doc: &Document,
    inclusion: bool,
    root: &Root<'_>,
) -> Result<Document> {
    let mut out = Document::new();
    for (k, v) in doc {
        match (node.get(k), inclusion) {
            (Some(ProjItem::Include), _) => {
                out.insert(k.clone(), v.clone());
            }
            (Some(ProjItem::Nested(child)), _) => {
                if let Some(x) = project_value(child, v, inclusion, root)? {
                    out.insert(k.clone(), x);
                }
            }
            (Some(ProjItem::Exclude), _) | (Some(ProjItem::Computed(_)), _) => {}
            (None, true) => {}
            (None, false) => {
                out.insert(k.clone(), v.clone());
            }
        }
    }
    if inclusion {
        add_computed(node, &mut out, root)?;
    }
    Ok(out)
}

/// Project a value under a nested spec: documents recursively, arrays element by
/// element; scalars are dropped by an inclusion and kept by an exclusion.
fn project_value(
    node: &ProjNode,
    v: &Bson,
    inclusion: bool,
    root: &Root<'_>,
) -> Result<Option<Bson>> {
    Ok(match v {
        Bson::Document(d) => Some(Bson::Document(project_node(node, d, inclusion, root)?)),
        Bson::Array(a) => {
            let mut out = Vec::with_capacity(a.len());
            for e in a {
                if let Some(x) = project_value(node, e, inclusion, root)? {
                    out.push(x);
                }
            }
            Some(Bson::Array(out))
        }
        // Computed fields below a scalar replace it with a document.
        _ if inclusion && node.has_computed() => {
            let mut d = Document::new();
            add_computed(node, &mut d, root)?;
            Some(Bson::Document(d))
        }
        _ if inclusion => None,
        other => Some(other.clone()),
    })
}

/// Append an inclusion's computed fields (in spec order) to `out`.
fn add_computed(node: &ProjNode, out: &mut Document, root: &Root<'_>) -> Result<()> {
    for (k, item) in &node.fields {
        match item {
            ProjItem::Computed(e) => {
                if let Some(v) = e.eval(root)? {
                    out.insert(k.clone(), v);
                }
            }
            ProjItem::Nested(child) if child.has_computed() => match out.get_mut(k) {
                // Already projected from the input: computed fields were added there.
                Some(Bson::Document(_)) | Some(Bson::Array(_)) => {}
                _ => {
                    let mut d = Document::new();
                    add_computed(child, &mut d, root)?;
                    out.insert(k.clone(), d);
                }
            },
            _ => {}
        }
    }
    Ok(())
}

// ---------------------------------------------------------------- $addFields

fn add_fields(fields: &[(Vec<String>, Expr)], cur: Cur<'_>) -> Result<Document> {
    // Every expression sees the input document, not fields added by this stage.
    let values = fields
        .iter()
        .map(|(_, e)| e.eval(&cur.root()))
        .collect::<Result<Vec<Value>>>()?;
    let mut doc = cur.into_document()?;
    for ((path, _), v) in fields.iter().zip(values) {
        set_path(&mut doc, path, v);
    }
    Ok(doc)
}

/// Set (or, for missing, remove) `path`; existing fields keep their position,
/// arrays on the way get the field in each element.
fn set_path(doc: &mut Document, path: &[String], v: Value) {
    let Some((first, rest)) = path.split_first() else {
        return;
    };
    if rest.is_empty() {
        match v {
            Some(v) => {
                doc.insert(first.clone(), v);
            }
            None => {
                doc.remove(first);
            }
        }
        return;
    }
    match doc.get_mut(first) {
        Some(Bson::Document(d)) => set_path(d, rest, v),
        Some(Bson::Array(a)) => set_in_array(a, rest, &v),
        _ => {
            if v.is_some() {
                let mut d = Document::new();
                set_path(&mut d, rest, v);
                doc.insert(first.clone(), d);
            }
        }
    }
}

fn set_in_array(a: &mut [Bson], rest: &[String], v: &Value) {
    for e in a.iter_mut() {
        match e {
            Bson::Document(d) => set_path(d, rest, v.clone()),
            Bson::Array(inner) => set_in_array(inner, rest, v),
            other => {
                let mut d = Document::new();
                set_path(&mut d, rest, v.clone());
                *other = Bson::Document(d);
            }
        }
    }
}

// ---------------------------------------------------------------- $unwind

#[derive(Debug, Clone)]
struct Unwind {
    path: Vec<String>,
    include_index: Option<Vec<String>>,
    preserve: bool,
}

impl Unwind {
    fn parse(arg: &Bson) -> Result<Unwind> {
        let path_of = |v: &Bson| -> Result<Vec<String>> {
            match v {
                Bson::String(s) if s.starts_with('$') => parse_field_path(&s[1..]),
                Bson::String(s) => Err(Error::bad_value(format!(
                    "path option to $unwind stage should be prefixed with a '$': {s}"
                ))),
                _ => Err(Error::bad_value(
                    "expected a string as the path for $unwind stage",
                )),
            }
        };
        match arg {
            Bson::String(_) => Ok(Unwind {
                path: path_of(arg)?,
                include_index: None,
                preserve: false,
            }),
            Bson::Document(d) => {
                let mut u = Unwind {
                    path: Vec::new(),
                    include_index: None,
                    preserve: false,
                };
                for (k, v) in d {
                    match (k.as_str(), v) {
                        ("path", _) => u.path = path_of(v)?,
                        ("preserveNullAndEmptyArrays", Bson::Boolean(b)) => u.preserve = *b,
                        ("preserveNullAndEmptyArrays", _) => {
                            return Err(Error::bad_value(
                                "expected a boolean for the preserveNullAndEmptyArrays option to $unwind stage",
                            ))
                        }
                        ("includeArrayIndex", Bson::String(s)) if !s.starts_with('$') && !s.is_empty() => {
                            u.include_index = Some(parse_field_path(s)?)
                        }
                        ("includeArrayIndex", _) => {
                            return Err(Error::bad_value(
                                "includeArrayIndex option to $unwind stage should be a non-empty string not prefixed with '$'",
                            ))
                        }
                        (other, _) => {
                            return Err(Error::bad_value(format!(
                                "unrecognized option to $unwind stage: {other}"
                            )))
                        }
                    }
                }
                if u.path.is_empty() {
                    return Err(Error::bad_value("no path specified to $unwind stage"));
                }
                Ok(u)
            }
            _ => Err(Error::bad_value(
                "expected either a string or an object as specification for $unwind stage",
            )),
        }
    }

    fn apply(&self, doc: Document) -> Result<Vec<Document>> {
        let value = Root::Doc(&doc).get(&self.path)?;
        let with = |mut d: Document, v: Value, idx: Option<i64>| -> Document {
            set_path(&mut d, &self.path, v);
            if let Some(ip) = &self.include_index {
                set_path(&mut d, ip, Some(idx.map(Bson::Int64).unwrap_or(Bson::Null)));
            }
            d
        };
        // `$unwind` reads the path through documents only (no array mapping).
        let value = if plain_path_exists(&doc, &self.path) {
            value
        } else {
            None
        };
        Ok(match value {
            Some(Bson::Array(items)) if !items.is_empty() => items
                .into_iter()
                .enumerate()
                .map(|(i, v)| with(doc.clone(), Some(v), Some(i as i64)))
                .collect(),
            Some(Bson::Array(_)) if self.preserve => vec![with(doc, None, None)],
            Some(Bson::Null) | None if self.preserve => {
                let v = value;
                vec![with(doc, v, None)]
            }
            Some(Bson::Array(_)) | Some(Bson::Null) | None => Vec::new(),
            Some(other) => vec![with(doc, Some(other), None)],
        })
    }
}

fn plain_path_exists(doc: &Document, path: &[String]) -> bool {
    let Some((first, rest)) = path.split_first() else {
        return true;
    };
    match (doc.get(first), rest.is_empty()) {
        (Some(_), true) => true,
        (Some(Bson::Document(d)), false) => plain_path_exists(d, rest),
        _ => false,
    }
}

// ---------------------------------------------------------------- $group

#[derive(Debug, Clone)]
struct Group {
    id: Expr,
    fields: Vec<(String, AccOp, Expr)>,
    memory_limit: usize,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum AccOp {
    Sum,
    Avg,
    Min,
    Max,
    First,
    Last,
    Push,
    AddToSet,
}

/// One group's accumulator state.
#[derive(Debug, Clone)]
enum Acc {
    Sum(SumState),
    Avg(SumState),
    Min(Option<Bson>),
    Max(Option<Bson>),
    /// `None` until the first document; then its value (missing → null).
    First(Option<Bson>),
    Last(Option<Bson>),
    Push(Vec<Bson>, usize),
    AddToSet(BTreeSet<OrdBson>, usize),
}

/// An exact running sum: integers in i128 (cannot overflow for < 2^64 inputs),
/// doubles separately; the widest input type decides the result type.
#[derive(Debug, Clone, Copy, Default)]
struct SumState {
    int: i128,
    dbl: f64,
    /// 0 = int32, 1 = int64, 2 = double.
    widest: u8,
    count: u64,
}

impl SumState {
    fn add(&mut self, v: &Bson) -> Result<()> {
        match v {
            Bson::Int32(i) => self.int += i128::from(*i),
            Bson::Int64(i) => {
                self.int += i128::from(*i);
                self.widest = self.widest.max(1);
            }
            Bson::Double(f) => {
                self.dbl += f;
                self.widest = 2;
            }
            Bson::Decimal128(_) => {
                return Err(Error::bad_value(
                    "$sum/$avg: decimal128 arithmetic is not supported by duetdb",
                ))
            }
            // Non-numeric values are ignored, as in MongoDB.
            _ => return Ok(()),
        }
        self.count += 1;
        Ok(())
    }

    fn merge(&mut self, o: &SumState) {
        self.int += o.int;
        self.dbl += o.dbl;
        self.widest = self.widest.max(o.widest);
        self.count += o.count;
    }

    fn sum(&self) -> Bson {
        if self.widest == 2 {
            return Bson::Double(self.int as f64 + self.dbl);
        }
        match (i32::try_from(self.int), i64::try_from(self.int)) {
            (Ok(i), _) if self.widest == 0 => Bson::Int32(i),
            (_, Ok(l)) => Bson::Int64(l),
            _ => Bson::Double(self.int as f64),
        }
    }

    fn avg(&self) -> Bson {
        if self.count == 0 {
            return Bson::Null;
        }
        Bson::Double((self.int as f64 + self.dbl) / self.count as f64)
    }
}

/// A value ordered by MongoDB's comparison (equal values are one key).
/// Documents and arrays carry their raw form, encoded once, because comparing
/// owned documents would re-encode both sides at every comparison.
#[derive(Debug, Clone)]
struct OrdBson(Bson, Option<RawBson>);

impl OrdBson {
    fn new(v: Bson) -> OrdBson {
        let raw = match &v {
            Bson::Document(_) | Bson::Array(_) => crate::doc::value::to_raw(&v),
            _ => None,
        };
        OrdBson(v, raw)
    }
}

impl PartialEq for OrdBson {
    fn eq(&self, o: &Self) -> bool {
        self.cmp(o) == Ordering::Equal
    }
}
impl Eq for OrdBson {}
impl PartialOrd for OrdBson {
    fn partial_cmp(&self, o: &Self) -> Option<Ordering> {
        Some(self.cmp(o))
    }
}
impl Ord for OrdBson {
    fn cmp(&self, o: &Self) -> Ordering {
        match (&self.1, &o.1) {
            (Some(a), Some(b)) => {
                crate::doc::value::compare(a.as_raw_bson_ref(), b.as_raw_bson_ref())
            }
            _ => compare(&self.0, &o.0),
        }
    }
}

/// A total order on values refining `compare`: among values `compare` calls
/// equal (`1`, `1.0`, `NumberLong(1)`), the smaller type code, then the smaller
/// bit pattern / rendering. Used to pick a representative independently of
/// arrival order.
pub fn canonical_cmp(a: &Bson, b: &Bson) -> Ordering {
    compare(a, b).then_with(|| tie_break(a, b))
}

/// [`canonical_cmp`] for two values already known to compare equal (cheap when
/// they are identical, the common case).
fn tie_break(a: &Bson, b: &Bson) -> Ordering {
    if a == b {
        return Ordering::Equal;
    }
    (a.element_type() as u8)
        .cmp(&(b.element_type() as u8))
        .then_with(|| match (a, b) {
            (Bson::Double(x), Bson::Double(y)) => x.to_bits().cmp(&y.to_bits()),
            _ => format!("{a:?}").cmp(&format!("{b:?}")),
        })
}

#[derive(Debug, Clone, Default)]
struct GroupState {
    groups: BTreeMap<OrdBson, Vec<Acc>>,
    bytes: usize,
}

/// Rough fixed cost of a group entry beyond its key and values.
const GROUP_ENTRY_OVERHEAD: usize = 64;

impl Group {
    fn parse(spec: &Document) -> Result<Group> {
        let id = spec
            .get("_id")
            .ok_or_else(|| Error::bad_value("a group specification must include an _id"))?;
        let id = Expr::parse(id)?;
        let mut fields = Vec::new();
        for (k, v) in spec.iter().filter(|(k, _)| k.as_str() != "_id") {
            if k.starts_with('$') {
                return Err(Error::bad_value(format!(
                    "The field name '{k}' cannot be an operator name"
                )));
            }
            if k.contains('.') {
                return Err(Error::bad_value(format!(
                    "the group aggregate field name '{k}' cannot be used because $group's field names cannot contain '.'"
                )));
            }
            let Bson::Document(acc) = v else {
                return Err(Error::bad_value(format!(
                    "the group aggregate field '{k}' must be defined as an expression inside an object"
                )));
            };
            if acc.len() != 1 {
                return Err(Error::bad_value(format!(
                    "the computed aggregate '{k}' must specify exactly one operator"
                )));
            }
            let Some((op, arg)) = acc.iter().next() else {
                return Err(Error::Internal("empty accumulator".into()));
            };
            let (op, arg) = match op.as_str() {
                "$sum" => (AccOp::Sum, Expr::parse(arg)?),
                "$avg" => (AccOp::Avg, Expr::parse(arg)?),
                "$min" => (AccOp::Min, Expr::parse(arg)?),
                "$max" => (AccOp::Max, Expr::parse(arg)?),
                "$first" => (AccOp::First, Expr::parse(arg)?),
                "$last" => (AccOp::Last, Expr::parse(arg)?),
                "$push" => (AccOp::Push, Expr::parse(arg)?),
                "$addToSet" => (AccOp::AddToSet, Expr::parse(arg)?),
                "$count" => match arg {
                    Bson::Document(d) if d.is_empty() => {
                        (AccOp::Sum, Expr::Literal(Bson::Int32(1)))
                    }
                    _ => {
                        return Err(Error::bad_value(
                            "$count takes no arguments, i.e. $count:{}",
                        ))
                    }
                },
                other => {
                    return Err(Error::bad_value(format!(
                        "unknown group operator '{other}'"
                    )))
                }
            };
            fields.push((k.clone(), op, arg));
        }
        Ok(Group {
            id,
            fields,
            memory_limit: GROUP_MEMORY_LIMIT,
        })
    }

    /// All accumulators mergeable (no `$first`/`$last`, which depend on order).
    fn is_mergeable(&self) -> bool {
        self.fields
            .iter()
            .all(|(_, op, _)| !matches!(op, AccOp::First | AccOp::Last))
    }

    fn new_accs(&self) -> Vec<Acc> {
        self.fields
            .iter()
            .map(|(_, op, _)| match op {
                AccOp::Sum => Acc::Sum(SumState::default()),
                AccOp::Avg => Acc::Avg(SumState::default()),
                AccOp::Min => Acc::Min(None),
                AccOp::Max => Acc::Max(None),
                AccOp::First => Acc::First(None),
                AccOp::Last => Acc::Last(None),
                AccOp::Push => Acc::Push(Vec::new(), 0),
                AccOp::AddToSet => Acc::AddToSet(BTreeSet::new(), 0),
            })
            .collect()
    }

    fn accumulate(&self, gs: &mut GroupState, root: Root<'_>) -> Result<()> {
        let key = OrdBson::new(self.id.eval(&root)?.unwrap_or(Bson::Null));
        replace_key_if_smaller(&mut gs.groups, &key);
        let accs = match gs.groups.entry(key) {
            Entry::Occupied(o) => o.into_mut(),
            Entry::Vacant(v) => {
                gs.bytes +=
                    approx_size(&v.key().0) + GROUP_ENTRY_OVERHEAD * (1 + self.fields.len());
                v.insert(self.new_accs())
            }
        };
        for ((_, _, arg), acc) in self.fields.iter().zip(accs.iter_mut()) {
            let v = arg.eval(&root)?;
            gs.bytes += feed_acc(acc, v)?;
        }
        self.check_memory(gs.bytes)
    }

    fn check_memory(&self, bytes: usize) -> Result<()> {
        if bytes > self.memory_limit {
            return Err(Error::ExceededMemoryLimit(format!(
                "Exceeded memory limit for $group, but didn't allow external spilling ({} bytes of group state, the limit is {} bytes)",
                bytes, self.memory_limit
            )));
        }
        Ok(())
    }

    fn merge(&self, a: GroupState, b: GroupState) -> Result<GroupState> {
        // Fold the smaller map into the larger.
        let (mut big, small) = if a.groups.len() >= b.groups.len() {
            (a, b)
        } else {
            (b, a)
        };
        big.bytes += small.bytes;
        for (key, accs) in small.groups {
            match big.groups.get_mut(&key) {
                Some(mine) => {
                    for (m, o) in mine.iter_mut().zip(accs) {
                        merge_acc(m, o)?;
                    }
                    big.bytes = big
                        .bytes
                        .saturating_sub(approx_size(&key.0) + GROUP_ENTRY_OVERHEAD);
                    replace_key_if_smaller(&mut big.groups, &key);
                }
                None => {
                    big.groups.insert(key, accs);
                }
            }
        }
        self.check_memory(big.bytes)?;
        Ok(big)
    }

    fn finish(&self, gs: GroupState) -> Result<Vec<Document>> {
        let mut out = Vec::with_capacity(gs.groups.len());
        for (key, accs) in gs.groups {
            let mut d = Document::new();
            d.insert("_id", key.0);
            for ((name, _, _), acc) in self.fields.iter().zip(accs) {
                d.insert(name.clone(), finish_acc(acc));
            }
            out.push(d);
        }
        Ok(out)
    }
}

/// Keep the canonical representative of a group key (see [`canonical_cmp`]).
fn replace_key_if_smaller(groups: &mut BTreeMap<OrdBson, Vec<Acc>>, key: &OrdBson) {
    let replace = groups
        .get_key_value(key)
        .is_some_and(|(k, _)| tie_break(&key.0, &k.0) == Ordering::Less);
    if replace {
        if let Some(v) = groups.remove(key) {
            groups.insert(key.clone(), v);
        }
    }
}

/// Feed one value; returns the bytes the state grew by.
fn feed_acc(acc: &mut Acc, v: Value) -> Result<usize> {
    let want = if matches!(acc, Acc::Min(_)) {
        Ordering::Less
    } else {
        Ordering::Greater
    };
    match acc {
        Acc::Sum(s) | Acc::Avg(s) => {
            if let Some(v) = &v {
                s.add(v)?;
            }
            Ok(0)
        }
        Acc::Min(best) | Acc::Max(best) => {
            let Some(v) = v.filter(|x| !matches!(x, Bson::Null | Bson::Undefined)) else {
                return Ok(0);
            };
            // Count the value's memory once, when the group gets its first one.
            let grow = if best.is_none() { approx_size(&v) } else { 0 };
            *best = pick(best.take(), v, want);
            Ok(grow)
        }
        Acc::First(first) => {
            if first.is_none() {
                *first = Some(v.unwrap_or(Bson::Null));
            }
            Ok(0)
        }
        Acc::Last(last) => {
            *last = Some(v.unwrap_or(Bson::Null));
            Ok(0)
        }
        Acc::Push(items, bytes) => {
            // $push keeps null but skips missing, as in MongoDB.
            let Some(v) = v else { return Ok(0) };
            let n = approx_size(&v);
            *bytes += n;
            check_array_size("$push", *bytes)?;
            items.push(v);
            Ok(n)
        }
        Acc::AddToSet(set, bytes) => {
            let Some(v) = v else { return Ok(0) };
            let n = approx_size(&v);
            let key = OrdBson::new(v);
            if let Some(existing) = set.get(&key) {
                if tie_break(&key.0, &existing.0) == Ordering::Less {
                    set.replace(key);
                }
                return Ok(0);
            }
            *bytes += n;
            check_array_size("$addToSet", *bytes)?;
            set.insert(key);
            Ok(n)
        }
    }
}

fn check_array_size(op: &str, bytes: usize) -> Result<()> {
    if bytes > MAX_DOC_SIZE {
        tracing::debug!(
            op,
            bytes,
            "accumulator array exceeds the document size limit"
        );
        return Err(Error::DocumentTooLarge {
            size: bytes,
            limit: MAX_DOC_SIZE,
        });
    }
    Ok(())
}

fn merge_acc(mine: &mut Acc, other: Acc) -> Result<()> {
    match (mine, other) {
        (Acc::Sum(a), Acc::Sum(b)) | (Acc::Avg(a), Acc::Avg(b)) => a.merge(&b),
        (Acc::Min(a), Acc::Min(b)) => {
            if let Some(b) = b {
                *a = pick(a.take(), b, Ordering::Less);
            }
        }
        (Acc::Max(a), Acc::Max(b)) => {
            if let Some(b) = b {
                *a = pick(a.take(), b, Ordering::Greater);
            }
        }
        (Acc::Push(a, an), Acc::Push(b, bn)) => {
            *an += bn;
            check_array_size("$push", *an)?;
            a.extend(b);
        }
        (Acc::AddToSet(a, an), Acc::AddToSet(b, _)) => {
            for key in b {
                let n = approx_size(&key.0);
                feed_acc_set(a, an, key, n)?;
            }
        }
        (Acc::First(_), _) | (Acc::Last(_), _) => {
            return Err(Error::Internal("$first/$last are not mergeable".into()))
        }
        _ => return Err(Error::Internal("mismatched accumulators".into())),
    }
    Ok(())
}

fn feed_acc_set(
    set: &mut BTreeSet<OrdBson>,
    bytes: &mut usize,
    key: OrdBson,
    n: usize,
) -> Result<()> {
    if let Some(existing) = set.get(&key) {
        if tie_break(&key.0, &existing.0) == Ordering::Less {
            set.replace(key);
        }
        return Ok(());
    }
    *bytes += n;
    check_array_size("$addToSet", *bytes)?;
    set.insert(key);
    Ok(())
}

/// The min (`want = Less`) or max of two values, ties broken canonically.
fn pick(a: Option<Bson>, b: Bson, want: Ordering) -> Option<Bson> {
    match a {
        None => Some(b),
        Some(a) => {
            let c = compare(&b, &a);
            if c == want || (c == Ordering::Equal && tie_break(&b, &a) == Ordering::Less) {
                Some(b)
            } else {
                Some(a)
            }
        }
    }
}

fn finish_acc(acc: Acc) -> Bson {
    match acc {
        Acc::Sum(s) => s.sum(),
        Acc::Avg(s) => s.avg(),
        Acc::Min(v) | Acc::Max(v) | Acc::First(v) | Acc::Last(v) => v.unwrap_or(Bson::Null),
        Acc::Push(items, _) => Bson::Array(items),
        Acc::AddToSet(set, _) => Bson::Array(set.into_iter().map(|k| k.0).collect()),
    }
}

/// Approximate memory held by a value (for the `$group` / `$push` limits):
/// its BSON size plus per-node overhead, computed without serializing.
pub fn approx_size(v: &Bson) -> usize {
    let mut total = 0usize;
    let mut stack = vec![v];
    while let Some(v) = stack.pop() {
        total += 16;
        match v {
            Bson::String(s) | Bson::Symbol(s) | Bson::JavaScriptCode(s) => total += s.len(),
            Bson::Binary(b) => total += b.bytes.len(),
            Bson::Document(d) => {
                for (k, x) in d {
                    total += k.len() + 8;
                    stack.push(x);
                }
            }
            Bson::Array(a) => stack.extend(a.iter()),
            Bson::RegularExpression(r) => total += r.pattern.len() + r.options.len(),
            Bson::JavaScriptCodeWithScope(c) => {
                total += c.code.len();
                for (k, x) in &c.scope {
                    total += k.len() + 8;
                    stack.push(x);
                }
            }
            _ => {}
        }
    }
    total
}

// ---------------------------------------------------------------- preparation

/// The pieces execution needs, from a parsed pipeline.
pub struct Prepared {
    pub filter: Document,
    pub part: CommutativePart,
    pub rest: Pipeline,
    /// Stop feeding once the part's output holds this many documents.
    pub stop_after: Option<usize>,
    /// [`Split::olcp_eligible`].
    pub eligible: bool,
}

/// Parse and split `pipeline` for execution.
pub fn prepare(pipeline: &[Document]) -> Result<Prepared> {
    let split = Pipeline::parse(pipeline)?.split();
    let eligible = split.olcp_eligible();
    let part = split
        .commutative
        .unwrap_or_else(CommutativePart::collect_all);
    let stop_after = if part.has_group() {
        None
    } else {
        split
            .rest
            .leading_limit()
            .map(|n| usize::try_from(n).unwrap_or(usize::MAX))
    };
    Ok(Prepared {
        filter: split.scan_filter.unwrap_or_default(),
        part,
        rest: split.rest,
        stop_after,
        eligible,
    })
}

impl Prepared {
    /// The stage names of the commutative part and of the rest.
    pub fn names(&self) -> (Vec<String>, Vec<String>) {
        (
            self.part
                .stage_names()
                .into_iter()
                .map(String::from)
                .collect(),
            self.rest
                .stage_names()
                .into_iter()
                .map(String::from)
                .collect(),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bson::doc;

    fn run(p: Vec<Document>, docs: Vec<Document>) -> Result<Vec<Document>> {
        Pipeline::parse(&p)?.run_on(docs)
    }

    #[test]
    fn sum_types() {
        let mut s = SumState::default();
        s.add(&Bson::Int32(i32::MAX)).expect("add");
        assert_eq!(s.sum(), Bson::Int32(i32::MAX));
        s.add(&Bson::Int32(1)).expect("add");
        assert_eq!(s.sum(), Bson::Int64(i64::from(i32::MAX) + 1));
        let mut l = SumState::default();
        l.add(&Bson::Int64(1)).expect("add");
        assert_eq!(l.sum(), Bson::Int64(1));
        l.add(&Bson::Int64(i64::MAX)).expect("add");
        assert!(matches!(l.sum(), Bson::Double(_)));
        l.add(&Bson::String("x".into())).expect("ignored");
        assert_eq!(SumState::default().sum(), Bson::Int32(0));
        assert_eq!(SumState::default().avg(), Bson::Null);
    }

    #[test]
    fn canonical_representatives() {
        assert_eq!(
            canonical_cmp(&Bson::Double(1.0), &Bson::Int32(1)),
            Ordering::Less
        );
        assert_eq!(
            canonical_cmp(&Bson::Int32(1), &Bson::Int32(1)),
            Ordering::Equal
        );
        let out = run(
            vec![doc! {"$group": {"_id": "$k", "n": {"$sum": 1}}}],
            vec![doc! {"k": 1.0}, doc! {"k": 1}, doc! {"k": 1_i64}],
        )
        .expect("runs");
        assert_eq!(out.len(), 1);
        assert_eq!(out[0].get("n"), Some(&Bson::Int32(3)));
    }

    #[test]
    fn split_shapes() {
        let p = Pipeline::parse(&[
            doc! {"$match": {"a": 1}},
            doc! {"$match": {"b": 2}},
            doc! {"$project": {"a": 1}},
            doc! {"$group": {"_id": "$a", "n": {"$sum": 1}}},
            doc! {"$sort": {"n": -1}},
        ])
        .expect("parse");
        let s = p.split();
        assert_eq!(s.scan_filter, Some(doc! {"$and": [{"a": 1}, {"b": 2}]}));
        let c = s.commutative.as_ref().expect("commutative");
        assert_eq!(c.stage_names(), vec!["$project", "$group"]);
        assert_eq!(s.rest.stage_names(), vec!["$sort"]);
        assert!(s.olcp_eligible());

        let s = Pipeline::parse(&[
            doc! {"$match": {"a": 1}},
            doc! {"$group": {"_id": null, "f": {"$first": "$a"}}},
        ])
        .expect("parse")
        .split();
        assert!(s.commutative.is_none());
        assert!(!s.olcp_eligible());

        let s = Pipeline::parse(&[doc! {"$sort": {"a": 1}}, doc! {"$limit": 1}])
            .expect("parse")
            .split();
        assert!(s.scan_filter.is_none() && s.commutative.is_none());
        assert!(!s.olcp_eligible());
    }
}
