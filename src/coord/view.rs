//! The fleet as one pure value: the live members, every shard election's candidates in the
//! order etcd elects them, and what follows from both (each shard's target owner, its leader,
//! whether a leader should hand over). Built and kept current by `fleet` from etcd reads and
//! watches; read by terms, `status` and the election. No I/O here.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use crate::coord::keys::{ElectionKeys, Keys};
use crate::rules::assignment::assign;
use crate::rules::record::Member;

/// What a node knows of the fleet at one moment.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FleetView {
    pub members: Arc<BTreeMap<String, Member>>,
    /// Target owner of each of this node's shards, worked out once per change of the members.
    pub targets: Arc<Vec<Option<String>>>,
    /// Node ids campaigning in each of this node's shard elections.
    pub candidates: Vec<BTreeSet<String>>,
    /// The leader of each election: its node id and term.
    pub leaders: Vec<Option<(String, i64)>>,
    /// Candidate keys of this node's elections that no live member put: they never lead.
    pub foreign: Arc<Vec<Candidate>>,
    /// Some registration's record could not be read: its node's shard count is unknown.
    pub unread_members: bool,
}

/// The live members, and the lease each registration lives on: a candidate key leads only on a
/// member's lease.
#[derive(Debug, Clone, Default)]
pub struct Members {
    pub nodes: BTreeMap<String, Member>,
    /// By node id; a registration whose record cannot be read still holds its lease, as etcd
    /// sees it when a foreign key is checked before its removal.
    leases: BTreeMap<String, i64>,
}

impl Members {
    pub fn leases(&self) -> BTreeSet<i64> {
        self.leases.values().copied().filter(|lease| *lease != 0).collect()
    }

    /// Whether some registration's record could not be read: its node's shard count is unknown.
    pub fn has_unread(&self) -> bool {
        self.leases.len() > self.nodes.len()
    }

    pub(crate) fn apply(&mut self, keys: &Keys, key: &[u8], put: Option<(&[u8], i64)>) {
        let Some(id) = std::str::from_utf8(key).ok().and_then(|key| keys.parse_node(key)) else {
            return;
        };
        let Some((value, lease)) = put else {
            self.nodes.remove(id);
            self.leases.remove(id);
            return;
        };
        self.leases.insert(id.to_string(), lease);
        match serde_json::from_slice::<Member>(value) {
            Ok(member) => {
                self.nodes.insert(id.to_string(), member);
            }
            Err(err) => {
                self.nodes.remove(id);
                tracing::warn!(node = id, error = %err, "unreadable member record; ignoring it");
            }
        }
    }
}

/// Target owner of every election: each family's shards spread among the members that campaign
/// in it (for a pool, the members with its tags); the node's own election is its own.
pub(crate) fn targets(members: &BTreeMap<String, Member>, keys: &ElectionKeys) -> Vec<Option<String>> {
    let elections = &keys.elections;
    let peers = |pool: Option<&str>, shards: u32| -> Vec<&str> {
        members
            .iter()
            .filter(|(_, member)| member.runs(pool, shards))
            .map(|(id, _)| id.as_str())
            .collect()
    };
    let mut targets = assign(elections.shards, &peers(None, elections.shards));
    for pool in &elections.pools {
        targets.extend(assign(
            elections.pool_shards,
            &peers(Some(&pool.id), elections.pool_shards),
        ));
    }
    if elections.own {
        targets.push(Some(keys.node.clone()));
    }
    targets
}

impl FleetView {
    /// Whether `me`, leading `shard`, should hand it over now: it is not the shard's target and
    /// the target is already campaigning for it, so the handoff leaves no gap.
    pub fn should_hand_over(&self, shard: u32, me: &str) -> bool {
        match self.targets.get(shard as usize).cloned().flatten() {
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

    /// Whether no live node runs the elections of `pool` (`None`: the fleet's) of `shards`, as
    /// far as this view knows: they have no leader now and never will again, so nothing of
    /// theirs is left to start. False while the view knows no member or cannot read one, and for
    /// a node's own election (`@<node>`), whose leaders' debts are nobody else's.
    pub fn family_gone(&self, pool: Option<&str>, shards: u32) -> bool {
        !pool.is_some_and(|pool| pool.starts_with('@'))
            && !self.members.is_empty()
            && !self.unread_members
            && self.members.values().all(|member| !member.runs(pool, shards))
    }

    /// The election families the live nodes run (the fleet's by shard count, each pool's by id
    /// and count); `None` when the view cannot tell.
    pub fn families(&self) -> Option<BTreeSet<(Option<String>, u32)>> {
        (!self.members.is_empty() && !self.unread_members).then(|| {
            self.members
                .values()
                .flat_map(|member| {
                    let pools = member.pools.iter().map(|pool| (Some(pool.clone()), member.pool_shards));
                    std::iter::once((None, member.shards)).chain(pools)
                })
                .collect()
        })
    }

    /// Whether the candidate of `node` with `term` leads `shard` in this view. The view is etcd's
    /// state at one revision, and no key can be created later with a lower create revision: once
    /// no candidate precedes this one it leads, as etcd's own election decides.
    pub fn leads(&self, shard: u32, node: &str, term: i64) -> bool {
        self.leaders
            .get(shard as usize)
            .and_then(Option::as_ref)
            .is_some_and(|(leader, leader_term)| leader == node && *leader_term == term)
    }
}

/// Members whose config digest differs from this node's.
pub fn drifted<'a>(view: &'a FleetView, digest: &str) -> Vec<(&'a str, &'a Member)> {
    view.members
        .iter()
        .filter(|(_, member)| member.digest != digest)
        .map(|(id, member)| (id.as_str(), member))
        .collect()
}

/// One candidate of a shard election, as etcd holds it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Candidate {
    pub key: Vec<u8>,
    /// The node id the candidate key holds.
    pub node: String,
    /// The key's create revision: the lowest leads, and it is the leader's term.
    pub term: i64,
    /// The lease the key lives on, when it is named for that lease as every member's candidate
    /// key is; `None` for a key without a lease or named for another one, which no member put.
    pub lease: Option<i64>,
}

impl Candidate {
    /// Whether a live member put this key: it lives on the lease it is named for, and that lease
    /// holds a member's registration. Anything else under an election prefix (a leaseless key,
    /// a lease no member holds) is foreign and never leads.
    pub fn is_member(&self, member_leases: &BTreeSet<i64>) -> bool {
        self.lease.is_some_and(|lease| member_leases.contains(&lease))
    }
}

/// A candidate key as it was put.
#[derive(Debug, Clone, Copy)]
pub struct Entered<'a> {
    /// The node id it holds.
    pub node: &'a [u8],
    /// Its create revision: its term if it leads.
    pub term: i64,
    /// The lease it is on; 0 for none.
    pub lease: i64,
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

    /// Takes in a candidate key that was put or deleted (`None`), and returns the number of the
    /// election it is in. Keys of elections this config does not hold (another shard count, a
    /// pool it has not, another node's own election) are not this ballot's and are ignored.
    pub(crate) fn apply(&mut self, keys: &ElectionKeys, key: &[u8], put: Option<Entered>) -> Option<u32> {
        let shard = std::str::from_utf8(key).ok().and_then(|key| keys.number(key))?;
        let candidates = self.shards.get_mut(shard as usize)?;
        candidates.retain(|candidate| candidate.key != key);
        if let Some(entered) = put {
            let named_for_its_lease = entered.lease != 0
                && keys
                    .candidate(shard, entered.lease)
                    .is_some_and(|own| own.as_bytes() == key);
            let at = candidates.partition_point(|candidate| candidate.term < entered.term);
            candidates.insert(
                at,
                Candidate {
                    key: key.to_vec(),
                    node: String::from_utf8_lossy(entered.node).into_owned(),
                    term: entered.term,
                    lease: named_for_its_lease.then_some(entered.lease),
                },
            );
        }
        Some(shard)
    }

    /// The candidates of `shard` in the order etcd elects them, foreign keys included.
    pub fn candidates(&self, shard: u32) -> &[Candidate] {
        self.shards.get(shard as usize).map_or(&[], Vec::as_slice)
    }

    /// The leader of `shard`: its oldest candidate, when a member put it. A foreign key in front
    /// leaves the shard without a leader until it is removed: letting the next member lead past
    /// it could make two leaders of nodes whose views of the members differ for a moment.
    pub fn leader(&self, shard: u32, member_leases: &BTreeSet<i64>) -> Option<&Candidate> {
        self.candidates(shard)
            .first()
            .filter(|candidate| candidate.is_member(member_leases))
    }

    /// The foreign candidate keys of `shard`.
    pub fn foreign<'a>(
        &'a self,
        shard: u32,
        member_leases: &'a BTreeSet<i64>,
    ) -> impl Iterator<Item = &'a Candidate> + 'a {
        self.candidates(shard)
            .iter()
            .filter(|candidate| !candidate.is_member(member_leases))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entered(node: &[u8], term: i64, lease: i64) -> Option<Entered<'_>> {
        Some(Entered { node, term, lease })
    }

    #[test]
    fn the_oldest_candidate_leads_and_deletes_promote_the_next() {
        let keys = Keys::new("c");
        let key = |shard: u32, lease: i64| keys.candidate(4, shard, lease).into_bytes();
        let members = BTreeSet::from([0xa, 0xb, 0xc, 0xd]);
        let mut ballot = Ballot::new(4);
        let keys_of_4 = ElectionKeys::fleet(&keys, 4, "a");
        ballot.apply(&keys_of_4, &key(1, 0xb), entered(b"b", 20, 0xb));
        ballot.apply(&keys_of_4, &key(1, 0xa), entered(b"a", 10, 0xa));
        ballot.apply(&keys_of_4, &key(1, 0xc), entered(b"c", 30, 0xc));
        ballot.apply(&keys_of_4, keys.candidate(8, 1, 0xd).as_bytes(), entered(b"d", 5, 0xd));
        ballot.apply(&keys_of_4, b"/shardcron/c/nodes/x", entered(b"x", 1, 0xd));
        let nodes = |ballot: &Ballot| -> Vec<String> { ballot.candidates(1).iter().map(|c| c.node.clone()).collect() };
        assert_eq!(
            nodes(&ballot),
            ["a", "b", "c"],
            "another shard count's election is not this one"
        );
        assert_eq!(ballot.leader(1, &members).map(|c| c.term), Some(10));
        ballot.apply(&keys_of_4, &key(1, 0xa), None);
        assert_eq!(ballot.leader(1, &members).map(|c| c.node.as_str()), Some("b"));
        assert!(ballot.leader(0, &members).is_none() && ballot.leader(9, &members).is_none());
    }

    #[test]
    fn a_key_no_member_put_never_leads() {
        let keys = Keys::new("c");
        let members = BTreeSet::from([0xa, 0xb]);
        let prefix = keys.election_prefix(2, 0);
        let cases: [(&str, Vec<u8>, i64, Option<&str>); 5] = [
            (
                "the member's own key",
                keys.candidate(2, 0, 0xa).into_bytes(),
                0xa,
                Some("a"),
            ),
            ("no lease", format!("{prefix}ffff").into_bytes(), 0, None),
            (
                "named for another lease",
                keys.candidate(2, 0, 0xc).into_bytes(),
                0xa,
                None,
            ),
            (
                "a lease no member holds",
                keys.candidate(2, 0, 0xe).into_bytes(),
                0xe,
                None,
            ),
            (
                "a key below a candidate's",
                format!("{prefix}a/x").into_bytes(),
                0xa,
                None,
            ),
        ];
        for (case, key, lease, leader) in cases {
            let mut ballot = Ballot::new(2);
            let keys_of_2 = ElectionKeys::fleet(&keys, 2, "a");
            ballot.apply(&keys_of_2, &key, entered(b"a", 7, lease));
            ballot.apply(&keys_of_2, keys.candidate(2, 0, 0xb).as_bytes(), entered(b"b", 9, 0xb));
            let foreign = ballot.foreign(0, &members).count();
            assert_eq!(ballot.leader(0, &members).map(|c| c.node.as_str()), leader, "{case}");
            assert_eq!(foreign, usize::from(leader.is_none()), "{case}");
        }
    }
}
