//! Running commands: this node's runs (`runs`: the per-job table of what goes and waits, the
//! late-run room, the overlap rules, runs listed on other nodes, the shutdown grace), one tick's
//! command in its own process group with its retries, timeout and output (`runner`, with
//! `runner::arrival`, the kind of a run and every answer that differs by it), where every
//! finished run goes (`report`: its list of sinks), a backfill tick counted done or given back
//! (`backfill_settles`), the jobs' notifications and pings (`notifications`), the child's own
//! lease check before its command (`gate`), a job's `env_file`, and the descriptor limit
//! ([`descriptors`]).
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
