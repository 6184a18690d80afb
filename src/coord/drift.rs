//! Config drift: the members of the fleet whose jobs.toml differs from this node's, by digest,
//! logged once per digest and counted in `shardcron_config_drift_nodes`.

use std::collections::BTreeSet;
use std::sync::Arc;

use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::coord::view::{self, FleetView};
use crate::rules::config::Loaded;

/// The task that warns of drift, for one session.
pub(crate) struct DriftWarnings {
    pub(crate) node_id: String,
    pub(crate) jobs: watch::Receiver<Arc<Loaded>>,
    pub(crate) view: watch::Receiver<FleetView>,
}

impl DriftWarnings {
    /// Logs each member whose jobs.toml differs from this node's, once per digest, at each
    /// change of the fleet or of this node's jobs, until `cancel`.
    pub(crate) async fn run(mut self, cancel: CancellationToken) {
        let mut reported = BTreeSet::new();
        loop {
            {
                let digest = self.jobs.borrow_and_update().digest.clone();
                let current = self.view.borrow_and_update();
                let drifted = view::drifted(&current, &digest);
                crate::metrics::get().config_drift_nodes.set(drifted.len() as i64);
                for (id, member) in drifted {
                    if reported.insert((id.to_string(), member.digest.clone(), digest.clone())) {
                        tracing::warn!(node = %self.node_id, other = id, its_digest = %member.digest, our_digest = %digest, its_shards = member.shards, "config drift: this member runs a different jobs.toml");
                    }
                }
            }
            tokio::select! {
                changed = self.view.changed() => if changed.is_err() { return },
                changed = self.jobs.changed() => if changed.is_err() { return },
                _ = cancel.cancelled() => return,
            }
        }
    }
}
