//! `shardcron status`: who leads each shard, which nodes are live, and each job's last and next
//! run, read straight from etcd.

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use etcd_client::{GetOptions, SortOrder, SortTarget};
use serde::Serialize;

use crate::clock;
use crate::config::Config;
use crate::etcd::{self, CoordError};
use crate::keys::Keys;
use crate::ledger::{Claim, RunRecord};

/// The JSON document of `status --json`; its keys are documented in the README.
#[derive(Debug, Serialize)]
pub struct Status {
    pub cluster: String,
    pub shard_count: u32,
    pub shards: Vec<ShardStatus>,
    pub jobs: Vec<JobStatus>,
}

#[derive(Debug, Serialize)]
pub struct ShardStatus {
    pub shard: u32,
    /// Node id of the leader; `null` while the shard has none.
    pub leader: Option<String>,
    /// The leader's fence (its election key's create revision).
    pub fence: Option<i64>,
    /// Candidates waiting behind the leader.
    pub standby: usize,
}

#[derive(Debug, Serialize)]
pub struct JobStatus {
    pub name: String,
    pub shard: u32,
    pub timezone: String,
    /// The last claimed tick: who claimed it and with which fence.
    pub last_claim: Option<Claim>,
    /// The last finished run and how it ended.
    pub last_run: Option<RunRecord>,
    pub next: Option<DateTime<Utc>>,
}

/// Reads the cluster's state for `config`'s shards and jobs.
pub async fn read(config: &Config, client: &etcd_client::Client) -> Result<Status, CoordError> {
    let keys = Keys::new(&config.cluster.name);
    let shards = config.cluster.shards;
    let options = GetOptions::new()
        .with_prefix()
        .with_sort(SortTarget::Create, SortOrder::Ascend);
    let candidates = etcd::call(client.clone().get(keys.shards_prefix(), Some(options))).await?;
    let mut per_shard: BTreeMap<u32, Vec<(String, i64)>> = BTreeMap::new();
    for kv in candidates.kvs() {
        let Ok(key) = kv.key_str() else { continue };
        if let Some((shard, of)) = keys.parse_candidate(key) {
            if of == shards {
                let node = String::from_utf8_lossy(kv.value()).into_owned();
                per_shard
                    .entry(shard)
                    .or_default()
                    .push((node, kv.create_revision()));
            }
        }
    }
    let shard_status = (0..shards)
        .map(|shard| {
            let candidates = per_shard.remove(&shard).unwrap_or_default();
            ShardStatus {
                shard,
                leader: candidates.first().map(|(node, _)| node.clone()),
                fence: candidates.first().map(|(_, fence)| *fence),
                standby: candidates.len().saturating_sub(1),
            }
        })
        .collect();

    let records = etcd::call(
        client
            .clone()
            .get(keys.jobs_prefix(), Some(GetOptions::new().with_prefix())),
    )
    .await?;
    let mut claims: BTreeMap<String, Claim> = BTreeMap::new();
    let mut results: BTreeMap<String, RunRecord> = BTreeMap::new();
    for kv in records.kvs() {
        let Ok(key) = kv.key_str() else { continue };
        let Some(rest) = key.strip_prefix(&keys.jobs_prefix()) else {
            continue;
        };
        match rest.rsplit_once('/') {
            Some((job, "last")) => {
                if let Ok(claim) = serde_json::from_slice(kv.value()) {
                    claims.insert(job.to_string(), claim);
                }
            }
            Some((job, "result")) => {
                if let Ok(result) = serde_json::from_slice(kv.value()) {
                    results.insert(job.to_string(), result);
                }
            }
            _ => {}
        }
    }
    let now = clock::now();
    let jobs = config
        .jobs
        .iter()
        .map(|job| JobStatus {
            name: job.name.clone(),
            shard: job.shard,
            timezone: job.schedule.zone().to_string(),
            last_claim: claims.remove(&job.name),
            last_run: results.remove(&job.name),
            next: job.schedule.next_after(now),
        })
        .collect();
    Ok(Status {
        cluster: config.cluster.name.clone(),
        shard_count: shards,
        shards: shard_status,
        jobs,
    })
}

/// The human-readable form.
pub fn render(status: &Status) -> String {
    let mut out = format!(
        "cluster {} ({} shards)\n\nSHARD  LEADER  FENCE  STANDBY\n",
        status.cluster, status.shard_count
    );
    for shard in &status.shards {
        out.push_str(&format!(
            "{}  {}  {}  {}\n",
            shard.shard,
            shard.leader.as_deref().unwrap_or("-"),
            shard
                .fence
                .map_or("-".to_string(), |fence| fence.to_string()),
            shard.standby
        ));
    }
    out.push_str("\nJOB  SHARD  LAST-TICK  NODE  FENCE  OUTCOME  EXIT  NEXT\n");
    for job in &status.jobs {
        let last = job.last_claim.as_ref();
        let run = job.last_run.as_ref();
        out.push_str(&format!(
            "{}  {}  {}  {}  {}  {}  {}  {}\n",
            job.name,
            job.shard,
            last.map_or("-".into(), |claim| claim.scheduled_at.to_rfc3339()),
            last.map_or("-", |claim| claim.node.as_str()),
            last.map_or("-".into(), |claim| claim.fence.to_string()),
            run.map_or("-", |run| run.outcome.as_str()),
            run.and_then(|run| run.exit_code)
                .map_or("-".into(), |code| code.to_string()),
            job.next.map_or("never".into(), |next| next.to_rfc3339()),
        ));
    }
    out
}
