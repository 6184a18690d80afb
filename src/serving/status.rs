//! `shardcron status`: who leads each shard, which nodes are live, and each job's last and next
//! run, read straight from etcd.

use std::borrow::Borrow;
use std::cell::RefCell;
use std::collections::HashMap;

use chrono::{DateTime, Utc};
use etcd_client::{GetOptions, Txn, TxnOp, TxnOpResponse};
use serde::{Deserialize, Serialize};

use crate::clock;
use crate::coord::etcd::{self, CoordError};
use crate::coord::fleet;
use crate::coord::keys::{JobRecord, Keys};
use crate::coord::pauses::{self, Pause};
use crate::rules::config::{Cluster, Job};
use crate::rules::record::{Claim, RunRecord};
use crate::text_table;

/// The JSON document of `status --json`; its keys are documented in docs/http-api.md.
#[derive(Debug, Serialize, Deserialize)]
pub struct Status {
    pub cluster: String,
    pub shard_count: u32,
    /// This config's digest; members with another one run a different jobs.toml.
    pub digest: String,
    pub nodes: Vec<NodeStatus>,
    pub shards: Vec<ShardStatus>,
    pub jobs: Vec<JobStatus>,
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
    /// Shards of this config's shard count that the node leads.
    pub leads: usize,
}

#[derive(Debug, Serialize, Deserialize)]
pub struct ShardStatus {
    pub shard: u32,
    /// Node id of the leader; `null` while the shard has none.
    pub leader: Option<String>,
    /// The leadership's term: its election key's create revision, the runs' `CRON_TERM`.
    #[serde(default)]
    pub term: Option<i64>,
    /// The same as `term`, under the name it had before runs got a fence per claim.
    pub fence: Option<i64>,
    /// Candidates waiting behind the leader.
    pub standby: usize,
}

#[derive(Debug, Serialize, Deserialize)]
pub struct JobStatus {
    pub name: String,
    pub shard: u32,
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
}

/// Job records per page of a status read: a record is a few hundred bytes, so a page stays
/// below etcd-client's 4 MiB answer limit (a page that does not is read again in halves). Few
/// large pages: at 100,000 jobs the read is mostly waiting for etcd, once per page.
const RECORDS_PAGE: i64 = 5000;

/// Reads the cluster's state for the shards of `cluster` and for `jobs`, which came from a file
/// with `digest`.
pub async fn read<J: Borrow<Job>>(
    cluster: &Cluster,
    digest: &str,
    jobs: Vec<J>,
    client: &etcd_client::Client,
) -> Result<Status, CoordError> {
    let document = read_document(cluster, digest, jobs, client).await?;
    let jobs = document.jobs.collect();
    Ok(Status {
        cluster: document.cluster,
        shard_count: document.shard_count,
        digest: document.digest,
        nodes: document.nodes,
        shards: document.shards,
        jobs,
    })
}

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
    jobs: LazyJobs<J>,
}

/// The jobs of a [`Document`] and what their entries are made of.
struct LazyJobs<J> {
    jobs: Vec<J>,
    /// Taken out as each job's entry is made.
    records: RefCell<Records>,
    pauses: HashMap<String, Pause>,
    now: DateTime<Utc>,
}

impl<J: Borrow<Job>> LazyJobs<J> {
    fn collect(self) -> Vec<JobStatus> {
        job_statuses(
            self.jobs.iter().map(Borrow::borrow),
            &mut self.records.into_inner(),
            &self.pauses,
            self.now,
        )
    }
}

impl<J: Borrow<Job>> Serialize for LazyJobs<J> {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let every_job = self.pauses.get(pauses::EVERY_JOB);
        serializer.collect_seq(self.jobs.iter().map(|job| {
            job_status(
                job.borrow(),
                &mut self.records.borrow_mut(),
                &self.pauses,
                every_job,
                self.now,
            )
        }))
    }
}

/// Reads what `status` shows, for `jobs` of a file with `digest`, to be written as JSON.
pub async fn read_document<J: Borrow<Job>>(
    cluster: &Cluster,
    digest: &str,
    jobs: Vec<J>,
    client: &etcd_client::Client,
) -> Result<Document<J>, CoordError> {
    let keys = Keys::new(&cluster.name);
    let (nodes, shards) = read_fleet(cluster, digest, client).await?;
    // In pages, keeping only the parsed records: one unpaged read fails past 4 MiB (about
    // 5,700 jobs that have run).
    // Sized once: growing a table of 100,000 records holds the old one and the new at once.
    let mut records = Records {
        claims: HashMap::with_capacity(jobs.len()),
        results: HashMap::with_capacity(jobs.len()),
    };
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
    Ok(Document {
        cluster: cluster.name.clone(),
        shard_count: cluster.shards,
        digest: digest.to_string(),
        nodes,
        shards,
        jobs: LazyJobs {
            jobs,
            records: RefCell::new(records),
            pauses,
            now,
        },
    })
}

/// The nodes and shard leaders of `cluster`, for a config with `digest`.
pub(crate) async fn read_fleet(
    cluster: &Cluster,
    digest: &str,
    client: &etcd_client::Client,
) -> Result<(Vec<NodeStatus>, Vec<ShardStatus>), CoordError> {
    let keys = Keys::new(&cluster.name);
    let shards = cluster.shards;
    let (ballot, _) = fleet::read_ballot(client, &keys, shards).await?;
    let (members, _) = fleet::read_members(client, &keys).await?;
    let member_leases = members.leases();
    let shard_status: Vec<ShardStatus> = (0..shards)
        .map(|shard| {
            let leader = ballot.leader(shard, &member_leases);
            ShardStatus {
                shard,
                leader: leader.map(|leader| leader.node.clone()),
                term: leader.map(|leader| leader.term),
                fence: leader.map(|leader| leader.term),
                standby: ballot
                    .candidates(shard)
                    .iter()
                    .filter(|candidate| candidate.is_member(&member_leases))
                    .count()
                    .saturating_sub(usize::from(leader.is_some())),
            }
        })
        .collect();

    let nodes = members
        .nodes
        .into_iter()
        .map(|(id, member)| NodeStatus {
            drift: member.digest != digest,
            leads: shard_status
                .iter()
                .filter(|shard| shard.leader.as_deref() == Some(id.as_str()))
                .count(),
            id,
            version: member.version,
            digest: member.digest,
            shards: member.shards,
            started_at: member.started_at,
        })
        .collect();
    Ok((nodes, shard_status))
}

/// Range reads per transaction of [`read_jobs`]: etcd refuses more than 128 operations in one.
const READS_PER_TXN: usize = 100;

/// The status of just `jobs` (a page of them), with `pauses` in force at `now` (from
/// [`pauses::in_force`]): only their own records are read.
pub(crate) async fn read_jobs(
    cluster: &Cluster,
    jobs: &[&Job],
    client: &etcd_client::Client,
    pauses: &HashMap<String, Pause>,
    now: DateTime<Utc>,
) -> Result<Vec<JobStatus>, CoordError> {
    let keys = Keys::new(&cluster.name);
    let mut records = Records::default();
    for chunk in jobs.chunks(READS_PER_TXN) {
        let reads: Vec<TxnOp> = chunk
            .iter()
            .map(|job| {
                TxnOp::get(
                    keys.job_records_prefix(&job.name),
                    Some(GetOptions::new().with_prefix()),
                )
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
    Ok(job_statuses(jobs.iter().copied(), &mut records, pauses, now))
}

/// The parsed records of some jobs, by job name.
#[derive(Default)]
struct Records {
    claims: HashMap<String, Claim>,
    results: HashMap<String, RunRecord>,
}

impl Records {
    /// Keeps the record at `key`, if it is a claim or a result that parses.
    fn take(&mut self, keys: &Keys, key: &str, value: &[u8]) {
        match keys.parse_job_record(key) {
            Some((job, JobRecord::Last)) => {
                if let Ok(claim) = serde_json::from_slice(value) {
                    self.claims.insert(job.to_string(), claim);
                }
            }
            Some((job, JobRecord::Result)) => {
                if let Ok(result) = serde_json::from_slice(value) {
                    self.results.insert(job.to_string(), result);
                }
            }
            None => {}
        }
    }
}

fn job_statuses<'j>(
    jobs: impl Iterator<Item = &'j Job>,
    records: &mut Records,
    pauses: &HashMap<String, Pause>,
    now: DateTime<Utc>,
) -> Vec<JobStatus> {
    let every_job = pauses.get(pauses::EVERY_JOB);
    jobs.map(|job| job_status(job, records, pauses, every_job, now))
        .collect()
}

fn job_status(
    job: &Job,
    records: &mut Records,
    pauses: &HashMap<String, Pause>,
    every_job: Option<&Pause>,
    now: DateTime<Utc>,
) -> JobStatus {
    JobStatus {
        name: job.name.clone(),
        shard: job.shard,
        timezone: job.schedule.zone().to_string(),
        schedule: job.schedule.expanded().to_string(),
        last_claim: records.claims.remove(&job.name),
        last_run: records.results.remove(&job.name),
        next: job.schedule.next_after(now),
        paused: pauses.get(&job.name).or(every_job).cloned(),
    }
}

/// The human-readable form: nodes, shard leaders and jobs as aligned tables.
pub fn render(status: &Status) -> String {
    format!(
        "cluster {} ({} shards, config digest {})\n\n{}\n{}\n{}",
        status.cluster,
        status.shard_count,
        status.digest,
        nodes_table(status),
        shards_table(status),
        jobs_table(status)
    )
}

fn dash() -> String {
    "-".to_string()
}

fn nodes_table(status: &Status) -> String {
    let nodes: Vec<Vec<String>> = status
        .nodes
        .iter()
        .map(|node| {
            vec![
                node.id.clone(),
                node.leads.to_string(),
                node.shards.to_string(),
                format!("{}{}", node.digest, if node.drift { " (differs)" } else { "" }),
                node.version.clone(),
                node.started_at.to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
            ]
        })
        .collect();
    text_table::table(&["NODE", "LEADS", "SHARDS", "DIGEST", "VERSION", "STARTED"], &nodes)
}

fn shards_table(status: &Status) -> String {
    let shards: Vec<Vec<String>> = status
        .shards
        .iter()
        .map(|shard| {
            vec![
                shard.shard.to_string(),
                shard.leader.clone().unwrap_or_else(dash),
                shard.term.map_or_else(dash, |term| term.to_string()),
                shard.standby.to_string(),
            ]
        })
        .collect();
    // FENCE: the leader's term, under the column's first name (the output is a contract).
    text_table::table(&["SHARD", "LEADER", "FENCE", "STANDBY"], &shards)
}

fn jobs_table(status: &Status) -> String {
    let jobs: Vec<Vec<String>> = status
        .jobs
        .iter()
        .map(|job| {
            let claim = job.last_claim.as_ref();
            let run = job.last_run.as_ref();
            vec![
                job.name.clone(),
                job.shard.to_string(),
                claim.map_or_else(dash, |claim| {
                    claim.scheduled_at.to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
                }),
                claim.map_or_else(dash, |claim| claim.node.clone()),
                claim.map_or_else(dash, |claim| claim.term.to_string()),
                run.map_or_else(dash, |run| run.outcome.to_string()),
                run.and_then(|run| run.exit_code)
                    .map_or_else(dash, |code| code.to_string()),
                job.next.map_or_else(
                    || "never".to_string(),
                    |next| next.to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
                ),
                job.paused.as_ref().map_or_else(dash, |pause| match pause.until {
                    Some(until) => format!("until {}", until.to_rfc3339_opts(chrono::SecondsFormat::Secs, true)),
                    None => "yes".to_string(),
                }),
            ]
        })
        .collect();
    text_table::table(
        &[
            "JOB",
            "SHARD",
            "LAST TICK",
            "NODE",
            "FENCE",
            "OUTCOME",
            "EXIT",
            "NEXT",
            "PAUSED",
        ],
        &jobs,
    )
}
