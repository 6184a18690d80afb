//! This node's runs per minute over the last hour, published for the dashboard's fleet strip,
//! and the fleet's sum of them.
//!
//! Each node counts the runs it records and puts its count under `/activity/<node>` on the
//! lease it keeps while its runs go on, at most every [`PUBLISH_EVERY`] and only when it
//! changed: a few writes a minute per node, none per run. A node that dies takes its count with
//! its lease, so the strip shows the runs of the nodes alive.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use chrono::{DateTime, Utc};
use etcd_client::PutOptions;
use tokio_util::sync::CancellationToken;

use crate::backoff::sleep_or_cancel;
use crate::clock;
use crate::coord::etcd::{self, CoordError};
use crate::coord::groups::Groups;
use crate::coord::keys::Keys;
use crate::rules::activity::{fleet_hour, Activity, Counts, Kind};
use crate::rules::record::RunRecord;

/// How often at most a node publishes its count.
pub(crate) const PUBLISH_EVERY: Duration = Duration::from_secs(10);

/// The largest count a node's key may hold that the reader takes; more is not a count.
const MAX_VALUE: usize = 64 * 1024;

/// This node's count, and whether it changed since it was last published. One per node, made
/// when it starts: every run the node records is counted here ([`ActivityCount::record`]), and
/// [`ActivityCount::publish`] puts it in etcd.
#[derive(Debug, Default)]
pub(crate) struct ActivityCount {
    counted: Mutex<(Activity, bool)>,
}

impl ActivityCount {
    fn counted(&self) -> std::sync::MutexGuard<'_, (Activity, bool)> {
        self.counted.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Counts a run this node recorded.
    pub(crate) fn record(&self, record: &RunRecord) {
        let mut counted = self.counted();
        counted.0.record(record.finished_at, Kind::of(record));
        counted.1 = true;
    }

    /// Publishes this node's count while it changes, until `until`.
    pub(crate) async fn publish(
        self: Arc<Self>,
        client: etcd_client::Client,
        keys: Keys,
        node_id: String,
        groups: Arc<Groups>,
        until: CancellationToken,
    ) {
        let key = keys.activity(&node_id);
        while sleep_or_cancel(PUBLISH_EVERY, &until).await {
            let value = {
                let mut counted = self.counted();
                if !counted.1 {
                    continue;
                }
                counted.0.forget_before(clock::now());
                counted.1 = false;
                serde_json::to_vec(&counted.0).unwrap_or_default()
            };
            let Some(lease) = groups.lease_now() else {
                self.counted().1 = true;
                continue;
            };
            let options = PutOptions::new().with_lease(lease.lease());
            if let Err(err) = etcd::call(client.clone().put(key.as_str(), value, Some(options))).await {
                tracing::debug!(error = %err, "cannot publish this node's runs per minute; trying again");
                self.counted().1 = true;
            }
        }
    }
}

/// The fleet's runs per minute over the hour before `now`, oldest first.
pub(crate) async fn read_fleet(
    client: &etcd_client::Client,
    keys: &Keys,
    now: DateTime<Utc>,
) -> Result<Vec<(i64, Counts)>, CoordError> {
    let (read, _) = etcd::read_prefix(client, &keys.activity_prefix()).await?;
    let nodes: Vec<Activity> = read
        .iter()
        .filter(|kv| kv.value().len() <= MAX_VALUE)
        .filter_map(|kv| serde_json::from_slice(kv.value()).ok())
        .collect();
    Ok(fleet_hour(&nodes, now))
}
