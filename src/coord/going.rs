//! Runs of a job going on other nodes, as etcd shows them: whether one still goes, asking its
//! node to stop it (`overlap = "replace"`), and the node's side of such a request.
//!
//! A leader of an `overlap = "skip"` or `"replace"` job lists its run going on in the job's
//! record ([`Going`], riding its claims), on the lease its node keeps while its runs go on. A
//! run listed so has ended once its node has recorded it (its history entry, or the job's
//! result written by that node, holds its fence or a higher one), or once etcd no longer holds
//! that lease (its node died, or was cut off past its TTL). Reads only: a job whose record
//! lists no other node's run costs nothing here.

use std::time::Duration;

use etcd_client::{Client, EventType, GetOptions, PutOptions, Txn, TxnOp, TxnOpResponse, WatchOptions};
use tokio_util::sync::CancellationToken;

use crate::backoff::{sleep_or_cancel, Backoff};
use crate::coord::etcd::{self, CoordError};
use crate::coord::history;
use crate::coord::keys::Keys;
use crate::rules::protocol::run_ended;
use crate::rules::record::{Going, RunRecord, Trigger};

/// Whether the run `going` of `job` on another node still goes, as etcd shows it; `None` when
/// etcd does not answer.
pub(crate) async fn still_going(client: &Client, keys: &Keys, job: &str, going: &Going) -> Option<bool> {
    let reads = [
        TxnOp::get(history::key_of(keys, job, going.tick, Trigger::Schedule), None),
        TxnOp::get(keys.job_result(job), None),
    ];
    let read = etcd::call(client.clone().txn(Txn::new().and_then(reads))).await.ok()?;
    // Its own history entry, or the job's result if its node wrote it: either says it ended.
    let ended_fence = read
        .op_responses()
        .into_iter()
        .filter_map(|answer| match answer {
            TxnOpResponse::Get(got) => got.kvs().first().map(|kv| kv.value().to_vec()),
            _ => None,
        })
        .filter_map(|value| serde_json::from_slice::<RunRecord>(&value).ok())
        .filter(|record| record.node == going.node)
        .map(|record| record.fence)
        .max();
    if run_ended(ended_fence, true, going) {
        return Some(false);
    }
    let lease = etcd::call(client.clone().lease_time_to_live(going.lease, None))
        .await
        .ok()?;
    Some(!run_ended(ended_fence, lease.ttl() > 0, going))
}

/// Asks the node of `going` to stop that run of `job`, on `lease` (the asker's: the request
/// goes with it).
pub(crate) async fn ask_to_stop(
    client: &Client,
    keys: &Keys,
    job: &str,
    going: &Going,
    lease: i64,
) -> Result<(), CoordError> {
    let key = keys.stop_request(&going.node, going.fence, job);
    let options = PutOptions::new().with_lease(lease);
    etcd::call(client.clone().put(key, "", Some(options))).await.map(drop)
}

/// Takes back the request to stop `going`.
pub(crate) async fn withdraw(client: &Client, keys: &Keys, job: &str, going: &Going) {
    let key = keys.stop_request(&going.node, going.fence, job);
    if let Err(err) = etcd::call(client.clone().delete(key, None)).await {
        tracing::debug!(error = %err, "cannot take back a stop request; it goes with the lease");
    }
}

/// The least pause before the requests are read and watched again after the watch ended.
const RETRY_EVERY: Duration = Duration::from_millis(500);

/// Hands each request to stop one of `node_id`'s runs to `stop` (job, fence), until `until`:
/// those in etcd when it starts, and each one put after. Lives as long as the node's runs, not
/// its sessions: a node that stops gracefully is asked while its runs go on.
pub(crate) async fn follow_stops(
    client: Client,
    keys: Keys,
    node_id: String,
    stop: impl Fn(&str, i64) + Send + Sync,
    until: CancellationToken,
) {
    let prefix = keys.stops_prefix(&node_id);
    let mut backoff = Backoff::coordination();
    loop {
        match follow_once(&client, &keys, &node_id, &prefix, &stop).await {
            Ok(()) => backoff = Backoff::coordination(),
            Err(err) => {
                tracing::debug!(error = %err, "cannot follow the requests to stop this node's runs; trying again")
            }
        }
        let pause = backoff.next_delay().max(RETRY_EVERY);
        if !sleep_or_cancel(pause, &until).await {
            return;
        }
    }
}

async fn follow_once(
    client: &Client,
    keys: &Keys,
    node_id: &str,
    prefix: &str,
    stop: &(impl Fn(&str, i64) + Send + Sync),
) -> Result<(), CoordError> {
    let read = etcd::call(
        client
            .clone()
            .get(prefix, Some(GetOptions::new().with_prefix().with_keys_only())),
    )
    .await?;
    let revision = read.header().map_or(0, |header| header.revision());
    for kv in read.kvs() {
        if let Some((fence, job)) = kv.key_str().ok().and_then(|key| keys.parse_stop_request(node_id, key)) {
            stop(job, fence);
        }
    }
    let options = WatchOptions::new().with_prefix().with_start_revision(revision + 1);
    let mut stream = etcd::call(client.clone().watch(prefix, Some(options))).await?;
    while let Some(response) = stream.message().await? {
        if etcd::compacted(&response, "stop requests")?.is_some() {
            return Ok(());
        }
        for event in response.events() {
            let Some(kv) = event.kv() else { continue };
            if event.event_type() != EventType::Put {
                continue;
            }
            if let Some((fence, job)) = kv.key_str().ok().and_then(|key| keys.parse_stop_request(node_id, key)) {
                stop(job, fence);
            }
        }
    }
    Ok(())
}
