//! Backfill runs on this node: they take no turn of their job (`--parallel` may run several),
//! the job's live ticks wait for them to end, and each counts its tick in its backfill's record
//! when it ends, or gives it back when it did not start (`running::backfill_settles`).

use super::Runs;
use crate::rules::config::Overlap;

impl Runs {
    /// Whether a backfill tick of `job` may start here now: always for `overlap = "allow"`;
    /// otherwise while no live tick of the job runs or waits on this node.
    pub(crate) fn idle_for_backfill(&self, job: &str, overlap: Overlap) -> bool {
        if overlap == Overlap::Allow {
            return true;
        }
        self.jobs.only_backfills(job)
    }

    /// Waits until no backfill run of `job` goes on this node.
    pub(super) async fn backfills_over(&self, job: &str) {
        loop {
            let ended = self.backfills_ended.notified();
            tokio::pin!(ended);
            ended.as_mut().enable();
            let going = self.jobs.backfilling(job);
            if going == 0 {
                return;
            }
            tracing::info!(
                job,
                backfill_runs = going,
                "waiting for the job's backfill runs to end before its tick"
            );
            ended.await;
        }
    }

    /// A backfill sequence of `job` is over.
    pub(super) fn leave_backfill(&self, job: &str) {
        self.jobs.leave_backfill(job);
        self.backfills_ended.notify_waiters();
    }
}
