//! A backfill tick's claim counted done when its run ends, or given back when it did not start,
//! in its backfill's record. The node holds the claim until that is written (or given up on), so
//! its own orphan check leaves it alone; the node's shutdown waits for these writes with its runs.

use std::sync::Arc;

use chrono::{DateTime, Utc};
use tokio_util::task::TaskTracker;

use crate::coord::backfills::{self, Backfills, Settle};
use crate::coord::keys::Keys;
use crate::running::report::{Finished, RunSink};
use crate::running::runner::BackfillClaim;

pub(crate) struct BackfillSettles {
    client: etcd_client::Client,
    keys: Keys,
    /// The backfill ticks this node holds.
    held: Arc<Backfills>,
    /// The node's runs' tracker: a settle is waited for as a run is.
    tracker: TaskTracker,
}

impl BackfillSettles {
    pub(crate) fn new(client: etcd_client::Client, keys: Keys, held: Arc<Backfills>, tracker: TaskTracker) -> Self {
        BackfillSettles {
            client,
            keys,
            held,
            tracker,
        }
    }

    /// Counts `job`'s backfill tick `at` done, or gives it back, in its backfill's record.
    pub(crate) fn settle(&self, job: &str, at: DateTime<Utc>, claimed: &BackfillClaim, settle: Settle) {
        let (client, keys, held) = (self.client.clone(), self.keys.clone(), Arc::clone(&self.held));
        let (job, claimed) = (job.to_string(), claimed.clone());
        self.tracker.spawn(async move {
            backfills::settle_tick(&client, &keys, &job, &claimed.backfill, at, &claimed.claim, settle).await;
            held.release(&job, at, &claimed.claim);
        });
    }
}

/// A backfill tick that ended, run or recorded without a run, is done.
impl RunSink for BackfillSettles {
    fn finished(&self, run: &Finished<'_>) {
        if let Some(claimed) = run.arrival.and_then(|arrival| arrival.backfill_claim()) {
            self.settle(&run.job.name, run.record.scheduled_at, claimed, Settle::Done);
        }
    }
}
