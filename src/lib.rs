//! shardcron: a distributed cron. Every node of a fleet runs the same `jobs.toml`; each job fires
//! exactly once per scheduled tick somewhere in the fleet, with a fencing token in `CRON_FENCE`.
//!
//! # Layout
//! The folders are the layers; each may import the ones listed before it, never one after.
//! `../shared/tools/rs_cycles.py src` finds no import circle between the files.
//! - [`rules`]: the pure rules: config, schedules and plans, shards, pools and their assignment,
//!   catch-up, bounds, and each feature's pure part (blackouts, backfill progress, groups,
//!   notifiers). No I/O and no clock.
//! - [`coord`]: coordination through etcd: connection, session, elections and the fleet view,
//!   the claim protocol and its records, starts owed, results and history, and each feature's
//!   records: pauses, run requests (`triggers`), backfills, concurrency groups, notifications
//!   told; a JSON record at a key changed by guarded read-modify-write (`record_at_key`); etcd's
//!   space.
//! - [`running`]: running commands: this node's runs (the per-job table, overlap, late permits,
//!   shutdown grace, a `run` span per tick), one tick's command with retries (an `attempt` span
//!   each), the kind of a run and its policy (`runner::arrival`), the one path of a finished run
//!   to its sinks (`report`), notifications, backfill settles, the child's own lease gate, a
//!   job's `env_file`, the descriptor limit.
//! - [`serving`]: the HTTP listener (probes, metrics, JSON API, dashboard), `status`, systemd's
//!   notifications.
//!
//! Above the layers, what ties them together:
//! - [`node`]: a node's context built once, its sessions one at a time (`node::sessions`), and
//!   every long-lived task of a node and of a session started in one place (`node::tasks`).
//! - `leader`: one shard: campaign → terms → resign (a `term` span per leadership);
//!   `leader::term` a term's claims and requests, `leader::fire` its firing loop over named
//!   events, `leader::wake` the loop's wake-time decision (pure), `leader::takeover` what a new
//!   leader does first (redelivery, lost records, catch-up), `leader::backfill` its backfill claims.
//! - `context`: what every task of a node shares.
//! - [`cli`]: the command line, one module per topic; `main.rs` parses, dispatches and prints
//!   the error chain once.
//!
//! Adding a kind of run, a sink for finished runs, a record in etcd, a node task or a fault
//! scenario: the seams are listed in docs/how-it-works.md, "Adding a feature or a kind of run".
//!
//! Shared leaves every layer may use; each imports no layer but `rules`:
//! - [`backoff`]: the one retry backoff and sleep-or-cancel. `clock`: the wall clock, read in
//!   one place. `repeats`: warnings every shard can raise at once, folded per cause.
//! - [`metrics`]: Prometheus metrics, which the parts that own a value register into.
//! - [`readiness`]: whether the node is ready (`/readyz`). `text_table`: the terminal tables.
//! - [`secrets`]: the node's secrets from a variable, a file or a systemd credential; the
//!   environment its children start from, without them; the node made not dumpable.
//! - [`log_format`]: `--log-format json`, with the fields of a line's spans among its own.
//! - [`memory`]: keeping the resident size near the live heap (malloc arenas, periodic trim).
//! - [`etcd_server`]: a throwaway local etcd for `dev` (and, with `test-support`, for tests).
pub mod backoff;
pub mod cli;
mod clock;
mod context;
pub mod coord;
pub mod etcd_server;
mod leader;
pub mod log_format;
pub mod memory;
pub mod metrics;
pub mod node;
pub mod readiness;
mod repeats;
pub mod rules;
pub mod running;
pub mod secrets;
pub mod serving;
mod text_table;
