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

use chrono::{DateTime, Utc};
use etcd_client::{Compare, CompareOp, PutOptions, Txn, TxnOp, TxnOpResponse};
use serde::{Deserialize, Serialize};
use tokio::sync::watch;

use crate::coord::election::Leadership;
use crate::coord::etcd::{self, CoordError};
use crate::coord::keys::Keys;
use crate::coord::mirror::{Mirror, Put};
use crate::coord::session::Session;
use crate::rules::record::RunRecord;

mod ask;
mod each;
pub use ask::{ask, forget, wait_for_run, Claimed, AFTER_THE_NODE_LEFT};
pub use each::ask_each;

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

#[cfg(test)]
mod tests;
