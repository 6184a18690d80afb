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
use crate::keys::Keys;
use crate::session::Session;

/// This node leads a shard. Everything the term writes is guarded by `fence`.
#[derive(Debug, Clone)]
pub struct Leadership {
    pub shard: u32,
    /// The shard count of this election.
    pub shards: u32,
    /// The shard's election prefix, under which every candidate key of the shard lives.
    pub prefix: String,
    /// This node's candidate key, now the leader key.
    pub key: String,
    /// The leader key's create revision: the leadership's term (`CRON_TERM`), which every
    /// claim of the leadership checks.
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
pub async fn campaign(
    session: &Session,
    keys: &Keys,
    shards: u32,
    shard: u32,
    node_id: &str,
) -> Result<Leadership, CoordError> {
    let prefix = keys.election_prefix(shards, shard);
    let key = keys.candidate(shards, shard, session.lease());
    let fence = enter(session, &key, node_id).await?;
    loop {
        let options = GetOptions::new()
            .with_prefix()
            .with_max_create_revision(fence - 1)
            .with_sort(SortTarget::Create, SortOrder::Descend)
            .with_limit(1)
            .with_keys_only();
        let response = etcd::call(session.client().get(prefix.as_str(), Some(options))).await?;
        let Some(predecessor) = response.kvs().first() else {
            return Ok(Leadership {
                shard,
                shards,
                prefix,
                key,
                fence,
            });
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
        .is_some_and(|kv| kv.key() == leadership.key.as_bytes() && kv.create_revision() == leadership.fence))
}

/// One candidate of a shard election, as etcd holds it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Candidate {
    pub key: Vec<u8>,
    /// The node id the candidate key holds.
    pub node: String,
    /// The key's create revision: the lowest leads, and it is the leader's fence.
    pub fence: i64,
}

/// The candidates of every shard election of one shard count, in the order etcd elects them.
/// Built from a read of the election keys, kept current from a watch of them; `status` and the
/// fleet view both read who leads and who stands by from here.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Ballot {
    /// Per shard, ordered by create revision.
    shards: Vec<Vec<Candidate>>,
}

impl Ballot {
    pub fn new(shards: u32) -> Ballot {
        Ballot {
            shards: vec![Vec::new(); shards as usize],
        }
    }

    /// Takes in a candidate key that was put (`Some((node id, create revision))`) or deleted
    /// (`None`). Keys of elections with another shard count are not this ballot's and are
    /// ignored.
    pub fn apply(&mut self, keys: &Keys, key: &[u8], put: Option<(&[u8], i64)>) {
        let Some((shard, of)) = std::str::from_utf8(key).ok().and_then(|key| keys.parse_candidate(key)) else {
            return;
        };
        if of as usize != self.shards.len() {
            return;
        }
        let Some(candidates) = self.shards.get_mut(shard as usize) else {
            return;
        };
        candidates.retain(|candidate| candidate.key != key);
        if let Some((node, fence)) = put {
            let at = candidates.partition_point(|candidate| candidate.fence < fence);
            candidates.insert(
                at,
                Candidate {
                    key: key.to_vec(),
                    node: String::from_utf8_lossy(node).into_owned(),
                    fence,
                },
            );
        }
    }

    /// The candidates of `shard`, leader first.
    pub fn candidates(&self, shard: u32) -> &[Candidate] {
        self.shards.get(shard as usize).map_or(&[], Vec::as_slice)
    }

    /// The leader of `shard`, if it has a candidate.
    pub fn leader(&self, shard: u32) -> Option<&Candidate> {
        self.candidates(shard).first()
    }
}

/// Gives up leadership (or candidacy) by deleting this node's key, only if it is still ours.
pub async fn resign(session: &Session, leadership: &Leadership) -> Result<(), CoordError> {
    let txn = Txn::new()
        .when([leadership.guard()])
        .and_then([TxnOp::delete(leadership.key.as_str(), None)]);
    etcd::call(session.client().txn(txn)).await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_oldest_candidate_leads_and_deletes_promote_the_next() {
        let keys = Keys::new("c");
        let key = |shard: u32, lease: i64| keys.candidate(4, shard, lease).into_bytes();
        let mut ballot = Ballot::new(4);
        ballot.apply(&keys, &key(1, 0xb), Some((b"b", 20)));
        ballot.apply(&keys, &key(1, 0xa), Some((b"a", 10)));
        ballot.apply(&keys, &key(1, 0xc), Some((b"c", 30)));
        ballot.apply(&keys, keys.candidate(8, 1, 0xd).as_bytes(), Some((b"d", 5)));
        ballot.apply(&keys, b"/shardcron/c/nodes/x", Some((b"x", 1)));
        let nodes = |ballot: &Ballot| -> Vec<String> { ballot.candidates(1).iter().map(|c| c.node.clone()).collect() };
        assert_eq!(
            nodes(&ballot),
            ["a", "b", "c"],
            "another shard count's election is not this one"
        );
        assert_eq!(ballot.leader(1).map(|c| c.fence), Some(10));
        ballot.apply(&keys, &key(1, 0xa), None);
        assert_eq!(ballot.leader(1).map(|c| c.node.as_str()), Some("b"));
        assert!(ballot.leader(0).is_none() && ballot.leader(9).is_none());
    }
}
