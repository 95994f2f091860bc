//! Named snapshots over the wire (Cassandra's snapshot API, extended):
//! `createSnapshot`, `listSnapshots`, `dropSnapshot`; reads name one with
//! `$duet: {snapshotName: "…"}` (see `source.rs`).
//!
//! A named snapshot is a pinned copy-on-write root of one database (see the
//! engine's `snapshot.rs`); these commands only translate arguments and errors.
//! On a replica set, create and drop are log entries applied by every member
//! (docs/design.md §19), so a snapshot is the same state on every member.
//!
//! Read consistency levels (the Cassandra Snapshotted Reads paper's): a read
//! on a named snapshot may ask `$duet: {consistency: "one" | "majority" |
//! "all"}` (default `one`: served from this member's copy as is). With
//! `majority` or `all`, the member serving it computes the digest of each
//! collection the read reads in its copy — the source collection, and an
//! `aggregate`'s `$lookup`/`$graphLookup`/`$unionWith` collections, in
//! sub-pipelines too ([`read_collections`]) — (`duet_repl::digest`) and asks the other
//! members of the configuration for theirs (over the Raft port, each
//! answering once it has applied the log as far as this member has, within
//! [`DIGEST_WAIT`] or what is left of `maxTimeMS`, past which the read
//! fails with 50 MaxTimeMSExpired); the read runs only if, for every
//! collection it reads, that many members — this one
//! included — hold the same digest: a majority of the configuration's
//! members, or all of them (collections are checked one after the other,
//! all within the one `maxTimeMS`). Otherwise it fails: 301 DataCorruptionDetected
//! when a member answered with another digest (the copies differ; the
//! members are named), 133 FailedToSatisfyReadPreference when too few
//! answered (down, unreachable, or without the snapshot). A server that is
//! not a replica-set member is the only copy: every level is met.

use std::time::{Duration, UNIX_EPOCH};

use bson::{doc, Bson, DateTime, Document};

use super::Ctx;
use crate::args;
use crate::error::{CmdResult, CommandError};
use duetdb::Snapshot;

/// `{createSnapshot: <name>, collections?: [..], ttlSeconds?: n, durable?: bool}`.
/// `durable: true` pins the snapshot to its own checkpoint file so it survives
/// restarts (the reply then comes after the image is synced).
pub fn create(ctx: &Ctx<'_>, cmd: &Document) -> CmdResult {
    let name = args::req_str(cmd, "createSnapshot")?;
    let collections = match args::opt_array(cmd, "collections")? {
        None => None,
        Some(items) => Some(
            items
                .iter()
                .map(|b| match b {
                    Bson::String(s) => Ok(s.clone()),
                    other => Err(CommandError::type_mismatch(format!(
                        "collections must hold strings, not {:?}",
                        other.element_type()
                    ))),
                })
                .collect::<CmdResult<Vec<String>>>()?,
        ),
    };
    let ttl = match args::opt_i64(cmd, "ttlSeconds")? {
        None => None,
        Some(s) if s > 0 => Some(Duration::from_secs(s as u64)),
        Some(s) => {
            return Err(CommandError::bad_value(format!(
                "ttlSeconds must be positive, not {s}"
            )))
        }
    };
    let durable = args::flag(cmd, "durable")?;
    let opts = duetdb::SnapshotOptions {
        collections,
        ttl,
        durable,
    };
    let info = match ctx.state.repl.get() {
        // A replica set takes it on every member, at one log position.
        Some(m) => {
            m.create_snapshot(ctx.db, name, opts)?;
            ctx.database()?.snapshot_info(name)?
        }
        None => ctx.database()?.create_snapshot_with(name, opts)?,
    };
    Ok(doc! {
        "name": info.name,
        "csn": info.csn.min(i64::MAX as u64) as i64,
        "atClusterTime": crate::snapshots::csn_to_timestamp(info.csn),
        "durable": info.durable,
        "ok": 1.0,
    })
}

/// `{listSnapshots: 1}`: name, csn, created, age, ttl, collections, bytes
/// retained, durable.
pub fn list(ctx: &Ctx<'_>) -> CmdResult {
    let mut out = Vec::new();
    for info in ctx.database()?.list_snapshots() {
        let created = info
            .created
            .duration_since(UNIX_EPOCH)
            .map(|d| DateTime::from_millis(d.as_millis().min(i64::MAX as u128) as i64))
            .unwrap_or(DateTime::from_millis(0));
        let mut d = doc! {
            "name": info.name,
            "csn": info.csn.min(i64::MAX as u64) as i64,
            "created": created,
            "ageMillis": info.age.as_millis().min(i64::MAX as u128) as i64,
            "retainedBytes": info.retained.bytes.min(i64::MAX as u64) as i64,
            "retainedNodes": info.retained.nodes.min(i64::MAX as u64) as i64,
            "retainedDocs": info.retained.docs.min(i64::MAX as u64) as i64,
            "durable": info.durable,
        };
        if let Some(ttl) = info.ttl {
            d.insert("ttlSeconds", ttl.as_secs().min(i64::MAX as u64) as i64);
        }
        if let Some(c) = info.collections {
            d.insert("collections", c);
        }
        out.push(Bson::Document(d));
    }
    Ok(doc! {"snapshots": out, "ok": 1.0})
}

/// `{dropSnapshot: <name>}`.
pub fn drop(ctx: &Ctx<'_>, cmd: &Document) -> CmdResult {
    let name = args::req_str(cmd, "dropSnapshot")?;
    match ctx.state.repl.get() {
        Some(m) => m.drop_snapshot(ctx.db, name)?,
        None => ctx.database()?.drop_snapshot(name)?,
    }
    Ok(doc! {"ok": 1.0})
}

/// How long a consistency check waits for the other members' digests (each
/// member's wait to apply the log as far as this one, then its scan).
pub const DIGEST_WAIT: Duration = Duration::from_secs(5);
/// What the other members' scans and the round trips may add to
/// [`DIGEST_WAIT`] (without `maxTimeMS`).
pub const DIGEST_GRACE: Duration = Duration::from_secs(10);

/// A read's consistency level on a named snapshot (see the module doc).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Consistency {
    One,
    Majority,
    All,
}

impl Consistency {
    pub fn parse(s: &str) -> CmdResult<Consistency> {
        match s {
            "one" => Ok(Consistency::One),
            "majority" => Ok(Consistency::Majority),
            "all" => Ok(Consistency::All),
            other => Err(CommandError::bad_value(format!(
                "$duet.consistency must be 'one', 'majority' or 'all', not '{other}'"
            ))),
        }
    }

    /// `$duet.consistency` of `cmd`, if given.
    pub fn of(cmd: &Document) -> CmdResult<Option<Consistency>> {
        match args::opt_doc(cmd, "$duet")?.and_then(|d| d.get("consistency")) {
            None => Ok(None),
            Some(Bson::String(s)) => Consistency::parse(s).map(Some),
            Some(other) => Err(CommandError::type_mismatch(format!(
                "$duet.consistency must be a string, not {:?}",
                other.element_type()
            ))),
        }
    }

    /// How many of `members` members must hold the same copy.
    fn needed(self, members: usize) -> usize {
        match self {
            Consistency::One => 1,
            Consistency::Majority => members / 2 + 1,
            Consistency::All => members,
        }
    }

    fn name(self) -> &'static str {
        match self {
            Consistency::One => "one",
            Consistency::Majority => "majority",
            Consistency::All => "all",
        }
    }
}

/// The collections of a named snapshot that read `cmd` on collection
/// `coll` reads: `coll`, then those an `aggregate`'s pipeline joins or
/// unions (sorted, once each). A pipeline that does not parse adds none: the
/// command fails on it anyway.
pub fn read_collections(cmd: &Document, coll: &str) -> Vec<String> {
    let mut out = vec![coll.to_string()];
    if !cmd.contains_key("aggregate") {
        return out;
    }
    let Ok(stages) = cmd.get_array("pipeline") else {
        return out;
    };
    let stages: Option<Vec<Document>> = stages.iter().map(|s| s.as_document().cloned()).collect();
    if let Some(p) = stages.and_then(|s| duetdb::lang::Pipeline::parse(&s).ok()) {
        out.extend(p.foreign_names().into_iter().filter(|f| f != coll));
    }
    out
}

/// A read of collection `coll` of named snapshot `name` (already resolved
/// here as `snap`) at the consistency level `cmd` asks for: `Ok` when enough
/// members hold the same copy of every collection it reads
/// ([`read_collections`]; see the module documentation).
pub fn check_consistency(
    ctx: &Ctx<'_>,
    cmd: &Document,
    name: &str,
    snap: &Snapshot,
    coll: &str,
) -> CmdResult<()> {
    let level = Consistency::of(cmd)?.unwrap_or(Consistency::One);
    if level == Consistency::One {
        return Ok(());
    }
    let Some(m) = ctx.state.repl.get() else {
        return Ok(());
    };
    let members = m.status().members.len().max(1);
    let need = level.needed(members);
    if need <= 1 {
        return Ok(());
    }
    for coll in read_collections(cmd, coll) {
        let mine = duet_repl::digest::of_snapshot(snap, &coll);
        // `maxTimeMS` bounds the wait too; without it, the members' scans and
        // the round trips get `DIGEST_GRACE` beyond the wait.
        let (wait, limit) = match ctx.cancel.deadline() {
            Some(d) => {
                let left = d.saturating_duration_since(std::time::Instant::now());
                (DIGEST_WAIT.min(left), left)
            }
            None => (DIGEST_WAIT, DIGEST_WAIT + DIGEST_GRACE),
        };
        let answers = m.member_digests((ctx.db, name, &coll), &mine, need - 1, wait, limit);
        if let Some(r) = ctx.cancel.reason() {
            return Err(CommandError::new(r.code(), r.code_name(), r.message()));
        }
        judge(name, &coll, level, members, &mine, &answers)?;
    }
    Ok(())
}

/// Whether this member's digest `mine` and the other members' `answers`
/// meet consistency `level` among `members` members (see
/// [`check_consistency`]).
fn judge(
    name: &str,
    coll: &str,
    level: Consistency,
    members: usize,
    mine: &duet_repl::digest::Digest,
    answers: &[(String, Result<duet_repl::digest::Digest, String>)],
) -> CmdResult<()> {
    let need = level.needed(members);
    let agree = 1 + answers
        .iter()
        .filter(|(_, r)| r.as_ref().is_ok_and(|d| d == mine))
        .count();
    if agree >= need {
        return Ok(());
    }
    let differing: Vec<String> = answers
        .iter()
        .filter(|(_, r)| r.as_ref().is_ok_and(|d| d != mine))
        .map(|(host, r)| match r {
            Ok(d) => format!("{host} ({} documents)", d.count),
            Err(_) => host.clone(),
        })
        .collect();
    let level = level.name();
    if !differing.is_empty() {
        return Err(CommandError::new(
            301,
            "DataCorruptionDetected",
            format!(
                "named snapshot '{name}' collection '{coll}' differs between members: \
                 {agree} of {members} hold this member's copy ({} documents), consistency \
                 '{level}' needs {need}; another copy on {}",
                mine.count,
                differing.join(", ")
            ),
        ));
    }
    let missing: Vec<String> = answers
        .iter()
        .filter_map(|(host, r)| r.as_ref().err().map(|why| format!("{host}: {why}")))
        .collect();
    Err(CommandError::new(
        133,
        "FailedToSatisfyReadPreference",
        format!(
            "consistency '{level}' on named snapshot '{name}' needs {need} of {members} \
             members to hold the same copy; {agree} answered with it ({})",
            missing.join("; ")
        ),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use duet_repl::digest::Digest;

    #[test]
    fn an_aggregate_checks_the_collections_its_pipeline_reads() {
        let find = doc! {"find": "items", "filter": {}};
        assert_eq!(read_collections(&find, "items"), ["items"]);
        let agg = doc! {"aggregate": "items", "pipeline": [
            {"$lookup": {"from": "users", "localField": "u", "foreignField": "_id", "as": "u"}},
            {"$unionWith": {"coll": "archive", "pipeline": [
                {"$graphLookup": {"from": "tree", "startWith": "$p", "connectFromField": "p",
                                  "connectToField": "_id", "as": "t"}}]}},
            {"$lookup": {"from": "items", "pipeline": [], "as": "self"}},
        ], "cursor": {}};
        assert_eq!(
            read_collections(&agg, "items"),
            ["items", "archive", "tree", "users"]
        );
        let bad = doc! {"aggregate": "items", "pipeline": [{"$nope": 1}], "cursor": {}};
        assert_eq!(read_collections(&bad, "items"), ["items"]);
    }

    #[test]
    fn consistency_levels_count_agreeing_members_and_name_the_others() {
        let d = |h: &str| Digest {
            count: 3,
            hash: h.to_string(),
        };
        let mine = d("a");
        let ok = |h: &str, r: Result<Digest, String>| (h.to_string(), r);
        let down = || Err("unreachable: connection refused".to_string());
        // Three members, one down: a majority agrees, not all.
        let answers = [ok("m1:1", Ok(d("a"))), ok("m2:2", down())];
        assert!(judge("s", "c", Consistency::Majority, 3, &mine, &answers).is_ok());
        let e = judge("s", "c", Consistency::All, 3, &mine, &answers).expect_err("all");
        assert_eq!(e.code, 133);
        assert!(e.message.contains("m2:2"), "{}", e.message);
        // A member with another copy: 301 naming it, unless enough agree.
        let answers = [ok("m1:1", Ok(d("b"))), ok("m2:2", down())];
        let e = judge("s", "c", Consistency::Majority, 3, &mine, &answers).expect_err("differs");
        assert_eq!(e.code, 301);
        assert!(e.message.contains("m1:1"), "{}", e.message);
        let answers = [ok("m1:1", Ok(d("b"))), ok("m2:2", Ok(d("a")))];
        assert!(judge("s", "c", Consistency::Majority, 3, &mine, &answers).is_ok());
        assert_eq!(
            judge("s", "c", Consistency::All, 3, &mine, &answers)
                .expect_err("one differs")
                .code,
            301
        );
    }
}
