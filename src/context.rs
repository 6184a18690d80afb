//! What every campaign and term of a node shares, made once when the node starts.

use std::sync::Arc;

use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::coord::activity::ActivityCount;
use crate::coord::claims::ClaimLead;
use crate::coord::keys::{ElectionKeys, Keys};
use crate::coord::mirror::AnyMirror;
use crate::coord::results::ResultQueue;
use crate::coord::starts::StartedHere;
use crate::rules::config::Loaded;
use crate::rules::pools::Tags;
use crate::running::report::Reports;
use crate::running::runs::Runs;

/// What every campaign and term of a node shares, in the groups its users need: a task or a
/// term holds the groups it uses, not the whole node.
pub(crate) struct NodeContext {
    pub(crate) identity: Arc<Identity>,
    pub(crate) mirrors: Arc<Mirrors>,
    pub(crate) work: Arc<Work>,
    pub(crate) etcd: Etcd,
    /// Changes when a reload replaces the node's jobs.
    pub(crate) jobs: watch::Receiver<Arc<Loaded>>,
    /// The root of the cancellation tree: signals cancel it.
    pub(crate) shutdown: CancellationToken,
}

/// Who the node is, fixed for its life.
pub(crate) struct Identity {
    pub(crate) node_id: String,
    pub(crate) keys: Keys,
    /// The node's tags (`--tags`).
    pub(crate) tags: Tags,
    /// The keys of every election of the node's config: a reload that changes them is refused.
    pub(crate) election_keys: ElectionKeys,
}

/// What every node sees of the features' records, mirrored from etcd while the node has a
/// session, and this node's part in them.
pub(crate) struct Mirrors {
    /// The pauses every node sees.
    pub(crate) pauses: Arc<crate::coord::pauses::Pauses>,
    /// The concurrency groups' slots and lines, and this node's part in them.
    pub(crate) groups: Arc<crate::coord::groups::Groups>,
    /// Runs asked for by hand that no leader took yet.
    pub(crate) triggers: Arc<crate::coord::triggers::Triggers>,
    /// The jobs' backfills, and the backfill ticks this node holds.
    pub(crate) backfills: Arc<crate::coord::backfills::Backfills>,
}

impl Mirrors {
    /// Every mirror of the node, in one list: a new one is a field above and a line here.
    pub(crate) fn list(&self) -> [Arc<dyn AnyMirror>; 4] {
        [
            Arc::clone(&self.pauses) as Arc<dyn AnyMirror>,
            Arc::clone(&self.triggers) as Arc<dyn AnyMirror>,
            Arc::clone(&self.groups) as Arc<dyn AnyMirror>,
            Arc::clone(&self.backfills) as Arc<dyn AnyMirror>,
        ]
    }
}

/// This node's runs and where their ends go.
pub(crate) struct Work {
    pub(crate) runs: Runs,
    /// Where every finished run goes, this node's and those a takeover records lost.
    pub(crate) reports: Reports,
    /// Finished runs' results waiting to be written, for claims of their shard to carry.
    pub(crate) results: Arc<ResultQueue>,
    /// Tells of runs: the jobs' notifications and success pings.
    pub(crate) notifications: Arc<crate::running::notifications::Notifications>,
    /// This node's runs per minute, published for the dashboard.
    pub(crate) activity: Arc<ActivityCount>,
    /// The per-job gauges this node exports for the shards it leads.
    pub(crate) job_gauges: Arc<crate::coord::job_gauges::JobGauges>,
    /// Ticks the node started that a record may still list as pending, across leaderships.
    pub(crate) started_here: Arc<StartedHere>,
    pub(crate) claim_lead: ClaimLead,
}

/// The node's side of etcd.
pub(crate) struct Etcd {
    /// The etcd member the node's calls go to first, as it changes.
    pub(crate) etcd_member: watch::Receiver<Option<String>>,
    /// The election requests of single shards (campaigns after a handoff, resigns) go through
    /// it: a few at a time, paused while etcd pushes back.
    pub(crate) elections: crate::coord::election::ElectionThrottle,
}
