//! `shardcron status`: who leads each shard, which nodes are live, and each job's last and next
//! run, read straight from etcd. This module holds the JSON document's shape.
//!
//! - `document`: the whole document, read for every job at once and written as it goes.
//! - `jobs`: each job's entry, and the reads of just some jobs' records.
//! - `fleet`: the nodes, every election's leader, the `run_on` sets no node has.
//! - `render`: the text tables.

mod document;
mod fleet;
mod jobs;
mod render;

pub use document::{read_document, Document};
pub(crate) use jobs::read_jobs;
pub use render::render;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use crate::coord::pauses::Pause;
use crate::rules::backfill::Backfill;
use crate::rules::pools::FanOut;
use crate::rules::record::{Claim, RunRecord};

/// The JSON document of `status --json`; its keys are documented in docs/http-api.md.
#[derive(Debug, Serialize, Deserialize)]
pub struct Status {
    pub cluster: String,
    pub shard_count: u32,
    /// This config's digest; members with another one run a different jobs.toml.
    pub digest: String,
    pub nodes: Vec<NodeStatus>,
    pub shards: Vec<ShardStatus>,
    /// The config's concurrency groups, by name; absent when it has none.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub groups: Vec<GroupStatus>,
    /// Each job's backfill, going or the last one, by job name.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub backfills: Vec<BackfillStatus>,
    pub jobs: Vec<JobStatus>,
}

/// A job's backfill as `status` shows it: its record, and whether it is over.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct BackfillStatus {
    pub job: String,
    /// Every tick counted, or cancelled with none running.
    pub over: bool,
    #[serde(flatten)]
    pub backfill: Backfill,
}

/// A concurrency group as etcd shows it: its limit, the attempts holding its slots and those
/// waiting in its line, fleet-wide.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct GroupStatus {
    pub name: String,
    pub limit: u32,
    /// How long a tick waits for a slot (humantime, e.g. `"1m 30s"`); `null`: until the job's
    /// next tick.
    pub wait: Option<String>,
    pub running: usize,
    pub waiting: usize,
    /// Who holds each slot, by slot number.
    pub holders: Vec<GroupMember>,
    /// The line, first in line first: at most [`LINE_SHOWN`] of it.
    pub line: Vec<GroupMember>,
}

/// At most this many waiting attempts of a group are listed: `waiting` counts them all.
pub const LINE_SHOWN: usize = 100;

/// An attempt holding a group's slot, or waiting in its line.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct GroupMember {
    pub job: String,
    pub node: String,
    pub tick: DateTime<Utc>,
    pub fence: i64,
    /// When it started to wait.
    pub since: DateTime<Utc>,
    /// The slot it holds; absent for an attempt in line.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub slot: Option<u32>,
}

#[derive(Debug, Serialize, Deserialize)]
pub struct NodeStatus {
    pub id: String,
    pub version: String,
    pub digest: String,
    /// The node's config differs from the one `status` was given.
    pub drift: bool,
    pub shards: u32,
    pub started_at: DateTime<Utc>,
    /// Shards of this config's elections (the fleet's and the pools') that the node leads.
    pub leads: usize,
    /// The node's tags (`--tags`).
    #[serde(default)]
    pub tags: Vec<String>,
    /// The pools the node campaigns in, by id (their tags joined by `+`).
    #[serde(default)]
    pub pools: Vec<String>,
    /// The etcd member the node's calls go to first; absent for a node of a release before it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub etcd: Option<String>,
}

/// A pool shard or a job that no live node may lead or run: none has all its `run_on` tags.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NoEligibleNode {
    /// When the last node with those tags left, as the first node to see it go wrote down;
    /// `None` when no node saw it (the whole fleet was down, or no node ever had them).
    pub since: Option<DateTime<Utc>>,
}

#[derive(Debug, Serialize, Deserialize)]
pub struct ShardStatus {
    /// The shard within its pool (or within the fleet's `shards`).
    pub shard: u32,
    /// The pool (its tags joined by `+`); absent for the fleet's shards.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pool: Option<String>,
    /// Node id of the leader; `null` while the shard has none.
    pub leader: Option<String>,
    /// The leadership's term: its election key's create revision, the runs' `CRON_TERM`.
    #[serde(default)]
    pub term: Option<i64>,
    /// The same as `term`, under the name it had before runs got a fence per claim.
    pub fence: Option<i64>,
    /// Candidates waiting behind the leader.
    pub standby: usize,
    /// Set when no live node has the pool's tags: nobody leads the shard.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub no_eligible_node: Option<NoEligibleNode>,
}

/// One node's instance of a `fan_out = "all"` job: its own claims and runs.
#[derive(Debug, Serialize, Deserialize)]
pub struct InstanceStatus {
    pub node: String,
    pub last_claim: Option<Claim>,
    pub last_run: Option<RunRecord>,
}

#[derive(Debug, Serialize, Deserialize)]
pub struct JobStatus {
    pub name: String,
    /// The shard within its pool (or within the fleet's `shards`); 0 for a fanned-out job.
    pub shard: u32,
    /// The job's pool: its `run_on` tags joined by `+`; absent for a job without `run_on`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pool: Option<String>,
    #[serde(default)]
    pub fan_out: FanOut,
    /// The job's concurrency group; absent for a job in none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub group: Option<String>,
    /// Set when no live node has all the job's `run_on` tags: nobody runs it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub no_eligible_node: Option<NoEligibleNode>,
    /// A `fan_out = "all"` job's instance on each node that ever claimed a tick of it, live or
    /// gone, by node id; `last_claim` and `last_run` are then absent.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub instances: Vec<InstanceStatus>,
    pub timezone: String,
    /// The schedule as it fires: `H` items expanded, a list joined by `" | "`.
    pub schedule: String,
    /// The last claimed tick: who claimed it and in which term.
    pub last_claim: Option<Claim>,
    /// The last finished run and how it ended.
    pub last_run: Option<RunRecord>,
    pub next: Option<DateTime<Utc>>,
    /// The pause in force (the job's own, or `pause --all`), or `None`.
    pub paused: Option<Pause>,
    /// The blackouts that cover this instant: a tick now is recorded `skipped`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub blackouts_now: Vec<String>,
    /// For a job with `notify`: whether it is failing, the events not delivered yet and the
    /// last one that was (or was given up on).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub notification: Option<NotificationStatus>,
}

/// What a job's notification record says.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct NotificationStatus {
    pub failing: bool,
    pub pending: usize,
    pub last: Option<crate::rules::notify::Sent>,
}
