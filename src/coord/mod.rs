//! Coordination through etcd: the connection and its limits ([`etcd`]); which member each
//! call goes to (`routing`, over the members and their health in `members` and `health`,
//! probed by `endpoints`); the format of the cluster's records (`record_format`), and a JSON
//! record at one key changed by guarded read-modify-write (`record_at_key`); the session and its
//! lease, elections and the fleet as a pure view (`view`) kept current by `fleet` and entered
//! in order by `joining`; the claim protocol (`claims`, on the raw transactions of `ledger`),
//! what a leadership owes (`starts`), results and history on their way to etcd (`results`,
//! [`history`]); pauses, run requests and the watched prefixes mirroring them ([`pauses`],
//! [`triggers`], `mirror`); the slots and lines of concurrency groups (`groups`, with the sweep of what a node's gone attempts left) and their gauges (`group_gauges`); runs of a job going on other nodes (`going`); etcd's space; config drift between members (`drift`); the records of nodes gone longer
//! than a retention, removed (`gone_nodes`); every key ([`keys`]);
//! the per-job gauges a leader exports (`job_gauges`); the `run_on` sets no live node has, and
//! since when (`unserved`); each node's runs per minute for the dashboard (`activity`).
//!
//! May import: `rules`, and the shared leaves at the top (`backoff`, `clock`, `repeats`,
//! `metrics`, `readiness`, `secrets`, `text_table`). Never `running`, `serving`, the leader or
//! the node.

pub(crate) mod activity;
pub(crate) mod backfills;
pub(crate) mod claims;
pub(crate) mod drift;
pub(crate) mod election;
pub(crate) mod endpoints;
pub mod etcd;
pub(crate) mod etcd_space;
pub(crate) mod fleet;
pub(crate) mod going;
pub(crate) mod gone_nodes;
pub(crate) mod group_gauges;
pub(crate) mod groups;
pub(crate) mod health;
pub mod history;
pub(crate) mod job_gauges;
pub(crate) mod joining;
pub mod keys;
pub(crate) mod ledger;
pub(crate) mod members;
pub(crate) mod mirror;
pub(crate) mod notifications;
pub mod pauses;
pub(crate) mod record_at_key;
pub(crate) mod record_format;
pub(crate) mod results;
pub(crate) mod routing;
pub(crate) mod session;
pub(crate) mod starts;
pub mod triggers;
pub(crate) mod unserved;
pub(crate) mod view;
