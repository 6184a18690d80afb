//! Where the model's jobs run: the fleet's shards, a pool whose election only tagged nodes
//! enter, and each node's own election for its instances of a fanned-out job, as
//! [`crate::rules::pools`] places them. A node's terms are keyed by slot: a fleet shard below
//! the node's shard count, then [`POOL_SLOT`] and [`OWN_SLOT`].

use super::etcd::Election;
use super::{Node, Protocol, Rules};

/// The slot of the pool's one election (its `pool_shards` is 1 in the model).
pub(crate) const POOL_SLOT: u32 = 64;
/// The slot of the node's own election.
pub(crate) const OWN_SLOT: u32 = 65;
/// The pool's id, as records name it.
const POOL: &str = "p";
/// Elections past every shard count: the pool's, then each node's own.
const POOL_ELECTION: u32 = 1000;
const OWN_ELECTIONS: u32 = 2000;

impl Protocol {
    /// Whether `job` has `run_on`: in a config that knows the pool, it is the pool's.
    pub(crate) fn pooled(&self, job: usize) -> bool {
        !self.jobs[job].run_on.is_empty()
    }

    /// The node whose instance of a fanned-out job `job` is.
    pub(crate) fn instance_node(&self, job: usize) -> Option<usize> {
        self.jobs[job]
            .instance_of
            .as_ref()
            .and_then(|instance| instance.node.parse().ok())
    }

    /// Whether node `n` has the pool's tags.
    pub(crate) fn tagged(&self, n: usize) -> bool {
        self.tagged.get(n).copied().unwrap_or(true)
    }

    /// Whether node `n`, as it runs now, campaigns in the pool's election.
    pub(crate) fn in_pool(&self, n: usize, node: &Node) -> bool {
        let may = self.tagged(n) || self.rules == Rules::AnyNodeInPool;
        node.pooled && may && (0..self.jobs.len()).any(|job| self.pooled(job))
    }

    /// The slots node `n` campaigns in.
    pub(crate) fn slots(&self, n: usize, node: &Node) -> Vec<u32> {
        let mut slots: Vec<u32> = (0..node.shards).collect();
        if self.in_pool(n, node) {
            slots.push(POOL_SLOT);
        }
        if (0..self.jobs.len()).any(|job| self.instance_node(job) == Some(n)) {
            slots.push(OWN_SLOT);
        }
        slots
    }

    /// The election of node `n`'s slot.
    pub(crate) fn election(&self, n: usize, node: &Node, slot: u32) -> Election {
        match slot {
            POOL_SLOT => (POOL_ELECTION, 0),
            OWN_SLOT => (OWN_ELECTIONS + n as u32, 0),
            shard => (node.shards, shard),
        }
    }

    /// The jobs of node `n`'s slot, as its config places them.
    pub(crate) fn jobs_in(&self, n: usize, node: &Node, slot: u32) -> Vec<usize> {
        (0..self.jobs.len())
            .filter(|job| match (self.instance_node(*job), slot) {
                (Some(owner), OWN_SLOT) => owner == n,
                (Some(_), _) | (None, OWN_SLOT) => false,
                (None, POOL_SLOT) => node.pooled && self.pooled(*job),
                (None, shard) => {
                    !(node.pooled && self.pooled(*job))
                        && crate::rules::shard::shard_of(&self.jobs[*job].name, node.shards) == shard
                }
            })
            .collect()
    }

    /// The election family of node `n`'s slot, as its records name it: its pool and shard count.
    pub(crate) fn family(&self, n: usize, node: &Node, slot: u32) -> (Option<String>, u32) {
        match slot {
            // Broken on purpose: a pool's leaders named as leaders of the fleet's single shard.
            POOL_SLOT if self.rules == Rules::FamilyByCount => (None, 1),
            POOL_SLOT => (Some(POOL.to_string()), 1),
            OWN_SLOT => (Some(format!("@{n}")), 1),
            _ => (None, node.shards),
        }
    }

    /// The family of a member that runs `shards` shards and may be in the pool: what the live
    /// leases say the fleet runs.
    pub(crate) fn member_families(&self, shards: u32, in_pool: bool) -> Vec<(Option<String>, u32)> {
        let mut families = vec![(None, shards)];
        if in_pool {
            families.push(if self.rules == Rules::FamilyByCount {
                (None, 1)
            } else {
                (Some(POOL.to_string()), 1)
            });
        }
        families
    }

    /// One number per family, for the log's fences: the shard count, or the election's.
    pub(crate) fn family_code(&self, n: usize, node: &Node, slot: u32) -> u32 {
        self.election(n, node, slot).0
    }

    /// Whether a start of `job` by node `n` from `slot` is where its config lets it run.
    pub(crate) fn may_run(&self, n: usize, job: usize, slot: u32) -> bool {
        match self.instance_node(job) {
            Some(owner) => owner == n,
            None => slot != POOL_SLOT || self.tagged(n),
        }
    }
}
