//! The OLCP query API of [`Database`] (KVell+'s `olcp_query`); the protocol
//! is in `snapshot::olcp`.

use bson::Document;

use crate::api::Database;
use crate::doc::DocRef;
use crate::error::{CancelToken, Result};
use crate::snapshot::olcp::{self, OlcpOptions, OlcpReport, PointRange, PointReader};
use crate::snapshot::Strategy;

impl Database {
    /// Run `map` exactly once over every document of the start snapshot of
    /// `coll` that matches one of `scan_ranges` (an empty list means the whole
    /// collection; a range is a filter, typically a range on `_id` or an indexed
    /// field), with `point_ranges` readable as of the start, then `reduce` the
    /// per-thread states. Versions superseded during the query are handed to
    /// it (propagated), not kept.
    #[allow(clippy::too_many_arguments)]
    pub fn olcp_query<S, I, M, R>(
        &self,
        coll: &str,
        scan_ranges: &[Document],
        point_ranges: &[PointRange],
        init: I,
        map: M,
        reduce: R,
        options: OlcpOptions,
    ) -> Result<(S, OlcpReport)>
    where
        S: Send,
        I: Fn() -> S + Sync,
        M: Fn(&mut S, &DocRef, &PointReader) -> Result<()> + Sync,
        R: Fn(S, S) -> S,
    {
        self.olcp_query_with(
            coll,
            scan_ranges,
            point_ranges,
            init,
            map,
            reduce,
            options,
            &CancelToken::never(),
        )
    }

    /// [`Database::olcp_query`] that stops once `cancel` is cancelled: the
    /// map threads check it every page; the query then releases its slot
    /// (the status bits are reset in the background) and returns
    /// `Error::Interrupted` without reducing.
    #[allow(clippy::too_many_arguments)]
    pub fn olcp_query_with<S, I, M, R>(
        &self,
        coll: &str,
        scan_ranges: &[Document],
        point_ranges: &[PointRange],
        init: I,
        map: M,
        reduce: R,
        options: OlcpOptions,
        cancel: &CancelToken,
    ) -> Result<(S, OlcpReport)>
    where
        S: Send,
        I: Fn() -> S + Sync,
        M: Fn(&mut S, &DocRef, &PointReader) -> Result<()> + Sync,
        R: Fn(S, S) -> S,
    {
        self.note_read(Strategy::Olcp);
        olcp::olcp_query_with(
            self.writer(),
            coll,
            scan_ranges,
            point_ranges,
            init,
            map,
            reduce,
            options,
            cancel,
            None,
        )
    }
}
