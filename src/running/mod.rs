//! Running commands: this node's runs with their overlap rules and shutdown grace (`runs`), one
//! tick's command in its own process group with its retries, timeout and output (`runner`), the
//! child's own lease check before its command (`gate`), a job's `env_file`, and the descriptor
//! limit ([`descriptors`]), and telling people about runs: webhooks and success pings
//! (`notifications`).
//!
//! May import: `rules`, `coord` (what a run reads and reports: starts, pauses, results,
//! records), and the shared leaves at the top. Never `serving`, the leader or the node.

pub(crate) mod backfill_settles;
pub mod descriptors;
pub(crate) mod env_file;
pub(crate) mod gate;
pub(crate) mod notifications;
pub(crate) mod report;
pub(crate) mod runner;
pub(crate) mod runs;
