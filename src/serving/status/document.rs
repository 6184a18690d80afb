//! The whole `status` document: the fleet, the groups, the backfills and every job, read once
//! and written as JSON with each job's entry made only as it is written.

use std::borrow::Borrow;
use std::cell::RefCell;
use std::collections::HashMap;
use std::sync::Arc;

use serde::Serialize;

use super::fleet;
use super::jobs::{job_status, run_on_sets, JobsContext, Records};
use super::{
    BackfillStatus, GroupMember, GroupStatus, JobStatus, NodeStatus, NotificationStatus, ShardStatus, Status,
    LINE_SHOWN,
};
use crate::clock;
use crate::coord::etcd::{self, CoordError};
use crate::coord::groups::{GroupView, Kept};
use crate::coord::keys::Keys;
use crate::coord::pauses;
use crate::rules::config::{Cluster, GroupsByName, Job};
use crate::rules::pools::Elections;

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
    seen: JobsContext,
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
            seen: JobsContext {
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
