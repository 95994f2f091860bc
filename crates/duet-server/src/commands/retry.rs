//! A retried `insert`/`update`/`delete` batch whose first execution applied
//! only some of its statements (a duplicate key at statement 3 of an
//! ordered batch of 5, a failing statement of an unordered one): as MongoDB
//! does (the retryable-writes spec; each statement has a `stmtId`), the
//! statements that were applied are answered from what was recorded and
//! the others run again, so the retry returns the first attempt's
//! `writeErrors` (the duplicate key again, unless the conflict is gone) and
//! applies nothing twice.
//!
//! What was applied comes from one of two places:
//! - the session's remembered reply ([`from_reply`], the member or
//!   standalone server that ran the write): the statements not in its
//!   `writeErrors` (for an ordered batch, also none after the first error);
//! - the replicated table of outcomes ([`from_outcomes`], another member
//!   after a failover, or this one after a restart): every outcome carries
//!   the statement ids it applied (`duetdb::WriteOutcome::statements`).
//!
//! The statements left run as a batch of their own (the same options,
//! ordered or not) whose writes carry their original statement ids
//! ([`super::Ctx::stmts`], recorded with their outcomes), and its reply's
//! indexes (`writeErrors[].index`, `upserted[].index`) are mapped back to
//! the original positions before it is merged with the recorded part.

use std::collections::BTreeSet;
use std::sync::Arc;

use bson::{doc, Bson, Document};

use super::Ctx;
use crate::error::{CmdResult, CommandError};

/// The array of statements of a batch write command.
fn items_field(name: &str) -> Option<&'static str> {
    match name {
        "insert" => Some("documents"),
        "update" => Some("updates"),
        "delete" => Some("deletes"),
        _ => None,
    }
}

/// What the first execution(s) of a batch applied, and the part of the
/// reply they make.
#[derive(Debug, Default, PartialEq)]
pub struct Recorded {
    /// The statement ids applied.
    done: BTreeSet<u32>,
    n: i64,
    modified: i64,
    /// `(statement id, _id)` of each upsert.
    upserted: Vec<(u32, Bson)>,
}

fn int(d: &Document, field: &str) -> i64 {
    match d.get(field) {
        Some(Bson::Int32(n)) => i64::from(*n),
        Some(Bson::Int64(n)) => *n,
        _ => 0,
    }
}

fn ordered(cmd: &Document) -> bool {
    match cmd.get("ordered") {
        None => true,
        Some(_) => crate::args::flag(cmd, "ordered").unwrap_or(true),
    }
}

/// The upserts of a reply: `(index, _id)`.
fn upserts(reply: &Document) -> Vec<(u32, Bson)> {
    let Ok(list) = reply.get_array("upserted") else {
        return Vec::new();
    };
    list.iter()
        .filter_map(|u| match u {
            Bson::Document(d) => {
                let i = u32::try_from(int(d, "index")).ok()?;
                Some((i, d.get("_id")?.clone()))
            }
            _ => None,
        })
        .collect()
}

/// What a batch whose remembered `reply` has `writeErrors` applied: every
/// statement but the failed ones and, ordered, those after the first
/// failure. `None` for a reply without `writeErrors` (it is the answer) or
/// a command that is not a batch write.
pub fn from_reply(name: &str, cmd: &Document, reply: &Document) -> Option<Recorded> {
    let field = items_field(name)?;
    let errors = reply
        .get_array("writeErrors")
        .ok()
        .filter(|e| !e.is_empty())?;
    let total = cmd.get_array(field).ok()?.len();
    let failed: BTreeSet<i64> = errors
        .iter()
        .filter_map(|e| match e {
            Bson::Document(d) => Some(int(d, "index")),
            _ => None,
        })
        .collect();
    let stop = if ordered(cmd) {
        failed.first().copied()
    } else {
        None
    };
    let done = (0..total as u32)
        .filter(|&i| !failed.contains(&i64::from(i)) && stop.is_none_or(|s| i64::from(i) < s))
        .collect();
    Some(Recorded {
        done,
        n: int(reply, "n"),
        modified: int(reply, "nModified"),
        upserted: upserts(reply),
    })
}

/// What the replicated outcomes of a batch's tag say it applied. `None`
/// when the command is not a batch write or an outcome has no statement
/// ids (recorded by an older build): the caller answers as before, every
/// statement taken as applied.
pub fn from_outcomes(name: &str, outcomes: &[Vec<u8>]) -> Option<Recorded> {
    use duetdb::WriteOutcome as W;
    items_field(name)?;
    let mut rec = Recorded::default();
    let count = |n: u64| i64::try_from(n).unwrap_or(i64::MAX);
    for o in outcomes {
        let stmts = W::statements(o)?;
        match W::decode(o)? {
            W::Inserted { n } => rec.n += count(n),
            W::Deleted(n) => rec.n += count(n),
            W::Updated(u) => {
                rec.n += count(u.matched);
                rec.modified += count(u.modified);
                if let Some(id) = u.upserted_id {
                    rec.n += 1;
                    rec.upserted.push((*stmts.first()?, id));
                }
            }
            _ => return None,
        }
        rec.done.extend(stmts);
    }
    Some(rec)
}

/// The reply to retried batch `name` (`cmd`) that applied `rec`: the
/// statements not applied run again through `run` (given the batch of
/// those statements, with their statement ids in `ctx`), and the two parts
/// are merged, indexes as in `cmd`.
pub fn answer(
    ctx: &Ctx<'_>,
    name: &str,
    cmd: &Document,
    rec: Recorded,
    run: impl FnOnce(&Document) -> CmdResult,
) -> CmdResult {
    let field = items_field(name)
        .ok_or_else(|| CommandError::bad_value(format!("'{name}' is not a batch write")))?;
    let items = cmd.get_array(field).map_err(|_| {
        CommandError::type_mismatch(format!("'{field}' of '{name}' must be an array"))
    })?;
    let todo: Vec<u32> = (0..items.len() as u32)
        .filter(|i| !rec.done.contains(i))
        .collect();
    let (mut n, mut modified, mut upserted) = (rec.n, rec.modified, rec.upserted);
    let mut errors = Vec::new();
    if !todo.is_empty() {
        tracing::debug!(
            conn = ctx.conn.id,
            command = name,
            applied = rec.done.len(),
            again = todo.len(),
            "retried batch: statements not applied run again"
        );
        let mut sub = cmd.clone();
        sub.insert(
            field,
            todo.iter()
                .filter_map(|&i| items.get(i as usize).cloned())
                .collect::<Vec<Bson>>(),
        );
        let ids: Arc<[u32]> = todo.clone().into();
        let previous = ctx.stmts.replace(Some(ids));
        let result = run(&sub);
        ctx.stmts.replace(previous);
        let r = result?;
        let original = |k: i64| {
            usize::try_from(k)
                .ok()
                .and_then(|k| todo.get(k))
                .copied()
                .unwrap_or(u32::MAX)
        };
        n += int(&r, "n");
        modified += int(&r, "nModified");
        upserted.extend(
            upserts(&r)
                .into_iter()
                .map(|(k, id)| (original(i64::from(k)), id)),
        );
        if let Ok(list) = r.get_array("writeErrors") {
            for e in list {
                if let Bson::Document(e) = e {
                    let mut e = e.clone();
                    let at = original(int(&e, "index"));
                    e.insert("index", i32::try_from(at).unwrap_or(i32::MAX));
                    errors.push(Bson::Document(e));
                }
            }
        }
    }
    upserted.sort_by_key(|(i, _)| *i);
    let as_i32 = |n: i64| i32::try_from(n).unwrap_or(i32::MAX);
    let mut d = doc! {"n": as_i32(n)};
    if name == "update" {
        d.insert("nModified", as_i32(modified));
        if !upserted.is_empty() {
            let list: Vec<Bson> = upserted
                .into_iter()
                .map(|(i, id)| Bson::Document(doc! {"index": as_i32(i64::from(i)), "_id": id}))
                .collect();
            d.insert("upserted", list);
        }
    }
    if !errors.is_empty() {
        d.insert("writeErrors", errors);
    }
    d.insert("ok", 1.0);
    Ok(d)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dup(index: i32) -> Bson {
        Bson::Document(doc! {"index": index, "code": 11000, "errmsg": "E11000"})
    }

    #[test]
    fn an_ordered_batch_applied_the_statements_before_its_first_error() {
        let cmd = doc! {"insert": "c", "documents": [{"_id": 1}, {"_id": 2}, {"_id": 2}, {"_id": 4}, {"_id": 5}]};
        let reply = doc! {"n": 2, "writeErrors": [dup(2)], "ok": 1.0};
        let rec = from_reply("insert", &cmd, &reply).expect("recorded");
        assert_eq!(rec.done, BTreeSet::from([0, 1]));
        assert_eq!(rec.n, 2);
        // An unordered one: every statement but the failed ones.
        let mut cmd = cmd;
        cmd.insert("ordered", false);
        let reply = doc! {"n": 4, "writeErrors": [dup(2)], "ok": 1.0};
        let rec = from_reply("insert", &cmd, &reply).expect("recorded");
        assert_eq!(rec.done, BTreeSet::from([0, 1, 3, 4]));
        // A reply without errors is the answer itself.
        assert_eq!(from_reply("insert", &cmd, &doc! {"n": 5, "ok": 1.0}), None);
    }

    #[test]
    fn outcomes_say_which_statements_applied() {
        use duetdb::{UpdateResult, WriteOutcome as W};
        let ins = W::Inserted { n: 2 }.encode_at(&[0, 3]);
        let upd = W::Updated(UpdateResult {
            matched: 0,
            modified: 0,
            upserted_id: Some(Bson::Int32(9)),
        })
        .encode_at(&[4]);
        let rec = from_outcomes("update", &[upd]).expect("ids");
        assert_eq!(rec.upserted, vec![(4, Bson::Int32(9))]);
        assert_eq!(rec.n, 1);
        let rec = from_outcomes("insert", &[ins]).expect("ids");
        assert_eq!(rec.done, BTreeSet::from([0, 3]));
        assert_eq!(rec.n, 2);
        // An older build's outcome has no ids.
        assert_eq!(
            from_outcomes("insert", &[W::Inserted { n: 2 }.encode()]),
            None
        );
    }
}
