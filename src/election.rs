//! One leader election per shard, in the shape of etcd's Go `concurrency` package.
//!
//! Each candidate puts `<prefix><lease-hex>` on its session's lease; the candidate whose key has
//! the lowest create revision leads. A waiter watches only the key just before its own, so a
//! leader change wakes one node, not the whole fleet. The fence is the leader key's create
//! revision: etcd revisions only grow, so a later leader always has a larger fence.

use etcd_client::{
    Compare, CompareOp, EventType, GetOptions, PutOptions, SortOrder, SortTarget, Txn, TxnOp, TxnOpResponse,
    WatchOptions,
};

use crate::etcd::{self, CoordError};
use crate::session::Session;

/// This node leads a shard. Everything the term writes is guarded by `fence`.
#[derive(Debug, Clone)]
pub struct Leadership {
    pub shard: u32,
    /// This node's candidate key, now the leader key.
    pub key: String,
    /// The leader key's create revision.
    pub fence: i64,
}

impl Leadership {
    /// The compare every leader write carries: the leader key still exists with this fence.
    pub fn guard(&self) -> Compare {
        Compare::create_revision(self.key.as_str(), CompareOp::Equal, self.fence)
    }
}

/// Puts this node's candidate key (or finds it from an earlier campaign) and returns its create
/// revision.
pub async fn enter(session: &Session, key: &str, node_id: &str) -> Result<i64, CoordError> {
    let txn = Txn::new()
        .when([Compare::create_revision(key, CompareOp::Equal, 0)])
        .and_then([TxnOp::put(
            key,
            node_id,
            Some(PutOptions::new().with_lease(session.lease())),
        )])
        .or_else([TxnOp::get(key, None)]);
    let response = etcd::call(session.client().txn(txn)).await?;
    if response.succeeded() {
        return response
            .header()
            .map(|header| header.revision())
            .ok_or_else(|| CoordError::Protocol("txn response without a header".into()));
    }
    match response.op_responses().into_iter().next() {
        Some(TxnOpResponse::Get(get)) => get
            .kvs()
            .first()
            .map(|kv| kv.create_revision())
            .ok_or_else(|| CoordError::Protocol(format!("candidate key {key} vanished during the campaign"))),
        _ => Err(CoordError::Protocol("txn response without the get".into())),
    }
}

/// Waits until this node leads the shard. Returns when no candidate with a lower create revision
/// is left; the caller races it against the session's loss and shutdown.
pub async fn campaign(session: &Session, prefix: &str, shard: u32, node_id: &str) -> Result<Leadership, CoordError> {
    let key = format!("{prefix}{:x}", session.lease());
    let fence = enter(session, &key, node_id).await?;
    loop {
        let options = GetOptions::new()
            .with_prefix()
            .with_max_create_revision(fence - 1)
            .with_sort(SortTarget::Create, SortOrder::Descend)
            .with_limit(1)
            .with_keys_only();
        let response = etcd::call(session.client().get(prefix, Some(options))).await?;
        let Some(predecessor) = response.kvs().first() else {
            return Ok(Leadership { shard, key, fence });
        };
        let revision = response.header().map_or(0, |header| header.revision());
        wait_for_delete(session, predecessor.key().to_vec(), revision + 1).await?;
    }
}

/// Returns once `key` is deleted at or after `from_revision`, or when the watch ends for any
/// other reason (the caller re-reads the candidates either way).
async fn wait_for_delete(session: &Session, key: Vec<u8>, from_revision: i64) -> Result<(), CoordError> {
    let options = WatchOptions::new().with_start_revision(from_revision);
    let mut stream = etcd::call(session.client().watch(key, Some(options))).await?;
    loop {
        match stream.message().await? {
            Some(response) if response.canceled() => return Ok(()),
            Some(response) => {
                if response
                    .events()
                    .iter()
                    .any(|event| event.event_type() == EventType::Delete)
                {
                    return Ok(());
                }
            }
            None => return Ok(()),
        }
    }
}

/// Whether `leadership` is still this shard's leader: its key exists with its fence and no
/// candidate precedes it.
pub async fn still_leads(session: &Session, prefix: &str, leadership: &Leadership) -> Result<bool, CoordError> {
    let options = GetOptions::new()
        .with_prefix()
        .with_sort(SortTarget::Create, SortOrder::Ascend)
        .with_limit(1)
        .with_keys_only();
    let response = etcd::call(session.client().get(prefix, Some(options))).await?;
    Ok(response
        .kvs()
        .first()
        .is_some_and(|kv| kv.key() == leadership.key.as_bytes() && kv.create_revision() == leadership.fence))
}

/// Gives up leadership (or candidacy) by deleting this node's key, only if it is still ours.
pub async fn resign(session: &Session, leadership: &Leadership) -> Result<(), CoordError> {
    let txn = Txn::new()
        .when([leadership.guard()])
        .and_then([TxnOp::delete(leadership.key.as_str(), None)]);
    etcd::call(session.client().txn(txn)).await?;
    Ok(())
}
