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
        let jobs = self.jobs.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        jobs.get(job).is_none_or(|runs| runs.pending == runs.backfilling)
    }

    /// Waits until no backfill run of `job` goes on this node.
    pub(super) async fn backfills_over(&self, job: &str) {
        loop {
            let ended = self.backfills_ended.notified();
            tokio::pin!(ended);
            ended.as_mut().enable();
            let going = {
                let jobs = self.jobs.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
                jobs.get(job).map_or(0, |runs| runs.backfilling)
            };
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
        let mut jobs = self.jobs.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        if let Some(entry) = jobs.get_mut(job) {
            entry.pending = entry.pending.saturating_sub(1);
            entry.backfilling = entry.backfilling.saturating_sub(1);
            if entry.pending == 0 {
                jobs.remove(job);
            }
        }
        drop(jobs);
        self.backfills_ended.notify_waiters();
    }
}
