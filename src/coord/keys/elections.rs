//! Which election of one node's config a key is in, and each election's keys.

use std::sync::Arc;

use super::{Keys, Space};
use crate::rules::pools::{Election, Elections};

/// The election keys of one node's config: each election by its number (see
/// [`crate::rules::pools`]), and back.
#[derive(Debug, Clone)]
pub(crate) struct ElectionKeys {
    pub(crate) keys: Keys,
    pub(crate) elections: Arc<Elections>,
    /// The node whose own election [`Election::Own`] is.
    pub(crate) node: String,
}

impl ElectionKeys {
    /// The keys of a config of `shards` shards without pools, for `node`.
    #[cfg(test)]
    pub(crate) fn fleet(keys: &Keys, shards: u32, node: &str) -> ElectionKeys {
        ElectionKeys {
            keys: keys.clone(),
            elections: Arc::new(Elections::new(shards, 16, &Default::default(), false)),
            node: node.to_string(),
        }
    }

    fn space_of(&self, number: u32) -> Option<(Space<'_>, u32, u32)> {
        Some(match self.elections.locate(number)? {
            Election::Fleet { shard, shards } => (Space::Fleet, shard, shards),
            Election::Pool { pool, shard, shards } => (Space::Pool(&pool.id), shard, shards),
            Election::Own => (Space::Own(&self.node), 0, 1),
        })
    }

    /// The prefix of election `number`; `None` past the last.
    pub(crate) fn prefix(&self, number: u32) -> Option<String> {
        let (space, shard, shards) = self.space_of(number)?;
        Some(self.keys.election_prefix_in(space, shards, shard))
    }

    /// This node's candidate key in election `number`, named for its lease.
    pub(crate) fn candidate(&self, number: u32, lease: i64) -> Option<String> {
        Some(format!("{}{lease:x}", self.prefix(number)?))
    }

    /// The number of the election an election key is in, when it is one of this config's (and,
    /// for a node's own election, this node's).
    pub(crate) fn number(&self, key: &str) -> Option<u32> {
        match self.keys.parse_candidate(key)? {
            (Space::Fleet, shard, shards) => self.elections.number(None, shard, shards),
            (Space::Pool(pool), shard, shards) => self.elections.number(Some(pool), shard, shards),
            (Space::Own(node), 0, 1) if node == self.node => self.elections.own_number(),
            (Space::Own(_), _, _) => None,
        }
    }

    /// The election family whose leaders' debts a record names: the pool (a node's own election
    /// as `@<node>`; `None` for the fleet's) and its shard count.
    pub(crate) fn family(&self, number: u32) -> (Option<String>, u32) {
        match self.elections.locate(number) {
            Some(Election::Pool { pool, shards, .. }) => (Some(pool.id.clone()), shards),
            Some(Election::Own) => (Some(format!("@{}", self.node)), 1),
            Some(Election::Fleet { shards, .. }) => (None, shards),
            None => (None, self.elections.shards),
        }
    }
}
