//! Runs of a job going on other nodes, as etcd shows them, and asking their nodes about them:
//! is the run still going, and (`overlap = "replace"`) stop it. And a node's side of those asks.
//!
//! A leader of an `overlap = "skip"` or `"replace"` job lists its run going on in the job's
//! record ([`Going`], riding its claims), on the lease its node keeps while its runs go on.
//! What another leader makes of such a listing is [`crate::rules::protocol::elsewhere`]'s:
//! this module reads what it needs (the run's own records of its end, its lease, its node's
//! answer) and carries the asks. Reads only for a job whose record lists no other node's run;
//! an ask is a write of the asker's and one of the answering node's, made only while a tick
//! waits beside a listed run that etcd does not show ended.

use std::time::Duration;

use etcd_client::{Client, EventType, GetOptions, KeyValue, PutOptions, Txn, TxnOp, TxnOpResponse, WatchOptions};
use tokio_util::sync::CancellationToken;

use crate::backoff::{sleep_or_cancel, Backoff};
use crate::coord::etcd::{self, CoordError};
use crate::coord::history;
use crate::coord::keys::{Ask, Keys};
use crate::rules::protocol::elsewhere::{self, Answer, ClaimedTick, Shown};
use crate::rules::record::{Claim, Going, RunRecord, Trigger};

/// What an ask for an answer holds until the node answers.
const QUESTION: &str = "?";

/// What etcd shows of the run `going` of `job` on another node; `None` when etcd does not
/// answer.
pub(crate) async fn look(client: &Client, keys: &Keys, job: &str, going: &Going) -> Option<Shown> {
    // The listed run is a tick of the schedule, a manual run or a backfill's tick: any of their
    // entries may end it.
    let reads = [
        TxnOp::get(history::key_of(keys, job, going.tick, Trigger::Schedule), None),
        TxnOp::get(history::key_of(keys, job, going.tick, Trigger::Manual), None),
        TxnOp::get(history::key_of(keys, job, going.tick, Trigger::Backfill), None),
        TxnOp::get(keys.job_result(job), None),
        TxnOp::get(keys.ask(&going.node, going.fence, Ask::Going, job), None),
    ];
    let read = etcd::call(client.clone().txn(Txn::new().and_then(reads))).await.ok()?;
    let values: Vec<Option<Vec<u8>>> = read
        .op_responses()
        .into_iter()
        .map(|answer| match answer {
            TxnOpResponse::Get(got) => got.kvs().first().map(|kv| kv.value().to_vec()),
            _ => None,
        })
        .collect();
    let [entry, manual, backfilled, result, answer] = <[Option<Vec<u8>>; 5]>::try_from(values).ok()?;
    // Its own history entry, or the job's result if it is that run's: the same node, tick and
    // fence. Not any record of its node with a fence as high: a later run of that node that
    // never started (a manual run recorded lost), or a successor's record of a tick this node
    // claimed and never started, says nothing of this run.
    let end_recorded = [entry, manual, backfilled, result]
        .into_iter()
        .flatten()
        .filter_map(|value| serde_json::from_slice::<RunRecord>(&value).ok())
        .any(|record| record.node == going.node && record.fence == going.fence && record.scheduled_at == going.tick);
    let answer = answer.as_deref().and_then(Answer::parse);
    let known_ended = end_recorded || answer == Some(Answer::Ended);
    // Its lease is read only while the records leave the run's end open: one round trip, not two.
    let lease_held = known_ended || !etcd::lease_gone(client, going.lease).await.ok()?;
    Some(Shown {
        end_recorded,
        lease_held,
        answer,
    })
}

/// What etcd shows now of a tick another leadership claimed.
pub(crate) enum ClaimShown {
    /// The job's record still lists it pending: its leader has not written since.
    Pending,
    /// Started or settled since: the runs of that tick the record lists as going.
    Settled(Vec<Going>),
}

/// What etcd shows of `claimed`, a tick of `job` another leadership claimed; `None` when etcd
/// does not answer or the record cannot be read.
pub(crate) async fn look_claimed(client: &Client, keys: &Keys, job: &str, claimed: &ClaimedTick) -> Option<ClaimShown> {
    let read = etcd::call(client.clone().get(keys.job_last(job), None)).await.ok()?;
    let Some(kv) = read.kvs().first() else {
        return Some(ClaimShown::Settled(Vec::new()));
    };
    let record: Claim = serde_json::from_slice(kv.value()).ok()?;
    if elsewhere::still_claimed(&record, claimed) {
        return Some(ClaimShown::Pending);
    }
    let runs = record
        .going
        .into_iter()
        .filter(|run| run.tick == claimed.tick)
        .collect();
    Some(ClaimShown::Settled(runs))
}

/// Asks the node of `going` about that run of `job` (`ask`), on `lease` (the asker's: the ask
/// goes with it). Asking whether it goes again clears the node's last answer.
pub(crate) async fn ask(
    client: &Client,
    keys: &Keys,
    job: &str,
    going: &Going,
    ask: Ask,
    lease: i64,
) -> Result<(), CoordError> {
    let key = keys.ask(&going.node, going.fence, ask, job);
    let value = if ask == Ask::Going { QUESTION } else { "" };
    let options = PutOptions::new().with_lease(lease);
    etcd::call(client.clone().put(key, value, Some(options)))
        .await
        .map(drop)
}

/// How many times a withdrawal of asks is tried before it is given up on.
const WITHDRAW_TRIES: usize = 6;

/// Takes back every ask about `going`, trying again while etcd refuses (about 20 s in all):
/// the asks live on the asker's slot lease, which lasts as long as the asker's node, so one
/// left behind stays until that node stops.
pub(crate) async fn withdraw(client: &Client, keys: &Keys, job: &str, going: &Going) {
    let mut backoff = Backoff::coordination();
    for _ in 0..WITHDRAW_TRIES {
        let deletes =
            [Ask::Stop, Ask::Going].map(|ask| TxnOp::delete(keys.ask(&going.node, going.fence, ask, job), None));
        match etcd::call(client.clone().txn(Txn::new().and_then(deletes))).await {
            Ok(_) => return,
            Err(err) => {
                tracing::debug!(error = %err, "cannot take back the asks about another node's run; trying again")
            }
        }
        tokio::time::sleep(backoff.next_delay()).await;
    }
    tracing::warn!(job, node = %going.node, fence = going.fence, "gave up taking back the asks about another node's run: they stay until this node stops");
}

/// This node's runs, as the asks of other nodes' leaders reach them.
pub(crate) trait RunsHere: Send + Sync + 'static {
    /// Stops the run of `job` with `fence`, if it still goes.
    fn stop(&self, job: &str, fence: i64);
    /// How long the run of `job` with `fence` has gone on; `None` once it ended.
    fn age(&self, job: &str, fence: i64) -> Option<Duration>;
}

/// The least pause before the requests are read and watched again after the watch ended.
const RETRY_EVERY: Duration = Duration::from_millis(500);

/// Serves each ask about one of `node_id`'s runs from `here`, until `until`: those in etcd when
/// it starts, and each one put after. Lives as long as the node's runs, not its sessions: a
/// node that stops gracefully is asked while its runs go on.
pub(crate) async fn follow_asks(
    client: Client,
    keys: Keys,
    node_id: String,
    here: impl RunsHere,
    until: CancellationToken,
) {
    let prefix = keys.asks_prefix(&node_id);
    let mut backoff = Backoff::coordination();
    loop {
        match follow_once(&client, &keys, &node_id, &prefix, &here).await {
            Ok(()) => backoff = Backoff::coordination(),
            Err(err) => {
                tracing::debug!(error = %err, "cannot follow the asks about this node's runs; trying again")
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
    here: &impl RunsHere,
) -> Result<(), CoordError> {
    let read = etcd::call(client.clone().get(prefix, Some(GetOptions::new().with_prefix()))).await?;
    let revision = read.header().map_or(0, |header| header.revision());
    for kv in read.kvs() {
        serve(client, keys, node_id, kv, here).await;
    }
    let options = WatchOptions::new().with_prefix().with_start_revision(revision + 1);
    let mut stream = etcd::call(client.clone().watch(prefix, Some(options))).await?;
    while let Some(response) = stream.message().await? {
        if etcd::compacted(&response, "asks about this node's runs")?.is_some() {
            return Ok(());
        }
        for event in response.events() {
            if event.event_type() != EventType::Put {
                continue;
            }
            if let Some(kv) = event.kv() {
                serve(client, keys, node_id, kv, here).await;
            }
        }
    }
    Ok(())
}

/// Serves one ask: stops the run, or answers whether it goes into the ask's own key, keeping
/// the asker's lease on it. The node's own answers come back as puts too; they ask nothing.
async fn serve(client: &Client, keys: &Keys, node_id: &str, kv: &KeyValue, here: &impl RunsHere) {
    let Some((fence, ask, job)) = kv.key_str().ok().and_then(|key| keys.parse_ask(node_id, key)) else {
        return;
    };
    match ask {
        Ask::Stop => here.stop(job, fence),
        Ask::Going if kv.value() == QUESTION.as_bytes() => {
            let answer = here.age(job, fence).map_or(Answer::Ended, |age| Answer::Going { age });
            let options = PutOptions::new().with_ignore_lease();
            let mut client = client.clone();
            match etcd::call(client.put(kv.key(), answer.to_value(), Some(options))).await {
                Ok(_) => {
                    tracing::debug!(job, fence, answer = %answer.to_value(), "answered a leader asking whether this run goes")
                }
                // Taken back meanwhile, or etcd out of reach: the asker asks again or reads the run's end.
                Err(err) => {
                    tracing::debug!(job, fence, error = %err, "cannot answer a leader asking whether this run goes")
                }
            }
        }
        Ask::Going => {}
    }
}
