//! `shardcron status`: who leads each shard, which nodes are live, and each job's last and next
//! run, read straight from etcd.
//!
//! - `fleet`: the nodes, every election's leader, the `run_on` sets no node has.
//! - `render`: the text tables.

mod fleet;
mod render;

pub use render::render;

use std::borrow::Borrow;
use std::cell::RefCell;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;

use chrono::{DateTime, Utc};
use etcd_client::{GetOptions, Txn, TxnOp, TxnOpResponse};
use serde::{Deserialize, Serialize};

use crate::clock;
use crate::coord::etcd::{self, CoordError};
use crate::coord::groups::{GroupView, Kept};
use crate::coord::keys::{JobRecord, Keys};
use crate::coord::pauses::{self, Pause};
use crate::rules::backfill::Backfill;
use crate::rules::config::{Cluster, GroupsByName, Job};
use crate::rules::pools::{Elections, FanOut, Tags};
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

/// Job records per page of a status read: a record is a few hundred bytes, so a page stays
/// below etcd-client's 4 MiB answer limit (a page that does not is read again in halves). Few
/// large pages: at 100,000 jobs the read is mostly waiting for etcd, once per page.
const RECORDS_PAGE: i64 = 5000;

/// What [`Status`] holds, read, with each job's entry built only as it is written: the JSON of
/// 100,000 jobs is written without a second copy of them all in memory.
///
/// `J` is how the caller holds its jobs: `&Job` borrowed from a config, `Arc<Job>` to send the
/// document to another thread. Wrapping a config's 100,000 jobs in new `Arc`s would hold them
/// twice for a moment.
#[derive(Serialize)]
#[serde(bound = "")]
pub struct Document<J: Borrow<Job>> {
    cluster: String,
    shard_count: u32,
    digest: String,
    nodes: Vec<NodeStatus>,
    shards: Vec<ShardStatus>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    groups: Vec<GroupStatus>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    backfills: Vec<BackfillStatus>,
    jobs: LazyJobs<J>,
}

impl<J: Borrow<Job>> Document<J> {
    /// Every job's entry made at once: what the text tables print from.
    pub fn into_status(self) -> Status {
        let jobs = self.jobs.collect();
        Status {
            cluster: self.cluster,
            shard_count: self.shard_count,
            digest: self.digest,
            nodes: self.nodes,
            shards: self.shards,
            groups: self.groups,
            backfills: self.backfills,
            jobs,
        }
    }
}

/// The jobs of a [`Document`] and what their entries are made of.
struct LazyJobs<J> {
    jobs: Vec<J>,
    /// Taken out as each job's entry is made.
    records: RefCell<Records>,
    seen: Seen,
}

/// What every job's entry is read against.
struct Seen {
    pauses: HashMap<String, Pause>,
    now: DateTime<Utc>,
    elections: Arc<Elections>,
    /// By `run_on` id: the sets no live node has (see [`fleet::Fleet::unserved`]).
    unserved: HashMap<String, Option<DateTime<Utc>>>,
}

impl<J: Borrow<Job>> LazyJobs<J> {
    fn collect(self) -> Vec<JobStatus> {
        let mut records = self.records.into_inner();
        self.jobs
            .iter()
            .map(|job| job_status(job.borrow(), &mut records, &self.seen))
            .collect()
    }
}

impl<J: Borrow<Job>> Serialize for LazyJobs<J> {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_seq(
            self.jobs
                .iter()
                .map(|job| job_status(job.borrow(), &mut self.records.borrow_mut(), &self.seen)),
        )
    }
}

/// The `run_on` sets of `jobs`.
fn run_on_sets<'j>(jobs: impl Iterator<Item = &'j Job>) -> Vec<Tags> {
    let sets: BTreeSet<&Tags> = jobs.map(|job| &job.run_on).filter(|tags| !tags.is_empty()).collect();
    sets.into_iter().cloned().collect()
}

/// Reads what `status` shows, for `jobs` of a file with `digest` and `groups`, to be written as
/// JSON.
pub async fn read_document<J: Borrow<Job>>(
    cluster: &Cluster,
    elections: &Arc<Elections>,
    digest: &str,
    groups: &GroupsByName,
    jobs: Vec<J>,
    client: &etcd_client::Client,
) -> Result<Document<J>, CoordError> {
    let keys = Keys::new(&cluster.name);
    let groups = match groups.is_empty() {
        true => Vec::new(),
        false => group_statuses(groups, crate::coord::groups::read_views(client, &keys).await?),
    };
    let run_on = run_on_sets(jobs.iter().map(Borrow::borrow));
    let fleet = fleet::read(cluster, elections, &run_on, digest, client).await?;
    // In pages, keeping only the parsed records: one unpaged read fails past 4 MiB (about
    // 5,700 jobs that have run).
    // Sized once: growing a table of 100,000 records holds the old one and the new at once.
    let mut records = Records {
        claims: HashMap::with_capacity(jobs.len()),
        results: HashMap::with_capacity(jobs.len()),
        instances: HashMap::new(),
        notified: HashMap::new(),
    };
    if jobs.iter().any(|job| !job.borrow().notify.is_empty()) {
        for (job, record) in crate::coord::notifications::read_all(client, &keys).await? {
            records.notified.insert(job, NotificationStatus::of(record));
        }
    }
    if !jobs.is_empty() {
        etcd::scan_prefix(client, &keys.jobs_prefix(), RECORDS_PAGE, |page| {
            for kv in &page {
                if let Ok(key) = kv.key_str() {
                    records.take(&keys, key, kv.value());
                }
            }
        })
        .await?;
    }
    let now = clock::now();
    let pauses = pauses::in_force(client, &keys, now).await?;
    let mut backfills: Vec<BackfillStatus> = crate::coord::backfills::read_all(client, &keys)
        .await?
        .into_iter()
        .map(|(job, backfill)| BackfillStatus {
            job,
            over: backfill.is_over(),
            backfill,
        })
        .collect();
    backfills.sort_by(|one, other| one.job.cmp(&other.job));
    Ok(Document {
        cluster: cluster.name.clone(),
        shard_count: cluster.shards,
        digest: digest.to_string(),
        nodes: fleet.nodes,
        shards: fleet.shards,
        groups,
        backfills,
        jobs: LazyJobs {
            jobs,
            records: RefCell::new(records),
            seen: Seen {
                pauses,
                now,
                elections: Arc::clone(elections),
                unserved: fleet.unserved,
            },
        },
    })
}

/// Each of `configured` as the `views` read from etcd show it.
fn group_statuses(configured: &GroupsByName, mut views: HashMap<String, GroupView>) -> Vec<GroupStatus> {
    let member = |kept: &Kept, slot: Option<u32>| GroupMember {
        job: kept.holder.job.clone(),
        node: kept.holder.node.clone(),
        tick: kept.holder.tick,
        fence: kept.holder.fence,
        since: kept.holder.since,
        slot,
    };
    configured
        .values()
        .map(|group| {
            let view = views.remove(&group.name).unwrap_or_default();
            GroupStatus {
                name: group.name.clone(),
                limit: group.limit,
                wait: group.wait.map(|wait| humantime::format_duration(wait).to_string()),
                running: view.slots.len(),
                waiting: view.waiting.len(),
                holders: view
                    .slots
                    .iter()
                    .map(|(slot, kept)| member(kept, Some(*slot)))
                    .collect(),
                line: view
                    .waiting
                    .values()
                    .take(LINE_SHOWN)
                    .map(|kept| member(kept, None))
                    .collect(),
            }
        })
        .collect()
}

/// Range reads per transaction of [`read_jobs`]: etcd refuses more than 128 operations in one.
const READS_PER_TXN: usize = 100;

/// The status of just `jobs` (a page of them), with `pauses` in force at `now` (from
/// [`pauses::in_force`]): only their own records are read, with their instances' for a
/// fanned-out job.
pub(crate) async fn read_jobs(
    cluster: &Cluster,
    elections: &Arc<Elections>,
    jobs: &[&Job],
    client: &etcd_client::Client,
    pauses: HashMap<String, Pause>,
    now: DateTime<Utc>,
) -> Result<Vec<JobStatus>, CoordError> {
    let keys = Keys::new(&cluster.name);
    let mut records = Records::default();
    let prefixes: Vec<String> = jobs
        .iter()
        .flat_map(|job| {
            let instances = (job.fan_out == FanOut::All).then(|| keys.job_instances_prefix(&job.name));
            let notify = (!job.notify.is_empty()).then(|| keys.notify(&job.name));
            std::iter::once(keys.job_records_prefix(&job.name))
                .chain(instances)
                .chain(notify)
        })
        .collect();
    let notify_prefix = keys.notify_prefix();
    for chunk in prefixes.chunks(READS_PER_TXN) {
        let reads: Vec<TxnOp> = chunk
            .iter()
            .map(|prefix| match prefix.starts_with(&notify_prefix) {
                // One key: a prefix read of `/notify/a` would read `/notify/ab` too.
                true => TxnOp::get(prefix.as_str(), None),
                false => TxnOp::get(prefix.as_str(), Some(GetOptions::new().with_prefix())),
            })
            .collect();
        let response = etcd::call(client.clone().txn(Txn::new().and_then(reads))).await?;
        for answer in response.op_responses() {
            if let TxnOpResponse::Get(read) = answer {
                for kv in read.kvs() {
                    if let Ok(key) = kv.key_str() {
                        records.take(&keys, key, kv.value());
                    }
                }
            }
        }
    }
    let run_on = run_on_sets(jobs.iter().copied());
    let unserved = if run_on.is_empty() {
        HashMap::new()
    } else {
        let (members, _) = crate::coord::fleet::read_members(client, &keys).await?;
        let marks = crate::coord::unserved::read(client, &keys).await?;
        crate::coord::unserved::since(&run_on, &members.nodes, &marks)
    };
    let seen = Seen {
        pauses,
        now,
        elections: Arc::clone(elections),
        unserved,
    };
    Ok(jobs.iter().map(|job| job_status(job, &mut records, &seen)).collect())
}

/// The parsed records of some jobs, by job name, and of fanned-out jobs' instances.
#[derive(Default)]
struct Records {
    claims: HashMap<String, Claim>,
    results: HashMap<String, RunRecord>,
    /// By job, then node.
    instances: HashMap<String, BTreeMap<String, InstanceStatus>>,
    /// Jobs' notification records, by job.
    notified: HashMap<String, NotificationStatus>,
}

impl NotificationStatus {
    fn of(record: crate::rules::notify::Record) -> NotificationStatus {
        NotificationStatus {
            failing: record.failing,
            pending: record.pending.len(),
            last: record.last,
        }
    }
}

impl Records {
    /// Keeps the record at `key`, if it is a claim or a result that parses. A record named
    /// `<job>@<node>` is an instance's: job names have no `@`.
    fn take(&mut self, keys: &Keys, key: &str, value: &[u8]) {
        if let Some(job) = key.strip_prefix(&keys.notify_prefix()) {
            if let Ok(record) = serde_json::from_slice(value) {
                self.notified.insert(job.to_string(), NotificationStatus::of(record));
            }
            return;
        }
        let Some((name, kind)) = keys.parse_job_record(key) else {
            return;
        };
        if let Some((job, node)) = name.split_once('@') {
            let instance = self
                .instances
                .entry(job.to_string())
                .or_default()
                .entry(node.to_string())
                .or_insert_with(|| InstanceStatus {
                    node: node.to_string(),
                    last_claim: None,
                    last_run: None,
                });
            match kind {
                JobRecord::Last => instance.last_claim = serde_json::from_slice(value).ok(),
                JobRecord::Result => instance.last_run = serde_json::from_slice(value).ok(),
            }
            return;
        }
        match kind {
            JobRecord::Last => {
                if let Ok(claim) = serde_json::from_slice(value) {
                    self.claims.insert(name.to_string(), claim);
                }
            }
            JobRecord::Result => {
                if let Ok(result) = serde_json::from_slice(value) {
                    self.results.insert(name.to_string(), result);
                }
            }
        }
    }
}

fn job_status(job: &Job, records: &mut Records, seen: &Seen) -> JobStatus {
    let election = seen.elections.locate(job.shard);
    let pool = (!job.run_on.is_empty()).then(|| job.run_on.id());
    let no_eligible_node = pool
        .as_ref()
        .and_then(|id| seen.unserved.get(id))
        .map(|since| NoEligibleNode { since: *since });
    let instances = match job.fan_out {
        FanOut::All => records
            .instances
            .remove(&job.name)
            .map(|by_node| by_node.into_values().collect())
            .unwrap_or_default(),
        FanOut::One => Vec::new(),
    };
    JobStatus {
        name: job.name.clone(),
        shard: election.map_or(job.shard, |election| election.shard()),
        pool,
        fan_out: job.fan_out,
        group: job.group.as_ref().map(|group| group.name.clone()),
        no_eligible_node,
        instances,
        timezone: job.schedule.zone().to_string(),
        schedule: job.schedule.expanded().to_string(),
        last_claim: records.claims.remove(&job.name),
        last_run: records.results.remove(&job.name),
        next: job.schedule.next_after(seen.now),
        paused: seen
            .pauses
            .get(&job.name)
            .or_else(|| seen.pauses.get(pauses::EVERY_JOB))
            .cloned(),
        blackouts_now: job
            .blackouts
            .iter()
            .filter(|blackout| blackout.covers(seen.now))
            .map(|blackout| blackout.name.clone())
            .collect(),
        notification: match job.notify.is_empty() {
            true => None,
            false => Some(records.notified.remove(&job.name).unwrap_or(NotificationStatus {
                failing: false,
                pending: 0,
                last: None,
            })),
        },
    }
}
