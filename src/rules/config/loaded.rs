//! The validated jobs as one node holds them: by election, with the digest of their file.

use std::collections::BTreeMap;
use std::sync::Arc;

use super::{Config, GroupsByName, Job};
use crate::rules::pools::{Elections, FanOut, Tags};

/// Who a node is, as far as which jobs it runs goes.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NodeSpec {
    pub id: String,
    pub tags: Tags,
}

/// The jobs a node runs, by election, and the digest of the file they came from. Replaced whole
/// when a reload brings new jobs.
pub(crate) struct Loaded {
    pub(crate) digest: String,
    pub(crate) elections: Arc<Elections>,
    /// By election number; a pool's elections hold their jobs on every node, also one that
    /// never campaigns in them.
    pub(crate) by_shard: Vec<Vec<Arc<Job>>>,
    /// The `fan_out = "all"` jobs as `jobs.toml` has them; this node runs its instances of
    /// those it has the tags of.
    pub(crate) fanned_out: Vec<Arc<Job>>,
    /// How many jobs run on each `run_on` set (the empty set: jobs without `run_on`).
    pub(crate) run_on: BTreeMap<Tags, usize>,
    /// `[groups.<name>]`.
    pub(crate) groups: GroupsByName,
}

impl Loaded {
    /// The jobs move into their elections: a node with 100,000 jobs holds one copy of each. A
    /// fanned-out job becomes this node's instance of it, in the node's own election, when the
    /// node has its tags; else the node holds nothing of it.
    pub(crate) fn new(config: Config, node: &NodeSpec) -> Loaded {
        let mut by_shard = vec![Vec::new(); config.elections.total() as usize];
        let mut fanned_out = Vec::new();
        let mut run_on = BTreeMap::new();
        for job in config.jobs {
            *run_on.entry(job.run_on.clone()).or_default() += 1;
            let shard = job.shard as usize;
            let job = match job.fan_out {
                FanOut::One => job,
                FanOut::All => {
                    let instance = node.tags.has_all(&job.run_on).then(|| job.instance(&node.id));
                    fanned_out.push(job);
                    match instance {
                        Some(instance) => Arc::new(instance),
                        None => continue,
                    }
                }
            };
            by_shard[shard].push(job);
        }
        Loaded {
            digest: config.digest,
            elections: config.elections,
            by_shard,
            fanned_out,
            run_on,
            groups: config.groups,
        }
    }

    /// Every job as `jobs.toml` has it, a fanned-out job once (not as this node's instance).
    pub(crate) fn jobs(&self) -> impl Iterator<Item = &Arc<Job>> {
        self.by_shard
            .iter()
            .flatten()
            .filter(|job| job.instance_of.is_none())
            .chain(&self.fanned_out)
    }
}
