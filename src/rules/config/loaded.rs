//! The validated jobs as a node holds them: by shard, with the digest of their file.

use std::sync::Arc;

use super::{Config, Job};

/// The jobs a node runs, by shard, and the digest of the file they came from. Replaced whole
/// when a reload brings new jobs.
pub(crate) struct Loaded {
    pub(crate) digest: String,
    pub(crate) by_shard: Vec<Vec<Arc<Job>>>,
}

impl Loaded {
    /// The jobs move into their shards: a node with 100,000 jobs holds one copy of each.
    pub(crate) fn new(config: Config) -> Loaded {
        let mut by_shard = vec![Vec::new(); config.cluster.shards as usize];
        for job in config.jobs {
            let shard = job.shard as usize;
            by_shard[shard].push(Arc::new(job));
        }
        Loaded {
            digest: config.digest,
            by_shard,
        }
    }
}
