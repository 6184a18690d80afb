//! The records of nodes gone from the fleet, removed once they have been gone longer than
//! `[etcd] gone_node_retention`.
//!
//! Each node runs its own instance of a `fan_out = "all"` job, named `<job>@<node>`, with its
//! own claim, result and success records under `/jobs/<job>@<node>/` and its own history under
//! `/runs/<job>@<node>/`. Node ids change (they default to the host name, and a pod's name
//! changes at every deploy), so without a removal each deploy would leave another set behind
//! for good. The node that leads shard 0 (the one that compacts etcd's history) looks every
//! while and removes an instance's records when its node is not a live member, has been seen
//! gone on every look for the grace below, and the instance's newest stamp (its last claimed
//! tick, its last run's end) is older than the retention. Each removal is one transaction
//! guarded in etcd by the node still being absent and the claim record unchanged since it was
//! read: a node that comes back under the same id between the read and the removal keeps its
//! records.
//!
//! The instance's notification record (`/notify/<job>@<node>`) goes in the same transaction:
//! only an instance's own node sends its events (no leader adopts them), so what it still holds
//! would never be sent.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use chrono::{DateTime, Utc};
use etcd_client::{Compare, CompareOp, DeleteOptions, GetOptions, Txn, TxnOp};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::backoff::sleep_or_cancel;
use crate::coord::etcd::{self, CoordError};
use crate::coord::keys::Keys;
use crate::coord::session::Session;
use crate::coord::view::FleetView;
use crate::rules::record::{Claim, RunRecord};

/// The shard whose leader removes: the same node that compacts etcd's history.
const CLEANING_SHARD: u32 = 0;

/// The longest a node must be seen gone, look after look, before its records may go (shorter
/// when the retention is): a node restarting under the same id is back well within it, and a
/// view read before the fleet's registrations were all in cannot remove a live node's records.
const GRACE: Duration = Duration::from_secs(5 * 60);

/// How often the cleaning node looks: a few times a retention, at least every second and at
/// most every ten minutes (a look lists the keys of every job's records).
fn look_every(retention: Duration) -> Duration {
    (retention / 4).clamp(Duration::from_secs(1), Duration::from_secs(600))
}

/// Whether an instance's records go now: its node not live, seen gone for `absent_for` (by this
/// task's looks), and its newest stamp `newest` (none readable: `None`) older than `retention`.
fn forgettable(
    live: bool,
    absent_for: Duration,
    newest: Option<DateTime<Utc>>,
    now: DateTime<Utc>,
    retention: Duration,
) -> bool {
    if live || absent_for < retention.min(GRACE) {
        return false;
    }
    match newest {
        Some(newest) => now
            .signed_duration_since(newest)
            .to_std()
            .is_ok_and(|age| age >= retention),
        // Nothing readable to date it by: gone for the retention by this task's own looks.
        None => absent_for >= retention,
    }
}

/// Removes the records of instances whose nodes are gone, while this node leads shard 0.
pub(crate) struct GoneNodes {
    session: Session,
    keys: Keys,
    node_id: String,
    retention: Duration,
    view: watch::Receiver<FleetView>,
}

impl GoneNodes {
    pub(crate) fn new(
        session: Session,
        keys: Keys,
        node_id: String,
        retention: Duration,
        view: watch::Receiver<FleetView>,
    ) -> GoneNodes {
        GoneNodes {
            session,
            keys,
            node_id,
            retention,
            view,
        }
    }

    /// Looks every while until `cancel`.
    pub(crate) async fn run(self, cancel: CancellationToken) {
        // Since when (this task's clock) each node with records has been seen gone.
        let mut absent_since: BTreeMap<String, tokio::time::Instant> = BTreeMap::new();
        loop {
            let (leads, members) = {
                let view = self.view.borrow();
                let leads = view
                    .leaders
                    .get(CLEANING_SHARD as usize)
                    .and_then(Option::as_ref)
                    .is_some_and(|(leader, _)| *leader == self.node_id);
                (leads, std::sync::Arc::clone(&view.members))
            };
            // A view without this node is not read yet: every node would look gone.
            if leads && members.contains_key(&self.node_id) {
                if let Err(err) = self.look(&members, &mut absent_since).await {
                    tracing::debug!(error = %err, "cannot remove the records of gone nodes now; trying again later");
                }
            } else {
                // Another node cleans meanwhile; its looks are not this task's.
                absent_since.clear();
            }
            if !sleep_or_cancel(look_every(self.retention), &cancel).await {
                return;
            }
        }
    }

    async fn look(
        &self,
        members: &BTreeMap<String, crate::rules::record::Member>,
        absent_since: &mut BTreeMap<String, tokio::time::Instant>,
    ) -> Result<(), CoordError> {
        let client = self.session.client();
        let instances = instances(&client, &self.keys).await?;
        let now_instant = tokio::time::Instant::now();
        let gone: BTreeSet<&str> = instances
            .iter()
            .map(|(_, node)| node.as_str())
            .filter(|node| !members.contains_key(*node))
            .collect();
        absent_since.retain(|node, _| gone.contains(node.as_str()));
        for node in &gone {
            absent_since.entry(node.to_string()).or_insert(now_instant);
        }
        for (instance, node) in &instances {
            let Some(since) = absent_since.get(node) else { continue };
            let absent_for = now_instant.duration_since(*since);
            if absent_for < self.retention.min(GRACE) {
                continue;
            }
            let (newest, claim_revision) = newest_stamp(&client, &self.keys, instance).await?;
            if !forgettable(false, absent_for, newest, crate::clock::now(), self.retention) {
                continue;
            }
            if remove(&client, &self.keys, instance, node, claim_revision).await? {
                tracing::info!(instance = %instance, node = %node, newest = %crate::clock::shown(newest), "removed the records of a node gone longer than gone_node_retention");
            }
        }
        Ok(())
    }
}

/// Every instance (`<job>@<node>`) with a record under `/jobs/`, with its node: the keys
/// alone, in pages.
async fn instances(client: &etcd_client::Client, keys: &Keys) -> Result<BTreeSet<(String, String)>, CoordError> {
    let prefix = keys.jobs_prefix();
    let mut end = prefix.as_bytes().to_vec();
    if let Some(last) = end.last_mut() {
        *last += 1;
    }
    let mut from = prefix.as_bytes().to_vec();
    let mut found = BTreeSet::new();
    loop {
        let options = GetOptions::new()
            .with_range(end.clone())
            .with_limit(etcd::PAGE)
            .with_keys_only();
        let read = etcd::call(client.clone().get(from.clone(), Some(options))).await?;
        for kv in read.kvs() {
            let Ok(key) = std::str::from_utf8(kv.key()) else {
                continue;
            };
            let Some((instance, _record)) = key.strip_prefix(&prefix).and_then(|rest| rest.rsplit_once('/')) else {
                continue;
            };
            if let Some((_job, node)) = instance.split_once('@') {
                if !node.is_empty() {
                    found.insert((instance.to_string(), node.to_string()));
                }
            }
        }
        match read.kvs().last() {
            Some(last) if read.more() => {
                from = last.key().to_vec();
                from.push(0);
            }
            _ => return Ok(found),
        }
    }
}

/// The newest stamp of `instance`'s records (its claimed tick, its last run's end) and the
/// revision its claim record was last written at (0: none).
async fn newest_stamp(
    client: &etcd_client::Client,
    keys: &Keys,
    instance: &str,
) -> Result<(Option<DateTime<Utc>>, i64), CoordError> {
    let gets = [
        TxnOp::get(keys.job_last(instance), None),
        TxnOp::get(keys.job_result(instance), None),
        TxnOp::get(keys.job_success(instance), None),
    ];
    let response = etcd::call(client.clone().txn(Txn::new().and_then(gets))).await?;
    let mut newest: Option<DateTime<Utc>> = None;
    let mut claim_revision = 0;
    for (index, answer) in response.op_responses().into_iter().enumerate() {
        let etcd_client::TxnOpResponse::Get(read) = answer else {
            continue;
        };
        let Some(kv) = read.kvs().first() else { continue };
        let stamp = if index == 0 {
            claim_revision = kv.mod_revision();
            serde_json::from_slice::<Claim>(kv.value())
                .ok()
                .map(|claim| claim.scheduled_at)
        } else {
            serde_json::from_slice::<RunRecord>(kv.value())
                .ok()
                .map(|record| record.finished_at.max(record.scheduled_at))
        };
        newest = newest.max(stamp);
    }
    Ok((newest, claim_revision))
}

/// Removes every record of `instance` in one transaction, if `node` is still not registered
/// and its claim record unchanged. Whether it did.
async fn remove(
    client: &etcd_client::Client,
    keys: &Keys,
    instance: &str,
    node: &str,
    claim_revision: i64,
) -> Result<bool, CoordError> {
    let prefix = |prefix: String| TxnOp::delete(prefix, Some(DeleteOptions::new().with_prefix()));
    let txn = Txn::new()
        .when([
            Compare::version(keys.node(node), CompareOp::Equal, 0),
            Compare::mod_revision(keys.job_last(instance), CompareOp::Equal, claim_revision),
        ])
        .and_then([
            prefix(keys.job_records_prefix(instance)),
            prefix(keys.job_runs_prefix(instance)),
            TxnOp::delete(keys.notify(instance), None),
        ]);
    let response = etcd::call(client.clone().txn(txn)).await?;
    Ok(response.succeeded())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_instance_goes_once_its_node_is_gone_past_the_grace_and_its_records_past_the_retention() {
        let now = DateTime::<Utc>::from_timestamp(1_800_000_000, 0).unwrap();
        let ago = |seconds: i64| Some(now - chrono::Duration::seconds(seconds));
        let day = Duration::from_secs(86_400);
        let minutes = |m: u64| Duration::from_secs(60 * m);
        let cases = [
            (
                true,
                minutes(60),
                ago(2 * 86_400),
                day,
                false,
                "a live node keeps its records",
            ),
            (
                false,
                minutes(4),
                ago(2 * 86_400),
                day,
                false,
                "gone, but not for the grace yet",
            ),
            (
                false,
                minutes(5),
                ago(2 * 86_400),
                day,
                true,
                "gone past the grace, records old",
            ),
            (
                false,
                minutes(60),
                ago(3_600),
                day,
                false,
                "records younger than the retention",
            ),
            (
                false,
                minutes(5),
                None,
                day,
                false,
                "nothing to date it by: the retention by looks",
            ),
            (
                false,
                day,
                None,
                day,
                true,
                "nothing to date it by, gone a whole retention",
            ),
            (
                false,
                Duration::from_secs(10),
                ago(11),
                Duration::from_secs(10),
                true,
                "a short retention is its own grace",
            ),
            (
                false,
                Duration::from_secs(9),
                ago(11),
                Duration::from_secs(10),
                false,
                "seen gone for less than it",
            ),
            (
                false,
                minutes(60),
                ago(-3_600),
                day,
                false,
                "a stamp from a clock ahead is young",
            ),
        ];
        for (live, absent_for, newest, retention, expected, why) in cases {
            assert_eq!(forgettable(live, absent_for, newest, now, retention), expected, "{why}");
        }
    }

    #[test]
    fn looks_a_few_times_a_retention_within_bounds() {
        assert_eq!(look_every(Duration::from_secs(2)), Duration::from_secs(1));
        assert_eq!(look_every(Duration::from_secs(20)), Duration::from_secs(5));
        assert_eq!(look_every(Duration::from_secs(86_400)), Duration::from_secs(600));
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_gone_nodes_instances_go_whole_and_nothing_else_does() {
        let etcd = crate::etcd_server::EtcdServer::start(&crate::etcd_server::test_etcd_bin()).expect("etcd");
        let client = etcd_client::Client::connect([etcd.client_url()], None)
            .await
            .expect("client");
        let keys = Keys::new("gone");
        let claim = serde_json::to_vec(&Claim {
            scheduled_at: DateTime::<Utc>::from_timestamp(1_800_000_000, 0).unwrap(),
            ..Default::default()
        })
        .unwrap();
        let put = |key: String, value: Vec<u8>| {
            let client = client.clone();
            async move { client.clone().put(key, value, None).await.unwrap() }
        };
        // x's instance, y's (a node whose id begins like x's), and a plain job named alike.
        for name in ["rotate@x", "rotate@xy", "rotate"] {
            put(keys.job_last(name), claim.clone()).await;
            put(format!("{}1800000000", keys.job_runs_prefix(name)), b"{}".to_vec()).await;
        }
        put(keys.node("x"), b"{}".to_vec()).await;
        let found = instances(&client, &keys).await.unwrap();
        let expected: BTreeSet<(String, String)> = [("rotate@x", "x"), ("rotate@xy", "xy")]
            .map(|(instance, node)| (instance.to_string(), node.to_string()))
            .into();
        assert_eq!(found, expected);
        let (newest, revision) = newest_stamp(&client, &keys, "rotate@x").await.unwrap();
        assert_eq!(newest, DateTime::<Utc>::from_timestamp(1_800_000_000, 0));
        assert!(
            !remove(&client, &keys, "rotate@x", "x", revision).await.unwrap(),
            "x is registered again"
        );
        client.clone().delete(keys.node("x"), None).await.unwrap();
        assert!(
            !remove(&client, &keys, "rotate@x", "x", revision - 1).await.unwrap(),
            "its claim changed since the read"
        );
        assert!(remove(&client, &keys, "rotate@x", "x", revision).await.unwrap());
        let left = client
            .clone()
            .get(
                b"/shardcron/gone/".to_vec(),
                Some(GetOptions::new().with_prefix().with_keys_only()),
            )
            .await
            .unwrap();
        let left: Vec<String> = left
            .kvs()
            .iter()
            .map(|kv| String::from_utf8_lossy(kv.key()).into_owned())
            .collect();
        assert_eq!(
            left,
            [
                "/shardcron/gone/jobs/rotate/last",
                "/shardcron/gone/jobs/rotate@xy/last",
                "/shardcron/gone/runs/rotate/1800000000",
                "/shardcron/gone/runs/rotate@xy/1800000000",
            ]
        );
    }
}
