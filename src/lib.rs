//! shardcron: a distributed cron. Every node of a fleet runs the same `jobs.toml`; each job fires
//! exactly once per scheduled tick somewhere in the fleet, with a fencing token in `CRON_FENCE`.
//!
//! # Layout
//! Pure leaves, no I/O:
//! - [`config`]: `jobs.toml` turned once into a validated [`config::Config`].
//! - [`schedule`]: crontab expressions in a time zone; pure next-fire math.
//! - [`shard`]: the job → shard mapping.
//! - [`assignment`]: which node should lead each shard (bounded-load rendezvous hashing).
//! - `catch_up`: which missed ticks a new leader runs.
//! - [`keys`]: every etcd key path, built and parsed.
//! - [`record`]: the values etcd holds: claims, run records (with their [`record::Outcome`]),
//!   members.
//! - [`backoff`]: the one retry backoff and sleep-or-cancel.
//! - [`bounds`]: the longest durations taken from config, command line and API.
//! - `repeats`: warnings every shard can raise at once, folded into one line per cause.
//! - `clock`: the wall clock, read in one place.
//!
//! etcd plumbing:
//! - [`etcd`]: connecting, call timeouts, coordination errors.
//! - `etcd_space`: etcd's history compacted by the leader of shard 0; its size, quota and
//!   NOSPACE alarm followed by every node.
//! - `session`: the node's lease and its keep-alive; the session's cancellation token.
//! - `election`: one leader election per shard, entered in batches and decided on the fleet
//!   view; its term, and who leads each shard.
//! - `ledger`: the raw transactions on job records.
//! - `starts`: the claimed ticks a leadership still owes, its starts not yet written, and the
//!   ticks the node started that no record holds yet.
//! - `claims`: the claim protocol: batching, riding results and starts, re-read and resolution,
//!   the confirming read before an instant claimed ahead; `claims::book` holds what a leader
//!   knows of its jobs and the pure rules for the record it writes; `claims::lead` how far ahead
//!   of a tick it claims.
//! - `fleet`: members, the fleet view, handoff decisions and their background tasks.
//! - `joining`: the order a node enters the elections in: its target shards first.
//!
//! Secrets:
//! - [`secrets`]: the node's secrets from a variable, a file or a systemd credential; the
//!   environment its children start from, without them; the node made not dumpable.
//! - `env_file`: a job's own secrets, read from its `env_file` at each run.
//!
//! Running jobs:
//! - `runs`: this node's runs: overlap policies, late-run permits, shutdown grace; each tick's
//!   log lines in a `run` span (job, tick, fence).
//! - `runner`: one tick's command in its own process group, with retries, each attempt in an
//!   `attempt` span.
//! - `gate`: the child's own lease check right before its command, which keeps the spawn a
//!   `posix_spawn`.
//! - `results`: run results riding on claims, the rest written after a short window.
//!
//! The node:
//! - `context`: what every task of a node shares.
//! - `leader`: one shard: campaign → terms → resign, and a term's firing loop; `leader::takeover`
//!   what a new leader does first (redelivery, lost records, catch-up).
//! - [`node`]: the session loop, reloads and drain.
//! - [`status`]: what `shardcron status` reads and prints.
//! - [`metrics`]: Prometheus metrics; `job_gauges`: the per-job gauges a shard's leader exports.
//! - [`readiness`]: whether the node is ready (`/readyz`); [`notify`]: telling systemd.
//! - [`http`]: the HTTP listener: probes, metrics, the JSON API and the dashboard.
//! - [`etcd_server`]: a throwaway local etcd for `dev` (and, with `test-support`, for tests).
//! - [`cli`]: the command line.
//! - [`descriptors`]: the descriptor limit, raised at start, and spawns that hit it.
//! - [`log_format`]: `--log-format json`, with the fields of a line's spans (a run's job, tick
//!   and fence) among its own.
//! - [`memory`]: keeping the resident size near the live heap (malloc arenas, periodic trim).
pub mod assignment;
pub mod backoff;
pub mod bounds;
mod catch_up;
mod claims;
pub mod cli;
mod clock;
pub mod config;
mod context;
pub mod descriptors;
mod election;
mod env_file;
pub mod etcd;
pub mod etcd_server;
mod etcd_space;
mod fleet;
mod gate;
pub mod history;
pub mod http;
mod job_gauges;
mod joining;
pub mod keys;
mod leader;
mod ledger;
pub mod log_format;
pub mod memory;
pub mod metrics;
mod mirror;
pub mod node;
pub mod notify;
pub mod pauses;
pub mod plan;
pub mod readiness;
pub mod record;
mod repeats;
mod results;
mod runner;
mod runs;
pub mod schedule;
pub mod secrets;
mod session;
pub mod shard;
mod spread;
mod starts;
pub mod status;
mod text_table;
pub mod triggers;
mod view;
