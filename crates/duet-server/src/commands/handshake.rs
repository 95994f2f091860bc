//! `hello` / `isMaster` / `ismaster`: the server description drivers read on
//! connect and when monitoring.
//!
//! Field types are exactly what drivers require (int32 sizes and wire
//! versions, booleans, a datetime `localTime`). We describe a standalone,
//! writable server; no `topologyVersion` (so drivers poll instead of using the
//! streaming protocol), no `compression` (OP_COMPRESSED is declined by not
//! offering it), no `saslSupportedMechs` (no authentication yet).

use bson::{doc, DateTime, Document};

use super::Ctx;

pub const MAX_BSON_OBJECT_SIZE: i32 = 16 * 1024 * 1024;
pub const MAX_MESSAGE_SIZE_BYTES: i32 = crate::wire::MAX_MESSAGE_BYTES as i32;
pub const MAX_WRITE_BATCH_SIZE: i32 = 100_000;
pub const MIN_WIRE_VERSION: i32 = 0;
/// MongoDB 7.0's wire version.
pub const MAX_WIRE_VERSION: i32 = 21;
pub const LOGICAL_SESSION_TIMEOUT_MINUTES: i32 = 30;

pub fn hello(ctx: &Ctx<'_>, name: &str, _cmd: &Document) -> Document {
    let mut d = Document::new();
    if name == "hello" {
        d.insert("isWritablePrimary", true);
    } else {
        d.insert("ismaster", true);
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
        "ok": 1.0,
    });
    d
}
