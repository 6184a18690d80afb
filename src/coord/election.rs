//! One leader election per shard, in the shape of etcd's Go `concurrency` package.
//!
//! Each candidate puts `<prefix><lease-hex>` on its session's lease; the candidate whose key has
//! the lowest create revision leads. A node enters all its shards' elections in a few batched
//! transactions and learns that it leads from the fleet view, one watch of every election key,
//! rather than a watch per shard: a fleet of thousands of shards costs etcd a few requests per
//! node. The term is the leader key's create revision: etcd revisions only grow, so a later
//! leader always has a larger one.

use std::future::Future;

use etcd_client::{
    Compare, CompareOp, GetOptions, LeaseTimeToLiveOptions, PutOptions, SortOrder, SortTarget, Txn, TxnOp,
    TxnOpResponse, TxnResponse,
};
use tokio::sync::{watch, Semaphore};

use crate::backoff::Pushback;
use crate::coord::etcd::ops_per_txn;
use crate::coord::etcd::{self, CoordError};
use crate::coord::keys::{ElectionKeys, Keys};
use crate::coord::session::Session;
use crate::coord::view::{Candidate, FleetView};
use crate::repeats;

/// This node leads a shard. Everything the term writes is guarded by `term`.
#[derive(Debug, Clone)]
pub struct Leadership {
    /// The election's number among the config's (see [`crate::rules::pools`]).
    pub shard: u32,
    /// The shard count of this election's family.
    pub shards: u32,
    /// The pool of this election (`@<node>` for the node's own); `None` for the fleet's.
    pub pool: Option<String>,
    /// The shard's election prefix, under which every candidate key of the shard lives.
    pub prefix: String,
    /// This node's candidate key, now the leader key.
    pub key: String,
    /// The leader key's create revision: the leadership's term (`CRON_TERM`), which every
    /// claim of the leadership checks. (A claim's own revision is the run's fence.)
    pub term: i64,
}

impl Leadership {
    /// The compare every leader write carries: the leader key still exists with this term.
    pub fn guard(&self) -> Compare {
        Compare::create_revision(self.key.as_str(), CompareOp::Equal, self.term)
    }
}

/// The transaction that enters one candidate key: put it on the session's lease unless it
/// exists (from an earlier campaign of this session), else read it.
fn entry(session: &Session, key: &str, node_id: &str) -> Txn {
    Txn::new()
        .when([Compare::create_revision(key, CompareOp::Equal, 0)])
        .and_then([TxnOp::put(
            key,
            node_id,
            Some(PutOptions::new().with_lease(session.lease())),
        )])
        .or_else([TxnOp::get(key, None)])
}

/// The create revision of the key an [`entry`] put, in a transaction committed at `revision`, or
/// found.
fn entered_at(response: &TxnResponse, revision: i64) -> Result<i64, CoordError> {
    if response.succeeded() {
        return Ok(revision);
    }
    match response.op_responses().into_iter().next() {
        Some(TxnOpResponse::Get(get)) => get
            .kvs()
            .first()
            .map(|kv| kv.create_revision())
            .ok_or_else(|| CoordError::Protocol("a candidate key vanished during the campaign".into())),
        _ => Err(CoordError::Protocol("txn response without the get".into())),
    }
}

fn header_revision(response: &TxnResponse) -> Result<i64, CoordError> {
    response
        .header()
        .map(|header| header.revision())
        .ok_or_else(|| CoordError::Protocol("txn response without a header".into()))
}

/// Puts this node's candidate key (or finds it from an earlier campaign) and returns its create
/// revision.
pub async fn enter(session: &Session, key: &str, node_id: &str) -> Result<i64, CoordError> {
    let response = etcd::call(session.client().txn(entry(session, key, node_id))).await?;
    entered_at(&response, header_revision(&response)?)
}

/// Enters this node's candidate keys in the elections of `list` in as few transactions as
/// etcd's operation limit allows, and returns their candidacies in `list`'s order. A node of
/// 4,096 shards enters them all in 41 requests rather than 4,096, which one etcd would answer
/// with "too many requests".
pub(crate) async fn enter_all(
    session: &Session,
    keys: &ElectionKeys,
    list: &[u32],
    node_id: &str,
) -> Result<Vec<Leadership>, CoordError> {
    let mut candidacies = Vec::with_capacity(list.len());
    for chunk in list.chunks(ops_per_txn()) {
        let entries: Vec<TxnOp> = chunk
            .iter()
            .map(|shard| {
                Ok(TxnOp::txn(entry(
                    session,
                    &candidate_key(session, keys, *shard)?,
                    node_id,
                )))
            })
            .collect::<Result<_, CoordError>>()?;
        let response = etcd::call(session.client().txn(Txn::new().and_then(entries))).await?;
        let revision = header_revision(&response)?;
        let answers = response.op_responses();
        if answers.len() != chunk.len() {
            return Err(CoordError::Protocol("txn of entries answered with fewer ops".into()));
        }
        for (shard, answer) in chunk.iter().zip(answers) {
            let TxnOpResponse::Txn(nested) = answer else {
                return Err(CoordError::Protocol("txn of entries answered with another op".into()));
            };
            candidacies.push(candidacy(session, keys, *shard, entered_at(&nested, revision)?)?);
        }
    }
    Ok(candidacies)
}

fn candidate_key(session: &Session, keys: &ElectionKeys, shard: u32) -> Result<String, CoordError> {
    keys.candidate(shard, session.lease())
        .ok_or_else(|| CoordError::Protocol(format!("no election {shard} in this config")))
}

/// This node's candidate key in `shard`'s election, entered at `term`.
fn candidacy(session: &Session, keys: &ElectionKeys, shard: u32, term: i64) -> Result<Leadership, CoordError> {
    let (pool, shards) = keys.family(shard);
    let key = candidate_key(session, keys, shard)?;
    Ok(Leadership {
        shard,
        shards,
        pool,
        prefix: keys.prefix(shard).unwrap_or_default(),
        key,
        term,
    })
}

/// What each single-shard election request of a node goes through (a campaign after a handoff,
/// a resign): a few at a time, and none while etcd pushes back, so that a rebalance that moves
/// a thousand shards neither floods etcd nor retries shard by shard when etcd says "too many
/// requests".
pub struct ElectionThrottle {
    permits: Semaphore,
    pushback: Pushback,
}

impl ElectionThrottle {
    /// `permits` requests at a time.
    pub fn new(permits: usize) -> ElectionThrottle {
        ElectionThrottle {
            permits: Semaphore::new(permits),
            pushback: Pushback::new(),
        }
    }

    /// Sends `request` with a permit once any pause is over; pushback in its answer pauses
    /// every request of the node.
    pub async fn request<T>(&self, request: impl Future<Output = Result<T, CoordError>>) -> Result<T, CoordError> {
        let _permit = self.permits.acquire().await;
        self.pushback.wait().await;
        let result = request.await;
        match &result {
            Ok(_) => self.pushback.eased(),
            Err(err) if err.is_pushback() => {
                let pause = self.pushback.hit();
                if let Some(left_out) = repeats::log_now("etcd pushback") {
                    tracing::warn!(error = %err, pause = ?pause, left_out, "etcd pushed back: every election request of this node pauses (left_out: lines like this one not logged since the last)");
                }
            }
            Err(_) => {}
        }
        result
    }
}

/// Enters this node's candidate key in `shard`'s election through `admission`, and waits until
/// it leads.
pub(crate) async fn campaign(
    session: &Session,
    keys: &ElectionKeys,
    shard: u32,
    node_id: &str,
    view: &mut watch::Receiver<FleetView>,
    admission: &ElectionThrottle,
) -> Result<Leadership, CoordError> {
    let key = candidate_key(session, keys, shard)?;
    let term = admission.request(enter(session, &key, node_id)).await?;
    elected(candidacy(session, keys, shard, term)?, node_id, view).await
}

/// Waits until `candidacy` leads its shard, as the fleet view (a watch of every election key)
/// shows it: the same rule as etcd's own elections, the lowest create revision leads, without a
/// watch per shard. The caller races it against the session's loss and shutdown.
pub async fn elected(
    candidacy: Leadership,
    node_id: &str,
    view: &mut watch::Receiver<FleetView>,
) -> Result<Leadership, CoordError> {
    loop {
        if view.borrow_and_update().leads(candidacy.shard, node_id, candidacy.term) {
            return Ok(candidacy);
        }
        if view.changed().await.is_err() {
            return Err(CoordError::Protocol("the fleet view ended".into()));
        }
    }
}

/// Whether `leadership` is still this shard's leader: its key exists with its fence and no
/// candidate precedes it.
pub async fn still_leads(session: &Session, leadership: &Leadership) -> Result<bool, CoordError> {
    let options = GetOptions::new()
        .with_prefix()
        .with_sort(SortTarget::Create, SortOrder::Ascend)
        .with_limit(1)
        .with_keys_only();
    let response = etcd::call(session.client().get(leadership.prefix.as_str(), Some(options))).await?;
    Ok(response
        .kvs()
        .first()
        .is_some_and(|kv| kv.key() == leadership.key.as_bytes() && kv.create_revision() == leadership.term))
}

/// Removes a foreign candidate key, once etcd confirms it is foreign: its lease, if it has one,
/// holds no member's registration (a view that saw a new member's candidate key before its
/// registration must not remove a member's key). Guarded by the key's create revision, so a key
/// put again since is left for its own check. Returns whether it removed the key.
pub async fn remove_foreign(session: &Session, keys: &Keys, candidate: &Candidate) -> Result<bool, CoordError> {
    let client = session.client();
    if let Some(lease) = candidate.lease {
        let held = etcd::call(
            client
                .clone()
                .lease_time_to_live(lease, Some(LeaseTimeToLiveOptions::new().with_keys())),
        )
        .await?;
        let members = keys.nodes_prefix();
        if held.keys().iter().any(|key| key.starts_with(members.as_bytes())) {
            return Ok(false);
        }
    }
    let txn = Txn::new()
        .when([Compare::create_revision(
            candidate.key.clone(),
            CompareOp::Equal,
            candidate.term,
        )])
        .and_then([TxnOp::delete(candidate.key.clone(), None)]);
    Ok(etcd::call(client.clone().txn(txn)).await?.succeeded())
}

/// Gives up leadership (or candidacy) by deleting this node's key, only if it is still ours.
pub async fn resign(session: &Session, leadership: &Leadership) -> Result<(), CoordError> {
    let txn = Txn::new()
        .when([leadership.guard()])
        .and_then([TxnOp::delete(leadership.key.as_str(), None)]);
    etcd::call(session.client().txn(txn)).await?;
    Ok(())
}
