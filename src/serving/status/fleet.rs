//! The fleet as `status` shows it: the live nodes with their tags, the leader of every election
//! (the fleet's shards, then each pool's), and the `run_on` sets no live node has.

use std::collections::HashMap;
use std::sync::Arc;

use chrono::{DateTime, Utc};

use super::{NoEligibleNode, NodeStatus, ShardStatus};
use crate::coord::etcd::CoordError;
use crate::coord::fleet;
use crate::coord::keys::{ElectionKeys, Keys};
use crate::coord::unserved;
use crate::rules::config::Cluster;
use crate::rules::pools::{Election, Elections, Tags};

/// What `status` shows of the fleet.
pub(crate) struct Fleet {
    pub(crate) nodes: Vec<NodeStatus>,
    pub(crate) shards: Vec<ShardStatus>,
    /// By `run_on` id: the sets no live node has all the tags of, each with when the last node
    /// that had them left, when a node saw it go.
    pub(crate) unserved: HashMap<String, Option<DateTime<Utc>>>,
}

/// The nodes and election leaders of `cluster` for a config with `digest` and `elections`.
/// `run_on` lists every tag set the config's jobs run on.
pub(crate) async fn read(
    cluster: &Cluster,
    elections: &Arc<Elections>,
    run_on: &[Tags],
    digest: &str,
    client: &etcd_client::Client,
) -> Result<Fleet, CoordError> {
    let keys = Keys::new(&cluster.name);
    // No node's own election: `status` reads those nodes' instances from their records.
    let election_keys = ElectionKeys {
        keys: keys.clone(),
        elections: Arc::clone(elections),
        node: String::new(),
    };
    let (ballot, _) = fleet::read_ballot(client, &election_keys).await?;
    let (members, _) = fleet::read_members(client, &keys).await?;
    let marks = unserved::read(client, &keys).await?;
    let member_leases = members.leases();
    let shards: Vec<ShardStatus> = (0..elections.total())
        .filter_map(|number| {
            let election = elections.locate(number)?;
            if election == Election::Own {
                return None;
            }
            let pool = election.pool_id();
            let leader = ballot.leader(number, &member_leases);
            let eligible = members
                .nodes
                .values()
                .filter(|member| member.runs(pool, election.shards()))
                .count();
            Some(ShardStatus {
                shard: election.shard(),
                pool: pool.map(str::to_string),
                leader: leader.map(|leader| leader.node.clone()),
                term: leader.map(|leader| leader.term),
                fence: leader.map(|leader| leader.term),
                standby: ballot
                    .candidates(number)
                    .iter()
                    .filter(|candidate| candidate.is_member(&member_leases))
                    .count()
                    .saturating_sub(usize::from(leader.is_some())),
                no_eligible_node: (pool.is_some() && eligible == 0).then(|| NoEligibleNode {
                    since: pool.and_then(|pool| marks.get(pool).copied()),
                }),
            })
        })
        .collect();
    let unserved = unserved::since(run_on, &members.nodes, &marks);
    let nodes = members
        .nodes
        .into_iter()
        .map(|(id, member)| NodeStatus {
            drift: member.digest != digest,
            leads: shards
                .iter()
                .filter(|shard| shard.leader.as_deref() == Some(id.as_str()))
                .count(),
            id,
            version: member.version,
            digest: member.digest,
            shards: member.shards,
            started_at: member.started_at,
            tags: member.tags.iter().map(str::to_string).collect(),
            pools: member.pools,
            etcd: member.etcd,
        })
        .collect();
    Ok(Fleet {
        nodes,
        shards,
        unserved,
    })
}
