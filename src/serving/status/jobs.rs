//! Each job's entry of `status`: its records as read from etcd, and what they are read against;
//! and the reads of just some jobs' records, for a page of them.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;

use chrono::{DateTime, Utc};
use etcd_client::{GetOptions, Txn, TxnOp, TxnOpResponse};

use super::{InstanceStatus, JobStatus, NoEligibleNode, NotificationStatus};
use crate::coord::etcd::{self, CoordError};
use crate::coord::keys::{JobRecord, Keys};
use crate::coord::pauses::{self, Pause};
use crate::rules::config::{Cluster, Job};
use crate::rules::pools::{Elections, FanOut, Tags};
use crate::rules::record::{Claim, RunRecord};

/// What every job's entry is read against.
pub(super) struct JobsContext {
    pub(super) pauses: HashMap<String, Pause>,
    pub(super) now: DateTime<Utc>,
    pub(super) elections: Arc<Elections>,
    /// By `run_on` id: the sets no live node has (see [`super::fleet::Fleet::unserved`]).
    pub(super) unserved: HashMap<String, Option<DateTime<Utc>>>,
}

/// The `run_on` sets of `jobs`.
pub(super) fn run_on_sets<'j>(jobs: impl Iterator<Item = &'j Job>) -> Vec<Tags> {
    let sets: BTreeSet<&Tags> = jobs.map(|job| &job.run_on).filter(|tags| !tags.is_empty()).collect();
    sets.into_iter().cloned().collect()
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
    let seen = JobsContext {
        pauses,
        now,
        elections: Arc::clone(elections),
        unserved,
    };
    Ok(jobs.iter().map(|job| job_status(job, &mut records, &seen)).collect())
}

/// The parsed records of some jobs, by job name, and of fanned-out jobs' instances.
#[derive(Default)]
pub(super) struct Records {
    pub(super) claims: HashMap<String, Claim>,
    pub(super) results: HashMap<String, RunRecord>,
    /// By job, then node.
    pub(super) instances: HashMap<String, BTreeMap<String, InstanceStatus>>,
    /// Jobs' notification records, by job.
    pub(super) notified: HashMap<String, NotificationStatus>,
}

impl NotificationStatus {
    pub(super) fn of(record: crate::rules::notify::Record) -> NotificationStatus {
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
    pub(super) fn take(&mut self, keys: &Keys, key: &str, value: &[u8]) {
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

pub(super) fn job_status(job: &Job, records: &mut Records, seen: &JobsContext) -> JobStatus {
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
