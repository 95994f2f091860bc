//! What one read may use and when it must stop: [`ReadLimits`], passed from
//! the API (and the server) down to the scans, sorts and pipeline stages.
//!
//! Defaults are MongoDB's: a blocking stage holds at most 100 MiB
//! (`internalQueryMaxBlockingSortMemoryUsageBytes`), and a sort over that
//! spills to disk unless the read says `allowDiskUse: false` (MongoDB 6.0+'s
//! `allowDiskUseByDefault: true`); so does a `$group`'s table (see
//! `query::aggregate::group_spill`).

use std::path::PathBuf;
use std::sync::Arc;

use crate::error::CancelToken;
use crate::query::filter::Examined;

/// Documents (or index entries) examined between two cancellation checks:
/// small enough that a cancelled read stops within milliseconds, large enough
/// that the check costs nothing per document.
pub const PAGE_DOCS: usize = 256;

/// Bytes one blocking stage (an in-memory sort, a `$group`) may hold:
/// MongoDB's 100 MB.
pub const DEFAULT_MEMORY_LIMIT: usize = 100 * 1024 * 1024;

/// The resource limits and the cancellation token of one read.
#[derive(Debug, Clone)]
pub struct ReadLimits {
    /// Checked every page of work; see [`CancelToken`].
    pub cancel: CancelToken,
    /// Bytes one blocking stage may hold ([`DEFAULT_MEMORY_LIMIT`]); over it a
    /// sort or a `$group` spills (when allowed) or fails with 292.
    pub memory_limit_bytes: usize,
    /// May a sort or `$group` over the memory limit spill runs to disk? Default
    /// true (MongoDB 6.0+'s `allowDiskUseByDefault`).
    pub allow_disk_use: bool,
    /// Where spilled runs go. `None`: the database's spill directory (under
    /// its data directory), or the OS temporary directory for an in-memory
    /// database or a snapshot that does not know its database.
    pub spill_dir: Option<PathBuf>,
    /// When set, the read counts the index keys and documents it examines
    /// here as it runs (explain's `executionStats`; see
    /// [`crate::query::Filter::count_into`]). Counted on every path that
    /// tests documents with the read's filter: finds, counts, distincts and
    /// pipeline scans under `cow`, `vls` and `none` (an OLCP pipeline
    /// reports its own pass counters instead).
    pub examined: Option<Arc<Examined>>,
}

impl Default for ReadLimits {
    fn default() -> ReadLimits {
        ReadLimits {
            cancel: CancelToken::never(),
            memory_limit_bytes: DEFAULT_MEMORY_LIMIT,
            allow_disk_use: true,
            spill_dir: None,
            examined: None,
        }
    }
}

impl ReadLimits {
    /// Default limits with this cancellation token.
    pub fn with_cancel(cancel: CancelToken) -> ReadLimits {
        ReadLimits {
            cancel,
            ..ReadLimits::default()
        }
    }

    /// `filter` counting into this read's counters, if it has any.
    pub(crate) fn counting(&self, filter: &mut crate::query::Filter) {
        if let Some(c) = &self.examined {
            filter.count_into(c.clone());
        }
    }

    /// The spill directory to use: the configured one, else `fallback`, else
    /// a per-process directory under the OS temporary directory.
    pub(crate) fn spill_dir_or(&self, fallback: Option<PathBuf>) -> PathBuf {
        self.spill_dir
            .clone()
            .or(fallback)
            .unwrap_or_else(default_temp_spill_dir)
    }
}

/// Where in-memory databases spill: `<OS temp dir>/duetdb-spill-<pid>` (a
/// crash leaves nothing there on unix: run files are unlinked at creation,
/// and the directory is removed after each, `spill::create_file`).
pub fn default_temp_spill_dir() -> PathBuf {
    std::env::temp_dir().join(format!("duetdb-spill-{}", std::process::id()))
}
