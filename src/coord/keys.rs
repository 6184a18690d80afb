//! Every etcd key shardcron reads or writes, in one place.
//!
//! ```text
//! /shardcron/<cluster>/shards/<k>/n<shards>/<lease-hex>   election candidates of shard k
//! /shardcron/<cluster>/jobs/<job>/last                     the job's last claimed tick
//! /shardcron/<cluster>/jobs/<job>/result                   the job's last finished run
//! /shardcron/<cluster>/jobs/<job>/manual                   the last run asked for by hand a leader took
//! /shardcron/<cluster>/nodes/<node-id>                     live members
//! /shardcron/<cluster>/pauses/<job>                        a job's pause (`*`: every job's)
//! /shardcron/<cluster>/runs/<job>/<tick>                   the job's last runs (`history`)
//! /shardcron/<cluster>/triggers/<job>/<id>                 a run asked for by hand, not yet taken
//! /shardcron/<cluster>/triggered/<id>                      who took it, and how its run ended
//! ```
//! The shard count is part of the election prefix, so nodes whose configs disagree on `shards`
//! never share an election: shard 3 of 16 and shard 3 of 32 hold different jobs.

/// The records kept per job.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum JobRecord {
    /// `/jobs/<job>/last`: the last claimed tick.
    Last,
    /// `/jobs/<job>/result`: the last finished run.
    Result,
}

/// Builds the keys of one cluster.
#[derive(Debug, Clone)]
pub struct Keys {
    root: String,
}

impl Keys {
    pub fn new(cluster: &str) -> Self {
        Keys {
            root: format!("/shardcron/{cluster}/"),
        }
    }

    pub(crate) fn shards_prefix(&self) -> String {
        format!("{}shards/", self.root)
    }

    pub(crate) fn election_prefix(&self, shards: u32, shard: u32) -> String {
        format!("{}shards/{shard}/n{shards}/", self.root)
    }

    pub(crate) fn candidate(&self, shards: u32, shard: u32, lease: i64) -> String {
        format!("{}{lease:x}", self.election_prefix(shards, shard))
    }

    /// The (shard, shard count) an election key belongs to.
    pub(crate) fn parse_candidate(&self, key: &str) -> Option<(u32, u32)> {
        let rest = key.strip_prefix(&self.shards_prefix())?;
        let mut parts = rest.split('/');
        let shard = parts.next()?.parse().ok()?;
        let shards = parts.next()?.strip_prefix('n')?.parse().ok()?;
        Some((shard, shards))
    }

    /// The node id of a member key.
    pub(crate) fn parse_node<'k>(&self, key: &'k str) -> Option<&'k str> {
        key.strip_prefix(&self.nodes_prefix())
    }

    /// The job and the kind of a job record key.
    pub(crate) fn parse_job_record<'k>(&self, key: &'k str) -> Option<(&'k str, JobRecord)> {
        let rest = key.strip_prefix(&self.jobs_prefix())?;
        match rest.rsplit_once('/')? {
            (job, "last") => Some((job, JobRecord::Last)),
            (job, "result") => Some((job, JobRecord::Result)),
            _ => None,
        }
    }

    /// A job's history: its last runs, by tick.
    pub(crate) fn job_runs_prefix(&self, job: &str) -> String {
        format!("{}runs/{job}/", self.root)
    }

    pub(crate) fn triggers_prefix(&self) -> String {
        format!("{}triggers/", self.root)
    }

    pub fn trigger(&self, job: &str, id: &str) -> String {
        format!("{}triggers/{job}/{id}", self.root)
    }

    /// The job and request id of a request key.
    pub(crate) fn parse_trigger<'k>(&self, key: &'k str) -> Option<(&'k str, &'k str)> {
        key.strip_prefix(&self.triggers_prefix())?.split_once('/')
    }

    pub fn triggered(&self, id: &str) -> String {
        format!("{}triggered/{id}", self.root)
    }

    pub(crate) fn pauses_prefix(&self) -> String {
        format!("{}pauses/", self.root)
    }

    pub(crate) fn pause(&self, job: &str) -> String {
        format!("{}pauses/{job}", self.root)
    }

    /// The job (or `*`) of a pause key.
    pub(crate) fn parse_pause<'k>(&self, key: &'k str) -> Option<&'k str> {
        key.strip_prefix(&self.pauses_prefix())
    }

    pub(crate) fn jobs_prefix(&self) -> String {
        format!("{}jobs/", self.root)
    }

    /// Every record of `job`: its claim, result and last success.
    pub(crate) fn job_records_prefix(&self, job: &str) -> String {
        format!("{}jobs/{job}/", self.root)
    }

    pub(crate) fn job_last(&self, job: &str) -> String {
        format!("{}jobs/{job}/last", self.root)
    }

    /// The newest successful run of `job`: a [`crate::rules::record::RunRecord`].
    pub(crate) fn job_success(&self, job: &str) -> String {
        format!("{}jobs/{job}/success", self.root)
    }

    /// Which leadership took the last run of `job` asked for by hand: what tells a leader whose
    /// claim's reply was lost that the claim was its own.
    pub(crate) fn job_manual(&self, job: &str) -> String {
        format!("{}jobs/{job}/manual", self.root)
    }

    pub(crate) fn job_result(&self, job: &str) -> String {
        format!("{}jobs/{job}/result", self.root)
    }

    /// The revision the compacting node saw, and when ([`crate::coord::etcd_space`]).
    pub(crate) fn compaction_mark(&self) -> String {
        format!("{}compaction", self.root)
    }

    /// A key never written: what a node reads to learn how many operations etcd takes in one
    /// transaction.
    pub(crate) fn txn_probe(&self) -> String {
        format!("{}txn-probe", self.root)
    }

    pub fn nodes_prefix(&self) -> String {
        format!("{}nodes/", self.root)
    }

    pub(crate) fn node(&self, node_id: &str) -> String {
        format!("{}nodes/{node_id}", self.root)
    }
}

#[cfg(test)]
mod tests {
    use super::{JobRecord, Keys};

    #[test]
    fn layout() {
        let keys = Keys::new("prod");
        assert_eq!(keys.candidate(16, 3, 0x1f), "/shardcron/prod/shards/3/n16/1f");
        assert_eq!(keys.parse_candidate("/shardcron/prod/shards/3/n16/1f"), Some((3, 16)));
        assert_eq!(keys.job_last("backup"), "/shardcron/prod/jobs/backup/last");
        assert_eq!(keys.node("a"), "/shardcron/prod/nodes/a");
        assert_eq!(keys.parse_node("/shardcron/prod/nodes/a"), Some("a"));
        assert_eq!(keys.parse_node("/shardcron/other/nodes/a"), None);
        assert_eq!(
            keys.parse_job_record("/shardcron/prod/jobs/backup/result"),
            Some(("backup", JobRecord::Result))
        );
        assert_eq!(
            keys.parse_job_record(&keys.job_last("a/b")),
            Some(("a/b", JobRecord::Last))
        );
        assert_eq!(keys.parse_job_record("/shardcron/prod/jobs/backup/other"), None);
    }
}
