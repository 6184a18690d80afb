//! The fleet: who is alive, which shards each node should lead, and when a leader should hand a
//! shard to its target owner.
//!
//! Every node registers `/nodes/<id>` on its lease and watches the member and election prefixes.
//! From the same live member set every node computes the same target assignment: bounded-load
//! rendezvous hashing, each node capped at ceil(N/M) shards, so a join or a leave moves about
//! N/M shards. Every node stands by in every election, so a dead node's shards fail over within
//! a TTL; a leader that is not a shard's target hands it over once the target is campaigning.

use std::collections::{BTreeMap, BTreeSet};

use etcd_client::{EventType, GetOptions, PutOptions, WatchOptions};
use tokio::sync::watch;

use crate::assignment::assign;
use crate::etcd::{self, CoordError};
use crate::keys::Keys;
use crate::record::Member;
use crate::session::Session;

/// What a node knows of the fleet at one moment.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FleetView {
    pub members: BTreeMap<String, Member>,
    /// Node ids campaigning in each of this node's shard elections.
    pub candidates: Vec<BTreeSet<String>>,
}

impl FleetView {
    /// Target owner of every shard, among the members that share `shards`.
    pub fn targets(&self, shards: u32) -> Vec<Option<String>> {
        let peers: Vec<&str> = self
            .members
            .iter()
            .filter(|(_, member)| member.shards == shards)
            .map(|(id, _)| id.as_str())
            .collect();
        assign(shards, &peers)
    }

    /// Whether `me`, leading `shard`, should hand it over now: it is not the shard's target and
    /// the target is already campaigning for it, so the handoff leaves no gap.
    pub fn should_hand_over(&self, shards: u32, shard: u32, me: &str) -> bool {
        let targets = self.targets(shards);
        match targets.get(shard as usize).cloned().flatten() {
            Some(target) => {
                target != me
                    && self
                        .candidates
                        .get(shard as usize)
                        .is_some_and(|ids| ids.contains(&target))
            }
            None => false,
        }
    }
}

/// Registers this node under `/nodes/<id>` on the session's lease.
pub async fn register(session: &Session, keys: &Keys, node_id: &str, member: &Member) -> Result<(), CoordError> {
    let value = serde_json::to_vec(member).map_err(|err| CoordError::Protocol(err.to_string()))?;
    let options = PutOptions::new().with_lease(session.lease());
    etcd::call(session.client().put(keys.node(node_id), value, Some(options))).await?;
    Ok(())
}

/// Keeps a [`FleetView`] current from etcd until the session ends. Returns when a watch fails;
/// the caller restarts it.
pub async fn watch(
    session: &Session,
    keys: &Keys,
    shards: u32,
    view: &watch::Sender<FleetView>,
) -> Result<(), CoordError> {
    let client = session.client();
    let nodes_prefix = keys.nodes_prefix();
    let shards_prefix = keys.shards_prefix();
    let nodes = etcd::call(
        client
            .clone()
            .get(nodes_prefix.as_str(), Some(GetOptions::new().with_prefix())),
    )
    .await?;
    let elections = etcd::call(
        client
            .clone()
            .get(shards_prefix.as_str(), Some(GetOptions::new().with_prefix())),
    )
    .await?;
    let from = nodes
        .header()
        .map_or(0, |h| h.revision())
        .min(elections.header().map_or(0, |h| h.revision()))
        + 1;

    let mut members: BTreeMap<String, Member> = BTreeMap::new();
    for kv in nodes.kvs() {
        apply_member(&mut members, &nodes_prefix, kv.key(), Some(kv.value()));
    }
    // Candidate key -> node id, for the elections of this shard count.
    let mut candidates: BTreeMap<(u32, Vec<u8>), String> = BTreeMap::new();
    for kv in elections.kvs() {
        apply_candidate(&mut candidates, keys, shards, kv.key(), Some(kv.value()));
    }
    publish(view, &members, &candidates, shards);

    let mut node_watch = etcd::call(client.clone().watch(
        nodes_prefix.as_str(),
        Some(WatchOptions::new().with_prefix().with_start_revision(from)),
    ))
    .await?;
    let mut election_watch = etcd::call(client.clone().watch(
        shards_prefix.as_str(),
        Some(WatchOptions::new().with_prefix().with_start_revision(from)),
    ))
    .await?;
    loop {
        tokio::select! {
            message = node_watch.message() => {
                let Some(response) = message? else { return Ok(()) };
                if response.canceled() {
                    return Ok(());
                }
                for event in response.events() {
                    let Some(kv) = event.kv() else { continue };
                    let value = (event.event_type() == EventType::Put).then(|| kv.value());
                    apply_member(&mut members, &nodes_prefix, kv.key(), value);
                }
            }
            message = election_watch.message() => {
                let Some(response) = message? else { return Ok(()) };
                if response.canceled() {
                    return Ok(());
                }
                for event in response.events() {
                    let Some(kv) = event.kv() else { continue };
                    let value = (event.event_type() == EventType::Put).then(|| kv.value());
                    apply_candidate(&mut candidates, keys, shards, kv.key(), value);
                }
            }
        }
        publish(view, &members, &candidates, shards);
    }
}

fn apply_member(members: &mut BTreeMap<String, Member>, prefix: &str, key: &[u8], value: Option<&[u8]>) {
    let Some(id) = std::str::from_utf8(key).ok().and_then(|key| key.strip_prefix(prefix)) else {
        return;
    };
    match value.map(serde_json::from_slice::<Member>) {
        Some(Ok(member)) => {
            members.insert(id.to_string(), member);
        }
        Some(Err(err)) => tracing::warn!(node = id, error = %err, "unreadable member record; ignoring it"),
        None => {
            members.remove(id);
        }
    }
}

fn apply_candidate(
    candidates: &mut BTreeMap<(u32, Vec<u8>), String>,
    keys: &Keys,
    shards: u32,
    key: &[u8],
    value: Option<&[u8]>,
) {
    let Some((shard, of)) = std::str::from_utf8(key).ok().and_then(|key| keys.parse_candidate(key)) else {
        return;
    };
    if of != shards {
        return;
    }
    match value {
        Some(node) => {
            candidates.insert((shard, key.to_vec()), String::from_utf8_lossy(node).into_owned());
        }
        None => {
            candidates.remove(&(shard, key.to_vec()));
        }
    }
}

fn publish(
    view: &watch::Sender<FleetView>,
    members: &BTreeMap<String, Member>,
    candidates: &BTreeMap<(u32, Vec<u8>), String>,
    shards: u32,
) {
    let mut per_shard = vec![BTreeSet::new(); shards as usize];
    for ((shard, _), node) in candidates {
        if let Some(set) = per_shard.get_mut(*shard as usize) {
            set.insert(node.clone());
        }
    }
    let next = FleetView {
        members: members.clone(),
        candidates: per_shard,
    };
    view.send_if_modified(|current| {
        if *current == next {
            return false;
        }
        *current = next;
        true
    });
}

/// Members whose config digest differs from this node's.
pub fn drifted<'a>(view: &'a FleetView, digest: &str) -> Vec<(&'a str, &'a Member)> {
    view.members
        .iter()
        .filter(|(_, member)| member.digest != digest)
        .map(|(id, member)| (id.as_str(), member))
        .collect()
}
