//! Runs asked for by hand (`shardcron trigger`), through etcd.
//!
//! ```text
//! /shardcron/<cluster>/triggers/<job>/<id>   a request, until a leader takes it or it is withdrawn
//! /shardcron/<cluster>/triggered/<id>        the answer: who claimed it, and then how the run ended
//! ```
//! Every node mirrors the requests; the leader of the job's shard takes one between instants
//! with a transaction guarded by its leadership and by the request still being there, which
//! deletes the request and creates the answer. So a request is served at most once, and a
//! request the command withdrew after its `--timeout` is never served. The answer's create
//! revision is the run's fence, from the same revision sequence as every scheduled claim. The
//! run goes through the job's `overlap` policy and its pause like a tick of its schedule, and it
//! leaves the schedule's record alone: the schedule does not move.
//!
//! The request and its answer live on a lease of the one who asked, kept alive only while it
//! waits: a `trigger` command killed or an API client that hangs up leaves no key behind, and a
//! request nobody waits for any more is never served.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use chrono::{DateTime, Utc};
use etcd_client::{Compare, CompareOp, EventType, PutOptions, Txn, TxnOp, TxnOpResponse, WatchOptions};
use serde::{Deserialize, Serialize};
use tokio::sync::watch;

use crate::election::Leadership;
use crate::etcd::{self, CoordError};
use crate::keys::Keys;
use crate::mirror::{Mirror, Put};
use crate::record::RunRecord;
use crate::session::Session;

/// The value of a request.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RequestValue {
    pub requested_at: DateTime<Utc>,
}

/// A request a node knows of.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Request {
    pub(crate) job: String,
    pub(crate) id: String,
    pub(crate) requested_at: DateTime<Utc>,
    /// The asker's lease the request lives on, which its answer is put on too; 0 for none.
    pub(crate) lease: i64,
}

/// The value of an answer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Answer {
    pub job: String,
    pub node: String,
    /// The term of the leadership that claimed the run.
    pub term: i64,
    pub requested_at: DateTime<Utc>,
    /// How the run ended, once it has.
    #[serde(default)]
    pub run: Option<RunRecord>,
}

/// The requests this node knows of, and a signal for the terms that serve them.
#[derive(Debug)]
pub(crate) struct Triggers {
    requests: Mutex<HashMap<String, Request>>,
    arrived: watch::Sender<u64>,
}

impl Default for Triggers {
    fn default() -> Triggers {
        Triggers {
            requests: Mutex::default(),
            arrived: watch::channel(0).0,
        }
    }
}

impl Triggers {
    /// Changes when requests arrive; marked changed at once, for the requests already there.
    pub(crate) fn subscribe(&self) -> watch::Receiver<u64> {
        let mut receiver = self.arrived.subscribe();
        receiver.mark_changed();
        receiver
    }

    /// Takes the requests for the jobs `leads` says this term leads, oldest first.
    pub(crate) fn take_for(&self, leads: impl Fn(&str) -> bool) -> Vec<Request> {
        let mut requests = self.requests.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        let ids: Vec<String> = requests
            .iter()
            .filter(|(_, request)| leads(&request.job))
            .map(|(id, _)| id.clone())
            .collect();
        let mut taken: Vec<Request> = ids.iter().filter_map(|id| requests.remove(id)).collect();
        taken.sort_by_key(|request| request.requested_at);
        taken
    }

    /// Returns requests a term took and did not settle: they are still in etcd.
    pub(crate) fn put_back(&self, requests: impl IntoIterator<Item = Request>) {
        let mut held = self.requests.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        for request in requests {
            held.entry(request.id.clone()).or_insert(request);
        }
    }
}

impl Mirror for Triggers {
    const WHAT: &'static str = "run requests";

    fn prefix(keys: &Keys) -> String {
        keys.triggers_prefix()
    }

    fn clear(&self) {
        self.requests
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .clear();
    }

    fn apply(&self, keys: &Keys, key: &[u8], put: Option<Put>) {
        let Some((job, id)) = std::str::from_utf8(key).ok().and_then(|key| keys.parse_trigger(key)) else {
            return;
        };
        let mut requests = self.requests.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        match put.map(|put| (serde_json::from_slice::<RequestValue>(put.value), put.lease)) {
            Some((Ok(request), lease)) => {
                tracing::info!(job, request = id, "a run was asked for by hand");
                requests.insert(
                    id.to_string(),
                    Request {
                        job: job.to_string(),
                        id: id.to_string(),
                        requested_at: request.requested_at,
                        lease,
                    },
                );
                drop(requests);
                self.arrived.send_modify(|count| *count += 1);
            }
            Some((Err(err), _)) => {
                tracing::warn!(job, request = id, error = %err, "unreadable run request; ignoring it")
            }
            None => {
                requests.remove(id);
            }
        }
    }
}

/// Who took the last run of a job asked for by hand, written with the answer in the claim.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct TakenBy {
    id: String,
    node: String,
    term: i64,
}

/// How a claim of a request ended.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Taken {
    /// This leadership claimed it: the run's fence.
    Ours(i64),
    /// It is gone: withdrawn, or served by another leader.
    Gone,
    /// The leadership guard failed: another candidate leads.
    Deposed,
}

/// Claims `request` for `leadership` on `node`: deletes it and creates its answer on the
/// request's lease, if it is still there on that lease and the leadership still holds.
pub(crate) async fn claim(
    session: &Session,
    keys: &Keys,
    leadership: &Leadership,
    node: &str,
    request: &Request,
) -> Result<Taken, CoordError> {
    let request_key = keys.trigger(&request.job, &request.id);
    let answer_key = keys.triggered(&request.id);
    let answer = Answer {
        job: request.job.clone(),
        node: node.to_string(),
        term: leadership.term,
        requested_at: request.requested_at,
        run: None,
    };
    let value = serde_json::to_vec(&answer).map_err(|err| CoordError::Protocol(err.to_string()))?;
    let taken_by = TakenBy {
        id: request.id.clone(),
        node: node.to_string(),
        term: leadership.term,
    };
    let marker_key = keys.job_manual(&request.job);
    let marker = serde_json::to_vec(&taken_by).map_err(|err| CoordError::Protocol(err.to_string()))?;
    // The answer may be gone at once (a command that does not wait deletes it): the marker,
    // which no asker touches, is what says a claim whose reply was lost was this one's.
    let ours = |read: &etcd_client::GetResponse| -> Option<i64> {
        let kv = read.kvs().first()?;
        let held: TakenBy = serde_json::from_slice(kv.value()).ok()?;
        (held == taken_by).then(|| kv.mod_revision())
    };
    let on_lease = (request.lease != 0).then(|| PutOptions::new().with_lease(request.lease));
    let txn = Txn::new()
        .when([
            leadership.guard(),
            Compare::version(request_key.as_str(), CompareOp::Greater, 0),
            Compare::lease(request_key.as_str(), CompareOp::Equal, request.lease),
        ])
        .and_then([
            TxnOp::delete(request_key.as_str(), None),
            TxnOp::put(answer_key.as_str(), value, on_lease),
            TxnOp::put(marker_key.as_str(), marker, None),
        ])
        .or_else([
            TxnOp::get(request_key.as_str(), None),
            TxnOp::get(marker_key.as_str(), None),
        ]);
    match etcd::call(session.client().txn(txn)).await {
        Ok(response) if response.succeeded() => {
            Ok(Taken::Ours(response.header().map_or(0, |header| header.revision())))
        }
        Ok(response) => {
            let answers = response.op_responses();
            let (Some(TxnOpResponse::Get(request_read)), Some(TxnOpResponse::Get(marker_read))) =
                (answers.first(), answers.get(1))
            else {
                return Err(CoordError::Protocol(
                    "txn of a request's claim answered with other ops".into(),
                ));
            };
            // Put again on another lease, it is a new request that the mirror brings back.
            if request_read.kvs().iter().any(|kv| kv.lease() == request.lease) {
                return Ok(Taken::Deposed);
            }
            // Gone because an earlier try of this claim took it, its reply lost.
            Ok(ours(marker_read).map_or(Taken::Gone, Taken::Ours))
        }
        Err(err) => {
            // The outcome is unknown: the marker says whether this leadership's write landed;
            // if not, the next try's transaction finds out.
            let read = etcd::call(session.client().get(marker_key.as_str(), None)).await?;
            ours(&read).map(Taken::Ours).ok_or(err)
        }
    }
}

/// Records how a requested run ended in its answer, if the command still waits for it (it
/// deletes the answer once it has what it wanted).
pub(crate) async fn answer(
    client: &etcd_client::Client,
    keys: &Keys,
    id: &str,
    run: &RunRecord,
) -> Result<(), CoordError> {
    let key = keys.triggered(id);
    let read = etcd::call(client.clone().get(key.as_str(), None)).await?;
    let Some(kv) = read.kvs().first() else { return Ok(()) };
    let Ok(mut answer) = serde_json::from_slice::<Answer>(kv.value()) else {
        return Ok(());
    };
    answer.run = Some(run.clone());
    let value = serde_json::to_vec(&answer).map_err(|err| CoordError::Protocol(err.to_string()))?;
    // On the lease it has: the answer goes when the asker does.
    let on_lease = (kv.lease() != 0).then(|| PutOptions::new().with_lease(kv.lease()));
    let txn = Txn::new()
        .when([Compare::mod_revision(key.as_str(), CompareOp::Equal, kv.mod_revision())])
        .and_then([TxnOp::put(key.as_str(), value, on_lease)]);
    etcd::call(client.clone().txn(txn)).await?;
    Ok(())
}

/// A request a leader took: the run is claimed, with its fence. Its answer lives while this
/// does.
#[derive(Debug)]
pub struct Claimed {
    pub id: String,
    pub node: String,
    pub fence: i64,
    /// The revision from which the answer's later changes are watched.
    revision: i64,
    _lease: AskerLease,
}

/// The TTL of an asker's lease: how long a request and its answer outlive an asker that
/// vanished without a word (killed, or frozen).
const ASKER_TTL: Duration = Duration::from_secs(10);

/// The lease a request and its answer live on, renewed while this value lives and revoked when
/// it is dropped: an HTTP handler dropped because its client hung up takes both keys with it.
struct AskerLease {
    client: etcd_client::Client,
    id: i64,
    renewing: tokio::task::JoinHandle<()>,
}

impl AskerLease {
    async fn grant(client: &etcd_client::Client) -> Result<AskerLease, CoordError> {
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
                if let Err(err) = crate::session::revoke(&client, id, ASKER_TTL).await {
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
        match etcd::within(every, crate::session::renew_once(&client, id, &mut stream)).await {
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
    let deadline = tokio::time::Instant::now() + timeout.min(crate::bounds::MAX_WAIT);
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
                        let answer: Answer = serde_json::from_slice(kv.value()).map_err(|err| CoordError::Protocol(err.to_string()))?;
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
                    let answer: Answer = serde_json::from_slice(kv.value()).map_err(|err| CoordError::Protocol(err.to_string()))?;
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
    let answer_key = keys.triggered(&claimed.id);
    let member_key = keys.node(&claimed.node);
    let mut from = claimed.revision;
    let mut gave_up_at: Option<tokio::time::Instant> = None;
    // Each pass watches from `from`; a pass whose revision etcd compacted away (a run that
    // outlived the history etcd keeps, or an operator's compaction) reads both keys again and
    // watches on from that read, instead of waiting on a watch etcd cancelled.
    let mut again = false;
    loop {
        let mut answers = etcd::call(
            client
                .clone()
                .watch(answer_key.as_str(), Some(WatchOptions::new().with_start_revision(from))),
        )
        .await?;
        let mut members = etcd::call(
            client
                .clone()
                .watch(member_key.as_str(), Some(WatchOptions::new().with_start_revision(from))),
        )
        .await?;
        let member = etcd::call(client.clone().get(member_key.as_str(), None)).await?;
        if member.kvs().is_empty() {
            gave_up_at.get_or_insert_with(|| tokio::time::Instant::now() + AFTER_THE_NODE_LEFT);
        } else {
            gave_up_at = None;
        }
        if std::mem::replace(&mut again, true) {
            let answer = etcd::call(client.clone().get(answer_key.as_str(), None)).await?;
            for kv in answer.kvs() {
                let answer: Answer =
                    serde_json::from_slice(kv.value()).map_err(|err| CoordError::Protocol(err.to_string()))?;
                if let Some(run) = answer.run {
                    forget(client, keys, &claimed.id).await?;
                    return Ok(Some(run));
                }
            }
        }
        loop {
            let give_up = async {
                match gave_up_at {
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
                        from = read_from;
                        break;
                    }
                    for event in response.events() {
                        let Some(kv) = event.kv().filter(|_| event.event_type() == EventType::Put) else { continue };
                        let answer: Answer = serde_json::from_slice(kv.value()).map_err(|err| CoordError::Protocol(err.to_string()))?;
                        if let Some(run) = answer.run {
                            forget(client, keys, &claimed.id).await?;
                            return Ok(Some(run));
                        }
                    }
                }
                message = members.message() => {
                    let Some(response) = message? else {
                        return Err(CoordError::Protocol("the watch of the node ended".into()));
                    };
                    if let Some(read_from) = etcd::compacted(&response, "the node")? {
                        from = read_from;
                        break;
                    }
                    for event in response.events() {
                        gave_up_at = match event.event_type() {
                            EventType::Delete => Some(tokio::time::Instant::now() + AFTER_THE_NODE_LEFT),
                            EventType::Put => None,
                        };
                    }
                }
                _ = give_up => {
                    forget(client, keys, &claimed.id).await?;
                    return Ok(None);
                }
            }
        }
    }
}

/// Deletes the answer to a request: nobody waits for it any more.
pub async fn forget(client: &etcd_client::Client, keys: &Keys, id: &str) -> Result<(), CoordError> {
    etcd::call(client.clone().delete(keys.triggered(id), None)).await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_wait_from_a_revision_etcd_compacted_reads_the_answer_again() {
        let etcd = crate::etcd_server::EtcdServer::start(&crate::etcd_server::test_etcd_bin()).expect("etcd");
        let client = etcd_client::Client::connect([etcd.client_url()], None)
            .await
            .expect("client");
        let keys = Keys::new("c");
        client.clone().put(keys.node("n"), "{}", None).await.expect("member");
        let mut answer = Answer {
            job: "j".into(),
            node: "n".into(),
            term: 1,
            requested_at: Utc::now(),
            run: None,
        };
        let value = |answer: &Answer| serde_json::to_vec(answer).expect("answer");
        let taken = client
            .clone()
            .put(keys.triggered("r"), value(&answer), None)
            .await
            .expect("taken");
        let revision = taken.header().expect("header").revision();
        // The run ends, and etcd's history is compacted past the revision the wait starts from.
        let record = RunRecord::for_tests(DateTime::<Utc>::from_timestamp(1_800_000_000, 0).unwrap(), revision);
        answer.run = Some(record.clone());
        let ended = client
            .clone()
            .put(keys.triggered("r"), value(&answer), None)
            .await
            .expect("ended");
        client
            .clone()
            .compact(ended.header().expect("header").revision(), None)
            .await
            .expect("compact");
        let claimed = Claimed {
            id: "r".into(),
            node: "n".into(),
            fence: revision,
            revision,
            _lease: AskerLease::grant(&client).await.expect("lease"),
        };
        let run = tokio::time::timeout(Duration::from_secs(20), wait_for_run(&client, &keys, &claimed))
            .await
            .expect("the wait ends: etcd cancelled its watch, and it read the answer again")
            .expect("the wait");
        assert_eq!(run, Some(record));
    }

    #[test]
    fn a_term_takes_the_requests_of_its_jobs_oldest_first_and_once() {
        let keys = Keys::new("c");
        let triggers = Triggers::default();
        let mut arrived = triggers.subscribe();
        assert!(
            arrived.has_changed().unwrap(),
            "a new term looks at the requests already there"
        );
        let at = |second: i64| DateTime::<Utc>::from_timestamp(1_800_000_000 + second, 0).unwrap();
        for (job, id, second) in [("a", "r2", 2), ("a", "r1", 1), ("b", "r3", 0)] {
            let value = serde_json::to_vec(&RequestValue {
                requested_at: at(second),
            })
            .unwrap();
            let put = Put {
                value: &value,
                lease: 0,
            };
            triggers.apply(&keys, keys.trigger(job, id).as_bytes(), Some(put));
        }
        arrived.mark_unchanged();
        triggers.apply(&keys, keys.trigger("a", "r9").as_bytes(), None);
        let taken: Vec<String> = triggers
            .take_for(|job| job == "a")
            .into_iter()
            .map(|request| request.id)
            .collect();
        assert_eq!(taken, ["r1", "r2"]);
        assert!(triggers.take_for(|job| job == "a").is_empty());
        // A term that ends before settling what it took gives it back for the next one.
        let given_back = triggers.take_for(|job| job == "b");
        triggers.put_back(given_back);
        assert_eq!(triggers.take_for(|job| job == "b").len(), 1);
        triggers.put_back(Vec::new());
        triggers.apply(&keys, keys.trigger("b", "r3").as_bytes(), None);
        assert!(
            triggers.take_for(|_| true).is_empty(),
            "a withdrawn request is forgotten"
        );
    }
}

#[cfg(test)]
mod claim_tests {
    use std::path::Path;

    use tokio_util::sync::CancellationToken;

    use super::*;
    use crate::etcd_server::EtcdServer;

    /// The claim of a request committed but its reply was lost, and the command that did not
    /// wait deleted the answer at once: the leader's next try finds the request gone, and the
    /// job's marker says the claim was its own, with the same fence.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_claim_tried_again_after_its_reply_was_lost_is_still_ours() {
        let etcd = EtcdServer::start(Path::new("etcd")).expect("etcd");
        let client = etcd_client::Client::connect([etcd.client_url()], None)
            .await
            .expect("client");
        let keys = Keys::new("lost-reply");
        let session = Session::open(&client, Duration::from_secs(5), &CancellationToken::new())
            .await
            .expect("session");
        let key = keys.candidate(1, 0, session.lease());
        let term = crate::election::enter(&session, &key, "a").await.expect("enter");
        let leadership = Leadership {
            shard: 0,
            shards: 1,
            prefix: keys.election_prefix(1, 0),
            key,
            term,
        };
        let value = serde_json::to_vec(&RequestValue {
            requested_at: Utc::now(),
        })
        .expect("value");
        client
            .clone()
            .put(keys.trigger("once", "r1"), value, None)
            .await
            .expect("request");
        let request = Request {
            job: "once".into(),
            id: "r1".into(),
            requested_at: Utc::now(),
            lease: 0,
        };

        let first = claim(&session, &keys, &leadership, "a", &request).await.expect("claim");
        let Taken::Ours(run_fence) = first else {
            panic!("the first claim takes the request: {first:?}");
        };
        forget(&client, &keys, "r1")
            .await
            .expect("the command deletes the answer");
        let again = claim(&session, &keys, &leadership, "a", &request)
            .await
            .expect("claim again");
        assert_eq!(again, Taken::Ours(run_fence), "the lost claim is found to be ours");

        let other = Leadership {
            term: term + 1_000,
            ..leadership.clone()
        };
        let by_another = claim(&session, &keys, &other, "a", &request).await.expect("claim");
        assert_eq!(by_another, Taken::Gone, "the claim is not another term's");
        session.close().await;
    }
}
