//! The asker's side of a trigger: the request on a lease of its own, the wait for a leader to
//! take it, and the wait for the run's end.

use std::time::Duration;

use chrono::Utc;
use etcd_client::{Compare, CompareOp, EventType, PutOptions, Txn, TxnOp, WatchOptions};

use super::{Answer, RequestValue};
use crate::coord::etcd::{self, CoordError};
use crate::coord::keys::Keys;
use crate::rules::record::RunRecord;

/// A request a leader took: the run is claimed, with its fence. Its answer lives while this
/// does.
#[derive(Debug)]
pub struct Claimed {
    pub id: String,
    pub node: String,
    pub fence: i64,
    /// The revision from which the answer's later changes are watched.
    pub(super) revision: i64,
    pub(super) _lease: AskerLease,
}

/// The TTL of an asker's lease: how long a request and its answer outlive an asker that
/// vanished without a word (killed, or frozen).
const ASKER_TTL: Duration = Duration::from_secs(10);

/// The lease a request and its answer live on, renewed while this value lives and revoked when
/// it is dropped: an HTTP handler dropped because its client hung up takes both keys with it.
pub(super) struct AskerLease {
    client: etcd_client::Client,
    id: i64,
    renewing: tokio::task::JoinHandle<()>,
}

impl AskerLease {
    pub(super) async fn grant(client: &etcd_client::Client) -> Result<AskerLease, CoordError> {
        let granted = etcd::call(client.clone().lease_grant(ASKER_TTL.as_secs() as i64, None)).await?;
        Ok(AskerLease {
            client: client.clone(),
            id: granted.id(),
            renewing: tokio::spawn(renew(client.clone(), granted.id())),
        })
    }
}

impl std::fmt::Debug for AskerLease {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "AskerLease({:x})", self.id)
    }
}

impl Drop for AskerLease {
    fn drop(&mut self) {
        self.renewing.abort();
        // Without a runtime left (a command exiting) the lease lapses within its TTL instead.
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            let (client, id) = (self.client.clone(), self.id);
            runtime.spawn(async move {
                if let Err(err) = crate::coord::session::revoke(&client, id, ASKER_TTL).await {
                    tracing::debug!(lease = format!("{id:x}"), error = %err, "cannot revoke a trigger's lease; it lapses by itself");
                }
            });
        }
    }
}

/// Renews an asker's lease about every third of its TTL until aborted, reopening the stream
/// after a failure: the lease only has to outlive the asker, not to be exact.
async fn renew(client: etcd_client::Client, id: i64) {
    let every = ASKER_TTL / 3;
    let mut stream = None;
    loop {
        tokio::time::sleep(every).await;
        match etcd::within(every, crate::coord::session::renew_once(&client, id, &mut stream)).await {
            Ok(Some(response)) if response.ttl() > 0 => {}
            Ok(Some(_)) => {
                tracing::warn!(
                    lease = format!("{id:x}"),
                    "a trigger's lease expired while its asker waited"
                );
                return;
            }
            Ok(None) | Err(_) => stream = None,
        }
    }
}

/// How long `trigger --wait` still waits for a run's end after the node that claimed it left
/// the fleet: a node that stops cleanly finishes its runs and reports them after it left.
pub const AFTER_THE_NODE_LEFT: Duration = Duration::from_secs(60);

/// Asks for a run of `job` and waits up to `timeout` for a leader to take it. A request no
/// leader took in time is withdrawn (`None`): it is never served later.
pub async fn ask(
    client: &etcd_client::Client,
    keys: &Keys,
    job: &str,
    timeout: Duration,
) -> Result<Option<Claimed>, CoordError> {
    let id = format!("{:016x}", rand::random::<u64>());
    let request_key = keys.trigger(job, &id);
    let answer_key = keys.triggered(&id);
    let value = serde_json::to_vec(&RequestValue {
        requested_at: Utc::now(),
    })
    .map_err(|err| CoordError::Protocol(err.to_string()))?;
    let lease = AskerLease::grant(client).await?;
    let on_lease = PutOptions::new().with_lease(lease.id);
    let put = etcd::call(client.clone().put(request_key.as_str(), value, Some(on_lease))).await?;
    let asked = put.header().map_or(0, |header| header.revision());
    let mut answers = etcd::call(client.clone().watch(
        answer_key.as_str(),
        Some(WatchOptions::new().with_start_revision(asked + 1)),
    ))
    .await?;
    let deadline = tokio::time::Instant::now() + timeout.min(crate::rules::bounds::MAX_WAIT);
    loop {
        tokio::select! {
            message = answers.message() => {
                let Some(response) = message? else {
                    return Err(CoordError::Protocol("the watch of the answer ended".into()));
                };
                if let Some(from) = etcd::compacted(&response, "the answer")? {
                    // The answer may have come before the history etcd still holds.
                    let read = etcd::call(client.clone().get(answer_key.as_str(), None)).await?;
                    if let Some(kv) = read.kvs().first() {
                        let answer = decode(kv)?;
                        return Ok(Some(Claimed { id, node: answer.node, fence: kv.create_revision(), revision: kv.mod_revision(), _lease: lease }));
                    }
                    answers = etcd::call(client.clone().watch(
                        answer_key.as_str(),
                        Some(WatchOptions::new().with_start_revision(from)),
                    ))
                    .await?;
                    continue;
                }
                for event in response.events() {
                    let Some(kv) = event.kv() else { continue };
                    if event.event_type() != EventType::Put {
                        continue;
                    }
                    let answer = decode(kv)?;
                    return Ok(Some(Claimed { id, node: answer.node, fence: kv.create_revision(), revision: kv.mod_revision(), _lease: lease }));
                }
            }
            _ = tokio::time::sleep_until(deadline) => {
                let withdraw = Txn::new()
                    .when([Compare::version(request_key.as_str(), CompareOp::Greater, 0)])
                    .and_then([TxnOp::delete(request_key.as_str(), None)]);
                if etcd::call(client.clone().txn(withdraw)).await?.succeeded() {
                    return Ok(None);
                }
                // Taken just now: its answer is on its way through the watch.
            }
        }
    }
}

/// Waits for the end of the run `claimed`, and deletes its answer. `None` if the node that
/// claimed it left the fleet and did not report the end within [`AFTER_THE_NODE_LEFT`].
pub async fn wait_for_run(
    client: &etcd_client::Client,
    keys: &Keys,
    claimed: &Claimed,
) -> Result<Option<RunRecord>, CoordError> {
    let mut watched = Watched {
        answer_key: keys.triggered(&claimed.id),
        member_key: keys.node(&claimed.node),
        gave_up_at: None,
    };
    let mut from = claimed.revision;
    // Each pass watches from `from`; a pass whose revision etcd compacted away (a run that
    // outlived the history etcd keeps, or an operator's compaction) reads both keys again and
    // watches on from that read, instead of waiting on a watch etcd cancelled.
    let mut again = false;
    loop {
        let run = match watched.pass(client, from, std::mem::replace(&mut again, true)).await? {
            Pass::Ended(run) => Some(run),
            Pass::NodeGone => None,
            Pass::Compacted(read_from) => {
                from = read_from;
                continue;
            }
        };
        forget(client, keys, &claimed.id).await?;
        return Ok(run);
    }
}

/// The keys [`wait_for_run`] follows, and when it gives up on a node that left.
struct Watched {
    answer_key: String,
    member_key: String,
    gave_up_at: Option<tokio::time::Instant>,
}

/// How one pass of watching a claimed run ended.
enum Pass {
    Ended(RunRecord),
    NodeGone,
    /// etcd compacted the revision watched: watch again from this one.
    Compacted(i64),
}

impl Watched {
    /// Watches both keys from `from`; with `reread`, reads the answer first, which may have
    /// ended before the revisions the watch still sees.
    async fn pass(&mut self, client: &etcd_client::Client, from: i64, reread: bool) -> Result<Pass, CoordError> {
        let watch_from = Some(WatchOptions::new().with_start_revision(from));
        let mut answers = etcd::call(client.clone().watch(self.answer_key.as_str(), watch_from.clone())).await?;
        let mut members = etcd::call(client.clone().watch(self.member_key.as_str(), watch_from)).await?;
        let member = etcd::call(client.clone().get(self.member_key.as_str(), None)).await?;
        if member.kvs().is_empty() {
            self.gave_up_at
                .get_or_insert_with(|| tokio::time::Instant::now() + AFTER_THE_NODE_LEFT);
        } else {
            self.gave_up_at = None;
        }
        if reread {
            let answer = etcd::call(client.clone().get(self.answer_key.as_str(), None)).await?;
            for kv in answer.kvs() {
                if let Some(run) = decode(kv)?.run {
                    return Ok(Pass::Ended(run));
                }
            }
        }
        loop {
            let give_up = async {
                match self.gave_up_at {
                    Some(at) => tokio::time::sleep_until(at).await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                message = answers.message() => {
                    let Some(response) = message? else {
                        return Err(CoordError::Protocol("the watch of the answer ended".into()));
                    };
                    if let Some(read_from) = etcd::compacted(&response, "the answer")? {
                        return Ok(Pass::Compacted(read_from));
                    }
                    for event in response.events() {
                        let Some(kv) = event.kv().filter(|_| event.event_type() == EventType::Put) else { continue };
                        if let Some(run) = decode(kv)?.run {
                            return Ok(Pass::Ended(run));
                        }
                    }
                }
                message = members.message() => {
                    let Some(response) = message? else {
                        return Err(CoordError::Protocol("the watch of the node ended".into()));
                    };
                    if let Some(read_from) = etcd::compacted(&response, "the node")? {
                        return Ok(Pass::Compacted(read_from));
                    }
                    for event in response.events() {
                        self.gave_up_at = match event.event_type() {
                            EventType::Delete => Some(tokio::time::Instant::now() + AFTER_THE_NODE_LEFT),
                            EventType::Put => None,
                        };
                    }
                }
                _ = give_up => return Ok(Pass::NodeGone),
            }
        }
    }
}

fn decode(kv: &etcd_client::KeyValue) -> Result<Answer, CoordError> {
    serde_json::from_slice(kv.value()).map_err(|err| CoordError::Protocol(err.to_string()))
}

/// Deletes the answer to a request: nobody waits for it any more.
pub async fn forget(client: &etcd_client::Client, keys: &Keys, id: &str) -> Result<(), CoordError> {
    etcd::call(client.clone().delete(keys.triggered(id), None)).await?;
    Ok(())
}
