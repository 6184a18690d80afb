//! shardcron: a distributed cron. Every node of a fleet runs the same `jobs.toml`; each job fires
//! exactly once per scheduled tick somewhere in the fleet, with a fencing token in `CRON_FENCE`.
//!
//! # Layout
//! - [`config`]: `jobs.toml` turned once into a validated [`config::Config`].
//! - [`schedule`]: crontab expressions in a time zone; pure next-fire math.
//! - [`shard`]: the job → shard mapping.
//! - [`keys`]: every etcd key path.
//! - [`etcd`]: connecting, call timeouts, coordination errors.
//! - [`session`]: the node's lease and its keep-alive.
//! - [`election`]: one leader election per shard; the fence.
//! - [`ledger`]: per-job claim and result records; the guarded claim transaction.
//! - [`catch_up`]: which missed ticks a new leader runs.
//! - [`leader`]: one term of one shard: the firing loop.
//! - [`runner`]: running one tick's command in its own process group.
//! - [`results`]: run results riding on claims, the rest written after a short window.
//! - [`runs`]: this node's runs: overlap policies, shutdown grace.
//! - [`node`]: session, campaigns and terms of one node process.
//! - [`metrics`]: Prometheus metrics and their `/metrics` endpoint.
//! - [`status`]: what `shardcron status` reads and prints.
//! - [`etcd_server`]: a throwaway local etcd for `dev` and tests.
//! - [`clock`]: the wall clock, read in one place.
//! - [`cli`]: the command line.
pub mod assignment;
pub mod catch_up;
pub mod cli;
pub mod clock;
pub mod config;
pub mod election;
pub mod etcd;
pub mod etcd_server;
pub mod fleet;
pub mod keys;
pub mod leader;
pub mod ledger;
pub mod metrics;
pub mod node;
pub mod record;
pub mod results;
pub mod runner;
pub mod runs;
pub mod schedule;
pub mod session;
pub mod shard;
pub mod status;
