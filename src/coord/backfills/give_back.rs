//! This node's side of the orphan rule: the backfill ticks the records list in flight on this
//! node that it does not hold were claimed by an earlier run of it, and would never be counted;
//! for as long as its session lasts, the node gives them back as each job's delivery says.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use super::{settle_orphans, Backfills};
use crate::coord::keys::Keys;
use crate::coord::session::Session;
use crate::rules::backfill::InFlight;
use crate::rules::config::{Delivery, Loaded};

/// Looked at again this often while some are left (a failed write, or a count given up on,
/// which changes no record).
const AGAIN: Duration = Duration::from_secs(5);

/// The task that gives back a node's unheld backfill ticks.
pub(crate) struct GiveBackUnheld {
    pub(crate) backfills: Arc<Backfills>,
    pub(crate) node_id: String,
    pub(crate) keys: Keys,
    pub(crate) jobs: watch::Receiver<Arc<Loaded>>,
    pub(crate) session: Session,
}

impl GiveBackUnheld {
    /// Gives back what is unheld now and at each change of the backfills, until `cancel`.
    pub(crate) async fn run(self, cancel: CancellationToken) {
        let mut changed = self.backfills.subscribe();
        loop {
            for job in self.backfills.unheld_on(&self.node_id) {
                self.give_back(&job).await;
            }
            let left = !self.backfills.unheld_on(&self.node_id).is_empty();
            tokio::select! {
                result = changed.changed() => if result.is_err() { return },
                _ = tokio::time::sleep(AGAIN), if left => {}
                _ = cancel.cancelled() => return,
            }
        }
    }

    async fn give_back(&self, job: &str) {
        let delivery = self
            .jobs
            .borrow()
            .by_shard
            .iter()
            .flatten()
            .find(|known| known.name == job)
            .map_or(Delivery::AtLeastOnce, |known| known.delivery);
        let orphaned = |flight: &InFlight| flight.node == self.node_id && !self.backfills.holds(job, flight);
        if let Err(err) = settle_orphans(&self.session.client(), &self.keys, job, delivery, orphaned).await {
            tracing::warn!(job, error = %err, "cannot give back this node's backfill ticks from before it started; trying again at the next change");
        }
    }
}
