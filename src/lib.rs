//! shardcron: a distributed cron. Every node of a fleet runs the same `jobs.toml`; each job fires
//! exactly once per scheduled tick somewhere in the fleet, with a fencing token in `CRON_FENCE`.
//!
//! # Layout
//! - [`config`]: `jobs.toml` turned once into a validated [`config::Config`].
//! - [`schedule`]: crontab expressions in a time zone; pure next-fire math.
//! - [`shard`]: the job → shard mapping.
pub mod cli;
pub mod config;
pub mod schedule;
pub mod shard;
