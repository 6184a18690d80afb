//! Every etcd key shardcron reads or writes, in one place.
//!
//! ```text
//! /shardcron/<cluster>/shards/<k>/n<shards>/<lease-hex>   election candidates of shard k
//! /shardcron/<cluster>/shards/<pool>:<k>/n<shards>/<lease> shard k of a pool (tags joined by +)
//! /shardcron/<cluster>/shards/@<node>:0/n1/<lease>         a node's own election (fan_out = "all")
//! /shardcron/<cluster>/jobs/<job>/last                     the job's last claimed tick
//! /shardcron/<cluster>/jobs/<job>/result                   the job's last finished run
//! /shardcron/<cluster>/jobs/<job>/manual                   the last run asked for by hand a leader took
//! /shardcron/<cluster>/nodes/<node-id>                     live members
//! /shardcron/<cluster>/activity/<node-id>                  its runs per minute, the last hour
//! /shardcron/<cluster>/unserved/<tags>                     a run_on set no live node has, since when
//! /shardcron/<cluster>/backfills/<job>                     a job's backfill: its ticks, claimed, done
//! /shardcron/<cluster>/pauses/<job>                        a job's pause (`*`: every job's)
//! /shardcron/<cluster>/notify/<job>                        whether it fails, its events not yet told
//! /shardcron/<cluster>/runs/<job>/<tick>                   the job's last runs (`history`)
//! /shardcron/<cluster>/triggers/<job>/<id>                 a run asked for by hand, not yet taken
//! /shardcron/<cluster>/triggered/<id>                      who took it, and how its run ended
//! /shardcron/<cluster>/groups/<group>/slots/<n>            a slot of a concurrency group, held
//! /shardcron/<cluster>/groups/<group>/waiting/<place>      an attempt in the group's line
//! /shardcron/<cluster>/asks/<node>/<fence>/<kind>/<job>     a leader asks node of a run: `stop` it, or is it `going`
//! /shardcron/<cluster>/format                              the format of the records above
//! ```
//! The shard count is part of the election prefix, so nodes whose configs disagree on `shards`
//! never share an election: shard 3 of 16 and shard 3 of 32 hold different jobs. A pool's and a
//! node's own elections sit beside the fleet's under one prefix, which one watch follows; a
//! version before pools reads their `<pool>:<k>` as no shard number and leaves them alone.

mod elections;

pub(crate) use elections::ElectionKeys;

/// Which family of elections a key belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Space<'a> {
    /// The fleet's `shards`: jobs without `run_on`.
    Fleet,
    /// A pool, by its id.
    Pool(&'a str),
    /// A node's own election, by its node id.
    Own(&'a str),
}

/// The records kept per job.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum JobRecord {
    /// `/jobs/<job>/last`: the last claimed tick.
    Last,
    /// `/jobs/<job>/result`: the last finished run.
    Result,
}

/// A key of a concurrency group.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum GroupKey<'a> {
    /// A slot, by number.
    Slot(u32),
    /// An attempt in line, by its place's key segment.
    Waiting(&'a str),
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

    /// Shard `shard` of the fleet's `shards`.
    #[cfg(test)]
    pub(crate) fn election_prefix(&self, shards: u32, shard: u32) -> String {
        self.election_prefix_in(Space::Fleet, shards, shard)
    }

    pub(crate) fn election_prefix_in(&self, space: Space, shards: u32, shard: u32) -> String {
        match space {
            Space::Fleet => format!("{}shards/{shard}/n{shards}/", self.root),
            Space::Pool(pool) => format!("{}shards/{pool}:{shard}/n{shards}/", self.root),
            Space::Own(node) => format!("{}shards/@{node}:{shard}/n{shards}/", self.root),
        }
    }

    #[cfg(test)]
    pub(crate) fn candidate(&self, shards: u32, shard: u32, lease: i64) -> String {
        format!("{}{lease:x}", self.election_prefix(shards, shard))
    }

    /// The (space, shard, shard count) an election key belongs to.
    pub(crate) fn parse_candidate<'k>(&self, key: &'k str) -> Option<(Space<'k>, u32, u32)> {
        let rest = key.strip_prefix(&self.shards_prefix())?;
        let mut parts = rest.split('/');
        let first = parts.next()?;
        let (space, shard) = match first.rsplit_once(':') {
            None => (Space::Fleet, first),
            Some((own, shard)) if own.starts_with('@') => (Space::Own(&own[1..]), shard),
            Some((pool, shard)) => (Space::Pool(pool), shard),
        };
        let shard = shard.parse().ok()?;
        let shards = parts.next()?.strip_prefix('n')?.parse().ok()?;
        Some((space, shard, shards))
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

    /// Every job's history.
    pub(crate) fn runs_prefix(&self) -> String {
        format!("{}runs/", self.root)
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

    /// `run_on` sets (by id) that no live node has all the tags of, each with since when.
    pub(crate) fn unserved_prefix(&self) -> String {
        format!("{}unserved/", self.root)
    }

    pub(crate) fn unserved(&self, id: &str) -> String {
        format!("{}unserved/{id}", self.root)
    }

    pub(crate) fn groups_prefix(&self) -> String {
        format!("{}groups/", self.root)
    }

    pub(crate) fn group_slots_prefix(&self, group: &str) -> String {
        format!("{}groups/{group}/slots/", self.root)
    }

    /// Slot `slot` of `group`, its number at a fixed width so slots list in order.
    pub(crate) fn group_slot(&self, group: &str, slot: u32) -> String {
        format!("{}groups/{group}/slots/{slot:05}", self.root)
    }

    pub(crate) fn group_waiting_prefix(&self, group: &str) -> String {
        format!("{}groups/{group}/waiting/", self.root)
    }

    /// The key of an attempt waiting in `group`'s line at `place` (a [`Place::segment`]).
    ///
    /// [`Place::segment`]: crate::rules::groups::Place::segment
    pub(crate) fn group_waiting(&self, group: &str, place: &str) -> String {
        format!("{}groups/{group}/waiting/{place}", self.root)
    }

    /// What a key under [`Keys::groups_prefix`] is: its group, and a slot's number or a
    /// waiting attempt's place segment.
    pub(crate) fn parse_group_key<'k>(&self, key: &'k str) -> Option<(&'k str, GroupKey<'k>)> {
        let (group, rest) = key.strip_prefix(&self.groups_prefix())?.split_once('/')?;
        if let Some(slot) = rest.strip_prefix("slots/") {
            return Some((group, GroupKey::Slot(slot.parse().ok()?)));
        }
        Some((group, GroupKey::Waiting(rest.strip_prefix("waiting/")?)))
    }

    /// What other nodes' leaders ask `node` of its runs.
    pub(crate) fn asks_prefix(&self, node: &str) -> String {
        format!("{}asks/{node}/", self.root)
    }

    pub(crate) fn ask(&self, node: &str, fence: i64, ask: Ask, job: &str) -> String {
        format!("{}{fence}/{}/{job}", self.asks_prefix(node), ask.segment())
    }

    /// The fence, the ask and the job of a key under `node`'s asks.
    pub(crate) fn parse_ask<'k>(&self, node: &str, key: &'k str) -> Option<(i64, Ask, &'k str)> {
        let (fence, rest) = key.strip_prefix(&self.asks_prefix(node))?.split_once('/')?;
        let (ask, job) = rest.split_once('/')?;
        let ask = [Ask::Stop, Ask::Going]
            .into_iter()
            .find(|known| known.segment() == ask)?;
        Some((fence.parse().ok()?, ask, job))
    }

    /// A job's backfill: the ticks of a past range its shard's leaders run again.
    pub(crate) fn backfill(&self, job: &str) -> String {
        format!("{}{job}", self.backfills_prefix())
    }

    pub(crate) fn backfills_prefix(&self) -> String {
        format!("{}backfills/", self.root)
    }

    /// A job's notification record: a [`crate::rules::notify::Record`].
    pub(crate) fn notify(&self, job: &str) -> String {
        format!("{}{job}", self.notify_prefix())
    }

    pub(crate) fn notify_prefix(&self) -> String {
        format!("{}notify/", self.root)
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

    /// The records of every node's instance of a `fan_out = "all"` job: `<job>@<node>`.
    pub(crate) fn job_instances_prefix(&self, job: &str) -> String {
        format!("{}jobs/{job}@", self.root)
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

    /// The format of the cluster's records, as the release that first wrote them there set it.
    pub(crate) fn record_format(&self) -> String {
        format!("{}format", self.root)
    }

    /// A key never written: what a node reads to learn how many operations etcd takes in one
    /// transaction.
    pub(crate) fn txn_probe(&self) -> String {
        format!("{}txn-probe", self.root)
    }

    /// Each node's runs per minute over the last hour, for the dashboard's fleet strip.
    pub(crate) fn activity_prefix(&self) -> String {
        format!("{}activity/", self.root)
    }

    pub(crate) fn activity(&self, node_id: &str) -> String {
        format!("{}{node_id}", self.activity_prefix())
    }

    pub fn nodes_prefix(&self) -> String {
        format!("{}nodes/", self.root)
    }

    pub(crate) fn node(&self, node_id: &str) -> String {
        format!("{}nodes/{node_id}", self.root)
    }
}

/// What a leader asks the node of another run of its job.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Ask {
    /// Stop it (`overlap = "replace"`).
    Stop,
    /// Is it still going, and for how long: the node writes its answer into the key.
    Going,
}

impl Ask {
    fn segment(self) -> &'static str {
        match self {
            Ask::Stop => "stop",
            Ask::Going => "going",
        }
    }
}

#[cfg(test)]
mod tests;
