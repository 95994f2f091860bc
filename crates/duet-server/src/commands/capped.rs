//! `convertToCapped` and `cloneCollectionAsCapped`: a capped copy of a
//! collection, made by the engine in ONE writer step
//! (`Collection::convert_to_capped`, `Collection::clone_as_capped`), so
//! readers see the old collection or the new one, never a part.
//!
//! As MongoDB: the documents are copied in `$natural` order into a capped
//! collection of `size` bytes (rounded as `create` rounds it) that trims as
//! inserts do, so the newest ones that fit remain; the source's other
//! options stay, its indexes other than `_id` are not copied. A missing
//! `size` (or `toCollection`) is 40414, a missing source 26, an existing
//! target of `cloneCollectionAsCapped` 48. `max` is not an argument of
//! these commands in MongoDB; a converted capped collection keeps the
//! source's `max` if it had one.
//!
//! What other readers see: a tailable cursor on the converted collection
//! ends (CursorNotFound, 43: the collection was replaced); change streams
//! see a `drop` of the collection (a collection stream then `invalidate`),
//! its `create`, and an `insert` per copied document — MongoDB logs the
//! copy into a temporary collection and a rename over the source instead.

use bson::{doc, Bson, Document};

use super::Ctx;
use crate::args;
use crate::error::{CmdResult, CommandError};

/// `size` of the command (required), parsed and rounded as `create`'s.
fn size_of(cmd: &Document, name: &str) -> CmdResult<u64> {
    let v = cmd.get("size").filter(|v| !matches!(v, Bson::Null));
    let Some(v) = v else {
        return Err(CommandError::new(
            40414,
            "Location40414",
            format!("BSON field '{name}.size' is missing but a required field"),
        ));
    };
    let mut options = duetdb::CollectionOptions::default();
    options
        .set("size", v)
        .map_err(|e| CommandError::new(e.code, e.code_name, e.message))?;
    options
        .capped_size
        .ok_or_else(|| CommandError::internal("size was not set"))
}

fn source_missing(ctx: &Ctx<'_>, coll: &str, e: duetdb::Error) -> CommandError {
    if e.code() == 26 {
        return CommandError::new(
            26,
            "NamespaceNotFound",
            format!("source collection {} does not exist", ctx.ns(coll)),
        );
    }
    e.into()
}

/// `{convertToCapped: <coll>, size: <bytes>}`.
pub fn convert_to_capped(ctx: &Ctx<'_>, cmd: &Document) -> CmdResult {
    let coll = args::collection_name(cmd, "convertToCapped")?;
    let size = size_of(cmd, "convertToCapped")?;
    ctx.database()?
        .collection(coll)
        .convert_to_capped(size)
        .map_err(|e| source_missing(ctx, coll, e))?;
    Ok(doc! {"ok": 1.0})
}

/// `{cloneCollectionAsCapped: <coll>, toCollection: <name>, size: <bytes>}`.
pub fn clone_collection_as_capped(ctx: &Ctx<'_>, cmd: &Document) -> CmdResult {
    let coll = args::collection_name(cmd, "cloneCollectionAsCapped")?;
    let to = args::req_str(cmd, "toCollection")?;
    let size = size_of(cmd, "cloneCollectionAsCapped")?;
    ctx.database()?
        .collection(coll)
        .clone_as_capped(to, size)
        .map_err(|e| match e.code() {
            48 => CommandError::new(
                48,
                "NamespaceExists",
                format!(
                    "cloneCollectionAsCapped failed - destination collection {} already exists",
                    ctx.ns(to)
                ),
            ),
            _ => source_missing(ctx, coll, e),
        })?;
    Ok(doc! {"ok": 1.0})
}
