//! Legacy OP_QUERY (opcode 2004) on `<db>.$cmd`, answered with OP_REPLY
//! (opcode 1): what older drivers use for their first handshake.
//!
//! Only command queries are served (collection name ending in `.$cmd`); a
//! legacy query on a real collection gets a `QueryFailure` reply. A command may
//! come wrapped as `{$query: {...}, $readPreference: ...}`; it is unwrapped.
//! Every document is validated before it is parsed, as in `opmsg`, with the
//! same depth limit ([`MAX_MESSAGE_DEPTH`]).

use bson::{Document, RawDocument};

use crate::opmsg::MsgError;
use crate::wire::{cstring, le_i32, MAX_MESSAGE_DEPTH};

/// OP_REPLY `responseFlags` bit: the query failed, the one document is `{$err, code}`.
pub const REPLY_QUERY_FAILURE: i32 = 1 << 1;
/// OP_REPLY `responseFlags` bit: the server can await data (always set by servers).
pub const REPLY_AWAIT_CAPABLE: i32 = 1 << 3;

/// A decoded command query.
#[derive(Debug)]
pub struct Query {
    /// The database (the part of `fullCollectionName` before `.$cmd`).
    pub db: String,
    pub command: Document,
}

/// Decode an OP_QUERY body (after the header).
pub fn decode(body: &[u8]) -> Result<Query, MsgError> {
    let _flags = le_i32(body, 0).ok_or_else(|| MsgError::protocol("OP_QUERY too short"))?;
    let (ns, at) = cstring(body, 4)
        .ok_or_else(|| MsgError::protocol("OP_QUERY collection name is not a valid cstring"))?;
    let at = at + 8; // numberToSkip, numberToReturn: irrelevant for commands
    let Some(db) = ns.strip_suffix(".$cmd") else {
        return Err(MsgError::protocol(format!(
            "legacy OP_QUERY is only supported for commands (<db>.$cmd), not '{ns}'"
        )));
    };
    let len = le_i32(body, at).ok_or_else(|| MsgError::invalid_bson("OP_QUERY has no query"))?;
    let end = at
        .checked_add(usize::try_from(len).unwrap_or(0))
        .filter(|&e| len >= 5 && e <= body.len())
        .ok_or_else(|| MsgError::invalid_bson("OP_QUERY query document length is invalid"))?;
    let raw = RawDocument::from_bytes(&body[at..end])
        .map_err(|e| MsgError::invalid_bson(e.to_string()))?;
    duetdb::raw::validate_raw_depth(raw, MAX_MESSAGE_DEPTH)?;
    let mut command = Document::try_from(raw).map_err(|e| MsgError::invalid_bson(e.to_string()))?;
    crate::opmsg::mark_duplicate_ids(raw, None, &mut command);
    let wrapped = command
        .get("$query")
        .or_else(|| command.get("query"))
        .and_then(|q| q.as_document())
        .cloned();
    let is_wrapper = command
        .keys()
        .next()
        .is_some_and(|k| k.starts_with('$') || k == "query");
    match wrapped.filter(|_| is_wrapper) {
        Some(mut inner) => {
            // The command as sent, for the repeated-name rules (as OP_MSG's
            // body): `$query` wins over `query`, as in the lookup above.
            let inner_raw = raw
                .get_document("$query")
                .or_else(|_| raw.get_document("query"))
                .map_err(|e| MsgError::invalid_bson(e.to_string()))?;
            crate::dupfields::keep_duplicates(inner_raw, None, &mut inner)?;
            let rp = command.get("$readPreference").cloned();
            command = inner;
            if let Some(rp) = rp {
                command.insert("$readPreference", rp);
            }
        }
        None => crate::dupfields::keep_duplicates(raw, None, &mut command)?,
    }
    Ok(Query {
        db: db.to_string(),
        command,
    })
}

/// Encode an OP_REPLY body holding one document.
pub fn encode_reply(flags: i32, doc: &[u8]) -> Vec<u8> {
    let mut out = reply_prefix(flags).to_vec();
    out.extend_from_slice(doc);
    out
}

/// What precedes an OP_REPLY's one document: its flags, cursor id 0,
/// starting position 0 and a count of 1.
pub fn reply_prefix(flags: i32) -> [u8; 20] {
    let mut out = [0u8; 20];
    out[..4].copy_from_slice(&(flags | REPLY_AWAIT_CAPABLE).to_le_bytes());
    // cursorID (8 bytes) and startingFrom (4) stay 0.
    out[16..].copy_from_slice(&1i32.to_le_bytes());
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use bson::doc;

    fn query(ns: &str, d: &Document) -> Vec<u8> {
        let mut b = 0i32.to_le_bytes().to_vec();
        b.extend(ns.as_bytes());
        b.push(0);
        b.extend(0i32.to_le_bytes());
        b.extend((-1i32).to_le_bytes());
        d.to_writer(&mut b).expect("serialize");
        b
    }

    #[test]
    fn decodes_commands_and_unwraps_query() {
        let q = decode(&query("admin.$cmd", &doc! {"isMaster": 1})).expect("decode");
        assert_eq!(q.db, "admin");
        assert!(q.command.contains_key("isMaster"));
        let q = decode(&query(
            "x.$cmd",
            &doc! {"$query": {"ping": 1}, "$readPreference": {"mode": "primary"}},
        ))
        .expect("decode");
        assert_eq!(q.command.keys().next().map(String::as_str), Some("ping"));
        assert!(decode(&query("x.coll", &doc! {})).is_err());
        assert!(decode(&[1, 2, 3]).is_err());
        let mut b = query("admin.$cmd", &doc! {"a": 1});
        b.truncate(b.len() - 2);
        assert!(decode(&b).is_err());
    }

    fn raw_query(ns: &str, d: &bson::RawDocumentBuf) -> Vec<u8> {
        let mut b = 0i32.to_le_bytes().to_vec();
        b.extend(ns.as_bytes());
        b.push(0);
        b.extend(0i32.to_le_bytes());
        b.extend((-1i32).to_le_bytes());
        b.extend(d.as_bytes());
        b
    }

    #[test]
    fn repeated_names_follow_the_op_msg_rules() {
        use bson::raw::cstr;
        use bson::{rawdoc, RawDocumentBuf};
        // A command field sent twice: 40413, bare or wrapped in `$query`.
        let mut twice = rawdoc! {"find": "c"};
        twice.append(cstr!("limit"), 1);
        twice.append(cstr!("limit"), 2);
        let e = decode(&raw_query("x.$cmd", &twice)).expect_err("repeat");
        assert_eq!(e.code, 40413);
        let mut wrapped = RawDocumentBuf::new();
        wrapped.append(cstr!("$query"), twice.clone());
        wrapped.append(cstr!("$readPreference"), rawdoc! {"mode": "primary"});
        let e = decode(&raw_query("x.$cmd", &wrapped)).expect_err("repeat");
        assert_eq!(e.code, 40413);
        // A filter repeating a name keeps both conditions, as `$and`.
        let mut filter = rawdoc! {"a": 1};
        filter.append(cstr!("a"), 2);
        let q = decode(&raw_query(
            "x.$cmd",
            &rawdoc! {"find": "c", "filter": filter},
        ))
        .expect("decode");
        let f = q.command.get_document("filter").expect("filter");
        assert_eq!(f, &doc! {"$and": [{"a": 1}, {"a": 2}]});
    }
}
