//! `hello` / `isMaster` / `ismaster`: the server description drivers read on
//! connect and when monitoring.
//!
//! Field types are exactly what drivers require (int32 sizes and wire
//! versions, booleans, a datetime `localTime`). By default we describe the
//! writable primary of a one-member replica set (`setName`, `hosts` = `me` =
//! `primary`, `setVersion`, `electionId`): drivers only start transactions
//! and send retryable writes to a replica-set member (the Rust driver refuses
//! transactions on a standalone; pymongo sends `txnNumber` for retryable
//! writes only to a primary). `--standalone` describes a standalone server
//! instead. The member address is `--advertise` or the local address the
//! connection arrived on, so the host a client reached us by is one it can
//! reach again when it follows `hosts`.
//!
//! A member of a multi-member replica set (`--members`) describes the set
//! as it knows it instead: `commands/repl.rs`.
//!
//! `compression` answers the client's list with the compressors of it this
//! server offers (`--network-message-compressors`), in the client's order,
//! and is left out when there are none in common (`compression.rs`).
//!
//! Left out on purpose: `topologyVersion` (so drivers poll instead of using
//! the streaming protocol). Every reply (this one included) carries `operationTime` and
//! `$clusterTime` from the engine's cluster clock (`commands::cluster_time`):
//! drivers need them for `startAtOperationTime`; the `afterClusterTime` they
//! then send with causally consistent reads is accepted and needs no wait,
//! since one node's reads always see its own writes.

use bson::{doc, oid::ObjectId, DateTime, Document};

use super::Ctx;
use crate::error::CmdResult;

pub const MAX_BSON_OBJECT_SIZE: i32 = 16 * 1024 * 1024;
pub const MAX_MESSAGE_SIZE_BYTES: i32 = crate::wire::MAX_MESSAGE_BYTES as i32;
pub const MAX_WRITE_BATCH_SIZE: i32 = 100_000;
pub const MIN_WIRE_VERSION: i32 = 0;
/// MongoDB 7.0's wire version.
pub const MAX_WIRE_VERSION: i32 = 21;
pub const LOGICAL_SESSION_TIMEOUT_MINUTES: i32 = 30;
/// The replica-set configuration version we report (there is one member, and
/// its configuration never changes).
pub const SET_VERSION: i32 = 1;
/// The election id we report: constant, as there is never another election.
const ELECTION_ID: [u8; 12] = [0x7f, 0xff, 0xff, 0xff, 0, 0, 0, 0, 0, 0, 0, 1];

/// `host:port` of this member as `hello` reports it.
pub fn member_address(ctx: &Ctx<'_>) -> String {
    match &ctx.state.config.advertise {
        Some(a) => a.clone(),
        None => ctx.conn.local.to_string(),
    }
}

pub fn hello(ctx: &Ctx<'_>, name: &str, cmd: &Document) -> CmdResult<Document> {
    let compression = crate::compression::negotiate(&ctx.state.config.compressors, cmd)?;
    let mut d = Document::new();
    if let Some(m) = super::repl::member(ctx) {
        super::repl::hello(m, name == "hello", &mut d);
    } else if name == "hello" {
        d.insert("isWritablePrimary", true);
    } else {
        d.insert("ismaster", true);
    }
    if let (Some(set), None) = (&ctx.state.config.replica_set, super::repl::member(ctx)) {
        let me = member_address(ctx);
        d.extend(doc! {
            "secondary": false,
            "setName": set.clone(),
            "setVersion": SET_VERSION,
            "hosts": [me.clone()],
            "primary": me.clone(),
            "me": me,
            "electionId": ObjectId::from_bytes(ELECTION_ID),
        });
    }
    d.extend(doc! {
        "helloOk": true,
        "maxBsonObjectSize": MAX_BSON_OBJECT_SIZE,
        "maxMessageSizeBytes": MAX_MESSAGE_SIZE_BYTES,
        "maxWriteBatchSize": MAX_WRITE_BATCH_SIZE,
        "localTime": DateTime::now(),
        "logicalSessionTimeoutMinutes": LOGICAL_SESSION_TIMEOUT_MINUTES,
        "connectionId": ctx.conn.id.min(i32::MAX as u64) as i32,
        "minWireVersion": MIN_WIRE_VERSION,
        "maxWireVersion": MAX_WIRE_VERSION,
        "readOnly": false,
    });
    if let Some(list) = compression {
        d.insert("compression", list);
    }
    crate::auth::hello_fields(ctx, cmd, &mut d);
    d.insert("ok", 1.0);
    Ok(d)
}
